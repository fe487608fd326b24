//! The module against a model of Envoy's side of its streams: the dynamic-modules callbacks it
//! calls, and the rules of Envoy's HTTP filter manager that it depends on. The model checks what
//! Envoy only checks in debug builds (a continue while iterating, a second end of stream, a write
//! into the buffered body by a filter that has not seen the body) and what would lose or
//! duplicate bytes or edit a header that already went out, so a test fails where a release Envoy
//! would pass by luck or lose data quietly. End-to-end behaviour is tested in real Envoy
//! (tests/test_envoy.py); this covers orderings that real traffic rarely hits on cue.
//!
//! Modelled from Envoy's `source/extensions/filters/http/dynamic_modules/filter.cc` and
//! `abi_impl.cc` (at the ABI Envoy 1.40 ships, v0.2.0) and `source/common/http/filter_manager.cc`,
//! with the module the only filter before the router:
//! - a body callback's received body is its chunk, as slices, the last one too (the `filter.cc`
//!   read for this moves a last chunk into the buffered body when there is one; Envoy 1.40's
//!   binary did not, probed with an empty one left by a continue);
//! - appending to a buffered body that does not exist creates it (`addEncodedData`): inside a
//!   trailers callback of a filter that iterates, the bytes go on at once, anywhere else they wait
//!   for the filter to continue;
//! - `Continue` from a stopped filter sends the buffered body, then the chunk; from an iterating
//!   one only the chunk; `StopIterationNoBuffer` drops what is left in the chunk
//!   (`commonHandleAfterDataCallback`);
//! - `continue_encoding` continues a stopped filter only (`in_continue_`, `commonContinue`'s
//!   assertion): the held headers, the buffered body and the trailers that wait go on;
//! - a header set with an empty value is removed; one added with an empty value is not added;
//!   a request header set once the request went out changes the request as Envoy keeps it (what
//!   its access log reads), not the node's;
//! - trailers that a filter before the module adds while the body's last chunk passes it come to
//!   the module's trailers callback only if its body callback continued (`FilterManager::
//!   encodeData`), else they go out with its continue; its body callback sees them;
//! - a local reply ends the stream with its own headers and body (Envoy sets Content-Length),
//!   a reset ends it broken; after either the filter sees no callback but the stream's end;
//! - scheduler commits come from any thread and run on the stream's worker, and never once the
//!   filter is destroyed; the configuration's run on the main thread; a commit after Envoy
//!   deleted the scheduler (a use after free in Envoy) fails the test;
//! - the worker may stall in a callback (preempted) while the module's timer thread goes on;
//! - a callout needs `:path`, `:method` and a host; the test answers it.

use std::cell::RefCell;
use std::collections::{BTreeMap, VecDeque};
use std::ffi::{c_void, CStr};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rpcedge_core::cache::Entry;

use crate::abi::{
    BodyStatus, BodyType, CalloutInit, CalloutResult, ConfigScheduler, EnvoyBuffer, EnvoyHeader, FilterConfigEnvoy,
    FilterEnvoy, HeaderType, HeadersStatus, LogLevel, MetadataSource, MetricsResult, ModuleBuffer, ModuleHeader,
    Scheduler, TrailersStatus, CALLOUT_STARTED, CALLOUT_SUCCESS, METRICS_SUCCESS,
};

type Headers = Vec<(Vec<u8>, Vec<u8>)>;

fn headers(pairs: &[(&str, &str)]) -> Headers {
    pairs.iter().map(|(name, value)| (name.as_bytes().to_vec(), value.as_bytes().to_vec())).collect()
}

fn header<'a>(headers: &'a Headers, name: &str) -> Option<&'a str> {
    let (_, value) = headers.iter().find(|(n, _)| n == name.as_bytes())?;
    std::str::from_utf8(value).ok()
}

/// An Envoy buffer: slices whose bytes stay where they are while the buffer grows.
#[derive(Default)]
struct Buffer(Vec<Vec<u8>>);

impl Buffer {
    fn from_slices(slices: &[&[u8]]) -> Buffer {
        let mut buffer = Buffer::default();
        slices.iter().for_each(|slice| buffer.add(slice));
        buffer
    }

    fn len(&self) -> usize {
        self.0.iter().map(Vec::len).sum()
    }

    fn add(&mut self, data: &[u8]) {
        if !data.is_empty() {
            self.0.push(data.to_vec());
        }
    }

    fn take(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.0).concat()
    }

    fn move_into(&mut self, other: &mut Buffer) {
        other.0.append(&mut self.0);
    }

    /// Drains from the front; what goes is kept in `retired` until the callback returns, as the
    /// module may still hold pointers into it.
    fn drain(&mut self, mut length: usize, retired: &mut Vec<Vec<u8>>) {
        while length > 0 && !self.0.is_empty() {
            let slice = self.0.remove(0);
            if slice.len() > length {
                self.0.insert(0, slice[length..].to_vec());
                length = 0;
            } else {
                length -= slice.len();
            }
            retired.push(slice);
        }
    }

    fn raw(&self) -> Vec<EnvoyBuffer> {
        self.0.iter().map(|slice| EnvoyBuffer { ptr: slice.as_ptr(), length: slice.len() }).collect()
    }
}

/// Which of Envoy's filter callbacks runs (`FilterCallState`), while the module runs.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum CallState {
    DecodeHeaders,
    DecodeData,
    EncodeHeaders,
    EncodeData,
    EncodeTrailers,
    /// A scheduled event or a callout's answer: no filter callback.
    Idle,
    /// `onStreamComplete`, before the access log.
    StreamComplete,
}

/// A filter's scheduler: committed to from any thread (the module's timer thread among them).
/// The model never frees one (`kept`), so that a commit after Envoy deleted it is recorded
/// rather than a use after free in the test process.
#[derive(Default)]
struct SchedulerModel {
    events: Mutex<VecDeque<u64>>,
    deleted: AtomicBool,
    /// Commits after the delete: a use after free in Envoy.
    late_commits: Mutex<Vec<u64>>,
}

impl SchedulerModel {
    fn commit(&self, event: u64) {
        if self.deleted.load(Ordering::SeqCst) {
            self.late_commits.lock().unwrap().push(event);
        } else {
            self.events.lock().unwrap().push_back(event);
        }
    }

    fn take(&self) -> Vec<u64> {
        self.events.lock().unwrap().drain(..).collect()
    }

    /// A new scheduler, kept alive for the process.
    fn kept() -> Arc<SchedulerModel> {
        static KEPT: Mutex<Vec<Arc<SchedulerModel>>> = Mutex::new(Vec::new());
        let scheduler = Arc::new(SchedulerModel::default());
        KEPT.lock().unwrap().push(Arc::clone(&scheduler));
        scheduler
    }

    fn late_commits(&self) -> usize {
        self.late_commits.lock().unwrap().len()
    }
}

/// A call the module made through Envoy's HTTP client.
struct Callout {
    id: u64,
    cluster: String,
    headers: Headers,
    body: Vec<u8>,
}

fn callout(
    id: u64,
    cluster: ModuleBuffer,
    headers: *const ModuleHeader,
    headers_length: usize,
    body: ModuleBuffer,
) -> Result<Callout, CalloutInit> {
    // SAFETY: the module lends these for the call.
    let (cluster, headers, body) = unsafe {
        let headers = raw(headers, headers_length)
            .iter()
            .map(|h| (module_bytes(h.key).to_vec(), module_bytes(h.value).to_vec()))
            .collect::<Headers>();
        (String::from_utf8_lossy(module_bytes(cluster)).into_owned(), headers, module_bytes(body).to_vec())
    };
    // `abi_impl.cc`: without these Envoy refuses the call (MissingRequiredHeaders).
    let host = header(&headers, ":authority").or(header(&headers, "host"));
    if header(&headers, ":path").is_none() || header(&headers, ":method").is_none() || host.is_none() {
        return Err(1);
    }
    Ok(Callout { id, cluster, headers, body })
}

/// Envoy's side of one filter configuration, and its main thread.
#[derive(Default)]
struct ConfigModel {
    /// Metric names by id.
    metrics: RefCell<Vec<String>>,
    counters: RefCell<BTreeMap<String, u64>>,
    histograms: RefCell<BTreeMap<String, Vec<u64>>>,
    scheduler: RefCell<Option<Arc<SchedulerModel>>>,
    /// Every scheduler made for this configuration and its filters.
    schedulers: RefCell<Vec<Arc<SchedulerModel>>>,
    callouts: RefCell<Vec<Callout>>,
    next_callout: RefCell<u64>,
}

impl ConfigModel {
    fn define(&self, name: ModuleBuffer, id: *mut usize) -> MetricsResult {
        let mut metrics = self.metrics.borrow_mut();
        // SAFETY: the module lends the name and the id's place for the call.
        unsafe {
            metrics.push(String::from_utf8_lossy(module_bytes(name)).into_owned());
            *id = metrics.len() - 1;
        }
        METRICS_SUCCESS
    }

    fn add(&self, id: usize, value: u64) {
        let name = self.metrics.borrow()[id].clone();
        *self.counters.borrow_mut().entry(name).or_default() += value;
    }
}

/// What the downstream client got.
#[derive(Default, Debug)]
struct Client {
    headers: Option<Headers>,
    body: Vec<u8>,
    trailers: bool,
    ended: bool,
    reset: bool,
}

/// What the node (the router's upstream) got.
#[derive(Default)]
struct Upstream {
    headers: Option<Headers>,
    body: Vec<u8>,
    ended: bool,
}

/// Envoy's side of one stream: its filter manager's state for the module's filter.
struct StreamState {
    config: Rc<ConfigModel>,
    route_namespace: Option<Vec<u8>>,
    call: Option<CallState>,
    /// `DynamicModuleHttpFilter::in_continue_`: the last callback's status was a `Continue`.
    in_continue: bool,
    sent_local_reply: bool,
    destroyed: bool,

    request_headers: Headers,
    request_received: Option<Buffer>,
    request_buffered: Option<Buffer>,
    request_stopped: bool,
    request_complete: bool,
    upstream: Upstream,
    callouts: Vec<Callout>,
    next_callout: u64,

    response_headers: Headers,
    received: Option<Buffer>,
    buffered: Option<Buffer>,
    /// Iteration is stopped at the filter.
    stopped: bool,
    headers_continued: bool,
    /// The router gave the last of the response (`local_complete_`).
    complete: bool,
    trailers: bool,
    response_trailers: Headers,
    /// The filter was given a body (`latest_data_encoding_filter_` is this filter).
    saw_body: bool,
    client: Client,

    schedulers: Vec<Arc<SchedulerModel>>,
    /// Envoy's worker stalls this long in the module's next drain, as any thread may be
    /// preempted: other threads (the module's timer) go on meanwhile.
    stall_in_drain: Option<Duration>,
    /// Bytes drained or replaced during the callback, kept until it returns.
    retired: Vec<Vec<u8>>,
    /// What Envoy would refuse, assert, or lose; reported when the module's callback returns (a
    /// panic cannot unwind through the callbacks).
    violations: Vec<String>,
}

impl StreamState {
    fn violation(&mut self, what: String) {
        self.violations.push(what);
    }

    fn send_headers(&mut self, end: bool) {
        if self.client.headers.is_some() {
            self.violation("the response headers went out twice".into());
        }
        self.client.headers = Some(self.response_headers.clone());
        if end {
            self.end();
        }
    }

    fn send_data(&mut self, data: Vec<u8>, end: bool) {
        if self.client.headers.is_none() {
            self.violation("body bytes before the response headers".into());
        }
        if self.client.ended && !data.is_empty() {
            self.violation(format!("{} body bytes after the end of the response", data.len()));
        }
        self.client.body.extend_from_slice(&data);
        if end {
            self.end();
        }
    }

    fn send_trailers(&mut self) {
        self.client.trailers = true;
        self.end();
    }

    /// `FilterManager::maybeEndEncode`.
    fn end(&mut self) {
        if self.client.ended {
            self.violation("the response ended twice".into());
        }
        self.client.ended = true;
    }

    /// The stream is over for the filter: no callback but its end comes.
    fn over(&self) -> bool {
        self.client.reset || self.sent_local_reply || self.destroyed
    }

    /// `ActiveStreamFilterBase::commonContinue` for the encoder filter.
    fn continue_encoding(&mut self) {
        if self.client.ended || self.client.reset {
            return;
        }
        if !self.stopped {
            self.violation("continueEncoding() while Envoy iterates at this filter".into());
            return;
        }
        self.stopped = false;
        if !self.headers_continued {
            self.headers_continued = true;
            let end = self.complete && self.buffered.is_none() && !self.trailers;
            self.send_headers(end);
        }
        let had_trailers = self.trailers;
        if let Some(buffered) = &mut self.buffered {
            let data = buffered.take();
            self.send_data(data, self.complete && !had_trailers);
        }
        if had_trailers {
            self.send_trailers();
        }
    }

    /// `commonContinue` for the decoder filter: the request goes on to the node.
    fn continue_decoding(&mut self) {
        if self.client.ended || self.client.reset {
            return;
        }
        if !self.request_stopped {
            self.violation("continueDecoding() while Envoy iterates at this filter".into());
            return;
        }
        self.request_stopped = false;
        if self.upstream.headers.is_none() {
            self.upstream.headers = Some(self.request_headers.clone());
            self.upstream.ended = self.request_complete && self.request_buffered.is_none();
        }
        if let Some(buffered) = &mut self.request_buffered {
            self.upstream.body.extend(buffered.take());
            self.upstream.ended = self.request_complete;
        }
    }

    /// `DynamicModuleHttpFilter::continueEncoding` / `continueDecoding`, from the module.
    fn module_continues(&mut self, encoding: bool) {
        if self.call != Some(CallState::Idle) {
            self.violation("a continue from inside one of the filter's own callbacks".into());
        }
        if self.in_continue {
            // filter.cc ignores it; the module meant something to go on.
            let which = if encoding { "continue_encoding" } else { "continue_decoding" };
            self.violation(format!("{which} after a callback that continued: Envoy ignores it"));
            return;
        }
        self.in_continue = true;
        if encoding {
            self.continue_encoding();
        } else {
            self.continue_decoding();
        }
    }

    fn headers_mut(&mut self, kind: HeaderType) -> &mut Headers {
        // once the response is under way, the request's are for what reads them later
        let responding =
            matches!(self.call, Some(CallState::EncodeHeaders | CallState::EncodeData | CallState::EncodeTrailers))
                || self.call == Some(CallState::StreamComplete);
        let sent = match kind {
            HeaderType::Request => self.upstream.headers.is_some() && !responding,
            HeaderType::Response => self.client.headers.is_some(),
            HeaderType::ResponseTrailer => true,
        };
        if sent {
            let which = if matches!(kind, HeaderType::Request) { "request" } else { "response" };
            self.violation(format!("a {which} header edited after the headers went out"));
        }
        match kind {
            HeaderType::Request => &mut self.request_headers,
            HeaderType::Response => &mut self.response_headers,
            HeaderType::ResponseTrailer => &mut self.response_trailers,
        }
    }

    fn body(&self, kind: BodyType) -> Option<&Buffer> {
        match kind {
            BodyType::ReceivedRequest => self.request_received.as_ref(),
            BodyType::BufferedRequest => self.request_buffered.as_ref(),
            BodyType::ReceivedResponse => self.received.as_ref(),
            BodyType::BufferedResponse => self.buffered.as_ref(),
        }
    }

    /// The body the module writes to, with filter.cc's and the filter manager's rules for
    /// creating a buffered one; `None` where Envoy refuses (returns false).
    fn body_mut(&mut self, kind: BodyType, creating: bool) -> Option<&mut Buffer> {
        match kind {
            BodyType::ReceivedRequest => self.request_received.as_mut(),
            BodyType::ReceivedResponse => self.received.as_mut(),
            BodyType::BufferedRequest => {
                if self.request_buffered.is_none() && creating {
                    self.request_buffered = Some(Buffer::default());
                }
                self.request_buffered.as_mut()
            }
            BodyType::BufferedResponse => {
                if self.buffered.is_some() && !self.saw_body {
                    self.violation("modifyEncodingBuffer() by a filter that was given no body".into());
                }
                if self.buffered.is_none() && creating {
                    if matches!(self.call, Some(CallState::DecodeHeaders | CallState::DecodeData)) {
                        self.violation("response data added while decoding: Envoy answers 502".into());
                    }
                    self.buffered = Some(Buffer::default());
                }
                self.buffered.as_mut()
            }
        }
    }

    fn append(&mut self, kind: BodyType, data: &[u8]) -> bool {
        let inline = matches!(kind, BodyType::BufferedResponse)
            && self.buffered.is_none()
            && self.call == Some(CallState::EncodeTrailers)
            && !self.stopped;
        if inline {
            // `addEncodedData` from the trailers of an iterating filter: on to the client now.
            self.send_data(data.to_vec(), false);
            return true;
        }
        match self.body_mut(kind, true) {
            Some(body) => {
                body.add(data);
                true
            }
            None => {
                self.violation(format!("{} bytes appended to a body Envoy does not have here", data.len()));
                false
            }
        }
    }

    fn drain(&mut self, kind: BodyType, length: usize) -> bool {
        if let Some(stall) = self.stall_in_drain.take() {
            std::thread::sleep(stall);
        }
        let mut retired = std::mem::take(&mut self.retired);
        let drained = match self.body_mut(kind, false) {
            Some(body) => {
                body.drain(length, &mut retired);
                true
            }
            None => false,
        };
        self.retired = retired;
        drained
    }
}

/// The stream's state behind the pointer Envoy hands the module.
fn stream<'a>(envoy: FilterEnvoy) -> &'a RefCell<StreamState> {
    // SAFETY: every filter pointer the model hands out is a live `StreamState` of a `Stream`.
    unsafe { &*(envoy as *const RefCell<StreamState>) }
}

fn config<'a>(envoy: FilterConfigEnvoy) -> &'a ConfigModel {
    // SAFETY: every configuration pointer the model hands out is a live `ConfigModel`.
    unsafe { &*(envoy as *const ConfigModel) }
}

/// # Safety
/// Bytes the module lends for the call.
unsafe fn module_bytes<'a>(buffer: ModuleBuffer) -> &'a [u8] {
    raw(buffer.ptr, buffer.length)
}

/// # Safety
/// A pointer and length the module lends for the call (null only with a length of 0).
unsafe fn raw<'a, T>(ptr: *const T, length: usize) -> &'a [T] {
    if length == 0 {
        &[]
    } else {
        std::slice::from_raw_parts(ptr, length)
    }
}

// The callbacks the module imports, as Envoy answers them.

#[no_mangle]
extern "C" fn envoy_dynamic_module_callback_log(_level: LogLevel, message: ModuleBuffer) {
    // SAFETY: the module lends the message for the call.
    eprintln!("{}", String::from_utf8_lossy(unsafe { module_bytes(message) }));
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_callback_http_filter_config_define_counter(
    envoy: FilterConfigEnvoy,
    name: ModuleBuffer,
    _label_names: *const ModuleBuffer,
    _label_names_length: usize,
    id: *mut usize,
) -> MetricsResult {
    config(envoy).define(name, id)
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_callback_http_filter_config_define_histogram(
    envoy: FilterConfigEnvoy,
    name: ModuleBuffer,
    _label_names: *const ModuleBuffer,
    _label_names_length: usize,
    id: *mut usize,
) -> MetricsResult {
    config(envoy).define(name, id)
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_callback_http_filter_increment_counter(
    envoy: FilterEnvoy,
    id: usize,
    _label_values: *const ModuleBuffer,
    _label_values_length: usize,
    value: u64,
) -> MetricsResult {
    stream(envoy).borrow().config.add(id, value);
    METRICS_SUCCESS
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_callback_http_filter_record_histogram_value(
    envoy: FilterEnvoy,
    id: usize,
    _label_values: *const ModuleBuffer,
    _label_values_length: usize,
    value: u64,
) -> MetricsResult {
    let state = stream(envoy).borrow();
    let name = state.config.metrics.borrow()[id].clone();
    state.config.histograms.borrow_mut().entry(name).or_default().push(value);
    METRICS_SUCCESS
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_callback_http_filter_config_increment_counter(
    envoy: FilterConfigEnvoy,
    id: usize,
    _label_values: *const ModuleBuffer,
    _label_values_length: usize,
    value: u64,
) -> MetricsResult {
    config(envoy).add(id, value);
    METRICS_SUCCESS
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_callback_http_get_headers_size(envoy: FilterEnvoy, kind: HeaderType) -> usize {
    let state = stream(envoy).borrow();
    match kind {
        HeaderType::Request => state.request_headers.len(),
        HeaderType::Response => state.response_headers.len(),
        HeaderType::ResponseTrailer => state.response_trailers.len(),
    }
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_callback_http_get_headers(
    envoy: FilterEnvoy,
    kind: HeaderType,
    out: *mut EnvoyHeader,
) -> bool {
    let state = stream(envoy).borrow();
    let map = match kind {
        HeaderType::Request => &state.request_headers,
        HeaderType::Response => &state.response_headers,
        HeaderType::ResponseTrailer => &state.response_trailers,
    };
    for (at, (name, value)) in map.iter().enumerate() {
        let key = EnvoyBuffer { ptr: name.as_ptr(), length: name.len() };
        let value = EnvoyBuffer { ptr: value.as_ptr(), length: value.len() };
        // SAFETY: the module made room for `get_headers_size` entries.
        unsafe { *out.add(at) = EnvoyHeader { key, value } };
    }
    true
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_callback_http_set_header(
    envoy: FilterEnvoy,
    kind: HeaderType,
    key: ModuleBuffer,
    value: ModuleBuffer,
) -> bool {
    // SAFETY: the module lends these for the call.
    let (key, value) = unsafe { (module_bytes(key).to_ascii_lowercase(), module_bytes(value).to_vec()) };
    let mut state = stream(envoy).borrow_mut();
    let mut retired = std::mem::take(&mut state.retired);
    let map = state.headers_mut(kind);
    // `setCopy` replaces every value; an empty value removes the header.
    let (gone, kept): (Headers, Headers) = std::mem::take(map).into_iter().partition(|(name, _)| *name == key);
    *map = kept;
    if !value.is_empty() {
        map.push((key, value));
    }
    retired.extend(gone.into_iter().flat_map(|(name, value)| [name, value]));
    state.retired = retired;
    true
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_callback_http_add_header(
    envoy: FilterEnvoy,
    kind: HeaderType,
    key: ModuleBuffer,
    value: ModuleBuffer,
) -> bool {
    // SAFETY: the module lends these for the call.
    let (key, value) = unsafe { (module_bytes(key).to_ascii_lowercase(), module_bytes(value).to_vec()) };
    if value.is_empty() {
        return false;
    }
    stream(envoy).borrow_mut().headers_mut(kind).push((key, value));
    true
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_callback_http_get_metadata_string(
    envoy: FilterEnvoy,
    source: MetadataSource,
    namespace: ModuleBuffer,
    key: ModuleBuffer,
    result: *mut EnvoyBuffer,
) -> bool {
    let state = stream(envoy).borrow();
    // SAFETY: the module lends these for the call.
    let asked = unsafe { (module_bytes(namespace), module_bytes(key)) };
    let wanted = (b"rpcedge".as_slice(), b"cache_namespace".as_slice());
    match (&state.route_namespace, matches!(source, MetadataSource::Route) && asked == wanted) {
        (Some(value), true) => {
            // SAFETY: the module lends the result's place; the value lives with the stream.
            unsafe { *result = EnvoyBuffer { ptr: value.as_ptr(), length: value.len() } };
            true
        }
        _ => false,
    }
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_callback_http_get_body_chunks_size(envoy: FilterEnvoy, kind: BodyType) -> usize {
    stream(envoy).borrow().body(kind).map_or(0, |body| body.0.len())
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_callback_http_get_body_chunks(
    envoy: FilterEnvoy,
    kind: BodyType,
    out: *mut EnvoyBuffer,
) -> bool {
    let state = stream(envoy).borrow();
    let Some(body) = state.body(kind) else { return false };
    for (at, slice) in body.raw().into_iter().enumerate() {
        // SAFETY: the module made room for `get_body_chunks_size` entries.
        unsafe { *out.add(at) = slice };
    }
    true
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_callback_http_get_body_size(envoy: FilterEnvoy, kind: BodyType) -> usize {
    stream(envoy).borrow().body(kind).map_or(0, Buffer::len)
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_callback_http_append_body(
    envoy: FilterEnvoy,
    kind: BodyType,
    data: ModuleBuffer,
) -> bool {
    // SAFETY: the module lends the bytes for the call.
    let data = unsafe { module_bytes(data) };
    stream(envoy).borrow_mut().append(kind, data)
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_callback_http_drain_body(envoy: FilterEnvoy, kind: BodyType, length: usize) -> bool {
    stream(envoy).borrow_mut().drain(kind, length)
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_callback_http_send_response(
    envoy: FilterEnvoy,
    status: u32,
    headers: *const ModuleHeader,
    headers_length: usize,
    body: ModuleBuffer,
    _details: ModuleBuffer,
) {
    let mut state = stream(envoy).borrow_mut();
    state.sent_local_reply = true;
    if state.client.headers.is_some() {
        // `sendLocalReply` once the headers went out: all Envoy can do is reset.
        state.client.reset = true;
        return;
    }
    // SAFETY: the module lends these for the call.
    let (mut reply, body) = unsafe {
        let added =
            raw(headers, headers_length).iter().map(|h| (module_bytes(h.key).to_vec(), module_bytes(h.value).to_vec()));
        let reply: Headers =
            [(b":status".to_vec(), status.to_string().into_bytes())].into_iter().chain(added).collect();
        (reply, module_bytes(body).to_vec())
    };
    // `Utility::sendLocalReply`: the body's length, and a type where the reply has none.
    reply.retain(|(name, _)| name != b"content-length");
    if !body.is_empty() {
        reply.push((b"content-length".to_vec(), body.len().to_string().into_bytes()));
        if header(&reply, "content-type").is_none() {
            reply.push((b"content-type".to_vec(), b"text/plain".to_vec()));
        }
    }
    state.client.headers = Some(reply);
    state.client.body = body;
    state.client.ended = true;
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_callback_http_filter_reset_stream(
    envoy: FilterEnvoy,
    _reason: u32,
    _details: ModuleBuffer,
) {
    stream(envoy).borrow_mut().client.reset = true;
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_callback_http_filter_continue_decoding(envoy: FilterEnvoy) {
    stream(envoy).borrow_mut().module_continues(false);
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_callback_http_filter_continue_encoding(envoy: FilterEnvoy) {
    stream(envoy).borrow_mut().module_continues(true);
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_callback_http_filter_scheduler_new(envoy: FilterEnvoy) -> Scheduler {
    let scheduler = SchedulerModel::kept();
    let mut state = stream(envoy).borrow_mut();
    state.config.schedulers.borrow_mut().push(Arc::clone(&scheduler));
    state.schedulers.push(Arc::clone(&scheduler));
    Arc::into_raw(scheduler) as Scheduler
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_callback_http_filter_scheduler_commit(scheduler: Scheduler, event: u64) {
    // SAFETY: a pointer from `scheduler_new`; the stream keeps the model alive past its delete.
    unsafe { &*(scheduler as *const SchedulerModel) }.commit(event);
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_callback_http_filter_scheduler_delete(scheduler: Scheduler) {
    // SAFETY: a pointer from `scheduler_new`, deleted once.
    let scheduler = unsafe { Arc::from_raw(scheduler as *const SchedulerModel) };
    scheduler.deleted.store(true, Ordering::SeqCst);
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_callback_http_filter_config_scheduler_new(
    envoy: FilterConfigEnvoy,
) -> ConfigScheduler {
    let scheduler = SchedulerModel::kept();
    config(envoy).schedulers.borrow_mut().push(Arc::clone(&scheduler));
    *config(envoy).scheduler.borrow_mut() = Some(Arc::clone(&scheduler));
    Arc::into_raw(scheduler) as ConfigScheduler
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_callback_http_filter_config_scheduler_commit(
    scheduler: ConfigScheduler,
    event: u64,
) {
    envoy_dynamic_module_callback_http_filter_scheduler_commit(scheduler, event);
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_callback_http_filter_config_scheduler_delete(scheduler: ConfigScheduler) {
    envoy_dynamic_module_callback_http_filter_scheduler_delete(scheduler);
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_callback_http_filter_http_callout(
    envoy: FilterEnvoy,
    callout_id: *mut u64,
    cluster: ModuleBuffer,
    headers: *const ModuleHeader,
    headers_length: usize,
    body: ModuleBuffer,
    _timeout_ms: u64,
) -> CalloutInit {
    let mut state = stream(envoy).borrow_mut();
    state.next_callout += 1;
    match callout(state.next_callout, cluster, headers, headers_length, body) {
        Ok(call) => {
            // SAFETY: the module lends the id's place for the call.
            unsafe { *callout_id = call.id };
            state.callouts.push(call);
            CALLOUT_STARTED
        }
        Err(refused) => refused,
    }
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_callback_http_filter_config_http_callout(
    envoy: FilterConfigEnvoy,
    callout_id: *mut u64,
    cluster: ModuleBuffer,
    headers: *const ModuleHeader,
    headers_length: usize,
    body: ModuleBuffer,
    _timeout_ms: u64,
) -> CalloutInit {
    let config = config(envoy);
    *config.next_callout.borrow_mut() += 1;
    let id = *config.next_callout.borrow();
    match callout(id, cluster, headers, headers_length, body) {
        Ok(call) => {
            // SAFETY: the module lends the id's place for the call.
            unsafe { *callout_id = call.id };
            config.callouts.borrow_mut().push(call);
            CALLOUT_STARTED
        }
        Err(refused) => refused,
    }
}

// The test's side: Envoy's main thread with one filter configuration, and its streams.

/// Envoy with the module's filter configured.
struct Envoy {
    model: Rc<ConfigModel>,
    module: *const c_void,
    stream_delay: Duration,
}

impl Envoy {
    fn configure(json: &str) -> Envoy {
        // SAFETY: Envoy's calls at load and configuration, with what they take.
        unsafe {
            assert_eq!(CStr::from_ptr(crate::envoy_dynamic_module_on_program_init()), crate::abi::ABI_VERSION);
            let model = Rc::new(ConfigModel::default());
            let name = EnvoyBuffer { ptr: b"rpcedge".as_ptr(), length: 7 };
            let json = EnvoyBuffer { ptr: json.as_ptr(), length: json.len() };
            let envoy = Rc::as_ptr(&model) as FilterConfigEnvoy;
            let module = crate::envoy_dynamic_module_on_http_filter_config_new(envoy, name, json);
            assert!(!module.is_null(), "the configuration was refused");
            let settings = rpcedge_core::Config::from_json(json.bytes()).expect("valid");
            Envoy { model, module, stream_delay: Duration::from_millis(settings.stream_delay_ms) }
        }
    }

    fn stream(&self) -> Stream {
        let state = Box::new(RefCell::new(StreamState {
            config: Rc::clone(&self.model),
            route_namespace: None,
            call: None,
            in_continue: false,
            sent_local_reply: false,
            destroyed: false,
            request_headers: Headers::new(),
            request_received: None,
            request_buffered: None,
            request_stopped: false,
            request_complete: false,
            upstream: Upstream::default(),
            callouts: Vec::new(),
            next_callout: 0,
            response_headers: Headers::new(),
            received: None,
            buffered: None,
            stopped: false,
            headers_continued: false,
            complete: false,
            trailers: false,
            response_trailers: Headers::new(),
            saw_body: false,
            client: Client::default(),
            schedulers: Vec::new(),
            stall_in_drain: None,
            retired: Vec::new(),
            violations: Vec::new(),
        }));
        let envoy = &*state as *const RefCell<StreamState> as FilterEnvoy;
        // SAFETY: the module's configuration is alive; the state outlives the filter.
        let filter = unsafe { crate::envoy_dynamic_module_on_http_filter_new(self.module, envoy) };
        assert!(!filter.is_null());
        Stream { state, filter }
    }

    fn counter(&self, name: &str) -> u64 {
        self.model.counters.borrow().get(&format!("rpcedge.{name}")).copied().unwrap_or(0)
    }

    /// The responses counted by the mode they ended in, aborted ones included.
    fn responses(&self) -> BTreeMap<String, u64> {
        let counters = self.model.counters.borrow();
        counters
            .iter()
            .filter_map(|(name, &n)| Some((name.strip_prefix("rpcedge.responses.")?.to_string(), n)))
            .collect()
    }

    /// Runs what the configuration's scheduler got, on the main thread.
    fn run_main_thread(&self) {
        let scheduler = self.model.scheduler.borrow().clone();
        for event in scheduler.map_or_else(Vec::new, |s| s.take()) {
            let envoy = Rc::as_ptr(&self.model) as FilterConfigEnvoy;
            // SAFETY: the configuration is alive.
            unsafe { crate::envoy_dynamic_module_on_http_filter_config_scheduled(envoy, self.module, event) };
        }
    }

    /// The calls the configuration made (the stores), taken.
    fn take_callouts(&self) -> Vec<Callout> {
        std::mem::take(&mut *self.model.callouts.borrow_mut())
    }

    /// The daemon answers a store with this status.
    fn answer_store(&self, call: &Callout, status: &str) {
        let status = [(b":status".to_vec(), status.as_bytes().to_vec())];
        let headers = envoy_headers(&status);
        let envoy = Rc::as_ptr(&self.model) as FilterConfigEnvoy;
        // SAFETY: the configuration is alive; the answer lives for the call.
        unsafe {
            crate::envoy_dynamic_module_on_http_filter_config_http_callout_done(
                envoy,
                self.module,
                call.id,
                CALLOUT_SUCCESS,
                headers.as_ptr(),
                headers.len(),
                std::ptr::null(),
                0,
            )
        };
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        // SAFETY: the configuration's streams, made after it, were dropped before it.
        unsafe { crate::envoy_dynamic_module_on_http_filter_config_destroy(self.module) };
        if std::thread::panicking() {
            return;
        }
        if let Some(scheduler) = self.model.scheduler.borrow().as_ref() {
            assert!(scheduler.deleted.load(Ordering::SeqCst), "the config scheduler leaked");
        }
        // A deadline left armed fires within stream_delay.
        std::thread::sleep(self.stream_delay * 2 + Duration::from_millis(20));
        let late: usize = self.model.schedulers.borrow().iter().map(|s| s.late_commits()).sum();
        assert_eq!(late, 0, "a deadline fired into a scheduler Envoy had deleted with its filter");
    }
}

fn envoy_headers(headers: &[(Vec<u8>, Vec<u8>)]) -> Vec<EnvoyHeader> {
    let buffer = |bytes: &Vec<u8>| EnvoyBuffer { ptr: bytes.as_ptr(), length: bytes.len() };
    headers.iter().map(|(name, value)| EnvoyHeader { key: buffer(name), value: buffer(value) }).collect()
}

/// One stream through the module's filter, driven as Envoy's filter manager drives it.
struct Stream {
    state: Box<RefCell<StreamState>>,
    filter: *const c_void,
}

impl Stream {
    fn envoy(&self) -> FilterEnvoy {
        &*self.state as *const RefCell<StreamState> as FilterEnvoy
    }

    fn with<T>(&self, f: impl FnOnce(&mut StreamState) -> T) -> T {
        f(&mut self.state.borrow_mut())
    }

    /// Runs one of the module's callbacks, then reports what Envoy would not have taken.
    fn call<T>(&self, call: CallState, hook: impl FnOnce(FilterEnvoy, *const c_void) -> T) -> T {
        self.with(|s| {
            assert!(!s.destroyed, "a callback after the filter was destroyed");
            s.call = Some(call);
        });
        let result = hook(self.envoy(), self.filter);
        self.with(|s| {
            s.call = None;
            s.retired.clear();
            assert!(s.violations.is_empty(), "{}", s.violations.join("; "));
        });
        result
    }

    fn over(&self) -> bool {
        self.with(|s| s.over())
    }

    /// The request: headers, then its body (if any) in two chunks, the end of stream with the
    /// second.
    fn request(&self, pairs: &[(&str, &str)], body: Option<&[u8]>) {
        self.with(|s| {
            s.request_headers = headers(pairs);
            s.request_complete = body.is_none();
        });
        let end = body.is_none();
        let status = self.call(CallState::DecodeHeaders, |envoy, filter| unsafe {
            crate::envoy_dynamic_module_on_http_filter_request_headers(envoy, filter, end)
        });
        self.with(|s| {
            s.in_continue = status == HeadersStatus::Continue;
            if s.over() {
                return;
            }
            if status == HeadersStatus::Continue {
                s.upstream.headers = Some(s.request_headers.clone());
                s.upstream.ended = end;
            } else {
                s.request_stopped = true;
            }
        });
        if let Some(body) = body {
            let (first, second) = body.split_at(body.len() / 2);
            self.request_body(first, false);
            self.request_body(second, true);
        }
    }

    /// `FilterManager::decodeData` with a chunk of the request's body.
    fn request_body(&self, chunk: &[u8], end: bool) {
        self.with(|s| {
            s.request_complete = end;
            s.request_received = Some(Buffer::from_slices(&[chunk]));
        });
        let status = self.call(CallState::DecodeData, |envoy, filter| unsafe {
            crate::envoy_dynamic_module_on_http_filter_request_body(envoy, filter, end)
        });
        self.with(|s| {
            let mut chunk = s.request_received.take().unwrap_or_default();
            s.in_continue = status == BodyStatus::Continue;
            if s.over() {
                return;
            }
            match status {
                BodyStatus::Continue if s.request_stopped => {
                    chunk.move_into(s.request_buffered.get_or_insert_with(Buffer::default));
                    s.continue_decoding();
                }
                BodyStatus::Continue => {
                    s.upstream.body.extend(chunk.take());
                    s.upstream.ended = end;
                }
                BodyStatus::StopIterationAndBuffer => {
                    s.request_stopped = true;
                    chunk.move_into(s.request_buffered.get_or_insert_with(Buffer::default));
                }
                BodyStatus::StopIterationNoBuffer => {
                    s.request_stopped = true;
                    if chunk.len() > 0 {
                        s.violation(format!("{} request bytes dropped", chunk.len()));
                    }
                }
            }
        });
    }

    /// The module's lookup, answered by the daemon with this status and body (as slices).
    fn answer_lookup(&self, status: &str, body: &[&[u8]]) {
        let call = self.with(|s| s.callouts.pop()).expect("a lookup");
        let answer = headers(&[(":status", status)]);
        let headers = envoy_headers(&answer);
        let body = Buffer::from_slices(body);
        let body = body.raw();
        self.call(CallState::Idle, |envoy, filter| unsafe {
            crate::envoy_dynamic_module_on_http_filter_http_callout_done(
                envoy,
                filter,
                call.id,
                CALLOUT_SUCCESS,
                headers.as_ptr(),
                headers.len(),
                body.as_ptr(),
                body.len(),
            )
        });
    }

    /// The lookup failed (a reset, a timeout): Envoy passes no answer.
    fn fail_lookup(&self) {
        let call = self.with(|s| s.callouts.pop()).expect("a lookup");
        let reset: CalloutResult = 1;
        self.call(CallState::Idle, |envoy, filter| unsafe {
            crate::envoy_dynamic_module_on_http_filter_http_callout_done(
                envoy,
                filter,
                call.id,
                reset,
                std::ptr::null(),
                0,
                std::ptr::null(),
                0,
            )
        });
    }

    /// `FilterManager::encodeHeaders` with the node's response headers.
    fn response_headers(&self, pairs: &[(&str, &str)], end: bool) {
        if self.over() {
            return;
        }
        self.with(|s| {
            s.response_headers = headers(pairs);
            s.complete = end;
        });
        let status = self.call(CallState::EncodeHeaders, |envoy, filter| unsafe {
            crate::envoy_dynamic_module_on_http_filter_response_headers(envoy, filter, end)
        });
        self.with(|s| {
            s.in_continue = status == HeadersStatus::Continue;
            if s.over() {
                return;
            }
            if status == HeadersStatus::StopIteration {
                s.stopped = true;
                return;
            }
            s.headers_continued = true;
            // a header-only response the filter gave a body goes on with it (`maybeContinueEncoding`)
            let body_added = end && s.buffered.is_some();
            s.send_headers(end && !body_added);
            if body_added {
                s.stopped = true;
                s.continue_encoding();
            }
        });
    }

    /// `FilterManager::encodeData` with one chunk of the node's body, as these slices.
    fn body_slices(&self, slices: &[&[u8]], end: bool) {
        if self.over() {
            return;
        }
        self.with(|s| {
            assert!(!s.complete, "a body after the end");
            s.complete = end;
            s.saw_body = true;
            s.received = Some(Buffer::from_slices(slices));
        });
        let status = self.call(CallState::EncodeData, |envoy, filter| unsafe {
            crate::envoy_dynamic_module_on_http_filter_response_body(envoy, filter, end)
        });
        self.with(|s| {
            let mut chunk = s.received.take().unwrap_or_default();
            s.in_continue = status == BodyStatus::Continue;
            if s.over() {
                return;
            }
            match status {
                BodyStatus::Continue if s.stopped => {
                    chunk.move_into(s.buffered.get_or_insert_with(Buffer::default));
                    s.continue_encoding();
                }
                BodyStatus::Continue => s.send_data(chunk.take(), end),
                BodyStatus::StopIterationAndBuffer => {
                    s.stopped = true;
                    chunk.move_into(s.buffered.get_or_insert_with(Buffer::default));
                }
                BodyStatus::StopIterationNoBuffer => {
                    s.stopped = true;
                    if chunk.len() > 0 {
                        s.violation(format!(
                            "{} bytes dropped: left in a chunk stopped without buffering",
                            chunk.len()
                        ));
                    }
                    if s.complete && !s.trailers && s.buffered.is_none() {
                        // so that a continue still ends the stream
                        s.buffered = Some(Buffer::default());
                    }
                }
            }
        });
    }

    fn body(&self, data: &[u8], end: bool) {
        self.body_slices(&[data], end);
    }

    /// The body's last chunk, which a filter before the module ends in trailers of its own as it
    /// passes (Envoy's decompressor: its byte counts): the module's body callback is not told the
    /// end, and its trailers callback follows only if that callback continued.
    fn body_ending_in_added_trailers(&self, data: &[u8]) {
        self.with(|s| s.response_trailers = headers(&[("x-envoy-decompressor-gzip-compressed-bytes", "10")]));
        self.body(data, false);
        self.with(|s| {
            s.trailers = true;
            s.complete = true;
        });
        if self.with(|s| s.in_continue) {
            self.trailers();
        }
    }

    /// `FilterManager::encodeTrailers` with the node's trailers.
    fn trailers(&self) {
        if self.over() {
            return;
        }
        self.with(|s| {
            s.trailers = true;
            s.complete = true;
        });
        let status = self.call(CallState::EncodeTrailers, |envoy, filter| unsafe {
            crate::envoy_dynamic_module_on_http_filter_response_trailers(envoy, filter)
        });
        self.with(|s| {
            s.in_continue = status == TrailersStatus::Continue;
            if s.over() {
                return;
            }
            match status {
                TrailersStatus::Continue if s.stopped => s.continue_encoding(),
                TrailersStatus::Continue => s.send_trailers(),
                TrailersStatus::StopIteration => s.stopped = true,
            }
        });
    }

    /// Runs the scheduler events the filter got on its worker; how many ran.
    fn run_scheduled(&self) -> usize {
        let events: Vec<u64> = self.with(|s| s.schedulers.iter().flat_map(|scheduler| scheduler.take()).collect());
        for &event in &events {
            if self.with(|s| s.destroyed) {
                break;
            }
            self.call(CallState::Idle, |envoy, filter| unsafe {
                crate::envoy_dynamic_module_on_http_filter_scheduled(envoy, filter, event)
            });
        }
        events.len()
    }

    /// Waits up to `within` for a scheduler event (the module's timer commits them from its own
    /// thread).
    fn wait_for_events(&self, within: Duration) {
        let until = Instant::now() + within;
        while Instant::now() < until && self.with(|s| s.schedulers.iter().all(|s| s.events.lock().unwrap().is_empty()))
        {
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn run_scheduled_within(&self, within: Duration) -> usize {
        self.wait_for_events(within);
        self.run_scheduled()
    }

    /// Runs events as they come until the response ends or none comes for a while.
    fn run_until_quiet(&self) {
        while !self.with(|s| s.client.ended || s.over()) && self.run_scheduled_within(Duration::from_millis(200)) > 0 {}
    }

    /// The stream is over, as Envoy ends one (its end, a reset, a local reply): the filter
    /// learns it, then is destroyed; its schedulers must be gone with it.
    fn finish(&self) {
        if self.with(|s| s.destroyed) {
            return;
        }
        self.call(CallState::StreamComplete, |envoy, filter| unsafe {
            crate::envoy_dynamic_module_on_http_filter_stream_complete(envoy, filter)
        });
        // SAFETY: Envoy's last call on the filter.
        unsafe { crate::envoy_dynamic_module_on_http_filter_destroy(self.filter) };
        self.with(|s| {
            s.destroyed = true;
            assert!(s.schedulers.iter().all(|s| s.deleted.load(Ordering::SeqCst)), "a scheduler outlived its filter");
        });
        assert_eq!(self.late_commits(), 0, "a commit after the scheduler's delete");
    }

    /// Commits to a scheduler after Envoy deleted it (a use after free in Envoy).
    fn late_commits(&self) -> usize {
        self.with(|s| s.schedulers.iter().map(|s| s.late_commits()).sum())
    }

    fn client<T>(&self, f: impl FnOnce(&Client) -> T) -> T {
        self.with(|s| f(&s.client))
    }

    /// A header of the request as Envoy keeps it (its access log reads it).
    fn request_header(&self, name: &str) -> Option<String> {
        self.with(|s| header(&s.request_headers, name).map(str::to_string))
    }

    fn client_header(&self, name: &str) -> Option<String> {
        self.client(|c| c.headers.as_ref().and_then(|h| header(h, name)).map(str::to_string))
    }

    /// What the client got, checked whole: the response ended, nothing is left in Envoy's
    /// buffers, its length (if it has one) is the body's.
    fn delivered(&self) -> Vec<u8> {
        self.with(|s| {
            assert!(!s.client.reset, "the response was reset");
            assert!(s.client.ended, "the response never ended");
            let left = s.buffered.as_ref().map_or(0, Buffer::len);
            assert_eq!(left, 0, "bytes left in Envoy's buffered body, which nothing will send");
            if let Some(length) = s.client.headers.as_ref().and_then(|h| header(h, "content-length")) {
                assert_eq!(length, s.client.body.len().to_string(), "Content-Length is not the body's length");
            }
            s.client.body.clone()
        })
    }

    /// A gzip body that decodes to `original`.
    fn assert_delivered_gzip(&self, original: &[u8]) {
        let body = self.delivered();
        assert_eq!(self.client_header("content-encoding").as_deref(), Some("gzip"));
        assert!(gunzip(&body) == original, "the decoded body differs from the node's");
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            self.finish();
        }
    }
}

fn gunzip(body: &[u8]) -> Vec<u8> {
    assert!(body.len() >= 18 && body[..3] == [0x1f, 0x8b, 8], "not a gzip member");
    let decoded = miniz_oxide::inflate::decompress_to_vec(&body[10..body.len() - 8]);
    let decoded = decoded.unwrap_or_else(|e| panic!("not a whole deflate stream: {:?}", e.status));
    let isize = u32::from_le_bytes(body[body.len() - 4..].try_into().unwrap());
    assert_eq!(isize as usize, decoded.len() % (1 << 32));
    decoded
}

/// A JSON-RPC-like body that compresses.
fn json(len: usize) -> Vec<u8> {
    let mut out = b"{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":[".to_vec();
    let mut n = 0u64;
    while out.len() < len - 2 {
        out.extend_from_slice(format!("\"0x{:064x}\",", n.wrapping_mul(0x9e37_79b9_7f4a_7c15)).as_bytes());
        n += 1;
    }
    out.truncate(len - 2);
    out.extend_from_slice(b"]}");
    out
}

const CONFIG: &str = r#"{"min_length": 1024, "max_buffer": 65536, "stream_delay_ms": 1}"#;
const GZIP_CLIENT: &[(&str, &str)] =
    &[(":method", "POST"), (":path", "/"), (":authority", "node"), ("accept-encoding", "gzip")];
const CHUNKED: &[(&str, &str)] = &[(":status", "200"), ("content-type", "application/json")];

fn with_length(length: &str) -> Vec<(&str, &str)> {
    let mut headers = CHUNKED.to_vec();
    headers.push(("content-length", length));
    headers
}

/// Sleeps past the core's stream_delay, and lets the module's timer commit the deadline it armed,
/// if it armed one (one later than that runs at a later step: another interleaving, which must
/// deliver too).
fn let_the_deadline_pass(stream: &Stream) {
    std::thread::sleep(Duration::from_millis(5));
    stream.wait_for_events(Duration::from_millis(20));
}

#[test]
fn a_small_body_passes_untouched() {
    let envoy = Envoy::configure(CONFIG);
    let original = json(600);
    let stream = envoy.stream();
    stream.request(GZIP_CLIENT, None);
    stream.response_headers(&with_length("600"), false);
    stream.body(&original, true);
    assert_eq!(stream.delivered(), original);
    assert_eq!(stream.client_header("content-encoding"), None);
    assert_eq!(stream.client_header("content-length").as_deref(), Some("600"));
    stream.finish();
    assert_eq!(envoy.responses(), BTreeMap::from([("small".into(), 1)]));
}

#[test]
fn a_body_compressed_whole_goes_out_with_its_exact_length() {
    let envoy = Envoy::configure(CONFIG);
    let original = json(50_000);
    let stream = envoy.stream();
    stream.request(GZIP_CLIENT, None);
    stream.response_headers(&with_length("50000"), false);
    let (first, rest) = original.split_at(20_000);
    // Envoy's buffers come in slices: one chunk of three, then smaller chunks
    stream.body_slices(&[&first[..7], &first[7..8_000], &first[8_000..]], false);
    let pieces: Vec<&[u8]> = rest.chunks(7_000).collect();
    for (at, piece) in pieces.iter().enumerate() {
        assert!(stream.client(|c| c.headers.is_none()), "the headers wait for the compressed length");
        stream.body(piece, at + 1 == pieces.len());
    }
    stream.assert_delivered_gzip(&original);
    let length: usize = stream.client_header("content-length").expect("a Content-Length").parse().unwrap();
    assert!(length < original.len() / 2);
    stream.finish();
    assert_eq!(envoy.responses(), BTreeMap::from([("oneshot".into(), 1)]));
    assert_eq!(envoy.counter("body_bytes_in"), 50_000);
    assert_eq!(envoy.model.histograms.borrow()["rpcedge.compress_duration_us"].len(), 1);
}

#[test]
fn a_streamed_body_ends_on_an_empty_chunk_or_a_data_chunk() {
    let original = json(300_000);
    for end_on_data in [false, true] {
        let envoy = Envoy::configure(CONFIG);
        let stream = envoy.stream();
        stream.request(GZIP_CLIENT, None);
        stream.response_headers(CHUNKED, false);
        let pieces: Vec<&[u8]> = original.chunks(16_384).collect();
        for (at, piece) in pieces.iter().enumerate() {
            stream.body(piece, end_on_data && at + 1 == pieces.len());
            assert!(at < 4 || stream.client(|c| !c.body.is_empty()), "past max_buffer the body streams");
        }
        if !end_on_data {
            stream.body(&[], true);
        }
        stream.assert_delivered_gzip(&original);
        assert_eq!(stream.client_header("content-length"), None);
        stream.finish();
        assert_eq!(envoy.responses(), BTreeMap::from([("stream".into(), 1)]));
    }
}

#[test]
fn trailers_end_a_streamed_body() {
    // A chunked body streams once it outgrows max_buffer (its headers held until then, and a
    // body Envoy holds for the filter from then on); a known length above max_buffer streams
    // from the headers on (the filter iterates, and Envoy holds no body for it).
    let original = json(200_000);
    let length = original.len().to_string();
    let envoy = Envoy::configure(CONFIG);
    for head in [CHUNKED.to_vec(), with_length(&length)] {
        let stream = envoy.stream();
        stream.request(GZIP_CLIENT, None);
        stream.response_headers(&head, false);
        for piece in original.chunks(50_000) {
            stream.body(piece, false);
        }
        stream.trailers();
        stream.run_until_quiet();
        stream.assert_delivered_gzip(&original);
        assert!(stream.client(|c| c.trailers));
        assert_eq!(stream.client_header("content-length"), None);
    }
}

#[test]
fn a_held_body_is_released_at_its_deadline_then_ends() {
    // A chunked answer's first part waits in the core; at stream_delay the headers and that part
    // go out, then the rest streams.
    let original = json(40_000);
    let envoy = Envoy::configure(CONFIG);
    let stream = envoy.stream();
    stream.request(GZIP_CLIENT, None);
    stream.response_headers(CHUNKED, false);
    stream.body(&original[..10_000], false);
    assert!(stream.client(|c| c.headers.is_none()), "held");
    assert_eq!(stream.run_scheduled_within(Duration::from_secs(2)), 1, "the module armed its deadline");
    let released = stream.client(|c| c.headers.is_some() && !c.body.is_empty());
    assert!(released, "the deadline released the headers and what was held");
    stream.body(&original[10_000..20_000], false);
    stream.run_until_quiet();
    stream.body(&original[20_000..], true);
    stream.run_until_quiet();
    stream.assert_delivered_gzip(&original);
}

#[test]
fn every_interleaving_of_chunks_and_deadlines_delivers_the_whole_body() {
    // Before each chunk: nothing, or the deadline passes and its event runs on the worker before
    // the chunk, or only after it (Envoy ran the chunk's callback first); then the end on the
    // last chunk, on an empty chunk or in trailers.
    let original = json(24_000);
    let pieces: Vec<&[u8]> = original.chunks(6_000).collect();
    let envoy = Envoy::configure(CONFIG);
    for pattern in 0..3u32.pow(pieces.len() as u32) {
        for end in ["data", "empty", "trailers"] {
            let stream = envoy.stream();
            stream.request(GZIP_CLIENT, None);
            stream.response_headers(CHUNKED, false);
            let mut steps = pattern;
            for (at, piece) in pieces.iter().enumerate() {
                let step = steps % 3;
                steps /= 3;
                if step > 0 {
                    let_the_deadline_pass(&stream);
                }
                if step == 1 {
                    stream.run_scheduled();
                }
                stream.body(piece, end == "data" && at + 1 == pieces.len());
                if step == 2 {
                    stream.run_scheduled();
                }
            }
            match end {
                "empty" => stream.body(&[], true),
                "trailers" => stream.trailers(),
                _ => {}
            }
            stream.run_until_quiet();
            stream.assert_delivered_gzip(&original);
        }
    }
}

#[test]
fn a_deadline_that_fires_during_a_callback_is_not_lost() {
    // The timer is another thread: a deadline may fire in a chunk's callback after the core read
    // the clock, and its event then runs after the callback armed the next deadline. The filter
    // must keep track of that one, else it fires into the scheduler Envoy deletes with the
    // filter (Envoy's drop checks). Envoy's worker stalls in the callback to meet that moment.
    let envoy = Envoy::configure(r#"{"min_length": 1024, "max_buffer": 65536, "stream_delay_ms": 100}"#);
    let original = json(6_000);
    let stream = envoy.stream();
    stream.request(GZIP_CLIENT, None);
    stream.response_headers(CHUNKED, false);
    stream.body(&original[..3_000], false); // held, its deadline at +100 ms
    std::thread::sleep(Duration::from_millis(50));
    stream.with(|s| s.stall_in_drain = Some(Duration::from_millis(70)));
    stream.body(&original[3_000..4_000], false); // held: the next deadline at +150 ms
    assert_eq!(stream.run_scheduled(), 1, "the first deadline fired in the callback");
    stream.body(&original[4_000..], true);
    stream.assert_delivered_gzip(&original);
}

#[test]
fn an_abort_mid_body_counts_once_and_leaves_no_deadline_behind() {
    // The client goes away while the core holds a body to compress whole: Envoy ends the stream
    // and destroys the filter.
    let envoy = Envoy::configure(CONFIG);
    let stream = envoy.stream();
    stream.request(GZIP_CLIENT, None);
    stream.response_headers(&with_length("50000"), false);
    stream.body(&json(50_000)[..10_000], false);
    stream.finish();
    assert!(stream.client(|c| c.headers.is_none() && c.body.is_empty()));
    assert_eq!(envoy.responses(), BTreeMap::from([("aborted".into(), 1)]));

    // Again while a chunked body waits for its deadline: once the filter is gone, its timer
    // commits nothing to the scheduler Envoy deleted.
    let stream = envoy.stream();
    stream.request(GZIP_CLIENT, None);
    stream.response_headers(CHUNKED, false);
    stream.body(&json(10_000), false);
    stream.finish();
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(stream.late_commits(), 0, "the deadline fired into a deleted scheduler");
    assert_eq!(envoy.responses(), BTreeMap::from([("aborted".into(), 2)]));
}

#[test]
fn a_refused_transcoding_passes_the_body_untouched() {
    // An SSZ client of a raw-bytes call whose result is not hex: the JSON goes out as it came.
    let envoy = Envoy::configure(r#"{"transcode": true, "transcode_max": 1048576, "buffer_limit": 2097152}"#);
    let call = br#"{"jsonrpc":"2.0","id":1,"method":"debug_getRawBlock","params":["0x1"]}"#;
    let result = "zz".repeat(3_000);
    let answer = format!(r#"{{"jsonrpc":"2.0","id":1,"result":"0x{result}"}}"#).into_bytes();
    let length = answer.len().to_string();
    let stream = envoy.stream();
    let client = [(":method", "POST"), (":path", "/"), (":authority", "node"), ("accept", "application/octet-stream")];
    stream.request(&client, Some(call));
    assert_eq!(stream.with(|s| s.upstream.body.clone()), call, "the node got the call");
    stream.response_headers(&with_length(&length), false);
    let (first, rest) = answer.split_at(2_500);
    stream.body(first, false);
    stream.body(rest, true);
    assert_eq!(stream.delivered(), answer);
    assert_eq!(stream.client_header("content-type").as_deref(), Some("application/json"));
    assert_eq!(stream.client_header("content-length"), Some(length));
    stream.finish();
    assert_eq!(envoy.counter("transcode.refused"), 1);
}

const HASH: &str = "0x88e96d4537bea4d9c05d12549907b32561d3bf31f45aae734cdc119f13406cb6";

fn block_request(id: u32) -> Vec<u8> {
    format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"eth_getBlockByHash","params":["{HASH}",false]}}"#).into_bytes()
}

fn block_answer(id: u32) -> Vec<u8> {
    format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{{"hash":"{HASH}","number":"0x1"}}}}"#).into_bytes()
}

const CACHED: &str = r#"{"cache": {"cluster": "cached", "namespace": "mainnet", "hot_bytes": 65536}}"#;

/// A JSON-RPC call to the node, which waits for its body and the daemon's lookup.
fn ask(envoy: &Envoy, id: u32) -> Stream {
    let body = block_request(id);
    let length = body.len().to_string();
    let stream = envoy.stream();
    let client = [
        (":method", "POST"),
        (":path", "/"),
        (":authority", "node"),
        ("content-type", "application/json"),
        ("accept-encoding", "gzip"),
    ];
    let client = [&client[..], &[("content-length", length.as_str())]].concat();
    stream.request(&client, Some(&body));
    stream
}

/// A miss for call `id`, whose answer the node gives and the module stores from the main thread:
/// what the daemon keeps of it.
fn store_a_miss(envoy: &Envoy, id: u32) -> Vec<u8> {
    let miss = ask(envoy, id);
    let lookup =
        miss.with(|s| (s.callouts[0].cluster.clone(), header(&s.callouts[0].headers, ":method").map(str::to_string)));
    assert_eq!(lookup, ("cached".into(), Some("GET".into())));
    assert!(miss.with(|s| s.upstream.headers.is_none()), "the request waits for the daemon");
    miss.answer_lookup("404", &[]);
    assert_eq!(miss.with(|s| s.upstream.body.clone()), block_request(id), "the node got the request whole");
    let answer = block_answer(id);
    let length = answer.len().to_string();
    miss.response_headers(&with_length(&length), false);
    miss.body(&answer, true);
    assert_eq!(miss.delivered(), answer);
    assert_eq!(miss.client_header("x-rpcedge-cache").as_deref(), Some("MISS"));
    // the node was asked for identity; the request as Envoy keeps it is the client's again
    assert_eq!(miss.with(|s| s.upstream.headers.as_ref().map(|h| header(h, "accept-encoding").is_none())), Some(true));
    assert_eq!(miss.request_header("accept-encoding").as_deref(), Some("gzip"));
    miss.finish();

    envoy.run_main_thread();
    let stores = envoy.take_callouts();
    assert_eq!(stores.len(), 1);
    assert_eq!(header(&stores[0].headers, ":method"), Some("PUT"));
    envoy.answer_store(&stores[0], "204");
    assert_eq!(envoy.counter("cache.stores.taken"), 1);
    Entry::decode(&stores[0].body).unwrap().compact().unwrap()
}

/// A hit of the daemon's, its answer in these slices: the client gets call `id`'s answer.
fn assert_hit(envoy: &Envoy, id: u32, answer: &[&[u8]]) {
    let hit = ask(envoy, id);
    hit.answer_lookup("200", answer);
    assert_eq!(hit.delivered(), block_answer(id));
    assert_eq!(hit.client_header(":status").as_deref(), Some("200"));
    assert_eq!(hit.client_header("x-rpcedge-cache").as_deref(), Some("HIT"));
    assert_eq!(hit.client_header("content-type").as_deref(), Some("application/json"));
    assert!(hit.with(|s| s.upstream.headers.is_none()), "the node never saw it");
    hit.finish();
    assert_eq!(hit.request_header("accept-encoding").as_deref(), Some("gzip"), "as the access log reads it");
}

#[test]
fn a_miss_is_stored_then_a_hit_never_reaches_the_node() {
    let envoy = Envoy::configure(CACHED);
    let kept = store_a_miss(&envoy, 7);
    assert_hit(&envoy, 8, &[&kept]);
    assert_eq!(envoy.counter("cache.responses.hit"), 1);

    // kept in the hot tier all workers share: the next asks no daemon
    let hot = ask(&envoy, 9);
    assert!(hot.with(|s| s.callouts.is_empty()));
    assert_eq!(hot.delivered(), block_answer(9));
    hot.finish();
    assert_eq!((envoy.counter("cache.responses.hit"), envoy.counter("cache.hot_hits")), (2, 1));
}

#[test]
fn a_hit_the_daemon_sends_in_slices_is_whole() {
    let envoy = Envoy::configure(r#"{"cache": {"cluster": "cached", "namespace": "mainnet"}}"#);
    let kept = store_a_miss(&envoy, 7);
    let (a, b) = kept.split_at(kept.len() / 3);
    let (b, c) = b.split_at(b.len() / 2);
    assert_hit(&envoy, 8, &[a, b, c]);
    assert_hit(&envoy, 9, &[&kept]);
    assert_eq!(envoy.counter("cache.responses.hit"), 2);
}

#[test]
fn a_lookup_without_an_answer_goes_to_the_node() {
    let envoy = Envoy::configure(CACHED);
    let stream = ask(&envoy, 3);
    stream.fail_lookup();
    assert!(stream.with(|s| s.upstream.ended), "the request went on whole");
    assert_eq!(stream.with(|s| s.upstream.body.clone()), block_request(3));
    let answer = block_answer(3);
    let length = answer.len().to_string();
    stream.response_headers(&with_length(&length), false);
    stream.body(&answer, true);
    assert_eq!(stream.delivered(), answer);
    assert_eq!(stream.client_header("x-rpcedge-cache").as_deref(), Some("ERROR"));
}

#[test]
fn a_body_an_earlier_filter_ends_in_trailers_of_its_own_ends_there() {
    // Held whole (chunked, under max_buffer) or streamed: either way the gzip stream is finished.
    let envoy = Envoy::configure(CONFIG);
    for original in [json(20_000), json(200_000)] {
        let stream = envoy.stream();
        stream.request(GZIP_CLIENT, None);
        stream.response_headers(CHUNKED, false);
        let (first, last) = original.split_at(original.len() / 2);
        stream.body(first, false);
        stream.body_ending_in_added_trailers(last);
        stream.run_until_quiet();
        stream.assert_delivered_gzip(&original);
        assert!(stream.client(|c| c.trailers), "the trailers went on");
    }
}
