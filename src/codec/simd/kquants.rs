//! The K-quant searches across lanes, shared by the Q2_K, Q4_K, Q5_K and Q6_K kernels:
//! lane j carries one sub-block through exactly the scalar function's operations (in
//! [`crate::codec::kquants`]), its sums sequential within the lane, its branches per-lane
//! masks.

use super::x86::{Simd, iclamp, nearest_int};
use crate::codec::kquants::{GROUP_MAX_EPS, QK_K};

/// `N` values of every lane's sub-block: lane k's element i is `base[start[k] + i]`.
///
/// Panics unless `start[k] + N <= base.len()` for every lane (checked here, which is
/// what makes the gathers sound).
#[inline(always)]
pub(crate) fn gather_subblocks<S: Simd, const N: usize>(s: S, base: &[f32], start: &[i32]) -> [S::F; N] {
    let start = &start[..S::LANES];
    assert!(start.iter().all(|&o| o >= 0 && o as usize + N <= base.len()));
    let idx = s.iload(start);
    let mut out = [s.splat(0.0); N];
    for (i, o) in out.iter_mut().enumerate() {
        // SAFETY: every lane index is start[k] + i < start[k] + N <= base.len() (asserted above).
        *o = unsafe { s.gather(base, s.iadd(idx, s.isplat(i as i32))) };
    }
    out
}

/// `make_qkx_quants::<N>` for `LANES` sub-blocks at once: element i of every sub-block in
/// `x[i]`, its weight in `w[i]`. Returns (scale, the_min, levels).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(crate) fn make_qkx_lanes<S: Simd, const N: usize>(
    s: S,
    nmax: i32,
    x: &[S::F; N],
    w: &[S::F; N],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
    use_mad: bool,
) -> (S::F, S::F, [S::I; N]) {
    let zero = s.splat(0.0);
    let mut min = x[0];
    let mut max = x[0];
    let mut sum_w = w[0];
    let mut sum_x = s.mul(sum_w, x[0]);
    for i in 1..N {
        min = s.select(s.lt(x[i], min), x[i], min);
        max = s.select(s.gt(x[i], max), x[i], max);
        sum_w = s.add(sum_w, w[i]);
        sum_x = s.add(sum_x, s.mul(w[i], x[i]));
    }
    min = s.select(s.gt(min, zero), zero, min);
    let flat = s.le(max, min);
    let min0 = min;
    let mut iscale = s.div(s.splat(nmax as f32), s.sub(max, min));
    let mut scale = s.div(s.splat(1.0), iscale);
    let mut best_error = zero;
    let mut l = [s.isplat(0); N];
    for i in 0..N {
        l[i] = iclamp(s, nearest_int(s, s.mul(iscale, s.sub(x[i], min))), 0, nmax);
        let diff = s.sub(s.add(s.mul(scale, s.cvt(l[i])), min), x[i]);
        best_error = s.add(best_error, s.mul(w[i], if use_mad { s.abs(diff) } else { s.mul(diff, diff) }));
    }
    debug_assert!(nstep >= 1);
    for is in 0..=nstep {
        iscale = s.div(s.splat(rmin + rdelta * is as f32 + nmax as f32), s.sub(max, min));
        let mut laux = [s.isplat(0); N];
        let mut lf = [zero; N];
        for i in 0..N {
            laux[i] = iclamp(s, nearest_int(s, s.mul(iscale, s.sub(x[i], min))), 0, nmax);
            lf[i] = s.cvt(laux[i]);
        }
        let (mut sum_l, mut sum_l2, mut sum_xl) = (zero, zero, zero);
        for i in 0..N {
            let wl = s.mul(w[i], lf[i]);
            sum_l = s.add(sum_l, wl);
            sum_l2 = s.add(sum_l2, s.mul(wl, lf[i]));
            sum_xl = s.add(sum_xl, s.mul(wl, x[i]));
        }
        let d = s.sub(s.mul(sum_w, sum_l2), s.mul(sum_l, sum_l));
        let dpos = s.gt(d, zero);
        if !s.any(dpos) {
            continue;
        }
        let mut this_scale = s.div(s.sub(s.mul(sum_w, sum_xl), s.mul(sum_x, sum_l)), d);
        let mut this_min = s.div(s.sub(s.mul(sum_l2, sum_x), s.mul(sum_l, sum_xl)), d);
        let mpos = s.gt(this_min, zero);
        this_min = s.select(mpos, zero, this_min);
        this_scale = s.select(mpos, s.div(sum_xl, sum_l2), this_scale);
        let mut cur_error = zero;
        for i in 0..N {
            let diff = s.sub(s.add(s.mul(this_scale, lf[i]), this_min), x[i]);
            cur_error = s.add(cur_error, s.mul(w[i], if use_mad { s.abs(diff) } else { s.mul(diff, diff) }));
        }
        let better = s.mand(dpos, s.lt(cur_error, best_error));
        for i in 0..N {
            l[i] = s.iselect(better, laux[i], l[i]);
        }
        best_error = s.select(better, cur_error, best_error);
        scale = s.select(better, this_scale, scale);
        min = s.select(better, this_min, min);
    }
    let zi = s.isplat(0);
    for li in &mut l {
        *li = s.iselect(flat, zi, *li);
    }
    (s.select(flat, zero, scale), s.neg(s.select(flat, min0, min)), l)
}

/// Per lane, the largest `|x[i]|` and the signed value holding it, the first one on ties
/// (the scalar scan's `if (ax > amax) { amax = ax; max = x; }` from zero).
#[inline(always)]
pub(crate) fn signed_amax<S: Simd>(s: S, x: &[S::F]) -> (S::F, S::F) {
    let zero = s.splat(0.0);
    let (mut amax, mut max) = (zero, zero);
    for v in x {
        let ax = s.abs(*v);
        let gt = s.gt(ax, amax);
        amax = s.select(gt, ax, amax);
        max = s.select(gt, *v, max);
    }
    (amax, max)
}

/// `make_qx_quants::<N>(nmax, x, L, 1, w)` for `LANES` sub-blocks at once (element i of
/// every sub-block in `x[i]`, its weight in `w[i]`). Returns (scale, levels `0..2 * nmax`).
#[inline(always)]
pub(crate) fn make_qx_lanes<S: Simd, const N: usize>(s: S, nmax: i32, x: &[S::F; N], w: &[S::F; N]) -> (S::F, [S::I; N]) {
    let zero = s.splat(0.0);
    let nmaxi = s.isplat(nmax);
    let (amax, max) = signed_amax(s, x);
    let flat = s.lt(amax, s.splat(GROUP_MAX_EPS));
    let mut wx = [zero; N];
    for i in 0..N {
        wx[i] = s.mul(w[i], x[i]);
    }
    let mut iscale = s.div(s.splat(-(nmax as f32)), max);
    let mut l = [s.isplat(0); N];
    let (mut sumlx, mut suml2) = (zero, zero);
    for i in 0..N {
        let li = iclamp(s, nearest_int(s, s.mul(iscale, x[i])), -nmax, nmax - 1);
        l[i] = s.iadd(li, nmaxi);
        let lf = s.cvt(li);
        sumlx = s.add(sumlx, s.mul(wx[i], lf));
        suml2 = s.add(suml2, s.mul(s.mul(w[i], lf), lf));
    }
    let mut scale = s.select(s.ne(suml2, zero), s.div(sumlx, suml2), zero);
    let mut best = s.mul(scale, sumlx);
    for is in -9i32..=9 {
        if is == 0 {
            continue;
        }
        iscale = s.div(s.splat(-(nmax as f32 + 0.1f32 * is as f32)), max);
        let mut lv = [s.isplat(0); N];
        let (mut sumlx, mut suml2) = (zero, zero);
        for i in 0..N {
            lv[i] = iclamp(s, nearest_int(s, s.mul(iscale, x[i])), -nmax, nmax - 1);
            let lf = s.cvt(lv[i]);
            sumlx = s.add(sumlx, s.mul(wx[i], lf));
            suml2 = s.add(suml2, s.mul(s.mul(w[i], lf), lf));
        }
        let better = s.mand(s.gt(suml2, zero), s.gt(s.mul(sumlx, sumlx), s.mul(best, suml2)));
        if !s.any(better) {
            continue;
        }
        for i in 0..N {
            l[i] = s.iselect(better, s.iadd(lv[i], nmaxi), l[i]);
        }
        scale = s.select(better, s.div(sumlx, suml2), scale);
        best = s.select(better, s.mul(scale, sumlx), best);
    }
    let zi = s.isplat(0);
    for li in &mut l {
        *li = s.iselect(flat, zi, *li);
    }
    (s.select(flat, zero, scale), l)
}

/// `sum(x * x)` of each block, sequential within a block (lane = block).
#[inline(always)]
pub(crate) fn block_sumsq<S: Simd>(s: S, x: &[f32]) -> Vec<f32> {
    let nb = x.len() / QK_K;
    let mut out = vec![0.0f32; nb.div_ceil(S::LANES) * S::LANES];
    for b0 in (0..nb).step_by(S::LANES) {
        let starts: [i32; 16] = std::array::from_fn(|k| (QK_K * (b0 + k).min(nb - 1)) as i32);
        let mut acc = s.splat(0.0);
        for c in (0..QK_K).step_by(32) {
            let v = gather_subblocks::<S, 32>(s, &x[c..], &starts);
            for v in v {
                acc = s.add(acc, s.mul(v, v));
            }
        }
        s.store(acc, &mut out[b0..]);
    }
    out
}

/// `make_q3_quants::<N>(nmax, x, L, true)` for `K * LANES` sub-blocks at once (element i
/// of vector k's sub-blocks in `x[k][i]`): the refinement loop runs while any lane still
/// changes, a lane that made no change in a round being done (the reference's `break`).
/// The `K` vectors are independent dependency chains (a lane's sums wait on its division),
/// interleaved so that they overlap. Returns per vector (scale, levels `0..2 * nmax`, or
/// all 0 for a group below `GROUP_MAX_EPS`).
#[inline(always)]
pub(crate) fn make_q3_lanes<S: Simd, const N: usize, const K: usize>(s: S, nmax: i32, x: &[[S::F; N]; K]) -> [(S::F, [S::I; N]); K] {
    let zero = s.splat(0.0);
    let mut w = [[zero; N]; K];
    let mut wx = [[zero; N]; K];
    // The levels as f32 (small integers, exact), and the terms `w*x*l`, `w*l*l` of the
    // sums at the current levels (the same products the reference recomputes).
    let mut lf = [[zero; N]; K];
    let mut wxl = [[zero; N]; K];
    let mut wll = [[zero; N]; K];
    let mut sumlx = [zero; K];
    let mut suml2 = [zero; K];
    let mut flat = [s.lt(zero, zero); K];
    for k in 0..K {
        let x = &x[k];
        let (amax, max) = signed_amax(s, x);
        flat[k] = s.lt(amax, s.splat(GROUP_MAX_EPS));
        let iscale = s.div(s.splat(-(nmax as f32)), max);
        for i in 0..N {
            w[k][i] = s.mul(x[i], x[i]);
            wx[k][i] = s.mul(w[k][i], x[i]);
            let l = iclamp(s, nearest_int(s, s.mul(iscale, x[i])), -nmax, nmax - 1);
            lf[k][i] = s.cvt(l);
            wxl[k][i] = s.mul(wx[k][i], lf[k][i]);
            wll[k][i] = s.mul(s.mul(w[k][i], lf[k][i]), lf[k][i]);
            sumlx[k] = s.add(sumlx[k], wxl[k][i]);
            suml2[k] = s.add(suml2[k], wll[k][i]);
        }
    }
    let mut active = flat;
    for a in &mut active {
        *a = s.mnot(*a);
    }
    for _ in 0..5 {
        let mut live = [false; K];
        for k in 0..K {
            live[k] = s.any(active[k]);
        }
        if !live.contains(&true) {
            break;
        }
        let mut changed = [s.lt(zero, zero); K];
        for i in 0..N {
            for k in 0..K {
                if !live[k] {
                    continue;
                }
                let li = lf[k][i];
                let slx = s.sub(sumlx[k], wxl[k][i]);
                let sl2 = s.sub(suml2[k], wll[k][i]);
                let new_l = iclamp(s, nearest_int(s, s.div(s.mul(x[k][i], sl2), slx)), -nmax, nmax - 1);
                let nf = s.cvt(new_l);
                let wxn = s.mul(wx[k][i], nf);
                let wnn = s.mul(s.mul(w[k][i], nf), nf);
                let slx2 = s.add(slx, wxn);
                let sl22 = s.add(sl2, wnn);
                // active && slx > 0 && new_l != L[i] && sl2 > 0 && slx*slx*suml2 > sumlx*sumlx*sl2
                let upd = s.mne(s.mgt(active[k], slx, zero), nf, li);
                let upd = s.mgt(s.mgt(upd, sl22, zero), s.mul(s.mul(slx2, slx2), suml2[k]), s.mul(s.mul(sumlx[k], sumlx[k]), sl22));
                lf[k][i] = s.select(upd, nf, li);
                wxl[k][i] = s.select(upd, wxn, wxl[k][i]);
                wll[k][i] = s.select(upd, wnn, wll[k][i]);
                sumlx[k] = s.select(upd, slx2, sumlx[k]);
                suml2[k] = s.select(upd, sl22, suml2[k]);
                changed[k] = s.mor(changed[k], upd);
            }
        }
        for k in 0..K {
            active[k] = s.mand(active[k], changed[k]);
        }
    }
    let nmaxi = s.isplat(nmax);
    let zi = s.isplat(0);
    let mut out = [(zero, [zi; N]); K];
    for (k, (scale, l)) in out.iter_mut().enumerate() {
        for i in 0..N {
            l[i] = s.iselect(flat[k], zi, s.iadd(s.cvtt(lf[k][i]), nmaxi));
        }
        let sc = s.select(s.gt(suml2[k], zero), s.div(sumlx[k], suml2[k]), zero);
        *scale = s.select(flat[k], zero, sc);
    }
    out
}
