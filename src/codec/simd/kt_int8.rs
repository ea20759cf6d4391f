//! kt-kernel INT8 per-row quantisation, lanes = values of a row: `max |w|` (NaN never
//! wins the scalar `if a > amax`, and a maximum of NaN-free lanes is exact in any order),
//! then per value the scalar's multiply, 1.5 * 2^23 round trip, clamp and truncation.

use super::x86::{Simd, simd_entry};

#[inline(always)]
fn row<S: Simd>(s: S, w: &[f32], q: &mut [i8]) -> f32 {
    let k = w.len().min(q.len());
    let main = k / S::LANES * S::LANES;
    let mut m = s.splat(0.0);
    for i in (0..main).step_by(S::LANES) {
        let a = s.abs(s.load(&w[i..]));
        m = s.select(s.gt(a, m), a, m);
    }
    let mut amax = s.reduce_max(m);
    for &v in &w[main..k] {
        let a = v.abs();
        if a > amax {
            amax = a;
        }
    }
    let dr = amax / 127.0;
    if dr == 0.0 {
        q[..k].fill(0);
        return dr;
    }
    let inv = 1.0f32 / dr;
    let (iv, c, lo, hi) = (s.splat(inv), s.splat(12582912.0f32), s.splat(-128.0), s.splat(127.0));
    // SAFETY: i8 and u8 have the same size and alignment, and every bit pattern is valid for both.
    let qb: &mut [u8] = unsafe { std::slice::from_raw_parts_mut(q.as_mut_ptr().cast::<u8>(), k) };
    for i in (0..main).step_by(S::LANES) {
        let x = s.mul(s.load(&w[i..]), iv);
        let r = s.sub(s.add(x, c), c);
        let r = s.select(s.lt(r, lo), lo, r);
        let r = s.select(s.gt(r, hi), hi, r);
        s.store_low_u8(s.cvtt(r), &mut qb[i..]);
    }
    for (o, &v) in q[main..k].iter_mut().zip(&w[main..k]) {
        let x = v * inv;
        let r = (x + 12582912.0f32) - 12582912.0f32;
        *o = r.clamp(-128.0, 127.0) as i8;
    }
    dr
}

#[inline(always)]
fn rows<S: Simd>(s: S, w: &[f32], k: usize, q: &mut [i8], d: &mut [f32]) {
    for ((wr, qr), dr) in w.chunks_exact(k).zip(q.chunks_exact_mut(k)).zip(d.iter_mut()) {
        *dr = row(s, wr, qr);
    }
}

simd_entry! {
    /// Rows of `k` values: `q` per-row INT8, `d` one scale per row.
    pub(crate) fn quantize(w: &[f32], k: usize, q: &mut [i8], d: &mut [f32]) -> () => rows
}
