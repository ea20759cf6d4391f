//! The on-disk tier of the chunk cache: computed chunks kept in a local directory, so work
//! survives restarts and is shared by every mount (and `warm`, `materialize`) that uses the
//! same directory. Memory ([`super::memory::ChunkCache`]) stays the first tier; this module
//! knows nothing of views: it stores opaque bytes under opaque 32-byte keys
//! ([`DiskKey`], built with [`KeyBuilder`] from everything the bytes depend on).
//!
//! What it guarantees, and how:
//! - **Never a wrong byte.** Each entry is `header (64 bytes) + payload`; the header holds
//!   a magic with the format version, the key, the payload length and an XXH3-128 checksum
//!   of key, length and payload, verified on every read. An entry that is short, long,
//!   under another key or whose checksum disagrees is logged, deleted and reported as a
//!   miss. Entries are written under `tmp/` and renamed into place, so a process killed
//!   mid-write leaves a temporary file (never read, removed later), not an entry. Entries
//!   are not fsynced (optional): a power loss can leave a renamed entry with missing data,
//!   which the checksum then rejects.
//! - **Bounded.** The total size of entries (header included) is kept under a byte
//!   budget (plus, for a moment, the entries other writers are renaming in). A shared counter (`usage`, 8 bytes under `flock`) is raised before each write;
//!   a writer that finds it over the budget evicts, under an exclusive `flock` of
//!   `evict.lock` (so one process at a time), the least recently used entries (mtime,
//!   refreshed on hits at most once per `touch_interval`) down to `low_water` of the
//!   budget, recounting the directory as it goes, which also repairs any drift of the
//!   counter. Readers take no lock: an entry evicted while being read is still read whole
//!   (the open descriptor keeps it), or is a miss.
//! - **Never an error.** A directory that cannot be created or read makes the cache
//!   disabled; one that cannot be written makes it read-only; a full filesystem pauses
//!   writes for a while. Each is a warning; callers see misses and skipped writes.
//!
//! Besides chunk entries it keeps whole files of a view ("file entries", [`files`]): the
//! file's bytes as they are, so the kernel can serve them (FUSE passthrough), with a seal
//! beside them; same budget, same LRU.
//!
//! Layout of the directory: `entries/<2 hex>/<64 hex>` (256 shards), `files/<2 hex>/<64 hex>`
//! and `.seal` beside it, `tmp/`, `usage`, `evict.lock`. Several processes may share it
//! (each temporary file is `flock`ed by its writer, so stale ones, of writers that died, are
//! recognised and removed).

use std::fs::{self, File, OpenOptions};
use std::io::{self, ErrorKind};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use parking_lot::Mutex;
use sha2::{Digest, Sha256};
use twox_hash::XxHash3_128;

mod files;
pub use files::{seal_len, FileLookup};

/// Entry format: magic (with the format version), key, payload length, checksum.
const MAGIC: [u8; 8] = *b"XPKFSDC1";
pub const HEADER_BYTES: u64 = 64;
/// Largest payload accepted (a length read from an entry is capped by this before allocating).
pub const MAX_ENTRY_BYTES: u64 = 1 << 30;
/// Bytes read (and hashed) at a time, so the checksum runs over data still in the CPU cache.
const READ_PIECE: usize = 256 << 10;
/// Writes are paused this long after the filesystem reported it is full.
const FULL_PAUSE: Duration = Duration::from_secs(30);
/// The same warning is logged at most this often.
const WARN_EVERY: Duration = Duration::from_secs(60);

/// A cache key: a digest of everything an entry's bytes depend on.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DiskKey(pub [u8; 32]);

impl DiskKey {
    pub fn hex(&self) -> String {
        hex::encode(self.0)
    }
}

impl std::fmt::Debug for DiskKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DiskKey({})", self.hex())
    }
}

/// Builds keys from labelled fields (each label and value length-prefixed, so no two
/// different field lists hash alike). Start from the view name; add the source's content
/// identity, the view parameters, what a chunk producer reads; then either
/// [`KeyBuilder::finish`] or [`KeyBuilder::producer`] for per-chunk keys.
#[derive(Clone)]
pub struct KeyBuilder(Sha256);

impl KeyBuilder {
    /// A key for `view`, already covering the entry format and [`crate::codec::REVISION`]
    /// (bumped whenever any codec's output or a view's chunking could change: entries of an
    /// older revision then never match again and age out by LRU).
    pub fn new(view: &str) -> Self {
        let mut b = KeyBuilder(Sha256::new());
        b.0.update(MAGIC);
        b.0.update(crate::codec::REVISION.to_le_bytes());
        b.field("view", view)
    }

    pub fn field(mut self, label: &str, value: impl AsRef<[u8]>) -> Self {
        let value = value.as_ref();
        self.0.update((label.len() as u64).to_le_bytes());
        self.0.update(label.as_bytes());
        self.0.update((value.len() as u64).to_le_bytes());
        self.0.update(value);
        self
    }

    pub fn u64(self, label: &str, value: u64) -> Self {
        self.field(label, value.to_le_bytes())
    }

    pub fn finish(self) -> DiskKey {
        DiskKey(self.0.finalize().into())
    }

    /// The base key of one chunk producer; [`ProducerKey::chunk`] derives each chunk's key.
    pub fn producer(self) -> ProducerKey {
        ProducerKey(self.finish().0)
    }
}

/// The identity of each source file as keys hold it (path, inode, size, mtime and ctime,
/// not the device number: the digest store's rule, [`crate::digest::identity_key`]), so an
/// entry computed from a file that has changed since is never found. Computed once per
/// build, then added to each producer's key.
pub fn source_file_keys(files: &[Arc<crate::source::SourceFile>]) -> Vec<String> {
    files.iter().map(source_file_key).collect()
}

/// The identity of one source file as keys hold it (see [`source_file_keys`]).
pub fn source_file_key(file: &Arc<crate::source::SourceFile>) -> String {
    crate::digest::identity_key("", &crate::digest::records_of(std::slice::from_ref(file)))
}

/// Base key of a chunk producer (one tensor's chunks, ...), fixed at view build time.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct ProducerKey(pub [u8; 32]);

impl ProducerKey {
    pub fn chunk(&self, id: u64) -> DiskKey {
        let mut h = Sha256::new();
        h.update(self.0);
        h.update(b"chunk");
        h.update(id.to_le_bytes());
        DiskKey(h.finalize().into())
    }

    /// The key of a job that computes several of this producer's chunks at once.
    pub fn group(&self) -> DiskKey {
        let mut h = Sha256::new();
        h.update(self.0);
        h.update(b"group");
        DiskKey(h.finalize().into())
    }
}

impl std::fmt::Debug for ProducerKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ProducerKey({})", hex::encode(self.0))
    }
}

#[derive(Debug, Clone)]
pub struct DiskCacheConfig {
    pub dir: PathBuf,
    /// Total bytes of entries (headers included) kept at most.
    pub budget_bytes: u64,
    /// Eviction brings the total down to this fraction of the budget, so it runs rarely.
    pub low_water: f64,
    /// A hit refreshes the entry's last-use time (mtime) at most this often.
    pub touch_interval: Duration,
    /// fsync each entry before renaming it (off by default: see the module documentation).
    pub fsync: bool,
}

impl DiskCacheConfig {
    pub fn new(dir: impl Into<PathBuf>, budget_bytes: u64) -> Self {
        DiskCacheConfig { dir: dir.into(), budget_bytes, low_water: 0.9, touch_interval: Duration::from_secs(60), fsync: false }
    }
}

/// What the cache can do now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Mode {
    ReadWrite = 0,
    /// Entries are served; nothing is written, touched or evicted.
    ReadOnly = 1,
    /// Nothing is read or written (the directory is unusable).
    Disabled = 2,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::ReadWrite => "read-write",
            Mode::ReadOnly => "read-only",
            Mode::Disabled => "disabled",
        }
    }
}

#[derive(Debug, Default)]
pub struct DiskStats {
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    pub bytes_read: AtomicU64,
    pub writes: AtomicU64,
    pub bytes_written: AtomicU64,
    /// Writes not done: disabled, read-only, paused, too large, or already present.
    pub skipped_writes: AtomicU64,
    pub write_errors: AtomicU64,
    pub evictions: AtomicU64,
    pub evicted_bytes: AtomicU64,
    /// Entries found wrong (torn, truncated, corrupted) and deleted.
    pub corrupt: AtomicU64,
    /// Temporary files of writers that died, removed.
    pub stale_temps: AtomicU64,
    /// File entries ([`files`]) found sound and handed out, found absent, found changed and
    /// checked good block by block, and written.
    pub file_hits: AtomicU64,
    pub file_misses: AtomicU64,
    pub file_rechecks: AtomicU64,
    pub file_writes: AtomicU64,
}

/// The counters at one moment, for `.xpackfs/stats.json` and the periodic log line.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct DiskStatsSnapshot {
    pub dir: String,
    pub mode: &'static str,
    pub budget_bytes: u64,
    /// Bytes of entries in the directory (shared by every process using it).
    pub size_bytes: u64,
    pub hits: u64,
    pub misses: u64,
    pub bytes_read: u64,
    pub writes: u64,
    pub bytes_written: u64,
    pub skipped_writes: u64,
    pub write_errors: u64,
    pub evictions: u64,
    pub evicted_bytes: u64,
    pub corrupt: u64,
    pub stale_temps: u64,
    pub file_hits: u64,
    pub file_misses: u64,
    pub file_rechecks: u64,
    pub file_writes: u64,
}

/// What an eviction pass found and did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EvictReport {
    pub scanned: u64,
    pub bytes_before: u64,
    pub evicted: u64,
    pub bytes_after: u64,
}

/// Why an entry was rejected.
#[derive(Debug)]
enum Bad {
    Corrupt(String),
    Io(io::Error),
}

pub struct DiskCache {
    cfg: DiskCacheConfig,
    mode: AtomicU8,
    /// Writes are paused until this many ms after `epoch` (full filesystem).
    paused_until_ms: AtomicU64,
    epoch: Instant,
    /// The shared counter; the mutex orders this process's threads (flock does not).
    usage: Option<Mutex<File>>,
    evict_lock: Option<Mutex<File>>,
    seq: AtomicU64,
    last_warn: Mutex<Vec<(&'static str, Instant)>>,
    pub stats: DiskStats,
}

impl std::fmt::Debug for DiskCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiskCache").field("dir", &self.cfg.dir).field("mode", &self.mode()).finish()
    }
}

fn io_err(path: &Path, e: impl std::fmt::Display) -> String {
    format!("{}: {e}", path.display())
}

impl DiskCache {
    /// Open (creating if needed) the cache at `cfg.dir`. Never fails: an unusable directory
    /// gives a read-only or disabled cache, with a warning.
    pub fn open(cfg: DiskCacheConfig) -> DiskCache {
        let mut c = DiskCache {
            cfg,
            mode: AtomicU8::new(Mode::Disabled as u8),
            paused_until_ms: AtomicU64::new(0),
            epoch: Instant::now(),
            usage: None,
            evict_lock: None,
            seq: AtomicU64::new(0),
            last_warn: Mutex::new(Vec::new()),
            stats: DiskStats::default(),
        };
        match c.prepare() {
            Ok(()) => {
                c.mode.store(Mode::ReadWrite as u8, Relaxed);
                if c.read_usage().is_none() {
                    // First use (or a lost counter): count what is there.
                    c.evict(true);
                }
                c.clean_temps();
            }
            Err(why) if c.cfg.dir.join("entries").is_dir() && fs::read_dir(c.cfg.dir.join("entries")).is_ok() => {
                tracing::warn!("disk cache {} is not writable ({why}): serving its entries, computed chunks stay in memory only", c.cfg.dir.display());
                c.mode.store(Mode::ReadOnly as u8, Relaxed);
            }
            Err(why) => {
                tracing::warn!("disk cache {} is unusable ({why}): memory cache only", c.cfg.dir.display());
            }
        }
        c
    }

    fn prepare(&mut self) -> Result<(), String> {
        let dir = self.cfg.dir.clone();
        for sub in ["entries", "tmp"] {
            fs::create_dir_all(dir.join(sub)).map_err(|e| io_err(&dir.join(sub), e))?;
        }
        for i in 0..=255u8 {
            let shard = dir.join("entries").join(format!("{i:02x}"));
            match fs::create_dir(&shard) {
                Ok(()) => {}
                Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
                Err(e) => return Err(io_err(&shard, e)),
            }
        }
        let open = |name: &str| -> Result<File, String> {
            let p = dir.join(name);
            OpenOptions::new().read(true).write(true).create(true).truncate(false).open(&p).map_err(|e| io_err(&p, e))
        };
        self.usage = Some(Mutex::new(open("usage")?));
        self.evict_lock = Some(Mutex::new(open("evict.lock")?));
        // A full filesystem is found by the first write, which pauses writes.
        Ok(())
    }

    pub fn config(&self) -> &DiskCacheConfig {
        &self.cfg
    }

    pub fn mode(&self) -> Mode {
        match self.mode.load(Relaxed) {
            0 => Mode::ReadWrite,
            1 => Mode::ReadOnly,
            _ => Mode::Disabled,
        }
    }

    pub fn budget(&self) -> u64 {
        self.cfg.budget_bytes
    }

    /// Change the bound before the cache is shared (a default bound that depends on the
    /// free space, found after opening).
    pub fn set_budget(&mut self, bytes: u64) {
        self.cfg.budget_bytes = bytes;
    }

    fn entry_path(&self, key: &DiskKey) -> PathBuf {
        let hex = key.hex();
        self.cfg.dir.join("entries").join(&hex[..2]).join(hex)
    }

    fn warn(&self, what: &'static str, msg: impl FnOnce() -> String) {
        let mut w = self.last_warn.lock();
        let now = Instant::now();
        match w.iter_mut().find(|(k, _)| *k == what) {
            Some((_, t)) if now.duration_since(*t) < WARN_EVERY => return,
            Some((_, t)) => *t = now,
            None => w.push((what, now)),
        }
        drop(w);
        tracing::warn!("disk cache {}: {}", self.cfg.dir.display(), msg());
    }

    /// The entry under `key`, verified, or `None` (absent, unreadable, or found wrong and
    /// deleted).
    pub fn get(&self, key: &DiskKey) -> Option<Arc<[u8]>> {
        if self.mode() == Mode::Disabled {
            return None;
        }
        let path = self.entry_path(key);
        let file = self.open_or_miss(&path, &self.stats.misses)?;
        match read_entry(&file, key) {
            Ok((bytes, mtime)) => {
                self.stats.hits.fetch_add(1, Relaxed);
                self.stats.bytes_read.fetch_add(bytes.len() as u64, Relaxed);
                self.touch(&file, mtime);
                Some(bytes)
            }
            Err(Bad::Corrupt(why)) => {
                self.stats.corrupt.fetch_add(1, Relaxed);
                self.stats.misses.fetch_add(1, Relaxed);
                tracing::warn!("disk cache entry {} is corrupt ({why}): deleted, the chunk will be recomputed", path.display());
                self.remove_if_same(&path, &file);
                None
            }
            Err(Bad::Io(e)) => {
                self.stats.misses.fetch_add(1, Relaxed);
                self.warn("read", || format!("{}: {e}", path.display()));
                None
            }
        }
    }

    /// `path` open for reading, or a miss counted in `misses` (absent; any other failure is
    /// also a warning).
    fn open_or_miss(&self, path: &Path, misses: &AtomicU64) -> Option<File> {
        File::open(path)
            .map_err(|e| {
                if e.kind() != ErrorKind::NotFound {
                    self.warn("open", || format!("{}: {e}", path.display()));
                }
                misses.fetch_add(1, Relaxed);
            })
            .ok()
    }

    /// Whether an entry of `payload_len` bytes is present under `key` (size checked, not
    /// the checksum: for resuming a warm-up cheaply; `get` still verifies).
    pub fn contains(&self, key: &DiskKey, payload_len: u64) -> bool {
        self.mode() != Mode::Disabled && fs::metadata(self.entry_path(key)).is_ok_and(|m| m.len() == HEADER_BYTES + payload_len)
    }

    fn touch(&self, file: &File, mtime: SystemTime) {
        if self.mode() != Mode::ReadWrite {
            return;
        }
        let age = SystemTime::now().duration_since(mtime).unwrap_or_default();
        if age < self.cfg.touch_interval {
            return;
        }
        let times = [
            libc::timespec { tv_sec: 0, tv_nsec: libc::UTIME_OMIT },
            libc::timespec { tv_sec: 0, tv_nsec: libc::UTIME_NOW },
        ];
        // SAFETY: `file` is an open descriptor and `times` two valid timespecs; futimens
        // only reads them. UTIME_NOW needs write permission, not ownership.
        let rc = unsafe { libc::futimens(std::os::fd::AsRawFd::as_raw_fd(file), times.as_ptr()) };
        if rc != 0 {
            let e = io::Error::last_os_error();
            self.warn("touch", || format!("cannot refresh an entry's use time: {e}"));
        }
    }

    /// Delete the entry at `path` if it is still the file `file` (a writer may have just
    /// replaced it with a good one).
    fn remove_if_same(&self, path: &Path, file: &File) {
        let (Ok(a), Ok(b)) = (file.metadata(), fs::symlink_metadata(path)) else { return };
        if (a.dev(), a.ino()) == (b.dev(), b.ino()) && fs::remove_file(path).is_ok() {
            self.add_usage(-(a.len() as i64));
        }
    }

    /// Store `bytes` under `key` (write-behind: call it after the bytes were served).
    /// Returns whether the entry is now present. Failures are warnings, never errors.
    pub fn put(&self, key: &DiskKey, bytes: &[u8]) -> bool {
        let total = HEADER_BYTES + bytes.len() as u64;
        if self.mode() != Mode::ReadWrite || self.paused() || bytes.len() as u64 > MAX_ENTRY_BYTES || total > self.cfg.budget_bytes {
            self.stats.skipped_writes.fetch_add(1, Relaxed);
            return false;
        }
        let path = self.entry_path(key);
        if fs::metadata(&path).is_ok_and(|m| m.len() == total) {
            self.stats.skipped_writes.fetch_add(1, Relaxed);
            return true; // another writer (or process) was first
        }
        let Some(before) = self.add_usage(total as i64) else {
            self.stats.skipped_writes.fetch_add(1, Relaxed);
            return false;
        };
        match self.write_entry(key, bytes, &path) {
            Ok(()) => {
                self.stats.writes.fetch_add(1, Relaxed);
                self.stats.bytes_written.fetch_add(total, Relaxed);
            }
            Err(e) => {
                self.add_usage(-(total as i64));
                self.write_failed(&e);
                return false;
            }
        }
        if before.saturating_add(total) > self.cfg.budget_bytes {
            self.evict(false);
        }
        true
    }

    fn paused(&self) -> bool {
        let until = self.paused_until_ms.load(Relaxed);
        until != 0 && (self.epoch.elapsed().as_millis() as u64) < until
    }

    fn write_failed(&self, e: &io::Error) {
        self.stats.write_errors.fetch_add(1, Relaxed);
        match e.raw_os_error() {
            Some(libc::ENOSPC | libc::EDQUOT) => {
                let until = self.epoch.elapsed() + FULL_PAUSE;
                self.paused_until_ms.store(until.as_millis() as u64, Relaxed);
                self.warn("full", || format!("the filesystem is full ({e}): writes paused for {}s, computed chunks stay in memory", FULL_PAUSE.as_secs()));
            }
            Some(libc::EROFS | libc::EACCES | libc::EPERM) => {
                self.mode.store(Mode::ReadOnly as u8, Relaxed);
                self.warn("readonly", || format!("not writable ({e}): read-only from now on, computed chunks stay in memory"));
            }
            _ => self.warn("write", || format!("cannot write an entry: {e}")),
        }
    }

    fn write_entry(&self, key: &DiskKey, bytes: &[u8], path: &Path) -> io::Result<()> {
        self.write_renamed(&key.hex(), path, |f| {
            f.write_all_at(&header(key, bytes), 0)?;
            f.write_all_at(bytes, HEADER_BYTES)?;
            if self.cfg.fsync {
                f.sync_data()?;
            }
            Ok(())
        })
        .map(drop)
    }

    /// Write a new temporary file under `tmp/` with `write`, then rename it to `path`;
    /// returns it (still open). On failure the temporary file is removed. It is locked by
    /// this writer until closed: a cleaner that can take the lock knows the writer is gone.
    fn write_renamed<E: From<io::Error>>(&self, stem: &str, path: &Path, write: impl FnOnce(&File) -> Result<(), E>) -> Result<File, E> {
        let seq = self.seq.fetch_add(1, Relaxed);
        let tmp = self.cfg.dir.join("tmp").join(format!("{stem}.{}.{seq}", std::process::id()));
        let result = (|| {
            let f = OpenOptions::new().write(true).create_new(true).open(&tmp)?;
            f.try_lock().map_err(|e| io::Error::other(format!("cannot lock a new temporary file: {e}")))?;
            write(&f)?;
            fs::rename(&tmp, path)?;
            Ok(f)
        })();
        if result.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        result
    }

    /// The shared counter, if it holds one.
    fn read_usage(&self) -> Option<u64> {
        let f = self.usage.as_ref()?.lock();
        f.lock().ok()?;
        let v = read_u64(&f);
        let _ = f.unlock();
        v
    }

    /// Add `delta` to the shared counter; returns its value before.
    fn add_usage(&self, delta: i64) -> Option<u64> {
        let f = self.usage.as_ref()?.lock();
        f.lock().ok()?;
        let before = read_u64(&f).unwrap_or(0);
        let after = before.saturating_add_signed(delta);
        let ok = f.write_all_at(&after.to_le_bytes(), 0).is_ok();
        let _ = f.unlock();
        ok.then_some(before)
    }

    /// Entry bytes in the directory (the shared counter: all processes' writes).
    pub fn size_bytes(&self) -> u64 {
        self.read_usage().unwrap_or(0)
    }

    /// Bring the directory under `low_water` of the budget if it is over the budget (or
    /// always recount, with `recount`), evicting least recently used entries. One process
    /// at a time; readers are never blocked.
    pub fn evict(&self, recount: bool) -> EvictReport {
        let mut report = EvictReport::default();
        if self.mode() != Mode::ReadWrite {
            return report;
        }
        let Some(evict_lock) = &self.evict_lock else { return report };
        let guard = evict_lock.lock();
        if guard.lock().is_err() {
            return report;
        }
        let start = self.read_usage();
        if !recount && start.is_some_and(|u| u <= self.cfg.budget_bytes) {
            let _ = guard.unlock();
            return report; // another process evicted meanwhile
        }
        let mut entries = self.scan();
        report.scanned = entries.len() as u64;
        // Writes in progress count (file entries' temporary files have their full length
        // from the start) but are not evicted.
        let mut total: u64 = entries.iter().map(|e| e.1).sum::<u64>() + self.temp_bytes();
        report.bytes_before = total;
        if total > self.cfg.budget_bytes {
            let target = (self.cfg.budget_bytes as f64 * self.cfg.low_water.clamp(0.0, 1.0)) as u64;
            entries.sort_unstable_by(|a, b| a.0.cmp(&b.0).then_with(|| a.2.cmp(&b.2)));
            for (_, size, path) in &entries {
                if total <= target {
                    break;
                }
                // A file entry goes seal first, then its data (counted in the seal's size).
                let data = path.to_str().and_then(|p| p.strip_suffix(".seal")).map(PathBuf::from);
                match fs::remove_file(path) {
                    Ok(()) => {
                        if let Some(d) = data {
                            let _ = fs::remove_file(d);
                        }
                        total -= size;
                        report.evicted += 1;
                        self.stats.evictions.fetch_add(1, Relaxed);
                        self.stats.evicted_bytes.fetch_add(*size, Relaxed);
                    }
                    Err(e) if e.kind() == ErrorKind::NotFound => total -= size,
                    Err(e) => self.warn("evict", || format!("cannot evict {}: {e}", path.display())),
                }
            }
        }
        report.bytes_after = total;
        // Writes reserved while scanning were perhaps counted by the scan too: counting them
        // twice only makes the next eviction come a little early (and recount).
        if let Some(f) = self.usage.as_ref().map(|m| m.lock())
            && f.lock().is_ok()
        {
            let now = read_u64(&f).unwrap_or(0);
            let during = now.saturating_sub(start.unwrap_or(now));
            let _ = f.write_all_at(&(total + during).to_le_bytes(), 0);
            let _ = f.unlock();
        }
        self.clean_temps();
        let _ = guard.unlock();
        report
    }

    /// (use time, size, path) of every entry: chunk entries (their mtime), file entries
    /// (their seal's mtime, the size of seal and data) and file data left without a seal.
    fn scan(&self) -> Vec<(SystemTime, u64, PathBuf)> {
        let mut out = Vec::new();
        for top in ["entries", "files"] {
            let Ok(shards) = fs::read_dir(self.cfg.dir.join(top)) else { continue };
            for shard in shards.flatten() {
                let Ok(files) = fs::read_dir(shard.path()) else { continue };
                let found: Vec<(PathBuf, fs::Metadata)> =
                    files.flatten().filter_map(|f| f.metadata().ok().filter(|m| m.is_file()).map(|m| (f.path(), m))).collect();
                if top == "files" {
                    // A seal stands for its data too; data without a seal stands alone.
                    let lens: std::collections::HashMap<PathBuf, u64> = found.iter().map(|(p, m)| (p.clone(), m.len())).collect();
                    for (path, m) in &found {
                        let mtime = m.modified().unwrap_or(SystemTime::UNIX_EPOCH);
                        if path.extension().is_some_and(|e| e == "seal") {
                            out.push((mtime, m.len() + lens.get(&path.with_extension("")).copied().unwrap_or(0), path.clone()));
                        } else if !lens.contains_key(&path.with_extension("seal")) {
                            out.push((mtime, m.len(), path.clone()));
                        }
                    }
                } else {
                    out.extend(found.into_iter().map(|(p, m)| (m.modified().unwrap_or(SystemTime::UNIX_EPOCH), m.len(), p)));
                }
            }
        }
        out
    }

    /// Bytes of the temporary files of writes in progress.
    fn temp_bytes(&self) -> u64 {
        let Ok(tmps) = fs::read_dir(self.cfg.dir.join("tmp")) else { return 0 };
        tmps.flatten().filter_map(|t| t.metadata().ok()).map(|m| m.len()).sum()
    }

    /// Remove temporary files whose writer is gone (their lock can be taken).
    fn clean_temps(&self) {
        let Ok(tmps) = fs::read_dir(self.cfg.dir.join("tmp")) else { return };
        for t in tmps.flatten() {
            let path = t.path();
            let Ok(f) = File::open(&path) else { continue };
            if f.try_lock().is_ok() && fs::remove_file(&path).is_ok() {
                self.stats.stale_temps.fetch_add(1, Relaxed);
            }
        }
    }

    pub fn snapshot(&self) -> DiskStatsSnapshot {
        let s = &self.stats;
        DiskStatsSnapshot {
            dir: self.cfg.dir.display().to_string(),
            mode: self.mode().name(),
            budget_bytes: self.cfg.budget_bytes,
            size_bytes: self.size_bytes(),
            hits: s.hits.load(Relaxed),
            misses: s.misses.load(Relaxed),
            bytes_read: s.bytes_read.load(Relaxed),
            writes: s.writes.load(Relaxed),
            bytes_written: s.bytes_written.load(Relaxed),
            skipped_writes: s.skipped_writes.load(Relaxed),
            write_errors: s.write_errors.load(Relaxed),
            evictions: s.evictions.load(Relaxed),
            evicted_bytes: s.evicted_bytes.load(Relaxed),
            corrupt: s.corrupt.load(Relaxed),
            stale_temps: s.stale_temps.load(Relaxed),
            file_hits: s.file_hits.load(Relaxed),
            file_misses: s.file_misses.load(Relaxed),
            file_rechecks: s.file_rechecks.load(Relaxed),
            file_writes: s.file_writes.load(Relaxed),
        }
    }
}

fn read_u64(f: &File) -> Option<u64> {
    let mut b = [0u8; 8];
    f.read_exact_at(&mut b, 0).ok()?;
    Some(u64::from_le_bytes(b))
}

fn checksum(key: &DiskKey, len: u64) -> XxHash3_128 {
    let mut h = XxHash3_128::new();
    h.write(&key.0);
    h.write(&len.to_le_bytes());
    h
}

fn header(key: &DiskKey, bytes: &[u8]) -> [u8; HEADER_BYTES as usize] {
    let len = bytes.len() as u64;
    let mut h = checksum(key, len);
    h.write(bytes);
    let mut out = [0u8; HEADER_BYTES as usize];
    out[..8].copy_from_slice(&MAGIC);
    out[8..40].copy_from_slice(&key.0);
    out[40..48].copy_from_slice(&len.to_le_bytes());
    out[48..64].copy_from_slice(&h.finish_128().to_le_bytes());
    out
}

/// Read and verify the entry `file` holds for `key`: its payload and mtime.
fn read_entry(file: &File, key: &DiskKey) -> Result<(Arc<[u8]>, SystemTime), Bad> {
    let meta = file.metadata().map_err(Bad::Io)?;
    let size = meta.len();
    if size < HEADER_BYTES {
        return Err(Bad::Corrupt(format!("{size} bytes, shorter than the header")));
    }
    // The whole entry is wanted: one readahead of all of it, so a cold entry costs one
    // device round trip instead of one per piece read below.
    // SAFETY: a plain system call on the open descriptor `file`; it reads no memory.
    unsafe { libc::posix_fadvise(std::os::fd::AsRawFd::as_raw_fd(file), 0, size.min(i64::MAX as u64) as i64, libc::POSIX_FADV_WILLNEED) };
    let mut head = [0u8; HEADER_BYTES as usize];
    file.read_exact_at(&mut head, 0).map_err(Bad::Io)?;
    if head[..8] != MAGIC {
        return Err(Bad::Corrupt("not an entry of this format".into()));
    }
    if head[8..40] != key.0 {
        return Err(Bad::Corrupt("holds another key".into()));
    }
    let len = u64::from_le_bytes(head[40..48].try_into().unwrap());
    if len > MAX_ENTRY_BYTES || len != size - HEADER_BYTES {
        return Err(Bad::Corrupt(format!("header says {len} payload bytes, the file has {}", size - HEADER_BYTES)));
    }
    let want = u128::from_le_bytes(head[48..64].try_into().unwrap());
    // SAFETY: zeroed memory is a valid `[u8]`.
    let mut buf: Arc<[u8]> = unsafe { Arc::<[u8]>::new_zeroed_slice(len as usize).assume_init() };
    let out = Arc::get_mut(&mut buf).expect("fresh allocation");
    let mut h = checksum(key, len);
    let mut done = 0usize;
    while done < out.len() {
        let n = READ_PIECE.min(out.len() - done);
        let piece = &mut out[done..done + n];
        file.read_exact_at(piece, HEADER_BYTES + done as u64).map_err(|e| match e.kind() {
            ErrorKind::UnexpectedEof => Bad::Corrupt("truncated while reading".into()),
            _ => Bad::Io(e),
        })?;
        h.write(piece);
        done += n;
    }
    if h.finish_128() != want {
        return Err(Bad::Corrupt("checksum mismatch".into()));
    }
    Ok((buf, meta.modified().unwrap_or(SystemTime::UNIX_EPOCH)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};

    /// Deterministic payload of entry `i` (first 8 bytes: `i`; the rest depends on `i` too).
    fn payload(i: u64, len: usize) -> Vec<u8> {
        let mut v: Vec<u8> = (0..len).map(|j| (j as u64).wrapping_mul(31).wrapping_add(i.wrapping_mul(0x9E37)) as u8).collect();
        let n = len.min(8);
        v[..n].copy_from_slice(&i.to_le_bytes()[..n]);
        v
    }

    fn key(i: u64) -> DiskKey {
        KeyBuilder::new("test").field("source", "s").producer().chunk(i)
    }

    fn cfg(dir: &Path, budget: u64) -> DiskCacheConfig {
        let mut c = DiskCacheConfig::new(dir, budget);
        c.touch_interval = Duration::ZERO;
        c
    }

    /// Entry bytes actually in the directory.
    fn on_disk(dir: &Path) -> (u64, usize) {
        // Tolerates entries evicted while it counts.
        let mut total = (0, 0);
        for shard in fs::read_dir(dir.join("entries")).into_iter().flatten().flatten() {
            for f in fs::read_dir(shard.path()).into_iter().flatten().flatten() {
                if let Ok(m) = f.metadata() {
                    total.0 += m.len();
                    total.1 += 1;
                }
            }
        }
        total
    }

    fn temps(dir: &Path) -> usize {
        fs::read_dir(dir.join("tmp")).unwrap().count()
    }

    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
    }

    #[test]
    fn keys_cover_every_field_unambiguously() {
        let base = || KeyBuilder::new("requant").field("source", "abc");
        let k = base().field("w1", "IQ2_XXS").finish();
        assert_eq!(k, base().field("w1", "IQ2_XXS").finish());
        assert_ne!(k, base().field("w1", "Q8_0").finish());
        assert_ne!(k, KeyBuilder::new("kt-int8").field("source", "abc").field("w1", "IQ2_XXS").finish());
        // Field boundaries and labels count.
        assert_ne!(base().field("ab", "c").finish(), base().field("a", "bc").finish());
        assert_ne!(base().field("a", "b").field("c", "").finish(), base().field("a", "bc").finish());
        assert_ne!(base().u64("n", 1).finish(), base().u64("m", 1).finish());
        let p = base().producer();
        let ids: std::collections::HashSet<DiskKey> = (0..1000).map(|i| p.chunk(i)).collect();
        assert_eq!(ids.len(), 1000);
        assert_ne!(p.chunk(0), base().field("x", "").producer().chunk(0));
        assert!(!ids.contains(&p.group()));
    }

    #[test]
    fn round_trip_and_counters() {
        let dir = tempfile::tempdir().unwrap();
        let c = DiskCache::open(cfg(dir.path(), 1 << 30));
        assert_eq!(c.mode(), Mode::ReadWrite);
        assert!(c.get(&key(1)).is_none());
        for (i, len) in [(1u64, 5000usize), (2, 0), (3, READ_PIECE * 3 + 17)] {
            assert!(c.put(&key(i), &payload(i, len)));
            assert!(c.contains(&key(i), len as u64));
            assert!(!c.contains(&key(i), len as u64 + 1));
            assert_eq!(&*c.get(&key(i)).unwrap(), &payload(i, len)[..]);
        }
        // A second put of a present entry is skipped, not counted twice.
        assert!(c.put(&key(1), &payload(1, 5000)));
        let s = c.snapshot();
        let data = 5000 + READ_PIECE as u64 * 3 + 17;
        assert_eq!((s.hits, s.misses, s.writes, s.skipped_writes), (3, 1, 3, 1));
        assert_eq!(s.bytes_read, data);
        assert_eq!(s.bytes_written, data + 3 * HEADER_BYTES);
        assert_eq!(s.size_bytes, on_disk(dir.path()).0);
        // A fresh instance (a restart) sees the same entries and the same size.
        let c2 = DiskCache::open(cfg(dir.path(), 1 << 30));
        assert_eq!(&*c2.get(&key(3)).unwrap(), &payload(3, READ_PIECE * 3 + 17)[..]);
        assert_eq!(c2.size_bytes(), on_disk(dir.path()).0);
        let json = serde_json::to_value(c2.snapshot()).unwrap();
        for field in ["hits", "misses", "bytes_read", "bytes_written", "evictions", "corrupt", "size_bytes", "mode"] {
            assert!(json.get(field).is_some(), "{field}");
        }
    }

    /// Every way an entry can be damaged between two instances is found, deleted, counted
    /// and reported as a miss; the entry can then be written again.
    #[test]
    fn damaged_entries_are_never_served() {
        let dir = tempfile::tempdir().unwrap();
        let len = 100_000usize;
        type Damage = fn(&Path, &Path);
        let damages: Vec<(&str, Damage)> = vec![
            ("payload byte flipped", |p, _| flip(p, HEADER_BYTES + 4321)),
            ("last byte flipped", |p, _| flip(p, HEADER_BYTES + 99_999)),
            ("length flipped", |p, _| flip(p, 41)),
            ("checksum flipped", |p, _| flip(p, 60)),
            ("key flipped", |p, _| flip(p, 9)),
            ("magic flipped", |p, _| flip(p, 0)),
            ("truncated payload", |p, _| OpenOptions::new().write(true).open(p).unwrap().set_len(HEADER_BYTES + 5000).unwrap()),
            ("truncated header", |p, _| OpenOptions::new().write(true).open(p).unwrap().set_len(10).unwrap()),
            ("empty", |p, _| OpenOptions::new().write(true).open(p).unwrap().set_len(0).unwrap()),
            ("extended", |p, _| {
                let f = OpenOptions::new().append(true).open(p).unwrap();
                f.write_all_at(b"more", HEADER_BYTES + 100_000).unwrap();
            }),
            ("torn: tail zeroed (power loss)", |p, _| {
                OpenOptions::new().write(true).open(p).unwrap().write_all_at(&vec![0u8; 50_000], HEADER_BYTES + 50_000).unwrap()
            }),
            ("another entry's file", |p, other| {
                fs::copy(other, p).unwrap();
            }),
        ];
        let c = DiskCache::open(cfg(dir.path(), 1 << 30));
        assert!(c.put(&key(999), &payload(999, len)));
        let other = c.entry_path(&key(999));
        for (i, (what, damage)) in damages.iter().enumerate() {
            let k = key(i as u64);
            assert!(c.put(&k, &payload(i as u64, len)));
            damage(&c.entry_path(&k), &other);
            let fresh = DiskCache::open(cfg(dir.path(), 1 << 30));
            assert!(fresh.get(&k).is_none(), "{what}: served");
            assert_eq!(fresh.stats.corrupt.load(Relaxed), 1, "{what}: not counted");
            assert!(!fresh.entry_path(&k).exists(), "{what}: not deleted");
            assert!(fresh.put(&k, &payload(i as u64, len)));
            assert_eq!(&*fresh.get(&k).unwrap(), &payload(i as u64, len)[..], "{what}: rewritten");
        }
        // Deleted between instances: a plain miss.
        fs::remove_file(c.entry_path(&key(0))).unwrap();
        let fresh = DiskCache::open(cfg(dir.path(), 1 << 30));
        assert!(fresh.get(&key(0)).is_none());
        assert_eq!(fresh.stats.corrupt.load(Relaxed), 0);
        // The counter was kept right through all this (deleted bad entries subtracted); an
        // entry removed behind the cache's back is repaired by the next recount.
        fresh.evict(true);
        assert_eq!(fresh.size_bytes(), on_disk(dir.path()).0);
    }

    fn flip(path: &Path, at: u64) {
        let f = OpenOptions::new().read(true).write(true).open(path).unwrap();
        let mut b = [0u8];
        f.read_exact_at(&mut b, at).unwrap();
        f.write_all_at(&[b[0] ^ 0x10], at).unwrap();
    }

    #[test]
    fn budget_is_kept_with_lru_eviction() {
        let dir = tempfile::tempdir().unwrap();
        let entry = 10_000u64;
        let budget = 20 * (entry + HEADER_BYTES);
        let c = DiskCache::open(cfg(dir.path(), budget));
        // Entries larger than the whole budget are not kept.
        assert!(!c.put(&key(u64::MAX), &vec![1u8; budget as usize]));
        let hot = key(1_000_000);
        assert!(c.put(&hot, &payload(7, entry as usize)));
        let mut rng = Rng(0x1234_5678);
        for i in 0..300u64 {
            // Old enough that the touched entry is strictly newer than the least recent
            // ones (filesystem timestamps are coarse).
            if i % 10 == 0 {
                std::thread::sleep(Duration::from_millis(5));
                assert_eq!(&*c.get(&hot).expect("the entry in use is kept"), &payload(7, entry as usize)[..]);
            }
            let len = (entry - rng.next() % 2000) as usize;
            assert!(c.put(&key(i), &payload(i, len)));
            let (bytes, _) = on_disk(dir.path());
            assert!(bytes <= budget, "{bytes} > {budget} after {i} writes");
            if let Some(v) = c.get(&key(rng.next() % (i + 1))) {
                assert_eq!(v[..8], v[..8]); // read back below
            }
        }
        for i in 0..300u64 {
            if let Some(v) = c.get(&key(i)) {
                assert_eq!(&v[..8], &i.to_le_bytes());
                assert_eq!(&v[..], &payload(i, v.len())[..]);
            }
        }
        let s = c.snapshot();
        assert!(s.evictions > 200, "{s:?}");
        // Eviction goes down to the low-water mark, so it runs rarely.
        assert!(s.size_bytes >= budget * 6 / 10, "{s:?}");
        assert_eq!(s.size_bytes, on_disk(dir.path()).0);
    }

    #[test]
    fn a_wrong_counter_is_repaired_not_trusted() {
        let dir = tempfile::tempdir().unwrap();
        let c = DiskCache::open(cfg(dir.path(), 1 << 20));
        for i in 0..10 {
            c.put(&key(i), &payload(i, 1000));
        }
        fs::write(dir.path().join("usage"), u64::MAX.to_le_bytes()).unwrap();
        assert!(c.put(&key(10), &payload(10, 1000)));
        // The over-budget counter made the writer recount: nothing was evicted.
        assert_eq!(c.stats.evictions.load(Relaxed), 0);
        assert_eq!(c.size_bytes(), on_disk(dir.path()).0);
        // A lost counter is recounted at open.
        fs::remove_file(dir.path().join("usage")).unwrap();
        let c2 = DiskCache::open(cfg(dir.path(), 1 << 20));
        assert_eq!(c2.size_bytes(), on_disk(dir.path()).0);
    }

    #[test]
    fn stale_temporary_files_are_removed_live_ones_kept() {
        let dir = tempfile::tempdir().unwrap();
        drop(DiskCache::open(cfg(dir.path(), 1 << 20)));
        let dead = dir.path().join("tmp").join("dead.1.0");
        fs::write(&dead, b"half an entry").unwrap();
        let live_path = dir.path().join("tmp").join("live.1.0");
        let live = File::create(&live_path).unwrap();
        live.lock().unwrap();
        let c = DiskCache::open(cfg(dir.path(), 1 << 20));
        assert!(!dead.exists());
        assert!(live_path.exists(), "a writer's file was removed under it");
        assert_eq!(c.stats.stale_temps.load(Relaxed), 1);
        drop(live);
        c.evict(true);
        assert!(!live_path.exists());
    }

    /// Separate instances on threads (as separate processes would be: each has its own
    /// descriptors, so `flock` orders them) writing and reading overlapping keys.
    #[test]
    fn instances_sharing_a_directory_keep_budget_and_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let entry = 20_000u64;
        let budget = 30 * (entry + HEADER_BYTES);
        let writers = 4u64;
        std::thread::scope(|s| {
            for t in 0..writers {
                let dir = dir.path();
                s.spawn(move || churn(dir, budget, entry as usize, t, 150));
            }
        });
        let (bytes, _) = on_disk(dir.path());
        assert!(bytes <= budget + writers * (entry + HEADER_BYTES), "{bytes} > {budget} + slack");
        let c = DiskCache::open(cfg(dir.path(), budget));
        c.evict(true);
        assert!(on_disk(dir.path()).0 <= budget);
        assert_eq!(temps(dir.path()), 0);
    }

    /// Writes and reads `n` overlapping entries; panics on any wrong byte.
    fn churn(dir: &Path, budget: u64, entry: usize, seed: u64, n: u64) {
        let c = DiskCache::open(cfg(dir, budget));
        let mut rng = Rng(0x9E37_79B9 + seed * 7919);
        let mut hits = 0;
        for _ in 0..n {
            let i = rng.next() % 60;
            match c.get(&key(i)) {
                Some(v) => {
                    assert_eq!(&v[..], &payload(i, entry)[..], "entry {i} read wrong");
                    hits += 1;
                }
                None => {
                    c.put(&key(i), &payload(i, entry));
                }
            }
            let (bytes, _) = on_disk(dir);
            // Bound: the budget, plus what other writers have renamed in but not yet evicted for.
            assert!(bytes <= budget + 8 * (entry as u64 + HEADER_BYTES), "{bytes} over {budget}");
        }
        assert!(hits > 0);
        assert_eq!(c.stats.corrupt.load(Relaxed), 0);
    }

    fn child(test: &str, env: &[(&str, String)]) -> Command {
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        cmd.args([test, "--exact", "--ignored", "--nocapture", "--test-threads=1"]).stdout(Stdio::null()).stderr(Stdio::inherit());
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd
    }

    /// Child of the multi-process tests (does nothing unless a parent test starts it).
    #[test]
    #[ignore = "started as a child process by the multi-process tests"]
    fn child_process() {
        let Ok(dir) = std::env::var("XPACKFS_DC_DIR") else { return };
        let dir = PathBuf::from(dir);
        let arg = |k: &str| std::env::var(k).unwrap().parse::<u64>().unwrap();
        match std::env::var("XPACKFS_DC_ROLE").unwrap().as_str() {
            "churn" => churn(&dir, arg("XPACKFS_DC_BUDGET"), arg("XPACKFS_DC_ENTRY") as usize, arg("XPACKFS_DC_SEED"), 200),
            "writer" => {
                // Writes entries until killed, as fast as it can; but never more than 1 GiB,
                // nor past 60 s or its parent (a failed parent test must not leave it
                // filling the disk).
                let c = DiskCache::open(cfg(&dir, 1 << 40));
                let entry = arg("XPACKFS_DC_ENTRY") as usize;
                let base = payload(0, entry);
                let parent = std::os::unix::process::parent_id();
                let started = Instant::now();
                let first = arg("XPACKFS_DC_SEED");
                for i in first..first + (1u64 << 30) / entry.max(1) as u64 {
                    if std::os::unix::process::parent_id() != parent || started.elapsed() > Duration::from_secs(60) {
                        return;
                    }
                    let mut p = base.clone();
                    p[..8].copy_from_slice(&i.to_le_bytes());
                    c.put(&key(i), &p);
                }
            }
            other => panic!("unknown role {other}"),
        }
    }

    #[test]
    fn processes_sharing_a_directory_keep_budget_and_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let entry = 30_000u64;
        let budget = 25 * (entry + HEADER_BYTES);
        let kids: Vec<_> = (0..3u64)
            .map(|seed| {
                child(
                    "store::disk::tests::child_process",
                    &[
                        ("XPACKFS_DC_DIR", dir.path().display().to_string()),
                        ("XPACKFS_DC_ROLE", "churn".into()),
                        ("XPACKFS_DC_BUDGET", budget.to_string()),
                        ("XPACKFS_DC_ENTRY", entry.to_string()),
                        ("XPACKFS_DC_SEED", seed.to_string()),
                    ],
                )
                .spawn()
                .unwrap()
            })
            .collect();
        for mut k in kids {
            assert!(k.wait().unwrap().success(), "a child read a wrong byte or broke the bound");
        }
        assert!(on_disk(dir.path()).0 <= budget + 3 * (entry + HEADER_BYTES));
        let c = DiskCache::open(cfg(dir.path(), budget));
        c.evict(true);
        assert!(on_disk(dir.path()).0 <= budget);
        for i in 0..60 {
            if let Some(v) = c.get(&key(i)) {
                assert_eq!(&v[..], &payload(i, entry as usize)[..]);
            }
        }
    }

    /// A writer killed with SIGKILL at random moments: a fresh instance never serves a
    /// wrong byte, and the writer's half-written temporary files are removed.
    #[test]
    fn kill_9_during_writes_leaves_nothing_wrong() {
        let dir = tempfile::tempdir().unwrap();
        let entry = 4usize << 20;
        let mut rng = Rng(0xDEAD_BEEF);
        let mut stale = 0;
        let mut next = 0u64;
        for round in 0..12 {
            let mut kid = child(
                "store::disk::tests::child_process",
                &[
                    ("XPACKFS_DC_DIR", dir.path().display().to_string()),
                    ("XPACKFS_DC_ROLE", "writer".into()),
                    ("XPACKFS_DC_ENTRY", entry.to_string()),
                    ("XPACKFS_DC_SEED", next.to_string()),
                ],
            )
            .spawn()
            .unwrap();
            // Let it get going (the first entry is in place), then kill it at a random moment.
            let t = Instant::now();
            while on_disk(dir.path()).1 <= round && t.elapsed() < Duration::from_secs(60) {
                std::thread::sleep(Duration::from_millis(2));
            }
            std::thread::sleep(Duration::from_micros(rng.next() % 20_000));
            kid.kill().unwrap();
            kid.wait().unwrap();
            let had_temps = temps(dir.path());
            let c = DiskCache::open(cfg(dir.path(), 1 << 40));
            stale += c.stats.stale_temps.load(Relaxed);
            assert_eq!(c.stats.stale_temps.load(Relaxed) as usize, had_temps);
            assert_eq!(temps(dir.path()), 0);
            let mut base = payload(0, entry);
            let mut present = 0;
            for i in 0..next + 10_000 {
                if !c.entry_path(&key(i)).exists() {
                    if i >= next {
                        next = i;
                        break;
                    }
                    continue;
                }
                base[..8].copy_from_slice(&i.to_le_bytes());
                assert_eq!(&c.get(&key(i)).expect("a renamed entry is whole")[..], &base[..], "entry {i}");
                present += 1;
            }
            assert!(present > round);
            assert_eq!(c.stats.corrupt.load(Relaxed), 0);
        }
        eprintln!("kills during a write: {stale} of 12");
        // The kills did land mid-write (a write of 4 MiB is most of the writer's loop).
        assert!(stale > 0, "no kill landed during a write in 12 rounds");
    }

    /// Mount a tmpfs at `target` (root only).
    fn mount_tmpfs(target: &Path, flags: libc::c_ulong, opts: &str) -> bool {
        use std::ffi::CString;
        let target = CString::new(target.as_os_str().as_encoded_bytes()).unwrap();
        let (fstype, data) = (CString::new("tmpfs").unwrap(), CString::new(opts).unwrap());
        // SAFETY: every pointer is a valid NUL-terminated string that outlives the call.
        unsafe { libc::mount(fstype.as_ptr(), target.as_ptr(), fstype.as_ptr(), flags, data.as_ptr().cast()) == 0 }
    }

    /// Unmounts its path on drop.
    struct Unmount(PathBuf);

    impl Drop for Unmount {
        fn drop(&mut self) {
            let target = std::ffi::CString::new(self.0.as_os_str().as_encoded_bytes()).unwrap();
            // SAFETY: a valid NUL-terminated path.
            unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
        }
    }

    /// A tmpfs mounted on a fresh temporary directory for a test (root only).
    struct TmpMount {
        _unmount: Unmount,
        dir: tempfile::TempDir,
    }

    impl TmpMount {
        fn new(opts: &str) -> Option<TmpMount> {
            // SAFETY: geteuid has no preconditions.
            if unsafe { libc::geteuid() } != 0 {
                return None;
            }
            let dir = tempfile::tempdir().unwrap();
            mount_tmpfs(dir.path(), 0, opts).then(|| TmpMount { _unmount: Unmount(dir.path().to_path_buf()), dir })
        }

        fn remount_read_only(&self) -> bool {
            mount_tmpfs(self.path(), libc::MS_REMOUNT | libc::MS_RDONLY, "")
        }

        fn path(&self) -> &Path {
            self.dir.path()
        }
    }

    #[test]
    fn unusable_directories_degrade_to_memory_only() {
        // Not a directory at all: disabled, every call a miss or a skipped write.
        let f = tempfile::NamedTempFile::new().unwrap();
        let c = DiskCache::open(cfg(&f.path().join("cache"), 1 << 20));
        assert_eq!(c.mode(), Mode::Disabled);
        assert!(c.get(&key(1)).is_none());
        assert!(!c.put(&key(1), b"abc"));
        assert_eq!(c.snapshot().skipped_writes, 1);

        // Read-only: existing entries are served, nothing is written. As root, permission
        // bits do not stop writes, so use a read-only filesystem there.
        let write_some = |dir: &Path| {
            let c = DiskCache::open(cfg(dir, 1 << 20));
            assert!(c.put(&key(1), &payload(1, 1000)));
            assert!(c.put(&key(2), &payload(2, 1000)));
            flip(&c.entry_path(&key(2)), HEADER_BYTES + 3);
        };
        let check_read_only = |dir: &Path| {
            let c = DiskCache::open(cfg(dir, 1 << 20));
            assert_eq!(c.mode(), Mode::ReadOnly);
            assert_eq!(&*c.get(&key(1)).unwrap(), &payload(1, 1000)[..]);
            assert!(c.get(&key(2)).is_none(), "a corrupt entry is not served even if it cannot be deleted");
            assert!(!c.put(&key(3), &payload(3, 1000)));
            assert!(c.get(&key(3)).is_none());
        };
        if let Some(m) = TmpMount::new("size=4m") {
            write_some(m.path());
            assert!(m.remount_read_only());
            check_read_only(m.path());
        } else {
            let dir = tempfile::tempdir().unwrap();
            write_some(dir.path());
            use std::os::unix::fs::PermissionsExt;
            for p in [dir.path().to_path_buf(), dir.path().join("entries"), c_shard(dir.path(), &key(3)), dir.path().join("tmp")] {
                fs::set_permissions(&p, fs::Permissions::from_mode(0o555)).unwrap();
            }
            fs::set_permissions(dir.path().join("usage"), fs::Permissions::from_mode(0o444)).unwrap();
            check_read_only(dir.path());
            for p in [dir.path().to_path_buf(), dir.path().join("entries"), c_shard(dir.path(), &key(3)), dir.path().join("tmp")] {
                fs::set_permissions(&p, fs::Permissions::from_mode(0o755)).unwrap();
            }
        }
    }

    fn c_shard(dir: &Path, k: &DiskKey) -> PathBuf {
        dir.join("entries").join(&k.hex()[..2])
    }

    #[test]
    fn a_filesystem_turning_read_only_or_full_is_a_warning_not_an_error() {
        let Some(m) = TmpMount::new("size=2m") else {
            eprintln!("skipped: needs root to mount a small tmpfs");
            return;
        };
        let c = DiskCache::open(cfg(m.path(), 1 << 30));
        assert_eq!(c.mode(), Mode::ReadWrite);
        // Full: the write that fails pauses writes; what is there is still served.
        let mut stored = Vec::new();
        for i in 0..10 {
            if c.put(&key(i), &payload(i, 300_000)) {
                stored.push(i);
            } else {
                break;
            }
        }
        assert!(!stored.is_empty() && stored.len() < 10, "{stored:?}");
        assert_eq!(c.stats.write_errors.load(Relaxed), 1);
        assert!(!c.put(&key(100), b"small enough to fit"), "writes are paused");
        assert_eq!(c.stats.write_errors.load(Relaxed), 1);
        for &i in &stored {
            assert_eq!(&*c.get(&key(i)).unwrap(), &payload(i, 300_000)[..]);
        }
        assert_eq!(temps(m.path()), 0, "the failed write left its temporary file");
        assert_eq!(c.size_bytes(), on_disk(m.path()).0, "the failed write's reservation was returned");
        // Turning read-only under a live instance (a read-only filesystem over `tmp/`: a
        // remount would be refused while the instance holds its counter open).
        let c2 = DiskCache::open(cfg(m.path(), 1 << 30));
        let tmp = m.path().join("tmp");
        assert!(mount_tmpfs(&tmp, libc::MS_RDONLY, "size=1m"));
        let _unmount = Unmount(tmp);
        assert!(!c2.put(&key(200), b"x"));
        assert_eq!(c2.mode(), Mode::ReadOnly);
        assert_eq!(&*c2.get(&key(stored[0])).unwrap(), &payload(stored[0], 300_000)[..]);
    }
}
