#!/usr/bin/env python3
"""Write a small Hugging Face style BF16 MoE checkpoint (model.safetensors) with the Python
safetensors package: model.layers.L.mlp.experts.E.{gate,up,down}_proj.weight plus a norm.

    python3 tools/make_hf_moe_fixture.py OUT_DIR [--layers 2 --experts 4 --hidden 256 --inter 128]
"""
import argparse
import json
from pathlib import Path

import ml_dtypes
import numpy as np
import safetensors


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--experts", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--inter", type=int, default=128)
    a = ap.parse_args()
    rng = np.random.default_rng(3)
    arrays = {}
    for layer in range(a.layers):
        for e in range(a.experts):
            for proj, shape in (("gate", (a.inter, a.hidden)), ("up", (a.inter, a.hidden)), ("down", (a.hidden, a.inter))):
                arrays[f"model.layers.{layer}.mlp.experts.{e}.{proj}_proj.weight"] = (rng.standard_normal(shape) * 0.02).astype(ml_dtypes.bfloat16).view(np.uint16)
    arrays["model.norm.weight"] = np.ones(a.hidden, ml_dtypes.bfloat16).view(np.uint16)
    a.out.mkdir(parents=True, exist_ok=True)
    specs = {k: safetensors.TensorSpec(dtype="bfloat16", shape=list(v.shape), data_ptr=v.ctypes.data, data_len=v.nbytes) for k, v in arrays.items()}
    safetensors.serialize_file(specs, str(a.out / "model.safetensors"), metadata={"format": "pt"})
    (a.out / "config.json").write_text(json.dumps({"model_type": "toy_moe", "num_hidden_layers": a.layers}))


if __name__ == "__main__":
    main()
