#!/usr/bin/env python3
"""Requantised shards: the mounted view's read throughput (cold chunk cache) against the
fourth seed's `convert --jobs 2` wall time, on the same fixture, in one run.

    XPACKFS_GGML_LIB=... python3 tools/bench/bench_requant.py [--hidden 2048 --inter 1024 --experts 8 --layers 2]
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", default="2048")
    ap.add_argument("--inter", default="1024")
    ap.add_argument("--experts", default="8")
    ap.add_argument("--layers", default="2")
    ap.add_argument("--threads", type=int, default=os.cpu_count(),
                    help="compute_threads of the mount and --jobs of the seed (default: every core)")
    ap.add_argument("--seeds", default=str(REPO.parent / "shared" / "seeds"))
    ap.add_argument("--xpackfs", default=str(REPO / "target/release/xpackfs"))
    a = ap.parse_args()
    lib = os.environ["XPACKFS_GGML_LIB"]
    with tempfile.TemporaryDirectory() as tmp:
        src, out, mnt = Path(tmp) / "src", Path(tmp) / "seed", Path(tmp) / "mnt"
        subprocess.run([sys.executable, str(REPO / "tools/fixtures/make_v4_fixture.py"), str(src), "--variant", "v41",
                        "--hidden", a.hidden, "--inter", a.inter, "--experts", a.experts, "--layers", a.layers], check=True)
        r = subprocess.run([sys.executable, str(REPO / "tools/peers/run_seed_requant.py"), "--seeds", a.seeds, "--source", str(src),
                            "--out", str(out), "--ggml-lib", lib, "--jobs", str(a.threads)], check=True, capture_output=True, text=True)
        seed_s = float(r.stdout.strip().splitlines()[-1])
        mnt.mkdir()
        subprocess.run([a.xpackfs, "mount", str(src), str(mnt), "-o", f"view=requant,digest_store=none,cache_mb=4096,compute_threads={a.threads}"],
                       check=True, stderr=subprocess.DEVNULL)
        try:
            t0 = time.perf_counter()
            total = 0
            for f in sorted(mnt.glob("quant-*.safetensors")):
                with open(f, "rb") as fh:
                    while chunk := fh.read(1 << 20):
                        total += len(chunk)
            view_s = time.perf_counter() - t0
            same = all((out / f.name).read_bytes() == f.read_bytes() for f in mnt.glob("quant-*.safetensors"))
        finally:
            subprocess.run(["umount", str(mnt)], check=True)
        print(f"quantised shards: {total / 1e6:.1f} MB (identical to the seed's: {same})")
        print(f"seed convert --jobs {a.threads}:        {seed_s:7.2f} s  ({total / 1e6 / seed_s:7.1f} MB/s of output)")
        print(f"xpackfs view, cold, {a.threads} threads: {view_s:7.2f} s  ({total / 1e6 / view_s:7.1f} MB/s of output)  "
              f"{seed_s / view_s:.2f}x the seed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
