//! A request's way through the response cache in a proxy that calls the daemon itself (the Envoy
//! adapters, through [`crate::proxy::ProxyExchange`]): from the request's headers and body to the lookup to make, from the daemon's answer
//! to the hit to send (kept in the worker's hot tier too), and from the node's answer to the store
//! to make. The host makes the calls and moves the bytes; headers come as (name, value) pairs,
//! names in lower case.

use crate::cache::{
    Bypass, CacheExchange, CacheSettings, DaemonAnswer, DaemonRequest, HitResponse, HotRegion, LookupStep, Passed,
    Refusal, Status,
};
use crate::config::CacheConfig;

/// Where a route's cache namespace is set, in its metadata: `filter_metadata` under this
/// filter namespace, the key [`ROUTE_NAMESPACE`].
pub const ROUTE_METADATA: &str = "rpcedge";
pub const ROUTE_NAMESPACE: &str = "cache_namespace";

/// The header that tells the client the cache status (`status_header`).
pub(crate) fn status_header() -> &'static str {
    "x-rpcedge-cache"
}

/// A call to the daemon: to this cluster, with these headers and body, waiting at most
/// `timeout_ms` for the answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DaemonCall {
    pub cluster: String,
    pub headers: Vec<(&'static str, String)>,
    pub body: Vec<u8>,
    pub timeout_ms: u64,
    /// A store, whose answer the host counts (`Counter::for_store_answer`); not a release.
    pub store: bool,
}

impl DaemonCall {
    /// The core's request as an HTTP/2-style call to the daemon's cluster.
    fn new(config: &CacheConfig, request: DaemonRequest) -> Self {
        let DaemonRequest { method, path, headers: call_headers, body, timeout_ms } = request;
        let cluster = config.cluster.clone();
        let mut headers = vec![(":method", method.to_string()), (":path", path), (":authority", cluster.clone())];
        headers.extend(call_headers);
        DaemonCall { cluster, headers, body, timeout_ms, store: false }
    }
}

/// What the request does after a body callback, or a lookup's answer.
#[derive(Debug)]
pub(crate) enum AfterBody {
    /// Goes on to the node.
    Continue,
    /// Goes on to the node with this body instead of the client's: a batch less the calls the
    /// cache answered.
    Forward(Vec<u8>),
    /// Waits here for more body.
    Wait,
    /// Waits here for the answer to this lookup (the host calls `lookup_failed` if it cannot
    /// make it).
    Lookup(DaemonCall),
    /// Gets this hit from the hot tier.
    Answer(HitResponse),
}

/// One request's way through the cache.
pub(crate) struct ProxyCacheRequest {
    namespace: Option<String>,
    /// The request's headers, while it waits for its body.
    headers: Vec<(Vec<u8>, Vec<u8>)>,
    /// A bypass until the body is in.
    exchange: CacheExchange,
    /// The request waits in the proxy until its body has come.
    awaiting_body: bool,
    hit: bool,
}

impl ProxyCacheRequest {
    /// From the request's headers and the namespace of the route it took (its metadata's
    /// [`ROUTE_NAMESPACE`]): whether the cache may take it once its body is in. Without one the
    /// configuration's namespace applies; without either, the request bypasses the cache.
    pub fn new<N: AsRef<[u8]>, V: AsRef<[u8]>>(
        config: &CacheConfig,
        settings: &CacheSettings,
        route_namespace: Option<&[u8]>,
        headers: &[(N, V)],
        end_of_stream: bool,
    ) -> Self {
        // an empty (or not text) value names no namespace
        let route_namespace = route_namespace.and_then(|ns| std::str::from_utf8(ns).ok()).filter(|ns| !ns.is_empty());
        let namespace = route_namespace.or(config.namespace.as_deref()).map(str::to_string);
        let too_large =
            number(headers, "content-length").is_some_and(|length| !CacheExchange::takes_length(length, settings));
        let method = header(headers, ":method").unwrap_or_default();
        let path = header(headers, ":path").unwrap_or_default();
        let awaiting_body = method == b"POST" && !end_of_stream && !too_large;
        let own = |(name, value): &(N, V)| (name.as_ref().to_vec(), value.as_ref().to_vec());
        ProxyCacheRequest {
            exchange: CacheExchange::new(namespace.as_deref(), method, path, None, headers, settings),
            namespace,
            headers: if awaiting_body { headers.iter().map(own).collect() } else { Vec::new() },
            awaiting_body,
            hit: false,
        }
    }

    /// Whether the request waits here for its body.
    pub fn awaits_body(&self) -> bool {
        self.awaiting_body
    }

    /// The request went on to the node without waiting for its body: its body passes unread,
    /// past the cache, as one over `max_request` does.
    pub fn go_without_body(&mut self) {
        self.awaiting_body = false;
        self.headers = Vec::new();
    }

    /// A request body callback, with the body's size so far: once it is all in (`body` gives it),
    /// the hot tier (when the worker has one) is asked, then the daemon.
    #[allow(clippy::too_many_arguments)] // what a body callback knows, and the hot tier's context
    pub(crate) fn on_body<F: FnOnce() -> Vec<u8>>(
        &mut self,
        body_size: usize,
        end: bool,
        body: &mut LazyBody<F>,
        config: &CacheConfig,
        settings: &CacheSettings,
        hot: Option<&dyn HotRegion>,
        min_length: u64,
        now_s: u64,
    ) -> AfterBody {
        if !self.awaiting_body {
            return AfterBody::Continue;
        }
        if !CacheExchange::takes_length(body_size as u64, settings) {
            // a bypass: the proxy passes what it holds and the rest
            self.awaiting_body = false;
            return AfterBody::Continue;
        }
        if !end {
            return AfterBody::Wait;
        }
        self.awaiting_body = false;
        let headers = std::mem::take(&mut self.headers);
        let path = header(&headers, ":path").unwrap_or_default();
        self.exchange = CacheExchange::new(self.namespace.as_deref(), b"POST", path, Some(body.get()), &headers, settings);
        self.look_up(config, hot, min_length, now_s)
    }

    /// Once the request's headers are in, for a request the cache takes without a body (a
    /// Beacon-API read): its hit from the hot tier, or its lookup.
    pub(crate) fn on_headers_end(
        &mut self,
        config: &CacheConfig,
        hot: Option<&dyn HotRegion>,
        min_length: u64,
        now_s: u64,
    ) -> AfterBody {
        if self.awaiting_body {
            return AfterBody::Wait;
        }
        self.look_up(config, hot, min_length, now_s)
    }

    /// The hot tier's hit, or the first lookup, for a request the cache takes.
    fn look_up(&mut self, config: &CacheConfig, hot: Option<&dyn HotRegion>, min_length: u64, now_s: u64) -> AfterBody {
        let step = self.exchange.look_up(hot, min_length, now_s);
        self.after(config, step)
    }

    /// The lookup could not be made, or got no answer (a timeout, no healthy daemon): the
    /// request goes on to the node, with no more lookups.
    pub fn lookup_failed(&mut self, config: &CacheConfig) -> AfterBody {
        let step = self.exchange.looked_up(None, None, 0, 0);
        self.after(config, step)
    }

    /// The daemon's answer to the lookup: the hit to send (what it found is kept in the hot tier
    /// too), the next lookup, or on to the node.
    pub fn on_lookup_answer<N: AsRef<[u8]>, V: AsRef<[u8]>>(
        &mut self,
        headers: &[(N, V)],
        body: &[u8],
        config: &CacheConfig,
        min_length: u64,
        hot: Option<&dyn HotRegion>,
        now_s: u64,
    ) -> AfterBody {
        let answer = number(headers, ":status").map(|status| DaemonAnswer::read(status, headers, body));
        let step = self.exchange.looked_up(answer.as_ref(), hot, min_length, now_s);
        self.after(config, step)
    }

    /// The core's step as this proxy takes it.
    fn after(&mut self, config: &CacheConfig, step: LookupStep) -> AfterBody {
        match step {
            LookupStep::Ask(lookup) => AfterBody::Lookup(DaemonCall::new(config, lookup)),
            LookupStep::Hit(hit) => {
                self.hit = true;
                AfterBody::Answer(hit)
            }
            LookupStep::Node(body) => body.map_or(AfterBody::Continue, AfterBody::Forward),
        }
    }

    pub fn is_hit(&self) -> bool {
        self.hit
    }

    pub fn status(&self) -> Status {
        self.exchange.status()
    }

    /// The node's response head: the status to report, once the core knows whether the body is
    /// held for the store, or for a split batch to merge.
    pub fn on_response_head<N: AsRef<[u8]>, V: AsRef<[u8]>>(&mut self, headers: &[(N, V)], end_of_stream: bool) -> Status {
        let status = number(headers, ":status").unwrap_or(0);
        let length = if end_of_stream { Some(0) } else { number(headers, "content-length") };
        self.exchange.response_head(status, length, headers);
        self.exchange.status()
    }

    /// Whether the client gets the merged body [`ProxyCacheRequest::pass`] gives instead of the
    /// node's.
    pub fn replaces_body(&self) -> bool {
        self.exchange.replaces_body()
    }

    /// Whether the node's body is being held.
    pub fn holds(&self) -> bool {
        self.exchange.holds()
    }

    /// A piece of the node's body (`end`: its last): what the client gets in its place.
    pub fn pass(&mut self, piece: &[u8], end: bool) -> Passed {
        self.exchange.pass(piece, end)
    }

    /// The node's body has ended: the stores to make (a batch's answer may give several), or
    /// why the core refuses to keep an answer (none: nothing was held); and the release of a key
    /// this request held without an answer to store.
    pub fn stores(&mut self, config: &CacheConfig) -> Vec<Result<DaemonCall, Refusal>> {
        let call = |store| DaemonCall { store: true, ..DaemonCall::new(config, store) };
        let mut stores: Vec<_> = self.exchange.stores_held().into_iter().map(|store| store.map(call)).collect();
        stores.extend(self.release(config).map(Ok));
        stores
    }

    /// The release of a key this request held, when it is over without an answer to store
    /// (the node failed, the client went away).
    pub fn release(&mut self, config: &CacheConfig) -> Option<DaemonCall> {
        self.exchange.release().map(|release| DaemonCall::new(config, release))
    }

    /// Whether the node's answer may be kept: the request's route has a namespace (its method,
    /// body and credentials decide later).
    pub fn may_keep(&self) -> bool {
        self.namespace.is_some()
    }

    /// Why the request bypasses the cache, if it does.
    pub fn bypass(&self) -> Option<Bypass> {
        self.exchange.bypass()
    }

    /// The status header's value, with a bypass's reason where `reasons` asks for it.
    pub fn status_value(&self, reasons: bool) -> &'static str {
        self.exchange.status_value(reasons)
    }
}

/// The headers of a hit sent as a local reply: the core's, and the status header's `status` where
/// it is on.
pub(crate) fn hit_headers<'a>(hit: &'a HitResponse, status: Option<&'static str>) -> Vec<(&'a str, &'a str)> {
    let mut headers: Vec<(&str, &str)> = hit.headers.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
    headers.extend(status.map(|status| (status_header(), status)));
    headers
}

/// A header's value.
fn header<'a, N: AsRef<[u8]>, V: AsRef<[u8]>>(headers: &'a [(N, V)], name: &str) -> Option<&'a [u8]> {
    headers.iter().find(|(n, _)| n.as_ref() == name.as_bytes()).map(|(_, value)| value.as_ref())
}

/// A header that holds a number (`:status`, `content-length`); none when absent or malformed.
fn number<T: std::str::FromStr, N: AsRef<[u8]>, V: AsRef<[u8]>>(headers: &[(N, V)], name: &str) -> Option<T> {
    std::str::from_utf8(header(headers, name)?).ok()?.trim().parse().ok()
}

/// A request body read only when something needs it, then kept.
pub(crate) enum LazyBody<F> {
    Unread(Option<F>),
    Read(Vec<u8>),
}

impl<F: FnOnce() -> Vec<u8>> LazyBody<F> {
    pub(crate) fn new(read: F) -> Self {
        LazyBody::Unread(Some(read))
    }

    pub(crate) fn get(&mut self) -> &[u8] {
        if let LazyBody::Unread(read) = self {
            *self = LazyBody::Read(read.take().map(|read| read()).unwrap_or_default());
        }
        match self {
            LazyBody::Read(body) => body,
            LazyBody::Unread(_) => &[],
        }
    }
}
