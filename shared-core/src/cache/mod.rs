//! The response cache's decisions: which JSON-RPC requests the store may answer and under which
//! key, what of an answer it keeps and under which condition, and how a hit is put back together
//! around the client's own id. The store is the daemon's; hosts only carry bytes between the
//! client, the node, the daemon and these functions.

mod answer;
mod batch;
mod beacon;
mod call;
mod entry;
mod flow;
mod head;
mod hit;
mod hot;
mod lookup;
pub mod protocol;
mod rules;
pub mod sealed;

use std::fmt;

use serde::Deserialize;
use serde_json::value::RawValue;

use call::{Call, Unread};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::negotiate::Coding;

pub use answer::Passed;
pub use entry::{encode, entry_bound, hit_codings, BadEntry, Entry, Envelope, Hit, MinLengths, PLAIN_HOT_MIN};
pub use flow::{CacheExchange, DaemonAnswer, DaemonRequest, Kept, Status};
pub use hit::HitResponse;
pub(crate) use head::field as header_field;
pub use head::Head;
pub use lookup::{HotRegion, LookupStep};
pub use hot::{HotTier, MAX_AGE_S as HOT_MAX_AGE_S, MIN_REGION as HOT_MIN_REGION};
pub use rules::{is_hash_hex, rule, Asked, BlockRef, LogFilter, Names, Rule, TABLE};

/// The cache's settings, shared by every host: each configures them (`config::CacheConfig::settings`,
/// nginx's directives) and its exchanges run with them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheSettings {
    /// Larger request bodies bypass the cache.
    pub max_request: usize,
    /// Larger answers are not stored.
    pub max_entry: usize,
    /// How long chain properties (eth_chainId, net_version) are kept, in seconds.
    pub chain_ttl_s: u64,
    /// Batches of more calls bypass the cache whole (at most [`protocol::MAX_LOOKUP_KEYS`]; 0:
    /// every batch does).
    pub max_batch: usize,
    /// How long a lookup may take before the node is asked instead.
    pub lookup_timeout_ms: u64,
    /// How long a miss waits for the answer that another request for the same key is getting
    /// from the node (coalescing, `protocol::LOCK_HEADER`); 0: it never waits.
    pub lock_timeout_ms: u64,
    /// How long a store (or a release) may take; the daemon compacts an entry before it answers.
    pub store_timeout_ms: u64,
    /// The codings a hit may go out in, spliced from what the store keeps with no compression on
    /// the hit, in the operator's order: those of its `encodings` that a store keeps a form for
    /// (gzip, zstd, br).
    pub hit_codings: Vec<Coding>,
    /// `dictionary_min_length`: the least length of a dcz hit.
    pub dictionary_min_length: u64,
}

impl Default for CacheSettings {
    /// Those of a configuration that sets none (`CacheConfig`'s defaults are these): a batch as
    /// large as ethers v6 sends by default (`batchMaxCount`).
    fn default() -> Self {
        CacheSettings {
            max_request: 64 * 1024,
            max_entry: 8 * 1024 * 1024,
            chain_ttl_s: 3600,
            max_batch: 100,
            lookup_timeout_ms: 50,
            // as nginx's proxy_cache_lock_timeout
            lock_timeout_ms: 5000,
            store_timeout_ms: 5000,
            hit_codings: hit_codings(&Coding::DEFAULT_ORDER),
            dictionary_min_length: crate::dictionary::MIN_LENGTH,
        }
    }
}

/// A store key: SHA-256 over the namespace, the method and the canonical params.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Key(pub [u8; 32]);

impl Key {
    /// Lower-case hex, as the daemon's API spells keys.
    pub fn hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Key({})", self.hex())
    }
}

/// Why a request goes to the node without asking the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bypass {
    /// A JSON-RPC batch the cache does not split: more calls than `max_batch`, two calls with
    /// one id, or no call the store may answer.
    Batch,
    /// A body over `max_request`.
    TooLarge,
    /// Not a JSON-RPC request object.
    Malformed,
    /// A member other than `jsonrpc`, `id`, `method` and `params`, one spelled otherwise (in
    /// another case, with escapes) or one given twice: a node may read another call than the key.
    Members,
    /// Params that a node may read otherwise than the key (`call`).
    Params,
    /// A method the allow-list leaves out.
    Method,
    /// At a tag that moves (`latest`, `pending`, `safe`, `finalized`, or none given).
    Moving,
    /// The client asks for the SSZ of a result with a transcoding schema: the cache holds JSON.
    Ssz,
    /// No namespace is configured where the request was routed: the cache never takes one from
    /// what the client sends (its Host, its path).
    Namespace,
    /// The node's answer cannot be kept whole (over `max_entry`): the request is not counted as
    /// a miss.
    Answer,
    /// The request carries credentials (`Authorization`, `Cookie`): the node's answer may be for
    /// this client only (RFC 9111, 3.5).
    Credentials,
    /// Neither a POST (a JSON-RPC call) nor a GET (a Beacon-API read).
    NotPost,
    /// A GET of a route the cache does not read (a state, anything but a Beacon-API block,
    /// blinded block or blobs), or by a client that takes neither JSON nor SSZ.
    Route,
}

/// A bypass reason's name, and the status header's value that carries it.
macro_rules! reasons {
    ($($reason:ident => $name:literal,)*) => {
        pub fn as_str(self) -> &'static str {
            match self {
                $(Bypass::$reason => $name,)*
            }
        }

        /// The status header's value where the operator asks for the reason: a Structured
        /// Field token with a parameter (RFC 8941), `BYPASS; reason=<name>`.
        pub fn status_value(self) -> &'static str {
            match self {
                $(Bypass::$reason => concat!("BYPASS; reason=", $name),)*
            }
        }
    };
}

impl Bypass {
    fn unread(unread: Unread) -> Bypass {
        match unread {
            Unread::Malformed => Bypass::Malformed,
            Unread::Members => Bypass::Members,
            Unread::Params => Bypass::Params,
        }
    }

    /// Every reason, for a host's counters.
    pub const fn all() -> [Bypass; 13] {
        [
            Bypass::Batch,
            Bypass::TooLarge,
            Bypass::Malformed,
            Bypass::Members,
            Bypass::Params,
            Bypass::Method,
            Bypass::Moving,
            Bypass::Ssz,
            Bypass::Namespace,
            Bypass::Answer,
            Bypass::Credentials,
            Bypass::NotPost,
            Bypass::Route,
        ]
    }

    reasons! {
        Batch => "batch",
        TooLarge => "too_large",
        Malformed => "malformed",
        Members => "members",
        Params => "params",
        Method => "method",
        Moving => "moving",
        Ssz => "ssz",
        Namespace => "namespace",
        Answer => "answer",
        Credentials => "credentials",
        NotPost => "not_post",
        Route => "route",
    }
}

/// When an answer may be kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keep {
    /// Always, without expiry.
    Forever,
    /// For this many seconds.
    For(u64),
    /// Once this block number is finalized in the request's namespace.
    OnceFinal(u64),
    /// Once the transaction's block is finalized: the one its answer names, or for an answer
    /// that names none (a trace), the one the daemon finds ([`receipt_block`]).
    OnceAnswerFinal,
}

/// A request the store may answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub key: Key,
    /// The client's id, as its raw JSON text (`null` when it sent none).
    pub id: String,
    pub keep: Keep,
    /// What the request asked for, and what of the answer must name it.
    pub asked: Asked,
    pub names: Names,
}

/// What to store after a miss.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capture {
    pub key: Key,
    /// Seconds to keep it; `None`: no expiry.
    pub ttl_s: Option<u64>,
    /// What must be finalized in the namespace before it is kept.
    pub requires_final: Option<Final>,
    /// The hash of the block that `requires_final` names, where the answer names one (in lower
    /// case): the daemon keeps the entry only if its finality nodes give that block this hash, so
    /// that a node on another fork (a backend behind the same address) stores nothing.
    pub block_hash: Option<String>,
    /// The node's envelope around the id.
    pub envelope: Envelope,
    /// The envelope's tail, `<result>}`.
    pub tail: Vec<u8>,
}

/// What must be finalized before an entry is kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Final {
    /// This block.
    Block(u64),
    /// The block that holds this transaction (its hash, in lower case), which the daemon finds
    /// for an answer that names none (a trace).
    Transaction(String),
    /// This Beacon-chain slot.
    Slot(u64),
}

impl fmt::Display for Final {
    /// As the store call's `X-Rpcedge-Requires-Final` gives it: the block's number in decimal,
    /// the transaction's hash (`0x` and 64 hex digits), or `slot:` and the slot in decimal.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Final::Block(number) => write!(f, "{number}"),
            Final::Transaction(hash) => f.write_str(hash),
            Final::Slot(slot) => write!(f, "{SLOT_PREFIX}{slot}"),
        }
    }
}

impl std::str::FromStr for Final {
    type Err = ();

    fn from_str(value: &str) -> Result<Final, ()> {
        let value = value.trim();
        if rules::is_hash_hex(value) {
            return Ok(Final::Transaction(value.to_ascii_lowercase()));
        }
        if let Some(slot) = value.strip_prefix(SLOT_PREFIX) {
            return slot.parse().map(Final::Slot).map_err(|_| ());
        }
        value.parse().map(Final::Block).map_err(|_| ())
    }
}

const SLOT_PREFIX: &str = "slot:";

/// Why an answer is not kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// A JSON-RPC error, or no result.
    Error,
    /// A `null` result.
    Null,
    /// An empty result for data that may still appear.
    Empty,
    /// A transaction's answer that names no block.
    NoBlock,
    /// Over `max_entry`.
    TooLarge,
    /// Not a JSON-RPC response object.
    Malformed,
    /// An answer that names another block or transaction than the request asked for.
    Mismatch,
    /// An answer with `Set-Cookie`: for one client only.
    SetCookie,
    /// `Cache-Control: no-store`, `private` or `no-cache`.
    NoStore,
    /// `Vary: *`: no request can be known to get the same answer.
    VaryAll,
    /// A Beacon-API answer that the node does not give as settled: optimistic (or not saying),
    /// or for a block by root, not finalized (or not saying).
    NotFinal,
}

impl Refusal {
    /// Every reason, for a host's counters.
    pub const fn all() -> [Refusal; 11] {
        [
            Refusal::Error,
            Refusal::Null,
            Refusal::Empty,
            Refusal::NoBlock,
            Refusal::TooLarge,
            Refusal::Malformed,
            Refusal::Mismatch,
            Refusal::SetCookie,
            Refusal::NoStore,
            Refusal::VaryAll,
            Refusal::NotFinal,
        ]
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::Error => "error",
            Refusal::Null => "null",
            Refusal::Empty => "empty",
            Refusal::NoBlock => "no_block",
            Refusal::TooLarge => "too_large",
            Refusal::Malformed => "malformed",
            Refusal::Mismatch => "mismatch",
            Refusal::SetCookie => "set_cookie",
            Refusal::NoStore => "no_store",
            Refusal::VaryAll => "vary_all",
            Refusal::NotFinal => "not_final",
        }
    }
}

/// Whether the store may answer the request `body` in `namespace`, and under which key.
pub fn lookup(namespace: &str, body: &[u8], settings: &CacheSettings) -> Result<Request, Bypass> {
    if body.len() > settings.max_request {
        return Err(Bypass::TooLarge);
    }
    if body.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'[') {
        return Err(Bypass::Batch);
    }
    let request = Call::read(body).map_err(Bypass::unread)?;
    request_of(namespace, &request, settings)
}

/// Whether the store may answer the call `request`, read strictly, and under which key.
fn request_of(namespace: &str, request: &Call, settings: &CacheSettings) -> Result<Request, Bypass> {
    let (rule, names) = rule(request.method).ok_or(Bypass::Method)?;
    let keep = match rule {
        Rule::BlockHash => Keep::Forever,
        Rule::Transaction => Keep::OnceAnswerFinal,
        Rule::Chain => Keep::For(settings.chain_ttl_s),
        Rule::Block(at) => match BlockRef::of(request.params.get(at)) {
            BlockRef::Hash => Keep::Forever,
            BlockRef::Number(number) => Keep::OnceFinal(number),
            BlockRef::Moving => return Err(Bypass::Moving),
            BlockRef::Malformed => return Err(Bypass::Malformed),
        },
        Rule::Logs => match LogFilter::of(request.params.get(0)) {
            LogFilter::Hash(_) => Keep::Forever,
            LogFilter::Range(from, to) => Keep::OnceFinal(from.max(to)),
            LogFilter::Moving => return Err(Bypass::Moving),
            LogFilter::Malformed => return Err(Bypass::Malformed),
        },
    };
    if !matches!(request.params, Value::Array(_) | Value::Null) {
        return Err(Bypass::Malformed);
    }
    let asked = Asked::of(rule, &request.params).ok_or(Bypass::Malformed)?;
    Ok(Request {
        key: key(namespace, request.method, &request.params),
        id: request.id.map_or_else(|| "null".to_string(), |id| id.get().to_string()),
        keep,
        asked,
        names,
    })
}

/// The key of a call: SHA-256 over the namespace, the method and the canonical params.
fn key(namespace: &str, method: &str, params: &Value) -> Key {
    let mut digest = Sha256::new();
    for part in [namespace.as_bytes(), method.as_bytes()] {
        digest.update((part.len() as u64).to_le_bytes());
        digest.update(part);
    }
    let mut canonical_params = Vec::new();
    canonical(params, &mut canonical_params);
    digest.update(&canonical_params);
    Key(digest.finalize().into())
}

/// The key under which the receipt of the transaction `hash` (lower case) is stored, as a
/// client that spells the hash in lower case asks for it: where the daemon looks first for the
/// block of a [`Final::Transaction`].
pub fn receipt_key(namespace: &str, hash: &str) -> Key {
    key(namespace, RECEIPT, &Value::Array(vec![Value::String(hash.to_string())]))
}

/// The method whose answer places a transaction in its block.
pub const RECEIPT: &str = "eth_getTransactionReceipt";

/// The block of the transaction `hash` (lower case), from a node's answer to [`RECEIPT`] (a
/// stored one, or the finality node's): only a receipt of that transaction that names its block.
pub fn receipt_block(answer: &[u8], hash: &str) -> Option<u64> {
    let answer: Value = serde_json::from_slice(answer).ok()?;
    let receipt = answer.get("result")?;
    let names = receipt.get("transactionHash").and_then(Value::as_str).is_some_and(|h| h.eq_ignore_ascii_case(hash));
    names.then(|| receipt.get("blockNumber").and_then(rules::block_number)).flatten()
}

#[derive(Deserialize)]
struct JsonRpcResponse<'a> {
    /// `Some("null")` for a null result, `None` for none at all.
    #[serde(borrow, default, deserialize_with = "present")]
    result: Option<&'a RawValue>,
    error: Option<serde::de::IgnoredAny>,
    #[serde(borrow)]
    id: Option<&'a RawValue>,
}

fn present<'de, D: serde::Deserializer<'de>>(value: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&RawValue>::deserialize(value).map(Some)
}

impl Request {
    /// What to store of the node's answer `body` (plain, as the node sent it).
    pub fn capture(&self, body: &[u8], settings: &CacheSettings) -> Result<Capture, Refusal> {
        if body.len() > settings.max_entry {
            return Err(Refusal::TooLarge);
        }
        let response: JsonRpcResponse = serde_json::from_slice(body).map_err(|_| Refusal::Malformed)?;
        let result = match (response.result, response.error) {
            (Some(result), None) => result.get(),
            _ => return Err(Refusal::Error),
        };
        if result == "null" {
            return Err(Refusal::Null);
        }
        let named = self.named(result)?;
        let (ttl_s, requires_final) = match self.keep {
            Keep::Forever | Keep::OnceAnswerFinal if matches!(result, "[]" | "{}" | "\"\"" | "\"0x\"") => {
                // What a hash names may be missing only because the node has not seen it yet.
                return Err(Refusal::Empty);
            }
            Keep::Forever => (None, None),
            Keep::For(ttl) => (Some(ttl), None),
            Keep::OnceFinal(number) => (None, Some(Final::Block(number))),
            // the bytes whose keccak-256 is the hash asked for: the same wherever the transaction is
            Keep::OnceAnswerFinal if self.names == Names::RawTransaction => (None, None),
            // the answer names no block: the daemon finds the transaction's
            Keep::OnceAnswerFinal if self.names == Names::Nothing => match &self.asked {
                Asked::Transaction(hash) => (None, Some(Final::Transaction(hash.clone()))),
                _ => return Err(Refusal::NoBlock),
            },
            // a transaction the answer places in no block is pending
            Keep::OnceAnswerFinal => (None, Some(Final::Block(answer_block(result).ok_or(Refusal::NoBlock)?))),
        };
        let mut tail = Vec::with_capacity(result.len() + 1);
        tail.extend_from_slice(result.as_bytes());
        tail.push(b'}');
        let envelope = response.id.and_then(|id| Envelope::of(body, id.get(), result)).unwrap_or_default();
        let block_hash = named.filter(|_| matches!(requires_final, Some(Final::Block(_))));
        Ok(Capture { key: self.key, ttl_s, requires_final, block_hash, envelope, tail })
    }
}

impl Request {
    /// Whether the answer's `result` names what the request asked for, where it can say: a
    /// `Mismatch` if not. If it does, the hash of the one block it names, if any.
    fn named(&self, result: &str) -> Result<Option<String>, Refusal> {
        if self.names == Names::Nothing || self.asked == Asked::Nothing {
            return Ok(None);
        }
        let result: Value = serde_json::from_str(result).map_err(|_| Refusal::Mismatch)?;
        if !self.names.agree(&self.asked, &result) {
            return Err(Refusal::Mismatch);
        }
        // a range's answer names many blocks
        match self.asked {
            Asked::BlockNumber(_) | Asked::Transaction(_) => self.names.block_hash(&result).map_err(|()| Refusal::Mismatch),
            _ => Ok(None),
        }
    }
}

/// The block a transaction's answer names: its `blockNumber`, or for a list of traces the
/// highest of theirs (each must name one).
fn answer_block(result: &str) -> Option<u64> {
    let number = |value: &Value| value.get("blockNumber").and_then(rules::block_number);
    match serde_json::from_str::<Value>(result).ok()? {
        Value::Array(items) if !items.is_empty() => {
            items.iter().map(number).try_fold(0, |max, n| Some(max.max(n?)))
        }
        value @ Value::Object(_) => number(&value),
        _ => None,
    }
}

/// JSON with object keys sorted and no whitespace, so that spelling never splits entries.
fn canonical(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                canonical(item, out);
            }
            out.push(b']');
        }
        Value::Object(object) => {
            let mut keys: Vec<_> = object.keys().collect();
            keys.sort();
            out.push(b'{');
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                serde_json::to_writer(&mut *out, key).expect("a string serialises");
                out.push(b':');
                canonical(&object[key], out);
            }
            out.push(b'}');
        }
        scalar => serde_json::to_writer(&mut *out, scalar).expect("a scalar serialises"),
    }
}

#[cfg(test)]
mod tests;
