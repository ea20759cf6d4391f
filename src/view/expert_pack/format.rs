//! The `SGLANG-EXPERTPACK-v1` on-disk format: constants, the 176-byte header and the
//! 328-byte index entry (encode and decode), and the seed's per-object generation number.
//! Struct layouts: `shared/reference/expert-pack.md`.

use sha2::{Digest, Sha256};

pub const FORMAT: &str = "SGLANG-EXPERTPACK-v1";
pub const MAGIC: &[u8; 24] = b"SGLANG-EXPERTPACK-v1\0\0\0\0";
pub const VERSION: u32 = 1;
pub const HEADER_BYTES: u64 = 176;
pub const ENTRY_BYTES: u64 = 328;
pub const FLAG_IDENTITY_PAYLOAD: u32 = 1;
pub const FLAG_TRIPLET_OBJECTS: u32 = 2;
pub const ROLE_NAMES: [&str; 3] = ["gate", "up", "down"];
pub const TRANSFORM_ID: &str = "identity-v1";

/// The fixed-size pack header.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct PackHeader {
    pub version: u32,
    pub header_bytes: u32,
    pub entry_bytes: u32,
    pub flags: u32,
    pub index_count: u64,
    pub data_start: u64,
    pub alignment: u64,
    pub num_layers: u32,
    pub num_experts: u32,
    pub top_k: u32,
    pub role_count: u32,
    #[serde(serialize_with = "ser_hex")]
    pub model_identity_sha256: [u8; 32],
    #[serde(serialize_with = "ser_hex")]
    pub source_blob_sha256: [u8; 32],
    #[serde(serialize_with = "ser_hex")]
    pub config_sha256: [u8; 32],
}

fn ser_hex<S: serde::Serializer>(b: &[u8], s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&hex::encode(b))
}

fn put_str(out: &mut Vec<u8>, s: &str, width: usize) {
    let b = s.as_bytes();
    out.extend_from_slice(&b[..b.len().min(width)]);
    out.extend(std::iter::repeat_n(0u8, width - b.len().min(width)));
}

fn get_str(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

struct Rd<'a>(&'a [u8]);
impl Rd<'_> {
    fn take(&mut self, n: usize) -> &[u8] {
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        a
    }
    fn u8(&mut self) -> u8 {
        self.take(1)[0]
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.take(2).try_into().unwrap())
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.take(4).try_into().unwrap())
    }
    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.take(8).try_into().unwrap())
    }
    fn b32(&mut self) -> [u8; 32] {
        self.take(32).try_into().unwrap()
    }
}

impl PackHeader {
    pub fn encode(&self) -> Vec<u8> {
        let mut o = Vec::with_capacity(HEADER_BYTES as usize);
        o.extend_from_slice(MAGIC);
        for v in [self.version, self.header_bytes, self.entry_bytes, self.flags] {
            o.extend_from_slice(&v.to_le_bytes());
        }
        for v in [self.index_count, self.data_start, self.alignment] {
            o.extend_from_slice(&v.to_le_bytes());
        }
        for v in [self.num_layers, self.num_experts, self.top_k, self.role_count] {
            o.extend_from_slice(&v.to_le_bytes());
        }
        o.extend_from_slice(&self.model_identity_sha256);
        o.extend_from_slice(&self.source_blob_sha256);
        o.extend_from_slice(&self.config_sha256);
        debug_assert_eq!(o.len() as u64, HEADER_BYTES);
        o
    }

    /// Decode and check the magic; `None` when `b` is not a pack header.
    pub fn decode(b: &[u8]) -> Option<PackHeader> {
        if b.len() < HEADER_BYTES as usize || &b[..24] != MAGIC {
            return None;
        }
        let mut r = Rd(&b[24..]);
        Some(PackHeader {
            version: r.u32(),
            header_bytes: r.u32(),
            entry_bytes: r.u32(),
            flags: r.u32(),
            index_count: r.u64(),
            data_start: r.u64(),
            alignment: r.u64(),
            num_layers: r.u32(),
            num_experts: r.u32(),
            top_k: r.u32(),
            role_count: r.u32(),
            model_identity_sha256: r.b32(),
            source_blob_sha256: r.b32(),
            config_sha256: r.b32(),
        })
    }
}

/// One 328-byte index entry.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct IndexEntry {
    pub layer: u16,
    pub expert: u16,
    pub role_id: u8,
    pub rank: u8,
    pub dtype_id: u16,
    pub dtype: String,
    pub tensor_name: String,
    pub source_tensor_offset: u64,
    pub source_tensor_nbytes: u64,
    pub source_slice_offset: u64,
    pub source_slice_nbytes: u64,
    pub pack_offset: u64,
    pub pack_nbytes: u64,
    #[serde(serialize_with = "ser_hex")]
    pub source_tensor_sha256: [u8; 32],
    #[serde(serialize_with = "ser_hex")]
    pub source_slice_sha256: [u8; 32],
    #[serde(serialize_with = "ser_hex")]
    pub checksum: [u8; 32],
    pub shape: [u64; 4],
    pub quant_scheme: String,
    pub transform_id: String,
    pub block_size: u64,
    pub generation: u64,
}

impl IndexEntry {
    pub fn encode_into(&self, o: &mut Vec<u8>) {
        let start = o.len();
        o.extend_from_slice(&self.layer.to_le_bytes());
        o.extend_from_slice(&self.expert.to_le_bytes());
        o.push(self.role_id);
        o.push(self.rank);
        o.extend_from_slice(&self.dtype_id.to_le_bytes());
        put_str(o, &self.dtype, 16);
        put_str(o, &self.tensor_name, 80);
        for v in [self.source_tensor_offset, self.source_tensor_nbytes, self.source_slice_offset, self.source_slice_nbytes, self.pack_offset, self.pack_nbytes]
        {
            o.extend_from_slice(&v.to_le_bytes());
        }
        o.extend_from_slice(&self.source_tensor_sha256);
        o.extend_from_slice(&self.source_slice_sha256);
        o.extend_from_slice(&self.checksum);
        for v in self.shape {
            o.extend_from_slice(&v.to_le_bytes());
        }
        put_str(o, &self.quant_scheme, 16);
        put_str(o, &self.transform_id, 16);
        o.extend_from_slice(&self.block_size.to_le_bytes());
        o.extend_from_slice(&self.generation.to_le_bytes());
        debug_assert_eq!((o.len() - start) as u64, ENTRY_BYTES);
    }

    pub fn decode(b: &[u8]) -> IndexEntry {
        let mut r = Rd(b);
        IndexEntry {
            layer: r.u16(),
            expert: r.u16(),
            role_id: r.u8(),
            rank: r.u8(),
            dtype_id: r.u16(),
            dtype: get_str(r.take(16)),
            tensor_name: get_str(r.take(80)),
            source_tensor_offset: r.u64(),
            source_tensor_nbytes: r.u64(),
            source_slice_offset: r.u64(),
            source_slice_nbytes: r.u64(),
            pack_offset: r.u64(),
            pack_nbytes: r.u64(),
            source_tensor_sha256: r.b32(),
            source_slice_sha256: r.b32(),
            checksum: r.b32(),
            shape: [r.u64(), r.u64(), r.u64(), r.u64()],
            quant_scheme: get_str(r.take(16)),
            transform_id: get_str(r.take(16)),
            block_size: r.u64(),
            generation: r.u64(),
        }
    }
}

/// The seed's per-object generation number.
pub fn generation(model_identity_hex: &str, source_sha_hex: &str, layer: u32, expert: u32) -> u64 {
    let d = Sha256::digest(format!("{model_identity_hex}:{source_sha_hex}:{layer}:{expert}").as_bytes());
    match u64::from_le_bytes(d[..8].try_into().unwrap()) {
        0 => 1,
        g => g,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trip() {
        let h = PackHeader {
            version: 1,
            header_bytes: 176,
            entry_bytes: 328,
            flags: 3,
            index_count: 9,
            data_start: 4096,
            alignment: 4096,
            num_layers: 1,
            num_experts: 3,
            top_k: 2,
            role_count: 3,
            model_identity_sha256: [1; 32],
            source_blob_sha256: [2; 32],
            config_sha256: [3; 32],
        };
        let b = h.encode();
        assert_eq!(b.len(), 176);
        assert_eq!(PackHeader::decode(&b), Some(h));
    }

    #[test]
    fn generation_matches_python() {
        // python3 -c 'import hashlib;print(int.from_bytes(hashlib.sha256(b"aa:bb:1:2").digest()[:8],"little"))'
        assert_eq!(generation("aa", "bb", 1, 2), 11220030222268250832);
    }
}
