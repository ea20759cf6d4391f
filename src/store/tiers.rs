//! The tiers: the lookup a view's chunk producer calls for a chunk, and its read-ahead.
//!
//! [`Tiers`] looks in memory ([`ChunkCache`], with its own single-flight), then in the disk
//! cache ([`DiskCache`]), then has the chunk computed on the [`ComputePool`]; a computed
//! chunk is handed to its waiters first and then written behind, on the computing thread,
//! into memory and disk. A [`Group`] is what one job computes: one chunk, or several sibling
//! chunks at once (kt-int8 computes every NUMA part's quant and scale file of one expert
//! projection together). Prefetches go through a few driver threads that only wait; a
//! read-ahead runs at read priority (a reader that caught up with a background run would
//! hedge it and compute the chunk twice), and a reader arriving for a background prefetch
//! promotes its job instead of waiting behind it. [`Tiers::warm`] makes sure a group is on
//! disk (what `warm` and `prewarm` drive). A read in a background [`ReadCtx`] (file entries
//! written behind or by a warm-up) bypasses the memory tier: it takes a chunk found there
//! without moving it in the LRU order and puts none in, so it never pushes out what clients
//! read; it joins a computation like any read, at its own priority.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::mpsc::{SyncSender, sync_channel};

use parking_lot::Mutex;

use super::ChunkError;
use super::compute::{After, ComputePool, Job, Parts, PoolConfig, Priority};
use super::ctx::ReadCtx;
use super::disk::{DiskCache, DiskKey};
use super::flight::{Flights, Joined};
use super::memory::{self as cache, ChunkCache, Origin, Tier};
use super::options::Options;

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

/// Memory, disk, compute pool: the lookup chunk producers call (see the module
/// documentation). `E`: the error of the computations (the views' error).
pub struct Tiers<E> {
    pub mem: Arc<ChunkCache<E>>,
    pub disk: Option<Arc<DiskCache>>,
    pub pool: Arc<ComputePool<E>>,
    prefetch: SyncSender<(Arc<Group<E>>, usize, ReadCtx)>,
    /// Parts (group, index) queued or running as prefetches (a sequential reader asks for
    /// the next chunk on every read of the current one: asked once).
    prefetching: Flights<(DiskKey, usize), ()>,
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
    /// How long compute runs took: upper bounds (microseconds) of the power-of-two buckets
    /// holding the median, the 99th percentile and the longest.
    pub run_p50_us: u64,
    pub run_p99_us: u64,
    pub run_max_us: u64,
}

impl<E: ChunkError> Tiers<E> {
    pub fn new(mem: Arc<ChunkCache<E>>, disk: Option<Arc<DiskCache>>, pool: Arc<ComputePool<E>>) -> Arc<Self> {
        let (tx, rx) = sync_channel::<(Arc<Group<E>>, usize, ReadCtx)>(PREFETCH_QUEUE);
        let tiers = Arc::new(Tiers {
            mem,
            disk,
            pool,
            prefetch: tx,
            prefetching: Flights::default(),
            prefetch_requested: AtomicU64::new(0),
            prefetch_dropped: AtomicU64::new(0),
        });
        let rx = Arc::new(Mutex::new(rx));
        for i in 0..PREFETCH_DRIVERS {
            let (rx, weak) = (rx.clone(), Arc::downgrade(&tiers));
            let spawned = std::thread::Builder::new().name(format!("xpackfs-prefetch-{i}")).spawn(move || {
                loop {
                    let Ok((group, idx, ctx)) = rx.lock().recv() else { return };
                    // Ends with the last user of the tiers (the sender goes with them).
                    let Some(tiers) = weak.upgrade() else { return };
                    let _ = tiers.get(&group, idx, ctx);
                    tiers.prefetching.land_key(&(group.key, idx));
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
        let disk = opts.open_disk_cache().map(Arc::new);
        if let Some(d) = &disk {
            super::fetched::install(d);
        }
        Ok(Tiers::new(Arc::new(ChunkCache::new(mem_bytes)), disk, Arc::new(pool)))
    }

    /// Part `idx` of `group`, and the tier it was found in: from memory, else from disk,
    /// else computed on the pool at `ctx.priority` (this thread waits for this group only;
    /// not at all if `ctx` may not compute: an error), then kept on disk, and in memory if
    /// `ctx` lets it in. The one read function of the tiers.
    pub fn get(&self, group: &Arc<Group<E>>, idx: usize, ctx: ReadCtx) -> Result<(Arc<[u8]>, Tier), E> {
        let prio = ctx.priority;
        let (mem_key, disk_key) = *group.parts.get(idx).ok_or_else(|| E::internal(format!("{group:?} has no part {idx}")))?;
        if !ctx.memory {
            // Memory is left as clients left it: no entry, no LRU move.
            if let Some(bytes) = self.mem.get_untouched(&mem_key) {
                return Ok((bytes, Tier::Memory));
            }
            let (bytes, origin) = self.load(group, idx, disk_key, ctx, false)?;
            self.mem.record(bytes.len(), origin);
            return Ok((bytes, origin.into()));
        }
        if let Some(bytes) = self.mem.get(&mem_key) {
            return Ok((bytes, Tier::Memory));
        }
        if prio == Priority::Read {
            // A prefetch may be computing it at background priority (and hold the memory
            // cache's single-flight): have it run at read priority for this reader.
            self.pool.promote(&group.key);
        }
        self.mem.get_or_load(mem_key, || self.load(group, idx, disk_key, ctx, true))
    }

    /// Whether part `idx` of `group` is in memory now (a read of it will not wait).
    pub fn in_memory(&self, mem_key: &cache::Key) -> bool {
        self.mem.peek(mem_key)
    }

    fn disk(&self, group: &Group<E>) -> Option<&Arc<DiskCache>> {
        self.disk.as_ref().filter(|_| group.persist)
    }

    /// Part `idx` from disk, else computed (if `ctx` allows, or the group is kept in memory
    /// only; its parts into memory too if `to_memory`).
    fn load(&self, group: &Arc<Group<E>>, idx: usize, disk_key: DiskKey, ctx: ReadCtx, to_memory: bool) -> Result<(Arc<[u8]>, Origin), E> {
        if let Some(bytes) = self.disk(group).and_then(|d| d.get(&disk_key)) {
            return Ok((bytes, Origin::Disk));
        }
        // Memory-only groups are source bytes after a check: read, whatever `ctx` says.
        if !ctx.compute && group.persist {
            return Err(E::internal(format!("{group:?}: part {idx} is in no cache, and this read computes nothing")));
        }
        let parts = self.pool.get(group.key, ctx.priority, &group.job, Some(self.write_behind(group, to_memory))).map_err(E::shared)?;
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
    /// the queue is full), read as `ctx` says. Its priority: [`Priority::Read`] for a
    /// reader's read-ahead (the chunks it asks for next: a background run would be hedged by
    /// its read and computed twice), [`Priority::Background`] for work no reader waits for.
    /// A read-priority prefetch of a group whose job is already in flight (a prewarm's, say)
    /// leaves it alone: joining it would hedge it, and the reader promotes it if it comes to
    /// wait for it.
    pub fn prefetch(&self, group: &Arc<Group<E>>, idx: usize, ctx: ReadCtx) {
        let Some((mem_key, _)) = group.parts.get(idx) else { return };
        // A prefetch brings a chunk into memory: nothing to do for a read that stays out.
        if !ctx.memory || self.mem.peek(mem_key) || (ctx.priority == Priority::Read && self.pool.is_in_flight(&group.key)) {
            return;
        }
        let Joined::Leader(flight) = self.prefetching.join((group.key, idx), || None::<std::convert::Infallible>, || ()) else { return };
        self.prefetch_requested.fetch_add(1, Relaxed);
        if self.prefetch.try_send((group.clone(), idx, ctx)).is_err() {
            self.prefetching.land(&flight);
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
            prefetch_queued: self.prefetching.len(),
            prefetch_requested: self.prefetch_requested.load(Relaxed),
            prefetch_dropped: self.prefetch_dropped.load(Relaxed),
            run_p50_us: s.run_latency.quantile(0.50),
            run_p99_us: s.run_latency.quantile(0.99),
            run_max_us: s.run_latency.quantile(1.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::compute::tests::{Gate, key, on_background_thread, pool, settle, within};
    use crate::store::disk::DiskCacheConfig;
    use crate::store::error::TestError;
    use std::sync::atomic::AtomicUsize;
    use std::time::Duration;

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
        let (bytes, tier) = t.get(&g, 0, ReadCtx::CLIENT).unwrap();
        assert_eq!((&*bytes, tier), (&expect(3)[..], Tier::Computed));
        assert_eq!(fx.calls.load(Relaxed), 1);
        settle(&t.pool);
        assert_eq!(t.mem.stats.bytes_computed.get(), 1000, "computed bytes counted once");
        let (bytes, tier) = t.get(&g, 0, ReadCtx::CLIENT).unwrap();
        assert_eq!((&*bytes, tier), (&expect(3)[..], Tier::Memory));
        assert_eq!((fx.calls.load(Relaxed), t.mem.stats.hits.get()), (1, 1));
        let d = t.disk.as_ref().unwrap().snapshot();
        assert_eq!((d.writes, d.hits), (1, 0));

        // Restart: served from disk, nothing computed, nothing counted as computed.
        let t2 = fx.tiers();
        let (bytes, tier) = t2.get(&fx.chunk(3), 0, ReadCtx::CLIENT).unwrap();
        assert_eq!((&*bytes, tier), (&expect(3)[..], Tier::Disk));
        assert_eq!(fx.calls.load(Relaxed), 1);
        assert_eq!(t2.mem.stats.bytes_computed.get(), 0);
        assert_eq!(t2.disk.as_ref().unwrap().snapshot().hits, 1);

        // A damaged entry: recomputed, right bytes, rewritten.
        let path = t2.disk.as_ref().unwrap().config().dir.join("entries").join(&key(3).hex()[..2]).join(key(3).hex());
        let mut raw = std::fs::read(&path).unwrap();
        raw[100] ^= 1;
        std::fs::write(&path, raw).unwrap();
        let t3 = fx.tiers();
        let (bytes, tier) = t3.get(&fx.chunk(3), 0, ReadCtx::CLIENT).unwrap();
        assert_eq!((&*bytes, tier), (&expect(3)[..], Tier::Computed));
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
        assert_eq!(&*t.get(&g, 1, ReadCtx::CLIENT).unwrap().0, &[1u8; 101][..]);
        settle(&t.pool);
        for i in 0..3 {
            assert_eq!(&*t.get(&g, i, ReadCtx::CLIENT).unwrap().0, &vec![i as u8; 100 + i][..]);
        }
        assert_eq!(fx.calls.load(Relaxed), 1);
        assert_eq!(t.mem.stats.bytes_computed.get(), 303);
        let t2 = fx.tiers();
        let g2 = group(fx.calls.clone());
        for i in [2, 0, 1] {
            assert_eq!(&*t2.get(&g2, i, ReadCtx::CLIENT).unwrap().0, &vec![i as u8; 100 + i][..]);
        }
        assert_eq!(fx.calls.load(Relaxed), 1);
        assert_eq!(t2.disk.as_ref().unwrap().snapshot().hits, 3);
        assert!(t2.get(&g2, 3, ReadCtx::CLIENT).is_err());
    }

    #[test]
    fn prefetch_fills_memory_and_a_reader_is_not_stuck_behind_it() {
        let fx = Fixture::new();
        let t = fx.tiers();
        let g = fx.chunk(5);
        t.prefetch(&g, 0, ReadCtx::CLIENT.at(Priority::Background));
        let tt = t.clone();
        let t0 = std::time::Instant::now();
        while tt.mem.bytes() == 0 && t0.elapsed() < Duration::from_secs(60) {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(&*t.get(&g, 0, ReadCtx::CLIENT).unwrap().0, &expect(5)[..]);
        assert_eq!(fx.calls.load(Relaxed), 1);
        assert!(t.mem.stats.hits.get() >= 1);

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
        t.prefetch(&slow, 0, ReadCtx::CLIENT.at(Priority::Background));
        while t.pool.in_flight() == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
        let (tt, s) = (t.clone(), slow.clone());
        let got = within("a read of a chunk a prefetch is computing", move || tt.get(&s, 0, ReadCtx::CLIENT));
        assert_eq!(&*got.unwrap().0, &[42u8; 10][..]);
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
        t.prefetch(&slow, 0, ReadCtx::CLIENT);
        std::thread::sleep(Duration::from_millis(200));
        gate.open();
        settle(&t.pool);
        let s = t.pool.stats();
        assert_eq!((fx.calls.load(Relaxed), s.hedged.load(Relaxed), s.promoted.load(Relaxed)), (1, 0, 0), "the read-ahead ran the job again");
        // With nothing in flight it computes the chunk into memory, at read priority.
        let g = fx.chunk(6);
        t.prefetch(&g, 0, ReadCtx::CLIENT);
        let t0 = std::time::Instant::now();
        while !t.in_memory(&g.parts[0].0) && t0.elapsed() < Duration::from_secs(60) {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(t.in_memory(&g.parts[0].0));
        assert!(t.pool.stats().runs_read.load(Relaxed) >= 1);
    }

    /// Defect of issue 23: background reads (file entries written behind, a prewarm's) went
    /// through the memory tier like a client's, pushing out the chunks clients read.
    #[test]
    fn a_background_read_leaves_the_memory_tier_as_it_was() {
        let fx = Fixture::new();
        let mut cfg = DiskCacheConfig::new(fx.dir.path(), 1 << 30);
        cfg.touch_interval = Duration::ZERO;
        // Room for three chunks.
        let t = Tiers::new(Arc::new(ChunkCache::new(3000)), Some(Arc::new(DiskCache::open(cfg))), pool(2));
        let g: Vec<_> = (0..6).map(|i| fx.chunk(i)).collect();
        // Chunk 5 on disk only.
        assert_eq!(t.warm(&g[5], &[1000], Priority::Read).unwrap(), Warmed::Computed);
        for g in &g[1..4] {
            t.get(g, 0, ReadCtx::CLIENT).unwrap();
        }
        settle(&t.pool);
        let resident = |t: &Tiers<TestError>| (0..6).filter(|&i| t.in_memory(&g[i].parts[0].0)).collect::<Vec<_>>();
        assert_eq!(resident(&t), [1, 2, 3]);
        // Computed, read from disk, found in memory: the bytes, and memory as it was.
        for i in [0, 5, 1] {
            assert_eq!(&*t.get(&g[i], 0, ReadCtx::BACKGROUND).unwrap().0, &expect(i as u64)[..]);
        }
        settle(&t.pool);
        assert_eq!(resident(&t), [1, 2, 3], "a background read changed what memory holds");
        assert_eq!(t.mem.stats.evictions.get(), 0);
        // Chunk 1 stays the least recently used: a client's next chunk replaces it.
        t.get(&g[4], 0, ReadCtx::CLIENT).unwrap();
        settle(&t.pool);
        assert_eq!(resident(&t), [2, 3, 4], "a background hit moved a chunk in the LRU order");
        // A background prefetch brings nothing into memory.
        t.prefetch(&g[0], 0, ReadCtx::BACKGROUND);
        std::thread::sleep(Duration::from_millis(100));
        settle(&t.pool);
        assert_eq!(resident(&t), [2, 3, 4]);
        // A read that may not compute fails on a chunk in no cache, computes nothing.
        let calls = fx.calls.load(Relaxed);
        assert!(t.get(&fx.chunk(9), 0, ReadCtx::BACKGROUND.cached_only()).is_err());
        assert_eq!(&*t.get(&g[5], 0, ReadCtx::BACKGROUND.cached_only()).unwrap().0, &expect(5)[..]);
        // Memory-only chunks (source bytes after a check) are read even so, and not kept.
        let checked = Arc::new(Group::single((3, 1), key(31), || Ok(vec![9u8; 10])).memory_only());
        assert_eq!(&*t.get(&checked, 0, ReadCtx::BACKGROUND.cached_only()).unwrap().0, &[9u8; 10][..]);
        settle(&t.pool);
        assert!(!t.in_memory(&(3, 1)));
        assert_eq!(fx.calls.load(Relaxed), calls);
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
            assert_eq!(&*t3.get(g, 0, ReadCtx::CLIENT).unwrap().0, &expect(i as u64)[..]);
        }
        assert_eq!(fx.calls.load(Relaxed), 10);
        assert_eq!(t3.mem.stats.bytes_computed.get(), 0);

        let memory_only = Tiers::new(Arc::new(ChunkCache::new(1 << 20)), None, pool(1));
        assert!(matches!(memory_only.warm(&groups[0], &[1000], Priority::Read).unwrap_err().root(), TestError::Option { option: "disk_cache", .. }));
        assert_eq!(&*memory_only.get(&groups[0], 0, ReadCtx::CLIENT).unwrap().0, &expect(0)[..]);
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
        assert_eq!(&*t.get(&g, 0, ReadCtx::CLIENT).unwrap().0, &[5u8; 64][..]);
        assert_eq!(t.warm(&g, &[64], Priority::Read).unwrap(), Warmed::Present);
        settle(&t.pool);
        let d = t.disk.as_ref().unwrap().snapshot();
        assert_eq!((d.writes, d.misses, d.size_bytes), (0, 0, 0));
        assert_eq!(t.mem.stats.bytes_computed.get(), 64);
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
        assert!(matches!(t.get(&g, 0, ReadCtx::CLIENT).unwrap_err().root(), TestError::Failed(_)));
        settle(&t.pool);
        assert_eq!(t.disk.as_ref().unwrap().snapshot().writes, 0);
        assert_eq!(&*t.get(&g, 0, ReadCtx::CLIENT).unwrap().0, &[1u8; 4][..]);
    }
}
