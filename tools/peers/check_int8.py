#!/usr/bin/env python3
"""Check an INT8 tree against its source in numpy: unpack each quant file with the inverse
of kt-int8-n32-k64-vnni-v1 (kt-kernel's to_mat), multiply by its fp32 scales, and compare
with the source weights decoded independently (gguf.quants.dequantize for GGUF; the
E2M1 x E8M0 formula for DeepSeek MXFP4; ml_dtypes for BF16). Every element must be within
half a quantisation step (|w - q*d| <= d/2, plus float slack), and |q| <= 127.

    python3 tools/peers/check_int8.py --source SRC --tree TREE
"""
import argparse
import json
import re
import sys
from pathlib import Path

import gguf
import ml_dtypes
import numpy as np
import safetensors

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tools/: xptools
from xptools import mxfp4  # noqa: E402


def layout_offsets(n: int, k: int) -> np.ndarray:
    """Byte offset in a kt-int8-n32-k64-vnni-v1 quant file of element [r, c] of an n x k matrix."""
    r = np.arange(n)[:, None]
    c = np.arange(k)[None, :]
    nbb = r // 64 * 64
    nbs = np.minimum(64, n - nbb)
    nb = (r - nbb) // 32 * 32
    i = (r - nbb) % 32
    kbb = c // 3584 * 3584
    kbs = np.minimum(3584, k - kbb)
    kb = (c - kbb) // 64 * 64
    j = (c - kbb) % 64
    return nbb * k + kbb * nbs + nb * kbs + kb * 32 + (i // 16) * 1024 + (j // 4) * 64 + (i % 16) * 4 + j % 4


def unpack(buf: bytes, n: int, k: int) -> np.ndarray:
    return np.frombuffer(buf, np.int8)[layout_offsets(n, k)]


def source_experts(src: Path):
    """(layer, expert, proj) -> f32 matrix [n, k] (gate/up [I, H], down [H, I])."""
    out = {}
    if src.suffix == ".gguf":
        for t in gguf.GGUFReader(src).tensors:
            m = re.fullmatch(r"blk\.(\d+)\.ffn_(gate|up|down)_exps\.weight", t.name)
            if m:
                w = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type)  # numpy shape (E, n, k)
                for e in range(w.shape[0]):
                    out[(int(m.group(1)), e, m.group(2))] = w[e].astype(np.float32)
        return out
    index = json.loads((src / "model.safetensors.index.json").read_text()) if (src / "model.safetensors.index.json").exists() else None
    shards = sorted(set(index["weight_map"].values())) if index else ["model.safetensors"]
    data = {}
    for s in shards:
        data.update({k: v for k, v in safetensors.deserialize((src / s).read_bytes())})
    for name, v in data.items():
        m = re.fullmatch(r"layers\.(\d+)\.ffn\.experts\.(\d+)\.(w[123])\.weight", name)
        if m:
            s = data[name[:-len(".weight")] + ".scale"]
            packed = np.frombuffer(bytes(v["data"]), np.uint8).reshape(v["shape"])
            sc = np.frombuffer(bytes(s["data"]), np.uint8).reshape(s["shape"])
            w = mxfp4.decode(packed, sc)
            out[(int(m.group(1)), int(m.group(2)), {"w1": "gate", "w3": "up", "w2": "down"}[m.group(3)])] = w
        m = re.fullmatch(r"model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight", name)
        if m:
            raw = np.frombuffer(bytes(v["data"]), np.uint16 if v["dtype"] == "BF16" else np.float32).reshape(v["shape"])
            w = raw.view(ml_dtypes.bfloat16).astype(np.float32) if v["dtype"] == "BF16" else raw
            out[(int(m.group(1)), int(m.group(2)), m.group(3))] = w
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--source", type=Path, required=True)
    ap.add_argument("--tree", type=Path, required=True)
    a = ap.parse_args()
    man = json.loads((a.tree / "kt-weight-manifest.json").read_text())
    N, H, I = man["threadpool_count"], man["hidden_size"], man["intermediate_size"]
    il = I // N
    experts = source_experts(a.source)
    checked, worst = 0, 0.0
    for (layer, e, proj), w in experts.items():
        for part in range(N):
            if proj == "down":
                sub, n, k = w[:, part * il:(part + 1) * il], H, il
            else:
                sub, n, k = w[part * il:(part + 1) * il, :], il, H
            d = a.tree / f"_layer_{layer}" / f"_numa_{part}"
            q = unpack((d / f"INT8_{proj}_{e}_{n * k}Byte_quant_.kt").read_bytes(), n, k).astype(np.float32)
            s = np.frombuffer((d / f"INT8_{proj}_{e}_{n * 4}Byte_scale_.kt").read_bytes(), np.float32)
            want_s = np.abs(sub).max(axis=1) / np.float32(127)
            if not np.array_equal(s, want_s.astype(np.float32)):
                print(f"FAIL scales of layer {layer} expert {e} {proj} part {part}", file=sys.stderr)
                return 1
            err = np.abs(q * s[:, None] - sub)
            bound = s[:, None] / 2 * (1 + 1e-5) + 1e-30
            if not (err <= bound).all() or np.abs(q).max() > 127:
                print(f"FAIL values of layer {layer} expert {e} {proj} part {part}: max err/step {float((err / np.maximum(s[:, None], 1e-30)).max())}", file=sys.stderr)
                return 1
            worst = max(worst, float((err / np.maximum(s[:, None], 1e-30)).max()))
            checked += 1
    print(json.dumps({"ok": True, "matrices": checked, "worst_error_in_steps": worst}))
    return 0 if checked else 1


if __name__ == "__main__":
    sys.exit(main())
