//! The transcoders on any bytes, as JSON and as SSZ, for every schema: an error or output, never
//! a panic. Whatever SSZ gives JSON must give the same SSZ back from that JSON, and whatever
//! JSON gives SSZ must give it again from the JSON the SSZ gives.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rpcedge_core::transcode::{jsonrpc_from_ssz, jsonrpc_to_ssz, ssz_to_json, Schema, WitnessForm};

const SCHEMAS: [Schema; 3] = [Schema::Witness, Schema::RawBytes, Schema::RawBytesList];
const FORMS: [WitnessForm; 2] = [WitnessForm::Lossless, WitnessForm::Eip8025];

fuzz_target!(|input: &[u8]| {
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
});
