#!/usr/bin/env python3
"""Serving benchmark: the expert pack through xpackfs against two peers on the same bytes,
in one run: `pread` of the pack materialized on disk (page-cached), and a minimal FUSE
passthrough daemon (examples/minipass.rs) serving that file: the FUSE transport alone.

    python3 tools/bench_serve.py [--workdir /tmp/xpackfs-bench] [--read-ahead-kb 4096]

Patterns: 1 MiB sequential reads; SGLang's loader (each object read as 4 ranges by a pool
of 4 threads, buffered and O_DIRECT); whole objects in random order; mmap page-touch.
Cold = the target file's pages dropped with POSIX_FADV_DONTNEED first (the source stays in
the page cache); warm = read again. Prints MB/s and the ratios xpackfs/minipass and
xpackfs/source. Also: mount start-up time and daemon RSS.
"""
from __future__ import annotations

import argparse
import json
import mmap
import os
import random
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tools"))
from bench_common import bench_gguf  # noqa: E402


def drop(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)


def seq(path: Path, layout) -> int:
    fd = os.open(path, os.O_RDONLY)
    buf = bytearray(1 << 20)
    total = off = 0
    while (n := os.preadv(fd, [buf], off)) > 0:
        total += n
        off += n
    os.close(fd)
    return total


def ranges(layout) -> list[tuple[int, int]]:
    """Each object's payload as 4 ranges (4096-aligned when large enough), SGLang style."""
    out = []
    for i in range(layout["objects"]):
        start = layout["data_start"] + i * layout["stride"]
        size = layout["payload"]
        q = size // 4 // 4096 * 4096 if size >= 4 * 4096 else size // 4
        cuts = [start, start + q, start + 2 * q, start + 3 * q, start + size]
        out.append([(cuts[j], cuts[j + 1] - cuts[j]) for j in range(4)])
    return out


def sglang(path: Path, layout, direct: bool) -> int:
    flags = os.O_RDONLY | (os.O_DIRECT if direct else 0)
    fd = os.open(path, flags)
    pool = ThreadPoolExecutor(4)
    total = 0

    def one(rng):
        off, ln = rng
        if direct:
            aoff = off // 4096 * 4096
            alen = (off + ln - aoff + 4095) // 4096 * 4096
            buf = mmap.mmap(-1, alen)
            n = os.preadv(fd, [buf], aoff)
            buf.close()
            return min(n, ln)
        return len(os.pread(fd, ln, off))

    for obj in ranges(layout):
        total += sum(pool.map(one, obj))
    pool.shutdown()
    os.close(fd)
    return total


def random_objects(path: Path, layout) -> int:
    fd = os.open(path, os.O_RDONLY)
    order = list(range(layout["objects"]))
    random.Random(7).shuffle(order)
    total = 0
    for i in order:
        total += len(os.pread(fd, layout["payload"], layout["data_start"] + i * layout["stride"]))
    os.close(fd)
    return total


def mmap_touch(path: Path, layout) -> int:
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        s = 0
        for off in range(0, len(m), 4096):
            s += m[off]
        return len(m)


PATTERNS = [("seq 1MiB", lambda p, l: seq(p, l)), ("sglang 4x", lambda p, l: sglang(p, l, False)),
            ("sglang O_DIRECT", lambda p, l: sglang(p, l, True)), ("random objects", random_objects),
            ("mmap touch", mmap_touch)]


def wait_mounted(mnt: Path, timeout=20):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if any(line.split()[1] == str(mnt) for line in open("/proc/mounts")):
            return
        time.sleep(0.05)
    raise SystemExit(f"{mnt} did not mount")


def rss_kb(pid: int) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/xpackfs-bench"))
    ap.add_argument("--read-ahead-kb", type=int, default=0, help="also set for both FUSE mounts")
    ap.add_argument("--xpackfs", default=str(REPO / "target/release/xpackfs"))
    ap.add_argument("--minipass", default=str(REPO / "target/release/examples/minipass"))
    a = ap.parse_args()
    src = bench_gguf(a.workdir)
    store = a.workdir / "digests"
    mat = a.workdir / "pack-on-disk"
    opts = f"digest_store={store}"
    if not (mat / "bench-8x32x2048x1536.pack").exists():
        subprocess.run([a.xpackfs, "materialize", str(src), "--out", str(mat), "--margin-gib", "0", "-o", opts], check=True,
                       capture_output=True)
    pack_file = mat / "bench-8x32x2048x1536.pack"
    manifest = json.loads((mat / "bench-8x32x2048x1536.pack.manifest.json").read_text())
    layout = {"objects": manifest["object_count"], "data_start": manifest["data_start"],
              "stride": manifest["object_stride"], "payload": manifest["object_payload_bytes"]}
    m1, m2 = a.workdir / "mnt-xpackfs", a.workdir / "mnt-minipass"
    for m in (m1, m2):
        m.mkdir(exist_ok=True)
        subprocess.run(["umount", str(m)], stderr=subprocess.DEVNULL)
    xo = opts + (f",read_ahead_kb={a.read_ahead_kb}" if a.read_ahead_kb else "")
    t0 = time.perf_counter()
    subprocess.run([a.xpackfs, "mount", str(src), str(m1), "-o", xo], check=True, stderr=subprocess.DEVNULL)
    startup = time.perf_counter() - t0
    mp = subprocess.Popen([a.minipass, str(pack_file), str(m2)], stderr=subprocess.DEVNULL)
    wait_mounted(m2)
    if a.read_ahead_kb:
        dev = next(l.split()[2] for l in open("/proc/self/mountinfo") if l.split()[4] == str(m2))
        Path(f"/sys/class/bdi/{dev}/read_ahead_kb").write_text(str(a.read_ahead_kb))
    xpid = int(subprocess.run(["pgrep", "-f", f"xpackfs mount {src}"], capture_output=True, text=True).stdout.split()[0])
    targets = {"source": pack_file, "minipass": m2 / "file", "xpackfs": m1 / pack_file.name}
    seq(pack_file, layout)  # both sources in the page cache: the file minipass serves,
    subprocess.run(["cat", str(src)], stdout=subprocess.DEVNULL, check=True)  # and the GGUF xpackfs reads
    rows = []
    try:
        for name, fn in PATTERNS:
            for state in ("cold", "warm"):
                res = {}
                for t, path in targets.items():
                    if state == "cold" and t != "source":
                        drop(path)
                    t0 = time.perf_counter()
                    n = fn(path, layout)
                    res[t] = n / (time.perf_counter() - t0) / 1e6
                rows.append((name, state, res))
        rss = rss_kb(xpid)
    finally:
        subprocess.run(["umount", str(m1)])
        subprocess.run(["umount", str(m2)])
        mp.wait(timeout=10)
    print(f"pack {pack_file.stat().st_size / 1e9:.2f} GB, {layout['objects']} objects of {layout['payload'] / 1e6:.1f} MB"
          + (f", read_ahead_kb={a.read_ahead_kb}" if a.read_ahead_kb else ", default readahead"))
    print(f"{'pattern':<16} {'state':<5} {'source':>8} {'minipass':>9} {'xpackfs':>8} {'x/minipass':>11} {'x/source':>9}  (MB/s)")
    for name, state, r in rows:
        print(f"{name:<16} {state:<5} {r['source']:>8.0f} {r['minipass']:>9.0f} {r['xpackfs']:>8.0f} "
              f"{r['xpackfs'] / r['minipass']:>11.2f} {r['xpackfs'] / r['source']:>9.2f}")
    print(f"xpackfs mount start-up (digests remembered): {startup:.3f} s; daemon RSS after the run: {rss / 1024:.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
