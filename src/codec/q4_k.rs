//! Q4_K: 144-byte blocks of 256 values: fp16 d, fp16 dmin, 12 bytes of 6-bit scales and
//! mins (eight 32-value sub-blocks, `get_scale_min_k4`), 128 bytes of nibbles.
//!
//! Owns the Q4_K quantisers and decoder, reproducing `quantize_q4_K` (no importance:
//! `quantize_row_q4_K_ref`, `make_qkx2_quants` with weights `av_x + |x|`; importance:
//! `quantize_row_q4_K_impl` per row, `make_qkx3_quants` then `make_qp_quants` of the
//! scales and mins) and `dequantize_row_q4_K`. The shared searches are in
//! [`super::kquants`]; the SIMD versions in `simd/q4_k.rs`.

use super::kquants::{QK_K, get_scale_min_k4, scale_min_impl_scales, scale_min_impl_search, scale_min_ref_scales, scale_min_ref_search, scale_min_requantise};
use super::{fp16_to_f32, read_u16};

pub const BYTES: usize = 144;

/// The nibbles of a block from its 256 levels (`y` is the block's 128 bytes of `qs`).
pub(crate) fn pack(l: &[u8; QK_K], qs: &mut [u8]) {
    for g in 0..4 {
        for k in 0..32 {
            qs[32 * g + k] = l[64 * g + k] | (l[64 * g + k + 32] << 4);
        }
    }
}

/// `quantize_row_q4_K_ref` over whole blocks.
pub fn quantize_row_ref(x: &[f32], y: &mut [u8]) {
    for (x, y) in x.chunks_exact(QK_K).zip(y.chunks_exact_mut(BYTES)) {
        let mut l = [0u8; QK_K];
        let mut scales = [0.0f32; 8];
        let mut mins = [0.0f32; 8];
        scale_min_ref_search(x, 15, -1.0, 0.1, 20, &mut l, &mut scales, &mut mins);
        finish(x, &mut l, y, |sc| scale_min_ref_scales(&scales, &mins, sc));
    }
}

/// `quantize_row_q4_K_impl` with `quant_weights` (one per column of the row).
pub fn quantize_row_impl(x: &[f32], y: &mut [u8], quant_weights: &[f32]) {
    for (i, (x, y)) in x.chunks_exact(QK_K).zip(y.chunks_exact_mut(BYTES)).enumerate() {
        let mut l = [0u8; QK_K];
        let mut scales = [0.0f32; 8];
        let mut mins = [0.0f32; 8];
        let mut sw = [0.0f32; 8];
        scale_min_impl_search(x, &quant_weights[QK_K * i..QK_K * (i + 1)], 15, &mut l, &mut scales, &mut mins, &mut sw);
        finish(x, &mut l, y, |sc| scale_min_impl_scales(&scales, &mins, &sw, false, sc));
    }
}

/// Scales (by `scales`, which fills the 12 scale bytes and returns fp16 d and dmin), the
/// requantisation and the packing of one block.
pub(crate) fn finish(x: &[f32], l: &mut [u8; QK_K], y: &mut [u8], scales: impl FnOnce(&mut [u8]) -> (u16, u16)) {
    let (d, dmin) = scales(&mut y[4..16]);
    y[0..2].copy_from_slice(&d.to_le_bytes());
    y[2..4].copy_from_slice(&dmin.to_le_bytes());
    scale_min_requantise(x, &y[4..16], d, dmin, 15, l);
    pack(l, &mut y[16..BYTES]);
}

/// `dequantize_row_q4_K`.
pub fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(BYTES).zip(dst.chunks_exact_mut(256)) {
        let d = fp16_to_f32(read_u16(b, 0));
        let min = fp16_to_f32(read_u16(b, 2));
        let scales = &b[4..16];
        let mut q = &b[16..];
        let mut out = y.iter_mut();
        for is in (0..8).step_by(2) {
            let (sc, m) = get_scale_min_k4(is, scales);
            let (d1, m1) = (d * sc as f32, min * m as f32);
            let (sc, m) = get_scale_min_k4(is + 1, scales);
            let (d2, m2) = (d * sc as f32, min * m as f32);
            for &v in &q[..32] {
                *out.next().unwrap() = d1 * (v & 0xF) as f32 - m1;
            }
            for &v in &q[..32] {
                *out.next().unwrap() = d2 * (v >> 4) as f32 - m2;
            }
            q = &q[32..];
        }
    }
}
