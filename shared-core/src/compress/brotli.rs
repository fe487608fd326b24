//! Brotli through the `brotli` crate (Dropbox's port of Google's encoder, in Rust): a fresh encoder
//! per body, its window sized to the body so that a small one allocates little.

use std::io::Write;

use brotli::enc::BrotliEncoderParams;
use brotli::CompressorWriter;

use super::{write_through, Push, StreamError};

/// Brotli's qualities.
pub(super) const LEVELS: std::ops::RangeInclusive<u32> = 0..=11;
/// The window of a stream, whose length is not known: 512 KiB, near zstd's at level 1 and twice
/// zlib's, so that many streams at once hold about what gzip's and zstd's do.
const STREAM_LGWIN: u32 = 19;
/// What the encoder writes out at a time.
const BUFFER: usize = 4096;

fn params(quality: u32, lgwin: u32, size_hint: usize) -> BrotliEncoderParams {
    BrotliEncoderParams {
        quality: quality.min(*LEVELS.end()) as i32,
        lgwin: lgwin as i32,
        size_hint,
        ..BrotliEncoderParams::default()
    }
}

/// The smallest window that holds `length` bytes, within brotli's 1 KiB to 16 MiB.
fn window_for(length: usize) -> u32 {
    (usize::BITS - length.saturating_sub(1).leading_zeros()).clamp(10, 24)
}

/// Compresses `input` whole; `None` when the result would not be smaller.
pub(super) fn compress(quality: u32, input: &[u8]) -> Option<Vec<u8>> {
    let params = params(quality, window_for(input.len()), input.len());
    let mut writer = CompressorWriter::with_params(Vec::with_capacity(input.len() / 4), BUFFER, &params);
    writer.write_all(input).ok()?;
    let out = writer.into_inner();
    (out.len() < input.len()).then_some(out)
}

/// Incremental brotli over one response body, flushed on a byte boundary where asked.
pub(super) struct BrotliStream {
    writer: Option<CompressorWriter<Vec<u8>>>,
}

impl BrotliStream {
    pub fn new(quality: u32) -> Self {
        let params = params(quality, STREAM_LGWIN, 0);
        BrotliStream { writer: Some(CompressorWriter::with_params(Vec::new(), BUFFER, &params)) }
    }

    pub fn write(&mut self, input: &[u8], push: Push, out: &mut Vec<u8>) -> Result<(), StreamError> {
        let writer = self.writer.as_mut().ok_or_else(StreamError::finished)?;
        write_through(writer, CompressorWriter::get_mut, input, push, out)?;
        if push == Push::Finish {
            out.append(&mut self.writer.take().expect("checked above").into_inner());
        }
        Ok(())
    }
}
