//! The transcoding stage: whether a body goes out in the other encoding (JSON with hex bytes or
//! SSZ) than the node's, by the client's Accept. It holds such a body whole and hands the
//! compression stage either the transcoded body or, when it cannot be transcoded, the body as it
//! came; or, for a witness longer than `transcode_hold_max` (by its Content-Length, or without
//! one once it outgrows that), it transcodes the JSON as it arrives and hands on the SSZ piece by
//! piece. What it holds counts against the process's transcode budget.

use crate::config::Settings;
use crate::negotiate::{Accept, MediaType};
use crate::node::Node;
use crate::transcode::{
    beacon_from_ssz, beacon_to_ssz, jsonrpc_from_ssz, jsonrpc_request, jsonrpc_to_ssz, light_client_updates_to_ssz,
    BeaconEnvelope, BeaconNetwork, BeaconObject, Fork, JsonRpcCall, Schema, StreamedWitness, TranscodeError,
    WitnessForm, WitnessRender, WitnessSsz, WitnessStream,
};

use super::budget::Reservation;
use super::{EtagEdit, HeaderEdits, RequestFacts, ResponseFacts, TranscodeOutcome, JSONRPC_ID_HEADER, JSONRPC_VERSION_HEADER};
use crate::transcode::{CONSENSUS_VERSION_HEADER, EXECUTION_OPTIMISTIC_HEADER, FINALIZED_HEADER};

/// The longest request body the core reads (a single JSON-RPC call's); a longer one is not
/// transcoded.
pub(super) const REQUEST_BODY_MAX: usize = 64 * 1024;

/// The Accept a host sends the node in place of a JSON client's, to ask for SSZ; a node without
/// SSZ still answers JSON.
const UPSTREAM_SSZ_ACCEPT: &str = "application/octet-stream;q=1, application/json;q=0.9";

/// Where transcoding stands.
#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    None,
    /// The client asked for SSZ of a JSON-RPC result with this schema.
    WantedResult(Schema, WitnessForm),
    /// The client asked for SSZ of this Beacon-API object.
    WantedObject(BeaconObject),
    /// The client asked for SSZ of the light client updates of this chain.
    WantedUpdates(BeaconNetwork),
    /// A JSON client's call that the node was asked to answer in SSZ, to render as JSON here.
    AskedResult(JsonRpcCall),
    /// A JSON client's Beacon-API object that the node was asked to send as SSZ.
    AskedObject(BeaconObject),
    Done,
    Refused(TranscodeError),
}

impl State {
    /// The node was asked for SSZ, to render as JSON here.
    fn asked(&self) -> bool {
        matches!(self, State::AskedResult(_) | State::AskedObject(_))
    }

    /// A body is to be transcoded, one way or the other, once it is in.
    fn pending(&self) -> bool {
        self.asked() || matches!(self, State::WantedResult(..) | State::WantedObject(_) | State::WantedUpdates(_))
    }
}

pub(super) struct Transcoding {
    media: Accept,
    /// The Beacon-API object the request's path names.
    beacon_object: Option<BeaconObject>,
    /// The JSON-RPC call in the request body, kept to ask the node for SSZ.
    call: Option<JsonRpcCall>,
    state: State,
    /// The body held whole to transcode, from the response head on (`None`: not holding).
    held: Option<Vec<u8>>,
    /// A witness transcoded as it arrives, then its SSZ going out.
    stream: Option<Stream>,
    /// The JSON that `stream` has read.
    streamed: u64,
    /// The share of the transcode budget that what it holds takes.
    reservation: Reservation,
}

enum Stream {
    Reading(Box<WitnessStream>),
    Sending(WitnessSsz),
    /// The node's SSZ rendered as JSON as it arrives: what the last chunk rendered, and whether
    /// anything was handed on yet.
    Rendering { render: Box<WitnessRender>, out: Vec<u8>, began: bool },
}

impl Stream {
    /// The share of the budget it takes for a body of `length` bytes.
    fn share(&self, length: u64) -> u64 {
        match self {
            Stream::Rendering { .. } => WitnessRender::most_held(),
            _ => WitnessStream::most_held(length),
        }
    }

    /// Reads what was held before it began.
    fn feed_held(&mut self, held: &[u8]) -> Result<(), TranscodeError> {
        match self {
            Stream::Reading(reader) => reader.feed(held, false),
            Stream::Rendering { render, out, .. } => render.feed(held, false, out),
            Stream::Sending(_) => unreachable!("a stream that has read its body"),
        }
    }
}

impl Transcoding {
    pub fn new() -> Self {
        Transcoding {
            media: Accept::default(),
            beacon_object: None,
            call: None,
            state: State::None,
            held: None,
            stream: None,
            streamed: 0,
            reservation: Reservation::default(),
        }
    }

    pub fn request_path(&mut self, path: &[u8]) {
        self.beacon_object = BeaconObject::from_route(path);
    }

    /// An Accept value of the request.
    pub fn accept(&mut self, value: &[u8]) {
        self.media.add(value);
    }

    /// Whether the body is needed: a JSON-RPC call whose client asks for SSZ, or whose node may
    /// be asked for it, which only the method in the body can say has a schema.
    pub fn wants_request_body(&self, settings: &Settings, request: &RequestFacts) -> bool {
        self.wanted_form(settings, request).is_some() || (request.post && self.may_ask_node_for_ssz(settings, request))
    }

    /// Whether the body may be transcoded, as far as the request head tells: its client asks
    /// for SSZ, or its node may be asked for it.
    pub fn may_transcode(&self, settings: &Settings) -> bool {
        (settings.transcode && matches!(self.media.choose(), Some(MediaType::Ssz(_)))) || self.may_ask_for_ssz(settings)
    }

    /// Whether the node may be asked for SSZ in place of the JSON that the client chooses.
    fn may_ask_for_ssz(&self, settings: &Settings) -> bool {
        settings.transcode_upstream_ssz && matches!(self.media.choose(), Some(MediaType::Json))
    }

    /// Whether this request's node may be asked for SSZ: only the node's own requests are
    /// changed (see [`RequestFacts::for_the_node`]).
    fn may_ask_node_for_ssz(&self, settings: &Settings, request: &RequestFacts) -> bool {
        request.for_the_node() && self.may_ask_for_ssz(settings)
    }

    /// The SSZ witness form a transcoding call's client asks for; `None` when the call is not one.
    fn wanted_form(&self, settings: &Settings, request: &RequestFacts) -> Option<WitnessForm> {
        match self.media.choose() {
            Some(MediaType::Ssz(form)) if settings.transcode && request.post => Some(form),
            _ => None,
        }
    }

    pub fn request_body(&mut self, body: &[u8], settings: &Settings, request: &RequestFacts) {
        if !self.wants_request_body(settings, request) || body.len() > REQUEST_BODY_MAX {
            return;
        }
        let Some(call) = jsonrpc_request(body) else { return };
        match self.wanted_form(settings, request) {
            Some(form) => self.state = State::WantedResult(call.schema, form),
            None => self.call = Some(call),
        }
    }

    /// The Accept to send the node in place of the client's, when it is to be asked for SSZ (see
    /// [`super::Exchange::upstream_accept`]).
    pub fn upstream_accept(
        &mut self,
        settings: &Settings,
        node: &Node,
        request: &RequestFacts,
    ) -> Option<&'static str> {
        if self.state == State::None && self.may_ask_node_for_ssz(settings, request) {
            if let Some(call) = self.call.take().filter(|_| request.post) {
                self.state = State::AskedResult(call);
            } else if let Some(object) = self
                .beacon_object
                .filter(|&object| {
                    request.get && object != BeaconObject::State && object.has_chain_flags() && node.sends_beacon_metadata()
                })
            {
                self.state = State::AskedObject(object);
            }
        }
        self.state.asked().then_some(UPSTREAM_SSZ_ACCEPT)
    }

    /// At the response head: whether the body is held whole to transcode.
    pub fn response_head(
        &mut self,
        status: u16,
        facts: &ResponseFacts,
        settings: &Settings,
        node: &Node,
        request: &RequestFacts,
        edits: &mut HeaderEdits,
    ) -> bool {
        if let (Some(_), 200, Some(_)) = (self.beacon_object, status, facts.ssz) {
            node.saw_beacon_metadata(facts.execution_optimistic.is_some() && facts.finalized.is_some());
        }
        if let (State::None, Some(object), true) = (&self.state, self.beacon_object, request.get) {
            if settings.transcode && matches!(self.media.choose(), Some(MediaType::Ssz(_))) {
                self.state = match (object, settings.beacon_network) {
                    (BeaconObject::LightClientUpdates, Some(network)) => State::WantedUpdates(network),
                    // their SSZ needs the chain's fork digests
                    (BeaconObject::LightClientUpdates, None) => State::None,
                    (object, _) => State::WantedObject(object),
                };
            }
        }
        if !self.state.pending() {
            return false;
        }
        edits.add_vary_accept = true;
        match self.transcodable(status, facts, settings, request) {
            Some(Ok(())) if self.streamable(facts, settings) => {
                let length = facts.content_length.expect("a stream from the head has a length");
                let stream = match self.new_stream(facts) {
                    Ok(stream) => stream,
                    Err(refusal) => {
                        self.state = State::Refused(refusal);
                        return false;
                    }
                };
                if !self.reservation.take(stream.share(length), settings.transcode_budget) {
                    self.state = State::Refused(TranscodeError::Limit("transcode_budget"));
                    return false;
                }
                self.stream = Some(stream);
                true
            }
            Some(Ok(())) => {
                let capacity = facts.content_length.unwrap_or(0).min(settings.transcode_held_max());
                self.held = Some(Vec::with_capacity(capacity as usize));
                true
            }
            Some(Err(refusal)) => {
                self.state = State::Refused(refusal);
                false
            }
            None => {
                self.state = State::None;
                false
            }
        }
    }

    /// Whether the response to a call that wants SSZ is one to transcode: `None` when it is not
    /// a body with a schema at all (an error status, not JSON), a refusal when it is one that
    /// cannot be transcoded.
    fn transcodable(
        &self,
        status: u16,
        facts: &ResponseFacts,
        settings: &Settings,
        request: &RequestFacts,
    ) -> Option<Result<(), TranscodeError>> {
        // the node was asked for SSZ: a JSON answer goes out as it came
        let rendering = self.state.asked();
        let readable = if rendering { facts.ssz.is_some() } else { facts.json };
        if status != 200 || !readable || request.head || facts.content_range || facts.bad_length {
            return None;
        }
        Some(if facts.encoded {
            Err(TranscodeError::Encoded)
        } else if facts.no_transform && !rendering {
            // (rendering undoes what rpcedge itself asked of the node)
            Err(TranscodeError::NoTransform)
        } else if facts.content_length.is_some_and(|length| length > settings.transcode_max) {
            Err(TranscodeError::Limit("transcode_max"))
        } else if !self.streamable(facts, settings)
            && facts.content_length.is_some_and(|length| length > settings.transcode_hold_max)
        {
            Err(TranscodeError::Limit("transcode_hold_max"))
        } else {
            Ok(())
        })
    }

    /// Whether a witness is transcoded as it arrives from the head on: one whose length is known
    /// (its SSZ goes out with an exact length) and too long to hold whole.
    fn streamable(&self, facts: &ResponseFacts, settings: &Settings) -> bool {
        self.is_witness() && facts.content_length.is_some_and(|length| length > settings.transcode_hold_max)
    }

    /// Whether the body is a witness, to read as JSON or render from SSZ.
    fn is_witness(&self) -> bool {
        match &self.state {
            State::WantedResult(schema, _) => *schema == Schema::Witness,
            State::AskedResult(call) => call.schema == Schema::Witness,
            _ => false,
        }
    }

    /// The stream that transcodes a witness as it arrives: its JSON read into SSZ, or the node's
    /// SSZ rendered as JSON.
    fn new_stream(&self, facts: &ResponseFacts) -> Result<Stream, TranscodeError> {
        match &self.state {
            &State::WantedResult(_, form) => Ok(Stream::Reading(Box::new(WitnessStream::new(form)))),
            State::AskedResult(call) => {
                let form = facts.ssz.unwrap_or(WitnessForm::Lossless);
                let render = Box::new(WitnessRender::new(form, &call.id, &call.version)?);
                Ok(Stream::Rendering { render, out: Vec::new(), began: false })
            }
            _ => unreachable!("a stream of a witness no one asked for"),
        }
    }

    /// Whether the stage reads the body: holds it, or transcodes it as it arrives.
    pub fn holding(&self) -> bool {
        self.held.is_some() || matches!(self.stream, Some(Stream::Reading(_) | Stream::Rendering { .. }))
    }

    /// Whether the stage renders the node's SSZ as JSON as it arrives.
    pub fn rendering(&self) -> bool {
        matches!(self.stream, Some(Stream::Rendering { .. }))
    }

    /// Holds one more chunk; when the body outgrows `transcode_hold_max` or the budget, it is
    /// refused and what was held comes back, to go on as the body came. Each byte held takes two
    /// of the budget: it, and about as much for what it becomes.
    pub fn hold(&mut self, chunk: &[u8], settings: &Settings) -> Result<(), Vec<u8>> {
        let held = self.held.as_mut().expect("holding");
        let refusal = if held.len() + chunk.len() > settings.transcode_held_max() as usize {
            Some("transcode_hold_max")
        } else if !self.reservation.take(2 * chunk.len() as u64, settings.transcode_budget) {
            Some("transcode_budget")
        } else {
            None
        };
        if let Some(limit) = refusal {
            // (a held witness that did not read says why itself)
            if !matches!(self.state, State::Refused(_)) {
                self.state = State::Refused(TranscodeError::Limit(limit));
            }
            self.reservation = Reservation::default();
            return Err(self.held.take().expect("holding"));
        }
        held.extend_from_slice(chunk);
        Ok(())
    }

    /// Whether a held witness (one without a Content-Length) that `next` more bytes would take
    /// past `transcode_hold_max` is from here on transcoded as it arrives: what was held is read
    /// and dropped, and the share of the budget becomes what the stream takes. From then on it
    /// cannot go out as it came. False when it is not one, would pass `transcode_max`, or what
    /// was held does not read (then [`Transcoding::hold`] refuses it, and it goes out as it came).
    pub fn stream_held(&mut self, next: usize, settings: &Settings, facts: &ResponseFacts) -> bool {
        let Some(held) = &self.held else { return false };
        let length = (held.len() + next) as u64;
        if !self.is_witness() || length <= settings.transcode_held_max() || length > settings.transcode_max {
            return false;
        }
        let stream = self.new_stream(facts).and_then(|mut stream| {
            // (less than the two bytes per byte held, but where the bound is under a few MiB)
            if !self.reservation.resize(stream.share(held.len() as u64), settings.transcode_budget) {
                return Err(TranscodeError::Limit("transcode_budget"));
            }
            stream.feed_held(held).map(|()| stream)
        });
        match stream {
            Ok(stream) => {
                self.streamed = held.len() as u64;
                self.held = None;
                self.stream = Some(stream);
                true
            }
            Err(refusal) => {
                self.state = State::Refused(refusal);
                false
            }
        }
    }

    /// Whether the stage transcodes the body as it arrives (or sends what it became).
    pub fn streaming(&self) -> bool {
        self.stream.is_some()
    }

    /// Reads one more chunk of a witness transcoded as it arrives; at its end, the SSZ's length,
    /// with the header edits that say what it is. A body that turns out not to be transcodable,
    /// or (without a Content-Length, whose share was taken at the head) grows past
    /// `transcode_max` or the budget, is lost: the exchange fails.
    pub fn read(
        &mut self,
        chunk: &[u8],
        end: bool,
        settings: &Settings,
        facts: &mut ResponseFacts,
        edits: &mut HeaderEdits,
    ) -> Result<Option<u64>, TranscodeError> {
        let grown = self.grow(chunk.len(), settings).and_then(|()| match facts.content_length {
            None if !self.reservation.resize(WitnessStream::most_held(self.streamed), settings.transcode_budget) => {
                Err(TranscodeError::Limit("transcode_budget"))
            }
            _ => Ok(()),
        });
        let Some(Stream::Reading(reader)) = &mut self.stream else { unreachable!("reading a body not being read") };
        let read = grown.and_then(|()| reader.feed(chunk, end)).and_then(|()| {
            if !end {
                return Ok(None);
            }
            let Some(Stream::Reading(reader)) = self.stream.take() else { unreachable!() };
            reader.finish().map(Some)
        });
        let StreamedWitness { id, version, ssz } = match read {
            Ok(Some(witness)) => witness,
            Ok(None) => return Ok(None),
            Err(refusal) => return Err(self.refuse_stream(refusal)),
        };
        let State::WantedResult(schema, form) = self.state else { unreachable!("a witness no one asked for") };
        jsonrpc_edits(schema, form, &id, version, edits);
        self.transcoded(facts, edits);
        let length = ssz.len();
        self.stream = Some(Stream::Sending(ssz));
        Ok(Some(length))
    }

    /// Renders one more chunk of the node's SSZ as JSON ([`Transcoding::rendered`]: what it
    /// completes, with, the first time, what was held before); whether this is the first, which
    /// comes with the header edits that say what it is (JSON, of a length known only at its
    /// end). SSZ that turns out not to render, or grows past `transcode_max`, fails the exchange.
    pub fn render(
        &mut self,
        chunk: &[u8],
        end: bool,
        settings: &Settings,
        facts: &mut ResponseFacts,
        edits: &mut HeaderEdits,
    ) -> Result<bool, TranscodeError> {
        let grown = self.grow(chunk.len(), settings);
        let Some(Stream::Rendering { render, out, began }) = &mut self.stream else {
            unreachable!("rendering a body not being rendered")
        };
        if *began {
            out.clear();
        }
        if let Err(refusal) = grown.and_then(|()| render.feed(chunk, end, out)) {
            return Err(self.refuse_stream(refusal));
        }
        let first = !std::mem::replace(began, true);
        if first {
            edits.content_type = Some("application/json");
            facts.content_length = None;
            self.transcoded(facts, edits);
        }
        Ok(first)
    }

    /// Counts `more` bytes into a stream, which may not pass `transcode_max`.
    fn grow(&mut self, more: usize, settings: &Settings) -> Result<(), TranscodeError> {
        self.streamed += more as u64;
        match self.streamed > settings.transcode_max {
            true => Err(TranscodeError::Limit("transcode_max")),
            false => Ok(()),
        }
    }

    /// A stream that failed: it is dropped, and the refusal counted.
    fn refuse_stream(&mut self, refusal: TranscodeError) -> TranscodeError {
        self.stream = None;
        self.state = State::Refused(refusal.clone());
        refusal
    }

    /// What the last [`Transcoding::render`] rendered.
    pub fn rendered(&self) -> &[u8] {
        match &self.stream {
            Some(Stream::Rendering { out, .. }) => out,
            _ => &[],
        }
    }

    /// The next piece of the SSZ that [`Transcoding::read`] finished, and whether it is the
    /// last; `None` when all is out.
    pub fn next_piece(&mut self) -> Option<(&[u8], bool)> {
        match &mut self.stream {
            Some(Stream::Sending(ssz)) => ssz.next_piece(),
            _ => None,
        }
    }

    /// The whole held body, transcoded with the header edits that say so (`Ok`), or as it came
    /// when it cannot be (`Err`).
    pub fn finish(&mut self, facts: &mut ResponseFacts, edits: &mut HeaderEdits) -> Result<Vec<u8>, Vec<u8>> {
        let body = self.held.take().expect("holding");
        match self.transcode(&body, facts, edits) {
            Ok(transcoded) => Ok(transcoded),
            Err(refusal) => {
                // a JSON-RPC error stays JSON, as it should: nothing was refused
                self.state = if refusal == TranscodeError::NoResult { State::None } else { State::Refused(refusal) };
                Err(body)
            }
        }
    }

    pub fn outcome(&self) -> TranscodeOutcome {
        match self.state {
            State::Done => TranscodeOutcome::Transcoded,
            State::Refused(_) => TranscodeOutcome::Refused,
            _ => TranscodeOutcome::None,
        }
    }

    pub fn refusal(&self) -> Option<&TranscodeError> {
        match &self.state {
            State::Refused(refusal) => Some(refusal),
            _ => None,
        }
    }

    fn transcode(
        &mut self,
        body: &[u8],
        facts: &mut ResponseFacts,
        edits: &mut HeaderEdits,
    ) -> Result<Vec<u8>, TranscodeError> {
        let transcoded = match &self.state {
            &State::WantedResult(schema, form) => {
                let result = jsonrpc_to_ssz(body, schema, form)?;
                jsonrpc_edits(schema, form, result.id, result.version.into_owned(), edits);
                result.ssz
            }
            &State::WantedObject(object) => {
                let result = beacon_to_ssz(body, object, facts.consensus_version.as_deref())?;
                edits.content_type = Some("application/octet-stream");
                if let Some(fork) = result.fork {
                    edits.set.push((CONSENSUS_VERSION_HEADER, fork.name().as_bytes().to_vec()));
                }
                let flag = |value: bool| value.to_string().into_bytes();
                edits.set.push((EXECUTION_OPTIMISTIC_HEADER, flag(result.execution_optimistic)));
                if let Some(finalized) = result.finalized {
                    edits.set.push((FINALIZED_HEADER, flag(finalized)));
                }
                result.ssz
            }
            &State::WantedUpdates(network) => {
                edits.content_type = Some("application/octet-stream");
                light_client_updates_to_ssz(body, network)?
            }
            State::AskedResult(call) => {
                let form = facts.ssz.unwrap_or(WitnessForm::Lossless);
                let json = jsonrpc_from_ssz(body, call.schema, form, &call.id, &call.version)?;
                edits.content_type = Some("application/json");
                json
            }
            &State::AskedObject(object) => {
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
                edits.content_type = Some("application/json");
                json
            }
            _ => unreachable!("transcoding a body that no one asked for"),
        };
        self.transcoded(facts, edits);
        Ok(transcoded)
    }

    fn transcoded(&mut self, facts: &mut ResponseFacts, edits: &mut HeaderEdits) {
        // Another representation: the original's tag does not name it, nor its ranges.
        facts.etag = None;
        edits.etag = EtagEdit::Remove;
        edits.remove_accept_ranges = true;
        self.state = State::Done;
    }
}

/// The edits of a JSON-RPC result sent as SSZ: its type, and the envelope's members in headers.
fn jsonrpc_edits(schema: Schema, form: WitnessForm, id: &[u8], version: Vec<u8>, edits: &mut HeaderEdits) {
    edits.content_type = Some(if schema == Schema::Witness && form == WitnessForm::Eip8025 {
        "application/octet-stream; witness=eip8025"
    } else {
        "application/octet-stream"
    });
    edits.set.push((JSONRPC_ID_HEADER, id.to_vec()));
    edits.set.push((JSONRPC_VERSION_HEADER, version));
}
