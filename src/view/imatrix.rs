//! llama.cpp importance matrices, in both file formats, read lazily (a full V4.1
//! imatrix is about a gigabyte; rows are read when a tensor is quantised).
//!
//! * GGUF (`general.type = imatrix`): per weight, `<name>.in_sum2` (F32, ne = {ne0, n_mat})
//!   and `<name>.counts` (F32, n_mat); row j is `in_sum2[j] / counts[j]`, or all ones where
//!   the count is 0 (as llama.cpp's quantize loads it).
//! * legacy `imatrix.dat`: i32 entry count, then per entry i32 name length, name, i32
//!   ncall, i32 nval, nval f32 sums; values are `sums / ncall` (or the sums when ncall is 0).
//!
//! What llama-quantize's imatrix loader (`common_imatrix_load`) also reads is kept: the
//! datasets (`imatrix.datasets`, or the legacy trailer's dataset name), the chunk count
//! (`imatrix.chunk_count`, or the legacy trailer's), and whether a GGUF imatrix has the
//! three metadata keys llama-quantize requires. The GGUF output view looks entries up by
//! exact name and reads them flat ([`Imatrix::entry_len`], [`Imatrix::values`]).
//!
//! A DeepSeek expert weight `layers.L.ffn.experts.E.{w1,w3,w2}.weight` takes row E of
//! llama.cpp's `blk.L.ffn_{gate,up,down}_exps.weight`, or the single row of an entry named
//! exactly like the tensor.
//!
//! The file must be a regular file (a FIFO or a device is refused before it is opened); it
//! is hashed in a streaming pass; declared counts are capped before anything is allocated
//! from them; counts and importances must be finite numbers in 0..=1e30.
//! No indexing that could panic here (`clippy::indexing_slicing` is denied).
#![deny(clippy::indexing_slicing)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use sha2::{Digest, Sha256};

use super::ViewError;
use crate::source::{SourceError, SourceFile};

/// Caps on what an importance matrix may declare: rows per entry (experts), values per row,
/// legacy entries and name lengths. A full V4.1 imatrix has ~500 entries of 256 rows.
pub const MAX_ROWS: u64 = 1 << 16;
pub const MAX_ROW_LEN: u64 = 1 << 24;
pub const MAX_ENTRIES: u64 = 1 << 16;
pub const MAX_NAME_BYTES: u64 = 1 << 12;

fn err(path: &Path, rule: impl Into<String>) -> ViewError {
    ViewError::Option { option: "imatrix", rule: format!("{}: {}", path.display(), rule.into()) }
}

/// Why [`Imatrix::locate`] finds no importance row for a tensor; each names the tensor.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NoRow {
    #[error("{tensor} has rows of 0 values")]
    EmptyRows { tensor: String },
    /// No entry of its own, and not a DeepSeek expert tensor (whose entry is llama.cpp's).
    #[error("no importance entry for {tensor}")]
    NotExpert { tensor: String },
    #[error("no importance entry {entry} for {tensor}")]
    NoEntry { entry: String, tensor: String },
    #[error("importance entry {entry} has rows of {has}, {tensor} needs {needs}")]
    RowLength { entry: String, has: usize, tensor: String, needs: usize },
    #[error("importance entry {entry} has {rows} rows, {tensor} needs row {row}")]
    RowCount { entry: String, rows: usize, tensor: String, row: usize },
}

/// A source error (it names the file already) as an `imatrix` option error.
fn src_err(e: SourceError) -> ViewError {
    ViewError::Option { option: "imatrix", rule: e.to_string() }
}

/// The largest importance (or count) accepted: the quantisers multiply importances by
/// squared weights and sum them in f32, which larger values would overflow.
pub const MAX_IMPORTANCE: f32 = 1e30;

/// What every importance (and count) must be: finite, in 0..=[`MAX_IMPORTANCE`].
fn valid_number(v: f32) -> bool {
    v.is_finite() && (0.0..=MAX_IMPORTANCE).contains(&v)
}

const NUMBER_RULE: &str = "is not a finite number in 0..=1e30";

#[derive(Debug, Clone)]
struct Entry {
    /// Byte offset of the sums in the file.
    sums_offset: u64,
    ne0: usize,
    n_mat: usize,
    /// Divisor per row (GGUF counts, or legacy ncall for every row); `None` means "ones".
    divisors: Vec<Option<f32>>,
}

#[derive(Debug)]
pub struct Imatrix {
    pub path: PathBuf,
    pub sha256: String,
    pub format: &'static str,
    /// The datasets it was computed on (`imatrix.datasets`; the legacy trailer's one name,
    /// its first 4 KiB).
    pub datasets: Vec<String>,
    /// The chunk count (`imatrix.chunk_count` as an int32, or the legacy trailer's; 0 without).
    pub chunk_count: i32,
    /// A GGUF imatrix with `imatrix.datasets`, `imatrix.chunk_count` and `imatrix.chunk_size`
    /// (llama-quantize refuses a GGUF imatrix without them); true for the legacy format.
    pub has_metadata: bool,
    /// A metadata key of a type llama-quantize's loader aborts on (`imatrix.chunk_count` or
    /// `imatrix.chunk_size` not a uint32).
    pub metadata_problem: Option<String>,
    file: Arc<SourceFile>,
    entries: HashMap<String, Entry>,
}

/// What a file declares besides its entries.
#[derive(Debug, Default)]
struct Meta {
    datasets: Vec<String>,
    chunk_count: i32,
    has_metadata: bool,
    problem: Option<String>,
}

impl Imatrix {
    /// Open an importance matrix. It must be a regular file (refused before it is opened
    /// otherwise); it is hashed in a streaming pass, and every count it declares is checked
    /// against the caps before anything is allocated from it.
    pub fn open(path: &Path) -> Result<Imatrix, ViewError> {
        let file = Arc::new(SourceFile::open(path).map_err(src_err)?);
        let sha256 = {
            let mut h = Sha256::new();
            let mut buf = vec![0u8; (8 << 20).min(file.size()) as usize];
            let mut off = 0u64;
            while off < file.size() {
                let n = (file.size() - off).min(buf.len() as u64) as usize;
                let Some(piece) = buf.get_mut(..n) else { break };
                file.read_exact_at(piece, off).map_err(src_err)?;
                h.update(&*piece);
                off += n as u64;
            }
            crate::digest::hex(&h.finalize())
        };
        let mut head = [0u8; 4];
        let gguf = file.size() >= 4 && file.read_exact_at(&mut head, 0).is_ok() && &head == b"GGUF";
        let (format, (entries, meta)) = if gguf { ("gguf", Self::gguf_entries(path, &file)?) } else { ("legacy-dat", Self::legacy_entries(path, &file)?) };
        if entries.is_empty() {
            return Err(err(path, "no importance entries"));
        }
        let Meta { datasets, chunk_count, has_metadata, problem } = meta;
        Ok(Imatrix { path: path.to_path_buf(), sha256, format, datasets, chunk_count, has_metadata, metadata_problem: problem, file, entries })
    }

    fn gguf_entries(path: &Path, file: &Arc<SourceFile>) -> Result<(HashMap<String, Entry>, Meta), ViewError> {
        use crate::source::gguf::MetaValue;
        let (header, tensors) = crate::source::gguf::parse_file(file, 0, 0, &Default::default())?;
        let kv = |k: &str| header.metadata.get(k);
        let datasets = match kv("imatrix.datasets") {
            Some(MetaValue::Array { values: Some(v), .. }) => v.iter().filter_map(|x| x.as_str().map(str::to_string)).collect(),
            _ => Vec::new(),
        };
        // gguf_get_val_u32 of the count and size: llama-quantize aborts on another type, which
        // the gguf view refuses (the requant view does not read them).
        let mut problem = None;
        let mut u32_kv = |k: &str| match kv(k) {
            Some(MetaValue::U32(v)) => *v,
            Some(other) => {
                problem.get_or_insert_with(|| format!("{k} is {other:?}, not a uint32"));
                0
            }
            None => 0,
        };
        let chunk_count = u32_kv("imatrix.chunk_count") as i32;
        u32_kv("imatrix.chunk_size");
        let has_metadata = ["imatrix.datasets", "imatrix.chunk_count", "imatrix.chunk_size"].iter().all(|k| kv(k).is_some());
        let meta = Meta { datasets, chunk_count, has_metadata, problem };
        let by_name: HashMap<&str, &crate::source::TensorInfo> = tensors.iter().map(|t| (t.name.as_str(), t)).collect();
        let mut out = HashMap::new();
        for t in &tensors {
            let Some(name) = t.name.strip_suffix(".in_sum2") else { continue };
            let counts = by_name.get(format!("{name}.counts").as_str()).ok_or_else(|| err(path, format!("{name}: in_sum2 without counts")))?;
            if t.dtype.ggml().map(|g| g.name) != Some("F32") || counts.dtype.ggml().map(|g| g.name) != Some("F32") {
                return Err(err(path, format!("{name}: sums and counts must be F32")));
            }
            let ne0 = t.shape.first().copied().unwrap_or(0);
            if ne0 == 0 || ne0 > MAX_ROW_LEN {
                return Err(err(path, format!("{name}: rows of {ne0} values, outside 1..={MAX_ROW_LEN}")));
            }
            let n_mat = t.nbytes / 4 / ne0;
            if n_mat > MAX_ROWS {
                return Err(err(path, format!("{name}: {n_mat} rows, over the cap of {MAX_ROWS}")));
            }
            if counts.nbytes / 4 != n_mat {
                return Err(err(path, format!("{name}: {} counts for {n_mat} rows", counts.nbytes / 4)));
            }
            let mut c = vec![0u8; counts.nbytes as usize];
            file.read_exact_at(&mut c, counts.offset)?;
            let mut divisors = Vec::with_capacity(n_mat as usize);
            for (j, b) in c.as_chunks::<4>().0.iter().enumerate() {
                let v = f32::from_le_bytes(*b);
                if !valid_number(v) {
                    return Err(err(path, format!("{name}: count {v:?} of row {j} {NUMBER_RULE}")));
                }
                let v = v.round();
                divisors.push((v > 0.0).then_some(v));
            }
            out.insert(name.to_string(), Entry { sums_offset: t.offset, ne0: ne0 as usize, n_mat: n_mat as usize, divisors });
        }
        Ok((out, meta))
    }

    fn legacy_entries(path: &Path, file: &Arc<SourceFile>) -> Result<(HashMap<String, Entry>, Meta), ViewError> {
        let size = file.size();
        let read_i32 = |off: u64| -> Result<i32, ViewError> {
            let mut b = [0u8; 4];
            file.read_exact_at(&mut b, off).map_err(|_| err(path, format!("truncated at offset {off}")))?;
            Ok(i32::from_le_bytes(b))
        };
        let n = read_i32(0)?;
        if n < 1 || n as u64 > size / 12 {
            return Err(err(path, format!("entry count {n} is not plausible for a {size} byte file")));
        }
        if n as u64 > MAX_ENTRIES {
            return Err(err(path, format!("entry count {n} exceeds the cap of {MAX_ENTRIES}")));
        }
        let mut off = 4u64;
        let mut out = HashMap::new();
        for i in 0..n {
            let len = read_i32(off)?;
            if len < 0 || len as u64 > MAX_NAME_BYTES || off + 4 + len as u64 > size {
                return Err(err(path, format!("entry {i}: bad name length {len}")));
            }
            let mut name = vec![0u8; len as usize];
            file.read_exact_at(&mut name, off + 4)?;
            let name = String::from_utf8(name).map_err(|_| err(path, format!("entry {i}: name is not UTF-8")))?;
            off += 4 + len as u64;
            let ncall = read_i32(off)?;
            let nval = read_i32(off + 4)?;
            if ncall < 0 {
                return Err(err(path, format!("entry {name}: ncall {ncall} is negative")));
            }
            if nval < 1 || off + 8 + 4 * nval as u64 > size {
                return Err(err(path, format!("entry {name}: {nval} values do not fit the file")));
            }
            let divisor = (ncall > 0).then_some(ncall as f32);
            let entry = Entry { sums_offset: off + 8, ne0: nval as usize, n_mat: 1, divisors: vec![divisor] };
            if out.insert(name.clone(), entry).is_some() {
                return Err(err(path, format!("entry {name} appears twice")));
            }
            off += 8 + 4 * nval as u64;
        }
        // Legacy MoE entries hold n_expert rows back to back: the caller's row length splits them.
        Ok((out, Self::legacy_trailer(file, off)))
    }

    /// The optional trailer of a legacy file, read as `common_imatrix_load_legacy` reads it:
    /// an int32 chunk count (kept even when the file ends inside it, with the bytes that
    /// were there), then an int32 length and the dataset name (kept up to its first NUL,
    /// only when it is all there).
    fn legacy_trailer(file: &SourceFile, off: u64) -> Meta {
        let mut meta = Meta { has_metadata: true, ..Meta::default() };
        let size = file.size();
        if off >= size {
            return meta;
        }
        let mut b = [0u8; 4];
        let n = (size - off).min(4) as usize;
        if let Some(piece) = b.get_mut(..n)
            && file.read_exact_at(piece, off).is_err()
        {
            return meta;
        }
        meta.chunk_count = i32::from_le_bytes(b);
        if n < 4 || size - off < 8 {
            return meta;
        }
        let mut l = [0u8; 4];
        if file.read_exact_at(&mut l, off + 4).is_err() {
            return meta;
        }
        let len = i32::from_le_bytes(l);
        // Only its first 4 KiB are read: nothing needs more than 127 bytes of it.
        if len > 0 && off + 8 + len as u64 <= size {
            let mut name = vec![0u8; (len as usize).min(4096)];
            if file.read_exact_at(&mut name, off + 8).is_ok() {
                let end = name.iter().position(|&c| c == 0).unwrap_or(name.len());
                name.truncate(end);
                meta.datasets.push(String::from_utf8_lossy(&name).into_owned());
            }
        }
        meta
    }

    /// Number of entries (what llama-quantize records as `quantize.imatrix.entries_count`).
    pub fn entry_count(&self) -> usize {
        self.entries.len()
    }

    /// The number of values of the entry named exactly `name` (all its rows), if there is one.
    pub fn entry_len(&self, name: &str) -> Option<usize> {
        self.entries.get(name).map(|e| e.ne0 * e.n_mat)
    }

    /// Values `start..start + len` of entry `name`, flat over its rows, normalized as
    /// llama-quantize's loader does (GGUF: each row by its count, ones where the count is 0;
    /// legacy: by ncall when positive), each checked to be a finite number in 0..=1e30.
    pub fn values(&self, name: &str, start: usize, len: usize) -> Result<Vec<f32>, ViewError> {
        let e = self.entries.get(name).ok_or_else(|| err(&self.path, format!("no importance entry {name}")))?;
        if start.checked_add(len).is_none_or(|end| end > e.ne0 * e.n_mat) {
            return Err(err(&self.path, format!("{name}: values {start}..+{len} outside its {}", e.ne0 * e.n_mat)));
        }
        let mut b = vec![0u8; 4 * len];
        self.file.read_exact_at(&mut b, e.sums_offset + 4 * start as u64)?;
        let mut out = Vec::with_capacity(len);
        for (i, x) in b.as_chunks::<4>().0.iter().enumerate() {
            let at = start + i;
            let row = if e.n_mat == 1 { 0 } else { at / e.ne0.max(1) };
            let s = f32::from_le_bytes(*x);
            let v = match (e.divisors.get(row).copied().flatten(), self.format) {
                (Some(d), _) => s / d,
                (None, "gguf") => 1.0,
                (None, _) => s,
            };
            if !valid_number(v) {
                return Err(err(&self.path, format!("{name}: importance {v:?} at value {at} {NUMBER_RULE}")));
            }
            out.push(v);
        }
        Ok(out)
    }

    /// Every value of every entry checked (llama-quantize checks them all before it writes:
    /// "imatrix contains non-finite value"), a row of values at a time.
    pub fn check_all(&self) -> Result<(), ViewError> {
        let mut names: Vec<&String> = self.entries.keys().collect();
        names.sort();
        for name in names {
            let Some(e) = self.entries.get(name) else { continue };
            let total = e.ne0 * e.n_mat;
            let step = e.ne0.clamp(1, 1 << 20);
            let mut at = 0;
            while at < total {
                let n = step.min(total - at);
                self.values(name, at, n)?;
                at += n;
            }
        }
        Ok(())
    }

    /// The llama.cpp entry name and row for a DeepSeek expert tensor name.
    pub fn entry_for(name: &str) -> Option<(String, usize)> {
        let rest = name.strip_prefix("layers.")?;
        let (layer, rest) = rest.split_once(".ffn.experts.")?;
        let (expert, proj) = rest.split_once('.')?;
        let role = match proj {
            "w1.weight" => "gate",
            "w3.weight" => "up",
            "w2.weight" => "down",
            _ => return None,
        };
        Some((format!("blk.{layer}.ffn_{role}_exps.weight"), expert.parse().ok()?))
    }

    /// Describe where a tensor's importance row comes from, or why there is none.
    pub fn locate(&self, name: &str, k: usize) -> Result<(String, usize), NoRow> {
        let tensor = || name.to_string();
        if k == 0 {
            return Err(NoRow::EmptyRows { tensor: tensor() });
        }
        if let Some(e) = self.entries.get(name)
            && e.ne0 * e.n_mat == k
        {
            return Ok((name.to_string(), 0));
        }
        let (entry, row) = Self::entry_for(name).ok_or_else(|| NoRow::NotExpert { tensor: tensor() })?;
        let Some(e) = self.entries.get(&entry) else { return Err(NoRow::NoEntry { entry, tensor: tensor() }) };
        let (ne0, rows) = if e.n_mat == 1 && e.ne0 % k == 0 { (k, e.ne0 / k) } else { (e.ne0, e.n_mat) };
        if ne0 != k {
            return Err(NoRow::RowLength { entry, has: ne0, tensor: tensor(), needs: k });
        }
        if row >= rows {
            return Err(NoRow::RowCount { entry, rows, tensor: tensor(), row });
        }
        Ok((entry, row))
    }

    /// The importance row (length `k`) for a tensor. Every importance must be a finite
    /// number in 0..=1e30 (NaN, infinite, negative or overflowing ones would make every
    /// quantised value of the row meaningless): the row is refused, naming entry, row and
    /// column.
    pub fn row(&self, name: &str, k: usize) -> Result<Vec<f32>, ViewError> {
        let (entry, row) = self.locate(name, k).map_err(|r| err(&self.path, r.to_string()))?;
        let e = self.entries.get(&entry).ok_or_else(|| err(&self.path, format!("internal: no entry {entry}")))?;
        let mut b = vec![0u8; 4 * k];
        self.file.read_exact_at(&mut b, e.sums_offset + row as u64 * k as u64 * 4)?;
        let divisor = e.divisors.get(if e.n_mat == 1 { 0 } else { row }).copied().flatten();
        let values: Vec<f32> = b
            .as_chunks::<4>()
            .0
            .iter()
            .map(|x| {
                let s = f32::from_le_bytes(*x);
                match (divisor, self.format) {
                    (Some(d), _) => s / d,
                    (None, "gguf") => 1.0,
                    (None, _) => s,
                }
            })
            .collect();
        if let Some((i, v)) = values.iter().enumerate().find(|(_, v)| !valid_number(**v)) {
            return Err(err(&self.path, format!("{entry} row {row}: importance {v:?} at column {i} {NUMBER_RULE}")));
        }
        Ok(values)
    }

    pub fn describe(&self) -> String {
        format!("imatrix {} ({} format, sha256 {})", self.path.display(), self.format, self.sha256)
    }
}
