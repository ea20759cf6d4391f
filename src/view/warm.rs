//! Computing a view's chunks ahead into the disk cache: `xpackfs warm` (all cores, at read
//! priority or niced) and a mount's `prewarm=on` (the background pool, yielding to reads)
//! both run [`run`] over the items [`plan`] lists.
//!
//! For a remote source, [`fetch_sources`] first reads what the files serve of it as it is
//! (their `Source` extents) once, so its fetched parts land in the disk cache too (the
//! computed chunks read the source as they are computed, and so fetch theirs).
//!
//! After the chunks, [`write_files`] keeps each warmed file whole in the disk cache too
//! ([`crate::store::file_entries`]), from the chunks now on disk: a later mount hands those files to
//! the kernel.
//!
//! Resumable by construction: an item whose chunks are on disk already is found by a
//! presence check (size, no read) and skipped, so an interrupted warm-up continues where it
//! stopped. Chunks computed by one job (kt-int8's sibling files) are one item, asked for
//! once: no thread of the pool ever waits for a job it is itself running.
//!
//! It lives in `view/`, not in the storage layer, because what it plans over is views' own:
//! the extents of virtual files and their chunk producers (each producer knows its warm
//! group and warms its chunks through the tiers). The storage parts it drives (the pool,
//! [`Tiers::warm`](crate::store::Tiers::warm), file entries) are `store`'s.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Instant;

use parking_lot::Mutex;
use rayon::prelude::*;

use super::{ChunkProducer, Extent, Tiers, VirtualFile};
use crate::source::SourceFile;
use crate::store::disk::{HEADER_BYTES, seal_len};
use crate::store::file_entries::{self, FileEntries};
use crate::store::{Priority, ReadCtx, Warmed};

/// One job's worth of chunks to warm.
pub struct Item {
    /// The view file it was found in (for messages).
    pub file: String,
    pub producer: Arc<dyn ChunkProducer>,
    pub id: u64,
    /// Bytes of the chunks it stands for (a sibling group counts every file it computes).
    pub bytes: u64,
    /// Disk-cache entries it stands for.
    pub entries: u64,
}

/// The persistent computed chunks of `files`, one item per warm group, in file order.
pub fn plan(files: &[(String, Arc<VirtualFile>)]) -> Vec<Item> {
    let mut items: Vec<Item> = Vec::new();
    let mut seen: std::collections::HashMap<(usize, u64), usize> = std::collections::HashMap::new();
    for (name, f) in files {
        for (_, e) in f.extents() {
            let Extent::Computed { producer, id, len } = e else { continue };
            if !producer.persistent() {
                continue;
            }
            let unit = (Arc::as_ptr(producer) as *const () as usize, producer.warm_group(*id));
            match seen.get(&unit) {
                Some(&i) => {
                    items[i].bytes += len;
                    items[i].entries += 1;
                }
                None => {
                    seen.insert(unit, items.len());
                    items.push(Item { file: name.clone(), producer: producer.clone(), id: *id, bytes: *len, entries: 1 });
                }
            }
        }
    }
    items
}

/// Source files and, per file, sorted disjoint byte ranges `[start, end)`.
pub type FileRanges = Vec<(Arc<SourceFile>, Vec<(u64, u64)>)>;

/// The byte ranges of remote source files that `files` serve as they are (`Source` extents),
/// merged and sorted per file, files in the order first met.
pub fn remote_ranges(files: &[(String, Arc<VirtualFile>)]) -> FileRanges {
    let mut order: Vec<Arc<SourceFile>> = Vec::new();
    let mut ranges: std::collections::HashMap<*const SourceFile, Vec<(u64, u64)>> = std::collections::HashMap::new();
    for (_, f) in files {
        for (_, e) in f.extents() {
            let Extent::Source { file, offset, len } = e else { continue };
            if !file.is_remote() {
                continue;
            }
            let v = ranges.entry(Arc::as_ptr(file)).or_insert_with(|| {
                order.push(file.clone());
                Vec::new()
            });
            v.push((*offset, offset + len));
        }
    }
    order
        .into_iter()
        .map(|file| {
            let mut v = ranges.remove(&Arc::as_ptr(&file)).unwrap_or_default();
            v.sort_unstable();
            let mut merged: Vec<(u64, u64)> = Vec::with_capacity(v.len());
            for (a, b) in v {
                match merged.last_mut() {
                    Some(last) if a <= last.1 => last.1 = last.1.max(b),
                    _ => merged.push((a, b)),
                }
            }
            (file, merged)
        })
        .collect()
}

/// Read `ranges` of remote source files once, in order, so that their fetched parts land in
/// the disk cache (`source::remote::parts`, with its read-ahead running the GETs in
/// parallel): a later mount serves those bytes without the network. Files are read two at a
/// time; `progress.bytes` counts what was read. A file whose read fails is logged and
/// counted, and the others go on.
pub fn fetch_sources(ranges: &FileRanges, progress: &Progress) -> Report {
    let started = Instant::now();
    let errors = Mutex::new(Vec::new());
    let next = AtomicU64::new(0);
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                let mut buf = vec![0u8; 8 << 20];
                loop {
                    let i = next.fetch_add(1, Relaxed) as usize;
                    let Some((file, spans)) = ranges.get(i) else { break };
                    let r = spans.iter().try_for_each(|&(a, b)| {
                        let mut at = a;
                        while at < b {
                            let n = (b - at).min(buf.len() as u64) as usize;
                            file.read_exact_at(&mut buf[..n], at)?;
                            progress.bytes.fetch_add(n as u64, Relaxed);
                            at += n as u64;
                        }
                        Ok::<_, crate::source::SourceError>(())
                    });
                    match r {
                        Ok(()) => progress.computed.fetch_add(1, Relaxed),
                        Err(e) => {
                            tracing::warn!("warm: fetching {}: {e}", file.path().display());
                            let mut errs = errors.lock();
                            if errs.len() < ERRORS_KEPT {
                                errs.push(format!("{}: {e}", file.path().display()));
                            }
                            progress.failed.fetch_add(1, Relaxed)
                        }
                    };
                }
            });
        }
    });
    Report {
        items: ranges.len() as u64,
        bytes: ranges.iter().flat_map(|(_, v)| v.iter().map(|(a, b)| b - a)).sum(),
        present: 0,
        computed: progress.computed.load(Relaxed),
        failed: progress.failed.load(Relaxed),
        errors: errors.into_inner(),
        seconds: started.elapsed().as_secs_f64(),
    }
}

/// Disk-cache bytes the items take (entries with their headers).
pub fn disk_bytes(items: &[Item]) -> u64 {
    items.iter().map(|i| i.bytes + i.entries * HEADER_BYTES).sum()
}

/// Disk-cache bytes the fetched parts of `ranges` take: every part of `part_size` bytes a
/// range touches is kept whole (the last part of a file shorter), with its entry's header.
pub fn fetched_disk_bytes(ranges: &FileRanges, part_size: u64) -> u64 {
    let ps = part_size.max(1);
    ranges
        .iter()
        .map(|(file, spans)| {
            let size = file.size();
            let mut parts: Vec<u64> = Vec::new();
            for &(a, b) in spans.iter().filter(|(a, b)| b > a) {
                let (first, last) = (a / ps, (b.min(size).max(a + 1) - 1) / ps);
                // Spans are sorted and merged: a part shared by two spans is the last one seen.
                let from = if parts.last() == Some(&first) { first + 1 } else { first };
                parts.extend(from..=last);
            }
            parts.iter().map(|&i| size.saturating_sub(i * ps).min(ps) + HEADER_BYTES).sum::<u64>()
        })
        .sum()
}

/// Counters of a warm-up in progress (read by a progress bar).
#[derive(Debug, Default)]
pub struct Progress {
    /// Bytes of the items done (present, computed or failed).
    pub bytes: AtomicU64,
    pub present: AtomicU64,
    pub computed: AtomicU64,
    pub failed: AtomicU64,
}

/// What a warm-up did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Report {
    pub items: u64,
    pub bytes: u64,
    pub present: u64,
    pub computed: u64,
    pub failed: u64,
    /// The first failures (file: error), each also logged.
    pub errors: Vec<String>,
    pub seconds: f64,
}

const ERRORS_KEPT: usize = 20;

/// Warm every item on the pool at `prio` (all its threads), counting into `progress`. A
/// failing item (content the view refuses, an I/O error) is logged and counted, and the
/// others go on.
pub fn run(tiers: &Tiers, items: &[Item], prio: Priority, progress: &Progress) -> Report {
    let started = Instant::now();
    let errors = Mutex::new(Vec::new());
    let failed_files = Mutex::new(HashSet::new());
    tiers.pool.install(prio, || {
        items.par_iter().for_each(|item| {
            match item.producer.warm(item.id, prio) {
                Ok(Warmed::Present) => progress.present.fetch_add(1, Relaxed),
                Ok(Warmed::Computed) => progress.computed.fetch_add(1, Relaxed),
                Err(e) => {
                    // One line per file: its other chunks fail the same way.
                    if failed_files.lock().insert(item.file.clone()) {
                        tracing::warn!("warm: {}: {e}", item.file);
                    }
                    let mut errs = errors.lock();
                    if errs.len() < ERRORS_KEPT {
                        errs.push(format!("{}: {e}", item.file));
                    }
                    progress.failed.fetch_add(1, Relaxed)
                }
            };
            progress.bytes.fetch_add(item.bytes, Relaxed);
        })
    });
    Report {
        items: items.len() as u64,
        bytes: items.iter().map(|i| i.bytes).sum(),
        present: progress.present.load(Relaxed),
        computed: progress.computed.load(Relaxed),
        failed: progress.failed.load(Relaxed),
        errors: errors.into_inner(),
        seconds: started.elapsed().as_secs_f64(),
    }
}

/// Disk-cache bytes the file entries of `files` take (data and seal).
pub fn file_bytes(files: &[(String, Arc<VirtualFile>)]) -> u64 {
    files.iter().filter(|(_, f)| file_entries::key(&**f).is_some()).map(|(_, f)| f.size() + seal_len(f.size())).sum()
}

/// What [`write_files`] did.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct FilesReport {
    /// File entries written now, found present, and not written (a chunk missing from the
    /// disk cache, or the cache refused: see the warnings).
    pub written: u64,
    pub present: u64,
    pub skipped: u64,
    pub bytes: u64,
    pub seconds: f64,
}

/// Keep every file of `files` that can have a file entry whole in the disk cache, if all
/// its chunks are there (nothing is computed), on the pool at `prio`: background reads
/// ([`ReadCtx::BACKGROUND`] at `prio`, computing nothing), which leave the memory tier as
/// clients left it.
pub fn write_files(tiers: &Tiers, entries: &FileEntries, files: &[(String, Arc<VirtualFile>)], prio: Priority) -> FilesReport {
    let started = Instant::now();
    let (written, present, skipped, bytes) = (AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0));
    tiers.pool.install(prio, || {
        files.par_iter().filter(|(_, f)| file_entries::key(&**f).is_some()).for_each(|(_, f)| {
            if entries.has(&**f) {
                present.fetch_add(1, Relaxed);
            } else if file_entries::nothing_to_compute(&**f, entries.disk()) && entries.write(&**f, ReadCtx::BACKGROUND.at(prio).cached_only()) {
                written.fetch_add(1, Relaxed);
                bytes.fetch_add(f.size(), Relaxed);
            } else {
                skipped.fetch_add(1, Relaxed);
            }
        })
    });
    FilesReport {
        written: written.into_inner(),
        present: present.into_inner(),
        skipped: skipped.into_inner(),
        bytes: bytes.into_inner(),
        seconds: started.elapsed().as_secs_f64(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::compute::{ComputePool, PoolConfig};
    use crate::store::disk::{DiskCacheConfig, KeyBuilder, ProducerKey};
    use crate::store::{ChunkCache, DiskCache, DiskKey, Group};
    use crate::view::ViewError;

    const MIB: u64 = 1 << 20;

    /// Chunks of 1 MiB (each byte its chunk id) through the tiers, as the computed views'.
    #[derive(Debug)]
    struct Mib {
        tiers: Arc<Tiers>,
        id: u64,
        key: ProducerKey,
    }

    impl Mib {
        fn group(&self, id: u64) -> Arc<Group<ViewError>> {
            Arc::new(Group::single((self.id, id), self.key.chunk(id), move || Ok(vec![id as u8; MIB as usize])))
        }
    }

    impl ChunkProducer for Mib {
        fn chunk(&self, id: u64, ctx: ReadCtx) -> Result<crate::view::Chunk, ViewError> {
            self.tiers.get(&self.group(id), 0, ctx).map(|(bytes, tier)| crate::view::Chunk { bytes, tier })
        }
        fn ready(&self, id: u64) -> bool {
            self.tiers.in_memory(&(self.id, id))
        }
        fn persistent(&self) -> bool {
            true
        }
        fn warm(&self, id: u64, prio: Priority) -> Result<Warmed, ViewError> {
            self.tiers.warm(&self.group(id), &[MIB], prio)
        }
        fn prefetch(&self, id: u64, ctx: ReadCtx) {
            self.tiers.prefetch(&self.group(id), 0, ctx);
        }
        fn disk_key(&self, id: u64) -> Option<DiskKey> {
            Some(self.key.chunk(id))
        }
    }

    #[test]
    fn fetched_parts_are_counted_whole_once_each_with_their_headers() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("src.bin");
        // 10 parts of 8 bytes and a last one of 3.
        std::fs::write(&path, vec![7u8; 83]).unwrap();
        let file = Arc::new(SourceFile::open(&path).unwrap());
        let h = HEADER_BYTES;
        let bytes = |spans: Vec<(u64, u64)>| fetched_disk_bytes(&vec![(file.clone(), spans)], 8);
        assert_eq!(bytes(vec![]), 0);
        assert_eq!(bytes(vec![(5, 5)]), 0, "an empty span fetches nothing");
        assert_eq!(bytes(vec![(0, 1)]), 8 + h, "one byte fetches its whole part");
        assert_eq!(bytes(vec![(7, 9)]), 2 * (8 + h), "a span across a boundary fetches both parts");
        // Two spans in one part count it once; the next span starts in the part the previous ended in.
        assert_eq!(bytes(vec![(0, 2), (4, 6), (6 + 1, 17)]), 3 * (8 + h));
        assert_eq!(bytes(vec![(78, 83)]), 8 + 3 + 2 * h, "the last part is short");
        assert_eq!(bytes(vec![(0, 83)]), 83 + 11 * h);
        // Two files add up; a span past the end counts up to the end only.
        let two = vec![(file.clone(), vec![(0, 1)]), (file.clone(), vec![(80, 200)])];
        assert_eq!(fetched_disk_bytes(&two, 8), 8 + h + 3 + h);
    }

    /// Defect of issue 23: a prewarm's file entries were written through the memory tier,
    /// streaming the whole view through it and evicting what clients read.
    #[test]
    fn a_prewarm_leaves_clients_chunks_in_memory() {
        let dir = tempfile::tempdir().unwrap();
        let pool = ComputePool::new(&PoolConfig { threads: 2, ..PoolConfig::default() }).unwrap();
        // Room for three chunks; two files of two and four.
        let tiers =
            Tiers::new(Arc::new(ChunkCache::new(3 * MIB as usize)), Some(Arc::new(DiskCache::open(DiskCacheConfig::new(dir.path(), 1 << 30)))), Arc::new(pool));
        let producer = Arc::new(Mib { tiers: tiers.clone(), id: tiers.mem.producer_id(), key: KeyBuilder::new("warm-test").producer() });
        let file = |ids: std::ops::Range<u64>| {
            let mut f = VirtualFile::new();
            for id in ids {
                f.push(Extent::Computed { producer: producer.clone(), id, len: MIB });
            }
            Arc::new(f)
        };
        let files = vec![("a".to_string(), file(0..2)), ("b".to_string(), file(2..6))];
        let report = run(&tiers, &plan(&files), Priority::Background, &Progress::default());
        assert_eq!((report.computed, report.failed), (6, 0));
        // A client reads a.
        let mut buf = vec![0u8; 2 * MIB as usize];
        assert_eq!(files[0].1.read_at(0, &mut buf, ReadCtx::CLIENT).unwrap(), buf.len());
        let resident = || (0..6).filter(|&id| producer.ready(id)).collect::<Vec<_>>();
        assert_eq!(resident(), [0, 1]);
        // The prewarm's second half: every file kept whole, its chunks read from disk.
        let entries = FileEntries::of(&tiers, true).unwrap();
        let r = write_files(&tiers, &entries, &files, Priority::Background);
        assert_eq!((r.written, r.skipped), (2, 0));
        assert_eq!(resident(), [0, 1], "writing file entries changed what memory holds");
        assert_eq!(tiers.mem.stats.evictions.get(), 0);
    }
}
