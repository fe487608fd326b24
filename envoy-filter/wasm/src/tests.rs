//! The filter against a model of Envoy's side of one response: the proxy-wasm host calls the SDK
//! makes, and the rules of Envoy's filter manager and Wasm context that the filter depends on. The
//! model checks what Envoy only checks in debug builds (a resume while the filter iterates) and
//! what would lose bytes (output left in a held body that nothing will send), so a test fails
//! where a release Envoy would pass by luck. End-to-end behaviour is tested in real Envoy
//! (tests/test_envoy.py); this covers orderings that real traffic rarely hits on cue.
//!
//! Modelled, from Envoy's `FilterManager` and `extensions/common/wasm/context.cc`:
//! - `continueEncoding()` is legal only while iteration is stopped at the filter, and a call made
//!   inside a callback runs when the VM call returns, before Envoy looks at the callback's result;
//! - a body callback that returns `StopIterationAndBuffer` has its data added to the body held for
//!   the filter, and from then on the Wasm context adds each read to that held body before the next
//!   body callback, even after a resume, until a body callback returns `Continue`;
//! - `Continue` from a stopped filter continues with the held body; from an iterating one it passes
//!   on only this callback's data;
//! - a body is replaced only from its start (`copyFrom`: prepend after draining, or append);
//! - without the plugin's `allow_on_headers_stop_iteration`, a `Pause` from the headers callback
//!   is `StopAllIterationAndWatermark`: Envoy gives the filter no body until it resumes, then the
//!   body it kept meanwhile (proxy-wasm-cpp-host's `convertVmCallResultToFilterHeadersStatus`).

use std::cell::RefCell;
use std::sync::Mutex;
use std::time::Duration;

use proxy_wasm::types::{Action, BufferType, LogLevel, MapType, MetricType, Status, StreamType};

/// The SDK's entry points, as Envoy calls them.
mod abi {
    use proxy_wasm::types::Action;

    extern "C" {
        pub fn proxy_on_context_create(context_id: u32, root_context_id: u32);
        pub fn proxy_on_configure(context_id: u32, plugin_configuration_size: usize) -> bool;
        pub fn proxy_on_tick(context_id: u32);
        pub fn proxy_on_request_headers(context_id: u32, num_headers: usize, end_of_stream: bool) -> Action;
        pub fn proxy_on_response_headers(context_id: u32, num_headers: usize, end_of_stream: bool) -> Action;
        pub fn proxy_on_response_body(context_id: u32, body_size: usize, end_of_stream: bool) -> Action;
        pub fn proxy_on_response_trailers(context_id: u32, num_trailers: usize) -> Action;
    }
}


/// Envoy's side of the one response under test.
#[derive(Default)]
struct Envoy {
    /// The SDK keeps every context it saw: each test response gets a root and a stream of its own.
    root: u32,
    stream: u32,
    config: Vec<u8>,
    response_headers: Vec<(String, Vec<u8>)>,
    /// The request's headers as the node gets them (`Envoy::request_headers`).
    request_headers: Option<Vec<(String, Vec<u8>)>>,
    /// Iteration is stopped at the filter.
    stopped: bool,
    /// The plugin runs without `allow_on_headers_stop_iteration`.
    stops_all_at_headers: bool,
    /// The filter paused at the headers, and Envoy keeps the body from it until it resumes: what
    /// came meanwhile, and whether it ended.
    withheld: Option<(Vec<u8>, bool)>,
    /// The Wasm context adds each read to the held body (its `buffering_response_body_`).
    buffering: bool,
    /// The body Envoy holds for the filter.
    held: Option<Vec<u8>>,
    /// This body callback's data, while one runs.
    data: Option<Vec<u8>>,
    in_callback: bool,
    continue_after_call: bool,
    end_seen: bool,
    trailers_waiting: bool,
    /// What the client got.
    headers_sent: Option<Vec<(String, Vec<u8>)>>,
    sent: Vec<u8>,
    ended: bool,
    trailers_sent: bool,
    failed: Option<String>,
    tick_ms: u32,
    /// Host calls Envoy would refuse: reported when the VM call returns, as a panic inside a
    /// host call cannot unwind.
    violations: Vec<String>,
}

thread_local! {
    static ENVOY: RefCell<Envoy> = RefCell::default();
}

fn envoy<T>(f: impl FnOnce(&mut Envoy) -> T) -> T {
    ENVOY.with(|e| f(&mut e.borrow_mut()))
}

impl Envoy {
    /// `ActiveStreamFilterBase::commonContinue` (a body withheld from the filter goes to it next:
    /// `after_call`).
    fn resume(&mut self) {
        assert!(self.stopped, "continueEncoding() while Envoy iterates at this filter");
        self.stopped = false;
        self.send_headers();
        if self.withheld.is_some() {
            return;
        }
        if let Some(held) = &mut self.held {
            self.sent.append(held);
        }
        if self.trailers_waiting {
            self.trailers_waiting = false;
            self.trailers_sent = true;
            self.ended = true;
        } else if self.end_seen {
            self.ended = true;
        }
    }

    fn send_headers(&mut self) {
        if self.headers_sent.is_none() {
            self.headers_sent = Some(self.response_headers.clone());
        }
    }

    fn body(&mut self) -> Option<&mut Vec<u8>> {
        if self.buffering && self.held.is_some() {
            self.held.as_mut()
        } else {
            self.data.as_mut()
        }
    }

    /// The request: a JSON-RPC POST whose client takes gzip, as the filter leaves it for the node.
    fn request_headers(&mut self) -> &mut Vec<(String, Vec<u8>)> {
        self.request_headers.get_or_insert_with(|| {
            let headers: [(&str, &[u8]); 3] =
                [(":method", b"POST"), ("content-type", b"application/json"), ("accept-encoding", b"gzip")];
            headers.iter().map(|(name, value)| (name.to_string(), value.to_vec())).collect()
        })
    }

    fn header(&self, name: &str) -> Option<String> {
        let headers = self.headers_sent.as_ref()?;
        headers.iter().find(|(n, _)| n == name).map(|(_, v)| String::from_utf8_lossy(v).into_owned())
    }
}

fn stream() -> u32 {
    envoy(|e| e.stream)
}

/// The end of a VM call: a resume asked for inside it runs now.
fn after_call() {
    let resume = envoy(|e| {
        assert!(e.violations.is_empty(), "{}", e.violations.join("; "));
        e.in_callback = false;
        std::mem::take(&mut e.continue_after_call)
    });
    if resume {
        envoy(Envoy::resume);
        if let Some((data, end)) = envoy(|e| e.withheld.take()) {
            body(&data, end);
        }
    }
}

fn action(code: Action) -> Action {
    after_call();
    code
}

fn start(config: &str) {
    // The SDK's logger and panic hook are process-wide; install them once at a time.
    static INIT: Mutex<()> = Mutex::new(());
    {
        let _once = INIT.lock().unwrap();
        crate::_initialize();
    }
    let root = envoy(|e| {
        let root = e.stream + 1;
        *e = Envoy { root, stream: root, config: config.as_bytes().to_vec(), ..Envoy::default() };
        root
    });
    unsafe { abi::proxy_on_context_create(root, 0) };
    assert!(unsafe { abi::proxy_on_configure(root, config.len()) });
    next_stream();
}

/// A configuration whose filter has seen Envoy pass the body to a head it held (the plugin's
/// `allow_on_headers_stop_iteration`): it holds heads for their bodies from then on.
fn start_taught(config: &str) {
    start(config);
    response_headers(CHUNKED, false);
    body(b"{}", true);
    tick_until_quiet();
    next_stream();
}

/// The next request on the configuration, whose response the test drives.
fn next_stream() {
    let stream = envoy(|e| {
        let (root, stream, config) = (e.root, e.stream + 1, std::mem::take(&mut e.config));
        *e = Envoy { root, stream, config, tick_ms: e.tick_ms, ..Envoy::default() };
        stream
    });
    let root = envoy(|e| e.root);
    unsafe { abi::proxy_on_context_create(stream, root) };
    envoy(|e| e.in_callback = true);
    let _ = unsafe { abi::proxy_on_request_headers(stream, 0, true) };
    after_call();
    // the client takes gzip, so rpcedge compresses: the node is asked for identity
    let to_node = envoy(|e| e.request_headers().clone());
    assert!(to_node.iter().all(|(name, _)| name != "accept-encoding"), "{to_node:?}");
}

fn response_headers(headers: &[(&str, &str)], end: bool) {
    envoy(|e| {
        e.response_headers = headers.iter().map(|(n, v)| (n.to_string(), v.as_bytes().to_vec())).collect();
        e.in_callback = true;
        e.end_seen = end;
    });
    let result = action(unsafe { abi::proxy_on_response_headers(stream(), headers.len(), end) });
    envoy(|e| match result {
        Action::Continue if !e.stopped => {
            e.send_headers();
            e.ended = end;
        }
        Action::Continue => e.resume(),
        _ => {
            e.stopped = true;
            if e.stops_all_at_headers {
                e.withheld = Some((Vec::new(), false));
            }
        }
    });
}

/// `FilterManager::encodeData` through the Wasm context's `encodeData`.
fn body(data: &[u8], end: bool) {
    let withheld = envoy(|e| {
        let (kept, ended) = e.withheld.as_mut()?;
        kept.extend_from_slice(data);
        *ended = end;
        Some(())
    });
    if withheld.is_some() {
        return;
    }
    let size = envoy(|e| {
        e.end_seen = end;
        e.in_callback = true;
        let mut data = data.to_vec();
        if e.buffering {
            e.held.get_or_insert_with(Vec::new).append(&mut data);
        }
        e.data = Some(data);
        e.body().map_or(0, |b| b.len())
    });
    let result = action(unsafe { abi::proxy_on_response_body(stream(), size, end) });
    envoy(|e| {
        let mut data = e.data.take().unwrap_or_default();
        e.buffering = result == Action::Pause;
        match result {
            Action::Continue if e.stopped => {
                e.held.get_or_insert_with(Vec::new).append(&mut data);
                e.resume();
            }
            Action::Continue => {
                e.sent.append(&mut data);
                e.ended = end;
            }
            _ => {
                e.stopped = true;
                e.held.get_or_insert_with(Vec::new).append(&mut data);
            }
        }
    });
}

fn trailers() {
    envoy(|e| e.in_callback = true);
    let result = action(unsafe { abi::proxy_on_response_trailers(stream(), 1) });
    envoy(|e| {
        e.trailers_waiting = true;
        match result {
            Action::Continue if e.stopped => e.resume(),
            Action::Continue => {
                e.trailers_waiting = false;
                e.trailers_sent = true;
                e.ended = true;
            }
            _ => e.stopped = true,
        }
    });
}

/// A root tick, if the filter asked for ticks.
fn tick() {
    if envoy(|e| e.tick_ms) == 0 {
        return;
    }
    envoy(|e| e.in_callback = true);
    unsafe { abi::proxy_on_tick(envoy(|e| e.root)) };
    after_call();
}

/// Ticks until the filter stops asking or the response ends.
fn tick_until_quiet() {
    for _ in 0..100 {
        if envoy(|e| e.tick_ms == 0 || e.ended || e.failed.is_some()) {
            return;
        }
        std::thread::sleep(Duration::from_millis(u64::from(envoy(|e| e.tick_ms))));
        tick();
    }
}

/// What the client got, checked whole: a gzip body that decodes to `original`, nothing left in
/// Envoy's buffers.
fn assert_delivered_gzip(original: &[u8]) {
    envoy(|e| {
        assert!(e.failed.is_none(), "the response failed: {:?}", e.failed);
        assert!(e.ended, "the response never ended");
        assert!(e.held.as_ref().map_or(true, Vec::is_empty), "output left in Envoy's held body");
        assert_eq!(e.header("content-encoding").as_deref(), Some("gzip"));
        assert_eq!(gunzip(&e.sent), original);
    });
}

fn gunzip(body: &[u8]) -> Vec<u8> {
    assert!(body.len() >= 18 && body[..3] == [0x1f, 0x8b, 8], "not a gzip member");
    let decoded = miniz_oxide::inflate::decompress_to_vec(&body[10..body.len() - 8]).expect("a whole deflate stream");
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
const CHUNKED: &[(&str, &str)] = &[(":status", "200"), ("content-type", "application/json")];

/// Sleeps past the core's stream_delay, then ticks.
fn tick_after_delay() {
    std::thread::sleep(Duration::from_millis(5));
    tick();
}

#[test]
fn a_read_after_a_tick_resumed_is_sent_without_a_second_resume() {
    let original = json(40_000);
    start(CONFIG);
    response_headers(CHUNKED, false);
    body(&original[..10_000], false);
    tick_after_delay(); // streams what it holds, and resumes Envoy
    assert!(envoy(|e| !e.stopped && !e.sent.is_empty()), "the tick sent the held part");
    body(&original[10_000..20_000], false);
    tick_until_quiet();
    body(&original[20_000..], true);
    tick_until_quiet();
    assert_delivered_gzip(&original);
    assert_eq!(envoy(|e| e.header("content-length")), None);
}

#[test]
fn trailers_after_a_tick_resumed_end_the_body() {
    let original = json(30_000);
    start(CONFIG);
    response_headers(CHUNKED, false);
    body(&original, false);
    tick_after_delay();
    trailers();
    tick_until_quiet();
    assert_delivered_gzip(&original);
    assert!(envoy(|e| e.trailers_sent));
}

#[test]
fn a_body_streamed_from_its_head_ends_in_trailers() {
    // A known length above max_buffer streams from the headers on; every read has output.
    let original = json(200_000);
    let length = original.len().to_string();
    start(CONFIG);
    response_headers(&[CHUNKED[0], CHUNKED[1], ("content-length", &length)], false);
    for piece in original.chunks(50_000) {
        body(piece, false);
    }
    trailers();
    tick_until_quiet();
    assert_delivered_gzip(&original);
    assert!(envoy(|e| e.trailers_sent));
}

#[test]
fn every_interleaving_of_reads_and_ticks_delivers_the_whole_body() {
    // Each step: a read, with or without a tick (after the delay) before it; then the end as a
    // last read or as trailers.
    let original = json(24_000);
    for pattern in 0u32..64 {
        for end_in_trailers in [false, true] {
            start_taught(CONFIG);
            response_headers(CHUNKED, false);
            let pieces: Vec<_> = original.chunks(4_000).collect();
            for (i, piece) in pieces.iter().enumerate() {
                if pattern & (1 << i) != 0 {
                    tick_after_delay();
                }
                body(piece, i + 1 == pieces.len() && !end_in_trailers);
            }
            if end_in_trailers {
                trailers();
            }
            tick_until_quiet();
            assert_delivered_gzip(&original);
        }
    }
}

#[test]
fn a_head_whose_body_envoy_withholds_goes_on_as_the_node_sent_it_at_the_bound() {
    let original = json(5_000);
    let length = original.len().to_string();
    let head = [CHUNKED[0], CHUNKED[1], ("content-length", length.as_str())];
    // Envoy without allow_on_headers_stop_iteration: no body comes to the held head
    start(CONFIG);
    envoy(|e| e.stops_all_at_headers = true);
    response_headers(&head, false);
    body(&original, true);
    assert!(envoy(|e| e.headers_sent.is_none()), "held for the exact length");
    tick_until_quiet();
    envoy(|e| {
        assert!(e.ended && e.failed.is_none(), "the response never ended");
        assert_eq!(e.headers_sent.as_ref(), Some(&e.response_headers), "the node's head, unchanged");
        assert_eq!(e.sent, original);
    });
}

#[test]
fn a_configuration_that_saw_a_body_come_to_a_held_head_holds_the_next_for_its_body() {
    let original = json(5_000);
    let length = original.len().to_string();
    start_taught(CONFIG);
    response_headers(&[CHUNKED[0], CHUNKED[1], ("content-length", length.as_str())], false);
    tick_after_delay();
    body(&original, true);
    tick_until_quiet();
    assert_delivered_gzip(&original);
    assert_eq!(envoy(|e| e.header("content-length")), Some(envoy(|e| e.sent.len()).to_string()));
}

// The host calls, as Envoy answers them for this one response.

fn give(bytes: &[u8], data: *mut *mut u8, size: *mut usize) {
    // The SDK takes ownership as a Vec of exactly this capacity.
    let boxed = bytes.to_vec().into_boxed_slice();
    unsafe {
        *size = boxed.len();
        *data = if boxed.is_empty() { std::ptr::null_mut() } else { Box::into_raw(boxed).cast() };
    }
}

unsafe fn slice<'a>(data: *const u8, size: usize) -> &'a [u8] {
    if size == 0 {
        &[]
    } else {
        unsafe { std::slice::from_raw_parts(data, size) }
    }
}

fn serialize(map: &[(String, Vec<u8>)]) -> Vec<u8> {
    let mut out = (map.len() as u32).to_le_bytes().to_vec();
    for (name, value) in map {
        out.extend_from_slice(&(name.len() as u32).to_le_bytes());
        out.extend_from_slice(&(value.len() as u32).to_le_bytes());
    }
    for (name, value) in map {
        out.extend_from_slice(name.as_bytes());
        out.push(0);
        out.extend_from_slice(value);
        out.push(0);
    }
    out
}

/// Response headers are writable until they went out; the request's, for the node.
fn response_headers_mut<T>(map: MapType, f: impl FnOnce(&mut Vec<(String, Vec<u8>)>) -> T) -> Result<T, Status> {
    envoy(|e| {
        if matches!(map, MapType::HttpRequestHeaders) {
            return Ok(f(e.request_headers()));
        }
        if !matches!(map, MapType::HttpResponseHeaders) {
            e.violations.push(format!("unexpected map {map:?}"));
        } else if e.headers_sent.is_some() {
            e.violations.push("response headers changed after they went out".into());
        }
        Ok(f(&mut e.response_headers))
    })
}

#[no_mangle]
extern "C" fn proxy_log(_level: LogLevel, data: *const u8, size: usize) -> Status {
    eprintln!("{}", String::from_utf8_lossy(unsafe { slice(data, size) }));
    Status::Ok
}

#[no_mangle]
extern "C" fn proxy_get_log_level(level: *mut LogLevel) -> Status {
    unsafe { *level = LogLevel::Info };
    Status::Ok
}

#[no_mangle]
extern "C" fn proxy_set_tick_period_milliseconds(period: u32) -> Status {
    envoy(|e| e.tick_ms = period);
    Status::Ok
}

#[no_mangle]
extern "C" fn proxy_set_effective_context(context_id: u32) -> Status {
    if envoy(|e| e.stream) == context_id {
        Status::Ok
    } else {
        Status::NotFound
    }
}

#[no_mangle]
extern "C" fn proxy_get_buffer_bytes(
    buffer: BufferType,
    start: usize,
    max_size: usize,
    data: *mut *mut u8,
    size: *mut usize,
) -> Status {
    envoy(|e| {
        let bytes = match buffer {
            BufferType::PluginConfiguration => e.config.clone(),
            BufferType::HttpResponseBody => match e.body() {
                Some(body) => body.clone(),
                None => return Status::NotFound,
            },
            _ => return Status::NotFound,
        };
        let start = start.min(bytes.len());
        give(&bytes[start..(start.saturating_add(max_size)).min(bytes.len())], data, size);
        Status::Ok
    })
}

#[no_mangle]
extern "C" fn proxy_set_buffer_bytes(
    buffer: BufferType,
    start: usize,
    size: usize,
    data: *const u8,
    data_size: usize,
) -> Status {
    let data = unsafe { slice(data, data_size) };
    envoy(|e| {
        if !matches!(buffer, BufferType::HttpResponseBody) {
            e.violations.push(format!("a write into {buffer:?}"));
        }
        let Some(body) = e.body() else { return Status::NotFound };
        if start == 0 {
            body.drain(..size.min(body.len()));
            body.splice(0..0, data.iter().copied());
        } else if start >= body.len() {
            body.extend_from_slice(data);
        } else {
            return Status::BadArgument;
        }
        Status::Ok
    })
}

#[no_mangle]
extern "C" fn proxy_get_header_map_pairs(map: MapType, data: *mut *mut u8, size: *mut usize) -> Status {
    let bytes = match map {
        MapType::HttpRequestHeaders => envoy(|e| serialize(e.request_headers())),
        _ => envoy(|e| serialize(&e.response_headers)),
    };
    give(&bytes, data, size);
    Status::Ok
}

#[no_mangle]
extern "C" fn proxy_replace_header_map_value(
    map: MapType,
    key: *const u8,
    key_size: usize,
    value: *const u8,
    value_size: usize,
) -> Status {
    let (key, value) = unsafe { (String::from_utf8_lossy(slice(key, key_size)).into_owned(), slice(value, value_size)) };
    response_headers_mut(map, |headers| {
        headers.retain(|(n, _)| *n != key);
        headers.push((key, value.to_vec()));
    })
    .map_or_else(|s| s, |()| Status::Ok)
}

#[no_mangle]
extern "C" fn proxy_add_header_map_value(
    map: MapType,
    key: *const u8,
    key_size: usize,
    value: *const u8,
    value_size: usize,
) -> Status {
    let (key, value) = unsafe { (String::from_utf8_lossy(slice(key, key_size)).into_owned(), slice(value, value_size)) };
    response_headers_mut(map, |headers| headers.push((key, value.to_vec()))).map_or_else(|s| s, |()| Status::Ok)
}

#[no_mangle]
extern "C" fn proxy_remove_header_map_value(map: MapType, key: *const u8, key_size: usize) -> Status {
    let key = unsafe { String::from_utf8_lossy(slice(key, key_size)).into_owned() };
    response_headers_mut(map, |headers| headers.retain(|(n, _)| *n != key)).map_or_else(|s| s, |()| Status::Ok)
}

#[no_mangle]
extern "C" fn proxy_continue_stream(stream: StreamType) -> Status {
    envoy(|e| {
        if !matches!(stream, StreamType::HttpResponse) {
            e.violations.push(format!("continue of {stream:?}"));
        } else if e.in_callback {
            e.continue_after_call = true;
        } else {
            e.resume();
        }
    });
    Status::Ok
}

#[no_mangle]
extern "C" fn proxy_close_stream(_stream: StreamType) -> Status {
    envoy(|e| e.failed = Some("reset".into()));
    Status::Ok
}

#[no_mangle]
extern "C" fn proxy_send_local_response(
    status: u32,
    _details: *const u8,
    _details_size: usize,
    _body: *const u8,
    _body_size: usize,
    _headers: *const u8,
    _headers_size: usize,
    _grpc_status: i32,
) -> Status {
    envoy(|e| e.failed = Some(format!("local reply {status}")));
    Status::Ok
}

#[no_mangle]
extern "C" fn proxy_define_metric(_kind: MetricType, _name: *const u8, _name_size: usize, id: *mut u32) -> Status {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(1);
    unsafe { *id = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) };
    Status::Ok
}

#[no_mangle]
extern "C" fn proxy_increment_metric(_id: u32, _offset: i64) -> Status {
    Status::Ok
}

#[no_mangle]
extern "C" fn proxy_record_metric(_id: u32, _value: u64) -> Status {
    Status::Ok
}

/// Host calls the filter never makes (the SDK's trait defaults refer to them): calling one fails
/// the test (the SDK panics on the status, or the violation is reported after the call).
macro_rules! not_modelled {
    ($($name:ident),* $(,)?) => {$(
        #[no_mangle]
        extern "C" fn $name() -> Status {
            envoy(|e| e.violations.push(concat!("the filter called ", stringify!($name)).into()));
            Status::InternalFailure
        }
    )*};
}

not_modelled!(
    proxy_call_foreign_function,
    proxy_dequeue_shared_queue,
    proxy_done,
    proxy_enqueue_shared_queue,
    proxy_get_current_time_nanoseconds,
    proxy_get_header_map_value,
    proxy_get_property,
    proxy_get_shared_data,
    proxy_get_status,
    proxy_grpc_call,
    proxy_grpc_cancel,
    proxy_grpc_close,
    proxy_grpc_send,
    proxy_grpc_stream,
    proxy_http_call,
    proxy_register_shared_queue,
    proxy_resolve_shared_queue,
    proxy_set_header_map_pairs,
    proxy_set_property,
    proxy_set_shared_data,
);
