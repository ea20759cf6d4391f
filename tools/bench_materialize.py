#!/usr/bin/env python3
"""materialize throughput against cp of the same bytes, in one run.

    python3 tools/bench_materialize.py [--workdir /tmp/xpackfs-bench]

Uses the large random-MXFP4 GGUF that tools/bench_read.py makes (made here if missing).
Compares `xpackfs materialize` of its expert pack (fsynced, hashed while writing) with
`cp` of the source file followed by `sync` (warm source for both).
"""
import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tools"))
from bench_common import bench_gguf  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/xpackfs-bench"))
    ap.add_argument("--xpackfs", default=str(REPO / "target/release/xpackfs"))
    a = ap.parse_args()
    src = bench_gguf(a.workdir)
    subprocess.run(["cat", str(src)], stdout=subprocess.DEVNULL, check=True)  # warm
    out = a.workdir / "materialized"
    shutil.rmtree(out, ignore_errors=True)
    store = a.workdir / "digests"
    # Digests first (a one-time cost that a mount or `xpackfs digest` pays too), then time the write.
    subprocess.run([a.xpackfs, "digest", str(src), "--digest-store", str(store)], check=True, capture_output=True)
    t0 = time.perf_counter()
    subprocess.run([a.xpackfs, "materialize", str(src), "--out", str(out), "--margin-gib", "0", "-o", f"digest_store={store}"],
                   check=True, capture_output=True)
    t_mat = time.perf_counter() - t0
    n = sum(p.stat().st_size for p in out.iterdir())
    dst = a.workdir / "copy.bin"
    t0 = time.perf_counter()
    subprocess.run(["cp", str(src), str(dst)], check=True)
    subprocess.run(["sync", str(dst)], check=True)
    t_cp = time.perf_counter() - t0
    m = src.stat().st_size
    print(f"materialize expert pack: {n / 1e6:.0f} MB in {t_mat:.2f} s = {n / 1e6 / t_mat:.0f} MB/s (fsynced, sha256 while writing)")
    print(f"cp + sync of the source: {m / 1e6:.0f} MB in {t_cp:.2f} s = {m / 1e6 / t_cp:.0f} MB/s")
    print(f"ratio: {(n / t_mat) / (m / t_cp):.2f}x cp")
    shutil.rmtree(out, ignore_errors=True)
    dst.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
