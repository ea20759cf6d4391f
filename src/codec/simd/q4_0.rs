//! Q4_0 and Q5_0 quantisation (the signed-maximum types), and the lane helpers the other
//! 32-value types (Q4_1, Q5_1, IQ4_NL, IQ4_XS) share.
//!
//! Reference path (`quantize_row_q{4,5}_0_ref`): lanes = the values of one block. The
//! absolute maximum is a maximum (exact in any order once NaN is ruled out: a block holding
//! NaN goes to the scalar code), and the signed `max` the scalar scan keeps is the value at
//! the first index holding it; the rest is per value (`(int8_t)(x * id + 8.5f)` as the
//! low byte of `cvttss2si`, then `MIN(15, ·)` on the signed byte).
//!
//! Importance path (`quantize_row_q{4,5}_0_impl`): lanes = blocks, any blocks of the input
//! (rows end on block boundaries; each lane carries its row's `sigma2`, computed with lanes
//! = rows, and its column's importance). Lane j runs `make_qx_quants` on block j
//! ([`super::kquants::make_qx_lanes`], shared with the k-quants' sub-blocks): the scan, the
//! first pass and the 18 trial scales with their sequential sums, `if` branches as masks.

use super::kquants::make_qx_lanes;
use super::x86::{Simd, simd_entry};
use crate::codec::{f32_to_fp16, q4_0, q5_0};

pub(crate) const BLOCK: usize = 32;

/// Inputs are quantised in pieces of whole rows of at most this many values (more when a
/// row is longer), so every gather index fits an i32.
pub(crate) const PIECE: usize = 1 << 24;

/// Whole rows of `src` (and the matching `dst`) in pieces of about [`PIECE`] values.
pub(crate) fn pieces<'a>(src: &'a [f32], dst: &'a mut [u8], n_per_row: usize, row_bytes: usize) -> impl Iterator<Item = (&'a [f32], &'a mut [u8])> {
    let rows = (PIECE / n_per_row).max(1);
    src.chunks(rows * n_per_row).zip(dst.chunks_mut(rows * row_bytes))
}

/// `GGML_FP32_TO_FP16` as the reference computes it without F16C (`fp32_to_fp16`: the
/// scale-to-infinity / scale-to-zero rounding trick, round to nearest even), inline and
/// call-free, the same bits as [`f32_to_fp16`] for every non-NaN value (NaN goes there).
#[inline(always)]
pub(crate) fn fp16(f: f32) -> u16 {
    if f.is_nan() {
        return f32_to_fp16(f);
    }
    let base = (f.abs() * f32::from_bits(0x7780_0000)) * f32::from_bits(0x0880_0000);
    let w = f.to_bits();
    let shl1_w = w.wrapping_add(w);
    let sign = w & 0x8000_0000;
    let bias = (shl1_w & 0xFF00_0000).max(0x7100_0000);
    let bits = (f32::from_bits((bias >> 1) + 0x0780_0000) + base).to_bits();
    let nonsign = ((bits >> 13) & 0x7C00) + (bits & 0x0FFF);
    ((sign >> 16) | nonsign) as u16
}

/// `MIN(top, (int8_t)t)` stored as `uint8_t`, per lane (`t` from `cvttss2si`): the low byte
/// sign-extended (`(b ^ 0x80) - 0x80`), then the signed minimum. Only the low byte of a lane
/// is the result (the callers keep low bits only).
#[inline(always)]
pub(crate) fn min_i8<S: Simd>(s: S, t: S::I, top: i32) -> S::I {
    let sb = s.isub(s.ixor(s.iand(t, s.isplat(0xFF)), s.isplat(0x80)), s.isplat(0x80));
    s.imin(sb, s.isplat(top))
}

/// Lane i = `v[bases[i] + k]` for k in 0..32 (element k of the block starting at
/// `bases[i]`).
#[inline(always)]
pub(crate) fn gather32<S: Simd>(s: S, v: &[f32], bases: &[i32; 16]) -> [S::F; 32] {
    assert!(bases[..S::LANES].iter().all(|&b| b >= 0 && b as usize + BLOCK <= v.len()));
    let bv = s.iload(bases);
    let mut out = [s.splat(0.0); 32];
    for (k, o) in out.iter_mut().enumerate() {
        // SAFETY: every lane index is bases[i] + k with bases[i] >= 0 and
        // bases[i] + 32 <= v.len() (asserted above), so it is in 0..v.len().
        *o = unsafe { s.gather(v, s.iadd(bv, s.isplat(k as i32))) };
    }
    out
}

/// `sum(x^2) * scale` over each run of `n` values of `v` (sequential within a lane, lanes
/// = runs): the rows' `sum_x2 / n_per_row` with `scale = None`, or IQ4_XS's super-blocks'
/// `sigma2 * (2/256)`.
#[inline(always)]
pub(crate) fn sums_of_squares<S: Simd>(s: S, v: &[f32], n: usize, scale: Option<f32>) -> Vec<f32> {
    let runs = v.len() / n;
    let mut out = vec![0.0f32; runs];
    for first in (0..runs).step_by(S::LANES) {
        let mut bases = [0i32; 16];
        for (lane, b) in bases[..S::LANES].iter_mut().enumerate() {
            *b = i32::try_from(n * (first + lane).min(runs - 1)).unwrap();
        }
        assert!(bases[..S::LANES].iter().all(|&b| b as usize + n <= v.len()));
        let bv = s.iload(&bases);
        let mut acc = s.splat(0.0);
        for j in 0..n {
            // SAFETY: lane indices are bases[i] + j < bases[i] + n <= v.len() (asserted).
            let x = unsafe { s.gather(v, s.iadd(bv, s.isplat(j as i32))) };
            acc = s.add(acc, s.mul(x, x));
        }
        let r = match scale {
            None => s.div(acc, s.splat(n as f32)),
            Some(k) => s.mul(acc, s.splat(k)),
        };
        let mut t = [0.0f32; 16];
        s.store(r, &mut t);
        let count = (runs - first).min(S::LANES);
        out[first..first + count].copy_from_slice(&t[..count]);
    }
    out
}

/// Lanes = blocks `first..first + LANES` of a piece (the last block repeated past the end):
/// the block bases in `src`, the importance bases (block within its row) and the index of
/// the row.
#[inline(always)]
pub(crate) fn block_bases(first: usize, total: usize, blocks_per_row: usize, lanes: usize) -> ([i32; 16], [i32; 16], [usize; 16]) {
    let (mut xb, mut wb, mut row) = ([0i32; 16], [0i32; 16], [0usize; 16]);
    for lane in 0..lanes {
        let b = (first + lane).min(total - 1);
        xb[lane] = i32::try_from(BLOCK * b).unwrap();
        wb[lane] = i32::try_from(BLOCK * (b % blocks_per_row)).unwrap();
        row[lane] = b / blocks_per_row;
    }
    (xb, wb, row)
}

/// The weights `qw * sqrt(sigma2 + x^2)` of a lane-per-block group.
#[inline(always)]
pub(crate) fn weights<S: Simd>(s: S, x: &[S::F; 32], qw: &[S::F; 32], sigma2: S::F) -> [S::F; 32] {
    let mut w = [s.splat(0.0); 32];
    for k in 0..BLOCK {
        w[k] = s.mul(qw[k], s.sqrt(s.add(sigma2, s.mul(x[k], x[k]))));
    }
    w
}

/// [`fp16`] per lane (no NaN lanes): the same integer and f32 steps, the unsigned
/// `bias < 0x71000000` done on `bias >> 1`.
#[inline(always)]
pub(crate) fn fp16_lanes<S: Simd>(s: S, f: S::F) -> S::I {
    let base = s.mul(s.mul(s.abs(f), s.from_bits(s.isplat(0x7780_0000))), s.from_bits(s.isplat(0x0880_0000)));
    let w = s.to_bits(f);
    let shl1_w = s.iadd(w, w);
    let sign = s.iand(w, s.isplat(i32::MIN));
    let half_bias = s.imax(s.shr::<1>(s.iand(shl1_w, s.isplat(0xFF00_0000u32 as i32))), s.isplat(0x3880_0000));
    let bits = s.to_bits(s.add(s.from_bits(s.iadd(half_bias, s.isplat(0x0780_0000))), base));
    let nonsign = s.iadd(s.iand(s.shr::<13>(bits), s.isplat(0x7C00)), s.iand(bits, s.isplat(0x0FFF)));
    s.ior(s.shr::<16>(sign), nonsign)
}

/// The reference paths take blocks `LANES` at a time: per block the vector work and the
/// reduction (the blocks' chains are independent and overlap), then the scales of all of
/// them in lanes (`d`, `1/d`, the fp16 conversions), then per block the levels.
#[inline(always)]
fn signed_max_ref<S: Simd, const Q5: bool>(s: S, src: &[f32], dst: &mut [u8]) {
    let (bytes, nmax): (usize, i32) = if Q5 { (q5_0::BYTES, 16) } else { (q4_0::BYTES, 8) };
    let n = BLOCK / S::LANES;
    let half = n / 2;
    let top = 2 * nmax - 1;
    for (gi, (xg, yg)) in src.chunks(S::LANES * BLOCK).zip(dst.chunks_mut(S::LANES * bytes)).enumerate() {
        prefetch_group(s, src, gi + 2);
        let nblk = xg.len() / BLOCK;
        let mut max = [0.0f32; 16];
        let mut nan = 0u32;
        for (g, xb) in xg.chunks_exact(BLOCK).enumerate() {
            let mut v = [s.splat(0.0); 4];
            for (i, vi) in v[..n].iter_mut().enumerate() {
                *vi = s.load(&xb[i * S::LANES..]);
            }
            let mut m = s.abs(v[0]);
            let mut nn = s.ne(v[0], v[0]);
            for vi in &v[1..n] {
                let a = s.abs(*vi);
                m = s.select(s.gt(a, m), a, m);
                nn = s.mor(nn, s.ne(*vi, *vi));
            }
            if s.any(nn) {
                nan |= 1 << g;
                continue;
            }
            let amax = s.reduce_max(m);
            // The scan starts from amax = max = 0 and takes a value only when strictly
            // larger: the signed value at the first index holding the maximum.
            if amax > 0.0 {
                let a = s.splat(amax);
                let mut bits = 0u64;
                for (i, vi) in v[..n].iter().enumerate() {
                    bits |= (s.mbits(s.eq(s.abs(*vi), a)) as u64) << (i * S::LANES);
                }
                max[g] = xb[bits.trailing_zeros() as usize];
            }
        }
        let zero = s.splat(0.0);
        let d = s.div(s.load(&max), s.splat(-(nmax as f32)));
        let mut id = [0.0f32; 16];
        s.store(s.select(s.ne(d, zero), s.div(s.splat(1.0), d), zero), &mut id);
        let mut dh = [0u16; 16];
        s.store_low_u16(fp16_lanes(s, d), &mut dh);
        for (g, (xb, yb)) in xg.chunks_exact(BLOCK).zip(yg.chunks_exact_mut(bytes)).enumerate().take(nblk) {
            if nan & (1 << g) != 0 {
                if Q5 {
                    q5_0::quantize_row_ref(xb, yb)
                } else {
                    q4_0::quantize_row_ref(xb, yb)
                }
                continue;
            }
            yb[..2].copy_from_slice(&dh[g].to_le_bytes());
            let (idv, off) = (s.splat(id[g]), s.splat(nmax as f32 + 0.5));
            let mut q = [s.isplat(0); 4];
            for i in 0..n {
                q[i] = min_i8(s, s.cvtt(s.add(s.mul(s.load(&xb[i * S::LANES..]), idv), off)), top);
            }
            if Q5 {
                let mut qh = 0u32;
                for (i, qi) in q[..n].iter().enumerate() {
                    qh |= s.mbits(s.ieq(s.iand(*qi, s.isplat(16)), s.isplat(16))) << (i * S::LANES);
                }
                yb[2..6].copy_from_slice(&qh.to_le_bytes());
                for k in 0..half {
                    let r = s.ior(s.iand(q[k], s.isplat(15)), s.shl::<4>(s.iand(q[k + half], s.isplat(15))));
                    s.store_low_u8(r, &mut yb[6 + k * S::LANES..]);
                }
            } else {
                for k in 0..half {
                    s.store_low_u8(s.ior(q[k], s.shl::<4>(q[k + half])), &mut yb[2 + k * S::LANES..]);
                }
            }
        }
    }
}

#[inline(always)]
fn signed_max_impl<S: Simd, const Q5: bool>(s: S, src: &[f32], n_per_row: usize, quant_weights: &[f32], dst: &mut [u8]) {
    let (bytes, nmax): (usize, i32) = if Q5 { (q5_0::BYTES, 16) } else { (q4_0::BYTES, 8) };
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
            let (scale, l) = make_qx_lanes::<S, 32>(s, nmax, &x, &w);
            let mut sc = [0.0f32; 16];
            s.store(scale, &mut sc);
            let mut lv = [[0i32; 16]; 32];
            for k in 0..BLOCK {
                s.istore(l[k], &mut lv[k]);
            }
            for lane in 0..(total - first).min(S::LANES) {
                let y = &mut dst[(first + lane) * bytes..(first + lane + 1) * bytes];
                y[..2].copy_from_slice(&fp16(sc[lane]).to_le_bytes());
                if Q5 {
                    q5_0::pack5(|j| lv[j][lane] as u8, &mut y[2..]);
                } else {
                    for j in 0..16 {
                        y[2 + j] = lv[j][lane] as u8 | ((lv[j + 16][lane] as u8) << 4);
                    }
                }
            }
        }
    }
}

/// The reference paths do so little per byte that their loads wait on memory: ask for group
/// `g` (of `LANES` blocks of `src`) ahead of its use, one hint per cache line (a hint reads
/// nothing and cannot fault).
#[inline(always)]
pub(super) fn prefetch_group<S: Simd>(_s: S, src: &[f32], g: usize) {
    let ahead = &src[(g * S::LANES * BLOCK).min(src.len())..];
    for line in ahead.chunks(16).take(S::LANES * BLOCK / 16) {
        // SAFETY: a prefetch hint of an address inside `src`.
        unsafe { std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(line.as_ptr().cast()) };
    }
}

#[inline(always)]
fn q4_0_ref<S: Simd>(s: S, src: &[f32], dst: &mut [u8]) {
    signed_max_ref::<S, false>(s, src, dst)
}

#[inline(always)]
fn q5_0_ref<S: Simd>(s: S, src: &[f32], dst: &mut [u8]) {
    signed_max_ref::<S, true>(s, src, dst)
}

#[inline(always)]
fn q4_0_impl<S: Simd>(s: S, src: &[f32], n_per_row: usize, quant_weights: &[f32], dst: &mut [u8]) {
    signed_max_impl::<S, false>(s, src, n_per_row, quant_weights, dst)
}

#[inline(always)]
fn q5_0_impl<S: Simd>(s: S, src: &[f32], n_per_row: usize, quant_weights: &[f32], dst: &mut [u8]) {
    signed_max_impl::<S, true>(s, src, n_per_row, quant_weights, dst)
}

simd_entry! {
    /// `quantize_row_q4_0_ref` over whole blocks.
    pub(crate) fn quantize_q4_0_ref(src: &[f32], dst: &mut [u8]) -> () => q4_0_ref
}

simd_entry! {
    /// `quantize_row_q5_0_ref` over whole blocks.
    pub(crate) fn quantize_q5_0_ref(src: &[f32], dst: &mut [u8]) -> () => q5_0_ref
}

simd_entry! {
    /// `quantize_row_q4_0_impl` over rows of `n_per_row`, one importance value per column.
    pub(crate) fn quantize_q4_0_impl(src: &[f32], n_per_row: usize, quant_weights: &[f32], dst: &mut [u8]) -> () => q4_0_impl
}

simd_entry! {
    /// `quantize_row_q5_0_impl` over rows of `n_per_row`, one importance value per column.
    pub(crate) fn quantize_q5_0_impl(src: &[f32], n_per_row: usize, quant_weights: &[f32], dst: &mut [u8]) -> () => q5_0_impl
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fp16_lanes_match_the_codec_conversion() {
        use crate::codec::simd::Level;
        let vals: Vec<f32> = (0..=u32::MAX).step_by(4099).map(f32::from_bits).filter(|v| !v.is_nan()).collect();
        let want: Vec<u16> = vals.iter().map(|&v| f32_to_fp16(v)).collect();
        #[inline(always)]
        fn run<S: Simd>(s: S, vals: &[f32]) -> Vec<u16> {
            let mut out = vec![0u16; vals.len() / S::LANES * S::LANES];
            for (x, o) in vals.chunks_exact(S::LANES).zip(out.chunks_exact_mut(S::LANES)) {
                s.store_low_u16(fp16_lanes(s, s.load(x)), o);
            }
            out
        }
        simd_entry! {
            fn lanes(vals: &[f32]) -> Vec<u16> => run
        }
        for level in [Level::Avx2, Level::Avx512] {
            if let Some(got) = lanes(level, &vals) {
                assert!(got.iter().zip(&want).all(|(a, b)| a == b), "{level}");
            }
        }
    }

    #[test]
    fn inline_fp16_matches_the_codec_conversion() {
        let mut specials =
            vec![0.0f32, -0.0, f32::INFINITY, f32::NEG_INFINITY, f32::MAX, f32::MIN_POSITIVE, 65504.0, 65520.0, 65519.99, 6.1e-5, 5.96e-8, 2.98e-8, 2.99e-8];
        specials.extend(specials.clone().iter().map(|v| -v));
        for v in specials {
            assert_eq!(fp16(v), f32_to_fp16(v), "{v:e}");
        }
        // Every 251st bit pattern (all exponents, mantissas in every residue) and the
        // neighbourhood of every fp16 rounding boundary.
        for bits in (0..=u32::MAX).step_by(251).chain((0..1u32 << 16).flat_map(|h| {
            let t = (h << 13).wrapping_add(0x3800_0000);
            [t.wrapping_sub(1), t, t.wrapping_add(1), t | 0x1000, (t | 0x1000) - 1, (t | 0x1000) + 1]
        })) {
            let v = f32::from_bits(bits);
            if !v.is_nan() {
                assert_eq!(fp16(v), f32_to_fp16(v), "{bits:#x}");
            }
        }
    }
}
