//! Planning the Kimi pack, pure over a shard set's headers and the model config: the
//! checks SGLang makes (`scan_gguf_shards`, `KimiK3Spec`, `validate_expert_tensors`, the
//! name rule of `write_ggml_moe_pack`), each failing with an error that names the shard,
//! the tensor and the rule, and the layout `_pack_layout` computes. Nothing here reads a
//! file; [`super::build`] feeds it what the source layer parsed.

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::format::{ALIGNMENT, ARCHITECTURE, ENTRY_BYTES, HEADER_BYTES, Header, NAME_BYTES, Role, encode_entry};
use crate::source::TensorInfo;
use crate::source::gguf::{GgufFileHeader, MetaValue, split_parts};
use crate::util::args::InvalidValue;

/// Caps on what a header or config may make the planner allocate or iterate (the Kimi pack's
/// own: the views' cap on expert indices in tensor names is [`crate::view::MAX_EXPERTS`]).
pub const MAX_LAYERS: u64 = 1 << 16;
pub const MAX_KIMI_EXPERTS: u64 = 1 << 20;
/// Header and index bytes (the audited model's are 37.6 MB).
pub const MAX_HEAD_BYTES: u64 = 256 << 20;

/// Which models the view accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ModelCheck {
    /// Only the audited Kimi K3 dimensions (what SGLang's `KimiK3Spec.from_config` accepts).
    #[default]
    Audited,
    /// Any model of the same layout: first layer dense, routed experts in every later
    /// layer, Q2_K up/gate and Q3_K down.
    Layout,
}

impl ModelCheck {
    /// For option parsing: the mode named `s`, or the rule.
    pub fn parse_option(s: &str) -> Result<ModelCheck, InvalidValue> {
        ModelCheck::parse(s).ok_or_else(|| InvalidValue::given(s, "is not audited or layout"))
    }

    pub fn parse(s: &str) -> Option<ModelCheck> {
        match s {
            "audited" => Some(ModelCheck::Audited),
            "layout" => Some(ModelCheck::Layout),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum KimiError {
    #[error("shard {}: {rule}", shard.display())]
    Shard { shard: PathBuf, rule: String },
    #[error("shard {}: tensor {tensor:?}: {rule}", shard.display())]
    Tensor { shard: PathBuf, tensor: String, rule: String },
    #[error("routed-expert coverage: {0}")]
    Coverage(String),
    #[error("model config {}: {rule}", path.display())]
    Config { path: PathBuf, rule: String },
    #[error("model_check=audited: {0}; -o model_check=layout accepts other models of the same layout")]
    NotAudited(String),
    #[error("layout rule: {0}")]
    LayoutRule(String),
    #[error("tokenizer {}: {rule}", path.display())]
    Tokenizer { path: PathBuf, rule: String },
    #[error("option {option}: {rule}")]
    Option { option: &'static str, rule: String },
}

/// The model as SGLang's `KimiK3Spec` describes it (from `config.json`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelSpec {
    pub num_hidden_layers: u64,
    pub first_k_dense_replace: u64,
    pub num_experts: u64,
    pub top_k: u64,
    pub num_shared_experts: u64,
    pub hidden_size: u64,
    pub routed_expert_hidden_size: u64,
    pub moe_intermediate_size: u64,
    pub hidden_act: String,
}

/// The audited Kimi K3 (`KimiK3Spec.validate_kimi_k3`).
pub const AUDITED: [(&str, u64); 8] = [
    ("num_hidden_layers", 93),
    ("first_k_dense_replace", 1),
    ("num_experts", 896),
    ("top_k", 16),
    ("num_shared_experts", 2),
    ("hidden_size", 7168),
    ("routed_expert_hidden_size", 3584),
    ("moe_intermediate_size", 3072),
];
pub const AUDITED_HIDDEN_ACT: &str = "situ";

impl ModelSpec {
    /// `KimiK3Spec.from_config`: the fields of `text_config` when the config has one, else
    /// of the config itself. Integers must be JSON integers, `hidden_act` a string.
    pub fn from_config(config: &Value, path: &Path) -> Result<ModelSpec, KimiError> {
        let err = |rule: String| KimiError::Config { path: path.to_path_buf(), rule };
        let (text, prefix) = match config.get("text_config") {
            Some(t) => (t, "text_config."),
            None => (config, ""),
        };
        let Some(text) = text.as_object() else {
            return Err(err(format!("{} is not a JSON object", if prefix.is_empty() { "the config" } else { "text_config" })));
        };
        let int = |key: &str| -> Result<u64, KimiError> {
            match text.get(key) {
                None => Err(err(format!("{prefix}{key} is missing"))),
                Some(v) => v.as_u64().ok_or_else(|| err(format!("{prefix}{key} must be a non-negative integer, got {v}"))),
            }
        };
        let hidden_act = match text.get("hidden_act") {
            None => return Err(err(format!("{prefix}hidden_act is missing"))),
            Some(Value::String(s)) => s.clone(),
            Some(v) => return Err(err(format!("{prefix}hidden_act must be a string, got {v}"))),
        };
        Ok(ModelSpec {
            num_hidden_layers: int("num_hidden_layers")?,
            first_k_dense_replace: int("first_k_dense_replace")?,
            num_experts: int("num_experts")?,
            top_k: int("num_experts_per_token")?,
            num_shared_experts: int("num_shared_experts")?,
            hidden_size: int("hidden_size")?,
            routed_expert_hidden_size: int("routed_expert_hidden_size")?,
            moe_intermediate_size: int("moe_intermediate_size")?,
            hidden_act,
        })
    }

    fn fields(&self) -> [(&'static str, u64); 8] {
        [
            ("num_hidden_layers", self.num_hidden_layers),
            ("first_k_dense_replace", self.first_k_dense_replace),
            ("num_experts", self.num_experts),
            ("top_k", self.top_k),
            ("num_shared_experts", self.num_shared_experts),
            ("hidden_size", self.hidden_size),
            ("routed_expert_hidden_size", self.routed_expert_hidden_size),
            ("moe_intermediate_size", self.moe_intermediate_size),
        ]
    }

    pub fn pack_spec(&self) -> PackSpec {
        PackSpec {
            num_hidden_layers: self.num_hidden_layers,
            first_dense: self.first_k_dense_replace,
            num_experts: self.num_experts,
            expert_hidden: self.routed_expert_hidden_size,
            intermediate: self.moe_intermediate_size,
            top_k: Some(self.top_k),
        }
    }
}

/// What the pack needs of the model: from the config, or read off the GGUF when no
/// config is given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackSpec {
    pub num_hidden_layers: u64,
    pub first_dense: u64,
    pub num_experts: u64,
    /// `routed_expert_hidden_size`: the first dimension of up and gate.
    pub expert_hidden: u64,
    /// `moe_intermediate_size`: the first dimension of down.
    pub intermediate: u64,
    pub top_k: Option<u64>,
}

impl PackSpec {
    /// The active MoE layers, `first_dense..num_hidden_layers`.
    pub fn active_layers(&self) -> Range<u64> {
        self.first_dense..self.num_hidden_layers.max(self.first_dense)
    }

    /// Read the dimensions off the GGUF: `kimi-k3.block_count` (else the highest `blk.N`
    /// plus one), `kimi-k3.leading_dense_block_count` (else 1), `kimi-k3.expert_count` and
    /// `kimi-k3.expert_used_count` where present, and the shape of the first routed-expert
    /// tensor.
    pub fn from_gguf(metadata: &BTreeMap<String, MetaValue>, tensors: &[TensorInfo], shards: &[PathBuf]) -> Result<PackSpec, KimiError> {
        let meta = |suffix: &str| metadata.get(&format!("{ARCHITECTURE}.{suffix}")).and_then(MetaValue::as_u64);
        let (t, role) = tensors
            .iter()
            .find_map(|t| match expert_key(&t.name) {
                Key::Expert(_, role) => Some((t, role)),
                _ => None,
            })
            .ok_or_else(|| KimiError::Coverage("the shards hold no routed-expert tensor blk.N.ffn_{up,gate,down}_exps.weight".into()))?;
        if t.shape.len() != 3 {
            return Err(tensor_err(shards, t, format!("an expert tensor has 3 dimensions, this one has shape {:?}", t.shape)));
        }
        let (expert_hidden, intermediate) = if role == Role::Down { (t.shape[1], t.shape[0]) } else { (t.shape[0], t.shape[1]) };
        let layers = match meta("block_count") {
            Some(n) => n,
            None => tensors.iter().filter_map(|t| block_number(&t.name)).max().map_or(0, |n| n.saturating_add(1)),
        };
        Ok(PackSpec {
            num_hidden_layers: layers,
            first_dense: meta("leading_dense_block_count").unwrap_or(1),
            num_experts: meta("expert_count").unwrap_or(t.shape[2]),
            expert_hidden,
            intermediate,
            top_k: meta("expert_used_count"),
        })
    }
}

/// The model checks: the audited dimensions (audited mode), then the layout rules and caps.
pub fn check_model(spec: &PackSpec, model: Option<&ModelSpec>, mode: ModelCheck) -> Result<(), KimiError> {
    if mode == ModelCheck::Audited {
        let actual: Vec<(&str, u64)> = match model {
            Some(m) => m.fields().to_vec(),
            None => [
                ("num_hidden_layers", Some(spec.num_hidden_layers)),
                ("first_k_dense_replace", Some(spec.first_dense)),
                ("num_experts", Some(spec.num_experts)),
                ("top_k", spec.top_k),
                ("routed_expert_hidden_size", Some(spec.expert_hidden)),
                ("moe_intermediate_size", Some(spec.intermediate)),
            ]
            .into_iter()
            .filter_map(|(k, v)| Some((k, v?)))
            .collect(),
        };
        let mut differ: Vec<String> = actual
            .iter()
            .filter_map(|&(k, v)| {
                let want = AUDITED.iter().find(|a| a.0 == k).map(|a| a.1)?;
                (v != want).then(|| format!("{k} is {v} (audited: {want})"))
            })
            .collect();
        if let Some(m) = model.filter(|m| m.hidden_act != AUDITED_HIDDEN_ACT) {
            differ.push(format!("hidden_act is {:?} (audited: {AUDITED_HIDDEN_ACT:?})", m.hidden_act));
        }
        if !differ.is_empty() {
            return Err(KimiError::NotAudited(format!("the model's dimensions differ from the audited Kimi K3: {}", differ.join(", "))));
        }
    }
    let rule = |s: String| Err(KimiError::LayoutRule(s));
    if spec.first_dense != 1 {
        return rule(format!("the first layer is dense and every later layer has routed experts; first_k_dense_replace is {}, not 1", spec.first_dense));
    }
    if spec.num_hidden_layers < 2 || spec.num_hidden_layers > MAX_LAYERS {
        return rule(format!("num_hidden_layers is {}; 2 to {MAX_LAYERS} are accepted (one dense layer, then MoE layers)", spec.num_hidden_layers));
    }
    if spec.num_experts == 0 || spec.num_experts > MAX_KIMI_EXPERTS {
        return rule(format!("num_experts is {}; 1 to {MAX_KIMI_EXPERTS} are accepted", spec.num_experts));
    }
    if spec.expert_hidden == 0 || spec.intermediate == 0 {
        return rule(format!("expert matrices of {} x {} are empty", spec.expert_hidden, spec.intermediate));
    }
    if let Some(k) = spec.top_k.filter(|&k| k == 0 || k > spec.num_experts) {
        return rule(format!("top_k is {k}; it must be 1 to num_experts ({})", spec.num_experts));
    }
    Ok(())
}

fn lacks(shard: &Path, key: &str) -> KimiError {
    KimiError::Shard {
        shard: shard.to_path_buf(),
        rule: format!("GGUF metadata lacks {key} (every shard of a Kimi set states split.no, split.count, split.tensors.count and general.architecture)"),
    }
}

fn meta_u64(h: &GgufFileHeader, key: &str, shard: &Path) -> Result<u64, KimiError> {
    let v = h.metadata.get(key).ok_or_else(|| lacks(shard, key))?;
    v.as_u64().ok_or_else(|| KimiError::Shard { shard: shard.to_path_buf(), rule: format!("{key} must be a non-negative integer, got {v:?}") })
}

fn meta_str<'a>(h: &'a GgufFileHeader, key: &str, shard: &Path) -> Result<&'a str, KimiError> {
    let v = h.metadata.get(key).ok_or_else(|| lacks(shard, key))?;
    v.as_str().ok_or_else(|| KimiError::Shard { shard: shard.to_path_buf(), rule: format!("{key} must be a string, got {v:?}") })
}

/// `scan_gguf_shards`' rules: every shard states `split.no` (its place, from 0),
/// `split.count`, `split.tensors.count` and `general.architecture`, all shards agree, the
/// count is the number of files, the tensor count is the set's, the architecture `kimi-k3`.
pub fn check_shards(shards: &[PathBuf], headers: &[GgufFileHeader], total_tensors: usize) -> Result<(), KimiError> {
    let mut first: Option<(u64, u64, &str)> = None;
    for (index, (path, h)) in shards.iter().zip(headers).enumerate() {
        let count = meta_u64(h, "split.count", path)?;
        let no = meta_u64(h, "split.no", path)?;
        let tensors = meta_u64(h, "split.tensors.count", path)?;
        let arch = meta_str(h, "general.architecture", path)?;
        if no != index as u64 {
            return Err(KimiError::Shard {
                shard: path.clone(),
                rule: format!("split.no is {no}, but the shard is part {} of the set (split.no counts from 0 in file-name order)", index + 1),
            });
        }
        match first {
            None => first = Some((count, tensors, arch)),
            Some((c0, t0, a0)) => {
                let first_path = shards[0].display();
                let mismatch = if c0 != count {
                    Some(format!("split.count is {count} but {first_path} says {c0}"))
                } else if t0 != tensors {
                    Some(format!("split.tensors.count is {tensors} but {first_path} says {t0}"))
                } else if a0 != arch {
                    Some(format!("general.architecture is {arch:?} but {first_path} says {a0:?}"))
                } else {
                    None
                };
                if let Some(m) = mismatch {
                    return Err(KimiError::Shard {
                        shard: path.clone(),
                        rule: format!("split metadata differs from the first shard's: {m} (a shard of another set?)"),
                    });
                }
            }
        }
    }
    let Some((count, tensors, arch)) = first else {
        return Err(KimiError::Coverage("the source has no shards".into()));
    };
    let shard0 = shards[0].clone();
    if count != shards.len() as u64 {
        return Err(KimiError::Shard { shard: shard0, rule: format!("split.count is {count}, but the set has {} files", shards.len()) });
    }
    if tensors != total_tensors as u64 {
        return Err(KimiError::Shard { shard: shard0, rule: format!("split.tensors.count is {tensors}, but the shards hold {total_tensors} tensors") });
    }
    if arch != ARCHITECTURE {
        return Err(KimiError::Shard { shard: shard0, rule: format!("general.architecture is {arch:?}; the kimi-pack view needs {ARCHITECTURE:?}") });
    }
    Ok(())
}

/// `NAME-0000N-of-0000M.gguf` -> `NAME.expert-major.pack` (`prepare_kimi_pack.expert_pack_path`);
/// `name` replaces NAME.
pub fn pack_name(first_shard: &Path, name: Option<&str>) -> Result<String, KimiError> {
    let file = first_shard.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let prefix = file.strip_suffix(".gguf").and_then(split_parts).map(|(p, _, _)| p).ok_or_else(|| KimiError::Shard {
        shard: first_shard.to_path_buf(),
        rule: "the kimi-pack view needs a numbered shard set, NAME-0000N-of-0000M.gguf".into(),
    })?;
    Ok(format!("{}.expert-major.pack", name.unwrap_or(prefix)))
}

/// What a tensor name says under SGLang's `EXPERT_RE`
/// (`^blk\.(\d+)\.ffn_(up|gate|down)_exps\.weight$`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Key {
    NotExpert,
    /// Layer (saturating at u64::MAX) and role.
    Expert(u64, Role),
    /// The expert pattern with a layer number in non-ASCII digits, which Python's `\d`
    /// would read as a number: refused rather than guessed.
    NonAsciiLayer,
}

fn ascii_number(s: &str) -> Option<u64> {
    (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())).then(|| s.bytes().fold(0u64, |a, d| a.saturating_mul(10).saturating_add((d - b'0') as u64)))
}

pub fn expert_key(name: &str) -> Key {
    let Some(rest) = name.strip_prefix("blk.") else { return Key::NotExpert };
    let Some((layer, tail)) = rest.split_once('.') else { return Key::NotExpert };
    let Some(role) = tail.strip_prefix("ffn_").and_then(|t| t.strip_suffix("_exps.weight")).and_then(Role::from_name) else {
        return Key::NotExpert;
    };
    match ascii_number(layer) {
        Some(n) => Key::Expert(n, role),
        None if !layer.is_empty() && layer.chars().all(char::is_numeric) => Key::NonAsciiLayer,
        None => Key::NotExpert,
    }
}

/// The N of `blk.N.` (ASCII digits).
fn block_number(name: &str) -> Option<u64> {
    ascii_number(name.strip_prefix("blk.")?.split_once('.')?.0)
}

fn tensor_err(shards: &[PathBuf], t: &TensorInfo, rule: String) -> KimiError {
    KimiError::Tensor { shard: shards.get(t.file).cloned().unwrap_or_default(), tensor: t.name.clone(), rule }
}

fn canonical_name(layer: u64, role: Role) -> String {
    format!("blk.{layer}.ffn_{}_exps.weight", role.name())
}

/// The routed-expert tensors of the active layers, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Experts {
    /// Per active layer (in order), the indices into the source's tensors of up, gate, down.
    pub layers: Vec<[usize; 3]>,
    /// Bytes of one expert's slice, per role.
    pub expert_bytes: [u64; 3],
}

/// `validate_expert_tensors`: no duplicate (layer, role); exactly the active layers'
/// up/gate/down tensors; per role the dtype SGLang accepts, an even split into the
/// experts, the shape `[hidden, intermediate, experts]` (`[intermediate, hidden, experts]`
/// for down); and names that fit the pack index.
pub fn expert_tensors(tensors: &[TensorInfo], shards: &[PathBuf], spec: &PackSpec) -> Result<Experts, KimiError> {
    let mut found: BTreeMap<(u64, Role), usize> = BTreeMap::new();
    for (i, t) in tensors.iter().enumerate() {
        match expert_key(&t.name) {
            Key::NotExpert => {}
            Key::NonAsciiLayer => {
                return Err(tensor_err(shards, t, "the layer number of a routed-expert tensor name must be ASCII digits".into()));
            }
            Key::Expert(layer, role) => {
                if let Some(prev) = found.insert((layer, role), i) {
                    return Err(tensor_err(
                        shards,
                        t,
                        format!("duplicate routed-expert tensor for layer {layer} role {}: {:?} names it too", role.name(), tensors[prev].name),
                    ));
                }
            }
        }
    }
    let active = spec.active_layers();
    let extra: Vec<&str> = found.iter().filter(|((l, _), _)| !active.contains(l)).map(|(_, &i)| tensors[i].name.as_str()).collect();
    let mut missing = Vec::new();
    let mut missing_count = 0u64;
    for layer in active.clone() {
        for role in Role::ORDER {
            if !found.contains_key(&(layer, role)) {
                missing_count += 1;
                if missing.len() < 8 {
                    missing.push(canonical_name(layer, role));
                }
            }
        }
    }
    if missing_count > 0 || !extra.is_empty() {
        let shown: Vec<&str> = extra.iter().take(8).copied().collect();
        return Err(KimiError::Coverage(format!(
            "the active MoE layers {}..{} need up, gate and down expert tensors each; missing {missing_count} ({}), extra {} ({})",
            active.start,
            active.end,
            missing.join(", "),
            extra.len(),
            shown.join(", ")
        )));
    }
    let e = spec.num_experts;
    let mut layers = Vec::with_capacity((active.end - active.start) as usize);
    let mut expert_bytes = [0u64; 3];
    for layer in active {
        let mut idx = [0usize; 3];
        for role in Role::ORDER {
            let i = found[&(layer, role)];
            idx[role as usize] = i;
            let t = &tensors[i];
            let want = role.dtype();
            if t.dtype.ggml() != Some(want) {
                return Err(tensor_err(
                    shards,
                    t,
                    format!("role {} must be {} (SGLang's Kimi layout), the tensor is {}", role.name(), want.name, t.dtype.name()),
                ));
            }
            if !t.nbytes.is_multiple_of(e) {
                return Err(tensor_err(shards, t, format!("uneven slicing: {} bytes do not split into {e} equal expert slices", t.nbytes)));
            }
            let shape = if role == Role::Down { [spec.intermediate, spec.expert_hidden, e] } else { [spec.expert_hidden, spec.intermediate, e] };
            if t.shape != shape {
                return Err(tensor_err(shards, t, format!("shape {:?}, expected {shape:?} for role {}", t.shape, role.name())));
            }
            if t.name.len() >= NAME_BYTES {
                return Err(tensor_err(shards, t, format!("name is {} bytes; the pack index holds names of at most {} bytes", t.name.len(), NAME_BYTES - 1)));
            }
            expert_bytes[role as usize] = t.nbytes / e;
        }
        layers.push(idx);
    }
    Ok(Experts { layers, expert_bytes })
}

pub fn align_up(v: u64) -> Option<u64> {
    v.checked_next_multiple_of(ALIGNMENT)
}

/// Where everything is in the pack (`_pack_layout`): the header and index, then per
/// active layer, per expert, up, gate and down, each at the next 4 KiB boundary. Every
/// object starts aligned, so the offsets within an object are the same for all objects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    pub first_layer: u64,
    pub num_layers: u64,
    pub num_experts: u64,
    pub expert_bytes: [u64; 3],
    /// Offset of each role within an object.
    pub role_offset: [u64; 3],
    /// From an object's up to the end of its down (the manifest's `object_bytes`).
    pub object_span: u64,
    /// From one object to the next.
    pub object_stride: u64,
    pub index_count: u64,
    pub data_start: u64,
    /// The end of the last down slice (no padding after it).
    pub pack_size: u64,
}

impl Layout {
    pub fn new(spec: &PackSpec, experts: &Experts) -> Result<Layout, KimiError> {
        let over = || KimiError::LayoutRule("the pack's size overflows 64 bits".into());
        let b = experts.expert_bytes;
        let active = spec.active_layers();
        let num_layers = active.end - active.start;
        let objects = num_layers.checked_mul(spec.num_experts).filter(|&n| n > 0).ok_or_else(over)?;
        let index_count = objects.checked_mul(3).ok_or_else(over)?;
        let head = index_count.checked_mul(ENTRY_BYTES).and_then(|n| n.checked_add(HEADER_BYTES)).ok_or_else(over)?;
        if head > MAX_HEAD_BYTES {
            return Err(KimiError::LayoutRule(format!(
                "the pack index would take {head} bytes ({index_count} entries), more than the cap of {MAX_HEAD_BYTES}"
            )));
        }
        let gate = align_up(b[0]).ok_or_else(over)?;
        let down = gate.checked_add(b[1]).and_then(align_up).ok_or_else(over)?;
        let span = down.checked_add(b[2]).ok_or_else(over)?;
        let stride = align_up(span).ok_or_else(over)?;
        let data_start = align_up(head).ok_or_else(over)?;
        let pack_size = (objects - 1).checked_mul(stride).and_then(|n| n.checked_add(data_start)).and_then(|n| n.checked_add(span)).ok_or_else(over)?;
        Ok(Layout {
            first_layer: active.start,
            num_layers,
            num_experts: spec.num_experts,
            expert_bytes: b,
            role_offset: [0, gate, down],
            object_span: span,
            object_stride: stride,
            index_count,
            data_start,
            pack_size,
        })
    }

    /// Offset of an object; `layer_index` counts active layers from 0.
    pub fn object_offset(&self, layer_index: u64, expert: u64) -> u64 {
        self.data_start + (layer_index * self.num_experts + expert) * self.object_stride
    }

    pub fn entry_offset(&self, layer_index: u64, expert: u64, role: Role) -> u64 {
        self.object_offset(layer_index, expert) + self.role_offset[role as usize]
    }

    /// The header and the index, then zeros up to `data_start`; and the sha256 of the
    /// header and index (the manifest's `index_sha256`).
    pub fn head(&self, experts: &Experts, tensors: &[TensorInfo]) -> (Vec<u8>, String) {
        let mut out = Vec::with_capacity(self.data_start as usize);
        Header::new(self.index_count, self.data_start).encode_into(&mut out);
        for (li, idx) in experts.layers.iter().enumerate() {
            for expert in 0..self.num_experts {
                for role in Role::ORDER {
                    let name = &tensors[idx[role as usize]].name;
                    let offset = self.entry_offset(li as u64, expert, role);
                    encode_entry(&mut out, name, expert as i32, offset, self.expert_bytes[role as usize]);
                }
            }
        }
        let sha = crate::util::sha256_hex(&out);
        out.resize(self.data_start as usize, 0);
        (out, sha)
    }
}

/// The entries `validate_ggml_moe_pack(payload_samples=n)` compares with the source: the
/// distinct values of `round(i * (count - 1) / (n - 1))` for i in 0..n (ties to even).
pub fn samples(payload_samples: u64, count: u64) -> Vec<u64> {
    match payload_samples {
        _ if count == 0 => Vec::new(),
        0 => Vec::new(),
        1 => vec![0],
        n if n >= count => (0..count).collect(),
        n => {
            let d = (n - 1) as u128;
            let mut v: Vec<u64> = (0..n)
                .map(|i| {
                    let num = i as u128 * (count - 1) as u128;
                    let (q, r) = ((num / d) as u64, num % d);
                    match (2 * r).cmp(&d) {
                        std::cmp::Ordering::Less => q,
                        std::cmp::Ordering::Greater => q + 1,
                        std::cmp::Ordering::Equal => q + (q & 1),
                    }
                })
                .collect();
            v.dedup();
            v
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::GgmlType;
    use crate::source::TensorDtype;

    fn t(name: &str, ty: &str, shape: &[u64], file: usize) -> TensorInfo {
        let g = GgmlType::from_name(ty).unwrap();
        let rows: u64 = shape[1..].iter().product();
        TensorInfo {
            name: name.into(),
            dtype: TensorDtype::Ggml(g),
            shape: shape.to_vec(),
            file,
            offset: 0,
            nbytes: g.row_bytes(shape[0]).unwrap() * rows,
            logical_offset: 0,
        }
    }

    fn spec(layers: u64, experts: u64) -> PackSpec {
        PackSpec { num_hidden_layers: layers, first_dense: 1, num_experts: experts, expert_hidden: 256, intermediate: 512, top_k: Some(2) }
    }

    /// Layer 0 dense, then up/gate/down per layer.
    fn model(layers: u64, experts: u64) -> Vec<TensorInfo> {
        let mut v = vec![t("blk.0.ffn_up.weight", "F16", &[256, 512], 0)];
        for l in 1..layers {
            v.push(t(&format!("blk.{l}.ffn_up_exps.weight"), "Q2_K", &[256, 512, experts], (l % 2) as usize));
            v.push(t(&format!("blk.{l}.ffn_gate_exps.weight"), "Q2_K", &[256, 512, experts], (l % 2) as usize));
            v.push(t(&format!("blk.{l}.ffn_down_exps.weight"), "Q3_K", &[512, 256, experts], (l % 2) as usize));
        }
        v
    }

    fn shards() -> Vec<PathBuf> {
        vec!["k-00001-of-00002.gguf".into(), "k-00002-of-00002.gguf".into()]
    }

    #[test]
    fn expert_names_as_sglangs_regex_reads_them() {
        assert_eq!(expert_key("blk.12.ffn_down_exps.weight"), Key::Expert(12, Role::Down));
        assert_eq!(expert_key("blk.01.ffn_up_exps.weight"), Key::Expert(1, Role::Up));
        assert_eq!(expert_key("blk.1.ffn_up_shexp.weight"), Key::NotExpert);
        assert_eq!(expert_key("blk..ffn_up_exps.weight"), Key::NotExpert);
        assert_eq!(expert_key("blk.1.ffn_up_exps.weight.x"), Key::NotExpert);
        assert_eq!(expert_key("blk.1a.ffn_up_exps.weight"), Key::NotExpert);
        assert_eq!(expert_key("blk.\u{0661}.ffn_up_exps.weight"), Key::NonAsciiLayer);
        assert_eq!(expert_key("blk.99999999999999999999999.ffn_gate_exps.weight"), Key::Expert(u64::MAX, Role::Gate));
    }

    #[test]
    fn a_well_formed_model_plans() {
        let tensors = model(4, 8);
        let s = spec(4, 8);
        let e = expert_tensors(&tensors, &shards(), &s).unwrap();
        assert_eq!(e.layers, vec![[1, 2, 3], [4, 5, 6], [7, 8, 9]]);
        // Q2_K 256x512 per expert: 512 rows of 84 bytes; Q3_K 512x256: 256 rows of 2x110.
        assert_eq!(e.expert_bytes, [43008, 43008, 56320]);
        let l = Layout::new(&s, &e).unwrap();
        assert_eq!((l.index_count, l.data_start), (72, 12288)); // 40 + 72 * 152 = 10984
        assert_eq!(l.role_offset, [0, 45056, 90112]);
        assert_eq!((l.object_span, l.object_stride), (146432, 147456));
        assert_eq!(l.pack_size, 12288 + 23 * 147456 + 146432);
        let (head, sha) = l.head(&e, &tensors);
        assert_eq!(head.len() as u64, l.data_start);
        assert_eq!(sha, crate::util::sha256_hex(&head[..40 + 72 * 152]));
        assert!(head[40 + 72 * 152..].iter().all(|&b| b == 0));
        // Entry 4: layer 1, expert 1, gate.
        let e4 = super::super::format::Entry::decode(head[40 + 4 * 152..40 + 5 * 152].try_into().unwrap());
        assert_eq!((e4.name.as_deref(), e4.expert, e4.offset, e4.nbytes), (Some("blk.1.ffn_gate_exps.weight"), 1, 12288 + 147456 + 45056, 43008));
    }

    #[test]
    fn each_bad_model_names_its_rule() {
        let s = spec(4, 8);
        let err = |tensors: &[TensorInfo]| expert_tensors(tensors, &shards(), &s).unwrap_err().to_string();

        let mut v = model(4, 8);
        v.remove(5);
        let e = err(&v);
        assert!(e.starts_with("routed-expert coverage:") && e.contains("missing 1 (blk.2.ffn_gate_exps.weight)"), "{e}");

        let mut v = model(4, 8);
        v.push(t("blk.4.ffn_up_exps.weight", "Q2_K", &[256, 512, 8], 0));
        assert!(err(&v).contains("extra 1 (blk.4.ffn_up_exps.weight)"), "{}", err(&v));

        let mut v = model(4, 8);
        v.push(t("blk.01.ffn_up_exps.weight", "Q2_K", &[256, 512, 8], 1));
        let e = err(&v);
        assert!(e.contains("tensor \"blk.01.ffn_up_exps.weight\": duplicate routed-expert tensor for layer 1 role up"), "{e}");
        assert!(e.starts_with("shard k-00002-of-00002.gguf:"), "{e}");

        let mut v = model(4, 8);
        v[3] = t("blk.1.ffn_down_exps.weight", "Q4_K", &[512, 256, 8], 1);
        assert!(err(&v).contains("role down must be Q3_K (SGLang's Kimi layout), the tensor is Q4_K"), "{}", err(&v));

        let mut v = model(4, 8);
        v[1] = t("blk.1.ffn_up_exps.weight", "Q2_K", &[256, 511, 7], 1);
        assert!(err(&v).contains("uneven slicing: 300468 bytes do not split into 8 equal expert slices"), "{}", err(&v));

        let mut v = model(4, 8);
        v[1] = t("blk.1.ffn_up_exps.weight", "Q2_K", &[512, 256, 8], 1);
        assert!(err(&v).contains("shape [512, 256, 8], expected [256, 512, 8] for role up"), "{}", err(&v));

        let mut v = model(4, 8);
        let long = format!("blk.{}1.ffn_up_exps.weight", "0".repeat(110));
        v[1] = t(&long, "Q2_K", &[256, 512, 8], 1);
        assert!(err(&v).contains("name is 134 bytes; the pack index holds names of at most 127 bytes"), "{}", err(&v));

        let mut v = model(4, 8);
        v[1].name = "blk.\u{0661}.ffn_up_exps.weight".into();
        assert!(err(&v).contains("must be ASCII digits"), "{}", err(&v));
    }

    #[test]
    fn model_checks() {
        let audited = PackSpec { num_hidden_layers: 93, first_dense: 1, num_experts: 896, expert_hidden: 3584, intermediate: 3072, top_k: Some(16) };
        check_model(&audited, None, ModelCheck::Audited).unwrap();
        let small = spec(4, 8);
        let e = check_model(&small, None, ModelCheck::Audited).unwrap_err().to_string();
        assert!(e.contains("num_hidden_layers is 4 (audited: 93)") && e.contains("top_k is 2 (audited: 16)") && e.contains("model_check=layout"), "{e}");
        check_model(&small, None, ModelCheck::Layout).unwrap();
        let e = check_model(&PackSpec { first_dense: 2, ..small.clone() }, None, ModelCheck::Layout).unwrap_err().to_string();
        assert!(e.contains("the first layer is dense") && e.contains("first_k_dense_replace is 2"), "{e}");
        let e = check_model(&PackSpec { top_k: Some(9), ..small.clone() }, None, ModelCheck::Layout).unwrap_err().to_string();
        assert!(e.contains("top_k is 9"), "{e}");
        let e = check_model(&PackSpec { num_hidden_layers: 1 << 40, ..small }, None, ModelCheck::Layout).unwrap_err().to_string();
        assert!(e.contains("2 to 65536"), "{e}");

        let config: Value = serde_json::json!({"text_config": {
            "num_hidden_layers": 93, "first_k_dense_replace": 1, "num_experts": 896, "num_experts_per_token": 16,
            "num_shared_experts": 2, "hidden_size": 7168, "routed_expert_hidden_size": 3584,
            "moe_intermediate_size": 3072, "hidden_act": "situ"}});
        let m = ModelSpec::from_config(&config, Path::new("c.json")).unwrap();
        assert_eq!(m.pack_spec(), audited);
        check_model(&m.pack_spec(), Some(&m), ModelCheck::Audited).unwrap();
        let odd = ModelSpec { hidden_act: "silu".into(), num_shared_experts: 1, ..m.clone() };
        let e = check_model(&odd.pack_spec(), Some(&odd), ModelCheck::Audited).unwrap_err().to_string();
        assert!(e.contains("num_shared_experts is 1 (audited: 2), hidden_act is \"silu\" (audited: \"situ\")"), "{e}");
        let mut flat = config["text_config"].clone();
        flat["num_experts"] = serde_json::json!("896");
        let e = ModelSpec::from_config(&flat, Path::new("c.json")).unwrap_err().to_string();
        assert_eq!(e, "model config c.json: num_experts must be a non-negative integer, got \"896\"");
        let e = ModelSpec::from_config(&serde_json::json!({"text_config": {}}), Path::new("c.json")).unwrap_err().to_string();
        assert_eq!(e, "model config c.json: text_config.hidden_act is missing");
    }

    #[test]
    fn shard_metadata_rules() {
        let header = |no: u64, count: u64, tensors: i32, arch: &str| GgufFileHeader {
            version: 3,
            alignment: 32,
            data_offset: 0,
            tensor_count: 0,
            metadata: BTreeMap::from([
                ("split.no".to_string(), MetaValue::U16(no as u16)),
                ("split.count".to_string(), MetaValue::U16(count as u16)),
                ("split.tensors.count".to_string(), MetaValue::I32(tensors)),
                ("general.architecture".to_string(), MetaValue::Str(arch.into())),
            ]),
        };
        let s = shards();
        check_shards(&s, &[header(0, 2, 10, "kimi-k3"), header(1, 2, 10, "kimi-k3")], 10).unwrap();
        let e = |h: &[GgufFileHeader], n: usize| check_shards(&s, h, n).unwrap_err().to_string();
        assert!(e(&[header(0, 2, 10, "kimi-k3"), header(0, 2, 10, "kimi-k3")], 10).contains("k-00002-of-00002.gguf: split.no is 0, but the shard is part 2"));
        assert!(
            e(&[header(0, 2, 10, "kimi-k3"), header(1, 2, 12, "kimi-k3")], 10)
                .contains("split.tensors.count is 12 but k-00001-of-00002.gguf says 10 (a shard of another set?)")
        );
        assert!(e(&[header(0, 3, 10, "kimi-k3"), header(1, 3, 10, "kimi-k3")], 10).contains("split.count is 3, but the set has 2 files"));
        assert!(e(&[header(0, 2, 10, "kimi-k3"), header(1, 2, 10, "kimi-k3")], 11).contains("split.tensors.count is 10, but the shards hold 11 tensors"));
        assert!(
            e(&[header(0, 2, 10, "deepseek2"), header(1, 2, 10, "deepseek2")], 10)
                .contains("general.architecture is \"deepseek2\"; the kimi-pack view needs \"kimi-k3\"")
        );
        let mut bare = header(1, 2, 10, "kimi-k3");
        bare.metadata.remove("general.architecture");
        assert!(e(&[header(0, 2, 10, "kimi-k3"), bare], 10).contains("k-00002-of-00002.gguf: GGUF metadata lacks general.architecture"));
        assert_eq!(pack_name(Path::new("/m/Kimi-K3-Q2-00001-of-00021.gguf"), None).unwrap(), "Kimi-K3-Q2.expert-major.pack");
        assert_eq!(pack_name(Path::new("/m/x-00001-of-00021.gguf"), Some("k3")).unwrap(), "k3.expert-major.pack");
        assert!(pack_name(Path::new("/m/model.gguf"), None).unwrap_err().to_string().contains("numbered shard set"));
    }

    #[test]
    fn sample_indices_like_python_round() {
        // sorted({round(i * (n - 1) / (s - 1)) for i in range(s)})
        assert_eq!(samples(6, 72), [0, 14, 28, 43, 57, 71]);
        assert_eq!(samples(6, 247296), [0, 49459, 98918, 148377, 197836, 247295]);
        assert_eq!(samples(5, 3), [0, 1, 2]);
        assert_eq!(samples(3, 4), [0, 2, 3]);
        assert_eq!(samples(1, 10), [0]);
        assert_eq!(samples(0, 10), Vec::<u64>::new());
        assert_eq!(samples(100, 10).len(), 10);
    }
}
