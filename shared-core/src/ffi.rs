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

use crate::compress::compress_into;
use crate::config::{check_field, check_type, Config, ConfigError, Settings};
use crate::exchange::{BodyPlan, Exchange, HeaderEdits, LengthEdit, Mode, Output, WholeBody};
use crate::negotiate::{AcceptEncoding, Coding};

/// Opaque validated settings.
pub struct RpcedgeSettings(Arc<Settings>);

/// Opaque per-request exchange.
pub struct RpcedgeExchange(Exchange);

/// Opaque whole-body compression job, owned by whoever holds it (see `RPCEDGE_OUT_WORK`).
pub struct RpcedgeJob(WholeBody);

/// A byte string the caller owns, e.g. one of nginx's `ngx_str_t` rearranged.
#[repr(C)]
pub struct RpcedgeStr {
    pub data: *const u8,
    pub len: usize,
}

/// The configuration as a host with its own parser (nginx) holds it.
#[repr(C)]
pub struct RpcedgeConfig {
    pub min_length: u64,
    pub max_buffer: u64,
    pub level: u32,
    pub stream_level: u32,
    pub stream_delay_ms: u64,
    /// Media type patterns; none at all means the defaults.
    pub types: *const RpcedgeStr,
    pub types_len: usize,
}

/// Where a configuration error is written: the field's name and a message, NUL-terminated and
/// cut to fit.
#[repr(C)]
pub struct RpcedgeError {
    pub field: [c_char; 32],
    pub message: [c_char; 224],
}

/// `rpcedge_header_edits.content_length_op`
pub const RPCEDGE_LENGTH_KEEP: u8 = 0;
pub const RPCEDGE_LENGTH_SET: u8 = 1;
pub const RPCEDGE_LENGTH_REMOVE: u8 = 2;

/// Header changes to apply before the headers go out.
#[repr(C)]
pub struct RpcedgeHeaderEdits {
    /// 0: leave Content-Encoding alone; otherwise the coding to set (1 gzip, 2 deflate).
    pub content_encoding: u8,
    /// One of `RPCEDGE_LENGTH_*`.
    pub content_length_op: u8,
    pub add_vary: u8,
    pub remove_accept_ranges: u8,
    pub content_length: u64,
    /// When not NULL, the new ETag value; valid until the next call on the exchange.
    pub etag: *const u8,
    pub etag_len: usize,
}

/// `rpcedge_output.flags`
pub const RPCEDGE_OUT_HEADERS: u32 = 1;
pub const RPCEDGE_OUT_FLUSH: u32 = 2;
pub const RPCEDGE_OUT_END: u32 = 4;
/// Only after `rpcedge_exchange_offload`: the body is in and its compression waits as a job, to
/// take with `rpcedge_exchange_take_job`, run on a thread and give back.
pub const RPCEDGE_OUT_WORK: u32 = 8;

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

fn guard<T>(fallback: T, f: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(fallback)
}

fn panicked() -> ConfigError {
    ConfigError { field: "config".into(), message: "internal error".into() }
}

/// Checks one numeric setting by name (e.g. "level"); 0 when valid, -1 with `err` filled in.
///
/// # Safety
/// `field` is a NUL-terminated string; `err` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn rpcedge_check_field(field: *const c_char, value: u64, err: *mut RpcedgeError) -> i32 {
    let result = guard(Err(panicked()), || {
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

/// Validates a configuration; NULL with `err` filled in when a value is out of range.
///
/// # Safety
/// `config` is valid, its `types` array holds `types_len` valid strings; `err` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn rpcedge_settings_new(config: *const RpcedgeConfig, err: *mut RpcedgeError) -> *mut RpcedgeSettings {
    let result = guard(Err(panicked()), || {
        let c = &*config;
        let types = if c.types_len == 0 {
            Config::default().types
        } else {
            slice::from_raw_parts(c.types, c.types_len)
                .iter()
                .map(|t| String::from_utf8_lossy(bytes(t.data, t.len)).into_owned())
                .collect()
        };
        Config {
            min_length: c.min_length,
            max_buffer: c.max_buffer,
            level: c.level,
            stream_level: c.stream_level,
            stream_delay_ms: c.stream_delay_ms,
            types,
        }
        .validate()
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
        Ok(settings) => Box::into_raw(Box::new(RpcedgeSettings(Arc::new(settings)))),
        Err(e) => {
            write_error(err, &e);
            ptr::null_mut()
        }
    }
}

/// The defaults, for a host that sets only some fields.
#[no_mangle]
pub extern "C" fn rpcedge_config_default() -> RpcedgeConfig {
    let d = Config::default();
    RpcedgeConfig {
        min_length: d.min_length,
        max_buffer: d.max_buffer,
        level: d.level,
        stream_level: d.stream_level,
        stream_delay_ms: d.stream_delay_ms,
        types: ptr::null(),
        types_len: 0,
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

/// A new exchange; NULL only on allocation failure.
///
/// # Safety
/// `settings` is a live settings handle.
#[no_mangle]
pub unsafe extern "C" fn rpcedge_exchange_new(settings: *const RpcedgeSettings) -> *mut RpcedgeExchange {
    guard(ptr::null_mut(), || {
        let settings = Arc::clone(&(*settings).0);
        Box::into_raw(Box::new(RpcedgeExchange(Exchange::new(settings))))
    })
}

/// # Safety
/// `exchange` came from `rpcedge_exchange_new` and is freed once.
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
    guard((), || (*exchange).0.request_method(bytes(method, len)));
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
    guard((), || (*exchange).0.request_header(bytes(name, name_len), bytes(value, value_len)));
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
    guard((), || (*exchange).0.response_header(bytes(name, name_len), bytes(value, value_len)));
}

/// The response's Content-Length where the host keeps it apart from the header list; negative
/// for none.
///
/// # Safety
/// `exchange` is live.
#[no_mangle]
pub unsafe extern "C" fn rpcedge_exchange_response_content_length(exchange: *mut RpcedgeExchange, length: i64) {
    guard((), || (*exchange).0.response_content_length(u64::try_from(length).ok()));
}

/// Decides the body plan once the response headers are in: 0 pass, 1 buffer, 2 stream (the
/// `BodyPlan` values). For pass and stream, `edits` is filled with the changes to apply now.
///
/// # Safety
/// `exchange` is live; `edits` is writable.
#[no_mangle]
pub unsafe extern "C" fn rpcedge_exchange_response_head(
    exchange: *mut RpcedgeExchange,
    status: u16,
    edits: *mut RpcedgeHeaderEdits,
) -> u8 {
    guard(BodyPlan::Pass as u8, || {
        let ex = &mut (*exchange).0;
        let plan = ex.response_head(status);
        *edits = c_edits(ex.edits());
        plan as u8
    })
}

fn c_edits(edits: &HeaderEdits) -> RpcedgeHeaderEdits {
    let (content_length_op, content_length) = match edits.content_length {
        LengthEdit::Keep => (RPCEDGE_LENGTH_KEEP, 0),
        LengthEdit::Set(n) => (RPCEDGE_LENGTH_SET, n),
        LengthEdit::Remove => (RPCEDGE_LENGTH_REMOVE, 0),
    };
    RpcedgeHeaderEdits {
        content_encoding: edits.content_encoding.map_or(0, |c| c as u8),
        content_length_op,
        add_vary: edits.add_vary.into(),
        remove_accept_ranges: edits.remove_accept_ranges.into(),
        content_length,
        etag: edits.etag.as_ref().map_or(ptr::null(), |e| e.as_ptr()),
        etag_len: edits.etag.as_ref().map_or(0, |e| e.len()),
    }
}

/// Feeds a body chunk (empty for a timer tick); `flags` are `RPCEDGE_FEED_*`. Returns 0 with
/// `out` filled, or -1 when the exchange failed: before the headers went out the host answers
/// with an error, after it resets the connection. `error` (may be NULL) gets a message.
///
/// # Safety
/// `exchange` is live; `data` points to `len` readable bytes; `out` is writable.
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
    let result = guard(Err("internal error".to_owned()), || {
        let (end, flush) = (flags & RPCEDGE_FEED_END != 0, flags & RPCEDGE_FEED_FLUSH != 0);
        let output = (*exchange).0.feed(bytes(data, len), end, flush, now_ms).map_err(|e| e.to_string())?;
        *out = c_output(&output);
        Ok(())
    });
    output_result(result, error)
}

/// The host can run jobs off its event loop: from now on the end of a large buffered body may
/// come as `RPCEDGE_OUT_WORK` rather than compressed.
///
/// # Safety
/// `exchange` is live.
#[no_mangle]
pub unsafe extern "C" fn rpcedge_exchange_offload(exchange: *mut RpcedgeExchange) {
    guard((), || (*exchange).0.offload_whole_bodies());
}

/// The job that `RPCEDGE_OUT_WORK` announced, now the caller's; NULL when there is none.
///
/// # Safety
/// `exchange` is live.
#[no_mangle]
pub unsafe extern "C" fn rpcedge_exchange_take_job(exchange: *mut RpcedgeExchange) -> *mut RpcedgeJob {
    guard(ptr::null_mut(), || {
        (*exchange).0.take_whole_body().map_or(ptr::null_mut(), |job| Box::into_raw(Box::new(RpcedgeJob(job))))
    })
}

/// Compresses the job's body. Safe on any thread: it touches nothing but the job.
///
/// # Safety
/// `job` came from `rpcedge_exchange_take_job` and is not used elsewhere meanwhile.
#[no_mangle]
pub unsafe extern "C" fn rpcedge_job_run(job: *mut RpcedgeJob) {
    guard((), || (*job).0.run());
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

/// Gives a job back to its exchange (and frees it); one not run is run here. Returns as
/// `rpcedge_exchange_feed` does, `out` holding the headers, the body and the end.
///
/// # Safety
/// `exchange` is live; `job` came from `rpcedge_exchange_take_job` on it; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn rpcedge_exchange_complete_job(
    exchange: *mut RpcedgeExchange,
    job: *mut RpcedgeJob,
    out: *mut RpcedgeOutput,
    error: *mut RpcedgeError,
) -> i32 {
    let result = guard(Err("internal error".to_owned()), || {
        let job = Box::from_raw(job).0;
        let output = (*exchange).0.complete_whole_body(job).map_err(|e| e.to_string())?;
        *out = c_output(&output);
        Ok(())
    });
    output_result(result, error)
}

fn c_output(output: &Output<'_>) -> RpcedgeOutput {
    let mut bits = 0;
    for (set, bit) in [
        (output.flush, RPCEDGE_OUT_FLUSH),
        (output.end, RPCEDGE_OUT_END),
        (output.headers.is_some(), RPCEDGE_OUT_HEADERS),
        (output.work, RPCEDGE_OUT_WORK),
    ] {
        if set {
            bits |= bit;
        }
    }
    RpcedgeOutput {
        data: output.data.as_ptr(),
        len: output.data.len(),
        flags: bits,
        edits: c_edits(output.headers.unwrap_or(&HeaderEdits::default())),
    }
}

fn output_result(result: Result<(), String>, error: *mut RpcedgeError) -> i32 {
    match result {
        Ok(()) => 0,
        Err(message) => {
            write_error(error, &ConfigError { field: "body".into(), message });
            -1
        }
    }
}

/// When to feed an empty chunk as a timer tick, on the clock of `now_ms`; -1 for no timer.
///
/// # Safety
/// `exchange` is live.
#[no_mangle]
pub unsafe extern "C" fn rpcedge_exchange_deadline(exchange: *const RpcedgeExchange) -> i64 {
    guard(-1, || (*exchange).0.deadline().map_or(-1, |d| d as i64))
}

/// The mode as a NUL-terminated static string ("oneshot", "stream", ...).
///
/// # Safety
/// `exchange` is live.
#[no_mangle]
pub unsafe extern "C" fn rpcedge_exchange_mode(exchange: *const RpcedgeExchange) -> *const c_char {
    let mode = guard(Mode::Failed, || (*exchange).0.mode());
    mode_name(mode).as_ptr()
}

fn mode_name(mode: Mode) -> &'static CStr {
    match mode {
        Mode::Pending => c"pending",
        Mode::Untouched => c"untouched",
        Mode::Small => c"small",
        Mode::Oneshot => c"oneshot",
        Mode::Stream => c"stream",
        Mode::Incompressible => c"incompressible",
        Mode::Failed => c"failed",
    }
}

/// Body bytes fed in and sent out so far.
///
/// # Safety
/// `exchange` is live; `bytes_in` and `bytes_out` are writable.
#[no_mangle]
pub unsafe extern "C" fn rpcedge_exchange_counts(exchange: *const RpcedgeExchange, bytes_in: *mut u64, bytes_out: *mut u64) {
    let (i, o) = guard((0, 0), || (*exchange).0.counts());
    *bytes_in = i;
    *bytes_out = o;
}

/// Negotiates an Accept-Encoding value: 0 identity, 1 gzip, 2 deflate.
///
/// # Safety
/// `value` points to `len` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn rpcedge_negotiate(value: *const u8, len: usize) -> u8 {
    guard(0, || AcceptEncoding::parse(bytes(value, len)).choose().map_or(0, |c| c as u8))
}

/// Compresses `len` bytes whole with libdeflate into `out` (room for `out_cap` bytes). Returns
/// the compressed size, or 0 when the result would not be smaller than the input (or `coding`
/// or `level` are not valid): then send the original.
///
/// # Safety
/// `data` points to `len` readable bytes, `out` to `out_cap` writable ones.
#[no_mangle]
pub unsafe extern "C" fn rpcedge_compress(coding: u8, level: u32, data: *const u8, len: usize, out: *mut u8, out_cap: usize) -> usize {
    guard(0, || {
        let coding = match coding {
            1 => Coding::Gzip,
            2 => Coding::Deflate,
            _ => return 0,
        };
        if check_field("level", level.into()).is_err() {
            return 0;
        }
        let input = bytes(data, len);
        // Never more than the input less one byte: a result that is not smaller is refused.
        let room = out_cap.min(input.len().saturating_sub(1));
        if room == 0 {
            return 0;
        }
        compress_into(coding, level, input, slice::from_raw_parts_mut(out, room)).unwrap_or(0)
    })
}
