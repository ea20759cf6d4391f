#!/usr/bin/env python3
"""Write a corpus of broken GGUF sources and the error each must produce.

    python3 tools/make_bad_gguf.py OUTDIR
writes OUTDIR/<case>.gguf and OUTDIR/cases.json = [{"file", "expect", "options"}], where
`expect` is a substring the refusal message must contain (it names the rule, and the
tensor where there is one). GGUF is written byte by byte here (not with GGUFWriter) so
that every field can be made wrong.
"""
from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
MXFP4, F32T, Q8_0 = 39, 0, 8


def s(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


def kv(key, vtype, value) -> bytes:
    fmt = {U8: "B", I8: "b", U16: "H", I16: "h", U32: "I", I32: "i", F32: "f", BOOL: "?", U64: "Q", I64: "q", F64: "d"}
    body = s(value) if vtype == STR else struct.pack("<" + fmt[vtype], value)
    return s(key) + struct.pack("<I", vtype) + body


def nbytes(ne, t):
    bs, ts = {MXFP4: (32, 17), F32T: (1, 4), Q8_0: (32, 34)}[t]
    n = 1
    for d in ne:
        n *= d
    return n // bs * ts


def gguf(tensors, kvs=None, version=3, alignment=32, magic=b"GGUF", data_pad=0, counts=None, offsets=None):
    """tensors: [(name, ne, type)]; offsets default to the packed running sum."""
    kvs = kvs if kvs is not None else [kv("general.architecture", STR, "deepseek2")]
    infos, off, data_len = b"", 0, 0
    for i, (name, ne, t) in enumerate(tensors):
        o = offsets[i] if offsets else off
        infos += s(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", d) for d in ne) + struct.pack("<IQ", t, o)
        size = nbytes(ne, t) if t in (MXFP4, F32T, Q8_0) else 0
        if o + size < 1 << 24:  # absurd sizes are the point of some cases: do not allocate them
            data_len = max(data_len, o + size)
        off = (o + size + alignment - 1) // alignment * alignment
    n_t, n_kv = counts if counts else (len(tensors), len(kvs))
    head = magic + struct.pack("<IQQ", version, n_t, n_kv) + b"".join(kvs) + infos
    pad = (-len(head)) % alignment
    body = bytes((i * 7 + 3) % 251 for i in range(data_len + data_pad))
    return head + b"\0" * pad + body


def experts(layers=2, e=4, h=64, ff=32, t=MXFP4, skip=(), override=None):
    out = []
    for layer in range(layers):
        for role in ("gate", "up", "down"):
            name = f"blk.{layer}.ffn_{role}_exps.weight"
            if name in skip:
                continue
            ne = [h, ff, e] if role != "down" else [ff, h, e]
            if override and name in override:
                ne = override[name]
            out.append((name, ne, t))
    return out


def main() -> int:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    good = gguf(experts() + [("output_norm.weight", [64], F32T)])
    cases: list[tuple[str, bytes, str, list[str]]] = [
        ("bad_magic", b"GGUX" + good[4:], "bad magic", []),
        ("version_1", good[:4] + struct.pack("<I", 1) + good[8:], "unsupported GGUF version 1", []),
        ("version_4", good[:4] + struct.pack("<I", 4) + good[8:], "unsupported GGUF version 4", []),
        ("empty", b"", "truncated: magic", []),
        ("truncated_in_counts", good[:20], "truncated: metadata count", []),
        ("truncated_in_kv", good[:40], "truncated", []),
        ("truncated_data", good[:-100], "beyond the end of the file", []),
        ("huge_tensor_count", gguf(experts(), counts=(1 << 60, 1)), "tensor count 1152921504606846976 cannot fit", []),
        ("huge_kv_count", gguf(experts(), counts=(6, 1 << 40)), "metadata count 1099511627776 cannot fit", []),
        ("huge_string", gguf(experts(), kvs=[b"\xff" * 8 + b"k"]), "string length 18446744073709551615 exceeds the cap", []),
        ("huge_array", gguf(experts(), kvs=[s("a") + struct.pack("<IIQ", ARR, U32, 1 << 61)]), "array of 2305843009213693952 elements cannot fit", []),
        ("nested_array", gguf(experts(), kvs=[s("a") + struct.pack("<IIQ", ARR, ARR, 1)]), "nested arrays are not allowed", []),
        ("unknown_value_type", gguf(experts(), kvs=[s("k") + struct.pack("<I", 13)]), "unknown value type 13", []),
        ("bad_bool", gguf(experts(), kvs=[s("k") + struct.pack("<IB", BOOL, 2)]), "bool value 2", []),
        ("bad_utf8_key", gguf(experts(), kvs=[s(b"k\xff") + struct.pack("<IB", U8, 1)]), "not valid UTF-8", []),
        ("duplicate_key", gguf(experts(), kvs=[kv("k", U8, 1), kv("k", U8, 2)]), "duplicate metadata key \"k\"", []),
        ("alignment_not_pow2", gguf(experts(), kvs=[kv("general.alignment", U32, 48)]), "general.alignment must be a UINT32 power of two", []),
        ("alignment_wrong_type", gguf(experts(), kvs=[kv("general.alignment", U64, 32)]), "general.alignment must be a UINT32 power of two", []),
        ("unknown_ggml_type", gguf(experts() + [("x.weight", [32], 4)]), "tensor \"x.weight\": unknown ggml type id 4", []),
        ("name_too_long", gguf(experts() + [("n" * 64, [4], F32T)]), "name is 64 bytes", []),
        ("duplicate_tensor", gguf(experts() + [("o.weight", [4], F32T), ("o.weight", [4], F32T)]), "tensor \"o.weight\": duplicate tensor name", []),
        ("five_dims", gguf(experts() + [("x.weight", [1, 1, 1, 1, 1], F32T)]), "tensor \"x.weight\": 5 dimensions", []),
        ("zero_dims", gguf(experts() + [("x.weight", [], F32T)]), "tensor \"x.weight\": 0 dimensions", []),
        ("block_mismatch", gguf(experts() + [("q.weight", [33, 2], Q8_0)]), "tensor \"q.weight\": first dimension 33 is not a multiple of the Q8_0 block size 32", []),
        ("size_overflow", gguf(experts() + [("big.weight", [1 << 40, 1 << 40], F32T)], offsets=None), "tensor \"big.weight\": byte size of shape", []),
        ("misaligned_offset", gguf([("a.weight", [8], F32T)], offsets=[4]), "tensor \"a.weight\": offset 4 is not a multiple of the alignment 32", []),
        ("out_of_bounds", gguf([("a.weight", [8], F32T)], offsets=[1 << 40]), "tensor \"a.weight\": data [", []),
        ("overlapping", gguf([("a.weight", [64], F32T), ("b.weight", [64], F32T)], offsets=[0, 128]), "overlaps tensor \"a.weight\"", []),
        ("no_experts", gguf([("output_norm.weight", [64], F32T)]), "no routed-expert tensors", []),
        ("missing_role", gguf(experts(skip={"blk.1.ffn_up_exps.weight"})), "routed-expert tensors missing (1): blk.1.ffn_up_exps.weight", []),
        ("layer_gap", gguf([t for t in experts(layers=3) if not t[0].startswith("blk.1.")]), "missing (3): blk.1.ffn_gate_exps.weight", []),
        ("duplicate_role", gguf(experts() + [("blk.01.ffn_gate_exps.weight", [64, 32, 4], MXFP4)]), "duplicate routed-expert tensor for layer 1 role gate", []),
        ("unequal_roles", gguf(experts(override={"blk.0.ffn_down_exps.weight": [64, 64, 4]})), "triplet v1 requires uniform role sizes", []),
        ("unequal_experts", gguf(experts(override={"blk.1.ffn_up_exps.weight": [64, 32, 8]})), "blk.1.ffn_up_exps.weight: 8 experts, but other expert tensors have 4", []),
        ("two_dim_expert", gguf(experts(override={"blk.0.ffn_gate_exps.weight": [64, 128]})), "blk.0.ffn_gate_exps.weight: expected a 3-dimensional expert tensor", []),
        ("metadata_expert_count", gguf(experts(), kvs=[kv("general.architecture", STR, "deepseek2"), kv("deepseek2.expert_count", U32, 16)]), "metadata expert_count is 16 but the expert tensors hold 4", []),
        ("num_layers_option", good, "option num_layers: 5 disagrees with the source", ["-o", "num_layers=5"]),
        ("num_experts_option", good, "option num_experts: 3 disagrees with the source", ["-o", "num_experts=3"]),
        ("source_sha_option", good, "source sha256 mismatch: expected " + "ab" * 32, ["-o", "source_sha256=" + "ab" * 32]),
        ("top_k_option", good, "option top_k: 9 must be between 1 and the expert count 4", ["-o", "top_k=9"]),
    ]
    manifest = []
    for name, data, expect, options in cases:
        path = out / f"{name}.gguf"
        path.write_bytes(data)
        manifest.append({"file": path.name, "expect": expect, "options": options})
    (out / "good.gguf").write_bytes(good)
    (out / "cases.json").write_text(json.dumps(manifest, indent=1))
    print(f"{len(manifest)} cases in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
