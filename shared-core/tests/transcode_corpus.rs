//! The transcoders against ssz_rs, the oracle, on the corpus's witnesses: every witness (both
//! JSON shapes) goes to exactly the bytes ssz_rs serializes for the same values, ssz_rs reads our
//! bytes back to the same values (and so the same root), and our JSON from them has the input's
//! values in the list shape.

mod common;

use std::path::Path;

use rpcedge_core::transcode::{jsonrpc_to_ssz, ssz_to_json, Schema, WitnessForm};
use serde_json::Value;
use ssz_rs::prelude::*;

type Nodes = List<List<u8, 1024>, 4_194_304>;
type Codes = List<List<u8, 65_536>, 262_144>;
type Headers = List<List<u8, 1024>, 256>;
type Keys = List<List<u8, 32>, 4_194_304>;

/// rpcedge's lossless container.
#[derive(PartialEq, Eq, Debug, Default, Clone, SimpleSerialize)]
struct Witness {
    state: Nodes,
    codes: Codes,
    headers: Headers,
    keys: Keys,
}

/// EIP-8025's `SszExecutionWitness`.
#[derive(PartialEq, Eq, Debug, Default, Clone, SimpleSerialize)]
struct SszExecutionWitness {
    state: Nodes,
    codes: Codes,
    headers: Headers,
}

/// Every witness in the corpus: (where, the result's JSON value).
fn witnesses() -> Vec<(String, Value)> {
    let root = common::corpus::dir().join("witness");
    let read = |path: &Path| serde_json::from_slice::<Value>(&std::fs::read(path).unwrap()).unwrap();
    let mut found = Vec::new();
    for file in std::fs::read_dir(root.join("ethrex-replay")).expect("the corpus is there").flatten() {
        found.push((file.path().display().to_string(), read(&file.path())["witness"].clone()));
    }
    // (the repository's sample has only the ethrex-replay one)
    for block in std::fs::read_dir(root.join("sbv-holesky-reth-format")).into_iter().flatten().flatten() {
        let path = block.path().join("witness.json");
        if path.exists() {
            found.push((path.display().to_string(), read(&path)));
        }
    }
    for file in std::fs::read_dir(common::corpus::dir().join("rpc/debug_executionWitness")).into_iter().flatten().flatten() {
        for (i, pair) in read(&file.path()).as_array().unwrap().iter().enumerate() {
            if let Some(result) = pair["response"].get("result").filter(|r| r.is_object()) {
                found.push((format!("{}#{i}", file.path().display()), result.clone()));
            }
        }
    }
    found
}

fn bytes(hex: &Value) -> Vec<u8> {
    let hex = hex.as_str().unwrap().strip_prefix("0x").unwrap();
    (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap()).collect()
}

/// A field's values in either shape (a list, or a map whose values they are; `null`: none), as the
/// JSON has them.
fn values(witness: &Value, field: &str) -> Vec<Value> {
    match witness.get(field) {
        Some(Value::Array(items)) => items.clone(),
        Some(Value::Object(map)) => map.values().cloned().collect(),
        _ => Vec::new(),
    }
}

fn list<const M: usize, const N: usize>(witness: &Value, field: &str) -> List<List<u8, M>, N> {
    let items: Vec<List<u8, M>> = values(witness, field).iter().map(|v| bytes(v).try_into().unwrap()).collect();
    items.try_into().unwrap()
}

fn ours(witness: &Value, form: WitnessForm) -> Vec<u8> {
    let body = serde_json::json!({"jsonrpc": "2.0", "id": 1, "result": witness});
    jsonrpc_to_ssz(&serde_json::to_vec(&body).unwrap(), Schema::Witness, form).unwrap().ssz
}

#[test]
fn every_witness_transcodes_to_what_ssz_rs_serializes_and_back() {
    let witnesses = witnesses();
    assert!(witnesses.len() >= common::corpus::least(10, 1), "only {} witnesses: is the corpus there?", witnesses.len());
    let mut transcoded = 0;
    for (name, witness) in &witnesses {
        let hex = |v: &Value| v.as_str().is_some_and(|s| s.starts_with("0x"));
        if !["state", "codes", "keys", "headers"].iter().all(|field| values(witness, field).iter().all(hex)) {
            // e.g. erigon's headers as JSON objects, not RLP: not this schema, so left untouched
            let body = serde_json::to_vec(&serde_json::json!({"jsonrpc": "2.0", "id": 1, "result": witness})).unwrap();
            assert!(jsonrpc_to_ssz(&body, Schema::Witness, WitnessForm::Lossless).is_err(), "{name}");
            continue;
        }
        transcoded += 1;
        let mut oracle = Witness {
            state: list(witness, "state"),
            codes: list(witness, "codes"),
            headers: list(witness, "headers"),
            keys: list(witness, "keys"),
        };
        let ssz = ours(witness, WitnessForm::Lossless);
        assert_eq!(ssz, ssz_rs::serialize(&oracle).unwrap(), "{name}");
        let mut read_back: Witness = ssz_rs::deserialize(&ssz).unwrap();
        assert_eq!(read_back.hash_tree_root().unwrap(), oracle.hash_tree_root().unwrap(), "{name}");

        let mut eip = SszExecutionWitness { state: oracle.state, codes: oracle.codes, headers: oracle.headers };
        let eip_ssz = ours(witness, WitnessForm::Eip8025);
        assert_eq!(eip_ssz, ssz_rs::serialize(&eip).unwrap(), "{name}");
        let mut eip_back: SszExecutionWitness = ssz_rs::deserialize(&eip_ssz).unwrap();
        assert_eq!(eip_back.hash_tree_root().unwrap(), eip.hash_tree_root().unwrap());

        let mut json = Vec::new();
        ssz_to_json(&ssz, Schema::Witness, WitnessForm::Lossless, &mut json).unwrap();
        let json: Value = serde_json::from_slice(&json).unwrap();
        for field in ["state", "codes", "keys", "headers"] {
            let lower = |items: Vec<Value>| -> Vec<String> {
                items.iter().map(|v| v.as_str().unwrap().to_ascii_lowercase()).collect()
            };
            assert_eq!(lower(values(&json, field)), lower(values(witness, field)), "{name}: {field}");
        }
    }
    assert!(transcoded >= common::corpus::least(8, 1), "only {transcoded} witnesses of the schema's shape");
}
