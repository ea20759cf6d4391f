//! Serving a built view over FUSE: the FUSE-free filesystem logic (`fs`), the thin fuser
//! adapter (`fuse`), the passthrough state machine (`passthrough`), the read pools
//! (`pools`), serving options (`options`) and process plumbing (`daemon`). This layer knows
//! views only as a [`Built`] tree, the chunk [`Tiers`] it computes through and the `warm`
//! driver (`prewarm=on` starts a background warm-up of the disk cache once the mount is
//! live); which view and how it was built is `view`'s business. The storage layer it reaches
//! only through `store`'s re-exports (file entries for passthrough, the tiers' counters for
//! `/.xpackfs/stats.json`).

pub mod daemon;
pub mod fs;
pub mod fuse;
pub mod metrics;
pub mod options;
pub mod passthrough;
pub mod pools;

use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use fuser::{Config, MountOption, Session, SessionACL};
use parking_lot::Mutex;

use crate::store::{DiskMode, FileEntries, Priority, file_entry_key};
use crate::view::{Built, Tiers, warm};
use fs::{Fs, Ownership};
use options::ServeOptions;

#[derive(Debug, thiserror::Error)]
pub enum MountError {
    #[error("mountpoint {}: {source}", path.display())]
    Mountpoint { path: PathBuf, source: std::io::Error },
    #[error("mountpoint {}: not a directory", path.display())]
    NotADirectory { path: PathBuf },
    #[error("mountpoint {}: not an open /dev/fuse descriptor", path.display())]
    NotFuseFd { path: PathBuf },
    #[error("{}: {source}", path.display())]
    Source { path: PathBuf, source: std::io::Error },
    #[error("mounting on {}: {source}", path.display())]
    Mount { path: PathBuf, source: std::io::Error },
    #[error("FUSE session: {0}")]
    Session(std::io::Error),
    /// A read pool's threads could not be started.
    #[error("read pool threads: {0}")]
    Threads(#[source] std::io::Error),
    /// The metrics endpoint (`metrics=ADDR:PORT`) could not listen on its address.
    #[error("metrics endpoint {addr}: {source}")]
    Metrics { addr: std::net::SocketAddr, source: std::io::Error },
}

/// Where the kernel mounts: the canonical mountpoint, which must be a directory, or
/// `/dev/fd/N` (the /dev/fuse descriptor `mount.fuse3 -o drop_privileges` passes).
fn mount_target(mountpoint: &str) -> Result<PathBuf, MountError> {
    if let Some(fd) = fd_mountpoint(mountpoint) {
        check_fuse_fd(mountpoint, fd)?;
        return Ok(PathBuf::from(mountpoint));
    }
    let p = std::fs::canonicalize(mountpoint).map_err(|e| MountError::Mountpoint { path: mountpoint.into(), source: e })?;
    let meta = std::fs::metadata(&p).map_err(|e| MountError::Mountpoint { path: p.clone(), source: e })?;
    if !meta.is_dir() {
        return Err(MountError::NotADirectory { path: p });
    }
    Ok(p)
}

/// The path the mount is seen at, which manifests name: `mountpoint_path` when given, else
/// the mount target.
pub fn mount_location(mountpoint: &str, opts: &ServeOptions) -> Result<PathBuf, MountError> {
    match &opts.mountpoint_path {
        Some(p) => Ok(p.clone()),
        None => mount_target(mountpoint),
    }
}

/// Owner, read bits and mtime of the served files come from the source (file or directory);
/// a remote source's files belong to the user who mounted it, readable by all, dated at the
/// mount.
pub fn ownership_of(path: &Path) -> std::io::Result<Ownership> {
    if crate::source::remote::is_remote(path) {
        // SAFETY: geteuid/getegid cannot fail and touch no memory.
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        return Ok(Ownership { uid, gid, read_bits: 0o444, mtime: std::time::SystemTime::now() });
    }
    let m = std::fs::metadata(path)?;
    Ok(Ownership { uid: m.uid(), gid: m.gid(), read_bits: (m.mode() & 0o444) as u16, mtime: m.modified().unwrap_or(std::time::UNIX_EPOCH) })
}

/// `/dev/fd/N` must be an open descriptor of /dev/fuse (character device 10:229): anything
/// else would be served nothing, silently.
fn check_fuse_fd(mountpoint: &str, fd: i32) -> Result<(), MountError> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let is_fuse = std::fs::metadata(format!("/proc/self/fd/{fd}"))
        .is_ok_and(|m| m.file_type().is_char_device() && libc::major(m.rdev()) == 10 && libc::minor(m.rdev()) == 229);
    if !is_fuse {
        return Err(MountError::NotFuseFd { path: mountpoint.into() });
    }
    Ok(())
}

fn fd_mountpoint(mountpoint: &str) -> Option<i32> {
    mountpoint.strip_prefix("/dev/fd/")?.parse().ok()
}

/// `major:minor` of the filesystem mounted at `mountpoint`, from /proc/self/mountinfo
/// (a `stat` of the mountpoint would send a FUSE request before the session runs).
fn mount_device(mountpoint: &Path) -> Option<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let want = mountpoint.to_string_lossy();
    info.lines().rev().find_map(|l| {
        let f: Vec<&str> = l.split(' ').collect();
        (f.len() > 4 && f[4] == want).then(|| f[2].to_string())
    })
}

/// Requests of readahead in flight for views with copies of source bytes in the mount's
/// page cache ([`Fs::is_source_copy`]).
const SOURCE_COPIES_READ_AHEAD_REQUESTS: u32 = 8;

/// The kernel's readahead requests in flight (`max_background`) for mounts of remote files,
/// unless set: with fuser's 16, most of 64 concurrent readers waited for a slot.
const REMOTE_MAX_BACKGROUND: u16 = 64;

/// Set the mount's readahead through its backing-device entry in sysfs.
/// (Writing it needs root.) Whether it was set.
fn set_read_ahead(mountpoint: &Path, kb: u32) -> bool {
    let Some(dev) = mount_device(mountpoint) else {
        tracing::warn!("read_ahead_kb: {} not found in /proc/self/mountinfo", mountpoint.display());
        return false;
    };
    let path = format!("/sys/class/bdi/{dev}/read_ahead_kb");
    match std::fs::write(&path, kb.to_string()) {
        Ok(()) => {
            tracing::info!("read_ahead_kb={kb} set in {path}");
            true
        }
        Err(e) => {
            tracing::warn!("could not set {path}: {e}");
            false
        }
    }
}

/// Mount `built` (the view of `source_path`) on `mountpoint` and serve it until unmounted or
/// signalled. `ready` is told once the mount is live. `tiers` are the chunk tiers the view
/// computes through; with `prewarm`, every chunk is computed ahead into their disk cache in
/// the background.
pub fn mount(
    source_path: &Path,
    mountpoint: &str,
    built: Built,
    tiers: Arc<Tiers>,
    tier_opts: &crate::store::Options,
    opts: &ServeOptions,
    ready: &mut daemon::Readiness,
) -> Result<(), MountError> {
    let fd_mode = fd_mountpoint(mountpoint);
    let mount_path = match fd_mode {
        Some(_) => mount_location(mountpoint, opts)?,
        None => mount_target(mountpoint)?,
    };
    let Built { mut tree, view, .. } = built;
    let want_stats = opts.stats.unwrap_or(!view.exclusive_root());
    let owner = ownership_of(source_path).map_err(|e| MountError::Source { path: source_path.to_path_buf(), source: e })?;
    let stats: Arc<fs::Stats> = Arc::default();
    // File entries only help a mount that can pass them through to the kernel.
    let files = if opts.passthrough { FileEntries::of(&tiers, tier_opts.disk_cache_files) } else { None };
    // Passthrough where files are whole source files (INT8 tree mounts) or can be kept
    // whole in the disk cache.
    let passthrough_files = tree.vfiles().any(|f| f.whole_source().is_some());
    let file_entries = files.is_some() && tree.vfiles().any(|f| file_entry_key(&**f).is_some());
    let passthrough = Arc::new(passthrough::Passthrough::new(opts.passthrough && (passthrough_files || file_entries)));
    let stats_json = stats_content(stats.clone(), tiers.clone(), tree.vfiles().count(), files.clone(), passthrough.clone());
    if want_stats {
        let hidden = tree.add_dir(crate::view::ROOT_INO, ".xpackfs");
        tree.add_dynamic(hidden, "stats.json", stats_json.clone());
    }
    if let Some(addr) = opts.metrics {
        // Bound before mounting: an address in use refuses the mount, and mounts nothing.
        let registry = metrics::registry(&stats, tiers.clone(), tree.vfiles().count(), files.clone(), passthrough.clone());
        metrics::serve(addr, Arc::new(registry)).map_err(|e| MountError::Metrics { addr, source: e })?;
    }
    let fs = Arc::new(Fs::with_stats(tree, owner, stats).with_file_entries(files));
    {
        // Every minute: the debug log line, and the use time of the file entries being
        // passed through (a file mmapped for days sends no opens and no reads to the daemon).
        let (stats_json, passthrough, fs) = (stats_json.clone(), passthrough.clone(), fs.clone());
        std::thread::spawn(move || {
            loop {
                std::thread::sleep(std::time::Duration::from_secs(60));
                if tracing::enabled!(tracing::Level::DEBUG) {
                    tracing::debug!("stats: {}", String::from_utf8_lossy(&stats_json()));
                }
                passthrough.live_inodes().into_iter().for_each(|ino| fs.in_use(ino));
            }
        });
    }
    // Building a large view (the INT8 tree of a full-size model has 66,000 files; manifest
    // lengths are computed by rendering them once) leaves freed heap behind: give it back.
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only returns free heap pages to the kernel; no pointer is touched.
    unsafe {
        libc::malloc_trim(0);
    }
    let has_computed = fs.has_computed();
    let remote = fs.reads_remote();
    // Remote files: more of the kernel's readahead requests in flight, so that 64 readers'
    // requests wait on the network together (64 readers of a remote INT8 tree, with the
    // 1 MiB readahead below: 1.2-1.3x faster than with fuser's 16 and the kernel's 128 KiB).
    // The wait pool stays at 32 threads: 80 (a thread per request in flight) showed no gain,
    // for 64 remote objects or for the pack.
    let max_background = opts.max_background.or(remote.then_some(REMOTE_MAX_BACKGROUND));
    // Copies of source bytes are kept in the mount's page cache with direct_io=off, and
    // with auto once the mount's readahead is set below (or the kernel cannot mmap direct-io
    // files, see `FuseAdapter::init`).
    let cache_copies = Arc::new(std::sync::atomic::AtomicBool::new(opts.direct_io.forced() == Some(false)));
    let adapter = fuse::FuseAdapter {
        cache_copies: cache_copies.clone(),
        remote_direct: opts.direct_io.forced().is_none(),
        fs: fs.clone(),
        max_read: opts.max_read,
        max_background,
        direct_io: opts.direct_io.forced(),
        source_io: opts.source_io.0,
        direct_pool: pools::read_pool("dio", opts.direct_threads).map_err(MountError::Threads)?,
        async_dio: opts.async_dio,
        direct_piece: opts.direct_piece_kb << 10,
        passthrough,
        passthrough_files,
        mount_path: mount_path.clone(),
        // Reads that may wait (for a chunk, or for the network) are handed to a pool when they
        // would: 64 readers of a remote INT8 tree through the two FUSE workers alone fetched
        // two parts at a time.
        waiting: if has_computed || remote { pools::read_pool("wait", pools::WAITING_THREADS).map_err(MountError::Threads)? } else { None },
    };

    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::RO,
        MountOption::FSName(source_path.to_string_lossy().into_owned()),
        MountOption::CUSTOM("subtype=xpackfs".into()),
        MountOption::NoDev,
        MountOption::NoSuid,
        MountOption::DefaultPermissions,
    ];
    if opts.auto_unmount {
        config.mount_options.push(MountOption::AutoUnmount);
    }
    config.acl = if opts.allow_other {
        SessionACL::All
    } else if opts.allow_root || opts.auto_unmount {
        SessionACL::RootAndOwner
    } else {
        SessionACL::Owner
    };
    config.n_threads = Some(opts.threads());
    config.clone_fd = opts.clone_fd;

    let session = match fd_mode {
        Some(fd) => {
            // SAFETY: `fd` is the /dev/fuse descriptor mount.fuse3 passed us as /dev/fd/N; it
            // is open and nothing else in this process owns it.
            let owned = unsafe { OwnedFd::from_raw_fd(fd) };
            Session::from_fd(adapter, owned, config.acl, config)
        }
        None => Session::new(adapter, &mount_path, &config),
    }
    .map_err(|e| MountError::Mount { path: mount_path.clone(), source: e })?;
    // The mount's page cache is filled by the kernel's readahead, one request per max_read.
    // Copies of source bytes kept there read their source with direct I/O, which the source
    // device's readahead does not reach: eight requests in flight keep its queue full (a
    // cold whole-pack read ran at 0.64-0.80x a local copy, at 0.28x with the kernel's
    // 128 KiB; 16 or 32 requests were no faster). Computed files: one request (a warm read
    // of the BF16 view ran 1.3-1.6x faster than with 128 KiB; cold reads the same, and no
    // faster with eight, which views with both get).
    let copies = fs.has_source_copies() && opts.direct_io.forced() != Some(true);
    let read_ahead = opts.read_ahead_kb.or_else(|| {
        let requests = if copies {
            SOURCE_COPIES_READ_AHEAD_REQUESTS
        } else if has_computed || remote {
            // Whole remote files: one request ahead, as large as a read (the kernel's 128 KiB
            // made eight requests per MiB, each a trip through the parts tier).
            1
        } else {
            return None;
        };
        Some(requests * opts.max_read / 1024)
    });
    let read_ahead_set = match (read_ahead, fd_mode) {
        (Some(kb), None) => set_read_ahead(&mount_path, kb),
        _ => false,
    };
    if copies && opts.direct_io.forced().is_none() {
        if read_ahead_set {
            cache_copies.store(true, std::sync::atomic::Ordering::Relaxed);
        } else {
            // Without it the copies would be read in 128 KiB requests: they are read
            // through the daemon instead (FOPEN_DIRECT_IO), from the source's page cache.
            tracing::info!("direct_io=auto: the mount's readahead is not set, so the files of source bytes are read through the daemon");
        }
    }

    let mut session = session;
    let unmounter = Arc::new(Mutex::new(session.unmount_callable()));
    {
        let unmounter = unmounter.clone();
        let fd_mode = fd_mode.is_some();
        std::thread::spawn(move || {
            let sig = daemon::wait_for_signal();
            tracing::info!("signal {sig}: unmounting");
            let _ = sd_notify::notify(&[sd_notify::NotifyState::Stopping]);
            if fd_mode || unmounter.lock().unmount().is_err() {
                std::process::exit(0);
            }
        });
    }
    tracing::info!(
        "mounted {} on {} ({} view, {} files; codecs: SIMD {})",
        source_path.display(),
        mount_path.display(),
        view.name(),
        fs.tree().vfiles().count(),
        crate::codec::simd::describe()
    );
    ready.ready(opts.log_file.as_deref());
    if tier_opts.prewarm {
        start_prewarm(fs.tree().files(), tiers, fs.file_entries().cloned());
    }
    // Returns only on errors: a normal end (the kernel unmounted) exits in `destroy`.
    session.run().map_err(MountError::Session)?;
    Ok(())
}

/// Compute every persistent chunk of the view into the disk cache, on the background pool
/// (niced, idle I/O class): reads run first, and a read that needs a chunk being warmed
/// promotes it.
fn start_prewarm(files: Vec<(String, Arc<crate::view::VirtualFile>)>, tiers: Arc<Tiers>, entries: Option<Arc<FileEntries>>) {
    let Some(disk) = tiers.disk.clone() else {
        tracing::warn!("prewarm=on needs a disk cache (disk_cache=DIR): not prewarming");
        return;
    };
    if disk.mode() != DiskMode::ReadWrite {
        tracing::warn!("prewarm=on: the disk cache {} is {}: not prewarming", disk.config().dir.display(), disk.mode().name());
        return;
    }
    let spawned = std::thread::Builder::new().name("xpackfs-prewarm".into()).spawn(move || {
        let items = warm::plan(&files);
        let need = warm::disk_bytes(&items);
        if need > disk.budget() {
            tracing::warn!("prewarm: the view's computed chunks take {need} bytes on disk, more than the disk cache's bound of {} (disk_cache_gb): older ones will be evicted", disk.budget());
        }
        tracing::info!("prewarm: {} chunk groups, {need} bytes, into {}", items.len(), disk.config().dir.display());
        let r = warm::run(&tiers, &items, Priority::Background, &warm::Progress::default());
        tracing::info!("prewarm done in {:.1}s: {} computed, {} already present, {} failed", r.seconds, r.computed, r.present, r.failed);
        if let Some(e) = entries {
            let f = warm::write_files(&tiers, &e, &files, Priority::Background);
            tracing::info!("prewarm: {} files kept whole ({} bytes), {} already, {} not", f.written, f.bytes, f.present, f.skipped);
        }
    });
    if let Err(e) = spawned {
        tracing::warn!("prewarm: cannot start its thread: {e}");
    }
}

/// `/.xpackfs/stats.json`: counters of the mount, generated at each read from the same
/// metrics the Prometheus endpoint renders ([`metrics::registry`]).
fn stats_content(
    stats: Arc<fs::Stats>,
    tiers: Arc<Tiers>,
    files: usize,
    entries: Option<Arc<FileEntries>>,
    passthrough: Arc<passthrough::Passthrough>,
) -> crate::view::tree::DynamicContent {
    use std::sync::atomic::Ordering::Relaxed;
    let started = std::time::Instant::now();
    Arc::new(move || {
        let counts = stats.counts.snapshot();
        let v = serde_json::json!({
            "uptime_s": started.elapsed().as_secs_f64(),
            "codec_simd": crate::codec::simd::describe(),
            "files": files,
            "reads": counts.reads,
            "bytes_served": counts.bytes_served,
            "read_errors": counts.read_errors,
            "direct_reads": counts.direct_reads,
            "direct_bytes": counts.direct_bytes,
            "bytes_held": counts.bytes_held,
            "bytes_served_by_origin": stats.served_json(),
            "read_latency_us": {
                "p50": stats.latency_quantile(0.50),
                "p90": stats.latency_quantile(0.90),
                "p99": stats.latency_quantile(0.99),
                "max": stats.latency_quantile(1.0),
                "note": "upper bounds of power-of-two buckets",
            },
            "op_errors": stats.op_errors_json(),
            "cache": tiers.mem.snapshot(),
            "disk_cache": tiers.disk.as_ref().map(|d| d.snapshot()),
            "passthrough": {
                "enabled": passthrough.is_enabled(),
                "opens": passthrough.opens.load(Relaxed),
                "file_entries": entries.is_some(),
                "file_entries_pending": entries.as_ref().map_or(0, |e| e.pending()),
            },
            "compute": tiers.compute_snapshot(),
            "remote": crate::source::remote::stats::snapshot(),
        });
        let mut s = serde_json::to_string_pretty(&v).unwrap_or_default();
        s.push('\n');
        s.into_bytes()
    })
}
