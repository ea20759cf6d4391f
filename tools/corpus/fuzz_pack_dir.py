#!/usr/bin/env python3
"""Pack safetensors checkpoint directories into the one-input form of the fuzz targets
`safetensors_dir` and `build_safetensors` (fuzz/fuzz_targets/common.rs): index JSON, marker,
config.json, marker, one shard holding every tensor of the directory's shards (offsets
rebased; the index then names that one shard).

  python3 tools/corpus/fuzz_pack_dir.py OUT_DIR CHECKPOINT_DIR...

Directories that are not plain small checkpoints (FIFOs, symlinks, no shards, over 1 MiB
in all, headers that do not parse) are skipped: the fuzzer mutates from what is written.
"""
import json
import os
import stat
import struct
import sys

MARK = b"\xff\xfe\xfd\xfc"
LIMIT = 1 << 20


def plain(path: str) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_size <= LIMIT


def shard_tensors(path: str):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    meta = header.pop("__metadata__", None)
    out = []
    for name, info in header.items():
        b, e = info["data_offsets"]
        out.append((name, info["dtype"], info["shape"], data[b:e]))
    return out, meta


def pack(src: str):
    names = sorted(os.listdir(src))
    shards = [n for n in names if n.endswith(".safetensors")]
    if not shards or not all(plain(os.path.join(src, n)) for n in shards):
        return None
    tensors, meta = [], None
    for s in shards:
        ts, m = shard_tensors(os.path.join(src, s))
        tensors += ts
        meta = meta or m
    header, off = {}, 0
    if meta:
        header["__metadata__"] = meta
    for name, dtype, shape, blob in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(blob)]}
        off += len(blob)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((-len(text)) % 8)
    shard = struct.pack("<Q", len(text)) + text + b"".join(t[3] for t in tensors)
    index = json.dumps({"weight_map": {t[0]: "model-00001-of-00001.safetensors" for t in tensors}}).encode()
    cfg_path = os.path.join(src, "config.json")
    config = open(cfg_path, "rb").read() if plain(cfg_path) else b"{}"
    blob = index + MARK + config + MARK + shard
    return blob if len(blob) <= LIMIT else None


def main():
    out, dirs = sys.argv[1], sys.argv[2:]
    os.makedirs(out, exist_ok=True)
    written = 0
    for d in dirs:
        try:
            blob = pack(d)
        except (OSError, ValueError, KeyError, TypeError, AttributeError, struct.error):
            blob = None
        if blob is not None:
            name = os.path.basename(os.path.normpath(d))
            open(os.path.join(out, name), "wb").write(blob)
            written += 1
    print(f"{written} of {len(dirs)} directories packed")


if __name__ == "__main__":
    main()
