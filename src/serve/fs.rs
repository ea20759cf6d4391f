//! The filesystem logic, free of FUSE: attributes, lookup, directory listing and reads
//! over a view [`Tree`]. Plain methods returning `Result`, tested without a mount; the
//! fuser adapter in `fuse.rs` only translates.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::SystemTime;

use crate::view::{Ino, NodeKind, Tree, ViewError};

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
}

impl FsError {
    /// The one place errors become errno values.
    pub fn errno(&self) -> i32 {
        match self {
            FsError::NoInode(_) | FsError::NotFound { .. } => libc::ENOENT,
            FsError::NotDir(_) => libc::ENOTDIR,
            FsError::IsDir(_) => libc::EISDIR,
            FsError::ReadOnly => libc::EROFS,
            FsError::Read { .. } => libc::EIO,
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

#[derive(Debug, Default)]
pub struct Stats {
    pub reads: AtomicU64,
    pub bytes_served: AtomicU64,
    pub read_errors: AtomicU64,
}

#[derive(Debug)]
pub struct Fs {
    tree: Arc<Tree>,
    owner: Ownership,
    pub stats: Stats,
}

impl Fs {
    pub fn new(tree: Tree, owner: Ownership) -> Self {
        Fs { tree: Arc::new(tree), owner, stats: Stats::default() }
    }

    pub fn tree(&self) -> &Tree {
        &self.tree
    }

    pub fn attr(&self, ino: Ino) -> Result<Attr, FsError> {
        let node = self.tree.get(ino).ok_or(FsError::NoInode(ino))?;
        let (kind, size, perm, nlink) = match &node.kind {
            NodeKind::Dir { children } => {
                let subdirs = children
                    .values()
                    .filter(|&&c| matches!(self.tree.get(c).map(|n| &n.kind), Some(NodeKind::Dir { .. })))
                    .count() as u32;
                let r = self.owner.read_bits;
                (Kind::Dir, 0, r | (r >> 2 & 0o111), 2 + subdirs)
            }
            NodeKind::File(f) => (Kind::File, f.size(), self.owner.read_bits, 1),
        };
        Ok(Attr { ino, kind, size, perm, nlink, uid: self.owner.uid, gid: self.owner.gid, mtime: self.owner.mtime })
    }

    pub fn lookup(&self, parent: Ino, name: &str) -> Result<Attr, FsError> {
        match &self.tree.get(parent).ok_or(FsError::NoInode(parent))?.kind {
            NodeKind::Dir { children } => {
                let ino = children.get(name).ok_or_else(|| FsError::NotFound { parent, name: name.to_string() })?;
                self.attr(*ino)
            }
            NodeKind::File(_) => Err(FsError::NotDir(parent)),
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

    /// Check that an open is read-only and of a file.
    pub fn open(&self, ino: Ino, flags: i32) -> Result<(), FsError> {
        if flags & libc::O_ACCMODE != libc::O_RDONLY || flags & libc::O_TRUNC != 0 {
            return Err(FsError::ReadOnly);
        }
        match self.tree.get(ino).ok_or(FsError::NoInode(ino))?.kind {
            NodeKind::File(_) => Ok(()),
            NodeKind::Dir { .. } => Err(FsError::IsDir(ino)),
        }
    }

    /// Read into `buf`; returns the byte count (short only at end of file).
    pub fn read(&self, ino: Ino, offset: u64, buf: &mut [u8]) -> Result<usize, FsError> {
        let node = self.tree.get(ino).ok_or(FsError::NoInode(ino))?;
        let NodeKind::File(f) = &node.kind else { return Err(FsError::IsDir(ino)) };
        self.stats.reads.fetch_add(1, Ordering::Relaxed);
        match f.read_at(offset, buf) {
            Ok(n) => {
                self.stats.bytes_served.fetch_add(n as u64, Ordering::Relaxed);
                Ok(n)
            }
            Err(source) => {
                self.stats.read_errors.fetch_add(1, Ordering::Relaxed);
                Err(FsError::Read { path: node.name.clone(), source })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::view::{VirtualFile, ROOT_INO};

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
        assert_eq!(fs.read(a.ino, 1, &mut buf).unwrap(), 4);
        assert_eq!(&buf[..4], b"ello");
        assert_eq!(fs.lookup(ROOT_INO, "zz").unwrap_err().errno(), libc::ENOENT);
        assert_eq!(fs.lookup(a.ino, "x").unwrap_err().errno(), libc::ENOTDIR);
        assert_eq!(fs.open(a.ino, libc::O_RDWR).unwrap_err().errno(), libc::EROFS);
        assert_eq!(fs.open(sub.ino, libc::O_RDONLY).unwrap_err().errno(), libc::EISDIR);
        assert!(fs.open(a.ino, libc::O_RDONLY | libc::O_DIRECT).is_ok());
    }
}
