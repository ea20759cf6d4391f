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

use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use rayon::prelude::*;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::fsutil::{fsync_dir, write_atomic};
use crate::source::Source;
use crate::view::{Tree, VirtualFile};

const STATE: &str = ".xpackfs-materialize.json";
const SYNC_EVERY: u64 = 256 << 20;

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

/// Temporary and checkpoint names sit next to the final file (same directory, same filesystem).
fn partial_paths(out: &Path, name: &str) -> (PathBuf, PathBuf) {
    let p = Path::new(name);
    let dir = out.join(p.parent().unwrap_or(Path::new("")));
    let file = p.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
    (dir.join(format!(".{file}.partial")), dir.join(format!(".{file}.partial.json")))
}

fn write_one(out: &Path, name: &str, file: &VirtualFile, opts: &Options, done: &AtomicU64) -> Result<FileResult, MaterializeError> {
    let final_path = out.join(name);
    let (partial, ckpt) = partial_paths(out, name);
    let parent = final_path.parent().unwrap_or(out).to_path_buf();
    std::fs::create_dir_all(&parent).map_err(io(&parent))?;
    let size = file.size();
    if final_path.exists() {
        if opts.resume && !opts.replace {
            let len = std::fs::metadata(&final_path).map_err(io(&final_path))?.len();
            if len != size {
                return Err(MaterializeError::Refused(format!("{}: completed file has {len} bytes, the view {size}", final_path.display())));
            }
            done.fetch_add(size, Ordering::Relaxed);
            let sha = hash_disk(&final_path)?;
            return Ok(FileResult { name: name.into(), size, sha256: sha, resumed_from: size, skipped: true });
        }
    }
    let mut start = 0u64;
    let mut hasher = Sha256::new();
    let f = if opts.resume && partial.exists() {
        let written: u64 = std::fs::read(&ckpt)
            .ok()
            .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
            .and_then(|v| v["durable_bytes"].as_u64())
            .unwrap_or(0)
            .min(size);
        let f = std::fs::OpenOptions::new().read(true).write(true).open(&partial).map_err(io(&partial))?;
        // Re-hash the durable prefix once; whatever follows it is rewritten.
        let mut buf = vec![0u8; 8 << 20];
        let mut off = 0u64;
        while off < written {
            let n = (written - off).min(buf.len() as u64) as usize;
            f.read_exact_at(&mut buf[..n], off).map_err(io(&partial))?;
            hasher.update(&buf[..n]);
            off += n as u64;
        }
        f.set_len(written).map_err(io(&partial))?;
        start = written;
        f
    } else {
        std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&partial).map_err(io(&partial))?
    };
    done.fetch_add(start, Ordering::Relaxed);
    // Three stages overlap: this thread reads the view, one thread writes (and makes the
    // writes durable, updating the checkpoint), one hashes, in order.
    let chunk = opts.chunk.max(4096);
    let sync_each = std::env::var_os("XPACKFS_TEST_SYNC_EVERY_CHUNK").is_some();
    let (wtx, wrx) = std::sync::mpsc::sync_channel::<(u64, Arc<Vec<u8>>)>(4);
    let (htx, hrx) = std::sync::mpsc::sync_channel::<Arc<Vec<u8>>>(4);
    let hasher_thread = std::thread::spawn(move || {
        for b in hrx {
            hasher.update(&b[..]);
        }
        hasher
    });
    let writer = {
        let (f, partial, ckpt) = (f.try_clone().map_err(io(&partial))?, partial.clone(), ckpt.clone());
        std::thread::spawn(move || -> Result<(), MaterializeError> {
            let mut since_sync = 0u64;
            for (off, b) in wrx {
                f.write_all_at(&b, off).map_err(io(&partial))?;
                since_sync += b.len() as u64;
                if since_sync >= SYNC_EVERY || sync_each {
                    f.sync_data().map_err(io(&partial))?;
                    write_atomic(&ckpt, json!({"durable_bytes": off + b.len() as u64, "size": size}).to_string().as_bytes()).map_err(io(&ckpt))?;
                    since_sync = 0;
                }
            }
            Ok(())
        })
    };
    let mut off = start;
    let mut read_err = None;
    while off < size {
        let want = ((size - off) as usize).min(chunk);
        let mut buf = vec![0u8; want];
        match file.read_at(off, &mut buf) {
            Ok(0) => {
                read_err = Some(MaterializeError::Refused(format!("{name}: view ended at {off} of {size} bytes")));
                break;
            }
            Ok(n) => {
                buf.truncate(n);
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
    let write_result = writer.join().map_err(|_| MaterializeError::Refused(format!("{name}: writer thread panicked")))?;
    let hasher = hasher_thread.join().map_err(|_| MaterializeError::Refused(format!("{name}: hasher thread panicked")))?;
    write_result?;
    if let Some(e) = read_err {
        return Err(e);
    }
    f.sync_all().map_err(io(&partial))?;
    drop(f);
    if final_path.exists() && !opts.replace {
        return Err(MaterializeError::Refused(format!("{} already exists (use --replace)", final_path.display())));
    }
    std::fs::rename(&partial, &final_path).map_err(io(&final_path))?;
    let _ = std::fs::remove_file(&ckpt);
    fsync_dir(&parent).map_err(io(&parent))?;
    Ok(FileResult { name: name.into(), size, sha256: crate::digest::hex(&hasher.finalize()), resumed_from: start, skipped: false })
}

fn hash_disk(path: &Path) -> Result<String, MaterializeError> {
    let f = std::fs::File::open(path).map_err(io(path))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 8 << 20];
    let mut off = 0u64;
    loop {
        let n = f.read_at(&mut buf, off).map_err(io(path))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        off += n as u64;
    }
    Ok(crate::digest::hex(&h.finalize()))
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
    } else if !opts.replace {
        if let Some((p, _)) = files.iter().find(|(p, _)| out.join(p).exists() || partial_paths(out, p).0.exists()) {
            return Err(MaterializeError::Refused(format!(
                "{} already exists in {} (use --resume to continue, --replace to overwrite)",
                p,
                out.display()
            )));
        }
    }
    write_atomic(&state_path, json!({"source": identity, "files": files.iter().map(|(p, f)| json!({"name": p, "size": f.size()})).collect::<Vec<_>>()}).to_string().as_bytes())
        .map_err(io(&state_path))?;

    let total: u64 = files.iter().map(|(_, f)| f.size()).sum();
    let already: u64 = files
        .iter()
        .map(|(p, f)| if out.join(p).exists() && opts.resume { f.size() } else { 0 })
        .sum();
    let free = free_bytes(out)?;
    if free < (total - already) + opts.margin {
        return Err(MaterializeError::Refused(format!(
            "insufficient free space in {}: {free} bytes free, {} to write plus a {} byte margin",
            out.display(),
            total - already,
            opts.margin
        )));
    }

    let done = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let bar = opts.progress.then(|| {
        let b = indicatif::ProgressBar::new(total);
        b.set_style(
            indicatif::ProgressStyle::with_template("{bar:40} {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        b
    });
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reporter = {
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
    let results: Result<Vec<FileResult>, MaterializeError> =
        files.par_iter().map(|(name, f)| write_one(out, name, f, opts, &done)).collect();
    stop.store(true, Ordering::Relaxed);
    let _ = reporter.join();
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    let results = results?;
    if opts.verify {
        for r in &results {
            let p = out.join(&r.name);
            let disk = hash_disk(&p)?;
            if disk != r.sha256 {
                return Err(MaterializeError::Refused(format!("verify: {} hashes to {disk}, {} was written", p.display(), r.sha256)));
            }
        }
        verify_manifests(out, &results)?;
    }
    let _ = std::fs::remove_file(&state_path);
    remove_leftovers(out);
    fsync_dir(out).map_err(io(out))?;
    Ok(results)
}

/// Remove what interrupted runs of ours can leave: partial files, their checkpoints, and
/// temporary files of atomic writes (`.<name>.tmp.<pid>`).
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

/// Check the digests the views' manifests declare against the written files.
fn verify_manifests(out: &Path, results: &[FileResult]) -> Result<(), MaterializeError> {
    let sha: std::collections::HashMap<&str, &str> = results.iter().map(|r| (r.name.as_str(), r.sha256.as_str())).collect();
    let read = |name: &str| -> Option<Value> { serde_json::from_slice(&std::fs::read(out.join(name)).ok()?).ok() };
    for r in results {
        if let Some(pack) = r.name.strip_suffix(".manifest.json").filter(|p| p.ends_with(".pack")) {
            let m = read(&r.name).ok_or_else(|| MaterializeError::Refused(format!("verify: {} is not JSON", r.name)))?;
            if m["pack_sha256"].as_str() != sha.get(pack).copied() {
                return Err(MaterializeError::Refused(format!("verify: {pack} does not match pack_sha256 in {}", r.name)));
            }
        }
        if r.name == crate::view::bf16_cache::MANIFEST_NAME {
            let m = read(&r.name).ok_or_else(|| MaterializeError::Refused(format!("verify: {} is not JSON", r.name)))?;
            for f in m["files"].as_array().into_iter().flatten() {
                let name = f["name"].as_str().unwrap_or("");
                if f["sha256"].as_str() != sha.get(name).copied() {
                    return Err(MaterializeError::Refused(format!("verify: {name} does not match its digest in {}", r.name)));
                }
            }
        }
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
