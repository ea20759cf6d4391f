//! Serving views over FUSE: the FUSE-free filesystem logic (`fs`), the thin fuser
//! adapter (`fuse`), mount options (`options`) and process plumbing (`daemon`).

pub mod daemon;
pub mod fs;
pub mod fuse;
pub mod options;

use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use fuser::{Config, MountOption, Session, SessionACL};
use parking_lot::Mutex;

use crate::digest::DigestStore;
use crate::source::Source;
use crate::view::{expert_pack, Tree, ViewError};
use fs::{Fs, Ownership};
use options::MountOptions;

/// Build the view tree a mount of `source` with `opts` serves.
pub fn build_tree(source: &Source, opts: &MountOptions) -> Result<Tree, ViewError> {
    build_tree_with_cache(source, opts, Arc::new(crate::view::cache::ChunkCache::new(opts.cache_mb << 20)))
}

pub fn build_tree_with_cache(source: &Source, opts: &MountOptions, cache: Arc<crate::view::cache::ChunkCache>) -> Result<Tree, ViewError> {
    let store = DigestStore::from_option(opts.digest_store.as_deref());
    let view = match opts.view.as_str() {
        "auto" if source.safetensors().is_some() => "bf16-cache",
        "auto" => "expert-pack",
        v => v,
    };
    match view {
        "expert-pack" => expert_pack::build(source, &store, &opts.pack),
        "bf16-cache" => crate::view::bf16_cache::build(source, &store, cache),
        "requant" => crate::view::requant::build(source, &store, cache, &opts.recipe),
        "kt-int8" => crate::view::kt_int8::build(source, &store, cache, opts.numa_count),
        other => Err(ViewError::Option { option: "view", rule: format!("unknown view {other:?}") }),
    }
}

/// Owner, read bits and mtime of the served files come from the source (file or directory).
pub fn ownership_of(path: &Path) -> std::io::Result<Ownership> {
    let m = std::fs::metadata(path)?;
    Ok(Ownership {
        uid: m.uid(),
        gid: m.gid(),
        read_bits: (m.mode() & 0o444) as u16,
        mtime: m.modified().unwrap_or(std::time::UNIX_EPOCH),
    })
}

fn fd_mountpoint(mountpoint: &str) -> Option<i32> {
    mountpoint.strip_prefix("/dev/fd/")?.parse().ok()
}

/// `major:minor` of the filesystem mounted at `mountpoint`, from /proc/self/mountinfo
/// (a `stat` of the mountpoint would send a FUSE request before the session runs).
fn mount_device(mountpoint: &Path) -> Option<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let want = mountpoint.to_string_lossy();
    info.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            (f.len() > 4 && f[4] == want).then(|| f[2].to_string())
        })
        .last()
}

/// Set the mount's readahead through its backing-device entry in sysfs.
fn set_read_ahead(mountpoint: &Path, kb: u32) {
    let Some(dev) = mount_device(mountpoint) else {
        tracing::warn!("read_ahead_kb: {} not found in /proc/self/mountinfo", mountpoint.display());
        return;
    };
    let path = format!("/sys/class/bdi/{dev}/read_ahead_kb");
    match std::fs::write(&path, kb.to_string()) {
        Ok(()) => tracing::info!("read_ahead_kb={kb} set in {path}"),
        Err(e) => tracing::warn!("could not set {path}: {e}"),
    }
}

/// Mount and serve until unmounted or signalled. `ready` is told once the mount is live.
pub fn mount(source_path: &Path, mountpoint: &str, mut opts: MountOptions, ready: &mut daemon::Readiness) -> Result<(), String> {
    let fd_mode = fd_mountpoint(mountpoint);
    let mount_path = match fd_mode {
        Some(_) => opts.mountpoint_path.clone().unwrap_or_else(|| PathBuf::from(mountpoint)),
        None => std::fs::canonicalize(mountpoint).map_err(|e| format!("mountpoint {mountpoint}: {e}"))?,
    };
    opts.pack.pack_dir = opts.mountpoint_path.clone().unwrap_or_else(|| mount_path.clone());

    let cache = Arc::new(crate::view::cache::ChunkCache::new(opts.cache_mb << 20));
    let int8_tree = crate::view::kt_int8::tree::is_int8_tree(source_path);
    let want_stats = opts.stats.unwrap_or(!int8_tree && opts.view != "kt-int8");
    let mut tree = if int8_tree {
        crate::view::kt_int8::tree::build(source_path, opts.verify_hashes).map_err(|e| e.to_string())?
    } else {
        let source = Source::open(source_path).map_err(|e| e.to_string())?;
        build_tree_with_cache(&source, &opts, cache.clone()).map_err(|e| e.to_string())?
    };
    let owner = ownership_of(source_path).map_err(|e| format!("{}: {e}", source_path.display()))?;
    let stats: Arc<fs::Stats> = Arc::default();
    let stats_json = stats_content(stats.clone(), cache.clone(), tree.vfiles().count());
    if want_stats {
        let hidden = tree.add_dir(crate::view::ROOT_INO, ".xpackfs");
        tree.add_dynamic(hidden, "stats.json", stats_json.clone());
    }
    {
        let stats_json = stats_json.clone();
        std::thread::spawn(move || loop {
            std::thread::sleep(std::time::Duration::from_secs(60));
            if tracing::enabled!(tracing::Level::DEBUG) {
                tracing::debug!("stats: {}", String::from_utf8_lossy(&stats_json()));
            }
        });
    }
    let fs = Arc::new(Fs::with_stats(tree, owner, stats));
    // Building a large view (the INT8 tree of a full-size model has 66,000 files; manifest
    // lengths are computed by rendering them once) leaves freed heap behind: give it back.
    #[cfg(target_env = "gnu")]
    unsafe {
        libc::malloc_trim(0);
    }
    // Passthrough only where files are whole source files (INT8 tree mounts).
    let passthrough_files = fs.tree().vfiles().any(|f| f.whole_source().is_some());
    let adapter = fuse::FuseAdapter {
        fs: fs.clone(),
        max_read: opts.max_read,
        max_background: opts.max_background,
        direct_io: opts.direct_io,
        source_io: opts.source_io,
        direct_pool: fuse::direct_pool(opts.direct_threads).map_err(|e| format!("direct I/O threads: {e}"))?,
        async_dio: opts.async_dio,
        direct_piece: opts.direct_piece_kb << 10,
        passthrough: Arc::new(fuse::Passthrough::new(opts.passthrough && passthrough_files)),
        passthrough_files,
        mount_path: mount_path.clone(),
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
    config.n_threads = Some(opts.threads);
    config.clone_fd = opts.clone_fd;

    let session = match fd_mode {
        Some(fd) => {
            let owned = unsafe { OwnedFd::from_raw_fd(fd) };
            Session::from_fd(adapter, owned, config.acl, config)
        }
        None => Session::new(adapter, &mount_path, &config),
    }
    .map_err(|e| format!("mounting on {}: {e}", mount_path.display()))?;
    if let (Some(kb), None) = (opts.read_ahead_kb, fd_mode) {
        set_read_ahead(&mount_path, kb);
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
    tracing::info!("mounted {} on {} ({} files)", source_path.display(), mount_path.display(), fs.tree().vfiles().count());
    ready.ready(opts.log_file.as_deref());
    // Returns only on errors: a normal end (the kernel unmounted) exits in `destroy`.
    session.run().map_err(|e| format!("FUSE session: {e}"))?;
    Ok(())
}

/// `/.xpackfs/stats.json`: counters of the mount, generated at each read.
fn stats_content(stats: Arc<fs::Stats>, cache: Arc<crate::view::cache::ChunkCache>, files: usize) -> crate::view::tree::DynamicContent {
    use std::sync::atomic::Ordering::Relaxed;
    let started = std::time::Instant::now();
    Arc::new(move || {
        let c = &cache.stats;
        let v = serde_json::json!({
            "uptime_s": started.elapsed().as_secs_f64(),
            "files": files,
            "reads": stats.reads.load(Relaxed),
            "bytes_served": stats.bytes_served.load(Relaxed),
            "read_errors": stats.read_errors.load(Relaxed),
            "read_latency_us": {
                "p50": stats.latency_quantile(0.50),
                "p90": stats.latency_quantile(0.90),
                "p99": stats.latency_quantile(0.99),
                "max": stats.latency_quantile(1.0),
                "note": "upper bounds of power-of-two buckets",
            },
            "cache": {
                "budget_bytes": cache.budget(),
                "bytes": cache.bytes(),
                "hits": c.hits.load(Relaxed),
                "misses": c.misses.load(Relaxed),
                "waits": c.waits.load(Relaxed),
                "evictions": c.evictions.load(Relaxed),
                "bytes_computed": c.bytes_computed.load(Relaxed),
            },
        });
        let mut s = serde_json::to_string_pretty(&v).unwrap_or_default();
        s.push('\n');
        s.into_bytes()
    })
}
