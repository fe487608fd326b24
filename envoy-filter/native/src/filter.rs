//! One HTTP stream through rpcedge: moves headers and body bytes between Envoy's hooks and the
//! core's `ProxyExchange`, which makes every decision, the cache's included.
//!
//! The body goes out as the core gives it: each body hook replaces the chunk Envoy received with
//! the core's output for it and lets Envoy go on. While the core holds data and has nothing to
//! send, the hook stops Envoy at this filter (`stopped`), so that a deadline (`timer`) can still
//! add the core's output to the body Envoy holds for the filter and continue it. A filter that
//! Envoy iterates past cannot write at a deadline, so when a compressed part goes out from a hook,
//! what the compressor still holds is flushed with it.

use std::sync::Arc;

use rpcedge_core::metrics::Counter;
use rpcedge_core::proxy::cache::{DaemonCall, ROUTE_METADATA, ROUTE_NAMESPACE};
use rpcedge_core::proxy::drive::{self, HeadStep, Step};
use rpcedge_core::proxy::ProxyExchange;
use rpcedge_core::HeaderOp;

use crate::abi::{BodyStatus, BodyType, HeadersStatus, HeaderType, LogLevel, TrailersStatus};
use crate::host::{log, Host, Scheduler};
use crate::timer::{self, now_ms};
use crate::shared::Shared;

/// The event that continues a response stopped at its trailers, so that the body added there
/// goes out before them.
const RESUME: u64 = 2;

pub struct Filter {
    shared: Arc<Shared>,
    exchange: ProxyExchange,
    /// Envoy's response iteration is stopped at this filter: only then may it be continued, with
    /// what the filter adds to the body Envoy holds for it.
    stopped: bool,
    /// The core released the response headers: they went on with Envoy.
    headers_released: bool,
    /// The lookup this request waits for.
    lookup: Option<u64>,
    /// Created when first needed, deleted with the filter.
    scheduler: Option<Scheduler>,
    armed: Option<timer::Armed>,
}

impl Filter {
    pub fn new(shared: Arc<Shared>) -> Filter {
        Filter {
            exchange: ProxyExchange::new(Arc::clone(&shared.settings), Arc::clone(&shared.node), timer::clock),
            shared,
            stopped: false,
            headers_released: false,
            lookup: None,
            scheduler: None,
            armed: None,
        }
    }

    pub fn on_request_headers(&mut self, host: Host, end_of_stream: bool) -> HeadersStatus {
        let headers = host.headers(HeaderType::Request);
        let route_namespace = || host.route_metadata(ROUTE_METADATA, ROUTE_NAMESPACE);
        let hot = self.shared.cache.as_ref().and_then(|cache| cache.hot());
        let mut hook = Hook::new(host, &self.shared, &[BodyType::BufferedRequest]);
        let step = drive::request_headers(&mut self.exchange, &mut hook, &headers, end_of_stream, route_namespace, hot);
        let status = match self.waits(step) {
            false => HeadersStatus::Continue,
            true => HeadersStatus::StopIteration,
        };
        self.account(host);
        status
    }

    pub fn on_request_body(&mut self, host: Host, end_of_stream: bool) -> BodyStatus {
        if !self.exchange.reads_request_body() {
            return BodyStatus::Continue;
        }
        let size = host.body_size(BodyType::BufferedRequest) + host.body_size(BodyType::ReceivedRequest);
        let body = || {
            let mut whole = Vec::with_capacity(size);
            for slice in host.body(BodyType::BufferedRequest).into_iter().chain(host.body(BodyType::ReceivedRequest)) {
                whole.extend_from_slice(slice);
            }
            whole
        };
        let hot = self.shared.cache.as_ref().and_then(|cache| cache.hot());
        // the body so far is Envoy's received data, and what it buffered before
        let mut hook = Hook::new(host, &self.shared, &[BodyType::BufferedRequest, BodyType::ReceivedRequest]);
        let step = drive::request_body(&mut self.exchange, &mut hook, size, end_of_stream, body, hot);
        let status = match step {
            Step::Replied => BodyStatus::StopIterationNoBuffer,
            step if self.waits(step) => BodyStatus::StopIterationAndBuffer,
            _ => BodyStatus::Continue,
        };
        self.account(host);
        status
    }

    /// Whether the request stops here after a step, and notes the lookup it waits for.
    fn waits(&mut self, step: Step) -> bool {
        if let Step::Lookup(id) = step {
            self.lookup = Some(id);
        }
        step != Step::Continue
    }

    /// The daemon answered a lookup (no headers: it did not, in time): its hit goes out, the next
    /// lookup is made, or the request goes on to the node.
    pub fn on_lookup_answer(&mut self, host: Host, id: u64, headers: &[(&[u8], &[u8])], body: &[u8]) {
        if self.lookup != Some(id) {
            return;
        }
        self.lookup = None;
        let hot = self.shared.cache.as_ref().and_then(|cache| cache.hot());
        // Envoy buffered the whole request body while the lookup ran
        let mut hook = Hook::new(host, &self.shared, &[BodyType::BufferedRequest]);
        let step = drive::lookup_answer(&mut self.exchange, &mut hook, headers, body, hot);
        if !self.waits(step) {
            host.continue_request();
        }
        self.account(host);
    }

    pub fn on_response_headers(&mut self, host: Host, end_of_stream: bool) -> HeadersStatus {
        self.restore_client_headers(host);
        if self.exchange.replied() {
            // the cache's own reply
            return HeadersStatus::Continue;
        }
        let headers = host.headers(HeaderType::Response);
        // (Envoy's header bytes are not read past here: setting a header may move them.)
        let hook = &mut Hook::new(host, &self.shared, &[]);
        let status = match drive::response_headers(&mut self.exchange, hook, &headers, end_of_stream) {
            HeadStep::Continue => HeadersStatus::Continue,
            HeadStep::Hold => {
                self.stopped = true;
                HeadersStatus::StopIteration
            }
            HeadStep::Failed => HeadersStatus::StopIteration,
        };
        self.account(host);
        status
    }

    pub fn on_response_body(&mut self, host: Host, end: bool) -> BodyStatus {
        // A filter before this one on Envoy's response path may end the body in trailers of its own
        // during this callback (Envoy's decompressor does): Envoy shows them to this filter only
        // if it goes on now, so the body ends here.
        let end = end || host.has_headers(HeaderType::ResponseTrailer);
        let passed = self.exchange.is_done();
        let chunks = if self.exchange.reads_body() { host.body(BodyType::ReceivedResponse) } else { Vec::new() };
        self.exchange.clear_output();
        let mut fed = self.feed_all(host, &chunks, end);
        if passed {
            // Passed on untouched (or finished): the cache alone reads what passes.
            self.account(host);
            return BodyStatus::Continue;
        }
        if fed && !end && !self.exchange.output().is_empty() && self.exchange.deadline().is_some() {
            // This part goes out now, and Envoy then iterates past this filter: what the
            // compressor holds goes with it, as no deadline could send it later.
            fed = self.feed(host, &[], false, true);
        }
        let received: usize = chunks.iter().map(|chunk| chunk.len()).sum();
        host.drain_body(BodyType::ReceivedResponse, received);
        self.account(host);
        if !fed {
            return BodyStatus::StopIterationNoBuffer;
        }
        let output = !self.exchange.output().is_empty();
        if !self.write_output(host, BodyType::ReceivedResponse) {
            return BodyStatus::StopIterationNoBuffer;
        }
        if end || output {
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
        let passed = self.exchange.is_done();
        self.exchange.clear_output();
        let fed = self.feed(host, &[], true, false);
        self.account(host);
        if passed {
            return TrailersStatus::Continue;
        }
        if !fed {
            return TrailersStatus::StopIteration;
        }
        self.disarm();
        let output = !self.exchange.output().is_empty();
        if !self.write_output(host, BodyType::BufferedResponse) {
            return TrailersStatus::StopIteration;
        }
        if !output || self.stopped {
            // Envoy sends what it holds here, then the trailers.
            self.stopped = false;
            return TrailersStatus::Continue;
        }
        // Envoy iterates past this filter: the body's end goes into the body Envoy holds here,
        // which goes before the trailers once the filter continues (not from inside this hook).
        self.stopped = true;
        self.scheduler(host).commit(RESUME);
        TrailersStatus::StopIteration
    }

    /// A deadline passed, or a stopped response is to continue.
    pub fn on_scheduled(&mut self, host: Host, event: u64) {
        if event == timer::DEADLINE {
            // The deadline that fired, or one armed since it fired (a callback ran in between):
            // that one is taken back, and armed again below if it is still wanted.
            self.disarm();
        }
        if !self.stopped {
            return;
        }
        if event == RESUME {
            self.stopped = false;
            host.continue_response();
            return;
        }
        if !self.exchange.deadline().is_some_and(|at| at <= now_ms()) {
            self.arm(host);
            return;
        }
        self.exchange.clear_output();
        let headers_held = !self.headers_released;
        let fed = self.feed(host, &[], false, false);
        self.account(host);
        if !fed {
            return;
        }
        if !self.exchange.output().is_empty() || (headers_held && self.headers_released) {
            if !self.write_output(host, BodyType::BufferedResponse) {
                return;
            }
            self.stopped = false;
            host.continue_response();
        } else {
            self.arm(host);
        }
    }

    /// The stream is over (its end, a reset, a local reply).
    pub fn on_stream_complete(&mut self, host: Host) {
        // (a stream that ended before a response head: its access log reads them after this)
        self.restore_client_headers(host);
        self.disarm();
        self.exchange.on_stream_complete();
        self.account(host);
    }

    /// Puts the request headers changed for the node back as the client sent them, on the request
    /// as Envoy keeps it once the node has it: what reads it later (the access log, filters that
    /// read it with the response) reads the client's.
    fn restore_client_headers(&mut self, host: Host) {
        drive::restore_client_headers(&mut self.exchange, &mut Hook::new(host, &self.shared, &[]));
    }

    fn scheduler(&mut self, host: Host) -> Scheduler {
        *self.scheduler.get_or_insert_with(|| host.scheduler())
    }

    /// Wakes this filter at the core's deadline, if it holds data with one.
    fn arm(&mut self, host: Host) {
        self.disarm();
        if let Some(at) = self.exchange.deadline() {
            let scheduler = self.scheduler(host);
            self.armed = Some(timer::arm(at, scheduler));
        }
    }

    fn disarm(&mut self) {
        if let Some(armed) = self.armed.take() {
            timer::disarm(armed);
        }
    }

    /// Feeds Envoy's chunks of the body in turn (an empty body when there are none).
    fn feed_all(&mut self, host: Host, chunks: &[&[u8]], end: bool) -> bool {
        match chunks.split_last() {
            None => self.feed(host, &[], end, false),
            Some((last, before)) => {
                before.iter().all(|chunk| self.feed(host, chunk, false, false)) && self.feed(host, last, end, false)
            }
        }
    }

    /// Feeds the core and applies the headers it releases; its bytes gather in its output. False
    /// when the exchange failed (and the response is being answered or reset).
    fn feed(&mut self, host: Host, chunk: &[u8], end: bool, flush: bool) -> bool {
        match drive::feed(&mut self.exchange, &mut Hook::new(host, &self.shared, &[]), chunk, end, flush) {
            Some(released) => {
                self.headers_released |= released;
                true
            }
            None => {
                self.disarm();
                false
            }
        }
    }

    /// Adds the core's output to the body Envoy holds, piece by piece where the core gives it so.
    /// False when the exchange failed (and the response is being reset).
    fn write_output(&mut self, host: Host, kind: BodyType) -> bool {
        let hook = &mut Hook::new(host, &self.shared, &[]);
        let written = drive::write_output(&mut self.exchange, hook, |piece| host.append_body(kind, piece));
        if !written {
            self.disarm();
        }
        written
    }

    /// Adds what the exchange counted to Envoy's stats, and hands on its store and its warning.
    fn account(&mut self, host: Host) {
        drive::account(&mut self.exchange, &mut Hook::new(host, &self.shared, &[]));
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

/// One of the filter's hooks, as the core's steps call into Envoy.
struct Hook<'a> {
    host: Host,
    shared: &'a Shared,
    /// Where Envoy holds the request body in this hook.
    request_body: &'a [BodyType],
}

impl<'a> Hook<'a> {
    fn new(host: Host, shared: &'a Shared, request_body: &'a [BodyType]) -> Self {
        Hook { host, shared, request_body }
    }
}

impl drive::Host for Hook<'_> {
    fn set_request_header(&mut self, name: &str, value: Option<&[u8]>) {
        self.host.set_header(HeaderType::Request, name, value);
    }

    fn replace_request_body(&mut self, body: &[u8]) {
        for &kind in self.request_body {
            self.host.drain_body(kind, self.host.body_size(kind));
        }
        self.host.append_body(self.request_body[0], body);
    }

    fn edit_response_header(&mut self, op: HeaderOp<'_>) {
        match op {
            HeaderOp::Set(name, value) => self.host.set_header(HeaderType::Response, name, Some(&value)),
            HeaderOp::Append(name, value) => self.host.add_header(HeaderType::Response, name, value),
            HeaderOp::Remove(name) => self.host.set_header(HeaderType::Response, name, None),
        }
    }

    fn call_daemon(&mut self, call: &DaemonCall) -> Option<u64> {
        self.host.call(call)
    }

    /// Envoy sets the reply's Content-Length.
    fn send_reply(&mut self, status: u16, headers: &[(&str, &str)], body: &[u8]) -> bool {
        self.host.send_response(status, headers, body);
        true
    }

    fn reset(&mut self) {
        self.host.reset();
    }

    fn count(&mut self, counter: Counter, amount: u64) {
        self.shared.add(self.host, counter, amount);
    }

    fn record_compress_us(&mut self, us: u64) {
        self.host.record(self.shared.compress_duration, us);
    }

    fn queue_store(&mut self, call: DaemonCall) {
        // stores are made only where the cache is on
        if let Some(cache) = &self.shared.cache {
            cache.queue_store(call);
        }
    }

    fn warn(&mut self, line: &str) {
        log(LogLevel::Warn, line);
    }
}
