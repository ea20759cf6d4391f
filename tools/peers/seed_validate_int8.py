#!/usr/bin/env python3
"""Run the second seed's validator (`validate_persistent_int8_weights`) on a tree.

    python3 tools/peers/seed_validate_int8.py --seeds ../shared/seeds ROOT --layers 0,1 --numa-count 2 \
        --expert-num 8 --hidden-size 256 --intermediate-size 128 [--verify-hashes]

The seed imports `INT8_WEIGHT_LAYOUT` from a sibling `backend` module that is not shipped;
a one-line stand-in is written next to it. Exit 0 and a JSON line when valid, 1 and the
seed's error message when not.
"""
import argparse
import importlib
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tools/: xptools
from xptools.seeds import write_seed  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("root")
    ap.add_argument("--seeds", type=Path, required=True)
    ap.add_argument("--layers", required=True)
    ap.add_argument("--numa-count", type=int, required=True)
    ap.add_argument("--expert-num", type=int, required=True)
    ap.add_argument("--hidden-size", type=int, required=True)
    ap.add_argument("--intermediate-size", type=int, required=True)
    ap.add_argument("--verify-hashes", action="store_true")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        pkg = Path(tmp) / "ktseed"
        pkg.mkdir()
        (pkg / "__init__.py").write_text("")
        (pkg / "backend.py").write_text('INT8_WEIGHT_LAYOUT = "kt-int8-n32-k64-vnni-v1"\n')
        write_seed(a.seeds, "kt_weight_manifest.py.txt", pkg / "weight_manifest.py", marker="# Persistent")
        sys.path.insert(0, tmp)
        mod = importlib.import_module("ktseed.weight_manifest")
        try:
            v = mod.validate_persistent_int8_weights(
                a.root, layer_indices=[int(x) for x in a.layers.split(",")], numa_count=a.numa_count,
                expert_num=a.expert_num, hidden_size=a.hidden_size, intermediate_size=a.intermediate_size,
                verify_hashes=a.verify_hashes)
        except (ValueError, PermissionError, OSError) as e:
            print(f"INVALID: {e}", file=sys.stderr)
            return 1
        print(json.dumps({"ok": True, "schema_version": v.schema_version, "file_count": v.file_count, "size_bytes": v.size_bytes}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
