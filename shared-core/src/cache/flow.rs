//! One request's way through the cache, as every host walks it: ask the daemon, answer a hit,
//! or let the node answer and hand what it said to the daemon. The host moves the bytes (its
//! subrequests or HTTP calls, with its own timeout); every decision, the daemon's API and the
//! status a host reports are here, so that nginx and Envoy cannot differ.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};

use super::answer::Held;
use super::batch::{Batch, Failed};
use super::beacon::{self, Answered};
use super::head::{field, named, Head};
use super::hit::{hit_headers, HitResponse};
use super::hot::{HotTier, MAX_AGE_S};
use super::{lookup, protocol, Bypass, CacheSettings, Capture, Entry, Final, Key, MinLengths, Refusal, Request};
use crate::compress::{auto_level, compress_whole};
use crate::negotiate::{Accept, AcceptEncoding, Coding, MediaType};
use crate::transcode::jsonrpc_request;
use sha2::{Digest, Sha256};

/// What a host reports: the `X-Rpcedge-Cache` header, nginx's `$rpcedge_cache_status`, counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Answered from the store; the node never saw the request.
    Hit,
    /// Not in the store: the node answered.
    Miss,
    /// Not a request (or an answer) the cache takes.
    Bypass,
    /// In the store past its expiry: the node answered.
    Expired,
    /// The daemon failed, was too slow or sent a bad entry: the node answered (fail open).
    Error,
    /// Answered with the node's answer to another request for the same key, made while this one
    /// waited (coalescing): the node never saw this one.
    Coalesced,
}

impl Status {
    /// Every status, for a host's counters.
    pub const fn all() -> [Status; 6] {
        [Status::Hit, Status::Miss, Status::Bypass, Status::Expired, Status::Error, Status::Coalesced]
    }

    /// The status header's value.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Hit => "HIT",
            Status::Miss => "MISS",
            Status::Bypass => "BYPASS",
            Status::Expired => "EXPIRED",
            Status::Error => "ERROR",
            Status::Coalesced => "COALESCED",
        }
    }
}

/// The daemon's answer to a lookup, as the host received it.
pub struct DaemonAnswer<'a> {
    pub status: u16,
    /// Its `X-Rpcedge-Miss` header.
    pub miss: Option<&'a [u8]>,
    /// Its `X-Rpcedge-Ttl` header: the seconds a hit has left (none: no expiry).
    pub ttl: Option<&'a [u8]>,
    /// Its `X-Rpcedge-Lock` header: whether the miss holds the key.
    pub lock: Option<&'a [u8]>,
    pub body: &'a [u8],
}

impl<'a> DaemonAnswer<'a> {
    /// The answer from its status, its headers as (name, value) pairs in any case, and its body.
    pub fn read<N: AsRef<[u8]>, V: AsRef<[u8]>>(status: u16, headers: &'a [(N, V)], body: &'a [u8]) -> Self {
        let header = |name| named(headers, name).next();
        DaemonAnswer {
            status,
            miss: header(protocol::MISS_HEADER),
            ttl: header(protocol::TTL_HEADER),
            lock: header(protocol::LOCK_HEADER),
            body,
        }
    }
}

/// Why a stored entry gives no hit.
enum NoHit {
    /// Not an entry: a different version, a torn or foreign value.
    Bad,
    /// An answer for a request with other values of the headers it varies on.
    OtherVariant,
}

/// A call to make to the daemon: a lookup, a store or a release, `method path` with
/// these headers and body (the daemon's protocol, [`protocol`]), waiting at most `timeout_ms` for
/// its answer. A lookup's answer goes to [`CacheExchange::answered`]; a store's or a release's
/// says nothing the exchange needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DaemonRequest {
    pub method: &'static str,
    pub path: String,
    pub headers: Vec<(&'static str, String)>,
    pub body: Vec<u8>,
    pub timeout_ms: u64,
}

/// An answer to keep: its entry under its key, for `ttl_s` seconds (`None`: no expiry), once what
/// `requires_final` names is final (and, with `block_hash`, is that block). The daemon's store carries these; a host that keeps entries
/// itself takes them as they are ([`CacheExchange::keep`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kept {
    pub key: Key,
    pub entry: Vec<u8>,
    pub ttl_s: Option<u64>,
    pub requires_final: Option<Final>,
    /// The hash of the block `requires_final` names, where the answer names one.
    pub block_hash: Option<String>,
}

/// Where a call stands with the key's lock (coalescing).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lock {
    /// Not asked for (a batch, or `lock_timeout_ms` 0), or over with.
    None,
    /// The lookup asks for it: until its answer, the daemon may have made this request the
    /// holder.
    Asked,
    /// Held: the node's answer goes to the daemon as a store, or the key is released.
    Held,
    /// Another request holds it: the next lookup waits for that one's answer.
    InFlight,
    /// The wait is under way.
    Waiting,
}

/// What the store may answer: one call, a batch's calls, or a Beacon-API read.
#[derive(Debug)]
enum Taken {
    Call(Request),
    Batch(Batch),
    Read(beacon::Read),
}

impl Taken {
    /// The key of a request that takes one (not a batch).
    fn key(&self) -> Option<&Key> {
        match self {
            Taken::Call(request) => Some(&request.key),
            Taken::Read(read) => Some(&read.key),
            Taken::Batch(_) => None,
        }
    }

    /// The hit for such a request from the `stored` entry.
    fn hit(
        &self,
        stored: &[u8],
        request_headers: &[(Vec<u8>, Vec<u8>)],
        codings: &[Coding],
        min: MinLengths,
        dictionary: bool,
    ) -> Result<HitResponse, NoHit> {
        let entry = Entry::decode(stored).map_err(|_| NoHit::Bad)?;
        self.hit_from(&entry, request_headers, codings, min, dictionary)
    }

    /// The hit for such a request from an entry read already; `dictionary`: the location makes
    /// dcz.
    fn hit_from(
        &self,
        entry: &Entry,
        request_headers: &[(Vec<u8>, Vec<u8>)],
        codings: &[Coding],
        min: MinLengths,
        dictionary: bool,
    ) -> Result<HitResponse, NoHit> {
        if !Head::is_for(&entry.vary, request_headers) {
            return Err(NoHit::OtherVariant);
        }
        let mut hit = match self {
            Taken::Call(request) => call_hit(request, entry, codings, min),
            Taken::Read(read) => read.hit(entry, codings, min).ok_or(NoHit::Bad),
            Taken::Batch(_) => Err(NoHit::Bad),
        }?;
        // as the node's answer would: whether dcz goes out depends on the client's dictionary
        if dictionary {
            if let Some((_, vary)) = hit.headers.iter_mut().find(|(name, _)| name == "vary") {
                vary.push_str(", Available-Dictionary");
            }
        }
        Ok(hit)
    }
}

/// One request's cache exchange.
#[derive(Debug)]
pub struct CacheExchange {
    request: Result<Taken, Bypass>,
    namespace: String,
    /// The request's headers, while it may be looked up: an entry is for the values of the
    /// headers its answer varies on.
    request_headers: Vec<(Vec<u8>, Vec<u8>)>,
    /// The codings a hit may go out in for this client, its best first.
    codings: Vec<Coding>,
    /// `dictionary_min_length`: the least length of a dcz hit.
    dcz_min_length: u64,
    /// The location makes dcz hits.
    dictionary: bool,
    status: Status,
    /// The store's entry for this request did not read (damaged, or of an older format): the
    /// node's answer is kept in its place, else it would fail every request until it expired.
    bad_entry: bool,
    capture: bool,
    /// What of the node's head the entry keeps, or why the answer is not kept at all.
    head: Result<Head, Refusal>,
    /// What the node's head says of a Beacon-API answer's form.
    answered: Answered,
    /// A daemon's hit, to keep in the hot tier for this many seconds.
    hot_ttl_s: Option<u64>,
    /// The hit made from the entry the hot tier holds for this request.
    hot_hit: Option<HitResponse>,
    /// The call's lookup has been made (a batch knows which of its keys were looked up).
    looked_up: bool,
    /// A batch's node answer is held whole and merged with what the store answered.
    merge: bool,
    /// What is held of the node's body ([`CacheExchange::pass`]).
    pub(super) held: Held,
    /// What a merged batch stores, once merged.
    captures: Vec<Result<Capture, Refusal>>,
    lock: Lock,
    /// The token naming this request to the daemon as the key's holder (`protocol::HOLDER_HEADER`).
    holder: u64,
    settings: CacheSettings,
}

/// The longest node answer to a split batch held for merging, when `max_entry` is less: past it
/// the client gets the store's answers, then the node's as they come.
const MIN_MERGE_HOLD: usize = 64 * 1024;

impl CacheExchange {
    /// Whether a request body of `length` bytes may be looked up at all: a host can skip
    /// reading (or holding) a longer one.
    pub fn takes_length(length: u64, settings: &CacheSettings) -> bool {
        length <= settings.max_request as u64
    }

    /// From the request: the namespace configured where it was routed (none: a bypass), its
    /// method and path (with its query, as the client sent it), its body (`None` when the host
    /// does not hold it whole, as when nginx spilled it to a file) and its headers, as (name,
    /// value) pairs, repeats kept (Accept-Encoding says whether a hit may be gzip; Accept, in
    /// which form a Beacon-API hit goes, and a client that asks for SSZ of a JSON-RPC result with
    /// a schema bypasses the cache, which holds JSON; the rest decide which stored variant is the
    /// client's).
    pub fn new<N: AsRef<[u8]>, V: AsRef<[u8]>>(
        namespace: Option<&str>,
        method: &[u8],
        path: &[u8],
        body: Option<&[u8]>,
        headers: &[(N, V)],
        settings: &CacheSettings,
    ) -> CacheExchange {
        let accept_encoding = field(headers, "accept-encoding").map(|value| {
            let mut accept = AcceptEncoding::parse(&value);
            named(headers, "available-dictionary").for_each(|value| accept.available_dictionary(value));
            accept
        });
        let codings = accept_encoding.map(|accept| accept.rank(&settings.hit_codings)).unwrap_or_default();
        let mut accept = Accept::default();
        named(headers, "accept").for_each(|value| accept.add(value));
        let credentials = ["authorization", "cookie"].iter().any(|name| named(headers, name).next().is_some());
        let namespace = namespace.ok_or(Bypass::Namespace);
        let request = namespace.and_then(|namespace| {
            if credentials {
                return Err(Bypass::Credentials);
            }
            if method == b"GET" {
                return beacon::read(namespace, path, &accept).map(Taken::Read);
            }
            if method != b"POST" {
                return Err(Bypass::NotPost);
            }
            let body = body.ok_or(Bypass::TooLarge)?;
            let ssz = matches!(accept.choose(), Some(MediaType::Ssz(_)));
            // a hit would be JSON: the node's answer, transcoded, is what such a client gets
            if ssz && jsonrpc_request(body).is_some() {
                return Err(Bypass::Ssz);
            }
            if Batch::is_batch(body) {
                return Batch::read(namespace, body, settings).map(Taken::Batch);
            }
            lookup(namespace, body, settings).map(Taken::Call)
        });
        let request_headers = match request {
            Ok(_) => headers.iter().map(|(n, v)| (n.as_ref().to_vec(), v.as_ref().to_vec())).collect(),
            Err(_) => Vec::new(),
        };
        let status = if request.is_ok() { Status::Miss } else { Status::Bypass };
        CacheExchange {
            request,
            namespace: namespace.unwrap_or_default().to_string(),
            request_headers,
            codings,
            dcz_min_length: settings.dictionary_min_length,
            dictionary: settings.hit_codings.contains(&Coding::Dcz),
            status,
            bad_entry: false,
            capture: false,
            head: Ok(Head::default()),
            answered: Answered::default(),
            hot_ttl_s: None,
            hot_hit: None,
            looked_up: false,
            merge: false,
            held: Held::Nothing,
            captures: Vec::new(),
            lock: Lock::None,
            holder: 0,
            settings: settings.clone(),
        }
    }

    /// The lookup to make next, or `None`: on to the node (with [`CacheExchange::node_request`]).
    /// A batch's keys take one multi-key lookup; a call that finds its key in flight takes a
    /// second, the wait for that answer. The host gives each answer to [`CacheExchange::answered`].
    pub(super) fn next_lookup(&mut self) -> Option<DaemonRequest> {
        let request = self.request.as_mut().ok()?;
        if let Taken::Batch(batch) = request {
            return batch.next_lookup().map(|body| DaemonRequest {
                method: protocol::LOOKUP_KEYS_METHOD,
                path: protocol::LOOKUP_PATH.to_string(),
                headers: Vec::new(),
                body,
                timeout_ms: self.settings.lookup_timeout_ms,
            });
        }
        let key = *request.key()?;
        if !self.looked_up {
            self.looked_up = true;
            let lock_ms = self.settings.lock_timeout_ms;
            let mut headers = Vec::new();
            if lock_ms > 0 {
                self.holder = holder_token();
                headers.push((protocol::LOCK_HEADER, lock_ms.to_string()));
                headers.push(self.holder_header());
            }
            self.lock = if lock_ms > 0 { Lock::Asked } else { Lock::None };
            let (path, timeout_ms) = (protocol::entry_path(&key.hex()), self.settings.lookup_timeout_ms);
            let method = protocol::LOOKUP_METHOD;
            return Some(DaemonRequest { method, path, headers, body: Vec::new(), timeout_ms });
        }
        if self.lock != Lock::InFlight {
            return None;
        }
        self.lock = Lock::Waiting;
        // the daemon answers by the holder's deadline, at most lock_timeout_ms from now
        let timeout_ms = self.settings.lock_timeout_ms + self.settings.lookup_timeout_ms;
        let path = protocol::flight_path(&key.hex());
        Some(DaemonRequest { method: protocol::LOOKUP_METHOD, path, headers: Vec::new(), body: Vec::new(), timeout_ms })
    }

    /// The key of a request that takes one (one call or a Beacon-API read; not a batch).
    pub fn key(&self) -> Option<&Key> {
        self.request.as_ref().ok()?.key()
    }

    /// The body to send the node instead of the client's: a batch less the calls the store
    /// answered. `None`: the client's own.
    pub fn node_request(&self) -> Option<Vec<u8>> {
        match &self.request {
            Ok(Taken::Batch(batch)) => batch.node_request(),
            _ => None,
        }
    }

    /// Why the request bypasses the cache, if it does: its own reason, or an answer too large
    /// to keep.
    pub fn bypass(&self) -> Option<Bypass> {
        match &self.request {
            Err(bypass) => Some(*bypass),
            Ok(_) => (self.status == Status::Bypass).then_some(Bypass::Answer),
        }
    }

    /// The daemon answered the lookup: the hit to send, or `None` to make the next lookup, if
    /// any, then ask the node.
    pub(super) fn answered(&mut self, answer: &DaemonAnswer, min_length: u64) -> Option<HitResponse> {
        let min = self.min_lengths(min_length);
        let request = match self.request.as_mut().ok()? {
            Taken::Batch(batch) => {
                if batch.answered(answer.status, answer.body).is_err() {
                    self.status = Status::Error;
                }
                return self.batch_hit(min_length);
            }
            request => request,
        };
        let waited = self.lock == Lock::Waiting;
        self.lock = match (self.lock, answer.status) {
            (Lock::Asked, 404) if answer.miss == Some(protocol::MISS_IN_FLIGHT.as_bytes()) => Lock::InFlight,
            (Lock::Asked, 404) if answer.lock == Some(protocol::LOCK_HELD.as_bytes()) => Lock::Held,
            _ => Lock::None,
        };
        match answer.status {
            200 => match request.hit(answer.body, &self.request_headers, &self.codings, min, self.dictionary) {
                // the answer another request got from the node, which may not be stored: not kept hot
                Ok(hit) if waited => {
                    self.status = Status::Coalesced;
                    let call = matches!(request, Taken::Call(_));
                    Some(if call { compressed(hit, &self.codings, min) } else { hit })
                }
                Ok(hit) => {
                    self.status = Status::Hit;
                    let ttl = answer.ttl.and_then(|ttl| std::str::from_utf8(ttl).ok()?.trim().parse().ok());
                    self.hot_ttl_s = Some(ttl.unwrap_or(MAX_AGE_S));
                    Some(hit)
                }
                Err(NoHit::OtherVariant) => {
                    // the node answers this client, and its answer takes the entry's place
                    self.status = Status::Miss;
                    None
                }
                Err(NoHit::Bad) => {
                    self.status = Status::Error;
                    self.bad_entry = true;
                    None
                }
            },
            // a wait that ends without an answer (released, out of time) is a miss: to the node
            404 if waited => {
                self.status = Status::Miss;
                None
            }
            404 => {
                self.status = if answer.miss == Some(b"expired") { Status::Expired } else { Status::Miss };
                None
            }
            _ => {
                self.status = Status::Error;
                None
            }
        }
    }

    /// For a host that keeps entries itself rather than in the daemon: the entry its storage holds
    /// under this request's key ([`CacheExchange::key`]), or none. The hit to send, as for
    /// [`CacheExchange::answered`].
    pub fn found(&mut self, entry: Option<&[u8]>, min_length: u64) -> Option<HitResponse> {
        let status = if entry.is_some() { 200 } else { 404 };
        let answer = DaemonAnswer { status, miss: None, ttl: None, lock: None, body: entry.unwrap_or_default() };
        self.answered(&answer, min_length)
    }

    /// A batch's calls answered from what was found so far: the whole batch's hit, if every call
    /// has its answer.
    fn batch_hit(&mut self, min_length: u64) -> Option<HitResponse> {
        let Ok(Taken::Batch(batch)) = &mut self.request else { return None };
        // a batch's hit is spliced (or compressed) in gzip only
        let gzip = self.codings.contains(&Coding::Gzip);
        match batch.answer(&self.request_headers, gzip, min_length) {
            Ok(Some(hit)) => {
                self.status = Status::Hit;
                let coding = hit.gzip.then_some(Coding::Gzip);
                Some(HitResponse { body: hit.body, coding, headers: hit.headers })
            }
            Ok(None) => None,
            Err(Failed) => {
                self.status = Status::Error;
                None
            }
        }
    }

    /// Before the daemon is asked: whether the hot tier holds this request's entry (or any of a
    /// batch's), which leaves the tier before `hot_answer`, so that a host that locks it can let
    /// go first: one call's hit is made from it here (the entry copied once, into the hit), a
    /// batch's entries are copied out.
    ///
    /// A client that the entry answers plain (it keeps a form for none of the client's codings)
    /// takes a long tail kept plain for it; the first to find only the
    /// entry as the daemon sent it keeps that plain form beside it (one inflate, which its own
    /// hit needs anyway), so that the next ones copy it.
    pub(super) fn find_hot(&mut self, hot: &mut HotTier, now_s: u64, min_length: u64) -> bool {
        let min = self.min_lengths(min_length);
        let request = match &mut self.request {
            Ok(Taken::Batch(batch)) => return batch.find_hot(hot, now_s),
            Ok(request) => request,
            Err(_) => return false,
        };
        let Some(key) = request.key() else { return false };
        let plain_at = plain_key(key);
        let Some(Ok(entry)) = hot.find(key, now_s).map(Entry::decode) else { return false };
        if !entry.answers_plain(&self.codings) {
            // the usual case: the hit is spliced from the entry read here, once
            self.hot_hit = request.hit_from(&entry, &self.request_headers, &self.codings, min, self.dictionary).ok();
            return self.hot_hit.is_some();
        }
        let mut plain = None;
        if hot.find(&plain_at, now_s).is_none() {
            if let Some((shared, expires_s)) = hot.find_until(key, now_s) {
                plain = Entry::decode(shared).ok().and_then(|entry| entry.plain_form());
                if let Some(plain) = &plain {
                    hot.keep(&plain_at, plain, now_s, expires_s - now_s);
                }
            }
        }
        let entry = match &plain {
            Some(plain) => Some(plain.as_slice()),
            None => hot.find(&plain_at, now_s).or_else(|| hot.find(key, now_s)),
        };
        self.hot_hit = entry.and_then(|entry| request.hit(entry, &self.request_headers, &self.codings, min, self.dictionary).ok());
        self.hot_hit.is_some()
    }

    /// The least lengths of this client's hits, `min_length` the host's.
    fn min_lengths(&self, min_length: u64) -> MinLengths {
        MinLengths { plain: min_length, dcz: self.dcz_min_length }
    }

    /// The hit for what `find_hot` found, or `None` to ask the daemon after all.
    pub(super) fn hot_answer(&mut self, min_length: u64) -> Option<HitResponse> {
        if let Ok(Taken::Batch(_)) = self.request {
            return self.batch_hit(min_length);
        }
        let hit = self.hot_hit.take()?;
        self.status = Status::Hit;
        Some(hit)
    }

    /// After the daemon's answer: keeps what it found in the hot tier (for one call, its entry:
    /// the body of the answer, when it was a hit).
    pub(super) fn keep_hot(&mut self, hot: &mut HotTier, entry: &[u8], now_s: u64) {
        match &mut self.request {
            Ok(Taken::Batch(batch)) => batch.keep_hot(hot, now_s),
            Ok(request) => {
                if let (Some(key), Some(ttl_s)) = (request.key(), self.hot_ttl_s.take()) {
                    hot.keep(key, entry, now_s, ttl_s);
                    // a client the entry answers plain gets a long tail copied from the tier, not
                    // inflated: beside the entry, which tells the next clients whether they are such
                    let decoded = Entry::decode(entry).ok().filter(|e| e.answers_plain(&self.codings));
                    if let Some(plain) = decoded.and_then(|e| e.plain_form()) {
                        hot.keep(&plain_key(key), &plain, now_s, ttl_s);
                    }
                }
            }
            Err(_) => {}
        }
    }

    /// The lookup failed: no answer within the timeout, or no daemon at all.
    pub(super) fn failed(&mut self) {
        // (a daemon that failed the lookup is sent no release either: its lock runs out)
        self.lock = Lock::None;
        match &mut self.request {
            Ok(Taken::Batch(batch)) => batch.failed(),
            Ok(Taken::Call(_) | Taken::Read(_)) => {}
            Err(_) => return,
        }
        self.status = Status::Error;
    }

    /// The node's response head: its status, length (`None`: unknown yet) and headers, as (name,
    /// value) pairs; whether the host should hold its plain body: for the store, or for a split
    /// batch to merge ([`CacheExchange::replaces_body`]). Only a whole 200 that the node did not
    /// encode, that fits an entry, and that a shared cache may keep ([`Head`]) is kept, and only
    /// after the daemon answered the lookup: one that failed it is not sent more work.
    pub fn response_head<N: AsRef<[u8]>, V: AsRef<[u8]>>(
        &mut self,
        status: u16,
        content_length: Option<u64>,
        headers: &[(N, V)],
    ) -> bool {
        let coding = headers.iter().find(|(n, _)| n.as_ref().eq_ignore_ascii_case(b"content-encoding"));
        let encoded = coding.is_some_and(|(_, coding)| !coding.as_ref().trim_ascii().eq_ignore_ascii_case(b"identity"));
        // the node's answer to the calls the store did not answer: merged with the store's answers
        self.merge = matches!(&self.request, Ok(Taken::Batch(batch)) if batch.merges()) && status == 200 && !encoded;
        let too_large = content_length.is_some_and(|length| length > self.settings.max_entry as u64);
        if self.request.is_ok() && too_large && !self.merge {
            self.status = Status::Bypass;
        }
        let answered = matches!(self.status, Status::Miss | Status::Expired) || self.bad_entry;
        self.capture = self.request.is_ok() && status == 200 && !encoded && !too_large && answered;
        if self.capture {
            self.head = Head::of(headers, &self.request_headers);
            self.capture = self.head.is_ok();
            if let Ok(Taken::Read(_)) = &self.request {
                self.answered = Answered::of(headers);
            }
        }
        // the body's room is taken once a piece comes: a host that holds the body itself
        // (`keep`) passes none
        let expected = content_length.unwrap_or(0).min(self.settings.max_entry as u64) as usize;
        self.held = if self.merge {
            Held::ForMerge(Vec::new())
        } else if self.capture {
            Held::ForStore { body: Vec::new(), expected }
        } else {
            Held::Nothing
        };
        self.capture || self.merge
    }

    /// Whether the host sends [`CacheExchange::batch_answer`] instead of the node's body, which
    /// it holds rather than passes on (its length is not the answer's).
    pub fn replaces_body(&self) -> bool {
        self.merge
    }

    /// Why the node's answer is not kept, when its head said so already (`Set-Cookie`,
    /// `Cache-Control: no-store`, `Vary: *`, ...): once, for a host's counters.
    pub fn take_head_refusal(&mut self) -> Option<Refusal> {
        let refusal = self.head.as_ref().err().copied();
        self.head = Ok(Head::default());
        refusal
    }

    /// The host holds `held` bytes of the body so far (its length was not known at the head):
    /// whether to go on holding it. Past `max_entry` it will not be stored; a batch's answer to
    /// merge is held a little further, then given to [`CacheExchange::batch_answer`] as it is,
    /// with the rest passed on after it.
    pub(super) fn keep_holding(&mut self, held: u64) -> bool {
        let max_entry = self.settings.max_entry as u64;
        if self.capture && held > max_entry {
            self.capture = false;
            if !self.merge {
                self.status = Status::Bypass;
            }
        }
        if self.merge {
            return held <= max_entry.max(MIN_MERGE_HOLD as u64);
        }
        self.capture
    }

    /// What the client gets of a split batch ([`CacheExchange::replaces_body`]), from the node's
    /// answer: `whole`, its calls' answers and the store's in the client's order; or the start
    /// of a longer one, the store's answers and then the node's, the rest of which the host
    /// passes on as it comes. A node's answer that is no array of answers to the calls it was
    /// sent goes as it came.
    pub(super) fn batch_answer(&mut self, node_body: &[u8], whole: bool) -> Vec<u8> {
        let Ok(Taken::Batch(batch)) = &self.request else { return node_body.to_vec() };
        let (body, kept) = batch.merge(node_body, whole);
        if self.capture && whole {
            self.captures = kept.into_iter().map(|(request, answer)| request.capture(answer, &self.settings)).collect();
        }
        body
    }

    /// The node's whole plain body, held as `response_head` said: the calls that store it (for a
    /// batch, one per answer it stores), or why the core refuses an answer (errors, nulls, ...).
    pub(super) fn stores(&mut self, body: &[u8]) -> Vec<Result<DaemonRequest, Refusal>> {
        let kept = self.kept(body);
        kept.into_iter().map(|kept| kept.map(|kept| self.store_call(kept))).collect()
    }

    /// For a host that keeps entries itself rather than in the daemon: what to keep of the node's
    /// whole plain body (one call's or read's), its entry compacted as the daemon would (its
    /// result compressed once into each form a hit splices); `None`: nothing to keep.
    pub fn keep(&mut self, body: &[u8]) -> Option<Result<Kept, Refusal>> {
        match self.kept(body).into_iter().next()? {
            Ok(kept) => {
                let entry = Entry::decode(&kept.entry).and_then(|entry| entry.compact()).ok()?;
                Some(Ok(Kept { entry, ..kept }))
            }
            Err(refusal) => Some(Err(refusal)),
        }
    }

    /// What [`CacheExchange::stores`] and [`CacheExchange::keep`] keep of the node's body.
    fn kept(&mut self, body: &[u8]) -> Vec<Result<Kept, Refusal>> {
        // A host asks only after `response_head` said to keep the body.
        let (true, Ok(head)) = (self.capture, &self.head) else { return Vec::new() };
        // a Beacon-API answer's entry has a head of its own, for the form it is stored in
        let own_head = |capture: Result<Capture, Refusal>| capture.map(|capture| (capture, None));
        let captures: Vec<Result<(Capture, Option<Head>), Refusal>> = match &self.request {
            Ok(Taken::Call(request)) => vec![own_head(request.capture(body, &self.settings))],
            Ok(Taken::Read(read)) => {
                let capture = read.capture(&self.answered, head, body, self.settings.max_entry);
                vec![capture.map(|(capture, head)| (capture, Some(head)))]
            }
            Ok(Taken::Batch(_)) if self.merge => std::mem::take(&mut self.captures).into_iter().map(own_head).collect(),
            Ok(Taken::Batch(batch)) => batch.captures(body, &self.settings).into_iter().map(own_head).collect(),
            Err(_) => return Vec::new(),
        };
        let single = matches!(&self.request, Ok(Taken::Call(_) | Taken::Read(_)));
        if single && matches!(captures.first(), Some(Err(Refusal::TooLarge))) {
            self.status = Status::Bypass;
        }
        let Ok(head) = &self.head else { return Vec::new() };
        let kept: Vec<_> = captures
            .into_iter()
            .map(|capture| {
                capture.map(|(capture, own)| Kept {
                    key: capture.key,
                    entry: super::encode(&capture.envelope, own.as_ref().unwrap_or(head), &capture.tail),
                    ttl_s: capture.ttl_s,
                    requires_final: capture.requires_final,
                    block_hash: capture.block_hash,
                })
            })
            .collect();
        // a held key's store hands its answer to the requests that wait for it
        if kept.iter().any(Result::is_ok) {
            self.lock = Lock::None;
        }
        kept
    }

    /// Once the node's answer has ended (or the request is over without one): the key this
    /// request held, or may hold (it ended while its lookup was on its way: the client left),
    /// and stores no answer for, which the host releases so that the requests that wait for it go
    /// to the node themselves. Given once.
    pub fn release(&mut self) -> Option<DaemonRequest> {
        let key = *self.request.as_ref().ok()?.key()?;
        if !matches!(std::mem::replace(&mut self.lock, Lock::None), Lock::Held | Lock::Asked) {
            return None;
        }
        Some(DaemonRequest {
            method: protocol::RELEASE_METHOD,
            path: protocol::flight_path(&key.hex()),
            headers: vec![self.holder_header()],
            body: Vec::new(),
            timeout_ms: self.settings.store_timeout_ms,
        })
    }

    fn store_call(&self, kept: Kept) -> DaemonRequest {
        let mut headers = vec![(protocol::NAMESPACE_HEADER, self.namespace.clone())];
        if let Some(ttl) = kept.ttl_s {
            headers.push((protocol::TTL_HEADER, ttl.to_string()));
        }
        if let Some(requirement) = kept.requires_final {
            headers.push((protocol::REQUIRES_FINAL_HEADER, requirement.to_string()));
        }
        if let Some(hash) = kept.block_hash {
            headers.push((protocol::BLOCK_HASH_HEADER, hash));
        }
        DaemonRequest {
            method: protocol::STORE_METHOD,
            path: protocol::entry_path(&kept.key.hex()),
            headers,
            body: kept.entry,
            timeout_ms: self.settings.store_timeout_ms,
        }
    }

    /// The header that names this request to the daemon as the key's holder.
    fn holder_header(&self) -> (&'static str, String) {
        (protocol::HOLDER_HEADER, format!("{:016x}", self.holder))
    }

    /// Whether the node's answer to this request may be kept: it is no bypass. The host's
    /// exchange then asks the node for identity ([`crate::Exchange::cache_may_keep`]).
    pub fn may_keep(&self) -> bool {
        self.bypass().is_none()
    }

    pub fn status(&self) -> Status {
        self.status
    }

    /// The status header's value: the status, and with `reasons` a bypass's reason too.
    pub fn status_value(&self, reasons: bool) -> &'static str {
        match self.bypass() {
            Some(bypass) if reasons => bypass.status_value(),
            _ => self.status.as_str(),
        }
    }
}

/// A JSON-RPC call's answer for a client that takes `codings` (best first) and waited for another
/// request's: the daemon hands the waiters the holder's entry compacted (its forms made once,
/// spliced here) when they were waiting as the store came, but as it came to one that began
/// waiting later, while it was compacted for the store. Such a plain answer is compressed here,
/// in the client's best coding, as any answer of the node's of that size would be: never sent
/// plain to a client that takes a coding.
fn compressed(hit: HitResponse, codings: &[Coding], min: MinLengths) -> HitResponse {
    let Some(&coding) = codings.first() else { return hit };
    if hit.coding.is_some() || (hit.body.len() as u64) < min.of(coding) {
        return hit;
    }
    let Some(body) = compress_whole(coding, auto_level(coding, hit.body.len()), &hit.body) else { return hit };
    let mut headers = hit.headers;
    // after the type, as `hit_headers` puts it
    headers.insert(1, ("content-encoding".into(), coding.token().into()));
    HitResponse { body, coding: Some(coding), headers }
}

/// Where the hot tier keeps a key's entry with its long tail plain (`Entry::plain_form`), beside
/// the entry itself, which every client can take.
pub(super) fn plain_key(key: &Key) -> Key {
    Key(Sha256::new().chain_update(key.0).chain_update(b"plain").finalize().into())
}

/// A JSON-RPC call's hit: the entry around the client's id.
fn call_hit(request: &Request, entry: &Entry, codings: &[Coding], min: MinLengths) -> Result<HitResponse, NoHit> {
    let hit = entry.respond(&request.id, codings, min).map_err(|_| NoHit::Bad)?;
    let content_type = entry.headers.iter().find(|(name, _)| *name == "content-type").map(|(_, value)| *value);
    let headers = hit_headers(entry, content_type.unwrap_or("application/json"), hit.coding, &["Accept-Encoding"]);
    Ok(HitResponse { body: hit.body, coding: hit.coding, headers })
}

/// A token for a request's hold on its key, unique among the daemon's clients (every worker of
/// every proxy on the host): a counter, hashed with keys that std draws at random for each thread.
fn holder_token() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    thread_local!(static KEYS: RandomState = RandomState::new());
    KEYS.with(|keys| keys.hash_one(NEXT.fetch_add(1, Ordering::Relaxed)))
}
