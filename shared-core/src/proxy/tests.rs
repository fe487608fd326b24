//! One exchange through a proxy, hook by hook, as both Envoy adapters drive it: what the host is
//! told to do and what it counts.

use std::cell::{Cell, RefCell};
use std::sync::Arc;

use super::*;
use crate::cache::{Entry, Status as CacheStatus};
use crate::{Config, Mode};

const HASH: &str = "0x88e96d4537bea4d9c05d12549907b32561d3bf31f45aae734cdc119f13406cb6";

thread_local! {
    /// The host's clock in these tests, in milliseconds.
    static NOW_MS: Cell<u64> = const { Cell::new(0) };
}

fn clock() -> u64 {
    NOW_MS.with(Cell::get) * 1000
}

fn set_now(ms: u64) {
    NOW_MS.with(|now| now.set(ms));
}

fn settings(json: &str) -> Arc<Settings> {
    Arc::new(Config::from_json(json.as_bytes()).unwrap())
}

fn cached() -> Arc<Settings> {
    settings(r#"{"cache": {"cluster": "cached", "hot_bytes": 65536}}"#)
}

struct Hot(RefCell<Vec<u8>>);

impl HotRegion for Hot {
    fn with_region(&self, use_region: &mut dyn FnMut(&mut [u8])) {
        use_region(&mut self.0.borrow_mut());
    }
}

fn request_headers(length: usize) -> Vec<(&'static str, String)> {
    vec![
        (":method", "POST".into()),
        (":path", "/".into()),
        ("content-type", "application/json".into()),
        ("content-length", length.to_string()),
        ("accept-encoding", "gzip".into()),
    ]
}

fn block_request(id: u32) -> String {
    format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"eth_getBlockByHash","params":["{HASH}",false]}}"#)
}

fn block_answer(id: u32) -> String {
    format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{{"hash":"{HASH}","number":"0x1"}}}}"#)
}

fn counted(exchange: &mut ProxyExchange) -> Vec<(Counter, u64)> {
    exchange.take_counters().0.collect()
}

/// A request whose body has come, through the cache: the step it takes.
fn ask(exchange: &mut ProxyExchange, body: &str, hot: Option<&dyn HotRegion>) -> RequestStep {
    let head = exchange.on_request_headers(&request_headers(body.len()), false, || Some("mainnet"), None);
    assert!(matches!(head, RequestHead { upstream_accept: None, node_identity: true, step: RequestStep::Wait }));
    assert!(exchange.reads_request_body());
    let wait = exchange.on_request_body(body.len() - 1, false, || unreachable!("read before its end"), hot);
    assert!(matches!(wait.step, RequestStep::Wait));
    exchange.on_request_body(body.len(), true, || body.as_bytes().to_vec(), hot).step
}

#[test]
fn a_miss_goes_to_the_node_and_is_stored_then_a_hit_never_reaches_it() {
    let (settings, hot) = (cached(), Hot(RefCell::new(vec![0; 65536])));
    let mut miss = ProxyExchange::new(Arc::clone(&settings), Arc::default(), clock);
    let RequestStep::Lookup(lookup) = ask(&mut miss, &block_request(7), Some(&hot)) else { panic!("no lookup") };
    assert_eq!((lookup.cluster.as_str(), &lookup.headers[0]), ("cached", &(":method", "GET".to_string())));
    let answer: [(&str, &str); 2] = [(":status", "404"), ("x-rpcedge-miss", "absent")];
    assert!(matches!(miss.on_lookup_answer(&answer, b"", Some(&hot)), RequestStep::Continue));

    let body = block_answer(7);
    let length = body.len().to_string();
    let node = [(":status", "200"), ("content-type", "application/json"), ("content-length", length.as_str())];
    let head = miss.on_response_headers(&node, false).unwrap();
    assert!(!head.hold, "a small answer passes as it is");
    assert_eq!(head.edits[0], HeaderOp::Append("x-rpcedge-cache", "MISS"));
    assert!(miss.reads_body() && miss.is_done(), "passed on, but held for the store");
    assert_eq!(miss.on_body(body.as_bytes(), true, false).unwrap(), None);
    assert!(miss.output().is_empty(), "a passed body is the host's to send");
    let [store] = &miss.take_stores()[..] else { panic!("not one store") };
    let store = store.clone();
    assert_eq!(store.headers[0], (":method", "PUT".to_string()));
    let counters = counted(&mut miss);
    assert!(counters.contains(&(Counter::CacheResponses(CacheStatus::Miss), 1)), "{counters:?}");
    assert!(counters.contains(&(Counter::Responses(Mode::Small), 1)), "{counters:?}");

    // the daemon keeps what the store carried; the next request with another id is a hit
    let kept = Entry::decode(&store.body).unwrap().compact().unwrap();
    let mut hit = ProxyExchange::new(Arc::clone(&settings), Arc::default(), clock);
    let RequestStep::Lookup(_) = ask(&mut hit, &block_request(8), Some(&hot)) else { panic!("no lookup") };
    let RequestStep::Reply(reply) = hit.on_lookup_answer(&[(":status", "200")], &kept, Some(&hot)) else {
        panic!("not a hit")
    };
    assert_eq!(reply.body(), block_answer(8).as_bytes());
    assert!(reply.headers().contains(&("x-rpcedge-cache", "HIT")));
    assert_eq!(counted(&mut hit), [(Counter::CacheResponses(CacheStatus::Hit), 1)]);
    assert!(hit.is_done() && hit.replied() && !hit.reads_body());
    assert!(!miss.replied());

    // kept in the hot tier: the third asks no daemon
    let mut hot_hit = ProxyExchange::new(settings, Arc::default(), clock);
    let RequestStep::Reply(reply) = ask(&mut hot_hit, &block_request(9), Some(&hot)) else { panic!("not hot") };
    assert_eq!(reply.body(), block_answer(9).as_bytes());
    assert_eq!(counted(&mut hot_hit), [(Counter::CacheResponses(CacheStatus::Hit), 1), (Counter::HotHits, 1)]);
}

#[test]
fn the_node_is_asked_for_identity_wherever_rpcedge_may_have_work_on_the_answer() {
    let identity = |settings: Arc<Settings>, accept_encoding: &str, accept: &str, namespace: Option<&str>| {
        let headers = [
            (":method", "POST"),
            (":path", "/"),
            ("content-type", "application/json"),
            ("accept-encoding", accept_encoding),
            ("accept", accept),
        ];
        ProxyExchange::new(settings, Arc::default(), clock).on_request_headers(&headers, true, || namespace, None).node_identity
    };
    let plain = settings("{}");
    // a client that takes gzip: rpcedge compresses, so the node must not
    assert!(identity(plain.clone(), "gzip, br", "*/*", None));
    assert!(identity(plain.clone(), "deflate;q=0.5", "*/*", None));
    // one that takes none of rpcedge's codings gets the node's answer as the node makes it
    assert!(!identity(plain.clone(), "compress", "*/*", None));
    assert!(identity(plain.clone(), "br", "*/*", None), "br is one of them");
    assert!(!identity(settings(r#"{"encodings": ["gzip"]}"#), "br, zstd", "*/*", None), "unless it is not offered");
    assert!(!identity(plain.clone(), "identity", "*/*", None));
    // SSZ from the node's JSON: the JSON must come plain
    let transcoding = settings(r#"{"transcode": true}"#);
    assert!(identity(transcoding, "compress", "application/octet-stream", None));
    // a JSON client whose node may be asked for SSZ: that SSZ must come plain too
    let upstream_ssz = settings(r#"{"transcode_upstream_ssz": true}"#);
    assert!(identity(upstream_ssz, "compress", "application/json", None));
    // the cache keeps plain answers only, for clients of every coding
    let cache = settings(r#"{"cache": {"cluster": "rpcedge_cached"}}"#);
    assert!(identity(cache.clone(), "compress", "*/*", Some("mainnet")));
    assert!(!identity(cache, "compress", "*/*", None), "a route without a namespace bypasses the cache");
}

#[test]
fn a_large_answer_is_compressed_and_counted_once() {
    let mut exchange = ProxyExchange::new(settings("{}"), Arc::default(), clock);
    let head = exchange.on_request_headers(&request_headers(2), true, || None::<&str>, None);
    assert!(matches!(head, RequestHead { upstream_accept: None, node_identity: true, step: RequestStep::Continue }));
    assert!(!exchange.reads_request_body(), "no body is the core's business");
    let body: Vec<u8> = br#"{"hash":"0x00","gasUsed":"0x5208"},"#.iter().cycle().take(50_000).copied().collect();
    let length = body.len().to_string();
    let node = [(":status", "200"), ("content-type", "application/json"), ("content-length", length.as_str())];
    let head = exchange.on_response_headers(&node, false).unwrap();
    assert!(head.hold && head.edits.is_empty(), "the headers wait for the compressed length");
    let (first, rest) = body.split_at(20_000);
    assert_eq!(exchange.on_body(first, false, false).unwrap(), None);
    assert!(exchange.output().is_empty() && !exchange.is_done());
    let edits = exchange.on_body(rest, true, false).unwrap().expect("the headers, released");
    assert!(edits.contains(&HeaderOp::Set("content-encoding", b"gzip"[..].into())), "{edits:?}");
    let length = edits.iter().find_map(|op| match op {
        HeaderOp::Set("content-length", value) => Some(value.to_vec()),
        _ => None,
    });
    let gzip = exchange.output().to_vec();
    assert_eq!(length, Some(gzip.len().to_string().into_bytes()));
    let mut plain = Vec::new();
    std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&gzip[..]), &mut plain).unwrap();
    assert_eq!(plain, body);
    let (counters, duration) = exchange.take_counters();
    let counters: Vec<_> = counters.collect();
    assert!(counters.contains(&(Counter::Responses(Mode::Oneshot), 1)), "{counters:?}");
    assert!(counters.contains(&(Counter::BodyBytesIn, 50_000)));
    assert!(duration.is_some());
    exchange.on_stream_complete();
    assert!(counted(&mut exchange).is_empty(), "an ended exchange is not aborted");
}

#[test]
fn a_stream_that_ends_early_is_aborted_once() {
    let mut exchange = ProxyExchange::new(settings("{}"), Arc::default(), clock);
    exchange.on_request_headers(&request_headers(2), true, || None::<&str>, None);
    let node = [(":status", "200"), ("content-type", "application/json"), ("content-length", "50000")];
    assert!(exchange.on_response_headers(&node, false).unwrap().hold);
    exchange.on_body(&[b' '; 1000], false, false).unwrap();
    exchange.on_stream_complete();
    exchange.on_stream_complete();
    assert_eq!(counted(&mut exchange), [(Counter::Aborted, 1)]);
}

#[test]
fn without_a_namespace_the_cache_is_bypassed_and_the_reason_counted() {
    let mut exchange = ProxyExchange::new(cached(), Arc::default(), clock);
    let body = block_request(1);
    exchange.on_request_headers(&request_headers(body.len()), false, || None::<&str>, None);
    let after = exchange.on_request_body(body.len(), true, || body.as_bytes().to_vec(), None);
    assert!(matches!(after.step, RequestStep::Continue), "nothing to look up");
    let node = [(":status", "200"), ("content-type", "application/json"), ("content-length", "10")];
    let head = exchange.on_response_headers(&node, false).unwrap();
    assert_eq!(head.edits[0], HeaderOp::Append("x-rpcedge-cache", "BYPASS"));
    let counters = counted(&mut exchange);
    assert!(counters.contains(&(Counter::CacheBypassed(crate::cache::Bypass::Namespace), 1)), "{counters:?}");
}

#[test]
fn the_configured_limits_decide_what_is_looked_up_and_what_is_stored() {
    let (request, answer) = (block_request(7), block_answer(7));
    let limited = |max_request: usize, max_entry: usize| {
        let json = format!(
            r#"{{"cache": {{"cluster": "cached", "max_request": {max_request}, "max_entry": {max_entry}}}}}"#
        );
        ProxyExchange::new(settings(&json), Arc::default(), clock)
    };
    let length = answer.len().to_string();
    let node = [(":status", "200"), ("content-type", "application/json"), ("content-length", length.as_str())];
    // a request body over max_request is not waited for, and bypasses the cache
    let mut over = limited(request.len() - 1, answer.len());
    let head = over.on_request_headers(&request_headers(request.len()), false, || Some("mainnet"), None);
    assert!(matches!(head.step, RequestStep::Continue) && !over.reads_request_body());
    assert_eq!(
        over.on_response_headers(&node, false).unwrap().edits[0],
        HeaderOp::Append("x-rpcedge-cache", "BYPASS")
    );
    assert!(counted(&mut over).contains(&(Counter::CacheBypassed(crate::cache::Bypass::TooLarge), 1)));
    // at both limits: looked up and stored
    for (max_entry, stored) in [(answer.len(), true), (answer.len() - 1, false)] {
        let mut exchange = limited(request.len(), max_entry);
        let RequestStep::Lookup(_) = ask(&mut exchange, &request, None) else { panic!("no lookup") };
        assert!(matches!(exchange.on_lookup_answer(&[(":status", "404")], b"", None), RequestStep::Continue));
        let status = if stored { "MISS" } else { "BYPASS" };
        assert_eq!(
            exchange.on_response_headers(&node, false).unwrap().edits[0],
            HeaderOp::Append("x-rpcedge-cache", status)
        );
        exchange.on_body(answer.as_bytes(), true, false).unwrap();
        assert_eq!(exchange.take_stores().len(), usize::from(stored), "max_entry {max_entry}");
        // an answer over max_entry goes to the client, and counts as the answer's bypass
        let bypassed = (Counter::CacheBypassed(crate::cache::Bypass::Answer), 1);
        assert_eq!(counted(&mut exchange).contains(&bypassed), !stored);
    }
}

#[test]
fn a_header_is_removed_only_when_the_node_sent_it() {
    let body = vec![b' '; 5_000];
    let length = body.len().to_string();
    for sent in [false, true] {
        let mut exchange = ProxyExchange::new(settings("{}"), Arc::default(), clock);
        exchange.on_request_headers(&request_headers(2), true, || None::<&str>, None);
        let mut node = vec![(":status", "200"), ("content-type", "application/json"), ("content-length", &length)];
        if sent {
            node.push(("Accept-Ranges", "bytes"));
        }
        assert!(exchange.on_response_headers(&node, false).unwrap().hold);
        let edits = exchange.on_body(&body, true, false).unwrap().expect("the headers, released");
        assert!(edits.contains(&HeaderOp::Set("content-encoding", b"gzip"[..].into())), "{edits:?}");
        assert_eq!(edits.contains(&HeaderOp::Remove("accept-ranges")), sent, "{edits:?}");
    }
}

#[test]
fn a_miss_waits_for_the_holders_answer_and_a_holder_without_one_releases_its_key() {
    let settings = settings(r#"{"cache": {"cluster": "cached", "timeout_ms": 40, "lock_timeout_ms": 700}}"#);
    // the holder: its node fails, and its key is released behind the answer, not as a store
    let mut holder = ProxyExchange::new(Arc::clone(&settings), Arc::default(), clock);
    let RequestStep::Lookup(lookup) = ask(&mut holder, &block_request(7), None) else { panic!("no lookup") };
    assert!(lookup.headers.contains(&("x-rpcedge-lock", "700".to_string())) && lookup.timeout_ms == 40);
    let held: [(&str, &str); 3] = [(":status", "404"), ("x-rpcedge-miss", "absent"), ("x-rpcedge-lock", "held")];
    assert!(matches!(holder.on_lookup_answer(&held, b"", None), RequestStep::Continue));
    holder.on_response_headers(&[(":status", "503"), ("content-length", "4")], false).unwrap();
    holder.on_body(b"busy", true, false).unwrap();
    let [release] = &holder.take_stores()[..] else { panic!("not one release") };
    assert_eq!(&release.headers[..2], &[(":method", "DELETE".to_string()), (":path", lookup.headers[1].1.replace("entries", "flights"))]);
    assert!(!release.store, "its answer is no store's");
    holder.on_stream_complete();
    assert!(holder.take_stores().is_empty(), "released once");

    // a holder whose stream ends before the node answered releases the key then
    let mut gone = ProxyExchange::new(Arc::clone(&settings), Arc::default(), clock);
    ask(&mut gone, &block_request(7), None);
    gone.on_lookup_answer(&held, b"", None);
    gone.on_stream_complete();
    assert!(matches!(&gone.take_stores()[..], [release] if release.headers[0].1 == "DELETE"));

    // and one whose stream ends while its lookup is on its way (the client left): the daemon may
    // have made it the holder, so it releases the key by the name its lookup gave
    let mut left = ProxyExchange::new(Arc::clone(&settings), Arc::default(), clock);
    let RequestStep::Lookup(lookup) = ask(&mut left, &block_request(7), None) else { panic!("no lookup") };
    left.on_stream_complete();
    let [release] = &left.take_stores()[..] else { panic!("not released") };
    let holder = |call: &DaemonCall| call.headers.iter().find(|(name, _)| *name == "x-rpcedge-holder").cloned();
    assert_eq!(release.headers[0].1, "DELETE");
    assert!(holder(release).is_some() && holder(release) == holder(&lookup), "by the lookup's holder");

    // a waiter: the second call waits as long as the lock, and the answer is sent as COALESCED
    let mut waiter = ProxyExchange::new(Arc::clone(&settings), Arc::default(), clock);
    ask(&mut waiter, &block_request(8), None);
    let in_flight: [(&str, &str); 2] = [(":status", "404"), ("x-rpcedge-miss", "in_flight")];
    let RequestStep::Lookup(wait) = waiter.on_lookup_answer(&in_flight, b"", None) else { panic!("no wait") };
    assert_eq!((wait.headers[0].1.as_str(), wait.timeout_ms), ("GET", 740));
    assert!(wait.headers[1].1.starts_with("/v1/flights/"));
    let mut miss = ProxyExchange::new(Arc::clone(&settings), Arc::default(), clock);
    ask(&mut miss, &block_request(7), None);
    miss.on_lookup_answer(&held, b"", None);
    let length = block_answer(7).len().to_string();
    miss.on_response_headers(&[(":status", "200"), ("content-length", length.as_str())], false).unwrap();
    miss.on_body(block_answer(7).as_bytes(), true, false).unwrap();
    let [store] = &miss.take_stores()[..] else { panic!("stored, nothing released") };
    assert!(store.store);
    let RequestStep::Reply(reply) = waiter.on_lookup_answer(&[(":status", "200")], &store.body, None) else {
        panic!("not answered")
    };
    assert_eq!(reply.body(), block_answer(8).as_bytes());
    assert!(reply.headers().contains(&("x-rpcedge-cache", "COALESCED")));
    assert_eq!(counted(&mut waiter), [(Counter::CacheResponses(CacheStatus::Coalesced), 1)]);
}

#[test]
fn the_dictionarys_path_is_answered_here_and_every_other_goes_on() {
    let serving = settings(r#"{"encodings": ["dcz", "zstd"], "dictionary": {"path": "/d", "match": "/rpc/*"}}"#);
    let ask = |settings: &Arc<Settings>, method: &str, path: &str, if_none_match: Option<&str>| {
        let mut headers = vec![(":method", method.to_string()), (":path", path.to_string())];
        headers.extend(if_none_match.map(|tag| ("if-none-match", tag.to_string())));
        let mut exchange = ProxyExchange::new(Arc::clone(settings), Arc::default(), clock);
        exchange.on_request_headers(&headers, true, || None::<&str>, None).step
    };
    let RequestStep::Reply(reply) = ask(&serving, "GET", "/d?v=1", None) else { panic!("not answered") };
    assert_eq!((reply.status(), reply.body()), (200, crate::dictionary::DICTIONARY));
    let headers = reply.headers();
    assert!(headers.contains(&("use-as-dictionary", r#"match="/rpc/*""#)), "{headers:?}");
    let etag = headers.iter().find(|(name, _)| *name == "etag").unwrap().1.to_string();
    let RequestStep::Reply(again) = ask(&serving, "GET", "/d", Some(&etag)) else { panic!("not answered") };
    assert_eq!((again.status(), again.body()), (304, &b""[..]));
    for (settings, path) in [(&serving, "/rpc/mainnet"), (&serving, "/d/x"), (&settings("{}"), "/d")] {
        assert!(matches!(ask(settings, "GET", path, None), RequestStep::Continue), "{path}");
    }
}

/// A JSON client's JSON-RPC POST whose client takes gzip and br, on two field lines.
fn client_request(length: usize) -> Vec<(&'static str, String)> {
    let mut headers = request_headers(length);
    headers.push(("accept-encoding", "br".into()));
    headers.push(("accept", "application/json".into()));
    headers
}

#[test]
fn the_request_headers_changed_for_the_node_come_back_as_the_client_sent_them() {
    // Accept-Encoding, removed for the node, comes back whole, once
    let mut exchange = ProxyExchange::new(settings("{}"), Arc::default(), clock);
    assert!(exchange.on_request_headers(&client_request(2), true, || None::<&str>, None).node_identity);
    assert_eq!(exchange.take_client_headers(), [("accept-encoding", Some(b"gzip, br".to_vec()))]);
    assert!(exchange.take_client_headers().is_empty());

    // one rpcedge has no work on is left as it is
    let mut untouched = ProxyExchange::new(settings("{}"), Arc::default(), clock);
    let headers = [(":method", "POST"), (":path", "/"), ("accept-encoding", "compress")];
    assert!(!untouched.on_request_headers(&headers, true, || None::<&str>, None).node_identity);
    assert!(untouched.take_client_headers().is_empty());

    // the node asked for SSZ: Accept too, once the body said so
    let call = br#"{"jsonrpc":"2.0","id":7,"method":"debug_getRawBlock","params":["0x10"]}"#;
    let mut ssz = ProxyExchange::new(settings(r#"{"transcode_upstream_ssz": true}"#), Arc::default(), clock);
    let head = ssz.on_request_headers(&client_request(call.len()), false, || None::<&str>, None);
    assert!(matches!(head.step, RequestStep::Wait), "the head waits for the method");
    assert!(ssz.on_request_body(call.len(), true, || call.to_vec(), None).upstream_accept.is_some());
    let restored = ssz.take_client_headers();
    assert!(restored.contains(&("accept", Some(b"application/json".to_vec()))), "{restored:?}");

    // a batch the cache answered in part went on shorter: Content-Length too
    let settings = cached();
    let mut miss = ProxyExchange::new(Arc::clone(&settings), Arc::default(), clock);
    ask(&mut miss, &block_request(7), None);
    miss.on_lookup_answer(&[(":status", "404")], b"", None);
    let answer = block_answer(7);
    let length = answer.len().to_string();
    miss.on_response_headers(&[(":status", "200"), ("content-length", length.as_str())], false).unwrap();
    miss.on_body(answer.as_bytes(), true, false).unwrap();
    let kept = Entry::decode(&miss.take_stores()[0].body).unwrap().compact().unwrap();
    let batch = format!("[{},{}]", block_request(8), block_request(9).replace(HASH, &HASH.replace('8', "9")));
    let mut split = ProxyExchange::new(settings, Arc::default(), clock);
    let RequestStep::Lookup(_) = ask(&mut split, &batch, None) else { panic!("no lookup") };
    let mut found = Vec::new();
    crate::cache::protocol::Looked::Hit(&kept, None).encode(&mut found);
    crate::cache::protocol::Looked::Absent.encode(&mut found);
    let step = split.on_lookup_answer(&[(":status", "200")], &found, None);
    let RequestStep::Forward(rest) = step else { panic!("not forwarded in part: {step:?}") };
    assert!(rest.len() < batch.len());
    let restored = split.take_client_headers();
    assert!(restored.contains(&("content-length", Some(batch.len().to_string().into_bytes()))), "{restored:?}");
}

/// A POST of a JSON body, whose client takes gzip, for the exchange of a proxy that may
/// withhold the body from a held head.
fn bounded(settings: Arc<Settings>, held_heads: &Arc<HeldHeads>) -> ProxyExchange {
    ProxyExchange::new(settings, Arc::default(), clock).bounding_held_heads(Arc::clone(held_heads))
}

const LARGE: [(&str, &str); 3] = [(":status", "200"), ("content-type", "application/json"), ("content-length", "5000")];

#[test]
fn a_head_held_for_a_body_the_proxy_withholds_goes_on_at_its_bound() {
    let held_heads = Arc::new(HeldHeads::default());
    let mut exchange = bounded(settings(r#"{"stream_delay_ms": 100}"#), &held_heads);
    exchange.on_request_headers(&request_headers(2), true, || None::<&str>, None);
    set_now(1_000);
    let head = exchange.on_response_headers(&LARGE, false).unwrap();
    assert!(head.hold && head.edits.is_empty());
    assert_eq!(exchange.head_deadline(), Some(1_100));
    set_now(1_099);
    assert!(!exchange.let_response_go());
    set_now(1_100);
    assert!(!exchange.let_request_go());
    assert!(exchange.let_response_go(), "the head goes as the node sent it");
    assert!(exchange.is_done() && !exchange.reads_body() && exchange.head_deadline().is_none());
    // its body then passes as it comes
    set_now(1_200);
    assert_eq!(exchange.on_body(&[b' '; 5000], true, false).unwrap(), None);
    assert!(exchange.output().is_empty());
    assert!(counted(&mut exchange).contains(&(Counter::Responses(Mode::Untouched), 1)));
    assert!(exchange.take_warning().is_some_and(|w| w.contains("allow_on_headers_stop_iteration")));

    // a request head held for its body (the cache's key) goes on past the cache; said once
    let mut request = bounded(cached(), &held_heads);
    set_now(2_000);
    let head = request.on_request_headers(&request_headers(100), false, || Some("mainnet"), None);
    assert!(matches!(head.step, RequestStep::Wait));
    assert_eq!(request.head_deadline(), Some(2_100));
    set_now(2_100);
    assert!(!request.let_response_go() && request.let_request_go());
    assert!(!request.reads_request_body(), "its body passes unread");
    let node = [(":status", "200"), ("content-length", "10")];
    assert_eq!(request.on_response_headers(&node, false).unwrap().edits[0], HeaderOp::Append("x-rpcedge-cache", "BYPASS"));
    assert!(request.take_warning().is_none());
}

#[test]
fn a_body_that_comes_to_a_held_head_lifts_the_bound_for_every_exchange() {
    let call = br#"{"jsonrpc":"2.0","id":7,"method":"debug_getRawBlock","params":["0x10"]}"#;
    let upstream_ssz = settings(r#"{"transcode_upstream_ssz": true, "cache": {"cluster": "cached"}}"#);
    for head in ["request", "response"] {
        let held_heads = Arc::new(HeldHeads::default());
        // not known yet: the head is held at most its bound
        let mut first = bounded(Arc::clone(&upstream_ssz), &held_heads);
        let request = first.on_request_headers(&client_request(call.len()), false, || Some("mainnet"), None);
        assert!(matches!(request.step, RequestStep::Wait) && first.head_deadline().is_some(), "the cache's wait");
        if head == "request" {
            // the body came to its own held head: this call's node is asked for SSZ already
            let body = first.on_request_body(call.len(), true, || call.to_vec(), None);
            assert!(body.upstream_accept.is_some());
        } else {
            // let go without its body, the call's node is not asked for SSZ
            set_now(1_000);
            assert!(first.let_request_go());
            let body = first.on_request_body(call.len(), true, || call.to_vec(), None);
            assert!(body.upstream_accept.is_none());
            assert!(first.on_response_headers(&LARGE, false).unwrap().hold);
            first.on_body(b" ", false, false).unwrap();
        }
        assert_eq!(first.head_deadline(), None, "{head}");
        // then every exchange holds its heads for their bodies, and asks for SSZ
        let mut next = bounded(Arc::clone(&upstream_ssz), &held_heads);
        next.on_request_headers(&client_request(call.len()), false, || Some("mainnet"), None);
        assert_eq!(next.head_deadline(), None, "{head}");
        let body = next.on_request_body(call.len(), true, || call.to_vec(), None);
        assert!(body.upstream_accept.is_some(), "{head}");
    }
}

/// A proxy that notes what the core's steps ask of it, and makes each lookup with the next
/// token (none: it cannot call the daemon).
#[derive(Default)]
struct Recorder {
    asked: Vec<String>,
    tokens: Vec<u64>,
    stores: Vec<DaemonCall>,
}

impl drive::Host for Recorder {
    fn set_request_header(&mut self, name: &str, value: Option<&[u8]>) {
        let value = value.map_or("(removed)".into(), String::from_utf8_lossy);
        self.asked.push(format!("request {name}: {value}"));
    }

    fn replace_request_body(&mut self, body: &[u8]) {
        self.asked.push(format!("request body: {}", String::from_utf8_lossy(body)));
    }

    fn edit_response_header(&mut self, op: HeaderOp<'_>) {
        self.asked.push(format!("response {op:?}"));
    }

    fn call_daemon(&mut self, call: &DaemonCall) -> Option<u64> {
        self.asked.push(format!("call {}", call.headers[0].1));
        self.tokens.pop()
    }

    fn send_reply(&mut self, status: u16, _headers: &[(&str, &str)], body: &[u8]) -> bool {
        self.asked.push(format!("reply {status}: {}", String::from_utf8_lossy(body)));
        true
    }

    fn reset(&mut self) {
        self.asked.push("reset".into());
    }

    fn count(&mut self, counter: Counter, amount: u64) {
        self.asked.push(format!("count {} {amount}", counter.name()));
    }

    fn record_compress_us(&mut self, _us: u64) {}

    fn queue_store(&mut self, call: DaemonCall) {
        self.stores.push(call);
    }

    fn warn(&mut self, line: &str) {
        self.asked.push(format!("warn {line}"));
    }
}

/// One request driven through its head and its whole body.
fn drive_request(exchange: &mut ProxyExchange, host: &mut Recorder, body: &str) -> drive::Step {
    let headers = request_headers(body.len());
    let step = drive::request_headers(exchange, host, &headers, false, || Some("mainnet"), None);
    assert_eq!(step, drive::Step::Wait);
    drive::request_body(exchange, host, body.len(), true, || body.as_bytes().to_vec(), None)
}

#[test]
fn a_driven_hit_puts_the_clients_headers_back_then_replies_and_a_lookup_not_made_goes_to_the_node() {
    let settings = cached();
    // the daemon cannot be called: on to the node, the client's Accept-Encoding removed
    let mut unmade = ProxyExchange::new(Arc::clone(&settings), Arc::default(), clock);
    let mut host = Recorder::default();
    assert_eq!(drive_request(&mut unmade, &mut host, &block_request(7)), drive::Step::Continue);
    assert_eq!(host.asked, ["request accept-encoding: (removed)", "call GET", "warn rpcedge cache: cannot call cached"]);

    // a miss, stored through the host once the node's answer has ended
    let mut miss = ProxyExchange::new(Arc::clone(&settings), Arc::default(), clock);
    let mut host = Recorder { tokens: vec![41], ..Recorder::default() };
    assert_eq!(drive_request(&mut miss, &mut host, &block_request(7)), drive::Step::Lookup(41));
    let absent = [(":status", "404"), ("x-rpcedge-miss", "absent")];
    assert_eq!(drive::lookup_answer(&mut miss, &mut host, &absent, b"", None), drive::Step::Continue);
    let answer = block_answer(7);
    let length = answer.len().to_string();
    let node = [(":status", "200"), ("content-type", "application/json"), ("content-length", length.as_str())];
    assert_eq!(drive::response_headers(&mut miss, &mut host, &node, false), drive::HeadStep::Continue);
    assert_eq!(drive::feed(&mut miss, &mut host, answer.as_bytes(), true, false), Some(false));
    drive::account(&mut miss, &mut host);
    let [store] = &host.stores[..] else { panic!("not one store") };

    // the hit: the client's Accept-Encoding is back on the request before the reply goes
    let kept = Entry::decode(&store.body).unwrap().compact().unwrap();
    let mut hit = ProxyExchange::new(settings, Arc::default(), clock);
    let mut host = Recorder { tokens: vec![42], ..Recorder::default() };
    assert_eq!(drive_request(&mut hit, &mut host, &block_request(8)), drive::Step::Lookup(42));
    host.asked.clear();
    assert_eq!(drive::lookup_answer(&mut hit, &mut host, &[(":status", "200")], &kept, None), drive::Step::Replied);
    assert_eq!(host.asked, ["request accept-encoding: gzip".to_string(), format!("reply 200: {}", block_answer(8))]);
    drive::account(&mut hit, &mut host);
    assert_eq!(host.asked[2..], ["count cache.responses.hit 1"]);
}
