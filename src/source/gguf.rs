//! GGUF reader (versions 2 and 3), headers only.
//!
//! The header is read with `pread` into a buffer that grows as parsing needs it, capped
//! at [`Limits::max_header_bytes`], so a hostile file cannot make the daemon allocate
//! more than the caps allow: every count and length is checked against its cap and
//! against the bytes that remain in the file *before* anything is allocated for it, and
//! the caps are named in the refusals. Metadata arrays are parsed in full, but their
//! values are kept only up to [`Limits::max_kept_elements`] in all. Tensor data is never
//! read here.
//!
//! Validation follows ggml's loader (`gguf.cpp`) where it is stricter than gguf-py:
//! version 2 or 3, tensor names shorter than 64 bytes and unique, 1..=4 dimensions,
//! known types, the first dimension a whole number of blocks, byte sizes that do not
//! overflow, offsets aligned to `general.alignment`; plus what a filesystem needs: every
//! tensor inside the file and no two tensors overlapping; the parts of a split set name
//! themselves consistently (`split.no`, `split.count`, and `split.tensors.count` and
//! `general.architecture` where stated).
//!
//! No indexing that could panic (`clippy::indexing_slicing` is denied here): every byte of
//! the header is reached through checked reads.
#![deny(clippy::indexing_slicing)]

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};

use super::{Source, SourceError, SourceFile, SourceKind, TensorDtype, TensorInfo};
use crate::codec::GgmlType;

pub const GGUF_MAGIC: &[u8; 4] = b"GGUF";
pub const DEFAULT_ALIGNMENT: u64 = 32;
pub const MAX_NAME_BYTES: u64 = 63;
pub const MAX_DIMS: u32 = 4;

/// Caps on what a header may make the reader allocate. With the defaults a refused (or
/// accepted) header costs at most about 64 MiB of buffer, 50 MiB of kept metadata values
/// and 20 MiB of tensor table. Real headers are far below: a DeepSeek GGUF holds about
/// 1,100 tensors, 50 keys and a 6 MB tokenizer.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_header_bytes: u64,
    pub max_tensors: u64,
    pub max_kv: u64,
    pub max_string_bytes: u64,
    /// Arrays longer than this are parsed (and checked) but their values are not kept.
    pub max_kept_array_len: u64,
    /// Array values kept over the whole header; arrays beyond are parsed but not kept.
    pub max_kept_elements: u64,
    pub max_split_files: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_header_bytes: 64 << 20,
            max_tensors: 1 << 16,
            max_kv: 1 << 16,
            max_string_bytes: 32 << 20,
            max_kept_array_len: 1 << 20,
            max_kept_elements: 1 << 20,
            max_split_files: 4096,
        }
    }
}

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum MetaValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    Str(String),
    /// Element type id, element count, and the values when the array is short enough to keep.
    Array {
        elem_type: u32,
        len: u64,
        values: Option<Vec<MetaValue>>,
    },
    U64(u64),
    I64(i64),
    F64(f64),
}

impl MetaValue {
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            MetaValue::U8(v) => Some(v as u64),
            MetaValue::U16(v) => Some(v as u64),
            MetaValue::U32(v) => Some(v as u64),
            MetaValue::U64(v) => Some(v),
            MetaValue::I8(v) if v >= 0 => Some(v as u64),
            MetaValue::I16(v) if v >= 0 => Some(v as u64),
            MetaValue::I32(v) if v >= 0 => Some(v as u64),
            MetaValue::I64(v) if v >= 0 => Some(v as u64),
            _ => None,
        }
    }
    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetaValue::Str(s) => Some(s),
            _ => None,
        }
    }
}

/// Header facts of one GGUF file.
#[derive(Debug, Clone)]
pub struct GgufFileHeader {
    pub version: u32,
    pub alignment: u64,
    pub data_offset: u64,
    pub tensor_count: u64,
    pub metadata: BTreeMap<String, MetaValue>,
}

/// GGUF-specific facts of a source: one header per file (one file unless split).
#[derive(Debug, Clone)]
pub struct GgufMeta {
    pub headers: Vec<GgufFileHeader>,
}

impl GgufMeta {
    /// Metadata of the first file (split files repeat the model's keys in the first one).
    pub fn metadata(&self) -> &BTreeMap<String, MetaValue> {
        static NONE: BTreeMap<String, MetaValue> = BTreeMap::new();
        self.headers.first().map_or(&NONE, |h| &h.metadata)
    }
    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.metadata().get(key)
    }
    /// `{general.architecture}.{suffix}` as an unsigned integer.
    pub fn arch_u64(&self, suffix: &str) -> Option<u64> {
        let arch = self.get("general.architecture")?.as_str()?;
        self.get(&format!("{arch}.{suffix}"))?.as_u64()
    }
}

/// `prefix-00001-of-00003` -> (`prefix`, 1, 3).
pub fn split_parts(stem: &str) -> Option<(&str, u32, u32)> {
    let (rest, count) = stem.rsplit_once("-of-")?;
    let (prefix, no) = rest.rsplit_once('-')?;
    if no.len() != 5 || count.len() != 5 || !no.bytes().all(|b| b.is_ascii_digit()) || !count.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((prefix, no.parse().ok()?, count.parse().ok()?))
}

/// Open a GGUF file, or a whole split set when `path` names one of its parts.
pub fn open(path: &Path) -> Result<Source, SourceError> {
    open_with_limits(path, &Limits::default())
}

pub fn open_with_limits(path: &Path, limits: &Limits) -> Result<Source, SourceError> {
    let paths = split_set_paths(path, limits)?;
    let mut files = Vec::with_capacity(paths.len());
    let mut headers = Vec::with_capacity(paths.len());
    let mut tensors: Vec<TensorInfo> = Vec::new();
    let mut names: HashSet<String> = HashSet::new();
    let parsed = super::open_parsed(&paths, |file, index, base| parse_file(file, index, base, limits))?;
    for ((index, p), (file, header, file_tensors)) in paths.iter().enumerate().zip(parsed) {
        if paths.len() > 1 {
            check_split_keys(p, &header, index as u64, paths.len() as u64)?;
            if let (Some(first), Some(first_path)) = (headers.first(), paths.first()) {
                check_same_set(p, first_path, first, &header)?;
            }
        }
        for t in file_tensors {
            if !names.insert(t.name.clone()) {
                return Err(SourceError::tensor(p, &t.name, "duplicate tensor name in the split set"));
            }
            tensors.push(t);
        }
        headers.push(header);
        files.push(file);
    }
    if paths.len() > 1
        && let (Some(first), Some(first_path)) = (headers.first(), paths.first())
        && let Some(total) = first.metadata.get("split.tensors.count").and_then(MetaValue::as_u64)
        && total != tensors.len() as u64
    {
        return Err(SourceError::format(first_path, format!("split.tensors.count is {total} but the set holds {} tensors", tensors.len())));
    }
    Ok(Source { files, kind: SourceKind::Gguf(GgufMeta { headers }), tensors })
}

fn split_set_paths(path: &Path, limits: &Limits) -> Result<Vec<PathBuf>, SourceError> {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let Some(stem) = name.strip_suffix(".gguf") else {
        return Ok(vec![path.to_path_buf()]);
    };
    let Some((prefix, no, count)) = split_parts(stem) else {
        return Ok(vec![path.to_path_buf()]);
    };
    if count == 0 || count > limits.max_split_files {
        return Err(SourceError::format(path, format!("split count {count} is out of range 1..={}", limits.max_split_files)));
    }
    if no == 0 || no > count {
        return Err(SourceError::format(path, format!("split part number {no} is out of range 1..={count}: the set has no such part")));
    }
    let dir = path.parent().unwrap_or(Path::new("."));
    let paths: Vec<PathBuf> = (1..=count).map(|i| dir.join(format!("{prefix}-{i:05}-of-{count:05}.gguf"))).collect();
    // A remote directory is listed once (one request), so the parts' checks below need no
    // request each.
    if super::remote::is_remote(dir) {
        let _ = super::remote::list_dir(dir);
    }
    // Every part must be there and be a regular file before any is opened.
    for p in &paths {
        match super::check_file(p) {
            Err(SourceError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
                return Err(SourceError::format(p, format!("part of a {count}-file split set is missing")));
            }
            Err(e) => return Err(e),
            Ok(_) => {}
        }
    }
    Ok(paths)
}

fn check_split_keys(path: &Path, header: &GgufFileHeader, index: u64, count: u64) -> Result<(), SourceError> {
    let get = |key: &str| header.metadata.get(key).and_then(MetaValue::as_u64);
    match (get("split.no"), get("split.count")) {
        (Some(no), Some(c)) if no == index && c == count => Ok(()),
        (no, c) => Err(SourceError::format(path, format!("split keys say split.no={no:?} split.count={c:?}, expected {index} of {count} from the file name"))),
    }
}

/// A part of a split set must describe the same set as the first part: where both state
/// `split.tensors.count` or `general.architecture`, they agree (a part from another set,
/// with the same file name pattern, is named here rather than as a tensor-count mismatch).
fn check_same_set(path: &Path, first_path: &Path, first: &GgufFileHeader, header: &GgufFileHeader) -> Result<(), SourceError> {
    let differ = |key: &str| -> Option<(String, String)> {
        let (a, b) = (first.metadata.get(key)?, header.metadata.get(key)?);
        let same = match (a.as_u64(), b.as_u64()) {
            (Some(x), Some(y)) => x == y,
            _ => a == b,
        };
        let show = |v: &MetaValue| v.as_str().map(|s| format!("{s:?}")).or_else(|| v.as_u64().map(|n| n.to_string())).unwrap_or_else(|| format!("{v:?}"));
        (!same).then(|| (show(a), show(b)))
    };
    for key in ["split.tensors.count", "general.architecture"] {
        if let Some((a, b)) = differ(key) {
            return Err(SourceError::format(path, format!("{key} is {b} but {} says {a}: a part of another split set?", first_path.display())));
        }
    }
    Ok(())
}

/// Buffered header cursor: pread on demand, bounded by the cap and the file size.
struct Cursor<'a> {
    file: &'a SourceFile,
    buf: Vec<u8>,
    pos: u64,
    limit: u64,
    cap: u64,
    /// Array values that may still be kept (of [`Limits::max_kept_elements`]).
    keep_budget: u64,
}

/// The parser's first read of a file's header.
const FIRST_READ: u64 = 256 << 10;

impl<'a> Cursor<'a> {
    fn new(file: &'a SourceFile, cap: u64, keep_budget: u64) -> Self {
        Cursor { file, buf: Vec::new(), pos: 0, limit: file.size().min(cap), cap, keep_budget }
    }

    fn err(&self, rule: impl Into<String>) -> SourceError {
        SourceError::format(self.file.path(), rule)
    }

    fn remaining(&self) -> u64 {
        self.file.size().saturating_sub(self.pos)
    }

    /// Make `n` bytes at the cursor available, failing if the file or the cap ends first.
    fn take(&mut self, n: u64, what: &str) -> Result<&[u8], SourceError> {
        let end = self.pos.checked_add(n).ok_or_else(|| self.err(format!("{what}: length overflows")))?;
        if end > self.file.size() {
            return Err(self.err(format!("truncated: {what} needs {n} bytes at offset {}, but the file is {} bytes", self.pos, self.file.size())));
        }
        if end > self.limit {
            return Err(self.err(format!("header exceeds the {} byte cap while reading {what}", self.cap)));
        }
        if end > self.buf.len() as u64 {
            // Doubling from 256 KiB: few reads for a large header (a vocabulary of 8 MB takes
            // six), little read past a small one (each read is a round trip to a remote store).
            let want = end.max((self.buf.len() as u64 * 2).max(FIRST_READ).min(self.limit));
            let start = self.buf.len();
            self.buf.resize(want as usize, 0);
            if let Some(fresh) = self.buf.get_mut(start..) {
                self.file.read_exact_at(fresh, start as u64)?;
            }
        }
        let (from, to) = (self.pos as usize, end as usize);
        self.pos = end;
        // In range: `end` was checked against the buffer (grown to it) above.
        self.buf.get(from..to).ok_or_else(|| SourceError::format(self.file.path(), format!("internal: header read {from}..{to} past the buffer")))
    }

    fn u8(&mut self, what: &str) -> Result<u8, SourceError> {
        let b = self.take(1, what)?.first().copied();
        b.ok_or_else(|| self.err(format!("truncated: {what}")))
    }
    fn u16(&mut self, what: &str) -> Result<u16, SourceError> {
        Ok(u16::from_le_bytes(self.take(2, what)?.try_into().unwrap()))
    }
    fn u32(&mut self, what: &str) -> Result<u32, SourceError> {
        Ok(u32::from_le_bytes(self.take(4, what)?.try_into().unwrap()))
    }
    fn u64(&mut self, what: &str) -> Result<u64, SourceError> {
        Ok(u64::from_le_bytes(self.take(8, what)?.try_into().unwrap()))
    }

    fn string(&mut self, what: &str, max: u64) -> Result<String, SourceError> {
        let len = self.u64(what)?;
        if len > max {
            return Err(self.err(format!("{what}: string length {len} exceeds the cap of {max} bytes")));
        }
        if len > self.remaining() {
            return Err(self.err(format!("truncated: {what} claims a {len} byte string at offset {}, but only {} bytes remain", self.pos, self.remaining())));
        }
        let bytes = self.take(len, what)?.to_vec();
        String::from_utf8(bytes).map_err(|_| self.err(format!("{what}: string is not valid UTF-8")))
    }
}

const TYPE_ARRAY: u32 = 9;
const TYPE_STRING: u32 = 8;

fn scalar_size(t: u32) -> Option<u64> {
    match t {
        0 | 1 | 7 => Some(1),
        2 | 3 => Some(2),
        4..=6 => Some(4),
        10..=12 => Some(8),
        _ => None,
    }
}

/// One metadata value; `what` names it in errors ("metadata \"key\"").
fn read_value(c: &mut Cursor, t: u32, what: &str, limits: &Limits, in_array: bool) -> Result<MetaValue, SourceError> {
    Ok(match t {
        0 => MetaValue::U8(c.u8(what)?),
        1 => MetaValue::I8(c.u8(what)? as i8),
        2 => MetaValue::U16(c.u16(what)?),
        3 => MetaValue::I16(c.u16(what)? as i16),
        4 => MetaValue::U32(c.u32(what)?),
        5 => MetaValue::I32(c.u32(what)? as i32),
        6 => MetaValue::F32(f32::from_bits(c.u32(what)?)),
        7 => match c.u8(what)? {
            0 => MetaValue::Bool(false),
            1 => MetaValue::Bool(true),
            v => return Err(c.err(format!("{what}: bool value {v} is neither 0 nor 1"))),
        },
        TYPE_STRING => MetaValue::Str(c.string(what, limits.max_string_bytes)?),
        TYPE_ARRAY => {
            if in_array {
                return Err(c.err(format!("{what}: nested arrays are not allowed")));
            }
            let elem_type = c.u32(what)?;
            let len = c.u64(what)?;
            let min_elem = match elem_type {
                TYPE_STRING => 8,
                TYPE_ARRAY => return Err(c.err(format!("{what}: nested arrays are not allowed"))),
                t => scalar_size(t).ok_or_else(|| c.err(format!("{what}: unknown array element type {t}")))?,
            };
            if len.checked_mul(min_elem).is_none_or(|n| n > c.remaining()) {
                return Err(c.err(format!("{what}: array of {len} elements cannot fit in the {} bytes that remain", c.remaining())));
            }
            let keep = len <= limits.max_kept_array_len && len <= c.keep_budget;
            if keep {
                c.keep_budget -= len;
            } else if elem_type != TYPE_STRING {
                // Scalars that are not kept: checked in one pass over their bytes.
                let bad_bool = c.take(len * min_elem, what)?.iter().copied().find(|&b| b > 1).filter(|_| elem_type == 7);
                if let Some(v) = bad_bool {
                    return Err(c.err(format!("{what}: bool value {v} is neither 0 nor 1")));
                }
                return Ok(MetaValue::Array { elem_type, len, values: None });
            }
            let mut values = if keep { Some(Vec::with_capacity(len as usize)) } else { None };
            for _ in 0..len {
                let v = read_value(c, elem_type, what, limits, true)?;
                if let Some(vs) = values.as_mut() {
                    vs.push(v);
                }
            }
            MetaValue::Array { elem_type, len, values }
        }
        10 => MetaValue::U64(c.u64(what)?),
        11 => MetaValue::I64(c.u64(what)? as i64),
        12 => MetaValue::F64(f64::from_bits(c.u64(what)?)),
        t => return Err(c.err(format!("{what}: unknown value type {t}"))),
    })
}

/// Parse one GGUF file's header and tensor table, and validate the tensor ranges.
pub fn parse_file(file: &SourceFile, file_index: usize, logical_base: u64, limits: &Limits) -> Result<(GgufFileHeader, Vec<TensorInfo>), SourceError> {
    let path = file.path();
    let mut c = Cursor::new(file, limits.max_header_bytes, limits.max_kept_elements);
    let magic = c.take(4, "magic")?;
    if magic != GGUF_MAGIC {
        return Err(SourceError::format(path, format!("bad magic {:02x?}: not a GGUF file", magic)));
    }
    let version = c.u32("version")?;
    if version != 2 && version != 3 {
        return Err(SourceError::format(path, format!("unsupported GGUF version {version} (2 and 3 are supported)")));
    }
    let tensor_count = c.u64("tensor count")?;
    let kv_count = c.u64("metadata count")?;
    if tensor_count > limits.max_tensors {
        return Err(SourceError::format(path, format!("tensor count {tensor_count} exceeds the cap of {}", limits.max_tensors)));
    }
    if kv_count > limits.max_kv {
        return Err(SourceError::format(path, format!("metadata count {kv_count} exceeds the cap of {}", limits.max_kv)));
    }
    // A tensor info takes at least 8 (name len) + 4 (n_dims) + 8 (ne) + 4 (type) + 8 (offset) bytes,
    // a key/value at least 8 + 4 + 1.
    if tensor_count * 32 > c.remaining() {
        return Err(SourceError::format(path, format!("tensor count {tensor_count} cannot fit in the {} bytes that remain", c.remaining())));
    }
    if kv_count * 13 > c.remaining() {
        return Err(SourceError::format(path, format!("metadata count {kv_count} cannot fit in the {} bytes that remain", c.remaining())));
    }

    let mut metadata = BTreeMap::new();
    for i in 0..kv_count {
        let key = c.string(&format!("metadata key #{i}"), 65535)?;
        let t = c.u32(&format!("type of metadata {key:?}"))?;
        let value = read_value(&mut c, t, &format!("metadata {key:?}"), limits, false)?;
        if metadata.insert(key.clone(), value).is_some() {
            return Err(SourceError::format(path, format!("duplicate metadata key {key:?}")));
        }
    }

    let alignment = match metadata.get("general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some(MetaValue::U32(a)) if *a != 0 && a.is_power_of_two() => *a as u64,
        Some(v) => {
            return Err(SourceError::format(path, format!("general.alignment must be a UINT32 power of two, got {v:?}")));
        }
    };

    struct RawInfo {
        name: String,
        shape: Vec<u64>,
        type_id: u32,
        rel_offset: u64,
    }
    let mut raw = Vec::with_capacity(tensor_count as usize);
    let mut seen = HashSet::with_capacity(tensor_count as usize);
    for i in 0..tensor_count {
        let name = c.string(&format!("name of tensor #{i}"), limits.max_string_bytes)?;
        if name.len() as u64 > MAX_NAME_BYTES {
            return Err(SourceError::tensor(path, &name, format!("name is {} bytes; ggml allows at most {MAX_NAME_BYTES}", name.len())));
        }
        if !seen.insert(name.clone()) {
            return Err(SourceError::tensor(path, &name, "duplicate tensor name"));
        }
        let n_dims = c.u32(&format!("dimension count of tensor {name:?}"))?;
        if n_dims == 0 || n_dims > MAX_DIMS {
            return Err(SourceError::tensor(path, &name, format!("{n_dims} dimensions; 1 to {MAX_DIMS} are allowed")));
        }
        let mut shape = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            shape.push(c.u64(&format!("shape of tensor {name:?}"))?);
        }
        let type_id = c.u32(&format!("type of tensor {name:?}"))?;
        let rel_offset = c.u64(&format!("offset of tensor {name:?}"))?;
        raw.push(RawInfo { name, shape, type_id, rel_offset });
    }
    let header_end = c.pos;
    let data_offset = header_end.checked_next_multiple_of(alignment).ok_or_else(|| SourceError::format(path, "data offset overflows"))?;
    if data_offset > file.size() && tensor_count > 0 {
        return Err(SourceError::format(path, format!("truncated: the data section starts at {data_offset} but the file is {} bytes", file.size())));
    }

    let mut tensors = Vec::with_capacity(raw.len());
    for r in raw {
        let ggml_type = GgmlType::from_id(r.type_id).ok_or_else(|| SourceError::tensor(path, &r.name, format!("unknown ggml type id {}", r.type_id)))?;
        let Some((&ne0, higher)) = r.shape.split_first() else {
            return Err(SourceError::tensor(path, &r.name, "a tensor needs at least one dimension"));
        };
        let mut rows = 1u64;
        for &d in higher {
            rows = rows.checked_mul(d).ok_or_else(|| SourceError::tensor(path, &r.name, "element count overflows"))?;
        }
        if !ne0.is_multiple_of(ggml_type.block_size) {
            return Err(SourceError::tensor(
                path,
                &r.name,
                format!("first dimension {ne0} is not a multiple of the {} block size {}", ggml_type, ggml_type.block_size),
            ));
        }
        let row_bytes = ggml_type.row_bytes(ne0).ok_or_else(|| {
            SourceError::tensor(
                path,
                &r.name,
                format!(
                    "row byte size overflows: first dimension {ne0} of {} ({} bytes per {} elements)",
                    ggml_type, ggml_type.type_size, ggml_type.block_size
                ),
            )
        })?;
        let nbytes = row_bytes
            .checked_mul(rows)
            .filter(|n| *n <= i64::MAX as u64)
            .ok_or_else(|| SourceError::tensor(path, &r.name, format!("byte size of shape {:?} overflows", r.shape)))?;
        if r.rel_offset % alignment != 0 {
            return Err(SourceError::tensor(path, &r.name, format!("offset {} is not a multiple of the alignment {alignment}", r.rel_offset)));
        }
        let offset = data_offset.checked_add(r.rel_offset).ok_or_else(|| SourceError::tensor(path, &r.name, "offset overflows"))?;
        if offset.checked_add(nbytes).is_none_or(|end| end > file.size()) {
            return Err(SourceError::tensor(
                path,
                &r.name,
                format!("data [{offset}, {offset}+{nbytes}) lies beyond the end of the file ({} bytes)", file.size()),
            ));
        }
        tensors.push(TensorInfo {
            name: r.name,
            dtype: TensorDtype::Ggml(ggml_type),
            shape: r.shape,
            file: file_index,
            offset,
            nbytes,
            logical_offset: logical_base + offset,
        });
    }

    let mut by_offset: Vec<&TensorInfo> = tensors.iter().collect();
    by_offset.sort_by_key(|t| (t.offset, t.nbytes));
    for pair in by_offset.windows(2) {
        if let [a, b] = pair
            && a.nbytes > 0
            && b.offset < a.offset + a.nbytes
        {
            return Err(SourceError::tensor(path, &b.name, format!("data at {} overlaps tensor {:?} ending at {}", b.offset, a.name, a.offset + a.nbytes)));
        }
    }

    Ok((GgufFileHeader { version, alignment, data_offset, tensor_count, metadata }, tensors))
}

#[cfg(test)]
#[allow(clippy::indexing_slicing)]
mod tests {
    use super::*;

    fn sample_bytes() -> Vec<u8> {
        std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/samples/sample-moe.gguf")).unwrap()
    }

    fn open_bytes(dir: &Path, name: &str, bytes: &[u8]) -> Result<Source, SourceError> {
        let p = dir.join(name);
        std::fs::write(&p, bytes).unwrap();
        open(&p)
    }

    #[test]
    fn sample_parses_with_every_value_type() {
        let dir = tempfile::tempdir().unwrap();
        let s = open_bytes(dir.path(), "s.gguf", &sample_bytes()).unwrap();
        let meta = s.gguf().unwrap();
        assert_eq!(meta.headers[0].version, 3);
        assert_eq!(meta.get("xpackfs.sample.u8"), Some(&MetaValue::U8(200)));
        assert_eq!(meta.get("xpackfs.sample.i8"), Some(&MetaValue::I8(-100)));
        assert_eq!(meta.get("xpackfs.sample.u16"), Some(&MetaValue::U16(60000)));
        assert_eq!(meta.get("xpackfs.sample.i16"), Some(&MetaValue::I16(-30000)));
        assert_eq!(meta.get("xpackfs.sample.u32"), Some(&MetaValue::U32(4_000_000_000)));
        assert_eq!(meta.get("xpackfs.sample.i32"), Some(&MetaValue::I32(-2_000_000_000)));
        assert_eq!(meta.get("xpackfs.sample.f32"), Some(&MetaValue::F32(0.125)));
        assert_eq!(meta.get("xpackfs.sample.bool"), Some(&MetaValue::Bool(true)));
        assert_eq!(meta.get("xpackfs.sample.u64"), Some(&MetaValue::U64((1 << 63) + 5)));
        assert_eq!(meta.get("xpackfs.sample.i64"), Some(&MetaValue::I64(-(1 << 62))));
        assert_eq!(meta.get("xpackfs.sample.f64"), Some(&MetaValue::F64(2.5e-300)));
        assert_eq!(meta.get("xpackfs.sample.str").and_then(MetaValue::as_str), Some("ünïcode ✓"));
        match meta.get("tokenizer.ggml.tokens") {
            Some(MetaValue::Array { elem_type: 8, len: 64, values: Some(v) }) => assert_eq!(v[3], MetaValue::Str("tok3".into())),
            other => panic!("{other:?}"),
        }
        assert_eq!(meta.arch_u64("expert_count"), Some(8));
        let t = s.tensor("blk.1.ffn_down_exps.weight").unwrap();
        assert_eq!((t.shape.clone(), t.dtype.name(), t.nbytes), (vec![128, 256, 8], "MXFP4".to_string(), 8 * 17408));
        assert_eq!(t.offset % 32, 0);
    }

    #[test]
    fn version_2_reads_like_3_and_others_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut b = sample_bytes();
        let v3 = open_bytes(dir.path(), "a.gguf", &b).unwrap();
        b[4..8].copy_from_slice(&2u32.to_le_bytes());
        let v2 = open_bytes(dir.path(), "b.gguf", &b).unwrap();
        assert_eq!(v2.gguf().unwrap().headers[0].version, 2);
        assert_eq!(v2.tensors.len(), v3.tensors.len());
        for (a, b) in v2.tensors.iter().zip(&v3.tensors) {
            assert_eq!((&a.name, a.offset, a.nbytes), (&b.name, b.offset, b.nbytes));
        }
        for v in [0u32, 1, 4, 0xFFFF_FFFF] {
            b[4..8].copy_from_slice(&v.to_le_bytes());
            let e = open_bytes(dir.path(), "c.gguf", &b).unwrap_err().to_string();
            assert!(e.contains(&format!("unsupported GGUF version {v}")), "{e}");
        }
    }

    #[test]
    fn truncation_at_every_header_byte_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let b = sample_bytes();
        let full = open_bytes(dir.path(), "full.gguf", &b).unwrap();
        let data_offset = full.gguf().unwrap().headers[0].data_offset as usize;
        let last_end = full.tensors.iter().map(|t| t.offset + t.nbytes).max().unwrap() as usize;
        let cuts = (0..data_offset).chain((data_offset..last_end).step_by(997)).chain([last_end - 1]);
        for cut in cuts {
            let e = open_bytes(dir.path(), "cut.gguf", &b[..cut]).unwrap_err().to_string();
            assert!(e.contains("truncated") || e.contains("beyond the end of the file") || e.contains("cannot fit"), "cut at {cut}: {e}");
        }
    }

    #[test]
    fn header_cap_is_enforced() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("s.gguf");
        std::fs::write(&p, sample_bytes()).unwrap();
        let limits = Limits { max_header_bytes: 1000, ..Limits::default() };
        let e = open_with_limits(&p, &limits).unwrap_err().to_string();
        assert!(e.contains("header exceeds the 1000 byte cap"), "{e}");
    }

    #[test]
    fn parts_of_one_set_agree() {
        let header = |count: MetaValue, arch: &str| GgufFileHeader {
            version: 3,
            alignment: 32,
            data_offset: 0,
            tensor_count: 0,
            metadata: BTreeMap::from([("split.tensors.count".to_string(), count), ("general.architecture".to_string(), MetaValue::Str(arch.into()))]),
        };
        let (a, b) = (Path::new("m-00001-of-00002.gguf"), Path::new("m-00002-of-00002.gguf"));
        let first = header(MetaValue::I32(7), "kimi-k3");
        check_same_set(b, a, &first, &header(MetaValue::U64(7), "kimi-k3")).unwrap();
        let e = check_same_set(b, a, &first, &header(MetaValue::I32(9), "kimi-k3")).unwrap_err().to_string();
        assert!(e.starts_with("m-00002-of-00002.gguf: split.tensors.count is 9 but m-00001-of-00002.gguf says 7"), "{e}");
        let e = check_same_set(b, a, &first, &header(MetaValue::I32(7), "deepseek2")).unwrap_err().to_string();
        assert!(e.contains("general.architecture is \"deepseek2\" but m-00001-of-00002.gguf says \"kimi-k3\""), "{e}");
        // A key only one part states is not compared.
        let mut bare = header(MetaValue::I32(7), "kimi-k3");
        bare.metadata.remove("general.architecture");
        check_same_set(b, a, &first, &bare).unwrap();
    }

    #[test]
    fn counts_are_capped_before_anything_is_allocated() {
        let dir = tempfile::tempdir().unwrap();
        let mut b = sample_bytes();
        b[8..16].copy_from_slice(&(1u64 << 17).to_le_bytes());
        let e = open_bytes(dir.path(), "t.gguf", &b).unwrap_err().to_string();
        assert!(e.contains("tensor count 131072 exceeds the cap of 65536"), "{e}");
        let mut b = sample_bytes();
        b[16..24].copy_from_slice(&(1u64 << 17).to_le_bytes());
        let e = open_bytes(dir.path(), "k.gguf", &b).unwrap_err().to_string();
        assert!(e.contains("metadata count 131072 exceeds the cap of 65536"), "{e}");
    }

    #[test]
    fn kept_array_values_have_a_budget() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("s.gguf");
        std::fs::write(&p, sample_bytes()).unwrap();
        // The sample's arrays hold 64, 2 and 4 values: with room for 65, the first is kept
        // and the others are parsed and checked but not kept.
        let limits = Limits { max_kept_elements: 65, ..Limits::default() };
        let s = open_with_limits(&p, &limits).unwrap();
        let arrays: Vec<(u64, bool)> = s
            .gguf()
            .unwrap()
            .metadata()
            .values()
            .filter_map(|v| match v {
                MetaValue::Array { len, values, .. } => Some((*len, values.is_some())),
                _ => None,
            })
            .collect();
        assert!(arrays.len() >= 2, "{arrays:?}");
        let kept: u64 = arrays.iter().filter(|a| a.1).map(|a| a.0).sum();
        assert!(kept <= 65 && arrays.iter().any(|a| a.1) && arrays.iter().any(|a| !a.1), "{arrays:?}");
    }

    #[test]
    fn split_part_numbers_must_exist_and_parts_must_be_regular() {
        let dir = tempfile::tempdir().unwrap();
        for i in 1..=2 {
            std::fs::write(dir.path().join(format!("m-{i:05}-of-00002.gguf")), sample_bytes()).unwrap();
        }
        for bad in ["m-00000-of-00002.gguf", "m-00003-of-00002.gguf"] {
            std::fs::write(dir.path().join(bad), sample_bytes()).unwrap();
            let e = open(&dir.path().join(bad)).unwrap_err().to_string();
            let no = &bad[2..7].trim_start_matches('0');
            let no = if no.is_empty() { "0" } else { no };
            assert!(e.contains(&format!("split part number {no} is out of range 1..=2")), "{e}");
        }
        let part2 = dir.path().join("m-00002-of-00002.gguf");
        std::fs::remove_file(&part2).unwrap();
        let c = std::ffi::CString::new(part2.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
        let e = open(&dir.path().join("m-00001-of-00002.gguf")).unwrap_err().to_string();
        assert!(e.contains("m-00002-of-00002.gguf: is a FIFO, not a regular file"), "{e}");
    }

    #[test]
    fn split_names() {
        assert_eq!(split_parts("model-00002-of-00010"), Some(("model", 2, 10)));
        assert_eq!(split_parts("model-2-of-10"), None);
        assert_eq!(split_parts("model"), None);
    }
}
