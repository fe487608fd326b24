//! One budget for the memory that the transcodes in flight hold, shared by every exchange of the
//! process (an nginx worker, an Envoy process; a Wasm VM has its own): a body whose transcode
//! would take more than is left goes out as it came.

use std::sync::atomic::{AtomicU64, Ordering};

/// The bytes that all reservations of the process hold.
static HELD: AtomicU64 = AtomicU64::new(0);

/// One exchange's share of the budget, given back when it is dropped (the exchange ended, or
/// its client went away).
#[derive(Debug, Default)]
pub(super) struct Reservation(u64);

impl Reservation {
    /// Takes `bytes` more, unless that would bring all reservations past `budget`: then nothing
    /// is taken and the answer is false.
    pub fn take(&mut self, bytes: u64, budget: u64) -> bool {
        let taken = HELD.fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
            held.checked_add(bytes).filter(|&total| total <= budget)
        });
        if taken.is_ok() {
            self.0 += bytes;
        }
        taken.is_ok()
    }

    /// Makes the share `bytes`: gives back what it holds over that, or takes what it lacks, as
    /// [`Reservation::take`] does (false: nothing changed).
    pub fn resize(&mut self, bytes: u64, budget: u64) -> bool {
        match bytes.checked_sub(self.0) {
            Some(more) => self.take(more, budget),
            None => {
                HELD.fetch_sub(self.0 - bytes, Ordering::AcqRel);
                self.0 = bytes;
                true
            }
        }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        HELD.fetch_sub(self.0, Ordering::AcqRel);
    }
}
