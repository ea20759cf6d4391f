//! Content digests of a source, and the digest store that remembers them.
//!
//! Some views carry content digests *inside* their bytes (the expert pack's header holds
//! the source's sha256, its index every slice's sha256). Hashing a 150 GB source takes
//! minutes, so digests are computed once, in one sequential pass that feeds every hasher
//! (whole source, header region, each tensor, each expert slice) from the same buffers,
//! and then remembered in a store keyed by the source files' identity (device, inode,
//! size, mtime, ctime). A later mount of an unchanged source finds them there and reads
//! nothing but headers. Any change to a file changes its identity and so misses the store.
//!
//! Store layout: one JSON file per source, `<store>/<key>.json`, where key is the sha256
//! of the canonical JSON of the files' paths and identities. Written atomically.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::mpsc::sync_channel;
use std::sync::Arc;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::source::{FileIdentity, Source, SourceError};

pub const STORE_FORMAT: &str = "xpackfs-digests-v1";
const CHUNK: usize = 8 << 20;

#[derive(Debug, thiserror::Error)]
pub enum DigestError {
    #[error(transparent)]
    Source(#[from] SourceError),
    #[error("digest store {}: {what}", path.display())]
    Store { path: PathBuf, what: String },
    #[error("source sha256 mismatch: expected {expected}, the source hashes to {actual}")]
    Mismatch { expected: String, actual: String },
}

pub fn hex(bytes: &[u8]) -> String {
    hex::encode(bytes)
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct FileRecord {
    pub path: PathBuf,
    pub identity: FileIdentity,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct TensorDigest {
    pub sha256: String,
    /// sha256 of each of `slices.len()` equal slices, for tensors split per expert.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub slices: Vec<String>,
}

/// Digests of one source, as computed and as stored.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SourceDigests {
    pub format: String,
    pub files: Vec<FileRecord>,
    /// sha256 of the source (of the concatenated files, for a split set).
    pub source_sha256: String,
    /// sha256 of each file's header region `[0, data_offset)`, concatenated.
    pub header_sha256: String,
    pub tensors: BTreeMap<String, TensorDigest>,
    pub computed_at: String,
    pub elapsed_s: f64,
    /// Digests of whole view files that depend only on the source and their
    /// parameters, keyed by view and a hash of those parameters.
    #[serde(default)]
    pub views: BTreeMap<String, String>,
}

/// Which tensors get per-slice digests, and how many slices.
pub fn expert_slices(t: &crate::source::TensorInfo) -> Option<u64> {
    let n = *t.shape.get(2)?;
    (t.shape.len() == 3 && t.name.ends_with("_exps.weight") && n > 0 && t.nbytes % n == 0).then_some(n)
}

pub fn file_records(source: &Source) -> Vec<FileRecord> {
    source.files.iter().map(|f| FileRecord { path: f.path().to_path_buf(), identity: f.identity() }).collect()
}

pub fn now_iso() -> String {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    format_utc(now.as_secs() as i64, now.subsec_micros())
}

/// `datetime.isoformat()` of an aware UTC datetime: `2026-11-30T02:40:17.123456+00:00`.
pub fn format_utc(secs: i64, micros: u32) -> String {
    let days = secs.div_euclid(86400);
    let rem = secs.rem_euclid(86400);
    // Civil from days (Howard Hinnant's algorithm).
    let z = days + 719468;
    let era = z.div_euclid(146097);
    let doe = z.rem_euclid(146097);
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    let frac = if micros == 0 { String::new() } else { format!(".{micros:06}") };
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}{frac}+00:00", rem / 3600, rem % 3600 / 60, rem % 60)
}

/// Hash everything in one sequential pass over the source files.
pub fn compute(source: &Source) -> Result<SourceDigests, DigestError> {
    let started = Instant::now();
    let data_offsets: Vec<u64> = match source.gguf() {
        Some(meta) => meta.headers.iter().map(|h| h.data_offset).collect(),
        None => vec![0; source.files.len()],
    };
    let total = source.logical_size();

    struct Region<'a> {
        name: &'a str,
        start: u64,
        end: u64,
        slice_bytes: u64,
        hasher: Sha256,
        slice: Sha256,
        slices: Vec<String>,
    }
    // Per file: tensor regions sorted by offset (they do not overlap).
    let mut per_file: Vec<Vec<Region>> = (0..source.files.len()).map(|_| Vec::new()).collect();
    for t in &source.tensors {
        let n = expert_slices(t).unwrap_or(0);
        per_file[t.file].push(Region {
            name: &t.name,
            start: t.offset,
            end: t.offset + t.nbytes,
            slice_bytes: if n > 0 { t.nbytes / n } else { 0 },
            hasher: Sha256::new(),
            slice: Sha256::new(),
            slices: Vec::new(),
        });
    }
    for regions in &mut per_file {
        regions.sort_by_key(|r| r.start);
    }

    let mut whole = Sha256::new();
    let mut header = Sha256::new();
    let mut done_bytes = 0u64;
    let mut last_log = Instant::now();
    let files = source.files.clone();
    let (tx, rx) = sync_channel::<Result<(usize, u64, Arc<Vec<u8>>), SourceError>>(3);
    let reader = std::thread::spawn(move || {
        for (i, f) in files.iter().enumerate() {
            let mut off = 0u64;
            while off < f.size() {
                let n = (f.size() - off).min(CHUNK as u64) as usize;
                let mut buf = vec![0u8; n];
                let r = f.read_exact_at(&mut buf, off).map(|_| (i, off, Arc::new(buf)));
                let failed = r.is_err();
                if tx.send(r).is_err() || failed {
                    return;
                }
                off += n as u64;
            }
        }
    });

    let mut cursor = vec![0usize; per_file.len()];
    for msg in rx {
        let (fi, off, buf) = msg?;
        let end = off + buf.len() as u64;
        let regions = &mut per_file[fi];
        let cur = &mut cursor[fi];
        let header_end = data_offsets[fi].min(end);
        rayon::join(
            || whole.update(&buf[..]),
            || {
                if off < header_end {
                    header.update(&buf[..(header_end - off) as usize]);
                }
                while *cur < regions.len() && regions[*cur].end <= off && regions[*cur].end > regions[*cur].start {
                    *cur += 1;
                }
                let mut i = *cur;
                while i < regions.len() && regions[i].start < end {
                    let r = &mut regions[i];
                    let a = r.start.max(off);
                    let b = r.end.min(end);
                    if a < b {
                        let bytes = &buf[(a - off) as usize..(b - off) as usize];
                        r.hasher.update(bytes);
                        if r.slice_bytes > 0 {
                            let mut pos = a;
                            while pos < b {
                                let slice_end = r.start + ((pos - r.start) / r.slice_bytes + 1) * r.slice_bytes;
                                let upto = slice_end.min(b);
                                r.slice.update(&buf[(pos - off) as usize..(upto - off) as usize]);
                                if upto == slice_end {
                                    let h = std::mem::take(&mut r.slice);
                                    r.slices.push(hex(&h.finalize()));
                                }
                                pos = upto;
                            }
                        }
                    }
                    i += 1;
                }
            },
        );
        done_bytes += buf.len() as u64;
        if last_log.elapsed().as_secs() >= 5 {
            last_log = Instant::now();
            let rate = done_bytes as f64 / started.elapsed().as_secs_f64() / 1e6;
            tracing::info!("hashing source: {done_bytes}/{total} bytes ({rate:.0} MB/s)");
        }
    }
    reader.join().map_err(|_| DigestError::Store { path: PathBuf::new(), what: "reader thread panicked".into() })?;
    if done_bytes != total {
        return Err(SourceError::Changed {
            path: source.files[0].path().to_path_buf(),
            what: format!("read {done_bytes} bytes while hashing, expected {total}"),
        }
        .into());
    }
    let mut tensors = BTreeMap::new();
    for r in per_file.into_iter().flatten() {
        tensors.insert(r.name.to_string(), TensorDigest { sha256: hex(&r.hasher.finalize()), slices: r.slices });
    }
    for f in &source.files {
        f.check_unchanged()?;
    }
    Ok(SourceDigests {
        format: STORE_FORMAT.into(),
        files: file_records(source),
        source_sha256: hex(&whole.finalize()),
        header_sha256: hex(&header.finalize()),
        tensors,
        computed_at: now_iso(),
        elapsed_s: started.elapsed().as_secs_f64(),
        views: BTreeMap::new(),
    })
}

/// Hashes bytes of one file streamed in order from `start`: the sha256 of everything
/// streamed, and of every wanted `(offset, len)` range lying wholly inside what is streamed.
pub struct RangeHasher {
    whole: Sha256,
    pos: u64,
    /// (start, end, hasher), sorted by start; removed when finished.
    open: Vec<(u64, u64, Sha256)>,
    finished: Vec<(u64, u64, String)>,
}

impl RangeHasher {
    pub fn new(start: u64, end: u64, wanted: &[(u64, u64)]) -> Self {
        let mut open: Vec<(u64, u64, Sha256)> = wanted
            .iter()
            .filter(|(o, l)| *o >= start && o.saturating_add(*l) <= end)
            .map(|&(o, l)| (o, o + l, Sha256::new()))
            .collect();
        open.sort_by_key(|r| (r.0, r.1));
        let mut h = RangeHasher { whole: Sha256::new(), pos: start, open, finished: Vec::new() };
        h.close_finished();
        h
    }

    fn close_finished(&mut self) {
        let pos = self.pos;
        let mut i = 0;
        while i < self.open.len() {
            if self.open[i].1 <= pos {
                let (a, b, h) = self.open.remove(i);
                self.finished.push((a, b - a, hex(&h.finalize())));
            } else {
                i += 1;
            }
        }
    }

    pub fn update(&mut self, bytes: &[u8]) {
        self.whole.update(bytes);
        let (lo, hi) = (self.pos, self.pos + bytes.len() as u64);
        for (a, b, h) in &mut self.open {
            if *a >= hi {
                break;
            }
            let (s, e) = ((*a).max(lo), (*b).min(hi));
            if s < e {
                h.update(&bytes[(s - lo) as usize..(e - lo) as usize]);
            }
        }
        self.pos = hi;
        self.close_finished();
    }

    pub fn position(&self) -> u64 {
        self.pos
    }

    /// The sha256 of everything streamed, and `(offset, len, sha256)` of every wanted range
    /// that was streamed completely.
    pub fn finish(self) -> (String, Vec<(u64, u64, String)>) {
        (hex(&self.whole.finalize()), self.finished)
    }
}

/// Where digests are remembered. `None` disables the store.
#[derive(Debug, Clone)]
pub struct DigestStore {
    pub dir: Option<PathBuf>,
}

impl DigestStore {
    /// `$XPACKFS_DIGEST_STORE`, else `/var/lib/xpackfs/digests` for root, else
    /// `$XDG_CACHE_HOME/xpackfs/digests` (or `~/.cache/xpackfs/digests`).
    pub fn default_dir() -> Option<PathBuf> {
        if let Some(p) = std::env::var_os("XPACKFS_DIGEST_STORE") {
            return Some(PathBuf::from(p));
        }
        if unsafe { libc::geteuid() } == 0 {
            return Some(PathBuf::from("/var/lib/xpackfs/digests"));
        }
        let cache = std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
        Some(cache.join("xpackfs/digests"))
    }

    pub fn from_option(opt: Option<&str>) -> Self {
        match opt {
            Some("none") | Some("off") => DigestStore { dir: None },
            Some(p) => DigestStore { dir: Some(PathBuf::from(p)) },
            None => DigestStore { dir: Self::default_dir() },
        }
    }

    /// Keyed by path, inode, size, mtime and ctime, not by the device number: the clients of
    /// a network filesystem see the same file under different device numbers, and a store on
    /// that filesystem is meant to be shared by them (a cluster materialize, several mounts).
    fn key(files: &[FileRecord]) -> String {
        let v = serde_json::to_value(portable(files)).expect("serializable");
        sha256_hex(crate::pyjson::dumps(&v, &crate::pyjson::Style::CANONICAL).as_bytes())
    }

    pub fn path_for(&self, source: &Source) -> Option<PathBuf> {
        Some(self.dir.as_ref()?.join(format!("{}.json", Self::key(&file_records(source)))))
    }

    /// Stored digests for this exact source (same paths and identities), if any.
    pub fn load(&self, source: &Source) -> Option<SourceDigests> {
        let path = self.path_for(source)?;
        let text = std::fs::read(&path).ok()?;
        match serde_json::from_slice::<SourceDigests>(&text) {
            Ok(d) if d.format == STORE_FORMAT && portable(&d.files) == portable(&file_records(source)) && covers(&d, source) => Some(d),
            Ok(_) => None,
            Err(e) => {
                tracing::warn!("ignoring unreadable digest store entry {}: {e}", path.display());
                None
            }
        }
    }

    pub fn save(&self, digests: &SourceDigests) -> Result<Option<PathBuf>, DigestError> {
        let Some(dir) = &self.dir else { return Ok(None) };
        let path = dir.join(format!("{}.json", Self::key(&digests.files)));
        let err = |what: String| DigestError::Store { path: path.clone(), what };
        std::fs::create_dir_all(dir).map_err(|e| err(format!("cannot create directory: {e}")))?;
        let text = serde_json::to_vec(digests).map_err(|e| err(e.to_string()))?;
        crate::fsutil::write_atomic(&path, &text).map_err(|e| err(e.to_string()))?;
        Ok(Some(path))
    }
}

impl DigestStore {
    fn view_path(&self, key: &str) -> Option<PathBuf> {
        Some(self.dir.as_ref()?.join("views").join(format!("{key}.json")))
    }

    /// Digests of a view's files remembered under `key` (which must cover the source's
    /// identity and the view's parameters).
    pub fn load_view(&self, key: &str) -> Option<Vec<String>> {
        let text = std::fs::read(self.view_path(key)?).ok()?;
        serde_json::from_slice(&text).ok()
    }

    pub fn save_view(&self, key: &str, hashes: &[String]) -> Result<(), DigestError> {
        let Some(path) = self.view_path(key) else { return Ok(()) };
        let err = |what: String| DigestError::Store { path: path.clone(), what };
        std::fs::create_dir_all(path.parent().unwrap()).map_err(|e| err(format!("cannot create directory: {e}")))?;
        crate::fsutil::write_atomic(&path, &serde_json::to_vec(hashes).unwrap()).map_err(|e| err(e.to_string()))
    }
}

/// File records without the device number (see [`DigestStore`]'s key).
fn portable(files: &[FileRecord]) -> Vec<FileRecord> {
    files
        .iter()
        .map(|f| FileRecord { path: f.path.clone(), identity: crate::source::FileIdentity { device: 0, ..f.identity } })
        .collect()
}

fn covers(d: &SourceDigests, source: &Source) -> bool {
    source.tensors.iter().all(|t| {
        d.tensors
            .get(&t.name)
            .is_some_and(|td| td.slices.len() as u64 == expert_slices(t).unwrap_or(0))
    })
}

/// Digests for a source: from the store when it has them, else computed (and stored).
/// When `expected_source_sha256` is given, the digests must agree with it.
pub fn obtain(source: &Source, store: &DigestStore, expected_source_sha256: Option<&str>) -> Result<SourceDigests, DigestError> {
    let digests = match store.load(source) {
        Some(d) => {
            tracing::info!("source digests from the store ({})", store.path_for(source).unwrap().display());
            d
        }
        None => {
            tracing::info!("hashing source {} ({} bytes) once; the digests will be remembered", source.files[0].path().display(), source.logical_size());
            let d = compute(source)?;
            tracing::info!("hashed in {:.1}s, sha256 {}", d.elapsed_s, d.source_sha256);
            match store.save(&d) {
                Ok(Some(p)) => tracing::info!("digests stored in {}", p.display()),
                Ok(None) => {}
                Err(e) => tracing::warn!("could not store digests: {e}"),
            }
            d
        }
    };
    if let Some(expected) = expected_source_sha256 {
        if !expected.eq_ignore_ascii_case(&digests.source_sha256) {
            return Err(DigestError::Mismatch { expected: expected.to_string(), actual: digests.source_sha256 });
        }
    }
    Ok(digests)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn range_hasher_matches_direct_hashes() {
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let wanted = [(0, 10_000), (5, 0), (100, 900), (950, 3000), (9_999, 1), (9_000, 2_000), (4_000, 10)];
        for (start, end) in [(0u64, 10_000u64), (950, 4_000), (100, 1_000)] {
            let mut h = RangeHasher::new(start, end, &wanted);
            // Uneven pieces, so ranges start and end inside updates.
            let mut pos = start as usize;
            for step in [1usize, 333, 4096, 17].iter().cycle() {
                if pos >= end as usize {
                    break;
                }
                let n = (*step).min(end as usize - pos);
                h.update(&data[pos..pos + n]);
                pos += n;
            }
            let (whole, mut ranges) = h.finish();
            assert_eq!(whole, sha256_hex(&data[start as usize..end as usize]));
            ranges.sort();
            let mut expect: Vec<(u64, u64, String)> = wanted
                .iter()
                .filter(|(o, l)| *o >= start && o + l <= end)
                .map(|&(o, l)| (o, l, sha256_hex(&data[o as usize..(o + l) as usize])))
                .collect();
            expect.sort();
            assert_eq!(ranges, expect, "streamed [{start}, {end})");
        }
    }

    #[test]
    fn utc_like_python_isoformat() {
        // datetime.fromtimestamp(t, timezone.utc).isoformat()
        assert_eq!(format_utc(0, 0), "1970-01-01T00:00:00+00:00");
        assert_eq!(format_utc(1_798_598_417, 123_456), "2026-12-30T02:40:17.123456+00:00");
        assert_eq!(format_utc(951_782_400, 5), "2000-02-29T00:00:00.000005+00:00");
    }
}
