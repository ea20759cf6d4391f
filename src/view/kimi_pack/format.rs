//! The `GGMLMOEPACKv1` on-disk format of SGLang's Kimi K3 pack: constants, the 40-byte
//! header (`<16sIIQQ`) and the 152-byte index entry (`<128siIQQ`), encoded and decoded.
//! Facts from SGLang's `tools/expert_pack/kimi_ggml.py` (`PACK_HEADER`, `PACK_ENTRY`,
//! `ROLE_ORDER`) and the runtime reader `KimiGGMLExpertPackStore`.

use crate::codec::GgmlType;

pub const MAGIC: &[u8; 16] = b"GGMLMOEPACKv1\0\0\0";
/// The magic as the manifest spells it (`PACK_MAGIC.rstrip(b"\0")`).
pub const MAGIC_NAME: &str = "GGMLMOEPACKv1";
pub const VERSION: u32 = 1;
pub const HEADER_BYTES: u64 = 40;
pub const ENTRY_BYTES: u64 = 152;
/// Width of an entry's NUL-padded tensor name: names must be shorter.
pub const NAME_BYTES: usize = 128;
/// Every entry (and the data start) is aligned to this.
pub const ALIGNMENT: u64 = 4096;
/// The adapter manifest's `format`.
pub const MANIFEST_FORMAT: &str = "SGLANG-KIMI-GGMLMOEPACK-ADAPTER-v1";
/// The GGUF `general.architecture` of a Kimi K3 shard set.
pub const ARCHITECTURE: &str = "kimi-k3";

/// An expert's three matrices, in the pack's physical order (up, gate, down).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Role {
    Up = 0,
    Gate = 1,
    Down = 2,
}

impl Role {
    pub const ORDER: [Role; 3] = [Role::Up, Role::Gate, Role::Down];

    pub fn name(self) -> &'static str {
        ["up", "gate", "down"][self as usize]
    }

    pub fn from_name(s: &str) -> Option<Role> {
        Role::ORDER.into_iter().find(|r| r.name() == s)
    }

    /// The quantisation SGLang accepts for the role: Q2_K up and gate, Q3_K down.
    pub fn dtype(self) -> GgmlType {
        let name = if self == Role::Down { "Q3_K" } else { "Q2_K" };
        GgmlType::from_name(name).expect("in the type table")
    }
}

/// The header: magic, version, header size, index count, data start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub version: u32,
    pub header_size: u32,
    pub index_count: u64,
    pub data_start: u64,
}

impl Header {
    pub fn new(index_count: u64, data_start: u64) -> Header {
        Header { version: VERSION, header_size: HEADER_BYTES as u32, index_count, data_start }
    }

    pub fn encode_into(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&self.version.to_le_bytes());
        out.extend_from_slice(&self.header_size.to_le_bytes());
        out.extend_from_slice(&self.index_count.to_le_bytes());
        out.extend_from_slice(&self.data_start.to_le_bytes());
    }

    /// `None` unless `b` holds 40 bytes starting with the magic.
    pub fn decode(b: &[u8]) -> Option<Header> {
        if b.len() < HEADER_BYTES as usize || &b[..16] != MAGIC {
            return None;
        }
        Some(Header {
            version: u32::from_le_bytes(b[16..20].try_into().ok()?),
            header_size: u32::from_le_bytes(b[20..24].try_into().ok()?),
            index_count: u64::from_le_bytes(b[24..32].try_into().ok()?),
            data_start: u64::from_le_bytes(b[32..40].try_into().ok()?),
        })
    }
}

/// One index entry: the source tensor's name, the expert, its offset and size in the pack.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Decoded up to the first NUL; `None` when those bytes are not UTF-8.
    pub name: Option<String>,
    pub expert: i32,
    pub reserved: u32,
    pub offset: u64,
    pub nbytes: u64,
}

/// Encode an entry; `name` must be shorter than [`NAME_BYTES`] (checked by the planner).
pub fn encode_entry(out: &mut Vec<u8>, name: &str, expert: i32, offset: u64, nbytes: u64) {
    let b = name.as_bytes();
    debug_assert!(b.len() < NAME_BYTES);
    let n = b.len().min(NAME_BYTES);
    out.extend_from_slice(&b[..n]);
    out.extend(std::iter::repeat_n(0u8, NAME_BYTES - n));
    out.extend_from_slice(&expert.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&offset.to_le_bytes());
    out.extend_from_slice(&nbytes.to_le_bytes());
}

impl Entry {
    /// Decode 152 bytes.
    pub fn decode(b: &[u8; ENTRY_BYTES as usize]) -> Entry {
        let raw = &b[..NAME_BYTES];
        let end = raw.iter().position(|&c| c == 0).unwrap_or(NAME_BYTES);
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        Entry {
            name: std::str::from_utf8(&raw[..end]).ok().map(str::to_string),
            expert: u32_at(128) as i32,
            reserved: u32_at(132),
            offset: u64_at(136),
            nbytes: u64_at(144),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_and_entry_layouts() {
        // struct.pack("<16sIIQQ", PACK_MAGIC, 1, 40, 3, 4096).hex()
        let mut h = Vec::new();
        Header::new(3, 4096).encode_into(&mut h);
        assert_eq!(
            hex::encode(&h),
            "47474d4c4d4f455041434b763100000001000000280000000300000000000000\
             0010000000000000"
        );
        assert_eq!(Header::decode(&h), Some(Header::new(3, 4096)));
        assert_eq!(Header::decode(&h[..39]), None);

        // struct.pack("<128siIQQ", b"blk.1.ffn_up_exps.weight".ljust(128, b"\0"), 7, 0, 8192, 21504)
        let mut e = Vec::new();
        encode_entry(&mut e, "blk.1.ffn_up_exps.weight", 7, 8192, 21504);
        assert_eq!(e.len() as u64, ENTRY_BYTES);
        assert_eq!(&e[..24], b"blk.1.ffn_up_exps.weight");
        assert!(e[24..128].iter().all(|&b| b == 0));
        assert_eq!(hex::encode(&e[128..]), "070000000000000000200000000000000054000000000000");
        let d = Entry::decode(e.as_slice().try_into().unwrap());
        assert_eq!(d, Entry { name: Some("blk.1.ffn_up_exps.weight".into()), expert: 7, reserved: 0, offset: 8192, nbytes: 21504 });
    }

    #[test]
    fn roles_and_their_types() {
        assert_eq!(Role::ORDER.map(Role::name), ["up", "gate", "down"]);
        assert_eq!(Role::ORDER.map(|r| (r.dtype().name, r.dtype().id)), [("Q2_K", 10), ("Q2_K", 10), ("Q3_K", 11)]);
        assert_eq!(Role::from_name("gate"), Some(Role::Gate));
        assert_eq!(Role::from_name("shexp"), None);
    }
}
