//! The SGLang expert pack (`SGLANG-EXPERTPACK-v1`) of a GGUF source, as the first seed
//! (`sglang_expert_pack_build.py`) writes it, byte for byte.
//!
//! The pack is a header and a sorted index (literal bytes, built once the source's
//! digests are known, since the header carries the source sha256 and every index entry
//! its slice's sha256), followed by one object per (layer, expert): the gate, up and
//! down slices straight from the source, then zero padding to the object stride. The
//! manifest `<name>.pack.manifest.json` has the seed's keys; its `pack_sha256` is
//! computed once by reading the pack through this very view and then remembered in
//! the digest store next to the source digests.
//!
//! Layout constants and struct formats: `shared/reference/expert-pack.md`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::derived::{Derived, Input};
use super::{Context, Extent, Purpose, ROOT_INO, Tree, ViewError, ViewOptions, VirtualFile};
use crate::digest::{self, DigestStore, SourceDigests};
use crate::pyjson;
use crate::source::{Source, TensorInfo};
use crate::util::args::{hex64, int_in, power_of_two};

pub mod format;

pub use format::*;

const VIEW: &str = "expert-pack";

/// The seed's identity and layout arguments (`-o key=value` or `--key value`).
#[derive(Debug, Clone, clap::Args)]
#[group(id = "pack")]
pub struct Options {
    /// Model reference recorded in the manifest
    #[arg(long, default_value = "deepseek-v4-flash", help_heading = "Expert pack")]
    pub model_ref: String,
    /// Model identity digest, 64 hex (default: sha256 of the GGUF header region)
    #[arg(long, value_parser = hex64, help_heading = "Expert pack")]
    pub model_identity_sha256: Option<String>,
    /// Config digest, 64 hex (default: sha256 of config_blob, else of the GGUF header region)
    #[arg(long, value_parser = hex64, help_heading = "Expert pack")]
    pub config_sha256: Option<String>,
    /// Config file whose sha256 is the config digest (checked against config_sha256)
    #[arg(long, value_name = "FILE", help_heading = "Expert pack")]
    pub config_blob: Option<PathBuf>,
    /// Expected layer count (checked against the source)
    #[arg(long, value_parser = int_in::<u32>(1, 65536), help_heading = "Expert pack")]
    pub num_layers: Option<u32>,
    /// Expected routed-expert count (checked against the source)
    #[arg(long, value_parser = int_in::<u32>(1, 65536), help_heading = "Expert pack")]
    pub num_experts: Option<u32>,
    /// Experts per token recorded in the header (default: GGUF expert_used_count, else 6)
    #[arg(long, value_parser = int_in::<u32>(1, 65536), help_heading = "Expert pack")]
    pub top_k: Option<u32>,
    /// Pack alignment, a power of two
    #[arg(long, default_value = "4096", value_parser = power_of_two(1, MAX_ALIGNMENT), help_heading = "Expert pack")]
    pub alignment: u64,
    /// Expected sha256 of the source; the mount fails if it hashes differently
    #[arg(long, value_parser = hex64, help_heading = "Expert pack")]
    pub source_sha256: Option<String>,
}

impl Default for Options {
    fn default() -> Self {
        super::ViewOptions::default().pack
    }
}

/// Largest `config_blob` (a model config file).
pub const MAX_CONFIG_BLOB: u64 = 64 << 20;
/// Largest `alignment`: every object is padded to it, so the pack grows by up to this much
/// per object (all zeros, never held in memory).
pub const MAX_ALIGNMENT: u64 = 1 << 30;
/// Largest index (header region held in memory): 256 MiB, 818,000 entries; the full
/// DeepSeek V4-Flash pack's index is 10.6 MB.
pub const MAX_INDEX_BYTES: u64 = 256 << 20;

/// The expert-pack view.
pub struct ExpertPackView;

impl super::View for ExpertPackView {
    fn name(&self) -> &'static str {
        VIEW
    }
    fn summary(&self) -> &'static str {
        "SGLang expert pack (SGLANG-EXPERTPACK-v1) of a GGUF's routed experts, byte-identical to the seed"
    }
    fn is_default_for(&self, input: &super::Input) -> bool {
        matches!(input, super::Input::Checkpoint(s) if s.gguf().is_some())
    }
    fn build(&self, input: &super::Input, opts: &super::ViewOptions, ctx: &super::Context) -> Result<Tree, ViewError> {
        build(input.source(VIEW)?, opts, ctx)
    }
    fn verify(&self, _built: &crate::view::Built, out: &std::path::Path, written: &std::collections::HashMap<String, String>) -> Result<(), ViewError> {
        verify(out, written)
    }
}

fn layout_err(rule: impl Into<String>) -> ViewError {
    ViewError::Layout { view: VIEW, rule: rule.into() }
}

fn option_err(option: &'static str, rule: impl Into<String>) -> ViewError {
    ViewError::Option { option, rule: rule.into() }
}

pub fn align_up(value: u64, alignment: u64) -> u64 {
    value.div_ceil(alignment) * alignment
}

/// Where every routed-expert tensor is and how the pack is laid out.
#[derive(Debug, Clone)]
pub struct Layout {
    pub num_layers: u32,
    pub num_experts: u32,
    pub role_nbytes: u64,
    /// Per layer, indices into `source.tensors` of the gate, up and down tensors.
    pub roles: Vec<[usize; 3]>,
    pub alignment: u64,
    pub index_count: u64,
    pub data_start: u64,
    pub object_payload_bytes: u64,
    pub object_stride: u64,
    pub pack_size: u64,
}

impl Layout {
    pub fn object_offset(&self, layer: u32, expert: u32) -> u64 {
        self.data_start + (layer as u64 * self.num_experts as u64 + expert as u64) * self.object_stride
    }
}

/// `blk.{layer}.ffn_{gate|up|down}_exps.weight` -> (layer, role id).
pub fn parse_expert_name(name: &str) -> Option<(u32, usize)> {
    let rest = name.strip_prefix("blk.")?;
    let (layer, rest) = rest.split_once('.')?;
    if layer.is_empty() || !layer.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let role = rest.strip_prefix("ffn_")?.strip_suffix("_exps.weight")?;
    let role = ROLE_NAMES.iter().position(|r| *r == role)?;
    Some((layer.parse().ok()?, role))
}

/// Find the routed-expert tensors and derive the layout, with the seed's checks.
pub fn plan(source: &Source, opts: &Options) -> Result<Layout, ViewError> {
    if opts.alignment == 0 || !opts.alignment.is_power_of_two() || opts.alignment > MAX_ALIGNMENT {
        return Err(option_err("alignment", format!("{} is not a power of two from 1 to {MAX_ALIGNMENT}", opts.alignment)));
    }
    let mut found: BTreeMap<(u32, usize), usize> = BTreeMap::new();
    for (i, t) in source.tensors.iter().enumerate() {
        if let Some(key) = parse_expert_name(&t.name)
            && let Some(prev) = found.insert(key, i)
        {
            return Err(layout_err(format!(
                "duplicate routed-expert tensor for layer {} role {}: {:?} and {:?}",
                key.0, ROLE_NAMES[key.1], source.tensors[prev].name, t.name
            )));
        }
    }
    if found.is_empty() {
        return Err(layout_err("the source has no routed-expert tensors named blk.N.ffn_{gate,up,down}_exps.weight"));
    }
    let last = found.keys().map(|k| k.0).max().unwrap_or(0);
    if u64::from(last) > super::MAX_LAYER_INDEX {
        let name = found.iter().find(|(k, _)| k.0 == last).map(|(_, &i)| source.tensors[i].name.as_str()).unwrap_or("");
        return Err(layout_err(format!("{name}: layer index {last} is beyond any real model (at most {})", super::MAX_LAYER_INDEX)));
    }
    let num_layers = last + 1;
    if let Some(n) = opts.num_layers
        && n != num_layers
    {
        return Err(option_err("num_layers", format!("{n} disagrees with the source, whose expert tensors cover layers 0..{num_layers}")));
    }
    let mut roles = Vec::with_capacity(num_layers as usize);
    let mut missing = Vec::new();
    for layer in 0..num_layers {
        let mut r = [usize::MAX; 3];
        for (role, slot) in r.iter_mut().enumerate() {
            match found.get(&(layer, role)) {
                Some(&i) => *slot = i,
                None => missing.push(format!("blk.{layer}.ffn_{}_exps.weight", ROLE_NAMES[role])),
            }
        }
        roles.push(r);
    }
    if !missing.is_empty() {
        let n = missing.len();
        missing.truncate(8);
        return Err(layout_err(format!("routed-expert tensors missing ({n}): {}", missing.join(", "))));
    }

    let mut num_experts: Option<u64> = None;
    let mut role_nbytes: Option<(u64, &TensorInfo)> = None;
    for &i in roles.iter().flatten() {
        let t = &source.tensors[i];
        let Some(ggml_type) = t.dtype.ggml() else {
            return Err(layout_err(format!("{}: the expert pack needs a GGUF source", t.name)));
        };
        if t.shape.len() != 3 || t.shape.contains(&0) {
            return Err(layout_err(format!("{}: expected a 3-dimensional expert tensor without zero dimensions, shape is {:?}", t.name, t.shape)));
        }
        let e = t.shape[2];
        match num_experts {
            None => num_experts = Some(e),
            Some(prev) if prev != e => {
                return Err(layout_err(format!("{}: {e} experts, but other expert tensors have {prev}", t.name)));
            }
            _ => {}
        }
        if e == 0 || !t.nbytes.is_multiple_of(e) {
            return Err(layout_err(format!("{}: {} bytes do not split evenly into {e} experts", t.name, t.nbytes)));
        }
        let slice = t.nbytes / e;
        let elements = t.shape[0].checked_mul(t.shape[1]).ok_or_else(|| layout_err(format!("{}: element count of shape {:?} overflows", t.name, t.shape)))?;
        if ggml_type.row_bytes(elements) != Some(slice) {
            return Err(layout_err(format!("{}: expert slice of {slice} bytes does not hold {elements} {} elements", t.name, ggml_type)));
        }
        match role_nbytes {
            None => role_nbytes = Some((slice, t)),
            Some((prev, other)) if prev != slice => {
                return Err(layout_err(format!("triplet v1 requires uniform role sizes: {} has {slice} bytes per expert, {} has {prev}", t.name, other.name)));
            }
            _ => {}
        }
        if ggml_type.name.len() >= 16 {
            return Err(layout_err(format!("{}: type name {} does not fit the 16-byte dtype field", t.name, ggml_type)));
        }
        if t.name.len() > 80 {
            return Err(layout_err(format!("{}: name does not fit the 80-byte tensor_name field", t.name)));
        }
    }
    let num_experts = num_experts.unwrap();
    let num_experts = u32::try_from(num_experts).map_err(|_| layout_err(format!("{num_experts} experts do not fit u16 indices")))?;
    if num_experts > u16::MAX as u32 + 1 || num_layers > u16::MAX as u32 + 1 {
        return Err(layout_err("layer and expert numbers must fit the index's u16 fields"));
    }
    if let Some(n) = opts.num_experts
        && n != num_experts
    {
        return Err(option_err("num_experts", format!("{n} disagrees with the source's expert tensors, which hold {num_experts}")));
    }
    if let Some(meta) = source.gguf()
        && let Some(n) = meta.arch_u64("expert_count")
        && n != num_experts as u64
    {
        return Err(layout_err(format!("metadata expert_count is {n} but the expert tensors hold {num_experts} experts")));
    }
    if let Some(k) = opts.top_k
        && (k == 0 || k > num_experts)
    {
        return Err(option_err("top_k", format!("{k} must be between 1 and the expert count {num_experts}")));
    }
    let role_nbytes = role_nbytes.unwrap().0;
    let object_count = num_layers as u64 * num_experts as u64;
    let index_count = object_count * 3;
    let object_payload_bytes = role_nbytes * 3;
    let object_stride = align_up(object_payload_bytes, opts.alignment);
    if index_count * ENTRY_BYTES > MAX_INDEX_BYTES {
        return Err(layout_err(format!(
            "{num_layers} layers x {num_experts} experts need an index of {} bytes, more than the {MAX_INDEX_BYTES} this view holds",
            index_count * ENTRY_BYTES
        )));
    }
    let data_start = align_up(HEADER_BYTES + index_count * ENTRY_BYTES, opts.alignment);
    Ok(Layout {
        num_layers,
        num_experts,
        role_nbytes,
        roles,
        alignment: opts.alignment,
        index_count,
        data_start,
        object_payload_bytes,
        object_stride,
        pack_size: data_start + object_count * object_stride,
    })
}

fn parse_hex32(option: &'static str, s: &str) -> Result<[u8; 32], ViewError> {
    let mut out = [0u8; 32];
    hex::decode_to_slice(s, &mut out).map_err(|_| option_err(option, format!("{s:?} is not 64 hex digits")))?;
    Ok(out)
}

/// Build identity: crate version and git revision this binary was built from.
pub fn tool_sha256() -> String {
    digest::sha256_hex(format!("xpackfs {} {}", env!("CARGO_PKG_VERSION"), crate::GIT_SHA).as_bytes())
}

/// A planned, digested pack: header+index bytes and everything the manifest needs.
pub struct ExpertPack {
    pub layout: Layout,
    pub name: String,
    pub header: PackHeader,
    /// Header and index (zero padding follows up to `data_start`).
    pub head: Arc<[u8]>,
    pub index_sha256: String,
    pub digests: SourceDigests,
    pub model_identity_sha256: String,
    pub config_sha256: String,
    pub top_k: u32,
}

impl ExpertPack {
    /// `layout` is [`plan`]'s result for the same source and options.
    pub fn new(source: &Source, layout: Layout, digests: SourceDigests, opts: &Options, name: Option<&str>) -> Result<ExpertPack, ViewError> {
        let model_identity = opts.model_identity_sha256.clone().unwrap_or_else(|| digests.header_sha256.clone()).to_ascii_lowercase();
        let model_identity_raw = parse_hex32("model_identity_sha256", &model_identity)?;
        let blob_sha = match &opts.config_blob {
            Some(p) => {
                let bytes = crate::fsutil::read_limited(p, MAX_CONFIG_BLOB).map_err(|e| option_err("config_blob", format!("{}: {e}", p.display())))?;
                Some(digest::sha256_hex(&bytes))
            }
            None => None,
        };
        let config = match (&opts.config_sha256, blob_sha) {
            (Some(c), Some(b)) if !c.eq_ignore_ascii_case(&b) => {
                return Err(option_err("config_blob", format!("the config blob hashes to {b}, not config_sha256 {c}")));
            }
            (Some(c), _) => c.to_ascii_lowercase(),
            (None, Some(b)) => b,
            (None, None) => digests.header_sha256.clone(),
        };
        let config_raw = parse_hex32("config_sha256", &config)?;
        let source_raw = parse_hex32("source_sha256", &digests.source_sha256)?;
        let top_k = match opts.top_k {
            Some(k) if k == 0 || k > layout.num_experts => {
                return Err(option_err("top_k", format!("{k} must be between 1 and the expert count {}", layout.num_experts)));
            }
            Some(k) => k,
            None => match source.gguf().and_then(|m| m.arch_u64("expert_used_count")) {
                Some(k) if k == 0 || k > layout.num_experts as u64 => {
                    let arch = source.gguf().and_then(|m| m.get("general.architecture")).and_then(|v| v.as_str()).unwrap_or("");
                    return Err(layout_err(format!(
                        "GGUF metadata {arch}.expert_used_count is {k}, not between 1 and the expert count {}: give the real value with top_k=N",
                        layout.num_experts
                    )));
                }
                Some(k) => k as u32,
                // The seed's default, where the source does not say and it fits.
                None => 6.min(layout.num_experts),
            },
        };
        let header = PackHeader {
            version: VERSION,
            header_bytes: HEADER_BYTES as u32,
            entry_bytes: ENTRY_BYTES as u32,
            flags: FLAG_IDENTITY_PAYLOAD | FLAG_TRIPLET_OBJECTS,
            index_count: layout.index_count,
            data_start: layout.data_start,
            alignment: layout.alignment,
            num_layers: layout.num_layers,
            num_experts: layout.num_experts,
            top_k,
            role_count: 3,
            model_identity_sha256: model_identity_raw,
            source_blob_sha256: source_raw,
            config_sha256: config_raw,
        };
        let mut head = Vec::with_capacity((HEADER_BYTES + layout.index_count * ENTRY_BYTES) as usize);
        head.extend_from_slice(&header.encode());
        for layer in 0..layout.num_layers {
            for expert in 0..layout.num_experts {
                let generation = generation(&model_identity, &digests.source_sha256, layer, expert);
                for (role, &ti) in layout.roles[layer as usize].iter().enumerate() {
                    let t = &source.tensors[ti];
                    let g = t.dtype.ggml().ok_or_else(|| ViewError::Internal(format!("{} is not a ggml tensor", t.name)))?;
                    let td = digests.tensors.get(&t.name).ok_or_else(|| ViewError::Internal(format!("no digest for {}", t.name)))?;
                    let slice_hex = td.slices.get(expert as usize).ok_or_else(|| ViewError::Internal(format!("no slice digest for {}", t.name)))?;
                    let slice_sha = parse_hex32("slice digest", slice_hex)?;
                    let mut shape = [0u64; 4];
                    shape[..2].copy_from_slice(&t.shape[..2]);
                    IndexEntry {
                        layer: layer as u16,
                        expert: expert as u16,
                        role_id: role as u8,
                        rank: (t.shape.len() - 1) as u8,
                        dtype_id: g.id as u16,
                        dtype: g.name.to_string(),
                        tensor_name: t.name.clone(),
                        source_tensor_offset: t.logical_offset,
                        source_tensor_nbytes: t.nbytes,
                        source_slice_offset: t.logical_offset + expert as u64 * layout.role_nbytes,
                        source_slice_nbytes: layout.role_nbytes,
                        pack_offset: layout.object_offset(layer, expert) + role as u64 * layout.role_nbytes,
                        pack_nbytes: layout.role_nbytes,
                        source_tensor_sha256: parse_hex32("tensor digest", &td.sha256)?,
                        source_slice_sha256: slice_sha,
                        checksum: slice_sha,
                        shape,
                        quant_scheme: g.name.to_string(),
                        transform_id: TRANSFORM_ID.to_string(),
                        block_size: g.block_size,
                        generation,
                    }
                    .encode_into(&mut head);
                }
            }
        }
        let index_sha256 = digest::sha256_hex(&head[HEADER_BYTES as usize..]);
        Ok(ExpertPack {
            name: name.map(str::to_string).unwrap_or_else(|| source.stem()),
            layout,
            header,
            head: head.into(),
            index_sha256,
            digests,
            model_identity_sha256: model_identity,
            config_sha256: config,
            top_k,
        })
    }

    /// Key under which this pack's sha256 is remembered: it is determined by the
    /// header and index (which hold every parameter and every slice digest).
    /// What the pack's bytes depend on besides the source files: its header and index (which
    /// hold the source's digests) and its layout.
    pub fn store_params(&self) -> String {
        format!("{}:{}", digest::sha256_hex(&self.head), self.layout.pack_size)
    }

    pub fn pack_file(&self, source: &Source) -> VirtualFile {
        let l = &self.layout;
        let mut f = VirtualFile::new();
        f.push(Extent::Bytes(self.head.clone()));
        f.push(Extent::Zeros(l.data_start - self.head.len() as u64));
        let padding = l.object_stride - l.object_payload_bytes;
        for layer in 0..l.num_layers {
            for expert in 0..l.num_experts {
                for &ti in &l.roles[layer as usize] {
                    let t = &source.tensors[ti];
                    f.push(Extent::Source { file: source.files[t.file].clone(), offset: t.offset + expert as u64 * l.role_nbytes, len: l.role_nbytes });
                }
                f.push(Extent::Zeros(padding));
            }
        }
        debug_assert_eq!(f.size(), l.pack_size);
        f
    }

    /// The seed's checkpoint file in its final state (`status: complete`): every layer
    /// completed, every index entry as `IndexEntry.to_dict()` gives it. Its times are the
    /// digest pass's, like the manifest's, so the bytes do not depend on when it is written.
    pub fn checkpoint(&self, pack_sha256: &str, manifest_sha256: &str) -> Value {
        let l = &self.layout;
        let d = &self.digests;
        let index = &self.head[HEADER_BYTES as usize..(HEADER_BYTES + l.index_count * ENTRY_BYTES) as usize];
        let entries: Vec<Value> = index
            .chunks(ENTRY_BYTES as usize)
            .map(|raw| {
                let e = IndexEntry::decode(raw);
                json!({
                    "layer": e.layer, "expert": e.expert, "role": ROLE_NAMES[e.role_id as usize],
                    "dtype_id": e.dtype_id, "dtype": e.dtype, "tensor_name": e.tensor_name,
                    "source_tensor_offset": e.source_tensor_offset, "source_tensor_nbytes": e.source_tensor_nbytes,
                    "source_slice_offset": e.source_slice_offset, "source_slice_nbytes": e.source_slice_nbytes,
                    "pack_offset": e.pack_offset, "pack_nbytes": e.pack_nbytes,
                    "source_tensor_sha256": digest::hex(&e.source_tensor_sha256),
                    "source_slice_sha256": digest::hex(&e.source_slice_sha256),
                    "checksum": digest::hex(&e.checksum),
                    "shape": &e.shape[..e.rank as usize],
                    "quant_scheme": e.quant_scheme, "transform_id": e.transform_id,
                    "block_size": e.block_size, "generation": e.generation,
                })
            })
            .collect();
        json!({
            "format": format!("{FORMAT}-checkpoint"),
            "version": 1,
            "status": "complete",
            "started_at": d.computed_at,
            "completed_at": d.computed_at,
            "source_sha256": d.source_sha256,
            "model_identity_sha256": self.model_identity_sha256,
            "config_sha256": self.config_sha256,
            "tool_sha256": tool_sha256(),
            "expected_pack_bytes": l.pack_size,
            "completed_layers": (0..l.num_layers).collect::<Vec<_>>(),
            "pack_end": l.pack_size,
            "entries": entries,
            "manifest_sha256": manifest_sha256,
            "pack_sha256": pack_sha256,
        })
    }

    pub fn manifest(&self, source: &ManifestSource, opts: &Options, command: &str, pack_path: &str, pack_sha256: &str) -> Value {
        let l = &self.layout;
        let d = &self.digests;
        let routed: std::collections::HashSet<usize> = l.roles.iter().flatten().copied().collect();
        let mut sorted: Vec<(usize, &TensorInfo)> = source.tensors.iter().enumerate().collect();
        sorted.sort_by(|a, b| a.1.name.cmp(&b.1.name));
        let mut inventory = Sha256::new();
        let mut tensors = Vec::with_capacity(sorted.len());
        for (i, t) in &sorted {
            let sha = &d.tensors[&t.name].sha256;
            let (type_name, type_id) = match t.dtype.ggml() {
                Some(g) => (g.name.to_string(), g.id),
                None => (t.dtype.name(), u32::MAX),
            };
            let record = json!({
                "kind": "tensor", "name": t.name, "shape": t.shape, "type": type_name,
                "type_id": type_id, "offset": t.logical_offset, "nbytes": t.nbytes, "sha256": sha,
            });
            inventory.update(pyjson::dumps(&record, &pyjson::Style::DEFAULT_SORTED).as_bytes());
            inventory.update(b"\n");
            let is_routed = routed.contains(i);
            tensors.push(json!({
                "name": t.name,
                "shape": t.shape,
                "type": type_name,
                "type_id": type_id,
                "source_offset": t.logical_offset,
                "source_nbytes": t.nbytes,
                "source_payload_sha256": sha,
                "category": if is_routed { "routed_expert" } else { "non_routed" },
                "mapping": if is_routed { "expert_pack_identity" } else { "gguf_direct_identity" },
                "scale_storage": if type_name == "MXFP4" { "inline_quant_block" } else { "tensor_native" },
            }));
        }
        let payload_bytes = l.index_count * l.role_nbytes;
        let data_offset = source.data_offset;
        json!({
            "format": FORMAT,
            "version": 1,
            "complete": true,
            "created_at": d.computed_at,
            "layout": "triplet_identity",
            "role_order": ROLE_NAMES,
            "alignment": l.alignment,
            "pack_path": pack_path,
            "pack_size": l.pack_size,
            "pack_sha256": pack_sha256,
            "header_bytes": HEADER_BYTES,
            "index_count": l.index_count,
            "index_entry_bytes": ENTRY_BYTES,
            "index_sha256": self.index_sha256,
            "data_start": l.data_start,
            "object_count": l.num_layers as u64 * l.num_experts as u64,
            "object_payload_bytes": l.object_payload_bytes,
            "object_stride": l.object_stride,
            "role_bytes": l.role_nbytes,
            "payload_bytes": payload_bytes,
            "padding_bytes": l.pack_size - l.data_start - payload_bytes,
            "model": {
                "ref": opts.model_ref,
                "model_identity_sha256": self.model_identity_sha256,
                "config_sha256": self.config_sha256,
                "num_layers": l.num_layers,
                "num_routed_experts": l.num_experts,
                "top_k": self.top_k,
                "single_gpu": true,
            },
            "source": {
                "path": source.path,
                "size": source.size,
                "sha256": d.source_sha256,
                "gguf_data_offset": data_offset,
                "gguf_metadata_sha256": d.header_sha256,
                "inventory_path": null,
                "inventory_sha256": digest::hex(&inventory.finalize()),
                "tensor_count": source.tensors.len(),
            },
            "coverage": {
                "layers": (0..l.num_layers).collect::<Vec<_>>(),
                "experts_per_layer": l.num_experts,
                "roles": ROLE_NAMES,
                "routed_tensor_count": routed.len(),
                "non_routed_tensor_count": source.tensors.len() - routed.len(),
            },
            "transform": {
                "id": TRANSFORM_ID,
                "description": "Contiguous source bytes; no dequantization, requantization, or value transform",
                "reversible": true,
                "tool_sha256": tool_sha256(),
            },
            "builder": {
                "git_sha": crate::GIT_SHA,
                "python": format!("xpackfs {} (Rust; no Python)", env!("CARGO_PKG_VERSION")),
                "command": command,
                "started_at": d.computed_at,
                "elapsed_s": d.elapsed_s,
            },
            "tensors": tensors,
        })
    }
}

/// Plan, digest and describe the expert-pack view: `<name>.pack` and its manifest.
///
/// The manifest's `pack_sha256` is the pack's own digest, a [`Derived`] input remembered in
/// the digest store. A mount renders the manifest at build time (SGLang reads it at start-up:
/// the first mount of a source hashes the pack once, later ones find the digest remembered).
/// For materialize it is a derived file, rendered from the digest taken while writing the
/// pack, and the seed's completed checkpoint file `<name>.pack.checkpoint.json` is added.
pub fn build(source: &Source, opts: &ViewOptions, ctx: &Context) -> Result<Tree, ViewError> {
    let layout = plan(source, &opts.pack)?; // fail on layout before any hashing
    let digests = digest::obtain(source, &ctx.store, opts.pack.source_sha256.as_deref())?;
    let pack = Arc::new(ExpertPack::new(source, layout, digests, &opts.pack, opts.name.as_deref())?);
    let file = Arc::new(pack.pack_file(source));
    let pack_name = format!("{}.pack", pack.name);
    let pack_path = ctx.location.join(&pack_name).to_string_lossy().into_owned();
    let mut tree = Tree::new();
    tree.add_file_arc(ROOT_INO, &pack_name, file.clone());

    let manifest = {
        let (pack, popts, command) = (pack.clone(), opts.pack.clone(), ctx.command.clone());
        let source_info = ManifestSource::of(source);
        let key = DigestStore::view_key(VIEW, &pack.store_params(), &source.files);
        Derived::new(format!("{pack_name}.manifest.json"), &ctx.store, key, vec![Input::whole(&file)], move |h| {
            let mut text = pyjson::dumps(&pack.manifest(&source_info, &popts, &command, &pack_path, &h[0]), &pyjson::Style::PRETTY_SORTED);
            text.push('\n');
            text.into_bytes()
        })
    };
    let manifest_name = format!("{pack_name}.manifest.json");
    if ctx.purpose == Purpose::Mount {
        tree.add_file(ROOT_INO, &manifest_name, manifest.into_file_now()?);
        return Ok(tree);
    }
    let manifest = Arc::new(manifest.into_file());
    tree.add_file_arc(ROOT_INO, &manifest_name, manifest.clone());
    // The checkpoint holds the digests of the two files just written (nothing to remember).
    let checkpoint = Derived::new(
        format!("{pack_name}.checkpoint.json"),
        &DigestStore { dir: None },
        String::new(),
        vec![Input::whole(&file), Input::whole(&manifest)],
        move |h| {
            let mut text = pyjson::dumps(&pack.checkpoint(&h[0], &h[1]), &pyjson::Style::PRETTY_SORTED);
            text.push('\n');
            text.into_bytes()
        },
    );
    tree.add_file(ROOT_INO, &format!("{pack_name}.checkpoint.json"), checkpoint.into_file());
    Ok(tree)
}

/// `materialize --verify`: `pack_sha256` of the manifest, and the checkpoint's
/// `pack_sha256` / `manifest_sha256`, against the written files.
fn verify(out: &std::path::Path, written: &std::collections::HashMap<String, String>) -> Result<(), ViewError> {
    for (name, _) in written.iter() {
        let refuse = |rule: String| ViewError::Verify { file: name.clone(), rule };
        if let Some(pack) = name.strip_suffix(".manifest.json").filter(|p| p.ends_with(".pack")) {
            if super::derived::read_json(out, name)?["pack_sha256"].as_str() != written.get(pack).map(String::as_str) {
                return Err(refuse(format!("pack_sha256 does not match {pack}")));
            }
        } else if let Some(pack) = name.strip_suffix(".checkpoint.json").filter(|p| p.ends_with(".pack")) {
            let c = super::derived::read_json(out, name)?;
            let manifest = format!("{pack}.manifest.json");
            if c["pack_sha256"].as_str() != written.get(pack).map(String::as_str) || c["manifest_sha256"].as_str() != written.get(&manifest).map(String::as_str)
            {
                return Err(refuse(format!("does not match {pack} and {manifest}")));
            }
        }
    }
    Ok(())
}

/// What the manifest says about the source (kept instead of the source itself).
#[derive(Debug, Clone)]
pub struct ManifestSource {
    path: String,
    size: u64,
    data_offset: u64,
    tensors: Vec<crate::source::TensorInfo>,
}

impl ManifestSource {
    pub fn of(source: &Source) -> Self {
        ManifestSource {
            path: source.files[0].path().to_string_lossy().into_owned(),
            size: source.logical_size(),
            data_offset: source.gguf().map(|m| m.headers[0].data_offset).unwrap_or(0),
            tensors: source.tensors.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expert_names() {
        assert_eq!(parse_expert_name("blk.12.ffn_down_exps.weight"), Some((12, 2)));
        assert_eq!(parse_expert_name("blk.0.ffn_gate_exps.weight"), Some((0, 0)));
        assert_eq!(parse_expert_name("blk.0.ffn_gate_shexp.weight"), None);
        assert_eq!(parse_expert_name("blk..ffn_up_exps.weight"), None);
        assert_eq!(parse_expert_name("blk.x.ffn_up_exps.weight"), None);
    }
}
