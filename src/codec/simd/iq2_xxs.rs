//! IQ2_XXS quantisation, lanes = 32-value blocks (8 per 256-value block; AVX2 takes one
//! 256-value block per batch, AVX-512 two), with the neighbour search across lanes.
//!
//! Profile of the scalar quantiser (perf, 8 M weights, unit importance): 76 % in
//! `iq2_find_best_neighbour`, 11 % in the rest of the block loop, 5 % `make_qp_quants`,
//! 5 % building the tables at start-up (now done by build.rs). Here each lane carries one
//! 32-value block through the scalar sequence: weights, the sign-parity flip (the argmin
//! with per-lane masks), `make_qp_quants` (its refinement loop runs while any lane still
//! changes, finished lanes masked), the 13-scale search and the final pass, with every
//! sum sequential within its lane. Where a lane's point is off the grid, its neighbour
//! list is scanned candidate-parallel: each lane of the vector takes one candidate and
//! computes its distance with the scalar's operations in its order; among the least
//! distances below `f32::MAX` the first in list order wins, as the scalar's strict `<`
//! scan has it. The reference's abort paths (no finite distance, a point off the grid)
//! send the batch to the scalar code, which reports them.
//!
//! After this, with AVX-512, the neighbour scans take about a third of the time and the
//! 13-scale loop's per-lane sums and rounding most of the rest (measured by switching
//! parts off); the scans are short (median 14 candidates) and data-dependent, so their
//! cost is latency and branches more than arithmetic.
//!
//! (No closures over the token in kernels: a closure is compiled without the enclosing
//! function's target features, so its intrinsics would become calls.)

use super::x86::{Simd, iclamp, nearest_int, simd_entry};
use crate::codec::iq2_xxs::{self, BYTES};
use crate::codec::q2_k::{GROUP_MAX_EPS, QK_K};
use crate::codec::{CodecError, cmax, f32_to_fp16};

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
    // Each lane keeps its own first strict minimum (and its candidate index) over the
    // candidates it sees; one reduction at the end picks, among the lanes holding the least
    // value, the smallest candidate index: the candidate the scalar scan keeps.
    let mut bestv = inf;
    let mut besti = s.isplat(i32::MAX);
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
        let upd = s.lt(d2, bestv);
        bestv = s.select(upd, d2, bestv);
        besti = s.iselect(upd, s.iadd(s.iota(), s.isplat(c0 as i32)), besti);
        c0 += S::LANES;
    }
    // Lanes hold values below f32::MAX or infinity, so this is "no candidate at all".
    let m = s.reduce_min(bestv);
    if m == f32::INFINITY {
        return None;
    }
    let mut idx = [0i32; 16];
    s.istore(besti, &mut idx);
    let mut bits = s.mbits(s.eq(bestv, s.splat(m)));
    let mut first = i32::MAX;
    while bits != 0 {
        first = first.min(idx[bits.trailing_zeros() as usize]);
        bits &= bits - 1;
    }
    Some(list[1 + first as usize])
}

#[derive(Clone, Copy)]
struct Lanes<S>(S);

impl<S: Simd> iq2_xxs::NeighbourSearch for Lanes<S> {
    #[inline(always)]
    fn search(self, list: &[u16], xval: &[f32], weight: &[f32], scale: f32) -> Option<u16> {
        best_neighbour(self.0, list, xval, weight, scale)
    }
}

/// `make_qp_quants::<32>(4, ...)` for LANES blocks (element i of every block in `x[i]`).
/// `l` gets the levels as the reference's `uint8_t` array holds them (wrapped to 0..=255).
#[inline(always)]
fn make_qp_lanes<S: Simd>(s: S, x: &[S::F; 32], w: &[S::F; 32], l: &mut [S::I; 32]) -> S::F {
    const NMAX: i32 = 4;
    let zero = s.splat(0.0);
    let byte = s.isplat(0xFF);
    let nmaxi = s.isplat(NMAX);
    let mut max = zero;
    for v in x {
        max = s.select(s.gt(max, *v), max, *v);
    }
    let flat = s.lt(max, s.splat(GROUP_MAX_EPS));
    let mut iscale = s.div(s.splat(NMAX as f32), max);
    for i in 0..32 {
        l[i] = s.iand(nearest_int(s, s.mul(iscale, x[i])), byte);
    }
    let scale = s.div(s.splat(1.0), iscale);
    let mut best_mse = zero;
    for i in 0..32 {
        let diff = s.sub(x[i], s.mul(scale, s.cvt(l[i])));
        best_mse = s.add(best_mse, s.mul(s.mul(w[i], diff), diff));
    }
    for is in -4i32..=4 {
        if is == 0 {
            continue;
        }
        let iscale_is = s.div(s.splat(0.1f32 * is as f32 + NMAX as f32), max);
        let scale_is = s.div(s.splat(1.0), iscale_is);
        let mut mse = zero;
        for i in 0..32 {
            let li = s.imin(nearest_int(s, s.mul(iscale_is, x[i])), nmaxi);
            let diff = s.sub(x[i], s.mul(scale_is, s.cvt(li)));
            mse = s.add(mse, s.mul(s.mul(w[i], diff), diff));
        }
        let better = s.lt(mse, best_mse);
        best_mse = s.select(better, mse, best_mse);
        iscale = s.select(better, iscale_is, iscale);
    }
    let (mut sumlx, mut suml2) = (zero, zero);
    for i in 0..32 {
        let li = s.imin(nearest_int(s, s.mul(iscale, x[i])), nmaxi);
        l[i] = s.iand(li, byte);
        let lf = s.cvt(li);
        sumlx = s.add(sumlx, s.mul(s.mul(w[i], x[i]), lf));
        suml2 = s.add(suml2, s.mul(s.mul(w[i], lf), lf));
    }
    let mut active = s.mnot(flat);
    for _ in 0..5 {
        let mut changed = s.mandnot(active, active);
        for i in 0..32 {
            let li = s.cvt(l[i]);
            let wx = s.mul(w[i], x[i]);
            let mut slx = s.sub(sumlx, s.mul(wx, li));
            let mut sl2 = s.sub(suml2, s.mul(s.mul(w[i], li), li));
            let go = s.mand(active, s.mand(s.gt(slx, zero), s.gt(sl2, zero)));
            if !s.any(go) {
                continue;
            }
            let new_l = s.imin(nearest_int(s, s.div(s.mul(x[i], sl2), slx)), nmaxi);
            let go = s.mandnot(go, s.ieq(new_l, l[i]));
            let nf = s.cvt(new_l);
            slx = s.add(slx, s.mul(wx, nf));
            sl2 = s.add(sl2, s.mul(s.mul(w[i], nf), nf));
            let take = s.mand(go, s.gt(s.mul(s.mul(slx, slx), suml2), s.mul(s.mul(sumlx, sumlx), sl2)));
            l[i] = s.iselect(take, s.iand(new_l, byte), l[i]);
            sumlx = s.select(take, slx, sumlx);
            suml2 = s.select(take, sl2, suml2);
            changed = s.mor(changed, take);
        }
        active = s.mand(active, changed);
        if !s.any(active) {
            break;
        }
    }
    let zi = s.isplat(0);
    for li in l.iter_mut() {
        *li = s.iselect(flat, zi, *li);
    }
    let r = s.select(s.gt(suml2, zero), s.div(sumlx, suml2), zero);
    s.select(flat, zero, r)
}

/// Per-lane scalars of LANES blocks, block-major (`v[lane][i]`), for the searches.
struct Aos {
    v: [[f32; 32]; 16],
}

#[inline(always)]
fn to_aos<S: Simd>(s: S, x: &[S::F; 32]) -> Aos {
    let mut soa = [[0f32; 16]; 32];
    for (o, v) in soa.iter_mut().zip(x) {
        s.store(*v, o);
    }
    let mut a = Aos { v: [[0f32; 32]; 16] };
    for (i, row) in soa.iter().enumerate() {
        for (lane, &v) in row.iter().enumerate().take(S::LANES) {
            a.v[lane][i] = v;
        }
    }
    a
}

/// The grid points of group `k` of every lane in `need` (whose key `u` is off the grid,
/// `g = map[u] < 0`): the searched point's key replaces `keys[lane]`. `None` where a
/// search finds no finite distance (the reference aborts).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn search_lanes<S: Simd>(s: S, t: &iq2_xxs::Tables, need: S::M, g: S::I, keys: &mut [i32; 16], xval: &Aos, waux: &Aos, k: usize, scale: S::F) -> Option<()> {
    let mut bits = s.mbits(need);
    if bits == 0 {
        return Some(());
    }
    let mut ga = [0i32; 16];
    s.istore(g, &mut ga);
    let mut sa = [0f32; 16];
    s.store(scale, &mut sa);
    while bits != 0 {
        let lane = bits.trailing_zeros() as usize;
        bits &= bits - 1;
        let list = &t.neighbours[(-ga[lane] - 1) as usize..];
        keys[lane] = best_neighbour(s, list, &xval.v[lane][8 * k..8 * k + 8], &waux.v[lane][8 * k..8 * k + 8], sa[lane])? as i32;
    }
    Some(())
}

/// Keys of the four groups of `lv` (levels 0..=2 here, so keys < 43691).
#[inline(always)]
fn group_key<S: Simd>(s: S, lv: &[S::I]) -> S::I {
    let mut u = lv[0];
    for (i, v) in lv.iter().enumerate().skip(1) {
        u = s.ior(u, s.shlv(*v, s.isplat(2 * i as i32)));
    }
    u
}

/// Quantise LANES / 8 consecutive 256-value blocks (`x`, `LANES * 32` values; `qw`: their
/// importance, `LANES * 32` values in the same order). `None`: a block hit one of the
/// reference's abort paths, and the caller reruns the scalar code for the message.
#[inline(always)]
fn superblocks<S: Simd>(s: S, x: &[f32], qw: &[f32], y: &mut [u8]) -> Option<()> {
    const KMAXQ: i32 = 3;
    let t = iq2_xxs::tables();
    let nsb = S::LANES / 8;
    let x = &x[..S::LANES * 32];
    let qw = &qw[..S::LANES * 32];
    let zero = s.splat(0.0);
    let zi = s.isplat(0);
    let mut sig = [0f32; 16];
    for (b, xbl) in x.chunks_exact(QK_K).enumerate() {
        let mut sumx2 = 0.0f32;
        for &v in xbl {
            sumx2 += v * v;
        }
        sig[8 * b..8 * b + 8].fill(sumx2 / QK_K as f32);
    }
    let sigma2 = s.load(&sig);
    let base = s.shl::<5>(s.iota());
    let mut xb = [zero; 32];
    let mut weight = [zero; 32];
    let mut waux = [zero; 32];
    for i in 0..32 {
        let idx = s.iadd(base, s.isplat(i as i32));
        // SAFETY: lane * 32 + i < LANES * 32 = x.len() = qw.len().
        let (xi, qi) = unsafe { (s.gather(x, idx), s.gather(qw, idx)) };
        xb[i] = xi;
        weight[i] = s.mul(qi, s.sqrt(s.add(sigma2, s.mul(xi, xi))));
        waux[i] = s.sqrt(weight[i]);
    }
    // Signs: an even number of flips per group of 8, the cheapest value flipped back.
    let mut xval = [zero; 32];
    let mut signs = [zi; 4];
    for k in 0..4 {
        let mut nflip = zi;
        let mut sg = zi;
        for i in 0..8 {
            let v = xb[8 * k + i];
            let pos = s.ge(v, zero);
            xval[8 * k + i] = s.select(pos, v, s.neg(v));
            let neg = s.iselect(pos, zi, s.isplat(1));
            nflip = s.iadd(nflip, neg);
            sg = s.ior(sg, s.shl_by(neg, i as u32));
        }
        let odd = s.ieq(s.iand(nflip, s.isplat(1)), s.isplat(1));
        if s.any(odd) {
            let mut imin = zi;
            let mut min = s.mul(s.mul(weight[8 * k], xb[8 * k]), xb[8 * k]);
            for i in 1..8 {
                let ax = s.mul(s.mul(weight[8 * k + i], xb[8 * k + i]), xb[8 * k + i]);
                let lt = s.lt(ax, min);
                min = s.select(lt, ax, min);
                imin = s.iselect(lt, s.isplat(i as i32), imin);
            }
            for i in 0..8 {
                let f = s.mand(odd, s.ieq(imin, s.isplat(i as i32)));
                xval[8 * k + i] = s.select(f, s.neg(xval[8 * k + i]), xval[8 * k + i]);
            }
            sg = s.ixor(sg, s.iselect(odd, s.shlv(s.isplat(1), imin), zi));
        }
        signs[k] = s.iand(sg, s.isplat(127));
    }
    let mut max = xval[0];
    for v in &xval[1..] {
        max = s.select(s.gt(max, *v), max, *v);
    }
    let mut active = s.mnot(s.lt(max, s.splat(GROUP_MAX_EPS)));
    let mut lq = [zi; 32];
    let mut scale = make_qp_lanes(s, &xval, &weight, &mut lq);
    // `lu[i] as i8`
    let mut l = [zi; 32];
    for (o, v) in l.iter_mut().zip(&lq) {
        *o = s.isub(*v, s.shl::<1>(s.iand(*v, s.isplat(0x80))));
    }
    let eff_max = s.mul(scale, s.splat(KMAXQ as f32));
    active = s.mandnot(active, s.le(eff_max, zero));
    let xa = to_aos(s, &xval);
    let wa = to_aos(s, &waux);
    let mut keys = [0i32; 16];
    if s.any(active) {
        let mut best = zero;
        for is in -6i32..=6 {
            let id = s.div(s.splat((2 * KMAXQ - 1) as f32 + is as f32 * 0.1f32), eff_max);
            let this_scale = s.div(s.splat(1.0), id);
            let mut laux = [zi; 32];
            for k in 0..4 {
                for i in 0..8 {
                    let li = nearest_int(s, s.mul(s.splat(0.5), s.sub(s.mul(id, xval[8 * k + i]), s.splat(1.0))));
                    laux[8 * k + i] = iclamp(s, li, 0, KMAXQ - 1);
                }
                let u = group_key(s, &laux[8 * k..8 * k + 8]);
                // SAFETY: levels are 0..=2, so u <= 0xAAAA < 43692 = map.len().
                let g = unsafe { s.igather(t.map, u) };
                let need = s.mand(active, s.igt(zi, g));
                if s.any(need) {
                    s.istore(u, &mut keys);
                    search_lanes(s, &t, need, g, &mut keys, &xa, &wa, k, this_scale)?;
                    let kv = s.iload(&keys);
                    for i in 0..8 {
                        laux[8 * k + i] = s.iand(s.shrv(kv, s.isplat(2 * i as i32)), s.isplat(3));
                    }
                }
            }
            let (mut sumqx, mut sumq2) = (zero, zero);
            for i in 0..32 {
                let q = s.cvt(s.ior(s.shl::<1>(laux[i]), s.isplat(1)));
                sumqx = s.add(sumqx, s.mul(s.mul(weight[i], xval[i]), q));
                sumq2 = s.add(sumq2, s.mul(s.mul(weight[i], q), q));
            }
            let better = s.mand(active, s.mand(s.gt(sumq2, zero), s.gt(s.mul(sumqx, sumqx), s.mul(best, sumq2))));
            if s.any(better) {
                scale = s.select(better, s.div(sumqx, sumq2), scale);
                best = s.select(better, s.mul(scale, sumqx), best);
                for i in 0..32 {
                    l[i] = s.iselect(better, laux[i], l[i]);
                }
            }
        }
        let pos = s.mand(active, s.gt(scale, zero));
        if s.any(pos) {
            let id = s.div(s.splat(1.0), scale);
            for k in 0..4 {
                let mut lv = [zi; 8];
                for (i, o) in lv.iter_mut().enumerate() {
                    let li = nearest_int(s, s.mul(s.splat(0.5), s.sub(s.mul(id, xval[8 * k + i]), s.splat(1.0))));
                    *o = iclamp(s, li, 0, KMAXQ - 1);
                }
                let u = group_key(s, &lv);
                // SAFETY: as above.
                let g = unsafe { s.igather(t.map, u) };
                s.istore(u, &mut keys);
                search_lanes(s, &t, s.mand(pos, s.igt(zi, g)), g, &mut keys, &xa, &wa, k, scale)?;
                let kv = s.iload(&keys);
                for i in 0..8 {
                    l[8 * k + i] = s.iselect(pos, s.iand(s.shrv(kv, s.isplat(2 * i as i32)), s.isplat(3)), l[8 * k + i]);
                }
            }
            let (mut sumqx, mut sumq2) = (zero, zero);
            for i in 0..32 {
                let q = s.cvt(s.ior(s.shl::<1>(l[i]), s.isplat(1)));
                sumqx = s.add(sumqx, s.mul(s.mul(weight[i], xval[i]), q));
                sumq2 = s.add(sumq2, s.mul(s.mul(weight[i], q), q));
            }
            scale = s.select(s.mand(pos, s.gt(sumq2, zero)), s.div(sumqx, sumq2), scale);
        }
    }
    let neg = s.mand(active, s.lt(scale, zero));
    scale = s.select(neg, s.neg(scale), scale);
    let mut q2a = [zi; 2];
    for k in 0..4 {
        signs[k] = s.iselect(neg, s.iand(s.ixor(signs[k], s.isplat(-1)), s.isplat(127)), signs[k]);
        // The grid check: every level 0..=3 and the point on the grid, else the reference aborts.
        let mut u = zi;
        let mut bad = s.mandnot(active, active);
        for i in 0..8 {
            let v = l[8 * k + i];
            bad = s.mor(bad, s.mor(s.igt(zi, v), s.igt(v, s.isplat(3))));
            u = s.ior(u, s.shlv(v, s.isplat(2 * i as i32)));
        }
        let u = s.iselect(active, u, zi);
        if s.any(s.mand(active, bad)) || s.any(s.igt(u, s.isplat(iq2_xxs::KMAP_SIZE as i32 - 1))) {
            return None;
        }
        // SAFETY: 0 <= u < KMAP_SIZE = map.len(), checked just above.
        let gi = unsafe { s.igather(t.map, u) };
        if s.any(s.mand(active, s.igt(zi, gi))) {
            return None;
        }
        q2a[0] = s.ior(q2a[0], s.iselect(active, s.shl_by(gi, 8 * k as u32), zi));
        q2a[1] = s.ior(q2a[1], s.iselect(active, s.shl_by(signs[k], 7 * k as u32), zi));
    }
    let scale = s.select(active, scale, zero);
    let mut sa = [0f32; 16];
    let mut q0 = [0i32; 16];
    let mut q1 = [0i32; 16];
    s.store(scale, &mut sa);
    s.istore(q2a[0], &mut q0);
    s.istore(q2a[1], &mut q1);
    let act = s.mbits(active);
    for (b, yb) in y.chunks_exact_mut(BYTES).take(nsb).enumerate() {
        let mut max_scale = 0.0f32;
        for ib in 0..8 {
            if act & (1 << (8 * b + ib)) != 0 {
                max_scale = cmax(max_scale, sa[8 * b + ib]);
            }
        }
        yb[..2].copy_from_slice(&f32_to_fp16(0.0).to_le_bytes());
        if max_scale == 0.0 {
            yb[2..].fill(0);
            continue;
        }
        let d = max_scale / 31.0;
        yb[..2].copy_from_slice(&f32_to_fp16(d).to_le_bytes());
        let id = 1.0 / d;
        for ib in 0..8 {
            let li = crate::codec::nearest_int(0.5f32 * (id * sa[8 * b + ib] - 1.0)).clamp(0, 15);
            let a0 = q0[8 * b + ib] as u32;
            let a1 = q1[8 * b + ib] as u32 | (li as u32) << 28;
            yb[2 + 8 * ib..6 + 8 * ib].copy_from_slice(&a0.to_le_bytes());
            yb[6 + 8 * ib..10 + 8 * ib].copy_from_slice(&a1.to_le_bytes());
        }
    }
    Some(())
}

#[inline(always)]
fn rows<S: Simd>(s: S, src: &[f32], n_per_row: usize, importance: &[f32], dst: &mut [u8]) -> Result<(), CodecError> {
    let per_row = n_per_row / QK_K;
    let nsb = S::LANES / 8;
    let total = src.len() / QK_K;
    let mut xbuf = [0f32; 16 * 32];
    let mut qbuf = [0f32; 16 * 32];
    let mut ybuf = [0u8; 2 * BYTES];
    let mut first = 0;
    while first < total {
        let n = nsb.min(total - first);
        // Gather this batch's blocks and their importance (a batch may span rows); a short
        // last batch is padded with copies of its first block.
        for j in 0..nsb {
            let sb = first + j.min(n - 1);
            xbuf[j * QK_K..(j + 1) * QK_K].copy_from_slice(&src[sb * QK_K..(sb + 1) * QK_K]);
            let col = sb % per_row;
            qbuf[j * QK_K..(j + 1) * QK_K].copy_from_slice(&importance[col * QK_K..(col + 1) * QK_K]);
        }
        if superblocks(s, &xbuf, &qbuf, &mut ybuf).is_some() {
            dst[first * BYTES..(first + n) * BYTES].copy_from_slice(&ybuf[..n * BYTES]);
        } else {
            for sb in first..first + n {
                let col = sb % per_row;
                iq2_xxs::quantize_superblock(
                    col,
                    &src[sb * QK_K..(sb + 1) * QK_K],
                    &mut dst[sb * BYTES..(sb + 1) * BYTES],
                    &importance[col * QK_K..(col + 1) * QK_K],
                    Lanes(s),
                )?;
            }
        }
        first += n;
    }
    Ok(())
}

simd_entry! {
    /// Rows of `n_per_row` (a multiple of 256) with one importance value per column.
    pub(crate) fn quantize(src: &[f32], n_per_row: usize, importance: &[f32], dst: &mut [u8]) -> Result<(), CodecError> => rows
}
