#!/usr/bin/env python3
"""BF16 cache throughput: reading the mounted view (cold: fresh mount, empty chunk cache)
against a numpy/ml_dtypes implementation of the seed's conversion on the same data.

    python3 tools/bench/bench_bf16.py [--hidden 4096 --inter 2048 --layers 4] [--variant v4]

Prints MB/s of BF16 cache output for both, and the ratio.
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

import ml_dtypes
import numpy as np
import safetensors

REPO = Path(__file__).resolve().parents[2]


def numpy_convert(src: Path) -> int:
    config = json.loads((src / "config.json").read_text())
    block = config.get("text_config", config)["quantization_config"]["weight_block_size"]
    index = json.loads((src / "model.safetensors.index.json").read_text())
    data = {}
    for s in sorted(set(index["weight_map"].values())):
        data.update({k: v for k, v in safetensors.deserialize((src / s).read_bytes())})
    total = 0
    for key, v in data.items():
        if key.startswith("mtp.") or ".experts." in key or key.endswith(".scale"):
            continue
        if v["dtype"] == "F8_E4M3":
            s = data[key.removesuffix(".weight") + ".scale"]
            w = np.frombuffer(v["data"], np.uint8).reshape(v["shape"]).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
            sc = np.exp2(np.frombuffer(s["data"], np.uint8).reshape(s["shape"]).astype(np.float32) - 127)
            full = np.repeat(np.repeat(sc, block[0], 0), block[1], 1)[: w.shape[0], : w.shape[1]]
            out = (w * full).astype(ml_dtypes.bfloat16)
            assert np.isfinite(out.astype(np.float32)).all()
            total += out.nbytes
        else:
            total += len(bytes(v["data"]))
    return total


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--inter", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--variant", default="v4")
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="compute_threads of the mount (default: every core)")
    ap.add_argument("--xpackfs", default=str(REPO / "target/release/xpackfs"))
    ap.add_argument("--mount-opts", default="", help="extra -o options of the mount (e.g. read_ahead_kb=1024)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "src"
        subprocess.run([sys.executable, str(REPO / "tools/fixtures/make_v4_fixture.py"), str(src), "--variant", args.variant,
                        "--hidden", str(args.hidden), "--inter", str(args.inter), "--layers", str(args.layers),
                        "--experts", "2"], check=True)
        t0 = time.perf_counter()
        nbytes = numpy_convert(src)
        t_np = time.perf_counter() - t0
        mnt = Path(tmp) / "mnt"
        mnt.mkdir()
        results = {}
        for label in ["cold", "warm"]:
            if label == "cold":
                subprocess.run([args.xpackfs, "mount", str(src), str(mnt), "-o", f"digest_store=none,cache_mb=4096,compute_threads={args.threads}" + (f",{args.mount_opts}" if args.mount_opts else "")],
                               check=True, stderr=subprocess.DEVNULL)
            t0 = time.perf_counter()
            total = 0
            for f in sorted(mnt.glob("non-expert-*.safetensors")):
                fd = os.open(f, os.O_RDONLY)
                if label == "warm":
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # page cache dropped, chunk cache warm
                while chunk := os.read(fd, 1 << 20):
                    total += len(chunk)
                os.close(fd)
            results[label] = total / (time.perf_counter() - t0) / 1e6
        subprocess.run(["umount", str(mnt)], check=True)
        np_rate = nbytes / t_np / 1e6
        print(f"BF16 cache output {nbytes / 1e6:.0f} MB (tensor payload; shards {total / 1e6:.0f} MB with headers)")
        print(f"numpy/ml_dtypes seed algorithm (1 process): {np_rate:8.0f} MB/s")
        print(f"xpackfs mount, cold chunk cache:           {results['cold']:8.0f} MB/s  ({results['cold'] / np_rate:.2f}x numpy)")
        print(f"xpackfs mount, warm chunk cache:           {results['warm']:8.0f} MB/s  ({results['warm'] / np_rate:.2f}x numpy)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
