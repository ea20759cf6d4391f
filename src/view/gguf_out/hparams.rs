//! What `llama_model_quantize` learns about the model before choosing any type: the
//! architecture (`llama_model_create`: an unknown one is refused) and the hyperparameters
//! `llama_model_base::load_hparams` reads (required keys, their GGUF types, its
//! assertions), with llama.cpp's own reasons. Only the architectures whose per-arch
//! hyperparameters are ported ([`PORTED`]) are accepted; any other one llama.cpp knows is
//! refused as not ported, not as unknown.

use std::collections::BTreeMap;

use crate::source::gguf::MetaValue;

/// Every architecture name `LLM_ARCH_NAMES` holds at the pinned commit.
const LLAMA_ARCHES: &[&str] = &[
    "clip",
    "llama",
    "llama4",
    "deci",
    "falcon",
    "grok",
    "gpt2",
    "gptj",
    "gptneox",
    "mpt",
    "baichuan",
    "starcoder",
    "refact",
    "bert",
    "modern-bert",
    "nomic-bert",
    "nomic-bert-moe",
    "neo-bert",
    "jina-bert-v2",
    "jina-bert-v3",
    "eurobert",
    "bloom",
    "stablelm",
    "qwen",
    "qwen2",
    "qwen2moe",
    "qwen2vl",
    "qwen3",
    "qwen3moe",
    "qwen3next",
    "qwen3vl",
    "qwen3vlmoe",
    "qwen35",
    "qwen35moe",
    "qwen4exp",
    "phi2",
    "phi3",
    "phimoe",
    "plamo",
    "plamo2",
    "plamo3",
    "codeshell",
    "orion",
    "internlm2",
    "minicpm",
    "minicpm3",
    "gemma",
    "gemma2",
    "gemma3",
    "gemma3n",
    "gemma4",
    "gemma4-assistant",
    "gemma-embedding",
    "starcoder2",
    "mamba",
    "mamba2",
    "maple",
    "jamba",
    "falcon-h1",
    "xverse",
    "command-r",
    "cohere2",
    "cohere2moe",
    "dbrx",
    "olmo",
    "olmo2",
    "olmoe",
    "muse-glimmer",
    "openelm",
    "arctic",
    "deepseek",
    "deepseek2",
    "deepseek2-ocr",
    "deepseek32",
    "deepseek4",
    "chatglm",
    "glm4",
    "glm4moe",
    "glm-dsa",
    "bitnet",
    "t5",
    "t5encoder",
    "jais",
    "jais2",
    "nemotron",
    "nemotron_h",
    "nemotron_h_moe",
    "exaone",
    "exaone4",
    "exaone-moe",
    "rwkv6",
    "rwkv6qwen2",
    "rwkv7",
    "arwkv7",
    "granite",
    "granitemoe",
    "granitehybrid",
    "graniteswitch",
    "granite_swa",
    "chameleon",
    "wavtokenizer-dec",
    "plm",
    "bailingmoe",
    "bailingmoe2",
    "bailingmoe3",
    "dots1",
    "dots3note",
    "arcee",
    "afmoe",
    "laguna",
    "ernie4_5",
    "ernie4_5-moe",
    "hunyuan-moe",
    "hunyuan-dense",
    "hunyuan_vl",
    "hy_v3",
    "hy_v4",
    "smollm3",
    "gpt-oss",
    "lfm2",
    "lfm2moe",
    "dream",
    "smallthinker",
    "llada",
    "llada-moe",
    "seed_oss",
    "grovemoe",
    "apertus",
    "minimax-01",
    "hrm_text",
    "minimax-m2",
    "minimax-m3",
    "cogvlm",
    "rnd1",
    "pangu-embedded",
    "mistral3",
    "eagle3",
    "dflash",
    "mistral4",
    "paddleocr",
    "mimo2",
    "step35",
    "spark2_5",
    "llama-embed",
    "maincoder",
    "kimi-linear",
    "kimi-k3",
    "glm5-next",
    "talkie",
    "mellum",
    "nanbeige",
    "qwen3tts",
    "pockettts",
];

/// Architectures whose `load_arch_hparams` is ported here (each needs
/// `attention.layer_norm_rms_epsilon`; none has position or token-type embeddings;
/// deepseek2 also its MLA ranks and expert keys, `src/models/deepseek2.cpp`).
pub const PORTED: &[&str] = &["llama", "qwen3", "qwen3moe", "deepseek2"];

const LLAMA_MAX_LAYERS: u64 = 512;
const LLAMA_MAX_EXPERTS: u64 = 1024;

/// The model facts the type choice reads.
#[derive(Debug, Clone, PartialEq)]
pub struct Model {
    pub arch: String,
    /// `hparams.n_layer_all`: what the `ffn_*` counters count to.
    pub n_layer_all: u64,
    pub n_expert: u64,
    /// `hparams.n_gqa()` of layer 0 (0 when it has no KV heads).
    pub n_gqa: u64,
    /// `type == LLM_TYPE_70B` (llama with 80 layers and GQA).
    pub is_70b: bool,
    pub is_falcon: bool,
}

/// Why llama.cpp would not load the model (its message).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum HparamError {
    #[error("unknown model architecture: '{0}'")]
    UnknownArch(String),
    #[error("architecture '{0}' is known to llama.cpp but its hyperparameters are not ported to the gguf view yet (ported: {ported})", ported = PORTED.join(", "))]
    NotPorted(String),
    #[error("key not found in model: {0}")]
    Missing(String),
    #[error("key {key} has wrong type {found} but expected type {expected}")]
    WrongType { key: String, found: &'static str, expected: &'static str },
    #[error("{0} has wrong array element type {1}")]
    WrongArrayType(String, &'static str),
    #[error("array length {len} for key {key} exceeds max {max}")]
    ArrayTooLong { key: String, len: u64, max: u64 },
    /// A `GGML_ASSERT` of `load_hparams` (llama.cpp aborts the process).
    #[error("GGML_ASSERT({0}) failed")]
    Assert(&'static str),
    #[error("{0}")]
    Other(String),
}

fn type_name(v: &MetaValue) -> &'static str {
    match v {
        MetaValue::U8(_) => "u8",
        MetaValue::I8(_) => "i8",
        MetaValue::U16(_) => "u16",
        MetaValue::I16(_) => "i16",
        MetaValue::U32(_) => "u32",
        MetaValue::I32(_) => "i32",
        MetaValue::F32(_) => "f32",
        MetaValue::Bool(_) => "bool",
        MetaValue::Str(_) => "str",
        MetaValue::Array { .. } => "arr",
        MetaValue::U64(_) => "u64",
        MetaValue::I64(_) => "i64",
        MetaValue::F64(_) => "f64",
    }
}

fn elem_type_name(t: u32) -> &'static str {
    ["u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "str", "arr", "u64", "i64", "f64"].get(t as usize).copied().unwrap_or("?")
}

struct Kv<'a> {
    meta: &'a BTreeMap<String, MetaValue>,
    arch: &'a str,
}

impl Kv<'_> {
    fn key(&self, suffix: &str) -> String {
        format!("{}.{suffix}", self.arch)
    }

    /// `ml.get_key(key, uint32_t&, required)`.
    fn u32(&self, key: &str, required: bool) -> Result<Option<u64>, HparamError> {
        match self.meta.get(key) {
            None if required => Err(HparamError::Missing(key.into())),
            None => Ok(None),
            Some(MetaValue::U32(v)) => Ok(Some(*v as u64)),
            Some(v) => Err(HparamError::WrongType { key: key.into(), found: type_name(v), expected: "u32" }),
        }
    }

    fn f32(&self, key: &str, required: bool) -> Result<Option<f32>, HparamError> {
        match self.meta.get(key) {
            None if required => Err(HparamError::Missing(key.into())),
            None => Ok(None),
            Some(MetaValue::F32(v)) => Ok(Some(*v)),
            Some(v) => Err(HparamError::WrongType { key: key.into(), found: type_name(v), expected: "f32" }),
        }
    }

    fn bool(&self, key: &str) -> Result<Option<bool>, HparamError> {
        match self.meta.get(key) {
            None => Ok(None),
            Some(MetaValue::Bool(v)) => Ok(Some(*v)),
            Some(v) => Err(HparamError::WrongType { key: key.into(), found: type_name(v), expected: "bool" }),
        }
    }

    fn str(&self, key: &str) -> Result<Option<&str>, HparamError> {
        match self.meta.get(key) {
            None => Ok(None),
            Some(MetaValue::Str(s)) => Ok(Some(s)),
            Some(v) => Err(HparamError::WrongType { key: key.into(), found: type_name(v), expected: "str" }),
        }
    }

    /// `ml.get_key_or_arr(key, arr, n_layer, false)`: the values of every layer (a scalar
    /// fills them all), or None when absent.
    fn u32_or_arr(&self, key: &str, n: u64) -> Result<Option<Vec<u64>>, HparamError> {
        match self.meta.get(key) {
            None => Ok(None),
            Some(MetaValue::Array { elem_type, len, values }) => {
                if !matches!(elem_type, 4 | 5 | 7) {
                    return Err(HparamError::WrongArrayType(key.into(), elem_type_name(*elem_type)));
                }
                if *len > LLAMA_MAX_LAYERS {
                    return Err(HparamError::ArrayTooLong { key: key.into(), len: *len, max: LLAMA_MAX_LAYERS });
                }
                if *len != n {
                    return Err(HparamError::Other(format!("key {key} has wrong array length; expected {n}, got {len}")));
                }
                let vals = values.as_ref().ok_or_else(|| HparamError::Other(format!("{key}: array not kept by the reader")))?;
                Ok(Some(vals.iter().map(|v| v.as_u64().unwrap_or(0)).collect()))
            }
            Some(_) => Ok(self.u32(key, false)?.map(|v| vec![v; n as usize])),
        }
    }
}

/// The model as `llama_model_quantize` loads it, or llama.cpp's reason for refusing it.
pub fn load(meta: &BTreeMap<String, MetaValue>) -> Result<Model, HparamError> {
    let arch = match meta.get("general.architecture") {
        None => String::new(),
        Some(MetaValue::Str(s)) => s.clone(),
        Some(v) => return Err(HparamError::WrongType { key: "general.architecture".into(), found: type_name(v), expected: "str" }),
    };
    if !LLAMA_ARCHES.contains(&arch.as_str()) {
        return Err(HparamError::UnknownArch(arch));
    }
    if !PORTED.contains(&arch.as_str()) {
        return Err(HparamError::NotPorted(arch));
    }
    let kv = Kv { meta, arch: &arch };
    kv.u32(&kv.key("context_length"), true)?;
    let n_embd = kv.u32(&kv.key("embedding_length"), true)?.unwrap_or(0);
    let n_layer_all = kv.u32(&kv.key("block_count"), true)?.unwrap_or(0);
    if n_layer_all == 0 || n_layer_all > LLAMA_MAX_LAYERS {
        return Err(HparamError::Assert("hparams.n_layer_all > 0 && hparams.n_layer_all <= LLAMA_MAX_LAYERS"));
    }
    let n_nextn = kv.u32(&kv.key("nextn_predict_layers"), false)?.unwrap_or(0);
    if n_nextn > n_layer_all {
        return Err(HparamError::Assert("hparams.n_layer_nextn <= hparams.n_layer_all"));
    }
    let n_expert = kv.u32(&kv.key("expert_count"), false)?.unwrap_or(0);
    let used = kv.u32_or_arr(&kv.key("expert_used_count"), n_layer_all)?.unwrap_or_default();
    let groups = kv.u32(&kv.key("expert_group_count"), false)?.unwrap_or(0);
    let group_used = kv.u32(&kv.key("expert_group_used_count"), false)?.unwrap_or(0);
    let used_max = used.iter().copied().max().unwrap_or(0);
    if n_expert > LLAMA_MAX_EXPERTS {
        return Err(HparamError::Assert("hparams.n_expert <= LLAMA_MAX_EXPERTS"));
    }
    if used_max > n_expert {
        return Err(HparamError::Assert("n_expert_used_max <= hparams.n_expert"));
    }
    if n_expert > 0 {
        if used_max == 0 {
            return Err(HparamError::Assert("n_expert_used_max > 0"));
        }
        if groups >= n_expert {
            return Err(HparamError::Assert("hparams.n_expert_groups < hparams.n_expert"));
        }
        if groups > 1 && (!n_expert.is_multiple_of(groups) || group_used == 0 || group_used >= groups) {
            return Err(HparamError::Assert("hparams.n_expert % hparams.n_expert_groups == 0 (and 0 < n_group_used < n_expert_groups)"));
        }
    } else if groups != 0 {
        return Err(HparamError::Assert("hparams.n_expert_groups == 0"));
    }
    kv.u32_or_arr(&kv.key("feed_forward_length"), n_layer_all)?;
    let n_head = kv.u32_or_arr(&kv.key("attention.head_count"), n_layer_all)?.unwrap_or_else(|| vec![0; n_layer_all as usize]);
    let n_head_kv = kv.u32_or_arr(&kv.key("attention.head_count_kv"), n_layer_all)?.unwrap_or_else(|| n_head.clone());
    let scaling = kv.str(&kv.key("rope.scaling.type"))?.unwrap_or("linear");
    if !["none", "linear", "yarn", "longrope"].contains(&scaling) {
        return Err(HparamError::Assert("hparams.rope_scaling_type_train != LLAMA_ROPE_SCALING_TYPE_UNSPECIFIED"));
    }
    let (h0, kv0) = (n_head[0], n_head_kv[0]);
    if let Some(default_head) = n_embd.checked_div(h0) {
        let head_k = kv.u32(&kv.key("attention.key_length"), false)?.unwrap_or(default_head);
        let n_rot = kv.u32(&kv.key("rope.dimension_count"), false)?.unwrap_or(head_k);
        if arch == "llama" && n_rot != head_k {
            return Err(HparamError::Other(format!("invalid n_rot: {n_rot}, expected {head_k}")));
        }
    }
    let n_layer = n_layer_all - n_nextn;
    // load_arch_hparams of llama, qwen3, qwen3moe and deepseek2.
    if arch == "qwen3moe" {
        kv.u32_or_arr(&kv.key("expert_feed_forward_length"), n_layer_all)?;
    }
    if arch == "deepseek2" {
        deepseek2(&kv, n_layer, n_layer_all)?;
    } else {
        kv.f32(&kv.key("attention.layer_norm_rms_epsilon"), true)?;
    }
    let is_70b = arch == "llama" && n_expert != 8 && n_layer == 80 && h0 != kv0;
    Ok(Model { n_layer_all, n_expert, n_gqa: h0.checked_div(kv0).unwrap_or(0), is_70b, is_falcon: arch == "falcon", arch })
}

/// `llama_model_deepseek2::load_arch_hparams`: the keys it reads, in its order (the first
/// one missing or mistyped is the reason).
fn deepseek2(kv: &Kv, n_layer: u64, n_layer_all: u64) -> Result<(), HparamError> {
    let n_vocab = match kv.u32(&kv.key("vocab_size"), false)? {
        Some(v) => v,
        None => match kv.meta.get("tokenizer.ggml.tokens") {
            Some(MetaValue::Array { len, .. }) => *len,
            _ => 0,
        },
    };
    // DeepSeek-V2-Lite, GigaChat3-10B-A1.8B, Kanana-2-30B-A3B have no q_lora_rank.
    let is_lite = n_layer == 27 || n_layer == 26 || (n_layer == 48 && n_vocab == 128256);
    kv.f32(&kv.key("attention.layer_norm_rms_epsilon"), true)?;
    kv.u32(&kv.key("leading_dense_block_count"), false)?;
    if !is_lite {
        kv.u32(&kv.key("attention.q_lora_rank"), true)?;
    }
    kv.u32(&kv.key("attention.kv_lora_rank"), true)?;
    kv.u32(&kv.key("attention.key_length_mla"), false)?;
    kv.u32(&kv.key("attention.value_length_mla"), false)?;
    let ff_exp = kv.key("expert_feed_forward_length");
    if kv.u32_or_arr(&ff_exp, n_layer_all)?.is_none() {
        return Err(HparamError::Missing(ff_exp));
    }
    kv.u32(&kv.key("expert_shared_count"), true)?;
    kv.f32(&kv.key("expert_weights_scale"), false)?;
    kv.bool(&kv.key("expert_weights_norm"))?;
    kv.u32(&kv.key("expert_gating_func"), false)?;
    kv.f32(&kv.key("rope.scaling.yarn_log_multiplier"), false)?;
    kv.f32(&kv.key("attention.temperature_scale"), false)?;
    kv.u32(&kv.key("attention.temperature_length"), false)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(kvs: &[(&str, MetaValue)]) -> BTreeMap<String, MetaValue> {
        kvs.iter().map(|(k, v)| (k.to_string(), v.clone())).collect()
    }

    #[test]
    fn reasons_are_llama_cpps() {
        let mut m = meta(&[("general.architecture", MetaValue::Str("nope".into()))]);
        assert_eq!(load(&m).unwrap_err().to_string(), "unknown model architecture: 'nope'");
        m.insert("general.architecture".into(), MetaValue::Str("llama".into()));
        assert_eq!(load(&m).unwrap_err().to_string(), "key not found in model: llama.context_length");
        m.insert("llama.context_length".into(), MetaValue::U32(64));
        m.insert("llama.embedding_length".into(), MetaValue::U32(64));
        m.insert("llama.block_count".into(), MetaValue::I32(80));
        assert_eq!(load(&m).unwrap_err().to_string(), "key llama.block_count has wrong type i32 but expected type u32");
        m.insert("llama.block_count".into(), MetaValue::U32(80));
        m.insert("llama.attention.head_count".into(), MetaValue::U32(8));
        m.insert("llama.attention.head_count_kv".into(), MetaValue::U32(2));
        assert_eq!(load(&m).unwrap_err().to_string(), "key not found in model: llama.attention.layer_norm_rms_epsilon");
        m.insert("llama.attention.layer_norm_rms_epsilon".into(), MetaValue::F32(1e-5));
        let model = load(&m).unwrap();
        assert_eq!((model.n_gqa, model.is_70b, model.n_layer_all), (4, true, 80));
        m.insert("general.architecture".into(), MetaValue::Str("gpt2".into()));
        assert!(load(&m).unwrap_err().to_string().contains("not ported"));
    }

    #[test]
    fn deepseek2_needs_its_mla_and_expert_keys() {
        let u = MetaValue::U32;
        let mut m = meta(&[
            ("general.architecture", MetaValue::Str("deepseek2".into())),
            ("deepseek2.context_length", u(64)),
            ("deepseek2.embedding_length", u(256)),
            ("deepseek2.block_count", u(4)),
            ("deepseek2.attention.head_count", u(4)),
            ("deepseek2.attention.head_count_kv", u(1)),
            ("deepseek2.attention.layer_norm_rms_epsilon", MetaValue::F32(1e-6)),
        ]);
        let reason = |m: &BTreeMap<String, MetaValue>| load(m).unwrap_err().to_string();
        assert_eq!(reason(&m), "key not found in model: deepseek2.attention.q_lora_rank");
        m.insert("deepseek2.attention.q_lora_rank".into(), u(256));
        assert_eq!(reason(&m), "key not found in model: deepseek2.attention.kv_lora_rank");
        m.insert("deepseek2.attention.kv_lora_rank".into(), u(256));
        assert_eq!(reason(&m), "key not found in model: deepseek2.expert_feed_forward_length");
        m.insert("deepseek2.expert_feed_forward_length".into(), u(128));
        assert_eq!(reason(&m), "key not found in model: deepseek2.expert_shared_count");
        m.insert("deepseek2.expert_shared_count".into(), u(1));
        m.insert("deepseek2.expert_weights_norm".into(), u(1));
        assert_eq!(reason(&m), "key deepseek2.expert_weights_norm has wrong type u32 but expected type bool");
        m.insert("deepseek2.expert_weights_norm".into(), MetaValue::Bool(true));
        assert_eq!(load(&m).unwrap().n_gqa, 4);
        // The lite variants (27 layers) have no q_lora_rank.
        m.remove("deepseek2.attention.q_lora_rank");
        assert!(load(&m).is_err());
        m.insert("deepseek2.block_count".into(), u(27));
        assert_eq!(load(&m).unwrap().n_layer_all, 27);
    }
}
