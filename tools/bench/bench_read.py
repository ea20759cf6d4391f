#!/usr/bin/env python3
"""Read throughput of the expert pack through the mount against a plain read of the
source file, 1 MiB sequential reads, in one run (issue 2's measurement).

    python3 tools/bench/bench_read.py [--layers 8 --experts 32 --hidden 2048 --ff 1536] [--rounds 3]

Makes a large MoE GGUF with random MXFP4 experts (tools/fixtures/make_sample_gguf.py --fast-random)
in --workdir, mounts it, and measures, with the source in the page cache:
  source     1 MiB preads of the source file
  mount-cold 1 MiB preads of the pack, its pages dropped first (POSIX_FADV_DONTNEED)
  mount-warm the same again, pages cached
Prints MB/s (best of --rounds) and ratios to the source read.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools/bench"))
from bench_common import bench_gguf  # noqa: E402


def read_all(path: Path, block: int = 1 << 20, drop: bool = False) -> tuple[int, float]:
    fd = os.open(path, os.O_RDONLY)
    try:
        if drop:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        buf = bytearray(block)
        total, off = 0, 0
        t0 = time.perf_counter()
        while True:
            n = os.preadv(fd, [buf], off)
            if n <= 0:
                break
            total += n
            off += n
        return total, time.perf_counter() - t0
    finally:
        os.close(fd)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--experts", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--ff", type=int, default=1536)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "xpackfs-bench")
    ap.add_argument("--xpackfs", default=str(REPO / "target/release/xpackfs"))
    ap.add_argument("--mount-opts", default="")
    args = ap.parse_args()

    src = bench_gguf(args.workdir, args.layers, args.experts, args.hidden, args.ff)
    mnt = args.workdir / "mnt"
    mnt.mkdir(exist_ok=True)
    subprocess.run(["umount", str(mnt)], stderr=subprocess.DEVNULL)
    opts = f"digest_store={args.workdir / 'digests'}" + (f",{args.mount_opts}" if args.mount_opts else "")
    t0 = time.perf_counter()
    subprocess.run([args.xpackfs, "mount", str(src), str(mnt), "-o", opts], check=True, stderr=subprocess.DEVNULL)
    mount_s = time.perf_counter() - t0
    pack = next(mnt.glob("*.pack"))
    try:
        read_all(src)
        read_all(src)  # source warm in the page cache
        results: dict[str, list[float]] = {"source": [], "mount-cold": [], "mount-warm": []}
        for _ in range(args.rounds):
            n, t = read_all(src)
            results["source"].append(n / t / 1e6)
            n, t = read_all(pack, drop=True)
            results["mount-cold"].append(n / t / 1e6)
            n, t = read_all(pack)
            results["mount-warm"].append(n / t / 1e6)
        best = {k: max(v) for k, v in results.items()}
        print(f"source {src.stat().st_size / 1e9:.2f} GB, pack {pack.stat().st_size / 1e9:.2f} GB, "
              f"mount (first: hashing + mount) {mount_s:.2f} s")
        print(f"{'pattern':<12} {'MB/s':>9} {'x source':>9}")
        for k, v in best.items():
            print(f"{k:<12} {v:>9.0f} {v / best['source']:>9.2f}")
        print(json.dumps({"best_MBps": best, "all_MBps": results}))
    finally:
        subprocess.run(["umount", str(mnt)])
    return 0


if __name__ == "__main__":
    sys.exit(main())
