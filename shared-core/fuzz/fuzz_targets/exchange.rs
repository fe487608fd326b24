//! The exchange fed arbitrary heads, chunkings, flushes and ticks, as a host would: whatever it
//! decides, the client decodes exactly the body the upstream sent, or the exchange fails only
//! because the body contradicted its declared length. With transcoding on and a client that asks
//! for SSZ of a raw block, it gets exactly that SSZ, or the body as it came; asking the node for
//! SSZ for a JSON client, the client gets the JSON of the SSZ that came, or that SSZ as it came.
#![no_main]

#[path = "../../tests/common/decode.rs"]
mod decoded;

use std::sync::Arc;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use rpcedge_core::transcode::{jsonrpc_from_ssz, jsonrpc_to_ssz, Schema, WitnessForm};
use rpcedge_core::{BodyPlan, Coding, Config, Exchange, HeaderEdits, LengthEdit, Level};

#[derive(Arbitrary, Debug)]
struct Case<'a> {
    min_length: u16,
    max_buffer: u16,
    level: u8,
    stream_delay_ms: u8,
    /// Transcoding on, with this transcode_max, for a client that asks for SSZ.
    transcode_max: Option<u16>,
    /// With transcoding on: the node is asked for SSZ for a JSON client instead.
    upstream_ssz: bool,
    head: bool,
    /// The request is a JSON-RPC call (Content-Type application/json), not a form's POST.
    json_call: bool,
    accept: &'a [u8],
    content_type: u8,
    status: u16,
    /// None: no Content-Length; Some(d): the body's length plus d (0: truthful).
    length_skew: Option<i8>,
    extra: Vec<(u8, &'a [u8])>,
    body: &'a [u8],
    /// (bytes to take, flush, ms since the last step, a tick before it)
    steps: Vec<(u16, bool, u8, bool)>,
}

const TYPES: [&[u8]; 4] = [b"application/json", b"text/plain; charset=utf-8", b"image/png", b""];
const NAMES: [&[u8]; 6] = [b"etag", b"vary", b"cache-control", b"content-encoding", b"content-range", b"x-other"];

fuzz_target!(|case: Case| {
    let max_buffer = u64::from(case.max_buffer);
    let config = Config {
        min_length: u64::from(case.min_length).min(max_buffer),
        max_buffer,
        level: Level::from_raw(u32::from(case.level % 13)),
        stream_delay_ms: u64::from(case.stream_delay_ms),
        transcode: case.transcode_max.is_some(),
        transcode_max: case.transcode_max.map_or(0, u64::from),
        transcode_upstream_ssz: case.transcode_max.is_some() && case.upstream_ssz,
        ..Config::default()
    };
    let settings = Arc::new(config.validate().expect("in range"));
    let mut ex = Exchange::new(settings, Default::default());
    ex.request_method(if case.head { b"HEAD" } else { b"POST" });
    ex.request_header(b"content-type", if case.json_call { b"application/json" } else { b"application/x-www-form-urlencoded" });
    ex.request_header(b"accept-encoding", case.accept);
    let upstream_ssz = case.transcode_max.is_some() && case.upstream_ssz;
    if case.transcode_max.is_some() && !upstream_ssz {
        ex.request_header(b"accept", b"application/octet-stream");
    }
    if ex.wants_request_body() {
        ex.request_body(br#"{"jsonrpc":"2.0","id":1,"method":"debug_getRawBlock","params":["0x1"]}"#);
    }
    let asked = ex.upstream_accept().is_some();
    let for_the_node = case.json_call && !case.head;
    assert_eq!(asked, upstream_ssz && for_the_node, "a JSON client's raw block is asked for in SSZ");
    assert!(for_the_node || !ex.node_identity(), "only the node's requests are changed");
    assert!(!asked || ex.node_identity(), "a node asked for SSZ is asked for identity");
    let content_type = if asked { b"application/octet-stream" } else { TYPES[usize::from(case.content_type) % TYPES.len()] };
    ex.response_header(b"content-type", content_type);
    for (name, value) in &case.extra {
        ex.response_header(NAMES[usize::from(*name) % NAMES.len()], value);
    }
    let declared = case.length_skew.map(|skew| (case.body.len() as i64 + i64::from(skew)).max(0) as u64);
    if let Some(length) = declared {
        ex.response_header(b"content-length", length.to_string().as_bytes());
    }
    let plan = ex.response_head(case.status);
    if plan == BodyPlan::Pass {
        return;
    }
    // an encoded answer the exchange works on is one it decodes (it may not decode)
    let decoding = ex.upstream_encoded();
    let mut edits: Option<HeaderEdits> = (plan == BodyPlan::Stream).then(|| ex.edits().clone());
    let mut wire = Vec::new();
    let (mut at, mut now) = (0usize, 0u64);
    let mut result = Ok(());
    let mut steps = case.steps.iter().peekable();
    while result.is_ok() {
        let (take, flush, gap, tick) = steps.next().copied().unwrap_or((u16::MAX, false, 0, false));
        now += u64::from(gap);
        if tick {
            if let Some(deadline) = ex.deadline().filter(|&d| d <= now) {
                match ex.feed(&[], false, false, deadline) {
                    Ok(out) => {
                        if let Some(h) = out.headers {
                            edits = Some(h.clone());
                        }
                        wire.extend_from_slice(out.data);
                    }
                    Err(e) => result = Err(e),
                }
                continue;
            }
        }
        let end = at + usize::from(take).min(case.body.len() - at);
        let last = end == case.body.len() && steps.peek().is_none();
        match ex.feed(&case.body[at..end], last, flush, now) {
            Ok(out) => {
                if let Some(h) = out.headers {
                    assert!(edits.is_none(), "headers released twice");
                    edits = Some(h.clone());
                }
                assert!(edits.is_some() || out.data.is_empty(), "body before headers");
                wire.extend_from_slice(out.data);
                at = end;
                if last {
                    assert!(out.end);
                    break;
                }
            }
            Err(e) => result = Err(e),
        }
    }
    match result {
        Ok(()) => {
            assert_eq!(declared.unwrap_or(case.body.len() as u64), case.body.len() as u64, "a lying length passed");
            let edits = edits.expect("headers released");
            if let LengthEdit::Set(n) = edits.content_length {
                assert_eq!(n, wire.len() as u64, "exact Content-Length");
            }
            let body = if decoding { decoded::decode(Some(node_coding(&case.extra)), case.body) } else { case.body.to_vec() };
            let expected = match edits.content_type {
                Some(_) if asked => {
                    jsonrpc_from_ssz(&body, Schema::RawBytes, WitnessForm::Lossless, b"1", b"2.0").expect("rendered")
                }
                Some(_) => jsonrpc_to_ssz(&body, Schema::RawBytes, WitnessForm::Lossless).expect("transcoded").ssz,
                None => body,
            };
            assert_eq!(decoded::decode(edits.content_encoding, &wire), expected);
        }
        Err(_) => assert!(decoding || declared != Some(case.body.len() as u64), "failed on a truthful body"),
    }
});

/// The coding the node's Content-Encoding names, for an answer the exchange decoded: `deflate`,
/// or else gzip (`gzip`, `x-gzip`).
fn node_coding(extra: &[(u8, &[u8])]) -> Coding {
    let named = extra.iter().find(|(name, _)| NAMES[usize::from(*name) % NAMES.len()] == b"content-encoding");
    match named {
        Some((_, value)) if value.trim_ascii().eq_ignore_ascii_case(b"deflate") => Coding::Deflate,
        _ => Coding::Gzip,
    }
}
