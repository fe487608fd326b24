//! A fleet value read back as hostile: whatever bytes a Redis hands back under a key, opening them
//! never panics, and only what this fleet's secret sealed for that key and kind opens, with the
//! entry and expiry it was sealed with. Bytes that were never sealed, a value changed anywhere
//! (cut, extended, bytes flipped), opened under another key, kind or secret: each is refused.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use rpcedge_core::cache::sealed::{Kind, Sealer};
use rpcedge_core::cache::{encode, Entry, Envelope, Head};

#[derive(Arbitrary, Debug)]
enum Read<'a> {
    /// Any bytes at all, as if written by someone without the secret.
    Raw(&'a [u8]),
    /// A value sealed as `sealed_as` for `sealed_for` with `secret_byte`'s secret (an answer's
    /// tail made an entry, or any bytes), then `cut` bytes taken off its end, extended with
    /// `extra`, and bytes of it changed (at an offset, xored).
    Sealed {
        sealed_as: bool,
        sealed_for: [u8; 32],
        secret_byte: u8,
        entry: Content<'a>,
        expires_s: Option<u64>,
        cut: u8,
        extra: &'a [u8],
        damage: Vec<(u16, u8)>,
    },
}

/// What is sealed: an answer's tail made an entry, or any bytes.
#[derive(Arbitrary, Debug)]
enum Content<'a> {
    Tail(&'a [u8]),
    Bytes(&'a [u8]),
}

#[derive(Arbitrary, Debug)]
struct Case<'a> {
    read: Read<'a>,
    /// What the reader opens it as: the kind, the key and its secret's byte.
    as_answer: bool,
    key: [u8; 32],
    secret_byte: u8,
}

fn kind_of(answer: bool) -> Kind {
    if answer {
        Kind::Answer
    } else {
        Kind::Entry
    }
}

fn sealer(byte: u8) -> Sealer {
    Sealer::new(&[byte; Sealer::MIN_SECRET]).expect("a secret of the least length")
}

fuzz_target!(|case: Case| {
    let reader = sealer(case.secret_byte);
    let (kind, key) = (kind_of(case.as_answer), case.key);
    match case.read {
        Read::Raw(bytes) => assert!(reader.open(kind, &key, bytes).is_err(), "unsealed bytes opened"),
        Read::Sealed {
            sealed_as,
            sealed_for,
            secret_byte,
            entry,
            expires_s,
            cut,
            extra,
            damage,
        } => {
            let entry = match entry {
                Content::Tail(tail) => encode(&Envelope::default(), &Head::default(), tail),
                Content::Bytes(bytes) => bytes.to_vec(),
            };
            let sealed = sealer(secret_byte).seal(kind_of(sealed_as), &sealed_for, expires_s, &entry);
            let mut read = sealed[..sealed.len() - usize::from(cut).min(sealed.len())].to_vec();
            read.extend_from_slice(extra);
            for (at, xor) in damage {
                let len = read.len();
                if len > 0 {
                    read[usize::from(at) % len] ^= xor;
                }
            }
            let same =
                read == sealed && sealed_as == case.as_answer && sealed_for == key && secret_byte == case.secret_byte;
            match reader.open(kind, &key, &read) {
                Ok(opened) => {
                    assert!(
                        same,
                        "a value opened that was changed, or sealed for another key, kind or secret"
                    );
                    assert_eq!(opened.entry, &entry[..]);
                    assert_eq!(opened.expires_s, expires_s.filter(|&s| s != 0));
                }
                // What was sealed whole fails only when its entry does not read as one.
                Err(_) => assert!(!same || Entry::decode(&entry).is_err(), "a whole value refused"),
            }
        }
    }
});
