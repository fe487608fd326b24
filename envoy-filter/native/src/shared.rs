//! What one filter configuration shares with its filters, on every worker: the settings, what
//! its exchanges learn about the node, its counters and the response cache.

use std::sync::Arc;

use rpcedge_core::metrics::{self, Counter};
use rpcedge_core::{Config, Node, Settings};

use crate::abi::{self, FilterConfigEnvoy, METRICS_SUCCESS};
use crate::cache::CacheShared;
use crate::host::Host;

/// What one filter configuration shares with its filters, on every worker.
pub struct Shared {
    pub settings: Arc<Settings>,
    /// What this configuration's exchanges learn about the node.
    pub node: Arc<Node>,
    /// Counter ids by `Counter::index`.
    pub counters: Vec<usize>,
    /// Each compressing exchange's compression time, in microseconds.
    pub compress_duration: usize,
    /// The response cache, when it is on.
    pub cache: Option<CacheShared>,
}

// Envoy's workers share a configuration's `Shared`.
const _: fn() = || {
    fn shared_between_threads<T: Send + Sync>() {}
    shared_between_threads::<Shared>();
};

impl Shared {
    pub fn new(config: FilterConfigEnvoy, json: &[u8]) -> Result<Shared, String> {
        let settings = Config::from_json(json)
            .and_then(|s| s.check_buffer_limit().map(|()| s))
            .map_err(|e| format!("invalid plugin configuration: {e}"))?;
        let define = |histogram: bool, name: &str| {
            let name = format!("rpcedge.{name}");
            let mut id = 0;
            // SAFETY: called from `on_http_filter_config_new`, while Envoy lets a config define metrics.
            let result = unsafe {
                let define = if histogram {
                    abi::envoy_dynamic_module_callback_http_filter_config_define_histogram
                } else {
                    abi::envoy_dynamic_module_callback_http_filter_config_define_counter
                };
                define(config, name.as_str().into(), std::ptr::null(), 0, &mut id)
            };
            if result == METRICS_SUCCESS {
                Ok(id)
            } else {
                Err(format!("cannot define the metric {name}: {result}"))
            }
        };
        Ok(Shared {
            counters: Counter::all().map(|counter| define(false, &counter.name())).collect::<Result<_, _>>()?,
            compress_duration: define(true, metrics::compress_duration_name())?,
            cache: settings.cache.clone().filter(|cache| cache.enabled).map(|cache| CacheShared::new(config, cache)),
            settings: Arc::new(settings),
            node: Arc::default(),
        })
    }

    pub fn add(&self, host: Host, counter: Counter, amount: u64) {
        host.increment(self.counters[counter.index()], amount);
    }
}
