//! Q6_K quantisation with the sixteen 16-value sub-blocks of a block across lanes.
//!
//! The scalar quantiser's time is `make_qx_quants` (19 candidate scales per sub-block,
//! each a pass of rounding and two sequential sums): lane j carries sub-block j through
//! exactly that ([`super::kquants::make_qx_lanes`]). The rest of a block (the int8 scales,
//! scalar; the requantisation and the packing, lanes = consecutive values) follows
//! `q6_k::finish`.

use super::kquants::{gather_subblocks, make_qx_lanes};
use super::x86::{Simd, iclamp, nearest_int, simd_entry};
use crate::codec::kquants::{GROUP_MAX_EPS, QK_K};
use crate::codec::q6_k::BYTES;
use crate::codec::{f32_to_fp16, fp16_to_f32};

/// `q6_k::finish` from the lanes' results: `lt[i][j]` is level i of sub-block j.
#[inline(always)]
fn finish<S: Simd>(s: S, x: &[f32], scales: &[f32; 16], lt: &[[i32; 16]; 16], y: &mut [u8]) {
    let mut max_scale = 0.0f32;
    let mut max_abs_scale = 0.0f32;
    for &sc in scales {
        let a = sc.abs();
        if a > max_abs_scale {
            max_abs_scale = a;
            max_scale = sc;
        }
    }
    let y = &mut y[..BYTES];
    if max_abs_scale < GROUP_MAX_EPS {
        y.fill(0);
        y[208..210].copy_from_slice(&f32_to_fp16(0.0).to_le_bytes());
        return;
    }
    let iscale = -128.0f32 / max_scale;
    let d_bits = f32_to_fp16(1.0 / iscale);
    y[208..210].copy_from_slice(&d_bits.to_le_bytes());
    for ib in 0..16 {
        y[192 + ib] = nearest_int_scalar(iscale * scales[ib]).min(127) as i8 as u8;
    }
    let dd = fp16_to_f32(d_bits);
    let mut l = [0i32; QK_K];
    for j in 0..16 {
        let d = dd * y[192 + j] as i8 as f32;
        if d == 0.0 {
            for ii in 0..16 {
                l[16 * j + ii] = lt[ii][j];
            }
            continue;
        }
        let dv = s.splat(d);
        for k in (0..16).step_by(S::LANES) {
            let q = iclamp(s, nearest_int(s, s.div(s.load(&x[16 * j + k..]), dv)), -32, 31);
            s.istore(s.iadd(q, s.isplat(32)), &mut l[16 * j + k..]);
        }
    }
    let m4 = s.isplat(0xF);
    for h in 0..2 {
        let (j, ql, qh) = (128 * h, 64 * h, 128 + 32 * h);
        for k in (0..32).step_by(S::LANES) {
            let a = s.iload(&l[j + k..]);
            let b = s.iload(&l[j + k + 32..]);
            let c = s.iload(&l[j + k + 64..]);
            let e = s.iload(&l[j + k + 96..]);
            s.store_low_u8(s.ior(s.iand(a, m4), s.shl::<4>(s.iand(c, m4))), &mut y[ql + k..]);
            s.store_low_u8(s.ior(s.iand(b, m4), s.shl::<4>(s.iand(e, m4))), &mut y[ql + k + 32..]);
            let hi = s.ior(s.ior(s.shr::<4>(a), s.shl::<2>(s.shr::<4>(b))), s.ior(s.shl::<4>(s.shr::<4>(c)), s.shl::<6>(s.shr::<4>(e))));
            s.store_low_u8(hi, &mut y[qh + k..]);
        }
    }
}

#[inline(always)]
fn nearest_int_scalar(f: f32) -> i32 {
    crate::codec::nearest_int(f)
}

/// Whole blocks; `qw`: the importance and the blocks per row (block b's weights are
/// those of column block `b % blocks_per_row`), or `None` for the reference path.
#[inline(always)]
fn blocks<S: Simd>(s: S, x: &[f32], qw: Option<(&[f32], usize)>, y: &mut [u8]) {
    let starts: [i32; 16] = std::array::from_fn(|k| 16 * k as i32);
    for (b, (xb, yb)) in x.chunks_exact(QK_K).zip(y.chunks_exact_mut(BYTES)).enumerate() {
        let mut scales = [0.0f32; 16];
        let mut lt = [[0i32; 16]; 16];
        for first in (0..16).step_by(S::LANES) {
            let xs = gather_subblocks::<S, 16>(s, &xb[16 * first..], &starts);
            let ws = match qw {
                None => {
                    // A loop, not `xs.map(..)`: a closure would not inherit the target features.
                    let mut w = xs;
                    for v in &mut w {
                        *v = s.mul(*v, *v);
                    }
                    w
                }
                Some((q, bpr)) => gather_subblocks::<S, 16>(s, &q[QK_K * (b % bpr) + 16 * first..QK_K * (b % bpr + 1)], &starts),
            };
            let (scale, l) = make_qx_lanes(s, 32, &xs, &ws);
            s.store(scale, &mut scales[first..]);
            for (i, li) in l.iter().enumerate() {
                s.istore(*li, &mut lt[i][first..]);
            }
        }
        finish(s, xb, &scales, &lt, yb);
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
    /// `quantize_row_q6_K_ref` over whole blocks.
    pub(crate) fn quantize_ref(src: &[f32], dst: &mut [u8]) -> () => reference_path
}

simd_entry! {
    /// `quantize_row_q6_K_impl` over rows of `n_per_row`, one importance value per column.
    pub(crate) fn quantize_impl(src: &[f32], n_per_row: usize, quant_weights: &[f32], dst: &mut [u8]) -> () => importance_path
}
