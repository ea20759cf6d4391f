#!/usr/bin/env python3
"""Where the CPU goes in a cold remote read (issue 25): the S3 server's CPU-seconds per GB served, its context
switches, and the xpackfs daemon's CPU-seconds, for each client of the same object from the same server.

    sudo python3 tools/bench/bench_remote_cpu.py [--xpackfs BIN] [--rounds 3] [--clients curl16 curl16@0.35 x16 ...]

One `s3s-fs` server (as tools/bench/bench_remote.py starts it), the bench GGUF uploaded and its digests stored once.
Each round runs every client in turn, the page cache dropped and the server's files read back in before each:

  curlN        `curl --parallel N` of the whole object in 8 MiB SigV4 ranges, bodies discarded (the baseline)
  curlN@D      the same with a CPU load beside it: a process busy for fraction D of every 10 ms (D=0.35 is about the
               CPU a cold pack read costs the daemon here), to see what a client's own CPU costs the server
  xN           a fresh xpackfs mount of s3:// with remote_concurrency=N and a cold `cat` of the expert pack
  xN+k=v,...   the same with more -o options (e.g. x16+direct_io=off,max_read=1048576)

This machine runs the server, the client and the reader on the same two cores. The server (s3s-fs reads every
body in 4 KiB reads on tokio's blocking pool) needed 2.8-3.4 CPU-seconds per GB sent with curl here, so whatever
CPU the client side spends is taken from it, and it then needs more per GB (more preemption): the @D clients
measure that effect without xpackfs. Per GB is per GB the server sent (the object for curl, stats.json's remote
bytes for a mount). Context switches are summed over the server's threads alive at both ends of a measure (a
thread that exits meanwhile takes its count with it: a rough figure). "machine" is every core's busy time over the
same span (/proc/stat) per GB sent, and the share of it the cores were idle: with curl it is the server, curl and the
kernel; with a mount, the server, the daemon, `cat` and the kernel. Prints one line per client per round and the
medians. The pack is hashed by one mount before the rounds (the first mount of a view hashes it, streaming the
object into memory, where the read that follows in the same process found half of it: stop 43's first x16 rounds
read 0.455 of 0.894 GB from the network, at 0.55-0.64 GB/s).
"""
from __future__ import annotations

import argparse
import atexit
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_remote as br  # noqa: E402
from bench_common import REPO, bench_gguf  # noqa: E402

HOG = """
import sys, time
duty = float(sys.argv[1])
while True:
    t = time.perf_counter()
    while time.perf_counter() - t < 0.01 * duty:
        pass
    time.sleep(0.01 * (1 - duty))
"""


def cpu_seconds(pid: int) -> float:
    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def machine_cpu() -> tuple[float, float]:
    """The machine's busy and idle CPU-seconds so far (all cores; iowait counts as idle)."""
    f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = f[3] + f[4]
    return (sum(f[:8]) - idle) / os.sysconf("SC_CLK_TCK"), idle / os.sysconf("SC_CLK_TCK")


def context_switches(pid: int) -> int:
    total = 0
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            for line in Path(f"/proc/{pid}/task/{t}/status").read_text().splitlines():
                if "ctxt_switches" in line:
                    total += int(line.split()[1])
        except FileNotFoundError:
            pass  # a thread that ended meanwhile
    return total


def daemon_pid(mnt: Path) -> int:
    # The newest xpackfs process serving this mount point.
    out = subprocess.run(["pgrep", "-n", "-f", f"xpackfs.* {mnt}"], capture_output=True, text=True).stdout.split()
    if not out:
        raise SystemExit(f"no xpackfs process serves {mnt}")
    return int(out[0])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--xpackfs", default=str(REPO / "target/release/xpackfs"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--clients", nargs="+", default=["curl16", "curl16@0.35", "x16"])
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/xpackfs-bench"))
    ap.add_argument("--s3s-fs", default=None)
    ap.add_argument("--s3s-target", default="/tmp/s3s-target")
    a = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("needs root (drop_caches, FUSE mounts)")
    clients = a.clients
    for c in clients:
        kind, n = (c[:4], c[4:].partition("@")[0]) if c.startswith("curl") else (c[:1], c[1:].partition("+")[0])
        if kind not in ("curl", "x") or not n.isdigit():
            raise SystemExit(f"unknown client {c!r} (curlN, curlN@D, xN, xN+k=v,...)")
    atexit.register(br.cleanup)
    signal.signal(signal.SIGTERM, br._on_signal)
    signal.signal(signal.SIGINT, br._on_signal)
    gguf = bench_gguf(a.workdir, hidden=2048, ff=1024)
    exe = br.s3s_binary(a)
    res: dict[str, list[tuple[float, float, int, float]]] = {c: [] for c in clients}
    try:
        with tempfile.TemporaryDirectory(prefix="bench-remote-cpu-") as td:
            tmp = Path(td)
            data = tmp / "s3"
            endpoint = br.start_s3s(exe, data)
            server = br._children[-1].pid
            key = "model.gguf"
            size = br.upload(br.s3_client(endpoint), gguf, key)["size"]
            served = [data / br.BUCKET / key]
            url = f"s3://{br.BUCKET}/{key}"
            env = br.xenv(tmp / "digests")
            subprocess.run([a.xpackfs, "digest", url, "--endpoint", endpoint], env=env, check=True, capture_output=True)
            mnt = tmp / "mnt"
            # The first mount of the pack hashes it (streaming the object into memory, where a read in the same
            # process then finds half of it): done once here, so every measured mount reads headers only.
            br.mount(a, url, mnt, f"endpoint={endpoint},ro", env)
            br.unmount(mnt)
            for rnd in range(a.rounds):
                for c in clients:
                    br.drop_caches()
                    br.warm(served)
                    daemon = 0.0
                    if c.startswith("curl"):
                        n, _, duty = c[4:].partition("@")
                        hog = subprocess.Popen([sys.executable, "-c", HOG, duty]) if duty else None
                        s0, k0 = cpu_seconds(server), context_switches(server)
                        m0 = machine_cpu()
                        try:
                            seconds = br.curl_download(endpoint, key, size, 8 << 20, int(n), tmp)
                        finally:
                            if hog:
                                hog.kill()
                                hog.wait()
                        nbytes = sent = size
                    else:
                        n, _, more = c[1:].partition("+")
                        br.mount(a, url, mnt, f"endpoint={endpoint},ro,remote_concurrency={n}" + (f",{more}" if more else ""),
                                 env)
                        try:
                            pid = daemon_pid(mnt)
                            b0 = br.stats_remote(mnt).get("bytes", 0)  # the mount's header reads
                            s0, k0, d0 = cpu_seconds(server), context_switches(server), cpu_seconds(pid)
                            m0 = machine_cpu()
                            nbytes, seconds = br.read_files(br.view_files(mnt, (".pack",)))
                            daemon = cpu_seconds(pid) - d0
                            sent = (br.stats_remote(mnt).get("bytes", 0) - b0) or nbytes
                        finally:
                            br.unmount(mnt)
                    m1 = machine_cpu()
                    busy, idle = m1[0] - m0[0], m1[1] - m0[1]
                    per_gb = (cpu_seconds(server) - s0) / sent * 1e9
                    switches = context_switches(server) - k0
                    res[c].append((nbytes / seconds / 1e9, per_gb, switches, daemon, busy / sent * 1e9, idle / (busy + idle)))
                    print(f"round {rnd + 1} {c:18s} {nbytes / seconds / 1e9:.3f} GB/s  server {per_gb:.2f} CPU-s/GB, "
                          f"{switches} context switches  daemon {daemon:.2f} CPU-s  machine {busy / sent * 1e9:.2f} CPU-s/GB, "
                          f"{idle / (busy + idle):.0%} idle, {sent / 1e9:.3f} GB sent", flush=True)
    finally:
        br.cleanup()
    print(f"medians of {a.rounds} rounds:")
    for c, v in res.items():
        med = [statistics.median(x[i] for x in v) for i in range(6)]
        print(f"  {c:18s} {med[0]:.3f} GB/s  server {med[1]:.2f} CPU-s/GB, {med[2]:.0f} context switches  "
              f"daemon {med[3]:.2f} CPU-s  machine {med[4]:.2f} CPU-s/GB, {med[5]:.0%} idle")
    return 0


if __name__ == "__main__":
    sys.exit(main())
