//! Decoders, lanes = consecutive values. Each value is one IEEE operation (or two, in the
//! scalar code's order) on exactly decoded integers, so there is nothing to reorder:
//! these are the scalar loops, `LANES` values at a time, with the scalar code for tails.

use super::x86::{Simd, lut16, simd_entry};
use crate::codec::iq2_tables::{IQ2XXS_GRID, KSIGNS_IQ2XS};
use crate::codec::mxfp4::{E2M1, KVALUES, e8m0_to_f32, e8m0_to_f32_half};
use crate::codec::{CodecError, float, fp16_to_f32, read_u16};

#[inline(always)]
fn f16<S: Simd>(s: S, src: &[u8], dst: &mut [f32]) {
    let n = dst.len().min(src.len() / 2);
    let main = n / S::LANES * S::LANES;
    for i in (0..main).step_by(S::LANES) {
        s.store(s.load_f16(&src[2 * i..]), &mut dst[i..]);
    }
    float::f16_to_f32_scalar(&src[2 * main..], &mut dst[main..n]);
}

#[inline(always)]
fn bf16<S: Simd>(s: S, src: &[u8], dst: &mut [f32]) {
    let n = dst.len().min(src.len() / 2);
    let main = n / S::LANES * S::LANES;
    for i in (0..main).step_by(S::LANES) {
        s.store(s.from_bits(s.shl::<16>(s.load_u16le(&src[2 * i..]))), &mut dst[i..]);
    }
    float::bf16_to_f32_scalar(&src[2 * main..], &mut dst[main..n]);
}

#[inline(always)]
fn q8_0<S: Simd>(s: S, src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(34).zip(dst.chunks_exact_mut(32)) {
        let d = s.splat(fp16_to_f32(read_u16(b, 0)));
        for j in (0..32).step_by(S::LANES) {
            s.store(s.mul(s.cvt(s.load_i8(&b[2 + j..])), d), &mut y[j..]);
        }
    }
}

#[inline(always)]
fn q2_k<S: Simd>(s: S, src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(84).zip(dst.chunks_exact_mut(256)) {
        let d = fp16_to_f32(read_u16(b, 80));
        let min = fp16_to_f32(read_u16(b, 82));
        let mut is = 0;
        let mut o = 0;
        for n in 0..2 {
            let q = &b[16 + 32 * n..];
            for shift in [0, 2, 4, 6] {
                for half in 0..2 {
                    let sc = b[is];
                    is += 1;
                    let dl = s.splat(d * (sc & 0xF) as f32);
                    let ml = s.splat(min * (sc >> 4) as f32);
                    for k in (0..16).step_by(S::LANES) {
                        let v = s.iand(s.shrv(s.load_u8(&q[k + 16 * half..]), s.isplat(shift)), s.isplat(3));
                        s.store(s.sub(s.mul(dl, s.cvt(v)), ml), &mut y[o + k..]);
                    }
                    o += 16;
                }
            }
        }
    }
}

#[inline(always)]
fn q4_k<S: Simd>(s: S, src: &[u8], dst: &mut [f32]) {
    let sm = |j: usize, q: &[u8]| -> (u8, u8) {
        if j < 4 { (q[j] & 63, q[j + 4] & 63) } else { ((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4)) }
    };
    for (b, y) in src.chunks_exact(144).zip(dst.chunks_exact_mut(256)) {
        let d = fp16_to_f32(read_u16(b, 0));
        let min = fp16_to_f32(read_u16(b, 2));
        let scales = &b[4..16];
        for (g, is) in (0..8).step_by(2).enumerate() {
            let q = &b[16 + 32 * g..16 + 32 * g + 32];
            let (sc1, m1) = sm(is, scales);
            let (sc2, m2) = sm(is + 1, scales);
            let (d1, m1) = (s.splat(d * sc1 as f32), s.splat(min * m1 as f32));
            let (d2, m2) = (s.splat(d * sc2 as f32), s.splat(min * m2 as f32));
            let y = &mut y[64 * g..64 * g + 64];
            for k in (0..32).step_by(S::LANES) {
                let v = s.load_u8(&q[k..]);
                s.store(s.sub(s.mul(d1, s.cvt(s.iand(v, s.isplat(0xF)))), m1), &mut y[k..]);
                s.store(s.sub(s.mul(d2, s.cvt(s.shr::<4>(v))), m2), &mut y[32 + k..]);
            }
        }
    }
}

#[inline(always)]
fn q6_k<S: Simd>(s: S, src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(210).zip(dst.chunks_exact_mut(256)) {
        let d = fp16_to_f32(read_u16(b, 208));
        for n in 0..2 {
            let ql = &b[64 * n..];
            let qh = &b[128 + 32 * n..];
            let sc = &b[192 + 8 * n..];
            let y = &mut y[128 * n..];
            let (m4, m3, c32) = (s.isplat(0xF), s.isplat(3), s.isplat(32));
            for l in (0..32).step_by(S::LANES) {
                let is = l / 16;
                let a = s.load_u8(&ql[l..]);
                let c = s.load_u8(&ql[l + 32..]);
                let h = s.load_u8(&qh[l..]);
                let q1 = s.isub(s.ior(s.iand(a, m4), s.shl::<4>(s.iand(h, m3))), c32);
                let q2 = s.isub(s.ior(s.iand(c, m4), s.shl::<4>(s.iand(s.shr::<2>(h), m3))), c32);
                let q3 = s.isub(s.ior(s.shr::<4>(a), s.shl::<4>(s.iand(s.shr::<4>(h), m3))), c32);
                let q4 = s.isub(s.ior(s.shr::<4>(c), s.shl::<4>(s.iand(s.shr::<6>(h), m3))), c32);
                s.store(s.mul(s.splat(d * sc[is] as i8 as f32), s.cvt(q1)), &mut y[l..]);
                s.store(s.mul(s.splat(d * sc[is + 2] as i8 as f32), s.cvt(q2)), &mut y[l + 32..]);
                s.store(s.mul(s.splat(d * sc[is + 4] as i8 as f32), s.cvt(q3)), &mut y[l + 64..]);
                s.store(s.mul(s.splat(d * sc[is + 6] as i8 as f32), s.cvt(q4)), &mut y[l + 96..]);
            }
        }
    }
}

#[inline(always)]
fn iq2_xxs<S: Simd>(s: S, src: &[u8], dst: &mut [f32]) {
    let groups = S::LANES / 8;
    for (b, y) in src.chunks_exact(66).zip(dst.chunks_exact_mut(256)) {
        let d = fp16_to_f32(read_u16(b, 0));
        for ib32 in 0..8 {
            let a0 = u32::from_le_bytes(b[2 + 8 * ib32..6 + 8 * ib32].try_into().unwrap());
            let a1 = u32::from_le_bytes(b[6 + 8 * ib32..10 + 8 * ib32].try_into().unwrap());
            let db = s.splat(d * (0.5f32 + (a1 >> 28) as f32) * 0.25f32);
            for l0 in (0..4).step_by(groups) {
                let mut grid = [0u8; 16];
                let mut signs = 0i32;
                for g in 0..groups {
                    let l = l0 + g;
                    grid[8 * g..8 * g + 8].copy_from_slice(&IQ2XXS_GRID[((a0 >> (8 * l)) & 0xFF) as usize].to_le_bytes());
                    signs |= (KSIGNS_IQ2XS[((a1 >> (7 * l)) & 127) as usize] as i32) << (8 * g);
                }
                let neg = s.ieq(s.iand(s.shrv(s.isplat(signs), s.iota()), s.isplat(1)), s.isplat(1));
                let sign = s.select(neg, s.splat(-1.0), s.splat(1.0));
                s.store(s.mul(s.mul(db, s.cvt(s.load_u8(&grid))), sign), &mut y[32 * ib32 + 8 * l0..]);
            }
        }
    }
}

#[inline(always)]
fn mxfp4_ggml<S: Simd>(s: S, src: &[u8], dst: &mut [f32]) -> Result<(), CodecError> {
    let kv: [f32; 16] = std::array::from_fn(|i| KVALUES[i] as f32);
    for (bi, (b, out)) in src.chunks_exact(17).zip(dst.chunks_exact_mut(32)).enumerate() {
        let d = s.splat(e8m0_to_f32_half(b[0]).ok_or(CodecError::E8m0Nan { index: bi })?);
        let mut q = [0u8; 16];
        q.copy_from_slice(&b[1..17]);
        for j in (0..16).step_by(S::LANES) {
            let n = s.load_u8(&q[j..]);
            s.store(s.mul(lut16(s, &kv, s.iand(n, s.isplat(0xF))), d), &mut out[j..]);
            s.store(s.mul(lut16(s, &kv, s.shr::<4>(n)), d), &mut out[16 + j..]);
        }
    }
    Ok(())
}

#[inline(always)]
fn mxfp4_deepseek<S: Simd>(s: S, packed: &[u8], scales: &[u8], dst: &mut [f32]) -> Result<(), CodecError> {
    let shift = s.shl::<2>(s.iand(s.iota(), s.isplat(1)));
    for (bi, ((out, q), &sb)) in dst.chunks_exact_mut(32).zip(packed.chunks_exact(16)).zip(scales).enumerate() {
        let scale = s.splat(e8m0_to_f32(sb).ok_or(CodecError::E8m0Nan { index: bi })?);
        for j in (0..32).step_by(S::LANES) {
            let n = s.iand(s.shrv(s.load_u8_dup2(&q[j / 2..]), shift), s.isplat(0xF));
            s.store(s.mul(lut16(s, &E2M1, n), scale), &mut out[j..]);
        }
    }
    Ok(())
}

/// One FP8 segment (one scale `m`) to BF16 bits; true if some value is non-finite or
/// overflows BF16 (the caller then finds and names the first, as the scalar code does).
#[inline(always)]
fn fp8_segment<S: Simd>(s: S, w: &[u8], m: f32, out: &mut [u16]) -> bool {
    let n = w.len().min(out.len());
    let main = n / S::LANES * S::LANES;
    let mv = s.splat(m);
    let nan_bits = s.isplat(f32::NAN.to_bits() as i32);
    let (bias, sub_scale) = (s.isplat(120 << 23), s.splat(1.0 / 512.0));
    let mut bad = s.first(0);
    for i in (0..main).step_by(S::LANES) {
        let b = s.load_u8(&w[i..]);
        let mag = s.iand(b, s.isplat(0x7F));
        // E4M3 as f32 bits: exponent rebiased (7 -> 127), mantissa on top; subnormals
        // (exponent 0) as m * 2^-9, exact and computed without denormal operands (which
        // would cost a microcode assist per instruction); sign as is; 0x7F / 0xFF the
        // table's NaN.
        let normal = s.from_bits(s.iadd(s.shl::<20>(mag), bias));
        let subnormal = s.mul(s.cvt(s.iand(mag, s.isplat(7))), sub_scale);
        let v = s.select(s.igt(s.isplat(8), mag), subnormal, normal);
        let v = s.from_bits(s.ior(s.to_bits(v), s.shl::<24>(s.iand(b, s.isplat(0x80)))));
        let v = s.select(s.ieq(mag, s.isplat(0x7F)), s.from_bits(nan_bits), v);
        let v = s.mul(v, mv);
        let bits = s.to_bits(v);
        let rounding = s.iadd(s.isplat(0x7FFF), s.iand(s.shr::<16>(bits), s.isplat(1)));
        let r = s.shr::<16>(s.iadd(bits, rounding));
        let is_nan = s.ne(v, v);
        let r = s.iselect(is_nan, s.ior(s.shr::<16>(bits), s.isplat(0x40)), r);
        let inf_exp = s.isplat(0x7F80_0000);
        let nonfinite = s.ieq(s.iand(bits, inf_exp), inf_exp);
        let over = s.ieq(s.iand(r, s.isplat(0x7F80)), s.isplat(0x7F80));
        bad = s.mor(bad, s.mor(nonfinite, over));
        s.store_low_u16(r, &mut out[i..]);
    }
    let tail_bad = crate::codec::fp8::segment_scalar(&w[main..n], m, &mut out[main..n]);
    s.any(bad) || tail_bad
}

simd_entry! { pub(crate) fn f16_to_f32(src: &[u8], dst: &mut [f32]) -> () => f16 }
simd_entry! { pub(crate) fn bf16_to_f32(src: &[u8], dst: &mut [f32]) -> () => bf16 }
simd_entry! { pub(crate) fn dequantize_q8_0(src: &[u8], dst: &mut [f32]) -> () => q8_0 }
simd_entry! { pub(crate) fn dequantize_q2_k(src: &[u8], dst: &mut [f32]) -> () => q2_k }
simd_entry! { pub(crate) fn dequantize_q4_k(src: &[u8], dst: &mut [f32]) -> () => q4_k }
simd_entry! { pub(crate) fn dequantize_q6_k(src: &[u8], dst: &mut [f32]) -> () => q6_k }
simd_entry! { pub(crate) fn dequantize_iq2_xxs(src: &[u8], dst: &mut [f32]) -> () => iq2_xxs }
simd_entry! { pub(crate) fn dequantize_mxfp4(src: &[u8], dst: &mut [f32]) -> Result<(), CodecError> => mxfp4_ggml }
simd_entry! { pub(crate) fn dequantize_mxfp4_deepseek(packed: &[u8], scales: &[u8], dst: &mut [f32]) -> Result<(), CodecError> => mxfp4_deepseek }
simd_entry! { pub(crate) fn fp8_to_bf16(w: &[u8], m: f32, out: &mut [u16]) -> bool => fp8_segment }
