//! Every real recorded response body through the core, with its length known and chunked: the
//! client decodes exactly the recorded bytes, and every Content-Length is exact.

mod common;

use std::sync::Arc;

use common::corpus::bodies;
use common::{chunked, run, Exchange1};
use rpcedge_core::{Mode, Settings};

#[test]
fn every_recorded_body_round_trips_through_both_paths() {
    let settings = Arc::new(Settings::default());
    let bodies = bodies();
    assert!(bodies.len() > common::corpus::least(1_500, 200), "only {} bodies: is the corpus there?", bodies.len());
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    let (mut small, mut oneshot, mut stream) = (0, 0, 0);
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let (bodies, settings) = (&bodies, &settings);
                scope.spawn(move || {
                    let mut modes = Vec::new();
                    for body in bodies.iter().skip(t).step_by(threads) {
                        modes.extend(check(settings, &body.origin, &body.bytes));
                    }
                    modes
                })
            })
            .collect();
        for mode in workers.into_iter().flat_map(|w| w.join().unwrap()) {
            match mode {
                Mode::Small => small += 1,
                Mode::Oneshot | Mode::Incompressible => oneshot += 1,
                Mode::Stream => stream += 1,
                other => panic!("unexpected mode {other:?}"),
            }
        }
    });
    println!("{} bodies: {small} small, {oneshot} buffered, {stream} streamed (x2 paths)", bodies.len());
    assert!(small > 0 && oneshot > 0 && stream > 0);
}

fn check(settings: &Arc<Settings>, origin: &str, body: &[u8]) -> [Mode; 2] {
    let expected = match body.len() as u64 {
        n if n < settings.min_length => [Mode::Small],
        n if n <= settings.max_buffer => [Mode::Oneshot],
        _ => [Mode::Stream],
    };
    let known = run(settings, &Exchange1::json(body, true)).unwrap();
    let mut spec = Exchange1::json(body, false);
    spec.chunks = chunked(body, &(1..=body.len() / 16_384).map(|i| i * 16_384).collect::<Vec<_>>(), 0);
    let unknown = run(settings, &spec).unwrap();
    for (path, wire) in [("known length", &known), ("chunked", &unknown)] {
        assert!(wire.decoded() == body, "{origin} ({path}): decoded body differs");
        if let Some(length) = wire.content_length {
            assert_eq!(length, wire.body.len() as u64, "{origin} ({path})");
        }
        let mode = if wire.mode == Mode::Incompressible { Mode::Oneshot } else { wire.mode };
        assert_eq!([mode], expected, "{origin} ({path}), {} bytes", body.len());
        if wire.mode == Mode::Oneshot {
            assert!(wire.content_length.is_some(), "{origin} ({path}): one-shot without a length");
        }
    }
    [known.mode, unknown.mode]
}
