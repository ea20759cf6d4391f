//! The storage layer: where computed chunks are kept and made, between `digest` and `view`.
//!
//! A view describes its files as extents and says how to compute a chunk; everything that
//! keeps or makes the bytes lives here: the memory tier ([`memory`], a byte-budgeted LRU),
//! the disk tier ([`disk`]: chunk entries and whole-file entries under one budget), whole
//! files of a view kept for passthrough ([`file_entries`]), and the compute pool with
//! single-flight and priorities, the lookup across the tiers with read-ahead, and their
//! command-line options ([`compute`]).
//!
//! It stores opaque bytes under opaque keys and knows nothing of views: the view types it
//! needs are small traits defined here ([`ChunkError`] for the views' error,
//! [`file_entries::StoredFile`] for a view file) that `view` implements. The re-exports below
//! are what the layers above use.

pub mod compute;
pub mod disk;
mod error;
pub mod file_entries;
pub mod memory;

pub use compute::{Group, Priority, Tiers, Warmed};
pub use disk::{DiskCache, DiskKey, FileLookup, KeyBuilder, Mode as DiskMode, ProducerKey};
pub use error::{ChunkError, Panicked};
pub use file_entries::FileEntries;
pub use memory::ChunkCache;
