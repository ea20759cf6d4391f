#!/usr/bin/env python3
"""Remote reads under one memory budget (issue 25): 64 handles reading 64 objects at once through one xpackfs
daemon, its resident memory against `remote_memory_mb`.

Starts its own `s3s-fs` server (as tools/bench/bench_remote.py does), writes a valid kt-kernel INT8 tree of 66 quant files
of 16 MiB (random bytes, sha256 in the manifest) plus their scale files, uploads it through the S3 API to the root
of a bucket of its own, mounts `s3://int8/` (an INT8 tree mount: every file is one object, served whole) with
`-o remote_memory_mb=M,remote_part_mb=P`, and reads 64 of the quant files at once, one thread each, 1 MiB per read,
while sampling the daemon's VmRSS every 10 ms. Checks the bytes against the local files and reports the peak
RSS (and VmHWM) against the target `remote_memory_mb + 128 MiB`, with the parts tier's counters (the mount has
`stats=on`), and the time against curl downloading the same objects from the same server, as many ranged GETs
at once as there are readers, in ranges of the part size.

    sudo python3 tools/bench/bench_remote_rss.py [--memory-mb 128] [--part-mb 2] [--readers 64] [--json out.json]
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_remote as br  # noqa: E402

MIB = 1 << 20
TREE_BUCKET = "int8"
LAYOUT = "kt-int8-n32-k64-vnni-v1"


def write_tree(root: Path, experts: int, hidden: int, inter: int) -> list[Path]:
    """A valid schema-2 INT8 tree of one layer, one NUMA part; returns the quant files."""
    d = root / "_layer_0" / "_numa_0"
    d.mkdir(parents=True, exist_ok=True)
    sizes = {"quant": hidden * inter, "scale": inter * 4, "down-scale": hidden * 4}
    rng = random.Random(25)
    files, quants, total = [], [], 0
    for proj in ("gate", "up", "down"):
        for e in range(experts):
            for kind in ("quant", "scale"):
                size = sizes["down-scale" if (proj, kind) == ("down", "scale") else kind]
                name = f"INT8_{proj}_{e}_{size}Byte_{kind}_.kt"
                data = rng.randbytes(size)
                (d / name).write_bytes(data)
                files.append({"path": f"_layer_0/_numa_0/{name}", "size_bytes": size, "sha256": hashlib.sha256(data).hexdigest()})
                total += size
                if kind == "quant":
                    quants.append(d / name)
    m = {"schema_version": 2, "state": "ready", "expert_weight_format": "int8", "threadpool_count": 1, "expert_num": experts,
         "hidden_size": hidden, "intermediate_size": inter, "layout": LAYOUT, "backend": "int8", "bytes": total,
         "layers": [{"index": 0, "numa_count": 1, "state": "ready", "files": files, "bytes": total}]}
    (root / "kt-weight-manifest.json").write_text(json.dumps(m))
    return quants


def daemon_pid(mnt: Path) -> int:
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            cmd = (p / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if cmd and cmd[0].endswith(b"xpackfs") and str(mnt).encode() in cmd:
            return int(p.name)
    raise SystemExit(f"no xpackfs daemon for {mnt}")


def status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--memory-mb", type=int, default=128)
    ap.add_argument("--part-mb", type=int, default=2)
    ap.add_argument("--readers", type=int, default=64)
    ap.add_argument("--xpackfs", default=str(br.REPO / "target/release/xpackfs"))
    ap.add_argument("--s3s-fs", default=None)
    ap.add_argument("--s3s-target", default=str(Path(tempfile.gettempdir()) / "s3s-target"))
    ap.add_argument("--json", default=None)
    ap.add_argument("--opts", default="", help="more mount options (comma-separated), e.g. max_background=64")
    a = ap.parse_args()
    signal.signal(signal.SIGINT, br._on_signal)
    signal.signal(signal.SIGTERM, br._on_signal)
    try:
        with tempfile.TemporaryDirectory(prefix="xpackfs-rss-") as tmp:
            tmp = Path(tmp)
            tree = tmp / "tree"
            experts = (a.readers + 2) // 3
            quants = write_tree(tree, experts, 2048, 8192)
            exe = br.s3s_binary(a)
            data = tmp / "s3"
            (data / TREE_BUCKET).mkdir(parents=True)
            endpoint = br.start_s3s(exe, data)
            s3 = br.s3_client(endpoint)
            for f in sorted(tree.rglob("*")):
                if f.is_file():
                    br.upload(s3, f, f.relative_to(tree).as_posix(), TREE_BUCKET)
            mnt = tmp / "mnt"
            env = br.xenv(tmp / "digests")
            # stats=on: an INT8 tree's root holds nothing else by default; the counters are wanted here.
            opts = f"endpoint={endpoint},remote_memory_mb={a.memory_mb},remote_part_mb={a.part_mb},stats=on" + (f",{a.opts}" if a.opts else "")
            br.mount(a, f"s3://{TREE_BUCKET}/", mnt, opts, env)
            pid = daemon_pid(mnt)
            rss_before = status_kib(pid, "VmRSS")
            peak = [rss_before]
            stop = threading.Event()

            def sample():
                while not stop.is_set():
                    try:
                        peak[0] = max(peak[0], status_kib(pid, "VmRSS"))
                    except OSError:
                        return
                    time.sleep(0.01)

            sampler = threading.Thread(target=sample)
            sampler.start()
            bad: list[str] = []
            chosen = quants[: a.readers]

            def read(local: Path):
                served = mnt / local.relative_to(tree)
                with open(served, "rb", buffering=0) as f, open(local, "rb") as g:
                    while True:
                        b = f.read(MIB)
                        if not b:
                            break
                        if b != g.read(len(b)):
                            bad.append(str(served))
                            return

            # The daemon's page cache is dropped; the server's files are read back in, as bench_remote.py does, so
            # the time is the network path's, not 64 cold files read from this disk at once by the server.
            br.drop_caches()
            br.warm([data / TREE_BUCKET / q.relative_to(tree) for q in chosen])
            t0 = time.perf_counter()
            threads = [threading.Thread(target=read, args=(q,)) for q in chosen]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            seconds = time.perf_counter() - t0
            stop.set()
            sampler.join()
            hwm = status_kib(pid, "VmHWM")
            remote = br.stats_remote(mnt)
            br.unmount(mnt)
            read_bytes = sum(q.stat().st_size for q in chosen)
            # The baseline: the same objects downloaded by curl, as many ranged GETs at once as there are readers, in
            # ranges of the part size (one range of each object at a time), the server's files still warm.
            objs = [(q.relative_to(tree).as_posix(), q.stat().st_size) for q in chosen]
            curl_s = br.curl_download_many(endpoint, TREE_BUCKET, objs, a.part_mb * MIB, len(chosen), tmp)
            target_kib = (a.memory_mb + 128) * 1024
            out = {"readers": len(chosen), "objects_bytes": read_bytes, "seconds": seconds, "memory_mb": a.memory_mb,
                   "part_mb": a.part_mb, "rss_before_mib": rss_before / 1024, "rss_peak_mib": peak[0] / 1024,
                   "vm_hwm_mib": hwm / 1024, "target_mib": target_kib / 1024, "met": hwm <= target_kib, "wrong_files": bad,
                   "curl_seconds": curl_s, "vs_curl": curl_s / seconds, "remote": remote}
            print(f"{len(chosen)} handles x {read_bytes // len(chosen) // MIB} MiB objects in {seconds:.2f} s "
                  f"(curl --parallel {len(chosen)} in {a.part_mb} MiB ranges: {curl_s:.2f} s, {curl_s / seconds:.2f}x): daemon RSS "
                  f"before {rss_before / 1024:.0f} MiB, peak {peak[0] / 1024:.0f} MiB (VmHWM {hwm / 1024:.0f} MiB); "
                  f"target remote_memory_mb {a.memory_mb} + 128 = {target_kib / 1024:.0f} MiB: "
                  f"{'met' if out['met'] else 'MISSED'}; parts: {json.dumps(remote.get('parts', {}))}")
            if a.json:
                Path(a.json).write_text(json.dumps(out, indent=1))
            if bad:
                print(f"WRONG BYTES in {len(bad)} files: {bad[:3]}", file=sys.stderr)
                return 1
            return 0
    finally:
        br.cleanup()


if __name__ == "__main__":
    sys.exit(main())
