//! What every request of the daemon shares.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use crate::finality::Finality;
use crate::fleet::Fleet;
use crate::flights::Flights;
use crate::store::Store;

pub struct State {
    pub store: Store,
    /// The fleet tier behind the store, with `--fleet`.
    pub fleet: Option<Arc<Fleet>>,
    pub finality: Arc<Finality>,
    /// Bound on a PUT's body: `entry_bound` of the hosts' `max_entry`.
    pub max_body: usize,
    pub refusals: Refusals,
    pub flights: Flights,
}

/// Entries refused, by reason.
#[derive(Default)]
pub struct Refusals {
    /// The entry depends on a block above the namespace's finalized one.
    pub not_final: AtomicU64,
    /// The namespace has no finality yet (no upstream, or none heard).
    pub no_finality: AtomicU64,
    /// A transaction's entry whose block neither a stored receipt nor the finality node gave.
    pub unplaced: AtomicU64,
    /// The entry names its block by a hash that the finality nodes do not give that block: the
    /// answer of a node on another fork.
    pub forked: AtomicU64,
    /// The entry names its block's hash, which the finality nodes did not give (in time, or all
    /// the same one).
    pub unpinned: AtomicU64,
    /// Not an entry, or one that fails its CRC-32.
    pub bad_entry: AtomicU64,
    /// Over the body bound.
    pub too_large: AtomicU64,
}
