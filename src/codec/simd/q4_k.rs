//! Q4_K and Q5_K quantisation (one search, different `nmax`, parameters and packing) with
//! 32-value sub-blocks across lanes: 8 per block, so a vector holds one block (AVX2) or
//! two (AVX-512).
//!
//! The scalar quantisers' time is `make_qkx2_quants` / `make_qkx3_quants` (21 or 16
//! candidate scales per sub-block on the reference paths, 37 on the importance paths):
//! lane j carries sub-block j through exactly that ([`super::kquants::make_qkx_lanes`]),
//! with its weights (`av_x + |x|`, or `qw * sqrt(sigma2 + x * x)` with the block's
//! `sigma2` from a lane-per-block pass) computed in the lane. Per block, the 6-bit scale
//! quantisation (`make_qp_quants` on the importance paths) is the scalar code; the
//! requantisation and the packing run with lanes = consecutive values.

use super::kquants::{block_sumsq, gather_subblocks, make_qkx_lanes};
use super::x86::{Simd, iclamp, nearest_int, simd_entry};
use crate::codec::fp16_to_f32;
use crate::codec::kquants::{QK_K, get_scale_min_k4, scale_min_impl_scales, scale_min_ref_scales};

#[derive(Clone, Copy)]
struct Kind {
    /// 15 (Q4_K) or 31 (Q5_K).
    nmax: i32,
    /// The reference path's `make_qkx2_quants` rmin, rdelta, nstep.
    rmin: f32,
    rdelta: f32,
    nstep: i32,
    bytes: usize,
}

const Q4: Kind = Kind { nmax: 15, rmin: -1.0, rdelta: 0.1, nstep: 20, bytes: crate::codec::q4_k::BYTES };
const Q5: Kind = Kind { nmax: 31, rmin: -0.5, rdelta: 0.1, nstep: 15, bytes: crate::codec::q5_k::BYTES };

/// Requantisation (`scale_min_requantise`, lanes = values; a sub-block whose scale is 0
/// keeps its search levels, `lt[i][j]` = level i of sub-block j) and packing of a block.
#[inline(always)]
fn finish<S: Simd>(s: S, k: Kind, x: &[f32], lt: &[[i32; 16]; 32], lane0: usize, y: &mut [u8]) {
    let dd = fp16_to_f32(u16::from_le_bytes([y[0], y[1]]));
    let dmin = fp16_to_f32(u16::from_le_bytes([y[2], y[3]]));
    let mut l = [0i32; QK_K];
    for j in 0..8 {
        let (sc, m) = get_scale_min_k4(j, &y[4..16]);
        let d = dd * sc as f32;
        if d == 0.0 {
            for ii in 0..32 {
                l[32 * j + ii] = lt[ii][lane0 + j];
            }
            continue;
        }
        let (dv, dm) = (s.splat(d), s.splat(dmin * m as f32));
        for c in (0..32).step_by(S::LANES) {
            let q = iclamp(s, nearest_int(s, s.div(s.add(s.load(&x[32 * j + c..]), dm), dv)), 0, k.nmax);
            s.istore(q, &mut l[32 * j + c..]);
        }
    }
    let m4 = s.isplat(0xF);
    if k.nmax == 15 {
        let qs = &mut y[16..16 + 128];
        for g in 0..4 {
            for c in (0..32).step_by(S::LANES) {
                let v = s.ior(s.iload(&l[64 * g + c..]), s.shl::<4>(s.iload(&l[64 * g + 32 + c..])));
                s.store_low_u8(v, &mut qs[32 * g + c..]);
            }
        }
    } else {
        let (qh, ql) = y[16..16 + 160].split_at_mut(32);
        for c in (0..32).step_by(S::LANES) {
            let mut h = s.isplat(0);
            for g in 0..4 {
                let l1 = s.iload(&l[64 * g + c..]);
                let l2 = s.iload(&l[64 * g + 32 + c..]);
                s.store_low_u8(s.ior(s.iand(l1, m4), s.shl::<4>(s.iand(l2, m4))), &mut ql[32 * g + c..]);
                let hb = s.ior(s.shr::<4>(l1), s.shl::<1>(s.shr::<4>(l2)));
                h = s.ior(h, s.shl_by(hb, 2 * g as u32));
            }
            s.store_low_u8(h, &mut qh[c..]);
        }
    }
}

/// Whole blocks; `qw`: the importance and the blocks per row (block b's weights are those
/// of column block `b % blocks_per_row`), or `None` for the reference path.
#[inline(always)]
fn blocks<S: Simd>(s: S, k: Kind, x: &[f32], qw: Option<(&[f32], usize)>, y: &mut [u8]) {
    let nb = x.len() / QK_K;
    let per = S::LANES / 8;
    let sumsq = if qw.is_some() { block_sumsq(s, x) } else { Vec::new() };
    let mut b0 = 0;
    while b0 < nb {
        let n = per.min(nb - b0);
        // Lane j: sub-block j % 8 of block b0 + j / 8 (lanes past the last block repeat it).
        let sub = |j: usize| j.min(8 * n - 1);
        let starts: [i32; 16] = std::array::from_fn(|j| (QK_K * b0 + 32 * sub(j)) as i32);
        let xs = gather_subblocks::<S, 32>(s, x, &starts);
        let mut ws = [s.splat(0.0); 32];
        let mut sw = [0.0f32; 16];
        let (scale, min, l) = match qw {
            None => {
                let mut acc = s.splat(0.0);
                for v in &xs {
                    acc = s.add(acc, s.mul(*v, *v));
                }
                let av_x = s.sqrt(s.div(acc, s.splat(32.0)));
                for (w, v) in ws.iter_mut().zip(&xs) {
                    *w = s.add(av_x, s.abs(*v));
                }
                make_qkx_lanes(s, k.nmax, &xs, &ws, k.rmin, k.rdelta, k.nstep, false)
            }
            Some((q, bpr)) => {
                let sig: [f32; 16] = std::array::from_fn(|j| 2.0 * sumsq[b0 + sub(j) / 8] / QK_K as f32);
                let sigma2 = s.load(&sig);
                let qstarts: [i32; 16] = std::array::from_fn(|j| (QK_K * ((b0 + sub(j) / 8) % bpr) + 32 * (sub(j) % 8)) as i32);
                let qws = gather_subblocks::<S, 32>(s, q, &qstarts);
                let mut sumw = s.splat(0.0);
                for ((w, v), qv) in ws.iter_mut().zip(&xs).zip(&qws) {
                    *w = s.mul(*qv, s.sqrt(s.add(sigma2, s.mul(*v, *v))));
                    sumw = s.add(sumw, *w);
                }
                s.store(sumw, &mut sw);
                make_qkx_lanes(s, k.nmax, &xs, &ws, -0.9, 0.05, 36, false)
            }
        };
        let mut scales = [0.0f32; 16];
        let mut mins = [0.0f32; 16];
        let mut lt = [[0i32; 16]; 32];
        s.store(scale, &mut scales);
        s.store(min, &mut mins);
        for (i, li) in l.iter().enumerate() {
            s.istore(*li, &mut lt[i]);
        }
        for t in 0..n {
            let b = b0 + t;
            let y = &mut y[k.bytes * b..k.bytes * (b + 1)];
            let sc8: &[f32; 8] = scales[8 * t..8 * t + 8].try_into().unwrap();
            let mn8: &[f32; 8] = mins[8 * t..8 * t + 8].try_into().unwrap();
            let (d, dmin) = match qw {
                None => scale_min_ref_scales(sc8, mn8, &mut y[4..16]),
                Some(_) => scale_min_impl_scales(sc8, mn8, sw[8 * t..8 * t + 8].try_into().unwrap(), k.nmax == 31, &mut y[4..16]),
            };
            y[0..2].copy_from_slice(&d.to_le_bytes());
            y[2..4].copy_from_slice(&dmin.to_le_bytes());
            finish(s, k, &x[QK_K * b..QK_K * (b + 1)], &lt, 8 * t, y);
        }
        b0 += n;
    }
}

#[inline(always)]
fn q4_ref<S: Simd>(s: S, src: &[f32], dst: &mut [u8]) {
    blocks(s, Q4, src, None, dst)
}

#[inline(always)]
fn q4_impl<S: Simd>(s: S, src: &[f32], n_per_row: usize, quant_weights: &[f32], dst: &mut [u8]) {
    blocks(s, Q4, src, Some((quant_weights, n_per_row / QK_K)), dst)
}

#[inline(always)]
fn q5_ref<S: Simd>(s: S, src: &[f32], dst: &mut [u8]) {
    blocks(s, Q5, src, None, dst)
}

#[inline(always)]
fn q5_impl<S: Simd>(s: S, src: &[f32], n_per_row: usize, quant_weights: &[f32], dst: &mut [u8]) {
    blocks(s, Q5, src, Some((quant_weights, n_per_row / QK_K)), dst)
}

simd_entry! {
    /// `quantize_row_q4_K_ref` over whole blocks.
    pub(crate) fn quantize_q4_ref(src: &[f32], dst: &mut [u8]) -> () => q4_ref
}

simd_entry! {
    /// `quantize_row_q4_K_impl` over rows of `n_per_row`, one importance value per column.
    pub(crate) fn quantize_q4_impl(src: &[f32], n_per_row: usize, quant_weights: &[f32], dst: &mut [u8]) -> () => q4_impl
}

simd_entry! {
    /// `quantize_row_q5_K_ref` over whole blocks.
    pub(crate) fn quantize_q5_ref(src: &[f32], dst: &mut [u8]) -> () => q5_ref
}

simd_entry! {
    /// `quantize_row_q5_K_impl` over rows of `n_per_row`, one importance value per column.
    pub(crate) fn quantize_q5_impl(src: &[f32], n_per_row: usize, quant_weights: &[f32], dst: &mut [u8]) -> () => q5_impl
}
