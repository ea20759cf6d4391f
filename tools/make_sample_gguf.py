#!/usr/bin/env python3
"""Write a small, deterministic MoE GGUF with gguf-py's GGUFWriter.

The shape mimics DeepSeek V4-Flash at toy scale: `--layers` layers of `--experts`
routed experts whose gate/up/down tensors are MXFP4 (ggml type 39), quantised from
seeded random normals with gguf-py's own MXFP4 quantiser, plus non-expert tensors
(F16 embedding, F32 norms, Q8_0 attention, F32 router) and metadata of every value
type, arrays included.

    python3 tools/make_sample_gguf.py samples/sample-moe.gguf
    python3 tools/make_sample_gguf.py /tmp/split.gguf --split-max-tensors 10   # split set
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T


FAST = False


def quantized(rng: np.random.Generator, shape: tuple[int, ...], qtype: T) -> np.ndarray:
    if FAST and qtype == T.MXFP4:
        # Random valid MXFP4 blocks without running the quantiser (for large benchmark files):
        # E8M0 scale byte in a sane range, then 16 bytes of random nibbles.
        blocks = rng.integers(0, 256, size=(*shape[:-1], shape[-1] // 32, 17), dtype=np.uint8)
        blocks[..., 0] = rng.integers(118, 131, size=blocks.shape[:-1], dtype=np.uint8)
        return blocks.reshape(*shape[:-1], shape[-1] // 32 * 17)
    values = rng.standard_normal(shape, dtype=np.float32) * 0.05
    return gguf.quants.quantize(values, qtype)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("output", type=Path)
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--ff", type=int, default=128, help="expert intermediate size")
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=64)
    ap.add_argument("--expert-type", default="MXFP4", help="ggml type of the routed experts")
    ap.add_argument("--seed", type=int, default=20261130)
    ap.add_argument("--split-max-tensors", type=int, default=0, help="write a split set")
    ap.add_argument("--alignment", type=int, default=0, help="general.alignment (default: gguf's 32)")
    ap.add_argument("--fast-random", action="store_true", help="random MXFP4 bytes instead of quantising (large files)")
    args = ap.parse_args()
    global FAST
    FAST = args.fast_random

    rng = np.random.default_rng(args.seed)
    arch = "deepseek2"
    w = gguf.GGUFWriter(args.output, arch, split_max_tensors=args.split_max_tensors)
    w.add_name("xpackfs sample MoE")
    w.add_block_count(args.layers)
    w.add_embedding_length(args.hidden)
    w.add_expert_count(args.experts)
    w.add_expert_used_count(args.top_k)
    w.add_expert_feed_forward_length(args.ff)
    w.add_context_length(4096)
    if args.alignment:
        w.add_custom_alignment(args.alignment)
    # One key of every GGUF value type, arrays included.
    w.add_uint8("xpackfs.sample.u8", 200)
    w.add_int8("xpackfs.sample.i8", -100)
    w.add_uint16("xpackfs.sample.u16", 60000)
    w.add_int16("xpackfs.sample.i16", -30000)
    w.add_uint32("xpackfs.sample.u32", 4_000_000_000)
    w.add_int32("xpackfs.sample.i32", -2_000_000_000)
    w.add_float32("xpackfs.sample.f32", 0.125)
    w.add_bool("xpackfs.sample.bool", True)
    w.add_uint64("xpackfs.sample.u64", 2**63 + 5)
    w.add_int64("xpackfs.sample.i64", -(2**62))
    w.add_float64("xpackfs.sample.f64", 2.5e-300)
    w.add_string("xpackfs.sample.str", "ünïcode ✓")
    w.add_array("xpackfs.sample.ints", [1, 2, 3, 4])
    w.add_array("xpackfs.sample.floats", [0.5, -1.5])
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"tok{i}" for i in range(args.vocab)])

    expert_type = T[args.expert_type]
    h, ff, e = args.hidden, args.ff, args.experts
    w.add_tensor("token_embd.weight", (rng.standard_normal((args.vocab, h)) * 0.02).astype(np.float16))
    for layer in range(args.layers):
        p = f"blk.{layer}"
        w.add_tensor(f"{p}.attn_norm.weight", np.ones(h, dtype=np.float32))
        w.add_tensor(f"{p}.attn_q.weight", quantized(rng, (h, h), T.Q8_0), raw_dtype=T.Q8_0)
        w.add_tensor(f"{p}.ffn_norm.weight", np.ones(h, dtype=np.float32))
        w.add_tensor(f"{p}.ffn_gate_inp.weight", rng.standard_normal((e, h)).astype(np.float32))
        # numpy order is reversed ggml order: ne = {h, ff, e} for gate/up, {ff, h, e} for down.
        w.add_tensor(f"{p}.ffn_gate_exps.weight", quantized(rng, (e, ff, h), expert_type), raw_dtype=expert_type)
        w.add_tensor(f"{p}.ffn_up_exps.weight", quantized(rng, (e, ff, h), expert_type), raw_dtype=expert_type)
        w.add_tensor(f"{p}.ffn_down_exps.weight", quantized(rng, (e, h, ff), expert_type), raw_dtype=expert_type)
    w.add_tensor("output_norm.weight", np.ones(h, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
