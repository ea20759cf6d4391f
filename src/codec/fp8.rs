//! FP8 E4M3 (`float8_e4m3fn`: no infinities, 0x7F/0xFF are NaN) with UE8M0 block scales,
//! decoded to BF16 as the third seed (`kt_deepseek_v4.py`, `dequantize_fp8_blocks`) does:
//! `bf16(f32(e4m3) * 2^(s-127))`, rounding to nearest even, for any block shape
//! (`[128, 128]` in V4, `[32, 32]` in V4.1). Errors, in the seed's order: any
//! non-finite (E8M0 255) or non-positive scale in the tensor, then per row a non-finite
//! product, then a product that overflows BF16.

use std::sync::OnceLock;

use super::CodecError;
use super::float::f32_to_bf16;
use super::mxfp4::e8m0_to_f32;
use super::simd::{self, Level};

fn e4m3_value(b: u8) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0f32 } else { 1.0 };
    let e = ((b >> 3) & 0xF) as i32;
    let m = (b & 7) as i32;
    if e == 15 && m == 7 {
        return f32::NAN;
    }
    let mag = if e == 0 { m as f32 * 2f32.powi(-9) } else { (8 + m) as f32 * 2f32.powi(e - 10) };
    sign * mag
}

/// The 256 E4M3 values (NaN for 0x7F and 0xFF).
pub fn e4m3_table() -> &'static [f32; 256] {
    static TABLE: OnceLock<[f32; 256]> = OnceLock::new();
    TABLE.get_or_init(|| std::array::from_fn(|b| e4m3_value(b as u8)))
}

/// Block geometry of an FP8 weight `[rows, cols]` with scales
/// `[ceil(rows/block_rows), ceil(cols/block_cols)]`.
#[derive(Debug, Clone, Copy)]
pub struct Fp8Blocks {
    pub rows: usize,
    pub cols: usize,
    pub block_rows: usize,
    pub block_cols: usize,
}

impl Fp8Blocks {
    pub fn scale_shape(&self) -> (usize, usize) {
        (self.rows.div_ceil(self.block_rows), self.cols.div_ceil(self.block_cols))
    }

    /// Check every scale of the tensor, as the seed does before decoding anything.
    pub fn check_scales(&self, scales: &[u8]) -> Result<(), CodecError> {
        let (sr, sc) = self.scale_shape();
        if scales.len() != sr * sc {
            return Err(CodecError::Shape(format!("FP8 scale tensor has {} values, expected {sr}x{sc}", scales.len())));
        }
        if let Some(i) = scales.iter().position(|&s| e8m0_to_f32(s).is_none_or(|v| v.is_nan() || v <= 0.0)) {
            return Err(CodecError::BadScale { block_row: i / sc, block_col: i % sc });
        }
        Ok(())
    }

    /// Decode rows `first_row..first_row + n` (`weight` holds exactly those rows) into
    /// BF16 bits in `out`, at the process's SIMD level (every level gives the same bits
    /// and errors).
    pub fn to_bf16(&self, weight: &[u8], first_row: usize, scales: &[u8], out: &mut [u16]) -> Result<(), CodecError> {
        self.to_bf16_at(simd::level(), weight, first_row, scales, out)
    }

    /// [`Self::to_bf16`] on all cores (rayon, chunks of whole rows); the same result,
    /// errors included (on an error the rows are decoded again in order to name the first).
    pub fn to_bf16_par(&self, weight: &[u8], first_row: usize, scales: &[u8], out: &mut [u16]) -> Result<(), CodecError> {
        use rayon::prelude::*;
        self.check(weight, first_row, scales, out)?;
        let level = simd::level();
        let rows = (crate::codec::PAR_VALUES / self.cols).max(1);
        let r = weight
            .par_chunks(rows * self.cols)
            .zip(out.par_chunks_mut(rows * self.cols))
            .enumerate()
            .try_for_each(|(c, (w, o))| self.decode_rows(level, w, first_row + c * rows, scales, o));
        r.or_else(|_| self.decode_rows(level, weight, first_row, scales, out))
    }

    pub fn to_bf16_at(&self, level: Level, weight: &[u8], first_row: usize, scales: &[u8], out: &mut [u16]) -> Result<(), CodecError> {
        self.check(weight, first_row, scales, out)?;
        self.decode_rows(level, weight, first_row, scales, out)
    }

    fn check(&self, weight: &[u8], first_row: usize, scales: &[u8], out: &[u16]) -> Result<(), CodecError> {
        self.check_scales(scales)?;
        if self.cols == 0 || !weight.len().is_multiple_of(self.cols) || out.len() != weight.len() || first_row + weight.len() / self.cols > self.rows {
            return Err(CodecError::Shape(format!("FP8 rows {first_row}.. of {} columns do not fit the tensor", self.cols)));
        }
        Ok(())
    }

    /// The decode proper, after [`Self::check`].
    fn decode_rows(&self, level: Level, weight: &[u8], first_row: usize, scales: &[u8], out: &mut [u16]) -> Result<(), CodecError> {
        let table = e4m3_table();
        let (_, sc) = self.scale_shape();
        for (r, (wrow, orow)) in weight.chunks_exact(self.cols).zip(out.chunks_exact_mut(self.cols)).enumerate() {
            let row = first_row + r;
            let srow = &scales[row / self.block_rows * sc..][..sc];
            for (bc, (wseg, oseg)) in wrow.chunks(self.block_cols).zip(orow.chunks_mut(self.block_cols)).enumerate() {
                let m = e8m0_to_f32(srow[bc]).unwrap();
                if segment_at(level, wseg, m, oseg) {
                    // Find the first offender and say what it is, in the seed's order.
                    for (j, &w) in wseg.iter().enumerate() {
                        let v = table[w as usize] * m;
                        let col = bc * self.block_cols + j;
                        if !v.is_finite() {
                            return Err(CodecError::NonFiniteWeight { row, col });
                        }
                        if f32_to_bf16(v) & 0x7F80 == 0x7F80 {
                            return Err(CodecError::Bf16Overflow { row, col });
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

/// One segment of values under one scale to BF16 bits; true if one is non-finite or
/// overflows BF16.
fn segment_at(level: Level, w: &[u8], m: f32, out: &mut [u16]) -> bool {
    #[cfg(target_arch = "x86_64")]
    if let Some(bad) = simd::decode::fp8_to_bf16(level, w, m, out) {
        return bad;
    }
    let _ = level;
    segment_scalar(w, m, out)
}

/// The scalar reference for one segment.
pub(crate) fn segment_scalar(w: &[u8], m: f32, out: &mut [u16]) -> bool {
    let table = e4m3_table();
    let mut bad = false;
    for (&w, o) in w.iter().zip(out.iter_mut()) {
        let v = table[w as usize] * m;
        let b = f32_to_bf16(v);
        bad |= !v.is_finite() || b & 0x7F80 == 0x7F80;
        *o = b;
    }
    bad
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e4m3_values() {
        let t = e4m3_table();
        assert_eq!(t[0x00], 0.0);
        assert_eq!(t[0x38], 1.0);
        assert_eq!(t[0x7E], 448.0);
        assert_eq!(t[0xFE], -448.0);
        assert_eq!(t[0x01], 2f32.powi(-9));
        assert!(t[0x7F].is_nan() && t[0xFF].is_nan());
    }

    #[test]
    fn blocks_and_errors() {
        let g = Fp8Blocks { rows: 3, cols: 3, block_rows: 2, block_cols: 2 };
        // scales [2, 2]: 1, 2, 4, 0.5
        let scales = [127u8, 128, 129, 126];
        let w = [0x38u8; 9];
        let mut out = [0u16; 9];
        g.to_bf16(&w, 0, &scales, &mut out).unwrap();
        let vals: Vec<f32> = out.iter().map(|&b| f32::from_bits((b as u32) << 16)).collect();
        assert_eq!(vals, [1.0, 1.0, 2.0, 1.0, 1.0, 2.0, 4.0, 4.0, 0.5]);
        let mut one = [0u16; 3];
        g.to_bf16(&w[6..], 2, &scales, &mut one).unwrap();
        assert_eq!(&one, &out[6..]);
        assert_eq!(g.to_bf16(&w, 0, &[127, 255, 127, 127], &mut out), Err(CodecError::BadScale { block_row: 0, block_col: 1 }));
        let mut bad = w;
        bad[4] = 0x7F;
        assert_eq!(g.to_bf16(&bad, 0, &scales, &mut out), Err(CodecError::NonFiniteWeight { row: 1, col: 1 }));
        // 448 * 2^127 overflows f32: a non-finite product, as torch reports it.
        assert_eq!(g.to_bf16(&[0x7E; 9], 0, &[254, 127, 127, 127], &mut out), Err(CodecError::NonFiniteWeight { row: 0, col: 0 }));
        // E4M3 has 3 mantissa bits, so every finite product is exact in BF16 (same exponent
        // range as f32): 1.875 * 2^127 is the largest and still finite.
        let w2 = [0x3Fu8; 9];
        assert_eq!(g.to_bf16(&w2, 0, &[254, 254, 254, 254], &mut out).map(|_| out[0]), Ok(0x7F70));
    }
}
