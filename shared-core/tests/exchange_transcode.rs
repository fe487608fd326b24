//! Transcoding inside an exchange: which responses a client that asks for SSZ gets as SSZ, with
//! what headers, and what goes out untouched.

mod common;

use std::sync::Arc;

use common::{chunked, run, run_on, witness_answer_head, Exchange1};
use rpcedge_core::transcode::{beacon_data_to_ssz, ssz_to_json, BeaconObject, Fork, Schema, WitnessForm};
use rpcedge_core::{
    BodyPlan, Coding, Config, EtagEdit, Mode, Settings, TranscodeOutcome, CONSENSUS_VERSION_HEADER,
    EXECUTION_OPTIMISTIC_HEADER, FINALIZED_HEADER, JSONRPC_ID_HEADER, JSONRPC_VERSION_HEADER,
};

fn transcoding(config: Config) -> Arc<Settings> {
    Arc::new(Config { transcode: true, ..config }.validate().unwrap())
}

const CALL: &[u8] = br#"{"jsonrpc":"2.0","id":7,"method":"debug_getRawBlock","params":["0x10"]}"#;

/// A raw-block answer of `n` bytes of block.
fn raw_block(n: usize) -> (Vec<u8>, Vec<u8>) {
    let block: Vec<u8> = (0..n).map(|i| (i * 7 % 251) as u8).collect();
    let hex: String = block.iter().map(|b| format!("{b:02x}")).collect();
    (format!(r#"{{"jsonrpc":"2.0","id":"a-1","result":"0x{hex}"}}"#).into_bytes(), block)
}

fn ssz_call<'a>(body: &'a [u8], accept: &'a str) -> Exchange1<'a> {
    let mut spec = Exchange1::json(body, true);
    spec.request_headers.push(("Accept", accept));
    spec.request_body = CALL.to_vec();
    spec
}

fn header<'a>(edits: &'a rpcedge_core::HeaderEdits, name: &str) -> Option<&'a [u8]> {
    edits.set.iter().find(|(n, _)| *n == name).map(|(_, v)| &v[..])
}

fn outcome(settings: &Arc<Settings>, spec: &Exchange1) -> TranscodeOutcome {
    run(settings, spec).unwrap().transcode
}

#[test]
fn a_client_that_asks_for_ssz_gets_the_result_as_ssz_with_the_envelope_in_headers() {
    let settings = transcoding(Config::default());
    let (body, block) = raw_block(5000);
    let spec = ssz_call(&body, "application/octet-stream");
    let wire = run(&settings, &spec).unwrap();
    assert_eq!(wire.plan, BodyPlan::Buffer);
    assert_eq!(wire.body, block, "a raw block's SSZ is its bytes");
    assert_eq!(wire.content_length, Some(block.len() as u64));
    assert_eq!(wire.edits.content_type, Some("application/octet-stream"));
    assert_eq!(wire.edits.content_encoding, None, "SSZ is not among the default types to compress");
    assert_eq!(header(&wire.edits, JSONRPC_ID_HEADER), Some(&br#""a-1""#[..]));
    assert_eq!(header(&wire.edits, JSONRPC_VERSION_HEADER), Some(&b"2.0"[..]));
    assert!(wire.edits.add_vary_accept);
    assert_eq!(outcome(&settings, &spec), TranscodeOutcome::Transcoded);

    // Listed among the types, SSZ is compressed like JSON is, after transcoding.
    let types = vec!["application/json".into(), "application/octet-stream".into()];
    let wire = run(&transcoding(Config { types, ..Config::default() }), &spec).unwrap();
    assert_eq!((wire.mode, wire.edits.content_encoding), (Mode::Oneshot, Some(Coding::Gzip)));
    assert_eq!(wire.decoded(), block);
}

#[test]
fn json_clients_and_unlisted_methods_and_batches_get_json_as_before() {
    let settings = transcoding(Config::default());
    let (body, _) = raw_block(5000);
    let plain = run(&settings, &Exchange1::json(&body, true)).unwrap();
    assert_eq!((plain.mode, plain.edits.content_type), (Mode::Oneshot, None));
    for accept in ["application/json", "*/*", "application/octet-stream;q=0.5, application/json"] {
        let wire = run(&settings, &ssz_call(&body, accept)).unwrap();
        assert_eq!(wire.body, plain.body, "{accept}");
        assert_eq!(wire.edits.content_type, None);
    }
    for request in [
        &br#"{"jsonrpc":"2.0","id":1,"method":"eth_getBlockByNumber","params":["0x1",false]}"#[..],
        br#"[{"jsonrpc":"2.0","id":1,"method":"debug_getRawBlock","params":["0x1"]}]"#,
        br#"{"jsonrpc":"2.0","id":1,"method":"debug_getRawBlock""#,
    ] {
        let mut spec = ssz_call(&body, "application/octet-stream");
        spec.request_body = request.to_vec();
        let wire = run(&settings, &spec).unwrap();
        assert_eq!((wire.body.clone(), wire.edits.content_type), (plain.body.clone(), None));
        assert!(!wire.edits.add_vary_accept);
    }
    // Off unless configured.
    let wire = run(&Arc::new(Settings::default()), &ssz_call(&body, "application/octet-stream")).unwrap();
    assert_eq!(wire.body, plain.body);
}

#[test]
fn what_cannot_be_transcoded_goes_out_as_it_came_and_is_counted() {
    let settings = transcoding(Config::default());
    let plain_of = |body: &[u8]| run(&settings, &Exchange1::json(body, true)).unwrap();
    for (body, outcome_expected) in [
        (&br#"{"jsonrpc":"2.0","id":1,"result":"0xabc"}"#[..], TranscodeOutcome::Refused),
        (br#"{"jsonrpc":"2.0","id":1,"result":{"a":1}}"#, TranscodeOutcome::Refused),
        (br#"{"jsonrpc":"2.0","id":1,"result":"0x00"#, TranscodeOutcome::Refused),
        (br#"{"jsonrpc":"2.0","id":{"x":"\u00e9"},"result":"0x00"}"#, TranscodeOutcome::Transcoded),
        (br#"{"jsonrpc":"2.0","id":1,"error":{"code":-32000,"message":"header not found"}}"#, TranscodeOutcome::None),
    ] {
        let padded: Vec<u8> = body.iter().copied().chain(std::iter::repeat(b' ').take(2000)).collect();
        let spec = ssz_call(&padded, "application/octet-stream");
        let wire = run(&settings, &spec).unwrap();
        assert_eq!(outcome(&settings, &spec), outcome_expected, "{}", String::from_utf8_lossy(body));
        if outcome_expected != TranscodeOutcome::Transcoded {
            let plain = plain_of(&padded);
            assert_eq!(wire.decoded(), padded);
            assert_eq!((wire.body, wire.edits.content_type), (plain.body, None));
        }
    }
    // An id that cannot go in a header keeps the answer JSON.
    let body = "{\"jsonrpc\":\"2.0\",\"id\":\"\u{e9}\",\"result\":\"0x00\"}".as_bytes();
    assert_eq!(outcome(&settings, &ssz_call(body, "application/octet-stream")), TranscodeOutcome::Refused);
}

#[test]
fn a_body_over_transcode_max_goes_out_untranscoded_whether_its_length_is_known_or_not() {
    let settings = transcoding(Config { transcode_max: 4000, ..Config::default() });
    let (body, _) = raw_block(5000);
    let known = ssz_call(&body, "application/octet-stream");
    assert_eq!(outcome(&settings, &known), TranscodeOutcome::Refused);
    let wire = run(&settings, &known).unwrap();
    assert_eq!((wire.mode, wire.decoded()), (Mode::Oneshot, body.clone()));

    let mut chunked_spec = ssz_call(&body, "application/octet-stream");
    chunked_spec.content_length = None;
    chunked_spec.chunks = chunked(&body, &[1000, 3900, 4500], 1);
    let wire = run(&settings, &chunked_spec).unwrap();
    assert_eq!(wire.edits.content_type, None);
    assert_eq!(wire.decoded(), body);

    // And for a client that takes no gzip, it goes out as it came, byte for byte.
    chunked_spec.request_headers.retain(|(name, _)| *name != "Accept-Encoding");
    let wire = run(&settings, &chunked_spec).unwrap();
    assert_eq!((wire.mode, wire.body.clone(), wire.edits.content_encoding), (Mode::Untouched, body, None));
}

#[test]
fn a_transcoded_body_drops_the_json_etag_and_error_statuses_are_left_alone() {
    let settings = transcoding(Config::default());
    let (body, _) = raw_block(5000);
    let mut spec = ssz_call(&body, "application/octet-stream");
    spec.response_headers.push(("ETag", "\"v1\"".into()));
    let wire = run(&settings, &spec).unwrap();
    assert_eq!(wire.edits.etag, EtagEdit::Remove);
    assert!(wire.edits.remove_accept_ranges);

    spec.status = 500;
    let wire = run(&settings, &spec).unwrap();
    assert_eq!((wire.edits.content_type, wire.mode), (None, Mode::Oneshot));
    assert_eq!(wire.decoded(), body);

    spec.status = 200;
    spec.response_headers.push(("Cache-Control", "no-transform".into()));
    assert_eq!(outcome(&settings, &spec), TranscodeOutcome::Refused);
    assert_eq!(run(&settings, &spec).unwrap().body, body);
}

#[test]
fn a_witness_goes_out_in_the_form_the_client_asked_for() {
    let settings = transcoding(Config::default());
    // (JSON out names the fields in the container's order)
    let result = r#"{"state":["0xaabb"],"codes":["0x60"],"headers":["0xf9"],"keys":["0x01"]}"#;
    let body = format!(r#"{{"jsonrpc":"2.0","id":3,"result":{result}}}"#).into_bytes();
    let call = br#"{"jsonrpc":"2.0","id":3,"method":"debug_executionWitness","params":["0x1"]}"#;
    for (accept, form, content_type) in [
        ("application/octet-stream", WitnessForm::Lossless, "application/octet-stream"),
        ("application/octet-stream; witness=eip8025", WitnessForm::Eip8025, "application/octet-stream; witness=eip8025"),
    ] {
        let mut spec = ssz_call(&body, accept);
        spec.request_body = call.to_vec();
        let wire = run(&settings, &spec).unwrap();
        assert_eq!(wire.edits.content_type, Some(content_type));
        let mut json = Vec::new();
        ssz_to_json(&wire.body, Schema::Witness, form, &mut json).unwrap();
        let expected = if form == WitnessForm::Lossless {
            result.to_owned()
        } else {
            r#"{"state":["0xaabb"],"codes":["0x60"],"headers":["0xf9"]}"#.to_owned()
        };
        assert_eq!(String::from_utf8(json).unwrap(), expected);
    }
}

fn blinded_block_json() -> Vec<u8> {
    std::fs::read(common::corpus::dir().join("ssz/real/signed-blinded-beacon-block-deneb.json")).unwrap()
}

/// A GET of a Beacon-API route answered in JSON, with `envelope` around the block's data.
fn beacon_get<'a>(body: &'a [u8], path: &'a str, accept: &'a str) -> Exchange1<'a> {
    let mut spec = Exchange1::json(body, true);
    spec.method = "GET";
    spec.path = path;
    spec.request_headers.push(("Accept", accept));
    spec
}

#[test]
fn a_beacon_api_client_that_asks_for_ssz_gets_the_data_as_ssz_with_its_version() {
    let settings = transcoding(Config::default());
    let data = blinded_block_json();
    let ssz = beacon_data_to_ssz(&data, BeaconObject::BlindedBlock, Fork::Deneb).unwrap();
    let body = [&br#"{"version":"deneb","execution_optimistic":false,"finalized":true,"data":"#[..], &data, b"}"].concat();
    let spec = beacon_get(&body, "/eth/v1/beacon/blinded_blocks/348241", "application/octet-stream;q=1, application/json;q=0.9");
    let wire = run(&settings, &spec).unwrap();
    assert_eq!(wire.body, ssz);
    assert_eq!(wire.edits.content_type, Some("application/octet-stream"));
    assert_eq!(header(&wire.edits, CONSENSUS_VERSION_HEADER), Some(&b"deneb"[..]));
    assert_eq!(header(&wire.edits, EXECUTION_OPTIMISTIC_HEADER), Some(&b"false"[..]));
    assert_eq!(header(&wire.edits, FINALIZED_HEADER), Some(&b"true"[..]));
    assert_eq!(header(&wire.edits, JSONRPC_ID_HEADER), None);
    assert!(wire.edits.add_vary_accept);
    assert_eq!(outcome(&settings, &spec), TranscodeOutcome::Transcoded);

    // The upstream's header gives the version where the JSON does not.
    let bare = [&br#"{"data":"#[..], &data, b"}"].concat();
    let mut spec = beacon_get(&bare, "/eth/v1/beacon/blinded_blocks/348241", "application/octet-stream");
    spec.response_headers.push(("Eth-Consensus-Version", "deneb".into()));
    assert_eq!(run(&settings, &spec).unwrap().body, ssz);

    // JSON clients, other routes, other methods and a JSON without a version get the JSON as it came.
    let plain = run(&settings, &Exchange1::json(&body, true)).unwrap();
    for (method, path, accept, json) in [
        ("GET", "/eth/v1/beacon/blinded_blocks/348241", "application/json", &body),
        ("GET", "/eth/v1/beacon/headers/348241", "application/octet-stream", &body),
        ("POST", "/eth/v1/beacon/blinded_blocks/348241", "application/octet-stream", &body),
        ("GET", "/eth/v1/beacon/blinded_blocks/348241", "application/octet-stream", &bare),
    ] {
        let mut spec = beacon_get(json, path, accept);
        spec.method = method;
        let wire = run(&settings, &spec).unwrap();
        assert_eq!(wire.edits.content_type, None, "{method} {path} {accept}");
        if json == &body {
            assert_eq!(wire.body, plain.body, "{method} {path} {accept}");
        } else {
            assert_eq!(wire.decoded(), bare);
            assert_eq!(outcome(&settings, &spec), TranscodeOutcome::Refused);
        }
    }
}

fn asking_the_node(config: Config) -> Arc<Settings> {
    Arc::new(Config { transcode_upstream_ssz: true, ..config }.validate().unwrap())
}

const UPSTREAM_ACCEPT: &str = "application/octet-stream;q=1, application/json;q=0.9";

/// A JSON client's call, answered by the node in SSZ (`ssz`) or JSON.
fn json_call<'a>(body: &'a [u8], ssz: bool) -> Exchange1<'a> {
    let mut spec = Exchange1::json(body, true);
    spec.request_body = CALL.to_vec();
    if ssz {
        spec.response_headers = vec![("Content-Type", "application/octet-stream".into())];
    }
    spec
}

#[test]
fn a_json_clients_call_with_a_schema_is_asked_of_the_node_in_ssz_and_rendered_as_json() {
    let settings = asking_the_node(Config::default());
    let (_, block) = raw_block(5000);
    let wire = run(&settings, &json_call(&block, true)).unwrap();
    assert_eq!(wire.upstream_accept.as_deref(), Some(UPSTREAM_ACCEPT));
    let hex: String = block.iter().map(|b| format!("{b:02x}")).collect();
    let expected = format!(r#"{{"jsonrpc":"2.0","id":7,"result":"0x{hex}"}}"#);
    assert_eq!(wire.edits.content_type, Some("application/json"));
    assert_eq!((wire.mode, wire.edits.content_encoding), (Mode::Oneshot, Some(Coding::Gzip)), "rendered JSON is compressed");
    assert!(wire.edits.add_vary && wire.edits.add_vary_accept);
    assert_eq!(String::from_utf8(wire.decoded()).unwrap(), expected, "the request's id and version around the result");
    assert_eq!(run(&settings, &json_call(&block, true)).unwrap().transcode, TranscodeOutcome::Transcoded);

    // A node without SSZ answers JSON: it goes out as before.
    let (json, _) = raw_block(5000);
    let plain = run(&Arc::new(Settings::default()), &Exchange1::json(&json, true)).unwrap();
    let wire = run(&settings, &json_call(&json, false)).unwrap();
    assert_eq!((wire.body, wire.edits.content_type), (plain.body, None));

    // Clients that ask for SSZ, calls without a schema, batches and GETs leave the request alone.
    let mut ssz_client = json_call(&block, true);
    ssz_client.request_headers.push(("Accept", "application/octet-stream"));
    assert_eq!(run(&settings, &ssz_client).unwrap().upstream_accept, None);
    for request in [
        &br#"{"jsonrpc":"2.0","id":1,"method":"eth_getBlockByNumber","params":["0x1",false]}"#[..],
        br#"[{"jsonrpc":"2.0","id":1,"method":"debug_getRawBlock","params":["0x1"]}]"#,
    ] {
        let mut spec = json_call(&json, false);
        spec.request_body = request.to_vec();
        assert_eq!(run(&settings, &spec).unwrap().upstream_accept, None);
    }
    let mut get = json_call(&json, false);
    get.method = "GET";
    assert_eq!(run(&settings, &get).unwrap().upstream_accept, None);
    // nor does a form's POST, even of a call's body: it is not the node's request.
    let mut form = json_call(&json, false);
    form.request_headers.retain(|(name, _)| *name != "Content-Type");
    form.request_headers.push(("Content-Type", "application/x-www-form-urlencoded"));
    assert_eq!(run(&settings, &form).unwrap().upstream_accept, None);

    // SSZ that does not fit the schema cannot be rendered: it goes out as it came, counted.
    let mut witness = json_call(b"\x01\x02", true);
    witness.request_body = br#"{"jsonrpc":"2.0","id":1,"method":"debug_executionWitness","params":["0x1"]}"#.to_vec();
    let wire = run(&settings, &witness).unwrap();
    assert_eq!((wire.body, wire.transcode), (b"\x01\x02".to_vec(), TranscodeOutcome::Refused));
}

#[test]
fn a_json_clients_beacon_object_is_asked_in_ssz_only_once_the_node_has_shown_it_sends_the_envelope() {
    let (settings, node) = (asking_the_node(Config::default()), Arc::default());
    let data = blinded_block_json();
    let ssz = beacon_data_to_ssz(&data, BeaconObject::BlindedBlock, Fork::Deneb).unwrap();
    let path = "/eth/v1/beacon/blinded_blocks/348241";
    let node_ssz = |metadata: bool| {
        let mut spec = beacon_get(&ssz, path, "application/json");
        spec.response_headers = vec![
            ("Content-Type", "application/octet-stream".into()),
            ("Eth-Consensus-Version", "deneb".into()),
        ];
        if metadata {
            spec.response_headers.push(("Eth-Execution-Optimistic", "false".into()));
            spec.response_headers.push(("Eth-Consensus-Finalized", "true".into()));
        }
        spec
    };
    let mut ssz_client = node_ssz(true);
    ssz_client.request_headers.push(("Accept", "application/octet-stream"));
    ssz_client.request_headers.retain(|(_, value)| *value != "application/json");

    // Nothing known of the node yet: a JSON client's request goes as it came.
    assert_eq!(run_on(&settings, &node, &beacon_get(&data, path, "application/json")).unwrap().upstream_accept, None);
    // An SSZ client's answer shows the node sends the envelope's members as headers.
    let wire = run_on(&settings, &node, &ssz_client).unwrap();
    assert_eq!((wire.upstream_accept, wire.body.len()), (None, ssz.len()));

    let wire = run_on(&settings, &node, &node_ssz(true)).unwrap();
    assert_eq!(wire.upstream_accept.as_deref(), Some(UPSTREAM_ACCEPT));
    assert_eq!(wire.edits.content_type, Some("application/json"));
    let json: serde_json::Value = serde_json::from_slice(&wire.decoded()).unwrap();
    assert_eq!((&json["version"], &json["execution_optimistic"], &json["finalized"]), (&"deneb".into(), &false.into(), &true.into()));
    let data_again = serde_json::to_vec(&json["data"]).unwrap();
    assert_eq!(beacon_data_to_ssz(&data_again, BeaconObject::BlindedBlock, Fork::Deneb).unwrap(), ssz);

    // States are never asked for; nor is anything on other routes.
    for other in ["/eth/v2/debug/beacon/states/head", "/eth/v1/beacon/headers/head"] {
        assert_eq!(run_on(&settings, &node, &beacon_get(&data, other, "application/json")).unwrap().upstream_accept, None);
    }

    // An answer without them: the cautious reading, and the node is not asked again.
    let wire = run_on(&settings, &node, &node_ssz(false)).unwrap();
    let json: serde_json::Value = serde_json::from_slice(&wire.decoded()).unwrap();
    assert_eq!((&json["execution_optimistic"], json.get("finalized")), (&true.into(), None));
    assert_eq!(run_on(&settings, &node, &beacon_get(&data, path, "application/json")).unwrap().upstream_accept, None);
}

const WITNESS_CALL: &[u8] = br#"{"jsonrpc":"2.0","id":3,"method":"debug_executionWitness","params":["0x1"]}"#;

/// A witness response of `items` elements per field.
fn witness_body(items: usize) -> Vec<u8> {
    let item = |i: usize, len: usize| format!(r#""0x{}""#, (0..len).map(|j| format!("{:02x}", (i * 31 + j) % 256)).collect::<String>());
    let list = |len: usize| (0..items).map(|i| item(i, len + i % 7)).collect::<Vec<_>>().join(",");
    format!(
        r#"{{"jsonrpc":"2.0","id":3,"result":{{"state":[{}],"codes":[{}],"keys":[{}],"headers":[{}]}}}}"#,
        list(100),
        list(300),
        list(20),
        list(500)
    )
    .into_bytes()
}

fn witness_call<'a>(body: &'a [u8]) -> Exchange1<'a> {
    let mut spec = ssz_call(body, "application/octet-stream");
    spec.request_body = WITNESS_CALL.to_vec();
    spec
}

#[test]
fn a_witness_past_transcode_hold_max_is_transcoded_as_it_arrives_to_the_same_ssz_with_its_exact_length() {
    let body = witness_body(40);
    let held = run(&transcoding(Config::default()), &witness_call(&body)).unwrap();
    assert_eq!(held.transcode, TranscodeOutcome::Transcoded);
    let streaming = transcoding(Config { transcode_hold_max: 1000, ..Config::default() });
    for cuts in [vec![], vec![1, 2, 3, 500, 501, 4000, 9000], (0..body.len()).step_by(997).collect()] {
        let mut spec = witness_call(&body);
        spec.chunks = chunked(&body, &cuts, 0);
        let wire = run(&streaming, &spec).unwrap();
        assert_eq!(wire.transcode, TranscodeOutcome::Transcoded);
        assert_eq!((wire.plan, wire.mode), (BodyPlan::Buffer, Mode::Untouched));
        assert!(wire.body == held.body, "cut at {cuts:?}");
        assert_eq!(wire.content_length, Some(held.body.len() as u64));
        assert_eq!(wire.edits.content_type, Some("application/octet-stream"));
        assert_eq!(header(&wire.edits, JSONRPC_ID_HEADER), Some(&b"3"[..]));
    }

    // compressed as SSZ is where it is listed: whole under max_buffer, else as a stream
    let types = vec!["application/json".into(), "application/octet-stream".into()];
    for (max_buffer, mode) in [(1 << 20, Mode::Oneshot), (4096, Mode::Stream)] {
        let config = Config { transcode_hold_max: 1000, max_buffer, types: types.clone(), ..Config::default() };
        let mut spec = witness_call(&body);
        spec.chunks = chunked(&body, &[7000, 20000], 0);
        let wire = run(&transcoding(config), &spec).unwrap();
        assert_eq!((wire.mode, wire.edits.content_encoding), (mode, Some(Coding::Gzip)));
        assert!(wire.decoded() == held.body);
        let length = if mode == Mode::Oneshot { Some(wire.body.len() as u64) } else { None };
        assert_eq!(wire.content_length, length);
    }

    // a witness longer than transcode_max is left alone
    let config = Config { transcode_hold_max: 1000, transcode_max: 5000, ..Config::default() };
    let wire = run(&transcoding(config), &witness_call(&body)).unwrap();
    assert_eq!(wire.transcode, TranscodeOutcome::Refused);
    assert!(wire.decoded() == body, "as it came");
}

#[test]
fn a_witness_without_a_length_is_held_up_to_transcode_hold_max_then_transcoded_as_it_arrives() {
    let body = witness_body(40);
    let held = run(&transcoding(Config::default()), &witness_call(&body)).unwrap();
    let streaming = transcoding(Config { transcode_hold_max: 1000, ..Config::default() });
    let mut spec = witness_call(&body);
    spec.content_length = None;
    // the chunk that passes the bound: a first one, one at it, one long after
    for cuts in [vec![], vec![500], vec![999, 1000, 1001], vec![900, 20000], (0..body.len()).step_by(997).collect()] {
        spec.chunks = chunked(&body, &cuts, 0);
        let wire = run(&streaming, &spec).unwrap();
        assert_eq!(wire.transcode, TranscodeOutcome::Transcoded, "cut at {cuts:?}");
        assert!(wire.body == held.body, "cut at {cuts:?}");
        assert_eq!(wire.content_length, Some(held.body.len() as u64));
    }

    // what did not read while it was held goes out as it came
    let mut bad = body.clone();
    bad[200] = b'g';
    let mut spec = witness_call(&bad);
    spec.content_length = None;
    spec.chunks = chunked(&bad, &[500, 1500, 9000], 0);
    let wire = run(&streaming, &spec).unwrap();
    assert_eq!(wire.transcode, TranscodeOutcome::Refused);
    assert!(wire.decoded() == bad, "as it came");
    // past the bound its JSON is gone: the exchange fails, before any byte
    let mut bad = body.clone();
    let at = body.len() / 2 + body[body.len() / 2..].iter().position(|&b| b == b'x').unwrap();
    bad[at + 3] = b'g';
    let mut ex = witness_answer_head(&streaming, None);
    for chunk in bad[..at - 10].chunks(700) {
        let out = ex.feed(chunk, false, false, 0).unwrap();
        assert!(out.data.is_empty() && out.headers.is_none());
    }
    assert!(matches!(ex.feed(&bad[at - 10..], true, false, 0), Err(rpcedge_core::Error::Transcode(_))));
    assert_eq!(ex.failure(), rpcedge_core::Failure::Respond(502));

    // so does one that grows past transcode_max; one whose first chunk past the bound passes
    // it, while its JSON is still there, goes out as it came
    let config = Config { transcode_hold_max: 1000, transcode_max: 5000, ..Config::default() };
    let mut ex = witness_answer_head(&transcoding(config.clone()), None);
    for chunk in body[..5000].chunks(700) {
        ex.feed(chunk, false, false, 0).unwrap();
    }
    let past = ex.feed(&body[5000..6000], false, false, 0);
    assert!(matches!(past, Err(rpcedge_core::Error::Transcode(ref e)) if e.to_string().contains("transcode_max")), "{past:?}");
    spec = witness_call(&body);
    spec.content_length = None;
    spec.chunks = chunked(&body, &[900, 7000], 0);
    let wire = run(&transcoding(config), &spec).unwrap();
    assert_eq!(wire.transcode, TranscodeOutcome::Refused);
    assert!(wire.decoded() == body, "as it came");
}

#[test]
fn a_witness_transcoded_as_it_arrives_that_turns_out_not_to_be_one_fails_before_any_byte_goes_out() {
    let streaming = transcoding(Config { transcode_hold_max: 1000, ..Config::default() });
    let mut body = witness_body(40);
    let at = body.len() / 2 + body[body.len() / 2..].iter().position(|&b| b == b'x').unwrap();
    body[at + 3] = b'g';
    let mut spec = witness_call(&body);
    spec.chunks = chunked(&body, &[4000, 9000], 0);
    assert!(matches!(run(&streaming, &spec), Err(rpcedge_core::Error::Transcode(_))));

    let mut ex = witness_answer_head(&streaming, Some(body.len()));
    let out = ex.feed(&body[..at - 10], false, false, 0).unwrap();
    assert!(out.data.is_empty() && out.headers.is_none());
    assert!(ex.feed(&body[at - 10..], true, false, 0).is_err());
    assert_eq!(ex.failure(), rpcedge_core::Failure::Respond(502));
    assert_eq!(ex.transcode_outcome(), TranscodeOutcome::Refused);
}

#[test]
fn a_witness_asked_of_the_node_in_ssz_past_transcode_hold_max_is_rendered_as_it_arrives() {
    let json = witness_body(40);
    let ssz = run(&transcoding(Config::default()), &witness_call(&json)).unwrap().body;
    let whole = run(&asking_the_node(Config::default()), &witness_json_call(&ssz, true)).unwrap();
    assert_eq!(whole.transcode, TranscodeOutcome::Transcoded);
    let rendered = whole.decoded();
    let value = |json: &[u8]| serde_json::from_slice::<serde_json::Value>(json).unwrap();
    assert_eq!(value(&rendered), value(&json), "the node's answer, had it been JSON");
    // no gzip: the JSON as it is rendered, without a length (the node's was the SSZ's)
    let streaming = Config { transcode_hold_max: 1000, max_buffer: 4096, ..Config::default() };
    for (length, cuts) in [(true, vec![]), (true, vec![3, 17, 1000, 1001, 5000]), (false, (0..ssz.len()).step_by(997).collect())] {
        for gzip in [false, true] {
            let mut spec = witness_json_call(&ssz, length);
            spec.chunks = chunked(&ssz, &cuts, 0);
            if !gzip {
                spec.request_headers.retain(|(name, _)| *name != "Accept-Encoding");
            }
            let wire = run(&asking_the_node(streaming.clone()), &spec).unwrap();
            assert_eq!(wire.transcode, TranscodeOutcome::Transcoded, "cut at {cuts:?}");
            assert_eq!(wire.edits.content_type, Some("application/json"));
            assert!(wire.decoded() == rendered, "cut at {cuts:?}, gzip {gzip}");
            assert_eq!(wire.content_length, None, "known only at the end");
            let mode = if gzip { Mode::Stream } else { Mode::Untouched };
            assert_eq!(wire.mode, mode);
        }
    }

    // SSZ that turns out not to render fails the exchange; a lying length too
    let mut bad = ssz.clone();
    bad[20] = 0xff;
    let mut spec = witness_json_call(&bad, true);
    spec.chunks = chunked(&bad, &[2000, 4000], 0);
    assert!(run(&asking_the_node(streaming.clone()), &spec).is_err());
    let mut spec = witness_json_call(&ssz, true);
    spec.content_length = Some(ssz.len() as u64 + 1);
    assert!(matches!(run(&asking_the_node(streaming), &spec), Err(rpcedge_core::Error::LengthMismatch { .. })));
}

/// A JSON client's witness call, answered by the node with `ssz`, with its length or without.
fn witness_json_call(ssz: &[u8], length: bool) -> Exchange1<'_> {
    let mut spec = json_call(ssz, true);
    spec.request_body = WITNESS_CALL.to_vec();
    spec.content_length = length.then_some(ssz.len() as u64);
    spec
}
