//! One request's way through the cache, as every host walks it: ask the daemon, answer a hit,
//! or let the node answer and hand what it said to the daemon. The host moves the bytes (its
//! subrequests or HTTP calls, with its own timeout); every decision, the daemon's API and the
//! status a host reports are here, so that nginx and Envoy cannot differ.

use std::ffi::CStr;

use super::hot::{HotTier, MAX_AGE_S};
use super::{lookup, shard, BadEntry, Bypass, CacheSettings, Entry, Refusal, Request};
use crate::transcode::jsonrpc_request;

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
}

impl Status {
    /// Every status, for a host's counters.
    pub const fn all() -> [Status; 5] {
        [Status::Hit, Status::Miss, Status::Bypass, Status::Expired, Status::Error]
    }

    pub fn as_c_str(self) -> &'static CStr {
        match self {
            Status::Hit => c"HIT",
            Status::Miss => c"MISS",
            Status::Bypass => c"BYPASS",
            Status::Expired => c"EXPIRED",
            Status::Error => c"ERROR",
        }
    }

    pub fn as_str(self) -> &'static str {
        self.as_c_str().to_str().expect("ASCII")
    }
}

/// The daemon's answer to a lookup, as the host received it.
pub struct DaemonAnswer<'a> {
    pub status: u16,
    /// Its `X-Rpcedge-Miss` header.
    pub miss: Option<&'a [u8]>,
    /// Its `X-Rpcedge-Ttl` header: the seconds a hit has left (none: no expiry).
    pub ttl: Option<&'a [u8]>,
    pub body: &'a [u8],
}

/// A hit to send instead of asking the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HitResponse {
    pub body: Vec<u8>,
    pub gzip: bool,
}

impl HitResponse {
    /// The headers of a hit, besides `Content-Length` (the body's length) and the status header:
    /// upstream headers are not stored, so a hit carries only these.
    pub fn headers(&self) -> &'static [(&'static str, &'static str)] {
        if self.gzip {
            &[("content-type", "application/json"), ("content-encoding", "gzip"), ("vary", "Accept-Encoding")]
        } else {
            &[("content-type", "application/json"), ("vary", "Accept-Encoding")]
        }
    }
}

/// The call that stores a node's answer: `PUT path` with these headers and body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreCall {
    pub path: String,
    pub headers: Vec<(&'static str, String)>,
    pub body: Vec<u8>,
}

/// One request's cache exchange.
#[derive(Debug)]
pub struct CacheExchange {
    request: Result<Request, Bypass>,
    namespace: String,
    gzip: bool,
    status: Status,
    capture: bool,
    /// A daemon's hit, to keep in the hot tier for this many seconds.
    hot_ttl_s: Option<u64>,
    /// The entry the hot tier holds for this request.
    hot_entry: Option<Vec<u8>>,
}

impl CacheExchange {
    /// Whether a request body of `length` bytes may be looked up at all: a host can skip
    /// reading (or holding) a longer one.
    pub fn takes_length(length: u64, settings: &CacheSettings) -> bool {
        length <= settings.max_request as u64
    }

    /// From the request: the namespace configured where it was routed (none: a bypass), its body
    /// (`None` when the host does not hold it whole, as when nginx spilled it to a file), whether
    /// the client takes gzip and whether it asks for SSZ (`Accept`,
    /// [`crate::negotiate::asks_for_ssz`]).
    pub fn new(
        namespace: Option<&str>,
        body: Option<&[u8]>,
        gzip: bool,
        ssz: bool,
        settings: &CacheSettings,
    ) -> CacheExchange {
        let namespace = namespace.ok_or(Bypass::Namespace);
        let request = namespace.and_then(|namespace| {
            let body = body.ok_or(Bypass::TooLarge)?;
            // a hit would be JSON: the node's answer, transcoded, is what such a client gets
            if ssz && jsonrpc_request(body).is_some() {
                return Err(Bypass::Ssz);
            }
            lookup(namespace, body, settings)
        });
        let status = if request.is_ok() { Status::Miss } else { Status::Bypass };
        CacheExchange {
            request,
            namespace: namespace.unwrap_or_default().to_string(),
            gzip,
            status,
            capture: false,
            hot_ttl_s: None,
            hot_entry: None,
        }
    }

    /// The lookup to make, `GET` this path, or `None`: straight to the node.
    pub fn lookup_path(&self) -> Option<String> {
        self.request.as_ref().ok().map(|request| format!("/v1/entries/{}", request.key.hex()))
    }

    /// Which of `shards` daemons holds this request's key (0 when it bypasses).
    pub fn shard(&self, shards: u32) -> u32 {
        self.request.as_ref().map_or(0, |request| shard(&request.key, shards))
    }

    /// Why the request bypasses the cache, if it does: its own reason, or an answer too large
    /// to keep.
    pub fn bypass(&self) -> Option<Bypass> {
        match &self.request {
            Err(bypass) => Some(*bypass),
            Ok(_) => (self.status == Status::Bypass).then_some(Bypass::Answer),
        }
    }

    /// The daemon answered the lookup: the hit to send, or `None` to ask the node.
    pub fn answered(&mut self, answer: &DaemonAnswer, min_length: u64) -> Option<HitResponse> {
        let request = self.request.as_ref().ok()?;
        match answer.status {
            200 => match hit(request, answer.body, self.gzip, min_length) {
                Ok(hit) => {
                    self.status = Status::Hit;
                    let ttl = answer.ttl.and_then(|ttl| std::str::from_utf8(ttl).ok()?.trim().parse().ok());
                    self.hot_ttl_s = Some(ttl.unwrap_or(MAX_AGE_S));
                    Some(hit)
                }
                Err(_) => {
                    self.status = Status::Error;
                    None
                }
            },
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

    /// Before the daemon is asked: whether the hot tier holds this request's entry, which is
    /// copied out so that a host that locks the tier can let go of it before `hot_answer`.
    pub fn find_hot(&mut self, hot: &HotTier, now_s: u64) -> bool {
        let Ok(request) = &self.request else { return false };
        self.hot_entry = hot.find(&request.key, now_s).map(<[u8]>::to_vec);
        self.hot_entry.is_some()
    }

    /// The hit for the entry `find_hot` found, or `None` to ask the daemon after all.
    pub fn hot_answer(&mut self, min_length: u64) -> Option<HitResponse> {
        let request = self.request.as_ref().ok()?;
        let hit = hit(request, &self.hot_entry.take()?, self.gzip, min_length).ok()?;
        self.status = Status::Hit;
        Some(hit)
    }

    /// After the daemon's hit: keeps its entry (the body of its answer) in the hot tier.
    pub fn keep_hot(&mut self, hot: &mut HotTier, entry: &[u8], now_s: u64) {
        if let (Ok(request), Some(ttl_s)) = (&self.request, self.hot_ttl_s.take()) {
            hot.keep(&request.key, entry, now_s, ttl_s);
        }
    }

    /// The lookup failed: no answer within the timeout, or no daemon at all.
    pub fn failed(&mut self) {
        if self.request.is_ok() {
            self.status = Status::Error;
        }
    }

    /// The node's response head: whether the host should keep its plain body for the store.
    /// Only a whole 200 that the node did not encode, and that fits an entry, is kept, and only
    /// after the daemon answered the lookup: one that failed it is not sent more work.
    pub fn response_head(
        &mut self,
        status: u16,
        content_length: Option<u64>,
        content_encoding: Option<&[u8]>,
        settings: &CacheSettings,
    ) -> bool {
        let encoded = content_encoding.is_some_and(|coding| !coding.trim_ascii().eq_ignore_ascii_case(b"identity"));
        let too_large = content_length.is_some_and(|length| length > settings.max_entry as u64);
        if self.request.is_ok() && too_large {
            self.status = Status::Bypass;
        }
        let answered = matches!(self.status, Status::Miss | Status::Expired);
        self.capture = self.request.is_ok() && status == 200 && !encoded && !too_large && answered;
        self.capture
    }

    /// The host holds `held` bytes of the body so far (its length was not known at the head):
    /// whether to go on holding it. Past `max_entry` it will not be stored.
    pub fn keep_holding(&mut self, held: u64, settings: &CacheSettings) -> bool {
        if self.capture && held > settings.max_entry as u64 {
            self.capture = false;
            self.status = Status::Bypass;
        }
        self.capture
    }

    /// The node's whole plain body, kept as `response_head` said: the call that stores it.
    /// Errors, nulls and the rest the core refuses give `Err`.
    pub fn store(&mut self, body: &[u8], settings: &CacheSettings) -> Result<StoreCall, Refusal> {
        // A host asks only after `response_head` said to keep the body.
        let request = self.request.as_ref().ok().filter(|_| self.capture).ok_or(Refusal::Malformed)?;
        let capture = request.capture(body, settings).inspect_err(|refusal| {
            if *refusal == Refusal::TooLarge {
                self.status = Status::Bypass;
            }
        })?;
        let mut headers = vec![("x-rpcedge-namespace", self.namespace.clone())];
        if let Some(ttl) = capture.ttl_s {
            headers.push(("x-rpcedge-ttl", ttl.to_string()));
        }
        if let Some(block) = capture.requires_final {
            headers.push(("x-rpcedge-requires-final", block.to_string()));
        }
        Ok(StoreCall {
            path: format!("/v1/entries/{}", capture.key.hex()),
            headers,
            body: super::encode(&capture.envelope, &capture.tail),
        })
    }

    pub fn status(&self) -> Status {
        self.status
    }
}

fn hit(request: &Request, stored: &[u8], gzip: bool, min_length: u64) -> Result<HitResponse, BadEntry> {
    let hit = Entry::decode(stored)?.respond(&request.id, gzip, min_length)?;
    Ok(HitResponse { body: hit.body, gzip: hit.gzip })
}
