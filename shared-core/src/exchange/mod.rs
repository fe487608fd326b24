//! One exchange's way through rpcedge, as a sans-IO state machine.
//!
//! Two stages, chained: the transcoding stage (`transcoding.rs`) holds a body that goes out in
//! the other encoding (JSON or SSZ) and hands on the transcoded body, or the body as it came (or
//! transcodes a long witness as it arrives and hands on its SSZ piece by piece); the compression
//! stage (`compression.rs`) compresses what it is handed, whole or chunk by chunk. Both write
//! into one set of header edits.
//!
//! The host feeds the request head, then the response head, which yields a [`BodyPlan`], then the
//! body chunk by chunk (with end and flush flags and the time each arrived), getting back header
//! edits and the bytes to send. It also asks [`Exchange::deadline`] when to feed an empty chunk
//! as a timer tick, so held data never waits longer than `stream_delay`.
//!
//! A host that can run work off its event loop may say so ([`Exchange::offload_whole_bodies`]);
//! a large buffered body then ends as a [`WholeBody`] job for the host to run on a thread and
//! give back, rather than being compressed inside [`Exchange::feed`].

use std::fmt;
use std::sync::Arc;

use crate::compress::StreamError;
use crate::config::Settings;
use crate::negotiate::{media_type, Coding};
use crate::node::Node;
use crate::transcode::{TranscodeError, WitnessForm, EXECUTION_OPTIMISTIC_HEADER, FINALIZED_HEADER};

mod budget;
mod compression;
mod decoding;
mod transcoding;

use compression::{Compression, Sink, Step};
use decoding::Decoding;
use transcoding::{Transcoding, REQUEST_BODY_MAX};

/// The response headers that carry a JSON-RPC envelope's members when its result goes out as SSZ:
/// the id's JSON text (`1`, `"a"`) and the `jsonrpc` version.
pub const JSONRPC_ID_HEADER: &str = "X-Rpcedge-Jsonrpc-Id";
pub const JSONRPC_VERSION_HEADER: &str = "X-Rpcedge-Jsonrpc-Version";
/// What the host does with the body, decided at the response head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum BodyPlan {
    /// Apply [`Exchange::edits`], send the headers and pass the body on untouched: stop feeding.
    Pass = 0,
    /// Hold the headers and feed the body; an [`Output`] carries the headers when they may go.
    Buffer = 1,
    /// Apply [`Exchange::edits`], send the headers now and feed the body.
    Stream = 2,
}

/// What happened to the body, for logs and metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Mode {
    /// Not decided yet (headers held while buffering).
    Pending = 0,
    /// Not eligible: type, status, method, encoding, no-transform, or the client's choice.
    Untouched = 1,
    /// Below `min_length`: sent as it was.
    Small = 2,
    /// Buffered and compressed whole, with an exact Content-Length.
    Oneshot = 3,
    /// Compressed chunk by chunk.
    Stream = 4,
    /// Buffered, but compressing did not make it smaller: sent as it was.
    Incompressible = 5,
    /// Ended as failed; the host resets the connection.
    Failed = 6,
}

impl Mode {
    /// Every mode, in the order of their codes.
    pub const ALL: [Mode; 7] =
        [Mode::Pending, Mode::Untouched, Mode::Small, Mode::Oneshot, Mode::Stream, Mode::Incompressible, Mode::Failed];

    /// The name in logs and metric names.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Pending => "pending",
            Mode::Untouched => "untouched",
            Mode::Small => "small",
            Mode::Oneshot => "oneshot",
            Mode::Stream => "stream",
            Mode::Incompressible => "incompressible",
            Mode::Failed => "failed",
        }
    }
}

/// What the host does when an exchange fails: the one failure policy of every host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failure {
    /// Nothing has reached the client yet: drop the held response and answer with this status.
    Respond(u16),
    /// The headers (and maybe some body) are out: reset the stream, so that the client sees a
    /// broken response rather than a complete-looking, truncated one.
    Reset,
}

/// What to do with the Content-Length header.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LengthEdit {
    #[default]
    Keep,
    Set(u64),
    Remove,
}

/// What to do with the ETag header.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum EtagEdit {
    #[default]
    Keep,
    /// Replace it with this: a strong ETag weakened, as the bytes changed but not their meaning.
    Set(Vec<u8>),
    /// Drop it: not a valid entity tag, so it cannot be weakened.
    Remove,
}

/// The response header changes the host applies before the headers go out.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HeaderEdits {
    /// Set Content-Encoding to this coding.
    pub content_encoding: Option<Coding>,
    pub content_length: LengthEdit,
    /// Replace Content-Type with this: the body was transcoded.
    pub content_type: Option<&'static str>,
    /// Append `Vary: Accept-Encoding`.
    pub add_vary: bool,
    /// Append `Vary: Accept`: the body's encoding (JSON or SSZ) follows the client's Accept.
    pub add_vary_accept: bool,
    /// Append `Vary: Available-Dictionary`: the location makes dcz, which goes to a client by
    /// the dictionary it has (RFC 9842 §6.2).
    pub vary_dictionary: bool,
    /// Set these headers (replacing any of the same name).
    pub set: Vec<(&'static str, Vec<u8>)>,
    /// A compressed body's ETag is always weak or absent.
    pub etag: EtagEdit,
    /// Drop Accept-Ranges: ranges of the original do not apply to the encoded body.
    pub remove_accept_ranges: bool,
    /// Drop the node's Content-Encoding: the body was decoded (a `content_encoding` set replaces
    /// it anyway).
    pub remove_content_encoding: bool,
}

/// The bytes to send for one feed.
#[derive(Debug, PartialEq, Eq)]
pub struct Output<'a> {
    /// Present once, when held headers are to go out now, edited as it says.
    pub headers: Option<&'a HeaderEdits>,
    pub data: &'a [u8],
    /// Push `data` to the client now.
    pub flush: bool,
    /// The body is complete.
    pub end: bool,
    /// The body is in and a [`WholeBody`] job waits: take it with [`Exchange::take_whole_body`],
    /// run it off the event loop and give it back with [`Exchange::complete_whole_body`].
    pub work: bool,
    /// More of the body is ready: once `data` is on its way, feed an empty chunk (not the end)
    /// for it. The body's last chunk may yield a transcoded body this way, piece by piece.
    pub more: bool,
}

impl<'a> Output<'a> {
    /// Nothing to send yet.
    fn nothing(out: &'a [u8]) -> Self {
        Output { headers: None, data: out, flush: false, end: false, work: false, more: false }
    }
}

/// A whole buffered body to compress, self-contained so that it can run on any thread.
#[derive(Debug)]
pub struct WholeBody {
    coding: Coding,
    level: u32,
    body: Vec<u8>,
    /// Set by [`WholeBody::run`]: the compressed bytes, or `None` when they were not smaller.
    compressed: Option<Option<Vec<u8>>>,
}

/// What became of transcoding, for logs and metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum TranscodeOutcome {
    /// Not asked for, not configured, or not a body with a schema.
    None = 0,
    /// The body went out transcoded.
    Transcoded = 1,
    /// The body could have been transcoded but went out as it came
    /// ([`Exchange::transcode_refusal`] says why).
    Refused = 2,
}

/// Why an exchange ended as failed. Before the headers are out the host may answer with an
/// error status; after, it must reset the connection rather than end the body cleanly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// The body did not match its Content-Length.
    LengthMismatch {
        declared: u64,
        received: u64,
    },
    Stream(StreamError),
    /// A body transcoded as it arrived turned out not to be transcodable; it was not kept.
    Transcode(TranscodeError),
    /// A call out of order (body before head, body after end).
    OutOfOrder(&'static str),
    /// An encoded answer that did not decode, or decoded past the bound.
    Decode(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::LengthMismatch { declared, received } => {
                write!(f, "upstream body does not match its Content-Length: declared {declared}, received {received}")
            }
            Error::Stream(e) => e.fmt(f),
            Error::Transcode(e) => write!(f, "a witness transcoded as it arrived cannot be transcoded: {e}"),
            Error::OutOfOrder(what) => write!(f, "call out of order: {what}"),
            Error::Decode(why) => f.write_str(why),
        }
    }
}

impl std::error::Error for Error {}

/// What the response head says that matters here.
#[derive(Debug, Default)]
struct ResponseFacts {
    content_length: Option<u64>,
    bad_length: bool,
    compressible_type: bool,
    encoded: bool,
    /// The one coding of an encoded body, where the core can undo it.
    coding: Option<Coding>,
    no_transform: bool,
    content_range: bool,
    etag: Option<Vec<u8>>,
    varies_already: bool,
    /// The node's Vary names Available-Dictionary (or is `*`).
    varies_on_dictionary: bool,
    /// `application/json`: a body the transcoders read.
    json: bool,
    /// `Eth-Consensus-Version`.
    consensus_version: Option<Vec<u8>>,
    /// `application/octet-stream`, in this witness form (its `witness` parameter).
    ssz: Option<WitnessForm>,
    /// `Eth-Execution-Optimistic` and `Eth-Consensus-Finalized`.
    execution_optimistic: Option<bool>,
    finalized: Option<bool>,
}

/// What the request head says that matters here.
#[derive(Debug, Default)]
struct RequestFacts {
    head: bool,
    post: bool,
    get: bool,
    /// The host's cache may keep the answer.
    cached: bool,
    /// Its Content-Type is JSON: with POST, a JSON-RPC call (geth and erigon refuse any other).
    json: bool,
    /// Its path is a Beacon-API route (`/eth/v<N>/`, after any prefix the proxy strips).
    beacon_api: bool,
}

impl RequestFacts {
    /// A request for the node: a JSON-RPC call, or a Beacon-API read. Only on these has rpcedge
    /// work of its own with the node; any other request (a page, a file, an API of the
    /// operator's) goes to its upstream as the client sent it, so that the modules and filters
    /// beside rpcedge see what they would without it.
    fn for_the_node(&self) -> bool {
        (self.post && self.json) || ((self.get || self.head) && self.beacon_api)
    }
}

/// One request/response exchange: the transcoding stage, then the compression stage over what it
/// hands on.
pub struct Exchange {
    settings: Arc<Settings>,
    /// What the exchanges of this configuration learn about its node.
    node: Arc<Node>,
    request: RequestFacts,
    response: ResponseFacts,
    transcoding: Transcoding,
    compression: Compression,
    edits: HeaderEdits,
    out: Vec<u8>,
    bytes_in: u64,
    bytes_out: u64,
    /// The node's Content-Length, which the body must match (kept apart: the response's facts
    /// lose it when the body becomes one of another length, not known until its end).
    declared_length: Option<u64>,
    /// The response headers have gone to the client (as far as the core knows).
    headers_out: bool,
    /// The host sends the head before any of the body ([`Exchange::headers_at_head`]).
    headers_at_head: bool,
    /// The node's answer, encoded regardless, decoded as it arrives.
    decoding: Option<Decoding>,
}

impl Exchange {
    /// An exchange under a configuration's settings, with what that configuration's exchanges
    /// have learned about its node.
    pub fn new(settings: Arc<Settings>, node: Arc<Node>) -> Self {
        Exchange {
            settings,
            node,
            request: RequestFacts::default(),
            response: ResponseFacts::default(),
            transcoding: Transcoding::new(),
            compression: Compression::new(),
            edits: HeaderEdits::default(),
            out: Vec::new(),
            bytes_in: 0,
            bytes_out: 0,
            declared_length: None,
            headers_out: false,
            headers_at_head: false,
            decoding: None,
        }
    }

    /// The host must send the response head before it sees any of the body (OpenResty's
    /// header_filter_by_lua, which cannot hold it): the plan is never `Buffer`. A body that would
    /// be buffered for an exact length streams instead, and none is transcoded, which needs the
    /// whole body before the head.
    pub fn headers_at_head(&mut self) {
        self.headers_at_head = true;
        self.compression.stream_at_head();
    }

    /// The host can run [`WholeBody`] jobs off its event loop: a buffered body of at least
    /// `offload_min_length` then ends with [`Output::work`] rather than compressed.
    pub fn offload_whole_bodies(&mut self) {
        self.compression.offload_whole_bodies();
    }

    pub fn request_method(&mut self, method: &[u8]) {
        self.request.head = method.eq_ignore_ascii_case(b"HEAD");
        self.request.post = method.eq_ignore_ascii_case(b"POST");
        self.request.get = method.eq_ignore_ascii_case(b"GET");
    }

    /// The request's path (with or without its query): a Beacon-API route that can answer in SSZ
    /// matters.
    pub fn request_path(&mut self, path: &[u8]) {
        self.request.beacon_api = crate::transcode::is_beacon_api_path(path);
        self.transcoding.request_path(path);
    }

    /// Any request header; Accept-Encoding, Available-Dictionary, Accept and Content-Type matter.
    pub fn request_header(&mut self, name: &[u8], value: &[u8]) {
        if name.eq_ignore_ascii_case(b"content-type") {
            let media = media_type(value);
            self.request.json =
                media.eq_ignore_ascii_case(b"application/json") || media.eq_ignore_ascii_case(b"application/json-rpc");
        } else if name.eq_ignore_ascii_case(b"accept-encoding") {
            self.compression.accept_encoding(value);
        } else if name.eq_ignore_ascii_case(b"available-dictionary") {
            self.compression.available_dictionary(value);
        } else if name.eq_ignore_ascii_case(b"accept") {
            self.transcoding.accept(value);
        }
    }

    /// Whether the core needs the request body (after the request head; see
    /// [`Exchange::takes_request_body`] for its bound): a JSON-RPC call whose client asks for SSZ,
    /// which only the method in the body can say has a schema.
    pub fn wants_request_body(&self) -> bool {
        self.transcoding.wants_request_body(&self.settings, &self.request)
    }

    /// Whether a request body of `length` bytes is one the core reads; a host holding a longer
    /// one stops and lets the request go on.
    pub fn takes_request_body(length: usize) -> bool {
        length <= REQUEST_BODY_MAX
    }

    /// The whole request body, when [`Exchange::wants_request_body`] said so. A host that cannot
    /// hold it whole does not call this: the response then goes out as it comes.
    pub fn request_body(&mut self, body: &[u8]) {
        self.transcoding.request_body(body, &self.settings, &self.request);
    }

    /// After the request head (and its body, where [`Exchange::wants_request_body`] said so):
    /// the Accept to send the node in place of the client's, when it is to be asked for SSZ.
    /// The host then also drops Accept-Encoding towards the node: an encoded answer could not be
    /// rendered. A JSON-RPC call with a schema is always asked; a Beacon-API object only once the
    /// node's SSZ answers have shown that they carry what the JSON envelope needs besides the
    /// data (otherwise the JSON client gets the node's JSON as before), and never a state, which
    /// is too large to hold whole.
    pub fn upstream_accept(&mut self) -> Option<&'static str> {
        self.transcoding.upstream_accept(&self.settings, &self.node, &self.request)
    }

    /// The host's cache may keep the node's answer to this request (its route has the cache on):
    /// the node is then asked for identity too (see [`Exchange::node_identity`]).
    pub fn cache_may_keep(&mut self) {
        self.request.cached = true;
    }

    /// After the request head: whether the node is to answer identity, that is whether the host
    /// removes `Accept-Encoding` from the request it sends the node (after feeding it here), and
    /// from that request only. So it is wherever rpcedge may have work on the node's answer: a
    /// request for the node ([`RequestFacts::for_the_node`]) whose answer it may compress for
    /// this client or transcode (the node asked for SSZ by [`Exchange::upstream_accept`]
    /// included), or any answer the cache may keep. Real nodes (geth, erigon) compress when
    /// asked, and an answer that comes encoded would have to be decoded first.
    pub fn node_identity(&self) -> bool {
        self.request.cached
            || (self.request.for_the_node()
                && (self.compression.may_encode(&self.settings) || self.transcoding.may_transcode(&self.settings)))
    }

    /// The node's answer came encoded (see [`crate::metrics::Counter::UpstreamEncoded`]).
    pub fn upstream_encoded(&self) -> bool {
        self.response.encoded || self.decoding.is_some()
    }

    /// Any response header. A host may instead pass the length with
    /// [`Exchange::response_content_length`] where it keeps it apart.
    pub fn response_header(&mut self, name: &[u8], value: &[u8]) {
        let facts = &mut self.response;
        let value = value.trim_ascii();
        if name.eq_ignore_ascii_case(b"content-length") {
            match std::str::from_utf8(value)
                .ok()
                .filter(|v| v.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|v| v.parse().ok())
            {
                Some(n) => self.response_content_length(Some(n)),
                None => facts.bad_length = true,
            }
        } else if name.eq_ignore_ascii_case(b"content-type") {
            facts.compressible_type = self.settings.compresses_type(value);
            let media = media_type(value);
            facts.json = media.eq_ignore_ascii_case(b"application/json");
            facts.ssz =
                media.eq_ignore_ascii_case(b"application/octet-stream").then(|| crate::negotiate::witness_form(value));
        } else if name.eq_ignore_ascii_case(b"content-encoding") {
            if !value.is_empty() && !value.eq_ignore_ascii_case(b"identity") {
                // a second coding (another field line) is one the core does not undo
                facts.coding = if facts.encoded { None } else { Coding::from_token(value).filter(|&c| Decoding::undoes(c)) };
                facts.encoded = true;
            }
        } else if name.eq_ignore_ascii_case(b"cache-control") {
            facts.no_transform |= list_has(value, b"no-transform");
        } else if name.eq_ignore_ascii_case(b"content-range") {
            facts.content_range = true;
        } else if name.eq_ignore_ascii_case(b"etag") {
            facts.etag = Some(value.to_vec());
        } else if name.eq_ignore_ascii_case(b"eth-consensus-version") {
            facts.consensus_version = Some(value.to_vec());
        } else if name.eq_ignore_ascii_case(EXECUTION_OPTIMISTIC_HEADER.as_bytes()) {
            facts.execution_optimistic = parse_flag(value);
        } else if name.eq_ignore_ascii_case(FINALIZED_HEADER.as_bytes()) {
            facts.finalized = parse_flag(value);
        } else if name.eq_ignore_ascii_case(b"vary") {
            facts.varies_already |= list_has(value, b"accept-encoding") || list_has(value, b"*");
            facts.varies_on_dictionary |= list_has(value, b"available-dictionary") || list_has(value, b"*");
        }
    }

    pub fn response_content_length(&mut self, length: Option<u64>) {
        let facts = &mut self.response;
        match (facts.content_length, length) {
            // Two different lengths: the framing is unknowable, so leave the response alone.
            (Some(a), Some(b)) if a != b => facts.bad_length = true,
            _ => facts.content_length = length.or(facts.content_length),
        }
    }

    /// Decides what happens to the body, once all response headers are in. An answer that came
    /// gzip or deflate regardless is planned as the plain body it decodes to, of a length not
    /// known yet, where the exchange has work on it; where it has none (the plan passes the body
    /// on), it goes out as it came to a client that takes its coding, and decoded as it arrives
    /// to one that does not.
    pub fn response_head(&mut self, status: u16) -> BodyPlan {
        self.declared_length = self.response.content_length;
        let undone = self.response.coding.filter(|_| self.may_undo(status));
        let client_takes = undone.is_some_and(|coding| self.compression.client_takes(coding));
        let coding = undone.filter(|_| self.node_identity() || !client_takes);
        if coding.is_some() {
            self.response.encoded = false;
            self.response.content_length = None;
        }
        let plan = self.plan(status);
        let plan = match coding {
            // nothing to do on the body, for a client that takes the coding: as it came
            Some(_) if plan == BodyPlan::Pass && client_takes => {
                self.response.encoded = true;
                self.response.content_length = self.declared_length;
                self.compression.response_head(&self.settings, &self.response, status, self.request.head, &mut self.edits);
                let mut sink =
                    Sink { settings: &self.settings, response: &self.response, edits: &mut self.edits, out: &mut self.out };
                self.compression.plan(&mut sink)
            }
            Some(coding) => {
                self.decoding = Some(Decoding::new(coding, self.settings.transcode_max));
                self.edits.remove_content_encoding = true;
                // the node's tag named the encoded representation
                if self.response.etag.is_some() && self.edits.etag == EtagEdit::Keep {
                    self.edits.etag = EtagEdit::Remove;
                }
                if plan == BodyPlan::Pass {
                    // nothing else to do but decode, for a client that does not take the coding;
                    // the node's ranges were of its encoded bytes
                    self.edits.content_length = LengthEdit::Remove;
                    self.edits.remove_accept_ranges = true;
                    BodyPlan::Stream
                } else {
                    plan
                }
            }
            None => plan,
        };
        if undone.is_some() {
            // whether the node's coding goes out depends on what the client takes
            self.edits.add_vary = !self.response.varies_already;
        }
        plan
    }

    /// Whether the node's answer in an undoable coding may be decoded at all: only an answer to a
    /// request for the node, or one the cache may keep (any other goes out as its upstream sent
    /// it, for nginx's gunzip or Envoy's decompressor to decide), and not for a HEAD, a status
    /// without a whole body, `no-transform`, a range, or a length that cannot be read.
    fn may_undo(&self, status: u16) -> bool {
        let facts = &self.response;
        (self.request.for_the_node() || self.request.cached)
            && !(self.request.head
            || matches!(status, 100..=199 | 204 | 206 | 304)
            || facts.no_transform
            || facts.content_range
            || facts.bad_length)
    }

    /// The plan for the response as its facts now say.
    fn plan(&mut self, status: u16) -> BodyPlan {
        self.compression.response_head(&self.settings, &self.response, status, self.request.head, &mut self.edits);
        let holds = !self.headers_at_head
            && self.transcoding.response_head(
                status,
                &self.response,
                &self.settings,
                &self.node,
                &self.request,
                &mut self.edits,
            );
        let plan = if holds {
            BodyPlan::Buffer
        } else {
            let mut sink =
                Sink { settings: &self.settings, response: &self.response, edits: &mut self.edits, out: &mut self.out };
            self.compression.plan(&mut sink)
        };
        self.headers_out = plan != BodyPlan::Buffer;
        plan
    }

    /// The header edits in force: after [`Exchange::response_head`] for `Pass` and `Stream`, and
    /// as given with the [`Output`] that releases held headers.
    pub fn edits(&self) -> &HeaderEdits {
        &self.edits
    }

    pub fn mode(&self) -> Mode {
        self.compression.mode()
    }

    pub fn transcode_outcome(&self) -> TranscodeOutcome {
        self.transcoding.outcome()
    }

    /// Why a body that could have been transcoded went out as it came.
    pub fn transcode_refusal(&self) -> Option<&TranscodeError> {
        self.transcoding.refusal()
    }

    /// Body bytes fed in and sent out, for the compression ratio.
    pub fn counts(&self) -> (u64, u64) {
        (self.bytes_in, self.bytes_out)
    }

    /// When the host should feed an empty chunk as a timer tick (milliseconds, on the clock of
    /// `now_ms`), or `None` when nothing is held.
    pub fn deadline(&self) -> Option<u64> {
        self.compression.deadline(&self.settings, self.response.content_length.is_some())
    }

    /// Feeds one body chunk (possibly empty: a timer tick or a bare flush or end).
    pub fn feed(&mut self, chunk: &[u8], end: bool, flush: bool, now_ms: u64) -> Result<Output<'_>, Error> {
        self.out.clear();
        self.bytes_in += chunk.len() as u64;
        let mut decoded = Vec::new();
        let chunk = match &mut self.decoding {
            Some(decoding) => match decoding.feed(chunk, end, &mut decoded) {
                Ok(()) => &decoded[..],
                Err(e) => {
                    self.fail();
                    return Err(e);
                }
            },
            None => chunk,
        };
        if self.transcoding.streaming() || self.transcoding.stream_held(chunk.len(), &self.settings, &self.response) {
            return self.feed_stream(chunk, end, now_ms);
        }
        let (headers, flush) = match self.check_length(end).and_then(|()| self.step(chunk, end, flush, now_ms)) {
            Ok(step) => step,
            Err(e) => {
                self.fail();
                return Err(e);
            }
        };
        self.headers_out |= headers;
        let work = self.compression.has_job();
        let end = end && !work;
        self.bytes_out += self.out.len() as u64;
        Ok(Output { headers: headers.then_some(&self.edits), data: &self.out, flush: flush || end, end, work, more: false })
    }

    /// A witness transcoded as it arrives: its JSON read, then at its end its SSZ, handed out a
    /// piece per feed; or the node's SSZ rendered as JSON, handed out as each chunk renders.
    fn feed_stream(&mut self, chunk: &[u8], end: bool, now_ms: u64) -> Result<Output<'_>, Error> {
        if self.transcoding.rendering() {
            return self.feed_render(chunk, end, now_ms);
        }
        if let Err(e) = self.read_stream(chunk, end) {
            self.fail();
            return Err(e);
        }
        if self.transcoding.holding() {
            return Ok(Output::nothing(&self.out));
        }
        self.pass_on(Piece::Ssz, now_ms)
    }

    /// The node's SSZ witness rendered as JSON as it arrives: each chunk's JSON goes on as a body
    /// of unknown length, through the compression stage (held up to `max_buffer`, then streamed)
    /// or as it is. A failure once the headers are out resets the response.
    fn feed_render(&mut self, chunk: &[u8], end: bool, now_ms: u64) -> Result<Output<'_>, Error> {
        let rendered = self.check_length(end).and_then(|()| {
            let settings = &self.settings;
            self.transcoding.render(chunk, end, settings, &mut self.response, &mut self.edits).map_err(Error::Transcode)
        });
        let began = match rendered {
            Ok(began) => began,
            Err(e) => {
                self.fail();
                return Err(e);
            }
        };
        if began {
            let mut sink =
                Sink { settings: &self.settings, response: &self.response, edits: &mut self.edits, out: &mut self.out };
            self.compression.retype(b"application/json", &mut sink);
            if self.compression.plan_for(None, &mut sink) == BodyPlan::Pass {
                sink.edits.content_length = LengthEdit::Remove;
            }
        }
        self.pass_on(Piece::Rendered { end }, now_ms)
    }

    /// Hands on a piece that the transcoding stage made, as it is or through the compression
    /// stage.
    fn pass_on(&mut self, piece: Piece, now_ms: u64) -> Result<Output<'_>, Error> {
        let first = !self.headers_out;
        // (the stages are borrowed apart: the piece is the transcoding stage's)
        let (piece, last, more) = match piece {
            Piece::Rendered { end } => (self.transcoding.rendered(), end, false),
            Piece::Ssz => match self.transcoding.next_piece() {
                Some((piece, last)) => (piece, last, !last),
                None => {
                    self.compression.fail();
                    return Err(Error::OutOfOrder("body after the end"));
                }
            },
        };
        let (data, headers, flush) = if self.compression.transforms() {
            let mut sink =
                Sink { settings: &self.settings, response: &self.response, edits: &mut self.edits, out: &mut self.out };
            let (sent, flush) = match self.compression.feed(piece, last, false, now_ms, &mut sink) {
                Ok(step) => step,
                Err(e) => {
                    self.compression.fail();
                    self.out.clear();
                    return Err(e);
                }
            };
            // a stream's headers go with its first part, a buffered body's with the body
            (&self.out[..], first && (sent || self.compression.mode() == Mode::Stream), flush)
        } else {
            (piece, first, last)
        };
        self.headers_out |= headers;
        self.bytes_out += data.len() as u64;
        let work = self.compression.has_job();
        let end = last && !work;
        Ok(Output { headers: headers.then_some(&self.edits), data, flush: flush || end, end, work, more })
    }

    /// Reads a chunk of a witness transcoded as it arrives; at its end, the SSZ's body plan.
    fn read_stream(&mut self, chunk: &[u8], end: bool) -> Result<(), Error> {
        self.check_length(end)?;
        if !self.transcoding.holding() {
            return match chunk.is_empty() && !end {
                true => Ok(()),
                false => Err(Error::OutOfOrder("body after the end")),
            };
        }
        let Some(length) = self.transcoding.read(chunk, end, &self.settings, &mut self.response, &mut self.edits).map_err(Error::Transcode)?
        else {
            return Ok(());
        };
        let mut sink = Sink { settings: &self.settings, response: &self.response, edits: &mut self.edits, out: &mut self.out };
        let content_type = sink.edits.content_type.unwrap_or_default();
        self.compression.retype(content_type.as_bytes(), &mut sink);
        if self.compression.plan_for(Some(length), &mut sink) == BodyPlan::Pass {
            sink.edits.content_length = LengthEdit::Set(length);
        }
        Ok(())
    }

    /// What the host does now that the exchange failed (a feed returned an error).
    pub fn failure(&self) -> Failure {
        if self.headers_out {
            Failure::Reset
        } else {
            Failure::Respond(502)
        }
    }

    /// The host lost the body before its end (the upstream reset, or its codec gave up): the
    /// exchange fails, and this says what to do about it.
    pub fn abort(&mut self) -> Failure {
        self.fail();
        self.failure()
    }

    fn fail(&mut self) {
        self.compression.fail();
        self.out.clear();
    }

    /// The job that [`Output::work`] announced; `None` when there is none (or it was taken).
    pub fn take_whole_body(&mut self) -> Option<WholeBody> {
        self.compression.take_whole_body()
    }

    /// Takes a job back, run or not (then it runs here), and gives what the body's end would
    /// have given inline: the headers, the body and the end.
    pub fn complete_whole_body(&mut self, mut job: WholeBody) -> Result<Output<'_>, Error> {
        self.out.clear();
        if !self.compression.awaits_job() {
            self.fail();
            return Err(Error::OutOfOrder("a whole body given back that was not taken"));
        }
        job.run();
        let mut sink =
            Sink { settings: &self.settings, response: &self.response, edits: &mut self.edits, out: &mut self.out };
        self.compression.send_whole(job, &mut sink);
        self.headers_out = true;
        self.bytes_out += self.out.len() as u64;
        Ok(Output { headers: Some(&self.edits), data: &self.out, flush: true, end: true, work: false, more: false })
    }

    /// A body this filter transforms must match its declared length, however it is sent: a
    /// longer one is cut at the length by the host's codec, a shorter one was truncated.
    fn check_length(&self, end: bool) -> Result<(), Error> {
        let declared = match self.declared_length {
            Some(declared) if self.transcoding.holding() || self.compression.transforms() || self.decoding.is_some() => {
                declared
            }
            _ => return Ok(()),
        };
        let received = self.bytes_in;
        if received > declared || (end && received < declared) {
            Err(Error::LengthMismatch { declared, received })
        } else {
            Ok(())
        }
    }

    /// Runs one feed through the stages: the transcoding stage holds the body until its end, then
    /// hands the compression stage the whole body, transcoded or as it came; one that outgrows
    /// `transcode_max` goes to the compression stage as it comes.
    fn step(&mut self, chunk: &[u8], end: bool, flush: bool, now_ms: u64) -> Result<Step, Error> {
        let mut sink =
            Sink { settings: &self.settings, response: &self.response, edits: &mut self.edits, out: &mut self.out };
        if !self.transcoding.holding() {
            return self.compression.feed(chunk, end, flush, now_ms, &mut sink);
        }
        if let Err(held) = self.transcoding.hold(chunk, &self.settings) {
            return self.compression.resume(held, chunk, end, flush, now_ms, &mut sink);
        }
        if !end {
            return Ok((false, false));
        }
        let finished = self.transcoding.finish(&mut self.response, &mut self.edits);
        let mut sink =
            Sink { settings: &self.settings, response: &self.response, edits: &mut self.edits, out: &mut self.out };
        let body = match finished {
            Ok(transcoded) => {
                let content_type = sink.edits.content_type.unwrap_or_default();
                self.compression.retype(content_type.as_bytes(), &mut sink);
                transcoded
            }
            Err(untranscoded) => untranscoded,
        };
        let sent = self.compression.whole(body, &mut sink);
        Ok((sent, sent))
    }
}

/// What the transcoding stage has to hand on: the next piece of a witness's SSZ, or the JSON that
/// the last chunk rendered (`end`: the last).
enum Piece {
    Ssz,
    Rendered { end: bool },
}

/// A `true` or `false` header value.
fn parse_flag(value: &[u8]) -> Option<bool> {
    if value.eq_ignore_ascii_case(b"true") {
        Some(true)
    } else if value.eq_ignore_ascii_case(b"false") {
        Some(false)
    } else {
        None
    }
}

/// Whether a comma-separated header list names `token` (case-insensitive, parameters ignored).
fn list_has(value: &[u8], token: &[u8]) -> bool {
    value.split(|&b| b == b',').any(|item| {
        let name = item.split(|&b| b == b'=' || b == b';').next().unwrap_or_default();
        name.trim_ascii().eq_ignore_ascii_case(token)
    })
}
