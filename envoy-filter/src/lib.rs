//! rpcedge as an Envoy HTTP filter (proxy-wasm). It only moves headers and body bytes between
//! Envoy's callbacks and the core's `Exchange`, which makes every decision.
//!
//! Held data must go out on time, but only root contexts get timer ticks. So while any exchange
//! holds data with a deadline, its root ticks; for a due exchange it switches to that HTTP
//! context (`proxy_set_effective_context`), writes the core's output into the response body and
//! resumes the response.
//!
//! Envoy lets a filter write the body outside a body callback only while it holds that body for
//! the filter (the last body callback returned `Pause`), and resume the response only where its
//! iteration stopped at the filter. So every body callback pauses until the body ends; output goes
//! out at once by a resume from the callback while Envoy is stopped here, or else (Envoy iterates
//! here since a tick resumed it) by a resume from the next tick, 1 ms later. Envoy counts what it
//! holds against its buffer limit: the core's output (a one-shot body: up to `max_buffer`) and one
//! upstream read (up to the cluster's `per_connection_buffer_limit_bytes`), never the body so far,
//! which the core keeps. The listener's limit must therefore exceed both; the example configs set
//! it.
//!
//! With a `cache` section, requests go through the response cache first (`cache`).

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::ffi::CStr;
use std::rc::{Rc, Weak};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, BufferType, ContextType, LogLevel, MapType, MetricType};
use rpcedge_core::cache::proxy::{self, DaemonCall};
use rpcedge_core::cache::{HitResponse, Status as CacheStatus};
use rpcedge_core::metrics::{self, Counter};
use rpcedge_core::{BodyPlan, Config, Exchange, Failure, HeaderEdits, HeaderOp, Mode, Settings, TranscodeOutcome};

mod cache;
use cache::{AfterBody, CacheRequest, WorkerHot};

/// How often the root looks for due exchanges while some wait: held data goes out at most this
/// long after the core's deadline.
const TICK: Duration = Duration::from_millis(10);
/// The tick while output waits in Envoy's buffer for a resume (see `Stream::on_body`).
const SEND_TICK: Duration = Duration::from_millis(1);

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Info);
    proxy_wasm::set_root_context(|_| Box::<Root>::default());
}}

#[derive(Default)]
struct Root {
    shared: Option<Rc<Shared>>,
}

/// What a root shares with its exchanges (one Wasm VM per worker thread, so no locking).
struct Shared {
    settings: Arc<Settings>,
    metrics: Metrics,
    /// Exchanges that need a tick, by context id.
    waiting: RefCell<HashMap<u32, Weak<RefCell<Stream>>>>,
    /// The root's tick period now (zero: no ticks).
    tick: Cell<Duration>,
    /// Stores for the root to make at its next tick.
    stores: RefCell<Vec<DaemonCall>>,
    /// The worker's hot tier, when the cache has one.
    hot: Option<WorkerHot>,
}

impl Shared {
    /// Ticks as often as the most pressing waiting exchange needs.
    fn set_tick(&self, waiting: &HashMap<u32, Weak<RefCell<Stream>>>) {
        let mut period = if self.stores.borrow().is_empty() { Duration::ZERO } else { SEND_TICK };
        for stream in waiting.values().filter_map(Weak::upgrade) {
            match stream.borrow().due() {
                Some(0) => period = SEND_TICK,
                Some(_) if period.is_zero() => period = TICK,
                _ => {}
            }
        }
        if self.tick.replace(period) != period {
            let _ = hostcalls::set_tick_period(period);
        }
    }
}

impl Context for Root {
    fn on_http_call_response(&mut self, _token_id: u32, _num_headers: usize, _body_size: usize, _num_trailers: usize) {
        // the answer to a store
        let Some(shared) = &self.shared else { return };
        let status = hostcalls::get_map_value(MapType::HttpCallResponseHeaders, ":status").ok().flatten();
        shared.metrics.stored(status.as_deref());
    }
}

impl RootContext for Root {
    fn on_configure(&mut self, _plugin_configuration_size: usize) -> bool {
        let json = self.get_plugin_configuration().unwrap_or_default();
        let settings = match Config::from_json(&json).and_then(|s| s.check_buffer_limit().map(|()| s)) {
            Ok(settings) => settings,
            Err(e) => {
                log::error!("invalid plugin configuration: {e}");
                return false;
            }
        };
        let metrics = match Metrics::define() {
            Ok(metrics) => metrics,
            Err(status) => {
                log::error!("cannot define metrics: {status:?}");
                return false;
            }
        };
        let hot_bytes = settings.cache.as_ref().filter(|c| c.enabled).map_or(0, |c| c.hot_bytes as usize);
        self.shared = Some(Rc::new(Shared {
            hot: (hot_bytes > 0).then(|| WorkerHot(RefCell::new(vec![0; hot_bytes]))),
            settings: Arc::new(settings),
            metrics,
            waiting: Default::default(),
            tick: Cell::new(Duration::ZERO),
            stores: Default::default(),
        }));
        true
    }

    fn on_tick(&mut self) {
        let Some(shared) = &self.shared else { return };
        for store in shared.stores.take() {
            if cache::dispatch(&store, proxy::store_timeout()).is_none() {
                shared.metrics.stored(None);
            }
        }
        let now = now_ms();
        let due: Vec<_> = shared
            .waiting
            .borrow()
            .values()
            .filter_map(Weak::upgrade)
            .filter(|stream| stream.borrow().due().is_some_and(|at| at <= now))
            .collect();
        for stream in due {
            stream.borrow_mut().tick(now);
        }
        let mut waiting = shared.waiting.borrow_mut();
        waiting.retain(|_, stream| stream.upgrade().is_some_and(|s| s.borrow().due().is_some()));
        shared.set_tick(&waiting);
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        let shared = Rc::clone(self.shared.as_ref()?);
        let exchange = Exchange::new(Arc::clone(&shared.settings));
        let stream = Rc::new(RefCell::new(Stream::new(context_id, exchange, shared)));
        Some(Box::new(Filter { stream, cache: None, body_wanted: false }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

struct Filter {
    stream: Rc<RefCell<Stream>>,
    /// This request's way through the cache, when the cache is on.
    cache: Option<CacheRequest>,
    /// The core waits for the request body (to transcode).
    body_wanted: bool,
}

impl Filter {
    /// Runs one callback, then lets the root know whether this exchange now needs ticks.
    fn with_stream(&self, f: impl FnOnce(&mut Stream) -> Action) -> Action {
        let mut stream = self.stream.borrow_mut();
        let action = f(&mut stream);
        let shared = Rc::clone(&stream.shared);
        let due = stream.due();
        let mut waiting = shared.waiting.borrow_mut();
        let was_waiting = if due.is_some() {
            waiting.insert(stream.id, Rc::downgrade(&self.stream)).is_some()
        } else {
            waiting.remove(&stream.id).is_some()
        };
        drop(stream);
        if was_waiting != due.is_some() || due == Some(0) {
            shared.set_tick(&waiting);
        }
        action
    }

    fn shared(&self) -> Rc<Shared> {
        Rc::clone(&self.stream.borrow().shared)
    }

    /// Asks the node for SSZ where the core says so (`Exchange::upstream_accept`), without
    /// Accept-Encoding: an encoded answer could not be rendered.
    fn ask_upstream(&self, accept: Option<&CStr>) {
        if let Some(accept) = accept.and_then(|accept| accept.to_str().ok()) {
            self.set_http_request_header("accept", Some(accept));
            self.set_http_request_header("accept-encoding", None);
        }
    }

    /// The node's body so far: the part of Envoy's body buffer after the output this filter
    /// still holds there (see `Stream::on_body`).
    fn hold_for_cache(&mut self, body_size: usize) {
        let Some(cache) = self.cache.as_mut().filter(|c| c.holds()) else { return };
        let held = self.stream.borrow().held;
        if body_size > held {
            let chunk = hostcalls::get_buffer(BufferType::HttpResponseBody, held, body_size - held);
            cache.hold(&chunk.ok().flatten().unwrap_or_default());
        }
    }

    /// Answers the request with a hit: the filter's own reply, with nothing to compress or count
    /// as an exchange. False when Envoy refused the reply: the request goes on to the node.
    fn answer_hit(&mut self, hit: &HitResponse) -> bool {
        let shared = self.shared();
        let status_header = shared.settings.cache.as_ref().is_some_and(|c| c.status_header);
        shared.metrics.add(Counter::CacheResponses(CacheStatus::Hit), 1);
        self.stream.borrow_mut().done = true;
        cache::send_hit(hit, status_header)
    }

    /// The node's answer has ended: its store goes to the root.
    fn store_in_cache(&mut self) {
        let shared = self.shared();
        let (Some(cache), Some(config)) = (self.cache.as_mut(), shared.settings.cache.as_ref()) else { return };
        match cache.store(config) {
            Ok(Some(store)) => {
                shared.stores.borrow_mut().push(store);
                shared.set_tick(&shared.waiting.borrow());
            }
            Ok(None) => {}
            Err(refusal) => metrics::store_refused(refusal).into_iter().for_each(|c| shared.metrics.add(c, 1)),
        }
    }
}

impl Context for Filter {
    fn on_http_call_response(&mut self, token_id: u32, _num_headers: usize, body_size: usize, _num_trailers: usize) {
        let shared = self.shared();
        let Some(cache) = self.cache.as_mut() else { return };
        let hot = shared.hot.as_ref();
        match cache.on_lookup_answer(token_id, body_size, shared.settings.min_length, hot, now_ms() / 1000) {
            Some(hit) if self.answer_hit(&hit) => {}
            _ => {
                let _ = hostcalls::resume_http_request();
            }
        }
    }

    fn on_done(&mut self) -> bool {
        // The stream ended (a client or upstream reset, a local reply) with the exchange unfinished.
        let mut stream = self.stream.borrow_mut();
        if !stream.done {
            stream.done = true;
            stream.shared.metrics.aborted();
        }
        true
    }
}

impl HttpContext for Filter {
    fn on_http_request_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        let headers = self.get_http_request_headers_bytes();
        let shared = self.shared();
        let exchange = &mut self.stream.borrow_mut().exchange;
        for (name, value) in &headers {
            if name == ":method" {
                exchange.request_method(value);
            } else if name == ":path" {
                exchange.request_path(value);
            } else {
                exchange.request_header(name.as_bytes(), value);
            }
        }
        self.body_wanted = exchange.wants_request_body() && !end_of_stream;
        // Asking the node for SSZ may wait for the body's method: the headers wait with it.
        let ask_after_body = self.body_wanted && shared.settings.transcode_upstream_ssz;
        if !self.body_wanted {
            let accept = exchange.upstream_accept();
            self.ask_upstream(accept);
        }
        let cache = shared.settings.cache.as_ref().filter(|c| c.enabled).map(|config| {
            self.cache.insert(CacheRequest::new(config, &headers, end_of_stream)).awaits_body()
        });
        if ask_after_body || cache == Some(true) {
            Action::Pause
        } else {
            Action::Continue
        }
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if self.body_wanted && Exchange::takes_request_body(body_size) {
            if !end_of_stream {
                // Envoy holds it until it is whole
                return Action::Pause;
            }
            let body = hostcalls::get_buffer(BufferType::HttpRequestBody, 0, body_size).ok().flatten();
            let exchange = &mut self.stream.borrow_mut().exchange;
            exchange.request_body(&body.unwrap_or_default());
            let accept = exchange.upstream_accept();
            self.ask_upstream(accept);
        }
        self.body_wanted = false;
        let shared = self.shared();
        let (Some(cache), Some(config)) = (self.cache.as_mut(), shared.settings.cache.as_ref()) else {
            return Action::Continue;
        };
        let (hot, min_length) = (shared.hot.as_ref(), shared.settings.min_length);
        match cache.on_body(body_size, end_of_stream, config, hot, min_length, now_ms() / 1000) {
            AfterBody::Continue => Action::Continue,
            AfterBody::Wait => Action::Pause,
            AfterBody::Answer(hit) if self.answer_hit(&hit) => Action::Pause,
            AfterBody::Answer(_) => Action::Continue,
        }
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        if self.cache.as_ref().is_some_and(CacheRequest::is_hit) {
            return Action::Continue;
        }
        let headers = self.get_http_response_headers_bytes();
        let shared = self.shared();
        if let Some(cache) = self.cache.as_mut() {
            let status = cache.on_response_head(&headers, end_of_stream);
            metrics::cache_responded(status, cache.bypass()).for_each(|counter| shared.metrics.add(counter, 1));
            if shared.settings.cache.as_ref().is_some_and(|c| c.status_header) {
                let _ = hostcalls::add_map_value(MapType::HttpResponseHeaders, proxy::status_header(), status.as_str());
            }
            if end_of_stream {
                self.store_in_cache();
            }
        }
        self.with_stream(|stream| stream.on_headers(&headers, end_of_stream))
    }

    fn on_http_response_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        self.hold_for_cache(body_size);
        let action = self.with_stream(|stream| stream.on_body(body_size, end_of_stream));
        if end_of_stream {
            self.store_in_cache();
        }
        action
    }

    fn on_http_response_trailers(&mut self, _num_trailers: usize) -> Action {
        self.store_in_cache();
        self.with_stream(|stream| stream.on_trailers())
    }
}

/// One exchange, and where Envoy stands with it.
struct Stream {
    id: u32,
    exchange: Exchange,
    shared: Rc<Shared>,
    /// Nothing more to feed: the core passed the body, finished it or failed.
    done: bool,
    /// Envoy's filter iteration is stopped at this filter: only then may it be resumed.
    stopped: bool,
    /// Envoy holds a response body for this filter (the last body callback paused): a tick may
    /// write into it, and Envoy adds each new read to it, even after a resume.
    buffering: bool,
    /// Output at the front of the body Envoy holds, not yet sent (0 unless `buffering`).
    held: usize,
    /// The core's output for the last feed.
    out: Vec<u8>,
    compress_ns: u64,
}

impl Stream {
    fn new(id: u32, exchange: Exchange, shared: Rc<Shared>) -> Self {
        Stream {
            id,
            exchange,
            shared,
            done: false,
            stopped: false,
            buffering: false,
            held: 0,
            out: Vec::new(),
            compress_ns: 0,
        }
    }

    fn on_headers(&mut self, headers: &[(String, Vec<u8>)], end_of_stream: bool) -> Action {
        let mut status = 0;
        for (name, value) in headers {
            if name == ":status" {
                status = std::str::from_utf8(value).ok().and_then(|s| s.parse().ok()).unwrap_or(0);
            } else {
                self.exchange.response_header(name.as_bytes(), value);
            }
        }
        if end_of_stream {
            // Envoy says no body follows: the core sees an empty one.
            self.exchange.response_content_length(Some(0));
        }
        match self.exchange.response_head(status) {
            BodyPlan::Pass => {
                apply_edits(self.exchange.edits());
                self.finish();
                Action::Continue
            }
            BodyPlan::Stream => {
                apply_edits(self.exchange.edits());
                Action::Continue
            }
            BodyPlan::Buffer if end_of_stream => {
                // An empty body: the core only settles the headers.
                self.feed(&[], true);
                Action::Continue
            }
            BodyPlan::Buffer => {
                self.stopped = true;
                Action::Pause
            }
        }
    }

    fn on_body(&mut self, body_size: usize, end: bool) -> Action {
        if self.done {
            return Action::Continue;
        }
        // While Envoy holds a body for this filter, it adds each read to it: our unsent output
        // comes first, then the new data. Envoy replaces a body only from its start.
        let held = self.held;
        let body =
            hostcalls::get_buffer(BufferType::HttpResponseBody, 0, body_size).ok().flatten().unwrap_or_default();
        let (unsent, chunk) = body.split_at(held.min(body.len()));
        if !self.feed(chunk, end) {
            return Action::Pause;
        }
        if !chunk.is_empty() || !self.out.is_empty() {
            let _ = hostcalls::set_buffer(BufferType::HttpResponseBody, 0, body_size, &[unsent, &self.out].concat());
        }
        self.held = held + self.out.len();
        if end && (self.stopped || !self.buffering || self.held == 0) {
            // Envoy passes this data on, or continues with the body it holds, and the body ends.
            return self.proceed();
        }
        if self.stopped && self.buffering && self.held > 0 {
            // Send the held body now and stay paused, so that a tick can still write into it.
            self.resume();
        }
        // Output still held (Envoy iterates here, or held this callback's data) goes at the next
        // tick: Envoy may be resumed only where it stopped, never from a callback while it iterates.
        self.stopped = true;
        self.buffering = true;
        Action::Pause
    }

    /// Response trailers: the body has ended.
    fn on_trailers(&mut self) -> Action {
        if self.done {
            return Action::Continue;
        }
        if !self.feed(&[], true) {
            return Action::Pause;
        }
        if !self.out.is_empty() {
            if !self.buffering {
                // Only a response with no body callback at all gets here, and the core has
                // nothing to add to an empty body; failing beats a truncated one all the same.
                let failure = self.exchange.abort();
                self.fail("the body ended in trailers, with no body held to end", failure);
                return Action::Pause;
            }
            self.append_output();
        }
        if self.stopped || self.held == 0 {
            // Envoy continues with the body it holds, then the trailers.
            return self.proceed();
        }
        // Envoy iterates here since a tick resumed it: stop, and the next tick sends the rest.
        self.stopped = true;
        Action::Pause
    }

    /// Lets Envoy go on with everything this filter holds, for good.
    fn proceed(&mut self) -> Action {
        self.stopped = false;
        self.buffering = false;
        self.held = 0;
        Action::Continue
    }

    /// Adds the core's output behind the unsent output in the body Envoy holds.
    fn append_output(&mut self) {
        if !self.out.is_empty() {
            let _ = hostcalls::set_buffer(BufferType::HttpResponseBody, self.held, 0, &self.out);
            self.held += self.out.len();
        }
    }

    /// Resumes Envoy where it stopped at this filter: it sends the body it holds.
    fn resume(&mut self) {
        let _ = hostcalls::resume_http_response();
        self.stopped = false;
        self.held = 0;
    }

    /// When this exchange wants a tick: at once for output Envoy holds, else at the core's
    /// deadline, if a tick can act then (Envoy's body can be written only while it holds one for
    /// this filter, and resumed only where it stopped).
    fn due(&self) -> Option<u64> {
        if !(self.stopped && self.buffering) {
            None
        } else if self.held > 0 {
            Some(0)
        } else if self.done {
            None
        } else {
            self.exchange.deadline()
        }
    }

    fn tick(&mut self, now: u64) {
        if hostcalls::set_effective_context(self.id).is_err() {
            return;
        }
        if !self.done && self.exchange.deadline().is_some_and(|at| at <= now) {
            if !self.feed(&[], false) {
                return;
            }
            self.append_output();
        }
        if self.held > 0 {
            self.resume();
        }
    }

    /// Feeds the core, applies the headers it releases and keeps its bytes in `out`; false when
    /// the exchange failed (and the response is being reset).
    fn feed(&mut self, chunk: &[u8], end: bool) -> bool {
        let started = Instant::now();
        // Envoy has no notion of an upstream flush: every chunk is fed as unflushed.
        match self.exchange.feed(chunk, end, false, now_ms()) {
            Ok(out) => {
                if let Some(edits) = out.headers {
                    apply_edits(edits);
                }
                self.out.clear();
                self.out.extend_from_slice(out.data);
                self.compress_ns += started.elapsed().as_nanos() as u64;
                if out.end {
                    self.finish();
                }
                true
            }
            Err(e) => {
                self.fail(&e.to_string(), self.exchange.failure());
                false
            }
        }
    }

    /// Does what the core says a failure calls for.
    fn fail(&mut self, why: &str, failure: Failure) {
        match failure {
            Failure::Respond(status) => {
                log::warn!("answering {status}: {why}");
                let _ = hostcalls::send_http_response(u32::from(status), vec![], None);
            }
            Failure::Reset => {
                log::warn!("resetting the response: {why}");
                let _ = hostcalls::reset_http_response();
            }
        }
        self.finish_as(Mode::Failed);
    }

    fn finish(&mut self) {
        self.finish_as(self.exchange.mode());
    }

    /// The exchange is over: count it once.
    fn finish_as(&mut self, mode: Mode) {
        if self.done {
            return;
        }
        self.done = true;
        let outcome = self.exchange.transcode_outcome();
        self.shared.metrics.record(mode, self.exchange.counts(), self.compress_ns / 1000, outcome);
        if let Some(why) = self.exchange.transcode_refusal() {
            log::warn!("not transcoded, sent as it came: {why}");
        }
    }
}

fn apply_edits(edits: &HeaderEdits) {
    let headers = MapType::HttpResponseHeaders;
    for op in edits.operations() {
        let _ = match op {
            HeaderOp::Set(name, value) => hostcalls::set_map_value_bytes(headers, name, Some(&value)),
            HeaderOp::Append(name, value) => hostcalls::add_map_value(headers, name, value),
            HeaderOp::Remove(name) => hostcalls::remove_map_value(headers, name),
        };
    }
}

/// The filter's counters (`rpcedge_core::metrics`), under Envoy's `wasmcustom.` prefix.
struct Metrics {
    /// Metric ids by `Counter::index`.
    counters: Vec<u32>,
    /// Each exchange's compression time, in microseconds.
    compress_duration: u32,
}

impl Metrics {
    fn define() -> Result<Self, proxy_wasm::types::Status> {
        let define = |kind, name: &str| hostcalls::define_metric(kind, &format!("rpcedge.{name}"));
        Ok(Metrics {
            counters: Counter::all().map(|c| define(MetricType::Counter, &c.name())).collect::<Result<_, _>>()?,
            compress_duration: define(MetricType::Histogram, metrics::compress_duration_name())?,
        })
    }

    fn add(&self, counter: Counter, amount: u64) {
        let _ = hostcalls::increment_metric(self.counters[counter.index()], amount as i64);
    }

    fn aborted(&self) {
        self.add(Counter::Aborted, 1);
    }

    /// The daemon's answer to a store: its status (none: no answer).
    fn stored(&self, status: Option<&str>) {
        self.add(Counter::for_store_answer(status.and_then(|s| s.parse().ok())), 1);
    }

    fn record(&self, mode: Mode, counts: (u64, u64), compress_us: u64, transcode: TranscodeOutcome) {
        let (amounts, duration) = metrics::exchange_ended(mode, counts, compress_us, transcode);
        for (counter, amount) in amounts {
            self.add(counter, amount);
        }
        if let Some(us) = duration {
            let _ = hostcalls::record_metric(self.compress_duration, us);
        }
    }
}

/// The core's clock, in milliseconds: monotonic (WASI's, which Envoy serves from its own
/// monotonic time source), so that a step of the wall clock never holds data back.
fn now_ms() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_millis() as u64
}

#[cfg(test)]
mod tests;
