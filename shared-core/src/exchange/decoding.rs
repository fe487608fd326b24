//! The decoding stage: an answer that came gzip or deflate though the node was asked for identity
//! (a node or middlebox that compresses regardless), decoded as it arrives where the exchange has
//! work on its body, so that the stages after it see the plain body. Bounded: an answer that
//! decodes past `max` bytes is refused as a decompression bomb.

use std::io::Write;

use flate2::write::{GzDecoder, ZlibDecoder};

use crate::negotiate::Coding;

use super::Error;

/// How much of the encoded body is decoded at a time, so that what one step makes is bounded
/// (DEFLATE expands at most about 1032 times): the bound is checked after each.
const STEP: usize = 4096;

enum Decoder {
    Gzip(GzDecoder<Vec<u8>>),
    Deflate(ZlibDecoder<Vec<u8>>),
}

pub(super) struct Decoding {
    decoder: Decoder,
    coding: Coding,
    decoded: u64,
    max: u64,
}

impl Decoding {
    /// Whether a node's answer in `coding` is decoded here: gzip and deflate, which nodes send
    /// (geth, erigon); an answer in another goes out as it came.
    pub fn undoes(coding: Coding) -> bool {
        matches!(coding, Coding::Gzip | Coding::Deflate)
    }

    /// A body in `coding` (HTTP's `deflate` is the zlib format) that may decode to `max` bytes.
    pub fn new(coding: Coding, max: u64) -> Self {
        let decoder = match coding {
            Coding::Gzip => Decoder::Gzip(GzDecoder::new(Vec::new())),
            Coding::Deflate => Decoder::Deflate(ZlibDecoder::new(Vec::new())),
            Coding::Zstd | Coding::Br | Coding::Dcz => unreachable!("only codings that Decoding::undoes are decoded"),
        };
        Decoding { decoder, coding, decoded: 0, max }
    }

    /// Decodes `chunk` into `out` (cleared first); at `end`, checks that the stream ended whole
    /// (its trailer, nothing after it).
    pub fn feed(&mut self, chunk: &[u8], end: bool, out: &mut Vec<u8>) -> Result<(), Error> {
        out.clear();
        for step in chunk.chunks(STEP) {
            let written = match &mut self.decoder {
                Decoder::Gzip(decoder) => decoder.write_all(step),
                Decoder::Deflate(decoder) => decoder.write_all(step),
            };
            written.map_err(|e| self.error(&e.to_string()))?;
            self.take(out)?;
        }
        if end {
            let finished = match &mut self.decoder {
                Decoder::Gzip(decoder) => decoder.try_finish(),
                Decoder::Deflate(decoder) => decoder.try_finish(),
            };
            finished.map_err(|e| self.error(&format!("it ends early ({e})")))?;
            self.take(out)?;
        }
        Ok(())
    }

    /// Moves what the decoder made into `out`, within the bound.
    fn take(&mut self, out: &mut Vec<u8>) -> Result<(), Error> {
        let made = match &mut self.decoder {
            Decoder::Gzip(decoder) => decoder.get_mut(),
            Decoder::Deflate(decoder) => decoder.get_mut(),
        };
        self.decoded += made.len() as u64;
        if self.decoded > self.max {
            return Err(self.error(&format!("it decodes past {} bytes (refused as a decompression bomb)", self.max)));
        }
        out.append(made);
        Ok(())
    }

    fn error(&self, why: &str) -> Error {
        Error::Decode(format!("the node's {} body cannot be decoded: {why}", self.coding.token()))
    }
}
