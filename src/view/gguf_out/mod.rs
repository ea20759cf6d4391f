//! The GGUF output view (`-o view=gguf,ftype=FTYPE`): the file `llama-quantize` would write
//! from a GGUF source (a split set named by any part), byte for byte as
//! `llama_model_quantize` of llama.cpp as vendored by llama-cpp-python 0.3.36 (llama.cpp
//! [`LLAMA_CPP_COMMIT`]), computed as it is read: one file, `<stem>-<FTYPE>.gguf`.
//!
//! This module checks the source and assembles the file; each concern has its module:
//! [`ftype`] (the file types), [`hparams`] (what llama.cpp loads of the model, and its
//! reasons for refusing it), [`types`] (the per-tensor type choice), [`layout`] (the
//! writer's header and data layout), [`codecs`] (the one table from ggml types to the
//! codec, and the row checks), [`chunks`] (each tensor's data in chunks of rows, through
//! the tiers). Everything llama-quantize would refuse before writing is refused at mount,
//! naming the file, the tensor and the rule; content it would refuse while writing (a NaN
//! or Inf in a row) fails the reads of that tensor with EIO, naming it.
//!
//! With `-o imatrix=FILE` (the requant view's option: GGUF or legacy imatrix) the file is
//! what the `llama-quantize --imatrix FILE` command writes: the imatrix loaded as its loader
//! loads it, `has_imatrix` in the type choice, each converted tensor's entry looked up by
//! its exact name and used when it holds `ne0 * ne2` values (one slice per expert), a
//! wrong-sized entry refused (ignored for `token_embd`), a missing one leaving the tensor
//! without importance, and the `quantize.imatrix.*` keys the command adds as KV
//! overrides ([`imatrix_kvs`]).

pub mod chunks;
pub mod codecs;
pub mod ftype;
pub mod hparams;
pub mod layout;
pub mod types;

use std::collections::{BTreeSet, HashMap};
use std::ffi::OsStr;
use std::path::Path;
use std::sync::Arc;

use self::chunks::{Importance, TensorData};
use self::ftype::Ftype;
use self::layout::OutTensor;
use super::imatrix::Imatrix;
use super::tiered::Tiered;
use super::{Extent, ROOT_INO, Tree, ViewError, VirtualFile};
use crate::codec::GgmlType;
use crate::source::Source;
use crate::store::KeyBuilder;
use crate::store::disk::source_file_keys;

const VIEW: &str = "gguf";

/// The llama.cpp commit vendored by llama-cpp-python 0.3.36, whose rules this view follows
/// (the sdist's CHANGELOG.md, section 0.3.36: "update llama.cpp to ggml-org/llama.cpp@0c1e57098").
pub const LLAMA_CPP_COMMIT: &str = "0c1e57098";

/// The view's options.
#[derive(Debug, Clone, clap::Args)]
#[group(id = "gguf_out")]
pub struct Options {
    /// gguf: llama.cpp file type of the output: Q4_K_M, Q4_K_S, Q5_K_M, Q5_K_S, Q6_K, Q8_0,
    /// Q4_0, Q3_K_M, Q3_K_S, Q2_K, IQ4_XS, IQ4_NL, IQ2_XXS (needs imatrix=), Q4_1, Q5_0,
    /// Q5_1, F16, BF16, F32 (or its number)
    #[arg(long, value_parser = Ftype::parse, help_heading = "GGUF")]
    pub ftype: Option<Ftype>,
    /// gguf: on|off: decode tensors that are already quantized and quantize them again
    /// (llama-quantize --allow-requantize); off refuses such sources at mount
    #[arg(long, default_value = "off", value_parser = crate::util::args::switch, action = clap::ArgAction::Set, help_heading = "GGUF")]
    pub allow_requantize: bool,
    /// The `imatrix=` path as the user wrote it (recorded in `quantize.imatrix.file`), when
    /// `mount` made the path absolute before leaving the working directory.
    #[arg(skip)]
    pub imatrix_as_given: Option<std::ffi::OsString>,
}

/// Why the view refuses a source (at mount).
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    #[error("{file}: not a GGUF file (the gguf view quantizes GGUF sources)")]
    NotGguf { file: String },
    #[error("{file}: llama.cpp would not load the model: {reason}")]
    Model { file: String, reason: hparams::HparamError },
    #[error("{file}: tensor {tensor}: {reason}")]
    TypeChoice { file: String, tensor: String, reason: types::TypeError },
    #[error("{file}: ftype {ftype} needs {needs}, not built yet (no quantizer in xpackfs yet; first needed by tensor {tensor})")]
    NoQuantizer { file: String, ftype: &'static str, needs: String, tensor: String },
    #[error("{file}: tensor {tensor}: requantizing from type {from} is disabled (llama-quantize's rule; -o allow_requantize=on decodes it first)")]
    Requantize { file: String, tensor: String, from: &'static str },
    #[error("{file}: tensor {tensor}: cannot dequantize/convert tensor type {from}")]
    Convert { file: String, tensor: String, from: &'static str },
    #[error("{file}: tensor {tensor}: this quantization requires an imatrix! (target type {ty}; llama-quantize's rule; -o imatrix=FILE)")]
    RequiresImatrix { file: String, tensor: String, ty: &'static str },
    #[error("{file}: Missing importance matrix for tensor {tensor} in a very low-bit quantization (type {ty}; imatrix {imatrix} has no entry for it)")]
    MissingImportance { file: String, tensor: String, ty: &'static str, imatrix: String },
    #[error("{file}: imatrix size {got} is different from tensor size {want} for {tensor} (imatrix {imatrix}; llama-quantize stops there)")]
    ImatrixSize { file: String, tensor: String, got: usize, want: u64, imatrix: String },
    #[error("{imatrix}: missing imatrix metadata (imatrix.datasets, imatrix.chunk_count, imatrix.chunk_size), which llama-quantize requires")]
    ImatrixMetadata { imatrix: String },
    /// The header of the first file could not be walked again for its KVs.
    #[error("{file}: {source}")]
    Header { file: String, source: layout::KvError },
}

impl From<Refusal> for ViewError {
    fn from(r: Refusal) -> Self {
        ViewError::layout(VIEW, r.to_string())
    }
}

/// The GGUF output view.
pub struct GgufView;

impl super::View for GgufView {
    fn name(&self) -> &'static str {
        VIEW
    }
    fn summary(&self) -> &'static str {
        "llama-quantize's output file (ftype=Q8_0, Q4_K_M, ...) of a BF16/F16/F32 GGUF, byte-identical to llama_model_quantize"
    }
    fn build(&self, input: &super::Input, opts: &super::ViewOptions, ctx: &super::Context) -> Result<Tree, ViewError> {
        let source = input.source(VIEW)?;
        let ftype = opts.gguf_out.ftype.ok_or_else(|| ViewError::option("ftype", "the gguf view needs ftype=FTYPE (Q8_0, Q4_K_M, ...)"))?;
        let imatrix = match &opts.requant.imatrix {
            None => None,
            Some(path) => {
                let given = opts.gguf_out.imatrix_as_given.clone().unwrap_or_else(|| path.clone().into_os_string());
                Some((Arc::new(open_imatrix(path)?), given))
            }
        };
        let file = build_file(source, ftype, opts.gguf_out.allow_requantize, imatrix.as_ref().map(|(m, g)| (m, g.as_os_str())), &ctx.tiers)?;
        let name = match &opts.name {
            Some(n) => format!("{n}.gguf"),
            None => format!("{}-{}.gguf", source.stem(), ftype.name()),
        };
        let mut tree = Tree::new();
        tree.add_file(ROOT_INO, &name, file);
        Ok(tree)
    }
    fn verify(&self, built: &super::Built, out: &Path, _written: &HashMap<String, String>) -> Result<(), ViewError> {
        for (name, f) in built.tree.files() {
            verify_file(&out.join(&name), &name, f.size())?;
        }
        Ok(())
    }
}

/// `materialize --verify`: the written file parses as GGUF, has the size of the view, and
/// its tensors are laid end to end with the sizes their types give.
fn verify_file(path: &Path, name: &str, size: u64) -> Result<(), ViewError> {
    let refuse = |rule: String| ViewError::Verify { file: name.to_string(), rule };
    let src = crate::source::gguf::open(path).map_err(|e| refuse(e.to_string()))?;
    if src.logical_size() != size {
        return Err(refuse(format!("{} bytes, the view has {size}", src.logical_size())));
    }
    let mut end = src.gguf().and_then(|g| g.headers.first()).map_or(0, |h| h.data_offset);
    for t in &src.tensors {
        if t.offset != end {
            return Err(refuse(format!("tensor {} at {}, expected {end}", t.name, t.offset)));
        }
        end = t.offset + layout::pad(t.nbytes);
    }
    if end != size {
        return Err(refuse(format!("tensors end at {end}, the file at {size}")));
    }
    Ok(())
}

/// Each tensor in the writer's order, with its source type and the type llama-quantize
/// writes it with (`llama_tensor_get_type` over every tensor, counters included).
fn choose_types(source: &Source, model: &hparams::Model, ftype: Ftype, has_imatrix: bool, file: &str) -> Result<Vec<(usize, GgmlType, GgmlType)>, Refusal> {
    let mut order: Vec<usize> = (0..source.tensors.len()).collect();
    order.sort_by(|&a, &b| layout::order_key(&source.tensors[a].name).cmp(&layout::order_key(&source.tensors[b].name)));
    let mut state = types::State::new(model, ftype, has_imatrix, order.iter().map(|&i| source.tensors[i].name.as_str()));
    let mut planned = Vec::with_capacity(order.len());
    for &i in &order {
        let t = &source.tensors[i];
        let cur = t.dtype.ggml().ok_or_else(|| Refusal::NotGguf { file: file.to_string() })?;
        let new = state.choose(&t.name, &t.shape, cur).map_err(|reason| Refusal::TypeChoice { file: file.to_string(), tensor: t.name.clone(), reason })?;
        planned.push((i, cur, new));
    }
    Ok(planned)
}

/// An imatrix for this view: opened as the requant view opens it, refused where
/// llama-quantize's loader refuses it (a GGUF imatrix without its metadata keys), every
/// value checked (llama-quantize checks them all before writing).
pub fn open_imatrix(path: &Path) -> Result<Imatrix, ViewError> {
    let m = Imatrix::open(path)?;
    if !m.has_metadata {
        return Err(Refusal::ImatrixMetadata { imatrix: path.display().to_string() }.into());
    }
    if let Some(rule) = &m.metadata_problem {
        return Err(ViewError::option("imatrix", format!("{}: {rule} (llama-quantize's loader aborts on it)", path.display())));
    }
    m.check_all()?;
    Ok(m)
}

/// The KVs `llama-quantize --imatrix FILE` adds (as KV overrides, set after the copied ones
/// in this order): `quantize.imatrix.file` (FILE as given, at most 127 bytes),
/// `quantize.imatrix.dataset` (the first dataset, at most 127 bytes; only when there is one),
/// `quantize.imatrix.entries_count` (u32), and `quantize.imatrix.chunks_count` (u32; only
/// when the chunk count is positive).
pub fn imatrix_kvs(m: &Imatrix, given: &OsStr) -> Vec<layout::RawKv> {
    use std::os::unix::ffi::OsStrExt;
    let c127 = |b: &[u8]| -> Vec<u8> {
        let b = &b[..b.len().min(127)];
        b[..b.iter().position(|&c| c == 0).unwrap_or(b.len())].to_vec()
    };
    let mut kvs = vec![layout::kv_str("quantize.imatrix.file", &c127(given.as_bytes()))];
    if let Some(d) = m.datasets.first() {
        kvs.push(layout::kv_str("quantize.imatrix.dataset", &c127(d.as_bytes())));
    }
    kvs.push(layout::kv_u32("quantize.imatrix.entries_count", m.entry_count() as u32));
    if m.chunk_count > 0 {
        kvs.push(layout::kv_u32("quantize.imatrix.chunks_count", m.chunk_count as u32));
    }
    kvs
}

/// The type choice alone (llama-quantize's `--dry-run`, which does not refuse types that
/// need an imatrix), for any offered file type, with an imatrix or not: each tensor's name
/// and output type, in the writer's order.
pub fn planned_types(source: &Source, ftype: Ftype, has_imatrix: bool) -> Result<Vec<(String, &'static str)>, ViewError> {
    let first = source.files.first().map(|f| f.path().display().to_string()).unwrap_or_default();
    let meta = source.gguf().ok_or_else(|| Refusal::NotGguf { file: first.clone() })?;
    let model = hparams::load(meta.metadata()).map_err(|reason| Refusal::Model { file: first.clone(), reason })?;
    Ok(choose_types(source, &model, ftype, has_imatrix, &first)?.into_iter().map(|(i, _, new)| (source.tensors[i].name.clone(), new.name)).collect())
}

/// The output file of `source` at `ftype`, with an imatrix (and its path as given) or not.
pub fn build_file(
    source: &Source,
    ftype: Ftype,
    allow_requantize: bool,
    imatrix: Option<(&Arc<Imatrix>, &OsStr)>,
    tiers: &Arc<super::Tiers>,
) -> Result<VirtualFile, ViewError> {
    let first = source.files.first().map(|f| f.path().display().to_string()).unwrap_or_default();
    let file = || first.clone();
    let meta = source.gguf().ok_or_else(|| Refusal::NotGguf { file: file() })?;
    let model = hparams::load(meta.metadata()).map_err(|reason| Refusal::Model { file: file(), reason })?;

    let planned = choose_types(source, &model, ftype, imatrix.is_some(), &first)?;
    // The preliminary loop: without an imatrix, a tensor whose type needs one is refused.
    if imatrix.is_none()
        && let Some(&(i, _, new)) = planned.iter().find(|&&(i, _, new)| {
            let t = &source.tensors[i];
            types::allows_quantization(&t.name, &t.shape) && types::requires_imatrix(&t.name, new, ftype)
        })
    {
        return Err(Refusal::RequiresImatrix { file: file(), tensor: source.tensors[i].name.clone(), ty: new.name }.into());
    }
    let mut missing: Vec<(&'static str, String)> = Vec::new();
    let mut out_tensors = Vec::with_capacity(planned.len());
    let mut encoders = Vec::with_capacity(planned.len());
    let mut importances = Vec::with_capacity(planned.len());
    for &(i, cur, new) in &planned {
        let t = &source.tensors[i];
        let mut importance = None;
        let enc = if new == cur {
            None
        } else {
            // The main loop's imatrix lookup, for every tensor it converts.
            if let Some((m, _)) = imatrix {
                let ne = |d: usize| t.shape.get(d).copied().unwrap_or(1);
                let want = ne(0).saturating_mul(ne(2));
                match m.entry_len(&t.name) {
                    None => {}
                    Some(got) if got as u64 == want => importance = Some(Importance { imatrix: Arc::clone(m), entry: t.name.clone(), rows_per_expert: ne(1) }),
                    Some(_) if t.name == "token_embd.weight" || t.name == "per_layer_token_embd.weight" => {}
                    Some(got) => {
                        return Err(Refusal::ImatrixSize { file: file(), tensor: t.name.clone(), got, want, imatrix: m.path.display().to_string() }.into());
                    }
                }
                if importance.is_none() && types::requires_imatrix(&t.name, new, ftype) {
                    return Err(Refusal::MissingImportance { file: file(), tensor: t.name.clone(), ty: new.name, imatrix: m.path.display().to_string() }.into());
                }
            }
            if types::is_quantized(cur) && !allow_requantize {
                return Err(Refusal::Requantize { file: file(), tensor: t.name.clone(), from: cur.name }.into());
            }
            if !codecs::decodes(cur) {
                return Err(Refusal::Convert { file: file(), tensor: t.name.clone(), from: cur.name }.into());
            }
            match codecs::encoder(new) {
                Some(e) => Some((new, e)),
                None => {
                    missing.push((new.name, t.name.clone()));
                    None
                }
            }
        };
        let n_per_row = t.shape.first().copied().unwrap_or(1);
        let rows: u64 = t.shape.iter().skip(1).product();
        let nbytes = rows * new.row_bytes(n_per_row).unwrap_or(0);
        out_tensors.push(OutTensor { name: t.name.clone(), ne: t.shape.clone(), ty: new, nbytes });
        encoders.push(enc);
        importances.push(importance);
    }
    if let Some((_, tensor)) = missing.first() {
        let needs: BTreeSet<&str> = missing.iter().map(|m| m.0).collect();
        let needs: Vec<&str> = needs.into_iter().collect();
        return Err(Refusal::NoQuantizer { file: file(), ftype: ftype.name(), needs: needs.join(", "), tensor: tensor.clone() }.into());
    }

    let first_file = source.files.first().ok_or_else(|| Refusal::NotGguf { file: file() })?;
    let header_len = meta.headers.first().map_or(0, |h| h.data_offset);
    let kvs = layout::raw_kvs(first_file, header_len).map_err(|source| Refusal::Header { file: file(), source })?;
    let mut kvs = layout::output_kvs(kvs, ftype.number());
    if let Some((m, given)) = imatrix {
        for kv in imatrix_kvs(m, given) {
            layout::set_kv(&mut kvs, kv);
        }
    }
    let mut f = VirtualFile::new();
    f.push(Extent::Bytes(layout::header(&kvs, &out_tensors).into()));

    let file_keys = source_file_keys(&source.files);
    for (((&(i, cur, _), out), enc), importance) in planned.iter().zip(&out_tensors).zip(encoders).zip(importances) {
        let t = &source.tensors[i];
        let n_per_row = t.shape.first().copied().unwrap_or(1);
        let rows: u64 = t.shape.iter().skip(1).product();
        if out.nbytes > 0 {
            let data = TensorData::new(t.name.clone(), source.files[t.file].clone(), t.offset, cur, enc, n_per_row, rows);
            let mut key = KeyBuilder::new(VIEW);
            // Only tensors quantized with importance depend on the imatrix.
            if let Some(imp) = &importance {
                key = key.field("imatrix", &imp.imatrix.sha256).field("imatrix_entry", &imp.entry);
            }
            let data = data.with_importance(importance);
            let key = key
                .field("file", &file_keys[t.file])
                .field("tensor", &t.name)
                .u64("offset", t.offset)
                .field("source_type", cur.name)
                .field("shape", format!("{:?}", t.shape))
                .field("type", out.ty.name)
                .u64("rows_per_chunk", data.rows_per_chunk)
                .producer();
            let chunks = data.chunks();
            let producer = if enc.is_some() { Tiered::new(data, tiers, key) } else { Tiered::memory_only(data, tiers, key) };
            for c in 0..chunks {
                f.push(producer.extent(c));
            }
        }
        let pad = layout::pad(out.nbytes) - out.nbytes;
        if pad > 0 {
            f.push(Extent::Zeros(pad));
        }
    }
    Ok(f)
}
