//! A stored answer, and a hit put back together around the client's own id.
//!
//! The store keeps `<result>}` (the envelope's tail), compressed once at write time as a raw
//! DEFLATE stream when that is smaller, and the node's envelope around the id (for geth
//! `{"jsonrpc":"2.0","id":` and `,"result":`), so that a hit is the node's answer byte for byte
//! but for the id. A gzip hit is then spliced, with no compression: a gzip header, the envelope's
//! prefix with the client's id in stored (uncompressed) non-final DEFLATE blocks, the kept stream
//! (whose last block is final), and a trailer whose CRC-32 is combined from the parts' and whose
//! size is their sum. The store keeps the tail in zstd and brotli forms too, when all the forms
//! together are no longer than the tail, which a zstd or br hit splices the same way
//! (`compress::spliced`). A client that takes none of them pays an inflate of the tail on each
//! hit; a proxy's hot tier keeps a long one plain for such clients ([`Entry::plain_form`]). An
//! entry also keeps what of the node's head a hit sends again, and the request header values the
//! answer varies on ([`Head`]).
//!
//! Every byte of an entry is read as hostile: it comes back over a network from a daemon, a disk
//! or a fleet's Redis. A CRC-32 of the whole entry, as written, is checked before any of it is
//! read ([`Entry::decode`]), so that a bit changed anywhere (the envelope, the kept head, a
//! compressed form the tail's own CRC-32 does not cover) makes it a bad entry, never a hit.

use std::fmt;

use crc32fast::Hasher;
use flate2::{Decompress, FlushDecompress, Status};

use super::head::{Head, MAX_HEAD};
use crate::compress::blocks::{continuable, EMPTY_FINAL_BLOCK};
use crate::compress::{auto_level, compress_whole, deflate_raw};
use crate::compress::spliced::{self, br_form, zstd_form};
use crate::negotiate::Coding;

/// 2: with the node's head; 3: with zstd and brotli forms; 4: with a CRC-32 of the whole entry.
const VERSION: u8 = 4;
const PLAIN: u8 = 0;
const DEFLATED: u8 = 1;
/// Deflated, the stream continuable (`compress::blocks`): a batch's hit splices several.
const CONTINUABLE: u8 = 2;
/// The shortest tail a hot tier keeps plain for the clients an entry answers plain (it keeps a
/// form for none of their codings): inflating it would cost each hit more than the copy (a 600 KiB
/// block: over 1 ms against 15 us); the tier holds 2 to 4 times the stream's bytes for it.
pub const PLAIN_HOT_MIN: u64 = 64 * 1024;
/// Version, form, CRC-32 and length of the tail, lengths of the envelope's two parts, of the
/// kept head and of the tail's zstd and brotli forms, then the entry's own CRC-32 (`SUM_AT`).
const HEAD: usize = 1 + 1 + 4 + 8 + 2 + 2 + 4 + 4 + 4 + 4;
/// Where the CRC-32 of the whole entry (every other byte, in order) is.
const SUM_AT: usize = HEAD - 4;
/// The longest envelope part kept; a node's envelope with more around the id gets the standard one.
const MAX_ENVELOPE_PART: usize = 1024;
/// The standard envelope: JSON-RPC 2.0 as geth writes it.
const STANDARD_BEFORE_ID: &[u8] = br#"{"jsonrpc":"2.0","id":"#;
const STANDARD_AFTER_ID: &[u8] = br#","result":"#;
/// The longest tail an entry holds (entries are bounded far below by `max_entry`): a corrupt
/// length must not make a hit reserve more.
const MAX_TAIL: u64 = 256 * 1024 * 1024;
/// The level a tail is compressed at once, for every later hit: libdeflate's highest.
const STORE_LEVEL: u32 = 12;
/// zstd's level for the form a store keeps beside the DEFLATE one (loadtest/results/level.md):
/// on the corpus's answers 1-7 % fewer bytes than level 1 from 16 KiB up, in 2-6 ms per 100-500
/// KiB; 15 saves 1-10 % more for 3-12 times the time, 19 up to 20 % for 50-100 times.
const STORE_ZSTD_LEVEL: u32 = 9;

/// brotli's quality for the form a store keeps, by the tail's length (loadtest/results/level.md):
/// 4 below 256 KiB (5 and up take 3-25 ms on a 2-37 KiB body, for 1-6 % fewer bytes); 5 from
/// 256 KiB, where it takes about twice 4's time and saves 4-19 %.
fn store_br_quality(length: usize) -> u32 {
    if length < 256 * 1024 {
        4
    } else {
        5
    }
}

/// The longest entry, as a host sends it and as the store keeps it, for an answer of at most
/// `max_entry` bytes: the entry's own head, the kept head at its longest, and the answer but for
/// the id, or its tail (`<result>}`) with the standard envelope standing in for the node's. The
/// daemon bounds a store by it, so that it never refuses an entry that a host with the same
/// `max_entry` sent.
pub const fn entry_bound(max_entry: u64) -> u64 {
    max_entry.saturating_add((HEAD + MAX_HEAD + STANDARD_BEFORE_ID.len() + STANDARD_AFTER_ID.len()) as u64)
}

/// The node's envelope around the id: what comes before it, and between it and the result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Envelope {
    pub before_id: Vec<u8>,
    pub after_id: Vec<u8>,
}

impl Default for Envelope {
    /// JSON-RPC 2.0 as geth writes it.
    fn default() -> Self {
        Envelope { before_id: STANDARD_BEFORE_ID.to_vec(), after_id: STANDARD_AFTER_ID.to_vec() }
    }
}

impl Envelope {
    /// The envelope of `body` around its `id` and `result` (both slices of `body`), when the id
    /// comes first and the result is the last member.
    pub(super) fn of(body: &[u8], id: &str, result: &str) -> Option<Envelope> {
        let offset = |part: &str| (part.as_ptr() as usize).checked_sub(body.as_ptr() as usize);
        let (id_at, result_at) = (offset(id)?, offset(result)?);
        let id_end = id_at + id.len();
        let after_result = body.get(result_at + result.len()..)?;
        let closes = after_result.trim_ascii() == b"}";
        (closes && id_end <= result_at && id_at <= MAX_ENVELOPE_PART && result_at - id_end <= MAX_ENVELOPE_PART)
            .then(|| Envelope { before_id: body[..id_at].to_vec(), after_id: body[id_end..result_at].to_vec() })
    }

    /// The envelope's prefix around `id`, up to the result.
    pub fn prefix(&self, id: &str) -> Vec<u8> {
        [self.before_id.as_slice(), id.as_bytes(), &self.after_id].concat()
    }
}

/// Of the operator's `encodings`, in its order, those a hit goes out in: all but deflate, spliced
/// from the forms an entry keeps (dcz, for the small answers it is for, compressed on the hit).
pub fn hit_codings(encodings: &[Coding]) -> Vec<Coding> {
    encodings.iter().copied().filter(|&coding| coding != Coding::Deflate).collect()
}

/// The least plain lengths a hit goes out compressed from: `min_length`, and for dcz
/// `dictionary_min_length`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MinLengths {
    pub plain: u64,
    pub dcz: u64,
}

impl MinLengths {
    /// Every hit compressed where that makes it smaller.
    pub const NONE: MinLengths = MinLengths { plain: 0, dcz: 0 };

    /// One least length for every coding.
    pub fn same(length: u64) -> MinLengths {
        MinLengths { plain: length, dcz: length }
    }

    pub fn of(self, coding: Coding) -> u64 {
        if coding == Coding::Dcz { self.dcz } else { self.plain }
    }
}

/// The longest answer a dcz hit is made for. A dcz hit is compressed on the hit (dictionary
/// offsets move with the prefix, so no kept form splices); dcz is for small answers, and past this
/// the next coding's splice is nearly as small and costs no compression.
pub const DCZ_HIT_MAX: u64 = 64 * 1024;

/// An entry as stored: the envelope, and its tail plain or as a raw DEFLATE stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry<'a> {
    deflated: bool,
    /// The stream ends in a sync flush and an empty final block.
    continuable: bool,
    crc: u32,
    len: u64,
    before_id: &'a [u8],
    after_id: &'a [u8],
    /// The kept head as stored.
    head: &'a [u8],
    /// The tail's zstd and brotli forms (`compress::spliced`), empty when not kept.
    zstd: &'a [u8],
    br: &'a [u8],
    /// The node's headers a hit sends again.
    pub headers: Vec<(&'a str, &'a str)>,
    /// The request headers the answer varies on, and the values it is for.
    pub vary: Vec<(&'a str, Option<&'a str>)>,
    data: &'a [u8],
}

/// A stored value that is not an entry (a different version, a torn or foreign value).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadEntry(&'static str);

impl fmt::Display for BadEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "bad cache entry: {}", self.0)
    }
}

impl std::error::Error for BadEntry {}

/// A hit's body, ready to send with an exact Content-Length.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hit {
    pub body: Vec<u8>,
    /// The body's Content-Encoding; `None`: the plain envelope.
    pub coding: Option<Coding>,
}

/// Encodes an answer as a host sends it to the store: its tail plain. The daemon compresses it
/// ([`Entry::compact`]), so that no proxy worker spends level 12 on it.
pub fn encode(envelope: &Envelope, head: &Head, tail: &[u8]) -> Vec<u8> {
    let standard = Envelope::default();
    let envelope = if envelope.before_id.len().max(envelope.after_id.len()) <= MAX_ENVELOPE_PART {
        envelope
    } else {
        &standard
    };
    let head = encode_head(head);
    let parts = [&envelope.before_id[..], &envelope.after_id, &head, &[], &[]];
    write(PLAIN, crc32fast::hash(tail), tail.len() as u64, parts, tail)
}

/// `parts`: the envelope's two parts, the kept head, and the tail's zstd and brotli forms.
fn write(form: u8, crc: u32, len: u64, parts: [&[u8]; 5], data: &[u8]) -> Vec<u8> {
    let [before_id, after_id, head, zstd, br] = parts;
    let parts_len: usize = parts.iter().map(|part| part.len()).sum();
    let mut out = Vec::with_capacity(HEAD + parts_len + data.len());
    out.push(VERSION);
    out.push(form);
    out.extend_from_slice(&crc.to_le_bytes());
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&(before_id.len() as u16).to_le_bytes());
    out.extend_from_slice(&(after_id.len() as u16).to_le_bytes());
    out.extend_from_slice(&(head.len() as u32).to_le_bytes());
    out.extend_from_slice(&(zstd.len() as u32).to_le_bytes());
    out.extend_from_slice(&(br.len() as u32).to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    for part in parts {
        out.extend_from_slice(part);
    }
    out.extend_from_slice(data);
    let sum = whole_sum(&out);
    out[SUM_AT..HEAD].copy_from_slice(&sum.to_le_bytes());
    out
}

/// `entry`, changed by a test, with its CRC-32 made right again: as a writer that means it would
/// leave it, for the checks after this one.
#[cfg(test)]
pub(super) fn reseal(entry: &mut [u8]) {
    let sum = whole_sum(entry);
    entry[SUM_AT..HEAD].copy_from_slice(&sum.to_le_bytes());
}

/// The CRC-32 of an entry of at least `HEAD` bytes but for its own field.
fn whole_sum(entry: &[u8]) -> u32 {
    let mut hasher = Hasher::new();
    hasher.update(&entry[..SUM_AT]);
    hasher.update(&entry[HEAD..]);
    hasher.finalize()
}

/// The kept head: the headers' count, then each name and value; the varied-on headers' count,
/// then each name, whether the request had it, and its value. Strings are u16-length-prefixed.
fn encode_head(head: &Head) -> Vec<u8> {
    let mut out = Vec::new();
    let string = |out: &mut Vec<u8>, text: &str| {
        out.extend_from_slice(&(text.len() as u16).to_le_bytes());
        out.extend_from_slice(text.as_bytes());
    };
    out.extend_from_slice(&(head.headers.len() as u16).to_le_bytes());
    for (name, value) in &head.headers {
        string(&mut out, name);
        string(&mut out, value);
    }
    out.extend_from_slice(&(head.vary.len() as u16).to_le_bytes());
    for (name, value) in &head.vary {
        string(&mut out, name);
        out.push(u8::from(value.is_some()));
        string(&mut out, value.as_deref().unwrap_or_default());
    }
    out
}

/// A kept head's headers and varied-on request headers, as `Entry` lends them.
type HeadParts<'a> = (Vec<(&'a str, &'a str)>, Vec<(&'a str, Option<&'a str>)>);

/// The parts of a kept head, checked.
fn decode_head<'a>(mut bytes: &'a [u8]) -> Result<HeadParts<'a>, BadEntry> {
    fn take<'a>(bytes: &mut &'a [u8], n: usize) -> Result<&'a [u8], BadEntry> {
        let (taken, rest) = bytes.split_at_checked(n).ok_or(BadEntry("its head is cut short"))?;
        *bytes = rest;
        Ok(taken)
    }
    fn count(bytes: &mut &[u8]) -> Result<usize, BadEntry> {
        Ok(usize::from(u16::from_le_bytes(take(bytes, 2)?.try_into().expect("2 bytes"))))
    }
    fn string<'a>(bytes: &mut &'a [u8]) -> Result<&'a str, BadEntry> {
        let n = count(bytes)?;
        std::str::from_utf8(take(bytes, n)?).map_err(|_| BadEntry("a header in its head is not text"))
    }
    // what a hit sends is checked again: whoever can write to the store must not be able to
    // split a response or send headers that no answer may keep
    let header = |bytes: &mut &'a [u8]| {
        let (name, value) = (string(bytes)?, string(bytes)?);
        let token_byte = |b: u8| b.is_ascii_lowercase() || b"0123456789-!#$%&'*+.^_`|~".contains(&b);
        let token = !name.is_empty() && name.bytes().all(token_byte);
        let text = value.bytes().all(|b| b == b'\t' || (b' '..=b'~').contains(&b) || b >= 0x80);
        if !token || !text || !Head::replays(name) {
            return Err(BadEntry("a header in its head cannot be sent"));
        }
        Ok((name, value))
    };
    let headers = (0..count(&mut bytes)?).map(|_| header(&mut bytes)).collect::<Result<_, _>>()?;
    let vary = (0..count(&mut bytes)?)
        .map(|_| {
            let name = string(&mut bytes)?;
            let present = take(&mut bytes, 1)?[0] != 0;
            let value = string(&mut bytes)?;
            Ok((name, present.then_some(value)))
        })
        .collect::<Result<_, _>>()?;
    if !bytes.is_empty() {
        return Err(BadEntry("its head is longer than its parts"));
    }
    Ok((headers, vary))
}

impl<'a> Entry<'a> {
    pub fn decode(stored: &'a [u8]) -> Result<Self, BadEntry> {
        if stored.len() < HEAD {
            return Err(BadEntry("shorter than its head"));
        }
        if stored[0] != VERSION {
            return Err(BadEntry("unknown version"));
        }
        if whole_sum(stored).to_le_bytes() != stored[SUM_AT..HEAD] {
            return Err(BadEntry("changed since it was written (its CRC-32 differs)"));
        }
        let (deflated, continuable) = match stored[1] {
            PLAIN => (false, false),
            DEFLATED => (true, false),
            CONTINUABLE => (true, true),
            _ => return Err(BadEntry("unknown form")),
        };
        let crc = u32::from_le_bytes(stored[2..6].try_into().expect("4 bytes"));
        let len = u64::from_le_bytes(stored[6..14].try_into().expect("8 bytes"));
        let before = usize::from(u16::from_le_bytes(stored[14..16].try_into().expect("2 bytes")));
        let after = usize::from(u16::from_le_bytes(stored[16..18].try_into().expect("2 bytes")));
        let u32_at = |at: usize| u32::from_le_bytes(stored[at..at + 4].try_into().expect("4 bytes")) as usize;
        let (head, zstd, br) = (u32_at(18), u32_at(22), u32_at(26));
        if len > MAX_TAIL {
            return Err(BadEntry("longer than any entry"));
        }
        let mut rest = &stored[HEAD..];
        let mut part = |n: usize| {
            let (part, after) = rest.split_at_checked(n).ok_or(BadEntry("shorter than its parts"))?;
            rest = after;
            Ok(part)
        };
        let (before_id, after_id, head) = (part(before)?, part(after)?, part(head)?);
        let (zstd, br) = (part(zstd)?, part(br)?);
        let data = rest;
        if !(zstd.is_empty() || spliced::zstd_form_is_sound(zstd)) || !(br.is_empty() || spliced::br_form_is_sound(br)) {
            return Err(BadEntry("its zstd or brotli form is broken"));
        }
        if !deflated && data.len() as u64 != len {
            return Err(BadEntry("length differs from its head"));
        }
        if continuable && !data.ends_with(&EMPTY_FINAL_BLOCK) {
            return Err(BadEntry("its stream does not end as a continuable one"));
        }
        let (headers, vary) = decode_head(head)?;
        Ok(Entry { deflated, continuable, crc, len, before_id, after_id, head, zstd, br, headers, vary, data })
    }

    /// Whether the tail is whole: checked against its CRC-32 (inflated first if it came deflated).
    pub fn check(&self) -> Result<(), BadEntry> {
        self.tail_into(&mut Vec::new())
    }

    /// The entry as the store keeps it, checked against its CRC-32: its tail deflated once at
    /// `STORE_LEVEL` when that is smaller, for every later hit, and made continuable (checked by
    /// inflating it again), so that a batch's hit splices it; then its zstd and brotli forms, each
    /// checked by decoding a splice of it, as long as the forms together are no longer than the
    /// tail (an entry as stored is never longer than as a host sends it). A tail that arrives
    /// deflated is kept as it came; zstd and brotli forms are the store's own: an entry that
    /// arrives with either is refused (no host sends them, and checking a stranger's form would
    /// decode whatever it claims).
    pub fn compact(&self) -> Result<Vec<u8>, BadEntry> {
        if !self.zstd.is_empty() || !self.br.is_empty() {
            return Err(BadEntry("it arrives with a zstd or brotli form, which only the store makes"));
        }
        let mut tail = Vec::new();
        self.tail_into(&mut tail)?;
        let (form, data) = if self.deflated {
            (self.form(), self.data.to_vec())
        } else {
            match deflate_raw(STORE_LEVEL, &tail) {
                Some(stream) => match continuable(&stream).filter(|open| inflates_to(open, &tail)) {
                    Some(open) => (CONTINUABLE, open),
                    None => (DEFLATED, stream),
                },
                None => (PLAIN, tail.clone()),
            }
        };
        if form == PLAIN {
            // a tail that does not deflate smaller keeps no other form either
            return Ok(write(form, self.crc, self.len, [self.before_id, self.after_id, self.head, &[], &[]], &data));
        }
        let mut room = tail.len().saturating_sub(data.len());
        // a splice behind the standard prefix must decode to it and the tail
        let prefix = Envelope::default().prefix("1");
        let whole = [prefix.as_slice(), &tail].concat();
        let mut kept = |form: Option<Vec<u8>>, decodes: &dyn Fn(&[u8]) -> bool| {
            let form = form.filter(|form| form.len() <= room && decodes(form)).unwrap_or_default();
            room -= form.len();
            form
        };
        let zstd = kept(zstd_form(STORE_ZSTD_LEVEL, &tail), &|form| {
            spliced::zstd_decodes_to(&spliced::zstd_splice(form, &prefix, self.len), &whole)
        });
        let br = kept(br_form(store_br_quality(tail.len()), &tail), &|form| {
            spliced::br_decodes_to(&spliced::br_splice(form, &prefix), &whole)
        });
        Ok(write(form, self.crc, self.len, [self.before_id, self.after_id, self.head, &zstd, &br], &data))
    }

    /// The entry with its tail in the one form it came in (DEFLATE, or plain), without the zstd and
    /// brotli forms a store adds: what a fleet carries, for about a third of the bytes. A host
    /// that keeps it answers a client that takes gzip gzip, and another plain.
    pub fn without_forms(&self) -> Vec<u8> {
        write(self.form(), self.crc, self.len, [self.before_id, self.after_id, self.head, &[], &[]], self.data)
    }

    fn form(&self) -> u8 {
        match (self.deflated, self.continuable) {
            (false, _) => PLAIN,
            (true, false) => DEFLATED,
            (true, true) => CONTINUABLE,
        }
    }

    /// The entry with its tail plain, for a hot tier that answers the clients the entry answers
    /// plain ([`Entry::answers_plain`]): `None`
    /// for a plain one, or one shorter than [`PLAIN_HOT_MIN`].
    pub fn plain_form(&self) -> Option<Vec<u8>> {
        if !self.deflated || self.len < PLAIN_HOT_MIN {
            return None;
        }
        let tail = self.plain().ok()?;
        Some(write(PLAIN, self.crc, self.len, [self.before_id, self.after_id, self.head, &[], &[]], &tail))
    }

    /// The hit for a client whose request carried `id` (its raw JSON text) and that takes
    /// `codings`, best first: in the first of them that makes it smaller than the plain envelope,
    /// when that is at least its least length: spliced from a form the entry keeps, or for dcz
    /// (up to [`DCZ_HIT_MAX`]) compressed; otherwise the plain envelope.
    pub fn respond(&self, id: &str, codings: &[Coding], min: MinLengths) -> Result<Hit, BadEntry> {
        let prefix = [self.before_id, id.as_bytes(), self.after_id].concat();
        let plain_len = prefix.len() as u64 + self.len;
        for &coding in codings.iter().filter(|&&coding| plain_len >= min.of(coding)) {
            let body = match coding {
                Coding::Dcz if plain_len <= DCZ_HIT_MAX => {
                    let mut plain = prefix.clone();
                    self.tail_into(&mut plain)?;
                    compress_whole(coding, auto_level(coding, plain.len()), &plain)
                }
                _ => self.splice_in(coding, &prefix).filter(|body| (body.len() as u64) < plain_len),
            };
            if let Some(body) = body {
                return Ok(Hit { body, coding: Some(coding) });
            }
        }
        let mut body = prefix;
        self.tail_into(&mut body)?;
        Ok(Hit { body, coding: None })
    }

    /// Whether a hit to a client that takes `codings` is plain whatever its length: the entry
    /// keeps a form for none of them (its tail is inflated for each such hit).
    pub fn answers_plain(&self, codings: &[Coding]) -> bool {
        !codings.iter().any(|&coding| self.keeps(coding))
    }

    /// Whether this entry keeps a form a hit in `coding` is spliced from.
    fn keeps(&self, coding: Coding) -> bool {
        match coding {
            Coding::Gzip => self.deflated,
            Coding::Zstd => !self.zstd.is_empty(),
            Coding::Br => !self.br.is_empty(),
            Coding::Deflate | Coding::Dcz => false,
        }
    }

    /// `prefix` then the tail in `coding`, spliced from the form this entry keeps for it.
    fn splice_in(&self, coding: Coding, prefix: &[u8]) -> Option<Vec<u8>> {
        match coding {
            _ if !self.keeps(coding) => None,
            Coding::Gzip => Some(self.splice(prefix)),
            Coding::Zstd => Some(spliced::zstd_splice(self.zstd, prefix, self.len)),
            Coding::Br => Some(spliced::br_splice(self.br, prefix)),
            Coding::Deflate | Coding::Dcz => None,
        }
    }

    /// The plain tail, checked against its CRC-32.
    pub fn plain(&self) -> Result<Vec<u8>, BadEntry> {
        let mut tail = Vec::new();
        self.tail_into(&mut tail)?;
        Ok(tail)
    }

    /// The plain tail, appended to `out` and checked against its CRC-32.
    fn tail_into(&self, out: &mut Vec<u8>) -> Result<(), BadEntry> {
        let start = out.len();
        if self.deflated {
            let len = usize::try_from(self.len).map_err(|_| BadEntry("too long"))?;
            out.reserve_exact(len);
            let mut inflate = Decompress::new(false);
            match inflate.decompress_vec(self.data, out, FlushDecompress::Finish) {
                Ok(Status::StreamEnd) if out.len() - start == len => {}
                _ => return Err(BadEntry("its DEFLATE stream is broken")),
            }
        } else {
            out.extend_from_slice(self.data);
        }
        if crc32fast::hash(&out[start..]) != self.crc {
            return Err(BadEntry("CRC-32 mismatch"));
        }
        Ok(())
    }

    fn splice(&self, prefix: &[u8]) -> Vec<u8> {
        let mut gzip = GzipSplice::new(prefix.len() + self.data.len());
        gzip.plain(prefix);
        // the stream's own final block ends the body
        gzip.stream(self.data, self.crc, self.len);
        gzip.finish()
    }

    /// The length of this entry's answer around `id`.
    pub(super) fn answer_len(&self, id: &str) -> u64 {
        (self.before_id.len() + id.len() + self.after_id.len()) as u64 + self.len
    }

    /// Appends `glue`, then this entry's answer around `id` to a gzip splice, its stream left
    /// open for more; `false` (nothing appended) unless the entry is continuable.
    pub(super) fn splice_open(&self, glue: &[u8], id: &str, gzip: &mut GzipSplice) -> bool {
        if !self.continuable {
            return false;
        }
        gzip.plain(&[glue, self.before_id, id.as_bytes(), self.after_id].concat());
        gzip.stream(&self.data[..self.data.len() - EMPTY_FINAL_BLOCK.len()], self.crc, self.len);
        true
    }
}

/// A gzip body put together from plain bytes (in stored blocks) and DEFLATE streams that were
/// compressed once, with a CRC-32 combined from the parts' and no compression.
pub(super) struct GzipSplice {
    out: Vec<u8>,
    crc: Hasher,
    len: u64,
}

impl GzipSplice {
    pub(super) fn new(capacity: usize) -> GzipSplice {
        const GZIP_HEADER: [u8; 10] = [0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff];
        let mut out = Vec::with_capacity(GZIP_HEADER.len() + capacity + capacity / 8192 + 16);
        out.extend_from_slice(&GZIP_HEADER);
        GzipSplice { out, crc: Hasher::new(), len: 0 }
    }

    /// `bytes` in stored blocks, none final; byte-aligned throughout.
    pub(super) fn plain(&mut self, bytes: &[u8]) {
        for block in bytes.chunks(usize::from(u16::MAX)) {
            // BFINAL 0, BTYPE 00 (stored), then LEN and its complement
            let len = block.len() as u16;
            self.out.push(0);
            self.out.extend_from_slice(&len.to_le_bytes());
            self.out.extend_from_slice(&(!len).to_le_bytes());
            self.out.extend_from_slice(block);
        }
        self.crc.update(bytes);
        self.len += bytes.len() as u64;
    }

    /// A raw DEFLATE stream that ends on a byte boundary, of `len` bytes whose CRC-32 is `crc`.
    pub(super) fn stream(&mut self, stream: &[u8], crc: u32, len: u64) {
        self.out.extend_from_slice(stream);
        self.crc.combine(&Hasher::new_with_initial_len(crc, len));
        self.len += len;
    }

    /// Ends the DEFLATE data with an empty final block, after parts that left it open.
    pub(super) fn close(&mut self) {
        self.out.extend_from_slice(&EMPTY_FINAL_BLOCK);
    }

    pub(super) fn finish(mut self) -> Vec<u8> {
        self.out.extend_from_slice(&self.crc.finalize().to_le_bytes());
        self.out.extend_from_slice(&(self.len as u32).to_le_bytes());
        self.out
    }
}

/// Whether the raw DEFLATE `stream` inflates to exactly `tail`, and ends where its last byte does
/// (a final block left before the sync flush would end it early: a splice would stop there).
fn inflates_to(stream: &[u8], tail: &[u8]) -> bool {
    let mut out = Vec::with_capacity(tail.len());
    let mut inflate = Decompress::new(false);
    let done = inflate.decompress_vec(stream, &mut out, FlushDecompress::Finish);
    matches!(done, Ok(Status::StreamEnd)) && inflate.total_in() == stream.len() as u64 && out == tail
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_that_ends_before_its_last_byte_does_not_inflate_to_its_tail() {
        let tail = br#"{"a":"0x00000000000000000000"}"#.repeat(20);
        let stream = deflate_raw(STORE_LEVEL, &tail).unwrap();
        assert!(inflates_to(&stream, &tail));
        assert!(inflates_to(&continuable(&stream).unwrap(), &tail));
        // the final block left final: what follows it would never be read
        let still_final = [stream.as_slice(), &[0, 0, 0, 0xff, 0xff], &EMPTY_FINAL_BLOCK].concat();
        assert!(!inflates_to(&still_final, &tail));
        assert!(!inflates_to(&stream, &tail[1..]));
    }
}
