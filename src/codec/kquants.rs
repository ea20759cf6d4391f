//! The search helpers the K-quant quantisers share (`ggml-quants.c`'s "2-6 bit
//! quantization in super-blocks" helpers), scalar: `make_qkx2_quants` / `make_qkx3_quants`
//! (Q2_K, Q4_K, Q5_K), `make_qp_quants` (Q2_K, Q4_K, Q5_K and IQ2_XXS importance paths),
//! `make_qx_quants` (Q3_K importance path, Q6_K), `make_q3_quants` (Q3_K reference path),
//! and the 6-bit scale/min packing of Q4_K and Q5_K (`get_scale_min_k4` and its inverse).
//! Each is the C function with its arithmetic in C's order (see the module docs of
//! [`crate::codec`]).

use super::{cmax, f32_to_fp16, fp16_to_f32, nearest_int};

pub const QK_K: usize = 256;
pub(crate) const GROUP_MAX_EPS: f32 = 1e-15;

/// `make_qkx2_quants` / `make_qkx3_quants` (identical when weights are given: the flat test
/// `max == min` of the first and `max <= min` of the second agree since `min <= max`).
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

/// `make_qx_quants(N, nmax, x, L, 1, w)` (`rmse_type` 1, the only one the K-quants use;
/// callers without importance pass `w[i] = x[i] * x[i]`, which is what the reference
/// computes then). Levels `0..2 * nmax` in `l`.
pub(crate) fn make_qx_quants<const N: usize>(nmax: i32, x: &[f32; N], l: &mut [i8; N], w: &[f32; N]) -> f32 {
    let mut max = 0.0f32;
    let mut amax = 0.0f32;
    for &v in x {
        let ax = v.abs();
        if ax > amax {
            amax = ax;
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        l.fill(0);
        return 0.0;
    }
    let mut iscale = -(nmax as f32) / max;
    let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
    for i in 0..N {
        let li = nearest_int(iscale * x[i]).clamp(-nmax, nmax - 1);
        l[i] = (li + nmax) as i8;
        let lf = li as f32;
        sumlx += w[i] * x[i] * lf;
        suml2 += w[i] * lf * lf;
    }
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in -9i32..=9 {
        if is == 0 {
            continue;
        }
        iscale = -(nmax as f32 + 0.1f32 * is as f32) / max;
        let mut lv = [0i32; N];
        for i in 0..N {
            lv[i] = nearest_int(iscale * x[i]).clamp(-nmax, nmax - 1);
        }
        sumlx = 0.0;
        suml2 = 0.0;
        for i in 0..N {
            let lf = lv[i] as f32;
            sumlx += w[i] * x[i] * lf;
            suml2 += w[i] * lf * lf;
        }
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for i in 0..N {
                l[i] = (lv[i] + nmax) as i8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// `make_q3_quants(N, nmax, x, L, true)` (the only way Q3_K calls it): levels
/// `0..2 * nmax` in `l`, except a group below `GROUP_MAX_EPS`, which gets all 0.
pub(crate) fn make_q3_quants<const N: usize>(nmax: i32, x: &[f32; N], l: &mut [i8; N]) -> f32 {
    let mut max = 0.0f32;
    let mut amax = 0.0f32;
    for &v in x {
        let ax = v.abs();
        if ax > amax {
            amax = ax;
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        l.fill(0);
        return 0.0;
    }
    let iscale = -(nmax as f32) / max;
    let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
    let mut lv = [0i32; N];
    for i in 0..N {
        let li = nearest_int(iscale * x[i]).clamp(-nmax, nmax - 1);
        lv[i] = li;
        let w = x[i] * x[i];
        let lf = li as f32;
        sumlx += w * x[i] * lf;
        suml2 += w * lf * lf;
    }
    for _ in 0..5 {
        let mut n_changed = 0;
        for i in 0..N {
            let w = x[i] * x[i];
            let li = lv[i] as f32;
            let mut slx = sumlx - w * x[i] * li;
            if slx > 0.0 {
                let mut sl2 = suml2 - w * li * li;
                let new_l = nearest_int(x[i] * sl2 / slx).clamp(-nmax, nmax - 1);
                if new_l != lv[i] {
                    slx += w * x[i] * new_l as f32;
                    sl2 += w * new_l as f32 * new_l as f32;
                    if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                        lv[i] = new_l;
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
    for i in 0..N {
        l[i] = (lv[i] + nmax) as i8;
    }
    if suml2 > 0.0 { sumlx / suml2 } else { 0.0 }
}

/// `get_scale_min_k4`: the 6-bit scale and min of sub-block `j` (0..8) from the 12
/// packed bytes of a Q4_K / Q5_K block.
#[inline(always)]
pub(crate) fn get_scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 { (q[j] & 63, q[j + 4] & 63) } else { ((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4)) }
}

/// The inverse, as the quantisers write it (`ls`/`lm` unmasked for j < 4, exactly as C
/// stores a `uint8_t` that may exceed 63 there).
#[inline(always)]
pub(crate) fn put_scale_min_k4(ls: &[u8; 8], lm: &[u8; 8], q: &mut [u8]) {
    for j in 0..8 {
        let (a, b) = (ls[j], lm[j]);
        if j < 4 {
            q[j] = a;
            q[j + 4] = b;
        } else {
            q[j + 4] = (a & 0xF) | ((b & 0xF) << 4);
            q[j - 4] |= (a >> 4) << 6;
            q[j] |= (b >> 4) << 6;
        }
    }
}

/// Q4_K / Q5_K, reference path (`quantize_row_q{4,5}_K_ref`): the searches of the eight
/// 32-value sub-blocks of one super-block `x`, with the weights `av_x + |x|`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn scale_min_ref_search(x: &[f32], nmax: i32, rmin: f32, rdelta: f32, nstep: i32, l: &mut [u8; QK_K], scales: &mut [f32; 8], mins: &mut [f32; 8]) {
    let mut laux = [0u8; 32];
    let mut weights = [0.0f32; 32];
    for j in 0..8 {
        let xs: &[f32; 32] = x[32 * j..32 * j + 32].try_into().unwrap();
        let mut sum_x2 = 0.0f32;
        for &v in xs {
            sum_x2 += v * v;
        }
        let av_x = (sum_x2 / 32.0).sqrt();
        for k in 0..32 {
            weights[k] = av_x + xs[k].abs();
        }
        let lj: &mut [u8; 32] = (&mut l[32 * j..32 * j + 32]).try_into().unwrap();
        scales[j] = make_qkx_quants(nmax, xs, &weights, lj, &mut mins[j], &mut laux, rmin, rdelta, nstep, false);
    }
}

/// Q4_K / Q5_K, reference path: the 6-bit scales and mins into `sc` (12 bytes), fp16 `d`
/// and `dmin` as (bits of d, bits of dmin).
pub(crate) fn scale_min_ref_scales(scales: &[f32; 8], mins: &[f32; 8], sc: &mut [u8]) -> (u16, u16) {
    let mut max_scale = 0.0f32;
    let mut max_min = 0.0f32;
    for j in 0..8 {
        if scales[j] > max_scale {
            max_scale = scales[j];
        }
        if mins[j] > max_min {
            max_min = mins[j];
        }
    }
    let inv_scale = if max_scale > 0.0 { 63.0 / max_scale } else { 0.0 };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let mut ls = [0u8; 8];
    let mut lm = [0u8; 8];
    for j in 0..8 {
        ls[j] = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        lm[j] = (nearest_int(inv_min * mins[j]) as u8).min(63);
    }
    put_scale_min_k4(&ls, &lm, sc);
    (f32_to_fp16(max_scale / 63.0), f32_to_fp16(max_min / 63.0))
}

/// Q4_K / Q5_K, importance path: `make_qp_quants` of the scales and of the mins, weighted
/// by the sub-blocks' weight sums `sw`; `min63` is Q5_K's `MIN(63, l)` (Q4_K has none).
pub(crate) fn scale_min_impl_scales(scales: &[f32; 8], mins: &[f32; 8], sw: &[f32; 8], min63: bool, sc: &mut [u8]) -> (u16, u16) {
    let mut ls = [0u8; 8];
    let mut lm = [0u8; 8];
    let d_block = make_qp_quants(63, scales, &mut ls, sw);
    let m_block = make_qp_quants(63, mins, &mut lm, sw);
    if min63 {
        for j in 0..8 {
            ls[j] = ls[j].min(63);
            lm[j] = lm[j].min(63);
        }
    }
    put_scale_min_k4(&ls, &lm, sc);
    (f32_to_fp16(d_block), f32_to_fp16(m_block))
}

/// Q4_K / Q5_K, importance path: the sub-block weights `qw * sqrt(sigma2 + x * x)` and
/// their sums, with `sigma2 = 2 * sum(x * x) / 256` of the super-block.
pub(crate) fn scale_min_impl_search(x: &[f32], qw: &[f32], nmax: i32, l: &mut [u8; QK_K], scales: &mut [f32; 8], mins: &mut [f32; 8], sw: &mut [f32; 8]) {
    let mut laux = [0u8; 32];
    let mut weights = [0.0f32; 32];
    let mut sum_x2 = 0.0f32;
    for &v in &x[..QK_K] {
        sum_x2 += v * v;
    }
    let sigma2 = 2.0 * sum_x2 / QK_K as f32;
    for j in 0..8 {
        let xs: &[f32; 32] = x[32 * j..32 * j + 32].try_into().unwrap();
        for k in 0..32 {
            weights[k] = qw[32 * j + k] * (sigma2 + xs[k] * xs[k]).sqrt();
        }
        let mut sumw = 0.0f32;
        for &w in &weights {
            sumw += w;
        }
        sw[j] = sumw;
        let lj: &mut [u8; 32] = (&mut l[32 * j..32 * j + 32]).try_into().unwrap();
        scales[j] = make_qkx_quants(nmax, xs, &weights, lj, &mut mins[j], &mut laux, -0.9, 0.05, 36, false);
    }
}

/// Q4_K / Q5_K: the final levels from the block's scales (`if (!d) continue` keeps the
/// search's levels of that sub-block).
pub(crate) fn scale_min_requantise(x: &[f32], sc: &[u8], d_bits: u16, dmin_bits: u16, nmax: i32, l: &mut [u8; QK_K]) {
    let (dd, dmin) = (fp16_to_f32(d_bits), fp16_to_f32(dmin_bits));
    for j in 0..8 {
        let (s, m) = get_scale_min_k4(j, sc);
        let d = dd * s as f32;
        if d == 0.0 {
            continue;
        }
        let dm = dmin * m as f32;
        for ii in 0..32 {
            l[32 * j + ii] = nearest_int((x[32 * j + ii] + dm) / d).clamp(0, nmax) as u8;
        }
    }
}
