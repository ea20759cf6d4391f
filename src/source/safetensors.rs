//! safetensors checkpoints: a directory with `config.json`, `model.safetensors.index.json`
//! (`{"metadata": ..., "weight_map": {tensor: shard}}`) and its shards, or a single
//! `model.safetensors` (or any one `.safetensors` file).
//!
//! Each shard's header is validated with the `safetensors` crate's own rules (the code
//! Python's `safe_open` runs): header length within the file and under 100 MB, UTF-8 JSON,
//! known dtypes, data offsets contiguous from 0, in order, each matching its shape, and
//! ending exactly at the end of the file. On top of that: no duplicate keys in a header,
//! no tensor in two shards, the index and the shards naming exactly the same tensors, and
//! shard names that are plain file names (nothing can point outside the directory).
//! Only headers are read (through a read-only mapping, of which only the header pages
//! are touched).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use safetensors::tensor::{Dtype, SafeTensors};

use super::{Source, SourceError, SourceFile, SourceKind, TensorDtype, TensorInfo};

pub const INDEX_NAME: &str = "model.safetensors.index.json";
pub const SINGLE_NAME: &str = "model.safetensors";
/// Cap on config.json and the index file.
const MAX_JSON_BYTES: u64 = 64 << 20;

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

fn read_json(path: &Path, what: &str) -> Result<serde_json::Value, SourceError> {
    let meta = std::fs::metadata(path).map_err(|e| SourceError::Io { path: path.to_path_buf(), source: e })?;
    if meta.len() > MAX_JSON_BYTES {
        return Err(SourceError::format(path, format!("{what} is {} bytes, over the {MAX_JSON_BYTES} byte cap", meta.len())));
    }
    let text = std::fs::read(path).map_err(|e| SourceError::Io { path: path.to_path_buf(), source: e })?;
    serde_json::from_slice(&text).map_err(|e| SourceError::format(path, format!("{what} is not valid JSON: {e}")))
}

/// Keys of the header's top-level object, in order, failing on duplicates.
fn header_keys(path: &Path, json: &str) -> Result<Vec<String>, SourceError> {
    struct Keys(Vec<String>);
    impl<'de> serde::Deserialize<'de> for Keys {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct V;
            impl<'de> serde::de::Visitor<'de> for V {
                type Value = Keys;
                fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                    f.write_str("a JSON object")
                }
                fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Keys, A::Error> {
                    let mut keys = Vec::new();
                    while let Some(k) = map.next_key::<String>()? {
                        map.next_value::<serde::de::IgnoredAny>()?;
                        keys.push(k);
                    }
                    Ok(Keys(keys))
                }
            }
            d.deserialize_map(V)
        }
    }
    let keys = serde_json::from_str::<Keys>(json).map_err(|e| SourceError::format(path, format!("header is not a JSON object: {e}")))?.0;
    let mut seen = std::collections::HashSet::new();
    for k in &keys {
        if !seen.insert(k.as_str()) {
            return Err(SourceError::tensor(path, k, "duplicate key in the safetensors header"));
        }
    }
    Ok(keys)
}

/// Parse one shard: header facts and its tensors (file index `file_index`).
pub fn parse_shard(file: &SourceFile, file_index: usize, logical_base: u64) -> Result<(ShardHeader, Vec<TensorInfo>), SourceError> {
    let path = file.path();
    let fh = std::fs::File::open(path).map_err(|e| SourceError::Io { path: path.to_path_buf(), source: e })?;
    if file.size() < 8 {
        return Err(SourceError::format(path, format!("truncated: {} bytes, the header length alone needs 8", file.size())));
    }
    // SAFETY: read-only mapping; only the header pages are read here, while the file is
    // checked against its opening identity right after.
    let map = unsafe { memmap2::Mmap::map(&fh) }.map_err(|e| SourceError::Io { path: path.to_path_buf(), source: e })?;
    let (n, metadata) = SafeTensors::read_metadata(&map[..]).map_err(|e| {
        let rule = match &e {
            safetensors::SafeTensorError::InvalidHeaderLength => {
                format!("header length {} runs past the end of the file ({} bytes)", u64::from_le_bytes(map[..8].try_into().unwrap()), map.len())
            }
            safetensors::SafeTensorError::MetadataIncompleteBuffer => "the tensors' data does not end exactly at the end of the file (truncated or trailing bytes)".to_string(),
            safetensors::SafeTensorError::InvalidOffset(t) => {
                return SourceError::tensor(path, t, "data offsets are overlapping, out of order or leave a gap");
            }
            safetensors::SafeTensorError::TensorInvalidInfo => "a tensor's data_offsets do not match its shape and dtype".to_string(),
            other => other.to_string(),
        };
        SourceError::format(path, rule)
    })?;
    file.check_unchanged()?;
    let json = std::str::from_utf8(&map[8..8 + n]).map_err(|_| SourceError::format(path, "header is not UTF-8"))?;
    let keys = header_keys(path, json)?;
    drop(map);
    let data_start = 8 + n as u64;
    let infos = metadata.tensors();
    let mut tensors = Vec::with_capacity(infos.len());
    for name in keys.iter().filter(|k| *k != "__metadata__") {
        let info = infos[name.as_str()];
        let (b, e) = info.data_offsets;
        tensors.push(TensorInfo {
            name: name.clone(),
            dtype: TensorDtype::Safetensors(info.dtype),
            shape: info.shape.iter().map(|&d| d as u64).collect(),
            file: file_index,
            offset: data_start + b as u64,
            nbytes: (e - b) as u64,
            logical_offset: logical_base + data_start + b as u64,
        });
    }
    tensors.sort_by_key(|t| t.offset);
    let header = ShardHeader {
        name: path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
        header_len: n as u64,
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
    let (root, config_path, index_path, shard_names) = if path.is_dir() {
        let root = path.to_path_buf();
        let config = root.join("config.json");
        let config_path = config.is_file().then_some(config);
        let index = root.join(INDEX_NAME);
        if index.is_file() {
            let v = read_json(&index, "the safetensors index")?;
            let map = v.get("weight_map").and_then(|m| m.as_object()).ok_or_else(|| SourceError::format(&index, "index has no weight_map object"))?;
            if map.is_empty() {
                return Err(SourceError::format(&index, "index weight_map is empty"));
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
        } else if root.join(SINGLE_NAME).is_file() {
            (root, config_path, None, vec![SINGLE_NAME.to_string()])
        } else {
            return Err(SourceError::format(path, format!("neither {INDEX_NAME} nor {SINGLE_NAME} in the directory")));
        }
    } else {
        let root = path.parent().unwrap_or(Path::new(".")).to_path_buf();
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        (root, None, None, vec![name])
    };

    let mut files = Vec::with_capacity(shard_names.len());
    let mut shards = Vec::with_capacity(shard_names.len());
    let mut tensors: Vec<TensorInfo> = Vec::new();
    let mut owner: HashMap<String, String> = HashMap::new();
    let mut base = 0u64;
    for (i, name) in shard_names.iter().enumerate() {
        let p = root.join(name);
        let meta = std::fs::symlink_metadata(&p).map_err(|e| SourceError::Io { path: p.clone(), source: e })?;
        if !meta.is_file() && !meta.file_type().is_symlink() {
            return Err(SourceError::format(&p, "shard is not a regular file"));
        }
        let file = Arc::new(SourceFile::open(&p)?);
        let (header, ts) = parse_shard(&file, i, base)?;
        for t in ts {
            if let Some(prev) = owner.insert(t.name.clone(), name.clone()) {
                return Err(SourceError::tensor(&p, &t.name, format!("tensor also in shard {prev}")));
            }
            tensors.push(t);
        }
        base += file.size();
        shards.push(header);
        files.push(file);
    }
    if let Some((index, v)) = &index_path {
        let map = v["weight_map"].as_object().unwrap();
        for (tensor, shard) in map {
            match owner.get(tensor) {
                None => return Err(SourceError::tensor(index, tensor, format!("named by the index in shard {shard}, but no shard holds it"))),
                Some(s) if s != shard.as_str().unwrap() => {
                    return Err(SourceError::tensor(index, tensor, format!("index says shard {shard}, but it is in {s}")));
                }
                _ => {}
            }
        }
        if let Some((t, s)) = owner.iter().find(|(t, _)| !map.contains_key(*t)) {
            return Err(SourceError::tensor(&root.join(s), t, "in the shard but not in the index"));
        }
    }
    let config = match &config_path {
        Some(p) => Some(read_json(p, "config.json")?),
        None => None,
    };
    Ok(Source {
        files,
        kind: SourceKind::Safetensors(SafetensorsMeta { root, config, config_path, index_path: index_path.map(|(p, _)| p), shards }),
        tensors,
    })
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
        let s = open_bytes(&shard(r#"{"__metadata__":{"format":"pt"},"b":{"dtype":"BF16","shape":[2,2],"data_offsets":[8,16]},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#, 16)).unwrap();
        let names: Vec<&str> = s.tensors.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["a", "b"], "offset order");
        assert_eq!(s.tensors[1].shape, [2, 2]);
        assert_eq!(s.tensors[1].nbytes, 8);
    }

    #[test]
    fn header_rules() {
        let cases: &[(&[u8], &str)] = &[
            (&shard(r#"{"a":{"dtype":"Q9","shape":[2],"data_offsets":[0,8]}}"#, 8), "unknown variant"),
            (&shard(r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}"#, 12), "tensor \"b\": data offsets"),
            (&shard(r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[12,20]}}"#, 20), "tensor \"b\": data offsets"),
            (&shard(r#"{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}"#, 8), "do not match its shape"),
            (&shard(r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#, 9), "does not end exactly at the end of the file"),
            (&shard(r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#, 4), "does not end exactly at the end of the file"),
            (&shard(r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#, 8), "duplicate key"),
            (&shard(r#"[1,2,3]"#, 0), "invalid JSON in header"),
            (&[1, 2, 3], "truncated"),
            (&u64::MAX.to_le_bytes(), "header too large"),
        ];
        for (bytes, expect) in cases {
            let e = open_bytes(bytes).unwrap_err().to_string();
            assert!(e.contains(expect), "expected {expect:?} in {e}");
            assert!(e.contains("model.safetensors"), "names the file: {e}");
        }
    }
}
