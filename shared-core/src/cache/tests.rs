use std::io::Read;

use proptest::prelude::*;

use super::head::MAX_HEAD;
use super::*;

const HASH: &str = "0x88e96d4537bea4d9c05d12549907b32561d3bf31f45aae734cdc119f13406cb6";
const TX: &str = "0x5c504ed432cb51138bcf09aa5e8a410dd4a1e204ef84bfed1be16dfba1b22060";

fn settings() -> CacheSettings {
    CacheSettings::default()
}

/// No response headers.
const NONE: &[(&str, &[u8])] = &[];

/// A request's cache exchange in `namespace`, from a client that takes gzip or not and asks for
/// SSZ or not.
fn exchange(namespace: Option<&str>, body: Option<&[u8]>, gzip: bool, ssz: bool) -> CacheExchange {
    let mut headers = vec![("accept-encoding", if gzip { "gzip" } else { "identity" })];
    if ssz {
        headers.push(("accept", "application/octet-stream"));
    }
    CacheExchange::new(namespace, b"POST", b"/", body, &headers, &settings())
}

fn request(method: &str, params: &str) -> String {
    format!(r#"{{"jsonrpc":"2.0","id":7,"method":"{method}","params":{params}}}"#)
}

fn decide(method: &str, params: &str) -> Result<Keep, Bypass> {
    lookup("example.com/mainnet", request(method, params).as_bytes(), &settings()).map(|r| r.keep)
}

/// One case per row of the table: the method with a typical request, and what is decided.
fn row_cases() -> Vec<(&'static str, String, Result<Keep, Bypass>)> {
    let at = |index: usize, block: &str| {
        let mut params: Vec<String> = vec![r#""0x407d73d8a49eeb85d32cf465507dd71d507100c1""#.into(); index];
        params.push(block.into());
        format!("[{}]", params.join(","))
    };
    let mut cases = Vec::new();
    for &(method, rule, _) in TABLE {
        let (params, keep) = match rule {
            Rule::BlockHash => (format!(r#"["{HASH}",false]"#), Ok(Keep::Forever)),
            Rule::Transaction => (format!(r#"["{TX}"]"#), Ok(Keep::OnceAnswerFinal)),
            Rule::Chain => ("[]".into(), Ok(Keep::For(3600))),
            Rule::Block(index) => (at(index, r#""0x10d4f""#), Ok(Keep::OnceFinal(0x10d4f))),
            Rule::Logs => (r#"[{"fromBlock":"0x10d4f","toBlock":"0x10d50"}]"#.into(), Ok(Keep::OnceFinal(0x10d50))),
        };
        cases.push((method, params, keep));
    }
    cases
}

#[test]
fn every_row_of_the_table_decides_as_its_rule_says() {
    let cases = row_cases();
    assert_eq!(cases.len(), TABLE.len());
    for (method, params, expected) in cases {
        assert_eq!(decide(method, &params), expected, "{method} {params}");
    }
}

#[test]
fn a_block_parameter_by_tag_number_hash_or_object() {
    let block = |param: &str| decide("eth_getBalance", &format!(r#"["0x407d73d8a49eeb85d32cf465507dd71d507100c1",{param}]"#));
    for tag in ["latest", "pending", "safe", "finalized"] {
        assert_eq!(block(&format!(r#""{tag}""#)), Err(Bypass::Moving), "{tag}");
    }
    assert_eq!(decide("eth_getBalance", r#"["0x407d73d8a49eeb85d32cf465507dd71d507100c1"]"#), Err(Bypass::Moving));
    assert_eq!(block(r#""earliest""#), Ok(Keep::OnceFinal(0)));
    assert_eq!(block(r#""0x0""#), Ok(Keep::OnceFinal(0)));
    assert_eq!(block(&format!(r#""{HASH}""#)), Ok(Keep::Forever));
    // EIP-1898
    assert_eq!(block(&format!(r#"{{"blockHash":"{HASH}","requireCanonical":true}}"#)), Ok(Keep::Forever));
    assert_eq!(block(r#"{"blockNumber":"0x2a"}"#), Ok(Keep::OnceFinal(42)));
    assert_eq!(block(r#"{"blockNumber":"latest"}"#), Err(Bypass::Moving));
    for bad in [r#""0x""#, r#""12""#, r#""0xzz""#, "12", r#"{"blockHash":"0x12"}"#, r#"{}"#, "true"] {
        assert_eq!(block(bad), Err(Bypass::Malformed), "{bad}");
    }
    // eth_call and eth_estimateGas at a tag
    assert_eq!(decide("eth_call", r#"[{"to":"0x0"},"latest"]"#), Err(Bypass::Moving));
    assert_eq!(decide("eth_estimateGas", r#"[{"to":"0x0"}]"#), Err(Bypass::Moving));
}

#[test]
fn what_is_never_cached() {
    for method in [
        "eth_sendRawTransaction",
        "eth_sendTransaction",
        "eth_newFilter",
        "eth_getFilterChanges",
        "eth_subscribe",
        "eth_blockNumber",
        "eth_gasPrice",
        "txpool_content",
        "engine_newPayloadV2",
        "unknown_method",
    ] {
        assert_eq!(decide(method, "[]"), Err(Bypass::Method), "{method}");
    }
    let s = settings();
    let batch = format!("  [{}]", request("eth_chainId", "[]"));
    assert_eq!(lookup("n", batch.as_bytes(), &s), Err(Bypass::Batch));
    for malformed in ["", "{", "null", r#"{"method":1}"#, r#"{"id":1}"#] {
        assert_eq!(lookup("n", malformed.as_bytes(), &s), Err(Bypass::Malformed), "{malformed}");
    }
    assert_eq!(lookup("n", request("eth_getBlockByHash", r#"{"hash":"0x1"}"#).as_bytes(), &s), Err(Bypass::Malformed));
    let mut large = request("eth_getBlockByHash", &format!(r#"["{HASH}",false]"#)).into_bytes();
    large.resize(s.max_request + 1, b' ');
    assert_eq!(lookup("n", &large, &s), Err(Bypass::TooLarge));
}

#[test]
fn logs_by_hash_or_by_a_range_of_numbers_and_never_at_a_tag() {
    let logs = |filter: &str| decide("eth_getLogs", &format!("[{filter}]"));
    let address = r#""address":"0x407d73d8a49eeb85d32cf465507dd71d507100c1","topics":[null,["0x01"]]"#;
    assert_eq!(logs(&format!(r#"{{"blockHash":"{HASH}",{address}}}"#)), Ok(Keep::Forever));
    assert_eq!(logs(&format!(r#"{{"fromBlock":"0x10","toBlock":"0x20",{address}}}"#)), Ok(Keep::OnceFinal(0x20)));
    assert_eq!(logs(r#"{"fromBlock":"earliest","toBlock":"0x0"}"#), Ok(Keep::OnceFinal(0)));
    // the node refuses a reversed range; the higher end still decides
    assert_eq!(logs(r#"{"fromBlock":"0x20","toBlock":"0x10"}"#), Ok(Keep::OnceFinal(0x20)));
    for moving in [
        r#"{"fromBlock":"0x10","toBlock":"latest"}"#,
        r#"{"fromBlock":"finalized","toBlock":"0x10"}"#,
        r#"{"fromBlock":"0x10"}"#,
        r#"{"toBlock":"0x10"}"#,
        "{}",
        // a node reads it as toBlock; this reading does not, so it moves
        r#"{"fromBlock":"0x10","ToBlock":"0x11"}"#,
    ] {
        assert_eq!(logs(moving), Err(Bypass::Moving), "{moving}");
    }
    for malformed in [
        format!(r#"{{"blockHash":"{HASH}","fromBlock":"0x1","toBlock":"0x2"}}"#),
        format!(r#"{{"blockHash":"{HASH}","toBlock":null}}"#),
        r#"{"blockHash":"0x12"}"#.to_string(),
        r#"{"fromBlock":"0x1","toBlock":"0xzz"}"#.to_string(),
        format!(r#"{{"fromBlock":"0x1","toBlock":"{HASH}"}}"#),
        r#"{"fromBlock":1,"toBlock":2}"#.to_string(),
        r#""0x1""#.to_string(),
    ] {
        assert_eq!(logs(&malformed), Err(Bypass::Malformed), "{malformed}");
    }
    assert_eq!(decide("eth_getLogs", "[]"), Err(Bypass::Malformed));
}

#[test]
fn logs_are_kept_only_when_every_log_is_in_what_was_asked() {
    let log = |hash: &str, number: &str| format!(r#"{{"blockHash":"{hash}","blockNumber":"{number}","logIndex":"0x0"}}"#);
    let range = r#"[{"fromBlock":"0x10","toBlock":"0x12"}]"#;
    let in_range = capture("eth_getLogs", range, &answer(&format!("[{},{}]", log(HASH, "0x10"), log(HASH, "0x12"))));
    assert_eq!(in_range.unwrap().requires_final, Some(Final::Block(0x12)));
    let outside = capture("eth_getLogs", range, &answer(&format!("[{}]", log(HASH, "0x13"))));
    assert_eq!(outside, Err(Refusal::Mismatch));
    assert_eq!(capture("eth_getLogs", range, &answer("[]")).unwrap().requires_final, Some(Final::Block(0x12)), "no logs, for good");
    let by_hash = format!(r#"[{{"blockHash":"{HASH}"}}]"#);
    let kept = capture("eth_getLogs", &by_hash, &answer(&format!("[{}]", log(&HASH.to_uppercase().replace("0X", "0x"), "0x1"))));
    assert_eq!((kept.unwrap().requires_final), None);
    let other = format!("0x{}", "ab".repeat(32));
    assert_eq!(capture("eth_getLogs", &by_hash, &answer(&format!("[{}]", log(&other, "0x1")))), Err(Refusal::Mismatch));
    // a node that has not seen the block yet may answer none
    assert_eq!(capture("eth_getLogs", &by_hash, &answer("[]")), Err(Refusal::Empty));
}

#[test]
fn the_key_ignores_spelling_and_the_id_but_not_the_namespace_method_or_params() {
    let s = settings();
    let key = |namespace: &str, body: &str| lookup(namespace, body.as_bytes(), &s).unwrap().key;
    let base = key("a/mainnet", r#"{"jsonrpc":"2.0","id":1,"method":"eth_call","params":[{"to":"0x1","data":"0x2"},"0x5"]}"#);
    let respelled = key(
        "a/mainnet",
        "{ \"params\" : [ { \"data\" : \"0x2\", \"to\" : \"0x1\" } , \"0x5\" ],\n \"method\":\"eth_call\", \"id\":\"other\", \"jsonrpc\":\"2.0\" }",
    );
    assert_eq!(base, respelled);
    assert_ne!(base, key("a/sepolia", r#"{"id":1,"method":"eth_call","params":[{"to":"0x1","data":"0x2"},"0x5"]}"#));
    assert_ne!(base, key("a/mainnet", r#"{"id":1,"method":"eth_call","params":[{"to":"0x1","data":"0x3"},"0x5"]}"#));
    assert_ne!(
        base,
        key("a/mainnet", r#"{"id":1,"method":"eth_estimateGas","params":[{"to":"0x1","data":"0x2"},"0x5"]}"#)
    );
    assert_eq!(base.hex().len(), 64);
}

#[test]
fn the_id_is_kept_as_the_client_spelled_it() {
    let s = settings();
    for (id, raw) in [(r#"7"#, "7"), (r#""abc\"d""#, r#""abc\"d""#), ("null", "null"), ("1.50", "1.50")] {
        let body = format!(r#"{{"id":{id},"method":"eth_chainId","params":[]}}"#);
        assert_eq!(lookup("n", body.as_bytes(), &s).unwrap().id, raw);
    }
    assert_eq!(lookup("n", br#"{"method":"eth_chainId"}"#, &s).unwrap().id, "null");
}

fn answer(result: &str) -> String {
    format!(r#"{{"jsonrpc":"2.0","id":7,"result":{result}}}"#)
}

fn capture(method: &str, params: &str, body: &str) -> Result<Capture, Refusal> {
    let s = settings();
    lookup("n", request(method, params).as_bytes(), &s).unwrap().capture(body.as_bytes(), &s)
}

#[test]
fn what_of_an_answer_is_kept() {
    let by_hash = |body: &str| capture("eth_getBlockByHash", &format!(r#"["{HASH}",false]"#), body);
    let block = format!(r#"{{"hash":"{HASH}","number":"0x1b4"}}"#);
    let kept = by_hash(&answer(&block)).unwrap();
    assert_eq!(kept.tail, format!("{block}}}").as_bytes());
    assert_eq!((kept.ttl_s, kept.requires_final), (None, None));
    assert_eq!(by_hash(&answer("null")), Err(Refusal::Null));
    assert_eq!(by_hash(&answer("[]")), Err(Refusal::Empty));
    assert_eq!(by_hash(r#"{"jsonrpc":"2.0","id":7,"error":{"code":-32000,"message":"x"}}"#), Err(Refusal::Error));
    assert_eq!(by_hash(r#"{"jsonrpc":"2.0","id":7,"result":1,"error":{}}"#), Err(Refusal::Error));
    assert_eq!(by_hash(r#"{"jsonrpc":"2.0","id":7}"#), Err(Refusal::Error));
    assert_eq!(by_hash("not json"), Err(Refusal::Malformed));
    let mut large = answer(r#""0x00""#).into_bytes();
    large.resize(settings().max_entry + 1, b' ');
    let s = settings();
    let req = lookup("n", request("eth_chainId", "[]").as_bytes(), &s).unwrap();
    assert_eq!(req.capture(&large, &s), Err(Refusal::TooLarge));

    let chain = capture("eth_chainId", "[]", &answer(r#""0x1""#)).unwrap();
    assert_eq!((chain.ttl_s, chain.requires_final), (Some(3600), None));
    let by_number = capture("eth_getBlockByNumber", r#"["0x2a",false]"#, &answer("[]")).unwrap();
    assert_eq!(by_number.requires_final, Some(Final::Block(42)), "an empty answer at a final block is final");
}

#[test]
fn a_transaction_is_kept_once_the_block_it_names_is_final() {
    let tx = format!(r#"["{TX}"]"#);
    let receipt = format!(r#"{{"blockNumber":"0x10","status":"0x1","transactionHash":"{TX}"}}"#);
    assert_eq!(capture("eth_getTransactionReceipt", &tx, &answer(&receipt)).unwrap().requires_final, Some(Final::Block(16)));
    let trace = |fields: &str| format!(r#"{{{fields},"transactionHash":"{TX}"}}"#);
    let traces = capture(
        "trace_transaction",
        &tx,
        &answer(&format!("[{},{}]", trace(r#""blockNumber":15"#), trace(r#""blockNumber":16"#))),
    );
    assert_eq!(traces.unwrap().requires_final, Some(Final::Block(16)));
    let partial = capture(
        "trace_transaction",
        &tx,
        &answer(&format!("[{},{}]", trace(r#""blockNumber":15"#), trace(r#""type":"call""#))),
    );
    assert_eq!(partial, Err(Refusal::NoBlock));
    let pending =
        capture("eth_getTransactionByHash", &tx, &answer(&format!(r#"{{"blockNumber":null,"hash":"{TX}"}}"#)));
    assert_eq!(pending, Err(Refusal::NoBlock));
    // an answer that names no block: the daemon finds the transaction's
    let trace = capture("debug_traceTransaction", &tx, &answer(r#"{"gas":21000,"structLogs":[]}"#));
    assert_eq!(trace.unwrap().requires_final, Some(Final::Transaction(TX.to_string())));
    let spelled = capture("ots_getTransactionError", &format!(r#"["{}"]"#, TX.to_uppercase().replace("0X", "0x")), &answer(r#""0x""#));
    assert_eq!(spelled, Err(Refusal::Empty));
    let spelled = capture("ots_traceTransaction", &format!(r#"["{}"]"#, TX.to_uppercase().replace("0X", "0x")), &answer("[{}]"));
    assert_eq!(spelled.unwrap().requires_final, Some(Final::Transaction(TX.to_string())), "in lower case");
    assert_eq!("16".parse(), Ok(Final::Block(16)));
    assert_eq!(TX.to_uppercase().replace("0X", "0x").parse(), Ok(Final::Transaction(TX.to_string())));
    for bad in ["", "0x12", "-1", "sixteen", &format!("{TX}0")] {
        assert_eq!(bad.parse::<Final>(), Err(()), "{bad}");
    }
    for requirement in [Final::Block(16), Final::Transaction(TX.to_string())] {
        assert_eq!(requirement.to_string().parse(), Ok(requirement));
    }
    assert_eq!(capture("eth_getTransactionByHash", &tx, &answer("null")), Err(Refusal::Null));
}

#[test]
fn a_receipt_places_its_own_transaction_only() {
    let receipt = |hash: &str, number: &str| {
        answer(&format!(r#"{{"blockNumber":{number},"transactionHash":"{hash}","status":"0x1"}}"#))
    };
    assert_eq!(receipt_block(receipt(TX, r#""0x10""#).as_bytes(), TX), Some(16));
    let upper = TX.to_uppercase().replace("0X", "0x");
    assert_eq!(receipt_block(receipt(&upper, r#""0x10""#).as_bytes(), TX), Some(16));
    assert_eq!(receipt_block(receipt(HASH, r#""0x10""#).as_bytes(), TX), None, "another transaction's");
    assert_eq!(receipt_block(receipt(TX, "null").as_bytes(), TX), None, "pending");
    assert_eq!(receipt_block(answer("null").as_bytes(), TX), None);
    assert_eq!(receipt_block(b"not json", TX), None);
    // the key a client that asks for the receipt in lower case gets
    let asked = lookup("n", request(RECEIPT, &format!(r#"["{TX}"]"#)).as_bytes(), &settings()).unwrap();
    assert_eq!(receipt_key("n", TX), asked.key);
    assert_ne!(receipt_key("other", TX), asked.key);
}

#[test]
fn a_hit_keeps_the_nodes_envelope_around_the_new_id() {
    let tx = format!(r#"["{TX}"]"#);
    let receipt = format!(r#"{{"blockNumber":"0x10","status":"0x1","transactionHash":"{TX}"}}"#);
    let s = settings();
    for (answer, hit) in [
        (format!(r#"{{"id":7,"jsonrpc":"2.0","result":{receipt}}}"#), format!(r#"{{"id":"c","jsonrpc":"2.0","result":{receipt}}}"#)),
        (format!("{{ \"jsonrpc\": \"2.0\", \"id\": 7, \"result\": {receipt} }}\n"), format!("{{ \"jsonrpc\": \"2.0\", \"id\": \"c\", \"result\": {receipt}}}")),
        // the result first, or no id: the standard envelope
        (format!(r#"{{"result":{receipt},"id":7,"jsonrpc":"2.0"}}"#), format!(r#"{{"jsonrpc":"2.0","id":"c","result":{receipt}}}"#)),
        (format!(r#"{{"jsonrpc":"2.0","result":{receipt}}}"#), format!(r#"{{"jsonrpc":"2.0","id":"c","result":{receipt}}}"#)),
    ] {
        let request = lookup("n", request("eth_getTransactionReceipt", &tx).as_bytes(), &s).unwrap();
        let capture = request.capture(answer.as_bytes(), &s).unwrap();
        let stored = as_kept(&capture.envelope, &capture.tail);
        let body = Entry::decode(&stored).unwrap().respond("\"c\"", &[], MinLengths::NONE).unwrap().body;
        assert_eq!(String::from_utf8(body).unwrap(), hit, "{answer}");
    }
}

/// A hit's body decoded from its coding.
fn decoded(coding: Option<Coding>, body: &[u8]) -> Vec<u8> {
    coding.map_or_else(|| body.to_vec(), |coding| crate::compress::tests::decode(coding, body))
}

fn gunzip(body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(body).read_to_end(&mut out).expect("valid gzip");
    out
}

fn envelope(id: &str, result: &[u8]) -> Vec<u8> {
    let mut out = Envelope::default().prefix(id);
    out.extend_from_slice(result);
    out.push(b'}');
    out
}

/// An answer as the daemon keeps it.
fn as_kept(envelope: &Envelope, tail: &[u8]) -> Vec<u8> {
    let sent = encode(envelope, &Head::default(), tail);
    assert_eq!(sent[1], 0, "a host sends the tail plain");
    Entry::decode(&sent).unwrap().compact().unwrap()
}

fn tail(result: &[u8]) -> Vec<u8> {
    let mut tail = result.to_vec();
    tail.push(b'}');
    tail
}

#[test]
fn a_hit_is_spliced_around_the_clients_id() {
    let result = br#"{"hash":"0xabc","transactions":["0x1","0x2","0x1","0x2","0x1","0x2","0x1","0x2"]}"#.repeat(40);
    let stored = as_kept(&Envelope::default(), &tail(&result));
    let entry = Entry::decode(&stored).unwrap();
    let hit = entry.respond("\"client-9\"", &[Coding::Gzip], MinLengths::NONE).unwrap();
    assert!(hit.coding == Some(Coding::Gzip) && hit.body.len() < result.len() / 4);
    assert_eq!(gunzip(&hit.body), envelope("\"client-9\"", &result));
    let plain = entry.respond("\"client-9\"", &[], MinLengths::NONE).unwrap();
    assert_eq!((plain.coding, plain.body), (None, envelope("\"client-9\"", &result)));
    for coding in [Coding::Zstd, Coding::Br] {
        let hit = entry.respond("\"client-9\"", &[coding, Coding::Gzip], MinLengths::NONE).unwrap();
        assert!(hit.coding == Some(coding) && hit.body.len() < result.len() / 4, "{coding:?}");
        assert_eq!(decoded(hit.coding, &hit.body), envelope("\"client-9\"", &result), "{coding:?}");
    }
    // below min_length: plain
    assert!(entry.respond("1", &[Coding::Gzip], MinLengths::same(1 << 20)).unwrap().coding.is_none());
}

#[test]
fn an_id_longer_than_a_stored_block_is_split_across_blocks() {
    let id = format!("\"{}\"", "i".repeat(150_000));
    let result = b"[1,2,3]".repeat(100_000);
    let stored = as_kept(&Envelope::default(), &tail(&result));
    for coding in [Coding::Gzip, Coding::Zstd, Coding::Br] {
        let hit = Entry::decode(&stored).unwrap().respond(&id, &[coding], MinLengths::NONE).unwrap();
        assert_eq!(hit.coding, Some(coding));
        assert_eq!(decoded(hit.coding, &hit.body), envelope(&id, &result), "{coding:?}");
    }
}

#[test]
fn an_incompressible_tail_is_kept_plain_and_sent_plain() {
    let result: Vec<u8> = (0..100u32).flat_map(|i| Sha256::digest(i.to_le_bytes())).collect();
    let stored = as_kept(&Envelope::default(), &result);
    assert_eq!(stored[1], 0, "kept plain");
    let hit = Entry::decode(&stored).unwrap().respond("1", &[Coding::Gzip], MinLengths::NONE).unwrap();
    assert!(hit.coding.is_none());
    assert_eq!(hit.body, [Envelope::default().prefix("1"), result].concat());
}

#[test]
fn a_damaged_entry_is_refused() {
    let stored = as_kept(&Envelope::default(), &tail(&br#"{"a":"0x0000000000000000000000000000"}"#.repeat(50)));
    assert!(Entry::decode(&stored[..10]).is_err());
    let mut version = stored.clone();
    version[0] = 9;
    assert!(Entry::decode(&version).is_err());
    let mut flipped = stored.clone();
    // in the DEFLATE stream, short of its last byte (whose padding bits nothing reads), and
    // resealed: the tail's own CRC-32 is checked as well
    let inside = flipped.len() - 3;
    flipped[inside] ^= 0x40;
    assert!(Entry::decode(&flipped).is_err(), "the entry's CRC-32 is checked first");
    entry::reseal(&mut flipped);
    let damaged = Entry::decode(&flipped).unwrap();
    assert!(damaged.respond("1", &[], MinLengths::NONE).is_err(), "the plain form is checked against its CRC");
    let plain = as_kept(&Envelope::default(), b"\x00\x01\x02}");
    let mut short = plain.clone();
    short.pop();
    assert!(Entry::decode(&short).is_err());
    let mut sent = encode(&Envelope::default(), &Head::default(), b"[1,2,3]}");
    *sent.last_mut().unwrap() = b']';
    entry::reseal(&mut sent);
    assert!(Entry::decode(&sent).unwrap().compact().is_err(), "the store checks what a host sends");
    let kept = as_kept(&Envelope::default(), &tail(&b"[1,2,3]".repeat(100)));
    assert_eq!(kept[1], 2, "deflated, continuable");
    let sent_deflated = without_forms(&kept);
    assert_eq!(Entry::decode(&sent_deflated).unwrap().compact().unwrap(), kept, "a deflated tail is kept as it came");
    assert!(Entry::decode(&kept).unwrap().compact().is_err(), "zstd and brotli forms are the store's own");
    let mut broken = sent_deflated.clone();
    let inside = broken.len() - 3;
    broken[inside] ^= 0x40;
    entry::reseal(&mut broken);
    assert!(Entry::decode(&broken).unwrap().compact().is_err(), "and checked");
}

/// `entry` without its zstd and brotli forms: as a host that deflates sends it.
fn without_forms(entry: &[u8]) -> Vec<u8> {
    Entry::decode(entry).unwrap().without_forms()
}

/// What a fleet carries: the entry without the store's zstd and brotli forms, fewer bytes, answers a client that takes gzip (a browser too) gzip and another plain, byte for
/// byte; a host that keeps it and compacts it makes the same forms the first store made.
#[test]
fn an_entry_without_its_forms_answers_every_client_the_same_answer() {
    let result = br#"{"hash":"0xabc","logsBloom":"0x0040","transactions":["0x1f","0x2e","0x3d"],"gasUsed":"0x5208"}"#.repeat(60);
    let kept = as_kept(&Envelope::default(), &tail(&result));
    let carried = without_forms(&kept);
    let with_forms = Entry::decode(&kept).unwrap();
    assert!(!with_forms.answers_plain(&[Coding::Zstd]) && !with_forms.answers_plain(&[Coding::Br]), "kept with both");
    assert!(carried.len() < kept.len(), "{} of {} bytes", carried.len(), kept.len());
    let entry = Entry::decode(&carried).unwrap();
    for codings in [&[Coding::Zstd, Coding::Br, Coding::Gzip][..], &[Coding::Gzip], &[Coding::Zstd, Coding::Br], &[]] {
        let hit = entry.respond("7", codings, MinLengths::NONE).unwrap();
        assert_eq!(hit.coding, codings.contains(&Coding::Gzip).then_some(Coding::Gzip), "{codings:?}");
        assert_eq!(decoded(hit.coding, &hit.body), envelope("7", &result), "{codings:?}");
    }
    assert_eq!(entry.compact().unwrap(), kept);
    let plain = as_kept(&Envelope::default(), b"\x00\x01\x02}");
    assert_eq!(without_forms(&plain), plain, "a plain entry keeps no other form");
}

#[test]
fn a_bit_changed_anywhere_in_an_entry_makes_it_a_bad_one() {
    // a plain tail with the node's head, and a kept one with its deflated, zstd and brotli forms
    let head = Head { headers: vec![("content-type".into(), "application/json".into())], vary: vec![] };
    let sent = encode(&Envelope::default(), &head, br#"{"number":"0x1b4","hash":"0x00"}}"#);
    let kept = as_kept(&Envelope::default(), &tail(&br#"{"a":"0x0000000000000000000000000000"}"#.repeat(50)));
    for entry in [sent, kept] {
        assert!(Entry::decode(&entry).is_ok());
        for at in 0..entry.len() {
            for bit in 0..8 {
                let mut changed = entry.clone();
                changed[at] ^= 1 << bit;
                assert!(Entry::decode(&changed).is_err(), "byte {at} of {}, bit {bit}", entry.len());
            }
        }
    }
}

proptest! {
    #[test]
    fn gunzip_of_a_spliced_hit_is_the_plain_envelope(
        id in prop_oneof![
            any::<i64>().prop_map(|n| n.to_string()),
            ".{0,40}".prop_map(|s| serde_json::to_string(&s).unwrap()),
            Just("null".to_string()),
        ],
        result in prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..2000),
            "[0-9a-fx\",:{}\\[\\]]{0,5000}".prop_map(String::into_bytes),
        ],
    ) {
        let stored = as_kept(&Envelope::default(), &tail(&result));
        let entry = Entry::decode(&stored).unwrap();
        let expected = envelope(&id, &result);
        for coding in [Coding::Gzip, Coding::Zstd, Coding::Br] {
            let hit = entry.respond(&id, &[coding], MinLengths::NONE).unwrap();
            prop_assert!(hit.coding.is_none_or(|made| made == coding));
            prop_assert_eq!(&decoded(hit.coding, &hit.body), &expected);
            prop_assert!(hit.body.len() <= expected.len());
        }
        prop_assert_eq!(entry.respond(&id, &[], MinLengths::NONE).unwrap().body, expected);
    }
}

/// The daemon's side of a lookup, for the flow tests: what it keeps for `call`.
fn daemon_keeps(call: &DaemonRequest) -> Vec<u8> {
    Entry::decode(&call.body).unwrap().compact().unwrap()
}

/// The entry the daemon keeps for `asked` after a miss the node answered with `answer`.
fn stored_after_a_miss(asked: &str, answer: &str) -> Vec<u8> {
    let mut first = exchange(Some("h/mainnet"), Some(asked.as_bytes()), true, false);
    first.next_lookup();
    first.answered(&DaemonAnswer { status: 404, miss: Some(b"absent"), ttl: None, lock: None, body: b"" }, 0);
    assert!(first.response_head(200, Some(answer.len() as u64), NONE));
    daemon_keeps(&first.stores(answer.as_bytes()).remove(0).unwrap())
}

#[test]
fn a_miss_is_stored_and_the_next_request_is_a_hit_with_its_own_id() {
    let asked = request("eth_getBlockByHash", &format!(r#"["{HASH}",false]"#));
    let mut first = exchange(Some("h/mainnet"), Some(asked.as_bytes()), true, false);
    let path = first.next_lookup().map(|call| call.path).unwrap();
    assert!(path.starts_with("/v1/entries/") && path.len() == 12 + 64);
    assert_eq!(first.answered(&DaemonAnswer { status: 404, miss: Some(b"absent"), ttl: None, lock: None, body: b"" }, 0), None);
    assert_eq!(first.status(), Status::Miss);
    let answer = format!(r#"{{"jsonrpc":"2.0","id":7,"result":{{"hash":"{HASH}","number":"0x1"}}}}"#);
    assert!(first.response_head(200, Some(answer.len() as u64), NONE));
    let call = first.stores(answer.as_bytes()).remove(0).unwrap();
    assert_eq!(call.path, path);
    assert_eq!(call.headers, vec![("x-rpcedge-namespace", "h/mainnet".to_string())]);

    let again = asked.replace("\"id\":7", "\"id\":\"second\"");
    let mut second = exchange(Some("h/mainnet"), Some(again.as_bytes()), false, false);
    assert_eq!(second.next_lookup().map(|call| call.path), Some(path));
    let stored = daemon_keeps(&call);
    let hit = second.answered(&DaemonAnswer { status: 200, miss: None, ttl: None, lock: None, body: &stored }, 0).unwrap();
    assert_eq!(second.status(), Status::Hit);
    assert_eq!(String::from_utf8(hit.body.clone()).unwrap(), answer.replace("\"id\":7", "\"id\":\"second\""));
    assert!(hit.coding.is_none() && !hit.headers.iter().any(|(name, _)| name == "content-encoding"));
}

#[test]
fn a_hit_goes_in_the_browsers_best_coding_the_location_offers_and_plain_where_it_offers_none() {
    let asked = request("eth_getBlockByHash", &format!(r#"["{HASH}",false]"#));
    let result = format!(r#"{{"hash":"{HASH}","number":"0x1","extra":"{}"}}"#, "ab".repeat(2000));
    let answer = format!(r#"{{"jsonrpc":"2.0","id":7,"result":{result}}}"#);
    let stored = stored_after_a_miss(&asked, &answer);
    let browser = [("accept-encoding", "gzip, deflate, br, zstd")];
    let offering = |codings: &[Coding]| CacheSettings { hit_codings: codings.to_vec(), ..settings() };
    let cases = [
        (settings(), Some(Coding::Zstd)),
        (offering(&[Coding::Br, Coding::Gzip]), Some(Coding::Br)),
        (offering(&[Coding::Gzip]), Some(Coding::Gzip)),
        (offering(&[]), None),
    ];
    for (settings, coding) in cases {
        let mut later = CacheExchange::new(Some("h/mainnet"), b"POST", b"/", Some(asked.as_bytes()), &browser, &settings);
        later.next_lookup();
        let hit = later.answered(&DaemonAnswer { status: 200, miss: None, ttl: None, lock: None, body: &stored }, 0).unwrap();
        assert_eq!(hit.coding, coding);
        let encoding = hit.headers.iter().find(|(name, _)| name == "content-encoding").map(|(_, v)| v.as_str());
        assert_eq!(encoding, coding.map(Coding::token));
        assert_eq!(decoded(coding, &hit.body), answer.as_bytes());
    }
}

#[test]
fn a_client_with_the_dictionary_gets_a_small_hit_in_dcz_made_on_the_hit() {
    let asked = request("eth_getBlockByHash", &format!(r#"["{HASH}",false]"#));
    let result = format!(r#"{{"hash":"{HASH}","number":"0x13a5c71","gasUsed":"0x1b8a2f","transactions":[]}}"#);
    let answer = format!(r#"{{"jsonrpc":"2.0","id":7,"result":{result}}}"#);
    let stored = stored_after_a_miss(&asked, &answer);
    let ours = crate::dictionary::available_dictionary();
    let chromium = "gzip, deflate, br, zstd, dcb, dcz";
    let later = asked.replace("\"id\":7", "\"id\":\"later\"");
    let expected = answer.replace("\"id\":7", "\"id\":\"later\"");
    let with_dcz = || CacheSettings { hit_codings: hit_codings(&[Coding::Dcz, Coding::Zstd, Coding::Gzip]), ..settings() };
    let cases = [
        (vec![("accept-encoding", chromium), ("available-dictionary", ours.as_str())], with_dcz(), 0, Some(Coding::Dcz)),
        // a small answer goes plain to a client without the dictionary, as to one with another
        (vec![("accept-encoding", chromium)], with_dcz(), 1024, None),
        (vec![("accept-encoding", chromium), ("available-dictionary", ":AAAA:")], with_dcz(), 1024, None),
        // and where the location does not make dcz
        (vec![("accept-encoding", chromium), ("available-dictionary", ours.as_str())], settings(), 1024, None),
    ];
    for (i, (headers, settings, min_length, coding)) in cases.into_iter().enumerate() {
        let mut hit = CacheExchange::new(Some("h/mainnet"), b"POST", b"/", Some(later.as_bytes()), &headers, &settings);
        hit.next_lookup();
        let hit = hit.answered(&DaemonAnswer { status: 200, miss: None, ttl: None, lock: None, body: &stored }, min_length).unwrap();
        assert_eq!(hit.coding, coding, "case {i}");
        let header = |wanted: &str| hit.headers.iter().find(|(name, _)| name == wanted).map(|(_, v)| v.as_str());
        assert_eq!(header("content-encoding"), coding.map(Coding::token), "case {i}");
        let vary = if settings.hit_codings.contains(&Coding::Dcz) { "Accept-Encoding, Available-Dictionary" } else { "Accept-Encoding" };
        assert_eq!(header("vary"), Some(vary), "case {i}");
        assert_eq!(decoded(coding, &hit.body), expected.as_bytes(), "case {i}");
    }
}

#[test]
fn a_daemon_hit_kept_in_the_hot_tier_answers_later_requests_for_its_ttl() {
    let asked = request("eth_chainId", "[]");
    let mut first = exchange(Some("n"), Some(asked.as_bytes()), false, false);
    let answer = r#"{"jsonrpc":"2.0","id":7,"result":"0x1"}"#;
    assert!(first.response_head(200, None, NONE));
    let stored = daemon_keeps(&first.stores(answer.as_bytes()).remove(0).unwrap());
    let mut region = vec![0; crate::cache::HOT_MIN_REGION];
    let mut hot = HotTier::open(&mut region).unwrap();

    let mut miss = exchange(Some("n"), Some(asked.as_bytes()), false, false);
    assert!(!miss.find_hot(&mut hot, 100, 0));
    miss.answered(&DaemonAnswer { status: 404, miss: Some(b"absent"), ttl: None, lock: None, body: b"" }, 0);
    miss.keep_hot(&mut hot, &stored, 100);
    assert!(!miss.find_hot(&mut hot, 100, 0), "a miss is not kept");

    let mut daemon_hit = exchange(Some("n"), Some(asked.as_bytes()), false, false);
    let ttl = DaemonAnswer { status: 200, miss: None, ttl: Some(b" 5 "), lock: None, body: &stored };
    assert!(daemon_hit.answered(&ttl, 0).is_some());
    daemon_hit.keep_hot(&mut hot, &stored, 100);

    let again = asked.replace("\"id\":7", "\"id\":8");
    let mut hot_hit = exchange(Some("n"), Some(again.as_bytes()), false, false);
    assert!(hot_hit.find_hot(&mut hot, 104, 0));
    assert_eq!(hot_hit.status(), Status::Miss, "not a hit before it is answered");
    let hit = hot_hit.hot_answer(0).unwrap();
    assert_eq!((hit.body, hot_hit.status()), (answer.replace("\"id\":7", "\"id\":8").into_bytes(), Status::Hit));
    let mut late = exchange(Some("n"), Some(asked.as_bytes()), false, false);
    assert!(!late.find_hot(&mut hot, 105, 0), "the daemon said 5 s were left");
    let mut elsewhere = exchange(Some("other"), Some(asked.as_bytes()), false, false);
    assert!(!elsewhere.find_hot(&mut hot, 101, 0), "another namespace");
}

/// An entry that does not read (damaged, or kept by an older version) is an error for the request
/// that found it, and the node's answer to that request takes its place: without it the entry
/// (one with no expiry, in a store the host keeps itself) would fail every request for its key.
#[test]
fn the_nodes_answer_replaces_an_entry_that_does_not_read() {
    let asked = request("eth_getBlockByHash", &format!(r#"["{HASH}",false]"#));
    let answer = format!(r#"{{"jsonrpc":"2.0","id":7,"result":{{"hash":"{HASH}","number":"0x1"}}}}"#);
    let mut older = daemon_keeps(&{
        let mut first = exchange(Some("n"), Some(asked.as_bytes()), true, false);
        first.next_lookup();
        first.answered(&DaemonAnswer { status: 404, miss: Some(b"absent"), ttl: None, lock: None, body: b"" }, 0);
        assert!(first.response_head(200, Some(answer.len() as u64), NONE));
        first.stores(answer.as_bytes()).remove(0).unwrap()
    });
    older[0] = 2;
    let mut found = exchange(Some("n"), Some(asked.as_bytes()), true, false);
    found.next_lookup();
    assert_eq!(found.found(Some(&older), 0), None);
    assert_eq!(found.status(), Status::Error);
    assert!(found.response_head(200, Some(answer.len() as u64), NONE), "the node's answer is kept");
    let kept = found.keep(answer.as_bytes()).unwrap().unwrap();
    let hit = Entry::decode(&kept.entry).unwrap().respond("7", &[], MinLengths::NONE).unwrap();
    assert_eq!(hit.body, answer.as_bytes());
}

#[test]
fn the_statuses_a_host_reports() {
    let s = settings();
    let cacheable = request("eth_chainId", "[]");
    let status_after = |answer: DaemonAnswer| {
        let mut exchange = exchange(Some("n"), Some(cacheable.as_bytes()), true, false);
        assert_eq!(exchange.answered(&answer, 0), None);
        exchange.status()
    };
    assert_eq!(status_after(DaemonAnswer { status: 404, miss: Some(b"expired"), ttl: None, lock: None, body: b"" }), Status::Expired);
    assert_eq!(status_after(DaemonAnswer { status: 404, miss: Some(b"bad"), ttl: None, lock: None, body: b"" }), Status::Miss);
    assert_eq!(status_after(DaemonAnswer { status: 503, miss: None, ttl: None, lock: None, body: b"" }), Status::Error);
    assert_eq!(status_after(DaemonAnswer { status: 200, miss: None, ttl: None, lock: None, body: b"garbage" }), Status::Error, "a bad entry");
    let mut failed = exchange(Some("n"), Some(cacheable.as_bytes()), true, false);
    failed.failed();
    assert_eq!(failed.status(), Status::Error);
    assert!(!failed.response_head(200, None, NONE), "no store for a daemon that failed the lookup");
    assert!(CacheExchange::takes_length(s.max_request as u64, &s));
    assert!(!CacheExchange::takes_length(s.max_request as u64 + 1, &s));

    for (body, ssz, bypass) in [
        (Some(request("eth_blockNumber", "[]")), false, Bypass::Method),
        (Some(format!("[{cacheable},{cacheable}]")), false, Bypass::Batch),
        (None, false, Bypass::TooLarge),
        (Some(request("debug_getRawBlock", r#"["0x10"]"#)), true, Bypass::Ssz),
    ] {
        let mut exchange = exchange(Some("n"), body.as_deref().map(str::as_bytes), true, ssz);
        assert_eq!((exchange.next_lookup().map(|call| call.path), exchange.bypass()), (None, Some(bypass)));
        exchange.failed();
        assert!(!exchange.response_head(200, None, NONE));
        assert_eq!(exchange.status(), Status::Bypass);
    }
    // an answer over max_entry is not kept, and says so
    // SSZ clients of methods without a transcoding schema are served from the cache as before
    assert!(exchange(Some("n"), Some(cacheable.as_bytes()), true, true).next_lookup().map(|call| call.path).is_some());
    assert!(exchange(Some("n"), Some(request("debug_getRawBlock", r#"["0x10"]"#).as_bytes()), true, false)
    .next_lookup().map(|call| call.path)
    .is_some());
    let mut large = exchange(Some("n"), Some(cacheable.as_bytes()), true, false);
    assert!(!large.response_head(200, Some(s.max_entry as u64 + 1), NONE));
    assert_eq!(large.status(), Status::Bypass);
    // and so is one of no stated length that grows past it
    let mut growing = exchange(Some("n"), Some(cacheable.as_bytes()), true, false);
    assert!(growing.response_head(200, None, NONE));
    assert!(growing.keep_holding(s.max_entry as u64));
    assert_eq!(growing.status(), Status::Miss);
    assert!(!growing.keep_holding(s.max_entry as u64 + 1));
    assert_eq!(growing.status(), Status::Bypass);
    assert!(growing.stores(cacheable.as_bytes()).is_empty(), "nothing held, nothing stored");
}

#[test]
fn only_a_plain_whole_200_is_kept_and_only_what_capture_keeps_is_stored() {
    let asked = request("eth_getTransactionReceipt", &format!(r#"["{TX}"]"#));
    let head = |status, coding: Option<&[u8]>| {
        let headers: Vec<_> = coding.map(|coding| ("content-encoding", coding)).into_iter().collect();
        exchange(Some("n"), Some(asked.as_bytes()), true, false).response_head(status, None, &headers)
    };
    assert!(head(200, None) && head(200, Some(b"identity")));
    assert!(!head(200, Some(b"gzip")) && !head(500, None) && !head(206, None));
    let mut exchange = exchange(Some("n"), Some(asked.as_bytes()), true, false);
    assert!(exchange.response_head(200, None, NONE));
    assert_eq!(exchange.stores(br#"{"jsonrpc":"2.0","id":7,"result":null}"#).remove(0), Err(Refusal::Null));
    let answer = format!(r#"{{"jsonrpc":"2.0","id":7,"result":{{"blockNumber":"0x20","transactionHash":"{TX}"}}}}"#);
    let call = exchange.stores(answer.as_bytes()).remove(0).unwrap();
    assert!(call.headers.contains(&("x-rpcedge-requires-final", "32".to_string())));
}

/// A call spelled so that a node decoding as Go's `encoding/json` does (member names matched
/// case-insensitively, with Unicode folding, the last one winning) may read another call than
/// serde: never looked up, never stored.
#[test]
fn a_call_is_taken_only_where_every_decoder_reads_the_same_call() {
    let s = settings();
    let other = "0x1111111111111111111111111111111111111111111111111111111111111111";
    let decide = |body: String| lookup("n", body.as_bytes(), &s).map(|r| r.keep);
    let base = format!(r#""jsonrpc":"2.0","id":1,"method":"eth_getBlockByHash","params":["{HASH}",false]"#);
    assert_eq!(decide(format!("{{{base}}}")), Ok(Keep::Forever));
    for (members, why) in [
        (format!(r#"{base},"Params":["{other}",false]"#), "a member in another case"),
        (format!(r#"{base},"PARAMS":["{other}",false]"#), "in upper case"),
        (format!(r#"{base},"par\u0061ms":["{other}",false]"#), "spelled with an escape, twice"),
        (
            format!(r#""jsonrpc":"2.0","id":1,"method":"eth_getBlockByHash","par\u0061ms":["{HASH}",false]"#),
            "with an escape, once",
        ),
        (format!(r#"{base},"Method":"eth_getBlockByNumber""#), "the method in another case"),
        (format!(r#"{base},"jsonrpc ":"2.0""#), "a name with a trailing space"),
        (format!(r#"{base},"paramſ":["{other}",false]"#), "U+017F, which Go folds to s"),
        (format!(r#"{base},"params":["{other}",false]"#), "the same member twice"),
        (format!(r#"{base},"id":2"#), "the id twice"),
        (format!(r#"{base},"jsonrpc":"2.0""#), "the version twice"),
        (format!(r#"{base},"result":"0x1""#), "a member a request has not"),
    ] {
        assert_eq!(decide(format!("{{{members}}}")), Err(Bypass::Members), "{why}");
    }
    // names inside params are the method's business, as long as every decoder reads them alike
    let nested = |object: &str| decide(request("eth_call", &format!(r#"[{object},"0x10"]"#)));
    assert_eq!(nested(r#"{"to":"0x1","data":"0x2","params":"0x3"}"#), Ok(Keep::OnceFinal(16)));
    assert_eq!(nested(r#"{"t\u006f":"0x1"}"#), Ok(Keep::OnceFinal(16)), "an escape decodes alike");
    for (object, why) in [
        (r#"{"to":"0x1","To":"0x2"}"#, "two names a Go struct matches alike"),
        (r#"{"from":"0x1","input":{"data":"0x2","DATA":"0x3"}}"#, "deeper down"),
        (r#"{"to":"0x1","\u212ato":"0x2"}"#, "a name outside ASCII (the Kelvin sign folds to k)"),
        (r#"{"to":"0x1","gas":1.0}"#, "a number with a fraction"),
        (r#"{"to":"0x1","gas":1e3}"#, "a number with an exponent"),
        (r#"{"to":"0x1","gas":18446744073709551616}"#, "an integer past 64 bits"),
    ] {
        assert_eq!(nested(object), Err(Bypass::Params), "{why}");
    }
    assert_eq!(nested(r#"{"to":"0x1","gas":21000,"nonce":-1}"#), Ok(Keep::OnceFinal(16)));
    // what no decoder reads alike is not a call at all
    for malformed in [
        format!(r#"{{{base}}} {{}}"#),
        format!("{{{base},\"x\":\"\\ud800\"}}"),
        r#"{"jsonrpc":"2.0","id":1,"method":"eth_getBlockBy\u0048ash","params":[]}"#.to_string(),
    ] {
        assert!(decide(malformed.clone()).is_err(), "{malformed}");
    }
    assert_eq!(Bypass::Members.as_str(), "members");
    assert_eq!(Bypass::Params.as_str(), "params");
}

/// An answer kept once its block is final names that block's hash to the daemon, which keeps it
/// only where its finality nodes give the block that hash: a node on another fork stores nothing.
#[test]
fn an_answer_that_waits_for_its_block_names_the_blocks_hash_to_the_daemon() {
    let other = "0x1111111111111111111111111111111111111111111111111111111111111111";
    let upper = HASH.to_ascii_uppercase().replace("0X", "0x");
    let pinned = |method: &str, params: &str, result: &str| {
        capture(method, params, &answer(result)).map(|kept| (kept.requires_final, kept.block_hash))
    };
    let block = format!(r#"{{"hash":"{upper}","number":"0x10"}}"#);
    assert_eq!(pinned("eth_getBlockByNumber", r#"["0x10",false]"#, &block), Ok((Some(Final::Block(16)), Some(HASH.into()))));
    let item = |hash: &str| format!(r#"{{"blockHash":"{hash}","blockNumber":"0x10","transactionHash":"{TX}"}}"#);
    let both = format!("[{},{}]", item(HASH), item(HASH));
    assert_eq!(pinned("eth_getBlockReceipts", r#"["0x10"]"#, &both), Ok((Some(Final::Block(16)), Some(HASH.into()))));
    let forked = format!("[{},{}]", item(HASH), item(other));
    assert_eq!(pinned("eth_getBlockReceipts", r#"["0x10"]"#, &forked), Err(Refusal::Mismatch), "one block, two hashes");
    // a transaction's answer names its block by number and hash
    let receipt = pinned("eth_getTransactionReceipt", &format!(r#"["{TX}"]"#), &item(&upper));
    assert_eq!(receipt, Ok((Some(Final::Block(16)), Some(HASH.into()))));
    let trace = format!(r#"{{"blockNumber":16,"transactionHash":"{TX}"}}"#);
    assert_eq!(pinned("trace_transaction", &format!(r#"["{TX}"]"#), &format!("[{trace}]")), Ok((Some(Final::Block(16)), None)));
    // what names no block, many blocks, or a block by its hash pins nothing
    assert_eq!(pinned("eth_getBlockTransactionCountByNumber", r#"["0x10"]"#, r#""0x2""#), Ok((Some(Final::Block(16)), None)));
    let range = r#"[{"fromBlock":"0x10","toBlock":"0x11"}]"#;
    let blocks = format!("[{},{}]", item(HASH), item(other).replace(r#""0x10""#, r#""0x11""#));
    assert_eq!(pinned("eth_getLogs", range, &blocks), Ok((Some(Final::Block(17)), None)));
    assert_eq!(pinned("eth_getBlockByHash", &format!(r#"["{HASH}",false]"#), &block), Ok((None, None)));
    assert_eq!(pinned("eth_getBlockByNumber", r#"["0x10",false]"#, "[]"), Ok((Some(Final::Block(16)), None)));

    // the store call carries it, as the daemon reads it
    let asked = request("eth_getBlockByNumber", r#"["0x10",false]"#);
    let mut miss = exchange(Some("h/mainnet"), Some(asked.as_bytes()), false, false);
    miss.next_lookup();
    miss.answered(&DaemonAnswer { status: 404, miss: Some(b"absent"), ttl: None, lock: None, body: b"" }, 0);
    let body = answer(&block);
    assert!(miss.response_head(200, Some(body.len() as u64), NONE));
    let call = miss.stores(body.as_bytes()).remove(0).unwrap();
    let header = |name: &str| call.headers.iter().find(|(n, _)| *n == name).map(|(_, v)| v.as_str());
    assert_eq!(header(protocol::REQUIRES_FINAL_HEADER), Some("16"));
    assert_eq!(header(protocol::BLOCK_HASH_HEADER), Some(HASH));
}

/// A node that answers something else than what was asked (or read the call otherwise) stores
/// nothing; the table says where each method's answer names what was asked.
#[test]
fn an_answer_is_stored_only_if_it_names_what_was_asked() {
    let other = "0x1111111111111111111111111111111111111111111111111111111111111111";
    let by_hash = format!(r#"["{HASH}",false]"#);
    let block = |hash: &str| answer(&format!(r#"{{"hash":"{hash}","number":"0x10"}}"#));
    assert!(capture("eth_getBlockByHash", &by_hash, &block(HASH)).is_ok());
    assert!(capture("eth_getBlockByHash", &by_hash, &block(&HASH.to_ascii_uppercase().replace("0X", "0x"))).is_ok());
    assert_eq!(capture("eth_getBlockByHash", &by_hash, &block(other)), Err(Refusal::Mismatch));
    assert_eq!(capture("eth_getBlockByHash", &by_hash, &answer(r#"{"number":"0x10"}"#)), Err(Refusal::Mismatch));
    assert_eq!(Refusal::Mismatch.as_str(), "mismatch");

    // by number: the answer's number
    let by_number = |number: &str| {
        capture(
            "eth_getBlockByNumber",
            r#"["0x10",false]"#,
            &answer(&format!(r#"{{"hash":"{HASH}","number":"{number}"}}"#)),
        )
    };
    assert!(by_number("0x10").is_ok());
    assert_eq!(by_number("0x11"), Err(Refusal::Mismatch));
    // each item of a list, by the block hash or number the request named
    let receipts = |at: &str, hash: &str| {
        let item = format!(r#"{{"blockHash":"{hash}","blockNumber":"0x10","transactionHash":"{TX}"}}"#);
        capture("eth_getBlockReceipts", &format!("[{at}]"), &answer(&format!("[{item},{item}]")))
    };
    assert!(receipts(&format!(r#""{HASH}""#), HASH).is_ok());
    assert!(receipts(r#""0x10""#, other).is_ok(), "by number, the hash is not asked");
    assert_eq!(receipts(&format!(r#"{{"blockHash":"{HASH}"}}"#), other), Err(Refusal::Mismatch));
    let mixed =
        format!(r#"[{{"blockHash":"{HASH}","blockNumber":"0x10"}},{{"blockHash":"{other}","blockNumber":"0x10"}}]"#);
    assert_eq!(capture("eth_getBlockReceipts", &format!(r#"["{HASH}"]"#), &answer(&mixed)), Err(Refusal::Mismatch));
    // a transaction: its hash
    let tx = format!(r#"["{TX}"]"#);
    let receipt = |hash: &str| answer(&format!(r#"{{"blockNumber":"0x10","transactionHash":"{hash}"}}"#));
    assert!(capture("eth_getTransactionReceipt", &tx, &receipt(TX)).is_ok());
    assert_eq!(capture("eth_getTransactionReceipt", &tx, &receipt(other)), Err(Refusal::Mismatch));
    // raw bytes: their keccak-256 is the transaction's hash (a mainnet transaction, as erigon
    // answered eth_getRawTransactionByHash in the corpus)
    let raw = answer(
        r#""0xf86b06850129f773108252089477e3205329fe307d0b3b1489d1ad69abb9570a0b870db0fbbcea73808026a0f9d18134034d011058aa910412fc1a270e4bff25fff0e58c21f2c99cb2735beaa02012fb3480e87cec793283b23e984a96b33a4d8edd5f2639dd77da25ed94546b""#,
    );
    let raw_by = |hash: &str| capture("eth_getRawTransactionByHash", &format!(r#"["{hash}"]"#), &raw);
    let kept = raw_by("0x496eabfa43bb9fe6bacaad5818880b987d35ae19d4a2dff33fd5360c68860790").unwrap();
    assert_eq!((kept.ttl_s, kept.requires_final), (None, None), "agrees: the same bytes wherever it is, for good");
    assert_eq!(raw_by(TX), Err(Refusal::Mismatch));
    // every row: a method whose answer names what was asked says where; one that cannot says so
    for &(method, rule, names) in TABLE {
        if matches!(rule, Rule::Chain) {
            assert_eq!(names, Names::Nothing, "{method}");
        }
    }
}

/// What a shared HTTP cache must not keep is not kept; what it keeps of the node's head comes
/// back on every hit; an answer that varies on request headers is a hit only for the same values.
#[test]
fn the_nodes_head_decides_what_is_kept_and_what_a_hit_sends() {
    let client = &[("origin", "https://a.example")][..];
    for (header, refusal) in [
        (("Set-Cookie", "session=1"), Refusal::SetCookie),
        (("Cache-Control", "no-store"), Refusal::NoStore),
        (("cache-control", "max-age=5, Private"), Refusal::NoStore),
        (("Cache-Control", "no-cache=\"x\""), Refusal::NoStore),
        (("Vary", "Origin, *"), Refusal::VaryAll),
    ] {
        assert_eq!(Head::of(&[header], client), Err(refusal), "{header:?}");
    }
    let node = [
        ("Content-Type", "application/json"),
        ("Vary", "Origin"),
        ("vary", "accept-encoding, Origin"),
        ("Access-Control-Allow-Origin", "https://a.example"),
        ("Connection", "keep-alive, X-Hop"),
        ("X-Hop", "1"),
        ("Transfer-Encoding", "chunked"),
        ("Date", "Mon, 23 Nov 2026 10:00:00 GMT"),
        ("ETag", "\"1\""),
        ("x-envoy-upstream-service-time", "3"),
        ("Cache-Control", "max-age=60"),
    ];
    let head = Head::of(&node, client).unwrap();
    let kept: Vec<(&str, &str)> = head.headers.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
    assert_eq!(
        kept,
        [
            ("content-type", "application/json"),
            ("access-control-allow-origin", "https://a.example"),
            ("cache-control", "max-age=60")
        ]
    );
    assert_eq!(head.vary, [("origin".to_string(), Some("https://a.example".to_string()))]);

    // through the exchange: the store keeps the head, a hit sends it for the same origin only
    let s = settings();
    let asked = request("eth_getBlockByHash", &format!(r#"["{HASH}",false]"#));
    let ask = |origin: Option<&str>| {
        let mut headers = vec![("accept-encoding", "identity")];
        headers.extend(origin.map(|origin| ("Origin", origin)));
        CacheExchange::new(Some("n"), b"POST", b"/", Some(asked.as_bytes()), &headers, &s)
    };
    let mut first = ask(Some("https://a.example"));
    let answer = format!(r#"{{"jsonrpc":"2.0","id":7,"result":{{"hash":"{HASH}"}}}}"#);
    assert!(first.response_head(200, None, &node));
    let stored = daemon_keeps(&first.stores(answer.as_bytes()).remove(0).unwrap());
    let daemon = DaemonAnswer { status: 200, miss: None, ttl: None, lock: None, body: &stored };
    let mut same = ask(Some("https://a.example"));
    let hit = same.answered(&daemon, 0).unwrap();
    let sent: Vec<(&str, &str)> = hit.headers.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
    assert_eq!(
        sent,
        [
            ("content-type", "application/json"),
            ("vary", "origin, Accept-Encoding"),
            ("access-control-allow-origin", "https://a.example"),
            ("cache-control", "max-age=60")
        ]
    );
    for other in [Some("https://b.example"), None] {
        let mut exchange = ask(other);
        assert_eq!(exchange.answered(&daemon, 0), None, "{other:?}");
        assert_eq!(exchange.status(), Status::Miss, "another variant is the node's to answer");
        assert!(exchange.response_head(200, None, &node), "and its answer is kept in the entry's place");
    }
    // an answer that must not be kept is not held, and says why once
    let mut cookie = ask(None);
    assert!(!cookie.response_head(200, None, &[("Set-Cookie", "a=1")]));
    assert_eq!((cookie.take_head_refusal(), cookie.take_head_refusal()), (Some(Refusal::SetCookie), None));
}

/// A POST is looked up by its body, a GET only as a Beacon-API read (methods are case-sensitive).
#[test]
fn a_request_other_than_a_post_bypasses_under_its_own_reason() {
    let asked = request("eth_chainId", "[]");
    let not_post = Some(Bypass::NotPost);
    for (method, bypass) in [(&b"GET"[..], Some(Bypass::Route)), (b"post", not_post), (b"PUT", not_post), (b"POST", None)] {
        let exchange = CacheExchange::new(Some("n"), method, b"/", Some(asked.as_bytes()), NONE, &settings());
        assert_eq!(exchange.bypass(), bypass, "{}", String::from_utf8_lossy(method));
    }
    // a POST whose body the host does not hold stays too large
    assert_eq!(CacheExchange::new(Some("n"), b"POST", b"/", None, NONE, &settings()).bypass(), Some(Bypass::TooLarge));
}

/// A request with credentials may get an answer for that client only (RFC 9111, 3.5); a stored
/// head that could not have come from `Head::of` (a name a hit must not send, CR or LF in a
/// value) is a bad entry, whoever wrote it; a transaction's answer that does not name the
/// transaction cannot say which block holds it.
#[test]
fn credentials_bypass_and_a_stored_head_is_checked_again() {
    let s = settings();
    let asked = request("eth_chainId", "[]");
    for credentials in [("Authorization", "Bearer x"), ("cookie", "session=1")] {
        let exchange = CacheExchange::new(Some("n"), b"POST", b"/", Some(asked.as_bytes()), &[credentials], &s);
        assert_eq!(exchange.bypass(), Some(Bypass::Credentials), "{credentials:?}");
    }
    let tail = br#""0x1"}"#;
    let stored = |headers: &[(&str, &str)]| {
        let head = Head { headers: headers.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect(), vary: vec![] };
        Entry::decode(&encode(&Envelope::default(), &head, tail)).map(|_| ())
    };
    assert_eq!(stored(&[("access-control-allow-origin", "*")]), Ok(()));
    for bad in [
        ("x-a", "1\r\nset-cookie: a=1"),
        ("x-a\r\nx-b", "1"),
        ("set-cookie", "a=1"),
        ("transfer-encoding", "chunked"),
        ("content-length", "1"),
        ("X-Upper", "1"),
        ("", "1"),
    ] {
        assert!(stored(&[bad]).is_err(), "{bad:?}");
    }
    let trace = capture("debug_traceTransaction", &format!(r#"["{TX}",{{"tracer":"x"}}]"#), &answer(r#"{"blockNumber":"0x1"}"#));
    let claims_nothing = Some(Final::Transaction(TX.to_string()));
    assert_eq!(trace.unwrap().requires_final, claims_nothing, "a tracer's own output places nothing");
}

/// The daemon takes stores up to `entry_bound(max_entry)`: no entry a host sends for an answer
/// of `max_entry` bytes is longer, whether the node's envelope is kept (its parts as long as an
/// entry keeps them) or the standard one stands in for it (the id after the result), with the
/// kept head at its longest; the bound is within a few bytes of the longest; a head one byte
/// longer is not kept.
#[test]
fn no_entry_a_host_sends_is_longer_than_the_bound_of_its_max_entry() {
    let s = CacheSettings { max_entry: 8192, ..settings() };
    // the envelope's parts at 1024 bytes each; the result fills the answer up to `max_entry`
    let (part, between) =
        ("x".repeat(1024 - r#"{"a":"","id":"#.len()), "y".repeat(1024 - r#","b":"","result":"#.len()));
    let fill = |shape: usize| "z".repeat(s.max_entry - shape);
    let kept = format!(r#"{{"a":"{part}","id":7,"b":"{between}","result":"{}"}}"#, fill(2048 + 1 + 3));
    let standard = format!(r#"{{"result":"{}","id":7}}"#, fill(r#"{"result":"","id":7}"#.len()));
    assert_eq!((kept.len(), standard.len()), (s.max_entry, s.max_entry));
    let asked = request("eth_chainId", "[]");
    let value = "v".repeat(MAX_HEAD - (2 + 2 + 2 + "x-a".len() + 2));
    let bound = entry_bound(s.max_entry as u64);
    let mut longest = 0;
    for body in [&kept, &standard] {
        let mut exchange = CacheExchange::new(Some("n"), b"POST", b"/", Some(asked.as_bytes()), NONE, &s);
        assert!(exchange.response_head(200, Some(body.len() as u64), &[("x-a", value.as_str())]));
        let call = exchange.stores(body.as_bytes()).remove(0).unwrap();
        assert!(call.body.len() as u64 <= bound, "{} > {bound}", call.body.len());
        assert!(daemon_keeps(&call).len() <= call.body.len(), "what the daemon keeps and answers");
        longest = longest.max(call.body.len() as u64);
    }
    assert!(bound - longest < 32, "{longest} is far below {bound}");
    let mut exchange = CacheExchange::new(Some("n"), b"POST", b"/", Some(asked.as_bytes()), NONE, &s);
    let longer = value + "v";
    assert!(!exchange.response_head(200, Some(kept.len() as u64), &[("x-a", longer.as_str())]));
    assert_eq!(exchange.take_head_refusal(), Some(Refusal::TooLarge));
}

/// A call of a batch, with its id's JSON text (none: a notification).
fn call(id: Option<&str>, method: &str, params: &str) -> String {
    let id = id.map_or(String::new(), |id| format!(r#""id":{id},"#));
    format!(r#"{{"jsonrpc":"2.0",{id}"method":"{method}","params":{params}}}"#)
}

/// The stored entry of `method`'s answer `result`, as the daemon keeps it.
fn entry_of(method: &str, params: &str, result: &str) -> Vec<u8> {
    let mut miss = exchange(Some("n"), Some(request(method, params).as_bytes()), false, false);
    assert!(miss.response_head(200, None, NONE));
    daemon_keeps(&miss.stores(answer(result).as_bytes()).remove(0).unwrap())
}

/// The daemon's answer to a multi-key lookup: each key's entry, or absent.
fn looked(found: &[Option<&[u8]>]) -> Vec<u8> {
    let mut body = Vec::new();
    for entry in found {
        entry.map_or(protocol::Looked::Absent, |entry| protocol::Looked::Hit(entry, None)).encode(&mut body);
    }
    body
}

fn receipt(tx: &str) -> String {
    format!(r#"{{"blockNumber":"0x20","transactionHash":"{tx}"}}"#)
}

const TX2: &str = "0x1111111111111111111111111111111111111111111111111111111111111111";

#[test]
fn a_batch_whose_every_call_is_stored_is_answered_whole_in_one_lookup() {
    let (chain, receipt_params) = ("0x1", format!(r#"["{TX}"]"#));
    let chain_entry = entry_of("eth_chainId", "[]", &format!(r#""{chain}""#));
    let receipt_entry = entry_of("eth_getTransactionReceipt", &receipt_params, &receipt(TX));
    // ids of every JSON type, one key asked twice
    let batch = format!(
        "[{},{},{}]",
        call(Some("1"), "eth_chainId", "[]"),
        call(Some(r#""a\u0062""#), "eth_getTransactionReceipt", &receipt_params),
        call(Some("null"), "eth_chainId", "[]"),
    );
    let mut exchange = exchange(Some("n"), Some(batch.as_bytes()), false, false);
    let lookup = exchange.next_lookup().unwrap();
    assert_eq!((lookup.method, lookup.path.as_str()), ("POST", protocol::LOOKUP_PATH));
    let keys = String::from_utf8(lookup.body).unwrap();
    assert_eq!(keys.lines().count(), 2, "one key per distinct call: {keys}");
    let found = looked(&[Some(&chain_entry), Some(&receipt_entry)]);
    let hit = exchange.answered(&DaemonAnswer { status: 200, miss: None, ttl: None, lock: None, body: &found }, 0).unwrap();
    assert_eq!(exchange.status(), Status::Hit);
    assert_eq!(exchange.next_lookup(), None);
    let answers: Value = serde_json::from_slice(&hit.body).unwrap();
    assert_eq!(
        answers,
        serde_json::json!([
            {"jsonrpc": "2.0", "id": 1, "result": chain},
            {"jsonrpc": "2.0", "id": "ab", "result": serde_json::from_str::<Value>(&receipt(TX)).unwrap()},
            {"jsonrpc": "2.0", "id": null, "result": chain},
        ])
    );
    assert!(String::from_utf8_lossy(&hit.body).contains(r#""id":"a\u0062""#), "the client's own spelling");
    assert_eq!(hit.headers[0], ("content-type".into(), "application/json".into()));
    assert!(hit.coding.is_none());

    // gzip where the client takes it, compressed once
    let mut gzip = self::exchange(Some("n"), Some(batch.as_bytes()), true, false);
    gzip.next_lookup().unwrap();
    let hit = gzip.answered(&DaemonAnswer { status: 200, miss: None, ttl: None, lock: None, body: &found }, 0).unwrap();
    assert!(hit.coding == Some(Coding::Gzip) && hit.headers.contains(&("content-encoding".into(), "gzip".into())));
    assert_eq!(serde_json::from_slice::<Value>(&gunzip(&hit.body)).unwrap(), answers);
}

/// A batch whose entries are all deflated is answered in gzip spliced from their streams: the
/// envelopes around the client's ids go in stored blocks, and nothing is compressed again.
#[test]
fn a_gzip_batch_hit_is_spliced_from_the_entries_streams() {
    let log = r#"{"data":"0x0000000000000000000000000000000000000000000000000000000000000001"}"#;
    let receipt = |tx: &str, logs: usize| {
        format!(r#"{{"blockNumber":"0x20","transactionHash":"{tx}","logs":[{}]}}"#, vec![log; logs].join(","))
    };
    let params = [format!(r#"["{TX}"]"#), format!(r#"["{TX2}"]"#)];
    let results = [receipt(TX, 40), receipt(TX2, 90)];
    let entries: Vec<Vec<u8>> =
        params.iter().zip(&results).map(|(params, result)| entry_of("eth_getTransactionReceipt", params, result)).collect();
    let batch = format!(
        "[{},{}]",
        call(Some("7"), "eth_getTransactionReceipt", &params[0]),
        call(Some(r#""x""#), "eth_getTransactionReceipt", &params[1])
    );
    let found = looked(&[Some(&entries[0]), Some(&entries[1])]);
    let expected = format!(
        r#"[{{"jsonrpc":"2.0","id":7,"result":{}}},{{"jsonrpc":"2.0","id":"x","result":{}}}]"#,
        results[0], results[1]
    );
    for gzip in [true, false] {
        let mut exchange = exchange(Some("n"), Some(batch.as_bytes()), gzip, false);
        exchange.next_lookup().unwrap();
        let hit = exchange.answered(&DaemonAnswer { status: 200, miss: None, ttl: None, lock: None, body: &found }, 0);
        let hit = hit.unwrap();
        assert_eq!(hit.coding, gzip.then_some(Coding::Gzip));
        assert_eq!(if gzip { gunzip(&hit.body) } else { hit.body.clone() }, expected.as_bytes());
        if gzip {
            let envelope = br#"[{"jsonrpc":"2.0","id":7,"result":"#;
            let spliced = hit.body.windows(envelope.len()).any(|bytes| bytes == envelope);
            assert!(spliced, "the envelope as it is, in a stored block");
        }
    }
}

#[test]
fn a_partly_stored_batch_sends_the_node_the_rest_and_merges_its_answer_in_the_clients_order() {
    let receipt_params = |tx: &str| format!(r#"["{tx}"]"#);
    let stored = entry_of("eth_getTransactionReceipt", &receipt_params(TX), &receipt(TX));
    let batch = [
        call(Some("1"), "eth_getTransactionReceipt", &receipt_params(TX)),
        call(Some("2"), "eth_blockNumber", "[]"),
        call(None, "eth_getTransactionReceipt", &receipt_params(TX2)),
        call(Some(r#""x""#), "eth_getTransactionReceipt", &receipt_params(TX2)),
        call(Some("4"), "eth_getTransactionByHash", &receipt_params(TX2)),
    ];
    let mut exchange = exchange(Some("n"), Some(format!("[{}]", batch.join(",")).as_bytes()), false, false);
    let lookup = exchange.next_lookup().unwrap();
    assert_eq!(String::from_utf8(lookup.body).unwrap().lines().count(), 3);
    let found = looked(&[Some(&stored), None, None]);
    assert_eq!(exchange.answered(&DaemonAnswer { status: 200, miss: None, ttl: None, lock: None, body: &found }, 0), None);
    assert_eq!((exchange.status(), exchange.next_lookup()), (Status::Miss, None));
    // the rest, in the client's order, each member as the client wrote it
    let node_request = exchange.node_request().unwrap();
    assert_eq!(String::from_utf8(node_request).unwrap(), format!("[{},{},{},{}]", batch[1], batch[2], batch[3], batch[4]));

    // the node answers out of order, one call with an error
    let node = format!(
        r#"[{{"jsonrpc":"2.0","id":4,"error":{{"code":-32000,"message":"busy"}}}}, {{"jsonrpc":"2.0","id":"x","result":{}}},
        {{"jsonrpc":"2.0","id":2,"result":"0x99"}}]"#,
        receipt(TX2)
    );
    assert!(exchange.response_head(200, Some(node.len() as u64), NONE));
    assert!(exchange.replaces_body());
    // held as it comes, until it ends
    let (first, rest) = node.split_at(node.len() / 2);
    assert_eq!(exchange.pass(first.as_bytes(), false), Passed::Held);
    let Passed::Merged(merged) = exchange.pass(rest.as_bytes(), true) else { panic!("not merged") };
    let merged: Value = serde_json::from_slice(&merged).unwrap();
    let ids: Vec<&Value> = merged.as_array().unwrap().iter().map(|answer| &answer["id"]).collect();
    assert_eq!(ids, [&serde_json::json!(1), &serde_json::json!(2), &serde_json::json!("x"), &serde_json::json!(4)]);
    assert_eq!(merged[0]["result"]["transactionHash"], TX);
    assert_eq!(merged[3]["error"]["message"], "busy");
    // the receipt the node gave is stored as if it had come alone; the error is not
    let stores = exchange.stores_held();
    let [Ok(store), Err(Refusal::Error)] = &stores[..] else { panic!("{stores:?}") };
    let alone = format!(r#"{{"jsonrpc":"2.0","id":"x","result":{}}}"#, receipt(TX2));
    let mut later = self::exchange(Some("n"), Some(request("eth_getTransactionReceipt", &receipt_params(TX2)).as_bytes()), false, false);
    assert_eq!(later.next_lookup().unwrap().path, store.path);
    let kept = daemon_keeps(store);
    let hit = later.answered(&DaemonAnswer { status: 200, miss: None, ttl: None, lock: None, body: &kept }, 0).unwrap();
    assert_eq!(hit.body, alone.replace(r#""id":"x""#, r#""id":7"#).into_bytes());
}

#[test]
fn a_batch_the_store_answers_none_of_goes_whole_and_each_answer_is_stored() {
    let batch = format!(
        "[{},{}]",
        call(Some("1"), "eth_getTransactionReceipt", &format!(r#"["{TX}"]"#)),
        call(Some("2"), "eth_getTransactionReceipt", &format!(r#"["{TX2}"]"#)),
    );
    let mut exchange = exchange(Some("n"), Some(batch.as_bytes()), false, false);
    exchange.next_lookup().unwrap();
    exchange.answered(&DaemonAnswer { status: 200, miss: None, ttl: None, lock: None, body: &looked(&[None, None]) }, 0);
    assert_eq!(exchange.node_request(), None, "the client's own body goes");
    let node = format!(
        r#"[{{"jsonrpc":"2.0","id":2,"result":{}}},{{"jsonrpc":"2.0","id":1,"result":{}}}]"#,
        receipt(TX2),
        receipt(TX)
    );
    assert!(exchange.response_head(200, None, NONE) && !exchange.replaces_body(), "held beside, passed as it came");
    assert_eq!(exchange.pass(node.as_bytes(), true), Passed::Kept);
    let stores = exchange.stores_held();
    assert_eq!(stores.len(), 2);
    assert!(stores.iter().all(Result::is_ok));

    // a daemon that fails: the whole batch goes, nothing held for it
    let mut failed = self::exchange(Some("n"), Some(batch.as_bytes()), false, false);
    failed.next_lookup().unwrap();
    failed.failed();
    assert_eq!((failed.status(), failed.node_request()), (Status::Error, None));
    assert!(!failed.response_head(200, None, NONE));
}

#[test]
fn a_node_answer_that_cannot_be_merged_by_id_goes_after_the_stores_answers() {
    let stored = entry_of("eth_chainId", "[]", r#""0x1""#);
    let batch = format!("[{},{}]", call(Some("1"), "eth_chainId", "[]"), call(Some("2"), "eth_blockNumber", "[]"));
    let split = |settings: &CacheSettings| {
        let mut exchange = CacheExchange::new(Some("n"), b"POST", b"/", Some(batch.as_bytes()), NONE, settings);
        exchange.next_lookup().unwrap();
        exchange.answered(&DaemonAnswer { status: 200, miss: None, ttl: None, lock: None, body: &looked(&[Some(&stored)]) }, 0);
        assert!(exchange.response_head(200, None, NONE) && exchange.replaces_body());
        exchange
    };
    let hit = r#"{"jsonrpc":"2.0","id":1,"result":"0x1"}"#;
    for (node, client) in [
        // an id the node was not asked, or none at all
        (r#" [{"jsonrpc":"2.0","id":3,"result":"0x5"}]"#, format!(r#"[{hit},{{"jsonrpc":"2.0","id":3,"result":"0x5"}}]"#)),
        (r#"[]"#, format!("[{hit}]")),
        // the node refused the batch whole
        (r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"no"}}"#, r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"no"}}"#.to_string()),
    ] {
        let mut exchange = split(&settings());
        assert_eq!(String::from_utf8(exchange.batch_answer(node.as_bytes(), true)).unwrap(), client, "{node}");
        assert!(exchange.stores(b"").is_empty());
    }
    // past what is held (`max_entry`, or 64 KiB where that is less): the store's answers, then
    // the node's as they come
    let mut long = split(&CacheSettings { max_entry: 1000, ..settings() });
    let start = format!(r#"[{{"jsonrpc":"2.0","id":2,"result":"{}"#, "0".repeat(64 * 1024));
    assert_eq!(long.pass(&start.as_bytes()[..2000], false), Passed::Held, "held past max_entry, to 64 KiB");
    let Passed::Merged(out) = long.pass(&start.as_bytes()[2000..], false) else { panic!("not merged") };
    assert_eq!(out, format!("[{hit},{}", &start[1..]).into_bytes());
    assert_eq!(long.pass(b"0\"}]", true), Passed::On, "the rest goes on as it comes");
    assert!(long.stores_held().is_empty(), "and nothing is stored");
}

#[test]
fn batches_the_cache_does_not_split() {
    let s = settings();
    let chain = |id: &str| call(Some(id), "eth_chainId", "[]");
    let too_many = format!("[{}]", (0..=s.max_batch).map(|id| chain(&id.to_string())).collect::<Vec<_>>().join(","));
    let at_most = format!("[{}]", (1..=s.max_batch).map(|id| chain(&id.to_string())).collect::<Vec<_>>().join(","));
    for (batch, bypass) in [
        (too_many.clone(), Some(Bypass::Batch)),
        (at_most, None),
        (format!("[{},{}]", chain("1"), chain("1")), Some(Bypass::Batch)),
        (format!("[{},{}]", chain("1"), chain("1.0")), Some(Bypass::Malformed)),
        (format!("[{},{}]", chain("1"), chain("[1]")), Some(Bypass::Malformed)),
        (format!("[{},{}]", chain("1"), call(Some("2"), "eth_blockNumber", "[]")), None),
        (format!("[{}]", call(Some("2"), "eth_blockNumber", "[]")), Some(Bypass::Batch)),
        (format!("[{},3]", chain("1")), Some(Bypass::Malformed)),
        (format!(r#"[{},{{"jsonrpc":"2.0","id":2,"ID":3,"method":"eth_chainId"}}]"#, chain("1")), Some(Bypass::Members)),
        ("[]".to_string(), Some(Bypass::Malformed)),
    ] {
        let exchange = exchange(Some("n"), Some(batch.as_bytes()), false, false);
        assert_eq!(exchange.bypass(), bypass, "{}", &batch[..batch.len().min(200)]);
    }
    let lower = CacheSettings { max_batch: 0, ..settings() };
    let none = CacheExchange::new(Some("n"), b"POST", b"/", Some(format!("[{}]", chain("1")).as_bytes()), NONE, &lower);
    assert_eq!(none.bypass(), Some(Bypass::Batch));
    // params another decoder reads otherwise: that call goes to the node, the rest are looked up
    let floats = format!("[{},{}]", chain("1"), call(Some("2"), "eth_getBlockByNumber", r#"["0x1",1.0]"#));
    let mut exchange = exchange(Some("n"), Some(floats.as_bytes()), false, false);
    assert_eq!(String::from_utf8(exchange.next_lookup().unwrap().body).unwrap().lines().count(), 1);
}

fn miss_answer<'a>(miss: &'a [u8], lock: Option<&'a [u8]>) -> DaemonAnswer<'a> {
    DaemonAnswer { status: 404, miss: Some(miss), ttl: None, lock, body: b"" }
}

#[test]
fn a_miss_holds_its_key_and_its_answer_is_stored_or_the_key_released() {
    let asked = request("eth_getBlockByHash", &format!(r#"["{HASH}",false]"#));
    let lookup = exchange(Some("n"), Some(asked.as_bytes()), false, false).next_lookup().unwrap();
    assert_eq!((lookup.method, lookup.timeout_ms), ("GET", 50));
    assert_eq!(lookup.headers[0], ("x-rpcedge-lock", "5000".to_string()));
    let (name, holder) = &lookup.headers[1];
    assert!(*name == "x-rpcedge-holder" && holder.len() == 16 && u64::from_str_radix(holder, 16).is_ok());

    // the holder's answer is stored: the store hands it to the waiters, nothing to release
    let mut holder = exchange(Some("n"), Some(asked.as_bytes()), false, false);
    holder.next_lookup();
    assert!(holder.answered(&miss_answer(b"absent", Some(b"held")), 0).is_none());
    assert_eq!((holder.status(), holder.next_lookup()), (Status::Miss, None));
    let answer = format!(r#"{{"jsonrpc":"2.0","id":7,"result":{{"hash":"{HASH}","number":"0x1"}}}}"#);
    assert!(holder.response_head(200, None, NONE));
    assert!(holder.stores(answer.as_bytes()).remove(0).is_ok());
    assert_eq!(holder.release(), None);

    // an error, a failed node or a client gone: released, once, by the holder's name; as is a
    // request that ended while its lookup was on its way (the daemon may have made it the holder)
    for failure in ["error", "502", "gone", "gone before the answer"] {
        let mut holder = exchange(Some("n"), Some(asked.as_bytes()), false, false);
        let lookup = holder.next_lookup().unwrap();
        if failure != "gone before the answer" {
            holder.answered(&miss_answer(b"expired", Some(b"held")), 0);
        }
        match failure {
            "error" => {
                assert!(holder.response_head(200, None, NONE));
                let error = r#"{"jsonrpc":"2.0","id":7,"error":{"code":-32000,"message":"busy"}}"#;
                assert_eq!(holder.stores(error.as_bytes()), vec![Err(Refusal::Error)]);
            }
            "502" => assert!(!holder.response_head(502, None, NONE)),
            _ => {}
        }
        let release = holder.release().unwrap_or_else(|| panic!("{failure}: not released"));
        assert_eq!(release.path, format!("/v1/flights/{}", &lookup.path["/v1/entries/".len()..]), "{failure}");
        assert_eq!(release.headers, lookup.headers[1..], "{failure}: by the holder's name");
        assert_eq!(holder.release(), None, "{failure}: once");
    }

    // a miss that does not hold the key (another one's lock ran out, a daemon without locks)
    // has nothing to release
    let mut plain = exchange(Some("n"), Some(asked.as_bytes()), false, false);
    plain.next_lookup();
    plain.answered(&miss_answer(b"absent", None), 0);
    assert!(plain.response_head(502, None, NONE) || plain.release().is_none());
    assert_eq!(plain.release(), None);

    // nor has a lookup the daemon failed (it is sent no more work), nor a waiter whose wait went
    // without an answer (its release would free the holder's)
    let mut failed = exchange(Some("n"), Some(asked.as_bytes()), false, false);
    failed.next_lookup();
    failed.failed();
    assert_eq!(failed.release(), None);
    let mut waiter = exchange(Some("n"), Some(asked.as_bytes()), false, false);
    waiter.next_lookup();
    waiter.answered(&miss_answer(b"in_flight", None), 0);
    waiter.next_lookup().expect("a wait");
    waiter.failed();
    assert_eq!(waiter.release(), None);
}

#[test]
fn a_gzip_waiter_gets_the_holders_answer_gzip_whether_it_landed_compacted_or_as_it_came() {
    let asked = request("eth_getBlockByHash", &format!(r#"["{HASH}",false]"#));
    let result = format!(r#"{{"hash":"{HASH}","number":"0x1","logsBloom":"0x{}"}}"#, "0".repeat(4096));
    let mut holder = exchange(Some("n"), Some(asked.as_bytes()), false, false);
    assert!(holder.response_head(200, None, NONE));
    let sent = holder.stores(answer(&result).as_bytes()).remove(0).unwrap();
    for (landed, entry) in [("as it came", sent.body.clone()), ("compacted", daemon_keeps(&sent))] {
        let mut waiter = exchange(Some("n"), Some(asked.as_bytes()), true, false);
        waiter.next_lookup();
        assert!(waiter.answered(&miss_answer(b"in_flight", None), 0).is_none());
        waiter.next_lookup().expect("a wait");
        let landing = DaemonAnswer { status: 200, miss: None, ttl: None, lock: None, body: &entry };
        let hit = waiter.answered(&landing, 1024).expect("the holder's answer");
        assert_eq!(waiter.status(), Status::Coalesced);
        assert_eq!(hit.coding, Some(Coding::Gzip), "{landed}");
        assert_eq!(hit.headers[1], ("content-encoding".to_string(), "gzip".to_string()), "{landed}");
        assert_eq!(gunzip(&hit.body), answer(&result).as_bytes(), "{landed}");
    }
    // an identity client's stays plain
    let mut plain = exchange(Some("n"), Some(asked.as_bytes()), false, false);
    plain.next_lookup();
    plain.answered(&miss_answer(b"in_flight", None), 0);
    plain.next_lookup();
    let landing = DaemonAnswer { status: 200, miss: None, ttl: None, lock: None, body: &sent.body };
    let hit = plain.answered(&landing, 1024).unwrap();
    assert!(hit.coding.is_none() && hit.body == answer(&result).as_bytes());
}

#[test]
fn a_miss_of_a_key_in_flight_waits_for_the_holders_answer_around_its_own_id() {
    let asked = request("eth_getBlockByHash", &format!(r#"["{HASH}",false]"#)).replace("\"id\":7", "\"id\":\"mine\"");
    let waiter = || {
        let mut waiter = exchange(Some("n"), Some(asked.as_bytes()), true, false);
        let lookup = waiter.next_lookup().unwrap();
        assert!(waiter.answered(&miss_answer(b"in_flight", None), 0).is_none());
        let wait = waiter.next_lookup().expect("a wait");
        assert_eq!((wait.method, wait.timeout_ms), ("GET", 5050));
        assert_eq!(wait.path, lookup.path.replace("/v1/entries/", "/v1/flights/"));
        assert!(wait.headers.is_empty());
        waiter
    };

    let result = format!(r#"{{"hash":"{HASH}","number":"0x1"}}"#);
    let entry = entry_of("eth_getBlockByHash", &format!(r#"["{HASH}",false]"#), &result);
    let mut shared = waiter();
    let hit = shared.answered(&DaemonAnswer { status: 200, miss: None, ttl: None, lock: None, body: &entry }, 0);
    let hit = hit.expect("the holder's answer");
    assert_eq!(shared.status(), Status::Coalesced);
    assert_eq!(shared.status_value(true), "COALESCED");
    let body = decoded(hit.coding, &hit.body);
    assert!(String::from_utf8(body).unwrap().contains(r#""id":"mine""#));
    // another request's answer, maybe not stored: not kept in the hot tier
    let mut region = vec![0; HOT_MIN_REGION];
    let mut hot = HotTier::open(&mut region).unwrap();
    shared.keep_hot(&mut hot, &entry, 100);
    assert!(!exchange(Some("n"), Some(asked.as_bytes()), true, false).find_hot(&mut hot, 100, 0));
    assert_eq!(shared.release(), None);

    // released or out of time: to the node, whose answer it stores (it holds no key)
    for miss in [&b"released"[..], b"timeout"] {
        let mut alone = waiter();
        assert!(alone.answered(&miss_answer(miss, None), 0).is_none());
        assert_eq!((alone.status(), alone.next_lookup()), (Status::Miss, None));
        assert!(alone.response_head(200, None, NONE));
        assert!(alone.stores(answer(&result).as_bytes()).remove(0).is_ok());
        assert_eq!(alone.release(), None);
    }
    // a wait that gets no answer in time: the node answers, as for any failed lookup
    let mut failed = waiter();
    failed.failed();
    assert_eq!((failed.status(), failed.next_lookup(), failed.release()), (Status::Error, None, None));
}

#[test]
fn no_lock_is_asked_for_with_lock_timeout_0_nor_for_a_batch() {
    let asked = request("eth_getBlockByHash", &format!(r#"["{HASH}",false]"#));
    let off = CacheSettings { lock_timeout_ms: 0, ..settings() };
    let mut call = CacheExchange::new(Some("n"), b"POST", b"/", Some(asked.as_bytes()), NONE, &off);
    assert!(call.next_lookup().unwrap().headers.is_empty());
    // a daemon that says otherwise is not believed
    call.answered(&miss_answer(b"in_flight", Some(b"held")), 0);
    assert_eq!((call.next_lookup(), call.release()), (None, None));

    let batch = format!("[{asked},{}]", asked.replace("\"id\":7", "\"id\":8").replace(HASH, &HASH.replace('8', "9")));
    let mut batch = exchange(Some("n"), Some(batch.as_bytes()), false, false);
    let lookup = batch.next_lookup().unwrap();
    assert_eq!((lookup.method, lookup.headers.len()), ("POST", 0));
}

/// A blob of `byte`s, and the blobs route's JSON answer carrying it (finalized as `finalized`).
fn blobs_answer(byte: u8, finalized: &str) -> (Vec<u8>, String) {
    let blob = vec![byte; 131_072];
    let hex: String = blob.iter().map(|b| format!("{b:02x}")).collect();
    (blob, format!(r#"{{"execution_optimistic":false,"finalized":{finalized},"data":["0x{hex}"]}}"#))
}

fn beacon_get(path: &str, accept: &str, gzip: bool) -> CacheExchange {
    let headers = [("accept", accept), ("accept-encoding", if gzip { "gzip" } else { "identity" })];
    CacheExchange::new(Some("b/mainnet"), b"GET", path.as_bytes(), None, &headers, &settings())
}

/// A Beacon-API read's miss: looked up, the node's answer (with these headers) held and stored.
fn beacon_miss(path: &str, accept: &str, node: &[(&str, &str)], body: &[u8]) -> Result<DaemonRequest, Refusal> {
    let mut miss = beacon_get(path, accept, false);
    assert_eq!(miss.bypass(), None, "{path}");
    assert_eq!(miss.next_lookup().unwrap().method, "GET");
    miss.answered(&DaemonAnswer { status: 404, miss: Some(b"absent"), ttl: None, lock: None, body: b"" }, 0);
    assert!(miss.response_head(200, Some(body.len() as u64), node));
    miss.stores(body).remove(0)
}

const BLOB_ROOT: &str = "0x50b3798189636f067c5456a93df6ea6ba4ac71c02059a81e567134378e0b11a1";

/// Blocks, blinded blocks and blobs by root or by slot; never by a moving id, never a state;
/// keyed by the path as sent, in either form.
#[test]
fn a_beacon_read_is_taken_by_root_or_slot() {
    let key = |path: &str, accept: &str| beacon_get(path, accept, false).next_lookup().map(|call| call.path);
    for path in [
        format!("/eth/v2/beacon/blocks/{BLOB_ROOT}"),
        "/eth/v1/beacon/blinded_blocks/348241".into(),
        "/beacon/eth/v1/beacon/blobs/7?versioned_hashes=0x01".into(),
    ] {
        let json = key(&path, "application/json");
        assert!(json.is_some(), "{path}");
        assert_eq!(json, key(&path, "application/octet-stream"), "one entry for both forms: {path}");
    }
    let slot = key("/eth/v1/beacon/blobs/7", "*/*");
    assert_ne!(slot, key("/eth/v1/beacon/blobs/7?versioned_hashes=0x01", "*/*"), "the query is the node's to read");
    assert_ne!(slot, key("/eth/v1/beacon/blinded_blocks/7", "*/*"));
    for (path, accept, bypass) in [
        ("/eth/v2/beacon/blocks/head", "application/json", Bypass::Moving),
        ("/eth/v2/beacon/blocks/finalized", "application/json", Bypass::Moving),
        ("/eth/v2/beacon/blocks/0x12", "application/json", Bypass::Malformed),
        ("/eth/v2/beacon/blocks/-1", "application/json", Bypass::Malformed),
        ("/eth/v2/beacon/blocks/99999999999999999999", "application/json", Bypass::Malformed),
        ("/eth/v2/debug/beacon/states/1", "application/json", Bypass::Route),
        ("/eth/v1/beacon/headers/1", "application/json", Bypass::Route),
        ("/eth/v2/beacon/blocks/1", "text/html", Bypass::Route),
    ] {
        assert_eq!(beacon_get(path, accept, false).bypass(), Some(bypass), "{path} {accept}");
    }
    let head = CacheExchange::new(Some("b"), b"HEAD", b"/eth/v2/beacon/blocks/1", None, NONE, &settings());
    assert_eq!(head.bypass(), Some(Bypass::NotPost));
}

/// One entry, stored as SSZ from a JSON answer, answers a JSON client and an SSZ client, plain
/// and gzip; by root only once the node calls it finalized, by slot once the daemon knows it is.
#[test]
fn a_beacon_entry_serves_json_and_ssz() {
    let (blob, json) = blobs_answer(0xab, "true");
    let path = format!("/eth/v1/beacon/blobs/{BLOB_ROOT}");
    let node = [("content-type", "application/json"), ("vary", "Accept")];
    let call = beacon_miss(&path, "application/json", &node, json.as_bytes()).unwrap();
    assert!(!call.headers.iter().any(|(name, _)| *name == protocol::REQUIRES_FINAL_HEADER), "a root is final");
    let stored = daemon_keeps(&call);
    assert!(stored.len() < blob.len() / 10, "stored once, compressed: {}", stored.len());
    for (accept, gzip) in [("application/octet-stream", false), ("application/octet-stream", true), ("application/json", true), ("*/*", false)] {
        let mut hit = beacon_get(&path, accept, gzip);
        hit.next_lookup();
        let answer = DaemonAnswer { status: 200, miss: None, ttl: None, lock: None, body: &stored };
        let response = hit.answered(&answer, 256).expect("a hit");
        let header = |name: &str| response.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str());
        assert_eq!(response.coding, gzip.then_some(Coding::Gzip), "{accept}");
        assert_eq!(header("vary"), Some("Accept, Accept-Encoding"), "the node's Vary: Accept is answered here");
        let body = if gzip { gunzip(&response.body) } else { response.body.clone() };
        if accept.contains("octet-stream") {
            assert_eq!(body, blob);
            assert_eq!(header("content-type"), Some("application/octet-stream"));
            assert_eq!(header("eth-consensus-finalized"), Some("true"));
        } else {
            let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(body, serde_json::from_str::<serde_json::Value>(&json).unwrap(), "{accept}");
            assert_eq!(header("content-type"), Some("application/json"));
        }
    }
    // by root, only what the node calls finalized and not optimistic
    assert_eq!(beacon_miss(&path, "*/*", &node, blobs_answer(1, "false").1.as_bytes()), Err(Refusal::NotFinal));
    let optimistic = json.replace(r#""execution_optimistic":false"#, r#""execution_optimistic":true"#);
    assert_eq!(beacon_miss(&path, "*/*", &node, optimistic.as_bytes()), Err(Refusal::NotFinal));
    // by slot, once the daemon knows the slot is final
    let by_slot = beacon_miss("/eth/v1/beacon/blobs/348241", "*/*", &node, json.as_bytes()).unwrap();
    let requirement = by_slot.headers.iter().find(|(name, _)| *name == protocol::REQUIRES_FINAL_HEADER);
    assert_eq!(requirement.map(|(_, v)| v.as_str()), Some("slot:348241"));
    assert_eq!("slot:348241".parse(), Ok(Final::Slot(348_241)));
    // an SSZ answer says the rest in its headers, or is not kept
    let ssz = [("content-type", "application/octet-stream")];
    assert_eq!(beacon_miss("/eth/v1/beacon/blobs/1", "application/octet-stream", &ssz, &blob), Err(Refusal::NotFinal));
    let lodestar = [
        ("content-type", "application/octet-stream"),
        ("eth-execution-optimistic", "false"),
        ("eth-consensus-finalized", "true"),
    ];
    assert!(beacon_miss(&path, "application/octet-stream", &lodestar, &blob).is_ok());
    assert_eq!(beacon_miss(&path, "application/octet-stream", &lodestar, &blob[1..]), Err(Refusal::Malformed));
    let block = [("content-type", "application/octet-stream"), ("eth-execution-optimistic", "false")];
    let unversioned = beacon_miss("/eth/v2/beacon/blocks/1", "application/octet-stream", &block, &blob);
    assert_eq!(unversioned, Err(Refusal::Malformed), "a block's type depends on its version");
}

/// A daemon's hit of a long tail is kept plain in the hot tier for a client without gzip (its
/// next hits copy it rather than inflate it) under a key of its own, beside the entry as the
/// daemon sent it, which answers any client and says which clients it answers plain; a short one
/// is kept once, as sent. A client without gzip that finds only the entry as sent keeps the plain
/// form beside it.
#[test]
fn the_hot_tier_keeps_a_long_tail_plain_for_clients_without_gzip() {
    let item = r#"{"hash":"0x88e96d4537bea4d9c05d12549907b32561d3bf31f45aae734cdc119f13406cb6","gas":"0x5208"}"#;
    let asked = request("eth_getBlockByHash", &format!(r#"["{HASH}",false]"#));
    for (items, long) in [(10, false), (PLAIN_HOT_MIN as usize / item.len() + 1, true)] {
        let result = format!("[{}]", vec![item; items].join(","));
        let sent = encode(&Envelope::default(), &Head::default(), format!("{result}}}").as_bytes());
        let stored = Entry::decode(&sent).unwrap().compact().unwrap();
        assert_eq!(Entry::decode(&stored).unwrap().plain_form().is_some(), long, "{items} items");
        let keep = |region: &mut [u8], gzip| {
            let mut hit = exchange(Some("n"), Some(asked.as_bytes()), gzip, false);
            hit.next_lookup();
            let answer = DaemonAnswer { status: 200, miss: None, ttl: None, lock: None, body: &stored };
            assert!(hit.answered(&answer, 0).is_some());
            hit.keep_hot(&mut HotTier::open(region).unwrap(), &stored, 100);
        };
        let answer = |region: &mut [u8], gzip| {
            let mut again = exchange(Some("n"), Some(asked.as_bytes()), gzip, false);
            again.find_hot(&mut HotTier::open(region).unwrap(), 101, 0).then(|| again.hot_answer(0).unwrap()).map(
                |response| {
                    assert_eq!(response.coding, gzip.then_some(Coding::Gzip), "gzip: {gzip}");
                    let body = if gzip { gunzip(&response.body) } else { response.body };
                    assert_eq!(body, envelope("7", result.as_bytes()));
                },
            )
        };
        let mut region = vec![0; 4 << 20];
        keep(&mut region, false);
        assert!(answer(&mut region, false).is_some());
        assert!(answer(&mut region, true).is_some(), "the entry beside it answers gzip");
        keep(&mut region, true);
        assert!(answer(&mut region, true).is_some() && answer(&mut region, false).is_some());

        let mut region = vec![0; 4 << 20];
        keep(&mut region, true);
        let before = region.clone();
        assert!(answer(&mut region, false).is_some(), "the entry as sent answers a client without gzip too");
        assert_eq!(region != before, long, "and the first such client keeps a long one's plain form");
        let after = region.clone();
        assert!(answer(&mut region, false).is_some() && answer(&mut region, true).is_some());
        assert_eq!(region, after, "which the next ones take");
    }
}

/// A client whose codings the entry keeps no form for (a long tail of hashes: its DEFLATE form
/// leaves no room for a zstd one) is answered plain, and from the hot tier's plain form once one
/// is there, as a client without gzip is: not by inflating the tail on every hit.
#[test]
fn a_client_the_entry_answers_plain_takes_the_hot_tiers_plain_form() {
    let asked = request("eth_getBlockByHash", &format!(r#"["{HASH}",false]"#));
    let hashes: Vec<String> = (0..2000u32).map(|i| format!("\"0x{}\"", faster_hex::hex_string(&Sha256::digest(i.to_le_bytes())))).collect();
    let result = format!("[{}]", hashes.join(","));
    let sent = encode(&Envelope::default(), &Head::default(), format!("{result}}}").as_bytes());
    let stored = Entry::decode(&sent).unwrap().compact().unwrap();
    let entry = Entry::decode(&stored).unwrap();
    assert!(!entry.answers_plain(&[Coding::Gzip]) && entry.answers_plain(&[Coding::Zstd]), "kept: DEFLATE only");
    let zstd_only = [("accept-encoding", "zstd")];
    let exchange = || CacheExchange::new(Some("n"), b"POST", b"/", Some(asked.as_bytes()), &zstd_only, &settings());
    let mut region = vec![0; 4 << 20];
    let mut first = exchange();
    first.next_lookup();
    let answer = DaemonAnswer { status: 200, miss: None, ttl: None, lock: None, body: &stored };
    assert!(first.answered(&answer, 0).is_some_and(|hit| hit.coding.is_none()));
    first.keep_hot(&mut HotTier::open(&mut region).unwrap(), &stored, 100);
    let plain = entry.plain_form().unwrap();
    let mut hot = HotTier::open(&mut region).unwrap();
    assert_eq!(hot.find(&flow::plain_key(&first.key().copied().unwrap()), 101), Some(plain.as_slice()), "kept plain");
    let mut again = exchange();
    assert!(again.find_hot(&mut hot, 101, 0));
    let hit = again.hot_answer(0).unwrap();
    assert_eq!((hit.coding, hit.body), (None, envelope("7", result.as_bytes())));
}
