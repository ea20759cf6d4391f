#!/usr/bin/env python3
"""INT8 view read throughput (cold chunk cache) and validator time, xpackfs vs the seed.

    python3 tools/bench/bench_int8.py [--workdir /tmp/xpackfs-bench] [--layers 2]

Source: a random-MXFP4 GGUF (hidden 2048, expert ff 1536, 32 experts; made if missing).
"""
import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def timed(cmd):
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"{cmd[0]} failed: {r.stderr}")
    return time.perf_counter() - t0


def numpy_conversion(src: Path) -> tuple[float, int]:
    """The same conversion in numpy (the peer): gguf.quants.dequantize, per-row absmax/127
    scales, round half to even, and the kt-int8-n32-k64-vnni-v1 layout (check_int8's layout_offsets,
    used as a scatter); timed from the GGUF bytes to the packed bytes."""
    import gguf
    import numpy as np

    sys.path.insert(0, str(REPO / "tools/peers"))
    from check_int8 import layout_offsets

    reader = gguf.GGUFReader(src)
    experts = [t for t in reader.tensors if t.name.endswith("_exps.weight")]
    offsets: dict[tuple[int, int], np.ndarray] = {}
    nbytes = 0
    t0 = time.perf_counter()
    for t in experts:
        w_all = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type)
        for w in w_all:
            n, k = w.shape
            d = np.abs(w).max(axis=1, keepdims=True) / np.float32(127)
            q = np.clip(np.rint(np.divide(w, d, out=np.zeros_like(w), where=d > 0)), -127, 127).astype(np.int8)
            off = offsets.setdefault((n, k), layout_offsets(n, k))
            out = np.empty(n * k, np.int8)
            out[off] = q
            nbytes += out.nbytes + d.nbytes
    return time.perf_counter() - t0, nbytes


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/xpackfs-bench"))
    ap.add_argument("--layers", default="2")
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="compute_threads of the mount (default: every core)")
    ap.add_argument("--xpackfs", default=str(REPO / "target/release/xpackfs"))
    ap.add_argument("--seeds", default=str(REPO.parent / "shared" / "seeds"))
    a = ap.parse_args()
    a.workdir.mkdir(parents=True, exist_ok=True)
    src = a.workdir / f"int8-{a.layers}x32x2048x1536.gguf"
    if not src.exists():
        subprocess.run([sys.executable, str(REPO / "tools/fixtures/make_sample_gguf.py"), str(src), "--fast-random", "--layers", a.layers,
                        "--experts", "32", "--hidden", "2048", "--ff", "1536"], check=True)
    mnt = a.workdir / "mnt-int8"
    mnt.mkdir(exist_ok=True)
    subprocess.run(["umount", str(mnt)], stderr=subprocess.DEVNULL)
    subprocess.run([a.xpackfs, "mount", str(src), str(mnt), "-o", f"view=kt-int8,numa_count=2,digest_store=none,compute_threads={a.threads}"],
                   check=True, stderr=subprocess.DEVNULL)
    try:
        files = sorted(p for p in mnt.rglob("*.kt"))

        def read_all() -> tuple[int, float]:
            t0 = time.perf_counter()
            total = 0
            for p in files:
                with open(p, "rb") as f:
                    while b := f.read(1 << 20):
                        total += len(b)
            return total, time.perf_counter() - t0

        total, t_read = read_all()  # cold: nothing computed yet
        _, t_warm = read_all()  # warm: the kernel's page cache of the mount
    finally:
        subprocess.run(["umount", str(mnt)], check=True)
    t_numpy, np_bytes = numpy_conversion(src)
    tree = a.workdir / "int8-tree"
    shutil.rmtree(tree, ignore_errors=True)
    subprocess.run([a.xpackfs, "materialize", str(src), "--out", str(tree), "--margin-gib", "0", "-o",
                    f"view=kt-int8,numa_count=2,digest_store=none,compute_threads={a.threads}"], check=True, capture_output=True)
    layers = ",".join(str(i) for i in range(int(a.layers)))
    expect = ["--layers", layers, "--numa-count", "2", "--expert-num", "32", "--hidden-size", "2048", "--intermediate-size", "1536"]
    subprocess.run(["cat"] + [str(p) for p in tree.rglob("*.kt")], stdout=subprocess.DEVNULL)  # warm the page cache for both
    ours_h = min(timed([a.xpackfs, "validate-int8", str(tree), *expect, "--verify-hashes"]) for _ in range(3))
    seed_h = min(timed([sys.executable, str(REPO / "tools/peers/seed_validate_int8.py"), "--seeds", a.seeds, str(tree), *expect, "--verify-hashes"]) for _ in range(3))
    ours_n = min(timed([a.xpackfs, "validate-int8", str(tree), *expect, "--no-verify-hashes"]) for _ in range(3))
    seed_n = min(timed([sys.executable, str(REPO / "tools/peers/seed_validate_int8.py"), "--seeds", a.seeds, str(tree), *expect]) for _ in range(3))
    print(f"INT8 view: {len(files)} files, {total / 1e6:.0f} MB")
    print(f"numpy conversion (decode, per-row INT8, VNNI pack; 1 process): {np_bytes / 1e6 / t_numpy:8.0f} MB/s")
    print(f"xpackfs mount, cold (computed on read, {a.threads} threads):          {total / 1e6 / t_read:8.0f} MB/s  "
          f"({(total / t_read) / (np_bytes / t_numpy):.2f}x numpy)")
    print(f"xpackfs mount, warm:                                        {total / 1e6 / t_warm:8.0f} MB/s  "
          f"({(total / t_warm) / (np_bytes / t_numpy):.2f}x numpy)")
    print(f"validator with hashes: xpackfs {ours_h:.2f} s, seed {seed_h:.2f} s ({seed_h / ours_h:.2f}x)")
    print(f"validator without hashes: xpackfs {ours_n:.3f} s, seed {seed_n:.3f} s ({seed_n / ours_n:.2f}x; includes process start-up)")
    shutil.rmtree(tree, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
