//! One HTTP exchange through a proxy that hands rpcedge the request and the response as header
//! lists and body chunks, and calls the cache daemon itself (the two Envoy adapters): every
//! decision on the way, in one place. The host calls the `on_*` methods from its own hooks and
//! does what they return (stop or go on, edit headers, call the daemon, reply, reset); it moves
//! the bytes, and after each hook adds what [`ProxyExchange::take_counters`] gives to its stats.
//! How a host talks to its proxy (when it may write a body, resume or wake at a deadline) stays
//! in the host.

use std::borrow::Cow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

pub mod cache;
pub mod drive;

use self::cache::{AfterBody, DaemonCall, LazyBody, ProxyCacheRequest};
use crate::cache::{HitResponse, HotRegion, Passed, Status as CacheStatus};
use crate::edits::{EncodingVary, HeaderOp};
use crate::exchange::{BodyPlan, Exchange, Failure, Mode};
use crate::metrics::{self, Counter};
use crate::{dictionary, Node, Settings};

/// The host's monotonic clock, in microseconds: the core reads none of its own. Deadlines
/// ([`ProxyExchange::deadline`], [`ProxyExchange::head_deadline`]) are in its milliseconds.
pub type Clock = fn() -> u64;

/// What the host does with the request's headers.
#[derive(Debug)]
pub struct RequestHead {
    /// Ask the node for this media type, without Accept-Encoding (an encoded answer could not be
    /// rendered); set once the request's method is known, which may take its body.
    pub upstream_accept: Option<&'static str>,
    /// Remove `Accept-Encoding` from the request to the node: rpcedge may have work on the
    /// answer, which must then come identity ([`Exchange::node_identity`]).
    pub node_identity: bool,
    /// `Wait`: stop the request here until its body has come; a request the cache takes without
    /// a body (a Beacon-API read) may make its lookup, or get its reply, here.
    pub step: RequestStep,
}

/// What the host does after a request's headers or body callback, or a lookup's answer.
#[derive(Debug)]
pub enum RequestStep {
    /// Go on to the node with the body.
    Continue,
    /// Go on to the node with this body instead of the client's (a batch less the calls the
    /// cache answered), Content-Length set to its length. The head asked the node for identity
    /// already ([`RequestHead::node_identity`]: the cache may keep its answer), which is merged
    /// here.
    Forward(Vec<u8>),
    /// Keep the body so far and wait here for more.
    Wait,
    /// Make this lookup and wait for its answer (`on_lookup_answer`, or `lookup_failed` when it
    /// cannot be made).
    Lookup(DaemonCall),
    /// Answer with this reply: the node never sees the request.
    Reply(Reply),
}

/// A request body callback's outcome.
#[derive(Debug)]
pub struct RequestBody {
    /// As in [`RequestHead`]: the node's Accept, now that the method is known (the head asked
    /// for identity already).
    pub upstream_accept: Option<&'static str>,
    pub step: RequestStep,
}

/// A reply the proxy sends itself (a cache hit, or the dcz dictionary): its status, headers and
/// body.
#[derive(Debug)]
pub struct Reply(Replying);

#[derive(Debug)]
enum Replying {
    Hit {
        hit: HitResponse,
        /// The status header's value, where it is on.
        status: Option<&'static str>,
    },
    Dictionary {
        status: u16,
        headers: Vec<(&'static str, String)>,
        body: &'static [u8],
    },
}

impl Reply {
    pub fn status(&self) -> u16 {
        match &self.0 {
            Replying::Hit { .. } => HitResponse::STATUS,
            Replying::Dictionary { status, .. } => *status,
        }
    }

    pub fn headers(&self) -> Vec<(&str, &str)> {
        match &self.0 {
            Replying::Hit { hit, status } => cache::hit_headers(hit, *status),
            Replying::Dictionary { headers, .. } => headers.iter().map(|(name, value)| (*name, value.as_str())).collect(),
        }
    }

    pub fn body(&self) -> &[u8] {
        match &self.0 {
            Replying::Hit { hit, .. } => &hit.body,
            Replying::Dictionary { body, .. } => body,
        }
    }
}

/// What the host does with the response's headers.
#[derive(Debug)]
pub struct ResponseHead<'a> {
    /// Changes to the headers, in order.
    pub edits: Vec<HeaderOp<'a>>,
    /// Stop the response here: the core holds the headers until it releases them with the body
    /// (`on_body`).
    pub hold: bool,
}

/// The header the core removes from every answer it encodes (`edits.rs`), which few nodes send:
/// the exchange notes whether the node sent it, and leaves out its removal when it did not, which
/// would cost the host a call for nothing.
const ACCEPT_RANGES: &str = "accept-ranges";

/// The exchange failed: the host answers with this status, or resets the response.
#[derive(Debug)]
pub struct Failed {
    pub failure: Failure,
    pub why: String,
}

/// Whether the proxy passes the body on to a filter that holds the head (the request's or the
/// response's) to wait for that body. Envoy's Wasm host does only with the plugin's
/// `allow_on_headers_stop_iteration`, which the filter cannot read; so the exchanges of a
/// configuration learn it together, from the first body that comes to a held head. Until then
/// each head is held at most `stream_delay_ms` ([`ProxyExchange::head_deadline`]).
#[derive(Debug, Default)]
pub struct HeldHeads {
    body_comes: AtomicBool,
    /// A head went on without its body: said once in the host's log.
    warned: AtomicBool,
}

/// Which head a [`HeadBound`] holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Head {
    Request,
    Response,
}

/// A head held for a body the proxy may withhold, and when it goes on without it.
#[derive(Debug, Clone, Copy)]
struct HeadBound {
    head: Head,
    at_ms: u64,
}

/// A request header the host changes for the node, as the client sent it: its values joined
/// (`None`: the client sent none), and whether the host changed it yet.
struct ClientHeader {
    name: &'static str,
    value: Option<Vec<u8>>,
    changed: bool,
}

/// One exchange through the proxy, and through the cache when it is on.
pub struct ProxyExchange {
    settings: Arc<Settings>,
    clock: Clock,
    exchange: Exchange,
    /// This request's way through the cache, when the cache is on.
    cache: Option<ProxyCacheRequest>,
    /// The core waits for the request body (to transcode).
    body_wanted: bool,
    /// Nothing more to feed: the core passed the body, finished it or failed, or the cache
    /// answered.
    done: bool,
    /// The core's output since the host last cleared it.
    out: Vec<u8>,
    /// The core has more of the body ready (see [`ProxyExchange::write_output`]).
    more: bool,
    /// The node's response has an `ACCEPT_RANGES`.
    accept_ranges_sent: bool,
    compress_us: u64,
    /// What to add to the host's counters, and the compression time to record.
    counters: Vec<(Counter, u64)>,
    compress_duration: Option<u64>,
    /// The stores to make, once the node's answer has ended.
    stores: Vec<DaemonCall>,
    /// The node's status, while its answer to a split batch is held to be merged.
    merging: Option<u16>,
    /// Worth a line in the host's log.
    warning: Option<String>,
    /// Whether the proxy passes the body to a held head, where it may not: learned with the
    /// configuration's other exchanges.
    held_heads: Option<Arc<HeldHeads>>,
    /// The head held now for a body that may not come.
    head_bound: Option<HeadBound>,
    /// The request headers the host changes for the node, as the client sent them.
    client_headers: Vec<ClientHeader>,
}

impl ProxyExchange {
    /// An exchange under a configuration's settings, with what its exchanges have learned about
    /// the node, on the host's clock.
    pub fn new(settings: Arc<Settings>, node: Arc<Node>, clock: Clock) -> Self {
        ProxyExchange {
            exchange: Exchange::new(Arc::clone(&settings), node),
            settings,
            clock,
            cache: None,
            body_wanted: false,
            done: false,
            out: Vec::new(),
            more: false,
            accept_ranges_sent: false,
            compress_us: 0,
            counters: Vec::new(),
            compress_duration: None,
            stores: Vec::new(),
            merging: None,
            warning: None,
            held_heads: None,
            head_bound: None,
            client_headers: Vec::new(),
        }
    }

    /// The proxy may withhold the body from a filter that holds the head (Envoy's Wasm host):
    /// until `held_heads` has seen a body come to a held head, each head is held at most
    /// `stream_delay_ms`. The node is asked for SSZ only once a body has come to one, as it does to
    /// a JSON-RPC call's own head held for its method: the answer's head must wait for the
    /// rendering, and a JSON client is never let go with SSZ.
    pub fn bounding_held_heads(mut self, held_heads: Arc<HeldHeads>) -> Self {
        self.held_heads = Some(held_heads);
        self
    }

    fn now_ms(&self) -> u64 {
        (self.clock)() / 1000
    }

    /// Whether the proxy passes the body to a held head.
    fn body_comes(&self) -> bool {
        self.held_heads.as_ref().map_or(true, |held| held.body_comes.load(Ordering::Relaxed))
    }

    /// The host holds this head for its body: for at most `stream_delay_ms` where the body may
    /// not come.
    fn hold_head(&mut self, head: Head) {
        if !self.body_comes() {
            self.head_bound = Some(HeadBound { head, at_ms: self.now_ms() + self.settings.stream_delay_ms });
        }
    }

    /// A body came while its head was held: the proxy passes bodies to held heads.
    fn body_came(&mut self, head: Head) {
        if self.head_bound.is_some_and(|bound| bound.head == head) {
            self.head_bound = None;
            if let Some(held_heads) = &self.held_heads {
                held_heads.body_comes.store(true, Ordering::Relaxed);
            }
        }
    }

    /// When the host calls [`ProxyExchange::let_request_go`] or
    /// [`ProxyExchange::let_response_go`], while it holds a head whose body may not come.
    pub fn head_deadline(&self) -> Option<u64> {
        self.head_bound.map(|bound| bound.at_ms)
    }

    /// Whether the held head's bound has passed: it goes on without its body (said once in the
    /// host's log).
    fn head_due(&mut self, head: Head) -> bool {
        if !self.head_bound.is_some_and(|bound| bound.head == head && bound.at_ms <= self.now_ms()) {
            return false;
        }
        self.head_bound = None;
        if let Some(held_heads) = &self.held_heads {
            if !held_heads.warned.swap(true, Ordering::Relaxed) {
                self.warning = Some(format!(
                    "a held head went on after {} ms (stream_delay_ms) without its body, which the proxy withholds \
                     from a filter that holds the head (Envoy's Wasm filter needs allow_on_headers_stop_iteration: \
                     true): until a body comes to one, such heads and their bodies pass as they come",
                    self.settings.stream_delay_ms
                ));
            }
        }
        true
    }

    /// At [`ProxyExchange::head_deadline`]: whether the request's head, held for its body, goes on
    /// without it now (the host resumes the request). Its body then passes unread, past the
    /// cache.
    pub fn let_request_go(&mut self) -> bool {
        if !self.head_due(Head::Request) {
            return false;
        }
        self.body_wanted = false;
        if let Some(request) = &mut self.cache {
            request.go_without_body();
        }
        true
    }

    /// At [`ProxyExchange::head_deadline`]: whether the response's head, held for its body, goes
    /// on without it now (the host resumes the response), as the node sent it, with the edits
    /// it was given at the head. Its body then passes as it comes. (The head of a split batch
    /// waits for no bound: its request's body came to a held head.)
    pub fn let_response_go(&mut self) -> bool {
        if !self.head_due(Head::Response) {
            return false;
        }
        self.finish(Mode::Untouched);
        true
    }

    /// Notes a request header the host changes for the node, as the client sent it (its values in
    /// `headers`, as one field).
    fn keep_client_header<N, V>(&mut self, headers: &[(N, V)], name: &'static str, changed: bool)
    where
        N: AsRef<[u8]>,
        V: AsRef<[u8]>,
    {
        let value = crate::cache::header_field(headers, name);
        self.client_headers.push(ClientHeader { name, value, changed });
    }

    /// The host changed this request header for the node.
    fn client_header_changed(&mut self, name: &str) {
        if let Some(header) = self.client_headers.iter_mut().find(|header| header.name == name) {
            header.changed = true;
        }
    }

    /// The request headers the host changed for the node (Accept-Encoding, Accept,
    /// Content-Length), with the client's values (`None`: the client sent none), once: the host
    /// puts them back on the request as it keeps it, once the node has it, so that what reads the
    /// request later (access logs, filters that read it with the response) reads the client's.
    pub fn take_client_headers(&mut self) -> Vec<(&'static str, Option<Vec<u8>>)> {
        let headers = std::mem::take(&mut self.client_headers).into_iter();
        headers.filter(|header| header.changed).map(|header| (header.name, header.value)).collect()
    }

    /// The request's headers (pseudo-headers included, names in lower case). `route_namespace`
    /// gives the cache namespace set on the route the request took, read only when the cache is
    /// on.
    pub fn on_request_headers<N: AsRef<[u8]>, V: AsRef<[u8]>, R: AsRef<[u8]>>(
        &mut self,
        headers: &[(N, V)],
        end_of_stream: bool,
        route_namespace: impl FnOnce() -> Option<R>,
        hot: Option<&dyn HotRegion>,
    ) -> RequestHead {
        if let Some(reply) = self.dictionary(headers) {
            self.done = true;
            return RequestHead { upstream_accept: None, node_identity: false, step: RequestStep::Reply(reply) };
        }
        for (name, value) in headers {
            match name.as_ref() {
                b":method" => self.exchange.request_method(value.as_ref()),
                b":path" => self.exchange.request_path(value.as_ref()),
                name => self.exchange.request_header(name, value.as_ref()),
            }
        }
        self.body_wanted = self.exchange.wants_request_body() && !end_of_stream;
        let mut after = AfterBody::Continue;
        if let Some(config) = self.settings.cache.as_ref().filter(|cache| cache.enabled) {
            let (route_namespace, settings) = (route_namespace(), self.settings.cache_settings());
            let route_namespace = route_namespace.as_ref().map(R::as_ref);
            let request = ProxyCacheRequest::new(config, settings, route_namespace, headers, end_of_stream);
            if request.may_keep() {
                self.exchange.cache_may_keep();
            }
            let min_length = self.settings.min_length;
            after = self.cache.insert(request).on_headers_end(config, hot, min_length, (self.clock)() / 1_000_000);
        }
        // Asking the node for SSZ may wait for the body's method: the headers wait with it.
        let body_for_ssz = self.body_wanted && self.settings.transcode_upstream_ssz;
        if matches!(after, AfterBody::Continue) && body_for_ssz {
            after = AfterBody::Wait;
        }
        let upstream_accept = if self.body_wanted || !self.body_comes() { None } else { self.exchange.upstream_accept() };
        let node_identity = self.exchange.node_identity();
        if node_identity {
            self.keep_client_header(headers, "accept-encoding", true);
        }
        if upstream_accept.is_some() || body_for_ssz {
            self.keep_client_header(headers, "accept", upstream_accept.is_some());
        }
        if self.cache.as_ref().is_some_and(ProxyCacheRequest::awaits_body) {
            // a batch the cache answers in part goes on shorter
            self.keep_client_header(headers, "content-length", false);
        }
        if matches!(after, AfterBody::Wait) {
            self.hold_head(Head::Request);
        }
        RequestHead { upstream_accept, node_identity, step: self.step(after, true) }
    }

    /// The reply that serves the dcz dictionary, where the request is for it.
    fn dictionary<N: AsRef<[u8]>, V: AsRef<[u8]>>(&self, headers: &[(N, V)]) -> Option<Reply> {
        let config = self.settings.dictionary.as_ref()?;
        let header = |wanted: &[u8]| headers.iter().find(|(name, _)| name.as_ref() == wanted).map(|(_, v)| v.as_ref());
        if !config.serves(header(b":path")?) {
            return None;
        }
        let served = dictionary::serve(header(b":method").unwrap_or_default(), header(b"if-none-match"), &config.pattern);
        Some(Reply(Replying::Dictionary { status: served.status, headers: served.headers, body: served.body }))
    }

    /// Whether the request body is the core's business (to transcode it, or for the cache): else
    /// the host lets it pass without reading it, or its size.
    pub fn reads_request_body(&self) -> bool {
        self.body_wanted || self.cache.as_ref().is_some_and(ProxyCacheRequest::awaits_body)
    }

    /// A request body callback, with the body's size so far; `body` reads it (at most once).
    pub fn on_request_body(
        &mut self,
        body_size: usize,
        end_of_stream: bool,
        body: impl FnOnce() -> Vec<u8>,
        hot: Option<&dyn HotRegion>,
    ) -> RequestBody {
        self.body_came(Head::Request);
        let mut body = LazyBody::new(body);
        let mut upstream_accept = None;
        if self.body_wanted {
            if Exchange::takes_request_body(body_size) {
                if !end_of_stream {
                    // the proxy holds it until it is whole
                    return RequestBody { upstream_accept, step: RequestStep::Wait };
                }
                self.exchange.request_body(body.get());
                // a head held for this body that got it taught `held_heads` so
                if self.body_comes() {
                    upstream_accept = self.exchange.upstream_accept();
                }
            }
            self.body_wanted = false;
        }
        if upstream_accept.is_some() {
            self.client_header_changed("accept");
        }
        let step = self.look_up(body_size, end_of_stream, body, hot);
        RequestBody { upstream_accept, step }
    }

    /// The cache's part of a request body callback: once the body is in, a hit from the hot tier,
    /// or the daemon's lookup to wait for.
    fn look_up<F: FnOnce() -> Vec<u8>>(
        &mut self,
        body_size: usize,
        end_of_stream: bool,
        mut body: LazyBody<F>,
        hot: Option<&dyn HotRegion>,
    ) -> RequestStep {
        let (Some(request), Some(config)) = (self.cache.as_mut(), self.settings.cache.as_ref()) else {
            return RequestStep::Continue;
        };
        let (settings, min_length, now_s) = (self.settings.cache_settings(), self.settings.min_length, (self.clock)() / 1_000_000);
        let after = request.on_body(body_size, end_of_stream, &mut body, config, settings, hot, min_length, now_s);
        self.step(after, true)
    }

    fn step(&mut self, after: AfterBody, hot: bool) -> RequestStep {
        match after {
            AfterBody::Continue => RequestStep::Continue,
            AfterBody::Forward(body) => {
                self.client_header_changed("content-length");
                RequestStep::Forward(body)
            }
            AfterBody::Wait => RequestStep::Wait,
            AfterBody::Lookup(call) => RequestStep::Lookup(call),
            AfterBody::Answer(hit) => RequestStep::Reply(self.reply(hit, hot)),
        }
    }

    /// The lookup could not be made, or got no answer in time: the request goes on to the node
    /// (`Continue` or `Forward`).
    pub fn lookup_failed(&mut self) -> RequestStep {
        let after = match (self.cache.as_mut(), self.settings.cache.as_ref()) {
            (Some(request), Some(config)) => request.lookup_failed(config),
            _ => AfterBody::Continue,
        };
        self.step(after, false)
    }

    /// The daemon's answer to the lookup (no `:status`: it failed): the reply to send, the next
    /// lookup to make (the wait for the answer another request for the key is getting), or on to
    /// the node.
    pub fn on_lookup_answer<N: AsRef<[u8]>, V: AsRef<[u8]>>(
        &mut self,
        headers: &[(N, V)],
        body: &[u8],
        hot: Option<&dyn HotRegion>,
    ) -> RequestStep {
        let (Some(request), Some(config)) = (self.cache.as_mut(), self.settings.cache.as_ref()) else {
            return RequestStep::Continue;
        };
        let now_s = (self.clock)() / 1_000_000;
        let after = request.on_lookup_answer(headers, body, config, self.settings.min_length, hot, now_s);
        self.step(after, false)
    }

    /// A hit, from the hot tier or the daemon, or another request's answer it waited for.
    fn reply(&mut self, hit: HitResponse, hot: bool) -> Reply {
        let status = self.cache.as_ref().map_or(CacheStatus::Hit, ProxyCacheRequest::status);
        self.counters.extend(metrics::cache_hit(status, hot).map(|c| (c, 1)));
        self.done = true;
        Reply(Replying::Hit { hit, status: self.status_header().then_some(status.as_str()) })
    }

    /// The response's headers (`:status` included). The host applies the edits and, if told to,
    /// stops the response until the core releases the headers.
    pub fn on_response_headers<N: AsRef<[u8]>, V: AsRef<[u8]>>(
        &mut self,
        headers: &[(N, V)],
        end_of_stream: bool,
    ) -> Result<ResponseHead<'_>, Failed> {
        let mut edits = Vec::new();
        if self.replied() {
            return Ok(ResponseHead { edits, hold: false });
        }
        let mut merging = false;
        if let Some(request) = &mut self.cache {
            let cache_status = request.on_response_head(headers, end_of_stream);
            self.counters.extend(metrics::cache_responded(cache_status, request.bypass()).map(|c| (c, 1)));
            if let Some(config) = self.settings.cache.as_ref().filter(|c| c.status_header) {
                edits.push(HeaderOp::Append(cache::status_header(), request.status_value(config.status_reason)));
            }
            // (an answer that ends at its head has no body to put the store's answers into)
            merging = request.replaces_body() && !end_of_stream;
            if end_of_stream {
                self.store_in_cache();
            }
        }
        let mut status = 0;
        for (name, value) in headers {
            match name.as_ref() {
                b":status" => status = std::str::from_utf8(value.as_ref()).ok().and_then(|s| s.parse().ok()).unwrap_or(0),
                // a merged batch's length is its own, known once it is whole
                b"content-length" if merging => {}
                name => {
                    self.accept_ranges_sent |= name.eq_ignore_ascii_case(ACCEPT_RANGES.as_bytes());
                    self.exchange.response_header(name, value.as_ref())
                }
            }
        }
        if merging {
            // the exchange's plan waits for the merged body
            self.merging = Some(status);
            return Ok(ResponseHead { edits, hold: true });
        }
        if end_of_stream {
            // no body follows: the core sees an empty one
            self.exchange.response_content_length(Some(0));
        }
        let hold = match self.exchange.response_head(status) {
            BodyPlan::Pass => {
                self.finish(self.exchange.mode());
                false
            }
            BodyPlan::Stream => false,
            // An empty body: the core only settles the headers.
            BodyPlan::Buffer if end_of_stream => {
                self.feed(&[], true, false)?;
                false
            }
            BodyPlan::Buffer => {
                self.hold_head(Head::Response);
                true
            }
        };
        if !hold && edits.is_empty() {
            edits = self.edits();
        } else if !hold {
            edits.extend(self.edits());
        }
        Ok(ResponseHead { edits, hold })
    }

    /// The cache answered: the response is the host's own reply, which passes untouched (the host
    /// need not read its headers).
    pub fn replied(&self) -> bool {
        self.cache.as_ref().is_some_and(ProxyCacheRequest::is_hit)
    }

    /// Whether the host reads the response body: to feed the core or to hold it for the cache.
    pub fn reads_body(&self) -> bool {
        !self.done || self.cache.as_ref().is_some_and(ProxyCacheRequest::holds)
    }

    /// A chunk of the node's body (`end`: its last): held for the cache where it keeps it, and
    /// fed to the core, whose output goes to [`ProxyExchange::output`]. The header edits the core
    /// releases with it come back (once); a failure says what to do instead.
    pub fn on_body(
        &mut self,
        chunk: &[u8],
        end: bool,
        flush: bool,
    ) -> Result<Option<Vec<HeaderOp<'_>>>, Failed> {
        if !chunk.is_empty() || end {
            self.body_came(Head::Response);
        }
        if self.merging.is_some() {
            return self.merge(chunk, end, flush);
        }
        if let Some(request) = self.cache.as_mut() {
            // held for the store, where the core keeps the answer; the piece goes on as it came
            request.pass(chunk, end);
        }
        if end {
            self.store_in_cache();
        }
        if self.done {
            return Ok(None);
        }
        self.feed(chunk, end, flush)
    }

    /// More of the node's answer to a split batch, held until the client's answer can be made: then
    /// the exchange plans and is fed that, and the rest of the node's body after it if any. Its
    /// Content-Length is the merged body's, or none when the rest is still to come.
    fn merge(&mut self, chunk: &[u8], end: bool, flush: bool) -> Result<Option<Vec<HeaderOp<'_>>>, Failed> {
        let request = self.cache.as_mut().expect("only the cache merges");
        let answer = match request.pass(chunk, end) {
            Passed::Held => return Ok(None),
            Passed::Merged(answer) => answer,
            Passed::On | Passed::Kept => chunk.to_vec(),
        };
        let status = self.merging.take().expect("merging");
        if end {
            self.store_in_cache();
            self.exchange.response_content_length(Some(answer.len() as u64));
        }
        if self.exchange.response_head(status) != BodyPlan::Pass {
            return self.feed(&answer, end, flush);
        }
        self.out.extend_from_slice(&answer);
        self.finish(self.exchange.mode());
        let mut edits = self.edits();
        if !edits.iter().any(|op| matches!(op, HeaderOp::Set("content-length", _) | HeaderOp::Remove("content-length"))) {
            edits.push(match end {
                true => HeaderOp::Set("content-length", Cow::Owned(answer.len().to_string().into_bytes())),
                false => HeaderOp::Remove("content-length"),
            });
        }
        Ok(Some(edits))
    }

    /// The response's trailers: its body has ended.
    pub fn on_trailers(&mut self) -> Result<Option<Vec<HeaderOp<'_>>>, Failed> {
        self.on_body(&[], true, false)
    }

    fn feed(&mut self, chunk: &[u8], end: bool, flush: bool) -> Result<Option<Vec<HeaderOp<'_>>>, Failed> {
        let started = (self.clock)();
        let now_ms = started / 1000;
        let mut released = false;
        let mut fed = self.exchange.feed(chunk, end, flush, now_ms);
        // More of the body (a witness's SSZ, piece by piece): taken here until some is out (so the
        // headers are), the rest by `write_output`.
        let ended = loop {
            match fed {
                Ok(output) => {
                    self.out.extend_from_slice(output.data);
                    released |= output.headers.is_some();
                    self.more = output.more;
                    if !output.more || !self.out.is_empty() {
                        break output.end;
                    }
                }
                Err(e) => {
                    let failure = self.exchange.failure();
                    return Err(self.fail(e.to_string(), failure));
                }
            }
            fed = self.exchange.feed(&[], false, false, now_ms);
        };
        self.compress_us += (self.clock)().saturating_sub(started);
        if ended {
            self.finish(self.exchange.mode());
        }
        Ok(released.then(|| self.edits()))
    }

    /// The exchange's header edits, less the removal of an Accept-Ranges the node did not send.
    fn edits(&self) -> Vec<HeaderOp<'_>> {
        let mut ops = self.exchange.edits().operations(EncodingVary::InLine);
        if !self.accept_ranges_sent {
            ops.retain(|op| *op != HeaderOp::Remove(ACCEPT_RANGES));
        }
        ops
    }

    /// The host cannot end the body as the core asks (its output has nowhere to go): the exchange
    /// fails as if it were aborted.
    pub fn abort(&mut self, why: &str) -> Failed {
        let failure = self.exchange.abort();
        self.fail(why.to_string(), failure)
    }

    fn fail(&mut self, why: String, failure: Failure) -> Failed {
        self.finish(Mode::Failed);
        Failed { failure, why }
    }

    /// The stream is over (its end, a reset, a local reply): an exchange still under way was
    /// aborted.
    pub fn on_stream_complete(&mut self) {
        if !self.done {
            self.done = true;
            self.counters.push((Counter::Aborted, 1));
        }
        // a key held for an answer that never came: its waiters go to the node now
        if let (Some(request), Some(config)) = (self.cache.as_mut(), self.settings.cache.as_ref()) {
            self.stores.extend(request.release(config));
        }
    }

    /// The exchange is over: count it once.
    fn finish(&mut self, mode: Mode) {
        if self.done {
            return;
        }
        self.done = true;
        let outcome = self.exchange.transcode_outcome();
        let (amounts, duration) = metrics::exchange_ended(mode, self.exchange.counts(), self.compress_us, outcome, self.exchange.upstream_encoded());
        self.counters.extend(amounts);
        self.compress_duration = duration;
        if let Some(why) = self.exchange.transcode_refusal() {
            self.warning = Some(format!("not transcoded, sent as it came: {why}"));
        }
    }

    /// The node's answer has ended: its stores, or why the core refuses them.
    fn store_in_cache(&mut self) {
        let (Some(request), Some(config)) = (self.cache.as_mut(), self.settings.cache.as_ref()) else { return };
        for store in request.stores(config) {
            match store {
                Ok(store) => self.stores.push(store),
                Err(refusal) => self.counters.extend(metrics::store_refused(refusal).map(|c| (c, 1))),
            }
        }
    }

    fn status_header(&self) -> bool {
        self.settings.cache.as_ref().is_some_and(|c| c.status_header)
    }

    /// The core's output since the last [`ProxyExchange::clear_output`].
    pub fn output(&self) -> &[u8] {
        &self.out
    }

    pub fn clear_output(&mut self) {
        self.out.clear();
    }

    /// Hands the output to `write`, then each further piece of a body that the core gives piece
    /// by piece, each freed before the next is made: such a body is never held whole here. The
    /// output is empty after.
    pub fn write_output(&mut self, mut write: impl FnMut(&[u8])) -> Result<(), Failed> {
        loop {
            if !self.out.is_empty() {
                write(&self.out);
                self.out.clear();
            }
            if !self.more {
                return Ok(());
            }
            self.feed(&[], false, false)?;
        }
    }

    /// Nothing more to feed.
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// When the core wants to be fed again (`on_body` with an empty chunk), while it holds data.
    pub fn deadline(&self) -> Option<u64> {
        self.exchange.deadline().filter(|_| !self.done)
    }

    /// What to add to the host's counters since the last call, and the compression time to record
    /// in its histogram (microseconds), once the exchange has ended. The list keeps its room for
    /// the next hook's, so that a hook allocates nothing.
    pub fn take_counters(&mut self) -> (std::vec::Drain<'_, (Counter, u64)>, Option<u64>) {
        let compress_us = self.compress_duration.take();
        (self.counters.drain(..), compress_us)
    }

    /// The stores to make, once the node's answer has ended.
    pub fn take_stores(&mut self) -> Vec<DaemonCall> {
        std::mem::take(&mut self.stores)
    }

    /// A line for the host's log, when there is one.
    pub fn take_warning(&mut self) -> Option<String> {
        self.warning.take()
    }
}

#[cfg(test)]
mod tests;
