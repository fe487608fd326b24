//! The transcoders on any bytes, as JSON and as SSZ, for every schema and Beacon-API object: an error or output, never
//! a panic. Whatever SSZ gives JSON must give the same SSZ back from that JSON, and whatever
//! JSON gives SSZ must give it again from the JSON the SSZ gives. A witness read as it arrives, in
//! pieces of any size, gives what it gives whole.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rpcedge_core::transcode::{
    beacon_data_to_json, beacon_data_to_ssz, beacon_to_ssz, jsonrpc_from_ssz, jsonrpc_to_ssz, ssz_to_json, BeaconObject, Fork,
    Schema, WitnessForm, WitnessStream,
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

fuzz_target!(|input: &[u8]| {
    for form in FORMS {
        let whole = jsonrpc_to_ssz(input, Schema::Witness, form).ok().map(|result| result.ssz);
        for step in [1 + input.len() % 13, input.len() / 2 + 1] {
            assert_eq!(streamed(input, form, step), whole, "read in pieces of {step}");
        }
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
