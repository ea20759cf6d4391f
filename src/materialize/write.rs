//! Writing bytes of a view to disk: the streaming core (read, write and hash overlap) and
//! the durable whole-file writer built on it.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::sync_channel;

use serde_json::{Value, json};

use super::hash::RangeHasher;
use super::{FileResult, MaterializeError, Options, io};
use crate::fsutil::{fsync_dir, write_atomic};
use crate::store::ReadCtx;
use crate::view::VirtualFile;

/// Bytes between fdatasyncs (and checkpoints) of a file being written.
pub(super) const SYNC_EVERY: u64 = 256 << 20;

/// Temporary and checkpoint names sit next to the final file (same directory, same filesystem).
pub(super) fn partial_paths(out: &Path, name: &str) -> (PathBuf, PathBuf) {
    let p = Path::new(name);
    let dir = out.join(p.parent().unwrap_or(Path::new("")));
    let file = p.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
    (dir.join(format!(".{file}.partial")), dir.join(format!(".{file}.partial.json")))
}

/// Ask the kernel to start writing back `len` bytes at `off` now, without waiting, so dirty
/// pages do not pile up until the next fdatasync (which then has little left to do).
fn start_writeback(f: &File, off: u64, len: u64) {
    // SAFETY: a plain system call on a descriptor `f` keeps open; it reads no memory.
    unsafe {
        libc::sync_file_range(f.as_raw_fd(), off as i64, len as i64, libc::SYNC_FILE_RANGE_WRITE);
    }
}

/// Alignment of direct writes (offsets, lengths and buffer addresses).
const DIRECT_ALIGN: usize = 4096;

/// A write buffer whose bytes start at a [`DIRECT_ALIGN`]-aligned address, so it can be
/// written with `O_DIRECT`.
struct Buf {
    v: Vec<u8>,
    start: usize,
    len: usize,
}

impl Buf {
    fn new(capacity: usize) -> Buf {
        let v = crate::util::populated_zeroed(capacity + DIRECT_ALIGN);
        let start = v.as_ptr().align_offset(DIRECT_ALIGN).min(DIRECT_ALIGN);
        Buf { v, start, len: 0 }
    }

    /// Make the buffer `len` bytes long (at most its capacity).
    fn set_len(&mut self, len: usize) {
        self.len = len.min(self.v.len() - self.start);
    }

    fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.v[self.start..self.start + self.len]
    }
}

impl std::ops::Deref for Buf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.v[self.start..self.start + self.len]
    }
}

/// A second descriptor of the file being written, opened with `O_DIRECT`, for the aligned
/// part of each write: the bytes go from the pool's buffers to the device without a copy
/// into the page cache (which, for outputs of hundreds of GB, would also evict everything
/// else). `None` where the filesystem refuses `O_DIRECT` (tmpfs, some FUSE filesystems):
/// every write is buffered then.
fn open_direct(path: &Path) -> Option<File> {
    use std::os::unix::fs::OpenOptionsExt;
    if std::env::var_os("XPACKFS_MATERIALIZE_BUFFERED").is_some() {
        return None;
    }
    std::fs::OpenOptions::new().write(true).custom_flags(libc::O_DIRECT).open(path).ok()
}

/// Write `b` at `off`: the [`DIRECT_ALIGN`]-aligned part through `direct` when there is one
/// (dropped after a refusal, so later writes go buffered), the rest buffered (asking the
/// kernel to start its writeback now).
fn write_at(out: &File, direct: &mut Option<File>, b: &[u8], off: u64, out_path: &Path) -> Result<(), MaterializeError> {
    let mut done = 0usize;
    if let Some(d) = direct.as_ref()
        && off.is_multiple_of(DIRECT_ALIGN as u64)
        && (b.as_ptr() as usize).is_multiple_of(DIRECT_ALIGN)
    {
        let n = b.len() / DIRECT_ALIGN * DIRECT_ALIGN;
        match d.write_all_at(&b[..n], off) {
            Ok(()) => done = n,
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => *direct = None,
            Err(e) => return Err(io(out_path)(e)),
        }
    }
    if done < b.len() {
        out.write_all_at(&b[done..], off + done as u64).map_err(io(out_path))?;
        start_writeback(out, off + done as u64, (b.len() - done) as u64);
    }
    Ok(())
}

/// Read `[start, end)` of `file` through the view and write it at the same offsets of `out`.
/// Four stages overlap: this thread reads, one thread writes (direct where aligned, see
/// [`open_direct`]; else asking the kernel to start writeback of each chunk at once), one
/// makes the writes durable every [`SYNC_EVERY`] bytes (fdatasync, then `durable(bytes known
/// written before it)`) without stalling the writer, and one hashes, in order. Buffers
/// circulate through a small pool, their pages mapped once when made
/// ([`crate::util::populate_for_write`]). `hasher` must be positioned at `start`.
#[allow(clippy::too_many_arguments)]
pub(super) fn stream(
    name: &str,
    file: &VirtualFile,
    out: &File,
    out_path: &Path,
    (start, end): (u64, u64),
    chunk: usize,
    mut hasher: RangeHasher,
    done: &AtomicU64,
    durable: &(dyn Fn(u64) -> Result<(), MaterializeError> + Sync),
) -> Result<RangeHasher, MaterializeError> {
    debug_assert_eq!(hasher.position(), start);
    let chunk = chunk.max(4096);
    // Test hook: a synchronous sync and checkpoint after every chunk (dense kill points).
    let sync_each = std::env::var_os("XPACKFS_TEST_SYNC_EVERY_CHUNK").is_some();
    let (wtx, wrx) = sync_channel::<(u64, Arc<Buf>)>(4);
    let (htx, hrx) = sync_channel::<Arc<Buf>>(4);
    let (stx, srx) = sync_channel::<u64>(1);
    let (pool_tx, pool_rx) = std::sync::mpsc::channel::<Buf>();
    let mut direct = open_direct(out_path);
    let recycle = move |pool: &std::sync::mpsc::Sender<Buf>, b: Arc<Buf>| {
        if let Ok(v) = Arc::try_unwrap(b) {
            let _ = pool.send(v);
        }
    };
    std::thread::scope(|s| {
        let hashing = {
            let pool = pool_tx.clone();
            s.spawn(move || {
                for b in hrx {
                    hasher.update(&b[..]);
                    recycle(&pool, b);
                }
                hasher
            })
        };
        let syncing = s.spawn(move || -> Result<(), MaterializeError> {
            for upto in srx {
                out.sync_data().map_err(io(out_path))?;
                durable(upto)?;
            }
            Ok(())
        });
        let writing = {
            let pool = pool_tx.clone();
            s.spawn(move || -> Result<(), MaterializeError> {
                let mut since_sync = 0u64;
                for (off, b) in wrx {
                    write_at(out, &mut direct, &b, off, out_path)?;
                    let upto = off + b.len() as u64;
                    since_sync += b.len() as u64;
                    recycle(&pool, b);
                    if sync_each {
                        out.sync_data().map_err(io(out_path))?;
                        durable(upto)?;
                    } else if since_sync >= SYNC_EVERY {
                        // Skipped while the previous sync is still running; the next one covers it.
                        match stx.try_send(upto) {
                            Ok(()) => since_sync = 0,
                            Err(std::sync::mpsc::TrySendError::Full(_)) => {}
                            Err(std::sync::mpsc::TrySendError::Disconnected(_)) => break, // the syncer failed
                        }
                    }
                }
                Ok(())
            })
        };
        drop(pool_tx);
        let mut off = start;
        let mut read_err = None;
        while off < end {
            let want = ((end - off) as usize).min(chunk);
            let mut buf = pool_rx.try_recv().unwrap_or_else(|_| Buf::new(chunk));
            buf.set_len(want);
            match file.read_at(off, buf.as_mut_slice(), ReadCtx::CLIENT) {
                Ok(0) => {
                    read_err = Some(MaterializeError::Refused(format!("{name}: view ended at {off} of {end} bytes")));
                    break;
                }
                Ok(n) => {
                    buf.set_len(n);
                    let b = Arc::new(buf);
                    if wtx.send((off, b.clone())).is_err() || htx.send(b).is_err() {
                        break; // the writer failed: its error is reported below
                    }
                    off += n as u64;
                    done.fetch_add(n as u64, Ordering::Relaxed);
                }
                Err(e) => {
                    read_err = Some(MaterializeError::View { name: name.into(), source: e });
                    break;
                }
            }
        }
        drop(wtx);
        drop(htx);
        let panicked = |what: &str| MaterializeError::Refused(format!("{name}: {what} thread panicked"));
        let written = writing.join().map_err(|_| panicked("writer"))?;
        let synced = syncing.join().map_err(|_| panicked("sync"))?;
        let hasher = hashing.join().map_err(|_| panicked("hasher"))?;
        written?;
        synced?;
        match read_err {
            Some(e) => Err(e),
            None => Ok(hasher),
        }
    })
}

/// Feed `len` bytes of `f` at `start` into `hasher` (re-hashing what is already on disk).
pub(super) fn hash_file_range(f: &File, path: &Path, start: u64, len: u64, hasher: &mut RangeHasher) -> Result<(), MaterializeError> {
    let mut buf = vec![0u8; 8 << 20];
    let mut off = start;
    while off < start + len {
        let n = (start + len - off).min(buf.len() as u64) as usize;
        f.read_exact_at(&mut buf[..n], off).map_err(io(path))?;
        hasher.update(&buf[..n]);
        off += n as u64;
    }
    Ok(())
}

/// Record in the view what was hashed while streaming a whole file: the derived files
/// (manifests) then take these digests instead of reading the file again.
pub(super) fn record(file: &VirtualFile, whole: &str, ranges: &[(u64, u64, String)]) {
    file.record_digest(0, file.size(), whole.to_string());
    for (o, l, h) in ranges {
        file.record_digest(*o, *l, h.clone());
    }
}

/// Write one whole file durably: `.<name>.partial` with a checkpoint of the bytes made
/// durable, then fsync, and with `commit` rename into place and fsync the directory (else
/// the complete partial waits for [`commit`]). With `opts.resume` a partial file continues
/// from its checkpoint, and a completed file is re-hashed, not rewritten.
pub(super) fn write_one(
    out: &Path,
    name: &str,
    file: &VirtualFile,
    opts: &Options,
    done: &AtomicU64,
    commit_now: bool,
) -> Result<FileResult, MaterializeError> {
    let final_path = out.join(name);
    let (partial, ckpt) = partial_paths(out, name);
    let parent = final_path.parent().unwrap_or(out).to_path_buf();
    std::fs::create_dir_all(&parent).map_err(io(&parent))?;
    let size = file.size();
    let wanted = file.digest_ranges();
    if final_path.exists() && opts.resume && !opts.replace {
        let f = File::open(&final_path).map_err(io(&final_path))?;
        let len = f.metadata().map_err(io(&final_path))?.len();
        // A completed manifest is kept as the run that completed it wrote it (it records that
        // run's command and times); `--verify` checks its digests against the data files.
        if len != size && !file.is_derived() {
            return Err(MaterializeError::Refused(format!("{}: completed file has {len} bytes, the view {size}", final_path.display())));
        }
        let mut hasher = RangeHasher::new(0, len, &wanted);
        hash_file_range(&f, &final_path, 0, len, &mut hasher)?;
        done.fetch_add(len, Ordering::Relaxed);
        let (sha, ranges) = hasher.finish();
        if !file.is_derived() {
            record(file, &sha, &ranges);
        }
        return Ok(FileResult { name: name.into(), size: len, sha256: sha, resumed_from: len, skipped: true, ranges });
    }
    let mut hasher = RangeHasher::new(0, size, &wanted);
    let mut start = 0u64;
    let f = if opts.resume && partial.exists() {
        let written: u64 =
            std::fs::read(&ckpt).ok().and_then(|b| serde_json::from_slice::<Value>(&b).ok()).and_then(|v| v["durable_bytes"].as_u64()).unwrap_or(0).min(size);
        let f = std::fs::OpenOptions::new().read(true).write(true).open(&partial).map_err(io(&partial))?;
        // Re-hash the durable prefix once; whatever follows it is rewritten.
        hash_file_range(&f, &partial, 0, written, &mut hasher)?;
        f.set_len(written).map_err(io(&partial))?;
        start = written;
        f
    } else {
        std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&partial).map_err(io(&partial))?
    };
    done.fetch_add(start, Ordering::Relaxed);
    let checkpoint = |durable: u64| write_atomic(&ckpt, json!({"durable_bytes": durable, "size": size}).to_string().as_bytes()).map_err(io(&ckpt));
    let hasher = stream(name, file, &f, &partial, (start, size), opts.chunk, hasher, done, &checkpoint)?;
    f.sync_all().map_err(io(&partial))?;
    drop(f);
    checkpoint(size)?;
    if commit_now {
        commit(out, name, opts)?;
    }
    let (sha, ranges) = hasher.finish();
    record(file, &sha, &ranges);
    Ok(FileResult { name: name.into(), size, sha256: sha, resumed_from: start, skipped: false, ranges })
}

/// Put a complete partial file in its final place: rename, drop its checkpoint, fsync the
/// directory. A file that is already final (resumed) is left as it is.
pub(super) fn commit(out: &Path, name: &str, opts: &Options) -> Result<(), MaterializeError> {
    let final_path = out.join(name);
    let (partial, ckpt) = partial_paths(out, name);
    if !partial.exists() && final_path.exists() {
        return Ok(());
    }
    if final_path.exists() && !opts.replace {
        return Err(MaterializeError::Refused(format!("{} already exists (use --replace)", final_path.display())));
    }
    std::fs::rename(&partial, &final_path).map_err(io(&final_path))?;
    let _ = std::fs::remove_file(&ckpt);
    let parent = final_path.parent().unwrap_or(out);
    fsync_dir(parent).map_err(io(parent))
}

/// Undo [`commit`] for a file that failed verification: back to a complete partial file,
/// so nothing unverified is left in a final place (a `--resume` re-hashes it).
pub(super) fn uncommit(out: &Path, name: &str) -> Result<(), MaterializeError> {
    let final_path = out.join(name);
    let (partial, ckpt) = partial_paths(out, name);
    let size = std::fs::metadata(&final_path).map_err(io(&final_path))?.len();
    write_atomic(&ckpt, json!({"durable_bytes": size, "size": size}).to_string().as_bytes()).map_err(io(&ckpt))?;
    std::fs::rename(&final_path, &partial).map_err(io(&partial))?;
    let parent = final_path.parent().unwrap_or(out);
    fsync_dir(parent).map_err(io(parent))
}

/// sha256 of a file on disk.
pub(super) fn hash_disk(path: &Path) -> Result<String, MaterializeError> {
    let f = File::open(path).map_err(io(path))?;
    let len = f.metadata().map_err(io(path))?.len();
    let mut h = RangeHasher::new(0, len, &[]);
    hash_file_range(&f, path, 0, len, &mut h)?;
    Ok(h.finish().0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_aligned_and_writes_land_whole_direct_or_not() {
        for cap in [1usize, 4096, 8 << 20] {
            let mut b = Buf::new(cap);
            b.set_len(cap);
            assert!((b.as_ptr() as usize).is_multiple_of(DIRECT_ALIGN));
            assert_eq!(b.len(), cap);
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out");
        let data: Vec<u8> = (0..3 * DIRECT_ALIGN + 123).map(|i| (i * 13 % 251) as u8).collect();
        for use_direct in [true, false] {
            let out = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&path).unwrap();
            let mut direct = if use_direct { open_direct(&path) } else { None };
            // An aligned write with a tail, then an unaligned one, then one past a hole.
            let mut b = Buf::new(data.len());
            b.set_len(2 * DIRECT_ALIGN + 100);
            b.as_mut_slice().copy_from_slice(&data[..2 * DIRECT_ALIGN + 100]);
            write_at(&out, &mut direct, &b, 0, &path).unwrap();
            write_at(&out, &mut direct, &data[2 * DIRECT_ALIGN + 100..3 * DIRECT_ALIGN], (2 * DIRECT_ALIGN + 100) as u64, &path).unwrap();
            let mut t = Buf::new(DIRECT_ALIGN);
            t.set_len(123);
            t.as_mut_slice().copy_from_slice(&data[3 * DIRECT_ALIGN..]);
            write_at(&out, &mut direct, &t, (3 * DIRECT_ALIGN) as u64, &path).unwrap();
            out.sync_all().unwrap();
            assert_eq!(std::fs::read(&path).unwrap(), data, "direct {use_direct}");
        }
    }
}
