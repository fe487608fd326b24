//! rpcedge's compression dictionary for `dcz` (RFC 9842, Compression Dictionary Transport): what
//! it is, its hash, and whether a request's `Available-Dictionary` names it.
//!
//! The dictionary is zstd's, trained on the corpus's JSON-RPC answers (`tools/dictionary.py`
//! regenerates it; docs/compression.md, "Dictionary", says why 32 KiB). It is built in, so that
//! every host compresses against the same bytes; the proxy serves the same file at a path the
//! operator sets, with `Use-As-Dictionary` naming the RPC paths, and a client that has it says so
//! with its SHA-256.

use std::sync::OnceLock;

use base64::alphabet::STANDARD;
use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
use base64::engine::DecodePaddingMode;
use base64::Engine;
use sha2::{Digest, Sha256};

/// The dictionary's bytes, as the proxy serves them.
pub const DICTIONARY: &[u8] = include_bytes!("../dictionary/jsonrpc.dict");

/// The dictionary's SHA-256: what `Available-Dictionary` carries, and what a dcz body starts with.
pub fn hash() -> &'static [u8; 32] {
    static HASH: OnceLock<[u8; 32]> = OnceLock::new();
    HASH.get_or_init(|| Sha256::digest(DICTIONARY).into())
}

/// RFC 8941's byte sequences are base64 with padding, which a parser should not insist on.
const SF_BINARY: GeneralPurpose =
    GeneralPurpose::new(&STANDARD, GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent));

/// Whether an `Available-Dictionary` field value (a structured-field byte sequence, `:base64:`,
/// maybe with parameters) names this dictionary. Anything else, well-formed or not, does not.
pub fn is_named_by(value: &[u8]) -> bool {
    let value = value.trim_ascii();
    let Some(rest) = value.strip_prefix(b":") else { return false };
    let Some(end) = rest.iter().position(|&b| b == b':') else { return false };
    let (encoded, after) = (&rest[..end], &rest[end + 1..]);
    // a SHA-256 is 43 or 44 characters of base64; parameters may follow the item
    if !(43..=44).contains(&encoded.len()) || !(after.is_empty() || after.starts_with(b";")) {
        return false;
    }
    let mut decoded = [0; 33];
    matches!(SF_BINARY.decode_slice(encoded, &mut decoded), Ok(32) if decoded[..32] == hash()[..])
}

/// The `Available-Dictionary` value of a client that has this dictionary.
pub fn available_dictionary() -> String {
    format!(":{}:", SF_BINARY.encode(hash()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hash_is_the_sha256_of_the_bytes_served() {
        assert_eq!(DICTIONARY.len(), 32 * 1024);
        // a zstd dictionary, not raw content: its magic, then its id and entropy tables
        assert_eq!(DICTIONARY[..4], [0x37, 0xa4, 0x30, 0xec]);
        assert_eq!(hash()[..], Sha256::digest(DICTIONARY)[..]);
    }

    /// `value` with its first base64 character changed to another.
    fn flipped(value: &str) -> String {
        let first = if value.as_bytes()[1] == b'A' { "B" } else { "A" };
        format!(":{first}{}", &value[2..])
    }

    #[test]
    fn only_this_dictionarys_hash_names_it() {
        let ours = available_dictionary();
        assert!(ours.ends_with("=:"), "canonical: padded");
        assert!(is_named_by(ours.as_bytes()));
        assert!(is_named_by(format!("  {ours} ").as_bytes()), "whitespace around the field");
        assert!(is_named_by(ours.replace("=:", ":").as_bytes()), "without its padding");
        assert!(is_named_by(format!("{ours};x=1").as_bytes()), "with parameters");
        let other = format!(":{}:", SF_BINARY.encode([7u8; 32]));
        for value in [
            other.as_str(),
            "",
            ":",
            "::",
            &ours[1..],
            &ours[..ours.len() - 1],
            &format!("{ours}x"),
            &format!("{ours}, {ours}"),
            &flipped(&ours),
            &format!(":{}:", SF_BINARY.encode(&hash()[..31])),
            &format!(":{}:", SF_BINARY.encode([hash().as_slice(), b"x"].concat())),
        ] {
            assert!(!is_named_by(value.as_bytes()), "{value:?}");
        }
    }
}
