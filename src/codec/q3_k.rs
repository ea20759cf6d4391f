//! Q3_K: 110-byte blocks of 256 values: hmask[32] (the high bit of value j at bit j / 32
//! of hmask[j % 32]), qs[64] (low two bits, packed as Q2_K's), 12 bytes of 6-bit signed
//! scales (one per 16-value sub-block, offset 32), fp16 d.
//!
//! Owns the Q3_K quantisers and decoder, reproducing `quantize_q3_K` (no importance:
//! `quantize_row_q3_K_ref`, `make_q3_quants` with its refinement per sub-block;
//! importance: `quantize_row_q3_K_impl` per row, `make_qx_quants` per sub-block and over
//! the sixteen scales) and `dequantize_row_q3_K`. The searches are in [`super::kquants`].

use super::kquants::{QK_K, make_q3_quants, make_qx_quants};
use super::{f32_to_fp16, fp16_to_f32, nearest_int, read_u16};

pub const BYTES: usize = 110;

/// Level `l` (0..64) of sub-block `j` into the 12 scale bytes (zeroed first).
#[inline(always)]
pub(crate) fn put_scale(sc: &mut [u8], j: usize, l: u8) {
    if j < 8 {
        sc[j] = l & 0xF;
    } else {
        sc[j - 8] |= (l & 0xF) << 4;
    }
    sc[j % 4 + 8] |= (l >> 4) << (2 * (j / 4));
}

/// The signed scale (-32..32) of sub-block `j`.
#[inline(always)]
pub(crate) fn get_scale(sc: &[u8], j: usize) -> i8 {
    let lo = if j < 8 { sc[j] & 0xF } else { sc[j - 8] >> 4 };
    (lo | (((sc[8 + j % 4] >> (2 * (j / 4))) & 3) << 4)) as i8 - 32
}

/// The requantisation with the block's scales and the packing (hmask, qs); `l` holds
/// the search's levels (0..8), kept where a sub-block's scale is 0.
pub(crate) fn finish(x: &[f32], l: &mut [i8; QK_K], y: &mut [u8]) {
    let dd = fp16_to_f32(read_u16(y, 108));
    for j in 0..16 {
        let d = dd * get_scale(&y[96..108], j) as f32;
        if d == 0.0 {
            continue;
        }
        for ii in 0..16 {
            l[16 * j + ii] = (nearest_int(x[16 * j + ii] / d).clamp(-4, 3) + 4) as i8;
        }
    }
    pack(l, y);
}

pub(crate) fn pack(l: &mut [i8; QK_K], y: &mut [u8]) {
    let (hmask, qs) = y.split_at_mut(32);
    hmask.fill(0);
    for (j, v) in l.iter_mut().enumerate() {
        if *v > 3 {
            hmask[j % 32] |= 1 << (j / 32);
            *v -= 4;
        }
    }
    for j in (0..QK_K).step_by(128) {
        for k in 0..32 {
            let q = |o: usize| l[j + k + o] as u8;
            qs[j / 4 + k] = q(0) | (q(32) << 2) | (q(64) << 4) | (q(96) << 6);
        }
    }
}

/// The reference path's scales: 6-bit levels of `scales` relative to the largest in
/// magnitude, into `y[96..110]`.
pub(crate) fn ref_scales(scales: &[f32; 16], y: &mut [u8]) {
    let mut max_scale = 0.0f32;
    let mut amax = 0.0f32;
    for &s in scales {
        let a = s.abs();
        if a > amax {
            amax = a;
            max_scale = s;
        }
    }
    let sc = &mut y[96..108];
    sc.fill(0);
    let d = if max_scale != 0.0 {
        let iscale = -32.0f32 / max_scale;
        for (j, &v) in scales.iter().enumerate() {
            let l = (nearest_int(iscale * v) as i8).clamp(-32, 31) + 32;
            put_scale(sc, j, l as u8);
        }
        f32_to_fp16(1.0 / iscale)
    } else {
        f32_to_fp16(0.0)
    };
    y[108..110].copy_from_slice(&d.to_le_bytes());
}

/// The importance path's scales: `make_qx_quants(16, 32, scales, Ls, 1, sw)`.
pub(crate) fn impl_scales(scales: &[f32; 16], sw: &[f32; 16], y: &mut [u8]) {
    let mut ls = [0i8; 16];
    let d_block = make_qx_quants(32, scales, &mut ls, sw);
    let sc = &mut y[96..108];
    sc.fill(0);
    for (j, &l) in ls.iter().enumerate() {
        put_scale(sc, j, l as u8);
    }
    y[108..110].copy_from_slice(&f32_to_fp16(d_block).to_le_bytes());
}

/// `quantize_row_q3_K_ref` over whole blocks.
pub fn quantize_row_ref(x: &[f32], y: &mut [u8]) {
    for (x, y) in x.chunks_exact(QK_K).zip(y.chunks_exact_mut(BYTES)) {
        let mut l = [0i8; QK_K];
        let mut scales = [0.0f32; 16];
        for j in 0..16 {
            let lj: &mut [i8; 16] = (&mut l[16 * j..16 * j + 16]).try_into().unwrap();
            scales[j] = make_q3_quants(4, x[16 * j..16 * j + 16].try_into().unwrap(), lj);
        }
        ref_scales(&scales, y);
        finish(x, &mut l, y);
    }
}

/// `quantize_row_q3_K_impl` with `quant_weights` (one per column of the row).
pub fn quantize_row_impl(x: &[f32], y: &mut [u8], quant_weights: &[f32]) {
    for (i, (x, y)) in x.chunks_exact(QK_K).zip(y.chunks_exact_mut(BYTES)).enumerate() {
        let mut l = [0i8; QK_K];
        let mut scales = [0.0f32; 16];
        let mut sw = [0.0f32; 16];
        let mut sumx2 = 0.0f32;
        for &v in x {
            sumx2 += v * v;
        }
        let sigma2 = 2.0 * sumx2 / QK_K as f32;
        for j in 0..16 {
            let xs: &[f32; 16] = x[16 * j..16 * j + 16].try_into().unwrap();
            let qw = &quant_weights[QK_K * i + 16 * j..QK_K * i + 16 * j + 16];
            let weight: [f32; 16] = std::array::from_fn(|k| qw[k] * (sigma2 + xs[k] * xs[k]).sqrt());
            let mut sumw = 0.0f32;
            for &w in &weight {
                sumw += w;
            }
            sw[j] = sumw;
            let lj: &mut [i8; 16] = (&mut l[16 * j..16 * j + 16]).try_into().unwrap();
            scales[j] = make_qx_quants(4, xs, lj, &weight);
        }
        impl_scales(&scales, &sw, y);
        finish(x, &mut l, y);
    }
}

/// `dequantize_row_q3_K`.
pub fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(BYTES).zip(dst.chunks_exact_mut(QK_K)) {
        let d_all = fp16_to_f32(read_u16(b, 108));
        let (hm, sc) = (&b[..32], &b[96..108]);
        for j in 0..QK_K {
            // Value j: sub-block j / 16, bits (j % 128) / 32 * 2 of qs[j / 128 * 32 + j % 32].
            let q = (b[32 + j / 128 * 32 + j % 32] >> (2 * ((j % 128) / 32))) & 3;
            let high = hm[j % 32] & (1 << (j / 32)) != 0;
            let dl = d_all * (get_scale(sc, j / 16) as i32) as f32;
            y[j] = dl * (q as i8 - if high { 0 } else { 4 }) as f32;
        }
    }
}
