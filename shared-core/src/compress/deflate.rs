//! gzip and zlib (HTTP's deflate): libdeflate for whole bodies, zlib (flate2 over zlib-rs) for
//! streams. Both are reused: one libdeflate compressor per level per thread, and a small bounded
//! pool of stream compressors per thread, so memory stays flat however many exchanges pass through.

use std::cell::RefCell;

use flate2::{Compress, Compression, FlushCompress, Status};
use libdeflater::{CompressionLvl, Compressor};

use super::{Push, StreamError};
use crate::negotiate::Coding;

/// Compresses `input` whole into `out`, as gzip, or as zlib when `zlib`; `None` when it does not
/// fit.
pub(super) fn compress_into(zlib: bool, level: u32, input: &[u8], out: &mut [u8]) -> Option<usize> {
    with_compressor(level, |compressor| match zlib {
        false => compressor.gzip_compress(input, out),
        true => compressor.zlib_compress(input, out),
    })
}

/// Compresses `input` whole into `out` as a raw DEFLATE stream; `None` when it does not fit.
pub(super) fn raw_into(level: u32, input: &[u8], out: &mut [u8]) -> Option<usize> {
    with_compressor(level, |compressor| compressor.deflate_compress(input, out))
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

/// The most idle stream compressors kept per thread for each (coding, level).
pub(super) const POOL_PER_KIND: usize = 4;

pub(super) type PoolKey = (bool, u32);

thread_local! {
    pub(super) static POOL: RefCell<Vec<(PoolKey, Compress)>> = const { RefCell::new(Vec::new()) };
}

/// Incremental gzip or zlib over one response body.
pub(super) struct DeflateStream {
    coding: Coding,
    level: u32,
    deflate: Option<Compress>,
    crc: crc32fast::Hasher,
    size: u32,
    started: bool,
}

const GZIP_HEADER: [u8; 10] = [0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff];

impl DeflateStream {
    /// `coding` is gzip or deflate.
    pub fn new(coding: Coding, level: u32) -> Self {
        let key = (coding == Coding::Deflate, level);
        let pooled = POOL.with(|pool| {
            let mut pool = pool.borrow_mut();
            let at = pool.iter().position(|(k, _)| *k == key)?;
            Some(pool.swap_remove(at).1)
        });
        let deflate = pooled.unwrap_or_else(|| Compress::new(Compression::new(level), key.0));
        DeflateStream { coding, level, deflate: Some(deflate), crc: crc32fast::Hasher::new(), size: 0, started: false }
    }

    /// Compresses `input` into `out`, pushing as far as `push` says.
    pub fn write(&mut self, input: &[u8], push: Push, out: &mut Vec<u8>) -> Result<(), StreamError> {
        let deflate = self.deflate.as_mut().ok_or_else(StreamError::finished)?;
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
