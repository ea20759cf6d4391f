//! The per-tensor type choice of `llama_model_quantize`, ported from `src/llama-quant.cpp`
//! at the pinned commit: `tensor_allows_quantization` (which tensors stay as they are),
//! `tensor_get_category`, `llama_tensor_get_type` and `llama_tensor_get_type_impl` (the
//! per-ftype mixtures, the `i_attention_wv` / `i_ffn_*` counters, `use_more_bits`, the
//! output and tied `token_embd` rules, the 8-expert and 70B rules, the layer index of
//! expert tensors from their names) and `tensor_type_fallback` (rows that are not a whole
//! number of blocks) and `tensor_requires_imatrix`. Default parameters only (no overrides,
//! not `pure`, output quantized), with or without an importance matrix (`has_imatrix`
//! changes the IQ3_XXS, IQ4_NL/IQ4_XS and Q4_0/Q5_0 choices). Tensors must be visited in
//! the writer's order ([`super::layout::order`]), as the counters depend on it.

use super::ftype::Ftype;
use super::hparams::Model;
use crate::codec::GgmlType;

fn ty(name: &str) -> GgmlType {
    GgmlType::from_name(name).expect("a ggml type of the table")
}

/// `ggml_is_quantized`.
pub fn is_quantized(t: GgmlType) -> bool {
    !matches!(t.name, "F32" | "F16" | "BF16" | "I8" | "I16" | "I32" | "I64" | "F64")
}

/// `ggml_n_dims`: dimensions up to the last one that is not 1 (at least 1).
pub fn n_dims(ne: &[u64]) -> usize {
    ne.iter().rposition(|&n| n != 1).map_or(1, |i| i + 1)
}

/// `sscanf(name, "blk.%d.", &layer)`: the layer when the conversion succeeds (the literal
/// dot after it is not checked by the return value, as in C).
pub fn blk_layer(name: &str) -> Option<i64> {
    let rest = name.strip_prefix("blk.")?;
    let rest = rest.trim_start_matches([' ', '\t', '\n', '\x0b', '\x0c', '\r']);
    let (neg, digits) = match rest.as_bytes().first() {
        Some(b'-') => (true, &rest[1..]),
        Some(b'+') => (false, &rest[1..]),
        _ => (false, rest),
    };
    let end = digits.bytes().position(|b| !b.is_ascii_digit()).unwrap_or(digits.len());
    if end == 0 {
        return None;
    }
    // glibc saturates out-of-range values of strtol, then truncates to int.
    let v: i64 = digits[..end].parse::<i64>().unwrap_or(i64::MAX);
    let v = if neg { -v } else { v };
    Some(v.clamp(i32::MIN as i64, i32::MAX as i64))
}

/// `tensor_requires_imatrix`: llama.cpp refuses to write `dst` for this tensor without
/// importance (its IQ1/IQ2/IQ3_XXS types, and Q2_K in a Q2_K_S file), except for the
/// embeddings and the output.
pub fn requires_imatrix(name: &str, dst: GgmlType, ftype: Ftype) -> bool {
    if name == "token_embd.weight" || name == "per_layer_token_embd.weight" || name == "output.weight" {
        return false;
    }
    match dst.name {
        "IQ3_XXS" | "IQ2_XXS" | "IQ2_XS" | "IQ2_S" | "IQ1_M" | "IQ1_S" => true,
        "Q2_K" => ftype == Ftype::Q2_K_S,
        _ => false,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Category {
    TokenEmbd,
    AttentionQ,
    AttentionV,
    AttentionK,
    AttentionQkv,
    AttentionKvB,
    AttentionOutput,
    FfnUp,
    FfnGate,
    FfnDown,
    Output,
    Other,
}

/// `tensor_get_category`.
pub fn category(name: &str) -> Category {
    if name == "output.weight" {
        return Category::Output;
    }
    if name == "token_embd.weight" || name == "per_layer_token_embd.weight" {
        return Category::TokenEmbd;
    }
    let table = [
        ("attn_qkv.weight", Category::AttentionQkv),
        ("attn_kv_b.weight", Category::AttentionKvB),
        ("attn_v.weight", Category::AttentionV),
        ("attn_k.weight", Category::AttentionK),
        ("attn_q.weight", Category::AttentionQ),
        ("attn_output.weight", Category::AttentionOutput),
        ("ffn_up", Category::FfnUp),
        ("ffn_gate", Category::FfnGate),
        ("ffn_down", Category::FfnDown),
    ];
    table.iter().find(|(pat, _)| name.contains(pat)).map_or(Category::Other, |&(_, c)| c)
}

fn is_attn_v(c: Category) -> bool {
    matches!(c, Category::AttentionV | Category::AttentionQkv | Category::AttentionKvB)
}

/// `tensor_allows_quantization` with default parameters, for the ported architectures
/// (none of which has position or token-type embeddings, nor is glm5-next).
pub fn allows_quantization(name: &str, ne: &[u64]) -> bool {
    if n_dims(ne) < 2 {
        return false;
    }
    let has = |s: &str| name.contains(s);
    let mut q = name.ends_with("weight");
    q &= !has("_norm.weight");
    q &= !has("ffn_gate_inp.weight");
    q &= !has("ffn_gate_tid2eid.weight");
    q &= !has("altup") && !has("laurel");
    q &= !has("per_layer_model_proj");
    q &= !has("ssm_conv1d") && !has("shortconv.conv.weight");
    q &= !has("indexer.k_proj.weight") && !has("indexer.q_proj.weight");
    for s in [
        "time_mix_first.weight",
        "time_mix_w0.weight",
        "time_mix_w1.weight",
        "time_mix_w2.weight",
        "time_mix_v0.weight",
        "time_mix_v1.weight",
        "time_mix_v2.weight",
        "time_mix_a0.weight",
        "time_mix_a1.weight",
        "time_mix_a2.weight",
        "time_mix_g1.weight",
        "time_mix_g2.weight",
        "time_mix_decay_w1.weight",
        "time_mix_decay_w2.weight",
        "time_mix_lerp_fused.weight",
        "attn_rel_b.weight",
        ".position_embd",
        "sam.pos_embd",
        "sam.neck.",
        "sam.net_",
        ".rel_pos",
        ".patch_embd",
        ".patch_merger",
        "a.rvq.codebook",
        "mm.a.code_embd",
    ] {
        q &= !has(s);
    }
    q
}

/// Why a type cannot be chosen (llama.cpp throws these).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TypeError {
    #[error("Failed to determine layer for tensor {0}")]
    NoLayer(String),
    #[error("Bad layer {layer} for tensor {name}. Must be in [0, {n_layer})")]
    BadLayer { layer: i64, name: String, n_layer: u64 },
    #[error("no tensor type fallback is defined for type {0}")]
    NoFallback(&'static str),
}

/// `quantize_state_impl`: the counters, in the order tensors are visited.
#[derive(Debug)]
pub struct State<'a> {
    model: &'a Model,
    ftype: Ftype,
    n_attention_wv: i64,
    n_ffn: i64,
    i_attention_wv: i64,
    i_ffn_down: i64,
    i_ffn_gate: i64,
    i_ffn_up: i64,
    has_tied_embeddings: bool,
    /// An importance matrix is given (`qs.has_imatrix`).
    has_imatrix: bool,
    /// Tensors that needed a fallback type.
    pub n_fallback: usize,
}

impl<'a> State<'a> {
    /// `init_quantize_state_counters` over every tensor name; `has_imatrix`: an importance
    /// matrix is given.
    pub fn new<'n>(model: &'a Model, ftype: Ftype, has_imatrix: bool, names: impl Iterator<Item = &'n str>) -> State<'a> {
        let (mut n_attention_wv, mut tied) = (0, true);
        for n in names {
            let c = category(n);
            if is_attn_v(c) {
                n_attention_wv += 1;
            }
            if c == Category::Output {
                tied = false;
            }
        }
        State {
            model,
            ftype,
            n_attention_wv,
            n_ffn: model.n_layer_all as i64,
            i_attention_wv: 0,
            i_ffn_down: 0,
            i_ffn_gate: 0,
            i_ffn_up: 0,
            has_tied_embeddings: tied,
            has_imatrix,
            n_fallback: 0,
        }
    }

    /// The type tensor `name` (shape `ne`, type `cur`) is written with: `llama_tensor_get_type`
    /// for those that allow quantization, else its own type.
    pub fn choose(&mut self, name: &str, ne: &[u64], cur: GgmlType) -> Result<GgmlType, TypeError> {
        if !allows_quantization(name, ne) {
            return Ok(cur);
        }
        let default = self.ftype.default_type().expect("offered file types have a default type");
        if !is_quantized(default) {
            return Ok(default);
        }
        let t = self.get_type_impl(default, name, ne, category(name))?;
        self.fallback(ne[0], t)
    }

    /// `tensor_type_fallback`.
    fn fallback(&mut self, ncols: u64, target: GgmlType) -> Result<GgmlType, TypeError> {
        let qk = target.block_size;
        if ncols.is_multiple_of(qk) {
            return Ok(target);
        }
        self.n_fallback += 1;
        let mut r = match target.name {
            "IQ1_S" | "IQ1_M" | "IQ2_XXS" | "IQ2_XS" | "IQ2_S" | "IQ3_XXS" | "IQ3_S" | "IQ4_XS" => ty("IQ4_NL"),
            "Q2_0" | "Q2_K" | "Q3_K" | "TQ1_0" | "TQ2_0" => ty("Q4_0"),
            "Q4_K" => ty("Q5_0"),
            "Q5_K" => ty("Q5_1"),
            "Q6_K" => ty("Q8_0"),
            _ if qk <= 32 => target,
            other => return Err(TypeError::NoFallback(other)),
        };
        if !ncols.is_multiple_of(r.block_size) {
            r = ty("F16");
        }
        Ok(r)
    }

    /// `layer_info`: the layer of an `ffn_*` tensor (from its name when the model has
    /// experts, else the counter) and the layer count.
    fn layer_info(&self, counter: i64, name: &str) -> Result<(i64, i64), TypeError> {
        let n_layer = self.n_ffn;
        let mut i_layer = counter;
        if self.model.n_expert.max(1) > 1 {
            i_layer = blk_layer(name).ok_or_else(|| TypeError::NoLayer(name.into()))?;
            if i_layer < 0 || i_layer >= n_layer {
                return Err(TypeError::BadLayer { layer: i_layer, name: name.into(), n_layer: n_layer as u64 });
            }
        }
        Ok((i_layer, n_layer))
    }

    /// `llama_tensor_get_type_impl`. Branches are kept one for one with the C chain (some
    /// give the same type), so that a change upstream maps onto one place here.
    #[allow(clippy::if_same_then_else)]
    fn get_type_impl(&mut self, mut new_type: GgmlType, name: &str, ne: &[u64], cat: Category) -> Result<GgmlType, TypeError> {
        use Ftype as F;
        let ftype = self.ftype;
        let m = self.model;
        let is = |n: &str| ty(n);
        let use_more_bits = |i: i64, n: i64| i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
        let fin = |f: &[Ftype]| f.contains(&ftype);
        let n_gqa = m.n_gqa;
        let falcon = m.is_falcon;

        if cat == Category::Output || (self.has_tied_embeddings && cat == Category::TokenEmbd) {
            let nx = ne[0];
            if ftype == F::MXFP4_MOE || falcon || !nx.is_multiple_of(new_type.block_size) {
                new_type = is("Q8_0");
            } else if fin(&[F::IQ2_XXS, F::IQ2_XS, F::IQ3_XXS, F::IQ1_S, F::IQ2_S, F::IQ2_M, F::IQ1_M]) {
                new_type = is("Q5_K");
            } else if new_type.name != "Q8_0" {
                new_type = is("Q6_K");
            }
        } else if ftype == F::MXFP4_MOE {
            new_type = if ne.get(2).copied().unwrap_or(1) > 1 { is("MXFP4") } else { is("Q8_0") };
        } else if cat == Category::TokenEmbd {
            if fin(&[F::IQ2_XXS, F::IQ2_XS, F::IQ1_S, F::IQ1_M]) {
                new_type = is("Q2_K");
            } else if fin(&[F::IQ2_S, F::IQ2_M, F::IQ3_XXS]) {
                new_type = is("IQ3_S");
            } else if fin(&[F::TQ1_0, F::TQ2_0, F::Q2_0]) {
                new_type = is("Q4_K");
            }
        } else if fin(&[F::IQ2_XXS, F::IQ2_XS, F::IQ1_S, F::IQ2_S, F::IQ2_M, F::IQ1_M]) {
            let s_or_m = fin(&[F::IQ2_S, F::IQ2_M]);
            if is_attn_v(cat) {
                new_type = if n_gqa >= 4 || m.n_expert >= 4 {
                    is("Q4_K")
                } else if s_or_m {
                    is("IQ3_S")
                } else {
                    is("Q2_K")
                };
                self.i_attention_wv += 1;
            } else if m.n_expert == 8 && cat == Category::AttentionK {
                new_type = is("Q4_K");
            } else if cat == Category::FfnDown {
                if self.i_ffn_down < self.n_ffn / 8 {
                    new_type = if s_or_m { is("IQ3_S") } else { is("Q2_K") };
                }
                self.i_ffn_down += 1;
            } else if cat == Category::AttentionOutput {
                if m.n_expert == 8 {
                    new_type = is("Q5_K");
                } else if fin(&[F::IQ1_S, F::IQ1_M]) {
                    new_type = is("IQ2_XXS");
                } else if s_or_m {
                    new_type = is("IQ3_S");
                }
            }
        } else if is_attn_v(cat) {
            let (i, n) = (self.i_attention_wv, self.n_attention_wv);
            if ftype == F::Q2_K {
                new_type = if n_gqa >= 4 { is("Q4_K") } else { is("Q3_K") };
            } else if ftype == F::Q2_K_S && n_gqa >= 4 {
                new_type = is("Q4_K");
            } else if ftype == F::IQ3_XXS {
                new_type = if n_gqa >= 4 {
                    is("Q4_K")
                } else if !self.has_imatrix {
                    is("IQ3_S")
                } else {
                    is("IQ3_XXS")
                };
            } else if fin(&[F::IQ3_XS, F::IQ3_S]) && n_gqa >= 4 {
                new_type = is("Q4_K");
            } else if ftype == F::IQ3_M {
                new_type = is("Q4_K");
            } else if ftype == F::Q3_K_M {
                new_type = if i < 2 { is("Q5_K") } else { is("Q4_K") };
            } else if ftype == F::Q3_K_L {
                new_type = is("Q5_K");
            } else if fin(&[F::IQ4_NL, F::IQ4_XS]) && n_gqa >= 4 {
                new_type = is("Q5_K");
            } else if fin(&[F::Q4_K_M, F::Q5_K_M]) && use_more_bits(i, n) {
                new_type = is("Q6_K");
            } else if ftype == F::Q4_K_S && i < 4 {
                new_type = is("Q5_K");
            }
            if m.is_70b && matches!(new_type.name, "Q3_K" | "Q4_K") {
                new_type = is("Q5_K");
            }
            if m.n_expert == 8 {
                new_type = is("Q8_0");
            }
            self.i_attention_wv += 1;
        } else if cat == Category::AttentionK {
            if m.n_expert == 8 {
                new_type = is("Q8_0");
            } else if ftype == F::IQ3_XS {
                new_type = is("IQ3_XXS");
            } else if ftype == F::IQ3_XXS {
                new_type = is("IQ2_S");
            }
        } else if cat == Category::AttentionQ {
            if ftype == F::IQ3_XS {
                new_type = is("IQ3_XXS");
            } else if ftype == F::IQ3_XXS {
                new_type = is("IQ2_S");
            }
        } else if cat == Category::FfnDown {
            let (i_layer, n_layer) = self.layer_info(self.i_ffn_down, name)?;
            if ftype == F::Q2_K {
                new_type = is("Q3_K");
            } else if ftype == F::Q2_K_S {
                if i_layer < n_layer / 8 {
                    new_type = is("Q4_K");
                }
            } else if ftype == F::IQ3_XXS && !self.has_imatrix {
                new_type = if i_layer < n_layer / 8 { is("Q4_K") } else { is("Q3_K") };
            } else if ftype == F::Q3_K_M {
                new_type = if i_layer < n_layer / 16 {
                    is("Q5_K")
                } else if !falcon || use_more_bits(i_layer, n_layer) {
                    is("Q4_K")
                } else {
                    is("Q3_K")
                };
            } else if ftype == F::IQ3_M && (i_layer < n_layer / 8 || (m.n_expert == 8 && use_more_bits(i_layer, n_layer))) {
                new_type = is("Q4_K");
            } else if ftype == F::Q3_K_L {
                new_type = if falcon { is("Q4_K") } else { is("Q5_K") };
            } else if ftype == F::Q4_K_M {
                if falcon {
                    new_type = if i_layer < n_layer / 16 {
                        is("Q6_K")
                    } else if use_more_bits(i_layer, n_layer) {
                        is("Q5_K")
                    } else {
                        is("Q4_K")
                    };
                } else if use_more_bits(i_layer, n_layer) {
                    new_type = is("Q6_K");
                }
            } else if i_layer < n_layer / 8 && fin(&[F::IQ4_NL, F::IQ4_XS]) && !self.has_imatrix {
                new_type = is("Q5_K");
            } else if ftype == F::Q5_K_M && use_more_bits(i_layer, n_layer) {
                new_type = is("Q6_K");
            } else if ftype == F::Q4_K_S && !falcon && i_layer < n_layer / 8 {
                new_type = is("Q5_K");
            } else if fin(&[F::Q4_0, F::Q5_0]) && self.has_imatrix && i_layer < n_layer / 8 {
                // llama.cpp's guard for the first ffn_down layers, with an imatrix only.
                new_type = if ftype == F::Q4_0 { is("Q4_1") } else { is("Q5_1") };
            }
            self.i_ffn_down += 1;
        } else if cat == Category::AttentionOutput {
            if !falcon {
                if m.n_expert == 8 {
                    if fin(&[F::Q2_K, F::IQ3_XS, F::IQ3_XXS, F::Q3_K_S, F::Q3_K_M, F::IQ4_NL, F::Q4_K_S, F::Q4_K_M, F::IQ3_S, F::IQ3_M, F::IQ4_XS]) {
                        new_type = is("Q5_K");
                    }
                } else if ftype == F::Q2_K {
                    new_type = is("Q3_K");
                } else if ftype == F::IQ3_XXS {
                    new_type = is("IQ3_S");
                } else if ftype == F::Q3_K_M || ftype == F::IQ3_M {
                    new_type = is("Q4_K");
                } else if ftype == F::Q3_K_L {
                    new_type = is("Q5_K");
                }
            } else if ftype == F::Q3_K_L {
                new_type = is("Q4_K");
            }
        } else if cat == Category::AttentionQkv {
            if fin(&[F::Q3_K_M, F::Q3_K_L, F::IQ3_M]) {
                new_type = is("Q4_K");
            } else if ftype == F::Q4_K_M {
                new_type = is("Q5_K");
            } else if ftype == F::Q5_K_M {
                new_type = is("Q6_K");
            }
        } else if cat == Category::FfnGate {
            let (i_layer, n_layer) = self.layer_info(self.i_ffn_gate, name)?;
            if ftype == F::IQ3_XS && i_layer >= n_layer / 8 && i_layer < 7 * n_layer / 8 {
                new_type = is("IQ3_XXS");
            }
            self.i_ffn_gate += 1;
        } else if cat == Category::FfnUp {
            let (i_layer, n_layer) = self.layer_info(self.i_ffn_up, name)?;
            if ftype == F::IQ3_XS && i_layer >= n_layer / 8 && i_layer < 7 * n_layer / 8 {
                new_type = is("IQ3_XXS");
            }
            self.i_ffn_up += 1;
        }
        Ok(new_type)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(n_layer: u64, n_expert: u64, n_gqa: u64) -> Model {
        Model { arch: "llama".into(), n_layer_all: n_layer, n_expert, n_gqa, is_70b: false, is_falcon: false }
    }

    #[test]
    fn helpers_follow_c() {
        assert_eq!(n_dims(&[4096, 1, 1]), 1);
        assert_eq!(n_dims(&[1, 4096]), 2);
        assert_eq!(n_dims(&[32, 8, 4]), 3);
        assert_eq!(blk_layer("blk.12.attn_q.weight"), Some(12));
        assert_eq!(blk_layer("blk.007x"), Some(7));
        assert_eq!(blk_layer("output.weight"), None);
        assert!(!allows_quantization("blk.0.attn_norm.weight", &[64, 1]));
        assert!(!allows_quantization("blk.0.ffn_gate_inp.weight", &[64, 8]));
        assert!(!allows_quantization("blk.0.attn_q.bias", &[64, 64]));
        assert!(allows_quantization("blk.0.ffn_up_exps.weight", &[64, 32, 8]));
    }

    #[test]
    fn q4_k_m_mixture() {
        let m = model(16, 0, 4);
        let names: Vec<String> = (0..16).map(|i| format!("blk.{i}.attn_v.weight")).collect();
        let mut s = State::new(&m, Ftype::Q4_K_M, false, names.iter().map(|s| s.as_str()));
        let q4k = ty("Q4_K");
        let got: Vec<&str> = (0..16).map(|i| s.choose(&format!("blk.{i}.attn_v.weight"), &[256, 64], ty("BF16")).unwrap().name).collect();
        // use_more_bits(i, 16): i < 2, i >= 14, (i - 2) % 3 == 2
        let want: Vec<&str> = (0..16i64).map(|i| if !(2..14).contains(&i) || (i - 2) % 3 == 2 { "Q6_K" } else { q4k.name }).collect();
        assert_eq!(got, want);
        // Tied embeddings: token_embd takes the output rule (Q6_K), a 300-wide row falls back.
        assert_eq!(s.choose("token_embd.weight", &[256, 100], ty("BF16")).unwrap().name, "Q6_K");
        assert_eq!(s.choose("blk.0.attn_q.weight", &[300, 64], ty("BF16")).unwrap().name, "F16");
        assert_eq!(s.choose("blk.0.attn_q.weight", &[320, 64], ty("BF16")).unwrap().name, "Q5_0");
        assert_eq!(s.n_fallback, 2);
    }

    #[test]
    fn q8_0_keeps_floats_that_do_not_quantize() {
        let m = model(2, 0, 1);
        let mut s = State::new(&m, Ftype::Q8_0, false, ["output.weight"].into_iter());
        assert_eq!(s.choose("output.weight", &[64, 10], ty("BF16")).unwrap().name, "Q8_0");
        assert_eq!(s.choose("token_embd.weight", &[64, 10], ty("BF16")).unwrap().name, "Q8_0");
        assert_eq!(s.choose("output_norm.weight", &[64], ty("F32")).unwrap().name, "F32");
        assert_eq!(s.choose("blk.0.attn_q.weight", &[40, 64], ty("F16")).unwrap().name, "F16");
        assert_eq!(s.choose("blk.0.attn_q.weight", &[40, 64], ty("BF16")).unwrap().name, "F16");
    }

    #[test]
    fn experts_take_their_layer_from_the_name() {
        let m = model(4, 8, 4);
        let mut s = State::new(&m, Ftype::Q4_K_M, false, std::iter::empty());
        assert_eq!(s.choose("blk.3.ffn_down_exps.weight", &[256, 64, 8], ty("BF16")).unwrap().name, "Q6_K");
        assert_eq!(s.choose("blk.1.ffn_down_exps.weight", &[256, 64, 8], ty("BF16")).unwrap().name, "Q4_K");
        assert!(s.choose("blk.9.ffn_down_exps.weight", &[256, 64, 8], ty("BF16")).unwrap_err().to_string().contains("Bad layer 9"));
        assert_eq!(s.choose("blk.1.attn_v.weight", &[256, 64], ty("BF16")).unwrap().name, "Q8_0");
    }
}
