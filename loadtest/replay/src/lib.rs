//! rpcedge-replay: an Ethereum JSON-RPC "node" that answers with recorded real responses.
//! The library is the corpus loader and the server; the core's golden tests and benchmarks
//! read recorded bodies through it too.

pub mod beacon;
pub mod cache;
pub mod corpus;
pub mod delivery;
pub mod head;
pub mod json;
pub mod rpc;
pub mod server;
pub mod template;
