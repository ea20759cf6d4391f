//! llama.cpp importance matrices, in both file formats, read lazily (a full V4.1
//! imatrix is about a gigabyte; rows are read when a tensor is quantised).
//!
//! * GGUF (`general.type = imatrix`): per weight, `<name>.in_sum2` (F32, ne = {ne0, n_mat})
//!   and `<name>.counts` (F32, n_mat); row j is `in_sum2[j] / counts[j]`, or all ones where
//!   the count is 0 (as llama.cpp's quantize loads it).
//! * legacy `imatrix.dat`: i32 entry count, then per entry i32 name length, name, i32
//!   ncall, i32 nval, nval f32 sums; values are `sums / ncall` (or the sums when ncall is 0).
//!
//! A DeepSeek expert weight `layers.L.ffn.experts.E.{w1,w3,w2}.weight` takes row E of
//! llama.cpp's `blk.L.ffn_{gate,up,down}_exps.weight`, or the single row of an entry named
//! exactly like the tensor.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::ViewError;
use crate::source::{Source, SourceFile};

fn err(path: &Path, rule: impl Into<String>) -> ViewError {
    ViewError::Option { option: "imatrix", rule: format!("{}: {}", path.display(), rule.into()) }
}

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
    file: Arc<SourceFile>,
    entries: HashMap<String, Entry>,
}

impl Imatrix {
    pub fn open(path: &Path) -> Result<Imatrix, ViewError> {
        let bytes_sha = {
            let b = std::fs::read(path).map_err(|e| err(path, e.to_string()))?;
            crate::digest::sha256_hex(&b)
        };
        let head = {
            let mut f = std::fs::File::open(path).map_err(|e| err(path, e.to_string()))?;
            let mut m = [0u8; 4];
            use std::io::Read;
            let _ = f.read(&mut m);
            m
        };
        let file = Arc::new(SourceFile::open(path)?);
        let (format, entries) = if &head == b"GGUF" { ("gguf", Self::gguf_entries(path, &file)?) } else { ("legacy-dat", Self::legacy_entries(path, &file)?) };
        if entries.is_empty() {
            return Err(err(path, "no importance entries"));
        }
        Ok(Imatrix { path: path.to_path_buf(), sha256: bytes_sha, format, file, entries })
    }

    fn gguf_entries(path: &Path, file: &Arc<SourceFile>) -> Result<HashMap<String, Entry>, ViewError> {
        let src: Source = crate::source::gguf::open(path)?;
        let by_name: HashMap<&str, &crate::source::TensorInfo> = src.tensors.iter().map(|t| (t.name.as_str(), t)).collect();
        let mut out = HashMap::new();
        for t in &src.tensors {
            let Some(name) = t.name.strip_suffix(".in_sum2") else { continue };
            let counts = by_name.get(format!("{name}.counts").as_str()).ok_or_else(|| err(path, format!("{name}: in_sum2 without counts")))?;
            if t.dtype.ggml().map(|g| g.name) != Some("F32") || counts.dtype.ggml().map(|g| g.name) != Some("F32") {
                return Err(err(path, format!("{name}: sums and counts must be F32")));
            }
            let ne0 = t.shape[0] as usize;
            let n_mat = (t.nbytes / 4) as usize / ne0.max(1);
            if counts.nbytes / 4 != n_mat as u64 {
                return Err(err(path, format!("{name}: {} counts for {n_mat} rows", counts.nbytes / 4)));
            }
            let mut c = vec![0u8; counts.nbytes as usize];
            file.read_exact_at(&mut c, counts.offset)?;
            let divisors = c
                .chunks_exact(4)
                .map(|b| {
                    let v = f32::from_le_bytes(b.try_into().unwrap()).round();
                    (v > 0.0).then_some(v)
                })
                .collect();
            out.insert(name.to_string(), Entry { sums_offset: t.offset, ne0, n_mat, divisors });
        }
        Ok(out)
    }

    fn legacy_entries(path: &Path, file: &Arc<SourceFile>) -> Result<HashMap<String, Entry>, ViewError> {
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
        let mut off = 4u64;
        let mut out = HashMap::new();
        for i in 0..n {
            let len = read_i32(off)?;
            if len < 0 || off + 4 + len as u64 > size {
                return Err(err(path, format!("entry {i}: bad name length {len}")));
            }
            let mut name = vec![0u8; len as usize];
            file.read_exact_at(&mut name, off + 4)?;
            let name = String::from_utf8(name).map_err(|_| err(path, format!("entry {i}: name is not UTF-8")))?;
            off += 4 + len as u64;
            let ncall = read_i32(off)?;
            let nval = read_i32(off + 4)?;
            if nval < 1 || off + 8 + 4 * nval as u64 > size {
                return Err(err(path, format!("entry {name}: {nval} values do not fit the file")));
            }
            let divisor = (ncall > 0).then_some(ncall as f32);
            out.insert(name, Entry { sums_offset: off + 8, ne0: nval as usize, n_mat: 1, divisors: vec![divisor] });
            off += 8 + 4 * nval as u64;
        }
        // Legacy MoE entries hold n_expert rows back to back: the caller's row length splits them.
        Ok(out)
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
    pub fn locate(&self, name: &str, k: usize) -> Result<(String, usize), String> {
        if let Some(e) = self.entries.get(name) {
            if e.ne0 * e.n_mat == k {
                return Ok((name.to_string(), 0));
            }
        }
        let (entry, row) = Self::entry_for(name).ok_or_else(|| format!("no importance entry for {name}"))?;
        let e = self.entries.get(&entry).ok_or_else(|| format!("no importance entry {entry} for {name}"))?;
        let (ne0, rows) = if e.n_mat == 1 && e.ne0 % k == 0 { (k, e.ne0 / k) } else { (e.ne0, e.n_mat) };
        if ne0 != k {
            return Err(format!("importance entry {entry} has rows of {ne0}, {name} needs {k}"));
        }
        if row >= rows {
            return Err(format!("importance entry {entry} has {rows} rows, {name} needs row {row}"));
        }
        Ok((entry, row))
    }

    /// The importance row (length `k`) for a tensor.
    pub fn row(&self, name: &str, k: usize) -> Result<Vec<f32>, ViewError> {
        let (entry, row) = self.locate(name, k).map_err(|r| err(&self.path, r))?;
        let e = &self.entries[&entry];
        let mut b = vec![0u8; 4 * k];
        self.file.read_exact_at(&mut b, e.sums_offset + (row * k * 4) as u64)?;
        let divisor = if e.n_mat == 1 { e.divisors[0] } else { e.divisors[row] };
        Ok(b.chunks_exact(4)
            .map(|x| {
                let s = f32::from_le_bytes(x.try_into().unwrap());
                match (divisor, self.format) {
                    (Some(d), _) => s / d,
                    (None, "gguf") => 1.0,
                    (None, _) => s,
                }
            })
            .collect())
    }

    pub fn describe(&self) -> String {
        format!("imatrix {} ({} format, sha256 {})", self.path.display(), self.format, self.sha256)
    }
}
