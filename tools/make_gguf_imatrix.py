#!/usr/bin/env python3
"""Importance matrices for the GGUF output view's fixtures, in llama.cpp's formats, with an
entry for every weight of a model GGUF that llama-quantize may quantize (2-D and up, name
ending in `weight`): `ne0 * ne2` values (one row of ne0 per expert of a 3-D tensor).

  python3 tools/make_gguf_imatrix.py MODEL.gguf OUT [--legacy] [--seed N] [--drop NAME]...
        [--resize NAME]... [--zero-count NAME] [--no-meta] [--nan NAME]

  OUT            GGUF imatrix (general.type = imatrix; <name>.in_sum2 {ne0, n_mat} and
                 <name>.counts {1, n_mat}; imatrix.datasets, .chunk_count, .chunk_size),
                 or with --legacy the imatrix.dat format (entries, then the trailer: chunk
                 count and dataset name)
  --drop NAME    leave that tensor's entry out (llama-quantize: quantized without importance)
  --resize NAME  give that entry 32 values too many (llama-quantize: refused, or ignored for
                 token_embd.weight)
  --zero-count NAME  (GGUF) count 0 for the first row of that entry (its importance is ones)
  --no-meta      (GGUF) leave out imatrix.chunk_size (llama-quantize refuses the file)
  --nan NAME     a NaN in that entry (llama-quantize refuses the file)
  --extra N      N more entries for tensors the model does not have (counted, never used)
"""
import argparse
import struct
from pathlib import Path

import gguf
import numpy as np


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--legacy", action="store_true")
    ap.add_argument("--seed", type=int, default=26)
    ap.add_argument("--drop", action="append", default=[])
    ap.add_argument("--resize", action="append", default=[])
    ap.add_argument("--zero-count", action="append", default=[])
    ap.add_argument("--no-meta", action="store_true")
    ap.add_argument("--nan", action="append", default=[])
    ap.add_argument("--extra", type=int, default=0)
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    entries = {}  # name -> (n_mat, ne0) importances, with counts
    paths = [Path(a.model)]
    if "-00001-of-" in a.model:
        n = int(a.model.split("-of-")[1][:5])
        paths = [Path(a.model.replace("-00001-of-", f"-{i:05d}-of-")) for i in range(1, n + 1)]
    for p in paths:
        for t in gguf.GGUFReader(p).tensors:
            ne = [int(x) for x in t.shape]
            if len([x for x in ne if x != 1]) < 2 or not t.name.endswith("weight") or t.name in a.drop:
                continue
            ne0, n_mat = ne[0], (ne[2] if len(ne) > 2 else 1)
            imp = np.exp(rng.normal(0, 1.5, (n_mat, ne0))).astype(np.float32)
            if t.name in a.resize:
                imp = np.exp(rng.normal(0, 1.5, (n_mat, ne0 + 32))).astype(np.float32)
            if t.name in a.nan:
                imp[0, 3] = np.nan
            entries[t.name] = imp
    for i in range(a.extra):
        entries[f"blk.999.unused_{i}.weight"] = np.exp(rng.normal(0, 1.5, (1, 64))).astype(np.float32)
    if a.legacy:
        blob = struct.pack("<i", len(entries))
        for name, imp in entries.items():
            ncall = int(rng.integers(5, 50))
            vals = (imp * np.float32(ncall)).astype("<f4").reshape(-1)
            blob += struct.pack("<i", len(name)) + name.encode() + struct.pack("<ii", ncall, vals.size) + vals.tobytes()
        ds = b"xpackfs-synthetic-legacy"
        blob += struct.pack("<i", 17) + struct.pack("<i", len(ds)) + ds
        Path(a.out).write_bytes(blob)
        return
    w = gguf.GGUFWriter(a.out, arch="imatrix")
    w.add_string("general.type", "imatrix")
    w.add_array("imatrix.datasets", ["xpackfs-synthetic", "second-dataset"])
    w.add_uint32("imatrix.chunk_count", 12)
    if not a.no_meta:
        w.add_uint32("imatrix.chunk_size", 512)
    for name, imp in entries.items():
        counts = rng.integers(100, 5000, (imp.shape[0], 1)).astype(np.float32)
        if name in a.zero_count:
            counts[0, 0] = 0
        w.add_tensor(name + ".in_sum2", (imp * counts).astype(np.float32))
        w.add_tensor(name + ".counts", counts)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
