//! Q6_K decode (`dequantize_row_q6_K`): 210-byte blocks of 256 values: ql[128], qh[64],
//! int8 scales[16], fp16 d.

use super::{fp16_to_f32, read_u16};

pub const BYTES: usize = 210;

pub fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(BYTES).zip(dst.chunks_exact_mut(256)) {
        let d = fp16_to_f32(read_u16(b, 208));
        for n in 0..2 {
            let ql = &b[64 * n..];
            let qh = &b[128 + 32 * n..];
            let sc = &b[192 + 8 * n..];
            let y = &mut y[128 * n..];
            for l in 0..32 {
                let is = l / 16;
                let q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i8 as i32 - 32;
                let q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i8 as i32 - 32;
                let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i8 as i32 - 32;
                let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i8 as i32 - 32;
                y[l] = d * sc[is] as i8 as f32 * q1 as f32;
                y[l + 32] = d * sc[is + 2] as i8 as f32 * q2 as f32;
                y[l + 64] = d * sc[is + 4] as i8 as f32 * q3 as f32;
                y[l + 96] = d * sc[is + 6] as i8 as f32 * q4 as f32;
            }
        }
    }
}
