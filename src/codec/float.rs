//! Plain floating-point formats: F32, F16, BF16 decode, and F32 -> BF16 rounding.

use super::fp16_to_f32;
use super::simd::{self, Level};

pub fn f32_to_f32(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(4).zip(dst) {
        *y = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    }
}

/// F16 -> f32 at the process's SIMD level (all levels give the same values).
pub fn f16_to_f32(src: &[u8], dst: &mut [f32]) {
    f16_to_f32_at(simd::level(), src, dst)
}

pub fn f16_to_f32_at(level: Level, src: &[u8], dst: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if simd::decode::f16_to_f32(level, src, dst).is_some() {
        return;
    }
    let _ = level;
    f16_to_f32_scalar(src, dst)
}

/// The scalar reference.
pub fn f16_to_f32_scalar(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(2).zip(dst) {
        *y = fp16_to_f32(u16::from_le_bytes([b[0], b[1]]));
    }
}

/// BF16 -> f32 at the process's SIMD level.
pub fn bf16_to_f32(src: &[u8], dst: &mut [f32]) {
    bf16_to_f32_at(simd::level(), src, dst)
}

pub fn bf16_to_f32_at(level: Level, src: &[u8], dst: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if simd::decode::bf16_to_f32(level, src, dst).is_some() {
        return;
    }
    let _ = level;
    bf16_to_f32_scalar(src, dst)
}

/// The scalar reference.
pub fn bf16_to_f32_scalar(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(2).zip(dst) {
        *y = f32::from_bits((u16::from_le_bytes([b[0], b[1]]) as u32) << 16);
    }
}

/// f32 -> bf16 bits, round to nearest even (what torch's `.to(torch.bfloat16)` does).
/// NaN stays NaN (quiet); overflow rounds to infinity, as IEEE rounding does.
#[inline]
pub fn f32_to_bf16(f: f32) -> u16 {
    let bits = f.to_bits();
    if f.is_nan() {
        return ((bits >> 16) | 0x0040) as u16;
    }
    let rounding = 0x7FFF + ((bits >> 16) & 1);
    (bits.wrapping_add(rounding) >> 16) as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounding() {
        assert_eq!(f32_to_bf16(1.0), 0x3F80);
        // 1 + 2^-8 is exactly half way between two bf16 values: ties to even (down).
        assert_eq!(f32_to_bf16(f32::from_bits(0x3F80_8000)), 0x3F80);
        assert_eq!(f32_to_bf16(f32::from_bits(0x3F81_8000)), 0x3F82);
        assert_eq!(f32_to_bf16(f32::from_bits(0x3F80_8001)), 0x3F81);
        assert_eq!(f32_to_bf16(f32::MAX), 0x7F80, "overflow rounds to infinity");
        assert_eq!(f32_to_bf16(-0.0), 0x8000);
    }
}
