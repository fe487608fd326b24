//! A stored value read back as hostile: whatever bytes a store, the fleet or a hot tier hands
//! back, reading them as an entry and making each hit from it never panics. An entry the store
//! has compacted (each form made and checked) answers every coding with a body that decodes to
//! the plain answer around the client's id; one whose stored bytes were then damaged reads as bad,
//! or still never panics.
#![no_main]

#[path = "../../tests/common/decode.rs"]
mod decoded;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use rpcedge_core::cache::{encode, Entry, Envelope, Head, MinLengths};
use rpcedge_core::Coding;

#[derive(Arbitrary, Debug)]
enum Stored<'a> {
    /// Any bytes at all.
    Raw(&'a [u8]),
    /// An answer's tail (`part` repeated, so that it compresses and the store keeps its forms)
    /// as a host sends it, compacted by the store, then bytes of it changed (at an offset, xored).
    Kept { part: &'a [u8], repeat: u8, damage: Vec<(u16, u8)> },
}

#[derive(Arbitrary, Debug)]
struct Case<'a> {
    stored: Stored<'a>,
    id: &'a str,
    min_length: u16,
}

const HIT_CODINGS: [Coding; 4] = [Coding::Gzip, Coding::Zstd, Coding::Br, Coding::Dcz];

/// Every hit `stored` makes, which must not panic; the hits' bodies when it reads as an entry.
fn hits(stored: &[u8], id: &str, min_length: u64) -> Option<Vec<(Option<Coding>, Vec<u8>)>> {
    let entry = Entry::decode(stored).ok()?;
    let _ = entry.plain_form();
    let _ = entry.compact();
    let made = HIT_CODINGS.iter().map(|&coding| entry.respond(id, &[coding], MinLengths::same(min_length)));
    made.map(|hit| hit.ok().map(|hit| (hit.coding, hit.body))).collect()
}

fuzz_target!(|case: Case| {
    let min_length = u64::from(case.min_length);
    match case.stored {
        Stored::Raw(bytes) => drop(hits(bytes, case.id, min_length)),
        Stored::Kept { part, repeat, damage } => {
            let tail = part.repeat(1 + usize::from(repeat));
            let sent = encode(&Envelope::default(), &Head::default(), &tail);
            let kept = Entry::decode(&sent).and_then(|entry| entry.compact()).expect("the store keeps what a host sends");
            let plain = Entry::decode(&kept).unwrap().respond(case.id, &[], MinLengths::NONE).expect("a kept entry answers plain");
            assert_eq!(plain.body, [Envelope::default().prefix(case.id), tail].concat());
            for (coding, body) in hits(&kept, case.id, 0).expect("a kept entry reads") {
                assert_eq!(decoded::decode(coding, &body), plain.body, "{coding:?}");
            }
            let mut damaged = kept;
            for (at, xor) in damage {
                let len = damaged.len();
                damaged[usize::from(at) % len] ^= xor;
            }
            drop(hits(&damaged, case.id, min_length));
        }
    }
});
