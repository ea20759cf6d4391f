//! Q5_0: blocks of 32 values as fp16 `d`, 32 high bits `qh` (u32, bit j for value j) and
//! 16 bytes of low nibbles (22 bytes; value = `d * (q - 16)`).
//!
//! Owns `quantize_q5_0` as ggml runs it: without importance `quantize_row_q5_0_ref` (the
//! signed absolute maximum maps to -16), with importance `quantize_row_q5_0_impl` per row
//! (Q4_0's [`make_qx_quants`] with `nmax = 16`); and `dequantize_row_q5_0`.

use super::q4_0::{block_weights, make_qx_quants, min_i8, row_sigma2};
use super::{f32_to_fp16, fp16_to_f32, read_u16};

pub const BLOCK: usize = 32;
pub const BYTES: usize = 22;

/// Levels 0..=31 (value j and j + 16 in step j) into `qh` and `qs`, as the reference packs
/// them: low nibbles pairwise, bit 4 of level j at bit j of `qh`.
#[inline(always)]
pub(crate) fn pack5(l: impl Fn(usize) -> u8, qh_qs: &mut [u8]) {
    let mut qh = 0u32;
    for j in 0..16 {
        let (xi0, xi1) = (l(j), l(j + 16));
        qh_qs[4 + j] = (xi0 & 0x0F) | ((xi1 & 0x0F) << 4);
        qh |= (((xi0 & 0x10) >> 4) as u32) << j;
        qh |= (((xi1 & 0x10) >> 4) as u32) << (j + 16);
    }
    qh_qs[..4].copy_from_slice(&qh.to_le_bytes());
}

/// `quantize_row_q5_0_ref` over whole blocks.
pub fn quantize_row_ref(x: &[f32], y: &mut [u8]) {
    for (xb, yb) in x.chunks_exact(BLOCK).zip(y.chunks_exact_mut(BYTES)) {
        let mut amax = 0.0f32;
        let mut max = 0.0f32;
        for &v in xb {
            if amax < v.abs() {
                amax = v.abs();
                max = v;
            }
        }
        let d = max / -16.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        yb[..2].copy_from_slice(&f32_to_fp16(d).to_le_bytes());
        pack5(|j| min_i8(31, xb[j] * id + 16.5), &mut yb[2..]);
    }
}

/// `quantize_row_q5_0_impl` for one row, `quant_weights` one per column.
pub fn quantize_row_impl(x: &[f32], y: &mut [u8], quant_weights: &[f32]) {
    let sigma2 = row_sigma2(x);
    for ((xb, yb), qw) in x.chunks_exact(BLOCK).zip(y.chunks_exact_mut(BYTES)).zip(quant_weights.chunks_exact(BLOCK)) {
        let weight = block_weights(xb, qw, sigma2);
        let mut l = [0i8; BLOCK];
        let d = make_qx_quants(16, xb.try_into().unwrap(), &mut l, &weight);
        yb[..2].copy_from_slice(&f32_to_fp16(d).to_le_bytes());
        pack5(|j| l[j] as u8, &mut yb[2..]);
    }
}

/// The 5-bit level of value j (0..32) of a Q5_0 / Q5_1 block's `qh` and `qs`.
#[inline(always)]
pub(crate) fn level5(qh: u32, qs: &[u8], j: usize) -> i32 {
    if j < 16 { ((qs[j] & 0x0F) | ((((qh >> j) << 4) & 0x10) as u8)) as i32 } else { ((qs[j - 16] >> 4) | (((qh >> (j - 16 + 12)) & 0x10) as u8)) as i32 }
}

/// `dequantize_row_q5_0`.
pub fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(BYTES).zip(dst.chunks_exact_mut(BLOCK)) {
        let d = fp16_to_f32(read_u16(b, 0));
        let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
        for (j, o) in y.iter_mut().enumerate() {
            *o = (level5(qh, &b[6..], j) - 16) as f32 * d;
        }
    }
}
