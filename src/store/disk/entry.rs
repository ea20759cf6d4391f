//! Chunk entries: the format of one entry (`header (64 bytes) + payload`: a magic with the
//! format version, the key, the payload length and an XXH3-128 checksum of key, length and
//! payload) and its I/O: read and verified whole on every hit, written under `tmp/` and
//! renamed into `entries/<2 hex>/<64 hex>`, deleted when found wrong.

use std::fs::{self, File};
use std::io::{self, ErrorKind};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use twox_hash::XxHash3_128;

use super::{DiskCache, DiskKey, Mode};

/// Entry format: magic (with the format version), key, payload length, checksum.
pub(super) const MAGIC: [u8; 8] = *b"XPKFSDC1";
pub const HEADER_BYTES: u64 = 64;
/// Largest payload accepted (a length read from an entry is capped by this before allocating).
pub const MAX_ENTRY_BYTES: u64 = 1 << 30;
/// Bytes read (and hashed) at a time, so the checksum runs over data still in the CPU cache.
pub(super) const READ_PIECE: usize = 256 << 10;

/// Why an entry was rejected.
#[derive(Debug)]
enum Bad {
    Corrupt(String),
    Io(io::Error),
    /// Whole and of this key, but not of the length the caller wants (nothing was read).
    Unwanted,
}

impl DiskCache {
    pub(super) fn entry_path(&self, key: &DiskKey) -> PathBuf {
        let hex = key.hex();
        self.cfg.dir.join("entries").join(&hex[..2]).join(hex)
    }

    /// The entry under `key`, verified, or `None` (absent, unreadable, or found wrong and
    /// deleted).
    pub fn get(&self, key: &DiskKey) -> Option<Arc<[u8]>> {
        let mut buf = None;
        self.get_with(key, |len| Arc::get_mut(buf.insert(crate::util::populated_zeroed_arc(len as usize))))?;
        buf
    }

    /// The entry under `key` read and verified straight into `out`, when it holds exactly
    /// `out.len()` bytes: whether it did. On `false`, `out` holds anything (a miss leaves
    /// it as it was, a corrupt entry partly overwritten). For a caller that has the buffer
    /// the bytes go to (a fetched part's, reused): no allocation and no second copy.
    pub fn get_into(&self, key: &DiskKey, out: &mut [u8]) -> bool {
        let want = out.len() as u64;
        let mut out = Some(out);
        self.get_with(key, |len| if len == want { out.take() } else { None }).is_some()
    }

    /// Read the entry under `key` into the buffer `dest(payload length)` gives (`None`: not
    /// wanted, counted as a miss), verifying it; the entry's payload length on success.
    fn get_with<'b>(&self, key: &DiskKey, dest: impl FnOnce(u64) -> Option<&'b mut [u8]>) -> Option<u64> {
        if self.mode() == Mode::Disabled {
            return None;
        }
        let path = self.entry_path(key);
        let file = self.open_or_miss(&path, &self.stats.misses)?;
        match read_entry(&file, key, dest) {
            Ok((len, mtime)) => {
                self.stats.hits.inc();
                self.stats.bytes_read.inc_by(len);
                self.touch(&file, mtime);
                Some(len)
            }
            Err(Bad::Unwanted) => {
                self.stats.misses.inc();
                None
            }
            Err(Bad::Corrupt(why)) => {
                self.stats.corrupt.inc();
                self.stats.misses.inc();
                tracing::warn!("disk cache entry {} is corrupt ({why}): deleted, the chunk will be recomputed", path.display());
                self.remove_if_same(&path, &file);
                None
            }
            Err(Bad::Io(e)) => {
                self.stats.misses.inc();
                self.warn("read", || format!("{}: {e}", path.display()));
                None
            }
        }
    }

    /// Whether an entry of `payload_len` bytes is present under `key` (size checked, not
    /// the checksum: for resuming a warm-up cheaply; `get` still verifies).
    pub fn contains(&self, key: &DiskKey, payload_len: u64) -> bool {
        self.mode() != Mode::Disabled && fs::metadata(self.entry_path(key)).is_ok_and(|m| m.len() == HEADER_BYTES + payload_len)
    }

    /// Delete the entry at `path` if it is still the file `file` (a writer may have just
    /// replaced it with a good one).
    pub(super) fn remove_if_same(&self, path: &Path, file: &File) {
        let (Ok(a), Ok(b)) = (file.metadata(), fs::symlink_metadata(path)) else { return };
        if (a.dev(), a.ino()) == (b.dev(), b.ino()) && fs::remove_file(path).is_ok() {
            self.add_usage(-(a.len() as i64));
        }
    }

    /// Store `bytes` under `key` (write-behind: call it after the bytes were served).
    /// Returns whether the entry is now present. Failures are warnings, never errors.
    pub fn put(&self, key: &DiskKey, bytes: &[u8]) -> bool {
        let total = HEADER_BYTES + bytes.len() as u64;
        if self.mode() != Mode::ReadWrite || self.paused() || bytes.len() as u64 > MAX_ENTRY_BYTES || total > self.cfg.budget_bytes {
            self.stats.skipped_writes.inc();
            return false;
        }
        let path = self.entry_path(key);
        if fs::metadata(&path).is_ok_and(|m| m.len() == total) {
            self.stats.skipped_writes.inc();
            return true; // another writer (or process) was first
        }
        let Some(before) = self.add_usage(total as i64) else {
            self.stats.skipped_writes.inc();
            return false;
        };
        match self.write_entry(key, bytes, &path) {
            Ok(()) => {
                self.stats.writes.inc();
                self.stats.bytes_written.inc_by(total);
            }
            Err(e) => {
                self.add_usage(-(total as i64));
                self.write_failed(&e);
                return false;
            }
        }
        if before.saturating_add(total) > self.cfg.budget_bytes {
            self.evict(false);
        }
        true
    }

    fn write_entry(&self, key: &DiskKey, bytes: &[u8], path: &Path) -> io::Result<()> {
        self.write_renamed(&key.hex(), path, |f| {
            f.write_all_at(&header(key, bytes), 0)?;
            f.write_all_at(bytes, HEADER_BYTES)?;
            if self.cfg.fsync {
                f.sync_data()?;
            }
            Ok(())
        })
        .map(drop)
    }
}

fn checksum(key: &DiskKey, len: u64) -> XxHash3_128 {
    let mut h = XxHash3_128::new();
    h.write(&key.0);
    h.write(&len.to_le_bytes());
    h
}

fn header(key: &DiskKey, bytes: &[u8]) -> [u8; HEADER_BYTES as usize] {
    let len = bytes.len() as u64;
    let mut h = checksum(key, len);
    h.write(bytes);
    let mut out = [0u8; HEADER_BYTES as usize];
    out[..8].copy_from_slice(&MAGIC);
    out[8..40].copy_from_slice(&key.0);
    out[40..48].copy_from_slice(&len.to_le_bytes());
    out[48..64].copy_from_slice(&h.finish_128().to_le_bytes());
    out
}

/// Drop the page cache's pages of `[offset, offset + len)` of an entry just read (whole
/// pages only; `len` 0: to the end of the file). Every entry is read into a memory tier
/// that holds its bytes (a computed chunk, a fetched part), so its pages in the page cache
/// would be a second copy: reading the fetched parts of an 894 MB object from the disk cache
/// filled 894 MB of page cache beside the parts, and on this VM, whose free memory the host
/// takes back, the fresh pages made the read 2.5-3x slower (1.65-2.17 s against 0.58-0.65 s when the pages were at hand, the
/// client on one core). Dropped as the read goes, the pages are reused for the next piece:
/// 0.67-0.97 s on one core, 0.46-0.55 s on two (1.26-1.36 s before). Best effort (advice).
fn drop_cached(fd: std::os::fd::RawFd, offset: u64, len: u64) {
    // SAFETY: a plain system call on an open descriptor; it reads no memory.
    unsafe { libc::posix_fadvise(fd, offset.min(i64::MAX as u64) as i64, len.min(i64::MAX as u64) as i64, libc::POSIX_FADV_DONTNEED) };
}

/// Read and verify the entry `file` holds for `key` into the buffer `dest(payload length)`
/// gives (`None`: [`Bad::Unwanted`], nothing read): the payload length and the mtime.
fn read_entry<'b>(file: &File, key: &DiskKey, dest: impl FnOnce(u64) -> Option<&'b mut [u8]>) -> Result<(u64, SystemTime), Bad> {
    let meta = file.metadata().map_err(Bad::Io)?;
    let size = meta.len();
    if size < HEADER_BYTES {
        return Err(Bad::Corrupt(format!("{size} bytes, shorter than the header")));
    }
    let mut head = [0u8; HEADER_BYTES as usize];
    file.read_exact_at(&mut head, 0).map_err(Bad::Io)?;
    if head[..8] != MAGIC {
        return Err(Bad::Corrupt("not an entry of this format".into()));
    }
    if head[8..40] != key.0 {
        return Err(Bad::Corrupt("holds another key".into()));
    }
    let len = u64::from_le_bytes(head[40..48].try_into().unwrap());
    if len > MAX_ENTRY_BYTES || len != size - HEADER_BYTES {
        return Err(Bad::Corrupt(format!("header says {len} payload bytes, the file has {}", size - HEADER_BYTES)));
    }
    let want = u128::from_le_bytes(head[48..64].try_into().unwrap());
    let out = dest(len).ok_or(Bad::Unwanted)?;
    debug_assert_eq!(out.len() as u64, len);
    // The whole entry is wanted: one readahead of all of it, so a cold entry costs one
    // device round trip instead of one per piece read below.
    // SAFETY: a plain system call on the open descriptor `file`; it reads no memory.
    unsafe { libc::posix_fadvise(std::os::fd::AsRawFd::as_raw_fd(file), 0, size.min(i64::MAX as u64) as i64, libc::POSIX_FADV_WILLNEED) };
    let mut h = checksum(key, len);
    let mut done = 0usize;
    let fd = std::os::fd::AsRawFd::as_raw_fd(file);
    while done < out.len() {
        let n = READ_PIECE.min(out.len() - done);
        let piece = &mut out[done..done + n];
        file.read_exact_at(piece, HEADER_BYTES + done as u64).map_err(|e| match e.kind() {
            ErrorKind::UnexpectedEof => Bad::Corrupt("truncated while reading".into()),
            _ => Bad::Io(e),
        })?;
        h.write(piece);
        // The bytes now live in the caller's memory tier: the page cache's copy of them is
        // dropped as the read goes (see `drop_cached`).
        drop_cached(fd, HEADER_BYTES + done as u64, n as u64);
        done += n;
    }
    drop_cached(fd, 0, 0); // the whole file: the header's page and a partial last page too
    if h.finish_128() != want {
        return Err(Bad::Corrupt("checksum mismatch".into()));
    }
    Ok((len, meta.modified().unwrap_or(SystemTime::UNIX_EPOCH)))
}
