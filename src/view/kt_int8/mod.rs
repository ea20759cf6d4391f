//! A kt-kernel persistent INT8 expert tree as a view (`shared/reference/kt-int8.md`):
//! `kt-weight-manifest.json` (schema 2, layout `kt-int8-n32-k64-vnni-v1`) and
//! `_layer_L/_numa_i/INT8_{gate|up|down}_{expert}_{bytes}Byte_{quant|scale}_.kt`, exactly
//! what the validator allows and nothing else.
//!
//! Experts come from any source xpackfs can decode: DeepSeek V4 safetensors (MXFP4
//! `layers.L.ffn.experts.E.w{1,3,2}`), GGUF `blk.L.ffn_{gate,up,down}_exps.weight` of any
//! supported type, or Hugging Face style `model.layers.L.mlp.experts.E.{gate,up,down}_proj.weight`
//! (BF16/F16/F32). Each (layer, expert, projection) is decoded once to f32 and every NUMA
//! part's quant and scale file is computed from it (per-row INT8, VNNI packing), through the
//! chunk cache. The manifest's digests are computed on first read and remembered.

pub mod tree;
pub mod validate;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use safetensors::Dtype;
use serde_json::{json, Value};

use super::cache::ChunkCache;
use super::derived::{Derived, Input};
use super::{ChunkSource, Extent, Tree, ViewError, VirtualFile, ROOT_INO};
use crate::util::args::int_in;
use crate::codec::{self, kt_int8};
use crate::digest::DigestStore;
use crate::pyjson::{self, Style};
use crate::source::{Source, SourceFile, TensorDtype};

const VIEW: &str = "kt-int8";
pub use validate::MANIFEST_NAME;
const PROJS: [&str; 3] = ["gate", "up", "down"];

fn err(rule: impl Into<String>) -> ViewError {
    ViewError::Layout { view: VIEW, rule: rule.into() }
}

/// Where one expert matrix (row-major, `n` rows of `k`) comes from.
#[derive(Debug, Clone)]
enum Matrix {
    Mxfp4 { w: Arc<SourceFile>, w_off: u64, s: Arc<SourceFile>, s_off: u64 },
    Ggml { f: Arc<SourceFile>, off: u64, nbytes: u64, ty: codec::GgmlType },
    Dense { f: Arc<SourceFile>, off: u64, dtype: Dtype },
}

impl Matrix {
    fn decode(&self, n: usize, k: usize, name: &str) -> Result<Vec<f32>, ViewError> {
        let content = |rule: String| ViewError::Content { tensor: name.to_string(), rule };
        let codec_err = |e| ViewError::Codec { tensor: name.to_string(), source: e };
        let mut out = vec![0f32; n * k];
        match self {
            Matrix::Mxfp4 { w, w_off, s, s_off } => {
                let mut packed = vec![0u8; n * k / 2];
                w.read_exact_at(&mut packed, *w_off)?;
                let mut scales = vec![0u8; n * k / 32];
                s.read_exact_at(&mut scales, *s_off)?;
                codec::mxfp4::dequantize_deepseek(&packed, &scales, k, &mut out).map_err(codec_err)?;
            }
            Matrix::Ggml { f, off, nbytes, ty } => {
                let mut b = vec![0u8; *nbytes as usize];
                f.read_exact_at(&mut b, *off)?;
                codec::dequantize(*ty, &b, &mut out).map_err(codec_err)?;
            }
            Matrix::Dense { f, off, dtype } => {
                let size = match dtype {
                    Dtype::F32 => 4,
                    _ => 2,
                };
                let mut b = vec![0u8; n * k * size];
                f.read_exact_at(&mut b, *off)?;
                match dtype {
                    Dtype::F32 => codec::float::f32_to_f32(&b, &mut out),
                    Dtype::F16 => codec::float::f16_to_f32(&b, &mut out),
                    _ => codec::float::bf16_to_f32(&b, &mut out),
                }
            }
        }
        if let Some(i) = out.iter().position(|v| !v.is_finite()) {
            return Err(content(format!("non-finite weight at element {i}")));
        }
        Ok(out)
    }
}

/// All routed experts of a source: layers, dimensions, and where each matrix is.
struct Experts {
    decode: String,
    experts: usize,
    hidden: usize,
    inter: usize,
    /// (layer, expert, proj) -> (matrix, source tensor name)
    mats: BTreeMap<(u64, usize, usize), (Matrix, String)>,
}

/// `{prefix}{layer}{infix}{expert}.{proj}` -> (layer, expert, role), `projs` naming the
/// gate, up and down projections in that order.
fn expert_name<'a>(name: &'a str, prefix: &str, infix: &str, projs: [&str; 3]) -> Option<(u64, &'a str, usize)> {
    let (layer, rest) = name.strip_prefix(prefix)?.split_once(infix)?;
    let (expert, proj) = rest.split_once('.')?;
    Some((layer.parse().ok()?, expert, projs.iter().position(|p| *p == proj)?))
}

fn find_experts(source: &Source) -> Result<Experts, ViewError> {
    let mut mats = BTreeMap::new();
    let (mut hidden, mut inter, mut experts, mut decode) = (0usize, 0usize, 0usize, String::new());
    let by_name: std::collections::HashMap<&str, &crate::source::TensorInfo> = source.tensors.iter().map(|t| (t.name.as_str(), t)).collect();
    for t in &source.tensors {
        // GGUF
        if let Some((layer, role)) = super::expert_pack::parse_expert_name(&t.name) {
            let ty = t.dtype.ggml().ok_or_else(|| err(format!("{}: not a ggml tensor", t.name)))?;
            if t.shape.len() != 3 {
                return Err(err(format!("{}: expected 3 dimensions, got {:?}", t.name, t.shape)));
            }
            let (k, n, e) = (t.shape[0] as usize, t.shape[1] as usize, t.shape[2] as usize);
            let (h, i) = if role == 2 { (n, k) } else { (k, n) };
            (hidden, inter, experts) = (h, i, e);
            decode = format!("gguf {} -> f32 (ggml dequantize_row_*)", ty.name);
            let slice = t.nbytes / e as u64;
            for x in 0..e {
                mats.insert((layer as u64, x, role), (Matrix::Ggml { f: source.files[t.file].clone(), off: t.offset + x as u64 * slice, nbytes: slice, ty }, t.name.clone()));
            }
            continue;
        }
        // DeepSeek native MXFP4
        if let Some((layer, expert, role)) = expert_name(&t.name, "layers.", ".ffn.experts.", ["w1.weight", "w3.weight", "w2.weight"]) {
            let e: usize = expert.parse().map_err(|_| err(format!("{}: bad expert index", t.name)))?;
            let scale_name = format!("{}.scale", t.name.strip_suffix(".weight").unwrap());
            let s = by_name.get(scale_name.as_str()).ok_or_else(|| err(format!("{}: no matching MXFP4 scale tensor", t.name)))?;
            let (n, k) = (t.shape[0] as usize, t.shape[1] as usize * 2);
            if s.shape != [n as u64, (k / 32) as u64] {
                return Err(err(format!("{}: packing mismatch with its scale {:?}", t.name, s.shape)));
            }
            let (h, i) = if role == 2 { (n, k) } else { (k, n) };
            (hidden, inter) = (h, i);
            experts = experts.max(e + 1);
            decode = "DeepSeek MXFP4 (E2M1 x E8M0) -> f32, exact".into();
            mats.insert((layer, e, role), (Matrix::Mxfp4 { w: source.files[t.file].clone(), w_off: t.offset, s: source.files[s.file].clone(), s_off: s.offset }, t.name.clone()));
            continue;
        }
        // Hugging Face dense experts
        if let Some((layer, expert, role)) =
            expert_name(&t.name, "model.layers.", ".mlp.experts.", ["gate_proj.weight", "up_proj.weight", "down_proj.weight"])
        {
            let e: usize = expert.parse().map_err(|_| err(format!("{}: bad expert index", t.name)))?;
            let dtype = match t.dtype {
                TensorDtype::Safetensors(d @ (Dtype::BF16 | Dtype::F16 | Dtype::F32)) => d,
                other => return Err(err(format!("{}: dense experts must be BF16, F16 or F32, got {}", t.name, other.name()))),
            };
            let (n, k) = (t.shape[0] as usize, t.shape[1] as usize);
            let (h, i) = if role == 2 { (n, k) } else { (k, n) };
            (hidden, inter) = (h, i);
            experts = experts.max(e + 1);
            decode = format!("{dtype:?} -> f32, exact");
            mats.insert((layer, e, role), (Matrix::Dense { f: source.files[t.file].clone(), off: t.offset, dtype }, t.name.clone()));
        }
    }
    if mats.is_empty() {
        return Err(err("the source has no routed experts this view can decode (GGUF *_exps, DeepSeek MXFP4, or HF dense experts)"));
    }
    let layers: BTreeSet<u64> = mats.keys().map(|k| k.0).collect();
    for &l in &layers {
        for e in 0..experts {
            for (r, p) in PROJS.iter().enumerate() {
                if !mats.contains_key(&(l, e, r)) {
                    return Err(err(format!("layer {l} expert {e} has no {p} projection")));
                }
            }
        }
    }
    Ok(Experts { decode, experts, hidden, inter, mats })
}

/// One (layer, expert, projection): all NUMA parts' quant and scale files.
struct Int8Chunks {
    name: String,
    matrix: Matrix,
    proj: usize,
    hidden: usize,
    inter: usize,
    numa: usize,
    cache: Arc<ChunkCache>,
    id: u64,
}

impl std::fmt::Debug for Int8Chunks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Int8Chunks({})", self.name)
    }
}

impl Int8Chunks {
    fn compute_all(&self) -> Result<Vec<Arc<[u8]>>, ViewError> {
        let (rows, cols) = if self.proj == 2 { (self.hidden, self.inter) } else { (self.inter, self.hidden) };
        let w = self.matrix.decode(rows, cols, &self.name)?;
        use rayon::prelude::*;
        let parts: Vec<Result<(Arc<[u8]>, Arc<[u8]>), ViewError>> = (0..self.numa).into_par_iter().map(|part| {
            let (sub, n, k) = if self.proj == 2 {
                (kt_int8::numa_split_cols(&w, rows, cols, part, self.numa), self.hidden, self.inter / self.numa)
            } else {
                (kt_int8::numa_split_rows(&w, rows, cols, part, self.numa), self.inter / self.numa, self.hidden)
            };
            let codec_err = |e| ViewError::Codec { tensor: self.name.clone(), source: e };
            let sub = sub.map_err(codec_err)?;
            let (mut q, mut d) = (vec![0i8; n * k], vec![0f32; n]);
            kt_int8::quantize(&sub, n, k, &mut q, &mut d).map_err(codec_err)?;
            let mut packed = vec![0u8; n * k];
            kt_int8::pack(&q, n, k, &mut packed).map_err(codec_err)?;
            Ok((Arc::from(packed), Arc::from(d.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>())))
        }).collect();
        let mut out = Vec::with_capacity(2 * self.numa);
        for p in parts {
            let (q, s) = p?;
            out.push(q);
            out.push(s);
        }
        Ok(out)
    }
}

impl ChunkSource for Int8Chunks {
    fn chunk(&self, id: u64) -> Result<Arc<[u8]>, ViewError> {
        self.cache.get_or_compute((self.id, id), || {
            let all = self.compute_all()?;
            for (i, v) in all.iter().enumerate() {
                if i as u64 != id {
                    self.cache.put((self.id, i as u64), v.clone());
                }
            }
            Ok(all[id as usize].clone())
        })
    }
}

/// Options of the INT8 views.
#[derive(Debug, Clone, clap::Args)]
#[group(id = "int8")]
pub struct Options {
    /// kt-int8: NUMA parts (kt-kernel's threadpool count)
    #[arg(long, default_value = "1", value_parser = int_in::<u32>(1, 64), help_heading = "INT8")]
    pub numa_count: u32,
    /// INT8 tree mounts: hash every file while validating the tree, before mounting
    #[arg(long, help_heading = "INT8")]
    pub verify_hashes: bool,
}

/// The kt-int8 view.
pub struct KtInt8View;

impl super::View for KtInt8View {
    fn name(&self) -> &'static str {
        VIEW
    }
    fn summary(&self) -> &'static str {
        "kt-kernel persistent INT8 expert tree (schema 2) computed from GGUF, DeepSeek MXFP4 or HF dense experts"
    }
    fn build(&self, input: &super::Input, opts: &super::ViewOptions, ctx: &super::Context) -> Result<Tree, ViewError> {
        build(input.source(VIEW)?, opts.kt_int8.numa_count as usize, ctx)
    }
    fn verify(&self, out: &std::path::Path, written: &std::collections::HashMap<String, String>) -> Result<(), ViewError> {
        verify_written_tree(out, written)
    }
    fn exclusive_root(&self) -> bool {
        true
    }
}

/// `materialize --verify` of an INT8 tree: the validator's rules, then the manifest's
/// digests against the written files' (re-hashed from disk just before, so the files are not
/// read a third time).
pub fn verify_written_tree(out: &std::path::Path, written: &std::collections::HashMap<String, String>) -> Result<(), ViewError> {
    if !written.contains_key(MANIFEST_NAME) {
        return Ok(());
    }
    validate::validate(out, &validate::Expect::default(), Some(false))?;
    for layer in super::derived::read_json(out, MANIFEST_NAME)?["layers"].as_array().into_iter().flatten() {
        for f in layer["files"].as_array().into_iter().flatten() {
            let file = f["path"].as_str().unwrap_or("");
            if f["sha256"].as_str() != written.get(file).map(String::as_str) {
                return Err(ViewError::Verify { file: MANIFEST_NAME.into(), rule: format!("{file} does not match its digest in {MANIFEST_NAME}") });
            }
        }
    }
    Ok(())
}

/// Build the view: the experts and their dimensions, the tree of quant and scale files, the
/// manifest.
pub fn build(source: &Source, numa: usize, ctx: &super::Context) -> Result<Tree, ViewError> {
    let cache = &ctx.cache;
    let ex = find_experts(source)?;
    let (h, i, e) = (ex.hidden, ex.inter, ex.experts);
    if numa == 0 || i % numa != 0 {
        return Err(ViewError::Option { option: "numa_count", rule: format!("{numa} does not divide the intermediate size {i}") });
    }
    let il = i / numa;
    if h % 64 != 0 || il % 64 != 0 {
        return Err(err(format!("{} needs hidden ({h}) and intermediate/numa ({il}) to be multiples of 64", kt_int8::LAYOUT)));
    }
    let layers: BTreeSet<u64> = ex.mats.keys().map(|k| k.0).collect();
    let mut tree = Tree::new();
    let mut layer_files: Vec<(u64, Vec<(String, Arc<VirtualFile>)>)> = Vec::new();
    for &l in &layers {
        let ldir = tree.add_dir(ROOT_INO, &format!("_layer_{l}"));
        let ndirs: Vec<_> = (0..numa).map(|n| tree.add_dir(ldir, &format!("_numa_{n}"))).collect();
        let mut files = Vec::new();
        let mut per_numa: Vec<Vec<(String, Arc<VirtualFile>)>> = vec![Vec::new(); numa];
        for (r, proj) in PROJS.iter().enumerate() {
            for x in 0..e {
                let (m, name) = ex.mats[&(l, x, r)].clone();
                let src = Arc::new(Int8Chunks { name, matrix: m, proj: r, hidden: h, inter: i, numa, id: cache.producer_id(), cache: cache.clone() });
                for (n, files_n) in per_numa.iter_mut().enumerate() {
                    for (kind_i, kind) in ["quant", "scale"].iter().enumerate() {
                        let size = match (r, *kind) {
                            (_, "quant") => h * il,
                            (2, _) => 4 * h,
                            _ => 4 * il,
                        };
                        let fname = format!("INT8_{proj}_{x}_{size}Byte_{kind}_.kt");
                        let mut f = VirtualFile::new();
                        f.push(Extent::Computed { source: src.clone(), id: (2 * n + kind_i) as u64, len: size as u64 });
                        let f = Arc::new(f);
                        tree.add_file_arc(ndirs[n], &fname, f.clone());
                        files_n.push((format!("_layer_{l}/_numa_{n}/{fname}"), f));
                    }
                }
            }
        }
        for v in per_numa {
            files.extend(v);
        }
        layer_files.push((l, files));
    }
    let make = {
        let layer_files: Vec<(u64, Vec<(String, u64)>)> =
            layer_files.iter().map(|(l, fs)| (*l, fs.iter().map(|(p, f)| (p.clone(), f.size())).collect())).collect();
        let decode = ex.decode.clone();
        move |hashes: &[String]| -> Vec<u8> {
            let mut k = 0;
            let mut total = 0u64;
            let layers: Vec<Value> = layer_files
                .iter()
                .map(|(l, fs)| {
                    let bytes: u64 = fs.iter().map(|f| f.1).sum();
                    total += bytes;
                    let files: Vec<Value> = fs
                        .iter()
                        .map(|(p, size)| {
                            k += 1;
                            json!({"path": p, "size_bytes": size, "sha256": hashes[k - 1]})
                        })
                        .collect();
                    json!({"index": l, "numa_count": numa, "state": "ready", "files": files, "bytes": bytes})
                })
                .collect();
            let mut s = pyjson::dumps(
                &json!({
                    "schema_version": 2, "state": "ready", "expert_weight_format": "int8",
                    "threadpool_count": numa, "expert_num": e, "hidden_size": h, "intermediate_size": i,
                    "layout": kt_int8::LAYOUT, "backend": "int8", "decode": decode,
                    "layers": layers, "bytes": total,
                }),
                &Style::PRETTY_SORTED,
            );
            s.push('\n');
            s.into_bytes()
        }
    };
    let inputs: Vec<Input> = layer_files.iter().flat_map(|(_, fs)| fs.iter().map(|f| Input::whole(&f.1))).collect();
    let key = DigestStore::view_key(VIEW, &format!("{}:{numa}:{}", codec::REVISION, ex.decode), &source.files);
    tree.add_file(ROOT_INO, MANIFEST_NAME, Derived::new(MANIFEST_NAME, &ctx.store, key, inputs, make).into_file());
    Ok(tree)
}
