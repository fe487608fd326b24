//! The compression rules, one exchange at a time, as a client sees them.

mod common;

use std::sync::Arc;

use common::{chunked, run, Chunk, Exchange1};
use rpcedge_core::dictionary::DICTIONARY;
use sha2::{Digest, Sha256};
use rpcedge_core::edits::EncodingVary;
use rpcedge_core::{BodyPlan, Coding, Config, Error, EtagEdit, Exchange, Failure, HeaderEdits, HeaderOp, LengthEdit, Level, Mode, Settings};

fn settings() -> Arc<Settings> {
    Arc::new(Settings::default())
}

/// What the edits add to Vary, in one field line.
fn vary(edits: &HeaderEdits) -> Option<&'static str> {
    let ops = edits.operations(EncodingVary::InLine);
    ops.into_iter().find_map(|op| match op {
        HeaderOp::Append("vary", vary) => Some(vary),
        _ => None,
    })
}

/// A JSON-ish body that compresses well, of exactly `n` bytes.
fn json_body(n: usize) -> Vec<u8> {
    let unit = br#"{"blockHash":"0x8f1c2d3e4b5a69788796a5b4c3d2e1f0","gasUsed":"0x5208"},"#;
    unit.iter().cycle().take(n).copied().collect()
}

fn noise(n: usize) -> Vec<u8> {
    let mut x: u64 = 0x2545f4914f6cdd1d;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[test]
fn small_known_length_passes_with_its_own_length() {
    let body = json_body(1023);
    let wire = run(&settings(), &Exchange1::json(&body, true)).unwrap();
    assert_eq!((wire.plan, wire.mode), (BodyPlan::Pass, Mode::Small));
    assert_eq!(wire.content_length, Some(1023));
    assert_eq!(wire.edits.content_encoding, None);
    assert!(wire.edits.add_vary, "Vary goes on every eligible response");
    assert_eq!(wire.body, body);
}

#[test]
fn known_length_within_max_buffer_is_compressed_whole_with_exact_length() {
    for n in [1024, 20_000, 1 << 20] {
        let body = json_body(n);
        let wire = run(&settings(), &Exchange1::json(&body, true)).unwrap();
        assert_eq!((wire.plan, wire.mode), (BodyPlan::Buffer, Mode::Oneshot), "{n}");
        assert_eq!(wire.edits.content_encoding, Some(Coding::Gzip));
        assert_eq!(wire.content_length, Some(wire.body.len() as u64));
        assert!(wire.body.len() < n / 4);
        assert_eq!(wire.decoded(), body);
    }
}

#[test]
fn known_length_above_max_buffer_streams_from_the_start() {
    let body = json_body((1 << 20) + 1);
    let mut spec = Exchange1::json(&body, true);
    spec.chunks = chunked(&body, &[100_000, 400_000, 900_000], 1);
    let wire = run(&settings(), &spec).unwrap();
    assert_eq!((wire.plan, wire.mode), (BodyPlan::Stream, Mode::Stream));
    assert_eq!(wire.content_length, None);
    assert_eq!(wire.decoded(), body);
}

#[test]
fn a_host_that_sends_the_head_first_gets_a_stream_where_a_body_would_be_buffered() {
    let settings = Arc::new(Config { transcode: true, ..Config::default() }.validate().unwrap());
    for (n, known) in [(20_000, true), (20_000, false), (3 << 20, true)] {
        let body = json_body(n);
        let mut spec = Exchange1::json(&body, known);
        spec.chunks = chunked(&body, &[5000, 9000], 1);
        spec.headers_at_head = true;
        let wire = run(&settings, &spec).unwrap();
        assert_eq!((wire.plan, wire.mode), (BodyPlan::Stream, Mode::Stream), "{n} {known}");
        assert_eq!((wire.edits.content_encoding, wire.content_length), (Some(Coding::Gzip), None));
        assert_eq!(wire.decoded(), body);
    }
    // small ones still pass; nothing is transcoded (that needs the whole body first)
    let body = json_body(500);
    let mut spec = Exchange1::json(&body, true);
    spec.headers_at_head = true;
    assert_eq!(run(&settings, &spec).unwrap().plan, BodyPlan::Pass);
    let witness = br#"{"jsonrpc":"2.0","id":1,"result":{"state":["0xaa"],"codes":[],"keys":[],"headers":[]}}"#;
    let mut spec = Exchange1::json(witness, true);
    spec.request_headers.push(("Accept", "application/octet-stream"));
    spec.request_body = br#"{"jsonrpc":"2.0","id":1,"method":"debug_executionWitness","params":["0x1"]}"#.to_vec();
    spec.headers_at_head = true;
    let wire = run(&settings, &spec).unwrap();
    assert_eq!((wire.plan, wire.edits.content_type, wire.body.as_slice()), (BodyPlan::Pass, None, &witness[..]));
}

#[test]
fn chunked_body_ending_within_max_buffer_gets_an_exact_length() {
    let body = json_body(300_000);
    let mut spec = Exchange1::json(&body, false);
    spec.chunks = chunked(&body, &[1, 8_000, 65_536, 200_000], 5);
    let wire = run(&settings(), &spec).unwrap();
    assert_eq!((wire.plan, wire.mode), (BodyPlan::Buffer, Mode::Oneshot));
    assert_eq!(wire.content_length, Some(wire.body.len() as u64));
    assert_eq!(wire.decoded(), body);

    // Below min_length it goes out as it was, but still with its exact length.
    let small = json_body(700);
    let mut spec = Exchange1::json(&small, false);
    spec.chunks = chunked(&small, &[100, 300], 5);
    let wire = run(&settings(), &spec).unwrap();
    assert_eq!(wire.mode, Mode::Small);
    assert_eq!(wire.edits.content_length, LengthEdit::Set(700));
    assert_eq!(wire.body, small);
}

#[test]
fn chunked_body_passing_max_buffer_streams() {
    let body = json_body(3 << 20);
    let mut spec = Exchange1::json(&body, false);
    spec.chunks = chunked(&body, &(1..48).map(|i| i * 65_536).collect::<Vec<_>>(), 1);
    let wire = run(&settings(), &spec).unwrap();
    assert_eq!(wire.mode, Mode::Stream);
    assert_eq!(wire.content_length, None);
    assert_eq!(wire.edits.content_length, LengthEdit::Remove);
    assert_eq!(wire.decoded(), body);
}

#[test]
fn an_upstream_flush_switches_to_streaming_and_is_passed_on() {
    let body = json_body(10_000);
    let mut spec = Exchange1::json(&body, false);
    spec.chunks = chunked(&body, &[3_000], 1);
    spec.chunks[0].flush = true;
    let settings = settings();
    let wire = run(&settings, &spec).unwrap();
    assert_eq!(wire.mode, Mode::Stream);
    assert_eq!(wire.decoded(), body);
    // What left at the flush decodes to exactly the first chunk.
    let first = wire.sends[0].1;
    let mut inflate = flate2::Decompress::new(false);
    let mut plain = vec![0; 10_000];
    inflate.decompress(&wire.body[10..first], &mut plain, flate2::FlushDecompress::Sync).unwrap();
    assert_eq!(&plain[..inflate.total_out() as usize], &body[..3_000]);
}

/// What a stream decodes to up to where it stops (a flush), as a browser's decoder shows it.
fn decode_prefix(coding: Coding, data: &[u8]) -> Vec<u8> {
    use std::io::Read;
    let mut reader: Box<dyn Read + '_> = match coding {
        Coding::Gzip => Box::new(flate2::read::GzDecoder::new(data)),
        Coding::Deflate => Box::new(flate2::read::ZlibDecoder::new(data)),
        Coding::Zstd => Box::new(zstd::stream::read::Decoder::new(data).unwrap()),
        Coding::Br => Box::new(brotli::Decompressor::new(data, 4096)),
        Coding::Dcz => Box::new(zstd::stream::read::Decoder::with_dictionary(&data[40..], DICTIONARY).unwrap()),
    };
    let (mut out, mut buf) = (Vec::new(), [0; 4096]);
    while let Ok(n @ 1..) = reader.read(&mut buf) {
        out.extend_from_slice(&buf[..n]);
    }
    out
}

#[test]
fn every_coding_goes_whole_with_an_exact_length_or_streams_with_each_flush_passed_on() {
    use Coding::*;
    let chromium = "gzip, deflate, br, zstd";
    for (accept, coding) in
        [(chromium, Zstd), ("br", Br), ("gzip, br", Gzip), ("zstd;q=0, br;q=0.5, gzip;q=0.4", Br), ("gzip", Gzip), ("deflate", Deflate)]
    {
        for n in [1024, 50_000] {
            let body = json_body(n);
            let mut spec = Exchange1::json(&body, true);
            spec.request_headers = vec![("Accept-Encoding", accept)];
            let wire = run(&settings(), &spec).unwrap();
            assert_eq!((wire.mode, wire.edits.content_encoding), (Mode::Oneshot, Some(coding)), "{accept} {n}");
            assert_eq!(wire.content_length, Some(wire.body.len() as u64), "{accept} {n}");
            assert!(wire.body.len() < n / 4, "{accept} {n}: {}", wire.body.len());
            assert_eq!(wire.decoded(), body, "{accept} {n}");
        }
        // chunked, flushed after 3,000 bytes, then past max_buffer
        let body = json_body((1 << 20) + 50_000);
        let mut spec = Exchange1::json(&body, false);
        spec.request_headers = vec![("Accept-Encoding", accept)];
        spec.chunks = chunked(&body, &[3_000, 500_000], 1);
        spec.chunks[0].flush = true;
        let wire = run(&settings(), &spec).unwrap();
        assert_eq!((wire.mode, wire.edits.content_encoding, wire.content_length), (Mode::Stream, Some(coding), None), "{accept}");
        assert_eq!(decode_prefix(coding, &wire.body[..wire.sends[0].1]), &body[..3_000], "{accept}");
        assert_eq!(wire.decoded(), body, "{accept}");
    }
    // the operator's order decides among codings a client weighs alike, and only those are made
    let gzip_first = Arc::new(Config { encodings: vec![Gzip, Zstd], ..Config::default() }.validate().unwrap());
    let body = json_body(20_000);
    for (accept, coding) in [(chromium, Some(Gzip)), ("zstd", Some(Zstd)), ("br", None), ("br, gzip;q=0.1", Some(Gzip))] {
        let mut spec = Exchange1::json(&body, true);
        spec.request_headers = vec![("Accept-Encoding", accept)];
        let wire = run(&gzip_first, &spec).unwrap();
        assert_eq!(wire.edits.content_encoding, coding, "{accept}");
        assert!(wire.edits.add_vary, "{accept}");
        assert_eq!(wire.decoded(), body, "{accept}");
    }
}

#[test]
fn a_flush_below_min_length_does_not_stream_a_small_answer() {
    // A 35-byte answer, flushed as it is written (nginx marks every buffer as a flush with
    // proxy_buffering off): it goes out whole, untouched, with its exact length.
    let small = br#"{"jsonrpc":"2.0","id":1,"result":1}"#;
    let mut spec = Exchange1::json(small, false);
    spec.chunks = chunked(small, &[10, 20], 1);
    for chunk in &mut spec.chunks {
        chunk.flush = true;
    }
    let wire = run(&settings(), &spec).unwrap();
    assert_eq!(wire.mode, Mode::Small);
    assert_eq!(wire.edits.content_encoding, None);
    assert_eq!(wire.content_length, Some(small.len() as u64));
    assert_eq!(wire.body, small);

    // Flushed pieces of a body that ends in time: one shot, exact length.
    let body = json_body(5_000);
    let mut spec = Exchange1::json(&body, false);
    spec.chunks = chunked(&body, &[300, 600, 900], 20);
    for chunk in &mut spec.chunks {
        chunk.flush = true;
    }
    let wire = run(&settings(), &spec).unwrap();
    assert_eq!(wire.mode, Mode::Oneshot);
    assert_eq!(wire.content_length, Some(wire.body.len() as u64));
    assert_eq!(wire.decoded(), body);

    // A bare flush with nothing held changes nothing.
    let mut spec = Exchange1::json(&body, false);
    spec.chunks = vec![Chunk { data: Vec::new(), flush: true, at_ms: 0 }, Chunk { data: body.clone(), flush: false, at_ms: 1 }];
    assert_eq!(run(&settings(), &spec).unwrap().mode, Mode::Oneshot);
}

#[test]
fn a_small_flushed_piece_goes_out_within_stream_delay_of_its_flush() {
    // 300 bytes flushed at 0 ms, then a steady trickle every 60 ms: without the flush's own
    // deadline, the pauses (each under stream_delay) would hold the first bytes to the end.
    let body = json_body(1_500);
    let mut spec = Exchange1::json(&body, false);
    spec.chunks = chunked(&body, &[300, 400, 500, 600, 700, 800], 60);
    spec.chunks[0].flush = true;
    let wire = run(&settings(), &spec).unwrap();
    assert_eq!(wire.mode, Mode::Stream);
    assert_eq!(wire.decoded(), body);
    let (first_at, _) = wire.sends[0];
    assert!(first_at <= 100, "the flushed bytes waited {first_at} ms: {:?}", wire.sends);
}

#[test]
fn failures_answer_with_502_before_the_headers_and_reset_after() {
    // A declared length overrun while the headers are held.
    let body = json_body(5_000);
    let mut ex = Exchange::new(settings(), Arc::default());
    ex.request_header(b"Accept-Encoding", b"gzip");
    ex.response_header(b"Content-Type", b"application/json");
    ex.response_header(b"Content-Length", b"4000");
    assert_eq!(ex.response_head(200), BodyPlan::Buffer);
    assert!(ex.feed(&body, false, false, 0).is_err());
    assert_eq!((ex.failure(), ex.mode()), (Failure::Respond(502), Mode::Failed));

    // The headers went out with the stream: an abort resets.
    let mut ex = Exchange::new(settings(), Arc::default());
    ex.request_header(b"Accept-Encoding", b"gzip");
    ex.response_header(b"Content-Type", b"application/json");
    assert_eq!(ex.response_head(200), BodyPlan::Buffer);
    ex.feed(&body[..2_000], false, false, 0).unwrap();
    assert_eq!(ex.deadline(), Some(100));
    let out = ex.feed(&[], false, false, 100).unwrap();
    assert!(out.headers.is_some() && !out.data.is_empty(), "the pause released the headers");
    assert_eq!(ex.abort(), Failure::Reset);
    assert!(ex.feed(&body[2_000..], true, false, 150).is_err(), "nothing after a failure");

    // Passed through untouched: the headers are out at once.
    let mut ex = Exchange::new(settings(), Arc::default());
    assert_eq!(ex.response_head(200), BodyPlan::Pass);
    assert_eq!(ex.abort(), Failure::Reset);
}

#[test]
fn a_trickling_body_reaches_the_client_chunk_by_chunk_within_stream_delay() {
    let body = json_body(4 * 2_000);
    let mut spec = Exchange1::json(&body, false);
    spec.chunks = chunked(&body, &[2_000, 4_000, 6_000], 500);
    let wire = run(&settings(), &spec).unwrap();
    assert_eq!(wire.mode, Mode::Stream);
    assert_eq!(wire.decoded(), body);
    // Each chunk arrived at i*500 ms; something left for it no later than 100 ms after.
    for arrival in [0, 500, 1000, 1500] {
        assert!(
            wire.sends.iter().any(|&(at, n)| n > 0 && at >= arrival && at <= arrival + 100),
            "nothing sent within 100 ms of the chunk at {arrival} ms: {:?}",
            wire.sends
        );
    }
}

#[test]
fn incompressible_bodies_go_out_as_they_were() {
    let body = noise(50_000);
    for known in [true, false] {
        let wire = run(&settings(), &Exchange1::json(&body, known)).unwrap();
        assert_eq!(wire.mode, Mode::Incompressible);
        assert_eq!(wire.edits.content_encoding, None);
        assert_eq!(wire.content_length, Some(50_000));
        assert_eq!(wire.body, body);
    }
}

/// A named change to an exchange's spec.
type Variation = (&'static str, Box<dyn Fn(&mut Exchange1)>);

#[test]
fn ineligible_responses_are_untouched() {
    let body = json_body(5_000);
    let cases: Vec<Variation> = vec![
        ("HEAD", Box::new(|s| s.method = "HEAD")),
        ("204", Box::new(|s| s.status = 204)),
        ("304", Box::new(|s| s.status = 304)),
        ("206", Box::new(|s| s.status = 206)),
        ("Content-Range", Box::new(|s| s.response_headers.push(("Content-Range", "bytes 0-4999/9999".into())))),
        ("encoded", Box::new(|s| s.response_headers.push(("Content-Encoding", "br".into())))),
        ("no-transform", Box::new(|s| s.response_headers.push(("Cache-Control", "public, No-Transform".into())))),
        ("type", Box::new(|s| s.response_headers[0].1 = "application/octet-stream".into())),
        ("no type", Box::new(|s| s.response_headers.clear())),
        ("no Accept-Encoding", Box::new(|s| s.request_headers.clear())),
        ("identity only", Box::new(|s| s.request_headers[0].1 = "identity, gzip;q=0")),
        ("bad length", Box::new(|s| s.response_headers.push(("Content-Length", "12a".into())))),
    ];
    for (name, edit) in cases {
        let mut spec = Exchange1::json(&body, true);
        edit(&mut spec);
        let wire = run(&settings(), &spec).unwrap();
        assert_eq!((wire.plan, wire.mode), (BodyPlan::Pass, Mode::Untouched), "{name}");
        assert_eq!(wire.edits.content_encoding, None, "{name}");
        assert_eq!(wire.edits.content_length, LengthEdit::Keep, "{name}");
        assert_eq!(wire.body, body, "{name}");
    }
}

#[test]
fn vary_etag_and_accept_ranges() {
    let body = json_body(5_000);
    let mut spec = Exchange1::json(&body, true);
    spec.response_headers.push(("ETag", "\"v1\"".into()));
    spec.response_headers.push(("Accept-Ranges", "bytes".into()));
    let wire = run(&settings(), &spec).unwrap();
    assert!(wire.edits.add_vary);
    assert_eq!(wire.edits.etag, EtagEdit::Set(b"W/\"v1\"".to_vec()));
    assert!(wire.edits.remove_accept_ranges);

    // A weak ETag stays; a Vary that already covers Accept-Encoding is not repeated.
    spec.response_headers.push(("Vary", "Origin, accept-encoding".into()));
    spec.response_headers[1].1 = "W/\"v1\"".into();
    let wire = run(&settings(), &spec).unwrap();
    assert!(!wire.edits.add_vary);
    assert_eq!(wire.edits.etag, EtagEdit::Keep);

    // Sent as identity: Vary yes, the ETag and Accept-Ranges stay as they were.
    let mut spec = Exchange1::json(&body, true);
    spec.request_headers.clear();
    spec.response_headers.push(("ETag", "\"v1\"".into()));
    let wire = run(&settings(), &spec).unwrap();
    assert!(wire.edits.add_vary);
    assert_eq!(wire.edits.etag, EtagEdit::Keep);
    assert!(!wire.edits.remove_accept_ranges);

    // Not an eligible type: no Vary.
    spec.response_headers[0].1 = "image/png".into();
    assert!(!run(&settings(), &spec).unwrap().edits.add_vary);
}

#[test]
fn a_compressed_body_has_a_weak_etag_or_none() {
    let body = json_body(5_000);
    for (etag, edit) in [
        ("\"v1\"", EtagEdit::Set(b"W/\"v1\"".to_vec())),
        ("\"\"", EtagEdit::Set(b"W/\"\"".to_vec())),
        ("W/\"v1\"", EtagEdit::Keep),
        ("v1", EtagEdit::Remove),
        ("\"v1", EtagEdit::Remove),
        ("\"", EtagEdit::Remove),
        ("w/\"v1\"", EtagEdit::Remove),
        ("W/v1", EtagEdit::Remove),
        ("\"a\"b\"", EtagEdit::Remove),
        ("", EtagEdit::Remove),
    ] {
        for known in [true, false] {
            let mut spec = Exchange1::json(&body, known);
            spec.response_headers.push(("ETag", etag.into()));
            let wire = run(&settings(), &spec).unwrap();
            assert_eq!(wire.mode, Mode::Oneshot);
            assert_eq!(wire.edits.etag, edit, "{etag}");
        }
    }
}

#[test]
fn deflate_when_preferred() {
    let body = json_body(5_000);
    let mut spec = Exchange1::json(&body, true);
    spec.request_headers[0].1 = "gzip;q=0.5, deflate";
    let wire = run(&settings(), &spec).unwrap();
    assert_eq!(wire.edits.content_encoding, Some(Coding::Deflate));
    assert_eq!(wire.decoded(), body);
}

#[test]
fn a_body_that_contradicts_its_content_length_fails_the_exchange() {
    let body = json_body(5_000);
    let mut short = Exchange1::json(&body, true);
    short.content_length = Some(6_000);
    assert_eq!(
        run(&settings(), &short).unwrap_err(),
        Error::LengthMismatch { declared: 6_000, received: 5_000 }
    );
    let mut long = Exchange1::json(&body, true);
    long.content_length = Some(4_000);
    long.chunks = chunked(&body, &[2_000], 1);
    assert!(matches!(run(&settings(), &long), Err(Error::LengthMismatch { declared: 4_000, .. })));

    // Streamed from the head (a length above max_buffer), a short body still fails rather than
    // ending as a whole gzip member (the exchange fuzzer finds this within seconds without the check).
    let big = json_body((1 << 20) + 10);
    let mut short = Exchange1::json(&big, true);
    short.content_length = Some((1 << 20) + 100);
    short.chunks = chunked(&big, &[300_000, 700_000], 1);
    assert_eq!(
        run(&settings(), &short).unwrap_err(),
        Error::LengthMismatch { declared: (1 << 20) + 100, received: (1 << 20) + 10 }
    );
}

#[test]
fn levels_and_thresholds_come_from_the_config() {
    let config = Config { min_length: 10, max_buffer: 1_000, level: Level::Fixed(1), stream_delay_ms: 0, ..Config::default() };
    let settings = Arc::new(config.validate().unwrap());
    let body = json_body(500);
    let wire = run(&settings, &Exchange1::json(&body, true)).unwrap();
    assert_eq!(wire.mode, Mode::Oneshot);
    let big = json_body(1_001);
    let wire = run(&settings, &Exchange1::json(&big, true)).unwrap();
    assert_eq!(wire.mode, Mode::Stream);
    // With no stream delay, a chunked body streams as soon as the timer can fire.
    let mut spec = Exchange1::json(&body, false);
    spec.chunks = vec![
        Chunk { data: body[..300].to_vec(), flush: false, at_ms: 0 },
        Chunk { data: body[300..].to_vec(), flush: false, at_ms: 5 },
    ];
    let wire = run(&settings, &spec).unwrap();
    assert_eq!(wire.mode, Mode::Stream);
    assert_eq!(wire.decoded(), body);
}

/// What a client gets from an exchange with offloading on, and whether a job was handed out.
struct Offloaded {
    edits: Option<HeaderEdits>,
    body: Vec<u8>,
    mode: Mode,
    job: bool,
}

/// Runs `spec` with offloading on, each job on a thread of its own as a host's pool would.
fn run_offloaded(spec: &Exchange1) -> Offloaded {
    let mut ex = Exchange::new(settings(), Arc::default());
    ex.offload_whole_bodies();
    ex.request_header(b"Accept-Encoding", spec.request_headers[0].1.as_bytes());
    ex.response_header(b"Content-Type", b"application/json");
    if let Some(n) = spec.content_length {
        ex.response_header(b"Content-Length", n.to_string().as_bytes());
    }
    assert_eq!(ex.response_head(200), BodyPlan::Buffer);
    let mut wire = Offloaded { edits: None, body: Vec::new(), mode: Mode::Pending, job: false };
    let last = spec.chunks.len() - 1;
    for (i, chunk) in spec.chunks.iter().enumerate() {
        let out = ex.feed(&chunk.data, i == last, false, 0).unwrap();
        let (edits, data, work) = (out.headers.cloned(), out.data.to_vec(), out.work);
        if work {
            assert!(edits.is_none() && data.is_empty() && !out.end, "nothing goes out before the job is back");
            assert_eq!(ex.deadline(), None);
            let mut job = ex.take_whole_body().expect("a job");
            assert!(ex.take_whole_body().is_none(), "taken once");
            job = std::thread::spawn(move || {
                job.run();
                job
            })
            .join()
            .unwrap();
            let out = ex.complete_whole_body(job).unwrap();
            assert!(out.end && out.flush && !out.work);
            wire.edits = out.headers.cloned();
            wire.body = out.data.to_vec();
            wire.job = true;
        } else if edits.is_some() || !data.is_empty() {
            wire.edits = edits;
            wire.body.extend_from_slice(&data);
        }
    }
    wire.mode = ex.mode();
    wire
}

#[test]
fn offloaded_whole_bodies_give_the_same_bytes_as_inline() {
    let offload_min_length = settings().offload_min_length;
    let cases: [(Vec<u8>, &str, bool); 5] = [
        (json_body(offload_min_length as usize), "gzip", true),
        (json_body(1 << 20), "gzip", true),
        (json_body(400_000), "deflate", false),
        (noise(300_000), "gzip", true),
        (json_body(offload_min_length as usize - 1), "gzip", true),
    ];
    for (body, coding, known) in cases {
        let mut spec = Exchange1::json(&body, known);
        spec.request_headers = vec![("Accept-Encoding", coding)];
        if !known {
            spec.chunks = chunked(&body, &[4096, 65_536, 200_000], 0);
        }
        let inline = run(&settings(), &spec).unwrap();
        let offloaded = run_offloaded(&spec);
        let n = body.len();
        assert_eq!(offloaded.job, n as u64 >= offload_min_length, "{n}");
        assert_eq!(offloaded.edits.as_ref(), Some(&inline.edits), "{n}");
        assert_eq!((offloaded.body, offloaded.mode), (inline.body, inline.mode), "{n}");
    }
}

#[test]
fn a_job_given_back_unrun_is_run_then() {
    let body = json_body(300_000);
    let mut ex = Exchange::new(settings(), Arc::default());
    ex.offload_whole_bodies();
    ex.request_header(b"Accept-Encoding", b"gzip");
    ex.response_header(b"Content-Type", b"application/json");
    ex.response_head(200);
    assert!(ex.feed(&body, true, false, 0).unwrap().work);
    let job = ex.take_whole_body().unwrap();
    let out = ex.complete_whole_body(job).unwrap();
    assert_eq!(common::decode(Some(Coding::Gzip), out.data), body);
    assert_eq!(ex.mode(), Mode::Oneshot);
    assert!(ex.feed(b"more", true, false, 0).is_err(), "nothing after the end");
}

#[test]
fn without_offloading_large_bodies_are_compressed_inline() {
    let body = json_body(1 << 20);
    let mut ex = Exchange::new(settings(), Arc::default());
    ex.request_header(b"Accept-Encoding", b"gzip");
    ex.response_header(b"Content-Type", b"application/json");
    ex.response_head(200);
    let out = ex.feed(&body, true, false, 0).unwrap();
    assert!(out.end && !out.work && out.headers.is_some());
    assert!(ex.take_whole_body().is_none());
}

fn encode(coding: Coding, body: &[u8]) -> Vec<u8> {
    use std::io::Write;
    match coding {
        Coding::Gzip => {
            let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
            encoder.write_all(body).unwrap();
            encoder.finish().unwrap()
        }
        Coding::Deflate => {
            let mut encoder = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
            encoder.write_all(body).unwrap();
            encoder.finish().unwrap()
        }
        Coding::Zstd => zstd::encode_all(body, 3).unwrap(),
        Coding::Br => {
            let mut encoder = brotli::CompressorWriter::new(Vec::new(), 4096, 5, 22);
            encoder.write_all(body).unwrap();
            encoder.into_inner()
        }
        Coding::Dcz => {
            let frame = zstd::bulk::Compressor::with_dictionary(3, DICTIONARY).unwrap().compress(body).unwrap();
            let magic = [0x5e, 0x2a, 0x4d, 0x18, 0x20, 0x00, 0x00, 0x00];
            [&magic[..], &Sha256::digest(DICTIONARY), &frame].concat()
        }
    }
}

/// What makes a POST a JSON-RPC call.
const JSON_CALL: (&str, &str) = ("Content-Type", "application/json");

/// A node (or middlebox) that compresses although it was asked for identity.
fn encoded_regardless(body: &[u8], coding: Coding, known_length: bool) -> Exchange1<'static> {
    let encoded = encode(coding, body);
    let mut spec = Exchange1::json(&encoded, known_length);
    spec.response_headers.push(("Content-Encoding", coding.token().into()));
    spec.response_headers.push(("ETag", "\"node-gzip\"".into()));
    spec.chunks = encoded.chunks(3_000).map(|piece| Chunk { data: piece.to_vec(), flush: false, at_ms: 0 }).collect();
    spec
}

#[test]
fn an_answer_encoded_regardless_is_decoded_where_rpcedge_has_work_on_it() {
    let body = json_body(60_000);
    for coding in [Coding::Gzip, Coding::Deflate] {
        for known_length in [true, false] {
            let wire = run(&settings(), &encoded_regardless(&body, coding, known_length)).unwrap();
            let what = format!("{coding:?}, known length {known_length}");
            assert_eq!((wire.plan, wire.mode), (BodyPlan::Buffer, Mode::Oneshot), "{what}");
            assert!(wire.edits.remove_content_encoding, "{what}");
            assert_eq!(wire.edits.content_encoding, Some(Coding::Gzip), "{what}");
            assert_eq!(wire.edits.content_length, LengthEdit::Set(wire.body.len() as u64), "{what}");
            // the node's strong tag named its own gzip: weakened, as for any body compressed here
            assert_eq!(wire.edits.etag, EtagEdit::Set(b"W/\"node-gzip\"".to_vec()), "{what}");
            assert_eq!(wire.decoded(), body, "{what}");
        }
    }
    // a small one: decoded, and sent plain with its own length
    let small = json_body(600);
    let wire = run(&settings(), &encoded_regardless(&small, Coding::Gzip, true)).unwrap();
    assert_eq!((wire.mode, wire.edits.content_encoding), (Mode::Small, None));
    assert!(wire.edits.remove_content_encoding);
    assert_eq!(wire.edits.etag, EtagEdit::Remove, "the node's tag named its gzip, not this body");
    assert_eq!((wire.body.clone(), wire.edits.content_length), (small.clone(), LengthEdit::Set(600)));
    // a client that takes the node's coding and none that rpcedge makes, nothing else to do: as it came
    let mut spec = encoded_regardless(&body, Coding::Gzip, true);
    spec.request_headers = vec![("Accept-Encoding", "gzip"), JSON_CALL];
    let gzip_only = Arc::new(Config { encodings: vec![Coding::Zstd], ..Config::default() }.validate().unwrap());
    let wire = run(&gzip_only, &spec).unwrap();
    assert_eq!((wire.plan, wire.mode), (BodyPlan::Pass, Mode::Untouched));
    assert!(!wire.edits.remove_content_encoding);
    assert!(wire.edits.add_vary, "a client that takes no gzip gets it decoded");
    assert_eq!(wire.body, encode(Coding::Gzip, &body));
}

#[test]
fn an_answer_encoded_regardless_is_decoded_for_a_client_that_does_not_take_its_coding() {
    // a client that asked for identity, or for nothing, with nothing else to do on the answer:
    // decoded as it arrives, sent without a length, the whole answer and nothing more
    let body = json_body(60_000);
    for headers in [vec![], vec![("Accept-Encoding", "identity")], vec![("Accept-Encoding", "br;q=1, gzip;q=0")]] {
        for coding in [Coding::Gzip, Coding::Deflate] {
            for known_length in [true, false] {
                let mut spec = encoded_regardless(&body, coding, known_length);
                spec.request_headers = [&headers[..], &[JSON_CALL]].concat();
                let zstd_only = Arc::new(Config { encodings: vec![Coding::Zstd], ..Config::default() }.validate().unwrap());
                let wire = run(&zstd_only, &spec).unwrap();
                let what = format!("{headers:?}, {coding:?}, known length {known_length}");
                assert_eq!((wire.plan, wire.mode), (BodyPlan::Stream, Mode::Untouched), "{what}");
                assert!(wire.edits.remove_content_encoding && wire.edits.content_encoding.is_none(), "{what}");
                assert_eq!(wire.edits.content_length, LengthEdit::Remove, "{what}");
                assert!(wire.edits.add_vary && wire.edits.remove_accept_ranges, "{what}");
                assert_eq!(wire.edits.etag, EtagEdit::Remove, "the node's tag named its {coding:?}: {what}");
                assert_eq!(wire.body, body, "{what}");
            }
        }
    }
    // cut short, or longer than the node declared: a failure, never a body sent as whole
    let mut spec = encoded_regardless(&body, Coding::Gzip, true);
    spec.request_headers.retain(|&header| header == JSON_CALL);
    spec.chunks.pop();
    assert!(matches!(run(&settings(), &spec).unwrap_err(), Error::Decode(_) | Error::LengthMismatch { .. }));
    let mut spec = encoded_regardless(&body, Coding::Gzip, true);
    spec.request_headers.retain(|&header| header == JSON_CALL);
    spec.chunks.push(Chunk { data: b"more".to_vec(), flush: false, at_ms: 0 });
    assert!(run(&settings(), &spec).is_err());
}

/// Whether the node is asked for identity for a request of `method` to `path` with these headers.
fn asks_identity(method: &str, path: &str, headers: &[(&str, &str)], cached: bool) -> bool {
    let mut ex = Exchange::new(settings(), Arc::default());
    ex.request_method(method.as_bytes());
    ex.request_path(path.as_bytes());
    for (name, value) in headers {
        ex.request_header(name.as_bytes(), value.as_bytes());
    }
    if cached {
        ex.cache_may_keep();
    }
    ex.node_identity()
}

#[test]
fn only_a_request_for_the_node_or_one_the_cache_may_keep_asks_its_upstream_for_identity() {
    let gzip = ("Accept-Encoding", "gzip, br");
    let json = ("Content-Type", "application/json; charset=utf-8");
    // JSON-RPC, and Beacon-API reads after any prefix the proxy strips
    assert!(asks_identity("POST", "/", &[json, gzip], false));
    assert!(asks_identity("POST", "/mainnet", &[("Content-Type", "application/json-rpc"), gzip], false));
    assert!(asks_identity("GET", "/eth/v2/beacon/blocks/head", &[gzip], false));
    assert!(asks_identity("HEAD", "/beacon/eth/v1/node/syncing?x=1", &[gzip], false));
    // anything else goes to its upstream as the client sent it: pages, forms, uploads, other APIs
    for (method, path, headers) in [
        ("GET", "/index.html", vec![gzip]),
        ("GET", "/api/v2/blocks", vec![gzip]),
        ("GET", "/eth/vx/beacon/blocks/head", vec![gzip]),
        ("GET", "/page?next=/eth/v1/node/syncing", vec![gzip]),
        ("POST", "/eth/v1/beacon/blocks", vec![("Content-Type", "application/octet-stream"), gzip]),
        ("POST", "/form", vec![("Content-Type", "application/x-www-form-urlencoded"), gzip]),
        ("POST", "/", vec![gzip]),
        ("PUT", "/", vec![json, gzip]),
    ] {
        assert!(!asks_identity(method, path, &headers, false), "{method} {path} {headers:?}");
    }
    // what the cache may keep, whatever it is
    assert!(asks_identity("GET", "/index.html", &[gzip], true));
}

#[test]
fn an_encoded_answer_to_a_request_not_for_the_node_goes_out_as_it_came() {
    // a page its upstream gzipped: nginx's gunzip or Envoy's decompressor decides, not rpcedge
    let body = json_body(60_000);
    for headers in [vec![], vec![("Accept-Encoding", "gzip")]] {
        let mut spec = encoded_regardless(&body, Coding::Gzip, true);
        spec.method = "GET";
        spec.path = "/static/blocks.json";
        spec.request_headers = headers.clone();
        let wire = run(&settings(), &spec).unwrap();
        assert_eq!((wire.plan, wire.mode), (BodyPlan::Pass, Mode::Untouched), "{headers:?}");
        assert!(!wire.edits.remove_content_encoding && !wire.edits.add_vary, "{headers:?}");
        assert_eq!(wire.edits.etag, EtagEdit::Keep, "{headers:?}");
        assert_eq!(wire.body, encode(Coding::Gzip, &body), "{headers:?}");
    }
}

#[test]
fn an_answer_the_node_sent_in_zstd_br_or_dcz_goes_out_as_it_came() {
    // rpcedge decodes what nodes send regardless (gzip, deflate); another coding it leaves whole
    let body = json_body(60_000);
    for coding in [Coding::Zstd, Coding::Br, Coding::Dcz] {
        let mut spec = encoded_regardless(&body, coding, true);
        spec.request_headers = vec![("Accept-Encoding", "gzip, deflate, br, zstd")];
        let wire = run(&settings(), &spec).unwrap();
        assert_eq!((wire.plan, wire.mode), (BodyPlan::Pass, Mode::Untouched), "{coding:?}");
        assert!(!wire.edits.remove_content_encoding && wire.edits.content_encoding.is_none(), "{coding:?}");
        assert_eq!(wire.body, encode(coding, &body), "{coding:?}");
    }
}

#[test]
fn an_encoded_answer_that_decodes_past_the_bound_or_breaks_off_fails_the_exchange() {
    let body = json_body(60_000);
    // transcode_max bounds what an encoded answer may decode to
    let bounded = Arc::new(Config::from_json(br#"{"transcode_max": 50000}"#).unwrap());
    let error = run(&bounded, &encoded_regardless(&body, Coding::Gzip, true)).unwrap_err();
    assert!(matches!(&error, Error::Decode(why) if why.contains("decompression bomb")), "{error}");
    // a stream cut short: never sent as whole
    let mut spec = encoded_regardless(&body, Coding::Gzip, false);
    spec.chunks.pop();
    assert!(matches!(run(&settings(), &spec).unwrap_err(), Error::Decode(_)));
    // not gzip at all
    let mut spec = encoded_regardless(&body, Coding::Gzip, false);
    spec.chunks = vec![Chunk { data: body.clone(), flush: false, at_ms: 0 }];
    assert!(matches!(run(&settings(), &spec).unwrap_err(), Error::Decode(_)));
}

/// A small answer as a node sends it: a receipt, 690 bytes.
const RECEIPT: &[u8] = br#"{"jsonrpc":"2.0","id":1,"result":{"blockHash":"0x2c5c3b7a19a0d4f4a5c2e4b1f6b2e0a1d2c3b4a5968778695a4b3c2d1e0f9a8b","blockNumber":"0x13a5c71","contractAddress":null,"cumulativeGasUsed":"0x1b8a2f","effectiveGasPrice":"0x4a817c800","from":"0x95222290dd7278aa3ddd389cc1e1d165cc4bafe5","gasUsed":"0x5208","logs":[],"logsBloom":"0x00000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000","status":"0x1","to":"0x388c818ca8b9251b393131c08a736a67ccb19297","transactionHash":"0x5e1f4b7c2a9d8e3f6a0b1c2d3e4f5a6b7c8d9e0f1a2b3c4d5e6f7a8b9c0d1e2f","transactionIndex":"0x7a","type":"0x2"}}"#;

/// A location that makes dcz, as the operator lists it.
fn with_dcz() -> Arc<Settings> {
    let encodings = [&[Coding::Dcz][..], &Coding::DEFAULT_ORDER].concat();
    Arc::new(Config { encodings, ..Config::default() }.validate().unwrap())
}

#[test]
fn a_client_with_the_dictionary_gets_dcz_small_answers_included() {
    use Coding::*;
    let ours = rpcedge_core::dictionary::available_dictionary();
    let other = format!(":{}:", "A".repeat(43) + "=");
    let chromium = "gzip, deflate, br, zstd, dcb, dcz";
    let small = RECEIPT;
    let zstd_alone = {
        let mut spec = Exchange1::json(small, true);
        spec.request_headers = vec![("Accept-Encoding", chromium)];
        let settings = Config { min_length: 0, ..Config::default() };
        run(&Arc::new(settings.validate().unwrap()), &spec).unwrap().body.len()
    };
    // (request headers, body, how it goes out, in which coding)
    type Case<'a> = (&'a [(&'a str, &'a str)], &'a [u8], Mode, Option<Coding>);
    let cases: [Case; 9] = [
        (&[("Accept-Encoding", chromium), ("Available-Dictionary", &ours)], small, Mode::Oneshot, Some(Dcz)),
        (&[("Accept-Encoding", chromium), ("Available-Dictionary", &ours)], &json_body(60_000), Mode::Oneshot, Some(Dcz)),
        // below dictionary_min_length
        (&[("Accept-Encoding", chromium), ("Available-Dictionary", &ours)], br#"{"jsonrpc":"2.0","id":1,"result":"0x1"}"#, Mode::Small, None),
        // another dictionary, none, or a list of two: what the client gets without one
        (&[("Accept-Encoding", chromium), ("Available-Dictionary", &other)], small, Mode::Small, None),
        (&[("Accept-Encoding", chromium)], &json_body(60_000), Mode::Oneshot, Some(Zstd)),
        (&[("Accept-Encoding", chromium), ("Available-Dictionary", &ours), ("Available-Dictionary", &ours)], small, Mode::Small, None),
        // the client must name dcz: `*` does not cover it, nor does a weight of 0
        (&[("Accept-Encoding", "*"), ("Available-Dictionary", &ours)], &json_body(60_000), Mode::Oneshot, Some(Gzip)),
        (&[("Accept-Encoding", "zstd, dcz;q=0"), ("Available-Dictionary", &ours)], &json_body(60_000), Mode::Oneshot, Some(Zstd)),
        (&[("Accept-Encoding", "dcz;q=0.5, zstd"), ("Available-Dictionary", &ours)], &json_body(60_000), Mode::Oneshot, Some(Zstd)),
    ];
    for (i, (headers, body, mode, coding)) in cases.into_iter().enumerate() {
        let mut spec = Exchange1::json(body, true);
        spec.request_headers = headers.to_vec();
        let wire = run(&with_dcz(), &spec).unwrap();
        assert_eq!((wire.mode, wire.edits.content_encoding), (mode, coding), "case {i}");
        assert_eq!(wire.content_length, Some(wire.body.len() as u64), "case {i}");
        assert_eq!(wire.decoded(), body, "case {i}");
        // whether dcz goes out depends on Available-Dictionary, for every answer that may be encoded
        assert_eq!(vary(&wire.edits), Some("Accept-Encoding, Available-Dictionary"), "case {i}");
    }
    let mut spec = Exchange1::json(small, true);
    spec.request_headers = vec![("Accept-Encoding", chromium), ("Available-Dictionary", &ours)];
    let dcz = run(&with_dcz(), &spec).unwrap().body.len();
    assert!(dcz * 10 < zstd_alone * 9, "the dictionary makes a small answer smaller: {dcz} against zstd's {zstd_alone}");
    // a location that does not make dcz (by default) does not vary on the dictionary
    let wire = run(&settings(), &spec).unwrap();
    assert_eq!((wire.mode, vary(&wire.edits)), (Mode::Small, Some("Accept-Encoding")));
}

#[test]
fn a_dcz_stream_passes_each_flush_on() {
    let ours = rpcedge_core::dictionary::available_dictionary();
    let body = json_body((1 << 20) + 50_000);
    let mut spec = Exchange1::json(&body, false);
    spec.request_headers = vec![("Accept-Encoding", "dcz, zstd"), ("Available-Dictionary", &ours)];
    spec.chunks = chunked(&body, &[3_000, 500_000], 1);
    spec.chunks[0].flush = true;
    let wire = run(&with_dcz(), &spec).unwrap();
    assert_eq!((wire.mode, wire.edits.content_encoding, wire.content_length), (Mode::Stream, Some(Coding::Dcz), None));
    assert_eq!(decode_prefix(Coding::Dcz, &wire.body[..wire.sends[0].1]), &body[..3_000]);
    assert_eq!(wire.decoded(), body);
}
