//! The kimi-pack view (SGLang's Kimi K3 `GGMLMOEPACKv1` pack and its adapter manifest),
//! mounted for real and checked against SGLang's own code in `shared/reference/sglang/`,
//! run by tools/peers/run_sglang_kimi.py: `write_ggml_moe_pack` (byte identity),
//! `validate_ggml_moe_pack(full_pack_hash=True)` and `create_manifest` on the mount, and
//! the runtime reader `KimiGGMLExpertPackStore` on the stand-in torch. Shard sets are
//! written by tools/fixtures/make_kimi_fixture.py with gguf-py's GGUFWriter.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use common::*;
use serde_json::Value;

fn fixture(dir: &Path, args: &[&str]) -> PathBuf {
    run_ok(python().arg(repo().join("tools/fixtures/make_kimi_fixture.py")).arg(dir).args(args));
    dir.to_path_buf()
}

/// The fixture's shards, in order.
fn shards(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir.join("gguf")).unwrap().map(|e| e.unwrap().path()).collect();
    v.sort();
    v
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn load(p: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn kimi_opts(dir: &Path, extra: &[&str]) -> Vec<String> {
    let mut v = vec![
        "view=kimi-pack".to_string(),
        format!("model_config={}", dir.join("config.json").display()),
        format!("tokenizer_dir={}", dir.join("tokenizer").display()),
    ];
    v.extend(extra.iter().map(|s| s.to_string()));
    v
}

fn mount(source: &Path, opts: &[String]) -> Mount {
    let o: Vec<&str> = opts.iter().map(String::as_str).collect();
    Mount::new(source, &o)
}

/// create_manifest on `pack` with the given flags, equal to `ours` but for the when/by-what fields.
fn assert_manifest_is_sglangs(dir: &Path, pack: &Path, ours: &Path, flags: &[&str]) {
    let out = tempfile::tempdir().unwrap();
    let theirs = out.path().join("manifest.json");
    let gguf = dir.join("gguf");
    let (config, tok) = (dir.join("config.json"), dir.join("tokenizer"));
    let mut args = vec!["manifest", "--gguf-dir", s(&gguf), "--config", s(&config), "--tokenizer-dir", s(&tok), "--pack", s(pack), "--out", s(&theirs)];
    args.extend_from_slice(flags);
    sglang_kimi(&args);
    let (ours_v, theirs_v) = (load(ours), load(&theirs));
    assert_eq!(ours_v["expert_pack"]["path"], s(pack));
    assert_eq!(without_when(ours_v), without_when(theirs_v), "manifest differs from create_manifest's ({flags:?})");
    sglang_kimi(&["text", "--manifest", s(ours)]);
}

#[test]
fn pack_and_manifest_are_sglangs() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = fixture(tmp.path(), &["--layers", "4", "--experts", "8", "--shards", "3"]);
    let parts = shards(&dir);
    let gguf = dir.join("gguf");
    let config = dir.join("config.json");
    let written = tmp.path().join("sglang.pack");
    let written_v = sglang_kimi(&["write", "--gguf-dir", s(&gguf), "--config", s(&config), "--out", s(&written), "--relax-audit"]);

    let m = mount(&parts[1], &kimi_opts(&dir, &["model_check=layout"]));
    let pack = m.path("Kimi-K3-fixture.expert-major.pack");
    let manifest = m.path("Kimi-K3-fixture.expert-major.pack.manifest.json");
    let mut names: Vec<String> = std::fs::read_dir(&m.mountpoint).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    assert_eq!(names, [".xpackfs", "Kimi-K3-fixture.expert-major.pack", "Kimi-K3-fixture.expert-major.pack.manifest.json"]);
    let ours = std::fs::read(&pack).unwrap();
    let theirs = std::fs::read(&written).unwrap();
    assert_eq!(ours.len(), theirs.len());
    assert!(ours == theirs, "the mounted pack differs from write_ggml_moe_pack's");
    // Entries are padded to 4 KiB here (21504/28160-byte slices): the zeros are SGLang's too.
    assert_eq!(written_v["object_bytes"], 77312);

    let v = sglang_kimi(&["validate", "--gguf-dir", s(&gguf), "--config", s(&config), "--pack", s(&pack), "--full-pack-hash", "--relax-audit"]);
    assert_eq!(v["sha256"], xpackfs::digest::sha256_hex(&theirs).as_str());
    assert_eq!(v["payload_samples_verified"], 6);
    assert_manifest_is_sglangs(&dir, &pack, &manifest, &["--relax-audit"]);
    m.unmount();

    // Full hashes: the per-shard sha256 from the one digest pass, the pack hashed once; both
    // remembered in the digest store, so a second mount (by another part) hashes nothing:
    // it rewrites no store entry (a computed digest is saved as a new file).
    let full = kimi_opts(&dir, &["model_check=layout", "full_source_hashes", "full_pack_hash", "payload_samples=3"]);
    let m = mount(&parts[0], &full);
    let pack = m.path("Kimi-K3-fixture.expert-major.pack");
    let manifest = m.path("Kimi-K3-fixture.expert-major.pack.manifest.json");
    assert_manifest_is_sglangs(&dir, &pack, &manifest, &["--relax-audit", "--full-source-hashes", "--full-pack-hash", "--payload-samples", "3"]);
    let without_path = |p: &Path| {
        let mut v = load(p);
        v["expert_pack"].as_object_mut().unwrap().remove("path");
        v
    };
    let first_manifest = without_path(&manifest);
    let store = m.store.path().to_path_buf();
    m.unmount();
    let entries = || -> Vec<(String, u64, i64, i64)> {
        use std::os::unix::fs::MetadataExt;
        tree_files(&store)
            .into_iter()
            .map(|n| {
                let md = std::fs::metadata(store.join(&n)).unwrap();
                (n, md.ino(), md.mtime(), md.mtime_nsec())
            })
            .collect()
    };
    let before = entries();
    assert_eq!(before.len(), 2, "source digests and the pack's digest: {before:?}");
    let mut again = full.clone();
    again.push(format!("digest_store={}", store.display()));
    let m = mount(&parts[2], &again);
    assert_eq!(without_path(&m.path("Kimi-K3-fixture.expert-major.pack.manifest.json")), first_manifest);
    m.unmount();
    assert_eq!(entries(), before, "the second mount computed digests again");

    // Without the config and tokenizer: the pack alone, dimensions read off the GGUF.
    let m = Mount::new(&parts[2], &["view=kimi-pack", "model_check=layout"]);
    let names: Vec<String> = std::fs::read_dir(&m.mountpoint).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    assert!(!names.iter().any(|n| n.ends_with(".manifest.json")), "{names:?}");
    assert!(std::fs::read(m.path("Kimi-K3-fixture.expert-major.pack")).unwrap() == theirs);
    m.unmount();
}

#[test]
fn runtime_reader_reads_every_object_as_pread_does() {
    // 4 KiB-multiple slices (512 x 1024 per expert: 172,032 and 225,280 bytes), as the real
    // model's: the reader wants objects contiguous. Top-k 16 of 16 experts, two MoE layers.
    let tmp = tempfile::tempdir().unwrap();
    let args = ["--layers", "3", "--experts", "16", "--top-k", "16", "--expert-hidden", "512", "--inter", "1024", "--shards", "2", "--name", "kr"];
    let dir = fixture(tmp.path(), &args);
    let gguf = dir.join("gguf");
    let written = tmp.path().join("sglang.pack");
    sglang_kimi(&["write", "--gguf-dir", s(&gguf), "--config", s(&dir.join("config.json")), "--out", s(&written), "--relax-audit"]);
    let m = mount(&shards(&dir)[0], &kimi_opts(&dir, &["model_check=layout"]));
    let pack = m.path("kr.expert-major.pack");
    let manifest = m.path("kr.expert-major.pack.manifest.json");
    assert!(std::fs::read(&pack).unwrap() == std::fs::read(&written).unwrap());
    for direct in [false, true] {
        let mut a = vec!["reader", "--gguf-dir", s(&gguf), "--pack", s(&pack), "--manifest", s(&manifest), "--relax-layers"];
        if direct {
            a.push("--direct-io");
        }
        let r = sglang_kimi(&a);
        assert_eq!((r["objects_checked"].as_u64(), r["pack_reads"].as_u64()), (Some(32), Some(32)), "{r}");
        assert_eq!(r["pack_read_bytes"].as_u64(), Some(32 * 569344));
    }
    // Unrelaxed, the reader refuses this small model for its layer count, and only for that.
    let out = sglang_kimi_output(&["reader", "--gguf-dir", s(&gguf), "--pack", s(&pack), "--manifest", s(&manifest)]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("Kimi active routed MoE layers must be exactly 1..92"));
    m.unmount();
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status.lines().find_map(|l| l.strip_prefix("VmRSS:")).and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok()).unwrap()
}

#[test]
fn full_size_audited_set_mounts_at_once_and_sglang_accepts_it() {
    // 93 layers, 896 experts, 3584 x 3072 Q2_K/Q3_K slices: ~1 TB of sparse shards (24).
    let tmp = tempfile::tempdir().unwrap();
    let dir = fixture(tmp.path(), &["--full-size", "--name", "Kimi-K3"]);
    let gguf = dir.join("gguf");
    let parts = shards(&dir);
    let apparent: u64 = parts.iter().map(|p| std::fs::metadata(p).unwrap().len()).sum();
    let started = Instant::now();
    let m = mount(&parts[6], &kimi_opts(&dir, &[])); // model_check=audited, the default
    let elapsed = started.elapsed();
    let pid = live_processes_mentioning(&m.mountpoint.to_string_lossy())[0];
    let rss = rss_kib(pid);
    let pack = m.path("Kimi-K3.expert-major.pack");
    let size = std::fs::metadata(&pack).unwrap().len();
    eprintln!(
        "full-size Kimi K3 set ({} shards, {:.0} GB apparent): mount returned in {:.3} s, daemon RSS {} MiB, pack {} bytes",
        parts.len(),
        apparent as f64 / 1e9,
        elapsed.as_secs_f64(),
        rss / 1024,
        size
    );
    // 247,296 entries; objects of 3,612,672 + 3,612,672 + 4,730,880 bytes, back to back.
    let data_start = (40u64 + 247_296 * 152).next_multiple_of(4096);
    assert_eq!(size, data_start + 82_432 * 11_956_224);
    assert!(rss < 256 * 1024, "daemon RSS {rss} KiB");
    // SGLang's unmodified create_manifest (audited spec, validate_ggml_moe_pack with 6
    // payload samples) on the mount, and its unmodified runtime reader on its manifest.
    let manifest = m.path("Kimi-K3.expert-major.pack.manifest.json");
    assert_manifest_is_sglangs(&dir, &pack, &manifest, &[]);
    let r = sglang_kimi(&["reader", "--gguf-dir", s(&gguf), "--pack", s(&pack), "--manifest", s(&manifest), "--sample", "3", "--direct-io"]);
    assert_eq!(r["objects_checked"].as_u64(), Some(80), "{r}");
    m.unmount();
}

/// SGLang's validator reads the pack's index one 152-byte entry per read: by default the pack
/// is kept in the mount's page cache (not one FUSE request per entry), and its source is
/// read around the page cache, so memory holds one copy, the view's; `direct_io=on` keeps
/// nothing on the mount.
#[test]
fn the_pack_is_cached_on_the_mount_and_its_source_is_not() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = fixture(tmp.path(), &["--layers", "4", "--experts", "8", "--shards", "3"]);
    let parts = shards(&dir);
    for (opts, pack_cached) in [(&[][..], true), (&["direct_io=on"][..], false)] {
        let m = mount(&parts[0], &kimi_opts(&dir, &[&["model_check=layout"][..], opts].concat()));
        let pack = m.path("Kimi-K3-fixture.expert-major.pack");
        parts.iter().for_each(|p| drop_cached(p));
        let bytes = std::fs::read(&pack).unwrap();
        let (on_mount, source): (u64, u64) = (cached_bytes(&pack), parts.iter().map(|p| cached_bytes(p)).sum());
        let source_size: u64 = parts.iter().map(|p| std::fs::metadata(p).unwrap().len()).sum();
        if pack_cached {
            assert!(on_mount * 10 >= bytes.len() as u64 * 9, "{opts:?}: {on_mount} of {} bytes of the pack cached", bytes.len());
            assert!(source * 10 <= source_size, "{opts:?}: {source} of {source_size} bytes of the source cached after reading the pack");
        } else {
            assert_eq!(on_mount, 0, "{opts:?}");
        }
        m.unmount();
    }
}

/// Mounting `source` with `opts` fails; the message must hold every needle.
fn refused(source: &Path, opts: &[String], needles: &[&str]) {
    let o: Vec<&str> = opts.iter().map(String::as_str).collect();
    let err = match Mount::try_new(source, &o) {
        Ok(m) => {
            m.unmount();
            panic!("mount of {} with {opts:?} succeeded", source.display())
        }
        Err(e) => String::from_utf8_lossy(&e.stderr).into_owned(),
    };
    for n in needles {
        assert!(err.contains(n), "{n:?} not in: {err}");
    }
}

/// SGLang's own tools refuse the same set.
fn sglang_refuses(dir: &Path, relax: bool, needle: &str) {
    let out = tempfile::tempdir().unwrap();
    let pack = out.path().join("x.pack");
    let (gguf, config) = (dir.join("gguf"), dir.join("config.json"));
    let mut args = vec!["write", "--gguf-dir", s(&gguf), "--config", s(&config), "--out", s(&pack)];
    if relax {
        args.push("--relax-audit");
    }
    let o = sglang_kimi_output(&args);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains(needle), "SGLang did not refuse with {needle:?}: {err}");
}

#[test]
fn bad_inputs_are_refused_at_mount_naming_the_rule() {
    let tmp = tempfile::tempdir().unwrap();
    let layout = |dir: &Path| kimi_opts(dir, &["model_check=layout"]);
    let small = ["--layers", "4", "--experts", "8"];

    // Missing shard.
    let dir = fixture(&tmp.path().join("missing"), &small);
    let parts = shards(&dir);
    std::fs::remove_file(&parts[1]).unwrap();
    refused(&parts[0], &layout(&dir), &["Kimi-K3-fixture-00002-of-00003.gguf", "part of a 3-file split set is missing"]);
    sglang_refuses(&dir, true, "GGUF shard set is incomplete");

    // A shard of another set (same name and count, one more layer).
    let dir = fixture(&tmp.path().join("mixed"), &small);
    let other = fixture(&tmp.path().join("other"), &["--layers", "5", "--experts", "8"]);
    std::fs::copy(&shards(&other)[1], &shards(&dir)[1]).unwrap();
    refused(&shards(&dir)[0], &layout(&dir), &["Kimi-K3-fixture-00002-of-00003.gguf", "split.tensors.count is 50", "says 40", "another split set"]);
    sglang_refuses(&dir, true, "GGUF split metadata mismatch");

    let cases: [(&str, &[&str], &str); 7] = [
        (
            "arch",
            &["Kimi-K3-fixture-00001-of-00003.gguf", "general.architecture is \"deepseek2\"; the kimi-pack view needs \"kimi-k3\""],
            "expected GGUF architecture 'kimi-k3'",
        ),
        (
            "no-arch-in-shard",
            &["Kimi-K3-fixture-00002-of-00003.gguf", "GGUF metadata lacks general.architecture"],
            "missing required field 'general.architecture'",
        ),
        ("missing-expert", &["routed-expert coverage", "missing 1 (blk.2.ffn_gate_exps.weight)"], "routed expert tensor coverage mismatch"),
        (
            "duplicate-expert",
            &["tensor \"blk.02.ffn_up_exps.weight\"", "duplicate routed-expert tensor for layer 2 role up", "\"blk.2.ffn_up_exps.weight\" names it too"],
            "duplicate routed expert tensor",
        ),
        ("dtype", &["tensor \"blk.2.ffn_down_exps.weight\"", "role down must be Q3_K (SGLang's Kimi layout), the tensor is Q4_K"], "unexpected expert dtype"),
        ("uneven", &["tensor \"blk.2.ffn_up_exps.weight\"", "uneven slicing", "do not split into 8 equal expert slices"], "unexpected expert shape"),
        // ggml's 63-byte name rule (the source layer) comes before the pack index's 127.
        ("long-name", &["ffn_up_exps.weight", "name is 133 bytes; ggml allows at most 63"], "too long for the Pack index"),
    ];
    for (kind, needles, theirs) in cases {
        let dir = fixture(&tmp.path().join(kind), &[&small[..], &["--bad", kind]].concat());
        let parts = shards(&dir);
        refused(&parts[2], &layout(&dir), needles);
        sglang_refuses(&dir, true, theirs);
    }

    // A model of the layout but not the audited dimensions, under the default model_check.
    let dir = fixture(&tmp.path().join("small"), &small);
    refused(&shards(&dir)[0], &kimi_opts(&dir, &[]), &["model_check=audited", "num_hidden_layers is 4 (audited: 93)", "model_check=layout"]);
    refused(&shards(&dir)[0], &["view=kimi-pack".to_string()], &["model_check=audited", "num_experts is 8 (audited: 896)"]);
    sglang_refuses(&dir, false, "do not match the audited model");
    // Options that go together.
    refused(
        &shards(&dir)[0],
        &["view=kimi-pack".into(), format!("model_config={}", dir.join("config.json").display())],
        &["model_config and tokenizer_dir are given together"],
    );
    // Not a numbered shard set.
    let single = tmp.path().join("single.gguf");
    std::fs::copy(sample(), &single).unwrap();
    refused(&single, &["view=kimi-pack".into()], &["single.gguf", "needs a numbered shard set"]);
}

#[test]
fn materialize_verify_runs_sglangs_checks_with_full_hashes() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = fixture(&tmp.path().join("set"), &["--layers", "4", "--experts", "8", "--shards", "2"]);
    let gguf = dir.join("gguf");
    let config = dir.join("config.json");
    let written = tmp.path().join("sglang.pack");
    sglang_kimi(&["write", "--gguf-dir", s(&gguf), "--config", s(&config), "--out", s(&written), "--relax-audit"]);
    let out = tmp.path().join("out");
    let opts = kimi_opts(&dir, &["model_check=layout", "full_source_hashes", "full_pack_hash", "digest_store=none"]).join(",");
    run_ok(Command::new(bin()).arg("materialize").arg(&shards(&dir)[0]).arg("--out").arg(&out).args(["--margin-gib", "0", "--verify", "-o", &opts]));
    let pack = out.join("Kimi-K3-fixture.expert-major.pack");
    let manifest = out.join("Kimi-K3-fixture.expert-major.pack.manifest.json");
    assert_eq!(tree_files(&out), ["Kimi-K3-fixture.expert-major.pack", "Kimi-K3-fixture.expert-major.pack.manifest.json"]);
    assert!(std::fs::read(&pack).unwrap() == std::fs::read(&written).unwrap());
    assert_manifest_is_sglangs(&dir, &pack, &manifest, &["--relax-audit", "--full-source-hashes", "--full-pack-hash"]);

    // Partitioned: two parts and --finalize --verify give the same files.
    let parts_out = tmp.path().join("parts");
    let store = tempfile::tempdir().unwrap();
    let popts = kimi_opts(&dir, &["model_check=layout", "full_source_hashes", "full_pack_hash", &format!("digest_store={}", store.path().display())]).join(",");
    for part in ["0/2", "1/2"] {
        run_ok(Command::new(bin()).arg("materialize").arg(&shards(&dir)[1]).arg("--out").arg(&parts_out).args([
            "--margin-gib",
            "0",
            "--piece-size",
            "256K",
            "--partition",
            part,
            "-o",
            &popts,
        ]));
    }
    run_ok(Command::new(bin()).arg("materialize").arg(&shards(&dir)[1]).arg("--out").arg(&parts_out).args([
        "--margin-gib",
        "0",
        "--finalize",
        "--verify",
        "-o",
        &popts,
    ]));
    assert_eq!(tree_files(&parts_out), tree_files(&out));
    assert!(std::fs::read(parts_out.join("Kimi-K3-fixture.expert-major.pack")).unwrap() == std::fs::read(&pack).unwrap());
    let mut a = load(&parts_out.join("Kimi-K3-fixture.expert-major.pack.manifest.json"));
    let mut b = load(&manifest);
    for v in [&mut a, &mut b] {
        v["expert_pack"].as_object_mut().unwrap().remove("path");
    }
    assert_eq!(a, b);

    // The verifier fails where validate_ggml_moe_pack does, and on a full-hash mismatch.
    let good = std::fs::read(&pack).unwrap();
    let source = xpackfs::source::Source::open(&shards(&dir)[0]).unwrap();
    let m = load(&manifest);
    let sha = |b: &[u8]| xpackfs::digest::sha256_hex(b);
    let verify = |bytes: &[u8]| xpackfs::view::kimi_pack::validate::verify_written(&pack, &source, &sha(bytes), Some(&m));
    verify(&good).unwrap();
    let data_start = m["expert_pack"]["data_start"].as_u64().unwrap() as usize;
    let last = good.len() - 100; // in the last entry, one of the 6 samples
    let unsampled = data_start + 77824 + 100; // in entry 3 (layer 1, expert 1, up): not sampled
    // (what is damaged, the damage, the sampled check's refusal, the full check's refusal)
    type Case<'a> = (&'a str, Box<dyn Fn(&mut Vec<u8>)>, &'a str, Option<&'a str>);
    let cases: [Case; 4] = [
        ("index", Box::new(|b| b[40 + 152 * 5 + 133] ^= 1), "reserved entry field must be zero", Some("reserved entry field must be zero")),
        ("sampled payload", Box::new(move |b| b[last] ^= 1), "payload does not match GGUF source", Some("payload does not match GGUF source")),
        ("trailing bytes", Box::new(|b| b.extend_from_slice(&[0; 8])), "unexplained trailing bytes: 8", Some("unexplained trailing bytes: 8")),
        ("unsampled payload", Box::new(move |b| b[unsampled] ^= 1), "expert_pack.sha256", None),
    ];
    for (what, corrupt, ours, theirs) in cases {
        let mut bad = good.clone();
        corrupt(&mut bad);
        std::fs::write(&pack, &bad).unwrap();
        let e = verify(&bad).expect_err(what);
        assert!(e.to_string().contains(ours), "{what}: {e}");
        let o = sglang_kimi_output(&["validate", "--gguf-dir", s(&gguf), "--config", s(&config), "--pack", s(&pack), "--full-pack-hash", "--relax-audit"]);
        match theirs {
            Some(t) => assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains(t), "{what}: {}", String::from_utf8_lossy(&o.stderr)),
            // SGLang's validator passes it too (6 samples); only the full hash tells.
            None => assert!(o.status.success() && serde_json::from_slice::<Value>(&o.stdout).unwrap()["sha256"] != m["expert_pack"]["sha256"]),
        }
    }

    // The pack alone (no config): verified against the dimensions the GGUF states.
    let alone = tmp.path().join("alone");
    run_ok(Command::new(bin()).arg("materialize").arg(&shards(&dir)[1]).arg("--out").arg(&alone).args([
        "--margin-gib",
        "0",
        "--verify",
        "-o",
        "view=kimi-pack,model_check=layout,digest_store=none",
    ]));
    assert!(std::fs::read(alone.join("Kimi-K3-fixture.expert-major.pack")).unwrap() == good);
}
