//! IQ4_XS: 136-byte blocks of 256 values: fp16 `d`, u16 `scales_h` (2 high bits of each of
//! the 8 sub-block scales), `scales_l[4]` (their low nibbles), `qs[128]` (4-bit indices into
//! `kvalues_iq4nl`, 16 bytes per 32 values as IQ4_NL); value = `d * (ls - 32) * KVALUES[q]`.
//!
//! Owns `quantize_iq4_xs` as ggml runs it, importance or not (`quantize_row_iq4_nl_impl(256,
//! 32, ..., ntry = 7)`, the code in [`iq4_nl::quantize_super_block`]) and
//! `dequantize_row_iq4_xs`.

use super::iq4_nl::{self, KVALUES_F, Out};
use super::{fp16_to_f32, read_u16};

pub const QK_K: usize = 256;
pub const BYTES: usize = 136;

/// `quantize_iq4_xs` for one row; `quant_weights` one per column, or `None`.
pub fn quantize_row(x: &[f32], y: &mut [u8], quant_weights: Option<&[f32]>) {
    for (ib, (xb, yb)) in x.chunks_exact(QK_K).zip(y.chunks_exact_mut(BYTES)).enumerate() {
        let qw = quant_weights.map(|w| &w[ib * QK_K..(ib + 1) * QK_K]);
        let (d, rest) = yb.split_at_mut(2);
        let (sh, rest) = rest.split_at_mut(2);
        let (scales_l, qs) = rest.split_at_mut(4);
        let mut scales_h = 0u16;
        iq4_nl::quantize_super_block::<QK_K>(xb, qw, Out { d, qs, scales_h: &mut scales_h, scales_l });
        sh.copy_from_slice(&scales_h.to_le_bytes());
    }
}

/// `dequantize_row_iq4_xs`.
pub fn dequantize(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(BYTES).zip(dst.chunks_exact_mut(QK_K)) {
        let d = fp16_to_f32(read_u16(b, 0));
        let scales_h = read_u16(b, 2);
        for ib in 0..8 {
            let ls = ((b[4 + ib / 2] >> (4 * (ib % 2))) & 0xF) as i32 | ((((scales_h >> (2 * ib)) & 3) as i32) << 4);
            let dl = d * (ls - 32) as f32;
            let qs = &b[8 + 16 * ib..];
            let y = &mut y[32 * ib..];
            for j in 0..16 {
                y[j] = dl * KVALUES_F[(qs[j] & 0xF) as usize];
                y[j + 16] = dl * KVALUES_F[(qs[j] >> 4) as usize];
            }
        }
    }
}
