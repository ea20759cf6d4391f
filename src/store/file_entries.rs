//! Whole files of a view in the disk cache ("file entries", stored and checked by
//! [`super::disk`]): which files get one and under what key, writing them from the
//! view's own bytes, and finding them again. A view file is seen through [`StoredFile`]
//! (what its bytes are made of, and a way to read them), which `view::VirtualFile`
//! implements: this module knows no view type.
//!
//! Why: a mount serves chunk entries through the daemon, which verifies every read but
//! costs two extra copies and a round trip per request (a FUSE mount reads at about half the
//! speed of a local file here, even with every byte in memory). A file kept whole can be
//! handed to the kernel instead (FUSE passthrough, in `serve/`): after a restart the mount
//! reads at local-disk speed. The files that get one are those whose bytes cost work to
//! make again: computed chunks kept in the disk cache, or ranges of a remote source with a
//! pinned version (an expert pack over `s3://` is all source ranges: its second mount would
//! otherwise read it through the daemon from fetched parts, at under half a local copy's
//! speed). `xpackfs warm` writes the file entries of the files it warms; a mount writes one
//! in the background once a file was read and every one of its chunks and remote parts is
//! in memory or in the disk cache, reading them from there only (never computing, never
//! fetching: see `ReadCtx::compute`). Chunk and part entries stay: reads without
//! passthrough (and `materialize`) use them; those of a file served whole are no longer
//! read and age out first.
//!
//! The key is a digest of everything the file's bytes are made of, in order: its literal
//! bytes, zero runs, source ranges (with the source file's identity, as chunk keys hold it)
//! and the disk-cache keys of its computed chunks (which already cover the source, the view
//! parameters and the codec revision). Files with a chunk that has no key (manifests built
//! from digests, chunks kept in memory only) or smaller than [`MIN_FILE_BYTES`] get none.

use std::collections::{HashMap, HashSet};
use std::ops::ControlFlow;
use std::sync::mpsc::{SyncSender, sync_channel};
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;
use sha2::{Digest, Sha256};

use super::disk::{DiskCache, DiskKey, FileLookup, KeyBuilder, MAX_ENTRY_BYTES, source_file_key};
use super::{ReadCtx, Tiers};
use crate::source::SourceFile;

/// One piece of a file, as a file entry's key and its write need to know it.
pub enum Part<'a> {
    /// Literal bytes.
    Bytes(&'a [u8]),
    /// A run of zero bytes.
    Zeros(u64),
    /// A range of a source file, served as is.
    Source { file: &'a Arc<SourceFile>, offset: u64, len: u64 },
    /// Chunk `id` of a producer of computed chunks.
    Chunk { chunks: &'a dyn Chunks, id: u64, len: u64 },
}

/// What a file entry needs of a producer of computed chunks.
pub trait Chunks {
    /// Whether its chunks are kept in the disk cache.
    fn persistent(&self) -> bool;
    /// Whether chunk `id` is in memory now.
    fn ready(&self, id: u64) -> bool;
    /// The disk-cache key of chunk `id`; `None`: not keyed (the file gets no file entry).
    fn disk_key(&self, id: u64) -> Option<DiskKey>;
}

/// A file as the storage layer sees it (implemented by the views' virtual file).
pub trait StoredFile: Send + Sync {
    fn size(&self) -> u64;
    /// Built from digests of other files (manifests): such files get no file entry.
    fn is_derived(&self) -> bool;
    /// Where the key of its file entry is kept once found.
    fn file_key_cell(&self) -> &OnceLock<Option<DiskKey>>;
    /// Visit its parts in order, each with its start offset, until `visit` breaks.
    fn visit_parts(&self, visit: &mut dyn FnMut(u64, Part<'_>) -> ControlFlow<()>) -> ControlFlow<()>;
    /// Fill `buf` whole with its bytes at `offset`, read through the view as `ctx` says
    /// (chunks not in the caches are computed if `ctx` allows), or say why not.
    fn fill(&self, offset: u64, buf: &mut [u8], ctx: ReadCtx) -> Result<(), FillError>;
}

/// Why [`StoredFile::fill`] gave no bytes (a file entry is then not written: a warning).
#[derive(Debug, thiserror::Error)]
pub enum FillError {
    /// The file ended at `at`, before the bytes asked for.
    #[error("the view file ended at {at} of {size}")]
    Short { at: u64, size: u64 },
    /// Reading through the view failed (the view's own error, which this layer only shows).
    #[error("{0}")]
    Read(#[source] Box<dyn std::error::Error + Send + Sync>),
}

/// Smaller files are served through the daemon only (their chunk entries are enough: the
/// transport's per-file cost, not its throughput, dominates them).
pub const MIN_FILE_BYTES: u64 = 1 << 20;
/// Files queued for writing in the background at most; more are dropped (and written when
/// they are next read whole).
const QUEUE: usize = 1024;

/// The key of `f`'s file entry (found once, then kept in `f`), or `None` if it gets none.
pub fn key(f: &dyn StoredFile) -> Option<DiskKey> {
    *f.file_key_cell().get_or_init(|| compute_key(f))
}

/// Whether any part of `f` satisfies `pred` (stops at the first).
fn any_part(f: &dyn StoredFile, mut pred: impl FnMut(Part<'_>) -> bool) -> bool {
    f.visit_parts(&mut |_, p| if pred(p) { ControlFlow::Break(()) } else { ControlFlow::Continue(()) }).is_break()
}

fn compute_key(f: &dyn StoredFile) -> Option<DiskKey> {
    // Cheap refusals first: mounts ask for every file's key at start-up. A file is kept
    // whole if some of its bytes cost work to make again: computed chunks kept in the disk
    // cache, or ranges of a remote source (their fetched parts are kept there too).
    let persistent = any_part(f, |p| match p {
        Part::Chunk { chunks, .. } => chunks.persistent(),
        // (Pinned only: an object without an ETag, version or digest could be replaced by
        // one of the same size, which a key could not tell apart.)
        Part::Source { file, .. } => file.is_pinned_remote(),
        _ => false,
    });
    if !persistent || f.is_derived() || f.size() < MIN_FILE_BYTES {
        return None;
    }
    let mut sources: HashMap<*const SourceFile, String> = HashMap::new();
    let mut b = Some(KeyBuilder::new("file").u64("size", f.size()));
    let flow = f.visit_parts(&mut |start, p| {
        let k = b.take().expect("the builder is put back after each part").u64("at", start);
        b = match p {
            Part::Bytes(bytes) => Some(k.field("bytes", Sha256::digest(bytes))),
            Part::Zeros(n) => Some(k.u64("zeros", n)),
            Part::Source { file, offset, len } => {
                let id = sources.entry(Arc::as_ptr(file)).or_insert_with(|| source_file_key(file));
                Some(k.field("source", id.as_bytes()).u64("offset", offset).u64("len", len))
            }
            Part::Chunk { chunks, id, len } => match chunks.disk_key(id) {
                Some(d) => Some(k.field("chunk", d.0).u64("len", len)),
                None => return ControlFlow::Break(()),
            },
        };
        ControlFlow::Continue(())
    });
    if flow.is_break() {
        return None;
    }
    b.map(KeyBuilder::finish)
}

/// Whether every chunk of `f` kept in the disk cache is in memory or on disk, and every
/// range of a remote source in fetched parts in memory or on disk (sizes checked, nothing
/// read): its file entry is then written without computing or fetching anything.
pub fn nothing_to_compute(f: &dyn StoredFile, disk: &DiskCache) -> bool {
    // Remote ranges are gathered and merged first: a view's extents cut a part into many
    // (a pack's slices), and each part is checked once.
    let mut remote: Vec<(Arc<SourceFile>, u64, u64)> = Vec::new();
    let chunk_missing = any_part(f, |p| match p {
        Part::Chunk { chunks, id, len } if chunks.persistent() => {
            !(chunks.ready(id) || chunks.disk_key(id).is_some_and(|k| len <= MAX_ENTRY_BYTES && disk.contains(&k, len)))
        }
        Part::Source { file, offset, len } if file.is_remote() => {
            remote.push((file.clone(), offset, len));
            false
        }
        _ => false,
    });
    if chunk_missing {
        return false;
    }
    remote.sort_by_key(|(file, offset, _)| (Arc::as_ptr(file), *offset));
    let mut merged: Vec<(Arc<SourceFile>, u64, u64)> = Vec::new();
    for (file, offset, len) in remote {
        match merged.last_mut() {
            Some((f, _, end)) if Arc::ptr_eq(f, &file) && offset <= *end => *end = (*end).max(offset + len),
            _ => merged.push((file, offset, offset + len)),
        }
    }
    merged.iter().all(|(file, start, end)| file.kept(*start, end - start))
}

/// File entries of one disk cache: written, found, and written behind by a background
/// thread (niced, idle I/O class) that never computes a chunk.
pub struct FileEntries {
    disk: Arc<DiskCache>,
    queue: Option<SyncSender<Arc<dyn StoredFile>>>,
    /// Keys queued or being written (asked once).
    pending: Arc<Mutex<HashSet<DiskKey>>>,
}

impl std::fmt::Debug for FileEntries {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FileEntries({:?})", self.disk)
    }
}

impl FileEntries {
    /// The file entries of `tiers`' disk cache, if it has one and they are wanted (the
    /// `disk_cache_files` option).
    pub fn of<E>(tiers: &Tiers<E>, wanted: bool) -> Option<Arc<FileEntries>> {
        let disk = tiers.disk.clone().filter(|_| wanted)?;
        let pending: Arc<Mutex<HashSet<DiskKey>>> = Arc::default();
        let (tx, rx) = sync_channel::<Arc<dyn StoredFile>>(QUEUE);
        let queue = {
            let (disk, pending) = (disk.clone(), pending.clone());
            std::thread::Builder::new()
                .name("xpackfs-files".into())
                .spawn(move || {
                    super::compute::deprioritise_this_thread(19, true);
                    for f in rx {
                        if nothing_to_compute(&*f, &disk) {
                            write(&disk, &*f, ReadCtx::BACKGROUND.cached_only());
                        }
                        if let Some(k) = key(&*f) {
                            pending.lock().remove(&k);
                        }
                    }
                })
                .map_err(|e| tracing::warn!("disk cache: cannot start the file-entry writer ({e}): no file entries written behind"))
                .ok()
                .map(|_| tx)
        };
        Some(Arc::new(FileEntries { disk, queue, pending }))
    }

    pub fn disk(&self) -> &Arc<DiskCache> {
        &self.disk
    }

    /// `f`'s file entry, open and checked (see [`DiskCache::file_entry`]).
    pub fn open(&self, f: &dyn StoredFile) -> FileLookup {
        match key(f) {
            Some(k) => self.disk.file_entry(&k, f.size()),
            None => FileLookup::Absent,
        }
    }

    /// Refresh the use time of `f`'s file entry (it is being served).
    pub fn touch(&self, f: &dyn StoredFile) {
        if let Some(k) = key(f) {
            self.disk.touch_file(&k);
        }
    }

    /// Files queued or being written behind.
    pub fn pending(&self) -> usize {
        self.pending.lock().len()
    }

    /// Whether `f` has a file entry (present, not checked).
    pub fn has(&self, f: &dyn StoredFile) -> bool {
        key(f).is_some_and(|k| self.disk.has_file(&k, f.size()))
    }

    /// Write `f`'s file entry now (its bytes read through the view as `ctx` says: chunks
    /// not in the caches are computed if it allows). Returns whether it is present.
    pub fn write(&self, f: &dyn StoredFile, ctx: ReadCtx) -> bool {
        write(&self.disk, f, ctx)
    }

    /// Write `f`'s file entry in the background if none of its chunks needs computing and
    /// none of its remote parts fetching (a mount calls this when a file's last handle is
    /// closed).
    pub fn write_behind(&self, f: Arc<dyn StoredFile>) {
        let (Some(queue), Some(k)) = (&self.queue, key(&*f)) else { return };
        if self.disk.has_file(&k, f.size()) || !self.pending.lock().insert(k) {
            return;
        }
        if queue.try_send(f).is_err() {
            self.pending.lock().remove(&k);
        }
    }
}

fn write(disk: &DiskCache, f: &dyn StoredFile, ctx: ReadCtx) -> bool {
    let Some(k) = key(f) else { return false };
    disk.put_file(&k, f.size(), &mut |at, buf| f.fill(at, buf, ctx))
}
