//! Execution block headers given as JSON objects (geth's `debug_executionWitness`, and erigon's
//! before it took up RLP) as the RLP the witness container holds: the fields of every fork from
//! Frontier to Amsterdam, in the order of the yellow paper and the EIPs that appended to it. A
//! header that carries its `hash` must hash to it: the keccak-256 of the RLP is checked, so a field
//! this table does not know (or a node's mistake) fails the transcode instead of sending a header
//! the prover would reject.
//!
//! A hand-written encoder rather than alloy-rlp: one list of byte strings is all RLP a header
//! needs, and the check against the hash makes any slip in it visible.

use sha3::{Digest, Keccak256};

use super::json::Scanner;
use super::TranscodeError;

/// How a field's JSON value becomes its RLP string.
#[derive(Clone, Copy)]
enum Kind {
    /// Exactly this many bytes of hex.
    Fixed(usize),
    /// Any number of bytes of hex (`extraData`).
    Data,
    /// A JSON-RPC quantity (`0x0`, `0x1f`): big-endian without leading zeros, at most 32 bytes.
    Quantity,
}

/// The header's fields in RLP order with their JSON names: the first `REQUIRED` in every header,
/// the rest appended fork by fork (London's base fee, Shanghai's withdrawals root, Cancun's blob
/// gas and beacon root, Prague's requests hash, Amsterdam's EIP-7928 access list hash and
/// EIP-7843 slot number), present up to a fork and absent (or `null`) after it.
const FIELDS: [(&str, Kind); 23] = [
    ("parentHash", Kind::Fixed(32)),
    ("sha3Uncles", Kind::Fixed(32)),
    ("miner", Kind::Fixed(20)),
    ("stateRoot", Kind::Fixed(32)),
    ("transactionsRoot", Kind::Fixed(32)),
    ("receiptsRoot", Kind::Fixed(32)),
    ("logsBloom", Kind::Fixed(256)),
    ("difficulty", Kind::Quantity),
    ("number", Kind::Quantity),
    ("gasLimit", Kind::Quantity),
    ("gasUsed", Kind::Quantity),
    ("timestamp", Kind::Quantity),
    ("extraData", Kind::Data),
    ("mixHash", Kind::Fixed(32)),
    ("nonce", Kind::Fixed(8)),
    ("baseFeePerGas", Kind::Quantity),
    ("withdrawalsRoot", Kind::Fixed(32)),
    ("blobGasUsed", Kind::Quantity),
    ("excessBlobGas", Kind::Quantity),
    ("parentBeaconBlockRoot", Kind::Fixed(32)),
    ("requestsHash", Kind::Fixed(32)),
    ("blockAccessListHash", Kind::Fixed(32)),
    ("slotNumber", Kind::Quantity),
];

/// The fields every header has (Frontier's).
const REQUIRED: usize = 15;

/// Reads the header object at `json` and appends its RLP to `out`.
pub fn to_rlp(json: &mut Scanner, out: &mut Vec<u8>) -> Result<(), TranscodeError> {
    let mut values: [Option<Vec<u8>>; FIELDS.len()] = Default::default();
    let mut hash = None;
    json.object(|json, key| {
        if key == b"hash" {
            let text = json.string()?;
            return match hash.replace(fixed(&text, 32)?) {
                None => Ok(()),
                Some(_) => Err(json.error("a header field named twice")),
            };
        }
        let Some(index) = FIELDS.iter().position(|(name, _)| name.as_bytes() == key) else {
            // a member the header's RLP has no place for: only `null` is harmless
            return match json.value()? {
                b"null" => Ok(()),
                _ => Err(TranscodeError::Header("a field no fork's header has")),
            };
        };
        if json.peek() == Some(b'n') {
            return match json.value()? {
                b"null" => Ok(()),
                _ => Err(json.error("a string or null")),
            };
        }
        let text = json.string()?;
        let value = match FIELDS[index].1 {
            Kind::Fixed(len) => fixed(&text, len)?,
            Kind::Data => fixed(&text, hex_digits(&text)?.len() / 2)?,
            Kind::Quantity => quantity(&text)?,
        };
        match values[index].replace(value) {
            None => Ok(()),
            Some(_) => Err(json.error("a header field named twice")),
        }
    })?;
    // the fields present are those of one fork: all of Frontier's, then a run of the later ones
    let present = values.iter().take_while(|value| value.is_some()).count();
    if present < REQUIRED {
        return Err(TranscodeError::Header("a field every header has is missing"));
    }
    if values[present..].iter().any(Option::is_some) {
        return Err(TranscodeError::Header("a field of a later fork without those before it"));
    }
    let start = out.len();
    let payload: usize = values[..present].iter().flatten().map(|value| string_len(value)).sum();
    write_length(payload, 0xc0, out);
    for value in values[..present].iter().flatten() {
        write_string(value, out);
    }
    if hash.is_some_and(|hash| Keccak256::digest(&out[start..])[..] != hash[..]) {
        return Err(TranscodeError::Header("its RLP does not hash to its hash"));
    }
    Ok(())
}

/// The digits of a 0x-prefixed hex string.
fn hex_digits(text: &[u8]) -> Result<&[u8], TranscodeError> {
    text.strip_prefix(b"0x").ok_or(TranscodeError::Hex)
}

/// Exactly `len` bytes of hex.
fn fixed(text: &[u8], len: usize) -> Result<Vec<u8>, TranscodeError> {
    let digits = hex_digits(text)?;
    if digits.len() != len * 2 {
        return Err(TranscodeError::Header("a field of the wrong length"));
    }
    let mut bytes = vec![0; len];
    super::hex::decode_hex(digits, &mut bytes)?;
    Ok(bytes)
}

/// A quantity's big-endian bytes, without leading zeros (zero is no bytes).
fn quantity(text: &[u8]) -> Result<Vec<u8>, TranscodeError> {
    let digits = hex_digits(text)?;
    if digits.is_empty() {
        // "0x" is no quantity (zero is "0x0")
        return Err(TranscodeError::Hex);
    }
    let digits = &digits[digits.iter().position(|&d| d != b'0').unwrap_or(digits.len())..];
    if digits.len() > 64 {
        return Err(TranscodeError::Header("a quantity over 256 bits"));
    }
    // an odd count of digits: the first byte is one digit
    let mut padded = Vec::with_capacity(digits.len() + 1);
    if digits.len() % 2 == 1 {
        padded.push(b'0');
    }
    padded.extend_from_slice(digits);
    let mut bytes = vec![0; padded.len() / 2];
    super::hex::decode_hex(&padded, &mut bytes)?;
    Ok(bytes)
}

/// The length of `bytes` as an RLP string.
fn string_len(bytes: &[u8]) -> usize {
    match bytes {
        [byte] if *byte < 0x80 => 1,
        _ => length_len(bytes.len()) + bytes.len(),
    }
}

/// The length of the prefix that gives a length of `len`.
fn length_len(len: usize) -> usize {
    if len <= 55 {
        1
    } else {
        1 + be_len(len)
    }
}

/// Bytes of `len` in big-endian without leading zeros.
fn be_len(len: usize) -> usize {
    (usize::BITS - len.leading_zeros()).div_ceil(8) as usize
}

/// An RLP string or list prefix (`base` 0x80 for strings, 0xc0 for lists) for `len` bytes.
fn write_length(len: usize, base: u8, out: &mut Vec<u8>) {
    if len <= 55 {
        out.push(base + len as u8);
    } else {
        let n = be_len(len);
        out.push(base + 55 + n as u8);
        out.extend_from_slice(&len.to_be_bytes()[usize::BITS as usize / 8 - n..]);
    }
}

fn write_string(bytes: &[u8], out: &mut Vec<u8>) {
    match bytes {
        [byte] if *byte < 0x80 => out.push(*byte),
        _ => {
            write_length(bytes.len(), 0x80, out);
            out.extend_from_slice(bytes);
        }
    }
}
