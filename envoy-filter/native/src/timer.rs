//! Deadlines for held data. Envoy 1.40's dynamic-module ABI gives an HTTP filter no timer of its
//! own (only bootstrap extensions and clusters have one), but a filter's scheduler may be
//! committed to from any thread. So one thread of this module sleeps until the next deadline and
//! commits its filter's event; the filter then runs the core's tick on its own worker.
//! The deadlines are on the module's clock (`clock`), which it gives the core.

use std::collections::BTreeMap;
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::host::Scheduler;

/// The module's clock for the core (`rpcedge_core::proxy::Clock`), in microseconds: monotonic,
/// so that a step of the wall clock never holds data back.
pub fn clock() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_micros() as u64
}

/// The core's deadlines are in the clock's milliseconds.
pub fn now_ms() -> u64 {
    clock() / 1000
}

/// The event a deadline commits.
pub const DEADLINE: u64 = 1;

/// An armed deadline: when, and a sequence number that tells equal times apart.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
pub struct Armed(u64, u64);

#[derive(Default)]
struct Deadlines {
    due: BTreeMap<Armed, Scheduler>,
    next: u64,
}

struct Timer {
    deadlines: Mutex<Deadlines>,
    changed: Condvar,
}

fn timer() -> &'static Timer {
    static TIMER: OnceLock<&'static Timer> = OnceLock::new();
    TIMER.get_or_init(|| {
        let timer: &'static Timer = Box::leak(Box::new(Timer { deadlines: Default::default(), changed: Condvar::new() }));
        std::thread::Builder::new()
            .name("rpcedge-timer".into())
            .spawn(move || timer.run())
            .expect("a thread for rpcedge's deadlines");
        timer
    })
}

/// Commits `DEADLINE` to `scheduler` at `at_ms` (on `now_ms`'s clock), unless disarmed first.
pub fn arm(at_ms: u64, scheduler: Scheduler) -> Armed {
    let timer = timer();
    let mut deadlines = timer.deadlines.lock().unwrap_or_else(|e| e.into_inner());
    deadlines.next += 1;
    let armed = Armed(at_ms, deadlines.next);
    let earliest = deadlines.due.keys().next().map_or(true, |first| armed < *first);
    deadlines.due.insert(armed, scheduler);
    if earliest {
        timer.changed.notify_one();
    }
    armed
}

/// Forgets a deadline. Once this returns, the timer no longer holds its scheduler.
pub fn disarm(armed: Armed) {
    let mut deadlines = timer().deadlines.lock().unwrap_or_else(|e| e.into_inner());
    deadlines.due.remove(&armed);
}

impl Timer {
    fn run(&self) {
        let mut deadlines = self.deadlines.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            let now = now_ms();
            // Committed under the lock, so that a filter that disarms never has its scheduler
            // used after it deleted it.
            while let Some(entry) = deadlines.due.first_entry().filter(|entry| entry.key().0 <= now) {
                entry.remove().commit(DEADLINE);
            }
            deadlines = match deadlines.due.keys().next() {
                Some(first) => {
                    let wait = Duration::from_millis(first.0 - now);
                    self.changed.wait_timeout(deadlines, wait).unwrap_or_else(|e| e.into_inner()).0
                }
                None => self.changed.wait(deadlines).unwrap_or_else(|e| e.into_inner()),
            };
        }
    }
}
