#!/usr/bin/env python3
"""BF16 cache throughput: reading the mounted view (cold: fresh mount, empty chunk cache)
against a numpy/ml_dtypes implementation of the seed's conversion on the same data.

    python3 tools/bench/bench_bf16.py [--hidden 4096 --inter 2048 --layers 4] [--variant v4] [--rounds 5]

Prints MB/s of BF16 cache output for both, and the ratio: medians of rounds that alternate the
two (this VM's speed moves between minutes, and the numpy peer with it).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
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


def read_view(mnt: Path, warm: bool) -> tuple[int, float]:
    """Read every non-expert shard of the mounted view in 1 MiB reads: bytes, seconds."""
    t0 = time.perf_counter()
    total = 0
    for f in sorted(mnt.glob("non-expert-*.safetensors")):
        fd = os.open(f, os.O_RDONLY)
        if warm:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # page cache dropped, chunk cache warm
        while chunk := os.read(fd, 1 << 20):
            total += len(chunk)
        os.close(fd)
    return total, time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--inter", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--variant", default="v4")
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="compute_threads of the mount (default: every core)")
    ap.add_argument("--xpackfs", default=str(REPO / "target/release/xpackfs"))
    ap.add_argument("--mount-opts", default="", help="extra -o options of the mount (e.g. read_ahead_kb=1024)")
    ap.add_argument("--rounds", type=int, default=5,
                    help="rounds, each the numpy conversion then a fresh mount's cold and warm reads (medians reported)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "src"
        subprocess.run([sys.executable, str(REPO / "tools/fixtures/make_v4_fixture.py"), str(src), "--variant", args.variant,
                        "--hidden", str(args.hidden), "--inter", str(args.inter), "--layers", str(args.layers),
                        "--experts", "2"], check=True)
        mnt = Path(tmp) / "mnt"
        mnt.mkdir()
        opts = f"digest_store=none,cache_mb=4096,compute_threads={args.threads}" + (f",{args.mount_opts}" if args.mount_opts else "")
        rates = {"numpy": [], "cold": [], "warm": []}
        for _ in range(max(1, args.rounds)):
            t0 = time.perf_counter()
            nbytes = numpy_convert(src)
            rates["numpy"].append(nbytes / (time.perf_counter() - t0) / 1e6)
            subprocess.run([args.xpackfs, "mount", str(src), str(mnt), "-o", opts], check=True, stderr=subprocess.DEVNULL)
            try:
                for label in ["cold", "warm"]:
                    total, dt = read_view(mnt, label == "warm")
                    rates[label].append(total / dt / 1e6)
            finally:
                subprocess.run(["umount", str(mnt)], check=True)
        med = {k: statistics.median(v) for k, v in rates.items()}
        per_round = {k: [x / n for x, n in zip(rates[k], rates["numpy"])] for k in ("cold", "warm")}
        print(f"BF16 cache output {nbytes / 1e6:.0f} MB (tensor payload; shards {total / 1e6:.0f} MB with headers), "
              f"{len(rates['numpy'])} rounds, medians (each round: numpy, then a fresh mount)")
        print(f"numpy/ml_dtypes seed algorithm (1 process): {med['numpy']:8.0f} MB/s")
        for k in ("cold", "warm"):
            rs = per_round[k]
            print(f"xpackfs mount, {k} chunk cache:           {med[k]:8.0f} MB/s  ({med[k] / med['numpy']:.2f}x numpy; "
                  f"rounds {min(rs):.2f}-{max(rs):.2f}x, median {statistics.median(rs):.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
