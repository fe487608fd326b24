//! SSZ types described as values, and the two walks over them: Beacon-API JSON to SSZ, and SSZ
//! to Beacon-API JSON. The JSON side is the Beacon-API's: integers as decimal strings (bare
//! numbers are taken too), bytes and bitfields as 0x-hex of any case (bitfields as the hex of their
//! SSZ bytes), booleans as booleans; members in any order, unknown members skipped.
//!
//! JSON -> SSZ writes each container's fixed part in place as its members arrive, appends the
//! variable parts, and writes their offsets at the end (reordering the variable parts only when
//! the JSON named them out of schema order). SSZ -> JSON checks every offset and limit before
//! it writes.

use std::cell::Cell;

use super::super::json::Scanner;
use super::super::hex::decode_hex;
use super::super::ssz::{decode_hex_into, offset, read_offset, write_hex, OFFSET};
use super::super::TranscodeError;

/// An SSZ type.
#[derive(Debug)]
pub enum Ty {
    /// An unsigned integer of this many bytes (1, 8 or 32).
    Uint(usize),
    Bool,
    /// `ByteVector[N]` (`BytesN`).
    Bytes(usize),
    /// `ByteList[N]`. (Limits are u64: the state's lists allow 2^40 elements, past a 32-bit usize.)
    ByteList(u64),
    /// `Bitvector[N]`.
    Bitvector(usize),
    /// `Bitlist[N]`.
    Bitlist(u64),
    Vector(&'static Ty, usize),
    List(&'static Ty, u64),
    Container(&'static [Field]),
}

/// A container's field.
#[derive(Debug)]
pub struct Field {
    pub name: &'static str,
    pub ty: Ty,
    /// What the field takes in the container's fixed part: its size, or an offset's.
    fixed_part: usize,
    variable: bool,
}

/// The most fields a container may have (the seen-set is a bitmask).
const MAX_FIELDS: usize = 64;

impl Field {
    pub const fn new(name: &'static str, ty: Ty) -> Field {
        let (fixed_part, variable) = match ty.fixed_size() {
            Some(size) => (size, false),
            None => (OFFSET, true),
        };
        Field { name, ty, fixed_part, variable }
    }
}

impl Ty {
    /// The serialized size of a fixed-size type; `None` for a variable-size one.
    pub const fn fixed_size(&self) -> Option<usize> {
        match *self {
            Ty::Uint(bytes) | Ty::Bytes(bytes) => Some(bytes),
            Ty::Bool => Some(1),
            Ty::Bitvector(bits) => Some(bits.div_ceil(8)),
            Ty::ByteList(_) | Ty::Bitlist(_) | Ty::List(..) => None,
            Ty::Vector(element, count) => match element.fixed_size() {
                Some(size) => Some(size * count),
                None => None,
            },
            Ty::Container(fields) => {
                assert!(fields.len() <= MAX_FIELDS, "a container with more fields than the seen-set holds");
                let (mut i, mut size) = (0, 0);
                while i < fields.len() {
                    if fields[i].variable {
                        return None;
                    }
                    size += fields[i].fixed_part;
                    i += 1;
                }
                Some(size)
            }
        }
    }
}

/// The JSON value at `json`, of type `ty`, as SSZ appended to `out`.
pub fn to_ssz(ty: &Ty, json: &mut Scanner, out: &mut Vec<u8>) -> Result<(), TranscodeError> {
    match ty.fixed_size() {
        Some(size) => {
            let start = out.len();
            out.resize(start + size, 0);
            fixed_to_ssz(ty, json, &mut out[start..])
        }
        None => variable_to_ssz(ty, json, out),
    }
}

/// A fixed-size value into `slot`, which is its size.
fn fixed_to_ssz(ty: &Ty, json: &mut Scanner, slot: &mut [u8]) -> Result<(), TranscodeError> {
    match *ty {
        Ty::Uint(8) => slot.copy_from_slice(&parse_u64(json)?.to_le_bytes()),
        Ty::Uint(1) => slot[0] = u8::try_from(parse_u64(json)?).map_err(|_| TranscodeError::Limit("a uint8 over 255"))?,
        Ty::Uint(_) => parse_u256(json, slot)?,
        Ty::Bool => slot[0] = u8::from(json.boolean()?),
        Ty::Bytes(_) => decode_hex_exact(json, slot)?,
        Ty::Bitvector(bits) => {
            decode_hex_exact(json, slot)?;
            check_bitvector(slot, bits)?;
        }
        Ty::Vector(element, count) => {
            let size = slot.len() / count;
            let mut n = 0;
            json.array(|json| {
                let item = slot.get_mut(n * size..(n + 1) * size).ok_or(TranscodeError::Limit("a vector's length"))?;
                n += 1;
                fixed_to_ssz(element, json, item)
            })?;
            if n != count {
                return Err(TranscodeError::Limit("a vector's length"));
            }
        }
        Ty::Container(fields) => {
            let seen = Members::new(fields);
            json.object_expecting(|| seen.expected(), |json, key| {
                let Some((field, at)) = seen.find(key, json)? else { return Ok(()) };
                fixed_to_ssz(&field.ty, json, &mut slot[at..at + field.fixed_part])
            })?;
            seen.all(json)?;
        }
        Ty::ByteList(_) | Ty::Bitlist(_) | Ty::List(..) => unreachable!("a variable-size type in a fixed slot"),
    }
    Ok(())
}

fn variable_to_ssz(ty: &Ty, json: &mut Scanner, out: &mut Vec<u8>) -> Result<(), TranscodeError> {
    match *ty {
        Ty::ByteList(max) => {
            let start = out.len();
            decode_hex_into(json, out)?;
            if (out.len() - start) as u64 > max {
                return Err(TranscodeError::Limit("a byte list longer than its limit"));
            }
        }
        Ty::Bitlist(max) => {
            let start = out.len();
            decode_hex_into(json, out)?;
            check_bitlist(&out[start..], max)?;
        }
        Ty::List(element, max) => sequence_to_ssz(element, json, out, Length::AtMost(max))?,
        Ty::Vector(element, count) => sequence_to_ssz(element, json, out, Length::Exactly(count as u64))?,
        Ty::Container(fields) => container_to_ssz(fields, json, out)?,
        Ty::Uint(_) | Ty::Bool | Ty::Bytes(_) | Ty::Bitvector(_) => unreachable!("a fixed-size type as variable"),
    }
    Ok(())
}

/// How many elements a list or vector has.
#[derive(Clone, Copy)]
enum Length {
    AtMost(u64),
    Exactly(u64),
}

impl Length {
    fn bound(self) -> u64 {
        match self {
            Length::AtMost(n) | Length::Exactly(n) => n,
        }
    }

    fn fits(self, count: usize) -> bool {
        let count = count as u64;
        match self {
            Length::AtMost(max) => count <= max,
            Length::Exactly(n) => count == n,
        }
    }
}

fn sequence_to_ssz(element: &Ty, json: &mut Scanner, out: &mut Vec<u8>, length: Length) -> Result<(), TranscodeError> {
    let base = out.len();
    let mut count = 0;
    // counts one more element, refused as soon as it is one too many
    let mut next = || {
        count += 1;
        if count as u64 > length.bound() {
            return Err(TranscodeError::Limit("more elements than the list's limit"));
        }
        Ok(())
    };
    match element.fixed_size() {
        Some(size) => json.array(|json| {
            next()?;
            let start = out.len();
            out.resize(start + size, 0);
            fixed_to_ssz(element, json, &mut out[start..])
        })?,
        None => {
            // The elements go first; their offset table is inserted before them once counted.
            let mut starts = Vec::new();
            json.array(|json| {
                next()?;
                starts.push(out.len() - base);
                variable_to_ssz(element, json, out)
            })?;
            let table = starts.len() * OFFSET;
            let end = out.len();
            out.resize(end + table, 0);
            out.copy_within(base..end, base + table);
            for (i, start) in starts.iter().enumerate() {
                let at = base + i * OFFSET;
                out[at..at + OFFSET].copy_from_slice(&offset((table + start) as u64)?.to_le_bytes());
            }
        }
    }
    if !length.fits(count) {
        return Err(TranscodeError::Limit("a vector's length"));
    }
    offset((out.len() - base) as u64)?;
    Ok(())
}

/// A container with variable-size fields: the fixed part in place, the variable parts after it.
fn container_to_ssz(fields: &'static [Field], json: &mut Scanner, out: &mut Vec<u8>) -> Result<(), TranscodeError> {
    let base = out.len();
    let fixed: usize = fields.iter().map(|field| field.fixed_part).sum();
    out.resize(base + fixed, 0);
    // each variable part as it came: (where its offset goes, start, end) in `out`
    let mut parts: Vec<(usize, usize, usize)> = Vec::new();
    let seen = Members::new(fields);
    json.object_expecting(|| seen.expected(), |json, key| {
        let Some((field, at)) = seen.find(key, json)? else { return Ok(()) };
        if !field.variable {
            fixed_to_ssz(&field.ty, json, &mut out[base + at..base + at + field.fixed_part])
        } else {
            let start = out.len();
            variable_to_ssz(&field.ty, json, out)?;
            parts.push((at, start, out.len()));
            Ok(())
        }
    })?;
    seen.all(json)?;
    if !parts.windows(2).all(|pair| pair[0].0 < pair[1].0) {
        // named out of schema order: put the variable parts in order
        let tail = out.split_off(base + fixed);
        parts.sort_unstable_by_key(|part| part.0);
        for part in &mut parts {
            let (start, end) = (part.1 - base - fixed, part.2 - base - fixed);
            part.1 = out.len();
            out.extend_from_slice(&tail[start..end]);
        }
    }
    for &(at, start, _) in &parts {
        out[base + at..base + at + OFFSET].copy_from_slice(&offset((start - base) as u64)?.to_le_bytes());
    }
    offset((out.len() - base) as u64)?;
    Ok(())
}

/// Which of a container's fields the JSON has named (in cells: the object walk asks which key
/// to expect while its members are found).
struct Members {
    fields: &'static [Field],
    seen: Cell<u64>,
    /// The field after the last one found: JSON usually names them in order.
    next: Cell<usize>,
    /// Where the `next` field starts in the container's fixed part.
    next_at: Cell<usize>,
}

impl Members {
    fn new(fields: &'static [Field]) -> Self {
        Members { fields, seen: Cell::new(0), next: Cell::new(0), next_at: Cell::new(0) }
    }

    /// The key to try first.
    fn expected(&self) -> Option<&'static [u8]> {
        self.fields.get(self.next.get()).map(|field| field.name.as_bytes())
    }

    /// The field named `key`, and where it starts in the fixed part; or `None` (with its value
    /// skipped) for a member the type does not have.
    fn find(&self, key: &[u8], json: &mut Scanner) -> Result<Option<(&'static Field, usize)>, TranscodeError> {
        let next = self.next.get();
        // the expected key, matched in place, is the field's own name
        let named = |field: &Field| std::ptr::eq(field.name.as_bytes(), key) || field.name.as_bytes() == key;
        let (index, at) = match self.fields.get(next) {
            Some(field) if named(field) => (next, self.next_at.get()),
            _ => match self.fields.iter().position(|field| field.name.as_bytes() == key) {
                Some(index) => (index, self.fields[..index].iter().map(|field| field.fixed_part).sum()),
                None => {
                    json.value()?;
                    return Ok(None);
                }
            },
        };
        if self.seen.get() & 1 << index != 0 {
            return Err(json.error("a field named once"));
        }
        let field = &self.fields[index];
        self.seen.set(self.seen.get() | 1 << index);
        self.next.set(index + 1);
        self.next_at.set(at + field.fixed_part);
        Ok(Some((field, at)))
    }

    fn all(&self, json: &Scanner) -> Result<(), TranscodeError> {
        if self.seen.get() == u64::MAX >> (64 - self.fields.len()) {
            Ok(())
        } else {
            Err(json.error("every field of the container"))
        }
    }
}

/// A decimal integer, quoted or bare.
fn parse_u64(json: &mut Scanner) -> Result<u64, TranscodeError> {
    if let Some(value) = json.decimal_u64() {
        return Ok(value);
    }
    let digits = json.decimal()?;
    if digits.len() > 20 {
        return Err(TranscodeError::Limit("a uint64 over its range"));
    }
    digits.iter().try_fold(0u64, |n, &digit| n.checked_mul(10)?.checked_add(u64::from(digit - b'0')))
        .ok_or(TranscodeError::Limit("a uint64 over its range"))
}

/// A decimal uint256 into its 32 little-endian bytes.
fn parse_u256(json: &mut Scanner, slot: &mut [u8]) -> Result<(), TranscodeError> {
    let over = TranscodeError::Limit("a uint256 over its range");
    let digits = json.decimal()?;
    if digits.len() > 80 {
        return Err(over);
    }
    let mut limbs = [0u64; 4];
    for &digit in digits.iter() {
        let mut carry = u128::from(digit - b'0');
        for limb in &mut limbs {
            let wide = u128::from(*limb) * 10 + carry;
            *limb = wide as u64;
            carry = wide >> 64;
        }
        if carry != 0 {
            return Err(over);
        }
    }
    for (chunk, limb) in slot.chunks_exact_mut(8).zip(limbs) {
        chunk.copy_from_slice(&limb.to_le_bytes());
    }
    Ok(())
}

/// A JSON hex string of exactly `slot.len()` bytes, into `slot`.
fn decode_hex_exact(json: &mut Scanner, slot: &mut [u8]) -> Result<(), TranscodeError> {
    // the usual case, without looking for the string's end: "0x" and the digits
    if let Some(text) = json.quoted_exact(2 + slot.len() * 2) {
        return decode_hex(text.strip_prefix(b"0x").ok_or(TranscodeError::Hex)?, slot);
    }
    let text = json.string()?;
    let digits = text.strip_prefix(b"0x").ok_or(TranscodeError::Hex)?;
    if digits.len() != slot.len() * 2 {
        return Err(TranscodeError::Limit("bytes of another length than their type's"));
    }
    decode_hex(digits, slot)
}

fn check_bitvector(bytes: &[u8], bits: usize) -> Result<(), TranscodeError> {
    match (bits % 8, bytes.last()) {
        (0, _) | (_, None) => Ok(()),
        (used, Some(&last)) if last >> used == 0 => Ok(()),
        _ => Err(TranscodeError::Ssz("a bitvector with bits set past its length")),
    }
}

fn check_bitlist(bytes: &[u8], max: u64) -> Result<(), TranscodeError> {
    let last = *bytes.last().ok_or(TranscodeError::Ssz("a bitlist with no length bit"))?;
    if last == 0 {
        return Err(TranscodeError::Ssz("a bitlist with no length bit"));
    }
    let bits = (bytes.len() - 1) * 8 + (7 - last.leading_zeros() as usize);
    if bits as u64 > max {
        return Err(TranscodeError::Limit("a bitlist longer than its limit"));
    }
    Ok(())
}

/// The SSZ value `ssz` of type `ty` as JSON appended to `out`.
pub fn to_json(ty: &Ty, ssz: &[u8], out: &mut Vec<u8>) -> Result<(), TranscodeError> {
    if ty.fixed_size().is_some_and(|size| size != ssz.len()) {
        return Err(TranscodeError::Ssz("a fixed-size value of another length"));
    }
    value_to_json(ty, ssz, out)
}

/// As [`to_json`], with a fixed-size `ssz` already of its size.
fn value_to_json(ty: &Ty, ssz: &[u8], out: &mut Vec<u8>) -> Result<(), TranscodeError> {
    match *ty {
        Ty::Uint(8) => write_decimal(u64::from_le_bytes(ssz.try_into().expect("8 bytes")), out),
        Ty::Uint(1) => write_decimal(u64::from(ssz[0]), out),
        Ty::Uint(_) => write_u256(ssz, out),
        Ty::Bool => out.extend_from_slice(match ssz[0] {
            0 => b"false",
            1 => b"true",
            _ => return Err(TranscodeError::Ssz("a boolean that is not 0 or 1")),
        }),
        Ty::Bytes(_) => write_hex(ssz, out),
        Ty::ByteList(max) => {
            if ssz.len() as u64 > max {
                return Err(TranscodeError::Limit("a byte list longer than its limit"));
            }
            write_hex(ssz, out)
        }
        Ty::Bitvector(bits) => {
            check_bitvector(ssz, bits)?;
            write_hex(ssz, out)
        }
        Ty::Bitlist(max) => {
            check_bitlist(ssz, max)?;
            write_hex(ssz, out)
        }
        Ty::List(element, max) => sequence_to_json(element, ssz, out, Length::AtMost(max))?,
        Ty::Vector(element, count) => sequence_to_json(element, ssz, out, Length::Exactly(count as u64))?,
        Ty::Container(fields) => container_to_json(fields, ssz, out)?,
    }
    Ok(())
}

fn sequence_to_json(element: &Ty, ssz: &[u8], out: &mut Vec<u8>, length: Length) -> Result<(), TranscodeError> {
    out.push(b'[');
    match element.fixed_size() {
        Some(size) => {
            if ssz.len() % size != 0 || !length.fits(ssz.len() / size) {
                return Err(TranscodeError::Ssz("a list or vector's length"));
            }
            for (i, item) in ssz.chunks_exact(size).enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                value_to_json(element, item, out)?;
            }
        }
        None => {
            let first = if ssz.is_empty() { 0 } else { read_offset(ssz, 0)? };
            let count = first / OFFSET;
            if !length.fits(count) || first % OFFSET != 0 || (!ssz.is_empty() && count == 0) {
                return Err(TranscodeError::Ssz("a list or vector's length"));
            }
            let mut start = count * OFFSET;
            for i in 0..count {
                let end = if i + 1 < count { read_offset(ssz, (i + 1) * OFFSET)? } else { ssz.len() };
                if end < start || end > ssz.len() {
                    return Err(TranscodeError::Ssz("a list's offsets"));
                }
                if i > 0 {
                    out.push(b',');
                }
                to_json(element, &ssz[start..end], out)?;
                start = end;
            }
        }
    }
    out.push(b']');
    Ok(())
}

fn container_to_json(fields: &'static [Field], ssz: &[u8], out: &mut Vec<u8>) -> Result<(), TranscodeError> {
    let fixed: usize = fields.iter().map(|field| field.fixed_part).sum();
    if ssz.len() < fixed {
        return Err(TranscodeError::Ssz("a container shorter than its fixed part"));
    }
    // where each variable field starts, checked in order; the first must follow the fixed part
    let (mut starts, mut variables) = ([0; MAX_FIELDS], 0);
    let mut at = 0;
    for field in fields {
        if field.variable {
            let start = read_offset(ssz, at)?;
            let previous = if variables == 0 { fixed } else { starts[variables - 1] };
            if start < previous || start > ssz.len() || (variables == 0 && start != fixed) {
                return Err(TranscodeError::Ssz("a container's offsets"));
            }
            starts[variables] = start;
            variables += 1;
        }
        at += field.fixed_part;
    }
    if variables == 0 && ssz.len() != fixed {
        return Err(TranscodeError::Ssz("a fixed-size container of another length"));
    }
    out.push(b'{');
    let (mut at, mut variable) = (0, 0);
    for (i, field) in fields.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.push(b'"');
        out.extend_from_slice(field.name.as_bytes());
        out.extend_from_slice(b"\":");
        if field.variable {
            let end = if variable + 1 < variables { starts[variable + 1] } else { ssz.len() };
            to_json(&field.ty, &ssz[starts[variable]..end], out)?;
            variable += 1;
        } else {
            value_to_json(&field.ty, &ssz[at..at + field.fixed_part], out)?;
        }
        at += field.fixed_part;
    }
    out.push(b'}');
    Ok(())
}

fn write_decimal(n: u64, out: &mut Vec<u8>) {
    out.push(b'"');
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
    out.push(b'"');
}

/// 32 little-endian bytes as a quoted decimal.
fn write_u256(ssz: &[u8], out: &mut Vec<u8>) {
    let mut limbs: Vec<u64> = ssz.chunks_exact(8).map(|chunk| u64::from_le_bytes(chunk.try_into().expect("8 bytes"))).collect();
    // base 10^19 digits, least significant first
    const BASE: u128 = 10_000_000_000_000_000_000;
    let mut groups = Vec::new();
    while limbs.iter().any(|&limb| limb != 0) {
        let mut remainder = 0u128;
        for limb in limbs.iter_mut().rev() {
            let wide = (remainder << 64) | u128::from(*limb);
            *limb = (wide / BASE) as u64;
            remainder = wide % BASE;
        }
        groups.push(remainder as u64);
    }
    out.push(b'"');
    match groups.split_last() {
        None => out.push(b'0'),
        Some((first, rest)) => {
            out.extend_from_slice(itoa::Buffer::new().format(*first).as_bytes());
            for group in rest.iter().rev() {
                out.extend_from_slice(format!("{group:019}").as_bytes());
            }
        }
    }
    out.push(b'"');
}
