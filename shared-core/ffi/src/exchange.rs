//! One response's exchange: the request and the node's head in, header edits and body bytes out,
//! and the whole-body jobs a host may run off its event loop.

use std::ptr;
use std::sync::Arc;

use rpcedge_core::config::ConfigError;
use std::borrow::Cow;

use rpcedge_core::edits::EncodingVary;
use rpcedge_core::exchange::{BodyPlan, Exchange, Failure, Mode, Output, TranscodeOutcome, WholeBody};
use rpcedge_core::HeaderOp;

use crate::{bytes, guard, put, write_error, RpcedgeError, RpcedgeSettings, RpcedgeStr};

/// Opaque per-request exchange, with the header operations it handed out last.
pub struct RpcedgeExchange(pub(crate) Exchange, HeaderOps);

/// Opaque whole-body compression job, owned by whoever holds it (see `RPCEDGE_OUT_WORK`).
pub struct RpcedgeJob(WholeBody);

/// `rpcedge_exchange_response_head`'s body plans (the core's `BodyPlan`).
pub const RPCEDGE_PLAN_PASS: u8 = 0;
pub const RPCEDGE_PLAN_BUFFER: u8 = 1;
pub const RPCEDGE_PLAN_STREAM: u8 = 2;

const _: () = assert!(
    RPCEDGE_PLAN_PASS == BodyPlan::Pass as u8
        && RPCEDGE_PLAN_BUFFER == BodyPlan::Buffer as u8
        && RPCEDGE_PLAN_STREAM == BodyPlan::Stream as u8
);

/// `rpcedge_header_op_t.op`: set the header (replacing any of that name), remove it, or add the
/// value beside those of that name.
pub const RPCEDGE_EDIT_SET: u8 = 1;
pub const RPCEDGE_EDIT_REMOVE: u8 = 2;
pub const RPCEDGE_EDIT_APPEND: u8 = 3;

/// `rpcedge_exchange_header_ops`'s `vary`: `Vary: Accept-Encoding` in the one Vary line the edits
/// add, or in an operation of its own for a host with its own way to say it (nginx's `gzip_vary`).
pub const RPCEDGE_VARY_IN_LINE: u8 = 0;
pub const RPCEDGE_VARY_ENCODING_OWN_LINE: u8 = 1;

/// What `rpcedge_exchange_failure` and `_abort` return for "reset the stream".
pub const RPCEDGE_FAILURE_RESET: u16 = 0;

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
    /// `RPCEDGE_OUT_*` bits. With `RPCEDGE_OUT_HEADERS`, the held headers go out now, before
    /// `data`, edited as `rpcedge_exchange_header_ops` says.
    pub flags: u32,
}

impl RpcedgeOutput {
    /// Nothing to send: what every out-parameter holds when a call fails.
    const NONE: RpcedgeOutput = RpcedgeOutput { data: ptr::null(), len: 0, flags: 0 };
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
        Box::into_raw(Box::new(RpcedgeExchange(exchange, HeaderOps::default())))
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
/// and stream, `rpcedge_exchange_header_ops` then gives the changes to apply now. Should the core
/// fail here, the plan is pass with no change: the response goes out as it came.
///
/// # Safety
/// `exchange` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn rpcedge_exchange_response_head(exchange: *mut RpcedgeExchange, status: u16) -> u8 {
    let Some(RpcedgeExchange(exchange, ops)) = exchange.as_mut() else { return RPCEDGE_PLAN_PASS };
    // until the core has decided, no edit goes out: a failure on the way may have left some
    ops.withheld = true;
    guard(RPCEDGE_PLAN_PASS, || {
        let plan = exchange.response_head(status) as u8;
        ops.withheld = false;
        plan
    })
}

/// One change to the response headers, of those `rpcedge_exchange_header_ops` gives in order:
/// `op` is `RPCEDGE_EDIT_SET` (replacing any of that name), `_REMOVE` or `_APPEND`; names in
/// lower case.
#[repr(C)]
pub struct RpcedgeHeaderOp {
    pub op: u8,
    pub name: RpcedgeStr,
    pub value: RpcedgeStr,
}

/// The operations handed out last as C reads them, with the values they point to that the
/// exchange's edits do not hold (a length, as digits).
#[derive(Default)]
pub(crate) struct HeaderOps {
    ops: Vec<RpcedgeHeaderOp>,
    values: Vec<Vec<u8>>,
    /// The core failed while it decided the head: the response passes as it came, unedited.
    withheld: bool,
}

/// The exchange's header edits, those `rpcedge_exchange_response_head` or a feed's
/// `RPCEDGE_OUT_HEADERS` gave last, as the ordered operations every host applies one by one
/// (`HeaderEdits::operations`, as the Envoy adapters apply them); `vary` is one of
/// `RPCEDGE_VARY_*`. `*ops` points to them, valid until the next call on the exchange; returns
/// how many. What the last feed gave stays valid through this call.
///
/// # Safety
/// `exchange` is NULL or live; `ops` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn rpcedge_exchange_header_ops(
    exchange: *mut RpcedgeExchange,
    vary: u8,
    ops: *mut *const RpcedgeHeaderOp,
) -> usize {
    put(ops, ptr::null());
    guard(0, || {
        let Some(RpcedgeExchange(exchange, HeaderOps { ops: c_ops, values, withheld })) = exchange.as_mut() else {
            return 0;
        };
        if *withheld {
            return 0;
        }
        let vary = match vary {
            RPCEDGE_VARY_ENCODING_OWN_LINE => EncodingVary::OwnLine,
            _ => EncodingVary::InLine,
        };
        c_ops.clear();
        values.clear();
        for op in exchange.edits().operations(vary) {
            let (op, name, value) = match op {
                HeaderOp::Set(name, Cow::Borrowed(value)) => (RPCEDGE_EDIT_SET, name, RpcedgeStr::of(value)),
                HeaderOp::Set(name, Cow::Owned(value)) => {
                    // its bytes stay where they are while `values` grows
                    values.push(value);
                    (RPCEDGE_EDIT_SET, name, RpcedgeStr::of(values.last().map_or(&[][..], Vec::as_slice)))
                }
                HeaderOp::Append(name, value) => (RPCEDGE_EDIT_APPEND, name, RpcedgeStr::of(value.as_bytes())),
                HeaderOp::Remove(name) => (RPCEDGE_EDIT_REMOVE, name, RpcedgeStr::NONE),
            };
            c_ops.push(RpcedgeHeaderOp { op, name: RpcedgeStr::of(name.as_bytes()), value });
        }
        put(ops, c_ops.as_ptr());
        c_ops.len()
    })
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
        put(out, c_output(&output));
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
        put(out, c_output(&output));
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
