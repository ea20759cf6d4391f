//! Every SIMD level this machine has against the scalar reference, bit for bit: the
//! quantisers on random and adversarial rows (lanes on different search paths, denormals,
//! ties, constant blocks, extremes, non-finite values; errors included), every decoder on
//! random and edge inputs (exhaustive where the input space is small), the kt INT8 path,
//! and the parallel helpers. (Against the reference ggml: tests/codec_golden.rs and
//! `tools/peers/ggml_ref.py diff`, which also run at every level.)

use xpackfs::codec::simd::{self, Level};
use xpackfs::codec::{self, GgmlType, QuantType, float, fp8, kt_int8, mxfp4};

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32
    }
    fn normal(&mut self) -> f32 {
        // Sum of uniforms: cheap, bell-shaped, enough for weight-like data.
        (0..4).map(|_| self.unit()).sum::<f32>() - 2.0
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

fn levels() -> Vec<Level> {
    let l = simd::available();
    eprintln!("SIMD levels on this machine: {:?} (process level {})", l, simd::describe());
    l
}

/// Rows of 256 that send the lanes of one vector down different paths.
fn adversarial_rows(rng: &mut Rng) -> Vec<(&'static str, Vec<f32>)> {
    let n = 256;
    let mut rows: Vec<(&'static str, Vec<f32>)> = Vec::new();
    let sub = |f: &dyn Fn(usize, usize) -> f32| -> Vec<f32> { (0..n).map(|i| f(i / 16, i % 16)).collect() };
    rows.push(("mixed_magnitudes", sub(&|j, i| ((i as f32 * 0.7 + j as f32).sin()) * [1e-30f32, 1.0, 1e20, 1e-3, 0.0, 7.0, 1e-40, 3e5][j % 8])));
    rows.push(("flat_and_busy", sub(&|j, i| if j % 2 == 0 { 0.25 } else { (i as f32 - 7.5) * 0.1 })));
    rows.push(("constant_blocks", sub(&|j, _| (j as f32 - 8.0) * 0.37)));
    rows.push(("all_equal", vec![1.5; n]));
    rows.push(("zeros_and_negative_zeros", (0..n).map(|i| if i % 3 == 0 { -0.0 } else { 0.0 }).collect()));
    rows.push(("denormals", (0..n).map(|i| f32::from_bits(1 + (i as u32 * 7919) % 0x7f_ffff) * if i % 2 == 0 { 1.0 } else { -1.0 }).collect()));
    rows.push(("denormal_and_normal", sub(&|j, i| if j % 2 == 0 { f32::from_bits(3 + i as u32) } else { (i as f32).cos() })));
    rows.push(("integer_ties", (0..n).map(|i| (i % 4) as f32).collect()));
    // Q8_0: amax 127 makes d = id = 1, so x.5 values are exact ties for roundf.
    rows.push(("roundf_ties", (0..n).map(|i| if i % 32 == 0 { 127.0 } else { (i % 32) as f32 * if i % 3 == 0 { -2.5 } else { 1.5 } }).collect()));
    rows.push(("half_ties", (0..n).map(|i| (i % 8) as f32 * 0.5 - 1.75).collect()));
    rows.push(("odd_levels", (0..n).map(|i| (2 * (i % 4) + 1) as f32 * if i % 5 == 0 { -1.0 } else { 1.0 }).collect()));
    rows.push(("extremes", (0..n).map(|i| [f32::MAX, -f32::MAX, 1e38, -3e37, f32::MIN_POSITIVE, 1.0, -1e-45, 0.0][i % 8]).collect()));
    rows.push(("large", (0..n).map(|i| (i as f32).cos() * 1e12).collect()));
    rows.push(("huge", (0..n).map(|i| (i as f32).cos() * 1e17).collect()));
    rows.push(("one_outlier_per_vector", sub(&|j, i| if i == j { 100.0 } else { rng_free(i, j) })));
    rows.push(("infinity", (0..n).map(|i| if i == 40 { f32::INFINITY } else { (i as f32).sin() }).collect()));
    rows.push(("nan", (0..n).map(|i| if i == 200 { f32::NAN } else { (i as f32).sin() }).collect()));
    rows.push(("sign_parity", (0..n).map(|i| if i % 8 < 3 { -0.5 - (i % 3) as f32 } else { 0.5 + (i % 5) as f32 }).collect()));
    let noisy: Vec<f32> = (0..n).map(|_| rng.normal() * 0.02).collect();
    rows.push(("normal", noisy));
    rows
}

fn rng_free(i: usize, j: usize) -> f32 {
    ((i * 31 + j * 17) % 23) as f32 * 0.01 - 0.1
}

fn random_rows(rng: &mut Rng, rows: usize) -> Vec<f32> {
    let mut x = Vec::with_capacity(rows * 256);
    for r in 0..rows {
        let scale = [0.02f32, 1.0, 1e-6, 300.0][r % 4];
        for _ in 0..256 {
            x.push(rng.normal() * scale);
        }
    }
    x
}

fn importance(rng: &mut Rng, n: usize) -> Vec<f32> {
    (0..n).map(|i| if i % 29 == 0 { 0.0 } else { (rng.normal() * 2.0).exp() }).collect()
}

/// Quantise at `level` and at scalar; the same bytes, or the same error.
fn same_quantisation(level: Level, ty: QuantType, x: &[f32], n: usize, imp: Option<&[f32]>, what: &str) {
    let g = ty.ggml();
    let len = x.len() / n * (n / g.block_size as usize) * g.type_size as usize;
    let (mut want, mut got) = (vec![0u8; len], vec![0u8; len]);
    let rw = codec::quantize_rows_at(Level::Scalar, ty, x, n, imp, &mut want);
    let rg = codec::quantize_rows_at(level, ty, x, n, imp, &mut got);
    assert_eq!(rg, rw, "{ty:?} {what} at {level}: result differs");
    if rw.is_ok()
        && let Some(b) = got.iter().zip(&want).position(|(a, b)| a != b)
    {
        panic!("{ty:?} {what} at {level}: byte {b} of {len} differs ({} vs scalar {})", got[b], want[b]);
    }
}

#[test]
fn quantisers_equal_scalar_at_every_level() {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let adv = adversarial_rows(&mut rng);
    // Rows of 4096 built from the adversarial rows in every order (lanes of one vector mix them).
    let mut mixed = Vec::new();
    for r in 0..adv.len() {
        for j in 0..16 {
            mixed.extend_from_slice(&adv[(r + j * 5) % adv.len()].1);
        }
    }
    let random = random_rows(&mut rng, 400);
    let imp256 = importance(&mut rng, 256);
    let imp4096 = importance(&mut rng, 4096);
    let unit = vec![1.0f32; 4096];
    let mut rows_checked = 0usize;
    for level in levels() {
        for (ty, imps) in [
            (QuantType::Q8_0, vec![None]),
            (QuantType::Q2K, vec![None, Some(&imp256[..]), Some(&unit[..256])]),
            (QuantType::Iq2Xxs, vec![Some(&imp256[..]), Some(&unit[..256])]),
        ] {
            for imp in &imps {
                for (name, row) in &adv {
                    same_quantisation(level, ty, row, 256, *imp, name);
                }
                same_quantisation(level, ty, &random, 256, *imp, "random");
                let imp_wide = imp.map(|v| if v[0] == 1.0 { &unit[..] } else { &imp4096[..] });
                same_quantisation(level, ty, &mixed, 4096, imp_wide, "mixed rows of 4096");
                // Partial last vector batch: an odd number of 256-blocks.
                same_quantisation(level, ty, &random[..256 * 3], 256, *imp, "three blocks");
                rows_checked += adv.len() + 400 + mixed.len() / 256 + 3;
            }
        }
    }
    eprintln!("{rows_checked} rows of 256 compared with the scalar path");
}

/// Q3_K, Q4_K, Q5_K and Q6_K, both paths, as `quantisers_equal_scalar_at_every_level`.
#[test]
fn k_quantisers_equal_scalar_at_every_level() {
    let mut rng = Rng(0x51_7CC1_B727_220A);
    let adv = adversarial_rows(&mut rng);
    let mut mixed = Vec::new();
    for r in 0..adv.len() {
        for j in 0..16 {
            mixed.extend_from_slice(&adv[(r + j * 7) % adv.len()].1);
        }
    }
    let random = random_rows(&mut rng, 200);
    let imp256 = importance(&mut rng, 256);
    let imp4096 = importance(&mut rng, 4096);
    for level in levels() {
        for ty in [QuantType::Q3K, QuantType::Q4K, QuantType::Q5K, QuantType::Q6K] {
            for imp in [None, Some(&imp256[..])] {
                for (name, row) in &adv {
                    same_quantisation(level, ty, row, 256, imp, name);
                }
                same_quantisation(level, ty, &random, 256, imp, "random");
                same_quantisation(level, ty, &mixed, 4096, imp.map(|_| &imp4096[..]), "mixed rows of 4096");
                same_quantisation(level, ty, &random[..256 * 3], 256, imp, "three blocks");
                same_quantisation(level, ty, &random[..256 * 3], 768, imp.map(|_| &imp4096[..768]), "one row of three blocks");
            }
        }
    }
}

#[test]
fn parallel_quantiser_equals_serial() {
    let mut rng = Rng(77);
    let x = random_rows(&mut rng, 64);
    let imp = importance(&mut rng, 1024);
    for ty in [QuantType::Q8_0, QuantType::Q2K, QuantType::Iq2Xxs, QuantType::Q3K, QuantType::Q4K, QuantType::Q5K, QuantType::Q6K] {
        let g = ty.ggml();
        let len = x.len() / g.block_size as usize * g.type_size as usize;
        let (mut a, mut b) = (vec![0u8; len], vec![0u8; len]);
        codec::quantize_rows(ty, &x, 1024, Some(&imp), &mut a).unwrap();
        codec::quantize_rows_par(ty, &x, 1024, Some(&imp), &mut b).unwrap();
        assert_eq!(a, b, "{ty:?}");
    }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|f| f.to_bits()).collect()
}

/// Blocks of a type: random bytes with finite fp16 scale fields, plus blocks quantised
/// from real data (so the decoders see what quantisers write), plus all-zero blocks.
fn blocks(rng: &mut Rng, ty: GgmlType, n: usize) -> Vec<u8> {
    let ts = ty.type_size as usize;
    let mut b = rng.bytes(n * ts);
    let fp16_at: &[usize] = match ty.name {
        "Q8_0" | "IQ2_XXS" => &[0],
        "Q2_K" => &[80, 82],
        "Q4_K" => &[0, 2],
        "Q6_K" => &[208],
        _ => &[],
    };
    for (i, blk) in b.chunks_exact_mut(ts).enumerate() {
        for &o in fp16_at {
            // Any finite fp16, subnormals and zero included (exponent field < 31); every 7th
            // block keeps its raw bytes, infinities and NaN included.
            if i % 7 != 3 {
                blk[o + 1] = (blk[o + 1] % 0x7C) | (blk[o + 1] & 0x80);
            }
        }
        if ty.name == "MXFP4" && blk[0] == 255 {
            blk[0] = 254;
        }
    }
    b.extend(vec![0u8; 2 * ts]);
    if let Some(q) = QuantType::from_name(ty.name) {
        let x = random_rows(rng, 4);
        let mut y = vec![0u8; 4 * 256 / ty.block_size as usize * ts];
        codec::quantize_rows(q, &x, 256, Some(&[1.0; 256]), &mut y).unwrap();
        b.extend(y);
    }
    b
}

#[test]
fn decoders_equal_scalar_at_every_level() {
    let mut rng = Rng(12345);
    for level in levels() {
        for name in ["Q8_0", "Q2_K", "Q4_K", "Q6_K", "IQ2_XXS", "MXFP4", "F16", "BF16", "F32"] {
            let ty = GgmlType::from_name(name).unwrap();
            let src = if matches!(name, "F16" | "BF16") {
                // Every 16-bit pattern, then random ones (a length that leaves a scalar tail).
                let mut s: Vec<u8> = (0..=u16::MAX).flat_map(|v| v.to_le_bytes()).collect();
                s.extend(rng.bytes(2 * 1001));
                s
            } else {
                blocks(&mut rng, ty, 2000)
            };
            let n = src.len() / ty.type_size as usize * ty.block_size as usize;
            let (mut want, mut got) = (vec![0f32; n], vec![0f32; n]);
            let rw = codec::dequantize_scalar(ty, &src, &mut want);
            let rg = codec::dequantize_at(level, ty, &src, &mut got);
            assert_eq!(rg, rw, "{name} at {level}");
            assert!(bits(&got) == bits(&want), "{name} at {level}: values differ from the scalar decoder");
            let mut par = vec![0f32; n];
            codec::dequantize_par(ty, &src, &mut par).unwrap();
            assert!(bits(&par) == bits(&want), "{name}: parallel decoder differs");
        }
        // F16/BF16 entry points used by the views directly, with odd lengths.
        let src = rng.bytes(2 * 777);
        for (f, r) in [
            (float::f16_to_f32_at as fn(Level, &[u8], &mut [f32]), float::f16_to_f32_scalar as fn(&[u8], &mut [f32])),
            (float::bf16_to_f32_at, float::bf16_to_f32_scalar),
        ] {
            let (mut a, mut b) = (vec![0f32; 777], vec![0f32; 777]);
            f(level, &src, &mut a);
            r(&src, &mut b);
            assert_eq!(bits(&a), bits(&b));
        }
        // MXFP4 (ggml blocks): every scale byte with random nibbles; the NaN scale's error.
        let mut mx = Vec::new();
        for e in 0..255u8 {
            mx.push(e);
            mx.extend(rng.bytes(16));
        }
        let (mut a, mut b) = (vec![0f32; 255 * 32], vec![0f32; 255 * 32]);
        mxfp4::dequantize_ggml_at(level, &mx, &mut a).unwrap();
        mxfp4::dequantize_ggml_scalar(&mx, &mut b).unwrap();
        assert_eq!(bits(&a), bits(&b), "MXFP4 ggml at {level}");
        mx[17 * 100] = 255;
        assert_eq!(mxfp4::dequantize_ggml_at(level, &mx, &mut a), mxfp4::dequantize_ggml_scalar(&mx, &mut b));
    }
}

#[test]
fn mxfp4_deepseek_equals_scalar_at_every_level() {
    let mut rng = Rng(999);
    let k = 128;
    let rows = 255 * 32 / k + 3;
    let packed = rng.bytes(rows * k / 2);
    let mut scales: Vec<u8> = (0..rows * k / 32).map(|i| (i % 255) as u8).collect(); // every non-NaN scale
    let mut want = vec![0f32; rows * k];
    mxfp4::dequantize_deepseek_scalar(&packed, &scales, k, &mut want).unwrap();
    for level in levels() {
        let mut got = vec![0f32; rows * k];
        mxfp4::dequantize_deepseek_at(level, &packed, &scales, k, &mut got).unwrap();
        assert_eq!(bits(&got), bits(&want), "MXFP4 DeepSeek at {level}");
    }
    let mut par = vec![0f32; rows * k];
    mxfp4::dequantize_deepseek_par(&packed, &scales, k, &mut par).unwrap();
    assert_eq!(bits(&par), bits(&want));
    scales[37] = 255;
    let mut out = vec![0f32; rows * k];
    let e = mxfp4::dequantize_deepseek_scalar(&packed, &scales, k, &mut out);
    for level in levels() {
        assert_eq!(mxfp4::dequantize_deepseek_at(level, &packed, &scales, k, &mut out), e);
    }
    assert_eq!(mxfp4::dequantize_deepseek_par(&packed, &scales, k, &mut out), e);
}

#[test]
fn fp8_to_bf16_equals_scalar_at_every_level() {
    let mut rng = Rng(4242);
    // Every E4M3 byte under every finite scale that keeps the products finite, on rows
    // whose length leaves a tail; then the error cases (NaN byte, overflow).
    let cols: usize = 256 + 13;
    let scale_cols = cols.div_ceil(32);
    let rows = 2 * 128;
    let geo = fp8::Fp8Blocks { rows, cols, block_rows: 2, block_cols: 32 };
    let w: Vec<u8> =
        (0..rows * cols).map(|i| if i % 3 == 0 { (i % 256) as u8 } else { rng.next() as u8 }).map(|b| if b & 0x7F == 0x7F { 0x3A } else { b }).collect();
    let scales: Vec<u8> = (0..rows.div_ceil(2) * scale_cols).map(|i| [1u8, 100, 127, 130, 200, 240, 0][i % 7]).collect();
    let want_at = |w: &[u8], s: &[u8]| {
        let mut o = vec![0u16; w.len()];
        // Scalar reference: the same decode with the level forced to scalar.
        let r = geo.to_bf16_at(Level::Scalar, w, 0, s, &mut o);
        (r, o)
    };
    let (rw, want) = want_at(&w, &scales);
    for level in levels() {
        let mut got = vec![0u16; w.len()];
        assert_eq!(geo.to_bf16_at(level, &w, 0, &scales, &mut got), rw, "{level}");
        assert_eq!(got, want, "FP8 -> BF16 at {level}");
        // A few rows from the middle, as a view's chunk asks.
        let mut part = vec![0u16; 3 * cols];
        geo.to_bf16_at(level, &w[10 * cols..13 * cols], 10, &scales, &mut part).unwrap();
        assert_eq!(part, want[10 * cols..13 * cols]);
    }
    let mut par = vec![0u16; w.len()];
    geo.to_bf16_par(&w, 0, &scales, &mut par).unwrap();
    assert_eq!(par, want);
    for (i, (b, s)) in [(0x7Fu8, 127u8), (0xFE, 254), (0x7E, 250)].into_iter().enumerate() {
        let mut w2 = w.clone();
        w2[5 * cols + 40 + i] = b;
        let mut s2 = scales.clone();
        s2[2 * scale_cols + 1] = s;
        let (rw, _) = want_at(&w2, &s2);
        assert!(rw.is_err(), "case {i} should fail");
        for level in levels() {
            let mut got = vec![0u16; w.len()];
            assert_eq!(geo.to_bf16_at(level, &w2, 0, &s2, &mut got), rw, "{level}");
        }
        assert_eq!(geo.to_bf16_par(&w2, 0, &s2, &mut par), rw);
    }
}

#[test]
fn kt_int8_equals_scalar_at_every_level() {
    let mut rng = Rng(31337);
    let (n, k) = (96, 3584 + 128);
    let mut w: Vec<f32> = (0..n * k).map(|_| rng.normal() * 0.05).collect();
    // Edge rows: all zero, ties at .5 after scaling, one huge value, denormals, tails.
    w[..k].fill(0.0);
    for (c, v) in w[k..2 * k].iter_mut().enumerate() {
        *v = (c % 255) as f32 - 127.0 + if c % 2 == 0 { 0.5 } else { 0.0 };
    }
    w[2 * k + 5] = 1e30;
    for (c, v) in w[3 * k..4 * k].iter_mut().enumerate() {
        *v = f32::from_bits(c as u32 + 1);
    }
    let (mut q0, mut d0) = (vec![0i8; n * k], vec![0f32; n]);
    kt_int8::quantize_scalar(&w, n, k, &mut q0, &mut d0).unwrap();
    for level in levels() {
        let (mut q, mut d) = (vec![0i8; n * k], vec![0f32; n]);
        kt_int8::quantize_at(level, &w, n, k, &mut q, &mut d).unwrap();
        assert_eq!(q, q0, "INT8 quant at {level}");
        assert_eq!(bits(&d), bits(&d0), "INT8 scales at {level}");
        // Odd row lengths leave a scalar tail.
        let (mut q, mut d, mut qs, mut ds) = (vec![0i8; 3 * 37], vec![0f32; 3], vec![0i8; 3 * 37], vec![0f32; 3]);
        kt_int8::quantize_at(level, &w[..3 * 37], 3, 37, &mut q, &mut d).unwrap();
        kt_int8::quantize_scalar(&w[..3 * 37], 3, 37, &mut qs, &mut ds).unwrap();
        assert_eq!((q, bits(&d)), (qs, bits(&ds)));
    }
    let mut packed = vec![0u8; n * k];
    kt_int8::pack(&q0, n, k, &mut packed).unwrap();
    let (p, d) = kt_int8::quantize_pack_par(&w, n, k).unwrap();
    assert_eq!(p, packed);
    assert_eq!(bits(&d), bits(&d0));
}

#[test]
fn level_names_round_trip() {
    for l in Level::ALL {
        assert_eq!(Level::from_name(l.name()), Some(l));
    }
    assert!(simd::available().contains(&simd::level()));
}

/// Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, IQ4_XS, each without and with importance: the adversarial
/// rows (NaN and infinity included), rows of one 32-value block, rows of 4096 mixing them,
/// and a partial last vector of blocks.
#[test]
fn legacy_and_iq4_quantisers_equal_scalar_at_every_level() {
    let mut rng = Rng(0x5851_F42D_4C95_7F2D);
    let adv = adversarial_rows(&mut rng);
    let mut mixed = Vec::new();
    for r in 0..adv.len() {
        for j in 0..16 {
            mixed.extend_from_slice(&adv[(r + j * 7) % adv.len()].1);
        }
    }
    let random = random_rows(&mut rng, 200);
    let imp4096 = importance(&mut rng, 4096);
    let types = [QuantType::Q4_0, QuantType::Q4_1, QuantType::Q5_0, QuantType::Q5_1, QuantType::Iq4Nl, QuantType::Iq4Xs];
    let mut rows_checked = 0usize;
    for level in levels() {
        for ty in types {
            for imp in [None, Some(&imp4096[..])] {
                let cut = |n: usize| imp.map(|v| &v[..n]);
                for (name, row) in &adv {
                    same_quantisation(level, ty, row, 256, cut(256), name);
                    if ty != QuantType::Iq4Xs {
                        same_quantisation(level, ty, row, 32, cut(32), &format!("{name} in rows of 32"));
                    }
                }
                same_quantisation(level, ty, &random, 256, cut(256), "random");
                same_quantisation(level, ty, &mixed, 4096, cut(4096), "mixed rows of 4096");
                same_quantisation(level, ty, &random[..256 * 3], 256, cut(256), "three rows");
                if ty != QuantType::Iq4Xs {
                    same_quantisation(level, ty, &random[..32 * 5], 32, cut(32), "five blocks");
                    same_quantisation(level, ty, &random[..96 * 7], 96, cut(96), "rows of 96");
                }
                rows_checked += 2 * adv.len() + 200 + mixed.len() / 256 + 3;
            }
        }
    }
    eprintln!("{rows_checked} rows compared with the scalar path");
}
