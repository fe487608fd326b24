//! Raw-bytes JSON-RPC results (`debug_getRawBlock`, `debug_getRawReceipts`, ...): a 0x-hex
//! string is its bytes (a `ByteList`), a list of them a `List[ByteList]`. The limits are the
//! consensus specs' for an execution payload's transactions, which bound every such list.

use super::json::Scanner;
use super::ssz::{decode_hex_into, read_byte_lists, write_hex, write_hex_array, ByteLists};
use super::TranscodeError;

/// `MAX_TRANSACTIONS_PER_PAYLOAD`.
const MAX_ITEMS: usize = 1 << 20;
/// `MAX_BYTES_PER_TRANSACTION`.
const MAX_BYTES: usize = 1 << 30;

pub fn bytes_to_ssz(json: &mut Scanner, out: &mut Vec<u8>) -> Result<(), TranscodeError> {
    let start = out.len();
    decode_hex_into(json, out)?;
    if out.len() - start > MAX_BYTES {
        return Err(TranscodeError::Limit("longer than its limit"));
    }
    Ok(())
}

pub fn list_to_ssz(json: &mut Scanner, out: &mut Vec<u8>) -> Result<(), TranscodeError> {
    let mut list = ByteLists::default();
    json.array(|json| list.push_hex(json, MAX_ITEMS, MAX_BYTES))?;
    out.reserve(list.len());
    list.write(out)
}

pub fn bytes_to_json(ssz: &[u8], out: &mut Vec<u8>) -> Result<(), TranscodeError> {
    if ssz.len() > MAX_BYTES {
        return Err(TranscodeError::Limit("longer than its limit"));
    }
    write_hex(ssz, out);
    Ok(())
}

pub fn list_to_json(ssz: &[u8], out: &mut Vec<u8>) -> Result<(), TranscodeError> {
    write_hex_array(&read_byte_lists(ssz, MAX_ITEMS, MAX_BYTES)?, out);
    Ok(())
}
