#!/usr/bin/env python3
"""Run the fourth seed (`shared/seeds/v41_quant_experts.py.txt`) itself: plan + convert.

    python3 tools/peers/run_seed_requant.py --seeds ../shared/seeds --source SRC --out OUT \
        --ggml-lib $XPACKFS_GGML_LIB [--jobs 2] [--w1 IQ2_XXS --w2 Q2_K --w3 IQ2_XXS]
Prints the convert wall time in seconds on the last line.
"""
import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tools/: xptools
from xptools.seeds import write_seed  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=Path, required=True)
    ap.add_argument("--source", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--ggml-lib", required=True)
    ap.add_argument("--jobs", default="2")
    ap.add_argument("--w1", default="IQ2_XXS")
    ap.add_argument("--w2", default="Q2_K")
    ap.add_argument("--w3", default="IQ2_XXS")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        seed = write_seed(a.seeds, "v41_quant_experts.py.txt", Path(tmp) / "v41_quant_experts.py")
        subprocess.run([sys.executable, str(seed), "plan", "--source", str(a.source), "--out", str(a.out),
                        "--w1", a.w1, "--w2", a.w2, "--w3", a.w3], check=True, stdout=subprocess.DEVNULL)
        t0 = time.perf_counter()
        subprocess.run([sys.executable, str(seed), "convert", "--source", str(a.source), "--out", str(a.out),
                        "--jobs", a.jobs, "--ggml-lib", a.ggml_lib], check=True, stdout=subprocess.DEVNULL)
        print(f"{time.perf_counter() - t0:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
