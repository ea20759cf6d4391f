//! The command-line options of the storage layer (the disk cache, its bound, prewarming,
//! the compute pool's size), declared once and flattened into the views' options, and what
//! they open: the disk cache, bounded by default so that it leaves its filesystem 5% free
//! (read with `statvfs`).

use std::path::{Path, PathBuf};

use super::disk::{DiskCache, DiskCacheConfig};
use crate::util::args::{InvalidValue, int_in, switch};

/// Options of the chunk tiers (flattened into the views' options): the disk cache, its
/// bound, prewarming and the compute pool's size.
#[derive(Debug, Clone, clap::Args)]
#[group(id = "tiers")]
pub struct Options {
    /// Directory of the persistent cache of computed chunks, shared by every mount, `warm` and
    /// `materialize` that name it (off unless given)
    #[arg(long, value_name = "DIR", help_heading = "Chunk caches")]
    pub disk_cache: Option<PathBuf>,
    /// Size bound of the disk cache in GiB, fractions allowed (default: 256, less where that
    /// would leave under 5% of its filesystem free)
    #[arg(long, value_name = "GIB", value_parser = gib, help_heading = "Chunk caches")]
    pub disk_cache_gb: Option<f64>,
    /// on|off: a mount computes every chunk ahead into the disk cache, in the background at
    /// low priority, yielding to reads (needs disk_cache)
    #[arg(long, default_value = "off", value_parser = switch, action = clap::ArgAction::Set, help_heading = "Chunk caches")]
    pub prewarm: bool,
    /// on|off: files of a computed view, and view files over a remote source, are also kept
    /// whole in the disk cache (after `warm`, or once a mount read every chunk or fetched
    /// part of one), and a mount hands those to the kernel (FUSE passthrough, as root):
    /// reads at local-disk speed. Costs the file's bytes again on disk
    #[arg(long, default_value = "on", value_parser = switch, action = clap::ArgAction::Set, help_heading = "Chunk caches")]
    pub disk_cache_files: bool,
    /// Threads that compute chunks (default: the CPU count)
    #[arg(long, value_parser = int_in::<usize>(1, 1024), help_heading = "Chunk caches")]
    pub compute_threads: Option<usize>,
}

fn gib(s: &str) -> Result<f64, InvalidValue> {
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 && v <= (1u64 << 20) as f64 => Ok(v),
        _ => Err(InvalidValue::given(s, "must be a number of GiB above 0 and at most 1048576")),
    }
}

/// The default bound of a disk cache: enough for the largest computed view of a current
/// checkpoint (the requant view of V4.1-Flash is about 143 GiB) with room for a second one.
pub const DEFAULT_DISK_CACHE_GIB: u64 = 256;
/// Without an explicit bound, the cache never grows into this fraction of its filesystem.
const KEEP_FREE: f64 = 0.05;

/// Free and total bytes of the filesystem holding `path` (or its nearest existing ancestor).
fn space(path: &Path) -> Option<(u64, u64)> {
    let mut p = path;
    while !p.exists() {
        p = p.parent()?;
    }
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).ok()?;
    // SAFETY: statvfs is plain old data, for which all zeros is a valid value.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a NUL-terminated path and `st` a valid statvfs to fill.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    Some((st.f_bavail as u64 * st.f_frsize as u64, st.f_blocks as u64 * st.f_frsize as u64))
}

impl Options {
    /// The disk cache these options name, opened (never an error: see [`DiskCache::open`]).
    pub fn open_disk_cache(&self) -> Option<DiskCache> {
        let dir = self.disk_cache.as_ref()?;
        let explicit = self.disk_cache_gb.map(|g| (g * (1u64 << 30) as f64) as u64);
        let mut disk = DiskCache::open(DiskCacheConfig::new(dir, explicit.unwrap_or(DEFAULT_DISK_CACHE_GIB << 30)));
        if explicit.is_none()
            && let Some((free, total)) = space(dir)
        {
            let room = (free + disk.size_bytes()).saturating_sub((total as f64 * KEEP_FREE) as u64);
            if room < disk.budget() {
                tracing::info!(
                    "disk cache {}: bound {:.1} GiB (keeps 5% of its filesystem free; disk_cache_gb= sets it)",
                    dir.display(),
                    room as f64 / (1u64 << 30) as f64
                );
                disk.set_budget(room);
            }
        }
        Some(disk)
    }
}
