//! `xpackfs materialize`: write a view's files to disk through the same
//! [`VirtualFile::read_at`] a mount serves, so a copy and the mount cannot disagree.
//!
//! Durability: each file is written as `.<name>.partial` in the output directory, with a
//! checkpoint `.<name>.partial.json` (bytes durably written) updated after every fsync;
//! when complete it is fsynced, renamed into place and the directory fsynced. A completed
//! file is never overwritten unless `--replace` is given. `--resume` continues every partial
//! file from its last checkpoint (the already-written prefix is re-hashed once) after
//! checking that the source is unchanged (identity of every source file, recorded in
//! `.xpackfs-materialize.json` at the start). A `kill -9` at any point leaves either the
//! old state or a resumable partial state.
//!
//! Two phases: first the data files (in parallel; each hashed while it is written, with
//! the sub-ranges its manifests need), then the derived files (manifests), which take
//! those digests instead of reading anything again and record them in the digest store.
//! [`partition`] splits the first phase across processes or machines.

mod hash;
pub mod partition;
mod write;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use rayon::prelude::*;
use serde_json::{Value, json};

use crate::fsutil::{fsync_dir, write_atomic};
use crate::util::ticker::Shown;
use crate::view::{Built, VirtualFile};
use write::{commit, hash_disk, partial_paths, uncommit, write_one};

const STATE: &str = ".xpackfs-materialize.json";

#[derive(Debug, thiserror::Error)]
pub enum MaterializeError {
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    /// A state or plan file of an earlier run that is not what this program writes.
    #[error("{}: not {what}: {source}", path.display())]
    BadState { path: PathBuf, what: &'static str, source: serde_json::Error },
    /// A rule of materialize that the output, its state or the request breaks.
    #[error("{0}")]
    Refused(String),
    #[error("{name}: {source}")]
    View { name: String, source: crate::view::ViewError },
    /// The view's own check of what was written (`--verify`: its manifests' digests).
    #[error(transparent)]
    Verify(crate::view::ViewError),
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> MaterializeError + '_ {
    move |source| MaterializeError::Io { path: path.to_path_buf(), source }
}

#[derive(Debug, Clone, Default)]
pub struct Options {
    pub replace: bool,
    pub resume: bool,
    pub verify: bool,
    /// Free space to keep beyond the output, bytes.
    pub margin: u64,
    /// Write chunk size (test hook: small values make interruption points dense).
    pub chunk: usize,
    pub progress: bool,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct FileResult {
    pub name: String,
    pub size: u64,
    pub sha256: String,
    pub resumed_from: u64,
    pub skipped: bool,
    /// Digests of the sub-ranges the view's manifests need, taken while writing.
    #[serde(skip)]
    pub ranges: Vec<(u64, u64, String)>,
}

fn source_identity(built: &Built) -> Value {
    serde_json::to_value(crate::digest::records_of(&built.sources)).unwrap_or(Value::Null)
}

/// Bytes free for an unprivileged writer on the filesystem holding `dir`.
fn free_bytes(dir: &Path) -> Result<u64, MaterializeError> {
    let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).map_err(|e| io(dir)(std::io::Error::other(e)))?;
    // SAFETY: statvfs is plain old data, for which all zeros is a valid value.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a NUL-terminated path and `s` a valid statvfs to fill.
    if unsafe { libc::statvfs(c.as_ptr(), &mut s) } != 0 {
        return Err(io(dir)(std::io::Error::last_os_error()));
    }
    Ok(s.f_bavail as u64 * s.f_frsize as u64)
}

fn check_space(out: &Path, to_write: u64, margin: u64) -> Result<(), MaterializeError> {
    let free = free_bytes(out)?;
    if free < to_write.saturating_add(margin) {
        return Err(MaterializeError::Refused(format!(
            "insufficient free space in {}: {free} bytes free, {to_write} to write plus a {margin} byte margin",
            out.display()
        )));
    }
    Ok(())
}

/// Bytes done so far, shown as a progress bar on a terminal, else logged every 10 s, until
/// dropped ([`Shown`]).
struct Progress {
    done: Arc<AtomicU64>,
    _shown: Shown,
}

impl Progress {
    fn start(total: u64, show_bar: bool) -> Progress {
        let done = Arc::new(AtomicU64::new(0));
        let shown = {
            let done = done.clone();
            Shown::start("materialize", total, show_bar, move || done.load(Ordering::Relaxed))
        };
        Progress { done, _shown: shown }
    }
}

/// Files of a view with their paths.
type Files = Vec<(String, Arc<VirtualFile>)>;

/// The files of a view: data files first, then the derived files (manifests).
fn split_files(files: Files) -> (Files, Files) {
    files.into_iter().partition(|(_, f)| !f.is_derived())
}

/// Write the derived files (after every data file: their digests are recorded by then).
fn write_derived(
    out: &Path,
    derived: &[(String, Arc<VirtualFile>)],
    opts: &Options,
    done: &AtomicU64,
    commit_now: bool,
) -> Result<Vec<FileResult>, MaterializeError> {
    derived.par_iter().map(|(name, f)| write_one(out, name, f, opts, done, commit_now)).collect()
}

/// Check what was written: every file re-hashed against the digest taken while writing,
/// then the digests the view's manifests declare (the view's verify hook).
/// The files are hashed all at once on every core ([`crate::digest::lanes::sha256_files`]);
/// a file it could not read is hashed again alone, for the exact error.
fn verify(built: &Built, out: &Path, results: &[FileResult]) -> Result<(), MaterializeError> {
    let paths: Vec<PathBuf> = results.iter().map(|r| out.join(&r.name)).collect();
    let written: Vec<String> = results.iter().map(|r| r.sha256.clone()).collect();
    let hashed = crate::digest::lanes::sha256_files(&paths, Some(&written));
    for ((p, r), h) in paths.iter().zip(results).zip(hashed) {
        let disk = match h {
            Some(h) => h,
            None => hash_disk(p)?,
        };
        if disk != r.sha256 {
            return Err(MaterializeError::Refused(format!("verify: {} hashes to {disk}, {} was written", p.display(), r.sha256)));
        }
    }
    let written: std::collections::HashMap<String, String> = results.iter().map(|r| (r.name.clone(), r.sha256.clone())).collect();
    built.view.verify(built, out, &written).map_err(MaterializeError::Verify)
}

/// Write every file of the view under `out`. Returns the per-file results.
pub fn materialize(built: &Built, out: &Path, opts: &Options) -> Result<Vec<FileResult>, MaterializeError> {
    std::fs::create_dir_all(out).map_err(io(out))?;
    let files = built.tree.files();
    // Source identity across resumes.
    let state_path = out.join(STATE);
    let identity = source_identity(built);
    if opts.resume {
        if let Ok(b) = std::fs::read(&state_path) {
            let prev: Value = serde_json::from_slice(&b).map_err(|source| MaterializeError::BadState {
                path: state_path.clone(),
                what: "a materialize state file",
                source,
            })?;
            if prev["source"] != identity {
                return Err(MaterializeError::Refused(format!(
                    "the source changed since this output was started (identity recorded in {}): start over with --replace",
                    state_path.display()
                )));
            }
        }
    } else if !opts.replace
        && let Some((p, _)) = files.iter().find(|(p, _)| out.join(p).exists() || partial_paths(out, p).0.exists())
    {
        return Err(MaterializeError::Refused(format!("{} already exists in {} (use --resume to continue, --replace to overwrite)", p, out.display())));
    }
    if out.join(partition::PARTS_DIR).exists() {
        return Err(MaterializeError::Refused(format!(
            "{} holds a partitioned run ({}): run the remaining partitions and --finalize, or remove it",
            out.display(),
            partition::PARTS_DIR
        )));
    }
    let state = json!({"source": identity, "files": files.iter().map(|(p, f)| json!({"name": p, "size": f.size()})).collect::<Vec<_>>()}).to_string();
    write_atomic(&state_path, state.as_bytes()).map_err(io(&state_path))?;

    let total: u64 = files.iter().map(|(_, f)| f.size()).sum();
    let already: u64 = files.iter().map(|(p, f)| if out.join(p).exists() && opts.resume { f.size() } else { 0 }).sum();
    check_space(out, total - already, opts.margin)?;

    let progress = Progress::start(total, opts.progress);
    let (data, derived) = split_files(files);
    // Every file is written complete (as `.<name>.partial`) before any is put in its final
    // place: a run stopped by bad content leaves partials and state only, which `--resume`
    // continues, never a final file next to a failed one.
    let mut results: Vec<FileResult> = data.par_iter().map(|(name, f)| write_one(out, name, f, opts, &progress.done, false)).collect::<Result<_, _>>()?;
    results.extend(write_derived(out, &derived, opts, &progress.done, false)?);
    drop(progress);
    results.par_iter().try_for_each(|r| commit(out, &r.name, opts))?;
    let _ = std::fs::remove_file(&state_path);
    remove_leftovers(out);
    fsync_dir(out).map_err(io(out))?;
    if opts.verify
        && let Err(e) = verify(built, out, &results)
    {
        // Nothing unverified stays final: back to complete partials, with the state, so
        // `--resume` (after the cause is fixed) picks them up.
        for r in &results {
            if let Err(u) = uncommit(out, &r.name) {
                tracing::error!("verify failed and {} could not be moved back to a partial file: {u}", r.name);
            }
        }
        write_atomic(&state_path, state.as_bytes()).map_err(io(&state_path))?;
        return Err(e);
    }
    Ok(results)
}

/// Remove what interrupted runs of ours can leave: partial files, their checkpoints, and
/// temporary files of atomic writes (`.<name>.tmp.<pid><seq>`).
fn remove_leftovers(out: &Path) {
    for entry in std::fs::read_dir(out).into_iter().flatten().flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            remove_leftovers(&entry.path());
            continue;
        }
        let name = entry.file_name().to_string_lossy().into_owned();
        let ours = name.starts_with('.')
            && (name.ends_with(".partial")
                || name.ends_with(".partial.json")
                || name.rsplit_once(".tmp.").is_some_and(|(_, pid)| pid.bytes().all(|b| b.is_ascii_digit())));
        if ours {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

pub fn summary(results: &[FileResult], seconds: f64) -> Value {
    let bytes: u64 = results.iter().filter(|r| !r.skipped).map(|r| r.size - r.resumed_from).sum();
    json!({
        "files": results,
        "bytes_written": bytes,
        "seconds": seconds,
        "MBps": if seconds > 0.0 { bytes as f64 / seconds / 1e6 } else { 0.0 },
    })
}

pub fn stderr_is_terminal() -> bool {
    std::io::IsTerminal::is_terminal(&std::io::stderr())
}

pub fn flush() {
    let _ = std::io::stdout().flush();
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    #[test]
    fn io_and_state_errors_keep_their_cause() {
        let path = Path::new("/out/x.pack");
        let e = io(path)(std::io::Error::from(std::io::ErrorKind::StorageFull));
        assert_eq!(e.to_string(), format!("/out/x.pack: {}", std::io::Error::from(std::io::ErrorKind::StorageFull)));
        let cause = e.source().and_then(|s| s.downcast_ref::<std::io::Error>()).expect("the io::Error is the source");
        assert_eq!(cause.kind(), std::io::ErrorKind::StorageFull);

        let bad = serde_json::from_slice::<Value>(b"{").unwrap_err();
        let e = MaterializeError::BadState { path: PathBuf::from("/out/.xpackfs-materialize.json"), what: "a materialize state file", source: bad };
        assert!(e.to_string().starts_with("/out/.xpackfs-materialize.json: not a materialize state file: EOF"), "{e}");
        assert!(e.source().and_then(|s| s.downcast_ref::<serde_json::Error>()).is_some());
    }
}
