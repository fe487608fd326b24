//! Which JSON-RPC methods the cache may answer, and where their block reference sits. An
//! allow-list: a method not here is never cached.

use serde_json::Value;
use sha3::{Digest, Keccak256};

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
    /// A log filter (`eth_getLogs`): by its `blockHash` without expiry, or by a range whose both
    /// ends are numbers once the higher is finalized; a tag or an open end moves.
    Logs,
}

/// A block's answer: its hash and number as blocks and headers name them.
const BLOCK: Names = Names::Block { hash: &["hash"], number: &["number"] };
/// What a block holds (transactions, receipts, logs, traces): each names its block.
const IN_BLOCK: Names = Names::Block { hash: &["blockHash"], number: &["blockNumber"] };

/// The allow-list, and what of each answer names what was asked.
pub const TABLE: &[(&str, Rule, Names)] = &[
    ("eth_getBlockByHash", Rule::BlockHash, BLOCK),
    ("eth_getBlockTransactionCountByHash", Rule::BlockHash, Names::Nothing),
    ("eth_getTransactionByBlockHashAndIndex", Rule::BlockHash, IN_BLOCK),
    ("eth_getRawTransactionByBlockHashAndIndex", Rule::BlockHash, Names::Nothing),
    ("eth_getUncleByBlockHashAndIndex", Rule::BlockHash, Names::Nothing),
    ("eth_getUncleCountByBlockHash", Rule::BlockHash, Names::Nothing),
    ("debug_traceBlockByHash", Rule::BlockHash, Names::Nothing),
    ("debug_getModifiedAccountsByHash", Rule::BlockHash, Names::Nothing),
    ("erigon_getBlockReceiptsByBlockHash", Rule::BlockHash, IN_BLOCK),
    ("erigon_getHeaderByHash", Rule::BlockHash, BLOCK),
    ("erigon_getLogsByHash", Rule::BlockHash, IN_BLOCK),
    (
        "ots_getBlockDetailsByHash",
        Rule::BlockHash,
        Names::Block { hash: &["block", "hash"], number: &["block", "number"] },
    ),
    ("eth_getTransactionByHash", Rule::Transaction, Names::Transaction(&["hash"])),
    ("eth_getRawTransactionByHash", Rule::Transaction, Names::RawTransaction),
    ("eth_getTransactionReceipt", Rule::Transaction, Names::Transaction(&["transactionHash"])),
    ("debug_traceTransaction", Rule::Transaction, Names::Nothing),
    ("trace_transaction", Rule::Transaction, Names::Transaction(&["transactionHash"])),
    ("trace_get", Rule::Transaction, Names::Transaction(&["transactionHash"])),
    ("trace_replayTransaction", Rule::Transaction, Names::Nothing),
    ("ots_traceTransaction", Rule::Transaction, Names::Nothing),
    ("ots_getTransactionError", Rule::Transaction, Names::Nothing),
    ("ots_getInternalOperations", Rule::Transaction, Names::Nothing),
    ("eth_getBlockByNumber", Rule::Block(0), BLOCK),
    ("eth_getBlockReceipts", Rule::Block(0), IN_BLOCK),
    ("eth_getBlockTransactionCountByNumber", Rule::Block(0), Names::Nothing),
    ("eth_getTransactionByBlockNumberAndIndex", Rule::Block(0), IN_BLOCK),
    ("eth_getRawTransactionByBlockNumberAndIndex", Rule::Block(0), Names::Nothing),
    ("eth_getUncleByBlockNumberAndIndex", Rule::Block(0), Names::Nothing),
    ("eth_getUncleCountByBlockNumber", Rule::Block(0), Names::Nothing),
    ("debug_traceBlockByNumber", Rule::Block(0), Names::Nothing),
    ("debug_getRawBlock", Rule::Block(0), Names::Nothing),
    ("debug_getRawHeader", Rule::Block(0), Names::Nothing),
    ("debug_getRawReceipts", Rule::Block(0), Names::Nothing),
    ("trace_block", Rule::Block(0), IN_BLOCK),
    ("trace_replayBlockTransactions", Rule::Block(0), Names::Nothing),
    ("erigon_getHeaderByNumber", Rule::Block(0), BLOCK),
    ("erigon_getBalanceChangesInBlock", Rule::Block(0), Names::Nothing),
    ("ots_getBlockDetails", Rule::Block(0), Names::Block { hash: &["block", "hash"], number: &["block", "number"] }),
    (
        "ots_getBlockTransactions",
        Rule::Block(0),
        Names::Block { hash: &["fullblock", "hash"], number: &["fullblock", "number"] },
    ),
    ("eth_getBalance", Rule::Block(1), Names::Nothing),
    ("eth_getCode", Rule::Block(1), Names::Nothing),
    ("eth_getTransactionCount", Rule::Block(1), Names::Nothing),
    ("eth_call", Rule::Block(1), Names::Nothing),
    ("eth_estimateGas", Rule::Block(1), Names::Nothing),
    ("eth_createAccessList", Rule::Block(1), Names::Nothing),
    ("eth_feeHistory", Rule::Block(1), Names::Nothing),
    ("debug_traceCall", Rule::Block(1), Names::Nothing),
    ("eth_getStorageAt", Rule::Block(2), Names::Nothing),
    ("eth_getProof", Rule::Block(2), Names::Nothing),
    ("trace_call", Rule::Block(2), Names::Nothing),
    ("eth_getLogs", Rule::Logs, IN_BLOCK),
    ("eth_chainId", Rule::Chain, Names::Nothing),
    ("net_version", Rule::Chain, Names::Nothing),
];

/// What in an answer names what its request asked for. An answer is stored only if it agrees,
/// so that a node that answered something else (or read the request otherwise) stores nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Names {
    /// The answer carries nothing that names the request's block or transaction.
    Nothing,
    /// A block's hash and number at these paths of the result (of each item, for a list).
    Block { hash: &'static [&'static str], number: &'static [&'static str] },
    /// The transaction's hash at this path of the result (of each item, for a list).
    Transaction(&'static [&'static str]),
    /// The result is the transaction's raw bytes, whose keccak-256 is its hash.
    RawTransaction,
}

/// What a request asked for, as an answer can name it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Asked {
    Nothing,
    /// In lower case.
    BlockHash(String),
    BlockNumber(u64),
    /// Blocks `from` to `to`, both included.
    BlockRange(u64, u64),
    /// In lower case.
    Transaction(String),
}

impl Names {
    /// Whether `result` names what was `asked`.
    pub fn agree(self, asked: &Asked, result: &Value) -> bool {
        match (self, asked) {
            (Names::Nothing, _) | (_, Asked::Nothing) => true,
            (Names::Block { hash, .. }, Asked::BlockHash(asked)) => {
                each(result, &|item| is_hash(at(item, hash), asked))
            }
            (Names::Block { number, .. }, Asked::BlockNumber(asked)) => {
                each(result, &|item| at(item, number).and_then(block_number) == Some(*asked))
            }
            (Names::Block { number, .. }, Asked::BlockRange(from, to)) => each(result, &|item| {
                at(item, number).and_then(block_number).is_some_and(|n| (*from..=*to).contains(&n))
            }),
            (Names::Transaction(path), Asked::Transaction(asked)) => {
                each(result, &|item| is_hash(at(item, path), asked))
            }
            (Names::RawTransaction, Asked::Transaction(asked)) => raw_hash(result).as_deref() == Some(asked.as_str()),
            // a method's table row and its rule disagree: nothing to check against
            (Names::Block { .. } | Names::Transaction(_) | Names::RawTransaction, _) => false,
        }
    }

    /// The hash (in lower case) of the block that `result` names, where it names one: the one
    /// every item that names a block names. `Err` when two items name different blocks.
    pub fn block_hash(self, result: &Value) -> Result<Option<String>, ()> {
        let path: &[&str] = match self {
            Names::Block { hash, .. } => hash,
            // a transaction's answer (a receipt, the transaction, its traces) names its block so
            Names::Transaction(_) => &["blockHash"],
            Names::Nothing | Names::RawTransaction => return Ok(None),
        };
        let mut hashes = Vec::new();
        hashes_at(result, path, &mut hashes);
        match hashes.split_first() {
            Some((first, rest)) if rest.iter().any(|hash| !hash.eq_ignore_ascii_case(first)) => Err(()),
            first => Ok(first.map(|(first, _)| first.to_ascii_lowercase())),
        }
    }
}

/// The block hashes at `path` of `value`, or of each item of a list (of lists).
fn hashes_at<'v>(value: &'v Value, path: &[&str], out: &mut Vec<&'v str>) {
    match value {
        Value::Array(items) => items.iter().for_each(|item| hashes_at(item, path, out)),
        item => match at(item, path) {
            Some(Value::String(hash)) if is_hash_hex(hash) => out.push(hash),
            _ => {}
        },
    }
}

/// `check` holds for `value`, or for every item of a list (of lists).
fn each(value: &Value, check: &dyn Fn(&Value) -> bool) -> bool {
    match value {
        Value::Array(items) => items.iter().all(|item| each(item, check)),
        item => check(item),
    }
}

fn at<'v>(value: &'v Value, path: &[&str]) -> Option<&'v Value> {
    path.iter().try_fold(value, |value, member| value.get(member))
}

fn is_hash(value: Option<&Value>, asked: &str) -> bool {
    matches!(value, Some(Value::String(hash)) if hash.eq_ignore_ascii_case(asked))
}

/// The keccak-256 of a raw transaction's hex bytes, as lower-case hex.
fn raw_hash(result: &Value) -> Option<String> {
    let digits = result.as_str()?.strip_prefix("0x")?;
    if digits.len() % 2 != 0 {
        return None;
    }
    let mut raw = vec![0; digits.len() / 2];
    faster_hex::hex_decode(digits.as_bytes(), &mut raw).ok()?;
    let hash = Keccak256::digest(&raw);
    Some(format!("0x{}", faster_hex::hex_string(&hash)))
}

impl Asked {
    /// What the request with these params asks for, under `rule`; `None` when the params cannot
    /// name it (the request is then malformed).
    pub fn of(rule: Rule, params: &Value) -> Option<Asked> {
        let hash = |param: Option<&Value>| match param {
            Some(Value::String(s)) if is_hash_hex(s) => Some(s.to_ascii_lowercase()),
            _ => None,
        };
        Some(match rule {
            Rule::BlockHash => Asked::BlockHash(hash(params.get(0))?),
            Rule::Transaction => Asked::Transaction(hash(params.get(0))?),
            Rule::Chain => Asked::Nothing,
            Rule::Logs => match LogFilter::of(params.get(0)) {
                LogFilter::Hash(asked) => Asked::BlockHash(asked),
                LogFilter::Range(from, to) => Asked::BlockRange(from, to),
                LogFilter::Moving | LogFilter::Malformed => return None,
            },
            Rule::Block(index) => match (BlockRef::of(params.get(index)), params.get(index)) {
                (BlockRef::Number(number), _) => Asked::BlockNumber(number),
                (BlockRef::Hash, Some(Value::Object(object))) => Asked::BlockHash(hash(object.get("blockHash"))?),
                (BlockRef::Hash, param) => Asked::BlockHash(hash(param)?),
                (BlockRef::Moving | BlockRef::Malformed, _) => return None,
            },
        })
    }
}

/// The rule for `method`, or `None`: never cached.
pub fn rule(method: &str) -> Option<(Rule, Names)> {
    TABLE.iter().find(|(name, _, _)| *name == method).map(|&(_, rule, names)| (rule, names))
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
                s if is_hash_hex(s) => BlockRef::Hash,
                s => quantity(s).map_or(BlockRef::Malformed, BlockRef::Number),
            },
            Some(Value::Object(object)) => match (object.get("blockHash"), object.get("blockNumber")) {
                (Some(Value::String(hash)), None) if is_hash_hex(hash) => BlockRef::Hash,
                (None, Some(number @ Value::String(_))) => BlockRef::of(Some(number)),
                _ => BlockRef::Malformed,
            },
            Some(_) => BlockRef::Malformed,
        }
    }
}

/// What a log filter names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogFilter {
    /// A block's hash, in lower case.
    Hash(String),
    /// Blocks `from` to `to`, numbers both (`earliest` is 0).
    Range(u64, u64),
    /// An end at a tag or left out (which means `latest`).
    Moving,
    Malformed,
}

impl LogFilter {
    /// A filter object. Its members are read as spelled: one a node would read in another case
    /// (`"FromBlock"`) is not one of these, so the filter reads as moving and bypasses.
    pub fn of(param: Option<&Value>) -> LogFilter {
        let Some(Value::Object(filter)) = param else { return LogFilter::Malformed };
        let end = |name| BlockRef::of(filter.get(name));
        match (filter.get("blockHash"), end("fromBlock"), end("toBlock")) {
            (Some(Value::String(hash)), BlockRef::Moving, BlockRef::Moving)
                if filter.get("fromBlock").is_none() && filter.get("toBlock").is_none() && is_hash_hex(hash) =>
            {
                LogFilter::Hash(hash.to_ascii_lowercase())
            }
            (Some(_), _, _) => LogFilter::Malformed,
            (None, BlockRef::Number(from), BlockRef::Number(to)) => LogFilter::Range(from, to),
            (None, BlockRef::Malformed | BlockRef::Hash, _) | (None, _, BlockRef::Malformed | BlockRef::Hash) => {
                LogFilter::Malformed
            }
            (None, _, _) => LogFilter::Moving,
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

/// A 32-byte hash as JSON-RPC spells it: `0x` and 64 hex digits, in either case.
pub fn is_hash_hex(s: &str) -> bool {
    s.len() == 66 && is_hex(s)
}

fn is_hex(s: &str) -> bool {
    s.strip_prefix("0x").is_some_and(|digits| digits.bytes().all(|b| b.is_ascii_hexdigit()))
}
