//! Seeds for the transcode fuzz targets, from the recorded corpus (`../shared/corpus`, else the
//! repository's sample, as the tests find it): each target's first bytes pick its path (see the
//! targets), so each seed is a real input put on the path it belongs to, in both directions (the
//! SSZ made from the recorded JSON by the core itself). Written into `<dir>/<target>/`.
//!
//!     cargo run --release -p rpcedge-core --example fuzz_seeds -- shared-core/fuzz/corpus

// the tests' own reader of the corpus, of which the seeds need less than the tests
#[allow(dead_code)]
#[path = "../tests/common/corpus.rs"]
mod corpus;

use std::path::{Path, PathBuf};

use rpcedge_core::transcode::{
    beacon_data_to_ssz, beacon_from_ssz, jsonrpc_to_ssz, light_client_updates_to_ssz, BeaconEnvelope, BeaconNetwork,
    method_schema, BeaconObject, Fork, Schema, WitnessForm,
};

/// A seed past this would make every run of its target slow (libFuzzer's inputs grow to the
/// longest seed).
const MAX_SEED: usize = 256 * 1024;
/// ssz_static cases read per type and fork.
const CASES: usize = 3;

/// The ssz_static types that are a Beacon-API object's data, or its list's one item.
const TYPES: [(&str, BeaconObject, bool); 7] = [
    ("SignedBeaconBlock", BeaconObject::Block, false),
    ("BeaconState", BeaconObject::State, false),
    ("BlobSidecar", BeaconObject::BlobSidecars, true),
    ("DataColumnSidecar", BeaconObject::DataColumnSidecars, true),
    ("LightClientBootstrap", BeaconObject::LightClientBootstrap, false),
    ("LightClientFinalityUpdate", BeaconObject::LightClientFinalityUpdate, false),
    ("LightClientOptimisticUpdate", BeaconObject::LightClientOptimisticUpdate, false),
];

struct Seeds {
    dir: PathBuf,
    written: usize,
}

impl Seeds {
    /// `input` behind the path-picking bytes `choice`, into `target`'s corpus.
    fn write(&mut self, target: &str, name: &str, choice: &[u8], input: &[u8]) {
        if input.len() > MAX_SEED {
            return;
        }
        let dir = self.dir.join(target);
        std::fs::create_dir_all(&dir).expect("the corpus folder can be made");
        std::fs::write(dir.join(format!("seed-{name}")), [choice, input].concat()).expect("a seed can be written");
        self.written += 1;
    }
}

/// The JSON-RPC answers: the JSON way (choice `form | path << 1 | step or schema << 3`) and the
/// SSZ the core makes of it the other way.
fn jsonrpc(seeds: &mut Seeds) {
    for body in corpus::bodies() {
        // the corpus keeps each method's recordings in a folder of its name
        let method = body.origin.split('/').next().unwrap_or_default();
        let Some(schema) = method_schema(method) else { continue };
        let (json_path, ssz_path, low) = match schema {
            Schema::Witness => (0, 1, 6),
            Schema::RawBytes => (2, 3, 0),
            Schema::RawBytesList => (2, 3, 1),
        };
        let n = seeds.written;
        for (form_bit, form) in [WitnessForm::Lossless, WitnessForm::Eip8025].into_iter().enumerate() {
            let form_bit = form_bit as u8;
            seeds.write("transcode_jsonrpc", &format!("{method}-{n}-{form_bit}-json"), &[form_bit | json_path << 1 | low << 3], &body.bytes);
            if let Ok(result) = jsonrpc_to_ssz(&body.bytes, schema, form) {
                seeds.write("transcode_jsonrpc", &format!("{method}-{n}-{form_bit}-ssz"), &[form_bit | ssz_path << 1 | low << 3], &result.ssz);
            }
        }
    }
}

/// The ssz_static cases of `type_name` in `fork`, as Beacon-API JSON.
fn cases(ssz: &Path, fork: Fork, type_name: &str) -> Vec<String> {
    let dir = ssz.join(format!("ssz_static/tests/mainnet/{}/ssz_static/{type_name}/ssz_random", fork.name()));
    let Ok(entries) = std::fs::read_dir(&dir) else { return Vec::new() };
    let mut dirs: Vec<PathBuf> = entries.flatten().map(|entry| entry.path()).collect();
    dirs.sort();
    dirs.iter().take(CASES).filter_map(|case| rpcedge_corpus::beacon::ssz_static_case(case).ok()).map(|(json, _)| json).collect()
}

/// The Beacon-API objects: each case's data both ways (choice: object, then `fork | path << 3`),
/// and the whole response both ways.
fn beacon(seeds: &mut Seeds, ssz_dir: &Path) {
    for (type_name, object, listed) in TYPES {
        let index = BeaconObject::all().iter().position(|o| *o == object).expect("every object is listed") as u8;
        for (fork_index, fork) in Fork::all().into_iter().enumerate() {
            for (case, json) in cases(ssz_dir, fork, type_name).into_iter().enumerate() {
                let data = if listed { format!("[{json}]") } else { json };
                let Ok(ssz) = beacon_data_to_ssz(data.as_bytes(), object, fork) else { continue };
                let name = format!("{type_name}-{}-{case}", fork.name());
                let fork_bits = fork_index as u8;
                seeds.write("transcode_beacon", &format!("{name}-data-json"), &[index, fork_bits], data.as_bytes());
                seeds.write("transcode_beacon", &format!("{name}-data-ssz"), &[index, fork_bits | 1 << 3], &ssz);
                let envelope = BeaconEnvelope { fork: Some(fork), execution_optimistic: false, finalized: Some(true) };
                if let Ok(response) = beacon_from_ssz(&ssz, object, envelope) {
                    seeds.write("transcode_beacon", &format!("{name}-response-json"), &[index, fork_bits | 2 << 3], &response);
                }
                seeds.write("transcode_beacon", &format!("{name}-response-ssz"), &[index, fork_bits | 3 << 3 | 0x80], &ssz);
            }
        }
    }
}

/// The light client updates route: each fork's LightClientUpdate cases as a mainnet answer, both
/// ways (choice: `way | network << 1`, mainnet being the first).
fn light_client(seeds: &mut Seeds, ssz_dir: &Path) {
    for fork in Fork::all() {
        for (case, json) in cases(ssz_dir, fork, "LightClientUpdate").into_iter().enumerate() {
            let answer = format!("[{{\"version\":\"{}\",\"data\":{json}}}]", fork.name());
            let name = format!("{}-{case}", fork.name());
            seeds.write("transcode_light_client", &format!("{name}-json"), &[0], answer.as_bytes());
            if let Ok(ssz) = light_client_updates_to_ssz(answer.as_bytes(), BeaconNetwork::Mainnet) {
                seeds.write("transcode_light_client", &format!("{name}-ssz"), &[1], &ssz);
            }
        }
    }
}

fn main() {
    let dir = PathBuf::from(std::env::args().nth(1).expect("usage: fuzz_seeds <corpus dir>"));
    let mut seeds = Seeds { dir, written: 0 };
    let ssz_dir = corpus::dir().join("ssz");
    jsonrpc(&mut seeds);
    let jsonrpc_seeds = seeds.written;
    beacon(&mut seeds, &ssz_dir);
    let beacon_seeds = seeds.written - jsonrpc_seeds;
    light_client(&mut seeds, &ssz_dir);
    let light_client_seeds = seeds.written - jsonrpc_seeds - beacon_seeds;
    println!(
        "fuzz seeds from {}: transcode_jsonrpc {jsonrpc_seeds}, transcode_beacon {beacon_seeds}, transcode_light_client {light_client_seeds}",
        corpus::dir().display()
    );
}
