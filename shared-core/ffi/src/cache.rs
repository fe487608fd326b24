//! The cache's C ABI: one `CacheExchange` per request (see `cache::flow`), for the nginx module
//! and the Lua binding. Strings handed out are valid until the next call on the same handle.

use std::ptr;

use crate::{bytes, guard, put, RpcedgeHeader, RpcedgeSettings, RpcedgeStr};
use rpcedge_core::cache::{
    entry_bound, protocol, CacheExchange, CacheSettings, DaemonAnswer, Entry, HitResponse, HotTier, Refusal, Status,
    StoreCall,
};
use rpcedge_core::config::MAX_ENTRY;

/// Opaque per-request cache exchange.
pub struct RpcedgeCache {
    pub(super) exchange: CacheExchange,
    settings: CacheSettings,
    lookup_path: Option<String>,
    hit: Option<HitResponse>,
    /// The hit came from the hot tier.
    pub(super) hot: bool,
    store: Option<StoreCall>,
    /// Why `rpcedge_cache_store` did not keep the answer, until it is counted.
    pub(super) refusal: Option<Refusal>,
}

/// The call that stores an answer: `PUT path`, with these headers (a NULL `data` is an absent
/// header) and body. Valid until the next call on the handle.
#[repr(C)]
pub struct RpcedgeStoreCall {
    pub path: RpcedgeStr,
    pub ns: RpcedgeStr,
    pub ttl: RpcedgeStr,
    pub requires_final: RpcedgeStr,
    pub body: RpcedgeStr,
}

/// The longest answer a daemon gives a lookup: an entry of the largest `max_entry` any host may
/// configure (with its envelope), whichever host stored it.
pub const RPCEDGE_CACHE_MAX_ANSWER: u64 = 67_117_110;

const _: () = assert!(RPCEDGE_CACHE_MAX_ANSWER == entry_bound(MAX_ENTRY));

unsafe fn string(s: &RpcedgeStr) -> Option<&[u8]> {
    (!s.data.is_null()).then(|| bytes(s.data, s.len))
}

/// A cache exchange under the cache's settings of `settings` (its limits), for a request in
/// namespace `ns`, the one configured where the request was routed (a NULL `data`: none, so the
/// request bypasses the cache; never one from the request), whose method is `method` (only a
/// POST is looked up), whose body is `body` (NULL: the host
/// does not hold it whole, so the request bypasses the cache), with the client's `headers_len`
/// headers (Accept-Encoding says whether a hit may be gzip; a client that asks for the SSZ of a
/// result bypasses the cache, which holds JSON; the rest decide which stored variant is the
/// client's). NULL when `settings` is NULL, or on a panic.
///
/// # Safety
/// `settings` is NULL or live; the strings point to readable bytes of their lengths; `headers`
/// to `headers_len` headers.
#[no_mangle]
pub unsafe extern "C" fn rpcedge_cache_new(
    settings: *const RpcedgeSettings,
    ns: RpcedgeStr,
    method: RpcedgeStr,
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
        let headers = header_list(headers, headers_len);
        let exchange = CacheExchange::new(namespace.as_deref(), method, body, &headers, &settings);
        let lookup_path = exchange.lookup_path();
        let cache = RpcedgeCache { exchange, settings, lookup_path, hit: None, hot: false, store: None, refusal: None };
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

/// # Safety
/// `cache` is NULL or came from `rpcedge_cache_new`, and is freed once.
#[no_mangle]
pub unsafe extern "C" fn rpcedge_cache_free(cache: *mut RpcedgeCache) {
    if !cache.is_null() {
        guard((), || drop(Box::from_raw(cache)));
    }
}

/// The lookup to make (`GET` this path of the daemon), or 0 when the request bypasses the cache.
///
/// # Safety
/// `cache` is NULL or live; `path` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn rpcedge_cache_lookup_path(cache: *const RpcedgeCache, path: *mut RpcedgeStr) -> i32 {
    put(path, RpcedgeStr::NONE);
    guard(0, || {
        let Some(lookup) = cache.as_ref().and_then(|c| c.lookup_path.as_ref()) else { return 0 };
        put(path, RpcedgeStr::of(lookup.as_bytes()));
        1
    })
}

/// Which of `shards` daemons to ask: 0 to `shards - 1`.
///
/// # Safety
/// `cache` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn rpcedge_cache_shard(cache: *const RpcedgeCache, shards: u32) -> u32 {
    guard(0, || cache.as_ref().map_or(0, |c| c.exchange.shard(shards)))
}

/// The daemon answered the lookup with `status`, its `X-Rpcedge-Miss` and `X-Rpcedge-Ttl`
/// headers (NULL `data`: none) and `body`. 1: a hit, to send as `rpcedge_cache_hit` gives it
/// (and to keep with `rpcedge_cache_hot_keep`); 0: ask the node.
///
/// # Safety
/// `cache` is NULL or live; the strings point to readable bytes of their lengths.
#[no_mangle]
pub unsafe extern "C" fn rpcedge_cache_answered(
    cache: *mut RpcedgeCache,
    status: u16,
    miss: RpcedgeStr,
    ttl: RpcedgeStr,
    body: *const u8,
    body_len: usize,
    min_length: u64,
) -> i32 {
    guard(0, || {
        let Some(cache) = cache.as_mut() else { return 0 };
        let answer = DaemonAnswer { status, miss: string(&miss), ttl: string(&ttl), body: bytes(body, body_len) };
        cache.hit = cache.exchange.answered(&answer, min_length);
        cache.hit.is_some().into()
    })
}

/// The hit's body; returns 1 when it is gzip (`Content-Encoding: gzip`), 0 when plain. Send it
/// with its exact length and the headers `rpcedge_cache_hit_header` gives.
///
/// # Safety
/// `cache` is NULL or live; `body` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn rpcedge_cache_hit(cache: *const RpcedgeCache, body: *mut RpcedgeStr) -> i32 {
    put(body, RpcedgeStr::NONE);
    guard(0, || {
        let Some(hit) = cache.as_ref().and_then(|c| c.hit.as_ref()) else { return 0 };
        put(body, RpcedgeStr::of(&hit.body));
        hit.gzip.into()
    })
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

/// Before the daemon is asked: 1 when the hot tier at `region` holds this request's entry, now
/// copied out, so that the host can release its lock before `rpcedge_cache_hot_hit`.
///
/// # Safety
/// `cache` is NULL or live; `region` was laid out by `rpcedge_cache_hot_init` and the caller
/// holds it alone during the call (nginx: the zone's lock).
#[no_mangle]
pub unsafe extern "C" fn rpcedge_cache_hot_find(cache: *mut RpcedgeCache, region: *mut u8, len: usize, now_s: u64) -> i32 {
    guard(0, || {
        let (Some(cache), Some(hot)) = (cache.as_mut(), hot_tier(region, len)) else { return 0 };
        cache.exchange.find_hot(&hot, now_s).into()
    })
}

/// The hit for the entry `rpcedge_cache_hot_find` found. 1: send it as `rpcedge_cache_hit` gives
/// it; 0: ask the daemon after all.
///
/// # Safety
/// `cache` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn rpcedge_cache_hot_hit(cache: *mut RpcedgeCache, min_length: u64) -> i32 {
    guard(0, || {
        let Some(cache) = cache.as_mut() else { return 0 };
        cache.hit = cache.exchange.hot_answer(min_length);
        cache.hot = cache.hit.is_some();
        cache.hot.into()
    })
}

/// After the daemon's hit: keeps its entry (the body of its answer) in the hot tier at `region`.
///
/// # Safety
/// As `rpcedge_cache_hot_find`; `entry` points to `entry_len` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn rpcedge_cache_hot_keep(
    cache: *mut RpcedgeCache,
    region: *mut u8,
    len: usize,
    entry: *const u8,
    entry_len: usize,
    now_s: u64,
) {
    guard((), || {
        if let (Some(cache), Some(mut hot)) = (cache.as_mut(), hot_tier(region, len)) {
            cache.exchange.keep_hot(&mut hot, bytes(entry, entry_len), now_s);
        }
    });
}

unsafe fn hot_tier<'a>(region: *mut u8, len: usize) -> Option<HotTier<'a>> {
    (!region.is_null()).then(|| HotTier::open(std::slice::from_raw_parts_mut(region, len))).flatten()
}

/// The lookup failed (no answer within the timeout, no daemon): ask the node.
///
/// # Safety
/// `cache` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn rpcedge_cache_failed(cache: *mut RpcedgeCache) {
    guard((), || {
        if let Some(cache) = cache.as_mut() {
            cache.exchange.failed();
        }
    });
}

/// The node's response head: its status, length (negative: none) and `headers_len` headers,
/// Content-Type and Content-Encoding among them. 1: keep the plain body for
/// `rpcedge_cache_store`; 0: do not.
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
        let settings = &cache.settings;
        cache.exchange.response_head(status, length, &header_list(headers, headers_len), settings).into()
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

/// The host holds `held` bytes of a body whose length the head did not give. 1: go on holding
/// it; 0: drop it, it is too large to store.
///
/// # Safety
/// `cache` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn rpcedge_cache_keep_holding(cache: *mut RpcedgeCache, held: u64) -> i32 {
    guard(0, || {
        let Some(cache) = cache.as_mut() else { return 0 };
        let settings = &cache.settings;
        cache.exchange.keep_holding(held, settings).into()
    })
}

/// The node's whole plain body. 1: `call` is filled with the PUT that stores it; 0: it is not
/// kept (an error, a null, too large, ...).
///
/// # Safety
/// `cache` is NULL or live; `body` points to `len` readable bytes; `call` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn rpcedge_cache_store(
    cache: *mut RpcedgeCache,
    body: *const u8,
    len: usize,
    call: *mut RpcedgeStoreCall,
) -> i32 {
    put(call, store_call(None));
    guard(0, || {
        let Some(cache) = cache.as_mut() else { return 0 };
        let settings = &cache.settings;
        let store = cache.exchange.store(bytes(body, len), settings);
        cache.refusal = store.as_ref().err().copied();
        cache.store = store.ok();
        put(call, store_call(cache.store.as_ref()));
        cache.store.is_some().into()
    })
}

/// For a host that keeps entries itself rather than in rpcedge-cached: the last store's entry
/// compacted as the daemon would (its result deflated once, at the highest level), `call`
/// filled again. 1: done; 0: no store to compact.
///
/// # Safety
/// `cache` is NULL or live; `call` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn rpcedge_cache_compact_store(cache: *mut RpcedgeCache, call: *mut RpcedgeStoreCall) -> i32 {
    put(call, store_call(None));
    guard(0, || {
        let Some(store) = cache.as_mut().and_then(|c| c.store.as_mut()) else { return 0 };
        let Ok(compacted) = Entry::decode(&store.body).and_then(|entry| entry.compact()) else { return 0 };
        store.body = compacted;
        put(call, store_call(Some(store)));
        1
    })
}

fn store_call(store: Option<&StoreCall>) -> RpcedgeStoreCall {
    let Some(store) = store else {
        return RpcedgeStoreCall { path: RpcedgeStr::NONE, ns: RpcedgeStr::NONE, ttl: RpcedgeStr::NONE, requires_final: RpcedgeStr::NONE, body: RpcedgeStr::NONE };
    };
    let header = |name: &str| store.headers.iter().find(|(n, _)| *n == name).map_or(RpcedgeStr::NONE, |(_, v)| RpcedgeStr::of(v.as_bytes()));
    RpcedgeStoreCall {
        path: RpcedgeStr::of(store.path.as_bytes()),
        ns: header(protocol::NAMESPACE_HEADER),
        ttl: header(protocol::TTL_HEADER),
        requires_final: header(protocol::REQUIRES_FINAL_HEADER),
        body: RpcedgeStr::of(&store.body),
    }
}

/// The status to report: `HIT`, `MISS`, `BYPASS`, `EXPIRED` or `ERROR`; with `reasons` not 0, a
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
