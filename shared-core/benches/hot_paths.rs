//! The core's two hot paths, whole exchanges as a host drives them, for instruction counts under
//! callgrind: deterministic where wall clocks on a shared machine are not. `loadtest/instructions.py`
//! runs this binary under `valgrind --tool=callgrind --toggle-collect='*hot_paths::<path>*'` and
//! divides the instructions by the exchanges.
//!
//!     cargo bench -p rpcedge-core --bench hot_paths -- untouched|one_shot_30k [exchanges]
//!
//! - `untouched`: a JSON-RPC POST whose answer is under `min_length` (a real 258-byte
//!   debug_getRawTransaction answer): headers in, the plan (pass), the edits out.
//! - `one_shot_30k`: the same with an answer from the load test's 30 KiB bucket (24-40 KiB: a real
//!   34 KiB eth_getBlockReceipts answer), buffered and compressed whole at the default level.
//!
//! Both bodies come from the corpus sample (`benches/hot_paths/`), so that the counts are the
//! same on every machine.

use std::hint::black_box;
use std::path::Path;
use std::sync::Arc;

use rpcedge_core::{BodyPlan, Exchange, Node, Settings};

/// The request every exchange starts with: what wrk sends in the load test.
fn request(settings: &Arc<Settings>, node: &Arc<Node>) -> Exchange {
    let mut exchange = Exchange::new(Arc::clone(settings), Arc::clone(node));
    exchange.request_method(b"POST");
    exchange.request_path(b"/mainnet");
    exchange.request_header(b"host", b"127.0.0.1:18080");
    exchange.request_header(b"content-type", b"application/json");
    exchange.request_header(b"content-length", b"71");
    exchange.request_header(b"accept-encoding", b"gzip");
    exchange
}

/// Response headers as the node sends them.
fn respond(exchange: &mut Exchange, length: usize) -> BodyPlan {
    exchange.response_header(b"content-type", b"application/json");
    exchange.response_header(b"content-length", itoa::Buffer::new().format(length).as_bytes());
    exchange.response_header(b"date", b"Sun, 22 Nov 2026 23:44:05 GMT");
    exchange.response_content_length(Some(length as u64));
    exchange.response_head(200)
}

#[inline(never)]
fn untouched(settings: &Arc<Settings>, node: &Arc<Node>, body: &[u8], exchanges: u32) {
    for _ in 0..exchanges {
        let mut exchange = request(settings, node);
        assert_eq!(respond(&mut exchange, body.len()), BodyPlan::Pass);
        black_box(exchange.edits());
    }
}

#[inline(never)]
fn one_shot_30k(settings: &Arc<Settings>, node: &Arc<Node>, body: &[u8], exchanges: u32) {
    for _ in 0..exchanges {
        let mut exchange = request(settings, node);
        assert_eq!(respond(&mut exchange, body.len()), BodyPlan::Buffer);
        let output = exchange.feed(black_box(body), true, false, 0).expect("compresses");
        assert!(output.end && output.data.len() < body.len());
    }
}

fn sample_body(name: &str) -> Vec<u8> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/hot_paths").join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn main() {
    // cargo bench passes --bench; the path and the count follow
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let exchanges = args.get(1).map_or(1000, |n| n.parse().expect("a number of exchanges"));
    // one configuration, and what its exchanges learn about the node, as a host keeps them
    let (settings, node) = (Arc::new(Settings::default()), Arc::default());
    match args.first().map(String::as_str) {
        Some("untouched") => untouched(&settings, &node, &sample_body("small.json"), exchanges),
        Some("one_shot_30k") => one_shot_30k(&settings, &node, &sample_body("30k.json"), exchanges),
        // `cargo bench` with no arguments runs every bench binary: one quick pass of each path
        None => {
            untouched(&settings, &node, &sample_body("small.json"), 1);
            one_shot_30k(&settings, &node, &sample_body("30k.json"), 1);
        }
        Some(other) => panic!("unknown path {other}: untouched or one_shot_30k"),
    }
}
