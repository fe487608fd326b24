//! Whatever the body, chunking, flushes, timing, settings and Accept-Encoding: the client decodes
//! exactly the upstream body, and any Content-Length it is given is the number of bytes sent.

mod common;

use std::sync::Arc;

use common::{run, Chunk, Exchange1};
use proptest::prelude::*;
use rpcedge_core::{AcceptEncoding, Coding, Config, LengthEdit, Level, Mode};

fn body() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        // Compressible: few distinct bytes.
        prop::collection::vec(prop::sample::select(b"{}\":,0123456789abcdefx".to_vec()), 0..40_000),
        // Incompressible.
        prop::collection::vec(any::<u8>(), 0..6_000),
        // Long and repetitive, across max_buffer.
        (1usize..200_000).prop_map(|n| b"0xdeadbeef,".iter().cycle().take(n).copied().collect()),
    ]
}

fn accept_encoding() -> impl Strategy<Value = Vec<String>> {
    let element = prop_oneof![
        Just("gzip".to_owned()),
        Just("deflate".to_owned()),
        Just("br".to_owned()),
        Just("zstd".to_owned()),
        Just("identity".to_owned()),
        Just("*".to_owned()),
        Just("x-gzip".to_owned()),
        "[a-zA-Z;=.,* 0-9-]{0,12}",
    ];
    let weighted = (element, prop::option::of(prop_oneof![
        Just("0".to_owned()), Just("1".to_owned()), Just("0.5".to_owned()), Just("1.0".to_owned()),
        Just("0.001".to_owned()), Just("2".to_owned()), "[0-9.]{0,5}",
    ]))
    .prop_map(|(e, q)| match q {
        Some(q) => format!("{e};q={q}"),
        None => e,
    });
    prop::collection::vec(prop::collection::vec(weighted, 0..4).prop_map(|v| v.join(", ")), 0..3)
}

#[derive(Debug, Clone)]
struct Delivery {
    cuts: Vec<usize>,
    flushes: Vec<bool>,
    gaps_ms: Vec<u64>,
    known_length: bool,
}

fn delivery() -> impl Strategy<Value = Delivery> {
    (
        prop::collection::vec(any::<usize>(), 0..12),
        prop::collection::vec(prop::bool::weighted(0.2), 13),
        prop::collection::vec(prop_oneof![Just(0u64), 1u64..50, 50u64..400], 13),
        any::<bool>(),
    )
        .prop_map(|(cuts, flushes, gaps_ms, known_length)| Delivery { cuts, flushes, gaps_ms, known_length })
}

fn config() -> impl Strategy<Value = Config> {
    (0u64..3_000, 0u64..120_000, 0u32..=12, 1u32..=9, 0u64..200).prop_filter_map(
        "min_length <= max_buffer",
        |(min_length, max_buffer, level, stream_level, stream_delay_ms)| {
            (min_length <= max_buffer).then(|| Config {
                min_length,
                max_buffer,
                level: Level::from_raw(level),
                stream_level,
                stream_delay_ms,
                ..Config::default()
            })
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn the_client_always_decodes_the_upstream_body(
        body in body(),
        delivery in delivery(),
        accept in accept_encoding(),
        config in config(),
    ) {
        let settings = Arc::new(config.clone().validate().unwrap());
        let mut points: Vec<usize> = delivery.cuts.iter().map(|c| c % (body.len() + 1)).collect();
        points.extend([0, body.len()]);
        points.sort_unstable();
        points.dedup();
        let mut at_ms = 0;
        let chunks: Vec<Chunk> = points
            .windows(2)
            .enumerate()
            .map(|(i, w)| {
                at_ms += delivery.gaps_ms[i];
                Chunk { data: body[w[0]..w[1]].to_vec(), flush: delivery.flushes[i], at_ms }
            })
            .collect();
        let mut spec = Exchange1::json(&body, delivery.known_length);
        spec.request_headers = accept.iter().map(|v| ("Accept-Encoding", v.as_str())).collect();
        spec.chunks = chunks;
        let wire = run(&settings, &spec).unwrap();

        prop_assert_eq!(wire.decoded(), body.clone());
        if let Some(length) = wire.content_length {
            prop_assert_eq!(length, wire.body.len() as u64);
        }
        let mut negotiated = AcceptEncoding::default();
        for v in &accept {
            negotiated.add(v.as_bytes());
        }
        let coding = negotiated.choose(&config.encodings);
        match wire.mode {
            Mode::Oneshot | Mode::Stream => {
                prop_assert_eq!(wire.edits.content_encoding, coding);
                prop_assert!(body.len() as u64 >= config.min_length || !delivery.known_length);
            }
            Mode::Small => prop_assert!((body.len() as u64) < config.min_length),
            Mode::Untouched => prop_assert!(coding.is_none()),
            Mode::Incompressible => prop_assert!(coding.is_some()),
            Mode::Pending | Mode::Failed => prop_assert!(false, "ended as {:?}", wire.mode),
        }
        // A one-shot body is never larger than the original.
        if wire.mode == Mode::Oneshot {
            prop_assert!(wire.body.len() < body.len());
            prop_assert!(matches!(wire.edits.content_length, LengthEdit::Set(_)));
        }
        // A known length within max_buffer always ends with an exact Content-Length.
        if delivery.known_length && wire.mode != Mode::Untouched {
            prop_assert!(wire.content_length.is_some() || body.len() as u64 > config.max_buffer);
        }
    }

    #[test]
    fn negotiation_never_panics(value in prop::collection::vec(any::<u8>(), 0..200)) {
        let _ = AcceptEncoding::parse(&value).choose(&Coding::DEFAULT_ORDER);
    }
}
