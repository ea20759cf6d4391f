//! The fuser adapter: translates FUSE requests into [`Fs`] calls, and `FsError`s into errno
//! in one place (`guarded`, which also turns a panic into EIO). The filesystem logic is
//! [`Fs`]'s. What the adapter decides is what only the FUSE edge knows: the capabilities it
//! negotiates; per open, the flags the kernel gets (whether the page cache holds the file:
//! not for large packs of remote sources, see [`Fs::is_remote_stream`]), how the
//! handle reads the source (the client's `O_DIRECT`, whether the file is source bytes kept
//! in the page cache, the `source_io` option) and whether the kernel serves it from a
//! backing file (the state of that is [`Passthrough`]'s); per read, where it runs: on the
//! FUSE worker, or handed to a [`ReadPool`] (reads of direct handles, and reads that would
//! wait for a chunk), so the workers stay free for metadata, status files and ready bytes
//! while every core computes.

use std::ffi::OsStr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags, KernelConfig, LockOwner, OpenFlags, ReplyAttr, ReplyData,
    ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, Request,
};

use super::fs::{Attr, Found, Fs, FsError, Kind};
use super::passthrough::{Decision, Passthrough};
use super::pools::ReadPool;
use crate::source::SourceIo;
use crate::store::ReadCtx;

/// File-handle bit of handles that read the source with direct I/O (the filesystem's own
/// handles count up from 1, passthrough handles from 2^62: neither reaches it).
const DIRECT_FH: u64 = 1 << 63;

/// The context of a client's read through handle `fh` (direct I/O as the handle says).
fn handle_ctx(fh: FileHandle) -> ReadCtx {
    ReadCtx::CLIENT.direct(fh.0 & DIRECT_FH != 0)
}

/// Contents never change while mounted, so attributes and entries can be cached long.
const TTL: Duration = Duration::from_secs(3600);

pub struct FuseAdapter {
    pub fs: Arc<Fs>,
    pub max_read: u32,
    pub max_background: Option<u16>,
    /// The `direct_io` option: `Some(true)`: FOPEN_DIRECT_IO for every file of the view;
    /// else the kernel keeps the view's files in the mount's page cache, except copies of
    /// source bytes while `cache_copies` is false (auto, until the mount's readahead is set)
    /// and, under auto, large packs of remote sources (`remote_direct`).
    pub direct_io: Option<bool>,
    /// Copies of source bytes ([`Fs::is_source_copy`]) are kept in the mount's page cache and
    /// their buffered handles read the source around it; else they are opened with
    /// FOPEN_DIRECT_IO and read the source through its page cache.
    pub cache_copies: Arc<std::sync::atomic::AtomicBool>,
    /// Under `direct_io=auto`, large packs of remote sources ([`Fs::is_remote_stream`]) are
    /// opened with FOPEN_DIRECT_IO: true until `init` finds the kernel cannot mmap
    /// direct-io files.
    pub remote_direct: bool,
    pub passthrough: Arc<Passthrough>,
    /// How handles read the source: `None` (auto) with direct I/O for clients' `O_DIRECT`
    /// handles and files of source bytes kept in the mount's page cache, else always this
    /// (the `source_io` option).
    pub source_io: Option<SourceIo>,
    /// Where reads of direct handles run (see [`super::pools::read_pool`]); `None`: on the
    /// FUSE worker.
    pub direct_pool: Option<Arc<ReadPool>>,
    /// Direct reads larger than this are read as parallel pieces on the pool (0: whole).
    pub direct_piece: usize,
    /// Negotiate FUSE_ASYNC_DIO (the `async_dio` option).
    pub async_dio: bool,
    /// Whether any file is a whole source file (passthrough candidates), for the exit summary.
    pub passthrough_files: bool,
    pub mount_path: std::path::PathBuf,
    /// Where reads that wait for a chunk run (a [`ReadPool`] of their own); `None`: on the
    /// FUSE worker (views that compute nothing).
    pub waiting: Option<Arc<ReadPool>>,
}

fn to_fuse(a: Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(a.ino),
        size: a.size,
        blocks: a.size.div_ceil(512),
        atime: a.mtime,
        mtime: a.mtime,
        ctime: a.mtime,
        crtime: a.mtime,
        kind: match a.kind {
            Kind::Dir => FileType::Directory,
            Kind::File => FileType::RegularFile,
        },
        perm: a.perm,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: 0,
        blksize: 1 << 20,
        flags: 0,
    }
}

fn errno(e: &FsError) -> Errno {
    Errno::from_i32(e.errno())
}

/// Run one request's filesystem logic behind the guard every callback uses: an error is
/// logged once, here (read failures and bugs at error level, lookups of absent names at
/// debug), and a panic (a bug) becomes EIO instead of taking a worker, and the mount, down.
/// Failures of operations other than reads are counted by operation and errno (reads count
/// their own, with their bytes and latency).
fn guarded<T>(fs: &Fs, op: &'static str, f: impl FnOnce() -> Result<T, FsError>) -> Result<T, Errno> {
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or(Err(FsError::Bug(op)));
    result.map_err(|e| {
        match &e {
            FsError::Read { .. } | FsError::Bug(_) => tracing::error!("{op}: {e}"),
            _ => tracing::debug!("{op}: {e}"),
        }
        if op != "read" {
            fs.stats.record_op_error(op, e.errno());
        }
        errno(&e)
    })
}

impl Filesystem for FuseAdapter {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        if self.passthrough.is_enabled() {
            match config.add_capabilities(InitFlags::FUSE_PASSTHROUGH) {
                // Backing files may themselves be on a stacked filesystem (overlayfs).
                Ok(()) => {
                    if config.set_max_stack_depth(2).is_err() && config.set_max_stack_depth(1).is_err() {
                        self.passthrough.disable("the kernel refused a stacking depth");
                    } else {
                        tracing::info!("FUSE passthrough negotiated: whole source files and disk-cache file entries are served by the kernel");
                    }
                }
                Err(_) => self.passthrough.disable("the kernel does not offer it"),
            }
        }
        if self.direct_io != Some(false) {
            // mmap of direct-io files (SGLang may mmap the pack); kernels without it refuse mmap.
            if config.add_capabilities(InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP).is_err() {
                if self.direct_io == Some(true) {
                    tracing::warn!("direct_io=on: the kernel lacks FUSE_DIRECT_IO_ALLOW_MMAP, so mmap of the files will fail");
                } else {
                    tracing::info!("direct_io=auto: the kernel lacks FUSE_DIRECT_IO_ALLOW_MMAP; the packs, remote ones too, are kept in the page cache");
                    self.cache_copies.store(true, Ordering::Relaxed);
                    self.remote_direct = false;
                }
            }
        }
        // One large O_DIRECT read is sent as concurrent requests, not one after the other.
        if self.async_dio && config.add_capabilities(InitFlags::FUSE_ASYNC_DIO).is_err() {
            tracing::info!("the kernel does not offer FUSE_ASYNC_DIO: O_DIRECT reads are sent one request at a time");
        }
        if let Some(n) = self.max_background {
            let _ = config.set_max_background(n);
        }
        if let Err(max) = config.set_max_readahead(self.max_read) {
            let _ = config.set_max_readahead(max);
        }
        if let Err(max) = config.set_max_write(self.max_read) {
            let _ = config.set_max_write(max);
        }
        Ok(())
    }

    /// The session is over: the kernel has unmounted (umount, or our signal handler did).
    /// Exit here, before fuser drops its mount handle: that drop would unmount the mountpoint
    /// *path* if fuser still thinks it mounted, and a new mount made there in the meantime
    /// (a quick remount, a service restart) would be the one unmounted.
    fn destroy(&mut self) {
        if self.passthrough_files || self.fs.file_entries().is_some() {
            let n = self.passthrough.opens.load(Ordering::Relaxed);
            let reads = self.fs.stats.counts.reads.get();
            tracing::info!("passthrough: {n} opens served by the kernel from backing files; {reads} reads through the daemon");
        }
        tracing::info!("unmounted {}", self.mount_path.display());
        std::process::exit(0);
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let Some(name) = name.to_str() else { return reply.error(Errno::ENOENT) };
        match guarded(&self.fs, "lookup", || self.fs.lookup(parent.0, name)) {
            Ok(a) => {
                let ttl = if self.fs.is_dynamic(a.ino) { Duration::ZERO } else { TTL };
                reply.entry(&ttl, &to_fuse(a), Generation(0))
            }
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let ttl = if self.fs.is_dynamic(ino.0) { Duration::ZERO } else { TTL };
        match guarded(&self.fs, "getattr", || self.fs.attr(ino.0)) {
            Ok(a) => reply.attr(&ttl, &to_fuse(a)),
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let fh = match guarded(&self.fs, "open", || self.fs.open(ino.0, flags.0)) {
            Ok(fh) => fh,
            Err(e) => return reply.error(e),
        };
        if self.fs.may_pass_through(ino.0) {
            let enabled = self.passthrough.is_enabled();
            let found = if enabled && !self.passthrough.has_cached(ino.0) {
                match guarded(&self.fs, "open", || self.fs.passthrough_backing(ino.0)) {
                    Ok(f) => f,
                    Err(e) => return reply.error(e),
                }
            } else {
                Found::NoBacking
            };
            match self.passthrough.open(ino.0, &found, enabled, &reply) {
                Decision::Pass(fh, id) => return reply.opened_passthrough(FileHandle(fh), FopenFlags::empty(), &id),
                Decision::Refuse => {
                    tracing::error!("open: inode {}: its file entry was found damaged while a handle passes it through: refused", ino.0);
                    return reply.error(Errno::EIO);
                }
                Decision::Cached(None) => {}
                Decision::Cached(Some(e)) => match e.raw_os_error() {
                    // The kernel or our privileges refuse passthrough as such.
                    Some(libc::EPERM | libc::ENOTTY | libc::EINVAL | libc::EOPNOTSUPP | libc::ENOSYS) => {
                        self.passthrough.disable(&format!("backing file registration failed: {e}"))
                    }
                    _ => tracing::warn!("passthrough: inode {}: backing file registration failed ({e}): served through the daemon", ino.0),
                },
            }
        }
        // The client's O_DIRECT decides how this handle reads the source (unless overridden).
        // Copies of source bytes kept in the mount's page cache read their source around it
        // too: memory holds one copy, the view's, and a warm re-read never reaches the daemon.
        let client_direct = flags.0 & libc::O_DIRECT != 0;
        let copy = self.fs.is_source_copy(ino.0);
        // A large pack of a remote source bypasses the page cache (auto): its fetched parts
        // are the daemon's copy. Its handles stay direct ones (the direct pool, the
        // direct-read counters), as when the page cache held it.
        let remote_stream = self.direct_io.is_none() && self.remote_direct && self.fs.is_remote_stream(ino.0);
        let fopen_direct = self.direct_io.unwrap_or_else(|| (copy && !self.cache_copies.load(Ordering::Relaxed)) || remote_stream);
        let around = copy && (!fopen_direct || remote_stream);
        let io = self.source_io.unwrap_or(if client_direct || around { SourceIo::Direct } else { SourceIo::Buffered });
        let fh = FileHandle(fh | if io == SourceIo::Direct { DIRECT_FH } else { 0 });
        if self.fs.is_dynamic(ino.0) {
            // Status files are rendered per open: no page cache.
            reply.opened(fh, FopenFlags::FOPEN_DIRECT_IO)
        } else if client_direct {
            // The kernel bypasses the page cache for this handle already; without
            // FOPEN_DIRECT_IO it does so through its direct-I/O path, which sends the
            // requests of one large read at once (FUSE_ASYNC_DIO) instead of one by one.
            reply.opened(fh, FopenFlags::FOPEN_KEEP_CACHE)
        } else if remote_stream {
            // KEEP_CACHE: an open does not drop the pages an mmap of the file cached (the
            // kernel still does on each mmap of a direct-io file).
            reply.opened(fh, FopenFlags::FOPEN_DIRECT_IO | FopenFlags::FOPEN_KEEP_CACHE)
        } else if fopen_direct {
            reply.opened(fh, FopenFlags::FOPEN_DIRECT_IO)
        } else {
            // Immutable contents: keep the kernel's page cache across opens.
            reply.opened(fh, FopenFlags::FOPEN_KEEP_CACHE)
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn read(&self, _req: &Request, ino: INodeNo, fh: FileHandle, offset: u64, size: u32, _flags: OpenFlags, _lock_owner: Option<LockOwner>, reply: ReplyData) {
        let ctx = handle_ctx(fh);
        let fh = fh.0 & !DIRECT_FH;
        // A direct handle's reads leave the worker for the direct pool anyway: only a wait
        // for a chunk sends them to the wait pool instead, not a wait for the network (a
        // remote pack's reads and SGLang's O_DIRECT ones stay on the direct pool).
        let to_direct_pool = ctx.direct && self.direct_pool.is_some();
        if let Some(pool) = &self.waiting
            && !self.fs.ready(ino.0, offset, size.into(), !to_direct_pool)
        {
            // It would wait for a chunk or the network: the worker goes back for the next
            // request.
            let fs = self.fs.clone();
            return pool.spawn(move || serve_read(&fs, ino, fh, offset, size, ctx, 0, reply));
        }
        match &self.direct_pool {
            Some(pool) if ctx.direct => {
                let fs = self.fs.clone();
                let piece = self.direct_piece;
                pool.spawn(move || serve_read(&fs, ino, fh, offset, size, ctx, piece, reply));
            }
            _ => serve_read(&self.fs, ino, fh, offset, size, ctx, 0, reply),
        }
    }

    fn release(&self, _req: &Request, ino: INodeNo, fh: FileHandle, _flags: OpenFlags, _lock_owner: Option<LockOwner>, _flush: bool, reply: ReplyEmpty) {
        // The last handle of an inode closes its backing id; the last one through the daemon
        // may leave a file whose chunks and remote parts are all kept: its file entry is
        // written behind.
        let last_cached = self.passthrough.release(ino.0, fh.0);
        self.fs.release(fh.0 & !DIRECT_FH);
        reply.ok();
        if last_cached && self.passthrough.is_enabled() {
            self.fs.closed(ino.0);
        }
    }

    /// Nothing is buffered for writing: nothing to flush.
    fn flush(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _lock_owner: LockOwner, reply: ReplyEmpty) {
        reply.ok();
    }

    /// No ioctls (isatty probes get the answer a regular file gives).
    #[allow(clippy::too_many_arguments)]
    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: fuser::IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: fuser::ReplyIoctl,
    ) {
        reply.error(Errno::ENOTTY);
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match guarded(&self.fs, "opendir", || self.fs.readdir(ino.0)) {
            Ok(_) => reply.opened(FileHandle(0), FopenFlags::FOPEN_KEEP_CACHE | FopenFlags::FOPEN_CACHE_DIR),
            Err(e) => reply.error(e),
        }
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        match guarded(&self.fs, "readdir", || self.fs.readdir(ino.0)) {
            Ok(entries) => {
                for (i, (child, kind, name)) in entries.into_iter().enumerate().skip(offset as usize) {
                    let kind = if kind == Kind::Dir { FileType::Directory } else { FileType::RegularFile };
                    if reply.add(INodeNo(child), (i + 1) as u64, kind, name) {
                        break;
                    }
                }
                reply.ok()
            }
            Err(e) => reply.error(e),
        }
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let (bytes, files) = guarded(&self.fs, "statfs", || Ok(self.fs.totals())).unwrap_or((0, 0));
        reply.statfs(bytes.div_ceil(4096), 0, 0, files, 0, 4096, 255, 4096);
    }
}

/// Read and answer one request, on the calling thread (in pieces of `piece` bytes run on
/// the current rayon pool, if not 0).
#[allow(clippy::too_many_arguments)]
fn serve_read(fs: &Fs, ino: INodeNo, fh: u64, offset: u64, size: u32, ctx: ReadCtx, piece: usize, reply: ReplyData) {
    let _span = tracing::debug_span!("read", ino = ino.0, offset, size).entered();
    // Bytes the view holds (one chunk, literal or fetched part) go to the reply as they
    // are: the only copy is the kernel's, out of the reply's iovec.
    match guarded(fs, "read", || fs.read_held(ino.0, offset, size as usize, ctx)) {
        Ok(Some(held)) => return reply.data(held.as_slice()),
        Ok(None) => {}
        Err(e) => return reply.error(e),
    }
    // Each thread keeps one buffer, zeroed once and grown to the largest request: no
    // allocation and no memset per read (the view overwrites what it returns). It is taken
    // out while in use: a pool thread waiting for its pieces may serve another request.
    thread_local! {
        static BUF: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
    }
    let mut buf = BUF.take();
    if buf.len() < size as usize {
        buf.resize(size as usize, 0);
    }
    let out = &mut buf[..size as usize];
    match guarded(fs, "read", || fs.read(ino.0, fh, offset, out, ctx, piece)) {
        Ok(n) => reply.data(&out[..n]),
        Err(e) => reply.error(e),
    }
    BUF.set(buf);
}
