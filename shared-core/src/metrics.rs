//! The counters every host keeps, named once: the proxy-wasm filter and the native module define
//! the same names (`rpcedge.<name>`, under each host's own stats prefix), nginx and the Lua binding
//! print them as [`Counter::prometheus_name`] says, and all count the same events, as this module
//! says (nginx and Lua through the C ABI's `rpcedge_count_*`).

use crate::cache::{Bypass, Refusal, Status as CacheStatus};
use crate::exchange::{Mode, TranscodeOutcome};

/// The modes an exchange ends in: all but `Pending`, the first.
const END_MODES: &[Mode] = Mode::ALL.split_at(1).1;
const CACHE_STATUSES: [CacheStatus; 6] = CacheStatus::all();
/// The counters after the modes and before the cache statuses, in `Counter::all`'s order.
const MIDDLE: [Counter; 9] = [
    Counter::Aborted,
    Counter::BodyBytesIn,
    Counter::BodyBytesOut,
    Counter::CompressTimeUs,
    Counter::Transcoded,
    Counter::TranscodeRefused,
    Counter::Offloads,
    Counter::InlineFallbacks,
    Counter::UpstreamEncoded,
];
/// The cache's counters after its statuses and before its reasons.
const STORES: [Counter; 4] = [Counter::HotHits, Counter::StoresTaken, Counter::StoresRefused, Counter::StoresFailed];

/// One counter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counter {
    /// Exchanges that ended in this mode (never `Pending`).
    Responses(Mode),
    /// Exchanges still under way when their stream ended (a client or upstream reset).
    Aborted,
    BodyBytesIn,
    BodyBytesOut,
    /// Time spent compressing, over all exchanges.
    CompressTimeUs,
    /// Bodies sent transcoded, and bodies that could have been but went out as they came.
    Transcoded,
    TranscodeRefused,
    /// Whole-body compressions handed to the host's thread pool, and those meant for it that ran
    /// inline (its queue was full): both stay 0 on a host without a thread pool (all but nginx
    /// with `aio threads`).
    Offloads,
    InlineFallbacks,
    /// Answers that came from the node encoded (Content-Encoding other than identity), though
    /// it is asked for identity wherever rpcedge has work: a node or middlebox that compresses
    /// regardless. They pass as they came.
    UpstreamEncoded,
    /// Requests by their cache status.
    CacheResponses(CacheStatus),
    /// Hits the hot tier answered (each also in `CacheResponses(Hit)`).
    HotHits,
    /// Stores the daemon took, refused (not final, too large, ...) or that failed; answers the
    /// core refused to store count as refused too.
    StoresTaken,
    StoresRefused,
    StoresFailed,
    /// Requests that bypassed the cache, by reason.
    CacheBypassed(Bypass),
    /// Answers the core refused to store, by reason (also in `StoresRefused`).
    StoresRefusedFor(Refusal),
}

impl Counter {
    /// Every counter, in the order of [`Counter::index`].
    pub fn all() -> impl Iterator<Item = Counter> {
        let modes = END_MODES.iter().map(|&mode| Counter::Responses(mode));
        let statuses = CACHE_STATUSES.into_iter().map(Counter::CacheResponses);
        let bypasses = Bypass::all().into_iter().map(Counter::CacheBypassed);
        let refusals = Refusal::all().into_iter().map(Counter::StoresRefusedFor);
        modes.chain(MIDDLE).chain(statuses).chain(STORES).chain(bypasses).chain(refusals)
    }

    /// The counter's place in [`Counter::all`], for a host's table of metric ids.
    pub fn index(self) -> usize {
        let position = |found: Option<usize>| found.expect("every counter is in Counter::all");
        let (modes, middle, statuses) = (END_MODES.len(), MIDDLE.len(), CACHE_STATUSES.len());
        let bypasses = modes + middle + statuses + STORES.len();
        match self {
            Counter::CacheBypassed(bypass) => bypasses + position(Bypass::all().iter().position(|&b| b == bypass)),
            Counter::StoresRefusedFor(refusal) => {
                bypasses + Bypass::all().len() + position(Refusal::all().iter().position(|&r| r == refusal))
            }
            Counter::Responses(mode) => position(END_MODES.iter().position(|&m| m == mode)),
            Counter::CacheResponses(status) => {
                modes + middle + position(CACHE_STATUSES.iter().position(|&s| s == status))
            }
            Counter::HotHits | Counter::StoresTaken | Counter::StoresRefused | Counter::StoresFailed => {
                modes + middle + statuses + position(STORES.iter().position(|&c| c == self))
            }
            _ => modes + position(MIDDLE.iter().position(|&c| c == self)),
        }
    }

    /// The name under `rpcedge.`, e.g. `responses.oneshot`, `cache.stores.taken`.
    pub fn name(self) -> String {
        match self {
            Counter::Responses(mode) => format!("responses.{}", mode.as_str()),
            Counter::Aborted => "responses.aborted".into(),
            Counter::BodyBytesIn => "body_bytes_in".into(),
            Counter::BodyBytesOut => "body_bytes_out".into(),
            Counter::CompressTimeUs => "compress_time_us".into(),
            Counter::Transcoded => "transcode.done".into(),
            Counter::TranscodeRefused => "transcode.refused".into(),
            Counter::Offloads => "offload.posted".into(),
            Counter::InlineFallbacks => "offload.inline".into(),
            Counter::UpstreamEncoded => "upstream_encoded".into(),
            Counter::CacheResponses(status) => {
                format!("cache.responses.{}", status.as_str().to_ascii_lowercase())
            }
            Counter::HotHits => "cache.hot_hits".into(),
            Counter::StoresTaken => "cache.stores.taken".into(),
            Counter::StoresRefused => "cache.stores.refused".into(),
            Counter::StoresFailed => "cache.stores.failed".into(),
            Counter::CacheBypassed(bypass) => format!("cache.bypass.{}", bypass.as_str()),
            Counter::StoresRefusedFor(refusal) => {
                format!("cache.stores.refused.{}", refusal.as_str())
            }
        }
    }

    /// The name in Prometheus' text format, as Envoy prints a Wasm filter's `rpcedge.<name>`:
    /// `rpcedge_responses_oneshot`, `rpcedge_cache_stores_taken`.
    pub fn prometheus_name(self) -> String {
        format!("rpcedge_{}", self.name().replace('.', "_"))
    }

    /// What a compression meant for the host's thread pool counts as: posted to it, or run
    /// inline.
    pub fn for_offload(posted: bool) -> Counter {
        if posted {
            Counter::Offloads
        } else {
            Counter::InlineFallbacks
        }
    }

    /// What the daemon's answer to a store counts as: its status, or none when there was no
    /// answer.
    pub fn for_store_answer(status: Option<u16>) -> Counter {
        match status {
            Some(204) => Counter::StoresTaken,
            Some(409 | 413) => Counter::StoresRefused,
            _ => Counter::StoresFailed,
        }
    }
}

/// What a request's cache status adds to the counters, once the node's answer has begun (a hit
/// counts only its status).
pub fn cache_responded(status: CacheStatus, bypass: Option<Bypass>) -> impl Iterator<Item = Counter> {
    let reason = bypass.filter(|_| status == CacheStatus::Bypass).map(Counter::CacheBypassed);
    std::iter::once(Counter::CacheResponses(status)).chain(reason)
}

/// What an answer the cache sent adds to the counters: its status (a hit, or the answer to another
/// request it waited for), and a hot hit besides when the hot tier answered.
pub fn cache_hit(status: CacheStatus, hot: bool) -> impl Iterator<Item = Counter> {
    std::iter::once(Counter::CacheResponses(status)).chain(hot.then_some(Counter::HotHits))
}

/// What an answer the core refused to store adds to the counters.
pub fn store_refused(refusal: Refusal) -> [Counter; 2] {
    [Counter::StoresRefused, Counter::StoresRefusedFor(refusal)]
}

/// The histogram of each compressing exchange's compression time, in microseconds, under
/// `rpcedge.`.
pub fn compress_duration_name() -> &'static str {
    "compress_duration_us"
}

/// What an exchange that ended adds to the counters: each counter with its amount, none of them
/// zero (Envoy refuses to add zero to a counter), and the compression time to record in the
/// histogram, when it compressed.
pub fn exchange_ended(
    mode: Mode,
    (bytes_in, bytes_out): (u64, u64),
    compress_us: u64,
    transcode: TranscodeOutcome,
    upstream_encoded: bool,
) -> (impl Iterator<Item = (Counter, u64)>, Option<u64>) {
    let transcoded = match transcode {
        TranscodeOutcome::None => None,
        TranscodeOutcome::Transcoded => Some((Counter::Transcoded, 1)),
        TranscodeOutcome::Refused => Some((Counter::TranscodeRefused, 1)),
    };
    let amounts = [
        (mode != Mode::Pending).then_some((Counter::Responses(mode), 1)),
        Some((Counter::BodyBytesIn, bytes_in)),
        Some((Counter::BodyBytesOut, bytes_out)),
        Some((Counter::CompressTimeUs, compress_us)),
        transcoded,
        upstream_encoded.then_some((Counter::UpstreamEncoded, 1)),
    ];
    let compressed = bytes_in > 0 && !matches!(mode, Mode::Untouched | Mode::Small);
    (amounts.into_iter().flatten().filter(|&(_, amount)| amount > 0), compressed.then_some(compress_us))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_counter_has_its_own_index_and_name() {
        let all: Vec<Counter> = Counter::all().collect();
        for (at, counter) in all.iter().enumerate() {
            assert_eq!(counter.index(), at, "{counter:?}");
        }
        let mut names: Vec<String> = all.iter().map(|c| c.name()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), all.len());
        assert!(names.contains(&"responses.oneshot".to_string()) && names.contains(&"cache.responses.hit".to_string()));
        assert!(!names.contains(&"responses.pending".to_string()));
    }

    #[test]
    fn an_ended_exchange_adds_no_zeros() {
        let (amounts, duration) = exchange_ended(Mode::Small, (500, 500), 0, TranscodeOutcome::None, false);
        let amounts: Vec<_> = amounts.collect();
        assert_eq!(
            amounts,
            [(Counter::Responses(Mode::Small), 1), (Counter::BodyBytesIn, 500), (Counter::BodyBytesOut, 500)]
        );
        assert_eq!(duration, None);
        let (amounts, duration) = exchange_ended(Mode::Oneshot, (9000, 900), 7, TranscodeOutcome::Refused, false);
        assert_eq!(amounts.count(), 5);
        let (amounts, _) = exchange_ended(Mode::Untouched, (9000, 9000), 0, TranscodeOutcome::None, true);
        assert!(amounts.into_iter().any(|amount| amount == (Counter::UpstreamEncoded, 1)));
        assert_eq!(duration, Some(7));
    }

    #[test]
    fn prometheus_names_are_envoys() {
        assert_eq!(Counter::Responses(Mode::Oneshot).prometheus_name(), "rpcedge_responses_oneshot");
        assert_eq!(Counter::CacheBypassed(Bypass::Members).prometheus_name(), "rpcedge_cache_bypass_members");
        assert_eq!(Counter::HotHits.prometheus_name(), "rpcedge_cache_hot_hits");
        for counter in Counter::all() {
            let name = counter.prometheus_name();
            assert!(name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'), "{name}");
        }
    }

    #[test]
    fn a_hot_hit_is_a_hit_too() {
        assert_eq!(cache_hit(CacheStatus::Hit, false).collect::<Vec<_>>(), [Counter::CacheResponses(CacheStatus::Hit)]);
        assert_eq!(
            cache_hit(CacheStatus::Hit, true).collect::<Vec<_>>(),
            [Counter::CacheResponses(CacheStatus::Hit), Counter::HotHits]
        );
        let coalesced = cache_hit(CacheStatus::Coalesced, false).collect::<Vec<_>>();
        assert_eq!(coalesced, [Counter::CacheResponses(CacheStatus::Coalesced)]);
        assert_eq!(Counter::CacheResponses(CacheStatus::Coalesced).prometheus_name(), "rpcedge_cache_responses_coalesced");
    }

    #[test]
    fn store_answers() {
        assert_eq!(Counter::for_store_answer(Some(204)), Counter::StoresTaken);
        assert_eq!(Counter::for_store_answer(Some(413)), Counter::StoresRefused);
        assert_eq!(Counter::for_store_answer(Some(500)), Counter::StoresFailed);
        assert_eq!(Counter::for_store_answer(None), Counter::StoresFailed);
    }
}
