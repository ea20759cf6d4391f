//! The fuser adapter: translates FUSE requests into [`Fs`] calls and `FsError`s into
//! errno. No filesystem logic lives here.

use std::ffi::OsStr;
use std::sync::Arc;
use std::time::Duration;

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, KernelConfig, LockOwner,
    OpenFlags, ReplyAttr, ReplyData, ReplyDirectory, ReplyEntry, ReplyOpen, ReplyStatfs, Request,
};

use super::fs::{Attr, Fs, FsError, Kind};

/// Contents never change while mounted, so attributes and entries can be cached long.
const TTL: Duration = Duration::from_secs(3600);

pub struct FuseAdapter {
    pub fs: Arc<Fs>,
    pub max_read: u32,
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

fn log_err(op: &str, e: &FsError) {
    match e {
        FsError::Read { .. } => tracing::error!("{op}: {e}"),
        _ => tracing::debug!("{op}: {e}"),
    }
}

impl Filesystem for FuseAdapter {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        if let Err(max) = config.set_max_readahead(self.max_read) {
            let _ = config.set_max_readahead(max);
        }
        if let Err(max) = config.set_max_write(self.max_read) {
            let _ = config.set_max_write(max);
        }
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let Some(name) = name.to_str() else { return reply.error(Errno::ENOENT) };
        match self.fs.lookup(parent.0, name) {
            Ok(a) => {
                let ttl = if self.fs.is_dynamic(a.ino) { Duration::ZERO } else { TTL };
                reply.entry(&ttl, &to_fuse(a), Generation(0))
            }
            Err(e) => {
                log_err("lookup", &e);
                reply.error(errno(&e))
            }
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let ttl = if self.fs.is_dynamic(ino.0) { Duration::ZERO } else { TTL };
        match self.fs.attr(ino.0) {
            Ok(a) => reply.attr(&ttl, &to_fuse(a)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        match self.fs.open(ino.0, flags.0) {
            // Status files are generated per read: no page cache.
            Ok(()) if self.fs.is_dynamic(ino.0) => reply.opened(FileHandle(0), FopenFlags::FOPEN_DIRECT_IO),
            // Immutable contents: keep the kernel's page cache across opens.
            Ok(()) => reply.opened(FileHandle(0), FopenFlags::FOPEN_KEEP_CACHE),
            Err(e) => {
                log_err("open", &e);
                reply.error(errno(&e))
            }
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let _span = tracing::debug_span!("read", ino = ino.0, offset, size).entered();
        let mut buf = vec![0u8; size as usize];
        // A bug must not take a worker thread (and the mount) down: a panic is an EIO.
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.fs.read(ino.0, offset, &mut buf)));
        match result {
            Ok(Ok(n)) => reply.data(&buf[..n]),
            Ok(Err(e)) => {
                log_err("read", &e);
                reply.error(errno(&e))
            }
            Err(_) => {
                tracing::error!("read of inode {} at {offset}: internal error (panic); answered EIO", ino.0);
                reply.error(Errno::EIO)
            }
        }
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.fs.readdir(ino.0) {
            Ok(_) => reply.opened(FileHandle(0), FopenFlags::FOPEN_KEEP_CACHE | FopenFlags::FOPEN_CACHE_DIR),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        match self.fs.readdir(ino.0) {
            Ok(entries) => {
                for (i, (child, kind, name)) in entries.into_iter().enumerate().skip(offset as usize) {
                    let kind = if kind == Kind::Dir { FileType::Directory } else { FileType::RegularFile };
                    if reply.add(INodeNo(child), (i + 1) as u64, kind, name) {
                        break;
                    }
                }
                reply.ok()
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let files = self.fs.tree().files();
        let bytes: u64 = files.iter().map(|(_, f)| f.size()).sum();
        reply.statfs(bytes.div_ceil(4096), 0, 0, files.len() as u64, 0, 4096, 255, 4096);
    }
}
