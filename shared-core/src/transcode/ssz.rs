//! The SSZ pieces the transcoders write and read: 0x-hex strings to bytes and back (SIMD, by
//! faster-hex), and lists of byte lists with their offset tables.

use super::hex::decode_hex;
use super::json::Scanner;
use super::TranscodeError;

/// Bytes of an SSZ offset.
pub(super) const OFFSET: usize = 4;

/// The size from which the elements' bytes go on in a new segment: a list handed out piece by
/// piece frees each segment once it is out.
const SEGMENT: usize = 1 << 20;

/// A `List[ByteList[max_bytes], max_items]` being written: the elements' bytes, in segments, and
/// where each begins in them.
#[derive(Default)]
pub struct ByteLists {
    starts: Vec<u32>,
    /// The full segments, and their length together.
    sealed: Vec<Vec<u8>>,
    sealed_len: usize,
    /// The segment being written.
    data: Vec<u8>,
}

impl ByteLists {
    /// Decodes one JSON hex string from `json` as the next element.
    pub fn push_hex(&mut self, json: &mut Scanner, max_items: usize, max_bytes: usize) -> Result<(), TranscodeError> {
        self.push_with(max_items, max_bytes, |data| decode_hex_into(json, data))
    }

    /// Appends the next element, which `write` appends to the list's bytes.
    pub fn push_with(
        &mut self,
        max_items: usize,
        max_bytes: usize,
        write: impl FnOnce(&mut Vec<u8>) -> Result<(), TranscodeError>,
    ) -> Result<(), TranscodeError> {
        if self.starts.len() == max_items {
            return Err(TranscodeError::Limit("more elements than the list's limit"));
        }
        // (sealed only before an element, so that a mark is never inside a sealed segment)
        if self.data.len() >= SEGMENT {
            self.sealed_len += self.data.len();
            self.sealed.push(std::mem::take(&mut self.data));
        }
        let start = self.data.len();
        let at = self.sealed_len + start;
        self.starts.push(u32::try_from(at).map_err(|_| TranscodeError::Limit("a list over 4 GiB"))?);
        write(&mut self.data)?;
        if self.data.len() - start > max_bytes {
            return Err(TranscodeError::Limit("an element longer than its limit"));
        }
        Ok(())
    }

    /// The list's serialized length.
    pub fn len(&self) -> usize {
        self.starts.len() * OFFSET + self.sealed_len + self.data.len()
    }

    /// Where the list ends now, to go back to with [`ByteLists::truncate`].
    pub fn mark(&self) -> (usize, usize) {
        (self.starts.len(), self.sealed_len + self.data.len())
    }

    /// Drops the elements pushed since `mark`.
    pub fn truncate(&mut self, (items, bytes): (usize, usize)) {
        self.starts.truncate(items);
        self.data.truncate(bytes - self.sealed_len);
    }

    /// Appends the serialized list to `out`.
    pub fn write(&self, out: &mut Vec<u8>) -> Result<(), TranscodeError> {
        self.write_offsets(out)?;
        for segment in &self.sealed {
            out.extend_from_slice(segment);
        }
        out.extend_from_slice(&self.data);
        Ok(())
    }

    /// Appends the list's offset table to `out`: the serialization is this, then the elements.
    pub fn write_offsets(&self, out: &mut Vec<u8>) -> Result<(), TranscodeError> {
        let table = (self.starts.len() * OFFSET) as u64;
        out.reserve(self.starts.len() * OFFSET);
        for start in &self.starts {
            out.extend_from_slice(&offset(table + u64::from(*start))?.to_le_bytes());
        }
        Ok(())
    }

    /// The elements' bytes, which follow the offset table, segment by segment.
    pub fn into_segments(mut self) -> Vec<Vec<u8>> {
        self.sealed.push(self.data);
        self.sealed
    }
}

/// An SSZ offset, refused past the 4 GiB that 4 bytes can address.
pub fn offset(value: u64) -> Result<u32, TranscodeError> {
    u32::try_from(value).map_err(|_| TranscodeError::Limit("an SSZ object over 4 GiB"))
}

/// Decodes a JSON string of 0x-prefixed hex (either case) onto `out`.
pub fn decode_hex_into(json: &mut Scanner, out: &mut Vec<u8>) -> Result<(), TranscodeError> {
    // the usual case: the digits decoded as the string's end is looked for, in one pass
    if json.hex_string(out) {
        return Ok(());
    }
    let text = json.string()?;
    let digits = text.strip_prefix(b"0x").ok_or(TranscodeError::Hex)?;
    if digits.len() % 2 != 0 {
        return Err(TranscodeError::Hex);
    }
    let start = out.len();
    out.resize(start + digits.len() / 2, 0);
    decode_hex(digits, &mut out[start..])
}

/// Appends `bytes` as a JSON string of 0x-prefixed lower-case hex.
pub fn write_hex(bytes: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(b"\"0x");
    let start = out.len();
    out.resize(start + bytes.len() * 2, 0);
    faster_hex::hex_encode(bytes, &mut out[start..]).expect("the room is exact");
    out.push(b'"');
}

/// The elements of a serialized `List[ByteList[max_bytes], max_items]`, checked.
pub fn read_byte_lists(ssz: &[u8], max_items: usize, max_bytes: usize) -> Result<Vec<&[u8]>, TranscodeError> {
    if ssz.is_empty() {
        return Ok(Vec::new());
    }
    let first = read_offset(ssz, 0)?;
    if first % OFFSET != 0 || first == 0 || first > ssz.len() {
        return Err(TranscodeError::Ssz("a list's first offset"));
    }
    let count = first / OFFSET;
    if count > max_items {
        return Err(TranscodeError::Limit("more elements than the list's limit"));
    }
    let mut items = Vec::with_capacity(count);
    for i in 0..count {
        let start = read_offset(ssz, i * OFFSET)?;
        let end = if i + 1 < count { read_offset(ssz, (i + 1) * OFFSET)? } else { ssz.len() };
        if start > end || end > ssz.len() || start < first {
            return Err(TranscodeError::Ssz("a list's offsets"));
        }
        if end - start > max_bytes {
            return Err(TranscodeError::Limit("an element longer than its limit"));
        }
        items.push(&ssz[start..end]);
    }
    Ok(items)
}

/// The offset at `at` in `ssz`.
pub fn read_offset(ssz: &[u8], at: usize) -> Result<usize, TranscodeError> {
    let bytes = ssz.get(at..at + OFFSET).ok_or(TranscodeError::Ssz("shorter than its offsets"))?;
    Ok(u32::from_le_bytes(bytes.try_into().expect("4 bytes")) as usize)
}

/// Writes `items` as a JSON array of hex strings.
pub fn write_hex_array(items: &[&[u8]], out: &mut Vec<u8>) {
    out.push(b'[');
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write_hex(item, out);
    }
    out.push(b']');
}
