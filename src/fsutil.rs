//! Files at the edge: durable writes (temporary name, fsync, rename, fsync of the
//! directory), and the one way a file that comes from outside is opened for reading: it
//! must be a regular file after resolving symlinks ([`open_regular`], [`read_limited`]), so
//! that a FIFO, a device or a directory is refused before an `open()` could block on it.

use std::fs::{File, FileType, Metadata};
use std::io::Write;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

/// What a file type is, for messages: "a FIFO", "a directory", ...
pub fn kind_of(t: FileType) -> &'static str {
    if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_symlink() {
        "a symlink"
    } else {
        "a special file"
    }
}

/// Why a file that must be regular could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum RegularError {
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error("is {0}, not a regular file")]
    NotRegular(&'static str),
}

impl From<RegularError> for std::io::Error {
    fn from(e: RegularError) -> Self {
        match e {
            RegularError::Io(e) => e,
            e @ RegularError::NotRegular(_) => std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string()),
        }
    }
}

/// Check that `path` is a regular file after resolving symlinks, without opening it.
pub fn check_regular(path: &Path) -> Result<Metadata, RegularError> {
    let meta = std::fs::metadata(path)?;
    if !meta.is_file() {
        return Err(RegularError::NotRegular(kind_of(meta.file_type())));
    }
    Ok(meta)
}

/// Open a file that must be regular (after resolving symlinks) for reading: refused
/// before the open if it is not, opened non-blocking (a FIFO put in its place meanwhile
/// cannot block the open), and checked again on the descriptor.
pub fn open_regular(path: &Path) -> Result<(File, Metadata), RegularError> {
    check_regular(path)?;
    let file = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(RegularError::NotRegular(kind_of(meta.file_type())));
    }
    // Regular files ignore O_NONBLOCK; clear it anyway, so the descriptor is an ordinary one
    // (it may be handed to the kernel as a FUSE passthrough backing file).
    // SAFETY: fcntl on a descriptor this function owns; no memory is passed.
    let cleared = unsafe {
        let fd = std::os::fd::AsRawFd::as_raw_fd(&file);
        let flags = libc::fcntl(fd, libc::F_GETFL);
        flags >= 0 && libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK) == 0
    };
    if !cleared {
        return Err(std::io::Error::last_os_error().into());
    }
    Ok((file, meta))
}

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

/// Why [`read_bounded`] gave no bytes.
#[derive(Debug, thiserror::Error)]
pub enum LimitedError {
    #[error(transparent)]
    Regular(#[from] RegularError),
    /// Larger than the cap (`len`: its size, or the bytes read when it grew while read).
    #[error("{len} bytes, more than the {cap} allowed")]
    TooLarge { len: u64, cap: u64 },
}

impl From<LimitedError> for std::io::Error {
    fn from(e: LimitedError) -> Self {
        match e {
            LimitedError::Regular(e) => e.into(),
            e @ LimitedError::TooLarge { .. } => std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string()),
        }
    }
}

/// The bytes of `path`, which must be a regular file (after following symlinks, opened by
/// [`open_regular`]) of at most `max` bytes, checked before reading and while reading.
pub fn read_bounded(path: &Path, max: u64) -> Result<Vec<u8>, LimitedError> {
    use std::io::Read;
    let (f, meta) = open_regular(path)?;
    if meta.len() > max {
        return Err(LimitedError::TooLarge { len: meta.len(), cap: max });
    }
    let mut out = Vec::with_capacity(meta.len() as usize);
    f.take(max + 1).read_to_end(&mut out).map_err(RegularError::Io)?;
    if out.len() as u64 > max {
        return Err(LimitedError::TooLarge { len: out.len() as u64, cap: max });
    }
    Ok(out)
}

/// [`read_bounded`], its refusal as an I/O error.
pub fn read_limited(path: &Path, max: u64) -> std::io::Result<Vec<u8>> {
    Ok(read_bounded(path, max)?)
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
