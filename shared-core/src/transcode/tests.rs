use proptest::prelude::*;

use super::*;

fn witness_ssz(json: &str, form: WitnessForm) -> Result<Vec<u8>, TranscodeError> {
    let body = format!(r#"{{"jsonrpc":"2.0","id":1,"result":{json}}}"#);
    jsonrpc_to_ssz(body.as_bytes(), Schema::Witness, form).map(|result| result.ssz)
}

fn le(n: u32) -> [u8; 4] {
    n.to_le_bytes()
}

#[test]
fn a_witness_is_four_lists_of_byte_lists_in_ssz_order() {
    let ssz = witness_ssz(
        r#"{"state":["0xaabb","0xcc"],"codes":[],"keys":["0x01"],"headers":["0xf9"]}"#,
        WitnessForm::Lossless,
    )
    .unwrap();
    // container offsets, then state (2 offsets, 3 bytes), codes (none), headers, keys
    let mut expected = [le(16), le(16 + 11), le(27), le(27 + 5)].concat();
    expected.extend([le(8), le(10)].concat());
    expected.extend([0xaa, 0xbb, 0xcc]);
    expected.extend([le(4).as_slice(), &[0xf9]].concat());
    expected.extend([le(4).as_slice(), &[0x01]].concat());
    assert_eq!(ssz, expected);
    let mut json = Vec::new();
    ssz_to_json(&ssz, Schema::Witness, WitnessForm::Lossless, &mut json).unwrap();
    // (in the container's order)
    assert_eq!(json, br#"{"state":["0xaabb","0xcc"],"codes":[],"headers":["0xf9"],"keys":["0x01"]}"#);
}

#[test]
fn the_eip_8025_form_has_three_fields_and_no_keys() {
    let ssz = witness_ssz(r#"{"state":["0xaa"],"codes":["0x60"],"keys":["0x01"],"headers":[]}"#, WitnessForm::Eip8025)
        .unwrap();
    assert_eq!(&ssz[..12], [le(12), le(12 + 5), le(12 + 10)].concat());
    assert_eq!(ssz.len(), 22);
    let mut json = Vec::new();
    ssz_to_json(&ssz, Schema::Witness, WitnessForm::Eip8025, &mut json).unwrap();
    assert_eq!(json, br#"{"state":["0xaa"],"codes":["0x60"],"headers":[]}"#);
}

#[test]
fn the_map_shape_key_order_case_whitespace_escapes_and_unknown_fields_give_the_same_ssz() {
    let list = witness_ssz(r#"{"state":["0xaabb","0xcc"],"codes":["0x60"],"keys":["0x01"]}"#, WitnessForm::Lossless);
    for variant in [
        r#"{"state":{"0x11":"0xaabb","0x22":"0xcc"},"codes":{"0x33":"0x60"},"keys":{"0x44":"0x01"}}"#,
        r#" { "keys" : [ "0x01" ] , "codes":["0x60"], "state":["0xAAbB","0xCC"] } "#,
        r#"{"state":["\u0030xaabb","0x\u0063c"],"codes":["0x60"],"keys":["0x01"],"headers":[]}"#,
        r#"{"extra":{"a":[1,{"b":"}"}],"c":null},"state":["0xaabb","0xcc"],"codes":["0x60"],"more":[true,-1.5e3],"keys":["0x01"]}"#,
    ] {
        assert_eq!(witness_ssz(variant, WitnessForm::Lossless), list, "{variant}");
    }
}

#[test]
fn what_is_not_a_witness_is_refused() {
    for (json, error) in [
        (r#"{"state":["0xabc"]}"#, TranscodeError::Hex),
        (r#"{"state":["abcd"]}"#, TranscodeError::Hex),
        (r#"{"state":["0xzz"]}"#, TranscodeError::Hex),
        // the offsets count from the envelope's start: the result begins at byte 33
        (r#"{"state":[12]}"#, TranscodeError::Json { what: "a string", at: 33 + 10 }),
        (r#"{"state":[],"state":[]}"#, TranscodeError::Json { what: "a field named twice", at: 33 + 20 }),
    ] {
        assert_eq!(witness_ssz(json, WitnessForm::Lossless), Err(error), "{json}");
    }
    let long_key = format!(r#"{{"keys":["0x{}"]}}"#, "00".repeat(33));
    assert_eq!(
        witness_ssz(&long_key, WitnessForm::Lossless),
        Err(TranscodeError::Limit("an element longer than its limit"))
    );
    let headers = format!(r#"{{"headers":[{}]}}"#, vec![r#""0x""#; 257].join(","));
    assert_eq!(
        witness_ssz(&headers, WitnessForm::Lossless),
        Err(TranscodeError::Limit("more elements than the list's limit"))
    );
    for broken in [r#"{"state":["0x00"]"#, r#"{"state":["0x00"}"#, r#"{"state":["0x00]}"#, "[]", ""] {
        assert!(matches!(witness_ssz(broken, WitnessForm::Lossless), Err(TranscodeError::Json { .. })), "{broken}");
    }
}

/// Block 1 of a hive test chain, as erigon gave it in a witness before it took up RLP headers.
pub(super) fn json_header(edit: impl FnOnce(&mut serde_json::Map<String, serde_json::Value>)) -> String {
    let zeros = |bytes: usize| format!("0x{}", "00".repeat(bytes));
    let mut header = serde_json::json!({
        "parentHash": "0x79e0f5ffb6a0c9f54d507dbbadc935603ac1db86d32f7857472180a75ec11f90",
        "sha3Uncles": "0x1dcc4de8dec75d7aab85b567b6ccd41ad312451b948a7413f0a142fd40d49347",
        "miner": zeros(20),
        "stateRoot": "0x22e4092a71d9649313a17bea0079ddab823af6db75fac5a6c923c5351f60e1e3",
        "transactionsRoot": "0xe59276e836db856f9137c247add7333879b98bdf82db67c40d25914fa0ab8e48",
        "receiptsRoot": "0xcf8b165a50a7884c3051f2b2a4a8967670699a5eb754674cd523c30dc4685b24",
        "logsBloom": zeros(256),
        "difficulty": "0x20000",
        "number": "0x1",
        "gasLimit": "0x23f3e20",
        "gasUsed": "0x527eb",
        "timestamp": "0xa",
        "extraData": "0x",
        "mixHash": zeros(32),
        "nonce": zeros(8),
        "baseFeePerGas": null,
        "withdrawalsRoot": null,
        "blockAccessListHash": null,
        "hash": "0x79ba0368c2c6563a7d263695b583dcc6d1c25d4988daa0105804d38bdd987f2f",
    });
    edit(header.as_object_mut().unwrap());
    header.to_string()
}

#[test]
fn a_json_header_goes_in_as_the_rlp_whose_keccak_is_its_hash() {
    use sha3::{Digest, Keccak256};
    let header = json_header(|_| {});
    let ssz = witness_ssz(&format!(r#"{{"state":[],"codes":[],"headers":[{header},"0xc0"]}}"#), WitnessForm::Eip8025)
        .unwrap();
    let mut json = Vec::new();
    ssz_to_json(&ssz, Schema::Witness, WitnessForm::Eip8025, &mut json).unwrap();
    let json: serde_json::Value = serde_json::from_slice(&json).unwrap();
    let hex = &json["headers"][0].as_str().unwrap()[2..];
    let rlp: Vec<u8> = (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap()).collect();
    assert_eq!(
        format!("{:x}", Keccak256::digest(&rlp)),
        "79ba0368c2c6563a7d263695b583dcc6d1c25d4988daa0105804d38bdd987f2f"
    );
    // a list of 15 strings: 0x20000 is three bytes, 0xa one byte under 0x80, extraData empty
    assert_eq!(rlp[..3], [0xf9, 0x01, (rlp.len() - 3) as u8]);
    assert_eq!(json["headers"][1], "0xc0", "an RLP header beside it is kept as it is");
    // without its hash, nothing is checked; a leading zero digit is the same quantity
    for same in
        [json_header(|h| _ = h.remove("hash")), json_header(|h| _ = h.insert("gasUsed".into(), "0x0527eb".into()))]
    {
        let again =
            witness_ssz(&format!(r#"{{"state":[],"codes":[],"headers":[{same},"0xc0"]}}"#), WitnessForm::Eip8025);
        assert_eq!(again.unwrap(), ssz);
    }
}

#[test]
fn a_json_header_that_is_not_the_header_it_claims_to_be_is_refused() {
    let refused = |edit: fn(&mut serde_json::Map<String, serde_json::Value>)| {
        witness_ssz(&format!(r#"{{"headers":[{}]}}"#, json_header(edit)), WitnessForm::Lossless).unwrap_err()
    };
    let header = TranscodeError::Header;
    assert_eq!(
        refused(|h| _ = h.insert("gasUsed".into(), "0x527ec".into())),
        header("its RLP does not hash to its hash")
    );
    assert_eq!(
        refused(|h| _ = h.insert("withdrawalsRoot".into(), format!("0x{}", "11".repeat(32)).into())),
        header("a field of a later fork without those before it")
    );
    assert_eq!(refused(|h| _ = h.remove("nonce")), header("a field every header has is missing"));
    assert_eq!(
        refused(|h| _ = h.insert("totalDifficulty".into(), "0x1".into())),
        header("a field no fork's header has")
    );
    assert_eq!(
        refused(|h| _ = h.insert("miner".into(), format!("0x{}", "00".repeat(21)).into())),
        header("a field of the wrong length")
    );
    assert_eq!(refused(|h| _ = h.insert("number".into(), "0x".into())), TranscodeError::Hex);
    assert_eq!(
        refused(|h| _ = h.insert("number".into(), format!("0x1{}", "0".repeat(64)).into())),
        header("a quantity over 256 bits")
    );
    assert!(matches!(
        refused(|h| _ = h.insert("number".into(), 1.into())),
        TranscodeError::Json { what: "a string", .. }
    ));
}

#[test]
fn the_envelope_gives_id_and_version_and_an_error_stays_json() {
    let body = br#"{"result":"0x0102","id":{"n":[1,2]},"jsonrpc":"2.0"}"#;
    let result = jsonrpc_to_ssz(body, Schema::RawBytes, WitnessForm::Lossless).unwrap();
    assert_eq!(
        (result.id, result.version.as_ref(), result.ssz.as_slice()),
        (&br#"{"n":[1,2]}"#[..], &b"2.0"[..], &[1, 2][..])
    );
    let back =
        jsonrpc_from_ssz(&result.ssz, Schema::RawBytes, WitnessForm::Lossless, result.id, &result.version).unwrap();
    assert_eq!(back, br#"{"jsonrpc":"2.0","id":{"n":[1,2]},"result":"0x0102"}"#);
    let error = br#"{"jsonrpc":"2.0","id":1,"error":{"code":-32000,"message":"no"}}"#;
    assert_eq!(jsonrpc_to_ssz(error, Schema::RawBytes, WitnessForm::Lossless), Err(TranscodeError::NoResult));
    let none = br#"{"jsonrpc":"2.0","id":1}"#;
    assert_eq!(jsonrpc_to_ssz(none, Schema::RawBytes, WitnessForm::Lossless), Err(TranscodeError::NoResult));
    assert!(
        jsonrpc_from_ssz(&[1], Schema::RawBytes, WitnessForm::Lossless, b"1, \"x\":2", b"2.0").is_err(),
        "an id that is not one value"
    );
    let odd = jsonrpc_from_ssz(&[1], Schema::RawBytes, WitnessForm::Lossless, b"1", b"2.0\",\"x").unwrap();
    assert_eq!(odd, br#"{"jsonrpc":"2.0\",\"x","id":1,"result":"0x01"}"#, "the version is escaped");
}

#[test]
fn raw_bytes_and_lists_of_them() {
    let body = br#"{"jsonrpc":"2.0","id":1,"result":["0x01","0x","0x0203"]}"#;
    let result = jsonrpc_to_ssz(body, Schema::RawBytesList, WitnessForm::Lossless).unwrap();
    assert_eq!(result.ssz, [le(12).as_slice(), &le(13), &le(13), &[1, 2, 3]].concat());
    let mut json = Vec::new();
    ssz_to_json(&result.ssz, Schema::RawBytesList, WitnessForm::Lossless, &mut json).unwrap();
    assert_eq!(json, br#"["0x01","0x","0x0203"]"#);
    assert_eq!(method_schema("debug_getRawReceipts"), Some(Schema::RawBytesList));
    assert_eq!(method_schema("debug_getRawBlock"), Some(Schema::RawBytes));
    assert_eq!(method_schema("eth_getBlockByNumber"), None);
}

#[test]
fn malformed_ssz_is_refused() {
    let mut out = Vec::new();
    for (ssz, form) in [
        (vec![], WitnessForm::Lossless),
        ([le(12), le(16), le(16), le(16)].concat(), WitnessForm::Lossless),
        ([le(16), le(20), le(16), le(16)].concat(), WitnessForm::Lossless),
        ([le(12), le(12), le(99)].concat(), WitnessForm::Eip8025),
        ([le(12), le(12), le(12), le(3)].concat(), WitnessForm::Eip8025),
    ] {
        assert!(ssz_to_json(&ssz, Schema::Witness, form, &mut out).is_err(), "{ssz:?}");
    }
    assert!(ssz_to_json(&[le(8).as_slice(), &le(4)].concat(), Schema::RawBytesList, WitnessForm::Lossless, &mut out)
        .is_err());
}

fn hex_list(items: &[Vec<u8>]) -> String {
    let items: Vec<String> = items.iter().map(|item| format!("\"0x{}\"", faster_hex::hex_string(item))).collect();
    format!("[{}]", items.join(","))
}

proptest! {
    #[test]
    fn any_witness_goes_to_ssz_and_back(
        state in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..40), 0..20),
        codes in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..40), 0..5),
        keys in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..33), 0..10),
        headers in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..40), 0..3),
    ) {
        let json = format!(
            r#"{{"state":{},"codes":{},"headers":{},"keys":{}}}"#,
            hex_list(&state), hex_list(&codes), hex_list(&headers), hex_list(&keys),
        );
        let ssz = witness_ssz(&json, WitnessForm::Lossless).unwrap();
        let mut back = Vec::new();
        ssz_to_json(&ssz, Schema::Witness, WitnessForm::Lossless, &mut back).unwrap();
        prop_assert_eq!(String::from_utf8(back).unwrap(), json);
    }

    #[test]
    fn any_bytes_as_ssz_give_json_or_an_error(ssz in prop::collection::vec(any::<u8>(), 0..200)) {
        for form in [WitnessForm::Lossless, WitnessForm::Eip8025] {
            let mut out = Vec::new();
            if ssz_to_json(&ssz, Schema::Witness, form, &mut out).is_ok() {
                let again = witness_ssz(std::str::from_utf8(&out).unwrap(), form).unwrap();
                prop_assert_eq!(&again, &ssz);
            }
        }
    }
}

#[test]
fn hex_decodes_as_faster_hex_does_and_refuses_every_byte_that_is_not_a_digit() {
    let bytes: Vec<u8> = (0..300u32).map(|i| (i * 97 + 13) as u8).collect();
    for len in 0..=bytes.len() {
        let lower = faster_hex::hex_string(&bytes[..len]);
        let mixed: String =
            lower.chars().enumerate().map(|(i, c)| if i % 3 == 0 { c.to_ascii_uppercase() } else { c }).collect();
        for digits in [lower, mixed] {
            let mut out = vec![0; len];
            hex::decode_hex(digits.as_bytes(), &mut out).unwrap();
            assert_eq!(out, bytes[..len], "{digits}");
        }
    }
    // each position of strings decoded by AVX2, SSE2, the scalar rest and faster-hex, with every byte value
    for len in [32, 7, 48, 200] {
        let digits = faster_hex::hex_string(&bytes[..len]).into_bytes();
        for at in 0..digits.len() {
            for value in 0..=255u8 {
                let mut digits = digits.clone();
                digits[at] = value;
                let (mut ours, mut theirs) = (vec![0; len], vec![0; len]);
                let result = hex::decode_hex(&digits, &mut ours);
                assert_eq!(result.is_ok(), value.is_ascii_hexdigit(), "{value:#x} at {at}");
                if result.is_ok() {
                    faster_hex::hex_decode(&digits, &mut theirs).unwrap();
                    assert_eq!(ours, theirs);
                }
            }
        }
    }
    assert!(hex::decode_hex(b"abc", &mut [0; 2]).is_err(), "an odd length");
}

#[test]
fn a_hex_string_is_decoded_as_its_end_is_looked_for_and_anything_else_is_left_to_the_slow_path() {
    let bytes: Vec<u8> = (0..100u32).map(|i| (i * 31 + 7) as u8).collect();
    for len in 0..bytes.len() {
        let text = format!(r#""0x{}" ,1"#, faster_hex::hex_string(&bytes[..len]).to_uppercase());
        let (mut json, mut out) = (json::Scanner::new(text.as_bytes()), vec![9]);
        assert!(json.hex_string(&mut out));
        assert_eq!(out[1..], bytes[..len]);
        assert_eq!(json.peek(), Some(b','), "read up to the string's end");
    }
    for other in [&br#""0x123""#[..], br#""0x12\u0033""#, br#""12""#, br#""0x12g4""#, br#""0x12"#, b"12"] {
        let (mut json, mut out) = (json::Scanner::new(other), vec![9]);
        assert!(!json.hex_string(&mut out), "{}", String::from_utf8_lossy(other));
        assert_eq!(out, [9]);
    }
    // the slow path reads the escaped digits
    let mut out = Vec::new();
    ssz::decode_hex_into(&mut json::Scanner::new(br#""0x12\u0033""#), &mut out).unwrap_err();
    ssz::decode_hex_into(&mut json::Scanner::new(br#""0x12\u00334""#), &mut out).unwrap();
    assert_eq!(out, [0x12, 0x34]);
}
