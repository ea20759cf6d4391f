//! Q4_1 and Q5_1 quantisation (the min-max types).
//!
//! Reference path (`quantize_row_q{4,5}_1_ref`): lanes = the values of one block, `LANES`
//! blocks at a time, whose horizontal minima and maxima are reduced together (one
//! transposing butterfly, [`Simd::lane_mins`]). The minimum and maximum are order-free
//! once the values are finite (a group of blocks holding NaN or an infinity goes to the
//! scalar code, whose `FLT_MAX`-seeded scan differs there), and the values the scalar scan
//! keeps are those at the first index holding them (which decides the sign of a zero
//! minimum, and so of `m`); the rest is per value.
//!
//! Importance path (`quantize_row_q{4,5}_1_impl`): lanes = blocks, as for Q4_0
//! ([`super::q4_0`]); lane j runs `make_qkx3_quants` (37 trial scales, a minimum that moves
//! with the best candidate) on block j, branches as masks, sums sequential within a lane.

use super::q4_0::{BLOCK, block_bases, fp16, fp16_lanes, gather32, pieces, prefetch_group, sums_of_squares, weights};
use super::x86::{Simd, iclamp, nearest_int, simd_entry};
use crate::codec::{q4_1, q5_0, q5_1};

/// The index of the first lane of `v[..n]` equal to `t`.
#[inline(always)]
fn first_eq<S: Simd>(s: S, v: &[S::F], t: f32) -> usize {
    let t = s.splat(t);
    let mut bits = 0u64;
    for (i, vi) in v.iter().enumerate() {
        bits |= (s.mbits(s.eq(*vi, t)) as u64) << (i * S::LANES);
    }
    bits.trailing_zeros() as usize
}

/// `LANES` blocks at a time: per block the lane-wise minimum and maximum of its vectors,
/// then all the blocks' horizontal reductions in one transposing butterfly
/// ([`Simd::lane_mins`]), then the scales of all of them in lanes, then per block the
/// levels. A group holding a value that is not finite goes to the scalar code.
#[inline(always)]
fn min_max_ref<S: Simd, const Q5: bool>(s: S, src: &[f32], dst: &mut [u8]) {
    let (bytes, top): (usize, i32) = if Q5 { (q5_1::BYTES, 31) } else { (q4_1::BYTES, 15) };
    let n = BLOCK / S::LANES;
    let half = n / 2;
    let all = if S::LANES == 32 { u32::MAX } else { (1u32 << S::LANES) - 1 };
    for (gi, (xg, yg)) in src.chunks(S::LANES * BLOCK).zip(dst.chunks_mut(S::LANES * bytes)).enumerate() {
        prefetch_group(s, src, gi + 2);
        let nblk = xg.len() / BLOCK;
        let mut a = [s.splat(0.0); 16];
        let mut b = [s.splat(0.0); 16];
        // The sum of everything: not finite if any value is not (an overflow of finite
        // values only sends the group to the scalar code too).
        let mut acc = [s.splat(0.0); 4];
        for (g, xb) in xg.chunks_exact(BLOCK).enumerate() {
            let v0 = s.load(xb);
            let (mut mn, mut mx) = (v0, v0);
            acc[0] = s.add(acc[0], v0);
            for i in 1..n {
                let vi = s.load(&xb[i * S::LANES..]);
                mn = s.min(vi, mn);
                mx = s.max(vi, mx);
                acc[i] = s.add(acc[i], vi);
            }
            a[g] = mn;
            b[g] = mx;
        }
        for acc_i in 1..n {
            acc[0] = s.add(acc[0], acc[acc_i]);
        }
        if s.mbits(s.le(s.abs(acc[0]), s.splat(f32::MAX))) != all {
            if Q5 {
                q5_1::quantize_row_ref(xg, yg)
            } else {
                q4_1::quantize_row_ref(xg, yg)
            }
            continue;
        }
        for g in nblk..S::LANES {
            a[g] = a[0];
            b[g] = b[0];
        }
        let mut lo = [0.0f32; 16];
        let mut hi = [0.0f32; 16];
        let (lv, hv) = (s.lane_mins(&a), s.lane_maxs(&b));
        s.store(lv, &mut lo);
        s.store(hv, &mut hi);
        // Equal values found anywhere are the same bits, but for zeros: there the scan
        // keeps the first zero's sign.
        let zero = s.splat(0.0);
        let mut zeros = s.mbits(s.mor(s.eq(lv, zero), s.eq(hv, zero))) & ((1u32 << nblk) - 1);
        while zeros != 0 {
            let g = zeros.trailing_zeros() as usize;
            zeros &= zeros - 1;
            let xb = &xg[g * BLOCK..(g + 1) * BLOCK];
            let mut v = [s.splat(0.0); 4];
            for (i, vi) in v[..n].iter_mut().enumerate() {
                *vi = s.load(&xb[i * S::LANES..]);
            }
            if lo[g] == 0.0 {
                lo[g] = xb[first_eq(s, &v[..n], 0.0)];
            }
            if hi[g] == 0.0 {
                hi[g] = xb[first_eq(s, &v[..n], 0.0)];
            }
        }
        let lov = s.load(&lo);
        let d = s.div(s.sub(s.load(&hi), lov), s.splat(top as f32));
        let mut id = [0.0f32; 16];
        s.store(s.select(s.ne(d, zero), s.div(s.splat(1.0), d), zero), &mut id);
        let (mut dh, mut mh) = ([0u16; 16], [0u16; 16]);
        s.store_low_u16(fp16_lanes(s, d), &mut dh);
        s.store_low_u16(fp16_lanes(s, lov), &mut mh);
        for (g, (xb, yb)) in xg.chunks_exact(BLOCK).zip(yg.chunks_exact_mut(bytes)).enumerate() {
            yb[..2].copy_from_slice(&dh[g].to_le_bytes());
            yb[2..4].copy_from_slice(&mh[g].to_le_bytes());
            let (minv, idv, half_v) = (s.splat(lo[g]), s.splat(id[g]), s.splat(0.5));
            let mut q = [s.isplat(0); 4];
            for i in 0..n {
                // Q5_1 casts to uint8_t without a clamp; Q4_1 takes MIN(15, (int8_t)). Only
                // the low bits are kept, and in a finite group these are the same: x - min
                // is >= 0 and at most max - min, whose product with id stays below 15.5
                // when id is finite (d is then >= 2^-128, within 2^-21 of (max - min) / 15);
                // an infinite id or product gives NaN or inf, 0x80000000 here, whose low
                // byte 0 MIN leaves alone. So the levels are 0..=15 or that.
                q[i] = s.cvtt(s.add(s.mul(s.sub(s.load(&xb[i * S::LANES..]), minv), idv), half_v));
            }
            if Q5 {
                let mut qh = 0u32;
                for (i, qi) in q[..n].iter().enumerate() {
                    qh |= s.mbits(s.ieq(s.iand(*qi, s.isplat(16)), s.isplat(16))) << (i * S::LANES);
                }
                yb[4..8].copy_from_slice(&qh.to_le_bytes());
                for k in 0..half {
                    let r = s.ior(s.iand(q[k], s.isplat(15)), s.shl::<4>(s.iand(q[k + half], s.isplat(15))));
                    s.store_low_u8(r, &mut yb[8 + k * S::LANES..]);
                }
            } else {
                for k in 0..half {
                    s.store_low_u8(s.ior(q[k], s.shl::<4>(q[k + half])), &mut yb[4 + k * S::LANES..]);
                }
            }
        }
    }
}

/// `make_qkx3_quants(32, nmax, x, w, L, &the_min, Laux, -0.9, 0.05, 36, false)` for
/// `LANES` blocks at once. Returns (scale, `-the_min`, levels).
#[inline(always)]
fn make_qkx3_lanes<S: Simd>(s: S, nmax: i32, x: &[S::F; 32], w: &[S::F; 32]) -> (S::F, S::F, [S::I; 32]) {
    const RMIN: f32 = -0.9;
    const RDELTA: f32 = 0.05;
    const NSTEP: i32 = 36;
    let zero = s.splat(0.0);
    let mut min = x[0];
    let mut max = x[0];
    let mut sum_w = w[0];
    let mut sum_x = s.mul(sum_w, x[0]);
    for i in 1..BLOCK {
        min = s.select(s.lt(x[i], min), x[i], min);
        max = s.select(s.gt(x[i], max), x[i], max);
        sum_w = s.add(sum_w, w[i]);
        sum_x = s.add(sum_x, s.mul(w[i], x[i]));
    }
    min = s.select(s.gt(min, zero), zero, min);
    let flat = s.le(max, min);
    let min0 = min;
    let iscale = s.div(s.splat(nmax as f32), s.sub(max, min));
    let mut scale = s.div(s.splat(1.0), iscale);
    let mut best_error = zero;
    let mut l = [s.isplat(0); 32];
    for i in 0..BLOCK {
        l[i] = iclamp(s, nearest_int(s, s.mul(iscale, s.sub(x[i], min))), 0, nmax);
        let diff = s.sub(s.add(s.mul(scale, s.cvt(l[i])), min), x[i]);
        best_error = s.add(best_error, s.mul(w[i], s.mul(diff, diff)));
    }
    for is in 0..=NSTEP {
        let iscale = s.div(s.splat(RMIN + RDELTA * is as f32 + nmax as f32), s.sub(max, min));
        let mut laux = [s.isplat(0); 32];
        let mut lf = [zero; 32];
        for i in 0..BLOCK {
            laux[i] = iclamp(s, nearest_int(s, s.mul(iscale, s.sub(x[i], min))), 0, nmax);
            lf[i] = s.cvt(laux[i]);
        }
        let (mut sum_l, mut sum_l2, mut sum_xl) = (zero, zero, zero);
        for i in 0..BLOCK {
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
        for i in 0..BLOCK {
            let diff = s.sub(s.add(s.mul(this_scale, lf[i]), this_min), x[i]);
            cur_error = s.add(cur_error, s.mul(w[i], s.mul(diff, diff)));
        }
        let better = s.mand(dpos, s.lt(cur_error, best_error));
        for i in 0..BLOCK {
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
    (s.select(flat, zero, scale), s.select(flat, min0, min), l)
}

#[inline(always)]
fn min_max_impl<S: Simd, const Q5: bool>(s: S, src: &[f32], n_per_row: usize, quant_weights: &[f32], dst: &mut [u8]) {
    let (bytes, nmax): (usize, i32) = if Q5 { (q5_1::BYTES, 31) } else { (q4_1::BYTES, 15) };
    let nb = n_per_row / BLOCK;
    for (src, dst) in pieces(src, dst, n_per_row, nb * bytes) {
        let sigma2 = sums_of_squares(s, src, n_per_row, None);
        let total = src.len() / BLOCK;
        for first in (0..total).step_by(S::LANES) {
            let (xb, wb, row) = block_bases(first, total, nb, S::LANES);
            let x = gather32(s, src, &xb);
            let qw = gather32(s, quant_weights, &wb);
            let mut s2 = [0.0f32; 16];
            for lane in 0..S::LANES {
                s2[lane] = sigma2[row[lane]];
            }
            let w = weights(s, &x, &qw, s.load(&s2));
            let (scale, min, l) = make_qkx3_lanes(s, nmax, &x, &w);
            let (mut sc, mut mn) = ([0.0f32; 16], [0.0f32; 16]);
            s.store(scale, &mut sc);
            s.store(min, &mut mn);
            let mut lv = [[0i32; 16]; 32];
            for k in 0..BLOCK {
                s.istore(l[k], &mut lv[k]);
            }
            for lane in 0..(total - first).min(S::LANES) {
                let y = &mut dst[(first + lane) * bytes..(first + lane + 1) * bytes];
                y[..2].copy_from_slice(&fp16(sc[lane]).to_le_bytes());
                // m = -the_min = the search's min (the sign flips twice).
                y[2..4].copy_from_slice(&fp16(mn[lane]).to_le_bytes());
                if Q5 {
                    q5_0::pack5(|j| lv[j][lane] as u8, &mut y[4..]);
                } else {
                    for j in 0..16 {
                        y[4 + j] = lv[j][lane] as u8 | ((lv[j + 16][lane] as u8) << 4);
                    }
                }
            }
        }
    }
}

#[inline(always)]
fn q4_1_ref<S: Simd>(s: S, src: &[f32], dst: &mut [u8]) {
    min_max_ref::<S, false>(s, src, dst)
}

#[inline(always)]
fn q5_1_ref<S: Simd>(s: S, src: &[f32], dst: &mut [u8]) {
    min_max_ref::<S, true>(s, src, dst)
}

#[inline(always)]
fn q4_1_impl<S: Simd>(s: S, src: &[f32], n_per_row: usize, quant_weights: &[f32], dst: &mut [u8]) {
    min_max_impl::<S, false>(s, src, n_per_row, quant_weights, dst)
}

#[inline(always)]
fn q5_1_impl<S: Simd>(s: S, src: &[f32], n_per_row: usize, quant_weights: &[f32], dst: &mut [u8]) {
    min_max_impl::<S, true>(s, src, n_per_row, quant_weights, dst)
}

simd_entry! {
    /// `quantize_row_q4_1_ref` over whole blocks.
    pub(crate) fn quantize_q4_1_ref(src: &[f32], dst: &mut [u8]) -> () => q4_1_ref
}

simd_entry! {
    /// `quantize_row_q5_1_ref` over whole blocks.
    pub(crate) fn quantize_q5_1_ref(src: &[f32], dst: &mut [u8]) -> () => q5_1_ref
}

simd_entry! {
    /// `quantize_row_q4_1_impl` over rows of `n_per_row`, one importance value per column.
    pub(crate) fn quantize_q4_1_impl(src: &[f32], n_per_row: usize, quant_weights: &[f32], dst: &mut [u8]) -> () => q4_1_impl
}

simd_entry! {
    /// `quantize_row_q5_1_impl` over rows of `n_per_row`, one importance value per column.
    pub(crate) fn quantize_q5_1_impl(src: &[f32], n_per_row: usize, quant_weights: &[f32], dst: &mut [u8]) -> () => q5_1_impl
}
