//! The benchmark peer: a minimal FUSE daemon that serves one file, answering every read
//! with a `pread` of it. It measures the FUSE transport alone on this machine; it has the
//! same worker threads, request sizes and page-cache policy as xpackfs.
//!
//!     cargo run --release --example minipass -- FILE MOUNTPOINT [--threads 8] [--direct-io] [--no-read]
//!
//! `--no-read` answers every read from a zeroed buffer without reading the file: the
//! transport with the daemon's copy of the bytes taken out, an upper bound on what a
//! zero-copy reply path (splice from the source to /dev/fuse) could gain.

use std::ffi::OsStr;
use std::os::unix::fs::FileExt;
use std::time::{Duration, UNIX_EPOCH};

use fuser::{
    Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, KernelConfig, LockOwner, MountOption, OpenFlags, ReplyAttr,
    ReplyData, ReplyDirectory, ReplyEntry, ReplyOpen, Request,
};

struct Pass {
    file: std::fs::File,
    size: u64,
    direct_io: bool,
    no_read: bool,
}

fn attr(ino: u64, size: u64, dir: bool) -> FileAttr {
    FileAttr {
        ino: INodeNo(ino),
        size,
        blocks: size.div_ceil(512),
        atime: UNIX_EPOCH,
        mtime: UNIX_EPOCH,
        ctime: UNIX_EPOCH,
        crtime: UNIX_EPOCH,
        kind: if dir { FileType::Directory } else { FileType::RegularFile },
        perm: if dir { 0o555 } else { 0o444 },
        nlink: if dir { 2 } else { 1 },
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 1 << 20,
        flags: 0,
    }
}

const TTL: Duration = Duration::from_secs(3600);

impl Filesystem for Pass {
    fn init(&mut self, _req: &Request, c: &mut KernelConfig) -> std::io::Result<()> {
        let _ = c.set_max_readahead(1 << 20);
        let _ = c.set_max_write(1 << 20);
        Ok(())
    }
    fn lookup(&self, _r: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        if parent.0 == 1 && name == "file" { reply.entry(&TTL, &attr(2, self.size, false), Generation(0)) } else { reply.error(Errno::ENOENT) }
    }
    fn getattr(&self, _r: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        reply.attr(&TTL, &attr(ino.0, if ino.0 == 2 { self.size } else { 0 }, ino.0 == 1))
    }
    fn open(&self, _r: &Request, _ino: INodeNo, _f: OpenFlags, reply: ReplyOpen) {
        let flags = if self.direct_io { FopenFlags::FOPEN_DIRECT_IO } else { FopenFlags::FOPEN_KEEP_CACHE };
        reply.opened(FileHandle(0), flags)
    }
    #[allow(clippy::too_many_arguments)]
    fn read(&self, _r: &Request, _ino: INodeNo, _fh: FileHandle, off: u64, size: u32, _f: OpenFlags, _l: Option<LockOwner>, reply: ReplyData) {
        let n = (size as u64).min(self.size.saturating_sub(off)) as usize;
        if self.no_read {
            static ZEROS: [u8; 1 << 20] = [0; 1 << 20];
            return reply.data(&ZEROS[..n.min(ZEROS.len())]);
        }
        let mut buf = vec![0u8; n];
        match self.file.read_exact_at(&mut buf, off) {
            Ok(()) => reply.data(&buf),
            Err(_) => reply.error(Errno::EIO),
        }
    }
    fn readdir(&self, _r: &Request, _ino: INodeNo, _fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        for (i, (ino, kind, name)) in
            [(1, FileType::Directory, "."), (1, FileType::Directory, ".."), (2, FileType::RegularFile, "file")].into_iter().enumerate().skip(offset as usize)
        {
            if reply.add(INodeNo(ino), (i + 1) as u64, kind, name) {
                break;
            }
        }
        reply.ok()
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let threads = args.iter().position(|a| a == "--threads").map(|i| args[i + 1].parse().unwrap()).unwrap_or(8);
    let file = std::fs::File::open(&args[1]).expect("file");
    let size = file.metadata().unwrap().len();
    let mut config = Config::default();
    config.mount_options = vec![MountOption::RO, MountOption::FSName("minipass".into())];
    config.n_threads = Some(threads);
    config.clone_fd = true;
    let fs = Pass { file, size, direct_io: args.iter().any(|a| a == "--direct-io"), no_read: args.iter().any(|a| a == "--no-read") };
    fuser::mount(fs, &args[2], &config).expect("mount");
}
