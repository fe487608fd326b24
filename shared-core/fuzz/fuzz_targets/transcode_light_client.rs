//! The light client updates route (`/eth/v1/beacon/light_client/updates`) both ways, one way per
//! input: its first byte picks the way and the network whose fork digests frame each update; the
//! rest is what a beacon node (or a client) sends. Our own SSZ goes back to JSON and the same SSZ
//! again; SSZ that gives JSON gives itself back. Seeds: `make fuzz-seeds`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rpcedge_core::transcode::{light_client_updates_from_ssz, light_client_updates_to_ssz, BeaconNetwork};

fuzz_target!(|input: &[u8]| {
    let Some((&choice, input)) = input.split_first() else { return };
    let network = BeaconNetwork::all()[usize::from(choice >> 1) % BeaconNetwork::all().len()];
    if choice & 1 == 0 {
        if let Ok(ssz) = light_client_updates_to_ssz(input, network) {
            let json = light_client_updates_from_ssz(&ssz, network).expect("our own SSZ goes back to JSON");
            assert_eq!(light_client_updates_to_ssz(&json, network).expect("our own JSON goes to SSZ"), ssz);
        }
    } else if let Ok(json) = light_client_updates_from_ssz(input, network) {
        assert_eq!(light_client_updates_to_ssz(&json, network).expect("our own JSON goes to SSZ"), input);
    }
});
