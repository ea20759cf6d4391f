//! MXFP4 in its two storage forms.
//!
//! * DeepSeek V4 safetensors: a row of K values is K/2 bytes (element 2b in the low nibble
//!   of byte b, 2b+1 in the high nibble) plus K/32 E8M0 scale bytes; value =
//!   E2M1(nibble) * 2^(s-127).
//! * ggml block (type 39, 17 bytes per 32 values): E8M0 byte e, then qs[16] with element j
//!   in the low nibble of qs[j] and element j+16 in the high nibble; value =
//!   kvalues[nibble] * 2^(e-128) (doubled integers times a half scale).
//!
//! Both are exact in f32. A scale byte of 255 is NaN in E8M0 and is an error here.

use super::CodecError;
use super::simd::{self, Level};

/// E2M1 values by nibble.
pub const E2M1: [f32; 16] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0];
/// ggml's `kvalues_mxfp4` (doubled E2M1).
pub const KVALUES: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// 2^(s-127) for an E8M0 byte s (exact; 2^-127 is a subnormal f32).
#[inline]
pub fn e8m0_to_f32(s: u8) -> Option<f32> {
    match s {
        255 => None,
        0 => Some(f32::from_bits(0x0040_0000)),
        s => Some(f32::from_bits((s as u32) << 23)),
    }
}

/// ggml's `GGML_E8M0_TO_FP32_HALF`: 2^(e-128).
#[inline]
pub fn e8m0_to_f32_half(e: u8) -> Option<f32> {
    match e {
        255 => None,
        0 | 1 => Some(f32::from_bits(0x0020_0000u32 << e)),
        e => Some(f32::from_bits((e as u32 - 1) << 23)),
    }
}

/// Decode DeepSeek-layout rows: `packed` holds rows of K/2 bytes, `scales` rows of K/32.
/// At the process's SIMD level (all levels give the same values and errors).
pub fn dequantize_deepseek(packed: &[u8], scales: &[u8], k: usize, dst: &mut [f32]) -> Result<(), CodecError> {
    dequantize_deepseek_at(simd::level(), packed, scales, k, dst)
}

/// [`dequantize_deepseek`] on all cores (rayon, chunks of whole rows); the same result.
pub fn dequantize_deepseek_par(packed: &[u8], scales: &[u8], k: usize, dst: &mut [f32]) -> Result<(), CodecError> {
    use rayon::prelude::*;
    check_deepseek(packed, scales, k, dst)?;
    let rows = (super::PAR_VALUES / k).max(1);
    let level = simd::level();
    let r = dst
        .par_chunks_mut(rows * k)
        .zip(packed.par_chunks(rows * k / 2))
        .zip(scales.par_chunks(rows * k / 32))
        .try_for_each(|((d, p), s)| dequantize_deepseek_at(level, p, s, k, d));
    // On an error, the sequential pass names the first bad scale, as the scalar code does.
    r.or_else(|_| dequantize_deepseek_at(level, packed, scales, k, dst))
}

fn check_deepseek(packed: &[u8], scales: &[u8], k: usize, dst: &[f32]) -> Result<(), CodecError> {
    if k == 0 || !k.is_multiple_of(32) {
        return Err(CodecError::Shape(format!("MXFP4 row length {k} is not a multiple of 32")));
    }
    let rows = dst.len() / k;
    if !dst.len().is_multiple_of(k) || packed.len() != rows * k / 2 || scales.len() != rows * k / 32 {
        return Err(CodecError::Shape(format!("MXFP4: {} packed bytes and {} scales do not hold {rows} rows of {k}", packed.len(), scales.len())));
    }
    Ok(())
}

pub fn dequantize_deepseek_at(level: Level, packed: &[u8], scales: &[u8], k: usize, dst: &mut [f32]) -> Result<(), CodecError> {
    check_deepseek(packed, scales, k, dst)?;
    #[cfg(target_arch = "x86_64")]
    if let Some(r) = simd::decode::dequantize_mxfp4_deepseek(level, packed, scales, dst) {
        return r;
    }
    let _ = level;
    dequantize_deepseek_scalar(packed, scales, k, dst)
}

/// The scalar reference.
pub fn dequantize_deepseek_scalar(packed: &[u8], scales: &[u8], k: usize, dst: &mut [f32]) -> Result<(), CodecError> {
    check_deepseek(packed, scales, k, dst)?;
    for (bi, ((out, q), &s)) in dst.chunks_exact_mut(32).zip(packed.chunks_exact(16)).zip(scales).enumerate() {
        let scale = e8m0_to_f32(s).ok_or(CodecError::E8m0Nan { index: bi })?;
        for (j, &b) in q.iter().enumerate() {
            out[2 * j] = E2M1[(b & 0xF) as usize] * scale;
            out[2 * j + 1] = E2M1[(b >> 4) as usize] * scale;
        }
    }
    Ok(())
}

/// Decode ggml MXFP4 blocks (`dequantize_row_mxfp4`) at the process's SIMD level.
pub fn dequantize_ggml(src: &[u8], dst: &mut [f32]) -> Result<(), CodecError> {
    dequantize_ggml_at(simd::level(), src, dst)
}

pub fn dequantize_ggml_at(level: Level, src: &[u8], dst: &mut [f32]) -> Result<(), CodecError> {
    #[cfg(target_arch = "x86_64")]
    if let Some(r) = simd::decode::dequantize_mxfp4(level, src, dst) {
        return r;
    }
    let _ = level;
    dequantize_ggml_scalar(src, dst)
}

/// The scalar reference.
pub fn dequantize_ggml_scalar(src: &[u8], dst: &mut [f32]) -> Result<(), CodecError> {
    for (bi, (b, out)) in src.chunks_exact(17).zip(dst.chunks_exact_mut(32)).enumerate() {
        let d = e8m0_to_f32_half(b[0]).ok_or(CodecError::E8m0Nan { index: bi })?;
        for j in 0..16 {
            out[j] = KVALUES[(b[1 + j] & 0xF) as usize] as f32 * d;
            out[j + 16] = KVALUES[(b[1 + j] >> 4) as usize] as f32 * d;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scales() {
        assert_eq!(e8m0_to_f32(127), Some(1.0));
        assert_eq!(e8m0_to_f32(0), Some(2f64.powi(-127) as f32));
        assert_eq!(e8m0_to_f32(254), Some(2f64.powi(127) as f32));
        assert_eq!(e8m0_to_f32(255), None);
        assert_eq!(e8m0_to_f32_half(128), Some(1.0));
        assert_eq!(e8m0_to_f32_half(0), Some(2f64.powi(-128) as f32));
        assert_eq!(e8m0_to_f32_half(1), Some(2f64.powi(-127) as f32));
    }

    #[test]
    fn both_layouts_agree() {
        // The same 32 values in both layouts: ggml's doubled ints with a half scale.
        let nibbles: Vec<u8> = (0..32).map(|i| (i * 7 % 16) as u8).collect();
        let s = 130u8;
        let packed: Vec<u8> = (0..16).map(|b| nibbles[2 * b] | nibbles[2 * b + 1] << 4).collect();
        let mut block = vec![s];
        block.extend((0..16).map(|j| nibbles[j] | nibbles[j + 16] << 4));
        let (mut a, mut b) = ([0f32; 32], [0f32; 32]);
        dequantize_deepseek(&packed, &[s], 32, &mut a).unwrap();
        dequantize_ggml(&block, &mut b).unwrap();
        assert_eq!(a, b);
        assert_eq!(dequantize_deepseek(&packed, &[255], 32, &mut a), Err(CodecError::E8m0Nan { index: 0 }));
        block[0] = 255;
        assert_eq!(dequantize_ggml(&block, &mut b), Err(CodecError::E8m0Nan { index: 0 }));
    }
}
