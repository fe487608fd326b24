//! The two compressors: libdeflate for whole bodies, zlib (flate2 over zlib-rs) for streams.
//!
//! Both are reused: one libdeflate compressor per level per thread, and a small bounded pool of
//! stream compressors per thread, so memory stays flat however many exchanges pass through.

use std::cell::RefCell;
use std::fmt;

use flate2::{Compress, Compression, FlushCompress, Status};
use libdeflater::{CompressionLvl, Compressor};

use crate::negotiate::Coding;

pub(crate) mod blocks;

/// The libdeflate level of `level auto` for a body of `length` bytes, chosen by measurement on
/// the corpus (`benches/level.rs`; BENCHMARKS.md has the table). Level 5, libdeflate's first
/// with lazy matching, saves the most bytes per extra microsecond over level 1 on bodies up to
/// a few hundred KiB (7-14 % fewer bytes there, for 1.2-2x the time of level 1; levels 2-4 save
/// 1-4 % for nearly as much time, 6 and up little more for much more). Above 256 KiB the time is
/// what a proxy runs out of first: level 1, several milliseconds per body less.
pub fn auto_level(length: usize) -> u32 {
    if length < 256 * 1024 {
        5
    } else {
        1
    }
}

/// Compresses `input` whole. Returns `None` when the result would not be smaller than the input,
/// so the caller sends the original.
pub fn compress_whole(coding: Coding, level: u32, input: &[u8]) -> Option<Vec<u8>> {
    smaller(input, |out| compress_into(coding, level, input, out))
}

/// Compresses `input` whole into `out`; `None` when it does not fit.
pub fn compress_into(coding: Coding, level: u32, input: &[u8], out: &mut [u8]) -> Option<usize> {
    with_compressor(level, |compressor| match coding {
        Coding::Gzip => compressor.gzip_compress(input, out),
        Coding::Deflate => compressor.zlib_compress(input, out),
    })
}

/// Compresses `input` as a raw DEFLATE stream (no header, no trailer); `None` when that would
/// not be smaller.
pub fn deflate_raw(level: u32, input: &[u8]) -> Option<Vec<u8>> {
    smaller(input, |out| with_compressor(level, |compressor| compressor.deflate_compress(input, out)))
}

/// Bodies up to this size are compressed into a buffer kept per thread and copied out at their
/// compressed length: a fresh buffer of the input's size is zero-filled first, which for bodies
/// below the allocator's mmap threshold costs more than copying the compressed bytes.
const SCRATCH_MAX: usize = 128 * 1024;

/// Runs `compress` into a buffer one byte short of the input, which makes libdeflate itself
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

/// Runs `f` on this thread's libdeflate compressor for `level` (1 to 12).
fn with_compressor<E>(level: u32, f: impl FnOnce(&mut Compressor) -> Result<usize, E>) -> Option<usize> {
    thread_local! {
        static WHOLE: RefCell<[Option<Compressor>; 12]> = const { RefCell::new([const { None }; 12]) };
    }
    WHOLE.with(|cell| {
        let mut compressors = cell.borrow_mut();
        let index = level.clamp(1, 12) as usize - 1;
        let compressor = compressors[index].get_or_insert_with(|| {
            Compressor::new(CompressionLvl::new(index as i32 + 1).expect("1..=12 is a libdeflate level"))
        });
        f(compressor).ok()
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

/// How far to push data through the stream compressor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Push {
    /// Let the compressor hold data for a better ratio.
    Hold,
    /// Emit everything fed so far on a byte boundary (zlib's sync flush).
    Sync,
    /// Emit everything and close the stream, trailer included.
    Finish,
}

/// The most idle stream compressors kept per thread for each (coding, level).
const POOL_PER_KIND: usize = 4;

type PoolKey = (bool, u32);

thread_local! {
    static POOL: RefCell<Vec<(PoolKey, Compress)>> = const { RefCell::new(Vec::new()) };
}

/// Incremental gzip or zlib over one response body.
pub struct StreamEncoder {
    coding: Coding,
    level: u32,
    deflate: Option<Compress>,
    crc: crc32fast::Hasher,
    size: u32,
    started: bool,
}

const GZIP_HEADER: [u8; 10] = [0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff];

impl StreamEncoder {
    pub fn new(coding: Coding, level: u32) -> Self {
        let key = (coding == Coding::Deflate, level);
        let pooled = POOL.with(|pool| {
            let mut pool = pool.borrow_mut();
            let at = pool.iter().position(|(k, _)| *k == key)?;
            Some(pool.swap_remove(at).1)
        });
        let deflate = pooled.unwrap_or_else(|| Compress::new(Compression::new(level), key.0));
        StreamEncoder { coding, level, deflate: Some(deflate), crc: crc32fast::Hasher::new(), size: 0, started: false }
    }

    /// Compresses `input` into `out`, pushing as far as `push` says.
    pub fn write(&mut self, input: &[u8], push: Push, out: &mut Vec<u8>) -> Result<(), StreamError> {
        let deflate = self.deflate.as_mut().ok_or_else(|| StreamError("stream already finished".into()))?;
        if !self.started {
            self.started = true;
            if self.coding == Coding::Gzip {
                out.extend_from_slice(&GZIP_HEADER);
            }
        }
        if self.coding == Coding::Gzip {
            self.crc.update(input);
            self.size = self.size.wrapping_add(input.len() as u32);
        }
        let flush = match push {
            Push::Hold => FlushCompress::None,
            Push::Sync => FlushCompress::Sync,
            Push::Finish => FlushCompress::Finish,
        };
        let mut rest = input;
        loop {
            // Room for the input at worst-case expansion, plus flush markers.
            out.reserve(rest.len() + rest.len() / 1000 + 64);
            let before_in = deflate.total_in();
            let before_out = deflate.total_out();
            let status = deflate
                .compress_vec(rest, out, flush)
                .map_err(|e| StreamError(e.to_string()))?;
            rest = &rest[(deflate.total_in() - before_in) as usize..];
            let spare = out.capacity() - out.len();
            let done = match push {
                Push::Hold => rest.is_empty(),
                // A sync flush is complete once zlib stops short of filling the buffer.
                Push::Sync => rest.is_empty() && spare > 0,
                Push::Finish => status == Status::StreamEnd,
            };
            if done {
                break;
            }
            if deflate.total_in() == before_in && deflate.total_out() == before_out {
                return Err(StreamError(format!("no progress ({status:?})")));
            }
        }
        if push == Push::Finish {
            if self.coding == Coding::Gzip {
                out.extend_from_slice(&self.crc.clone().finalize().to_le_bytes());
                out.extend_from_slice(&self.size.to_le_bytes());
            }
            self.recycle();
        }
        Ok(())
    }

    /// Returns a finished stream's compressor to the pool. An abandoned one (client or upstream
    /// gone) is dropped instead: zlib-rs 0.6 does not fully reset a level-1 compressor stopped
    /// mid-stream, and the next stream it makes is corrupt.
    fn recycle(&mut self) {
        if let Some(mut deflate) = self.deflate.take() {
            deflate.reset();
            let key = (self.coding == Coding::Deflate, self.level);
            POOL.with(|pool| {
                let mut pool = pool.borrow_mut();
                if pool.iter().filter(|(k, _)| *k == key).count() < POOL_PER_KIND {
                    pool.push((key, deflate));
                }
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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
        let mut x: u64 = 0x9e3779b97f4a7c15;
        let noise: Vec<u8> = (0..4096)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        assert_eq!(compress_whole(Coding::Gzip, 6, &noise), None);
        assert_eq!(compress_whole(Coding::Gzip, 6, b""), None);
        assert_eq!(compress_whole(Coding::Gzip, 6, b"a"), None);
    }

    #[test]
    fn stream_sync_flush_makes_everything_so_far_decodable() {
        let input = sample(100_000);
        let mut enc = StreamEncoder::new(Coding::Gzip, 1);
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
                let mut enc = StreamEncoder::new(coding, 3);
                let mut out = Vec::new();
                enc.write(b"hello hello hello", Push::Finish, &mut out).unwrap();
                let plain = match coding {
                    Coding::Gzip => gunzip(&out),
                    Coding::Deflate => inflate_zlib(&out),
                };
                assert_eq!(plain, b"hello hello hello");
            }
            // Abandoned mid-stream, with data held: the next stream must still be valid.
            let mut enc = StreamEncoder::new(Coding::Gzip, 1);
            enc.write(&sample(100_000), Push::Hold, &mut Vec::new()).unwrap();
            drop(enc);
            let mut enc = StreamEncoder::new(Coding::Gzip, 1);
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
        let mut encoders: Vec<_> = (0..2 * POOL_PER_KIND).map(|_| StreamEncoder::new(Coding::Gzip, 5)).collect();
        for enc in &mut encoders {
            enc.write(b"{}", Push::Finish, &mut Vec::new()).unwrap();
        }
        assert_eq!(kinds(key), POOL_PER_KIND);
        // A new stream takes one back; other kinds are kept apart.
        let mut taken = StreamEncoder::new(Coding::Gzip, 5);
        assert_eq!(kinds(key), POOL_PER_KIND - 1);
        assert_eq!(kinds((true, 5)), 0);
        taken.write(b"{}", Push::Finish, &mut Vec::new()).unwrap();
        assert_eq!(kinds(key), POOL_PER_KIND);
    }
}
