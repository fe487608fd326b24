//! Coalescing (`protocol::LOCK_HEADER`): the keys whose answer one request is getting from the node,
//! and the requests that wait for it. The answer a holder hands over (its `PUT`) goes to every
//! request that waited, whether or not the store keeps it: it is the node's answer of that moment.
//! Until the store has settled it (kept or refused it), a miss of the key gets it too: without
//! that, the misses between the answer and its store would each go to the node. Nothing but an
//! entry is handed over, so a failed node never answers the waiters: a release, or the lock's time
//! running out, sends each of them to the node itself, and tells it which of the two it was (a
//! waiter is told "released" only when the holder released the key).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use rpcedge_core::cache::protocol;
use tokio::sync::watch;
use tokio::time::Instant;

/// How long a flight whose time ran out is kept for the waiters told to wait that have not come
/// yet (a loaded host's late `GET /v1/flights`): they are told their time ran out, not that the
/// holder released a key it never released.
const LATE_WAITERS: Duration = Duration::from_secs(10);
/// How long a release whose lookup has not come is remembered (`protocol::MAX_LOCK_MS`), and how
/// many at most: past that, such a lookup holds its key until its lock runs out, as without one.
const LEFT_FOR: Duration = Duration::from_millis(protocol::MAX_LOCK_MS);
const MAX_LEFT: usize = 1 << 16;

/// How a flight ended, for its waiters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Landing {
    /// The entry its holder stored.
    Entry(Bytes),
    /// Released without one (a host's `DELETE`, another host's holder that published nothing), or
    /// never there.
    Released,
    /// Its time ran out first: this host's lock, or the fleet's lock of another host's holder.
    TimedOut,
}

/// What a lookup that missed does about the key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lock {
    /// It holds the key: its answer is the waiters'.
    Held,
    /// Another request holds it, or has just handed its answer over: wait for that answer.
    InFlight,
    /// The request whose lookup this is released the key before it came (its client left): it
    /// holds nothing, and waits for nothing.
    Left,
}

struct Flight {
    /// Which flight of the key this is: a late release of an earlier one leaves it alone.
    number: u64,
    /// The request that holds it, where its lookup named one (`protocol::HOLDER_HEADER`).
    holder: Option<u64>,
    deadline: Instant,
    /// `None` while in flight.
    landing: watch::Sender<Option<Landing>>,
    /// Lookups told to wait that have not yet had their answer.
    waiters: usize,
    /// The store is done with the answer (or there is none): the flight goes with its last waiter.
    settled: bool,
}

/// Counters of `/metrics`.
#[derive(Default)]
pub struct FlightCounters {
    /// Keys a lookup came to hold.
    pub held: AtomicU64,
    /// Waiters answered with the holder's entry.
    pub shared: AtomicU64,
    /// Waiters sent to the node: released, or out of time.
    pub released: AtomicU64,
    pub timed_out: AtomicU64,
}

#[derive(Default)]
pub struct Flights {
    flights: Mutex<HashMap<[u8; 32], Flight>>,
    /// The holders that released their key before their lookup came, until when.
    left: Mutex<HashMap<u64, Instant>>,
    numbers: AtomicU64,
    pub counters: FlightCounters,
}

impl Flights {
    /// A lookup of `key` missed and asks to hold it for `hold`, for the request `holder` names.
    pub fn lock(&self, key: [u8; 32], hold: Duration, holder: Option<u64>) -> Lock {
        let now = Instant::now();
        if let Some(holder) = holder {
            let mut left = self.left.lock().unwrap_or_else(|e| e.into_inner());
            if left.remove(&holder).is_some_and(|until| until > now) {
                return Lock::Left;
            }
        }
        let mut flights = self.flights.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(flight) = flights.get_mut(&key).filter(|flight| flight.deadline > now) {
            if !matches!(*flight.landing.borrow(), Some(Landing::Released | Landing::TimedOut)) {
                flight.waiters += 1;
                return Lock::InFlight;
            }
        }
        let number = self.numbers.fetch_add(1, Ordering::Relaxed);
        let (landing, _) = watch::channel(None);
        flights.insert(key, Flight { number, holder, deadline: now + hold, landing, waiters: 0, settled: false });
        self.counters.held.fetch_add(1, Ordering::Relaxed);
        Lock::Held
    }

    /// The holder of `key` waits for the answer instead of getting it (another host's holder is
    /// getting it, for the whole fleet).
    pub fn join(&self, key: &[u8; 32]) {
        let mut flights = self.flights.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(flight) = flights.get_mut(key) {
            flight.waiters += 1;
        }
    }

    /// Whether requests wait for the answer to `key` (a waiter that comes later is counted from
    /// its lookup on).
    pub fn has_waiters(&self, key: &[u8; 32]) -> bool {
        let flights = self.flights.lock().unwrap_or_else(|e| e.into_inner());
        flights.get(key).is_some_and(|flight| flight.waiters > 0)
    }

    /// The holder of `key` sent `entry` to be stored (or released the key: `None`): its waiters
    /// get it. A released key is settled at once; an entry once the store is done with it.
    pub fn land(&self, key: &[u8; 32], entry: Option<Bytes>) {
        let mut flights = self.flights.lock().unwrap_or_else(|e| e.into_inner());
        match entry {
            Some(entry) => {
                land_in(&mut flights, key, Landing::Entry(entry));
            }
            None => {
                land_in(&mut flights, key, Landing::Released);
                settle_in(&mut flights, key);
            }
        }
    }

    /// A host's release of `key` (its `DELETE`) by the request `holder` names (none: whichever
    /// holds it): the flight that request holds, still in flight, lands released, and its waiters
    /// go to the node. Whether it did; a named release that finds no flight of its holder's is
    /// remembered, as its lookup may still be on its way (`Lock::Left`).
    pub fn release(&self, key: &[u8; 32], holder: Option<u64>) -> bool {
        let mut flights = self.flights.lock().unwrap_or_else(|e| e.into_inner());
        match flights.get_mut(key) {
            Some(flight) if holder.is_none() || flight.holder == holder => {
                let released = land_in(&mut flights, key, Landing::Released);
                if released {
                    settle_in(&mut flights, key);
                }
                released
            }
            _ => {
                drop(flights);
                if let Some(holder) = holder {
                    let mut left = self.left.lock().unwrap_or_else(|e| e.into_inner());
                    if left.len() < MAX_LEFT {
                        left.insert(holder, Instant::now() + LEFT_FOR);
                    }
                }
                false
            }
        }
    }

    /// The lock that `key`'s waiters follow (another host's holder's, in the fleet) ran out of time
    /// before its own: they are told so now, go to their node, and the next miss holds the key.
    pub fn time_out(&self, key: &[u8; 32]) {
        let mut flights = self.flights.lock().unwrap_or_else(|e| e.into_inner());
        land_in(&mut flights, key, Landing::TimedOut);
        settle_in(&mut flights, key);
    }

    /// The store has kept (or refused) what landed for `key`: a miss now finds it there, or goes
    /// to the node.
    pub fn settle(&self, key: &[u8; 32]) {
        settle_in(&mut self.flights.lock().unwrap_or_else(|e| e.into_inner()), key);
    }

    /// A waiter of `key`: the holder's answer, once it lands or the lock's time runs out.
    pub async fn wait(&self, key: &[u8; 32]) -> Landing {
        let (number, deadline, mut landing) = {
            let flights = self.flights.lock().unwrap_or_else(|e| e.into_inner());
            let Some(flight) = flights.get(key) else { return Landing::Released };
            (flight.number, flight.deadline, flight.landing.subscribe())
        };
        let landed = tokio::time::timeout_at(deadline, landing.wait_for(Option::is_some)).await;
        let landed = match landed {
            Ok(Ok(landed)) => landed.clone().unwrap_or(Landing::Released),
            Ok(Err(_)) => Landing::Released,
            Err(_) => Landing::TimedOut,
        };
        self.left(key, number);
        let counter = match landed {
            Landing::Entry(_) => &self.counters.shared,
            Landing::Released => &self.counters.released,
            Landing::TimedOut => &self.counters.timed_out,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        landed
    }

    /// A waiter of flight `number` of `key` has had its answer: the flight goes with its last one.
    fn left(&self, key: &[u8; 32], number: u64) {
        let mut flights = self.flights.lock().unwrap_or_else(|e| e.into_inner());
        let Some(flight) = flights.get_mut(key).filter(|flight| flight.number == number) else { return };
        flight.waiters = flight.waiters.saturating_sub(1);
        if flight.waiters == 0 && (flight.settled || flight.deadline <= Instant::now()) {
            flights.remove(key);
        }
    }

    /// Drops the flights whose time ran out (their waiters have given up by then too), those with
    /// waiters yet to come `LATE_WAITERS` later.
    pub fn sweep(&self) {
        let now = Instant::now();
        self.flights
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|_, flight| flight.deadline > now || (flight.waiters > 0 && flight.deadline + LATE_WAITERS > now));
        self.left.lock().unwrap_or_else(|e| e.into_inner()).retain(|_, until| *until > now);
    }

    /// Keys in flight, or landed and not yet settled, or with waiters still to serve.
    pub fn len(&self) -> usize {
        self.flights.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

/// The first landing of `key`'s flight is the one its waiters get: whether `landing` is it.
fn land_in(flights: &mut HashMap<[u8; 32], Flight>, key: &[u8; 32], landing: Landing) -> bool {
    let Some(flight) = flights.get_mut(key) else { return false };
    if flight.landing.borrow().is_some() {
        return false;
    }
    flight.landing.send_replace(Some(landing));
    true
}

/// What landed for `key` is settled: its flight goes with its last waiter.
fn settle_in(flights: &mut HashMap<[u8; 32], Flight>, key: &[u8; 32]) {
    let Some(flight) = flights.get_mut(key).filter(|flight| flight.landing.borrow().is_some()) else { return };
    flight.settled = true;
    if flight.waiters == 0 {
        flights.remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: [u8; 32] = [7; 32];
    const HOLD: Duration = Duration::from_secs(5);

    #[tokio::test]
    async fn the_holders_entry_goes_to_every_waiter_even_one_that_comes_after_it_landed() {
        let flights = Flights::default();
        assert_eq!(flights.lock(KEY, HOLD, None), Lock::Held);
        assert_eq!(flights.lock(KEY, HOLD, None), Lock::InFlight);
        assert_eq!(flights.lock(KEY, HOLD, None), Lock::InFlight);
        let early = flights.wait(&KEY);
        let land = async {
            tokio::task::yield_now().await;
            flights.land(&KEY, Some(Bytes::from_static(b"entry")));
        };
        let (early, ()) = tokio::join!(early, land);
        assert_eq!(early, Landing::Entry(Bytes::from_static(b"entry")));
        // a miss between the answer and its store gets it too
        assert_eq!(flights.lock(KEY, HOLD, None), Lock::InFlight);
        assert_eq!(flights.wait(&KEY).await, Landing::Entry(Bytes::from_static(b"entry")));
        flights.settle(&KEY);
        assert_eq!(flights.len(), 1, "kept for the waiter still to come");
        assert_eq!(flights.wait(&KEY).await, Landing::Entry(Bytes::from_static(b"entry")));
        assert_eq!(flights.len(), 0, "gone with its last waiter");
        assert_eq!(flights.lock(KEY, HOLD, None), Lock::Held, "the next miss holds the key again");
        assert_eq!(flights.counters.shared.load(Ordering::Relaxed), 3);
    }

    #[tokio::test]
    async fn a_release_sends_the_waiters_to_the_node_and_a_flight_without_waiters_goes_at_once() {
        let flights = Flights::default();
        flights.lock(KEY, HOLD, None);
        flights.land(&KEY, Some(Bytes::from_static(b"entry")));
        assert_eq!(flights.len(), 1, "until the store settles it");
        flights.settle(&KEY);
        assert_eq!(flights.len(), 0);
        assert_eq!(flights.wait(&KEY).await, Landing::Released, "nothing in flight");

        flights.lock(KEY, HOLD, None);
        assert_eq!(flights.lock(KEY, HOLD, None), Lock::InFlight);
        flights.land(&KEY, None);
        // a store after the release hands nothing over
        flights.land(&KEY, Some(Bytes::from_static(b"late")));
        assert_eq!(flights.wait(&KEY).await, Landing::Released);
        assert_eq!(flights.len(), 0);
        // a miss after a release holds the key anew, though a waiter is yet to come
        flights.lock(KEY, HOLD, None);
        assert_eq!(flights.lock(KEY, HOLD, None), Lock::InFlight);
        flights.land(&KEY, None);
        assert_eq!(flights.lock(KEY, HOLD, None), Lock::Held);
    }

    #[tokio::test(start_paused = true)]
    async fn a_holder_that_never_answers_loses_the_key_when_its_time_runs_out() {
        let flights = Flights::default();
        flights.lock(KEY, Duration::from_millis(300), None);
        assert_eq!(flights.lock(KEY, HOLD, None), Lock::InFlight);
        let started = Instant::now();
        assert_eq!(flights.wait(&KEY).await, Landing::TimedOut);
        assert_eq!(started.elapsed(), Duration::from_millis(300));
        assert_eq!(flights.len(), 0);
        assert_eq!(flights.lock(KEY, HOLD, None), Lock::Held, "the next miss holds the key");
        tokio::time::advance(Duration::from_secs(1)).await;
        flights.sweep();
        assert_eq!(flights.len(), 1, "within its time");
        tokio::time::advance(HOLD).await;
        flights.sweep();
        assert_eq!(flights.len(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_fleet_lock_that_ran_out_first_times_the_waiters_out_at_once_and_is_no_release() {
        let flights = Flights::default();
        // this host's miss follows another host's holder, whose lock runs out before this one's
        assert_eq!(flights.lock(KEY, HOLD, None), Lock::Held);
        flights.join(&KEY);
        assert_eq!(flights.lock(KEY, HOLD, None), Lock::InFlight);
        let started = Instant::now();
        flights.time_out(&KEY);
        // an entry after it hands nothing over
        flights.land(&KEY, Some(Bytes::from_static(b"late")));
        assert_eq!(flights.wait(&KEY).await, Landing::TimedOut);
        assert_eq!(flights.wait(&KEY).await, Landing::TimedOut);
        assert_eq!(started.elapsed(), Duration::ZERO, "not at this host's own time");
        assert_eq!(flights.len(), 0, "gone with its last waiter");
        let counters = &flights.counters;
        assert_eq!((counters.released.load(Ordering::Relaxed), counters.timed_out.load(Ordering::Relaxed)), (0, 2));
        // the next miss holds the key, even with a waiter still to come
        flights.lock(KEY, HOLD, None);
        assert_eq!(flights.lock(KEY, HOLD, None), Lock::InFlight);
        flights.time_out(&KEY);
        assert_eq!(flights.lock(KEY, HOLD, None), Lock::Held);
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_that_comes_after_the_time_ran_out_is_told_so_not_that_the_key_was_released() {
        let flights = Flights::default();
        flights.lock(KEY, Duration::from_millis(300), None);
        assert_eq!(flights.lock(KEY, HOLD, None), Lock::InFlight);
        // the waiter's GET comes late, after a sweep
        tokio::time::advance(Duration::from_secs(1)).await;
        flights.sweep();
        assert_eq!(flights.wait(&KEY).await, Landing::TimedOut);
        assert_eq!(flights.len(), 0);
        // a waiter that never comes holds its flight no longer than LATE_WAITERS past its time
        flights.lock(KEY, Duration::from_millis(300), None);
        assert_eq!(flights.lock(KEY, HOLD, None), Lock::InFlight);
        tokio::time::advance(LATE_WAITERS).await;
        flights.sweep();
        assert_eq!(flights.len(), 1);
        tokio::time::advance(Duration::from_millis(300)).await;
        flights.sweep();
        assert_eq!(flights.len(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_release_frees_only_its_holders_flight_and_one_before_its_lookup_is_kept_for_it() {
        let (holder, late) = (Some(1), Some(2));
        let flights = Flights::default();
        // a late release (an earlier holder's, or a waiter's) leaves the holder's flight alone
        assert_eq!(flights.lock(KEY, HOLD, holder), Lock::Held);
        assert_eq!(flights.lock(KEY, HOLD, Some(3)), Lock::InFlight);
        assert!(!flights.release(&KEY, late));
        assert!(!flights.release(&KEY, Some(3)));
        assert_eq!(flights.lock(KEY, HOLD, Some(4)), Lock::InFlight, "still in flight");
        // its own release sends the waiters to the node
        assert!(flights.release(&KEY, holder));
        assert_eq!(flights.wait(&KEY).await, Landing::Released);
        assert!(!flights.release(&KEY, holder), "once");

        // a release that comes before its lookup: that lookup holds nothing, and the next one does
        assert!(!flights.release(&[8; 32], Some(5)));
        assert_eq!(flights.lock([8; 32], HOLD, Some(5)), Lock::Left);
        assert_eq!(flights.lock([8; 32], HOLD, Some(6)), Lock::Held);
        // remembered for the longest lock only
        assert!(!flights.release(&[9; 32], Some(7)));
        tokio::time::advance(LEFT_FOR).await;
        flights.sweep();
        assert_eq!(flights.lock([9; 32], HOLD, Some(7)), Lock::Held);
        // a release that names no holder frees whichever holds the key
        assert!(flights.release(&[9; 32], None));
    }
}
