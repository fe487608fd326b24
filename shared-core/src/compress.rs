//! The compressors, one module per coding family: whole bodies with an exact length, and streams
//! flushed where the upstream flushed. A whole body is only ever sent compressed when that made it
//! smaller.

use std::cell::RefCell;
use std::fmt;

use crate::negotiate::Coding;

pub(crate) mod blocks;
pub(crate) mod spliced;
mod brotli;
pub mod dcz;
mod deflate;
mod zstd;

use self::brotli::BrotliStream;
use self::dcz::DczStream;
use self::deflate::DeflateStream;
use self::zstd::ZstdStream;

/// The level of `level auto` for a body of `length` bytes in `coding`, chosen by measurement on
/// the corpus (`benches/level.rs`; BENCHMARKS.md has the tables).
///
/// gzip and deflate (libdeflate): level 5, libdeflate's first with lazy matching, saves the most
/// bytes per extra microsecond over level 1 on bodies up to a few hundred KiB (7-14 % fewer bytes
/// there, for 1.2-2x the time of level 1; levels 2-4 save 1-4 % for nearly as much time, 6 and up
/// little more for much more); it sends no more than nginx's gzip 6 or Envoy's compressor there.
/// Above 256 KiB the time is what a proxy runs out of first: level 1, several milliseconds per
/// body less. Only level 5 would send fewer bytes than nginx's gzip 6 on those bodies, and it cut
/// the native Envoy module's mix from 1.69x Envoy's compressor's requests to 1.28x (the load test
/// in loadtest/results/level.md).
///
/// zstd: level 1 at every size. Levels 2 to 4 take longer and make no fewer bytes (zstd tunes its
/// level-1 parameters to the body's size); 5 and up save 3-10 % for 3-10x the time. At level 1
/// zstd makes 0-10 % fewer bytes than libdeflate's level 5 for a third to a half of its time.
///
/// dcz: zstd level 3 below 64 KiB, 1 above. Its answers are small ones, where level 3 makes
/// 2-4 % fewer bytes than 1 against the dictionary, in microseconds (`tools/dictionary.py`
/// --levels); past that the dictionary matters little and the time does.
///
/// br: quality 3 below 64 KiB, 2 above: the last quality that saves at least a byte per extra
/// microsecond over the one below it (as gzip's level 5 does); 4 saves under 1 % more for 1.5x
/// the time, and 5 and up allocate so much that a 2 KiB body takes milliseconds.
pub fn auto_level(coding: Coding, length: usize) -> u32 {
    match coding {
        Coding::Gzip | Coding::Deflate if length < 256 * 1024 => 5,
        Coding::Gzip | Coding::Deflate => 1,
        Coding::Zstd => 1,
        Coding::Br | Coding::Dcz if length < 64 * 1024 => 3,
        Coding::Br => 2,
        Coding::Dcz => 1,
    }
}

/// The level a stream in `coding` is compressed at: `deflate_level` (the `stream_level`
/// setting) for gzip and deflate; for zstd and br, the level `auto` gives the largest bodies,
/// as a streamed body is a long or a slow one.
pub fn stream_level(coding: Coding, deflate_level: u32) -> u32 {
    match coding {
        Coding::Gzip | Coding::Deflate => deflate_level,
        Coding::Zstd | Coding::Br | Coding::Dcz => auto_level(coding, usize::MAX),
    }
}

/// Compresses `input` whole. Returns `None` when the result would not be smaller than the input,
/// so the caller sends the original.
pub fn compress_whole(coding: Coding, level: u32, input: &[u8]) -> Option<Vec<u8>> {
    match coding {
        Coding::Gzip | Coding::Deflate => {
            smaller(input, |out| deflate::compress_into(coding == Coding::Deflate, level, input, out))
        }
        Coding::Zstd => smaller(input, |out| zstd::compress_into(level, input, out)),
        Coding::Dcz => smaller(input, |out| dcz::compress_into(level, input, out)),
        // brotli's encoder takes no bound on its output: it writes whole and is compared after
        Coding::Br => brotli::compress(level, input),
    }
}

/// Compresses `input` as a raw DEFLATE stream (no header, no trailer); `None` when that would
/// not be smaller.
pub fn deflate_raw(level: u32, input: &[u8]) -> Option<Vec<u8>> {
    smaller(input, |out| deflate::raw_into(level, input, out))
}

/// Bodies up to this size are compressed into a buffer kept per thread and copied out at their
/// compressed length: a fresh buffer of the input's size is zero-filled first, which for bodies
/// below the allocator's mmap threshold costs more than copying the compressed bytes.
const SCRATCH_MAX: usize = 128 * 1024;

/// Runs `compress` into a buffer one byte short of the input, which makes the compressor itself
/// give up on output that would not be smaller, without compressing into a worst-case-sized
/// buffer first; returns the output at its length.
fn smaller(input: &[u8], compress: impl FnOnce(&mut [u8]) -> Option<usize>) -> Option<Vec<u8>> {
    thread_local! {
        static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    }
    let room = input.len().checked_sub(1)?;
    if room > SCRATCH_MAX {
        let mut out = vec![0; room];
        let written = compress(&mut out)?;
        out.truncate(written);
        return Some(out);
    }
    SCRATCH.with(|cell| {
        let mut scratch = cell.borrow_mut();
        if scratch.len() < room {
            scratch.resize(room, 0);
        }
        let written = compress(&mut scratch[..room])?;
        Some(scratch[..written].to_vec())
    })
}

/// A stream compressor failed; the body already sent cannot be completed validly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamError(pub String);

impl fmt::Display for StreamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "stream compressor failed: {}", self.0)
    }
}

impl std::error::Error for StreamError {}

impl From<std::io::Error> for StreamError {
    fn from(error: std::io::Error) -> Self {
        StreamError(error.to_string())
    }
}

impl StreamError {
    fn finished() -> Self {
        StreamError("stream already finished".into())
    }
}

/// Feeds `input` to an encoder that writes into a `Vec` (zstd's, brotli's) and moves what it
/// made into `out`, flushed on a byte boundary for [`Push::Sync`]; the caller closes the stream
/// for [`Push::Finish`].
fn write_through<W: std::io::Write>(
    encoder: &mut W,
    made: fn(&mut W) -> &mut Vec<u8>,
    input: &[u8],
    push: Push,
    out: &mut Vec<u8>,
) -> Result<(), StreamError> {
    encoder.write_all(input)?;
    if push == Push::Sync {
        encoder.flush()?;
    }
    out.append(made(encoder));
    Ok(())
}

/// How far to push data through the stream compressor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Push {
    /// Let the compressor hold data for a better ratio.
    Hold,
    /// Emit everything fed so far, decodable up to here (zlib's sync flush, zstd's and brotli's
    /// flush).
    Sync,
    /// Emit everything and close the stream, trailer included.
    Finish,
}

/// Incremental compression of one response body in one coding.
pub struct StreamEncoder(Stream);

// One per streamed response: boxing the big variants would add an allocation per stream.
#[allow(clippy::large_enum_variant)]
enum Stream {
    Deflate(DeflateStream),
    Zstd(ZstdStream),
    Br(BrotliStream),
    Dcz(DczStream),
}

impl StreamEncoder {
    pub fn new(coding: Coding, level: u32) -> Result<Self, StreamError> {
        Ok(StreamEncoder(match coding {
            Coding::Gzip | Coding::Deflate => Stream::Deflate(DeflateStream::new(coding, level)),
            Coding::Zstd => Stream::Zstd(ZstdStream::new(level)?),
            Coding::Br => Stream::Br(BrotliStream::new(level)),
            Coding::Dcz => Stream::Dcz(DczStream::new(level)?),
        }))
    }

    /// Compresses `input` into `out`, pushing as far as `push` says.
    pub fn write(&mut self, input: &[u8], push: Push, out: &mut Vec<u8>) -> Result<(), StreamError> {
        match &mut self.0 {
            Stream::Deflate(stream) => stream.write(input, push, out),
            Stream::Zstd(stream) => stream.write(input, push, out),
            Stream::Br(stream) => stream.write(input, push, out),
            Stream::Dcz(stream) => stream.write(input, push, out),
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use super::deflate::{PoolKey, POOL, POOL_PER_KIND};
    use std::io::Read;

    pub(crate) fn gunzip(data: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(data).read_to_end(&mut out).expect("valid gzip");
        out
    }

    fn inflate_zlib(data: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        flate2::read::ZlibDecoder::new(data).read_to_end(&mut out).expect("valid zlib");
        out
    }

    /// The levels `coding` has.
    fn levels(coding: Coding) -> std::ops::RangeInclusive<u32> {
        match coding {
            Coding::Gzip | Coding::Deflate => 1..=12,
            Coding::Zstd => super::zstd::LEVELS,
            Coding::Br => super::brotli::LEVELS,
            Coding::Dcz => 1..=3,
        }
    }

    pub(crate) fn decode(coding: Coding, data: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        match coding {
            Coding::Gzip => return gunzip(data),
            Coding::Deflate => return inflate_zlib(data),
            Coding::Zstd => ::zstd::stream::read::Decoder::new(data).unwrap().read_to_end(&mut out).expect("valid zstd"),
            Coding::Br => ::brotli::Decompressor::new(data, 4096).read_to_end(&mut out).expect("valid brotli"),
            Coding::Dcz => {
                assert_eq!((&data[..8], &data[8..40]), (&dcz::MAGIC[..], &crate::dictionary::hash()[..]));
                let dictionary = crate::dictionary::DICTIONARY;
                ::zstd::stream::read::Decoder::with_dictionary(&data[40..], dictionary).unwrap().read_to_end(&mut out).expect("valid dcz")
            }
        };
        out
    }

    #[test]
    fn every_coding_round_trips_whole_at_every_level_and_never_grows() {
        let input = sample(20_000);
        let noise = noise(4096);
        for coding in Coding::ALL {
            for level in levels(coding) {
                let compressed = compress_whole(coding, level, &input).unwrap();
                assert!(compressed.len() < input.len() / 4, "{coding:?} {level}");
                assert_eq!(decode(coding, &compressed), input, "{coding:?} {level}");
                assert_eq!(compress_whole(coding, level, &noise), None, "{coding:?} {level}");
            }
            assert_eq!(compress_whole(coding, auto_level(coding, 0), b""), None);
            assert_eq!(compress_whole(coding, auto_level(coding, 1), b"a"), None);
        }
        // a zstd frame says its size, so a decoder can size its buffer at once
        let frame = compress_whole(Coding::Zstd, 3, &input).unwrap();
        assert_eq!(::zstd::zstd_safe::get_frame_content_size(&frame).ok(), Some(Some(input.len() as u64)));
    }

    #[test]
    fn every_stream_decodes_up_to_each_flush() {
        let input = sample(300_000);
        for coding in [Coding::Zstd, Coding::Br, Coding::Dcz] {
            let mut enc = StreamEncoder::new(coding, stream_level(coding, 1)).unwrap();
            let mut out = Vec::new();
            enc.write(&input[..100_000], Push::Hold, &mut out).unwrap();
            enc.write(&input[100_000..150_000], Push::Sync, &mut out).unwrap();
            assert_eq!(decode_prefix(coding, &out), &input[..150_000], "{coding:?}");
            enc.write(&input[150_000..], Push::Finish, &mut out).unwrap();
            assert_eq!(decode(coding, &out), input, "{coding:?}");
            assert!(enc.write(b"more", Push::Finish, &mut out).is_err(), "{coding:?}: a finished stream takes no more");
        }
    }

    /// What a truncated stream decodes to, up to where it stops.
    fn decode_prefix(coding: Coding, data: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut buf = [0; 8192];
        let mut read = |reader: &mut dyn Read| loop {
            match reader.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => out.extend_from_slice(&buf[..n]),
            }
        };
        match coding {
            Coding::Zstd => read(&mut ::zstd::stream::read::Decoder::new(data).unwrap()),
            Coding::Dcz => {
                read(&mut ::zstd::stream::read::Decoder::with_dictionary(&data[40..], crate::dictionary::DICTIONARY).unwrap())
            }
            Coding::Br => read(&mut ::brotli::Decompressor::new(data, 4096)),
            _ => unreachable!(),
        }
        out
    }

    fn noise(n: usize) -> Vec<u8> {
        let mut x: u64 = 0x9e3779b97f4a7c15;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    fn sample(n: usize) -> Vec<u8> {
        (0..n).map(|i| b"{\"result\":\"0x1234abcd\"},"[i % 24]).collect()
    }

    #[test]
    fn whole_bodies_round_trip_at_every_level() {
        let input = sample(50_000);
        for level in 1..=12 {
            let gz = compress_whole(Coding::Gzip, level, &input).unwrap();
            assert!(gz.len() < input.len());
            assert_eq!(gunzip(&gz), input);
            let z = compress_whole(Coding::Deflate, level, &input).unwrap();
            assert_eq!(inflate_zlib(&z), input);
        }
    }

    #[test]
    fn incompressible_bodies_are_refused() {
        assert_eq!(compress_whole(Coding::Gzip, 6, &noise(4096)), None);
        assert_eq!(compress_whole(Coding::Gzip, 6, b""), None);
        assert_eq!(compress_whole(Coding::Gzip, 6, b"a"), None);
    }

    #[test]
    fn stream_sync_flush_makes_everything_so_far_decodable() {
        let input = sample(100_000);
        let mut enc = StreamEncoder::new(Coding::Gzip, 1).unwrap();
        let mut out = Vec::new();
        enc.write(&input[..30_000], Push::Hold, &mut out).unwrap();
        enc.write(&input[30_000..60_000], Push::Sync, &mut out).unwrap();
        // Everything written so far inflates to exactly the first 60 000 bytes.
        let mut partial = Vec::new();
        let mut dec = flate2::Decompress::new(false);
        let mut body = vec![0; 200_000];
        dec.decompress(&out[10..], &mut body, flate2::FlushDecompress::Sync).unwrap();
        partial.extend_from_slice(&body[..dec.total_out() as usize]);
        assert_eq!(partial, &input[..60_000]);
        enc.write(&input[60_000..], Push::Finish, &mut out).unwrap();
        assert_eq!(gunzip(&out), input);
    }

    #[test]
    fn pooled_compressors_start_clean() {
        for _ in 0..10 {
            for coding in [Coding::Gzip, Coding::Deflate] {
                let mut enc = StreamEncoder::new(coding, 3).unwrap();
                let mut out = Vec::new();
                enc.write(b"hello hello hello", Push::Finish, &mut out).unwrap();
                assert_eq!(decode(coding, &out), b"hello hello hello");
            }
            // Abandoned mid-stream, with data held: the next stream must still be valid.
            let mut enc = StreamEncoder::new(Coding::Gzip, 1).unwrap();
            enc.write(&sample(100_000), Push::Hold, &mut Vec::new()).unwrap();
            drop(enc);
            let mut enc = StreamEncoder::new(Coding::Gzip, 1).unwrap();
            let mut out = Vec::new();
            enc.write(&sample(50_000), Push::Finish, &mut out).unwrap();
            assert_eq!(gunzip(&out), sample(50_000));
        }
    }

    #[test]
    fn the_pool_keeps_at_most_its_bound_per_kind() {
        let kinds = |key: PoolKey| POOL.with(|pool| pool.borrow().iter().filter(|(k, _)| *k == key).count());
        let key = (false, 5);
        // More streams at once than the pool keeps: each finished one returns, up to the bound.
        let mut encoders: Vec<_> = (0..2 * POOL_PER_KIND).map(|_| StreamEncoder::new(Coding::Gzip, 5).unwrap()).collect();
        for enc in &mut encoders {
            enc.write(b"{}", Push::Finish, &mut Vec::new()).unwrap();
        }
        assert_eq!(kinds(key), POOL_PER_KIND);
        // A new stream takes one back; other kinds are kept apart.
        let mut taken = StreamEncoder::new(Coding::Gzip, 5).unwrap();
        assert_eq!(kinds(key), POOL_PER_KIND - 1);
        assert_eq!(kinds((true, 5)), 0);
        taken.write(b"{}", Push::Finish, &mut Vec::new()).unwrap();
        assert_eq!(kinds(key), POOL_PER_KIND);
    }
}
