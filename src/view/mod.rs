//! Views: each describes a directory of virtual files in terms of source ranges, literal
//! bytes, zeros and computed chunks. Nothing here knows about FUSE or about writing files.
//!
//! [`registry`] lists the views and builds one from an [`Input`] and [`ViewOptions`]; each
//! view module provides the same few parts (its options, a plan checked against the
//! source, the layout of its virtual files, its manifests as [`derived`] files, and a
//! verify hook for `materialize --verify`). [`vfile`] and [`tree`] are the file and
//! directory model both front ends read. Computed chunks go through the storage layer's
//! [`Tiers`] (`crate::store`: memory, disk cache and compute pool, one set per process),
//! through [`tiered`]'s producer, to which a view gives its chunk plan and `compute(id)`;
//! [`warm`] computes a view's chunks ahead into the disk cache.

pub mod bf16_cache;
pub mod derived;
pub mod expert_pack;
pub mod gguf_out;
pub mod imatrix;
pub mod kimi_pack;
pub mod kt_int8;
pub mod registry;
pub mod requant;
pub(crate) mod scratch;
pub mod tiered;
pub mod tree;
pub mod vfile;
pub mod warm;

use std::sync::Arc;

pub use registry::{Built, Context, Input, Purpose, VIEWS, View, ViewOptions, build};
pub use tree::{Ino, NodeKind, ROOT_INO, Tree};
pub use vfile::{Chunk, ChunkProducer, Extent, Held, Tally, VirtualFile};

use crate::codec::CodecError;
use crate::digest::DigestError;
use crate::source::SourceError;
use crate::store::{ChunkError, Panicked};

/// The storage layer's chunk tiers, computing with the views' error.
pub type Tiers = crate::store::Tiers<ViewError>;
/// What one job of the compute pool computes for a view (one chunk, or sibling chunks).
pub type Group = crate::store::Group<ViewError>;

/// The highest layer index a view accepts in a tensor name (real models have under 200).
pub const MAX_LAYER_INDEX: u64 = 4095;
/// The most routed experts per layer a view accepts in tensor names (real models have up to
/// 384; the Kimi pack's planner has its own cap, `kimi_pack::plan::MAX_KIMI_EXPERTS`).
pub const MAX_EXPERTS: u64 = 65536;

/// An expert or layer index as written in a tensor name: decimal, no leading zeros, at most
/// `max`; the refusal names the tensor and the rule.
pub(crate) fn name_index(name: &str, what: &'static str, v: &str, max: u64) -> Result<u64, BadIndex> {
    match v.parse::<u64>() {
        Ok(x) if x <= max && (v == "0" || !v.starts_with('0')) => Ok(x),
        _ => Err(BadIndex { tensor: name.to_string(), what, index: v.to_string(), max }),
    }
}

/// An expert or layer index (`what`) in a tensor's name that [`name_index`] refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{tensor}: {what} index {index:?} is not a number from 0 to {max}")]
pub struct BadIndex {
    pub tensor: String,
    pub what: &'static str,
    pub index: String,
    pub max: u64,
}

/// A chunk of `len` bytes computed by `fill` straight into the `Arc<[u8]>` the caches keep
/// (zeroed): no `Arc::from(Vec)` copy, and one fresh allocation instead of two. A large
/// chunk is a fresh mapping whose pages the allocator does not touch to zero them (they come
/// zeroed); they are mapped in one call ([`crate::util::populate_for_write`]) rather than
/// with one page fault per 4 KiB as `fill` first writes them.
pub(crate) fn new_chunk<E>(len: usize, fill: impl FnOnce(&mut [u8]) -> Result<(), E>) -> Result<Arc<[u8]>, E> {
    let mut chunk = crate::util::populated_zeroed_arc(len);
    fill(Arc::get_mut(&mut chunk).expect("a new Arc has no other holder"))?;
    Ok(chunk)
}

#[derive(Debug, thiserror::Error)]
pub enum ViewError {
    #[error(transparent)]
    Source(#[from] SourceError),
    #[error(transparent)]
    Digest(#[from] DigestError),
    /// The source does not have the shape the view needs.
    #[error("{view}: {rule}")]
    Layout { view: &'static str, rule: String },
    /// A view option is invalid.
    #[error("option {option}: {rule}")]
    Option { option: &'static str, rule: String },
    /// Content found wrong only when read (a non-finite value, ...): EIO for that read.
    #[error("tensor {tensor}: {rule}")]
    Content { tensor: String, rule: String },
    /// A codec refused the bytes of a tensor.
    #[error("tensor {tensor}: {source}")]
    Codec { tensor: String, source: CodecError },
    /// An existing INT8 tree breaks one of the validator's rules.
    #[error(transparent)]
    InvalidTree(#[from] kt_int8::validate::InvalidTree),
    /// `materialize --verify` found written bytes that disagree with a manifest.
    #[error("verify: {file}: {rule}")]
    Verify { file: String, rule: String },
    /// The same error, handed to every reader that waited for one computation.
    #[error(transparent)]
    Shared(Arc<ViewError>),
    #[error("internal error: {0}")]
    Internal(String),
}

impl From<Panicked> for ViewError {
    fn from(p: Panicked) -> Self {
        ViewError::Internal(format!("chunk computation panicked: {}", p.0))
    }
}

/// The views' error is the one the storage layer shares among the readers of a chunk.
impl ChunkError for ViewError {
    fn shared(e: Arc<Self>) -> Self {
        ViewError::Shared(e)
    }
    fn internal(msg: String) -> Self {
        ViewError::Internal(msg)
    }
    fn option(option: &'static str, rule: String) -> Self {
        ViewError::Option { option, rule }
    }
}

impl ViewError {
    pub fn layout(view: &'static str, rule: impl Into<String>) -> Self {
        ViewError::Layout { view, rule: rule.into() }
    }

    pub fn option(option: &'static str, rule: impl Into<String>) -> Self {
        ViewError::Option { option, rule: rule.into() }
    }

    /// The error itself, through the sharing of a computation's error with its waiters.
    pub fn root(&self) -> &ViewError {
        match self {
            ViewError::Shared(inner) => inner.root(),
            other => other,
        }
    }

    /// The errno a read that failed with this error answers. Content that breaks a rule, a
    /// changed source and internal errors are all EIO: the daemon has no bytes it can vouch
    /// for. I/O errors of the source keep their own code where it means something to a
    /// reader (ENOMEM, ...).
    pub fn errno(&self) -> i32 {
        match self {
            ViewError::Shared(inner) => inner.errno(),
            ViewError::Source(SourceError::Io { source, .. }) | ViewError::Digest(DigestError::Source(SourceError::Io { source, .. })) => {
                match source.raw_os_error() {
                    Some(code @ (libc::ENOMEM | libc::EINTR | libc::EAGAIN)) => code,
                    _ => libc::EIO,
                }
            }
            ViewError::Option { .. } => libc::EINVAL,
            _ => libc::EIO,
        }
    }
}
