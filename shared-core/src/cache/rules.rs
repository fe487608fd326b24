//! Which JSON-RPC methods the cache may answer, and where their block reference sits. An
//! allow-list: a method not here is never cached.

use serde_json::Value;

/// Why an answer of this method stays the same.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    /// The content behind a block hash never changes: cached without expiry.
    BlockHash,
    /// Keyed by a transaction hash, which a reorg can move or drop: cached only when the answer
    /// names a finalized block.
    Transaction,
    /// By block number, tag or EIP-1898 block object, at this index of the params: cached when
    /// the number is finalized (a block object with a hash counts as by-hash).
    Block(usize),
    /// A property of the chain: cached for the configured TTL, in case the node behind is swapped.
    Chain,
}

/// The allow-list.
pub const TABLE: &[(&str, Rule)] = &[
    ("eth_getBlockByHash", Rule::BlockHash),
    ("eth_getBlockTransactionCountByHash", Rule::BlockHash),
    ("eth_getTransactionByBlockHashAndIndex", Rule::BlockHash),
    ("eth_getRawTransactionByBlockHashAndIndex", Rule::BlockHash),
    ("eth_getUncleByBlockHashAndIndex", Rule::BlockHash),
    ("eth_getUncleCountByBlockHash", Rule::BlockHash),
    ("debug_traceBlockByHash", Rule::BlockHash),
    ("debug_getModifiedAccountsByHash", Rule::BlockHash),
    ("erigon_getBlockReceiptsByBlockHash", Rule::BlockHash),
    ("erigon_getHeaderByHash", Rule::BlockHash),
    ("erigon_getLogsByHash", Rule::BlockHash),
    ("ots_getBlockDetailsByHash", Rule::BlockHash),
    ("eth_getTransactionByHash", Rule::Transaction),
    ("eth_getRawTransactionByHash", Rule::Transaction),
    ("eth_getTransactionReceipt", Rule::Transaction),
    ("debug_traceTransaction", Rule::Transaction),
    ("trace_transaction", Rule::Transaction),
    ("trace_get", Rule::Transaction),
    ("trace_replayTransaction", Rule::Transaction),
    ("ots_traceTransaction", Rule::Transaction),
    ("ots_getTransactionError", Rule::Transaction),
    ("ots_getInternalOperations", Rule::Transaction),
    ("eth_getBlockByNumber", Rule::Block(0)),
    ("eth_getBlockReceipts", Rule::Block(0)),
    ("eth_getBlockTransactionCountByNumber", Rule::Block(0)),
    ("eth_getTransactionByBlockNumberAndIndex", Rule::Block(0)),
    ("eth_getRawTransactionByBlockNumberAndIndex", Rule::Block(0)),
    ("eth_getUncleByBlockNumberAndIndex", Rule::Block(0)),
    ("eth_getUncleCountByBlockNumber", Rule::Block(0)),
    ("debug_traceBlockByNumber", Rule::Block(0)),
    ("debug_getRawBlock", Rule::Block(0)),
    ("debug_getRawHeader", Rule::Block(0)),
    ("debug_getRawReceipts", Rule::Block(0)),
    ("trace_block", Rule::Block(0)),
    ("trace_replayBlockTransactions", Rule::Block(0)),
    ("erigon_getHeaderByNumber", Rule::Block(0)),
    ("erigon_getBalanceChangesInBlock", Rule::Block(0)),
    ("ots_getBlockDetails", Rule::Block(0)),
    ("ots_getBlockTransactions", Rule::Block(0)),
    ("eth_getBalance", Rule::Block(1)),
    ("eth_getCode", Rule::Block(1)),
    ("eth_getTransactionCount", Rule::Block(1)),
    ("eth_call", Rule::Block(1)),
    ("eth_estimateGas", Rule::Block(1)),
    ("eth_createAccessList", Rule::Block(1)),
    ("eth_feeHistory", Rule::Block(1)),
    ("debug_traceCall", Rule::Block(1)),
    ("eth_getStorageAt", Rule::Block(2)),
    ("eth_getProof", Rule::Block(2)),
    ("trace_call", Rule::Block(2)),
    ("eth_chainId", Rule::Chain),
    ("net_version", Rule::Chain),
];

/// The rule for `method`, or `None`: never cached.
pub fn rule(method: &str) -> Option<Rule> {
    TABLE.iter().find(|(name, _)| *name == method).map(|&(_, rule)| rule)
}

/// What a block parameter names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockRef {
    Hash,
    Number(u64),
    /// `latest`, `pending`, `safe`, `finalized`, or no parameter (which means `latest`): moves.
    Moving,
    Malformed,
}

impl BlockRef {
    /// A block parameter: a hash, a quantity, a tag, or an EIP-1898 object.
    pub fn of(param: Option<&Value>) -> BlockRef {
        match param {
            None | Some(Value::Null) => BlockRef::Moving,
            Some(Value::String(s)) => match s.as_str() {
                "earliest" => BlockRef::Number(0),
                "latest" | "pending" | "safe" | "finalized" => BlockRef::Moving,
                s if s.len() == 66 && is_hex(s) => BlockRef::Hash,
                s => quantity(s).map_or(BlockRef::Malformed, BlockRef::Number),
            },
            Some(Value::Object(object)) => match (object.get("blockHash"), object.get("blockNumber")) {
                (Some(Value::String(hash)), None) if hash.len() == 66 && is_hex(hash) => BlockRef::Hash,
                (None, Some(number @ Value::String(_))) => BlockRef::of(Some(number)),
                _ => BlockRef::Malformed,
            },
            Some(_) => BlockRef::Malformed,
        }
    }
}

/// A block number named in an answer: a hex quantity or a JSON number.
pub fn block_number(value: &Value) -> Option<u64> {
    match value {
        Value::String(s) => quantity(s),
        Value::Number(n) => n.as_u64(),
        _ => None,
    }
}

/// A JSON-RPC quantity: `0x` and 1 to 16 hex digits.
fn quantity(s: &str) -> Option<u64> {
    let digits = s.strip_prefix("0x")?;
    if digits.is_empty() || digits.len() > 16 {
        return None;
    }
    u64::from_str_radix(digits, 16).ok()
}

fn is_hex(s: &str) -> bool {
    s.strip_prefix("0x").is_some_and(|digits| digits.bytes().all(|b| b.is_ascii_hexdigit()))
}
