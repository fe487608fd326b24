//! The JSON-RPC transcoders, one path per input: its first byte picks the path, the witness's
//! form and the size of the pieces a stream is read in (or the raw schema); the rest is what a
//! node (or a client) sends. Each path gives an error or output, never a panic. Whatever SSZ gives
//! JSON must give the same SSZ back from that JSON, and whatever JSON gives SSZ must give it again
//! from the JSON the SSZ gives. A witness read as it arrives, in pieces of any size, gives what it
//! gives whole; so does a witness's SSZ rendered as it arrives. Seeds: `make fuzz-seeds`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rpcedge_core::transcode::{jsonrpc_from_ssz, jsonrpc_to_ssz, ssz_to_json, Schema, WitnessForm, WitnessRender, WitnessStream};

const FORMS: [WitnessForm; 2] = [WitnessForm::Lossless, WitnessForm::Eip8025];
const RAW: [Schema; 2] = [Schema::RawBytes, Schema::RawBytesList];

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

/// A JSON-RPC response's result as SSZ, and back.
fn json_round_trip(input: &[u8], schema: Schema, form: WitnessForm) {
    if let Ok(result) = jsonrpc_to_ssz(input, schema, form) {
        let body =
            jsonrpc_from_ssz(&result.ssz, schema, form, result.id, &result.version).expect("our own SSZ goes back to JSON");
        let again = jsonrpc_to_ssz(&body, schema, form).expect("our own JSON goes to SSZ");
        assert_eq!(again.ssz, result.ssz);
    }
}

/// SSZ as a JSON-RPC result, and back.
fn ssz_round_trip(input: &[u8], schema: Schema, form: WitnessForm) {
    let mut json = Vec::new();
    if ssz_to_json(input, schema, form, &mut json).is_ok() {
        let body = [&b"{\"result\":"[..], &json, b"}"].concat();
        let again = jsonrpc_to_ssz(&body, schema, form).expect("our own JSON goes to SSZ");
        assert_eq!(again.ssz, input);
    }
}

fuzz_target!(|input: &[u8]| {
    let Some((&choice, input)) = input.split_first() else { return };
    let form = FORMS[usize::from(choice & 1)];
    let step = usize::from(choice >> 3) + 1;
    let raw = RAW[usize::from(choice >> 3 & 1)];
    match choice >> 1 & 3 {
        // a witness from the node, as it arrives and whole
        0 => {
            let whole = jsonrpc_to_ssz(input, Schema::Witness, form).ok().map(|result| result.ssz);
            for step in [step, input.len() / 2 + 1] {
                assert_eq!(streamed(input, form, step), whole, "read in pieces of {step}");
            }
            json_round_trip(input, Schema::Witness, form);
        }
        // a witness's SSZ rendered for a JSON client, as it arrives and whole
        1 => {
            let whole = jsonrpc_from_ssz(input, Schema::Witness, form, b"1", b"2.0").ok();
            for step in [step, input.len() / 3 + 1] {
                assert_eq!(rendered(input, form, step), whole, "rendered in pieces of {step}");
            }
            ssz_round_trip(input, Schema::Witness, form);
        }
        // raw bytes (a block, a header, a transaction) and lists of them (receipts), both ways
        2 => json_round_trip(input, raw, form),
        _ => ssz_round_trip(input, raw, form),
    }
});
