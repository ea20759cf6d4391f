//! Q3_K quantisation with 16-value sub-blocks across lanes.
//!
//! The scalar quantiser's time is the per-sub-block search: `make_q3_quants` with its
//! refinement rounds on the reference path, `make_qx_quants(16, 4, ...)` on the
//! importance path; lane j carries sub-block j through exactly that
//! ([`super::kquants::make_q3_lanes`], [`super::kquants::make_qx_lanes`]); the reference
//! path's searches run several vectors of sub-blocks (of up to four blocks) interleaved,
//! since a lane's refinement is one long dependency chain. The importance
//! path's search over the sixteen scales of a block (`make_qx_quants(16, 32, ...)`) runs
//! with lane = block, `LANES` blocks at a time; the reference path's scale quantisation is
//! the scalar code; the requantisation and the packing run with lanes = consecutive
//! values.

use super::kquants::{block_sumsq, gather_subblocks, make_q3_lanes, make_qx_lanes};
use super::x86::{Simd, iclamp, nearest_int, simd_entry};
use crate::codec::f32_to_fp16;
use crate::codec::fp16_to_f32;
use crate::codec::kquants::QK_K;
use crate::codec::q3_k::{BYTES, get_scale, put_scale, ref_scales};

/// Independent sub-block vectors per [`make_q3_lanes`] call on the reference path: enough
/// dependency chains to cover a chain's latency (a division and the sums after it).
const Q3_CHAINS: usize = 4;

/// `q3_k::finish` (requantisation, hmask and qs) from the search's levels `lt[i][j]`
/// (level i of sub-block j), kept where a sub-block's scale is 0.
#[inline(always)]
fn finish<S: Simd>(s: S, x: &[f32], lt: &[[i32; 16]; 16], y: &mut [u8]) {
    let dd = fp16_to_f32(u16::from_le_bytes([y[108], y[109]]));
    let mut l = [0i32; QK_K];
    for j in 0..16 {
        let d = dd * get_scale(&y[96..108], j) as f32;
        if d == 0.0 {
            for ii in 0..16 {
                l[16 * j + ii] = lt[ii][j];
            }
            continue;
        }
        let dv = s.splat(d);
        for k in (0..16).step_by(S::LANES) {
            let q = iclamp(s, nearest_int(s, s.div(s.load(&x[16 * j + k..]), dv)), -4, 3);
            s.istore(s.iadd(q, s.isplat(4)), &mut l[16 * j + k..]);
        }
    }
    // Levels 0..8: the high bit to hmask (bit j2 of hmask[k] for value 32 * j2 + k), the
    // low two bits to qs (as Q2_K's).
    let three = s.isplat(3);
    for k in (0..32).step_by(S::LANES) {
        let mut h = s.isplat(0);
        for j2 in 0..8 {
            h = s.ior(h, s.shl_by(s.shr::<2>(s.iload(&l[32 * j2 + k..])), j2 as u32));
        }
        s.store_low_u8(h, &mut y[k..]);
        for half in 0..2 {
            let q = |o: usize| s.iand(s.iload(&l[128 * half + k + o..]), three);
            let v = s.ior(s.ior(q(0), s.shl::<2>(q(32))), s.ior(s.shl::<4>(q(64)), s.shl::<6>(q(96))));
            s.store_low_u8(v, &mut y[32 + 32 * half + k..]);
        }
    }
}

/// Whole blocks; `qw`: the importance and the blocks per row (block b's weights are those
/// of column block `b % blocks_per_row`), or `None` for the reference path.
#[inline(always)]
fn blocks<S: Simd>(s: S, x: &[f32], qw: Option<(&[f32], usize)>, y: &mut [u8]) {
    let nb = x.len() / QK_K;
    let sumsq = if qw.is_some() { block_sumsq(s, x) } else { Vec::new() };
    let starts: [i32; 16] = std::array::from_fn(|k| 16 * k as i32);
    for b0 in (0..nb).step_by(S::LANES) {
        let n = S::LANES.min(nb - b0);
        // scales[i][t], sw[i][t]: sub-block i of block b0 + t (lane = block for the block search).
        let mut scales = [[0.0f32; 16]; 16];
        let mut sw = [[0.0f32; 16]; 16];
        let mut lts = [[[0i32; 16]; 16]; 16];
        if qw.is_none() {
            // The reference path: the sub-block searches of the whole group, `Q3_CHAINS`
            // vectors (of `LANES` sub-blocks) per call; vector v is sub-blocks
            // `(v % per) * LANES..` of block `v / per` (zeros past the last block: flat).
            let per = 16 / S::LANES;
            for c in (0..n * per).step_by(Q3_CHAINS) {
                let mut xs = [[s.splat(0.0); 16]; Q3_CHAINS];
                for (k, xk) in xs.iter_mut().enumerate() {
                    let (t, first) = ((c + k) / per, (c + k) % per * S::LANES);
                    if t < n {
                        // Element i of sub-blocks first.. : rows = those sub-blocks'
                        // values i0..i0 + LANES, transposed.
                        let xb = &x[QK_K * (b0 + t)..QK_K * (b0 + t + 1)];
                        for i0 in (0..16).step_by(S::LANES) {
                            let rows = &mut xk[i0..i0 + S::LANES];
                            for (j, r) in rows.iter_mut().enumerate() {
                                *r = s.load(&xb[16 * (first + j) + i0..]);
                            }
                            s.transpose(rows);
                        }
                    }
                }
                for (k, (scale, l)) in make_q3_lanes(s, 4, &xs).into_iter().enumerate() {
                    let (t, first) = ((c + k) / per, (c + k) % per * S::LANES);
                    if t < n {
                        let mut sc = [0.0f32; 16];
                        s.store(scale, &mut sc);
                        for j in 0..S::LANES {
                            scales[first + j][t] = sc[j];
                        }
                        for (i, li) in l.iter().enumerate() {
                            s.istore(*li, &mut lts[t][i][first..]);
                        }
                    }
                }
            }
        }
        for t in 0..n {
            let Some((q, bpr)) = qw else { break };
            let b = b0 + t;
            let xb = &x[QK_K * b..QK_K * (b + 1)];
            let mut sc = [0.0f32; 16];
            let mut swb = [0.0f32; 16];
            for first in (0..16).step_by(S::LANES) {
                let xs = gather_subblocks::<S, 16>(s, &xb[16 * first..], &starts);
                let qws = gather_subblocks::<S, 16>(s, &q[QK_K * (b % bpr) + 16 * first..QK_K * (b % bpr + 1)], &starts);
                let sigma2 = s.splat(2.0 * sumsq[b] / QK_K as f32);
                let mut ws = qws;
                let mut sumw = s.splat(0.0);
                for (w, v) in ws.iter_mut().zip(&xs) {
                    *w = s.mul(*w, s.sqrt(s.add(sigma2, s.mul(*v, *v))));
                    sumw = s.add(sumw, *w);
                }
                s.store(sumw, &mut swb[first..]);
                let (scale, l) = make_qx_lanes(s, 4, &xs, &ws);
                s.store(scale, &mut sc[first..]);
                for (i, li) in l.iter().enumerate() {
                    s.istore(*li, &mut lts[t][i][first..]);
                }
            }
            for i in 0..16 {
                scales[i][t] = sc[i];
                sw[i][t] = swb[i];
            }
        }
        match qw {
            None => {
                for t in 0..n {
                    let sc: [f32; 16] = std::array::from_fn(|i| scales[i][t]);
                    ref_scales(&sc, &mut y[BYTES * (b0 + t)..BYTES * (b0 + t + 1)]);
                }
            }
            Some(_) => {
                // make_qx_quants(16, 32, scales, Ls, 1, sw) of every block, lane = block
                // (lanes past the last block see zeros: a flat group).
                let mut sv = [s.splat(0.0); 16];
                let mut wv = [s.splat(0.0); 16];
                for i in 0..16 {
                    sv[i] = s.load(&scales[i]);
                    wv[i] = s.load(&sw[i]);
                }
                let (d_block, ls) = make_qx_lanes(s, 32, &sv, &wv);
                let mut d = [0.0f32; 16];
                s.store(d_block, &mut d);
                let mut lsa = [[0i32; 16]; 16];
                for (i, v) in ls.iter().enumerate() {
                    s.istore(*v, &mut lsa[i]);
                }
                for t in 0..n {
                    let y = &mut y[BYTES * (b0 + t)..BYTES * (b0 + t + 1)];
                    let sc = &mut y[96..108];
                    sc.fill(0);
                    for (j, row) in lsa.iter().enumerate() {
                        put_scale(sc, j, row[t] as u8);
                    }
                    y[108..110].copy_from_slice(&f32_to_fp16(d[t]).to_le_bytes());
                }
            }
        }
        for (t, lt) in lts.iter().enumerate().take(n) {
            let b = b0 + t;
            finish(s, &x[QK_K * b..QK_K * (b + 1)], lt, &mut y[BYTES * b..BYTES * (b + 1)]);
        }
    }
}

#[inline(always)]
fn reference_path<S: Simd>(s: S, src: &[f32], dst: &mut [u8]) {
    blocks(s, src, None, dst)
}

#[inline(always)]
fn importance_path<S: Simd>(s: S, src: &[f32], n_per_row: usize, quant_weights: &[f32], dst: &mut [u8]) {
    blocks(s, src, Some((quant_weights, n_per_row / QK_K)), dst)
}

simd_entry! {
    /// `quantize_row_q3_K_ref` over whole blocks.
    pub(crate) fn quantize_ref(src: &[f32], dst: &mut [u8]) -> () => reference_path
}

simd_entry! {
    /// `quantize_row_q3_K_impl` over rows of `n_per_row`, one importance value per column.
    pub(crate) fn quantize_impl(src: &[f32], n_per_row: usize, quant_weights: &[f32], dst: &mut [u8]) -> () => importance_path
}
