//! The GGUF output view (`view=gguf,ftype=...`) against llama.cpp itself: for each fixture
//! of tools/fixtures/make_gguf_quant_fixture.py and each file type the view can build today, the
//! view's file (read through the library, and once through a real mount) equals
//! `llama_model_quantize`'s output through llama-cpp-python 0.3.36 byte for byte
//! (tools/peers/llama_quantize_peer.py; tools/peers/llama_cpp_peer.sh builds the package once into a
//! cache), and llama.cpp loads the view's file. File types that need a quantizer xpackfs
//! does not have yet are refused at mount, naming it; a NaN in a row fails the reads of
//! that tensor, as it fails llama-quantize. With `-o imatrix=` the view's file equals what
//! llama.cpp's own `llama-quantize --imatrix` command writes (built from the same vendored
//! sources by tools/llama_quantize_tool.sh: the command, not the library, loads the imatrix
//! and adds the `quantize.imatrix.*` keys), for imatrices in both formats written by
//! tools/fixtures/make_gguf_imatrix.py with missing, zero-count and wrong-sized entries.

mod common;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use common::*;
use xpackfs::view::{self, Context, Input, Purpose, ViewOptions};

/// The fixtures, written once per test binary.
fn fixtures() -> &'static Path {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| {
        let d = tempfile::tempdir().unwrap();
        run_ok(python().arg(repo().join("tools/fixtures/make_gguf_quant_fixture.py")).arg(d.path()));
        run_ok(python().arg(repo().join("tools/fixtures/make_gguf_quant_fixture.py")).arg(d.path()).arg("--nan"));
        for (model, out, extra) in IMATRICES {
            let mut cmd = python();
            cmd.arg(repo().join("tools/fixtures/make_gguf_imatrix.py")).arg(d.path().join(model)).arg(d.path().join(out));
            run_ok(cmd.args(extra.split_whitespace()));
        }
        d
    })
    .path()
}

/// The Python command with llama-cpp-python 0.3.36 importable (built once into a cache).
fn peer() -> std::process::Command {
    static PATH: OnceLock<String> = OnceLock::new();
    let path = PATH.get_or_init(|| {
        let out = run_ok(std::process::Command::new("bash").arg(repo().join("tools/peers/llama_cpp_peer.sh")));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    });
    let mut cmd = python();
    cmd.arg(repo().join("tools/peers/llama_quantize_peer.py"));
    if !path.is_empty() {
        cmd.env("XPACKFS_LLAMA_CPP", path);
    }
    cmd
}

/// `llama_model_quantize(source, out, ftype)` with `nthread` threads, its bytes.
fn llama_quantize(source: &Path, ftype: u32, nthread: u32) -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.gguf");
    run_ok(peer().arg("quantize").arg(source).arg(&out).arg(ftype.to_string()).arg(nthread.to_string()));
    std::fs::read(out).unwrap()
}

/// `llama_model_quantize(source, out, ftype)` for each of `ftypes` (one process), the bytes of each.
fn llama_quantize_each(source: &Path, ftypes: &[u32], nthread: u32) -> Vec<Vec<u8>> {
    let dir = tempfile::tempdir().unwrap();
    run_ok(peer().arg("quantize-each").arg(source).arg(dir.path()).arg(nthread.to_string()).args(ftypes.iter().map(u32::to_string)));
    ftypes.iter().map(|f| std::fs::read(dir.path().join(format!("{f}.gguf"))).unwrap()).collect()
}

/// The imatrices of the fixtures: (model, file, tools/fixtures/make_gguf_imatrix.py options).
const IMATRICES: &[(&str, &str, &str)] = &[
    ("llama16-tied-bf16.gguf", "llama16-tied.imatrix.gguf", "--drop blk.3.ffn_down.weight --zero-count blk.0.attn_q.weight --extra 3"),
    ("llama16-untied-mixed.gguf", "llama16-untied.imatrix.dat", "--legacy --drop output.weight"),
    ("qwen3moe8-bf16.gguf", "qwen3moe8.imatrix.gguf", "--resize token_embd.weight --zero-count blk.1.ffn_down_exps.weight --drop blk.2.attn_q.weight"),
    ("qwen3moe8-split-00001-of-00003.gguf", "qwen3moe8-split.imatrix.dat", "--legacy --seed 7"),
    ("deepseek2-bf16.gguf", "deepseek2.imatrix.gguf", "--zero-count blk.2.attn_k_b.weight --drop blk.1.ffn_up_shexp.weight"),
    ("qwen3moe16-bf16.gguf", "qwen3moe16.imatrix.dat", "--legacy --seed 3"),
    // Refusals (imatrix_problems_are_refused_as_llama_quantize_refuses_them).
    ("llama16-tied-bf16.gguf", "llama16-bad-size.imatrix.gguf", "--resize blk.5.attn_k.weight"),
    ("llama16-tied-bf16.gguf", "llama16-nan.imatrix.gguf", "--nan blk.9.ffn_up.weight"),
    ("llama16-tied-bf16.gguf", "llama16-no-meta.imatrix.gguf", "--no-meta"),
    ("llama16-tied-bf16.gguf", "llama16-no-attn-q.imatrix.gguf", "--drop blk.4.attn_q.weight"),
];

/// llama.cpp's `llama-quantize` command (built once into a cache from the vendored sources).
fn llama_quantize_cmd() -> std::process::Command {
    static PATH: OnceLock<String> = OnceLock::new();
    let path = PATH.get_or_init(|| {
        let out = run_ok(std::process::Command::new("bash").arg(repo().join("tools/llama_quantize_tool.sh")));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    });
    std::process::Command::new(path)
}

/// `llama-quantize --imatrix IMATRIX SOURCE OUT FTYPE NTHREAD` (IMATRIX as given), its bytes,
/// or its output when it fails.
fn llama_quantize_imatrix(source: &Path, ftype: &str, imatrix: &Path, nthread: u32) -> Result<Vec<u8>, String> {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.gguf");
    let o = llama_quantize_cmd().arg("--imatrix").arg(imatrix).arg(source).arg(&out).arg(ftype).arg(nthread.to_string()).output().unwrap();
    if !o.status.success() {
        return Err(format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr)));
    }
    Ok(std::fs::read(out).unwrap())
}

fn options(opts: &[&str], store: &Path) -> ViewOptions {
    use clap::{Args, FromArgMatches};
    let mut args = vec!["gguf-test".to_string()];
    args.extend(opts.iter().map(|o| {
        let (k, v) = o.split_once('=').unwrap();
        format!("--{}={v}", k.replace('_', "-"))
    }));
    args.push(format!("--digest-store={}", store.display()));
    let m = ViewOptions::augment_args(clap::Command::new("t")).try_get_matches_from(args).unwrap();
    ViewOptions::from_arg_matches(&m).unwrap()
}

fn build(source: &Path, opts: &[&str]) -> Result<view::Built, view::ViewError> {
    let store = tempfile::tempdir().unwrap();
    let opts = options(opts, store.path());
    let ctx = Context::new(Purpose::Mount, PathBuf::from("/nonexistent"), "gguf-test".into(), &opts).unwrap();
    view::build(Input::open(source).unwrap(), &opts, &ctx)
}

/// The view's one file, read through `read_at` in uneven pieces.
fn read_view(built: &view::Built) -> Result<(String, Vec<u8>), view::ViewError> {
    let files = built.tree.files();
    assert_eq!(files.len(), 1, "one file: {:?}", files.iter().map(|f| &f.0).collect::<Vec<_>>());
    let (name, f) = &files[0];
    let mut bytes = Vec::with_capacity(f.size() as usize);
    let mut buf = vec![0u8; 333_333];
    loop {
        let n = f.read_at(bytes.len() as u64, &mut buf, xpackfs::store::ReadCtx::CLIENT)?;
        if n == 0 {
            break;
        }
        bytes.extend_from_slice(&buf[..n]);
    }
    assert_eq!(bytes.len() as u64, f.size(), "{name}: short");
    Ok((name.clone(), bytes))
}

fn assert_same(what: &str, got: &[u8], want: &[u8]) {
    if got != want {
        let at = got.iter().zip(want).position(|(a, b)| a != b).unwrap_or(got.len().min(want.len()));
        panic!("{what}: the view ({} bytes) differs from llama_model_quantize ({} bytes) first at byte {at}", got.len(), want.len());
    }
}

const FIXTURES: &[&str] = &[
    "llama16-tied-bf16.gguf",
    "llama16-untied-mixed.gguf",
    "qwen3moe8-bf16.gguf",
    "qwen3moe8-split-00002-of-00003.gguf",
    "qwen3moe16-bf16.gguf",
    "deepseek2-bf16.gguf",
];
/// Every file type the view offers, and the unquantized ones: (name, llama_ftype).
const FTYPES: &[(&str, u32)] = &[
    ("Q8_0", 7),
    ("F16", 1),
    ("BF16", 32),
    ("F32", 0),
    ("Q4_0", 2),
    ("Q4_K_M", 15),
    ("Q4_K_S", 14),
    ("Q5_K_M", 17),
    ("Q5_K_S", 16),
    ("Q6_K", 18),
    ("Q3_K_M", 12),
    ("Q3_K_S", 11),
    ("Q2_K", 10),
    ("IQ4_XS", 30),
    ("IQ4_NL", 25),
    ("Q4_1", 3),
    ("Q5_0", 8),
    ("Q5_1", 9),
];

#[test]
fn every_fixture_and_file_type_equals_llama_model_quantize() {
    let mut checked = Vec::new();
    for fx in FIXTURES {
        let src = fixtures().join(fx);
        // llama.cpp opens a split set by its first part (the view by any part).
        let numbers: Vec<u32> = FTYPES.iter().map(|f| f.1).collect();
        let wants = llama_quantize_each(&fixtures().join(fx.replace("-00002-", "-00001-")), &numbers, 1);
        for (&(ftype, _), want) in FTYPES.iter().zip(&wants) {
            let built = build(&src, &["view=gguf", &format!("ftype={ftype}")]).unwrap_or_else(|e| panic!("{fx} {ftype}: {e}"));
            let (name, got) = read_view(&built).unwrap_or_else(|e| panic!("{fx} {ftype}: {e}"));
            let stem = fx.trim_end_matches(".gguf").trim_end_matches("-00002-of-00003");
            assert_eq!(name, format!("{stem}-{ftype}.gguf"));
            assert_same(&format!("{fx} {ftype}"), &got, want);
            checked.push(format!("{fx}:{ftype}"));
        }
    }
    // More threads in llama.cpp give the same bytes (rows are quantized independently).
    let src = fixtures().join("qwen3moe8-bf16.gguf");
    let (_, got) = read_view(&build(&src, &["view=gguf", "ftype=Q8_0"]).unwrap()).unwrap();
    assert_same("qwen3moe8 Q8_0, 4 threads", &got, &llama_quantize(&src, 7, 4));
    eprintln!("byte-identical with llama_model_quantize: {}", checked.join(", "));
}

/// llama.cpp's type choice (`--dry-run`: logged per tensor on stderr), in the writer's order,
/// for each of `ftypes` (one process).
fn llama_types_each(source: &Path, ftypes: &[u32]) -> Vec<Vec<(String, String)>> {
    let out = run_ok(peer().arg("types").arg(source).args(ftypes.iter().map(u32::to_string)));
    let log = String::from_utf8_lossy(&out.stderr);
    // Each file type's log follows a line "== ftype N".
    let mut each: Vec<(u32, Vec<(String, String)>)> = Vec::new();
    for line in log.lines() {
        if let Some(n) = line.strip_prefix("== ftype ") {
            each.push((n.trim().parse().unwrap(), Vec::new()));
            continue;
        }
        if !line.starts_with('[') {
            continue;
        }
        let name = line.split_once(']').unwrap().1.split_whitespace().next().unwrap().to_string();
        let src = line.split("type =").nth(1).unwrap().split(',').next().unwrap().trim();
        let ty = match line.rsplit_once('(') {
            Some((_, t)) if line.contains("->") => t.trim_end_matches(')'),
            _ => src,
        };
        each.last_mut().expect("a tensor logged before the first file type's marker").1.push((name, ty.to_ascii_uppercase()));
    }
    assert_eq!(each.iter().map(|e| e.0).collect::<Vec<_>>(), ftypes, "{}: the peer's log, file types", source.display());
    each.into_iter().map(|e| e.1).collect()
}

#[test]
fn the_type_choice_of_every_offered_file_type_equals_llama_cpps() {
    use xpackfs::view::gguf_out::{ftype::Ftype, planned_types};
    let mut n = 0;
    for fx in [
        "llama16-tied-bf16.gguf",
        "llama16-untied-mixed.gguf",
        "qwen3moe8-bf16.gguf",
        "qwen3moe8-split-00001-of-00003.gguf",
        "llama80-gqa-bf16.gguf",
        "qwen3moe16-bf16.gguf",
        "deepseek2-bf16.gguf",
    ] {
        let src = xpackfs::source::Source::open(&fixtures().join(fx)).unwrap();
        let numbers: Vec<u32> = Ftype::OFFERED.iter().map(|f| f.number()).collect();
        for (&ftype, theirs) in Ftype::OFFERED.iter().zip(llama_types_each(&fixtures().join(fx), &numbers)) {
            let ours: Vec<(String, String)> = planned_types(&src, ftype, false).unwrap().into_iter().map(|(name, t)| (name, t.to_ascii_uppercase())).collect();
            assert_eq!(ours.len(), theirs.len(), "{fx} {}: tensor count", ftype.name());
            for (a, b) in ours.iter().zip(&theirs) {
                assert_eq!(a, b, "{fx} {}: the view's type choice differs from llama.cpp's", ftype.name());
            }
            n += 1;
        }
    }
    eprintln!("type choice equal to llama.cpp's for {n} fixture x file type pairs");
}

#[test]
fn the_view_needs_a_file_type() {
    let e = build(&fixtures().join("llama16-tied-bf16.gguf"), &["view=gguf"]).unwrap_err().to_string();
    assert!(e.contains("ftype"), "{e}");
}

#[test]
fn llama_cpp_loads_the_view() {
    for fx in ["llama16-tied-bf16.gguf", "qwen3moe8-bf16.gguf", "qwen3moe16-bf16.gguf"] {
        let built = build(&fixtures().join(fx), &["view=gguf", "ftype=Q8_0"]).unwrap();
        let (name, bytes) = read_view(&built).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(name);
        std::fs::write(&path, bytes).unwrap();
        run_ok(peer().arg("load").arg(&path));
    }
}

#[test]
fn a_nan_fails_the_reads_of_its_tensor_as_it_fails_llama_quantize() {
    let src = fixtures().join("llama16-nan-bf16.gguf");
    let built = build(&src, &["view=gguf", "ftype=Q8_0"]).unwrap();
    let e = read_view(&built).unwrap_err();
    assert_eq!(e.errno(), libc::EIO);
    assert!(e.to_string().contains("blk.3.ffn_down.weight"), "{e}");
    let dir = tempfile::tempdir().unwrap();
    let out = peer().arg("quantize").arg(&src).arg(dir.path().join("o.gguf")).arg("7").output().unwrap();
    assert!(!out.status.success(), "llama_model_quantize refuses it too");
    // materialize fails, naming the tensor.
    let out = std::process::Command::new(bin())
        .arg("materialize")
        .arg(&src)
        .arg("--out")
        .arg(dir.path().join("m"))
        .args(["-o", "view=gguf,ftype=Q8_0,digest_store=none"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("tensor blk.3.ffn_down.weight"), "{err}");
}

#[test]
fn bad_models_are_refused_with_llama_cpps_reason() {
    let dir = tempfile::tempdir().unwrap();
    let script = r#"
import sys, numpy as np, gguf
out, arch, drop = sys.argv[1], sys.argv[2], sys.argv[3]
w = gguf.GGUFWriter(out, arch)
if drop != "context_length": w.add_context_length(64)
if drop == "align64": w.add_uint32("general.alignment", 64); w.data_alignment = 64
w.add_embedding_length(64); w.add_block_count(1); w.add_head_count(2); w.add_layer_norm_rms_eps(1e-5)
w.add_tokenizer_model("no_vocab")
w.add_tensor("blk.0.attn_q.weight", np.zeros((64, 64), np.float32))
q = np.random.default_rng(1).integers(0, 256, (64, 68), dtype=np.uint8)
q[:, 0::34] = 0x00; q[:, 1::34] = 0x20  # fp16 scales of 2**-7
w.add_tensor("blk.0.ffn_up.weight", q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
"#;
    let make = |name: &str, arch: &str, drop: &str| {
        let p = dir.path().join(name);
        run_ok(python().arg("-c").arg(script).arg(&p).arg(arch).arg(drop));
        p
    };
    let e = build(&make("a.gguf", "nosucharch", "-"), &["view=gguf", "ftype=Q8_0"]).unwrap_err().to_string();
    assert!(e.contains("unknown model architecture: 'nosucharch'") && e.contains("a.gguf"), "{e}");
    let e = build(&make("b.gguf", "llama", "context_length"), &["view=gguf", "ftype=Q8_0"]).unwrap_err().to_string();
    assert!(e.contains("key not found in model: llama.context_length"), "{e}");
    // An already quantized tensor: refused unless allow_requantize (then decoded first).
    let c = make("c.gguf", "llama", "-");
    let e = build(&c, &["view=gguf", "ftype=F16"]).unwrap_err().to_string();
    assert!(e.contains("tensor blk.0.ffn_up.weight") && e.contains("requantizing from type Q8_0 is disabled"), "{e}");
    let built = build(&c, &["view=gguf", "ftype=F16", "allow_requantize=on"]).unwrap();
    let (_, got) = read_view(&built).unwrap();
    let out = dir.path().join("c-f16.gguf");
    run_ok(peer().arg("quantize").arg(&c).arg(&out).arg("1").arg("1").arg("--allow-requantize"));
    assert_same("Q8_0 tensor decoded to F16 (allow_requantize)", &got, &std::fs::read(&out).unwrap());
    // A source with general.alignment = 64: the KV is copied, the data stays aligned to 32
    // (llama.cpp's writer never reads the copied key), as llama_model_quantize writes it.
    let d = make("d.gguf", "llama", "align64");
    let (_, got) = read_view(&build(&d, &["view=gguf", "ftype=Q8_0", "allow_requantize=on"]).unwrap()).unwrap();
    let out = dir.path().join("d-q8.gguf");
    run_ok(peer().arg("quantize").arg(&d).arg(&out).arg("7").arg("1").arg("--allow-requantize"));
    assert_same("general.alignment 64 source", &got, &std::fs::read(&out).unwrap());
}

#[test]
fn mounted_file_equals_llama_model_quantize() {
    let src = fixtures().join("qwen3moe8-bf16.gguf");
    let m = Mount::new(&src, &["view=gguf", "ftype=Q8_0", "cache_mb=1"]);
    let got = std::fs::read(m.path("qwen3moe8-bf16-Q8_0.gguf")).unwrap();
    assert_same("mounted qwen3moe8 Q8_0", &got, &llama_quantize(&src, 7, 2));
    m.unmount();
}

/// The quantized file types checked with an imatrix (IQ2_XXS needs one).
const IMATRIX_FTYPES: &[&str] =
    &["Q4_K_M", "Q4_K_S", "Q5_K_M", "Q5_K_S", "Q6_K", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q3_K_M", "Q3_K_S", "Q2_K", "IQ4_XS", "IQ4_NL", "IQ2_XXS", "F16"];

#[test]
fn with_an_imatrix_every_fixture_and_file_type_equals_llama_quantize() {
    let (mut checked, mut refused) = (0, 0);
    for (k, (model, imatrix, _)) in IMATRICES.iter().take(6).enumerate() {
        let imatrix = fixtures().join(imatrix);
        // The view is named by the second part of the split set, llama.cpp by the first.
        let named = fixtures().join(model.replace("-00001-", "-00002-"));
        for (j, ftype) in IMATRIX_FTYPES.iter().enumerate() {
            let opts = ["view=gguf".to_string(), format!("ftype={ftype}"), format!("imatrix={}", imatrix.display())];
            let opts: Vec<&str> = opts.iter().map(String::as_str).collect();
            let got = build(&named, &opts).and_then(|b| read_view(&b)).map_err(|e| e.to_string());
            let nthread = 1 + ((j + k) % 2) as u32;
            let want = llama_quantize_imatrix(&fixtures().join(model), ftype, &imatrix, nthread);
            match (got, want) {
                (Ok((_, got)), Ok(want)) => {
                    assert_same(&format!("{model} {ftype} imatrix {}", imatrix.display()), &got, &want);
                    checked += 1;
                }
                // An IQ2_XXS tensor whose entry the imatrix leaves out: both refuse it.
                (Err(e), Err(t)) => {
                    let tensor = e.split("for tensor ").nth(1).and_then(|r| r.split_whitespace().next()).unwrap_or("?");
                    assert!(t.contains(&format!("Missing importance matrix for tensor {tensor}")), "{model} {ftype}: view: {e}; llama-quantize: {t}");
                    refused += 1;
                }
                (got, want) => panic!("{model} {ftype}: the view gives {:?}, llama-quantize {:?}", got.map(|_| "a file"), want.map(|_| "a file")),
            }
        }
    }
    eprintln!("byte-identical with llama-quantize --imatrix: {checked} fixture x file type pairs; {refused} refused by both");
    assert!(checked >= 6 * IMATRIX_FTYPES.len() - 2 && refused <= 2, "{checked} checked, {refused} refused");
}

#[test]
fn the_type_choice_with_an_imatrix_differs_where_llama_cpps_does() {
    use xpackfs::view::gguf_out::{ftype::Ftype, planned_types};
    let src = xpackfs::source::Source::open(&fixtures().join("llama16-tied-bf16.gguf")).unwrap();
    let types = |f, m| planned_types(&src, f, m).unwrap().into_iter().filter(|(n, _)| n == "blk.0.ffn_down.weight").map(|(_, t)| t).collect::<Vec<_>>();
    // Without an imatrix IQ4_XS puts the first eighth of ffn_down at Q5_K; with one, not
    // (rows of 320: Q5_K falls back to Q5_1, IQ4_XS to IQ4_NL).
    assert_eq!(types(Ftype::IQ4_XS, false), ["Q5_1"]);
    assert_eq!(types(Ftype::IQ4_XS, true), ["IQ4_NL"]);
    // Q4_0 with an imatrix guards the first eighth of ffn_down with Q4_1; Q5_0 with Q5_1.
    assert_eq!(types(Ftype::Q4_0, false), ["Q4_0"]);
    assert_eq!(types(Ftype::Q4_0, true), ["Q4_1"]);
    assert_eq!(types(Ftype::Q5_0, true), ["Q5_1"]);
}

#[test]
fn imatrix_problems_are_refused_as_llama_quantize_refuses_them() {
    let model = fixtures().join("llama16-tied-bf16.gguf");
    let view = |ftype: &str, imatrix: Option<&str>| {
        let mut opts = vec!["view=gguf".to_string(), format!("ftype={ftype}")];
        if let Some(m) = imatrix {
            opts.push(format!("imatrix={}", fixtures().join(m).display()));
        }
        let opts: Vec<&str> = opts.iter().map(String::as_str).collect();
        build(&model, &opts).err().map(|e| e.to_string())
    };
    let tool = |ftype: &str, imatrix: &str| llama_quantize_imatrix(&model, ftype, &fixtures().join(imatrix), 1).err();
    // An entry of the wrong size (not token_embd): both stop.
    let e = view("Q4_K_M", Some("llama16-bad-size.imatrix.gguf")).expect("refused");
    assert!(e.contains("imatrix size 288 is different from tensor size 256 for blk.5.attn_k.weight"), "{e}");
    assert!(tool("Q4_K_M", "llama16-bad-size.imatrix.gguf").expect("llama-quantize refuses it").contains("imatrix size 288 is different"));
    // A NaN anywhere in the imatrix.
    let e = view("Q4_K_M", Some("llama16-nan.imatrix.gguf")).expect("refused");
    assert!(e.contains("blk.9.ffn_up.weight") && e.contains("NaN"), "{e}");
    assert!(tool("Q4_K_M", "llama16-nan.imatrix.gguf").expect("llama-quantize refuses it").contains("non-finite"));
    // A GGUF imatrix without imatrix.chunk_size.
    let e = view("Q4_K_M", Some("llama16-no-meta.imatrix.gguf")).expect("refused");
    assert!(e.contains("missing imatrix metadata"), "{e}");
    assert!(tool("Q4_K_M", "llama16-no-meta.imatrix.gguf").expect("llama-quantize refuses it").contains("missing imatrix metadata"));
    // IQ2_XXS needs importance: without an imatrix, or without an entry for an IQ2_XXS tensor.
    let e = view("IQ2_XXS", None).expect("refused");
    assert!(e.contains("this quantization requires an imatrix") && e.contains("blk.0.attn_k.weight"), "{e}");
    let o = llama_quantize_cmd().arg(&model).arg(fixtures().join("never-written.gguf")).arg("IQ2_XXS").output().unwrap();
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("requires an importance matrix"));
    let e = view("IQ2_XXS", Some("llama16-no-attn-q.imatrix.gguf")).expect("refused");
    assert!(e.contains("Missing importance matrix for tensor blk.4.attn_q.weight"), "{e}");
    assert!(
        tool("IQ2_XXS", "llama16-no-attn-q.imatrix.gguf")
            .expect("llama-quantize refuses it")
            .contains("Missing importance matrix for tensor blk.4.attn_q.weight")
    );
    // The same entry missing in Q4_K_M: that tensor is quantized without importance (compared
    // byte for byte in with_an_imatrix_every_fixture_and_file_type_equals_llama_quantize).
    assert!(view("Q4_K_M", Some("llama16-no-attn-q.imatrix.gguf")).is_none());
}

/// `path` relative to the current directory (through `..` up to the root).
fn relative_to_cwd(path: &Path) -> PathBuf {
    let cwd = std::env::current_dir().unwrap();
    let mut rel = PathBuf::new();
    for _ in cwd.components().skip(1) {
        rel.push("..");
    }
    rel.join(path.strip_prefix("/").unwrap())
}

#[test]
fn mounted_with_a_relative_imatrix_equals_llama_quantize() {
    // The daemon leaves the working directory; quantize.imatrix.file records the path as given.
    let src = fixtures().join("qwen3moe8-bf16.gguf");
    let imatrix = relative_to_cwd(&fixtures().join("qwen3moe8.imatrix.gguf"));
    assert!(imatrix.is_relative());
    let m = Mount::new(&src, &["view=gguf", "ftype=Q4_K_M", &format!("imatrix={}", imatrix.display())]);
    let got = std::fs::read(m.path("qwen3moe8-bf16-Q4_K_M.gguf")).unwrap();
    let want = llama_quantize_imatrix(&src, "Q4_K_M", &imatrix, 2).unwrap();
    assert_same("mounted qwen3moe8 Q4_K_M with a relative imatrix path", &got, &want);
    m.unmount();
}

#[test]
fn llama_model_quantize_with_imatrix_and_kv_overrides_equals_the_command_and_the_view() {
    // What the command adds, done through the library (params.imatrix, params.kv_overrides):
    // the same bytes, so the view is what both write.
    for (model, imatrix, ftype, number) in
        [("qwen3moe8-bf16.gguf", "qwen3moe8.imatrix.gguf", "Q4_K_M", 15), ("llama16-untied-mixed.gguf", "llama16-untied.imatrix.dat", "Q5_K_M", 17)]
    {
        let (src, imatrix) = (fixtures().join(model), fixtures().join(imatrix));
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("lib.gguf");
        run_ok(peer().arg("quantize").arg(&src).arg(&out).arg(number.to_string()).arg("2").arg("--imatrix").arg(&imatrix));
        let lib = std::fs::read(&out).unwrap();
        let cmd = llama_quantize_imatrix(&src, ftype, &imatrix, 1).unwrap();
        assert_same(&format!("{model} {ftype}: llama_model_quantize with kv_overrides vs the command"), &lib, &cmd);
        let opts = ["view=gguf".to_string(), format!("ftype={ftype}"), format!("imatrix={}", imatrix.display())];
        let (_, got) = read_view(&build(&src, &opts.iter().map(String::as_str).collect::<Vec<_>>()).unwrap()).unwrap();
        assert_same(&format!("{model} {ftype} imatrix"), &got, &lib);
    }
}

/// The views compose: the expert-pack view of the gguf view's mounted `Q8_0` file (FUSE over
/// FUSE) equals seed 000's build of `llama_model_quantize`'s `Q8_0` file of the same source.
#[test]
fn the_expert_pack_of_a_mounted_q8_0_file_equals_the_seed_on_llama_quantizes_file() {
    const ID: &str = "3333333333333333333333333333333333333333333333333333333333333333";
    const CFG: &str = "4444444444444444444444444444444444444444444444444444444444444444";
    let src = fixtures().join("qwen3moe8-bf16.gguf");
    let gguf = Mount::new(&src, &["view=gguf", "ftype=Q8_0", "cache_mb=1"]);
    let q8 = gguf.path("qwen3moe8-bf16-Q8_0.gguf");
    // llama.cpp's file under the view's name (the seed names its pack after the stem).
    let theirs_dir = tempfile::tempdir().unwrap();
    let theirs = theirs_dir.path().join("qwen3moe8-bf16-Q8_0.gguf");
    std::fs::write(&theirs, llama_quantize(&src, 7, 2)).unwrap();
    let seed = tempfile::tempdir().unwrap();
    let seed_args = ["--model-identity-sha256", ID, "--config-sha256", CFG, "--top-k", "2", "--alignment", "4096", "--model-ref", "qwen3moe8"];
    seed_expert_pack(&theirs, seed.path(), &seed_args);

    let (id, cfg) = (format!("model_identity_sha256={ID}"), format!("config_sha256={CFG}"));
    let pack = Mount::new(&q8, &["view=expert-pack", &id, &cfg, "top_k=2", "alignment=4096", "model_ref=qwen3moe8"]);
    let name = "qwen3moe8-bf16-Q8_0.pack";
    let ours = std::fs::read(pack.path(name)).unwrap();
    assert_same("expert pack of the mounted Q8_0 file", &ours, &std::fs::read(seed.path().join(name)).unwrap());
    // The manifests agree but for when, where and by which program (the source is named by
    // its path, which differs by construction).
    let load = |p: &Path| -> serde_json::Value { serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap() };
    let mut want = load(&seed.path().join(format!("{name}.manifest.json")));
    let mut got = load(&pack.path(&format!("{name}.manifest.json")));
    assert_eq!(got["source"]["path"], q8.to_string_lossy().as_ref(), "{got}");
    for v in [&mut want, &mut got] {
        let o = v.as_object_mut().unwrap();
        for k in ["created_at", "pack_path", "builder"] {
            assert!(o.remove(k).is_some(), "manifest lacks {k}");
        }
        o["transform"].as_object_mut().unwrap().remove("tool_sha256").expect("tool_sha256");
        o["source"].as_object_mut().unwrap().remove("path").expect("source.path");
    }
    assert_eq!(want, got);
    pack.unmount();
    gguf.unmount();
}
