//! Fetched parts of remote objects kept in the disk cache: the disk tier below the remote
//! parts tier (`source::remote::parts`). One directory and one bound serve computed chunks
//! and fetched parts alike (`-o disk_cache=DIR`), with the same guarantees (checksummed
//! entries, atomic writes, LRU eviction, shared by every process using the directory, kept
//! across restarts). A part's key holds the object's identity (URL, size and pinned
//! ETag/version/commit, hashed) and the part's byte range: a changed object, or another part
//! size, never meets these entries.

use std::sync::Arc;

use super::disk::{DiskCache, DiskKey, KeyBuilder};
use crate::source::remote::parts::DiskTier;

pub struct FetchedParts(pub Arc<DiskCache>);

fn key(object: u128, offset: u64, len: usize) -> DiskKey {
    KeyBuilder::new("remote-part").field("object", object.to_le_bytes()).u64("offset", offset).u64("len", len as u64).finish()
}

impl DiskTier for FetchedParts {
    fn get_into(&self, object: u128, offset: u64, buf: &mut [u8]) -> bool {
        self.0.get_into(&key(object, offset, buf.len()), buf)
    }
    fn contains(&self, object: u128, offset: u64, len: usize) -> bool {
        self.0.contains(&key(object, offset, len), len as u64)
    }
    fn put(&self, object: u128, offset: u64, bytes: &[u8]) {
        self.0.put(&key(object, offset, bytes.len()), bytes);
    }
}

/// Make `disk` the disk tier of fetched parts for this process.
pub fn install(disk: &Arc<DiskCache>) {
    crate::source::remote::parts::set_disk_tier(Arc::new(FetchedParts(disk.clone())));
}
