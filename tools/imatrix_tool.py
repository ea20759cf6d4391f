#!/usr/bin/env python3
"""Importance matrices for the requantised-shards view.

    python3 tools/imatrix_tool.py make SRC_DIR OUT.gguf [--legacy OUT.dat] [--seed 5]
        write an imatrix for a V4 fixture's routed experts, in llama.cpp's GGUF format
        (gguf-py GGUFWriter: blk.L.ffn_{gate,up,down}_exps.weight.{in_sum2,counts}) and
        optionally the legacy imatrix.dat format, holding the same importance
    python3 tools/imatrix_tool.py gain SRC_DIR UNIT_DIR IMATRIX_DIR IMATRIX.gguf
        dequantise both views' expert tensors with gguf.quants.dequantize and compare the
        importance-weighted squared error against the decoded MXFP4 source; exits 1
        unless the imatrix output has the lower total
"""
from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import gguf
import numpy as np
import safetensors

from xptools import mxfp4
ROLE = {"w1": "gate", "w3": "up", "w2": "down"}


def experts(src: Path):
    index = json.loads((src / "model.safetensors.index.json").read_text())
    data = {}
    for s in sorted(set(index["weight_map"].values())):
        data.update({k: v for k, v in safetensors.deserialize((src / s).read_bytes())})
    return data


def decode(w: dict, s: dict) -> np.ndarray:
    packed = np.frombuffer(bytes(w["data"]), np.uint8).reshape(w["shape"])
    scale = np.frombuffer(bytes(s["data"]), np.uint8).reshape(s["shape"])
    return mxfp4.decode(packed, scale)


def importance_table(src: Path, seed: int) -> dict[str, np.ndarray]:
    """name -> (n_expert, K) importance, per llama.cpp entry."""
    cfg = json.loads((src / "config.json").read_text())
    text = cfg.get("text_config", cfg)
    L, E, H, I = text["num_hidden_layers"], text["n_routed_experts"], text["hidden_size"], text["moe_intermediate_size"]
    rng = np.random.default_rng(seed)
    out = {}
    for layer in range(L):
        for proj, role in ROLE.items():
            k = H if proj != "w2" else I
            out[f"blk.{layer}.ffn_{role}_exps.weight"] = np.exp(rng.normal(0, 1.5, (E, k))).astype(np.float32)
    return out


def make(src: Path, out: Path, legacy: Path | None, seed: int) -> None:
    imp = importance_table(src, seed)
    rng = np.random.default_rng(seed + 1)
    w = gguf.GGUFWriter(out, arch="imatrix")
    w.add_string("general.type", "imatrix")
    w.add_array("imatrix.datasets", ["synthetic"])
    w.add_uint32("imatrix.chunk_count", 10)
    w.add_uint32("imatrix.chunk_size", 512)
    for name, m in imp.items():
        counts = rng.integers(10, 100, (m.shape[0], 1)).astype(np.float32)
        w.add_tensor(name + ".in_sum2", (m * counts).astype(np.float32))
        w.add_tensor(name + ".counts", counts)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    if legacy:
        ncall = 7
        blob = struct.pack("<i", len(imp))
        for name in sorted(imp):
            vals = (imp[name] * ncall).astype("<f4").reshape(-1)
            blob += struct.pack("<i", len(name)) + name.encode() + struct.pack("<ii", ncall, vals.size) + vals.tobytes()
        blob += struct.pack("<i", 10) + struct.pack("<i", 9) + b"synthetic"
        legacy.write_bytes(blob)


def gain(src: Path, unit_dir: Path, imat_dir: Path, imatrix: Path) -> int:
    data = experts(src)
    reader = gguf.GGUFReader(imatrix)
    imp = {}
    for t in reader.tensors:
        if t.name.endswith(".in_sum2"):
            base = t.name[: -len(".in_sum2")]
            counts = next(x for x in reader.tensors if x.name == base + ".counts")
            imp[base] = np.asarray(t.data, np.float32) / np.asarray(counts.data, np.float32).reshape(-1, 1)
    plan = json.loads((unit_dir / "plan.json").read_text())
    totals = {"unit": 0.0, "imatrix": 0.0}
    n = 0
    for shard in plan["shards"]:
        for t in shard["tensors"]:
            if t["role"] != "quantised":
                continue
            name = t["name"]
            x = decode(data[name], data[name[: -len(".weight")] + ".scale"])
            layer, rest = name[len("layers."):].split(".ffn.experts.")
            expert, proj = rest.split(".")[0], rest.split(".")[1]
            weights = imp[f"blk.{layer}.ffn_{ROLE[proj]}_exps.weight"][int(expert)]
            qtype = gguf.GGMLQuantizationType[t["ggml_type"]]
            for label, d in (("unit", unit_dir), ("imatrix", imat_dir)):
                blob = dict(safetensors.deserialize((d / shard["output_shard"]).read_bytes()))[name]
                q = np.frombuffer(bytes(blob["data"]), np.uint8).reshape(blob["shape"])
                deq = gguf.quants.dequantize(q, qtype).reshape(x.shape)
                totals[label] += float(np.sum(weights[None, :] * (deq - x) ** 2))
            n += 1
    ratio = totals["imatrix"] / totals["unit"]
    print(json.dumps({"tensors": n, "weighted_sq_error": totals, "imatrix_over_unit": ratio}))
    return 0 if totals["imatrix"] < totals["unit"] else 1


def main() -> int:
    a = sys.argv[1:]
    if a[0] == "make":
        legacy = Path(a[a.index("--legacy") + 1]) if "--legacy" in a else None
        seed = int(a[a.index("--seed") + 1]) if "--seed" in a else 5
        make(Path(a[1]), Path(a[2]), legacy, seed)
        return 0
    if a[0] == "gain":
        return gain(Path(a[1]), Path(a[2]), Path(a[3]), Path(a[4]))
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main())
