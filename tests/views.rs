//! Every view built through the library and read through `VirtualFile::read_at`, with no
//! FUSE: the files are copied out by the one read path, then compared with the same peers
//! the mounted tests use (the seeds, Python safetensors + ml_dtypes, numpy, the reference
//! ggml, kt-kernel's validator, SGLang's Kimi pack writer and manifest). A mount and a
//! materialized copy read these same bytes.

mod common;

use std::path::{Path, PathBuf};

use common::*;
use xpackfs::view::{self, Context, Input, Purpose, ViewOptions};

/// Build `opts` for `source` (as a mount at `location` would) and write every file of the
/// view under `out`, read through `read_at` in uneven pieces.
fn dump(source: &Path, opts: &[&str], location: &Path, out: &Path, store: &Path) -> view::Built {
    let mut args = vec!["views-test".to_string()];
    for o in opts {
        match o.split_once('=') {
            Some((k, v)) => args.push(format!("--{}={v}", k.replace('_', "-"))),
            None => args.push(format!("--{}", o.replace('_', "-"))),
        }
    }
    args.push(format!("--digest-store={}", store.display()));
    let opts: ViewOptions = {
        use clap::{Args, FromArgMatches};
        let m = ViewOptions::augment_args(clap::Command::new("t")).try_get_matches_from(args).unwrap();
        ViewOptions::from_arg_matches(&m).unwrap()
    };
    let ctx = Context::new(Purpose::Mount, location.to_path_buf(), "views-test".into(), &opts).unwrap();
    let input = Input::open(source).unwrap();
    let built = view::build(input, &opts, &ctx).unwrap_or_else(|e| panic!("{}: {e}", source.display()));
    for (name, f) in built.tree.files() {
        let path = out.join(&name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let mut bytes = Vec::with_capacity(f.size() as usize);
        let mut buf = vec![0u8; 777_777];
        loop {
            let n = f.read_at(bytes.len() as u64, &mut buf, xpackfs::store::ReadCtx::CLIENT).unwrap_or_else(|e| panic!("{name}: {e}"));
            if n == 0 {
                break;
            }
            bytes.extend_from_slice(&buf[..n]);
        }
        assert_eq!(bytes.len() as u64, f.size(), "{name}: short");
        std::fs::write(path, bytes).unwrap();
    }
    built
}

fn tmp() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

fn listing(dir: &Path) -> Vec<String> {
    tree_files(dir)
}

fn assert_same_files(a: &Path, b: &Path) {
    assert_eq!(listing(a), listing(b), "file lists differ");
    for name in listing(a) {
        assert!(std::fs::read(a.join(&name)).unwrap() == std::fs::read(b.join(&name)).unwrap(), "{name} differs");
    }
}

const ID: &str = "1111111111111111111111111111111111111111111111111111111111111111";
const CFG: &str = "2222222222222222222222222222222222222222222222222222222222222222";

#[test]
fn expert_pack_equals_the_seed_build() {
    let (seed, out, store) = (tmp(), tmp(), tmp());
    seed_expert_pack(
        &sample(),
        seed.path(),
        &["--model-identity-sha256", ID, "--config-sha256", CFG, "--top-k", "2", "--alignment", "8192", "--model-ref", "toy-moe"],
    );
    let (id, cfg) = (format!("model_identity_sha256={ID}"), format!("config_sha256={CFG}"));
    let built = dump(&sample(), &[&id, &cfg, "top_k=2", "alignment=8192", "model_ref=toy-moe"], out.path(), out.path(), store.path());
    assert_eq!(built.view.name(), "expert-pack");
    assert!(std::fs::read(seed.path().join("sample-moe.pack")).unwrap() == std::fs::read(out.path().join("sample-moe.pack")).unwrap());
    let m: serde_json::Value = serde_json::from_slice(&std::fs::read(out.path().join("sample-moe.pack.manifest.json")).unwrap()).unwrap();
    assert_eq!(m["pack_path"], out.path().join("sample-moe.pack").to_string_lossy().as_ref());
    assert_eq!(m["pack_sha256"], xpackfs::digest::sha256_hex(&std::fs::read(out.path().join("sample-moe.pack")).unwrap()));
    run_ok(
        python()
            .arg(repo().join("tools/peers/check_pack.py"))
            .arg("--source")
            .arg(sample())
            .arg("--pack")
            .arg(out.path().join("sample-moe.pack"))
            .args(["--modes", "pread"]),
    );
}

#[test]
fn bf16_cache_equals_the_reference_conversion() {
    for variant in ["v4", "v41"] {
        let (src, out, store) = (tmp(), tmp(), tmp());
        run_ok(python().arg(repo().join("tools/fixtures/make_v4_fixture.py")).arg(src.path()).args(["--variant", variant]));
        let built = dump(src.path(), &["cache_mb=1"], Path::new("/mnt/x"), out.path(), store.path());
        assert_eq!(built.view.name(), "bf16-cache");
        run_ok(python().arg(repo().join("tools/peers/check_bf16_cache.py")).arg("--source").arg(src.path()).arg("--cache").arg(out.path()));
    }
}

#[test]
fn requant_equals_the_seed_convert() {
    let (src, seed, out, store) = (tmp(), tmp(), tmp(), tmp());
    run_ok(python().arg(repo().join("tools/fixtures/make_v4_fixture.py")).arg(src.path()).args(["--variant", "v41", "--inter", "256"]));
    let src_path = std::fs::canonicalize(src.path()).unwrap();
    seed_requant(&src_path, seed.path(), &[]);
    dump(&src_path, &["view=requant", "cache_mb=1"], Path::new("/mnt/x"), out.path(), store.path());
    assert_same_files(seed.path(), out.path());
}

#[test]
fn requant_with_an_imatrix_lowers_the_weighted_error() {
    let (src, out, store) = (tmp(), tmp(), tmp());
    run_ok(python().arg(repo().join("tools/fixtures/make_v4_fixture.py")).arg(src.path()).args(["--variant", "v41", "--inter", "256"]));
    let imatrix = src.path().join("imatrix.gguf");
    run_ok(python().arg(repo().join("tools/imatrix_tool.py")).arg("make").arg(src.path()).arg(&imatrix));
    dump(src.path(), &["view=requant", &format!("imatrix={}", imatrix.display())], Path::new("/mnt/x"), out.path(), store.path());
    let unit = tmp();
    dump(src.path(), &["view=requant"], Path::new("/mnt/x"), unit.path(), store.path());
    run_ok(python().arg(repo().join("tools/imatrix_tool.py")).arg("gain").arg(src.path()).arg(unit.path()).arg(out.path()).arg(&imatrix));
}

#[test]
fn kt_int8_passes_the_seed_validator_and_the_numpy_oracle() {
    let v4 = tmp();
    run_ok(python().arg(repo().join("tools/fixtures/make_v4_fixture.py")).arg(v4.path()));
    let hf = tmp();
    run_ok(python().arg(repo().join("tools/fixtures/make_hf_moe_fixture.py")).arg(hf.path()));
    let dense = ["--layers", "0,1", "--numa-count", "2", "--expert-num", "4", "--hidden-size", "256", "--intermediate-size", "128"];
    let sample_expect = ["--layers", "0,1,2", "--numa-count", "2", "--expert-num", "8", "--hidden-size", "256", "--intermediate-size", "128"];
    for (source, expect) in [(sample(), sample_expect), (v4.path().to_path_buf(), dense), (hf.path().to_path_buf(), dense)] {
        let (out, store) = (tmp(), tmp());
        let built = dump(&source, &["view=kt-int8", "numa_count=2"], Path::new("/mnt/x"), out.path(), store.path());
        assert!(built.view.exclusive_root());
        run_ok(
            python()
                .arg(repo().join("tools/peers/seed_validate_int8.py"))
                .arg("--seeds")
                .arg(shared().join("seeds"))
                .arg(out.path())
                .args(expect)
                .arg("--verify-hashes"),
        );
        run_ok(python().arg(repo().join("tools/peers/check_int8.py")).arg("--source").arg(&source).arg("--tree").arg(out.path()));
    }
}

#[test]
fn int8_tree_serves_the_validated_tree_as_it_is() {
    let (tree, store) = (tmp(), tmp());
    dump(&sample(), &["view=kt-int8", "numa_count=2"], Path::new("/mnt/x"), tree.path(), store.path());
    let out = tmp();
    let built = dump(tree.path(), &["verify_hashes"], Path::new("/mnt/y"), out.path(), store.path());
    assert_eq!(built.view.name(), "int8-tree");
    assert_same_files(tree.path(), out.path());
    let sources: Vec<PathBuf> = built.sources.iter().map(|f| f.path().to_path_buf()).collect();
    assert_eq!(sources.len(), listing(tree.path()).len(), "every file of the tree is a source file");
}

#[test]
fn kimi_pack_equals_sglangs_write_and_manifest() {
    let (src, out, store, theirs) = (tmp(), tmp(), tmp(), tmp());
    run_ok(python().arg(repo().join("tools/fixtures/make_kimi_fixture.py")).arg(src.path()).args(["--layers", "3", "--experts", "4", "--shards", "2"]));
    let gguf = src.path().join("gguf");
    let mut parts: Vec<PathBuf> = std::fs::read_dir(&gguf).unwrap().map(|e| e.unwrap().path()).collect();
    parts.sort();
    let (config, tokenizer) = (src.path().join("config.json"), src.path().join("tokenizer"));
    let written = theirs.path().join("sglang.pack");
    let arg = |p: &Path| p.to_str().unwrap().to_string();
    let (gguf_s, config_s, tok_s, written_s) = (arg(&gguf), arg(&config), arg(&tokenizer), arg(&written));
    sglang_kimi(&["write", "--gguf-dir", &gguf_s, "--config", &config_s, "--out", &written_s, "--relax-audit"]);
    let (cfg_o, tok_o) = (format!("model_config={config_s}"), format!("tokenizer_dir={tok_s}"));
    let built = dump(&parts[1], &["view=kimi-pack", "model_check=layout", &cfg_o, &tok_o], out.path(), out.path(), store.path());
    assert_eq!(built.view.name(), "kimi-pack");
    assert_eq!(listing(out.path()), ["Kimi-K3-fixture.expert-major.pack", "Kimi-K3-fixture.expert-major.pack.manifest.json"]);
    let pack = out.path().join("Kimi-K3-fixture.expert-major.pack");
    assert!(std::fs::read(&pack).unwrap() == std::fs::read(&written).unwrap(), "the pack differs from write_ggml_moe_pack's");
    let ours: serde_json::Value = serde_json::from_slice(&std::fs::read(out.path().join("Kimi-K3-fixture.expert-major.pack.manifest.json")).unwrap()).unwrap();
    assert_eq!(ours["expert_pack"]["path"], arg(&pack).as_str());
    let theirs_m = theirs.path().join("manifest.json");
    let (pack_s, theirs_s) = (arg(&pack), arg(&theirs_m));
    sglang_kimi(&["manifest", "--gguf-dir", &gguf_s, "--config", &config_s, "--tokenizer-dir", &tok_s, "--pack", &pack_s, "--out", &theirs_s, "--relax-audit"]);
    let theirs_v: serde_json::Value = serde_json::from_slice(&std::fs::read(&theirs_m).unwrap()).unwrap();
    assert_eq!(without_when(ours), without_when(theirs_v), "the manifest differs from create_manifest's");
}
