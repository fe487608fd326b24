//! A request's lookups, step by step, as every host takes them: the hot tier first (where the
//! host keeps one), then the daemon, one answer after another, then the node. The host makes the
//! call a step names and hands back what came of it; the order of the steps is decided here
//! alone, for the Envoy adapters (`proxy::cache`) and for the C ABI that nginx and Lua drive.

use super::{CacheExchange, DaemonAnswer, DaemonRequest, HitResponse, HotTier};

/// A host's hot tier: lends its region (behind the host's lock, where it has one) for as long as
/// `use_region` runs, which is only while an entry is copied out or in: the request's parsing,
/// hashing and the hit's splice run outside it.
pub trait HotRegion {
    fn with_region(&self, use_region: &mut dyn FnMut(&mut [u8]));
}

/// What a request does next on its way through the cache.
#[derive(Debug)]
pub enum LookupStep {
    /// Ask the daemon this, then hand its answer, or its failure, to
    /// [`CacheExchange::looked_up`].
    Ask(DaemonRequest),
    /// Send the client this hit.
    Hit(HitResponse),
    /// Go on to the node: with this body in place of the client's (a batch less the calls the
    /// cache answered), or with the client's own (`None`).
    Node(Option<Vec<u8>>),
}

impl CacheExchange {
    /// The first step, once the request's head (and the body, where the key needs it) is in: the
    /// hot tier's hit, the first lookup, or the node. A request that bypasses the cache goes to
    /// the node without touching the hot tier's lock.
    pub fn look_up(&mut self, hot: Option<&dyn HotRegion>, min_length: u64, now_s: u64) -> LookupStep {
        if self.bypass().is_none() {
            if let Some(hit) = hot.and_then(|hot| self.hot_hit(hot, min_length, now_s)) {
                return LookupStep::Hit(hit);
            }
        }
        self.next_step()
    }

    /// The daemon's answer to the lookup the last step asked for, or `None` when it failed (no
    /// answer in time, no daemon, an answer cut short): what the answer holds is kept in the hot
    /// tier too; then the hit, the next lookup, or the node.
    pub fn looked_up(
        &mut self,
        answer: Option<&DaemonAnswer>,
        hot: Option<&dyn HotRegion>,
        min_length: u64,
        now_s: u64,
    ) -> LookupStep {
        let Some(answer) = answer else {
            self.failed();
            return LookupStep::Node(self.node_request());
        };
        let hit = self.answered(answer, min_length);
        if let Some(hot) = hot {
            hot.with_region(&mut |region| {
                if let Some(mut tier) = HotTier::open(region) {
                    self.keep_hot(&mut tier, answer.body, now_s);
                }
            });
        }
        match hit {
            Some(hit) => LookupStep::Hit(hit),
            None => self.next_step(),
        }
    }

    fn next_step(&mut self) -> LookupStep {
        match self.next_lookup() {
            Some(lookup) => LookupStep::Ask(lookup),
            None => LookupStep::Node(self.node_request()),
        }
    }

    /// The hot tier's hit: the entry is copied out while the tier is lent, the hit made after.
    fn hot_hit(&mut self, hot: &dyn HotRegion, min_length: u64, now_s: u64) -> Option<HitResponse> {
        let mut found = false;
        hot.with_region(&mut |region| {
            found = HotTier::open(region)
                .is_some_and(|mut tier| self.find_hot(&mut tier, now_s, min_length));
        });
        found.then(|| self.hot_answer(min_length)).flatten()
    }
}
