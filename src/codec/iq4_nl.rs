//! IQ4_NL: blocks of 32 values as an fp16 scale `d` and 16 bytes of 4-bit indices into the
//! non-linear table [`KVALUES`] (`kvalues_iq4nl`; 18 bytes; low nibble value j, high nibble
//! value j + 16; value = `d * KVALUES[q]`).
//!
//! Owns `quantize_iq4_nl` as ggml runs it, importance or not: `quantize_row_iq4_nl_impl`
//! with `ntry = 7` (the importance-free case weighs by `x^2`, not the `ntry = -1` of
//! `quantize_row_iq4_nl_ref`, which `ggml_quantize_chunk` never runs), with
//! `best_index_int8`; and `dequantize_row_iq4_nl`. The super-block form of the same
//! function (IQ4_XS) is [`quantize_super_block`], shared with `iq4_xs.rs`.

use super::q2_k::GROUP_MAX_EPS;
use super::{f32_to_fp16, fp16_to_f32, nearest_int, read_u16};

pub const BLOCK: usize = 32;
pub const BYTES: usize = 18;

/// `kvalues_iq4nl`.
pub(crate) const KVALUES: [i8; 16] = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113];

/// `kvalues_iq4nl` as f32 (exact).
pub(crate) const KVALUES_F: [f32; 16] = {
    let mut t = [0.0f32; 16];
    let mut i = 0;
    while i < 16 {
        t[i] = KVALUES[i] as f32;
        i += 1;
    }
    t
};

/// `best_index_int8(16, kvalues_iq4nl, x)`: the binary search and its tie rule (the upper
/// neighbour unless the lower is strictly closer; NaN ends at 15, as the search does).
#[inline(always)]
pub(crate) fn best_index(x: f32) -> u8 {
    let val = &KVALUES_F;
    if x <= val[0] {
        return 0;
    }
    if x >= val[15] {
        return 15;
    }
    let (mut ml, mut mu) = (0usize, 15usize);
    while mu - ml > 1 {
        let mav = (ml + mu) / 2;
        if x < val[mav] {
            mu = mav;
        } else {
            ml = mav;
        }
    }
    if x - val[mu - 1] < val[mu] - x { (mu - 1) as u8 } else { mu as u8 }
}

/// Where `quantize_row_iq4_nl_impl` writes one super-block: `d`, the 4-bit indices, and
/// for IQ4_XS (`SB = 256`) the 6-bit sub-block scales.
pub(crate) struct Out<'a> {
    pub d: &'a mut [u8],
    pub qs: &'a mut [u8],
    pub scales_h: &'a mut u16,
    pub scales_l: &'a mut [u8],
}

/// `quantize_row_iq4_nl_impl(SB, 32, x, ..., kvalues_iq4nl, quant_weights, 7)` for one
/// super-block of `SB` values (32: IQ4_NL, 256: IQ4_XS). `quant_weights` are the block's
/// own `SB` values, or `None` for the `x^2` weights.
pub(crate) fn quantize_super_block<const SB: usize>(x: &[f32], quant_weights: Option<&[f32]>, out: Out<'_>) {
    const NTRY: i32 = 7;
    let x = &x[..SB];
    let mut sigma2 = 0.0f32;
    for &v in x {
        sigma2 += v * v;
    }
    sigma2 *= 2.0 / SB as f32;
    let nb = SB / BLOCK;
    let mut l = [0u8; SB];
    let mut scales = [0.0f32; 8];
    let mut weight = [0.0f32; BLOCK];
    let (mut max_scale, mut amax_scale) = (0.0f32, 0.0f32);
    for ib in 0..nb {
        let xb = &x[ib * BLOCK..(ib + 1) * BLOCK];
        let lb = &mut l[ib * BLOCK..(ib + 1) * BLOCK];
        match quant_weights {
            Some(qw) => {
                let qw = &qw[ib * BLOCK..(ib + 1) * BLOCK];
                for j in 0..BLOCK {
                    weight[j] = qw[j] * (sigma2 + xb[j] * xb[j]).sqrt();
                }
            }
            None => {
                for j in 0..BLOCK {
                    weight[j] = xb[j] * xb[j];
                }
            }
        }
        let (mut amax, mut max) = (0.0f32, 0.0f32);
        for &v in xb {
            let ax = v.abs();
            if ax > amax {
                amax = ax;
                max = v;
            }
        }
        if amax < GROUP_MAX_EPS {
            scales[ib] = 0.0;
            continue;
        }
        let mut d = -max / KVALUES_F[0];
        let mut id = 1.0 / d;
        let (mut sumqx, mut sumq2) = (0.0f32, 0.0f32);
        for j in 0..BLOCK {
            let li = best_index(id * xb[j]);
            lb[j] = li;
            let q = KVALUES_F[li as usize];
            let w = weight[j];
            sumqx += w * q * xb[j];
            sumq2 += w * q * q;
        }
        d = if sumq2 > 0.0 { sumqx / sumq2 } else { 0.0 };
        let mut best = d * sumqx;
        for itry in -NTRY..=NTRY {
            id = (itry + KVALUES[0] as i32) as f32 / max;
            sumqx = 0.0;
            sumq2 = 0.0;
            for j in 0..BLOCK {
                let q = KVALUES_F[best_index(id * xb[j]) as usize];
                let w = weight[j];
                sumqx += w * q * xb[j];
                sumq2 += w * q * q;
            }
            if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
                d = sumqx / sumq2;
                best = d * sumqx;
            }
        }
        scales[ib] = d;
        let abs_d = d.abs();
        if abs_d > amax_scale {
            amax_scale = abs_d;
            max_scale = d;
        }
    }
    if nb > 1 {
        *out.scales_h = 0;
        let d = -max_scale / 32.0;
        out.d.copy_from_slice(&f32_to_fp16(d).to_le_bytes());
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        for ib in 0..nb {
            let mut ls = nearest_int(id * scales[ib]).clamp(-32, 31);
            let dl = d * ls as f32;
            let idl = if dl != 0.0 { 1.0 / dl } else { 0.0 };
            let xb = &x[ib * BLOCK..(ib + 1) * BLOCK];
            for j in 0..BLOCK {
                l[ib * BLOCK + j] = best_index(idl * xb[j]);
            }
            ls += 32;
            let (l_l, l_h) = ((ls & 0xF) as u8, (ls >> 4) as u16);
            if ib % 2 == 0 {
                out.scales_l[ib / 2] = l_l;
            } else {
                out.scales_l[ib / 2] |= l_l << 4;
            }
            *out.scales_h |= l_h << (2 * (ib % 8));
        }
    } else {
        out.d.copy_from_slice(&f32_to_fp16(scales[0]).to_le_bytes());
        let id = if scales[0] != 0.0 { 1.0 / scales[0] } else { 0.0 };
        for j in 0..SB {
            l[j] = best_index(id * x[j]);
        }
    }
    for i in 0..SB / 32 {
        for j in 0..16 {
            out.qs[16 * i + j] = l[32 * i + j] | (l[32 * i + 16 + j] << 4);
        }
    }
}

/// `quantize_iq4_nl` for one row; `quant_weights` one per column, or `None`.
pub fn quantize_row(x: &[f32], y: &mut [u8], quant_weights: Option<&[f32]>) {
    for (ib, (xb, yb)) in x.chunks_exact(BLOCK).zip(y.chunks_exact_mut(BYTES)).enumerate() {
        let qw = quant_weights.map(|w| &w[ib * BLOCK..(ib + 1) * BLOCK]);
        let (d, qs) = yb.split_at_mut(2);
        let mut unused_h = 0u16;
        quantize_super_block::<BLOCK>(xb, qw, Out { d, qs, scales_h: &mut unused_h, scales_l: &mut [] });
    }
}

/// `dequantize_row_iq4_nl`.
pub fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(BYTES).zip(dst.chunks_exact_mut(BLOCK)) {
        let d = fp16_to_f32(read_u16(b, 0));
        for j in 0..16 {
            y[j] = d * KVALUES_F[(b[2 + j] & 0xF) as usize];
            y[j + 16] = d * KVALUES_F[(b[2 + j] >> 4) as usize];
        }
    }
}
