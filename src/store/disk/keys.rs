//! Disk-cache keys: a digest of everything an entry's bytes depend on, built from labelled
//! fields so that no two different field lists hash alike. Views build them (the view name,
//! the source files' identities, the view parameters, what a chunk producer reads); the
//! cache treats them as opaque.

use std::sync::Arc;

use sha2::{Digest, Sha256};

use super::entry::MAGIC;

/// A cache key: a digest of everything an entry's bytes depend on.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DiskKey(pub [u8; 32]);

impl DiskKey {
    pub fn hex(&self) -> String {
        hex::encode(self.0)
    }
}

impl std::fmt::Debug for DiskKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DiskKey({})", self.hex())
    }
}

/// Builds keys from labelled fields (each label and value length-prefixed, so no two
/// different field lists hash alike). Start from the view name; add the source's content
/// identity, the view parameters, what a chunk producer reads; then either
/// [`KeyBuilder::finish`] or [`KeyBuilder::producer`] for per-chunk keys.
#[derive(Clone)]
pub struct KeyBuilder(Sha256);

impl KeyBuilder {
    /// A key for `view`, already covering the entry format and [`crate::codec::REVISION`]
    /// (bumped whenever any codec's output or a view's chunking could change: entries of an
    /// older revision then never match again and age out by LRU).
    pub fn new(view: &str) -> Self {
        let mut b = KeyBuilder(Sha256::new());
        b.0.update(MAGIC);
        b.0.update(crate::codec::REVISION.to_le_bytes());
        b.field("view", view)
    }

    pub fn field(mut self, label: &str, value: impl AsRef<[u8]>) -> Self {
        let value = value.as_ref();
        self.0.update((label.len() as u64).to_le_bytes());
        self.0.update(label.as_bytes());
        self.0.update((value.len() as u64).to_le_bytes());
        self.0.update(value);
        self
    }

    pub fn u64(self, label: &str, value: u64) -> Self {
        self.field(label, value.to_le_bytes())
    }

    pub fn finish(self) -> DiskKey {
        DiskKey(self.0.finalize().into())
    }

    /// The base key of one chunk producer; [`ProducerKey::chunk`] derives each chunk's key.
    pub fn producer(self) -> ProducerKey {
        ProducerKey(self.finish().0)
    }
}

/// The identity of each source file as keys hold it (path, inode, size, mtime and ctime,
/// not the device number: the digest store's rule, [`crate::digest::identity_key`]), so an
/// entry computed from a file that has changed since is never found. Computed once per
/// build, then added to each producer's key.
pub fn source_file_keys(files: &[Arc<crate::source::SourceFile>]) -> Vec<String> {
    files.iter().map(source_file_key).collect()
}

/// The identity of one source file as keys hold it (see [`source_file_keys`]).
pub fn source_file_key(file: &Arc<crate::source::SourceFile>) -> String {
    crate::digest::identity_key("", &crate::digest::records_of(std::slice::from_ref(file)))
}

/// Base key of a chunk producer (one tensor's chunks, ...), fixed at view build time.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct ProducerKey(pub [u8; 32]);

impl ProducerKey {
    pub fn chunk(&self, id: u64) -> DiskKey {
        let mut h = Sha256::new();
        h.update(self.0);
        h.update(b"chunk");
        h.update(id.to_le_bytes());
        DiskKey(h.finalize().into())
    }

    /// The key of a job that computes several of this producer's chunks at once.
    pub fn group(&self) -> DiskKey {
        let mut h = Sha256::new();
        h.update(self.0);
        h.update(b"group");
        DiskKey(h.finalize().into())
    }
}

impl std::fmt::Debug for ProducerKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ProducerKey({})", hex::encode(self.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_cover_every_field_unambiguously() {
        let base = || KeyBuilder::new("requant").field("source", "abc");
        let k = base().field("w1", "IQ2_XXS").finish();
        assert_eq!(k, base().field("w1", "IQ2_XXS").finish());
        assert_ne!(k, base().field("w1", "Q8_0").finish());
        assert_ne!(k, KeyBuilder::new("kt-int8").field("source", "abc").field("w1", "IQ2_XXS").finish());
        // Field boundaries and labels count.
        assert_ne!(base().field("ab", "c").finish(), base().field("a", "bc").finish());
        assert_ne!(base().field("a", "b").field("c", "").finish(), base().field("a", "bc").finish());
        assert_ne!(base().u64("n", 1).finish(), base().u64("m", 1).finish());
        let p = base().producer();
        let ids: std::collections::HashSet<DiskKey> = (0..1000).map(|i| p.chunk(i)).collect();
        assert_eq!(ids.len(), 1000);
        assert_ne!(p.chunk(0), base().field("x", "").producer().chunk(0));
        assert!(!ids.contains(&p.group()));
    }
}
