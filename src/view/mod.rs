//! Views: each describes a directory of virtual files in terms of source ranges, literal
//! bytes, zeros and computed chunks. Nothing here knows about FUSE.

pub mod bf16_cache;
pub mod cache;
pub mod compute;
pub mod disk_cache;
pub mod expert_pack;
pub mod imatrix;
pub mod kt_int8;
pub mod requant;
pub mod tree;
pub mod vfile;

pub use tree::{Ino, NodeKind, Tree, ROOT_INO};
pub use vfile::{ChunkSource, Extent, VirtualFile};

use crate::digest::DigestError;
use crate::source::SourceError;

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
    #[error("internal error: {0}")]
    Internal(String),
}
