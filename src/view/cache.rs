//! Byte-budgeted LRU cache of computed chunks, with single-flight: concurrent readers of
//! a chunk that is being computed wait for that one computation instead of repeating it.
//! Errors are not cached (a later read tries again and reports again); the readers that
//! waited for a failed computation all get that one error, shared.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use lru::LruCache;
use parking_lot::{Condvar, Mutex};

use super::ViewError;

/// (producer id, chunk id).
pub type Key = (u64, u64);

#[derive(Debug, Default)]
pub struct CacheStats {
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    pub waits: AtomicU64,
    pub bytes_computed: AtomicU64,
    pub evictions: AtomicU64,
}

struct Lru {
    map: LruCache<Key, Arc<[u8]>>,
    bytes: usize,
}

type Slot = Arc<(Mutex<Option<Result<Arc<[u8]>, Arc<ViewError>>>>, Condvar)>;

pub struct ChunkCache {
    lru: Mutex<Lru>,
    inflight: Mutex<HashMap<Key, Slot>>,
    budget: usize,
    next_id: AtomicU64,
    pub stats: CacheStats,
}

impl std::fmt::Debug for ChunkCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChunkCache").field("budget", &self.budget).field("bytes", &self.bytes()).finish()
    }
}

impl ChunkCache {
    pub fn new(budget_bytes: usize) -> Self {
        ChunkCache {
            lru: Mutex::new(Lru { map: LruCache::unbounded(), bytes: 0 }),
            inflight: Mutex::new(HashMap::new()),
            budget: budget_bytes,
            next_id: AtomicU64::new(1),
            stats: CacheStats::default(),
        }
    }

    /// A fresh producer id for a [`crate::view::ChunkSource`] to key its chunks with.
    pub fn producer_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    pub fn bytes(&self) -> usize {
        self.lru.lock().bytes
    }

    pub fn budget(&self) -> usize {
        self.budget
    }

    fn lookup(&self, key: &Key) -> Option<Arc<[u8]>> {
        self.lru.lock().map.get(key).cloned()
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
                    self.stats.evictions.fetch_add(1, Ordering::Relaxed);
                }
                None => break,
            }
        }
    }

    /// Insert a chunk computed alongside another one (e.g. a scale file with its quant file).
    pub fn put(&self, key: Key, value: Arc<[u8]>) {
        self.stats.bytes_computed.fetch_add(value.len() as u64, Ordering::Relaxed);
        self.insert(key, value);
    }

    /// Compute the chunk at `key` unless it is cached or being computed (prefetching: never
    /// waits for another computation, so a pool thread running it is never blocked by one).
    pub fn compute_if_absent<V: Into<Arc<[u8]>>>(&self, key: Key, compute: impl FnOnce() -> Result<V, ViewError>) -> Option<Result<Arc<[u8]>, ViewError>> {
        self.fetch(key, compute, false)
    }

    /// The chunk at `key`, computing it with `compute` if no one has it or is computing it.
    pub fn get_or_compute<V: Into<Arc<[u8]>>>(&self, key: Key, compute: impl FnOnce() -> Result<V, ViewError>) -> Result<Arc<[u8]>, ViewError> {
        self.fetch(key, compute, true).unwrap_or_else(|| Err(ViewError::Internal("chunk lookup without waiting".into())))
    }

    /// `None` only when `wait` is false and another computation of `key` is in flight.
    fn fetch<V: Into<Arc<[u8]>>>(&self, key: Key, compute: impl FnOnce() -> Result<V, ViewError>, wait: bool) -> Option<Result<Arc<[u8]>, ViewError>> {
        if let Some(v) = self.lookup(&key) {
            self.stats.hits.fetch_add(1, Ordering::Relaxed);
            return Some(Ok(v));
        }
        let (slot, leader) = {
            let mut inflight = self.inflight.lock();
            // Re-check under the in-flight lock: a computation may have just finished.
            if let Some(v) = self.lookup(&key) {
                self.stats.hits.fetch_add(1, Ordering::Relaxed);
                return Some(Ok(v));
            }
            match inflight.get(&key) {
                Some(_) if !wait => return None,
                Some(s) => (s.clone(), false),
                None => {
                    let s: Slot = Arc::new((Mutex::new(None), Condvar::new()));
                    inflight.insert(key, s.clone());
                    (s, true)
                }
            }
        };
        if !leader {
            self.stats.waits.fetch_add(1, Ordering::Relaxed);
            let mut done = slot.0.lock();
            while done.is_none() {
                slot.1.wait(&mut done);
            }
            return Some(match done.as_ref() {
                Some(Ok(v)) => Ok(v.clone()),
                Some(Err(e)) => Err(ViewError::Shared(e.clone())),
                None => Err(ViewError::Internal("chunk computation ended without a result".into())),
            });
        }
        self.stats.misses.fetch_add(1, Ordering::Relaxed);
        // A panic in `compute` must not leave waiters hanging.
        let result: Result<Arc<[u8]>, Arc<ViewError>> = std::panic::catch_unwind(std::panic::AssertUnwindSafe(compute))
            .unwrap_or_else(|_| Err(ViewError::Internal("chunk computation panicked".into())))
            .map(Into::into)
            .map_err(Arc::new);
        if let Ok(v) = &result {
            self.stats.bytes_computed.fetch_add(v.len() as u64, Ordering::Relaxed);
            self.insert(key, v.clone());
        }
        *slot.0.lock() = Some(result.clone());
        slot.1.notify_all();
        self.inflight.lock().remove(&key);
        Some(result.map_err(ViewError::Shared))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn budget_is_kept_and_lru_evicted() {
        let c = ChunkCache::new(100);
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
        let c = Arc::new(ChunkCache::new(1 << 20));
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
        assert!(c.stats.waits.load(Ordering::Relaxed) >= 1);
    }

    #[test]
    fn prefetching_never_waits_for_a_computation_in_flight() {
        let c = Arc::new(ChunkCache::new(1 << 20));
        let (started_tx, started_rx) = std::sync::mpsc::channel();
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let leader = {
            let c = c.clone();
            std::thread::spawn(move || {
                c.get_or_compute((1, 1), || {
                    started_tx.send(()).unwrap();
                    release_rx.recv().unwrap();
                    Ok(vec![7u8; 3])
                })
            })
        };
        started_rx.recv().unwrap();
        assert!(c.compute_if_absent((1, 1), || -> Result<Vec<u8>, ViewError> { panic!("computed twice") }).is_none());
        release_tx.send(()).unwrap();
        assert_eq!(&*leader.join().unwrap().unwrap(), &[7u8; 3][..]);
        assert!(c.compute_if_absent((1, 1), || -> Result<Vec<u8>, ViewError> { panic!("computed twice") }).unwrap().is_ok());
        assert!(c.compute_if_absent((1, 2), || Ok(vec![1u8])).is_some());
    }

    #[test]
    fn errors_and_panics_reach_every_waiter_and_are_not_cached() {
        let c = ChunkCache::new(1000);
        assert!(c.get_or_compute((1, 1), || Err::<Vec<u8>, _>(ViewError::Internal("boom".into()))).is_err());
        assert!(c.get_or_compute((1, 1), || -> Result<Vec<u8>, ViewError> { panic!("bad chunk") }).is_err());
        assert_eq!(c.get_or_compute((1, 1), || Ok(vec![1])).unwrap().len(), 1);
    }
}
