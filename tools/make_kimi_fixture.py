#!/usr/bin/env python3
"""Write a Kimi-K3-shaped GGUF shard set with gguf-py's GGUFWriter, plus its config.json
and a tokenizer directory: the inputs of SGLang's Kimi pack tools and of xpackfs's
kimi-pack view.

    python3 tools/make_kimi_fixture.py OUT [--layers 4 --experts 8 --shards 3 ...]
    python3 tools/make_kimi_fixture.py OUT --full-size      # audited dimensions, sparse files
    python3 tools/make_kimi_fixture.py OUT --bad dtype      # one broken input (see BAD)

Writes OUT/gguf/NAME-0000i-of-0000N.gguf (one GGUFWriter per shard; every shard states
general.architecture, split.no, split.count and split.tensors.count, as SGLang's
scan_gguf_shards requires), OUT/config.json (a KimiLinearForCausalLM config with a
text_config) and OUT/tokenizer/ (files, a symlink, a subdirectory). Layer 0 is dense;
every later layer has blk.N.ffn_{gate,down,up}_exps.weight (in that order in the file:
the pack's up/gate/down order differs) as Q2_K (gate, up) and Q3_K (down) with ne
(expert_hidden, inter, experts) and (inter, expert_hidden, experts). Expert blocks are
random bytes with finite f16 scales (gguf.quants decodes them to finite values).

--full-size writes the audited Kimi K3 (93 layers, 896 experts, 3584/3072, top-k 16;
about 1 TB of experts) over 24 shards as sparse files: real headers (a 4,096-entry token
list, see --tokens), data left as holes except 64-byte random marks at the start and end
of 8 expert slices per tensor.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as T

BAD = ("arch", "missing-expert", "duplicate-expert", "dtype", "uneven", "long-name", "no-arch-in-shard")


def nbytes(ne: tuple[int, ...], t: T) -> int:
    bs, ts = gguf.GGML_QUANT_SIZES[t]
    n = int(np.prod(ne))
    assert ne[0] % bs == 0, (ne, t)
    return n // bs * ts


def byte_shape(ne: tuple[int, ...], t: T) -> tuple[int, ...]:
    """gguf-py takes quantised tensors as uint8 arrays: numpy order, last dim in bytes."""
    bs, ts = gguf.GGML_QUANT_SIZES[t]
    np_shape = tuple(reversed(ne))
    return (*np_shape[:-1], np_shape[-1] // bs * ts)


def k_blocks(rng: np.random.Generator, ne: tuple[int, ...], t: T) -> np.ndarray:
    """Random Q2_K / Q3_K blocks whose f16 scales are finite (d, dmin at the block's end)."""
    _, ts = gguf.GGML_QUANT_SIZES[t]
    n = nbytes(ne, t)
    raw = rng.integers(0, 256, size=n, dtype=np.uint8).reshape(-1, ts)
    scales = rng.uniform(-0.01, 0.01, size=(raw.shape[0], 2)).astype(np.float16).view(np.uint8)
    if t == T.Q2_K:
        raw[:, 80:84] = scales.reshape(-1, 4)  # d, dmin
    else:
        raw[:, 108:110] = scales[:, :2]  # d
    return raw.reshape(byte_shape(ne, t))


def dense(rng: np.random.Generator, ne: tuple[int, ...], t: T) -> np.ndarray:
    if t == T.F32:
        return rng.standard_normal(tuple(reversed(ne))).astype(np.float32)
    if t == T.F16:
        return rng.standard_normal(tuple(reversed(ne))).astype(np.float16)
    return k_blocks(rng, ne, t)


def tensor_table(a, bad: str | None) -> list[tuple[str, tuple[int, ...], T]]:
    H, HR, I, E, V = a.hidden, a.expert_hidden, a.inter, a.experts, a.vocab
    small = not a.full_size
    f = T.F32 if small else T.Q8_0
    ts = [("token_embd.weight", (H, V), f)]
    for layer in range(a.layers):
        p = f"blk.{layer}"
        ts += [(f"{p}.attn_norm.weight", (H,), T.F32), (f"{p}.attn_q.weight", (H, H), f), (f"{p}.attn_output.weight", (H, H), f)]
        if layer == 0:
            ts += [(f"{p}.ffn_gate.weight", (H, 2 * I), f), (f"{p}.ffn_up.weight", (H, 2 * I), f), (f"{p}.ffn_down.weight", (2 * I, H), f)]
        else:
            ts += [(f"{p}.ffn_gate_inp.weight", (H, E), T.F32), (f"{p}.ffn_gate_shexp.weight", (H, 2 * I), f),
                   (f"{p}.ffn_down_shexp.weight", (2 * I, H), f)]
            ts += [(f"{p}.ffn_gate_exps.weight", (HR, I, E), T.Q2_K), (f"{p}.ffn_down_exps.weight", (I, HR, E), T.Q3_K),
                   (f"{p}.ffn_up_exps.weight", (HR, I, E), T.Q2_K)]
        ts.append((f"{p}.ffn_norm.weight", (H,), T.F32))
    ts += [("output_norm.weight", (H,), T.F32), ("output.weight", (H, V), f)]
    if bad == "missing-expert":
        ts = [t for t in ts if t[0] != "blk.2.ffn_gate_exps.weight"]
    elif bad == "duplicate-expert":
        at = next(i for i, t in enumerate(ts) if t[0] == "blk.2.ffn_up_exps.weight")
        ts.insert(at + 1, ("blk.02.ffn_up_exps.weight", (HR, I, E), T.Q2_K))
    elif bad == "dtype":
        ts = [(n, ne, T.Q4_K if n == "blk.2.ffn_down_exps.weight" else t) for n, ne, t in ts]
    elif bad == "uneven":
        ne = (HR, I - 1, E - 1)
        assert nbytes(ne, T.Q2_K) % E, "choose dimensions whose bytes do not split into the experts"
        ts = [(n, ne if n == "blk.2.ffn_up_exps.weight" else s, t) for n, s, t in ts]
    elif bad == "long-name":
        long = "blk." + "2".rjust(110, "0") + ".ffn_up_exps.weight"
        ts = [(long if n == "blk.2.ffn_up_exps.weight" else n, s, t) for n, s, t in ts]
    return ts


def split(tensors, shards: int) -> list[list]:
    """Consecutive groups of about equal bytes, none empty."""
    sizes = [nbytes(ne, t) for _, ne, t in tensors]
    total, out, cur, acc = sum(sizes), [], [], 0
    for i, (tensor, size) in enumerate(zip(tensors, sizes)):
        cur.append(tensor)
        acc += size
        left = len(tensors) - i - 1
        if len(out) < shards - 1 and (acc >= total * (len(out) + 1) / shards or left == shards - 1 - len(out)):
            out.append(cur)
            cur = []
    out.append(cur)
    assert len(out) == shards and all(out), [len(g) for g in out]
    return out


def write(a) -> int:
    out = Path(a.out)
    gdir = out / "gguf"
    gdir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(a.seed)
    tensors = tensor_table(a, a.bad)
    groups = split(tensors, a.shards)
    arch = "deepseek2" if a.bad == "arch" else "kimi-k3"
    paths = []
    for i, group in enumerate(groups):
        path = gdir / f"{a.name}-{i + 1:05d}-of-{a.shards:05d}.gguf"
        paths.append(path)
        w = gguf.GGUFWriter(path, arch)
        if a.bad == "no-arch-in-shard" and i == 1:
            del w.kv_data[0][gguf.Keys.General.ARCHITECTURE]
        w.add_uint16("split.no", i)
        w.add_uint16("split.count", a.shards)
        w.add_int32("split.tensors.count", len(tensors))
        if i == 0:
            w.add_name(f"{a.name} (Kimi-K3-shaped fixture)")
            w.add_block_count(a.layers)
            w.add_embedding_length(a.hidden)
            w.add_expert_count(a.experts)
            w.add_expert_used_count(a.top_k)
            w.add_leading_dense_block_count(1)
            w.add_tokenizer_model("gpt2")
            w.add_token_list([f"<t{j}>" for j in range(a.tokens or a.vocab)])
        for name, ne, t in group:
            if a.full_size:
                np_dtype = np.dtype(np.float32) if t == T.F32 else np.dtype(np.uint8)
                w.add_tensor_info(name, byte_shape(ne, t) if t != T.F32 else tuple(reversed(ne)), np_dtype, nbytes(ne, t), raw_dtype=t)
            else:
                w.add_tensor(name, dense(rng, ne, t), raw_dtype=t if t not in (T.F32, T.F16) else None)
        if a.full_size:
            w.write_header_to_file()
            w.write_kv_data_to_file()
            w.write_ti_data_to_file()
            w.close()
            header_end = path.stat().st_size
            end = (header_end + 31) // 32 * 32
            for _, ne, t in group:
                end = (end + 31) // 32 * 32 + nbytes(ne, t)
            with open(path, "r+b") as fh:
                fh.truncate(end)
        else:
            w.write_header_to_file()
            w.write_kv_data_to_file()
            w.write_tensors_to_file()
            w.close()
    if a.full_size:
        mark(paths, a, rng)
    else:
        check_decodable(paths)

    text = {
        "num_hidden_layers": a.layers, "first_k_dense_replace": 1, "num_experts": a.experts,
        "num_experts_per_token": a.top_k, "num_shared_experts": 2, "hidden_size": a.hidden,
        "routed_expert_hidden_size": a.expert_hidden, "moe_intermediate_size": a.inter,
        "hidden_act": "situ", "vocab_size": a.vocab,
    }
    config = {"architectures": ["KimiLinearForCausalLM"], "model_type": "kimi_k3", "text_config": text}
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    tok = out / "tokenizer"
    (tok / "nested").mkdir(parents=True, exist_ok=True)
    (tok / "tokenizer.json").write_text(json.dumps({"model": {"vocab": {"é": 0, "<t1>": 1}}}, ensure_ascii=False), encoding="utf-8")
    (tok / "tokenizer_config.json").write_text('{"model_max_length": 262144}\n', encoding="utf-8")
    (tok / "vocab-ü.txt").write_bytes(rng.integers(0, 256, size=5000, dtype=np.uint8).tobytes())
    (tok / "nested" / "ignored.txt").write_text("directories are not listed\n")
    link = tok / "special_tokens_map.json"
    if not link.exists():
        (out / "special_tokens_map.json").write_text('{"eos_token": "<t1>"}\n')
        os.symlink("../special_tokens_map.json", link)
    print(json.dumps({"shards": [str(p) for p in paths], "tensors": len(tensors),
                      "apparent_bytes": sum(p.stat().st_size for p in paths)}))
    return 0


def check_decodable(paths: list[Path]) -> None:
    for p in paths:
        r = gguf.GGUFReader(p)
        for t in r.tensors:
            if t.tensor_type in (T.Q2_K, T.Q3_K):
                v = gguf.quants.dequantize(t.data[:1], t.tensor_type)
                assert np.isfinite(v).all(), t.name


def mark(paths: list[Path], a, rng: np.random.Generator) -> None:
    """64 random bytes at the start and end of 8 expert slices of every expert tensor."""
    E = a.experts
    for p in paths:
        r = gguf.GGUFReader(p)
        with open(p, "r+b") as fh:
            for t in r.tensors:
                if not t.name.endswith("_exps.weight"):
                    continue
                per = int(t.n_bytes) // E
                for e in sorted({0, 1, E // 2, E - 1, *rng.integers(0, E, size=4).tolist()}):
                    base = int(t.data_offset) + e * per
                    for at in (base, base + per - 64):
                        fh.seek(at)
                        fh.write(rng.integers(0, 256, size=64, dtype=np.uint8).tobytes())
        del r


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--name", default="Kimi-K3-fixture")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--top-k", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--expert-hidden", type=int, default=256)
    ap.add_argument("--inter", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=0, help="entries of tokenizer.ggml.tokens (default: the vocabulary)")
    ap.add_argument("--shards", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--full-size", action="store_true")
    ap.add_argument("--bad", choices=BAD)
    a = ap.parse_args()
    if a.full_size:
        a.layers, a.experts, a.top_k, a.hidden, a.expert_hidden, a.inter, a.vocab = 93, 896, 16, 7168, 3584, 3072, 163840
        a.shards = 24 if a.shards == 3 else a.shards
        # gguf-py parses every token string of a header one by one (24 s for 163,840 here,
        # once per scan): the token list is kept short, the embedding full-size.
        a.tokens = a.tokens or 4096
    return write(a)


if __name__ == "__main__":
    sys.exit(main())
