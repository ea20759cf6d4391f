#!/usr/bin/env python3
"""The disk cache through real mounts (issue 18), in one run, A and B alternated, medians:

    cargo build --release
    flock /tmp/xpackfs-bench.lock python3 tools/bench/bench_disk_cache.py [--rounds 3] [--only NAME,...]

1. `restart`: the requant view's shards read through a second mount (disk cache warm, page
   cache of the cache directory and the source dropped, fresh mount) vs reading a
   materialized copy of the same files on the same disk (pages dropped). Target >= 0.8x.
   The shards are served whole from file entries (FUSE passthrough); `--mount-opts
   disk_cache_files=off` measures the daemon path from chunk entries instead.
2. `first`: a first, cold read of the requant view with the disk cache on (empty) vs off.
   Target >= 0.9x (the cache costs <= 10%).
3. `warm`: `xpackfs warm` of the requant view (fresh cache) vs `xpackfs materialize` of it
   (fresh output, no cache), same cores, wall time. Target >= 0.9x.
4. `responsive`: while two readers read the view cold (every core computing), the latency of
   stat and a read of /.xpackfs/stats.json, readdir of the root, a 100-byte O_DIRECT read of
   plan.json and a 4 KiB O_DIRECT read of chunks already in memory (each reaches the
   daemon: dynamic files and O_DIRECT bypass the kernel's caches), p50 / p99 / max.
   Target: p99 < 20 ms.

Fixtures (tools/fixtures/make_v4_fixture.py, V4.1-shaped): for `restart`, the expert geometry of
V4.1-Flash (hidden 5120, moe_intermediate 2304: chunks of about 1 MiB, three per expert
tensor; --restart-shape, 4 experts x 2 layers: 80 MB of requantised experts in 161 MB of
shards, the rest non-expert tensors served from the source); for the others, a smaller one
(--hidden 2048 --inter 1024 --experts 8 --layers 2: 28 MB of experts in 44 MB of shards),
so the cold, computing rounds stay short.
"""
from __future__ import annotations

import argparse
import json
import mmap
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def drop(paths) -> None:
    for p in paths:
        try:
            fd = os.open(p, os.O_RDONLY)
        except OSError:
            continue
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)


def files_under(d: Path) -> list[Path]:
    return [p for p in d.rglob("*") if p.is_file()]


def read_seq(paths) -> int:
    buf = bytearray(1 << 20)
    total = 0
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        off = 0
        while (n := os.preadv(fd, [buf], off)) > 0:
            off += n
        total += off
        os.close(fd)
    return total


def fixture(path: Path, hidden: str, inter: str, experts: str, layers: str) -> Path:
    subprocess.run([sys.executable, str(REPO / "tools/fixtures/make_v4_fixture.py"), str(path), "--variant", "v41",
                    "--hidden", hidden, "--inter", inter, "--experts", experts, "--layers", layers],
                   check=True, stdout=subprocess.DEVNULL)
    return path


class Bench:
    def __init__(self, a, tmp: Path):
        self.a, self.tmp = a, tmp
        self.src = fixture(tmp / "src", a.hidden, a.inter, a.experts, a.layers)
        self.mnt = tmp / "mnt"
        self.mnt.mkdir()
        self.base = "view=requant,digest_store=none"

    def mount(self, extra: str = "") -> None:
        subprocess.run([self.a.xpackfs, "mount", str(self.src), str(self.mnt), "-o",
                        self.base + (f",{self.a.mount_opts}" if self.a.mount_opts else "") + extra], check=True,
                       stderr=subprocess.DEVNULL)

    def umount(self) -> None:
        subprocess.run(["umount", str(self.mnt)], check=True)
        for _ in range(200):  # the daemon exits after the unmount
            if subprocess.run(["pgrep", "-f", f"mount {self.src} {self.mnt}"], capture_output=True).returncode != 0:
                return
            time.sleep(0.05)

    def shards(self, root: Path) -> list[Path]:
        return sorted(root.glob("quant-*.safetensors"))

    def run(self, *args: str) -> float:
        t = time.perf_counter()
        subprocess.run([self.a.xpackfs, *args], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return time.perf_counter() - t


def ratio_line(name: str, a: list[float], b: list[float], unit: str, target: str) -> None:
    ma, mb = statistics.median(a), statistics.median(b)
    print(f"  {name}: {ma:8.1f} vs {mb:8.1f} {unit}  ratio {ma / mb:.2f}x  (target {target}; "
          f"rounds {', '.join(f'{x:.1f}' for x in a)} / {', '.join(f'{x:.1f}' for x in b)})")


def restart(b: Bench) -> None:
    small_src = b.src
    b.src = fixture(b.tmp / "src-restart", *b.a.restart_shape.split(","))
    cache = b.tmp / "cache-restart"
    copy = b.tmp / "copy"
    b.run("warm", str(b.src), "-o", f"{b.base},disk_cache={cache}")
    b.run("materialize", str(b.src), "--out", str(copy), "--margin-gib", "0", "-o", b.base)
    os.sync()  # dirty pages cannot be dropped: every round starts from the disk
    entries = files_under(cache)
    sources = files_under(b.src)
    mount_rates, copy_rates = [], []
    for r in range(b.a.rounds * 2):
        for which in ((0, 1) if r % 2 == 0 else (1, 0)):
            if which == 0:
                b.mount(f",disk_cache={cache}")
                drop(entries + sources)
                t = time.perf_counter()
                n = read_seq(b.shards(b.mnt))
                mount_rates.append(n / (time.perf_counter() - t) / 1e6)
                stats = json.loads((b.mnt / ".xpackfs/stats.json").read_text())
                b.umount()
                assert stats["cache"]["bytes_computed"] == 0, stats
                whole = stats["disk_cache"]["file_hits"]
            else:
                drop(files_under(copy))
                t = time.perf_counter()
                n = read_seq(b.shards(copy))
                copy_rates.append(n / (time.perf_counter() - t) / 1e6)
    b.src = small_src
    print(f"1. second mount, disk cache warm, page cache dropped ({n / 1e6:.1f} MB of shards; {whole} of "
          f"{len(b.shards(copy))} opens served whole by the kernel from file entries) vs the materialized copy:")
    ratio_line("mount vs copy", mount_rates, copy_rates, "MB/s", ">= 0.8x")


def first(b: Bench) -> None:
    on, off = [], []
    for r in range(b.a.rounds):
        for which in ((0, 1) if r % 2 == 0 else (1, 0)):
            cache = b.tmp / f"cache-first-{r}"
            b.mount(f",disk_cache={cache}" if which == 0 else "")
            t = time.perf_counter()
            n = read_seq(b.shards(b.mnt))
            rate = n / (time.perf_counter() - t) / 1e6
            b.umount()
            (on if which == 0 else off).append(rate)
            subprocess.run(["rm", "-rf", str(cache)], check=True)
    print(f"2. first mount, cold read of the requant view ({n / 1e6:.1f} MB), disk cache on vs off:")
    ratio_line("cache on vs off", on, off, "MB/s", ">= 0.9x")


def warm(b: Bench) -> None:
    w, m = [], []
    for r in range(b.a.rounds):
        for which in ((0, 1) if r % 2 == 0 else (1, 0)):
            d = b.tmp / f"warm-{r}-{which}"
            if which == 0:
                w.append(b.run("warm", str(b.src), "-o", f"{b.base},disk_cache={d}"))
            else:
                m.append(b.run("materialize", str(b.src), "--out", str(d), "--margin-gib", "0", "-o", b.base))
            subprocess.run(["rm", "-rf", str(d)], check=True)
    print("3. xpackfs warm vs xpackfs materialize of the requant view (wall time, same cores):")
    mw, mm = statistics.median(w), statistics.median(m)
    print(f"  warm {mw:.2f} s, materialize {mm:.2f} s: warm runs at {mm / mw:.2f}x materialize's speed (target >= 0.9x; "
          f"rounds {', '.join(f'{x:.2f}' for x in w)} / {', '.join(f'{x:.2f}' for x in m)})")


def odirect_read(path: Path, offset: int, size: int) -> None:
    buf = mmap.mmap(-1, max(size, 4096))
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    try:
        os.preadv(fd, [memoryview(buf)[:size]], offset)
    finally:
        os.close(fd)


def responsive(b: Bench) -> None:
    b.mount()
    shards = b.shards(b.mnt)
    # Chunks of the first shard computed and in memory; the readers compute the others.
    read_seq(shards[:1])
    stats_file = b.mnt / ".xpackfs/stats.json"
    ops = {
        "stat stats.json": lambda: os.stat(stats_file),
        "read stats.json": lambda: stats_file.read_bytes(),
        "readdir /": lambda: os.listdir(b.mnt),
        "plan.json 100 B (O_DIRECT)": lambda: odirect_read(b.mnt / "plan.json", 0, 100),
        "cached chunk 4 KiB (O_DIRECT)": lambda: odirect_read(shards[0], 1 << 20, 4096),
    }
    lat = {k: [] for k in ops}
    done = threading.Event()
    readers = [threading.Thread(target=read_seq, args=([s],)) for s in shards[1:]]
    cpu0 = os.times()
    t0 = time.perf_counter()
    for r in readers:
        r.start()
    threading.Thread(target=lambda: ([r.join() for r in readers], done.set()), daemon=True).start()
    while not done.is_set():
        for name, op in ops.items():
            t = time.perf_counter()
            op()
            lat[name].append((time.perf_counter() - t) * 1e3)
        time.sleep(0.005)
    wall = time.perf_counter() - t0
    stats = json.loads(stats_file.read_text())
    b.umount()
    print(f"4. responsiveness during a cold read of {len(readers)} shards ({wall:.1f} s; "
          f"{stats['compute']['runs_read']} chunk jobs on {stats['compute']['threads']} compute threads): latency in ms")
    for name, v in lat.items():
        v.sort()
        p = lambda q: v[min(len(v) - 1, int(q * len(v)))]
        print(f"  {name:32s} n={len(v):4d}  p50 {p(0.5):7.2f}  p99 {p(0.99):7.2f}  max {v[-1]:7.2f}  (target p99 < 20)")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--hidden", default="2048")
    ap.add_argument("--inter", default="1024")
    ap.add_argument("--experts", default="8")
    ap.add_argument("--layers", default="2")
    ap.add_argument("--restart-shape", default="5120,2304,4,2", help="hidden,inter,experts,layers of the restart fixture")
    ap.add_argument("--only", default="restart,first,warm,responsive")
    ap.add_argument("--mount-opts", default="", help="more -o options for every mount (e.g. read_ahead_kb=4096)")
    ap.add_argument("--dir", default=None, help="work directory (default: the system temporary directory)")
    ap.add_argument("--xpackfs", default=str(REPO / "target/release/xpackfs"))
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=a.dir) as tmp:
        b = Bench(a, Path(tmp))
        print(f"disk cache benchmark ({os.cpu_count()} cores; load average {os.getloadavg()[0]:.1f} at the start)")
        for name in a.only.split(","):
            {"restart": restart, "first": first, "warm": warm, "responsive": responsive}[name](b)
        print(f"  (load average {os.getloadavg()[0]:.1f} at the end)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
