#!/usr/bin/env python3
"""Serving benchmark: the expert pack through xpackfs against two peers on the same bytes,
in one run: `pread` of the pack materialized on disk (page-cached), and a minimal FUSE
passthrough daemon (examples/minipass.rs) serving that file: the FUSE transport alone.

    flock /tmp/xpackfs-bench.lock python3 tools/bench/bench_serve.py [--rounds 3] [--full-size /tmp/flash.gguf]
        [--no-computed] [--sglang-only]

First, SGLang's pattern (its own reader, tools/peers/sglang_read.py, on a GGUF of 8 layers x 64
experts, an 856 MB pack): the loader defaults (O_DIRECT, one read per object), O_DIRECT with
4 splits, and the store defaults (buffered, 4 splits), cold (`echo 3 > drop_caches`: run it
as root, under the lock) and warm, through the mount against the same reads of a
materialized copy on the same disk; the source's page-cache residency after each (fincore);
the direct-I/O levers (async_dio, direct_threads, threads, max_background, max_read); and
the issue-15 target ratios, all in one run.

Then the older patterns: 1 MiB sequential reads; SGLang's loader (each object read as 4 ranges by a pool
of 4 threads, buffered and O_DIRECT); whole objects in random order; mmap page-touch.
Cold = the target file's pages dropped with POSIX_FADV_DONTNEED first (the source stays in
the page cache); warm = read again. Prints MB/s and the ratios xpackfs/minipass and
xpackfs/source (medians of --rounds runs, the three targets interleaved). Then: cold
sequential reads by mount readahead (both FUSE mounts), xpackfs levers (threads, clone_fd,
max_read), mount start-up time and daemon RSS (also for a full-size sparse GGUF with
--full-size), and the computed views against their peers (tools/bench/bench_bf16.py,
bench_int8.py, bench_disk_cache.py: the disk cache and responsiveness while computing, and
bench_requant.py when XPACKFS_GGML_LIB is set).
"""
from __future__ import annotations

import argparse
import json
import mmap
import os
import random
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools/bench"))
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


def set_read_ahead(mnt: Path, kb: int) -> None:
    dev = next(l.split()[2] for l in open("/proc/self/mountinfo") if l.split()[4] == str(mnt))
    Path(f"/sys/class/bdi/{dev}/read_ahead_kb").write_text(str(kb))


class Mounts:
    """The two FUSE peers: xpackfs (remountable with other options) and minipass."""

    def __init__(self, a, src: Path, pack_file: Path, store: Path):
        self.a, self.src, self.pack_file, self.store = a, src, pack_file, store
        self.mx, self.mm = a.workdir / "mnt-xpackfs", a.workdir / "mnt-minipass"
        for m in (self.mx, self.mm):
            m.mkdir(exist_ok=True)
            subprocess.run(["umount", str(m)], stderr=subprocess.DEVNULL)
        self.mp = None

    def xpackfs(self, extra: str = "") -> float:
        subprocess.run(["umount", str(self.mx)], stderr=subprocess.DEVNULL)
        t0 = time.perf_counter()
        subprocess.run([self.a.xpackfs, "mount", str(self.src), str(self.mx), "-o", f"digest_store={self.store}{extra}"],
                       check=True, stderr=subprocess.DEVNULL)
        return time.perf_counter() - t0

    def xpid(self) -> int:
        return int(subprocess.run(["pgrep", "-f", f"xpackfs mount {self.src} {self.mx}"], capture_output=True,
                                  text=True).stdout.split()[0])

    def minipass(self, *extra: str) -> None:
        if self.mp:
            subprocess.run(["umount", str(self.mm)], check=True)
            self.mp.wait(timeout=10)
        self.mp = subprocess.Popen([self.a.minipass, str(self.pack_file), str(self.mm), *extra], stderr=subprocess.DEVNULL)
        wait_mounted(self.mm)

    def mpid(self) -> int:
        return self.mp.pid

    def close(self) -> None:
        subprocess.run(["umount", str(self.mx)], stderr=subprocess.DEVNULL)
        subprocess.run(["umount", str(self.mm)], stderr=subprocess.DEVNULL)
        if self.mp:
            self.mp.wait(timeout=10)


def cpu_seconds(pid: int) -> float:
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def measure(fn, path: Path, layout, cold: bool, pid: int | None = None) -> tuple[float, float]:
    """(MB/s, daemon CPU seconds per GB read) of one run."""
    if cold:
        drop(path)
    c0 = cpu_seconds(pid) if pid else 0.0
    t0 = time.perf_counter()
    n = fn(path, layout)
    rate = n / (time.perf_counter() - t0) / 1e6
    cpu = (cpu_seconds(pid) - c0) / (n / 1e9) if pid else 0.0
    return rate, cpu


CPU = {}  # (pattern, state, target) -> median daemon CPU s/GB of the last median_rates call


def median_rates(targets: dict, fn, layout, cold: bool, rounds: int, pids: dict | None = None, key=None) -> dict:
    """MB/s per target, median of `rounds`, the targets interleaved within each round."""
    got = {t: [] for t in targets}
    cpu = {t: [] for t in targets}
    for _ in range(rounds):
        for t, path in targets.items():
            r, c = measure(fn, path, layout, cold and t != "source", (pids or {}).get(t))
            got[t].append(r)
            cpu[t].append(c)
    if key:
        for t in targets:
            CPU[(*key, t)] = statistics.median(cpu[t])
    return {t: statistics.median(v) for t, v in got.items()}


def drop_all() -> None:
    """Cold page cache for everything (root; only ever inside the bench lock)."""
    subprocess.run(["sync"], check=True)
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def resident_pct(path: Path) -> float:
    out = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES", str(path)], capture_output=True,
                         text=True, check=True).stdout
    return 100.0 * int(out.strip() or 0) / path.stat().st_size


def sglang_rate(pack: Path, direct: bool, splits: int) -> float:
    """GB/s of SGLang's own reader over the whole pack (its own timing, process start excluded)."""
    cmd = [sys.executable, str(REPO / "tools/peers/sglang_read.py"), str(pack), "--splits", str(splits), "--json"]
    r = json.loads(subprocess.run(cmd + (["--direct-io"] if direct else []), capture_output=True, text=True,
                                  check=True).stdout)
    return r["bytes"] / r["seconds"] / 1e9


SGLANG = [("loader: O_DIRECT, 1 read/object", True, 1), ("O_DIRECT, 4 splits", True, 4),
          ("store: buffered, 4 splits", False, 4)]


def sglang_section(a) -> None:
    """SGLang's read pattern through the mount against a local copy, with the direct-I/O levers."""
    src = bench_gguf(a.workdir, 8, 64, 1024, 1024)
    store = a.workdir / "digests"
    local_dir = a.workdir / "sglang-local"
    name = src.stem
    local = local_dir / f"{name}.pack"
    if not local.exists():
        subprocess.run([a.xpackfs, "materialize", str(src), "--out", str(local_dir), "--margin-gib", "0", "-o",
                        f"digest_store={store}"], check=True, capture_output=True)
    m = Mounts(a, src, local, store)
    mpack = m.mx / local.name
    rows, levers = [], []
    try:
        m.xpackfs()
        for label, direct, splits in SGLANG:
            for state in ("cold", "warm"):
                got = {"mount": [], "local": []}
                res = []
                for _ in range(a.rounds):
                    for t, path in (("mount", mpack), ("local", local)):
                        if state == "cold":
                            drop_all()
                        else:
                            sglang_rate(path, direct, splits)  # warm-up pass
                        got[t].append(sglang_rate(path, direct, splits))
                        if t == "mount":
                            res.append(resident_pct(src))
                rows.append((label, state, statistics.median(got["mount"]), statistics.median(got["local"]),
                             statistics.median(res)))
        # Levers, O_DIRECT loader pattern, cold, each against the local copy in the same rounds.
        for label, o in [("defaults", ""), ("async_dio=off", "async_dio=off"), ("direct_piece_kb=128", "direct_piece_kb=128"),
                         ("direct_piece_kb=256", "direct_piece_kb=256"), ("direct_piece_kb=512", "direct_piece_kb=512"),
                         ("direct_threads=0", "direct_threads=0"),
                         ("direct_threads=8", "direct_threads=8"), ("direct_threads=64", "direct_threads=64"),
                         ("direct_threads=0,threads=16", "direct_threads=0,threads=16"),
                         ("max_background=64", "max_background=64"), ("max_read=262144", "max_read=262144"),
                         ("source_io=buffered", "source_io=buffered")]:
            m.xpackfs("," + o if o else "")
            got = {"mount": [], "local": []}
            for _ in range(a.rounds):
                for t, path in (("mount", mpack), ("local", local)):
                    drop_all()
                    got[t].append(sglang_rate(path, True, 1))
            levers.append((label, statistics.median(got["mount"]), statistics.median(got["local"])))
        # 1 MiB sequential, xpackfs defaults against minipass defaults and the local copy: cold, and
        # warm against a page-cached source pread.
        m.xpackfs()
        m.minipass()
        seq_t = {"xpackfs": mpack, "minipass": m.mm / "file", "local": local}
        seq_rows = {}
        for state in ("cold", "warm"):
            got = {t: [] for t in seq_t}
            for _ in range(a.rounds):
                for t, path in seq_t.items():
                    if state == "cold":
                        drop_all()
                    else:
                        seq(path, None)  # warm: the target page-cached (xpackfs's pack on its mount)
                    t0 = time.perf_counter()
                    n = seq(path, None)
                    got[t].append(n / (time.perf_counter() - t0) / 1e9)
            seq_rows[state] = {t: statistics.median(v) for t, v in got.items()}
        # Warm reads through the daemon, with and without its copy of the bytes: minipass with
        # FOPEN_DIRECT_IO answering from the file, and answering from a buffer without reading
        # it (--no-read): the bound on what a zero-copy (splice) reply path could gain.
        bound = {}
        for label, extra in (("minipass --direct-io", ("--direct-io",)), ("minipass --direct-io --no-read",
                                                                            ("--direct-io", "--no-read"))):
            m.minipass(*extra)
            seq(m.mm / "file", None)
            bound[label] = []
            for _ in range(a.rounds):
                t0 = time.perf_counter()
                n = seq(m.mm / "file", None)
                bound[label].append(n / (time.perf_counter() - t0) / 1e9)
        bound = {k: statistics.median(v) for k, v in bound.items()}
    finally:
        m.close()

    print(f"SGLang's reader (tools/peers/sglang_read.py: ExpertPackStore.acquire, 8 staging slots) on {local.name} "
          f"({local.stat().st_size / 1e6:.0f} MB); mount (xpackfs defaults) vs local copy on the same disk; "
          f"GB/s, medians of {a.rounds}; resident = source GGUF in the page cache after the mount run")
    print(f"{'pattern':<34} {'state':<5} {'mount':>7} {'local':>7} {'mount/local':>12} {'resident':>9}")
    for label, state, mnt, loc, res in rows:
        print(f"{label:<34} {state:<5} {mnt:>7.2f} {loc:>7.2f} {mnt / loc:>12.2f} {res:>8.0f}%")
    print(f"\ndirect-I/O levers: loader pattern (O_DIRECT, 1 read/object), cold; defaults: source_io=auto, "
          f"async_dio=on, direct_threads=32, direct_piece_kb=0, threads={min(max(os.cpu_count() or 8, 2), 8)}, max_read=1048576")
    print(f"{'setting':<30} {'mount':>7} {'local':>7} {'mount/local':>12}")
    for label, mnt, loc in levers:
        print(f"{label:<30} {mnt:>7.2f} {loc:>7.2f} {mnt / loc:>12.2f}")
    print("\n1 MiB sequential reads, GB/s (xpackfs and minipass defaults; local = pread of the local copy)")
    for state, r in seq_rows.items():
        print(f"  {state}: xpackfs {r['xpackfs']:.2f}, minipass {r['minipass']:.2f}, local {r['local']:.2f}; "
              f"xpackfs/minipass {r['xpackfs'] / r['minipass']:.2f}, xpackfs/local {r['xpackfs'] / r['local']:.2f}, "
              f"local/minipass {r['local'] / r['minipass']:.2f}")
    w = seq_rows["warm"]
    print("  warm, the FUSE transport alone: " + ", ".join(f"{k} {v:.2f}" for k, v in bound.items())
          + f"; no-read/read {bound['minipass --direct-io --no-read'] / bound['minipass --direct-io']:.2f}x"
          + f" (the most a zero-copy reply could gain), minipass/local {bound['minipass --direct-io'] / w['local']:.2f}")
    by = {(lab, st): (mn, lc, rs) for lab, st, mn, lc, rs in rows}
    print("\nissue-15 targets (this run)")
    targets = [
        ("O_DIRECT 1 read/object, cold: mount/local >= 0.9", by[(SGLANG[0][0], "cold")][0] / by[(SGLANG[0][0], "cold")][1]),
        ("O_DIRECT 4 splits, cold: mount/local >= 0.9", by[(SGLANG[1][0], "cold")][0] / by[(SGLANG[1][0], "cold")][1]),
        ("source resident after O_DIRECT whole-pack read <= 10%", by[(SGLANG[0][0], "cold")][2]),
        ("buffered 4 splits, warm: mount/local >= 0.9", by[(SGLANG[2][0], "warm")][0] / by[(SGLANG[2][0], "warm")][1]),
        ("1 MiB sequential, warm: mount/source pread >= 0.9", seq_rows["warm"]["xpackfs"] / seq_rows["warm"]["local"]),
        ("1 MiB sequential, cold: xpackfs/minipass >= 3", seq_rows["cold"]["xpackfs"] / seq_rows["cold"]["minipass"]),
    ]
    for label, v in targets:
        print(f"  {label:<56} {v:.2f}{'%' if 'resident' in label else 'x'}")
    print()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/xpackfs-bench"))
    ap.add_argument("--rounds", type=int, default=3, help="each figure is the median of this many runs")
    ap.add_argument("--xpackfs", default=str(REPO / "target/release/xpackfs"))
    ap.add_argument("--minipass", default=str(REPO / "target/release/examples/minipass"))
    ap.add_argument("--full-size", type=Path, default=None,
                    help="a full-size sparse GGUF (tools/fixtures/make_sparse_v4_flash.py) for start-up time and RSS")
    ap.add_argument("--no-computed", action="store_true", help="skip the computed views")
    ap.add_argument("--sglang-only", action="store_true", help="only SGLang's pattern and the direct-I/O levers")
    a = ap.parse_args()
    for path, build in ((a.xpackfs, ["--bin", "xpackfs"]), (a.minipass, ["--example", "minipass"])):
        if not Path(path).exists():  # the default paths: build what is missing before the first mount
            subprocess.run(["cargo", "build", "--release", "--quiet", *build], cwd=REPO, check=True)
    sglang_section(a)
    if a.sglang_only:
        return 0
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
    m = Mounts(a, src, pack_file, store)
    m.xpackfs()  # fills the digest store if needed
    startup = m.xpackfs()
    # The first tables compare like with like: page-cache mode, the source read buffered (as minipass
    # does), the kernel's readahead, 8 threads.
    m.xpackfs(",direct_io=off,source_io=buffered,read_ahead_kb=128,threads=8")
    m.minipass()
    targets = {"source": pack_file, "minipass": m.mm / "file", "xpackfs": m.mx / pack_file.name}
    seq(pack_file, layout)  # both sources in the page cache: the file minipass serves,
    subprocess.run(["cat", str(src)], stdout=subprocess.DEVNULL, check=True)  # and the GGUF xpackfs reads
    rows, dio_rows, ra_rows, lever_rows = [], [], [], []
    try:
        pids = {"minipass": m.mpid(), "xpackfs": m.xpid()}
        for name, fn in PATTERNS:
            for state in ("cold", "warm"):
                rows.append((name, state, median_rates(targets, fn, layout, state == "cold", a.rounds, pids, (name, state))))
        rss = rss_kb(m.xpid())
        # FOPEN_DIRECT_IO on both (xpackfs -o direct_io=on, its default for the pack until the pack
        # moved into the mount's page cache; minipass --direct-io).
        m.xpackfs(",direct_io=on,threads=8")
        m.minipass("--direct-io")
        for name, fn in PATTERNS:
            if name == "mmap touch":
                continue  # minipass does not negotiate FUSE_DIRECT_IO_ALLOW_MMAP
            for state in ("cold", "warm"):
                dio_rows.append((name, state, median_rates(targets, fn, layout, state == "cold", a.rounds)))
        m.xpackfs(",direct_io=off,source_io=buffered,read_ahead_kb=128,threads=8")
        m.minipass()
        # Readahead of the mount (root may set it in /sys/class/bdi): cold 1 MiB sequential.
        fuse = {k: v for k, v in targets.items() if k != "source"}
        for kb in (128, 1024, 4096, 16384):
            set_read_ahead(m.mx, kb)
            set_read_ahead(m.mm, kb)
            ra_rows.append((kb, median_rates(fuse, seq, layout, True, a.rounds)))
        set_read_ahead(m.mm, 128)
        # Other levers, on xpackfs alone (default readahead), against its default settings.
        only_x = {"xpackfs": targets["xpackfs"]}
        pc = "direct_io=off,source_io=buffered,read_ahead_kb=128,threads=8"
        for label, o in [("page cache, 8 threads, clone_fd", pc), ("threads=1", pc + ",threads=1"),
                         ("threads=2", pc + ",threads=2"), ("threads=32", pc + ",threads=32"),
                         ("clone_fd=off", pc + ",clone_fd=off"), ("max_read=131072", pc + ",max_read=131072"),
                         ("max_background=64", pc + ",max_background=64"), ("direct_io, 8 threads", "direct_io=on,threads=8"),
                         ("direct_io, 2 threads", "direct_io=on,threads=2"), ("xpackfs defaults", "")]:
            m.xpackfs("," + o if o else "")
            r = {pat: median_rates(only_x, fn, layout, True, a.rounds)["xpackfs"]
                 for pat, fn in PATTERNS if pat in ("seq 1MiB", "sglang 4x", "random objects")}
            lever_rows.append((label, r))
    finally:
        m.close()

    print(f"pack {pack_file.stat().st_size / 1e9:.2f} GB, {layout['objects']} objects of {layout['payload'] / 1e6:.1f} MB; "
          f"medians of {a.rounds} runs; default readahead (128 KiB)")
    print("page-cache mode on both FUSE mounts, 8 threads each (xpackfs -o direct_io=off,source_io=buffered,read_ahead_kb=128,threads=8; minipass default)")
    print(f"{'pattern':<16} {'state':<5} {'source':>8} {'minipass':>9} {'xpackfs':>8} {'x/minipass':>11} {'x/source':>9}  (MB/s)")
    for name, state, r in rows:
        print(f"{name:<16} {state:<5} {r['source']:>8.0f} {r['minipass']:>9.0f} {r['xpackfs']:>8.0f} "
              f"{r['xpackfs'] / r['minipass']:>11.2f} {r['xpackfs'] / r['source']:>9.2f}")
    print("\ndaemon CPU seconds per GB read, cold (median): the transport's cost and what xpackfs adds to it")
    print(f"{'pattern':<16} {'minipass':>9} {'xpackfs':>8}")
    for name, _ in PATTERNS:
        print(f"{name:<16} {CPU[(name, 'cold', 'minipass')]:>9.2f} {CPU[(name, 'cold', 'xpackfs')]:>8.2f}")
    default = {(n, st): r["minipass"] for n, st, r in rows}
    print("\nFOPEN_DIRECT_IO on both FUSE mounts (xpackfs -o direct_io=on,threads=8; minipass --direct-io); "
          "x/mp default = against minipass in page-cache mode")
    print(f"{'pattern':<16} {'state':<5} {'source':>8} {'minipass':>9} {'xpackfs':>8} {'x/minipass':>11} {'x/mp default':>13} {'x/source':>9}")
    for name, state, r in dio_rows:
        print(f"{name:<16} {state:<5} {r['source']:>8.0f} {r['minipass']:>9.0f} {r['xpackfs']:>8.0f} "
              f"{r['xpackfs'] / r['minipass']:>11.2f} {r['xpackfs'] / default[(name, state)]:>13.2f} {r['xpackfs'] / r['source']:>9.2f}")
    base = ra_rows[0][1]["minipass"]
    print("\ncold 1 MiB sequential by mount readahead (read_ahead_kb, both FUSE mounts, page-cache mode)")
    print(f"{'read_ahead_kb':>13} {'minipass':>9} {'xpackfs':>8} {'x/minipass':>11} {'x/minipass@128':>15}")
    for kb, r in ra_rows:
        print(f"{kb:>13} {r['minipass']:>9.0f} {r['xpackfs']:>8.0f} {r['xpackfs'] / r['minipass']:>11.2f} {r['xpackfs'] / base:>15.2f}")
    print(f"\nxpackfs levers, cold (MB/s; ratio to page-cache mode with 8 threads); defaults here: direct_io=auto, "
          f"threads={min(max(os.cpu_count() or 8, 2), 8)}")
    d = lever_rows[0][1]
    print(f"{'setting':<32} " + " ".join(f"{p:>22}" for p in d))
    for label, r in lever_rows:
        print(f"{label:<32} " + " ".join(f"{r[p]:>13.0f} ({r[p] / d[p]:4.2f}x)" for p in d))
    mp_default = {n: r["minipass"] for n, st, r in rows if st == "cold"}
    xd = lever_rows[-1][1]
    print("xpackfs defaults against minipass's default, cold: "
          + ", ".join(f"{p} {xd[p] / mp_default[p]:.2f}x" for p in xd))
    print(f"\nxpackfs mount start-up (digests remembered): {startup:.3f} s; daemon RSS after the run: {rss / 1024:.0f} MiB")
    if not a.no_computed:
        computed_views(a)
    if a.full_size:
        full_size(a, a.full_size)
    return 0


def full_size(a, path: Path) -> None:
    """Start-up and RSS for a full-size sparse GGUF (headers only are read; digests remembered
    in a store kept next to it: the first run hashes the sparse file once)."""
    store = Path(str(path) + ".digests")
    mnt = a.workdir / "mnt-full"
    mnt.mkdir(exist_ok=True)
    subprocess.run(["umount", str(mnt)], stderr=subprocess.DEVNULL)
    o = f"digest_store={store}"
    subprocess.run([a.xpackfs, "mount", str(path), str(mnt), "-o", o], check=True, stderr=subprocess.DEVNULL)
    subprocess.run(["umount", str(mnt)], check=True)
    subprocess.run(["sync"], check=True)  # nobody else's writeback in the timing
    times = []
    for _ in range(3):
        # Cold page cache for what start-up reads: the source's headers and the store entry.
        for p in [path, *store.glob("*.json")]:
            drop(p)
        t0 = time.perf_counter()
        subprocess.run([a.xpackfs, "mount", str(path), str(mnt), "-o", o], check=True, stderr=subprocess.DEVNULL)
        times.append(time.perf_counter() - t0)
        pid = int(subprocess.run(["pgrep", "-f", f"xpackfs mount {path} {mnt}"], capture_output=True, text=True).stdout.split()[0])
        rss = rss_kb(pid)
        files = {p.name: p.stat().st_size for p in mnt.iterdir()}
        subprocess.run(["umount", str(mnt)], check=True)
    print(f"full-size {path.name} ({path.stat().st_size / 1e9:.0f} GB sparse): start-up {statistics.median(times):.3f} s "
          f"(median of 3, cold page cache), daemon RSS {rss / 1024:.0f} MiB; serves {files}")


def computed_views(a) -> None:
    """The computed views against their peers, cold and warm (each tool prints its own lines)."""
    print("\ncomputed views (same cores; peers: numpy implementations of the same conversion, the fourth seed)")
    runs = [["tools/bench/bench_bf16.py"], ["tools/bench/bench_int8.py"], ["tools/bench/bench_disk_cache.py", "--rounds", str(a.rounds)]]
    if os.environ.get("XPACKFS_GGML_LIB"):
        runs.append(["tools/bench/bench_requant.py"])
    else:
        print("  (requant: set XPACKFS_GGML_LIB=$(bash tools/build_ggml_ref.sh) to run the fourth seed as its peer)")
    for r in runs:
        out = subprocess.run([sys.executable, str(REPO / r[0]), *r[1:]], check=True, capture_output=True, text=True).stdout
        print(f"  {r[0]}:")
        for line in out.strip().splitlines():
            print(f"    {line}")


if __name__ == "__main__":
    sys.exit(main())
