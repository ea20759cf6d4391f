//! File entries: whole files of a view kept in the disk cache, byte for byte as the view
//! serves them, so a mount can hand a file to the kernel (FUSE passthrough) and the kernel
//! serves its reads and mmaps from this file at local-disk speed, without the daemon.
//!
//! A file entry is two files in `files/<2 hex>/`: `<64 hex>` (the data, exactly the view
//! file's bytes: the kernel reads it from offset 0) and `<64 hex>.seal`. The seal holds the
//! key, the size, an XXH3-64 checksum of every 1 MiB block (of key, block index and bytes),
//! the data file's inode number, ctime and mtime as they were right after it was written and
//! checked, and an XXH3-128 checksum of the seal itself.
//!
//! Why this is a sound check without reading the data at each open: a data file that is
//! truncated, replaced, written to or has its times set since it was sealed has another
//! inode, size or ctime (the kernel sets ctime on every change; userspace cannot set it, and
//! since Linux 6.13 a change after the ctime was read always gets a later one). Then
//! [`DiskCache::file_entry`] reads the whole file and checks every block before anything is
//! served: good, it is sealed again; wrong, it is logged, deleted and counted as corrupt.
//! What it does not see (said in the README): a change below the filesystem (media
//! corruption, writes to the block device) of a file whose seal still matches. Reads of
//! chunk entries through the daemon verify every read instead.
//!
//! Written under `tmp/` and renamed, data first, then its seal: a process killed between
//! the two leaves data without a seal, which is never served (a miss) and is evicted like
//! any entry. Counted in the same budget and evicted by the same LRU pass as chunk entries
//! (the seal's mtime is the entry's use time; the data's times are never touched).

use std::fs::{self, File};
use std::hash::Hasher;
use std::io::{self, ErrorKind};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use twox_hash::{XxHash3_64, XxHash3_128};

use super::{DiskCache, DiskKey, Mode};

const SEAL_MAGIC: [u8; 8] = *b"XPKFSFE1";
/// Bytes checked by one block checksum.
pub const BLOCK: u64 = 1 << 20;
const SEAL_HEAD: usize = 96;
/// Largest file kept as a file entry (its seal is then 8 MiB).
pub const MAX_FILE_BYTES: u64 = 1 << 40;

/// What [`DiskCache::file_entry`] found.
#[derive(Debug)]
pub enum FileLookup {
    /// The data file, open for reading, holding the bytes it was written with.
    Sound(File),
    /// None under the key (or only part of one: a writer, or an eviction, in progress).
    Absent,
    /// One was there and was wrong: it is logged, deleted and counted in `corrupt`.
    Corrupt,
}

/// Fills `buf` whole with the file's bytes at `offset` (the writer of a file entry), or says
/// why not (its error is only shown: the cache knows nothing of what fills it).
pub type Fill<'a, E> = dyn FnMut(u64, &mut [u8]) -> Result<(), E> + 'a;

/// Why [`DiskCache::file_entry`] serves no file entry it found a seal of: a miss
/// ([`Unserved::OtherSize`], [`Unserved::Gone`]), or one found wrong (every other variant).
#[derive(Debug, thiserror::Error)]
enum Unserved {
    /// A sound seal of a file of another size: keys cover the size, so it is not this file's.
    #[error("a sound seal of a file of another size")]
    OtherSize,
    /// Its data file is gone: evicted meanwhile, or its writer is between its two renames.
    #[error("its data is gone")]
    Gone,
    /// The seal, or the data file once open, could not be read or stat'ed.
    #[error("{0}")]
    Io(#[from] io::Error),
    /// The data file could not be opened (for another reason than its absence).
    #[error("{}: {source}", path.display())]
    OpenData { path: PathBuf, source: io::Error },
    #[error("seal has {0} bytes, more than any seal")]
    SealTooLong(u64),
    #[error("seal has {0} bytes, shorter than its header")]
    SealTooShort(usize),
    #[error("seal checksum mismatch")]
    SealChecksum,
    #[error("seal is of another key or format")]
    SealForeign,
    #[error("data has {len} bytes, its seal says {size}")]
    DataSize { len: u64, size: u64 },
    #[error("block {index}: {source}")]
    ReadBlock { index: usize, source: io::Error },
    #[error("block {index} (bytes {start}..{end}) checksum mismatch")]
    BlockChecksum { index: usize, start: u64, end: u64 },
}

/// Bytes of the seal of a `size`-byte file.
pub fn seal_len(size: u64) -> u64 {
    SEAL_HEAD as u64 + 8 * size.div_ceil(BLOCK) + 16
}

fn block_sum(key: &DiskKey, index: u64, bytes: &[u8]) -> u64 {
    let mut h = XxHash3_64::with_seed(index);
    h.write(&key.0);
    h.write(bytes);
    h.finish()
}

/// What a seal records (see the module documentation).
struct Seal {
    key: DiskKey,
    size: u64,
    stat: Stamp,
    blocks: Vec<u64>,
}

/// The inode number, ctime and mtime of a data file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    ino: u64,
    ctime: (i64, i64),
    mtime: (i64, i64),
}

impl Stamp {
    fn of(m: &fs::Metadata) -> Stamp {
        Stamp { ino: m.ino(), ctime: (m.ctime(), m.ctime_nsec()), mtime: (m.mtime(), m.mtime_nsec()) }
    }
}

impl Seal {
    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(seal_len(self.size) as usize);
        out.extend_from_slice(&SEAL_MAGIC);
        out.extend_from_slice(&self.key.0);
        out.extend_from_slice(&self.size.to_le_bytes());
        out.extend_from_slice(&self.stat.ino.to_le_bytes());
        for v in [self.stat.ctime.0, self.stat.ctime.1, self.stat.mtime.0, self.stat.mtime.1] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&BLOCK.to_le_bytes());
        for b in &self.blocks {
            out.extend_from_slice(&b.to_le_bytes());
        }
        let sum = XxHash3_128::oneshot(&out);
        out.extend_from_slice(&sum.to_le_bytes());
        out
    }

    /// The seal in `bytes` for `key`, or why it is not one.
    fn decode(bytes: &[u8], key: &DiskKey) -> Result<Seal, Unserved> {
        if bytes.len() < SEAL_HEAD + 16 {
            return Err(Unserved::SealTooShort(bytes.len()));
        }
        let (body, sum) = bytes.split_at(bytes.len() - 16);
        if XxHash3_128::oneshot(body).to_le_bytes() != sum {
            return Err(Unserved::SealChecksum);
        }
        let u = |at: usize| u64::from_le_bytes(body[at..at + 8].try_into().expect("8 bytes"));
        let size = u(40);
        if body[..8] != SEAL_MAGIC || body[8..40] != key.0 || u(88) != BLOCK || size > MAX_FILE_BYTES || bytes.len() as u64 != seal_len(size) {
            return Err(Unserved::SealForeign);
        }
        let i = |at: usize| u(at) as i64;
        let stat = Stamp { ino: u(48), ctime: (i(56), i(64)), mtime: (i(72), i(80)) };
        let blocks = body[SEAL_HEAD..].chunks_exact(8).map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes"))).collect();
        Ok(Seal { key: *key, size, stat, blocks })
    }
}

impl DiskCache {
    fn file_paths(&self, key: &DiskKey) -> (PathBuf, PathBuf) {
        let hex = key.hex();
        let dir = self.cfg.dir.join("files").join(&hex[..2]);
        (dir.join(format!("{hex}.seal")), dir.join(hex))
    }

    /// Whether a file entry of `size` bytes is present under `key` (its seal's length is
    /// checked, nothing read: [`DiskCache::file_entry`] checks the rest).
    pub fn has_file(&self, key: &DiskKey, size: u64) -> bool {
        let (seal, data) = self.file_paths(key);
        self.mode() != Mode::Disabled && fs::metadata(seal).is_ok_and(|m| m.len() == seal_len(size)) && fs::metadata(data).is_ok_and(|m| m.len() == size)
    }

    /// The data file of the file entry under `key`, open for reading and known to hold the
    /// `size` bytes it was written with (see the module documentation); or absent, or found
    /// wrong (then logged, deleted and counted in `corrupt`).
    pub fn file_entry(&self, key: &DiskKey, size: u64) -> FileLookup {
        if self.mode() == Mode::Disabled || size > MAX_FILE_BYTES {
            return FileLookup::Absent;
        }
        let (seal_path, data_path) = self.file_paths(key);
        let Some(seal_file) = self.open_or_miss(&seal_path, &self.stats.file_misses) else { return FileLookup::Absent };
        let seal_ino = seal_file.metadata().map(|m| m.ino()).ok();
        let mut data_ino = None;
        let result = (|| -> Result<(File, SystemTime, Option<Seal>), Unserved> {
            let meta = seal_file.metadata()?;
            if meta.len() > seal_len(MAX_FILE_BYTES) {
                return Err(Unserved::SealTooLong(meta.len()));
            }
            let mut bytes = vec![0u8; meta.len() as usize];
            seal_file.read_exact_at(&mut bytes, 0)?;
            let mut seal = Seal::decode(&bytes, key)?;
            if seal.size != size {
                // Keys cover the size: a sound seal of another size is not this file's.
                return Err(Unserved::OtherSize);
            }
            let data = match File::open(&data_path) {
                Ok(d) => d,
                // Evicted meanwhile, or its writer is between its two renames.
                Err(e) if e.kind() == ErrorKind::NotFound => return Err(Unserved::Gone),
                Err(source) => return Err(Unserved::OpenData { path: data_path.clone(), source }),
            };
            let dm = data.metadata()?;
            data_ino = Some(dm.ino());
            if dm.len() != size {
                return Err(Unserved::DataSize { len: dm.len(), size });
            }
            let used = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
            if Stamp::of(&dm) == seal.stat {
                return Ok((data, used, None));
            }
            // Changed (or copied, restored) since it was sealed: every block is read and
            // checked before the file is served, then it is sealed again.
            verify_blocks(&data, &seal)?;
            seal.stat = Stamp::of(&data.metadata()?);
            Ok((data, used, Some(seal)))
        })();
        match result {
            Ok((data, used, resealed)) => {
                self.stats.file_hits.inc();
                match resealed {
                    Some(seal) => {
                        self.stats.file_rechecks.inc();
                        tracing::info!("disk cache file entry {}: changed since it was sealed, every block checked good", data_path.display());
                        if self.mode() == Mode::ReadWrite
                            && let Err(e) = self.write_seal(&seal, &seal_path)
                        {
                            self.warn("seal", || format!("cannot seal {} again: {e}", data_path.display()));
                        }
                    }
                    None => self.touch(&seal_file, used),
                }
                FileLookup::Sound(data)
            }
            Err(Unserved::OtherSize | Unserved::Gone) => {
                self.stats.file_misses.inc();
                FileLookup::Absent
            }
            Err(why) => {
                self.stats.corrupt.inc();
                self.stats.file_misses.inc();
                tracing::warn!("disk cache file entry {} is corrupt ({why}): deleted, the file is served from its chunks", data_path.display());
                if self.mode() == Mode::ReadWrite {
                    self.remove_file_entry(key, seal_ino, data_ino);
                }
                FileLookup::Corrupt
            }
        }
    }

    /// Refresh the use time of the file entry under `key` (one being served for a long time
    /// without new opens: an mmap), as a hit does.
    pub fn touch_file(&self, key: &DiskKey) {
        let (seal, _) = self.file_paths(key);
        if let Ok(f) = File::open(&seal)
            && let Ok(m) = f.metadata()
        {
            self.touch(&f, m.modified().unwrap_or(SystemTime::UNIX_EPOCH));
        }
    }

    /// Delete the file entry under `key` (seal first: data without a seal is never served),
    /// each half only if it is still the inode that was inspected (a writer may have just
    /// renamed a good one in).
    fn remove_file_entry(&self, key: &DiskKey, seal_ino: Option<u64>, data_ino: Option<u64>) {
        let (seal, data) = self.file_paths(key);
        for (p, ino) in [(seal, seal_ino), (data, data_ino)] {
            if let Ok(m) = fs::symlink_metadata(&p)
                && ino.is_none_or(|i| i == m.ino())
                && fs::remove_file(&p).is_ok()
            {
                self.add_usage(-(m.len() as i64));
            }
        }
    }

    /// Write a file entry of `size` bytes under `key`, its bytes from `fill(offset, buf)`
    /// (which fills `buf` whole), block by block. Returns whether the entry is present now.
    /// Failures (of the cache or of `fill`) are warnings, never errors.
    pub fn put_file<E: std::fmt::Display>(&self, key: &DiskKey, size: u64, fill: &mut Fill<'_, E>) -> bool {
        if self.mode() != Mode::ReadWrite || self.paused() || size > MAX_FILE_BYTES || size + seal_len(size) > self.cfg.budget_bytes {
            self.stats.skipped_writes.inc();
            return false;
        }
        if self.has_file(key, size) {
            return true;
        }
        let total = size + seal_len(size);
        let Some(before) = self.add_usage(total as i64) else {
            self.stats.skipped_writes.inc();
            return false;
        };
        match self.write_file_entry(key, size, fill) {
            Ok(()) => {
                self.stats.file_writes.inc();
                self.stats.bytes_written.inc_by(total);
            }
            Err(e) => {
                self.add_usage(-(total as i64));
                match e {
                    Failed::Io(e) => self.write_failed(&e),
                    Failed::Fill(why) => tracing::warn!("disk cache: file entry not written: {why}"),
                }
                return false;
            }
        }
        if before.saturating_add(total) > self.cfg.budget_bytes {
            self.evict(false);
        }
        true
    }

    fn write_file_entry<E>(&self, key: &DiskKey, size: u64, fill: &mut Fill<'_, E>) -> Result<(), Failed<E>> {
        let (seal_path, data_path) = self.file_paths(key);
        if let Some(dir) = data_path.parent() {
            super::create_private_dir(dir)?;
        }
        let mut blocks = Vec::with_capacity(size.div_ceil(BLOCK) as usize);
        let f = self.write_renamed::<Failed<E>>(&format!("{}.file", key.hex()), &data_path, |f| {
            // Its whole length from the start: an eviction pass that recounts the directory
            // meanwhile counts what this write has reserved (temporary files count).
            f.set_len(size)?;
            let mut buf = vec![0u8; BLOCK as usize];
            let mut at = 0u64;
            while at < size {
                let n = (size - at).min(BLOCK) as usize;
                fill(at, &mut buf[..n]).map_err(Failed::Fill)?;
                blocks.push(block_sum(key, at / BLOCK, &buf[..n]));
                f.write_all_at(&buf[..n], at)?;
                at += n as u64;
            }
            // Always durable before it is renamed in and sealed: a seal whose stamp matches is
            // trusted without reading, so a power loss must not leave it over unwritten blocks.
            f.sync_data()?;
            Ok(())
        })?;
        // The stamp after the rename (which sets ctime): what later opens compare with.
        let stat = Stamp::of(&f.metadata()?);
        self.write_seal(&Seal { key: *key, size, stat, blocks }, &seal_path)?;
        Ok(())
    }

    fn write_seal(&self, seal: &Seal, path: &Path) -> io::Result<()> {
        self.write_renamed(&format!("{}.seal", seal.key.hex()), path, |f| {
            f.write_all_at(&seal.encode(), 0)?;
            if self.cfg.fsync {
                f.sync_data()?;
            }
            Ok(())
        })
        .map(drop)
    }
}

/// Why a file entry was not written: the cache's own I/O, or `fill`'s error.
enum Failed<E> {
    Io(io::Error),
    Fill(E),
}

impl<E> From<io::Error> for Failed<E> {
    fn from(e: io::Error) -> Self {
        Failed::Io(e)
    }
}

/// Read every block of `data` and check it against `seal`.
fn verify_blocks(data: &File, seal: &Seal) -> Result<(), Unserved> {
    // SAFETY: a plain system call on the open descriptor `data`; it reads no memory.
    unsafe { libc::posix_fadvise(std::os::fd::AsRawFd::as_raw_fd(data), 0, 0, libc::POSIX_FADV_SEQUENTIAL) };
    let mut buf = vec![0u8; BLOCK as usize];
    for (i, want) in seal.blocks.iter().enumerate() {
        let at = i as u64 * BLOCK;
        let n = (seal.size - at).min(BLOCK) as usize;
        data.read_exact_at(&mut buf[..n], at).map_err(|source| Unserved::ReadBlock { index: i, source })?;
        if block_sum(&seal.key, i as u64, &buf[..n]) != *want {
            return Err(Unserved::BlockChecksum { index: i, start: at, end: at + n as u64 });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::{DiskCacheConfig, KeyBuilder};
    use super::*;
    use std::io::Read;
    use std::path::Path;

    fn key(i: u64) -> DiskKey {
        KeyBuilder::new("files-test").u64("file", i).finish()
    }

    fn bytes(i: u64, size: u64) -> Vec<u8> {
        (0..size).map(|j| (j.wrapping_mul(0x9E37_79B9).wrapping_add(i) >> 7) as u8).collect()
    }

    fn cache(dir: &Path, budget: u64) -> DiskCache {
        let mut c = DiskCacheConfig::new(dir, budget);
        c.touch_interval = std::time::Duration::ZERO;
        DiskCache::open(c)
    }

    fn put(c: &DiskCache, i: u64, size: u64) -> bool {
        let b = bytes(i, size);
        c.put_file(&key(i), size, &mut |at, buf| {
            buf.copy_from_slice(&b[at as usize..at as usize + buf.len()]);
            Ok::<_, io::Error>(())
        })
    }

    fn content(f: FileLookup) -> Option<Vec<u8>> {
        let FileLookup::Sound(mut f) = f else { return None };
        let mut v = Vec::new();
        f.read_to_end(&mut v).unwrap();
        Some(v)
    }

    /// Files under `files/` (data and seals).
    fn stored(dir: &Path) -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> =
            fs::read_dir(dir.join("files")).into_iter().flatten().flatten().flat_map(|s| fs::read_dir(s.path()).unwrap().flatten().map(|e| e.path())).collect();
        v.sort();
        v
    }

    #[test]
    fn round_trip_of_files_of_every_shape() {
        let dir = tempfile::tempdir().unwrap();
        let c = cache(dir.path(), 1 << 30);
        for (i, size) in [(1, BLOCK), (2, 3 * BLOCK + 17), (3, 5), (4, 0)] {
            assert!(!c.has_file(&key(i), size));
            assert!(matches!(c.file_entry(&key(i), size), FileLookup::Absent));
            assert!(put(&c, i, size), "{size}");
            assert!(c.has_file(&key(i), size));
            assert_eq!(content(c.file_entry(&key(i), size)).unwrap(), bytes(i, size), "{size}");
            // Another size is another file.
            assert!(matches!(c.file_entry(&key(i), size + 1), FileLookup::Absent));
        }
        let s = c.snapshot();
        assert_eq!((s.file_writes, s.file_rechecks, s.corrupt), (4, 0, 0));
        assert_eq!(s.file_hits, 4);
        let total: u64 = [BLOCK, 3 * BLOCK + 17, 5, 0].iter().map(|&n| n + seal_len(n)).sum();
        assert_eq!(s.size_bytes, total, "the budget counts data and seals");
        assert_eq!(fs::read_dir(dir.path().join("tmp")).unwrap().count(), 0);
    }

    #[test]
    fn a_changed_file_entry_is_checked_whole_before_it_is_served() {
        let dir = tempfile::tempdir().unwrap();
        let c = cache(dir.path(), 1 << 30);
        let size = 2 * BLOCK + 100;
        let (seal, data) = c.file_paths(&key(1));
        let log = |c: &DiskCache| (c.snapshot().corrupt, c.snapshot().file_rechecks);

        // The same bytes written again (new ctime): checked good, sealed again, served.
        assert!(put(&c, 1, size));
        fs::write(&data, bytes(1, size)).unwrap();
        assert_eq!(content(c.file_entry(&key(1), size)).unwrap(), bytes(1, size));
        assert_eq!(log(&c), (0, 1));
        assert!(matches!(c.file_entry(&key(1), size), FileLookup::Sound(_)));
        assert_eq!(log(&c), (0, 1), "sealed again: the next open checks nothing");
        // Times set back to the sealed ones by hand do not hide a change: ctime moves.
        let m = fs::metadata(&data).unwrap();
        let mut raw = fs::read(&data).unwrap();
        raw[BLOCK as usize + 5] ^= 1;
        fs::write(&data, &raw).unwrap();
        let f = File::options().write(true).open(&data).unwrap();
        f.set_times(fs::FileTimes::new().set_modified(m.modified().unwrap())).unwrap();
        drop(f);
        assert!(matches!(c.file_entry(&key(1), size), FileLookup::Corrupt), "a flipped byte was served");
        assert_eq!(log(&c), (1, 1));
        assert!(!seal.exists() && !data.exists(), "the corrupt entry is deleted");

        // Truncated; seal of another size; seal damaged; data missing; seal missing.
        type Damage = fn(&Path, &Path);
        let damages: [(&str, Damage); 5] = [
            ("truncated", |_, d| File::options().write(true).open(d).unwrap().set_len(BLOCK).unwrap()),
            ("extended", |_, d| File::options().append(true).open(d).unwrap().write_all_at(b"x", 0).unwrap()),
            ("seal flipped", |s, _| {
                let mut b = fs::read(s).unwrap();
                b[SEAL_HEAD + 3] ^= 0x10;
                fs::write(s, b).unwrap();
            }),
            ("data deleted", |_, d| fs::remove_file(d).unwrap()),
            ("seal deleted", |s, _| fs::remove_file(s).unwrap()),
        ];
        for (n, (what, damage)) in damages.into_iter().enumerate() {
            assert!(put(&c, 1, size));
            damage(&seal, &data);
            let before = c.snapshot().corrupt;
            let found = c.file_entry(&key(1), size);
            assert!(!matches!(found, FileLookup::Sound(_)), "{what}: served");
            let counted = c.snapshot().corrupt - before;
            if what == "seal deleted" || what == "data deleted" {
                // One half without the other is a miss (a writer killed between its two
                // renames, an eviction meanwhile), left to eviction.
                assert!(matches!(found, FileLookup::Absent) && counted == 0, "{what}");
                let _ = fs::remove_file(&data);
                let _ = fs::remove_file(&seal);
            } else {
                assert_eq!(counted, 1, "{what} (case {n})");
                assert!(!seal.exists() && !data.exists(), "{what}: not deleted");
            }
        }
        // Damage from outside changes sizes under the counter; the next recount repairs it.
        c.evict(true);
        assert_eq!(c.snapshot().size_bytes, 0);
    }

    /// Every truncation of a seal, every single-byte change of it, and seals of noise:
    /// none panics, none is served (the data is sound, so only the seal can refuse it).
    #[test]
    fn hostile_seals_are_refused_without_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        let c = cache(dir.path(), 1 << 30);
        let size = 2 * BLOCK + 3;
        assert!(put(&c, 1, size));
        let (seal, data) = c.file_paths(&key(1));
        let good = fs::read(&seal).unwrap();
        let body = fs::read(&data).unwrap();
        let mut cases: Vec<Vec<u8>> = (0..good.len()).map(|n| good[..n].to_vec()).collect();
        for at in 0..good.len() {
            let mut b = good.clone();
            b[at] ^= 0x5a;
            cases.push(b);
        }
        let mut x = 0x243F_6A88_85A3_08D3u64;
        for len in [0, 1, 111, 112, 120, good.len(), 1 << 16] {
            cases.push(
                (0..len)
                    .map(|_| {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        x as u8
                    })
                    .collect(),
            );
        }
        // Sound checksums over wrong fields: a huge size, another block size, a short file.
        for (at, v) in [(40, u64::MAX), (40, MAX_FILE_BYTES), (88, 4096), (40, 1)] {
            let mut b = good.clone();
            b[at..at + 8].copy_from_slice(&v.to_le_bytes());
            let n = b.len() - 16;
            let sum = XxHash3_128::oneshot(&b[..n]).to_le_bytes();
            b[n..].copy_from_slice(&sum);
            cases.push(b);
        }
        for (n, case) in cases.iter().enumerate() {
            fs::write(&seal, case).unwrap();
            if !data.exists() {
                fs::write(&data, &body).unwrap();
            }
            assert!(!matches!(c.file_entry(&key(1), size), FileLookup::Sound(_)), "hostile seal {n} accepted");
        }
        // The good seal still works after all that (its data rewritten: checked, resealed).
        fs::write(&seal, &good).unwrap();
        fs::write(&data, &body).unwrap();
        assert_eq!(content(c.file_entry(&key(1), size)).unwrap(), body);
    }

    #[test]
    fn file_entries_share_the_budget_and_the_lru() {
        let dir = tempfile::tempdir().unwrap();
        let budget = 10 * BLOCK;
        let mut c = cache(dir.path(), budget);
        for i in 0..12 {
            assert!(put(&c, i, 2 * BLOCK));
            let chunks: u64 = fs::read_dir(dir.path().join("entries"))
                .unwrap()
                .flatten()
                .flat_map(|s| fs::read_dir(s.path()).unwrap().flatten())
                .map(|e| e.metadata().unwrap().len())
                .sum();
            let total: u64 = chunks + stored(dir.path()).iter().map(|p| fs::metadata(p).unwrap().len()).sum::<u64>();
            assert!(total <= budget, "{total} bytes stored, bound {budget}");
            assert_eq!(c.size_bytes(), total);
            // Also chunk entries compete for the same bound.
            assert!(c.put(&key(100 + i), &bytes(i, 1000)));
        }
        assert!(c.snapshot().evictions > 0);
        // The newest file entry is there; evicted ones leave neither half behind.
        assert!(matches!(c.file_entry(&key(11), 2 * BLOCK), FileLookup::Sound(_)));
        for p in stored(dir.path()) {
            let seal = if p.extension().is_some_and(|e| e == "seal") { p.clone() } else { p.with_extension("seal") };
            assert!(seal.exists() && seal.with_extension("").exists(), "{} left half", p.display());
        }
        // A data file whose seal never came (writer killed) is evicted like any entry.
        let orphan = c.file_paths(&key(99)).1;
        fs::create_dir_all(orphan.parent().unwrap()).unwrap();
        fs::write(&orphan, vec![0u8; BLOCK as usize]).unwrap();
        let f = File::options().write(true).open(&orphan).unwrap();
        f.set_times(fs::FileTimes::new().set_modified(SystemTime::UNIX_EPOCH)).unwrap();
        drop(f);
        // Over the bound with it: the pass removes the oldest first, the orphan.
        let now = c.size_bytes();
        c.set_budget(now - 1);
        c.evict(true);
        assert!(!orphan.exists(), "an orphan data file was not evicted first");
        assert!(matches!(c.file_entry(&key(11), 2 * BLOCK), FileLookup::Sound(_)));
    }

    #[test]
    fn a_failing_writer_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let c = cache(dir.path(), 1 << 30);
        let ok = c.put_file(&key(1), 3 * BLOCK, &mut |at, buf| {
            if at >= BLOCK {
                Err(io::Error::other("the view refused"))
            } else {
                buf.fill(1);
                Ok(())
            }
        });
        assert!(!ok);
        assert!(stored(dir.path()).is_empty());
        assert_eq!(fs::read_dir(dir.path().join("tmp")).unwrap().count(), 0);
        assert_eq!(c.size_bytes(), 0);
        // Larger than the whole budget: not written.
        let small = cache(&dir.path().join("small"), BLOCK);
        assert!(!put(&small, 1, 2 * BLOCK));
        assert!(matches!(small.file_entry(&key(1), 2 * BLOCK), FileLookup::Absent));
    }
}
