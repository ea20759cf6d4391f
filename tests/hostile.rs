//! Hostile inputs: every case of the corpora (tools/corpus/make_bad_{gguf,safetensors,int8,imatrix,
//! options,pack}.py, format in tools/corpus/corpus_util.py) through every entry point: `mount` (in
//! the foreground, so that its memory is measured) and `materialize --verify` for every view,
//! `digest`, `validate-int8` and `inspect`.
//!
//! Whatever the entry point, a run must not panic (exit 101 or a "panicked at" line), abort,
//! hang (no end within the timeout), or peak above 256 MiB RSS (a 4 GiB address-space limit
//! keeps a runaway from taking the machine down); a `materialize` that fails must leave no
//! final file behind. Where a case says what an entry point must do, the run must do it: be
//! refused with the exact rule, succeed, or (content only reading can find) mount and give
//! EIO on read.
//!
//! Knobs: `XPACKFS_HOSTILE_BIN` (binary to test, default this build's), `XPACKFS_HOSTILE_JOBS`
//! (parallel runs, default 3), `XPACKFS_HOSTILE_TIMEOUT` (seconds per run, default 30),
//! `XPACKFS_HOSTILE_FILTER` (only case ids containing one of its comma-separated parts), `XPACKFS_HOSTILE_REPORT` (write
//! the per-class counts and every failure there as JSON).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use common::*;

const VIEWS: [&str; 5] = ["auto", "expert-pack", "bf16-cache", "requant", "kt-int8"];
const GENERATORS: [(&str, &str); 6] = [
    ("gguf", "make_bad_gguf.py"),
    ("safetensors", "make_bad_safetensors.py"),
    ("int8", "make_bad_int8.py"),
    ("imatrix", "make_bad_imatrix.py"),
    ("options", "make_bad_options.py"),
    ("pack", "make_bad_pack.py"),
];
const RSS_TARGET_KB: u64 = 256 << 10;
const RSS_1G_KB: u64 = 1 << 20;
const ADDRESS_SPACE_LIMIT: u64 = 4 << 30;

#[derive(Debug, Clone)]
struct Case {
    id: String,
    source: PathBuf,
    options: Vec<String>,
    args: Vec<String>,
    expect: serde_json::Map<String, Value>,
    views: Option<Vec<String>>,
    names: Option<String>,
    mountpoint: String,
}

impl Case {
    fn from_json(dir: &Path, v: &Value) -> Case {
        let strings = |k: &str| -> Vec<String> { v[k].as_array().map(|a| a.iter().map(|s| s.as_str().unwrap().to_string()).collect()).unwrap_or_default() };
        Case {
            id: v["id"].as_str().unwrap().to_string(),
            source: dir.join(v["source"].as_str().unwrap()),
            options: strings("options"),
            args: strings("args"),
            expect: v["expect"].as_object().cloned().unwrap_or_default(),
            views: v["views"].as_array().map(|_| strings("views")),
            names: v["names"].as_str().map(str::to_string),
            mountpoint: v["mountpoint"].as_str().unwrap_or("dir").to_string(),
        }
    }

    /// What the case says `entry` (e.g. `mount:kt-int8`, `digest`) must do, if anything.
    fn expectation(&self, entry: &str) -> Option<&str> {
        if let Some(v) = self.expect.get(entry) {
            return v.as_str();
        }
        let (base, view) = entry.split_once(':').unwrap_or((entry, ""));
        if !view.is_empty() && self.views.as_ref().is_some_and(|vs| !vs.iter().any(|v| v == view)) {
            return None;
        }
        self.expect.get(base).and_then(Value::as_str)
    }
}

#[derive(Debug, Default)]
struct Outcome {
    /// Exit code, or None when killed by a signal (`signal`) or by the harness (`timed_out`).
    code: Option<i32>,
    signal: Option<i32>,
    timed_out: bool,
    stderr: String,
    rss_kb: u64,
    /// A mount came up.
    served: bool,
    /// Reading the mount gave EIO somewhere.
    eio: Vec<String>,
    /// Final (not hidden) files a failed `materialize` left in its output directory.
    leftover: Vec<String>,
    note: String,
}

const CLASSES: [&str; 10] =
    ["panic", "abort", "hang", "rss_over_256mib", "rss_over_1gib", "served_as_valid", "vague_message", "materialize_leftover", "valid_refused", "eio_missing"];

fn env_or<T: std::str::FromStr>(key: &str, default: T) -> T {
    std::env::var(key).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn binary() -> PathBuf {
    std::env::var_os("XPACKFS_HOSTILE_BIN").map(PathBuf::from).unwrap_or_else(|| PathBuf::from(bin()))
}

/// Spawn with a 4 GiB address-space limit; stdout/stderr to files in `dir`. Returns the pid:
/// the child is reaped with `wait4` (for its peak RSS), not through `std::process::Child`.
fn spawn(cmd: &mut Command, dir: &Path) -> i32 {
    let out = std::fs::File::create(dir.join("stdout")).unwrap();
    let err = std::fs::File::create(dir.join("stderr")).unwrap();
    cmd.stdin(Stdio::null()).stdout(out).stderr(err);
    // SAFETY: setrlimit is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            let lim = libc::rlimit { rlim_cur: ADDRESS_SPACE_LIMIT, rlim_max: ADDRESS_SPACE_LIMIT };
            libc::setrlimit(libc::RLIMIT_AS, &lim);
            Ok(())
        });
    }
    cmd.spawn().map(|c| c.id() as i32).unwrap_or_else(|e| panic!("{cmd:?}: {e}"))
}

/// Non-blocking reap: Some((status, maxrss_kb)) once the child has ended.
fn try_reap(pid: i32) -> Option<(i32, u64)> {
    let mut status = 0;
    // SAFETY: rusage is plain old data, for which all zeros is valid.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: plain syscall on our own child, with valid out-pointers.
    let r = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut ru) };
    (r == pid).then_some((status, ru.ru_maxrss as u64))
}

fn kill(pid: i32) {
    // SAFETY: the child has not been reaped yet, so the pid is still ours.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
    }
}

/// Wait for the child until `deadline`; kill it when the deadline passes.
fn finish(pid: i32, deadline: Instant, out: &mut Outcome) {
    loop {
        if let Some((status, rss)) = try_reap(pid) {
            out.rss_kb = out.rss_kb.max(rss);
            if libc::WIFEXITED(status) {
                out.code = Some(libc::WEXITSTATUS(status));
            } else if libc::WIFSIGNALED(status) && !out.timed_out {
                out.signal = Some(libc::WTERMSIG(status));
            }
            return;
        }
        if Instant::now() > deadline && !out.timed_out {
            out.timed_out = true;
            kill(pid);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn read_stderr(dir: &Path) -> String {
    let mut s = String::new();
    if let Ok(mut f) = std::fs::File::open(dir.join("stderr")) {
        let _ = f.read_to_string(&mut s);
    }
    s
}

/// Read every file of a mount (up to 8 MiB each, 64 MiB in all); paths that gave EIO.
fn exercise(root: &Path) -> Vec<String> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
        for e in std::fs::read_dir(dir)? {
            let p = e?.path();
            if p.is_dir() {
                walk(&p, out)?;
            } else {
                out.push(p);
            }
        }
        Ok(())
    }
    let mut files = Vec::new();
    let mut eio = Vec::new();
    if let Err(e) = walk(root, &mut files) {
        eio.push(format!("listing: {e}"));
    }
    let mut budget: u64 = 64 << 20;
    let mut buf = vec![0u8; 1 << 20];
    for f in files {
        let mut left: u64 = (8u64 << 20).min(budget);
        let r = std::fs::File::open(&f).and_then(|mut h| {
            while left > 0 {
                let n = h.read(&mut buf[..left.min(1 << 20) as usize])?;
                if n == 0 {
                    break;
                }
                left -= n as u64;
                budget -= n as u64;
            }
            Ok(())
        });
        if let Err(e) = r {
            eio.push(format!("{}: {e}", f.strip_prefix(root).unwrap_or(&f).display()));
        }
        if budget == 0 {
            break;
        }
    }
    eio
}

fn unmount(mnt: &Path) {
    for _ in 0..20 {
        if mounts_line(mnt).is_none() {
            return;
        }
        if Command::new("umount").arg(mnt).stderr(Stdio::null()).status().is_ok_and(|s| s.success()) {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = Command::new("umount").arg("-l").arg(mnt).stderr(Stdio::null()).status();
}

fn run_mount(case: &Case, view: &str, work: &Path, timeout: Duration) -> Outcome {
    let mut out = Outcome::default();
    let store = work.join("store");
    std::fs::create_dir_all(&store).unwrap();
    let mnt = work.join("mnt");
    let mnt_arg: PathBuf = match case.mountpoint.as_str() {
        "dir" => {
            std::fs::create_dir(&mnt).unwrap();
            mnt.clone()
        }
        "file" => {
            std::fs::write(&mnt, b"a regular file\n").unwrap();
            mnt.clone()
        }
        "fifo" => {
            let c = std::ffi::CString::new(mnt.to_str().unwrap()).unwrap();
            // SAFETY: a valid NUL-terminated path.
            assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
            mnt.clone()
        }
        "missing" => mnt.clone(),
        "symlink" => {
            std::fs::create_dir(work.join("target")).unwrap();
            std::os::unix::fs::symlink(work.join("target"), &mnt).unwrap();
            mnt.clone()
        }
        "fd" => PathBuf::from("/dev/fd/987"),
        "source" => case.source.clone(),
        other => panic!("{}: unknown mountpoint kind {other}", case.id),
    };
    // Where a mount would show in /proc/mounts.
    let shown = match case.mountpoint.as_str() {
        "symlink" => work.join("target"),
        _ => std::fs::canonicalize(&mnt_arg).unwrap_or(mnt_arg.clone()),
    };
    let mut cmd = Command::new(binary());
    cmd.arg("mount").arg(&case.source).arg(&mnt_arg).arg("-f").arg("-o").arg(format!("view={view},digest_store={}", store.display()));
    for o in &case.options {
        cmd.arg("-o").arg(o);
    }
    cmd.args(&case.args);
    let start = Instant::now();
    let deadline = start + timeout;
    let pid = spawn(&mut cmd, work);
    loop {
        if let Some((status, rss)) = try_reap(pid) {
            out.rss_kb = rss;
            if libc::WIFEXITED(status) {
                out.code = Some(libc::WEXITSTATUS(status));
            } else if libc::WIFSIGNALED(status) {
                out.signal = Some(libc::WTERMSIG(status));
            }
            break;
        }
        if mounts_line(&shown).is_some() {
            out.served = true;
            break;
        }
        if Instant::now() > deadline {
            out.timed_out = true;
            kill(pid);
            finish(pid, deadline, &mut out);
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    if out.served {
        // Read everything through the mount, within the deadline (a hung read is a hang).
        let (tx, rx) = std::sync::mpsc::channel();
        let root = shown.clone();
        let reader = std::thread::spawn(move || {
            let _ = tx.send(exercise(&root));
        });
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now()).max(Duration::from_secs(1))) {
            Ok(eio) => out.eio = eio,
            Err(_) => {
                out.timed_out = true;
                out.note = "reading the mount hung".into();
                kill(pid);
            }
        }
        unmount(&shown);
        let _ = reader.join();
        let grace = Instant::now() + timeout;
        let was_timed_out = out.timed_out;
        finish(pid, grace, &mut out);
        if out.timed_out && !was_timed_out {
            out.note = "the daemon did not exit after unmount".into();
        }
    }
    if mounts_line(&shown).is_some() {
        let _ = Command::new("umount").arg("-l").arg(&shown).status();
    }
    out.stderr = read_stderr(work);
    out
}

/// Files below `dir` that are not hidden and not in a hidden directory.
fn final_files(dir: &Path) -> Vec<String> {
    if !dir.is_dir() {
        return Vec::new();
    }
    tree_files(dir).into_iter().filter(|p| !p.split('/').any(|c| c.starts_with('.'))).collect()
}

fn run_command(case: &Case, entry: &str, work: &Path, timeout: Duration) -> Outcome {
    let mut out = Outcome::default();
    let store = work.join("store");
    std::fs::create_dir_all(&store).unwrap();
    let mut cmd = Command::new(binary());
    let out_dir = work.join("out");
    match entry.split_once(':') {
        Some(("materialize", view)) => {
            cmd.arg("materialize").arg(&case.source).arg("--out").arg(&out_dir).args(["--verify", "--margin-gib", "0"]);
            cmd.arg("-o").arg(format!("view={view},digest_store={}", store.display()));
            for o in &case.options {
                cmd.arg("-o").arg(o);
            }
            cmd.args(&case.args);
        }
        _ => match entry {
            "digest" => {
                cmd.arg("digest").arg(&case.source).arg("--digest-store").arg(&store);
            }
            "validate-int8" => {
                cmd.arg("validate-int8").arg(&case.source);
            }
            "inspect" => {
                cmd.arg("inspect").arg(&case.source);
            }
            other => panic!("unknown entry point {other}"),
        },
    }
    let pid = spawn(&mut cmd, work);
    finish(pid, Instant::now() + timeout, &mut out);
    out.stderr = read_stderr(work);
    if entry.starts_with("materialize") && out.code != Some(0) {
        out.leftover = final_files(&out_dir);
    }
    out
}

/// Every way `outcome` breaks the invariants or the case's expectation, as (class, detail).
fn judge(case: &Case, entry: &str, o: &Outcome) -> Vec<(&'static str, String)> {
    let mut f = Vec::new();
    let tail = |s: &str| -> String {
        let s = s.trim();
        let start = s.char_indices().rev().nth(600).map(|(i, _)| i).unwrap_or(0);
        s[start..].replace('\n', " | ")
    };
    if o.code == Some(101) || o.stderr.contains("panicked at") {
        f.push(("panic", tail(&o.stderr)));
    }
    if let Some(sig) = o.signal {
        let oom = o.stderr.contains("memory allocation of") || o.stderr.contains("capacity overflow");
        f.push((if oom { "rss_over_1gib" } else { "abort" }, format!("signal {sig}: {}", tail(&o.stderr))));
    }
    if o.timed_out {
        f.push(("hang", format!("no end within the timeout {}", o.note)));
    }
    if o.rss_kb > RSS_TARGET_KB {
        f.push(("rss_over_256mib", format!("peak RSS {} MiB", o.rss_kb >> 10)));
    }
    if o.rss_kb > RSS_1G_KB {
        f.push(("rss_over_1gib", format!("peak RSS {} MiB", o.rss_kb >> 10)));
    }
    if !o.leftover.is_empty() {
        f.push(("materialize_leftover", format!("failed, left final files {:?}", &o.leftover[..o.leftover.len().min(5)])));
    }
    // A mount that exits 0 without serving anything also claimed success.
    let succeeded = o.code == Some(0) || (entry.starts_with("mount") && o.served);
    match case.expectation(entry) {
        None => {}
        Some("ok") => {
            if !succeeded && !o.timed_out {
                f.push(("valid_refused", tail(&o.stderr)));
            } else if !o.eio.is_empty() {
                f.push(("valid_refused", format!("reads failed: {:?}", &o.eio[..o.eio.len().min(3)])));
            }
        }
        Some("eio") => {
            if !o.served {
                if !o.timed_out {
                    f.push(("valid_refused", format!("refused at mount, expected EIO on read: {}", tail(&o.stderr))));
                }
            } else if o.eio.is_empty() {
                f.push(("eio_missing", "every read succeeded".into()));
            }
        }
        Some(rule) => {
            if succeeded {
                f.push(("served_as_valid", format!("expected refusal {rule:?}")));
            } else if !o.timed_out && o.signal.is_none() && o.code != Some(101) {
                let names_ok = case.names.as_ref().is_none_or(|n| o.stderr.contains(n.as_str()));
                if !matches!(o.code, Some(1) | Some(2)) || !o.stderr.contains(rule) || !names_ok {
                    let also = case.names.as_ref().filter(|_| !names_ok).map(|n| format!(" naming {n:?}")).unwrap_or_default();
                    f.push(("vague_message", format!("exit {:?}, expected {rule:?}{also} in: {}", o.code, tail(&o.stderr))));
                }
            }
        }
    }
    f
}

fn entries() -> Vec<String> {
    let mut v: Vec<String> = VIEWS.iter().map(|w| format!("mount:{w}")).collect();
    v.extend(VIEWS.iter().map(|w| format!("materialize:{w}")));
    v.extend(["digest", "validate-int8", "inspect"].map(String::from));
    v
}

#[test]
fn hostile_corpus() {
    let root = tempfile::tempdir().unwrap();
    let mut cases = Vec::new();
    for (dir, script) in GENERATORS {
        let out = root.path().join("corpus").join(dir);
        run_ok(python().arg(repo().join("tools/corpus").join(script)).arg(&out));
        let list: Vec<Value> = serde_json::from_slice(&std::fs::read(out.join("cases.json")).unwrap()).unwrap();
        cases.extend(list.iter().map(|v| Case::from_json(&out, v)));
    }
    let ids: BTreeSet<&str> = cases.iter().map(|c| c.id.as_str()).collect();
    assert_eq!(ids.len(), cases.len(), "case ids are unique");
    let filter = std::env::var("XPACKFS_HOSTILE_FILTER").unwrap_or_default();
    let cases: Vec<Case> = cases.into_iter().filter(|c| filter.split(',').any(|f| c.id.contains(f))).collect();
    let jobs: Vec<(usize, String)> = cases.iter().enumerate().flat_map(|(i, _)| entries().into_iter().map(move |e| (i, e))).collect();
    let timeout = Duration::from_secs(env_or("XPACKFS_HOSTILE_TIMEOUT", 30));
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<(usize, String, Outcome)>> = Mutex::new(Vec::new());
    let work_root = root.path().join("runs");
    let started = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..env_or("XPACKFS_HOSTILE_JOBS", 3usize) {
            s.spawn(|| {
                loop {
                    let k = next.fetch_add(1, Ordering::Relaxed);
                    let Some((i, entry)) = jobs.get(k) else { break };
                    let case = &cases[*i];
                    let work = work_root.join(format!("{k}"));
                    std::fs::create_dir_all(&work).unwrap();
                    let o = if entry.starts_with("mount:") {
                        run_mount(case, entry.strip_prefix("mount:").unwrap(), &work, timeout)
                    } else {
                        run_command(case, entry, &work, timeout)
                    };
                    let _ = std::fs::remove_dir_all(&work);
                    results.lock().unwrap().push((*i, entry.clone(), o));
                }
            });
        }
    });
    let results = results.into_inner().unwrap();

    // Per class: failing runs and distinct failing cases; per case: every failure.
    let mut runs: BTreeMap<&str, usize> = CLASSES.iter().map(|c| (*c, 0)).collect();
    let mut by_class: BTreeMap<&str, BTreeSet<String>> = CLASSES.iter().map(|c| (*c, BTreeSet::new())).collect();
    let mut failures: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut peak: (u64, String) = (0, String::new());
    for (i, entry, o) in &results {
        let case = &cases[*i];
        if o.rss_kb > peak.0 {
            peak = (o.rss_kb, format!("{} {entry}", case.id));
        }
        for (class, detail) in judge(case, entry, o) {
            *runs.get_mut(class).unwrap() += 1;
            by_class.get_mut(class).unwrap().insert(case.id.clone());
            failures.entry(case.id.clone()).or_default().push(format!("{entry}: {class}: {detail}"));
        }
    }
    for v in failures.values_mut() {
        v.sort();
    }
    let per_corpus: BTreeMap<String, usize> = cases.iter().fold(BTreeMap::new(), |mut m, c| {
        *m.entry(c.id.split('/').next().unwrap().to_string()).or_default() += 1;
        m
    });
    let report = json!({
        "binary": binary(),
        "cases": cases.len(),
        "cases_per_corpus": per_corpus,
        "runs": results.len(),
        "seconds": started.elapsed().as_secs_f64(),
        "peak_rss_mib": peak.0 >> 10,
        "peak_rss_run": peak.1,
        "failing_runs_per_class": runs,
        "failing_cases_per_class": by_class.iter().map(|(k, v)| (*k, v.len())).collect::<BTreeMap<_, _>>(),
        "cases_per_class": by_class,
        "failures": failures,
    });
    if let Some(p) = std::env::var_os("XPACKFS_HOSTILE_REPORT") {
        std::fs::write(p, serde_json::to_string_pretty(&report).unwrap()).unwrap();
    }
    eprintln!(
        "hostile corpus: {} cases, {} runs in {:.0}s, peak RSS {} MiB ({}); failing runs per class {}; failing cases per class {}",
        cases.len(),
        results.len(),
        started.elapsed().as_secs_f64(),
        peak.0 >> 10,
        peak.1,
        report["failing_runs_per_class"],
        report["failing_cases_per_class"]
    );
    let mut msg = String::new();
    for (id, f) in &failures {
        msg += &format!("{id}:\n  {}\n", f.join("\n  "));
    }
    assert!(msg.is_empty(), "{msg}");
}
