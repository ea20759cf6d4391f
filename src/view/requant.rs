//! Requantised expert shards (MXFP4 -> IQ2_XXS / Q2_K / Q8_0), as the fourth seed
//! (`v41_quant_experts.py`, `plan` + `convert`) writes them: `plan.json`, one
//! `quant-NNNNN-of-NNNNN.safetensors` per source shard that keeps any tensor, and for each
//! shard its `.manifest.json` and `.complete` marker.
//!
//! Roles as the seed assigns them: Engram tensors are external (listed, not copied),
//! expert `.scale` tensors are dropped, main-layer routed expert weights are decoded from
//! MXFP4 and requantised on read with the recipe (unit importance, passed to both
//! quantisers as the seed does), everything else is preserved byte for byte. Shard headers
//! are the seed's compact JSON in (source offset, name) order, padded with spaces.
//!
//! Quantised tensors are computed in chunks of whole rows through the tiers (memory, the
//! disk cache, the compute pool), each chunk in parallel over rows on the pool; a read
//! prefetches the chunks that follow it in the shard (`VirtualFile`'s read-ahead, 4 MiB,
//! across tensors). A chunk's disk-cache key holds everything its bytes depend on: the identity of the weight and scale files, the tensor, offsets, shape, ggml type,
//! chunking and importance row (so another recipe never meets old entries). Manifests
//! hold every tensor's sha256: their sizes are known up front, their bytes are computed on
//! first read (through this view) and remembered in the digest store.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::{Map, Value, json};

use super::Tiers;
use super::derived::{Derived, Input};
use super::imatrix::Imatrix;
use super::tiered::{ChunkPlan, Tiered};
use super::{Extent, ROOT_INO, Tree, ViewError, VirtualFile};
use crate::codec::{self, QuantType, mxfp4};
use crate::digest::{self, DigestStore};
use crate::pyjson::{self, Style};
use crate::source::{Source, SourceFile, TensorInfo};
use crate::store::KeyBuilder;
use crate::store::disk::source_file_keys;
use crate::util::args::InvalidValue;

const VIEW: &str = "requant";
pub const SOURCE_REVISION: &str = "2bc89ac599031fa673cab993f1df02fc4a98c673";
pub const EXTERNAL_ROLE: &str = "engram-native";

fn err(rule: impl Into<String>) -> ViewError {
    ViewError::Layout { view: VIEW, rule: rule.into() }
}

/// A recipe's type: the fourth seed's (IQ2_XXS, Q2_K, Q8_0). Other types xpackfs quantises
/// to are for the GGUF output view; the requant view's shards and manifest are the seed's,
/// and the seed writes only these.
fn recipe_type(name: &str) -> Result<QuantType, InvalidValue> {
    match QuantType::from_name(name) {
        Some(t @ (QuantType::Iq2Xxs | QuantType::Q2K | QuantType::Q8_0)) => Ok(t),
        _ => Err(InvalidValue::given(name, "is not a type the requant view writes: IQ2_XXS, Q2_K or Q8_0")),
    }
}

/// The recipe (`-o w1=...,w2=...,w3=...,imatrix=...`).
#[derive(Debug, Clone, clap::Args)]
#[group(id = "requant")]
pub struct Options {
    /// ggml type for the gate (w1) experts: IQ2_XXS, Q2_K or Q8_0
    #[arg(long, default_value = "IQ2_XXS", value_parser = recipe_type, help_heading = "Requant")]
    pub w1: QuantType,
    /// ggml type for the down (w2) experts
    #[arg(long, default_value = "Q2_K", value_parser = recipe_type, help_heading = "Requant")]
    pub w2: QuantType,
    /// ggml type for the up (w3) experts
    #[arg(long, default_value = "IQ2_XXS", value_parser = recipe_type, help_heading = "Requant")]
    pub w3: QuantType,
    /// llama.cpp importance matrix (GGUF or legacy imatrix.dat): requant: instead of the seed's
    /// unit importance; gguf: as llama-quantize --imatrix FILE
    #[arg(long, value_name = "FILE", help_heading = "Requant")]
    pub imatrix: Option<PathBuf>,
}

impl Default for Options {
    fn default() -> Self {
        super::ViewOptions::default().requant
    }
}

/// The requantised-shards view.
pub struct RequantView;

impl super::View for RequantView {
    fn name(&self) -> &'static str {
        VIEW
    }
    fn summary(&self) -> &'static str {
        "DeepSeek V4.1 routed experts requantised to IQ2_XXS / Q2_K / Q8_0 shards, as the fourth seed writes them"
    }
    fn build(&self, input: &super::Input, opts: &super::ViewOptions, ctx: &super::Context) -> Result<Tree, ViewError> {
        build(input.source(VIEW)?, &opts.requant, ctx)
    }
    fn verify(&self, _built: &crate::view::Built, out: &std::path::Path, written: &HashMap<String, String>) -> Result<(), ViewError> {
        for name in written.keys() {
            if let Some(shard) = name.strip_suffix(".manifest.json") {
                let m = super::derived::read_json(out, name)?;
                if m["output_shard"].as_str() == Some(shard) {
                    verify_shard(out, shard, &m)?;
                }
            }
        }
        Ok(())
    }
}

impl Options {
    fn for_proj(&self, p: &str) -> Option<QuantType> {
        match p {
            "w1" => Some(self.w1),
            "w2" => Some(self.w2),
            "w3" => Some(self.w3),
            _ => None,
        }
    }
}

pub fn is_external(name: &str) -> bool {
    name.contains(".engram.") || name.starts_with("engram.")
}

pub fn is_main_routed_expert(name: &str) -> bool {
    name.starts_with("layers.") && name.contains(".ffn.experts.") && !name.contains("shared_experts") && name.ends_with(".weight")
}

pub fn is_expert_scale(name: &str) -> bool {
    name.starts_with("layers.")
        && name.contains(".ffn.experts.")
        && !name.contains("shared_experts")
        && name.strip_suffix(".scale").is_some_and(|b| b.ends_with("w1") || b.ends_with("w2") || b.ends_with("w3"))
}

fn expert_projection(name: &str) -> &str {
    name.rsplit('.').nth(1).unwrap_or("")
}

#[derive(Debug, Clone)]
struct Planned {
    tensor: usize,
    role: &'static str,
    qtype: Option<QuantType>,
    scale: Option<usize>,
    out_shape: Vec<u64>,
    out_bytes: u64,
    out_offset: u64,
}

fn st_dtype(t: &TensorInfo) -> String {
    t.dtype.name()
}

/// Quantised expert weight, computed in row chunks through the tiers (memory, disk cache,
/// compute pool).
struct QuantInner {
    name: String,
    weight: Arc<SourceFile>,
    weight_offset: u64,
    scale: Arc<SourceFile>,
    scale_offset: u64,
    rows: usize,
    k: usize,
    qtype: QuantType,
    rows_per_chunk: usize,
    out_row_bytes: usize,
    /// Importance row for this tensor (the seed's unit vector when no imatrix is given).
    importance: Arc<Vec<f32>>,
}

impl QuantInner {
    fn chunks(&self) -> u64 {
        self.rows.div_ceil(self.rows_per_chunk) as u64
    }
}

impl ChunkPlan for QuantInner {
    fn name(&self) -> &str {
        &self.name
    }

    fn chunk_len(&self, id: u64) -> u64 {
        let first = id as usize * self.rows_per_chunk;
        (self.rows_per_chunk.min(self.rows - first) * self.out_row_bytes) as u64
    }

    /// Chunk `id`: its MXFP4 rows decoded and requantised (the codec calls of this view).
    fn compute(&self, id: u64) -> Result<Arc<[u8]>, ViewError> {
        let first = id as usize * self.rows_per_chunk;
        let rows = self.rows_per_chunk.min(self.rows - first);
        let mut packed = vec![0u8; rows * self.k / 2];
        self.weight.read_exact_at(&mut packed, self.weight_offset + (first * self.k / 2) as u64)?;
        let mut scales = vec![0u8; rows * self.k / 32];
        self.scale.read_exact_at(&mut scales, self.scale_offset + (first * self.k / 32) as u64)?;
        let mut x = vec![0f32; rows * self.k];
        let content = |rule: String| ViewError::Content { tensor: self.name.clone(), rule };
        mxfp4::dequantize_deepseek_par(&packed, &scales, self.k, &mut x).map_err(|e| match e {
            codec::CodecError::E8m0Nan { index } => {
                content(format!("MXFP4 scale byte 255 (E8M0 NaN) at row {}, block {}", first + index / (self.k / 32), index % (self.k / 32)))
            }
            other => ViewError::Codec { tensor: self.name.clone(), source: other },
        })?;
        super::new_chunk(rows * self.out_row_bytes, |out| {
            codec::quantize_rows_par(self.qtype, &x, self.k, Some(&self.importance), out).map_err(|e| ViewError::Codec { tensor: self.name.clone(), source: e })
        })
    }
}

/// The seed's `safetensors_header`: compact JSON in insertion order, space padded.
fn seed_header(entries: &Map<String, Value>) -> Vec<u8> {
    let payload = pyjson::dumps(&Value::Object(entries.clone()), &Style::COMPACT).into_bytes();
    let pad = (8 - (8 + payload.len()) % 8) % 8;
    let mut out = ((payload.len() + pad) as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&payload);
    out.extend(std::iter::repeat_n(b' ', pad));
    out
}

/// `json.dumps(v, indent=1)` (insertion order, ASCII-escaped) + "\n".
fn indent1(v: &Value) -> Vec<u8> {
    let style = Style { indent: Some(1), sort_keys: false, ensure_ascii: true, item_sep: ",", key_sep: ": " };
    let mut s = pyjson::dumps(v, &style);
    s.push('\n');
    s.into_bytes()
}

/// Roles in index order (the seed walks weight_map), with each quantised weight's scale.
fn plan(source: &Source, weight_map: &Map<String, Value>, recipe: &Options) -> Result<Vec<Planned>, ViewError> {
    let by_name: HashMap<&str, usize> = source.tensors.iter().enumerate().map(|(i, t)| (t.name.as_str(), i)).collect();
    let mut planned: Vec<Planned> = Vec::new();
    for name in weight_map.keys() {
        let ti = *by_name.get(name.as_str()).ok_or_else(|| err(format!("index names {name}, which no shard holds")))?;
        let t = &source.tensors[ti];
        let (role, qtype, out_shape, out_bytes) = if is_external(name) {
            (EXTERNAL_ROLE, None, vec![], 0)
        } else if is_expert_scale(name) {
            ("dropped-expert-scale", None, vec![], 0)
        } else if is_main_routed_expert(name) {
            let proj = expert_projection(name);
            let q = recipe.for_proj(proj).ok_or_else(|| err(format!("{name}: no recipe entry for projection {proj:?}")))?;
            if t.shape.len() != 2 {
                return Err(err(format!("{name}: expected a 2-D packed MXFP4 weight, shape {:?}", t.shape)));
            }
            let g = q.ggml();
            let k = t.shape[1] * 2;
            if k == 0 {
                return Err(err(format!("{name}: rows of 0 values")));
            }
            if !k.is_multiple_of(g.block_size) {
                return Err(err(format!("{name}: {k} is not a multiple of {}", g.block_size)));
            }
            let shape = vec![t.shape[0], k / g.block_size * g.type_size];
            let bytes = shape[0] * shape[1];
            ("quantised", Some(q), shape, bytes)
        } else {
            ("preserved", None, t.shape.clone(), t.nbytes)
        };
        planned.push(Planned { tensor: ti, role, qtype, scale: None, out_shape, out_bytes, out_offset: 0 });
    }
    // Scales of quantised weights: matching dropped scale, MXFP4 shape rules.
    let scales: HashMap<String, usize> = planned
        .iter()
        .filter(|p| p.role == "dropped-expert-scale")
        .filter_map(|p| Some((source.tensors[p.tensor].name.strip_suffix(".scale")?.to_string(), p.tensor)))
        .collect();
    for p in planned.iter_mut().filter(|p| p.role == "quantised") {
        let t = &source.tensors[p.tensor];
        let key = t.name.strip_suffix(".weight").unwrap_or(&t.name);
        let si = *scales.get(key).ok_or_else(|| err(format!("{}: no matching MXFP4 scale tensor", t.name)))?;
        let s = &source.tensors[si];
        if s.shape.len() != 2 || s.shape[0] != t.shape[0] || s.shape[1] * 32 != t.shape[1] * 2 {
            return Err(err(format!("{}: packing mismatch: weight {:?} vs scale {:?} (MXFP4 needs [N, K/2] and [N, K/32])", t.name, t.shape, s.shape)));
        }
        if !matches!(st_dtype(t).as_str(), "I8" | "U8") || st_dtype(s) != "F8_E8M0" {
            return Err(err(format!("{}: MXFP4 needs I8/U8 weights and F8_E8M0 scales, got {} and {}", t.name, st_dtype(t), st_dtype(s))));
        }
        p.scale = Some(si);
    }
    check_expert_shapes(source, &planned)?;
    check_expert_coverage(source, &planned)?;
    Ok(planned)
}

/// Every layer that has routed experts has all of them, for every projection it has:
/// indices are canonical decimal numbers within the caps, and each projection of a layer
/// covers experts 0..n, where n is the expert count of the checkpoint (the largest index
/// plus one).
fn check_expert_coverage(source: &Source, planned: &[Planned]) -> Result<(), ViewError> {
    let mut seen: BTreeMap<u64, BTreeMap<String, std::collections::BTreeSet<u64>>> = BTreeMap::new();
    let mut count = 0;
    for p in planned.iter().filter(|p| p.role == "quantised") {
        let name = &source.tensors[p.tensor].name;
        // layers.L.ffn.experts.E.wN.weight
        let parts: Vec<&str> = name.split('.').collect();
        let [_, layer, _, _, expert, proj, _] = parts[..] else {
            return Err(err(format!("{name}: a routed expert must be named layers.L.ffn.experts.E.wN.weight")));
        };
        let layer = super::name_index(name, "layer", layer, super::MAX_LAYER_INDEX).map_err(|e| err(e.to_string()))?;
        let e = super::name_index(name, "expert", expert, super::MAX_EXPERTS - 1).map_err(|e| err(e.to_string()))?;
        count = count.max(e + 1);
        seen.entry(layer).or_default().entry(proj.to_string()).or_default().insert(e);
    }
    for (layer, projs) in &seen {
        for (proj, experts) in projs {
            if experts.len() as u64 != count {
                let missing: Vec<String> = (0..count).filter(|e| !experts.contains(e)).take(8).map(|e| e.to_string()).collect();
                return Err(err(format!(
                    "layer {layer} has no {proj} projection for routed expert(s) {} (every layer with routed experts needs experts 0..{count})",
                    missing.join(", ")
                )));
            }
        }
    }
    Ok(())
}

/// Every routed expert of a projection has one shape, and the down projection (w2,
/// [hidden, inter/2]) fits the gate and up ones (w1/w3, [inter, hidden/2]).
fn check_expert_shapes(source: &Source, planned: &[Planned]) -> Result<(), ViewError> {
    let mut first: HashMap<&str, &TensorInfo> = HashMap::new();
    for p in planned.iter().filter(|p| p.role == "quantised") {
        let t = &source.tensors[p.tensor];
        let proj = expert_projection(&t.name);
        match first.get(proj) {
            Some(f) if f.shape != t.shape => {
                return Err(err(format!("{}: shape {:?}, but {} of the same projection has {:?}", t.name, t.shape, f.name, f.shape)));
            }
            Some(_) => {}
            None => {
                first.insert(proj, t);
            }
        }
    }
    let (Some(down), up_or_gate) = (first.get("w2"), first.get("w1").or_else(|| first.get("w3"))) else { return Ok(()) };
    if let Some(g) = up_or_gate {
        let fits = g.shape.len() == 2 && down.shape.len() == 2 && down.shape[0] == g.shape[1] * 2 && down.shape[1] * 2 == g.shape[0];
        if !fits {
            return Err(err(format!(
                "{}: shape {:?} does not fit {} {:?} (down is [hidden, inter/2] where gate and up are [inter, hidden/2])",
                down.name, down.shape, g.name, g.shape
            )));
        }
    }
    if let (Some(w1), Some(w3)) = (first.get("w1"), first.get("w3"))
        && w1.shape != w3.shape
    {
        return Err(err(format!("{}: shape {:?}, but {} has {:?} (gate and up must match)", w3.name, w3.shape, w1.name, w1.shape)));
    }
    Ok(())
}

/// The importance row of every quantised tensor (all checked at mount), which imatrix
/// entry and row it came from, and what the disk cache keys it by ("unit", or the sha256 of
/// the row's f32 bytes).
type Importance = HashMap<usize, (Arc<Vec<f32>>, Option<String>, String)>;

fn importance_rows(source: &Source, planned: &[Planned], imatrix: Option<&Imatrix>) -> Result<Importance, ViewError> {
    let mut rows = HashMap::new();
    // One unit row per row length (a full checkpoint has tens of thousands of tensors).
    let mut unit: HashMap<usize, Arc<Vec<f32>>> = HashMap::new();
    for p in planned.iter().filter(|p| p.role == "quantised") {
        let t = &source.tensors[p.tensor];
        let k = (t.shape[1] * 2) as usize;
        let row = match imatrix {
            None => (unit.entry(k).or_insert_with(|| Arc::new(vec![1.0f32; k])).clone(), None, "unit".to_string()),
            Some(m) => {
                let (entry, r) = m.locate(&t.name, k).map_err(|why| err(format!("imatrix {}: {why}", m.path.display())))?;
                let row = m.row(&t.name, k)?;
                let key = digest::sha256_hex(&row.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>());
                (Arc::new(row), Some(format!("{entry}[{r}]")), key)
            }
        };
        rows.insert(p.tensor, row);
    }
    Ok(rows)
}

/// Build the view: plan, importance, then per output shard its file, manifest and marker,
/// then `plan.json`.
pub fn build(source: &Source, recipe: &Options, ctx: &super::Context) -> Result<Tree, ViewError> {
    let meta = source.safetensors().ok_or_else(|| err("the requantised-shards view needs a safetensors checkpoint"))?;
    let index_path = meta.index_path.as_ref().ok_or_else(|| err("model.safetensors.index.json is missing"))?;
    let text = crate::source::read_small(index_path, 256 << 20).map_err(|e| err(e.to_string()))?;
    let index: Value = serde_json::from_slice(&text).map_err(|e| err(format!("{}: {e}", index_path.display())))?;
    let weight_map = index["weight_map"].as_object().ok_or_else(|| err("index has no weight_map"))?;
    let mut planned = plan(source, weight_map, recipe)?;
    let imatrix = match &recipe.imatrix {
        Some(p) => Some(Imatrix::open(p)?),
        None => None,
    };
    let importance = match &imatrix {
        None => "unit (no imatrix; no activation calibration)".to_string(),
        Some(m) => m.describe(),
    };
    let rows = importance_rows(source, &planned, imatrix.as_ref())?;
    let recipe_json = json!({"w1": recipe.w1.ggml().name, "w2": recipe.w2.ggml().name, "w3": recipe.w3.ggml().name});

    // Output shards mirror the source shards that keep anything, sorted by name.
    let shard_name = |t: &TensorInfo| meta.shards[t.file].name.clone();
    let mut by_shard: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for (i, p) in planned.iter().enumerate() {
        if p.role == "preserved" || p.role == "quantised" {
            by_shard.entry(shard_name(&source.tensors[p.tensor])).or_default().push(i);
        }
    }
    let n_out = by_shard.len();
    let file_keys = source_file_keys(&source.files);
    let mut tree = Tree::new();
    let mut plan_shards = Vec::new();
    for (i, (shard, members)) in by_shard.iter().enumerate() {
        let out_name = format!("quant-{:05}-of-{:05}.safetensors", i + 1, n_out);
        let shard_plan = Shard { source, planned: &mut planned, members: members.clone(), rows: &rows, tiers: &ctx.tiers, file_keys: &file_keys };
        let (f, members, data_bytes) = shard_plan.file();
        let f = Arc::new(f);
        tree.add_file_arc(ROOT_INO, &out_name, f.clone());
        let context = ShardManifest { out_name: &out_name, shard, recipe_json: &recipe_json, importance: &importance, data_bytes };
        let manifest = context.manifest(source, &planned, &members, &f, &rows, &ctx.store);
        tree.add_file(ROOT_INO, &format!("{out_name}.manifest.json"), manifest.into_file());
        tree.add_file(ROOT_INO, &format!("{out_name}.complete"), VirtualFile::from_bytes(format!("{shard} {} {}\n", f.size(), members.len()).into_bytes()));
        plan_shards.push(json!({
            "source_shard": shard, "output_shard": out_name, "data_bytes": data_bytes,
            "tensors": members.iter().map(|&m| tensor_json(source, &planned[m], &out_name)).collect::<Vec<_>>(),
        }));
    }
    let plan = plan_json(source, weight_map.len(), &planned, &recipe_json, &importance, plan_shards);
    tree.add_file(ROOT_INO, "plan.json", VirtualFile::from_bytes(indent1(&plan)));
    Ok(tree)
}

/// One planned tensor as the seed's plan records it.
fn tensor_json(source: &Source, p: &Planned, out_shard: &str) -> Value {
    let t = &source.tensors[p.tensor];
    let (shard, data_start) = match source.safetensors() {
        Some(meta) => (meta.shards[t.file].name.clone(), 8 + meta.shards[t.file].header_len),
        None => (String::new(), 0),
    };
    json!({
        "name": t.name, "shard": shard, "dtype": st_dtype(t), "shape": t.shape,
        "begin": t.offset - data_start, "end": t.offset - data_start + t.nbytes, "data_start": data_start,
        "role": p.role, "out_shard": out_shard, "out_offset": p.out_offset,
        "out_dtype": match p.role { "quantised" => "U8".to_string(), "preserved" => st_dtype(t), _ => String::new() },
        "out_shape": p.out_shape, "out_bytes": p.out_bytes,
        "ggml_type": p.qtype.map(|q| q.ggml().name),
    })
}

/// `plan.json`: the roles, totals and shards.
fn plan_json(source: &Source, source_tensors: usize, planned: &[Planned], recipe_json: &Value, importance: &str, shards: Vec<Value>) -> Value {
    let of_role = |role: &'static str| planned.iter().filter(move |p| p.role == role);
    let sum = |role: &'static str, f: &dyn Fn(&Planned) -> u64| of_role(role).map(f).sum::<u64>();
    let root = source.safetensors().map(|m| m.root.to_string_lossy().into_owned()).unwrap_or_default();
    json!({
        "source_dir": root,
        "source_revision": SOURCE_REVISION,
        "recipe": recipe_json,
        "importance": importance,
        "external": of_role(EXTERNAL_ROLE).map(|p| tensor_json(source, p, "")).collect::<Vec<_>>(),
        "dropped": of_role("dropped-expert-scale").map(|p| tensor_json(source, p, "")).collect::<Vec<_>>(),
        "totals": {
            "source_tensors": source_tensors,
            "preserved": of_role("preserved").count(),
            "quantised": of_role("quantised").count(),
            "dropped_expert_scales": of_role("dropped-expert-scale").count(),
            "external_native": of_role(EXTERNAL_ROLE).count(),
            "quantised_logical_weights": sum("quantised", &|p| source.tensors[p.tensor].shape[0] * source.tensors[p.tensor].shape[1] * 2),
            "preserved_bytes": sum("preserved", &|p| p.out_bytes),
            "quantised_bytes": sum("quantised", &|p| p.out_bytes),
            "external_bytes": sum(EXTERNAL_ROLE, &|p| source.tensors[p.tensor].nbytes),
            "dropped_bytes": sum("dropped-expert-scale", &|p| source.tensors[p.tensor].nbytes),
            "output_bytes": sum("preserved", &|p| p.out_bytes) + sum("quantised", &|p| p.out_bytes),
        },
        "shards": shards,
    })
}

/// One output shard being laid out.
struct Shard<'a> {
    source: &'a Source,
    planned: &'a mut [Planned],
    members: Vec<usize>,
    rows: &'a Importance,
    tiers: &'a Arc<Tiers>,
    file_keys: &'a [String],
}

impl Shard<'_> {
    /// The shard file (the seed's header, then each tensor at its output offset, in source
    /// offset order), its members in that order and its data bytes.
    fn file(self) -> (VirtualFile, Vec<usize>, u64) {
        let Shard { source, planned, mut members, rows, tiers, file_keys } = self;
        members.sort_by(|&a, &b| {
            let (ta, tb) = (&source.tensors[planned[a].tensor], &source.tensors[planned[b].tensor]);
            ta.offset.cmp(&tb.offset).then(ta.name.cmp(&tb.name))
        });
        let mut offset = 0;
        for &m in &members {
            planned[m].out_offset = offset;
            offset += planned[m].out_bytes;
        }
        let mut entries = Map::new();
        for &m in &members {
            let p = &planned[m];
            let t = &source.tensors[p.tensor];
            let dtype = if p.role == "quantised" { "U8".to_string() } else { st_dtype(t) };
            entries.insert(t.name.clone(), json!({"dtype": dtype, "shape": p.out_shape, "data_offsets": [p.out_offset, p.out_offset + p.out_bytes]}));
        }
        let mut f = VirtualFile::new();
        f.push(Extent::Bytes(seed_header(&entries).into()));
        for &m in &members {
            let p = &planned[m];
            let t = &source.tensors[p.tensor];
            match (p.qtype, p.scale) {
                (Some(q), Some(si)) => {
                    let s = &source.tensors[si];
                    let out_row_bytes = p.out_shape[1] as usize;
                    let rows_per_chunk = ((1usize << 20) / out_row_bytes.max(1)).clamp(16, 4096) / 16 * 16;
                    let (importance, importance_key) = rows.get(&p.tensor).map(|r| (r.0.clone(), r.2.clone())).unwrap_or_default();
                    let (n, k) = (t.shape[0] as usize, (t.shape[1] * 2) as usize);
                    let key = KeyBuilder::new(VIEW)
                        .field("weight_file", &file_keys[t.file])
                        .field("scale_file", &file_keys[s.file])
                        .field("tensor", &t.name)
                        .u64("weight_offset", t.offset)
                        .u64("scale_offset", s.offset)
                        .u64("rows", n as u64)
                        .u64("k", k as u64)
                        .field("ggml_type", q.ggml().name)
                        .u64("rows_per_chunk", rows_per_chunk as u64)
                        .u64("out_row_bytes", out_row_bytes as u64)
                        .field("importance", &importance_key)
                        .producer();
                    let inner = QuantInner {
                        name: t.name.clone(),
                        weight: source.files[t.file].clone(),
                        weight_offset: t.offset,
                        scale: source.files[s.file].clone(),
                        scale_offset: s.offset,
                        rows: n,
                        k,
                        qtype: q,
                        rows_per_chunk,
                        out_row_bytes,
                        importance,
                    };
                    let chunks = inner.chunks();
                    let producer = Tiered::new(inner, tiers, key);
                    for c in 0..chunks {
                        f.push(producer.extent(c));
                    }
                }
                _ => f.push(Extent::Source { file: source.files[t.file].clone(), offset: t.offset, len: t.nbytes }),
            }
        }
        (f, members, offset)
    }
}

/// What a shard's manifest records besides its tensors.
struct ShardManifest<'a> {
    out_name: &'a str,
    shard: &'a str,
    recipe_json: &'a Value,
    importance: &'a str,
    data_bytes: u64,
}

impl ShardManifest<'_> {
    /// `<shard>.manifest.json`: every tensor's source and output sha256.
    fn manifest(&self, source: &Source, planned: &[Planned], members: &[usize], f: &Arc<VirtualFile>, rows: &Importance, store: &DigestStore) -> Derived {
        let header_len = f.extents().next().map(|(_, e)| e.len()).unwrap_or(0);
        let mut inputs = Vec::new();
        let mut names = Vec::new();
        let mut importance_rows: HashMap<String, String> = HashMap::new();
        for &m in members {
            let p = &planned[m];
            let t = &source.tensors[p.tensor];
            inputs.push(Input::Source { file: source.files[t.file].clone(), offset: t.offset, len: t.nbytes });
            inputs.push(Input::View { file: f.clone(), offset: header_len + p.out_offset, len: p.out_bytes });
            names.push((t.name.clone(), t.nbytes, p.out_bytes));
            if let Some((_, Some(src_row), _)) = rows.get(&p.tensor) {
                importance_rows.insert(t.name.clone(), src_row.clone());
            }
        }
        let (out_name, shard, recipe_json, importance, data_bytes) =
            (self.out_name.to_string(), self.shard.to_string(), self.recipe_json.clone(), self.importance.to_string(), self.data_bytes);
        let file_bytes = f.size();
        let params =
            format!("{}:{out_name}:{recipe_json}:{importance}:{}", crate::codec::REVISION, digest::sha256_hex(&serde_json::to_vec(&names).unwrap_or_default()));
        let key = DigestStore::view_key(VIEW, &params, &source.files);
        Derived::new(format!("{out_name}.manifest.json"), store, key, inputs, move |hashes| {
            let tensors: Vec<Value> = names
                .iter()
                .zip(hashes.chunks(2))
                .map(|((n, sb, ob), h)| {
                    let mut v = json!({"name": n, "source_bytes": sb, "source_sha256": h[0], "output_bytes": ob, "output_sha256": h[1]});
                    if let Some(r) = importance_rows.get(n) {
                        v["importance_row"] = Value::String(r.clone()); // only with an imatrix (beyond the seed)
                    }
                    v
                })
                .collect();
            indent1(&json!({
                "output_shard": out_name, "source_shard": shard, "source_revision": SOURCE_REVISION,
                "recipe": recipe_json, "importance": importance, "data_bytes": data_bytes, "file_bytes": file_bytes,
                "tensors": tensors,
            }))
        })
    }
}

/// `materialize --verify` of one written shard against its manifest and `.complete` marker:
/// every tensor's bytes (located by the shard's own safetensors header) hash to the
/// manifest's `output_sha256`.
fn verify_shard(out: &Path, shard: &str, m: &Value) -> Result<(), ViewError> {
    use std::os::unix::fs::FileExt;
    let refuse = |rule: String| ViewError::Verify { file: shard.to_string(), rule };
    let path = out.join(shard);
    let io = |e: std::io::Error| refuse(format!("{}: {e}", path.display()));
    let f = std::fs::File::open(&path).map_err(io)?;
    let size = f.metadata().map_err(io)?.len();
    if m["file_bytes"].as_u64() != Some(size) {
        return Err(refuse(format!("{size} bytes, the manifest says {}", m["file_bytes"])));
    }
    let mut len8 = [0u8; 8];
    f.read_exact_at(&mut len8, 0).map_err(io)?;
    let hlen = u64::from_le_bytes(len8);
    if hlen > size.saturating_sub(8) || hlen > 100 << 20 {
        return Err(refuse(format!("header length {hlen} exceeds the file")));
    }
    let mut hb = vec![0u8; hlen as usize];
    f.read_exact_at(&mut hb, 8).map_err(io)?;
    let header: Value = serde_json::from_slice(&hb).map_err(|e| refuse(format!("header is not JSON: {e}")))?;
    let tensors = m["tensors"].as_array().ok_or_else(|| refuse("manifest has no tensors".into()))?;
    for t in tensors {
        let tname = t["name"].as_str().unwrap_or("");
        let offs = &header[tname]["data_offsets"];
        let (Some(a), Some(b)) = (offs[0].as_u64(), offs[1].as_u64()) else {
            return Err(refuse(format!("tensor {tname} of the manifest is not in the shard")));
        };
        if b < a || Some(b - a) != t["output_bytes"].as_u64() || 8 + hlen + b > size {
            return Err(refuse(format!("tensor {tname} has data_offsets [{a}, {b}], the manifest says {} bytes", t["output_bytes"])));
        }
        let got = hash_file_range(&f, 8 + hlen + a, b - a).map_err(io)?;
        if Some(got.as_str()) != t["output_sha256"].as_str() {
            return Err(refuse(format!("tensor {tname} hashes to {got}, the manifest says {}", t["output_sha256"])));
        }
    }
    let marker = out.join(format!("{shard}.complete"));
    let text = std::fs::read_to_string(&marker).map_err(|e| refuse(format!("{}: {e}", marker.display())))?;
    let fields: Vec<&str> = text.split_whitespace().collect();
    if fields.len() != 3 || fields[1] != size.to_string() || fields[2] != tensors.len().to_string() {
        return Err(refuse(format!("{} says {:?}, expected {size} bytes and {} tensors", marker.display(), text.trim(), tensors.len())));
    }
    Ok(())
}

/// sha256 of `len` bytes at `offset` of a written file.
fn hash_file_range(f: &std::fs::File, offset: u64, len: u64) -> std::io::Result<String> {
    use sha2::{Digest, Sha256};
    use std::os::unix::fs::FileExt;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; len.min(8 << 20) as usize];
    let mut done = 0;
    while done < len {
        let n = (len - done).min(buf.len() as u64) as usize;
        f.read_exact_at(&mut buf[..n], offset + done)?;
        h.update(&buf[..n]);
        done += n as u64;
    }
    Ok(digest::hex(&h.finalize()))
}
