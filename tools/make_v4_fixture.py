#!/usr/bin/env python3
"""Write a small DeepSeek V4-shaped native checkpoint with the Python safetensors package.

    python3 tools/make_v4_fixture.py OUT [--variant v4|v41] [--corrupt CASE]

V4: model_type deepseek_v4, FP8 E4M3 dense weights with UE8M0 128x128 block scales
(ragged edges included), BF16 norms and embeddings, F32 and I64 tensors, MXFP4 routed
experts (I8 weights + E8M0 scales), mtp.* tensors, spread over three shards with an
index. V4.1: model_type deepseek_v41 with text_config, 32x32 FP8 blocks, Engram tables.
--corrupt writes one broken variant (see CASES) for the bad-input tests.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import safetensors

CASES = ["orphan_scale", "missing_scale", "nan_scale", "unsupported_dtype", "nonfinite_weight", "nonfinite_bf16",
         "truncated_shard", "index_missing_tensor", "shard_escape", "expert_shape", "bad_quant_config",
         "expert_scale_missing", "expert_e8m0_nan", "expert_packed_shape"]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--variant", choices=["v4", "v41"], default="v4")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--experts", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--inter", type=int, default=128)
    ap.add_argument("--shards", type=int, default=3)
    ap.add_argument("--seed", type=int, default=41)
    ap.add_argument("--corrupt", choices=CASES)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    H, I, E, L = args.hidden, args.inter, args.experts, args.layers
    block = 128 if args.variant == "v4" else 32

    tensors: dict[str, tuple[str, np.ndarray]] = {}  # name -> (torch dtype name, array of raw storage)

    def bf16(*shape):
        return ("bfloat16", (rng.standard_normal(shape) * 0.05).astype(ml_dtypes.bfloat16).view(np.uint16))

    def f32(*shape):
        return ("float32", rng.standard_normal(shape).astype(np.float32))

    def fp8(name, rows, cols):
        w = rng.integers(0, 256, (rows, cols), dtype=np.uint8)
        w[(w & 0x7F) == 0x7F] = 0x38  # no NaN codes in the clean fixture
        tensors[name + ".weight"] = ("float8_e4m3fn", w)
        s = rng.integers(118, 132, (-(-rows // block), -(-cols // block)), dtype=np.uint8)
        tensors[name + ".scale"] = ("float8_e8m0fnu", s)

    tensors["embed.weight"] = bf16(64, H)
    tensors["head.weight"] = bf16(64, H)
    tensors["norm.weight"] = bf16(H)
    tensors["hc_head_fn"] = f32(8, 16)
    tensors["hc_head_base"] = f32(8)
    tensors["hc_head_scale"] = f32(1)
    for layer in range(L):
        p = f"layers.{layer}"
        tensors[f"{p}.attn_norm.weight"] = bf16(H)
        tensors[f"{p}.ffn_norm.weight"] = bf16(H)
        fp8(f"{p}.attn.wq_a", 192, H)
        fp8(f"{p}.attn.wkv", 160, H)
        tensors[f"{p}.attn.q_norm.weight"] = bf16(192)
        tensors[f"{p}.attn.attn_sink"] = f32(4)
        tensors[f"{p}.hc_attn_fn"] = f32(4, 8)
        tensors[f"{p}.ffn.gate.weight"] = bf16(E, H)
        tensors[f"{p}.ffn.gate.bias"] = f32(E)
        tensors[f"{p}.ffn.gate.tid2eid"] = ("int64", rng.integers(0, E, (16, 2)).astype(np.int64))
        fp8(f"{p}.ffn.shared_experts.w1", I, H)
        fp8(f"{p}.ffn.shared_experts.w3", I, H)
        fp8(f"{p}.ffn.shared_experts.w2", H, I)
        for e in range(E):
            for proj, (n, k) in {"w1": (I, H), "w3": (I, H), "w2": (H, I)}.items():
                q = f"{p}.ffn.experts.{e}.{proj}"
                tensors[q + ".weight"] = ("int8", rng.integers(-128, 128, (n, k // 2)).astype(np.int8))
                tensors[q + ".scale"] = ("float8_e8m0fnu", rng.integers(118, 130, (n, k // 32), dtype=np.uint8))
    if args.variant == "v41":
        fp8("layers.1.engram.embed", 100, H)
        tensors["layers.1.engram.norm.weight"] = bf16(H)
    tensors["mtp.0.norm.weight"] = bf16(H)
    tensors["mtp.0.ffn.experts.0.w1.weight"] = ("int8", rng.integers(-128, 128, (I, H // 2)).astype(np.int8))

    c = args.corrupt
    if c == "orphan_scale":
        tensors["layers.0.attn.orphan.scale"] = ("float8_e8m0fnu", np.full((1, 1), 127, np.uint8))
    elif c == "missing_scale":
        del tensors["layers.0.attn.wkv.scale"]
    elif c == "nan_scale":
        tensors["layers.1.attn.wq_a.scale"][1][0, 1] = 255
    elif c == "unsupported_dtype":
        tensors["layers.0.attn.extra"] = ("float16", np.ones(4, np.float16))
    elif c == "nonfinite_weight":
        tensors["layers.0.ffn.shared_experts.w2.weight"][1][5, 7] = 0x7F
    elif c == "nonfinite_bf16":
        tensors["norm.weight"][1][3] = 0x7F80  # +inf
    elif c == "expert_scale_missing":
        del tensors["layers.0.ffn.experts.1.w2.scale"]
    elif c == "expert_e8m0_nan":
        tensors["layers.1.ffn.experts.0.w1.scale"][1][3, 2] = 255
    elif c == "expert_packed_shape":
        tensors["layers.0.ffn.experts.3.w3.weight"] = ("int8", np.zeros((I, H // 2 + 128), np.int8))
    elif c == "expert_shape":
        tensors["layers.1.ffn.experts.2.w3.scale"] = ("float8_e8m0fnu", np.full((I, H // 32 + 1), 127, np.uint8))

    names = list(tensors)
    shard_of = {name: i % args.shards for i, name in enumerate(names)}
    # Routed-expert scales live with their weights (as in the official checkpoints; the
    # fourth seed reads a scale through its weight's shard). Dense FP8 scales may not.
    for name in names:
        if ".experts." in name and name.endswith(".scale") and name[:-6] + ".weight" in shard_of:
            shard_of[name] = shard_of[name[:-6] + ".weight"]
    n = args.shards
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    weight_map = {}
    for s in range(n):
        shard = f"model-{s + 1:05d}-of-{n:05d}.safetensors"
        keep = [a for name, (_, a) in tensors.items() if shard_of[name] == s]
        specs = {name: safetensors.TensorSpec(dtype=dt, shape=list(a.shape), data_ptr=a.ctypes.data, data_len=a.nbytes)
                 for name, (dt, a) in tensors.items() if shard_of[name] == s}
        safetensors.serialize_file(specs, str(out / shard), metadata={"format": "pt"})
        del keep
        weight_map.update({name: shard for name in specs})
    if c == "truncated_shard":
        p = out / f"model-{n:05d}-of-{n:05d}.safetensors"
        p.write_bytes(p.read_bytes()[:-10])
    if c == "index_missing_tensor":
        weight_map["layers.0.attn.ghost.weight"] = f"model-00001-of-{n:05d}.safetensors"
    if c == "shard_escape":
        weight_map["norm.weight"] = "../escape.safetensors"
    quant = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [block, block], "scale_fmt": "ue8m0"}
    if c == "bad_quant_config":
        quant["scale_fmt"] = "fp32"
    text = {"num_hidden_layers": L, "n_routed_experts": E, "hidden_size": H, "moe_intermediate_size": I,
            "num_experts_per_tok": 2, "quantization_config": quant}
    config = {"model_type": "deepseek_v4", **text} if args.variant == "v4" else {"model_type": "deepseek_v41", "text_config": text}
    (out / "config.json").write_text(json.dumps(config, indent=2))
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
