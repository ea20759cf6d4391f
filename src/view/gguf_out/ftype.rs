//! The file types (`llama_ftype` of llama.h at the pinned commit): each one's number (what
//! `general.file_type` records), its name as `llama-quantize` spells it, and its default
//! tensor type (`llama_ftype_get_default_type`). Which file types the view offers is
//! [`Ftype::OFFERED`]; the rest exist so that the type-choice port can name them as
//! llama.cpp does.

use crate::codec::GgmlType;

/// A `llama_ftype`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(non_camel_case_types)]
pub enum Ftype {
    ALL_F32,
    F16,
    Q4_0,
    Q4_1,
    Q8_0,
    Q5_0,
    Q5_1,
    Q2_K,
    Q3_K_S,
    Q3_K_M,
    Q3_K_L,
    Q4_K_S,
    Q4_K_M,
    Q5_K_S,
    Q5_K_M,
    Q6_K,
    IQ2_XXS,
    IQ2_XS,
    Q2_K_S,
    IQ3_XS,
    IQ3_XXS,
    IQ1_S,
    IQ4_NL,
    IQ3_S,
    IQ3_M,
    IQ2_S,
    IQ2_M,
    IQ4_XS,
    IQ1_M,
    BF16,
    TQ1_0,
    TQ2_0,
    MXFP4_MOE,
    NVFP4,
    Q1_0,
    Q2_0,
}

/// (ftype, number, name, default ggml type name).
const TABLE: &[(Ftype, u32, &str, &str)] = &[
    (Ftype::ALL_F32, 0, "F32", "F32"),
    (Ftype::F16, 1, "F16", "F16"),
    (Ftype::Q4_0, 2, "Q4_0", "Q4_0"),
    (Ftype::Q4_1, 3, "Q4_1", "Q4_1"),
    (Ftype::Q8_0, 7, "Q8_0", "Q8_0"),
    (Ftype::Q5_0, 8, "Q5_0", "Q5_0"),
    (Ftype::Q5_1, 9, "Q5_1", "Q5_1"),
    (Ftype::Q2_K, 10, "Q2_K", "Q2_K"),
    (Ftype::Q3_K_S, 11, "Q3_K_S", "Q3_K"),
    (Ftype::Q3_K_M, 12, "Q3_K_M", "Q3_K"),
    (Ftype::Q3_K_L, 13, "Q3_K_L", "Q3_K"),
    (Ftype::Q4_K_S, 14, "Q4_K_S", "Q4_K"),
    (Ftype::Q4_K_M, 15, "Q4_K_M", "Q4_K"),
    (Ftype::Q5_K_S, 16, "Q5_K_S", "Q5_K"),
    (Ftype::Q5_K_M, 17, "Q5_K_M", "Q5_K"),
    (Ftype::Q6_K, 18, "Q6_K", "Q6_K"),
    (Ftype::IQ2_XXS, 19, "IQ2_XXS", "IQ2_XXS"),
    (Ftype::IQ2_XS, 20, "IQ2_XS", "IQ2_XS"),
    (Ftype::Q2_K_S, 21, "Q2_K_S", "Q2_K"),
    (Ftype::IQ3_XS, 22, "IQ3_XS", "IQ3_S"),
    (Ftype::IQ3_XXS, 23, "IQ3_XXS", "IQ3_XXS"),
    (Ftype::IQ1_S, 24, "IQ1_S", "IQ1_S"),
    (Ftype::IQ4_NL, 25, "IQ4_NL", "IQ4_NL"),
    (Ftype::IQ3_S, 26, "IQ3_S", "IQ3_S"),
    (Ftype::IQ3_M, 27, "IQ3_M", "IQ3_S"),
    (Ftype::IQ2_S, 28, "IQ2_S", "IQ2_XS"),
    (Ftype::IQ2_M, 29, "IQ2_M", "IQ2_S"),
    (Ftype::IQ4_XS, 30, "IQ4_XS", "IQ4_XS"),
    (Ftype::IQ1_M, 31, "IQ1_M", "IQ1_M"),
    (Ftype::BF16, 32, "BF16", "BF16"),
    (Ftype::TQ1_0, 36, "TQ1_0", "TQ1_0"),
    (Ftype::TQ2_0, 37, "TQ2_0", "TQ2_0"),
    (Ftype::MXFP4_MOE, 38, "MXFP4_MOE", "MXFP4"),
    (Ftype::NVFP4, 39, "NVFP4", ""),
    (Ftype::Q1_0, 40, "Q1_0", "Q1_0"),
    (Ftype::Q2_0, 41, "Q2_0", "Q2_0"),
];

impl Ftype {
    /// The file types `-o ftype=` accepts: those of issue 26, IQ2_XXS (which needs an
    /// imatrix, as in llama-quantize), Q4_1, Q5_0 and Q5_1 (their quantizers exist), and the
    /// float ones.
    pub const OFFERED: &'static [Ftype] = &[
        Ftype::Q4_K_M,
        Ftype::Q4_K_S,
        Ftype::Q5_K_M,
        Ftype::Q5_K_S,
        Ftype::Q6_K,
        Ftype::Q8_0,
        Ftype::Q4_0,
        Ftype::Q3_K_M,
        Ftype::Q3_K_S,
        Ftype::Q2_K,
        Ftype::IQ4_XS,
        Ftype::IQ4_NL,
        Ftype::IQ2_XXS,
        Ftype::Q4_1,
        Ftype::Q5_0,
        Ftype::Q5_1,
        Ftype::F16,
        Ftype::BF16,
        Ftype::ALL_F32,
    ];

    fn row(self) -> &'static (Ftype, u32, &'static str, &'static str) {
        TABLE.iter().find(|r| r.0 == self).expect("every ftype has a row")
    }

    /// The `llama_ftype` number, as `general.file_type` records it.
    pub fn number(self) -> u32 {
        self.row().1
    }

    /// The name as llama-quantize spells it (`Q4_K_M`, `F16`, ...).
    pub fn name(self) -> &'static str {
        self.row().2
    }

    /// `llama_ftype_get_default_type`.
    pub fn default_type(self) -> Option<GgmlType> {
        GgmlType::from_name(self.row().3)
    }

    /// For option parsing: an offered file type by name (any case) or number.
    pub fn parse(s: &str) -> Result<Ftype, FtypeError> {
        let found = TABLE
            .iter()
            .find(|r| r.2.eq_ignore_ascii_case(s) || s.parse::<u32>().ok() == Some(r.1) || (s.eq_ignore_ascii_case("ALL_F32") && r.0 == Ftype::ALL_F32));
        let offered = || Ftype::OFFERED.iter().map(|f| f.name()).collect::<Vec<_>>().join(", ");
        match found {
            Some(r) if Ftype::OFFERED.contains(&r.0) => Ok(r.0),
            Some(r) => Err(FtypeError::NotOffered { name: r.2, offered: offered() }),
            None => Err(FtypeError::Unknown { given: s.to_string(), offered: offered() }),
        }
    }
}

/// Why [`Ftype::parse`] refuses a value; `offered` lists the file types the view offers.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FtypeError {
    /// A llama.cpp file type the gguf view does not offer.
    #[error("file type {name} is not offered by the gguf view: {offered}")]
    NotOffered { name: &'static str, offered: String },
    /// Not a llama.cpp file type's name or number.
    #[error("{given:?} is not a llama.cpp file type: {offered}")]
    Unknown { given: String, offered: String },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_numbers_and_defaults() {
        assert_eq!(Ftype::parse("q4_k_m"), Ok(Ftype::Q4_K_M));
        assert_eq!(Ftype::parse("7"), Ok(Ftype::Q8_0));
        assert_eq!(Ftype::Q8_0.number(), 7);
        assert_eq!(Ftype::Q4_K_M.default_type().unwrap().name, "Q4_K");
        assert_eq!(Ftype::IQ2_S.default_type().unwrap().name, "IQ2_XS");
        assert!(matches!(Ftype::parse("IQ1_S"), Err(FtypeError::NotOffered { name: "IQ1_S", .. })));
        assert!(Ftype::parse("IQ1_S").unwrap_err().to_string().contains("not offered"));
        assert_eq!(Ftype::parse("iq2_xxs"), Ok(Ftype::IQ2_XXS));
        assert!(Ftype::parse("Q9").unwrap_err().to_string().contains("not a llama.cpp file type"));
        for f in Ftype::OFFERED {
            assert!(f.default_type().is_some(), "{f:?}");
        }
    }
}
