//! The ggml tensor type table: id, name (as gguf-py's `GGMLQuantizationType` spells it),
//! elements per block and bytes per block. Ids that ggml has retired (4, 5, 31-33, 36-38)
//! are unknown here, as they are to ggml.

use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GgmlType {
    pub id: u32,
    pub name: &'static str,
    pub block_size: u64,
    pub type_size: u64,
}

const TABLE: &[(u32, &str, u64, u64)] = &[
    (0, "F32", 1, 4),
    (1, "F16", 1, 2),
    (2, "Q4_0", 32, 18),
    (3, "Q4_1", 32, 20),
    (6, "Q5_0", 32, 22),
    (7, "Q5_1", 32, 24),
    (8, "Q8_0", 32, 34),
    (9, "Q8_1", 32, 40),
    (10, "Q2_K", 256, 84),
    (11, "Q3_K", 256, 110),
    (12, "Q4_K", 256, 144),
    (13, "Q5_K", 256, 176),
    (14, "Q6_K", 256, 210),
    (15, "Q8_K", 256, 292),
    (16, "IQ2_XXS", 256, 66),
    (17, "IQ2_XS", 256, 74),
    (18, "IQ3_XXS", 256, 98),
    (19, "IQ1_S", 256, 50),
    (20, "IQ4_NL", 32, 18),
    (21, "IQ3_S", 256, 110),
    (22, "IQ2_S", 256, 82),
    (23, "IQ4_XS", 256, 136),
    (24, "I8", 1, 1),
    (25, "I16", 1, 2),
    (26, "I32", 1, 4),
    (27, "I64", 1, 8),
    (28, "F64", 1, 8),
    (29, "IQ1_M", 256, 56),
    (30, "BF16", 1, 2),
    (34, "TQ1_0", 256, 54),
    (35, "TQ2_0", 256, 66),
    (39, "MXFP4", 32, 17),
    (40, "NVFP4", 64, 36),
    (41, "Q1_0", 128, 18),
];

impl GgmlType {
    pub fn from_id(id: u32) -> Option<GgmlType> {
        TABLE.iter().find(|row| row.0 == id).map(|&(id, name, block_size, type_size)| GgmlType { id, name, block_size, type_size })
    }

    pub fn from_name(name: &str) -> Option<GgmlType> {
        TABLE.iter().find(|row| row.1.eq_ignore_ascii_case(name)).and_then(|row| GgmlType::from_id(row.0))
    }

    /// Bytes of a row of `elements` values, or None when `elements` is not a whole
    /// number of blocks.
    pub fn row_bytes(&self, elements: u64) -> Option<u64> {
        if !elements.is_multiple_of(self.block_size) {
            return None;
        }
        (elements / self.block_size).checked_mul(self.type_size)
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retired_ids_are_unknown() {
        for id in [4, 5, 31, 32, 33, 36, 37, 38, 42, u32::MAX] {
            assert!(GgmlType::from_id(id).is_none(), "{id}");
        }
    }

    #[test]
    fn row_bytes_checks_blocks() {
        let mx = GgmlType::from_name("mxfp4").unwrap();
        assert_eq!(mx.id, 39);
        assert_eq!(mx.row_bytes(64), Some(34));
        assert_eq!(mx.row_bytes(33), None);
    }
}
