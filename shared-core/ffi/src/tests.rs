//! The C ABI called as a C host calls it: every out-parameter defined on every way out, NULL
//! arguments refused, panics caught, jobs taken, completed and freed.

use std::cell::Cell;
use std::ffi::{c_void, CStr};
use std::io::Read;
use std::mem::MaybeUninit;

use rpcedge_core::transcode::BeaconNetwork;

use super::metrics::*;
use super::*;

fn json(n: usize) -> Vec<u8> {
    br#"{"hash":"0x8f1c2d3e4b5a69788796a5b4c3d2e1f0","gasUsed":"0x5208"},"#.iter().cycle().take(n).copied().collect()
}

fn gunzip(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(data).read_to_end(&mut out).expect("valid gzip");
    out
}

/// Out-parameters as C stack garbage would leave them.
fn garbage<T>() -> T {
    let mut value = MaybeUninit::<T>::uninit();
    unsafe {
        ptr::write_bytes(value.as_mut_ptr(), 0xa5, 1);
        value.assume_init()
    }
}

fn panic_next() {
    PANIC_NEXT.set(true);
}

struct Handles {
    settings: *mut RpcedgeSettings,
    exchange: *mut RpcedgeExchange,
}

impl Handles {
    /// A gzip-accepting exchange for a JSON response without a length, its head not yet given.
    fn new(json_config: &str) -> Handles {
        unsafe {
            let settings = rpcedge_settings_from_json(json_config.as_ptr(), json_config.len(), ptr::null_mut());
            assert!(!settings.is_null());
            let exchange = rpcedge_exchange_new(settings);
            assert!(!exchange.is_null());
            header(exchange, true, "Accept-Encoding", "gzip");
            header(exchange, false, "Content-Type", "application/json");
            Handles { settings, exchange }
        }
    }
}

impl Drop for Handles {
    fn drop(&mut self) {
        unsafe {
            rpcedge_exchange_free(self.exchange);
            rpcedge_settings_free(self.settings);
        }
    }
}

/// A settings handle from a JSON configuration, freed when dropped.
struct SettingsHandle(*mut RpcedgeSettings);

impl SettingsHandle {
    fn new(json_config: &str) -> SettingsHandle {
        let settings = unsafe { rpcedge_settings_from_json(json_config.as_ptr(), json_config.len(), ptr::null_mut()) };
        assert!(!settings.is_null());
        SettingsHandle(settings)
    }
}

impl Drop for SettingsHandle {
    fn drop(&mut self) {
        unsafe { rpcedge_settings_free(self.0) };
    }
}

unsafe fn header(exchange: *mut RpcedgeExchange, request: bool, name: &str, value: &str) {
    let f = if request { rpcedge_exchange_request_header } else { rpcedge_exchange_response_header };
    f(exchange, name.as_ptr(), name.len(), value.as_ptr(), value.len());
}

unsafe fn feed(exchange: *mut RpcedgeExchange, data: &[u8], flags: u32) -> (i32, RpcedgeOutput, RpcedgeError) {
    let mut out = garbage::<RpcedgeOutput>();
    let mut err = garbage::<RpcedgeError>();
    let rc = rpcedge_exchange_feed(exchange, data.as_ptr(), data.len(), flags, 0, &mut out, &mut err);
    (rc, out, err)
}

fn message(err: &RpcedgeError) -> String {
    unsafe { CStr::from_ptr(err.message.as_ptr()) }.to_string_lossy().into_owned()
}

fn is_none(out: &RpcedgeOutput) -> bool {
    out.data.is_null() && out.len == 0 && out.flags == 0
}

/// The exchange's header operations, as (op, name, value).
unsafe fn header_ops(exchange: *mut RpcedgeExchange, vary: u8) -> Vec<(u8, String, String)> {
    let mut ops = garbage::<*const RpcedgeHeaderOp>();
    let n = rpcedge_exchange_header_ops(exchange, vary, &mut ops);
    if n == 0 {
        return Vec::new();
    }
    let text = |s: &RpcedgeStr| String::from_utf8(owned(s)).unwrap();
    slice::from_raw_parts(ops, n).iter().map(|op| (op.op, text(&op.name), text(&op.value))).collect()
}

#[test]
fn a_panic_in_response_head_leaves_a_pass_with_no_edits() {
    let h = Handles::new(r#"{"max_buffer": 1024}"#);
    unsafe {
        // edits made (a stream's), then a head that fails on the way: none of them goes out
        rpcedge_exchange_response_content_length(h.exchange, 5000);
        assert_eq!(rpcedge_exchange_response_head(h.exchange, 200), RPCEDGE_PLAN_STREAM);
        assert!(!header_ops(h.exchange, RPCEDGE_VARY_IN_LINE).is_empty());
        panic_next();
        assert_eq!(rpcedge_exchange_response_head(h.exchange, 200), RPCEDGE_PLAN_PASS);
        assert_eq!(header_ops(h.exchange, RPCEDGE_VARY_IN_LINE), []);
    }
}

#[test]
fn a_panic_in_feed_fails_with_nothing_to_send() {
    let h = Handles::new("");
    unsafe {
        assert_eq!(rpcedge_exchange_response_head(h.exchange, 200), RPCEDGE_PLAN_BUFFER);
        panic_next();
        let (rc, out, err) = feed(h.exchange, &json(5000), RPCEDGE_FEED_END);
        assert_eq!(rc, -1);
        assert!(is_none(&out));
        assert_eq!(message(&err), "internal error");
    }
}

#[test]
fn panics_in_the_other_entry_points_are_caught() {
    let h = Handles::new("");
    unsafe {
        panic_next();
        assert!(rpcedge_exchange_new(h.settings).is_null());
        panic_next();
        assert_eq!(rpcedge_exchange_deadline(h.exchange), -1);
        panic_next();
        assert_eq!(owned(&rpcedge_exchange_mode(h.exchange)), b"failed");
        let (mut i, mut o) = (7, 7);
        panic_next();
        rpcedge_exchange_counts(h.exchange, &mut i, &mut o);
        assert_eq!((i, o), (0, 0));
        panic_next();
        assert_eq!(rpcedge_exchange_failure(h.exchange), RPCEDGE_FAILURE_RESET);
        panic_next();
        assert!(rpcedge_exchange_take_job(h.exchange).is_null());
        let mut err = garbage::<RpcedgeError>();
        panic_next();
        assert!(rpcedge_settings_from_json(b"{}".as_ptr(), 2, &mut err).is_null());
        assert_eq!(message(&err), "internal error");
    }
}

#[test]
fn null_arguments_are_refused_not_followed() {
    unsafe {
        let null = ptr::null_mut::<RpcedgeExchange>();
        assert!(rpcedge_exchange_new(ptr::null()).is_null());
        rpcedge_exchange_request_method(null, b"GET".as_ptr(), 3);
        rpcedge_exchange_request_header(null, ptr::null(), 5, ptr::null(), 5);
        rpcedge_exchange_response_header(null, b"a".as_ptr(), 1, b"b".as_ptr(), 1);
        rpcedge_exchange_response_content_length(null, 10);
        rpcedge_exchange_offload(null);
        assert_eq!(rpcedge_exchange_response_head(null, 200), RPCEDGE_PLAN_PASS);
        assert_eq!(header_ops(null, RPCEDGE_VARY_IN_LINE), []);
        assert_eq!(rpcedge_exchange_header_ops(null, RPCEDGE_VARY_IN_LINE, ptr::null_mut()), 0);
        let (rc, out, err) = feed(null, b"x", 0);
        assert_eq!(rc, -1);
        assert!(is_none(&out));
        assert_eq!(message(&err), "no exchange");
        assert_eq!(rpcedge_exchange_feed(null, ptr::null(), 0, 0, 0, ptr::null_mut(), ptr::null_mut()), -1);
        assert_eq!(rpcedge_exchange_deadline(null), -1);
        assert_eq!(owned(&rpcedge_exchange_mode(null)), b"failed");
        rpcedge_exchange_counts(null, ptr::null_mut(), ptr::null_mut());
        assert_eq!(rpcedge_exchange_failure(null), RPCEDGE_FAILURE_RESET);
        assert_eq!(rpcedge_exchange_abort(null), RPCEDGE_FAILURE_RESET);
        assert!(rpcedge_exchange_take_job(null).is_null());
        rpcedge_job_run(ptr::null_mut());
        rpcedge_job_free(ptr::null_mut());
        rpcedge_exchange_free(null);
        rpcedge_settings_free(ptr::null_mut());
        let mut out = garbage::<RpcedgeOutput>();
        assert_eq!(rpcedge_exchange_complete_job(null, ptr::null_mut(), &mut out, ptr::null_mut()), -1);
        assert!(is_none(&out));
        let mut err = garbage::<RpcedgeError>();
        assert!(rpcedge_settings_new(ptr::null(), &mut err).is_null());
        assert_eq!(message(&err), "no configuration given");
        assert_eq!(rpcedge_check_field(ptr::null(), 1, &mut err), -1);
        // A config whose types pointer is NULL means the default types.
        let config = RpcedgeConfig { types_len: 3, ..rpcedge_config_default() };
        let settings = rpcedge_settings_new(&config, ptr::null_mut());
        assert!(!settings.is_null());
        rpcedge_settings_free(settings);
    }
}

#[test]
fn a_job_is_taken_once_run_anywhere_and_given_back() {
    let h = Handles::new(r#"{"offload_min_length": 100000}"#);
    let body = json(300_000);
    unsafe {
        rpcedge_exchange_offload(h.exchange);
        assert_eq!(rpcedge_exchange_response_head(h.exchange, 200), RPCEDGE_PLAN_BUFFER);
        assert!(rpcedge_exchange_take_job(h.exchange).is_null(), "no job before the body is in");
        let (rc, out, _) = feed(h.exchange, &body, RPCEDGE_FEED_END);
        assert_eq!((rc, out.flags, out.len), (0, RPCEDGE_OUT_WORK, 0));
        let job = rpcedge_exchange_take_job(h.exchange);
        assert!(!job.is_null());
        assert!(rpcedge_exchange_take_job(h.exchange).is_null(), "taken once");
        let job = job as usize;
        std::thread::spawn(move || rpcedge_job_run(job as *mut RpcedgeJob)).join().unwrap();
        let mut out = garbage::<RpcedgeOutput>();
        let mut err = garbage::<RpcedgeError>();
        assert_eq!(rpcedge_exchange_complete_job(h.exchange, job as *mut RpcedgeJob, &mut out, &mut err), 0);
        assert_eq!(out.flags, RPCEDGE_OUT_HEADERS | RPCEDGE_OUT_FLUSH | RPCEDGE_OUT_END);
        assert_eq!(gunzip(slice::from_raw_parts(out.data, out.len)), body);
        assert_eq!(owned(&rpcedge_exchange_mode(h.exchange)), b"oneshot");
        // the edits that go with the headers, as the ordered operations every host applies
        let op = |op, name: &str, value: &str| (op, name.to_string(), value.to_string());
        let expected = [
            op(RPCEDGE_EDIT_SET, "content-encoding", "gzip"),
            op(RPCEDGE_EDIT_SET, "content-length", &out.len.to_string()),
            op(RPCEDGE_EDIT_APPEND, "vary", "Accept-Encoding"),
            op(RPCEDGE_EDIT_REMOVE, "accept-ranges", ""),
        ];
        assert_eq!(header_ops(h.exchange, RPCEDGE_VARY_IN_LINE), expected);
        // Vary's one value: the same for a host that says Accept-Encoding its own way
        assert_eq!(header_ops(h.exchange, RPCEDGE_VARY_ENCODING_OWN_LINE), expected);
    }
}

#[test]
fn a_job_given_to_the_wrong_exchange_fails_and_is_freed() {
    let (a, b) = (Handles::new(r#"{"offload_min_length": 0}"#), Handles::new(""));
    unsafe {
        rpcedge_exchange_offload(a.exchange);
        rpcedge_exchange_response_head(a.exchange, 200);
        rpcedge_exchange_response_head(b.exchange, 200);
        assert_eq!(feed(a.exchange, &json(2000), RPCEDGE_FEED_END).1.flags, RPCEDGE_OUT_WORK);
        let job = rpcedge_exchange_take_job(a.exchange);
        let mut out = garbage::<RpcedgeOutput>();
        let mut err = garbage::<RpcedgeError>();
        assert_eq!(rpcedge_exchange_complete_job(b.exchange, job, &mut out, &mut err), -1);
        assert!(is_none(&out));
        assert!(message(&err).contains("not taken"), "{}", message(&err));
        // The job's exchange frees nothing twice: it no longer has it.
        assert!(rpcedge_exchange_take_job(a.exchange).is_null());
        // A taken job that is never given back is freed by its holder.
        let c = Handles::new(r#"{"offload_min_length": 0}"#);
        rpcedge_exchange_offload(c.exchange);
        rpcedge_exchange_response_head(c.exchange, 200);
        feed(c.exchange, &json(2000), RPCEDGE_FEED_END);
        rpcedge_job_free(rpcedge_exchange_take_job(c.exchange));
    }
}

#[test]
fn failures_say_respond_before_the_headers_and_reset_after() {
    unsafe {
        // Held headers (a declared length), then a body that overruns it: answer 502.
        let h = Handles::new("");
        rpcedge_exchange_response_content_length(h.exchange, 2000);
        assert_eq!(rpcedge_exchange_response_head(h.exchange, 200), RPCEDGE_PLAN_BUFFER);
        let (rc, out, err) = feed(h.exchange, &json(3000), 0);
        assert_eq!(rc, -1);
        assert!(is_none(&out));
        assert!(message(&err).contains("Content-Length"), "{}", message(&err));
        assert_eq!(rpcedge_exchange_failure(h.exchange), 502);
        assert_eq!(owned(&rpcedge_exchange_mode(h.exchange)), b"failed");

        // Streaming from the head: the headers are out, so an abort resets.
        let h = Handles::new(r#"{"max_buffer": 1024}"#);
        rpcedge_exchange_response_content_length(h.exchange, 5000);
        assert_eq!(rpcedge_exchange_response_head(h.exchange, 200), RPCEDGE_PLAN_STREAM);
        assert_eq!(feed(h.exchange, &json(2000), 0).0, 0);
        assert_eq!(rpcedge_exchange_abort(h.exchange), RPCEDGE_FAILURE_RESET);
        assert_eq!(feed(h.exchange, &json(10), 0).0, -1, "nothing after a failure");

        // Buffering without a length: an abort before anything went out answers 502.
        let h = Handles::new("");
        rpcedge_exchange_response_head(h.exchange, 200);
        assert_eq!(feed(h.exchange, &json(2000), 0).0, 0);
        assert_eq!(rpcedge_exchange_abort(h.exchange), 502);
    }
}

#[test]
fn a_streamed_answers_edits_carry_the_coding_token_and_a_weakened_etag() {
    let h = Handles::new(r#"{"max_buffer": 1024}"#);
    unsafe {
        header(h.exchange, false, "ETag", "\"v1\"");
        rpcedge_exchange_response_content_length(h.exchange, 5000);
        assert_eq!(rpcedge_exchange_response_head(h.exchange, 200), RPCEDGE_PLAN_STREAM);
        let op = |op, name: &str, value: &str| (op, name.to_string(), value.to_string());
        let ops = header_ops(h.exchange, RPCEDGE_VARY_IN_LINE);
        assert_eq!(
            ops,
            [
                op(RPCEDGE_EDIT_SET, "content-encoding", "gzip"),
                op(RPCEDGE_EDIT_REMOVE, "content-length", ""),
                op(RPCEDGE_EDIT_APPEND, "vary", "Accept-Encoding"),
                op(RPCEDGE_EDIT_SET, "etag", "W/\"v1\""),
                op(RPCEDGE_EDIT_REMOVE, "accept-ranges", ""),
            ]
        );
        // Vary's one value: the same for a host that says Accept-Encoding its own way
        let own_line = header_ops(h.exchange, RPCEDGE_VARY_ENCODING_OWN_LINE);
        assert_eq!(own_line, ops);
    }
}

/// What one `rpcedge_count_*` call adds, as (counter name, amount).
unsafe fn counted(count: impl FnOnce(*mut RpcedgeCount) -> usize) -> Vec<(String, u64)> {
    let mut counts = [garbage::<RpcedgeCount>(); RPCEDGE_COUNTS_MAX];
    let n = count(counts.as_mut_ptr());
    let name = |index: u32| CStr::from_ptr(rpcedge_counter_name(index as usize)).to_str().unwrap().to_string();
    counts[..n].iter().map(|count| (name(count.index), count.amount)).collect()
}

fn adds(counts: &[(&str, u64)]) -> Vec<(String, u64)> {
    counts.iter().map(|&(name, amount)| (name.to_string(), amount)).collect()
}

#[test]
fn counters_are_named_as_envoy_prints_them_and_each_event_says_what_it_adds() {
    let names: Vec<_> =
        (0..rpcedge_counters()).map(|i| unsafe { CStr::from_ptr(rpcedge_counter_name(i)) }.to_str().unwrap()).collect();
    assert!(names.contains(&"rpcedge_responses_oneshot") && names.contains(&"rpcedge_cache_hot_hits"));
    assert!(rpcedge_counter_name(rpcedge_counters()).is_null());
    let h = Handles::new("");
    unsafe {
        rpcedge_exchange_response_content_length(h.exchange, 10);
        assert_eq!(rpcedge_exchange_response_head(h.exchange, 200), RPCEDGE_PLAN_PASS);
        let ended = counted(|counts| rpcedge_count_exchange(h.exchange, 1, 0, counts));
        assert_eq!(ended, adds(&[("rpcedge_responses_small", 1)]), "no zeros");
        let aborted = counted(|counts| rpcedge_count_exchange(h.exchange, 0, 7, counts));
        assert_eq!(aborted, adds(&[("rpcedge_responses_aborted", 1)]), "an aborted exchange counts alone");
        assert!(counted(|counts| rpcedge_count_exchange(ptr::null(), 1, 0, counts)).is_empty());
        assert_eq!(rpcedge_count_exchange(h.exchange, 1, 0, ptr::null_mut()), 0);
        assert_eq!(counted(|counts| rpcedge_count_store(204, counts)), adds(&[("rpcedge_cache_stores_taken", 1)]));
        assert_eq!(counted(|counts| rpcedge_count_store(0, counts)), adds(&[("rpcedge_cache_stores_failed", 1)]));
        assert_eq!(counted(|counts| rpcedge_count_offload(0, counts)), adds(&[("rpcedge_offload_inline", 1)]));
    }
}

#[test]
fn the_cache_counts_its_status_with_the_reason_and_a_refusal_once() {
    let s = SettingsHandle::new("");
    unsafe {
        let batch = br#"[{"jsonrpc":"2.0","id":1,"method":"eth_blockNumber","params":[]}]"#;
        let cache = rpcedge_cache_new(s.0, RpcedgeStr::of(b"n"), POST, RpcedgeStr::of(b"/"), batch.as_ptr(), batch.len(), ptr::null(), 0);
        let bypass = adds(&[("rpcedge_cache_responses_bypass", 1), ("rpcedge_cache_bypass_batch", 1)]);
        assert_eq!(counted(|counts| rpcedge_count_cache(cache, counts)), bypass);
        rpcedge_cache_free(cache);

        const HASH: &str = "0x88e96d4537bea4d9c05d12549907b32561d3bf31f45aae734cdc119f13406cb6";
        let request = format!(r#"{{"jsonrpc":"2.0","id":1,"method":"eth_getBlockByHash","params":["{HASH}",false]}}"#);
        let null = br#"{"jsonrpc":"2.0","id":1,"result":null}"#;
        let cache = rpcedge_cache_new(s.0, RpcedgeStr::of(b"n"), POST, RpcedgeStr::of(b"/"), request.as_ptr(), request.len(), ptr::null(), 0);
        assert_eq!(look_up(cache, None, 0).0, RPCEDGE_CACHE_ASK);
        assert_eq!(looked_up(cache, 404, &[], b"", None, 0), RPCEDGE_CACHE_NODE);
        assert_eq!(counted(|counts| rpcedge_count_cache(cache, counts)), adds(&[("rpcedge_cache_responses_miss", 1)]));
        assert_eq!(rpcedge_cache_response_head(cache, 200, null.len() as i64, ptr::null(), 0), 1);
        assert_eq!(store(cache, null, ptr::null_mut()), 0);
        let refused = adds(&[("rpcedge_cache_stores_refused", 1), ("rpcedge_cache_stores_refused_null", 1)]);
        assert_eq!(counted(|counts| rpcedge_count_refusal(cache, counts)), refused);
        assert!(counted(|counts| rpcedge_count_refusal(cache, counts)).is_empty(), "once");
        rpcedge_cache_free(cache);

        // refused by its head: the host holds no body and makes no store
        let cache = rpcedge_cache_new(s.0, RpcedgeStr::of(b"n"), POST, RpcedgeStr::of(b"/"), request.as_ptr(), request.len(), ptr::null(), 0);
        assert_eq!(look_up(cache, None, 0).0, RPCEDGE_CACHE_ASK);
        assert_eq!(looked_up(cache, 404, &[], b"", None, 0), RPCEDGE_CACHE_NODE);
        let cookie = [c_header("Set-Cookie", "a=b")];
        assert_eq!(rpcedge_cache_response_head(cache, 200, 10, cookie.as_ptr(), 1), 0);
        let refused = adds(&[("rpcedge_cache_stores_refused", 1), ("rpcedge_cache_stores_refused_set_cookie", 1)]);
        assert_eq!(counted(|counts| rpcedge_count_refusal(cache, counts)), refused);
        rpcedge_cache_free(cache);
        assert!(counted(|counts| rpcedge_count_cache(ptr::null(), counts)).is_empty());
    }
}

#[test]
fn a_level_parses_as_auto_or_a_number_in_range() {
    let mut level = 99;
    let mut err = garbage::<RpcedgeError>();
    unsafe {
        assert_eq!(rpcedge_parse_level(b"auto".as_ptr(), 4, &mut level, &mut err), 0);
        assert_eq!(level, 0);
        assert_eq!(rpcedge_parse_level(b"12".as_ptr(), 2, &mut level, &mut err), 0);
        assert_eq!(level, 12);
        for bad in [&b"0"[..], b"13", b"fast", b"", b"-1", b"6 "] {
            assert_eq!(rpcedge_parse_level(bad.as_ptr(), bad.len(), &mut level, &mut err), -1, "{bad:?}");
            assert_eq!(level, 12, "left alone on an error");
        }
    }
    assert_eq!(message(&err), r#"must be auto or a number from 1 to 12, got "6 ""#);
}

#[test]
fn a_beacon_network_parses_as_off_or_a_chains_name() {
    let mut network = 99;
    let mut err = garbage::<RpcedgeError>();
    unsafe {
        assert_eq!(rpcedge_parse_beacon_network(b"Hoodi".as_ptr(), 5, &mut network, &mut err), 0);
        assert_eq!(BeaconNetwork::from_raw(network), Some(BeaconNetwork::Hoodi));
        assert_eq!(rpcedge_parse_beacon_network(b"off".as_ptr(), 3, &mut network, &mut err), 0);
        assert_eq!(network, 0);
        assert_eq!(rpcedge_parse_beacon_network(b"mainnet".as_ptr(), 7, &mut network, &mut err), 0);
        for bad in [&b"goerli"[..], b"", b"mainnet ", b"1"] {
            assert_eq!(rpcedge_parse_beacon_network(bad.as_ptr(), bad.len(), &mut network, &mut err), -1, "{bad:?}");
            assert_eq!(BeaconNetwork::from_raw(network), Some(BeaconNetwork::Mainnet), "left alone on an error");
        }
    }
    assert_eq!(message(&err), r#"must be off or one of mainnet, sepolia, hoodi, holesky, got "1""#);
    let config = RpcedgeConfig { beacon_network: BeaconNetwork::to_raw(Some(BeaconNetwork::Sepolia)), ..rpcedge_config_default() };
    let settings = unsafe { rpcedge_settings_new(&config, &mut err) };
    assert_eq!(unsafe { &(*settings).0 }.beacon_network, Some(BeaconNetwork::Sepolia));
    unsafe { rpcedge_settings_free(settings) };
}

unsafe fn owned(s: &RpcedgeStr) -> Vec<u8> {
    bytes(s.data, s.len).to_vec()
}

#[test]
fn a_cache_miss_is_stored_and_spliced_back_as_a_gzip_hit_through_the_c_abi() {
    let s = SettingsHandle::new("");
    const HASH: &str = "0x88e96d4537bea4d9c05d12549907b32561d3bf31f45aae734cdc119f13406cb6";
    let request = format!(r#"{{"jsonrpc":"2.0","id":1,"method":"eth_getBlockByHash","params":["{HASH}",false]}}"#);
    let transactions = vec![r#"{"gasUsed":"0x5208","value":"0x0"}"#; 100].join(",");
    let result = format!(r#"{{"hash":"{HASH}","transactions":[{transactions}]}}"#);
    let answer = format!(r#"{{"jsonrpc":"2.0","id":1,"result":{result}}}"#);
    unsafe {
        let gzip_br = [c_header("Accept-Encoding", "gzip, br")];
        let miss = rpcedge_cache_new(s.0, RpcedgeStr::of(b"h/mainnet"), POST, RpcedgeStr::of(b"/"), request.as_ptr(), request.len(), gzip_br.as_ptr(), 1);
        let (step, next) = look_up(miss, None, 0);
        assert_eq!(step, RPCEDGE_CACHE_ASK);
        let lookup = &next.call;
        let path = owned(&lookup.path);
        assert_eq!((owned(&lookup.method), lookup.body.data.is_null()), (b"GET".to_vec(), true));
        let headers = call_headers(lookup);
        assert_eq!(headers[0], (b"x-rpcedge-lock".to_vec(), b"5000".to_vec()), "a miss holds the key");
        assert_eq!((headers[1].0.as_slice(), headers[1].1.len()), (&b"x-rpcedge-holder"[..], 16), "named by its holder");
        let absent = [c_header("X-Rpcedge-Miss", "absent"), c_header("X-Rpcedge-Lock", "held")];
        assert_eq!(looked_up(miss, 404, &absent, b"", None, 0), RPCEDGE_CACHE_NODE, "one lookup for one call");
        assert_eq!(owned(&rpcedge_cache_status(miss, 0)), b"MISS");
        assert_eq!(owned(&rpcedge_cache_status(miss, 1)), b"MISS", "only a bypass has a reason");
        let cors =
            [c_header("Content-Type", "application/json; charset=utf-8"), c_header("Access-Control-Allow-Origin", "*")];
        assert_eq!(rpcedge_cache_response_head(miss, 200, answer.len() as i64, cors.as_ptr(), cors.len()), 1);
        let mut call = garbage();
        assert_eq!(store(miss, answer.as_bytes(), &mut call), 1);
        assert_eq!((owned(&call.method), owned(&call.path)), (b"PUT".to_vec(), path.clone()));
        assert_eq!(call_headers(&call), [(b"x-rpcedge-namespace".to_vec(), b"h/mainnet".to_vec())], "no TTL, nothing to be final");
        assert_eq!(call.timeout_ms, 5000, "the store's timeout");
        let kept = rpcedge_core::cache::Entry::decode(bytes(call.body.data, call.body.len)).unwrap().compact().unwrap();
        assert_eq!(rpcedge_cache_release(miss, &mut call), 0, "the store hands the held key on");
        rpcedge_cache_free(miss);

        // as a host with its own storage: the key, and the entry compacted as the daemon would
        let own = rpcedge_cache_new(s.0, RpcedgeStr::of(b"h/mainnet"), POST, RpcedgeStr::of(b"/"), request.as_ptr(), request.len(), ptr::null(), 0);
        let mut key = garbage();
        assert_eq!(rpcedge_cache_key(own, &mut key), 1);
        let key = owned(&key);
        assert!(path.ends_with(&key), "the key the daemon's path names");
        assert_eq!(rpcedge_cache_found(own, ptr::null(), 0, 0), 0, "nothing kept yet");
        assert_eq!(rpcedge_cache_response_head(own, 200, answer.len() as i64, cors.as_ptr(), cors.len()), 1);
        let mut entry = garbage();
        assert_eq!(rpcedge_cache_keep(own, answer.as_ptr(), answer.len(), &mut entry), 1);
        assert_eq!((owned(&entry.key), owned(&entry.entry), entry.ttl_s), (key, kept.clone(), 0));
        assert!(entry.requires_final.data.is_null());
        rpcedge_cache_free(own);
        let own = rpcedge_cache_new(s.0, RpcedgeStr::of(b"h/mainnet"), POST, RpcedgeStr::of(b"/"), request.as_ptr(), request.len(), ptr::null(), 0);
        assert_eq!(rpcedge_cache_found(own, kept.as_ptr(), kept.len(), 1024), 1, "a hit from the host's own storage");
        let (mut status, mut body) = (garbage(), garbage());
        assert_eq!(rpcedge_cache_hit(own, &mut status, &mut body), 0, "plain: the client takes no gzip");
        assert_eq!((status, bytes(body.data, body.len)), (200, answer.as_bytes()));
        rpcedge_cache_free(own);

        let again = request.replace(r#""id":1"#, r#""id":"two""#);
        let gzip = [c_header("accept-encoding", "gzip")];
        let hit = rpcedge_cache_new(s.0, RpcedgeStr::of(b"h/mainnet"), POST, RpcedgeStr::of(b"/"), again.as_ptr(), again.len(), gzip.as_ptr(), 1);
        // the daemon's hit, kept in a hot tier as it passes
        let locks = Cell::new((0, 0));
        let mut region = vec![0u8; rpcedge_cache_hot_min_region()];
        let hot = hot_tier(&mut region, &locks);
        assert_eq!(rpcedge_cache_hot_init(hot.region, hot.len - 1), 0, "too small");
        assert_eq!(rpcedge_cache_hot_init(hot.region, hot.len), 1);
        let ttl = [c_header("x-rpcedge-ttl", "60")];
        assert_eq!(looked_up(hit, 200, &ttl, &kept, Some(&hot), 1000), RPCEDGE_CACHE_HIT);
        assert_eq!(locks.get(), (1, 1), "the tier is locked while the entry is copied in");
        let (mut status, mut body) = (garbage(), garbage());
        let coding = rpcedge_cache_hit(hit, &mut status, &mut body);
        assert_eq!(owned(&rpcedge_coding_token(coding)), b"gzip");
        assert!(rpcedge_coding_token(0).data.is_null() && rpcedge_coding_token(6).data.is_null(), "plain, or no coding");
        assert_eq!(status, 200);
        assert_eq!(gunzip(bytes(body.data, body.len)), answer.replace(r#""id":1"#, r#""id":"two""#).into_bytes());
        let hit_headers: Vec<(Vec<u8>, Vec<u8>)> = (0..)
            .map_while(|i| {
                let (mut name, mut value) = (garbage(), garbage());
                (rpcedge_cache_hit_header(hit, i, &mut name, &mut value) == 1).then(|| (owned(&name), owned(&value)))
            })
            .collect();
        let expected: [(&[u8], &[u8]); 4] = [
            (b"content-type", b"application/json; charset=utf-8"),
            (b"content-encoding", b"gzip"),
            (b"vary", b"Accept-Encoding"),
            (b"access-control-allow-origin", b"*"),
        ];
        assert_eq!(hit_headers, expected.map(|(n, v)| (n.to_vec(), v.to_vec())), "the node's headers kept");
        assert_eq!(owned(&rpcedge_cache_status(hit, 0)), b"HIT");
        assert_eq!(counted(|counts| rpcedge_count_cache(hit, counts)), adds(&[("rpcedge_cache_responses_hit", 1)]));

        rpcedge_cache_free(hit);

        // which answers the next request without the daemon
        let third = request.replace(r#""id":1"#, r#""id":3"#);
        let from_hot = rpcedge_cache_new(s.0, RpcedgeStr::of(b"h/mainnet"), POST, RpcedgeStr::of(b"/"), third.as_ptr(), third.len(), ptr::null(), 0);
        assert_eq!(look_up(from_hot, Some(&hot), 1000).0, RPCEDGE_CACHE_HIT);
        assert_eq!(locks.get(), (2, 2), "and while it is copied out");
        assert_eq!(rpcedge_cache_hit(from_hot, &mut status, &mut body), 0, "plain: the client takes no gzip");
        assert_eq!(status, 200);
        assert_eq!(bytes(body.data, body.len), answer.replace(r#""id":1"#, r#""id":3"#).as_bytes());
        assert_eq!(owned(&rpcedge_cache_status(from_hot, 0)), b"HIT");
        let hot_hit = adds(&[("rpcedge_cache_responses_hit", 1), ("rpcedge_cache_hot_hits", 1)]);
        assert_eq!(counted(|counts| rpcedge_count_cache(from_hot, counts)), hot_hit);
        rpcedge_cache_free(from_hot);
        let late = rpcedge_cache_new(s.0, RpcedgeStr::of(b"h/mainnet"), POST, RpcedgeStr::of(b"/"), third.as_ptr(), third.len(), ptr::null(), 0);
        assert_eq!(look_up(late, Some(&hot), 1000 + rpcedge_core::cache::HOT_MAX_AGE_S).0, RPCEDGE_CACHE_ASK, "aged out");
        rpcedge_cache_free(late);
        assert_eq!(look_up(ptr::null_mut(), Some(&hot), 1000).0, RPCEDGE_CACHE_NODE);
        assert_eq!(locks.get(), (3, 3));
        // a tier lent with a lock and no unlock is not used: it would stay locked
        let half = RpcedgeHotTier { unlock: None, ..hot_tier(&mut region, &locks) };
        let fourth = rpcedge_cache_new(s.0, RpcedgeStr::of(b"h/mainnet"), POST, RpcedgeStr::of(b"/"), third.as_ptr(), third.len(), ptr::null(), 0);
        assert_eq!(look_up(fourth, Some(&half), 1000).0, RPCEDGE_CACHE_ASK);
        assert_eq!(locks.get(), (3, 3));
        rpcedge_cache_free(fourth);
    }
}

#[test]
fn without_a_namespace_the_request_bypasses_and_the_namespace_splits_keys() {
    let s = SettingsHandle::new("");
    let request = br#"{"jsonrpc":"2.0","id":1,"method":"eth_chainId","params":[]}"#;
    let path_in = |ns| unsafe {
        let cache = rpcedge_cache_new(s.0, ns, POST, RpcedgeStr::of(b"/"), request.as_ptr(), request.len(), ptr::null(), 0);
        let (step, next) = look_up(cache, None, 0);
        let path = (step == RPCEDGE_CACHE_ASK).then(|| owned(&next.call.path));
        let status = owned(&rpcedge_cache_status(cache, 0));
        rpcedge_cache_free(cache);
        (path, status)
    };
    assert_eq!(path_in(RpcedgeStr::NONE), (None, b"BYPASS".to_vec()));
    let mainnet = path_in(RpcedgeStr::of(b"mainnet")).0.expect("a lookup");
    assert_ne!(Some(mainnet), path_in(RpcedgeStr::of(b"sepolia")).0);
}

const POST: RpcedgeStr = RpcedgeStr { data: b"POST".as_ptr(), len: 4 };

/// The first step of `cache`'s lookups, with a hot tier at `now_s` (a `min_length` of 1024), and
/// what it names.
unsafe fn look_up(cache: *mut RpcedgeCache, hot: Option<&RpcedgeHotTier>, now_s: u64) -> (i32, RpcedgeCacheNext) {
    let mut next = garbage();
    let hot = hot.map_or(ptr::null(), |hot| hot as *const RpcedgeHotTier);
    let step = rpcedge_cache_look_up(cache, hot, now_s, 1024, &mut next);
    (step, next)
}

/// The node's whole `body`, passed in two pieces (each kept for the store), then its stores.
unsafe fn store(cache: *mut RpcedgeCache, body: &[u8], call: *mut RpcedgeDaemonCall) -> i32 {
    let (first, rest) = body.split_at(body.len() / 2);
    assert_eq!(rpcedge_cache_pass(cache, first.as_ptr(), first.len(), 0, ptr::null_mut()), RPCEDGE_PASS_KEPT);
    assert_eq!(rpcedge_cache_pass(cache, rest.as_ptr(), rest.len(), 1, ptr::null_mut()), RPCEDGE_PASS_KEPT);
    rpcedge_cache_store(cache, call)
}

/// The next step after the daemon's answer (`status` 0: the lookup failed).
unsafe fn looked_up(
    cache: *mut RpcedgeCache,
    status: u16,
    headers: &[RpcedgeHeader],
    body: &[u8],
    hot: Option<&RpcedgeHotTier>,
    now_s: u64,
) -> i32 {
    let hot = hot.map_or(ptr::null(), |hot| hot as *const RpcedgeHotTier);
    let (headers, n, body_len) = (headers.as_ptr(), headers.len(), body.len());
    rpcedge_cache_looked_up(cache, status, headers, n, body.as_ptr(), body_len, hot, now_s, 1024, &mut garbage())
}

/// A hot tier in `region`, whose lock counts how often it is taken and let go in `locks`.
fn hot_tier(region: &mut [u8], locks: &Cell<(u32, u32)>) -> RpcedgeHotTier {
    unsafe extern "C" fn lock(data: *mut c_void) {
        let locks = &*(data as *const Cell<(u32, u32)>);
        let (taken, released) = locks.get();
        assert_eq!(taken, released, "not taken twice");
        locks.set((taken + 1, released));
    }
    unsafe extern "C" fn unlock(data: *mut c_void) {
        let locks = &*(data as *const Cell<(u32, u32)>);
        let (taken, released) = locks.get();
        locks.set((taken, released + 1));
    }
    let data = locks as *const Cell<(u32, u32)> as *mut c_void;
    RpcedgeHotTier { region: region.as_mut_ptr(), len: region.len(), lock: Some(lock), unlock: Some(unlock), data }
}

/// A daemon call's headers, as C reads them.
fn call_headers(call: &RpcedgeDaemonCall) -> Vec<(Vec<u8>, Vec<u8>)> {
    let headers = unsafe { std::slice::from_raw_parts(call.headers, call.headers_len) };
    headers.iter().map(|h| unsafe { (bytes(h.name, h.name_len).to_vec(), bytes(h.value, h.value_len).to_vec()) }).collect()
}

fn c_header(name: &'static str, value: &'static str) -> RpcedgeHeader {
    RpcedgeHeader { name: name.as_ptr(), name_len: name.len(), value: value.as_ptr(), value_len: value.len() }
}

#[test]
fn a_request_the_cache_does_not_take_has_no_lookup_and_null_handles_are_refused() {
    let s = SettingsHandle::new("");
    unsafe {
        // two calls with one id: their answers could not be told apart
        let batch = br#"[{"jsonrpc":"2.0","id":1,"method":"eth_chainId"},{"jsonrpc":"2.0","id":1,"method":"eth_chainId"}]"#;
        let cache = rpcedge_cache_new(s.0, RpcedgeStr::of(b"n"), POST, RpcedgeStr::of(b"/"), batch.as_ptr(), batch.len(), ptr::null(), 0);
        let locks = Cell::new((0, 0));
        let mut region = vec![0u8; rpcedge_cache_hot_min_region()];
        let hot = hot_tier(&mut region, &locks);
        assert_eq!(rpcedge_cache_hot_init(hot.region, hot.len), 1);
        let (step, next) = look_up(cache, Some(&hot), 0);
        assert_eq!(step, RPCEDGE_CACHE_NODE);
        assert!(next.call.path.data.is_null() && next.node_body.data.is_null(), "the client's own body");
        assert_eq!(locks.get(), (0, 0), "a bypass leaves the hot tier's lock alone");
        assert_eq!(owned(&rpcedge_cache_status(cache, 0)), b"BYPASS");
        assert_eq!(owned(&rpcedge_cache_status(cache, 1)), b"BYPASS; reason=batch");
        assert_eq!(rpcedge_cache_response_head(cache, 200, 10, ptr::null(), 0), 0);
        rpcedge_cache_free(cache);
        // a body the host does not hold whole
        let spilled = rpcedge_cache_new(s.0, RpcedgeStr::of(b"n"), POST, RpcedgeStr::of(b"/"), ptr::null(), 0, ptr::null(), 0);
        assert_eq!(rpcedge_cache_look_up(spilled, ptr::null(), 0, 0, ptr::null_mut()), RPCEDGE_CACHE_NODE);
        rpcedge_cache_free(spilled);
        let null = ptr::null_mut();
        assert_eq!(rpcedge_cache_pass(null, b"x".as_ptr(), 1, 1, ptr::null_mut()), RPCEDGE_PASS_ON);
        assert_eq!(rpcedge_cache_keep(null, ptr::null(), 0, ptr::null_mut()), 0);
        assert_eq!(rpcedge_cache_key(null, ptr::null_mut()), 0);
        assert_eq!(rpcedge_cache_release(null, ptr::null_mut()), 0);
        assert_eq!(rpcedge_cache_look_up(null, ptr::null(), 0, 0, ptr::null_mut()), RPCEDGE_CACHE_NODE);
        assert_eq!(looked_up(null, 200, &[], b"", None, 0), RPCEDGE_CACHE_NODE);
        let mut call = garbage();
        assert_eq!(rpcedge_cache_store(null, &mut call), 0);
        assert!(call.path.data.is_null() && call.body.data.is_null());
        rpcedge_cache_free(null);
    }
}

/// The cache's settings come from the configuration, through either constructor: nginx's struct
/// (with the core's defaults and bounds) and the JSON of Envoy and the Lua binding.
#[test]
fn the_cache_runs_with_the_settings_it_is_given() {
    let request = br#"{"jsonrpc":"2.0","id":1,"method":"eth_chainId","params":[]}"#;
    let answer = br#"{"jsonrpc":"2.0","id":1,"result":"0x1"}"#;
    let d = rpcedge_config_default();
    let defaults = (d.cache_timeout_ms, d.cache_store_timeout_s, d.cache_max_request, d.cache_max_entry);
    assert_eq!((defaults, d.cache_chain_ttl_s), ((50, 5, 64 * 1024, 8 << 20), 3600));
    unsafe {
        let limited = |max_request: usize, max_entry: usize| {
            let config = RpcedgeConfig {
                cache_max_request: max_request as u64,
                cache_max_entry: max_entry as u64,
                cache_chain_ttl_s: 60,
                ..rpcedge_config_default()
            };
            let settings = rpcedge_settings_new(&config, ptr::null_mut());
            assert!(!settings.is_null());
            SettingsHandle(settings)
        };
        let json = format!(r#"{{"cache": {{"max_request": {}, "max_entry": {}}}}}"#, request.len(), answer.len() - 1);
        for s in [limited(request.len(), answer.len() - 1), SettingsHandle::new(&json)] {
            assert_eq!(rpcedge_cache_takes_length(s.0, request.len() as u64), 1);
            assert_eq!(rpcedge_cache_takes_length(s.0, request.len() as u64 + 1), 0);
            let cache = rpcedge_cache_new(s.0, RpcedgeStr::of(b"n"), POST, RpcedgeStr::of(b"/"), request.as_ptr(), request.len(), ptr::null(), 0);
            assert_eq!(rpcedge_cache_look_up(cache, ptr::null(), 0, 0, ptr::null_mut()), RPCEDGE_CACHE_ASK);
            assert_eq!(looked_up(cache, 404, &[], b"", None, 0), RPCEDGE_CACHE_NODE);
            assert_eq!(
                rpcedge_cache_response_head(cache, 200, answer.len() as i64, ptr::null(), 0),
                0,
                "over max_entry"
            );
            assert_eq!(owned(&rpcedge_cache_status(cache, 0)), b"BYPASS");
            assert_eq!(owned(&rpcedge_cache_status(cache, 1)), b"BYPASS; reason=answer");
            rpcedge_cache_free(cache);
        }
        let s = limited(request.len() - 1, answer.len());
        let cache = rpcedge_cache_new(s.0, RpcedgeStr::of(b"n"), POST, RpcedgeStr::of(b"/"), request.as_ptr(), request.len(), ptr::null(), 0);
        let too_large = adds(&[("rpcedge_cache_responses_bypass", 1), ("rpcedge_cache_bypass_too_large", 1)]);
        assert_eq!(counted(|counts| rpcedge_count_cache(cache, counts)), too_large);
        rpcedge_cache_free(cache);
        // the chain TTL the store carries
        let s = limited(request.len(), answer.len());
        let cache = rpcedge_cache_new(s.0, RpcedgeStr::of(b"n"), POST, RpcedgeStr::of(b"/"), request.as_ptr(), request.len(), ptr::null(), 0);
        assert_eq!(look_up(cache, None, 0).0, RPCEDGE_CACHE_ASK);
        assert_eq!(looked_up(cache, 404, &[], b"", None, 0), RPCEDGE_CACHE_NODE);
        assert_eq!(rpcedge_cache_response_head(cache, 200, answer.len() as i64, ptr::null(), 0), 1);
        let mut call = garbage();
        assert_eq!(store(cache, answer, &mut call), 1);
        assert!(call_headers(&call).contains(&(b"x-rpcedge-ttl".to_vec(), b"60".to_vec())));
        rpcedge_cache_free(cache);
        // and the TTL a host that keeps entries itself is given
        let cache = rpcedge_cache_new(s.0, RpcedgeStr::of(b"n"), POST, RpcedgeStr::of(b"/"), request.as_ptr(), request.len(), ptr::null(), 0);
        assert_eq!(rpcedge_cache_found(cache, ptr::null(), 0, 0), 0);
        assert_eq!(rpcedge_cache_response_head(cache, 200, answer.len() as i64, ptr::null(), 0), 1);
        let mut kept = garbage();
        assert_eq!(rpcedge_cache_keep(cache, answer.as_ptr(), answer.len(), &mut kept), 1);
        assert_eq!(kept.ttl_s, 60);
        assert!(kept.requires_final.data.is_null());
        rpcedge_cache_free(cache);

        // out of bounds, named as the field; without settings, no cache
        let mut err = garbage::<RpcedgeError>();
        let config = RpcedgeConfig { cache_max_entry: (64 << 20) + 1, ..rpcedge_config_default() };
        assert!(rpcedge_settings_new(&config, &mut err).is_null());
        assert_eq!(CStr::from_ptr(err.field.as_ptr()), c"cache_max_entry");
        let config = RpcedgeConfig { cache_store_timeout_s: 0, ..rpcedge_config_default() };
        assert!(rpcedge_settings_new(&config, &mut err).is_null());
        assert_eq!(CStr::from_ptr(err.field.as_ptr()), c"cache_store_timeout_s");
        assert!(rpcedge_cache_new(ptr::null(), RpcedgeStr::of(b"n"), POST, RpcedgeStr::of(b"/"), request.as_ptr(), request.len(), ptr::null(), 0).is_null());
        assert_eq!(rpcedge_cache_takes_length(ptr::null(), 0), 0);
    }
}

#[test]
fn a_json_cache_section_is_read_back_for_a_host_that_finds_its_daemon_there() {
    unsafe {
        let json = br#"{"min_length": 512, "cache": {"cluster": "127.0.0.1:18090", "namespace": "mainnet",
            "store_timeout_s": 7, "status_reason": true}}"#;
        let settings = rpcedge_settings_from_json(json.as_ptr(), json.len(), ptr::null_mut());
        let mut host = garbage::<RpcedgeCacheHost>();
        assert_eq!(rpcedge_settings_cache(settings, &mut host), 1);
        let read = (owned(&host.cluster), owned(&host.ns), host.hot_bytes, host.min_length);
        assert_eq!(read, (b"127.0.0.1:18090".to_vec(), b"mainnet".to_vec(), 0, 512));
        assert_eq!((host.status_header, host.status_reason), (1, 1));
        rpcedge_settings_free(settings);

        // no namespace: none; disabled, absent or no settings: no cache
        for (json, enabled) in [(&br#"{"cache": {}}"#[..], 1), (br#"{"cache": {"enabled": false}}"#, 0), (b"{}", 0)] {
            let settings = rpcedge_settings_from_json(json.as_ptr(), json.len(), ptr::null_mut());
            let mut host = garbage::<RpcedgeCacheHost>();
            assert_eq!(rpcedge_settings_cache(settings, &mut host), enabled);
            if enabled == 1 {
                assert!(host.ns.data.is_null());
            }
            rpcedge_settings_free(settings);
        }
        assert_eq!(rpcedge_settings_cache(ptr::null(), ptr::null_mut()), 0);
    }
}

#[test]
fn a_dictionary_location_answers_with_the_cores_reply_and_refuses_a_bad_pattern() {
    unsafe {
        let mut err = garbage::<RpcedgeError>();
        let bad = b"/\"quoted\"";
        assert!(rpcedge_dictionary_new(bad.as_ptr(), bad.len(), &mut err).is_null());
        assert_eq!(CStr::from_ptr(err.field.as_ptr()).to_str().unwrap(), "rpcedge_dictionary");
        let pattern = b"/rpc/*";
        let dictionary = rpcedge_dictionary_new(pattern.as_ptr(), pattern.len(), &mut err);
        assert!(!dictionary.is_null());
        let mut reply = garbage::<RpcedgeDictionaryReply>();
        for (method, status, body) in [(&b"GET"[..], 200, rpcedge_core::dictionary::DICTIONARY.len()), (b"HEAD", 200, rpcedge_core::dictionary::DICTIONARY.len()), (b"POST", 405, 0)] {
            assert_eq!(rpcedge_dictionary_reply(dictionary, method.as_ptr(), method.len(), ptr::null(), 0, &mut reply), 0);
            assert_eq!((reply.status, reply.body_len), (status, body));
        }
        let header = &*reply.headers;
        let allow = (bytes(header.name, header.name_len), bytes(header.value, header.value_len));
        assert_eq!((reply.headers_len, allow), (1, (&b"allow"[..], &b"GET, HEAD"[..])));
        assert_eq!(rpcedge_dictionary_reply(ptr::null(), ptr::null(), 0, ptr::null(), 0, &mut reply), -1);
        rpcedge_dictionary_free(dictionary);
    }
}
