#!/usr/bin/env python3
"""The GGUF output view's peer: llama.cpp's own `llama_model_quantize` and model loader,
through llama-cpp-python 0.3.36 (which vendors and builds llama.cpp 0c1e57098).

  llama_quantize_peer.py quantize IN OUT FTYPE_NUMBER [NTHREAD] [--allow-requantize] [--imatrix FILE]
                                                                   exit 0 when llama.cpp wrote OUT
  llama_quantize_peer.py quantize-each IN OUTDIR NTHREAD FTYPE_NUMBER...
                                                                   quantize to OUTDIR/FTYPE_NUMBER.gguf for each
  llama_quantize_peer.py types IN FTYPE_NUMBER...                  --dry-run: each tensor's type, logged on stderr,
                                                                   each file type's after a line "== ftype N"
  llama_quantize_peer.py load FILE                                 exit 0 when llama.cpp loads FILE

The -each forms and several types run in one process: importing the library costs a quarter
of a second, as much as quantizing a small fixture.

--imatrix does through the library what the llama-quantize command (tools/quantize/quantize.cpp
at 0c1e57098) does before it calls llama_model_quantize: it loads FILE as common_imatrix_load
does (GGUF: in_sum2 / counts rounded, ones where a count is 0; legacy imatrix.dat: sums / ncall,
with its trailer's chunk count and dataset), passes the entries as params.imatrix, and the
quantize.imatrix.{file,dataset,entries_count,chunks_count} keys as params.kv_overrides (the
library itself adds none). tools/llama_quantize_tool.sh builds the command itself.

The package is imported from $XPACKFS_LLAMA_CPP (a `pip install --target` directory, see
tools/peers/llama_cpp_peer.sh) when set, else from the Python path.
"""
import os
import sys

if os.environ.get("XPACKFS_LLAMA_CPP"):
    sys.path.insert(0, os.environ["XPACKFS_LLAMA_CPP"])

import llama_cpp  # noqa: E402

assert llama_cpp.__version__ == "0.3.36", llama_cpp.__version__


def load_imatrix(path):
    """common_imatrix_load + quantize.cpp's load_imatrix: (entries, datasets, chunk_count)."""
    import struct

    import numpy as np

    blob = open(path, "rb").read()
    entries = {}
    if blob[:4] == b"GGUF":
        import gguf

        r = gguf.GGUFReader(path)
        f = r.fields
        datasets = [bytes(f["imatrix.datasets"].parts[i]).decode() for i in f["imatrix.datasets"].data] if "imatrix.datasets" in f else []
        if not all(k in f for k in ("imatrix.datasets", "imatrix.chunk_count", "imatrix.chunk_size")):
            sys.exit(f"missing imatrix metadata in file {path}")
        chunks = int(f["imatrix.chunk_count"].parts[-1][0])
        t = {x.name: x for x in r.tensors}
        for name in t:
            if not name.endswith(".in_sum2"):
                continue
            base = name[: -len(".in_sum2")]
            sums = np.asarray(t[name].data, np.float32).reshape(-1)
            counts = np.asarray(t[base + ".counts"].data, np.float32).reshape(-1)
            ne0 = sums.size // counts.size
            e = np.empty_like(sums)
            for j, c in enumerate(counts):
                c = np.float32(int(np.round(c)))  # std::lround, then (float)
                e[j * ne0:(j + 1) * ne0] = sums[j * ne0:(j + 1) * ne0] / c if c > 0 else np.float32(1)
            entries[base] = e
        return entries, datasets, chunks
    (n,) = struct.unpack_from("<i", blob, 0)
    off = 4
    for _ in range(n):
        (ln,) = struct.unpack_from("<i", blob, off)
        name = blob[off + 4:off + 4 + ln].split(b"\0")[0].decode()
        off += 4 + ln
        ncall, nval = struct.unpack_from("<ii", blob, off)
        sums = np.frombuffer(blob, "<f4", nval, off + 8).astype(np.float32)
        off += 8 + 4 * nval
        entries[name] = sums / np.float32(ncall) if ncall > 0 else sums
    datasets, chunks = [], 0
    if off < len(blob):
        (chunks,) = struct.unpack_from("<i", blob + b"\0" * 4, off)
        if off + 8 <= len(blob):
            (ln,) = struct.unpack_from("<i", blob, off + 4)
            if ln > 0 and off + 8 + ln <= len(blob):
                datasets.append(blob[off + 8:off + 8 + ln].split(b"\0")[0].decode())
    return entries, datasets, chunks


def quantize(inp, out, ftype, nthread, dry_run=False, allow_requantize=False, imatrix=None):
    params = llama_cpp.llama_model_quantize_default_params()
    params.allow_requantize = allow_requantize
    params.ftype = ftype
    params.nthread = nthread
    params.dry_run = dry_run
    keep = []
    if imatrix:
        import ctypes

        entries, datasets, chunks = load_imatrix(imatrix)
        arr = (llama_cpp.llama_model_imatrix_data * (len(entries) + 1))()
        for i, (name, v) in enumerate(entries.items()):
            buf = (ctypes.c_float * v.size).from_buffer_copy(v.astype("<f4").tobytes())
            keep.append(buf)
            arr[i].name, arr[i].data, arr[i].size = name.encode(), ctypes.cast(buf, ctypes.POINTER(ctypes.c_float)), v.size
        arr[len(entries)].name = None
        params.imatrix = ctypes.cast(arr, ctypes.POINTER(llama_cpp.llama_model_imatrix_data))
        kvs = [("quantize.imatrix.file", llama_cpp.LLAMA_KV_OVERRIDE_TYPE_STR, imatrix.encode()[:127])]
        if datasets:
            kvs.append(("quantize.imatrix.dataset", llama_cpp.LLAMA_KV_OVERRIDE_TYPE_STR, datasets[0].encode()[:127]))
        kvs.append(("quantize.imatrix.entries_count", llama_cpp.LLAMA_KV_OVERRIDE_TYPE_INT, len(entries)))
        if chunks > 0:
            kvs.append(("quantize.imatrix.chunks_count", llama_cpp.LLAMA_KV_OVERRIDE_TYPE_INT, chunks))
        ov = (llama_cpp.llama_model_kv_override * (len(kvs) + 1))()
        for i, (k, tag, v) in enumerate(kvs):
            ov[i].key, ov[i].tag = k.encode(), tag
            if tag == llama_cpp.LLAMA_KV_OVERRIDE_TYPE_STR:
                ov[i].value.val_str = v
            else:
                ov[i].value.val_i64 = v
        params.kv_overrides = ctypes.cast(ov, ctypes.POINTER(llama_cpp.llama_model_kv_override))
        keep += [arr, ov]
    rc = llama_cpp.llama_model_quantize(inp.encode(), out.encode(), params)
    if rc != 0:
        sys.exit(f"llama_model_quantize failed ({rc})")


def load(path):
    llama_cpp.llama_backend_init()
    mp = llama_cpp.llama_model_default_params()
    model = llama_cpp.llama_model_load_from_file(path.encode(), mp)
    if not model:
        sys.exit(f"llama_model_load_from_file refused {path}")
    n = llama_cpp.llama_model_n_params(model)
    print(f"loaded {path}: {n} parameters")
    llama_cpp.llama_model_free(model)


def main():
    cmd = sys.argv[1]
    if cmd == "quantize":
        imatrix = sys.argv[sys.argv.index("--imatrix") + 1] if "--imatrix" in sys.argv else None
        nthread = int(sys.argv[5]) if len(sys.argv) > 5 and sys.argv[5].isdigit() else 1
        quantize(sys.argv[2], sys.argv[3], int(sys.argv[4]), nthread,
                 allow_requantize="--allow-requantize" in sys.argv, imatrix=imatrix)
    elif cmd == "quantize-each":
        inp, outdir, nthread = sys.argv[2], sys.argv[3], int(sys.argv[4])
        for ftype in sys.argv[5:]:
            quantize(inp, os.path.join(outdir, f"{int(ftype)}.gguf"), int(ftype), nthread)
    elif cmd == "types":
        # --dry-run: llama.cpp logs each tensor's type choice on stderr ("... (q4_K)"), from C:
        # the markers go to the same descriptor, unbuffered, so they stay in order.
        for ftype in sys.argv[3:]:
            os.write(2, f"== ftype {int(ftype)}\n".encode())
            quantize(sys.argv[2], "/dev/null", int(ftype), 1, dry_run=True)
    elif cmd == "load":
        load(sys.argv[2])
    else:
        sys.exit(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
