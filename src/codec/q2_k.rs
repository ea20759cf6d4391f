//! Q2_K: 84-byte blocks of 256 values: scales[16] (low nibble scale, high nibble min),
//! qs[64] (2-bit quants), fp16 d at 80, fp16 dmin at 82.
//!
//! Two quantisers, as the reference has them: `quantize_row_q2_K_ref` (no importance;
//! `make_qkx2_quants` with |x| weights) and `quantize_row_q2_K_impl` (importance; the
//! `make_qkx3_quants` + `make_qp_quants` path). They give different bytes.

use super::{f32_to_fp16, fp16_to_f32, nearest_int, read_u16};

pub use super::kquants::QK_K;
pub const BYTES: usize = 84;
pub(crate) use super::kquants::{GROUP_MAX_EPS, make_qkx_quants, make_qp_quants};

fn pack_qs(l: &[u8; QK_K], qs: &mut [u8]) {
    for j in (0..QK_K).step_by(128) {
        for k in 0..32 {
            qs[j / 4 + k] = l[j + k] | (l[j + k + 32] << 2) | (l[j + k + 64] << 4) | (l[j + k + 96] << 6);
        }
    }
}

/// The reference path's block scales: 4-bit scales and mins of the 16 sub-blocks into
/// `y[..16]`, fp16 `d` and `dmin` into `y[80..84]`; returns `d` and `dmin` as read back.
pub(crate) fn ref_block_scales(scales: &[f32; 16], mins: &[f32; 16], y: &mut [u8]) -> (f32, f32) {
    const Q4SCALE: f32 = 15.0;
    let mut max_scale = 0.0f32;
    let mut max_min = 0.0f32;
    for j in 0..16 {
        if scales[j] > max_scale {
            max_scale = scales[j];
        }
        if mins[j] > max_min {
            max_min = mins[j];
        }
    }
    let (sc, rest) = y.split_at_mut(16);
    if max_scale > 0.0 {
        let iscale = Q4SCALE / max_scale;
        for j in 0..16 {
            sc[j] = nearest_int(iscale * scales[j]) as u8;
        }
        rest[64..66].copy_from_slice(&f32_to_fp16(max_scale / Q4SCALE).to_le_bytes());
    } else {
        sc.fill(0);
        rest[64..66].copy_from_slice(&f32_to_fp16(0.0).to_le_bytes());
    }
    if max_min > 0.0 {
        let iscale = Q4SCALE / max_min;
        for j in 0..16 {
            sc[j] |= (nearest_int(iscale * mins[j]) << 4) as u8;
        }
        rest[66..68].copy_from_slice(&f32_to_fp16(max_min / Q4SCALE).to_le_bytes());
    } else {
        rest[66..68].copy_from_slice(&f32_to_fp16(0.0).to_le_bytes());
    }
    (fp16_to_f32(read_u16(rest, 64)), fp16_to_f32(read_u16(rest, 66)))
}

/// The importance path's block scales (`make_qp_quants` of the scales and of the mins,
/// weighted by the sub-blocks' weight sums `sw`), written as [`ref_block_scales`] does.
pub(crate) fn impl_block_scales(scales: &[f32; 16], mins: &[f32; 16], sw: &[f32; 16], y: &mut [u8]) -> (f32, f32) {
    let mut ls = [0u8; 16];
    let mut lm = [0u8; 16];
    let dm = make_qp_quants(15, scales, &mut ls, sw);
    let mm = make_qp_quants(15, mins, &mut lm, sw);
    let (sc, rest) = y.split_at_mut(16);
    rest[64..66].copy_from_slice(&f32_to_fp16(dm).to_le_bytes());
    rest[66..68].copy_from_slice(&f32_to_fp16(mm).to_le_bytes());
    for j in 0..16 {
        sc[j] = ls[j] | (lm[j] << 4);
    }
    (fp16_to_f32(read_u16(rest, 64)), fp16_to_f32(read_u16(rest, 66)))
}

/// The final pass: levels from the block's scales (`if !d continue` keeps the first pass's).
fn requantise(x: &[f32], sc: &[u8], dd: f32, dmin: f32, l: &mut [u8; QK_K]) {
    for j in 0..16 {
        let d = dd * (sc[j] & 0xF) as f32;
        if d == 0.0 {
            continue;
        }
        let dm = dmin * (sc[j] >> 4) as f32;
        for ii in 0..16 {
            l[16 * j + ii] = nearest_int((x[16 * j + ii] + dm) / d).clamp(0, 3) as u8;
        }
    }
}

/// `quantize_row_q2_K_ref`.
pub fn quantize_row_ref(x: &[f32], y: &mut [u8]) {
    for (x, y) in x.chunks_exact(QK_K).zip(y.chunks_exact_mut(BYTES)) {
        let mut l = [0u8; QK_K];
        let mut laux = [0u8; 16];
        let mut weights = [0.0f32; 16];
        let mut mins = [0.0f32; 16];
        let mut scales = [0.0f32; 16];
        for j in 0..16 {
            for k in 0..16 {
                weights[k] = x[16 * j + k].abs();
            }
            let lj: &mut [u8; 16] = (&mut l[16 * j..16 * j + 16]).try_into().unwrap();
            scales[j] = make_qkx_quants(3, x[16 * j..16 * j + 16].try_into().unwrap(), &weights, lj, &mut mins[j], &mut laux, -0.5, 0.1, 15, true);
        }
        let (dd, dmin) = ref_block_scales(&scales, &mins, y);
        requantise(x, &y[..16], dd, dmin, &mut l);
        pack_qs(&l, &mut y[16..80]);
    }
}

/// `quantize_row_q2_K_impl` with `quant_weights` (one per column of the row).
pub fn quantize_row_impl(x: &[f32], y: &mut [u8], quant_weights: &[f32]) {
    for (i, (x, y)) in x.chunks_exact(QK_K).zip(y.chunks_exact_mut(BYTES)).enumerate() {
        let mut l = [0u8; QK_K];
        let mut laux = [0u8; 16];
        let mut mins = [0.0f32; 16];
        let mut scales = [0.0f32; 16];
        let mut sw = [0.0f32; 16];
        let mut weight = [0.0f32; 16];
        let mut sumx2 = 0.0f32;
        for &v in x {
            sumx2 += v * v;
        }
        let sigma2 = sumx2 / QK_K as f32;
        for j in 0..16 {
            let qw: &[f32; 16] = quant_weights[QK_K * i + 16 * j..QK_K * i + 16 * j + 16].try_into().unwrap();
            for k in 0..16 {
                weight[k] = qw[k] * (sigma2 + x[16 * j + k] * x[16 * j + k]).sqrt();
            }
            for &w in &weight {
                sw[j] += w;
            }
            let lj: &mut [u8; 16] = (&mut l[16 * j..16 * j + 16]).try_into().unwrap();
            scales[j] = make_qkx_quants(3, x[16 * j..16 * j + 16].try_into().unwrap(), &weight, lj, &mut mins[j], &mut laux, -0.9, 0.05, 36, false);
        }
        let (dm, mm) = impl_block_scales(&scales, &mins, &sw, y);
        requantise(x, &y[..16], dm, mm, &mut l);
        pack_qs(&l, &mut y[16..80]);
    }
}

/// `dequantize_row_q2_K`.
pub fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(BYTES).zip(dst.chunks_exact_mut(QK_K)) {
        let d = fp16_to_f32(read_u16(b, 80));
        let min = fp16_to_f32(read_u16(b, 82));
        let mut out = y.iter_mut();
        let mut is = 0;
        for n in 0..2 {
            let q = &b[16 + 32 * n..];
            for shift in [0, 2, 4, 6] {
                for half in 0..2 {
                    let sc = b[is];
                    is += 1;
                    let dl = d * (sc & 0xF) as f32;
                    let ml = min * (sc >> 4) as f32;
                    for k in 0..16 {
                        *out.next().unwrap() = dl * ((q[k + 16 * half] >> shift) & 3) as f32 - ml;
                    }
                }
            }
        }
    }
}
