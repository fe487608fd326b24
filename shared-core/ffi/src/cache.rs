//! The cache's C ABI: one `CacheExchange` per request (see `cache::flow`), for the nginx module
//! and the Lua binding. Strings handed out are valid until the next call on the same handle.

use std::collections::VecDeque;
use std::ffi::c_void;
use std::ptr;

use rpcedge_core::cache::{
    entry_bound, CacheExchange, DaemonAnswer, DaemonRequest, HitResponse, HotRegion, HotTier, LookupStep, Passed,
    Refusal, Status,
};
use rpcedge_core::config::MAX_ENTRY;
use rpcedge_core::Coding;

use crate::{bytes, guard, put, RpcedgeHeader, RpcedgeSettings, RpcedgeStr};

/// Opaque per-request cache exchange.
pub struct RpcedgeCache {
    pub(super) exchange: CacheExchange,
    /// The daemon call handed out last (a lookup, a store or a release), and its headers as C
    /// sees them.
    call: Option<DaemonRequest>,
    call_headers: Vec<RpcedgeHeader>,
    /// The body the node gets instead of the client's.
    node_request: Option<Vec<u8>>,
    /// What the client gets instead of the node's body.
    batch_answer: Vec<u8>,
    hit: Option<HitResponse>,
    /// The hit came from the hot tier.
    pub(super) hot: bool,
    /// The key in hex, once asked for.
    key: Option<String>,
    /// What a host that keeps entries itself keeps, as C reads it.
    kept: Option<OwnKept>,
    /// The stores still to hand out.
    stores: VecDeque<DaemonRequest>,
    /// Why answers were not kept, until they are counted.
    pub(super) refusals: Vec<Refusal>,
}

/// A call to make to the daemon: `method path` with these headers and `body` (a NULL `data`:
/// none), waiting at most `timeout_ms` for its answer. The core names the daemon's protocol; the
/// host only moves it. Valid until the handle hands out another call, or is freed.
#[repr(C)]
pub struct RpcedgeDaemonCall {
    pub method: RpcedgeStr,
    pub path: RpcedgeStr,
    pub headers: *const RpcedgeHeader,
    pub headers_len: usize,
    pub body: RpcedgeStr,
    pub timeout_ms: u64,
}

impl RpcedgeDaemonCall {
    const NONE: RpcedgeDaemonCall = RpcedgeDaemonCall {
        method: RpcedgeStr::NONE,
        path: RpcedgeStr::NONE,
        headers: ptr::null(),
        headers_len: 0,
        body: RpcedgeStr::NONE,
        timeout_ms: 0,
    };
}

/// An answer kept by a host that keeps entries itself rather than in rpcedge-cached (the Lua
/// binding's own storage): the entry under `key` (hex), for `ttl_s` seconds (0: no expiry),
/// kept only once `requires_final` is final when it is not NULL (a block's number, or a
/// transaction's hash, whose block must be), and, when `block_hash` is not NULL, only if the
/// chain's block of that number has that hash. Valid until the next call on the handle.
#[repr(C)]
pub struct RpcedgeKeptEntry {
    pub key: RpcedgeStr,
    pub entry: RpcedgeStr,
    pub ttl_s: u64,
    pub requires_final: RpcedgeStr,
    pub block_hash: RpcedgeStr,
}

/// An answer kept by a host itself, its strings as `RpcedgeKeptEntry` points to them.
struct OwnKept {
    key: String,
    entry: Vec<u8>,
    ttl_s: u64,
    requires_final: Option<String>,
    block_hash: Option<String>,
}

/// The longest answer a daemon gives a lookup: an entry of the largest `max_entry` any host may
/// configure (with its envelope), whichever host stored it.
pub const RPCEDGE_CACHE_MAX_ANSWER: u64 = 67_117_122;

const _: () = assert!(RPCEDGE_CACHE_MAX_ANSWER == entry_bound(MAX_ENTRY));

unsafe fn string(s: &RpcedgeStr) -> Option<&[u8]> {
    (!s.data.is_null()).then(|| bytes(s.data, s.len))
}

/// A cache exchange under the cache's settings of `settings` (its limits), for a request in
/// namespace `ns`, the one configured where the request was routed (a NULL `data`: none, so the
/// request bypasses the cache; never one from the request), whose method is `method` (a POST is
/// looked up by its body, a GET by its path), whose path is `path` (with its query, as the client
/// sent it), whose body is `body` (NULL: the host does not hold it whole, so a POST bypasses the
/// cache), with the client's `headers_len` headers (Accept-Encoding says whether a hit may be
/// gzip; Accept, in which form a Beacon-API hit goes, and a client that asks for the SSZ of a
/// JSON-RPC result bypasses the cache, which holds JSON; the rest decide which stored variant is
/// the client's). NULL when `settings` is NULL, or on a panic.
///
/// # Safety
/// `settings` is NULL or live; the strings point to readable bytes of their lengths; `headers`
/// to `headers_len` headers.
#[no_mangle]
pub unsafe extern "C" fn rpcedge_cache_new(
    settings: *const RpcedgeSettings,
    ns: RpcedgeStr,
    method: RpcedgeStr,
    path: RpcedgeStr,
    body: *const u8,
    body_len: usize,
    headers: *const RpcedgeHeader,
    headers_len: usize,
) -> *mut RpcedgeCache {
    guard(ptr::null_mut(), || {
        let Some(settings) = settings.as_ref().map(|s| s.0.cache_settings().clone()) else { return ptr::null_mut() };
        let namespace = string(&ns).map(String::from_utf8_lossy);
        let body = (!body.is_null()).then(|| bytes(body, body_len));
        let method = string(&method).unwrap_or_default();
        let path = string(&path).unwrap_or_default();
        let headers = header_list(headers, headers_len);
        let exchange = CacheExchange::new(namespace.as_deref(), method, path, body, &headers, &settings);
        let cache = RpcedgeCache {
            exchange,
            call: None,
            call_headers: Vec::new(),
            node_request: None,
            batch_answer: Vec::new(),
            hit: None,
            hot: false,
            key: None,
            kept: None,
            stores: VecDeque::new(),
            refusals: Vec::new(),
        };
        Box::into_raw(Box::new(cache))
    })
}

/// Whether a request body of `content_length` bytes may be looked up under `settings`: 0 when it
/// is too long (or `settings` is NULL), so that the host need not read it first.
///
/// # Safety
/// `settings` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn rpcedge_cache_takes_length(settings: *const RpcedgeSettings, content_length: u64) -> i32 {
    guard(0, || {
        settings.as_ref().is_some_and(|s| CacheExchange::takes_length(content_length, s.0.cache_settings())).into()
    })
}

/// The cache section of JSON settings, for a host that takes its daemon from there (the Lua
/// binding): the daemon as the section names it (for the Lua binding, its address), the namespace
/// (NULL `data`: none) and what the host applies itself. Both strings point into the settings.
#[repr(C)]
pub struct RpcedgeCacheHost {
    pub cluster: RpcedgeStr,
    pub ns: RpcedgeStr,
    pub hot_bytes: u64,
    /// The settings' `min_length`: a hit this short goes plain (`rpcedge_cache_looked_up`).
    pub min_length: u64,
    pub status_header: u8,
    pub status_reason: u8,
}

/// 1 with `host` filled when `settings` have a cache section that is enabled; 0 otherwise.
///
/// # Safety
/// `settings` is NULL or live; `host` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn rpcedge_settings_cache(settings: *const RpcedgeSettings, host: *mut RpcedgeCacheHost) -> i32 {
    guard(0, || {
        let Some((settings, cache)) = settings.as_ref().and_then(|s| Some((&s.0, s.0.cache.as_ref()?))) else {
            return 0;
        };
        if !cache.enabled {
            return 0;
        }
        put(
            host,
            RpcedgeCacheHost {
                cluster: RpcedgeStr::of(cache.cluster.as_bytes()),
                ns: cache.namespace.as_deref().map_or(RpcedgeStr::NONE, |ns| RpcedgeStr::of(ns.as_bytes())),
                hot_bytes: cache.hot_bytes,
                min_length: settings.min_length,
                status_header: cache.status_header.into(),
                status_reason: cache.status_reason.into(),
            },
        );
        1
    })
}

/// # Safety
/// `cache` is NULL or came from `rpcedge_cache_new`, and is freed once.
#[no_mangle]
pub unsafe extern "C" fn rpcedge_cache_free(cache: *mut RpcedgeCache) {
    if !cache.is_null() {
        guard((), || drop(Box::from_raw(cache)));
    }
}

/// What a request does next on its way through the cache, as `rpcedge_cache_look_up` and
/// `rpcedge_cache_looked_up` say. Go on to the node: with `next.node_body` in place of the
/// client's body where its `data` is not NULL (a batch less the calls the cache answered), else
/// with the client's own.
pub const RPCEDGE_CACHE_NODE: i32 = 0;
/// Ask the daemon `next.call`, then hand its answer to `rpcedge_cache_looked_up`.
pub const RPCEDGE_CACHE_ASK: i32 = 1;
/// Send the hit, as `rpcedge_cache_hit` and `rpcedge_cache_hit_header` give it.
pub const RPCEDGE_CACHE_HIT: i32 = 2;

/// The call or the body a step names. Valid until the next call on the handle.
#[repr(C)]
pub struct RpcedgeCacheNext {
    pub call: RpcedgeDaemonCall,
    pub node_body: RpcedgeStr,
}

/// A host's hot tier as it lends it: `len` bytes at `region`, laid out by
/// `rpcedge_cache_hot_init`, which the core touches only between `lock(data)` and `unlock(data)`
/// (both NULL: the host needs no lock; a tier with only one of them is not used), and only while
/// an entry is copied out or in.
#[repr(C)]
pub struct RpcedgeHotTier {
    pub region: *mut u8,
    pub len: usize,
    pub lock: Option<unsafe extern "C" fn(data: *mut c_void)>,
    pub unlock: Option<unsafe extern "C" fn(data: *mut c_void)>,
    pub data: *mut c_void,
}

impl HotRegion for RpcedgeHotTier {
    fn with_region(&self, use_region: &mut dyn FnMut(&mut [u8])) {
        // a lock with no unlock (or the other way round) would leave the tier locked, or unguarded
        if self.region.is_null() || self.lock.is_some() != self.unlock.is_some() {
            return;
        }
        /// Unlocks when dropped: a panic in the core still lets go of the host's lock.
        struct Locked<'a>(&'a RpcedgeHotTier);
        impl Drop for Locked<'_> {
            fn drop(&mut self) {
                if let Some(unlock) = self.0.unlock {
                    unsafe { unlock(self.0.data) };
                }
            }
        }
        if let Some(lock) = self.lock {
            unsafe { lock(self.data) };
        }
        let _locked = Locked(self);
        use_region(unsafe { std::slice::from_raw_parts_mut(self.region, self.len) });
    }
}

/// The first step of a request the cache may take, once its body is in (`rpcedge_cache_new`'s),
/// with the host's hot tier (NULL: none), the time in seconds and the host's `min_length`:
/// `RPCEDGE_CACHE_HIT` from the hot tier, `RPCEDGE_CACHE_ASK` the daemon, or
/// `RPCEDGE_CACHE_NODE`. `next` says what to ask, or what to send the node.
///
/// # Safety
/// `cache` is NULL or live; `hot` is NULL or describes a region as `RpcedgeHotTier` says, whose
/// lock the caller does not hold; `next` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn rpcedge_cache_look_up(
    cache: *mut RpcedgeCache,
    hot: *const RpcedgeHotTier,
    now_s: u64,
    min_length: u64,
    next: *mut RpcedgeCacheNext,
) -> i32 {
    step(cache, hot, next, true, |exchange, hot| exchange.look_up(hot, min_length, now_s))
}

/// The daemon's answer to the lookup the last step named: its `status` (0: the lookup failed, no
/// answer in time, no daemon, an answer cut short), its `headers_len` headers (names in any case)
/// and `body`, which the hot tier `hot` (NULL: none) keeps where it holds an entry. The next step,
/// as for `rpcedge_cache_look_up`.
///
/// # Safety
/// As `rpcedge_cache_look_up`; `headers` points to `headers_len` headers; `body` to `body_len`
/// readable bytes.
#[no_mangle]
#[allow(clippy::too_many_arguments)] // the answer as C holds it, and the step's context
pub unsafe extern "C" fn rpcedge_cache_looked_up(
    cache: *mut RpcedgeCache,
    status: u16,
    headers: *const RpcedgeHeader,
    headers_len: usize,
    body: *const u8,
    body_len: usize,
    hot: *const RpcedgeHotTier,
    now_s: u64,
    min_length: u64,
    next: *mut RpcedgeCacheNext,
) -> i32 {
    step(cache, hot, next, false, |exchange, hot| {
        let headers = header_list(headers, headers_len);
        let answer = (status != 0).then(|| DaemonAnswer::read(status, &headers, bytes(body, body_len)));
        exchange.looked_up(answer.as_ref(), hot, min_length, now_s)
    })
}

impl RpcedgeCacheNext {
    const NONE: RpcedgeCacheNext = RpcedgeCacheNext { call: RpcedgeDaemonCall::NONE, node_body: RpcedgeStr::NONE };
}

/// Takes a step of `cache`'s lookups (`from_hot`: the first, whose hit is the hot tier's): keeps
/// what it names in the handle, describes it in `next` and numbers it for C.
unsafe fn step(
    cache: *mut RpcedgeCache,
    hot: *const RpcedgeHotTier,
    next: *mut RpcedgeCacheNext,
    from_hot: bool,
    take: impl FnOnce(&mut CacheExchange, Option<&dyn HotRegion>) -> LookupStep,
) -> i32 {
    put(next, RpcedgeCacheNext::NONE);
    guard(RPCEDGE_CACHE_NODE, || {
        let Some(cache) = cache.as_mut() else { return RPCEDGE_CACHE_NODE };
        let hot = hot.as_ref().map(|hot| hot as &dyn HotRegion);
        match take(&mut cache.exchange, hot) {
            LookupStep::Ask(lookup) => {
                let call = next.as_mut().map_or(ptr::null_mut(), |next| &mut next.call as *mut RpcedgeDaemonCall);
                hand_out(cache, Some(lookup), call);
                RPCEDGE_CACHE_ASK
            }
            LookupStep::Hit(hit) => {
                cache.hit = Some(hit);
                cache.hot = from_hot;
                RPCEDGE_CACHE_HIT
            }
            LookupStep::Node(body) => {
                cache.node_request = body;
                if let (Some(next), Some(body)) = (next.as_mut(), &cache.node_request) {
                    next.node_body = RpcedgeStr::of(body);
                }
                RPCEDGE_CACHE_NODE
            }
        }
    })
}

/// Keeps `request` in the handle and describes it in `call`: 1, or 0 when there is none (the
/// call handed out before stays: a store's body goes on being sent while the host asks whether
/// there is a release).
unsafe fn hand_out(cache: &mut RpcedgeCache, request: Option<DaemonRequest>, call: *mut RpcedgeDaemonCall) -> i32 {
    let Some(request) = request else { return 0 };
    let request = cache.call.insert(request);
    cache.call_headers = request.headers.iter().map(|(name, value)| header(name.as_bytes(), value.as_bytes())).collect();
    put(
        call,
        RpcedgeDaemonCall {
            method: RpcedgeStr::of(request.method.as_bytes()),
            path: RpcedgeStr::of(request.path.as_bytes()),
            headers: cache.call_headers.as_ptr(),
            headers_len: cache.call_headers.len(),
            body: if request.body.is_empty() { RpcedgeStr::NONE } else { RpcedgeStr::of(&request.body) },
            timeout_ms: request.timeout_ms,
        },
    );
    1
}

fn header(name: &[u8], value: &[u8]) -> RpcedgeHeader {
    RpcedgeHeader { name: name.as_ptr(), name_len: name.len(), value: value.as_ptr(), value_len: value.len() }
}

/// The hit's reply: its `status` and `body`; returns the body's coding (its token:
/// `rpcedge_coding_token`; `Content-Encoding` says the same), 0 when plain (or there is no hit:
/// `status` 0).
/// Send it with its exact length and the headers `rpcedge_cache_hit_header` gives.
///
/// # Safety
/// `cache` is NULL or live; `status` and `body` are NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn rpcedge_cache_hit(cache: *const RpcedgeCache, status: *mut u16, body: *mut RpcedgeStr) -> i32 {
    put(status, 0);
    put(body, RpcedgeStr::NONE);
    guard(0, || {
        let Some(hit) = cache.as_ref().and_then(|c| c.hit.as_ref()) else { return 0 };
        put(status, HitResponse::STATUS);
        put(body, RpcedgeStr::of(&hit.body));
        hit.coding.map_or(0, |coding| coding as i32)
    })
}

/// The Content-Encoding token of a coding as `rpcedge_cache_hit` numbers it: no data for 0
/// (plain) or a number that names no coding.
#[no_mangle]
pub extern "C" fn rpcedge_coding_token(coding: i32) -> RpcedgeStr {
    let token = Coding::ALL.into_iter().find(|c| *c as i32 == coding).map(Coding::token);
    token.map_or(RpcedgeStr::NONE, |token| RpcedgeStr::of(token.as_bytes()))
}

/// The hit's header at `index` (from 0): 1 with its name (lower case) and value, 0 past the last.
/// Content-Type, Content-Encoding when gzip and Vary come first, then the node's headers the entry
/// kept.
///
/// # Safety
/// `cache` is NULL or live; `name` and `value` are writable.
#[no_mangle]
pub unsafe extern "C" fn rpcedge_cache_hit_header(
    cache: *const RpcedgeCache,
    index: usize,
    name: *mut RpcedgeStr,
    value: *mut RpcedgeStr,
) -> i32 {
    put(name, RpcedgeStr::NONE);
    put(value, RpcedgeStr::NONE);
    guard(0, || {
        let Some(hit) = cache.as_ref().and_then(|c| c.hit.as_ref()) else { return 0 };
        let Some((n, v)) = hit.headers.get(index) else { return 0 };
        put(name, RpcedgeStr::of(n.as_bytes()));
        put(value, RpcedgeStr::of(v.as_bytes()));
        1
    })
}

/// Lays out `len` bytes at `region` as a hot tier (see `cache::hot`), unless they hold one of
/// the same size already. 1: done; 0: the region is too small (`rpcedge_cache_hot_min_region`).
///
/// # Safety
/// `region` points to `len` writable bytes that nothing else uses during the call.
#[no_mangle]
pub unsafe extern "C" fn rpcedge_cache_hot_init(region: *mut u8, len: usize) -> i32 {
    guard(0, || hot_tier(region, len).is_some().into())
}

/// The smallest region `rpcedge_cache_hot_init` takes.
#[no_mangle]
pub extern "C" fn rpcedge_cache_hot_min_region() -> usize {
    rpcedge_core::cache::HOT_MIN_REGION
}

unsafe fn hot_tier<'a>(region: *mut u8, len: usize) -> Option<HotTier<'a>> {
    (!region.is_null()).then(|| HotTier::open(std::slice::from_raw_parts_mut(region, len))).flatten()
}

/// The node's response head: its status, length (negative: none) and `headers_len` headers,
/// Content-Type and Content-Encoding among them. 1: pass the plain body through
/// `rpcedge_cache_pass`, which holds it for `rpcedge_cache_store` or, where
/// `rpcedge_cache_replaces_body` says so, to merge it; 0: do not.
///
/// # Safety
/// `cache` is NULL or live; `headers` points to `headers_len` headers.
#[no_mangle]
pub unsafe extern "C" fn rpcedge_cache_response_head(
    cache: *mut RpcedgeCache,
    status: u16,
    content_length: i64,
    headers: *const RpcedgeHeader,
    headers_len: usize,
) -> i32 {
    guard(0, || {
        let Some(cache) = cache.as_mut() else { return 0 };
        let length = u64::try_from(content_length).ok();
        cache.exchange.response_head(status, length, &header_list(headers, headers_len)).into()
    })
}

/// A host's header array as (name, value) pairs.
unsafe fn header_list<'a>(headers: *const RpcedgeHeader, len: usize) -> Vec<(&'a [u8], &'a [u8])> {
    if headers.is_null() {
        return Vec::new();
    }
    let headers = std::slice::from_raw_parts(headers, len);
    headers.iter().map(|h| (bytes(h.name, h.name_len), bytes(h.value, h.value_len))).collect()
}

/// 1 when the node's answer (to a batch less the calls the cache answered) is held rather than
/// passed on, and the client gets the body `rpcedge_cache_pass` merges, with its own length.
///
/// # Safety
/// `cache` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn rpcedge_cache_replaces_body(cache: *const RpcedgeCache) -> i32 {
    guard(0, || cache.as_ref().is_some_and(|cache| cache.exchange.replaces_body()).into())
}

/// A piece of the node's body, `len` bytes at `piece` (`end` not 0: its last), once
/// `rpcedge_cache_response_head` has said to hold it: `RPCEDGE_PASS_ON` or `RPCEDGE_PASS_KEPT`,
/// the piece goes on as it came (kept for the store too, or no longer); `RPCEDGE_PASS_HELD`,
/// nothing goes on yet; `RPCEDGE_PASS_MERGED`, `merged` goes on in place of all that was held: a
/// split batch's answer merged with the cache's, whole where the node's ended with this piece,
/// else its start, after which the rest of the node's body passes on as it comes.
///
/// # Safety
/// `cache` is NULL or live; `piece` points to `len` readable bytes; `merged` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn rpcedge_cache_pass(
    cache: *mut RpcedgeCache,
    piece: *const u8,
    len: usize,
    end: i32,
    merged: *mut RpcedgeStr,
) -> i32 {
    put(merged, RpcedgeStr::NONE);
    guard(RPCEDGE_PASS_ON, || {
        let Some(cache) = cache.as_mut() else { return RPCEDGE_PASS_ON };
        match cache.exchange.pass(bytes(piece, len), end != 0) {
            Passed::On => RPCEDGE_PASS_ON,
            Passed::Kept => RPCEDGE_PASS_KEPT,
            Passed::Held => RPCEDGE_PASS_HELD,
            Passed::Merged(body) => {
                cache.batch_answer = body;
                put(merged, RpcedgeStr::of(&cache.batch_answer));
                RPCEDGE_PASS_MERGED
            }
        }
    })
}

/// What `rpcedge_cache_pass` says of a piece of the node's body.
pub const RPCEDGE_PASS_ON: i32 = 0;
pub const RPCEDGE_PASS_KEPT: i32 = 1;
pub const RPCEDGE_PASS_HELD: i32 = 2;
pub const RPCEDGE_PASS_MERGED: i32 = 3;

/// The node's body has ended, whole, and passed through `rpcedge_cache_pass`. 1: `call` is filled
/// with the first store, and `rpcedge_cache_next_store` gives the others (a batch's answer may
/// give several); 0: nothing is kept (an error, a null, too large, ...). `rpcedge_count_refusal`
/// counts what is not.
///
/// # Safety
/// `cache` is NULL or live; `call` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn rpcedge_cache_store(cache: *mut RpcedgeCache, call: *mut RpcedgeDaemonCall) -> i32 {
    put(call, RpcedgeDaemonCall::NONE);
    guard(0, || {
        let Some(cache) = cache.as_mut() else { return 0 };
        for store in cache.exchange.stores_held() {
            match store {
                Ok(store) => cache.stores.push_back(store),
                Err(refusal) => cache.refusals.push(refusal),
            }
        }
        let store = cache.stores.pop_front();
        hand_out(cache, store, call)
    })
}

/// The next store of those `rpcedge_cache_store` made: 1 with `call` filled, 0 past the last.
///
/// # Safety
/// `cache` is NULL or live; `call` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn rpcedge_cache_next_store(cache: *mut RpcedgeCache, call: *mut RpcedgeDaemonCall) -> i32 {
    put(call, RpcedgeDaemonCall::NONE);
    guard(0, || {
        let Some(cache) = cache.as_mut() else { return 0 };
        let store = cache.stores.pop_front();
        hand_out(cache, store, call)
    })
}

/// The key (hex) of a request that takes one (one call or a Beacon-API read; not a batch, not a
/// bypass): 1 with `key` filled, pointing into the handle; 0 otherwise. For a host that keeps
/// entries itself.
///
/// # Safety
/// `cache` is NULL or live; `key` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn rpcedge_cache_key(cache: *mut RpcedgeCache, key: *mut RpcedgeStr) -> i32 {
    put(key, RpcedgeStr::NONE);
    guard(0, || {
        let Some(cache) = cache.as_mut() else { return 0 };
        cache.key = cache.exchange.key().map(|key| key.hex());
        let Some(hex) = &cache.key else { return 0 };
        put(key, RpcedgeStr::of(hex.as_bytes()));
        1
    })
}

/// For a host that keeps entries itself: the entry its storage holds under `rpcedge_cache_key`
/// (`entry` NULL: none). 1: a hit, to send as `rpcedge_cache_hit` gives it; 0: ask the node.
///
/// # Safety
/// `cache` is NULL or live; `entry` is NULL or points to `len` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn rpcedge_cache_found(cache: *mut RpcedgeCache, entry: *const u8, len: usize, min_length: u64) -> i32 {
    guard(0, || {
        let Some(cache) = cache.as_mut() else { return 0 };
        let entry = (!entry.is_null()).then(|| bytes(entry, len));
        cache.hit = cache.exchange.found(entry, min_length);
        cache.hit.is_some().into()
    })
}

/// For a host that keeps entries itself rather than in rpcedge-cached: what to keep of the node's
/// whole plain body, its entry compacted as the daemon would (its result deflated once, at the
/// highest level). 1 with `kept` filled; 0: nothing is kept (`rpcedge_count_refusal` counts why).
///
/// # Safety
/// `cache` is NULL or live; `body` points to `len` readable bytes; `kept` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn rpcedge_cache_keep(
    cache: *mut RpcedgeCache,
    body: *const u8,
    len: usize,
    kept: *mut RpcedgeKeptEntry,
) -> i32 {
    let none = RpcedgeKeptEntry {
        key: RpcedgeStr::NONE,
        entry: RpcedgeStr::NONE,
        ttl_s: 0,
        requires_final: RpcedgeStr::NONE,
        block_hash: RpcedgeStr::NONE,
    };
    put(kept, none);
    guard(0, || {
        let Some(cache) = cache.as_mut() else { return 0 };
        let found = match cache.exchange.keep(bytes(body, len)) {
            Some(Ok(found)) => found,
            Some(Err(refusal)) => {
                cache.refusals.push(refusal);
                return 0;
            }
            None => return 0,
        };
        let own = cache.kept.insert(OwnKept {
            key: found.key.hex(),
            requires_final: found.requires_final.map(|requirement| requirement.to_string()),
            block_hash: found.block_hash,
            ttl_s: found.ttl_s.unwrap_or(0),
            entry: found.entry,
        });
        put(
            kept,
            RpcedgeKeptEntry {
                key: RpcedgeStr::of(own.key.as_bytes()),
                entry: RpcedgeStr::of(&own.entry),
                ttl_s: own.ttl_s,
                requires_final: own.requires_final.as_deref().map_or(RpcedgeStr::NONE, |value| RpcedgeStr::of(value.as_bytes())),
                block_hash: own.block_hash.as_deref().map_or(RpcedgeStr::NONE, |value| RpcedgeStr::of(value.as_bytes())),
            },
        );
        1
    })
}

/// Once the node's answer has ended, or the request is over without one: 1 with `call` filled
/// when the request held its key (coalescing) and stores no answer for it, a release the host
/// makes so that the requests waiting for it go to the node themselves; 0 otherwise, and after
/// the first 1.
///
/// # Safety
/// `cache` is NULL or live; `call` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn rpcedge_cache_release(cache: *mut RpcedgeCache, call: *mut RpcedgeDaemonCall) -> i32 {
    put(call, RpcedgeDaemonCall::NONE);
    guard(0, || {
        let Some(cache) = cache.as_mut() else { return 0 };
        let release = cache.exchange.release();
        hand_out(cache, release, call)
    })
}

/// 1 when the cache may keep the node's answer to this request (it is no bypass), so that the
/// host tells the exchange (`rpcedge_exchange_cache_may_keep`) before it asks the node; 0
/// otherwise.
///
/// # Safety
/// `cache` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn rpcedge_cache_may_keep(cache: *const RpcedgeCache) -> i32 {
    guard(0, || cache.as_ref().is_some_and(|c| c.exchange.may_keep()).into())
}

/// The status to report: `HIT`, `MISS`, `BYPASS`, `EXPIRED`, `ERROR` or `COALESCED`; with `reasons` not 0, a
/// bypass with its reason, `BYPASS; reason=method` (static).
///
/// # Safety
/// `cache` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn rpcedge_cache_status(cache: *const RpcedgeCache, reasons: u32) -> RpcedgeStr {
    let value = guard(Status::Error.as_str(), || {
        cache.as_ref().map_or(Status::Bypass.as_str(), |c| c.exchange.status_value(reasons != 0))
    });
    RpcedgeStr::of(value.as_bytes())
}
