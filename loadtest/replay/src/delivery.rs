//! How a body goes out: framing, frame size, pacing, and the test knobs (status, extra
//! headers, abort mid-body), set per instance and overridable per request by headers.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};
use hyper::header::{HeaderMap, HeaderName, HeaderValue};
use hyper::StatusCode;
use tokio::time::Sleep;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// `Content-Length`.
    Length,
    /// `Transfer-Encoding: chunked`.
    Chunked,
}

/// Frame size in chunked mode when none is given: a realistic write size for a node.
pub const DEFAULT_CHUNKED_FRAME: usize = 16 * 1024;

#[derive(Debug, Clone)]
pub struct Delivery {
    pub mode: Mode,
    /// Body frame size; `None`: the template's own segments in length mode,
    /// [`DEFAULT_CHUNKED_FRAME`] in chunked mode.
    pub chunk_size: Option<usize>,
    pub chunk_delay: Duration,
    /// Adds `X-Accel-Buffering: no`, so nginx passes every chunk on at once.
    pub flush: bool,
    pub status: StatusCode,
    pub extra_headers: Vec<(HeaderName, HeaderValue)>,
    /// Abort the connection after this many body bytes.
    pub reset_after: Option<u64>,
    /// Answer a Beacon-API request in SSZ when its Accept asks for it (otherwise always JSON).
    pub ssz: bool,
    /// The time a JSON-RPC call takes before its answer starts; a batch's calls one after
    /// another, as geth runs them.
    pub call_delay: Duration,
    /// Gzip a JSON-RPC answer for a request that accepts gzip, as geth and erigon do.
    pub gzip_when_asked: bool,
}

impl Delivery {
    pub fn new(
        mode: Mode,
        chunk_size: Option<usize>,
        chunk_delay: Duration,
        flush: bool,
    ) -> Delivery {
        Delivery {
            mode,
            chunk_size,
            chunk_delay,
            flush,
            status: StatusCode::OK,
            extra_headers: Vec::new(),
            reset_after: None,
            ssz: false,
            call_delay: Duration::ZERO,
            gzip_when_asked: false,
        }
    }

    /// These defaults with the `X-Replay-*` request headers applied.
    pub fn for_request(&self, headers: &HeaderMap) -> Result<Delivery, String> {
        let mut delivery = self.clone();
        if let Some(mode) = header_text(headers, "x-replay-mode")? {
            delivery.mode = match mode.to_ascii_lowercase().as_str() {
                "length" => Mode::Length,
                "chunked" => Mode::Chunked,
                _ => {
                    return Err(format!(
                        "X-Replay-Mode: expected length or chunked, got {mode:?}"
                    ))
                }
            };
        }
        if let Some(size) = header_number(headers, "x-replay-chunk-size")? {
            if size == 0 {
                return Err("X-Replay-Chunk-Size must be at least 1".to_string());
            }
            delivery.chunk_size = Some(size as usize);
        }
        if let Some(delay) = header_number(headers, "x-replay-chunk-delay-ms")? {
            delivery.chunk_delay = Duration::from_millis(delay);
        }
        if let Some(delay) = header_number(headers, "x-replay-call-delay-ms")? {
            delivery.call_delay = Duration::from_millis(delay);
        }
        if let Some(flush) = header_text(headers, "x-replay-flush")? {
            delivery.flush = match flush {
                "1" | "true" | "yes" | "on" => true,
                "0" | "false" | "no" | "off" => false,
                _ => return Err(format!("X-Replay-Flush: expected 1 or 0, got {flush:?}")),
            };
        }
        if let Some(ssz) = header_text(headers, "x-replay-ssz")? {
            delivery.ssz = match ssz {
                "1" | "true" | "yes" | "on" => true,
                "0" | "false" | "no" | "off" => false,
                _ => return Err(format!("X-Replay-Ssz: expected 1 or 0, got {ssz:?}")),
            };
        }
        if let Some(status) = header_number(headers, "x-replay-status")? {
            delivery.status = u16::try_from(status)
                .ok()
                .and_then(|code| StatusCode::from_u16(code).ok())
                .filter(|code| !code.is_informational())
                .ok_or_else(|| format!("X-Replay-Status: {status} is not a final status code"))?;
        }
        for value in headers.get_all("x-replay-header") {
            delivery.extra_headers.push(parse_extra_header(value)?);
        }
        delivery.reset_after =
            header_number(headers, "x-replay-reset-after")?.or(delivery.reset_after);
        Ok(delivery)
    }

    /// Whether the status allows a body at all.
    pub fn status_has_body(&self) -> bool {
        !matches!(
            self.status,
            StatusCode::NO_CONTENT | StatusCode::NOT_MODIFIED
        )
    }

    fn frame_size(&self) -> Option<usize> {
        match self.mode {
            Mode::Length => self.chunk_size,
            Mode::Chunked => Some(self.chunk_size.unwrap_or(DEFAULT_CHUNKED_FRAME)),
        }
    }
}

fn header_text<'h>(headers: &'h HeaderMap, name: &str) -> Result<Option<&'h str>, String> {
    headers
        .get(name)
        .map(|value| {
            value
                .to_str()
                .map(str::trim)
                .map_err(|_| format!("{name}: not ASCII"))
        })
        .transpose()
}

fn header_number(headers: &HeaderMap, name: &str) -> Result<Option<u64>, String> {
    header_text(headers, name)?
        .map(|text| {
            text.parse::<u64>()
                .map_err(|_| format!("{name}: expected a number, got {text:?}"))
        })
        .transpose()
}

/// `Name: value` into a header; the framing headers stay the replay's own business.
fn parse_extra_header(value: &HeaderValue) -> Result<(HeaderName, HeaderValue), String> {
    let text = value
        .to_str()
        .map_err(|_| "X-Replay-Header: not ASCII".to_string())?;
    let (name, value) = text
        .split_once(':')
        .ok_or_else(|| format!("X-Replay-Header: expected \"Name: value\", got {text:?}"))?;
    let name = HeaderName::from_bytes(name.trim().as_bytes())
        .map_err(|_| format!("X-Replay-Header: bad name in {text:?}"))?;
    if matches!(
        name.as_str(),
        "content-length" | "transfer-encoding" | "connection"
    ) {
        return Err(format!(
            "X-Replay-Header: {name} cannot be set, it frames the body"
        ));
    }
    let value = HeaderValue::from_str(value.trim())
        .map_err(|_| format!("X-Replay-Header: bad value in {text:?}"))?;
    Ok((name, value))
}

/// Set by a body that wants its connection aborted; the connection's socket wrapper acts on
/// it once everything before it has been written (see `server::AbortableStream`).
pub type AbortSignal = Arc<AtomicBool>;

/// A response body fed from prepared segments, sliced into frames and paced as the delivery
/// asks. Hyper writes a frame out when the body is pending, so a frame reaches the socket
/// before the pause that follows it.
pub struct ReplayBody {
    segments: VecDeque<Bytes>,
    remaining: u64,
    frame_size: Option<usize>,
    exact_length: bool,
    delay: Duration,
    pause: Option<Pin<Box<Sleep>>>,
    sent_any: bool,
    reset: Option<Reset>,
}

struct Reset {
    /// Body bytes still to send before the abort.
    budget: u64,
    signal: AbortSignal,
    /// Fallback if the connection never gets to act on the signal: fail the body instead.
    deadline: Option<Pin<Box<Sleep>>>,
}

/// How long a body waits for its connection to act on an abort before failing by itself.
const ABORT_FALLBACK: Duration = Duration::from_secs(1);

impl ReplayBody {
    pub fn new(segments: Vec<Bytes>, delivery: &Delivery, abort: &AbortSignal) -> ReplayBody {
        let remaining = segments.iter().map(|s| s.len() as u64).sum();
        ReplayBody {
            segments: segments.into_iter().filter(|s| !s.is_empty()).collect(),
            remaining,
            frame_size: delivery.frame_size(),
            exact_length: delivery.mode == Mode::Length,
            delay: delivery.chunk_delay,
            pause: None,
            sent_any: false,
            reset: delivery.reset_after.map(|budget| Reset {
                budget,
                signal: abort.clone(),
                deadline: None,
            }),
        }
    }

    /// One buffer, sent as it is with its length.
    pub fn whole(bytes: Bytes) -> ReplayBody {
        let delivery = Delivery::new(Mode::Length, None, Duration::ZERO, false);
        ReplayBody::new(vec![bytes], &delivery, &AbortSignal::default())
    }

    /// No body, for HEAD and for statuses without one; `mode` decides whether hyper may
    /// announce a length of its own.
    pub fn empty(mode: Mode) -> ReplayBody {
        let delivery = Delivery::new(mode, None, Duration::ZERO, false);
        ReplayBody::new(Vec::new(), &delivery, &AbortSignal::default())
    }

    /// The next frame: at most `frame_size` bytes (and no more than the reset budget),
    /// gathered across segments only when a frame size is set.
    fn next_frame(&mut self, limit: u64) -> Option<Bytes> {
        let size = self
            .frame_size
            .map_or(limit, |size| (size as u64).min(limit)) as usize;
        let front = self.segments.front_mut()?;
        if front.len() > size {
            return Some(front.split_to(size));
        }
        let first = self.segments.pop_front()?;
        if self.frame_size.is_none() || first.len() == size {
            return Some(first);
        }
        let mut frame = BytesMut::with_capacity(size);
        frame.extend_from_slice(&first);
        while frame.len() < size {
            let Some(next) = self.segments.front_mut() else {
                break;
            };
            let wanted = size - frame.len();
            if next.len() > wanted {
                frame.extend_from_slice(&next.split_to(wanted));
            } else {
                frame.extend_from_slice(next);
                self.segments.pop_front();
            }
        }
        Some(frame.freeze())
    }
}

impl Body for ReplayBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        if let Some(reset) = &mut this.reset {
            if reset.budget == 0 || this.segments.is_empty() {
                // Raise the signal and stay pending: hyper flushes what it holds, and the
                // socket wrapper aborts on its next flush.
                reset.signal.store(true, Ordering::Release);
                let deadline = reset
                    .deadline
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(ABORT_FALLBACK)));
                return match deadline.as_mut().poll(cx) {
                    Poll::Pending => Poll::Pending,
                    Poll::Ready(()) => {
                        Poll::Ready(Some(Err(std::io::Error::other("X-Replay-Reset-After"))))
                    }
                };
            }
        }
        if this.segments.is_empty() {
            return Poll::Ready(None);
        }
        if this.sent_any && !this.delay.is_zero() {
            let pause = this
                .pause
                .get_or_insert_with(|| Box::pin(tokio::time::sleep(this.delay)));
            if pause.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            this.pause = None;
        }
        let limit = this.reset.as_ref().map_or(u64::MAX, |reset| reset.budget);
        let Some(frame) = this.next_frame(limit) else {
            return Poll::Ready(None);
        };
        let sent = frame.len() as u64;
        this.remaining -= sent;
        if let Some(reset) = &mut this.reset {
            reset.budget -= sent;
        }
        this.sent_any = true;
        Poll::Ready(Some(Ok(Frame::data(frame))))
    }

    fn is_end_stream(&self) -> bool {
        self.segments.is_empty() && self.reset.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        if self.exact_length {
            SizeHint::with_exact(self.remaining)
        } else {
            SizeHint::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames(segments: &[&'static str], chunk_size: Option<usize>, mode: Mode) -> Vec<Bytes> {
        let delivery = Delivery::new(mode, chunk_size, Duration::ZERO, false);
        let mut body = ReplayBody::new(
            segments
                .iter()
                .map(|s| Bytes::from_static(s.as_bytes()))
                .collect(),
            &delivery,
            &AbortSignal::default(),
        );
        std::iter::from_fn(|| body.next_frame(u64::MAX)).collect()
    }

    #[test]
    fn length_mode_keeps_segments_unless_a_size_is_set() {
        assert_eq!(
            frames(&["ab", "c", "defg"], None, Mode::Length),
            ["ab", "c", "defg"]
        );
        assert_eq!(
            frames(&["ab", "c", "defg"], Some(3), Mode::Length),
            ["abc", "def", "g"]
        );
    }

    #[test]
    fn chunked_mode_gathers_frames_of_the_chunk_size() {
        assert_eq!(
            frames(&["ab", "c", "defg"], Some(2), Mode::Chunked),
            ["ab", "cd", "ef", "g"]
        );
        assert_eq!(
            frames(&["ab", "c", "defg"], None, Mode::Chunked),
            ["abcdefg"]
        );
    }

    #[test]
    fn request_headers_override_the_defaults() {
        let defaults = Delivery::new(Mode::Length, None, Duration::ZERO, false);
        let mut headers = HeaderMap::new();
        headers.insert("x-replay-mode", HeaderValue::from_static("chunked"));
        headers.insert("x-replay-chunk-delay-ms", HeaderValue::from_static("300"));
        headers.append(
            "x-replay-header",
            HeaderValue::from_static("Content-Encoding: gzip"),
        );
        headers.append("x-replay-header", HeaderValue::from_static("ETag: \"abc\""));
        let delivery = defaults.for_request(&headers).unwrap();
        assert_eq!(delivery.mode, Mode::Chunked);
        assert_eq!(delivery.chunk_delay, Duration::from_millis(300));
        assert_eq!(delivery.extra_headers.len(), 2);
        assert_eq!(delivery.extra_headers[1].1, "\"abc\"");

        for (name, value) in [
            ("x-replay-status", "101"),
            ("x-replay-mode", "slow"),
            ("x-replay-header", "Content-Length: 5"),
        ] {
            let mut headers = HeaderMap::new();
            headers.insert(name, HeaderValue::from_static(value));
            assert!(defaults.for_request(&headers).is_err(), "{name}: {value}");
        }
    }
}
