//! The counters' C ABI (`rpcedge_core::metrics`), for nginx and the Lua binding: how many counters there
//! are and their names, and for each event the counters it adds, so that a host keeps an array of
//! `rpcedge_counters()` numbers and adds what it is told.

use std::ffi::{c_char, CString};
use std::sync::OnceLock;

use crate::cache::RpcedgeCache;
use crate::{guard, RpcedgeExchange};
use rpcedge_core::cache::Status;
use rpcedge_core::metrics::{self, Counter};

/// The most counts one event adds: the length of the array each `rpcedge_count_*` fills.
pub const RPCEDGE_COUNTS_MAX: usize = 5;

/// One count: add `amount` to the counter at `index` (below `rpcedge_counters()`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RpcedgeCount {
    pub index: u32,
    pub amount: u64,
}

/// How many counters there are.
#[no_mangle]
pub extern "C" fn rpcedge_counters() -> usize {
    Counter::all().count()
}

/// The counter at `index`'s name in Prometheus' text format, as Envoy prints it
/// (`rpcedge_responses_oneshot`): NUL-terminated and static; NULL past the last.
#[no_mangle]
pub extern "C" fn rpcedge_counter_name(index: usize) -> *const c_char {
    static NAMES: OnceLock<Vec<CString>> = OnceLock::new();
    let names = NAMES.get_or_init(|| {
        Counter::all().map(|counter| CString::new(counter.prometheus_name()).expect("no NUL")).collect()
    });
    names.get(index).map_or(std::ptr::null(), |name| name.as_ptr())
}

/// Fills `counts` (`RPCEDGE_COUNTS_MAX` of them) from `amounts`; returns how many.
unsafe fn fill(counts: *mut RpcedgeCount, amounts: impl IntoIterator<Item = (Counter, u64)>) -> usize {
    if counts.is_null() {
        return 0;
    }
    let counts = std::slice::from_raw_parts_mut(counts, RPCEDGE_COUNTS_MAX);
    let mut n = 0;
    for ((counter, amount), count) in amounts.into_iter().zip(counts) {
        *count = RpcedgeCount { index: counter.index() as u32, amount };
        n += 1;
    }
    n
}

fn once(counters: impl IntoIterator<Item = Counter>) -> impl Iterator<Item = (Counter, u64)> {
    counters.into_iter().map(|counter| (counter, 1))
}

/// The exchange is over: `ended` when it ran to its end (passed, finished or failed), 0 when its
/// request ended first (the client or the upstream left), which counts as aborted alone;
/// `compress_us` is the time the host spent in its feeds. Returns how many `counts` it filled.
///
/// # Safety
/// `exchange` is NULL or live; `counts` is NULL or points to `RPCEDGE_COUNTS_MAX` writable counts.
#[no_mangle]
pub unsafe extern "C" fn rpcedge_count_exchange(
    exchange: *const RpcedgeExchange,
    ended: u8,
    compress_us: u64,
    counts: *mut RpcedgeCount,
) -> usize {
    guard(0, || {
        let Some(exchange) = exchange.as_ref().map(|ex| &ex.0) else { return 0 };
        if ended == 0 {
            return fill(counts, once([Counter::Aborted]));
        }
        let (amounts, _) =
            metrics::exchange_ended(
                exchange.mode(),
                exchange.counts(),
                compress_us,
                exchange.transcode_outcome(),
                exchange.upstream_encoded(),
            );
        fill(counts, amounts)
    })
}

/// The request's cache status, once its answer begins (a hit: as it is sent): the status, and
/// the bypass's reason or, for a hit from the hot tier, a hot hit.
///
/// # Safety
/// `cache` is NULL or live; `counts` as for `rpcedge_count_exchange`.
#[no_mangle]
pub unsafe extern "C" fn rpcedge_count_cache(cache: *const RpcedgeCache, counts: *mut RpcedgeCount) -> usize {
    guard(0, || {
        let Some(cache) = cache.as_ref() else { return 0 };
        match cache.exchange.status() {
            Status::Hit => fill(counts, once(metrics::cache_hit(Status::Hit, cache.hot))),
            status => fill(counts, once(metrics::cache_responded(status, cache.exchange.bypass()))),
        }
    })
}

/// The node's answer has ended: why the core would not keep it, if it would not (what
/// `rpcedge_cache_store` refused, or what the head said already), once.
///
/// # Safety
/// `cache` is NULL or live; `counts` as for `rpcedge_count_exchange`.
#[no_mangle]
pub unsafe extern "C" fn rpcedge_count_refusal(cache: *mut RpcedgeCache, counts: *mut RpcedgeCount) -> usize {
    guard(0, || {
        let Some(cache) = cache.as_mut() else { return 0 };
        let Some(refusal) = cache.refusals.pop().or_else(|| cache.exchange.take_head_refusal()) else { return 0 };
        fill(counts, once(metrics::store_refused(refusal)))
    })
}

/// The daemon's answer to a store: its status, 0 when there was none (the call failed).
///
/// # Safety
/// `counts` as for `rpcedge_count_exchange`.
#[no_mangle]
pub unsafe extern "C" fn rpcedge_count_store(status: u16, counts: *mut RpcedgeCount) -> usize {
    guard(0, || fill(counts, once([Counter::for_store_answer((status != 0).then_some(status))])))
}

/// A compression meant for the host's thread pool: `posted` to it, or 0 when it ran inline.
///
/// # Safety
/// `counts` as for `rpcedge_count_exchange`.
#[no_mangle]
pub unsafe extern "C" fn rpcedge_count_offload(posted: u8, counts: *mut RpcedgeCount) -> usize {
    guard(0, || fill(counts, once([Counter::for_offload(posted != 0)])))
}
