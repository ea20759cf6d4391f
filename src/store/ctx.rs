//! Who is reading, and what the read may do: the one context passed down the read path,
//! from a virtual file's `read_at` through the views' chunk producers to [`super::Tiers::get`].
//!
//! A client's read (a FUSE request, `materialize`) and a background read (a file entry
//! written behind, the file entries a warm-up or a prewarm writes) go through the same
//! functions; the context is what tells them apart, so no layer has a second copy of its
//! read function for one case and no producer hard-codes a priority. A background read does
//! not enter the memory tier, does not move chunks in its LRU order and starts no
//! read-ahead (it would push out what clients read), and runs its computations at the
//! priority it says.

use super::compute::Priority;

/// Who asks for the bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reader {
    /// A client of the mount, or `materialize`: someone waits for these bytes now.
    Client,
    /// Work no client waits for (file entries written behind, warm-ups, prewarm).
    Background,
}

/// The context of one read (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadCtx {
    pub reader: Reader,
    /// The priority a chunk computed for this read runs at on the compute pool.
    pub priority: Priority,
    /// Source bytes are read with `O_DIRECT` (a client that reads with `O_DIRECT`, or a file
    /// the mount's page cache holds).
    pub direct: bool,
    /// Chunks read may enter the memory tier (and a hit refreshes its place in the LRU).
    pub memory: bool,
    /// A chunk of the disk tier's in no cache may be computed, and a remote source's bytes
    /// not fetched yet may be fetched; if not, the read fails instead (chunks kept in memory
    /// only, and local source bytes, are always read; remote bytes already fetched are read
    /// from memory or the disk cache without touching the parts tier's streams or memory).
    pub compute: bool,
}

impl ReadCtx {
    /// A client's read: read priority, into memory, with read-ahead.
    pub const CLIENT: ReadCtx = ReadCtx { reader: Reader::Client, priority: Priority::Read, direct: false, memory: true, compute: true };
    /// Background work: niced computations, the memory tier left as clients left it.
    pub const BACKGROUND: ReadCtx = ReadCtx { reader: Reader::Background, priority: Priority::Background, direct: false, memory: false, compute: true };

    /// This context with source bytes read with `O_DIRECT` or not.
    pub const fn direct(self, direct: bool) -> ReadCtx {
        ReadCtx { direct, ..self }
    }

    /// This context with its computations run at `priority` (`xpackfs warm` without
    /// `--nice` is background work at read priority).
    pub const fn at(self, priority: Priority) -> ReadCtx {
        ReadCtx { priority, ..self }
    }

    /// This context, computing nothing: chunks of the disk tier's not in a cache fail the
    /// read.
    pub const fn cached_only(self) -> ReadCtx {
        ReadCtx { compute: false, ..self }
    }

    /// Whether reads in this context look ahead (only a client's: what it reads next is
    /// brought into memory).
    pub fn reads_ahead(&self) -> bool {
        self.reader == Reader::Client && self.memory
    }
}
