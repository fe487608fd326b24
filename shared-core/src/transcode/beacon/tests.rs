//! The Beacon-API transcoder against the consensus-spec-tests' ssz_static vectors in
//! ../shared/corpus/ssz: each case's value, written as Beacon-API JSON, transcodes to exactly its
//! serialized bytes and back, and those bytes' hash_tree_root (by the type as described here, so
//! that a wrong limit shows) equals roots.yaml's. And the real blinded block gives its
//! `.computed.ssz`. The replay upstream's reader turns a case's value.yaml into Beacon-API JSON.

use std::path::{Path, PathBuf};

use rpcedge_corpus::beacon::{ssz_static_case, REAL_BLINDED_BLOCK_ROOT};
use sha2::{Digest, Sha256};

use super::ssz_type::{to_json, to_ssz, Ty};
use super::types::*;
use super::*;

fn corpus() -> PathBuf {
    std::env::var_os("RPCEDGE_CORPUS")
        .map(|rpc| PathBuf::from(rpc).join(".."))
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/corpus"))
}

/// The spec's name of each type described here, by fork: phase0 to capella's vectors in the
/// corpus are of the blocks, states and payloads only.
fn named_types(fork: Fork) -> Vec<(&'static str, &'static Ty)> {
    let object = |object: BeaconObject| object.ty(fork).unwrap();
    let mut types: Vec<(&str, &Ty)> =
        vec![("SignedBeaconBlock", object(BeaconObject::Block)), ("BeaconState", object(BeaconObject::State))];
    match fork {
        Fork::Phase0 => types.push(("BeaconBlockBody", &PHASE0_BEACON_BLOCK_BODY)),
        Fork::Altair => types.push(("BeaconBlockBody", &ALTAIR_BEACON_BLOCK_BODY)),
        Fork::Bellatrix => types.extend([
            ("BeaconBlockBody", &BELLATRIX_BEACON_BLOCK_BODY),
            ("ExecutionPayload", &BELLATRIX_EXECUTION_PAYLOAD),
            ("ExecutionPayloadHeader", &BELLATRIX_EXECUTION_PAYLOAD_HEADER),
        ]),
        Fork::Capella => types.extend([
            ("BeaconBlockBody", &CAPELLA_BEACON_BLOCK_BODY),
            ("ExecutionPayload", &CAPELLA_EXECUTION_PAYLOAD),
            ("ExecutionPayloadHeader", &CAPELLA_EXECUTION_PAYLOAD_HEADER),
        ]),
        Fork::Deneb | Fork::Electra | Fork::Fulu => types.extend([
            ("Fork", &FORK),
            ("Checkpoint", &CHECKPOINT),
            ("Eth1Data", &ETH1_DATA),
            ("BeaconBlockHeader", &BEACON_BLOCK_HEADER),
            ("SignedBeaconBlockHeader", &SIGNED_BEACON_BLOCK_HEADER),
            ("ProposerSlashing", &PROPOSER_SLASHING),
            ("AttestationData", &ATTESTATION_DATA),
            ("DepositData", &DEPOSIT_DATA),
            ("Deposit", &DEPOSIT),
            ("VoluntaryExit", &VOLUNTARY_EXIT),
            ("SignedVoluntaryExit", &SIGNED_VOLUNTARY_EXIT),
            ("SyncAggregate", &SYNC_AGGREGATE),
            ("Withdrawal", &WITHDRAWAL),
            ("BLSToExecutionChange", &BLS_TO_EXECUTION_CHANGE),
            ("SignedBLSToExecutionChange", &SIGNED_BLS_TO_EXECUTION_CHANGE),
            ("ExecutionPayload", &EXECUTION_PAYLOAD),
            ("ExecutionPayloadHeader", &EXECUTION_PAYLOAD_HEADER),
            ("Validator", &VALIDATOR),
            ("SyncCommittee", &SYNC_COMMITTEE),
            ("HistoricalSummary", &HISTORICAL_SUMMARY),
        ]),
    }
    if let Ok(light_client) = light_client(fork) {
        let header: &Ty = match fork {
            Fork::Altair | Fork::Bellatrix => &ALTAIR_LIGHT_CLIENT_HEADER,
            Fork::Capella => &CAPELLA_LIGHT_CLIENT_HEADER,
            _ => &DENEB_LIGHT_CLIENT_HEADER,
        };
        types.extend([
            ("LightClientHeader", header),
            ("LightClientBootstrap", &light_client[0]),
            ("LightClientUpdate", &light_client[1]),
            ("LightClientFinalityUpdate", &light_client[2]),
            ("LightClientOptimisticUpdate", &light_client[3]),
        ]);
    }
    match fork {
        Fork::Deneb => types.extend([
            ("BlobSidecar", &BLOB_SIDECAR),
            ("IndexedAttestation", &INDEXED_ATTESTATION),
            ("AttesterSlashing", &ATTESTER_SLASHING),
            ("Attestation", &ATTESTATION),
            ("BeaconBlockBody", &DENEB_BEACON_BLOCK_BODY),
        ]),
        Fork::Electra | Fork::Fulu => {
            types.push(match fork {
                Fork::Electra => ("BlobSidecar", &BLOB_SIDECAR),
                _ => ("DataColumnSidecar", &DATA_COLUMN_SIDECAR),
            });
            types.extend([
                ("IndexedAttestation", &ELECTRA_INDEXED_ATTESTATION),
                ("AttesterSlashing", &ELECTRA_ATTESTER_SLASHING),
                ("Attestation", &ELECTRA_ATTESTATION),
                ("BeaconBlockBody", &ELECTRA_BEACON_BLOCK_BODY),
                ("DepositRequest", &DEPOSIT_REQUEST),
                ("WithdrawalRequest", &WITHDRAWAL_REQUEST),
                ("ConsolidationRequest", &CONSOLIDATION_REQUEST),
                ("ExecutionRequests", &EXECUTION_REQUESTS),
                ("PendingDeposit", &PENDING_DEPOSIT),
                ("PendingPartialWithdrawal", &PENDING_PARTIAL_WITHDRAWAL),
                ("PendingConsolidation", &PENDING_CONSOLIDATION),
            ]);
        }
        _ => {}
    }
    types
}

fn hash(a: &[u8], b: &[u8]) -> [u8; 32] {
    Sha256::new().chain_update(a).chain_update(b).finalize().into()
}

/// The root of `chunks` padded with zero chunks to `limit` (a power of two at least).
fn merkleize(mut chunks: Vec<[u8; 32]>, limit: u64) -> [u8; 32] {
    let depth = limit.max(1).next_power_of_two().trailing_zeros();
    let mut zero = [0u8; 32];
    for _ in 0..depth {
        if chunks.len() % 2 == 1 {
            chunks.push(zero);
        }
        chunks = chunks.chunks(2).map(|pair| hash(&pair[0], &pair[1])).collect();
        zero = hash(&zero, &zero);
    }
    chunks.first().copied().unwrap_or(zero)
}

fn pack(bytes: &[u8]) -> Vec<[u8; 32]> {
    bytes.chunks(32).map(|chunk| {
        let mut padded = [0u8; 32];
        padded[..chunk.len()].copy_from_slice(chunk);
        padded
    }).collect()
}

fn mix_in_length(root: [u8; 32], length: usize) -> [u8; 32] {
    let mut length_chunk = [0u8; 32];
    length_chunk[..8].copy_from_slice(&(length as u64).to_le_bytes());
    hash(&root, &length_chunk)
}

fn is_basic(ty: &Ty) -> bool {
    matches!(ty, Ty::Uint(_) | Ty::Bool)
}

/// The elements of a valid serialized list or vector of `element`.
fn elements<'a>(element: &Ty, ssz: &'a [u8]) -> Vec<&'a [u8]> {
    match element.fixed_size() {
        Some(size) => ssz.chunks_exact(size).collect(),
        None if ssz.is_empty() => Vec::new(),
        None => {
            let offsets: Vec<usize> = (0..read_u32(ssz, 0) / 4).map(|i| read_u32(ssz, i * 4)).chain([ssz.len()]).collect();
            offsets.windows(2).map(|pair| &ssz[pair[0]..pair[1]]).collect()
        }
    }
}

fn read_u32(ssz: &[u8], at: usize) -> usize {
    u32::from_le_bytes(ssz[at..at + 4].try_into().unwrap()) as usize
}

fn hash_tree_root(ty: &Ty, ssz: &[u8]) -> [u8; 32] {
    match *ty {
        Ty::Uint(_) | Ty::Bool | Ty::Bytes(_) | Ty::Bitvector(_) => {
            merkleize(pack(ssz), ssz.len().div_ceil(32) as u64)
        }
        Ty::ByteList(max) => mix_in_length(merkleize(pack(ssz), max.div_ceil(32)), ssz.len()),
        Ty::Bitlist(max) => {
            let last = *ssz.last().unwrap();
            let bits = (ssz.len() - 1) * 8 + (7 - last.leading_zeros() as usize);
            let mut bytes = ssz.to_vec();
            *bytes.last_mut().unwrap() ^= 1 << (bits % 8);
            bytes.truncate(bits.div_ceil(8));
            mix_in_length(merkleize(pack(&bytes), max.div_ceil(256)), bits)
        }
        Ty::Vector(element, _) if is_basic(element) => merkleize(pack(ssz), ssz.len().div_ceil(32) as u64),
        Ty::List(element, max) if is_basic(element) => {
            let size = element.fixed_size().unwrap();
            mix_in_length(merkleize(pack(ssz), (max * size as u64).div_ceil(32)), ssz.len() / size)
        }
        Ty::Vector(element, count) => merkleize(elements(element, ssz).iter().map(|e| hash_tree_root(element, e)).collect(), count as u64),
        Ty::List(element, max) => {
            let items = elements(element, ssz);
            let count = items.len();
            mix_in_length(merkleize(items.iter().map(|e| hash_tree_root(element, e)).collect(), max), count)
        }
        Ty::Container(fields) => {
            let fixed: usize = fields.iter().map(|field| field.ty.fixed_size().unwrap_or(4)).sum();
            let mut starts: Vec<usize> = Vec::new();
            let mut at = 0;
            for field in fields {
                if field.ty.fixed_size().is_none() {
                    starts.push(read_u32(ssz, at));
                }
                at += field.ty.fixed_size().unwrap_or(4);
            }
            assert!(starts.first().map_or(true, |&first| first == fixed));
            let (mut at, mut variable) = (0, 0);
            let roots = fields.iter().map(|field| match field.ty.fixed_size() {
                Some(size) => {
                    at += size;
                    hash_tree_root(&field.ty, &ssz[at - size..at])
                }
                None => {
                    let end = starts.get(variable + 1).copied().unwrap_or(ssz.len());
                    variable += 1;
                    at += 4;
                    hash_tree_root(&field.ty, &ssz[starts[variable - 1]..end])
                }
            }).collect();
            merkleize(roots, fields.len() as u64)
        }
    }
}

fn transcode_json(ty: &Ty, json: &str) -> Result<Vec<u8>, TranscodeError> {
    let mut scanner = Scanner::new(json.as_bytes());
    let mut ssz = Vec::new();
    to_ssz(ty, &mut scanner, &mut ssz)?;
    scanner.end()?;
    Ok(ssz)
}

#[test]
fn every_ssz_static_case_of_the_described_types_transcodes_exactly_both_ways() {
    let root = corpus().join("ssz/ssz_static/tests/mainnet");
    let sample = corpus().canonicalize().is_ok_and(|dir| dir.ends_with("corpus-sample"));
    let mut cases = 0;
    for fork in Fork::all() {
        for (name, ty) in named_types(fork) {
            let dir = root.join(fork.name()).join("ssz_static").join(name).join("ssz_random");
            // the repository's sample keeps a few types; the shared corpus must have them all
            if sample && !dir.exists() {
                continue;
            }
            let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
            for case in entries.flatten() {
                let case = case.path();
                let what = format!("{} {name} {}", fork.name(), case.file_name().unwrap().to_string_lossy());
                let (json, expected) = ssz_static_case(&case).unwrap();

                let ssz = transcode_json(ty, &json).unwrap_or_else(|e| panic!("{what}: {e}"));
                assert!(ssz == expected, "{what}: the SSZ differs from the spec's");

                let mut back = Vec::new();
                to_json(ty, &expected, &mut back).unwrap_or_else(|e| panic!("{what}: {e}"));
                let back: serde_json::Value = serde_json::from_slice(&back).unwrap();
                let json_value: serde_json::Value = serde_json::from_str(&json).unwrap();
                assert!(back == json_value, "{what}: the JSON differs from the value's");

                // the same members in another order (serde_json's map sorts them) give the same bytes
                let sorted = serde_json::to_string(&json_value).unwrap();
                assert!(transcode_json(ty, &sorted).unwrap() == expected, "{what}: members in another order");

                let roots = std::fs::read_to_string(case.join("roots.yaml")).unwrap();
                let want = roots.trim().strip_prefix("root: ").unwrap().trim_matches('\'');
                let got = format!("0x{}", faster_hex::hex_string(&hash_tree_root(ty, &ssz)));
                assert_eq!(got, want, "{what}: hash_tree_root");
                cases += 1;
            }
        }
    }
    eprintln!("{cases} ssz_static cases");
    let least = if sample { Fork::all().len() } else { 500 };
    assert!(cases >= least, "only {cases} cases: is the corpus there?");
}

#[test]
fn the_real_blinded_block_gives_its_computed_ssz() {
    let dir = corpus().join("ssz/real");
    let data = std::fs::read(dir.join("signed-blinded-beacon-block-deneb.json")).unwrap();
    let expected = std::fs::read(dir.join("signed-blinded-beacon-block-deneb.computed.ssz")).unwrap();
    assert!(beacon_data_to_ssz(&data, BeaconObject::BlindedBlock, Fork::Deneb).unwrap() == expected);
    let body = [&br#"{"version":"deneb","execution_optimistic":false,"finalized":true,"data":"#[..], &data, b"}"].concat();
    let result = beacon_to_ssz(&body, BeaconObject::BlindedBlock, None).unwrap();
    let envelope = BeaconSsz { ssz: expected.clone(), fork: Some(Fork::Deneb), execution_optimistic: false, finalized: Some(true) };
    assert_eq!(result, envelope);
    // and back, in the same envelope
    let envelope = BeaconEnvelope { fork: Some(Fork::Deneb), execution_optimistic: false, finalized: Some(true) };
    let rendered = beacon_from_ssz(&expected, BeaconObject::BlindedBlock, envelope).unwrap();
    let lowered: serde_json::Value = serde_json::from_str(&String::from_utf8(body.clone()).unwrap().to_lowercase()).unwrap();
    assert_eq!(serde_json::from_slice::<serde_json::Value>(&rendered).unwrap(), lowered);
    let unversioned = BeaconEnvelope { fork: None, ..envelope };
    assert_eq!(beacon_from_ssz(&expected, BeaconObject::BlindedBlock, unversioned), Err(TranscodeError::Fork));
    let mut json = Vec::new();
    beacon_data_to_json(&expected, BeaconObject::BlindedBlock, Fork::Deneb, &mut json).unwrap();
    // the same but for the hex's case: the original has a checksummed address
    let original: serde_json::Value = serde_json::from_str(&String::from_utf8(data).unwrap().to_lowercase()).unwrap();
    assert_eq!(serde_json::from_slice::<serde_json::Value>(&json).unwrap(), original);

    // the root that the replay upstream answers it by
    let Ty::Container(fields) = BeaconObject::BlindedBlock.ty(Fork::Deneb).unwrap() else { unreachable!() };
    let message = &expected[read_u32(&expected, 0)..];
    assert_eq!(format!("0x{}", faster_hex::hex_string(&hash_tree_root(&fields[0].ty, message))), REAL_BLINDED_BLOCK_ROOT);
}

fn checkpoint(json: &str) -> Result<Vec<u8>, TranscodeError> {
    transcode_json(&CHECKPOINT, json)
}

#[test]
fn members_come_in_any_order_with_whitespace_escapes_and_unknown_members() {
    let root = "0x".to_string() + &"ab".repeat(32);
    let expected = [&7u64.to_le_bytes()[..], &[0xab; 32]].concat();
    assert_eq!(checkpoint(&format!(r#"{{"epoch":"7","root":"{root}"}}"#)).unwrap(), expected);
    assert_eq!(checkpoint(&format!(r#" {{ "root" : "{}" , "extra": {{"a":[1]}}, "epoch" : 7 }} "#, root.to_uppercase().replacen("0X", "0x", 1))).unwrap(), expected);
    assert_eq!(checkpoint(&format!(r#"{{"\u0065poch":"7","root":"{root}"}}"#)).unwrap(), expected);
}

#[test]
fn json_that_does_not_fit_the_type_is_refused() {
    let root = "0x".to_string() + &"00".repeat(32);
    for bad in [
        r#"{"epoch":"7"}"#.to_string(),
        format!(r#"{{"epoch":"7","root":"{root}","epoch":"8"}}"#),
        format!(r#"{{"epoch":"18446744073709551616","root":"{root}"}}"#),
        format!(r#"{{"epoch":"-1","root":"{root}"}}"#),
        format!(r#"{{"epoch":"","root":"{root}"}}"#),
        format!(r#"{{"epoch":"7","root":"{}"}}"#, &root[..64]),
        format!(r#"{{"epoch":"7","root":"{}"}}"#, root.replacen("0x", "", 1)),
        format!(r#"{{"epoch":true,"root":"{root}"}}"#),
    ] {
        assert!(checkpoint(&bad).is_err(), "{bad}");
    }
    // bitfields: a bitlist needs its length bit, a bitvector no bits past its length
    assert!(transcode_json(&Ty::Bitlist(8), r#""0x00""#).is_err());
    assert!(transcode_json(&Ty::Bitlist(8), r#""0x0001""#).is_ok());
    assert!(transcode_json(&Ty::Bitlist(8), r#""0x0003""#).is_err());
    assert!(transcode_json(&Ty::Bitvector(4), r#""0x10""#).is_err());
    assert!(transcode_json(&Ty::List(&Ty::Uint(8), 2), r#"["1","2","3"]"#).is_err());
    assert!(transcode_json(&Ty::Vector(&Ty::Uint(8), 2), r#"["1"]"#).is_err());
    assert!(transcode_json(&Ty::Uint(1), r#""256""#).is_err());
}

#[test]
fn uint256_goes_both_ways_at_its_edges() {
    for n in ["0", "1", "18446744073709551616", "115792089237316195423570985008687907853269984665640564039457584007913129639935"] {
        let ssz = transcode_json(&Ty::Uint(32), &format!("\"{n}\"")).unwrap();
        let mut json = Vec::new();
        to_json(&Ty::Uint(32), &ssz, &mut json).unwrap();
        assert_eq!(json, format!("\"{n}\"").into_bytes());
    }
    assert_eq!(transcode_json(&Ty::Uint(32), r#""18446744073709551616""#).unwrap()[8], 1);
    assert!(transcode_json(&Ty::Uint(32), r#""115792089237316195423570985008687907853269984665640564039457584007913129639936""#).is_err());
}

#[test]
fn ssz_that_does_not_fit_the_type_is_refused() {
    let mut out = Vec::new();
    assert!(to_json(&Ty::Bool, &[2], &mut out).is_err());
    assert!(to_json(&CHECKPOINT, &[0; 39], &mut out).is_err());
    assert!(to_json(&Ty::List(&Ty::Uint(8), 1), &[0; 16], &mut out).is_err());
    assert!(to_json(&Ty::List(&Ty::Uint(8), 4), &[0; 16], &mut out).is_ok());
    assert!(to_json(&Ty::List(&Ty::Uint(8), 4), &[0; 12], &mut out).is_err());
    // a list of byte lists whose offsets go backwards or past the end
    let list = Ty::List(&Ty::ByteList(8), 4);
    assert!(to_json(&list, &[8, 0, 0, 0, 9, 0, 0, 0, 1], &mut out).is_ok());
    assert!(to_json(&list, &[8, 0, 0, 0, 7, 0, 0, 0, 1], &mut out).is_err());
    assert!(to_json(&list, &[8, 0, 0, 0, 10, 0, 0, 0, 1], &mut out).is_err());
    assert!(to_json(&list, &[6, 0, 0, 0, 0, 0], &mut out).is_err());
    // a first offset that names no element, or is not a whole offset, leaves bytes unread
    assert!(to_json(&list, &[0, 0, 0, 0, 1], &mut out).is_err());
    assert!(to_json(&list, &[2, 0, 0, 0, 1], &mut out).is_err());
}

#[test]
fn routes_name_their_objects_by_path_alone() {
    assert_eq!(BeaconObject::from_route(b"/eth/v2/beacon/blocks/head"), Some(BeaconObject::Block));
    assert_eq!(BeaconObject::from_route(b"/eth/v1/beacon/blinded_blocks/348241?x=1"), Some(BeaconObject::BlindedBlock));
    assert_eq!(BeaconObject::from_route(b"/eth/v1/beacon/blobs/0xab?versioned_hashes=0x01"), Some(BeaconObject::Blobs));
    assert_eq!(BeaconObject::from_route(b"/eth/v1/beacon/blob_sidecars/head?indices=0"), Some(BeaconObject::BlobSidecars));
    let columns = b"/eth/v1/debug/beacon/data_column_sidecars/12?indices=0,5";
    assert_eq!(BeaconObject::from_route(columns), Some(BeaconObject::DataColumnSidecars));
    let bootstrap = b"/eth/v1/beacon/light_client/bootstrap/0x50b3798189636f067c5456a93df6ea6ba4ac71c02059a81e567134378e0b11a1";
    assert_eq!(BeaconObject::from_route(bootstrap), Some(BeaconObject::LightClientBootstrap));
    let finality = b"/eth/v1/beacon/light_client/finality_update";
    assert_eq!(BeaconObject::from_route(finality), Some(BeaconObject::LightClientFinalityUpdate));
    let optimistic = b"/beacon/eth/v1/beacon/light_client/optimistic_update?x=1";
    assert_eq!(BeaconObject::from_route(optimistic), Some(BeaconObject::LightClientOptimisticUpdate));
    let updates = b"/eth/v1/beacon/light_client/updates?start_period=1&count=4";
    assert_eq!(BeaconObject::from_route(updates), Some(BeaconObject::LightClientUpdates));
    for other in [&b"/eth/v1/beacon/light_client/finality_update/1"[..], b"/eth/v1/beacon/light_client/bootstrap/"] {
        assert_eq!(BeaconObject::from_route(other), None, "{}", String::from_utf8_lossy(other));
    }
    assert_eq!(BeaconObject::from_route(b"/eth/v2/debug/beacon/states/finalized"), Some(BeaconObject::State));
    assert_eq!(BeaconObject::from_route(b"/beacon/eth/v2/debug/beacon/states/finalized"), Some(BeaconObject::State));
    for other in [&b"/eth/v2/beacon/blocks/head/attestations"[..], b"/eth/v2/beacon/blocks/", b"/eth/v1/beacon/blocks/head", b"/"] {
        assert_eq!(BeaconObject::from_route(other), None, "{}", String::from_utf8_lossy(other));
    }
}

#[test]
fn the_corpus_reader_routes_each_object_as_the_core_does() {
    assert_eq!(rpcedge_corpus::beacon::ROUTES.len(), BeaconObject::all().len(), "one route per object");
    for (route, kind) in rpcedge_corpus::beacon::ROUTES {
        let path = if route.ends_with('/') { format!("{route}head") } else { route.to_string() };
        let object = BeaconObject::from_route(path.as_bytes());
        assert_eq!(object.map(|object| format!("{object:?}")), Some(format!("{kind:?}")), "{route}");
    }
}

#[test]
fn a_light_client_object_has_a_version_and_no_chain_flags() {
    let case = corpus().join("ssz/ssz_static/tests/mainnet/electra/ssz_static/LightClientFinalityUpdate/ssz_random/case_4");
    let (data, ssz) = ssz_static_case(&case).unwrap();
    let response = format!(r#"{{"version":"electra","data":{data}}}"#);
    let object = BeaconObject::LightClientFinalityUpdate;
    let transcoded = beacon_to_ssz(response.as_bytes(), object, Some(b"electra")).unwrap();
    assert_eq!((transcoded.ssz.as_slice(), transcoded.fork), (ssz.as_slice(), Some(Fork::Electra)));
    let envelope = BeaconEnvelope { fork: Some(Fork::Electra), execution_optimistic: false, finalized: None };
    let json: serde_json::Value = serde_json::from_slice(&beacon_from_ssz(&ssz, object, envelope).unwrap()).unwrap();
    assert_eq!(json, serde_json::from_str::<serde_json::Value>(&response).unwrap());
    // deneb's branches are a level shorter: electra's update is not deneb's
    assert!(beacon_to_ssz(response.as_bytes(), object, Some(b"deneb")).is_err());
    let deneb = format!(r#"{{"version":"deneb","data":{data}}}"#);
    assert!(beacon_to_ssz(deneb.as_bytes(), object, None).is_err());
}

#[test]
fn blob_sidecars_are_a_list_of_sidecars_as_long_as_the_forks_blobs_per_block() {
    let case = corpus().join("ssz/ssz_static/tests/mainnet/deneb/ssz_static/BlobSidecar/ssz_random/case_0");
    let (sidecar, ssz) = ssz_static_case(&case).unwrap();
    let response = |fork: &str, count: usize| {
        format!(r#"{{"version":"{fork}","finalized":true,"data":[{}]}}"#, vec![sidecar.as_str(); count].join(","))
    };
    let six = beacon_to_ssz(response("deneb", 6).as_bytes(), BeaconObject::BlobSidecars, None).unwrap();
    assert_eq!((six.ssz, six.fork), (ssz.repeat(6), Some(Fork::Deneb)));
    let seven = beacon_to_ssz(response("deneb", 7).as_bytes(), BeaconObject::BlobSidecars, None);
    assert!(matches!(seven, Err(TranscodeError::Limit(_))), "{seven:?}");
    let nine = beacon_to_ssz(response("electra", 9).as_bytes(), BeaconObject::BlobSidecars, None).unwrap();
    assert_eq!(nine.ssz, ssz.repeat(9));
    let mut json = Vec::new();
    beacon_data_to_json(&nine.ssz, BeaconObject::BlobSidecars, Fork::Electra, &mut json).unwrap();
    let json: serde_json::Value = serde_json::from_slice(&json).unwrap();
    let nine_sidecars = format!("[{}]", [sidecar.as_str(); 9].join(","));
    assert_eq!(json, serde_json::from_str::<serde_json::Value>(&nine_sidecars).unwrap());
}

#[test]
fn the_version_comes_from_the_json_or_the_header_and_they_must_agree() {
    let blobs_data = format!(r#"["0x{}"]"#, "00".repeat(131072));
    let blobs = format!(r#"{{"execution_optimistic":false,"finalized":true,"data":{blobs_data}}}"#);
    let result = beacon_to_ssz(blobs.as_bytes(), BeaconObject::Blobs, None).unwrap();
    assert_eq!((result.ssz.len(), result.fork), (131072, None));

    let dir = corpus().join("ssz/real");
    let data = String::from_utf8(std::fs::read(dir.join("signed-blinded-beacon-block-deneb.json")).unwrap()).unwrap();
    let expected = std::fs::read(dir.join("signed-blinded-beacon-block-deneb.computed.ssz")).unwrap();
    let data_first = format!(r#"{{"data":{data},"version":"deneb"}}"#);
    assert_eq!(beacon_to_ssz(data_first.as_bytes(), BeaconObject::BlindedBlock, None).unwrap().ssz, expected);
    let bare = format!(r#"{{"data":{data}}}"#);
    assert_eq!(beacon_to_ssz(bare.as_bytes(), BeaconObject::BlindedBlock, Some(b"DENEB")).unwrap().ssz, expected);
    assert_eq!(beacon_to_ssz(bare.as_bytes(), BeaconObject::BlindedBlock, None), Err(TranscodeError::Fork));
    assert!(beacon_to_ssz(data_first.as_bytes(), BeaconObject::BlindedBlock, Some(b"electra")).is_err());
    let version_first = format!(r#"{{"version":"deneb","data":{data}}}"#);
    assert_eq!(beacon_to_ssz(version_first.as_bytes(), BeaconObject::BlindedBlock, Some(b"electra")), Err(TranscodeError::Fork));
    // a fork rpcedge has no types for yet, and one before blinded blocks
    for version in ["gloas", "altair"] {
        let unknown = format!(r#"{{"version":"{version}","data":{data}}}"#);
        assert_eq!(beacon_to_ssz(unknown.as_bytes(), BeaconObject::BlindedBlock, None), Err(TranscodeError::Fork));
    }
    assert_eq!(beacon_to_ssz(br#"{"code":404,"message":"not found"}"#, BeaconObject::Block, None), Err(TranscodeError::NoResult));
}

#[test]
fn fork_digests_are_the_ones_each_chain_publishes() {
    let digest = |network: BeaconNetwork, fork: Fork| network.fork_digest(fork).map(|b| format!("{b:02x}")).concat();
    // mainnet's as its clients log them (fulu's without blob parameters: see network.rs)
    let mainnet = ["b5303f2a", "afcaaba0", "4a26c58b", "bba4da96", "6a95a1a9", "ad532ceb", "82fae541"];
    for (fork, expected) in Fork::all().into_iter().zip(mainnet) {
        assert_eq!(digest(BeaconNetwork::Mainnet, fork), expected, "{fork:?}");
    }
    assert_eq!(digest(BeaconNetwork::Hoodi, Fork::Electra), "82556a32");
    assert_eq!(digest(BeaconNetwork::Holesky, Fork::Deneb), "69ae0e99");
    assert_eq!(digest(BeaconNetwork::Holesky, Fork::Electra), "019e21ad");
    assert_eq!(digest(BeaconNetwork::Sepolia, Fork::Fulu), "5cd76c52");
    // each digest names its fork on its own chain, and nothing on another
    for network in BeaconNetwork::all() {
        for fork in Fork::all() {
            assert_eq!(network.fork_of_digest(network.fork_digest(fork)), Some(fork));
            for other in BeaconNetwork::all().into_iter().filter(|&other| other != network) {
                assert_eq!(other.fork_of_digest(network.fork_digest(fork)), None, "{network:?} {fork:?} on {other:?}");
            }
        }
        assert_eq!(BeaconNetwork::from_raw(BeaconNetwork::to_raw(Some(network))), Some(network));
    }
    assert_eq!(BeaconNetwork::from_raw(0), None);
    assert_eq!(BeaconNetwork::from_raw(5), None);
}

/// The smallest LightClientUpdate case of `fork` (by its files' size, then its name): the one
/// the repository's corpus sample ships (tools/corpus_sample.py).
fn smallest_update(fork: &str) -> PathBuf {
    let cases = corpus().join(format!("ssz/ssz_static/tests/mainnet/{fork}/ssz_static/LightClientUpdate/ssz_random"));
    let size = |case: &Path| std::fs::read_dir(case).unwrap().map(|file| file.unwrap().metadata().unwrap().len()).sum::<u64>();
    let cases = std::fs::read_dir(&cases).unwrap_or_else(|error| panic!("{}: {error}", cases.display()));
    cases.map(|case| case.unwrap().path()).min_by_key(|case| (size(case), case.clone())).unwrap()
}

/// An updates answer's JSON and SSZ made from the smallest LightClientUpdate vector of each of
/// `forks`, framed here by hand with mainnet's digests.
fn updates_answer(forks: &[&str]) -> (String, Vec<u8>) {
    let mainnet_digest = |fork: &str| {
        let at = Fork::all().iter().position(|f| f.name() == fork).unwrap();
        let hex = ["b5303f2a", "afcaaba0", "4a26c58b", "bba4da96", "6a95a1a9", "ad532ceb", "82fae541"][at];
        (0..4).map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap()).collect::<Vec<u8>>()
    };
    let (mut items, mut ssz) = (Vec::new(), Vec::new());
    for fork in forks {
        let (data, update) = ssz_static_case(&smallest_update(fork)).unwrap();
        items.push(format!(r#"{{"version":"{fork}","data":{data}}}"#));
        ssz.extend_from_slice(&(4 + update.len() as u64).to_le_bytes());
        ssz.extend_from_slice(&mainnet_digest(fork));
        ssz.extend_from_slice(&update);
    }
    (format!("[{}]", items.join(",")), ssz)
}

#[test]
fn light_client_updates_are_framed_with_their_forks_digests_both_ways() {
    let (json, ssz) = updates_answer(&["altair", "bellatrix", "capella", "deneb", "electra", "fulu"]);
    let network = BeaconNetwork::Mainnet;
    assert!(light_client_updates_to_ssz(json.as_bytes(), network).unwrap() == ssz);
    let back: serde_json::Value = serde_json::from_slice(&light_client_updates_from_ssz(&ssz, network).unwrap()).unwrap();
    assert_eq!(back, serde_json::from_str::<serde_json::Value>(&json).unwrap());
    assert_eq!(light_client_updates_to_ssz(b" [ ] ", network).unwrap(), b"");
    assert_eq!(light_client_updates_from_ssz(b"", network).unwrap(), b"[]");
    // the version may follow the data
    let (one, one_ssz) = updates_answer(&["deneb"]);
    let data = &one[one.find(r#""data":"#).unwrap() + 7..one.len() - 2];
    let swapped = format!(r#"[{{"data":{data},"version":"deneb"}}]"#);
    assert!(light_client_updates_to_ssz(swapped.as_bytes(), network).unwrap() == one_ssz);
    // another chain's digests are not mainnet's: its SSZ does not read as mainnet's
    let sepolia = light_client_updates_to_ssz(one.as_bytes(), BeaconNetwork::Sepolia).unwrap();
    assert_eq!(sepolia[12..], one_ssz[12..]);
    assert_eq!(light_client_updates_from_ssz(&sepolia, network), Err(TranscodeError::Fork));
}

#[test]
fn light_client_updates_that_do_not_fit_are_refused() {
    let network = BeaconNetwork::Mainnet;
    let (one, ssz) = updates_answer(&["electra"]);
    let data = &one[one.find(r#""data":"#).unwrap() + 7..one.len() - 2];
    for json in [
        format!(r#"[{{"version":"phase0","data":{data}}}]"#),
        format!(r#"[{{"version":"gloas","data":{data}}}]"#),
        format!(r#"[{{"data":{data}}}]"#),
        // deneb's branches are a level shorter
        format!(r#"[{{"version":"deneb","data":{data}}}]"#),
        format!(r#"[{{"version":"electra","data":{data},"data":{data}}}]"#),
        format!(r#"{{"version":"electra","data":{data}}}"#),
        format!("[{}]", vec![one[1..one.len() - 1].to_string(); 129].join(",")),
    ] {
        assert!(light_client_updates_to_ssz(json.as_bytes(), network).is_err(), "{}", &json[..json.len().min(60)]);
    }
    assert!(light_client_updates_to_ssz(format!("[{}]", vec![&one[1..one.len() - 1]; 128].join(",")).as_bytes(), network).is_ok());
    let with_length = |length: u64| [&length.to_le_bytes()[..], &ssz[8..]].concat();
    for bad in [with_length(3), with_length(ssz.len() as u64 - 7), with_length(ssz.len() as u64 - 9), ssz[..7].to_vec(), ssz[..ssz.len() - 1].to_vec()] {
        assert!(light_client_updates_from_ssz(&bad, network).is_err());
    }
    assert!(matches!(light_client_updates_from_ssz(&ssz.repeat(129), network), Err(TranscodeError::Limit(_))));
}
