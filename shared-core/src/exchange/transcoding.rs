//! The transcoding stage: whether a body goes out in the other encoding (JSON with hex bytes or
//! SSZ) than the node's, by the client's Accept; it holds such a body whole and hands the
//! compression stage either the transcoded body or, when it cannot be transcoded, the body as it
//! came.

use crate::config::Settings;
use crate::negotiate::{Accept, MediaType};
use crate::node::Node;
use crate::transcode::{
    beacon_from_ssz, beacon_to_ssz, jsonrpc_from_ssz, jsonrpc_request, jsonrpc_to_ssz, BeaconEnvelope, BeaconObject,
    Fork, JsonRpcCall, Schema, TranscodeError, WitnessForm,
};

use super::{
    EtagEdit, HeaderEdits, RequestFacts, ResponseFacts, TranscodeOutcome, CONSENSUS_VERSION_HEADER,
    EXECUTION_OPTIMISTIC_HEADER, FINALIZED_HEADER, JSONRPC_ID_HEADER, JSONRPC_VERSION_HEADER,
};

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
        self.asked() || matches!(self, State::WantedResult(..) | State::WantedObject(_))
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
}

impl Transcoding {
    pub fn new() -> Self {
        Transcoding { media: Accept::default(), beacon_object: None, call: None, state: State::None, held: None }
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
        self.wanted_form(settings, request).is_some() || self.may_ask_for_ssz(settings)
    }

    /// Whether the node may be asked for SSZ in place of the JSON that the client chooses.
    fn may_ask_for_ssz(&self, settings: &Settings) -> bool {
        settings.transcode_upstream_ssz && matches!(self.media.choose(), Some(MediaType::Json))
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
        if self.state == State::None && self.may_ask_for_ssz(settings) {
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
                self.state = State::WantedObject(object);
            }
        }
        if !self.state.pending() {
            return false;
        }
        edits.add_vary_accept = true;
        match self.transcodable(status, facts, settings, request) {
            Some(Ok(())) => {
                let capacity = facts.content_length.unwrap_or(0).min(settings.transcode_max);
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
        } else {
            Ok(())
        })
    }

    /// Whether the stage holds the body.
    pub fn holding(&self) -> bool {
        self.held.is_some()
    }

    /// Holds one more chunk; when the body outgrows `transcode_max`, it is refused and what was
    /// held comes back, to go on as the body came.
    pub fn hold(&mut self, chunk: &[u8], settings: &Settings) -> Result<(), Vec<u8>> {
        let held = self.held.as_mut().expect("holding");
        if held.len() + chunk.len() > settings.transcode_max as usize {
            self.state = State::Refused(TranscodeError::Limit("transcode_max"));
            return Err(self.held.take().expect("holding"));
        }
        held.extend_from_slice(chunk);
        Ok(())
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
                edits.content_type = Some(if schema == Schema::Witness && form == WitnessForm::Eip8025 {
                    "application/octet-stream; witness=eip8025"
                } else {
                    "application/octet-stream"
                });
                edits.set.push((JSONRPC_ID_HEADER, result.id.to_vec()));
                edits.set.push((JSONRPC_VERSION_HEADER, result.version.into_owned()));
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
        // Another representation: the original's tag does not name it, nor its ranges.
        facts.etag = None;
        edits.etag = EtagEdit::Remove;
        edits.remove_accept_ranges = true;
        self.state = State::Done;
        Ok(transcoded)
    }
}
