//! rpcedge-corpus: reads the recorded corpus (JSON-RPC request/response pairs, Beacon-API
//! answers, consensus-spec SSZ vectors) for the replay upstream, which serves it, and for the
//! core's golden tests and benchmarks, which check against it.

pub mod beacon;
pub mod cache;
pub mod corpus;
pub mod json;
pub mod rpc;
pub mod template;
