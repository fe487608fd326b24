//! What rpcedge learns about the node from its answers, at run time: not configuration, so kept
//! beside a configuration's [`crate::Settings`] (one per configuration, shared by its exchanges),
//! not in them.

use std::sync::atomic::{AtomicBool, Ordering};

#[derive(Debug, Default)]
pub struct Node {
    /// The node's SSZ answers on Beacon-API routes carry `Eth-Execution-Optimistic` and
    /// `Eth-Consensus-Finalized`, as its JSON envelope's members.
    beacon_metadata: AtomicBool,
}

impl Node {
    pub fn sends_beacon_metadata(&self) -> bool {
        self.beacon_metadata.load(Ordering::Relaxed)
    }

    /// One of the node's SSZ answers on a Beacon-API route did or did not carry them.
    pub fn saw_beacon_metadata(&self, carried: bool) {
        self.beacon_metadata.store(carried, Ordering::Relaxed);
    }
}
