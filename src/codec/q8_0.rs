//! Q8_0: blocks of 32 values as an fp16 scale and 32 int8 (34 bytes).
//! `quantize_row_q8_0_ref` (what `quantize_q8_0` runs, importance or not) and
//! `dequantize_row_q8_0`.

use super::{cmax, f32_to_fp16, fp16_to_f32, read_u16};

pub const BLOCK: usize = 32;
pub const BYTES: usize = 34;

pub fn quantize_row(x: &[f32], y: &mut [u8]) {
    for (xb, yb) in x.chunks_exact(BLOCK).zip(y.chunks_exact_mut(BYTES)) {
        let mut amax = 0.0f32;
        for &v in xb {
            amax = cmax(amax, v.abs());
        }
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        yb[..2].copy_from_slice(&f32_to_fp16(d).to_le_bytes());
        for (q, &v) in yb[2..].iter_mut().zip(xb) {
            *q = c_float_to_int8(v * id);
        }
    }
}

/// `y = roundf(x)` into an `int8_t`, as the x86-64 reference build does it: `roundf`
/// (ties away from zero), then `cvttss2si` to 32 bits (0x80000000 for NaN and out-of-range
/// values, e.g. the infinity from a subnormal block's `1/d`), then the low byte.
#[inline]
fn c_float_to_int8(x: f32) -> u8 {
    let r = x.round();
    let i = if r.is_nan() || !(-2147483648.0..2147483648.0).contains(&r) { i32::MIN } else { r as i32 };
    i as u8
}

pub fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(BYTES).zip(dst.chunks_exact_mut(BLOCK)) {
        let d = fp16_to_f32(read_u16(b, 0));
        for (o, &q) in y.iter_mut().zip(&b[2..]) {
            *o = q as i8 as f32 * d;
        }
    }
}
