//! The C ABI for the nginx module and the Lua binding.
//!
//! Handle-based: settings are made once per configuration and shared; an exchange is made per
//! request from them and freed by the host (nginx registers the free as a pool cleanup). No panic
//! crosses this boundary: each entry point catches it and reports a failure instead.

use std::ffi::{c_char, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;
use std::slice;
use std::sync::Arc;

use rpcedge_core::config::{
    check_field, check_type, parse_beacon_network, CacheConfig, Config, ConfigError, Level, Settings,
};
use rpcedge_core::transcode::BeaconNetwork;
use rpcedge_core::exchange::{
    BodyPlan, EtagEdit, Exchange, Failure, HeaderEdits, LengthEdit, Mode, Output, TranscodeOutcome, WholeBody,
};
use rpcedge_core::node::Node;

mod cache;
mod metrics;
#[cfg(test)]
mod tests;

pub use cache::*;

/// Opaque validated settings, and what their exchanges learn about the node.
pub struct RpcedgeSettings(Arc<Settings>, Arc<Node>);

/// Opaque per-request exchange, with the header list its last edits point to.
pub struct RpcedgeExchange(Exchange, Vec<RpcedgeHeader>);

/// Opaque whole-body compression job, owned by whoever holds it (see `RPCEDGE_OUT_WORK`).
pub struct RpcedgeJob(WholeBody);

/// A byte string: given by the caller, who owns it (e.g. one of nginx's `ngx_str_t`
/// rearranged), or given back, owned by the core (a static name, or bytes that live as long as
/// the handle they came from). Not NUL-terminated.
#[repr(C)]
pub struct RpcedgeStr {
    pub data: *const u8,
    pub len: usize,
}

impl RpcedgeStr {
    /// None: NULL data, no length.
    const NONE: RpcedgeStr = RpcedgeStr { data: ptr::null(), len: 0 };

    fn of(bytes: &[u8]) -> RpcedgeStr {
        RpcedgeStr { data: bytes.as_ptr(), len: bytes.len() }
    }
}

/// The configuration as a host with its own parser (nginx) holds it.
#[repr(C)]
pub struct RpcedgeConfig {
    pub min_length: u64,
    pub max_buffer: u64,
    /// 0: `auto` (by the body's size); else a libdeflate level, 1 to 12.
    pub level: u32,
    pub stream_level: u32,
    pub stream_delay_ms: u64,
    pub offload_min_length: u64,
    /// Non-zero: transcode for clients that ask for SSZ.
    pub transcode: u8,
    pub transcode_max: u64,
    pub transcode_hold_max: u64,
    pub transcode_budget: u64,
    /// Non-zero: ask the node for SSZ and render JSON clients' answers here.
    pub transcode_upstream_ssz: u8,
    /// The beacon chain whose fork digests frame light client updates (`rpcedge_parse_beacon_network`);
    /// 0: none.
    pub beacon_network: u32,
    /// Media type patterns; none at all means the defaults.
    pub types: *const RpcedgeStr,
    pub types_len: usize,
    /// The cache's settings (nginx's `rpcedge_cache_*` directives): the timeouts (the store's the
    /// host applies itself; each lookup call says its own) and the limits its exchanges run with.
    pub cache_timeout_ms: u64,
    pub cache_store_timeout_s: u64,
    pub cache_max_request: u64,
    pub cache_max_entry: u64,
    pub cache_chain_ttl_s: u64,
    pub cache_max_batch: u64,
    /// How many daemons share the keys (`rpcedge_cache_shards`).
    pub cache_shards: u64,
    /// How long a miss waits for another request's answer for its key; 0: never.
    pub cache_lock_timeout_ms: u64,
}

/// Where a configuration error is written: the field's name and a message, NUL-terminated and
/// cut to fit.
#[repr(C)]
pub struct RpcedgeError {
    pub field: [c_char; 32],
    pub message: [c_char; 224],
}

/// `rpcedge_exchange_response_head`'s body plans (the core's `BodyPlan`).
pub const RPCEDGE_PLAN_PASS: u8 = 0;
pub const RPCEDGE_PLAN_BUFFER: u8 = 1;
pub const RPCEDGE_PLAN_STREAM: u8 = 2;

const _: () = assert!(
    RPCEDGE_PLAN_PASS == BodyPlan::Pass as u8
        && RPCEDGE_PLAN_BUFFER == BodyPlan::Buffer as u8
        && RPCEDGE_PLAN_STREAM == BodyPlan::Stream as u8
);

/// `rpcedge_header_edits.content_length_op` and `.etag_op`
pub const RPCEDGE_EDIT_KEEP: u8 = 0;
pub const RPCEDGE_EDIT_SET: u8 = 1;
pub const RPCEDGE_EDIT_REMOVE: u8 = 2;

/// What `rpcedge_exchange_failure` and `_abort` return for "reset the stream".
pub const RPCEDGE_FAILURE_RESET: u16 = 0;

/// A response header to set: `name` is static, `value` lives as the edits that list it.
#[repr(C)]
pub struct RpcedgeHeader {
    pub name: *const u8,
    pub name_len: usize,
    pub value: *const u8,
    pub value_len: usize,
}

/// Header changes to apply before the headers go out. Pointers are valid until the next call on
/// the exchange.
#[repr(C)]
pub struct RpcedgeHeaderEdits {
    /// No data: leave Content-Encoding alone; otherwise the coding's token (static).
    pub content_encoding: RpcedgeStr,
    /// One of `RPCEDGE_EDIT_*`.
    pub content_length_op: u8,
    /// One of `RPCEDGE_EDIT_*`; with `RPCEDGE_EDIT_SET`, the new value is `etag`.
    pub etag_op: u8,
    /// Append `Vary: Accept-Encoding`.
    pub add_vary: u8,
    pub remove_accept_ranges: u8,
    /// Append `Vary: Accept`.
    pub add_vary_accept: u8,
    /// Remove the node's Content-Encoding (the body was decoded), before `content_encoding`.
    pub remove_content_encoding: u8,
    pub content_length: u64,
    pub etag: *const u8,
    pub etag_len: usize,
    /// NULL: leave Content-Type alone; otherwise the new value (static).
    pub content_type: *const u8,
    pub content_type_len: usize,
    /// Headers to set, replacing any of the same name.
    pub set: *const RpcedgeHeader,
    pub set_len: usize,
}

impl RpcedgeHeaderEdits {
    /// No edits: what a host applies when it learns nothing else.
    const NONE: RpcedgeHeaderEdits = RpcedgeHeaderEdits {
        content_encoding: RpcedgeStr::NONE,
        content_length_op: RPCEDGE_EDIT_KEEP,
        etag_op: RPCEDGE_EDIT_KEEP,
        add_vary: 0,
        remove_accept_ranges: 0,
        add_vary_accept: 0,
        remove_content_encoding: 0,
        content_length: 0,
        etag: ptr::null(),
        etag_len: 0,
        content_type: ptr::null(),
        content_type_len: 0,
        set: ptr::null(),
        set_len: 0,
    };
}

/// `rpcedge_output.flags`
pub const RPCEDGE_OUT_HEADERS: u32 = 1;
pub const RPCEDGE_OUT_FLUSH: u32 = 2;
pub const RPCEDGE_OUT_END: u32 = 4;
/// Only after `rpcedge_exchange_offload`: the body is in and its compression waits as a job, to
/// take with `rpcedge_exchange_take_job`, run on a thread and give back.
pub const RPCEDGE_OUT_WORK: u32 = 8;
/// More of the body is ready: once the data is on its way, feed an empty chunk (no flags) for it.
pub const RPCEDGE_OUT_MORE: u32 = 16;

/// `rpcedge_exchange_feed` flags
pub const RPCEDGE_FEED_END: u32 = 1;
pub const RPCEDGE_FEED_FLUSH: u32 = 2;

/// The bytes to send for one feed; `data` is valid until the next call on the exchange.
#[repr(C)]
pub struct RpcedgeOutput {
    pub data: *const u8,
    pub len: usize,
    /// `RPCEDGE_OUT_*` bits. With `RPCEDGE_OUT_HEADERS`, `edits` holds the header changes and the
    /// held headers go out now, before `data`.
    pub flags: u32,
    pub edits: RpcedgeHeaderEdits,
}

impl RpcedgeOutput {
    /// Nothing to send: what every out-parameter holds when a call fails.
    const NONE: RpcedgeOutput =
        RpcedgeOutput { data: ptr::null(), len: 0, flags: 0, edits: RpcedgeHeaderEdits::NONE };
}

fn write_error(out: *mut RpcedgeError, error: &ConfigError) {
    fn copy(dst: &mut [c_char], src: &str) {
        let n = src.len().min(dst.len() - 1);
        for (d, s) in dst.iter_mut().zip(&src.as_bytes()[..n]) {
            *d = *s as c_char;
        }
        dst[n] = 0;
    }
    if let Some(out) = unsafe { out.as_mut() } {
        copy(&mut out.field, &error.field);
        copy(&mut out.message, &error.message);
    }
}

unsafe fn bytes<'a>(data: *const u8, len: usize) -> &'a [u8] {
    if data.is_null() || len == 0 {
        &[]
    } else {
        slice::from_raw_parts(data, len)
    }
}

#[cfg(test)]
thread_local! {
    /// Makes the next guarded call panic, to test every entry point's fallback.
    static PANIC_NEXT: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f`, turning a panic into `fallback`: no panic unwinds into C.
fn guard<T>(fallback: T, f: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(|| {
        #[cfg(test)]
        if PANIC_NEXT.take() {
            panic!("injected by a test");
        }
        f()
    }))
    .unwrap_or(fallback)
}

/// Writes `value` where `out` points, when it points anywhere.
unsafe fn put<T>(out: *mut T, value: T) {
    if let Some(out) = out.as_mut() {
        *out = value;
    }
}

fn panicked() -> ConfigError {
    ConfigError { field: "config".into(), message: "internal error".into() }
}

/// Checks one numeric setting by name (e.g. "level"); 0 when valid, -1 with `err` filled in.
///
/// # Safety
/// `field` is NULL or a NUL-terminated string; `err` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn rpcedge_check_field(field: *const c_char, value: u64, err: *mut RpcedgeError) -> i32 {
    let result = guard(Err(panicked()), || {
        if field.is_null() {
            return Err(ConfigError { field: "config".into(), message: "no field named".into() });
        }
        let name = CStr::from_ptr(field).to_string_lossy();
        check_field(&name, value)
    });
    result.map_or_else(|e| { write_error(err, &e); -1 }, |()| 0)
}

/// Checks one media type pattern; 0 when valid, -1 with `err` filled in.
///
/// # Safety
/// `pattern` points to `len` readable bytes; `err` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn rpcedge_check_type(pattern: *const u8, len: usize, err: *mut RpcedgeError) -> i32 {
    let result = guard(Err(panicked()), || check_type(&String::from_utf8_lossy(bytes(pattern, len))));
    result.map_or_else(|e| { write_error(err, &e); -1 }, |()| 0)
}

/// Parses a `level` value (`auto` or 1 to 12) into `out` in `RpcedgeConfig`'s form (0: auto);
/// 0 when valid, -1 with `err` filled in.
///
/// # Safety
/// `value` points to `len` readable bytes; `out` and `err` are NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn rpcedge_parse_level(value: *const u8, len: usize, out: *mut u32, err: *mut RpcedgeError) -> i32 {
    let result = guard(Err(panicked()), || Level::parse(&String::from_utf8_lossy(bytes(value, len))));
    match result {
        Ok(level) => {
            if !out.is_null() {
                *out = level.to_raw();
            }
            0
        }
        Err(e) => {
            write_error(err, &e);
            -1
        }
    }
}

/// Parses a `beacon_network` value (`off`, `mainnet`, `sepolia`, `hoodi` or `holesky`) into `out`
/// in `RpcedgeConfig`'s form (0: off); 0 when valid, -1 with `err` filled in.
///
/// # Safety
/// `value` points to `len` readable bytes; `out` and `err` are NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn rpcedge_parse_beacon_network(
    value: *const u8,
    len: usize,
    out: *mut u32,
    err: *mut RpcedgeError,
) -> i32 {
    let result = guard(Err(panicked()), || parse_beacon_network(&String::from_utf8_lossy(bytes(value, len))));
    match result {
        Ok(network) => {
            put(out, BeaconNetwork::to_raw(network));
            0
        }
        Err(e) => {
            write_error(err, &e);
            -1
        }
    }
}

/// Validates a configuration; NULL with `err` filled in when a value is out of range.
///
/// # Safety
/// `config` is NULL or valid, its `types` array holds `types_len` valid strings; `err` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn rpcedge_settings_new(config: *const RpcedgeConfig, err: *mut RpcedgeError) -> *mut RpcedgeSettings {
    let result = guard(Err(panicked()), || {
        let Some(c) = config.as_ref() else {
            return Err(ConfigError { field: "config".into(), message: "no configuration given".into() });
        };
        let types = if c.types_len == 0 || c.types.is_null() {
            Config::default().types
        } else {
            slice::from_raw_parts(c.types, c.types_len)
                .iter()
                .map(|t| String::from_utf8_lossy(bytes(t.data, t.len)).into_owned())
                .collect()
        };
        let cache = CacheConfig {
            timeout_ms: c.cache_timeout_ms,
            store_timeout_s: c.cache_store_timeout_s,
            max_request: c.cache_max_request,
            max_entry: c.cache_max_entry,
            chain_ttl_s: c.cache_chain_ttl_s,
            max_batch: c.cache_max_batch,
            lock_timeout_ms: c.cache_lock_timeout_ms,
            // the host routes each shard's calls itself: the names only count the shards
            clusters: (0..c.cache_shards).map(|shard| format!("shard {shard}")).collect(),
            ..CacheConfig::default()
        };
        Config {
            min_length: c.min_length,
            max_buffer: c.max_buffer,
            level: Level::from_raw(c.level),
            stream_level: c.stream_level,
            stream_delay_ms: c.stream_delay_ms,
            offload_min_length: c.offload_min_length,
            transcode: c.transcode != 0,
            transcode_max: c.transcode_max,
            transcode_hold_max: c.transcode_hold_max,
            transcode_budget: c.transcode_budget,
            transcode_upstream_ssz: c.transcode_upstream_ssz != 0,
            beacon_network: BeaconNetwork::from_raw(c.beacon_network),
            buffer_limit: None,
            types,
            cache: None,
        }
        .validate_with(&cache)
    });
    settings_handle(result, err)
}

/// Validates a JSON configuration (as Envoy and the Lua binding hold it); an empty one means the
/// defaults.
///
/// # Safety
/// `json` points to `len` readable bytes; `err` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn rpcedge_settings_from_json(json: *const u8, len: usize, err: *mut RpcedgeError) -> *mut RpcedgeSettings {
    let result = guard(Err(panicked()), || Config::from_json(bytes(json, len)));
    settings_handle(result, err)
}

fn settings_handle(result: Result<Settings, ConfigError>, err: *mut RpcedgeError) -> *mut RpcedgeSettings {
    match result {
        Ok(settings) => Box::into_raw(Box::new(RpcedgeSettings(Arc::new(settings), Arc::default()))),
        Err(e) => {
            write_error(err, &e);
            ptr::null_mut()
        }
    }
}

/// The defaults, for a host that sets only some fields.
#[no_mangle]
pub extern "C" fn rpcedge_config_default() -> RpcedgeConfig {
    let (d, cache) = (Config::default(), CacheConfig::default());
    RpcedgeConfig {
        min_length: d.min_length,
        max_buffer: d.max_buffer,
        level: d.level.to_raw(),
        stream_level: d.stream_level,
        stream_delay_ms: d.stream_delay_ms,
        offload_min_length: d.offload_min_length,
        transcode: d.transcode.into(),
        transcode_max: d.transcode_max,
        transcode_hold_max: d.transcode_hold_max,
        transcode_budget: d.transcode_budget,
        transcode_upstream_ssz: d.transcode_upstream_ssz.into(),
        beacon_network: BeaconNetwork::to_raw(d.beacon_network),
        types: ptr::null(),
        types_len: 0,
        cache_timeout_ms: cache.timeout_ms,
        cache_store_timeout_s: cache.store_timeout_s,
        cache_max_request: cache.max_request,
        cache_max_entry: cache.max_entry,
        cache_chain_ttl_s: cache.chain_ttl_s,
        cache_max_batch: cache.max_batch,
        cache_shards: cache.clusters.len() as u64,
        cache_lock_timeout_ms: cache.lock_timeout_ms,
    }
}

/// # Safety
/// `settings` came from `rpcedge_settings_new` or `_from_json` and is freed once; exchanges made
/// from it keep their own reference.
#[no_mangle]
pub unsafe extern "C" fn rpcedge_settings_free(settings: *mut RpcedgeSettings) {
    if !settings.is_null() {
        guard((), || drop(Box::from_raw(settings)));
    }
}

/// A new exchange; NULL when `settings` is NULL (or on allocation failure).
///
/// # Safety
/// `settings` is NULL or a live settings handle.
#[no_mangle]
pub unsafe extern "C" fn rpcedge_exchange_new(settings: *const RpcedgeSettings) -> *mut RpcedgeExchange {
    guard(ptr::null_mut(), || {
        let Some(settings) = settings.as_ref() else { return ptr::null_mut() };
        let exchange = Exchange::new(Arc::clone(&settings.0), Arc::clone(&settings.1));
        Box::into_raw(Box::new(RpcedgeExchange(exchange, Vec::new())))
    })
}

/// Runs `f` on a live exchange; a NULL one does nothing.
unsafe fn with(exchange: *mut RpcedgeExchange, f: impl FnOnce(&mut Exchange)) {
    if let Some(exchange) = exchange.as_mut() {
        f(&mut exchange.0);
    }
}

/// # Safety
/// `exchange` is NULL or came from `rpcedge_exchange_new`, and is freed once.
#[no_mangle]
pub unsafe extern "C" fn rpcedge_exchange_free(exchange: *mut RpcedgeExchange) {
    if !exchange.is_null() {
        guard((), || drop(Box::from_raw(exchange)));
    }
}

/// # Safety
/// `exchange` is live; `method` points to `len` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn rpcedge_exchange_request_method(exchange: *mut RpcedgeExchange, method: *const u8, len: usize) {
    guard((), || with(exchange, |ex| ex.request_method(bytes(method, len))));
}

/// The request's path, with or without its query (nginx's `r->uri`, Envoy's `:path`).
///
/// # Safety
/// `exchange` is live; `path` points to `len` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn rpcedge_exchange_request_path(exchange: *mut RpcedgeExchange, path: *const u8, len: usize) {
    guard((), || with(exchange, |ex| ex.request_path(bytes(path, len))));
}

/// Feeds one request header line.
///
/// # Safety
/// `exchange` is live; the strings point to readable bytes of the given lengths.
#[no_mangle]
pub unsafe extern "C" fn rpcedge_exchange_request_header(
    exchange: *mut RpcedgeExchange,
    name: *const u8,
    name_len: usize,
    value: *const u8,
    value_len: usize,
) {
    guard((), || with(exchange, |ex| ex.request_header(bytes(name, name_len), bytes(value, value_len))));
}

/// Feeds one response header line.
///
/// # Safety
/// As for `rpcedge_exchange_request_header`.
#[no_mangle]
pub unsafe extern "C" fn rpcedge_exchange_response_header(
    exchange: *mut RpcedgeExchange,
    name: *const u8,
    name_len: usize,
    value: *const u8,
    value_len: usize,
) {
    guard((), || with(exchange, |ex| ex.response_header(bytes(name, name_len), bytes(value, value_len))));
}

/// The response's Content-Length where the host keeps it apart from the header list; negative
/// for none.
///
/// # Safety
/// `exchange` is live.
#[no_mangle]
pub unsafe extern "C" fn rpcedge_exchange_response_content_length(exchange: *mut RpcedgeExchange, length: i64) {
    guard((), || with(exchange, |ex| ex.response_content_length(u64::try_from(length).ok())));
}

/// After the request head: 1 when the core needs the request body (give it whole with
/// `rpcedge_exchange_request_body`), 0 when not.
///
/// # Safety
/// `exchange` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn rpcedge_exchange_wants_request_body(exchange: *const RpcedgeExchange) -> u8 {
    guard(0, || exchange.as_ref().is_some_and(|ex| ex.0.wants_request_body()).into())
}

/// The whole request body, when the core wants it; a host that cannot hold it whole skips this.
///
/// # Safety
/// `exchange` is live; `body` points to `len` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn rpcedge_exchange_request_body(exchange: *mut RpcedgeExchange, body: *const u8, len: usize) {
    guard((), || with(exchange, |ex| ex.request_body(bytes(body, len))));
}

/// After the request head (and its body, when the core wanted it), before the request goes on:
/// the Accept to send the node in place of the client's (static), or no data to leave the
/// request alone. With one, the host also drops Accept-Encoding towards the node.
///
/// # Safety
/// `exchange` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn rpcedge_exchange_upstream_accept(exchange: *mut RpcedgeExchange) -> RpcedgeStr {
    guard(RpcedgeStr::NONE, || {
        let accept = exchange.as_mut().and_then(|ex| ex.0.upstream_accept());
        accept.map_or(RpcedgeStr::NONE, |accept| RpcedgeStr::of(accept.as_bytes()))
    })
}

/// The host's cache may keep the node's answer to this request (it looks the request up): the
/// node is then asked for identity too (`rpcedge_exchange_node_identity`).
///
/// # Safety
/// `exchange` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn rpcedge_exchange_cache_may_keep(exchange: *mut RpcedgeExchange) {
    guard((), || with(exchange, |ex| ex.cache_may_keep()));
}

/// After the request head (and `rpcedge_exchange_upstream_accept`): 1 when the host removes
/// Accept-Encoding from the request to the node, which is then to answer identity (rpcedge may
/// compress, transcode or keep the answer, and could do none of these with an encoded one).
///
/// # Safety
/// `exchange` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn rpcedge_exchange_node_identity(exchange: *const RpcedgeExchange) -> i32 {
    guard(0, || exchange.as_ref().is_some_and(|ex| ex.0.node_identity()) as i32)
}

/// Decides the body plan once the response headers are in: one of `RPCEDGE_PLAN_*`. For pass
/// and stream, `edits` is filled with the changes to apply now. Should the core fail here, the
/// plan is pass and `edits` holds no change: the response goes out as it came.
///
/// # Safety
/// `exchange` is NULL or live; `edits` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn rpcedge_exchange_response_head(
    exchange: *mut RpcedgeExchange,
    status: u16,
    edits: *mut RpcedgeHeaderEdits,
) -> u8 {
    put(edits, RpcedgeHeaderEdits::NONE);
    guard(RPCEDGE_PLAN_PASS, || {
        let Some(exchange) = exchange.as_mut() else { return RPCEDGE_PLAN_PASS };
        let plan = exchange.0.response_head(status);
        put(edits, c_edits(exchange.0.edits(), &mut exchange.1));
        plan as u8
    })
}

fn c_edits(edits: &HeaderEdits, set: &mut Vec<RpcedgeHeader>) -> RpcedgeHeaderEdits {
    set.clear();
    set.extend(edits.set.iter().map(|(name, value)| RpcedgeHeader {
        name: name.as_ptr(),
        name_len: name.len(),
        value: value.as_ptr(),
        value_len: value.len(),
    }));
    let (content_length_op, content_length) = match edits.content_length {
        LengthEdit::Keep => (RPCEDGE_EDIT_KEEP, 0),
        LengthEdit::Set(n) => (RPCEDGE_EDIT_SET, n),
        LengthEdit::Remove => (RPCEDGE_EDIT_REMOVE, 0),
    };
    let (etag_op, etag) = match &edits.etag {
        EtagEdit::Keep => (RPCEDGE_EDIT_KEEP, &[][..]),
        EtagEdit::Set(value) => (RPCEDGE_EDIT_SET, &value[..]),
        EtagEdit::Remove => (RPCEDGE_EDIT_REMOVE, &[][..]),
    };
    RpcedgeHeaderEdits {
        content_encoding: edits.content_encoding.map_or(RpcedgeStr::NONE, |c| RpcedgeStr::of(c.token().as_bytes())),
        content_length_op,
        etag_op,
        add_vary: edits.add_vary.into(),
        remove_accept_ranges: edits.remove_accept_ranges.into(),
        content_length,
        etag: if etag.is_empty() { ptr::null() } else { etag.as_ptr() },
        etag_len: etag.len(),
        add_vary_accept: edits.add_vary_accept.into(),
        remove_content_encoding: edits.remove_content_encoding.into(),
        content_type: edits.content_type.map_or(ptr::null(), str::as_ptr),
        content_type_len: edits.content_type.map_or(0, str::len),
        set: if set.is_empty() { ptr::null() } else { set.as_ptr() },
        set_len: set.len(),
    }
}

/// Feeds a body chunk (empty for a timer tick); `flags` are `RPCEDGE_FEED_*`. Returns 0 with
/// `out` filled, or -1 when the exchange failed: then `out` holds nothing to send, `error` (may
/// be NULL) gets a message, and `rpcedge_exchange_failure` says what to do.
///
/// # Safety
/// `exchange` is NULL or live; `data` points to `len` readable bytes; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn rpcedge_exchange_feed(
    exchange: *mut RpcedgeExchange,
    data: *const u8,
    len: usize,
    flags: u32,
    now_ms: u64,
    out: *mut RpcedgeOutput,
    error: *mut RpcedgeError,
) -> i32 {
    put(out, RpcedgeOutput::NONE);
    let result = guard(Err("internal error".to_owned()), || {
        let exchange = exchange.as_mut().ok_or("no exchange")?;
        let (end, flush) = (flags & RPCEDGE_FEED_END != 0, flags & RPCEDGE_FEED_FLUSH != 0);
        let output = exchange.0.feed(bytes(data, len), end, flush, now_ms).map_err(|e| e.to_string())?;
        put(out, c_output(&output, &mut exchange.1));
        Ok(())
    });
    output_result(result, error)
}

/// After a failed call: the status to answer with (the held response is dropped), or
/// `RPCEDGE_FAILURE_RESET` when the headers are out and the stream must be reset.
///
/// # Safety
/// `exchange` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn rpcedge_exchange_failure(exchange: *const RpcedgeExchange) -> u16 {
    guard(RPCEDGE_FAILURE_RESET, || exchange.as_ref().map_or(RPCEDGE_FAILURE_RESET, |ex| c_failure(ex.0.failure())))
}

/// The host lost the body before its end (an upstream reset): the exchange fails; returns what
/// to do, as `rpcedge_exchange_failure` does.
///
/// # Safety
/// `exchange` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn rpcedge_exchange_abort(exchange: *mut RpcedgeExchange) -> u16 {
    guard(RPCEDGE_FAILURE_RESET, || exchange.as_mut().map_or(RPCEDGE_FAILURE_RESET, |ex| c_failure(ex.0.abort())))
}

fn c_failure(failure: Failure) -> u16 {
    match failure {
        Failure::Respond(status) => status,
        Failure::Reset => RPCEDGE_FAILURE_RESET,
    }
}

/// The host can run jobs off its event loop: from now on the end of a large buffered body may
/// come as `RPCEDGE_OUT_WORK` rather than compressed.
///
/// # Safety
/// `exchange` is live.
#[no_mangle]
pub unsafe extern "C" fn rpcedge_exchange_offload(exchange: *mut RpcedgeExchange) {
    guard((), || with(exchange, Exchange::offload_whole_bodies));
}

/// The host sends the response head before any of the body (OpenResty's header filter): from
/// now on the plan is never `RPCEDGE_PLAN_BUFFER` (a body that would be buffered streams) and
/// nothing is transcoded.
///
/// # Safety
/// `exchange` is live.
#[no_mangle]
pub unsafe extern "C" fn rpcedge_exchange_headers_at_head(exchange: *mut RpcedgeExchange) {
    guard((), || with(exchange, Exchange::headers_at_head));
}

/// The job that `RPCEDGE_OUT_WORK` announced, now the caller's; NULL when there is none.
///
/// # Safety
/// `exchange` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn rpcedge_exchange_take_job(exchange: *mut RpcedgeExchange) -> *mut RpcedgeJob {
    guard(ptr::null_mut(), || {
        let Some(exchange) = exchange.as_mut() else { return ptr::null_mut() };
        exchange.0.take_whole_body().map_or(ptr::null_mut(), |job| Box::into_raw(Box::new(RpcedgeJob(job))))
    })
}

/// Compresses the job's body. Safe on any thread: it touches nothing but the job.
///
/// # Safety
/// `job` is NULL or came from `rpcedge_exchange_take_job` and is not used elsewhere meanwhile.
#[no_mangle]
pub unsafe extern "C" fn rpcedge_job_run(job: *mut RpcedgeJob) {
    guard((), || {
        if let Some(job) = job.as_mut() {
            job.0.run();
        }
    });
}

/// Frees a job that will not be given back (its exchange is going away).
///
/// # Safety
/// `job` is NULL or came from `rpcedge_exchange_take_job`, is not running, and is freed once.
#[no_mangle]
pub unsafe extern "C" fn rpcedge_job_free(job: *mut RpcedgeJob) {
    if !job.is_null() {
        guard((), || drop(Box::from_raw(job)));
    }
}

/// Gives a job back to its exchange (and frees it, whatever happens); one not run is run here.
/// Returns as `rpcedge_exchange_feed` does, `out` holding the headers, the body and the end.
///
/// # Safety
/// `exchange` is NULL or live; `job` is NULL or came from `rpcedge_exchange_take_job` on it and
/// is not used after; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn rpcedge_exchange_complete_job(
    exchange: *mut RpcedgeExchange,
    job: *mut RpcedgeJob,
    out: *mut RpcedgeOutput,
    error: *mut RpcedgeError,
) -> i32 {
    put(out, RpcedgeOutput::NONE);
    let result = guard(Err("internal error".to_owned()), || {
        // Owned from here on, so that every way out frees it.
        let job = (!job.is_null()).then(|| Box::from_raw(job).0);
        let exchange = exchange.as_mut().ok_or("no exchange")?;
        let job = job.ok_or("no job")?;
        let output = exchange.0.complete_whole_body(job).map_err(|e| e.to_string())?;
        put(out, c_output(&output, &mut exchange.1));
        Ok(())
    });
    output_result(result, error)
}

fn c_output(output: &Output<'_>, set: &mut Vec<RpcedgeHeader>) -> RpcedgeOutput {
    let mut bits = 0;
    for (set, bit) in [
        (output.flush, RPCEDGE_OUT_FLUSH),
        (output.end, RPCEDGE_OUT_END),
        (output.headers.is_some(), RPCEDGE_OUT_HEADERS),
        (output.work, RPCEDGE_OUT_WORK),
        (output.more, RPCEDGE_OUT_MORE),
    ] {
        if set {
            bits |= bit;
        }
    }
    RpcedgeOutput {
        data: output.data.as_ptr(),
        len: output.data.len(),
        flags: bits,
        edits: output.headers.map_or(RpcedgeHeaderEdits::NONE, |edits| c_edits(edits, set)),
    }
}

fn output_result(result: Result<(), impl Into<String>>, error: *mut RpcedgeError) -> i32 {
    match result {
        Ok(()) => 0,
        Err(message) => {
            write_error(error, &ConfigError { field: "body".into(), message: message.into() });
            -1
        }
    }
}

/// When to feed an empty chunk as a timer tick, on the clock of `now_ms`; -1 for no timer.
///
/// # Safety
/// `exchange` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn rpcedge_exchange_deadline(exchange: *const RpcedgeExchange) -> i64 {
    guard(-1, || exchange.as_ref().and_then(|ex| ex.0.deadline()).map_or(-1, |d| d.min(i64::MAX as u64) as i64))
}

/// The mode's name ("oneshot", "stream", ...; static).
///
/// # Safety
/// `exchange` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn rpcedge_exchange_mode(exchange: *const RpcedgeExchange) -> RpcedgeStr {
    let mode = guard(Mode::Failed, || exchange.as_ref().map_or(Mode::Failed, |ex| ex.0.mode()));
    RpcedgeStr::of(mode.as_str().as_bytes())
}

/// `rpcedge_exchange_transcode`'s outcomes (the core's `TranscodeOutcome`).
pub const RPCEDGE_TRANSCODE_NONE: u8 = 0;
pub const RPCEDGE_TRANSCODE_DONE: u8 = 1;
pub const RPCEDGE_TRANSCODE_REFUSED: u8 = 2;

const _: () = assert!(
    RPCEDGE_TRANSCODE_NONE == TranscodeOutcome::None as u8
        && RPCEDGE_TRANSCODE_DONE == TranscodeOutcome::Transcoded as u8
        && RPCEDGE_TRANSCODE_REFUSED == TranscodeOutcome::Refused as u8
);

/// What became of transcoding: one of `RPCEDGE_TRANSCODE_*`. With `RPCEDGE_TRANSCODE_REFUSED`,
/// `why` (may be NULL) gets the reason, to log.
///
/// # Safety
/// `exchange` is NULL or live; `why` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn rpcedge_exchange_transcode(exchange: *const RpcedgeExchange, why: *mut RpcedgeError) -> u8 {
    guard(RPCEDGE_TRANSCODE_NONE, || {
        let Some(exchange) = exchange.as_ref() else { return RPCEDGE_TRANSCODE_NONE };
        if let Some(refusal) = exchange.0.transcode_refusal() {
            write_error(why, &ConfigError { field: "transcode".into(), message: refusal.to_string() });
        }
        exchange.0.transcode_outcome() as u8
    })
}

/// Body bytes fed in and sent out so far.
///
/// # Safety
/// `exchange` is NULL or live; `bytes_in` and `bytes_out` are NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn rpcedge_exchange_counts(exchange: *const RpcedgeExchange, bytes_in: *mut u64, bytes_out: *mut u64) {
    let (i, o) = guard((0, 0), || exchange.as_ref().map_or((0, 0), |ex| ex.0.counts()));
    put(bytes_in, i);
    put(bytes_out, o);
}
