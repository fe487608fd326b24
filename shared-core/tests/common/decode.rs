//! A body decoded from its Content-Encoding, as a client decodes it: for the integration tests
//! and the fuzz targets (`#[path]`), which check what a client gets.

use std::io::Read;

use rpcedge_core::Coding;

/// `body` decoded from `coding` (`None`: as it is); panics on a body that does not decode.
pub fn decode(coding: Option<Coding>, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    match coding {
        None => out.extend_from_slice(body),
        Some(Coding::Gzip) => {
            flate2::read::GzDecoder::new(body).read_to_end(&mut out).expect("valid gzip");
        }
        Some(Coding::Deflate) => {
            flate2::read::ZlibDecoder::new(body).read_to_end(&mut out).expect("valid zlib");
        }
        Some(Coding::Zstd) => {
            zstd::stream::read::Decoder::new(body).unwrap().read_to_end(&mut out).expect("valid zstd");
        }
        Some(Coding::Br) => {
            brotli::Decompressor::new(body, 4096).read_to_end(&mut out).expect("valid brotli");
        }
    }
    out
}
