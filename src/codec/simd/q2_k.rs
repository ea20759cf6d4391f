//! Q2_K quantisation with sub-blocks across lanes.
//!
//! Almost all of the scalar quantiser's time is `make_qkx2_quants` / `make_qkx3_quants`:
//! 16 (reference path) or 37 (importance path) candidate scales per 16-value sub-block,
//! each a pass of rounding and three sequential sums. Here lane j carries sub-block j of a
//! super-block through exactly that sequence (the sums stay sequential within a lane), with
//! the data-dependent updates (`if d > 0`, `if this_min > 0`, `if cur_error < best_error`,
//! the early return of a flat sub-block) as per-lane masks. The per-super-block remainder
//! (the scale quantisation, `make_qp_quants` over the 16 scales, the final requantisation)
//! is the scalar code or a direct lane-per-sub-block translation of it. (Profile with
//! AVX-512, importance path: the lane kernel ~85 % of the quantiser's time, the scalar
//! `make_qp_quants` ~12 %; it could go across lanes too, 16 blocks at a time, as the
//! IQ2_XXS kernel does.)

use super::kquants::make_qkx_lanes;
use super::x86::{Simd, iclamp, nearest_int, simd_entry};
use crate::codec::q2_k::{BYTES, QK_K, impl_block_scales, ref_block_scales};

/// Element i of sub-blocks `first..first + LANES` of a super-block (`v` has 256 values).
#[inline(always)]
fn lanes_of<S: Simd>(s: S, v: &[f32], first: usize) -> [S::F; 16] {
    let v = &v[..QK_K];
    let base = s.iadd(s.shl::<4>(s.iota()), s.isplat(16 * first as i32));
    let mut out = [s.splat(0.0); 16];
    for (i, o) in out.iter_mut().enumerate() {
        // SAFETY: lane indices are 16 * (first + lane) + i <= 16 * 15 + 15 < 256 = v.len(),
        // since callers pass first + LANES <= 16.
        *o = unsafe { s.gather(v, s.iadd(base, s.isplat(i as i32))) };
    }
    out
}

/// The requantisation with the final scales (`if d == 0 { keep }`), lanes = sub-blocks;
/// `levels[i][j]` is element i of sub-block j.
#[inline(always)]
fn requantise<S: Simd>(s: S, x: &[f32], sc: &[u8], dd: f32, dmin: f32, levels: &mut [[i32; 16]; 16]) {
    let mut scb = [0i32; 16];
    for (o, &v) in scb.iter_mut().zip(sc) {
        *o = v as i32;
    }
    for first in (0..16).step_by(S::LANES) {
        let xs = lanes_of(s, x, first);
        let scv = s.iload(&scb[first..]);
        let d = s.mul(s.splat(dd), s.cvt(s.iand(scv, s.isplat(0xF))));
        let dm = s.mul(s.splat(dmin), s.cvt(s.shr::<4>(scv)));
        let keep = s.eq(d, s.splat(0.0));
        for (i, xi) in xs.iter().enumerate() {
            let q = iclamp(s, nearest_int(s, s.div(s.add(*xi, dm), d)), 0, 3);
            let old = s.iload(&levels[i][first..]);
            s.istore(s.iselect(keep, old, q), &mut levels[i][first..]);
        }
    }
}

/// `pack_qs` from transposed levels.
#[inline(always)]
fn pack(levels: &[[i32; 16]; 16], qs: &mut [u8]) {
    let l = |e: usize| levels[e % 16][e / 16] as u8;
    for j in (0..QK_K).step_by(128) {
        for k in 0..32 {
            qs[j / 4 + k] = l(j + k) | (l(j + k + 32) << 2) | (l(j + k + 64) << 4) | (l(j + k + 96) << 6);
        }
    }
}

#[inline(always)]
fn reference_path<S: Simd>(s: S, src: &[f32], dst: &mut [u8]) {
    for (x, y) in src.chunks_exact(QK_K).zip(dst.chunks_exact_mut(BYTES)) {
        let mut levels = [[0i32; 16]; 16];
        let mut scales = [0.0f32; 16];
        let mut mins = [0.0f32; 16];
        for first in (0..16).step_by(S::LANES) {
            let xs = lanes_of(s, x, first);
            let mut ws = xs;
            for w in &mut ws {
                *w = s.abs(*w);
            }
            let (scale, min, l) = make_qkx_lanes(s, 3, &xs, &ws, -0.5, 0.1, 15, true);
            s.store(scale, &mut scales[first..]);
            s.store(min, &mut mins[first..]);
            for i in 0..16 {
                s.istore(l[i], &mut levels[i][first..]);
            }
        }
        let (dd, dmin) = ref_block_scales(&scales, &mins, y);
        let (sc, rest) = y.split_at_mut(16);
        requantise(s, x, sc, dd, dmin, &mut levels);
        pack(&levels, &mut rest[..64]);
    }
}

#[inline(always)]
fn importance_path<S: Simd>(s: S, src: &[f32], n_per_row: usize, quant_weights: &[f32], dst: &mut [u8]) {
    let row_bytes = n_per_row / QK_K * BYTES;
    for (xr, yr) in src.chunks_exact(n_per_row).zip(dst.chunks_exact_mut(row_bytes)) {
        for (i, (x, y)) in xr.chunks_exact(QK_K).zip(yr.chunks_exact_mut(BYTES)).enumerate() {
            let qw = &quant_weights[QK_K * i..QK_K * (i + 1)];
            let mut levels = [[0i32; 16]; 16];
            let mut scales = [0.0f32; 16];
            let mut mins = [0.0f32; 16];
            let mut sw = [0.0f32; 16];
            let mut sumx2 = 0.0f32;
            for &v in x {
                sumx2 += v * v;
            }
            let sigma2 = s.splat(sumx2 / QK_K as f32);
            for first in (0..16).step_by(S::LANES) {
                let xs = lanes_of(s, x, first);
                let qws = lanes_of(s, qw, first);
                let mut ws = qws;
                for (w, xk) in ws.iter_mut().zip(&xs) {
                    *w = s.mul(*w, s.sqrt(s.add(sigma2, s.mul(*xk, *xk))));
                }
                let mut swv = s.splat(0.0);
                for w in &ws {
                    swv = s.add(swv, *w);
                }
                s.store(swv, &mut sw[first..]);
                let (scale, min, l) = make_qkx_lanes(s, 3, &xs, &ws, -0.9, 0.05, 36, false);
                s.store(scale, &mut scales[first..]);
                s.store(min, &mut mins[first..]);
                for k in 0..16 {
                    s.istore(l[k], &mut levels[k][first..]);
                }
            }
            let (dm, mm) = impl_block_scales(&scales, &mins, &sw, y);
            let (sc, rest) = y.split_at_mut(16);
            requantise(s, x, sc, dm, mm, &mut levels);
            pack(&levels, &mut rest[..64]);
        }
    }
}

simd_entry! {
    /// `quantize_row_q2_K_ref` over whole blocks.
    pub(crate) fn quantize_ref(src: &[f32], dst: &mut [u8]) -> () => reference_path
}

simd_entry! {
    /// `quantize_row_q2_K_impl` over rows of `n_per_row`, one importance value per column.
    pub(crate) fn quantize_impl(src: &[f32], n_per_row: usize, quant_weights: &[f32], dst: &mut [u8]) -> () => importance_path
}
