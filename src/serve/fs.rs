//! The filesystem logic, free of FUSE: attributes, lookup, directory listing, opens (status
//! files rendered once per open) and reads over a view [`Tree`], with the read counters;
//! and what a passthrough open hands the kernel ([`Fs::passthrough_backing`]: a whole source
//! file, or a file entry of the disk cache, through the storage layer's [`FileEntries`]).
//! Plain methods returning `Result`, tested without a mount; the fuser adapter in `fuse.rs`
//! translates requests and errors and decides where reads run.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

use crate::metrics::metric_set;
use crate::store::{FileEntries, FileLookup, ReadCtx, file_entry_key};
use crate::view::{Held, Ino, NodeKind, Tally, Tree, ViewError, VirtualFile};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Dir,
    File,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attr {
    pub ino: Ino,
    pub kind: Kind,
    pub size: u64,
    pub perm: u16,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub mtime: SystemTime,
}

#[derive(Debug, thiserror::Error)]
pub enum FsError {
    #[error("no such inode {0}")]
    NoInode(Ino),
    #[error("no entry {name:?} in directory inode {parent}")]
    NotFound { parent: Ino, name: String },
    #[error("inode {0} is not a directory")]
    NotDir(Ino),
    #[error("inode {0} is a directory")]
    IsDir(Ino),
    #[error("read-only filesystem")]
    ReadOnly,
    #[error("{path}: {source}")]
    Read { path: String, source: ViewError },
    /// A panic in the filesystem logic, caught at the FUSE edge.
    #[error("internal error in {0} (a bug: it panicked)")]
    Bug(&'static str),
}

impl FsError {
    /// The one place errors become errno values.
    pub fn errno(&self) -> i32 {
        match self {
            FsError::NoInode(_) | FsError::NotFound { .. } => libc::ENOENT,
            FsError::NotDir(_) => libc::ENOTDIR,
            FsError::IsDir(_) => libc::EISDIR,
            FsError::ReadOnly => libc::EROFS,
            FsError::Read { source, .. } => source.errno(),
            FsError::Bug(_) => libc::EIO,
        }
    }
}

/// Who owns the files and what mode they get (derived from the source).
#[derive(Debug, Clone, Copy)]
pub struct Ownership {
    pub uid: u32,
    pub gid: u32,
    /// Read bits of the source's mode; files get these, directories these plus x.
    pub read_bits: u16,
    pub mtime: SystemTime,
}

metric_set! {
    /// Reads of view files through the daemon (status files not counted), registered at the
    /// top of the registry (`xpackfs_<field>_total`).
    pub struct ReadCounters / ReadCounts {
        /// Read requests of view files served through the daemon.
        reads: Counter,
        /// Bytes returned to readers of view files.
        bytes_served: Counter,
        /// Reads of view files that failed (by errno: `xpackfs_read_errors_by_errno_total`).
        read_errors: Counter,
        /// Read requests of handles that read the source with O_DIRECT (under source_io=auto:
        /// clients' O_DIRECT handles, and copies of source bytes kept in the mount's page
        /// cache; a remote source's are counted too, though it has no O_DIRECT).
        direct_reads: Counter,
        /// Bytes returned to those handles.
        direct_bytes: Counter,
        /// Bytes replied straight from a chunk, literal or fetched part held in memory, with
        /// no copy into a reply buffer in the daemon (reads that lie in one computed or
        /// literal extent, or in one fetched part of a remote source).
        bytes_held: Counter,
    }
}

/// The read metrics: [`ReadCounters`], bytes served by origin, errors by errno and the
/// latency histogram.
#[derive(Debug, Default)]
pub struct Stats {
    pub counts: ReadCounters,
    /// Bytes served by origin ([`ORIGINS`]): `identity` (files made only of source bytes,
    /// literals and zeros: the expert pack), and for files with computed parts: `as_is` (their
    /// literal, zero and source bytes: headers, padding, tensors passed through) and their
    /// chunks' by the tier they were found in (`memory`, `disk`, `computed`).
    pub served_by_origin: crate::metrics::Labelled,
    /// Failed reads by errno name.
    pub errors_by_errno: crate::metrics::Labelled,
    pub latency: crate::metrics::Latency,
    /// Failed requests other than reads, by operation and errno name.
    pub op_errors: crate::metrics::Family<[(&'static str, &'static str); 2], crate::metrics::Counter>,
}

/// The origins of served bytes ([`Stats::served_by_origin`]).
pub const ORIGINS: [&str; 5] = ["identity", "as_is", "memory", "disk", "computed"];

/// The operations other than reads whose failures [`Stats::op_errors`] counts.
pub const OPS: [&str; 6] = ["lookup", "getattr", "open", "opendir", "readdir", "statfs"];

impl Stats {
    /// Every read metric, registered under `registry`'s prefix.
    pub fn register(&self, registry: &mut crate::metrics::Registry) {
        self.counts.register(registry);
        registry.register(
            "served_bytes",
            "Bytes returned to readers of view files, by origin: identity (files made only of source bytes, literals and zeros); for files with computed parts, as_is (their literal and source bytes), memory, disk or computed (their chunks, by the tier each was found in)",
            self.served_by_origin.clone(),
        );
        registry.register("read_errors_by_errno", "Reads of view files that failed, by errno", self.errors_by_errno.clone());
        registry.register("read_latency_seconds", "Latency of reads of view files (power-of-two buckets)", self.latency.clone());
        registry.register("op_errors", "Failed requests other than reads, by operation and errno", self.op_errors.clone());
    }

    /// A failed request other than a read (reads count in [`Stats::record_read`]).
    pub fn record_op_error(&self, op: &'static str, errno: i32) {
        self.op_errors.get_or_create(&[("op", op), ("errno", errno_name(errno))]).inc();
    }

    /// [`Stats::op_errors`] as `{op: {errno: count}}`, the operations and errnos seen.
    pub fn op_errors_json(&self) -> serde_json::Value {
        let mut out = serde_json::Map::new();
        for op in OPS {
            let mut by = serde_json::Map::new();
            for e in ERRNO_NAMES {
                if let Some(c) = self.op_errors.get(&[("op", op), ("errno", e)]) {
                    by.insert(e.to_string(), c.get().into());
                }
            }
            if !by.is_empty() {
                out.insert(op.to_string(), by.into());
            }
        }
        out.into()
    }

    fn record_read(&self, result: Result<Tally, i32>, direct: bool, identity: bool, micros: u64) {
        self.latency.record(micros);
        match result {
            Ok(t) => {
                let n = t.total();
                self.counts.bytes_served.inc_by(n);
                if identity {
                    self.served(ORIGINS[0], n);
                } else {
                    for (origin, b) in ORIGINS[1..].iter().zip([t.as_is, t.memory, t.disk, t.computed]) {
                        self.served(origin, b);
                    }
                }
                if direct {
                    self.counts.direct_bytes.inc_by(n);
                }
            }
            Err(errno) => {
                self.counts.read_errors.inc();
                self.errors_by_errno.get_or_create(&[("errno", errno_name(errno))]).inc();
            }
        }
    }

    fn served(&self, origin: &'static str, n: u64) {
        if n > 0 {
            self.served_by_origin.get_or_create(&[("origin", origin)]).inc_by(n);
        }
    }

    /// [`Stats::served_by_origin`] as `{origin: bytes}`, every origin.
    pub fn served_json(&self) -> serde_json::Value {
        ORIGINS
            .iter()
            .map(|o| (o.to_string(), self.served_by_origin.get(&[("origin", *o)]).map_or(0, |c| c.get()).into()))
            .collect::<serde_json::Map<_, _>>()
            .into()
    }

    /// Upper bound (microseconds) of the bucket holding quantile `q` of recorded reads.
    pub fn latency_quantile(&self, q: f64) -> u64 {
        self.latency.quantile(q)
    }
}

/// Every name [`errno_name`] gives.
const ERRNO_NAMES: [&str; 15] =
    ["EIO", "ENOENT", "EISDIR", "ENOTDIR", "EROFS", "EINVAL", "ENOMEM", "EAGAIN", "EINTR", "EBADF", "EFAULT", "ENOSPC", "EOVERFLOW", "ESTALE", "other"];

/// The symbolic name of the errno values a request can give.
fn errno_name(errno: i32) -> &'static str {
    match errno {
        libc::EIO => "EIO",
        libc::ENOENT => "ENOENT",
        libc::EISDIR => "EISDIR",
        libc::ENOTDIR => "ENOTDIR",
        libc::EROFS => "EROFS",
        libc::EINVAL => "EINVAL",
        libc::ENOMEM => "ENOMEM",
        libc::EAGAIN => "EAGAIN",
        libc::EINTR => "EINTR",
        libc::EBADF => "EBADF",
        libc::EFAULT => "EFAULT",
        libc::ENOSPC => "ENOSPC",
        libc::EOVERFLOW => "EOVERFLOW",
        libc::ESTALE => "ESTALE",
        _ => "other",
    }
}

#[derive(Debug)]
pub struct Fs {
    tree: Arc<Tree>,
    owner: Ownership,
    pub stats: Arc<Stats>,
    /// Status files are generated once per open: every read of one handle sees the same
    /// bytes (reads of a fresh rendering per request could splice two versions together).
    snapshots: parking_lot::Mutex<std::collections::HashMap<u64, Arc<Vec<u8>>>>,
    next_handle: AtomicU64,
    /// Whole files kept in the disk cache, for passthrough opens ([`Fs::passthrough_backing`]).
    files: Option<Arc<FileEntries>>,
}

/// What a passthrough open hands the kernel: a whole source file, or a file entry of the
/// disk cache that holds the file's bytes.
#[derive(Debug)]
pub enum Backing {
    Source(Arc<crate::source::SourceFile>),
    Entry(std::fs::File),
}

/// What a passthrough open found for a file.
#[derive(Debug)]
pub enum Found {
    Backing(Backing),
    /// No backing file (none kept, or not looked for): the open goes through the daemon.
    NoBacking,
    /// Its file entry was found damaged (and deleted).
    Corrupt,
}

impl Backing {
    /// The file to hand the kernel (`None` for a remote source, which has no local file).
    pub fn file(&self) -> Option<&std::fs::File> {
        match self {
            Backing::Source(s) => s.file(),
            Backing::Entry(f) => Some(f),
        }
    }
}

/// File handle of opens that need no per-handle state.
pub const NO_HANDLE: u64 = 0;

impl Fs {
    pub fn new(tree: Tree, owner: Ownership) -> Self {
        Self::with_stats(tree, owner, Arc::default())
    }

    pub fn with_stats(tree: Tree, owner: Ownership, stats: Arc<Stats>) -> Self {
        Fs { tree: Arc::new(tree), owner, stats, snapshots: Default::default(), next_handle: AtomicU64::new(1), files: None }
    }

    /// Serve files kept whole in the disk cache by passthrough, and write them behind.
    pub fn with_file_entries(mut self, files: Option<Arc<FileEntries>>) -> Self {
        self.files = files;
        self
    }

    pub fn file_entries(&self) -> Option<&Arc<FileEntries>> {
        self.files.as_ref()
    }

    fn vfile(&self, ino: Ino) -> Option<&Arc<VirtualFile>> {
        match self.tree.get(ino).map(|n| &n.kind) {
            Some(NodeKind::File(f)) => Some(f),
            _ => None,
        }
    }

    /// Whether a passthrough open of `ino` may be possible: a whole source file, or a file
    /// that can have a file entry.
    pub fn may_pass_through(&self, ino: Ino) -> bool {
        self.vfile(ino).is_some_and(|f| f.whole_source().is_some() || (self.files.is_some() && file_entry_key(&**f).is_some()))
    }

    /// `ino` is being passed through: refresh the use time of its file entry (the LRU of
    /// the disk cache sees no reads of it).
    pub fn in_use(&self, ino: Ino) {
        if let (Some(files), Some(f)) = (&self.files, self.vfile(ino)) {
            files.touch(&**f);
        }
    }

    /// The last non-passthrough handle of `ino` was closed: write its file entry behind if
    /// every chunk and remote part of it is in memory or in the disk cache.
    pub fn closed(&self, ino: Ino) {
        if let (Some(files), Some(f)) = (&self.files, self.vfile(ino)) {
            files.write_behind(f.clone());
        }
    }

    /// Status files change between reads: no caching of their pages or attributes.
    pub fn is_dynamic(&self, ino: Ino) -> bool {
        matches!(self.tree.get(ino).map(|n| &n.kind), Some(NodeKind::Dynamic(_)))
    }

    pub fn tree(&self) -> &Tree {
        &self.tree
    }

    pub fn attr(&self, ino: Ino) -> Result<Attr, FsError> {
        let node = self.tree.get(ino).ok_or(FsError::NoInode(ino))?;
        let (kind, size, perm, nlink) = match &node.kind {
            NodeKind::Dir { children } => {
                let subdirs = children.values().filter(|&&c| matches!(self.tree.get(c).map(|n| &n.kind), Some(NodeKind::Dir { .. }))).count() as u32;
                let r = self.owner.read_bits;
                (Kind::Dir, 0, r | (r >> 2 & 0o111), 2 + subdirs)
            }
            NodeKind::File(f) => (Kind::File, f.size(), self.owner.read_bits, 1),
            NodeKind::Dynamic(content) => (Kind::File, content().len() as u64, self.owner.read_bits, 1),
        };
        Ok(Attr { ino, kind, size, perm, nlink, uid: self.owner.uid, gid: self.owner.gid, mtime: self.owner.mtime })
    }

    pub fn lookup(&self, parent: Ino, name: &str) -> Result<Attr, FsError> {
        match &self.tree.get(parent).ok_or(FsError::NoInode(parent))?.kind {
            NodeKind::Dir { children } => {
                let ino = children.get(name).ok_or_else(|| FsError::NotFound { parent, name: name.to_string() })?;
                self.attr(*ino)
            }
            _ => Err(FsError::NotDir(parent)),
        }
    }

    /// Entries of a directory including `.` and `..`, as (ino, kind, name).
    pub fn readdir(&self, ino: Ino) -> Result<Vec<(Ino, Kind, String)>, FsError> {
        let node = self.tree.get(ino).ok_or(FsError::NoInode(ino))?;
        let NodeKind::Dir { children } = &node.kind else { return Err(FsError::NotDir(ino)) };
        let mut out = vec![(ino, Kind::Dir, ".".to_string()), (node.parent, Kind::Dir, "..".to_string())];
        for (name, &child) in children {
            out.push((child, self.attr(child)?.kind, name.clone()));
        }
        Ok(out)
    }

    /// Check that an open is read-only and of a file; returns the handle for its reads
    /// ([`NO_HANDLE`] but for status files, which are rendered here, once per open).
    pub fn open(&self, ino: Ino, flags: i32) -> Result<u64, FsError> {
        if flags & libc::O_ACCMODE != libc::O_RDONLY || flags & libc::O_TRUNC != 0 {
            return Err(FsError::ReadOnly);
        }
        match &self.tree.get(ino).ok_or(FsError::NoInode(ino))?.kind {
            NodeKind::File(_) => Ok(NO_HANDLE),
            NodeKind::Dynamic(content) => {
                let fh = self.next_handle.fetch_add(1, Ordering::Relaxed);
                self.snapshots.lock().insert(fh, Arc::new(content()));
                Ok(fh)
            }
            NodeKind::Dir { .. } => Err(FsError::IsDir(ino)),
        }
    }

    /// The handle is closed.
    pub fn release(&self, fh: u64) {
        if fh != NO_HANDLE {
            self.snapshots.lock().remove(&fh);
        }
    }

    /// Bytes and number of the view's files (for statfs).
    pub fn totals(&self) -> (u64, u64) {
        self.tree.vfiles().fold((0, 0), |(b, n), f| (b + f.size(), n + 1))
    }

    /// Whether a read of `len` bytes at `offset` is served without waiting for a chunk to be
    /// loaded or computed, or (if `network`) for remote bytes not in memory (status files,
    /// literal and local source bytes, chunks in memory).
    pub fn ready(&self, ino: Ino, offset: u64, len: u64, network: bool) -> bool {
        match self.tree.get(ino).map(|n| &n.kind) {
            Some(NodeKind::File(f)) => f.ready(offset, len, network),
            _ => true,
        }
    }

    /// Whether any file is a copy of source bytes ([`Fs::is_source_copy`]).
    pub fn has_source_copies(&self) -> bool {
        self.tree.vfiles().any(|f| source_copy(f))
    }

    /// Whether the file is made of source bytes laid out anew ([`VirtualFile::is_source_bytes`],
    /// the packs), not a whole source file: kept in the mount's page cache (unless remote,
    /// [`Fs::is_remote_stream`]), its buffered handles read the source around the page
    /// cache. A whole source file (an INT8 tree's) is the source's own pages: passed
    /// through, or read through the daemon.
    pub fn is_source_copy(&self, ino: Ino) -> bool {
        matches!(self.tree.get(ino).map(|n| &n.kind), Some(NodeKind::File(f)) if source_copy(f))
    }

    /// Whether the file is a copy of source bytes ([`Fs::is_source_copy`], a pack) of a remote
    /// source, larger than one part (`remote_part_mb`). Under `direct_io=auto` its buffered
    /// handles bypass the mount's page cache, as `O_DIRECT` readers (SGLang's loader) do:
    /// filling fresh page-cache pages was the largest part of the daemon's CPU in a cold
    /// read, and memory held the bytes twice (the fetched parts and the pages). A re-read is
    /// served from the parts still held, from the disk cache if there is one, else fetched
    /// again. Whole remote files (safetensors shards, INT8 trees: what loaders mmap, and the
    /// kernel drops a direct-io file's pages at every mmap) and files under one part stay
    /// cached.
    pub fn is_remote_stream(&self, ino: Ino) -> bool {
        matches!(self.tree.get(ino).map(|n| &n.kind), Some(NodeKind::File(f))
            if source_copy(f) && f.reads_remote() && f.size() > crate::source::remote::parts::part_size())
    }

    /// Whether any file has computed chunks (reads that may wait).
    pub fn has_computed(&self) -> bool {
        self.tree.vfiles().any(|f| !f.is_identity())
    }

    /// Whether any file has bytes of a remote source.
    pub fn reads_remote(&self) -> bool {
        self.tree.vfiles().any(|f| f.reads_remote())
    }

    /// What a passthrough open of `ino` hands the kernel: for a whole source file, that
    /// file, checked now to be unchanged (so the kernel gets only the inode that was
    /// validated); for a file kept whole in the disk cache, its entry, checked
    /// ([`crate::store::DiskCache::file_entry`]). [`Found::NoBacking`] for every other file.
    pub fn passthrough_backing(&self, ino: Ino) -> Result<Found, FsError> {
        let node = self.tree.get(ino).ok_or(FsError::NoInode(ino))?;
        let NodeKind::File(f) = &node.kind else { return Ok(Found::NoBacking) };
        if let Some(src) = f.whole_source().filter(|s| !s.is_remote()) {
            src.check_now().map_err(|e| FsError::Read { path: node.name.clone(), source: ViewError::Source(e) })?;
            return Ok(Found::Backing(Backing::Source(src.clone())));
        }
        Ok(match self.files.as_ref().map(|files| files.open(&**f)) {
            Some(FileLookup::Sound(file)) => Found::Backing(Backing::Entry(file)),
            Some(FileLookup::Corrupt) => Found::Corrupt,
            Some(FileLookup::Absent) | None => Found::NoBacking,
        })
    }

    /// Read into `buf` through handle `fh` as `ctx` says (a client's read, direct I/O as its
    /// handle reads the source); returns the byte count (short only at end of file). A
    /// request larger than `piece` bytes (if not 0) is read as pieces at once on the current
    /// rayon pool (cut at piece-aligned offsets): one request then keeps several device reads
    /// in flight. Same bytes, count and errors as one read.
    pub fn read(&self, ino: Ino, fh: u64, offset: u64, buf: &mut [u8], ctx: ReadCtx, piece: usize) -> Result<usize, FsError> {
        let node = self.tree.get(ino).ok_or(FsError::NoInode(ino))?;
        let f = match &node.kind {
            NodeKind::File(f) => f,
            NodeKind::Dynamic(content) => {
                let c = self.snapshots.lock().get(&fh).cloned().unwrap_or_else(|| Arc::new(content()));
                let start = (offset as usize).min(c.len());
                let n = (c.len() - start).min(buf.len());
                buf[..n].copy_from_slice(&c[start..start + n]);
                return Ok(n);
            }
            NodeKind::Dir { .. } => return Err(FsError::IsDir(ino)),
        };
        let started = std::time::Instant::now();
        let result = if piece == 0 || buf.len() <= piece { f.read_tallied(offset, buf, ctx) } else { read_in_pieces(f, offset, buf, ctx, piece) };
        self.counted(&node.name, f, ctx, started, result, |t| *t).map(|t| t.total() as usize)
    }

    /// [`Fs::read`] of up to `len` bytes without copying them, where the view holds them
    /// ([`crate::view::VirtualFile::read_held`]: the request lies in one literal or computed
    /// extent, or in one fetched part of a remote source); counted as `read` counts, and in
    /// `bytes_held`. `None`, with nothing read or counted, for every other request (status
    /// files included): `read` serves those.
    pub fn read_held(&self, ino: Ino, offset: u64, len: usize, ctx: ReadCtx) -> Result<Option<Held>, FsError> {
        let node = self.tree.get(ino).ok_or(FsError::NoInode(ino))?;
        let NodeKind::File(f) = &node.kind else { return Ok(None) };
        let started = std::time::Instant::now();
        let result = match f.read_held(offset, len, ctx) {
            Ok(None) => return Ok(None),
            Ok(Some(held)) => Ok(held),
            Err(e) => Err(e),
        };
        let held = self.counted(&node.name, f, ctx, started, result, Held::tally)?;
        self.stats.counts.bytes_held.inc_by(held.as_slice().len() as u64);
        Ok(Some(held))
    }

    /// Count one read of `f` (named `name`) in `ctx`, begun at `started`, that gave `result`
    /// (`bytes` of it, by origin), in the read metrics; its error named.
    fn counted<T>(
        &self,
        name: &str,
        f: &VirtualFile,
        ctx: ReadCtx,
        started: std::time::Instant,
        result: Result<T, ViewError>,
        bytes: impl Fn(&T) -> Tally,
    ) -> Result<T, FsError> {
        self.stats.counts.reads.inc();
        if ctx.direct {
            self.stats.counts.direct_reads.inc();
        }
        let result = result.map_err(|source| FsError::Read { path: name.to_string(), source });
        let micros = started.elapsed().as_micros() as u64;
        self.stats.record_read(result.as_ref().map(&bytes).map_err(FsError::errno), ctx.direct, f.is_identity(), micros);
        result
    }
}

/// `f.read_at` of `buf` at `offset` as pieces of at most `piece` bytes run at once.
fn read_in_pieces(f: &VirtualFile, offset: u64, buf: &mut [u8], ctx: ReadCtx, piece: usize) -> Result<Tally, ViewError> {
    let want = (buf.len() as u64).min(f.size().saturating_sub(offset)) as usize;
    let mut pieces = Vec::new();
    let (mut rest, mut pos) = (&mut buf[..want], offset);
    while !rest.is_empty() {
        let cut = (piece as u64 - pos % piece as u64) as usize;
        let (head, tail) = rest.split_at_mut(cut.min(rest.len()));
        pieces.push((pos, head, Ok(Tally::default())));
        pos += cut as u64;
        rest = tail;
    }
    rayon::scope(|s| {
        for (pos, out, result) in pieces.iter_mut() {
            s.spawn(move |_| *result = f.read_tallied(*pos, out, ctx));
        }
    });
    pieces.into_iter().try_fold(Tally::default(), |t, (_, _, r)| Ok(t.plus(r?)))
}

/// See [`Fs::is_source_copy`].
fn source_copy(f: &VirtualFile) -> bool {
    f.is_source_bytes() && f.whole_source().is_none()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::view::ROOT_INO;

    fn fs() -> Fs {
        let mut t = Tree::new();
        let d = t.add_dir(ROOT_INO, "sub");
        t.add_file(d, "a", VirtualFile::from_bytes(b"hello".to_vec()));
        t.add_file(ROOT_INO, "b", VirtualFile::from_bytes(b"xy".to_vec()));
        Fs::new(t, Ownership { uid: 7, gid: 8, read_bits: 0o444, mtime: SystemTime::UNIX_EPOCH })
    }

    #[test]
    fn lookup_attr_readdir_read() {
        let fs = fs();
        let root = fs.attr(ROOT_INO).unwrap();
        assert_eq!((root.kind, root.perm, root.nlink), (Kind::Dir, 0o555, 3));
        let sub = fs.lookup(ROOT_INO, "sub").unwrap();
        let a = fs.lookup(sub.ino, "a").unwrap();
        assert_eq!((a.size, a.perm, a.uid, a.gid), (5, 0o444, 7, 8));
        let names: Vec<String> = fs.readdir(ROOT_INO).unwrap().into_iter().map(|e| e.2).collect();
        assert_eq!(names, [".", "..", "b", "sub"]);
        let mut buf = [0u8; 10];
        assert_eq!(fs.read(a.ino, NO_HANDLE, 1, &mut buf, ReadCtx::CLIENT, 0).unwrap(), 4);
        assert_eq!(&buf[..4], b"ello");
        assert_eq!(fs.lookup(ROOT_INO, "zz").unwrap_err().errno(), libc::ENOENT);
        assert_eq!(fs.lookup(a.ino, "x").unwrap_err().errno(), libc::ENOTDIR);
        assert_eq!(fs.open(a.ino, libc::O_RDWR).unwrap_err().errno(), libc::EROFS);
        assert_eq!(fs.open(sub.ino, libc::O_RDONLY).unwrap_err().errno(), libc::EISDIR);
        assert!(fs.open(a.ino, libc::O_RDONLY | libc::O_DIRECT).is_ok());
    }

    #[test]
    fn status_files_are_one_rendering_per_open() {
        let mut t = Tree::new();
        let n = Arc::new(AtomicU64::new(0));
        let counter = n.clone();
        t.add_dynamic(ROOT_INO, "s", Arc::new(move || format!("render {}", counter.fetch_add(1, Ordering::SeqCst)).into_bytes()));
        let fs = Fs::new(t, Ownership { uid: 0, gid: 0, read_bits: 0o444, mtime: SystemTime::UNIX_EPOCH });
        let ino = fs.lookup(ROOT_INO, "s").unwrap().ino;
        let fh = fs.open(ino, libc::O_RDONLY).unwrap();
        let mut buf = [0u8; 3];
        let mut got = Vec::new();
        for off in (0..12).step_by(3) {
            let k = fs.read(ino, fh, off, &mut buf, ReadCtx::CLIENT, 0).unwrap();
            got.extend_from_slice(&buf[..k]);
        }
        // Each read renders anew (counter + 1) unless the handle's snapshot is used.
        let rendered = n.load(Ordering::SeqCst);
        assert_eq!(got, format!("render {}", rendered - 1).into_bytes());
        fs.release(fh);
        let fh = fs.open(ino, libc::O_RDONLY).unwrap();
        assert_eq!(fs.read(ino, fh, 7, &mut buf, ReadCtx::CLIENT, 0).unwrap(), 1);
        assert_eq!(buf[0], format!("{rendered}").as_bytes()[0]);
    }

    #[test]
    fn reads_in_pieces_equal_one_read() {
        let bytes: Vec<u8> = (0..50_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let mut t = Tree::new();
        let mut f = VirtualFile::new();
        f.push(crate::view::Extent::Bytes(Arc::from(&bytes[..20_000])));
        f.push(crate::view::Extent::Zeros(1000));
        f.push(crate::view::Extent::Bytes(Arc::from(&bytes[20_000..])));
        let whole: Vec<u8> = [&bytes[..20_000], &[0u8; 1000][..], &bytes[20_000..]].concat();
        t.add_file(ROOT_INO, "f", f);
        let fs = Fs::new(t, Ownership { uid: 0, gid: 0, read_bits: 0o444, mtime: SystemTime::UNIX_EPOCH });
        let ino = fs.lookup(ROOT_INO, "f").unwrap().ino;
        for (off, len) in [(0usize, 51_000usize), (1, 9000), (4095, 4098), (40_000, 20_000), (51_000, 10), (10, 3)] {
            let mut buf = vec![0xAAu8; len];
            let n = fs.read(ino, NO_HANDLE, off as u64, &mut buf, ReadCtx::CLIENT, 4096).unwrap();
            assert_eq!(&buf[..n], &whole[off.min(whole.len())..(off + len).min(whole.len())], "offset {off} len {len}");
        }
    }

    /// A request inside one literal is replied from it, counted once as a read and in
    /// `bytes_held`; one across extents, or of a status file, is left to `read` uncounted.
    #[test]
    fn held_reads_are_counted_once() {
        let mut t = Tree::new();
        let mut f = VirtualFile::new();
        f.push(crate::view::Extent::Bytes(Arc::from(&b"abcdef"[..])));
        f.push(crate::view::Extent::Zeros(4));
        t.add_file(ROOT_INO, "f", f);
        t.add_dynamic(ROOT_INO, "s", Arc::new(|| b"status".to_vec()));
        let fs = Fs::new(t, Ownership { uid: 0, gid: 0, read_bits: 0o444, mtime: SystemTime::UNIX_EPOCH });
        let ino = fs.lookup(ROOT_INO, "f").unwrap().ino;
        let held = fs.read_held(ino, 1, 3, ReadCtx::CLIENT).unwrap().unwrap();
        assert_eq!(held.as_slice(), b"bcd");
        assert!(fs.read_held(ino, 4, 4, ReadCtx::CLIENT).unwrap().is_none(), "across extents");
        assert!(fs.read_held(ino, 7, 2, ReadCtx::CLIENT).unwrap().is_none(), "zeros");
        let status = fs.lookup(ROOT_INO, "s").unwrap().ino;
        assert!(fs.read_held(status, 0, 3, ReadCtx::CLIENT).unwrap().is_none());
        let c = fs.stats.counts.snapshot();
        assert_eq!((c.reads, c.bytes_served, c.bytes_held), (1, 3, 3));
        assert_eq!(fs.read_held(999, 0, 1, ReadCtx::CLIENT).unwrap_err().errno(), libc::ENOENT);
    }

    /// Bytes of a file with computed parts are counted by origin: its literal bytes as
    /// `as_is`, its chunks' by the tier the producer found them in; copied or held alike.
    #[test]
    fn served_bytes_by_origin_follow_the_chunks_tier() {
        #[derive(Debug)]
        struct FromDisk;
        impl crate::view::ChunkProducer for FromDisk {
            fn chunk(&self, _id: u64, _ctx: ReadCtx) -> Result<crate::view::Chunk, ViewError> {
                Ok(crate::view::Chunk { bytes: Arc::from(&[7u8; 100][..]), tier: crate::store::Tier::Disk })
            }
        }
        let mut t = Tree::new();
        let mut f = VirtualFile::new();
        f.push(crate::view::Extent::Bytes(Arc::from(&b"head"[..])));
        f.push(crate::view::Extent::Computed { producer: Arc::new(FromDisk), id: 0, len: 100 });
        t.add_file(ROOT_INO, "f", f);
        let fs = Fs::new(t, Ownership { uid: 0, gid: 0, read_bits: 0o444, mtime: SystemTime::UNIX_EPOCH });
        let ino = fs.lookup(ROOT_INO, "f").unwrap().ino;
        let mut buf = [0u8; 10];
        assert_eq!(fs.read(ino, NO_HANDLE, 0, &mut buf, ReadCtx::CLIENT, 0).unwrap(), 10);
        assert_eq!(fs.read_held(ino, 50, 30, ReadCtx::CLIENT).unwrap().unwrap().as_slice(), &[7u8; 30]);
        assert_eq!(fs.stats.served_json(), serde_json::json!({"identity": 0, "as_is": 4, "memory": 0, "disk": 36, "computed": 0}));
    }

    #[test]
    fn read_metrics() {
        let s = Stats::default();
        s.record_read(Ok(Tally { as_is: 10, ..Tally::default() }), false, true, 3);
        s.record_read(Ok(Tally { as_is: 1, memory: 2, computed: 2, disk: 0 }), true, false, 100);
        s.record_read(Err(libc::EIO), false, false, 5000);
        let c = s.counts.snapshot();
        assert_eq!((c.bytes_served, c.direct_bytes, c.read_errors), (15, 5, 1));
        assert_eq!(s.latency_quantile(0.5), 128);
        assert_eq!(s.served_json(), serde_json::json!({"identity": 10, "as_is": 1, "memory": 2, "disk": 0, "computed": 2}));
        let mut r = crate::metrics::Registry::with_prefix("xpackfs");
        s.register(&mut r);
        let text = crate::metrics::render(&r);
        for line in [
            "xpackfs_bytes_served_total 15\n",
            "xpackfs_served_bytes_total{origin=\"identity\"} 10\n",
            "xpackfs_served_bytes_total{origin=\"as_is\"} 1\n",
            "xpackfs_served_bytes_total{origin=\"memory\"} 2\n",
            "xpackfs_served_bytes_total{origin=\"computed\"} 2\n",
            "xpackfs_read_errors_by_errno_total{errno=\"EIO\"} 1\n",
            "xpackfs_read_latency_seconds_count 3\n",
        ] {
            assert!(text.contains(line), "{line} not in {text}");
        }
    }

    #[test]
    fn errors_of_other_operations_by_operation_and_errno() {
        let s = Stats::default();
        s.record_op_error("lookup", libc::ENOENT);
        s.record_op_error("lookup", libc::ENOENT);
        s.record_op_error("open", libc::EROFS);
        s.record_op_error("getattr", 12345);
        assert_eq!(s.op_errors_json(), serde_json::json!({"lookup": {"ENOENT": 2}, "getattr": {"other": 1}, "open": {"EROFS": 1}}));
        let mut r = crate::metrics::Registry::with_prefix("xpackfs");
        s.register(&mut r);
        let text = crate::metrics::render(&r);
        for line in ["xpackfs_op_errors_total{op=\"lookup\",errno=\"ENOENT\"} 2\n", "xpackfs_op_errors_total{op=\"open\",errno=\"EROFS\"} 1\n"] {
            assert!(text.contains(line), "{line} not in {text}");
        }
        // Every name errno_name gives is one the JSON looks for.
        for e in [
            libc::EIO,
            libc::ENOENT,
            libc::EISDIR,
            libc::ENOTDIR,
            libc::EROFS,
            libc::EINVAL,
            libc::ENOMEM,
            libc::EAGAIN,
            libc::EINTR,
            libc::EBADF,
            libc::EFAULT,
            libc::ENOSPC,
            libc::EOVERFLOW,
            libc::ESTALE,
            0,
        ] {
            assert!(ERRNO_NAMES.contains(&errno_name(e)), "{e}");
        }
    }
}
