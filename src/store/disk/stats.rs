//! The disk cache's counters, and a snapshot of them for `.xpackfs/stats.json` and the
//! periodic log line.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use super::DiskCache;

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
    /// File entries (`files`) found sound and handed out, found absent, found changed and
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

impl DiskCache {
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
