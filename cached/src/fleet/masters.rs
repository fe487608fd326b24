//! A breaker per master: a master that keeps failing is skipped for its own slots, while the
//! keys of every other master still reach the fleet. Which master serves which slots comes from
//! `CLUSTER SLOTS`, read again with every new connection; a master read again keeps its breaker,
//! whichever of its ranges. A slot no known master serves (before the first reading, or one the
//! cluster left unassigned) shares one breaker.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use redis::Value;

use super::breaker::{Breaker, State};

/// Redis Cluster's slots: a key's slot is the CRC-16 (XMODEM) of its hash tag, modulo this.
const SLOTS: u16 = 16384;

struct SlotRange {
    first: u16,
    last: u16,
    master: String,
    breaker: Arc<Breaker>,
}

#[derive(Default)]
pub struct Masters {
    /// Sorted by first slot.
    ranges: RwLock<Vec<SlotRange>>,
    unassigned: Arc<Breaker>,
}

impl Masters {
    /// The breaker of the master that serves the key whose hash tag is `tag`.
    pub fn breaker(&self, tag: &[u8]) -> Arc<Breaker> {
        let slot = slot(tag);
        let ranges = self.ranges.read().unwrap_or_else(|e| e.into_inner());
        let at = ranges.partition_point(|range| range.last < slot);
        match ranges.get(at) {
            Some(range) if range.first <= slot => range.breaker.clone(),
            _ => self.unassigned.clone(),
        }
    }

    /// Takes what `CLUSTER SLOTS` answered: which master serves which slots. A reply it cannot
    /// read, or that names no master, leaves what it knew: false.
    pub fn learn(&self, reply: &Value) -> bool {
        let read = slot_masters(reply);
        if read.is_empty() {
            return false;
        }
        let mut ranges = self.ranges.write().unwrap_or_else(|e| e.into_inner());
        let mut breakers: HashMap<String, Arc<Breaker>> =
            ranges.iter().map(|range| (range.master.clone(), range.breaker.clone())).collect();
        let learnt: Vec<SlotRange> = read
            .into_iter()
            .map(|(first, last, master)| {
                let breaker = breakers.entry(master.clone()).or_default().clone();
                SlotRange { first, last, master, breaker }
            })
            .collect();
        *ranges = learnt;
        true
    }

    /// Every breaker's state, each once: the masters', and the unassigned slots' while some are
    /// (once every slot has a master, no key reaches it again, whatever state it was left in).
    pub fn states(&self) -> Vec<State> {
        let ranges = self.ranges.read().unwrap_or_else(|e| e.into_inner());
        let mut breakers: Vec<&Arc<Breaker>> = ranges.iter().map(|range| &range.breaker).collect();
        let covered: usize = ranges.iter().map(|range| usize::from(range.last - range.first) + 1).sum();
        if covered < usize::from(SLOTS) {
            breakers.push(&self.unassigned);
        }
        breakers.sort_by_key(|breaker| Arc::as_ptr(breaker));
        breakers.dedup_by_key(|breaker| Arc::as_ptr(breaker));
        breakers.into_iter().map(|breaker| breaker.state()).collect()
    }
}

pub(super) fn slot(tag: &[u8]) -> u16 {
    crc16::State::<crc16::XMODEM>::calculate(tag) % SLOTS
}

/// (first slot, last slot, master) of each range in a `CLUSTER SLOTS` reply: `[[first, last,
/// [host, port, id, ...], replicas...], ...]`, sorted. A master is named by its node ID (by its
/// host and port without one); a range that does not read as one, or lies outside the slots, is
/// left out; a reply whose ranges overlap, or are more than the slots, is not read at all.
fn slot_masters(reply: &Value) -> Vec<(u16, u16, String)> {
    let Value::Array(ranges) = reply else { return Vec::new() };
    if ranges.len() > usize::from(SLOTS) {
        return Vec::new();
    }
    let slot_number = |value: &Value| match value {
        Value::Int(slot) => u16::try_from(*slot).ok().filter(|slot| *slot < SLOTS),
        _ => None,
    };
    let text = |value: &Value| match value {
        Value::BulkString(bytes) => String::from_utf8(bytes.clone()).ok(),
        Value::SimpleString(text) => Some(text.clone()),
        _ => None,
    };
    let mut read: Vec<(u16, u16, String)> = ranges
        .iter()
        .filter_map(|range| {
            let Value::Array(parts) = range else { return None };
            let (first, last) = (slot_number(parts.first()?)?, slot_number(parts.get(1)?)?);
            let Value::Array(master) = parts.get(2)? else { return None };
            let name = match master.get(2).and_then(text).filter(|id| !id.is_empty()) {
                Some(id) => id,
                None => match (master.first().and_then(text), master.get(1)?) {
                    (Some(host), Value::Int(port)) => format!("{host}:{port}"),
                    _ => return None,
                },
            };
            (first <= last).then_some((first, last, name))
        })
        .collect();
    read.sort_by_key(|(first, _, _)| *first);
    if read.windows(2).any(|pair| pair[0].1 >= pair[1].0) {
        return Vec::new();
    }
    read
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A range served by the master at `host`:`port`, whose node ID is its address's.
    fn range(first: i64, last: i64, host: &str, port: i64) -> Value {
        let id = format!("id of {host}:{port}");
        let node = Value::Array(vec![Value::BulkString(host.into()), Value::Int(port), Value::BulkString(id.into_bytes())]);
        Value::Array(vec![Value::Int(first), Value::Int(last), node])
    }

    /// A hash tag whose slot falls in `slots`.
    fn tag_in(slots: std::ops::RangeInclusive<u16>) -> Vec<u8> {
        (0u32..)
            .map(|n| n.to_string().into_bytes())
            .find(|tag| slots.contains(&slot(tag)))
            .unwrap()
    }


    fn open(breaker: &Breaker) {
        while !breaker.failed() {}
    }

    #[tokio::test(start_paused = true)]
    async fn a_failing_master_opens_its_own_breaker_alone_and_keeps_it_when_read_again() {
        let masters = Masters::default();
        let (low, high) = (tag_in(0..=8191), tag_in(8192..=16383));
        assert!(Arc::ptr_eq(&masters.breaker(&low), &masters.breaker(&high)), "one breaker before the first reading");
        let cluster = Value::Array(vec![range(8192, 16383, "127.0.2.2", 7001), range(0, 8191, "127.0.2.1", 7000)]);
        masters.learn(&cluster);
        open(&masters.breaker(&high));
        assert!(!masters.breaker(&high).allows());
        assert!(masters.breaker(&low).allows(), "the other master's keys still go to the fleet");
        masters.learn(&cluster);
        assert!(!masters.breaker(&high).allows(), "read again, the master keeps its breaker");
        assert_eq!(masters.states().iter().filter(|state| matches!(state, State::Open { .. })).count(), 1);
        // its replica took its slots over: a master of its own, whose breaker is closed
        masters.learn(&Value::Array(vec![range(0, 8191, "127.0.2.1", 7000), range(8192, 16383, "127.0.2.5", 7004)]));
        assert!(masters.breaker(&high).allows());
        assert_eq!(masters.states().len(), 2, "two masters, and no slot unassigned");
    }

    #[tokio::test(start_paused = true)]
    async fn a_master_of_several_ranges_has_one_breaker_for_them_all() {
        let masters = Masters::default();
        let cluster = Value::Array(vec![
            range(0, 99, "127.0.2.1", 7000),
            range(100, 16283, "127.0.2.2", 7001),
            range(16284, 16383, "127.0.2.1", 7000),
        ]);
        masters.learn(&cluster);
        let (first, last) = (tag_in(0..=99), tag_in(16284..=16383));
        assert!(Arc::ptr_eq(&masters.breaker(&first), &masters.breaker(&last)));
        open(&masters.breaker(&first));
        masters.learn(&cluster);
        assert!(!masters.breaker(&last).allows(), "read again, both ranges keep the open breaker");
        assert_eq!(masters.states().len(), 2);
    }

    #[test]
    fn a_reply_that_does_not_read_as_slots_leaves_what_it_knew() {
        let masters = Masters::default();
        masters.learn(&Value::Array(vec![range(0, 16383, "127.0.2.1", 7000)]));
        let whole = masters.breaker(b"any");
        for reply in [
            Value::Nil,
            Value::Array(vec![Value::Int(1)]),
            Value::Array(vec![range(0, 16384, "127.0.2.9", 7000)]),
            Value::Array(vec![range(9, 3, "127.0.2.9", 7000)]),
            Value::Array(vec![range(-1, 3, "127.0.2.9", 7000)]),
            Value::Array(vec![range(0, 200, "127.0.2.8", 7000), range(100, 16383, "127.0.2.9", 7000)]),
        ] {
            masters.learn(&reply);
            assert!(Arc::ptr_eq(&masters.breaker(b"any"), &whole), "{reply:?}");
        }
        // a gap the cluster left unassigned shares the one breaker
        masters.learn(&Value::Array(vec![range(0, 99, "127.0.2.1", 7000)]));
        assert!(Arc::ptr_eq(&masters.breaker(&tag_in(100..=16383)), &masters.unassigned));
    }
}
