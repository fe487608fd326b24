//! One HTTP stream through rpcedge: moves headers and body bytes between Envoy's hooks and the
//! core's `Exchange`, which makes every decision.
//!
//! The body goes out as the core gives it: each body hook replaces the chunk Envoy received with
//! the core's output for it and lets Envoy go on. While the core holds data and has nothing to
//! send, the hook stops Envoy at this filter (`stopped`), so that a deadline (`timer`) can still
//! add the core's output to the body Envoy holds for the filter and continue it. A filter that
//! Envoy iterates past cannot write at a deadline, so when a compressed part goes out from a hook,
//! what the compressor still holds is flushed with it.

use std::sync::Arc;
use std::time::Instant;

use rpcedge_core::cache::proxy::{self, AfterBody, ProxyCacheRequest};
use rpcedge_core::cache::{HitResponse, Status as CacheStatus};
use rpcedge_core::metrics::{self, Counter};
use rpcedge_core::{BodyPlan, Exchange, Failure, HeaderEdits, HeaderOp, Mode};

use crate::abi::{BodyStatus, BodyType, HeadersStatus, HeaderType, LogLevel, TrailersStatus};
use crate::host::{log, Host, Scheduler};
use crate::{now_ms, timer, Shared};

/// The event that continues a response stopped at its trailers, so that the body added there
/// goes out before them.
const RESUME: u64 = 2;

pub struct Filter {
    shared: Arc<Shared>,
    exchange: Exchange,
    /// Nothing more to feed: the core passed the body, finished it or failed.
    done: bool,
    /// Envoy's response iteration is stopped at this filter: only then may it be continued, with
    /// what the filter adds to the body Envoy holds for it.
    stopped: bool,
    /// The core released the response headers: they went on with Envoy.
    headers_released: bool,
    /// The core waits for the request body (to transcode).
    body_wanted: bool,
    /// This request's way through the cache, when the cache is on.
    cache: Option<ProxyCacheRequest>,
    /// The lookup this request waits for.
    lookup: Option<u64>,
    /// Created when first needed, deleted with the filter.
    scheduler: Option<Scheduler>,
    armed: Option<timer::Armed>,
    /// The core's output for the current hook.
    out: Vec<u8>,
    compress_ns: u64,
}

impl Filter {
    pub fn new(shared: Arc<Shared>) -> Filter {
        Filter {
            exchange: Exchange::new(Arc::clone(&shared.settings)),
            shared,
            done: false,
            stopped: false,
            headers_released: false,
            body_wanted: false,
            cache: None,
            lookup: None,
            scheduler: None,
            armed: None,
            out: Vec::new(),
            compress_ns: 0,
        }
    }

    pub fn on_request_headers(&mut self, host: Host, end_of_stream: bool) -> HeadersStatus {
        let headers = host.headers(HeaderType::Request);
        for &(name, value) in &headers {
            match name {
                b":method" => self.exchange.request_method(value),
                b":path" => self.exchange.request_path(value),
                _ => self.exchange.request_header(name, value),
            }
        }
        self.body_wanted = self.exchange.wants_request_body() && !end_of_stream;
        let cache_waits = self.shared.cache.as_ref().is_some_and(|cache| {
            let route_namespace = host.route_metadata(proxy::ROUTE_METADATA, proxy::ROUTE_NAMESPACE);
            let request = ProxyCacheRequest::new(&cache.config, route_namespace, &headers, end_of_stream);
            self.cache.insert(request).awaits_body()
        });
        if !self.body_wanted {
            self.ask_upstream(host);
        }
        // Asking the node for SSZ may wait for the body's method: the headers wait with it.
        if cache_waits || (self.body_wanted && self.shared.settings.transcode_upstream_ssz) {
            HeadersStatus::StopIteration
        } else {
            HeadersStatus::Continue
        }
    }

    pub fn on_request_body(&mut self, host: Host, end_of_stream: bool) -> BodyStatus {
        if self.body_wanted {
            let size = host.body_size(BodyType::BufferedRequest) + host.body_size(BodyType::ReceivedRequest);
            if Exchange::takes_request_body(size) {
                if !end_of_stream {
                    // Envoy holds it until it is whole
                    return BodyStatus::StopIterationAndBuffer;
                }
                let body = [host.body(BodyType::BufferedRequest), host.body(BodyType::ReceivedRequest)].concat();
                self.exchange.request_body(&body.concat());
                self.ask_upstream(host);
            }
            self.body_wanted = false;
        }
        self.look_up(host, end_of_stream)
    }

    /// The cache's part of a request body callback: once the body is in, a hit from the hot tier,
    /// or the daemon's lookup to wait for.
    fn look_up(&mut self, host: Host, end_of_stream: bool) -> BodyStatus {
        let shared = Arc::clone(&self.shared);
        let (Some(request), Some(cache)) = (self.cache.as_mut(), shared.cache.as_ref()) else {
            return BodyStatus::Continue;
        };
        let size = host.body_size(BodyType::BufferedRequest) + host.body_size(BodyType::ReceivedRequest);
        let body = || [host.body(BodyType::BufferedRequest), host.body(BodyType::ReceivedRequest)].concat().concat();
        let (min_length, now_s) = (shared.settings.min_length, now_ms() / 1000);
        let after = request.on_body(size, end_of_stream, body, &cache.config, cache.hot(), min_length, now_s);
        match after {
            AfterBody::Continue => BodyStatus::Continue,
            AfterBody::Wait => BodyStatus::StopIterationAndBuffer,
            AfterBody::Answer(hit) => {
                self.answer_hit(host, &hit);
                BodyStatus::StopIterationNoBuffer
            }
            AfterBody::Lookup(call) => match host.call(&call, cache.config.timeout_ms) {
                Some(id) => {
                    self.lookup = Some(id);
                    BodyStatus::StopIterationAndBuffer
                }
                None => {
                    log(LogLevel::Warn, &format!("rpcedge cache: cannot call {}", call.cluster));
                    request.lookup_failed();
                    BodyStatus::Continue
                }
            },
        }
    }

    /// The daemon answered a lookup (no headers: it did not, in time): its hit goes out, or the
    /// request goes on to the node.
    pub fn on_lookup_answer(&mut self, host: Host, id: u64, headers: &[(&[u8], &[u8])], body: &[u8]) {
        let shared = Arc::clone(&self.shared);
        let (Some(request), Some(cache)) = (self.cache.as_mut(), shared.cache.as_ref()) else { return };
        if self.lookup != Some(id) {
            return;
        }
        self.lookup = None;
        let (min_length, now_s) = (shared.settings.min_length, now_ms() / 1000);
        let hit = request.on_lookup_answer(headers, body, min_length, cache.hot(), now_s);
        match hit {
            Some(hit) => self.answer_hit(host, &hit),
            None => host.continue_request(),
        }
    }

    /// Answers the request with a hit: the filter's own reply, with nothing to compress or count
    /// as an exchange.
    fn answer_hit(&mut self, host: Host, hit: &HitResponse) {
        let status_header = self.shared.cache.as_ref().is_some_and(|cache| cache.config.status_header);
        self.shared.add(host, Counter::CacheResponses(CacheStatus::Hit), 1);
        self.done = true;
        host.send_response(200, &proxy::hit_headers(hit, status_header), &hit.body);
    }

    /// The node's answer has ended: its store goes to the main thread.
    fn store_in_cache(&mut self, host: Host) {
        let (Some(request), Some(cache)) = (self.cache.as_mut(), self.shared.cache.as_ref()) else { return };
        match request.store(&cache.config) {
            Ok(Some(call)) => cache.queue_store(call),
            Ok(None) => {}
            Err(refusal) => metrics::store_refused(refusal).into_iter().for_each(|c| self.shared.add(host, c, 1)),
        }
    }

    /// Asks the node for SSZ where the core says so (`Exchange::upstream_accept`), without
    /// Accept-Encoding: an encoded answer could not be rendered.
    fn ask_upstream(&mut self, host: Host) {
        if let Some(accept) = self.exchange.upstream_accept() {
            host.set_header(HeaderType::Request, "accept", Some(accept.to_bytes()));
            host.set_header(HeaderType::Request, "accept-encoding", None);
        }
    }

    pub fn on_response_headers(&mut self, host: Host, end_of_stream: bool) -> HeadersStatus {
        if self.cache.as_ref().is_some_and(ProxyCacheRequest::is_hit) {
            return HeadersStatus::Continue;
        }
        let headers = host.headers(HeaderType::Response);
        let mut status = 0;
        for &(name, value) in &headers {
            if name == b":status" {
                status = std::str::from_utf8(value).ok().and_then(|s| s.parse().ok()).unwrap_or(0);
            } else {
                self.exchange.response_header(name, value);
            }
        }
        if let (Some(request), Some(cache)) = (self.cache.as_mut(), self.shared.cache.as_ref()) {
            let cache_status = request.on_response_head(&headers, end_of_stream);
            for counter in metrics::cache_responded(cache_status, request.bypass()) {
                self.shared.add(host, counter, 1);
            }
            // (Envoy's header bytes are not read past here: setting a header may move them.)
            if cache.config.status_header {
                host.add_header(HeaderType::Response, proxy::status_header(), cache_status.as_str());
            }
            if end_of_stream {
                self.store_in_cache(host);
            }
        }
        if end_of_stream {
            // Envoy says no body follows: the core sees an empty one.
            self.exchange.response_content_length(Some(0));
        }
        match self.exchange.response_head(status) {
            BodyPlan::Pass => {
                apply_edits(host, self.exchange.edits());
                self.finish(host);
            }
            BodyPlan::Stream => apply_edits(host, self.exchange.edits()),
            // An empty body: the core only settles the headers.
            BodyPlan::Buffer if end_of_stream => {
                self.feed(host, &[], true, false);
            }
            BodyPlan::Buffer => {
                self.stopped = true;
                return HeadersStatus::StopIteration;
            }
        }
        HeadersStatus::Continue
    }

    pub fn on_response_body(&mut self, host: Host, end: bool) -> BodyStatus {
        if self.done && !self.cache.as_ref().is_some_and(ProxyCacheRequest::holds) {
            // Passed on untouched (or finished): nothing to read here, the cheapest way through.
            if end {
                self.store_in_cache(host);
            }
            return BodyStatus::Continue;
        }
        let chunks = host.body(BodyType::ReceivedResponse);
        if let Some(request) = self.cache.as_mut().filter(|request| request.holds()) {
            for chunk in &chunks {
                request.hold(chunk);
            }
        }
        if end {
            self.store_in_cache(host);
        }
        if self.done {
            return BodyStatus::Continue;
        }
        self.out.clear();
        let received: usize = chunks.iter().map(|chunk| chunk.len()).sum();
        let last = chunks.len().saturating_sub(1);
        let mut fed = chunks.iter().enumerate().all(|(at, chunk)| self.feed(host, chunk, end && at == last, false));
        if chunks.is_empty() {
            fed = self.feed(host, &[], end, false);
        }
        if fed && !end && !self.out.is_empty() && self.exchange.deadline().is_some() {
            // This part goes out now, and Envoy then iterates past this filter: what the
            // compressor holds goes with it, as no deadline could send it later.
            fed = self.feed(host, &[], false, true);
        }
        host.drain_body(BodyType::ReceivedResponse, received);
        if !fed {
            return BodyStatus::StopIterationNoBuffer;
        }
        host.append_body(BodyType::ReceivedResponse, &self.out);
        if end || !self.out.is_empty() {
            // Envoy sends this (after the headers and anything it holds here, if stopped).
            self.stopped = false;
            self.disarm();
            return BodyStatus::Continue;
        }
        self.stopped = true;
        self.arm(host);
        BodyStatus::StopIterationNoBuffer
    }

    /// Response trailers: the body has ended.
    pub fn on_response_trailers(&mut self, host: Host) -> TrailersStatus {
        self.store_in_cache(host);
        if self.done {
            return TrailersStatus::Continue;
        }
        self.out.clear();
        if !self.feed(host, &[], true, false) {
            return TrailersStatus::StopIteration;
        }
        self.disarm();
        if self.out.is_empty() || self.stopped {
            // Envoy sends what it holds here, then the trailers.
            host.append_body(BodyType::BufferedResponse, &self.out);
            self.stopped = false;
            return TrailersStatus::Continue;
        }
        // Envoy iterates past this filter: the body's end goes out now, or into the body Envoy
        // holds here, which goes before the trailers once the filter continues (not from inside
        // this hook).
        host.append_body(BodyType::BufferedResponse, &self.out);
        self.stopped = true;
        self.scheduler(host).commit(RESUME);
        TrailersStatus::StopIteration
    }

    /// A deadline passed, or a stopped response is to continue.
    pub fn on_scheduled(&mut self, host: Host, event: u64) {
        if event == timer::DEADLINE {
            self.armed = None;
        }
        if !self.stopped {
            return;
        }
        if event == RESUME {
            self.stopped = false;
            host.continue_response();
            return;
        }
        let now = now_ms();
        if self.done || !self.exchange.deadline().is_some_and(|at| at <= now) {
            self.arm(host);
            return;
        }
        self.out.clear();
        let headers_held = !self.headers_released;
        if !self.feed(host, &[], false, false) {
            return;
        }
        if !self.out.is_empty() || (headers_held && self.headers_released) {
            host.append_body(BodyType::BufferedResponse, &self.out);
            self.stopped = false;
            host.continue_response();
        } else {
            self.arm(host);
        }
    }

    /// The stream is over (its end, a reset, a local reply): an exchange still under way was
    /// aborted.
    pub fn on_stream_complete(&mut self, host: Host) {
        self.disarm();
        if !self.done {
            self.done = true;
            self.shared.add(host, Counter::Aborted, 1);
        }
    }

    fn scheduler(&mut self, host: Host) -> Scheduler {
        *self.scheduler.get_or_insert_with(|| host.scheduler())
    }

    /// Wakes this filter at the core's deadline, if it holds data with one.
    fn arm(&mut self, host: Host) {
        self.disarm();
        if let Some(at) = self.exchange.deadline().filter(|_| !self.done) {
            let scheduler = self.scheduler(host);
            self.armed = Some(timer::arm(at, scheduler));
        }
    }

    fn disarm(&mut self) {
        if let Some(armed) = self.armed.take() {
            timer::disarm(armed);
        }
    }

    /// Feeds the core, applies the headers it releases and adds its bytes to `out`; false when
    /// the exchange failed (and the response is being answered or reset).
    fn feed(&mut self, host: Host, chunk: &[u8], end: bool, flush: bool) -> bool {
        let started = Instant::now();
        match self.exchange.feed(chunk, end, flush, now_ms()) {
            Ok(output) => {
                if let Some(edits) = output.headers {
                    apply_edits(host, edits);
                    self.headers_released = true;
                }
                self.out.extend_from_slice(output.data);
                self.compress_ns += started.elapsed().as_nanos() as u64;
                if output.end {
                    self.finish(host);
                }
                true
            }
            Err(e) => {
                let failure = self.exchange.failure();
                self.fail(host, &e.to_string(), failure);
                false
            }
        }
    }

    /// Does what the core says a failure calls for.
    fn fail(&mut self, host: Host, why: &str, failure: Failure) {
        match failure {
            Failure::Respond(status) => {
                log(LogLevel::Warn, &format!("answering {status}: {why}"));
                host.send_response(status, &[], &[]);
            }
            Failure::Reset => {
                log(LogLevel::Warn, &format!("resetting the response: {why}"));
                host.reset();
            }
        }
        self.finish_as(host, Mode::Failed);
    }

    fn finish(&mut self, host: Host) {
        self.finish_as(host, self.exchange.mode());
    }

    /// The exchange is over: count it once.
    fn finish_as(&mut self, host: Host, mode: Mode) {
        if self.done {
            return;
        }
        self.done = true;
        self.disarm();
        let outcome = self.exchange.transcode_outcome();
        let (amounts, duration) = metrics::exchange_ended(mode, self.exchange.counts(), self.compress_ns / 1000, outcome);
        for (counter, amount) in amounts {
            self.shared.add(host, counter, amount);
        }
        if let Some(us) = duration {
            host.record(self.shared.compress_duration, us);
        }
        if let Some(why) = self.exchange.transcode_refusal() {
            log(LogLevel::Warn, &format!("not transcoded, sent as it came: {why}"));
        }
    }
}

impl Drop for Filter {
    fn drop(&mut self) {
        self.disarm();
        if let Some(scheduler) = self.scheduler.take() {
            scheduler.delete();
        }
    }
}

fn apply_edits(host: Host, edits: &HeaderEdits) {
    for op in edits.operations() {
        match op {
            HeaderOp::Set(name, value) => host.set_header(HeaderType::Response, name, Some(&value)),
            HeaderOp::Append(name, value) => host.add_header(HeaderType::Response, name, value),
            HeaderOp::Remove(name) => host.set_header(HeaderType::Response, name, None),
        }
    }
}
