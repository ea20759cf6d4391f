//! The vector vocabulary the kernels are written in, for AVX2 (8 lanes) and AVX-512 (16).
//!
//! Every operation is one IEEE operation per lane with the scalar code's semantics:
//! comparisons are the ordered ones Rust's `<`/`>` are (`ne` the unordered one `!=` is),
//! `select` is the branch, there is no `min`/`max` with hardware NaN rules and no FMA.
//! The tokens [`Avx2`] and [`Avx512`] can only be made by `new()`, which checks the CPU;
//! every method takes one, so holding one is the proof that its intrinsics may run.

#![allow(clippy::missing_safety_doc)]

use std::arch::x86_64::*;

pub(crate) trait Simd: Copy {
    const LANES: usize;
    type F: Copy;
    type I: Copy;
    type M: Copy;

    // ---- f32
    fn splat(self, v: f32) -> Self::F;
    /// `s[..LANES]`.
    fn load(self, s: &[f32]) -> Self::F;
    fn store(self, v: Self::F, d: &mut [f32]);
    fn add(self, a: Self::F, b: Self::F) -> Self::F;
    fn sub(self, a: Self::F, b: Self::F) -> Self::F;
    fn mul(self, a: Self::F, b: Self::F) -> Self::F;
    fn div(self, a: Self::F, b: Self::F) -> Self::F;
    fn sqrt(self, a: Self::F) -> Self::F;
    fn abs(self, a: Self::F) -> Self::F;
    /// `-a` (flips the sign bit, as Rust's unary minus).
    fn neg(self, a: Self::F) -> Self::F {
        self.from_bits(self.ixor(self.to_bits(a), self.isplat(i32::MIN)))
    }
    fn lt(self, a: Self::F, b: Self::F) -> Self::M;
    fn le(self, a: Self::F, b: Self::F) -> Self::M;
    fn gt(self, a: Self::F, b: Self::F) -> Self::M;
    fn ge(self, a: Self::F, b: Self::F) -> Self::M;
    fn eq(self, a: Self::F, b: Self::F) -> Self::M;
    /// `a != b` (true when either is NaN).
    fn ne(self, a: Self::F, b: Self::F) -> Self::M;
    /// `m & (a > b)` (one masked compare where the level has them).
    fn mgt(self, m: Self::M, a: Self::F, b: Self::F) -> Self::M {
        self.mand(m, self.gt(a, b))
    }
    /// `m & (a != b)`, as [`Simd::mgt`].
    fn mne(self, m: Self::M, a: Self::F, b: Self::F) -> Self::M {
        self.mand(m, self.ne(a, b))
    }
    /// `m ? a : b` per lane.
    fn select(self, m: Self::M, a: Self::F, b: Self::F) -> Self::F;
    /// i32 -> f32 (`as f32`).
    fn cvt(self, a: Self::I) -> Self::F;
    /// Truncating f32 -> i32 as `cvttss2si` (0x80000000 for NaN and out of range).
    fn cvtt(self, a: Self::F) -> Self::I;
    /// Round toward zero, staying f32 (`f32::trunc`).
    fn trunc(self, a: Self::F) -> Self::F;
    fn to_bits(self, a: Self::F) -> Self::I;
    #[allow(clippy::wrong_self_convention)] // `self` is the token, as in every method
    fn from_bits(self, a: Self::I) -> Self::F;
    /// The smallest lane (inputs without NaN).
    fn reduce_min(self, a: Self::F) -> f32;
    /// The largest lane (inputs without NaN).
    fn reduce_max(self, a: Self::F) -> f32;
    /// `if a < b { a } else { b }` per lane (`minps`: `b` when equal or either is NaN), the
    /// same as `select(lt(a, b), a, b)` in one instruction.
    fn min(self, a: Self::F, b: Self::F) -> Self::F;
    /// `if a > b { a } else { b }` per lane (`maxps`), as [`Simd::min`].
    fn max(self, a: Self::F, b: Self::F) -> Self::F;
    /// Lane k = the smallest lane of `v[k]`, for the `LANES` vectors `v[..LANES]` at once
    /// (a transposing butterfly: `LANES - 1` shuffles, not `log2(LANES)` per vector).
    /// Inputs without NaN; which of two equal zeros a lane keeps is unspecified.
    fn lane_mins(self, v: &[Self::F]) -> Self::F;
    /// Lane k = the largest lane of `v[k]`, as [`Simd::lane_mins`].
    fn lane_maxs(self, v: &[Self::F]) -> Self::F;
    /// `v[..LANES]` as the rows of a square matrix, transposed in place (lane j of `v[i]`
    /// becomes lane i of `v[j]`).
    fn transpose(self, v: &mut [Self::F]);
    /// `table[idx & 7]` per lane.
    fn lut8(self, table: &[f32; 8], idx: Self::I) -> Self::F;
    /// `LANES` fp16 values (little-endian bytes `s[..2 * LANES]`) -> f32, exactly.
    fn load_f16(self, s: &[u8]) -> Self::F;
    /// `base[idx]` per lane.
    ///
    /// # Safety
    /// Every lane of `idx` is in `0..base.len()`.
    unsafe fn gather(self, base: &[f32], idx: Self::I) -> Self::F;

    // ---- i32
    fn isplat(self, v: i32) -> Self::I;
    /// 0, 1, 2, ...
    fn iota(self) -> Self::I;
    fn iload(self, s: &[i32]) -> Self::I;
    fn istore(self, v: Self::I, d: &mut [i32]);
    fn iadd(self, a: Self::I, b: Self::I) -> Self::I;
    fn isub(self, a: Self::I, b: Self::I) -> Self::I;
    fn iand(self, a: Self::I, b: Self::I) -> Self::I;
    fn ior(self, a: Self::I, b: Self::I) -> Self::I;
    fn ixor(self, a: Self::I, b: Self::I) -> Self::I;
    fn shl<const N: u32>(self, a: Self::I) -> Self::I;
    /// Logical shift right.
    fn shr<const N: u32>(self, a: Self::I) -> Self::I;
    /// Logical shift right by a per-lane count (< 32).
    fn shrv(self, a: Self::I, n: Self::I) -> Self::I;
    /// Shift left by a run-time count (< 32) common to all lanes.
    fn shl_by(self, a: Self::I, n: u32) -> Self::I {
        self.shlv(a, self.isplat(n as i32))
    }
    fn shlv(self, a: Self::I, n: Self::I) -> Self::I;
    fn imin(self, a: Self::I, b: Self::I) -> Self::I;
    fn imax(self, a: Self::I, b: Self::I) -> Self::I;
    fn ieq(self, a: Self::I, b: Self::I) -> Self::M;
    fn igt(self, a: Self::I, b: Self::I) -> Self::M;
    fn iselect(self, m: Self::M, a: Self::I, b: Self::I) -> Self::I;
    /// `LANES` u16 (`s[..LANES]`), zero-extended.
    fn load_u16(self, s: &[u16]) -> Self::I;
    /// `LANES` little-endian u16 (`s[..2 * LANES]`), zero-extended.
    fn load_u16le(self, s: &[u8]) -> Self::I;
    /// `LANES` bytes (`s[..LANES]`), zero-extended.
    fn load_u8(self, s: &[u8]) -> Self::I;
    /// `LANES` bytes (`s[..LANES]`), sign-extended.
    fn load_i8(self, s: &[u8]) -> Self::I;
    /// Lane i = `s[i / 2]` (`s[..LANES / 2]`), zero-extended.
    fn load_u8_dup2(self, s: &[u8]) -> Self::I;
    /// The low byte of each lane into `d[..LANES]`.
    fn store_low_u8(self, v: Self::I, d: &mut [u8]);
    /// The low 16 bits of each lane into `d[..LANES]`.
    fn store_low_u16(self, v: Self::I, d: &mut [u16]);
    /// `base[idx]` per lane.
    ///
    /// # Safety
    /// Every lane of `idx` is in `0..base.len()`.
    unsafe fn igather(self, base: &[i32], idx: Self::I) -> Self::I;

    // ---- masks
    fn mand(self, a: Self::M, b: Self::M) -> Self::M;
    fn mor(self, a: Self::M, b: Self::M) -> Self::M;
    /// `a & !b`
    fn mandnot(self, a: Self::M, b: Self::M) -> Self::M;
    fn mnot(self, a: Self::M) -> Self::M;
    /// Lane i's bit at bit i.
    fn mbits(self, a: Self::M) -> u32;
    fn any(self, a: Self::M) -> bool {
        self.mbits(a) != 0
    }
    /// Lanes `0..n` set.
    fn first(self, n: usize) -> Self::M {
        self.igt(self.isplat(n.min(Self::LANES) as i32), self.iota())
    }
}

/// AVX2 + F16C.
#[derive(Clone, Copy)]
pub(crate) struct Avx2(());

impl Avx2 {
    pub(crate) fn new() -> Option<Avx2> {
        (is_x86_feature_detected!("avx2") && is_x86_feature_detected!("f16c")).then_some(Avx2(()))
    }
}

/// AVX-512 F + BW + VL, with AVX2 and F16C.
#[derive(Clone, Copy)]
pub(crate) struct Avx512(());

impl Avx512 {
    pub(crate) fn new() -> Option<Avx512> {
        (Avx2::new().is_some() && is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bw") && is_x86_feature_detected!("avx512vl"))
            .then_some(Avx512(()))
    }
}

/// Wrap intrinsics as token methods. Each body is one expression over the arguments.
// SAFETY (for every `unsafe` block this macro writes): the method takes `self`, a token
// that `new()` only returns after `is_x86_feature_detected!` found every feature the
// intrinsics need; slices are bounds-checked (`&s[..n]`) before any pointer is taken.
macro_rules! simd_fns {
    ($( fn $name:ident $(<const $c:ident: u32>)? ($($a:ident : $t:ty),*) -> $r:ty { $body:expr } )*) => {
        $(
            #[inline(always)]
            fn $name $(<const $c: u32>)? (self, $($a: $t),*) -> $r {
                // SAFETY: see above: the features were detected by `new()`, and the body
                // bounds-checks every slice before taking a pointer.
                #[allow(unused_unsafe)]
                unsafe { $body }
            }
        )*
    };
}

const _: () = assert!(_CMP_LT_OQ == 0x11);

impl Simd for Avx2 {
    const LANES: usize = 8;
    type F = __m256;
    type I = __m256i;
    type M = __m256;

    simd_fns! {
        fn splat(v: f32) -> __m256 { _mm256_set1_ps(v) }
        fn load(s: &[f32]) -> __m256 { _mm256_loadu_ps(s[..8].as_ptr()) }
        fn store(v: __m256, d: &mut [f32]) -> () { _mm256_storeu_ps(d[..8].as_mut_ptr(), v) }
        fn add(a: __m256, b: __m256) -> __m256 { _mm256_add_ps(a, b) }
        fn sub(a: __m256, b: __m256) -> __m256 { _mm256_sub_ps(a, b) }
        fn mul(a: __m256, b: __m256) -> __m256 { _mm256_mul_ps(a, b) }
        fn div(a: __m256, b: __m256) -> __m256 { _mm256_div_ps(a, b) }
        fn sqrt(a: __m256) -> __m256 { _mm256_sqrt_ps(a) }
        fn abs(a: __m256) -> __m256 { _mm256_and_ps(a, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff))) }
        fn lt(a: __m256, b: __m256) -> __m256 { _mm256_cmp_ps::<_CMP_LT_OQ>(a, b) }
        fn le(a: __m256, b: __m256) -> __m256 { _mm256_cmp_ps::<_CMP_LE_OQ>(a, b) }
        fn gt(a: __m256, b: __m256) -> __m256 { _mm256_cmp_ps::<_CMP_GT_OQ>(a, b) }
        fn ge(a: __m256, b: __m256) -> __m256 { _mm256_cmp_ps::<_CMP_GE_OQ>(a, b) }
        fn eq(a: __m256, b: __m256) -> __m256 { _mm256_cmp_ps::<_CMP_EQ_OQ>(a, b) }
        fn ne(a: __m256, b: __m256) -> __m256 { _mm256_cmp_ps::<_CMP_NEQ_UQ>(a, b) }
        fn select(m: __m256, a: __m256, b: __m256) -> __m256 { _mm256_blendv_ps(b, a, m) }
        fn cvt(a: __m256i) -> __m256 { _mm256_cvtepi32_ps(a) }
        fn cvtt(a: __m256) -> __m256i { _mm256_cvttps_epi32(a) }
        fn trunc(a: __m256) -> __m256 { _mm256_round_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(a) }
        fn to_bits(a: __m256) -> __m256i { _mm256_castps_si256(a) }
        fn from_bits(a: __m256i) -> __m256 { _mm256_castsi256_ps(a) }
        fn reduce_min(a: __m256) -> f32 { {
            let m = _mm_min_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps::<1>(a));
            let m = _mm_min_ps(m, _mm_movehl_ps(m, m));
            _mm_cvtss_f32(_mm_min_ss(m, _mm_shuffle_ps::<1>(m, m)))
        } }
        fn reduce_max(a: __m256) -> f32 { {
            let m = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps::<1>(a));
            let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
            _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps::<1>(m, m)))
        } }
        fn min(a: __m256, b: __m256) -> __m256 { _mm256_min_ps(a, b) }
        fn max(a: __m256, b: __m256) -> __m256 { _mm256_max_ps(a, b) }
        fn lane_mins(v: &[__m256]) -> __m256 { avx2_lane_fold::<false>(v) }
        fn lane_maxs(v: &[__m256]) -> __m256 { avx2_lane_fold::<true>(v) }
        fn transpose(v: &mut [__m256]) -> () { avx2_transpose(v) }
        fn lut8(table: &[f32; 8], idx: __m256i) -> __m256 { _mm256_permutevar8x32_ps(_mm256_loadu_ps(table.as_ptr()), idx) }
        fn load_f16(s: &[u8]) -> __m256 { _mm256_cvtph_ps(_mm_loadu_si128(s[..16].as_ptr().cast())) }
        fn isplat(v: i32) -> __m256i { _mm256_set1_epi32(v) }
        fn iota() -> __m256i { _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7) }
        fn iload(s: &[i32]) -> __m256i { _mm256_loadu_si256(s[..8].as_ptr().cast()) }
        fn istore(v: __m256i, d: &mut [i32]) -> () { _mm256_storeu_si256(d[..8].as_mut_ptr().cast(), v) }
        fn iadd(a: __m256i, b: __m256i) -> __m256i { _mm256_add_epi32(a, b) }
        fn isub(a: __m256i, b: __m256i) -> __m256i { _mm256_sub_epi32(a, b) }
        fn iand(a: __m256i, b: __m256i) -> __m256i { _mm256_and_si256(a, b) }
        fn ior(a: __m256i, b: __m256i) -> __m256i { _mm256_or_si256(a, b) }
        fn ixor(a: __m256i, b: __m256i) -> __m256i { _mm256_xor_si256(a, b) }
        fn shl<const N: u32>(a: __m256i) -> __m256i { _mm256_sll_epi32(a, _mm_cvtsi32_si128(N as i32)) }
        fn shr<const N: u32>(a: __m256i) -> __m256i { _mm256_srl_epi32(a, _mm_cvtsi32_si128(N as i32)) }
        fn shrv(a: __m256i, n: __m256i) -> __m256i { _mm256_srlv_epi32(a, n) }
        fn shlv(a: __m256i, n: __m256i) -> __m256i { _mm256_sllv_epi32(a, n) }
        fn imin(a: __m256i, b: __m256i) -> __m256i { _mm256_min_epi32(a, b) }
        fn imax(a: __m256i, b: __m256i) -> __m256i { _mm256_max_epi32(a, b) }
        fn ieq(a: __m256i, b: __m256i) -> __m256 { _mm256_castsi256_ps(_mm256_cmpeq_epi32(a, b)) }
        fn igt(a: __m256i, b: __m256i) -> __m256 { _mm256_castsi256_ps(_mm256_cmpgt_epi32(a, b)) }
        fn iselect(m: __m256, a: __m256i, b: __m256i) -> __m256i { _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(b), _mm256_castsi256_ps(a), m)) }
        fn load_u16(s: &[u16]) -> __m256i { _mm256_cvtepu16_epi32(_mm_loadu_si128(s[..8].as_ptr().cast())) }
        fn load_u16le(s: &[u8]) -> __m256i { _mm256_cvtepu16_epi32(_mm_loadu_si128(s[..16].as_ptr().cast())) }
        fn load_u8(s: &[u8]) -> __m256i { _mm256_cvtepu8_epi32(_mm_loadl_epi64(s[..8].as_ptr().cast())) }
        fn load_i8(s: &[u8]) -> __m256i { _mm256_cvtepi8_epi32(_mm_loadl_epi64(s[..8].as_ptr().cast())) }
        fn load_u8_dup2(s: &[u8]) -> __m256i { {
            let w = u32::from_le_bytes([s[0], s[1], s[2], s[3]]);
            let b = _mm_shuffle_epi8(_mm_cvtsi32_si128(w as i32), _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, -1, -1, -1, -1, -1, -1, -1, -1));
            _mm256_cvtepu8_epi32(b)
        } }
        fn store_low_u8(v: __m256i, d: &mut [u8]) -> () { {
            let pick = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                        0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
            let b = _mm256_shuffle_epi8(v, pick);
            let lo = _mm_cvtsi128_si32(_mm256_castsi256_si128(b)) as u32;
            let hi = _mm_cvtsi128_si32(_mm256_extracti128_si256::<1>(b)) as u32;
            d[..8].copy_from_slice(&(lo as u64 | (hi as u64) << 32).to_le_bytes());
        } }
        fn store_low_u16(v: __m256i, d: &mut [u16]) -> () { {
            let pick = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1,
                                        0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1);
            let b = _mm256_permute4x64_epi64::<0b1000>(_mm256_shuffle_epi8(v, pick));
            _mm_storeu_si128(d[..8].as_mut_ptr().cast(), _mm256_castsi256_si128(b))
        } }
        fn mand(a: __m256, b: __m256) -> __m256 { _mm256_and_ps(a, b) }
        fn mor(a: __m256, b: __m256) -> __m256 { _mm256_or_ps(a, b) }
        fn mandnot(a: __m256, b: __m256) -> __m256 { _mm256_andnot_ps(b, a) }
        fn mnot(a: __m256) -> __m256 { _mm256_xor_ps(a, _mm256_castsi256_ps(_mm256_set1_epi32(-1))) }
        fn mbits(a: __m256) -> u32 { _mm256_movemask_ps(a) as u32 }
    }

    #[inline(always)]
    unsafe fn gather(self, base: &[f32], idx: __m256i) -> __m256 {
        // SAFETY: the token proves AVX2; the caller guarantees every index is in bounds.
        unsafe { _mm256_i32gather_ps::<4>(base.as_ptr(), idx) }
    }

    #[inline(always)]
    unsafe fn igather(self, base: &[i32], idx: __m256i) -> __m256i {
        // SAFETY: as for `gather`.
        unsafe { _mm256_i32gather_epi32::<4>(base.as_ptr(), idx) }
    }
}

impl Simd for Avx512 {
    const LANES: usize = 16;
    type F = __m512;
    type I = __m512i;
    type M = __mmask16;

    simd_fns! {
        fn splat(v: f32) -> __m512 { _mm512_set1_ps(v) }
        fn load(s: &[f32]) -> __m512 { _mm512_loadu_ps(s[..16].as_ptr()) }
        fn store(v: __m512, d: &mut [f32]) -> () { _mm512_storeu_ps(d[..16].as_mut_ptr(), v) }
        fn add(a: __m512, b: __m512) -> __m512 { _mm512_add_ps(a, b) }
        fn sub(a: __m512, b: __m512) -> __m512 { _mm512_sub_ps(a, b) }
        fn mul(a: __m512, b: __m512) -> __m512 { _mm512_mul_ps(a, b) }
        fn div(a: __m512, b: __m512) -> __m512 { _mm512_div_ps(a, b) }
        fn sqrt(a: __m512) -> __m512 { _mm512_sqrt_ps(a) }
        fn abs(a: __m512) -> __m512 { _mm512_abs_ps(a) }
        fn lt(a: __m512, b: __m512) -> __mmask16 { _mm512_cmp_ps_mask::<_CMP_LT_OQ>(a, b) }
        fn le(a: __m512, b: __m512) -> __mmask16 { _mm512_cmp_ps_mask::<_CMP_LE_OQ>(a, b) }
        fn gt(a: __m512, b: __m512) -> __mmask16 { _mm512_cmp_ps_mask::<_CMP_GT_OQ>(a, b) }
        fn ge(a: __m512, b: __m512) -> __mmask16 { _mm512_cmp_ps_mask::<_CMP_GE_OQ>(a, b) }
        fn eq(a: __m512, b: __m512) -> __mmask16 { _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(a, b) }
        fn ne(a: __m512, b: __m512) -> __mmask16 { _mm512_cmp_ps_mask::<_CMP_NEQ_UQ>(a, b) }
        fn select(m: __mmask16, a: __m512, b: __m512) -> __m512 { _mm512_mask_blend_ps(m, b, a) }
        fn cvt(a: __m512i) -> __m512 { _mm512_cvtepi32_ps(a) }
        fn cvtt(a: __m512) -> __m512i { _mm512_cvttps_epi32(a) }
        fn trunc(a: __m512) -> __m512 { _mm512_roundscale_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(a) }
        fn to_bits(a: __m512) -> __m512i { _mm512_castps_si512(a) }
        fn from_bits(a: __m512i) -> __m512 { _mm512_castsi512_ps(a) }
        fn reduce_min(a: __m512) -> f32 { _mm512_reduce_min_ps(a) }
        fn reduce_max(a: __m512) -> f32 { _mm512_reduce_max_ps(a) }
        fn mgt(m: __mmask16, a: __m512, b: __m512) -> __mmask16 { _mm512_mask_cmp_ps_mask::<_CMP_GT_OQ>(m, a, b) }
        fn mne(m: __mmask16, a: __m512, b: __m512) -> __mmask16 { _mm512_mask_cmp_ps_mask::<_CMP_NEQ_UQ>(m, a, b) }
        fn min(a: __m512, b: __m512) -> __m512 { _mm512_min_ps(a, b) }
        fn max(a: __m512, b: __m512) -> __m512 { _mm512_max_ps(a, b) }
        fn lane_mins(v: &[__m512]) -> __m512 { avx512_lane_fold::<false>(v) }
        fn lane_maxs(v: &[__m512]) -> __m512 { avx512_lane_fold::<true>(v) }
        fn transpose(v: &mut [__m512]) -> () { avx512_transpose(v) }
        fn lut8(table: &[f32; 8], idx: __m512i) -> __m512 {
            _mm512_permutexvar_ps(_mm512_and_si512(idx, _mm512_set1_epi32(7)), _mm512_castps256_ps512(_mm256_loadu_ps(table.as_ptr())))
        }
        fn load_f16(s: &[u8]) -> __m512 { _mm512_cvtph_ps(_mm256_loadu_si256(s[..32].as_ptr().cast())) }
        fn isplat(v: i32) -> __m512i { _mm512_set1_epi32(v) }
        fn iota() -> __m512i { _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15) }
        fn iload(s: &[i32]) -> __m512i { _mm512_loadu_si512(s[..16].as_ptr().cast()) }
        fn istore(v: __m512i, d: &mut [i32]) -> () { _mm512_storeu_si512(d[..16].as_mut_ptr().cast(), v) }
        fn iadd(a: __m512i, b: __m512i) -> __m512i { _mm512_add_epi32(a, b) }
        fn isub(a: __m512i, b: __m512i) -> __m512i { _mm512_sub_epi32(a, b) }
        fn iand(a: __m512i, b: __m512i) -> __m512i { _mm512_and_si512(a, b) }
        fn ior(a: __m512i, b: __m512i) -> __m512i { _mm512_or_si512(a, b) }
        fn ixor(a: __m512i, b: __m512i) -> __m512i { _mm512_xor_si512(a, b) }
        fn shl<const N: u32>(a: __m512i) -> __m512i { _mm512_slli_epi32::<N>(a) }
        fn shr<const N: u32>(a: __m512i) -> __m512i { _mm512_srli_epi32::<N>(a) }
        fn shrv(a: __m512i, n: __m512i) -> __m512i { _mm512_srlv_epi32(a, n) }
        fn shlv(a: __m512i, n: __m512i) -> __m512i { _mm512_sllv_epi32(a, n) }
        fn imin(a: __m512i, b: __m512i) -> __m512i { _mm512_min_epi32(a, b) }
        fn imax(a: __m512i, b: __m512i) -> __m512i { _mm512_max_epi32(a, b) }
        fn ieq(a: __m512i, b: __m512i) -> __mmask16 { _mm512_cmpeq_epi32_mask(a, b) }
        fn igt(a: __m512i, b: __m512i) -> __mmask16 { _mm512_cmpgt_epi32_mask(a, b) }
        fn iselect(m: __mmask16, a: __m512i, b: __m512i) -> __m512i { _mm512_mask_blend_epi32(m, b, a) }
        fn load_u16(s: &[u16]) -> __m512i { _mm512_cvtepu16_epi32(_mm256_loadu_si256(s[..16].as_ptr().cast())) }
        fn load_u16le(s: &[u8]) -> __m512i { _mm512_cvtepu16_epi32(_mm256_loadu_si256(s[..32].as_ptr().cast())) }
        fn load_u8(s: &[u8]) -> __m512i { _mm512_cvtepu8_epi32(_mm_loadu_si128(s[..16].as_ptr().cast())) }
        fn load_i8(s: &[u8]) -> __m512i { _mm512_cvtepi8_epi32(_mm_loadu_si128(s[..16].as_ptr().cast())) }
        fn load_u8_dup2(s: &[u8]) -> __m512i { {
            let b = _mm_shuffle_epi8(_mm_loadl_epi64(s[..8].as_ptr().cast()), _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7));
            _mm512_cvtepu8_epi32(b)
        } }
        fn store_low_u8(v: __m512i, d: &mut [u8]) -> () { _mm_storeu_si128(d[..16].as_mut_ptr().cast(), _mm512_cvtepi32_epi8(v)) }
        fn store_low_u16(v: __m512i, d: &mut [u16]) -> () { _mm256_storeu_si256(d[..16].as_mut_ptr().cast(), _mm512_cvtepi32_epi16(v)) }
        fn mand(a: __mmask16, b: __mmask16) -> __mmask16 { a & b }
        fn mor(a: __mmask16, b: __mmask16) -> __mmask16 { a | b }
        fn mandnot(a: __mmask16, b: __mmask16) -> __mmask16 { a & !b }
        fn mnot(a: __mmask16) -> __mmask16 { !a }
        fn mbits(a: __mmask16) -> u32 { a as u32 }
    }

    #[inline(always)]
    unsafe fn gather(self, base: &[f32], idx: __m512i) -> __m512 {
        // SAFETY: the token proves AVX-512F; the caller guarantees every index is in bounds.
        unsafe { _mm512_i32gather_ps::<4>(idx, base.as_ptr()) }
    }

    #[inline(always)]
    unsafe fn igather(self, base: &[i32], idx: __m512i) -> __m512i {
        // SAFETY: as for `gather`.
        unsafe { _mm512_i32gather_epi32::<4>(idx, base.as_ptr()) }
    }
}

/// [`Simd::transpose`] for AVX2: pairs of rows interleaved, then pairs of pairs, then
/// 128-bit halves exchanged.
///
/// # Safety
/// AVX2 is available (the caller holds an [`Avx2`] token).
#[inline(always)]
unsafe fn avx2_transpose(v: &mut [__m256]) {
    let v = &mut v[..8];
    // SAFETY: the caller has AVX2; no memory is touched.
    unsafe {
        let mut t = [_mm256_setzero_ps(); 8];
        for k in 0..4 {
            t[2 * k] = _mm256_unpacklo_ps(v[2 * k], v[2 * k + 1]);
            t[2 * k + 1] = _mm256_unpackhi_ps(v[2 * k], v[2 * k + 1]);
        }
        let pd = _mm256_castps_pd;
        let mut u = [_mm256_setzero_ps(); 8];
        for k in 0..2 {
            u[4 * k] = _mm256_castpd_ps(_mm256_unpacklo_pd(pd(t[4 * k]), pd(t[4 * k + 2])));
            u[4 * k + 1] = _mm256_castpd_ps(_mm256_unpackhi_pd(pd(t[4 * k]), pd(t[4 * k + 2])));
            u[4 * k + 2] = _mm256_castpd_ps(_mm256_unpacklo_pd(pd(t[4 * k + 1]), pd(t[4 * k + 3])));
            u[4 * k + 3] = _mm256_castpd_ps(_mm256_unpackhi_pd(pd(t[4 * k + 1]), pd(t[4 * k + 3])));
        }
        for m in 0..4 {
            v[m] = _mm256_permute2f128_ps::<0x20>(u[m], u[4 + m]);
            v[m + 4] = _mm256_permute2f128_ps::<0x31>(u[m], u[4 + m]);
        }
    }
}

/// [`Simd::transpose`] for AVX-512: as AVX2's within 128-bit chunks, then the chunks
/// exchanged in two rounds.
///
/// # Safety
/// AVX-512F is available (the caller holds an [`Avx512`] token).
#[inline(always)]
unsafe fn avx512_transpose(v: &mut [__m512]) {
    let v = &mut v[..16];
    // SAFETY: the caller has AVX-512F; no memory is touched.
    unsafe {
        let mut t = [_mm512_setzero_ps(); 16];
        for k in 0..8 {
            t[2 * k] = _mm512_unpacklo_ps(v[2 * k], v[2 * k + 1]);
            t[2 * k + 1] = _mm512_unpackhi_ps(v[2 * k], v[2 * k + 1]);
        }
        let pd = _mm512_castps_pd;
        let mut u = [_mm512_setzero_ps(); 16];
        for k in 0..4 {
            u[4 * k] = _mm512_castpd_ps(_mm512_unpacklo_pd(pd(t[4 * k]), pd(t[4 * k + 2])));
            u[4 * k + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(pd(t[4 * k]), pd(t[4 * k + 2])));
            u[4 * k + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(pd(t[4 * k + 1]), pd(t[4 * k + 3])));
            u[4 * k + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(pd(t[4 * k + 1]), pd(t[4 * k + 3])));
        }
        let mut w = [_mm512_setzero_ps(); 16];
        for m in 0..4 {
            w[m] = _mm512_shuffle_f32x4::<0x88>(u[m], u[4 + m]);
            w[4 + m] = _mm512_shuffle_f32x4::<0xDD>(u[m], u[4 + m]);
            w[8 + m] = _mm512_shuffle_f32x4::<0x88>(u[8 + m], u[12 + m]);
            w[12 + m] = _mm512_shuffle_f32x4::<0xDD>(u[8 + m], u[12 + m]);
        }
        for m in 0..4 {
            v[m] = _mm512_shuffle_f32x4::<0x88>(w[m], w[8 + m]);
            v[m + 8] = _mm512_shuffle_f32x4::<0xDD>(w[m], w[8 + m]);
            v[m + 4] = _mm512_shuffle_f32x4::<0x88>(w[4 + m], w[12 + m]);
            v[m + 12] = _mm512_shuffle_f32x4::<0xDD>(w[4 + m], w[12 + m]);
        }
    }
}

/// [`Simd::lane_mins`] / [`Simd::lane_maxs`] for AVX2 (`MAX`: maxima): three rounds of
/// pairing, each halving the vectors: lanes `[a's reduced half, b's reduced half]`. The
/// rounds leave vector `ORDER[k]`'s result in lane k, so the inputs go in that order.
/// (No closures here: a closure is not compiled with the caller's target features.)
///
/// # Safety
/// AVX2 is available (the caller holds an [`Avx2`] token).
#[inline(always)]
unsafe fn avx2_lane_fold<const MAX: bool>(v: &[__m256]) -> __m256 {
    const ORDER: [usize; 8] = [0, 4, 1, 5, 2, 6, 3, 7];
    let v = &v[..8];
    // SAFETY: the caller has AVX2; no memory is touched.
    unsafe {
        #[inline(always)]
        unsafe fn op<const MAX: bool>(a: __m256, b: __m256) -> __m256 {
            // SAFETY: as the caller's.
            unsafe { if MAX { _mm256_max_ps(a, b) } else { _mm256_min_ps(a, b) } }
        }
        // Halves of 128 bits: [a.lo, b.hi] against [a.hi, b.lo].
        let mut r4 = [_mm256_setzero_ps(); 4];
        for (p, r) in r4.iter_mut().enumerate() {
            let (a, b) = (v[ORDER[2 * p]], v[ORDER[2 * p + 1]]);
            *r = op::<MAX>(_mm256_blend_ps::<0xF0>(a, b), _mm256_permute2f128_ps::<0x21>(a, b));
        }
        // Pairs within 128 bits: [a0 a1 b2 b3] against [a2 a3 b0 b1].
        let mut r2 = [_mm256_setzero_ps(); 2];
        for (p, r) in r2.iter_mut().enumerate() {
            let (a, b) = (r4[2 * p], r4[2 * p + 1]);
            *r = op::<MAX>(_mm256_blend_ps::<0b1100_1100>(a, b), _mm256_shuffle_ps::<0b01_00_11_10>(a, b));
        }
        // Neighbours: [a0 a2 b0 b2] against [a1 a3 b1 b3].
        let (a, b) = (r2[0], r2[1]);
        op::<MAX>(_mm256_shuffle_ps::<0b10_00_10_00>(a, b), _mm256_shuffle_ps::<0b11_01_11_01>(a, b))
    }
}

/// [`Simd::lane_mins`] / [`Simd::lane_maxs`] for AVX-512: four rounds of pairing at 8, 4,
/// 2 and 1 lanes; in each, groups of `g` lanes alternate between a and b, each group
/// combined with its partner group (a's next, b's previous) by one blend and one
/// two-source permute. The rounds leave vector `ORDER[k]`'s result in lane k.
///
/// # Safety
/// AVX-512F is available (the caller holds an [`Avx512`] token).
#[inline(always)]
unsafe fn avx512_lane_fold<const MAX: bool>(v: &[__m512]) -> __m512 {
    const ORDER: [usize; 16] = [0, 8, 4, 12, 2, 10, 6, 14, 1, 9, 5, 13, 3, 11, 7, 15];
    const fn idx(g: usize) -> [i32; 16] {
        let mut r = [0i32; 16];
        let mut i = 0;
        while i < 16 {
            r[i] = if (i / g).is_multiple_of(2) { (i + g) as i32 } else { (16 + i - g) as i32 };
            i += 1;
        }
        r
    }
    const fn odd(g: usize) -> u16 {
        let mut m = 0u16;
        let mut i = 0;
        while i < 16 {
            if !(i / g).is_multiple_of(2) {
                m |= 1 << i;
            }
            i += 1;
        }
        m
    }
    const IDX: [[i32; 16]; 4] = [idx(8), idx(4), idx(2), idx(1)];
    const ODD: [u16; 4] = [odd(8), odd(4), odd(2), odd(1)];
    #[inline(always)]
    unsafe fn pair<const MAX: bool>(round: usize, a: __m512, b: __m512) -> __m512 {
        // SAFETY: the caller has AVX-512F; the index load reads one whole constant array.
        unsafe {
            let i = _mm512_loadu_si512(IDX[round].as_ptr().cast());
            let (x, y) = (_mm512_mask_blend_ps(ODD[round], a, b), _mm512_permutex2var_ps(a, i, b));
            if MAX { _mm512_max_ps(x, y) } else { _mm512_min_ps(x, y) }
        }
    }
    let v = &v[..16];
    // SAFETY: the caller has AVX-512F.
    unsafe {
        let mut r8 = [_mm512_setzero_ps(); 8];
        for (p, r) in r8.iter_mut().enumerate() {
            *r = pair::<MAX>(0, v[ORDER[2 * p]], v[ORDER[2 * p + 1]]);
        }
        let mut r4 = [_mm512_setzero_ps(); 4];
        for (p, r) in r4.iter_mut().enumerate() {
            *r = pair::<MAX>(1, r8[2 * p], r8[2 * p + 1]);
        }
        let r2 = [pair::<MAX>(2, r4[0], r4[1]), pair::<MAX>(2, r4[2], r4[3])];
        pair::<MAX>(3, r2[0], r2[1])
    }
}

/// `$vis fn $name(level, args...) -> Option<R>`: runs the generic `$kernel(token, args...)`
/// compiled for the level's features (`None` at the scalar level: the caller runs the
/// scalar code). Kernels must be `#[inline(always)]` so they are compiled in here.
macro_rules! simd_entry {
    ($(#[$m:meta])* $vis:vis fn $name:ident($($a:ident : $t:ty),* $(,)?) -> $r:ty => $kernel:path) => {
        $(#[$m])*
        #[allow(clippy::too_many_arguments)]
        $vis fn $name(level: $crate::codec::simd::Level, $($a: $t),*) -> Option<$r> {
            use $crate::codec::simd::{x86, Level};
            #[target_feature(enable = "avx2,f16c")]
            fn avx2(s: x86::Avx2, $($a: $t),*) -> $r {
                $kernel(s, $($a),*)
            }
            #[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl")]
            fn avx512(s: x86::Avx512, $($a: $t),*) -> $r {
                $kernel(s, $($a),*)
            }
            match $crate::codec::simd::clamp(level) {
                // SAFETY: `s` exists only when the CPU has the features `avx512` is compiled for.
                Level::Avx512 => x86::Avx512::new().map(|s| unsafe { avx512(s, $($a),*) }),
                // SAFETY: as above, for `avx2`.
                Level::Avx2 => x86::Avx2::new().map(|s| unsafe { avx2(s, $($a),*) }),
                Level::Scalar => None,
            }
        }
    };
}
pub(crate) use simd_entry;

/// ggml's `nearest_int` per lane: the same f32 add and bit arithmetic as the scalar one.
#[inline(always)]
pub(crate) fn nearest_int<S: Simd>(s: S, f: S::F) -> S::I {
    let v = s.add(f, s.splat(12582912.0));
    s.isub(s.iand(s.to_bits(v), s.isplat(0x007f_ffff)), s.isplat(0x0040_0000))
}

/// `i.clamp(lo, hi)` per lane.
#[inline(always)]
pub(crate) fn iclamp<S: Simd>(s: S, i: S::I, lo: i32, hi: i32) -> S::I {
    s.imin(s.imax(i, s.isplat(lo)), s.isplat(hi))
}

/// `table[idx & 15]` per lane.
#[inline(always)]
pub(crate) fn lut16<S: Simd>(s: S, table: &[f32; 16], idx: S::I) -> S::F {
    let lo: &[f32; 8] = table[..8].try_into().unwrap();
    let hi: &[f32; 8] = table[8..].try_into().unwrap();
    let upper = s.ieq(s.iand(idx, s.isplat(8)), s.isplat(8));
    s.select(upper, s.lut8(hi, idx), s.lut8(lo, idx))
}
