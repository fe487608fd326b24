//! `dcz` (RFC 9842 §4): zstd against rpcedge's dictionary ([`crate::dictionary`]) as raw content,
//! behind a header of 8 magic bytes and the dictionary's SHA-256, which lets a client check that
//! it decodes with the dictionary the body was made with.

use std::cell::RefCell;
use std::sync::OnceLock;

use zstd::bulk::Compressor;
use zstd::dict::EncoderDictionary;
use zstd::stream::write::Encoder;
use zstd::zstd_safe::CParameter;

use super::{write_through, Push, StreamError};
use crate::dictionary;

/// RFC 9842 §4's magic: a skippable zstd frame's number, and its 32 bytes' length.
pub(super) const MAGIC: [u8; 8] = [0x5e, 0x2a, 0x4d, 0x18, 0x20, 0x00, 0x00, 0x00];
/// What a dcz body starts with: the magic, then the dictionary's hash.
pub const HEADER_LEN: usize = MAGIC.len() + 32;

/// The dictionary prepared for level 1 or 3, the levels dcz is made at, kept for the process's life (a CDict is read-only and
/// shared by threads).
fn prepared(level: u32) -> &'static EncoderDictionary<'static> {
    static PREPARED: OnceLock<[EncoderDictionary<'static>; 2]> = OnceLock::new();
    let [low, high] = PREPARED.get_or_init(|| {
        [EncoderDictionary::copy(dictionary::DICTIONARY, 1), EncoderDictionary::copy(dictionary::DICTIONARY, 3)]
    });
    if level <= 1 { low } else { high }
}

fn header(out: &mut [u8]) {
    out[..MAGIC.len()].copy_from_slice(&MAGIC);
    out[MAGIC.len()..HEADER_LEN].copy_from_slice(dictionary::hash());
}

/// Compresses `input` whole into `out` (header, then one frame with its content size); `None`
/// when it does not fit.
pub(super) fn compress_into(level: u32, input: &[u8], out: &mut [u8]) -> Option<usize> {
    thread_local! {
        static WHOLE: RefCell<Vec<(u32, Compressor<'static>)>> = const { RefCell::new(Vec::new()) };
    }
    if out.len() < HEADER_LEN {
        return None;
    }
    header(out);
    let level = if level <= 1 { 1 } else { 3 };
    WHOLE.with(|cell| {
        let mut compressors = cell.borrow_mut();
        let at = match compressors.iter().position(|(l, _)| *l == level) {
            Some(at) => at,
            None => {
                let mut compressor = Compressor::with_prepared_dictionary(prepared(level)).ok()?;
                // the hash in the header names the dictionary: its id in the frame would be 4 bytes more
                compressor.set_parameter(CParameter::DictIdFlag(false)).ok()?;
                compressors.push((level, compressor));
                compressors.len() - 1
            }
        };
        let written = compressors[at].1.compress_to_buffer(input, &mut out[HEADER_LEN..]).ok()?;
        Some(HEADER_LEN + written)
    })
}

/// Incremental dcz over one response body: the header, then one frame flushed block by block.
pub(super) struct DczStream {
    encoder: Option<Encoder<'static, Vec<u8>>>,
    header_out: bool,
}

impl DczStream {
    pub fn new(level: u32) -> Result<Self, StreamError> {
        let mut encoder =
            Encoder::with_prepared_dictionary(Vec::new(), prepared(level)).map_err(|e| StreamError(e.to_string()))?;
        encoder.set_parameter(CParameter::DictIdFlag(false)).map_err(|e| StreamError(e.to_string()))?;
        Ok(DczStream { encoder: Some(encoder), header_out: false })
    }

    pub fn write(&mut self, input: &[u8], push: Push, out: &mut Vec<u8>) -> Result<(), StreamError> {
        let encoder = self.encoder.as_mut().ok_or_else(StreamError::finished)?;
        if !self.header_out {
            let start = out.len();
            out.resize(start + HEADER_LEN, 0);
            header(&mut out[start..]);
            self.header_out = true;
        }
        write_through(encoder, Encoder::get_mut, input, push, out)?;
        if push == Push::Finish {
            let encoder = self.encoder.take().expect("checked above");
            out.append(&mut encoder.finish().map_err(StreamError::from)?);
        }
        Ok(())
    }
}
