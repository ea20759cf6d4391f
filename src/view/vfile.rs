//! A virtual file: a size known up front and a sequence of extents that tile it.
//!
//! [`VirtualFile::read_at`] is the one path by which bytes leave a view: the FUSE adapter,
//! `materialize` and the file entries written in the background all call it, so a mount and
//! a materialized copy cannot disagree. Each read carries a [`ReadCtx`] (who reads, at what
//! priority, with direct I/O or not), which it hands down to the chunk producers.
//! [`VirtualFile::read_held`] is the same read without the copy, for the FUSE adapter: a
//! request that lies in one literal or computed extent, or in one fetched part of a remote
//! source, is answered from the bytes held in memory (the chunk as its producer returned
//! it, the part as it was fetched).

use std::sync::{Arc, OnceLock};

use sha2::{Digest, Sha256};

use super::ViewError;
use crate::source::SourceFile;
use crate::store::file_entries::{Chunks, FillError, Part, StoredFile};
use crate::store::{DiskKey, Priority, ReadCtx, Tier, Warmed};

/// Produces the bytes of computed chunks (decoded / requantised blocks, ...). A chunk is
/// produced whole; the computed views produce theirs through [`super::Tiers`]
/// (memory, disk cache, compute pool), read as the caller's [`ReadCtx`] says.
pub trait ChunkProducer: Send + Sync + std::fmt::Debug {
    /// The whole chunk `id`, read as `ctx` says, and the tier it was found in; its length
    /// must equal the extent's length.
    fn chunk(&self, id: u64, ctx: ReadCtx) -> Result<Chunk, ViewError>;
    /// Whether chunk `id` is served now without waiting for a load or a computation (it is
    /// in memory). The FUSE adapter takes reads that would wait off its workers.
    fn ready(&self, _id: u64) -> bool {
        false
    }
    /// Whether the chunks are kept in the disk cache (what `warm` and `prewarm` compute).
    fn persistent(&self) -> bool {
        false
    }
    /// Chunks of one warm group are computed by one job (siblings): warming any one of them
    /// warms them all, so a warm-up asks for each group once.
    fn warm_group(&self, id: u64) -> u64 {
        id
    }
    /// Make sure chunk `id` (and its warm group) is in the disk cache, computing it at
    /// `prio` if it is not.
    fn warm(&self, _id: u64, _prio: Priority) -> Result<Warmed, ViewError> {
        Ok(Warmed::Present)
    }
    /// A hint that chunk `id` will be read soon by a reader with context `ctx`: start
    /// loading or computing it without waiting for it, unless it is in memory or on its way
    /// (read-ahead, at `ctx`'s priority; see `Tiers::prefetch`).
    fn prefetch(&self, _id: u64, _ctx: ReadCtx) {}
    /// The disk-cache key of chunk `id` (a digest of everything its bytes depend on), for
    /// the key of a whole-file entry ([`crate::store::file_entries`]); `None`: not keyed
    /// (such a file gets no file entry).
    fn disk_key(&self, _id: u64) -> Option<DiskKey> {
        None
    }
}

/// How far a read looks ahead of itself in its file: the computed chunks that start within
/// this many bytes of the first extent after the read are prefetched (those not in memory),
/// so a sequential reader finds the next chunks computed (or loaded from the disk cache)
/// while it consumes this one.
pub const READ_AHEAD_BYTES: u64 = 4 << 20;

/// A computed chunk as its producer returns it.
#[derive(Debug, Clone)]
pub struct Chunk {
    pub bytes: Arc<[u8]>,
    /// Where it was found (memory, disk cache, computed), for the served-bytes metric.
    pub tier: Tier,
}

impl Chunk {
    /// Bytes computed for this read.
    pub fn computed(bytes: impl Into<Arc<[u8]>>) -> Chunk {
        Chunk { bytes: bytes.into(), tier: Tier::Computed }
    }
}

/// The bytes of reads by where they came from: `as_is` (literals, zeros and source bytes),
/// and the chunks' by tier.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Tally {
    pub as_is: u64,
    pub memory: u64,
    pub disk: u64,
    pub computed: u64,
}

impl Tally {
    /// Count `n` bytes of a chunk found in `tier`, or not of a chunk (`None`).
    pub fn add(&mut self, tier: Option<Tier>, n: u64) {
        *match tier {
            None => &mut self.as_is,
            Some(Tier::Memory) => &mut self.memory,
            Some(Tier::Disk) => &mut self.disk,
            Some(Tier::Computed) => &mut self.computed,
        } += n;
    }

    pub fn total(&self) -> u64 {
        self.as_is + self.memory + self.disk + self.computed
    }

    /// Both tallies summed.
    pub fn plus(self, o: Tally) -> Tally {
        Tally { as_is: self.as_is + o.as_is, memory: self.memory + o.memory, disk: self.disk + o.disk, computed: self.computed + o.computed }
    }
}

#[derive(Debug, Clone)]
pub enum Extent {
    /// Literal bytes held in memory.
    Bytes(Arc<[u8]>),
    /// A range of a source file, served as is.
    Source { file: Arc<SourceFile>, offset: u64, len: u64 },
    /// Zero bytes.
    Zeros(u64),
    /// A computed chunk.
    Computed { producer: Arc<dyn ChunkProducer>, id: u64, len: u64 },
}

impl Extent {
    pub fn len(&self) -> u64 {
        match self {
            Extent::Bytes(b) => b.len() as u64,
            Extent::Source { len, .. } | Extent::Zeros(len) | Extent::Computed { len, .. } => *len,
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[derive(Debug, Default)]
pub struct VirtualFile {
    /// (start offset, extent), sorted, contiguous, no empty extents.
    extents: Vec<(u64, Extent)>,
    size: u64,
    /// Whether any extent is computed (kept as extents are pushed: every read asks, and a
    /// Kimi pack has 247,296 extents).
    computed: bool,
    /// Whether any extent is source bytes (kept likewise).
    source: bool,
    /// Whether any extent is bytes of a remote source (kept likewise).
    remote: bool,
    /// Built from digests of other files (manifests, [`super::derived`]): materialize writes
    /// it after them.
    derived: bool,
    /// The key of its whole-file disk-cache entry, found once
    /// ([`crate::store::file_entries`]).
    file_key: OnceLock<Option<DiskKey>>,
    /// Ranges whose sha256 a derived file needs (besides the whole file).
    digest_ranges: parking_lot::Mutex<Vec<(u64, u64)>>,
    /// Digests already known for (offset, len), recorded by whoever streamed those bytes.
    known: parking_lot::Mutex<Vec<(u64, u64, String)>>,
}

impl VirtualFile {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn from_bytes(bytes: impl Into<Arc<[u8]>>) -> Self {
        let mut f = Self::new();
        f.push(Extent::Bytes(bytes.into()));
        f
    }

    /// Append an extent; adjacent zero runs are merged, empty extents dropped.
    pub fn push(&mut self, extent: Extent) {
        let len = extent.len();
        if len == 0 {
            return;
        }
        self.computed |= matches!(extent, Extent::Computed { .. });
        self.source |= matches!(extent, Extent::Source { .. });
        self.remote |= matches!(&extent, Extent::Source { file, .. } if file.is_remote());
        if let (Extent::Zeros(more), Some((_, Extent::Zeros(run)))) = (&extent, self.extents.last_mut()) {
            *run += more;
        } else {
            self.extents.push((self.size, extent));
        }
        self.size += len;
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    pub fn extents(&self) -> impl Iterator<Item = (u64, &Extent)> {
        self.extents.iter().map(|(o, e)| (*o, e))
    }

    /// Read up to `buf.len()` bytes at `offset` as `ctx` says; returns the count (short only
    /// at EOF). Source extents are read with direct I/O if `ctx.direct` (a client that reads
    /// with `O_DIRECT`, or a copy the mount's page cache holds; computed chunks read their
    /// inputs as they do); computed chunks come
    /// from their producers in `ctx`, and a client's read looks ahead of itself.
    pub fn read_at(&self, offset: u64, buf: &mut [u8], ctx: ReadCtx) -> Result<usize, ViewError> {
        self.read_tallied(offset, buf, ctx).map(|t| t.total() as usize)
    }

    /// [`VirtualFile::read_at`], its bytes counted by where they came from (the count is
    /// the tally's total).
    pub fn read_tallied(&self, offset: u64, buf: &mut [u8], ctx: ReadCtx) -> Result<Tally, ViewError> {
        let mut tally = Tally::default();
        if offset >= self.size || buf.is_empty() {
            return Ok(tally);
        }
        let want = (buf.len() as u64).min(self.size - offset) as usize;
        let mut idx = self.extent_at(offset);
        let mut done = 0usize;
        // A read that waits for remote bytes has what follows fetched first, as far as the
        // reader's window already reaches: the reads the kernel sends side by side each
        // wait for their own bytes, not for each other's read-ahead.
        if ctx.reads_ahead()
            && let (start, Extent::Source { file, offset: src, .. }) = &self.extents[idx]
            && file.is_remote()
        {
            self.remote_ahead(idx + 1, (file, src + (offset - start)));
        }
        // The last source extent read, and where in its file the read ended.
        let mut source_end = None;
        while done < want {
            let (start, extent) = &self.extents[idx];
            let pos = offset + done as u64;
            let within = pos - start;
            let n = ((extent.len() - within) as usize).min(want - done);
            let out = &mut buf[done..done + n];
            let mut tier = None;
            match extent {
                Extent::Bytes(b) => out.copy_from_slice(&b[within as usize..within as usize + n]),
                Extent::Zeros(_) => out.fill(0),
                Extent::Source { file, offset: src, .. } => {
                    if !ctx.compute {
                        // A read that computes nothing fetches nothing either.
                        file.read_exact_at_kept(out, src + within)?;
                    } else if ctx.direct {
                        file.read_exact_at_direct(out, src + within)?;
                    } else {
                        file.read_exact_at(out, src + within)?;
                    }
                    source_end = Some((file, src + within + n as u64));
                }
                Extent::Computed { producer, id, len } => {
                    let chunk = computed(&**producer, *id, *len, ctx)?;
                    out.copy_from_slice(&chunk.bytes[within as usize..within as usize + n]);
                    tier = Some(chunk.tier);
                }
            }
            tally.add(tier, n as u64);
            done += n;
            idx += 1;
        }
        if ctx.reads_ahead() {
            self.read_ahead(idx, ctx, source_end);
        }
        Ok(tally)
    }

    /// [`VirtualFile::read_at`] of up to `len` bytes at `offset` without copying them, when
    /// the read (cut at the end of the file) lies in one literal or computed extent, or in
    /// one fetched part of a remote source's extent: its bytes as held in memory (the
    /// literal, the chunk as its producer returned it, the part; read ahead as `read_at`
    /// does). `None`, with nothing read, for every other read (empty, at or past the end,
    /// across extents or parts, of a local source's bytes or zeros): `read_at` serves those.
    pub fn read_held(&self, offset: u64, len: usize, ctx: ReadCtx) -> Result<Option<Held>, ViewError> {
        if offset >= self.size || len == 0 {
            return Ok(None);
        }
        let want = (len as u64).min(self.size - offset);
        let idx = self.extent_at(offset);
        let (start, extent) = &self.extents[idx];
        let within = offset - start;
        if within + want > extent.len() {
            return Ok(None);
        }
        let mut source_end = None;
        let (bytes, start, tier) = match extent {
            Extent::Bytes(b) => (HeldBytes::Chunk(b.clone()), within as usize, None),
            Extent::Computed { producer, id, len } => {
                let chunk = computed(&**producer, *id, *len, ctx)?;
                (HeldBytes::Chunk(chunk.bytes), within as usize, Some(chunk.tier))
            }
            Extent::Source { file, offset: src, .. } => {
                if ctx.reads_ahead() && file.is_remote() {
                    self.remote_ahead(idx + 1, (file, src + within));
                }
                match file.read_held(src + within, want as usize)? {
                    Some((part, from)) => {
                        source_end = Some((file, src + within + want));
                        (HeldBytes::Part(part), from, None)
                    }
                    None => return Ok(None),
                }
            }
            Extent::Zeros(_) => return Ok(None),
        };
        if ctx.reads_ahead() {
            self.read_ahead(idx + 1, ctx, source_end);
        }
        Ok(Some(Held { bytes, start, len: want as usize, tier }))
    }

    /// The index of the extent holding byte `offset` (< the size).
    fn extent_at(&self, offset: u64) -> usize {
        self.extents.partition_point(|(start, _)| *start <= offset) - 1
    }

    /// Prefetch the computed extents from `idx` on that start within [`READ_AHEAD_BYTES`] of
    /// extent `idx` and are not in memory, for a reader in `ctx`. After a read of a remote
    /// source (`source_end`: its file, and where in it the read ended), also have the remote
    /// source bytes of the extents ahead fetched, in the order this file needs them, as far
    /// ahead as the remote tier's window for that reader ([`SourceFile::ahead_bytes`]): a
    /// view's extents jump between runs of the object (the pack's gate, up and down
    /// slices), which the object's own sequential windows do not follow.
    fn read_ahead(&self, idx: usize, ctx: ReadCtx, source_end: Option<(&Arc<SourceFile>, u64)>) {
        let Some((first, _)) = self.extents.get(idx) else { return };
        for (start, extent) in &self.extents[idx..] {
            if start - first >= READ_AHEAD_BYTES {
                break;
            }
            if let Extent::Computed { producer, id, .. } = extent
                && !producer.ready(*id)
            {
                producer.prefetch(*id, ctx);
            }
        }
        if let Some(at) = source_end {
            self.remote_ahead(idx, at);
        }
    }

    /// Have the remote source bytes of the extents from `idx` on fetched ahead of a reader
    /// of remote file `at.0` that is at `at.1` in it, as far as the remote tier's window
    /// for that reader reaches ([`SourceFile::ahead_bytes`]), in the order this file needs
    /// them.
    fn remote_ahead(&self, idx: usize, (file, at): (&Arc<SourceFile>, u64)) {
        let Some((first, _)) = self.extents.get(idx) else { return };
        let ahead = file.ahead_bytes(at);
        for (start, extent) in &self.extents[idx..] {
            if start - first >= ahead {
                break;
            }
            if let Extent::Source { file, offset, len } = extent
                && file.is_remote()
                && !file.prefetch(*offset, *len)
            {
                break;
            }
        }
    }
}

/// Chunk `id` of `producer` for a reader in `ctx`, checked to be as long as its extent.
fn computed(producer: &dyn ChunkProducer, id: u64, len: u64, ctx: ReadCtx) -> Result<Chunk, ViewError> {
    let chunk = producer.chunk(id, ctx)?;
    if chunk.bytes.len() as u64 != len {
        return Err(ViewError::Internal(format!("computed chunk {id} has {} bytes, its extent {len}", chunk.bytes.len())));
    }
    Ok(chunk)
}

/// Bytes of a read as held in memory ([`VirtualFile::read_held`]): a range of a literal, of
/// a computed chunk or of a remote source's fetched part, kept alive by its reference count
/// while the reply is sent.
#[derive(Debug, Clone)]
pub struct Held {
    bytes: HeldBytes,
    start: usize,
    len: usize,
    /// The tier of the chunk; `None` for a literal and for source bytes.
    tier: Option<Tier>,
}

/// What a [`Held`] keeps alive.
#[derive(Debug, Clone)]
enum HeldBytes {
    /// A literal or a computed chunk.
    Chunk(Arc<[u8]>),
    /// A fetched part of a remote source.
    Part(Arc<Vec<u8>>),
}

impl Held {
    pub fn as_slice(&self) -> &[u8] {
        let all: &[u8] = match &self.bytes {
            HeldBytes::Chunk(b) => b,
            HeldBytes::Part(p) => p,
        };
        &all[self.start..self.start + self.len]
    }

    /// Its bytes, counted by where they came from.
    pub fn tally(&self) -> Tally {
        let mut t = Tally::default();
        t.add(self.tier, self.len as u64);
        t
    }

    /// Whether these are bytes of `chunk` itself (not a copy).
    pub fn is_in(&self, chunk: &Arc<[u8]>) -> bool {
        matches!(&self.bytes, HeldBytes::Chunk(b) if Arc::ptr_eq(b, chunk))
    }
}

/// A file whose size is known up front and whose bytes are computed once, on first read
/// (manifests that hold digests of other files: hex digests have a fixed length).
struct Lazy {
    len: u64,
    build: Box<dyn Fn() -> Result<Vec<u8>, ViewError> + Send + Sync>,
    done: OnceLock<Arc<[u8]>>,
}

impl std::fmt::Debug for Lazy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Lazy({} bytes)", self.len)
    }
}

impl ChunkProducer for Lazy {
    fn chunk(&self, _id: u64, _ctx: ReadCtx) -> Result<Chunk, ViewError> {
        if let Some(b) = self.done.get() {
            return Ok(Chunk { bytes: b.clone(), tier: Tier::Memory });
        }
        let bytes = (self.build)()?;
        if bytes.len() as u64 != self.len {
            return Err(ViewError::Internal(format!("computed {} bytes, announced {}", bytes.len(), self.len)));
        }
        Ok(Chunk::computed(self.done.get_or_init(|| bytes.into()).clone()))
    }

    fn ready(&self, _id: u64) -> bool {
        self.done.get().is_some()
    }
}

impl VirtualFile {
    /// A file of `len` bytes produced by `build` on first read (errors are not kept); views
    /// make them through [`super::derived::Derived`].
    pub(crate) fn lazy(len: u64, build: impl Fn() -> Result<Vec<u8>, ViewError> + Send + Sync + 'static) -> VirtualFile {
        let mut f = VirtualFile::new();
        f.push(Extent::Computed { producer: Arc::new(Lazy { len, build: Box::new(build), done: OnceLock::new() }), id: 0, len });
        f.derived = true;
        f
    }

    /// The source file this file is, whole and unchanged (one extent covering all of it).
    pub fn whole_source(&self) -> Option<&Arc<SourceFile>> {
        match self.extents.as_slice() {
            [(0, Extent::Source { file, offset: 0, len })] if *len == file.size() => Some(file),
            _ => None,
        }
    }

    /// Whether every byte is a source byte, literal or zero (nothing is computed).
    pub fn is_identity(&self) -> bool {
        !self.computed
    }

    /// Whether it is made of source bytes (literals and zeros besides, nothing computed):
    /// a copy of source pages, which a cache of the file would hold a second time.
    pub fn is_source_bytes(&self) -> bool {
        self.source && !self.computed
    }

    /// Whether `len` bytes at `offset` are served without waiting for a chunk to be loaded
    /// or computed, or (if `network`) for the network (literal and zero bytes, local source
    /// bytes, remote source bytes whose parts are in memory, chunks in memory).
    pub fn ready(&self, offset: u64, len: u64, network: bool) -> bool {
        if offset >= self.size || len == 0 || !(self.computed || (network && self.remote)) {
            return true;
        }
        let end = offset.saturating_add(len).min(self.size);
        let first = self.extents.partition_point(|(start, _)| *start <= offset) - 1;
        self.extents[first..].iter().take_while(|(start, _)| *start < end).all(|(start, e)| match e {
            Extent::Computed { producer, id, .. } => producer.ready(*id),
            Extent::Source { file, offset: src, len } if network => {
                let from = offset.max(*start) - start;
                file.resident(src + from, (end - start).min(*len) - from)
            }
            _ => true,
        })
    }

    /// Whether any extent is bytes of a remote source (reads may wait for the network).
    pub fn reads_remote(&self) -> bool {
        self.remote
    }

    /// Whether this file is built from digests of other files (see [`VirtualFile::lazy`]).
    pub fn is_derived(&self) -> bool {
        self.derived
    }

    /// Declare that a derived file needs the sha256 of `len` bytes at `offset`, so that a
    /// writer streaming this file can compute it on the way (see [`super::derived`]). The
    /// whole file's digest is always taken by whoever streams it and is not recorded here.
    pub fn want_digest(&self, offset: u64, len: u64) {
        let mut r = self.digest_ranges.lock();
        if (offset, len) != (0, self.size) && !r.contains(&(offset, len)) {
            r.push((offset, len));
        }
    }

    /// The ranges declared with [`VirtualFile::want_digest`].
    pub fn digest_ranges(&self) -> Vec<(u64, u64)> {
        self.digest_ranges.lock().clone()
    }

    /// Remember the sha256 of `len` bytes at `offset`, computed from bytes read through
    /// this file (materialize does this while writing), so no second pass is needed.
    pub fn record_digest(&self, offset: u64, len: u64, hex: String) {
        let mut k = self.known.lock();
        if !k.iter().any(|(o, l, _)| (*o, *l) == (offset, len)) {
            k.push((offset, len, hex));
        }
    }

    pub fn known_digest(&self, offset: u64, len: u64) -> Option<String> {
        self.known.lock().iter().find(|(o, l, _)| (*o, *l) == (offset, len)).map(|(_, _, h)| h.clone())
    }

    /// sha256 of `len` bytes at `offset`: a recorded digest, else read through `read_at`
    /// in large chunks.
    pub fn sha256_range(&self, offset: u64, len: u64) -> Result<String, ViewError> {
        if let Some(h) = self.known_digest(offset, len) {
            return Ok(h);
        }
        let mut h = Sha256::new();
        let mut buf = vec![0u8; 8 << 20];
        let mut done = 0u64;
        while done < len {
            let n = (len - done).min(buf.len() as u64) as usize;
            let got = self.read_at(offset + done, &mut buf[..n], ReadCtx::CLIENT)?;
            if got == 0 {
                return Err(ViewError::Internal(format!("file ended at {} of {}", offset + done, offset + len)));
            }
            h.update(&buf[..got]);
            done += got as u64;
        }
        Ok(crate::digest::hex(&h.finalize()))
    }

    /// sha256 of the whole file.
    pub fn sha256(&self) -> Result<String, ViewError> {
        self.sha256_range(0, self.size)
    }
}

/// A chunk producer as the storage layer's file entries see it.
struct ChunksOf<'a>(&'a dyn ChunkProducer);

impl Chunks for ChunksOf<'_> {
    fn persistent(&self) -> bool {
        self.0.persistent()
    }
    fn ready(&self, id: u64) -> bool {
        self.0.ready(id)
    }
    fn disk_key(&self, id: u64) -> Option<DiskKey> {
        self.0.disk_key(id)
    }
}

/// A view file kept whole in the disk cache ([`crate::store::file_entries`]): its extents
/// are the parts its key is made of, and its bytes are read through [`VirtualFile::read_at`].
impl StoredFile for VirtualFile {
    fn size(&self) -> u64 {
        self.size
    }

    fn is_derived(&self) -> bool {
        self.derived
    }

    fn file_key_cell(&self) -> &OnceLock<Option<DiskKey>> {
        &self.file_key
    }

    fn visit_parts(&self, visit: &mut dyn FnMut(u64, Part<'_>) -> std::ops::ControlFlow<()>) -> std::ops::ControlFlow<()> {
        for (start, e) in &self.extents {
            let part = match e {
                Extent::Bytes(b) => Part::Bytes(b),
                Extent::Zeros(n) => Part::Zeros(*n),
                Extent::Source { file, offset, len } => Part::Source { file, offset: *offset, len: *len },
                Extent::Computed { producer, id, len } => {
                    visit(*start, Part::Chunk { chunks: &ChunksOf(&**producer), id: *id, len: *len })?;
                    continue;
                }
            };
            visit(*start, part)?;
        }
        std::ops::ControlFlow::Continue(())
    }

    fn fill(&self, offset: u64, buf: &mut [u8], ctx: ReadCtx) -> Result<(), FillError> {
        match self.read_at(offset, buf, ctx) {
            Ok(n) if n == buf.len() => Ok(()),
            Ok(n) => Err(FillError::Short { at: offset + n as u64, size: self.size }),
            Err(e) => Err(FillError::Read(Box::new(e))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Counting;
    impl ChunkProducer for Counting {
        fn chunk(&self, id: u64, _ctx: ReadCtx) -> Result<Chunk, ViewError> {
            Ok(Chunk::computed((0..5u8).map(|i| i + 10 * id as u8).collect::<Vec<_>>()))
        }
    }

    /// Chunks of 1 MiB; records the prefetches asked for; chunk 7 is "in memory".
    #[derive(Debug, Default)]
    struct Prefetched(parking_lot::Mutex<Vec<u64>>);
    impl ChunkProducer for Prefetched {
        fn chunk(&self, _id: u64, _ctx: ReadCtx) -> Result<Chunk, ViewError> {
            Ok(Chunk::computed(vec![0u8; 1 << 20]))
        }
        fn ready(&self, id: u64) -> bool {
            id == 7
        }
        fn prefetch(&self, id: u64, _ctx: ReadCtx) {
            self.0.lock().push(id);
        }
    }

    #[test]
    fn a_read_prefetches_the_computed_chunks_after_it() {
        let src = Arc::new(Prefetched::default());
        let mut f = VirtualFile::new();
        f.push(Extent::Bytes(Arc::from(&b"header"[..])));
        for id in 0..12 {
            f.push(Extent::Computed { producer: src.clone(), id, len: 1 << 20 });
            if id == 5 {
                f.push(Extent::Zeros(100));
            }
        }
        let mut buf = vec![0u8; 4096];
        f.read_at(0, &mut buf, ReadCtx::CLIENT).unwrap();
        // The read ends in chunk 0: chunks 1..=4 start within 4 MiB of chunk 1.
        assert_eq!(std::mem::take(&mut *src.0.lock()), [1, 2, 3, 4]);
        // Ending in chunk 5 (zeros, then chunks 6..): 7 is in memory and not asked for.
        f.read_at(6 + 5 * (1 << 20) + 10, &mut buf, ReadCtx::CLIENT).unwrap();
        assert_eq!(std::mem::take(&mut *src.0.lock()), [6, 8, 9]);
        // At the end of the file: nothing after it.
        f.read_at(f.size() - 10, &mut buf, ReadCtx::CLIENT).unwrap();
        assert!(src.0.lock().is_empty());
    }

    /// Defect of issue 23: a background read (a file entry written behind) started
    /// read-ahead into memory like a client's.
    #[test]
    fn a_background_read_does_not_read_ahead() {
        let src = Arc::new(Prefetched::default());
        let mut f = VirtualFile::new();
        for id in 0..4 {
            f.push(Extent::Computed { producer: src.clone(), id, len: 1 << 20 });
        }
        let mut buf = vec![0u8; 4096];
        f.read_at(0, &mut buf, ReadCtx::BACKGROUND).unwrap();
        assert!(src.0.lock().is_empty(), "prefetched {:?}", src.0.lock());
        f.read_at(0, &mut buf, ReadCtx::CLIENT).unwrap();
        assert_eq!(std::mem::take(&mut *src.0.lock()), [1, 2, 3]);
    }

    fn sample() -> VirtualFile {
        let mut f = VirtualFile::new();
        f.push(Extent::Bytes(Arc::from(&b"abc"[..])));
        f.push(Extent::Zeros(2));
        f.push(Extent::Zeros(1));
        f.push(Extent::Computed { producer: Arc::new(Counting), id: 1, len: 5 });
        f.push(Extent::Bytes(Arc::from(&b""[..])));
        f.push(Extent::Bytes(Arc::from(&b"z"[..])));
        f
    }

    #[test]
    fn lazy_files_are_built_once_and_checked() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let calls = Arc::new(AtomicUsize::new(0));
        let c = calls.clone();
        let f = VirtualFile::lazy(3, move || {
            c.fetch_add(1, Ordering::SeqCst);
            Ok(b"abc".to_vec())
        });
        let mut buf = [0u8; 3];
        f.read_at(0, &mut buf, ReadCtx::CLIENT).unwrap();
        f.read_at(1, &mut buf, ReadCtx::CLIENT).unwrap();
        assert_eq!((&buf[..2], calls.load(Ordering::SeqCst)), (&b"bc"[..], 1));
        let wrong = VirtualFile::lazy(5, || Ok(b"abc".to_vec()));
        assert!(wrong.read_at(0, &mut buf, ReadCtx::CLIENT).is_err());
        assert_eq!(f.sha256().unwrap(), crate::digest::sha256_hex(b"abc"));
    }

    #[test]
    fn identity_is_known_from_the_extents_pushed() {
        let mut f = VirtualFile::from_bytes(b"abc".to_vec());
        f.push(Extent::Zeros(3));
        assert!(f.is_identity());
        f.push(Extent::Computed { producer: Arc::new(Counting), id: 0, len: 0 });
        assert!(f.is_identity(), "an empty extent is dropped");
        f.push(Extent::Computed { producer: Arc::new(Counting), id: 0, len: 5 });
        f.push(Extent::Zeros(1));
        assert!(!f.is_identity());
        assert!(!sample().is_identity() && !VirtualFile::lazy(1, || Ok(vec![0])).is_identity());
    }

    /// Files of source bytes: some source bytes, nothing computed (the mount keeps those that
    /// are not whole source files, the packs, in its page cache: `Fs::is_source_copy`).
    #[test]
    fn source_bytes_are_known_from_the_extents_pushed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.bin");
        std::fs::write(&path, [7u8; 64]).unwrap();
        let file = Arc::new(crate::source::SourceFile::open(&path).unwrap());
        let mut f = VirtualFile::from_bytes(b"header".to_vec());
        f.push(Extent::Zeros(10));
        assert!(!f.is_source_bytes(), "literals and zeros only");
        f.push(Extent::Source { file: file.clone(), offset: 0, len: 0 });
        assert!(!f.is_source_bytes(), "an empty extent is dropped");
        f.push(Extent::Source { file: file.clone(), offset: 8, len: 16 });
        assert!(f.is_source_bytes());
        f.push(Extent::Computed { producer: Arc::new(Counting), id: 0, len: 5 });
        assert!(!f.is_source_bytes(), "a computed extent makes it a computed file");
        let mut whole = VirtualFile::new();
        whole.push(Extent::Source { file: file.clone(), offset: 0, len: 64 });
        assert!(whole.is_source_bytes() && whole.whole_source().is_some());
    }

    #[test]
    fn reads_every_range() {
        let f = sample();
        let whole: Vec<u8> = [&b"abc"[..], &[0, 0, 0], &[10, 11, 12, 13, 14], b"z"].concat();
        assert_eq!(f.size(), whole.len() as u64);
        assert_eq!(f.extents().count(), 4, "zeros merged, empty dropped");
        for start in 0..=whole.len() + 2 {
            for len in 0..=whole.len() + 2 {
                let mut buf = vec![0xAAu8; len];
                let n = f.read_at(start as u64, &mut buf, ReadCtx::CLIENT).unwrap();
                let expect = whole.get(start..(start + len).min(whole.len())).unwrap_or(&[]);
                assert_eq!(&buf[..n], expect, "start {start} len {len}");
            }
        }
    }

    /// A read held in one literal or computed extent is that extent's bytes, uncopied; every
    /// other read is left to `read_at` (and reads nothing). Held bytes equal `read_at`'s.
    #[test]
    fn held_reads_are_the_extents_own_bytes() {
        #[derive(Debug)]
        struct Kept(Arc<[u8]>);
        impl ChunkProducer for Kept {
            fn chunk(&self, _id: u64, _ctx: ReadCtx) -> Result<Chunk, ViewError> {
                Ok(Chunk { bytes: self.0.clone(), tier: Tier::Disk })
            }
        }
        let chunk: Arc<[u8]> = Arc::from(&[10u8, 11, 12, 13, 14][..]);
        let literal: Arc<[u8]> = Arc::from(&b"abc"[..]);
        let mut f = VirtualFile::new();
        f.push(Extent::Bytes(literal.clone()));
        f.push(Extent::Zeros(3));
        f.push(Extent::Computed { producer: Arc::new(Kept(chunk.clone())), id: 1, len: 5 });
        let whole: Vec<u8> = [&b"abc"[..], &[0, 0, 0], &[10, 11, 12, 13, 14]].concat();
        for start in 0..=whole.len() + 1 {
            for len in 0..=whole.len() + 1 {
                let held = f.read_held(start as u64, len, ReadCtx::CLIENT).unwrap();
                let end = (start + len).min(whole.len());
                let one_extent = start < end && ((start < 3 && end <= 3) || (start >= 6));
                assert_eq!(held.is_some(), one_extent, "start {start} len {len}");
                if let Some(h) = held {
                    assert_eq!(h.as_slice(), &whole[start..end], "start {start} len {len}");
                    assert!(h.is_in(if start < 3 { &literal } else { &chunk }), "start {start}: a copy");
                }
            }
        }
        // A chunk of the wrong length is refused, as by read_at.
        let mut bad = VirtualFile::new();
        bad.push(Extent::Computed { producer: Arc::new(Kept(chunk)), id: 0, len: 6 });
        assert!(matches!(bad.read_held(0, 2, ReadCtx::CLIENT), Err(ViewError::Internal(_))));
    }

    /// A held read looks ahead of itself as `read_at` does (for clients only).
    #[test]
    fn held_reads_read_ahead_like_copied_ones() {
        let src = Arc::new(Prefetched::default());
        let mut f = VirtualFile::new();
        for id in 0..6 {
            f.push(Extent::Computed { producer: src.clone(), id, len: 1 << 20 });
        }
        let mut buf = vec![0u8; 4096];
        for at in [0, 3 << 20] {
            f.read_at(at, &mut buf, ReadCtx::CLIENT).unwrap();
            let copied = std::mem::take(&mut *src.0.lock());
            assert!(f.read_held(at, 4096, ReadCtx::CLIENT).unwrap().is_some());
            assert_eq!(std::mem::take(&mut *src.0.lock()), copied, "at {at}");
        }
        assert!(f.read_held(0, 4096, ReadCtx::BACKGROUND).unwrap().is_some());
        assert!(src.0.lock().is_empty());
    }
}
