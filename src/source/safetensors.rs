//! safetensors checkpoints: a directory with `config.json`, `model.safetensors.index.json`
//! (`{"metadata": ..., "weight_map": {tensor: shard}}`) and its shards, or a single
//! `model.safetensors` (or any one `.safetensors` file).
//!
//! Each shard's header is validated with the `safetensors` crate's own rules (the code
//! Python's `safe_open` runs: its `TensorInfo` and `Metadata::new`): header length within the
//! file, UTF-8 JSON, known dtypes, data offsets contiguous from 0, in order, each matching its
//! shape, and ending exactly at the end of the file. On top of that: caps on the header length
//! and on the tensors and metadata entries it lists (checked while it is parsed, before
//! anything is built for them), no duplicate keys in a header, no tensor in two shards, the
//! index and the shards naming exactly the same tensors, and shard names that are plain file
//! names (nothing can point outside the directory). Only headers are read, with `pread`.
//! Every file (shard, index, `config.json`) must be a regular file after resolving symlinks
//! (a Hugging Face cache links shards to blobs); anything else is refused before it is opened.
//!
//! No indexing that could panic here (`clippy::indexing_slicing` is denied).
#![deny(clippy::indexing_slicing)]

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use safetensors::tensor::{Dtype, Metadata, TensorInfo as StInfo};
use serde::de::{DeserializeSeed, IgnoredAny, MapAccess, Visitor};

use super::json::{JsonError, read_capped};
use super::{Source, SourceError, SourceFile, SourceKind, TensorDtype, TensorInfo, present};

pub const INDEX_NAME: &str = "model.safetensors.index.json";
pub const SINGLE_NAME: &str = "model.safetensors";
/// Cap on one shard's JSON header (the `safetensors` crate allows 100 MB; real shards hold
/// well under 1 MB, a single-file checkpoint of a full MoE about 10 MB).
pub const MAX_HEADER_BYTES: u64 = 32 << 20;
/// Cap on the tensors one header lists.
pub const MAX_TENSORS_PER_SHARD: usize = 1 << 18;
/// Cap on the `__metadata__` entries of one header.
pub const MAX_METADATA_ENTRIES: usize = 1 << 16;
/// Caps on the index: bytes, and JSON values (a weight_map entry is two: key and value).
pub const MAX_INDEX_BYTES: u64 = 32 << 20;
pub const MAX_INDEX_ENTRIES: u64 = 1 << 20;
/// Caps on config.json.
pub const MAX_CONFIG_BYTES: u64 = 16 << 20;
pub const MAX_CONFIG_VALUES: u64 = 1 << 20;

/// One shard's header facts.
#[derive(Debug, Clone)]
pub struct ShardHeader {
    pub name: String,
    /// Length of the JSON header (the u64 at offset 0).
    pub header_len: u64,
    pub metadata: Option<HashMap<String, String>>,
}

#[derive(Debug, Clone)]
pub struct SafetensorsMeta {
    pub root: PathBuf,
    pub config: Option<serde_json::Value>,
    pub config_path: Option<PathBuf>,
    pub index_path: Option<PathBuf>,
    pub shards: Vec<ShardHeader>,
}

pub fn dtype_name(d: Dtype) -> String {
    format!("{d:?}")
}

fn read_json(path: &Path, what: &str, max_bytes: u64, max_values: u64) -> Result<serde_json::Value, SourceError> {
    read_capped(path, max_bytes, max_values).map_err(|e| match e {
        JsonError::Source(e) => e,
        JsonError::TooLarge { len, cap } => SourceError::format(path, format!("{what} is {len} bytes, over the {cap} byte cap")),
        JsonError::TooManyValues { cap } => SourceError::format(path, format!("{what} holds more than {cap} JSON values (the cap)")),
        JsonError::NotUtf8(e) => SourceError::format(path, format!("{what} is not valid JSON: not UTF-8 ({e})")),
        JsonError::Syntax(e) => SourceError::format(path, format!("{what} is not valid JSON: {e}")),
    })
}

/// A rule a header broke while it was parsed (the serde error only carries text).
enum HeaderRule {
    Duplicate(String),
    TooManyTensors(usize),
    TooManyMetadata(usize),
}

/// A shard header as the crate's `HashMetadata` reads it, but in file order, with duplicate
/// keys refused and the caps checked as entries arrive.
struct Header {
    metadata: Option<HashMap<String, String>>,
    tensors: Vec<(String, StInfo)>,
}

struct HeaderSeed<'a>(&'a RefCell<Option<HeaderRule>>);

impl<'de> DeserializeSeed<'de> for HeaderSeed<'_> {
    type Value = Header;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Header, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for HeaderSeed<'_> {
    type Value = Header;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a safetensors header (a JSON object of tensors)")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Header, A::Error> {
        use serde::de::Error;
        let mut header = Header { metadata: None, tensors: Vec::new() };
        let mut seen = std::collections::HashSet::new();
        while let Some(key) = map.next_key::<String>()? {
            if !seen.insert(key.clone()) {
                *self.0.borrow_mut() = Some(HeaderRule::Duplicate(key));
                return Err(A::Error::custom("duplicate key"));
            }
            if key == "__metadata__" {
                header.metadata = map.next_value_seed(MetadataSeed(self.0))?;
            } else {
                if header.tensors.len() >= MAX_TENSORS_PER_SHARD {
                    // Count the rest (without keeping them) for the message.
                    let mut n = header.tensors.len() + 1;
                    map.next_value::<IgnoredAny>()?;
                    while map.next_key::<IgnoredAny>()?.is_some() {
                        map.next_value::<IgnoredAny>()?;
                        n += 1;
                    }
                    *self.0.borrow_mut() = Some(HeaderRule::TooManyTensors(n));
                    return Err(A::Error::custom("too many tensors"));
                }
                header.tensors.push((key, map.next_value::<StInfo>()?));
            }
        }
        Ok(header)
    }
}

/// `__metadata__`: a map of strings, at most [`MAX_METADATA_ENTRIES`].
struct MetadataSeed<'a>(&'a RefCell<Option<HeaderRule>>);

impl<'de> DeserializeSeed<'de> for MetadataSeed<'_> {
    type Value = Option<HashMap<String, String>>;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_option(self)
    }
}

impl<'de> Visitor<'de> for MetadataSeed<'_> {
    type Value = Option<HashMap<String, String>>;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a map of strings")
    }
    fn visit_none<E: serde::de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        use serde::de::Error;
        let mut out = HashMap::new();
        let mut n = 0usize;
        while let Some(k) = map.next_key::<String>()? {
            n += 1;
            if n > MAX_METADATA_ENTRIES {
                // Count the rest (without keeping them) for the message.
                map.next_value::<IgnoredAny>()?;
                while map.next_key::<IgnoredAny>()?.is_some() {
                    map.next_value::<IgnoredAny>()?;
                    n += 1;
                }
                *self.0.borrow_mut() = Some(HeaderRule::TooManyMetadata(n));
                return Err(A::Error::custom("too many metadata entries"));
            }
            let v: String = map.next_value()?;
            out.insert(k, v);
        }
        Ok(Some(out))
    }
}

/// Parse one shard: header facts and its tensors (file index `file_index`).
pub fn parse_shard(file: &SourceFile, file_index: usize, logical_base: u64) -> Result<(ShardHeader, Vec<TensorInfo>), SourceError> {
    let path = file.path();
    let size = file.size();
    if size < 8 {
        return Err(SourceError::format(path, format!("truncated: {size} bytes, the header length alone needs 8")));
    }
    let mut len = [0u8; 8];
    file.read_exact_at(&mut len, 0)?;
    let n = u64::from_le_bytes(len);
    if n > MAX_HEADER_BYTES {
        return Err(SourceError::format(path, format!("header length {n} exceeds the cap of {MAX_HEADER_BYTES} bytes")));
    }
    if n > size - 8 {
        return Err(SourceError::format(path, format!("header length {n} runs past the end of the file ({size} bytes)")));
    }
    let mut text = vec![0u8; n as usize];
    file.read_exact_at(&mut text, 8)?;
    let json = std::str::from_utf8(&text).map_err(|_| SourceError::format(path, "header is not UTF-8"))?;
    let rule = RefCell::new(None);
    let mut de = serde_json::Deserializer::from_str(json);
    let parsed = HeaderSeed(&rule).deserialize(&mut de).and_then(|h| de.end().map(|()| h));
    let header = match (parsed, rule.into_inner()) {
        (Ok(h), _) => h,
        (Err(_), Some(HeaderRule::Duplicate(k))) => return Err(SourceError::tensor(path, &k, "duplicate key in the safetensors header")),
        (Err(_), Some(HeaderRule::TooManyTensors(n))) => {
            return Err(SourceError::format(path, format!("header lists {n} tensors, over the cap of {MAX_TENSORS_PER_SHARD}")));
        }
        (Err(_), Some(HeaderRule::TooManyMetadata(k))) => {
            return Err(SourceError::format(path, format!("__metadata__ holds {k} entries, over the cap of {MAX_METADATA_ENTRIES}")));
        }
        (Err(e), None) => return Err(SourceError::format(path, format!("invalid JSON in header: {e}"))),
    };
    drop(text);
    // The crate's own validation: offsets contiguous from 0 in offset order, sizes from shapes.
    let order: Vec<String> = header.tensors.iter().map(|(k, _)| k.clone()).collect();
    let mut by_offset = header.tensors;
    by_offset.sort_by_key(|(_, info)| info.data_offsets);
    let metadata = Metadata::new(header.metadata, by_offset).map_err(|e| match e {
        safetensors::SafeTensorError::InvalidOffset(t) => SourceError::tensor(path, &t, "data offsets are overlapping, out of order or leave a gap"),
        safetensors::SafeTensorError::TensorInvalidInfo => SourceError::format(path, "a tensor's data_offsets do not match its shape and dtype"),
        other => SourceError::format(path, other.to_string()),
    })?;
    if metadata.data_len() as u64 != size - 8 - n {
        return Err(SourceError::format(path, "the tensors' data does not end exactly at the end of the file (truncated or trailing bytes)"));
    }
    let data_start = 8 + n;
    let mut tensors = Vec::with_capacity(order.len());
    for name in order {
        let Some(info) = metadata.info(&name) else { continue };
        let (b, e) = info.data_offsets;
        tensors.push(TensorInfo {
            dtype: TensorDtype::Safetensors(info.dtype),
            shape: info.shape.iter().map(|&d| d as u64).collect(),
            file: file_index,
            offset: data_start + b as u64,
            nbytes: (e - b) as u64,
            logical_offset: logical_base + data_start + b as u64,
            name,
        });
    }
    tensors.sort_by_key(|t| t.offset);
    let header = ShardHeader {
        name: path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
        header_len: n,
        metadata: metadata.metadata().clone(),
    };
    Ok((header, tensors))
}

fn plain_name(root: &Path, index: &Path, name: &str) -> Result<(), SourceError> {
    let p = Path::new(name);
    if name.is_empty() || p.file_name().map(|n| n.to_string_lossy()) != Some(name.into()) || name == "." || name == ".." {
        return Err(SourceError::format(
            index,
            format!("shard name {name:?} is not a plain file name in {} (names may not leave the directory)", root.display()),
        ));
    }
    Ok(())
}

/// Open a safetensors checkpoint: a directory or a single `.safetensors` file.
pub fn open(path: &Path) -> Result<Source, SourceError> {
    let (root, config_path, index_path, shard_names) = if super::is_dir(path) {
        let root = path.to_path_buf();
        let config = root.join("config.json");
        let config_path = present(&config).then_some(config);
        let index = root.join(INDEX_NAME);
        if present(&index) {
            let v = read_json(&index, "the safetensors index", MAX_INDEX_BYTES, 2 * MAX_INDEX_ENTRIES + 4096)?;
            let map = v.get("weight_map").and_then(|m| m.as_object()).ok_or_else(|| SourceError::format(&index, "index has no weight_map object"))?;
            if map.is_empty() {
                return Err(SourceError::format(&index, "index weight_map is empty"));
            }
            if map.len() as u64 > MAX_INDEX_ENTRIES {
                return Err(SourceError::format(&index, format!("weight_map holds {} entries, over the cap of {MAX_INDEX_ENTRIES}", map.len())));
            }
            let mut names = Vec::new();
            for (tensor, shard) in map {
                let shard = shard.as_str().ok_or_else(|| SourceError::tensor(&index, tensor, "weight_map value is not a string"))?;
                plain_name(&root, &index, shard)?;
                names.push(shard.to_string());
            }
            names.sort();
            names.dedup();
            (root, config_path, Some((index, v)), names)
        } else if present(&root.join(SINGLE_NAME)) {
            (root, config_path, None, vec![SINGLE_NAME.to_string()])
        } else {
            return Err(SourceError::format(path, format!("neither {INDEX_NAME} nor {SINGLE_NAME} in the directory")));
        }
    } else {
        let root = path.parent().unwrap_or(Path::new(".")).to_path_buf();
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        (root, None, None, vec![name])
    };
    // Every shard must be a regular file before any is opened.
    for name in &shard_names {
        super::check_file(&root.join(name))?;
    }
    let config = match &config_path {
        Some(p) => Some(read_json(p, "config.json", MAX_CONFIG_BYTES, MAX_CONFIG_VALUES)?),
        None => None,
    };

    let mut files = Vec::with_capacity(shard_names.len());
    let mut shards = Vec::with_capacity(shard_names.len());
    let mut tensors: Vec<TensorInfo> = Vec::new();
    let mut owner: HashMap<String, String> = HashMap::new();
    let paths: Vec<PathBuf> = shard_names.iter().map(|n| root.join(n)).collect();
    let parsed = super::open_parsed(&paths, parse_shard)?;
    for ((name, p), (file, header, ts)) in shard_names.iter().zip(&paths).zip(parsed) {
        for t in ts {
            if let Some(prev) = owner.insert(t.name.clone(), name.clone()) {
                return Err(SourceError::tensor(p, &t.name, format!("tensor also in shard {prev}")));
            }
            tensors.push(t);
        }
        shards.push(header);
        files.push(file);
    }
    if let Some((index, v)) = &index_path {
        let map = v["weight_map"].as_object().into_iter().flatten();
        for (tensor, shard) in map {
            let shard = shard.as_str().unwrap_or_default();
            match owner.get(tensor) {
                None => return Err(SourceError::tensor(index, tensor, format!("named by the index in shard {shard}, but no shard holds it"))),
                Some(s) if s != shard => {
                    return Err(SourceError::tensor(index, tensor, format!("index says shard {shard}, but it is in {s}")));
                }
                _ => {}
            }
        }
        if let Some((t, s)) = owner.iter().find(|(t, _)| v["weight_map"].get(t.as_str()).is_none()) {
            return Err(SourceError::tensor(&root.join(s), t, "in the shard but not in the index"));
        }
    }
    Ok(Source { files, kind: SourceKind::Safetensors(SafetensorsMeta { root, config, config_path, index_path: index_path.map(|(p, _)| p), shards }), tensors })
}

/// Tensor names by shard, each shard's tensors in offset order.
pub fn by_shard(source: &Source) -> BTreeMap<usize, Vec<&TensorInfo>> {
    let mut m: BTreeMap<usize, Vec<&TensorInfo>> = BTreeMap::new();
    for t in &source.tensors {
        m.entry(t.file).or_default().push(t);
    }
    m
}

#[cfg(test)]
#[allow(clippy::indexing_slicing)]
mod tests {
    use super::*;

    fn shard(header: &str, data_len: usize) -> Vec<u8> {
        let mut h = header.as_bytes().to_vec();
        h.resize(h.len().next_multiple_of(8), b' ');
        let mut out = (h.len() as u64).to_le_bytes().to_vec();
        out.extend(h);
        out.extend(vec![0u8; data_len]);
        out
    }

    fn open_bytes(bytes: &[u8]) -> Result<Source, SourceError> {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("model.safetensors");
        std::fs::write(&p, bytes).unwrap();
        open(dir.path())
    }

    #[test]
    fn valid_shard_parses() {
        let s = open_bytes(&shard(
            r#"{"__metadata__":{"format":"pt"},"b":{"dtype":"BF16","shape":[2,2],"data_offsets":[8,16]},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#,
            16,
        ))
        .unwrap();
        let names: Vec<&str> = s.tensors.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["a", "b"], "offset order");
        assert_eq!(s.tensors[1].shape, [2, 2]);
        assert_eq!(s.tensors[1].nbytes, 8);
    }

    #[test]
    fn header_rules() {
        let cases: &[(&[u8], &str)] = &[
            (&shard(r#"{"a":{"dtype":"Q9","shape":[2],"data_offsets":[0,8]}}"#, 8), "unknown variant"),
            (
                &shard(r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}"#, 12),
                "tensor \"b\": data offsets",
            ),
            (
                &shard(r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[12,20]}}"#, 20),
                "tensor \"b\": data offsets",
            ),
            (&shard(r#"{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}"#, 8), "do not match its shape"),
            (&shard(r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#, 9), "does not end exactly at the end of the file"),
            (&shard(r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#, 4), "does not end exactly at the end of the file"),
            (&shard(r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#, 8), "duplicate key"),
            (&shard(r#"[1,2,3]"#, 0), "invalid JSON in header"),
            (&shard(r#"{"a":"#, 0), "invalid JSON in header"),
            (&shard(r#"{"__metadata__":{"k":[1]}}"#, 0), "invalid JSON in header"),
            (&[1, 2, 3], "truncated"),
            (&u64::MAX.to_le_bytes(), "header length 18446744073709551615 exceeds the cap of 33554432 bytes"),
            (&[&1000u64.to_le_bytes()[..], b"{}      "].concat(), "header length 1000 runs past the end of the file"),
        ];
        for (bytes, expect) in cases {
            let e = open_bytes(bytes).unwrap_err().to_string();
            assert!(e.contains(expect), "expected {expect:?} in {e}");
            assert!(e.contains("model.safetensors"), "names the file: {e}");
        }
    }

    #[test]
    fn header_counts_are_capped_while_parsing() {
        let entries: Vec<String> = (0..MAX_TENSORS_PER_SHARD + 5).map(|i| format!(r#""t{i}":{{"dtype":"F32","shape":[0],"data_offsets":[0,0]}}"#)).collect();
        let e = open_bytes(&shard(&format!("{{{}}}", entries.join(",")), 0)).unwrap_err().to_string();
        assert!(e.contains("header lists 262149 tensors, over the cap of 262144"), "{e}");
        let meta: Vec<String> = (0..MAX_METADATA_ENTRIES + 1).map(|i| format!(r#""k{i}":"v""#)).collect();
        let e = open_bytes(&shard(&format!(r#"{{"__metadata__":{{{}}}}}"#, meta.join(",")), 0)).unwrap_err().to_string();
        assert!(e.contains("__metadata__ holds 65537 entries, over the cap of 65536"), "{e}");
    }

    #[test]
    fn special_files_are_refused_before_opening() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("model-00001-of-00002.safetensors"), shard(r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#, 8)).unwrap();
        std::fs::write(dir.path().join(INDEX_NAME), r#"{"weight_map":{"a":"model-00001-of-00002.safetensors","b":"model-00002-of-00002.safetensors"}}"#)
            .unwrap();
        let fifo = |p: &Path| {
            let c = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
            // SAFETY: a valid NUL-terminated path.
            assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
        };
        fifo(&dir.path().join("model-00002-of-00002.safetensors"));
        let e = open(dir.path()).unwrap_err().to_string();
        assert!(e.ends_with("model-00002-of-00002.safetensors: is a FIFO, not a regular file"), "{e}");
        std::fs::remove_file(dir.path().join("model-00002-of-00002.safetensors")).unwrap();
        std::os::unix::fs::symlink("/dev/zero", dir.path().join("model-00002-of-00002.safetensors")).unwrap();
        let e = open(dir.path()).unwrap_err().to_string();
        assert!(e.ends_with("is a character device, not a regular file"), "{e}");
        std::fs::remove_file(dir.path().join(INDEX_NAME)).unwrap();
        fifo(&dir.path().join(INDEX_NAME));
        let e = open(dir.path()).unwrap_err().to_string();
        assert!(e.ends_with("model.safetensors.index.json: is a FIFO, not a regular file"), "{e}");
        std::fs::remove_file(dir.path().join(INDEX_NAME)).unwrap();
        std::fs::write(dir.path().join(SINGLE_NAME), shard(r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#, 8)).unwrap();
        fifo(&dir.path().join("config.json"));
        let e = open(dir.path()).unwrap_err().to_string();
        assert!(e.ends_with("config.json: is a FIFO, not a regular file"), "{e}");
    }
}
