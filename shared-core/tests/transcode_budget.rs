//! The transcode budget, which every exchange of the process shares (so in a test binary of its
//! own, and one test, so that nothing else holds a share meanwhile): a witness whose transcode
//! would pass it goes out as it came, one without a length takes its share as it grows, and what
//! an exchange took comes back when it ends, however it ends.

mod common;

use std::sync::Arc;

use common::{run, witness_answer_head, Exchange1};
use rpcedge_core::transcode::WitnessStream;
use rpcedge_core::{Config, Exchange, Settings, TranscodeOutcome};

const CALL: &[u8] = br#"{"jsonrpc":"2.0","id":3,"method":"debug_executionWitness","params":["0x1"]}"#;

fn body() -> Vec<u8> {
    let items: Vec<String> = (0..2000).map(|i| format!(r#""0x{:064x}""#, i)).collect();
    format!(
        r#"{{"jsonrpc":"2.0","id":3,"result":{{"state":[{}],"codes":[],"keys":[],"headers":[]}}}}"#,
        items.join(",")
    )
    .into_bytes()
}

fn spec(body: &[u8]) -> Exchange1<'_> {
    let mut spec = Exchange1::json(body, true);
    spec.request_headers.push(("Accept", "application/octet-stream"));
    spec.request_body = CALL.to_vec();
    spec
}

/// An exchange stopped after half its body, holding its share.
fn half_way(settings: &Arc<Settings>, body: &[u8]) -> Exchange {
    let mut ex = witness_answer_head(settings, Some(body.len()));
    ex.feed(&body[..body.len() / 2], false, false, 0).unwrap();
    ex
}

#[test]
fn a_transcode_past_the_budget_goes_out_as_it_came_and_a_share_comes_back_when_its_exchange_ends() {
    let body = body();
    let one = WitnessStream::most_held(body.len() as u64);
    let config =
        Config { transcode: true, transcode_hold_max: 1000, transcode_budget: one + one / 2, ..Config::default() };
    let settings = Arc::new(config.validate().unwrap());
    let alone = run(&settings, &spec(&body)).unwrap();
    assert_eq!(alone.transcode, TranscodeOutcome::Transcoded);

    let first = half_way(&settings, &body);
    let second = run(&settings, &spec(&body)).unwrap();
    assert_eq!(second.transcode, TranscodeOutcome::Refused);
    assert!(second.edits.content_type.is_none() && second.decoded() == body, "as it came");
    // the client went away: its share comes back
    drop(first);
    assert!(run(&settings, &spec(&body)).unwrap().body == alone.body);

    // a body held whole takes twice its length, chunk by chunk, and gives it back at the end
    let budget = body.len() as u64 * 5 / 2;
    let config = Config { transcode_hold_max: 1 << 20, transcode_budget: budget, ..Config::clone(&settings) };
    let held = Arc::new(config.validate().unwrap());
    let holding = half_way(&held, &body);
    assert_eq!(run(&held, &spec(&body)).unwrap().transcode, TranscodeOutcome::Refused);
    drop(holding);
    assert_eq!(run(&held, &spec(&body)).unwrap().transcode, TranscodeOutcome::Transcoded);

    // without a length, past transcode_hold_max: a share as it grows; where the budget ends, the
    // JSON is gone and the exchange fails
    let config = Config { transcode_budget: WitnessStream::most_held(body.len() as u64 / 2), ..Config::clone(&settings) };
    let small = Arc::new(config.validate().unwrap());
    let mut unsized_spec = spec(&body);
    unsized_spec.content_length = None;
    assert_eq!(run(&settings, &unsized_spec).unwrap().transcode, TranscodeOutcome::Transcoded);
    let mut ex = witness_answer_head(&small, None);
    let failed = body.chunks(1000).map(|chunk| ex.feed(chunk, false, false, 0).map(|_| ())).find_map(Result::err);
    assert!(matches!(failed, Some(rpcedge_core::Error::Transcode(ref e)) if e.to_string().contains("transcode_budget")), "{failed:?}");
    assert_eq!(ex.failure(), rpcedge_core::Failure::Respond(502));
    drop(ex);
    // (a share of 2 MiB and more, which the held body's budget would not leave room beside)
    assert_eq!(run(&held, &spec(&body)).unwrap().transcode, TranscodeOutcome::Transcoded, "its share came back");
}
