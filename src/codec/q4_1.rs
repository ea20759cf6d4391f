//! Q4_1: blocks of 32 values as fp16 `d`, fp16 `m` and 16 bytes of 4-bit levels (20 bytes;
//! low nibble value j, high nibble value j + 16; value = `d * q + m`).
//!
//! Owns `quantize_q4_1` as ggml runs it: without importance `quantize_row_q4_1_ref` (min and
//! max of the block, 15 steps between), with importance `quantize_row_q4_1_impl` per row
//! (`make_qkx3_quants` over 37 trial scales with `qw * sqrt(sigma2 + x^2)` weights, shared
//! with Q2_K as [`make_qkx_quants`]); and `dequantize_row_q4_1`.

use super::q2_k::make_qkx_quants;
use super::q4_0::{block_weights, min_i8, row_sigma2};
use super::{f32_to_fp16, fp16_to_f32, read_u16};

pub const BLOCK: usize = 32;
pub const BYTES: usize = 20;

/// The block's minimum and maximum as the reference's `v < min` / `v > max` scan finds
/// them (from `FLT_MAX` / `-FLT_MAX`; the first of equal values wins, so the sign of a zero
/// is the first zero's).
#[inline(always)]
pub(crate) fn min_max(xb: &[f32]) -> (f32, f32) {
    let mut min = f32::MAX;
    let mut max = -f32::MAX;
    for &v in xb {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    (min, max)
}

/// `quantize_row_q4_1_ref` over whole blocks.
pub fn quantize_row_ref(x: &[f32], y: &mut [u8]) {
    for (xb, yb) in x.chunks_exact(BLOCK).zip(y.chunks_exact_mut(BYTES)) {
        let (min, max) = min_max(xb);
        let d = (max - min) / 15.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        yb[..2].copy_from_slice(&f32_to_fp16(d).to_le_bytes());
        yb[2..4].copy_from_slice(&f32_to_fp16(min).to_le_bytes());
        for j in 0..16 {
            let xi0 = min_i8(15, (xb[j] - min) * id + 0.5);
            let xi1 = min_i8(15, (xb[j + 16] - min) * id + 0.5);
            yb[4 + j] = xi0 | (xi1 << 4);
        }
    }
}

/// `quantize_row_q4_1_impl` for one row, `quant_weights` one per column.
pub fn quantize_row_impl(x: &[f32], y: &mut [u8], quant_weights: &[f32]) {
    let sigma2 = row_sigma2(x);
    for ((xb, yb), qw) in x.chunks_exact(BLOCK).zip(y.chunks_exact_mut(BYTES)).zip(quant_weights.chunks_exact(BLOCK)) {
        let weight = block_weights(xb, qw, sigma2);
        let mut l = [0u8; BLOCK];
        let mut laux = [0u8; BLOCK];
        let mut min = 0.0f32;
        let d = make_qkx_quants(15, xb.try_into().unwrap(), &weight, &mut l, &mut min, &mut laux, -0.9, 0.05, 36, false);
        yb[..2].copy_from_slice(&f32_to_fp16(d).to_le_bytes());
        yb[2..4].copy_from_slice(&f32_to_fp16(-min).to_le_bytes());
        for j in 0..16 {
            yb[4 + j] = l[j] | (l[j + 16] << 4);
        }
    }
}

/// `dequantize_row_q4_1`.
pub fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(BYTES).zip(dst.chunks_exact_mut(BLOCK)) {
        let d = fp16_to_f32(read_u16(b, 0));
        let m = fp16_to_f32(read_u16(b, 2));
        for j in 0..16 {
            y[j] = (b[4 + j] & 0xF) as f32 * d + m;
            y[j + 16] = (b[4 + j] >> 4) as f32 * d + m;
        }
    }
}
