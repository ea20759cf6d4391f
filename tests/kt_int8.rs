//! kt-kernel INT8: the virtual INT8 view against the second seed's validator and a numpy
//! oracle; `validate-int8` against the seed on a table of corruptions; read-only mounts
//! of existing trees.

mod common;

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;

const EXPECT: [&str; 10] = ["--layers", "0,1,2", "--numa-count", "2", "--expert-num", "8", "--hidden-size", "256", "--intermediate-size", "128"];

fn seed_validate(root: &Path, expect: &[&str], verify: bool) -> std::process::Output {
    let mut cmd = python();
    cmd.arg(repo().join("tools/peers/seed_validate_int8.py")).arg("--seeds").arg(shared().join("seeds")).arg(root).args(expect);
    if verify {
        cmd.arg("--verify-hashes");
    }
    cmd.output().unwrap()
}

fn ours_validate(root: &Path, expect: &[&str], verify: bool) -> std::process::Output {
    Command::new(bin()).arg("validate-int8").arg(root).args(expect).arg(if verify { "--verify-hashes" } else { "--no-verify-hashes" }).output().unwrap()
}

fn materialize_tree(source: &Path, out: &Path, opts: &str) {
    let r = Command::new(bin()).arg("materialize").arg(source).arg("--out").arg(out).args(["--margin-gib", "0", "-o", opts]).output().unwrap();
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
}

#[test]
fn mounted_views_pass_the_seed_validator_and_the_numpy_oracle() {
    let v4 = tempfile::tempdir().unwrap();
    run_ok(python().arg(repo().join("tools/fixtures/make_v4_fixture.py")).arg(v4.path()));
    let hf = tempfile::tempdir().unwrap();
    run_ok(python().arg(repo().join("tools/fixtures/make_hf_moe_fixture.py")).arg(hf.path()));
    let cases: [(PathBuf, [&str; 10]); 3] = [
        (sample(), EXPECT),
        (v4.path().to_path_buf(), ["--layers", "0,1", "--numa-count", "2", "--expert-num", "4", "--hidden-size", "256", "--intermediate-size", "128"]),
        (hf.path().to_path_buf(), ["--layers", "0,1", "--numa-count", "2", "--expert-num", "4", "--hidden-size", "256", "--intermediate-size", "128"]),
    ];
    for (source, expect) in cases {
        let m = Mount::new(&source, &["view=kt-int8", "numa_count=2"]);
        let out = seed_validate(&m.mountpoint, &expect, true);
        assert!(out.status.success(), "{}: seed rejects the view: {}", source.display(), String::from_utf8_lossy(&out.stderr));
        let out = ours_validate(&m.mountpoint, &expect, true);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        run_ok(python().arg(repo().join("tools/peers/check_int8.py")).arg("--source").arg(&source).arg("--tree").arg(&m.mountpoint));
        m.unmount();
    }
}

/// Apply one corruption to a copy of a valid tree; returns (root to validate, verify hashes).
fn corrupt(good: &Path, case: &str, dir: &Path) -> (PathBuf, bool) {
    let root = dir.join("tree");
    run_ok(Command::new("cp").arg("-a").arg(good).arg(&root));
    let manifest = root.join("kt-weight-manifest.json");
    let mut m: serde_json::Value = serde_json::from_slice(&std::fs::read(&manifest).unwrap()).unwrap();
    let quant = root.join("_layer_1/_numa_0/INT8_gate_3_16384Byte_quant_.kt");
    let mut verify = true;
    match case {
        "valid" => {}
        "extra_file_root" => std::fs::write(root.join("notes.txt"), b"x").unwrap(),
        "extra_file_numa" => std::fs::write(root.join("_layer_0/_numa_1/INT8_gate_0_16384Byte_quant_.kt.bak"), b"x").unwrap(),
        "missing_file" => std::fs::remove_file(&quant).unwrap(),
        "symlink_file" => {
            let target = dir.join("outside.kt");
            std::fs::rename(&quant, &target).unwrap();
            std::os::unix::fs::symlink(&target, &quant).unwrap();
        }
        "symlink_root" => {
            let link = dir.join("link");
            std::os::unix::fs::symlink(&root, &link).unwrap();
            return (link, verify);
        }
        "wrong_size" => {
            let mut b = std::fs::read(&quant).unwrap();
            b.push(0);
            std::fs::write(&quant, b).unwrap();
        }
        "wrong_hash" => {
            let mut b = std::fs::read(&quant).unwrap();
            b[100] ^= 1;
            std::fs::write(&quant, b).unwrap();
        }
        "wrong_hash_unverified" => {
            let mut b = std::fs::read(&quant).unwrap();
            b[100] ^= 1;
            std::fs::write(&quant, b).unwrap();
            verify = false;
        }
        "wrong_name" => m["layers"][0]["files"][0]["path"] = "_layer_0/_numa_0/INT8_gate_0_16384Byte_quant.kt".into(),
        "duplicate_layer" => {
            let l = m["layers"][1].clone();
            m["layers"].as_array_mut().unwrap().push(l);
        }
        "wrong_numa_count" => m["threadpool_count"] = 4.into(),
        "layer_numa_count" => m["layers"][2]["numa_count"] = 1.into(),
        "layer_not_ready" => m["layers"][0]["state"] = "writing".into(),
        "bad_layout" => m["layout"] = "kt-int8-n16-k32".into(),
        "bad_backend" => m["backend"] = "AMXINT8".into(),
        "bad_schema" => m["schema_version"] = 3.into(),
        "bool_as_int" => m["expert_num"] = true.into(),
        "bytes_total" => m["bytes"] = (m["bytes"].as_u64().unwrap() + 1).into(),
        "layer_bytes" => m["layers"][0]["bytes"] = (m["layers"][0]["bytes"].as_u64().unwrap() - 1).into(),
        "size_declared" => m["layers"][0]["files"][1]["size_bytes"] = 12.into(),
        "uppercase_hash" => {
            let h = m["layers"][0]["files"][0]["sha256"].as_str().unwrap().to_uppercase();
            m["layers"][0]["files"][0]["sha256"] = h.into();
        }
        "path_escape" => m["layers"][0]["files"][0]["path"] = "_layer_0/../_layer_0/INT8_gate_0_16384Byte_quant_.kt".into(),
        "two_manifests" => std::fs::write(root.join("kt-ephemeral-manifest.json"), b"{}").unwrap(),
        "legacy_schema1" => {
            m["schema_version"] = 1.into();
            m["backend"] = "AMXINT8".into();
            m.as_object_mut().unwrap().remove("layout");
            for l in m["layers"].as_array_mut().unwrap() {
                for f in l["files"].as_array_mut().unwrap() {
                    f.as_object_mut().unwrap().remove("sha256");
                }
            }
            std::fs::remove_file(&manifest).unwrap();
            std::fs::write(root.join("kt-ephemeral-manifest.json"), serde_json::to_vec(&m).unwrap()).unwrap();
            return (root, false);
        }
        "legacy_name_schema2" => {
            std::fs::rename(&manifest, root.join("kt-ephemeral-manifest.json")).unwrap();
            return (root, verify);
        }
        other => panic!("unknown case {other}"),
    }
    std::fs::write(&manifest, serde_json::to_vec_pretty(&m).unwrap()).unwrap();
    (root, verify)
}

#[test]
fn validate_int8_and_the_seed_agree_on_every_corruption() {
    let good_dir = tempfile::tempdir().unwrap();
    let good = good_dir.path().join("good");
    materialize_tree(&sample(), &good, "view=kt-int8,numa_count=2,digest_store=none");
    let table: &[(&str, bool)] = &[
        ("valid", true),
        ("extra_file_root", false),
        ("extra_file_numa", false),
        ("missing_file", false),
        ("symlink_file", false),
        ("symlink_root", false),
        ("wrong_size", false),
        ("wrong_hash", false),
        ("wrong_hash_unverified", true),
        ("wrong_name", false),
        ("duplicate_layer", false),
        ("wrong_numa_count", false),
        ("layer_numa_count", false),
        ("layer_not_ready", false),
        ("bad_layout", false),
        ("bad_backend", false),
        ("bad_schema", false),
        ("bool_as_int", false),
        ("bytes_total", false),
        ("layer_bytes", false),
        ("size_declared", false),
        ("uppercase_hash", false),
        ("path_escape", false),
        ("two_manifests", false),
        ("legacy_schema1", true),
        ("legacy_name_schema2", false),
    ];
    let mut disagreements = Vec::new();
    for (case, valid) in table {
        let dir = tempfile::tempdir().unwrap();
        let (root, verify) = corrupt(&good, case, dir.path());
        let seed = seed_validate(&root, &EXPECT, verify);
        let ours = ours_validate(&root, &EXPECT, verify);
        let (s, o) = (seed.status.success(), ours.status.success());
        if s != *valid || o != *valid {
            disagreements.push(format!(
                "{case}: expected valid={valid}, seed={s} ({}), ours={o} ({})",
                String::from_utf8_lossy(&seed.stderr).trim(),
                String::from_utf8_lossy(&ours.stderr).trim()
            ));
        }
        if !o {
            assert_eq!(ours.status.code(), Some(1), "{case}: invalid trees exit 1");
        }
    }
    assert!(disagreements.is_empty(), "{}", disagreements.join("\n"));
}

#[test]
fn existing_trees_mount_read_only_after_validation() {
    let dir = tempfile::tempdir().unwrap();
    let tree = dir.path().join("tree");
    materialize_tree(&sample(), &tree, "view=kt-int8,numa_count=2,digest_store=none");
    let log = dir.path().join("daemon.log");
    let m = Mount::new(&tree, &["verify_hashes", &format!("log_file={}", log.display())]);
    let out = seed_validate(&m.mountpoint, &EXPECT, true);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // mmap works on passthrough files too.
    let probe = "_layer_1/_numa_0/INT8_gate_2_16384Byte_quant_.kt";
    let mapped = {
        let f = std::fs::File::open(m.path(probe)).unwrap();
        let len = f.metadata().unwrap().len() as usize;
        // SAFETY: a read-only shared mapping of an open file, of its length; checked against MAP_FAILED below.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_SHARED, std::os::fd::AsRawFd::as_raw_fd(&f), 0) };
        assert_ne!(p, libc::MAP_FAILED);
        // SAFETY: `p` maps `len` readable bytes until the munmap below.
        let v = unsafe { std::slice::from_raw_parts(p as *const u8, len) }.to_vec();
        // SAFETY: `p` and `len` are the mapping made above, no longer referenced.
        unsafe { libc::munmap(p, len) };
        v
    };
    assert!(mapped == std::fs::read(tree.join(probe)).unwrap());
    // A file changed underneath (in place, same size) is EIO, not new bytes. (The validator
    // above read it through the mount: drop those cached pages first, or the kernel serves
    // the old, validated bytes without asking the daemon.)
    let victim = "_layer_2/_numa_1/INT8_down_7_16384Byte_quant_.kt";
    {
        let f = std::fs::File::open(m.path(victim)).unwrap();
        // SAFETY: posix_fadvise on an open descriptor; no memory is passed.
        unsafe { libc::posix_fadvise(std::os::fd::AsRawFd::as_raw_fd(&f), 0, 0, libc::POSIX_FADV_DONTNEED) };
    }
    let mut b = std::fs::read(tree.join(victim)).unwrap();
    b[0] ^= 0xFF;
    std::fs::write(tree.join(victim), &b).unwrap();
    match std::fs::read(m.path(victim)) {
        Ok(got) => panic!("read of a changed file returned {} bytes (changed bytes served: {})", got.len(), got == b),
        Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EIO)),
    }
    assert!(std::fs::read(m.path("_layer_0/_numa_0/INT8_up_1_16384Byte_quant_.kt")).is_ok());
    m.unmount();
    // This kernel (6.9+) and root: every file was served by FUSE passthrough, no read went
    // through the daemon.
    let text = std::fs::read_to_string(&log).unwrap();
    let line = text.lines().find(|l| l.contains("opens served by the kernel")).unwrap_or_else(|| panic!("{text}"));
    assert!(line.contains("; 0 reads through the daemon") && !line.contains("passthrough: 0 opens"), "{line}");
    // An invalid tree refuses to mount, with the validator's reason.
    std::fs::write(tree.join("stray"), b"x").unwrap();
    let err = Mount::try_new(&tree, &[]).err().expect("mounted an invalid tree");
    assert!(String::from_utf8_lossy(&err.stderr).contains("root entries differ from its manifest: extra=['stray']"));
}

/// Without passthrough (`passthrough=off`, or where the kernel lacks it) every read goes
/// through the daemon, which checks the file after each read: a file changed in place while
/// it is open gives EIO on the next read, never the new bytes.
#[test]
fn without_passthrough_a_file_changed_while_open_reads_eio() {
    let dir = tempfile::tempdir().unwrap();
    let tree = dir.path().join("tree");
    materialize_tree(&sample(), &tree, "view=kt-int8,numa_count=2,digest_store=none");
    let log = dir.path().join("daemon.log");
    let m = Mount::new(&tree, &["passthrough=off", &format!("log_file={}", log.display())]);
    let victim = "_layer_0/_numa_1/INT8_down_3_16384Byte_quant_.kt";
    let f = std::fs::File::open(m.path(victim)).unwrap();
    let mut head = [0u8; 4096];
    f.read_exact_at(&mut head, 0).unwrap();
    // SAFETY: posix_fadvise on an open descriptor; no memory is passed.
    unsafe { libc::posix_fadvise(std::os::fd::AsRawFd::as_raw_fd(&f), 0, 0, libc::POSIX_FADV_DONTNEED) };
    let mut b = std::fs::read(tree.join(victim)).unwrap();
    b[8192] ^= 0xFF;
    std::fs::write(tree.join(victim), &b).unwrap();
    let mut buf = vec![0u8; 4096];
    let err = f.read_exact_at(&mut buf, 8192).expect_err("changed bytes were served");
    assert_eq!(err.raw_os_error(), Some(libc::EIO));
    drop(f);
    m.unmount();
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("passthrough: 0 opens") && text.contains("modified in place"), "{text}");
}
