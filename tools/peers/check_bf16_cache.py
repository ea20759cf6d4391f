#!/usr/bin/env python3
"""Check a BF16 non-expert cache (mounted or on disk) against its V4 source, independently.

    python3 tools/peers/check_bf16_cache.py --source SRC_DIR --cache CACHE_DIR

Reference conversion in numpy/ml_dtypes, following the third seed's algorithm:
keep tensors that are not mtp.*, not .experts., not .scale; rename with the seed's
canonical_non_expert_key; FP8 E4M3 -> bf16(f32(e4m3) * 2**(s-127)) per scale block (RNE);
BF16/F32/I64 unchanged. Then, per source shard (sorted) with tensors, the expected file
is what `safetensors.serialize_file(specs, metadata={"format": "pt"})` writes (the call
`safetensors.torch.save_file` makes) and must equal the cache's shard byte for byte.
Every shard must load with safetensors.deserialize; the index and manifest must parse
and their hashes, sizes and fingerprints verify. Prints a JSON line; exits 1 on failure.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import tempfile
from pathlib import Path

import ml_dtypes
import numpy as np
import safetensors


TORCH_NAMES = {"BF16": "bfloat16", "F32": "float32", "I64": "int64", "F8_E4M3": "float8_e4m3fn", "F8_E8M0": "float8_e8m0fnu",
               "I8": "int8", "U8": "uint8", "F16": "float16"}
NP = {"BF16": np.uint16, "F32": np.float32, "I64": np.int64, "F8_E4M3": np.uint8, "F8_E8M0": np.uint8, "I8": np.int8,
      "U8": np.uint8, "F16": np.float16}


def canonical_non_expert_key(key: str) -> str:
    heads = {"embed.weight": "model.embed_tokens.weight", "head.weight": "lm_head.weight", "norm.weight": "model.norm.weight",
             "hc_head_fn": "model.hc_head.hc_fn", "hc_head_base": "model.hc_head.hc_base", "hc_head_scale": "model.hc_head.hc_scale"}
    if key in heads:
        return heads[key]
    assert key.startswith("layers."), key
    key = "model." + key
    for old, new in ((".attn.", ".self_attn."), (".ffn.", ".mlp."), (".indexer.compressor.", ".compressor.indexer."),
                     (".indexer.weights_proj.", ".compressor.indexer.scorer.weights_proj."),
                     (".indexer.wq_b.", ".compressor.indexer.q_b_proj."), (".attn_norm.", ".input_layernorm."),
                     (".ffn_norm.", ".post_attention_layernorm."), (".attn_sink", ".sinks"), (".q_norm.", ".q_a_norm."),
                     (".norm.", ".kv_norm."), (".wq_a.", ".q_a_proj."), (".wq_b.", ".q_b_proj."), (".wkv.", ".kv_proj."),
                     (".wgate.", ".gate_proj."), (".wo_a.", ".o_a_proj."), (".wo_b.", ".o_b_proj."),
                     (".shared_experts.w1.", ".shared_experts.gate_proj."), (".shared_experts.w2.", ".shared_experts.down_proj."),
                     (".shared_experts.w3.", ".shared_experts.up_proj."), (".gate.bias", ".gate.e_score_correction_bias"),
                     (".ape", ".position_bias")):
        key = key.replace(old, new)
    for native, target in (("hc_attn", "attn_hc"), ("hc_ffn", "ffn_hc")):
        for suffix in ("fn", "base", "scale"):
            key = key.replace(f".{native}_{suffix}", f".{target}.{suffix}")
    return key


def load(path: Path) -> dict[str, tuple[str, list[int], bytes]]:
    return {name: (v["dtype"], list(v["shape"]), bytes(v["data"])) for name, v in safetensors.deserialize(path.read_bytes())}


def canonical(v) -> str:
    return hashlib.sha256(json.dumps(v, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--source", type=Path, required=True)
    ap.add_argument("--cache", type=Path, required=True)
    args = ap.parse_args()
    config = json.loads((args.source / "config.json").read_text())
    text = config.get("text_config", config)
    block = text.get("quantization_config", config.get("quantization_config"))["weight_block_size"]
    index = json.loads((args.source / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    source = {s: load(args.source / s) for s in shards}
    everything = {k: v for s in shards for k, v in source[s].items()}

    expected_files = []
    for s in shards:
        out = {}
        for key, (dtype, shape, data) in source[s].items():
            if key.startswith("mtp.") or ".experts." in key or key.endswith(".scale"):
                continue
            if dtype == "F8_E4M3":
                sdt, sshape, sdata = everything[key.removesuffix(".weight") + ".scale"]
                w = np.frombuffer(data, np.uint8).reshape(shape).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
                sc = np.frombuffer(sdata, np.uint8).reshape(sshape).astype(np.int32)
                mult = np.exp2((sc - 127).astype(np.float32)).astype(np.float32)
                full = np.repeat(np.repeat(mult, block[0], axis=0), block[1], axis=1)[:shape[0], :shape[1]]
                v = (w * full).astype(np.float32)
                assert np.isfinite(v).all()
                out[canonical_non_expert_key(key)] = ("BF16", shape, v.astype(ml_dtypes.bfloat16).tobytes())
            else:
                out[canonical_non_expert_key(key)] = (dtype, shape, data)
        if out:
            expected_files.append(out)

    problems = []
    manifest = json.loads((args.cache / "kt_non_expert_manifest.json").read_text())
    cache_index = json.loads((args.cache / "model.safetensors.index.json").read_text())
    names = sorted(p.name for p in args.cache.iterdir() if not p.name.startswith("."))  # /.xpackfs/ is the mount's status
    want_names = sorted([f"non-expert-{i:03d}.safetensors" for i in range(len(expected_files))] +
                        ["kt_non_expert_manifest.json", "model.safetensors.index.json"])
    if names != want_names:
        problems.append(f"cache files {names} != {want_names}")
    with tempfile.TemporaryDirectory() as tmp:
        for i, tensors in enumerate(expected_files):
            name = f"non-expert-{i:03d}.safetensors"
            arrays = {k: np.frombuffer(d, np.uint8).copy() for k, (_, _, d) in tensors.items()}
            specs = {k: safetensors.TensorSpec(dtype=TORCH_NAMES[dt], shape=shape, data_ptr=arrays[k].ctypes.data,
                                               data_len=arrays[k].nbytes) for k, (dt, shape, _) in tensors.items()}
            safetensors.serialize_file(specs, f"{tmp}/{name}", metadata={"format": "pt"})
            want = Path(f"{tmp}/{name}").read_bytes()
            got = (args.cache / name).read_bytes()
            if got != want:
                n = next((j for j in range(min(len(got), len(want))) if got[j] != want[j]), min(len(got), len(want)))
                problems.append(f"{name}: differs from safetensors' own serialisation at byte {n} ({len(got)} vs {len(want)} bytes)")
            loaded = load(args.cache / name)
            for k, (dt, shape, data) in tensors.items():
                if loaded.get(k) != (dt, shape, data):
                    problems.append(f"{name}: tensor {k} differs from the numpy/ml_dtypes reference")
            f = next((x for x in manifest["files"] if x["name"] == name), None)
            if f is None or f["size"] != len(got) or f["sha256"] != hashlib.sha256(got).hexdigest():
                problems.append(f"manifest entry for {name} does not match the file")
            if any(cache_index["weight_map"].get(k) != name for k in tensors):
                problems.append(f"index does not map {name}'s tensors to it")
    if manifest["index_sha256"] != hashlib.sha256((args.cache / "model.safetensors.index.json").read_bytes()).hexdigest():
        problems.append("manifest index_sha256 mismatch")
    body = {k: v for k, v in manifest.items() if k != "fingerprint"}
    if manifest["fingerprint"] != canonical(body):
        problems.append("manifest fingerprint is not the canonical hash of the manifest")
    ident = manifest["source"]["identity"]
    if manifest["source"]["fingerprint"] != canonical(ident):
        problems.append("source fingerprint is not the canonical hash of the identity")
    if ident["config_sha256"] != hashlib.sha256((args.source / "config.json").read_bytes()).hexdigest():
        problems.append("identity config_sha256 mismatch")
    if ident["index_sha256"] != hashlib.sha256((args.source / "model.safetensors.index.json").read_bytes()).hexdigest():
        problems.append("identity index_sha256 mismatch")
    if [r["name"] for r in ident["shards"]] != shards:
        problems.append("identity shard records do not list the source shards in order")
    want_tensors = {k: {"shape": shape, "dtype": dt} for f in expected_files for k, (dt, shape, _) in f.items()}
    if manifest["tensors"] != want_tensors:
        problems.append("manifest tensors inventory differs")
    if (manifest["kind"], manifest["version"], manifest["status"], manifest["expert_weight_format"]) != (
            "deepseek-v4-non-expert-bf16", 1, "ready", "mxfp4"):
        problems.append("manifest kind/version/status")
    if problems:
        print("check_bf16_cache: FAIL:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 1
    print(json.dumps({"ok": True, "shards": len(expected_files), "tensors": len(want_tensors)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
