//! The one table from ggml types to the codec: how rows of a source type become f32
//! (`llama_tensor_dequantize_impl`: F16 and BF16 always, quantized types when the codec
//! decodes them), how f32 rows become an output type (`ggml_quantize_chunk`: F32, F16,
//! BF16, and each quantized type the codec has a quantizer for, through
//! [`QuantType::from_name`], so a quantizer added to the codec is picked up here; with
//! importance where one is given), and
//! `ggml_validate_row_data`'s checks of both (non-finite floats, non-finite fp16 scales).

use crate::codec::{self, GgmlType, QuantType, float};

/// How f32 rows become a type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoder {
    F32,
    F16,
    Bf16,
    Quant(QuantType),
}

/// The encoder of `t`, or None when xpackfs has no quantizer for it yet.
pub fn encoder(t: GgmlType) -> Option<Encoder> {
    match t.name {
        "F32" => Some(Encoder::F32),
        "F16" => Some(Encoder::F16),
        "BF16" => Some(Encoder::Bf16),
        _ => QuantType::from_name(t.name).filter(|q| q.ggml() == t).map(Encoder::Quant),
    }
}

/// Whether rows of `t` can be decoded to f32 (as llama.cpp converts F16/BF16 and dequantizes
/// quantized types; other plain types cannot be converted).
pub fn decodes(t: GgmlType) -> bool {
    matches!(t.name, "F32" | "F16" | "BF16" | "Q8_0" | "Q2_K" | "Q4_K" | "Q6_K" | "IQ2_XXS" | "MXFP4")
}

/// Rows of `t` (`src`) as f32.
pub fn decode(t: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), codec::CodecError> {
    if t.name == "F32" {
        float::f32_to_f32(src, dst);
        return Ok(());
    }
    codec::dequantize_par(t, src, dst)
}

/// f32 rows of `n_per_row` values as `enc` (`ggml_quantize_chunk`): `importance` (one value
/// per column, for every row) goes to the quantizers that take it and is ignored by the
/// others (F32, F16, BF16, Q8_0), as ggml ignores it.
pub fn encode(enc: Encoder, x: &[f32], n_per_row: usize, importance: Option<&[f32]>, out: &mut [u8]) -> Result<(), codec::CodecError> {
    match enc {
        Encoder::F32 => {
            for (o, v) in out.chunks_exact_mut(4).zip(x) {
                o.copy_from_slice(&v.to_le_bytes());
            }
        }
        // ggml_fp32_to_fp16_row: round to nearest even (the inputs are finite).
        Encoder::F16 => {
            for (o, v) in out.chunks_exact_mut(2).zip(x) {
                o.copy_from_slice(&half::f16::from_f32(*v).to_bits().to_le_bytes());
            }
        }
        // ggml_fp32_to_bf16_row_ref.
        Encoder::Bf16 => {
            for (o, v) in out.chunks_exact_mut(2).zip(x) {
                o.copy_from_slice(&float::f32_to_bf16(*v).to_le_bytes());
            }
        }
        Encoder::Quant(q) => codec::quantize_rows_par(q, x, n_per_row, importance, out)?,
    }
    Ok(())
}

/// Byte offsets of the fp16 scales (`d`, and `dmin`/`m` where the block has one) that
/// `ggml_validate_row_data` checks in each block of `t`; None for plain types.
fn fp16_fields(t: GgmlType) -> Option<&'static [usize]> {
    Some(match t.name {
        "Q4_0" | "Q5_0" | "Q8_0" | "IQ4_NL" | "IQ4_XS" | "IQ2_XXS" | "IQ2_XS" | "IQ2_S" | "IQ3_XXS" | "IQ3_S" | "IQ1_S" => &[0],
        "TQ2_0" => &[64],
        "Q4_1" | "Q5_1" | "Q4_K" | "Q5_K" => &[0, 2],
        "Q2_K" => &[80, 82],
        "Q3_K" => &[108],
        "Q6_K" => &[208],
        "TQ1_0" => &[52],
        _ => return None,
    })
}

fn fp16_bad(bits: u16) -> bool {
    bits & 0x7c00 == 0x7c00
}

/// `ggml_validate_row_data(t, bytes)`: the first problem found, as a rule.
pub fn validate(t: GgmlType, bytes: &[u8]) -> Option<String> {
    let count = |bad: &dyn Fn(&[u8]) -> bool, size: usize| bytes.chunks_exact(size).position(bad);
    match t.name {
        "F32" => count(&|b| !f32::from_le_bytes(b.try_into().unwrap()).is_finite(), 4).map(|i| format!("non-finite F32 value at element {i}")),
        "F16" => count(&|b| fp16_bad(u16::from_le_bytes(b.try_into().unwrap())), 2).map(|i| format!("non-finite F16 value at element {i}")),
        "BF16" => count(&|b| u16::from_le_bytes(b.try_into().unwrap()) & 0x7fff >= 0x7f80, 2).map(|i| format!("non-finite BF16 value at element {i}")),
        "MXFP4" => count(&|b| b[0] == 0xff, t.type_size as usize).map(|i| format!("E8M0 scale 255 in block {i}")),
        _ => {
            let fields = fp16_fields(t)?;
            count(&|b| fields.iter().any(|&o| fp16_bad(u16::from_le_bytes([b[o], b[o + 1]]))), t.type_size as usize)
                .map(|i| format!("non-finite {} scale in block {i}", t.name))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_and_validation() {
        let g = |n| GgmlType::from_name(n).unwrap();
        assert_eq!(encoder(g("Q8_0")), Some(Encoder::Quant(QuantType::Q8_0)));
        assert_eq!(encoder(g("F16")), Some(Encoder::F16));
        assert!(encoder(g("TQ1_0")).is_none());
        assert!(validate(g("F32"), &1.0f32.to_le_bytes()).is_none());
        assert!(validate(g("F32"), &f32::NAN.to_le_bytes()).is_some());
        assert!(validate(g("BF16"), &0x7f80u16.to_le_bytes()).is_some());
        assert!(validate(g("BF16"), &0x7f7fu16.to_le_bytes()).is_none());
        let mut q = vec![0u8; 34];
        assert!(validate(g("Q8_0"), &q).is_none());
        q[1] = 0x7c;
        assert!(validate(g("Q8_0"), &q).unwrap().contains("block 0"));
    }
}
