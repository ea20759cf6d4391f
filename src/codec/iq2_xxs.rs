//! IQ2_XXS: 66-byte blocks of 256 values: fp16 d, then 8 pairs of u32 (a0, a1) per 32
//! values: byte k of a0 is the grid index of 8-value group k, bits 7k..7k+6 of a1 its
//! sign index, a1 >> 28 the 4-bit block scale.
//!
//! The quantiser is `quantize_row_iq2_xxs_impl` with the search tables that
//! `iq2xs_init_impl(GGML_TYPE_IQ2_XXS)` builds (grid of odd levels 1,3,5,7, the map from
//! 8 two-bit levels to a grid index, and for points off the grid their nearest grid points
//! ordered by (distance, index)). Importance is required, as in the reference.

use super::iq2_tables::{IQ2XXS_GRID, KGRID_2BIT_256, KMASK_IQ2XS, KSIGNS_IQ2XS};
use super::q2_k::{GROUP_MAX_EPS, QK_K, make_qp_quants};
use super::{CodecError, cmax, f32_to_fp16, fp16_to_f32, nearest_int, read_u16};

pub const BYTES: usize = 66;
pub(crate) const KMAP_SIZE: usize = 43692;

/// The search tables, built at compile time by build.rs (nothing to do at start-up).
/// `map[key]` for a point's key (2 bits per coordinate, level `(v - 1) / 2`): its grid
/// index, or for points off the grid `-(offset + 1)` into `neighbours`, which holds at
/// each offset a count, then that many grid points as keys, ordered by (distance, grid
/// index); 16 zeros end the array so a vector load from any list stays in bounds.
#[derive(Clone, Copy)]
pub(crate) struct Tables {
    pub map: &'static [i32],
    pub neighbours: &'static [u16],
}

#[repr(C, align(64))]
struct Aligned<B: ?Sized>(B);

static MAP_BYTES: &Aligned<[u8]> = &Aligned(*include_bytes!(concat!(env!("OUT_DIR"), "/iq2xxs_map.bin")));
static NEIGHBOUR_BYTES: &Aligned<[u8]> = &Aligned(*include_bytes!(concat!(env!("OUT_DIR"), "/iq2xxs_neighbours.bin")));

pub(crate) fn tables() -> Tables {
    let (m, n) = (&MAP_BYTES.0, &NEIGHBOUR_BYTES.0);
    debug_assert!(m.len() == 4 * KMAP_SIZE && n.len() % 2 == 0);
    // SAFETY: both byte arrays are 64-byte aligned (`Aligned`), their lengths are whole
    // numbers of elements, every bit pattern is a valid i32 / u16, and build.rs wrote them
    // in the target's byte order. They are 'static and never written.
    unsafe {
        Tables {
            map: std::slice::from_raw_parts(m.as_ptr().cast::<i32>(), m.len() / 4),
            neighbours: std::slice::from_raw_parts(n.as_ptr().cast::<u16>(), n.len() / 2),
        }
    }
}

/// Level `i` (0..=3) of a grid point given as a key.
#[inline(always)]
pub(crate) fn key_level(key: u16, i: usize) -> i8 {
    ((key >> (2 * i)) & 3) as i8
}

/// `iq2_find_best_neighbour` over one neighbour list (`[count, keys...]`); the best grid
/// point as a key, or `None` where the reference aborts (every distance is infinite or
/// NaN, from inputs of magnitude ~1e17 and beyond, or non-finite ones).
pub(crate) fn find_best_neighbour(list: &[u16], xval: &[f32], weight: &[f32], scale: f32) -> Option<u16> {
    let n = list[0] as usize;
    let mut best_d2 = f32::MAX;
    let mut best = None;
    for &key in &list[1..=n] {
        let mut d2 = 0.0f32;
        for i in 0..8 {
            let diff = scale * (2 * key_level(key, i) as i32 + 1) as f32 - xval[i];
            d2 += weight[i] * diff * diff;
        }
        if d2 < best_d2 {
            best_d2 = d2;
            best = Some(key);
        }
    }
    best
}

fn overflow(ibl: usize) -> CodecError {
    CodecError::Shape(format!("IQ2_XXS: block {ibl} has no finite distance to any grid point (values too large or not finite; the reference aborts here)"))
}

fn grid_key(l: &[i8]) -> usize {
    (0..8).map(|i| ((l[i] as u8 & 3) as usize) << (2 * i)).sum()
}

/// `quantize_row_iq2_xxs_impl` for one row; `quant_weights` has one value per column.
pub fn quantize_row(x: &[f32], y: &mut [u8], quant_weights: &[f32]) -> Result<(), CodecError> {
    quantize_row_with(x, y, quant_weights, ScalarSearch)
}

/// A neighbour search: [`find_best_neighbour`]'s contract. (A trait, not a closure, so
/// the SIMD levels' search is compiled with their target features.)
pub(crate) trait NeighbourSearch: Copy {
    fn search(self, list: &[u16], xval: &[f32], weight: &[f32], scale: f32) -> Option<u16>;
}

#[derive(Clone, Copy)]
struct ScalarSearch;

impl NeighbourSearch for ScalarSearch {
    #[inline(always)]
    fn search(self, list: &[u16], xval: &[f32], weight: &[f32], scale: f32) -> Option<u16> {
        find_best_neighbour(list, xval, weight, scale)
    }
}

/// [`quantize_row`] with the neighbour search given (the SIMD levels pass theirs).
#[inline(always)]
pub(crate) fn quantize_row_with(x: &[f32], y: &mut [u8], quant_weights: &[f32], searcher: impl NeighbourSearch) -> Result<(), CodecError> {
    for (ibl, (xbl, yb)) in x.chunks_exact(QK_K).zip(y.chunks_exact_mut(BYTES)).enumerate() {
        quantize_superblock(ibl, xbl, yb, &quant_weights[QK_K * ibl..QK_K * (ibl + 1)], searcher)?;
    }
    Ok(())
}

/// One 256-value block `xbl` (block `ibl` of its row, for error messages), its 256
/// importance values `qw256`.
#[inline(always)]
pub(crate) fn quantize_superblock(ibl: usize, xbl: &[f32], yb: &mut [u8], qw256: &[f32], searcher: impl NeighbourSearch) -> Result<(), CodecError> {
    const KMAXQ: i32 = 3;
    let t = tables();
    {
        let mut scales = [0.0f32; 8];
        let mut weight = [0.0f32; 32];
        let mut xval = [0.0f32; 32];
        let mut l = [0i8; 32];
        let mut laux = [0i8; 32];
        let mut waux = [0.0f32; 32];
        let mut block_signs = [0u8; 4];
        let mut q2 = [0u32; 16];
        yb[..2].copy_from_slice(&f32_to_fp16(0.0).to_le_bytes());
        let mut max_scale = 0.0f32;
        let mut sumx2 = 0.0f32;
        for &v in xbl {
            sumx2 += v * v;
        }
        let sigma2 = sumx2 / QK_K as f32;
        for ib in 0..8 {
            let xb = &xbl[32 * ib..32 * ib + 32];
            let qw: &[f32; 32] = qw256[32 * ib..32 * ib + 32].try_into().unwrap();
            for i in 0..32 {
                weight[i] = qw[i] * (sigma2 + xb[i] * xb[i]).sqrt();
            }
            for i in 0..32 {
                waux[i] = weight[i].sqrt();
            }
            for k in 0..4 {
                let mut nflip = 0;
                let mut s = 0u8;
                for i in 0..8 {
                    if xb[8 * k + i] >= 0.0 {
                        xval[8 * k + i] = xb[8 * k + i];
                    } else {
                        xval[8 * k + i] = -xb[8 * k + i];
                        nflip += 1;
                        s |= 1 << i;
                    }
                }
                if nflip % 2 != 0 {
                    let mut imin = 0;
                    let mut min = weight[8 * k] * xb[8 * k] * xb[8 * k];
                    for i in 1..8 {
                        let ax = weight[8 * k + i] * xb[8 * k + i] * xb[8 * k + i];
                        if ax < min {
                            min = ax;
                            imin = i;
                        }
                    }
                    xval[8 * k + imin] = -xval[8 * k + imin];
                    s ^= 1 << imin;
                }
                block_signs[k] = s & 127;
            }
            let mut max = xval[0];
            for &v in &xval[1..] {
                max = cmax(max, v);
            }
            if max < GROUP_MAX_EPS {
                scales[ib] = 0.0;
                continue;
            }
            let mut lu = [0u8; 32];
            let mut scale = make_qp_quants(KMAXQ + 1, &xval, &mut lu, &weight);
            for i in 0..32 {
                l[i] = lu[i] as i8;
            }
            let eff_max = scale * KMAXQ as f32;
            if eff_max <= 0.0 {
                scales[ib] = 0.0;
                continue;
            }
            let mut best = 0.0f32;
            for is in -6i32..=6 {
                let id = ((2 * KMAXQ - 1) as f32 + is as f32 * 0.1f32) / eff_max;
                let this_scale = 1.0 / id;
                for k in 0..4 {
                    for i in 0..8 {
                        let li = nearest_int(0.5f32 * (id * xval[8 * k + i] - 1.0));
                        laux[8 * k + i] = li.clamp(0, KMAXQ - 1) as i8;
                    }
                    let u = grid_key(&laux[8 * k..]);
                    if t.map[u] < 0 {
                        let nb = &t.neighbours[(-t.map[u] - 1) as usize..];
                        let key = searcher.search(nb, &xval[8 * k..8 * k + 8], &waux[8 * k..8 * k + 8], this_scale).ok_or_else(|| overflow(ibl))?;
                        for i in 0..8 {
                            laux[8 * k + i] = key_level(key, i);
                        }
                    }
                }
                let (mut sumqx, mut sumq2) = (0.0f32, 0.0f32);
                for i in 0..32 {
                    let w = weight[i];
                    let q = (2 * laux[i] as i32 + 1) as f32;
                    sumqx += w * xval[i] * q;
                    sumq2 += w * q * q;
                }
                if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
                    scale = sumqx / sumq2;
                    best = scale * sumqx;
                    l = laux;
                }
            }
            if scale > 0.0 {
                let id = 1.0 / scale;
                for k in 0..4 {
                    let mut u = 0usize;
                    for i in 0..8 {
                        let li = nearest_int(0.5f32 * (id * xval[8 * k + i] - 1.0)).clamp(0, KMAXQ - 1);
                        u |= (li as usize) << (2 * i);
                    }
                    let mut key = KGRID_2BIT_256[t.map[u].max(0) as usize];
                    if t.map[u] < 0 {
                        let nb = &t.neighbours[(-t.map[u] - 1) as usize..];
                        key = searcher.search(nb, &xval[8 * k..8 * k + 8], &waux[8 * k..8 * k + 8], scale).ok_or_else(|| overflow(ibl))?;
                    }
                    for i in 0..8 {
                        l[8 * k + i] = key_level(key, i);
                    }
                }
                let (mut sumqx, mut sumq2) = (0.0f32, 0.0f32);
                for i in 0..32 {
                    let w = weight[i];
                    let q = (2 * l[i] as i32 + 1) as f32;
                    sumqx += w * xval[i] * q;
                    sumq2 += w * q * q;
                }
                if sumq2 > 0.0 {
                    scale = sumqx / sumq2;
                }
            }
            if scale < 0.0 {
                scale = -scale;
                for s in &mut block_signs {
                    *s = !*s & 127;
                }
            }
            for k in 0..4 {
                let u = grid_key(&l[8 * k..]);
                let gi = t.map.get(u).copied().unwrap_or(-1);
                if gi < 0 || l[8 * k..8 * k + 8].iter().any(|&v| !(0..=3).contains(&v)) {
                    // The reference prints "Oops: found point not on grid" and aborts.
                    return Err(CodecError::Shape(format!("IQ2_XXS: block {ibl} produced a point off the grid")));
                }
                q2[2 * ib] |= (gi as u32) << (8 * k);
                q2[2 * ib + 1] |= (block_signs[k] as u32) << (7 * k);
            }
            scales[ib] = scale;
            max_scale = cmax(max_scale, scale);
        }
        if max_scale == 0.0 {
            yb[2..].fill(0);
            return Ok(());
        }
        let d = max_scale / 31.0;
        yb[..2].copy_from_slice(&f32_to_fp16(d).to_le_bytes());
        let id = 1.0 / d;
        for ib in 0..8 {
            let li = nearest_int(0.5f32 * (id * scales[ib] - 1.0)).clamp(0, 15);
            q2[2 * ib + 1] |= (li as u32) << 28;
        }
        for (o, v) in yb[2..].chunks_exact_mut(4).zip(q2) {
            o.copy_from_slice(&v.to_le_bytes());
        }
    }
    Ok(())
}

/// `dequantize_row_iq2_xxs`.
pub fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(BYTES).zip(dst.chunks_exact_mut(QK_K)) {
        let d = fp16_to_f32(read_u16(b, 0));
        for ib32 in 0..8 {
            let a0 = u32::from_le_bytes(b[2 + 8 * ib32..6 + 8 * ib32].try_into().unwrap());
            let a1 = u32::from_le_bytes(b[6 + 8 * ib32..10 + 8 * ib32].try_into().unwrap());
            let db = d * (0.5f32 + (a1 >> 28) as f32) * 0.25f32;
            for l in 0..4 {
                let grid = IQ2XXS_GRID[((a0 >> (8 * l)) & 0xFF) as usize].to_le_bytes();
                let signs = KSIGNS_IQ2XS[((a1 >> (7 * l)) & 127) as usize];
                for j in 0..8 {
                    let sign = if signs & KMASK_IQ2XS[j] != 0 { -1.0f32 } else { 1.0 };
                    y[32 * ib32 + 8 * l + j] = db * grid[j] as f32 * sign;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reference's construction (`iq2xs_init_impl`), run here: grid from
    /// kgrid_2bit_256, every distance sorted by (distance, index), the first two distances.
    #[allow(clippy::needless_range_loop)]
    fn reference_tables() -> (Vec<i32>, Vec<u16>) {
        let grid: Vec<[i32; 8]> = KGRID_2BIT_256.iter().map(|&g| std::array::from_fn(|i| 2 * ((g >> (2 * i)) & 3) as i32 + 1)).collect();
        let mut map = vec![-1i32; KMAP_SIZE];
        for (j, &g) in KGRID_2BIT_256.iter().enumerate() {
            map[g as usize] = j as i32;
        }
        let mut lists = Vec::new();
        for i in 0..KMAP_SIZE {
            if map[i] >= 0 {
                continue;
            }
            let pos: [i32; 8] = std::array::from_fn(|k| 2 * ((i >> (2 * k)) & 3) as i32 + 1);
            let mut dist2: Vec<(i32, usize)> = grid.iter().enumerate().map(|(j, g)| ((0..8).map(|k| (g[k] - pos[k]).pow(2)).sum(), j)).collect();
            dist2.sort_unstable();
            let start = lists.len();
            map[i] = -(start as i32 + 1);
            lists.push(0u16);
            let (mut d2, mut nhave) = (dist2[0].0, 1);
            for &(d, j) in &dist2 {
                if d > d2 {
                    if nhave == 2 {
                        break;
                    }
                    d2 = d;
                    nhave += 1;
                }
                lists.push(KGRID_2BIT_256[j]);
            }
            lists[start] = (lists.len() - start - 1) as u16;
        }
        (map, lists)
    }

    #[test]
    fn compile_time_tables_are_the_references() {
        let t = tables();
        let (map, lists) = reference_tables();
        assert_eq!(t.map, &map[..]);
        assert_eq!(&t.neighbours[..lists.len()], &lists[..]);
        assert_eq!(t.neighbours.len(), lists.len() + 16);
        assert!(t.neighbours[lists.len()..].iter().all(|&v| v == 0));
        assert_eq!(t.map.iter().filter(|&&m| m >= 0).count(), 256);
        for &m in t.map.iter().filter(|&&m| m < 0) {
            let nb = &t.neighbours[(-m - 1) as usize..];
            assert!(nb[0] > 0 && nb[1..=nb[0] as usize].iter().all(|&key| t.map[key as usize] >= 0));
        }
    }

    #[test]
    fn huge_values_are_an_error_where_the_reference_aborts() {
        let x: Vec<f32> = (0..256).map(|i| (i as f32).cos() * 1e17).collect();
        let mut y = [0u8; BYTES];
        assert!(quantize_row(&x, &mut y, &[1.0; 256]).is_err());
        let x: Vec<f32> = (0..256).map(|i| (i as f32).cos() * 1e12).collect();
        assert!(quantize_row(&x, &mut y, &[1.0; 256]).is_ok());
    }
}
