//! How a local miss uses the fleet: an entry the fleet holds is answered and kept here, and a
//! miss whose key another host's request holds follows that holder to its answer.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;

use crate::fleet::{Fleet, Found, Polled};
use crate::state::State;
use crate::store::Lookup;
use crate::units::now_s;

/// A follower asks again after this, doubling up to `LONGEST_POLL`: a holder's node answers in
/// milliseconds, and every poll is a round with the cluster.
const FIRST_POLL: Duration = Duration::from_millis(2);
const LONGEST_POLL: Duration = Duration::from_millis(20);

/// Keeps an entry the fleet gave in the local store: the next miss here is a local hit. Its
/// seconds left, `None` for an entry without expiry.
fn keep_here(state: &State, key: &[u8; 32], entry: &[u8], expires_s: Option<u64>) -> Option<u64> {
    let now_s = now_s();
    let left_s = expires_s.map(|at| at.saturating_sub(now_s).max(1));
    if let Err(error) = state.store.put(key, entry, left_s, now_s) {
        eprintln!("rpcedge-cached: keeping a fleet entry: {error}");
    }
    left_s
}

/// The fleet's entry for `key`, kept here, and its seconds left.
pub async fn fetch(state: &State, fleet: &Fleet, key: &[u8; 32]) -> Option<(Vec<u8>, Option<u64>)> {
    match fleet.get(key).await {
        Found::Entry(entry, expires_s) => {
            let left_s = keep_here(state, key, &entry, expires_s);
            Some((entry, left_s))
        }
        Found::Miss | Found::Unanswered => None,
    }
}

/// The keys of a batch that missed here (`found`, in the keys' order), asked of the fleet at once;
/// what it has becomes a hit.
pub async fn fetch_many(state: &State, fleet: &Fleet, keys: &[[u8; 32]], found: &mut [Lookup]) {
    let missed: Vec<usize> = (0..keys.len()).filter(|&at| matches!(found[at], Lookup::Absent | Lookup::Expired)).collect();
    if missed.is_empty() {
        return;
    }
    let asked: Vec<[u8; 32]> = missed.iter().map(|&at| keys[at]).collect();
    for (at, fleet_found) in missed.into_iter().zip(fleet.get_many(&asked).await) {
        if let Found::Entry(entry, expires_s) = fleet_found {
            let left_s = keep_here(state, &keys[at], &entry, expires_s);
            found[at] = Lookup::Hit(entry, left_s);
        }
    }
}

/// Follows another host's holder of `key` until its entry or answer is in the fleet (then the
/// local flight lands with it), the lock is gone without one (the holder released it, or its time
/// ran out: the local waiters go to their node, told which), or `hold` runs out (the local
/// flight's own deadline). The holder's lock was taken before this host's, and may be shorter:
/// it can run out well within `hold`, and that is no release.
pub async fn follow(state: Arc<State>, fleet: Arc<Fleet>, key: [u8; 32], hold: Duration) {
    let deadline = Instant::now() + hold;
    let mut pause = FIRST_POLL;
    let outcome = loop {
        match fleet.poll(&key).await {
            Polled::Entry(entry, expires_s) => {
                keep_here(&state, &key, &entry, expires_s);
                state.flights.land(&key, Some(Bytes::from(entry)));
                state.flights.settle(&key);
                break 0;
            }
            Polled::Answer(answer) => {
                state.flights.land(&key, Some(Bytes::from(answer)));
                state.flights.settle(&key);
                break 1;
            }
            Polled::Released => {
                state.flights.land(&key, None);
                break 2;
            }
            Polled::Expired => {
                state.flights.time_out(&key);
                break 3;
            }
            Polled::Unanswered => {
                state.flights.land(&key, None);
                break 4;
            }
            Polled::Held if Instant::now() + pause >= deadline => break 3,
            Polled::Held => {}
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(LONGEST_POLL);
    };
    fleet.counters.lock_waits[outcome].fetch_add(1, Ordering::Relaxed);
}
