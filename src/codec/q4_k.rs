//! Q4_K decode (`dequantize_row_q4_K`): 144-byte blocks of 256 values: fp16 d, fp16 dmin,
//! 12 bytes of 6-bit scales and mins, 128 bytes of nibbles.

use super::{fp16_to_f32, read_u16};

pub const BYTES: usize = 144;

fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 { (q[j] & 63, q[j + 4] & 63) } else { ((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4)) }
}

pub fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(BYTES).zip(dst.chunks_exact_mut(256)) {
        let d = fp16_to_f32(read_u16(b, 0));
        let min = fp16_to_f32(read_u16(b, 2));
        let scales = &b[4..16];
        let mut q = &b[16..];
        let mut out = y.iter_mut();
        for is in (0..8).step_by(2) {
            let (sc, m) = scale_min_k4(is, scales);
            let (d1, m1) = (d * sc as f32, min * m as f32);
            let (sc, m) = scale_min_k4(is + 1, scales);
            let (d2, m2) = (d * sc as f32, min * m as f32);
            for &v in &q[..32] {
                *out.next().unwrap() = d1 * (v & 0xF) as f32 - m1;
            }
            for &v in &q[..32] {
                *out.next().unwrap() = d2 * (v >> 4) as f32 - m2;
            }
            q = &q[32..];
        }
    }
}
