//! A body decoded from its Content-Encoding, as a client decodes it: for the integration tests
//! and the fuzz targets (`#[path]`), which check what a client gets.

use std::io::Read;

use rpcedge_core::dictionary::DICTIONARY;
use rpcedge_core::Coding;
use sha2::{Digest, Sha256};

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
        Some(Coding::Dcz) => return undcz(body),
    }
    out
}

/// A dcz body (RFC 9842 §4) decoded as a browser does: its header names the dictionary by its
/// SHA-256, and the frame after it decodes against that dictionary.
pub fn undcz(body: &[u8]) -> Vec<u8> {
    assert!(body.len() > 40, "a dcz body is at least its header and a frame");
    assert_eq!(body[..8], [0x5e, 0x2a, 0x4d, 0x18, 0x20, 0x00, 0x00, 0x00], "dcz magic");
    assert_eq!(body[8..40], Sha256::digest(DICTIONARY)[..], "the dictionary's hash");
    let mut out = Vec::new();
    zstd::stream::read::Decoder::with_dictionary(&body[40..], DICTIONARY)
        .unwrap()
        .read_to_end(&mut out)
        .expect("valid zstd against the dictionary");
    out
}
