//! Q5_1: blocks of 32 values as fp16 `d`, fp16 `m`, 32 high bits `qh` and 16 bytes of low
//! nibbles (24 bytes; value = `d * q + m`).
//!
//! Owns `quantize_q5_1` as ggml runs it: without importance `quantize_row_q5_1_ref` (min and
//! max of the block, 31 steps between), with importance `quantize_row_q5_1_impl` per row
//! (`make_qkx3_quants` with `nmax = 31`, as Q4_1); and `dequantize_row_q5_1`.

use super::q2_k::make_qkx_quants;
use super::q4_0::{block_weights, cvtt_i32, row_sigma2};
use super::q4_1::min_max;
use super::q5_0::{level5, pack5};
use super::{f32_to_fp16, fp16_to_f32, read_u16};

pub const BLOCK: usize = 32;
pub const BYTES: usize = 24;

/// `quantize_row_q5_1_ref` over whole blocks.
pub fn quantize_row_ref(x: &[f32], y: &mut [u8]) {
    for (xb, yb) in x.chunks_exact(BLOCK).zip(y.chunks_exact_mut(BYTES)) {
        let (min, max) = min_max(xb);
        let d = (max - min) / 31.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        yb[..2].copy_from_slice(&f32_to_fp16(d).to_le_bytes());
        yb[2..4].copy_from_slice(&f32_to_fp16(min).to_le_bytes());
        // `(uint8_t)(x0 + 0.5f)`: no clamp in the reference, the low byte of `cvttss2si`.
        pack5(|j| cvtt_i32((xb[j] - min) * id + 0.5) as u8, &mut yb[4..]);
    }
}

/// `quantize_row_q5_1_impl` for one row, `quant_weights` one per column.
pub fn quantize_row_impl(x: &[f32], y: &mut [u8], quant_weights: &[f32]) {
    let sigma2 = row_sigma2(x);
    for ((xb, yb), qw) in x.chunks_exact(BLOCK).zip(y.chunks_exact_mut(BYTES)).zip(quant_weights.chunks_exact(BLOCK)) {
        let weight = block_weights(xb, qw, sigma2);
        let mut l = [0u8; BLOCK];
        let mut laux = [0u8; BLOCK];
        let mut min = 0.0f32;
        let d = make_qkx_quants(31, xb.try_into().unwrap(), &weight, &mut l, &mut min, &mut laux, -0.9, 0.05, 36, false);
        yb[..2].copy_from_slice(&f32_to_fp16(d).to_le_bytes());
        yb[2..4].copy_from_slice(&f32_to_fp16(-min).to_le_bytes());
        pack5(|j| l[j], &mut yb[4..]);
    }
}

/// `dequantize_row_q5_1`.
pub fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(BYTES).zip(dst.chunks_exact_mut(BLOCK)) {
        let d = fp16_to_f32(read_u16(b, 0));
        let m = fp16_to_f32(read_u16(b, 2));
        let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
        for (j, o) in y.iter_mut().enumerate() {
            *o = level5(qh, &b[8..], j) as f32 * d + m;
        }
    }
}
