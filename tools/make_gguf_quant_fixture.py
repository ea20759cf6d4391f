#!/usr/bin/env python3
"""Write the GGUF output view's fixtures (small models of architectures llama.cpp knows,
no vocabulary: tokenizer.ggml.model = "no_vocab") with gguf-py's GGUFWriter:

  llama16-tied-bf16.gguf   llama, 16 layers, GQA 8/2, no output.weight (tied), BF16
                           weights, F32 norms; ffn_down rows of 320 (not a multiple of 256)
  llama16-untied-mixed.gguf  llama, 16 layers, GQA 8/2, output.weight; F32 and F16
                           weights, one 2-D tensor with rows of 40 (not a multiple of 32)
  qwen3moe8-bf16.gguf      qwen3moe, 4 layers, 8 experts (2 used), GQA 4/2, q/k norms,
                           expert rows of 160, BF16 experts, F32 router
  qwen3moe8-split-0000N-of-00003.gguf  the same model (other values) as a 3-part split set
  llama80-gqa-bf16.gguf    llama, 80 layers, GQA 8/2 (llama.cpp's LLM_TYPE_70B), output.weight
  qwen3moe16-bf16.gguf     qwen3moe as above with 16 experts (4 used), expert rows of 256
  deepseek2-bf16.gguf      deepseek2 (MLA), 4 layers (the first dense), 6 experts (2 used) and
                           one shared expert of 128, q/kv LoRA ranks 256, attn_kv_b and the
                           split attn_k_b (rows of 128, one matrix per head: 3-D) / attn_v_b,
                           exp_probs_b bias; llama.cpp quantizes it (it would not load it: a
                           converted file has either attn_kv_b or attn_k_b/attn_v_b)

Values are Gaussian with zero blocks, constant blocks and outliers mixed in.
  python3 tools/make_gguf_quant_fixture.py OUT_DIR [--nan]   (--nan: one NaN in a BF16 row)
"""
import sys
from pathlib import Path

import numpy as np
import gguf

RNG = np.random.default_rng(26)


def values(shape, scale=0.02):
    x = RNG.standard_normal(shape).astype(np.float32) * scale
    flat = x.reshape(-1)
    n = flat.size
    if n >= 256:
        flat[32:64] = 0.0  # a zero block
        flat[96:128] = scale  # a constant block
        flat[RNG.integers(0, n, size=max(1, n // 997))] *= 40.0  # outliers
    return x


def bf16(x):
    b = x.astype(np.float32).view(np.uint32)
    r = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)
    return r


def add(w, name, shape, kind, scale=0.02):
    """shape in numpy order (rows..., cols); kind: bf16, f16, f32."""
    x = values(shape, scale) if kind != "norm" else (1.0 + values(shape, 0.1))
    if kind == "bf16":
        w.add_tensor(name, bf16(x), raw_dtype=gguf.GGMLQuantizationType.BF16)
    elif kind == "f16":
        w.add_tensor(name, x.astype(np.float16))
    else:
        w.add_tensor(name, x.astype(np.float32))
    return x


def common(w, arch, n_layer, n_embd, n_head, n_kv, n_ff):
    w.add_name(f"xpackfs {arch} fixture")
    w.add_context_length(256)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_rope_dimension_count(n_embd // n_head)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_file_type(32 if arch != "llama-mixed" else 1)
    w.add_tokenizer_model("no_vocab")
    w.add_vocab_size(64)


def llama(out, tied, mixed, nan=False, n_layer=16, n_ff=320):
    arch = "llama"
    n_embd, n_head, n_kv, n_vocab = 256, 8, 2, 64
    w = gguf.GGUFWriter(str(out), arch)
    common(w, "llama-mixed" if mixed else arch, n_layer, n_embd, n_head, n_kv, n_ff)
    wk = "f32" if mixed else "bf16"
    add(w, "token_embd.weight", (n_vocab, n_embd), "f16" if mixed else "bf16")
    add(w, "output_norm.weight", (n_embd,), "norm")
    if not tied:
        add(w, "output.weight", (n_vocab, n_embd), wk)
    hd = n_embd // n_head
    for i in range(n_layer):
        kind = ("f16" if i % 2 else "f32") if mixed else "bf16"
        add(w, f"blk.{i}.attn_norm.weight", (n_embd,), "norm")
        add(w, f"blk.{i}.attn_q.weight", (n_embd, n_embd), kind)
        add(w, f"blk.{i}.attn_k.weight", (n_kv * hd, n_embd), kind)
        add(w, f"blk.{i}.attn_v.weight", (n_kv * hd, n_embd), kind)
        add(w, f"blk.{i}.attn_output.weight", (n_embd, n_embd), kind)
        add(w, f"blk.{i}.ffn_norm.weight", (n_embd,), "norm")
        add(w, f"blk.{i}.ffn_gate.weight", (n_ff, n_embd), kind)
        add(w, f"blk.{i}.ffn_up.weight", (n_ff, n_embd), kind)
        x = add(w, f"blk.{i}.ffn_down.weight", (n_embd, n_ff), kind) if not (nan and i == 3) else None
        if x is None:
            y = values((n_embd, n_ff))
            y[5, 7] = np.nan
            w.add_tensor(f"blk.{i}.ffn_down.weight", bf16(y), raw_dtype=gguf.GGMLQuantizationType.BF16)
    if mixed:
        add(w, "blk.0.odd_proj.weight", (24, 40), "f32")  # rows of 40: F16 fallback
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def qwen3moe(out, split=0, n_exp=8, n_ff_exp=160, n_used=2):
    arch = "qwen3moe"
    n_layer, n_embd, n_head, n_kv, n_ff, n_vocab = 4, 256, 4, 2, 512, 64
    w = gguf.GGUFWriter(str(out), arch, split_max_tensors=split)
    common(w, arch, n_layer, n_embd, n_head, n_kv, n_ff)
    w.add_key_length(64)
    w.add_value_length(64)
    w.add_expert_count(n_exp)
    w.add_expert_used_count(n_used)
    w.add_expert_feed_forward_length(n_ff_exp)
    hd = 64
    add(w, "token_embd.weight", (n_vocab, n_embd), "bf16")
    add(w, "output_norm.weight", (n_embd,), "norm")
    add(w, "output.weight", (n_vocab, n_embd), "bf16")
    for i in range(n_layer):
        add(w, f"blk.{i}.attn_norm.weight", (n_embd,), "norm")
        add(w, f"blk.{i}.attn_q.weight", (n_head * hd, n_embd), "bf16")
        add(w, f"blk.{i}.attn_k.weight", (n_kv * hd, n_embd), "bf16")
        add(w, f"blk.{i}.attn_v.weight", (n_kv * hd, n_embd), "bf16")
        add(w, f"blk.{i}.attn_output.weight", (n_embd, n_head * hd), "bf16")
        add(w, f"blk.{i}.attn_q_norm.weight", (hd,), "norm")
        add(w, f"blk.{i}.attn_k_norm.weight", (hd,), "norm")
        add(w, f"blk.{i}.ffn_norm.weight", (n_embd,), "norm")
        add(w, f"blk.{i}.ffn_gate_inp.weight", (n_exp, n_embd), "f32")
        add(w, f"blk.{i}.ffn_gate_exps.weight", (n_exp, n_ff_exp, n_embd), "bf16")
        add(w, f"blk.{i}.ffn_up_exps.weight", (n_exp, n_ff_exp, n_embd), "bf16")
        add(w, f"blk.{i}.ffn_down_exps.weight", (n_exp, n_embd, n_ff_exp), "bf16")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def deepseek2(out):
    arch = "deepseek2"
    n_layer, n_embd, n_head, n_ff, n_vocab = 4, 256, 4, 512, 64
    q_lora, kv_lora, nope, rope, v_head = 256, 256, 128, 64, 128
    n_exp, n_ff_exp = 6, 128
    w = gguf.GGUFWriter(str(out), arch)
    w.add_name("xpackfs deepseek2 fixture")
    w.add_context_length(256)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(1)
    w.add_key_length(kv_lora + rope)
    w.add_value_length(kv_lora)
    w.add_uint32(f"{arch}.attention.key_length_mla", nope + rope)
    w.add_uint32(f"{arch}.attention.value_length_mla", v_head)
    w.add_rope_dimension_count(rope)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_q_lora_rank(q_lora)
    w.add_kv_lora_rank(kv_lora)
    w.add_leading_dense_block_count(1)
    w.add_expert_count(n_exp)
    w.add_expert_used_count(2)
    w.add_expert_shared_count(1)
    w.add_expert_feed_forward_length(n_ff_exp)
    w.add_expert_weights_scale(2.5)
    w.add_expert_weights_norm(True)
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    w.add_file_type(32)
    w.add_tokenizer_model("no_vocab")
    w.add_vocab_size(n_vocab)
    add(w, "token_embd.weight", (n_vocab, n_embd), "bf16")
    add(w, "output_norm.weight", (n_embd,), "norm")
    add(w, "output.weight", (n_vocab, n_embd), "bf16")
    for i in range(n_layer):
        add(w, f"blk.{i}.attn_norm.weight", (n_embd,), "norm")
        add(w, f"blk.{i}.attn_q_a_norm.weight", (q_lora,), "norm")
        add(w, f"blk.{i}.attn_kv_a_norm.weight", (kv_lora,), "norm")
        add(w, f"blk.{i}.attn_q_a.weight", (q_lora, n_embd), "bf16")
        add(w, f"blk.{i}.attn_q_b.weight", (n_head * (nope + rope), q_lora), "bf16")
        add(w, f"blk.{i}.attn_kv_a_mqa.weight", (kv_lora + rope, n_embd), "bf16")
        add(w, f"blk.{i}.attn_kv_b.weight", (n_head * (nope + v_head), kv_lora), "bf16")
        add(w, f"blk.{i}.attn_k_b.weight", (n_head, kv_lora, nope), "bf16")
        add(w, f"blk.{i}.attn_v_b.weight", (n_head, v_head, kv_lora), "bf16")
        add(w, f"blk.{i}.attn_output.weight", (n_embd, n_head * v_head), "bf16")
        add(w, f"blk.{i}.ffn_norm.weight", (n_embd,), "norm")
        if i == 0:
            add(w, f"blk.{i}.ffn_gate.weight", (n_ff, n_embd), "bf16")
            add(w, f"blk.{i}.ffn_up.weight", (n_ff, n_embd), "bf16")
            add(w, f"blk.{i}.ffn_down.weight", (n_embd, n_ff), "bf16")
            continue
        add(w, f"blk.{i}.ffn_gate_inp.weight", (n_exp, n_embd), "f32")
        add(w, f"blk.{i}.exp_probs_b.bias", (n_exp,), "f32")
        add(w, f"blk.{i}.ffn_gate_exps.weight", (n_exp, n_ff_exp, n_embd), "bf16")
        add(w, f"blk.{i}.ffn_up_exps.weight", (n_exp, n_ff_exp, n_embd), "bf16")
        add(w, f"blk.{i}.ffn_down_exps.weight", (n_exp, n_embd, n_ff_exp), "bf16")
        add(w, f"blk.{i}.ffn_gate_shexp.weight", (n_ff_exp, n_embd), "bf16")
        add(w, f"blk.{i}.ffn_up_shexp.weight", (n_ff_exp, n_embd), "bf16")
        add(w, f"blk.{i}.ffn_down_shexp.weight", (n_embd, n_ff_exp), "bf16")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    if "--nan" in sys.argv:
        llama(out / "llama16-nan-bf16.gguf", tied=True, mixed=False, nan=True)
        return
    llama(out / "llama16-tied-bf16.gguf", tied=True, mixed=False)
    llama(out / "llama16-untied-mixed.gguf", tied=False, mixed=True)
    qwen3moe(out / "qwen3moe8-bf16.gguf")
    qwen3moe(out / "qwen3moe8-split.gguf", split=20)
    qwen3moe(out / "qwen3moe16-bf16.gguf", n_exp=16, n_ff_exp=256, n_used=4)
    deepseek2(out / "deepseek2-bf16.gguf")
    llama(out / "llama80-gqa-bf16.gguf", tied=False, mixed=False, n_layer=80, n_ff=256)  # the 70B rules  # qwen3moe8-split-0000N-of-00003.gguf


if __name__ == "__main__":
    main()
