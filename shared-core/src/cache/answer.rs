//! The node's answer as the cache takes it, in every host: its body held for the store while it
//! may be kept, or, for a split batch, held until the cache's answers can be merged into it. The
//! host passes each piece of the body through [`CacheExchange::pass`] and sends what it says;
//! once the body has ended, [`CacheExchange::stores_held`] gives the stores to make.

use super::{CacheExchange, DaemonRequest, Refusal};

/// What the core holds of the node's body.
#[derive(Debug, Default)]
pub(super) enum Held {
    /// Nothing: the answer is not kept, or has been merged already and ended before it was whole.
    #[default]
    Nothing,
    /// The plain body so far, for the store; `expected`, its length where the head gave one.
    ForStore { body: Vec<u8>, expected: usize },
    /// A split batch's answer so far, for the merge.
    ForMerge(Vec<u8>),
    /// A split batch's answer, merged whole: what it stores was taken from it as it was merged.
    Merged,
}

/// What the client gets in place of a piece of the node's body.
#[derive(Debug, PartialEq, Eq)]
pub enum Passed {
    /// The piece as it came; the core holds no more of the body (or never did).
    On,
    /// The piece as it came, held for the store too.
    Kept,
    /// Nothing yet: a split batch's answer is held until it ends, or outgrows what is held.
    Held,
    /// A split batch's answer merged with the cache's, in place of all that was held: the whole
    /// answer where the node's ended with this piece, else its start, after which the rest of the
    /// node's body passes on as it comes.
    Merged(Vec<u8>),
}

impl CacheExchange {
    /// A piece of the node's body (`end`: its last), once [`CacheExchange::response_head`] has
    /// said to hold it.
    pub fn pass(&mut self, piece: &[u8], end: bool) -> Passed {
        match &mut self.held {
            Held::ForStore { body, expected } => {
                if body.capacity() == 0 {
                    body.reserve(*expected);
                }
                body.extend_from_slice(piece);
                let held = body.len() as u64;
                if self.keep_holding(held) {
                    return Passed::Kept;
                }
                self.held = Held::Nothing;
                Passed::On
            }
            Held::ForMerge(body) => {
                body.extend_from_slice(piece);
                let held = body.len() as u64;
                if !end && self.keep_holding(held) {
                    return Passed::Held;
                }
                let Held::ForMerge(body) = std::mem::take(&mut self.held) else { unreachable!("matched above") };
                self.held = if end { Held::Merged } else { Held::Nothing };
                Passed::Merged(self.batch_answer(&body, end))
            }
            Held::Nothing | Held::Merged => Passed::On,
        }
    }

    /// The node's body has ended, whole: the calls that store it (for a batch, one per answer it
    /// stores), or why the core refuses an answer (errors, nulls, ...; or, said by its head
    /// already, `Set-Cookie`, `Cache-Control: no-store`, ...). Given once.
    pub fn stores_held(&mut self) -> Vec<Result<DaemonRequest, Refusal>> {
        match std::mem::take(&mut self.held) {
            Held::ForStore { body, .. } => self.stores(&body),
            Held::Merged => self.stores(&[]),
            Held::Nothing | Held::ForMerge(_) => self.take_head_refusal().map(Err).into_iter().collect(),
        }
    }

    /// Whether the core holds the node's body for the store, or to merge it.
    pub fn holds(&self) -> bool {
        matches!(self.held, Held::ForStore { .. } | Held::ForMerge(_))
    }
}
