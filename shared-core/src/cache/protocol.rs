//! The cache daemon's HTTP protocol, named once: the core builds its lookups and stores from
//! these, reads the daemon's answers by them, and the daemon (`rpcedge-cached`) serves them.

/// An entry's path: this, then its key in hex (`GET` looks it up, `PUT` stores it).
pub const ENTRIES_PATH: &str = "/v1/entries/";

/// On a store: the namespace of the key (for finality), the seconds the entry is kept, and what
/// must be final before the daemon keeps it (`cache::Final`: a block's number, or a transaction's
/// hash, whose block the daemon finds).
pub const NAMESPACE_HEADER: &str = "x-rpcedge-namespace";
pub const TTL_HEADER: &str = "x-rpcedge-ttl";
pub const REQUIRES_FINAL_HEADER: &str = "x-rpcedge-requires-final";

/// On a lookup's answer: why it missed (a 404), and the seconds an entry has left (a hit).
pub const MISS_HEADER: &str = "x-rpcedge-miss";
/// On a store's refusal: why.
pub const REFUSAL_HEADER: &str = "x-rpcedge-refusal";

/// The path of the entry with this key (in hex).
pub fn entry_path(key_hex: &str) -> String {
    format!("{ENTRIES_PATH}{key_hex}")
}
