//! One open source file: its path, a read-only descriptor, and the identity it had
//! when it was opened (device, inode, size, mtime, ctime). A remote object
//! ([`super::remote`]) is a source file too: its path is its URL, its identity the URL
//! and the version pinned at open, and its reads are conditional ranged GETs.
//!
//! Every byte xpackfs serves from a source goes through [`SourceFile::read_exact_at`],
//! which uses `pread` (never a mapping: a source truncated under a mapping would
//! raise SIGBUS in the daemon) and re-checks the identity after the read, so bytes
//! read from a file that changed underneath are never handed out (or through
//! [`SourceFile::read_exact_at_direct`], the same with `O_DIRECT`: `direct.rs`).
//!
//! Every file xpackfs reads from outside (sources, shards, split parts, importance
//! matrices, manifests, packs) is opened by [`open_regular`]: it must be a regular file
//! after resolving symlinks, checked before the open (so a FIFO never blocks `open()`)
//! and again on the descriptor (opened non-blocking, so a file swapped for a FIFO in
//! between cannot block either).

use std::fs::{File, Metadata};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use super::SourceError;
use crate::fsutil;

/// What identifies a file's content without reading it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FileIdentity {
    pub device: u64,
    pub inode: u64,
    pub size: u64,
    pub mtime_ns: i128,
    pub ctime_ns: i128,
}

/// The `device` of a remote object's identity (no local device has it).
pub const REMOTE_DEVICE: u64 = u64::MAX;

impl FileIdentity {
    /// A remote object's identity: its URL, size and pinned version hashed into the inode
    /// and ctime fields (128 bits), under [`REMOTE_DEVICE`].
    pub fn remote(object: &super::remote::RemoteObject) -> Self {
        let h = object.identity_hash();
        FileIdentity { device: REMOTE_DEVICE, inode: h as u64, size: object.size(), mtime_ns: 0, ctime_ns: (h >> 64) as u64 as i128 }
    }

    pub fn of(meta: &std::fs::Metadata) -> Self {
        FileIdentity {
            device: meta.dev(),
            inode: meta.ino(),
            size: meta.size(),
            mtime_ns: meta.mtime() as i128 * 1_000_000_000 + meta.mtime_nsec() as i128,
            ctime_ns: meta.ctime() as i128 * 1_000_000_000 + meta.ctime_nsec() as i128,
        }
    }
}

#[derive(Debug)]
pub struct SourceFile {
    path: PathBuf,
    inner: Inner,
    identity: FileIdentity,
    /// When the path was last checked to still name this file (ms since the epoch).
    path_checked_ms: AtomicU64,
    /// The `O_DIRECT` descriptor, opened on first direct read (see `direct.rs`).
    pub(super) direct: super::direct::DirectFd,
}

#[derive(Debug)]
enum Inner {
    Local(File),
    Remote(super::remote::RemoteObject),
}

/// How often reads re-check that the path still names the open file (replaced, deleted).
const PATH_CHECK_MS: u64 = 1000;

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// Check that `path` names a file that can be a source file: a regular file (after
/// resolving symlinks), or a remote object.
pub fn check_file(path: &Path) -> Result<(), SourceError> {
    if super::remote::is_remote(path) {
        return match super::remote::stat(path)? {
            Some(super::remote::Kind::File(_)) => Ok(()),
            Some(super::remote::Kind::Dir) => Err(SourceError::NotRegular { path: super::remote::display(path), kind: "a directory (a prefix)" }),
            None => Err(SourceError::Io { path: super::remote::display(path), source: std::io::Error::from(std::io::ErrorKind::NotFound) }),
        };
    }
    check_regular(path).map(drop)
}

/// The whole content of a small file (local, regular, or a remote object), refused over
/// `max` bytes.
pub fn read_small(path: &Path, max: u64) -> Result<Vec<u8>, SourceError> {
    if super::remote::is_remote(path) {
        return Ok(super::remote::read_capped(path, max)?);
    }
    fsutil::read_limited(path, max).map_err(|source| SourceError::Io { path: path.to_path_buf(), source })
}

/// Is there a directory at `path` (local or remote)? Errors count as no.
pub fn is_dir(path: &Path) -> bool {
    if super::remote::is_remote(path) {
        return matches!(super::remote::stat(path), Ok(Some(super::remote::Kind::Dir)));
    }
    path.is_dir()
}

/// Is anything at `path` (a dangling symlink counts: it is refused by name when read)?
pub fn present(path: &Path) -> bool {
    if super::remote::is_remote(path) {
        return matches!(super::remote::stat(path), Ok(Some(_)));
    }
    std::fs::symlink_metadata(path).is_ok()
}

/// What is at a path, a final symlink not followed (object stores have no symlinks).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    Dir,
    File {
        size: u64,
    },
    Symlink,
    /// A FIFO, socket or device.
    Other,
}

impl EntryKind {
    fn of(t: std::fs::FileType, size: u64) -> EntryKind {
        if t.is_symlink() {
            EntryKind::Symlink
        } else if t.is_dir() {
            EntryKind::Dir
        } else if t.is_file() {
            EntryKind::File { size }
        } else {
            EntryKind::Other
        }
    }

    fn of_remote(k: &super::remote::Kind) -> EntryKind {
        match k {
            super::remote::Kind::Dir => EntryKind::Dir,
            super::remote::Kind::File(m) => EntryKind::File { size: m.size },
        }
    }
}

/// What is at `path` (local or remote), or `None` (nothing, or it cannot be looked at).
pub fn entry_kind(path: &Path) -> Option<EntryKind> {
    if super::remote::is_remote(path) {
        return super::remote::stat(path).ok().flatten().as_ref().map(EntryKind::of_remote);
    }
    std::fs::symlink_metadata(path).ok().map(|m| EntryKind::of(m.file_type(), m.size()))
}

/// The entries of directory `dir` (local or remote): names and what each is, sorted by name.
/// An entry that vanishes while it is looked at is left out.
pub fn list_entries(dir: &Path) -> Result<Vec<(String, EntryKind)>, SourceError> {
    if super::remote::is_remote(dir) {
        return Ok(super::remote::list_dir(dir)?.iter().map(|(n, k)| (n.clone(), EntryKind::of_remote(k))).collect());
    }
    let io = |source| SourceError::Io { path: dir.to_path_buf(), source };
    let mut v = Vec::new();
    for e in std::fs::read_dir(dir).map_err(io)? {
        let e = e.map_err(io)?;
        if let Ok(m) = std::fs::symlink_metadata(e.path()) {
            v.push((e.file_name().to_string_lossy().into_owned(), EntryKind::of(m.file_type(), m.size())));
        }
    }
    v.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(v)
}

/// Check that `path` is a regular file after resolving symlinks, without opening it.
pub fn check_regular(path: &Path) -> Result<Metadata, SourceError> {
    fsutil::check_regular(path).map_err(|e| regular_err(path, e))
}

/// Open a file that must be regular (after resolving symlinks) for reading
/// ([`fsutil::open_regular`]: refused before the open, opened non-blocking, checked again).
pub fn open_regular(path: &Path) -> Result<(File, Metadata), SourceError> {
    fsutil::open_regular(path).map_err(|e| regular_err(path, e))
}

/// A [`fsutil::RegularError`] for `path` as a source error.
pub(super) fn regular_err(path: &Path, e: fsutil::RegularError) -> SourceError {
    match e {
        fsutil::RegularError::Io(source) => SourceError::Io { path: path.to_path_buf(), source },
        fsutil::RegularError::NotRegular(kind) => SourceError::NotRegular { path: path.to_path_buf(), kind },
    }
}

impl SourceFile {
    /// Open a source file: it must be a regular file (after resolving symlinks); anything
    /// else is refused before it is opened for reading.
    pub fn open(path: &Path) -> Result<Self, SourceError> {
        if super::remote::is_remote(path) {
            let object = super::remote::open(path)?;
            return Ok(SourceFile {
                path: PathBuf::from(object.url()),
                identity: FileIdentity::remote(&object),
                inner: Inner::Remote(object),
                path_checked_ms: AtomicU64::new(now_ms()),
                direct: Default::default(),
            });
        }
        let (file, meta) = open_regular(path)?;
        Ok(SourceFile {
            path: path.to_path_buf(),
            inner: Inner::Local(file),
            identity: FileIdentity::of(&meta),
            path_checked_ms: AtomicU64::new(now_ms()),
            direct: Default::default(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn identity(&self) -> FileIdentity {
        self.identity
    }

    pub fn size(&self) -> u64 {
        self.identity.size
    }

    /// Check that the path still names the open file (not replaced by a rename, not
    /// deleted). Rate-limited to once per second per file: a stat by path per read would
    /// cost more than the read itself.
    pub(super) fn check_path(&self) -> Result<(), SourceError> {
        if self.is_remote() {
            return Ok(());
        }
        let now = now_ms();
        let last = self.path_checked_ms.load(Ordering::Relaxed);
        if now.saturating_sub(last) < PATH_CHECK_MS {
            return Ok(());
        }
        self.path_checked_ms.store(now, Ordering::Relaxed);
        match std::fs::metadata(&self.path) {
            Ok(m) if m.dev() == self.identity.device && m.ino() == self.identity.inode => Ok(()),
            Ok(_) => Err(SourceError::Changed { path: self.path.clone(), what: "replaced by another file".into() }),
            Err(e) => Err(SourceError::Changed { path: self.path.clone(), what: format!("no longer there ({e})") }),
        }
    }

    /// Check now (not rate-limited) that the file is unchanged and its path still names it.
    pub fn check_now(&self) -> Result<(), SourceError> {
        self.check_unchanged()?;
        self.path_checked_ms.store(0, Ordering::Relaxed);
        self.check_path()
    }

    /// The open file (the inode checked at open), e.g. to hand to the kernel as a FUSE
    /// passthrough backing file; `None` for a remote object.
    pub fn file(&self) -> Option<&File> {
        match &self.inner {
            Inner::Local(f) => Some(f),
            Inner::Remote(_) => None,
        }
    }

    /// The content's sha256 where the store states it (the Hub's LFS oid, pinned at open;
    /// S3's full-object checksum, asked for on first use); `None` for local files and objects
    /// whose store states none.
    pub fn stated_sha256(&self) -> Option<&str> {
        match &self.inner {
            Inner::Remote(o) => o.stated_sha256(),
            Inner::Local(_) => None,
        }
    }

    /// Is this a remote object (read over the network)?
    pub fn is_remote(&self) -> bool {
        matches!(self.inner, Inner::Remote(_))
    }

    /// Check that the open file still has the identity it had when opened. (A remote
    /// object's every read is conditional on its pinned version: nothing to check here.)
    pub fn check_unchanged(&self) -> Result<(), SourceError> {
        let file = match &self.inner {
            Inner::Local(f) => f,
            Inner::Remote(_) => return Ok(()),
        };
        let meta = file.metadata().map_err(|e| SourceError::Io { path: self.path.clone(), source: e })?;
        let now = FileIdentity::of(&meta);
        if now != self.identity {
            let what = if now.size != self.identity.size {
                format!("size changed from {} to {}", self.identity.size, now.size)
            } else {
                "modified in place (mtime/ctime changed)".to_string()
            };
            return Err(SourceError::Changed { path: self.path.clone(), what });
        }
        Ok(())
    }

    /// `len` bytes from `offset` as the remote tier holds them (one fetched part and where
    /// they start in it), without a copy; `None` for a local file and for a read across
    /// parts ([`SourceFile::read_exact_at`] serves those).
    pub fn read_held(&self, offset: u64, len: usize) -> Result<Option<crate::source::remote::parts::HeldPart>, SourceError> {
        match &self.inner {
            Inner::Local(_) => Ok(None),
            Inner::Remote(o) => o.read_held(offset, len).map_err(SourceError::Remote),
        }
    }

    /// How far ahead of `offset`, where a read just ended, its reader should have the
    /// file's bytes fetched: the remote tier's window for that reader; 0 for a local file.
    pub fn ahead_bytes(&self, offset: u64) -> u64 {
        match &self.inner {
            Inner::Local(_) => 0,
            Inner::Remote(o) => o.ahead_bytes(offset),
        }
    }

    /// Whether `[offset, offset + len)` is read without waiting for the network: always for a
    /// local file; for a remote one, when the parts holding it are in memory.
    pub fn resident(&self, offset: u64, len: u64) -> bool {
        match &self.inner {
            Inner::Local(_) => true,
            Inner::Remote(o) => o.resident(offset, len),
        }
    }

    /// Whether `[offset, offset + len)` reads without the network: always for a local file;
    /// for a remote one, when every part holding it is in memory or in the disk cache.
    pub fn kept(&self, offset: u64, len: u64) -> bool {
        match &self.inner {
            Inner::Local(_) => true,
            Inner::Remote(o) => o.kept(offset, len),
        }
    }

    /// Whether this is a remote object with a pinned version (see
    /// [`super::remote::RemoteObject::pinned`]).
    pub fn is_pinned_remote(&self) -> bool {
        matches!(&self.inner, Inner::Remote(o) if o.pinned())
    }

    /// [`SourceFile::read_exact_at`] for work no client waits for: a remote file's bytes come
    /// only from what was already fetched (memory or the disk cache), never the network,
    /// and its parts tier is left as it was (no stream, no read-ahead): an error otherwise.
    pub fn read_exact_at_kept(&self, buf: &mut [u8], offset: u64) -> Result<(), SourceError> {
        match &self.inner {
            Inner::Local(_) => self.read_exact_at(buf, offset),
            Inner::Remote(o) => Ok(o.read_kept(buf, offset)?),
        }
    }

    /// Have `[offset, offset + len)` of a remote file fetched ahead of its reader (nothing
    /// for a local file); `false` when no more read-ahead can be queued now.
    pub fn prefetch(&self, offset: u64, len: u64) -> bool {
        match &self.inner {
            Inner::Local(_) => true,
            Inner::Remote(o) => o.prefetch(offset, len),
        }
    }

    /// Fill `buf` from `offset`, failing on a short read or a changed file.
    pub fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> Result<(), SourceError> {
        let end = offset.checked_add(buf.len() as u64);
        if end.is_none_or(|end| end > self.identity.size) {
            return Err(SourceError::format(
                &self.path,
                format!("read of {} bytes at {offset} is beyond the end of the file ({})", buf.len(), self.identity.size),
            ));
        }
        let file = match &self.inner {
            Inner::Local(f) => f,
            Inner::Remote(o) => return o.read_exact_at(buf, offset).map_err(SourceError::Remote),
        };
        file.read_exact_at(buf, offset).map_err(|e| {
            if e.kind() == std::io::ErrorKind::UnexpectedEof {
                SourceError::Changed { path: self.path.clone(), what: format!("short read at offset {offset}: file shrank") }
            } else {
                SourceError::Io { path: self.path.clone(), source: e }
            }
        })?;
        self.check_unchanged()?;
        self.check_path()
    }
}
