//! One exchange's way through rpcedge, as a sans-IO state machine.
//!
//! The host feeds the request head, then the response head, which yields a [`BodyPlan`], then the
//! body chunk by chunk (with end and flush flags and the time each arrived), getting back header
//! edits and the bytes to send. It also asks [`Exchange::deadline`] when to feed an empty chunk
//! as a timer tick, so held data never waits longer than `stream_delay`.
//!
//! A host that can run work off its event loop may say so ([`Exchange::offload_whole_bodies`]);
//! a large buffered body then ends as a [`WholeBody`] job for the host to run on a thread and
//! give back, rather than being compressed inside [`Exchange::feed`].

use std::ffi::CStr;
use std::fmt;
use std::sync::Arc;

use crate::compress::{compress_whole, Push, StreamEncoder, StreamError};
use crate::config::Settings;
use crate::node::Node;
use crate::negotiate::{media_type, Accept, AcceptEncoding, Coding, MediaType};
use crate::transcode::{
    beacon_from_ssz, beacon_to_ssz, jsonrpc_from_ssz, jsonrpc_request, jsonrpc_to_ssz, BeaconEnvelope, BeaconObject,
    Fork, JsonRpcCall, Schema, TranscodeError, WitnessForm,
};

/// The longest request body the core reads (a single JSON-RPC call's); a longer one is not
/// transcoded.
const REQUEST_BODY_MAX: usize = 64 * 1024;

/// The response headers that carry a JSON-RPC envelope's members when its result goes out as SSZ:
/// the id's JSON text (`1`, `"a"`) and the `jsonrpc` version.
pub const JSONRPC_ID_HEADER: &str = "X-Rpcedge-Jsonrpc-Id";
pub const JSONRPC_VERSION_HEADER: &str = "X-Rpcedge-Jsonrpc-Version";
/// The Beacon-API's header for a response's consensus version.
pub const CONSENSUS_VERSION_HEADER: &str = "Eth-Consensus-Version";
/// The headers in which a node's SSZ answer says what the JSON envelope's `execution_optimistic`
/// and `finalized` say (Lodestar's names; rpcedge sends them on the SSZ it transcodes).
pub const EXECUTION_OPTIMISTIC_HEADER: &str = "Eth-Execution-Optimistic";
pub const FINALIZED_HEADER: &str = "Eth-Consensus-Finalized";
/// The Accept a host sends the node in place of a JSON client's, to ask for SSZ
/// ([`Exchange::upstream_accept`]); a node without SSZ still answers JSON.
const UPSTREAM_SSZ_ACCEPT: &CStr = c"application/octet-stream;q=1, application/json;q=0.9";

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

    /// The name in logs and metric names, NUL-terminated for C hosts.
    pub fn name(self) -> &'static CStr {
        match self {
            Mode::Pending => c"pending",
            Mode::Untouched => c"untouched",
            Mode::Small => c"small",
            Mode::Oneshot => c"oneshot",
            Mode::Stream => c"stream",
            Mode::Incompressible => c"incompressible",
            Mode::Failed => c"failed",
        }
    }

    pub fn as_str(self) -> &'static str {
        self.name().to_str().expect("ASCII")
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
    /// Set these headers (replacing any of the same name).
    pub set: Vec<(&'static str, Vec<u8>)>,
    /// A compressed body's ETag is always weak or absent.
    pub etag: EtagEdit,
    /// Drop Accept-Ranges: ranges of the original do not apply to the encoded body.
    pub remove_accept_ranges: bool,
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

impl WholeBody {
    /// Compresses the body: pure computation, touching nothing but the job.
    pub fn run(&mut self) {
        if self.compressed.is_none() {
            self.compressed = Some(compress_whole(self.coding, self.level, &self.body));
        }
    }
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

/// Where transcoding stands.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Transcoding {
    None,
    /// The client asked for SSZ of a JSON-RPC result with this schema.
    WantedResult(Schema, WitnessForm),
    /// The client asked for SSZ of this Beacon-API object.
    WantedObject(BeaconObject),
    /// A JSON client's call that the node was asked to answer in SSZ, to render as JSON here.
    AskedResult(JsonRpcCall),
    /// A JSON client's Beacon-API object that the node was asked to send as SSZ.
    AskedObject(BeaconObject),
    Done,
    Refused(TranscodeError),
}

impl Transcoding {
    /// The node was asked for SSZ, to render as JSON here.
    fn asked(&self) -> bool {
        matches!(self, Transcoding::AskedResult(_) | Transcoding::AskedObject(_))
    }

    /// A body is to be transcoded, one way or the other, once it is in.
    fn pending(&self) -> bool {
        self.asked() || matches!(self, Transcoding::WantedResult(..) | Transcoding::WantedObject(_))
    }
}

/// Why an exchange ended as failed. Before the headers are out the host may answer with an
/// error status; after, it must reset the connection rather than end the body cleanly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// The body did not match its Content-Length.
    LengthMismatch { declared: u64, received: u64 },
    Stream(StreamError),
    /// A call out of order (body before head, body after end).
    OutOfOrder(&'static str),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::LengthMismatch { declared, received } => write!(
                f,
                "upstream body does not match its Content-Length: declared {declared}, received {received}"
            ),
            Error::Stream(e) => e.fmt(f),
            Error::OutOfOrder(what) => write!(f, "call out of order: {what}"),
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
    no_transform: bool,
    content_range: bool,
    etag: Option<Vec<u8>>,
    varies_already: bool,
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

enum Phase {
    Head,
    Pass,
    /// `flushed_at_ms`: an upstream flush that came with less than `min_length` held, not yet
    /// passed on; the held bytes go out at most `stream_delay` after it.
    /// (A body of known length waits for its end, with no deadline: `check_length` holds it to
    /// that length.)
    /// `transcode`: held whole (up to `transcode_max`, with no deadline) to transcode.
    Buffering { body: Vec<u8>, last_arrival_ms: u64, flushed_at_ms: Option<u64>, transcode: bool },
    Streaming { encoder: StreamEncoder, held_since_ms: Option<u64> },
    /// The whole body waits as a job for the host (`Some`), or is out with it (`None`).
    Offloaded(Option<WholeBody>),
    Done,
    Failed,
}

/// One request/response exchange.
pub struct Exchange {
    settings: Arc<Settings>,
    /// What the exchanges of this configuration learn about its node.
    node: Arc<Node>,
    accept: AcceptEncoding,
    media: Accept,
    head_request: bool,
    post_request: bool,
    get_request: bool,
    /// The Beacon-API object the request's path names.
    beacon_object: Option<BeaconObject>,
    /// The JSON-RPC call in the request body, kept to ask the node for SSZ.
    call: Option<JsonRpcCall>,
    transcoding: Transcoding,
    response: ResponseFacts,
    coding: Coding,
    /// The response head allows compressing the body as it came (type, status, the client's
    /// Accept-Encoding).
    compressible: bool,
    /// It allows compressing a body of a type to compress: all of the above but the type.
    compressible_as_type: bool,
    phase: Phase,
    mode: Mode,
    edits: HeaderEdits,
    out: Vec<u8>,
    bytes_in: u64,
    bytes_out: u64,
    offload: bool,
    /// The response headers have gone to the client (as far as the core knows).
    headers_out: bool,
}

impl Exchange {
    /// An exchange under a configuration's settings, with what that configuration's exchanges
    /// have learned about its node.
    pub fn new(settings: Arc<Settings>, node: Arc<Node>) -> Self {
        Exchange {
            settings,
            node,
            accept: AcceptEncoding::default(),
            media: Accept::default(),
            head_request: false,
            post_request: false,
            get_request: false,
            beacon_object: None,
            call: None,
            transcoding: Transcoding::None,
            response: ResponseFacts::default(),
            coding: Coding::Gzip,
            compressible: false,
            compressible_as_type: false,
            phase: Phase::Head,
            mode: Mode::Pending,
            edits: HeaderEdits::default(),
            out: Vec::new(),
            bytes_in: 0,
            bytes_out: 0,
            offload: false,
            headers_out: false,
        }
    }

    /// The host can run [`WholeBody`] jobs off its event loop: a buffered body of at least
    /// `offload_min_length` then ends with [`Output::work`] rather than compressed.
    pub fn offload_whole_bodies(&mut self) {
        self.offload = true;
    }

    pub fn request_method(&mut self, method: &[u8]) {
        self.head_request = method.eq_ignore_ascii_case(b"HEAD");
        self.post_request = method.eq_ignore_ascii_case(b"POST");
        self.get_request = method.eq_ignore_ascii_case(b"GET");
    }

    /// The request's path (with or without its query): a Beacon-API route that can answer in SSZ
    /// matters.
    pub fn request_path(&mut self, path: &[u8]) {
        self.beacon_object = BeaconObject::from_route(path);
    }

    /// Any request header; Accept-Encoding and Accept matter.
    pub fn request_header(&mut self, name: &[u8], value: &[u8]) {
        if name.eq_ignore_ascii_case(b"accept-encoding") {
            self.accept.add(value);
        } else if name.eq_ignore_ascii_case(b"accept") {
            self.media.add(value);
        }
    }

    /// Whether the core needs the request body (after the request head; see
    /// [`Exchange::takes_request_body`] for its bound): a JSON-RPC call whose client asks for SSZ,
    /// which only the method in the body can say has a schema.
    pub fn wants_request_body(&self) -> bool {
        self.wanted_form().is_some() || self.may_ask_for_ssz()
    }

    /// Whether the node may be asked for SSZ in place of the JSON that the client chooses.
    fn may_ask_for_ssz(&self) -> bool {
        self.settings.transcode_upstream_ssz && matches!(self.media.choose(), Some(MediaType::Json))
    }

    /// The SSZ witness form a transcoding call's client asks for; `None` when the call is not one.
    fn wanted_form(&self) -> Option<WitnessForm> {
        match self.media.choose() {
            Some(MediaType::Ssz(form)) if self.settings.transcode && self.post_request => Some(form),
            _ => None,
        }
    }

    /// Whether a request body of `length` bytes is one the core reads; a host holding a longer
    /// one stops and lets the request go on.
    pub fn takes_request_body(length: usize) -> bool {
        length <= REQUEST_BODY_MAX
    }

    /// The whole request body, when [`Exchange::wants_request_body`] said so. A host that cannot
    /// hold it whole does not call this: the response then goes out as it comes.
    pub fn request_body(&mut self, body: &[u8]) {
        if !self.wants_request_body() || !Self::takes_request_body(body.len()) {
            return;
        }
        let Some(call) = jsonrpc_request(body) else { return };
        match self.wanted_form() {
            Some(form) => self.transcoding = Transcoding::WantedResult(call.schema, form),
            None => self.call = Some(call),
        }
    }

    /// After the request head (and its body, where [`Exchange::wants_request_body`] said so):
    /// the Accept to send the node in place of the client's, when it is to be asked for SSZ.
    /// The host then also drops Accept-Encoding towards the node: an encoded answer could not be
    /// rendered. A JSON-RPC call with a schema is always asked; a Beacon-API object only once the
    /// node's SSZ answers have shown that they carry what the JSON envelope needs besides the
    /// data (otherwise the JSON client gets the node's JSON as before), and never a state, which
    /// is too large to hold whole.
    pub fn upstream_accept(&mut self) -> Option<&'static CStr> {
        if self.transcoding == Transcoding::None && self.may_ask_for_ssz() {
            if let Some(call) = self.call.take().filter(|_| self.post_request) {
                self.transcoding = Transcoding::AskedResult(call);
            } else if let Some(object) = self.beacon_object.filter(|&object| {
                self.get_request && object != BeaconObject::State && self.node.sends_beacon_metadata()
            }) {
                self.transcoding = Transcoding::AskedObject(object);
            }
        }
        self.transcoding.asked().then_some(UPSTREAM_SSZ_ACCEPT)
    }

    /// Any response header. A host may instead pass the length with
    /// [`Exchange::response_content_length`] where it keeps it apart.
    pub fn response_header(&mut self, name: &[u8], value: &[u8]) {
        let facts = &mut self.response;
        let value = value.trim_ascii();
        if name.eq_ignore_ascii_case(b"content-length") {
            match std::str::from_utf8(value).ok().filter(|v| v.bytes().all(|b| b.is_ascii_digit())).and_then(|v| v.parse().ok()) {
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
            facts.encoded |= !value.is_empty() && !value.eq_ignore_ascii_case(b"identity");
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

    /// Decides what happens to the body, once all response headers are in.
    pub fn response_head(&mut self, status: u16) -> BodyPlan {
        let facts = &self.response;
        // Whether this resource's representation depends on Accept-Encoding at all.
        let transformable =
            !facts.encoded && !facts.no_transform && !facts.content_range && !matches!(status, 100..=199 | 204 | 206);
        let varies = facts.compressible_type && transformable;
        self.edits.add_vary = varies && !facts.varies_already;
        let coding = self.accept.choose();
        if let Some(coding) = coding {
            self.coding = coding;
        }
        self.compressible_as_type =
            transformable && coding.is_some() && !self.head_request && status != 304 && !facts.bad_length;
        self.compressible = self.compressible_as_type && facts.compressible_type;
        if let (Some(_), 200, Some(_)) = (self.beacon_object, status, facts.ssz) {
            self.node.saw_beacon_metadata(facts.execution_optimistic.is_some() && facts.finalized.is_some());
        }
        if let (Transcoding::None, Some(object), true) = (&self.transcoding, self.beacon_object, self.get_request) {
            if self.settings.transcode && matches!(self.media.choose(), Some(MediaType::Ssz(_))) {
                self.transcoding = Transcoding::WantedObject(object);
            }
        }
        if self.transcoding.pending() {
            self.edits.add_vary_accept = true;
            match self.transcodable(status) {
                Some(Ok(())) => {
                    let capacity = self.response.content_length.unwrap_or(0).min(self.settings.transcode_max);
                    self.phase = Phase::Buffering {
                        body: Vec::with_capacity(capacity as usize),
                        last_arrival_ms: 0,
                        flushed_at_ms: None,
                        transcode: true,
                    };
                    return BodyPlan::Buffer;
                }
                Some(Err(refusal)) => self.transcoding = Transcoding::Refused(refusal),
                None => self.transcoding = Transcoding::None,
            }
        }
        self.compress_plan()
    }

    /// Whether the response to a call that wants SSZ is one to transcode: `None` when it is not
    /// a body with a schema at all (an error status, not JSON), a refusal when it is one that
    /// cannot be transcoded.
    fn transcodable(&self, status: u16) -> Option<Result<(), TranscodeError>> {
        let facts = &self.response;
        // the node was asked for SSZ: a JSON answer goes out as it came
        let rendering = self.transcoding.asked();
        let readable = if rendering { facts.ssz.is_some() } else { facts.json };
        if status != 200 || !readable || self.head_request || facts.content_range || facts.bad_length {
            return None;
        }
        Some(if facts.encoded {
            Err(TranscodeError::Encoded)
        } else if facts.no_transform && !rendering {
            // (rendering undoes what rpcedge itself asked of the node)
            Err(TranscodeError::NoTransform)
        } else if facts.content_length.is_some_and(|length| length > self.settings.transcode_max) {
            Err(TranscodeError::Limit("transcode_max"))
        } else {
            Ok(())
        })
    }

    /// The body plan for compressing the body as it came.
    fn compress_plan(&mut self) -> BodyPlan {
        let settings = &*self.settings;
        let plan = match self.response.content_length {
            _ if !self.compressible => {
                self.mode = Mode::Untouched;
                BodyPlan::Pass
            }
            Some(length) if length < settings.min_length => {
                self.mode = Mode::Small;
                BodyPlan::Pass
            }
            Some(length) if length > settings.max_buffer => BodyPlan::Stream,
            declared => {
                let capacity = declared.unwrap_or(settings.min_length).min(settings.max_buffer) as usize;
                self.phase = Phase::Buffering {
                    body: Vec::with_capacity(capacity),
                    last_arrival_ms: 0,
                    flushed_at_ms: None,
                    transcode: false,
                };
                BodyPlan::Buffer
            }
        };
        match plan {
            BodyPlan::Pass => self.phase = Phase::Pass,
            BodyPlan::Stream => self.start_stream(),
            BodyPlan::Buffer => {}
        }
        self.headers_out = plan != BodyPlan::Buffer;
        plan
    }

    /// The header edits in force: after [`Exchange::response_head`] for `Pass` and `Stream`, and
    /// as given with the [`Output`] that releases held headers.
    pub fn edits(&self) -> &HeaderEdits {
        &self.edits
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }

    pub fn transcode_outcome(&self) -> TranscodeOutcome {
        match self.transcoding {
            Transcoding::Done => TranscodeOutcome::Transcoded,
            Transcoding::Refused(_) => TranscodeOutcome::Refused,
            _ => TranscodeOutcome::None,
        }
    }

    /// Why a body that could have been transcoded went out as it came.
    pub fn transcode_refusal(&self) -> Option<&TranscodeError> {
        match &self.transcoding {
            Transcoding::Refused(refusal) => Some(refusal),
            _ => None,
        }
    }

    /// Body bytes fed in and sent out, for the compression ratio.
    pub fn counts(&self) -> (u64, u64) {
        (self.bytes_in, self.bytes_out)
    }

    /// When the host should feed an empty chunk as a timer tick (milliseconds, on the clock of
    /// `now_ms`), or `None` when nothing is held.
    pub fn deadline(&self) -> Option<u64> {
        let delay = self.settings.stream_delay_ms;
        let length_known = self.response.content_length.is_some();
        match &self.phase {
            Phase::Buffering { body, last_arrival_ms, flushed_at_ms, transcode: false }
                if !length_known && !body.is_empty() =>
            {
                let since = flushed_at_ms.map_or(*last_arrival_ms, |flushed| flushed.min(*last_arrival_ms));
                Some(since + delay)
            }
            Phase::Streaming { held_since_ms: Some(since), .. } => Some(since + delay),
            _ => None,
        }
    }

    /// Feeds one body chunk (possibly empty: a timer tick or a bare flush or end).
    pub fn feed(&mut self, chunk: &[u8], end: bool, flush: bool, now_ms: u64) -> Result<Output<'_>, Error> {
        self.out.clear();
        self.bytes_in += chunk.len() as u64;
        let result = self.check_length(end).and_then(|()| self.step(chunk, end, flush, now_ms));
        if let Err(e) = &result {
            self.fail();
            return Err(e.clone());
        }
        let (headers, flush) = result.expect("checked");
        self.headers_out |= headers;
        let work = matches!(self.phase, Phase::Offloaded(Some(_)));
        let end = end && !work;
        self.bytes_out += self.out.len() as u64;
        Ok(Output {
            headers: headers.then_some(&self.edits),
            data: &self.out,
            flush: flush || end,
            end,
            work,
        })
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
        self.phase = Phase::Failed;
        self.mode = Mode::Failed;
        self.out.clear();
    }

    /// The job that [`Output::work`] announced; `None` when there is none (or it was taken).
    pub fn take_whole_body(&mut self) -> Option<WholeBody> {
        match &mut self.phase {
            Phase::Offloaded(job) => job.take(),
            _ => None,
        }
    }

    /// Takes a job back, run or not (then it runs here), and gives what the body's end would
    /// have given inline: the headers, the body and the end.
    pub fn complete_whole_body(&mut self, mut job: WholeBody) -> Result<Output<'_>, Error> {
        self.out.clear();
        if !matches!(self.phase, Phase::Offloaded(None)) {
            self.fail();
            return Err(Error::OutOfOrder("a whole body given back that was not taken"));
        }
        job.run();
        self.send_whole(job);
        self.headers_out = true;
        self.bytes_out += self.out.len() as u64;
        Ok(Output { headers: Some(&self.edits), data: &self.out, flush: true, end: true, work: false })
    }

    /// A body this filter transforms must match its declared length, however it is sent: a
    /// longer one is cut at the length by the host's codec, a shorter one was truncated.
    fn check_length(&self, end: bool) -> Result<(), Error> {
        let declared = match self.response.content_length {
            Some(declared) if !matches!(self.phase, Phase::Pass | Phase::Head) => declared,
            _ => return Ok(()),
        };
        let received = self.bytes_in;
        if received > declared || (end && received < declared) {
            Err(Error::LengthMismatch { declared, received })
        } else {
            Ok(())
        }
    }

    /// Runs one feed; returns whether the headers go out now and whether to flush.
    fn step(&mut self, chunk: &[u8], end: bool, flush: bool, now_ms: u64) -> Result<(bool, bool), Error> {
        let settings = Arc::clone(&self.settings);
        let length_known = self.response.content_length.is_some();
        match &mut self.phase {
            Phase::Head => Err(Error::OutOfOrder("body before the response head")),
            Phase::Offloaded(_) | Phase::Done | Phase::Failed => Err(Error::OutOfOrder("body after the end")),
            Phase::Pass => {
                // Hosts stop feeding on Pass; if one does not, the body still goes out intact.
                self.out.extend_from_slice(chunk);
                if end {
                    self.phase = Phase::Done;
                }
                Ok((false, flush))
            }
            Phase::Buffering { body, transcode: true, .. } => {
                if body.len() + chunk.len() > settings.transcode_max as usize {
                    self.transcoding = Transcoding::Refused(TranscodeError::Limit("transcode_max"));
                    let held = std::mem::take(body);
                    return self.untranscoded(held, chunk, end, flush, now_ms);
                }
                body.extend_from_slice(chunk);
                let sent = end && self.finish_buffered();
                Ok((sent, sent))
            }
            Phase::Buffering { body, .. } if length_known => {
                body.extend_from_slice(chunk);
                let sent = end && self.finish_buffered();
                Ok((sent, sent))
            }
            Phase::Buffering { body, last_arrival_ms, flushed_at_ms, .. } => {
                let held = body.len() + chunk.len();
                let overflow = held > settings.max_buffer as usize;
                if end && !overflow {
                    body.extend_from_slice(chunk);
                    let sent = self.finish_buffered();
                    return Ok((sent, sent));
                }
                // A flush starts streaming only with enough held to be worth compressing; a
                // smaller one waits, at most stream_delay, for the end or for more.
                if flush && held > 0 {
                    flushed_at_ms.get_or_insert(now_ms);
                }
                let flushed = flush && held as u64 >= settings.min_length;
                let waited = |since: u64| now_ms.saturating_sub(since) >= settings.stream_delay_ms;
                let paused = !body.is_empty() && (waited(*last_arrival_ms) || flushed_at_ms.is_some_and(waited));
                if !(overflow || flushed || paused) {
                    body.extend_from_slice(chunk);
                    if !chunk.is_empty() {
                        *last_arrival_ms = now_ms;
                    }
                    return Ok((false, false));
                }
                // Held data that waited out the delay, or a flush, must reach the client now.
                let held = std::mem::take(body);
                self.start_stream();
                self.write_stream(&held, Push::Hold, now_ms)?;
                let push = if end {
                    Push::Finish
                } else if flushed || paused {
                    Push::Sync
                } else {
                    Push::Hold
                };
                self.write_stream(chunk, push, now_ms)?;
                Ok((true, push != Push::Hold))
            }
            Phase::Streaming { held_since_ms, .. } => {
                let due = held_since_ms.is_some_and(|since| now_ms.saturating_sub(since) >= settings.stream_delay_ms);
                let push = if end {
                    Push::Finish
                } else if flush || due {
                    Push::Sync
                } else {
                    Push::Hold
                };
                if chunk.is_empty() && push == Push::Hold {
                    return Ok((false, false));
                }
                self.write_stream(chunk, push, now_ms)?;
                Ok((false, push != Push::Hold))
            }
        }
    }

    /// A body held to transcode outgrew `transcode_max`: it goes on as it would have without
    /// transcoding, starting with what was held.
    fn untranscoded(&mut self, held: Vec<u8>, chunk: &[u8], end: bool, flush: bool, now_ms: u64) -> Result<(bool, bool), Error> {
        match self.compress_plan() {
            BodyPlan::Pass => {
                self.out = [&held[..], chunk].concat();
                if end {
                    self.phase = Phase::Done;
                }
                Ok((true, true))
            }
            BodyPlan::Stream => {
                self.write_stream(&held, Push::Hold, now_ms)?;
                let push = if end { Push::Finish } else { Push::Sync };
                self.write_stream(chunk, push, now_ms)?;
                Ok((true, true))
            }
            BodyPlan::Buffer => {
                if let Phase::Buffering { body, last_arrival_ms, .. } = &mut self.phase {
                    *body = held;
                    *last_arrival_ms = now_ms;
                }
                self.step(chunk, end, flush, now_ms)
            }
        }
    }

    /// Switches to streaming: the encoded headers are set now, as the length is unknown.
    fn start_stream(&mut self) {
        self.mode = Mode::Stream;
        self.set_encoded_edits(LengthEdit::Remove);
        self.phase = Phase::Streaming {
            encoder: StreamEncoder::new(self.coding, self.settings.stream_level),
            held_since_ms: None,
        };
    }

    fn write_stream(&mut self, input: &[u8], push: Push, now_ms: u64) -> Result<(), Error> {
        let Phase::Streaming { encoder, held_since_ms } = &mut self.phase else {
            unreachable!("write_stream outside streaming");
        };
        encoder.write(input, push, &mut self.out).map_err(Error::Stream)?;
        match push {
            Push::Hold if !input.is_empty() => {
                held_since_ms.get_or_insert(now_ms);
            }
            Push::Hold => {}
            Push::Sync => *held_since_ms = None,
            Push::Finish => self.phase = Phase::Done,
        }
        Ok(())
    }

    /// The whole body is in: send it compressed with an exact length, or as it was. False when
    /// its compression waits for the host instead.
    fn finish_buffered(&mut self) -> bool {
        let Phase::Buffering { mut body, transcode, .. } = std::mem::replace(&mut self.phase, Phase::Done) else {
            unreachable!("finish_buffered outside buffering");
        };
        let mut compress = self.compressible;
        if transcode {
            match self.transcode(&body) {
                Ok(transcoded) => {
                    body = transcoded;
                    let content_type = self.edits.content_type.unwrap_or_default();
                    let compressible_type = self.settings.compresses_type(content_type.as_bytes());
                    compress = self.compressible_as_type && compressible_type;
                    self.edits.add_vary |= compressible_type && !self.response.varies_already;
                }
                // a JSON-RPC error stays JSON, as it should: nothing was refused
                Err(TranscodeError::NoResult) => self.transcoding = Transcoding::None,
                Err(refusal) => self.transcoding = Transcoding::Refused(refusal),
            }
        }
        let settings = &*self.settings;
        let length = body.len() as u64;
        if !compress {
            self.mode = Mode::Untouched;
            self.edits.content_length = LengthEdit::Set(length);
            self.out = body;
            return true;
        }
        if length < settings.min_length {
            self.mode = Mode::Small;
            self.edits.content_length = LengthEdit::Set(length);
            self.out = body;
            return true;
        }
        let level = settings.level.for_length(body.len());
        let mut job = WholeBody { coding: self.coding, level, body, compressed: None };
        if self.offload && length >= settings.offload_min_length {
            self.phase = Phase::Offloaded(Some(job));
            return false;
        }
        job.run();
        self.send_whole(job);
        true
    }

    /// Sends a run job's body compressed, or as it was when compressing did not make it smaller.
    fn send_whole(&mut self, job: WholeBody) {
        self.phase = Phase::Done;
        match job.compressed.flatten() {
            Some(compressed) => {
                self.mode = Mode::Oneshot;
                self.set_encoded_edits(LengthEdit::Set(compressed.len() as u64));
                self.out = compressed;
            }
            None => {
                self.mode = Mode::Incompressible;
                self.edits.content_length = LengthEdit::Set(job.body.len() as u64);
                self.out = job.body;
            }
        }
    }

    fn set_encoded_edits(&mut self, length: LengthEdit) {
        self.edits.content_encoding = Some(self.coding);
        self.edits.content_length = length;
        self.edits.remove_accept_ranges = true;
        if let Some(etag) = &self.response.etag {
            self.edits.etag = if etag.starts_with(b"W/\"") && is_opaque_tag(&etag[2..]) {
                EtagEdit::Keep
            } else if is_opaque_tag(etag) {
                EtagEdit::Set([&b"W/"[..], etag].concat())
            } else {
                EtagEdit::Remove
            };
        }
    }

    /// The held JSON body as SSZ (or the node's SSZ as JSON), with the header edits that say so;
    /// the body stays as it came on an error.
    fn transcode(&mut self, body: &[u8]) -> Result<Vec<u8>, TranscodeError> {
        let transcoded = match &self.transcoding {
            &Transcoding::WantedResult(schema, form) => {
                let result = jsonrpc_to_ssz(body, schema, form)?;
                self.edits.content_type = Some(if schema == Schema::Witness && form == WitnessForm::Eip8025 {
                    "application/octet-stream; witness=eip8025"
                } else {
                    "application/octet-stream"
                });
                self.edits.set.push((JSONRPC_ID_HEADER, result.id.to_vec()));
                self.edits.set.push((JSONRPC_VERSION_HEADER, result.version.into_owned()));
                result.ssz
            }
            &Transcoding::WantedObject(object) => {
                let result = beacon_to_ssz(body, object, self.response.consensus_version.as_deref())?;
                self.edits.content_type = Some("application/octet-stream");
                if let Some(fork) = result.fork {
                    self.edits.set.push((CONSENSUS_VERSION_HEADER, fork.name().as_bytes().to_vec()));
                }
                let flag = |value: bool| value.to_string().into_bytes();
                self.edits.set.push((EXECUTION_OPTIMISTIC_HEADER, flag(result.execution_optimistic)));
                if let Some(finalized) = result.finalized {
                    self.edits.set.push((FINALIZED_HEADER, flag(finalized)));
                }
                result.ssz
            }
            Transcoding::AskedResult(call) => {
                let form = self.response.ssz.unwrap_or(WitnessForm::Lossless);
                let json = jsonrpc_from_ssz(body, call.schema, form, &call.id, &call.version)?;
                self.edits.content_type = Some("application/json");
                json
            }
            &Transcoding::AskedObject(object) => {
                let facts = &self.response;
                let fork = match &facts.consensus_version {
                    Some(name) => Some(Fork::from_name(name).ok_or(TranscodeError::Fork)?),
                    None => None,
                };
                // The node's answers carried these before, so it was asked; if this one does not,
                // the Beacon-API's cautious reading: maybe optimistic, finality unknown.
                let envelope = BeaconEnvelope {
                    fork,
                    execution_optimistic: facts.execution_optimistic.unwrap_or(true),
                    finalized: facts.finalized,
                };
                let json = beacon_from_ssz(body, object, envelope)?;
                self.edits.content_type = Some("application/json");
                json
            }
            _ => unreachable!("transcoding a body that no one asked for"),
        };
        // Another representation: the original's tag does not name it, nor its ranges.
        self.response.etag = None;
        self.edits.etag = EtagEdit::Remove;
        self.edits.remove_accept_ranges = true;
        self.transcoding = Transcoding::Done;
        Ok(transcoded)
    }
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

/// Whether `tag` is an RFC 9110 opaque-tag: a quoted string of etagc characters.
fn is_opaque_tag(tag: &[u8]) -> bool {
    tag.len() >= 2
        && tag[0] == b'"'
        && tag[tag.len() - 1] == b'"'
        && tag[1..tag.len() - 1].iter().all(|&c| c == 0x21 || (0x23..=0x7e).contains(&c) || c >= 0x80)
}

/// Whether a comma-separated header list names `token` (case-insensitive, parameters ignored).
fn list_has(value: &[u8], token: &[u8]) -> bool {
    value.split(|&b| b == b',').any(|item| {
        let name = item.split(|&b| b == b'=' || b == b';').next().unwrap_or_default();
        name.trim_ascii().eq_ignore_ascii_case(token)
    })
}
