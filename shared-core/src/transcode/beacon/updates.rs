//! `/eth/v1/beacon/light_client/updates`: its JSON is an array of `{version, data}`, one light
//! client update each; its SSZ a sequence of response chunks, each the little-endian u64 length
//! of what follows, then the fork digest of the update's fork on its chain (the context), then
//! the update's SSZ. Updates of different forks may come in one answer, so no
//! `Eth-Consensus-Version` says what they are.

use super::super::json::Scanner;
use super::super::TranscodeError;
use super::network::BeaconNetwork;
use super::ssz_type::{self, Ty};
use super::{light_client, Fork};

/// The most updates an answer may carry (the light client p2p spec's
/// `MAX_REQUEST_LIGHT_CLIENT_UPDATES`, which the Beacon-API takes).
const MAX_UPDATES: usize = 128;

/// The length prefix and the context before each update.
const CHUNK_HEAD: usize = 8 + 4;

fn update_type(fork: Fork) -> Result<&'static Ty, TranscodeError> {
    Ok(&light_client(fork)?[1])
}

/// The JSON answer `body` as the route's SSZ, with `network`'s digests.
pub fn light_client_updates_to_ssz(body: &[u8], network: BeaconNetwork) -> Result<Vec<u8>, TranscodeError> {
    let mut json = Scanner::new(body);
    let mut out = Vec::with_capacity(body.len() / 2);
    let mut count = 0;
    json.array(|json| {
        count += 1;
        if count > MAX_UPDATES {
            return Err(TranscodeError::Limit("MAX_REQUEST_LIGHT_CLIENT_UPDATES"));
        }
        let head = out.len();
        out.resize(head + CHUNK_HEAD, 0);
        let (mut fork, mut written, mut deferred) = (None, false, None);
        json.object(|json, key| {
            match key {
                b"version" if fork.is_some() => return Err(json.error("one version member")),
                b"version" => fork = Some(Fork::from_name(&json.string()?).ok_or(TranscodeError::Fork)?),
                b"data" if written || deferred.is_some() => return Err(json.error("one data member")),
                b"data" => match fork {
                    Some(fork) => {
                        ssz_type::to_ssz(update_type(fork)?, json, &mut out)?;
                        written = true;
                    }
                    // no version yet: take the data once it is known
                    None => deferred = Some(json.value()?),
                },
                _ => {
                    json.value()?;
                }
            }
            Ok(())
        })?;
        let fork = fork.ok_or(TranscodeError::Fork)?;
        match deferred {
            Some(data) => ssz_type::to_ssz(update_type(fork)?, &mut Scanner::new(data), &mut out)?,
            None if !written => return Err(TranscodeError::NoResult),
            None => {}
        }
        let length = (out.len() - head - 8) as u64;
        out[head..head + 8].copy_from_slice(&length.to_le_bytes());
        out[head + 8..head + CHUNK_HEAD].copy_from_slice(&network.fork_digest(fork));
        Ok(())
    })?;
    json.end()?;
    Ok(out)
}

/// The route's SSZ as its JSON answer, each update's fork read from its digest on `network`.
pub fn light_client_updates_from_ssz(mut ssz: &[u8], network: BeaconNetwork) -> Result<Vec<u8>, TranscodeError> {
    let mut out = Vec::with_capacity(ssz.len() * 2 + 2);
    out.push(b'[');
    let mut count = 0;
    while !ssz.is_empty() {
        count += 1;
        if count > MAX_UPDATES {
            return Err(TranscodeError::Limit("MAX_REQUEST_LIGHT_CLIENT_UPDATES"));
        }
        let (length, rest) = ssz.split_first_chunk::<8>().ok_or(TranscodeError::Ssz("a response chunk's length"))?;
        let length = usize::try_from(u64::from_le_bytes(*length))
            .map_err(|_| TranscodeError::Ssz("a response chunk's length"))?;
        if length < 4 || length > rest.len() {
            return Err(TranscodeError::Ssz("a response chunk's length"));
        }
        let (chunk, rest) = rest.split_at(length);
        let (digest, update) = chunk.split_first_chunk::<4>().expect("at least four bytes");
        let fork = network.fork_of_digest(*digest).ok_or(TranscodeError::Fork)?;
        if count > 1 {
            out.push(b',');
        }
        out.extend_from_slice(b"{\"version\":\"");
        out.extend_from_slice(fork.name().as_bytes());
        out.extend_from_slice(b"\",\"data\":");
        ssz_type::to_json(update_type(fork)?, update, &mut out)?;
        out.push(b'}');
        ssz = rest;
    }
    out.push(b']');
    Ok(out)
}
