//! The Beacon-API transcoders, one path per input: its first byte picks the object (the light
//! client updates' route, whose answers are framed by fork digests, is `transcode_light_client`'s;
//! here it is read as one update), its second the fork and the path (the `data` member either way,
//! or a whole response either way); the rest is what a beacon node (or a client) sends. Each path
//! gives an error or output, never a panic; whatever SSZ gives JSON must give the same SSZ back
//! from that JSON, and whatever JSON gives SSZ must give it again from the JSON the SSZ gives.
//! Seeds: `make fuzz-seeds`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rpcedge_core::transcode::{
    beacon_data_to_json, beacon_data_to_ssz, beacon_from_ssz, beacon_to_ssz, BeaconEnvelope, BeaconObject, Fork,
};

fuzz_target!(|input: &[u8]| {
    let [object, choice, input @ ..] = input else { return };
    let object = BeaconObject::all()[usize::from(*object) % BeaconObject::all().len()];
    let fork = Fork::all()[usize::from(choice & 7) % Fork::all().len()];
    match choice >> 3 & 3 {
        0 => {
            if let Ok(ssz) = beacon_data_to_ssz(input, object, fork) {
                let mut json = Vec::new();
                beacon_data_to_json(&ssz, object, fork, &mut json).expect("our own SSZ goes back to JSON");
                assert_eq!(beacon_data_to_ssz(&json, object, fork).expect("our own JSON goes to SSZ"), ssz);
            }
        }
        1 => {
            let mut json = Vec::new();
            if beacon_data_to_json(input, object, fork, &mut json).is_ok() {
                assert_eq!(beacon_data_to_ssz(&json, object, fork).expect("our own JSON goes to SSZ"), input);
            }
        }
        // a whole response, its version in the JSON or in Eth-Consensus-Version
        2 => {
            let header = (choice & 0x20 != 0).then_some(fork.name().as_bytes());
            if let Ok(read) = beacon_to_ssz(input, object, header) {
                let envelope =
                    BeaconEnvelope { fork: read.fork, execution_optimistic: read.execution_optimistic, finalized: read.finalized };
                let json = beacon_from_ssz(&read.ssz, object, envelope).expect("our own SSZ goes back to JSON");
                let again = beacon_to_ssz(&json, object, None).expect("our own JSON goes to SSZ");
                assert_eq!((&again.ssz, again.fork), (&read.ssz, read.fork));
                if object.has_chain_flags() {
                    assert_eq!((again.execution_optimistic, again.finalized), (read.execution_optimistic, read.finalized));
                }
            }
        }
        _ => {
            let envelope = BeaconEnvelope {
                fork: (choice & 0x20 == 0).then_some(fork),
                execution_optimistic: choice & 0x40 != 0,
                finalized: (choice & 0x80 != 0).then_some(choice & 0x40 == 0),
            };
            if let Ok(json) = beacon_from_ssz(input, object, envelope) {
                assert_eq!(beacon_to_ssz(&json, object, None).expect("our own JSON goes to SSZ").ssz, input);
            }
        }
    }
});
