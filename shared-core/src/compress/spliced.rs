//! zstd and brotli forms of a cached tail that a hit puts behind plain bytes (the envelope with
//! the client's id) without compressing anything again.
//!
//! zstd: the tail's blocks, from a frame without a content size. A hit writes its own frame
//! header (with the whole answer's size), the prefix in raw blocks, then the kept blocks. A raw
//! block leaves every state a compressed block reads (repeat offsets, entropy tables) as the
//! frame's start leaves it, and the blocks' offsets reach back within the tail only.
//!
//! brotli: the tail as a bare catable stream (the `brotli` crate's `catable` and `bare_stream`):
//! no window bits, no static dictionary, no distance carried in from before, its first two bytes
//! uncompressed so that literal contexts do not depend on what precedes. A hit writes the window
//! bits, the prefix in uncompressed meta-blocks, the kept stream, then the last empty meta-block.

use std::io::{Read, Write};

use ::zstd::zstd_safe::CParameter;
use brotli::enc::BrotliEncoderParams;

/// zstd's magic number, as a frame starts.
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];
/// A frame header's descriptor: an 8-byte content size, no checksum, no dictionary, a window
/// descriptor (not a single segment).
const ZSTD_DESCRIPTOR_SIZED: u8 = 0b1100_0000;
/// The largest window a form uses: 8 MiB, what RFC 9659 lets an HTTP client refuse above.
const MAX_WINDOW_LOG: u32 = 23;
const ZSTD_MAX_BLOCK: usize = 128 * 1024;
/// The longest uncompressed brotli meta-block with four length nibbles.
const BR_MAX_UNCOMPRESSED: usize = 1 << 16;
/// ISLAST and ISLASTEMPTY: the empty meta-block that ends a brotli stream.
const BR_LAST: u8 = 0b11;

/// The smallest window log that holds `length` bytes, within 1 KiB and `MAX_WINDOW_LOG`.
fn window_log(length: usize) -> u32 {
    (usize::BITS - length.saturating_sub(1).leading_zeros()).clamp(10, MAX_WINDOW_LOG)
}

/// The zstd form of `tail`: its window descriptor, then its blocks; `None` when not smaller.
pub fn zstd_form(level: u32, tail: &[u8]) -> Option<Vec<u8>> {
    let mut compressor = ::zstd::bulk::Compressor::new(level as i32).ok()?;
    compressor.set_parameter(CParameter::ContentSizeFlag(false)).ok()?;
    compressor.set_parameter(CParameter::ChecksumFlag(false)).ok()?;
    compressor.set_parameter(CParameter::WindowLog(window_log(tail.len()))).ok()?;
    let frame = compressor.compress(tail).ok()?;
    // magic, a descriptor with nothing but a window descriptor after it, the window descriptor
    let header = ZSTD_MAGIC.len() + 2;
    let form = (frame.get(..5)? == [ZSTD_MAGIC.as_slice(), &[0]].concat()).then(|| frame[header - 1..].to_vec())?;
    (form.len() < tail.len()).then_some(form)
}

/// Whether `form` is a window descriptor of at most 8 MiB and whole blocks no longer than the
/// window allows, the last one last.
pub fn zstd_form_is_sound(form: &[u8]) -> bool {
    let Some((&window, mut blocks)) = form.split_first() else { return false };
    // the exponent, above 1 KiB; a mantissa would only add eighths below the next power
    if u32::from(window >> 3) + 10 > MAX_WINDOW_LOG || window & 0b111 != 0 {
        return false;
    }
    let block_max = block_max(window);
    while let Some(header) = blocks.get(..3) {
        let header = u32::from_le_bytes([header[0], header[1], header[2], 0]);
        let (last, kind, size) = (header & 1 == 1, (header >> 1) & 0b11, (header >> 3) as usize);
        let stored = match kind {
            0 | 2 => size,
            1 => 1,
            _ => return false,
        };
        if size > block_max || blocks.len() - 3 < stored {
            return false;
        }
        blocks = &blocks[3 + stored..];
        if last {
            return blocks.is_empty();
        }
    }
    false
}

/// A zstd frame of `prefix` then the `tail_len` bytes that `form` (sound) holds.
pub fn zstd_splice(form: &[u8], prefix: &[u8], tail_len: u64) -> Vec<u8> {
    let (window, blocks) = (form[0], &form[1..]);
    let block_max = block_max(window);
    let mut out = Vec::with_capacity(14 + prefix.len() + prefix.len() / block_max * 3 + 3 + blocks.len());
    out.extend_from_slice(&ZSTD_MAGIC);
    out.extend_from_slice(&[ZSTD_DESCRIPTOR_SIZED, window]);
    out.extend_from_slice(&(prefix.len() as u64 + tail_len).to_le_bytes());
    for raw in prefix.chunks(block_max) {
        // not last, raw
        out.extend_from_slice(&((raw.len() as u32) << 3).to_le_bytes()[..3]);
        out.extend_from_slice(raw);
    }
    out.extend_from_slice(blocks);
    out
}

/// A zstd block's longest content in a frame of this window descriptor (RFC 8878 3.1.1.2.4).
fn block_max(window: u8) -> usize {
    ZSTD_MAX_BLOCK.min(1 << (10 + (window >> 3)))
}

/// The brotli form of `tail`: its window log, then the bare catable stream; `None` when not
/// smaller. Quality 2 at the least: qualities 0 and 1 widen the window past the one the form
/// names.
pub fn br_form(quality: u32, tail: &[u8]) -> Option<Vec<u8>> {
    let lgwin = window_log(tail.len()).max(16);
    let params = BrotliEncoderParams {
        quality: quality.clamp(2, 11) as i32,
        lgwin: lgwin as i32,
        catable: true,
        bare_stream: true,
        size_hint: tail.len(),
        ..BrotliEncoderParams::default()
    };
    let mut writer = brotli::CompressorWriter::with_params(vec![lgwin as u8], 4096, &params);
    writer.write_all(tail).ok()?;
    let form = writer.into_inner();
    (form.len() < tail.len()).then_some(form)
}

/// Whether `form` names a window brotli has and holds a stream.
pub fn br_form_is_sound(form: &[u8]) -> bool {
    matches!(form.split_first(), Some((lgwin, stream)) if (16..=24).contains(lgwin) && !stream.is_empty())
}

/// A brotli stream of `prefix` then what `form` (sound) holds.
pub fn br_splice(form: &[u8], prefix: &[u8]) -> Vec<u8> {
    let (lgwin, stream) = (u64::from(form[0]), &form[1..]);
    let mut bits = Bits::default();
    // the window bits (RFC 7932, 9.1): 16 is a lone 0; 18 to 24, a 1 and three bits of
    // lgwin - 17; 17, a 1 and six 0s
    match lgwin {
        16 => bits.put(0, 1),
        17 => bits.put(1, 7),
        _ => bits.put(1 | ((lgwin - 17) << 1), 4),
    }
    let mut out = Vec::with_capacity(4 + prefix.len() + prefix.len() / BR_MAX_UNCOMPRESSED * 4 + stream.len() + 1);
    if prefix.is_empty() {
        // an empty metadata meta-block, to reach a byte boundary: ISLAST 0, MNIBBLES 0 (11),
        // reserved 0, MSKIPBYTES 0
        bits.put(0b0110, 6);
        bits.align_into(&mut out);
    }
    for raw in prefix.chunks(BR_MAX_UNCOMPRESSED) {
        // ISLAST 0, four nibbles of MLEN - 1, ISUNCOMPRESSED 1, then the bytes from a byte boundary
        bits.put(0, 1);
        bits.put(0, 2);
        bits.put(raw.len() as u64 - 1, 16);
        bits.put(1, 1);
        bits.align_into(&mut out);
        out.extend_from_slice(raw);
    }
    out.extend_from_slice(stream);
    out.push(BR_LAST);
    out
}

/// Bits gathered least significant first, as brotli writes them.
#[derive(Default)]
struct Bits {
    value: u64,
    count: u32,
}

impl Bits {
    fn put(&mut self, value: u64, width: u32) {
        self.value |= value << self.count;
        self.count += width;
    }

    /// Writes the bits, zero-padded to a byte boundary.
    fn align_into(&mut self, out: &mut Vec<u8>) {
        out.extend((0..self.count.div_ceil(8)).map(|byte| (self.value >> (8 * byte)) as u8));
        *self = Bits::default();
    }
}

/// Whether a spliced zstd body decodes to exactly `expected` (decoding no more than that).
pub fn zstd_decodes_to(body: &[u8], expected: &[u8]) -> bool {
    ::zstd::bulk::decompress(body, expected.len()).is_ok_and(|decoded| decoded == expected)
}

/// Whether a spliced brotli body decodes to exactly `expected`.
pub fn br_decodes_to(body: &[u8], expected: &[u8]) -> bool {
    let mut decoded = Vec::with_capacity(expected.len());
    let read = brotli::Decompressor::new(body, 4096).take(expected.len() as u64 + 1).read_to_end(&mut decoded);
    read.is_ok() && decoded == expected
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tails() -> Vec<Vec<u8>> {
        let block = br#"{"number":"0x12a05f2","hash":"0x5c504ed432cb51138bcf09aa5e8a410dd4a1e204ef84bfed1be16dfba1b22060","transactions":[]}"#;
        // windows of 16 (the least a form takes), 17 and 21
        let windows = [block.repeat(3), block.repeat(1000), block.repeat(12_000)];
        [vec![b"1}".to_vec(), (0..300_000u32).flat_map(|i| i.to_le_bytes()).collect()], windows.to_vec()].concat()
    }

    fn prefixes() -> Vec<Vec<u8>> {
        let long_id = [br#"{"jsonrpc":"2.0","id":""#.as_slice(), &[b'x'; 200_000], br#"","result":"#].concat();
        vec![Vec::new(), b"x".to_vec(), br#"{"jsonrpc":"2.0","id":7,"result":"#.to_vec(), b"\xff\x00".to_vec(), long_id]
    }

    #[test]
    fn a_zstd_form_behind_any_prefix_decodes_to_the_prefix_and_the_tail() {
        for tail in tails() {
            let Some(form) = zstd_form(9, &tail) else {
                assert!(tail.len() < 100, "only a tiny tail does not get smaller");
                continue;
            };
            for prefix in prefixes() {
                let body = zstd_splice(&form, &prefix, tail.len() as u64);
                assert!(zstd_decodes_to(&body, &[prefix.as_slice(), &tail].concat()), "{} {}", tail.len(), prefix.len());
            }
        }
    }

    #[test]
    fn a_br_form_behind_any_prefix_decodes_to_the_prefix_and_the_tail() {
        for tail in tails() {
            let Some(form) = br_form(6, &tail) else {
                assert!(tail.len() < 100, "only a tiny tail does not get smaller");
                continue;
            };
            for prefix in prefixes() {
                let body = br_splice(&form, &prefix);
                assert!(br_decodes_to(&body, &[prefix.as_slice(), &tail].concat()), "{} {}", tail.len(), prefix.len());
            }
        }
    }

    #[test]
    fn a_zstd_form_that_is_cut_or_padded_is_not_sound() {
        let tail = tails()[2].clone();
        let form = zstd_form(9, &tail).unwrap();
        assert!(zstd_form_is_sound(&form));
        assert!(!zstd_form_is_sound(&form[..form.len() - 1]));
        assert!(!zstd_form_is_sound(&[form.as_slice(), &[0]].concat()));
        assert!(!zstd_form_is_sound(&[&[24 << 3], &form[1..]].concat()), "a 16 MiB window");
        // one last RLE block of 2,000 bytes: within a 128 KiB window, not within 1 KiB
        let rle = ((2000u32 << 3) | (1 << 1) | 1).to_le_bytes();
        assert!(zstd_form_is_sound(&[7 << 3, rle[0], rle[1], rle[2], b'x']));
        assert!(!zstd_form_is_sound(&[0, rle[0], rle[1], rle[2], b'x']), "blocks longer than a 1 KiB window allows");
        assert!(!zstd_form_is_sound(&[]));
        assert!(!br_form_is_sound(&[25, 1]) && !br_form_is_sound(&[22]));
    }
}
