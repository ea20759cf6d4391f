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

use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use super::{Extent, Tree, ViewError, VirtualFile, ROOT_INO};
use crate::digest::{self, DigestStore, SourceDigests};
use crate::pyjson;
use crate::source::{Source, TensorInfo};

pub mod format;

pub use format::*;

const VIEW: &str = "expert-pack";

/// Identity and layout arguments of a pack (the seed's command-line arguments).
#[derive(Debug, Clone)]
pub struct PackOptions {
    /// File name stem: `<name>.pack`. Default: the source's stem.
    pub name: Option<String>,
    pub model_ref: String,
    /// Hex sha256; default: the sha256 of the source's header region.
    pub model_identity_sha256: Option<String>,
    /// Hex sha256 of the model config; default: from `config_blob`, else the header sha256.
    pub config_sha256: Option<String>,
    /// A config file whose sha256 is the config digest (checked against `config_sha256`).
    pub config_blob: Option<PathBuf>,
    pub num_layers: Option<u32>,
    pub num_experts: Option<u32>,
    pub top_k: Option<u32>,
    pub alignment: u64,
    /// Expected source sha256, verified.
    pub source_sha256: Option<String>,
    /// Directory the pack is seen in (mountpoint or output directory): the manifest's
    /// `pack_path` is `<pack_dir>/<name>.pack`.
    pub pack_dir: PathBuf,
    /// Recorded as `builder.command`.
    pub command: String,
    /// Building for materialize: the manifest is derived from the written pack's digest, and
    /// the seed's checkpoint file is part of the output.
    pub materialize: bool,
}

impl Default for PackOptions {
    fn default() -> Self {
        PackOptions {
            name: None,
            model_ref: "deepseek-v4-flash".into(),
            model_identity_sha256: None,
            config_sha256: None,
            config_blob: None,
            num_layers: None,
            num_experts: None,
            top_k: None,
            alignment: 4096,
            source_sha256: None,
            pack_dir: PathBuf::from("."),
            command: String::new(),
            materialize: false,
        }
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
pub fn plan(source: &Source, opts: &PackOptions) -> Result<Layout, ViewError> {
    if opts.alignment == 0 || !opts.alignment.is_power_of_two() {
        return Err(option_err("alignment", format!("{} is not a power of two", opts.alignment)));
    }
    let mut found: BTreeMap<(u32, usize), usize> = BTreeMap::new();
    for (i, t) in source.tensors.iter().enumerate() {
        if let Some(key) = parse_expert_name(&t.name) {
            if let Some(prev) = found.insert(key, i) {
                return Err(layout_err(format!(
                    "duplicate routed-expert tensor for layer {} role {}: {:?} and {:?}",
                    key.0, ROLE_NAMES[key.1], source.tensors[prev].name, t.name
                )));
            }
        }
    }
    if found.is_empty() {
        return Err(layout_err("the source has no routed-expert tensors named blk.N.ffn_{gate,up,down}_exps.weight"));
    }
    let num_layers = found.keys().map(|k| k.0).max().unwrap() + 1;
    if let Some(n) = opts.num_layers {
        if n != num_layers {
            return Err(option_err("num_layers", format!("{n} disagrees with the source, whose expert tensors cover layers 0..{num_layers}")));
        }
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
        if t.shape.len() != 3 {
            return Err(layout_err(format!("{}: expected a 3-dimensional expert tensor, shape is {:?}", t.name, t.shape)));
        }
        let e = t.shape[2];
        match num_experts {
            None => num_experts = Some(e),
            Some(prev) if prev != e => {
                return Err(layout_err(format!("{}: {e} experts, but other expert tensors have {prev}", t.name)));
            }
            _ => {}
        }
        if e == 0 || t.nbytes % e != 0 {
            return Err(layout_err(format!("{}: {} bytes do not split evenly into {e} experts", t.name, t.nbytes)));
        }
        let slice = t.nbytes / e;
        let elements = t.shape[0]
            .checked_mul(t.shape[1])
            .ok_or_else(|| layout_err(format!("{}: element count of shape {:?} overflows", t.name, t.shape)))?;
        if ggml_type.row_bytes(elements) != Some(slice) {
            return Err(layout_err(format!(
                "{}: expert slice of {slice} bytes does not hold {elements} {} elements",
                t.name, ggml_type
            )));
        }
        match role_nbytes {
            None => role_nbytes = Some((slice, t)),
            Some((prev, other)) if prev != slice => {
                return Err(layout_err(format!(
                    "triplet v1 requires uniform role sizes: {} has {slice} bytes per expert, {} has {prev}",
                    t.name, other.name
                )));
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
    if let Some(n) = opts.num_experts {
        if n != num_experts {
            return Err(option_err("num_experts", format!("{n} disagrees with the source's expert tensors, which hold {num_experts}")));
        }
    }
    if let Some(meta) = source.gguf() {
        if let Some(n) = meta.arch_u64("expert_count") {
            if n != num_experts as u64 {
                return Err(layout_err(format!("metadata expert_count is {n} but the expert tensors hold {num_experts} experts")));
            }
        }
    }
    if let Some(k) = opts.top_k {
        if k == 0 || k > num_experts {
            return Err(option_err("top_k", format!("{k} must be between 1 and the expert count {num_experts}")));
        }
    }
    let role_nbytes = role_nbytes.unwrap().0;
    let object_count = num_layers as u64 * num_experts as u64;
    let index_count = object_count * 3;
    let object_payload_bytes = role_nbytes * 3;
    let object_stride = align_up(object_payload_bytes, opts.alignment);
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
    /// Header, index and zero padding: the first `data_start` bytes of the pack.
    pub head: Arc<[u8]>,
    pub index_sha256: String,
    pub digests: SourceDigests,
    pub model_identity_sha256: String,
    pub config_sha256: String,
    pub top_k: u32,
}

impl ExpertPack {
    /// `layout` is [`plan`]'s result for the same source and options.
    pub fn new(source: &Source, layout: Layout, digests: SourceDigests, opts: &PackOptions) -> Result<ExpertPack, ViewError> {
        let model_identity = opts.model_identity_sha256.clone().unwrap_or_else(|| digests.header_sha256.clone()).to_ascii_lowercase();
        let model_identity_raw = parse_hex32("model_identity_sha256", &model_identity)?;
        let blob_sha = match &opts.config_blob {
            Some(p) => {
                let bytes = std::fs::read(p).map_err(|e| option_err("config_blob", format!("{}: {e}", p.display())))?;
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
            Some(k) => k,
            None => match source.gguf().and_then(|m| m.arch_u64("expert_used_count")) {
                Some(k) => k.min(u32::MAX as u64) as u32,
                // The seed's default, where the source does not say and it fits.
                None => 6.min(layout.num_experts),
            },
        };
        if top_k == 0 || top_k > layout.num_experts {
            return Err(option_err("top_k", format!("{top_k} must be between 1 and the expert count {}", layout.num_experts)));
        }
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
        let mut head = Vec::with_capacity(layout.data_start as usize);
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
        head.resize(layout.data_start as usize, 0);
        Ok(ExpertPack {
            name: opts.name.clone().unwrap_or_else(|| source.stem()),
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
    pub fn store_key(&self) -> String {
        format!("{VIEW}:{}", digest::sha256_hex(&self.head))
    }

    pub fn pack_file(&self, source: &Source) -> VirtualFile {
        let l = &self.layout;
        let mut f = VirtualFile::new();
        f.push(Extent::Bytes(self.head.clone()));
        let padding = l.object_stride - l.object_payload_bytes;
        for layer in 0..l.num_layers {
            for expert in 0..l.num_experts {
                for &ti in &l.roles[layer as usize] {
                    let t = &source.tensors[ti];
                    f.push(Extent::Source {
                        file: source.files[t.file].clone(),
                        offset: t.offset + expert as u64 * l.role_nbytes,
                        len: l.role_nbytes,
                    });
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

    pub fn manifest(&self, source: &ManifestSource, opts: &PackOptions, pack_path: &str, pack_sha256: &str) -> Value {
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
                "command": opts.command,
                "started_at": d.computed_at,
                "elapsed_s": d.elapsed_s,
            },
            "tensors": tensors,
        })
    }
}

/// Plan, digest and describe the expert-pack view: `<name>.pack` and its manifest.
///
/// For a mount the pack's sha256 (the manifest's `pack_sha256`) is obtained up front, from
/// the digest store or by hashing the pack once. For materialize (`opts.materialize`) the
/// manifest is a derived file instead: its digest comes from the pass that writes the pack,
/// and the seed's completed checkpoint file `<name>.pack.checkpoint.json` is added.
pub fn build(source: &Source, store: &DigestStore, opts: &PackOptions) -> Result<Tree, ViewError> {
    let layout = plan(source, opts)?; // fail on layout before any hashing
    let digests = digest::obtain(source, store, opts.source_sha256.as_deref())?;
    let pack = Arc::new(ExpertPack::new(source, layout, digests, opts)?);
    let file = Arc::new(pack.pack_file(source));
    let pack_name = format!("{}.pack", pack.name);
    let pack_path = opts.pack_dir.join(&pack_name).to_string_lossy().into_owned();
    let render = {
        let (pack, opts, pack_path) = (pack.clone(), opts.clone(), pack_path.clone());
        let source_info = ManifestSource::of(source);
        move |pack_sha256: &str| -> Vec<u8> {
            let mut text = pyjson::dumps(&pack.manifest(&source_info, &opts, &pack_path, pack_sha256), &pyjson::Style::PRETTY_SORTED);
            text.push('\n');
            text.into_bytes()
        }
    };
    // The pack's digest: remembered in the store with the source's digests.
    let pack_digest = {
        let (pack, file, store) = (pack.clone(), file.clone(), store.clone());
        let once: std::sync::OnceLock<String> = std::sync::OnceLock::new();
        move || -> Result<String, ViewError> {
            if let Some(h) = once.get() {
                return Ok(h.clone());
            }
            let key = pack.store_key();
            if let Some(h) = pack.digests.views.get(&key) {
                return Ok(h.clone());
            }
            if file.known_digest(0, file.size()).is_none() {
                tracing::info!("hashing the {} byte pack once to fill pack_sha256", file.size());
            }
            let h = file.sha256()?;
            let mut d = pack.digests.clone();
            d.views.insert(key, h.clone());
            if let Err(e) = store.save(&d) {
                tracing::warn!("could not store the pack digest: {e}");
            }
            Ok(once.get_or_init(|| h).clone())
        }
    };
    let mut tree = Tree::new();
    tree.add_file_arc(ROOT_INO, &pack_name, file.clone());
    let manifest_name = format!("{pack_name}.manifest.json");
    if !opts.materialize {
        let sha = pack_digest()?;
        tree.add_file(ROOT_INO, &manifest_name, VirtualFile::from_bytes(render(&sha)));
        return Ok(tree);
    }
    let len = render(&"0".repeat(64)).len() as u64;
    let pack_digest = Arc::new(pack_digest);
    let manifest = {
        let pack_digest = pack_digest.clone();
        Arc::new(VirtualFile::lazy(len, move || Ok(render(&pack_digest()?))))
    };
    tree.add_file_arc(ROOT_INO, &manifest_name, manifest.clone());
    let checkpoint = {
        let pack = pack.clone();
        let make = move |pack_sha256: &str, manifest_sha256: &str| -> Vec<u8> {
            let mut text = pyjson::dumps(&pack.checkpoint(pack_sha256, manifest_sha256), &pyjson::Style::PRETTY_SORTED);
            text.push('\n');
            text.into_bytes()
        };
        let zero = "0".repeat(64);
        let len = make(&zero, &zero).len() as u64;
        VirtualFile::lazy(len, move || Ok(make(&pack_digest()?, &manifest.sha256()?)))
    };
    tree.add_file(ROOT_INO, &format!("{pack_name}.checkpoint.json"), checkpoint);
    Ok(tree)
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
