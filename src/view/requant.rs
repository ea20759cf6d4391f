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
//! Quantised tensors are computed in chunks of whole rows through the chunk cache, each
//! chunk in parallel over rows (rayon); reading chunk i prefetches chunk i+1. Manifests
//! hold every tensor's sha256: their sizes are known up front, their bytes are computed on
//! first read (through this view) and remembered in the digest store.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use serde_json::{json, Map, Value};

use super::{ChunkSource, Extent, Tree, ViewError, VirtualFile, ROOT_INO};
use crate::view::cache::ChunkCache;
use crate::codec::{self, mxfp4, QuantType};
use crate::digest::{self, DigestStore};
use crate::pyjson::{self, Style};
use crate::source::{Source, SourceFile, TensorInfo};

const VIEW: &str = "requant";
pub const SOURCE_REVISION: &str = "2bc89ac599031fa673cab993f1df02fc4a98c673";
pub const EXTERNAL_ROLE: &str = "engram-native";

fn err(rule: impl Into<String>) -> ViewError {
    ViewError::Layout { view: VIEW, rule: rule.into() }
}

#[derive(Debug, Clone)]
pub struct Recipe {
    pub w1: QuantType,
    pub w2: QuantType,
    pub w3: QuantType,
    /// A llama.cpp importance matrix; `None` is the seed's unit importance.
    pub imatrix: Option<PathBuf>,
}

impl Default for Recipe {
    fn default() -> Self {
        Recipe { w1: QuantType::Iq2Xxs, w2: QuantType::Q2K, w3: QuantType::Iq2Xxs, imatrix: None }
    }
}

impl Recipe {
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

/// Quantised expert weight, computed in row chunks.
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
    cache: Arc<ChunkCache>,
    id: u64,
    /// Importance row for this tensor (the seed's unit vector when no imatrix is given).
    importance: Arc<Vec<f32>>,
}

impl QuantInner {
    fn chunks(&self) -> u64 {
        self.rows.div_ceil(self.rows_per_chunk) as u64
    }

    fn compute(&self, id: u64) -> Result<Vec<u8>, ViewError> {
        let first = id as usize * self.rows_per_chunk;
        let rows = self.rows_per_chunk.min(self.rows - first);
        let mut packed = vec![0u8; rows * self.k / 2];
        self.weight.read_exact_at(&mut packed, self.weight_offset + (first * self.k / 2) as u64)?;
        let mut scales = vec![0u8; rows * self.k / 32];
        self.scale.read_exact_at(&mut scales, self.scale_offset + (first * self.k / 32) as u64)?;
        let mut x = vec![0f32; rows * self.k];
        let content = |rule: String| ViewError::Content { tensor: self.name.clone(), rule };
        mxfp4::dequantize_deepseek(&packed, &scales, self.k, &mut x).map_err(|e| match e {
            codec::CodecError::E8m0Nan { index } => content(format!(
                "MXFP4 scale byte 255 (E8M0 NaN) at row {}, block {}",
                first + index / (self.k / 32),
                index % (self.k / 32)
            )),
            other => content(other.to_string()),
        })?;
        let mut out = vec![0u8; rows * self.out_row_bytes];
        codec::quantize_rows_par(self.qtype, &x, self.k, Some(&self.importance), &mut out).map_err(|e| content(e.to_string()))?;
        Ok(out)
    }

    fn get(self: &Arc<Self>, id: u64) -> Result<Arc<[u8]>, ViewError> {
        let v = self.cache.get_or_compute((self.id, id), || self.compute(id))?;
        // Sequential readers: compute the next chunk in the background.
        if id + 1 < self.chunks() {
            let me = self.clone();
            rayon::spawn(move || {
                let _ = me.cache.get_or_compute((me.id, id + 1), || me.compute(id + 1));
            });
        }
        Ok(v)
    }
}

#[derive(Clone)]
struct QuantChunks(Arc<QuantInner>);

impl std::fmt::Debug for QuantChunks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "QuantChunks({})", self.0.name)
    }
}

impl ChunkSource for QuantChunks {
    fn chunk(&self, id: u64) -> Result<Arc<[u8]>, ViewError> {
        self.0.get(id)
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

/// Build the view.
pub fn build(source: &Source, store: &DigestStore, cache: Arc<ChunkCache>, recipe: &Recipe) -> Result<Tree, ViewError> {
    let meta = source.safetensors().ok_or_else(|| err("the requantised-shards view needs a safetensors checkpoint"))?;
    let index_path = meta.index_path.as_ref().ok_or_else(|| err("model.safetensors.index.json is missing"))?;
    let index: Value = serde_json::from_slice(&std::fs::read(index_path).map_err(|e| err(format!("{}: {e}", index_path.display())))?)
        .map_err(|e| err(format!("{}: {e}", index_path.display())))?;
    let weight_map = index["weight_map"].as_object().ok_or_else(|| err("index has no weight_map"))?;
    let by_name: std::collections::HashMap<&str, usize> = source.tensors.iter().enumerate().map(|(i, t)| (t.name.as_str(), i)).collect();
    let shard_name = |t: &TensorInfo| meta.shards[t.file].name.clone();

    // Roles, in index order (the seed walks weight_map).
    let mut planned: Vec<Planned> = Vec::new();
    for name in weight_map.keys() {
        let ti = by_name[name.as_str()];
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
            if k % g.block_size != 0 {
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
    let scales: std::collections::HashMap<String, usize> = planned
        .iter()
        .filter(|p| p.role == "dropped-expert-scale")
        .map(|p| (source.tensors[p.tensor].name.strip_suffix(".scale").unwrap().to_string(), p.tensor))
        .collect();
    for p in planned.iter_mut().filter(|p| p.role == "quantised") {
        let t = &source.tensors[p.tensor];
        let key = t.name.strip_suffix(".weight").unwrap();
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

    // Output shards mirror the source shards that keep anything, sorted by name.
    let mut by_shard: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for (i, p) in planned.iter().enumerate() {
        if p.role == "preserved" || p.role == "quantised" {
            by_shard.entry(shard_name(&source.tensors[p.tensor])).or_default().push(i);
        }
    }
    let n_out = by_shard.len();
    let mut tree = Tree::new();
    let mut plan_shards = Vec::new();
    let recipe_json = json!({"w1": recipe.w1.ggml().name, "w2": recipe.w2.ggml().name, "w3": recipe.w3.ggml().name});
    let imatrix = match &recipe.imatrix {
        Some(p) => Some(super::imatrix::Imatrix::open(p)?),
        None => None,
    };
    let importance_text = match &imatrix {
        None => "unit (no imatrix; no activation calibration)".to_string(),
        Some(m) => m.describe(),
    };
    let importance = importance_text.as_str();
    // Every quantised tensor needs its importance row: check them all at mount.
    let mut rows: std::collections::HashMap<usize, (Arc<Vec<f32>>, Option<String>)> = std::collections::HashMap::new();
    for p in planned.iter().filter(|p| p.role == "quantised") {
        let t = &source.tensors[p.tensor];
        let k = (t.shape[1] * 2) as usize;
        let row = match &imatrix {
            None => (Arc::new(vec![1.0f32; k]), None),
            Some(m) => {
                let (entry, r) = m.locate(&t.name, k).map_err(|rule| err(format!("imatrix {}: {rule}", m.path.display())))?;
                (Arc::new(m.row(&t.name, k)?), Some(format!("{entry}[{r}]")))
            }
        };
        rows.insert(p.tensor, row);
    }
    let t_json = |p: &Planned, out_shard: &str| -> Value {
        let t = &source.tensors[p.tensor];
        let data_start = 8 + meta.shards[t.file].header_len;
        json!({
            "name": t.name, "shard": shard_name(t), "dtype": st_dtype(t), "shape": t.shape,
            "begin": t.offset - data_start, "end": t.offset - data_start + t.nbytes, "data_start": data_start,
            "role": p.role, "out_shard": out_shard, "out_offset": p.out_offset,
            "out_dtype": match p.role { "quantised" => "U8".to_string(), "preserved" => st_dtype(t), _ => String::new() },
            "out_shape": p.out_shape, "out_bytes": p.out_bytes,
            "ggml_type": p.qtype.map(|q| q.ggml().name),
        })
    };
    for (i, (shard, members)) in by_shard.iter().enumerate() {
        let out_name = format!("quant-{:05}-of-{:05}.safetensors", i + 1, n_out);
        let mut members = members.clone();
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
        let header = seed_header(&entries);
        let file_bytes = header.len() as u64 + offset;
        let mut f = VirtualFile::new();
        f.push(Extent::Bytes(header.into()));
        // (name, source file, source offset, source bytes, output extent start, output bytes) for the manifest.
        let mut manifest_rows = Vec::new();
        let mut importance_rows: std::collections::HashMap<String, String> = std::collections::HashMap::new();
        for &m in &members {
            let p = &planned[m];
            let t = &source.tensors[p.tensor];
            let start = f.size();
            if let (Some(q), Some(si)) = (p.qtype, p.scale) {
                let s = &source.tensors[si];
                let k = (t.shape[1] * 2) as usize;
                let out_row_bytes = (p.out_shape[1]) as usize;
                let rows_per_chunk = ((1usize << 20) / out_row_bytes.max(1)).clamp(16, 4096) / 16 * 16;
                let inner = Arc::new(QuantInner {
                    name: t.name.clone(),
                    weight: source.files[t.file].clone(),
                    weight_offset: t.offset,
                    scale: source.files[s.file].clone(),
                    scale_offset: s.offset,
                    rows: t.shape[0] as usize,
                    k,
                    qtype: q,
                    rows_per_chunk,
                    out_row_bytes,
                    id: cache.producer_id(),
                    cache: cache.clone(),
                    importance: rows[&p.tensor].0.clone(),
                });
                let src = Arc::new(QuantChunks(inner.clone()));
                for c in 0..inner.chunks() {
                    let rows = rows_per_chunk.min(inner.rows - c as usize * rows_per_chunk);
                    f.push(Extent::Computed { source: src.clone(), id: c, len: (rows * out_row_bytes) as u64 });
                }
            } else {
                f.push(Extent::Source { file: source.files[t.file].clone(), offset: t.offset, len: t.nbytes });
            }
            manifest_rows.push((t.name.clone(), source.files[t.file].clone(), t.offset, t.nbytes, start, p.out_bytes));
            if let Some((_, Some(src_row))) = rows.get(&p.tensor) {
                importance_rows.insert(t.name.clone(), src_row.clone());
            }
        }
        for row in &manifest_rows {
            f.want_digest(row.4, row.5); // the manifest's output_sha256
        }
        let f = Arc::new(f);
        tree.add_file_arc(ROOT_INO, &out_name, f.clone());

        // Per-shard manifest, lazily hashed.
        let make = {
            let (out_name, shard, recipe_json) = (out_name.clone(), shard.clone(), recipe_json.clone());
            let importance = importance.to_string();
            let names: Vec<(String, u64, u64)> = manifest_rows.iter().map(|r| (r.0.clone(), r.3, r.5)).collect();
            let importance_rows = importance_rows.clone();
            move |hashes: &[(String, String)]| -> Vec<u8> {
                let tensors: Vec<Value> = names
                    .iter()
                    .zip(hashes)
                    .map(|((n, sb, ob), (sh, oh))| {
                        let mut v = json!({"name": n, "source_bytes": sb, "source_sha256": sh, "output_bytes": ob, "output_sha256": oh});
                        if let Some(r) = importance_rows.get(n) {
                            v["importance_row"] = Value::String(r.clone()); // only with an imatrix (beyond the seed)
                        }
                        v
                    })
                    .collect();
                indent1(&json!({
                    "output_shard": out_name, "source_shard": shard, "source_revision": SOURCE_REVISION,
                    "recipe": recipe_json, "importance": importance, "data_bytes": offset, "file_bytes": file_bytes,
                    "tensors": tensors,
                }))
            }
        };
        let zero = "0".repeat(64);
        let len = make(&vec![(zero.clone(), zero); manifest_rows.len()]).len() as u64;
        let key = {
            let mut h = sha2::Sha256::new();
            use sha2::Digest;
            h.update(format!("{VIEW}-v1:{out_name}:{recipe_json}:{importance}:").as_bytes());
            for (n, file, off, nb, _, ob) in &manifest_rows {
                let id = file.identity();
                // Not the device number: see DigestStore (stores shared over a network filesystem).
                h.update(format!("{n}:{}:{}:{}:{}:{off}:{nb}:{ob};", id.inode, id.size, id.mtime_ns, id.ctime_ns).as_bytes());
            }
            digest::hex(&h.finalize())
        };
        let store = store.clone();
        let build_manifest = move || -> Result<Vec<u8>, ViewError> {
            let hashes = match store.load_view(&key) {
                Some(h) if h.len() == 2 * manifest_rows.len() => h.chunks(2).map(|c| (c[0].clone(), c[1].clone())).collect(),
                _ => {
                    let mut hashes = Vec::new();
                    let mut flat = Vec::new();
                    for (_, file, off, nb, start, ob) in &manifest_rows {
                        let sh = hash_source(file, *off, *nb)?;
                        let oh = f.sha256_range(*start, *ob)?;
                        flat.push(sh.clone());
                        flat.push(oh.clone());
                        hashes.push((sh, oh));
                    }
                    if let Err(e) = store.save_view(&key, &flat) {
                        tracing::warn!("could not store requant digests: {e}");
                    }
                    hashes
                }
            };
            Ok(make(&hashes))
        };
        tree.add_file(ROOT_INO, &format!("{out_name}.manifest.json"), VirtualFile::lazy(len, build_manifest));
        tree.add_file(ROOT_INO, &format!("{out_name}.complete"), VirtualFile::from_bytes(format!("{shard} {file_bytes} {}\n", members.len()).into_bytes()));
        plan_shards.push(json!({
            "source_shard": shard, "output_shard": out_name, "data_bytes": offset,
            "tensors": members.iter().map(|&m| t_json(&planned[m], &out_name)).collect::<Vec<_>>(),
        }));
    }

    let of_role = |role: &'static str| planned.iter().filter(move |p| p.role == role);
    let sum = |role: &'static str, f: &dyn Fn(&Planned) -> u64| of_role(role).map(f).sum::<u64>();
    let plan = json!({
        "source_dir": meta.root.to_string_lossy(),
        "source_revision": SOURCE_REVISION,
        "recipe": recipe_json,
        "importance": importance,
        "external": of_role(EXTERNAL_ROLE).map(|p| t_json(p, "")).collect::<Vec<_>>(),
        "dropped": of_role("dropped-expert-scale").map(|p| t_json(p, "")).collect::<Vec<_>>(),
        "totals": {
            "source_tensors": weight_map.len(),
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
        "shards": plan_shards,
    });
    tree.add_file(ROOT_INO, "plan.json", VirtualFile::from_bytes(indent1(&plan)));
    Ok(tree)
}

fn hash_source(file: &SourceFile, offset: u64, len: u64) -> Result<String, ViewError> {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 8 << 20];
    let mut done = 0;
    while done < len {
        let n = (len - done).min(buf.len() as u64) as usize;
        file.read_exact_at(&mut buf[..n], offset + done)?;
        h.update(&buf[..n]);
        done += n as u64;
    }
    Ok(digest::hex(&h.finalize()))
}
