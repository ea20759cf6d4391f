//! Q6_K: 210-byte blocks of 256 values: ql[128] (low nibbles), qh[64] (high two bits),
//! int8 scales[16] (one per 16-value sub-block), fp16 d.
//!
//! Owns the Q6_K quantisers and decoder, reproducing `quantize_q6_K` (no importance:
//! `quantize_row_q6_K_ref`; importance: `quantize_row_q6_K_impl` per row; both are
//! `make_qx_quants(16, 32, ..., rmse_type 1)` per sub-block, weighted by `x * x` or by the
//! importance itself, then an int8 scale per sub-block) and `dequantize_row_q6_K`. The
//! search is [`super::kquants::make_qx_quants`]; the SIMD versions are in `simd/q6_k.rs`.

use super::kquants::{GROUP_MAX_EPS, QK_K, make_qx_quants};
use super::{f32_to_fp16, fp16_to_f32, nearest_int, read_u16};

pub const BYTES: usize = 210;

/// One block from the sixteen sub-block scales and the search's levels `l` (0..64): the
/// int8 scales, the requantisation and the packing (`quantize_row_q6_K_*` after the search).
pub(crate) fn finish(x: &[f32], scales: &[f32; 16], l: &mut [i8; QK_K], y: &mut [u8]) {
    let mut max_scale = 0.0f32;
    let mut max_abs_scale = 0.0f32;
    for &s in scales {
        let a = s.abs();
        if a > max_abs_scale {
            max_abs_scale = a;
            max_scale = s;
        }
    }
    if max_abs_scale < GROUP_MAX_EPS {
        y[..BYTES].fill(0);
        y[208..210].copy_from_slice(&f32_to_fp16(0.0).to_le_bytes());
        return;
    }
    let iscale = -128.0f32 / max_scale;
    let d_bits = f32_to_fp16(1.0 / iscale);
    y[208..210].copy_from_slice(&d_bits.to_le_bytes());
    for ib in 0..16 {
        y[192 + ib] = nearest_int(iscale * scales[ib]).min(127) as i8 as u8;
    }
    let dd = fp16_to_f32(d_bits);
    for j in 0..16 {
        let d = dd * y[192 + j] as i8 as f32;
        if d == 0.0 {
            continue;
        }
        for ii in 0..16 {
            l[16 * j + ii] = (nearest_int(x[16 * j + ii] / d).clamp(-32, 31) + 32) as i8;
        }
    }
    pack(l, y);
}

/// ql and qh from the 256 levels (0..64).
pub(crate) fn pack(l: &[i8; QK_K], y: &mut [u8]) {
    for h in 0..2 {
        let (j, ql, qh) = (128 * h, 64 * h, 128 + 32 * h);
        for k in 0..32 {
            let q = |o: usize| l[j + k + o] as u8;
            y[ql + k] = (q(0) & 0xF) | ((q(64) & 0xF) << 4);
            y[ql + k + 32] = (q(32) & 0xF) | ((q(96) & 0xF) << 4);
            y[qh + k] = (q(0) >> 4) | ((q(32) >> 4) << 2) | ((q(64) >> 4) << 4) | ((q(96) >> 4) << 6);
        }
    }
}

fn quantize_block(x: &[f32], qw: Option<&[f32]>, y: &mut [u8]) {
    let mut l = [0i8; QK_K];
    let mut scales = [0.0f32; 16];
    for ib in 0..16 {
        let xs: &[f32; 16] = x[16 * ib..16 * ib + 16].try_into().unwrap();
        let w: [f32; 16] = match qw {
            Some(q) => q[16 * ib..16 * ib + 16].try_into().unwrap(),
            None => std::array::from_fn(|i| xs[i] * xs[i]),
        };
        let lj: &mut [i8; 16] = (&mut l[16 * ib..16 * ib + 16]).try_into().unwrap();
        scales[ib] = make_qx_quants(32, xs, lj, &w);
    }
    finish(x, &scales, &mut l, y);
}

/// `quantize_row_q6_K_ref` over whole blocks.
pub fn quantize_row_ref(x: &[f32], y: &mut [u8]) {
    for (x, y) in x.chunks_exact(QK_K).zip(y.chunks_exact_mut(BYTES)) {
        quantize_block(x, None, y);
    }
}

/// `quantize_row_q6_K_impl` with `quant_weights` (one per column of the row).
pub fn quantize_row_impl(x: &[f32], y: &mut [u8], quant_weights: &[f32]) {
    for (i, (x, y)) in x.chunks_exact(QK_K).zip(y.chunks_exact_mut(BYTES)).enumerate() {
        quantize_block(x, Some(&quant_weights[QK_K * i..QK_K * (i + 1)]), y);
    }
}

/// `dequantize_row_q6_K`.
pub fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(BYTES).zip(dst.chunks_exact_mut(256)) {
        let d = fp16_to_f32(read_u16(b, 208));
        for n in 0..2 {
            let ql = &b[64 * n..];
            let qh = &b[128 + 32 * n..];
            let sc = &b[192 + 8 * n..];
            let y = &mut y[128 * n..];
            for l in 0..32 {
                let is = l / 16;
                let q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i8 as i32 - 32;
                let q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i8 as i32 - 32;
                let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i8 as i32 - 32;
                let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i8 as i32 - 32;
                y[l] = d * sc[is] as i8 as f32 * q1 as f32;
                y[l + 32] = d * sc[is + 2] as i8 as f32 * q2 as f32;
                y[l + 64] = d * sc[is + 4] as i8 as f32 * q3 as f32;
                y[l + 96] = d * sc[is + 6] as i8 as f32 * q4 as f32;
            }
        }
    }
}
