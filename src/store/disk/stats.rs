//! The disk cache's counters, declared once ([`crate::metrics::metric_set!`]: the struct the
//! cache increments, [`DiskCounts`] for `.xpackfs/stats.json` and the periodic log line, and
//! their Prometheus names `xpackfs_disk_cache_<field>_total`), and a snapshot of them with the
//! cache's directory, mode, bound and size.

use crate::metrics::metric_set;

use super::DiskCache;

metric_set! {
    /// The disk cache's counters.
    pub struct DiskStats / DiskCounts {
        /// Chunks found on disk and read back.
        hits: Counter,
        /// Chunks looked for on disk and not found.
        misses: Counter,
        /// Bytes of chunks read back from disk.
        bytes_read: Counter,
        /// Chunks written to disk.
        writes: Counter,
        /// Bytes of chunks written to disk.
        bytes_written: Counter,
        /// Writes not done: disabled, read-only, paused, too large, or already present.
        skipped_writes: Counter,
        /// Writes that failed.
        write_errors: Counter,
        /// Entries evicted to stay within the bound.
        evictions: Counter,
        /// Bytes of entries evicted.
        evicted_bytes: Counter,
        /// Entries found wrong (torn, truncated, corrupted) and deleted.
        corrupt: Counter,
        /// Temporary files of writers that died, removed.
        stale_temps: Counter,
        /// Whole-file entries found sound and handed out.
        file_hits: Counter,
        /// Whole-file entries looked for and absent.
        file_misses: Counter,
        /// Whole-file entries found changed and checked good block by block.
        file_rechecks: Counter,
        /// Whole-file entries written.
        file_writes: Counter,
    }
}

/// The counters at one moment, for `.xpackfs/stats.json` and the periodic log line: the
/// cache's directory, mode, bound and size, then every counter of [`DiskStats`] (reached
/// through `Deref`, serialised flat).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct DiskStatsSnapshot {
    pub dir: String,
    pub mode: &'static str,
    pub budget_bytes: u64,
    /// Bytes of entries in the directory (shared by every process using it).
    pub size_bytes: u64,
    #[serde(flatten)]
    pub counts: DiskCounts,
}

impl std::ops::Deref for DiskStatsSnapshot {
    type Target = DiskCounts;
    fn deref(&self) -> &DiskCounts {
        &self.counts
    }
}

impl DiskCache {
    pub fn snapshot(&self) -> DiskStatsSnapshot {
        DiskStatsSnapshot {
            dir: self.cfg.dir.display().to_string(),
            mode: self.mode().name(),
            budget_bytes: self.cfg.budget_bytes,
            size_bytes: self.size_bytes(),
            counts: self.stats.snapshot(),
        }
    }
}
