//! Beacon-API objects as SSZ: the routes that the Beacon-API lets answer in SSZ, each object's
//! type by consensus version, and the JSON envelope (`version`, `execution_optimistic`,
//! `finalized`, `data`) around it. The SSZ body is the `data` alone, as the Beacon-API sends it;
//! the version goes in `Eth-Consensus-Version`.

mod network;
mod ssz_type;
mod types;
mod updates;

use super::json::Scanner;
use super::TranscodeError;
use ssz_type::Ty;

pub use network::BeaconNetwork;
pub use updates::{light_client_updates_from_ssz, light_client_updates_to_ssz};

/// The Beacon-API's header for a response's consensus version.
pub const CONSENSUS_VERSION_HEADER: &str = "Eth-Consensus-Version";
/// The headers in which a node's SSZ answer says what the JSON envelope's `execution_optimistic`
/// and `finalized` say (Lodestar's names; rpcedge sends them on the SSZ it transcodes).
pub const EXECUTION_OPTIMISTIC_HEADER: &str = "Eth-Execution-Optimistic";
pub const FINALIZED_HEADER: &str = "Eth-Consensus-Finalized";

/// A consensus version (fork) whose types rpcedge knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fork {
    Phase0,
    Altair,
    Bellatrix,
    Capella,
    Deneb,
    Electra,
    Fulu,
}

impl Fork {
    pub fn all() -> [Fork; 7] {
        [Fork::Phase0, Fork::Altair, Fork::Bellatrix, Fork::Capella, Fork::Deneb, Fork::Electra, Fork::Fulu]
    }

    /// The fork a version string names (as `Eth-Consensus-Version` or `version` give it).
    pub fn from_name(name: &[u8]) -> Option<Fork> {
        Fork::all().into_iter().find(|fork| fork.name().as_bytes().eq_ignore_ascii_case(name.trim_ascii()))
    }

    pub fn name(self) -> &'static str {
        match self {
            Fork::Phase0 => "phase0",
            Fork::Altair => "altair",
            Fork::Bellatrix => "bellatrix",
            Fork::Capella => "capella",
            Fork::Deneb => "deneb",
            Fork::Electra => "electra",
            Fork::Fulu => "fulu",
        }
    }
}

/// An object that a Beacon-API GET route answers with, in JSON or SSZ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BeaconObject {
    /// `/eth/v2/beacon/blocks/{block_id}`: a `SignedBeaconBlock`.
    Block,
    /// `/eth/v1/beacon/blinded_blocks/{block_id}`: a `SignedBlindedBeaconBlock`.
    BlindedBlock,
    /// `/eth/v1/beacon/blobs/{block_id}`: `List[Blob, MAX_BLOB_COMMITMENTS_PER_BLOCK]`.
    Blobs,
    /// `/eth/v1/beacon/blob_sidecars/{block_id}`: `List[BlobSidecar, MAX_BLOBS_PER_BLOCK]`. Gone
    /// from the spec for getBlobs, but what OP-stack derivation (op-node, kona) still reads.
    BlobSidecars,
    /// `/eth/v1/debug/beacon/data_column_sidecars/{block_id}`: `List[DataColumnSidecar,
    /// NUMBER_OF_COLUMNS]` (fulu on).
    DataColumnSidecars,
    /// `/eth/v2/debug/beacon/states/{state_id}`: a `BeaconState`.
    State,
    /// `/eth/v1/beacon/light_client/bootstrap/{block_root}`: a `LightClientBootstrap`.
    LightClientBootstrap,
    /// `/eth/v1/beacon/light_client/finality_update`: a `LightClientFinalityUpdate`.
    LightClientFinalityUpdate,
    /// `/eth/v1/beacon/light_client/optimistic_update`: a `LightClientOptimisticUpdate`.
    LightClientOptimisticUpdate,
    /// `/eth/v1/beacon/light_client/updates`: `LightClientUpdate`s, each framed with its fork's
    /// digest (see [`light_client_updates_to_ssz`]).
    LightClientUpdates,
}

/// Each route's path: before its last segment, the object's id, where it ends with a slash; the
/// whole path where it does not.
const ROUTES: [(&str, BeaconObject); 10] = [
    ("/eth/v2/beacon/blocks/", BeaconObject::Block),
    ("/eth/v1/beacon/blinded_blocks/", BeaconObject::BlindedBlock),
    ("/eth/v1/beacon/blobs/", BeaconObject::Blobs),
    ("/eth/v1/beacon/blob_sidecars/", BeaconObject::BlobSidecars),
    ("/eth/v1/debug/beacon/data_column_sidecars/", BeaconObject::DataColumnSidecars),
    ("/eth/v2/debug/beacon/states/", BeaconObject::State),
    ("/eth/v1/beacon/light_client/bootstrap/", BeaconObject::LightClientBootstrap),
    ("/eth/v1/beacon/light_client/finality_update", BeaconObject::LightClientFinalityUpdate),
    ("/eth/v1/beacon/light_client/optimistic_update", BeaconObject::LightClientOptimisticUpdate),
    ("/eth/v1/beacon/light_client/updates", BeaconObject::LightClientUpdates),
];

/// The blobs route's list of blobs.
const BLOBS: Ty = Ty::List(&types::BLOB, types::MAX_BLOB_COMMITMENTS_PER_BLOCK);

/// The blob sidecars route's list, by `MAX_BLOBS_PER_BLOCK` (deneb's, electra's); fulu's count
/// is set per blob-parameter-only fork, so its list is bounded by the commitments a block can
/// carry.
const DENEB_BLOB_SIDECARS: Ty = Ty::List(&types::BLOB_SIDECAR, 6);
const ELECTRA_BLOB_SIDECARS: Ty = Ty::List(&types::BLOB_SIDECAR, 9);
const FULU_BLOB_SIDECARS: Ty = Ty::List(&types::BLOB_SIDECAR, types::MAX_BLOB_COMMITMENTS_PER_BLOCK);

/// The data column sidecars route's list: `NUMBER_OF_COLUMNS`.
const DATA_COLUMN_SIDECARS: Ty = Ty::List(&types::DATA_COLUMN_SIDECAR, 128);

/// Whether `path` (with or without its query) is a Beacon-API route, of any object: `/eth/v<N>/`,
/// after any prefix that the proxy strips.
pub fn is_beacon_api_path(path: &[u8]) -> bool {
    let path = path.split(|&b| b == b'?').next().unwrap_or_default();
    memchr::memmem::find_iter(path, b"/eth/v").any(|at| {
        let version = &path[at + b"/eth/v".len()..];
        let digits = version.iter().take_while(|b| b.is_ascii_digit()).count();
        digits > 0 && version.get(digits) == Some(&b'/')
    })
}

impl BeaconObject {
    /// Every object, in the order of their routes.
    pub fn all() -> [BeaconObject; 10] {
        ROUTES.map(|(_, object)| object)
    }

    /// The object a GET of `path` (with or without its query) answers with. The route may follow
    /// a prefix that the proxy strips (`location /beacon/ { proxy_pass http://node/; }`).
    pub fn from_route(path: &[u8]) -> Option<BeaconObject> {
        let path = path.split(|&b| b == b'?').next().unwrap_or_default();
        ROUTES.iter().find_map(|(route, object)| {
            let at = memchr::memmem::rfind(path, route.as_bytes())?;
            let id = &path[at + route.len()..];
            let fits = match route.ends_with('/') {
                true => !id.is_empty() && !id.contains(&b'/'),
                false => id.is_empty(),
            };
            fits.then_some(*object)
        })
    }

    /// Whether its JSON envelope has `execution_optimistic` and `finalized` (the light client's
    /// has `version` and `data` only, and its updates no envelope at all).
    pub fn has_chain_flags(self) -> bool {
        !matches!(
            self,
            BeaconObject::LightClientBootstrap
                | BeaconObject::LightClientFinalityUpdate
                | BeaconObject::LightClientOptimisticUpdate
                | BeaconObject::LightClientUpdates
        )
    }

    /// Whether its type depends on the consensus version.
    fn versioned(self) -> bool {
        self != BeaconObject::Blobs
    }

    /// Its type in `fork`, if the fork has it (blinded blocks came with bellatrix, blob sidecars
    /// with deneb); for the updates route, one update's.
    fn ty(self, fork: Fork) -> Result<&'static Ty, TranscodeError> {
        use types::*;
        use Fork::*;
        Ok(match (self, fork) {
            (BeaconObject::Block, Phase0) => &PHASE0_SIGNED_BEACON_BLOCK,
            (BeaconObject::Block, Altair) => &ALTAIR_SIGNED_BEACON_BLOCK,
            (BeaconObject::Block, Bellatrix) => &BELLATRIX_SIGNED_BEACON_BLOCK,
            (BeaconObject::Block, Capella) => &CAPELLA_SIGNED_BEACON_BLOCK,
            (BeaconObject::Block, Deneb) => &DENEB_SIGNED_BEACON_BLOCK,
            (BeaconObject::Block, Electra | Fulu) => &ELECTRA_SIGNED_BEACON_BLOCK,
            (BeaconObject::BlindedBlock, Phase0 | Altair) => return Err(TranscodeError::Fork),
            (BeaconObject::BlindedBlock, Bellatrix) => &BELLATRIX_SIGNED_BLINDED_BEACON_BLOCK,
            (BeaconObject::BlindedBlock, Capella) => &CAPELLA_SIGNED_BLINDED_BEACON_BLOCK,
            (BeaconObject::BlindedBlock, Deneb) => &DENEB_SIGNED_BLINDED_BEACON_BLOCK,
            (BeaconObject::BlindedBlock, Electra | Fulu) => &ELECTRA_SIGNED_BLINDED_BEACON_BLOCK,
            (BeaconObject::Blobs, _) => &BLOBS,
            (BeaconObject::BlobSidecars, Phase0 | Altair | Bellatrix | Capella) => return Err(TranscodeError::Fork),
            (BeaconObject::BlobSidecars, Deneb) => &DENEB_BLOB_SIDECARS,
            (BeaconObject::BlobSidecars, Electra) => &ELECTRA_BLOB_SIDECARS,
            (BeaconObject::BlobSidecars, Fulu) => &FULU_BLOB_SIDECARS,
            (BeaconObject::DataColumnSidecars, Fulu) => &DATA_COLUMN_SIDECARS,
            (BeaconObject::DataColumnSidecars, _) => return Err(TranscodeError::Fork),
            (BeaconObject::State, Phase0) => &PHASE0_BEACON_STATE,
            (BeaconObject::State, Altair) => &ALTAIR_BEACON_STATE,
            (BeaconObject::State, Bellatrix) => &BELLATRIX_BEACON_STATE,
            (BeaconObject::State, Capella) => &CAPELLA_BEACON_STATE,
            (BeaconObject::State, Deneb) => &DENEB_BEACON_STATE,
            (BeaconObject::State, Electra) => &ELECTRA_BEACON_STATE,
            (BeaconObject::State, Fulu) => &FULU_BEACON_STATE,
            (BeaconObject::LightClientBootstrap, _) => &light_client(fork)?[0],
            (BeaconObject::LightClientFinalityUpdate, _) => &light_client(fork)?[2],
            (BeaconObject::LightClientOptimisticUpdate, _) => &light_client(fork)?[3],
            (BeaconObject::LightClientUpdates, _) => &light_client(fork)?[1],
        })
    }
}

/// The light client's objects in `fork` (from altair).
fn light_client(fork: Fork) -> Result<&'static types::LightClient, TranscodeError> {
    use types::*;
    match fork {
        Fork::Phase0 => Err(TranscodeError::Fork),
        Fork::Altair | Fork::Bellatrix => Ok(&ALTAIR_LIGHT_CLIENT),
        Fork::Capella => Ok(&CAPELLA_LIGHT_CLIENT),
        Fork::Deneb => Ok(&DENEB_LIGHT_CLIENT),
        Fork::Electra | Fork::Fulu => Ok(&ELECTRA_LIGHT_CLIENT),
    }
}

/// A Beacon-API response's data as SSZ, with its consensus version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BeaconSsz {
    pub ssz: Vec<u8>,
    /// For `Eth-Consensus-Version`; `None` for an object whose type has no version.
    pub fork: Option<Fork>,
    /// The envelope's `execution_optimistic` (absent: false, as the Beacon-API says).
    pub execution_optimistic: bool,
    /// The envelope's `finalized`, where it has one.
    pub finalized: Option<bool>,
}

/// A Beacon-API JSON response `body` carrying `object`, with its data as SSZ. The version is the
/// JSON's `version`, or `header` (the response's `Eth-Consensus-Version`) where the JSON has none;
/// the two must agree.
pub fn beacon_to_ssz(body: &[u8], object: BeaconObject, header: Option<&[u8]>) -> Result<BeaconSsz, TranscodeError> {
    let unknown = TranscodeError::Fork;
    let mut fork = match header {
        Some(name) if object.versioned() => Some(Fork::from_name(name).ok_or(unknown.clone())?),
        _ => None,
    };
    let mut json = Scanner::new(body);
    let (mut ssz, mut deferred) = (None, None);
    let (mut execution_optimistic, mut finalized) = (false, None);
    json.object(|json, key| {
        match key {
            b"execution_optimistic" => execution_optimistic = json.boolean()?,
            b"finalized" => finalized = Some(json.boolean()?),
            b"version" if object.versioned() => {
                let named = Fork::from_name(&json.string()?).ok_or(TranscodeError::Fork)?;
                if fork.is_some_and(|fork| fork != named) {
                    return Err(TranscodeError::Fork);
                }
                fork = Some(named);
            }
            b"data" if ssz.is_some() || deferred.is_some() => return Err(json.error("one data member")),
            b"data" => match fork {
                Some(fork) => ssz = Some(data_to_ssz(json, object.ty(fork)?)?),
                // no version yet: take the data once it is known
                None if object.versioned() => deferred = Some(json.value()?),
                None => ssz = Some(data_to_ssz(json, object.ty(Fork::Deneb)?)?),
            },
            _ => {
                json.value()?;
            }
        }
        Ok(())
    })?;
    json.end()?;
    let ssz = match (ssz, deferred, fork) {
        (Some(ssz), ..) => ssz,
        (None, Some(data), Some(fork)) => {
            let mut json = Scanner::new(data);
            data_to_ssz(&mut json, object.ty(fork)?)?
        }
        (None, Some(_), None) => return Err(unknown),
        (None, None, _) => return Err(TranscodeError::NoResult),
    };
    Ok(BeaconSsz { ssz, fork: fork.filter(|_| object.versioned()), execution_optimistic, finalized })
}

fn data_to_ssz(json: &mut Scanner, ty: &Ty) -> Result<Vec<u8>, TranscodeError> {
    // hex is most of it, and halves: room enough to write without growing, in most cases
    let mut out = Vec::with_capacity(json.remaining() / 2);
    ssz_type::to_ssz(ty, json, &mut out)?;
    Ok(out)
}

/// The SSZ of `object` (of `fork`, for a versioned one) as its Beacon-API JSON, appended to `out`:
/// the `data` member's value.
pub fn beacon_data_to_json(ssz: &[u8], object: BeaconObject, fork: Fork, out: &mut Vec<u8>) -> Result<(), TranscodeError> {
    out.reserve(ssz.len() * 2 + 64);
    ssz_type::to_json(object.ty(fork)?, ssz, out)
}

/// What a Beacon-API JSON envelope says beside its `data`; an SSZ answer says it in headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BeaconEnvelope {
    /// `version` (`Eth-Consensus-Version`); needed for a versioned object.
    pub fork: Option<Fork>,
    pub execution_optimistic: bool,
    /// `None`: left out, which the Beacon-API reads as "not known without more calls".
    pub finalized: Option<bool>,
}

/// A Beacon-API SSZ answer carrying `object` as its JSON response, in `envelope`.
pub fn beacon_from_ssz(ssz: &[u8], object: BeaconObject, envelope: BeaconEnvelope) -> Result<Vec<u8>, TranscodeError> {
    let fork = match envelope.fork {
        Some(fork) => fork,
        None if object.versioned() => return Err(TranscodeError::Fork),
        // the type does not depend on it
        None => Fork::Deneb,
    };
    let mut out = Vec::with_capacity(ssz.len() * 2 + 128);
    out.push(b'{');
    if object.versioned() {
        out.extend_from_slice(b"\"version\":\"");
        out.extend_from_slice(fork.name().as_bytes());
        out.extend_from_slice(b"\",");
    }
    if object.has_chain_flags() {
        let flag = |value: bool| if value { &b"true"[..] } else { b"false" };
        out.extend_from_slice(b"\"execution_optimistic\":");
        out.extend_from_slice(flag(envelope.execution_optimistic));
        if let Some(finalized) = envelope.finalized {
            out.extend_from_slice(b",\"finalized\":");
            out.extend_from_slice(flag(finalized));
        }
        out.push(b',');
    }
    out.extend_from_slice(b"\"data\":");
    ssz_type::to_json(object.ty(fork)?, ssz, &mut out)?;
    out.push(b'}');
    Ok(out)
}

/// The Beacon-API JSON `data` of `object` as SSZ (`beacon_data_to_json`'s inverse).
pub fn beacon_data_to_ssz(json: &[u8], object: BeaconObject, fork: Fork) -> Result<Vec<u8>, TranscodeError> {
    let mut json = Scanner::new(json);
    let ssz = data_to_ssz(&mut json, object.ty(fork)?)?;
    json.end()?;
    Ok(ssz)
}

#[cfg(test)]
mod tests;
