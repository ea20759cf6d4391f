//! Content digests of a source, and the digest store that remembers them.
//!
//! Some views carry content digests *inside* their bytes (the expert pack's header holds
//! the source's sha256, its index every slice's sha256). Hashing a 150 GB source takes
//! minutes, so digests are computed once, in one sequential pass that feeds every hasher
//! (whole source, each file of a split set, header regions, each tensor, each expert
//! slice) from the same buffers, and then remembered in a store keyed by the source
//! files' identity (device, inode, size, mtime, ctime). A later mount of an unchanged
//! source finds them there and reads nothing but headers. Any change to a file changes
//! its identity and so misses the store.
//!
//! Store layout: one JSON file per source, `<store>/<key>.json`, where key is the sha256
//! of the canonical JSON of the files' paths and identities. Written atomically.

pub mod lanes;
mod pass;
mod store;

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::source::{FileIdentity, Source, SourceError};

pub use crate::util::{hex, sha256_hex};
pub use pass::{compute, compute_with};
pub use store::{DigestStore, identity_key, records_of};

pub const STORE_FORMAT: &str = "xpackfs-digests-v1";

#[derive(Debug, thiserror::Error)]
pub enum DigestError {
    #[error(transparent)]
    Source(#[from] SourceError),
    #[error("digest store {}: {what}", path.display())]
    Store { path: PathBuf, what: String },
    /// An entry of the digest store could not be written (its directory made, its JSON
    /// encoded, the file written).
    #[error("digest store {}: {source}", path.display())]
    Write { path: PathBuf, source: StoreWrite },
    #[error("source sha256 mismatch: expected {expected}, the source hashes to {actual}")]
    Mismatch { expected: String, actual: String },
    #[error("{}: the store states sha256 {stated}, the bytes read hash to {actual}", path.display())]
    Stated { path: PathBuf, stated: String, actual: String },
}

/// What failed in writing a digest store entry ([`DigestError::Write`]).
#[derive(Debug, thiserror::Error)]
pub enum StoreWrite {
    #[error("cannot create directory: {0}")]
    CreateDir(#[source] std::io::Error),
    #[error("{0}")]
    Encode(#[from] serde_json::Error),
    #[error("{0}")]
    Write(#[from] std::io::Error),
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct FileRecord {
    pub path: PathBuf,
    pub identity: FileIdentity,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct TensorDigest {
    pub sha256: String,
    /// sha256 of each of `slices.len()` equal slices, for tensors split per expert.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub slices: Vec<String>,
}

/// Digests of one source, as computed and as stored.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SourceDigests {
    pub format: String,
    pub files: Vec<FileRecord>,
    /// sha256 of the source (of the concatenated files, for a split set).
    pub source_sha256: String,
    /// sha256 of each file, in order (of a single file: the source sha256). Empty in entries
    /// stored before these were kept; see [`obtain_per_file`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files_sha256: Vec<String>,
    /// sha256 of each file's header region `[0, data_offset)`, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files_header_sha256: Vec<String>,
    /// sha256 of each file's header region `[0, data_offset)`, concatenated.
    pub header_sha256: String,
    pub tensors: BTreeMap<String, TensorDigest>,
    pub computed_at: String,
    pub elapsed_s: f64,
}

/// Which tensors get per-slice digests, and how many slices.
pub fn expert_slices(t: &crate::source::TensorInfo) -> Option<u64> {
    let n = *t.shape.get(2)?;
    (t.shape.len() == 3 && t.name.ends_with("_exps.weight") && n > 0 && t.nbytes.is_multiple_of(n)).then_some(n)
}

pub fn file_records(source: &Source) -> Vec<FileRecord> {
    source.files.iter().map(|f| FileRecord { path: f.path().to_path_buf(), identity: f.identity() }).collect()
}

pub(crate) fn covers(d: &SourceDigests, source: &Source) -> bool {
    source.tensors.iter().all(|t| d.tensors.get(&t.name).is_some_and(|td| td.slices.len() as u64 == expert_slices(t).unwrap_or(0)))
}

/// Digests for a source: from the store when it has them, else computed (and stored).
/// When `expected_source_sha256` is given, the digests must agree with it.
pub fn obtain(source: &Source, store: &DigestStore, expected_source_sha256: Option<&str>) -> Result<SourceDigests, DigestError> {
    obtain_where(source, store, expected_source_sha256, |_| true)
}

/// [`obtain`], with the per-file digests (`files_sha256`, `files_header_sha256`) present:
/// a stored entry from before they were kept is computed again, once.
pub fn obtain_per_file(source: &Source, store: &DigestStore, expected_source_sha256: Option<&str>) -> Result<SourceDigests, DigestError> {
    let n = source.files.len();
    obtain_where(source, store, expected_source_sha256, |d| d.files_sha256.len() == n && d.files_header_sha256.len() == n)
}

/// sha256 of each file and of each file's header region, for views that need no other digest
/// of the source: from the store when it has them; else, when the store the files live in
/// states every file's sha256 (a Hub repository's LFS files), those, with the header regions
/// read now (a mount then reads headers only); else from the digest pass ([`obtain_per_file`]).
/// Stated digests are the store's word, checked against the bytes whenever the bytes are
/// hashed (a digest pass, `materialize --verify`): the Hub also checks every read against
/// them (`X-Linked-Etag`).
pub fn files_sha256(source: &Source, store: &DigestStore) -> Result<(Vec<String>, Vec<String>), DigestError> {
    let n = source.files.len();
    if let Some(d) = store.load(source).filter(|d| d.files_sha256.len() == n && d.files_header_sha256.len() == n) {
        return Ok((d.files_sha256, d.files_header_sha256));
    }
    let stated: Option<Vec<String>> = source.files.iter().map(|f| f.stated_sha256().map(str::to_ascii_lowercase)).collect();
    if let Some(stated) = stated {
        tracing::info!("per-file sha256 as the store states them ({n} files); reading headers only");
        return Ok((stated, header_sha256s(source)?));
    }
    let d = obtain_per_file(source, store, None)?;
    Ok((d.files_sha256, d.files_header_sha256))
}

/// sha256 of each file's header region `[0, data_offset)` (GGUF sources; empty regions for
/// others), read now: a few MB, for views that need no other digest of the source.
pub fn header_sha256s(source: &Source) -> Result<Vec<String>, SourceError> {
    use sha2::{Digest, Sha256};
    let mut out = Vec::with_capacity(source.files.len());
    for (i, f) in source.files.iter().enumerate() {
        let end = source.gguf().map_or(0, |m| m.headers[i].data_offset).min(f.size());
        let mut h = Sha256::new();
        let mut buf = vec![0u8; (end.min(8 << 20)) as usize];
        let mut off = 0u64;
        while off < end {
            let n = (end - off).min(buf.len() as u64) as usize;
            f.read_exact_at(&mut buf[..n], off)?;
            h.update(&buf[..n]);
            off += n as u64;
        }
        out.push(hex(&h.finalize()));
    }
    Ok(out)
}

fn obtain_where(
    source: &Source,
    store: &DigestStore,
    expected_source_sha256: Option<&str>,
    complete: impl Fn(&SourceDigests) -> bool,
) -> Result<SourceDigests, DigestError> {
    let digests = match store.load(source).filter(|d| complete(d)) {
        Some(d) => {
            tracing::info!("source digests from the store ({})", store.path_for(source).unwrap().display());
            d
        }
        None => {
            tracing::info!("hashing source {} ({} bytes) once; the digests will be remembered", source.files[0].path().display(), source.logical_size());
            let d = compute(source)?;
            tracing::info!("hashed in {:.1}s, sha256 {}", d.elapsed_s, d.source_sha256);
            match store.save(&d) {
                Ok(Some(p)) => tracing::info!("digests stored in {}", p.display()),
                Ok(None) => {}
                Err(e) => tracing::warn!("could not store digests: {e}"),
            }
            d
        }
    };
    if let Some(expected) = expected_source_sha256
        && !expected.eq_ignore_ascii_case(&digests.source_sha256)
    {
        return Err(DigestError::Mismatch { expected: expected.to_string(), actual: digests.source_sha256 });
    }
    Ok(digests)
}
