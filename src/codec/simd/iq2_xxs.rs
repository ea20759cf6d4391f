//! IQ2_XXS quantisation with the neighbour search across lanes.
//!
//! Profile of the scalar quantiser (perf, 8 M weights, unit importance): 76 % in
//! `iq2_find_best_neighbour`, which scans a list of 1..150 grid points (18 on average for
//! the points the search can reach) for the least weighted distance. Here each lane takes
//! one candidate of the list and computes its distance with the scalar's operations in
//! its order; the first lane holding the least distance below `f32::MAX` wins, which is
//! the candidate the scalar's strict `<` scan keeps. The block-level work around it stays
//! the scalar code (compiled for the level).

use super::x86::{simd_entry, Simd};
use crate::codec::iq2_xxs;
use crate::codec::CodecError;

/// [`iq2_xxs::find_best_neighbour`], candidates across lanes. `list` runs to the end of
/// the table (which ends in 16 zeros), so every load of `LANES` keys is in bounds.
#[inline(always)]
pub(crate) fn best_neighbour<S: Simd>(s: S, list: &[u16], xval: &[f32], weight: &[f32], scale: f32) -> Option<u16> {
    let n = list[0] as usize;
    let sc = s.splat(scale);
    let mut xv = [sc; 8];
    let mut wv = [sc; 8];
    for i in 0..8 {
        xv[i] = s.splat(xval[i]);
        wv[i] = s.splat(weight[i]);
    }
    let (one, three, fmax, inf) = (s.isplat(1), s.isplat(3), s.splat(f32::MAX), s.splat(f32::INFINITY));
    let mut best = f32::MAX;
    let mut best_key = None;
    let mut c0 = 0;
    while c0 < n {
        let keys = s.load_u16(&list[1 + c0..]);
        let mut d2 = s.splat(0.0);
        for (i, (&x, &w)) in xv.iter().zip(&wv).enumerate() {
            let level = s.iand(s.shrv(keys, s.isplat(2 * i as i32)), three);
            let g = s.cvt(s.ior(s.shl::<1>(level), one));
            let diff = s.sub(s.mul(sc, g), x);
            d2 = s.add(d2, s.mul(s.mul(w, diff), diff));
        }
        let valid = s.mand(s.first(n - c0), s.lt(d2, fmax));
        let d2 = s.select(valid, d2, inf);
        let m = s.reduce_min(d2);
        if m < best {
            best = m;
            let lane = s.mbits(s.mand(valid, s.eq(d2, s.splat(m)))).trailing_zeros() as usize;
            best_key = Some(list[1 + c0 + lane]);
        }
        c0 += S::LANES;
    }
    best_key
}

#[derive(Clone, Copy)]
struct Lanes<S>(S);

impl<S: Simd> iq2_xxs::NeighbourSearch for Lanes<S> {
    #[inline(always)]
    fn search(self, list: &[u16], xval: &[f32], weight: &[f32], scale: f32) -> Option<u16> {
        best_neighbour(self.0, list, xval, weight, scale)
    }
}

#[inline(always)]
fn rows<S: Simd>(s: S, src: &[f32], n_per_row: usize, importance: &[f32], dst: &mut [u8]) -> Result<(), CodecError> {
    let row_bytes = n_per_row / 256 * iq2_xxs::BYTES;
    for (x, y) in src.chunks_exact(n_per_row).zip(dst.chunks_exact_mut(row_bytes)) {
        iq2_xxs::quantize_row_with(x, y, importance, Lanes(s))?;
    }
    Ok(())
}

simd_entry! {
    /// Rows of `n_per_row` (a multiple of 256) with one importance value per column.
    pub(crate) fn quantize(src: &[f32], n_per_row: usize, importance: &[f32], dst: &mut [u8]) -> Result<(), CodecError> => rows
}
