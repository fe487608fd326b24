//! The cache's key against a second, deliberately simple reading of the request as Go's
//! encoding/json makes it (geth, erigon, op-geth, bor): member names matched case-insensitively,
//! with Unicode folding, the last one winning. Whenever `cache::lookup` gives a key, Go reads the
//! same method and params: the key of the call as Go read it, spelled plainly, is the same key,
//! and no object in the params has names Go would confuse.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use rpcedge_core::cache::{lookup, CacheSettings};
use serde::de::{Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;

const NAMES: &[&str] = &[
    "jsonrpc",
    "id",
    "method",
    "params",
    "Params",
    "PARAMS",
    "par\\u0061ms",
    "paramſ",
    "Method",
    "METHOD",
    "ID",
    "jsonrpc ",
    "result",
    "pArAmS",
];
const VALUES: &[&str] = &[
    r#""2.0""#,
    "1",
    r#""eth_getBlockByHash""#,
    r#""eth_getBlockByNumber""#,
    r#""eth_call""#,
    r#"["0xa1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1",false]"#,
    r#"["0xb2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2",true]"#,
    r#"["0x10",false]"#,
    r#"[{"to":"0x1","To":"0x2"},"0x10"]"#,
    r#"[{"to":"0x1","to":"0x2"},"0x10"]"#,
    r#"[{"to":"0x1","params":{"data":"0x2"}},"0x10"]"#,
    r#"[{"blockHash":"0xa1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1"}]"#,
    "[]",
    "null",
];

#[derive(Arbitrary, Debug)]
enum Part<'a> {
    Known(u8),
    Own(&'a str),
}

#[derive(Arbitrary, Debug)]
enum Input<'a> {
    /// Members from the tables above (or the fuzzer's own), in any order and number.
    Members(Vec<(Part<'a>, Part<'a>)>),
    Raw(&'a [u8]),
}

fn pick<'a>(part: &'a Part, table: &'a [&'a str], quote: bool) -> String {
    match part {
        Part::Known(at) => table[usize::from(*at) % table.len()].to_string(),
        Part::Own(text) if quote => {
            let quoted = serde_json::to_string(text).expect("a string serialises");
            quoted[1..quoted.len() - 1].to_string()
        }
        Part::Own(text) => text.to_string(),
    }
}

fuzz_target!(|input: Input| {
    let body = match &input {
        Input::Members(members) => {
            let members: Vec<String> = members
                .iter()
                .map(|(name, value)| format!("\"{}\":{}", pick(name, NAMES, true), pick(value, VALUES, false)))
                .collect();
            format!("{{{}}}", members.join(",")).into_bytes()
        }
        Input::Raw(bytes) => bytes.to_vec(),
    };
    let settings = CacheSettings::default();
    let Ok(request) = lookup("fuzz", &body, &settings) else { return };
    let go = go_read(&body).expect("Go reads a call the cache looked up");
    let method = go.field("method").expect("Go reads a method");
    let params = go.field("params").unwrap_or("null");
    let plain = format!(r#"{{"method":{method},"params":{params}}}"#);
    let again = lookup("fuzz", plain.as_bytes(), &settings).expect("the call as Go read it is looked up too");
    assert_eq!(request.key, again.key, "Go reads another call than the key: {}", String::from_utf8_lossy(&body));
    let params: serde_json::Value = serde_json::from_str(params).unwrap();
    assert!(no_confusable_names(&params), "{}", String::from_utf8_lossy(&body));
});

/// The top-level members, names decoded as Go decodes them, in order, repeats kept.
struct GoCall<'a>(Vec<(String, &'a RawValue)>);

impl<'a> GoCall<'a> {
    /// The value Go stores in the struct field `name`: the last member whose name folds to it.
    fn field(&self, name: &str) -> Option<&'a str> {
        self.0.iter().rev().find(|(member, _)| fold(member) == fold(name)).map(|(_, value)| value.get())
    }
}

/// Go's comparison of member names: per rune, the smallest rune of its case-fold set (ASCII:
/// upper case; `ſ` is `S`, the Kelvin sign `K`).
fn fold(name: &str) -> String {
    name.chars().flat_map(char::to_lowercase).flat_map(char::to_uppercase).collect()
}

fn go_read(body: &[u8]) -> Option<GoCall<'_>> {
    struct Members;
    impl<'de> Visitor<'de> for Members {
        type Value = GoCall<'de>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("an object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut members = Vec::new();
            while let Some(name) = map.next_key::<String>()? {
                members.push((name, map.next_value::<&RawValue>()?));
            }
            Ok(GoCall(members))
        }
    }
    serde_json::Deserializer::from_slice(body).deserialize_map(Members).ok()
}

/// No object in `value` has two distinct names that fold alike (Go would fill one field from
/// either).
fn no_confusable_names(value: &serde_json::Value) -> bool {
    match value {
        serde_json::Value::Array(items) => items.iter().all(no_confusable_names),
        serde_json::Value::Object(object) => {
            let names: Vec<String> = object.keys().map(|name| fold(name)).collect();
            let mut unique = names.clone();
            unique.sort();
            unique.dedup();
            unique.len() == names.len() && object.values().all(no_confusable_names)
        }
        _ => true,
    }
}
