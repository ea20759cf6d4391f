//! A kt-kernel persistent INT8 expert tree as a view (`shared/reference/kt-int8.md`):
//! `kt-weight-manifest.json` (schema 2, layout `kt-int8-n32-k64-vnni-v1`) and
//! `_layer_L/_numa_i/INT8_{gate|up|down}_{expert}_{bytes}Byte_{quant|scale}_.kt`, exactly
//! what the validator allows and nothing else.
//!
//! Experts come from any source xpackfs can decode: DeepSeek V4 safetensors (MXFP4
//! `layers.L.ffn.experts.E.w{1,3,2}`), GGUF `blk.L.ffn_{gate,up,down}_exps.weight` of any
//! supported type, or Hugging Face style `model.layers.L.mlp.experts.E.{gate,up,down}_proj.weight`
//! (BF16/F16/F32). Each (layer, expert, projection) is decoded once to f32 (into a reused
//! buffer) and every NUMA part's quant and scale file is computed from it in place (per-row
//! INT8, VNNI packing; rows in parallel), as sibling parts of one job through the tiers
//! (memory, the disk cache, the compute pool), keyed by the matrix's source bytes (file
//! identity, offsets, type), the tensor, projection, dimensions and NUMA count. A read
//! prefetches the next two matrices. The manifest's digests are computed on first read and
//! remembered.

pub mod existing_tree;
pub mod validate;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use safetensors::Dtype;
use serde_json::{Value, json};

use super::derived::{Derived, Input};
use super::scratch::Scratch;
use super::tiered::{ChunkPlan, Tiered};
use super::{ChunkProducer, ROOT_INO, Tree, ViewError, VirtualFile};
use crate::codec::{self, kt_int8};
use crate::digest::DigestStore;
use crate::pyjson::{self, Style};
use crate::source::{Source, SourceFile, TensorDtype, TensorInfo};
use crate::store::disk::source_file_keys;
use crate::store::{KeyBuilder, ReadCtx};
use crate::util::args::int_in;

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
    /// The matrix as f32 into `out` (every value written), decoded on all cores (the
    /// parallel codec helpers, on the pool of the job that calls it).
    fn decode_into(&self, n: usize, k: usize, name: &str, out: &mut [f32]) -> Result<(), ViewError> {
        let content = |rule: String| ViewError::Content { tensor: name.to_string(), rule };
        let codec_err = |e| ViewError::Codec { tensor: name.to_string(), source: e };
        if out.len() != n * k {
            return Err(ViewError::Internal(format!("{name}: a decode buffer of {} values for {n}x{k}", out.len())));
        }
        match self {
            Matrix::Mxfp4 { w, w_off, s, s_off } => {
                let mut packed = vec![0u8; n * k / 2];
                w.read_exact_at(&mut packed, *w_off)?;
                let mut scales = vec![0u8; n * k / 32];
                s.read_exact_at(&mut scales, *s_off)?;
                codec::mxfp4::dequantize_deepseek_par(&packed, &scales, k, out).map_err(codec_err)?;
            }
            Matrix::Ggml { f, off, nbytes, ty } => {
                let mut b = vec![0u8; *nbytes as usize];
                f.read_exact_at(&mut b, *off)?;
                codec::dequantize_par(*ty, &b, out).map_err(codec_err)?;
            }
            Matrix::Dense { f, off, dtype } => {
                let size = match dtype {
                    Dtype::F32 => 4,
                    _ => 2,
                };
                let mut b = vec![0u8; n * k * size];
                f.read_exact_at(&mut b, *off)?;
                let name = match dtype {
                    Dtype::F32 => "F32",
                    Dtype::F16 => "F16",
                    _ => "BF16",
                };
                let ty = codec::GgmlType::from_name(name).ok_or_else(|| ViewError::Internal(format!("no ggml type {name}")))?;
                codec::dequantize_par(ty, &b, out).map_err(codec_err)?;
            }
        }
        if let Some(i) = first_non_finite(out) {
            return Err(content(format!("non-finite weight at element {i}")));
        }
        Ok(())
    }

    /// What the matrix's bytes are, for disk-cache keys (`file_keys`: the identity of each
    /// of `files`).
    fn key(&self, key: KeyBuilder, files: &[Arc<SourceFile>], file_keys: &[String]) -> KeyBuilder {
        let file = |f: &Arc<SourceFile>| files.iter().position(|g| Arc::ptr_eq(f, g)).map_or("", |i| file_keys[i].as_str()).to_string();
        match self {
            Matrix::Mxfp4 { w, w_off, s, s_off } => {
                key.field("matrix", "mxfp4").field("weight_file", file(w)).u64("weight_offset", *w_off).field("scale_file", file(s)).u64("scale_offset", *s_off)
            }
            Matrix::Ggml { f, off, nbytes, ty } => {
                key.field("matrix", "ggml").field("file", file(f)).u64("offset", *off).u64("nbytes", *nbytes).field("type", ty.name)
            }
            Matrix::Dense { f, off, dtype } => key.field("matrix", "dense").field("file", file(f)).u64("offset", *off).field("dtype", format!("{dtype:?}")),
        }
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

/// Caps on what a source may declare before anything is allocated from it. The largest
/// public MoE checkpoints stay far below them (DeepSeek V4: 61 layers x 256 experts of
/// 7168 x 2048; Kimi K2/K3: 61-93 layers x 384-896 experts).
pub use super::{MAX_EXPERTS, MAX_LAYER_INDEX};
/// Elements of one expert matrix (decoded to f32 whole: 1 GiB).
pub const MAX_MATRIX_ELEMENTS: u64 = 1 << 28;
/// Files of the tree (layers x experts x 3 projections x NUMA parts x 2).
pub const MAX_FILES: u64 = 4 << 20;

/// The GGUF types this view decodes (`codec::dequantize`).
pub const GGUF_TYPES: &[&str] = &["F32", "F16", "BF16", "Q8_0", "Q2_K", "Q4_K", "Q6_K", "IQ2_XXS", "MXFP4"];

/// `{prefix}{layer}{infix}{expert}.{proj}` -> (layer, expert, role), `projs` naming the
/// gate, up and down projections in that order.
fn expert_name<'a>(name: &'a str, prefix: &str, infix: &str, projs: [&str; 3]) -> Option<(u64, &'a str, usize)> {
    let (layer, rest) = name.strip_prefix(prefix)?.split_once(infix)?;
    let (expert, proj) = rest.split_once('.')?;
    Some((layer.parse().ok()?, expert, projs.iter().position(|p| *p == proj)?))
}

/// One projection of one expert (or of every expert, for a GGUF `*_exps` tensor) as found.
struct Found {
    name: String,
    layer: u64,
    /// `None`: all `experts` of a GGUF tensor.
    expert: Option<u64>,
    role: usize,
    /// The matrix as rows x cols (row-major).
    rows: u64,
    cols: u64,
    family: &'static str,
    make: Box<dyn Fn(u64) -> Matrix>,
    experts: u64,
}

fn name_index(name: &str, what: &'static str, v: &str, max: u64) -> Result<u64, ViewError> {
    super::name_index(name, what, v, max).map_err(|e| err(e.to_string()))
}

/// The index of the first NaN or infinity in `v`, on all cores: each piece is checked by a
/// branch-free fold the compiler vectorises (a per-element `position` through rayon cost a
/// fifth of the view's time), and only a piece that holds one is searched.
fn first_non_finite(v: &[f32]) -> Option<usize> {
    use rayon::prelude::*;
    const PIECE: usize = 1 << 14;
    v.par_chunks(PIECE).enumerate().find_map_first(|(i, c)| {
        let any = c.iter().fold(false, |bad, x| bad | !x.is_finite());
        any.then(|| i * PIECE + c.iter().position(|x| !x.is_finite()).unwrap_or(0))
    })
}

/// The shape of `t` if it has rank `n` and no zero dimension.
fn dims(t: &TensorInfo, n: usize) -> Result<&[u64], ViewError> {
    if t.shape.len() != n || t.shape.contains(&0) {
        return Err(err(format!("{}: expected {n} non-zero dimensions, shape is {:?}", t.name, t.shape)));
    }
    Ok(&t.shape)
}

/// A GGUF `blk.L.ffn_{gate,up,down}_exps.weight` (ne = [cols, rows, experts]).
fn gguf_experts(source: &Source, t: &TensorInfo, layer: u32, role: usize) -> Result<Found, ViewError> {
    let ty = t.dtype.ggml().ok_or_else(|| err(format!("{}: not a ggml tensor", t.name)))?;
    if !GGUF_TYPES.contains(&ty.name) {
        return Err(err(format!("{}: {} experts cannot be decoded by this view (it decodes {})", t.name, ty.name, GGUF_TYPES.join(", "))));
    }
    let d = dims(t, 3)?;
    let (cols, rows, e) = (d[0], d[1], d[2]);
    if u64::from(layer) > MAX_LAYER_INDEX || e > MAX_EXPERTS {
        return Err(err(format!("{}: layer {layer} / {e} experts exceed the caps ({MAX_LAYER_INDEX}, {MAX_EXPERTS})", t.name)));
    }
    let slice = t.nbytes / e;
    if !t.nbytes.is_multiple_of(e) || rows.checked_mul(cols).and_then(|x| ty.row_bytes(x)) != Some(slice) {
        return Err(err(format!("{}: {} bytes are not {e} experts of {rows}x{cols} {}", t.name, t.nbytes, ty.name)));
    }
    let (f, off) = (source.files[t.file].clone(), t.offset);
    Ok(Found {
        name: t.name.clone(),
        layer: layer.into(),
        expert: None,
        role,
        rows,
        cols,
        family: "GGUF blk.L.ffn_{gate,up,down}_exps",
        make: Box::new(move |x| Matrix::Ggml { f: f.clone(), off: off + x * slice, nbytes: slice, ty }),
        experts: e,
    })
}

/// A DeepSeek `layers.L.ffn.experts.E.w{1,3,2}.weight`: [rows, cols/2] I8/U8 nibbles with a
/// [rows, cols/32] F8_E8M0 scale.
fn deepseek_expert(source: &Source, by_name: &HashMap<&str, &TensorInfo>, t: &TensorInfo, layer: u64, expert: &str, role: usize) -> Result<Found, ViewError> {
    let layer = name_index(&t.name, "layer", &layer.to_string(), MAX_LAYER_INDEX)?;
    let e = name_index(&t.name, "expert", expert, MAX_EXPERTS - 1)?;
    if !matches!(t.dtype, TensorDtype::Safetensors(Dtype::I8 | Dtype::U8)) {
        return Err(err(format!("{}: DeepSeek experts must be packed MXFP4 (I8/U8 nibbles), got {}", t.name, t.dtype.name())));
    }
    let d = dims(t, 2)?;
    let (rows, cols) = (d[0], d[1] * 2);
    let scale_name = format!("{}.scale", t.name.strip_suffix(".weight").unwrap_or(&t.name));
    let s = by_name.get(scale_name.as_str()).ok_or_else(|| err(format!("{}: no matching MXFP4 scale tensor {scale_name}", t.name)))?;
    if s.shape != [rows, cols / 32] || cols % 32 != 0 || !matches!(s.dtype, TensorDtype::Safetensors(Dtype::F8_E8M0)) {
        return Err(err(format!(
            "{}: packing mismatch with its scale {scale_name} ({:?} {}; MXFP4 needs [N, K/2] weights with [N, K/32] F8_E8M0 scales)",
            t.name,
            s.shape,
            s.dtype.name()
        )));
    }
    let (w, w_off, sf, s_off) = (source.files[t.file].clone(), t.offset, source.files[s.file].clone(), s.offset);
    Ok(Found {
        name: t.name.clone(),
        layer,
        expert: Some(e),
        role,
        rows,
        cols,
        family: "DeepSeek layers.L.ffn.experts.E.w{1,3,2}",
        make: Box::new(move |_| Matrix::Mxfp4 { w: w.clone(), w_off, s: sf.clone(), s_off }),
        experts: 1,
    })
}

/// A Hugging Face `model.layers.L.mlp.experts.E.{gate,up,down}_proj.weight`, [rows, cols].
fn hf_expert(source: &Source, t: &TensorInfo, layer: u64, expert: &str, role: usize) -> Result<Found, ViewError> {
    let layer = name_index(&t.name, "layer", &layer.to_string(), MAX_LAYER_INDEX)?;
    let e = name_index(&t.name, "expert", expert, MAX_EXPERTS - 1)?;
    let dtype = match t.dtype {
        TensorDtype::Safetensors(d @ (Dtype::BF16 | Dtype::F16 | Dtype::F32)) => d,
        other => return Err(err(format!("{}: dense experts must be BF16, F16 or F32, got {}", t.name, other.name()))),
    };
    let d = dims(t, 2)?;
    let (f, off) = (source.files[t.file].clone(), t.offset);
    Ok(Found {
        name: t.name.clone(),
        layer,
        expert: Some(e),
        role,
        rows: d[0],
        cols: d[1],
        family: "Hugging Face model.layers.L.mlp.experts.E.{gate,up,down}_proj",
        make: Box::new(move |_| Matrix::Dense { f: f.clone(), off, dtype }),
        experts: 1,
    })
}

/// Every expert tensor of the source, each checked on its own (name, type, rank, bytes).
fn found_in(source: &Source) -> Result<Vec<Found>, ViewError> {
    let by_name: HashMap<&str, &TensorInfo> = source.tensors.iter().map(|t| (t.name.as_str(), t)).collect();
    let mut found = Vec::new();
    for t in &source.tensors {
        if let Some((layer, role)) = super::expert_pack::parse_expert_name(&t.name) {
            found.push(gguf_experts(source, t, layer, role)?);
        } else if let Some((layer, expert, role)) = expert_name(&t.name, "layers.", ".ffn.experts.", ["w1.weight", "w3.weight", "w2.weight"]) {
            found.push(deepseek_expert(source, &by_name, t, layer, expert, role)?);
        } else if let Some((layer, expert, role)) =
            expert_name(&t.name, "model.layers.", ".mlp.experts.", ["gate_proj.weight", "up_proj.weight", "down_proj.weight"])
        {
            found.push(hf_expert(source, t, layer, expert, role)?);
        }
    }
    Ok(found)
}

/// (hidden, inter) from the first tensor; every other must agree: one layout family, gate
/// and up inter x hidden, down hidden x inter, under the size cap.
fn dimensions(found: &[Found]) -> Result<(u64, u64), ViewError> {
    let Some(first) = found.first() else {
        return Err(err("the source has no routed experts this view can decode (GGUF *_exps, DeepSeek MXFP4, or HF dense experts)"));
    };
    if let Some(other) = found.iter().find(|f| f.family != first.family) {
        return Err(err(format!("{} and {} are experts of two different layouts ({}; {})", first.name, other.name, first.family, other.family)));
    }
    let (hidden, inter) = if first.role == 2 { (first.rows, first.cols) } else { (first.cols, first.rows) };
    for f in found {
        let want = if f.role == 2 { (hidden, inter) } else { (inter, hidden) };
        if (f.rows, f.cols) != want {
            return Err(err(format!(
                "{}: the {} matrix is {}x{}, but {} makes gate/up {inter}x{hidden} and down {hidden}x{inter} (rows x columns)",
                f.name, PROJS[f.role], f.rows, f.cols, first.name
            )));
        }
    }
    if hidden.checked_mul(inter).is_none_or(|x| x > MAX_MATRIX_ELEMENTS) {
        return Err(err(format!("{}: {hidden}x{inter} expert matrices exceed the cap of {MAX_MATRIX_ELEMENTS} elements", first.name)));
    }
    Ok((hidden, inter))
}

/// The expert count, with every layer holding experts 0..E, each projection exactly once,
/// and the tree under the file cap.
fn coverage(found: &[Found]) -> Result<u64, ViewError> {
    let mut slots: BTreeMap<(u64, usize), BTreeMap<u64, &Found>> = BTreeMap::new();
    let mut experts = None;
    for f in found {
        let slot = slots.entry((f.layer, f.role)).or_default();
        let prev = slot.insert(f.expert.unwrap_or(0), f);
        if let Some(prev) = prev {
            let what = if f.expert.is_some() { "the same expert" } else { "the same layer and projection" };
            return Err(err(format!("{} and {} are {what}", prev.name, f.name)));
        }
        if f.expert.is_none() {
            match experts {
                Some(e) if e != f.experts => return Err(err(format!("{}: {} experts, other layers have {e}", f.name, f.experts))),
                _ => experts = Some(f.experts),
            }
        }
    }
    let per_expert = found.first().is_some_and(|f| f.expert.is_some());
    let experts = match experts {
        Some(e) => e,
        None => slots.values().filter_map(|m| m.keys().next_back()).max().map_or(0, |e| e + 1),
    };
    let layers: BTreeSet<u64> = slots.keys().map(|k| k.0).collect();
    for &l in &layers {
        for (r, p) in PROJS.iter().enumerate() {
            let slot = slots.get(&(l, r));
            let have = slot.map_or(0, |m| m.len() as u64);
            if have != if per_expert { experts } else { 1 } {
                let missing: Vec<String> = if per_expert {
                    (0..experts).filter(|e| !slot.is_some_and(|m| m.contains_key(e))).take(8).map(|e| e.to_string()).collect()
                } else {
                    vec!["all".into()]
                };
                return Err(err(format!("layer {l} has no {p} projection for expert(s) {} (every layer needs experts 0..{experts})", missing.join(", "))));
            }
        }
    }
    let files = (layers.len() as u64).saturating_mul(experts).saturating_mul(6);
    if files > MAX_FILES {
        return Err(err(format!("{} layers x {experts} experts make {files} files per NUMA part, more than the cap of {MAX_FILES}", layers.len())));
    }
    Ok(experts)
}

/// Which matrices a source holds, with every rule checked before anything is laid out:
/// one family of names, decodable types, rank and shape of every tensor per role (gate and
/// up inter x hidden, down hidden x inter, the same in every layer), every expert 0..E of
/// every layer present exactly once, counts under the caps.
fn find_experts(source: &Source) -> Result<Experts, ViewError> {
    let found = found_in(source)?;
    let (hidden, inter) = dimensions(&found)?;
    let experts = coverage(&found)?;
    let mut mats = BTreeMap::new();
    for f in &found {
        match f.expert {
            None => {
                for x in 0..f.experts {
                    mats.insert((f.layer, x as usize, f.role), ((f.make)(x), f.name.clone()));
                }
            }
            Some(e) => {
                mats.insert((f.layer, e as usize, f.role), ((f.make)(0), f.name.clone()));
            }
        }
    }
    // The manifest's `decode` names the last expert tensor's decoding, in tensor order.
    let first_gguf = found.first().is_some_and(|f| f.expert.is_none());
    let deepseek = found.first().is_some_and(|f| f.family.starts_with("DeepSeek"));
    let decode = match (first_gguf, deepseek, found.last().and_then(|f| source.tensor(&f.name)).map(|t| t.dtype)) {
        (true, _, Some(TensorDtype::Ggml(ty))) => format!("gguf {} -> f32 (ggml dequantize_row_*)", ty.name),
        (_, true, _) => "DeepSeek MXFP4 (E2M1 x E8M0) -> f32, exact".to_string(),
        (_, _, Some(TensorDtype::Safetensors(d))) => format!("{d:?} -> f32, exact"),
        _ => String::new(),
    };
    Ok(Experts { decode, experts: experts as usize, hidden: hidden as usize, inter: inter as usize, mats })
}

/// One (layer, expert, projection): all NUMA parts' quant and scale files, computed together
/// (one decode of the matrix) as sibling parts of one job through the tiers.
struct Int8Inner {
    name: String,
    matrix: Matrix,
    proj: usize,
    hidden: usize,
    inter: usize,
    numa: usize,
    /// The next matrix in build order (layer, projection, expert), for reading ahead
    /// across files (weak: the files' extents own the matrices).
    next: std::sync::OnceLock<std::sync::Weak<Tiered<Int8Inner>>>,
}

/// Matrices a read prefetches after its own (each is computed by one job into all its NUMA
/// parts' files, or loaded part by part from the disk cache): the next experts are ready
/// when the reader gets to them.
const AHEAD_MATRICES: usize = 2;

impl Int8Inner {
    /// Part `i` (2 x NUMA part + 0 for quant, 1 for scale): its length.
    fn part_len(&self, i: usize) -> u64 {
        let il = self.inter / self.numa;
        (match (self.proj, i % 2) {
            (_, 0) => self.hidden * il,
            (2, _) => 4 * self.hidden,
            _ => 4 * il,
        }) as u64
    }
}

impl ChunkPlan for Int8Inner {
    fn name(&self) -> &str {
        &self.name
    }

    fn chunk_len(&self, id: u64) -> u64 {
        self.part_len(id as usize)
    }

    fn compute(&self, id: u64) -> Result<Arc<[u8]>, ViewError> {
        Err(ViewError::Internal(format!("{}: part {id} is computed with its siblings", self.name)))
    }

    fn siblings(&self) -> Option<u64> {
        Some(2 * self.numa as u64)
    }

    /// Every part: the matrix decoded once, then each NUMA part quantised to per-row INT8 and
    /// packed (the codec calls of this view), straight into the chunks the caches keep.
    fn compute_all(&self) -> Result<Vec<Arc<[u8]>>, ViewError> {
        let (rows, cols) = if self.proj == 2 { (self.hidden, self.inter) } else { (self.inter, self.hidden) };
        // The decoded matrix, in a pooled buffer (see [`super::scratch`]).
        let mut scratch = Scratch::take(rows * cols);
        let w = scratch.slice(rows * cols);
        self.matrix.decode_into(rows, cols, &self.name, w)?;
        // One NUMA part after the other, each quantised and packed on all cores.
        let codec_err = |e| ViewError::Codec { tensor: self.name.clone(), source: e };
        let mut out = Vec::with_capacity(2 * self.numa);
        for part in 0..self.numa {
            let (sub, ld, n, k) = if self.proj == 2 {
                let (sub, ld) = kt_int8::numa_split_cols(w, rows, cols, part, self.numa).map_err(codec_err)?;
                (sub, ld, self.hidden, self.inter / self.numa)
            } else {
                (kt_int8::numa_split_rows(w, rows, cols, part, self.numa).map_err(codec_err)?, self.hidden, self.inter / self.numa, self.hidden)
            };
            let mut d = vec![0f32; n];
            out.push(super::new_chunk(n * k, |packed| kt_int8::quantize_pack_into(sub, ld, n, k, packed, &mut d)).map_err(codec_err)?);
            out.push(d.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>().into());
        }
        Ok(out)
    }

    /// The same file of the next matrices, and its quant/scale partner: computing one part
    /// computes them all, but a part found in the disk cache comes alone.
    fn read_ahead(&self, id: u64, ctx: ReadCtx) {
        let mut next = self.next.get().and_then(std::sync::Weak::upgrade);
        for _ in 0..AHEAD_MATRICES {
            let Some(n) = next else { break };
            for p in [id, id ^ 1] {
                if p < 2 * n.plan().numa as u64 && !n.ready(p) {
                    n.prefetch(p, ctx);
                }
            }
            next = n.plan().next.get().and_then(std::sync::Weak::upgrade);
        }
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
    fn verify(&self, _built: &crate::view::Built, out: &std::path::Path, written: &std::collections::HashMap<String, String>) -> Result<(), ViewError> {
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
    let tiers = &ctx.tiers;
    let file_keys = source_file_keys(&source.files);
    let ex = find_experts(source)?;
    let (h, i, e) = (ex.hidden, ex.inter, ex.experts);
    if numa == 0 || i % numa != 0 {
        return Err(ViewError::Option { option: "numa_count", rule: format!("{numa} does not divide the intermediate size {i}") });
    }
    let il = i / numa;
    if h % 64 != 0 || !il.is_multiple_of(64) {
        return Err(err(format!("{} needs hidden ({h}) and intermediate/numa ({il}) to be multiples of 64", kt_int8::LAYOUT)));
    }
    let layers: BTreeSet<u64> = ex.mats.keys().map(|k| k.0).collect();
    let mut tree = Tree::new();
    // Per layer, its files by name.
    type LayerFiles = Vec<(u64, Vec<(String, Arc<VirtualFile>)>)>;
    let mut layer_files: LayerFiles = Vec::new();
    let mut last: Option<Arc<Tiered<Int8Inner>>> = None;
    for &l in &layers {
        let ldir = tree.add_dir(ROOT_INO, &format!("_layer_{l}"));
        let ndirs: Vec<_> = (0..numa).map(|n| tree.add_dir(ldir, &format!("_numa_{n}"))).collect();
        let mut files = Vec::new();
        let mut per_numa: Vec<Vec<(String, Arc<VirtualFile>)>> = vec![Vec::new(); numa];
        for (r, proj) in PROJS.iter().enumerate() {
            for x in 0..e {
                let (m, name) = ex.mats[&(l, x, r)].clone();
                let key = m
                    .key(KeyBuilder::new(VIEW), &source.files, &file_keys)
                    .field("tensor", &name)
                    .u64("proj", r as u64)
                    .u64("hidden", h as u64)
                    .u64("inter", i as u64)
                    .u64("numa", numa as u64)
                    .producer();
                let producer = Tiered::new(Int8Inner { name, matrix: m, proj: r, hidden: h, inter: i, numa, next: Default::default() }, tiers, key);
                if let Some(prev) = last.replace(producer.clone()) {
                    let _ = prev.plan().next.set(Arc::downgrade(&producer));
                }
                for (n, files_n) in per_numa.iter_mut().enumerate() {
                    for (kind_i, kind) in ["quant", "scale"].iter().enumerate() {
                        let size = producer.plan().part_len(2 * n + kind_i);
                        let fname = format!("INT8_{proj}_{x}_{size}Byte_{kind}_.kt");
                        let mut f = VirtualFile::new();
                        f.push(producer.extent((2 * n + kind_i) as u64));
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::{SourceKind, TensorInfo};

    /// A source of dense HF experts (`shape` per tensor name) over one zero file large
    /// enough for every tensor.
    fn dense(tensors: &[(&str, Vec<u64>, Dtype)]) -> (tempfile::NamedTempFile, Source) {
        let f = tempfile::NamedTempFile::new().unwrap();
        f.as_file().set_len(1 << 20).unwrap();
        let file = Arc::new(SourceFile::open(f.path()).unwrap());
        let tensors = tensors
            .iter()
            .map(|(name, shape, dtype)| TensorInfo {
                name: name.to_string(),
                dtype: TensorDtype::Safetensors(*dtype),
                shape: shape.clone(),
                file: 0,
                offset: 0,
                nbytes: shape.iter().product::<u64>() * 2,
                logical_offset: 0,
            })
            .collect();
        let meta = crate::source::safetensors::SafetensorsMeta { root: f.path().into(), config: None, config_path: None, index_path: None, shards: vec![] };
        (f, Source { files: vec![file], kind: SourceKind::Safetensors(meta), tensors })
    }

    fn hf(layer: u64, expert: u64, proj: &str) -> String {
        format!("model.layers.{layer}.mlp.experts.{expert}.{proj}_proj.weight")
    }

    fn rule(tensors: Vec<(String, Vec<u64>, Dtype)>) -> String {
        let t: Vec<(&str, Vec<u64>, Dtype)> = tensors.iter().map(|(n, s, d)| (n.as_str(), s.clone(), *d)).collect();
        let (_f, source) = dense(&t);
        match find_experts(&source) {
            Ok(_) => "accepted".into(),
            Err(e) => e.to_string(),
        }
    }

    fn good(layers: u64, experts: u64) -> Vec<(String, Vec<u64>, Dtype)> {
        let mut v = Vec::new();
        for l in 0..layers {
            for e in 0..experts {
                v.push((hf(l, e, "gate"), vec![128, 64], Dtype::BF16));
                v.push((hf(l, e, "up"), vec![128, 64], Dtype::BF16));
                v.push((hf(l, e, "down"), vec![64, 128], Dtype::BF16));
            }
        }
        v
    }

    #[test]
    fn the_first_non_finite_value_is_found_in_any_piece() {
        let mut v = vec![1.5f32; 100_000];
        assert_eq!(first_non_finite(&v), None);
        v[70_001] = f32::INFINITY;
        v[99_999] = f32::NAN;
        assert_eq!(first_non_finite(&v), Some(70_001));
        v[3] = f32::NEG_INFINITY;
        assert_eq!(first_non_finite(&v), Some(3));
        assert_eq!(first_non_finite(&[]), None);
    }

    #[test]
    fn shapes_roles_and_coverage_are_checked_before_layout() {
        assert_eq!(rule(good(2, 2)), "accepted");
        let (_f, s) = dense(&good(2, 3).iter().map(|(n, sh, d)| (n.as_str(), sh.clone(), *d)).collect::<Vec<_>>());
        let ex = find_experts(&s).unwrap();
        assert_eq!((ex.hidden, ex.inter, ex.experts, ex.mats.len()), (64, 128, 3, 18));

        let mut down_like_gate = good(1, 2);
        down_like_gate[2].1 = vec![128, 64];
        assert!(rule(down_like_gate).contains("the down matrix is 128x64"), "down shaped like gate");
        let mut swapped_layer = good(2, 1);
        for t in swapped_layer.iter_mut().skip(3) {
            t.1.reverse();
        }
        assert!(rule(swapped_layer).contains("model.layers.1.mlp.experts.0.gate_proj.weight: the gate matrix is 64x128"));
        let mut up_differs = good(1, 1);
        up_differs[1].1 = vec![192, 64];
        assert!(rule(up_differs).contains("up matrix is 192x64"));
        let mut gap = good(1, 3);
        gap.retain(|t| !t.0.contains(".experts.1."));
        assert!(rule(gap).contains("layer 0 has no gate projection for expert(s) 1"));
        let mut rank1 = good(1, 1);
        rank1[0].1 = vec![128];
        assert!(rule(rank1).contains("expected 2 non-zero dimensions"));
        let mut zero = good(1, 1);
        zero[0].1 = vec![0, 64];
        assert!(rule(zero).contains("non-zero"));
        let mut wrong_type = good(1, 1);
        wrong_type[0].2 = Dtype::I32;
        assert!(rule(wrong_type).contains("must be BF16, F16 or F32"));
        let mut far_layer = good(1, 1);
        far_layer[0].0 = hf(4_294_967_295, 0, "gate");
        assert!(rule(far_layer).contains("is not a number from 0 to 4095"));
        let mut dup = good(1, 1);
        dup.push((hf(0, 0, "gate").replace(".0.gate", ".00.gate"), vec![128, 64], Dtype::BF16));
        assert!(rule(dup).contains("expert index \"00\""));
        assert!(rule(vec![]).contains("no routed experts"));
    }
}
