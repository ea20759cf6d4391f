//! Q5_K: 176-byte blocks of 256 values: fp16 d, fp16 dmin, 12 bytes of 6-bit scales and
//! mins (as Q4_K), qh[32] (the fifth bit: bit 2g of qh[k] for value 64g + k, bit 2g + 1
//! for value 64g + 32 + k), qs[128] (low nibbles, packed as Q4_K's).
//!
//! Owns the Q5_K quantisers and decoder, reproducing `quantize_q5_K` (no importance:
//! `quantize_row_q5_K_ref`, `make_qkx2_quants` with weights `av_x + |x|`; importance:
//! `quantize_row_q5_K_impl` per row, `make_qkx3_quants` then `make_qp_quants` of the
//! scales and mins, clamped to 63) and `dequantize_row_q5_K`. The shared searches are in
//! [`super::kquants`].

use super::kquants::{QK_K, get_scale_min_k4, scale_min_impl_scales, scale_min_impl_search, scale_min_ref_scales, scale_min_ref_search, scale_min_requantise};
use super::{fp16_to_f32, read_u16};

pub const BYTES: usize = 176;

/// qh and qs of a block from its 256 levels (`y` is the block's 160 bytes after the scales).
pub(crate) fn pack(l: &[u8; QK_K], y: &mut [u8]) {
    let (qh, ql) = y.split_at_mut(32);
    qh.fill(0);
    for g in 0..4 {
        let (m1, m2) = (1u8 << (2 * g), 2u8 << (2 * g));
        for j in 0..32 {
            let mut l1 = l[64 * g + j];
            if l1 > 15 {
                l1 -= 16;
                qh[j] |= m1;
            }
            let mut l2 = l[64 * g + j + 32];
            if l2 > 15 {
                l2 -= 16;
                qh[j] |= m2;
            }
            ql[32 * g + j] = l1 | (l2 << 4);
        }
    }
}

/// `quantize_row_q5_K_ref` over whole blocks.
pub fn quantize_row_ref(x: &[f32], y: &mut [u8]) {
    for (x, y) in x.chunks_exact(QK_K).zip(y.chunks_exact_mut(BYTES)) {
        let mut l = [0u8; QK_K];
        let mut scales = [0.0f32; 8];
        let mut mins = [0.0f32; 8];
        scale_min_ref_search(x, 31, -0.5, 0.1, 15, &mut l, &mut scales, &mut mins);
        finish(x, &mut l, y, |sc| scale_min_ref_scales(&scales, &mins, sc));
    }
}

/// `quantize_row_q5_K_impl` with `quant_weights` (one per column of the row).
pub fn quantize_row_impl(x: &[f32], y: &mut [u8], quant_weights: &[f32]) {
    for (i, (x, y)) in x.chunks_exact(QK_K).zip(y.chunks_exact_mut(BYTES)).enumerate() {
        let mut l = [0u8; QK_K];
        let mut scales = [0.0f32; 8];
        let mut mins = [0.0f32; 8];
        let mut sw = [0.0f32; 8];
        scale_min_impl_search(x, &quant_weights[QK_K * i..QK_K * (i + 1)], 31, &mut l, &mut scales, &mut mins, &mut sw);
        finish(x, &mut l, y, |sc| scale_min_impl_scales(&scales, &mins, &sw, true, sc));
    }
}

/// As `q4_k::finish`, for Q5_K's layout.
pub(crate) fn finish(x: &[f32], l: &mut [u8; QK_K], y: &mut [u8], scales: impl FnOnce(&mut [u8]) -> (u16, u16)) {
    let (d, dmin) = scales(&mut y[4..16]);
    y[0..2].copy_from_slice(&d.to_le_bytes());
    y[2..4].copy_from_slice(&dmin.to_le_bytes());
    scale_min_requantise(x, &y[4..16], d, dmin, 31, l);
    pack(l, &mut y[16..BYTES]);
}

/// `dequantize_row_q5_K`.
pub fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(BYTES).zip(dst.chunks_exact_mut(QK_K)) {
        let d = fp16_to_f32(read_u16(b, 0));
        let min = fp16_to_f32(read_u16(b, 2));
        let scales = &b[4..16];
        let qh = &b[16..48];
        for g in 0..4 {
            let ql = &b[48 + 32 * g..80 + 32 * g];
            let (s1, m1) = get_scale_min_k4(2 * g, scales);
            let (d1, m1) = (d * s1 as f32, min * m1 as f32);
            let (s2, m2) = get_scale_min_k4(2 * g + 1, scales);
            let (d2, m2) = (d * s2 as f32, min * m2 as f32);
            let (u1, u2) = (1u8 << (2 * g), 2u8 << (2 * g));
            for l in 0..32 {
                y[64 * g + l] = d1 * ((ql[l] & 0xF) as i32 + if qh[l] & u1 != 0 { 16 } else { 0 }) as f32 - m1;
            }
            for l in 0..32 {
                y[64 * g + 32 + l] = d2 * ((ql[l] >> 4) as i32 + if qh[l] & u2 != 0 { 16 } else { 0 }) as f32 - m2;
            }
        }
    }
}
