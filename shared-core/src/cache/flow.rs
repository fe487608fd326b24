//! One request's way through the cache, as every host walks it: ask the daemon, answer a hit,
//! or let the node answer and hand what it said to the daemon. The host moves the bytes (its
//! subrequests or HTTP calls, with its own timeout); every decision, the daemon's API and the
//! status a host reports are here, so that nginx and Envoy cannot differ.


use super::head::{field, named, Head};
use super::hot::{HotTier, MAX_AGE_S};
use super::{lookup, protocol, shard, Bypass, CacheSettings, Entry, Refusal, Request};
use crate::negotiate::{asks_for_ssz, AcceptEncoding, Coding};
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

    /// The status header's value.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Hit => "HIT",
            Status::Miss => "MISS",
            Status::Bypass => "BYPASS",
            Status::Expired => "EXPIRED",
            Status::Error => "ERROR",
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
    pub body: &'a [u8],
}

/// A hit to send instead of asking the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HitResponse {
    pub body: Vec<u8>,
    pub gzip: bool,
    /// Its headers, besides `Content-Length` (the body's length) and the status header, names in
    /// lower case: `content-type`, `content-encoding` when gzip, `vary` (what the node's answer
    /// varies on, and Accept-Encoding), then the node's end-to-end headers as it sent them.
    pub headers: Vec<(String, String)>,
}

/// Why a stored entry gives no hit.
enum NoHit {
    /// Not an entry: a different version, a torn or foreign value.
    Bad,
    /// An answer for a request with other values of the headers it varies on.
    OtherVariant,
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
    /// The request's headers, while it may be looked up: an entry is for the values of the
    /// headers its answer varies on.
    request_headers: Vec<(Vec<u8>, Vec<u8>)>,
    gzip: bool,
    status: Status,
    capture: bool,
    /// What of the node's head the entry keeps, or why the answer is not kept at all.
    head: Result<Head, Refusal>,
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

    /// From the request: the namespace configured where it was routed (none: a bypass), its
    /// method, its body (`None` when the host does not hold it whole, as when nginx spilled it to
    /// a file) and its headers, as (name, value) pairs, repeats kept (Accept-Encoding says whether
    /// a hit may be gzip; a client that asks for SSZ of a result with a schema bypasses the cache,
    /// which holds JSON; the rest decide which stored variant is the client's).
    pub fn new<N: AsRef<[u8]>, V: AsRef<[u8]>>(
        namespace: Option<&str>,
        method: &[u8],
        body: Option<&[u8]>,
        headers: &[(N, V)],
        settings: &CacheSettings,
    ) -> CacheExchange {
        let coding = field(headers, "accept-encoding").and_then(|value| AcceptEncoding::parse(&value).choose());
        let gzip = coding == Some(Coding::Gzip);
        let ssz = field(headers, "accept").is_some_and(|accept| asks_for_ssz(&accept));
        let credentials = ["authorization", "cookie"].iter().any(|name| named(headers, name).next().is_some());
        let namespace = namespace.ok_or(Bypass::Namespace);
        let request = namespace.and_then(|namespace| {
            if credentials {
                return Err(Bypass::Credentials);
            }
            if method != b"POST" {
                return Err(Bypass::NotPost);
            }
            let body = body.ok_or(Bypass::TooLarge)?;
            // a hit would be JSON: the node's answer, transcoded, is what such a client gets
            if ssz && jsonrpc_request(body).is_some() {
                return Err(Bypass::Ssz);
            }
            lookup(namespace, body, settings)
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
            gzip,
            status,
            capture: false,
            head: Ok(Head::default()),
            hot_ttl_s: None,
            hot_entry: None,
        }
    }

    /// The lookup to make, `GET` this path, or `None`: straight to the node.
    pub fn lookup_path(&self) -> Option<String> {
        self.request.as_ref().ok().map(|request| protocol::entry_path(&request.key.hex()))
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
            200 => match hit(request, answer.body, &self.request_headers, self.gzip, min_length) {
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
        let hit = hit(request, &self.hot_entry.take()?, &self.request_headers, self.gzip, min_length).ok()?;
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

    /// The node's response head: its status, length (`None`: unknown yet) and headers, as (name,
    /// value) pairs; whether the host should keep its plain body for the store. Only a whole 200
    /// that the node did not encode, that fits an entry, and that a shared cache may keep
    /// ([`Head`]) is kept, and only after the daemon answered the lookup: one that failed it is
    /// not sent more work.
    pub fn response_head<N: AsRef<[u8]>, V: AsRef<[u8]>>(
        &mut self,
        status: u16,
        content_length: Option<u64>,
        headers: &[(N, V)],
        settings: &CacheSettings,
    ) -> bool {
        let coding = headers.iter().find(|(n, _)| n.as_ref().eq_ignore_ascii_case(b"content-encoding"));
        let encoded = coding.is_some_and(|(_, coding)| !coding.as_ref().trim_ascii().eq_ignore_ascii_case(b"identity"));
        let too_large = content_length.is_some_and(|length| length > settings.max_entry as u64);
        if self.request.is_ok() && too_large {
            self.status = Status::Bypass;
        }
        let answered = matches!(self.status, Status::Miss | Status::Expired);
        self.capture = self.request.is_ok() && status == 200 && !encoded && !too_large && answered;
        if self.capture {
            self.head = Head::of(headers, &self.request_headers);
            self.capture = self.head.is_ok();
        }
        self.capture
    }

    /// Why the node's answer is not kept, when its head said so already (`Set-Cookie`,
    /// `Cache-Control: no-store`, `Vary: *`, ...): once, for a host's counters.
    pub fn take_head_refusal(&mut self) -> Option<Refusal> {
        let refusal = self.head.as_ref().err().copied();
        self.head = Ok(Head::default());
        refusal
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
        let mut headers = vec![(protocol::NAMESPACE_HEADER, self.namespace.clone())];
        if let Some(ttl) = capture.ttl_s {
            headers.push((protocol::TTL_HEADER, ttl.to_string()));
        }
        if let Some(requirement) = capture.requires_final {
            headers.push((protocol::REQUIRES_FINAL_HEADER, requirement.to_string()));
        }
        let head = self.head.as_ref().map_err(|refusal| *refusal)?;
        Ok(StoreCall {
            path: protocol::entry_path(&capture.key.hex()),
            headers,
            body: super::encode(&capture.envelope, head, &capture.tail),
        })
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

fn hit(
    request: &Request,
    stored: &[u8],
    request_headers: &[(Vec<u8>, Vec<u8>)],
    gzip: bool,
    min_length: u64,
) -> Result<HitResponse, NoHit> {
    let entry = Entry::decode(stored).map_err(|_| NoHit::Bad)?;
    if !Head::is_for(&entry.vary, request_headers) {
        return Err(NoHit::OtherVariant);
    }
    let hit = entry.respond(&request.id, gzip, min_length).map_err(|_| NoHit::Bad)?;
    let content_type = entry.headers.iter().find(|(name, _)| *name == "content-type").map(|(_, value)| *value);
    let mut headers = vec![("content-type".to_string(), content_type.unwrap_or("application/json").to_string())];
    if hit.gzip {
        headers.push(("content-encoding".into(), "gzip".into()));
    }
    let varies = entry.vary.iter().map(|(name, _)| *name).chain(["Accept-Encoding"]);
    headers.push(("vary".into(), varies.collect::<Vec<_>>().join(", ")));
    let kept = entry.headers.iter().filter(|(name, _)| *name != "content-type");
    headers.extend(kept.map(|(name, value)| (name.to_string(), value.to_string())));
    Ok(HitResponse { body: hit.body, gzip: hit.gzip, headers })
}
