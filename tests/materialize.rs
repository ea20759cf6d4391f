//! `xpackfs materialize`: same bytes as the mount for every view, durable and resumable.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::*;

fn materialize(source: &Path, out: &Path, extra: &[&str]) -> std::process::Output {
    Command::new(bin()).arg("materialize").arg(source).arg("--out").arg(out).args(["--margin-gib", "0"]).args(extra).output().unwrap()
}

fn files(dir: &Path) -> Vec<String> {
    // Hidden entries (the mount's /.xpackfs status directory) are not part of the view.
    let mut v: Vec<String> =
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).filter(|n| !n.starts_with('.')).collect();
    v.sort();
    v
}

#[test]
fn every_view_materializes_to_the_mounted_bytes() {
    let v4 = tempfile::tempdir().unwrap();
    run_ok(python().arg(repo().join("tools/make_v4_fixture.py")).arg(v4.path()).args(["--variant", "v41", "--inter", "256"]));
    let cases: Vec<(std::path::PathBuf, &str)> =
        vec![(sample(), "top_k=2"), (v4.path().to_path_buf(), "view=bf16-cache"), (v4.path().to_path_buf(), "view=requant")];
    for (source, opts) in cases {
        let out = tempfile::tempdir().unwrap();
        let o = format!("{opts},digest_store=none");
        let r = materialize(&source, out.path(), &["-o", &o, "--verify", "--json"]);
        assert!(r.status.success(), "{opts}: {}", String::from_utf8_lossy(&r.stderr));
        let summary: serde_json::Value = serde_json::from_slice(&r.stdout).unwrap();
        let m = Mount::new(&source, &[opts]);
        assert_eq!(files(out.path()), files(&m.mountpoint), "{opts}");
        for name in files(out.path()) {
            let a = std::fs::read(out.path().join(&name)).unwrap();
            let b = std::fs::read(m.path(&name)).unwrap();
            if name.ends_with(".pack.manifest.json") {
                // Only the pack's own path differs (each names where its pack is).
                let strip = |b: &[u8], dir: &Path| String::from_utf8_lossy(b).replace(&*dir.to_string_lossy(), "DIR").replace("materialize", "CMD");
                let (sa, sb) = (strip(&a, out.path()), strip(&b, &m.mountpoint));
                let pa: serde_json::Value = serde_json::from_str(&sa).unwrap();
                let pb: serde_json::Value = serde_json::from_str(&sb).unwrap();
                assert_eq!(pa["pack_path"], pb["pack_path"]);
                assert_eq!(pa["pack_sha256"], pb["pack_sha256"]);
                continue;
            }
            assert!(a == b, "{opts}: {name} differs between materialize and the mount");
            let f = summary["files"].as_array().unwrap().iter().find(|f| f["name"] == name.as_str()).unwrap();
            assert_eq!(f["sha256"], xpackfs::digest::sha256_hex(&a).as_str(), "{name}: summary digest");
        }
        m.unmount();
        // No temporary or state files are left behind.
        let all: Vec<String> = std::fs::read_dir(out.path()).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        assert!(all.iter().all(|f| !f.starts_with('.')), "{all:?}");
    }
}

#[test]
fn kill_9_at_several_points_then_resume_gives_identical_bytes() {
    let src = tempfile::tempdir().unwrap();
    run_ok(python().arg(repo().join("tools/make_v4_fixture.py")).arg(src.path()).args(["--variant", "v41", "--inter", "256"]));
    let reference = tempfile::tempdir().unwrap();
    let r = materialize(src.path(), reference.path(), &["-o", "view=requant,digest_store=none"]);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));

    let out = tempfile::tempdir().unwrap();
    let mut kills = 0;
    for (i, delay_ms) in [40u64, 120, 250, 400, 600].into_iter().enumerate() {
        let mut cmd = Command::new(bin());
        cmd.arg("materialize").arg(src.path()).arg("--out").arg(out.path()).args(["--margin-gib", "0", "--chunk-kib", "4", "-o", "view=requant,digest_store=none"]);
        cmd.env("XPACKFS_TEST_SYNC_EVERY_CHUNK", "1");
        if i > 0 {
            cmd.arg("--resume");
        }
        let mut child = cmd.stderr(std::process::Stdio::null()).spawn().unwrap();
        std::thread::sleep(Duration::from_millis(delay_ms));
        if child.try_wait().unwrap().is_none() {
            unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
            kills += 1;
        }
        let _ = child.wait();
    }
    assert!(kills >= 2, "the run finished before it could be interrupted");
    let r = materialize(src.path(), out.path(), &["--resume", "--verify", "-o", "view=requant,digest_store=none"]);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    assert_eq!(files(out.path()), files(reference.path()));
    for name in files(reference.path()) {
        assert!(std::fs::read(out.path().join(&name)).unwrap() == std::fs::read(reference.path().join(&name)).unwrap(), "{name}");
    }
}

#[test]
fn refuses_to_overwrite_and_detects_a_changed_source_across_resume() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("s.gguf");
    std::fs::copy(sample(), &src).unwrap();
    let out = tmp.path().join("out");
    let mut child = Command::new(bin())
        .arg("materialize")
        .arg(&src)
        .arg("--out")
        .arg(&out)
        .args(["--margin-gib", "0", "--chunk-kib", "4", "-o", "digest_store=none"])
        .env("XPACKFS_TEST_SYNC_EVERY_CHUNK", "1")
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(150));
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    let _ = child.wait();
    // Touching the source changes its identity: resume refuses.
    let f = std::fs::OpenOptions::new().write(true).open(&src).unwrap();
    f.set_modified(std::time::SystemTime::now() + Duration::from_secs(5)).unwrap();
    drop(f);
    let r = materialize(&src, &out, &["--resume", "-o", "digest_store=none"]);
    assert!(!r.status.success());
    assert!(String::from_utf8_lossy(&r.stderr).contains("the source changed"), "{}", String::from_utf8_lossy(&r.stderr));
    // --replace starts over and completes; a second plain run refuses to overwrite.
    let r = materialize(&src, &out, &["--replace", "-o", "digest_store=none"]);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let r = materialize(&src, &out, &["-o", "digest_store=none"]);
    assert!(!r.status.success() && String::from_utf8_lossy(&r.stderr).contains("already exists"));
}
