//! What the fleet tier (the cache daemon's, on Redis Cluster) holds under a key: the entry sealed
//! with the key it was stored under and a MAC under the fleet's secret. Every host of a fleet reads
//! what every other host (and anything else that can reach the cluster) wrote, so a value is
//! trusted only once it opens: the MAC says a holder of the secret sealed it, the key inside says
//! it was sealed for this key (a valid value copied under another key is refused), and the entry
//! must read as one. Its tail is not inflated again to check its CRC-32: the daemon that sealed it
//! kept it checked, and the MAC covers every byte since (a CRC guards a store against torn writes;
//! the MAC, against anyone). It lives in the core, beside the entry it seals, so that it is fuzzed
//! with it (`fuzz/fuzz_targets/sealed.rs`).
//!
//! Layout: `MAGIC`, the kind (an entry a store admitted, or a holder's answer shared with the
//! hosts that waited for it), the expiry (Unix seconds, 0: none), the key, the entry, and the
//! HMAC-SHA256 of everything before it.

use super::Entry;
use hmac::{Hmac, Mac};
use sha2::Sha256;

const MAGIC: &[u8; 4] = b"rpf1";
const MAC_LEN: usize = 32;
const HEAD: usize = MAGIC.len() + 1 + 8 + 32;
/// The bytes a sealed value adds to its entry.
pub const OVERHEAD: usize = HEAD + MAC_LEN;

/// What a value is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// An entry the store admitted (final, or with its TTL): any host may keep it.
    Entry = b'e' as isize,
    /// A holder's answer for the hosts that waited on its lock, kept or not: never stored.
    Answer = b'a' as isize,
}

/// Why a value read back was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// Its MAC does not match: not sealed with this fleet's secret, or changed since.
    Mac,
    /// Sealed for another key, or as another kind.
    Key,
    /// Not a value at all (too short, another format, too large), or its entry fails its check.
    Format,
}

impl Refused {
    pub const ALL: [Refused; 3] = [Refused::Mac, Refused::Key, Refused::Format];

    pub fn name(self) -> &'static str {
        match self {
            Refused::Mac => "mac",
            Refused::Key => "key",
            Refused::Format => "format",
        }
    }
}

/// An opened value: its entry and its expiry (Unix seconds, `None`: none).
#[derive(Debug, PartialEq, Eq)]
pub struct Opened<'a> {
    pub entry: &'a [u8],
    pub expires_s: Option<u64>,
}

/// The fleet's secret, as a keyed MAC ready to clone.
#[derive(Clone)]
pub struct Sealer {
    mac: Hmac<Sha256>,
}

impl Sealer {
    /// At least 32 bytes: the MAC is what keeps a foreign value out.
    pub const MIN_SECRET: usize = 32;

    pub fn new(secret: &[u8]) -> Result<Sealer, String> {
        if secret.len() < Self::MIN_SECRET {
            return Err(format!("the fleet secret is {} bytes: at least {} are needed", secret.len(), Self::MIN_SECRET));
        }
        let mac = Hmac::<Sha256>::new_from_slice(secret).map_err(|e| e.to_string())?;
        Ok(Sealer { mac })
    }

    pub fn seal(&self, kind: Kind, key: &[u8; 32], expires_s: Option<u64>, entry: &[u8]) -> Vec<u8> {
        let mut value = Vec::with_capacity(OVERHEAD + entry.len());
        value.extend_from_slice(MAGIC);
        value.push(kind as u8);
        value.extend_from_slice(&expires_s.unwrap_or(0).to_le_bytes());
        value.extend_from_slice(key);
        value.extend_from_slice(entry);
        let mut mac = self.mac.clone();
        mac.update(&value);
        value.extend_from_slice(&mac.finalize().into_bytes());
        value
    }

    /// The entry of `value`, if it was sealed by this fleet as `kind` for `key` and its entry is
    /// whole. Expiry is the caller's to judge.
    pub fn open<'a>(&self, kind: Kind, key: &[u8; 32], value: &'a [u8]) -> Result<Opened<'a>, Refused> {
        if value.len() < OVERHEAD || &value[..MAGIC.len()] != MAGIC {
            return Err(Refused::Format);
        }
        let (sealed, tag) = value.split_at(value.len() - MAC_LEN);
        let mut mac = self.mac.clone();
        mac.update(sealed);
        mac.verify_slice(tag).map_err(|_| Refused::Mac)?;
        let (head, entry) = sealed.split_at(HEAD);
        if head[MAGIC.len()] != kind as u8 || &head[MAGIC.len() + 1 + 8..] != key {
            return Err(Refused::Key);
        }
        Entry::decode(entry).map_err(|_| Refused::Format)?;
        let expires_s = u64::from_le_bytes(head[MAGIC.len() + 1..MAGIC.len() + 9].try_into().expect("8 bytes"));
        Ok(Opened { entry, expires_s: (expires_s != 0).then_some(expires_s) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::{encode, Envelope, Head};

    fn entry() -> Vec<u8> {
        encode(&Envelope::default(), &Head::default(), br#""0x1234"}"#)
    }

    fn sealer(byte: u8) -> Sealer {
        Sealer::new(&[byte; 32]).unwrap()
    }

    #[test]
    fn a_value_opens_only_for_its_key_kind_and_secret_and_only_whole() {
        let (key, other) = ([1; 32], [2; 32]);
        let entry = entry();
        let value = sealer(9).seal(Kind::Entry, &key, Some(1_700_000_000), &entry);
        assert_eq!(value.len(), entry.len() + OVERHEAD);
        let opened = sealer(9).open(Kind::Entry, &key, &value).unwrap();
        assert_eq!((opened.entry, opened.expires_s), (&entry[..], Some(1_700_000_000)));
        assert_eq!(sealer(9).open(Kind::Entry, &other, &value), Err(Refused::Key));
        assert_eq!(sealer(9).open(Kind::Answer, &key, &value), Err(Refused::Key));
        assert_eq!(sealer(8).open(Kind::Entry, &key, &value), Err(Refused::Mac));
        for at in 0..value.len() {
            let mut flipped = value.clone();
            flipped[at] ^= 0x20;
            assert!(sealer(9).open(Kind::Entry, &key, &flipped).is_err(), "a flip at {at}");
        }
        assert_eq!(
            sealer(9).open(Kind::Entry, &key, &value[..value.len() - 1]),
            Err(Refused::Mac)
        );
        assert_eq!(sealer(9).open(Kind::Entry, &key, b"garbage"), Err(Refused::Format));
        assert_eq!(sealer(9).open(Kind::Entry, &key, &[]), Err(Refused::Format));
        let none = sealer(9).seal(Kind::Answer, &key, None, &entry);
        assert_eq!(sealer(9).open(Kind::Answer, &key, &none).unwrap().expires_s, None);
    }

    #[test]
    fn a_sealed_value_that_is_not_an_entry_is_refused() {
        let key = [1; 32];
        let value = sealer(9).seal(Kind::Entry, &key, None, b"not an entry");
        assert_eq!(sealer(9).open(Kind::Entry, &key, &value), Err(Refused::Format));
    }

    #[test]
    fn a_short_secret_is_refused() {
        assert!(Sealer::new(&[0; 31]).is_err());
    }
}
