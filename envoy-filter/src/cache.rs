//! The response cache in Envoy, over the core's `ProxyCacheRequest`: the request waits for its
//! body, then for the daemon's answer to a `dispatch_http_call`, at most `timeout_ms`; a hit goes
//! out as a local reply, anything else goes on to the node. The node's plain answer is held as it
//! passes, and the call that stores it is handed to the root, which makes it: a call made from
//! the stream's context is cancelled when the stream's context goes away. With `hot_bytes`, the
//! daemon's hits are also kept in the worker's own hot tier (one Wasm VM per worker, so the
//! region needs no lock), which answers them again without the call.

use std::cell::RefCell;
use std::time::Duration;

use proxy_wasm::hostcalls;
use proxy_wasm::types::{BufferType, MapType};
use rpcedge_core::cache::proxy::{self, DaemonCall, HotRegion, ProxyCacheRequest};
use rpcedge_core::cache::{Bypass, HitResponse, Refusal, Status};
use rpcedge_core::CacheConfig;

/// A worker's hot tier: its region, laid out by the core (one Wasm VM per worker: no lock).
pub struct WorkerHot(pub RefCell<Vec<u8>>);

impl HotRegion for WorkerHot {
    fn with_region(&self, use_region: &mut dyn FnMut(&mut [u8])) {
        use_region(&mut self.0.borrow_mut());
    }
}

/// What the request does after its body callback.
pub enum AfterBody {
    /// Goes on to the node.
    Continue,
    /// Waits here: for more body, or for the daemon's answer.
    Wait,
    /// Gets this hit from the hot tier.
    Answer(HitResponse),
}

/// One request's way through the cache, and the lookup it waits for.
pub struct CacheRequest {
    request: ProxyCacheRequest,
    /// Waiting for the daemon's answer to this call.
    lookup: Option<u32>,
}

impl CacheRequest {
    pub fn new(config: &CacheConfig, headers: &[(String, Vec<u8>)], end_of_stream: bool) -> CacheRequest {
        // the cache namespace in the metadata of the route the request took
        let path = vec!["xds", "route_metadata", "filter_metadata", proxy::ROUTE_METADATA, proxy::ROUTE_NAMESPACE];
        let route_namespace = hostcalls::get_property(path).ok().flatten();
        let request = ProxyCacheRequest::new(config, route_namespace.as_deref(), headers, end_of_stream);
        CacheRequest { request, lookup: None }
    }

    /// Whether the request waits here for its body.
    pub fn awaits_body(&self) -> bool {
        self.request.awaits_body()
    }

    /// A request body callback: once the body is all in, the hot tier is asked, then the daemon.
    pub fn on_body(
        &mut self,
        body_size: usize,
        end: bool,
        config: &CacheConfig,
        hot: Option<&WorkerHot>,
        min_length: u64,
        now_s: u64,
    ) -> AfterBody {
        let body = || hostcalls::get_buffer(BufferType::HttpRequestBody, 0, body_size).ok().flatten().unwrap_or_default();
        let hot = hot.map(|hot| hot as &dyn HotRegion);
        match self.request.on_body(body_size, end, body, config, hot, min_length, now_s) {
            proxy::AfterBody::Continue => AfterBody::Continue,
            proxy::AfterBody::Wait => AfterBody::Wait,
            proxy::AfterBody::Answer(hit) => AfterBody::Answer(hit),
            proxy::AfterBody::Lookup(call) => match dispatch(&call, Duration::from_millis(config.timeout_ms)) {
                Some(token) => {
                    self.lookup = Some(token);
                    AfterBody::Wait
                }
                None => {
                    self.request.lookup_failed();
                    AfterBody::Continue
                }
            },
        }
    }

    /// The daemon answered the lookup (or failed to in time: no headers): the hit to send, kept
    /// in the hot tier too.
    pub fn on_lookup_answer(
        &mut self,
        token: u32,
        body_size: usize,
        min_length: u64,
        hot: Option<&WorkerHot>,
        now_s: u64,
    ) -> Option<HitResponse> {
        if self.lookup.take() != Some(token) {
            return None;
        }
        let headers = hostcalls::get_map_bytes(MapType::HttpCallResponseHeaders).unwrap_or_default();
        let body = if body_size > 0 {
            hostcalls::get_buffer(BufferType::HttpCallResponseBody, 0, body_size).ok().flatten().unwrap_or_default()
        } else {
            Vec::new()
        };
        self.request.on_lookup_answer(&headers, &body, min_length, hot.map(|hot| hot as &dyn HotRegion), now_s)
    }

    pub fn is_hit(&self) -> bool {
        self.request.is_hit()
    }

    /// The node's response head: the status to report.
    pub fn on_response_head(&mut self, headers: &[(String, Vec<u8>)], end_of_stream: bool) -> Status {
        self.request.on_response_head(headers, end_of_stream)
    }

    /// Whether the node's body is being held.
    pub fn holds(&self) -> bool {
        self.request.holds()
    }

    /// More of the node's plain body.
    pub fn hold(&mut self, chunk: &[u8]) {
        self.request.hold(chunk);
    }

    /// The node's body has ended: the store to make, if the core keeps it.
    pub fn store(&mut self, config: &CacheConfig) -> Result<Option<DaemonCall>, Refusal> {
        self.request.store(config)
    }

    /// Why the request bypasses the cache, if it does.
    pub fn bypass(&self) -> Option<Bypass> {
        self.request.bypass()
    }
}

/// Sends a hit as the local reply (Envoy sets its Content-Length); false when Envoy refused it.
pub fn send_hit(hit: &HitResponse, status_header: bool) -> bool {
    hostcalls::send_http_response(200, proxy::hit_headers(hit, status_header), Some(&hit.body)).is_ok()
}

/// Makes a call to the daemon: its token, or none when Envoy could not make it.
pub fn dispatch(call: &DaemonCall, timeout: Duration) -> Option<u32> {
    let headers = call.headers.iter().map(|(name, value)| (*name, value.as_str())).collect();
    let body = (!call.body.is_empty()).then_some(call.body.as_slice());
    match hostcalls::dispatch_http_call(&call.cluster, headers, body, vec![], timeout) {
        Ok(token) => Some(token),
        Err(status) => {
            log::warn!("rpcedge cache: cannot call {}: {status:?}", call.cluster);
            None
        }
    }
}
