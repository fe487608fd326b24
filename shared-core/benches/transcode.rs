//! Transcoding, JSON -> SSZ and SSZ -> JSON, of the corpus's largest witness and of a deneb
//! `SignedBeaconBlock` (the largest ssz_static case): rpcedge's schema-driven transcoder against
//! the straightforward path (serde_json into structs, hex decoding, ssz_rs serializing; and back).
//! Throughput is counted in bytes of JSON, in or out.
//!
//!     cargo bench -p rpcedge-core --bench transcode

use std::hint::black_box;
use std::path::Path;

use criterion::{Criterion, Throughput};
use rpcedge_core::transcode::{beacon_data_to_json, beacon_data_to_ssz, jsonrpc_to_ssz, ssz_to_json, BeaconObject, Fork, Schema, WitnessForm};
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

/// The deneb block's types for ssz_rs, with serde in the Beacon-API's JSON form: integers as
/// decimal strings, bytes as 0x-hex (ssz_rs's own serde does bitfields and uint256 so already).
mod deneb {
    use ssz_rs::prelude::*;

    pub type Bytes32 = Vector<u8, 32>;
    pub type Bytes48 = Vector<u8, 48>;
    pub type Bytes96 = Vector<u8, 96>;

    fn decode(text: &str) -> Result<Vec<u8>, String> {
        let digits = text.strip_prefix("0x").ok_or("no 0x")?.as_bytes();
        let mut out = vec![0; digits.len() / 2];
        faster_hex::hex_decode(digits, &mut out).map_err(|e| e.to_string())?;
        Ok(out)
    }

    fn encode(bytes: &[u8]) -> String {
        format!("0x{}", faster_hex::hex_string(bytes))
    }

    /// A `Vector<u8, N>` or `List<u8, N>` as one hex string.
    pub mod hex {
        use super::{decode, encode};
        use serde::{Deserialize, Deserializer, Serializer};
        pub fn serialize<S: Serializer, T: AsRef<[u8]>>(value: &T, s: S) -> Result<S::Ok, S::Error> {
            s.serialize_str(&encode(value.as_ref()))
        }
        pub fn deserialize<'de, D: Deserializer<'de>, T: TryFrom<Vec<u8>>>(d: D) -> Result<T, D::Error> {
            let bytes = decode(&String::deserialize(d)?).map_err(serde::de::Error::custom)?;
            T::try_from(bytes).map_err(|_| serde::de::Error::custom("length"))
        }
    }

    /// A list or vector of byte vectors or lists as an array of hex strings.
    pub mod hex_items {
        use super::{decode, encode};
        use serde::{Deserialize, Deserializer, Serializer};
        pub fn serialize<S: Serializer, L: AsRef<[T]>, T: AsRef<[u8]>>(value: &L, s: S) -> Result<S::Ok, S::Error> {
            s.collect_seq(value.as_ref().iter().map(|item| encode(item.as_ref())))
        }
        pub fn deserialize<'de, D: Deserializer<'de>, L: TryFrom<Vec<T>>, T: TryFrom<Vec<u8>>>(d: D) -> Result<L, D::Error> {
            let items = Vec::<String>::deserialize(d)?
                .iter()
                .map(|text| decode(text).ok().and_then(|bytes| T::try_from(bytes).ok()).ok_or(serde::de::Error::custom("item")))
                .collect::<Result<Vec<T>, D::Error>>()?;
            L::try_from(items).map_err(|_| serde::de::Error::custom("length"))
        }
    }

    /// A u64 as a decimal string.
    pub mod quoted {
        use serde::{Deserialize, Deserializer, Serializer};
        pub fn serialize<S: Serializer>(value: &u64, s: S) -> Result<S::Ok, S::Error> {
            s.collect_str(value)
        }
        pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
            String::deserialize(d)?.parse().map_err(serde::de::Error::custom)
        }
    }

    /// A list of u64s as decimal strings.
    pub mod quoted_items {
        use serde::{Deserialize, Deserializer, Serializer};
        use ssz_rs::List;
        pub fn serialize<S: Serializer, const N: usize>(value: &List<u64, N>, s: S) -> Result<S::Ok, S::Error> {
            s.collect_seq(value.iter().map(u64::to_string))
        }
        pub fn deserialize<'de, D: Deserializer<'de>, const N: usize>(d: D) -> Result<List<u64, N>, D::Error> {
            let items = Vec::<String>::deserialize(d)?.iter().map(|n| n.parse().map_err(serde::de::Error::custom)).collect::<Result<Vec<u64>, _>>()?;
            List::try_from(items).map_err(|_| serde::de::Error::custom("length"))
        }
    }

    macro_rules! container {
        ($name:ident { $($(#[$attr:meta])* $field:ident: $ty:ty),* $(,)? }) => {
            #[derive(PartialEq, Eq, Debug, Default, Clone, SimpleSerialize, serde::Serialize, serde::Deserialize)]
            pub struct $name { $($(#[$attr])* pub $field: $ty),* }
        };
    }

    container!(Checkpoint { #[serde(with = "quoted")] epoch: u64, #[serde(with = "hex")] root: Bytes32 });
    container!(AttestationData {
        #[serde(with = "quoted")] slot: u64, #[serde(with = "quoted")] index: u64,
        #[serde(with = "hex")] beacon_block_root: Bytes32, source: Checkpoint, target: Checkpoint,
    });
    container!(BeaconBlockHeader {
        #[serde(with = "quoted")] slot: u64, #[serde(with = "quoted")] proposer_index: u64,
        #[serde(with = "hex")] parent_root: Bytes32, #[serde(with = "hex")] state_root: Bytes32, #[serde(with = "hex")] body_root: Bytes32,
    });
    container!(SignedBeaconBlockHeader { message: BeaconBlockHeader, #[serde(with = "hex")] signature: Bytes96 });
    container!(ProposerSlashing { signed_header_1: SignedBeaconBlockHeader, signed_header_2: SignedBeaconBlockHeader });
    container!(IndexedAttestation {
        #[serde(with = "quoted_items")] attesting_indices: List<u64, 2048>, data: AttestationData, #[serde(with = "hex")] signature: Bytes96,
    });
    container!(AttesterSlashing { attestation_1: IndexedAttestation, attestation_2: IndexedAttestation });
    container!(Attestation { aggregation_bits: Bitlist<2048>, data: AttestationData, #[serde(with = "hex")] signature: Bytes96 });
    container!(DepositData {
        #[serde(with = "hex")] pubkey: Bytes48, #[serde(with = "hex")] withdrawal_credentials: Bytes32,
        #[serde(with = "quoted")] amount: u64, #[serde(with = "hex")] signature: Bytes96,
    });
    container!(Deposit { #[serde(with = "hex_items")] proof: Vector<Bytes32, 33>, data: DepositData });
    container!(VoluntaryExit { #[serde(with = "quoted")] epoch: u64, #[serde(with = "quoted")] validator_index: u64 });
    container!(SignedVoluntaryExit { message: VoluntaryExit, #[serde(with = "hex")] signature: Bytes96 });
    container!(Eth1Data { #[serde(with = "hex")] deposit_root: Bytes32, #[serde(with = "quoted")] deposit_count: u64, #[serde(with = "hex")] block_hash: Bytes32 });
    container!(SyncAggregate { sync_committee_bits: Bitvector<512>, #[serde(with = "hex")] sync_committee_signature: Bytes96 });
    container!(Withdrawal {
        #[serde(with = "quoted")] index: u64, #[serde(with = "quoted")] validator_index: u64,
        #[serde(with = "hex")] address: Vector<u8, 20>, #[serde(with = "quoted")] amount: u64,
    });
    container!(ExecutionPayload {
        #[serde(with = "hex")] parent_hash: Bytes32, #[serde(with = "hex")] fee_recipient: Vector<u8, 20>,
        #[serde(with = "hex")] state_root: Bytes32, #[serde(with = "hex")] receipts_root: Bytes32,
        #[serde(with = "hex")] logs_bloom: Vector<u8, 256>, #[serde(with = "hex")] prev_randao: Bytes32,
        #[serde(with = "quoted")] block_number: u64, #[serde(with = "quoted")] gas_limit: u64,
        #[serde(with = "quoted")] gas_used: u64, #[serde(with = "quoted")] timestamp: u64,
        #[serde(with = "hex")] extra_data: List<u8, 32>, base_fee_per_gas: U256, #[serde(with = "hex")] block_hash: Bytes32,
        #[serde(with = "hex_items")] transactions: List<List<u8, 1_073_741_824>, 1_048_576>,
        withdrawals: List<Withdrawal, 16>, #[serde(with = "quoted")] blob_gas_used: u64, #[serde(with = "quoted")] excess_blob_gas: u64,
    });
    container!(BlsToExecutionChange {
        #[serde(with = "quoted")] validator_index: u64, #[serde(with = "hex")] from_bls_pubkey: Bytes48,
        #[serde(with = "hex")] to_execution_address: Vector<u8, 20>,
    });
    container!(SignedBlsToExecutionChange { message: BlsToExecutionChange, #[serde(with = "hex")] signature: Bytes96 });
    container!(BeaconBlockBody {
        #[serde(with = "hex")] randao_reveal: Bytes96, eth1_data: Eth1Data, #[serde(with = "hex")] graffiti: Bytes32,
        proposer_slashings: List<ProposerSlashing, 16>, attester_slashings: List<AttesterSlashing, 2>,
        attestations: List<Attestation, 128>, deposits: List<Deposit, 16>, voluntary_exits: List<SignedVoluntaryExit, 16>,
        sync_aggregate: SyncAggregate, execution_payload: ExecutionPayload,
        bls_to_execution_changes: List<SignedBlsToExecutionChange, 16>,
        #[serde(with = "hex_items")] blob_kzg_commitments: List<Bytes48, 4096>,
    });
    container!(BeaconBlock {
        #[serde(with = "quoted")] slot: u64, #[serde(with = "quoted")] proposer_index: u64,
        #[serde(with = "hex")] parent_root: Bytes32, #[serde(with = "hex")] state_root: Bytes32, body: BeaconBlockBody,
    });
    container!(SignedBeaconBlock { message: BeaconBlock, #[serde(with = "hex")] signature: Bytes96 });
}

fn block_baseline_to_ssz(json: &[u8]) -> Vec<u8> {
    let block: deneb::SignedBeaconBlock = serde_json::from_slice(json).unwrap();
    ssz_rs::serialize(&block).unwrap()
}

fn block_baseline_to_json(ssz: &[u8]) -> Vec<u8> {
    let block: deneb::SignedBeaconBlock = ssz_rs::deserialize(ssz).unwrap();
    serde_json::to_vec(&block).unwrap()
}

/// The largest deneb `SignedBeaconBlock` of the ssz_static cases, as Beacon-API JSON, and its SSZ.
fn block() -> (Vec<u8>, Vec<u8>) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/corpus/ssz/ssz_static/tests/mainnet/deneb/ssz_static/SignedBeaconBlock/ssz_random");
    let cases = std::fs::read_dir(&dir).expect("the corpus is there").flatten().map(|case| rpcedge_corpus::beacon::ssz_static_case(&case.path()).unwrap());
    let (json, ssz) = cases.max_by_key(|(_, ssz)| ssz.len()).unwrap();
    (json.into_bytes(), ssz)
}

fn bench_block(c: &mut Criterion) {
    let (json, ssz) = block();
    assert_eq!(beacon_data_to_ssz(&json, BeaconObject::Block, Fork::Deneb).unwrap(), ssz);
    assert_eq!(block_baseline_to_ssz(&json), ssz, "both paths give the same bytes");
    let mut ours = Vec::new();
    beacon_data_to_json(&ssz, BeaconObject::Block, Fork::Deneb, &mut ours).unwrap();
    let theirs = block_baseline_to_json(&ssz);
    assert_eq!(serde_json::from_slice::<serde_json::Value>(&ours).unwrap(), serde_json::from_slice::<serde_json::Value>(&theirs).unwrap());

    let mut group = c.benchmark_group("block json->ssz");
    group.throughput(Throughput::Bytes(json.len() as u64));
    group.bench_function("rpcedge", |b| b.iter(|| beacon_data_to_ssz(black_box(&json), BeaconObject::Block, Fork::Deneb).unwrap()));
    group.bench_function("serde + ssz_rs", |b| b.iter(|| block_baseline_to_ssz(black_box(&json))));
    group.finish();
    let mut group = c.benchmark_group("block ssz->json");
    group.throughput(Throughput::Bytes(ours.len() as u64));
    group.bench_function("rpcedge", |b| {
        b.iter(|| {
            let mut out = Vec::new();
            beacon_data_to_json(black_box(&ssz), BeaconObject::Block, Fork::Deneb, &mut out).unwrap();
            out
        })
    });
    group.bench_function("serde + ssz_rs", |b| b.iter(|| block_baseline_to_json(black_box(&ssz))));
    group.finish();
    println!("block: {} B of JSON, {} B of SSZ ({:.3}x)", json.len(), ssz.len(), ssz.len() as f64 / json.len() as f64);
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
    bench_block(&mut c);
    c.final_summary();
    println!("witness: {} B of JSON, {} B of SSZ ({:.3}x)", body.len(), ssz.len(), ssz.len() as f64 / body.len() as f64);
}
