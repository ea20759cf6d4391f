#!/usr/bin/env python3
"""Cold reads of the expert pack over `s3://`, two xpackfs builds alternated (issue 25's A/B).

    sudo python3 tools/bench/bench_remote_ab.py --xpackfs NEW --baseline OLD [--rounds 6] [--mount-opts k=v,...]

One `s3s-fs` server (as tools/bench/bench_remote.py starts it), the bench GGUF uploaded once and its digests
stored once (so a mount reads headers only). Each round: `curl --parallel 16` with 8 MiB ranges (the baseline
download), then for each build, in alternating order, page cache dropped and the server's files read back in, a
fresh mount and a cold `cat` of the pack. Reports the median seconds per side, each against curl's median (as a ratio
of throughputs, the pack's bytes against the whole object's, and of seconds: stop 40-42's figures were the latter), the
ratio of the two builds, and per read the window resets, reads without a stream and requests.
bench_remote.py measures one build against the baseline; this one puts two builds side by side in the same
rounds, since a round's baseline moves as much as a change does on this machine.
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_remote as br  # noqa: E402
from bench_common import bench_gguf  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--xpackfs", default=str(REPO / "target/release/xpackfs"))
    ap.add_argument("--baseline", required=True, help="the other xpackfs build")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/xpackfs-bench"))
    ap.add_argument("--mount-opts", default="")
    ap.add_argument("--s3s-fs", default=None)
    ap.add_argument("--s3s-target", default="/tmp/s3s-target")
    a = ap.parse_args()
    builds = [("xpackfs", a.xpackfs), ("baseline", a.baseline)]
    pack_bytes = 0
    gguf = bench_gguf(a.workdir, hidden=2048, ff=1024)
    exe = br.s3s_binary(a)
    try:
        with tempfile.TemporaryDirectory(prefix="xpackfs-ab-") as td:
            tmp = Path(td)
            data = tmp / "s3"
            endpoint = br.start_s3s(exe, data)
            key = "model.gguf"
            size = br.upload(br.s3_client(endpoint), gguf, key)["size"]
            served = [data / br.BUCKET / key]
            url = f"s3://{br.BUCKET}/{key}"
            env = br.xenv(tmp / "digests")
            eo = f"endpoint={endpoint}" + (f",{a.mount_opts}" if a.mount_opts else "")
            r = subprocess.run([a.xpackfs, "digest", url, "--endpoint", endpoint], env=env, capture_output=True, text=True)
            if r.returncode != 0:
                raise SystemExit(f"digest {url}: {r.stderr[-2000:]}")
            mnt = tmp / "mnt"
            # The first mount of each build hashes the pack once (then the digest store has it).
            for _, x in builds:
                a.xpackfs = x
                br.mount(a, url, mnt, f"{eo},ro", env)
                br.unmount(mnt)
            secs: dict[str, list[float]] = {n: [] for n, _ in builds}
            secs["curl"] = []
            stats: dict[str, list[tuple]] = {n: [] for n, _ in builds}
            for i in range(a.rounds):
                br.drop_caches()
                br.warm(served)
                secs["curl"].append(br.curl_download(endpoint, key, size, 8 << 20, 16, tmp))
                for n, x in builds if i % 2 == 0 else builds[::-1]:
                    a.xpackfs = x
                    br.drop_caches()
                    br.warm(served)
                    br.mount(a, url, mnt, f"{eo},ro", env)
                    pack_bytes, dt = br.read_files(br.view_files(mnt, (".pack",)))
                    secs[n].append(dt)
                    s = br.stats_remote(mnt)
                    p = s.get("parts", {})
                    stats[n].append((p.get("window_resets"), p.get("direct_reads"), s.get("requests")))
                    br.unmount(mnt)
                print(f"round {i + 1}/{a.rounds}: " + ", ".join(f"{n} {v[-1]:.2f} s" for n, v in secs.items()), flush=True)
            med = {n: statistics.median(v) for n, v in secs.items()}
            print(f"cold cat of the pack ({pack_bytes / 1e6:.1f} MB) over s3://, medians of {a.rounds} alternated rounds; "
                  f"curl downloads the whole object ({size / 1e6:.1f} MB): `x curl` is the ratio of throughputs (GB/s), "
                  "`time` of seconds")
            for n, v in secs.items():
                nbytes = size if n == "curl" else pack_bytes
                rate = (nbytes / med[n]) / (size / med["curl"])
                print(f"  {n:<9} {med[n]:6.3f} s  {nbytes / med[n] / 1e9:.3f} GB/s  {rate:.3f}x curl  "
                      f"(time {med['curl'] / med[n]:.3f})  (runs {' '.join(f'{x:.2f}' for x in v)})")
            print(f"  xpackfs / baseline time: {med['xpackfs'] / med['baseline']:.3f}")
            for n, _ in builds:
                print(f"  {n}: (window resets, reads without a stream, requests) per read: {stats[n]}")
    finally:
        br.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
