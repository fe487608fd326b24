//! The hot tier: recent hits kept in the proxy's own memory, in front of the daemon, so that a
//! hot key costs no trip to it. The host gives a region of bytes (nginx: a shared memory zone,
//! used under the zone's lock; Envoy: a buffer per worker) and this module lays it out:
//!
//! - a head: a magic number, the region's length, the number of slots, the write position;
//! - slots, an open-addressed index (a short probe window): a key's tag, where its record is and
//!   when it expires;
//! - a ring of records (the key, the entry's length, the entry), written in order and never
//!   wrapped: a record is intact while the write position has not come round to it again, so
//!   eviction is first in, first out and needs no bookkeeping.
//!
//! Entries come from the daemon's hits only (the daemon has admitted them), and are kept at most
//! `MAX_AGE_S`, so that a delete at the daemon reaches every proxy within that time.

use super::Key;

/// The longest an entry stays here, whatever its own expiry.
pub const MAX_AGE_S: u64 = 60;

const MAGIC: u64 = u64::from_le_bytes(*b"rpcHot01");
const HEAD: usize = 32;
const SLOT: usize = 32;
const RECORD_HEAD: usize = 32 + 8;
/// Slots probed for a key, from its home slot on.
const PROBE: usize = 8;
/// One slot per this many bytes of region: entries of a few KiB are the common case.
const BYTES_PER_SLOT: usize = 2048;
/// An entry larger than this share of the ring is not kept: it would push out too many others.
const ENTRY_SHARE: usize = 8;

/// The smallest region a hot tier takes.
pub const MIN_REGION: usize = 64 * 1024;

/// A region laid out as a hot tier.
pub struct HotTier<'a> {
    region: &'a mut [u8],
    slots: usize,
}

#[derive(Clone, Copy)]
struct Slot {
    tag: u64,
    /// The record's absolute position in the ring, plus one; 0 for an empty slot.
    at: u64,
    expires_s: u64,
}

impl<'a> HotTier<'a> {
    /// The hot tier in `region`, laid out anew unless it holds one of the same shape already (a
    /// zone that outlived a reload); `None` when the region is too small.
    pub fn open(region: &'a mut [u8]) -> Option<HotTier<'a>> {
        if region.len() < MIN_REGION {
            return None;
        }
        let slots = (region.len() / BYTES_PER_SLOT).max(PROBE);
        let mut tier = HotTier { region, slots };
        if tier.word(0) != MAGIC || tier.word(8) != tier.region.len() as u64 || tier.word(16) != slots as u64 {
            tier.region[..HEAD + slots * SLOT].fill(0);
            let len = tier.region.len() as u64;
            tier.set_word(0, MAGIC);
            tier.set_word(8, len);
            tier.set_word(16, slots as u64);
        }
        Some(tier)
    }

    /// The entry kept under `key`, unless it has expired or been overwritten.
    pub fn find(&self, key: &Key, now_s: u64) -> Option<&[u8]> {
        self.find_until(key, now_s).map(|(entry, _)| entry)
    }

    /// The same, with the second at which the entry expires.
    pub fn find_until(&self, key: &Key, now_s: u64) -> Option<(&[u8], u64)> {
        let tag = tag(key);
        self.window(tag).find_map(|index| {
            let slot = self.slot(index);
            let entry = (slot.tag == tag && slot.expires_s > now_s).then(|| self.record(slot, key)).flatten();
            entry.map(|entry| (entry, slot.expires_s))
        })
    }

    /// Keeps `entry` under `key` for `ttl_s` (at most `MAX_AGE_S`) from `now_s`; an entry too
    /// large for the ring is not kept.
    pub fn keep(&mut self, key: &Key, entry: &[u8], now_s: u64, ttl_s: u64) {
        let extent = (RECORD_HEAD + entry.len()).next_multiple_of(8);
        let ring = self.ring_len();
        if extent > ring / ENTRY_SHARE {
            return;
        }
        let tag = tag(key);
        // The slot to take: this key's own, else a free one, else the oldest in the window.
        let index = self
            .window(tag)
            .find(|&i| self.slot(i).tag == tag && self.record(self.slot(i), key).is_some())
            .or_else(|| {
                let free = |slot: Slot| slot.expires_s <= now_s || self.record_at(slot).is_none();
                self.window(tag).find(|&i| free(self.slot(i)))
            })
            .or_else(|| self.window(tag).min_by_key(|&i| self.slot(i).at))
            .expect("the window is not empty");
        let mut position = self.word(24);
        if position % ring as u64 + extent as u64 > ring as u64 {
            // never wrap a record: start the next lap
            position = position.next_multiple_of(ring as u64);
        }
        let offset = self.ring_start() + (position % ring as u64) as usize;
        let record = &mut self.region[offset..offset + RECORD_HEAD + entry.len()];
        record[..32].copy_from_slice(&key.0);
        record[32..RECORD_HEAD].copy_from_slice(&(entry.len() as u64).to_le_bytes());
        record[RECORD_HEAD..].copy_from_slice(entry);
        self.set_word(24, position + extent as u64);
        self.set_slot(index, Slot { tag, at: position + 1, expires_s: now_s + ttl_s.min(MAX_AGE_S) });
    }

    fn window(&self, tag: u64) -> impl Iterator<Item = usize> {
        let (home, slots) = ((tag % self.slots as u64) as usize, self.slots);
        (0..PROBE).map(move |i| (home + i) % slots)
    }

    /// The record a slot points to, when it is still intact, as (its key, its entry).
    fn record_at(&self, slot: Slot) -> Option<(&[u8], &[u8])> {
        let (position, ring) = (slot.at.checked_sub(1)?, self.ring_len() as u64);
        let written = self.word(24);
        if position > written || written - position > ring {
            return None;
        }
        let record = &self.region[self.ring_start() + (position % ring) as usize..];
        let len = u64::from_le_bytes(record.get(32..RECORD_HEAD)?.try_into().ok()?);
        let entry = record.get(RECORD_HEAD..)?.get(..usize::try_from(len).ok()?)?;
        Some((&record[..32], entry))
    }

    fn record(&self, slot: Slot, key: &Key) -> Option<&[u8]> {
        self.record_at(slot).filter(|(stored, _)| *stored == key.0).map(|(_, entry)| entry)
    }

    fn ring_start(&self) -> usize {
        HEAD + self.slots * SLOT
    }

    fn ring_len(&self) -> usize {
        self.region.len() - self.ring_start()
    }

    fn slot(&self, index: usize) -> Slot {
        let at = HEAD + index * SLOT;
        Slot { tag: self.word(at), at: self.word(at + 8), expires_s: self.word(at + 16) }
    }

    fn set_slot(&mut self, index: usize, slot: Slot) {
        let at = HEAD + index * SLOT;
        self.set_word(at, slot.tag);
        self.set_word(at + 8, slot.at);
        self.set_word(at + 16, slot.expires_s);
    }

    fn word(&self, at: usize) -> u64 {
        u64::from_le_bytes(self.region[at..at + 8].try_into().expect("8 bytes"))
    }

    fn set_word(&mut self, at: usize, value: u64) {
        self.region[at..at + 8].copy_from_slice(&value.to_le_bytes());
    }
}

fn tag(key: &Key) -> u64 {
    // a SHA-256 digest: its first bytes are as good a hash as any
    u64::from_le_bytes(key.0[..8].try_into().expect("8 bytes"))
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use proptest::prelude::*;

    use super::*;

    fn key(n: u64) -> Key {
        // spread like a digest, but with chosen collisions possible through `n`
        let mut key = [0; 32];
        key[..8].copy_from_slice(&n.wrapping_mul(0x9e37_79b9_7f4a_7c15).to_le_bytes());
        key[8..16].copy_from_slice(&n.to_le_bytes());
        Key(key)
    }

    #[test]
    fn an_entry_kept_is_found_until_it_expires() {
        let mut region = vec![0; MIN_REGION];
        let mut hot = HotTier::open(&mut region).unwrap();
        hot.keep(&key(1), b"one", 100, 10);
        assert_eq!(hot.find(&key(1), 100), Some(&b"one"[..]));
        assert_eq!(hot.find(&key(1), 109), Some(&b"one"[..]));
        assert_eq!(hot.find(&key(1), 110), None, "expired");
        assert_eq!(hot.find(&key(2), 100), None);
        hot.keep(&key(3), b"three", 100, u64::MAX);
        assert_eq!(hot.find(&key(3), 100 + MAX_AGE_S - 1), Some(&b"three"[..]));
        assert_eq!(hot.find(&key(3), 100 + MAX_AGE_S), None, "kept at most MAX_AGE_S");
    }

    #[test]
    fn a_key_kept_again_has_its_new_entry() {
        let mut region = vec![0; MIN_REGION];
        let mut hot = HotTier::open(&mut region).unwrap();
        hot.keep(&key(1), b"old", 0, 10);
        hot.keep(&key(1), b"new", 0, 10);
        assert_eq!(hot.find(&key(1), 0), Some(&b"new"[..]));
    }

    #[test]
    fn too_small_a_region_or_too_large_an_entry_is_refused() {
        assert!(HotTier::open(&mut vec![0; MIN_REGION - 1]).is_none());
        let mut region = vec![0; MIN_REGION];
        let mut hot = HotTier::open(&mut region).unwrap();
        hot.keep(&key(1), &vec![7; MIN_REGION / ENTRY_SHARE], 0, 10);
        assert_eq!(hot.find(&key(1), 0), None);
    }

    #[test]
    fn a_region_of_the_same_shape_keeps_its_entries_when_opened_again() {
        let mut region = vec![0; MIN_REGION];
        HotTier::open(&mut region).unwrap().keep(&key(1), b"one", 0, 10);
        assert_eq!(HotTier::open(&mut region).unwrap().find(&key(1), 0), Some(&b"one"[..]));
        let mut larger = region.clone();
        larger.resize(2 * MIN_REGION, 0);
        assert_eq!(HotTier::open(&mut larger).unwrap().find(&key(1), 0), None, "another shape: laid out anew");
    }

    #[test]
    fn the_oldest_entries_go_first_when_the_ring_is_full() {
        let mut region = vec![0; MIN_REGION];
        let mut hot = HotTier::open(&mut region).unwrap();
        let entry = vec![1; 1000];
        for n in 0..200 {
            hot.keep(&key(n), &entry, 0, 10);
        }
        let kept: Vec<u64> = (0..200).filter(|&n| hot.find(&key(n), 0).is_some()).collect();
        assert!(!kept.is_empty() && kept.len() < 200);
        assert!(kept.contains(&199), "the newest stays");
        assert!(!kept.contains(&0), "the oldest went");
    }

    proptest! {
        /// Whatever was kept, in whatever order: a find gives the last entry kept for that key,
        /// or nothing, never another key's entry or a torn one.
        #[test]
        fn a_find_gives_the_last_entry_kept_or_none(
            keeps in prop::collection::vec((0u64..64, 0usize..6000, any::<u8>()), 1..300),
        ) {
            let mut region = vec![0; MIN_REGION];
            let mut hot = HotTier::open(&mut region).unwrap();
            let mut last = HashMap::new();
            for (n, len, byte) in keeps {
                let entry: Vec<u8> = (0..len).map(|i| byte.wrapping_add(i as u8)).collect();
                hot.keep(&key(n), &entry, 0, 10);
                if len + RECORD_HEAD <= hot.ring_len() / ENTRY_SHARE {
                    last.insert(n, entry);
                } else {
                    last.remove(&n);
                }
                for (n, entry) in &last {
                    if let Some(found) = hot.find(&key(*n), 0) {
                        prop_assert_eq!(found, entry.as_slice());
                    }
                }
            }
        }
    }
}
