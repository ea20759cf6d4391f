#!/usr/bin/env python3
"""The GGUF output view's peer: llama.cpp's own `llama_model_quantize` and model loader,
through llama-cpp-python 0.3.36 (which vendors and builds llama.cpp 0c1e57098).

  llama_quantize_peer.py quantize IN OUT FTYPE_NUMBER [NTHREAD] [--allow-requantize]
                                                                   exit 0 when llama.cpp wrote OUT
  llama_quantize_peer.py types IN FTYPE_NUMBER                     --dry-run: each tensor's type, logged on stderr
  llama_quantize_peer.py load FILE                                 exit 0 when llama.cpp loads FILE

The package is imported from $XPACKFS_LLAMA_CPP (a `pip install --target` directory, see
tools/llama_cpp_peer.sh) when set, else from the Python path.
"""
import os
import sys

if os.environ.get("XPACKFS_LLAMA_CPP"):
    sys.path.insert(0, os.environ["XPACKFS_LLAMA_CPP"])

import llama_cpp  # noqa: E402

assert llama_cpp.__version__ == "0.3.36", llama_cpp.__version__


def quantize(inp, out, ftype, nthread, dry_run=False, allow_requantize=False):
    params = llama_cpp.llama_model_quantize_default_params()
    params.allow_requantize = allow_requantize
    params.ftype = ftype
    params.nthread = nthread
    params.dry_run = dry_run
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
        quantize(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]) if len(sys.argv) > 5 else 1,
                 allow_requantize="--allow-requantize" in sys.argv)
    elif cmd == "types":
        # --dry-run: llama.cpp logs each tensor's type choice on stderr ("... (q4_K)")
        quantize(sys.argv[2], "/dev/null", int(sys.argv[3]), 1, dry_run=True)
    elif cmd == "load":
        load(sys.argv[2])
    else:
        sys.exit(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
