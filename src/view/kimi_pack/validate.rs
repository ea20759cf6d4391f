//! `validate_ggml_moe_pack` for a pack on disk (`materialize --verify`): the header, every
//! index entry in expert-major up/gate/down order with its size, alignment and range, no
//! trailing bytes, fixed object spans, the sampled payloads compared with the source, and
//! the result record (SGLang's `validate_ggml_moe_pack` return value, with `sha256`), which
//! must equal the manifest's `expert_pack` when there is a manifest.

use std::collections::BTreeMap;
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::Plan;
use super::format::{ALIGNMENT, ENTRY_BYTES, Entry, HEADER_BYTES, Header, MAGIC_NAME, Role, VERSION};
use super::plan::{self, Key, KimiError, PackSpec, expert_key};
use crate::source::{Source, SourceError};

const CHUNK: u64 = 16 << 20;

/// Why a pack on disk fails [`validate_pack`] or [`verify_written`].
#[derive(Debug, thiserror::Error)]
pub enum PackError {
    /// The pack could not be resolved, opened or read.
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    /// The pack breaks one of `validate_ggml_moe_pack`'s rules (in its words).
    #[error("{}: {rule}", path.display())]
    Rule { path: PathBuf, rule: String },
    /// The source could not be read, or the pack hashed.
    #[error(transparent)]
    Source(#[from] SourceError),
    #[error("the source is not a GGUF shard set")]
    NotGguf,
    #[error("not a GGUF tensor")]
    NotGgufTensor,
    /// The pack's plan could not be made from the dimensions the source or the manifest gives.
    #[error(transparent)]
    Plan(#[from] KimiError),
    #[error("manifest model.{0} is not an integer")]
    ManifestInteger(&'static str),
    #[error("manifest model.active_moe_layer_ids is empty")]
    NoActiveLayers,
    #[error("manifest model.active_moe_layer_ids is not first_dense..num_hidden_layers")]
    ActiveLayers,
    /// The written pack's sha256 is not the manifest's (`declared`: its JSON value).
    #[error("{} hashes to {actual}, the manifest's expert_pack.sha256 is {declared}", pack.display())]
    Sha256 { pack: PathBuf, actual: String, declared: Value },
    /// The manifest's `expert_pack` record differs from the pack's in these keys.
    #[error("the manifest's expert_pack differs from the pack in {0:?}")]
    Record(Vec<String>),
}

/// Check the pack at `path` against `plan` and the source, comparing the entries
/// `payload_samples` picks with the source; `sha256` is the pack's digest when the caller
/// has it already (else the file is hashed). Returns SGLang's result record.
pub fn validate_pack(path: &Path, source: &Source, plan: &Plan, payload_samples: u64, sha256: Option<&str>) -> Result<Value, PackError> {
    let path = std::fs::canonicalize(path).map_err(|source| PackError::Io { path: path.to_path_buf(), source })?;
    let fail = |rule: String| PackError::Rule { path: path.clone(), rule };
    let io = |source: std::io::Error| PackError::Io { path: path.clone(), source };
    let file = std::fs::File::open(&path).map_err(io)?;
    let file_size = file.metadata().map_err(io)?.len();
    let l = &plan.layout;
    let expected_count = l.index_count;
    let mut reader = std::io::BufReader::with_capacity(1 << 20, &file);
    let mut index_digest = Sha256::new();
    let mut raw = [0u8; HEADER_BYTES as usize];
    reader.read_exact(&mut raw).map_err(|_| fail("GGML expert-pack header is truncated".into()))?;
    index_digest.update(raw);
    let h = Header::decode(&raw).filter(|h| h.version == VERSION).ok_or_else(|| fail("GGML expert-pack magic or version does not match".into()))?;
    if h.header_size as u64 != HEADER_BYTES {
        return Err(fail("GGML expert-pack header size does not match".into()));
    }
    if h.index_count != expected_count {
        return Err(fail(format!("GGML expert-pack has {} entries; expected {expected_count}", h.index_count)));
    }
    if h.data_start < HEADER_BYTES + expected_count * ENTRY_BYTES || !h.data_start.is_multiple_of(ALIGNMENT) {
        return Err(fail("GGML expert-pack data_start is invalid or unaligned".into()));
    }
    let samples = plan::samples(payload_samples, expected_count);
    let mut next_sample = samples.iter().peekable();
    let mut sampled = Vec::new();
    let mut roles: BTreeMap<Role, (u64, u64)> = BTreeMap::new(); // entry count, payload bytes
    let mut object_bytes: Option<u64> = None;
    let mut object_start = 0u64;
    let mut previous_end = h.data_start;
    let e = l.num_experts;
    let mut entry = [0u8; ENTRY_BYTES as usize];
    for index in 0..expected_count {
        reader.read_exact(&mut entry).map_err(|_| fail("GGML expert-pack index is truncated".into()))?;
        index_digest.update(entry);
        let d = Entry::decode(&entry);
        if d.reserved != 0 {
            return Err(fail("GGML expert-pack reserved entry field must be zero".into()));
        }
        let name = d.name.ok_or_else(|| fail("expert-pack tensor name is not valid UTF-8".into()))?;
        let (object, role_id) = (index / 3, index % 3);
        let (layer_index, expert) = (object / e, object % e);
        let role = Role::ORDER[role_id as usize];
        let layer = l.first_layer + layer_index;
        let Key::Expert(got_layer, got_role) = expert_key(&name) else {
            return Err(fail(format!("invalid expert tensor name: {name:?}")));
        };
        if (got_layer, got_role) != (layer, role) || d.expert as i64 != expert as i64 {
            return Err(fail(format!(
                "GGML expert-pack is not complete expert-major up/gate/down layout at index {index}: expected ({layer}, {:?}, {expert}), actual ({got_layer}, {:?}, {})",
                role.name(),
                got_role.name(),
                d.expert
            )));
        }
        let t = &source.tensors[plan.experts.layers[layer_index as usize][role_id as usize]];
        let expert_bytes = t.nbytes / e;
        if d.nbytes != expert_bytes {
            return Err(fail(format!("expert-pack byte size mismatch for index {index}: {} != {expert_bytes}", d.nbytes)));
        }
        if !d.offset.is_multiple_of(ALIGNMENT) {
            return Err(fail(format!("expert-pack entry {index} is not 4 KiB aligned")));
        }
        if d.offset < previous_end || d.offset.checked_add(d.nbytes).is_none_or(|end| end > file_size) {
            return Err(fail(format!("expert-pack entry {index} overlaps or is out of range")));
        }
        previous_end = d.offset + d.nbytes;
        let r = roles.entry(role).or_default();
        r.0 += 1;
        r.1 += d.nbytes;
        if role_id == 0 {
            object_start = d.offset;
        } else if role_id == 2 {
            let span = d.offset + d.nbytes - object_start;
            if *object_bytes.get_or_insert(span) != span {
                return Err(fail("expert-pack object spans are not fixed size".into()));
            }
        }
        if next_sample.peek() == Some(&&index) {
            next_sample.next();
            sampled.push((name, d.expert as u64, d.offset, t));
        }
    }
    if previous_end != file_size {
        return Err(fail(format!("expert-pack has unexplained trailing bytes: {}", file_size as i128 - previous_end as i128)));
    }
    for (name, expert, offset, t) in &sampled {
        let nbytes = t.nbytes / e;
        let src = &source.files[t.file];
        let (mut a, mut b) = (vec![0u8; nbytes.min(CHUNK) as usize], vec![0u8; nbytes.min(CHUNK) as usize]);
        let mut done = 0u64;
        while done < nbytes {
            let n = (nbytes - done).min(CHUNK) as usize;
            src.read_exact_at(&mut a[..n], t.offset + expert * nbytes + done)?;
            file.read_exact_at(&mut b[..n], offset + done).map_err(io)?;
            if a[..n] != b[..n] {
                return Err(fail(format!("expert-pack payload does not match GGUF source for {name} expert {expert}")));
            }
            done += n as u64;
        }
    }
    let sha256 = match sha256 {
        Some(s) => s.to_string(),
        None => crate::view::kt_int8::validate::sha256_file(&path)?,
    };
    let mut roles_v = serde_json::Map::new();
    for (li, role) in Role::ORDER.into_iter().enumerate() {
        let t = &source.tensors[plan.experts.layers[0][li]];
        let g = t.dtype.ggml().ok_or(PackError::NotGgufTensor)?;
        let (count, payload) = roles.get(&role).copied().unwrap_or_default();
        roles_v.insert(
            role.name().into(),
            json!({"dtype": g.name, "dtype_id": g.id, "logical_shape": &t.shape[..2], "expert_bytes": t.nbytes / e,
                   "entry_count": count, "payload_bytes": payload}),
        );
    }
    Ok(json!({
        "path": path.to_string_lossy(),
        "size": file_size,
        "magic": MAGIC_NAME,
        "version": VERSION,
        "header_bytes": HEADER_BYTES,
        "entry_bytes": ENTRY_BYTES,
        "index_count": expected_count,
        "data_start": h.data_start,
        "alignment": ALIGNMENT,
        "index_sha256": crate::digest::hex(&index_digest.finalize()),
        "physical_role_order": Role::ORDER.map(Role::name),
        "active_moe_layer_ids": plan.spec.active_layers().collect::<Vec<_>>(),
        "num_experts": e,
        "top_k": plan.spec.top_k,
        "object_bytes": object_bytes,
        "roles": roles_v,
        "payload_samples_verified": sampled.len(),
        "full_pack_hash": true,
        "sha256": sha256,
    }))
}

fn spec_from_manifest(model: &Value) -> Result<PackSpec, PackError> {
    let int = |k: &'static str| model[k].as_u64().ok_or(PackError::ManifestInteger(k));
    let spec = PackSpec {
        num_hidden_layers: int("num_hidden_layers")?,
        first_dense: model["active_moe_layer_ids"][0].as_u64().ok_or(PackError::NoActiveLayers)?,
        num_experts: int("num_experts")?,
        expert_hidden: int("routed_expert_hidden_size")?,
        intermediate: int("moe_intermediate_size")?,
        top_k: Some(int("num_experts_per_token")?),
    };
    let listed: Vec<Option<u64>> = model["active_moe_layer_ids"].as_array().into_iter().flatten().map(Value::as_u64).collect();
    if listed != spec.active_layers().map(Some).collect::<Vec<_>>() {
        return Err(PackError::ActiveLayers);
    }
    Ok(spec)
}

/// `--verify` of a materialized Kimi pack: [`validate_pack`] with the written pack's digest
/// (re-hashed from disk by the caller), against the source; with a manifest, the plan is
/// the manifest's model and its `expert_pack` must equal the result.
pub fn verify_written(pack: &Path, source: &Source, pack_sha256: &str, manifest: Option<&Value>) -> Result<(), PackError> {
    let shards = source.files.iter().map(|f| f.path().to_path_buf()).collect::<Vec<_>>();
    let meta = source.gguf().ok_or(PackError::NotGguf)?;
    let spec = match manifest {
        Some(m) => spec_from_manifest(&m["model"])?,
        None => PackSpec::from_gguf(meta.metadata(), &source.tensors, &shards)?,
    };
    let plan = Plan::with_spec(source, shards, spec, None, String::new())?;
    let samples = manifest.and_then(|m| m["verification"]["payload_samples"].as_u64()).unwrap_or(6);
    let result = validate_pack(pack, source, &plan, samples, Some(pack_sha256))?;
    if let Some(m) = manifest {
        let declared = &m["expert_pack"];
        if declared.get("sha256").is_some_and(|s| s != pack_sha256) {
            return Err(PackError::Sha256 { pack: pack.to_path_buf(), actual: pack_sha256.to_string(), declared: declared["sha256"].clone() });
        }
        let mut declared = declared.clone();
        let mut result = result;
        if declared.get("sha256").is_none() {
            // A manifest without full_pack_hash records no digest and says so.
            result.as_object_mut().map(|o| o.remove("sha256"));
            result["full_pack_hash"] = false.into();
        }
        if let (Some(d), Some(r)) = (declared.as_object_mut(), result.as_object()) {
            let differ: Vec<String> = r.keys().filter(|k| d.get(*k) != r.get(*k)).chain(d.keys().filter(|k| !r.contains_key(*k))).cloned().collect();
            if !differ.is_empty() {
                return Err(PackError::Record(differ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manifest_models_give_the_pack_spec() {
        let m = json!({"num_hidden_layers": 4, "active_moe_layer_ids": [1, 2, 3], "num_experts": 8,
                       "routed_expert_hidden_size": 256, "moe_intermediate_size": 512, "num_experts_per_token": 2});
        let s = spec_from_manifest(&m).unwrap();
        assert_eq!((s.active_layers(), s.num_experts, s.top_k), (1..4, 8, Some(2)));
        let mut bad = m.clone();
        bad["active_moe_layer_ids"] = json!([1, 3]);
        assert!(matches!(spec_from_manifest(&bad), Err(PackError::ActiveLayers)));
        assert!(spec_from_manifest(&bad).unwrap_err().to_string().contains("active_moe_layer_ids"));
    }
}
