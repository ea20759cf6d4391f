//! `xpackfs materialize`: build the view for the output directory and write it (whole, one
//! partition of it, or the finalize step of a partitioned run).

use std::path::PathBuf;

use super::AllOptions;
use crate::materialize::{self, partition};
use crate::util::args::InvalidValue;
use crate::view::{self, Context, Input, Purpose};

#[derive(Debug, clap::Args)]
pub struct MaterializeArgs {
    /// GGUF file or safetensors checkpoint directory (or INT8 tree, copied after validation)
    source: PathBuf,
    /// Output directory
    #[arg(long)]
    out: PathBuf,
    /// Overwrite existing output
    #[arg(long)]
    replace: bool,
    /// Continue an interrupted run
    #[arg(long)]
    resume: bool,
    /// Re-read what was written and check every digest, and the manifests' digests
    #[arg(long)]
    verify: bool,
    /// Print a JSON summary at the end
    #[arg(long)]
    json: bool,
    /// Free space to keep beyond the output, GiB
    #[arg(long, default_value = "1", value_parser = margin)]
    margin_gib: f64,
    /// Write size, KiB
    #[arg(long, default_value = "8192", value_parser = crate::util::args::int_in::<usize>(4, 1 << 20))]
    chunk_kib: usize,
    /// Write only part I (0-based) of N of the output; run every part (any machines sharing
    /// OUT), then --finalize. Re-running a part continues it
    #[arg(long, value_name = "I/N", conflicts_with_all = ["finalize", "resume"])]
    partition: Option<partition::Partition>,
    /// With --partition: files larger than this are cut into pieces of this size (a multiple
    /// of 4096; K, M, G suffixes), spread over the parts; 0: never cut
    #[arg(long, value_name = "BYTES", default_value = "1G", value_parser = parse_piece_size)]
    piece_size: u64,
    /// After every --partition I/N has finished: check the parts, assemble cut files, write
    /// the manifests
    #[arg(long)]
    finalize: bool,
    #[command(flatten)]
    options: AllOptions,
}

fn margin(s: &str) -> Result<f64, InvalidValue> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && (0.0..=1e6).contains(&v) => Ok(v),
        _ => Err(InvalidValue::given(s, "must be a number of GiB from 0 to 1000000")),
    }
}

/// `4096`, `256K`, `64M`, `1G`: a multiple of 4096 bytes (pieces of a cut file stay page
/// aligned, so parts written by different machines never share a page).
fn parse_piece_size(s: &str) -> Result<u64, InvalidValue> {
    let (digits, unit) = match s.trim().to_ascii_uppercase() {
        t if t.ends_with('K') => (t[..t.len() - 1].to_string(), 1u64 << 10),
        t if t.ends_with('M') => (t[..t.len() - 1].to_string(), 1 << 20),
        t if t.ends_with('G') => (t[..t.len() - 1].to_string(), 1 << 30),
        t => (t, 1),
    };
    let n: u64 = digits.parse().map_err(|_| InvalidValue::given(s, "is not a size (e.g. 1G, 256M, 4096)"))?;
    let bytes = n.checked_mul(unit).ok_or_else(|| InvalidValue::given(s, "is too large"))?;
    if bytes % 4096 != 0 {
        return Err(InvalidValue::given(s, "is not a multiple of 4096 bytes"));
    }
    Ok(bytes)
}

/// This process's argv without the partitioning arguments (`--partition`, `--piece-size`).
fn recorded_command() -> String {
    let mut out = Vec::new();
    let mut args = std::env::args();
    while let Some(a) = args.next() {
        if a == "--partition" || a == "--piece-size" {
            args.next();
        } else if !a.starts_with("--partition=") && !a.starts_with("--piece-size=") {
            out.push(a);
        }
    }
    out.join(" ")
}

pub fn run(a: MaterializeArgs) -> i32 {
    super::init_logging(false);
    a.options.view.remote.apply();
    if let Err(e) = std::fs::create_dir_all(&a.out) {
        eprintln!("xpackfs: {}: {e}", a.out.display());
        return 1;
    }
    let out = std::fs::canonicalize(&a.out).unwrap_or_else(|_| a.out.clone());
    let started = std::time::Instant::now();
    let result = (|| -> Result<(Vec<materialize::FileResult>, std::sync::Arc<crate::view::Tiers>), String> {
        // The command recorded in manifests is the same for a single run and for every part
        // of a partitioned one: the argv without `--partition`, as the parts recorded it.
        let command = if a.finalize { partition::recorded_command(&out).map_err(|e| e.to_string())? } else { recorded_command() };
        let ctx = Context::new(Purpose::Materialize, out.clone(), command.clone(), &a.options.view).map_err(|e| e.to_string())?;
        let input = Input::open(&a.source).map_err(|e| e.to_string())?;
        let built = view::build(input, &a.options.view, &ctx).map_err(|e| e.to_string())?;
        let mopts = materialize::Options {
            replace: a.replace,
            resume: a.resume,
            verify: a.verify,
            margin: (a.margin_gib * (1u64 << 30) as f64) as u64,
            chunk: a.chunk_kib << 10,
            progress: materialize::stderr_is_terminal() && !a.json,
        };
        let files = match (a.partition, a.finalize) {
            (Some(p), _) => partition::run_partition(&built, &out, p, a.piece_size, &command, &mopts),
            (None, true) => partition::finalize(&built, &out, &mopts),
            (None, false) => materialize::materialize(&built, &out, &mopts),
        }
        .map_err(|e| e.to_string())?;
        Ok((files, ctx.tiers.clone()))
    })();
    match result {
        Ok((files, tiers)) => {
            let mut summary = materialize::summary(&files, started.elapsed().as_secs_f64());
            // Where the computed chunks came from (a warm disk cache: nothing computed).
            let c = &tiers.mem.stats;
            summary["chunks"] = serde_json::json!({
                "bytes_computed": c.bytes_computed.get(),
                "bytes_from_disk": c.bytes_from_disk.get(),
                "disk_cache": tiers.disk.as_ref().map(|d| d.snapshot()),
            });
            if a.json {
                println!("{summary}");
            } else {
                eprintln!("materialized {} files into {} ({} bytes written)", files.len(), out.display(), summary["bytes_written"]);
            }
            0
        }
        Err(e) => {
            eprintln!("xpackfs: {e}");
            1
        }
    }
}
