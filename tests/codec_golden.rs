//! Golden vectors from the reference ggml (tools/peers/ggml_ref.py golden): every quantiser and
//! decoder must reproduce them bit for bit, at every SIMD level this machine has.
//! Format: see tools/peers/ggml_ref.py.

use xpackfs::codec::{self, GgmlType, QuantType, simd};

struct Record {
    name: String,
    ty: String,
    n_per_row: usize,
    rows: usize,
    input: Vec<u8>,
    importance: Option<Vec<f32>>,
    expected: Vec<u8>,
}

fn parse(path: &str) -> Vec<Record> {
    let data = std::fs::read(path).unwrap_or_else(|e| panic!("{path}: {e} (regenerate with tools/peers/ggml_ref.py golden)"));
    assert_eq!(&data[..4], b"XPG1", "{path}: bad magic");
    let mut pos = 8;
    let u32_at = |pos: &mut usize| {
        let v = u32::from_le_bytes(data[*pos..*pos + 4].try_into().unwrap()) as usize;
        *pos += 4;
        v
    };
    let count = u32::from_le_bytes(data[4..8].try_into().unwrap()) as usize;
    let mut out = Vec::with_capacity(count);
    for _ in 0..count {
        let take = |pos: &mut usize| {
            let n = u32_at(pos);
            let v = data[*pos..*pos + n].to_vec();
            *pos += n;
            v
        };
        let name = String::from_utf8(take(&mut pos)).unwrap();
        let ty = String::from_utf8(take(&mut pos)).unwrap();
        let n_per_row = u32_at(&mut pos);
        let rows = u32_at(&mut pos);
        let has_imp = u32_at(&mut pos) != 0;
        let input = take(&mut pos);
        let importance = has_imp.then(|| {
            let v: Vec<f32> = data[pos..pos + 4 * n_per_row].chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
            pos += 4 * n_per_row;
            v
        });
        let expected = take(&mut pos);
        out.push(Record { name, ty, n_per_row, rows, input, importance, expected });
    }
    assert_eq!(pos, data.len(), "{path}: trailing bytes");
    out
}

const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden");

#[test]
fn quantisers_match_ggml_bit_for_bit() {
    let records = parse(&format!("{DIR}/quantize.bin"));
    assert!(records.len() >= 150);
    let mut failures = Vec::new();
    let mut kinds = std::collections::BTreeSet::new();
    for level in simd::available() {
        for r in &records {
            let ty = QuantType::from_name(&r.ty).unwrap();
            kinds.insert((r.ty.clone(), r.importance.is_some()));
            let src: Vec<f32> = r.input.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
            assert_eq!(src.len(), r.rows * r.n_per_row);
            let mut dst = vec![0u8; r.expected.len()];
            codec::quantize_rows_at(level, ty, &src, r.n_per_row, r.importance.as_deref(), &mut dst).unwrap();
            if dst != r.expected {
                let first = dst.iter().zip(&r.expected).position(|(a, b)| a != b).unwrap();
                failures.push(format!("{} at {level}: first differing byte {first}", r.name));
            }
            // The parallel driver gives the same bytes.
            let mut par = vec![0u8; r.expected.len()];
            codec::quantize_rows_par_at(level, ty, &src, r.n_per_row, r.importance.as_deref(), &mut par).unwrap();
            assert_eq!(par, dst, "{} at {level}: parallel driver differs", r.name);
        }
    }
    assert!(failures.is_empty(), "{} of {} records differ:\n{}", failures.len(), records.len(), failures.join("\n"));
    // Every quantiser, with and without importance where it has both paths.
    for k in [("Q8_0", false), ("Q2_K", false), ("Q2_K", true), ("IQ2_XXS", true)] {
        assert!(kinds.contains(&(k.0.to_string(), k.1)), "no golden records for {k:?}");
    }
}

#[test]
fn decoders_match_ggml_bit_for_bit() {
    let records = parse(&format!("{DIR}/dequantize.bin"));
    let mut seen = Vec::new();
    for level in simd::available() {
        for r in &records {
            let ty = GgmlType::from_name(&r.ty).unwrap();
            let mut dst = vec![0f32; r.expected.len() / 4];
            codec::dequantize_at(level, ty, &r.input, &mut dst).unwrap();
            let got: Vec<u8> = dst.iter().flat_map(|v| v.to_le_bytes()).collect();
            assert!(got == r.expected, "{} at {level}: decoded values differ from the reference", r.name);
            seen.push(r.ty.clone());
        }
    }
    for t in ["Q8_0", "Q2_K", "Q4_K", "Q6_K", "IQ2_XXS", "MXFP4", "F16", "BF16"] {
        assert!(seen.iter().any(|s| s == t), "no golden decode records for {t}");
    }
}

/// tests/golden/quantize_k.bin (tools/peers/ggml_ref.py `golden_k`): Q3_K, Q4_K, Q5_K and Q6_K,
/// both paths of each, at every level (and the parallel driver); its `dequant/` records
/// check the Q3_K and Q5_K decoders.
#[test]
fn k_quantisers_match_ggml_bit_for_bit() {
    let records = parse(&format!("{DIR}/quantize_k.bin"));
    let mut failures = Vec::new();
    let mut kinds = std::collections::BTreeSet::new();
    for level in simd::available() {
        for r in &records {
            if r.name.starts_with("dequant/") {
                let ty = GgmlType::from_name(&r.ty).unwrap();
                let mut dst = vec![0f32; r.expected.len() / 4];
                codec::dequantize_at(level, ty, &r.input, &mut dst).unwrap();
                let got: Vec<u8> = dst.iter().flat_map(|v| v.to_le_bytes()).collect();
                assert!(got == r.expected, "{} at {level}: decoded values differ from the reference", r.name);
                kinds.insert((r.name.clone(), false));
                continue;
            }
            let ty = QuantType::from_name(&r.ty).unwrap();
            kinds.insert((r.ty.clone(), r.importance.is_some()));
            let src: Vec<f32> = r.input.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
            assert_eq!(src.len(), r.rows * r.n_per_row);
            let mut dst = vec![0u8; r.expected.len()];
            codec::quantize_rows_at(level, ty, &src, r.n_per_row, r.importance.as_deref(), &mut dst).unwrap();
            if dst != r.expected {
                let first = dst.iter().zip(&r.expected).position(|(a, b)| a != b).unwrap();
                let row_bytes = r.expected.len() / r.rows;
                failures.push(format!("{} at {level}: first differing byte {first} (row {})", r.name, first / row_bytes));
            }
            let mut par = vec![0u8; r.expected.len()];
            codec::quantize_rows_par_at(level, ty, &src, r.n_per_row, r.importance.as_deref(), &mut par).unwrap();
            assert_eq!(par, dst, "{} at {level}: parallel driver differs", r.name);
        }
    }
    assert!(failures.is_empty(), "{} of {} records differ:\n{}", failures.len(), records.len(), failures.join("\n"));
    for t in ["Q3_K", "Q4_K", "Q5_K", "Q6_K"] {
        for imp in [false, true] {
            assert!(kinds.contains(&(t.to_string(), imp)), "no golden records for {t} (importance: {imp})");
        }
    }
    for t in ["dequant/Q3_K", "dequant/Q5_K"] {
        assert!(kinds.contains(&(t.to_string(), false)), "no golden records for {t}");
    }
}

/// The Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL and IQ4_XS records (tests/golden/*_legacy.bin, a
/// separate small file): both paths of each, rows of 32 and of 256.
#[test]
fn legacy_and_iq4_quantisers_match_ggml_bit_for_bit() {
    let records = parse(&format!("{DIR}/quantize_legacy.bin"));
    let mut failures = Vec::new();
    let mut kinds = std::collections::BTreeSet::new();
    for level in simd::available() {
        for r in &records {
            let ty = QuantType::from_name(&r.ty).unwrap();
            kinds.insert((r.ty.clone(), r.importance.is_some()));
            let src: Vec<f32> = r.input.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
            assert_eq!(src.len(), r.rows * r.n_per_row);
            let mut dst = vec![0u8; r.expected.len()];
            codec::quantize_rows_at(level, ty, &src, r.n_per_row, r.importance.as_deref(), &mut dst).unwrap();
            if dst != r.expected {
                let first = dst.iter().zip(&r.expected).position(|(a, b)| a != b).unwrap();
                failures.push(format!("{} at {level}: first differing byte {first} (row {})", r.name, first / (r.expected.len() / r.rows)));
            }
            let mut par = vec![0u8; r.expected.len()];
            codec::quantize_rows_par_at(level, ty, &src, r.n_per_row, r.importance.as_deref(), &mut par).unwrap();
            assert_eq!(par, dst, "{} at {level}: parallel driver differs", r.name);
        }
    }
    assert!(failures.is_empty(), "{} of {} records differ:\n{}", failures.len(), records.len(), failures.join("\n"));
    for t in ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "IQ4_NL", "IQ4_XS"] {
        for imp in [false, true] {
            assert!(kinds.contains(&(t.to_string(), imp)), "no golden records for {t} (importance {imp})");
        }
    }
}

#[test]
fn legacy_and_iq4_decoders_match_ggml_bit_for_bit() {
    let records = parse(&format!("{DIR}/dequantize_legacy.bin"));
    let mut seen = Vec::new();
    for level in simd::available() {
        for r in &records {
            let ty = GgmlType::from_name(&r.ty).unwrap();
            let mut dst = vec![0f32; r.expected.len() / 4];
            codec::dequantize_at(level, ty, &r.input, &mut dst).unwrap();
            let got: Vec<u8> = dst.iter().flat_map(|v| v.to_le_bytes()).collect();
            assert!(got == r.expected, "{} at {level}: decoded values differ from the reference", r.name);
            seen.push(r.ty.clone());
        }
    }
    for t in ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "IQ4_NL", "IQ4_XS"] {
        assert!(seen.iter().any(|s| s == t), "no golden decode records for {t}");
    }
}
