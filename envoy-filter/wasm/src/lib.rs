//! rpcedge as an Envoy HTTP filter (proxy-wasm). It only moves headers and body bytes between
//! Envoy's callbacks and the core's `ProxyExchange`, which makes every decision.
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
//! A head held for its body (the response's, for its exact length; the request's, for the cache's
//! key) gets that body only where Envoy passes it to a Wasm filter that holds the head (the
//! plugin's `allow_on_headers_stop_iteration`). The core bounds such a hold until one of the
//! configuration's exchanges has seen a body come (`HeldHeads`), and the root's tick lets a head
//! go at its bound.
//!
//! With a `cache` section, requests go through the response cache first (`cache`).

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};
use std::rc::{Rc, Weak};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, BufferType, ContextType, LogLevel, MapType, MetricType};
use rpcedge_core::metrics::{self, Counter};
use rpcedge_core::cache::HotRegion;
use rpcedge_core::proxy::cache::DaemonCall;
use rpcedge_core::proxy::drive::{self, HeadStep, Step};
use rpcedge_core::proxy::{HeldHeads, ProxyExchange};
use rpcedge_core::{Config, HeaderOp, Node, Settings};

mod cache;
use cache::WorkerHot;

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
    /// What this configuration's exchanges learn about the node.
    node: Arc<Node>,
    metrics: Metrics,
    /// Exchanges that need a tick, by context id, with when (see `Stream::due`). The root's
    /// tick period is made from these deadlines alone, never by borrowing a stream: a stream is
    /// borrowed while it is served, and it may be waiting itself.
    waiting: RefCell<HashMap<u32, Waiting>>,
    /// The root's tick period now (zero: no ticks).
    tick: Cell<Duration>,
    /// Stores (and releases of held keys) for the root to make at its next tick.
    stores: RefCell<Vec<DaemonCall>>,
    /// The releases under way, whose answers are not counted as stores'.
    releases: RefCell<HashSet<u32>>,
    /// The worker's hot tier, when the cache has one.
    hot: Option<WorkerHot>,
    /// Whether Envoy passes the body to a held head (the plugin's
    /// `allow_on_headers_stop_iteration`), as this configuration's exchanges learn it.
    held_heads: Arc<HeldHeads>,
}

/// An exchange that needs a tick.
struct Waiting {
    stream: Weak<RefCell<Stream>>,
    /// When (`Stream::due`): 0 at once.
    due: u64,
}

impl Shared {
    /// Notes when the exchange `id` next needs a tick (`None`: never), then ticks as often as the
    /// most pressing waiting exchange needs. Called with no stream borrowed.
    fn note_due(&self, id: u32, stream: &Rc<RefCell<Stream>>, due: Option<u64>) {
        if self.note(id, stream, due) || due == Some(0) || !self.stores.borrow().is_empty() {
            self.set_tick();
        }
    }

    /// Notes when the exchange `id` next needs a tick: whether that changed the table.
    fn note(&self, id: u32, stream: &Rc<RefCell<Stream>>, due: Option<u64>) -> bool {
        let mut waiting = self.waiting.borrow_mut();
        match due {
            Some(due) => waiting.insert(id, Waiting { stream: Rc::downgrade(stream), due }).map_or(true, |was| was.due != due),
            None => waiting.remove(&id).is_some(),
        }
    }

    /// Ticks as often as the most pressing waiting exchange needs, or the queued stores.
    fn set_tick(&self) {
        let mut period = if self.stores.borrow().is_empty() { Duration::ZERO } else { SEND_TICK };
        for waiting in self.waiting.borrow().values() {
            match waiting.due {
                0 => period = SEND_TICK,
                _ if period.is_zero() => period = TICK,
                _ => {}
            }
        }
        if self.tick.replace(period) != period {
            let _ = hostcalls::set_tick_period(period);
        }
    }

    fn hot(&self) -> Option<&dyn HotRegion> {
        self.hot.as_ref().map(|hot| hot as &dyn HotRegion)
    }
}

impl Context for Root {
    fn on_http_call_response(&mut self, token_id: u32, _num_headers: usize, _body_size: usize, _num_trailers: usize) {
        // the answer to a store, or to a release
        let Some(shared) = &self.shared else { return };
        if shared.releases.borrow_mut().remove(&token_id) {
            return;
        }
        let status = hostcalls::get_map_value(MapType::HttpCallResponseHeaders, ":status").ok().flatten();
        shared.metrics.stored(status.as_deref());
    }
}

impl RootContext for Root {
    fn on_configure(&mut self, _plugin_configuration_size: usize) -> bool {
        let json = self.get_plugin_configuration().unwrap_or_default();
        let settings = match Config::from_json_over(&json, Config::wasm_defaults()).and_then(|s| s.check_buffer_limit().map(|()| s)) {
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
            node: Arc::default(),
            metrics,
            waiting: Default::default(),
            tick: Cell::new(Duration::ZERO),
            stores: Default::default(),
            releases: Default::default(),
            held_heads: Arc::default(),
        }));
        true
    }

    fn on_tick(&mut self) {
        let Some(shared) = &self.shared else { return };
        // stores are queued only where the cache is configured
        if shared.settings.cache.is_some() {
            for call in shared.stores.take() {
                match cache::dispatch(&call) {
                    Some(token) if !call.store => _ = shared.releases.borrow_mut().insert(token),
                    Some(_) => {}
                    None if call.store => shared.metrics.stored(None),
                    None => {}
                }
            }
        }
        let now = now_ms();
        let mut due = Vec::new();
        shared.waiting.borrow_mut().retain(|&id, waiting| match waiting.stream.upgrade() {
            Some(stream) => {
                if waiting.due <= now {
                    due.push((id, stream));
                }
                true
            }
            None => false,
        });
        for (id, stream) in due {
            // one stream borrowed at a time, and none while the root's state is updated
            let next = {
                let mut borrowed = stream.borrow_mut();
                borrowed.tick(now);
                borrowed.account();
                borrowed.due()
            };
            shared.note(id, &stream, next);
        }
        // once for all the streams this tick served
        shared.set_tick();
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        let shared = Rc::clone(self.shared.as_ref()?);
        let exchange = ProxyExchange::new(Arc::clone(&shared.settings), Arc::clone(&shared.node), clock)
            .bounding_held_heads(Arc::clone(&shared.held_heads));
        let stream = Rc::new(RefCell::new(Stream::new(context_id, exchange, shared)));
        Some(Box::new(Filter { stream, lookup: None, request_body_size: 0 }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

struct Filter {
    stream: Rc<RefCell<Stream>>,
    /// The cache lookup this request waits for.
    lookup: Option<u64>,
    /// The request body Envoy holds while it waits.
    request_body_size: usize,
}

impl Filter {
    /// Where the request stands after a step: `Pause` while it waits (for more body, or for the
    /// lookup noted here) or has been answered.
    fn waits(&mut self, step: Step) -> Action {
        match step {
            Step::Continue => return Action::Continue,
            Step::Lookup(token) => self.lookup = Some(token),
            Step::Wait | Step::Replied => {}
        }
        Action::Pause
    }

    /// Runs one callback, then lets the root know whether this exchange now needs ticks.
    fn with_stream(&self, f: impl FnOnce(&mut Stream) -> Action) -> Action {
        let (action, id, shared, due) = {
            let mut stream = self.stream.borrow_mut();
            let action = f(&mut stream);
            stream.account();
            (action, stream.id, Rc::clone(&stream.shared), stream.due())
        };
        shared.note_due(id, &self.stream, due);
        action
    }
}

impl Context for Filter {
    fn on_http_call_response(&mut self, token_id: u32, _num_headers: usize, body_size: usize, _num_trailers: usize) {
        if self.lookup.take() != Some(u64::from(token_id)) {
            return;
        }
        let headers = hostcalls::get_map_bytes(MapType::HttpCallResponseHeaders).unwrap_or_default();
        let body = if body_size > 0 {
            hostcalls::get_buffer(BufferType::HttpCallResponseBody, 0, body_size).ok().flatten().unwrap_or_default()
        } else {
            Vec::new()
        };
        let request_body_size = self.request_body_size;
        let mut step = Step::Continue;
        self.with_stream(|stream| {
            let hook = &mut Hook::new(&stream.shared, request_body_size);
            step = drive::lookup_answer(&mut stream.exchange, hook, &headers, &body, stream.shared.hot());
            if step == Step::Continue {
                let _ = hostcalls::resume_http_request();
            }
            Action::Continue
        });
        self.waits(step);
    }

    fn on_done(&mut self) -> bool {
        // The stream ended (a client or upstream reset, a local reply).
        self.with_stream(|stream| {
            stream.exchange.on_stream_complete();
            Action::Continue
        });
        true
    }
}

impl HttpContext for Filter {
    fn on_http_request_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        let headers = self.get_http_request_headers_bytes();
        #[cfg(feature = "test-panic")]
        if headers.iter().any(|(name, _)| name == "x-rpcedge-test-panic") {
            panic!("x-rpcedge-test-panic");
        }
        let mut step = Step::Continue;
        self.with_stream(|stream| {
            let (hook, hot) = (&mut Hook::new(&stream.shared, 0), stream.shared.hot());
            step = drive::request_headers(&mut stream.exchange, hook, &headers, end_of_stream, cache::route_namespace, hot);
            Action::Continue
        });
        self.waits(step)
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if !self.stream.borrow().exchange.reads_request_body() {
            return Action::Continue;
        }
        let body = || hostcalls::get_buffer(BufferType::HttpRequestBody, 0, body_size).ok().flatten().unwrap_or_default();
        let mut step = Step::Continue;
        self.with_stream(|stream| {
            let (hook, hot) = (&mut Hook::new(&stream.shared, body_size), stream.shared.hot());
            step = drive::request_body(&mut stream.exchange, hook, body_size, end_of_stream, body, hot);
            Action::Continue
        });
        // the body Envoy buffers while a lookup runs
        self.request_body_size = body_size;
        self.waits(step)
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        if self.stream.borrow().exchange.replied() {
            // the cache's own reply
            return Action::Continue;
        }
        let headers = self.get_http_response_headers_bytes();
        self.with_stream(|stream| stream.on_headers(&headers, end_of_stream))
    }

    fn on_http_response_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        self.with_stream(|stream| stream.on_body(body_size, end_of_stream))
    }

    fn on_http_response_trailers(&mut self, _num_trailers: usize) -> Action {
        self.with_stream(|stream| stream.on_trailers())
    }
}

/// One exchange, and where Envoy stands with it.
struct Stream {
    id: u32,
    exchange: ProxyExchange,
    shared: Rc<Shared>,
    /// Envoy's filter iteration is stopped at this filter: only then may it be resumed.
    stopped: bool,
    /// Envoy holds a response body for this filter (the last body callback paused): a tick may
    /// write into it, and Envoy adds each new read to it, even after a resume.
    buffering: bool,
    /// Output at the front of the body Envoy holds, not yet sent (0 unless `buffering`).
    held: usize,
}

impl Stream {
    fn new(id: u32, exchange: ProxyExchange, shared: Rc<Shared>) -> Self {
        Stream { id, exchange, shared, stopped: false, buffering: false, held: 0 }
    }

    fn on_headers(&mut self, headers: &[(String, Vec<u8>)], end_of_stream: bool) -> Action {
        let step = drive::response_headers(&mut self.exchange, &mut Hook::new(&self.shared, 0), headers, end_of_stream);
        self.stopped = step == HeadStep::Hold;
        match step {
            HeadStep::Continue => Action::Continue,
            HeadStep::Hold | HeadStep::Failed => Action::Pause,
        }
    }

    fn on_body(&mut self, body_size: usize, end: bool) -> Action {
        let passed = self.exchange.is_done();
        // While Envoy holds a body for this filter, it adds each read to it: our unsent output
        // comes first, then the new data. Envoy replaces a body only from its start.
        let held = self.held;
        let body = if self.exchange.reads_body() {
            hostcalls::get_buffer(BufferType::HttpResponseBody, 0, body_size).ok().flatten().unwrap_or_default()
        } else {
            Vec::new()
        };
        let (unsent, chunk) = body.split_at(held.min(body.len()));
        if !self.feed(chunk, end) {
            return Action::Pause;
        }
        if passed {
            return Action::Continue;
        }
        let out = self.exchange.output();
        if !chunk.is_empty() || !out.is_empty() {
            let _ = hostcalls::set_buffer(BufferType::HttpResponseBody, 0, body_size, &[unsent, out].concat());
        }
        self.held = held + out.len();
        // the rest of a body that the core gives piece by piece
        self.exchange.clear_output();
        if !self.append_output() {
            return Action::Pause;
        }
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
        let passed = self.exchange.is_done();
        if !self.feed(&[], true) {
            return Action::Pause;
        }
        if passed {
            return Action::Continue;
        }
        if !self.exchange.output().is_empty() {
            if !self.buffering {
                // Only a response with no body callback at all gets here, and the core has
                // nothing to add to an empty body; failing beats a truncated one all the same.
                let failed = self.exchange.abort("the body ended in trailers, with no body held to end");
                drive::fail(&mut Hook::new(&self.shared, 0), failed);
                return Action::Pause;
            }
            if !self.append_output() {
                return Action::Pause;
            }
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

    /// Adds the core's output behind the unsent output in the body Envoy holds, piece by piece
    /// where the core gives it so; false when the exchange failed.
    fn append_output(&mut self) -> bool {
        let held = &mut self.held;
        drive::write_output(&mut self.exchange, &mut Hook::new(&self.shared, 0), |piece| {
            let _ = hostcalls::set_buffer(BufferType::HttpResponseBody, *held, 0, piece);
            *held += piece.len();
        })
    }

    /// Resumes Envoy where it stopped at this filter: it sends the body it holds.
    fn resume(&mut self) {
        let _ = hostcalls::resume_http_response();
        self.stopped = false;
        self.held = 0;
    }

    /// When this exchange wants a tick: at once for output Envoy holds, else at the core's
    /// deadline, if a tick can act then (Envoy's body can be written only while it holds one for
    /// this filter, and resumed only where it stopped); a held head, at its deadline.
    fn due(&self) -> Option<u64> {
        if !(self.stopped && self.buffering) {
            self.exchange.head_deadline()
        } else if self.held > 0 {
            Some(0)
        } else {
            self.exchange.deadline()
        }
    }

    fn tick(&mut self, now: u64) {
        if hostcalls::set_effective_context(self.id).is_err() {
            return;
        }
        // A head held for a body that Envoy may be withholding from this filter goes on without it.
        if self.exchange.let_request_go() {
            let _ = hostcalls::resume_http_request();
            return;
        }
        if self.exchange.let_response_go() {
            self.resume();
            return;
        }
        let due = self.exchange.deadline().is_some_and(|at| at <= now);
        if due && (!self.feed(&[], false) || !self.append_output()) {
            return;
        }
        self.account();
        if self.held > 0 {
            self.resume();
        }
    }

    /// Feeds the core (its output for this feed only) and applies the headers it releases; false
    /// when the exchange failed (and the response is being answered or reset).
    fn feed(&mut self, chunk: &[u8], end: bool) -> bool {
        self.exchange.clear_output();
        // Envoy has no notion of an upstream flush: every chunk is fed as unflushed.
        drive::feed(&mut self.exchange, &mut Hook::new(&self.shared, 0), chunk, end, false).is_some()
    }

    /// Adds what the exchange counted to the worker's stats, and hands its stores to the root.
    fn account(&mut self) {
        drive::account(&mut self.exchange, &mut Hook::new(&self.shared, 0));
    }
}

/// A callback of this filter's, as the core's steps call into Envoy.
struct Hook<'a> {
    shared: &'a Shared,
    /// The request body Envoy holds in this callback.
    request_body_size: usize,
}

impl<'a> Hook<'a> {
    fn new(shared: &'a Shared, request_body_size: usize) -> Self {
        Hook { shared, request_body_size }
    }
}

impl drive::Host for Hook<'_> {
    fn set_request_header(&mut self, name: &str, value: Option<&[u8]>) {
        let _ = hostcalls::set_map_value_bytes(MapType::HttpRequestHeaders, name, value);
    }

    fn replace_request_body(&mut self, body: &[u8]) {
        let _ = hostcalls::set_buffer(BufferType::HttpRequestBody, 0, self.request_body_size, body);
    }

    fn edit_response_header(&mut self, op: HeaderOp<'_>) {
        let headers = MapType::HttpResponseHeaders;
        let _ = match op {
            HeaderOp::Set(name, value) => hostcalls::set_map_value_bytes(headers, name, Some(&value)),
            HeaderOp::Append(name, value) => hostcalls::add_map_value(headers, name, value),
            HeaderOp::Remove(name) => hostcalls::remove_map_value(headers, name),
        };
    }

    fn call_daemon(&mut self, call: &DaemonCall) -> Option<u64> {
        cache::dispatch(call).map(u64::from)
    }

    /// Envoy sets the reply's Content-Length.
    fn send_reply(&mut self, status: u16, headers: &[(&str, &str)], body: &[u8]) -> bool {
        hostcalls::send_http_response(u32::from(status), headers.to_vec(), Some(body)).is_ok()
    }

    fn reset(&mut self) {
        let _ = hostcalls::reset_http_response();
    }

    fn count(&mut self, counter: Counter, amount: u64) {
        self.shared.metrics.add(counter, amount);
    }

    fn record_compress_us(&mut self, us: u64) {
        let _ = hostcalls::record_metric(self.shared.metrics.compress_duration, us);
    }

    /// The root's tick makes it (`Shared::note_due` sets it going).
    fn queue_store(&mut self, call: DaemonCall) {
        self.shared.stores.borrow_mut().push(call);
    }

    fn warn(&mut self, line: &str) {
        log::warn!("{line}");
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

    /// The daemon's answer to a store: its status (none: no answer).
    fn stored(&self, status: Option<&str>) {
        self.add(Counter::for_store_answer(status.and_then(|s| s.parse().ok())), 1);
    }
}

/// The filter's clock for the core (`rpcedge_core::proxy::Clock`), in microseconds: monotonic
/// (WASI's, which Envoy serves from its own monotonic time source), so that a step of the wall
/// clock never holds data back.
fn clock() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_micros() as u64
}

/// The core's deadlines are in the clock's milliseconds.
fn now_ms() -> u64 {
    clock() / 1000
}

#[cfg(test)]
mod tests;
