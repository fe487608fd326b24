//! The fleet tier: a Redis Cluster behind each host's store, so that what one host's node answered
//! is a hit on every host. The cluster's client (`redis`, cluster-async) routes each key to its
//! node and follows MOVED/ASK, failover and reconnection; this module bounds every round by the
//! fleet timeout, skips a failing master (a breaker each), writes from a bounded queue, and reads
//! nothing it cannot open (`value`).
//!
//! Keys: `rpcedge:{<key in hex>}:e` holds an entry, `...:lock` the lock of a miss that went to
//! its node, `...:a` that miss's answer for the hosts that waited, `...:r` the mark of a holder
//! that let its lock go without publishing either; the hash tag puts the four in one slot, so that
//! one script or pipeline reaches all of them.

mod breaker;
mod masters;
mod settings;

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::{ErrorKind, RedisResult, Value};
use tokio::sync::mpsc;
use tokio::time::Instant;

use breaker::State;
use masters::Masters;
pub use settings::{FleetArgs, FleetSettings};

use rpcedge_core::cache::protocol::MAX_LOCK_MS;
use rpcedge_core::cache::Entry;
use rpcedge_core::cache::sealed::{Kind, Refused, Sealer, OVERHEAD};

use crate::units::now_s;

/// Entries written to the fleet at once by the queue's writer.
const WRITE_BATCH: usize = 64;
/// How long the first connection may take at start before the daemon starts without the fleet
/// (and keeps trying, every `RECONNECT_EVERY`).
const FIRST_CONNECT: Duration = Duration::from_secs(5);
const RECONNECT_EVERY: Duration = Duration::from_secs(1);
/// Writes (entries from the queue, a holder's outcome) are off every request's path: they may
/// take this long, so that a burst of large entries is not taken for a failing cluster.
const WRITE_TIMEOUT: Duration = Duration::from_secs(1);

/// Takes a miss's lock and clears an earlier holder's answer and release with it, so that those
/// who follow this holder are never handed the one before's, nor told it released the key. An
/// entry already there (a holder settled between this host's lookup and its hold) is not taken
/// for a free lock, unless `ARGV[3]` says to: its key would go to the node twice.
const HOLD: &str = r"
if ARGV[3] == '' and redis.call('EXISTS', KEYS[4]) == 1 then return 2 end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  redis.call('DEL', KEYS[2], KEYS[3])
  return 1
end
return 0";

/// Publishes a holder's outcome and frees its lock, if it still holds it, as one step: a waiting
/// host never sees the lock gone before the entry or answer is there. A holder with nothing to
/// publish that still holds its lock marks the release (`KEYS[3]`) for the lock's time left: a
/// lock gone without an entry, an answer or that mark ran out of time (its holder died, or was
/// slower than its lock), and its followers are told so, not that it released the key.
const SETTLE: &str = r"
local ours = redis.call('GET', KEYS[1]) == ARGV[1]
if ARGV[2] ~= '' then
  redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
elseif ours then
  local left = redis.call('PTTL', KEYS[1])
  if left > 0 then redis.call('SET', KEYS[3], '1', 'PX', left) end
end
if ours then redis.call('DEL', KEYS[1]) end
return 1";

/// What a lookup found in the fleet.
pub enum Found {
    /// An entry that opened, and its expiry (Unix seconds).
    Entry(Vec<u8>, Option<u64>),
    Miss,
    /// The fleet did not answer (error, timeout, breaker open): a miss that says nothing.
    Unanswered,
}

/// A miss's attempt to hold its key across the fleet.
#[derive(Debug, PartialEq, Eq)]
pub enum Hold {
    /// This daemon's request goes to the node; its outcome is published when it lands.
    Held,
    /// Another host's request is at its node: follow it.
    Taken,
    /// Another host's entry landed since this daemon's lookup: read it.
    Stored,
    /// The fleet did not answer: coalesce locally only.
    Unanswered,
}

/// What a follower's poll of a held key found.
pub enum Polled {
    /// The holder's entry, kept: any host may keep it too.
    Entry(Vec<u8>, Option<u64>),
    /// The holder's answer, not kept (not final): for the requests that waited, only.
    Answer(Vec<u8>),
    /// Still held.
    Held,
    /// Released without an entry or answer (or the lock is no daemon's): the waiters go to their
    /// node.
    Released,
    /// The lock ran out of time (its holder died, or was slower than its lock) without a release:
    /// the waiters go to their node, told their time ran out.
    Expired,
    Unanswered,
}

/// How a holder's request ended, to publish.
pub enum Outcome {
    /// Stored locally: the fleet keeps it as well (`ttl_s`: the local TTL).
    Stored(Bytes, Option<u64>),
    /// The node's answer, not kept: only the hosts that waited get it.
    Answered(Bytes),
    /// No answer to share.
    Released,
}

/// Counters of `/metrics`.
#[derive(Default)]
pub struct FleetCounters {
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    pub expired: AtomicU64,
    pub timeouts: AtomicU64,
    pub errors: AtomicU64,
    /// Rounds not sent: their master's breaker was open.
    pub skipped: AtomicU64,
    /// Times a master's breaker opened.
    pub breaker_opened: AtomicU64,
    pub stores: AtomicU64,
    pub stored_bytes: AtomicU64,
    /// Entries over `--fleet-max-entry`, kept local.
    pub too_large: AtomicU64,
    /// Entries dropped: the write queue was full.
    pub dropped: AtomicU64,
    /// Values refused, by `Refused`.
    pub refused: [AtomicU64; 3],
    pub locks_held: AtomicU64,
    /// Misses that followed another host's holder.
    pub locks_followed: AtomicU64,
    /// How each followed lock ended, by `WAIT_OUTCOMES`.
    pub lock_waits: [AtomicU64; 5],
    pub round_trips: AtomicU64,
    pub round_trip_us: AtomicU64,
}

/// How a followed lock ended: its holder's entry, its answer, released (its holder published
/// neither), its time ran out (the holder's lock, or the waiters' own), or the fleet failed.
pub const WAIT_OUTCOMES: [&str; 5] = ["entry", "answer", "released", "timeout", "error"];

struct Write {
    key: [u8; 32],
    entry: Bytes,
    ttl_s: Option<u64>,
}

pub struct Fleet {
    client: ClusterClient,
    /// None until the first connection; replaced by `reconnect`.
    connection: RwLock<Option<ClusterConnection>>,
    reconnecting: AtomicBool,
    /// Connections made so far: a reading of the slots for an older one gives up.
    connections_made: AtomicU64,
    me: Weak<Fleet>,
    sealer: Sealer,
    timeout: Duration,
    ttl: Duration,
    clock_skew_s: u64,
    max_entry: usize,
    queue: mpsc::UnboundedSender<Write>,
    queued_bytes: AtomicUsize,
    queue_bytes: usize,
    /// A breaker per master.
    masters: Masters,
    /// The keys this daemon holds in the fleet, and its token for each.
    held: Mutex<HashMap<[u8; 32], (String, Instant)>>,
    /// This daemon among the fleet's, for its lock tokens.
    instance: String,
    tokens: AtomicU64,
    pub counters: FleetCounters,
}

impl Fleet {
    /// Connects to the cluster. A refused login is an error; a cluster that cannot be reached
    /// is not: the daemon starts without it and keeps trying.
    pub async fn start(settings: FleetSettings) -> Result<Arc<Fleet>, String> {
        let mut builder = ClusterClientBuilder::new(settings.seeds.clone())
            .connection_timeout(settings.timeout.max(Duration::from_millis(200)))
            .response_timeout(settings.timeout)
            .retries(2);
        if let Some(user) = &settings.user {
            builder = builder.username(user);
        }
        if let Some(password) = &settings.password {
            builder = builder.password(password);
        }
        if settings.tls {
            builder = builder.certs(redis::TlsCertificates { client_tls: None, root_cert: settings.ca.clone() });
        }
        let client = builder.build().map_err(|e| format!("--fleet: {e}"))?;
        let (queue, writes) = mpsc::unbounded_channel();
        let started = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        let fleet = Arc::new_cyclic(|me| Fleet {
            client,
            connection: RwLock::new(None),
            reconnecting: AtomicBool::new(false),
            connections_made: AtomicU64::new(0),
            me: me.clone(),
            sealer: settings.sealer,
            timeout: settings.timeout,
            ttl: settings.ttl,
            clock_skew_s: settings.clock_skew.as_secs(),
            max_entry: settings.max_entry,
            queue,
            queued_bytes: AtomicUsize::new(0),
            queue_bytes: settings.queue_bytes,
            masters: Masters::default(),
            held: Mutex::new(HashMap::new()),
            instance: format!("{:x}-{started:x}", std::process::id()),
            tokens: AtomicU64::new(0),
            counters: FleetCounters::default(),
        });
        match tokio::time::timeout(FIRST_CONNECT, fleet.client.get_async_connection()).await {
            Ok(Ok(connection)) => {
                fleet.connected(connection);
            }
            Ok(Err(error)) if refused_login(&error) => {
                return Err(format!("--fleet: the cluster refused the login: {error}"));
            }
            Ok(Err(error)) => {
                eprintln!("rpcedge-cached: the fleet is not reachable yet ({error}); starting without it");
                fleet.reconnect();
            }
            Err(_) => {
                eprintln!("rpcedge-cached: the fleet did not answer within {FIRST_CONNECT:?}; starting without it");
                fleet.reconnect();
            }
        }
        tokio::spawn(fleet.clone().write_queued(writes));
        Ok(fleet)
    }

    /// Makes a new connection in the background (unless one is being made), which reads the
    /// cluster's slots anew from the seeds: at start, when the cluster could not be reached, and
    /// whenever a breaker opens. The client follows failovers on its own; a new connection
    /// also covers a cluster that came back whole on other nodes than the ones it knew, and reads
    /// again which master serves which slots.
    fn reconnect(&self) {
        let Some(fleet) = self.me.upgrade() else { return };
        if self.reconnecting.swap(true, Ordering::AcqRel) {
            return;
        }
        tokio::spawn(async move {
            loop {
                match fleet.client.get_async_connection().await {
                    Ok(connection) => {
                        fleet.connected(connection);
                        break;
                    }
                    Err(error) if refused_login(&error) => eprintln!("rpcedge-cached: the fleet refused the login: {error}"),
                    Err(_) => {}
                }
                tokio::time::sleep(RECONNECT_EVERY).await;
            }
            fleet.reconnecting.store(false, Ordering::Release);
        });
    }

    /// Takes a new connection into use, and reads on it which master serves which slots, for
    /// their breakers (`CLUSTER SLOTS`, on any node): in the background, again every
    /// `RECONNECT_EVERY` until a reading succeeds or a newer connection is made. Until then, what
    /// was known stands (at start: every key shares one breaker).
    fn connected(&self, connection: ClusterConnection) {
        *self.connection.write().unwrap_or_else(|e| e.into_inner()) = Some(connection.clone());
        let made = self.connections_made.fetch_add(1, Ordering::AcqRel) + 1;
        let Some(fleet) = self.me.upgrade() else { return };
        tokio::spawn(async move {
            while fleet.connections_made.load(Ordering::Acquire) == made {
                let mut asking = connection.clone();
                let mut slots = redis::cmd("CLUSTER");
                let asked = slots.arg("SLOTS").query_async::<Value>(&mut asking);
                if let Ok(Ok(reply)) = tokio::time::timeout(fleet.write_timeout(), asked).await {
                    if fleet.masters.learn(&reply) {
                        break;
                    }
                }
                tokio::time::sleep(RECONNECT_EVERY).await;
            }
        });
    }

    /// One round with the cluster about `key`, within `timeout`, unless the breaker of the master
    /// that serves it is open. An error the cluster answered about the keys (a value of another
    /// type that someone wrote there, a script's error, out of memory) is not the cluster failing:
    /// counted, but not by the breaker, so that nobody who can write to the cluster can turn the
    /// fleet off with a planted value.
    async fn round<T, F>(&self, key: &[u8; 32], timeout: Duration, ask: impl FnOnce(ClusterConnection) -> F) -> Option<T>
    where
        F: Future<Output = RedisResult<T>>,
    {
        let breaker = self.masters.breaker(&hash_tag(key));
        if !breaker.allows() {
            self.counters.skipped.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        let connection = self.connection.read().unwrap_or_else(|e| e.into_inner()).clone();
        let Some(connection) = connection else {
            if breaker.failed() {
                self.counters.breaker_opened.fetch_add(1, Ordering::Relaxed);
            }
            self.counters.errors.fetch_add(1, Ordering::Relaxed);
            return None;
        };
        let started = Instant::now();
        let counter = match tokio::time::timeout(timeout, ask(connection)).await {
            Ok(Ok(answer)) => {
                breaker.succeeded();
                let us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
                self.counters.round_trips.fetch_add(1, Ordering::Relaxed);
                self.counters.round_trip_us.fetch_add(us, Ordering::Relaxed);
                return Some(answer);
            }
            Ok(Err(error)) if answered_about_the_keys(&error) => {
                breaker.succeeded();
                self.counters.errors.fetch_add(1, Ordering::Relaxed);
                return None;
            }
            // the client's own response timeout (the fleet timeout) fires first: a timeout too
            Ok(Err(error)) if error.is_timeout() => &self.counters.timeouts,
            Ok(Err(_)) => &self.counters.errors,
            Err(_) => &self.counters.timeouts,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        if breaker.failed() {
            self.counters.breaker_opened.fetch_add(1, Ordering::Relaxed);
            self.reconnect();
        }
        None
    }

    /// The bound on a write's round: `WRITE_TIMEOUT`, or the fleet timeout where that is longer.
    fn write_timeout(&self) -> Duration {
        WRITE_TIMEOUT.max(self.timeout)
    }

    /// The longest value worth reading: a longer one was not written by a daemon of this fleet.
    fn read_bound(&self) -> usize {
        self.max_entry.saturating_add(OVERHEAD)
    }

    /// The entry the fleet holds for `key`.
    pub async fn get(&self, key: &[u8; 32]) -> Found {
        let name = name(key, "e");
        let bound = self.read_bound();
        let read = self.round(key, self.timeout, |mut connection| async move { read_value(&mut connection, &name, bound).await }).await;
        let Some((value, left_ms)) = read else { return Found::Unanswered };
        match self.open(Kind::Entry, key, &value, left_ms) {
            Some((entry, expires_s)) => {
                self.counters.hits.fetch_add(1, Ordering::Relaxed);
                Found::Entry(entry, expires_s)
            }
            None => {
                self.counters.misses.fetch_add(1, Ordering::Relaxed);
                Found::Miss
            }
        }
    }

    /// The entries of `keys`, at once: the cluster's client sends each node's reads together on
    /// its connection, without waiting for an answer between them (one round per node).
    pub async fn get_many(&self, keys: &[[u8; 32]]) -> Vec<Found> {
        futures_util::future::join_all(keys.iter().map(|key| self.get(key))).await
    }

    /// A value's entry and expiry (this host's clock), if it opens, has not expired and is not
    /// empty (absent); `left_ms`, what Redis said is left of its time to live.
    fn open(&self, kind: Kind, key: &[u8; 32], value: &[u8], left_ms: i64) -> Option<(Vec<u8>, Option<u64>)> {
        if value.is_empty() {
            return None;
        }
        let refused = match value.len() > self.read_bound() {
            true => Err(Refused::Format),
            false => self.sealer.open(kind, key, value),
        };
        match refused {
            Ok(opened) => match kept_until(opened.expires_s, left_ms, now_s(), self.clock_skew_s, self.ttl.as_secs()) {
                Some(expires_s) => Some((opened.entry.to_vec(), expires_s)),
                None => {
                    self.counters.expired.fetch_add(1, Ordering::Relaxed);
                    None
                }
            },
            Err(refused) => {
                self.counters.refused[refused as usize].fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }

    /// Queues `entry` (as the local store keeps it) to be written to the fleet: never waits,
    /// drops it (counted) when the queue is full or it is over `--fleet-max-entry`.
    pub fn offer(&self, key: [u8; 32], entry: Bytes, ttl_s: Option<u64>) {
        if entry.len() > self.max_entry {
            self.counters.too_large.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let len = entry.len();
        let queued = self.queued_bytes.fetch_add(len, Ordering::Relaxed);
        if queued + len > self.queue_bytes || self.queue.send(Write { key, entry, ttl_s }).is_err() {
            self.queued_bytes.fetch_sub(len, Ordering::Relaxed);
            self.counters.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    async fn write_queued(self: Arc<Self>, mut writes: mpsc::UnboundedReceiver<Write>) {
        let mut batch = Vec::with_capacity(WRITE_BATCH);
        while writes.recv_many(&mut batch, WRITE_BATCH).await > 0 {
            futures_util::future::join_all(batch.iter().map(|write| self.write(write))).await;
            let bytes = batch.drain(..).map(|write| write.entry.len()).sum();
            self.queued_bytes.fetch_sub(bytes, Ordering::Relaxed);
        }
    }

    async fn write(&self, write: &Write) {
        let Some((value, px)) = self.sealed_entry(&write.key, &write.entry, write.ttl_s) else { return };
        let (name, len) = (name(&write.key, "e"), value.len());
        let written = self
            .round(&write.key, self.write_timeout(), |mut connection| async move {
                redis::cmd("SET").arg(name).arg(value).arg("PX").arg(px).query_async::<()>(&mut connection).await
            })
            .await;
        if written.is_some() {
            self.counters.stores.fetch_add(1, Ordering::Relaxed);
            self.counters.stored_bytes.fetch_add(len as u64, Ordering::Relaxed);
        }
    }

    /// An entry sealed for the fleet, and how many milliseconds the fleet keeps it: its own TTL,
    /// within the fleet's. The fleet carries the entry's DEFLATE form alone, without the zstd and
    /// brotli forms the local store keeps: those more than doubled Redis's bytes per entry
    /// (loadtest/results/fleet.md), and a host that gets it answers a browser gzip as it does
    /// every client that takes gzip. None for what is not an entry (the store kept it checked).
    fn sealed_entry(&self, key: &[u8; 32], entry: &[u8], ttl_s: Option<u64>) -> Option<(Vec<u8>, u64)> {
        let carried = match Entry::decode(entry) {
            Ok(entry) => entry.without_forms(),
            Err(error) => {
                eprintln!("rpcedge-cached: not written to the fleet: {error}");
                return None;
            }
        };
        let fleet_ms = u64::try_from(self.ttl.as_millis()).unwrap_or(u64::MAX);
        let px = ttl_s.map_or(fleet_ms, |ttl_s| ttl_s.saturating_mul(1000).min(fleet_ms)).max(1);
        let expires_s = ttl_s.map(|ttl_s| now_s().saturating_add(ttl_s));
        Some((self.sealer.seal(Kind::Entry, key, expires_s, &carried), px))
    }

    /// A miss of `key` that will go to its node asks to hold the key across the fleet for `hold`.
    /// Holds `key` across the fleet for `hold`; `over_an_entry`: even where an entry is there
    /// (one this daemon could not open: the holder's settle replaces it).
    pub async fn hold(&self, key: &[u8; 32], hold: Duration, over_an_entry: bool) -> Hold {
        let token = format!("{}-{}", self.instance, self.tokens.fetch_add(1, Ordering::Relaxed));
        let (lock, answer_name, released, entry) = (name(key, "lock"), name(key, "a"), name(key, "r"), name(key, "e"));
        let ms = u64::try_from(hold.as_millis()).unwrap_or(u64::MAX).max(1);
        let set = token.clone();
        let answer = self
            .round(key, self.timeout, |mut connection| async move {
                redis::Script::new(HOLD)
                    .key(lock)
                    .key(answer_name)
                    .key(released)
                    .key(entry)
                    .arg(set)
                    .arg(ms)
                    .arg(if over_an_entry { "1" } else { "" })
                    .invoke_async::<i64>(&mut connection)
                    .await
            })
            .await;
        match answer {
            Some(1) => {
                self.counters.locks_held.fetch_add(1, Ordering::Relaxed);
                let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
                held.retain(|_, (_, until)| *until > Instant::now());
                held.insert(*key, (token, Instant::now() + hold));
                Hold::Held
            }
            Some(2) => Hold::Stored,
            Some(_) => {
                self.counters.locks_followed.fetch_add(1, Ordering::Relaxed);
                Hold::Taken
            }
            None => Hold::Unanswered,
        }
    }

    /// Whether this daemon holds `key` across the fleet.
    pub fn holds(&self, key: &[u8; 32]) -> bool {
        self.held.lock().unwrap_or_else(|e| e.into_inner()).contains_key(key)
    }

    /// Publishes how this daemon's hold of `key` ended (if it holds it) and frees the lock. An
    /// entry or answer over `--fleet-max-entry` is not published: as after a release, the
    /// waiters go to their node.
    pub async fn settle(&self, key: &[u8; 32], outcome: Outcome) {
        let Some((token, until)) = self.held.lock().unwrap_or_else(|e| e.into_inner()).remove(key) else { return };
        let ms = until.saturating_duration_since(Instant::now()).as_millis().max(1);
        // an entry the fleet may keep, for the write queue if the settle does not land
        let unsettled = match &outcome {
            Outcome::Stored(entry, ttl_s) if entry.len() <= self.max_entry => Some((entry.clone(), *ttl_s)),
            _ => None,
        };
        let (kind, value, px) = match outcome {
            Outcome::Stored(entry, _) | Outcome::Answered(entry) if entry.len() > self.max_entry => {
                self.counters.too_large.fetch_add(1, Ordering::Relaxed);
                ("e", Vec::new(), 0)
            }
            Outcome::Stored(entry, ttl_s) => match self.sealed_entry(key, &entry, ttl_s) {
                Some((value, px)) => ("e", value, px),
                None => ("e", Vec::new(), 0),
            },
            Outcome::Answered(entry) => {
                // sealed to expire with the lock: copied back later, it is refused, not served
                let ms = u64::try_from(ms).unwrap_or(u64::MAX);
                let expires_s = now_s().saturating_add(ms.div_ceil(1000) + 1);
                ("a", self.sealer.seal(Kind::Answer, key, Some(expires_s), &entry), ms)
            }
            Outcome::Released => ("e", Vec::new(), 0),
        };
        let stored = kind == "e" && !value.is_empty();
        let (lock, target, released) = (name(key, "lock"), name(key, kind), name(key, "r"));
        let settled = self
            .round(key, self.write_timeout(), |mut connection| async move {
                redis::Script::new(SETTLE)
                    .key(lock)
                    .key(target)
                    .key(released)
                    .arg(token)
                    .arg(value)
                    .arg(px)
                    .invoke_async::<i64>(&mut connection)
                    .await
            })
            .await;
        match (settled, unsettled) {
            (Some(_), _) if stored => {
                self.counters.stores.fetch_add(1, Ordering::Relaxed);
            }
            // the lock expires on its own; the entry goes the way every other entry does
            (None, Some((entry, ttl_s))) => self.offer(*key, entry, ttl_s),
            _ => {}
        }
    }

    /// What a follower of `key` finds: the holder's entry or answer, or the lock still held,
    /// released or expired, in one round (the four names share a slot). The lock is read first: a
    /// holder that settles during the round has then published what it had (or its release)
    /// before it let go. A lock without a time to live, or with more than any holder asks for, was
    /// not set by a daemon: nobody holds the key, as after a release.
    pub async fn poll(&self, key: &[u8; 32]) -> Polled {
        let (entry, answer, lock, released) = (name(key, "e"), name(key, "a"), name(key, "lock"), name(key, "r"));
        let bound = self.read_bound();
        let found = self
            .round(key, self.timeout, |mut connection| async move {
                redis::pipe()
                    .cmd("PTTL")
                    .arg(lock)
                    .cmd("GETRANGE")
                    .arg(&entry)
                    .arg(0)
                    .arg(bound)
                    .cmd("PTTL")
                    .arg(&entry)
                    .cmd("GETRANGE")
                    .arg(&answer)
                    .arg(0)
                    .arg(bound)
                    .cmd("PTTL")
                    .arg(&answer)
                    .cmd("EXISTS")
                    .arg(released)
                    .query_async::<(i64, Vec<u8>, i64, Vec<u8>, i64, i64)>(&mut connection)
                    .await
            })
            .await;
        let Some((lock_ms, entry, entry_left_ms, answer, answer_left_ms, released)) = found else {
            return Polled::Unanswered;
        };
        if let Some((entry, expires_s)) = self.open(Kind::Entry, key, &entry, entry_left_ms) {
            return Polled::Entry(entry, expires_s);
        }
        if let Some((answer, _)) = self.open(Kind::Answer, key, &answer, answer_left_ms) {
            return Polled::Answer(answer);
        }
        lock_state(lock_ms, released > 0)
    }

    /// Every counter and figure: (name, help, Prometheus type, value).
    pub fn figures(&self) -> Vec<(String, &'static str, &'static str, u64)> {
        let counters = &self.counters;
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        let breakers = self.masters.states();
        let open = breakers.iter().filter(|state| matches!(state, State::Open { .. })).count() as u64;
        let probing = breakers.iter().filter(|state| matches!(state, State::Probing { .. })).count() as u64;
        let worst = if open > 0 { 1 } else if probing > 0 { 2 } else { 0 };
        let mut out: Vec<(String, &'static str, &'static str, u64)> = vec![
            ("fleet_hits_total".into(), "Local misses answered from the fleet", "counter", load(&counters.hits)),
            ("fleet_misses_total".into(), "Local misses the fleet did not have either", "counter", load(&counters.misses)),
            ("fleet_expired_total".into(), "Fleet values past their entry's expiry", "counter", load(&counters.expired)),
            ("fleet_timeouts_total".into(), "Fleet rounds past --fleet-timeout", "counter", load(&counters.timeouts)),
            ("fleet_errors_total".into(), "Fleet rounds that failed (no connection yet, or an error about a key)", "counter", load(&counters.errors)),
            ("fleet_skipped_total".into(), "Fleet rounds not sent: their master's breaker was open", "counter", load(&counters.skipped)),
            ("fleet_breaker_state".into(), "The masters' breakers: 0 all closed, 1 at least one open, 2 one probing and none open", "gauge", worst),
            ("fleet_breakers_open".into(), "Breakers open or probing: the masters', and the unassigned slots' while some are", "gauge", open + probing),
            ("fleet_breaker_opened_total".into(), "Times a master's breaker opened", "counter", load(&counters.breaker_opened)),
            ("fleet_stores_total".into(), "Entries written to the fleet", "counter", load(&counters.stores)),
            ("fleet_stored_bytes_total".into(), "Bytes of values written to the fleet from the queue", "counter", load(&counters.stored_bytes)),
            ("fleet_too_large_total".into(), "Entries over --fleet-max-entry, kept local", "counter", load(&counters.too_large)),
            ("fleet_queue_dropped_total".into(), "Entries dropped: the fleet's write queue was full", "counter", load(&counters.dropped)),
            ("fleet_queue_bytes".into(), "Bytes of entries waiting to be written to the fleet", "gauge", self.queued_bytes.load(Ordering::Relaxed) as u64),
            ("fleet_locks_held_total".into(), "Misses that held their key across the fleet", "counter", load(&counters.locks_held)),
            ("fleet_locks_followed_total".into(), "Misses that waited for another host's holder", "counter", load(&counters.locks_followed)),
            ("fleet_round_trips_total".into(), "Fleet rounds answered", "counter", load(&counters.round_trips)),
            ("fleet_round_trip_microseconds_total".into(), "Time of the fleet rounds answered", "counter", load(&counters.round_trip_us)),
        ];
        for refused in Refused::ALL {
            let name = format!("fleet_refused_total{{reason=\"{}\"}}", refused.name());
            out.push((name, "Fleet values refused and never served, by reason", "counter", load(&counters.refused[refused as usize])));
        }
        for (outcome, counter) in WAIT_OUTCOMES.iter().zip(&counters.lock_waits) {
            let name = format!("fleet_lock_waits_total{{outcome=\"{outcome}\"}}");
            out.push((name, "Followed fleet locks, by how they ended", "counter", load(counter)));
        }
        out
    }
}

/// A followed lock, by its time to live (`PTTL`: -2 gone, -1 without one) and whether its release
/// is marked: held; released, or no daemon's; or gone (or at its last millisecond) without a
/// release, that is, out of time.
fn lock_state(lock_ms: i64, released: bool) -> Polled {
    match lock_ms {
        1.. if lock_ms.unsigned_abs() <= MAX_LOCK_MS => Polled::Held,
        -2 | 0 if !released => Polled::Expired,
        _ => Polled::Released,
    }
}

/// Whether the cluster refused the daemon's credentials (not: could not be reached). The cluster
/// client reports a refusal at its first connections inside its own error, by name.
fn refused_login(error: &redis::RedisError) -> bool {
    let text = error.to_string();
    error.kind() == ErrorKind::AuthenticationFailed
        || ["AuthenticationFailed", "WRONGPASS", "NOAUTH", "NOPERM"].iter().any(|code| text.contains(code))
}

/// Whether the cluster answered the round with an error about its keys or values, rather than
/// failing to answer: its own error reply (WRONGTYPE, a script's error, OOM), or a reply that is
/// not what the command gives (a value of another type).
fn answered_about_the_keys(error: &redis::RedisError) -> bool {
    use redis::ServerErrorKind;
    matches!(
        error.kind(),
        ErrorKind::Extension | ErrorKind::UnexpectedReturnType | ErrorKind::Parse | ErrorKind::Server(ServerErrorKind::ResponseError)
    )
}

/// A value, at most `bound` + 1 bytes of it (a longer one is refused without reading it all;
/// empty when absent), and what is left of its time to live (PTTL), in one round.
async fn read_value(connection: &mut ClusterConnection, name: &str, bound: usize) -> RedisResult<(Vec<u8>, i64)> {
    redis::pipe().cmd("GETRANGE").arg(name).arg(0).arg(bound).cmd("PTTL").arg(name).query_async(connection).await
}

/// Until when (this host's clock, in seconds) a value whose writer sealed it to expire at
/// `sealed_s` (its own clock; `None`: never) may be kept, or `None` if it has expired. What Redis
/// says is left of it (`left_ms`, PTTL) counts, Redis's clock being the one every host shares,
/// within `skew_s` past the seal; but a seal that leaves more than the fleet keeps anything
/// (`fleet_ttl_s`), beyond the skew, says Redis's time was the fleet's, cut short: the seal counts.
/// Gone since it was read (-2), or at its last millisecond: expired. No time to live (-1), which
/// no daemon writes: the seal's bound alone.
fn kept_until(sealed_s: Option<u64>, left_ms: i64, now_s: u64, skew_s: u64, fleet_ttl_s: u64) -> Option<Option<u64>> {
    let Some(sealed_s) = sealed_s else { return Some(None) };
    let latest = sealed_s.saturating_add(skew_s);
    let until = match u64::try_from(left_ms) {
        Ok(0) => return None,
        Ok(_) if sealed_s.saturating_sub(now_s) > fleet_ttl_s.saturating_add(skew_s) => sealed_s,
        Ok(ms) => now_s.saturating_add(ms.div_ceil(1000)).min(latest),
        Err(_) if left_ms == -1 => latest,
        Err(_) => return None,
    };
    (until > now_s).then_some(Some(until))
}

/// The hash tag of `key`'s names: its hex, which puts the four in one slot.
fn hash_tag(key: &[u8; 32]) -> [u8; 64] {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut tag = [0; 64];
    for (pair, byte) in tag.chunks_exact_mut(2).zip(key) {
        pair.copy_from_slice(&[HEX[usize::from(byte >> 4)], HEX[usize::from(byte & 15)]]);
    }
    tag
}

fn name(key: &[u8; 32], suffix: &str) -> String {
    let mut name = String::with_capacity(64 + 16);
    name.push_str("rpcedge:{");
    name.extend(hash_tag(key).iter().map(|&digit| char::from(digit)));
    name.push_str("}:");
    name.push_str(suffix);
    name
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_keys_breaker_is_chosen_by_the_slot_the_cluster_client_routes_its_names_to() {
        for key in [[0; 32], [0xa5; 32], *b"rpcedge: the slot of a key name."] {
            let slot = redis::cluster_routing::Slot::new(masters::slot(&hash_tag(&key)));
            assert_eq!(slot, Some(redis::cluster_routing::Slot::for_key(name(&key, "lock"))));
        }
    }

    #[test]
    fn a_value_is_kept_for_what_redis_says_is_left_within_the_skew_past_its_seal() {
        const NOW: u64 = 1_800_000_000;
        const SKEW: u64 = 300;
        const FLEET_TTL: u64 = 6 * 3600;
        let kept_until = |sealed, left_ms, now, skew| kept_until(sealed, left_ms, now, skew, FLEET_TTL);
        // its writer's clock 5 minutes behind (sealed 300 s ago by this clock, 20 s to live):
        // not refused, and kept for the 20 s left
        assert_eq!(kept_until(Some(NOW - 280), 20_000, NOW, SKEW), Some(Some(NOW + 20)));
        // its writer's clock 5 minutes ahead: kept for the 20 s left, not 5 minutes more
        assert_eq!(kept_until(Some(NOW + 320), 20_000, NOW, SKEW), Some(Some(NOW + 20)));
        // a Redis that says more is left than the seal allows gains the skew at most
        assert_eq!(kept_until(Some(NOW + 20), 86_400_000, NOW, SKEW), Some(Some(NOW + 20 + SKEW)));
        assert_eq!(kept_until(Some(NOW + 20), -1, NOW, SKEW), Some(Some(NOW + 20 + SKEW)));
        assert_eq!(kept_until(Some(NOW - SKEW), 86_400_000, NOW, SKEW), None, "past its seal by the skew");
        assert_eq!(kept_until(Some(NOW - 10), 20_000, NOW, 0), None, "no skew allowed");
        // gone since it was read, or at its last millisecond
        assert_eq!(kept_until(Some(NOW + 20), -2, NOW, SKEW), None);
        assert_eq!(kept_until(Some(NOW + 20), 0, NOW, SKEW), None);
        // a part of a second left is a second
        assert_eq!(kept_until(Some(NOW + 20), 1, NOW, SKEW), Some(Some(NOW + 1)));
        // sealed without an expiry: kept as final, whatever Redis's time to live
        assert_eq!(kept_until(None, 5_000, NOW, SKEW), Some(None));
        // an entry of a day, which the fleet keeps 6 h: kept as its seal says, not Redis's 6 h
        assert_eq!(kept_until(Some(NOW + 86_400), 21_600_000, NOW, SKEW), Some(Some(NOW + 86_400)));
        assert_eq!(kept_until(Some(NOW + 86_400), 60_000, NOW + 21_540, SKEW), Some(Some(NOW + 86_400)));
        // one of the fleet's own length: Redis's time
        assert_eq!(kept_until(Some(NOW + FLEET_TTL), 21_600_000, NOW, SKEW), Some(Some(NOW + FLEET_TTL)));
    }

    #[test]
    fn a_lock_gone_without_its_release_marked_ran_out_of_time() {
        let state = |lock_ms, released| match lock_state(lock_ms, released) {
            Polled::Held => "held",
            Polled::Released => "released",
            Polled::Expired => "expired",
            _ => unreachable!(),
        };
        assert_eq!(state(1, false), "held");
        assert_eq!(state(MAX_LOCK_MS as i64, true), "held");
        // gone: released only if its holder said so
        assert_eq!(state(-2, true), "released");
        assert_eq!(state(-2, false), "expired");
        assert_eq!(state(0, false), "expired", "at its last millisecond");
        // no daemon's lock (none sets one without a time, or longer): nobody holds the key
        assert_eq!(state(-1, false), "released");
        assert_eq!(state(MAX_LOCK_MS as i64 + 1, false), "released");
    }
}
