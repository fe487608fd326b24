//! A witness container's SSZ rendered as a JSON-RPC response as it arrives, for witnesses too
//! large to hold: the JSON of each element goes out as soon as its bytes are in. What it keeps is
//! the offset table of the list being read and the bytes of an element not yet whole. The JSON
//! is [`super::super::jsonrpc_from_ssz`]'s, byte for byte; its length is known only at the end,
//! so it goes out without one.

use super::super::ssz::{write_hex, OFFSET};
use super::super::{jsonrpc_head, TranscodeError};
use super::{WitnessForm, FIELDS};

/// Where the rendering stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    /// Before the container's offsets.
    Container,
    /// Before field `field`'s list: its first offset, or nothing for an empty list.
    List { field: usize },
    /// Before the rest of field `field`'s offset table.
    Offsets { field: usize, count: usize },
    /// Before element `item` of field `field`.
    Element { field: usize, item: usize },
    /// After the last field.
    End,
}

pub struct WitnessRender {
    fields: usize,
    place: Place,
    /// The JSON-RPC envelope's opening, until it goes out with the first bytes rendered.
    head: Vec<u8>,
    /// Where each field's list begins, and the body's end once it is known.
    bounds: Vec<u64>,
    /// The offsets of the list being read, relative to its start, and its end.
    offsets: Vec<u64>,
    /// Bytes received and not yet rendered, from the body's byte `at`.
    pending: Vec<u8>,
    at: u64,
}

impl WitnessRender {
    /// For a response whose envelope is `id` (its raw JSON text, checked here) and `version`.
    pub fn new(form: WitnessForm, id: &[u8], version: &[u8]) -> Result<Self, TranscodeError> {
        let mut head = jsonrpc_head(id, version)?;
        head.push(b'{');
        Ok(WitnessRender {
            fields: form.fields(),
            place: Place::Container,
            head,
            bounds: Vec::new(),
            offsets: Vec::new(),
            pending: Vec::new(),
            at: 0,
        })
    }

    /// The most memory a render holds beside its output: the longest offset table, twice while
    /// it is read, and an element.
    pub fn most_held() -> u64 {
        let table = FIELDS.iter().map(|field| field.max_items * OFFSET).max().expect("fields");
        (2 * table + FIELDS.iter().map(|field| field.max_bytes).max().expect("fields")) as u64
    }

    /// Renders what the next chunk of the SSZ (`end`: its last) completes, onto `out`.
    pub fn feed(&mut self, chunk: &[u8], end: bool, out: &mut Vec<u8>) -> Result<(), TranscodeError> {
        self.pending.extend_from_slice(chunk);
        let mut used = 0;
        while let Some(took) = self.step(used, end, out)? {
            used += took;
        }
        self.pending.drain(..used);
        self.at += used as u64;
        match self.place {
            Place::End if !self.pending.is_empty() => Err(TranscodeError::Ssz("bytes after the witness's last list")),
            Place::End => Ok(()),
            _ if end => Err(TranscodeError::Ssz("a witness cut short")),
            _ => Ok(()),
        }
    }

    /// Takes one step at `pending[used..]`: how many bytes it took, or `None` when it waits for
    /// more (or is at the end).
    fn step(&mut self, used: usize, end: bool, out: &mut Vec<u8>) -> Result<Option<usize>, TranscodeError> {
        let available = &self.pending[used..];
        let position = self.at + used as u64;
        // the end of field `field`'s list, once it is known: the next field's start, or the
        // body's end for the last
        let list_end = |field: usize| match self.bounds.get(field + 1) {
            Some(&next) => Some(next),
            None => end.then_some(position + available.len() as u64),
        };
        match self.place {
            Place::Container => {
                let fixed = self.fields * OFFSET;
                if available.len() < fixed {
                    return Ok(None);
                }
                let bounds: Vec<u64> = available[..fixed].chunks(OFFSET).map(read_offset).collect();
                if bounds[0] != fixed as u64 || bounds.windows(2).any(|pair| pair[0] > pair[1]) {
                    return Err(TranscodeError::Ssz("the witness's offsets"));
                }
                self.bounds = bounds;
                out.append(&mut self.head);
                self.place = Place::List { field: 0 };
                Ok(Some(fixed))
            }
            Place::List { field } if field == self.fields => {
                out.extend_from_slice(b"}}");
                self.place = Place::End;
                Ok(None)
            }
            Place::List { field } => {
                if list_end(field) == Some(position) {
                    open_list(field, out);
                    out.push(b']');
                    self.place = Place::List { field: field + 1 };
                    return Ok(Some(0));
                }
                if available.len() < OFFSET {
                    return Ok(None);
                }
                let first = read_offset(&available[..OFFSET]);
                if first % OFFSET as u64 != 0 || first == 0 {
                    return Err(TranscodeError::Ssz("a list's first offset"));
                }
                if list_end(field).is_some_and(|list_end| position + first > list_end) {
                    return Err(TranscodeError::Ssz("a list's first offset"));
                }
                let count = (first / OFFSET as u64) as usize;
                if count > FIELDS[field].max_items {
                    return Err(TranscodeError::Limit("more elements than the list's limit"));
                }
                self.place = Place::Offsets { field, count };
                Ok(Some(0))
            }
            Place::Offsets { field, count } => {
                if available.len() < count * OFFSET {
                    return Ok(None);
                }
                self.offsets.clear();
                self.offsets.extend(available[..count * OFFSET].chunks(OFFSET).map(read_offset));
                if self.offsets.windows(2).any(|pair| pair[0] > pair[1]) {
                    return Err(TranscodeError::Ssz("a list's offsets"));
                }
                open_list(field, out);
                self.place = Place::Element { field, item: 0 };
                Ok(Some(count * OFFSET))
            }
            Place::Element { field, item } => {
                let stop = match (self.offsets.get(item + 1), list_end(field)) {
                    (Some(&next), list_end)
                        if list_end.map_or(true, |list_end| self.bounds[field] + next <= list_end) =>
                    {
                        self.bounds[field] + next
                    }
                    (Some(_), _) => return Err(TranscodeError::Ssz("a list's offsets")),
                    (None, Some(list_end)) => list_end,
                    (None, None) => return Ok(None),
                };
                let length = stop.checked_sub(position).ok_or(TranscodeError::Ssz("a list's offsets"))? as usize;
                if length > FIELDS[field].max_bytes {
                    return Err(TranscodeError::Limit("an element longer than its limit"));
                }
                if available.len() < length {
                    return Ok(None);
                }
                if item > 0 {
                    out.push(b',');
                }
                write_hex(&available[..length], out);
                self.place = if item + 1 == self.offsets.len() {
                    out.push(b']');
                    Place::List { field: field + 1 }
                } else {
                    Place::Element { field, item: item + 1 }
                };
                Ok(Some(length))
            }
            Place::End => Ok(None),
        }
    }
}

/// Opens field `field`'s array in the witness object.
fn open_list(field: usize, out: &mut Vec<u8>) {
    if field > 0 {
        out.push(b',');
    }
    out.push(b'"');
    out.extend_from_slice(FIELDS[field].name.as_bytes());
    out.extend_from_slice(b"\":[");
}

fn read_offset(bytes: &[u8]) -> u64 {
    u64::from(u32::from_le_bytes(bytes.try_into().expect("4 bytes")))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::transcode::{jsonrpc_from_ssz, jsonrpc_to_ssz, Schema};

    /// `ssz` rendered in chunks cut at `cuts`.
    fn rendered(ssz: &[u8], cuts: &[usize], form: WitnessForm) -> Result<Vec<u8>, TranscodeError> {
        let mut render = WitnessRender::new(form, b"\"a\"", b"2.0")?;
        let (mut out, mut at) = (Vec::new(), 0);
        for &cut in cuts.iter().filter(|&&cut| cut <= ssz.len()) {
            if cut >= at {
                render.feed(&ssz[at..cut], false, &mut out)?;
                at = cut;
            }
        }
        render.feed(&ssz[at..], true, &mut out)?;
        Ok(out)
    }

    fn whole(ssz: &[u8], form: WitnessForm) -> Result<Vec<u8>, TranscodeError> {
        jsonrpc_from_ssz(ssz, Schema::Witness, form, b"\"a\"", b"2.0")
    }

    fn ssz_of(result: &str, form: WitnessForm) -> Vec<u8> {
        let body = format!(r#"{{"jsonrpc":"2.0","id":1,"result":{result}}}"#);
        jsonrpc_to_ssz(body.as_bytes(), Schema::Witness, form).unwrap().ssz
    }

    /// Witnesses with empty lists, empty elements, and a last list of each kind.
    const RESULTS: [&str; 5] = [
        r#"{"state":["0xaabb","0xcc"],"codes":[],"keys":["0x01"],"headers":["0xf9"]}"#,
        r#"{"state":[],"codes":[],"keys":[],"headers":[]}"#,
        r#"{"state":["0x","0x"],"codes":["0x6000"],"keys":[]}"#,
        r#"{"codes":["0x60","0x"],"headers":["0xf9","0x"]}"#,
        r#"{"keys":["0x0102"]}"#,
    ];

    #[test]
    fn every_witness_cut_anywhere_renders_as_it_does_whole() {
        for result in RESULTS {
            for form in [WitnessForm::Lossless, WitnessForm::Eip8025] {
                let ssz = ssz_of(result, form);
                let expected = whole(&ssz, form).unwrap();
                for cut in 0..=ssz.len() {
                    assert_eq!(rendered(&ssz, &[cut], form).unwrap(), expected, "{result} cut at {cut}");
                }
                let every_byte: Vec<usize> = (0..ssz.len()).collect();
                assert_eq!(rendered(&ssz, &every_byte, form).unwrap(), expected);
            }
        }
    }

    #[test]
    fn ssz_that_does_not_render_whole_does_not_render_in_pieces() {
        let ssz = ssz_of(RESULTS[0], WitnessForm::Lossless);
        // every byte of the offsets and the first list changed, the body cut, a byte added
        let mut bodies: Vec<Vec<u8>> = (0..ssz.len().min(40))
            .flat_map(|at| {
                [0x00, 0x01, 0x80, 0xff].map(|value| {
                    let mut body = ssz.clone();
                    body[at] = value;
                    body
                })
            })
            .collect();
        bodies.extend((0..ssz.len()).map(|length| ssz[..length].to_vec()));
        bodies.push([&ssz[..], &[0]].concat());
        bodies.push(ssz_of(&format!(r#"{{"headers":[{}]}}"#, vec![r#""0x01""#; 256].join(",")), WitnessForm::Lossless));
        for body in &bodies {
            let expected = whole(body, WitnessForm::Lossless);
            for cut in [0, 3, 17, body.len() / 2] {
                let got = rendered(body, &[cut], WitnessForm::Lossless);
                assert_eq!(got.is_ok(), expected.is_ok(), "{body:02x?} cut at {cut}: {got:?} vs {expected:?}");
                if let (Ok(got), Ok(expected)) = (got, &expected) {
                    assert!(&got == expected);
                }
            }
        }
    }

    proptest! {
        #[test]
        fn random_witnesses_at_random_cuts_render_as_they_do_whole(
            lists in proptest::collection::vec(proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..40), 0..6), 4),
            cuts in proptest::collection::vec(0usize..2000, 0..8),
        ) {
            let hex = |items: &Vec<Vec<u8>>| items.iter().map(|item| format!("\"0x{}\"", item.iter().map(|b| format!("{b:02x}")).collect::<String>())).collect::<Vec<_>>().join(",");
            let result = format!(r#"{{"state":[{}],"codes":[{}],"headers":[{}],"keys":[{}]}}"#,
                hex(&lists[0]), hex(&lists[1]), hex(&lists[2]), hex(&lists[3].iter().map(|k| k[..k.len().min(32)].to_vec()).collect()));
            let ssz = ssz_of(&result, WitnessForm::Lossless);
            let mut cuts = cuts;
            cuts.sort_unstable();
            prop_assert_eq!(rendered(&ssz, &cuts, WitnessForm::Lossless).unwrap(), whole(&ssz, WitnessForm::Lossless).unwrap());
        }

        #[test]
        fn any_bytes_render_in_pieces_as_they_do_whole(ssz in proptest::collection::vec(any::<u8>(), 0..200), cut in 0usize..200) {
            for form in [WitnessForm::Lossless, WitnessForm::Eip8025] {
                let (got, expected) = (rendered(&ssz, &[cut], form), whole(&ssz, form));
                prop_assert_eq!(got.is_ok(), expected.is_ok());
                if let (Ok(got), Ok(expected)) = (got, expected) {
                    prop_assert_eq!(got, expected);
                }
            }
        }
    }
}
