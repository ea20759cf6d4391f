#!/usr/bin/env python3
"""Which copy the page cache holds for buffered readers of the expert pack (issue 23's "cache
the view, not the source"): each mount mode against its peers, in one run.

    flock /tmp/xpackfs-quiet.lock python3 tools/bench/bench_view_cache.py [--rounds 3]
        [--modes 'default;direct_io=on'] [--kimi] [--xpackfs PATH]

For each mode (extra `-o` options; `default` = none), medians of --rounds:
- warm re-read: a second sequential pass of 1 MiB reads over the pack through the mount, its
  page cache as the first pass left it, against the same pass over the source GGUF from its
  page cache (the target is >= 0.9x); and the third pass of each (the first re-read of a
  page also moves it to the active LRU list, which costs more per page for the mount's
  4 KiB pages than for the source's large folios);
- cold read: the first pass after `echo 3 > /proc/sys/vm/drop_caches` (run as root), against
  the same pass over a local copy of the pack on the same disk, also dropped;
- residue: the source GGUF's pages in the page cache after that cold pass (fincore; the
  target is <= 10%), and the pack's pages on the mount;
- with --kimi: SGLang's Kimi validator (`validate_ggml_moe_pack`, tools/peers/run_sglang_kimi.py
  validate --payload-samples 0, which reads the 247,296-entry index 152 bytes per unbuffered
  read) over the
  kimi-pack view of the full-size sparse set, against a local file with the same bytes up
  to the end of the index and a hole after it (the validator reads nothing else); the target
  is within 2x.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools/bench"))
from bench_common import bench_gguf  # noqa: E402


def drop_caches() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def seq_rate(path: Path) -> float:
    """MB/s of one sequential pass of 1 MiB buffered reads."""
    fd = os.open(path, os.O_RDONLY)
    buf = bytearray(1 << 20)
    total = off = 0
    t0 = time.perf_counter()
    while (n := os.preadv(fd, [buf], off)) > 0:
        total += n
        off += n
    t = time.perf_counter() - t0
    os.close(fd)
    return total / t / 1e6


def resident_pct(path: Path) -> float:
    out = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES", str(path)], capture_output=True,
                         text=True, check=True).stdout
    return 100.0 * int(out.strip() or 0) / max(1, path.stat().st_size)


def mount(xpackfs: str, src: Path, mnt: Path, opts: str) -> None:
    subprocess.run(["umount", str(mnt)], stderr=subprocess.DEVNULL)
    subprocess.run([xpackfs, "mount", str(src), str(mnt), "-o", opts], check=True, stderr=subprocess.DEVNULL)


def umount(mnt: Path) -> None:
    subprocess.run(["umount", str(mnt)], check=True)


def pack_section(a, modes: list[str]) -> None:
    src = bench_gguf(a.workdir)
    store = a.workdir / "store-view-cache"
    mnt = a.workdir / "mnt-view-cache"
    mnt.mkdir(exist_ok=True)
    local = a.workdir / "view-cache-local.pack"
    mount(a.xpackfs, src, mnt, f"digest_store={store}")
    pack_name = next(p.name for p in mnt.iterdir() if p.name.endswith(".pack"))
    if not local.exists() or local.stat().st_size != (mnt / pack_name).stat().st_size:
        subprocess.run(["cp", str(mnt / pack_name), str(local)], check=True)
    umount(mnt)
    print(f"source {src.name}: {src.stat().st_size / 1e6:.0f} MB; pack {local.stat().st_size / 1e6:.0f} MB; "
          f"medians of {a.rounds} rounds")
    rows = {m: {"warm": [], "src_warm": [], "warm3": [], "src_warm3": [], "cold": [], "local_cold": [], "residue": [], "mount_cached": []} for m in modes}
    for _ in range(a.rounds):
        for m in modes:
            r = rows[m]
            opts = f"digest_store={store}" + ("" if m == "default" else "," + m)
            mount(a.xpackfs, src, mnt, opts)
            pack = mnt / pack_name
            drop_caches()
            r["local_cold"].append(seq_rate(local))
            drop_caches()
            r["cold"].append(seq_rate(pack))
            r["residue"].append(resident_pct(src))
            r["mount_cached"].append(resident_pct(pack))
            r["warm"].append(seq_rate(pack))
            seq_rate(pack)
            r["warm3"].append(seq_rate(pack))
            seq_rate(src)
            r["src_warm"].append(seq_rate(src))
            seq_rate(src)
            r["src_warm3"].append(seq_rate(src))
            umount(mnt)
    med = {m: {k: statistics.median(v) for k, v in rows[m].items()} for m in modes}
    print(f"{'mode':36s} {'warm re-read MB/s':>18s} {'vs source cache':>15s} {'3rd re-read':>12s} {'vs source':>10s} "
          f"{'cold MB/s':>10s} {'vs local':>9s} {'source residue':>15s} {'pack cached':>12s}")
    for m in modes:
        d = med[m]
        print(f"{m:36s} {d['warm']:18.0f} {d['warm'] / d['src_warm']:14.2f}x {d['warm3']:12.0f} {d['warm3'] / d['src_warm3']:9.2f}x "
              f"{d['cold']:10.0f} {d['cold'] / d['local_cold']:8.2f}x {d['residue']:14.0f}% {d['mount_cached']:11.0f}%")
    print(json.dumps({"pack": med}, indent=None))


def kimi_section(a, modes: list[str]) -> None:
    with tempfile.TemporaryDirectory(dir=a.workdir) as tmp:
        tmp = Path(tmp)
        shards = tmp / "kimi"
        subprocess.run([sys.executable, str(REPO / "tools/fixtures/make_kimi_fixture.py"), str(shards), "--full-size"],
                       check=True, stdout=subprocess.DEVNULL)
        mnt = tmp / "mnt"
        mnt.mkdir()
        config = shards / "config.json"
        gguf = shards / "gguf"
        first = sorted(gguf.glob("*.gguf"))[0]
        base = f"view=kimi-pack,model_config={config},tokenizer_dir={shards / 'tokenizer'},digest_store={tmp / 'store'}"
        mount(a.xpackfs, first, mnt, base)
        pack_name = next(p.name for p in mnt.iterdir() if p.name.endswith(".pack"))
        # The bytes up to the end of the index (the header says where the payload starts),
        # then a hole: what the validator reads, at the pack's size.
        with open(mnt / pack_name, "rb") as f:
            head = struct.unpack("<16sIIQQ", f.read(40))[4]  # SGLang's PACK_HEADER: data_start last
        local = tmp / "local.pack"
        with open(mnt / pack_name, "rb") as f, open(local, "wb") as out:
            out.write(f.read(head))
            out.truncate((mnt / pack_name).stat().st_size)
        umount(mnt)

        def validate(pack: Path) -> float:
            t0 = time.perf_counter()
            subprocess.run([sys.executable, str(REPO / "tools/peers/run_sglang_kimi.py"), "validate", "--gguf-dir",
                            str(gguf), "--config", str(config), "--pack", str(pack), "--payload-samples", "0"], check=True,
                           stdout=subprocess.DEVNULL)
            return time.perf_counter() - t0

        times = {m: [] for m in modes}
        local_times = []
        for _ in range(a.rounds):
            drop_caches()
            local_times.append(validate(local))
            for m in modes:
                mount(a.xpackfs, first, mnt, base + ("" if m == "default" else "," + m))
                times[m].append(validate(mnt / pack_name))
                umount(mnt)
        lt = statistics.median(local_times)
        print(f"\nSGLang's Kimi validator (validate_ggml_moe_pack), full-size sparse set; local copy {lt:.2f} s")
        for m in modes:
            t = statistics.median(times[m])
            print(f"{m:36s} {t:8.2f} s  {t / lt:6.2f}x the local copy's time")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/xpackfs-bench"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--modes", default="default;direct_io=on",
                    help="';'-separated extra -o options per mode ('default': none)")
    ap.add_argument("--kimi", action="store_true", help="also SGLang's Kimi validator on the full-size sparse set")
    ap.add_argument("--no-pack", action="store_true", help="skip the expert-pack section")
    ap.add_argument("--xpackfs", default=str(REPO / "target/release/xpackfs"))
    a = ap.parse_args()
    a.workdir.mkdir(parents=True, exist_ok=True)
    modes = [m.strip() for m in a.modes.split(";") if m.strip()]
    if not a.no_pack:
        pack_section(a, modes)
    if a.kimi:
        kimi_section(a, modes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
