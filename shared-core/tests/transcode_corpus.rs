//! The transcoders against ssz_rs, the oracle, on the corpus's witnesses: every witness (both
//! JSON shapes) goes to exactly the bytes ssz_rs serializes for the same values, ssz_rs reads our
//! bytes back to the same values (and so the same root), and our JSON from them has the input's
//! values in the list shape. Headers given as JSON objects (geth's form) go in as RLP whose
//! keccak-256 is the header's hash, byte for byte the RLP that erigon gives for the same header
//! where the corpus has it. Streamed in chunks of any size, a witness response gives the same
//! bytes as whole, and its SSZ the same JSON as whole.

mod common;

use std::collections::HashMap;
use std::path::Path;

use rpcedge_core::transcode::{
    jsonrpc_from_ssz, jsonrpc_to_ssz, ssz_to_json, Schema, WitnessForm, WitnessRender, WitnessStream,
};
use serde_json::Value;
use sha3::{Digest, Keccak256};
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
    let whole = jsonrpc_to_ssz(&serde_json::to_vec(&body).unwrap(), Schema::Witness, form).unwrap().ssz;
    // as it would arrive, compact in nginx's 8 KiB buffers or pretty-printed in odd pieces
    for (json, chunk) in [(serde_json::to_vec(&body).unwrap(), 8192), (serde_json::to_vec_pretty(&body).unwrap(), 1021)] {
        let mut stream = WitnessStream::new(form);
        for piece in json.chunks(chunk) {
            stream.feed(piece, false).unwrap();
        }
        stream.feed(&[], true).unwrap();
        let mut streamed = stream.finish().unwrap();
        let mut ssz = Vec::new();
        while let Some((piece, _)) = streamed.ssz.next_piece() {
            ssz.extend_from_slice(piece);
        }
        assert_eq!(ssz, whole, "streamed in chunks of {chunk}");
    }
    whole
}

/// Headers' RLP by their hash.
type Twins = HashMap<Vec<u8>, Vec<u8>>;

/// The RLP each header's JSON object must become: the RLP the corpus gives for the same header
/// elsewhere (erigon's RLP form), by the keccak-256 that is its hash.
fn rlp_headers(witnesses: &[(String, Value)]) -> Twins {
    let rlp = witnesses.iter().flat_map(|(_, witness)| values(witness, "headers")).filter(Value::is_string);
    rlp.map(|header| bytes(&header)).map(|rlp| (Keccak256::digest(&rlp).to_vec(), rlp)).collect()
}

/// The headers of `witness` as RLP: as the witness has them, or for a JSON header those of `ssz`
/// (ours), once they hash to the header's `hash` and equal the RLP of `twins` for it.
fn headers(name: &str, witness: &Value, ssz: &[u8], twins: &Twins, twinned: &mut usize) -> Headers {
    let ours: Witness = ssz_rs::deserialize(ssz).unwrap();
    let items = values(witness, "headers");
    assert_eq!(ours.headers.len(), items.len(), "{name}");
    let rlp: Vec<List<u8, 1024>> = items
        .iter()
        .zip(ours.headers.iter())
        .map(|(item, ours)| {
            if item.is_string() {
                return bytes(item).try_into().unwrap();
            }
            let hash = bytes(&item["hash"]);
            assert_eq!(Keccak256::digest(ours.as_slice()).to_vec(), hash, "{name}: the RLP of {item}");
            if let Some(twin) = twins.get(&hash) {
                assert_eq!(ours.as_slice(), twin.as_slice(), "{name}: erigon's RLP of {item}");
                *twinned += 1;
            }
            ours.clone()
        })
        .collect();
    rlp.try_into().unwrap()
}

#[test]
fn every_witness_transcodes_to_what_ssz_rs_serializes_and_back() {
    let witnesses = witnesses();
    assert!(witnesses.len() >= common::corpus::least(10, 1), "only {} witnesses: is the corpus there?", witnesses.len());
    let twins = rlp_headers(&witnesses);
    let (mut json_headers, mut twinned) = (0, 0);
    for (name, witness) in &witnesses {
        let ssz = ours(witness, WitnessForm::Lossless);
        let headers = headers(name, witness, &ssz, &twins, &mut twinned);
        json_headers += usize::from(values(witness, "headers").iter().any(Value::is_object));
        let (state, codes, keys) = (list(witness, "state"), list(witness, "codes"), list(witness, "keys"));
        let mut oracle = Witness { state, codes, headers, keys };
        assert_eq!(ssz, ssz_rs::serialize(&oracle).unwrap(), "{name}");
        let mut read_back: Witness = ssz_rs::deserialize(&ssz).unwrap();
        assert_eq!(read_back.hash_tree_root().unwrap(), oracle.hash_tree_root().unwrap(), "{name}");

        let (state, codes, headers) = (oracle.state.clone(), oracle.codes.clone(), oracle.headers.clone());
        let mut eip = SszExecutionWitness { state, codes, headers };
        let eip_ssz = ours(witness, WitnessForm::Eip8025);
        assert_eq!(eip_ssz, ssz_rs::serialize(&eip).unwrap(), "{name}");
        let mut eip_back: SszExecutionWitness = ssz_rs::deserialize(&eip_ssz).unwrap();
        assert_eq!(eip_back.hash_tree_root().unwrap(), eip.hash_tree_root().unwrap());

        // back to JSON as the SSZ arrives, in chunks of any size: what it renders whole
        for (ssz, form) in [(&ssz, WitnessForm::Lossless), (&eip_ssz, WitnessForm::Eip8025)] {
            let whole = jsonrpc_from_ssz(ssz, Schema::Witness, form, b"7", b"2.0").unwrap();
            for step in [8192, 1021] {
                let mut render = WitnessRender::new(form, b"7", b"2.0").unwrap();
                let mut out = Vec::new();
                for chunk in ssz.chunks(step) {
                    render.feed(chunk, false, &mut out).unwrap();
                }
                render.feed(&[], true, &mut out).unwrap();
                assert!(out == whole, "{name}: rendered in chunks of {step}");
            }
        }

        // back to JSON: the list shape, headers as RLP
        let mut json = Vec::new();
        ssz_to_json(&ssz, Schema::Witness, WitnessForm::Lossless, &mut json).unwrap();
        let json: Value = serde_json::from_slice(&json).unwrap();
        let lower = |items: Vec<Value>| -> Vec<String> {
            items.iter().map(|v| v.as_str().unwrap().to_ascii_lowercase()).collect()
        };
        for field in ["state", "codes", "keys"] {
            assert_eq!(lower(values(&json, field)), lower(values(witness, field)), "{name}: {field}");
        }
        let headers: Vec<Vec<u8>> = values(&json, "headers").iter().map(bytes).collect();
        assert_eq!(headers, oracle.headers.iter().map(|h| h.to_vec()).collect::<Vec<_>>(), "{name}: headers");
    }
    assert!(json_headers >= common::corpus::least(52, 1), "only {json_headers} witnesses with JSON headers");
    assert!(twinned >= common::corpus::least(40, 0), "only {twinned} JSON headers checked against erigon's RLP");
}
