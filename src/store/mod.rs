//! The storage layer: where computed chunks are kept and made, between `digest` and `view`.
//!
//! A view describes its files as extents and says how to compute a chunk; everything that
//! keeps or makes the bytes lives here, one idea per file: the memory tier ([`memory`], a
//! byte-budgeted LRU), the disk tier ([`disk`]: chunk entries and whole-file entries under
//! one budget), fetched parts of remote sources kept in that same disk tier ([`fetched`]),
//! whole files of a view kept for passthrough ([`file_entries`]), the compute
//! pool with priorities ([`compute`]), the lookup across them with read-ahead ([`tiers`]),
//! the one single-flight mechanism they share ([`flight`]), their command-line options
//! ([`options`]), and the context every read carries down to them ([`ReadCtx`]: who reads,
//! at what priority, what it may do).
//!
//! It stores opaque bytes under opaque keys and knows nothing of views: the view types it
//! needs are small traits defined here ([`ChunkError`] for the views' error,
//! [`StoredFile`] for a view file) that `view` implements. The re-exports below are the
//! interface the layers above use (`serve` uses nothing else).

pub mod compute;
mod ctx;
pub mod disk;
mod error;
pub mod fetched;
pub mod file_entries;
pub mod flight;
pub mod memory;
pub mod options;
pub mod tiers;

pub use compute::Priority;
pub use ctx::{ReadCtx, Reader};
pub use disk::{DiskCache, DiskKey, FileLookup, KeyBuilder, Mode as DiskMode, ProducerKey};
pub use error::{ChunkError, Panicked};
pub use file_entries::{FileEntries, StoredFile, key as file_entry_key};
pub use memory::{CacheSnapshot, ChunkCache, Tier};
pub use options::Options;
pub use tiers::{Group, Tiers, Warmed};
