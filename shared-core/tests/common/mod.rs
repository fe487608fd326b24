//! A host simulator: drives an exchange the way nginx and Envoy do (head, body, timer ticks) and
//! returns what a client would see on the wire.
#![allow(dead_code)] // each test binary uses its own part of this module

pub mod corpus;
mod decode;

pub use decode::decode;

use std::sync::Arc;

use rpcedge_core::{BodyPlan, Exchange, HeaderEdits, LengthEdit, Mode, Node, Settings, TranscodeOutcome};

/// One upstream body chunk and when it arrived.
#[derive(Clone, Debug)]
pub struct Chunk {
    pub data: Vec<u8>,
    pub flush: bool,
    pub at_ms: u64,
}

/// What the client gets.
#[derive(Debug)]
pub struct Wire {
    pub plan: BodyPlan,
    pub mode: Mode,
    pub transcode: TranscodeOutcome,
    pub edits: HeaderEdits,
    /// The Content-Length the client sees, if any.
    pub content_length: Option<u64>,
    pub body: Vec<u8>,
    /// When each piece of output left, and how many bytes (for timing assertions).
    pub sends: Vec<(u64, usize)>,
    /// The time the headers left.
    pub headers_at_ms: u64,
    /// The Accept the node was sent in place of the client's.
    pub upstream_accept: Option<String>,
}

impl Wire {
    /// The body as the client decodes it by Content-Encoding.
    pub fn decoded(&self) -> Vec<u8> {
        decode(self.edits.content_encoding, &self.body)
    }
}

pub struct Exchange1<'a> {
    pub method: &'a str,
    pub path: &'a str,
    pub request_headers: Vec<(&'a str, &'a str)>,
    pub status: u16,
    pub response_headers: Vec<(&'a str, String)>,
    /// Some(n): a Content-Length header of n.
    pub content_length: Option<u64>,
    pub chunks: Vec<Chunk>,
    /// The request body, given when the core asks for it.
    pub request_body: Vec<u8>,
    /// The host sends the head before the body (`Exchange::headers_at_head`).
    pub headers_at_head: bool,
}

impl<'a> Exchange1<'a> {
    /// A JSON response to a gzip-accepting JSON-RPC call, with the body in one chunk.
    pub fn json(body: &[u8], known_length: bool) -> Self {
        Exchange1 {
            method: "POST",
            path: "/",
            request_headers: vec![("Accept-Encoding", "gzip"), ("Content-Type", "application/json")],
            status: 200,
            response_headers: vec![("Content-Type", "application/json".into())],
            content_length: known_length.then_some(body.len() as u64),
            chunks: vec![Chunk { data: body.to_vec(), flush: false, at_ms: 0 }],
            request_body: Vec::new(),
            headers_at_head: false,
        }
    }
}

/// An SSZ client's witness call whose JSON answer of `length` bytes is about to come.
pub fn witness_answer_head(settings: &Arc<Settings>, length: Option<usize>) -> Exchange {
    let mut ex = Exchange::new(Arc::clone(settings), Arc::default());
    ex.request_method(b"POST");
    ex.request_header(b"Content-Type", b"application/json");
    ex.request_header(b"Accept", b"application/octet-stream");
    ex.request_body(br#"{"jsonrpc":"2.0","id":3,"method":"debug_executionWitness","params":["0x1"]}"#);
    ex.response_header(b"Content-Type", b"application/json");
    if let Some(length) = length {
        ex.response_header(b"Content-Length", length.to_string().as_bytes());
    }
    assert_eq!(ex.response_head(200), BodyPlan::Buffer);
    ex
}

/// Runs one exchange through the core, ticking timers as a host's event loop would.
pub fn run(settings: &Arc<Settings>, spec: &Exchange1) -> Result<Wire, rpcedge_core::Error> {
    run_on(settings, &Arc::default(), spec)
}

/// As [`run`], for a node that earlier exchanges of the same configuration have learned about.
pub fn run_on(settings: &Arc<Settings>, node: &Arc<Node>, spec: &Exchange1) -> Result<Wire, rpcedge_core::Error> {
    let mut ex = Exchange::new(Arc::clone(settings), Arc::clone(node));
    if spec.headers_at_head {
        ex.headers_at_head();
    }
    ex.request_method(spec.method.as_bytes());
    ex.request_path(spec.path.as_bytes());
    for (name, value) in &spec.request_headers {
        ex.request_header(name.as_bytes(), value.as_bytes());
    }
    if ex.wants_request_body() {
        ex.request_body(&spec.request_body);
    }
    let upstream_accept = ex.upstream_accept().map(str::to_owned);
    for (name, value) in &spec.response_headers {
        ex.response_header(name.as_bytes(), value.as_bytes());
    }
    if let Some(n) = spec.content_length {
        ex.response_header(b"Content-Length", n.to_string().as_bytes());
    }
    let plan = ex.response_head(spec.status);
    let mut wire = Wire {
        plan,
        mode: ex.mode(),
        transcode: ex.transcode_outcome(),
        edits: HeaderEdits::default(),
        content_length: spec.content_length,
        body: Vec::new(),
        sends: Vec::new(),
        headers_at_ms: 0,
        upstream_accept,
    };
    let mut headers_out = plan != BodyPlan::Buffer;
    if headers_out {
        apply(&mut wire, ex.edits());
    }
    if plan == BodyPlan::Pass {
        for chunk in &spec.chunks {
            wire.body.extend_from_slice(&chunk.data);
            wire.sends.push((chunk.at_ms, chunk.data.len()));
        }
        return Ok(wire);
    }
    let last = spec.chunks.len().saturating_sub(1);
    for (i, chunk) in spec.chunks.iter().enumerate() {
        // Fire every timer that falls before this chunk arrives.
        while let Some(deadline) = ex.deadline().filter(|&d| d < chunk.at_ms) {
            feed(&mut ex, &mut wire, &mut headers_out, &[], false, false, deadline)?;
        }
        feed(&mut ex, &mut wire, &mut headers_out, &chunk.data, i == last, chunk.flush, chunk.at_ms)?;
    }
    if spec.chunks.is_empty() {
        feed(&mut ex, &mut wire, &mut headers_out, &[], true, false, 0)?;
    }
    assert!(headers_out, "headers never released");
    wire.mode = ex.mode();
    wire.transcode = ex.transcode_outcome();
    Ok(wire)
}

/// Feeds one chunk, and empty ones for as long as the core has more, as hosts do.
fn feed(
    ex: &mut Exchange,
    wire: &mut Wire,
    headers_out: &mut bool,
    chunk: &[u8],
    end: bool,
    flush: bool,
    at: u64,
) -> Result<(), rpcedge_core::Error> {
    let mut out = ex.feed(chunk, end, flush, at)?;
    loop {
        collect(wire, headers_out, at, out.headers.cloned(), out.data);
        if !out.more {
            return Ok(());
        }
        out = ex.feed(&[], false, false, at)?;
    }
}

fn collect(wire: &mut Wire, headers_out: &mut bool, at: u64, headers: Option<HeaderEdits>, data: &[u8]) {
    if let Some(edits) = headers {
        assert!(!*headers_out, "headers released twice");
        *headers_out = true;
        wire.headers_at_ms = at;
        apply(wire, &edits);
    }
    if !data.is_empty() {
        assert!(*headers_out, "body bytes before headers");
        wire.body.extend_from_slice(data);
        wire.sends.push((at, data.len()));
    }
}

fn apply(wire: &mut Wire, edits: &HeaderEdits) {
    wire.edits = edits.clone();
    match edits.content_length {
        LengthEdit::Keep => {}
        LengthEdit::Set(n) => wire.content_length = Some(n),
        LengthEdit::Remove => wire.content_length = None,
    }
}

/// Splits `body` into chunks at the given cut points.
pub fn chunked(body: &[u8], cuts: &[usize], gap_ms: u64) -> Vec<Chunk> {
    let mut points: Vec<usize> = cuts.iter().map(|c| c % (body.len() + 1)).collect();
    points.push(0);
    points.push(body.len());
    points.sort_unstable();
    points.dedup();
    points
        .windows(2)
        .enumerate()
        .map(|(i, w)| Chunk { data: body[w[0]..w[1]].to_vec(), flush: false, at_ms: i as u64 * gap_ms })
        .collect()
}
