//! The C ABI's argument checks: arbitrary call sequences, lengths, flags and values on live
//! handles. No call may panic across the boundary (each is caught and reported), write past what
//! it was given, or leave an out-parameter undefined.
#![no_main]

use std::ptr;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use rpcedge::*;

#[derive(Arbitrary, Debug)]
enum Call<'a> {
    Json(&'a [u8]),
    Field(u8, u64),
    Type(&'a [u8]),
    RequestHeader(&'a [u8], &'a [u8]),
    ResponseHeader(&'a [u8], &'a [u8]),
    ContentLength(i64),
    Head(u16),
    HeaderOps(u8),
    Feed(&'a [u8], u32, u64),
    Offload,
    TakeRunComplete(bool),
    Abort,
}

const FIELDS: [&std::ffi::CStr; 7] =
    [c"min_length", c"max_buffer", c"level", c"stream_level", c"stream_delay_ms", c"offload_min_length", c"nope"];

fuzz_target!(|calls: Vec<Call>| unsafe {
    let settings = rpcedge_settings_from_json(b"{}".as_ptr(), 2, ptr::null_mut());
    let ex = rpcedge_exchange_new(settings);
    let mut err: RpcedgeError = std::mem::zeroed();
    let mut out: RpcedgeOutput = std::mem::zeroed();
    for call in calls {
        match call {
            Call::Json(json) => rpcedge_settings_free(rpcedge_settings_from_json(json.as_ptr(), json.len(), &mut err)),
            Call::Field(i, v) => {
                rpcedge_check_field(FIELDS[usize::from(i) % FIELDS.len()].as_ptr(), v, &mut err);
            }
            Call::Type(t) => {
                rpcedge_check_type(t.as_ptr(), t.len(), &mut err);
            }
            Call::RequestHeader(n, v) => rpcedge_exchange_request_header(ex, n.as_ptr(), n.len(), v.as_ptr(), v.len()),
            Call::ResponseHeader(n, v) => rpcedge_exchange_response_header(ex, n.as_ptr(), n.len(), v.as_ptr(), v.len()),
            Call::ContentLength(n) => rpcedge_exchange_response_content_length(ex, n),
            Call::Head(status) => assert!(rpcedge_exchange_response_head(ex, status) <= RPCEDGE_PLAN_STREAM),
            Call::HeaderOps(vary) => {
                let mut ops = ptr::null();
                let n = rpcedge_exchange_header_ops(ex, vary, &mut ops);
                for op in (n > 0).then(|| std::slice::from_raw_parts(ops, n)).unwrap_or_default() {
                    assert!((RPCEDGE_EDIT_SET..=RPCEDGE_EDIT_APPEND).contains(&op.op));
                    // The names and values are readable until the next call.
                    let _ = std::slice::from_raw_parts(op.name.data, op.name.len).iter().fold(0u8, |a, b| a ^ b);
                    if !op.value.data.is_null() {
                        let _ = std::slice::from_raw_parts(op.value.data, op.value.len).iter().fold(0u8, |a, b| a ^ b);
                    }
                }
            }
            Call::Feed(data, flags, now) => {
                if rpcedge_exchange_feed(ex, data.as_ptr(), data.len(), flags, now, &mut out, &mut err) != 0 {
                    assert!(out.data.is_null() && out.len == 0 && out.flags == 0);
                    let status = rpcedge_exchange_failure(ex);
                    assert!(status == RPCEDGE_FAILURE_RESET || status == 502);
                } else if out.len > 0 {
                    // The bytes are readable until the next call.
                    let _ = std::slice::from_raw_parts(out.data, out.len).iter().fold(0u8, |a, b| a ^ b);
                }
            }
            Call::Offload => rpcedge_exchange_offload(ex),
            Call::TakeRunComplete(run) => {
                let job = rpcedge_exchange_take_job(ex);
                if !job.is_null() {
                    if run {
                        rpcedge_job_run(job);
                    }
                    rpcedge_exchange_complete_job(ex, job, &mut out, &mut err);
                }
            }
            Call::Abort => {
                rpcedge_exchange_abort(ex);
            }
        }
        let _ = rpcedge_exchange_deadline(ex);
        let _ = rpcedge_exchange_mode(ex);
    }
    rpcedge_exchange_free(ex);
    rpcedge_settings_free(settings);
});
