//! Q4_0: blocks of 32 values as an fp16 scale `d` and 16 bytes of 4-bit levels (18 bytes;
//! byte j holds value j in its low nibble and value j + 16 in its high one; value =
//! `d * (q - 8)`).
//!
//! Owns `quantize_q4_0` as ggml runs it: without importance `quantize_row_q4_0_ref` (the
//! signed absolute maximum maps to -8), with importance `quantize_row_q4_0_impl` per row
//! (`make_qx_quants` with `qw * sqrt(sigma2 + x^2)` weights, 19 trial scales); and
//! `dequantize_row_q4_0`. Also home of the helpers Q5_0 shares: [`make_qx_quants`] (the
//! weighted `rmse_type == 1` form) and [`cvtt_i32`], the x86-64 float-to-int conversion the
//! reference's `(int8_t)` / `(uint8_t)` casts compile to.

use super::q2_k::GROUP_MAX_EPS;
use super::{f32_to_fp16, fp16_to_f32, nearest_int, read_u16};

pub const BLOCK: usize = 32;
pub const BYTES: usize = 18;

/// `(int)f` as the reference build does it (`cvttss2si`): truncation toward zero, and
/// 0x80000000 for NaN and values outside the i32 range. The reference's casts to
/// `int8_t` / `uint8_t` keep the low byte of this.
#[inline(always)]
pub(crate) fn cvtt_i32(f: f32) -> i32 {
    if f.is_nan() || !(-2147483648.0..2147483648.0).contains(&f) { i32::MIN } else { f as i32 }
}

/// `MIN(top, (int8_t)f)` stored in a `uint8_t`, as the reference rounds `x * id + 8.5f`.
#[inline(always)]
pub(crate) fn min_i8(top: i8, f: f32) -> u8 {
    (cvtt_i32(f) as i8).min(top) as u8
}

/// `quantize_row_q4_0_ref` over whole blocks.
pub fn quantize_row_ref(x: &[f32], y: &mut [u8]) {
    for (xb, yb) in x.chunks_exact(BLOCK).zip(y.chunks_exact_mut(BYTES)) {
        let mut amax = 0.0f32;
        let mut max = 0.0f32;
        for &v in xb {
            if amax < v.abs() {
                amax = v.abs();
                max = v;
            }
        }
        let d = max / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        yb[..2].copy_from_slice(&f32_to_fp16(d).to_le_bytes());
        for j in 0..16 {
            let xi0 = min_i8(15, xb[j] * id + 8.5);
            let xi1 = min_i8(15, xb[j + 16] * id + 8.5);
            yb[2 + j] = xi0 | (xi1 << 4);
        }
    }
}

/// `make_qx_quants(N, nmax, x, L, 1, qw)` with weights (what Q4_0 and Q5_0 run): levels
/// `L = nmax + clamp(nearest_int(iscale * x), -nmax, nmax - 1)` for the scale of the signed
/// maximum and 18 neighbours, the best by weighted least squares; returns the scale.
pub(crate) fn make_qx_quants<const N: usize>(nmax: i32, x: &[f32; N], l: &mut [i8; N], qw: &[f32; N]) -> f32 {
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
    let mut iscale = -nmax as f32 / max;
    let mut sumlx = 0.0f32;
    let mut suml2 = 0.0f32;
    for i in 0..N {
        let li = nearest_int(iscale * x[i]).clamp(-nmax, nmax - 1);
        l[i] = (li + nmax) as i8;
        let w = qw[i];
        sumlx += w * x[i] * li as f32;
        suml2 += w * li as f32 * li as f32;
    }
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in -9i32..=9 {
        if is == 0 {
            continue;
        }
        iscale = -(nmax as f32 + 0.1f32 * is as f32) / max;
        sumlx = 0.0;
        suml2 = 0.0;
        for i in 0..N {
            let li = nearest_int(iscale * x[i]).clamp(-nmax, nmax - 1);
            let w = qw[i];
            sumlx += w * x[i] * li as f32;
            suml2 += w * li as f32 * li as f32;
        }
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for i in 0..N {
                l[i] = (nmax + nearest_int(iscale * x[i]).clamp(-nmax, nmax - 1)) as i8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// `sigma2` of `quantize_row_<type>_impl`: the row's mean square, summed in order.
pub(crate) fn row_sigma2(x: &[f32]) -> f32 {
    let mut sum_x2 = 0.0f32;
    for &v in x {
        sum_x2 += v * v;
    }
    sum_x2 / x.len() as f32
}

/// The weights of one block: `qw[j] * sqrt(sigma2 + x[j]^2)`.
#[inline(always)]
pub(crate) fn block_weights(xb: &[f32], qw: &[f32], sigma2: f32) -> [f32; BLOCK] {
    let mut w = [0.0f32; BLOCK];
    for j in 0..BLOCK {
        w[j] = qw[j] * (sigma2 + xb[j] * xb[j]).sqrt();
    }
    w
}

/// `quantize_row_q4_0_impl` for one row, `quant_weights` one per column.
pub fn quantize_row_impl(x: &[f32], y: &mut [u8], quant_weights: &[f32]) {
    let sigma2 = row_sigma2(x);
    for ((xb, yb), qw) in x.chunks_exact(BLOCK).zip(y.chunks_exact_mut(BYTES)).zip(quant_weights.chunks_exact(BLOCK)) {
        let weight = block_weights(xb, qw, sigma2);
        let mut l = [0i8; BLOCK];
        let d = make_qx_quants(8, xb.try_into().unwrap(), &mut l, &weight);
        yb[..2].copy_from_slice(&f32_to_fp16(d).to_le_bytes());
        for j in 0..16 {
            yb[2 + j] = (l[j] as u8) | ((l[j + 16] as u8) << 4);
        }
    }
}

/// `dequantize_row_q4_0`.
pub fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(BYTES).zip(dst.chunks_exact_mut(BLOCK)) {
        let d = fp16_to_f32(read_u16(b, 0));
        for j in 0..16 {
            y[j] = ((b[2 + j] & 0xF) as i32 - 8) as f32 * d;
            y[j + 16] = ((b[2 + j] >> 4) as i32 - 8) as f32 * d;
        }
    }
}
