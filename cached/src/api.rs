//! The HTTP/1.1 API the proxies call.
//!
//! - `GET /v1/entries/{key}`: 200 with the stored entry (and `X-Rpcedge-Ttl`, the seconds left,
//!   when it expires), or 404 with `X-Rpcedge-Miss: absent|expired|bad`;
//! - `PUT /v1/entries/{key}`: the entry as a host encodes it (`rpcedge_core::cache::encode`), with
//!   `X-Rpcedge-Namespace`, and `X-Rpcedge-Ttl` (seconds) or `X-Rpcedge-Requires-Final` (a block
//!   number, a transaction hash whose block the daemon finds, or `slot:` and a Beacon-chain slot)
//!   as the core's capture says, and `X-Rpcedge-Block-Hash` where the answer names that block's
//!   hash: 204 stored, 409 refused (`X-Rpcedge-Refusal`), 400 bad;
//! - `DELETE /v1/entries/{key}`: 204;
//! - coalescing (`protocol::LOCK_HEADER`): a `GET` of an entry with `X-Rpcedge-Lock: <ms>` that
//!   misses holds the key (`X-Rpcedge-Lock: held` on the 404) or is told another request holds it
//!   (`X-Rpcedge-Miss: in_flight`); `GET /v1/flights/{key}` waits for the holder's `PUT` (200 with
//!   its entry, stored or not) or 404 (`X-Rpcedge-Miss: released|timeout`); the holder's
//!   `DELETE /v1/flights/{key}` releases it (204), by the `X-Rpcedge-Holder` its lookup named;
//! - `POST /v1/lookup`: keys in hex, one per line (at most 100): 200 with what each one found
//!   (`protocol::Looked`), in order; 400 for a bad key, 413 for more keys;
//! - `/v1/stats` (JSON), `/metrics` (Prometheus text), `/healthz`.

use std::convert::Infallible;
use std::fmt::Write as _;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper::body::Incoming;
use hyper::header::{self, HeaderMap, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use rpcedge_core::cache::protocol::{self, Looked};
use rpcedge_core::cache::{self, Entry, Final, MinLengths};

use crate::finality::Chain;
use crate::fleet::{Hold, Outcome};
use crate::flights::{Landing, Lock};
use crate::read_through;
use crate::state::{Refusals, State};
use crate::store::Lookup;
use crate::units::now_s;

type Body = Full<Bytes>;

pub async fn handle(request: Request<Incoming>, state: Arc<State>) -> Result<Response<Body>, Infallible> {
    let path = request.uri().path().to_string();
    let response = match (request.method(), path.as_str()) {
        (&Method::GET, "/healthz") => text(StatusCode::OK, "ok\n"),
        (&Method::GET, "/metrics") => metrics(&state),
        (&Method::GET, "/v1/stats") => stats(&state),
        (&Method::POST, protocol::LOOKUP_PATH) => lookup_many(request, &state).await,
        (method, path) => match path.strip_prefix(protocol::ENTRIES_PATH).map(parse_key) {
            Some(Some(key)) => match *method {
                Method::GET => get(&state, &key, request.headers()).await,
                Method::PUT => put(request, state, key).await,
                Method::DELETE => delete(&state, &key),
                _ => text(StatusCode::METHOD_NOT_ALLOWED, "GET, PUT or DELETE\n"),
            },
            Some(None) => text(StatusCode::BAD_REQUEST, "a key is 64 lower-case hex digits\n"),
            None => match path.strip_prefix(protocol::FLIGHTS_PATH).map(parse_key) {
                Some(Some(key)) => match *method {
                    Method::GET => wait(&state, &key).await,
                    Method::DELETE => {
                        release(&state, &key, holder(request.headers()));
                        empty(StatusCode::NO_CONTENT)
                    }
                    _ => text(StatusCode::METHOD_NOT_ALLOWED, "GET or DELETE\n"),
                },
                Some(None) => text(StatusCode::BAD_REQUEST, "a key is 64 lower-case hex digits\n"),
                None => text(StatusCode::NOT_FOUND, "no such route\n"),
            },
        },
    };
    Ok(response)
}

fn parse_key(hex: &str) -> Option<[u8; 32]> {
    if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
        return None;
    }
    let mut key = [0; 32];
    for (i, byte) in key.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(key)
}

async fn get(state: &Arc<State>, key: &[u8; 32], headers: &HeaderMap) -> Response<Body> {
    let miss = match state.store.get(key, now_s()) {
        Ok(Lookup::Hit(entry, left_s)) => return hit(Bytes::from(entry), left_s),
        Ok(Lookup::Absent) => "absent",
        Ok(Lookup::Expired) => "expired",
        Ok(Lookup::Bad) => "bad",
        Err(error) => return text(StatusCode::INTERNAL_SERVER_ERROR, &format!("{error}\n")),
    };
    let hold = lock_time(headers);
    let lock = hold.map(|hold| state.flights.lock(*key, hold, holder(headers)));
    let mut miss = if lock == Some(Lock::InFlight) { protocol::MISS_IN_FLIGHT } else { miss };
    if let (Some(fleet), false) = (&state.fleet, lock == Some(Lock::InFlight)) {
        let mut found = read_through::fetch(state, fleet, key).await;
        if let (None, Some(Lock::Held), Some(hold)) = (&found, lock, hold) {
            let mut held = fleet.hold(key, hold, false).await;
            if held == Hold::Stored {
                // another host's entry landed since the lookup; one this daemon cannot open does
                // not keep the key from being held (the holder's settle replaces it)
                found = read_through::fetch(state, fleet, key).await;
                if found.is_none() {
                    held = fleet.hold(key, hold, true).await;
                }
            }
            if held == Hold::Taken {
                // another host's request is at its node: this one waits for its answer too
                state.flights.join(key);
                tokio::spawn(read_through::follow(state.clone(), fleet.clone(), *key, hold));
                miss = protocol::MISS_IN_FLIGHT;
            }
        }
        if let Some((entry, left_s)) = found {
            let entry = Bytes::from(entry);
            if lock == Some(Lock::Held) {
                state.flights.land(key, Some(entry.clone()));
                state.flights.settle(key);
            }
            return hit(entry, left_s);
        }
    }
    let mut response = text(StatusCode::NOT_FOUND, "not stored\n");
    response.headers_mut().insert(protocol::MISS_HEADER, HeaderValue::from_static(miss));
    if lock == Some(Lock::Held) && miss != protocol::MISS_IN_FLIGHT {
        response.headers_mut().insert(protocol::LOCK_HEADER, HeaderValue::from_static(protocol::LOCK_HELD));
    }
    response
}

/// A hit's answer: the entry, and the seconds it has left.
fn hit(entry: Bytes, left_s: Option<u64>) -> Response<Body> {
    let mut response = Response::new(Full::new(entry));
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/octet-stream"));
    if let Some(left_s) = left_s {
        // so that a proxy's hot tier keeps it no longer than this
        response.headers_mut().insert(protocol::TTL_HEADER, HeaderValue::from(left_s));
    }
    response
}

/// The holder of `key` (the request `holder` names, or whichever holds it) has no answer to
/// share: its waiters, here and on other hosts, go to their node.
fn release(state: &State, key: &[u8; 32], holder: Option<u64>) {
    if !state.flights.release(key, holder) {
        return;
    }
    if let Some(fleet) = &state.fleet {
        let (fleet, key) = (fleet.clone(), *key);
        tokio::spawn(async move { fleet.settle(&key, Outcome::Released).await });
    }
}

/// The request a locking lookup or a release names (`X-Rpcedge-Holder`, 16 hex digits); none
/// without one, or with one that is not that.
fn holder(headers: &HeaderMap) -> Option<u64> {
    let hex = headers.get(protocol::HOLDER_HEADER)?.to_str().ok()?;
    (hex.len() == 16).then(|| u64::from_str_radix(hex, 16).ok()).flatten()
}

/// How long a lookup asks to hold its key if it misses: its `X-Rpcedge-Lock`, in milliseconds
/// (at most `MAX_LOCK_MS`); none without one, or with one that is not a number.
fn lock_time(headers: &HeaderMap) -> Option<Duration> {
    let ms: u64 = headers.get(protocol::LOCK_HEADER)?.to_str().ok()?.trim().parse().ok()?;
    Some(Duration::from_millis(ms.clamp(1, protocol::MAX_LOCK_MS)))
}

/// A waiter of `key`: the entry its holder stores, or why there is none.
async fn wait(state: &State, key: &[u8; 32]) -> Response<Body> {
    let miss = match state.flights.wait(key).await {
        Landing::Entry(entry) => {
            let mut response = Response::new(Full::new(entry));
            response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/octet-stream"));
            return response;
        }
        Landing::Released => protocol::MISS_RELEASED,
        Landing::TimedOut => protocol::MISS_TIMEOUT,
    };
    let mut response = text(StatusCode::NOT_FOUND, "no answer to share\n");
    response.headers_mut().insert(protocol::MISS_HEADER, HeaderValue::from_static(miss));
    response
}

/// Several keys in one round trip, each looked up (and counted) as a `GET` would.
async fn lookup_many(request: Request<Incoming>, state: &State) -> Response<Body> {
    // a key and its line end (CR LF at most) per key
    let bound = protocol::MAX_LOOKUP_KEYS * 66;
    let sent = match Limited::new(request.into_body(), bound).collect().await {
        Ok(body) => body.to_bytes(),
        Err(error) if error.is::<LengthLimitError>() => {
            return text(StatusCode::PAYLOAD_TOO_LARGE, &format!("at most {} keys\n", protocol::MAX_LOOKUP_KEYS));
        }
        Err(error) => return text(StatusCode::BAD_REQUEST, &format!("reading the body: {error}\n")),
    };
    let keys: Option<Vec<[u8; 32]>> = std::str::from_utf8(&sent)
        .ok()
        .and_then(|keys| keys.lines().filter(|line| !line.is_empty()).map(parse_key).collect());
    let Some(keys) = keys else {
        return text(StatusCode::BAD_REQUEST, "keys are 64 lower-case hex digits, one per line\n");
    };
    if keys.len() > protocol::MAX_LOOKUP_KEYS {
        return text(StatusCode::PAYLOAD_TOO_LARGE, &format!("at most {} keys\n", protocol::MAX_LOOKUP_KEYS));
    }
    let now_s = now_s();
    let mut found = Vec::with_capacity(keys.len());
    for key in &keys {
        match state.store.get(key, now_s) {
            Ok(looked) => found.push(looked),
            Err(error) => return text(StatusCode::INTERNAL_SERVER_ERROR, &format!("{error}\n")),
        }
    }
    if let Some(fleet) = &state.fleet {
        read_through::fetch_many(state, fleet, &keys, &mut found).await;
    }
    let mut body = Vec::new();
    for looked in &found {
        match looked {
            Lookup::Hit(entry, left_s) => Looked::Hit(entry, *left_s),
            Lookup::Absent => Looked::Absent,
            Lookup::Expired => Looked::Expired,
            Lookup::Bad => Looked::Bad,
        }
        .encode(&mut body);
    }
    let mut response = Response::new(Full::new(Bytes::from(body)));
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/octet-stream"));
    response
}

fn delete(state: &State, key: &[u8]) -> Response<Body> {
    match state.store.delete(key) {
        Ok(()) => empty(StatusCode::NO_CONTENT),
        Err(error) => text(StatusCode::INTERNAL_SERVER_ERROR, &format!("{error}\n")),
    }
}

/// How long to keep a PUT's entry, or why not at all.
enum Admission {
    Keep(Option<u64>),
    Refuse(Refused),
}

/// Why an admission refuses an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refused {
    NotFinal,
    NoFinality,
    Unplaced,
    Forked,
    Unpinned,
}

impl Refused {
    /// As `X-Rpcedge-Refusal` and the metrics name it.
    fn as_str(self) -> &'static str {
        match self {
            Refused::NotFinal => "not_final",
            Refused::NoFinality => "no_finality",
            Refused::Unplaced => "unplaced",
            Refused::Forked => "forked",
            Refused::Unpinned => "unpinned",
        }
    }

    fn counter(self, refusals: &Refusals) -> &AtomicU64 {
        match self {
            Refused::NotFinal => &refusals.not_final,
            Refused::NoFinality => &refusals.no_finality,
            Refused::Unplaced => &refusals.unplaced,
            Refused::Forked => &refusals.forked,
            Refused::Unpinned => &refusals.unpinned,
        }
    }
}

async fn admit(headers: &HeaderMap, state: &State) -> Result<Admission, String> {
    let value = |name: &str| headers.get(name).map(|value| value.to_str().map_err(|_| format!("{name}: not text")));
    let ttl_s = value(protocol::TTL_HEADER)
        .map(|ttl| ttl?.trim().parse().map_err(|_| format!("{}: not a number", protocol::TTL_HEADER)))
        .transpose()?;
    let Some(requirement) = value(protocol::REQUIRES_FINAL_HEADER) else {
        return Ok(Admission::Keep(ttl_s));
    };
    let requirement: Final = requirement?
        .parse()
        .map_err(|()| format!("{}: not a block number, a transaction hash or a slot", protocol::REQUIRES_FINAL_HEADER))?;
    let namespace = value(protocol::NAMESPACE_HEADER).ok_or("X-Rpcedge-Requires-Final needs X-Rpcedge-Namespace")??;
    let block_hash = value(protocol::BLOCK_HASH_HEADER).transpose()?;
    if block_hash.is_some_and(|hash| !cache::is_hash_hex(hash)) {
        return Err(format!("{}: not a block hash", protocol::BLOCK_HASH_HEADER));
    }
    let chain = if matches!(requirement, Final::Slot(_)) { Chain::Beacon } else { Chain::Execution };
    let Some(finalized) = state.finality.finalized(namespace, chain) else {
        return Ok(Admission::Refuse(Refused::NoFinality));
    };
    let at = match &requirement {
        Final::Block(number) | Final::Slot(number) => *number,
        Final::Transaction(hash) => match transaction_block(state, namespace, hash).await {
            Some(number) => number,
            None => return Ok(Admission::Refuse(Refused::Unplaced)),
        },
    };
    if at > finalized {
        return Ok(Admission::Refuse(Refused::NotFinal));
    }
    // a final block by another hash is another fork's: its node's answer is not the chain's
    if let (Final::Block(number), Some(named)) = (requirement, block_hash) {
        let what = format!("the hash of block {number}");
        match in_time(namespace, &what, state.finality.block_hash(namespace, number)).await {
            Some(hash) if hash.eq_ignore_ascii_case(named) => {}
            Some(_) => return Ok(Admission::Refuse(Refused::Forked)),
            None => return Ok(Admission::Refuse(Refused::Unpinned)),
        }
    }
    Ok(Admission::Keep(ttl_s))
}

/// How long the namespace's nodes may take to say which block holds a transaction, or a block's
/// hash.
const PLACE_TIMEOUT: Duration = Duration::from_secs(2);

/// The block of the transaction `hash`: by its receipt in the store, else by the namespace's
/// finality node's; none when neither places it.
async fn transaction_block(state: &State, namespace: &str, hash: &str) -> Option<u64> {
    let key = cache::receipt_key(namespace, hash);
    if let Ok(Lookup::Hit(stored, _)) = state.store.read(&key.0, now_s()) {
        let receipt = Entry::decode(&stored).and_then(|entry| entry.respond("1", &[], MinLengths::same(u64::MAX)));
        if let Some(number) = receipt.ok().and_then(|receipt| cache::receipt_block(&receipt.body, hash)) {
            return Some(number);
        }
    }
    in_time(namespace, &format!("placing {hash}"), state.finality.transaction_block(namespace, hash)).await.flatten()
}

/// What `asking` the namespace's finality nodes gives within [`PLACE_TIMEOUT`]; `None`, said on
/// stderr, when it fails or takes longer.
async fn in_time<T>(namespace: &str, what: &str, asking: impl Future<Output = Result<T, String>>) -> Option<T> {
    match tokio::time::timeout(PLACE_TIMEOUT, asking).await {
        Ok(Ok(answer)) => Some(answer),
        Ok(Err(error)) => {
            eprintln!("rpcedge-cached: {what} in {namespace}: {error}");
            None
        }
        Err(_) => {
            eprintln!("rpcedge-cached: {what} in {namespace}: no answer within {PLACE_TIMEOUT:?}");
            None
        }
    }
}

async fn put(request: Request<Incoming>, state: Arc<State>, key: [u8; 32]) -> Response<Body> {
    let (head, body) = request.into_parts();
    let sent = match Limited::new(body, state.max_body).collect().await {
        Ok(body) => body.to_bytes(),
        Err(error) => {
            // the waiters of the key, if any, go to the node themselves
            release(&state, &key, holder(&head.headers));
            if error.is::<LengthLimitError>() {
                state.refusals.too_large.fetch_add(1, Ordering::Relaxed);
                return text(StatusCode::PAYLOAD_TOO_LARGE, &format!("an entry is at most {} bytes\n", state.max_body));
            }
            return text(StatusCode::BAD_REQUEST, &format!("reading the body: {error}\n"));
        }
    };
    if let Err(bad) = Entry::decode(&sent).and_then(|entry| entry.check()) {
        release(&state, &key, holder(&head.headers));
        state.refusals.bad_entry.fetch_add(1, Ordering::Relaxed);
        return text(StatusCode::BAD_REQUEST, &format!("{bad}\n"));
    }
    // The node's answer of this moment, for the requests that wait for it, kept or not: as it
    // will be kept, compacted once, so that a gzip client among them gets it gzip as from a hit,
    // the one compression shared by all of them and the store (which keeps what came compacted).
    let waited = state.flights.has_waiters(&key);
    let sent = if waited {
        match compacted(sent).await {
            Ok(entry) => entry,
            Err(response) => {
                release(&state, &key, holder(&head.headers));
                return response;
            }
        }
    } else {
        sent
    };
    state.flights.land(&key, Some(sent.clone()));
    let (response, kept) = keep(&head.headers, sent.clone(), waited, state.clone(), key).await;
    state.flights.settle(&key);
    if let Some(fleet) = &state.fleet {
        let outcome = match kept {
            Kept::Stored(entry, ttl_s) => Outcome::Stored(entry, ttl_s),
            Kept::Refused => Outcome::Answered(sent),
            Kept::Failed => Outcome::Released,
        };
        match (fleet.holds(&key), outcome) {
            (true, outcome) => {
                let fleet = fleet.clone();
                tokio::spawn(async move { fleet.settle(&key, outcome).await });
            }
            (false, Outcome::Stored(entry, ttl_s)) => fleet.offer(key, entry, ttl_s),
            (false, _) => {}
        }
    }
    response
}

/// What became of a PUT's entry.
enum Kept {
    /// Stored as this (compacted), with this TTL.
    Stored(Bytes, Option<u64>),
    /// Refused by its admission (not final, no finality, unplaced).
    Refused,
    /// Not an entry, or the store failed.
    Failed,
}

/// The entry `sent` as the store keeps it (`Entry::compact`), off the I/O threads: compressing
/// at the highest level takes milliseconds per MiB.
async fn compacted(sent: Bytes) -> Result<Bytes, Response<Body>> {
    match tokio::task::spawn_blocking(move || Entry::decode(&sent).and_then(|entry| entry.compact())).await {
        Ok(Ok(entry)) => Ok(Bytes::from(entry)),
        Ok(Err(bad)) => Err(text(StatusCode::BAD_REQUEST, &format!("{bad}\n"))),
        Err(panic) => Err(text(StatusCode::INTERNAL_SERVER_ERROR, &format!("{panic}\n"))),
    }
}

/// A whole entry, kept as its admission says; `compacted`: as the store keeps it already.
async fn keep(headers: &HeaderMap, sent: Bytes, compacted: bool, state: Arc<State>, key: [u8; 32]) -> (Response<Body>, Kept) {
    let ttl_s = match admit(headers, &state).await {
        Ok(Admission::Keep(ttl_s)) => ttl_s,
        Ok(Admission::Refuse(reason)) => {
            reason.counter(&state.refusals).fetch_add(1, Ordering::Relaxed);
            let mut response = empty(StatusCode::CONFLICT);
            response.headers_mut().insert(protocol::REFUSAL_HEADER, HeaderValue::from_static(reason.as_str()));
            return (response, Kept::Refused);
        }
        Err(reason) => return (text(StatusCode::BAD_REQUEST, &format!("{reason}\n")), Kept::Failed),
    };
    // Compressing at the highest level takes milliseconds per MiB: off the I/O threads.
    let stored = tokio::task::spawn_blocking(move || {
        let entry = match compacted {
            true => Ok(sent),
            false => Entry::decode(&sent).and_then(|entry| entry.compact()).map(Bytes::from),
        };
        match entry {
            Ok(entry) => match state.store.put(&key, &entry, ttl_s, now_s()) {
                Ok(()) => Ok(entry),
                Err(error) => Err((StatusCode::INTERNAL_SERVER_ERROR, error)),
            },
            Err(bad) => Err((StatusCode::BAD_REQUEST, bad.to_string())),
        }
    })
    .await;
    match stored {
        Ok(Ok(entry)) => (empty(StatusCode::NO_CONTENT), Kept::Stored(entry, ttl_s)),
        Ok(Err((status, reason))) => (text(status, &format!("{reason}\n")), Kept::Failed),
        Err(panic) => (text(StatusCode::INTERNAL_SERVER_ERROR, &format!("{panic}\n")), Kept::Failed),
    }
}

/// Every counter and figure: (name, help, Prometheus type, value).
fn figures(state: &State) -> Vec<(String, &'static str, &'static str, u64)> {
    let counters = &state.store.counters;
    let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
    let mut out: Vec<(String, &'static str, &'static str, u64)> = vec![
        ("hits_total".into(), "Lookups answered from the store", "counter", load(&counters.hits)),
        ("misses_total".into(), "Lookups of absent keys", "counter", load(&counters.misses)),
        ("expired_total".into(), "Lookups of expired entries", "counter", load(&counters.expired)),
        ("bad_entries_total".into(), "Stored values that failed their checksum, or that this version cannot read (deleted)", "counter", load(&counters.bad_entries)),
        ("stores_total".into(), "Entries stored", "counter", load(&counters.stores)),
        ("stored_bytes_total".into(), "Bytes of entries stored", "counter", load(&counters.stored_bytes)),
        ("deletes_total".into(), "Deletes", "counter", load(&counters.deletes)),
        ("promotions_total".into(), "Entries asked for again after they were stored, copied to the protected family", "counter", load(&counters.promotions)),
        ("flushes_total".into(), "Flushes of the memtables", "counter", load(&counters.flushes)),
        ("store_reopens_total".into(), "Times the store was opened again after it stopped on an I/O error (a full disk)", "counter", load(&counters.reopens)),
    ];
    let flights = &state.flights.counters;
    out.extend([
        ("locks_held_total".into(), "Misses that held their key while the node answered", "counter", load(&flights.held)),
        ("locks_shared_total".into(), "Waiters answered with the holder's answer", "counter", load(&flights.shared)),
        ("locks_released_total".into(), "Waiters sent to the node: released without an answer", "counter", load(&flights.released)),
        ("locks_timed_out_total".into(), "Waiters sent to the node: the holder's time ran out", "counter", load(&flights.timed_out)),
        ("locks_in_flight".into(), "Keys held, or answered with waiters still to serve", "gauge", state.flights.len() as u64),
    ]);
    let refusals = &state.refusals;
    for (reason, counter) in [
        ("not_final", &refusals.not_final),
        ("no_finality", &refusals.no_finality),
        ("unplaced", &refusals.unplaced),
        ("forked", &refusals.forked),
        ("unpinned", &refusals.unpinned),
        ("bad_entry", &refusals.bad_entry),
        ("too_large", &refusals.too_large),
    ] {
        out.push((format!("refusals_total{{reason=\"{reason}\"}}"), "Entries refused, by reason", "counter", load(counter)));
    }
    for (namespace, chain, finalized) in state.finality.namespaces() {
        if let Some(number) = finalized {
            let name = format!("{}{{namespace=\"{}\"}}", chain.finalized_name(), label(namespace));
            let help = match chain {
                Chain::Execution => "Last finalized block heard",
                Chain::Beacon => "Last finalized slot heard",
            };
            out.push((name, help, "gauge", number));
        }
    }
    for source in state.finality.sources() {
        let labels = format!(
            "namespace=\"{}\",chain=\"{}\",source=\"{}\",host=\"{}\"",
            label(source.namespace),
            source.chain.name(),
            source.place,
            label(source.host)
        );
        let help = "Seconds since this finality source last answered, or since the daemon began asking (what is final waits for every source)";
        out.push((format!("finality_source_silent_seconds{{{labels}}}"), help, "gauge", source.silent_s));
        let help = "Whether this finality source has answered since the daemon started (1) or not yet (0)";
        out.push((format!("finality_source_answered{{{labels}}}"), help, "gauge", source.answered.into()));
        if let Some(said) = source.said {
            let help = "What this finality source last called final: above what is final, a jump still held (--finality-hold)";
            out.push((format!("finality_source_said{{{labels}}}"), help, "gauge", said));
        }
        let help = "Times this finality source called final less than it had before (a lie taken back, another backend, a restart)";
        out.push((format!("finality_source_rewinds_total{{{labels}}}"), help, "counter", source.rewinds));
    }
    if let Some(fleet) = &state.fleet {
        out.extend(fleet.figures());
    }
    for (name, help, value) in state.store.figures() {
        let kind = if name.ends_with("_total") { "counter" } else { "gauge" };
        out.push((name.to_string(), help, kind, value));
    }
    out
}

/// A label's value as the text format writes it.
fn label(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

fn metrics(state: &State) -> Response<Body> {
    let mut text = String::new();
    let mut described = std::collections::HashSet::new();
    for (name, help, kind, value) in figures(state) {
        let family = name.split('{').next().unwrap_or(&name).to_string();
        if described.insert(family.clone()) {
            let _ = writeln!(text, "# HELP rpcedge_cached_{family} {help}\n# TYPE rpcedge_cached_{family} {kind}");
        }
        let _ = writeln!(text, "rpcedge_cached_{name} {value}");
    }
    let mut response = Response::new(Full::new(Bytes::from(text)));
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; version=0.0.4"));
    response
}

fn stats(state: &State) -> Response<Body> {
    let mut figures_json = serde_json::Map::new();
    for (name, _, _, value) in figures(state) {
        figures_json.insert(name, value.into());
    }
    let mut response = Response::new(Full::new(Bytes::from(serde_json::Value::Object(figures_json).to_string())));
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

fn text(status: StatusCode, body: &str) -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::copy_from_slice(body.as_bytes())));
    *response.status_mut() = status;
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    response
}

fn empty(status: StatusCode) -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::new()));
    *response.status_mut() = status;
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_64_lower_case_hex_digits() {
        let hex = "00ff".repeat(16);
        assert_eq!(parse_key(&hex).map(|k| (k[0], k[1])), Some((0, 255)));
        assert_eq!(parse_key(&hex.to_uppercase()), None);
        assert_eq!(parse_key(&hex[1..]), None);
        assert_eq!(parse_key(&format!("{}zz", &hex[2..])), None);
    }
}
