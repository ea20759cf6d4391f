//! SGLang's second pack format: the Kimi K3 `GGMLMOEPACKv1` pack of a GGUF shard set
//! (`NAME-0000N-of-0000M.gguf`, architecture `kimi-k3`), byte for byte what SGLang's
//! `kimi_ggml.write_ggml_moe_pack` writes, and its adapter manifest
//! (`SGLANG-KIMI-GGMLMOEPACK-ADAPTER-v1`, `kimi_ggml.create_manifest`'s keys and values).
//!
//! `NAME.expert-major.pack` is a header and a 152-byte-per-entry index (literal bytes),
//! then per active layer, per expert, the up, gate and down slices of the source tensors,
//! each at the next 4 KiB boundary with zeros between: every payload byte is served from
//! the source (`Extent::Source`), so, like the first pack, it is a copy of source bytes the
//! mount's page cache holds, its source read around the page cache. The pack
//! holds no digest, so a mount reads only headers. The manifest `NAME.expert-major.pack.manifest.json`
//! appears when the model's `config.json` and tokenizer directory are given; the digests
//! it holds come from the headers (`metadata_sha256`), the config and tokenizer files, and
//! with `full_source_hashes` / `full_pack_hash` from the digest machinery: the one pass over
//! the source and the pack hashed once through this view, both remembered in the digest
//! store.
//!
//! SGLang's checks run at mount ([`plan`]); [`validate`] is `validate_ggml_moe_pack` for
//! `materialize --verify`. The on-disk structs are in [`format`].

pub mod format;
pub mod plan;
pub mod validate;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::{Value, json};

use super::derived::{Derived, Input};
use super::{Extent, ROOT_INO, Tree, ViewError, VirtualFile};
use crate::digest::{self, DigestStore};
use crate::pyjson::{self, Style};
use crate::source::Source;
pub use format::Role;
pub use plan::{Experts, KimiError, Layout, ModelCheck, ModelSpec, PackSpec};

const VIEW: &str = "kimi-pack";
/// Caps on the inputs read whole at mount.
const MAX_CONFIG_BYTES: u64 = 64 << 20;
const MAX_TOKENIZER_FILES: usize = 100_000;

/// The view's options (`-o key=value` or `--key value`).
#[derive(Debug, Clone, clap::Args)]
#[group(id = "kimi")]
pub struct Options {
    /// kimi-pack: the model's config.json; with tokenizer_dir, the adapter manifest is served
    #[arg(long, value_name = "FILE", help_heading = "Kimi pack")]
    pub model_config: Option<PathBuf>,
    /// kimi-pack: the tokenizer directory the adapter manifest lists
    #[arg(long, value_name = "DIR", help_heading = "Kimi pack")]
    pub tokenizer_dir: Option<PathBuf>,
    /// kimi-pack: audited (only the audited Kimi K3 dimensions, as SGLang) or layout (any model
    /// of the same layout)
    #[arg(long, default_value = "audited", value_parser = ModelCheck::parse_option, help_heading = "Kimi pack")]
    pub model_check: ModelCheck,
    /// kimi-pack: sampled entries the manifest reports as verified (as SGLang)
    #[arg(long, default_value = "6", value_parser = crate::util::args::int_in::<u64>(0, 1 << 20), help_heading = "Kimi pack")]
    pub payload_samples: u64,
    /// kimi-pack: per-shard sha256 in the manifest (one pass over the source, remembered)
    #[arg(long, help_heading = "Kimi pack")]
    pub full_source_hashes: bool,
    /// kimi-pack: the pack's sha256 in the manifest (the pack hashed once, remembered)
    #[arg(long, help_heading = "Kimi pack")]
    pub full_pack_hash: bool,
}

/// The Kimi K3 pack view.
pub struct KimiPackView;

impl super::View for KimiPackView {
    fn name(&self) -> &'static str {
        VIEW
    }
    fn summary(&self) -> &'static str {
        "SGLang's Kimi K3 expert-major pack (GGMLMOEPACKv1) of a GGUF shard set, byte-identical to write_ggml_moe_pack"
    }
    fn build(&self, input: &super::Input, opts: &super::ViewOptions, ctx: &super::Context) -> Result<Tree, ViewError> {
        let o = &opts.kimi;
        let kimi = KimiOptions {
            name: opts.name.clone(),
            model_config: o.model_config.clone(),
            tokenizer_dir: o.tokenizer_dir.clone(),
            model_check: o.model_check,
            payload_samples: o.payload_samples,
            full_source_hashes: o.full_source_hashes,
            full_pack_hash: o.full_pack_hash,
            pack_dir: ctx.location.clone(),
            materialize: ctx.purpose == super::Purpose::Materialize,
        };
        build(input.source(VIEW)?, &ctx.store, &kimi)
    }
    /// `validate_ggml_moe_pack`'s checks with the full hash, and the manifest's `expert_pack`.
    fn verify(&self, built: &super::Built, out: &Path, written: &std::collections::HashMap<String, String>) -> Result<(), ViewError> {
        let source = built.input.source(VIEW)?;
        for (name, sha) in written {
            if !name.ends_with(".pack") {
                continue;
            }
            let manifest_name = format!("{name}.manifest.json");
            let manifest = if written.contains_key(&manifest_name) { Some(super::derived::read_json(out, &manifest_name)?) } else { None };
            validate::verify_written(&out.join(name), source, sha, manifest.as_ref())
                .map_err(|e| ViewError::Verify { file: name.clone(), rule: e.to_string() })?;
            if manifest.as_ref().is_some_and(|m| m["source"]["summary"]["full_source_hashes"] == true) {
                verify_stated(source).map_err(|e| ViewError::Verify { file: manifest_name, rule: e.to_string() })?;
            }
        }
        Ok(())
    }
}

/// The per-shard sha256 a manifest took from what the store states (a Hub repository's LFS
/// oids, [`digest::files_sha256`]) checked against the bytes: `materialize --verify` vouches
/// for what it wrote, not for the store's word. (Digests from a digest pass were hashed from
/// the bytes already, and are checked against the statement there.)
fn verify_stated(source: &Source) -> Result<(), Unvouched> {
    let stated: Vec<_> = source.files.iter().filter_map(|f| Some((f.path().to_path_buf(), f.stated_sha256()?.to_ascii_lowercase()))).collect();
    if stated.is_empty() {
        return Ok(());
    }
    let (paths, expected): (Vec<_>, Vec<_>) = stated.into_iter().unzip();
    let hashed = digest::lanes::sha256_files(&paths, Some(&expected));
    for ((path, want), got) in paths.iter().zip(&expected).zip(hashed) {
        match got {
            Some(got) if &got == want => {}
            Some(got) => return Err(Unvouched::Differs { path: path.clone(), stated: want.clone(), actual: got }),
            None => return Err(Unvouched::Unreadable(path.clone())),
        }
    }
    Ok(())
}

/// Why [`verify_stated`] does not vouch for the sha256 a store states for a shard.
#[derive(Debug, thiserror::Error)]
enum Unvouched {
    #[error("{}: the store states sha256 {stated}, the bytes read hash to {actual}", path.display())]
    Differs { path: PathBuf, stated: String, actual: String },
    #[error("{}: could not be read again to check the sha256 the store states", .0.display())]
    Unreadable(PathBuf),
}

/// What [`build`] takes: the options and where and for what the pack is built.
#[derive(Debug, Clone)]
pub struct KimiOptions {
    /// NAME of `NAME.expert-major.pack`; default: the shard set's name.
    pub name: Option<String>,
    /// The model's `config.json`; with `tokenizer_dir`, the manifest is served.
    pub model_config: Option<PathBuf>,
    pub tokenizer_dir: Option<PathBuf>,
    pub model_check: ModelCheck,
    /// `create_manifest(payload_samples=)`: the sampled entries the manifest reports.
    pub payload_samples: u64,
    /// Per-shard sha256 in the manifest (`--full-source-hashes`): the one digest pass.
    pub full_source_hashes: bool,
    /// The pack's sha256 in the manifest (`--full-pack-hash`): the pack hashed once.
    pub full_pack_hash: bool,
    /// Directory the pack is seen in (mountpoint, or materialize's output): the
    /// manifest's `expert_pack.path` names the pack there.
    pub pack_dir: PathBuf,
    /// Building for materialize: the pack's digest comes from the pass that writes it.
    pub materialize: bool,
}

impl Default for KimiOptions {
    fn default() -> Self {
        KimiOptions {
            name: None,
            model_config: None,
            tokenizer_dir: None,
            model_check: ModelCheck::Audited,
            payload_samples: 6,
            full_source_hashes: false,
            full_pack_hash: false,
            pack_dir: PathBuf::from("."),
            materialize: false,
        }
    }
}

impl From<KimiError> for ViewError {
    fn from(e: KimiError) -> ViewError {
        match e {
            KimiError::Option { option, rule } => ViewError::Option { option, rule },
            e => ViewError::Layout { view: VIEW, rule: e.to_string() },
        }
    }
}

/// The checked plan of a shard set: its shards, the model, the expert tensors, the layout.
#[derive(Debug, Clone)]
pub struct Plan {
    pub shards: Vec<PathBuf>,
    pub spec: PackSpec,
    pub model: Option<ModelSpec>,
    pub experts: Experts,
    pub layout: Layout,
    pub pack_name: String,
}

impl Plan {
    /// Every check SGLang makes before writing a pack, from the source's headers and the
    /// parsed config (`(config, its path)`), in SGLang's order: shard set, model, experts.
    pub fn new(source: &Source, config: Option<(&Value, &Path)>, mode: ModelCheck, name: Option<&str>) -> Result<Plan, KimiError> {
        let shards: Vec<PathBuf> = source.files.iter().map(|f| f.path().to_path_buf()).collect();
        let meta = source.gguf().ok_or_else(|| KimiError::Shard { shard: shards[0].clone(), rule: "the kimi-pack view needs a GGUF shard set".into() })?;
        let pack_name = plan::pack_name(&shards[0], name)?;
        plan::check_shards(&shards, &meta.headers, source.tensors.len())?;
        let model = config.map(|(c, p)| ModelSpec::from_config(c, p)).transpose()?;
        let spec = match &model {
            Some(m) => m.pack_spec(),
            None => PackSpec::from_gguf(meta.metadata(), &source.tensors, &shards)?,
        };
        plan::check_model(&spec, model.as_ref(), mode)?;
        Self::with_spec(source, shards, spec, model, pack_name)
    }

    fn with_spec(source: &Source, shards: Vec<PathBuf>, spec: PackSpec, model: Option<ModelSpec>, pack_name: String) -> Result<Plan, KimiError> {
        let experts = plan::expert_tensors(&source.tensors, &shards, &spec)?;
        let layout = Layout::new(&spec, &experts)?;
        Ok(Plan { shards, spec, model, experts, layout, pack_name })
    }

    /// The pack file: header and index, then every slice from the source, zeros between.
    pub fn pack_file(&self, source: &Source, head: Arc<[u8]>) -> VirtualFile {
        let l = &self.layout;
        let mut f = VirtualFile::new();
        f.push(Extent::Bytes(head));
        for (li, idx) in self.experts.layers.iter().enumerate() {
            for expert in 0..l.num_experts {
                for role in Role::ORDER {
                    let at = l.entry_offset(li as u64, expert, role);
                    f.push(Extent::Zeros(at - f.size()));
                    let t = &source.tensors[idx[role as usize]];
                    let len = l.expert_bytes[role as usize];
                    f.push(Extent::Source { file: source.files[t.file].clone(), offset: t.offset + expert * len, len });
                }
            }
        }
        debug_assert_eq!(f.size(), l.pack_size);
        f
    }

    /// `validate_ggml_moe_pack`'s result for this pack (the manifest's `expert_pack`).
    pub fn pack_record(&self, path: &str, index_sha256: &str, payload_samples: u64, sha256: Option<&str>) -> Value {
        let l = &self.layout;
        let mut roles = serde_json::Map::new();
        for role in Role::ORDER {
            let g = role.dtype();
            // The tensors' first two dimensions (checked by the planner).
            let (h, i) = (self.spec.expert_hidden, self.spec.intermediate);
            let logical_shape = if role == Role::Down { [i, h] } else { [h, i] };
            roles.insert(
                role.name().into(),
                json!({
                    "dtype": g.name, "dtype_id": g.id, "logical_shape": logical_shape,
                    "expert_bytes": l.expert_bytes[role as usize],
                    "entry_count": l.num_layers * l.num_experts,
                    "payload_bytes": l.num_layers * l.num_experts * l.expert_bytes[role as usize],
                }),
            );
        }
        let mut v = json!({
            "path": path,
            "size": l.pack_size,
            "magic": format::MAGIC_NAME,
            "version": format::VERSION,
            "header_bytes": format::HEADER_BYTES,
            "entry_bytes": format::ENTRY_BYTES,
            "index_count": l.index_count,
            "data_start": l.data_start,
            "alignment": format::ALIGNMENT,
            "index_sha256": index_sha256,
            "physical_role_order": Role::ORDER.map(Role::name),
            "active_moe_layer_ids": self.spec.active_layers().collect::<Vec<_>>(),
            "num_experts": l.num_experts,
            "top_k": self.spec.top_k,
            "object_bytes": l.object_span,
            "roles": roles,
            "payload_samples_verified": plan::samples(payload_samples, l.index_count).len(),
            "full_pack_hash": sha256.is_some(),
        });
        if let Some(h) = sha256 {
            v["sha256"] = h.into();
        }
        v
    }
}

fn io_err(path: &Path, e: std::io::Error) -> ViewError {
    ViewError::Source(crate::source::SourceError::Io { path: path.to_path_buf(), source: e })
}

fn resolve(path: &Path) -> PathBuf {
    std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf())
}

/// `json.dumps(v, ensure_ascii=False, sort_keys=True, separators=(",", ":"))`, hashed
/// (`kimi_ggml.canonical_sha256`).
pub fn canonical_sha256(v: &Value) -> String {
    digest::sha256_hex(pyjson::dumps(v, &Style { ensure_ascii: false, ..Style::CANONICAL }).as_bytes())
}

struct Config {
    path: PathBuf,
    value: Value,
    sha256: String,
    mtime_ns: i128,
}

fn mtime_ns(m: &std::fs::Metadata) -> i128 {
    crate::source::FileIdentity::of(m).mtime_ns
}

fn read_config(path: &Path) -> Result<Config, ViewError> {
    let meta = std::fs::metadata(path).map_err(|e| io_err(path, e))?;
    if !meta.is_file() || meta.len() > MAX_CONFIG_BYTES {
        return Err(KimiError::Config { path: path.into(), rule: format!("must be a regular file of at most {MAX_CONFIG_BYTES} bytes") }.into());
    }
    let bytes = crate::fsutil::read_limited(path, MAX_CONFIG_BYTES).map_err(|e| io_err(path, e))?;
    let value = serde_json::from_slice(&bytes).map_err(|e| KimiError::Config { path: path.into(), rule: format!("not JSON: {e}") })?;
    Ok(Config { path: resolve(path), value, sha256: digest::sha256_hex(&bytes), mtime_ns: mtime_ns(&meta) })
}

struct TokenizerFile {
    name: String,
    size: u64,
    sha256: String,
    mtime_ns: i128,
}

/// The regular files of the tokenizer directory (symlinks followed), by name, hashed.
fn read_tokenizer(dir: &Path) -> Result<(PathBuf, Vec<TokenizerFile>), ViewError> {
    let err = |rule: String| ViewError::from(KimiError::Tokenizer { path: dir.into(), rule });
    let resolved = std::fs::canonicalize(dir).map_err(|e| io_err(dir, e))?;
    let mut names = Vec::new();
    for entry in std::fs::read_dir(&resolved).map_err(|e| io_err(dir, e))? {
        let entry = entry.map_err(|e| io_err(dir, e))?;
        let name = entry.file_name().into_string().map_err(|n| err(format!("file name {n:?} is not UTF-8")))?;
        names.push(name);
        if names.len() > MAX_TOKENIZER_FILES {
            return Err(err(format!("more than {MAX_TOKENIZER_FILES} entries")));
        }
    }
    names.sort();
    let mut files = Vec::new();
    for name in names {
        let p = resolved.join(&name);
        let Ok(meta) = std::fs::metadata(&p) else { continue }; // dangling symlink: not a file
        if !meta.is_file() {
            continue;
        }
        let sha256 = super::kt_int8::validate::sha256_file(&p).map_err(|e| err(e.to_string()))?;
        files.push(TokenizerFile { name, size: meta.len(), sha256, mtime_ns: mtime_ns(&meta) });
    }
    Ok((resolved, files))
}

/// Everything the manifest holds besides the pack's own record.
struct ManifestParts {
    model: Value,
    source: Value,
    tokenizer: Value,
    created_at: String,
    payload_samples: u64,
    full_source_hashes: bool,
}

fn manifest_parts(
    source: &Source,
    plan: &Plan,
    config: &Config,
    tokenizer_dir: &Path,
    store: &DigestStore,
    opts: &KimiOptions,
) -> Result<ManifestParts, ViewError> {
    let model = plan.model.as_ref().ok_or_else(|| ViewError::Internal("a manifest needs the model config".into()))?;
    let (tok_path, tok_files) = read_tokenizer(tokenizer_dir)?;
    let (files_sha256, header_sha256) = if opts.full_source_hashes {
        let (files, headers) = digest::files_sha256(source, store)?;
        (Some(files), headers)
    } else {
        (None, digest::header_sha256s(source)?)
    };
    let meta = source.gguf().ok_or_else(|| ViewError::Internal("not a GGUF source".into()))?;
    let shards: Vec<Value> = source
        .files
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let mut r = json!({
                "index": i,
                "path": resolve(f.path()).to_string_lossy(),
                "size": f.size(),
                "metadata_nbytes": meta.headers[i].data_offset,
                "metadata_sha256": header_sha256[i],
                "tensor_count": meta.headers[i].tensor_count,
            });
            if let Some(s) = &files_sha256 {
                r["sha256"] = s[i].clone().into();
            }
            r
        })
        .collect();
    let mut sorted: Vec<&crate::source::TensorInfo> = source.tensors.iter().collect();
    sorted.sort_by(|a, b| a.name.cmp(&b.name));
    let tensors: Vec<Value> = sorted
        .iter()
        .map(|t| {
            json!({
                "name": t.name, "shape": t.shape, "dtype": t.dtype.name(),
                "dtype_id": t.dtype.ggml().map_or(u32::MAX, |g| g.id),
                "shard_index": t.file, "data_offset": t.offset, "nbytes": t.nbytes,
            })
        })
        .collect();
    let inventory = json!({
        "summary": {
            "architecture": format::ARCHITECTURE,
            "shard_count": source.files.len(),
            "tensor_count": source.tensors.len(),
            "total_bytes": source.logical_size(),
            "full_source_hashes": opts.full_source_hashes,
        },
        "shards": shards,
        "tensors": tensors,
    });
    let mut source_v = inventory.clone();
    source_v["inventory_sha256"] = canonical_sha256(&inventory).into();
    let files: Vec<Value> = tok_files.iter().map(|f| json!({"name": f.name, "size": f.size, "sha256": f.sha256})).collect();
    let files = Value::Array(files);
    let tokenizer = json!({"path": tok_path.to_string_lossy(), "inventory_sha256": canonical_sha256(&files), "files": files});
    let model_v = json!({
        "config_path": config.path.to_string_lossy(),
        "config_sha256": config.sha256,
        "architecture": "KimiLinearForCausalLM",
        "num_hidden_layers": model.num_hidden_layers,
        "active_moe_layer_ids": plan.spec.active_layers().collect::<Vec<_>>(),
        "num_experts": model.num_experts,
        "num_experts_per_token": model.top_k,
        "num_shared_experts": model.num_shared_experts,
        "hidden_size": model.hidden_size,
        "routed_expert_hidden_size": model.routed_expert_hidden_size,
        "moe_intermediate_size": model.moe_intermediate_size,
        "hidden_act": model.hidden_act,
    });
    // When the inputs took their present state: the newest modification time among the
    // shards, the config and the tokenizer files (the manifest depends on nothing else).
    let newest = source.files.iter().map(|f| f.identity().mtime_ns).chain([config.mtime_ns]).chain(tok_files.iter().map(|f| f.mtime_ns)).max().unwrap_or(0);
    let created_at = crate::util::format_utc(newest.div_euclid(1_000_000_000) as i64, (newest.rem_euclid(1_000_000_000) / 1000) as u32);
    Ok(ManifestParts {
        model: model_v,
        source: source_v,
        tokenizer,
        created_at,
        payload_samples: opts.payload_samples,
        full_source_hashes: opts.full_source_hashes,
    })
}

fn render_manifest(parts: &ManifestParts, pack: Value) -> Vec<u8> {
    let full_pack_hash = pack.get("sha256").is_some();
    let v = json!({
        "complete": true,
        "format": format::MANIFEST_FORMAT,
        "created_at": parts.created_at,
        "sglang_git_sha": crate::GIT_SHA,
        "hard_constraints": {
            "top_k": 16,
            "top_k_is_immutable": true,
            "all_selected_experts_must_execute": true,
            "expert_pruning_allowed": false,
            "requantization_allowed": false,
        },
        "model": parts.model,
        "source": parts.source,
        "expert_pack": pack,
        "tokenizer": parts.tokenizer,
        "verification": {
            "structure": "complete",
            "payload_samples": parts.payload_samples,
            "full_source_hashes": parts.full_source_hashes,
            "full_pack_hash": full_pack_hash,
        },
    });
    let mut text = pyjson::dumps(&v, &Style::PRETTY_SORTED);
    text.push('\n');
    text.into_bytes()
}

/// Plan, check and describe the view: `NAME.expert-major.pack`, and its manifest when the
/// model config and tokenizer directory are given.
pub fn build(source: &Source, store: &DigestStore, opts: &KimiOptions) -> Result<Tree, ViewError> {
    let config = match (&opts.model_config, &opts.tokenizer_dir) {
        (Some(c), Some(_)) => Some(read_config(c)?),
        (None, None) => None,
        (Some(_), None) | (None, Some(_)) => {
            return Err(KimiError::Option {
                option: "model_config",
                rule: "model_config and tokenizer_dir are given together (the manifest needs both)".into(),
            }
            .into());
        }
    };
    if (opts.full_source_hashes || opts.full_pack_hash) && config.is_none() {
        return Err(KimiError::Option {
            option: "full_pack_hash",
            rule: "full_source_hashes and full_pack_hash describe the manifest: give model_config and tokenizer_dir".into(),
        }
        .into());
    }
    let plan = Plan::new(source, config.as_ref().map(|c| (&c.value, c.path.as_path())), opts.model_check, opts.name.as_deref())?;
    let (head, index_sha256) = plan.layout.head(&plan.experts, &source.tensors);
    let file = Arc::new(plan.pack_file(source, head.into()));
    let mut tree = Tree::new();
    tree.add_file_arc(ROOT_INO, &plan.pack_name, file.clone());
    let (Some(config), Some(tok)) = (config, &opts.tokenizer_dir) else {
        return Ok(tree);
    };
    let parts = manifest_parts(source, &plan, &config, tok, store, opts)?;
    let pack_path = opts.pack_dir.join(&plan.pack_name).to_string_lossy().into_owned();
    let manifest_name = format!("{}.manifest.json", plan.pack_name);
    let record = {
        let (plan, index_sha256, samples) = (plan.clone(), index_sha256.clone(), opts.payload_samples);
        move |sha256: Option<&str>| plan.pack_record(&pack_path, &index_sha256, samples, sha256)
    };
    if !opts.full_pack_hash {
        tree.add_file(ROOT_INO, &manifest_name, VirtualFile::from_bytes(render_manifest(&parts, record(None))));
        return Ok(tree);
    }
    // The pack's digest, remembered under the source files and the pack's header and index
    // (which determine where every byte comes from).
    let key = DigestStore::view_key(VIEW, &index_sha256, &source.files);
    let manifest = Derived::new(manifest_name.clone(), store, key, vec![Input::whole(&file)], move |h| render_manifest(&parts, record(Some(&h[0]))));
    let manifest = if opts.materialize { manifest.into_file() } else { manifest.into_file_now()? };
    tree.add_file(ROOT_INO, &manifest_name, manifest);
    Ok(tree)
}
