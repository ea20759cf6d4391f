#!/usr/bin/env python3
"""Check an SGLANG-EXPERTPACK-v1 pack against its GGUF source, independently of xpackfs.

Parses the pack with the published struct formats (`expert_pack_format.py`) and
gguf-py's `GGUFReader`, and checks:
  * every object's bytes equal the expert slice of the source tensor that GGUFReader
    reports (`tensor.data` of the routed-expert tensor, expert e), and padding is zero;
  * the header and every index entry (offsets, sizes, sha256s, shapes, types, generation);
  * the manifest as SGLang's `validate.py --full` does (complete, pack_path, sizes,
    index sha, header digests, coverage, per-entry consistency, full pack sha256,
    per-tensor source sha256, whole source sha256).
  * the SGLang runtime reader's constraints (flags, MXFP4/identity/block 32 for MXFP4 packs).
Reads are done with pread, and optionally also through mmap and O_DIRECT (--modes).

    python3 tools/peers/check_pack.py --source SRC.gguf --pack MNT/name.pack [--modes pread,mmap,direct]
Prints one JSON line with counts on success; exits 1 with a message on the first failure.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import mmap
import os
import sys
from pathlib import Path

import numpy as np
import gguf

from expert_pack_format import (
    ENTRY_STRUCT, FLAG_IDENTITY_PAYLOAD, FLAG_TRIPLET_OBJECTS, HEADER_STRUCT, ROLE_NAMES, align_up, read_pack_index,
)


class CheckError(Exception):
    pass


def need(cond: bool, msg: str) -> None:
    if not cond:
        raise CheckError(msg)


def read_all(path: Path, mode: str) -> bytes:
    size = path.stat().st_size
    if mode == "pread":
        fd = os.open(path, os.O_RDONLY)
        try:
            out = bytearray()
            while len(out) < size:
                chunk = os.pread(fd, min(1 << 20, size - len(out)), len(out))
                need(len(chunk) > 0, f"short pread at {len(out)}")
                out += chunk
            return bytes(out)
        finally:
            os.close(fd)
    if mode == "mmap":
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            return bytes(m[:])
    if mode == "direct":
        # O_DIRECT wants aligned buffers and offsets: read into an anonymous mmap.
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
        try:
            block = 1 << 20
            buf = mmap.mmap(-1, block)
            out = bytearray()
            off = 0
            while off < size:
                n = os.preadv(fd, [buf], off)
                need(n > 0, f"short O_DIRECT read at {off}")
                out += buf[:n]
                off += n
            return bytes(out[:size])
        finally:
            os.close(fd)
    raise CheckError(f"unknown read mode {mode}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--source", type=Path, nargs="+", required=True, help="GGUF file(s); a split set in order")
    ap.add_argument("--pack", type=Path, required=True)
    ap.add_argument("--manifest", type=Path)
    ap.add_argument("--modes", default="pread", help="comma list of pread,mmap,direct")
    args = ap.parse_args()
    manifest_path = args.manifest or args.pack.with_name(args.pack.name + ".manifest.json")

    # Source side: GGUFReader per file; logical offsets over the concatenation.
    tensors: dict[str, dict] = {}
    base = 0
    whole = hashlib.sha256()
    for path in args.source:
        reader = gguf.GGUFReader(path, "r")
        for t in reader.tensors:
            tensors[t.name] = {
                "name": t.name, "shape": [int(v) for v in t.shape.tolist()], "type": t.tensor_type.name,
                "type_id": int(t.tensor_type), "offset": base + int(t.data_offset), "nbytes": int(t.n_bytes),
                "data": np.ascontiguousarray(t.data).view(np.uint8).reshape(-1),
            }
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                whole.update(block)
        base += path.stat().st_size
    source_sha = whole.hexdigest()
    for t in tensors.values():
        t["sha256"] = hashlib.sha256(t["data"].tobytes()).hexdigest()

    header, entries, index_raw = read_pack_index(args.pack)
    manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    pack_size = args.pack.stat().st_size

    # Header.
    need(header.version == 1 and header.header_bytes == HEADER_STRUCT.size and header.entry_bytes == ENTRY_STRUCT.size,
         "header version/sizes")
    need(header.flags == FLAG_IDENTITY_PAYLOAD | FLAG_TRIPLET_OBJECTS, f"flags {header.flags}")
    need(header.role_count == 3, "role_count")
    need(header.source_blob_sha256 == source_sha, f"header source sha {header.source_blob_sha256} != {source_sha}")
    L, E = header.num_layers, header.num_experts
    need(header.index_count == L * E * 3, "index_count")
    need(header.data_start == align_up(HEADER_STRUCT.size + header.index_count * ENTRY_STRUCT.size, header.alignment),
         "data_start")

    # Index entries against GGUFReader.
    need([(e.layer, e.expert, e.role_id) for e in entries] == [(l, x, r) for l in range(L) for x in range(E) for r in range(3)],
         "index is not sorted by (layer, expert, role) with exact coverage")
    role_bytes = entries[0].pack_nbytes
    stride = align_up(3 * role_bytes, header.alignment)
    need(pack_size == header.data_start + L * E * stride, f"pack size {pack_size}")
    for e in entries:
        name = f"blk.{e.layer}.ffn_{e.role}_exps.weight"
        t = tensors.get(name)
        need(t is not None, f"{name} not in source")
        need(e.tensor_name == name and e.dtype == t["type"] == e.quant_scheme and e.dtype_id == t["type_id"], f"{name}: names/types")
        need(list(e.shape) == t["shape"][:-1] and t["shape"][-1] == E, f"{name}: shape {e.shape} vs {t['shape']}")
        need(e.source_tensor_offset == t["offset"] and e.source_tensor_nbytes == t["nbytes"], f"{name}: tensor range")
        need(e.source_slice_offset == t["offset"] + e.expert * role_bytes and e.source_slice_nbytes == role_bytes, f"{name}: slice range")
        obj = header.data_start + (e.layer * E + e.expert) * stride
        need(e.pack_offset == obj + e.role_id * role_bytes and e.pack_nbytes == role_bytes, f"{name}[{e.expert}]: pack offset")
        need(e.source_tensor_sha256 == t["sha256"], f"{name}: tensor sha256")
        piece = t["data"][e.expert * role_bytes:(e.expert + 1) * role_bytes].tobytes()
        need(e.source_slice_sha256 == hashlib.sha256(piece).hexdigest() == e.checksum, f"{name}[{e.expert}]: slice sha256")
        need(e.block_size == gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(e.dtype_id)][0], f"{name}: block size")
        need(e.transform_id == "identity-v1", "transform id")
        want_gen = int.from_bytes(hashlib.sha256(
            f"{header.model_identity_sha256}:{source_sha}:{e.layer}:{e.expert}".encode("ascii")).digest()[:8], "little") or 1
        need(e.generation == want_gen, f"{name}[{e.expert}]: generation")
        if e.dtype == "MXFP4":
            need(e.block_size == 32, "MXFP4 block size")

    # Bytes, through every requested read mode.
    modes = [m for m in args.modes.split(",") if m]
    pack_sha = None
    for mode in modes:
        data = read_all(args.pack, mode)
        need(len(data) == pack_size, f"{mode}: read {len(data)} of {pack_size} bytes")
        need(data[HEADER_STRUCT.size:HEADER_STRUCT.size + len(index_raw)] == index_raw, f"{mode}: index bytes")
        need(not any(data[HEADER_STRUCT.size + len(index_raw):header.data_start]), f"{mode}: index padding not zero")
        for layer in range(L):
            for expert in range(E):
                obj = header.data_start + (layer * E + expert) * stride
                for r, role in enumerate(ROLE_NAMES):
                    t = tensors[f"blk.{layer}.ffn_{role}_exps.weight"]
                    want = t["data"][expert * role_bytes:(expert + 1) * role_bytes].tobytes()
                    got = data[obj + r * role_bytes:obj + (r + 1) * role_bytes]
                    need(got == want, f"{mode}: object ({layer},{expert}) role {role} differs from GGUFReader's slice")
                need(not any(data[obj + 3 * role_bytes:obj + stride]), f"{mode}: object ({layer},{expert}) padding not zero")
        sha = hashlib.sha256(data).hexdigest()
        need(pack_sha in (None, sha), f"{mode}: pack bytes differ between read modes")
        pack_sha = sha

    # Manifest, as validate.py --full.
    m = manifest
    need(m["format"] == "SGLANG-EXPERTPACK-v1" and m["complete"] is True, "manifest format/complete")
    need(Path(m["pack_path"]).resolve() == args.pack.resolve(), f"manifest pack_path {m['pack_path']} is not {args.pack}")
    need(m["pack_size"] == pack_size, "manifest pack_size")
    need(m["source"]["size"] == base, "manifest source.size")
    need(m["index_sha256"] == hashlib.sha256(index_raw).hexdigest(), "manifest index_sha256")
    need(m["model"]["model_identity_sha256"] == header.model_identity_sha256, "model identity")
    need(m["model"]["config_sha256"] == header.config_sha256, "config sha")
    need(m["source"]["sha256"] == header.source_blob_sha256 == source_sha, "source sha")
    need((m["model"]["num_layers"], m["model"]["num_routed_experts"], m["model"]["top_k"]) == (L, E, header.top_k), "model dims")
    need((m["index_count"], m["data_start"], m["alignment"], m["object_stride"], m["role_bytes"]) ==
         (header.index_count, header.data_start, header.alignment, stride, role_bytes), "layout numbers")
    need(m["pack_sha256"] == pack_sha or pack_sha is None, "manifest pack_sha256 != sha256 of the pack")
    mt = {t["name"]: t for t in m["tensors"]}
    need(set(mt) == set(tensors), "manifest tensor names != source tensors")
    routed = {f"blk.{l}.ffn_{r}_exps.weight" for l in range(L) for r in ROLE_NAMES}
    for name, t in tensors.items():
        x = mt[name]
        need(x["source_offset"] == t["offset"] and x["source_nbytes"] == t["nbytes"], f"manifest {name}: range")
        need(x["source_payload_sha256"] == t["sha256"], f"manifest {name}: sha256")
        need(x["shape"] == t["shape"] and x["type"] == t["type"] and x["type_id"] == t["type_id"], f"manifest {name}: shape/type")
        need(x["category"] == ("routed_expert" if name in routed else "non_routed"), f"manifest {name}: category")
    need(m["coverage"]["routed_tensor_count"] == len(routed), "routed count")
    need(m["coverage"]["non_routed_tensor_count"] == len(tensors) - len(routed), "non-routed count")
    inventory = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name]
        rec = {k: t[k] for k in ("name", "shape", "type", "type_id", "offset", "nbytes", "sha256")}
        rec["kind"] = "tensor"
        inventory.update(json.dumps(rec, sort_keys=True).encode("utf-8") + b"\n")
    need(m["source"]["inventory_sha256"] == inventory.hexdigest(), "inventory sha256")
    with open(args.source[0], "rb") as f:
        head = f.read(m["source"]["gguf_data_offset"])
    if len(args.source) == 1:
        need(m["source"]["gguf_metadata_sha256"] == hashlib.sha256(head).hexdigest(), "gguf metadata sha256")
        need(m["source"]["gguf_data_offset"] == gguf.GGUFReader(args.source[0], "r").data_offset, "gguf data offset")

    print(json.dumps({"ok": True, "entries": len(entries), "objects": L * E, "modes": modes, "pack_sha256": pack_sha}))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except CheckError as e:
        print(f"check_pack: FAIL: {e}", file=sys.stderr)
        sys.exit(1)
