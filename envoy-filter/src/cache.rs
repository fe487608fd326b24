//! The response cache in Envoy, over the core's `CacheExchange`: the request waits for its body,
//! then for the daemon's answer to a `dispatch_http_call`, at most `timeout_ms`; a hit goes out
//! as a local reply, anything else goes on to the node. The node's plain answer is held as it
//! passes, and the call that stores it is handed to the root, which makes it: a call made from
//! the stream's context is cancelled when the stream's context goes away. With `hot_bytes`, the
//! daemon's hits are also kept in the worker's own hot tier (one Wasm VM per worker, so the
//! region needs no lock), which answers them again without the call.

use std::cell::RefCell;

use std::time::Duration;

use proxy_wasm::hostcalls;
use proxy_wasm::types::{BufferType, MapType};
use rpcedge_core::cache::{
    default_namespace, CacheExchange, CacheSettings, DaemonAnswer, HitResponse, HotTier, Status, StoreCall,
};
use rpcedge_core::negotiate::asks_for_ssz;
use rpcedge_core::{AcceptEncoding, CacheConfig, Coding};

/// A store may take this long: the daemon deflates an entry (up to `max_entry`) at level 12
/// before it answers.
pub const STORE_TIMEOUT: Duration = Duration::from_secs(5);

pub const STATUS_HEADER: &str = "x-rpcedge-cache";

/// A store, for the root to dispatch.
pub struct PendingStore {
    pub cluster: String,
    pub call: StoreCall,
}

/// A worker's hot tier: its region, laid out by the core.
pub type HotRegion = RefCell<Vec<u8>>;

/// What the request does after its body callback.
pub enum AfterBody {
    /// Goes on to the node.
    Continue,
    /// Waits here: for more body, or for the daemon's answer.
    Wait,
    /// Gets this hit from the hot tier.
    Answer(HitResponse),
}

/// One request's way through the cache.
pub struct CacheRequest {
    namespace: String,
    gzip: bool,
    /// The client asks for SSZ.
    ssz: bool,
    /// A bypass until the body is in.
    exchange: CacheExchange,
    /// The request waits in Envoy until its body has come.
    awaiting_body: bool,
    /// Waiting for the daemon's answer to this call.
    lookup: Option<u32>,
    /// The node's plain body so far, while it may be stored.
    held: Option<Vec<u8>>,
    hit: bool,
}

impl CacheRequest {
    /// From the request's headers: whether the cache may take it once its body is in.
    pub fn new(config: &CacheConfig, headers: &[(String, Vec<u8>)], end_of_stream: bool) -> CacheRequest {
        let text = |name| String::from_utf8_lossy(header(headers, name).unwrap_or_default()).into_owned();
        let namespace = match &config.namespace {
            Some(namespace) => namespace.clone(),
            None => default_namespace(&text(":authority"), &text(":path")),
        };
        let gzip = header(headers, "accept-encoding").map(AcceptEncoding::parse).and_then(|a| a.choose()) == Some(Coding::Gzip);
        let ssz = header(headers, "accept").is_some_and(asks_for_ssz);
        let settings = CacheSettings::default();
        let too_large = number(headers, "content-length").is_some_and(|length| !CacheExchange::takes_length(length, &settings));
        let awaiting_body = header(headers, ":method") == Some(b"POST") && !end_of_stream && !too_large;
        CacheRequest {
            exchange: CacheExchange::new(&namespace, None, gzip, ssz, &settings),
            namespace,
            gzip,
            ssz,
            awaiting_body,
            lookup: None,
            held: None,
            hit: false,
        }
    }

    /// Whether the request waits here for its body.
    pub fn awaits_body(&self) -> bool {
        self.awaiting_body
    }

    /// A request body callback: once the body is all in, the hot tier is asked, then the daemon.
    pub fn on_body(
        &mut self,
        body_size: usize,
        end: bool,
        config: &CacheConfig,
        hot: Option<&HotRegion>,
        min_length: u64,
        now_s: u64,
    ) -> AfterBody {
        if !self.awaiting_body {
            return AfterBody::Continue;
        }
        let settings = CacheSettings::default();
        if !CacheExchange::takes_length(body_size as u64, &settings) {
            // a bypass: let Envoy pass what it holds and the rest
            self.awaiting_body = false;
            return AfterBody::Continue;
        }
        if !end {
            return AfterBody::Wait;
        }
        self.awaiting_body = false;
        let body = hostcalls::get_buffer(BufferType::HttpRequestBody, 0, body_size).ok().flatten().unwrap_or_default();
        self.exchange = CacheExchange::new(&self.namespace, Some(&body), self.gzip, self.ssz, &settings);
        let Some(path) = self.exchange.lookup_path() else { return AfterBody::Continue };
        if let Some(hit) = hot.and_then(|hot| self.hot_hit(hot, min_length, now_s)) {
            self.hit = true;
            return AfterBody::Answer(hit);
        }
        let cluster = self.cluster(config);
        let headers = vec![(":method", "GET"), (":path", path.as_str()), (":authority", cluster)];
        let timeout = Duration::from_millis(config.timeout_ms);
        match hostcalls::dispatch_http_call(cluster, headers, None, vec![], timeout) {
            Ok(token) => {
                self.lookup = Some(token);
                AfterBody::Wait
            }
            Err(status) => {
                log::warn!("rpcedge cache: cannot call {cluster}: {status:?}");
                self.exchange.failed();
                AfterBody::Continue
            }
        }
    }

    fn hot_hit(&mut self, hot: &HotRegion, min_length: u64, now_s: u64) -> Option<HitResponse> {
        let found = HotTier::open(&mut hot.borrow_mut()).is_some_and(|tier| self.exchange.find_hot(&tier, now_s));
        found.then(|| self.exchange.hot_answer(min_length)).flatten()
    }

    /// The daemon answered the lookup (or failed to in time: no headers): the hit to send, kept
    /// in the hot tier too.
    pub fn on_lookup_answer(
        &mut self,
        token: u32,
        body_size: usize,
        min_length: u64,
        hot: Option<&HotRegion>,
        now_s: u64,
    ) -> Option<HitResponse> {
        if self.lookup.take() != Some(token) {
            return None;
        }
        let headers = hostcalls::get_map_bytes(MapType::HttpCallResponseHeaders).unwrap_or_default();
        let Some(status) = number(&headers, ":status") else {
            // Envoy's own failure: the timeout, no healthy daemon
            self.exchange.failed();
            return None;
        };
        let body = if body_size > 0 {
            hostcalls::get_buffer(BufferType::HttpCallResponseBody, 0, body_size).ok().flatten().unwrap_or_default()
        } else {
            Vec::new()
        };
        let miss = header(&headers, "x-rpcedge-miss");
        let answer = DaemonAnswer { status, miss, ttl: header(&headers, "x-rpcedge-ttl"), body: &body };
        let hit = self.exchange.answered(&answer, min_length);
        self.hit = hit.is_some();
        if let (true, Some(hot)) = (self.hit, hot) {
            if let Some(mut tier) = HotTier::open(&mut hot.borrow_mut()) {
                self.exchange.keep_hot(&mut tier, &body, now_s);
            }
        }
        hit
    }

    pub fn is_hit(&self) -> bool {
        self.hit
    }

    /// The node's response head: the status to report, once the core knows whether the body is
    /// held for the store.
    pub fn on_response_head(&mut self, headers: &[(String, Vec<u8>)], end_of_stream: bool) -> Status {
        let status = number(headers, ":status").unwrap_or(0);
        let length = if end_of_stream { Some(0) } else { number(headers, "content-length") };
        let settings = CacheSettings::default();
        if self.exchange.response_head(status, length, header(headers, "content-encoding"), &settings) {
            self.held = Some(Vec::with_capacity(length.unwrap_or(0).min(settings.max_entry as u64) as usize));
        }
        self.exchange.status()
    }

    /// Whether the node's body is being held.
    pub fn holds(&self) -> bool {
        self.held.is_some()
    }

    /// More of the node's plain body.
    pub fn hold(&mut self, chunk: &[u8]) {
        let settings = CacheSettings::default();
        if let Some(held) = &mut self.held {
            held.extend_from_slice(chunk);
            if !self.exchange.keep_holding(held.len() as u64, &settings) {
                self.held = None;
            }
        }
    }

    /// The node's body has ended: the store to make, if the core keeps it.
    pub fn store(&mut self, config: &CacheConfig) -> Option<PendingStore> {
        let held = self.held.take()?;
        let call = self.exchange.store(&held, &CacheSettings::default()).ok()?;
        Some(PendingStore { cluster: self.cluster(config).to_string(), call })
    }

    /// The daemon that holds this request's key: one cluster per shard.
    fn cluster<'a>(&self, config: &'a CacheConfig) -> &'a str {
        &config.clusters[self.exchange.shard(config.clusters.len() as u32) as usize]
    }
}

/// A header's value, from a map as Envoy hands it over (names in lower case).
fn header<'a>(headers: &'a [(String, Vec<u8>)], name: &str) -> Option<&'a [u8]> {
    headers.iter().find(|(n, _)| n == name).map(|(_, value)| value.as_slice())
}

/// A header that holds a number (`:status`, `content-length`); none when absent or malformed.
fn number<T: std::str::FromStr>(headers: &[(String, Vec<u8>)], name: &str) -> Option<T> {
    std::str::from_utf8(header(headers, name)?).ok()?.trim().parse().ok()
}

/// Sends a hit as the local reply (Envoy sets its Content-Length); false when Envoy refused it.
pub fn send_hit(hit: &HitResponse, status_header: bool) -> bool {
    let mut headers: Vec<(&str, &str)> = hit.headers().to_vec();
    if status_header {
        headers.push((STATUS_HEADER, Status::Hit.as_str()));
    }
    hostcalls::send_http_response(200, headers, Some(&hit.body)).is_ok()
}

/// Dispatches a store from the root context.
pub fn dispatch_store(store: &PendingStore) -> Option<u32> {
    let mut headers = vec![(":method", "PUT"), (":path", store.call.path.as_str()), (":authority", store.cluster.as_str())];
    headers.extend(store.call.headers.iter().map(|(name, value)| (*name, value.as_str())));
    match hostcalls::dispatch_http_call(&store.cluster, headers, Some(&store.call.body), vec![], STORE_TIMEOUT) {
        Ok(token) => Some(token),
        Err(status) => {
            log::warn!("rpcedge cache: cannot store through {}: {status:?}", store.cluster);
            None
        }
    }
}
