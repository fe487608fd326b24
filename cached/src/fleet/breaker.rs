//! The breaker: a master that keeps failing is skipped for a while (masters.rs keeps one per
//! master), so that a dead or unreachable master costs a request nothing instead of the fleet
//! timeout. After `THRESHOLD`
//! failures in a row it opens for `FIRST_PAUSE`; then one round is let through (a probe): its
//! success closes the breaker, its failure opens it again for twice as long, up to `LONGEST_PAUSE`.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

const THRESHOLD: u32 = 5;
const FIRST_PAUSE: Duration = Duration::from_millis(500);
const LONGEST_PAUSE: Duration = Duration::from_secs(30);
/// A probe that never reported (its request went away) frees the way for another after this.
const PROBE_LIMIT: Duration = Duration::from_secs(1);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    Closed { failures: u32 },
    Open { until: Instant, pause: Duration },
    Probing { since: Instant, pause: Duration },
}

pub struct Breaker {
    state: Mutex<State>,
}

impl Default for Breaker {
    fn default() -> Self {
        Breaker { state: Mutex::new(State::Closed { failures: 0 }) }
    }
}

impl Breaker {
    /// Whether a round may go to the cluster now; a `true` must be followed by `succeeded` or
    /// `failed`.
    pub fn allows(&self) -> bool {
        let now = Instant::now();
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let pause = match *state {
            State::Closed { .. } => return true,
            State::Open { until, pause } => (now >= until).then_some(pause),
            State::Probing { since, pause } => (now >= since + PROBE_LIMIT).then_some(pause),
        };
        let Some(pause) = pause else { return false };
        *state = State::Probing { since: now, pause };
        true
    }

    pub fn succeeded(&self) {
        *self.state.lock().unwrap_or_else(|e| e.into_inner()) = State::Closed { failures: 0 };
    }

    /// Counts a failed round: whether the breaker opened on it.
    pub fn failed(&self) -> bool {
        let now = Instant::now();
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let pause = match *state {
            State::Closed { failures } if failures + 1 < THRESHOLD => {
                *state = State::Closed { failures: failures + 1 };
                return false;
            }
            State::Closed { .. } => FIRST_PAUSE,
            State::Probing { pause, .. } => (pause * 2).min(LONGEST_PAUSE),
            // a round let through before it opened: already open
            State::Open { .. } => return false,
        };
        *state = State::Open { until: now + pause, pause };
        true
    }

    pub fn state(&self) -> State {
        *self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn it_opens_after_failures_in_a_row_probes_once_and_backs_off() {
        let breaker = Breaker::default();
        for _ in 0..THRESHOLD - 1 {
            assert!(breaker.allows());
            assert!(!breaker.failed());
        }
        breaker.succeeded();
        for _ in 0..THRESHOLD - 1 {
            breaker.failed();
        }
        assert_eq!(breaker.state(), State::Closed { failures: THRESHOLD - 1 }, "a success in between starts the count again");
        assert!(breaker.failed(), "it opens on this one");
        assert!(matches!(breaker.state(), State::Open { .. }));
        assert!(!breaker.allows());
        tokio::time::advance(FIRST_PAUSE).await;
        assert!(breaker.allows(), "one probe");
        assert!(!breaker.allows(), "only one");
        breaker.failed();
        tokio::time::advance(FIRST_PAUSE).await;
        assert!(!breaker.allows(), "twice as long after a failed probe");
        tokio::time::advance(FIRST_PAUSE).await;
        assert!(breaker.allows());
        breaker.succeeded();
        assert!(breaker.allows() && breaker.allows());
        assert_eq!(breaker.state(), State::Closed { failures: 0 });
    }

    #[tokio::test(start_paused = true)]
    async fn a_probe_that_never_reports_frees_the_way_after_its_limit() {
        let breaker = Breaker::default();
        for _ in 0..THRESHOLD {
            breaker.failed();
        }
        tokio::time::advance(FIRST_PAUSE).await;
        assert!(breaker.allows());
        tokio::time::advance(PROBE_LIMIT / 2).await;
        assert!(!breaker.allows());
        tokio::time::advance(PROBE_LIMIT).await;
        assert!(breaker.allows());
    }
}
