//! The BF16 non-expert cache view, mounted for real and checked against Python
//! safetensors and a numpy/ml_dtypes conversion (tools/peers/check_bf16_cache.py), plus the
//! seed's error conditions (tools/fixtures/make_v4_fixture.py --corrupt).

mod common;

use std::path::Path;
use std::process::Command;

use common::*;

fn fixture(dir: &Path, args: &[&str]) {
    run_ok(python().arg(repo().join("tools/fixtures/make_v4_fixture.py")).arg(dir).args(args));
}

fn check(source: &Path, cache: &Path) {
    run_ok(python().arg(repo().join("tools/peers/check_bf16_cache.py")).arg("--source").arg(source).arg("--cache").arg(cache));
}

#[test]
fn v4_and_v41_caches_equal_the_reference_conversion() {
    for variant in ["v4", "v41"] {
        let src = tempfile::tempdir().unwrap();
        fixture(src.path(), &["--variant", variant]);
        let m = Mount::new(src.path(), &["cache_mb=1"]); // a tiny cache: chunks evicted and recomputed
        check(src.path(), &m.mountpoint);
        // Requests inside one chunk were replied from the chunk, with no copy in the daemon.
        let stats: serde_json::Value = serde_json::from_slice(&std::fs::read(m.path(".xpackfs/stats.json")).unwrap()).unwrap();
        let (held, served) = (stats["bytes_held"].as_u64().unwrap(), stats["bytes_served"].as_u64().unwrap());
        assert!(held > 0 && held <= served, "{stats}");
        // Reading again (manifest digests now remembered, chunks recomputed) gives the same bytes.
        let a = std::fs::read(m.path("non-expert-001.safetensors")).unwrap();
        let b = std::fs::read(m.path("non-expert-001.safetensors")).unwrap();
        assert!(a == b);
        m.unmount();
        // A new mount with the same store serves the manifest from the remembered digests.
        let views = m.store.path().join("views");
        assert_eq!(std::fs::read_dir(&views).unwrap().count(), 1, "shard digests remembered");
    }
}

#[test]
fn header_errors_refuse_to_mount() {
    let cases = [
        ("orphan_scale", "orphan non-expert FP8 scale: layers.0.attn.orphan.scale"),
        ("missing_scale", "missing native FP8 scale: layers.0.attn.wkv.weight"),
        ("unsupported_dtype", "unsupported non-expert dtype F16: layers.0.attn.extra"),
        ("truncated_shard", "model-00003-of-00003.safetensors"),
        ("index_missing_tensor", "layers.0.attn.ghost.weight"),
        ("shard_escape", "is not a plain file name"),
        ("expert_shape", "invalid native MXFP4 tensor layers.1.ffn.experts.2.w3.scale"),
        ("bad_quant_config", "expected the native V4 FP8/UE8M0 non-expert checkpoint"),
    ];
    for (case, expect) in cases {
        let src = tempfile::tempdir().unwrap();
        fixture(src.path(), &["--corrupt", case]);
        let err = Mount::try_new(src.path(), &[]).err().unwrap_or_else(|| panic!("{case}: mounted"));
        let msg = String::from_utf8_lossy(&err.stderr);
        assert!(msg.contains(expect), "{case}: expected {expect:?} in {msg}");
    }
}

#[test]
fn content_errors_are_eio_on_read_of_that_shard_only() {
    for (case, tensor, rule) in [
        ("nan_scale", "layers.1.attn.wq_a.weight", "non-finite or non-positive FP8 scales"),
        ("nonfinite_weight", "layers.0.ffn.shared_experts.w2.weight", "non-finite FP8 non-expert weight"),
        ("nonfinite_bf16", "norm.weight", "non-finite source tensor"),
    ] {
        let src = tempfile::tempdir().unwrap();
        fixture(src.path(), &["--corrupt", case]);
        let log = src.path().join("daemon.log");
        let m = Mount::new(src.path(), &[&format!("log_file={}", log.display())]);
        let mut eio = 0;
        let mut ok = 0;
        for i in 0..3 {
            match std::fs::read(m.path(&format!("non-expert-{i:03}.safetensors"))) {
                Ok(_) => ok += 1,
                Err(e) => {
                    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{case}: {e}");
                    eio += 1;
                }
            }
        }
        assert_eq!((eio, ok), (1, 2), "{case}: exactly the shard holding the bad tensor fails");
        // The manifest needs every shard's digest: EIO too, and the index is fine.
        let e = std::fs::read(m.path("kt_non_expert_manifest.json")).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EIO));
        assert!(std::fs::read(m.path("model.safetensors.index.json")).is_ok());
        m.unmount();
        let log = std::fs::read_to_string(&log).unwrap();
        assert!(log.contains(&format!("tensor {tensor}: {rule}")), "{case}: log lacks the tensor and rule:\n{log}");
    }
}

#[test]
fn safetensors_source_validation() {
    // A shard whose header length runs past the file, and bad JSON, refuse to mount.
    let src = tempfile::tempdir().unwrap();
    fixture(src.path(), &[]);
    let shard = src.path().join("model-00002-of-00003.safetensors");
    let mut bytes = std::fs::read(&shard).unwrap();
    let len = bytes.len() as u64;
    bytes[..8].copy_from_slice(&len.to_le_bytes());
    std::fs::write(&shard, &bytes).unwrap();
    let out = Command::new(bin()).arg("mount").arg(src.path()).arg(src.path()).args(["-o", "digest_store=none"]).output().unwrap();
    let msg = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && msg.contains("model-00002-of-00003.safetensors") && msg.contains("runs past the end"), "{msg}");
    bytes[..8].copy_from_slice(&16u64.to_le_bytes());
    bytes[8..24].copy_from_slice(b"{not json at all");
    std::fs::write(&shard, &bytes).unwrap();
    let out = Command::new(bin()).arg("mount").arg(src.path()).arg(src.path()).args(["-o", "digest_store=none"]).output().unwrap();
    assert!(!out.status.success());
}
