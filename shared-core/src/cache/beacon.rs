//! Beacon-API reads the store may answer: a block, a blinded block, a block's blobs or blob sidecars, by block
//! root once the node calls the block finalized (without expiry), or by slot once the daemon has
//! heard from its beacon node that the slot is finalized. `head`, `justified`, `finalized` and
//! `genesis` move (or are not worth a rule), and states are hundreds of MB: never stored.
//!
//! An entry holds the object once, as SSZ (the smaller form), with what the JSON envelope says
//! beside it (`version`, `execution_optimistic`, `finalized`) as the SSZ answer's headers: a JSON
//! client and an SSZ client share it, and a JSON hit is rendered by the transcoder.

use sha2::{Digest, Sha256};

use super::head::{named, Head};
use super::hit::hit_headers;
use super::{Bypass, Capture, Entry, Envelope, Final, HitResponse, Key, MinLengths, Refusal};
use crate::compress::{auto_level, compress_whole};
use crate::negotiate::{media_type, Accept, Coding, MediaType};
use crate::transcode::{
    beacon_data_to_json, beacon_from_ssz, beacon_to_ssz, BeaconEnvelope, BeaconObject, Fork, CONSENSUS_VERSION_HEADER,
    EXECUTION_OPTIMISTIC_HEADER, FINALIZED_HEADER,
};

const SSZ: &str = "application/octet-stream";
const JSON: &str = "application/json";

/// A Beacon-API read the store may answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Read {
    pub key: Key,
    object: BeaconObject,
    block: BlockId,
    /// The client takes SSZ before JSON.
    ssz: bool,
}

/// How the path names the block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BlockId {
    Root,
    Slot(u64),
}

/// What the node's answer head says, read at the head for its body's capture.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Answered {
    ssz: bool,
    version: Option<Vec<u8>>,
    execution_optimistic: Option<bool>,
    finalized: Option<bool>,
}

impl Answered {
    /// From the node's response headers, as (name, value) pairs.
    pub fn of<N: AsRef<[u8]>, V: AsRef<[u8]>>(headers: &[(N, V)]) -> Answered {
        let first = |name: &'static str| named(headers, name).next().map(<[u8]>::trim_ascii);
        let flag = |name: &'static str| match first(name)? {
            value if value.eq_ignore_ascii_case(b"true") => Some(true),
            value if value.eq_ignore_ascii_case(b"false") => Some(false),
            _ => None,
        };
        Answered {
            ssz: first("content-type").is_some_and(|value| media_type(value).eq_ignore_ascii_case(SSZ.as_bytes())),
            version: first(CONSENSUS_VERSION_HEADER).map(<[u8]>::to_vec),
            execution_optimistic: flag(EXECUTION_OPTIMISTIC_HEADER),
            finalized: flag(FINALIZED_HEADER),
        }
    }
}

/// Whether the store may answer a GET of `path` (with its query, as the client sent it) in
/// `namespace`, for a client whose Accept is `accept`, and under which key. The key covers the
/// path and query byte for byte: what the node reads, whatever it makes of a prefix or a
/// parameter; a client that spells them otherwise gets an entry of its own.
pub(super) fn read(namespace: &str, path: &[u8], accept: &Accept) -> Result<Read, Bypass> {
    // a block's data, which no longer changes once the block is final; not states (hundreds of
    // MB) nor the light client's objects (which follow the head, or carry no `finalized`)
    let kept = |object: &BeaconObject| {
        use BeaconObject::*;
        matches!(object, Block | BlindedBlock | Blobs | BlobSidecars)
    };
    let object = BeaconObject::from_route(path).filter(kept).ok_or(Bypass::Route)?;
    let ssz = match accept.choose() {
        Some(MediaType::Ssz(_)) => true,
        Some(MediaType::Json) => false,
        // the node answers 406
        None => return Err(Bypass::Route),
    };
    let id = path.split(|&b| b == b'?').next().unwrap_or_default().rsplit(|&b| b == b'/').next().unwrap_or_default();
    let block = match id {
        b"head" | b"genesis" | b"finalized" | b"justified" => return Err(Bypass::Moving),
        id if id.len() == 66 && id.starts_with(b"0x") && id[2..].iter().all(u8::is_ascii_hexdigit) => BlockId::Root,
        id if (1..=20).contains(&id.len()) && id.iter().all(u8::is_ascii_digit) => {
            BlockId::Slot(std::str::from_utf8(id).ok().and_then(|id| id.parse().ok()).ok_or(Bypass::Malformed)?)
        }
        _ => return Err(Bypass::Malformed),
    };
    let mut digest = Sha256::new();
    for part in [namespace.as_bytes(), b"GET", path] {
        digest.update((part.len() as u64).to_le_bytes());
        digest.update(part);
    }
    Ok(Read { key: Key(digest.finalize().into()), object, block, ssz })
}

impl Read {
    /// What to store of the node's 200 `body` (plain, JSON or SSZ as `answered` says), and the
    /// head to store it with (`head`, what a shared cache keeps of the node's, less what the SSZ
    /// form says itself), or why not: only an answer the node gives as settled, not optimistic,
    /// and by root finalized.
    pub fn capture(
        &self,
        answered: &Answered,
        head: &Head,
        body: &[u8],
        max_entry: usize,
    ) -> Result<(Capture, Head), Refusal> {
        if body.len() > max_entry {
            return Err(Refusal::TooLarge);
        }
        let versioned = !matches!(self.object, BeaconObject::Blobs);
        let (ssz, fork, execution_optimistic, finalized) = if answered.ssz {
            let fork = match &answered.version {
                Some(name) => Some(Fork::from_name(name).ok_or(Refusal::Malformed)?),
                None if versioned => return Err(Refusal::Malformed),
                None => None,
            };
            // stored only if it reads as the object: a hit may have to render it
            beacon_data_to_json(body, self.object, fork.unwrap_or(Fork::Deneb), &mut Vec::new())
                .map_err(|_| Refusal::Malformed)?;
            (body.to_vec(), fork, answered.execution_optimistic, answered.finalized)
        } else {
            let read = beacon_to_ssz(body, self.object, answered.version.as_deref()).map_err(|_| Refusal::Malformed)?;
            (read.ssz, read.fork, Some(read.execution_optimistic), read.finalized)
        };
        if execution_optimistic != Some(false) {
            return Err(Refusal::NotFinal);
        }
        let requires_final = match self.block {
            BlockId::Root if finalized == Some(true) => None,
            BlockId::Slot(slot) if finalized != Some(false) => Some(Final::Slot(slot)),
            _ => return Err(Refusal::NotFinal),
        };
        let mut headers: Vec<(String, String)> =
            head.headers.iter().filter(|(name, _)| !is_form_header(name)).cloned().collect();
        headers.push(("content-type".into(), SSZ.into()));
        if let Some(fork) = fork {
            headers.push((CONSENSUS_VERSION_HEADER.to_ascii_lowercase(), fork.name().into()));
        }
        headers.push((EXECUTION_OPTIMISTIC_HEADER.to_ascii_lowercase(), "false".into()));
        if let Some(finalized) = finalized {
            headers.push((FINALIZED_HEADER.to_ascii_lowercase(), finalized.to_string()));
        }
        // the entry serves either form: the node's Vary: Accept is answered here
        let vary = head.vary.iter().filter(|(name, _)| name != "accept").cloned().collect();
        let envelope = Envelope { before_id: Vec::new(), after_id: Vec::new() };
        let capture = Capture { key: self.key, ttl_s: None, requires_final, block_hash: None, envelope, tail: ssz };
        Ok((capture, Head { headers, vary }))
    }

    /// The hit from `entry`, in the client's form: the SSZ as stored (spliced into the first of
    /// `codings`, the client's best first, that the entry keeps a form for), or its JSON rendered
    /// from it (compressed here, in the first of them).
    pub fn hit(&self, entry: &Entry, codings: &[Coding], min: MinLengths) -> Option<HitResponse> {
        let kept = |name: &str| entry.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| *v);
        let (body, coding, content_type) = if self.ssz {
            let hit = entry.respond("", codings, min).ok()?;
            (hit.body, hit.coding, SSZ)
        } else {
            let fork = match kept(CONSENSUS_VERSION_HEADER) {
                Some(name) => Some(Fork::from_name(name.as_bytes())?),
                None => None,
            };
            let envelope = BeaconEnvelope {
                fork,
                execution_optimistic: kept(EXECUTION_OPTIMISTIC_HEADER) != Some("false"),
                finalized: kept(FINALIZED_HEADER).map(|value| value == "true"),
            };
            let json = beacon_from_ssz(&entry.plain().ok()?, self.object, envelope).ok()?;
            let coding = codings.first().copied().filter(|&coding| json.len() as u64 >= min.of(coding));
            let compressed = coding.and_then(|coding| compress_whole(coding, auto_level(coding, json.len()), &json));
            match compressed {
                Some(compressed) => (compressed, coding, JSON),
                None => (json, None, JSON),
            }
        };
        let headers = hit_headers(entry, content_type, coding, &["Accept", "Accept-Encoding"]);
        Some(HitResponse { body, coding, headers })
    }
}

/// The headers that say what the stored SSZ form is, which the entry sets itself.
fn is_form_header(name: &str) -> bool {
    [CONSENSUS_VERSION_HEADER, EXECUTION_OPTIMISTIC_HEADER, FINALIZED_HEADER, "content-type"]
        .iter()
        .any(|form| form.eq_ignore_ascii_case(name))
}
