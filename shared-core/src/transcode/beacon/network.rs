//! The beacon chains whose fork digests rpcedge knows. A light client update's SSZ is framed with
//! the digest of its fork on its chain (`compute_fork_digest(fork_version, genesis_validators_root)`,
//! as the Beacon-API's updates route says), which neither the JSON nor the node's headers carry:
//! the operator names the chain. All use the mainnet preset, the one whose types rpcedge has.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::Fork;

/// A public beacon chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BeaconNetwork {
    Mainnet,
    Sepolia,
    Hoodi,
    Holesky,
}

impl BeaconNetwork {
    pub fn all() -> [BeaconNetwork; 4] {
        [BeaconNetwork::Mainnet, BeaconNetwork::Sepolia, BeaconNetwork::Hoodi, BeaconNetwork::Holesky]
    }

    pub fn name(self) -> &'static str {
        match self {
            BeaconNetwork::Mainnet => "mainnet",
            BeaconNetwork::Sepolia => "sepolia",
            BeaconNetwork::Hoodi => "hoodi",
            BeaconNetwork::Holesky => "holesky",
        }
    }

    pub fn from_name(name: &str) -> Option<BeaconNetwork> {
        BeaconNetwork::all().into_iter().find(|network| network.name().eq_ignore_ascii_case(name))
    }

    /// The C form (`rpcedge_config_t`): 0 is none.
    pub fn to_raw(network: Option<BeaconNetwork>) -> u32 {
        network.map_or(0, |network| network as u32 + 1)
    }

    pub fn from_raw(raw: u32) -> Option<BeaconNetwork> {
        BeaconNetwork::all().get(raw.checked_sub(1)? as usize).copied()
    }

    /// The root of the validators at genesis (the Beacon-API's `/eth/v1/beacon/genesis`).
    fn genesis_validators_root(self) -> [u8; 32] {
        let hex = match self {
            BeaconNetwork::Mainnet => "4b363db94e286120d76eb905340fdd4e54bfe9f06bf33ff6cf5ad27f511bfe95",
            BeaconNetwork::Sepolia => "d8ea171f3c94aea21ebc42a1ed61052acf3f9209c00e4efbaaddac09ed9b8078",
            BeaconNetwork::Hoodi => "212f13fc4df078b6cb7db228f1c8307566dcecf900867401a92023d7ba99cb5f",
            BeaconNetwork::Holesky => "9143aa7c615a7f7115e2b6aac319c03529df8242ae705fba9df39b79c59fa8b1",
        };
        let mut root = [0u8; 32];
        faster_hex::hex_decode(hex.as_bytes(), &mut root).expect("a root written as hex");
        root
    }

    /// `fork`'s version on this chain (its config's `*_FORK_VERSION`).
    fn fork_version(self, fork: Fork) -> [u8; 4] {
        let index = Fork::all().iter().position(|&f| f == fork).expect("every fork is in all()") as u8;
        match self {
            BeaconNetwork::Mainnet => [index, 0, 0, 0],
            BeaconNetwork::Sepolia => [0x90, 0, 0, 0x69 + index],
            BeaconNetwork::Hoodi => [(index + 1) << 4, 0, 0x09, 0x10],
            BeaconNetwork::Holesky => [index + 1, 0x01, 0x70, 0x00],
        }
    }

    /// `compute_fork_digest(fork_version, genesis_validators_root)`: the first four bytes of
    /// `hash_tree_root(ForkData)`, a container of two chunks (the version, zero-padded, and the
    /// root).
    pub fn fork_digest(self, fork: Fork) -> [u8; 4] {
        let mut version_chunk = [0u8; 32];
        version_chunk[..4].copy_from_slice(&self.fork_version(fork));
        let root: [u8; 32] =
            Sha256::new().chain_update(version_chunk).chain_update(self.genesis_validators_root()).finalize().into();
        root[..4].try_into().expect("four bytes")
    }

    /// The fork whose digest `digest` is on this chain.
    pub fn fork_of_digest(self, digest: [u8; 4]) -> Option<Fork> {
        Fork::all().into_iter().find(|&fork| self.fork_digest(fork) == digest)
    }
}
