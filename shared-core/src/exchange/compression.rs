//! The compression stage: whether a body is compressed, and how (whole with an exact length, or
//! chunk by chunk), over the body that the transcoding stage hands on.

use crate::compress::{compress_whole, stream_level, Push, StreamEncoder};
use crate::config::Settings;
use crate::negotiate::{AcceptEncoding, Coding};

use super::{BodyPlan, Error, EtagEdit, HeaderEdits, LengthEdit, Mode, ResponseFacts, WholeBody};

/// Where the stage stands with the body.
// One per exchange: boxing the streaming encoder would add an allocation per streamed response.
#[allow(clippy::large_enum_variant)]
enum Phase {
    Head,
    Pass,
    /// `flushed_at_ms`: an upstream flush that came with less than `min_length` held, not yet
    /// passed on; the held bytes go out at most `stream_delay` after it.
    /// (A body of known length waits for its end, with no deadline: the exchange holds it to
    /// that length.)
    Buffering {
        body: Vec<u8>,
        last_arrival_ms: u64,
        flushed_at_ms: Option<u64>,
    },
    Streaming {
        encoder: StreamEncoder,
        held_since_ms: Option<u64>,
    },
    /// The whole body waits as a job for the host (`Some`), or is out with it (`None`).
    Offloaded(Option<WholeBody>),
    Done,
    Failed,
}

/// What one feed did: whether the held headers go out now, and whether to flush.
pub(super) type Step = (bool, bool);

/// Where the stage's output goes: the header edits in force and the bytes to send.
pub(super) struct Sink<'a> {
    pub settings: &'a Settings,
    pub response: &'a ResponseFacts,
    pub edits: &'a mut HeaderEdits,
    pub out: &'a mut Vec<u8>,
}

pub(super) struct Compression {
    accept: AcceptEncoding,
    coding: Coding,
    /// The response head allows compressing the body as it came (type, status, the client's
    /// Accept-Encoding).
    compressible: bool,
    /// It allows compressing a body of a type to compress: all of the above but the type.
    compressible_as_type: bool,
    phase: Phase,
    mode: Mode,
    offload: bool,
    /// The head goes out before the body: what would be buffered streams.
    stream_at_head: bool,
}

impl Compression {
    pub fn new() -> Self {
        Compression {
            accept: AcceptEncoding::default(),
            coding: Coding::Gzip,
            compressible: false,
            compressible_as_type: false,
            phase: Phase::Head,
            mode: Mode::Pending,
            offload: false,
            stream_at_head: false,
        }
    }

    pub fn offload_whole_bodies(&mut self) {
        self.offload = true;
    }

    pub fn stream_at_head(&mut self) {
        self.stream_at_head = true;
    }

    /// An Accept-Encoding value of the request.
    pub fn accept_encoding(&mut self, value: &[u8]) {
        self.accept.add(value);
    }

    /// An Available-Dictionary value of the request.
    pub fn available_dictionary(&mut self, value: &[u8]) {
        self.accept.available_dictionary(value);
    }

    /// Whether the client takes a coding the stage makes, so that a body of a type to compress
    /// may be encoded here.
    pub fn may_encode(&self, settings: &Settings) -> bool {
        self.accept.choose(&settings.encodings).is_some()
    }

    /// Whether the client takes a body in `coding`, made here or not.
    pub fn client_takes(&self, coding: Coding) -> bool {
        self.accept.choose(&[coding]).is_some()
    }

    /// What the response head allows, once all its headers are in.
    pub fn response_head(
        &mut self,
        settings: &Settings,
        facts: &ResponseFacts,
        status: u16,
        head_request: bool,
        edits: &mut HeaderEdits,
    ) {
        // Whether this resource's representation depends on Accept-Encoding at all.
        let transformable =
            !facts.encoded && !facts.no_transform && !facts.content_range && !matches!(status, 100..=199 | 204 | 206);
        edits.add_vary = facts.compressible_type && transformable && !facts.varies_already;
        // whether dcz goes out depends on the client's dictionary, wherever it may
        edits.vary_dictionary = facts.compressible_type
            && transformable
            && !facts.varies_on_dictionary
            && settings.encodings.contains(&Coding::Dcz);
        let coding = self.accept.choose(&settings.encodings);
        if let Some(coding) = coding {
            self.coding = coding;
        }
        self.compressible_as_type =
            transformable && coding.is_some() && !head_request && status != 304 && !facts.bad_length;
        self.compressible = self.compressible_as_type && facts.compressible_type;
    }

    /// After another stage changed the body's type: whether a body of `content_type` is
    /// compressed, and `Vary: Accept-Encoding` with it.
    pub fn retype(&mut self, content_type: &[u8], sink: &mut Sink) {
        let compressible_type = sink.settings.compresses_type(content_type);
        self.compressible = self.compressible_as_type && compressible_type;
        sink.edits.add_vary |= compressible_type && !sink.response.varies_already;
        sink.edits.vary_dictionary |= compressible_type
            && !sink.response.varies_on_dictionary
            && sink.settings.encodings.contains(&Coding::Dcz);
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Whether the stage reads the body (rather than passing it on or not having begun).
    pub fn transforms(&self) -> bool {
        !matches!(self.phase, Phase::Pass | Phase::Head)
    }

    /// The body is out with its job, or waits as one.
    pub fn has_job(&self) -> bool {
        matches!(self.phase, Phase::Offloaded(Some(_)))
    }

    /// The body plan for a body whose length is as the response head says.
    pub fn plan(&mut self, sink: &mut Sink) -> BodyPlan {
        self.plan_for(sink.response.content_length, sink)
    }

    /// The body plan for a body of `length` (`None`: not known), which the response head may not
    /// say: a body that an earlier stage made.
    pub fn plan_for(&mut self, length: Option<u64>, sink: &mut Sink) -> BodyPlan {
        let settings = sink.settings;
        let plan = match length {
            _ if !self.compressible => {
                self.mode = Mode::Untouched;
                BodyPlan::Pass
            }
            Some(length) if length < settings.min_length_for(self.coding) => {
                self.mode = Mode::Small;
                BodyPlan::Pass
            }
            Some(length) if length > settings.max_buffer => BodyPlan::Stream,
            _ if self.stream_at_head => BodyPlan::Stream,
            declared => {
                let capacity = declared.unwrap_or(settings.min_length).min(settings.max_buffer) as usize;
                self.phase =
                    Phase::Buffering { body: Vec::with_capacity(capacity), last_arrival_ms: 0, flushed_at_ms: None };
                BodyPlan::Buffer
            }
        };
        match plan {
            BodyPlan::Pass => self.phase = Phase::Pass,
            // without a compressor the body goes out as it came
            BodyPlan::Stream if self.start_stream(sink).is_err() => {
                self.mode = Mode::Untouched;
                self.phase = Phase::Pass;
                return BodyPlan::Pass;
            }
            BodyPlan::Stream | BodyPlan::Buffer => {}
        }
        plan
    }

    /// When the host should feed an empty chunk as a timer tick, or `None` when nothing is held.
    pub fn deadline(&self, settings: &Settings, length_known: bool) -> Option<u64> {
        let delay = settings.stream_delay_ms;
        match &self.phase {
            Phase::Buffering { body, last_arrival_ms, flushed_at_ms } if !length_known && !body.is_empty() => {
                let since = flushed_at_ms.map_or(*last_arrival_ms, |flushed| flushed.min(*last_arrival_ms));
                Some(since + delay)
            }
            Phase::Streaming { held_since_ms: Some(since), .. } => Some(since + delay),
            _ => None,
        }
    }

    pub fn fail(&mut self) {
        self.phase = Phase::Failed;
        self.mode = Mode::Failed;
    }

    /// The job that the body's end announced; `None` when there is none (or it was taken).
    pub fn take_whole_body(&mut self) -> Option<WholeBody> {
        match &mut self.phase {
            Phase::Offloaded(job) => job.take(),
            _ => None,
        }
    }

    /// Whether a taken job may be given back now.
    pub fn awaits_job(&self) -> bool {
        matches!(self.phase, Phase::Offloaded(None))
    }

    /// Runs one feed of the body.
    pub fn feed(&mut self, chunk: &[u8], end: bool, flush: bool, now_ms: u64, sink: &mut Sink) -> Result<Step, Error> {
        let settings = sink.settings;
        let length_known = sink.response.content_length.is_some();
        match &mut self.phase {
            Phase::Head => Err(Error::OutOfOrder("body before the response head")),
            Phase::Offloaded(_) | Phase::Done | Phase::Failed => Err(Error::OutOfOrder("body after the end")),
            Phase::Pass => {
                // Hosts stop feeding on Pass; if one does not, the body still goes out intact.
                sink.out.extend_from_slice(chunk);
                if end {
                    self.phase = Phase::Done;
                }
                Ok((false, flush))
            }
            Phase::Buffering { body, .. } if length_known => {
                body.extend_from_slice(chunk);
                let sent = end && self.finish_buffered(sink);
                Ok((sent, sent))
            }
            Phase::Buffering { body, last_arrival_ms, flushed_at_ms } => {
                let held = body.len() + chunk.len();
                let overflow = held > settings.max_buffer as usize;
                if end && !overflow {
                    body.extend_from_slice(chunk);
                    let sent = self.finish_buffered(sink);
                    return Ok((sent, sent));
                }
                // A flush starts streaming only with enough held to be worth compressing; a
                // smaller one waits, at most stream_delay, for the end or for more.
                if flush && held > 0 {
                    flushed_at_ms.get_or_insert(now_ms);
                }
                let flushed = flush && held as u64 >= settings.min_length_for(self.coding);
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
                self.start_stream(sink)?;
                self.write_stream(&held, Push::Hold, now_ms, sink)?;
                let push = if end {
                    Push::Finish
                } else if flushed || paused {
                    Push::Sync
                } else {
                    Push::Hold
                };
                self.write_stream(chunk, push, now_ms, sink)?;
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
                self.write_stream(chunk, push, now_ms, sink)?;
                Ok((false, push != Push::Hold))
            }
        }
    }

    /// A body that an earlier stage held and gave up on: it goes on as it would have without
    /// that stage, starting with what was held, with the headers still to send.
    pub fn resume(
        &mut self,
        held: Vec<u8>,
        chunk: &[u8],
        end: bool,
        flush: bool,
        now_ms: u64,
        sink: &mut Sink,
    ) -> Result<Step, Error> {
        match self.plan(sink) {
            BodyPlan::Pass => {
                *sink.out = [&held[..], chunk].concat();
                if end {
                    self.phase = Phase::Done;
                }
                Ok((true, true))
            }
            BodyPlan::Stream => {
                self.write_stream(&held, Push::Hold, now_ms, sink)?;
                let push = if end { Push::Finish } else { Push::Sync };
                self.write_stream(chunk, push, now_ms, sink)?;
                Ok((true, true))
            }
            BodyPlan::Buffer => {
                if let Phase::Buffering { body, last_arrival_ms, .. } = &mut self.phase {
                    *body = held;
                    *last_arrival_ms = now_ms;
                }
                self.feed(chunk, end, flush, now_ms, sink)
            }
        }
    }

    /// Switches to streaming: the encoded headers are set now, as the length is unknown. A
    /// stream compressor that cannot be made (libzstd refusing its parameters) fails the body
    /// before any of it went out.
    fn start_stream(&mut self, sink: &mut Sink) -> Result<(), Error> {
        let level = stream_level(self.coding, sink.settings.stream_level);
        let encoder = StreamEncoder::new(self.coding, level).map_err(Error::Stream)?;
        self.mode = Mode::Stream;
        self.set_encoded_edits(LengthEdit::Remove, sink);
        self.phase = Phase::Streaming { encoder, held_since_ms: None };
        Ok(())
    }

    fn write_stream(&mut self, input: &[u8], push: Push, now_ms: u64, sink: &mut Sink) -> Result<(), Error> {
        let Phase::Streaming { encoder, held_since_ms } = &mut self.phase else {
            unreachable!("write_stream outside streaming");
        };
        encoder.write(input, push, sink.out).map_err(Error::Stream)?;
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

    fn finish_buffered(&mut self, sink: &mut Sink) -> bool {
        let Phase::Buffering { body, .. } = std::mem::replace(&mut self.phase, Phase::Done) else {
            unreachable!("finish_buffered outside buffering");
        };
        self.whole(body, sink)
    }

    /// The whole body is in: send it compressed with an exact length, or as it was. False when
    /// its compression waits for the host instead.
    pub fn whole(&mut self, body: Vec<u8>, sink: &mut Sink) -> bool {
        self.phase = Phase::Done;
        let settings = sink.settings;
        let length = body.len() as u64;
        if !self.compressible || length < settings.min_length_for(self.coding) {
            self.mode = if self.compressible { Mode::Small } else { Mode::Untouched };
            sink.edits.content_length = LengthEdit::Set(length);
            *sink.out = body;
            return true;
        }
        let level = settings.level.for_body(self.coding, body.len());
        let mut job = WholeBody { coding: self.coding, level, body, compressed: None };
        if self.offload && length >= settings.offload_min_length {
            self.phase = Phase::Offloaded(Some(job));
            return false;
        }
        job.run();
        self.send_whole(job, sink);
        true
    }

    /// Sends a run job's body compressed, or as it was when compressing did not make it smaller.
    pub fn send_whole(&mut self, job: WholeBody, sink: &mut Sink) {
        self.phase = Phase::Done;
        match job.compressed.flatten() {
            Some(compressed) => {
                self.mode = Mode::Oneshot;
                self.set_encoded_edits(LengthEdit::Set(compressed.len() as u64), sink);
                *sink.out = compressed;
            }
            None => {
                self.mode = Mode::Incompressible;
                sink.edits.content_length = LengthEdit::Set(job.body.len() as u64);
                *sink.out = job.body;
            }
        }
    }

    fn set_encoded_edits(&self, length: LengthEdit, sink: &mut Sink) {
        let edits = &mut *sink.edits;
        edits.content_encoding = Some(self.coding);
        edits.content_length = length;
        edits.remove_accept_ranges = true;
        if let Some(etag) = &sink.response.etag {
            edits.etag = if etag.starts_with(b"W/\"") && is_opaque_tag(&etag[2..]) {
                EtagEdit::Keep
            } else if is_opaque_tag(etag) {
                EtagEdit::Set([&b"W/"[..], etag].concat())
            } else {
                EtagEdit::Remove
            };
        }
    }
}

impl WholeBody {
    /// Compresses the body: pure computation, touching nothing but the job.
    pub fn run(&mut self) {
        if self.compressed.is_none() {
            self.compressed = Some(compress_whole(self.coding, self.level, &self.body));
        }
    }
}

/// Whether `tag` is an RFC 9110 opaque-tag: a quoted string of etagc characters.
fn is_opaque_tag(tag: &[u8]) -> bool {
    tag.len() >= 2
        && tag[0] == b'"'
        && tag[tag.len() - 1] == b'"'
        && tag[1..tag.len() - 1].iter().all(|&c| c == 0x21 || (0x23..=0x7e).contains(&c) || c >= 0x80)
}
