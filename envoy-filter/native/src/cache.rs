//! The response cache in Envoy's native module, as the core's `ProxyExchange` drives it: the request
//! waits for its body, then for the daemon's answer to a callout from its filter, at most
//! `timeout_ms`; a hit goes out as a local reply, anything else goes on to the node. The node's
//! plain answer is held as it passes; the call that stores it outlives the stream, so it is made
//! from the filter configuration, which Envoy lets call out only on its main thread: the filter
//! queues it and commits the configuration's scheduler. With `hot_bytes`, the daemon's hits are
//! also kept in one hot tier for all of Envoy's workers, behind a lock held only while an entry
//! is copied in or out (the Wasm filter has one per worker: its VMs share no memory).

use std::borrow::Cow;
use std::collections::HashSet;
use std::sync::Mutex;

use rpcedge_core::cache::HotRegion;
use rpcedge_core::proxy::cache::DaemonCall;
use rpcedge_core::metrics::Counter;
use rpcedge_core::CacheConfig;

use crate::abi::{self, ConfigScheduler, EnvoyBuffer, EnvoyHeader, FilterConfigEnvoy, LogLevel};
use crate::host::{log, module_headers};

/// The configuration's side of the cache.
pub struct CacheShared {
    envoy: ConfigHandle,
    /// Stores (and releases of held keys) for the main thread to make.
    stores: Mutex<Vec<DaemonCall>>,
    /// The releases under way, whose answers are not counted as stores'.
    releases: Mutex<HashSet<u64>>,
    /// Hits kept for all workers, when there is a hot tier.
    hot: Option<SharedHot>,
}

/// Envoy's filter configuration and its scheduler, which Envoy keeps until
/// `on_http_filter_config_destroy`.
struct ConfigHandle {
    config: FilterConfigEnvoy,
    scheduler: ConfigScheduler,
}

// SAFETY: workers only commit to the scheduler, which Envoy makes safe from any thread; callouts
// and their counters go through the configuration on the main thread (`on_scheduled`, `stored`).
unsafe impl Send for ConfigHandle {}
unsafe impl Sync for ConfigHandle {}

/// The hot tier all workers share: its lock is held only while the core copies an entry out or
/// in.
pub struct SharedHot(Mutex<Vec<u8>>);

impl HotRegion for SharedHot {
    fn with_region(&self, use_region: &mut dyn FnMut(&mut [u8])) {
        use_region(&mut self.0.lock().unwrap_or_else(|e| e.into_inner()));
    }
}

impl CacheShared {
    /// From `on_http_filter_config_new`, on the main thread.
    pub fn new(envoy: FilterConfigEnvoy, config: CacheConfig) -> CacheShared {
        // SAFETY: Envoy's configuration is alive; the scheduler is deleted in `drop`.
        let scheduler = unsafe { abi::envoy_dynamic_module_callback_http_filter_config_scheduler_new(envoy) };
        CacheShared {
            hot: (config.hot_bytes > 0).then(|| SharedHot(Mutex::new(vec![0; config.hot_bytes as usize]))),
            envoy: ConfigHandle { config: envoy, scheduler },
            stores: Mutex::default(),
            releases: Mutex::default(),
        }
    }

    /// The hot tier, when there is one.
    pub fn hot(&self) -> Option<&dyn HotRegion> {
        self.hot.as_ref().map(|hot| hot as &dyn HotRegion)
    }

    /// A store for the main thread to make.
    pub fn queue_store(&self, call: DaemonCall) {
        self.stores.lock().unwrap_or_else(|e| e.into_inner()).push(call);
        // SAFETY: the scheduler lives as long as this configuration.
        unsafe { abi::envoy_dynamic_module_callback_http_filter_config_scheduler_commit(self.envoy.scheduler, 0) };
    }

    /// On the main thread: makes the queued stores, counting those Envoy cannot make.
    pub fn on_scheduled(&self, counters: &[usize]) {
        let stores = std::mem::take(&mut *self.stores.lock().unwrap_or_else(|e| e.into_inner()));
        for call in stores {
            let headers = module_headers(&call);
            let mut id = 0;
            // SAFETY: on the main thread, with Envoy's configuration alive; Envoy copies the request.
            let started = unsafe {
                abi::envoy_dynamic_module_callback_http_filter_config_http_callout(
                    self.envoy.config,
                    &mut id,
                    call.cluster.as_str().into(),
                    headers.as_ptr(),
                    headers.len(),
                    call.body.as_slice().into(),
                    call.timeout_ms,
                )
            };
            if started != abi::CALLOUT_STARTED {
                log(LogLevel::Warn, &format!("rpcedge cache: cannot call {}: {started}", call.cluster));
                if call.store {
                    self.stored(counters, None);
                }
            } else if !call.store {
                self.releases.lock().unwrap_or_else(|e| e.into_inner()).insert(id);
            }
        }
    }

    /// The daemon's answer to callout `id`: a store's status is counted (none: no answer).
    pub fn answered(&self, counters: &[usize], id: u64, status: Option<u16>) {
        if !self.releases.lock().unwrap_or_else(|e| e.into_inner()).remove(&id) {
            self.stored(counters, status);
        }
    }

    /// The daemon's answer to a store: its status (none: no answer).
    fn stored(&self, counters: &[usize], status: Option<u16>) {
        let counter = counters[Counter::for_store_answer(status).index()];
        // SAFETY: on the main thread, with Envoy's configuration alive.
        unsafe {
            abi::envoy_dynamic_module_callback_http_filter_config_increment_counter(
                self.envoy.config,
                counter,
                std::ptr::null(),
                0,
                1,
            )
        };
    }
}

impl Drop for CacheShared {
    fn drop(&mut self) {
        // SAFETY: made in `new`; the configuration and its filters are gone, so no one commits.
        unsafe { abi::envoy_dynamic_module_callback_http_filter_config_scheduler_delete(self.envoy.scheduler) };
    }
}

/// Header names and values as Envoy hands them over.
pub type Headers<'hook> = Vec<(&'hook [u8], &'hook [u8])>;

/// A callout's answer as Envoy hands it over: its headers (none when the call failed) and body,
/// Envoy's own bytes when they are in one slice (as an answer of the daemon's usually is), else
/// joined.
///
/// # Safety
/// The pointers are Envoy's, valid for the hook that passes them, and null only with a length of 0.
pub unsafe fn answer<'hook>(
    result: abi::CalloutResult,
    headers: *const EnvoyHeader,
    headers_length: usize,
    body: *const EnvoyBuffer,
    body_length: usize,
) -> (Headers<'hook>, Cow<'hook, [u8]>) {
    if result != abi::CALLOUT_SUCCESS {
        return (Vec::new(), Cow::Borrowed(&[]));
    }
    let headers: &[EnvoyHeader] = raw_slice(headers, headers_length);
    let body = match raw_slice(body, body_length) {
        [] => Cow::Borrowed(&[][..]),
        [slice] => Cow::Borrowed(slice.bytes()),
        slices => {
            let mut whole = Vec::with_capacity(slices.iter().map(|slice| slice.length).sum());
            for slice in slices {
                whole.extend_from_slice(slice.bytes());
            }
            Cow::Owned(whole)
        }
    };
    (headers.iter().map(|h| (h.key.bytes(), h.value.bytes())).collect(), body)
}

/// # Safety
/// As for `answer`.
unsafe fn raw_slice<'a, T>(ptr: *const T, length: usize) -> &'a [T] {
    if length == 0 {
        &[]
    } else {
        std::slice::from_raw_parts(ptr, length)
    }
}

/// The status of a callout's answer.
pub fn status(headers: &[(&[u8], &[u8])]) -> Option<u16> {
    let (_, value) = headers.iter().find(|(name, _)| *name == b":status")?;
    std::str::from_utf8(value).ok()?.parse().ok()
}
