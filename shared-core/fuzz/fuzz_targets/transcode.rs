//! The transcoders on any bytes, as JSON and as SSZ, for every schema and Beacon-API object: an error or output, never
//! a panic. Whatever SSZ gives JSON must give the same SSZ back from that JSON, and whatever
//! JSON gives SSZ must give it again from the JSON the SSZ gives. A witness read as it arrives, in
//! pieces of any size, gives what it gives whole; so does a witness's SSZ rendered as it
//! arrives. The light client updates route goes both ways too.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rpcedge_core::transcode::{
    beacon_data_to_json, beacon_data_to_ssz, beacon_to_ssz, jsonrpc_from_ssz, jsonrpc_to_ssz, light_client_updates_from_ssz,
    light_client_updates_to_ssz, ssz_to_json, BeaconNetwork, BeaconObject, Fork, Schema, WitnessForm, WitnessRender,
    WitnessStream,
};

const SCHEMAS: [Schema; 3] = [Schema::Witness, Schema::RawBytes, Schema::RawBytesList];
const FORMS: [WitnessForm; 2] = [WitnessForm::Lossless, WitnessForm::Eip8025];
const OBJECTS: [BeaconObject; 4] = [BeaconObject::Block, BeaconObject::BlindedBlock, BeaconObject::Blobs, BeaconObject::State];

/// The SSZ of a witness response read in pieces of `step` bytes, or why not.
fn streamed(input: &[u8], form: WitnessForm, step: usize) -> Option<Vec<u8>> {
    let mut stream = WitnessStream::new(form);
    for piece in input.chunks(step) {
        stream.feed(piece, false).ok()?;
    }
    stream.feed(&[], true).ok()?;
    let mut witness = stream.finish().ok()?;
    let mut ssz = Vec::new();
    while let Some((piece, _)) = witness.ssz.next_piece() {
        ssz.extend_from_slice(piece);
    }
    Some(ssz)
}

/// The JSON response of a witness's SSZ rendered in pieces of `step` bytes, or why not.
fn rendered(input: &[u8], form: WitnessForm, step: usize) -> Option<Vec<u8>> {
    let mut render = WitnessRender::new(form, b"1", b"2.0").ok()?;
    let mut json = Vec::new();
    for piece in input.chunks(step) {
        render.feed(piece, false, &mut json).ok()?;
    }
    render.feed(&[], true, &mut json).ok()?;
    Some(json)
}

fuzz_target!(|input: &[u8]| {
    for form in FORMS {
        let whole = jsonrpc_to_ssz(input, Schema::Witness, form).ok().map(|result| result.ssz);
        for step in [1 + input.len() % 13, input.len() / 2 + 1] {
            assert_eq!(streamed(input, form, step), whole, "read in pieces of {step}");
        }
        let whole = jsonrpc_from_ssz(input, Schema::Witness, form, b"1", b"2.0").ok();
        for step in [1 + input.len() % 7, input.len() / 3 + 1] {
            assert_eq!(rendered(input, form, step), whole, "rendered in pieces of {step}");
        }
    }
    if let Ok(ssz) = light_client_updates_to_ssz(input, BeaconNetwork::Mainnet) {
        let json = light_client_updates_from_ssz(&ssz, BeaconNetwork::Mainnet).expect("our own SSZ goes back to JSON");
        assert_eq!(light_client_updates_to_ssz(&json, BeaconNetwork::Mainnet).expect("our own JSON goes to SSZ"), ssz);
    }
    if let Ok(json) = light_client_updates_from_ssz(input, BeaconNetwork::Hoodi) {
        assert_eq!(light_client_updates_to_ssz(&json, BeaconNetwork::Hoodi).expect("our own JSON goes to SSZ"), input);
    }
    for schema in SCHEMAS {
        for form in FORMS {
            if let Ok(result) = jsonrpc_to_ssz(input, schema, form) {
                let body = jsonrpc_from_ssz(&result.ssz, schema, form, result.id, &result.version)
                    .expect("our own SSZ goes back to JSON");
                let again = jsonrpc_to_ssz(&body, schema, form).expect("our own JSON goes to SSZ");
                assert_eq!(again.ssz, result.ssz);
            }
            let mut json = Vec::new();
            if ssz_to_json(input, schema, form, &mut json).is_ok() {
                let body = [&b"{\"result\":"[..], &json, b"}"].concat();
                let again = jsonrpc_to_ssz(&body, schema, form).expect("our own JSON goes to SSZ");
                assert_eq!(again.ssz, input);
            }
        }
    }
    for object in OBJECTS {
        let _ = beacon_to_ssz(input, object, None);
        for fork in Fork::all() {
            if let Ok(ssz) = beacon_data_to_ssz(input, object, fork) {
                let mut json = Vec::new();
                beacon_data_to_json(&ssz, object, fork, &mut json).expect("our own SSZ goes back to JSON");
                assert_eq!(beacon_data_to_ssz(&json, object, fork).expect("our own JSON goes to SSZ"), ssz);
            }
            let mut json = Vec::new();
            if beacon_data_to_json(input, object, fork, &mut json).is_ok() {
                assert_eq!(beacon_data_to_ssz(&json, object, fork).expect("our own JSON goes to SSZ"), input);
            }
        }
    }
});
