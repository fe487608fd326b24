//! The cache daemon's HTTP protocol, named once: the core builds its lookups and stores from
//! these, reads the daemon's answers by them, and the daemon (`rpcedge-cached`) serves them.

/// An entry's path: this, then its key in hex ([`LOOKUP_METHOD`] looks it up, [`STORE_METHOD`]
/// stores it).
pub const ENTRIES_PATH: &str = "/v1/entries/";
pub const LOOKUP_METHOD: &str = "GET";
pub const STORE_METHOD: &str = "PUT";
/// A key's release by its holder ([`flight_path`]).
pub const RELEASE_METHOD: &str = "DELETE";
/// A multi-key lookup ([`LOOKUP_PATH`]).
pub const LOOKUP_KEYS_METHOD: &str = "POST";

/// On a store: the namespace of the key (for finality), the seconds the entry is kept, and what
/// must be final before the daemon keeps it (`cache::Final`: a block's number, a transaction's
/// hash, whose block the daemon finds, or a Beacon-chain slot).
pub const NAMESPACE_HEADER: &str = "x-rpcedge-namespace";
pub const TTL_HEADER: &str = "x-rpcedge-ttl";
pub const REQUIRES_FINAL_HEADER: &str = "x-rpcedge-requires-final";
/// On a store that requires a block: that block's hash as the answer names it (`Capture`'s
/// `block_hash`), which the daemon's finality nodes must give the block too.
pub const BLOCK_HASH_HEADER: &str = "x-rpcedge-block-hash";

/// On a lookup's answer: why it missed (a 404), and the seconds an entry has left (a hit).
pub const MISS_HEADER: &str = "x-rpcedge-miss";
/// On a store's refusal: why.
pub const REFUSAL_HEADER: &str = "x-rpcedge-refusal";

/// The path of the entry with this key (in hex).
pub fn entry_path(key_hex: &str) -> String {
    format!("{ENTRIES_PATH}{key_hex}")
}

/// Coalescing: a lookup that sends [`LOCK_HEADER`] (the milliseconds it may hold the key) and
/// misses holds the key's lock, and its 404 says so ([`LOCK_HELD`]), unless another request holds
/// it: then the 404's miss is [`MISS_IN_FLIGHT`], and the request waits for that one's answer with
/// `GET` [`flight_path`]: 200 with the entry that answer stored (whether or not the daemon keeps
/// it), or 404 when the holder released the key without one ([`MISS_RELEASED`]) or its time ran
/// out ([`MISS_TIMEOUT`]). The holder's `PUT` of the key hands its entry to the waiters; a holder
/// with no entry to store (an error, a failed node) releases the key with `DELETE`
/// [`flight_path`]. A holder that does neither loses the lock when its time runs out.
///
/// The locking lookup names its request with [`HOLDER_HEADER`] (16 hex digits), and so does the
/// release: the daemon releases only the flight that request holds, so that a late release never
/// frees a later holder's. A release that comes before its lookup (the request ended while the
/// lookup was on its way) is remembered for [`MAX_LOCK_MS`]: that lookup then holds nothing. A
/// release without the header frees whichever flight the key has.
pub const LOCK_HEADER: &str = "x-rpcedge-lock";
pub const HOLDER_HEADER: &str = "x-rpcedge-holder";
pub const LOCK_HELD: &str = "held";
pub const MISS_IN_FLIGHT: &str = "in_flight";
pub const MISS_RELEASED: &str = "released";
pub const MISS_TIMEOUT: &str = "timeout";
/// The longest a key is held (`cache_lock_timeout`'s bound).
pub const MAX_LOCK_MS: u64 = 60_000;
pub const FLIGHTS_PATH: &str = "/v1/flights/";

/// The path at which the waiters of the key (in hex) wait, and its holder releases it.
pub fn flight_path(key_hex: &str) -> String {
    format!("{FLIGHTS_PATH}{key_hex}")
}

/// Several entries in one round trip (the calls of a batch): `POST` this path with the keys in
/// hex, one per line, at most [`MAX_LOOKUP_KEYS`]; the answer (200, `application/octet-stream`)
/// holds one [`Looked`] per key, in the keys' order.
pub const LOOKUP_PATH: &str = "/v1/lookup";
/// The most keys one lookup takes: the most calls of a batch the cache splits.
pub const MAX_LOOKUP_KEYS: usize = 100;

/// What the daemon found under one key of a multi-key lookup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Looked<'a> {
    /// The entry, and the seconds it has left (`None`: no expiry).
    Hit(&'a [u8], Option<u64>),
    Absent,
    Expired,
    /// A stored value that failed its checks (deleted).
    Bad,
}

/// A [`Looked`] on the wire: its outcome (0 hit, 1 absent, 2 expired, 3 bad), the seconds left
/// (`u64::MAX`: none), the entry's length and the entry; numbers little-endian.
const FRAME_HEAD: usize = 1 + 8 + 4;

impl<'a> Looked<'a> {
    /// Appends this answer to a multi-key lookup's body.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let (outcome, entry, ttl_s) = match *self {
            Looked::Hit(entry, ttl_s) => (0, entry, ttl_s),
            Looked::Absent => (1, &[][..], None),
            Looked::Expired => (2, &[][..], None),
            Looked::Bad => (3, &[][..], None),
        };
        out.push(outcome);
        out.extend_from_slice(&ttl_s.unwrap_or(u64::MAX).to_le_bytes());
        let length = u32::try_from(entry.len()).expect("an entry is at most entry_bound(MAX_ENTRY) bytes");
        out.extend_from_slice(&length.to_le_bytes());
        out.extend_from_slice(entry);
    }

    /// A multi-key lookup's answer, one per key; `None` when it is not one (cut short, an unknown
    /// outcome, trailing bytes).
    pub fn decode_all(mut body: &'a [u8]) -> Option<Vec<Looked<'a>>> {
        let mut found = Vec::new();
        while !body.is_empty() {
            let head = body.get(..FRAME_HEAD)?;
            let ttl_s = u64::from_le_bytes(head[1..9].try_into().ok()?);
            let length = u32::from_le_bytes(head[9..13].try_into().ok()?) as usize;
            let entry = body.get(FRAME_HEAD..FRAME_HEAD.checked_add(length)?)?;
            found.push(match (head[0], length) {
                (0, _) => Looked::Hit(entry, (ttl_s != u64::MAX).then_some(ttl_s)),
                (1, 0) => Looked::Absent,
                (2, 0) => Looked::Expired,
                (3, 0) => Looked::Bad,
                _ => return None,
            });
            body = &body[FRAME_HEAD + length..];
        }
        Some(found)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_multi_key_answer_reads_back_as_written_and_a_damaged_one_not_at_all() {
        let found =
            [Looked::Hit(b"entry", Some(30)), Looked::Absent, Looked::Hit(b"", None), Looked::Expired, Looked::Bad];
        let mut body = Vec::new();
        for looked in &found {
            looked.encode(&mut body);
        }
        assert_eq!(Looked::decode_all(&body).as_deref(), Some(&found[..]));
        assert_eq!(Looked::decode_all(b"").as_deref(), Some(&[][..]));
        for cut in 1..body.len() {
            let decoded = Looked::decode_all(&body[..cut]);
            assert!(decoded.is_none() || decoded.is_some_and(|d| d.len() < found.len()), "cut at {cut}");
        }
        let mut unknown = body.clone();
        unknown[0] = 4;
        assert_eq!(Looked::decode_all(&unknown), None);
        let mut absent_with_bytes = Vec::new();
        Looked::Hit(b"x", None).encode(&mut absent_with_bytes);
        absent_with_bytes[0] = 1;
        assert_eq!(Looked::decode_all(&absent_with_bytes), None);
    }
}
