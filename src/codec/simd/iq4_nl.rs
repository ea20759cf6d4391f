//! IQ4_NL and IQ4_XS quantisation (`quantize_row_iq4_nl_impl` with `ntry = 7`), lanes =
//! 32-value blocks.
//!
//! Lane j carries block j (IQ4_NL) or sub-block j (IQ4_XS; a vector holds one or two whole
//! super-blocks) through the scale search: the signed-maximum scan, the first pass and the
//! 15 trial scales, each a pass of `best_index_int8` and two sequential sums; the `if`s are
//! masks. `best_index_int8` becomes a branchless search over the sorted table (the index
//! `ml` of the last value <= x, found with steps of 8, 4, 2, 1; then the reference's tie
//! rule between `ml` and `ml + 1` with the same two f32 differences), which is the
//! reference's binary search's result for every x, NaN included. IQ4_XS's per-super-block
//! scale quantisation is scalar (8 values), its requantisation runs in lanes again; the
//! super-blocks' `sigma2` (a sequential sum of 256 squares) is computed with lanes =
//! super-blocks.

use super::q4_0::{BLOCK, block_bases, fp16, gather32, pieces, sums_of_squares, weights};
use super::x86::{Simd, simd_entry};
use crate::codec::q2_k::GROUP_MAX_EPS;
use crate::codec::{iq4_nl, iq4_xs, nearest_int};

/// `kvalues_iq4nl[0, 2, .., 14]` and `[1, 3, .., 15]`.
const EVEN: [f32; 8] = [-127.0, -83.0, -49.0, -22.0, 1.0, 25.0, 53.0, 89.0];
const ODD: [f32; 8] = [-104.0, -65.0, -35.0, -10.0, 13.0, 38.0, 69.0, 113.0];

/// `best_index_int8(16, kvalues_iq4nl, x)` and the value at that index, per lane.
#[inline(always)]
fn best_index<S: Simd>(s: S, x: S::F) -> (S::I, S::F) {
    let (zero, one) = (s.isplat(0), s.isplat(1));
    // ml = the last index whose value is <= x (0 below the table; 15, then 14, for NaN).
    let c = s.lt(x, s.splat(1.0));
    let mut ml = s.iselect(c, zero, s.isplat(8));
    let v = s.select(c, s.splat(-49.0), s.splat(53.0));
    ml = s.iadd(ml, s.iselect(s.lt(x, v), zero, s.isplat(4)));
    let v = s.lut8(&EVEN, s.iadd(s.shr::<1>(ml), one));
    ml = s.iadd(ml, s.iselect(s.lt(x, v), zero, s.isplat(2)));
    let v = s.lut8(&ODD, s.shr::<1>(ml));
    ml = s.iadd(ml, s.iselect(s.lt(x, v), zero, one));
    ml = s.imin(ml, s.isplat(14));
    // The values at ml and ml + 1, one even index and one odd.
    let a = s.lut8(&EVEN, s.shr::<1>(s.iadd(ml, one)));
    let b = s.lut8(&ODD, s.shr::<1>(ml));
    let odd = s.ieq(s.iand(ml, one), one);
    let lo = s.select(odd, b, a);
    let hi = s.select(odd, a, b);
    let take_lo = s.lt(s.sub(x, lo), s.sub(hi, x));
    (s.iselect(take_lo, ml, s.iadd(ml, one)), s.select(take_lo, lo, hi))
}

/// `sumqx`, `sumq2` of one trial scale.
#[inline(always)]
fn sums<S: Simd>(s: S, id: S::F, x: &[S::F; 32], w: &[S::F; 32]) -> (S::F, S::F) {
    let (mut sumqx, mut sumq2) = (s.splat(0.0), s.splat(0.0));
    for j in 0..BLOCK {
        let (_, q) = best_index(s, s.mul(id, x[j]));
        let wq = s.mul(w[j], q);
        sumqx = s.add(sumqx, s.mul(wq, x[j]));
        sumq2 = s.add(sumq2, s.mul(wq, q));
    }
    (sumqx, sumq2)
}

/// The scale search of one block per lane: `scales[ib]` of the reference (0 where the
/// block's absolute maximum is below `GROUP_MAX_EPS`).
#[inline(always)]
fn search<S: Simd>(s: S, x: &[S::F; 32], w: &[S::F; 32]) -> S::F {
    let zero = s.splat(0.0);
    let (mut amax, mut max) = (zero, zero);
    for xj in x {
        let ax = s.abs(*xj);
        let m = s.gt(ax, amax);
        amax = s.select(m, ax, amax);
        max = s.select(m, *xj, max);
    }
    let small = s.lt(amax, s.splat(GROUP_MAX_EPS));
    let d = s.div(s.neg(max), s.splat(-127.0));
    let id = s.div(s.splat(1.0), d);
    let (sumqx, sumq2) = sums(s, id, x, w);
    let mut d = s.select(s.gt(sumq2, zero), s.div(sumqx, sumq2), zero);
    let mut best = s.mul(d, sumqx);
    for itry in -7i32..=7 {
        let id = s.div(s.splat((itry - 127) as f32), max);
        let (sumqx, sumq2) = sums(s, id, x, w);
        let better = s.mand(s.gt(sumq2, zero), s.gt(s.mul(sumqx, sumqx), s.mul(best, sumq2)));
        if s.any(better) {
            let nd = s.div(sumqx, sumq2);
            d = s.select(better, nd, d);
            best = s.select(better, s.mul(nd, sumqx), best);
        }
    }
    s.select(small, zero, d)
}

/// The 4-bit indices of `id * x` per lane into `lv[k][lane]`.
#[inline(always)]
fn indices<S: Simd>(s: S, id: S::F, x: &[S::F; 32], lv: &mut [[i32; 16]; 32]) {
    for k in 0..BLOCK {
        let (l, _) = best_index(s, s.mul(id, x[k]));
        s.istore(l, &mut lv[k]);
    }
}

/// `qs` of one 32-value block from lane `lane` of `lv`.
#[inline(always)]
fn pack(lv: &[[i32; 16]; 32], lane: usize, qs: &mut [u8]) {
    for j in 0..16 {
        qs[j] = lv[j][lane] as u8 | ((lv[j + 16][lane] as u8) << 4);
    }
}

/// The group's weights: `qw * sqrt(sigma2 + x^2)` with the lanes' `sigma2`, or `x^2`.
#[inline(always)]
fn group_weights<S: Simd>(s: S, x: &[S::F; 32], qw: Option<([S::F; 32], S::F)>) -> [S::F; 32] {
    match qw {
        Some((q, sigma2)) => weights(s, x, &q, sigma2),
        None => {
            let mut w = [s.splat(0.0); 32];
            for k in 0..BLOCK {
                w[k] = s.mul(x[k], x[k]);
            }
            w
        }
    }
}

#[inline(always)]
fn nl<S: Simd>(s: S, src: &[f32], n_per_row: usize, quant_weights: Option<&[f32]>, dst: &mut [u8]) {
    let nb = n_per_row / BLOCK;
    const BYTES: usize = iq4_nl::BYTES;
    for (src, dst) in pieces(src, dst, n_per_row, nb * BYTES) {
        let total = src.len() / BLOCK;
        for first in (0..total).step_by(S::LANES) {
            let (xb, wb, _) = block_bases(first, total, nb, S::LANES);
            let x = gather32(s, src, &xb);
            let qw = quant_weights.map(|q| {
                // sigma2 of the block (the super-block is the block), in lane order.
                let mut sigma2 = s.splat(0.0);
                for xk in &x {
                    sigma2 = s.add(sigma2, s.mul(*xk, *xk));
                }
                (gather32(s, q, &wb), s.mul(sigma2, s.splat(2.0 / 32.0)))
            });
            let w = group_weights(s, &x, qw);
            let d = search(s, &x, &w);
            let id = s.select(s.ne(d, s.splat(0.0)), s.div(s.splat(1.0), d), s.splat(0.0));
            let mut lv = [[0i32; 16]; 32];
            indices(s, id, &x, &mut lv);
            let mut dv = [0.0f32; 16];
            s.store(d, &mut dv);
            for lane in 0..(total - first).min(S::LANES) {
                let y = &mut dst[(first + lane) * BYTES..(first + lane + 1) * BYTES];
                y[..2].copy_from_slice(&fp16(dv[lane]).to_le_bytes());
                pack(&lv, lane, &mut y[2..]);
            }
        }
    }
}

#[inline(always)]
fn xs<S: Simd>(s: S, src: &[f32], n_per_row: usize, quant_weights: Option<&[f32]>, dst: &mut [u8]) {
    const QK_K: usize = iq4_xs::QK_K;
    const BYTES: usize = iq4_xs::BYTES;
    debug_assert!(S::LANES.is_multiple_of(8));
    let nb = n_per_row / BLOCK;
    for (src, dst) in pieces(src, dst, n_per_row, n_per_row / QK_K * BYTES) {
        let sigma2 = quant_weights.map(|_| sums_of_squares(s, src, QK_K, Some(2.0 / QK_K as f32)));
        let total = src.len() / BLOCK;
        for first in (0..total).step_by(S::LANES) {
            let (xb, wb, _) = block_bases(first, total, nb, S::LANES);
            let x = gather32(s, src, &xb);
            let qw = quant_weights.map(|q| {
                let sigma2 = sigma2.as_ref().unwrap();
                let mut s2 = [0.0f32; 16];
                for (lane, v) in s2[..S::LANES].iter_mut().enumerate() {
                    *v = sigma2[(first + lane).min(total - 1) / 8];
                }
                (gather32(s, q, &wb), s.load(&s2))
            });
            let w = group_weights(s, &x, qw);
            let mut scales = [0.0f32; 16];
            s.store(search(s, &x, &w), &mut scales);
            // The super-block scales (scalar), then the requantisation (lanes).
            let count = (total - first).min(S::LANES);
            let mut idl = [0.0f32; 16];
            for sb in 0..count / 8 {
                let sc = &scales[8 * sb..8 * sb + 8];
                let (mut max_scale, mut amax_scale) = (0.0f32, 0.0f32);
                for &d in sc {
                    if d.abs() > amax_scale {
                        amax_scale = d.abs();
                        max_scale = d;
                    }
                }
                let y = &mut dst[(first / 8 + sb) * BYTES..(first / 8 + sb + 1) * BYTES];
                let d = -max_scale / 32.0;
                y[..2].copy_from_slice(&fp16(d).to_le_bytes());
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                let mut scales_h = 0u16;
                for ib in 0..8 {
                    let mut l = nearest_int(id * sc[ib]).clamp(-32, 31);
                    let dl = d * l as f32;
                    idl[8 * sb + ib] = if dl != 0.0 { 1.0 / dl } else { 0.0 };
                    l += 32;
                    let (l_l, l_h) = ((l & 0xF) as u8, (l >> 4) as u16);
                    if ib % 2 == 0 {
                        y[4 + ib / 2] = l_l;
                    } else {
                        y[4 + ib / 2] |= l_l << 4;
                    }
                    scales_h |= l_h << (2 * ib);
                }
                y[2..4].copy_from_slice(&scales_h.to_le_bytes());
            }
            let mut lv = [[0i32; 16]; 32];
            indices(s, s.load(&idl), &x, &mut lv);
            for lane in 0..count {
                let b = first + lane;
                let y = &mut dst[(b / 8) * BYTES..(b / 8 + 1) * BYTES];
                pack(&lv, lane, &mut y[8 + 16 * (b % 8)..]);
            }
        }
    }
}

simd_entry! {
    /// `quantize_iq4_nl` over rows of `n_per_row` (importance one value per column, or none).
    pub(crate) fn quantize_nl(src: &[f32], n_per_row: usize, quant_weights: Option<&[f32]>, dst: &mut [u8]) -> () => nl
}

simd_entry! {
    /// `quantize_iq4_xs` over rows of `n_per_row` (importance one value per column, or none).
    pub(crate) fn quantize_xs(src: &[f32], n_per_row: usize, quant_weights: Option<&[f32]>, dst: &mut [u8]) -> () => xs
}
