//! Numeric formats: pure functions over bytes and rows, no I/O. One file per format.
//!
//! Every function works on whole rows (or any run of whole blocks), so views can compute
//! any chunk of rows on any thread. The quantisers reproduce the reference ggml
//! (`ggml-quants.c`, x86-64 baseline build) bit for bit: f32 arithmetic in C's
//! evaluation order, never fused multiply-add, `nearest_int` (ties to even) where ggml
//! uses it and `roundf` (ties away) where it uses that. See
//! `shared/reference/ggml-quants.md`.
//!
//! The code in the per-format files is the scalar reference. [`simd`] has AVX2 and
//! AVX-512 versions of the quantisers and decoders, chosen once per process at run time
//! and bit-exact with the reference; the public entry points run at [`simd::level`], the
//! `_at` variants at a given level (tests, benches), the `_par` variants on all cores.

pub mod float;
pub mod fp8;
pub mod ggml_type;
pub mod iq2_tables;
pub mod iq2_xxs;
pub mod iq4_nl;
pub mod iq4_xs;
pub mod kquants;
pub mod kt_int8;
pub mod mxfp4;
pub mod q2_k;
pub mod q3_k;
pub mod q4_0;
pub mod q4_1;
pub mod q4_k;
pub mod q5_0;
pub mod q5_1;
pub mod q5_k;
pub mod q6_k;
pub mod q8_0;
pub mod simd;

pub use ggml_type::GgmlType;

use crate::util::args::InvalidValue;

/// Changes whenever the output of any codec could change (a fix, a new rounding): everything
/// remembered about computed bytes (digests in the store, chunks in a disk cache) is keyed
/// with it, so bytes computed by another revision are never taken for this one's.
pub const REVISION: u32 = 1;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CodecError {
    #[error("E8M0 scale byte 255 (NaN) at scale index {index}")]
    E8m0Nan { index: usize },
    #[error("non-finite or non-positive FP8 scale at block ({block_row}, {block_col})")]
    BadScale { block_row: usize, block_col: usize },
    #[error("non-finite FP8 weight at ({row}, {col})")]
    NonFiniteWeight { row: usize, col: usize },
    #[error("FP8 weight overflows BF16 at ({row}, {col})")]
    Bf16Overflow { row: usize, col: usize },
    #[error("{0}")]
    Shape(String),
    #[error("{0} requires an importance vector")]
    ImportanceRequired(&'static str),
}

/// ggml's `nearest_int`: round half to even via the 1.5*2^23 trick, bit for bit
/// (including the values the reference's debug-only assert would reject).
#[inline(always)]
pub(crate) fn nearest_int(f: f32) -> i32 {
    let v = f + 12582912.0f32;
    (v.to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

/// C's `MAX(a, b)` macro: `a > b ? a : b` (NaN handling included).
#[inline(always)]
pub(crate) fn cmax(a: f32, b: f32) -> f32 {
    if a > b { a } else { b }
}

#[inline(always)]
pub(crate) fn fp16_to_f32(bits: u16) -> f32 {
    half::f16::from_bits(bits).to_f32()
}

/// Round to nearest even, as ggml's `GGML_FP32_TO_FP16` on x86-64 without F16C.
#[inline(always)]
pub(crate) fn f32_to_fp16(f: f32) -> u16 {
    half::f16::from_f32(f).to_bits()
}

pub(crate) fn read_u16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

/// The ggml types xpackfs can quantise to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuantType {
    Q8_0,
    Q2K,
    Iq2Xxs,
    Q3K,
    Q4K,
    Q5K,
    Q6K,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Iq4Nl,
    Iq4Xs,
}

impl QuantType {
    /// For option parsing: the type named `name`, or the rule. The requant recipe's types
    /// only (IQ2_XXS, Q2_K, Q8_0); [`QuantType::parse_any`] takes every type.
    pub fn parse(name: &str) -> Result<QuantType, InvalidValue> {
        match QuantType::from_name(name) {
            Some(t @ (QuantType::Q8_0 | QuantType::Q2K | QuantType::Iq2Xxs)) => Ok(t),
            _ => Err(InvalidValue::given(name, "is not a type xpackfs quantises to: IQ2_XXS, Q2_K or Q8_0")),
        }
    }

    /// [`QuantType::parse`] over every type xpackfs quantises to (`xpackfs codec quantize`).
    pub fn parse_any(name: &str) -> Result<QuantType, InvalidValue> {
        QuantType::from_name(name).ok_or_else(|| {
            InvalidValue::given(
                name,
                "is not a type xpackfs quantises to: IQ2_XXS, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL or IQ4_XS",
            )
        })
    }

    pub fn from_name(name: &str) -> Option<QuantType> {
        match name.to_ascii_uppercase().as_str() {
            "Q8_0" => Some(QuantType::Q8_0),
            "Q2_K" => Some(QuantType::Q2K),
            "IQ2_XXS" => Some(QuantType::Iq2Xxs),
            "Q3_K" => Some(QuantType::Q3K),
            "Q4_K" => Some(QuantType::Q4K),
            "Q5_K" => Some(QuantType::Q5K),
            "Q6_K" => Some(QuantType::Q6K),
            "Q4_0" => Some(QuantType::Q4_0),
            "Q4_1" => Some(QuantType::Q4_1),
            "Q5_0" => Some(QuantType::Q5_0),
            "Q5_1" => Some(QuantType::Q5_1),
            "IQ4_NL" => Some(QuantType::Iq4Nl),
            "IQ4_XS" => Some(QuantType::Iq4Xs),
            _ => None,
        }
    }
    pub fn ggml(self) -> GgmlType {
        GgmlType::from_name(match self {
            QuantType::Q8_0 => "Q8_0",
            QuantType::Q2K => "Q2_K",
            QuantType::Iq2Xxs => "IQ2_XXS",
            QuantType::Q3K => "Q3_K",
            QuantType::Q4K => "Q4_K",
            QuantType::Q5K => "Q5_K",
            QuantType::Q6K => "Q6_K",
            QuantType::Q4_0 => "Q4_0",
            QuantType::Q4_1 => "Q4_1",
            QuantType::Q5_0 => "Q5_0",
            QuantType::Q5_1 => "Q5_1",
            QuantType::Iq4Nl => "IQ4_NL",
            QuantType::Iq4Xs => "IQ4_XS",
        })
        .unwrap()
    }
}

/// Quantise `rows` rows of `n_per_row` values, as the reference's `quantize_<type>(src,
/// dst, nrow, n_per_row, imatrix)`. `importance` has `n_per_row` values (one per column)
/// or is `None` (Q2_K then takes the reference path; IQ2_XXS requires importance).
/// Runs at the process's SIMD level ([`simd::level`]); every level gives the same bytes.
pub fn quantize_rows(ty: QuantType, src: &[f32], n_per_row: usize, importance: Option<&[f32]>, dst: &mut [u8]) -> Result<(), CodecError> {
    quantize_rows_at(simd::level(), ty, src, n_per_row, importance, dst)
}

/// [`quantize_rows`] at a given SIMD level (lowered to what the CPU has).
pub fn quantize_rows_at(
    level: simd::Level,
    ty: QuantType,
    src: &[f32],
    n_per_row: usize,
    importance: Option<&[f32]>,
    dst: &mut [u8],
) -> Result<(), CodecError> {
    let g = ty.ggml();
    if n_per_row == 0 || !n_per_row.is_multiple_of(g.block_size as usize) || !src.len().is_multiple_of(n_per_row) {
        return Err(CodecError::Shape(format!("{} rows must be a whole number of {}-value blocks, got {n_per_row}", g.name, g.block_size)));
    }
    let rows = src.len() / n_per_row;
    let row_bytes = n_per_row / g.block_size as usize * g.type_size as usize;
    if dst.len() != rows * row_bytes {
        return Err(CodecError::Shape(format!("output holds {} bytes, {rows} rows of {} need {}", dst.len(), g.name, rows * row_bytes)));
    }
    if let Some(imp) = importance
        && imp.len() != n_per_row
    {
        return Err(CodecError::Shape(format!("importance has {} values for rows of {n_per_row}", imp.len())));
    }
    #[cfg(target_arch = "x86_64")]
    {
        let done = match (ty, importance) {
            (QuantType::Q8_0, _) => simd::q8_0::quantize(level, src, dst).map(Ok),
            (QuantType::Q2K, None) => simd::q2_k::quantize_ref(level, src, dst).map(Ok),
            (QuantType::Q2K, Some(w)) => simd::q2_k::quantize_impl(level, src, n_per_row, w, dst).map(Ok),
            (QuantType::Iq2Xxs, Some(w)) => simd::iq2_xxs::quantize(level, src, n_per_row, w, dst),
            (QuantType::Iq2Xxs, None) => None,
            (QuantType::Q4K, None) => simd::q4_k::quantize_q4_ref(level, src, dst).map(Ok),
            (QuantType::Q4K, Some(w)) => simd::q4_k::quantize_q4_impl(level, src, n_per_row, w, dst).map(Ok),
            (QuantType::Q5K, None) => simd::q4_k::quantize_q5_ref(level, src, dst).map(Ok),
            (QuantType::Q5K, Some(w)) => simd::q4_k::quantize_q5_impl(level, src, n_per_row, w, dst).map(Ok),
            (QuantType::Q6K, None) => simd::q6_k::quantize_ref(level, src, dst).map(Ok),
            (QuantType::Q6K, Some(w)) => simd::q6_k::quantize_impl(level, src, n_per_row, w, dst).map(Ok),
            (QuantType::Q3K, None) => simd::q3_k::quantize_ref(level, src, dst).map(Ok),
            (QuantType::Q3K, Some(w)) => simd::q3_k::quantize_impl(level, src, n_per_row, w, dst).map(Ok),
            (QuantType::Q4_0, None) => simd::q4_0::quantize_q4_0_ref(level, src, dst).map(Ok),
            (QuantType::Q4_0, Some(w)) => simd::q4_0::quantize_q4_0_impl(level, src, n_per_row, w, dst).map(Ok),
            (QuantType::Q5_0, None) => simd::q4_0::quantize_q5_0_ref(level, src, dst).map(Ok),
            (QuantType::Q5_0, Some(w)) => simd::q4_0::quantize_q5_0_impl(level, src, n_per_row, w, dst).map(Ok),
            (QuantType::Q4_1, None) => simd::q4_1::quantize_q4_1_ref(level, src, dst).map(Ok),
            (QuantType::Q4_1, Some(w)) => simd::q4_1::quantize_q4_1_impl(level, src, n_per_row, w, dst).map(Ok),
            (QuantType::Q5_1, None) => simd::q4_1::quantize_q5_1_ref(level, src, dst).map(Ok),
            (QuantType::Q5_1, Some(w)) => simd::q4_1::quantize_q5_1_impl(level, src, n_per_row, w, dst).map(Ok),
            (QuantType::Iq4Nl, w) => simd::iq4_nl::quantize_nl(level, src, n_per_row, w, dst).map(Ok),
            (QuantType::Iq4Xs, w) => simd::iq4_nl::quantize_xs(level, src, n_per_row, w, dst).map(Ok),
        };
        if let Some(r) = done {
            return r;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = level;
    for (x, y) in src.chunks_exact(n_per_row).zip(dst.chunks_exact_mut(row_bytes)) {
        match ty {
            QuantType::Q8_0 => q8_0::quantize_row(x, y),
            QuantType::Q2K => match importance {
                None => q2_k::quantize_row_ref(x, y),
                Some(w) => q2_k::quantize_row_impl(x, y, w),
            },
            QuantType::Iq2Xxs => iq2_xxs::quantize_row(x, y, importance.ok_or(CodecError::ImportanceRequired("IQ2_XXS"))?)?,
            QuantType::Q3K | QuantType::Q4K | QuantType::Q5K | QuantType::Q6K => quantize_row_k(ty, x, y, importance),
            QuantType::Q4_0 | QuantType::Q4_1 | QuantType::Q5_0 | QuantType::Q5_1 | QuantType::Iq4Nl | QuantType::Iq4Xs => {
                quantize_row_legacy(ty, x, y, importance)
            }
        }
    }
    Ok(())
}

/// One row of Q3_K..Q6_K: ggml's `quantize_<type>` takes `quantize_row_<type>_ref` without
/// importance and `quantize_row_<type>_impl` with it.
fn quantize_row_k(ty: QuantType, x: &[f32], y: &mut [u8], importance: Option<&[f32]>) {
    match (ty, importance) {
        (QuantType::Q3K, None) => q3_k::quantize_row_ref(x, y),
        (QuantType::Q3K, Some(w)) => q3_k::quantize_row_impl(x, y, w),
        (QuantType::Q4K, None) => q4_k::quantize_row_ref(x, y),
        (QuantType::Q4K, Some(w)) => q4_k::quantize_row_impl(x, y, w),
        (QuantType::Q5K, None) => q5_k::quantize_row_ref(x, y),
        (QuantType::Q5K, Some(w)) => q5_k::quantize_row_impl(x, y, w),
        (QuantType::Q6K, None) => q6_k::quantize_row_ref(x, y),
        (QuantType::Q6K, Some(w)) => q6_k::quantize_row_impl(x, y, w),
        _ => unreachable!("not a K-quant: {ty:?}"),
    }
}

/// The scalar quantisers of Q4_0, Q4_1, Q5_0, Q5_1 (the `_ref` path without importance,
/// `_impl` with), IQ4_NL and IQ4_XS (one path, `x^2` weights without importance), one row.
fn quantize_row_legacy(ty: QuantType, x: &[f32], y: &mut [u8], importance: Option<&[f32]>) {
    match (ty, importance) {
        (QuantType::Q4_0, None) => q4_0::quantize_row_ref(x, y),
        (QuantType::Q4_0, Some(w)) => q4_0::quantize_row_impl(x, y, w),
        (QuantType::Q4_1, None) => q4_1::quantize_row_ref(x, y),
        (QuantType::Q4_1, Some(w)) => q4_1::quantize_row_impl(x, y, w),
        (QuantType::Q5_0, None) => q5_0::quantize_row_ref(x, y),
        (QuantType::Q5_0, Some(w)) => q5_0::quantize_row_impl(x, y, w),
        (QuantType::Q5_1, None) => q5_1::quantize_row_ref(x, y),
        (QuantType::Q5_1, Some(w)) => q5_1::quantize_row_impl(x, y, w),
        (QuantType::Iq4Nl, w) => iq4_nl::quantize_row(x, y, w),
        (QuantType::Iq4Xs, w) => iq4_xs::quantize_row(x, y, w),
        _ => unreachable!("not a legacy or IQ4 type"),
    }
}

/// Quantise rows in parallel (rayon), chunks of whole rows; identical bytes to
/// [`quantize_rows`].
pub fn quantize_rows_par(ty: QuantType, src: &[f32], n_per_row: usize, importance: Option<&[f32]>, dst: &mut [u8]) -> Result<(), CodecError> {
    quantize_rows_par_at(simd::level(), ty, src, n_per_row, importance, dst)
}

/// [`quantize_rows_par`] at a given SIMD level.
pub fn quantize_rows_par_at(
    level: simd::Level,
    ty: QuantType,
    src: &[f32],
    n_per_row: usize,
    importance: Option<&[f32]>,
    dst: &mut [u8],
) -> Result<(), CodecError> {
    use rayon::prelude::*;
    let g = ty.ggml();
    if n_per_row == 0 || !n_per_row.is_multiple_of(g.block_size as usize) {
        return quantize_rows_at(level, ty, src, n_per_row, importance, dst);
    }
    let row_bytes = n_per_row / g.block_size as usize * g.type_size as usize;
    const ROWS: usize = 16;
    if !src.len().is_multiple_of(n_per_row) || dst.len() != src.len() / n_per_row * row_bytes {
        return quantize_rows_at(level, ty, src, n_per_row, importance, dst); // reports the shape error
    }
    src.par_chunks(ROWS * n_per_row).zip(dst.par_chunks_mut(ROWS * row_bytes)).try_for_each(|(x, y)| quantize_rows_at(level, ty, x, n_per_row, importance, y))
}

/// Values per task in the `_par` helpers: large enough to amortise a task, small enough
/// to spread a chunk of a few MiB over the cores.
pub(crate) const PAR_VALUES: usize = 1 << 16;

/// Decode rows of a ggml type to f32 (`dequantize_row_<type>` of the reference), at the
/// process's SIMD level (every level gives the same values).
pub fn dequantize(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), CodecError> {
    dequantize_at(simd::level(), ty, src, dst)
}

/// [`dequantize`] on all cores (rayon, chunks of whole blocks); the same values.
pub fn dequantize_par(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), CodecError> {
    use rayon::prelude::*;
    let (bs, ts) = (ty.block_size as usize, ty.type_size as usize);
    if !src.len().is_multiple_of(ts) || dst.len() != src.len() / ts * bs {
        return dequantize(ty, src, dst); // reports the shape error
    }
    let level = simd::level();
    let blocks = (PAR_VALUES / bs).max(1);
    let r = src.par_chunks(blocks * ts).zip(dst.par_chunks_mut(blocks * bs)).try_for_each(|(s, d)| dequantize_at(level, ty, s, d));
    // On an error, the sequential pass reports the first bad block.
    r.or_else(|_| dequantize_at(level, ty, src, dst))
}

/// [`dequantize`] at a given SIMD level (lowered to what the CPU has).
pub fn dequantize_at(level: simd::Level, ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), CodecError> {
    let blocks = src.len() / ty.type_size as usize;
    if !src.len().is_multiple_of(ty.type_size as usize) || dst.len() != blocks * ty.block_size as usize {
        return Err(CodecError::Shape(format!("{} bytes of {} do not decode to {} values", src.len(), ty.name, dst.len())));
    }
    #[cfg(target_arch = "x86_64")]
    {
        use simd::decode as d;
        let done = match ty.name {
            // float.rs holds their dispatch (it falls back to the scalar code itself).
            "F16" => {
                float::f16_to_f32_at(level, src, dst);
                Some(Ok(()))
            }
            "BF16" => {
                float::bf16_to_f32_at(level, src, dst);
                Some(Ok(()))
            }
            "Q8_0" => d::dequantize_q8_0(level, src, dst).map(Ok),
            "Q2_K" => d::dequantize_q2_k(level, src, dst).map(Ok),
            "Q4_K" => d::dequantize_q4_k(level, src, dst).map(Ok),
            "Q6_K" => d::dequantize_q6_k(level, src, dst).map(Ok),
            "IQ2_XXS" => d::dequantize_iq2_xxs(level, src, dst).map(Ok),
            "MXFP4" => d::dequantize_mxfp4(level, src, dst),
            _ => None,
        };
        if let Some(r) = done {
            return r;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = level;
    dequantize_scalar(ty, src, dst)
}

/// The scalar reference decoders.
pub fn dequantize_scalar(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), CodecError> {
    let blocks = src.len() / ty.type_size as usize;
    if !src.len().is_multiple_of(ty.type_size as usize) || dst.len() != blocks * ty.block_size as usize {
        return Err(CodecError::Shape(format!("{} bytes of {} do not decode to {} values", src.len(), ty.name, dst.len())));
    }
    match ty.name {
        "F32" => float::f32_to_f32(src, dst),
        "F16" => float::f16_to_f32_scalar(src, dst),
        "BF16" => float::bf16_to_f32_scalar(src, dst),
        "Q8_0" => q8_0::dequantize(src, dst),
        "Q2_K" => q2_k::dequantize(src, dst),
        "Q3_K" => q3_k::dequantize(src, dst),
        "Q4_K" => q4_k::dequantize(src, dst),
        "Q5_K" => q5_k::dequantize(src, dst),
        "Q6_K" => q6_k::dequantize(src, dst),
        "IQ2_XXS" => iq2_xxs::dequantize(src, dst),
        "Q4_0" => q4_0::dequantize(src, dst),
        "Q4_1" => q4_1::dequantize(src, dst),
        "Q5_0" => q5_0::dequantize(src, dst),
        "Q5_1" => q5_1::dequantize(src, dst),
        "IQ4_NL" => iq4_nl::dequantize(src, dst),
        "IQ4_XS" => iq4_xs::dequantize(src, dst),
        "MXFP4" => mxfp4::dequantize_ggml_scalar(src, dst)?,
        other => return Err(CodecError::Shape(format!("decoding {other} is not supported"))),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_int_ties_to_even() {
        assert_eq!(nearest_int(0.5), 0);
        assert_eq!(nearest_int(1.5), 2);
        assert_eq!(nearest_int(2.5), 2);
        assert_eq!(nearest_int(-0.5), 0);
        assert_eq!(nearest_int(-1.5), -2);
        assert_eq!(nearest_int(3.49), 3);
        assert_eq!(nearest_int(-7.7), -8);
    }
}
