//! Execution witnesses (`debug_executionWitness`) as SSZ.
//!
//! The JSON comes in today's list shape `{state, codes, keys, headers}` (lists of 0x-hex, RLP
//! headers; `keys` may be absent, as in execution-apis #847's canonical form), with the headers
//! as JSON objects instead (geth's form: RLP-encoded here, each checked against its hash), or
//! the older map shape `{state: {hash: node}, codes: {hash: code}, keys: {hash: key}}`,
//! whose map keys are the keccak-256 of their values: the values are kept, the hashes can be
//! computed again. JSON out is always the list shape.
//!
//! The limits are those of `SszExecutionWitness` in execution-specs'
//! `src/ethereum/forks/amsterdam/stateless_ssz.py` as of spencer-tb/execution-specs@fb195ce (the
//! `SszList` form: ethereum/execution-specs@3f042e0b makes `state` and `codes` progressive lists,
//! which serialize the same but have other roots and no item limits). EIP-8025's own copy
//! differs in its limits; this table is the one place to change them.

mod render;
mod stream;

use super::header;
use super::json::Scanner;
use super::ssz::{offset, read_byte_lists, read_offset, write_hex_array, ByteLists, OFFSET};
use super::TranscodeError;

pub use render::WitnessRender;
pub use stream::{StreamedWitness, WitnessSsz, WitnessStream};

/// Which container a witness is sent as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WitnessForm {
    /// rpcedge's default: the EIP-8025 container's three fields, then `keys`, so that nothing of
    /// the JSON is lost.
    Lossless,
    /// EIP-8025's `SszExecutionWitness` as it is: `state`, `codes`, `headers` (no `keys`).
    Eip8025,
}

/// A field of the witness container: its name and its `List[ByteList[max_bytes], max_items]`.
pub struct Field {
    pub name: &'static str,
    pub max_items: usize,
    pub max_bytes: usize,
}

/// The container's fields in SSZ order; EIP-8025's container is the first three.
pub const FIELDS: [Field; 4] = [
    Field { name: "state", max_items: 1 << 22, max_bytes: 1 << 10 },
    Field { name: "codes", max_items: 1 << 18, max_bytes: 1 << 16 },
    Field { name: "headers", max_items: 256, max_bytes: 1 << 10 },
    // storage slots and addresses: the preimages of the keys the state's trie is walked by
    Field { name: "keys", max_items: 1 << 22, max_bytes: 32 },
];

/// The field of the headers, which may come as JSON objects.
const HEADERS: usize = 2;

impl WitnessForm {
    /// How many of [`FIELDS`] the form's container has.
    fn fields(self) -> usize {
        match self {
            WitnessForm::Lossless => 4,
            WitnessForm::Eip8025 => 3,
        }
    }
}

/// The witness object at `json` (either shape) as the SSZ container of `form`, onto `out`.
pub fn to_ssz(json: &mut Scanner, form: WitnessForm, out: &mut Vec<u8>) -> Result<(), TranscodeError> {
    let mut lists: [ByteLists; 4] = Default::default();
    let mut seen = [false; 4];
    json.object(|json, key| {
        let Some(index) = field_index(key) else {
            json.value()?;
            return Ok(());
        };
        if std::mem::replace(&mut seen[index], true) {
            return Err(json.error("a field named twice"));
        }
        let (field, list) = (&FIELDS[index], &mut lists[index]);
        match json.peek() {
            Some(b'{') => json.object(|json, _hash| list.push_hex(json, field.max_items, field.max_bytes)),
            // some nodes send `null` for an empty field
            Some(b'n') if json.value()? == b"null" => Ok(()),
            _ => json.array(|json| push_element(list, index, json)),
        }
    })?;
    let lists = &lists[..form.fields()];
    out.reserve(lists.len() * OFFSET + lists.iter().map(ByteLists::len).sum::<usize>());
    write_container_offsets(lists, out)?;
    for list in lists {
        list.write(out)?;
    }
    Ok(())
}

/// The index in [`FIELDS`] of the field named `key`.
fn field_index(key: &[u8]) -> Option<usize> {
    FIELDS.iter().position(|field| field.name.as_bytes() == key)
}

/// Reads one element of the list shape's field `index` onto its list: 0x-hex, or for a header a
/// JSON object too, which goes in as its RLP.
fn push_element(list: &mut ByteLists, index: usize, json: &mut Scanner) -> Result<(), TranscodeError> {
    let field = &FIELDS[index];
    match json.peek() {
        Some(b'{') if index == HEADERS => {
            list.push_with(field.max_items, field.max_bytes, |data| header::to_rlp(json, data))
        }
        _ => list.push_hex(json, field.max_items, field.max_bytes),
    }
}

/// Appends the offsets of the container of `lists`, refusing one that 4-byte offsets cannot
/// address; its length is what it returns.
fn write_container_offsets(lists: &[ByteLists], out: &mut Vec<u8>) -> Result<u64, TranscodeError> {
    let mut at = (lists.len() * OFFSET) as u64;
    for list in lists {
        out.extend_from_slice(&offset(at)?.to_le_bytes());
        at += list.len() as u64;
    }
    offset(at)?;
    Ok(at)
}

/// The SSZ container of `form` as the list shape's JSON object, onto `out`.
pub fn to_json(ssz: &[u8], form: WitnessForm, out: &mut Vec<u8>) -> Result<(), TranscodeError> {
    let fields = form.fields();
    let fixed = fields * OFFSET;
    let mut bounds = Vec::with_capacity(fields + 1);
    for i in 0..fields {
        bounds.push(read_offset(ssz, i * OFFSET)?);
    }
    bounds.push(ssz.len());
    if bounds[0] != fixed || bounds.windows(2).any(|pair| pair[0] > pair[1]) {
        return Err(TranscodeError::Ssz("the witness's offsets"));
    }
    let mut lists = Vec::with_capacity(fields);
    for (i, field) in FIELDS[..fields].iter().enumerate() {
        lists.push(read_byte_lists(&ssz[bounds[i]..bounds[i + 1]], field.max_items, field.max_bytes)?);
    }
    out.reserve(ssz.len() * 2 + 64);
    out.push(b'{');
    // (in the container's order, as the streaming renderer writes them)
    for (index, list) in lists.iter().enumerate() {
        if index > 0 {
            out.push(b',');
        }
        out.push(b'"');
        out.extend_from_slice(FIELDS[index].name.as_bytes());
        out.extend_from_slice(b"\":");
        write_hex_array(list, out);
    }
    out.push(b'}');
    Ok(())
}
