//! The command line (clap derive): `mount` (also reached as `xpackfs SOURCE MOUNTPOINT -o
//! ...`, the form `mount.fuse3` execs for `mount -t fuse.xpackfs`), `materialize`, `warm`,
//! `validate-int8`, `inspect`, `digest` and `codec`. Each subcommand is one function here or
//! in its own file; they wire the layers below (view, serve, materialize) and turn their
//! typed errors into messages and exit codes: 0 success, 1 failure, 2 usage.

mod codec;
mod inspect;
mod materialize;
mod mount;
pub mod options;
mod warm;

use std::ffi::OsString;
use std::path::PathBuf;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

use crate::serve::options::ServeOptions;
use crate::view::ViewOptions;

/// `xpackfs --version`: the crate version, the git revision of the build and the codecs'
/// SIMD level in use (`XPACKFS_SIMD` forces one).
fn version() -> &'static str {
    static V: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    V.get_or_init(|| format!("{} (git {}; codecs: SIMD {})", env!("CARGO_PKG_VERSION"), crate::GIT_SHA, crate::codec::simd::describe()))
}

#[derive(Debug, Parser)]
#[command(name = "xpackfs", version = version(), about = "A read-only FUSE filesystem serving converted forms of MoE checkpoints (SGLang expert packs, ...)")]
#[command(allow_negative_numbers = true, args_override_self = true)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

/// The views (from the registry) and the `-o` form, after the options in `--help`.
fn options_help() -> String {
    let mut s = String::from("Views (--view / -o view=):\n");
    for v in crate::view::VIEWS {
        s.push_str(&format!("  {:<12} {}\n", v.name(), v.summary()));
    }
    s.push_str(
        "\nEvery option is also accepted in -o form: -o key[=value],... with underscores for dashes (top_k=6, allow_other), \
as fstab and `mount -t fuse.xpackfs` pass them. Generic mount options (rw, ro, nodev, nosuid, noatime, _netdev, nofail, \
x-systemd.*, ...) are ignored: the mount is always read-only.",
    );
    s
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Mount a checkpoint and serve a view of it (read-only)
    #[command(
        long_about = "Mount SOURCE (a GGUF file or any part of a split set, a safetensors checkpoint, or an INT8 tree) on MOUNTPOINT \
and serve a view of it. Runs in the background and returns once the mount is live, unless -f is given. The same command is \
reached as `xpackfs SOURCE MOUNTPOINT -o opts` (what mount.fuse3 runs for `mount -t fuse.xpackfs` and fstab entries); \
MOUNTPOINT may be /dev/fd/N.",
        after_help = options_help(),
        allow_negative_numbers = true
    )]
    Mount(MountArgs),
    /// Write a view's files to disk, durably, through the same read path as a mount
    #[command(
        long_about = "Write every file of a view (the one `mount` would serve with the same options) into OUT. Files are written \
under temporary names, fsynced and renamed into place; completed files are never overwritten without --replace; --resume \
continues after an interruption (kill -9 included) and gives the same bytes as an uninterrupted run. Exit status: 0 done, \
1 failed, 2 usage.",
        after_help = options_help(),
        allow_negative_numbers = true
    )]
    Materialize(materialize::MaterializeArgs),
    /// Compute a view (or some of its files) into the disk cache, so mounts and materialize find it computed
    #[command(
        long_about = "Compute every chunk of a view (the one `mount` would serve with the same options), or of the files and \
directories named, into the disk cache (-o disk_cache=DIR, required), on every core, with a progress bar. Resumable: chunks \
already in the cache are skipped, so an interrupted run continues where it stopped. --nice runs the computation niced and in \
the idle I/O class. Exit status: 0 done, 1 failed (some chunks could not be computed or written), 2 usage.",
        after_help = options_help(),
        allow_negative_numbers = true
    )]
    Warm(warm::WarmArgs),
    /// Validate a kt-kernel persistent INT8 expert tree (the rules of kt-kernel's validate_persistent_int8_weights)
    #[command(
        long_about = "Validate ROOT as kt-kernel's validate_persistent_int8_weights does: schema 1 and 2, root, symlinks, \
manifest naming and metadata, per-layer NUMA directories, file names, sizes, identities, inventories and byte totals, and \
with --verify-hashes every file's sha256. Expectations not given as flags are taken from the manifest. Prints a JSON summary \
on success. Exit status: 0 valid, 1 invalid (the reason on stderr), 2 usage error.",
        allow_negative_numbers = true
    )]
    ValidateInt8(ValidateArgs),
    /// Print a JSON summary of an expert pack: header, role counts, payload bytes, first entries
    Inspect(inspect::InspectArgs),
    /// Run a codec on raw data: stdin to stdout (used by tools/peers/ggml_ref.py for differential tests)
    Codec(codec::CodecArgs),
    /// Hash a source once and remember its digests, so that later mounts start at once
    Digest(DigestArgs),
}

/// The options shared by `mount` and `materialize`: the view's and the serving ones.
#[derive(Debug, Clone, clap::Args)]
pub struct AllOptions {
    #[command(flatten)]
    pub view: ViewOptions,
    #[command(flatten)]
    pub serve: ServeOptions,
}

#[derive(Debug, clap::Args)]
pub struct MountArgs {
    /// GGUF file (or any part of a split set), safetensors checkpoint directory or file, or INT8
    /// tree; or a URL of one: s3://BUCKET/KEY or s3://BUCKET/PREFIX/, gs://, az://, https://, hf://ORG/NAME[@REV][/PATH]
    source: PathBuf,
    /// Directory to mount on, or /dev/fd/N
    mountpoint: String,
    #[command(flatten)]
    options: AllOptions,
}

#[derive(Debug, clap::Args)]
struct ValidateArgs {
    root: PathBuf,
    /// Expected expert layer indices
    #[arg(long, value_name = "L,L,...", value_delimiter = ',')]
    layers: Option<Vec<i64>>,
    /// Expected threadpool (NUMA) count
    #[arg(long, value_parser = clap::value_parser!(i64).range(1..=crate::view::kt_int8::validate::MAX_THREADPOOL_COUNT))]
    numa_count: Option<i64>,
    /// Expected routed-expert count
    #[arg(long, value_parser = clap::value_parser!(i64).range(1..))]
    expert_num: Option<i64>,
    /// Expected hidden size
    #[arg(long, value_parser = clap::value_parser!(i64).range(1..))]
    hidden_size: Option<i64>,
    /// Expected expert intermediate size
    #[arg(long, value_parser = clap::value_parser!(i64).range(1..))]
    intermediate_size: Option<i64>,
    /// Hash every file
    #[arg(long, conflicts_with = "no_verify_hashes")]
    verify_hashes: bool,
    /// Never hash (default: hash when the manifest is schema 2)
    #[arg(long)]
    no_verify_hashes: bool,
    #[command(flatten)]
    remote: crate::source::remote::Options,
}

#[derive(Debug, clap::Args)]
struct DigestArgs {
    /// GGUF file (or any part of a split set), safetensors checkpoint, or a URL of one
    source: PathBuf,
    /// Store directory, or 'none'
    #[arg(long, value_name = "DIR")]
    digest_store: Option<String>,
    #[command(flatten)]
    remote: crate::source::remote::Options,
}

const SUBCOMMANDS: &[&str] = &["mount", "materialize", "warm", "validate-int8", "inspect", "digest", "codec", "help"];

/// `xpackfs SRC MNT -o ...` (mount helper form) becomes `xpackfs mount SRC MNT -o ...`; then
/// every `-o` list of `mount`, `materialize` and `warm` becomes the flags it stands for.
fn normalize(mut args: Vec<OsString>) -> Result<Vec<OsString>, String> {
    if let Some(first) = args.get(1).and_then(|a| a.to_str())
        && !first.starts_with('-')
        && !SUBCOMMANDS.contains(&first)
    {
        args.insert(1, "mount".into());
    }
    let sub = args.get(1).and_then(|a| a.to_str()).unwrap_or("");
    if !["mount", "materialize", "warm"].contains(&sub) {
        return Ok(args);
    }
    let cmd = Cli::command();
    let Some(sub_cmd) = cmd.find_subcommand(sub) else { return Ok(args) };
    options::expand(args, 2, &options::keys_of(sub_cmd))
}

/// Check an fstab-style option list the way `mount` would parse it (the systemd examples'
/// test uses this).
pub fn check_mount_options(list: &str) -> Result<(), String> {
    let args: Vec<OsString> = ["xpackfs", "mount", "SOURCE", "MOUNTPOINT", "-o", list].iter().map(OsString::from).collect();
    let args = normalize(args)?;
    Cli::try_parse_from(args).map(|_| ()).map_err(|e| e.to_string())
}

pub(crate) fn init_logging(debug: bool) {
    let default = if debug { "debug" } else { "info" };
    let filter = tracing_subscriber::EnvFilter::try_from_env("XPACKFS_LOG").unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .try_init();
}

pub fn main() -> i32 {
    let args = match normalize(std::env::args_os().collect()) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("xpackfs: {e}");
            return 2;
        }
    };
    let cli = match Cli::command().try_get_matches_from(args).and_then(|m| Cli::from_arg_matches(&m)) {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { 2 } else { 0 };
        }
    };
    match cli.command {
        Cmd::Mount(a) => mount::run(a),
        Cmd::Materialize(a) => materialize::run(a),
        Cmd::Warm(a) => warm::run(a),
        Cmd::ValidateInt8(a) => validate_int8(a),
        Cmd::Inspect(a) => inspect::run(a),
        Cmd::Codec(a) => codec::run(a),
        Cmd::Digest(a) => digest(a),
    }
}

fn validate_int8(a: ValidateArgs) -> i32 {
    use crate::view::kt_int8::validate;
    let expect = validate::Expect {
        layers: a.layers,
        numa_count: a.numa_count,
        expert_num: a.expert_num,
        hidden_size: a.hidden_size,
        intermediate_size: a.intermediate_size,
    };
    let verify = if a.verify_hashes {
        Some(true)
    } else if a.no_verify_hashes {
        Some(false)
    } else {
        None
    };
    a.remote.apply();
    let remote = crate::source::remote::is_remote(&a.root);
    let root = if a.root.is_absolute() || remote { a.root } else { std::env::current_dir().unwrap_or_default().join(a.root) };
    match validate::validate(&root, &expect, verify) {
        Ok(v) => {
            println!("{}", serde_json::to_string(&v).unwrap_or_default());
            0
        }
        Err(e) => {
            eprintln!("xpackfs: invalid INT8 tree: {}", e.fault);
            1
        }
    }
}

fn digest(a: DigestArgs) -> i32 {
    init_logging(false);
    a.remote.apply();
    let store = crate::digest::DigestStore::from_option(a.digest_store.as_deref());
    let result =
        crate::source::Source::open(&a.source).map_err(|e| e.to_string()).and_then(|s| crate::digest::obtain(&s, &store, None).map_err(|e| e.to_string()));
    match result {
        Ok(d) => {
            println!(
                "{}",
                serde_json::json!({"source_sha256": d.source_sha256, "header_sha256": d.header_sha256, "tensors": d.tensors.len(), "store": store.dir})
            );
            0
        }
        Err(e) => {
            eprintln!("xpackfs: {e}");
            1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, String> {
        let args = normalize(args.iter().map(OsString::from).collect())?;
        Cli::try_parse_from(args).map_err(|e| e.to_string())
    }

    /// validate-int8's expectations are the flags' own values: a bad one is refused as the
    /// flag's (usage, exit 2), never blamed on the manifest.
    #[test]
    fn validate_int8_flags_refuse_their_own_bad_values() {
        for (flag, value) in [("--numa-count", "0"), ("--numa-count", "4097"), ("--expert-num", "0"), ("--hidden-size", "-1"), ("--intermediate-size", "0")] {
            let err = parse(&["xpackfs", "validate-int8", "/t", flag, value]).err().unwrap_or_default();
            assert!(err.contains(flag), "{flag} {value}: {err}");
        }
        assert!(parse(&["xpackfs", "validate-int8", "/t", "--numa-count", "2"]).is_ok());
    }

    #[test]
    fn flags_and_o_lists_are_one_set_of_options() {
        let Cmd::Mount(m) =
            parse(&["xpackfs", "src.gguf", "/mnt", "-o", "rw,nodev,top_k=4,alignment=65536,allow_other,debug,view=requant,w1=Q8_0"]).unwrap().command
        else {
            panic!("not a mount")
        };
        let o = m.options;
        assert_eq!((o.view.pack.top_k, o.view.pack.alignment, o.view.view.as_str()), (Some(4), 65536, "requant"));
        assert!(o.serve.allow_other && o.serve.debug);
        assert_eq!(o.view.requant.w1, crate::codec::QuantType::Q8_0);
        let Cmd::Mount(m) = parse(&["xpackfs", "mount", "s", "/m", "--top-k", "3", "-f", "--numa-count", "2"]).unwrap().command else { panic!() };
        assert_eq!((m.options.view.pack.top_k, m.options.view.kt_int8.numa_count, m.options.serve.foreground), (Some(3), 2, true));
        let Cmd::Mount(m) = parse(&["xpackfs", "s", "/m", "-o", "passthrough=off,clone_fd=off,stats=on,direct_io=on"]).unwrap().command else { panic!() };
        let s = m.options.serve;
        assert_eq!((s.passthrough, s.clone_fd, s.stats, s.direct_io), (false, false, Some(true), crate::serve::options::Auto::On));
        assert_eq!((s.source_io.0, s.async_dio, s.direct_threads), (None, true, 32));
        let Cmd::Mount(m) = parse(&["xpackfs", "s", "/m", "-o", "source_io=direct,async_dio=off,direct_threads=0"]).unwrap().command else { panic!() };
        let s = m.options.serve;
        assert_eq!((s.source_io.0, s.async_dio, s.direct_threads), (Some(crate::source::SourceIo::Direct), false, 0));
        // A later -o wins over an earlier one, as mount(8) users expect.
        let Cmd::Mount(m) = parse(&["xpackfs", "s", "/m", "-o", "top_k=2", "-o", "top_k=5"]).unwrap().command else { panic!() };
        assert_eq!(m.options.view.pack.top_k, Some(5));
        // The chunk tiers' options, in both forms, and for warm too.
        let Cmd::Mount(m) = parse(&["xpackfs", "s", "/m", "-o", "disk_cache=/c,disk_cache_gb=0.5,prewarm=on,compute_threads=3"]).unwrap().command else {
            panic!()
        };
        let t = m.options.view.tiers;
        assert_eq!((t.disk_cache.as_deref(), t.disk_cache_gb, t.prewarm, t.compute_threads), (Some(std::path::Path::new("/c")), Some(0.5), true, Some(3)));
        let Cmd::Warm(w) = parse(&["xpackfs", "warm", "s", "-o", "view=requant,disk_cache=/c", "plan.json", "--nice"]).unwrap().command else { panic!() };
        assert_eq!((w.options.view.view.as_str(), w.nice), ("requant", true));
    }

    #[test]
    fn bad_values_name_the_option_and_the_rule() {
        for (args, want) in [
            (vec!["-o", "threads=0"], "from 1 to 256"),
            (vec!["--threads", "-1"], "from 1 to 256"),
            (vec!["-o", "max_read=1"], "from 4096 to 1048576"),
            (vec!["-o", "alignment=3"], "power of two"),
            (vec!["-o", "alignment=1099511627776"], "power of two"),
            (vec!["-o", "cache_mb=0"], "from 1 to"),
            (vec!["-o", "top_k=-1"], "from 1 to 65536"),
            (vec!["-o", "view=nope"], "unknown view"),
            (vec!["-o", "w1=Q4_0"], "IQ2_XXS, Q2_K or Q8_0"),
            (vec!["-o", "source_sha256=abc"], "64 hex"),
            (vec!["-o", "name=../x"], "plain file name"),
            (vec!["-o", "bogus=1"], "unknown option"),
            (vec!["-o", "top_k"], "needs a value"),
            (vec!["-o", "direct_io=maybe"], "auto, on or off"),
            (vec!["-o", "passthrough"], "needs a value"),
            (vec!["-o", "clone_fd=maybe"], "on or off"),
            (vec!["-o", "disk_cache_gb=0"], "above 0"),
            (vec!["-o", "disk_cache_gb=lots"], "number of GiB"),
            (vec!["-o", "prewarm=maybe"], "on or off"),
            (vec!["-o", "compute_threads=0"], "from 1 to 1024"),
            (vec!["-o", "source_io=sideways"], "auto, direct or buffered"),
            (vec!["-o", "direct_threads=1000"], "from 0 to 256"),
            (vec!["-o", "direct_piece_kb=2"], "0 or from 4 to 1024"),
        ] {
            let mut full = vec!["xpackfs", "mount", "s", "/m"];
            full.extend(args.iter());
            let e = parse(&full).expect_err(&format!("{args:?} accepted"));
            assert!(e.contains(want), "{args:?}: {e}");
        }
    }
}
