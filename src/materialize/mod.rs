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
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use rayon::prelude::*;
use serde_json::{json, Value};

use crate::fsutil::{fsync_dir, write_atomic};
use crate::source::Source;
use crate::view::{Tree, VirtualFile};
use write::{hash_disk, partial_paths, write_one};

const STATE: &str = ".xpackfs-materialize.json";

#[derive(Debug, thiserror::Error)]
pub enum MaterializeError {
    #[error("{}: {what}", path.display())]
    Io { path: PathBuf, what: String },
    #[error("{0}")]
    Refused(String),
    #[error("{name}: {source}")]
    View { name: String, source: crate::view::ViewError },
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> MaterializeError + '_ {
    move |e| MaterializeError::Io { path: path.to_path_buf(), what: e.to_string() }
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

fn source_identity(source: &Source) -> Value {
    serde_json::to_value(crate::digest::file_records(source)).unwrap()
}

/// Bytes free for an unprivileged writer on the filesystem holding `dir`.
fn free_bytes(dir: &Path) -> Result<u64, MaterializeError> {
    let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).unwrap();
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
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

/// Bytes done so far, shown as a progress bar on a terminal, else logged every 10 s.
struct Progress {
    done: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    bar: Option<indicatif::ProgressBar>,
}

impl Progress {
    fn start(total: u64, show_bar: bool) -> Progress {
        let done = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let started = Instant::now();
        let bar = show_bar.then(|| {
            let b = indicatif::ProgressBar::new(total);
            b.set_style(
                indicatif::ProgressStyle::with_template("{bar:40} {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta}")
                    .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            );
            b
        });
        let thread = {
            let (done, stop, bar) = (done.clone(), stop.clone(), bar.clone());
            std::thread::spawn(move || {
                let mut last = Instant::now();
                while !stop.load(Ordering::Relaxed) {
                    std::thread::sleep(std::time::Duration::from_millis(200));
                    let d = done.load(Ordering::Relaxed);
                    match &bar {
                        Some(b) => b.set_position(d),
                        None if last.elapsed().as_secs() >= 10 => {
                            last = Instant::now();
                            let rate = d as f64 / started.elapsed().as_secs_f64() / 1e6;
                            tracing::info!("materialize: {d}/{total} bytes ({rate:.0} MB/s)");
                        }
                        None => {}
                    }
                }
            })
        };
        Progress { done, stop, thread: Some(thread), bar }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}

/// Files of a view with their paths.
type Files = Vec<(String, Arc<VirtualFile>)>;

/// The files of a view: data files first, then the derived files (manifests).
fn split_files(files: Files) -> (Files, Files) {
    files.into_iter().partition(|(_, f)| !f.is_derived())
}

/// Write the derived files (after every data file: their digests are recorded by then).
fn write_derived(out: &Path, derived: &[(String, Arc<VirtualFile>)], opts: &Options, done: &AtomicU64) -> Result<Vec<FileResult>, MaterializeError> {
    derived.par_iter().map(|(name, f)| write_one(out, name, f, opts, done)).collect()
}

/// Check what was written: every file re-hashed against the digest taken while writing,
/// then the digests the manifests declare.
fn verify(source: &Source, out: &Path, results: &[FileResult]) -> Result<(), MaterializeError> {
    results.par_iter().try_for_each(|r| {
        let p = out.join(&r.name);
        let disk = hash_disk(&p)?;
        if disk != r.sha256 {
            return Err(MaterializeError::Refused(format!("verify: {} hashes to {disk}, {} was written", p.display(), r.sha256)));
        }
        Ok(())
    })?;
    verify_manifests(source, out, results)
}

/// Write every file of `tree` under `out`. Returns the per-file results.
pub fn materialize(source: &Source, tree: &Tree, out: &Path, opts: &Options) -> Result<Vec<FileResult>, MaterializeError> {
    std::fs::create_dir_all(out).map_err(io(out))?;
    let files = tree.files();
    // Source identity across resumes.
    let state_path = out.join(STATE);
    let identity = source_identity(source);
    if opts.resume {
        if let Ok(b) = std::fs::read(&state_path) {
            let prev: Value = serde_json::from_slice(&b).map_err(|e| MaterializeError::Refused(format!("{}: {e}", state_path.display())))?;
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
        return Err(MaterializeError::Refused(format!(
            "{} already exists in {} (use --resume to continue, --replace to overwrite)",
            p,
            out.display()
        )));
    }
    if out.join(partition::PARTS_DIR).exists() {
        return Err(MaterializeError::Refused(format!(
            "{} holds a partitioned run ({}): run the remaining partitions and --finalize, or remove it",
            out.display(),
            partition::PARTS_DIR
        )));
    }
    write_atomic(&state_path, json!({"source": identity, "files": files.iter().map(|(p, f)| json!({"name": p, "size": f.size()})).collect::<Vec<_>>()}).to_string().as_bytes())
        .map_err(io(&state_path))?;

    let total: u64 = files.iter().map(|(_, f)| f.size()).sum();
    let already: u64 = files
        .iter()
        .map(|(p, f)| if out.join(p).exists() && opts.resume { f.size() } else { 0 })
        .sum();
    check_space(out, total - already, opts.margin)?;

    let progress = Progress::start(total, opts.progress);
    let (data, derived) = split_files(files);
    let mut results: Vec<FileResult> =
        data.par_iter().map(|(name, f)| write_one(out, name, f, opts, &progress.done)).collect::<Result<_, _>>()?;
    results.extend(write_derived(out, &derived, opts, &progress.done)?);
    drop(progress);
    let _ = std::fs::remove_file(&state_path);
    remove_leftovers(out);
    fsync_dir(out).map_err(io(out))?;
    if opts.verify {
        verify(source, out, &results)?;
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
            && (name.ends_with(".partial") || name.ends_with(".partial.json") || name.rsplit_once(".tmp.").is_some_and(|(_, pid)| pid.bytes().all(|b| b.is_ascii_digit())));
        if ours {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// Check the digests the views' manifests declare against the written files: the expert
/// pack's manifest and checkpoint, the BF16 cache manifest, every requantised shard's
/// manifest (per-tensor ranges re-hashed from disk) and `.complete` marker, an INT8
/// tree by the INT8 validator with hash verification, and a Kimi pack by
/// `validate_ggml_moe_pack`'s checks with its full hash (and its manifest's `expert_pack`).
fn verify_manifests(source: &Source, out: &Path, results: &[FileResult]) -> Result<(), MaterializeError> {
    let sha: std::collections::HashMap<&str, &str> = results.iter().map(|r| (r.name.as_str(), r.sha256.as_str())).collect();
    let refuse = |what: String| MaterializeError::Refused(format!("verify: {what}"));
    let read = |name: &str| -> Result<Value, MaterializeError> {
        let bytes = std::fs::read(out.join(name)).map_err(io(&out.join(name)))?;
        serde_json::from_slice(&bytes).map_err(|e| refuse(format!("{name} is not JSON: {e}")))
    };
    let is_kimi_pack = |name: &str| -> bool {
        let mut magic = [0u8; 16];
        name.ends_with(".pack")
            && std::fs::File::open(out.join(name)).is_ok_and(|f| std::os::unix::fs::FileExt::read_exact_at(&f, &mut magic, 0).is_ok())
            && &magic == crate::view::kimi_pack::format::MAGIC
    };
    for r in results {
        let name = r.name.as_str();
        if is_kimi_pack(name) {
            let manifest_name = format!("{name}.manifest.json");
            let manifest = if sha.contains_key(manifest_name.as_str()) { Some(read(&manifest_name)?) } else { None };
            crate::view::kimi_pack::validate::verify_written(&out.join(name), source, &r.sha256, manifest.as_ref()).map_err(refuse)?;
        } else if name.strip_suffix(".manifest.json").is_some_and(is_kimi_pack) {
            // Checked with its pack.
        } else if let Some(pack) = name.strip_suffix(".manifest.json").filter(|p| p.ends_with(".pack")) {
            if read(name)?["pack_sha256"].as_str() != sha.get(pack).copied() {
                return Err(refuse(format!("{pack} does not match pack_sha256 in {name}")));
            }
        } else if let Some(pack) = name.strip_suffix(".checkpoint.json").filter(|p| p.ends_with(".pack")) {
            let c = read(name)?;
            let manifest = format!("{pack}.manifest.json");
            if c["pack_sha256"].as_str() != sha.get(pack).copied() || c["manifest_sha256"].as_str() != sha.get(manifest.as_str()).copied() {
                return Err(refuse(format!("{name} does not match {pack} and {manifest}")));
            }
        } else if name == crate::view::bf16_cache::MANIFEST_NAME {
            for f in read(name)?["files"].as_array().into_iter().flatten() {
                let file = f["name"].as_str().unwrap_or("");
                if f["sha256"].as_str() != sha.get(file).copied() {
                    return Err(refuse(format!("{file} does not match its digest in {name}")));
                }
            }
        } else if let Some(shard) = name.strip_suffix(".manifest.json") {
            let m = read(name)?;
            if m["output_shard"].as_str() == Some(shard) {
                verify_requant_shard(out, shard, &m)?;
            }
        } else if name == crate::view::kt_int8::MANIFEST_NAME {
            // The tree's rules by the validator; its digests against the files' (re-hashed
            // from disk just before), so the files are not read a third time.
            crate::view::kt_int8::validate::validate(out, &crate::view::kt_int8::validate::Expect::default(), Some(false))
                .map_err(|e| refuse(format!("INT8 tree: {e}")))?;
            for layer in read(name)?["layers"].as_array().into_iter().flatten() {
                for f in layer["files"].as_array().into_iter().flatten() {
                    let file = f["path"].as_str().unwrap_or("");
                    if f["sha256"].as_str() != sha.get(file).copied() {
                        return Err(refuse(format!("{file} does not match its digest in {name}")));
                    }
                }
            }
        }
    }
    Ok(())
}

/// A requantised shard against its manifest and `.complete` marker: every tensor's bytes
/// (located by the shard's own safetensors header) hash to the manifest's `output_sha256`.
fn verify_requant_shard(out: &Path, shard: &str, m: &Value) -> Result<(), MaterializeError> {
    use std::os::unix::fs::FileExt;
    let refuse = |what: String| MaterializeError::Refused(format!("verify: {shard}: {what}"));
    let path = out.join(shard);
    let f = std::fs::File::open(&path).map_err(io(&path))?;
    let size = f.metadata().map_err(io(&path))?.len();
    if m["file_bytes"].as_u64() != Some(size) {
        return Err(refuse(format!("{size} bytes, the manifest says {}", m["file_bytes"])));
    }
    let mut len8 = [0u8; 8];
    f.read_exact_at(&mut len8, 0).map_err(io(&path))?;
    let hlen = u64::from_le_bytes(len8);
    if hlen > size - 8 {
        return Err(refuse(format!("header length {hlen} exceeds the file")));
    }
    let mut hb = vec![0u8; hlen as usize];
    f.read_exact_at(&mut hb, 8).map_err(io(&path))?;
    let header: Value = serde_json::from_slice(&hb).map_err(|e| refuse(format!("header is not JSON: {e}")))?;
    let tensors = m["tensors"].as_array().ok_or_else(|| refuse("manifest has no tensors".into()))?;
    for t in tensors {
        let tname = t["name"].as_str().unwrap_or("");
        let offs = &header[tname]["data_offsets"];
        let (Some(a), Some(b)) = (offs[0].as_u64(), offs[1].as_u64()) else {
            return Err(refuse(format!("tensor {tname} of the manifest is not in the shard")));
        };
        if Some(b - a) != t["output_bytes"].as_u64() {
            return Err(refuse(format!("tensor {tname} has {} bytes, the manifest says {}", b - a, t["output_bytes"])));
        }
        let mut h = hash::RangeHasher::new(0, b - a, &[]);
        write::hash_file_range(&f, &path, 8 + hlen + a, b - a, &mut h).map_err(|e| refuse(e.to_string()))?;
        let got = h.finish().0;
        if Some(got.as_str()) != t["output_sha256"].as_str() {
            return Err(refuse(format!("tensor {tname} hashes to {got}, the manifest says {}", t["output_sha256"])));
        }
    }
    let marker = out.join(format!("{shard}.complete"));
    let text = std::fs::read_to_string(&marker).map_err(io(&marker))?;
    let fields: Vec<&str> = text.split_whitespace().collect();
    if fields.len() != 3 || fields[1] != size.to_string() || fields[2] != tensors.len().to_string() {
        return Err(refuse(format!("{} says {:?}, expected {size} bytes and {} tensors", marker.display(), text.trim(), tensors.len())));
    }
    Ok(())
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
