#!/usr/bin/env python3
"""Write a full-size DeepSeek-V4-Flash-shaped GGUF as a sparse file (costs no disk).

    python3 tools/make_sparse_v4_flash.py OUT.gguf

43 layers, 256 routed experts (MXFP4, hidden 4096, expert ff 2048: ~147 GB of experts),
attention/shared-expert/norm tensors, a 129,280-token vocabulary: a real header and tensor
table written with gguf-py's GGUFWriter, then the file is extended with truncate() to its
full size without writing data (all-zero MXFP4 blocks are valid: E8M0 0 = 2^-128).
"""
import sys
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as T

L, E, H, FF, VOCAB = 43, 256, 4096, 2048, 129280


def nbytes(shape_np, t):
    bs, ts = gguf.GGML_QUANT_SIZES[t]
    n = int(np.prod(shape_np))
    return n // bs * ts


def main() -> int:
    out = Path(sys.argv[1])
    w = gguf.GGUFWriter(out, "deepseek2")
    w.add_name("sparse DeepSeek-V4-Flash-shaped")
    w.add_block_count(L)
    w.add_embedding_length(H)
    w.add_expert_count(E)
    w.add_expert_used_count(6)
    w.add_expert_feed_forward_length(FF)
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"<tok{i}>" for i in range(VOCAB)])
    w.add_token_types([1] * VOCAB)
    tensors = [("token_embd.weight", (VOCAB, H), T.Q8_0), ("output.weight", (VOCAB, H), T.Q8_0), ("output_norm.weight", (H,), T.F32)]
    for l in range(L):
        p = f"blk.{l}"
        tensors += [
            (f"{p}.attn_norm.weight", (H,), T.F32), (f"{p}.ffn_norm.weight", (H,), T.F32),
            (f"{p}.attn_q_a.weight", (1024, H), T.Q8_0), (f"{p}.attn_q_b.weight", (H * 2, 1024), T.Q8_0),
            (f"{p}.attn_kv_a_mqa.weight", (576, H), T.Q8_0), (f"{p}.attn_output.weight", (H, H * 2), T.Q8_0),
            (f"{p}.ffn_gate_inp.weight", (E, H), T.F32), (f"{p}.exp_probs_b.bias", (E,), T.F32),
            (f"{p}.ffn_gate_shexp.weight", (FF, H), T.Q8_0), (f"{p}.ffn_up_shexp.weight", (FF, H), T.Q8_0),
            (f"{p}.ffn_down_shexp.weight", (H, FF), T.Q8_0),
            (f"{p}.ffn_gate_exps.weight", (E, FF, H), T.MXFP4), (f"{p}.ffn_up_exps.weight", (E, FF, H), T.MXFP4),
            (f"{p}.ffn_down_exps.weight", (E, H, FF), T.MXFP4),
        ]
    for name, shape, t in tensors:
        bs, ts = gguf.GGML_QUANT_SIZES[t]
        # gguf-py takes quantised shapes in bytes along the last (contiguous) dimension.
        byte_shape = shape if t == T.F32 else (*shape[:-1], shape[-1] // bs * ts)
        w.add_tensor_info(name, byte_shape, np.dtype(np.float32) if t == T.F32 else np.dtype(np.uint8),
                          nbytes(shape, t), raw_dtype=t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    header_end = out.stat().st_size
    align = 32
    data_start = (header_end + align - 1) // align * align
    total = 0
    for _, shape, t in tensors:
        total = (total + align - 1) // align * align + nbytes(shape, t)
    with open(out, "r+b") as f:
        f.truncate(data_start + total)
    print(f"{out}: {out.stat().st_size / 1e9:.1f} GB apparent, header {header_end / 1e6:.1f} MB, {len(tensors)} tensors")
    return 0


if __name__ == "__main__":
    sys.exit(main())
