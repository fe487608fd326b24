//! Witness transcoding, JSON -> SSZ and SSZ -> JSON, on the corpus's largest witness: rpcedge's
//! schema-driven transcoder against the straightforward path (serde_json into a struct, hex
//! decoding, ssz_rs serializing; and back). Throughput is counted in bytes of JSON, in or out.
//!
//!     cargo bench -p rpcedge-core --bench transcode

use std::hint::black_box;
use std::path::Path;

use criterion::{Criterion, Throughput};
use rpcedge_core::transcode::{jsonrpc_to_ssz, ssz_to_json, Schema, WitnessForm};
use ssz_rs::prelude::*;

#[derive(PartialEq, Eq, Debug, Default, Clone, SimpleSerialize)]
struct Witness {
    state: List<List<u8, 1024>, 4_194_304>,
    codes: List<List<u8, 65_536>, 262_144>,
    headers: List<List<u8, 1024>, 256>,
    keys: List<List<u8, 32>, 4_194_304>,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct JsonWitness {
    state: Vec<String>,
    codes: Vec<String>,
    keys: Vec<String>,
    headers: Vec<String>,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Envelope<T> {
    jsonrpc: String,
    id: u64,
    result: T,
}

fn baseline_to_ssz(body: &[u8]) -> Vec<u8> {
    let envelope: Envelope<JsonWitness> = serde_json::from_slice(body).unwrap();
    let w = envelope.result;
    let bytes = |hex: &String| {
        let digits = hex.strip_prefix("0x").unwrap().as_bytes();
        let mut out = vec![0; digits.len() / 2];
        faster_hex::hex_decode(digits, &mut out).unwrap();
        out
    };
    let witness = Witness {
        state: w.state.iter().map(|h| bytes(h).try_into().unwrap()).collect::<Vec<_>>().try_into().unwrap(),
        codes: w.codes.iter().map(|h| bytes(h).try_into().unwrap()).collect::<Vec<_>>().try_into().unwrap(),
        headers: w.headers.iter().map(|h| bytes(h).try_into().unwrap()).collect::<Vec<_>>().try_into().unwrap(),
        keys: w.keys.iter().map(|h| bytes(h).try_into().unwrap()).collect::<Vec<_>>().try_into().unwrap(),
    };
    ssz_rs::serialize(&witness).unwrap()
}

fn baseline_to_json(ssz: &[u8]) -> Vec<u8> {
    let witness: Witness = ssz_rs::deserialize(ssz).unwrap();
    let strings = |items: Vec<Vec<u8>>| -> Vec<String> {
        items.iter().map(|b| format!("0x{}", faster_hex::hex_string(b))).collect()
    };
    let w = JsonWitness {
        state: strings(witness.state.iter().map(|b| b.to_vec()).collect()),
        codes: strings(witness.codes.iter().map(|b| b.to_vec()).collect()),
        keys: strings(witness.keys.iter().map(|b| b.to_vec()).collect()),
        headers: strings(witness.headers.iter().map(|b| b.to_vec()).collect()),
    };
    serde_json::to_vec(&Envelope { jsonrpc: "2.0".into(), id: 1, result: w }).unwrap()
}

fn main() {
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/corpus/witness/ethrex-replay");
    let file = std::fs::read_dir(&corpus)
        .expect("the corpus is there")
        .flatten()
        .max_by_key(|f| f.metadata().map(|m| m.len()).unwrap_or(0))
        .unwrap();
    let wrapped: serde_json::Value = serde_json::from_slice(&std::fs::read(file.path()).unwrap()).unwrap();
    let body = serde_json::to_vec(&serde_json::json!({"jsonrpc": "2.0", "id": 1, "result": wrapped["witness"]})).unwrap();
    let ssz = jsonrpc_to_ssz(&body, Schema::Witness, WitnessForm::Lossless).unwrap().ssz;
    assert_eq!(ssz, baseline_to_ssz(&body), "both paths give the same bytes");
    let mut json = Vec::new();
    ssz_to_json(&ssz, Schema::Witness, WitnessForm::Lossless, &mut json).unwrap();

    let mut c = Criterion::default().configure_from_args().sample_size(20);
    let mut group = c.benchmark_group("witness json->ssz");
    group.throughput(Throughput::Bytes(body.len() as u64));
    group.bench_function("rpcedge", |b| b.iter(|| jsonrpc_to_ssz(black_box(&body), Schema::Witness, WitnessForm::Lossless).unwrap()));
    group.bench_function("serde + ssz_rs", |b| b.iter(|| baseline_to_ssz(black_box(&body))));
    group.finish();
    let mut group = c.benchmark_group("witness ssz->json");
    group.throughput(Throughput::Bytes(json.len() as u64));
    group.bench_function("rpcedge", |b| {
        b.iter(|| {
            let mut out = Vec::new();
            ssz_to_json(black_box(&ssz), Schema::Witness, WitnessForm::Lossless, &mut out).unwrap();
            out
        })
    });
    group.bench_function("serde + ssz_rs", |b| b.iter(|| baseline_to_json(black_box(&ssz))));
    group.finish();
    c.final_summary();
    println!("witness: {} B of JSON, {} B of SSZ ({:.3}x)", body.len(), ssz.len(), ssz.len() as f64 / body.len() as f64);
}
