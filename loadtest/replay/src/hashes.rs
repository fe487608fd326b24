//! The hash of each block the recordings name, per network: so that `eth_getBlockByNumber(N,
//! false)`, which a cache daemon asks to pin a final block's answers to its hash, is answered as
//! the recorded chain has block N where no recording answers that call itself.

use std::collections::HashMap;

use rpcedge_corpus::corpus::Corpus;
use rpcedge_corpus::json::{self, Json};

/// The methods whose answers name their block at the top level. The others are not read: the
/// corpus holds gigabytes of traces and state. Uncles name blocks off the chain.
const NAMING: &[&str] = &[
    "eth_getBlockByNumber",
    "eth_getBlockByHash",
    "erigon_getHeaderByNumber",
    "erigon_getHeaderByHash",
    "eth_getTransactionByHash",
    "eth_getTransactionReceipt",
    "eth_getTransactionByBlockNumberAndIndex",
    "eth_getTransactionByBlockHashAndIndex",
    "eth_getBlockReceipts",
    "erigon_getBlockReceiptsByBlockHash",
    "eth_getLogs",
    "erigon_getLogsByHash",
    "trace_block",
    "trace_transaction",
    "trace_get",
];

/// Block hashes by network and number; `None` where two recordings name different ones.
#[derive(Default)]
pub struct Hashes(HashMap<(String, u64), Option<String>>);

impl Hashes {
    /// What every network's recordings of [`NAMING`] name: a block or header (`number`, `hash`),
    /// and what a block holds (`blockNumber`, `blockHash`: a transaction, a receipt, a log, a
    /// trace), or a list of those.
    pub fn of(corpus: &Corpus) -> Hashes {
        let mut hashes = Hashes::default();
        for network in corpus.network_names() {
            for (key, recording) in corpus.network(network).into_iter().flatten() {
                let names = |method: &&str| key.as_bytes().strip_prefix(b"S[\"").is_some_and(|key| key.starts_with(method.as_bytes()) && key.get(method.len()) == Some(&b'"'));
                if recording.placeholder || !NAMING.iter().any(names) {
                    continue;
                }
                let Ok(body) = std::str::from_utf8(recording.template.recorded()) else { continue };
                if let Ok(answer) = json::parse(body) {
                    for (number, hash) in named_blocks(answer.get("result")) {
                        hashes.add(network, number, hash);
                    }
                }
            }
        }
        hashes
    }

    fn add(&mut self, network: &str, number: u64, hash: String) {
        let known = self.0.entry((network.to_string(), number)).or_insert_with(|| Some(hash.clone()));
        if known.as_ref().is_some_and(|known| *known != hash) {
            *known = None;
        }
    }

    /// The answer to `request` on `network` when it asks `eth_getBlockByNumber` for a block by
    /// its number, without transactions, and the recordings name that block: its number and
    /// hash, which is what a caller that pins a hash reads.
    pub fn answer(&self, network: &str, request: &Json) -> Option<Vec<u8>> {
        if request.get("method")?.as_str()? != "eth_getBlockByNumber" {
            return None;
        }
        let Some(Json::Array(params)) = request.get("params") else { return None };
        let (Some(number), Some(Json::Bool(false)), 2) = (params.first().and_then(quantity), params.get(1), params.len()) else {
            return None;
        };
        let hash = self.0.get(&(network.to_string(), number))?.as_ref()?;
        let mut out = br#"{"jsonrpc":"2.0","id":"#.to_vec();
        request.get("id").unwrap_or(&Json::Null).write_compact(&mut out);
        out.extend_from_slice(format!(r#","result":{{"number":"{number:#x}","hash":"{hash}"}}}}"#).as_bytes());
        Some(out)
    }
}

/// The blocks `result` names, as (number, lower-case hash).
fn named_blocks(result: Option<&Json>) -> Vec<(u64, String)> {
    let named = |item: &Json, number: &str, hash: &str| {
        let hash = item.get(hash)?.as_str().filter(|hash| hash.len() == 66 && hash.starts_with("0x"))?;
        Some((block_number(item.get(number)?)?, hash.to_ascii_lowercase()))
    };
    let of_item = |item: &Json| [named(item, "number", "hash"), named(item, "blockNumber", "blockHash")];
    match result {
        Some(Json::Array(items)) => items.iter().flat_map(of_item).flatten().collect(),
        Some(item @ Json::Object(_)) => of_item(item).into_iter().flatten().collect(),
        _ => Vec::new(),
    }
}

/// A hex quantity (`0x2a`), as block numbers are written in requests.
fn quantity(value: &Json) -> Option<u64> {
    u64::from_str_radix(value.as_str()?.strip_prefix("0x")?, 16).ok()
}

/// A block number as answers write it: a hex quantity, or a JSON number (traces).
fn block_number(value: &Json) -> Option<u64> {
    match value {
        Json::Number(digits) => digits.parse().ok(),
        other => quantity(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_is_answered_by_the_hash_the_recordings_give_it() {
        let mut hashes = Hashes::default();
        let block = json::parse(r#"{"number":"0x10","hash":"0xAB00000000000000000000000000000000000000000000000000000000000000"}"#).unwrap();
        let receipts = json::parse(
            r#"[{"blockNumber":"0x11","blockHash":"0x1100000000000000000000000000000000000000000000000000000000000000"},
                {"blockNumber":18,"blockHash":"0x1200000000000000000000000000000000000000000000000000000000000000"}]"#,
        )
        .unwrap();
        for (number, hash) in named_blocks(Some(&block)).into_iter().chain(named_blocks(Some(&receipts))) {
            hashes.add("mainnet", number, hash);
        }
        hashes.add("mainnet", 0x12, format!("0x{}", "99".repeat(32)));
        let ask = |params: &str| {
            let request = format!(r#"{{"jsonrpc":"2.0","id":"x","method":"eth_getBlockByNumber","params":{params}}}"#);
            hashes.answer("mainnet", &json::parse(&request).unwrap()).map(|answer| String::from_utf8(answer).unwrap())
        };
        assert_eq!(
            ask(r#"["0x10",false]"#).as_deref(),
            Some(r#"{"jsonrpc":"2.0","id":"x","result":{"number":"0x10","hash":"0xab00000000000000000000000000000000000000000000000000000000000000"}}"#)
        );
        assert!(ask(r#"["0x11",false]"#).is_some());
        assert_eq!(ask(r#"["0x12",false]"#), None, "two recordings, two hashes: not known");
        assert_eq!(ask(r#"["0x10",true]"#), None, "a whole block is the recordings' to answer");
        assert_eq!(ask(r#"["0x13",false]"#), None);
        assert_eq!(ask(r#"["finalized",false]"#), None);
        assert_eq!(hashes.answer("sepolia", &json::parse(r#"{"method":"eth_getBlockByNumber","params":["0x10",false]}"#).unwrap()), None);
    }

    #[test]
    fn the_recordings_read_are_blocks_and_what_they_hold_never_uncles() {
        let dir = std::env::temp_dir().join(format!("rpcedge-replay-hashes-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let pair = |method: &str, result: &str| {
            format!(r#"{{"request":{{"jsonrpc":"2.0","id":1,"method":"{method}","params":["0x10",false]}},"response":{{"jsonrpc":"2.0","id":1,"result":{result}}}}}"#)
        };
        let block = |hash: &str| format!(r#"{{"number":"0x10","hash":"0x{}"}}"#, hash.repeat(32));
        let pairs = [pair("eth_getBlockByNumber", &block("aa")), pair("eth_getUncleByBlockNumberAndIndex", &block("bb")), pair("eth_getBlockByNumberX", &block("cc"))];
        std::fs::write(dir.join("test__mainnet__blocks.json"), format!("[{}]", pairs.join(","))).unwrap();
        let hashes = Hashes::of(&Corpus::load(&dir, 1, None).unwrap());
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(hashes.0.get(&("mainnet".to_string(), 0x10)), Some(&Some(format!("0x{}", "aa".repeat(32)))));
        assert_eq!(hashes.0.len(), 1);
    }
}
