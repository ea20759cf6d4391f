//! The memory tier: a byte-budgeted LRU cache of computed chunks, the first tier
//! ([`super::Tiers`] puts the disk cache and the compute pool behind it), with
//! single-flight ([`super::flight`]): concurrent readers of a chunk that is being loaded or
//! computed wait for that one load instead of repeating it. Errors are not cached (a later read tries again and reports again); the
//! readers that waited for a failed load all get that one error, shared.
//!
//! Every chunk that enters records its [`Origin`], so `bytes_computed` counts only bytes
//! computed by this process (a chunk read back from the disk cache counts in
//! `bytes_from_disk`), each once. A read learns the [`Tier`] its chunk was found in (in
//! memory, or loaded from disk or computed for it or for the load it waited for), which the
//! mount's served-bytes metric splits by.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use lru::LruCache;
use parking_lot::Mutex;

use super::ChunkError;
use super::flight::{Flights, Joined};
use crate::metrics::metric_set;

/// (producer id, chunk id).
pub type Key = (u64, u64);

metric_set! {
    /// The memory tier's counters (`xpackfs_cache_<field>_total`).
    pub struct CacheStats / CacheCounts {
        /// Chunks found in memory.
        hits: Counter,
        /// Chunks not in memory, loaded from disk or computed.
        misses: Counter,
        /// Reads that waited for a load of the same chunk by another reader (single-flight).
        waits: Counter,
        /// Chunks evicted from memory to stay within its budget.
        evictions: Counter,
        /// Bytes of chunks computed by this process.
        bytes_computed: Counter,
        /// Bytes of chunks read back from the disk cache.
        bytes_from_disk: Counter,
    }
}

/// The memory tier's counters at one moment, for `.xpackfs/stats.json`: its budget and
/// size, then every counter of [`CacheStats`] (reached through `Deref`, serialised flat).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct CacheSnapshot {
    pub budget_bytes: usize,
    pub bytes: usize,
    #[serde(flatten)]
    pub counts: CacheCounts,
}

impl std::ops::Deref for CacheSnapshot {
    type Target = CacheCounts;
    fn deref(&self) -> &CacheCounts {
        &self.counts
    }
}

/// Where a chunk entering the cache comes from, for the counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// Computed now: counts in `bytes_computed`.
    Computed,
    /// Read from the disk cache: counts in `bytes_from_disk`.
    Disk,
    /// Already counted where it was produced (a compute job's write-behind puts, and counts,
    /// every part it computed; the reader that waited for it only keeps its copy).
    Counted,
}

struct Lru {
    map: LruCache<Key, Arc<[u8]>>,
    bytes: usize,
}

/// Where the chunk a read got was found: the split of served bytes by origin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tier {
    /// In memory when asked for.
    Memory,
    /// Read from the disk cache for this read (or for a load it waited for).
    Disk,
    /// Computed for this read (or for a load or compute job it waited for).
    Computed,
}

impl From<Origin> for Tier {
    fn from(o: Origin) -> Tier {
        match o {
            Origin::Disk => Tier::Disk,
            Origin::Computed | Origin::Counted => Tier::Computed,
        }
    }
}

/// A load in flight: its result (and where it came from), once known.
type Load<E> = Option<Result<(Arc<[u8]>, Origin), Arc<E>>>;

/// `E`: the error of the loads it runs (the views' error), shared with the readers that
/// waited for a failed load.
pub struct ChunkCache<E> {
    lru: Mutex<Lru>,
    loads: Flights<Key, Load<E>>,
    budget: usize,
    next_id: AtomicU64,
    pub stats: CacheStats,
}

impl<E> std::fmt::Debug for ChunkCache<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChunkCache").field("budget", &self.budget).field("bytes", &self.bytes()).finish()
    }
}

impl<E> ChunkCache<E> {
    pub fn new(budget_bytes: usize) -> Self {
        ChunkCache {
            lru: Mutex::new(Lru { map: LruCache::unbounded(), bytes: 0 }),
            loads: Flights::default(),
            budget: budget_bytes,
            next_id: AtomicU64::new(1),
            stats: CacheStats::default(),
        }
    }

    /// A fresh producer id for a view's chunk producer to key its chunks with.
    pub fn producer_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    pub fn bytes(&self) -> usize {
        self.lru.lock().bytes
    }

    pub fn budget(&self) -> usize {
        self.budget
    }

    pub fn snapshot(&self) -> CacheSnapshot {
        CacheSnapshot { budget_bytes: self.budget(), bytes: self.bytes(), counts: self.stats.snapshot() }
    }

    fn lookup(&self, key: &Key) -> Option<Arc<[u8]>> {
        self.lru.lock().map.get(key).cloned()
    }

    /// The chunk at `key` if it is cached: counted as a hit and made most recently used.
    pub fn get(&self, key: &Key) -> Option<Arc<[u8]>> {
        let v = self.lookup(key)?;
        self.stats.hits.inc();
        Some(v)
    }

    /// The chunk at `key` if it is cached, counted as a hit but left where it is in the LRU
    /// order (a background read: it must not keep a chunk in memory that clients left).
    pub fn get_untouched(&self, key: &Key) -> Option<Arc<[u8]>> {
        let v = self.lru.lock().map.peek(key).cloned()?;
        self.stats.hits.inc();
        Some(v)
    }

    /// Whether the chunk at `key` is cached, without counting or touching it (prefetch and
    /// readiness checks).
    pub fn peek(&self, key: &Key) -> bool {
        self.lru.lock().map.contains(key)
    }

    /// Count `len` bytes of `origin` without keeping them (parts computed while warming the
    /// disk cache, which stay out of memory).
    pub fn record(&self, len: usize, origin: Origin) {
        let stat = match origin {
            Origin::Computed => &self.stats.bytes_computed,
            Origin::Disk => &self.stats.bytes_from_disk,
            Origin::Counted => return,
        };
        stat.inc_by(len as u64);
    }

    fn insert(&self, key: Key, value: Arc<[u8]>) {
        if value.len() > self.budget {
            return; // larger than the whole budget: served, not kept
        }
        let mut lru = self.lru.lock();
        lru.bytes += value.len();
        if let Some(old) = lru.map.put(key, value) {
            lru.bytes -= old.len();
        }
        while lru.bytes > self.budget {
            match lru.map.pop_lru() {
                Some((_, v)) => {
                    lru.bytes -= v.len();
                    self.stats.evictions.inc();
                }
                None => break,
            }
        }
    }

    /// Insert a chunk that did not come through [`ChunkCache::get_or_load`] (the parts a
    /// compute job wrote behind, siblings of the one asked for), counted by its origin.
    pub fn put(&self, key: Key, value: Arc<[u8]>, origin: Origin) {
        self.record(value.len(), origin);
        self.insert(key, value);
    }
}

impl<E: ChunkError> ChunkCache<E> {
    /// The chunk at `key`, and the tier it was found in, loading it with `load` (which says
    /// where the bytes came from) if no one has it or is loading it.
    pub fn get_or_load(&self, key: Key, load: impl FnOnce() -> Result<(Arc<[u8]>, Origin), E>) -> Result<(Arc<[u8]>, Tier), E> {
        if let Some(v) = self.get(&key) {
            return Ok((v, Tier::Memory));
        }
        // Looked up again under the flights' lock: a load may have just landed.
        let flight = match self.loads.join(key, || self.lookup(&key), || None) {
            Joined::Found(v) => {
                self.stats.hits.inc();
                return Ok((v, Tier::Memory));
            }
            Joined::Joiner(f) => {
                self.stats.waits.inc();
                return match f.wait_until(Option::is_some).as_ref() {
                    Some(Ok((v, origin))) => Ok((v.clone(), Tier::from(*origin))),
                    Some(Err(e)) => Err(E::shared(e.clone())),
                    None => Err(E::internal("chunk computation ended without a result".into())),
                };
            }
            Joined::Leader(f) => f,
        };
        self.stats.misses.inc();
        // A panic in `load` must not leave waiters hanging.
        let result: Result<(Arc<[u8]>, Origin), Arc<E>> = std::panic::catch_unwind(std::panic::AssertUnwindSafe(load))
            .unwrap_or_else(|_| Err(E::internal("chunk computation panicked".into())))
            .inspect(|(v, origin)| self.record(v.len(), *origin))
            .map_err(Arc::new);
        if let Ok((v, _)) = &result {
            self.insert(key, v.clone());
        }
        *flight.lock() = Some(result.clone());
        flight.notify();
        self.loads.land(&flight);
        result.map(|(v, origin)| (v, Tier::from(origin))).map_err(E::shared)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::error::TestError;
    use std::sync::atomic::AtomicUsize;

    type Cache = ChunkCache<TestError>;

    impl<E: ChunkError> ChunkCache<E> {
        /// The chunk at `key`, computing it with `compute` if no one has it or is computing it.
        fn get_or_compute<V: Into<Arc<[u8]>>>(&self, key: Key, compute: impl FnOnce() -> Result<V, E>) -> Result<Arc<[u8]>, E> {
            self.get_or_load(key, || compute().map(|v| (v.into(), Origin::Computed))).map(|(v, _)| v)
        }
    }

    #[test]
    fn budget_is_kept_and_lru_evicted() {
        let c = Cache::new(100);
        for i in 0..10u64 {
            c.get_or_compute((1, i), || Ok(vec![i as u8; 30])).unwrap();
        }
        assert!(c.bytes() <= 100);
        assert_eq!(c.bytes(), 90);
        // The most recent three are cached, older ones recomputed.
        let calls = AtomicUsize::new(0);
        for i in [9u64, 8, 7] {
            c.get_or_compute((1, i), || {
                calls.fetch_add(1, Ordering::SeqCst);
                Ok(vec![0; 30])
            })
            .unwrap();
        }
        assert_eq!(calls.load(Ordering::SeqCst), 0);
        c.get_or_compute((1, 0), || {
            calls.fetch_add(1, Ordering::SeqCst);
            Ok(vec![0; 30])
        })
        .unwrap();
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn concurrent_readers_share_one_computation() {
        let c = Arc::new(Cache::new(1 << 20));
        let calls = Arc::new(AtomicUsize::new(0));
        std::thread::scope(|s| {
            for _ in 0..8 {
                let (c, calls) = (c.clone(), calls.clone());
                s.spawn(move || {
                    let v = c
                        .get_or_compute((7, 7), || {
                            calls.fetch_add(1, Ordering::SeqCst);
                            std::thread::sleep(std::time::Duration::from_millis(100));
                            Ok(vec![42; 1000])
                        })
                        .unwrap();
                    assert_eq!(v.len(), 1000);
                });
            }
        });
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        assert!(c.stats.waits.get() >= 1);
    }

    #[test]
    fn errors_and_panics_reach_every_waiter_and_are_not_cached() {
        let c = Cache::new(1000);
        assert!(c.get_or_compute((1, 1), || Err::<Vec<u8>, _>(TestError::Failed("boom".into()))).is_err());
        assert!(c.get_or_compute((1, 1), || -> Result<Vec<u8>, TestError> { panic!("bad chunk") }).is_err());
        assert_eq!(c.get_or_compute((1, 1), || Ok(vec![1])).unwrap().len(), 1);
    }

    #[test]
    fn origins_are_counted_once_each() {
        let c = Cache::new(1 << 20);
        c.get_or_compute((1, 1), || Ok(vec![0; 10])).unwrap();
        c.get_or_load((1, 2), || Ok((Arc::from(vec![0; 20]), Origin::Disk))).unwrap();
        c.get_or_load((1, 3), || Ok((Arc::from(vec![0; 40]), Origin::Counted))).unwrap();
        c.put((1, 4), Arc::from(vec![0; 80]), Origin::Computed);
        assert!(c.peek(&(1, 4)) && !c.peek(&(1, 5)));
        assert_eq!(c.stats.hits.get(), 0, "peek counts nothing");
        assert!(c.get(&(1, 2)).is_some());
        let s = &c.stats;
        assert_eq!((s.bytes_computed.get(), s.bytes_from_disk.get(), s.hits.get()), (90, 20, 1));
    }
}
