//! Q8_0 quantisation, lanes = the values of a block.
//!
//! `amax` is a maximum (exact in any order once NaN is ruled out: a block holding NaN goes
//! to the scalar code, whose `MAX` chain depends on where the NaN sits); the rest is per
//! value: `roundf(x * id)` (ties away from zero, from `trunc` and the exact fraction),
//! truncated to i32 as `cvttss2si`, low byte kept.

use super::x86::{Simd, simd_entry};
use crate::codec::f32_to_fp16;
use crate::codec::q8_0::{self, BLOCK, BYTES};

/// `roundf` per lane: `trunc(x)`, then one away from zero when `|x - trunc(x)| >= 0.5`
/// (the fraction is exact; infinities and NaN stay as they are).
#[inline(always)]
pub(crate) fn round_away<S: Simd>(s: S, x: S::F) -> S::F {
    let t = s.trunc(x);
    let f = s.sub(x, t);
    let one = s.from_bits(s.ior(s.to_bits(s.splat(1.0)), s.iand(s.to_bits(x), s.isplat(i32::MIN))));
    s.select(s.ge(s.abs(f), s.splat(0.5)), s.add(t, one), t)
}

#[inline(always)]
fn blocks<S: Simd>(s: S, src: &[f32], dst: &mut [u8]) {
    for (xb, yb) in src.chunks_exact(BLOCK).zip(dst.chunks_exact_mut(BYTES)) {
        let n = BLOCK / S::LANES;
        let mut v = [s.splat(0.0); 4];
        for (i, vi) in v[..n].iter_mut().enumerate() {
            *vi = s.load(&xb[i * S::LANES..]);
        }
        let mut m = s.abs(v[0]);
        let mut nan = s.ne(v[0], v[0]);
        for vi in &v[1..n] {
            let a = s.abs(*vi);
            m = s.select(s.gt(a, m), a, m);
            nan = s.mor(nan, s.ne(*vi, *vi));
        }
        if s.any(nan) {
            q8_0::quantize_row(xb, yb);
            continue;
        }
        let amax = s.reduce_max(m);
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        yb[..2].copy_from_slice(&f32_to_fp16(d).to_le_bytes());
        let idv = s.splat(id);
        for (i, vi) in v[..n].iter().enumerate() {
            let q = s.cvtt(round_away(s, s.mul(*vi, idv)));
            s.store_low_u8(q, &mut yb[2 + i * S::LANES..]);
        }
    }
}

simd_entry! {
    /// `quantize_row_q8_0_ref` over whole blocks.
    pub(crate) fn quantize(src: &[f32], dst: &mut [u8]) -> () => blocks
}
