//! rpcedge's sans-IO core: every decision and byte transformation the nginx module and the Envoy
//! filter make, as plain functions and a per-exchange state machine. No I/O, no host.

pub mod compress;
pub mod cache;
pub mod config;
pub mod dictionary;
pub mod edits;
pub mod exchange;
pub mod metrics;
pub mod negotiate;
pub mod node;
pub mod proxy;
pub mod transcode;

pub use config::{CacheConfig, Config, ConfigError, Level, Settings};
pub use edits::HeaderOp;
pub use exchange::{
    BodyPlan, Error, EtagEdit, Exchange, Failure, HeaderEdits, LengthEdit, Mode, Output, TranscodeOutcome, WholeBody,
    JSONRPC_ID_HEADER, JSONRPC_VERSION_HEADER,
};
pub use transcode::{CONSENSUS_VERSION_HEADER, EXECUTION_OPTIMISTIC_HEADER, FINALIZED_HEADER};
pub use negotiate::{Accept, AcceptEncoding, Coding, MediaType};
pub use node::Node;
