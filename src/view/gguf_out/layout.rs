//! The output file's layout, as llama.cpp's gguf writer (`ggml/src/gguf.cpp`) lays out what
//! `llama_model_quantize` gives it: version 3; every KV of the (first) input file copied in
//! order, byte for byte (`gguf_set_kv`), then `general.quantization_version` and
//! `general.file_type` set (a set removes the key and appends it, so they move to the end),
//! then `split.no`, `split.count` and `split.tensors.count` removed; tensors in
//! `weight_name_comparer` order (layer index from `blk.%d.`, -1 without, then the name),
//! each with its dimensions up to the last that is not 1 (`ggml_n_dims`); the data section
//! aligned to 32 (`GGUF_DEFAULT_ALIGNMENT`: the context's alignment is never read from the
//! copied `general.alignment`), each tensor's data padded with zeros to 32.

use crate::codec::GgmlType;
use crate::source::{SourceError, SourceFile};

use super::types::{blk_layer, n_dims};

/// The writer's alignment.
pub const ALIGNMENT: u64 = 32;
/// `GGML_QNT_VERSION`.
pub const QNT_VERSION: u32 = 2;

const GGUF_TYPE_UINT32: u32 = 4;
const GGUF_TYPE_STRING: u32 = 8;
const GGUF_TYPE_ARRAY: u32 = 9;

/// One KV of the input, as its bytes in the file (key, type and value).
#[derive(Debug, Clone)]
pub struct RawKv {
    pub key: String,
    pub bytes: Vec<u8>,
}

fn scalar_size(t: u32) -> Option<u64> {
    Some(match t {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        10..=12 => 8,
        _ => return None,
    })
}

/// Why [`raw_kvs`] could not walk a header (validated when the source was opened: the file
/// changed, or the two walks disagree).
#[derive(Debug, thiserror::Error)]
pub enum KvError {
    #[error(transparent)]
    Read(#[from] SourceError),
    #[error("header ends inside a KV")]
    Truncated,
    #[error("KV {key}: type {ty}")]
    Type { key: String, ty: u32 },
    #[error("KV {key}: array of type {ty}")]
    ArrayType { key: String, ty: u32 },
    #[error("array size overflows")]
    ArraySize,
}

/// Every KV of a GGUF file's header, in order, as raw bytes. The header was validated when
/// the source was opened; this walks it again, keeping the bytes.
pub fn raw_kvs(file: &SourceFile, header_len: u64) -> Result<Vec<RawKv>, KvError> {
    let mut buf = vec![0u8; header_len as usize];
    file.read_exact_at(&mut buf, 0)?;
    let mut pos = 0usize;
    let take = |pos: &mut usize, n: u64| -> Result<std::ops::Range<usize>, KvError> {
        let end = (*pos as u64).checked_add(n).filter(|&e| e <= buf.len() as u64).ok_or(KvError::Truncated)?;
        let r = *pos..end as usize;
        *pos = end as usize;
        Ok(r)
    };
    let u32_at = |r: std::ops::Range<usize>| u32::from_le_bytes(buf[r].try_into().unwrap());
    let u64_at = |r: std::ops::Range<usize>| u64::from_le_bytes(buf[r].try_into().unwrap());
    take(&mut pos, 8)?; // magic, version
    take(&mut pos, 8)?; // tensor count
    let n_kv = u64_at(take(&mut pos, 8)?);
    let mut out = Vec::new();
    for _ in 0..n_kv {
        let start = pos;
        let klen = u64_at(take(&mut pos, 8)?);
        let key = String::from_utf8_lossy(&buf[take(&mut pos, klen)?]).into_owned();
        let t = u32_at(take(&mut pos, 4)?);
        let skip_value = |pos: &mut usize, t: u32| -> Result<(), KvError> {
            match t {
                GGUF_TYPE_STRING => {
                    let n = u64_at(take(pos, 8)?);
                    take(pos, n)?;
                }
                _ => {
                    take(pos, scalar_size(t).ok_or_else(|| KvError::Type { key: key.clone(), ty: t })?)?;
                }
            }
            Ok(())
        };
        if t == GGUF_TYPE_ARRAY {
            let et = u32_at(take(&mut pos, 4)?);
            let n = u64_at(take(&mut pos, 8)?);
            if et == GGUF_TYPE_STRING {
                for _ in 0..n {
                    skip_value(&mut pos, et)?;
                }
            } else {
                let size = scalar_size(et).ok_or_else(|| KvError::ArrayType { key: key.clone(), ty: et })?;
                take(&mut pos, n.checked_mul(size).ok_or(KvError::ArraySize)?)?;
            }
        } else {
            skip_value(&mut pos, t)?;
        }
        out.push(RawKv { key, bytes: buf[start..pos].to_vec() });
    }
    Ok(out)
}

/// A uint32 KV.
pub fn kv_u32(key: &str, v: u32) -> RawKv {
    let mut b = Vec::new();
    b.extend_from_slice(&(key.len() as u64).to_le_bytes());
    b.extend_from_slice(key.as_bytes());
    b.extend_from_slice(&GGUF_TYPE_UINT32.to_le_bytes());
    b.extend_from_slice(&v.to_le_bytes());
    RawKv { key: key.to_string(), bytes: b }
}

/// A string KV (its bytes as given).
pub fn kv_str(key: &str, v: &[u8]) -> RawKv {
    let mut b = Vec::new();
    b.extend_from_slice(&(key.len() as u64).to_le_bytes());
    b.extend_from_slice(key.as_bytes());
    b.extend_from_slice(&GGUF_TYPE_STRING.to_le_bytes());
    b.extend_from_slice(&(v.len() as u64).to_le_bytes());
    b.extend_from_slice(v);
    RawKv { key: key.to_string(), bytes: b }
}

/// `gguf_set_val_*`: the key removed where it was, then appended.
pub fn set_kv(kvs: &mut Vec<RawKv>, kv: RawKv) {
    kvs.retain(|k| k.key != kv.key);
    kvs.push(kv);
}

/// The output's KVs: the input's, then the two set by `llama_model_quantize`, less `split.*`.
pub fn output_kvs(input: Vec<RawKv>, file_type: u32) -> Vec<RawKv> {
    let mut kvs = input;
    for (k, v) in [("general.quantization_version", QNT_VERSION), ("general.file_type", file_type)] {
        set_kv(&mut kvs, kv_u32(k, v));
    }
    kvs.retain(|kv| !matches!(kv.key.as_str(), "split.no" | "split.count" | "split.tensors.count"));
    kvs
}

/// `weight_name_comparer`'s key.
pub fn order_key(name: &str) -> (i64, &str) {
    (blk_layer(name).unwrap_or(-1), name)
}

/// One tensor of the output: its name, shape (`ne`), output type and data size.
#[derive(Debug, Clone)]
pub struct OutTensor {
    pub name: String,
    pub ne: Vec<u64>,
    pub ty: GgmlType,
    pub nbytes: u64,
}

pub fn pad(n: u64) -> u64 {
    n.div_ceil(ALIGNMENT) * ALIGNMENT
}

/// The header (`gguf_get_meta_data`): everything before the first tensor's data.
pub fn header(kvs: &[RawKv], tensors: &[OutTensor]) -> Vec<u8> {
    let mut h = Vec::new();
    h.extend_from_slice(b"GGUF");
    h.extend_from_slice(&3u32.to_le_bytes());
    h.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    h.extend_from_slice(&(kvs.len() as u64).to_le_bytes());
    for kv in kvs {
        h.extend_from_slice(&kv.bytes);
    }
    let mut offset = 0u64;
    for t in tensors {
        h.extend_from_slice(&(t.name.len() as u64).to_le_bytes());
        h.extend_from_slice(t.name.as_bytes());
        let nd = n_dims(&t.ne);
        h.extend_from_slice(&(nd as u32).to_le_bytes());
        for j in 0..nd {
            h.extend_from_slice(&t.ne.get(j).copied().unwrap_or(1).to_le_bytes());
        }
        h.extend_from_slice(&t.ty.id.to_le_bytes());
        h.extend_from_slice(&offset.to_le_bytes());
        offset += pad(t.nbytes);
    }
    h.resize(pad(h.len() as u64) as usize, 0);
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_keys_move_to_the_end_and_split_keys_go() {
        let kv = |k: &str| RawKv { key: k.into(), bytes: vec![] };
        let out = output_kvs(vec![kv("general.architecture"), kv("general.file_type"), kv("split.no"), kv("llama.block_count")], 7);
        let keys: Vec<&str> = out.iter().map(|k| k.key.as_str()).collect();
        assert_eq!(keys, ["general.architecture", "llama.block_count", "general.quantization_version", "general.file_type"]);
        let mut names = vec!["blk.10.attn_q.weight", "output.weight", "blk.2.ffn_up.weight", "blk.2.attn_q.weight", "token_embd.weight"];
        names.sort_by(|a, b| order_key(a).cmp(&order_key(b)));
        assert_eq!(names, ["output.weight", "token_embd.weight", "blk.2.attn_q.weight", "blk.2.ffn_up.weight", "blk.10.attn_q.weight"]);
    }
}
