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
    let mut v: Vec<String> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).filter(|n| !n.starts_with('.')).collect();
    v.sort();
    v
}

#[test]
fn every_view_materializes_to_the_mounted_bytes() {
    let v4 = tempfile::tempdir().unwrap();
    run_ok(python().arg(repo().join("tools/fixtures/make_v4_fixture.py")).arg(v4.path()).args(["--variant", "v41", "--inter", "256"]));
    let cases: Vec<(std::path::PathBuf, &str)> =
        vec![(sample(), "top_k=2"), (v4.path().to_path_buf(), "view=bf16-cache"), (v4.path().to_path_buf(), "view=requant")];
    for (source, opts) in cases {
        let out = tempfile::tempdir().unwrap();
        let o = format!("{opts},digest_store=none");
        let r = materialize(&source, out.path(), &["-o", &o, "--verify", "--json"]);
        assert!(r.status.success(), "{opts}: {}", String::from_utf8_lossy(&r.stderr));
        let summary: serde_json::Value = serde_json::from_slice(&r.stdout).unwrap();
        let m = Mount::new(&source, &[opts]);
        // materialize also writes the seed's completed build checkpoint, which a mount does not serve.
        let written: Vec<String> = files(out.path()).into_iter().filter(|n| !n.ends_with(".pack.checkpoint.json")).collect();
        assert_eq!(written, files(&m.mountpoint), "{opts}");
        for name in written {
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
    run_ok(python().arg(repo().join("tools/fixtures/make_v4_fixture.py")).arg(src.path()).args(["--variant", "v41", "--inter", "256"]));
    let reference = tempfile::tempdir().unwrap();
    let r = materialize(src.path(), reference.path(), &["-o", "view=requant,digest_store=none"]);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));

    let out = tempfile::tempdir().unwrap();
    let mut kills = 0;
    for (i, delay_ms) in [40u64, 120, 250, 400, 600].into_iter().enumerate() {
        let mut cmd = Command::new(bin());
        cmd.arg("materialize").arg(src.path()).arg("--out").arg(out.path()).args([
            "--margin-gib",
            "0",
            "--chunk-kib",
            "4",
            "-o",
            "view=requant,digest_store=none",
        ]);
        cmd.env("XPACKFS_TEST_SYNC_EVERY_CHUNK", "1");
        if i > 0 {
            cmd.arg("--resume");
        }
        let mut child = cmd.stderr(std::process::Stdio::null()).spawn().unwrap();
        std::thread::sleep(Duration::from_millis(delay_ms));
        if child.try_wait().unwrap().is_none() {
            let _ = child.kill();
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
    let _ = child.kill();
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

fn stderr(r: &std::process::Output) -> String {
    String::from_utf8_lossy(&r.stderr).into_owned()
}

/// N processes at once (`--partition I/N`), then `--finalize`, give the bytes of one
/// single-process run into the same directory, for every view; the digests `--finalize`
/// records let a mount serve complete manifests without hashing anything.
#[test]
fn partitions_then_finalize_equal_a_single_run() {
    let v4 = tempfile::tempdir().unwrap();
    run_ok(python().arg(repo().join("tools/fixtures/make_v4_fixture.py")).arg(v4.path()).args(["--variant", "v41", "--inter", "256"]));
    let cases: Vec<(std::path::PathBuf, &str, usize, &str)> = vec![
        (sample(), "top_k=2", 3, "64K"),
        (v4.path().to_path_buf(), "view=bf16-cache", 4, "64K"),
        (v4.path().to_path_buf(), "view=requant", 3, "64K"),
        (sample(), "view=kt-int8,numa_count=2", 5, "8K"),
    ];
    for (source, opts, n, piece) in cases {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("out");
        let store = tmp.path().join("digests");
        let o = format!("{opts},digest_store={}", store.display());
        // The source's digests first (what `xpackfs digest` does before a cluster run), so
        // both runs record the same digest pass (the manifests' times are the digest pass's).
        run_ok(Command::new(bin()).arg("digest").arg(&source).arg("--digest-store").arg(&store));
        let store_copy = tmp.path().join("digests-copy");
        std::fs::create_dir(&store_copy).unwrap();
        for e in std::fs::read_dir(&store).unwrap() {
            let e = e.unwrap();
            std::fs::copy(e.path(), store_copy.join(e.file_name())).unwrap();
        }
        let r = materialize(&source, &out, &["-o", &o, "--piece-size", piece]);
        assert!(r.status.success(), "{opts}: {}", stderr(&r));
        let reference = tmp.path().join("reference");
        std::fs::rename(&out, &reference).unwrap();
        // The parts start from the store as it was before the single run.
        std::fs::remove_dir_all(&store).unwrap();
        std::fs::rename(&store_copy, &store).unwrap();

        // The parts, all at once; small pieces cut the larger files across them.
        let children: Vec<_> = (0..n)
            .map(|i| {
                Command::new(bin())
                    .arg("materialize")
                    .arg(&source)
                    .arg("--out")
                    .arg(&out)
                    .args(["--margin-gib", "0", "-o", &o, "--partition", &format!("{i}/{n}"), "--piece-size", piece])
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        for c in children {
            let r = c.wait_with_output().unwrap();
            assert!(r.status.success(), "{opts}: {}", stderr(&r));
        }
        let plan: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join(".xpackfs-parts/plan.json")).unwrap()).unwrap();
        let pieces = plan["pieces"].as_array().unwrap();
        assert!(pieces.iter().any(|p| p["whole"] == false), "{opts}: nothing was cut");
        for i in 0..n {
            assert!(pieces.iter().any(|p| p["partition"] == i), "{opts}: partition {i} had nothing to do");
        }
        let r = materialize(&source, &out, &["-o", &o, "--finalize", "--verify"]);
        assert!(r.status.success(), "{opts}: {}", stderr(&r));
        assert_eq!(tree_files(&out), tree_files(&reference), "{opts}");
        for name in tree_files(&reference) {
            assert!(std::fs::read(out.join(&name)).unwrap() == std::fs::read(reference.join(&name)).unwrap(), "{opts}: {name} differs");
        }

        // The expert pack's digest (its manifest's pack_sha256) was recorded by --finalize.
        if let Some(manifest) = tree_files(&reference).iter().find(|n| n.ends_with(".pack.manifest.json")) {
            let m: serde_json::Value = serde_json::from_slice(&std::fs::read(reference.join(manifest)).unwrap()).unwrap();
            let sha = m["pack_sha256"].as_str().unwrap();
            let recorded = std::fs::read_dir(store.join("views"))
                .unwrap()
                .flatten()
                .any(|e| std::fs::read(e.path()).ok().and_then(|b| serde_json::from_slice::<Vec<String>>(&b).ok()).is_some_and(|d| d.iter().any(|h| h == sha)));
            assert!(recorded, "{opts}: pack_sha256 not recorded in the digest store");
        }
        // The manifests' digests are in the store: a mount serves them computing nothing.
        let m = Mount::new(&source, &[&o]);
        for name in tree_files(&reference).iter().filter(|n| n.ends_with(".json")) {
            if let Ok(b) = std::fs::read(m.path(name)) {
                assert!(b == std::fs::read(reference.join(name)).unwrap() || name.ends_with(".pack.manifest.json"), "{opts}: {name}");
            }
        }
        if let Ok(stats) = std::fs::read(m.path(".xpackfs/stats.json")) {
            let stats: serde_json::Value = serde_json::from_slice(&stats).unwrap();
            assert_eq!(stats["cache"]["bytes_computed"], 0, "{opts}: reading the manifests computed chunks");
        }
        m.unmount();
    }
}

#[test]
fn finalize_names_unfinished_and_damaged_parts_and_parts_continue() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let o = "top_k=2,digest_store=none";
    let part = |i: usize| materialize(&sample(), &out, &["-o", o, "--partition", &format!("{i}/3"), "--piece-size", "128K"]);
    for i in [0, 2] {
        let r = part(i);
        assert!(r.status.success(), "{}", stderr(&r));
    }
    let r = materialize(&sample(), &out, &["-o", o, "--finalize"]);
    assert!(!r.status.success());
    assert!(stderr(&r).contains("unfinished partitions: partition 1/3"), "{}", stderr(&r));
    // A different split of the same output is refused.
    let r = materialize(&sample(), &out, &["-o", o, "--partition", "1/4", "--piece-size", "128K"]);
    assert!(!r.status.success() && stderr(&r).contains("planned differently"), "{}", stderr(&r));
    // A single-process run into a partitioned output is refused.
    let r = materialize(&sample(), &out, &["-o", o, "--resume"]);
    assert!(!r.status.success() && stderr(&r).contains("partitioned run"), "{}", stderr(&r));
    assert!(part(1).status.success());
    // Running a finished part again does nothing.
    let again = part(1);
    assert!(again.status.success());
    // Damage one byte of the cut pack: finalize names the piece and its partition.
    let partial = out.join(".sample-moe.pack.partial");
    let f = std::fs::OpenOptions::new().write(true).open(&partial).unwrap();
    std::os::unix::fs::FileExt::write_at(&f, b"\xff", 300_000).unwrap();
    drop(f);
    let r = materialize(&sample(), &out, &["-o", o, "--finalize"]);
    assert!(!r.status.success());
    let e = stderr(&r);
    assert!(e.contains("sample-moe.pack bytes 262144..393216 (piece 2, partition") && e.contains("hash to"), "{e}");
    // As the message says: drop that piece's record, run its partition again, finalize.
    let plan: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join(".xpackfs-parts/plan.json")).unwrap()).unwrap();
    let owner = plan["pieces"][2]["partition"].as_u64().unwrap() as usize;
    std::fs::remove_file(out.join(".xpackfs-parts/piece-000002.json")).unwrap();
    assert!(part(owner).status.success());
    let r = materialize(&sample(), &out, &["-o", o, "--finalize", "--verify"]);
    assert!(r.status.success(), "{}", stderr(&r));
    assert!(!out.join(".xpackfs-parts").exists());
    let single = tmp.path().join("single");
    assert!(materialize(&sample(), &single, &["-o", o]).status.success());
    assert!(std::fs::read(out.join("sample-moe.pack")).unwrap() == std::fs::read(single.join("sample-moe.pack")).unwrap());
    // A finished output is not partitioned again.
    let r = part(0);
    assert!(!r.status.success() && stderr(&r).contains("finished output"), "{}", stderr(&r));
}

/// `--verify` checks what the manifests declare: a damaged byte in a completed output is
/// found by `--resume --verify` (which re-hashes completed files from disk).
#[test]
fn verify_finds_damage_the_manifests_describe() {
    let v4 = tempfile::tempdir().unwrap();
    run_ok(python().arg(repo().join("tools/fixtures/make_v4_fixture.py")).arg(v4.path()).args(["--variant", "v41", "--inter", "256"]));
    let cases: Vec<(std::path::PathBuf, &str, &str, &str)> = vec![
        (v4.path().to_path_buf(), "view=requant", "quant-00001-of-00003.safetensors", "hashes to"),
        (sample(), "top_k=2", "sample-moe.pack", "does not match sample-moe.pack"),
        (v4.path().to_path_buf(), "view=bf16-cache", "non-expert-000.safetensors", "does not match its digest"),
        (sample(), "view=kt-int8,numa_count=2", "_layer_1/_numa_0/INT8_up_3_16384Byte_quant_.kt", "does not match its digest in kt-weight-manifest.json"),
    ];
    for (source, opts, victim, message) in cases {
        let out = tempfile::tempdir().unwrap();
        let o = format!("{opts},digest_store=none");
        let r = materialize(&source, out.path(), &["-o", &o]);
        assert!(r.status.success(), "{opts}: {}", stderr(&r));
        let r = materialize(&source, out.path(), &["-o", &o, "--resume", "--verify"]);
        assert!(r.status.success(), "{opts}: an intact output must verify: {}", stderr(&r));
        let names = tree_files(out.path());
        let victim = names.iter().find(|n| n.ends_with(victim)).unwrap_or_else(|| panic!("{opts}: no {victim} in {names:?}"));
        let path = out.path().join(victim);
        let size = std::fs::metadata(&path).unwrap().len();
        let f = std::fs::OpenOptions::new().read(true).write(true).open(&path).unwrap();
        let mut b = [0u8; 1];
        std::os::unix::fs::FileExt::read_exact_at(&f, &mut b, size - 10).unwrap();
        std::os::unix::fs::FileExt::write_at(&f, &[b[0] ^ 0x40], size - 10).unwrap();
        drop(f);
        let r = materialize(&source, out.path(), &["-o", &o, "--resume", "--verify"]);
        assert!(!r.status.success(), "{opts}: damage in {victim} went unnoticed");
        assert!(stderr(&r).contains(message), "{opts}: {}", stderr(&r));
    }
}

/// A run stopped by bad content (an E8M0 NaN scale, found only when that shard is computed)
/// leaves partial files and the state only, never a final file, and names the file and the
/// rule; a run whose `--verify` fails leaves no final file either.
#[test]
fn a_failed_run_leaves_no_final_file() {
    let src = tempfile::tempdir().unwrap();
    let fixture = repo().join("tools/fixtures/make_v4_fixture.py");
    run_ok(python().arg(fixture).arg(src.path()).args(["--variant", "v41", "--inter", "256", "--corrupt", "expert_e8m0_nan"]));
    let out = tempfile::tempdir().unwrap();
    let r = materialize(src.path(), out.path(), &["-o", "view=requant,digest_store=none"]);
    assert!(!r.status.success());
    let err = stderr(&r);
    assert!(err.contains("quant-0000") && err.contains("E8M0 NaN"), "{err}");
    assert_eq!(files(out.path()), Vec::<String>::new(), "final files left by a failed run");
    assert!(out.path().join(".xpackfs-materialize.json").exists(), "the state is kept for --resume");

    // --verify failing after every file was written: the files go back to partials.
    let good = tempfile::tempdir().unwrap();
    let out = good.path().join("pack");
    let r = materialize(&sample(), &out, &["-o", "top_k=2,digest_store=none"]);
    assert!(r.status.success(), "{}", stderr(&r));
    let pack = out.join("sample-moe.pack");
    let mut bytes = std::fs::read(&pack).unwrap();
    let n = bytes.len();
    bytes[n - 5000] ^= 1;
    std::fs::write(&pack, bytes).unwrap();
    let r = materialize(&sample(), &out, &["-o", "top_k=2,digest_store=none", "--resume", "--verify"]);
    assert!(!r.status.success() && stderr(&r).contains("does not match sample-moe.pack"), "{}", stderr(&r));
    assert_eq!(files(&out), Vec::<String>::new(), "unverified final files left");
}
