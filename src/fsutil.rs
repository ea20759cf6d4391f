//! Durable file writes: temporary name, fsync, rename, fsync of the directory.

use std::io::Write;
use std::path::Path;

pub fn fsync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

/// Replace `path` with `bytes` atomically and durably.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let name = path.file_name().ok_or_else(|| std::io::Error::other("path has no file name"))?;
    // Unique per process and call: threads of one process may replace the same file at once.
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = path.with_file_name(format!(".{}.tmp.{}{seq:04}", name.to_string_lossy(), std::process::id()));
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        fsync_dir(path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new(".")))
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// The bytes of `path`, which must be a regular file (after following symlinks) of at most
/// `max` bytes. A FIFO, device or directory is refused before it is opened for reading (an
/// open of a FIFO would block until a writer comes), and the descriptor is opened
/// non-blocking and checked again, so one swapped in between cannot block either.
pub fn read_limited(path: &Path, max: u64) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let not_regular = || std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a regular file");
    if !std::fs::metadata(path)?.is_file() {
        return Err(not_regular());
    }
    let f = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(path)?;
    let meta = f.metadata()?;
    if !meta.is_file() {
        return Err(not_regular());
    }
    if meta.len() > max {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, format!("{} bytes, more than the {max} allowed", meta.len())));
    }
    let mut out = Vec::with_capacity(meta.len() as usize);
    f.take(max + 1).read_to_end(&mut out)?;
    if out.len() as u64 > max {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, format!("more than the {max} bytes allowed")));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_limited_refuses_what_is_not_a_small_regular_file() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("f");
        std::fs::write(&f, b"hello").unwrap();
        assert_eq!(read_limited(&f, 5).unwrap(), b"hello");
        assert!(read_limited(&f, 4).unwrap_err().to_string().contains("more than the 4"));
        assert!(read_limited(dir.path(), 100).unwrap_err().to_string().contains("not a regular file"));
        let fifo = dir.path().join("fifo");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        assert!(read_limited(&fifo, 100).unwrap_err().to_string().contains("not a regular file"), "a FIFO must not block");
        assert!(read_limited(Path::new("/dev/zero"), 100).is_err());
    }
}
