//! Helpers for tests that mount for real: paths, the Python tools, and a mount guard
//! that unmounts and waits for the daemon to be gone.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_xpackfs")
}

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn sample() -> PathBuf {
    repo().join("samples/sample-moe.gguf")
}

/// `shared/` (seeds and references): `$XPACKFS_SHARED`, else `../shared` beside the repo.
pub fn shared() -> PathBuf {
    let p = std::env::var_os("XPACKFS_SHARED").map(PathBuf::from).unwrap_or_else(|| repo().join("../shared"));
    assert!(p.join("seeds").is_dir(), "shared/ with the seeds not found at {} (set XPACKFS_SHARED)", p.display());
    p
}

/// The reference ggml library the requantisation seed runs with (tools/build_ggml_ref.sh).
pub fn ggml_lib() -> String {
    std::env::var("XPACKFS_GGML_LIB").unwrap_or_else(|_| {
        panic!("XPACKFS_GGML_LIB is not set: build the reference with `bash tools/build_ggml_ref.sh` and export its output (tools/test.sh does)")
    })
}

/// The first seed (SGLang's expert-pack builder) on `source` into `out`, with its arguments.
pub fn seed_expert_pack(source: &Path, out: &Path, args: &[&str]) {
    run_ok(
        python()
            .arg(repo().join("tools/peers/run_seed_expert_pack.py"))
            .arg("--seeds")
            .arg(shared().join("seeds"))
            .arg("--source")
            .arg(source)
            .arg("--out")
            .arg(out)
            .args(args),
    );
}

/// The fourth seed's `plan` + `convert` on `src` into `out`, with recipe flags.
pub fn seed_requant(src: &Path, out: &Path, recipe: &[&str]) {
    run_ok(
        python()
            .arg(repo().join("tools/peers/run_seed_requant.py"))
            .arg("--seeds")
            .arg(shared().join("seeds"))
            .arg("--source")
            .arg(src)
            .arg("--out")
            .arg(out)
            .arg("--ggml-lib")
            .arg(ggml_lib())
            .args(recipe),
    );
}

/// tools/peers/run_sglang_kimi.py (SGLang's Kimi pack code: write, validate, manifest, reader) with
/// `args`; its output, whatever the status.
pub fn sglang_kimi_output(args: &[&str]) -> Output {
    let mut cmd = python();
    cmd.arg(repo().join("tools/peers/run_sglang_kimi.py")).args(args).env("XPACKFS_SHARED", shared());
    cmd.output().unwrap()
}

/// SGLang's Kimi pack code with `args`, which must succeed; its JSON result.
pub fn sglang_kimi(args: &[&str]) -> serde_json::Value {
    let out = sglang_kimi_output(args);
    assert!(out.status.success(), "SGLang ({args:?}) failed:\n{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The fields of the Kimi adapter manifest that record when and by what it was made.
pub const WHEN_AND_BY_WHAT: [&str; 2] = ["created_at", "sglang_git_sha"];

/// The manifest without [`WHEN_AND_BY_WHAT`] (each must be there).
pub fn without_when(mut v: serde_json::Value) -> serde_json::Value {
    for k in WHEN_AND_BY_WHAT {
        assert!(v.as_object_mut().unwrap().remove(k).is_some(), "manifest lacks {k}");
    }
    v
}

pub fn python() -> Command {
    Command::new(std::env::var("PYTHON").unwrap_or_else(|_| "python3".into()))
}

/// Run a command; panic with its output unless it succeeds.
pub fn run_ok(cmd: &mut Command) -> Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// `umount PATH`, retried briefly while the kernel still holds a handle that was just closed
/// (FUSE releases are asynchronous: an unmount right after a read can see EBUSY).
pub fn umount(path: &Path) {
    for _ in 0..50 {
        if Command::new("umount").arg(path).stderr(std::process::Stdio::null()).status().unwrap().success() {
            return;
        }
        if mounts_line(path).is_none() {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    run_ok(Command::new("umount").arg(path));
}

pub fn mounts_line(mountpoint: &Path) -> Option<String> {
    let want = mountpoint.to_string_lossy().to_string();
    std::fs::read_to_string("/proc/mounts").ok()?.lines().find(|l| l.split(' ').nth(1) == Some(&want)).map(str::to_string)
}

/// Live (not zombie) processes whose command line mentions `needle`.
pub fn live_processes_mentioning(needle: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else { continue };
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        let state = stat.rsplit_once(") ").map(|(_, r)| r.chars().next().unwrap_or('?')).unwrap_or('?');
        if state != 'Z' && String::from_utf8_lossy(&cmdline).contains(needle) && pid != std::process::id() {
            out.push(pid);
        }
    }
    out
}

pub fn wait_until(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < timeout, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Tests that mount need root and `/dev/fuse`: say so plainly instead of failing obscurely
/// in `mount`. (`cargo test --lib` runs the FUSE-free tests anywhere.)
pub fn require_fuse() {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    let fuse = Path::new("/dev/fuse").exists();
    if !root || !fuse {
        let why = match (root, fuse) {
            (false, false) => "it runs as uid != 0 and /dev/fuse is missing",
            (false, true) => "it runs as uid != 0",
            _ => "/dev/fuse is missing",
        };
        panic!(
            "this test mounts xpackfs for real and needs root and /dev/fuse, but {why}: run the tests as root (bash tools/test.sh, \
             or sudo -E cargo test), or `cargo test --lib` for the FUSE-free unit tests"
        );
    }
}

/// A live mount in a temporary directory; unmounted (and its daemon awaited) on drop.
pub struct Mount {
    pub dir: tempfile::TempDir,
    pub store: tempfile::TempDir,
    pub mountpoint: PathBuf,
}

impl Mount {
    pub fn new(source: &Path, opts: &[&str]) -> Mount {
        Self::try_new(source, opts).unwrap_or_else(|o| panic!("mount failed: {}", String::from_utf8_lossy(&o.stderr)))
    }

    pub fn try_new(source: &Path, opts: &[&str]) -> Result<Mount, Output> {
        require_fuse();
        let dir = tempfile::tempdir().unwrap();
        let store = tempfile::tempdir().unwrap();
        let mountpoint = dir.path().join("mnt");
        std::fs::create_dir(&mountpoint).unwrap();
        let mut o = format!("digest_store={}", store.path().display());
        for x in opts {
            o.push(',');
            o.push_str(x);
        }
        let out = Command::new(bin()).arg("mount").arg(source).arg(&mountpoint).arg("-o").arg(o).output().unwrap();
        if !out.status.success() {
            return Err(out);
        }
        assert!(mounts_line(&mountpoint).is_some(), "mount returned 0 but nothing is mounted");
        Ok(Mount { dir, store, mountpoint })
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.mountpoint.join(name)
    }

    pub fn unmount(&self) {
        if mounts_line(&self.mountpoint).is_some() {
            // A handle closed just before may still be on its way out (EBUSY): retry briefly.
            for _ in 0..20 {
                if Command::new("umount").arg(&self.mountpoint).stderr(std::process::Stdio::null()).status().unwrap().success() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            if mounts_line(&self.mountpoint).is_some() {
                run_ok(Command::new("umount").arg(&self.mountpoint));
            }
        }
        let needle = self.mountpoint.to_string_lossy().to_string();
        wait_until("the daemon to exit after unmount", Duration::from_secs(10), || live_processes_mentioning(&needle).is_empty());
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if mounts_line(&self.mountpoint).is_some() {
            let _ = Command::new("umount").arg("-l").arg(&self.mountpoint).status();
        }
    }
}

/// Every file below `dir` (names relative to it, hidden ones included), sorted.
pub fn tree_files(dir: &Path) -> Vec<String> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(root, &p, out);
            } else {
                out.push(p.strip_prefix(root).unwrap().to_string_lossy().into_owned());
            }
        }
    }
    let mut v = Vec::new();
    walk(dir, dir, &mut v);
    v.sort();
    v
}

/// Bytes of `path` in the page cache (util-linux `fincore`).
#[allow(dead_code)]
pub fn cached_bytes(path: &Path) -> u64 {
    let out = run_ok(Command::new("fincore").args(["--bytes", "--noheadings", "--output", "RES"]).arg(path));
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

/// Drop `path`'s pages from the page cache (this file's only: other tests run alongside;
/// written back first, since dirty pages are not dropped).
#[allow(dead_code)]
pub fn drop_cached(path: &Path) {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(path).unwrap();
    f.sync_all().unwrap();
    // SAFETY: fadvise on an open descriptor, whole file.
    assert_eq!(unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) }, 0);
}

/// Prints the sha256 of a file read with O_DIRECT (aligned buffers), then checks an mmap of
/// it gives the same bytes.
pub const ODIRECT_AND_MMAP: &str = r#"
import hashlib, mmap, os, sys
p = sys.argv[1]
size = os.path.getsize(p)
fd = os.open(p, os.O_RDONLY | os.O_DIRECT)
buf = mmap.mmap(-1, 1 << 20)
h, off = hashlib.sha256(), 0
while off < size:
    n = os.preadv(fd, [buf], off)
    h.update(buf[:n]); off += n
os.close(fd)
with open(p, "rb") as f:
    m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
    assert hashlib.sha256(m).hexdigest() == h.hexdigest(), "mmap differs from O_DIRECT"
print(h.hexdigest())
"#;

pub fn sha256_hex(b: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(b))
}
