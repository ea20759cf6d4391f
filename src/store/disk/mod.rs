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
//! - **One copy in memory.** An entry is read into a memory tier that keeps it (a computed
//!   chunk, a fetched part), so its pages are dropped from the page cache as it is read.
//! - **Never an error.** A directory that cannot be created or read makes the cache
//!   disabled; one that cannot be written makes it read-only; a full filesystem pauses
//!   writes for a while. Each is a warning; callers see misses and skipped writes.
//!
//! Besides chunk entries it keeps whole files of a view ("file entries", `files`): the
//! file's bytes as they are, so the kernel can serve them (FUSE passthrough), with a seal
//! beside them; same budget, same LRU.
//!
//! One idea per file: `keys` (what entries are stored under), `entry` (the chunk entry's
//! format, its reads and writes), `files` (file entries and their seals), `budget` (the
//! shared counter and eviction), `stats` (counters); this file holds the cache itself:
//! opening the directory, its modes, and what every writer shares (temporary files renamed
//! into place, warnings, pausing when the filesystem is full).
//!
//! Layout of the directory: `entries/<2 hex>/<64 hex>` (256 shards), `files/<2 hex>/<64 hex>`
//! and `.seal` beside it, `tmp/`, `usage`, `evict.lock`. Several processes may share it
//! (each temporary file is `flock`ed by its writer, so stale ones, of writers that died, are
//! recognised and removed).

use std::fs::{self, File, OpenOptions};
use std::io::{self, ErrorKind};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant, SystemTime};

use parking_lot::Mutex;

mod budget;
mod entry;
mod files;
mod keys;
mod stats;

pub use budget::EvictReport;
pub use entry::{HEADER_BYTES, MAX_ENTRY_BYTES};
pub use files::{FileLookup, seal_len};
pub use keys::{DiskKey, KeyBuilder, ProducerKey, source_file_key, source_file_keys};
pub use stats::{DiskCounts, DiskStats, DiskStatsSnapshot};

/// Writes are paused this long after the filesystem reported it is full.
const FULL_PAUSE: Duration = Duration::from_secs(30);
/// The same warning is logged at most this often.
const WARN_EVERY: Duration = Duration::from_secs(60);

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

/// Why a cache directory cannot be used read-write (then it is read-only or disabled).
#[derive(Debug, thiserror::Error)]
#[error("{}: {source}", path.display())]
struct Unusable {
    path: PathBuf,
    source: io::Error,
}

/// Create `dir`, and any missing parent, with mode 0700 whatever the umask: the cache's
/// directories are its trust boundary (entries are checked with a non-cryptographic hash,
/// which finds damage, not forgery). Existing directories are left as they are.
fn create_private_dir(dir: &Path) -> io::Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        create_private_dir(parent)?;
    }
    match fs::DirBuilder::new().mode(0o700).create(dir) {
        // The umask may have taken bits away (even the owner's): set them exactly.
        Ok(()) => fs::set_permissions(dir, fs::Permissions::from_mode(0o700)),
        Err(e) if e.kind() == ErrorKind::AlreadyExists && dir.is_dir() => Ok(()),
        Err(e) => Err(e),
    }
}

/// A file this cache just created, made mode 0600 whatever the umask (see
/// [`create_private_dir`]); entries keep it when they are renamed into place.
fn private_file(f: File) -> io::Result<File> {
    f.set_permissions(fs::Permissions::from_mode(0o600))?;
    Ok(f)
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

    fn prepare(&mut self) -> Result<(), Unusable> {
        let dir = self.cfg.dir.clone();
        let create = |path: PathBuf| create_private_dir(&path).map_err(|source| Unusable { path, source });
        for sub in ["entries", "tmp"] {
            create(dir.join(sub))?;
        }
        for i in 0..=255u8 {
            create(dir.join("entries").join(format!("{i:02x}")))?;
        }
        let open = |name: &str| -> Result<File, Unusable> {
            let path = dir.join(name);
            let created = OpenOptions::new().read(true).write(true).create_new(true).mode(0o600).open(&path).and_then(private_file);
            match created {
                Err(e) if e.kind() == ErrorKind::AlreadyExists => OpenOptions::new().read(true).write(true).open(&path),
                other => other,
            }
            .map_err(|source| Unusable { path, source })
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

    /// `path` open for reading, or a miss counted in `misses` (absent; any other failure is
    /// also a warning).
    fn open_or_miss(&self, path: &Path, misses: &crate::metrics::Counter) -> Option<File> {
        File::open(path)
            .map_err(|e| {
                if e.kind() != ErrorKind::NotFound {
                    self.warn("open", || format!("{}: {e}", path.display()));
                }
                misses.inc();
            })
            .ok()
    }

    fn touch(&self, file: &File, mtime: SystemTime) {
        if self.mode() != Mode::ReadWrite {
            return;
        }
        let age = SystemTime::now().duration_since(mtime).unwrap_or_default();
        if age < self.cfg.touch_interval {
            return;
        }
        let times = [libc::timespec { tv_sec: 0, tv_nsec: libc::UTIME_OMIT }, libc::timespec { tv_sec: 0, tv_nsec: libc::UTIME_NOW }];
        // SAFETY: `file` is an open descriptor and `times` two valid timespecs; futimens
        // only reads them. UTIME_NOW needs write permission, not ownership.
        let rc = unsafe { libc::futimens(std::os::fd::AsRawFd::as_raw_fd(file), times.as_ptr()) };
        if rc != 0 {
            let e = io::Error::last_os_error();
            self.warn("touch", || format!("cannot refresh an entry's use time: {e}"));
        }
    }

    fn paused(&self) -> bool {
        let until = self.paused_until_ms.load(Relaxed);
        until != 0 && (self.epoch.elapsed().as_millis() as u64) < until
    }

    fn write_failed(&self, e: &io::Error) {
        self.stats.write_errors.inc();
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

    /// Write a new temporary file under `tmp/` with `write`, then rename it to `path`;
    /// returns it (still open). On failure the temporary file is removed. It is locked by
    /// this writer until closed: a cleaner that can take the lock knows the writer is gone.
    fn write_renamed<E: From<io::Error>>(&self, stem: &str, path: &Path, write: impl FnOnce(&File) -> Result<(), E>) -> Result<File, E> {
        let seq = self.seq.fetch_add(1, Relaxed);
        let tmp = self.cfg.dir.join("tmp").join(format!("{stem}.{}.{seq}", std::process::id()));
        let result = (|| {
            let f = OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp).and_then(private_file)?;
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
}

#[cfg(test)]
mod tests {
    use super::entry::READ_PIECE;
    use super::*;
    use std::os::unix::fs::FileExt;
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

    /// Pages of `path` in the page cache (`mincore` over a mapping of it).
    fn resident_pages(path: &Path) -> usize {
        let f = fs::File::open(path).unwrap();
        let len = f.metadata().unwrap().len() as usize;
        let pages = len.div_ceil(4096);
        let mut vec = vec![0u8; pages];
        // SAFETY: a read-only shared mapping of an open file, unmapped before returning;
        // mincore writes one byte per page into `vec`, which has that many.
        unsafe {
            let p = libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_SHARED, std::os::fd::AsRawFd::as_raw_fd(&f), 0);
            assert_ne!(p, libc::MAP_FAILED);
            assert_eq!(libc::mincore(p, len, vec.as_mut_ptr()), 0);
            libc::munmap(p, len);
        }
        vec.iter().filter(|&&b| b & 1 == 1).count()
    }

    #[test]
    fn an_entry_read_leaves_none_of_its_pages_in_the_page_cache() {
        let dir = tempfile::tempdir().unwrap();
        let c = DiskCache::open(cfg(dir.path(), 1 << 30));
        let len = READ_PIECE * 5 + 123;
        assert!(c.put(&key(1), &payload(1, len)));
        let p = c.entry_path(&key(1));
        fs::File::open(&p).unwrap().sync_all().unwrap(); // clean pages can be dropped
        let written = resident_pages(&p);
        assert!(written > 0, "the entry's pages are cached once written");
        let mut buf = vec![0u8; len];
        assert!(c.get_into(&key(1), &mut buf));
        assert_eq!(buf, payload(1, len));
        assert_eq!(resident_pages(&p), 0, "the bytes are the caller's now: no second copy in the page cache ({written} pages before)");
        // `get` (a computed chunk's way in) too.
        assert_eq!(c.get(&key(1)).as_deref(), Some(&payload(1, len)[..]));
        assert_eq!(resident_pages(&p), 0);
    }

    #[test]
    fn get_into_fills_the_callers_buffer_of_the_entrys_length_only() {
        let dir = tempfile::tempdir().unwrap();
        let c = DiskCache::open(cfg(dir.path(), 1 << 30));
        let len = READ_PIECE * 2 + 5;
        let mut buf = vec![7u8; len];
        assert!(!c.get_into(&key(1), &mut buf), "absent");
        assert!(buf.iter().all(|&b| b == 7), "a miss leaves the buffer as it was");
        assert!(c.put(&key(1), &payload(1, len)));
        assert!(c.get_into(&key(1), &mut buf));
        assert_eq!(buf, payload(1, len));
        // Another length is a miss that reads nothing and keeps the entry.
        let mut short = vec![7u8; len - 1];
        assert!(!c.get_into(&key(1), &mut short));
        assert!(short.iter().all(|&b| b == 7));
        assert!(c.entry_path(&key(1)).exists());
        let s = c.snapshot();
        assert_eq!((s.hits, s.misses, s.corrupt), (1, 2, 0));
        assert_eq!(s.bytes_read, len as u64);
        // A flipped payload byte: not served, counted, deleted.
        let p = c.entry_path(&key(1));
        let f = fs::OpenOptions::new().read(true).write(true).open(&p).unwrap();
        let mut b = [0u8; 1];
        f.read_exact_at(&mut b, HEADER_BYTES + 1000).unwrap();
        f.write_all_at(&[b[0] ^ 1], HEADER_BYTES + 1000).unwrap();
        assert!(!c.get_into(&key(1), &mut buf));
        assert_eq!(c.snapshot().corrupt, 1);
        assert!(!p.exists());
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
            assert_eq!(fresh.stats.corrupt.get(), 1, "{what}: not counted");
            assert!(!fresh.entry_path(&k).exists(), "{what}: not deleted");
            assert!(fresh.put(&k, &payload(i as u64, len)));
            assert_eq!(&*fresh.get(&k).unwrap(), &payload(i as u64, len)[..], "{what}: rewritten");
        }
        // Deleted between instances: a plain miss.
        fs::remove_file(c.entry_path(&key(0))).unwrap();
        let fresh = DiskCache::open(cfg(dir.path(), 1 << 30));
        assert!(fresh.get(&key(0)).is_none());
        assert_eq!(fresh.stats.corrupt.get(), 0);
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
        assert_eq!(c.stats.evictions.get(), 0);
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
        assert_eq!(c.stats.stale_temps.get(), 1);
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
        assert_eq!(c.stats.corrupt.get(), 0);
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
            "modes" => {
                // SAFETY: umask has no preconditions; this child process is alone in using it.
                unsafe { libc::umask(arg("XPACKFS_DC_UMASK") as libc::mode_t) };
                let c = DiskCache::open(cfg(&dir, 1 << 30));
                assert_eq!(c.mode(), Mode::ReadWrite);
                assert!(c.put(&key(1), &payload(1, 1000)));
                assert!(c.put_file(&key(2), 3 << 20, &mut |_, buf| {
                    buf.fill(7);
                    Ok::<_, io::Error>(())
                }));
            }
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

    /// Directories 0700 and files 0600 whatever the umask of the process that made them
    /// (the cache's directory is its trust boundary), from the cache's root down; a
    /// directory that was there already is left alone.
    #[test]
    fn directories_and_entries_are_private_whatever_the_umask() {
        use std::os::unix::fs::PermissionsExt;
        for umask in [0o000u32, 0o022, 0o277] {
            let parent = tempfile::tempdir().unwrap();
            let dir = parent.path().join("made").join("cache");
            let status = child(
                "store::disk::tests::child_process",
                &[("XPACKFS_DC_DIR", dir.display().to_string()), ("XPACKFS_DC_ROLE", "modes".into()), ("XPACKFS_DC_UMASK", umask.to_string())],
            )
            .status()
            .unwrap();
            assert!(status.success(), "umask {umask:03o}: the child failed");
            let mode = |p: &Path| fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777;
            let mut seen = (0, 0);
            let mut stack = vec![parent.path().join("made")];
            while let Some(d) = stack.pop() {
                assert_eq!(mode(&d), 0o700, "umask {umask:03o}: {}", d.display());
                seen.0 += 1;
                for e in fs::read_dir(&d).unwrap().flatten() {
                    if e.file_type().unwrap().is_dir() {
                        stack.push(e.path());
                    } else {
                        assert_eq!(mode(&e.path()), 0o600, "umask {umask:03o}: {}", e.path().display());
                        seen.1 += 1;
                    }
                }
            }
            // made, cache, entries + 256 shards, tmp, files + 1 shard; usage, evict.lock, one
            // chunk entry, one file entry's data and seal.
            assert_eq!(seen, (262, 5), "umask {umask:03o}");
        }
        // An existing directory keeps its mode.
        let existing = tempfile::tempdir().unwrap();
        fs::set_permissions(existing.path(), fs::Permissions::from_mode(0o750)).unwrap();
        drop(DiskCache::open(cfg(existing.path(), 1 << 20)));
        assert_eq!(fs::metadata(existing.path()).unwrap().permissions().mode() & 0o7777, 0o750);
        assert_eq!(fs::metadata(existing.path().join("entries")).unwrap().permissions().mode() & 0o7777, 0o700);
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
            stale += c.stats.stale_temps.get();
            assert_eq!(c.stats.stale_temps.get() as usize, had_temps);
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
            assert_eq!(c.stats.corrupt.get(), 0);
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

        /// Remount read-only. The kernel refuses (EBUSY) while any file on it is open for
        /// writing, and a test running alongside that forks a child (`kill_9_...`) holds a
        /// copy of every descriptor of the process until its `exec`: try again for a while.
        fn remount_read_only(&self) -> bool {
            (0..100).any(|i| {
                if i > 0 {
                    std::thread::sleep(Duration::from_millis(20));
                }
                mount_tmpfs(self.path(), libc::MS_REMOUNT | libc::MS_RDONLY, "")
            })
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
        assert_eq!(c.stats.write_errors.get(), 1);
        assert!(!c.put(&key(100), b"small enough to fit"), "writes are paused");
        assert_eq!(c.stats.write_errors.get(), 1);
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
