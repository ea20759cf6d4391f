//! Q2_K: 84-byte blocks of 256 values: scales[16] (low nibble scale, high nibble min),
//! qs[64] (2-bit quants), fp16 d at 80, fp16 dmin at 82.
//!
//! Two quantisers, as the reference has them: `quantize_row_q2_K_ref` (no importance;
//! `make_qkx2_quants` with |x| weights) and `quantize_row_q2_K_impl` (importance; the
//! `make_qkx3_quants` + `make_qp_quants` path). They give different bytes.

use super::{cmax, f32_to_fp16, fp16_to_f32, nearest_int, read_u16};

pub const QK_K: usize = 256;
pub const BYTES: usize = 84;
pub(crate) const GROUP_MAX_EPS: f32 = 1e-15;

/// `make_qkx2_quants` / `make_qkx3_quants` (identical when weights are given).
#[allow(clippy::too_many_arguments)]
pub(crate) fn make_qkx_quants<const N: usize>(
    nmax: i32,
    x: &[f32; N],
    weights: &[f32; N],
    l: &mut [u8; N],
    the_min: &mut f32,
    laux: &mut [u8; N],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
    use_mad: bool,
) -> f32 {
    let n = N;
    let mut min = x[0];
    let mut max = x[0];
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        let w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max <= min {
        l.fill(0);
        *the_min = -min;
        return 0.0;
    }
    let mut iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0.0f32;
    for i in 0..n {
        let li = nearest_int(iscale * (x[i] - min));
        l[i] = li.clamp(0, nmax) as u8;
        let mut diff = scale * l[i] as f32 + min - x[i];
        diff = if use_mad { diff.abs() } else { diff * diff };
        best_error += weights[i] * diff;
    }
    if nstep < 1 {
        *the_min = -min;
        return scale;
    }
    for is in 0..=nstep {
        iscale = (rmin + rdelta * is as f32 + nmax as f32) / (max - min);
        // Levels first (independent per element, vectorisable), then the sums in order.
        let mut lf = [0.0f32; N];
        for i in 0..n {
            let li = nearest_int(iscale * (x[i] - min)).max(0).min(nmax);
            laux[i] = li as u8;
            lf[i] = li as f32;
        }
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0.0f32, 0.0f32, 0.0f32);
        for i in 0..n {
            let wl = weights[i] * lf[i];
            sum_l += wl;
            sum_l2 += wl * lf[i];
            sum_xl += wl * x[i];
        }
        let d = sum_w * sum_l2 - sum_l * sum_l;
        if d > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / d;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / d;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut terms = [0.0f32; N];
            for i in 0..n {
                let diff = this_scale * lf[i] + this_min - x[i];
                terms[i] = weights[i] * if use_mad { diff.abs() } else { diff * diff };
            }
            let mut cur_error = 0.0f32;
            for t in terms {
                cur_error += t;
            }
            if cur_error < best_error {
                *l = *laux;
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    *the_min = -min;
    scale
}

/// `make_qp_quants`. `l` is a `uint8_t` array in the reference: negative levels wrap,
/// and the wrapped values are what the refinement loop reads back.
pub(crate) fn make_qp_quants<const N: usize>(nmax: i32, x: &[f32; N], l: &mut [u8; N], quant_weights: &[f32; N]) -> f32 {
    let n = N;
    let mut max = 0.0f32;
    for &v in x {
        max = cmax(max, v);
    }
    if max < GROUP_MAX_EPS {
        l.fill(0);
        return 0.0;
    }
    let mut iscale = nmax as f32 / max;
    for i in 0..n {
        l[i] = nearest_int(iscale * x[i]) as u8;
    }
    let scale = 1.0 / iscale;
    let mut best_mse = 0.0f32;
    for i in 0..n {
        let diff = x[i] - scale * l[i] as f32;
        best_mse += quant_weights[i] * diff * diff;
    }
    for is in -4i32..=4 {
        if is == 0 {
            continue;
        }
        let iscale_is = (0.1f32 * is as f32 + nmax as f32) / max;
        let scale_is = 1.0 / iscale_is;
        let mut mse = 0.0f32;
        for i in 0..n {
            let li = nearest_int(iscale_is * x[i]).min(nmax);
            let diff = x[i] - scale_is * li as f32;
            mse += quant_weights[i] * diff * diff;
        }
        if mse < best_mse {
            best_mse = mse;
            iscale = iscale_is;
        }
    }
    let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
    for i in 0..n {
        let li = nearest_int(iscale * x[i]).min(nmax);
        l[i] = li as u8;
        let w = quant_weights[i];
        sumlx += w * x[i] * li as f32;
        suml2 += w * li as f32 * li as f32;
    }
    for _ in 0..5 {
        let mut n_changed = 0;
        for i in 0..n {
            let w = quant_weights[i];
            let li = l[i] as f32;
            let mut slx = sumlx - w * x[i] * li;
            let mut sl2 = suml2 - w * li * li;
            if slx > 0.0 && sl2 > 0.0 {
                let new_l = nearest_int(x[i] * sl2 / slx).min(nmax);
                if new_l != l[i] as i32 {
                    slx += w * x[i] * new_l as f32;
                    sl2 += w * new_l as f32 * new_l as f32;
                    if slx * slx * suml2 > sumlx * sumlx * sl2 {
                        l[i] = new_l as u8;
                        sumlx = slx;
                        suml2 = sl2;
                        n_changed += 1;
                    }
                }
            }
        }
        if n_changed == 0 {
            break;
        }
    }
    if suml2 > 0.0 { sumlx / suml2 } else { 0.0 }
}

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
