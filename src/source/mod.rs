//! Checkpoint readers. A [`Source`] is parsed from headers only: a table of tensors, each
//! pointing at a byte range in one of the source's files. Content is read later, on
//! demand, through [`SourceFile::read_exact_at`] (or its `O_DIRECT` twin,
//! [`SourceFile::read_exact_at_direct`], for clients that read with direct I/O and for the
//! packs the mount's page cache holds).
//!
//! A split GGUF set (`name-00001-of-0000N.gguf`) is one logical source: its files are
//! concatenated in order, and a tensor's *logical offset* is its offset in that
//! concatenation (for a single file it is simply the file offset).

pub mod direct;
pub mod file;
pub mod gguf;
pub mod json;
pub mod remote;
pub mod safetensors;

use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use direct::SourceIo;
pub use file::{EntryKind, FileIdentity, SourceFile, check_file, check_regular, entry_kind, is_dir, list_entries, open_regular, present, read_small};

use crate::codec::GgmlType;

#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{}: {rule}", path.display())]
    Format { path: PathBuf, rule: String },
    #[error("{}: tensor {tensor:?}: {rule}", path.display())]
    Tensor { path: PathBuf, tensor: String, rule: String },
    #[error("{}: source changed while in use: {what}", path.display())]
    Changed { path: PathBuf, what: String },
    /// Sources, shards, split parts and every other input file must be regular files.
    #[error("{}: is {kind}, not a regular file", path.display())]
    NotRegular { path: PathBuf, kind: &'static str },
    /// A remote source's failure (its message names the URL).
    #[error(transparent)]
    Remote(#[from] remote::RemoteError),
}

impl SourceError {
    pub fn format(path: &Path, rule: impl Into<String>) -> Self {
        SourceError::Format { path: path.to_path_buf(), rule: rule.into() }
    }
    pub fn tensor(path: &Path, tensor: &str, rule: impl Into<String>) -> Self {
        SourceError::Tensor { path: path.to_path_buf(), tensor: tensor.to_string(), rule: rule.into() }
    }
}

/// One opened and parsed file: the file, its header, its tensors.
pub(crate) type Parsed<H> = (Arc<SourceFile>, H, Vec<TensorInfo>);

/// Open `paths` as source files and parse each with `parse(file, index, logical_base)`: for
/// remote files up to eight at a time (a remote split set's headers are one round trip
/// each: in parallel, a 24-part set opens in a few round trips' time), local ones in turn. Results are in `paths`' order; the first
/// error in that order is returned.
pub(crate) fn open_parsed<H: Send, F>(paths: &[PathBuf], parse: F) -> Result<Vec<Parsed<H>>, SourceError>
where
    F: Fn(&SourceFile, usize, u64) -> Result<(H, Vec<TensorInfo>), SourceError> + Sync,
{
    let files: Vec<Arc<SourceFile>> = paths.iter().map(|p| SourceFile::open(p).map(Arc::new)).collect::<Result<_, _>>()?;
    let mut bases = Vec::with_capacity(files.len());
    let mut base = 0u64;
    for (f, p) in files.iter().zip(paths) {
        bases.push(base);
        base = base.checked_add(f.size()).ok_or_else(|| SourceError::format(p, "the files' total size overflows"))?;
    }
    type Slot<H> = parking_lot::Mutex<Option<Result<(H, Vec<TensorInfo>), SourceError>>>;
    let slots: Vec<Slot<H>> = files.iter().map(|_| parking_lot::Mutex::new(None)).collect();
    let next = std::sync::atomic::AtomicUsize::new(0);
    // Local files parse at disk speed: threads only pay for remote ones (round trips).
    let workers = if files.iter().any(|f| f.is_remote()) { files.len().clamp(1, 8) } else { 1 };
    if workers == 1 {
        for ((f, slot), &b) in files.iter().zip(&slots).zip(&bases) {
            let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            *slot.lock() = Some(parse(f, i, b));
        }
    }
    let workers = if workers == 1 { 0 } else { workers };
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let (Some(f), Some(slot), Some(&b)) = (files.get(i), slots.get(i), bases.get(i)) else { break };
                    *slot.lock() = Some(parse(f, i, b));
                }
            });
        }
    });
    let mut out = Vec::with_capacity(files.len());
    for (f, slot) in files.into_iter().zip(slots) {
        match slot.into_inner() {
            Some(Ok((h, t))) => out.push((f, h, t)),
            Some(Err(e)) => return Err(e),
            None => return Err(SourceError::format(f.path(), "internal: the file was not parsed")),
        }
    }
    Ok(out)
}

/// The element type of a tensor, in its source format's terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TensorDtype {
    Ggml(GgmlType),
    Safetensors(::safetensors::Dtype),
}

impl TensorDtype {
    pub fn ggml(&self) -> Option<GgmlType> {
        match self {
            TensorDtype::Ggml(g) => Some(*g),
            TensorDtype::Safetensors(_) => None,
        }
    }
    pub fn name(&self) -> String {
        match self {
            TensorDtype::Ggml(g) => g.name.to_string(),
            TensorDtype::Safetensors(d) => safetensors::dtype_name(*d),
        }
    }
}

/// One tensor of a source.
#[derive(Debug, Clone)]
pub struct TensorInfo {
    pub name: String,
    pub dtype: TensorDtype,
    /// As the source states it: GGUF tensors in ggml `ne` order (`shape[0]` contiguous),
    /// safetensors tensors row-major (last dimension contiguous).
    pub shape: Vec<u64>,
    /// Index into [`Source::files`].
    pub file: usize,
    /// Absolute offset in its file.
    pub offset: u64,
    pub nbytes: u64,
    /// Offset in the logical concatenation of the source's files.
    pub logical_offset: u64,
}

/// A parsed checkpoint: its files, metadata and tensor table.
#[derive(Debug)]
pub struct Source {
    pub files: Vec<Arc<SourceFile>>,
    pub kind: SourceKind,
    /// Tensors in the order of the source's tensor table(s).
    pub tensors: Vec<TensorInfo>,
}

#[derive(Debug)]
pub enum SourceKind {
    Gguf(gguf::GgufMeta),
    Safetensors(safetensors::SafetensorsMeta),
}

impl Source {
    /// Open a checkpoint by path or remote URL, detecting its format: a `.gguf` file (or
    /// part of a split set), a `.safetensors` file, or a directory of safetensors shards.
    pub fn open(path: &Path) -> Result<Source, SourceError> {
        let is_safetensors = is_dir(path) || path.extension().is_some_and(|e| e == "safetensors");
        if is_safetensors { safetensors::open(path) } else { gguf::open(path) }
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// Total bytes of all files, the size of the logical concatenation.
    pub fn logical_size(&self) -> u64 {
        self.files.iter().map(|f| f.size()).sum()
    }

    /// A short name for the source, used to name views (file stem without split suffix).
    pub fn stem(&self) -> String {
        let first = self.files.first().map(|f| f.path());
        let stem = first.and_then(|p| p.file_stem()).map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "model".into());
        match gguf::split_parts(&stem) {
            Some((prefix, _, _)) => prefix.to_string(),
            None => stem,
        }
    }

    pub fn gguf(&self) -> Option<&gguf::GgufMeta> {
        match &self.kind {
            SourceKind::Gguf(meta) => Some(meta),
            SourceKind::Safetensors(_) => None,
        }
    }

    pub fn safetensors(&self) -> Option<&safetensors::SafetensorsMeta> {
        match &self.kind {
            SourceKind::Safetensors(meta) => Some(meta),
            SourceKind::Gguf(_) => None,
        }
    }
}
