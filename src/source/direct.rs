//! Direct reads of a source file (`O_DIRECT`), for clients that asked for direct I/O and for
//! the packs the mount's page cache holds: the bytes go from the device to the daemon
//! without entering the page cache, so a client that opens the pack with `O_DIRECT`
//! (SGLang's loader), or reads it buffered, leaves no copy of the source in memory.
//!
//! [`SourceFile::read_exact_at_direct`] reads the aligned superset of the asked range into
//! an aligned per-thread buffer and copies out the part asked for (GGUF tensor data need
//! not be aligned). The `O_DIRECT` descriptor is opened lazily, on the path that was opened,
//! and checked to be the same inode; the identity checks after each read are those of the
//! buffered path ([`SourceFile::read_exact_at`]), so a changed source gives an error, never
//! bytes. Where the filesystem refuses direct I/O, reads fall back to buffered `pread`
//! (logged once).
//!
//! A range whose pages are all in the page cache already is read from there with a plain
//! `pread` instead ([`resident`], `cachestat(2)`, Linux 6.5+): reading it again from the
//! device would be slower and gain nothing, since the memory is in use either way; nothing
//! new enters the page cache, so a cold direct read of the whole pack still leaves none of
//! the source behind. `preadv2(RWF_NOWAIT)` would also find resident pages, but a buffered
//! read that misses starts readahead, which would leave source pages in memory.

use std::fs::File;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::sync::OnceLock;

use super::{SourceError, SourceFile};

/// How a read goes to the source: through the page cache, or around it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SourceIo {
    #[default]
    Buffered,
    Direct,
}

/// Largest single direct read (the aligned buffer grows to this at most; larger asks loop).
const MAX_CHUNK: usize = 8 << 20;

/// The lazily opened `O_DIRECT` descriptor of one source file and its alignment.
#[derive(Debug, Default)]
pub struct DirectFd {
    /// `None`: direct I/O is unavailable for this file (reads fall back to buffered).
    fd: OnceLock<Option<(File, u64)>>,
}

/// The file-offset alignment direct I/O needs on `file` (statx `STATX_DIOALIGN`, kernel
/// 6.1+; 4096 where unknown: a multiple of every logical block size in use). `None` when
/// the filesystem says it does not support direct I/O.
fn dio_alignment(file: &File) -> Option<u64> {
    use std::os::fd::AsRawFd;
    // SAFETY: statx fills the zeroed struct it is given; the fd is open for the call; the
    // empty path with AT_EMPTY_PATH names the fd itself.
    let stx = unsafe {
        let mut stx: libc::statx = std::mem::zeroed();
        let rc = libc::statx(file.as_raw_fd(), c"".as_ptr(), libc::AT_EMPTY_PATH, libc::STATX_DIOALIGN, &mut stx);
        (rc == 0).then_some(stx)
    };
    match stx {
        Some(s) if s.stx_mask & libc::STATX_DIOALIGN != 0 => {
            let align = u64::from(s.stx_dio_offset_align.max(s.stx_dio_mem_align));
            (align != 0).then(|| align.max(4096).next_power_of_two())
        }
        _ => Some(4096),
    }
}

thread_local! {
    /// Each thread's aligned read buffer (an anonymous mapping: page-aligned), grown on demand.
    static SCRATCH: std::cell::RefCell<Option<memmap2::MmapMut>> = const { std::cell::RefCell::new(None) };
}

impl SourceFile {
    /// The `O_DIRECT` descriptor (opened on first use) and its alignment, or `None` if the
    /// file cannot be read directly.
    fn direct_fd(&self) -> Option<&(File, u64)> {
        self.direct
            .fd
            .get_or_init(|| {
                let opened = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(self.path());
                let why = match opened {
                    Ok(f) => match f.metadata() {
                        // The path must still name the inode opened (and checked) at mount.
                        Ok(m) if m.dev() == self.identity().device && m.ino() == self.identity().inode => match dio_alignment(&f) {
                            Some(align) => return Some((f, align)),
                            None => "the filesystem does not support direct I/O".to_string(),
                        },
                        Ok(_) => "its path names another file now".to_string(),
                        Err(e) => e.to_string(),
                    },
                    Err(e) => e.to_string(),
                };
                tracing::warn!(
                    "{}: no O_DIRECT reads ({why}): direct handles read it through the page cache (a pack kept in the mount's page cache is then cached twice)",
                    self.path().display()
                );
                None
            })
            .as_ref()
    }

    /// Like [`SourceFile::read_exact_at`], but around the page cache (`O_DIRECT`): fill `buf`
    /// from `offset`, failing on a short read or a changed file. A range the page cache
    /// holds whole is read from it (see the module docs).
    pub fn read_exact_at_direct(&self, buf: &mut [u8], offset: u64) -> Result<(), SourceError> {
        let Some(local) = self.file() else { return self.read_exact_at(buf, offset) };
        let Some((file, align)) = self.direct_fd() else { return self.read_exact_at(buf, offset) };
        if resident(local, offset, buf.len() as u64) {
            return self.read_exact_at(buf, offset);
        }
        let end = offset.checked_add(buf.len() as u64);
        if end.is_none_or(|end| end > self.size()) {
            return Err(SourceError::format(self.path(), format!("read of {} bytes at {offset} is beyond the end of the file ({})", buf.len(), self.size())));
        }
        let align = *align;
        SCRATCH.with_borrow_mut(|scratch| {
            let mut done = 0usize;
            while done < buf.len() {
                let pos = offset + done as u64;
                let start = pos / align * align;
                let head = (pos - start) as usize;
                let n = (buf.len() - done).min(MAX_CHUNK - head);
                let span = (head + n).next_multiple_of(align as usize);
                let space = grow(scratch, span).map_err(|e| SourceError::Io { path: self.path().to_path_buf(), source: e })?;
                let got =
                    read_full(file, &mut space[..span], start, align as usize).map_err(|e| SourceError::Io { path: self.path().to_path_buf(), source: e })?;
                if got < head + n {
                    return Err(SourceError::Changed { path: self.path().to_path_buf(), what: format!("short read at offset {pos}: file shrank") });
                }
                buf[done..done + n].copy_from_slice(&space[head..head + n]);
                done += n;
            }
            Ok(())
        })?;
        self.check_unchanged()?;
        self.check_path()
    }
}

/// `cachestat(2)`'s range and result (`include/uapi/linux/mman.h`).
#[repr(C)]
struct CachestatRange {
    off: u64,
    len: u64,
}

#[repr(C)]
#[derive(Default)]
struct Cachestat {
    nr_cache: u64,
    nr_dirty: u64,
    nr_writeback: u64,
    nr_evicted: u64,
    nr_recently_evicted: u64,
}

/// The syscall's number: 451 on every architecture (it was added after the tables unified).
const SYS_CACHESTAT: libc::c_long = 451;

/// Whether every page of `[offset, offset + len)` of `file` is in the page cache. False
/// where the kernel has no `cachestat` (before 6.5; remembered after the first ENOSYS).
pub(super) fn resident(file: &File, offset: u64, len: u64) -> bool {
    use std::os::fd::AsRawFd;
    use std::sync::atomic::{AtomicBool, Ordering};
    static UNSUPPORTED: AtomicBool = AtomicBool::new(false);
    if len == 0 || UNSUPPORTED.load(Ordering::Relaxed) {
        return false;
    }
    let page = 4096u64;
    let first = offset / page;
    let Some(last) = offset.checked_add(len - 1).map(|e| e / page) else { return false };
    let range = CachestatRange { off: first * page, len: (last - first + 1) * page };
    let mut stat = Cachestat::default();
    // SAFETY: cachestat reads `range` and writes `stat`, both valid for the call; the fd is
    // open for its duration; flags must be 0.
    let rc = unsafe { libc::syscall(SYS_CACHESTAT, file.as_raw_fd() as libc::c_uint, &range as *const CachestatRange, &mut stat as *mut Cachestat, 0u32) };
    if rc != 0 {
        if std::io::Error::last_os_error().raw_os_error() == Some(libc::ENOSYS) {
            UNSUPPORTED.store(true, Ordering::Relaxed);
        }
        return false;
    }
    stat.nr_cache > last - first
}

/// The thread's scratch buffer, at least `len` bytes.
fn grow(scratch: &mut Option<memmap2::MmapMut>, len: usize) -> std::io::Result<&mut [u8]> {
    if scratch.as_ref().is_none_or(|m| m.len() < len) {
        *scratch = Some(memmap2::MmapMut::map_anon(len.next_multiple_of(1 << 20))?);
    }
    scratch.as_deref_mut().ok_or_else(|| std::io::Error::other("no read buffer"))
}

/// `pread` until `buf` is full or the file ends (a direct read returns less than asked, and
/// a count that is not a multiple of the alignment, only at the end of the file); returns
/// the bytes read.
fn read_full(file: &File, buf: &mut [u8], offset: u64, align: usize) -> std::io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match file.read_at(&mut buf[got..], offset + got as u64) {
            Ok(0) => break,
            Ok(n) => {
                got += n;
                if n % align != 0 {
                    break;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(len: usize) -> (tempfile::TempDir, std::path::PathBuf, Vec<u8>) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.bin");
        let bytes: Vec<u8> = (0..len as u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        std::fs::write(&path, &bytes).unwrap();
        // Cold, so reads take the O_DIRECT path (resident ranges are read buffered).
        evict(&path);
        (dir, path, bytes)
    }

    #[test]
    fn direct_reads_give_the_buffered_bytes_at_any_offset() {
        let (_dir, path, bytes) = sample(3 * 4096 * 7 + 123);
        let f = SourceFile::open(&path).unwrap();
        let len = bytes.len();
        for (off, n) in [(0, 1), (0, 4096), (1, 4095), (4095, 2), (4096, 8192), (77, 20_000), (len - 1, 1), (len - 5000, 5000), (0, len), (3, len - 3)] {
            let mut buf = vec![0u8; n];
            f.read_exact_at_direct(&mut buf, off as u64).unwrap();
            assert!(buf == bytes[off..off + n], "offset {off} len {n}");
        }
        // Beyond the end: an error, not a short read.
        let mut buf = vec![0u8; 10];
        assert!(f.read_exact_at_direct(&mut buf, len as u64 - 5).is_err());
    }

    /// Drop the file's pages from the page cache (clean pages: they go).
    fn evict(path: &std::path::Path) {
        use std::os::fd::AsRawFd;
        let f = File::open(path).unwrap();
        f.sync_all().unwrap();
        // SAFETY: a plain advice call on an open descriptor.
        unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    }

    /// Resident ranges are read from the page cache; a cold direct read leaves nothing behind.
    #[test]
    fn resident_ranges_come_from_the_page_cache_and_cold_reads_leave_none() {
        let (_dir, path, bytes) = sample(64 * 4096 + 77);
        let f = SourceFile::open(&path).unwrap();
        if f.direct_fd().is_none() {
            return; // no O_DIRECT here (tmpfs): nothing to check
        }
        assert!(!resident(f.file().unwrap(), 0, bytes.len() as u64));
        let mut buf = vec![0u8; bytes.len() - 10];
        f.read_exact_at_direct(&mut buf, 10).unwrap();
        assert!(buf == bytes[10..]);
        assert!(!resident(f.file().unwrap(), 0, 4096), "a cold direct read left pages in the page cache");
        // Warm it: now every range is resident and reads still give the same bytes.
        assert_eq!(std::fs::read(&path).unwrap(), bytes);
        assert!(resident(f.file().unwrap(), 5, 3 * 4096));
        assert!(resident(f.file().unwrap(), 0, bytes.len() as u64));
        f.read_exact_at_direct(&mut buf, 10).unwrap();
        assert!(buf == bytes[10..]);
    }

    #[test]
    fn a_changed_file_is_an_error() {
        let (_dir, path, bytes) = sample(50_000);
        let f = SourceFile::open(&path).unwrap();
        let mut buf = vec![0u8; 1000];
        f.read_exact_at_direct(&mut buf, 100).unwrap();
        std::fs::OpenOptions::new().write(true).open(&path).unwrap().write_all_at(b"changed", 10).unwrap();
        assert!(matches!(f.read_exact_at_direct(&mut buf, 100), Err(SourceError::Changed { .. })));
        std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(bytes.len() as u64 / 2).unwrap();
        assert!(matches!(f.read_exact_at_direct(&mut buf, 40_000), Err(SourceError::Changed { .. })));
    }
}
