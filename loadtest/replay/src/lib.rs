//! rpcedge-replay: an Ethereum JSON-RPC "node" that answers with recorded real responses, as
//! `rpcedge-corpus` reads them.

pub mod delivery;
pub mod generated;
pub mod hashes;
pub mod head;
pub mod server;
