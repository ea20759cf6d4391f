//! `xpackfs validate-int8`: the second seed's `validate_persistent_int8_weights`
//! (kt-kernel persistent INT8 expert trees), rule for rule and in the same order, with the
//! same error texts. Works on any directory: a materialized tree, a tree on another
//! filesystem, or a mounted view. INT8 tree mounts (`tree`) validate with it and serve
//! exactly the files it validated.
//!
//! Beyond the seed (whose Python has neither fixed-width integers nor memory limits): the
//! manifest is read only if it is a regular file of at most [`MAX_MANIFEST_BYTES`] holding
//! at most [`MAX_MANIFEST_VALUES`] JSON values (counted before anything is built),
//! `threadpool_count` is capped at [`MAX_THREADPOOL_COUNT`], and every size and count derived
//! from the declared numbers is computed without overflow (an overflow is refused, never
//! wrapped into a small size that real files could match). When the caller leaves
//! expectations to the manifest, the root and the manifest are checked first, so a manifest
//! that cannot be read is reported as such.
//! The tree may be local or remote (`s3://BUCKET/PREFIX/` and the other source URLs): the
//! directories are looked at through [`crate::source::list_entries`] and
//! [`crate::source::entry_kind`] (one listing per directory for a remote tree; object stores
//! have no symlinks), and files are read and hashed through [`SourceFile`].
//! No indexing that could panic here (`clippy::indexing_slicing` is denied).
#![deny(clippy::indexing_slicing)]

use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::{Component, Path, PathBuf};

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::source::json::{self, JsonError};
use crate::source::{EntryKind, SourceError, SourceFile, entry_kind, list_entries};

pub const MANIFEST_NAME: &str = "kt-weight-manifest.json";
pub const LEGACY_MANIFEST_NAME: &str = "kt-ephemeral-manifest.json";
pub const SCHEMA_VERSION: i64 = 2;
pub const LAYOUT: &str = crate::codec::kt_int8::LAYOUT;
/// Caps on the manifest: bytes, and JSON values (a file entry is seven: the object, three
/// keys, three values; parsed, about 400 bytes). A full-size DeepSeek V4 tree with 4 NUMA
/// parts lists ~370,000 files (2.6 M values) in ~80 MB; the cap admits ~600,000.
pub const MAX_MANIFEST_BYTES: u64 = 128 << 20;
pub const MAX_MANIFEST_VALUES: u64 = 1 << 22;
/// Cap on `threadpool_count` (NUMA parts per layer: one directory each).
pub const MAX_THREADPOOL_COUNT: i64 = 4096;

/// What the caller expects; `None` takes the manifest's own value (the seed requires all).
#[derive(Debug, Clone, Default)]
pub struct Expect {
    pub layers: Option<Vec<i64>>,
    pub numa_count: Option<i64>,
    pub expert_num: Option<i64>,
    pub hidden_size: Option<i64>,
    pub intermediate_size: Option<i64>,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct Validated {
    pub root: PathBuf,
    pub path: PathBuf,
    pub schema_version: i64,
    pub layout: String,
    pub layer_indices: Vec<i64>,
    pub file_count: u64,
    pub size_bytes: u64,
    /// Every validated file, relative to `root`, in manifest order.
    #[serde(skip)]
    pub files: Vec<String>,
}

type R<T> = Result<T, Fault>;

/// A tree that breaks one of the validator's rules, or could not be read.
#[derive(Debug, thiserror::Error)]
#[error("invalid INT8 tree {}: {fault}", root.display())]
pub struct InvalidTree {
    pub root: PathBuf,
    #[source]
    pub fault: Fault,
}

/// Why a tree is refused (before [`InvalidTree`] names its root).
#[derive(Debug, thiserror::Error)]
pub enum Fault {
    /// One of the seed's rules, in its words.
    #[error("{0}")]
    Rule(String),
    /// The root, a directory or a file of the tree could not be resolved, listed or read.
    #[error(transparent)]
    Source(#[from] SourceError),
    /// The manifest could not be read or parsed.
    #[error("cannot read INT8 manifest {}: {source}", path.display())]
    Manifest { path: PathBuf, source: Box<dyn std::error::Error + Send + Sync> },
}

/// A rule's message is the rule (the seed's text).
impl From<String> for Fault {
    fn from(rule: String) -> Self {
        Fault::Rule(rule)
    }
}

impl From<&str> for Fault {
    fn from(rule: &str) -> Self {
        Fault::Rule(rule.to_string())
    }
}

/// A JSON integer that is not a bool (Python's `isinstance(v, int) and not bool`).
fn as_int(v: Option<&Value>) -> Option<i64> {
    v.and_then(|v| if v.is_i64() || v.is_u64() { v.as_i64() } else { None })
}

fn positive_int(v: Option<&Value>, name: &str) -> R<i64> {
    as_int(v).filter(|&x| x > 0).ok_or_else(|| Fault::Rule(format!("INT8 manifest {name} must be a positive integer")))
}

fn nonnegative_int(v: Option<&Value>, name: &str) -> R<i64> {
    as_int(v).filter(|&x| x >= 0).ok_or_else(|| Fault::Rule(format!("INT8 manifest {name} must be a non-negative integer")))
}

fn py_repr(v: Option<&Value>) -> String {
    match v {
        None | Some(Value::Null) => "None".into(),
        Some(Value::String(s)) => format!("'{s}'"),
        Some(Value::Bool(b)) => {
            if *b {
                "True".into()
            } else {
                "False".into()
            }
        }
        Some(other) => other.to_string(),
    }
}

/// Python `==` between a JSON value and an expected int or str.
fn py_eq(v: Option<&Value>, expected: &Value) -> bool {
    match (v, expected) {
        (Some(Value::Number(a)), Value::Number(b)) => a.as_f64() == b.as_f64(),
        (Some(Value::Bool(a)), Value::Number(b)) => (*a as i64 as f64) == b.as_f64().unwrap_or(f64::NAN),
        (Some(a), b) => a == b,
        (None, _) => false,
    }
}

fn is_symlink(p: &Path) -> bool {
    entry_kind(p) == Some(EntryKind::Symlink)
}

fn is_remote(p: &Path) -> bool {
    crate::source::remote::is_remote(p)
}

fn resolve_root(root: &Path) -> R<PathBuf> {
    if is_remote(root) {
        // A URL is absolute and has no symlinks to resolve. The root is listed once now: what
        // is looked up in it below is then answered from that listing, not asked one by one.
        if entry_kind(root) != Some(EntryKind::Dir) || list_entries(root).is_err() {
            return Err(format!("persistent INT8 weight root must be a directory: {}", root.display()).into());
        }
        return Ok(root.to_path_buf());
    }
    if !root.is_absolute() {
        return Err("persistent INT8 weight root must be an absolute path".into());
    }
    if is_symlink(root) {
        return Err(format!("persistent INT8 weight root must not be a symlink: {}", root.display()).into());
    }
    let resolved = std::fs::canonicalize(root).map_err(|source| SourceError::Io { path: root.to_path_buf(), source })?;
    if !resolved.is_dir() {
        return Err(format!("persistent INT8 weight root must be a directory: {}", resolved.display()).into());
    }
    Ok(resolved)
}

fn load_manifest(root: &Path) -> R<(PathBuf, serde_json::Map<String, Value>, i64)> {
    let candidates: Vec<PathBuf> = [MANIFEST_NAME, LEGACY_MANIFEST_NAME].iter().map(|n| root.join(n)).filter(|p| entry_kind(p).is_some()).collect();
    if candidates.len() != 1 {
        let names: Vec<String> = candidates.iter().map(|p| p.file_name().unwrap_or_default().to_string_lossy().into_owned()).collect();
        let names = if names.is_empty() { "none".to_string() } else { names.join(", ") };
        return Err(
            format!("persistent INT8 weight root requires exactly one manifest ({MANIFEST_NAME} or legacy {LEGACY_MANIFEST_NAME}); found {names}").into()
        );
    }
    let path = candidates.into_iter().next().unwrap_or_default();
    // Checked before anything opens it: a FIFO here must not block.
    let regular = match entry_kind(&path) {
        Some(EntryKind::File { .. }) => true,
        // A symlink is refused by name; what the listing calls anything else too.
        _ => false,
    };
    if !regular {
        return Err(format!("INT8 manifest must be a regular file: {}", path.display()).into());
    }
    let unreadable = |source: Box<dyn std::error::Error + Send + Sync>| Fault::Manifest { path: path.clone(), source };
    let manifest = json::read_capped(&path, MAX_MANIFEST_BYTES, MAX_MANIFEST_VALUES).map_err(|e| match e {
        JsonError::Source(SourceError::NotRegular { .. }) => format!("INT8 manifest must be a regular file: {}", path.display()).into(),
        JsonError::Source(SourceError::Io { source, .. }) => unreadable(Box::new(source)),
        JsonError::Source(e) => unreadable(Box::new(e)),
        JsonError::TooLarge { len, cap } => format!("INT8 manifest {} is {len} bytes, over the cap of {cap}", path.display()).into(),
        JsonError::TooManyValues { cap } => format!("INT8 manifest {} holds more than {cap} JSON values (the cap)", path.display()).into(),
        JsonError::NotUtf8(e) => unreadable(Box::new(e)),
        JsonError::Syntax(e) => unreadable(Box::new(e)),
    })?;
    let Value::Object(manifest) = manifest else { return Err("INT8 manifest root must be a JSON object".into()) };
    let schema = as_int(manifest.get("schema_version")).filter(|v| *v == 1 || *v == SCHEMA_VERSION);
    let Some(schema) = schema else {
        return Err(format!("unsupported INT8 manifest schema_version {}; supported=[1, 2]", py_repr(manifest.get("schema_version"))).into());
    };
    let name = path.file_name().unwrap_or_default().to_string_lossy().into_owned();
    if schema == 1 && name != LEGACY_MANIFEST_NAME {
        return Err(format!("schema-1 INT8 manifests must use {LEGACY_MANIFEST_NAME}").into());
    }
    if schema == SCHEMA_VERSION && name != MANIFEST_NAME {
        return Err(format!("schema-{SCHEMA_VERSION} INT8 manifests must use {MANIFEST_NAME}").into());
    }
    Ok((path, manifest, schema))
}

/// The sha256 of a whole file (local or remote), read in 8 MiB pieces.
pub fn sha256_file(path: &Path) -> Result<String, SourceError> {
    let f = SourceFile::open(path)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 8 << 20];
    let mut at = 0u64;
    while at < f.size() {
        let n = (f.size() - at).min(buf.len() as u64) as usize;
        let piece = buf.get_mut(..n).unwrap_or_default();
        f.read_exact_at(piece, at)?;
        h.update(&*piece);
        at += n as u64;
    }
    Ok(crate::digest::hex(&h.finalize()))
}

/// `INT8_(gate|up|down)_(\d+)_(\d+)Byte_(quant|scale)_.kt` -> (projection, expert, size, kind).
fn parse_kt_name(name: &str) -> Option<(&str, u64, u64, &str)> {
    let rest = name.strip_prefix("INT8_")?.strip_suffix("_.kt")?;
    let (proj, rest) = rest.split_once('_')?;
    if !["gate", "up", "down"].contains(&proj) {
        return None;
    }
    let (expert, rest) = rest.split_once('_')?;
    let (size, kind) = rest.split_once("Byte_")?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(expert) || !digits(size) || !["quant", "scale"].contains(&kind) {
        return None;
    }
    Some((proj, expert.parse().ok()?, size.parse().ok()?, kind))
}

fn path_parts(p: &str) -> Vec<String> {
    Path::new(p).components().filter(|c| !matches!(c, Component::CurDir)).map(|c| c.as_os_str().to_string_lossy().into_owned()).collect()
}

/// Validate one layer; its files (relative paths) are appended to `validated`.
#[allow(clippy::too_many_arguments)]
fn validate_layer(
    root: &Path,
    layer: &Value,
    schema: i64,
    numa: i64,
    experts: i64,
    hidden: i64,
    inter: i64,
    verify: bool,
    validated: &mut Vec<String>,
    checks: &mut Vec<HashCheck>,
) -> R<(u64, u64)> {
    let Value::Object(layer) = layer else { return Err("INT8 manifest layer entries must be JSON objects".into()) };
    let idx = nonnegative_int(layer.get("index"), "layer.index")?;
    if layer.get("state").and_then(Value::as_str) != Some("ready") {
        return Err(format!("persistent INT8 layer {idx} must be in state 'ready'").into());
    }
    let numa_count = positive_int(layer.get("numa_count"), &format!("layer[{idx}].numa_count"))?;
    if numa_count != numa {
        return Err(format!("persistent INT8 layer {idx} NUMA count mismatch: expected {numa}, got {numa_count}").into());
    }
    let layer_dir = root.join(format!("_layer_{idx}"));
    if entry_kind(&layer_dir) != Some(EntryKind::Dir) {
        return Err(format!("missing or unsafe persistent INT8 layer directory: {}", layer_dir.display()).into());
    }
    let expected_numa: BTreeSet<String> = (0..numa).map(|i| format!("_numa_{i}")).collect();
    let entries = list_entries(&layer_dir)?;
    if entries.iter().any(|(_, k)| *k != EntryKind::Dir) {
        return Err(format!("persistent INT8 layer {idx} contains entries outside NUMA directories").into());
    }
    let actual_numa: BTreeSet<String> = entries.into_iter().map(|(n, _)| n).collect();
    if actual_numa != expected_numa {
        return Err(format!(
            "persistent INT8 layer {idx} NUMA directories mismatch: expected {:?}, got {:?}",
            expected_numa.iter().collect::<Vec<_>>(),
            actual_numa.iter().collect::<Vec<_>>()
        )
        .replace('"', "'")
        .into());
    }
    let mut actual_sizes: HashMap<String, u64> = HashMap::new();
    for i in 0..numa {
        let numa_dir = layer_dir.join(format!("_numa_{i}"));
        for (name, kind) in list_entries(&numa_dir)? {
            let EntryKind::File { size } = kind else {
                return Err(format!("unexpected non-regular persistent INT8 entry: {}", numa_dir.join(&name).display()).into());
            };
            actual_sizes.insert(format!("_layer_{idx}/_numa_{i}/{name}"), size);
        }
    }
    let expected_count = numa
        .checked_mul(experts)
        .and_then(|n| n.checked_mul(6))
        .ok_or_else(|| format!("persistent INT8 layer {idx}: threadpool_count {numa} x expert_num {experts} x 6 files overflows"))?;
    let files = match layer.get("files") {
        Some(Value::Array(f)) if f.len() as i64 == expected_count => f,
        _ => return Err(format!("persistent INT8 layer {idx} must list exactly {expected_count} files").into()),
    };
    let mut seen_paths: HashSet<String> = HashSet::new();
    let mut seen_ids: HashSet<(i64, String, u64, String)> = HashSet::new();
    let mut actual_size = 0u64;
    for item in files {
        let Value::Object(item) = item else { return Err(format!("persistent INT8 layer {idx} has a non-object file entry").into()) };
        let rel = match item.get("path") {
            Some(Value::String(s)) if !seen_paths.contains(s) => s.clone(),
            _ => return Err(format!("persistent INT8 layer {idx} has an invalid or duplicate path").into()),
        };
        seen_paths.insert(rel.clone());
        let parts = path_parts(&rel);
        if Path::new(&rel).is_absolute() || parts.iter().any(|p| p == "..") {
            return Err(format!("unsafe INT8 manifest path: '{rel}'").into());
        }
        let [layer_dir, numa_dir, file_name] = parts.as_slice() else {
            return Err(format!("unexpected INT8 manifest path depth: '{rel}'").into());
        };
        if *layer_dir != format!("_layer_{idx}") {
            return Err(format!("INT8 manifest path is outside layer {idx}: '{rel}'").into());
        }
        let numa_idx: i64 = match numa_dir.strip_prefix("_numa_").filter(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit())) {
            Some(d) => d.parse().map_err(|_| format!("invalid INT8 NUMA path: '{rel}'"))?,
            None => return Err(format!("invalid INT8 NUMA path: '{rel}'").into()),
        };
        if !(0..numa).contains(&numa_idx) {
            return Err(format!("out-of-range INT8 NUMA index in '{rel}'").into());
        }
        let Some((proj, expert, encoded, kind)) = parse_kt_name(file_name) else {
            return Err(format!("unexpected INT8 .kt filename: {file_name}").into());
        };
        if expert as i64 >= experts {
            return Err(format!("layer {idx} has out-of-range expert {expert}").into());
        }
        let id = (numa_idx, proj.to_string(), expert, kind.to_string());
        if !seen_ids.insert(id.clone()) {
            return Err(format!("layer {idx} has duplicate INT8 file identity ({numa_idx}, '{proj}', {expert}, '{kind}')").into());
        }
        let absolute = root.join(&rel);
        let key = parts.join("/");
        let Some(&observed) = actual_sizes.get(&key) else {
            return Err(format!("missing or unsafe INT8 manifest file: {}", absolute.display()).into());
        };
        let readable = if is_remote(&absolute) { crate::source::check_file(&absolute).is_ok() } else { crate::source::open_regular(&absolute).is_ok() };
        if !readable {
            return Err(format!("INT8 weight file is not readable: {}", absolute.display()).into());
        }
        let declared = positive_int(item.get("size_bytes"), &format!("{rel}.size_bytes"))? as u64;
        let per_numa = (inter / numa) as u64;
        let h = hidden as u64;
        let expected = match (proj, kind) {
            (_, "quant") => h.checked_mul(per_numa),
            ("down", "scale") => h.checked_mul(4),
            (_, _) => per_numa.checked_mul(4),
        }
        .ok_or_else(|| format!("INT8 size contract for {rel} overflows 64 bits (hidden_size {hidden}, intermediate_size/threadpool_count {per_numa})"))?;
        if encoded != expected || declared != expected {
            return Err(format!("INT8 size contract mismatch for {rel}: expected {expected}, filename encodes {encoded}, manifest declares {declared}").into());
        }
        if observed != declared {
            return Err(format!("INT8 manifest size mismatch for {}: expected {declared}, got {observed}", absolute.display()).into());
        }
        actual_size = actual_size.checked_add(observed).ok_or_else(|| format!("persistent INT8 layer {idx} byte total overflows"))?;
        validated.push(key);
        let hash = item.get("sha256");
        if schema >= 2 {
            let ok = hash.and_then(Value::as_str).is_some_and(|s| s.len() == 64 && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));
            if !ok {
                return Err(format!("schema-{schema} INT8 file {rel} requires a lowercase SHA256 digest").into());
            }
        }
        if verify {
            let Some(expected_hash) = hash.and_then(Value::as_str) else {
                return Err(format!("full hash verification is unavailable for legacy schema-1 file {rel}").into());
            };
            checks.push(HashCheck { path: absolute, expected: expected_hash.to_string() });
        }
    }
    let mut missing = Vec::new();
    for n in 0..numa {
        for proj in ["gate", "up", "down"] {
            for e in 0..experts as u64 {
                for kind in ["quant", "scale"] {
                    if !seen_ids.contains(&(n, proj.to_string(), e, kind.to_string())) {
                        missing.push(format!("({n}, '{proj}', {e}, '{kind}')"));
                    }
                }
            }
        }
    }
    if !missing.is_empty() {
        missing.sort();
        missing.truncate(3);
        return Err(format!("persistent INT8 layer {idx} file inventory is incomplete; sample=[{}]", missing.join(", ")).into());
    }
    let actual_paths: BTreeSet<&String> = actual_sizes.keys().collect();
    let seen_norm: HashSet<String> = seen_paths.iter().map(|p| path_parts(p).join("/")).collect();
    if actual_paths.iter().any(|p| !seen_norm.contains(*p)) || seen_norm.iter().any(|p| !actual_sizes.contains_key(p)) {
        let extra: Vec<&&String> = actual_paths.iter().filter(|p| !seen_norm.contains(**p)).take(3).collect();
        return Err(format!("persistent INT8 layer {idx} file set differs from manifest: extra={extra:?}, missing=[]").replace('"', "'").into());
    }
    let manifest_size = positive_int(layer.get("bytes"), &format!("layer[{idx}].bytes"))? as u64;
    if actual_size != manifest_size {
        return Err(format!("persistent INT8 layer {idx} byte total mismatch: expected {manifest_size}, got {actual_size}").into());
    }
    Ok((files.len() as u64, actual_size))
}

/// Validate a tree. `verify_hashes: None` is the seed's "strongest the manifest supports".
pub fn validate(root: &Path, expect: &Expect, verify_hashes: Option<bool>) -> Result<Validated, InvalidTree> {
    validate_rules(root, expect, verify_hashes).map_err(|fault| InvalidTree { root: root.to_path_buf(), fault })
}

/// A file whose sha256 the manifest declares, hashed after the structure is checked.
struct HashCheck {
    path: PathBuf,
    expected: String,
}

/// Check the files' hashes in parallel ([`crate::digest::lanes::sha256_files`]) and report
/// the first failure in manifest order, with the message hashing them one by one gives.
fn check_hashes(checks: &[HashCheck]) -> R<()> {
    let paths: Vec<PathBuf> = checks.iter().map(|c| c.path.clone()).collect();
    let expected: Vec<String> = checks.iter().map(|c| c.expected.clone()).collect();
    let hashed = crate::digest::lanes::sha256_files(&paths, Some(&expected));
    for (c, h) in checks.iter().zip(hashed) {
        let actual = match h {
            Some(h) => h,
            None => sha256_file(&c.path)?,
        };
        if actual != c.expected {
            return Err(format!("INT8 SHA256 mismatch for {}: expected {}, got {actual}", c.path.display(), c.expected).into());
        }
    }
    Ok(())
}

/// The structure, then the hashes: the hashes of every file the manifest lists before the
/// first structural fault are checked first, so the verdict is the one checking each file
/// in order (hash included) would give, while the hashing runs in parallel.
fn validate_rules(root: &Path, expect: &Expect, verify_hashes: Option<bool>) -> R<Validated> {
    let mut checks = Vec::new();
    let structure = validate_structure(root, expect, verify_hashes, &mut checks);
    check_hashes(&checks)?;
    structure
}

fn validate_structure(root: &Path, expect: &Expect, verify_hashes: Option<bool>, checks: &mut Vec<HashCheck>) -> R<Validated> {
    // Expectations the caller did not give come from the manifest: then the root and the
    // manifest are read (and their faults reported) first.
    let all_given = expect.layers.is_some()
        && expect.numa_count.is_some()
        && expect.expert_num.is_some()
        && expect.hidden_size.is_some()
        && expect.intermediate_size.is_some();
    let loaded = if all_given {
        None
    } else {
        let resolved = resolve_root(root)?;
        let manifest = load_manifest(&resolved)?;
        Some((resolved, manifest))
    };
    let m = loaded.as_ref().map(|(_, (_, m, _))| m);
    let get = |k: &str| m.and_then(|m| as_int(m.get(k)));
    let layers = match (&expect.layers, m) {
        (Some(l), _) => Some(l.clone()),
        (None, Some(m)) => match m.get("layers") {
            Some(Value::Array(l)) => Some(l.iter().filter_map(|x| as_int(x.get("index"))).collect()),
            _ => return Err("persistent INT8 manifest layers must be a list".into()),
        },
        (None, None) => None,
    };
    let (numa, experts, hidden, inter) = (
        expect.numa_count.or_else(|| get("threadpool_count")),
        expect.expert_num.or_else(|| get("expert_num")),
        expect.hidden_size.or_else(|| get("hidden_size")),
        expect.intermediate_size.or_else(|| get("intermediate_size")),
    );
    // A value given on the command line is the flag's; else it is the manifest's.
    let need = |v: Option<i64>, flag: Option<i64>, name: &str, flag_name: &str| match flag {
        Some(f) if f <= 0 => Err(Fault::Rule(format!("--{flag_name} must be a positive integer, got {f}"))),
        _ => v.filter(|x| *x > 0).ok_or_else(|| Fault::Rule(format!("INT8 manifest {name} must be a positive integer"))),
    };
    let numa = need(numa, expect.numa_count, "threadpool_count", "numa-count")?;
    let experts = need(experts, expect.expert_num, "expert_num", "expert-num")?;
    let hidden = need(hidden, expect.hidden_size, "hidden_size", "hidden-size")?;
    let inter = need(inter, expect.intermediate_size, "intermediate_size", "intermediate-size")?;
    if let Some(f) = expect.numa_count.filter(|&f| f > MAX_THREADPOOL_COUNT) {
        return Err(format!("--numa-count {f} exceeds the cap of {MAX_THREADPOOL_COUNT}").into());
    }
    if numa > MAX_THREADPOOL_COUNT {
        return Err(format!("INT8 manifest threadpool_count {numa} exceeds the cap of {MAX_THREADPOOL_COUNT}").into());
    }
    if inter % numa != 0 {
        return Err(format!("persistent INT8 intermediate_size must be divisible by threadpool_count: {inter} % {numa} != 0").into());
    }
    let expected_layers: Vec<i64> = layers.unwrap_or_default().into_iter().collect::<BTreeSet<_>>().into_iter().collect();
    if expected_layers.is_empty() || expected_layers.iter().any(|&i| i < 0) {
        return Err("persistent INT8 validation requires non-negative expert layer indices".into());
    }
    let (resolved, (manifest_path, manifest, schema)) = match loaded {
        Some(l) => l,
        None => {
            let resolved = resolve_root(root)?;
            let manifest = load_manifest(&resolved)?;
            (resolved, manifest)
        }
    };
    let verify = verify_hashes.unwrap_or(schema >= 2);
    let expected_meta: [(&str, Value); 6] = [
        ("state", Value::from("ready")),
        ("expert_weight_format", Value::from("int8")),
        ("threadpool_count", Value::from(numa)),
        ("expert_num", Value::from(experts)),
        ("hidden_size", Value::from(hidden)),
        ("intermediate_size", Value::from(inter)),
    ];
    for (k, v) in &expected_meta {
        if !py_eq(manifest.get(*k), v) {
            return Err(format!("persistent INT8 manifest {k} mismatch: expected {}, got {}", py_repr(Some(v)), py_repr(manifest.get(*k))).into());
        }
    }
    let backend_str = |v: Option<&Value>| -> String {
        match v {
            Some(Value::String(s)) => s.trim().to_lowercase(),
            Some(other) => other.to_string().to_lowercase(),
            None => String::new(),
        }
    };
    let layout = if schema == 1 {
        if !["amxint8", "int8"].contains(&backend_str(manifest.get("backend")).as_str()) {
            return Err("legacy schema-1 INT8 manifest backend must be AMXINT8 or INT8".into());
        }
        LAYOUT.to_string()
    } else {
        let layout = manifest.get("layout");
        if layout.and_then(Value::as_str) != Some(LAYOUT) {
            return Err(format!("persistent INT8 manifest layout mismatch: expected '{LAYOUT}', got {}", py_repr(layout)).into());
        }
        if manifest.contains_key("backend") && !["auto", "int8"].contains(&backend_str(manifest.get("backend")).as_str()) {
            return Err("schema-2 INT8 manifest backend must be hardware-neutral ('INT8' or 'auto')".into());
        }
        LAYOUT.to_string()
    };
    let Some(Value::Array(layers)) = manifest.get("layers") else { return Err("persistent INT8 manifest layers must be a list".into()) };
    let mut actual_layers = Vec::new();
    for l in layers {
        if !l.is_object() {
            return Err("persistent INT8 manifest layers must contain objects".into());
        }
        match as_int(l.get("index")).filter(|&i| i >= 0) {
            Some(i) => actual_layers.push(i),
            None => return Err("persistent INT8 layer index must be non-negative".into()),
        }
    }
    if actual_layers.iter().collect::<HashSet<_>>().len() != actual_layers.len() {
        return Err("persistent INT8 manifest has duplicate layer indices".into());
    }
    let mut sorted = actual_layers.clone();
    sorted.sort();
    if sorted != expected_layers {
        return Err(format!("persistent INT8 layer set mismatch: expected {expected_layers:?}, got {sorted:?}").into());
    }
    let (mut file_count, mut size_bytes) = (0u64, 0u64);
    let mut files = Vec::new();
    for l in layers {
        let (f, b) = validate_layer(&resolved, l, schema, numa, experts, hidden, inter, verify, &mut files, checks)?;
        file_count += f;
        size_bytes = size_bytes.checked_add(b).ok_or("persistent INT8 manifest byte total overflows")?;
    }
    let manifest_bytes = positive_int(manifest.get("bytes"), "bytes")? as u64;
    if size_bytes != manifest_bytes {
        return Err(format!("persistent INT8 manifest byte total mismatch: expected {manifest_bytes}, got {size_bytes}").into());
    }
    let mut expected_root: BTreeSet<String> = expected_layers.iter().map(|i| format!("_layer_{i}")).collect();
    expected_root.insert(manifest_path.file_name().unwrap_or_default().to_string_lossy().into_owned());
    let entries = list_entries(&resolved)?;
    if entries.iter().any(|(_, k)| *k == EntryKind::Symlink) {
        return Err("persistent INT8 root must not contain symlinks".into());
    }
    let actual_root: BTreeSet<String> = entries.into_iter().map(|(n, _)| n).collect();
    if actual_root != expected_root {
        let extra: Vec<&String> = actual_root.difference(&expected_root).collect();
        let missing: Vec<&String> = expected_root.difference(&actual_root).collect();
        return Err(format!("persistent INT8 root entries differ from its manifest: extra={extra:?}, missing={missing:?}").replace('"', "'").into());
    }
    Ok(Validated { root: resolved, path: manifest_path, schema_version: schema, layout, layer_indices: expected_layers, file_count, size_bytes, files })
}
