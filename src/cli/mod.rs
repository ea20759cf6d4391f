//! Command line: `mount` (also reached as `xpackfs SOURCE MOUNTPOINT -o ...`, the form
//! `mount.fuse3` execs for `mount -t fuse.xpackfs`), `inspect` and `digest`.

mod inspect;

use std::ffi::OsString;
use std::path::PathBuf;

use clap::{Arg, ArgAction, ArgMatches, Command};

use crate::serve::{self, daemon, options};

const SUBCOMMANDS: &[&str] = &["mount", "materialize", "validate-int8", "inspect", "digest", "codec", "help"];

/// `-o` and one flag per option: the same options for `mount` and `materialize`.
fn with_option_args(mut cmd: Command) -> Command {
    cmd = cmd
        .arg(Arg::new("o").short('o').action(ArgAction::Append).value_name("OPTS").help("comma-separated options, key[=value] (see below)"))
        .after_help(options::help_text());
    for &(key, takes_value, help) in options::OPTIONS {
        let long: &'static str = Box::leak(key.replace('_', "-").into_boxed_str());
        let arg = Arg::new(key).long(long).help(help);
        cmd = cmd.arg(if takes_value { arg.value_name("VALUE").action(ArgAction::Set) } else { arg.action(ArgAction::SetTrue) });
    }
    cmd
}

fn command() -> Command {
    let mut mount = Command::new("mount")
        .about("Mount a checkpoint and serve a view of it (read-only)")
        .long_about(
            "Mount SOURCE (a GGUF file, or any part of a split GGUF set) on MOUNTPOINT and serve a view of it.\n\
             Runs in the background and returns once the mount is live, unless -f is given.\n\
             The same command is reached as `xpackfs SOURCE MOUNTPOINT -o opts` (what mount.fuse3 runs for\n\
             `mount -t fuse.xpackfs SOURCE MOUNTPOINT -o opts` and fstab entries); MOUNTPOINT may be /dev/fd/N.",
        )
        .arg(Arg::new("source").required(true).value_parser(clap::value_parser!(PathBuf)).help("GGUF source file"))
        .arg(Arg::new("mountpoint").required(true).help("directory to mount on, or /dev/fd/N"))
        .arg(Arg::new("foreground_flag").short('f').action(ArgAction::SetTrue).help("stay in the foreground"));
    mount = with_option_args(mount);
    let materialize = with_option_args(
        Command::new("materialize")
            .about("Write a view's files to disk, durably, through the same read path as a mount")
            .long_about(
                "Write every file of a view (the one `mount` would serve with the same options) into OUT.\n\
                 Files are written under temporary names, fsynced and renamed into place; completed files are\n\
                 never overwritten without --replace; --resume continues after an interruption (kill -9 included)\n\
                 and gives the same bytes as an uninterrupted run. Exit status: 0 done, 1 failed, 2 usage.",
            )
            .arg(Arg::new("source").required(true).value_parser(clap::value_parser!(PathBuf)).help("GGUF file or safetensors checkpoint directory"))
            .arg(Arg::new("out").long("out").required(true).value_parser(clap::value_parser!(PathBuf)).help("output directory"))
            .arg(Arg::new("replace").long("replace").action(ArgAction::SetTrue).help("overwrite existing output"))
            .arg(Arg::new("resume").long("resume").action(ArgAction::SetTrue).help("continue an interrupted run"))
            .arg(Arg::new("verify").long("verify").action(ArgAction::SetTrue).help("re-read what was written and check every digest, and the manifests' digests"))
            .arg(Arg::new("json").long("json").action(ArgAction::SetTrue).help("print a JSON summary at the end"))
            .arg(Arg::new("margin-gib").long("margin-gib").default_value("1").value_parser(clap::value_parser!(f64)).help("free space to keep beyond the output, GiB"))
            .arg(Arg::new("chunk-kib").long("chunk-kib").default_value("8192").value_parser(clap::value_parser!(usize)).help("write size, KiB"))
            .arg(
                Arg::new("partition")
                    .long("partition")
                    .value_name("I/N")
                    .value_parser(clap::value_parser!(crate::materialize::partition::Partition))
                    .conflicts_with_all(["finalize", "resume"])
                    .help("write only part I (0-based) of N of the output; run every part (any machines sharing OUT), then --finalize. Re-running a part continues it"),
            )
            .arg(
                Arg::new("piece-size")
                    .long("piece-size")
                    .value_name("BYTES")
                    .default_value("1G")
                    .value_parser(parse_piece_size)
                    .help("with --partition: files larger than this are cut into pieces of this size (a multiple of 4096; K, M, G suffixes), spread over the parts; 0: never cut"),
            )
            .arg(Arg::new("finalize").long("finalize").action(ArgAction::SetTrue).help("after every --partition I/N has finished: check the parts, assemble cut files, write the manifests")),
    );
    Command::new("xpackfs")
        .version(&*Box::leak(format!("{} (codecs: SIMD {})", env!("CARGO_PKG_VERSION"), crate::codec::simd::describe()).into_boxed_str()))
        .about("A read-only FUSE filesystem serving converted forms of MoE checkpoints (SGLang expert packs, ...)")
        .subcommand_required(true)
        .subcommand(mount)
        .subcommand(materialize)
        .subcommand(
            Command::new("validate-int8")
                .about("Validate a kt-kernel persistent INT8 expert tree (the rules of kt-kernel's validate_persistent_int8_weights)")
                .long_about(
                    "Validate ROOT as kt-kernel's validate_persistent_int8_weights does: schema 1 and 2, root, symlinks,\n\
                     manifest naming and metadata, per-layer NUMA directories, file names, sizes, identities, inventories\n\
                     and byte totals, and with --verify-hashes every file's sha256. Expectations not given as flags are\n\
                     taken from the manifest. Prints a JSON summary on success.\n\
                     Exit status: 0 valid, 1 invalid (the reason on stderr), 2 usage error.",
                )
                .arg(Arg::new("root").required(true).value_parser(clap::value_parser!(PathBuf)))
                .arg(Arg::new("layers").long("layers").value_name("L,L,...").help("expected expert layer indices"))
                .arg(Arg::new("numa").long("numa-count").value_parser(clap::value_parser!(i64)).help("expected threadpool (NUMA) count"))
                .arg(Arg::new("experts").long("expert-num").value_parser(clap::value_parser!(i64)))
                .arg(Arg::new("hidden").long("hidden-size").value_parser(clap::value_parser!(i64)))
                .arg(Arg::new("inter").long("intermediate-size").value_parser(clap::value_parser!(i64)))
                .arg(Arg::new("verify-hashes").long("verify-hashes").action(ArgAction::SetTrue).help("hash every file"))
                .arg(Arg::new("no-verify-hashes").long("no-verify-hashes").action(ArgAction::SetTrue).help("never hash (default: hash when the manifest is schema 2)")),
        )
        .subcommand(
            Command::new("inspect")
                .about("Print a JSON summary of an expert pack: header, role counts, payload bytes, first entries")
                .arg(Arg::new("pack").required(true).value_parser(clap::value_parser!(PathBuf)))
                .arg(Arg::new("limit").long("limit").default_value("12").value_parser(clap::value_parser!(usize)).help("entries to show")),
        )
        .subcommand(
            Command::new("codec")
                .about("Run a codec on raw data: stdin to stdout (used by tools/ggml_ref.py for differential tests)")
                .subcommand_required(true)
                .subcommand(
                    Command::new("quantize")
                        .about("little-endian f32 rows on stdin -> ggml blocks on stdout (bit-exact with ggml's quantize_<type>)")
                        .arg(Arg::new("type").long("type").required(true).help("Q8_0, Q2_K or IQ2_XXS"))
                        .arg(Arg::new("n-per-row").long("n-per-row").required(true).value_parser(clap::value_parser!(usize)))
                        .arg(Arg::new("importance").long("importance").value_parser(clap::value_parser!(PathBuf)).help("f32 file, one value per column"))
                        .arg(Arg::new("threads").long("threads").value_parser(clap::value_parser!(usize)).help("rayon threads (default: all cores)")),
                )
                .subcommand(
                    Command::new("dequantize")
                        .about("ggml blocks on stdin -> little-endian f32 on stdout")
                        .arg(Arg::new("type").long("type").required(true).help("F32, F16, BF16, Q8_0, Q2_K, Q4_K, Q6_K, IQ2_XXS, MXFP4"))
                        .arg(Arg::new("time").long("time").action(ArgAction::SetTrue).help("decode 3 times in-process, print the best time in seconds to stderr, write nothing")),
                ),
        )
        .subcommand(
            Command::new("digest")
                .about("Hash a source once and remember its digests, so that later mounts start at once")
                .arg(Arg::new("source").required(true).value_parser(clap::value_parser!(PathBuf)))
                .arg(Arg::new("digest-store").long("digest-store").value_name("DIR").help("store directory, or 'none'")),
        )
}

/// `xpackfs SRC MNT -o ...` (mount helper form) becomes `xpackfs mount SRC MNT -o ...`.
fn normalize(mut args: Vec<OsString>) -> Vec<OsString> {
    if let Some(first) = args.get(1).and_then(|a| a.to_str()) {
        if !first.starts_with('-') && !SUBCOMMANDS.contains(&first) {
            args.insert(1, "mount".into());
        }
    }
    args
}

fn init_logging(debug: bool) {
    let default = if debug { "debug" } else { "info" };
    let filter = tracing_subscriber::EnvFilter::try_from_env("XPACKFS_LOG").unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false).try_init();
}

fn mount_options(m: &ArgMatches) -> Result<options::MountOptions, String> {
    let mut opts = options::MountOptions::default();
    for list in m.get_many::<String>("o").into_iter().flatten() {
        opts.apply_list(list)?;
    }
    for &(key, takes_value, _) in options::OPTIONS {
        if takes_value {
            if let Some(v) = m.get_one::<String>(key) {
                opts.set(key, Some(v))?;
            }
        } else if m.get_flag(key) {
            opts.set(key, None)?;
        }
    }
    if m.try_get_one::<bool>("foreground_flag").ok().flatten() == Some(&true) {
        opts.foreground = true;
    }
    Ok(opts)
}

fn run_mount(m: &ArgMatches) -> i32 {
    let opts = match mount_options(m) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("xpackfs: {e}");
            return 2;
        }
    };
    let source = m.get_one::<PathBuf>("source").unwrap();
    let source = match std::fs::canonicalize(source) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("xpackfs: source {}: {e}", source.display());
            return 1;
        }
    };
    let mountpoint = m.get_one::<String>("mountpoint").unwrap().clone();
    let mountpoint = if mountpoint.starts_with("/dev/fd/") {
        mountpoint
    } else {
        match std::fs::canonicalize(&mountpoint) {
            Ok(p) => p.to_string_lossy().into_owned(),
            Err(e) => {
                eprintln!("xpackfs: mountpoint {mountpoint}: {e}");
                return 1;
            }
        }
    };
    let mut opts = opts;
    opts.pack.command = std::env::args().collect::<Vec<_>>().join(" ");
    let mut ready = if opts.foreground { daemon::Readiness::foreground() } else { daemon::daemonize() };
    if ready.is_background() {
        let _ = std::env::set_current_dir("/");
    }
    daemon::block_signals();
    init_logging(opts.debug);
    match serve::mount(&source, &mountpoint, opts, &mut ready) {
        Ok(()) => 0,
        Err(e) => {
            if ready.is_background() {
                ready.failed(&e); // the waiting parent prints it
            } else {
                eprintln!("xpackfs: {e}");
            }
            1
        }
    }
}

pub fn main() -> i32 {
    let args = normalize(std::env::args_os().collect());
    let matches = match command().try_get_matches_from(args) {
        Ok(m) => m,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { 2 } else { 0 };
        }
    };
    match matches.subcommand() {
        Some(("mount", m)) => run_mount(m),
        Some(("materialize", m)) => run_materialize(m),
        Some(("validate-int8", m)) => {
            let layers = match m.get_one::<String>("layers") {
                Some(l) => match l.split(',').map(|x| x.trim().parse::<i64>()).collect::<Result<Vec<_>, _>>() {
                    Ok(v) => Some(v),
                    Err(_) => {
                        eprintln!("xpackfs: --layers takes comma-separated integers");
                        return 2;
                    }
                },
                None => None,
            };
            let expect = crate::view::kt_int8::validate::Expect {
                layers,
                numa_count: m.get_one::<i64>("numa").copied(),
                expert_num: m.get_one::<i64>("experts").copied(),
                hidden_size: m.get_one::<i64>("hidden").copied(),
                intermediate_size: m.get_one::<i64>("inter").copied(),
            };
            let verify = if m.get_flag("verify-hashes") { Some(true) } else if m.get_flag("no-verify-hashes") { Some(false) } else { None };
            let root = m.get_one::<PathBuf>("root").unwrap();
            let root = if root.is_absolute() { root.clone() } else { std::env::current_dir().unwrap_or_default().join(root) };
            match crate::view::kt_int8::validate::validate(&root, &expect, verify) {
                Ok(v) => {
                    println!("{}", serde_json::to_string(&v).unwrap());
                    0
                }
                Err(e) => {
                    eprintln!("xpackfs: invalid INT8 tree: {e}");
                    1
                }
            }
        }
        Some(("inspect", m)) => {
            let pack = m.get_one::<PathBuf>("pack").unwrap();
            match inspect::inspect(pack, *m.get_one::<usize>("limit").unwrap()) {
                Ok(v) => {
                    println!("{}", crate::pyjson::dumps(&v, &crate::pyjson::Style::PRETTY_SORTED));
                    0
                }
                Err(e) => {
                    eprintln!("xpackfs: {e}");
                    1
                }
            }
        }
        Some(("codec", m)) => match run_codec(m) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("xpackfs codec: {e}");
                1
            }
        },
        Some(("digest", m)) => {
            init_logging(false);
            let path = m.get_one::<PathBuf>("source").unwrap();
            let store = crate::digest::DigestStore::from_option(m.get_one::<String>("digest-store").map(String::as_str));
            let result = crate::source::Source::open(path)
                .map_err(|e| e.to_string())
                .and_then(|s| crate::digest::obtain(&s, &store, None).map_err(|e| e.to_string()));
            match result {
                Ok(d) => {
                    println!(
                        "{}",
                        serde_json::json!({"source_sha256": d.source_sha256, "header_sha256": d.header_sha256,
                            "tensors": d.tensors.len(), "store": store.dir})
                    );
                    0
                }
                Err(e) => {
                    eprintln!("xpackfs: {e}");
                    1
                }
            }
        }
        _ => 2,
    }
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
}

fn run_codec(m: &ArgMatches) -> Result<(), String> {
    use std::io::{Read, Write};
    use crate::codec;
    let mut input = Vec::new();
    std::io::stdin().read_to_end(&mut input).map_err(|e| format!("stdin: {e}"))?;
    let out: Vec<u8> = match m.subcommand() {
        Some(("quantize", q)) => {
            let name = q.get_one::<String>("type").unwrap();
            let ty = codec::QuantType::from_name(name).ok_or_else(|| format!("cannot quantise to {name}"))?;
            let n = *q.get_one::<usize>("n-per-row").unwrap();
            let importance = match q.get_one::<PathBuf>("importance") {
                Some(p) => Some(f32s(&std::fs::read(p).map_err(|e| format!("{}: {e}", p.display()))?)),
                None => None,
            };
            if input.len() % 4 != 0 {
                return Err("input is not a whole number of f32".into());
            }
            let src = f32s(&input);
            let g = ty.ggml();
            let rows = if n == 0 { 0 } else { src.len() / n };
            let mut dst = vec![0u8; rows * (n as u64 / g.block_size * g.type_size) as usize];
            let mut run = || -> Result<(), codec::CodecError> { codec::quantize_rows_par(ty, &src, n, importance.as_deref(), &mut dst) };
            match q.get_one::<usize>("threads") {
                Some(&t) => rayon::ThreadPoolBuilder::new().num_threads(t).build().map_err(|e| e.to_string())?.install(run),
                None => run(),
            }
            .map_err(|e| e.to_string())?;
            dst
        }
        Some(("dequantize", d)) => {
            let name = d.get_one::<String>("type").unwrap();
            let ty = codec::GgmlType::from_name(name).ok_or_else(|| format!("unknown type {name}"))?;
            let blocks = input.len() as u64 / ty.type_size;
            let mut dst = vec![0f32; (blocks * ty.block_size) as usize];
            if d.get_flag("time") {
                let mut best = f64::MAX;
                for _ in 0..3 {
                    let t = std::time::Instant::now();
                    codec::dequantize(ty, &input, &mut dst).map_err(|e| e.to_string())?;
                    best = best.min(t.elapsed().as_secs_f64());
                }
                eprintln!("{best}");
                return Ok(());
            }
            codec::dequantize(ty, &input, &mut dst).map_err(|e| e.to_string())?;
            dst.iter().flat_map(|v| v.to_le_bytes()).collect()
        }
        _ => unreachable!(),
    };
    std::io::stdout().write_all(&out).map_err(|e| format!("stdout: {e}"))
}

/// `4096`, `256K`, `64M`, `1G`: a multiple of 4096 bytes (pieces of a cut file stay page
/// aligned, so parts written by different machines never share a page).
fn parse_piece_size(s: &str) -> Result<u64, String> {
    let (digits, unit) = match s.trim().to_ascii_uppercase() {
        t if t.ends_with('K') => (t[..t.len() - 1].to_string(), 1u64 << 10),
        t if t.ends_with('M') => (t[..t.len() - 1].to_string(), 1 << 20),
        t if t.ends_with('G') => (t[..t.len() - 1].to_string(), 1 << 30),
        t => (t, 1),
    };
    let n: u64 = digits.parse().map_err(|_| format!("{s:?} is not a size (e.g. 1G, 256M, 4096)"))?;
    let bytes = n.checked_mul(unit).ok_or_else(|| format!("{s:?} is too large"))?;
    if bytes % 4096 != 0 {
        return Err(format!("{s:?} is not a multiple of 4096 bytes"));
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

fn run_materialize(m: &ArgMatches) -> i32 {
    init_logging(false);
    let mut opts = match mount_options(m) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("xpackfs: {e}");
            return 2;
        }
    };
    let source_path = m.get_one::<PathBuf>("source").unwrap();
    let out = m.get_one::<PathBuf>("out").unwrap();
    if let Err(e) = std::fs::create_dir_all(out) {
        eprintln!("xpackfs: {}: {e}", out.display());
        return 1;
    }
    let out = std::fs::canonicalize(out).unwrap_or_else(|_| out.clone());
    opts.pack.pack_dir = out.clone();
    opts.pack.materialize = true;
    let partition = m.get_one::<crate::materialize::partition::Partition>("partition").copied();
    let finalize = m.get_flag("finalize");
    let started = std::time::Instant::now();
    let result = (|| -> Result<Vec<crate::materialize::FileResult>, String> {
        use crate::materialize::partition;
        // The command recorded in manifests is the same for a single run and for every part
        // of a partitioned one: the argv without `--partition`, as the parts recorded it.
        opts.pack.command = if finalize { partition::recorded_command(&out).map_err(|e| e.to_string())? } else { recorded_command() };
        let source = crate::source::Source::open(source_path).map_err(|e| e.to_string())?;
        let tree = serve::build_tree(&source, &opts).map_err(|e| e.to_string())?;
        let mopts = crate::materialize::Options {
            replace: m.get_flag("replace"),
            resume: m.get_flag("resume"),
            verify: m.get_flag("verify"),
            margin: (*m.get_one::<f64>("margin-gib").unwrap() * (1u64 << 30) as f64) as u64,
            chunk: *m.get_one::<usize>("chunk-kib").unwrap() << 10,
            progress: crate::materialize::stderr_is_terminal() && !m.get_flag("json"),
        };
        match (partition, finalize) {
            (Some(p), _) => {
                let piece = *m.get_one::<u64>("piece-size").unwrap();
                partition::run_partition(&source, &tree, &out, p, piece, &opts.pack.command, &mopts)
            }
            (None, true) => partition::finalize(&source, &tree, &out, &mopts),
            (None, false) => crate::materialize::materialize(&source, &tree, &out, &mopts),
        }
        .map_err(|e| e.to_string())
    })();
    match result {
        Ok(files) => {
            let summary = crate::materialize::summary(&files, started.elapsed().as_secs_f64());
            if m.get_flag("json") {
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
