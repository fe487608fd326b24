//! Beacon-API GET routes answered from the corpus's SSZ examples (../shared/corpus/ssz):
//!
//! - `/eth/v2/beacon/blocks/<fork>:<case>`: the ssz_static `SignedBeaconBlock` of that fork and case
//!   (`deneb:case_0`), and `/eth/v2/debug/beacon/states/<fork>:<case>` its `BeaconState`;
//! - `/eth/v1/beacon/blobs/<fork>:<case>`: the blob of that ssz_static `BlobSidecar`, as a list
//!   of one; `/eth/v1/beacon/blob_sidecars/<fork>:<case>`: the sidecar, as a list of one;
//! - `/eth/v1/debug/beacon/data_column_sidecars/<fork>:<case>`: that `DataColumnSidecar`, as a
//!   list of one;
//! - `/eth/v1/beacon/blinded_blocks/348241` (its slot) or `/<its block root>`: the real deneb
//!   blinded block;
//! - `/eth/v1/beacon/light_client/bootstrap/<fork>:<case>`, and the routes without an id
//!   `/eth/v1/beacon/light_client/finality_update?case=<fork>:<case>` and `.../optimistic_update?...`:
//!   that `LightClientBootstrap`, `LightClientFinalityUpdate` or `LightClientOptimisticUpdate`, in
//!   the light client's envelope (`version` and `data` only);
//! - `/eth/v1/beacon/light_client/updates?start_period=..&count=..&cases=<fork>:<case>,..`: those
//!   `LightClientUpdate`s, as the route's array of `{version, data}` or its SSZ chunks, each framed
//!   with its fork's digest on mainnet (the preset of the vectors).
//!
//! JSON is the Beacon-API's (integers as decimal strings) in its envelope, with
//! `Eth-Consensus-Version`; SSZ is the case's serialized bytes. Answers are built on first use
//! and kept.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use sha2::{Digest, Sha256};
use yaml_rust2::{Yaml, YamlLoader};

/// The real blinded block's slot and block root (the hash_tree_root of its message; the core's
/// tests check it).
pub const REAL_BLINDED_BLOCK_SLOT: &str = "348241";
pub const REAL_BLINDED_BLOCK_ROOT: &str = "0x50b3798189636f067c5456a93df6ea6ba4ac71c02059a81e567134378e0b11a1";

/// One object in both encodings.
pub struct BeaconAnswer {
    /// The whole JSON response: envelope and data.
    pub json: Bytes,
    pub ssz: Bytes,
    /// `None` for blobs, whose type has no version.
    pub version: Option<String>,
}

pub struct BeaconRoutes {
    dir: PathBuf,
    answers: Mutex<HashMap<String, Arc<BeaconAnswer>>>,
}

impl BeaconRoutes {
    pub fn new(dir: PathBuf) -> Self {
        BeaconRoutes { dir, answers: Mutex::default() }
    }

    /// Whether `path` is one of the routes (answered or not).
    pub fn handles(path: &str) -> bool {
        route(path).is_some()
    }

    /// The answer for `path`, or why there is none.
    pub fn answer(&self, path: &str) -> Result<Arc<BeaconAnswer>, String> {
        if let Some(answer) = self.answers.lock().expect("not poisoned").get(path) {
            return Ok(answer.clone());
        }
        let (kind, id) = route(path).ok_or("not a Beacon-API route")?;
        let answer = Arc::new(self.load(kind, id)?);
        self.answers.lock().expect("not poisoned").insert(path.to_string(), answer.clone());
        Ok(answer)
    }

    fn load(&self, kind: Kind, id: &str) -> Result<BeaconAnswer, String> {
        if kind == Kind::LightClientUpdates {
            return self.updates(id);
        }
        if kind == Kind::BlindedBlock {
            if id != REAL_BLINDED_BLOCK_SLOT && !id.eq_ignore_ascii_case(REAL_BLINDED_BLOCK_ROOT) {
                return Err(format!("no blinded block {id} (there is {REAL_BLINDED_BLOCK_SLOT}, or {REAL_BLINDED_BLOCK_ROOT})"));
            }
            let real = self.dir.join("real");
            let data = read(&real.join("signed-blinded-beacon-block-deneb.json"))?;
            let ssz = read(&real.join("signed-blinded-beacon-block-deneb.computed.ssz"))?;
            return Ok(envelope(Some("deneb"), std::str::from_utf8(&data).map_err(|e| e.to_string())?.trim(), ssz, true));
        }
        let (fork, case) = id.split_once(':').ok_or_else(|| format!("{id}: expected <fork>:<case>, like deneb:case_0"))?;
        let valid = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        if !valid(fork) || !valid(case) {
            return Err(format!("{id}: expected <fork>:<case>, like deneb:case_0"));
        }
        let type_name = match kind {
            Kind::Block => "SignedBeaconBlock",
            Kind::State => "BeaconState",
            Kind::Blobs | Kind::BlobSidecars => "BlobSidecar",
            Kind::DataColumnSidecars => "DataColumnSidecar",
            Kind::LightClientBootstrap => "LightClientBootstrap",
            Kind::LightClientFinalityUpdate => "LightClientFinalityUpdate",
            Kind::LightClientOptimisticUpdate => "LightClientOptimisticUpdate",
            Kind::BlindedBlock | Kind::LightClientUpdates => unreachable!("answered above"),
        };
        let dir = self.dir.join("ssz_static/tests/mainnet").join(fork).join("ssz_static").join(type_name).join("ssz_random").join(case);
        let (json, ssz) = ssz_static_case(&dir)?;
        match kind {
            // a list of fixed-size sidecars is their bytes one after another
            Kind::BlobSidecars => return Ok(envelope(Some(fork), &format!("[{json}]"), ssz, true)),
            // a list of one variable-size sidecar: its offset, then its bytes
            Kind::DataColumnSidecars => {
                let ssz = [&4u32.to_le_bytes()[..], &ssz].concat();
                return Ok(envelope(Some(fork), &format!("[{json}]"), ssz, true));
            }
            Kind::Blobs => {}
            Kind::LightClientBootstrap | Kind::LightClientFinalityUpdate | Kind::LightClientOptimisticUpdate => {
                return Ok(envelope(Some(fork), &json, ssz, false))
            }
            _ => return Ok(envelope(Some(fork), &json, ssz, true)),
        }
        // the sidecar's blob (its second field, after the index) as a list of one
        let blob = YamlLoader::load_from_str(&std::fs::read_to_string(dir.join("value.yaml")).map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?[0]["blob"]
            .as_str()
            .ok_or("a sidecar without a blob")?
            .to_string();
        let blob_ssz = ssz.get(8..8 + 131072).ok_or("a sidecar too short for a blob")?.to_vec();
        Ok(envelope(None, &format!("[\"{blob}\"]"), blob_ssz, true))
    }
}

impl BeaconRoutes {
    /// The updates of `cases` (`<fork>:<case>,...`).
    fn updates(&self, cases: &str) -> Result<BeaconAnswer, String> {
        let (mut items, mut ssz) = (Vec::new(), Vec::new());
        for id in cases.split(',') {
            let (fork, case) = id.split_once(':').ok_or_else(|| format!("{id}: expected <fork>:<case>, like deneb:case_0"))?;
            let digest = mainnet_fork_digest(fork).ok_or_else(|| format!("{fork}: not a fork with light client updates"))?;
            if !case.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
                return Err(format!("{id}: expected <fork>:<case>, like deneb:case_0"));
            }
            let dir = self.dir.join("ssz_static/tests/mainnet").join(fork).join("ssz_static/LightClientUpdate/ssz_random").join(case);
            let (json, update) = ssz_static_case(&dir)?;
            items.push(format!("{{\"version\":\"{fork}\",\"data\":{json}}}"));
            ssz.extend_from_slice(&(4 + update.len() as u64).to_le_bytes());
            ssz.extend_from_slice(&digest);
            ssz.extend_from_slice(&update);
        }
        let json = format!("[{}]", items.join(","));
        Ok(BeaconAnswer { json: Bytes::from(json), ssz: Bytes::from(ssz), version: None })
    }
}

/// `compute_fork_digest(fork_version, genesis_validators_root)` of a fork with light client
/// updates on mainnet, whose versions are the fork's number, then three zero bytes.
fn mainnet_fork_digest(fork: &str) -> Option<[u8; 4]> {
    const GENESIS_VALIDATORS_ROOT: [u8; 32] = [
        0x4b, 0x36, 0x3d, 0xb9, 0x4e, 0x28, 0x61, 0x20, 0xd7, 0x6e, 0xb9, 0x05, 0x34, 0x0f, 0xdd, 0x4e, 0x54, 0xbf, 0xe9,
        0xf0, 0x6b, 0xf3, 0x3f, 0xf6, 0xcf, 0x5a, 0xd2, 0x7f, 0x51, 0x1b, 0xfe, 0x95,
    ];
    let number = ["altair", "bellatrix", "capella", "deneb", "electra", "fulu"].iter().position(|&f| f == fork)? + 1;
    let mut version_chunk = [0u8; 32];
    version_chunk[0] = number as u8;
    let root = Sha256::new().chain_update(version_chunk).chain_update(GENESIS_VALIDATORS_ROOT).finalize();
    Some(root[..4].try_into().expect("four bytes"))
}

/// A Beacon-API object the corpus answers: the core's `BeaconObject`, which a test of the core
/// holds these to, by name and route (`shared-core/tests/transcode_corpus.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Block,
    BlindedBlock,
    Blobs,
    BlobSidecars,
    DataColumnSidecars,
    State,
    LightClientBootstrap,
    LightClientFinalityUpdate,
    LightClientOptimisticUpdate,
    LightClientUpdates,
}

/// Each object's route: a path, or a prefix its id follows (ending in `/`).
pub const ROUTES: [(&str, Kind); 10] = [
    ("/eth/v2/beacon/blocks/", Kind::Block),
    ("/eth/v1/beacon/blinded_blocks/", Kind::BlindedBlock),
    ("/eth/v1/beacon/blobs/", Kind::Blobs),
    ("/eth/v1/beacon/blob_sidecars/", Kind::BlobSidecars),
    ("/eth/v1/debug/beacon/data_column_sidecars/", Kind::DataColumnSidecars),
    ("/eth/v2/debug/beacon/states/", Kind::State),
    ("/eth/v1/beacon/light_client/bootstrap/", Kind::LightClientBootstrap),
    ("/eth/v1/beacon/light_client/finality_update", Kind::LightClientFinalityUpdate),
    ("/eth/v1/beacon/light_client/optimistic_update", Kind::LightClientOptimisticUpdate),
    ("/eth/v1/beacon/light_client/updates", Kind::LightClientUpdates),
];

/// The route of `target` (a path, with or without its query) and the id it names: after a
/// prefix, or in the query of a path (the corpus's own parameter, `case` or `cases`).
fn route(target: &str) -> Option<(Kind, &str)> {
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    ROUTES.into_iter().find_map(|(route, kind)| match route.strip_suffix('/') {
        Some(_) => {
            let id = path.strip_prefix(route)?;
            (!id.is_empty() && !id.contains('/')).then_some((kind, id))
        }
        None if path == route => {
            let name = if kind == Kind::LightClientUpdates { "cases=" } else { "case=" };
            Some((kind, query.split('&').find_map(|pair| pair.strip_prefix(name))?))
        }
        None => None,
    })
}

fn read(path: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))
}

/// The JSON response around `data`: with `version` where there is one, and the chain's flags but
/// for the light client's objects.
fn envelope(version: Option<&str>, data: &str, ssz: Vec<u8>, flags: bool) -> BeaconAnswer {
    let version_member = version.map(|v| format!("\"version\":\"{v}\",")).unwrap_or_default();
    let flags = if flags { "\"execution_optimistic\":false,\"finalized\":true," } else { "" };
    let json = format!("{{{version_member}{flags}\"data\":{data}}}");
    BeaconAnswer { json: Bytes::from(json), ssz: Bytes::from(ssz), version: version.map(str::to_string) }
}

/// An ssz_static case directory's value as Beacon-API JSON, and its serialized bytes
/// (`serialized.ssz_snappy` is snappy's raw block format).
pub fn ssz_static_case(dir: &Path) -> Result<(String, Vec<u8>), String> {
    let yaml = std::fs::read_to_string(dir.join("value.yaml")).map_err(|e| format!("{}: {e}", dir.display()))?;
    let docs = YamlLoader::load_from_str(&yaml).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut json = String::with_capacity(yaml.len());
    beacon_json(docs.first().ok_or("an empty value.yaml")?, &mut json)?;
    let snappy = read(&dir.join("serialized.ssz_snappy"))?;
    let ssz = snap::raw::Decoder::new().decompress_vec(&snappy).map_err(|e| format!("{}: {e}", dir.display()))?;
    Ok((json, ssz))
}

/// A value.yaml value (integers as YAML numbers) as the Beacon-API writes it: integers as
/// decimal strings, in the YAML's member order.
pub fn beacon_json(yaml: &Yaml, out: &mut String) -> Result<(), String> {
    match yaml {
        Yaml::Hash(members) => {
            out.push('{');
            for (i, (key, value)) in members.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                push_string(key.as_str().ok_or("a key that is not a string")?, out);
                out.push(':');
                beacon_json(value, out)?;
            }
            out.push('}');
        }
        Yaml::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                beacon_json(item, out)?;
            }
            out.push(']');
        }
        Yaml::Integer(n) => out.push_str(&format!("\"{n}\"")),
        // yaml-rust2 keeps an integer over i64's range as its text
        Yaml::Real(text) if text.bytes().all(|b| b.is_ascii_digit()) => out.push_str(&format!("\"{text}\"")),
        Yaml::String(text) => push_string(text, out),
        Yaml::Boolean(b) => out.push_str(if *b { "true" } else { "false" }),
        other => return Err(format!("unexpected YAML: {other:?}")),
    }
    Ok(())
}

/// Hex, decimal digits and field names: nothing to escape but quotes and backslashes.
fn push_string(text: &str, out: &mut String) {
    out.push('"');
    for c in text.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}
