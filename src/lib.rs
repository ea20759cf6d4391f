//! xpackfs: a read-only FUSE filesystem that presents converted forms of a mixture-of-
//! experts checkpoint (expert packs, ...) as virtual files computed on read.
//!
//! Data flows one way: [`source`] parses checkpoints from headers; [`codec`] turns bytes
//! into bytes; [`store`] keeps and makes computed chunks (memory and disk tiers, the compute
//! pool); [`view`] describes virtual files as extents over sources and codecs;
//! [`serve`] (FUSE) and materialisation read views through the same
//! [`view::VirtualFile::read_at`].

#![deny(clippy::undocumented_unsafe_blocks)]

pub mod cli;
pub mod codec;
pub mod digest;
pub mod fsutil;
pub mod materialize;
pub mod metrics;
pub mod pyjson;
pub mod serve;
pub mod source;
pub mod store;
pub mod util;
pub mod view;

/// Git revision of this build ("unknown" outside a checkout).
pub const GIT_SHA: &str = env!("XPACKFS_GIT_SHA");
