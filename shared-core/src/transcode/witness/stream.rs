//! A witness's JSON-RPC response transcoded to SSZ as it arrives, for witnesses too large to
//! hold: only the container's lists are kept (the SSZ bytes and where each element begins, about
//! half the JSON), never the JSON.
//!
//! The response is read a unit at a time (an envelope member, a witness member's opening, one
//! element of a field), each with the separator after it, so that a number or a word cut by a
//! chunk's end is never taken for a whole one. A unit that a chunk cuts is carried to the next
//! and read again whole; no unit may be longer than [`UNIT_MAX`]. What is read, and the SSZ, are
//! those of [`super::to_ssz`].

use std::borrow::Cow;

use super::super::json::Scanner;
use super::super::ssz::{ByteLists, OFFSET};
use super::super::{envelope_id, envelope_version, TranscodeError};
use super::{field_index, push_element, write_container_offsets, WitnessForm, FIELDS};

/// The longest unit carried from one chunk to the next: far over a field's longest element
/// (a 64 KiB code is 128 KiB of hex) or a JSON header, so only something that is no witness
/// (a huge unknown member) reaches it.
pub const UNIT_MAX: usize = 1 << 20;

/// How much of the next chunk a cut unit takes at a time to be read again.
const CARRY_STEP: usize = 64 * 1024;

/// Where the reading stands: before which unit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Place {
    /// Before the envelope's `{`.
    Start,
    /// Before a member of the envelope.
    Envelope,
    /// In the witness object, before a member (`first`: or its end).
    Witness { first: bool },
    /// In a field's array (or its object, in the map shape), before an element (`first`: or the end).
    Items { field: usize, map: bool, first: bool },
    /// After the envelope: only whitespace may follow.
    End,
}

/// A witness response being transcoded as it comes.
pub struct WitnessStream {
    form: WitnessForm,
    lists: [ByteLists; 4],
    seen: [bool; 4],
    place: Place,
    /// The start of a unit that the last chunk cut.
    carry: Vec<u8>,
    /// The body's bytes before `carry` (for error positions).
    read: usize,
    /// The carry's length at which to read it again: a long unit cut by small chunks is read
    /// again only each time its carry doubles.
    retry_at: usize,
    id: Option<Vec<u8>>,
    version: Option<Vec<u8>>,
    result: bool,
}

/// A whole witness response as SSZ, with what its envelope said.
pub struct StreamedWitness {
    /// The id's raw JSON text (`null` when there was none).
    pub id: Vec<u8>,
    /// The `jsonrpc` member's value.
    pub version: Vec<u8>,
    pub ssz: WitnessSsz,
}

impl WitnessStream {
    pub fn new(form: WitnessForm) -> Self {
        WitnessStream {
            form,
            lists: Default::default(),
            seen: [false; 4],
            place: Place::Start,
            carry: Vec::new(),
            read: 0,
            retry_at: 0,
            id: None,
            version: None,
            result: false,
        }
    }

    /// The most memory a stream of a `length`-byte body can hold: the lists take at most 4/5 of
    /// the JSON (an element of n bytes is at least the 2n + 5 of `"0x..",` and holds n + 4),
    /// and a cut unit up to [`UNIT_MAX`], twice while it is read again.
    pub fn most_held(length: u64) -> u64 {
        length / 5 * 4 + 4 + 2 * UNIT_MAX as u64
    }

    /// Reads the next chunk of the body (`end`: its last).
    pub fn feed(&mut self, chunk: &[u8], end: bool) -> Result<(), TranscodeError> {
        if !end && self.carry.len() + chunk.len() < self.retry_at {
            return self.keep(chunk);
        }
        // how far the chunk has been read or carried
        let mut at = 0;
        while !self.carry.is_empty() {
            // the cut unit, again, with as much of the chunk as it may need
            let cut = self.carry.len();
            let take = (chunk.len() - at).min(cut.max(CARRY_STEP));
            self.carry.extend_from_slice(&chunk[at..at + take]);
            at += take;
            let mut carry = std::mem::take(&mut self.carry);
            let used = self.read_units(&carry, end && at == chunk.len())?;
            self.read += used;
            if used >= cut {
                // past the cut: go on in the chunk itself
                at -= carry.len() - used;
                carry.clear();
                self.carry = carry;
                break;
            }
            carry.drain(..used);
            self.carry = carry;
            if at == chunk.len() {
                self.retry_at = 2 * self.carry.len();
                return Ok(());
            }
        }
        let rest = &chunk[at..];
        let used = self.read_units(rest, end)?;
        self.read += used;
        self.retry_at = 0;
        self.keep(&rest[used..])
    }

    /// Carries `bytes` of a cut unit to the next chunk, up to the bound on a unit.
    fn keep(&mut self, bytes: &[u8]) -> Result<(), TranscodeError> {
        if self.carry.len() + bytes.len() > UNIT_MAX {
            return Err(TranscodeError::Json { what: "a value of at most 1 MiB", at: self.read });
        }
        self.carry.extend_from_slice(bytes);
        Ok(())
    }

    /// The SSZ, once the whole body is fed.
    pub fn finish(self) -> Result<StreamedWitness, TranscodeError> {
        if self.place != Place::End {
            return Err(TranscodeError::Json { what: "the rest of the response", at: self.read });
        }
        if !self.result {
            return Err(TranscodeError::NoResult);
        }
        let [state, codes, headers, keys] = self.lists;
        let mut lists = vec![state, codes, headers, keys];
        lists.truncate(self.form.fields());
        let mut head = Vec::with_capacity(lists.len() * OFFSET);
        let len = write_container_offsets(&lists, &mut head)?;
        lists.reverse();
        Ok(StreamedWitness {
            id: self.id.unwrap_or_else(|| b"null".to_vec()),
            version: self.version.unwrap_or_else(|| b"2.0".to_vec()),
            ssz: WitnessSsz { head, lists, table: Vec::new(), segments: Vec::new(), segment: Vec::new(), len },
        })
    }

    /// Reads the units that `input` holds whole, returning how far that is; at the body's
    /// `last` bytes everything must be read.
    fn read_units(&mut self, input: &[u8], last: bool) -> Result<usize, TranscodeError> {
        let mut json = Scanner::new(input);
        loop {
            if json.peek().is_none() && !last {
                return Ok(input.len());
            }
            if self.place == Place::End {
                json.end().map_err(|e| self.in_body(e))?;
                return Ok(input.len());
            }
            let start = json.position();
            let marks = self.lists.each_ref().map(ByteLists::mark);
            match self.unit(&mut json) {
                Ok(_) if json.position() - start > UNIT_MAX => {
                    return Err(TranscodeError::Json { what: "a value of at most 1 MiB", at: self.read + start })
                }
                Ok(place) => self.place = place,
                // cut by the chunk's end, maybe: read again with more
                Err(TranscodeError::Json { .. }) if !last && input.len() - start < UNIT_MAX => {
                    for (list, mark) in self.lists.iter_mut().zip(marks) {
                        list.truncate(mark);
                    }
                    return Ok(start);
                }
                Err(e) => return Err(self.in_body(e)),
            }
        }
    }

    /// Reads one unit, returning where that leaves the reading; `self` changes only once the
    /// unit is read whole (but for the lists, which the caller puts back).
    fn unit(&mut self, json: &mut Scanner) -> Result<Place, TranscodeError> {
        match self.place {
            Place::Start => {
                json.expect(b'{', "an object")?;
                Ok(if json.eat(b'}') { Place::End } else { Place::Envelope })
            }
            Place::Envelope => {
                let key = member_key(json)?;
                match &key[..] {
                    b"result" if self.result => Err(json.error("one result")),
                    b"result" => {
                        json.expect(b'{', "an object")?;
                        self.result = true;
                        Ok(Place::Witness { first: true })
                    }
                    b"error" => Err(TranscodeError::NoResult),
                    b"id" => {
                        let id = envelope_id(json)?;
                        let place = after_envelope_member(json)?;
                        self.id = Some(id.to_vec());
                        Ok(place)
                    }
                    b"jsonrpc" => {
                        let version = envelope_version(json)?;
                        let place = after_envelope_member(json)?;
                        self.version = Some(version.into_owned());
                        Ok(place)
                    }
                    _ => {
                        json.value()?;
                        after_envelope_member(json)
                    }
                }
            }
            Place::Witness { first } => {
                if first && json.eat(b'}') {
                    return after_envelope_member(json);
                }
                let key = member_key(json)?;
                let Some(field) = field_index(&key) else {
                    json.value()?;
                    return after_witness_member(json);
                };
                if self.seen[field] {
                    return Err(json.error("a field named twice"));
                }
                let place = match json.peek() {
                    Some(b'{') => {
                        json.eat(b'{');
                        Place::Items { field, map: true, first: true }
                    }
                    // some nodes send `null` for an empty field
                    Some(b'n') if json.value()? == b"null" => after_witness_member(json)?,
                    _ => {
                        json.expect(b'[', "an array")?;
                        Place::Items { field, map: false, first: true }
                    }
                };
                self.seen[field] = true;
                Ok(place)
            }
            Place::Items { field, map, first } => {
                let close = if map { b'}' } else { b']' };
                if first && json.eat(close) {
                    return after_witness_member(json);
                }
                let (limits, list) = (&FIELDS[field], &mut self.lists[field]);
                if map {
                    // (the map shape's values are 0x-hex, its keys their hashes)
                    member_key(json)?;
                    list.push_hex(json, limits.max_items, limits.max_bytes)?;
                } else {
                    push_element(list, field, json)?;
                }
                if json.eat(b',') {
                    Ok(Place::Items { field, map, first: false })
                } else if json.eat(close) {
                    after_witness_member(json)
                } else {
                    Err(json.error(if map { "a comma or the object's end" } else { "a comma or the array's end" }))
                }
            }
            Place::End => unreachable!("a unit after the end"),
        }
    }

    /// An error at a position of the input being read, at its position in the body.
    fn in_body(&self, error: TranscodeError) -> TranscodeError {
        match error {
            TranscodeError::Json { what, at } => TranscodeError::Json { what, at: self.read + at },
            other => other,
        }
    }
}

fn member_key<'a>(json: &mut Scanner<'a>) -> Result<Cow<'a, [u8]>, TranscodeError> {
    let key = json.string()?;
    json.expect(b':', "a colon")?;
    Ok(key)
}

fn after_witness_member(json: &mut Scanner) -> Result<Place, TranscodeError> {
    if json.eat(b',') {
        Ok(Place::Witness { first: false })
    } else if json.eat(b'}') {
        after_envelope_member(json)
    } else {
        Err(json.error("a comma or the object's end"))
    }
}

fn after_envelope_member(json: &mut Scanner) -> Result<Place, TranscodeError> {
    if json.eat(b',') {
        Ok(Place::Envelope)
    } else if json.eat(b'}') {
        Ok(Place::End)
    } else {
        Err(json.error("a comma or the object's end"))
    }
}

/// A witness container's serialization, handed out piece by piece, each freed once the next is
/// asked for: the container's offsets, then each list's offset table and its elements' segments.
pub struct WitnessSsz {
    /// The container's offsets, until they are out.
    head: Vec<u8>,
    /// The lists still to go, the next one last.
    lists: Vec<ByteLists>,
    /// The offset table going out.
    table: Vec<u8>,
    /// The segments of the list going out still to go, the next one last, and the one out.
    segments: Vec<Vec<u8>>,
    segment: Vec<u8>,
    len: u64,
}

impl WitnessSsz {
    /// The serialization's length.
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The next piece, and whether it is the last; `None` once all is out.
    pub fn next_piece(&mut self) -> Option<(&[u8], bool)> {
        self.table.clear();
        loop {
            if let Some(segment) = self.segments.pop() {
                self.segment = segment;
                if !self.segment.is_empty() {
                    return Some((&self.segment, self.is_out()));
                }
                continue;
            }
            self.segment = Vec::new();
            let list = self.lists.pop()?;
            self.table.append(&mut self.head);
            list.write_offsets(&mut self.table).expect("the container's offsets were checked");
            self.segments = list.into_segments();
            self.segments.reverse();
            if !self.table.is_empty() {
                return Some((&self.table, self.is_out()));
            }
        }
    }

    /// All is out but pieces with nothing in them.
    fn is_out(&self) -> bool {
        self.segments.iter().all(Vec::is_empty) && self.lists.iter().all(|list| list.len() == 0)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::transcode::{jsonrpc_to_ssz, Schema};

    /// The envelope's id and version, and the SSZ.
    type Read = Result<(Vec<u8>, Vec<u8>, Vec<u8>), TranscodeError>;

    /// `body` streamed in chunks cut at `cuts`.
    fn streamed(body: &[u8], cuts: &[usize], form: WitnessForm) -> Read {
        let mut stream = WitnessStream::new(form);
        let mut at = 0;
        for &cut in cuts.iter().filter(|&&cut| cut <= body.len()) {
            if cut >= at {
                stream.feed(&body[at..cut], false)?;
                at = cut;
            }
        }
        stream.feed(&body[at..], true)?;
        let StreamedWitness { id, version, mut ssz } = stream.finish()?;
        let mut out = Vec::new();
        while let Some((piece, last)) = ssz.next_piece() {
            out.extend_from_slice(piece);
            assert_eq!(last, out.len() as u64 == ssz.len());
        }
        assert_eq!(out.len() as u64, ssz.len());
        Ok((id, version, out))
    }

    fn whole(body: &[u8], form: WitnessForm) -> Read {
        jsonrpc_to_ssz(body, Schema::Witness, form).map(|r| (r.id.to_vec(), r.version.into_owned(), r.ssz))
    }

    /// Witness responses of every shape the transcoder reads, and some it refuses.
    const BODIES: [&str; 12] = [
        r#"{"jsonrpc":"2.0","id":1,"result":{"state":["0xaabb","0xcc"],"codes":[],"keys":["0x01"],"headers":["0xf9"]}}"#,
        r#" { "result" : { "headers" : [ ] , "state" : { "0x01" : "0xAB" , "0x02":"0x" } , "x" : [1, {"y": null}] } , "id" : "a\"b" , "jsonrpc" : "2.0" } "#,
        r#"{"id":12345,"result":{"state":null,"codes":["0x6000"],"keys":null}}"#,
        r#"{"result":{}}"#,
        r#"{"jsonrpc":"2.0","id":1,"error":{"code":-32000,"message":"no"}}"#,
        r#"{"jsonrpc":"2.0","id":1}"#,
        r#"{"result":{"state":["0xaa"]},"result":{}}"#,
        r#"{"result":{"state":["0xaa"],"state":[]}}"#,
        r#"{"result":{"state":["0xaa",]}}"#,
        r#"{"result":{"state":["0xa"]}}"#,
        r#"{"result":{"state":["0xaa"]}} x"#,
        r#"{"result":{"state":["0xaa"]}"#,
    ];

    #[test]
    fn every_body_cut_anywhere_reads_as_it_does_whole() {
        for body in BODIES {
            let body = body.as_bytes();
            for form in [WitnessForm::Lossless, WitnessForm::Eip8025] {
                let expected = whole(body, form);
                for cut in 0..=body.len() {
                    assert_eq!(
                        streamed(body, &[cut], form),
                        expected,
                        "{} cut at {cut}",
                        String::from_utf8_lossy(body)
                    );
                }
                let every_byte: Vec<usize> = (0..body.len()).collect();
                assert_eq!(streamed(body, &every_byte, form), expected);
            }
        }
    }

    #[test]
    fn a_json_header_cut_anywhere_is_read_whole() {
        let header = crate::transcode::tests::json_header(|_| ());
        let body = format!(r#"{{"id":1,"result":{{"headers":[{header},"0xf9"],"state":[]}}}}"#);
        let expected = whole(body.as_bytes(), WitnessForm::Lossless);
        assert!(expected.is_ok());
        for cut in 0..=body.len() {
            assert_eq!(streamed(body.as_bytes(), &[cut], WitnessForm::Lossless), expected, "cut at {cut}");
        }
    }

    #[test]
    fn a_unit_longer_than_its_bound_is_refused_and_a_code_is_not_one() {
        let code = format!("0x{}", "ab".repeat(64 * 1024));
        let body = format!(r#"{{"id":1,"result":{{"codes":["{code}"]}}}}"#);
        let cuts: Vec<usize> = (0..body.len()).step_by(1000).collect();
        assert_eq!(
            streamed(body.as_bytes(), &cuts, WitnessForm::Lossless),
            whole(body.as_bytes(), WitnessForm::Lossless)
        );
        let junk = format!(r#"{{"id":1,"junk":"{}","result":{{}}}}"#, "x".repeat(UNIT_MAX));
        let cuts: Vec<usize> = (0..junk.len()).step_by(4096).collect();
        assert!(matches!(streamed(junk.as_bytes(), &cuts, WitnessForm::Lossless), Err(TranscodeError::Json { .. })));
    }

    #[test]
    fn lists_past_a_segment_cut_anywhere_give_the_ssz_of_the_whole() {
        let items: Vec<String> = (0..5000u32).map(|i| hex(&[i as u8; 500])).collect();
        let body = format!(r#"{{"id":1,"result":{{"state":[{}],"keys":[{}]}}}}"#, items.join(","), hex(&[7; 20]));
        let expected = whole(body.as_bytes(), WitnessForm::Lossless);
        let (_, _, ssz) = expected.as_ref().unwrap();
        assert!(ssz.len() > 2 << 20, "past two segments");
        for step in [997, 4096, 65_537] {
            let cuts: Vec<usize> = (0..body.len()).step_by(step).collect();
            assert!(streamed(body.as_bytes(), &cuts, WitnessForm::Lossless) == expected, "cut every {step}");
        }
    }

    fn hex(bytes: &[u8]) -> String {
        format!("\"0x{}\"", bytes.iter().map(|b| format!("{b:02x}")).collect::<String>())
    }

    proptest! {
        #[test]
        fn any_witness_cut_anywhere_is_the_ssz_of_the_whole(
            fields in prop::collection::vec(prop::collection::vec(prop::collection::vec(any::<u8>(), 0..40), 0..6), 4),
            space in prop::sample::select(vec!["", " ", "\n  "]),
            mut cuts in prop::collection::vec(0usize..600, 0..12),
        ) {
            let names = ["state", "codes", "keys", "headers"];
            let members: Vec<String> = names.iter().zip(&fields).map(|(name, items)| {
                let items: Vec<String> = items.iter().map(|item| hex(item)).collect();
                format!("{space}\"{name}\"{space}:{space}[{}]", items.join(&format!(",{space}")))
            }).collect();
            let body = format!(r#"{{"jsonrpc":"2.0","id":7,"result":{{{}}}}}"#, members.join(","));
            cuts.sort();
            for form in [WitnessForm::Lossless, WitnessForm::Eip8025] {
                prop_assert_eq!(streamed(body.as_bytes(), &cuts, form), whole(body.as_bytes(), form));
            }
        }
    }
}
