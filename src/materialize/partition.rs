//! Materialize across processes or machines: `--partition I/N` writes a deterministic,
//! disjoint part of the output, `--finalize` checks that every part is there and writes the
//! derived files (manifests).
//!
//! The data files are cut into pieces: a file of at most `piece_bytes` is one piece (written
//! whole, under its final name, by one partition), a larger file is cut at multiples of
//! `piece_bytes` and its pieces are written in place into one shared `.<name>.partial` file
//! by their partitions (disjoint, aligned ranges: safe on NFS, Lustre, GPFS, CephFS).
//! Pieces go, in file order, to the partition with the fewest bytes so far (ties to the
//! lowest index), so every partition computes the same plan from the same view.
//!
//! State lives in `OUT/.xpackfs-parts/`: `plan.json` (the plan, the source identity, the
//! recorded command) and one `piece-K.json` per finished piece (its sha256 and the digests
//! of the ranges the manifests need), written after the piece is fsynced. Re-running a
//! partition continues it (finished pieces are skipped), so a requeued job or a restarted pod
//! needs no flag. `--finalize` re-hashes each cut file once from disk (checking every
//! piece's digest on the way, since sha256 cannot be combined), renames it into place,
//! writes the derived files from the recorded digests, and removes the state directory.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use super::hash::RangeHasher;
use super::write::{self, partial_paths, write_one};
use super::{FileResult, Files, MaterializeError, Options, Progress, check_space, io, write_derived};
use crate::fsutil::{fsync_dir, write_atomic};
use crate::view::Built;
use crate::view::VirtualFile;

pub const PARTS_DIR: &str = ".xpackfs-parts";
const PLAN: &str = "plan.json";
const PLAN_FORMAT: &str = "xpackfs-partition-plan-v1";
pub const DEFAULT_PIECE_BYTES: u64 = 1 << 30;

/// `I/N`: partition I (0-based, as Kubernetes' `JOB_COMPLETION_INDEX` and Slurm's
/// `SLURM_ARRAY_TASK_ID` with `--array=0-(N-1)`) of N.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Partition {
    pub index: u32,
    pub count: u32,
}

/// A `--partition` value that is not `I/N` with `0 <= I < N`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--partition {0:?}: expected I/N with 0 <= I < N (e.g. 0/4)")]
pub struct BadPartition(pub String);

impl std::str::FromStr for Partition {
    type Err = BadPartition;
    fn from_str(s: &str) -> Result<Self, BadPartition> {
        let bad = || BadPartition(s.to_string());
        let (i, n) = s.split_once('/').ok_or_else(bad)?;
        let (index, count): (u32, u32) = (i.trim().parse().map_err(|_| bad())?, n.trim().parse().map_err(|_| bad())?);
        if count == 0 || index >= count {
            return Err(bad());
        }
        Ok(Partition { index, count })
    }
}

impl std::fmt::Display for Partition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Piece {
    file: String,
    offset: u64,
    len: u64,
    /// The piece is the whole file.
    whole: bool,
    partition: u32,
}

/// The source's identity as every machine sees it: path, inode, size, mtime, ctime (not
/// the device number, which differs between the clients of a network filesystem).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct SourceFileId {
    path: PathBuf,
    inode: u64,
    size: u64,
    mtime_ns: i128,
    ctime_ns: i128,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Plan {
    format: String,
    count: u32,
    piece_bytes: u64,
    source: Vec<SourceFileId>,
    /// The command recorded in manifests (`--partition` removed), the same for every part.
    command: String,
    /// Data files (name, size), in order.
    files: Vec<(String, u64)>,
    /// Derived files, written by `--finalize` (their sizes may depend on when the source was
    /// hashed: manifests record it).
    derived: Vec<String>,
    pieces: Vec<Piece>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct PieceRecord {
    piece: usize,
    file: String,
    offset: u64,
    len: u64,
    partition: u32,
    sha256: String,
    /// (offset, len, sha256) of the wanted ranges that lie inside the piece.
    ranges: Vec<(u64, u64, String)>,
}

fn source_ids(built: &Built) -> Vec<SourceFileId> {
    built
        .sources
        .iter()
        .map(|f| {
            let id = f.identity();
            SourceFileId { path: f.path().to_path_buf(), inode: id.inode, size: id.size, mtime_ns: id.mtime_ns, ctime_ns: id.ctime_ns }
        })
        .collect()
}

fn make_plan(built: &Built, listed: &Files, count: u32, piece_bytes: u64, command: &str) -> Plan {
    let data = listed.iter().filter(|(_, f)| !f.is_derived());
    let mut load = vec![0u64; count as usize];
    let mut pieces = Vec::new();
    for (name, f) in data.clone() {
        let size = f.size();
        let cut = piece_bytes > 0 && size > piece_bytes;
        let step = if cut { piece_bytes } else { size.max(1) };
        let mut offset = 0;
        loop {
            let len = step.min(size - offset);
            let p = (0..count as usize).min_by_key(|&i| (load[i], i)).unwrap_or(0);
            load[p] += len;
            pieces.push(Piece { file: name.clone(), offset, len, whole: !cut, partition: p as u32 });
            offset += len;
            if offset >= size {
                break;
            }
        }
    }
    Plan {
        format: PLAN_FORMAT.into(),
        count,
        piece_bytes,
        source: source_ids(built),
        command: command.into(),
        files: data.map(|(n, f)| (n.clone(), f.size())).collect(),
        derived: listed.iter().filter(|(_, f)| f.is_derived()).map(|(n, _)| n.clone()).collect(),
        pieces,
    }
}

fn parts_dir(out: &Path) -> PathBuf {
    out.join(PARTS_DIR)
}

fn record_path(out: &Path, piece: usize) -> PathBuf {
    parts_dir(out).join(format!("piece-{piece:06}.json"))
}

fn load_plan(out: &Path) -> Result<Option<Plan>, MaterializeError> {
    let path = parts_dir(out).join(PLAN);
    match std::fs::read(&path) {
        Ok(b) => serde_json::from_slice(&b).map(Some).map_err(|source| MaterializeError::BadState { path: path.clone(), what: "a partition plan", source }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io(&path)(e)),
    }
}

/// The command the partitions recorded (what `--finalize` writes into the manifests).
pub fn recorded_command(out: &Path) -> Result<String, MaterializeError> {
    match load_plan(out)? {
        Some(p) => Ok(p.command),
        None => Err(MaterializeError::Refused(format!("{}: no partitioned run here ({}/{PLAN} is missing)", out.display(), PARTS_DIR))),
    }
}

/// Why two plans differ, for the error message.
fn plan_difference(have: &Plan, want: &Plan) -> String {
    if have.count != want.count || have.piece_bytes != want.piece_bytes {
        return format!("it was started as {} partitions of {} byte pieces, not {} of {}", have.count, have.piece_bytes, want.count, want.piece_bytes);
    }
    if have.source != want.source {
        return "the source changed since (size, mtime, ctime or inode)".into();
    }
    if have.files != want.files || have.derived != want.derived {
        return "the view's files differ (different view options?)".into();
    }
    "the plans differ".into()
}

fn read_record(out: &Path, k: usize, piece: &Piece) -> Option<PieceRecord> {
    let r: PieceRecord = serde_json::from_slice(&std::fs::read(record_path(out, k)).ok()?).ok()?;
    (r.piece == k && r.file == piece.file && r.offset == piece.offset && r.len == piece.len).then_some(r)
}

/// Run partition `part` of a partitioned materialize into `out`.
pub fn run_partition(built: &Built, out: &Path, part: Partition, piece_bytes: u64, command: &str, opts: &Options) -> Result<Vec<FileResult>, MaterializeError> {
    if opts.replace {
        return Err(MaterializeError::Refused("--replace cannot be combined with --partition: remove the output directory first".into()));
    }
    let dir = parts_dir(out);
    let listed = built.tree.files();
    let plan = make_plan(built, &listed, part.count, piece_bytes, command);
    if !dir.exists()
        && let Some(name) = plan.derived.iter().find(|n| out.join(n).exists())
    {
        return Err(MaterializeError::Refused(format!("{} is a finished output ({name} exists): remove it to start again", out.display())));
    }
    std::fs::create_dir_all(&dir).map_err(io(&dir))?;
    match load_plan(out)? {
        Some(have) if have != plan => {
            return Err(MaterializeError::Refused(format!("partition {part}: {} was planned differently: {}", out.display(), plan_difference(&have, &plan))));
        }
        Some(_) => {}
        None => {
            let path = dir.join(PLAN);
            write_atomic(&path, &serde_json::to_vec_pretty(&plan).unwrap()).map_err(io(&path))?;
        }
    }
    let files: HashMap<&str, &Arc<VirtualFile>> = listed.iter().map(|(n, f)| (n.as_str(), f)).collect();
    let mine: Vec<(usize, &Piece)> = plan.pieces.iter().enumerate().filter(|(_, p)| p.partition == part.index).collect();
    let todo: u64 = mine.iter().filter(|(k, p)| read_record(out, *k, p).is_none()).map(|(_, p)| p.len).sum();
    check_space(out, todo, opts.margin)?;
    let progress = Progress::start(mine.iter().map(|(_, p)| p.len).sum(), opts.progress);
    let done = &progress.done;
    let resume = Options { resume: true, ..opts.clone() };
    let results = mine
        .par_iter()
        .map(|&(k, piece)| -> Result<FileResult, MaterializeError> {
            if let Some(r) = read_record(out, k, piece) {
                done.fetch_add(piece.len, std::sync::atomic::Ordering::Relaxed);
                return Ok(FileResult {
                    name: piece.file.clone(),
                    size: piece.len,
                    sha256: r.sha256,
                    resumed_from: piece.len,
                    skipped: true,
                    ranges: Vec::new(),
                });
            }
            let file = files[piece.file.as_str()];
            let (sha256, ranges, result) = if piece.whole {
                let r = write_one(out, &piece.file, file, &resume, done, true)?;
                (r.sha256.clone(), r.ranges.clone(), r)
            } else {
                let (sha, ranges) = write_piece(out, &piece.file, file, piece, opts.chunk, done)?;
                let r = FileResult { name: piece.file.clone(), size: piece.len, sha256: sha.clone(), resumed_from: 0, skipped: false, ranges: Vec::new() };
                (sha, ranges, r)
            };
            let rec = PieceRecord { piece: k, file: piece.file.clone(), offset: piece.offset, len: piece.len, partition: part.index, sha256, ranges };
            let path = record_path(out, k);
            write_atomic(&path, &serde_json::to_vec(&rec).unwrap()).map_err(io(&path))?;
            Ok(result)
        })
        .collect::<Result<Vec<_>, _>>();
    drop(progress);
    results
}

/// A piece's sha256 and the digests of the wanted ranges inside it.
type PieceDigests = (String, Vec<(u64, u64, String)>);

/// Write one piece of a cut file into the shared partial file, then fsync it.
fn write_piece(out: &Path, name: &str, file: &VirtualFile, piece: &Piece, chunk: usize, done: &AtomicU64) -> Result<PieceDigests, MaterializeError> {
    let (partial, _) = partial_paths(out, name);
    if let Some(parent) = partial.parent() {
        std::fs::create_dir_all(parent).map_err(io(parent))?;
    }
    let f = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(&partial).map_err(io(&partial))?;
    // Every partition gives the file its full size; none ever shrinks it.
    if f.metadata().map_err(io(&partial))?.len() < file.size() {
        f.set_len(file.size()).map_err(io(&partial))?;
    }
    let end = piece.offset + piece.len;
    let hasher = RangeHasher::new(piece.offset, end, &file.digest_ranges());
    let hasher = write::stream(name, file, &f, &partial, (piece.offset, end), chunk, hasher, done, &|_| Ok(()))?;
    f.sync_data().map_err(io(&partial))?;
    Ok(hasher.finish())
}

/// Check that every partition finished, assemble the cut files, write the derived files.
pub fn finalize(built: &Built, out: &Path, opts: &Options) -> Result<Vec<FileResult>, MaterializeError> {
    let Some(have) = load_plan(out)? else {
        return Err(MaterializeError::Refused(format!("{}: no partitioned run to finalize ({PARTS_DIR}/{PLAN} is missing)", out.display())));
    };
    let listed = built.tree.files();
    let plan = make_plan(built, &listed, have.count, have.piece_bytes, &have.command);
    if have != plan {
        return Err(MaterializeError::Refused(format!("finalize: {} was planned differently: {}", out.display(), plan_difference(&have, &plan))));
    }
    // Every piece must be recorded.
    let mut records = Vec::with_capacity(plan.pieces.len());
    let mut missing: std::collections::BTreeMap<u32, Vec<usize>> = Default::default();
    for (k, p) in plan.pieces.iter().enumerate() {
        match read_record(out, k, p) {
            Some(r) => records.push(r),
            None => missing.entry(p.partition).or_default().push(k),
        }
    }
    if !missing.is_empty() {
        let parts: Vec<String> = missing
            .iter()
            .map(|(p, ks)| format!("partition {p}/{} ({} of its pieces, first: piece {} of {})", plan.count, ks.len(), ks[0], plan.pieces[ks[0]].file))
            .collect();
        return Err(MaterializeError::Refused(format!("finalize: unfinished partitions: {}", parts.join("; "))));
    }
    let files: HashMap<&str, &Arc<VirtualFile>> = listed.iter().map(|(n, f)| (n.as_str(), f)).collect();
    let mut results = Vec::new();
    // Whole files: present with the right size, digests from their records.
    for r in records.iter().filter(|r| plan.pieces[r.piece].whole) {
        let path = out.join(&r.file);
        let len = std::fs::metadata(&path).map_err(io(&path))?.len();
        if len != r.len {
            return Err(MaterializeError::Refused(format!("finalize: {} has {len} bytes, partition {} wrote {}", path.display(), r.partition, r.len)));
        }
        write::record(files[r.file.as_str()], &r.sha256, &r.ranges);
        results.push(FileResult { name: r.file.clone(), size: r.len, sha256: r.sha256.clone(), resumed_from: 0, skipped: false, ranges: r.ranges.clone() });
    }
    // Cut files: one pass each from disk, checking every piece, then into place.
    let cut: Vec<&(String, u64)> = plan.files.iter().filter(|(n, _)| plan.pieces.iter().any(|p| &p.file == n && !p.whole)).collect();
    let total: u64 = cut.iter().map(|(_, s)| s).sum();
    let progress = Progress::start(total, opts.progress);
    let assembled =
        cut.par_iter().map(|(name, size)| assemble(out, name, *size, files[name.as_str()], &records, &plan, &progress.done)).collect::<Result<Vec<_>, _>>();
    drop(progress);
    results.extend(assembled?);
    let resume = Options { resume: true, ..opts.clone() };
    let derived: Files = listed.iter().filter(|(_, f)| f.is_derived()).cloned().collect();
    let progress = Progress::start(derived.iter().map(|(_, f)| f.size()).sum(), false);
    results.extend(write_derived(out, &derived, &resume, &progress.done, true)?);
    drop(progress);
    std::fs::remove_dir_all(parts_dir(out)).map_err(io(&parts_dir(out)))?;
    super::remove_leftovers(out);
    fsync_dir(out).map_err(io(out))?;
    if opts.verify {
        super::verify(built, out, &results)?;
    }
    Ok(results)
}

fn assemble(
    out: &Path,
    name: &str,
    size: u64,
    file: &VirtualFile,
    records: &[PieceRecord],
    plan: &Plan,
    done: &AtomicU64,
) -> Result<FileResult, MaterializeError> {
    let final_path = out.join(name);
    let (partial, _) = partial_paths(out, name);
    // An interrupted finalize may have renamed it already.
    let path = if partial.exists() || !final_path.exists() { partial.clone() } else { final_path.clone() };
    let f = std::fs::File::open(&path).map_err(io(&path))?;
    let len = f.metadata().map_err(io(&path))?.len();
    if len != size {
        return Err(MaterializeError::Refused(format!("finalize: {} has {len} bytes, the view {size}", path.display())));
    }
    let mut whole = RangeHasher::new(0, size, &file.digest_ranges());
    let mut pieces: Vec<&PieceRecord> = records.iter().filter(|r| r.file == name).collect();
    pieces.sort_by_key(|r| r.offset);
    for r in pieces {
        // Both hashers see the same bytes, read once.
        let mut piece = RangeHasher::new(r.offset, r.offset + r.len, &[]);
        let mut buf = vec![0u8; 8 << 20];
        let mut off = r.offset;
        while off < r.offset + r.len {
            let n = (r.offset + r.len - off).min(buf.len() as u64) as usize;
            std::os::unix::fs::FileExt::read_exact_at(&f, &mut buf[..n], off).map_err(io(&path))?;
            rayon::join(|| whole.update(&buf[..n]), || piece.update(&buf[..n]));
            off += n as u64;
            done.fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
        }
        let got = piece.finish().0;
        if got != r.sha256 {
            return Err(MaterializeError::Refused(format!(
                "finalize: {name} bytes {}..{} (piece {}, partition {}/{}) hash to {got} on disk, the partition wrote {}: run that partition again after removing {}",
                r.offset,
                r.offset + r.len,
                r.piece,
                r.partition,
                plan.count,
                r.sha256,
                record_path(out, r.piece).display()
            )));
        }
    }
    f.sync_all().map_err(io(&path))?;
    drop(f);
    if path == partial {
        if final_path.exists() {
            return Err(MaterializeError::Refused(format!("{} already exists", final_path.display())));
        }
        std::fs::rename(&partial, &final_path).map_err(io(&final_path))?;
        let parent = final_path.parent().unwrap_or(out);
        fsync_dir(parent).map_err(io(parent))?;
    }
    let (sha, ranges) = whole.finish();
    write::record(file, &sha, &ranges);
    Ok(FileResult { name: name.into(), size, sha256: sha, resumed_from: 0, skipped: false, ranges })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partition_syntax() {
        assert_eq!("1/4".parse::<Partition>(), Ok(Partition { index: 1, count: 4 }));
        for bad in ["4/4", "0/0", "1", "a/2", "-1/2", "1/2/3"] {
            assert!(bad.parse::<Partition>().is_err(), "{bad}");
        }
    }
}
