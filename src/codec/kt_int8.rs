//! kt-kernel persistent INT8 (`shared/reference/kt-int8.md`): per-row symmetric INT8 with
//! fp32 scales, the `kt-int8-n32-k64-vnni-v1` packed layout and its inverse, and the
//! NUMA split of gate/up (rows) and down (columns, read in place with a row stride).
//! [`quantize_pack_par`] / [`quantize_pack_into`] do the quantisation and packing of a
//! matrix on all cores, 64-row blocks at a time (each block owns a contiguous range of the
//! packed bytes).

use super::CodecError;
use super::simd::{self, Level};

pub const LAYOUT: &str = "kt-int8-n32-k64-vnni-v1";
pub const N_STEP: usize = 32;
pub const K_STEP: usize = 64;
pub const N_BLOCK: usize = 64;
pub const K_BLOCK: usize = 3584;

/// Quantise an n x k row-major matrix: `q` gets n*k int8 in row order, `d` n scales.
/// `d = max|w| / 127`, `q = saturate(round_half_even(w * (1/d)))`, a zero row is all zeros.
/// At the process's SIMD level (every level gives the same bytes).
pub fn quantize(w: &[f32], n: usize, k: usize, q: &mut [i8], d: &mut [f32]) -> Result<(), CodecError> {
    quantize_at(simd::level(), w, n, k, q, d)
}

pub fn quantize_at(level: Level, w: &[f32], n: usize, k: usize, q: &mut [i8], d: &mut [f32]) -> Result<(), CodecError> {
    if w.len() != n * k || q.len() != n * k || d.len() != n {
        return Err(CodecError::Shape(format!("INT8: buffers do not match a {n}x{k} matrix")));
    }
    #[cfg(target_arch = "x86_64")]
    if k > 0 && simd::kt_int8::quantize(level, w, k, q, d).is_some() {
        return Ok(());
    }
    let _ = level;
    quantize_scalar(w, n, k, q, d)
}

/// The scalar reference of [`quantize`].
pub fn quantize_scalar(w: &[f32], n: usize, k: usize, q: &mut [i8], d: &mut [f32]) -> Result<(), CodecError> {
    if w.len() != n * k || q.len() != n * k || d.len() != n {
        return Err(CodecError::Shape(format!("INT8: buffers do not match a {n}x{k} matrix")));
    }
    for r in 0..n {
        let row = &w[r * k..(r + 1) * k];
        let mut amax = 0.0f32;
        for &v in row {
            let a = v.abs();
            if a > amax {
                amax = a;
            }
        }
        let dr = amax / 127.0;
        d[r] = dr;
        let out = &mut q[r * k..(r + 1) * k];
        if dr == 0.0 {
            out.fill(0);
            continue;
        }
        let inv = 1.0f32 / dr;
        for (o, &v) in out.iter_mut().zip(row) {
            // |v * inv| <= ~127, far below 2^22: adding and subtracting 1.5 * 2^23 rounds
            // half to even exactly (the default MXCSR mode), without a libm call.
            let x = v * inv;
            let r = (x + 12582912.0f32) - 12582912.0f32;
            *o = r.clamp(-128.0, 127.0) as i8;
        }
    }
    Ok(())
}

/// Byte offset of element (r, c) of an n x k matrix in the packed layout.
#[inline]
pub fn packed_offset(r: usize, c: usize, n: usize, k: usize) -> usize {
    let nbb = r / N_BLOCK * N_BLOCK;
    let nbs = N_BLOCK.min(n - nbb);
    let nb = (r - nbb) / N_STEP * N_STEP;
    let i = (r - nbb) % N_STEP;
    let kbb = c / K_BLOCK * K_BLOCK;
    let kbs = K_BLOCK.min(k - kbb);
    let kb = (c - kbb) / K_STEP * K_STEP;
    let j = (c - kbb) % K_STEP;
    let tile = nbb * k + kbb * nbs + nb * kbs + kb * N_STEP;
    let half = i / 16;
    tile + half * 1024 + (j / 4) * 64 + (i % 16) * 4 + j % 4
}

fn check_layout(n: usize, k: usize) -> Result<(), CodecError> {
    if !n.is_multiple_of(N_STEP) || !k.is_multiple_of(K_STEP) || n == 0 || k == 0 {
        return Err(CodecError::Shape(format!("{LAYOUT} needs n % 32 == 0 and k % 64 == 0, got {n}x{k}")));
    }
    Ok(())
}

/// Pack row-major int8 into the VNNI layout, tile by tile (32 rows x 64 columns, each
/// half a 16x16 matrix of 4-byte words, transposed).
pub fn pack(q: &[i8], n: usize, k: usize, out: &mut [u8]) -> Result<(), CodecError> {
    check_layout(n, k)?;
    if q.len() != n * k || out.len() != n * k {
        return Err(CodecError::Shape(format!("INT8 pack: buffers do not match {n}x{k}")));
    }
    for nbb in (0..n).step_by(N_BLOCK) {
        let nbs = N_BLOCK.min(n - nbb);
        pack_block(&q[nbb * k..(nbb + nbs) * k], nbs, k, &mut out[nbb * k..(nbb + nbs) * k]);
    }
    Ok(())
}

/// One block of `nbs` (<= 64) rows: the packed layout keeps each such block in its own
/// `nbs * k` bytes (at `nbb * k`), which is what lets blocks be packed in parallel.
/// Moves 4-byte words (the unit the layout transposes).
fn pack_block(q: &[i8], nbs: usize, k: usize, out: &mut [u8]) {
    for kbb in (0..k).step_by(K_BLOCK) {
        let kbs = K_BLOCK.min(k - kbb);
        for nb in (0..nbs).step_by(N_STEP) {
            for kb in (0..kbs).step_by(K_STEP) {
                let tile = kbb * nbs + nb * kbs + kb * N_STEP;
                for i in 0..N_STEP {
                    let src = (nb + i) * k + kbb + kb;
                    let dst = tile + (i / 16) * 1024 + (i % 16) * 4;
                    let row = &q[src..src + K_STEP];
                    for j4 in 0..K_STEP / 4 {
                        let d = dst + j4 * 64;
                        let w = &row[4 * j4..4 * j4 + 4];
                        out[d..d + 4].copy_from_slice(&[w[0] as u8, w[1] as u8, w[2] as u8, w[3] as u8]);
                    }
                }
            }
        }
    }
}

/// Quantise and pack an n x k matrix on all cores (rayon over blocks of 64 rows): the
/// packed quant bytes and the per-row scales, as [`quantize`] then [`pack`] give them.
pub fn quantize_pack_par(w: &[f32], n: usize, k: usize) -> Result<(Vec<u8>, Vec<f32>), CodecError> {
    let mut packed = vec![0u8; n * k];
    let mut d = vec![0f32; n];
    quantize_pack_into(w, k, n, k, &mut packed, &mut d)?;
    Ok((packed, d))
}

/// [`quantize_pack_par`] of the n x k matrix whose row `r` is `w[r * ld..r * ld + k]` (a
/// column range of a wider matrix, `ld` >= `k`, read in place), into `packed` (n*k bytes)
/// and `d` (n scales).
pub fn quantize_pack_into(w: &[f32], ld: usize, n: usize, k: usize, packed: &mut [u8], d: &mut [f32]) -> Result<(), CodecError> {
    use rayon::prelude::*;
    check_layout(n, k)?;
    let need = (n - 1).checked_mul(ld).and_then(|x| x.checked_add(k));
    if ld < k || need.is_none_or(|need| w.len() < need) {
        return Err(CodecError::Shape(format!("INT8: {} values do not hold {n} rows of {k} at a stride of {ld}", w.len())));
    }
    if packed.len() != n * k || d.len() != n {
        return Err(CodecError::Shape(format!("INT8: output buffers do not match a {n}x{k} matrix")));
    }
    let level = simd::level();
    packed.par_chunks_mut(N_BLOCK * k).zip(d.par_chunks_mut(N_BLOCK)).enumerate().try_for_each(|(b, (out, d))| {
        let nbs = d.len();
        let mut q = vec![0i8; nbs * k];
        for (i, (q, d)) in q.chunks_exact_mut(k).zip(d.chunks_exact_mut(1)).enumerate() {
            let start = (b * N_BLOCK + i) * ld;
            quantize_at(level, &w[start..start + k], 1, k, q, d)?;
        }
        pack_block(&q, nbs, k, out);
        Ok::<_, CodecError>(())
    })
}

/// The inverse of [`pack`] (kt-kernel's `to_mat`), a test oracle.
pub fn unpack(packed: &[u8], n: usize, k: usize, out: &mut [i8]) -> Result<(), CodecError> {
    check_layout(n, k)?;
    if packed.len() != n * k || out.len() != n * k {
        return Err(CodecError::Shape(format!("INT8 unpack: buffers do not match {n}x{k}")));
    }
    for r in 0..n {
        for c in 0..k {
            out[r * k + c] = packed[packed_offset(r, c, n, k)] as i8;
        }
    }
    Ok(())
}

/// NUMA part `part` of `parts` of an expert's matrices (tensor parallel over the
/// intermediate dimension): rows of gate/up `[I, H]`, columns of down `[H, I]`.
/// Rows `part * rows/parts ..` of a row-major matrix: a slice of it, no copy.
pub fn numa_split_rows(w: &[f32], rows: usize, cols: usize, part: usize, parts: usize) -> Result<&[f32], CodecError> {
    if parts == 0 || !rows.is_multiple_of(parts) || part >= parts || w.len() != rows * cols {
        return Err(CodecError::Shape(format!("cannot split {rows} rows into {parts} NUMA parts")));
    }
    let per = rows / parts;
    Ok(&w[part * per * cols..(part + 1) * per * cols])
}

/// Columns `part * cols/parts ..` of every row of a row-major matrix, in place: the values
/// from the part's first column on and the row stride (`cols`), for [`quantize_pack_into`]
/// (row `r` of the part is `values[r * cols..r * cols + cols/parts]`).
pub fn numa_split_cols(w: &[f32], rows: usize, cols: usize, part: usize, parts: usize) -> Result<(&[f32], usize), CodecError> {
    if parts == 0 || !cols.is_multiple_of(parts) || part >= parts || w.len() != rows * cols {
        return Err(CodecError::Shape(format!("cannot split {cols} columns into {parts} NUMA parts")));
    }
    Ok((w.get(part * (cols / parts)..).unwrap_or(&[]), cols))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiled_pack_follows_the_element_formula() {
        for (n, k) in [(32, 64), (96, 3584 + 128), (64, 7168 + 64)] {
            let q: Vec<i8> = (0..n * k).map(|i| (i * 131 % 253) as i8).collect();
            let mut packed = vec![0u8; n * k];
            pack(&q, n, k, &mut packed).unwrap();
            for r in 0..n {
                for c in 0..k {
                    assert_eq!(packed[packed_offset(r, c, n, k)], q[r * k + c] as u8, "({r},{c}) of {n}x{k}");
                }
            }
        }
    }

    #[test]
    fn pack_is_a_permutation_and_unpack_inverts_it() {
        for (n, k) in [(32, 64), (64, 128), (96, 3584 + 64), (128, 7168)] {
            let q: Vec<i8> = (0..n * k).map(|i| (i * 31 % 251) as i8).collect();
            let mut packed = vec![0u8; n * k];
            pack(&q, n, k, &mut packed).unwrap();
            let mut seen = vec![false; n * k];
            for r in 0..n {
                for c in 0..k {
                    let o = packed_offset(r, c, n, k);
                    assert!(!seen[o], "offset {o} used twice ({n}x{k})");
                    seen[o] = true;
                }
            }
            let mut back = vec![0i8; n * k];
            unpack(&packed, n, k, &mut back).unwrap();
            assert_eq!(q, back);
        }
    }

    #[test]
    fn tile_layout_facts() {
        // Within the first tile: row i < 16 col j at (j/4)*64 + i*4 + j%4; rows 16.. in the second KiB.
        assert_eq!(packed_offset(0, 0, 64, 64), 0);
        assert_eq!(packed_offset(1, 0, 64, 64), 4);
        assert_eq!(packed_offset(0, 4, 64, 64), 64);
        assert_eq!(packed_offset(16, 0, 64, 64), 1024);
        assert_eq!(packed_offset(32, 0, 64, 64), 2048);
    }

    #[test]
    fn quantize_rows() {
        let w = [0.0f32, 0.0, 1.0, -0.5, 127.0, 63.5];
        let (mut q, mut d) = ([0i8; 6], [0f32; 3]);
        quantize(&w, 3, 2, &mut q, &mut d).unwrap();
        assert_eq!(d, [0.0, 1.0 / 127.0, 1.0]);
        assert_eq!(&q[..2], &[0, 0]);
        assert_eq!(q[2], 127);
        assert_eq!(q[3], -64, "-63.5 ties to even");
        assert_eq!(&q[4..], &[127, 64], "63.5 ties to even");
    }

    #[test]
    fn rounding_matches_round_ties_even() {
        let mut x = 0x12345678u32;
        let mut w = vec![0f32; 4096];
        for v in w.iter_mut() {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            *v = (x as f32 / u32::MAX as f32 - 0.5) * 3.0;
        }
        w[7] = 0.0;
        w[8] = -0.0;
        let (mut q, mut d) = (vec![0i8; 4096], vec![0f32; 16]);
        quantize(&w, 16, 256, &mut q, &mut d).unwrap();
        for r in 0..16 {
            let inv = 1.0f32 / d[r];
            for c in 0..256 {
                let want = (w[r * 256 + c] * inv).round_ties_even().clamp(-128.0, 127.0) as i8;
                assert_eq!(q[r * 256 + c], want);
            }
        }
    }

    #[test]
    fn numa_splits() {
        let w: Vec<f32> = (0..24).map(|v| v as f32).collect(); // 4 x 6
        assert_eq!(numa_split_rows(&w, 4, 6, 1, 2).unwrap(), (12..24).map(|v| v as f32).collect::<Vec<_>>());
        let (v, ld) = numa_split_cols(&w, 4, 6, 1, 3).unwrap();
        let part: Vec<f32> = (0..4).flat_map(|r| v[r * ld..r * ld + 2].to_vec()).collect();
        assert_eq!(part, vec![2.0, 3.0, 8.0, 9.0, 14.0, 15.0, 20.0, 21.0]);
        assert!(numa_split_cols(&w, 4, 6, 0, 4).is_err());
    }

    #[test]
    fn a_strided_column_part_quantises_as_its_copy() {
        let (n, cols, parts) = (96, 256, 2);
        let w: Vec<f32> = (0..n * cols).map(|i| ((i * 7919 % 1000) as f32 - 500.0) / 37.0).collect();
        let k = cols / parts;
        for part in 0..parts {
            let copy: Vec<f32> = w.chunks_exact(cols).flat_map(|r| r[part * k..(part + 1) * k].to_vec()).collect();
            let want = quantize_pack_par(&copy, n, k).unwrap();
            let (v, ld) = numa_split_cols(&w, n, cols, part, parts).unwrap();
            let (mut packed, mut d) = (vec![0u8; n * k], vec![0f32; n]);
            quantize_pack_into(v, ld, n, k, &mut packed, &mut d).unwrap();
            assert_eq!((packed, d), want, "part {part}");
        }
        let (mut packed, mut d) = (vec![0u8; 32 * 64], vec![0f32; 32]);
        assert!(quantize_pack_into(&w[..31 * 128 + 63], 128, 32, 64, &mut packed, &mut d).is_err(), "one value short");
        assert!(quantize_pack_into(&w, 32, 32, 64, &mut packed, &mut d).is_err(), "stride below the row");
    }
}
