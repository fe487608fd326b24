//! The response cache in Envoy, as the core's `ProxyExchange` drives it: the request waits for its
//! body, then for the daemon's answer to a `dispatch_http_call`, at most `timeout_ms`; a hit goes
//! out as a local reply, anything else goes on to the node. The node's plain answer is held as it
//! passes, and the call that stores it is handed to the root, which makes it: a call made from
//! the stream's context is cancelled when the stream's context goes away. With `hot_bytes`, the
//! daemon's hits are also kept in the worker's own hot tier (one Wasm VM per worker, so the
//! region needs no lock), which answers them again without the call.

use std::cell::RefCell;
use std::time::Duration;

use proxy_wasm::hostcalls;
use rpcedge_core::cache::HotRegion;
use rpcedge_core::proxy::cache::{DaemonCall, ROUTE_METADATA, ROUTE_NAMESPACE};

/// A worker's hot tier: its region, laid out by the core (one Wasm VM per worker: no lock).
pub struct WorkerHot(pub RefCell<Vec<u8>>);

impl HotRegion for WorkerHot {
    fn with_region(&self, use_region: &mut dyn FnMut(&mut [u8])) {
        use_region(&mut self.0.borrow_mut());
    }
}

/// The cache namespace in the metadata of the route the request took.
pub fn route_namespace() -> Option<Vec<u8>> {
    let path = vec!["xds", "route_metadata", "filter_metadata", ROUTE_METADATA, ROUTE_NAMESPACE];
    hostcalls::get_property(path).ok().flatten()
}

/// Makes a call to the daemon: its token, or none when Envoy could not make it.
pub fn dispatch(call: &DaemonCall) -> Option<u32> {
    let headers = call.headers.iter().map(|(name, value)| (*name, value.as_str())).collect();
    let body = (!call.body.is_empty()).then_some(call.body.as_slice());
    let timeout = Duration::from_millis(call.timeout_ms);
    hostcalls::dispatch_http_call(&call.cluster, headers, body, vec![], timeout).ok()
}
