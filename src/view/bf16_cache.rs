//! The BF16 non-expert cache of a DeepSeek V4 / V4.1 checkpoint, as the third seed
//! (`kt_deepseek_v4.py`, `_convert_non_expert_cache`) writes it: `non-expert-NNN.safetensors`
//! shards (one per contributing source shard, in sorted order), `model.safetensors.index.json`
//! and `kt_non_expert_manifest.json`.
//!
//! Tensor selection, renaming (`canonical_non_expert_key`) and every error condition follow
//! the seed; the ones visible in headers are reported at mount time. FP8 weights become
//! BF16 on read, in chunks of whole scale-block rows, through the tiers (memory, the disk
//! cache, the compute pool; keyed by the source files' identity, the tensor, its offsets,
//! shape, block shape and chunking); BF16/F32 tensors are served from the source after a
//! finiteness check (the seed's "non-finite source tensor"), through memory only (the
//! source is their durable copy); I64 tensors straight from the source. Shard files are laid out exactly
//! as `safetensors.torch.save_file(tensors, metadata={"format": "pt"})` lays them out: the
//! header comes from the `safetensors` crate's own serialiser (which the Python package
//! calls), tensors ordered by dtype, then name.
//!
//! V4.1 (`model_type` `deepseek_v41`, parameters under `text_config`, FP8 blocks from its
//! `weight_block_size`, e.g. 32x32) goes beyond the seed, with the same rules.
//!
//! The manifest holds every shard's sha256. Its size does not depend on the digests (fixed
//! length hex), so it is known at mount; its bytes are computed on first read by hashing
//! the shards through this view, then remembered in the digest store.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use safetensors::tensor::{Dtype, Metadata, TensorInfo as StInfo};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::Tiers;
use super::derived::{Derived, Input};
use super::scratch::Scratch;
use super::tiered::{ChunkPlan, Tiered};
use super::{Extent, ROOT_INO, Tree, ViewError, VirtualFile};
use crate::codec::fp8::Fp8Blocks;
use crate::digest::{self, DigestStore};
use crate::pyjson::{self, Style};
use crate::source::{Source, SourceFile};
use crate::store::KeyBuilder;
use crate::store::disk::source_file_keys;

pub const KIND: &str = "deepseek-v4-non-expert-bf16";
pub const INDEX_NAME: &str = "model.safetensors.index.json";
pub const MANIFEST_NAME: &str = "kt_non_expert_manifest.json";
const VIEW: &str = "bf16-cache";

fn err(rule: impl Into<String>) -> ViewError {
    ViewError::Layout { view: VIEW, rule: rule.into() }
}

/// The seed's `canonical_non_expert_key`.
pub fn canonical_non_expert_key(key: &str) -> Result<String, ViewError> {
    if key.starts_with("mtp.") || key.contains(".experts.") {
        return Err(err(format!("not a non-expert base-model tensor: {key}")));
    }
    let heads = [
        ("embed.weight", "model.embed_tokens.weight"),
        ("head.weight", "lm_head.weight"),
        ("norm.weight", "model.norm.weight"),
        ("hc_head_fn", "model.hc_head.hc_fn"),
        ("hc_head_base", "model.hc_head.hc_base"),
        ("hc_head_scale", "model.hc_head.hc_scale"),
    ];
    if let Some((_, t)) = heads.iter().find(|(k, _)| *k == key) {
        return Ok(t.to_string());
    }
    if !key.starts_with("layers.") {
        return Err(err(format!("unsupported V4 checkpoint key: {key}")));
    }
    let mut key = format!("model.{key}");
    const REPLACEMENTS: &[(&str, &str)] = &[
        (".attn.", ".self_attn."),
        (".ffn.", ".mlp."),
        (".indexer.compressor.", ".compressor.indexer."),
        (".indexer.weights_proj.", ".compressor.indexer.scorer.weights_proj."),
        (".indexer.wq_b.", ".compressor.indexer.q_b_proj."),
        (".attn_norm.", ".input_layernorm."),
        (".ffn_norm.", ".post_attention_layernorm."),
        (".attn_sink", ".sinks"),
        (".q_norm.", ".q_a_norm."),
        (".norm.", ".kv_norm."),
        (".wq_a.", ".q_a_proj."),
        (".wq_b.", ".q_b_proj."),
        (".wkv.", ".kv_proj."),
        (".wgate.", ".gate_proj."),
        (".wo_a.", ".o_a_proj."),
        (".wo_b.", ".o_b_proj."),
        (".shared_experts.w1.", ".shared_experts.gate_proj."),
        (".shared_experts.w2.", ".shared_experts.down_proj."),
        (".shared_experts.w3.", ".shared_experts.up_proj."),
        (".gate.bias", ".gate.e_score_correction_bias"),
        (".ape", ".position_bias"),
    ];
    for (old, new) in REPLACEMENTS {
        key = key.replace(old, new);
    }
    for (native, target) in [("hc_attn", "attn_hc"), ("hc_ffn", "ffn_hc")] {
        for suffix in ["fn", "base", "scale"] {
            key = key.replace(&format!(".{native}_{suffix}"), &format!(".{target}.{suffix}"));
        }
    }
    Ok(key)
}

/// What the config says: variant, dimensions, FP8 block shape.
#[derive(Debug, Clone)]
pub struct V4Config {
    pub model_type: String,
    pub layers: u64,
    pub experts: u64,
    pub hidden: u64,
    pub inter: u64,
    pub block: [usize; 2],
}

fn positive(v: Option<&Value>) -> Option<u64> {
    v.and_then(Value::as_u64).filter(|&x| x > 0)
}

/// What kind of JSON value `v` is, for messages.
fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

pub fn read_config(config: &Value) -> Result<V4Config, ViewError> {
    if !config.is_object() {
        return Err(err(format!("config.json must be a JSON object, it is {}", json_kind(config))));
    }
    let model_type = config.get("model_type").and_then(Value::as_str).unwrap_or("");
    let (text, expected_block) = match model_type {
        "deepseek_v4" => (config, Some([128usize, 128])),
        "deepseek_v41" => match config.get("text_config") {
            Some(t @ Value::Object(_)) => (t, None),
            Some(other) => return Err(err(format!("deepseek_v41 config.json text_config must be an object, it is {}", json_kind(other)))),
            None => return Err(err("deepseek_v41 config has no text_config")),
        },
        other => return Err(err(format!("native MXFP4 SFT currently requires DeepSeek V4 (model_type deepseek_v4 or deepseek_v41), got {other:?}"))),
    };
    let quant = text.get("quantization_config").or_else(|| config.get("quantization_config")).cloned().unwrap_or(Value::Null);
    let block: Option<[usize; 2]> = quant.get("weight_block_size").and_then(Value::as_array).and_then(|a| {
        let v: Vec<usize> = a.iter().filter_map(|x| x.as_u64().filter(|&x| x > 0).map(|x| x as usize)).collect();
        (v.len() == 2 && a.len() == 2).then(|| [v[0], v[1]])
    });
    let ok = quant.get("quant_method").and_then(Value::as_str) == Some("fp8")
        && quant.get("fmt").and_then(Value::as_str) == Some("e4m3")
        && quant.get("scale_fmt").and_then(Value::as_str) == Some("ue8m0")
        && block.is_some()
        && expected_block.is_none_or(|b| Some(b) == block);
    if !ok {
        return Err(err(format!("expected the native V4 FP8/UE8M0 non-expert checkpoint, quantization_config is {quant}")));
    }
    let keys = ["num_hidden_layers", "n_routed_experts", "hidden_size", "moe_intermediate_size"];
    let dims: Vec<Option<u64>> = keys.iter().map(|k| positive(text.get(*k))).collect();
    if let Some((key, _)) = keys.iter().zip(&dims).find(|(_, d)| d.is_none()) {
        let got = text.get(*key).map_or_else(|| "missing".to_string(), |v| format!("got {v}"));
        return Err(err(format!("native V4 dimension config.json {key} must be a positive integer ({got})")));
    }
    let (layers, experts, hidden, inter) = (dims[0].unwrap_or(1), dims[1].unwrap_or(1), dims[2].unwrap_or(1), dims[3].unwrap_or(1));
    for (key, v, max) in
        [("num_hidden_layers", layers, 4096), ("n_routed_experts", experts, 65536), ("hidden_size", hidden, 1 << 20), ("moe_intermediate_size", inter, 1 << 20)]
    {
        if v > max {
            return Err(err(format!("config.json {key} = {v} is beyond any real model (at most {max})")));
        }
    }
    if hidden % 32 != 0 || inter % 32 != 0 {
        return Err(err("invalid MXFP4 routed-expert dimensions"));
    }
    Ok(V4Config { model_type: model_type.to_string(), layers, experts, hidden, inter, block: block.unwrap_or([128, 128]) })
}

fn is_fp8(d: Dtype) -> bool {
    d == Dtype::F8_E4M3
}

/// `layers.{l}.ffn.experts.{e}.{proj}.{kind}` -> (l, e, proj index, kind index), only in the
/// canonical spelling (no leading zeros), as the seed's names are generated.
fn routed_expert_name(name: &str) -> Option<(u64, u64, usize, usize)> {
    let rest = name.strip_prefix("layers.")?;
    let (l, rest) = rest.split_once(".ffn.experts.")?;
    let (e, rest) = rest.split_once('.')?;
    let (proj, kind) = rest.split_once('.')?;
    let (l, e): (u64, u64) = (l.parse().ok()?, e.parse().ok()?);
    let p = ["w1", "w3", "w2"].iter().position(|x| *x == proj)?;
    let k = ["weight", "scale"].iter().position(|x| *x == kind)?;
    (format!("layers.{l}.ffn.experts.{e}.{proj}.{kind}") == name).then_some((l, e, p, k))
}

/// Check the routed-expert inventory as the seed's `inspect_native_checkpoint` does: every
/// `layers.L.ffn.experts.E.w{1,3,2}.{weight,scale}` for the config's layers and experts, with
/// the MXFP4 shapes and dtypes, and no other routed-expert tensor. Memory and time are
/// bounded by the tensors present, whatever counts the config claims.
pub fn check_experts(source: &Source, cfg: &V4Config) -> Result<(), ViewError> {
    let mut present = std::collections::HashSet::new();
    for t in &source.tensors {
        let dtype = match t.dtype {
            crate::source::TensorDtype::Safetensors(d) => d,
            _ => return Err(err("the BF16 cache view needs a safetensors checkpoint")),
        };
        match routed_expert_name(&t.name) {
            Some((l, e, p, k)) if l < cfg.layers && e < cfg.experts => {
                let (n, kdim) = if p == 2 { (cfg.hidden, cfg.inter) } else { (cfg.inter, cfg.hidden) };
                let (shape, dtypes): (Vec<u64>, &[Dtype]) =
                    if k == 0 { (vec![n, kdim / 2], &[Dtype::I8, Dtype::U8]) } else { (vec![n, kdim / 32], &[Dtype::F8_E8M0]) };
                if t.shape != shape || !dtypes.contains(&dtype) {
                    return Err(err(format!("invalid native MXFP4 tensor {}: {:?}, {dtype:?}", t.name, t.shape)));
                }
                present.insert((l, e, p, k));
            }
            _ if t.name.contains(".experts.") && !t.name.starts_with("mtp.") => {
                return Err(err(format!("unexpected routed-expert tensor: {}", t.name)));
            }
            _ => {}
        }
    }
    let want = cfg.layers.saturating_mul(cfg.experts).saturating_mul(6);
    if present.len() as u64 != want {
        // Among the first present+1 expected names, one is absent.
        let mut expected = (0..cfg.layers).flat_map(|l| (0..cfg.experts).flat_map(move |e| (0..3).flat_map(move |p| (0..2).map(move |k| (l, e, p, k)))));
        if let Some((l, e, p, k)) = expected.by_ref().take(present.len() + 1).find(|x| !present.contains(x)) {
            let missing = format!("layers.{l}.ffn.experts.{e}.{}.{}", ["w1", "w3", "w2"][p], ["weight", "scale"][k]);
            return Err(err(format!("incomplete native MXFP4 checkpoint: {missing} is missing")));
        }
    }
    Ok(())
}

/// One tensor of the cache: where it comes from and what it becomes.
#[derive(Debug, Clone)]
struct Planned {
    target: String,
    source: usize,
    /// Index of the FP8 scale tensor, for FP8 weights.
    scale: Option<usize>,
    dtype: Dtype,
    shape: Vec<u64>,
    nbytes: u64,
}

/// The seed's `_expected_cache_inventory` (with its errors) plus where each tensor comes from.
fn plan(source: &Source, cfg: &V4Config) -> Result<Vec<Planned>, ViewError> {
    let by_name: HashMap<&str, usize> = source.tensors.iter().enumerate().map(|(i, t)| (t.name.as_str(), i)).collect();
    let dtype_of = |name: &str| -> Option<Dtype> {
        by_name.get(name).and_then(|&i| match source.tensors[i].dtype {
            crate::source::TensorDtype::Safetensors(d) => Some(d),
            _ => None,
        })
    };
    let mut out = Vec::new();
    let mut targets = std::collections::HashSet::new();
    for (i, t) in source.tensors.iter().enumerate() {
        let key = t.name.as_str();
        if key.starts_with("mtp.") || key.contains(".experts.") {
            continue;
        }
        if let Some(base) = key.strip_suffix(".scale") {
            if !dtype_of(&format!("{base}.weight")).is_some_and(is_fp8) {
                return Err(err(format!("orphan non-expert FP8 scale: {key}")));
            }
            continue;
        }
        let mut dtype = dtype_of(key).unwrap();
        let mut scale = None;
        if is_fp8(dtype) {
            let scale_key = format!("{}.scale", key.strip_suffix(".weight").unwrap_or(key));
            match dtype_of(&scale_key) {
                Some(Dtype::F8_E8M0) => {}
                None => return Err(err(format!("missing native FP8 scale: {key}"))),
                Some(other) => return Err(err(format!("native FP8 scale {scale_key} of {key} is {other:?}, expected F8_E8M0 (UE8M0 exponents)"))),
            }
            let si = by_name[scale_key.as_str()];
            let s = &source.tensors[si];
            let ok = t.shape.len() == 2
                && s.shape.len() == 2
                && s.shape[0] == t.shape[0].div_ceil(cfg.block[0] as u64)
                && s.shape[1] == t.shape[1].div_ceil(cfg.block[1] as u64);
            if !ok {
                return Err(err(format!("invalid V4 non-expert FP8 weight/scale shape: {key} {:?} with scale {:?}", t.shape, s.shape)));
            }
            scale = Some(si);
            dtype = Dtype::BF16;
        }
        if !matches!(dtype, Dtype::BF16 | Dtype::F32 | Dtype::I64) {
            return Err(err(format!("unsupported non-expert dtype {dtype:?}: {key}")));
        }
        let target = canonical_non_expert_key(key)?;
        if !targets.insert(target.clone()) {
            return Err(err(format!("duplicate converted key: {target}")));
        }
        let elements: u64 = t.shape.iter().product();
        out.push(Planned { target, source: i, scale, dtype, shape: t.shape.clone(), nbytes: elements * dtype.bitsize() as u64 / 8 });
    }
    Ok(out)
}

/// FP8 weight -> BF16, chunks of whole block rows, through the tiers (kept on disk too).
#[derive(Debug)]
struct Fp8Inner {
    name: String,
    weight: Arc<SourceFile>,
    weight_offset: u64,
    scale: Arc<SourceFile>,
    scale_offset: u64,
    scale_len: usize,
    geo: Fp8Blocks,
    rows_per_chunk: usize,
}

impl ChunkPlan for Fp8Inner {
    fn name(&self) -> &str {
        &self.name
    }

    fn chunk_len(&self, id: u64) -> u64 {
        let first = id as usize * self.rows_per_chunk;
        (self.rows_per_chunk.min(self.geo.rows - first) * self.geo.cols * 2) as u64
    }

    /// Chunk `id`: its FP8 rows and the block scales decoded to BF16, little-endian (the
    /// codec call of this view), straight into the chunk.
    fn compute(&self, id: u64) -> Result<Arc<[u8]>, ViewError> {
        let first = id as usize * self.rows_per_chunk;
        let rows = self.rows_per_chunk.min(self.geo.rows - first);
        // The FP8 rows go into a pooled buffer ([`super::scratch`]), not a new one per chunk.
        let n = rows * self.geo.cols;
        let mut scratch = Scratch::take_bytes(n);
        self.compute_from(first, rows, scratch.bytes(n))
    }
}

impl Fp8Inner {
    /// [`ChunkPlan::compute`] of the chunk of rows `first..first + rows`, read into `w`.
    fn compute_from(&self, first: usize, rows: usize, w: &mut [u8]) -> Result<Arc<[u8]>, ViewError> {
        debug_assert_eq!(w.len(), rows * self.geo.cols);
        self.weight.read_exact_at(w, self.weight_offset + (first * self.geo.cols) as u64)?;
        let w = &*w;
        let mut s = vec![0u8; self.scale_len];
        self.scale.read_exact_at(&mut s, self.scale_offset)?;
        let content = |e: crate::codec::CodecError| {
            let rule = match e {
                crate::codec::CodecError::BadScale { .. } => format!("non-finite or non-positive FP8 scales ({e})"),
                crate::codec::CodecError::NonFiniteWeight { .. } => format!("non-finite FP8 non-expert weight ({e})"),
                crate::codec::CodecError::Bf16Overflow { .. } => format!("FP8 non-expert weight overflows BF16 ({e})"),
                other => other.to_string(),
            };
            ViewError::Content { tensor: self.name.clone(), rule }
        };
        super::new_chunk(2 * w.len(), |bytes| {
            // The chunk's bytes as u16 where that is the little-endian layout (aligned, and
            // a little-endian target); else through a buffer, converted.
            match bytemuck::try_cast_slice_mut::<u8, u16>(bytes) {
                Ok(out) if cfg!(target_endian = "little") => self.geo.to_bf16_par(w, first, &s, out).map_err(content),
                _ => {
                    let mut out = vec![0u16; w.len()];
                    self.geo.to_bf16_par(w, first, &s, &mut out).map_err(content)?;
                    for (b, v) in bytes.chunks_exact_mut(2).zip(&out) {
                        b.copy_from_slice(&v.to_le_bytes());
                    }
                    Ok(())
                }
            }
        })
    }
}

/// A floating-point tensor served from the source after checking it is finite, through the
/// memory tier only (never the disk cache: the source is their durable copy): FUSE reads a
/// chunk in many small requests, and each must not re-read and re-check the whole chunk.
#[derive(Debug)]
struct CheckedInner {
    name: String,
    file: Arc<SourceFile>,
    offset: u64,
    nbytes: u64,
    dtype: Dtype,
    chunk_bytes: u64,
}

impl ChunkPlan for CheckedInner {
    fn name(&self) -> &str {
        &self.name
    }

    fn chunk_len(&self, id: u64) -> u64 {
        self.chunk_bytes.min(self.nbytes - id * self.chunk_bytes)
    }

    fn compute(&self, id: u64) -> Result<Arc<[u8]>, ViewError> {
        let start = id * self.chunk_bytes;
        let len = self.chunk_bytes.min(self.nbytes - start) as usize;
        super::new_chunk(len, |b| {
            self.file.read_exact_at(b, self.offset + start)?;
            let finite = match self.dtype {
                Dtype::BF16 => b.chunks_exact(2).all(|x| (u16::from_le_bytes([x[0], x[1]]) & 0x7F80) != 0x7F80),
                Dtype::F32 => b.chunks_exact(4).all(|x| f32::from_le_bytes([x[0], x[1], x[2], x[3]]).is_finite()),
                _ => true,
            };
            if !finite {
                return Err(ViewError::Content { tensor: self.name.clone(), rule: "non-finite source tensor".into() });
            }
            Ok(())
        })
    }
}

/// The safetensors header `save_file(tensors, metadata={"format": "pt"})` writes, and the
/// tensors in file order with their offsets.
pub fn safetensors_header(tensors: &[(String, Dtype, Vec<u64>, u64)]) -> Result<(Vec<u8>, Vec<usize>), ViewError> {
    let mut order: Vec<usize> = (0..tensors.len()).collect();
    order.sort_by(|&a, &b| tensors[b].1.cmp(&tensors[a].1).then(tensors[a].0.cmp(&tensors[b].0)));
    let mut offset = 0usize;
    let mut infos = Vec::with_capacity(tensors.len());
    for &i in &order {
        let (name, dtype, shape, nbytes) = &tensors[i];
        infos.push((
            name.clone(),
            StInfo { dtype: *dtype, shape: shape.iter().map(|&d| d as usize).collect(), data_offsets: (offset, offset + *nbytes as usize) },
        ));
        offset += *nbytes as usize;
    }
    let meta = Metadata::new(Some(HashMap::from([("format".to_string(), "pt".to_string())])), infos)
        .map_err(|e| ViewError::Internal(format!("safetensors header: {e}")))?;
    let mut header = serde_json::to_string(&meta).map_err(|e| ViewError::Internal(e.to_string()))?.into_bytes();
    header.resize(header.len().next_multiple_of(8), b' ');
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&header);
    Ok((out, order))
}

/// sha256 of the 8-byte length plus the JSON header, and the sampled payload digest, as
/// the seed's `_rawint4_shard_record` computes them (see shared/reference/deepseek-v4.md).
fn shard_record(file: &SourceFile, header_len: u64) -> Result<Value, ViewError> {
    let mut head = vec![0u8; 8 + header_len as usize];
    file.read_exact_at(&mut head, 0)?;
    let payload_start = 8 + header_len;
    let payload = file.size() - payload_start;
    let window = payload.min(64 << 10);
    let span = payload - window;
    let mut offsets: Vec<u64> = vec![payload_start];
    offsets.extend((0..8).map(|i| payload_start + span * i / 7));
    offsets.sort();
    let mut h = Sha256::new();
    let mut buf = vec![0u8; window as usize];
    for off in offsets {
        file.read_exact_at(&mut buf, off)?;
        h.update((off - payload_start).to_string().as_bytes());
        h.update(b"\0");
        h.update(&buf);
    }
    let id = file.identity();
    Ok(json!({
        "name": file.path().file_name().unwrap().to_string_lossy(),
        "size": file.size(),
        "header_sha256": digest::sha256_hex(&head),
        "sample_sha256": digest::hex(&h.finalize()),
        "file_identity": {"device": id.device, "inode": id.inode, "ctime_ns": id.ctime_ns as i64},
    }))
}

fn canonical_sha(v: &Value) -> String {
    digest::sha256_hex(pyjson::dumps(v, &Style::CANONICAL).as_bytes())
}

/// The BF16 cache view.
pub struct Bf16CacheView;

impl super::View for Bf16CacheView {
    fn name(&self) -> &'static str {
        VIEW
    }
    fn summary(&self) -> &'static str {
        "BF16 non-expert cache of a DeepSeek V4 / V4.1 checkpoint, as the third seed writes it"
    }
    fn is_default_for(&self, input: &super::Input) -> bool {
        matches!(input, super::Input::Checkpoint(s) if s.safetensors().is_some())
    }
    fn build(&self, input: &super::Input, _opts: &super::ViewOptions, ctx: &super::Context) -> Result<Tree, ViewError> {
        build(input.source(VIEW)?, ctx)
    }
    fn verify(&self, _built: &crate::view::Built, out: &std::path::Path, written: &HashMap<String, String>) -> Result<(), ViewError> {
        let Some(_) = written.get(MANIFEST_NAME) else { return Ok(()) };
        for f in super::derived::read_json(out, MANIFEST_NAME)?["files"].as_array().into_iter().flatten() {
            let file = f["name"].as_str().unwrap_or("");
            if f["sha256"].as_str() != written.get(file).map(String::as_str) {
                return Err(ViewError::Verify { file: MANIFEST_NAME.into(), rule: format!("{file} does not match its digest in {MANIFEST_NAME}") });
            }
        }
        Ok(())
    }
}

/// Build the view: plan (the seed's checks), the shards, the index, the manifest.
pub fn build(source: &Source, ctx: &super::Context) -> Result<Tree, ViewError> {
    let meta = source.safetensors().ok_or_else(|| err("the BF16 cache view needs a safetensors checkpoint"))?;
    let config = meta.config.as_ref().ok_or_else(|| err("config.json is missing"))?;
    let cfg = read_config(config)?;
    let index_path = meta.index_path.as_ref().ok_or_else(|| err(format!("native safetensors index {INDEX_NAME} is missing")))?;
    check_experts(source, &cfg)?;
    let planned = plan(source, &cfg)?;

    let mut tree = Tree::new();
    let (shards, weight_map) = shards(source, &cfg, &planned, &ctx.tiers)?;
    for (name, f) in &shards {
        tree.add_file_arc(ROOT_INO, name, f.clone());
    }
    let index_bytes = pyjson::dumps(&json!({"metadata": {}, "weight_map": Value::Object(weight_map)}), &Style::CANONICAL).into_bytes();
    let index_sha256 = digest::sha256_hex(&index_bytes);
    tree.add_file(ROOT_INO, INDEX_NAME, VirtualFile::from_bytes(index_bytes));
    let config_path = meta.config_path.as_ref().ok_or_else(|| err("config.json is missing"))?;
    let base = manifest_base(source, &planned, config_path, index_path, &index_sha256)?;
    tree.add_file(ROOT_INO, MANIFEST_NAME, manifest(source, base, &shards, &ctx.store).into_file());
    Ok(tree)
}

/// One `non-expert-NNN.safetensors` per source shard that contributes tensors (in sorted
/// order), and the index's weight map.
/// Files by name.
type NamedFiles = Vec<(String, Arc<VirtualFile>)>;

fn shards(source: &Source, cfg: &V4Config, planned: &[Planned], tiers: &Arc<Tiers>) -> Result<(NamedFiles, serde_json::Map<String, Value>), ViewError> {
    let file_keys = source_file_keys(&source.files);
    let mut by_file: BTreeMap<usize, Vec<&Planned>> = BTreeMap::new();
    for p in planned {
        by_file.entry(source.tensors[p.source].file).or_default().push(p);
    }
    let mut weight_map = serde_json::Map::new();
    let mut files = Vec::new();
    for (k, (_, list)) in by_file.iter().enumerate() {
        let name = format!("non-expert-{k:03}.safetensors");
        let specs: Vec<(String, Dtype, Vec<u64>, u64)> = list.iter().map(|p| (p.target.clone(), p.dtype, p.shape.clone(), p.nbytes)).collect();
        let (header, order) = safetensors_header(&specs)?;
        let mut f = VirtualFile::new();
        f.push(Extent::Bytes(header.into()));
        for &i in &order {
            let p = list[i];
            push_tensor(&mut f, source, cfg, p, tiers, &file_keys);
            weight_map.insert(p.target.clone(), Value::String(name.clone()));
        }
        files.push((name, Arc::new(f)));
    }
    Ok((files, weight_map))
}

/// The extents of one tensor: FP8 weights converted in chunks of block rows, BF16/F32
/// tensors checked for finiteness, I64 tensors as they are.
fn push_tensor(f: &mut VirtualFile, source: &Source, cfg: &V4Config, p: &Planned, tiers: &Arc<Tiers>, file_keys: &[String]) {
    let t = &source.tensors[p.source];
    let file = source.files[t.file].clone();
    let key = |kind: &str| KeyBuilder::new(VIEW).field("kind", kind).field("file", &file_keys[t.file]).field("tensor", &t.name).u64("offset", t.offset);
    if let Some(si) = p.scale {
        let s = &source.tensors[si];
        let geo = Fp8Blocks { rows: t.shape[0] as usize, cols: t.shape[1] as usize, block_rows: cfg.block[0], block_cols: cfg.block[1] };
        let target_chunk = (2usize << 20) / (geo.cols * 2).max(1);
        let rows_per_chunk = (target_chunk / geo.block_rows).max(1) * geo.block_rows;
        let key = key("fp8-bf16")
            .field("scale_file", &file_keys[s.file])
            .u64("scale_offset", s.offset)
            .u64("scale_len", s.nbytes)
            .u64("rows", geo.rows as u64)
            .u64("cols", geo.cols as u64)
            .u64("block_rows", geo.block_rows as u64)
            .u64("block_cols", geo.block_cols as u64)
            .u64("rows_per_chunk", rows_per_chunk as u64)
            .producer();
        let inner = Fp8Inner {
            name: t.name.clone(),
            weight: file,
            weight_offset: t.offset,
            scale: source.files[s.file].clone(),
            scale_offset: s.offset,
            scale_len: s.nbytes as usize,
            geo,
            rows_per_chunk,
        };
        let producer = Tiered::new(inner, tiers, key);
        for c in 0..geo.rows.div_ceil(rows_per_chunk) as u64 {
            f.push(producer.extent(c));
        }
    } else if p.dtype == Dtype::I64 {
        f.push(Extent::Source { file, offset: t.offset, len: t.nbytes });
    } else {
        let chunk_bytes = 4u64 << 20;
        let key = key("checked").u64("nbytes", t.nbytes).field("dtype", format!("{:?}", p.dtype)).u64("chunk_bytes", chunk_bytes).producer();
        let plan = CheckedInner { name: t.name.clone(), file, offset: t.offset, nbytes: t.nbytes, dtype: p.dtype, chunk_bytes };
        let producer = Tiered::memory_only(plan, tiers, key);
        for c in 0..t.nbytes.div_ceil(chunk_bytes) {
            f.push(producer.extent(c));
        }
    }
}

/// The manifest without its `files` (identity and fingerprint from headers and sampled
/// payload windows only, as the seed computes them).
fn manifest_base(
    source: &Source,
    planned: &[Planned],
    config_path: &std::path::Path,
    index_path: &std::path::Path,
    index_sha256: &str,
) -> Result<Value, ViewError> {
    let meta = source.safetensors().ok_or_else(|| err("the BF16 cache view needs a safetensors checkpoint"))?;
    let mut shard_records = Vec::new();
    for (f, h) in source.files.iter().zip(&meta.shards) {
        shard_records.push(shard_record(f, h.header_len)?);
    }
    let file_sha = |p: &std::path::Path| -> Result<String, ViewError> {
        let b = crate::source::read_small(p, 256 << 20).map_err(ViewError::Source)?;
        Ok(digest::sha256_hex(&b))
    };
    let identity = json!({"config_sha256": file_sha(config_path)?, "index_sha256": file_sha(index_path)?, "shards": shard_records});
    let fingerprint = canonical_sha(&identity);
    let tensors_json: serde_json::Map<String, Value> =
        planned.iter().map(|p| (p.target.clone(), json!({"shape": p.shape, "dtype": format!("{:?}", p.dtype)}))).collect();
    Ok(json!({
        "kind": KIND,
        "version": 1,
        "status": "ready",
        "source": {"model_name_or_path": meta.root.to_string_lossy(), "fingerprint": fingerprint, "identity": identity},
        "expert_weight_format": "mxfp4",
        "tensors": Value::Object(tensors_json),
        "index_sha256": index_sha256,
    }))
}

/// `kt_non_expert_manifest.json`: the base plus every shard's size and sha256, then the
/// fingerprint of the whole payload.
fn manifest(source: &Source, base: Value, shards: &[(String, Arc<VirtualFile>)], store: &DigestStore) -> Derived {
    let sizes: Vec<(String, u64)> = shards.iter().map(|(n, f)| (n.clone(), f.size())).collect();
    // The shards' bytes depend on the source files and on their headers (the plan).
    let mut params = Sha256::new();
    params.update(format!("{}:", crate::codec::REVISION).as_bytes());
    for (_, f) in shards {
        if let Some((_, Extent::Bytes(h))) = f.extents().next() {
            params.update(h);
        }
    }
    let key = DigestStore::view_key(VIEW, &digest::hex(&params.finalize()), &source.files);
    let inputs = shards.iter().map(|(_, f)| Input::whole(f)).collect();
    Derived::new(MANIFEST_NAME, store, key, inputs, move |hashes| {
        let mut payload = base.clone();
        payload["files"] = Value::Array(sizes.iter().zip(hashes).map(|((n, size), h)| json!({"name": n, "size": size, "sha256": h})).collect());
        let fp = canonical_sha(&payload);
        payload["fingerprint"] = Value::String(fp);
        pyjson::dumps(&payload, &Style::CANONICAL).into_bytes()
    })
}
