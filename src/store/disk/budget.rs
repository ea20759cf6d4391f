//! The shared budget and eviction: one counter of entry bytes (`usage`, 8 bytes under
//! `flock`) raised before each write by every process using the directory, and an LRU
//! eviction pass (one process at a time, under `evict.lock`) that brings the directory down
//! to `low_water` of the budget, recounting it as it goes (which repairs any drift of the
//! counter), and removes temporary files of writers that died.

use std::fs::{self, File};
use std::io::ErrorKind;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::time::SystemTime;

use super::{DiskCache, Mode};

/// What an eviction pass found and did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EvictReport {
    pub scanned: u64,
    pub bytes_before: u64,
    pub evicted: u64,
    pub bytes_after: u64,
}

impl DiskCache {
    pub fn budget(&self) -> u64 {
        self.cfg.budget_bytes
    }

    /// Change the bound before the cache is shared (a default bound that depends on the
    /// free space, found after opening).
    pub fn set_budget(&mut self, bytes: u64) {
        self.cfg.budget_bytes = bytes;
    }

    /// The shared counter, if it holds one.
    pub(super) fn read_usage(&self) -> Option<u64> {
        let f = self.usage.as_ref()?.lock();
        f.lock().ok()?;
        let v = read_u64(&f);
        let _ = f.unlock();
        v
    }

    /// Add `delta` to the shared counter; returns its value before.
    pub(super) fn add_usage(&self, delta: i64) -> Option<u64> {
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
                        self.stats.evictions.inc();
                        self.stats.evicted_bytes.inc_by(*size);
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
    pub(super) fn clean_temps(&self) {
        let Ok(tmps) = fs::read_dir(self.cfg.dir.join("tmp")) else { return };
        for t in tmps.flatten() {
            let path = t.path();
            let Ok(f) = File::open(&path) else { continue };
            if f.try_lock().is_ok() && fs::remove_file(&path).is_ok() {
                self.stats.stale_temps.inc();
            }
        }
    }
}

fn read_u64(f: &File) -> Option<u64> {
    let mut b = [0u8; 8];
    f.read_exact_at(&mut b, 0).ok()?;
    Some(u64::from_le_bytes(b))
}
