//! Every recorded request through the cache's decisions, and every answer it keeps back out as a
//! hit: the hit decodes to the recorded answer with the client's own id, in each coding a hit
//! splices (gzip, zstd, br) and plain.

mod common;

use std::collections::BTreeMap;

use rpcedge_core::cache::{encode, lookup, rule, CacheSettings, Entry, Head, MinLengths};
use rpcedge_core::negotiate::Coding;
use rpcedge_corpus::json::{self, Json};


/// Compact (request, response) pairs of the `.json` recordings (the `.tar` ones are the few huge
/// answers, which `max_entry` leaves out anyway), with the file they came from.
fn pairs() -> Vec<(String, Vec<u8>, Vec<u8>)> {
    let mut out = Vec::new();
    for method in std::fs::read_dir(common::corpus::dir().join("rpc")).expect("the corpus is there").flatten() {
        for file in std::fs::read_dir(method.path()).into_iter().flatten().flatten() {
            let path = file.path();
            if path.extension() != Some("json".as_ref()) {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            let Ok(Json::Array(items)) = json::parse(&text) else {
                continue;
            };
            for item in items {
                if let (Some(request), Some(response)) = (item.get("request"), item.get("response")) {
                    out.push((path.display().to_string(), request.to_compact(), response.to_compact()));
                }
            }
        }
    }
    out
}

#[test]
fn every_kept_answer_comes_back_whole_around_another_id() {
    let settings = CacheSettings::default();
    let pairs = pairs();
    let least = common::corpus::least(1_000, 100);
    assert!(pairs.len() > least, "only {} pairs: is the corpus there?", pairs.len());
    let mut outcomes: BTreeMap<String, usize> = BTreeMap::new();
    let mut same_envelope = 0;
    for (origin, request, response) in &pairs {
        let decision = lookup("corpus", request, &settings);
        let method = serde_json::from_slice::<serde_json::Value>(request)
            .ok()
            .and_then(|r| r.get("method").and_then(|m| m.as_str()).map(str::to_string));
        if method.as_deref().and_then(rule).is_none() {
            assert!(decision.is_err(), "{origin}: a method off the list was looked up");
        }
        let request = match decision {
            Ok(request) => request,
            Err(bypass) => {
                *outcomes.entry(format!("bypass {}", bypass.as_str())).or_default() += 1;
                continue;
            }
        };
        let capture = match request.capture(response, &settings) {
            Ok(capture) => capture,
            Err(refusal) => {
                // real nodes answer what was asked: a mismatch here is a wrong row of the table
                assert_ne!(refusal.as_str(), "mismatch", "{origin}: the answer does not name what was asked");
                *outcomes.entry(format!("refused {}", refusal.as_str())).or_default() += 1;
                continue;
            }
        };
        *outcomes.entry("kept".into()).or_default() += 1;
        let sent = encode(&capture.envelope, &Head::default(), &capture.tail);
        let stored = Entry::decode(&sent).unwrap().compact().unwrap();
        let entry = Entry::decode(&stored).unwrap();
        let expected = [capture.envelope.prefix("\"other-42\""), capture.tail.clone()].concat();
        for coding in [Coding::Gzip, Coding::Zstd, Coding::Br] {
            let hit = entry.respond("\"other-42\"", &[coding], MinLengths::NONE).unwrap();
            assert!(hit.coding.is_none_or(|made| made == coding), "{origin}: {coding:?} asked, {:?} made", hit.coding);
            *outcomes.entry(format!("hit {}", hit.coding.map_or("plain", Coding::token))).or_default() += 1;
            assert_eq!(common::decode(hit.coding, &hit.body), expected, "{origin} {coding:?}");
            assert!(hit.body.len() <= expected.len(), "{origin}: a hit larger than its plain form");
        }
        assert_eq!(entry.respond("\"other-42\"", &[], MinLengths::NONE).unwrap().body, expected, "{origin}");
        // With the recorded id, the node's own bytes (when its result is the last member).
        let own = [capture.envelope.prefix(&request.id), capture.tail.clone()].concat();
        same_envelope += usize::from(&own == response);
    }
    eprintln!("{outcomes:?}; {same_envelope} hits byte-identical to the recorded answer");
    assert!(outcomes.get("kept").copied().unwrap_or(0) > least * 3 / 10, "{outcomes:?}");
    assert!(same_envelope * 100 >= outcomes["kept"] * 98, "{same_envelope} of {outcomes:?}");
}
