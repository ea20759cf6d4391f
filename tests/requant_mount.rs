//! The requantised-shards view against the fourth seed itself (run with the reference
//! ggml library: $XPACKFS_GGML_LIB, see tools/build_ggml_ref.sh), file for file.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;

fn fixture(dir: &Path, args: &[&str]) {
    run_ok(python().arg(repo().join("tools/fixtures/make_v4_fixture.py")).arg(dir).args(["--variant", "v41", "--inter", "256"]).args(args));
}

fn seed_convert(src: &Path, out: &Path, recipe: &[&str]) {
    seed_requant(src, out, recipe);
}

fn listing(dir: &Path) -> Vec<String> {
    // Hidden entries (the mount's /.xpackfs status directory) are not part of the view.
    let mut v: Vec<String> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).filter(|n| !n.starts_with('.')).collect();
    v.sort();
    v
}

fn assert_same_tree(seed: &Path, mount: &Path) {
    assert_eq!(listing(seed), listing(mount), "file lists differ");
    for name in listing(seed) {
        let a = std::fs::read(seed.join(&name)).unwrap();
        let b = std::fs::read(mount.join(&name)).unwrap();
        assert!(a == b, "{name}: the mounted view differs from the seed's output ({} vs {} bytes)", b.len(), a.len());
    }
}

#[test]
fn view_is_byte_identical_to_the_seed_for_two_recipes() {
    let src = tempfile::tempdir().unwrap();
    fixture(src.path(), &[]);
    let src_path = std::fs::canonicalize(src.path()).unwrap();
    for (seed_args, opts) in [
        (vec![], vec!["view=requant", "cache_mb=1"]),
        (vec!["--w1", "Q2_K", "--w2", "IQ2_XXS", "--w3", "Q2_K"], vec!["view=requant", "w1=Q2_K", "w2=IQ2_XXS", "w3=Q2_K"]),
    ] {
        let out = tempfile::tempdir().unwrap();
        seed_convert(&src_path, out.path(), &seed_args);
        let m = Mount::new(&src_path, &opts);
        assert_same_tree(out.path(), &m.mountpoint);
        m.unmount();
    }
}

#[test]
fn seed_verify_accepts_the_mounted_view() {
    let src = tempfile::tempdir().unwrap();
    fixture(src.path(), &[]);
    let m = Mount::new(src.path(), &["view=requant"]);
    let tmp = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(shared().join("seeds/v41_quant_experts.py.txt")).unwrap();
    let seed: PathBuf = tmp.path().join("seed.py");
    std::fs::write(&seed, &text[text.find("#!/usr/bin/env python3").unwrap()..]).unwrap();
    let out = run_ok(python().arg(&seed).arg("verify").arg("--out").arg(&m.mountpoint).args(["--sample", "0"]));
    assert!(String::from_utf8_lossy(&out.stdout).contains("verify: OK"));
    m.unmount();
}

#[test]
fn bad_expert_inputs() {
    for (case, expect) in [
        ("expert_scale_missing", "layers.0.ffn.experts.1.w2.weight: no matching MXFP4 scale tensor"),
        ("expert_packed_shape", "layers.0.ffn.experts.3.w3.weight: packing mismatch"),
    ] {
        let src = tempfile::tempdir().unwrap();
        fixture(src.path(), &["--corrupt", case]);
        let err = Mount::try_new(src.path(), &["view=requant"]).err().unwrap_or_else(|| panic!("{case}: mounted"));
        let msg = String::from_utf8_lossy(&err.stderr);
        assert!(msg.contains(expect), "{case}: {msg}");
    }
    // Row length not a multiple of 256 (inter 128 makes w2 rows 128 long).
    let src = tempfile::tempdir().unwrap();
    run_ok(python().arg(repo().join("tools/fixtures/make_v4_fixture.py")).arg(src.path()).args(["--variant", "v41", "--inter", "128"]));
    let err = Mount::try_new(src.path(), &["view=requant"]).err().expect("mounted");
    assert!(String::from_utf8_lossy(&err.stderr).contains("128 is not a multiple of 256"));
    // E8M0 255 is only seen on read: EIO for that shard, with a log line naming the tensor.
    let src = tempfile::tempdir().unwrap();
    fixture(src.path(), &["--corrupt", "expert_e8m0_nan"]);
    let log = src.path().join("log");
    let m = Mount::new(src.path(), &["view=requant", &format!("log_file={}", log.display())]);
    let results: Vec<bool> = (1..=3).map(|i| std::fs::read(m.path(&format!("quant-{i:05}-of-00003.safetensors"))).is_ok()).collect();
    assert_eq!(results.iter().filter(|ok| !**ok).count(), 1, "{results:?}");
    m.unmount();
    let log = std::fs::read_to_string(&log).unwrap();
    assert!(log.contains("layers.1.ffn.experts.0.w1.weight") && log.contains("E8M0 NaN"), "{log}");
    let _ = Command::new("true").status();
}

#[test]
fn imatrix_in_both_formats_lowers_the_weighted_error() {
    let src = tempfile::tempdir().unwrap();
    fixture(src.path(), &[]);
    let files = tempfile::tempdir().unwrap();
    let (gguf_imat, dat_imat) = (files.path().join("imatrix.gguf"), files.path().join("imatrix.dat"));
    run_ok(python().arg(repo().join("tools/imatrix_tool.py")).arg("make").arg(src.path()).arg(&gguf_imat).arg("--legacy").arg(&dat_imat));
    let unit = Mount::new(src.path(), &["view=requant"]);
    for imat in [&gguf_imat, &dat_imat] {
        let m = Mount::new(src.path(), &["view=requant", &format!("imatrix={}", imat.display())]);
        let out =
            run_ok(python().arg(repo().join("tools/imatrix_tool.py")).arg("gain").arg(src.path()).arg(&unit.mountpoint).arg(&m.mountpoint).arg(&gguf_imat));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert!(v["imatrix_over_unit"].as_f64().unwrap() < 0.9, "{v}");
        // The manifests say which importance was used, per tensor.
        let manifest: serde_json::Value = serde_json::from_slice(&std::fs::read(m.path("quant-00001-of-00003.safetensors.manifest.json")).unwrap()).unwrap();
        assert!(manifest["importance"].as_str().unwrap().contains(&*imat.to_string_lossy()));
        assert!(manifest["tensors"].as_array().unwrap().iter().any(|t| t["importance_row"].as_str().is_some_and(|r| r.starts_with("blk."))));
        m.unmount();
    }
    unit.unmount();
    // An imatrix without rows for these experts refuses to mount, naming the tensor.
    let other = tempfile::tempdir().unwrap();
    run_ok(python().arg(repo().join("tools/fixtures/make_v4_fixture.py")).arg(other.path()).args(["--variant", "v41", "--inter", "256", "--layers", "1"]));
    let small = files.path().join("small.gguf");
    run_ok(python().arg(repo().join("tools/imatrix_tool.py")).arg("make").arg(other.path()).arg(&small));
    let err = Mount::try_new(src.path(), &["view=requant", &format!("imatrix={}", small.display())]).err().expect("mounted");
    let msg = String::from_utf8_lossy(&err.stderr);
    assert!(msg.contains("no importance entry blk.1.ffn_") && msg.contains("layers.1.ffn.experts."), "{msg}");
}
