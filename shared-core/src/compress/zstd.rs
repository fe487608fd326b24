//! Zstandard through libzstd (the `zstd` crate): one compression context per level per thread
//! for whole bodies, whose frames carry their content size; a fresh stream per streamed body.

use std::cell::RefCell;

use zstd::bulk::Compressor;
use zstd::stream::write::Encoder;

use super::{write_through, Push, StreamError};

/// libzstd's levels that rpcedge uses (its negative, "fast" levels are not offered).
pub(super) const LEVELS: std::ops::RangeInclusive<u32> = 1..=19;

/// Compresses `input` whole into `out` as one frame; `None` when it does not fit.
pub(super) fn compress_into(level: u32, input: &[u8], out: &mut [u8]) -> Option<usize> {
    thread_local! {
        static WHOLE: RefCell<Vec<(u32, Compressor<'static>)>> = const { RefCell::new(Vec::new()) };
    }
    let level = level.clamp(*LEVELS.start(), *LEVELS.end());
    WHOLE.with(|cell| {
        let mut compressors = cell.borrow_mut();
        let at = match compressors.iter().position(|(l, _)| *l == level) {
            Some(at) => at,
            None => {
                compressors.push((level, Compressor::new(level as i32).ok()?));
                compressors.len() - 1
            }
        };
        compressors[at].1.compress_to_buffer(input, out).ok()
    })
}

/// Incremental zstd over one response body: one frame, flushed block by block.
pub(super) struct ZstdStream {
    encoder: Option<Encoder<'static, Vec<u8>>>,
}

impl ZstdStream {
    pub fn new(level: u32) -> Result<Self, StreamError> {
        let level = level.clamp(*LEVELS.start(), *LEVELS.end()) as i32;
        let encoder = Encoder::new(Vec::new(), level).map_err(|e| StreamError(e.to_string()))?;
        Ok(ZstdStream { encoder: Some(encoder) })
    }

    pub fn write(&mut self, input: &[u8], push: Push, out: &mut Vec<u8>) -> Result<(), StreamError> {
        let encoder = self.encoder.as_mut().ok_or_else(StreamError::finished)?;
        write_through(encoder, Encoder::get_mut, input, push, out)?;
        if push == Push::Finish {
            let encoder = self.encoder.take().expect("checked above");
            out.append(&mut encoder.finish().map_err(StreamError::from)?);
        }
        Ok(())
    }
}
