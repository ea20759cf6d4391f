//! Where computed chunks are computed: a bounded pool of its own, off the threads that
//! serve reads, with the tiers in front of it.
//!
//! [`ComputePool`] runs chunk computations ("jobs") on two rayon pools: `read` for chunks
//! a reader waits for (and a reader's read-ahead), and `background` (niced, idle I/O
//! class) for warming and prewarming, so background work yields the CPU to reads at once. Jobs are single-flight per
//! key: a second request for a key joins the first. A read that joins a background job
//! promotes it (a job still queued also gets a run on the read pool; one already running
//! gets a second, hedging run there; the first result wins, the other is dropped), so a
//! reader never waits behind background work. A reader waits only for its own chunk;
//! nested parallelism in a job (`par_iter`) stays on the job's pool. A job may be called
//! more than once (hedging): it must be a pure function of what it captures.
//!
//! [`Tiers`] is the lookup a view's chunk source calls: memory ([`ChunkCache`], with its own
//! single-flight), then the disk cache ([`DiskCache`]), then the pool; a computed chunk is
//! handed to its waiters first and then written behind, on the computing thread, into
//! memory and disk. A [`Group`] is what one job computes: one chunk, or several sibling
//! chunks at once (kt-int8 computes every NUMA part's quant and scale file of one expert
//! projection together). Prefetches go through a few driver threads that only wait; a
//! read-ahead runs at read priority (a reader that caught up with a background run would
//! hedge it and compute the chunk twice), and a reader arriving for a background prefetch
//! promotes its job instead of waiting behind it.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::mpsc::{sync_channel, SyncSender};
use std::sync::Arc;

use parking_lot::{Condvar, Mutex};

use super::disk::{DiskCache, DiskCacheConfig, DiskKey};
use super::memory::{self as cache, ChunkCache, Origin};
use super::{ChunkError, Panicked};
use crate::util::args::{int_in, switch};

/// What one job computes: its chunks, in order.
pub type Parts = Arc<[Arc<[u8]>]>;
/// A job's result as every waiter sees it.
pub type Outcome<E> = Result<Parts, Arc<E>>;
pub type Job<E> = Arc<dyn Fn() -> Result<Parts, E> + Send + Sync>;
/// Run once with a job's parts after its waiters were woken (write-behind); the flag says
/// whether a read-priority request joined it.
pub type After = Box<dyn FnOnce(&Parts, bool) + Send>;
type Done<E> = Box<dyn FnOnce(&Outcome<E>) + Send>;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Priority {
    /// A reader waits for it.
    Read,
    /// Prefetch, prewarm: yields to reads.
    Background,
}

#[derive(Debug, Clone)]
pub struct PoolConfig {
    /// Threads of each of the two pools (default: the CPU count).
    pub threads: usize,
    /// Niceness added to the read pool's threads.
    pub read_nice: i32,
    /// Niceness added to the background pool's threads.
    pub background_nice: i32,
    /// Background threads use the idle I/O scheduling class.
    pub background_idle_io: bool,
}

impl Default for PoolConfig {
    fn default() -> Self {
        let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
        PoolConfig { threads, read_nice: 0, background_nice: 19, background_idle_io: true }
    }
}

#[derive(Debug, Default)]
pub struct PoolStats {
    pub runs_read: AtomicU64,
    pub runs_background: AtomicU64,
    /// Requests that joined a job already in flight.
    pub joined: AtomicU64,
    /// Background jobs still queued when a read needed them: run on the read pool.
    pub promoted: AtomicU64,
    /// Background jobs already running when a read needed them: run again on the read pool.
    pub hedged: AtomicU64,
    /// Runs whose result came second (hedging) and was dropped.
    pub wasted: AtomicU64,
    pub failed: AtomicU64,
    pub panics: AtomicU64,
}

struct State<E> {
    outcome: Option<Outcome<E>>,
    /// The highest priority a run has started at.
    running: Option<Priority>,
    read_scheduled: bool,
    read_joined: bool,
    /// The outcome is known and the write-behind done.
    settled: bool,
    after: Option<After>,
    done: Vec<Done<E>>,
}

struct Flight<E> {
    key: DiskKey,
    job: Job<E>,
    st: Mutex<State<E>>,
    cv: Condvar,
}

struct Shared<E> {
    flights: Mutex<HashMap<DiskKey, Arc<Flight<E>>>>,
    stats: PoolStats,
}

/// Two bounded pools with single-flight per key; see the module documentation.
pub struct ComputePool<E> {
    read: rayon::ThreadPool,
    background: rayon::ThreadPool,
    shared: Arc<Shared<E>>,
}

impl<E> std::fmt::Debug for ComputePool<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ComputePool").field("threads", &self.read.current_num_threads()).field("in_flight", &self.in_flight()).finish()
    }
}

/// Lower the calling thread's CPU priority by `nice` and optionally put it in the idle I/O
/// class (both are per thread on Linux).
pub(crate) fn deprioritise_this_thread(nice: i32, idle_io: bool) {
    if nice > 0 {
        // SAFETY: nice() only changes the calling thread's niceness; errors are harmless.
        unsafe { libc::nice(nice) };
    }
    if idle_io {
        const IOPRIO_WHO_PROCESS: libc::c_long = 1;
        const IOPRIO_CLASS_IDLE: libc::c_long = 3;
        // SAFETY: ioprio_set with who = 0 changes the calling thread's I/O priority only.
        unsafe { libc::syscall(libc::SYS_ioprio_set, IOPRIO_WHO_PROCESS, 0 as libc::c_long, IOPRIO_CLASS_IDLE << 13) };
    }
}

fn build_pool(name: &'static str, threads: usize, nice: i32, idle_io: bool) -> Result<rayon::ThreadPool, rayon::ThreadPoolBuildError> {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads.max(1))
        .thread_name(move |i| format!("{name}-{i}"))
        .start_handler(move |_| deprioritise_this_thread(nice, idle_io))
        .build()
}

impl<E> ComputePool<E> {
    pub fn stats(&self) -> &PoolStats {
        &self.shared.stats
    }

    /// Jobs queued or running.
    pub fn in_flight(&self) -> usize {
        self.shared.flights.lock().len()
    }

    pub fn threads(&self) -> usize {
        self.read.current_num_threads()
    }
}

impl<E: From<Panicked> + Send + Sync + 'static> ComputePool<E> {
    pub fn new(cfg: &PoolConfig) -> Result<Self, rayon::ThreadPoolBuildError> {
        Ok(ComputePool {
            read: build_pool("xpackfs-compute", cfg.threads, cfg.read_nice, false)?,
            background: build_pool("xpackfs-background", cfg.threads, cfg.background_nice, cfg.background_idle_io)?,
            shared: Arc::new(Shared { flights: Mutex::new(HashMap::new()), stats: PoolStats::default() }),
        })
    }

    /// Run `f` on one of the pool's threads (its `par_iter`s on that pool) and wait: `warm`
    /// and `materialize` drive their parallel loops this way, so the jobs they request run
    /// inline on the thread that asks.
    pub fn install<R: Send>(&self, prio: Priority, f: impl FnOnce() -> R + Send) -> R {
        self.pool(prio).install(f)
    }

    fn pool(&self, prio: Priority) -> &rayon::ThreadPool {
        match prio {
            Priority::Read => &self.read,
            Priority::Background => &self.background,
        }
    }

    fn on_pool_thread(&self) -> Option<Priority> {
        if self.read.current_thread_index().is_some() {
            Some(Priority::Read)
        } else if self.background.current_thread_index().is_some() {
            Some(Priority::Background)
        } else {
            None
        }
    }

    /// The job for `key` (joining one in flight, else starting `job` at `prio`), waited for.
    /// Called from one of the pool's own threads, it runs the job there instead of queueing
    /// it behind itself.
    pub fn get(&self, key: DiskKey, prio: Priority, job: &Job<E>, after: Option<After>) -> Outcome<E> {
        self.wait(key, prio, job, after, false)
    }

    /// Like [`ComputePool::get`], and waits for the write-behind too (`warm`: an entry is
    /// on disk when it returns).
    pub fn get_settled(&self, key: DiskKey, prio: Priority, job: &Job<E>, after: Option<After>) -> Outcome<E> {
        self.wait(key, prio, job, after, true)
    }

    fn wait(&self, key: DiskKey, prio: Priority, job: &Job<E>, after: Option<After>, settled: bool) -> Outcome<E> {
        let inline = self.on_pool_thread();
        let f = self.submit(key, prio, job, after, inline.is_none());
        if let Some(p) = inline {
            run(&self.shared, &f, p);
        }
        let mut st = f.st.lock();
        while st.outcome.is_none() || (settled && !st.settled) {
            f.cv.wait(&mut st);
        }
        st.outcome.clone().unwrap()
    }

    /// Like [`ComputePool::get`] without waiting: `done` gets the outcome (on a pool
    /// thread, or here if it is already known).
    pub fn request(&self, key: DiskKey, prio: Priority, job: &Job<E>, after: Option<After>, done: impl FnOnce(&Outcome<E>) + Send + 'static) {
        let f = self.submit(key, prio, job, after, true);
        let mut st = f.st.lock();
        match st.outcome.clone() {
            Some(o) => {
                drop(st);
                done(&o);
            }
            None => st.done.push(Box::new(done)),
        }
    }

    /// Whether a job for `key` is queued or running.
    pub fn is_in_flight(&self, key: &DiskKey) -> bool {
        self.shared.flights.lock().contains_key(key)
    }

    /// If a background job for `key` is in flight, give it a run at read priority (a reader
    /// is about to wait for it, perhaps through another cache's single-flight).
    pub fn promote(&self, key: &DiskKey) {
        let f = self.shared.flights.lock().get(key).cloned();
        if let Some(f) = f {
            self.want_read(&f);
        }
    }

    fn submit(&self, key: DiskKey, prio: Priority, job: &Job<E>, after: Option<After>, schedule: bool) -> Arc<Flight<E>> {
        let mut flights = self.shared.flights.lock();
        if let Some(f) = flights.get(&key).cloned() {
            drop(flights);
            self.shared.stats.joined.fetch_add(1, Relaxed);
            if prio == Priority::Read {
                self.want_read(&f);
            }
            return f;
        }
        let f = Arc::new(Flight {
            key,
            job: job.clone(),
            st: Mutex::new(State { outcome: None, running: None, read_scheduled: prio == Priority::Read, read_joined: false, settled: false, after, done: Vec::new() }),
            cv: Condvar::new(),
        });
        flights.insert(key, f.clone());
        drop(flights);
        if schedule {
            self.spawn(&f, prio);
        }
        f
    }

    fn want_read(&self, f: &Arc<Flight<E>>) {
        let mut st = f.st.lock();
        st.read_joined = true;
        if st.outcome.is_some() || st.read_scheduled {
            return;
        }
        st.read_scheduled = true;
        let stat = if st.running.is_some() { &self.shared.stats.hedged } else { &self.shared.stats.promoted };
        stat.fetch_add(1, Relaxed);
        drop(st);
        self.spawn(f, Priority::Read);
    }

    fn spawn(&self, f: &Arc<Flight<E>>, prio: Priority) {
        let (shared, f) = (self.shared.clone(), f.clone());
        self.pool(prio).spawn_fifo(move || run(&shared, &f, prio));
    }
}

/// One run of a flight's job at `prio`, unless it is done or already running at `prio` or
/// higher.
fn run<E: From<Panicked> + Send + Sync + 'static>(shared: &Shared<E>, f: &Arc<Flight<E>>, prio: Priority) {
    {
        let mut st = f.st.lock();
        let go = st.outcome.is_none()
            && match st.running {
                None => true,
                Some(Priority::Background) => prio == Priority::Read,
                Some(Priority::Read) => false,
            };
        if !go {
            return;
        }
        st.running = Some(prio);
    }
    let stat = if prio == Priority::Read { &shared.stats.runs_read } else { &shared.stats.runs_background };
    stat.fetch_add(1, Relaxed);
    let out = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (f.job)())) {
        Ok(Ok(parts)) => Ok(parts),
        Ok(Err(e)) => {
            shared.stats.failed.fetch_add(1, Relaxed);
            Err(Arc::new(e))
        }
        Err(panic) => {
            shared.stats.panics.fetch_add(1, Relaxed);
            let msg = panic.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| panic.downcast_ref::<String>().cloned()).unwrap_or_default();
            Err(Arc::new(E::from(Panicked(msg))))
        }
    };
    let (done, after, read_joined) = {
        let mut st = f.st.lock();
        if st.outcome.is_some() {
            shared.stats.wasted.fetch_add(1, Relaxed);
            return;
        }
        st.outcome = Some(out.clone());
        f.cv.notify_all();
        (std::mem::take(&mut st.done), st.after.take(), st.read_joined)
    };
    for d in done {
        d(&out);
    }
    if let (Ok(parts), Some(after)) = (&out, after) {
        // Write-behind. Until it is done the flight stays findable (with its outcome), so
        // nobody recomputes a chunk that is on its way into the caches.
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| after(parts, read_joined))).is_err() {
            tracing::error!("write-behind of a computed chunk panicked");
        }
    }
    f.st.lock().settled = true;
    f.cv.notify_all();
    let mut flights = shared.flights.lock();
    if flights.get(&f.key).is_some_and(|g| Arc::ptr_eq(g, f)) {
        flights.remove(&f.key);
    }
}

/// What one job computes: one chunk or several siblings, each with its memory and disk key.
pub struct Group<E> {
    /// The job's key in the pool: for one chunk, its disk key.
    pub key: DiskKey,
    /// (memory key, disk key) of each part, in the job's output order.
    pub parts: Vec<(cache::Key, DiskKey)>,
    pub job: Job<E>,
    /// Kept on disk too (off for chunks that are source bytes served after a check: the
    /// source is their durable copy).
    pub persist: bool,
}

impl<E> std::fmt::Debug for Group<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Group({:?}, {} parts)", self.key, self.parts.len())
    }
}

impl<E: ChunkError> Group<E> {
    /// One chunk computed by `compute`.
    pub fn single<V: Into<Arc<[u8]>>>(mem: cache::Key, disk: DiskKey, compute: impl Fn() -> Result<V, E> + Send + Sync + 'static) -> Self {
        Group { key: disk, parts: vec![(mem, disk)], job: Arc::new(move || Ok(Arc::from([compute()?.into()]))), persist: true }
    }

    /// Sibling chunks computed together by `compute` (its output in `parts` order).
    pub fn siblings(key: DiskKey, parts: Vec<(cache::Key, DiskKey)>, compute: impl Fn() -> Result<Vec<Arc<[u8]>>, E> + Send + Sync + 'static) -> Self {
        Group { key, parts, job: Arc::new(move || Ok(Arc::from(compute()?))), persist: true }
    }

    /// Kept in memory only.
    pub fn memory_only(mut self) -> Self {
        self.persist = false;
        self
    }
}

/// Whether [`Tiers::warm`] found a group on disk already or computed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Warmed {
    Present,
    Computed,
}

/// Options of the chunk tiers (flattened into the views' options): the disk cache, its
/// bound, prewarming and the compute pool's size.
#[derive(Debug, Clone, clap::Args)]
#[group(id = "tiers")]
pub struct Options {
    /// Directory of the persistent cache of computed chunks, shared by every mount, `warm` and
    /// `materialize` that name it (off unless given)
    #[arg(long, value_name = "DIR", help_heading = "Chunk caches")]
    pub disk_cache: Option<PathBuf>,
    /// Size bound of the disk cache in GiB, fractions allowed (default: 256, less where that
    /// would leave under 5% of its filesystem free)
    #[arg(long, value_name = "GIB", value_parser = gib, help_heading = "Chunk caches")]
    pub disk_cache_gb: Option<f64>,
    /// on|off: a mount computes every chunk ahead into the disk cache, in the background at
    /// low priority, yielding to reads (needs disk_cache)
    #[arg(long, default_value = "off", value_parser = switch, action = clap::ArgAction::Set, help_heading = "Chunk caches")]
    pub prewarm: bool,
    /// on|off: files of a computed view are also kept whole in the disk cache (after `warm`,
    /// or once a mount read every chunk of one), and a mount hands those to the kernel (FUSE
    /// passthrough, as root): reads at local-disk speed. Costs the file's bytes again on disk
    #[arg(long, default_value = "on", value_parser = switch, action = clap::ArgAction::Set, help_heading = "Chunk caches")]
    pub disk_cache_files: bool,
    /// Threads that compute chunks (default: the CPU count)
    #[arg(long, value_parser = int_in::<usize>(1, 1024), help_heading = "Chunk caches")]
    pub compute_threads: Option<usize>,
}

fn gib(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 && v <= (1u64 << 20) as f64 => Ok(v),
        _ => Err(format!("{s:?} must be a number of GiB above 0 and at most 1048576")),
    }
}

/// The default bound of a disk cache: enough for the largest computed view of a current
/// checkpoint (the requant view of V4.1-Flash is about 143 GiB) with room for a second one.
pub const DEFAULT_DISK_CACHE_GIB: u64 = 256;
/// Without an explicit bound, the cache never grows into this fraction of its filesystem.
const KEEP_FREE: f64 = 0.05;

/// Free and total bytes of the filesystem holding `path` (or its nearest existing ancestor).
fn space(path: &Path) -> Option<(u64, u64)> {
    let mut p = path;
    while !p.exists() {
        p = p.parent()?;
    }
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).ok()?;
    // SAFETY: statvfs is plain old data, for which all zeros is a valid value.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a NUL-terminated path and `st` a valid statvfs to fill.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    Some((st.f_bavail as u64 * st.f_frsize as u64, st.f_blocks as u64 * st.f_frsize as u64))
}

impl Options {
    /// The disk cache these options name, opened (never an error: see [`DiskCache::open`]).
    pub fn open_disk_cache(&self) -> Option<DiskCache> {
        let dir = self.disk_cache.as_ref()?;
        let explicit = self.disk_cache_gb.map(|g| (g * (1u64 << 30) as f64) as u64);
        let mut disk = DiskCache::open(DiskCacheConfig::new(dir, explicit.unwrap_or(DEFAULT_DISK_CACHE_GIB << 30)));
        if explicit.is_none()
            && let Some((free, total)) = space(dir)
        {
            let room = (free + disk.size_bytes()).saturating_sub((total as f64 * KEEP_FREE) as u64);
            if room < disk.budget() {
                tracing::info!("disk cache {}: bound {:.1} GiB (keeps 5% of its filesystem free; disk_cache_gb= sets it)", dir.display(), room as f64 / (1u64 << 30) as f64);
                disk.set_budget(room);
            }
        }
        Some(disk)
    }
}

/// Memory, disk, compute pool: the lookup chunk producers call (see the module
/// documentation). `E`: the error of the computations (the views' error).
pub struct Tiers<E> {
    pub mem: Arc<ChunkCache<E>>,
    pub disk: Option<Arc<DiskCache>>,
    pub pool: Arc<ComputePool<E>>,
    prefetch: SyncSender<(Arc<Group<E>>, usize, Priority)>,
    /// Parts (group, index) queued or running as prefetches (a sequential reader asks for
    /// the next chunk on every read of the current one: asked once).
    prefetching: Mutex<HashSet<(DiskKey, usize)>>,
    pub prefetch_requested: AtomicU64,
    pub prefetch_dropped: AtomicU64,
}

impl<E> std::fmt::Debug for Tiers<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tiers").field("mem", &self.mem).field("disk", &self.disk).field("pool", &self.pool).finish()
    }
}

/// Prefetch driver threads (they only wait) and queued prefetches; more are dropped.
const PREFETCH_DRIVERS: usize = 4;
const PREFETCH_QUEUE: usize = 64;

/// The compute pool's counters at one moment, for `.xpackfs/stats.json`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ComputeSnapshot {
    pub threads: usize,
    pub in_flight: usize,
    pub runs_read: u64,
    pub runs_background: u64,
    pub joined: u64,
    pub promoted: u64,
    pub hedged: u64,
    pub wasted: u64,
    pub failed: u64,
    pub panics: u64,
    /// Prefetches queued or running now, asked for in all, and dropped (queue full).
    pub prefetch_queued: usize,
    pub prefetch_requested: u64,
    pub prefetch_dropped: u64,
}

impl<E: ChunkError> Tiers<E> {
    pub fn new(mem: Arc<ChunkCache<E>>, disk: Option<Arc<DiskCache>>, pool: Arc<ComputePool<E>>) -> Arc<Self> {
        let (tx, rx) = sync_channel::<(Arc<Group<E>>, usize, Priority)>(PREFETCH_QUEUE);
        let tiers = Arc::new(Tiers { mem, disk, pool, prefetch: tx, prefetching: Mutex::new(HashSet::new()), prefetch_requested: AtomicU64::new(0), prefetch_dropped: AtomicU64::new(0) });
        let rx = Arc::new(Mutex::new(rx));
        for i in 0..PREFETCH_DRIVERS {
            let (rx, weak) = (rx.clone(), Arc::downgrade(&tiers));
            let spawned = std::thread::Builder::new().name(format!("xpackfs-prefetch-{i}")).spawn(move || {
                loop {
                    let Ok((group, idx, prio)) = rx.lock().recv() else { return };
                    // Ends with the last user of the tiers (the sender goes with them).
                    let Some(tiers) = weak.upgrade() else { return };
                    let _ = tiers.get(&group, idx, prio);
                    tiers.prefetching.lock().remove(&(group.key, idx));
                }
            });
            if let Err(e) = spawned {
                tracing::warn!("cannot start a prefetch thread: {e}");
            }
        }
        tiers
    }

    /// The tiers `opts` describe over a memory cache of `mem_bytes`: one per process.
    pub fn from_options(mem_bytes: usize, opts: &Options) -> Result<Arc<Self>, E> {
        let mut cfg = PoolConfig::default();
        if let Some(n) = opts.compute_threads {
            cfg.threads = n;
        }
        let pool = ComputePool::new(&cfg).map_err(|e| E::internal(format!("cannot start the compute pool: {e}")))?;
        Ok(Tiers::new(Arc::new(ChunkCache::new(mem_bytes)), opts.open_disk_cache().map(Arc::new), Arc::new(pool)))
    }

    /// Part `idx` of `group`: from memory, else from disk, else computed on the pool at
    /// `prio` (this thread waits for this group only), then kept in memory and on disk.
    pub fn get(&self, group: &Arc<Group<E>>, idx: usize, prio: Priority) -> Result<Arc<[u8]>, E> {
        let (mem_key, disk_key) = *group.parts.get(idx).ok_or_else(|| E::internal(format!("{group:?} has no part {idx}")))?;
        if let Some(bytes) = self.mem.get(&mem_key) {
            return Ok(bytes);
        }
        if prio == Priority::Read {
            // A prefetch may be computing it at background priority (and hold the memory
            // cache's single-flight): have it run at read priority for this reader.
            self.pool.promote(&group.key);
        }
        self.mem.get_or_load(mem_key, || self.load(group, idx, disk_key, prio))
    }

    /// Whether part `idx` of `group` is in memory now (a read of it will not wait).
    pub fn in_memory(&self, mem_key: &cache::Key) -> bool {
        self.mem.peek(mem_key)
    }

    fn disk(&self, group: &Group<E>) -> Option<&Arc<DiskCache>> {
        self.disk.as_ref().filter(|_| group.persist)
    }

    fn load(&self, group: &Arc<Group<E>>, idx: usize, disk_key: DiskKey, prio: Priority) -> Result<(Arc<[u8]>, Origin), E> {
        if let Some(bytes) = self.disk(group).and_then(|d| d.get(&disk_key)) {
            return Ok((bytes, Origin::Disk));
        }
        let parts = self.pool.get(group.key, prio, &group.job, Some(self.write_behind(group, true))).map_err(E::shared)?;
        let bytes = parts.get(idx).cloned().ok_or_else(|| E::internal(format!("{group:?} computed {} parts", parts.len())))?;
        // The job's write-behind counts (and keeps) every part it computed.
        Ok((bytes, Origin::Counted))
    }

    /// Every part counted as computed and onto disk; into memory too when `to_memory` or a
    /// reader joined (warming alone does not push readers' chunks out of memory).
    fn write_behind(&self, group: &Arc<Group<E>>, to_memory: bool) -> After {
        let (mem, disk, group) = (self.mem.clone(), self.disk(group).cloned(), group.clone());
        Box::new(move |parts: &Parts, read_joined| {
            if parts.len() != group.parts.len() {
                tracing::error!("{group:?}: its job computed {} parts; not cached", parts.len());
                return;
            }
            for ((m, _), bytes) in group.parts.iter().zip(parts.iter()) {
                if to_memory || read_joined {
                    mem.put(*m, bytes.clone(), Origin::Computed);
                } else {
                    mem.record(bytes.len(), Origin::Computed);
                }
            }
            if let Some(disk) = &disk {
                for ((_, d), bytes) in group.parts.iter().zip(parts.iter()) {
                    disk.put(d, bytes);
                }
            }
        })
    }

    /// Bring part `idx` of `group` into memory without waiting for it, unless it is there or
    /// on its way, if there is room in the prefetch queue (a prefetch is a hint: dropped when
    /// the queue is full). `prio`: [`Priority::Read`] for a reader's read-ahead (the chunks
    /// it asks for next: a background run would be hedged by its read and computed twice),
    /// [`Priority::Background`] for work no reader waits for. A read-priority prefetch of a
    /// group whose job is already in flight (a prewarm's, say) leaves it alone: joining it
    /// would hedge it, and the reader promotes it if it comes to wait for it.
    pub fn prefetch(&self, group: &Arc<Group<E>>, idx: usize, prio: Priority) {
        let Some((mem_key, _)) = group.parts.get(idx) else { return };
        if self.mem.peek(mem_key) || (prio == Priority::Read && self.pool.is_in_flight(&group.key)) {
            return;
        }
        if !self.prefetching.lock().insert((group.key, idx)) {
            return;
        }
        self.prefetch_requested.fetch_add(1, Relaxed);
        if self.prefetch.try_send((group.clone(), idx, prio)).is_err() {
            self.prefetching.lock().remove(&(group.key, idx));
            self.prefetch_dropped.fetch_add(1, Relaxed);
        }
    }

    /// Make sure every part of `group` is on disk (`lens`: their lengths, for the cheap
    /// presence check that makes warming resumable), computing it at `prio` if not.
    pub fn warm(&self, group: &Arc<Group<E>>, lens: &[u64], prio: Priority) -> Result<Warmed, E> {
        if !group.persist {
            return Ok(Warmed::Present); // its bytes are the source's
        }
        let disk = self.disk.as_ref().ok_or_else(|| E::option("disk_cache", "warming needs a disk cache".into()))?;
        if lens.len() == group.parts.len() && group.parts.iter().zip(lens).all(|((_, d), len)| disk.contains(d, *len)) {
            return Ok(Warmed::Present);
        }
        self.pool.get_settled(group.key, prio, &group.job, Some(self.write_behind(group, false))).map_err(E::shared)?;
        Ok(Warmed::Computed)
    }

    pub fn compute_snapshot(&self) -> ComputeSnapshot {
        let s = self.pool.stats();
        ComputeSnapshot {
            threads: self.pool.threads(),
            in_flight: self.pool.in_flight(),
            runs_read: s.runs_read.load(Relaxed),
            runs_background: s.runs_background.load(Relaxed),
            joined: s.joined.load(Relaxed),
            promoted: s.promoted.load(Relaxed),
            hedged: s.hedged.load(Relaxed),
            wasted: s.wasted.load(Relaxed),
            failed: s.failed.load(Relaxed),
            panics: s.panics.load(Relaxed),
            prefetch_queued: self.prefetching.lock().len(),
            prefetch_requested: self.prefetch_requested.load(Relaxed),
            prefetch_dropped: self.prefetch_dropped.load(Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::disk::KeyBuilder;
    use crate::store::error::TestError;
    use std::sync::atomic::AtomicUsize;
    use std::time::Duration;

    /// A latch the tests open when they are ready.
    #[derive(Default)]
    struct Gate(Mutex<bool>, Condvar);
    impl Gate {
        fn open(&self) {
            *self.0.lock() = true;
            self.1.notify_all();
        }
        fn wait(&self) {
            let mut g = self.0.lock();
            while !*g {
                self.1.wait(&mut g);
            }
        }
    }

    fn key(i: u64) -> DiskKey {
        KeyBuilder::new("compute-test").producer().chunk(i)
    }

    fn pool(threads: usize) -> Arc<ComputePool<TestError>> {
        Arc::new(ComputePool::new(&PoolConfig { threads, ..PoolConfig::default() }).unwrap())
    }

    fn bytes(v: &[u8]) -> Parts {
        Arc::from([Arc::<[u8]>::from(v)])
    }

    fn job(f: impl Fn() -> Result<Parts, TestError> + Send + Sync + 'static) -> Job<TestError> {
        Arc::new(f)
    }

    /// Run `f` on a thread and fail (instead of hanging) if it does not finish in time.
    fn within<R: Send + 'static>(what: &str, f: impl FnOnce() -> R + Send + 'static) -> R {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(f());
        });
        rx.recv_timeout(Duration::from_secs(60)).unwrap_or_else(|_| panic!("{what}: still waiting after 60 s"))
    }

    fn settle(p: &ComputePool<TestError>) {
        let t = std::time::Instant::now();
        while p.in_flight() > 0 && t.elapsed() < Duration::from_secs(60) {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(p.in_flight(), 0);
    }

    fn on_background_thread() -> bool {
        std::thread::current().name().is_some_and(|n| n.starts_with("xpackfs-background"))
    }

    #[test]
    fn one_computation_per_key_shared_by_every_waiter() {
        let p = pool(2);
        let calls = Arc::new(AtomicUsize::new(0));
        let c = calls.clone();
        let j = job(move || {
            c.fetch_add(1, Relaxed);
            std::thread::sleep(Duration::from_millis(50));
            Ok(bytes(b"chunk"))
        });
        let results: Vec<Parts> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..8).map(|_| s.spawn(|| p.get(key(1), Priority::Read, &j, None).unwrap())).collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(calls.load(Relaxed), 1);
        assert!(results.iter().all(|r| Arc::ptr_eq(r, &results[0]) && &*r[0] == b"chunk"));
        assert!(p.stats().joined.load(Relaxed) >= 1);
        settle(&p);
    }

    #[test]
    fn errors_and_panics_reach_every_waiter_and_are_not_kept() {
        let p = pool(2);
        let e = p.get(key(1), Priority::Read, &job(|| Err(TestError::Failed("t: bad".into()))), None).unwrap_err();
        assert!(matches!(&*e, TestError::Failed(why) if why == "t: bad"));
        settle(&p);
        let e = p.get(key(1), Priority::Background, &job(|| panic!("boom")), None).unwrap_err();
        assert!(e.to_string().contains("panicked: boom"), "{e}");
        settle(&p);
        assert_eq!(&*p.get(key(1), Priority::Read, &job(|| Ok(bytes(b"ok"))), None).unwrap()[0], b"ok");
        assert_eq!((p.stats().failed.load(Relaxed), p.stats().panics.load(Relaxed)), (1, 1));
    }

    #[test]
    fn reads_do_not_wait_behind_background_work() {
        let p = pool(2);
        let gate = Arc::new(Gate::default());
        for i in 0..6 {
            let g = gate.clone();
            p.request(key(100 + i), Priority::Background, &job(move || {
                g.wait();
                Ok(bytes(b"slow"))
            }), None, |_| {});
        }
        let p2 = p.clone();
        let got = within("a read behind six blocked background jobs", move || p2.get(key(1), Priority::Read, &job(|| Ok(bytes(b"fast"))), None));
        assert_eq!(&*got.unwrap()[0], b"fast");
        gate.open();
        settle(&p);
    }

    #[test]
    fn a_read_promotes_a_queued_background_job() {
        let p = pool(2);
        let gate = Arc::new(Gate::default());
        for i in 0..2 {
            let g = gate.clone();
            p.request(key(100 + i), Priority::Background, &job(move || {
                g.wait();
                Ok(bytes(b"blocker"))
            }), None, |_| {});
        }
        let calls = Arc::new(AtomicUsize::new(0));
        let c = calls.clone();
        let j = job(move || {
            c.fetch_add(1, Relaxed);
            Ok(bytes(b"wanted"))
        });
        p.request(key(1), Priority::Background, &j, None, |_| {}); // queued behind the blockers
        let (p2, j2) = (p.clone(), j.clone());
        let got = within("a read of a queued background job", move || p2.get(key(1), Priority::Read, &j2, None));
        assert_eq!(&*got.unwrap()[0], b"wanted");
        assert_eq!(p.stats().promoted.load(Relaxed), 1);
        gate.open();
        settle(&p);
        assert_eq!(calls.load(Relaxed), 1, "the queued background run must not run again");
    }

    #[test]
    fn a_read_hedges_a_running_background_job() {
        let p = pool(2);
        let gate = Arc::new(Gate::default());
        let started = Arc::new(Gate::default());
        let calls = Arc::new(AtomicUsize::new(0));
        let (g, s, c) = (gate.clone(), started.clone(), calls.clone());
        let j = job(move || {
            c.fetch_add(1, Relaxed);
            if on_background_thread() {
                s.open();
                g.wait();
                return Ok(bytes(b"late"));
            }
            Ok(bytes(b"hedged"))
        });
        p.request(key(1), Priority::Background, &j, None, |_| {});
        started.wait();
        let (p2, j2) = (p.clone(), j.clone());
        let got = within("a read of a running background job", move || p2.get(key(1), Priority::Read, &j2, None));
        assert_eq!(&*got.unwrap()[0], b"hedged");
        assert_eq!(p.stats().hedged.load(Relaxed), 1);
        gate.open();
        let t = std::time::Instant::now();
        while p.stats().wasted.load(Relaxed) == 0 && t.elapsed() < Duration::from_secs(60) {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!((calls.load(Relaxed), p.stats().wasted.load(Relaxed)), (2, 1));
    }

    #[test]
    fn write_behind_runs_once_after_waiters_are_woken() {
        let p = pool(2);
        let gate = Arc::new(Gate::default());
        let (afters, calls) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let c = calls.clone();
        let j = job(move || {
            c.fetch_add(1, Relaxed);
            Ok(bytes(b"x"))
        });
        let after = |g: Arc<Gate>, a: Arc<AtomicUsize>| -> After {
            Box::new(move |_, _| {
                g.wait();
                a.fetch_add(1, Relaxed);
            })
        };
        let (p2, j2, a) = (p.clone(), j.clone(), after(gate.clone(), afters.clone()));
        within("a waiter while the write-behind is blocked", move || p2.get(key(1), Priority::Read, &j2, Some(a))).unwrap();
        // While the write-behind runs, the key is not computed again.
        let (p2, j2, a) = (p.clone(), j.clone(), after(gate.clone(), afters.clone()));
        within("a second request during the write-behind", move || p2.get(key(1), Priority::Read, &j2, Some(a))).unwrap();
        assert_eq!(calls.load(Relaxed), 1);
        gate.open();
        settle(&p);
        assert_eq!(afters.load(Relaxed), 1, "a joiner's write-behind is not run again");
    }

    #[test]
    fn requests_call_back_and_nested_gets_run_inline() {
        let p = pool(1);
        let (tx, rx) = std::sync::mpsc::channel();
        p.request(key(1), Priority::Read, &job(|| Ok(bytes(b"cb"))), None, move |o| tx.send(o.as_ref().map(|v| v[0].to_vec()).ok()).unwrap());
        assert_eq!(rx.recv_timeout(Duration::from_secs(60)).unwrap().unwrap(), b"cb");
        // A job that needs another key, on a one-thread pool: run inline, not queued behind itself.
        let inner = p.clone();
        let outer = job(move || {
            let v = inner.get(key(3), Priority::Read, &job(|| Ok(bytes(b"inner"))), None).map_err(TestError::Shared)?;
            Ok(bytes(&[&v[0][..], b"+outer"].concat()))
        });
        let p2 = p.clone();
        let got = within("a nested get on a one-thread pool", move || p2.get(key(2), Priority::Read, &outer, None));
        assert_eq!(&*got.unwrap()[0], b"inner+outer");
    }

    #[test]
    fn background_threads_run_niced() {
        let p = pool(1);
        let nice = || {
            // SAFETY: getpriority has no memory preconditions; who = 0 is the calling thread.
            let n = unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) };
            Ok(bytes(&n.to_le_bytes()))
        };
        let read = p.get(key(1), Priority::Read, &job(nice), None).unwrap();
        let bg = p.get(key(2), Priority::Background, &job(nice), None).unwrap();
        let n = |v: &Parts| i32::from_le_bytes(v[0][..4].try_into().unwrap());
        assert!(n(&bg) >= (n(&read) + 19).min(19), "background nice {} vs read {}", n(&bg), n(&read));
    }

    // --- the tiers ---

    struct Fixture {
        dir: tempfile::TempDir,
        calls: Arc<AtomicUsize>,
    }

    impl Fixture {
        fn new() -> Fixture {
            Fixture { dir: tempfile::tempdir().unwrap(), calls: Arc::new(AtomicUsize::new(0)) }
        }

        /// A fresh process: new memory cache and pool over the same disk directory.
        fn tiers(&self) -> Arc<Tiers<TestError>> {
            let mut cfg = DiskCacheConfig::new(self.dir.path(), 1 << 30);
            cfg.touch_interval = Duration::ZERO;
            Tiers::new(Arc::new(ChunkCache::new(1 << 20)), Some(Arc::new(DiskCache::open(cfg))), pool(2))
        }

        /// Chunk `id` of producer 1: 1000 bytes that depend on `id`.
        fn chunk(&self, id: u64) -> Arc<Group<TestError>> {
            let calls = self.calls.clone();
            Arc::new(Group::single((7, id), key(id), move || {
                calls.fetch_add(1, Relaxed);
                Ok((0..1000u32).map(|i| (i as u64 * 7 + id) as u8).collect::<Vec<u8>>())
            }))
        }
    }

    fn expect(id: u64) -> Vec<u8> {
        (0..1000u32).map(|i| (i as u64 * 7 + id) as u8).collect()
    }

    #[test]
    fn memory_then_disk_then_compute_with_write_behind() {
        let fx = Fixture::new();
        let t = fx.tiers();
        let g = fx.chunk(3);
        assert_eq!(&*t.get(&g, 0, Priority::Read).unwrap(), &expect(3)[..]);
        assert_eq!(fx.calls.load(Relaxed), 1);
        settle(&t.pool);
        assert_eq!(t.mem.stats.bytes_computed.load(Relaxed), 1000, "computed bytes counted once");
        assert_eq!(&*t.get(&g, 0, Priority::Read).unwrap(), &expect(3)[..]);
        assert_eq!((fx.calls.load(Relaxed), t.mem.stats.hits.load(Relaxed)), (1, 1));
        let d = t.disk.as_ref().unwrap().snapshot();
        assert_eq!((d.writes, d.hits), (1, 0));

        // Restart: served from disk, nothing computed, nothing counted as computed.
        let t2 = fx.tiers();
        assert_eq!(&*t2.get(&fx.chunk(3), 0, Priority::Read).unwrap(), &expect(3)[..]);
        assert_eq!(fx.calls.load(Relaxed), 1);
        assert_eq!(t2.mem.stats.bytes_computed.load(Relaxed), 0);
        assert_eq!(t2.disk.as_ref().unwrap().snapshot().hits, 1);

        // A damaged entry: recomputed, right bytes, rewritten.
        let path = t2.disk.as_ref().unwrap().config().dir.join("entries").join(&key(3).hex()[..2]).join(key(3).hex());
        let mut raw = std::fs::read(&path).unwrap();
        raw[100] ^= 1;
        std::fs::write(&path, raw).unwrap();
        let t3 = fx.tiers();
        assert_eq!(&*t3.get(&fx.chunk(3), 0, Priority::Read).unwrap(), &expect(3)[..]);
        assert_eq!(fx.calls.load(Relaxed), 2);
        assert_eq!(t3.disk.as_ref().unwrap().snapshot().corrupt, 1);
        settle(&t3.pool);
        assert_eq!(t3.disk.as_ref().unwrap().snapshot().writes, 1);
    }

    #[test]
    fn siblings_are_computed_once_and_each_kept() {
        let fx = Fixture::new();
        let group = |calls: Arc<AtomicUsize>| {
            Arc::new(Group::siblings(key(1000), (0..3).map(|i| ((9, i), key(2000 + i))).collect(), move || {
                calls.fetch_add(1, Relaxed);
                Ok((0..3u8).map(|i| Arc::from(vec![i; 100 + i as usize])).collect())
            }))
        };
        let t = fx.tiers();
        let g = group(fx.calls.clone());
        assert_eq!(&*t.get(&g, 1, Priority::Read).unwrap(), &[1u8; 101][..]);
        settle(&t.pool);
        for i in 0..3 {
            assert_eq!(&*t.get(&g, i, Priority::Read).unwrap(), &vec![i as u8; 100 + i][..]);
        }
        assert_eq!(fx.calls.load(Relaxed), 1);
        assert_eq!(t.mem.stats.bytes_computed.load(Relaxed), 303);
        let t2 = fx.tiers();
        let g2 = group(fx.calls.clone());
        for i in [2, 0, 1] {
            assert_eq!(&*t2.get(&g2, i, Priority::Read).unwrap(), &vec![i as u8; 100 + i][..]);
        }
        assert_eq!(fx.calls.load(Relaxed), 1);
        assert_eq!(t2.disk.as_ref().unwrap().snapshot().hits, 3);
        assert!(t2.get(&g2, 3, Priority::Read).is_err());
    }

    #[test]
    fn prefetch_fills_memory_and_a_reader_is_not_stuck_behind_it() {
        let fx = Fixture::new();
        let t = fx.tiers();
        let g = fx.chunk(5);
        t.prefetch(&g, 0, Priority::Background);
        let tt = t.clone();
        let t0 = std::time::Instant::now();
        while tt.mem.bytes() == 0 && t0.elapsed() < Duration::from_secs(60) {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(&*t.get(&g, 0, Priority::Read).unwrap(), &expect(5)[..]);
        assert_eq!(fx.calls.load(Relaxed), 1);
        assert!(t.mem.stats.hits.load(Relaxed) >= 1);

        // A prefetch stuck at background priority (it holds the memory cache's single-flight
        // for that chunk): a reader gets the chunk from a read-priority run.
        let gate = Arc::new(Gate::default());
        let (g2, calls) = (gate.clone(), fx.calls.clone());
        let slow = Arc::new(Group::single((8, 1), key(77), move || {
            calls.fetch_add(1, Relaxed);
            if on_background_thread() {
                g2.wait();
            }
            Ok(vec![42u8; 10])
        }));
        t.prefetch(&slow, 0, Priority::Background);
        while t.pool.in_flight() == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
        let (tt, s) = (t.clone(), slow.clone());
        let got = within("a read of a chunk a prefetch is computing", move || tt.get(&s, 0, Priority::Read));
        assert_eq!(&*got.unwrap(), &[42u8; 10][..]);
        gate.open();
        settle(&t.pool);
    }

    #[test]
    fn a_read_ahead_leaves_a_job_in_flight_alone() {
        let fx = Fixture::new();
        let t = fx.tiers();
        let gate = Arc::new(Gate::default());
        let (g2, calls) = (gate.clone(), fx.calls.clone());
        let slow = Arc::new(Group::single((8, 2), key(78), move || {
            calls.fetch_add(1, Relaxed);
            g2.wait();
            Ok(vec![7u8; 10])
        }));
        // A background job (as a prewarm's) is running; a reader's read-ahead asks for it.
        t.pool.request(slow.key, Priority::Background, &slow.job, None, |_| {});
        let t0 = std::time::Instant::now();
        while fx.calls.load(Relaxed) == 0 && t0.elapsed() < Duration::from_secs(60) {
            std::thread::sleep(Duration::from_millis(1));
        }
        t.prefetch(&slow, 0, Priority::Read);
        std::thread::sleep(Duration::from_millis(200));
        gate.open();
        settle(&t.pool);
        let s = t.pool.stats();
        assert_eq!((fx.calls.load(Relaxed), s.hedged.load(Relaxed), s.promoted.load(Relaxed)), (1, 0, 0), "the read-ahead ran the job again");
        // With nothing in flight it computes the chunk into memory, at read priority.
        let g = fx.chunk(6);
        t.prefetch(&g, 0, Priority::Read);
        let t0 = std::time::Instant::now();
        while !t.in_memory(&g.parts[0].0) && t0.elapsed() < Duration::from_secs(60) {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(t.in_memory(&g.parts[0].0));
        assert!(t.pool.stats().runs_read.load(Relaxed) >= 1);
    }

    #[test]
    fn warming_is_resumable_and_needs_a_disk() {
        let fx = Fixture::new();
        let t = fx.tiers();
        let groups: Vec<_> = (0..10).map(|i| fx.chunk(i)).collect();
        for g in &groups[..4] {
            assert_eq!(t.warm(g, &[1000], Priority::Background).unwrap(), Warmed::Computed);
        }
        // "Interrupted", resumed by another process: the first four are found, the rest computed.
        let t2 = fx.tiers();
        let outcomes: Vec<Warmed> = t2.pool.install(Priority::Read, || {
            use rayon::prelude::*;
            groups.par_iter().map(|g| t2.warm(g, &[1000], Priority::Read).unwrap()).collect()
        });
        assert_eq!(outcomes.iter().filter(|w| **w == Warmed::Present).count(), 4);
        assert_eq!(fx.calls.load(Relaxed), 10);
        // Then a reader computes nothing.
        let t3 = fx.tiers();
        for (i, g) in groups.iter().enumerate() {
            assert_eq!(&*t3.get(g, 0, Priority::Read).unwrap(), &expect(i as u64)[..]);
        }
        assert_eq!(fx.calls.load(Relaxed), 10);
        assert_eq!(t3.mem.stats.bytes_computed.load(Relaxed), 0);

        let memory_only = Tiers::new(Arc::new(ChunkCache::new(1 << 20)), None, pool(1));
        assert!(matches!(memory_only.warm(&groups[0], &[1000], Priority::Read).unwrap_err().root(), TestError::Option { option: "disk_cache", .. }));
        assert_eq!(&*memory_only.get(&groups[0], 0, Priority::Read).unwrap(), &expect(0)[..]);
    }

    #[test]
    fn memory_only_groups_never_touch_the_disk() {
        let fx = Fixture::new();
        let t = fx.tiers();
        let calls = fx.calls.clone();
        let g = Arc::new(
            Group::single((3, 3), key(3), move || {
                calls.fetch_add(1, Relaxed);
                Ok(vec![5u8; 64])
            })
            .memory_only(),
        );
        assert_eq!(&*t.get(&g, 0, Priority::Read).unwrap(), &[5u8; 64][..]);
        assert_eq!(t.warm(&g, &[64], Priority::Read).unwrap(), Warmed::Present);
        settle(&t.pool);
        let d = t.disk.as_ref().unwrap().snapshot();
        assert_eq!((d.writes, d.misses, d.size_bytes), (0, 0, 0));
        assert_eq!(t.mem.stats.bytes_computed.load(Relaxed), 64);
        assert_eq!(fx.calls.load(Relaxed), 1);
    }

    #[test]
    fn a_failing_chunk_reports_its_error_and_is_retried() {
        let fx = Fixture::new();
        let t = fx.tiers();
        let fail = Arc::new(AtomicUsize::new(1));
        let f = fail.clone();
        let g = Arc::new(Group::single((1, 1), key(1), move || {
            if f.fetch_sub(1, Relaxed) == 1 {
                return Err(TestError::Failed("w: non-finite".into()));
            }
            Ok(vec![1u8; 4])
        }));
        assert!(matches!(t.get(&g, 0, Priority::Read).unwrap_err().root(), TestError::Failed(_)));
        settle(&t.pool);
        assert_eq!(t.disk.as_ref().unwrap().snapshot().writes, 0);
        assert_eq!(&*t.get(&g, 0, Priority::Read).unwrap(), &[1u8; 4][..]);
    }
}
