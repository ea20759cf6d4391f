//! `xpackfs warm`: compute a view (or some of its files) into the disk cache ahead of any
//! mount, on every core, with a progress bar (bytes, ETA); resumable (what is on disk
//! already is skipped); `--nice` runs it on the niced, idle-I/O pool instead.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use super::AllOptions;
use crate::store::{DiskMode as Mode, FileEntries, Priority};
use crate::util::ticker::Shown;
use crate::view::{self, Context, Input, Purpose, VirtualFile, warm};

#[derive(Debug, clap::Args)]
pub struct WarmArgs {
    /// GGUF file (or any part of a split set) or safetensors checkpoint
    pub(super) source: PathBuf,
    /// Files or directories of the view to warm, as paths inside it (default: all of it)
    pub(super) paths: Vec<String>,
    /// Low priority: the computing threads run niced (19) and in the idle I/O class
    #[arg(long)]
    pub(super) nice: bool,
    /// Print a JSON summary at the end
    #[arg(long)]
    pub(super) json: bool,
    #[command(flatten)]
    pub(super) options: AllOptions,
}

type Files = Vec<(String, Arc<VirtualFile>)>;

/// The files `paths` name (a file, or everything under a directory), in view order.
fn select(files: Files, paths: &[String]) -> Result<Files, String> {
    if paths.is_empty() {
        return Ok(files);
    }
    let wanted: Vec<String> = paths.iter().map(|p| p.trim_matches('/').to_string()).collect();
    for w in &wanted {
        if !files.iter().any(|(name, _)| name == w || name.starts_with(&format!("{w}/")) || w.is_empty()) {
            return Err(format!("{w:?} is not a file or directory of the view"));
        }
    }
    Ok(files.into_iter().filter(|(name, _)| wanted.iter().any(|w| w.is_empty() || name == w || name.starts_with(&format!("{w}/")))).collect())
}

/// A progress bar on a terminal, else a log line every 10 s, until dropped.
fn shown(total: u64, progress: Arc<warm::Progress>) -> Shown {
    Shown::start("warm", total, crate::materialize::stderr_is_terminal(), move || progress.bytes.load(Relaxed))
}

pub fn run(a: WarmArgs) -> i32 {
    super::init_logging(a.options.serve.debug);
    a.options.view.remote.apply();
    let result = (|| -> Result<bool, String> {
        let opts = &a.options.view;
        let dir = opts.tiers.disk_cache.as_ref().ok_or("warm needs a disk cache: -o disk_cache=DIR")?;
        let location = std::env::current_dir().unwrap_or_default();
        let command = std::env::args().collect::<Vec<_>>().join(" ");
        let ctx = Context::new(Purpose::Materialize, location, command, opts).map_err(|e| e.to_string())?;
        let disk = ctx.tiers.disk.clone().ok_or("warm needs a disk cache: -o disk_cache=DIR")?;
        if disk.mode() != Mode::ReadWrite {
            return Err(format!("disk cache {} is {}: nothing can be warmed into it", dir.display(), disk.mode().name()));
        }
        let input = Input::open(&a.source).map_err(|e| e.to_string())?;
        let built = view::build(input, opts, &ctx).map_err(|e| e.to_string())?;
        let files = select(built.tree.files(), &a.paths)?;
        let items = warm::plan(&files);
        let total: u64 = items.iter().map(|i| i.bytes).sum();
        let entries = FileEntries::of(&ctx.tiers, opts.tiers.disk_cache_files);
        // A remote source: what the files serve of it as it is, fetched into the cache first.
        let remote = warm::remote_ranges(&files);
        let need = warm::disk_bytes(&items)
            + if entries.is_some() { warm::file_bytes(&files) } else { 0 }
            + warm::fetched_disk_bytes(&remote, crate::source::remote::parts::part_size());
        if need > disk.budget() {
            tracing::warn!(
                "the chunks, fetched parts and whole files to warm take {need} bytes in the disk cache, more than its bound of {} (disk_cache_gb): older entries are evicted while warming and the cache will not hold all of them",
                disk.budget()
            );
        }
        if items.is_empty() {
            tracing::info!("the {} view has no computed chunks to keep: nothing to warm", built.view.name());
        }
        let fetched = if remote.is_empty() {
            None
        } else {
            let total: u64 = remote.iter().flat_map(|(_, v)| v.iter().map(|(a, b)| b - a)).sum();
            let progress = Arc::new(warm::Progress::default());
            let report = {
                let _bar = shown(total, progress.clone());
                warm::fetch_sources(&remote, &progress)
            };
            if !a.json {
                eprintln!(
                    "fetched {} bytes of {} remote source files into {} in {:.1}s ({:.2} GB/s), {} failed",
                    report.bytes,
                    report.items,
                    dir.display(),
                    report.seconds,
                    report.bytes as f64 / report.seconds.max(1e-9) / 1e9,
                    report.failed
                );
            }
            Some(report)
        };
        let prio = if a.nice { Priority::Background } else { Priority::Read };
        let progress = Arc::new(warm::Progress::default());
        let report = {
            let _bar = shown(total, progress.clone());
            warm::run(&ctx.tiers, &items, prio, &progress)
        };
        let files_report = entries.map(|e| warm::write_files(&ctx.tiers, &e, &files, prio)).unwrap_or_default();
        let snap = disk.snapshot();
        if a.json {
            println!(
                "{}",
                serde_json::json!({"warm": report, "fetched": fetched, "files": files_report, "disk_cache": snap, "bytes_computed": ctx.tiers.mem.stats.bytes_computed.get(), "remote": crate::source::remote::stats::snapshot()})
            );
        } else {
            eprintln!(
                "warmed {} chunk groups ({} bytes) into {}: {} computed, {} already present, {} failed, in {:.1}s",
                report.items,
                report.bytes,
                dir.display(),
                report.computed,
                report.present,
                report.failed,
                report.seconds
            );
            if files_report.written + files_report.present + files_report.skipped > 0 {
                eprintln!(
                    "kept {} files whole ({} bytes) in {:.1}s, {} already there, {} not (a chunk missing or the cache refused)",
                    files_report.written, files_report.bytes, files_report.seconds, files_report.present, files_report.skipped
                );
            }
        }
        if snap.write_errors > 0 {
            tracing::warn!("{} entries could not be written to the disk cache (see the warnings above): warm again once the cause is fixed", snap.write_errors);
        }
        Ok(report.failed == 0 && fetched.is_none_or(|f| f.failed == 0) && snap.write_errors == 0)
    })();
    match result {
        Ok(true) => 0,
        Ok(false) => 1,
        Err(e) => {
            eprintln!("xpackfs: {e}");
            1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_select_files_and_directories() {
        let f = || Arc::new(VirtualFile::from_bytes(b"x".to_vec()));
        let files: Files = vec![("a.bin".into(), f()), ("_layer_0/_numa_0/q.kt".into(), f()), ("_layer_1/_numa_0/q.kt".into(), f())];
        let names = |v: Files| v.into_iter().map(|(n, _)| n).collect::<Vec<_>>();
        assert_eq!(names(select(files.clone(), &[]).unwrap()).len(), 3);
        assert_eq!(names(select(files.clone(), &["_layer_1/".into()]).unwrap()), ["_layer_1/_numa_0/q.kt"]);
        assert_eq!(names(select(files.clone(), &["a.bin".into(), "_layer_0".into()]).unwrap()), ["a.bin", "_layer_0/_numa_0/q.kt"]);
        assert!(select(files, &["_layer_".into()]).unwrap_err().contains("not a file or directory"));
    }
}
