//! The store: RocksDB written without the WAL, in three column families flushed together.
//!
//! - `kept`: entries without expiry (what a block hash names, finalized data), as they are stored;
//! - `protected`: those of them asked for again while in `kept`, moved here (copied: the lookup
//!   reads `protected` first), so that a scan of keys asked once (an indexer walking history)
//!   passes through `kept` without pushing out what clients keep asking for: a segmented LRU's
//!   probation and protected segments, each first-in-first-out;
//! - `expiring`: entries with a TTL (chain properties), in their own family so that FIFO's `ttl`
//!   drops their files on time without ever dropping the others by age.
//!
//! All use FIFO compaction: every byte is written once (to a blob or an SST file; an entry asked
//! again, twice), and the oldest files go when a family reaches its share of `max_disk`. Without
//! the WAL, a crash loses the memtables; `atomic_flush` makes the families flush as one, so what
//! survives a crash is a prefix of the write order across them, never a later write without an
//! earlier one.
//! Each value carries its expiry and a CRC-32 of the whole record: RocksDB keeps an expired
//! entry readable until its file drops, and a torn or foreign value must read as a miss.
//!
//! A store RocksDB cannot open because its files are corrupt is set aside (renamed, the one set
//! aside before it removed) and the daemon starts on an empty one: it is a cache, and the proxies
//! would otherwise go without it until someone deleted it by hand.
//!
//! RocksDB stops writing on an I/O error (a full disk among them) and, without the WAL, does not
//! always start again once the disk has room (seen: a full file system freed, never written to
//! again). After a flush that failed so, the store is closed and opened again once its file system
//! has room for every memtable: what they held is lost (the close cannot flush it either), as in a
//! crash.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};

use rocksdb::statistics::Ticker;
use rpcedge_core::cache::Entry;
use rocksdb::{
    BlockBasedOptions, ColumnFamilyDescriptor, ErrorKind, DBCompactionStyle, DBCompressionType, FifoCompactOptions,
    FlushOptions, Options, WriteBatch, WriteOptions, DB,
};

const KEPT: &str = "kept";
const PROTECTED: &str = "protected";
const EXPIRING: &str = "expiring";
/// Every family, in the order a lookup reads them.
const FAMILIES: [&str; 3] = [PROTECTED, KEPT, EXPIRING];
/// Locks over the keys, each for the keys that hash to it: a promotion and a write of the same
/// key never interleave.
const KEY_LOCKS: usize = 64;
/// Record version, expiry (Unix seconds, 0: none) and CRC-32 over both and the entry.
const RECORD_HEAD: usize = 1 + 8 + 4;
const RECORD_VERSION: u8 = 1;
/// Values this large go to blob files: small-value gets then skip reading them.
const MIN_BLOB_SIZE: u64 = 16 * 1024;

#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// Bound on the files of every family (memtables come on top: 3 × `memtable_size`).
    pub max_disk: u64,
    /// The share of `max_disk` (per cent, of what `expiring` leaves) that `protected` may take;
    /// 0: none, every entry goes first in, first out.
    pub protected_percent: u8,
    /// The `expiring` family's files drop after this many seconds; longer TTLs are cut to it.
    pub max_ttl_s: u64,
    pub memtable_size: usize,
    pub wal: bool,
    pub atomic_flush: bool,
}

pub struct Store {
    path: PathBuf,
    settings: StoreOptions,
    key_locks: [Mutex<()>; KEY_LOCKS],
    key_hasher: RandomState,
    /// `None` once a stopped store is closed, until it opens again.
    open: RwLock<Option<Opened>>,
    pub counters: Counters,
}

/// RocksDB's handle, and the options it was opened with (they hold its statistics).
struct Opened {
    db: DB,
    options: Options,
}

/// What the store saw, for `/metrics` and `/v1/stats`.
#[derive(Default)]
pub struct Counters {
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    pub expired: AtomicU64,
    pub bad_entries: AtomicU64,
    pub stores: AtomicU64,
    pub stored_bytes: AtomicU64,
    pub deletes: AtomicU64,
    /// Entries asked for again while in `kept`, copied to `protected`.
    pub promotions: AtomicU64,
    pub flushes: AtomicU64,
    /// Times the store was opened again after it stopped on an I/O error.
    pub reopens: AtomicU64,
}

/// A failed flush: `stopped` when RocksDB stopped on an I/O error (a full disk), or the store is
/// closed, which opening it again may mend.
#[derive(Debug)]
pub struct FlushFailure {
    pub stopped: bool,
    reason: String,
}

impl std::fmt::Display for FlushFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.reason)
    }
}

const CLOSED: &str = "the store is closed: it stopped on an I/O error and has not opened again";

pub enum Lookup {
    /// The entry, and the seconds it has left (`None`: no expiry).
    Hit(Vec<u8>, Option<u64>),
    Absent,
    Expired,
    /// A value that failed its checksum; it has been deleted.
    Bad,
}

impl Store {
    pub fn open(path: &Path, settings: &StoreOptions) -> Result<Store, String> {
        let [(_, protected), (_, kept), _] = shares(settings);
        if protected > 1 && kept < 2 * settings.memtable_size as u64 {
            // a flush can then be all of kept's share: what it wrote goes straight after it
            eprintln!(
                "rpcedge-cached: kept's share of --max-disk ({kept} bytes, after --protected-share) is under two \
                 memtables (--memtable-size): new entries may go before anyone asks for them again"
            );
        }
        Ok(Store {
            path: path.to_owned(),
            settings: settings.clone(),
            key_locks: std::array::from_fn(|_| Mutex::new(())),
            key_hasher: RandomState::new(),
            open: RwLock::new(Some(Opened::new(path, settings)?)),
            counters: Counters::default(),
        })
    }

    /// After a flush that failed because the store stopped: closes it and opens it again if its
    /// file system has room for every memtable; else leaves it as it is (still read) and returns
    /// `false`. If it cannot be opened, every lookup and store fails until a later call opens it.
    pub fn reopen_when_room(&self) -> Result<bool, String> {
        let folder = self.path.parent().filter(|parent| !parent.as_os_str().is_empty()).unwrap_or(Path::new("."));
        let room = free_bytes(folder).map_err(|e| format!("{}: {e}", folder.display()))?;
        if room < FAMILIES.len() as u64 * self.settings.memtable_size as u64 {
            return Ok(false);
        }
        // Taken out under the lock, closed and opened outside it: lookups meanwhile fail at once
        // (a miss at every proxy) rather than wait. Closed first: RocksDB releases its LOCK file
        // only then.
        let stopped = self.open.write().unwrap_or_else(PoisonError::into_inner).take();
        drop(stopped);
        let opened = Opened::new(&self.path, &self.settings)?;
        *self.open.write().unwrap_or_else(PoisonError::into_inner) = Some(opened);
        self.counters.reopens.fetch_add(1, Ordering::Relaxed);
        Ok(true)
    }

    /// A proxy's lookup, counted as a hit, a miss or an expired entry. A hit in `kept` is asked
    /// for again: it is copied to `protected`.
    pub fn get(&self, key: &[u8], now_s: u64) -> Result<Lookup, String> {
        let (lookup, family) = self.with(|db| self.look_up(db, key, now_s))?;
        if let (Lookup::Hit(entry, None), KEPT, true) = (&lookup, family, self.settings.protected_percent > 0) {
            self.promote(key, entry);
        }
        let counter = match lookup {
            Lookup::Hit(..) => &self.counters.hits,
            Lookup::Absent => &self.counters.misses,
            Lookup::Expired => &self.counters.expired,
            Lookup::Bad => return Ok(lookup),
        };
        counter.fetch_add(1, Ordering::Relaxed);
        Ok(lookup)
    }

    /// Copies `entry`, read from `kept`, to `protected`, unless that would wait: for the key's
    /// lock (a write of it is under way: the next hit will do), or for RocksDB (a write stall:
    /// lookups run on the daemon's async threads). Under the lock `kept` still holds the same
    /// record, so that a delete or a newer store of the key made since the read is never undone.
    /// A promotion that fails (a full disk) leaves the hit answered all the same.
    fn promote(&self, key: &[u8], entry: &[u8]) {
        let Ok(_locked) = self.key_lock(key).try_lock() else {
            return;
        };
        let record = record(0, entry);
        let promoted = self.with(|db| {
            let kept = db.cf_handle(KEPT).expect("opened with it");
            if db.get_pinned_cf(&kept, key).map_err(|e| e.to_string())?.as_deref() != Some(&record[..]) {
                return Ok(false);
            }
            let mut write = self.write_options();
            write.set_no_slowdown(true);
            let protected = db.cf_handle(PROTECTED).expect("opened with it");
            db.put_cf_opt(&protected, key, &record, &write).map_err(|e| e.to_string())?;
            Ok(true)
        });
        if promoted == Ok(true) {
            self.counters.promotions.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The lock of the keys that hash as `key` does.
    fn key_lock(&self, key: &[u8]) -> &Mutex<()> {
        &self.key_locks[self.key_hasher.hash_one(key) as usize % KEY_LOCKS]
    }

    /// The entry under `key`, uncounted unless it is bad (the daemon's own reads: a receipt that
    /// places a transaction).
    pub fn read(&self, key: &[u8], now_s: u64) -> Result<Lookup, String> {
        self.with(|db| self.look_up(db, key, now_s)).map(|(lookup, _)| lookup)
    }

    /// The entry under `key`, and the family it was found in.
    fn look_up(&self, db: &DB, key: &[u8], now_s: u64) -> Result<(Lookup, &'static str), String> {
        for name in FAMILIES {
            let family = db.cf_handle(name).expect("opened with it");
            let record = match db.get_pinned_cf(&family, key) {
                Ok(Some(record)) => Some(record),
                Ok(None) => continue,
                // A damaged block or blob file: RocksDB's own checksum caught it.
                Err(error) if error.kind() == ErrorKind::Corruption => None,
                Err(error) => return Err(error.to_string()),
            };
            // an intact record whose entry this version cannot read (one of an older format,
            // kept before an upgrade) goes as a damaged one does: the node's answer replaces it
            let opened = record.as_deref().and_then(open_record).filter(|(_, entry)| Entry::decode(entry).is_ok());
            let Some((expires_s, entry)) = opened else {
                // `kept`'s copy too, if this was `protected`'s: the node's answer replaces it
                self.delete_every_copy(db, key)?;
                self.counters.bad_entries.fetch_add(1, Ordering::Relaxed);
                return Ok((Lookup::Bad, name));
            };
            if expires_s != 0 && expires_s <= now_s {
                return Ok((Lookup::Expired, name));
            }
            let left_s = (expires_s != 0).then(|| expires_s - now_s);
            return Ok((Lookup::Hit(entry.to_vec(), left_s), name));
        }
        Ok((Lookup::Absent, KEPT))
    }

    /// Stores `entry` (the core's stored form); with a TTL in the `expiring` family. An entry
    /// stored again in `kept` takes the place of its copy in `protected`, which a lookup would
    /// read first.
    pub fn put(&self, key: &[u8], entry: &[u8], ttl_s: Option<u64>, now_s: u64) -> Result<(), String> {
        let (name, expires_s) = match ttl_s {
            None => (KEPT, 0),
            Some(ttl) => (EXPIRING, now_s + ttl.clamp(1, self.settings.max_ttl_s)),
        };
        let record = record(expires_s, entry);
        let _locked = self.key_lock(key).lock().unwrap_or_else(PoisonError::into_inner);
        self.with(|db| {
            let mut batch = WriteBatch::default();
            batch.put_cf(&db.cf_handle(name).expect("opened with it"), key, &record);
            let protected = db.cf_handle(PROTECTED).expect("opened with it");
            // the bloom filter answers for nearly every key, which was never asked for again
            if name == KEPT && db.key_may_exist_cf(&protected, key) {
                batch.delete_cf(&protected, key);
            }
            db.write_opt(batch, &self.write_options()).map_err(|e| e.to_string())
        })?;
        self.counters.stores.fetch_add(1, Ordering::Relaxed);
        self.counters.stored_bytes.fetch_add(record.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    pub fn delete(&self, key: &[u8]) -> Result<(), String> {
        let _locked = self.key_lock(key).lock().unwrap_or_else(PoisonError::into_inner);
        self.with(|db| self.delete_every_copy(db, key))?;
        self.counters.deletes.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Deletes `key` from every family, at once.
    fn delete_every_copy(&self, db: &DB, key: &[u8]) -> Result<(), String> {
        let mut batch = WriteBatch::default();
        for name in FAMILIES {
            batch.delete_cf(&db.cf_handle(name).expect("opened with it"), key);
        }
        db.write_opt(batch, &self.write_options()).map_err(|e| e.to_string())
    }

    /// Writes every memtable out (as one, with `atomic_flush`) and waits for it.
    pub fn flush(&self) -> Result<(), FlushFailure> {
        let open = self.open.read().unwrap_or_else(PoisonError::into_inner);
        let db = &open.as_ref().ok_or(FlushFailure { stopped: true, reason: CLOSED.into() })?.db;
        let families: Vec<_> = FAMILIES.iter().map(|name| db.cf_handle(name).expect("opened with it")).collect();
        let mut flush = FlushOptions::default();
        flush.set_wait(true);
        db.flush_cfs_opt(&families.iter().collect::<Vec<_>>(), &flush)
            .map_err(|e| FlushFailure { stopped: e.kind() == ErrorKind::IOError, reason: e.to_string() })?;
        self.counters.flushes.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// RocksDB's own figures: (metric name, help, value); none while the store is closed.
    pub fn figures(&self) -> Vec<(&'static str, &'static str, u64)> {
        let open = self.open.read().unwrap_or_else(PoisonError::into_inner);
        let Some(Opened { db, options }) = open.as_ref() else {
            return Vec::new();
        };
        let property = |name: &str| {
            FAMILIES
                .iter()
                .filter_map(|family| db.cf_handle(family))
                .filter_map(|family| db.property_int_value_cf(&family, name).ok().flatten())
                .sum::<u64>()
        };
        let ticker = |ticker| options.get_ticker_count(ticker);
        vec![
            ("rocksdb_sst_bytes", "Bytes in SST files", property("rocksdb.live-sst-files-size")),
            ("rocksdb_blob_bytes", "Bytes in blob files", property("rocksdb.live-blob-file-size")),
            ("rocksdb_memtable_bytes", "Bytes in memtables", property("rocksdb.cur-size-all-mem-tables")),
            ("rocksdb_estimated_keys", "Estimated number of keys", property("rocksdb.estimate-num-keys")),
            ("rocksdb_flush_bytes_total", "Bytes written by flushes", ticker(Ticker::FlushWriteBytes)),
            ("rocksdb_compaction_read_bytes_total", "Bytes read by compactions", ticker(Ticker::CompactReadBytes)),
            ("rocksdb_compaction_write_bytes_total", "Bytes written by compactions", ticker(Ticker::CompactWriteBytes)),
            ("rocksdb_wal_bytes_total", "Bytes written to the WAL", ticker(Ticker::WalFileBytes)),
            ("rocksdb_blob_write_bytes_total", "Bytes written to blob files", ticker(Ticker::BlobDbBlobFileBytesWritten)),
        ]
    }

    /// `use_it` on RocksDB's handle, or an error while the store is closed.
    fn with<T>(&self, use_it: impl FnOnce(&DB) -> Result<T, String>) -> Result<T, String> {
        let open = self.open.read().unwrap_or_else(PoisonError::into_inner);
        let opened = open.as_ref().ok_or(CLOSED)?;
        use_it(&opened.db)
    }

    fn write_options(&self) -> WriteOptions {
        let mut write = WriteOptions::default();
        write.disable_wal(!self.settings.wal);
        write
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        // A clean stop keeps everything: memtables are not in any WAL.
        if let Err(error) = self.flush() {
            eprintln!("rpcedge-cached: the last flush failed: {error}");
        }
    }
}

impl Opened {
    fn new(path: &Path, settings: &StoreOptions) -> Result<Opened, String> {
        let mut options = Options::default();
        options.create_if_missing(true);
        options.create_missing_column_families(true);
        options.set_atomic_flush(settings.atomic_flush);
        options.enable_statistics();
        options.set_max_background_jobs(2);
        let shares = shares(settings);
        let families = || {
            shares.map(|(name, share)| {
                let ttl_s = if name == EXPIRING { settings.max_ttl_s } else { 0 };
                ColumnFamilyDescriptor::new(name, family_options(settings, share, ttl_s))
            })
        };
        let db = match DB::open_cf_descriptors(&options, path, families()) {
            Err(error) if error.kind() == ErrorKind::Corruption => {
                let aside = set_aside(path)?;
                eprintln!(
                    "rpcedge-cached: the store at {} is corrupt ({error}); set aside as {}, starting on an empty one",
                    path.display(),
                    aside.display()
                );
                DB::open_cf_descriptors(&options, path, families())
            }
            opened => opened,
        }
        .map_err(|e| format!("cannot open the store at {}: {e}", path.display()))?;
        for (name, share) in shares {
            // The C API sets only `max_table_files_size`, which leaves blob files out of the bound.
            let family = db.cf_handle(name).expect("opened with it");
            let fifo = format!("{{max_table_files_size={share};max_data_files_size={share};allow_compaction=false}}");
            db.set_options_cf(&family, &[("compaction_options_fifo", fifo.as_str())])
                .map_err(|e| format!("cannot bound the {name} family: {e}"))?;
        }
        Ok(Opened { db, options })
    }
}

/// Each family's share of `max_disk`: `expiring` 1/16, `protected` its per cent of the rest,
/// `kept` what is left (at least a byte each: FIFO takes no bound of 0).
fn shares(settings: &StoreOptions) -> [(&'static str, u64); 3] {
    let expiring = (settings.max_disk / 16).max(1);
    let rest = settings.max_disk.saturating_sub(expiring);
    let protected = rest / 100 * u64::from(settings.protected_percent.min(100));
    [(PROTECTED, protected.max(1)), (KEPT, rest.saturating_sub(protected).max(1)), (EXPIRING, expiring)]
}

fn family_options(settings: &StoreOptions, share: u64, ttl_s: u64) -> Options {
    let mut options = Options::default();
    options.set_compaction_style(DBCompactionStyle::Fifo);
    let mut fifo = FifoCompactOptions::default();
    fifo.set_max_table_files_size(share);
    options.set_fifo_compaction_options(&fifo);
    if ttl_s > 0 {
        options.set_ttl(ttl_s);
    }
    // Values arrive deflated already.
    options.set_compression_type(DBCompressionType::None);
    options.set_write_buffer_size(settings.memtable_size);
    options.set_enable_blob_files(true);
    options.set_min_blob_size(MIN_BLOB_SIZE);
    options.set_blob_compression_type(DBCompressionType::None);
    let mut table = BlockBasedOptions::default();
    table.set_bloom_filter(10.0, false);
    options.set_block_based_table_factory(&table);
    options
}

fn record(expires_s: u64, entry: &[u8]) -> Vec<u8> {
    let mut record = Vec::with_capacity(RECORD_HEAD + entry.len());
    record.push(RECORD_VERSION);
    record.extend_from_slice(&expires_s.to_le_bytes());
    let mut crc = crc32fast::Hasher::new();
    crc.update(&record);
    crc.update(entry);
    record.extend_from_slice(&crc.finalize().to_le_bytes());
    record.extend_from_slice(entry);
    record
}

/// The expiry and the entry of a record that passes its checksum.
fn open_record(record: &[u8]) -> Option<(u64, &[u8])> {
    if record.len() < RECORD_HEAD || record[0] != RECORD_VERSION {
        return None;
    }
    let (head, entry) = record.split_at(RECORD_HEAD);
    let mut crc = crc32fast::Hasher::new();
    crc.update(&head[..9]);
    crc.update(entry);
    let expected = u32::from_le_bytes(head[9..13].try_into().expect("4 bytes"));
    (crc.finalize() == expected).then(|| (u64::from_le_bytes(head[1..9].try_into().expect("8 bytes")), entry))
}

/// The bytes an unprivileged process may still write on the file system that holds `path`.
/// (libc is already here, for umask; statvfs is one call.)
fn free_bytes(path: &Path) -> std::io::Result<u64> {
    let path = CString::new(path.as_os_str().as_bytes())?;
    // SAFETY: all-zero bytes are a valid statvfs, which the call fills.
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a statvfs to write to, both alive for the call.
    if unsafe { libc::statvfs(path.as_ptr(), &mut stat) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // the field types differ between targets
    #[allow(clippy::useless_conversion)]
    Ok(u64::from(stat.f_bavail).saturating_mul(u64::from(stat.f_frsize)))
}

/// Renames the store at `path` to `<path>.corrupt-<Unix seconds>`, then removes any store set
/// aside before it (only folders of that name), so that a disk that keeps corrupting keeps at
/// most one copy, and a failed rename loses none.
fn set_aside(path: &Path) -> Result<PathBuf, String> {
    let name = path.file_name().and_then(|name| name.to_str()).ok_or_else(|| format!("{}: no name", path.display()))?;
    let prefix = format!("{name}.corrupt-");
    let parent = path.parent().filter(|parent| !parent.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let seconds = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |since| since.as_secs());
    let aside = parent.join(format!("{prefix}{seconds}"));
    if aside.exists() {
        // set aside in the same second: the newer copy is the one to keep
        std::fs::remove_dir_all(&aside).map_err(|e| format!("{}: {e}", aside.display()))?;
    }
    std::fs::rename(path, &aside).map_err(|e| format!("cannot set the corrupt store aside as {}: {e}", aside.display()))?;
    let earlier = std::fs::read_dir(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
    for earlier in earlier.flatten() {
        let is_earlier = earlier.file_name().to_string_lossy().starts_with(&prefix) && earlier.path() != aside;
        if is_earlier && earlier.file_type().is_ok_and(|kind| kind.is_dir()) {
            std::fs::remove_dir_all(earlier.path()).map_err(|e| format!("{}: {e}", earlier.path().display()))?;
        }
    }
    Ok(aside)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small_store() -> StoreOptions {
        StoreOptions {
            max_disk: 64 << 20,
            protected_percent: 80,
            max_ttl_s: 3600,
            memtable_size: 1 << 20,
            wal: false,
            atomic_flush: true,
        }
    }

    #[test]
    fn a_record_opens_only_intact() {
        let record = record(42, b"entry bytes");
        assert_eq!(open_record(&record), Some((42, &b"entry bytes"[..])));
        for at in 0..record.len() {
            let mut damaged = record.clone();
            damaged[at] ^= 1;
            assert_eq!(open_record(&damaged), None, "a flip at {at}");
        }
        assert_eq!(open_record(&record[..record.len() - 1]), None);
        assert_eq!(open_record(&record[..5]), None);
    }

    /// An upgrade leaves entries of the older format on disk: each reads as bad, once, and is
    /// gone, so that the node's answer takes its place (a hit of it would be an error at every
    /// proxy, and nothing would ever replace it).
    #[test]
    fn an_entry_this_version_cannot_read_is_bad_and_deleted() {
        let dir = std::env::temp_dir().join(format!("rpcedge-store-test-{}", std::process::id()));
        let options = small_store();
        let store = Store::open(&dir, &options).unwrap();
        let entry = rpcedge_core::cache::encode(&Default::default(), &Default::default(), b"\"0x1\"}");
        let mut older = entry.clone();
        older[0] = 2;
        store.put(b"now", &entry, None, 0).unwrap();
        store.put(b"older", &older, None, 0).unwrap();
        assert!(matches!(store.get(b"now", 0), Ok(Lookup::Hit(..))));
        assert!(matches!(store.get(b"older", 0), Ok(Lookup::Bad)));
        assert!(matches!(store.get(b"older", 0), Ok(Lookup::Absent)), "deleted");
        drop(store);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Opening the store again (as after a full disk) keeps what was flushed, and what its close
    /// could still flush, and leaves it serving and storing.
    #[test]
    fn a_store_opened_again_keeps_what_was_flushed_and_stores_on() {
        let dir = std::env::temp_dir().join(format!("rpcedge-reopen-test-{}", std::process::id()));
        let options = small_store();
        let store = Store::open(&dir, &options).unwrap();
        let entry = rpcedge_core::cache::encode(&Default::default(), &Default::default(), b"\"0x1\"}");
        store.put(b"flushed", &entry, None, 0).unwrap();
        store.flush().unwrap();
        store.put(b"in memory", &entry, None, 0).unwrap();
        assert!(store.reopen_when_room().unwrap(), "a temporary folder has room for 2 MiB");
        assert!(matches!(store.get(b"flushed", 0), Ok(Lookup::Hit(..))));
        assert!(matches!(store.get(b"in memory", 0), Ok(Lookup::Hit(..))), "flushed as it closed");
        store.put(b"after", &entry, None, 0).unwrap();
        assert!(matches!(store.get(b"after", 0), Ok(Lookup::Hit(..))));
        assert_eq!(store.counters.reopens.load(Ordering::Relaxed), 1);
        drop(store);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// The bytes of the store's files, once RocksDB has dropped what is past `max_disk` (it does
    /// so behind each flush).
    fn files_within_bound(store: &Store) -> u64 {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            let figures = store.figures();
            let figure = |wanted| figures.iter().find(|(name, ..)| *name == wanted).map_or(0, |(.., value)| *value);
            let files = figure("rocksdb_sst_bytes") + figure("rocksdb_blob_bytes");
            if files <= store.settings.max_disk || std::time::Instant::now() > deadline {
                return files;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    /// A scan of keys asked for once, four times the store's size, passes through `kept`: the
    /// entries asked for again stay, where first-in-first-out (`protected_percent` 0) loses every
    /// one; the files stay within `max_disk` either way.
    #[test]
    fn a_scan_four_times_the_store_keeps_what_was_asked_for_again_within_the_bound() {
        let body = format!("\"{}\"}}", "a".repeat(4000));
        let entry = rpcedge_core::cache::encode(&Default::default(), &Default::default(), body.as_bytes());
        for (protected_percent, kept) in [(80, 50), (0, 0)] {
            let dir = std::env::temp_dir().join(format!("rpcedge-scan-test-{}-{protected_percent}", std::process::id()));
            let options = StoreOptions { max_disk: 8 << 20, protected_percent, memtable_size: 256 << 10, ..small_store() };
            let store = Store::open(&dir, &options).unwrap();
            let hot: Vec<_> = (0..50u32).map(|n| format!("hot {n}").into_bytes()).collect();
            for key in &hot {
                store.put(key, &entry, None, 0).unwrap();
                assert!(matches!(store.get(key, 0), Ok(Lookup::Hit(..))));
            }
            let scanned = 4 * options.max_disk / entry.len() as u64;
            for n in 0..scanned {
                store.put(format!("cold {n}").as_bytes(), &entry, None, 0).unwrap();
            }
            store.flush().unwrap();
            let files = files_within_bound(&store);
            assert!(files <= options.max_disk, "{files} bytes of files, past {}", options.max_disk);
            let hits = hot.iter().filter(|key| matches!(store.get(key, 0), Ok(Lookup::Hit(..)))).count();
            assert_eq!(hits, kept, "protected_percent {protected_percent}: hot keys left after the scan");
            assert_eq!(store.counters.promotions.load(Ordering::Relaxed), kept as u64);
            drop(store);
            std::fs::remove_dir_all(&dir).unwrap();
        }
    }

    /// A promotion of what a lookup read, made after the key was deleted or stored anew, brings
    /// back neither the deleted entry nor the older one.
    #[test]
    fn a_promotion_never_undoes_a_delete_or_a_newer_store() {
        let dir = std::env::temp_dir().join(format!("rpcedge-promotion-test-{}", std::process::id()));
        let store = Store::open(&dir, &small_store()).unwrap();
        let older = rpcedge_core::cache::encode(&Default::default(), &Default::default(), b"\"0x1\"}");
        let newer = rpcedge_core::cache::encode(&Default::default(), &Default::default(), b"\"0x2\"}");
        store.put(b"deleted", &older, None, 0).unwrap();
        store.delete(b"deleted").unwrap();
        store.promote(b"deleted", &older);
        assert!(matches!(store.get(b"deleted", 0), Ok(Lookup::Absent)));
        store.put(b"stored anew", &older, None, 0).unwrap();
        store.put(b"stored anew", &newer, None, 0).unwrap();
        store.promote(b"stored anew", &older);
        assert!(matches!(store.get(b"stored anew", 0), Ok(Lookup::Hit(entry, None)) if entry == newer));
        assert_eq!(store.counters.promotions.load(Ordering::Relaxed), 1, "the newer one, on the hit above");
        drop(store);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Files RocksDB cannot open (their ends, where the footer and properties are, overwritten):
    /// the store is set aside, once, and the daemon starts on an empty one.
    #[test]
    fn a_store_whose_files_are_corrupt_is_set_aside_and_an_empty_one_opened() {
        let parent = std::env::temp_dir().join(format!("rpcedge-corrupt-test-{}", std::process::id()));
        let dir = parent.join("db");
        let options = small_store();
        let entry = rpcedge_core::cache::encode(&Default::default(), &Default::default(), b"\"0x1\"}");
        for round in 0..2 {
            let store = Store::open(&dir, &options).unwrap();
            store.put(b"key", &entry, None, 0).unwrap();
            store.flush().unwrap();
            drop(store);
            for file in std::fs::read_dir(&dir).unwrap().flatten().filter(|f| f.path().extension().is_some_and(|e| e == "sst")) {
                let mut bytes = std::fs::read(file.path()).unwrap();
                let end = bytes.len();
                bytes[end - 512..].fill(0x5a);
                std::fs::write(file.path(), bytes).unwrap();
            }
            let store = Store::open(&dir, &options).unwrap_or_else(|e| panic!("round {round}: {e}"));
            assert!(matches!(store.get(b"key", 0), Ok(Lookup::Absent)), "round {round}: an empty store");
            let aside: Vec<_> = std::fs::read_dir(&parent).unwrap().flatten().map(|e| e.file_name()).collect();
            assert_eq!(aside.len(), 2, "round {round}: the store and one set aside: {aside:?}");
            drop(store);
        }
        std::fs::remove_dir_all(&parent).unwrap();
    }
}
