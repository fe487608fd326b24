//! What the daemon believes of one finality source: a jump it takes back within the hold is
//! never believed.
//!
//! A node can say too much: misconfigured, on a minority fork, or one of several backends behind
//! one address, each at its own height. Several sources are held to each other (the lowest of
//! them is final); a single one is held to itself over time. What a source is believed to call
//! final is the lowest it has said over the last `hold`: a lower word counts at once (it only
//! keeps answers out), a higher one once the source has said no less for the whole hold. Behind a
//! load balancer, the hold spans several polls, so the lowest backend is what counts.
//!
//! The first word is believed at once: a daemon that starts has nothing to hold it to, and
//! waiting would leave every host without its cache for the hold.

use std::collections::VecDeque;

pub struct Hold {
    hold_ms: u64,
    /// The words that can still be the lowest of the window, rising, each with the time since
    /// which the source has said no less: the first is the window's lowest.
    words: VecDeque<(u64, u64)>,
}

impl Hold {
    pub fn new(hold_ms: u64) -> Hold {
        Hold { hold_ms, words: VecDeque::new() }
    }

    /// The source said `said` at `now_ms` (from any fixed start, never going back): what it is
    /// now believed to call final.
    pub fn hear(&mut self, now_ms: u64, said: u64) -> u64 {
        // A word above this later one can no longer be the window's lowest: since it was said,
        // the source has said no less than this one, which takes its time. One equal to it
        // already says since when.
        let mut since = now_ms;
        while let Some(&(at, _)) = self.words.back().filter(|&&(_, word)| word > said) {
            since = at;
            self.words.pop_back();
        }
        if self.words.back().is_none_or(|&(_, word)| word < said) {
            self.words.push_back((since, said));
        }
        // the first word stops counting once the next was said by the window's start (none
        // while the window reaches back past the first word ever heard)
        if let Some(start) = now_ms.checked_sub(self.hold_ms) {
            while self.words.len() > 1 && self.words[1].0 <= start {
                self.words.pop_front();
            }
        }
        self.words[0].1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_jump_is_believed_once_held_and_never_when_taken_back_sooner() {
        let mut hold = Hold::new(60_000);
        assert_eq!(hold.hear(0, 100), 100, "the first word, at once");
        assert_eq!(hold.hear(12_000, 1_100), 100, "a jump waits");
        assert_eq!(hold.hear(24_000, 1_100), 100);
        assert_eq!(hold.hear(36_000, 100), 100, "taken back: never believed");
        assert_eq!(hold.hear(48_000, 132), 100);
        assert_eq!(hold.hear(108_000, 132), 132, "said for the whole hold");
        assert_eq!(hold.hear(120_000, 50), 50, "a lower word counts at once");
    }

    #[test]
    fn behind_one_address_the_lowest_backend_counts() {
        let mut hold = Hold::new(60_000);
        let said: Vec<u64> = (0..20).map(|poll| hold.hear(poll * 12_000, if poll % 2 == 0 { 95 } else { 100 })).collect();
        assert!(said.iter().all(|&believed| believed == 95), "{said:?}");
        let mut no_hold = Hold::new(0);
        assert_eq!(no_hold.hear(0, 95), 95);
        assert_eq!(no_hold.hear(12_000, 100), 100, "without a hold, the last word");
    }

    #[test]
    fn a_jump_partly_taken_back_counts_from_the_jump() {
        let mut hold = Hold::new(60_000);
        hold.hear(0, 100);
        hold.hear(12_000, 1_100);
        assert_eq!(hold.hear(24_000, 500), 100);
        assert_eq!(hold.hear(71_000, 500), 100, "100 was said within the hold");
        assert_eq!(hold.hear(72_000, 500), 500, "no less than 500 since the jump, a hold ago");
    }

    #[test]
    fn a_source_that_keeps_rising_keeps_few_words() {
        let mut hold = Hold::new(60_000);
        for poll in 0..10_000 {
            hold.hear(poll * 100, poll);
        }
        assert_eq!(hold.hear(1_000_000, 10_000), 9_400);
        assert!(hold.words.len() <= 602, "{}", hold.words.len());
    }
}
