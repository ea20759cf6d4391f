#!/usr/bin/env python3
"""Remote reads (issue 25): xpackfs over `s3://` against the fastest plain download of the same object from the
same server, in one run. Starts its own S3 server (the `s3s-fs` crate's, fast enough to measure; moto copies the
whole object per GET), uploads a MoE GGUF and a DeepSeek-V4.1-style safetensors checkpoint through the S3 API
(boto3: the server computes the ETags), then alternates rounds of:

  baseline    the fastest download of the GGUF from that server: `curl --parallel` with 8 MiB SigV4-signed ranges
              (`--aws-sigv4`) at each --parallel level, and a Python client doing the same ranged GETs on
              keep-alive connections from threads; the fastest median of these is the baseline
  pack        `xpackfs mount s3://BUCKET/model.gguf` (-o endpoint=...) and a cold `cat` of the expert pack
  sglang      SGLang's reader (tools/peers/sglang_read.py: O_DIRECT, one read per object, 4 splits) over that mount
  requant     the requant view of the checkpoint, every file read cold, over s3:// and over the local directory
  cached      a second mount of the pack with the disk cache (`disk_cache=`) filled by a first mount that reads the
              pack (a fresh cache directory each round; that mount stays up until its writes behind are done, the
              pack's whole-file entry included), page cache dropped, against reading a local copy of the same pack
              on the same disk (page cache dropped too): as mounts serve it (the pack's file entry handed to the
              kernel, FUSE passthrough), and with `disk_cache_files=off` (through the daemon from the fetched
              parts); the second mounts' network bytes are reported (0 expected)

With --peers (opt-in), each round also measures, in an order that alternates between rounds (and before or after
the xpackfs pack read on alternate rounds):

  mountpoint-s3   a cold `cat` of the GGUF itself through a `mount-s3` mount of the same bucket on the same server,
                  against the baseline and against xpackfs's pack read (throughputs)
  seed            what users do today: the first seed's build (tools/peers/run_seed_expert_pack.py, which hashes the
                  source and runs shared/seeds/sglang_expert_pack_build.py.txt) writing the expert pack to a local
                  directory from the GGUF mounted with s3fs and with mount-s3, the whole build timed, against
                  xpackfs's mount of `s3://` plus its `cat` of the pack (seconds)

and the bytes the server sent in each of these measures and in the xpackfs pack read (an nftables counter on the
server's port: IP packets, so about 0.1% of headers; `nft` needed, else the xpackfs figures come from stats.json
alone). Peers that cannot be had are reported and skipped: `mount-s3` comes from --mount-s3, PATH or
~/.cache/xpackfs/mountpoint-s3/bin (tools/install_mount_s3.py builds it there from a mountpoint-s3 checkout given
as --mount-s3-src: crates.io has no crate with the binary); `s3fs` from PATH, else `apt-get install s3fs` is tried.
mount-s3 runs with AWS_EC2_METADATA_DISABLED=true (no instance-metadata lookups), so at its default throughput
target; s3fs with its defaults. Both mounts are read-only.

With --server-cpus (e.g. 0) the server runs on those CPUs and this tool and everything it starts (downloads,
mounts, readers) on the others, as if the server were a machine of its own (on two cores the client side then has
one, and the daemon sizes its pools to it). By default they share every core, and
the server is CPU-bound: CPU the reader side spends is taken from it (tools/bench/bench_remote_cpu.py measures that).

Before every measure the page cache is dropped (`echo 3 > /proc/sys/vm/drop_caches`) and the server's own files
are read once again, so the server always serves from memory and only the reader side is cold. Mounts start
with a digest store filled once before the rounds (`xpackfs digest`), so a mount reads headers only; the digest
pass itself is timed once and reported. Figures are medians over the rounds (min and max kept in the JSON);
ratios are of throughputs (bytes delivered per second), so the pack (the GGUF's experts) compares with the
whole GGUF's download; the pack's and SGLang's are also given as ratios of seconds (`time_ratios`: how long the
pack takes against how long the GGUF's download takes, higher by the size ratio, 894/856 MB for the bench GGUF).
Also reported: one stream with one request in flight (`python x1`, the first 64 MiB), the network bytes per byte
read (stats.json's `remote` section), the digest pass and the first mount of each view (it hashes the view once),
all before the rounds.

    sudo python3 tools/bench/bench_remote.py [--rounds 3] [--xpackfs target/release/xpackfs] [--json out.json]
        [--layers 8 --experts 32 --hidden 2048 --ff 1024] [--parallel 8,16,32] [--skip-requant] [--mmap]
        [--server-cpus 0]
        [--peers [--mount-s3 PATH | --mount-s3-src CHECKOUT] [--seeds shared/seeds]]

Needs root (drop_caches, FUSE), boto3, curl (else the Python client alone is the baseline) and `s3s-fs`
(installed with `cargo install s3s-fs --version 0.14.1 --features binary --locked` into --s3s-target if it is
not on PATH; later versions need a newer rustc). Servers run in their own process groups and are killed at
exit; mounts are unmounted, also on Ctrl-C or SIGTERM.
"""
from __future__ import annotations

import argparse
import atexit
import http.client
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import REPO, bench_gguf  # noqa: E402

MIB = 1 << 20
BUCKET = "models"
# The V4.1 checkpoint sits at the root of a bucket of its own: s3s-fs stores keys as files, so a prefix is a
# directory, and its HEAD of a directory answers 500 (it tries to hash the directory) where S3 answers 404; a
# bucket root needs no HEAD.
CKPT_BUCKET = "ckpt"
KEY_ID, SECRET = "xpackfsbench", "xpackfsbenchsecret"
REGION = "us-east-1"

_children: list[subprocess.Popen] = []
_mounts: list[Path] = []
_nft_tables: list[str] = []


def cleanup() -> None:
    for m in reversed(_mounts):
        umount(m)
    _mounts.clear()
    for t in _nft_tables:
        subprocess.run(["nft", "delete", "table", "inet", t], stderr=subprocess.DEVNULL)
    _nft_tables.clear()
    for p in reversed(_children):
        try:
            os.killpg(p.pid, signal.SIGTERM)
            p.wait(5)
        except Exception:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except Exception:
                pass
    _children.clear()


def _on_signal(sig, _frame):
    cleanup()
    sys.exit(128 + sig)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def wait_port(port: int, proc: subprocess.Popen, timeout: float = 60) -> None:
    end = time.time() + timeout
    while time.time() < end:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited ({proc.returncode}) before listening on {port}")
        try:
            socket.create_connection(("127.0.0.1", port), 0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"nothing listens on 127.0.0.1:{port} after {timeout:.0f} s")


def drop_caches() -> None:
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def warm(paths: list[Path]) -> None:
    """Read files into the page cache (the server's backing files: it serves from memory in every measure)."""
    for p in paths:
        with open(p, "rb", buffering=0) as f:
            while f.read(16 * MIB):
                pass


def is_mounted(p: Path) -> bool:
    with open("/proc/self/mounts") as f:
        return any(line.split()[1] == str(p) for line in f)


def umount(p: Path) -> None:
    for _ in range(50):
        if not is_mounted(p):
            return
        if subprocess.run(["umount", str(p)], stderr=subprocess.DEVNULL).returncode == 0:
            return
        time.sleep(0.1)
    subprocess.run(["umount", "-l", str(p)], stderr=subprocess.DEVNULL)


# ---- the S3 server ----------------------------------------------------------------------------------------------
def s3s_binary(a) -> str:
    exe = a.s3s_fs or shutil.which("s3s-fs") or str(Path.home() / ".cargo/bin/s3s-fs")
    if Path(exe).exists():
        return exe
    log("s3s-fs not found: cargo install s3s-fs --version 0.14.1 --features binary --locked")
    env = dict(os.environ, CARGO_TARGET_DIR=a.s3s_target)
    subprocess.run(["nice", "cargo", "install", "s3s-fs", "--version", "0.14.1", "--features", "binary", "--locked"],
                   check=True, env=env)
    return str(Path.home() / ".cargo/bin/s3s-fs")


def start_s3s(exe: str, root: Path, cpus: set[int] | None = None) -> str:
    """Start the server on 127.0.0.1; with `cpus`, it runs on those CPUs only (--server-cpus)."""
    port = free_port()
    for b in (BUCKET, CKPT_BUCKET):
        (root / b).mkdir(parents=True, exist_ok=True)
    p = subprocess.Popen([exe, "--host", "127.0.0.1", "--port", str(port), "--access-key", KEY_ID, "--secret-key",
                          SECRET, str(root)], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True,
                         preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None)
    _children.append(p)
    wait_port(port, p)
    return f"http://127.0.0.1:{port}"


def s3_client(endpoint: str):
    import boto3
    from botocore.config import Config

    return boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=KEY_ID, aws_secret_access_key=SECRET,
                        region_name=REGION, config=Config(s3={"addressing_style": "path"},
                                                          request_checksum_calculation="when_required",
                                                          response_checksum_validation="when_required"))


def upload(s3, local: Path, key: str, bucket: str = BUCKET) -> dict:
    from boto3.s3.transfer import TransferConfig

    s3.upload_file(str(local), bucket, key, Config=TransferConfig(multipart_threshold=64 * MIB,
                                                                  multipart_chunksize=64 * MIB, max_concurrency=4))
    h = s3.head_object(Bucket=bucket, Key=key)
    return {"size": h["ContentLength"], "etag": h["ETag"]}


# ---- baseline downloads -----------------------------------------------------------------------------------------
def ranges(size: int, part: int) -> list[tuple[int, int]]:
    return [(o, min(o + part, size) - 1) for o in range(0, size, part)]


def round_robin(objects: list[tuple[str, int]], part: int) -> list[tuple[str, int, int]]:
    per = [[(key, a, b) for a, b in ranges(size, part)] for key, size in objects]
    return [r[i] for i in range(max((len(r) for r in per), default=0)) for r in per if i < len(r)]


def curl_download(endpoint: str, key: str, size: int, part: int, parallel: int, tmp: Path) -> float:
    return curl_download_many(endpoint, BUCKET, [(key, size)], part, parallel, tmp)


def curl_download_many(endpoint: str, bucket: str, objects: list[tuple[str, int]], part: int, parallel: int,
                       tmp: Path) -> float:
    """Every object in `part`-byte ranges, `parallel` at once, bodies discarded. The ranges go round the objects
    (every object's first range, then every object's second, ...): with as many objects as `parallel`, one
    range of each object at a time, as that many readers of one object each would have."""
    cfg = tmp / f"curl-{parallel}.cfg"
    # One operation per range (`next`): curl's --range is per operation, not per URL. s3s (like S3) wants
    # x-amz-content-sha256, which curl 7.88's --aws-sigv4 does not add by itself (it signs it when given).
    with open(cfg, "w") as f:
        f.write("\nnext\n".join(
            f'url = "{endpoint}/{bucket}/{key}"\nrange = "{a}-{b}"\noutput = "/dev/null"\naws-sigv4 = "aws:amz:{REGION}:s3"\n'
            f'user = "{KEY_ID}:{SECRET}"\nheader = "x-amz-content-sha256: UNSIGNED-PAYLOAD"\n'
            f'fail\nsilent\nshow-error\nwrite-out = "%{{size_download}}\\n"\n'
            for key, a, b in round_robin(objects, part)))
    cmd = ["curl", "--parallel", "--parallel-max", str(parallel), "-K", str(cfg)]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True)
    dt = time.perf_counter() - t0
    got = sum(int(x) for x in r.stdout.split())
    size = sum(s for _, s in objects)
    if r.returncode != 0 or got != size:
        raise SystemExit(f"curl --parallel {parallel}: exit {r.returncode}, {got} of {size} bytes: {r.stderr[-500:]}")
    return dt


def python_download(endpoint: str, key: str, size: int, part: int, parallel: int) -> float:
    """Ranged GETs signed with botocore's SigV4, `parallel` threads on keep-alive connections, bodies discarded."""
    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    creds = Credentials(KEY_ID, SECRET)
    host = endpoint.split("://", 1)[1]
    todo = ranges(size, part)
    lock = threading.Lock()
    got = [0]
    errors: list[str] = []

    def worker():
        conn = http.client.HTTPConnection(host, timeout=60)
        buf = bytearray(part)
        view = memoryview(buf)
        while True:
            with lock:
                if not todo or errors:
                    break
                a, b = todo.pop()
            req = AWSRequest(method="GET", url=f"{endpoint}/{BUCKET}/{key}", headers={"Range": f"bytes={a}-{b}"})
            S3SigV4Auth(creds, "s3", REGION).add_auth(req)
            conn.request("GET", f"/{BUCKET}/{key}", headers=dict(req.headers.items()))
            resp = conn.getresponse()
            if resp.status != 206:
                errors.append(f"{resp.status} {resp.read(300)!r}")
                break
            want, n = b + 1 - a, 0
            while n < want:
                k = resp.readinto(view[: want - n])
                if not k:
                    break
                n += k
            with lock:
                got[0] += n
        conn.close()

    t0 = time.perf_counter()
    ts = [threading.Thread(target=worker) for _ in range(parallel)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    dt = time.perf_counter() - t0
    if errors or got[0] != size:
        raise SystemExit(f"python download x{parallel}: {got[0]} of {size} bytes: {errors[:3]}")
    return dt


# ---- xpackfs ----------------------------------------------------------------------------------------------------
def xenv(digests: Path) -> dict:
    return dict(os.environ, AWS_ACCESS_KEY_ID=KEY_ID, AWS_SECRET_ACCESS_KEY=SECRET, AWS_REGION=REGION,
                XPACKFS_DIGEST_STORE=str(digests))


def mount(a, source: str, mnt: Path, opts: str, env: dict) -> float:
    mnt.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    r = subprocess.run([a.xpackfs, "mount", source, str(mnt), "-o", opts], env=env, capture_output=True, text=True)
    dt = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"mount {source}: {r.stderr[-2000:]}")
    _mounts.append(mnt)
    return dt


def unmount(mnt: Path) -> None:
    umount(mnt)
    if mnt in _mounts:
        _mounts.remove(mnt)


def read_files(paths: list[Path]) -> tuple[int, float]:
    """`cat FILE > /dev/null` of each file in turn: bytes and seconds."""
    t0 = time.perf_counter()
    n = 0
    for p in paths:
        subprocess.run(["cat", str(p)], stdout=subprocess.DEVNULL, check=True)
        n += p.stat().st_size
    return n, time.perf_counter() - t0


def mmap_touch(paths: list[Path]) -> tuple[int, float]:
    """`mmap` each file and read one byte per page in order (the kernel's readahead makes the reads): bytes, seconds."""
    import mmap
    t0 = time.perf_counter()
    n = 0
    for p in paths:
        with open(p, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size == 0:
                continue
            with mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as m:
                sum(m[off] for off in range(0, size, mmap.PAGESIZE))
            n += size
    return n, time.perf_counter() - t0


def stats_all(mnt: Path) -> dict:
    try:
        return json.loads((mnt / ".xpackfs/stats.json").read_text())
    except (OSError, ValueError):
        return {}


def stats_remote(mnt: Path) -> dict:
    return stats_all(mnt).get("remote", {})


def settle_file_entries(mnt: Path, timeout: float = 300) -> None:
    """Until the mount has written a whole-file entry and has none left to write behind (as a daemon that stays up
    would); a mount that writes none within the timeout is reported."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout:
        s = stats_all(mnt)
        if s.get("disk_cache", {}).get("file_writes", 0) > 0 and not s.get("passthrough", {}).get("file_entries_pending", 0):
            return
        time.sleep(0.1)
    log(f"{mnt}: no file entry written within {timeout:.0f} s: the cached row reads from the parts")


def view_files(mnt: Path, suffixes: tuple[str, ...]) -> list[Path]:
    return sorted(p for p in mnt.rglob("*") if p.is_file() and p.name.endswith(suffixes) and ".xpackfs" not in p.parts)


# ---- peers (--peers) --------------------------------------------------------------------------------------------
class PeerError(Exception):
    """A peer's mount or read failed: reported, and that measure is left out of the round."""


class ServerBytes:
    """Bytes the server sends (IP packets from its port), from an nftables counter in a table of this process's
    own, deleted at exit. `read()` is None when there is no counter."""

    def __init__(self, port: int):
        self.table = f"xpackfs_bench_{os.getpid()}"
        self.ok = False
        if not shutil.which("nft"):
            log("no nft (apt-get install nftables): no server-side byte counts, only xpackfs's own stats.json")
            return
        cmds = [["add", "table", "inet", self.table],
                ["add", "chain", "inet", self.table, "out", "{ type filter hook output priority 0; policy accept; }"],
                ["add", "rule", "inet", self.table, "out", "tcp", "sport", str(port), "counter"]]
        for i, c in enumerate(cmds):
            r = subprocess.run(["nft"] + c, capture_output=True, text=True)
            if r.returncode != 0:
                log(f"nft {' '.join(c)}: {r.stderr.strip()}: no server-side byte counts")
                if i:
                    subprocess.run(["nft", "delete", "table", "inet", self.table], stderr=subprocess.DEVNULL)
                return
            if i == 0:
                _nft_tables.append(self.table)
        self.ok = True

    def read(self) -> int | None:
        if not self.ok:
            return None
        r = subprocess.run(["nft", "-j", "list", "chain", "inet", self.table, "out"], capture_output=True, text=True)
        try:
            for item in json.loads(r.stdout)["nftables"]:
                for e in item.get("rule", {}).get("expr", []):
                    if "counter" in e:
                        return int(e["counter"]["bytes"])
        except (ValueError, KeyError):
            pass
        return None


def find_mount_s3(a) -> tuple[str | None, str]:
    """(binary, its version) or (None, why not)."""
    sys.path.insert(0, str(REPO / "tools"))  # install_mount_s3.py sits in tools/, not tools/bench/
    import install_mount_s3

    root = Path(a.mount_s3_root)
    exe = next((c for c in (a.mount_s3, shutil.which("mount-s3"), str(root / "bin/mount-s3")) if c and Path(c).exists()),
               None)
    if exe is None and a.mount_s3_src:
        log(f"mount-s3 not found: building it from {a.mount_s3_src} (tools/install_mount_s3.py, "
            f"{install_mount_s3.DEFAULT_REV}) into {root}")
        try:
            with tempfile.TemporaryDirectory(prefix="mount-s3-src-") as w:
                exe = str(install_mount_s3.build(Path(a.mount_s3_src), a.mount_s3_rev, root,
                                                 Path(a.mount_s3_target) if a.mount_s3_target else None, Path(w)))
        except (Exception, SystemExit) as e:  # noqa: BLE001 - any failure: say so and skip the peer
            return None, f"building mount-s3 from {a.mount_s3_src} failed: {e}"
    if exe is None:
        return None, (f"mount-s3 not found (--mount-s3, PATH, {root}/bin). crates.io has no crate that ships it "
                      "(`mountpoint-s3` there is a 0.0.1 placeholder, `mountpoint-s3-fs` has no binary): build it "
                      "with `python3 tools/install_mount_s3.py --src CHECKOUT` or give --mount-s3-src CHECKOUT")
    r = subprocess.run([exe, "--help"], capture_output=True, text=True)
    missing = [f for f in ("--endpoint-url", "--force-path-style", "--region", "--read-only", "--foreground",
                           "--log-directory") if f not in r.stdout]
    if r.returncode != 0 or missing:
        return None, f"{exe} --help: exit {r.returncode}, flags missing {missing}"
    v = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout.strip()
    return exe, v


def find_s3fs() -> tuple[str | None, str]:
    exe = shutil.which("s3fs")
    if exe is None:
        log("s3fs not found: apt-get install -y s3fs")
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        cmd = ["apt-get", "install", "-y", "-q", "s3fs"]
        if subprocess.run(cmd, env=env, capture_output=True).returncode != 0:
            subprocess.run(["apt-get", "update", "-qq"], env=env, capture_output=True)
            r = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if r.returncode != 0:
                return None, f"s3fs not found and `apt-get install s3fs` failed: {r.stderr.strip()[-300:]}"
        exe = shutil.which("s3fs")
        if exe is None:
            return None, "s3fs not found after apt-get install s3fs"
    r = subprocess.run([exe, "--version"], capture_output=True, text=True)
    return exe, (r.stdout.strip().splitlines() or ["s3fs"])[0]


def peer_env() -> dict:
    return dict(os.environ, AWS_ACCESS_KEY_ID=KEY_ID, AWS_SECRET_ACCESS_KEY=SECRET, AWS_REGION=REGION,
                AWS_EC2_METADATA_DISABLED="true")


def mount_peer(kind: str, exe: str, endpoint: str, mnt: Path, tmp: Path) -> tuple[float, subprocess.Popen]:
    """Mount the bucket with `kind` (mount-s3 or s3fs) in the foreground, in a process group of its own; seconds
    until the mount is listed, and the process."""
    mnt.mkdir(parents=True, exist_ok=True)
    if is_mounted(mnt):
        raise PeerError(f"{mnt} is still mounted")
    if kind == "mount-s3":
        cmd = [exe, BUCKET, str(mnt), "--endpoint-url", endpoint, "--force-path-style", "--region", REGION,
               "--read-only", "--foreground", "--log-directory", str(tmp / "mount-s3-logs")]
    else:
        pw = tmp / "s3fs-passwd"
        pw.write_text(f"{KEY_ID}:{SECRET}\n")
        pw.chmod(0o600)
        cmd = [exe, BUCKET, str(mnt), "-f", "-o", f"url={endpoint},use_path_request_style,passwd_file={pw},ro"]
    logf = tmp / f"{kind}.log"
    with open(logf, "ab") as out:
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, env=peer_env(), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                             start_new_session=True)
    _children.append(p)
    end = time.time() + 60
    while not is_mounted(mnt):
        if p.poll() is not None or time.time() > end:
            stop_peer(mnt, p)
            tail = logf.read_text(errors="replace")[-800:]
            raise PeerError(f"{kind} did not mount (exit {p.returncode}): {tail}")
        time.sleep(0.02)
    dt = time.perf_counter() - t0
    _mounts.append(mnt)
    return dt, p


def stop_peer(mnt: Path, p: subprocess.Popen) -> None:
    unmount(mnt)
    try:
        p.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait(5)
    if p in _children:
        _children.remove(p)


# ---- figures ----------------------------------------------------------------------------------------------------
def summary(xs: list[float]) -> dict:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "runs": xs}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "xpackfs-bench")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--experts", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--ff", type=int, default=1024)
    ap.add_argument("--part-mib", type=int, default=8, help="range size of the baseline downloads")
    ap.add_argument("--parallel", default="8,16,32", help="parallel levels of the baseline downloads")
    ap.add_argument("--xpackfs", default=str(Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target")) / "release/xpackfs"))
    ap.add_argument("--s3s-fs", default=None, help="the s3s-fs binary (default: PATH, ~/.cargo/bin)")
    ap.add_argument("--s3s-target", default=str(Path(tempfile.gettempdir()) / "target-s3s"),
                    help="CARGO_TARGET_DIR for installing s3s-fs")
    ap.add_argument("--single-mib", type=int, default=64, help="bytes of the one-stream download (python x1)")
    ap.add_argument("--skip-requant", action="store_true")
    ap.add_argument("--server-cpus", default=None,
                    help="run the S3 server on these CPUs (e.g. 0) and everything else (downloads, mounts, readers) on "
                         "the others, as if the server were a machine of its own: by default the server shares every "
                         "core with the client side, so CPU the reader side spends is taken from the server")
    ap.add_argument("--mount-opts", default="", help="more -o options of the xpackfs mounts (e.g. remote_concurrency=32)")
    ap.add_argument("--requant-shape", default="2048,1024,8,2", help="hidden,inter,experts,layers of the V4.1 checkpoint")
    ap.add_argument("--json", type=Path, default=None, help="write the figures here too")
    ap.add_argument("--mmap", action="store_true",
                    help="after the rounds: mmap every shard of the bf16-cache view of the s3:// checkpoint, touch it page "
                         "by page (the kernel's readahead drives the reads), and report window resets per GiB fetched")
    ap.add_argument("--peers", action="store_true",
                    help="also measure mountpoint-s3 and s3fs (a cat of the GGUF, the first seed's build over them)")
    ap.add_argument("--mount-s3", default=None, help="the mount-s3 binary (default: PATH, --mount-s3-root/bin)")
    ap.add_argument("--mount-s3-root", default=str(Path.home() / ".cache/xpackfs/mountpoint-s3"),
                    help="cargo install root of mount-s3")
    ap.add_argument("--mount-s3-src", default=None,
                    help="a mountpoint-s3 checkout (or git dir) to build mount-s3 from when it is not installed")
    ap.add_argument("--mount-s3-rev", default="v1.23.0", help="the tag of --mount-s3-src to build")
    ap.add_argument("--mount-s3-target", default=None, help="CARGO_TARGET_DIR for building mount-s3")
    ap.add_argument("--seeds", type=Path, default=REPO.parent / "shared" / "seeds",
                    help="the seeds directory (sglang_expert_pack_build.py.txt) for the seed builds of --peers")
    a = ap.parse_args()
    if os.geteuid() != 0 or not Path("/dev/fuse").exists():
        raise SystemExit("needs root and /dev/fuse (drop_caches, FUSE mounts)")
    if not Path(a.xpackfs).exists():
        raise SystemExit(f"no xpackfs binary at {a.xpackfs} (cargo build --release, or --xpackfs)")
    atexit.register(cleanup)
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    parallel = [int(x) for x in a.parallel.split(",")]
    have_curl = shutil.which("curl") is not None
    if not have_curl:
        log("no curl: the baseline is the Python client's alone")
    part = a.part_mib * MIB

    gguf = bench_gguf(a.workdir, a.layers, a.experts, a.hidden, a.ff)
    v41 = None
    if not a.skip_requant:
        h, i, e, layers = a.requant_shape.split(",")
        v41 = a.workdir / f"v41-{h}x{i}x{e}x{layers}"
        if not (v41 / "config.json").exists():
            subprocess.run([sys.executable, str(REPO / "tools/fixtures/make_v4_fixture.py"), str(v41), "--variant", "v41",
                            "--hidden", h, "--inter", i, "--experts", e, "--layers", layers], check=True)
    exe = s3s_binary(a)
    peers: dict[str, dict] = {}  # kind -> {"exe", "version"} or {"skipped": why}
    if a.peers:
        for kind, found in (("mount-s3", find_mount_s3(a)), ("s3fs", find_s3fs())):
            if found[0] is None:
                log(f"--peers: skipping {kind}: {found[1]}")
                peers[kind] = {"skipped": found[1]}
            else:
                log(f"--peers: {kind} {found[0]} ({found[1]})")
                peers[kind] = {"exe": found[0], "version": found[1]}
        if not (a.seeds / "sglang_expert_pack_build.py.txt").exists():
            log(f"--peers: no seed at {a.seeds}/sglang_expert_pack_build.py.txt: skipping the seed builds")
    seed_ok = a.peers and (a.seeds / "sglang_expert_pack_build.py.txt").exists()
    with tempfile.TemporaryDirectory(prefix="bench-remote-") as tmpd:
        tmp = Path(tmpd)
        data = tmp / "s3"
        server_cpus = {int(c) for c in a.server_cpus.split(",")} if a.server_cpus else None
        endpoint = start_s3s(exe, data, server_cpus)
        if server_cpus:
            rest = os.sched_getaffinity(0) - server_cpus
            if not rest:
                raise SystemExit(f"--server-cpus {a.server_cpus} leaves no CPU for the client side")
            os.sched_setaffinity(0, rest)  # this process's children (curl, mounts, readers) inherit it
            log(f"server on CPUs {sorted(server_cpus)}, the client side on {sorted(rest)}")
        net = ServerBytes(int(endpoint.rsplit(":", 1)[1])) if a.peers else None
        log(f"s3s-fs at {endpoint}, uploading {gguf.name} ({gguf.stat().st_size / 1e6:.0f} MB)")
        s3 = s3_client(endpoint)
        key = "model.gguf"
        obj = upload(s3, gguf, key)
        size = obj["size"]
        served = [data / BUCKET / key]
        if v41 is not None:
            for f in sorted(v41.rglob("*")):
                if f.is_file():
                    upload(s3, f, f.relative_to(v41).as_posix(), CKPT_BUCKET)
                    served.append(data / CKPT_BUCKET / f.relative_to(v41).as_posix())
        served = [p for p in served if p.exists()]
        url = f"s3://{BUCKET}/{key}"
        digests = tmp / "digests"
        env = xenv(digests)
        eo = f"endpoint={endpoint}" + (f",{a.mount_opts}" if a.mount_opts else "")
        # The digest pass, once (it streams the object); the mounts below then read headers only.
        drop_caches()
        warm(served)
        t0 = time.perf_counter()
        r = subprocess.run([a.xpackfs, "digest", url, "--endpoint", endpoint], env=env, capture_output=True, text=True)
        digest_s = time.perf_counter() - t0
        if r.returncode != 0:
            raise SystemExit(f"digest {url}: {r.stderr[-2000:]}")
        for src in ([f"s3://{CKPT_BUCKET}/", str(v41)] if v41 is not None else []):
            r = subprocess.run([a.xpackfs, "digest", src, "--endpoint", endpoint], env=env, capture_output=True, text=True)
            if r.returncode != 0:
                raise SystemExit(f"digest {src}: {r.stderr[-2000:]}")
        # The first mount of each view hashes the view once (the pack's pack_sha256 streams the object again) and
        # stores it; timed here, so every mount in the rounds reads headers only.
        first_mount: dict[str, float] = {}
        for name, src, opts in [("pack", url, "ro")] + ([("requant s3", f"s3://{CKPT_BUCKET}/", "ro,view=requant"),
                                                         ("requant local", str(v41), "ro,view=requant")] if v41 else []):
            drop_caches()
            warm(served)
            m = tmp / "mnt-first"
            first_mount[name] = mount(a, src, m, f"{eo},{opts}", env)
            unmount(m)
        # One stream, one request in flight at a time, on the first --single-mib of the object: the rate a
        # reader that fetches each read synchronously can reach at best.
        single = min(size, a.single_mib * MIB)

        res: dict[str, list[float]] = {}
        extra: dict[str, object] = {"object_bytes": size, "etag": obj["etag"], "digest_pass_s": digest_s,
                                    "first_mount_s": first_mount, "single_stream_bytes": single}

        round_secs: list[dict[str, float]] = [{}]

        def add(name: str, seconds: float) -> None:
            res.setdefault(name, []).append(seconds)
            round_secs[-1][name] = seconds

        def cold() -> None:
            drop_caches()
            warm(served)

        local_pack = tmp / "local-copy.pack"
        # Per round: {measure: bytes the server sent} (--peers with nft), and what failed.
        net_rounds: list[dict[str, int | None]] = []
        peer_errors: list[str] = []

        def counted(name: str, fn):
            b0 = net.read() if net else None
            r = fn()
            b1 = net.read() if net else None
            net_rounds[-1][name] = b1 - b0 if b0 is not None and b1 is not None else None
            return r

        def measure_pack() -> list[Path]:
            # pack: a fresh mount each round, cold cat of the expert pack.
            m = tmp / "mnt-pack"
            cold()

            def run() -> list[Path]:
                mdt = mount(a, url, m, f"{eo},ro", env)
                ps = view_files(m, (".pack",))
                n, dt = read_files(ps)
                add("pack mount", mdt)
                add("pack cat", dt)
                add("pack mount+cat", mdt + dt)
                extra["pack_bytes"] = n
                extra.setdefault("pack_remote_stats", []).append(stats_remote(m))
                unmount(m)
                return ps

            return counted("pack mount+cat", run)

        def peer_cat(exe: str) -> None:
            # mountpoint-s3: a fresh mount, cold cat of the GGUF itself.
            m = tmp / "mnt-peer"
            cold()

            def run() -> None:
                mdt, p = mount_peer("mount-s3", exe, endpoint, m, tmp)
                try:
                    n, dt = read_files([m / key])
                finally:
                    stop_peer(m, p)
                if n != size:
                    raise PeerError(f"mount-s3 lists {key} with {n} bytes, not {size}")
                add("mountpoint-s3 mount", mdt)
                add("mountpoint-s3 cat", dt)

            counted("mountpoint-s3 cat", run)

        def peer_seed(kind: str, exe: str) -> None:
            # What users do today: mount the bucket, run the first seed's build on the mounted GGUF, the pack
            # written to a local directory; mount + build timed.
            m, out = tmp / "mnt-peer", tmp / "seed-out"
            shutil.rmtree(out, ignore_errors=True)
            cold()
            name = f"seed over {'mountpoint-s3' if kind == 'mount-s3' else kind}"

            def run() -> None:
                t0 = time.perf_counter()
                mdt, p = mount_peer(kind, exe, endpoint, m, tmp)
                try:
                    tb = time.perf_counter()
                    r = subprocess.run([sys.executable, str(REPO / "tools/peers/run_seed_expert_pack.py"), "--seeds",
                                        str(a.seeds), "--source", str(m / key), "--out", str(out),
                                        "--model-identity-sha256", "11" * 32, "--config-sha256", "11" * 32,
                                        "--top-k", "2"], capture_output=True, text=True)
                    build = time.perf_counter() - tb
                finally:
                    stop_peer(m, p)
                total = time.perf_counter() - t0
                if r.returncode != 0:
                    raise PeerError(f"{name}: exit {r.returncode}: {(r.stderr or r.stdout)[-1500:]}")
                packs = sorted(out.glob("*.pack"))
                if not packs:
                    raise PeerError(f"{name}: no pack in {out}")
                extra.setdefault("seed_pack_bytes", {})[name] = packs[0].stat().st_size
                add(name, total)
                add(f"{name} (build alone)", build)

            try:
                counted(name, run)
            finally:
                shutil.rmtree(out, ignore_errors=True)

        def measure_peers(rnd: int) -> None:
            todo = []
            if "exe" in peers.get("mount-s3", {}):
                todo.append(("mountpoint-s3 cat", lambda: peer_cat(peers["mount-s3"]["exe"])))
            for kind in ("s3fs", "mount-s3"):
                if seed_ok and "exe" in peers.get(kind, {}):
                    todo.append((f"seed over {kind}", lambda kind=kind: peer_seed(kind, peers[kind]["exe"])))
            for name, fn in (todo if rnd % 2 == 0 else todo[::-1]):
                log(f"  peer: {name}")
                try:
                    fn()
                except (PeerError, subprocess.CalledProcessError, OSError) as e:
                    msg = f"round {rnd + 1}, {name}: {e}"
                    log(f"  failed: {msg}")
                    peer_errors.append(msg)

        for rnd in range(a.rounds):
            log(f"round {rnd + 1}/{a.rounds}")
            net_rounds.append({})
            if rnd:
                round_secs.append({})
            cold()
            add("python x1", python_download(endpoint, key, single, part, 1))
            for p in parallel:
                if have_curl:
                    cold()
                    add(f"curl x{p}", curl_download(endpoint, key, size, part, p, tmp))
                cold()
                add(f"python x{p}", python_download(endpoint, key, size, part, p))
            # With --peers, they go after the pack read in even rounds and before it in odd ones.
            if a.peers and rnd % 2 == 1:
                measure_peers(rnd)
            packs = measure_pack()
            if a.peers and rnd % 2 == 0:
                measure_peers(rnd)
            mnt = tmp / "mnt-pack"
            # cached: fill a fresh disk cache with one mount's read of the pack, then time a second mount's read
            # against the local copy of the pack.
            cache = tmp / "disk-cache"
            shutil.rmtree(cache, ignore_errors=True)
            co = f"{eo},ro,disk_cache={cache},disk_cache_gb=8"
            cold()
            mount(a, url, mnt, co, env)
            if not local_pack.exists():
                shutil.copyfile(view_files(mnt, (".pack",))[0], local_pack)
            else:
                read_files(view_files(mnt, (".pack",)))
            settle_file_entries(mnt)
            unmount(mnt)
            names = ["cached", "cached parts", "local copy"]
            for name in (names if rnd % 2 == 0 else names[::-1]):
                cold()
                if name == "local copy":
                    add(name, read_files([local_pack])[1])
                    continue
                mount(a, url, mnt, co + (",disk_cache_files=off" if name == "cached parts" else ""), env)
                add(name, read_files(view_files(mnt, (".pack",)))[1])
                st = stats_remote(mnt)
                st["passthrough_opens"] = stats_all(mnt).get("passthrough", {}).get("opens")
                extra.setdefault(f"{name.replace(' ', '_')}_remote_stats", []).append(st)
                unmount(mnt)
            # SGLang's reader over a fresh mount.
            cold()
            mount(a, url, mnt, f"{eo},ro", env)
            r = subprocess.run([sys.executable, str(REPO / "tools/peers/sglang_read.py"), str(packs[0]), "--direct-io", "--json"],
                               capture_output=True, text=True)
            if r.returncode != 0:
                raise SystemExit(f"sglang_read: {r.stderr[-2000:]}")
            sg = json.loads(r.stdout.strip().splitlines()[-1])
            add("sglang", sg["seconds"])
            extra["sglang_bytes"] = sg["bytes"]
            extra.setdefault("sglang_remote_stats", []).append(stats_remote(mnt))
            unmount(mnt)
            # requant: s3:// and local, alternating which goes first.
            if v41 is not None:
                order = [("requant s3", f"s3://{CKPT_BUCKET}/"), ("requant local", str(v41))]
                for name, src in (order if rnd % 2 == 0 else order[::-1]):
                    m = tmp / "mnt-requant"
                    cold()
                    mount(a, src, m, f"{eo},ro,view=requant", env)
                    files = view_files(m, (".safetensors",))
                    n, dt = read_files(files)
                    add(name, dt)
                    extra["requant_bytes"] = n
                    if name == "requant s3":
                        extra.setdefault("requant_remote_stats", []).append(stats_remote(m))
                    unmount(m)

        if a.mmap and v41 is not None:
            m = tmp / "mnt-mmap"
            cold()
            mount(a, f"s3://{CKPT_BUCKET}/", m, f"{eo},ro,view=bf16-cache", env)
            before = stats_remote(m)
            n, dt = mmap_touch(view_files(m, (".safetensors",)))
            after = stats_remote(m)
            unmount(m)
            fetched = after.get("bytes", 0) - before.get("bytes", 0)
            p0, p1 = before.get("parts", {}), after.get("parts", {})
            d = {k: p1.get(k, 0) - p0.get(k, 0) for k in ("window_resets", "direct_reads", "parts_fetched")}
            extra["mmap"] = dict(d, view_bytes=n, seconds=dt, fetched_bytes=fetched,
                                 requests=after.get("requests", 0) - before.get("requests", 0),
                                 window_resets_per_gib=d["window_resets"] / max(fetched / (1 << 30), 1e-9))
        elif a.mmap:
            log("--mmap needs the checkpoint (not with --skip-requant)")

        med = {k: summary(v) for k, v in res.items()}
        base_name = min((k for k in med if k.startswith(("curl", "python")) and k != "python x1"),
                        key=lambda k: med[k]["median"])
        base_s = med[base_name]["median"]
        base_gbs = size / base_s / 1e9

        def gbs(name: str, nbytes: int) -> float:
            return nbytes / med[name]["median"] / 1e9

        rows = [(k, med[k]["median"], size / med[k]["median"] / 1e9, size / med[k]["median"] / 1e9 / base_gbs)
                for k in med if k.startswith(("curl", "python")) and k != "python x1"]
        one = gbs("python x1", single)
        rows.append((f"python x1 (first {single >> 20} MiB)", med["python x1"]["median"], one, one / base_gbs))
        pack_gbs = gbs("pack cat", extra["pack_bytes"])
        rows.append(("pack cat (xpackfs s3://)", med["pack cat"]["median"], pack_gbs, pack_gbs / base_gbs))
        sg_gbs = gbs("sglang", extra["sglang_bytes"])
        rows.append(("sglang O_DIRECT 4 splits", med["sglang"]["median"], sg_gbs, sg_gbs / base_gbs))
        cached_gbs, local_gbs = gbs("cached", extra["pack_bytes"]), gbs("local copy", extra["pack_bytes"])
        parts_gbs = gbs("cached parts", extra["pack_bytes"])
        rows.append(("pack, second mount (disk cache)", med["cached"]["median"], cached_gbs, None))
        rows.append(("  the same, disk_cache_files=off", med["cached parts"]["median"], parts_gbs, None))
        rows.append(("pack, local copy", med["local copy"]["median"], local_gbs, None))
        ratios = {"pack_vs_baseline": pack_gbs / base_gbs, "sglang_vs_baseline": sg_gbs / base_gbs,
                  "cached_second_mount_vs_local": cached_gbs / local_gbs,
                  "cached_second_mount_parts_only_vs_local": parts_gbs / local_gbs}
        # The user's view: how long until the pack is read against how long the GGUF takes to download (the pack
        # is smaller than the GGUF, so these are higher than the throughput ratios by the size ratio).
        times = {"pack_time_vs_baseline": base_s / med["pack cat"]["median"],
                 "sglang_time_vs_baseline": base_s / med["sglang"]["median"]}
        cached_net = [st.get("bytes", 0) for st in extra.get("cached_remote_stats", []) if st]

        def net_per_byte(stats_key: str, nbytes: int) -> float | None:
            got = [st.get("bytes", 0) for st in extra.get(stats_key, []) if st]
            return statistics.median(got) / nbytes if got else None

        # Network bytes per byte read (1.0: each source byte crossed once; the pack is about the GGUF's size). For
        # requant it is source bytes per output byte: the quantised view is smaller than its BF16 source.
        extra["network_bytes_per_byte_read"] = {
            "pack cat": net_per_byte("pack_remote_stats", extra["pack_bytes"]),
            "sglang": net_per_byte("sglang_remote_stats", extra["sglang_bytes"])}
        if v41 is not None:
            extra["network_bytes_per_byte_read"]["requant s3"] = net_per_byte("requant_remote_stats",
                                                                              extra["requant_bytes"])
        if v41 is not None:
            rs, rl = gbs("requant s3", extra["requant_bytes"]), gbs("requant local", extra["requant_bytes"])
            rows.append(("requant over s3://", med["requant s3"]["median"], rs, None))
            rows.append(("requant over local", med["requant local"]["median"], rl, None))
            ratios["requant_s3_vs_local"] = rs / rl
        # --peers: mountpoint-s3's cat of the GGUF (throughputs), the seed builds over the peers' mounts against
        # xpackfs's mount + cat of the pack (seconds).
        peer_rows: list[tuple[str, float, float | None, float | None]] = []
        if a.peers:
            if "mountpoint-s3 cat" in med:
                mp_gbs = gbs("mountpoint-s3 cat", size)
                peer_rows.append(("mountpoint-s3 cat of the GGUF", med["mountpoint-s3 cat"]["median"], mp_gbs,
                                  mp_gbs / base_gbs))
                ratios["mountpoint_s3_cat_vs_baseline"] = mp_gbs / base_gbs
                ratios["pack_vs_mountpoint_s3_cat"] = pack_gbs / mp_gbs
            xp_s = med["pack mount+cat"]["median"]
            seeds = [k for k in ("seed over s3fs", "seed over mountpoint-s3") if k in med]
            for k in seeds:
                peer_rows.append((f"{k} (mount + build)", med[k]["median"], None, None))
                ratios[f"xpackfs_vs_{k.replace(' ', '_').replace('-', '_')}"] = med[k]["median"] / xp_s
            if seeds:
                fastest = min(seeds, key=lambda k: med[k]["median"])
                ratios["xpackfs_vs_fastest_seed"] = med[fastest]["median"] / xp_s
                extra["fastest_seed"] = fastest
            peer_rows.append(("xpackfs mount + cat of the pack", xp_s, None, None))
            extra["peers"] = peers
            extra["peer_errors"] = peer_errors
            extra["server_bytes_per_round"] = net_rounds
            extra["seconds_per_round"] = round_secs
        out = {"baseline": {"name": base_name, "seconds": base_s, "gb_per_s": base_gbs}, "measures": med,
               "ratios": ratios, "time_ratios": times, "pack_mount_s": med["pack mount"]["median"], **extra,
               "rounds": a.rounds, "part_mib": a.part_mib, "xpackfs": a.xpackfs, "server_cpus": a.server_cpus,
               "cached_second_mount_network_bytes": cached_net}
        print(f"object {size / 1e6:.1f} MB, pack {extra['pack_bytes'] / 1e6:.1f} MB, {a.rounds} rounds, medians; "
              f"digest pass {digest_s:.2f} s; first mounts (view digests) "
              + ", ".join(f"{k} {v:.2f} s" for k, v in first_mount.items())
              + f"; later pack mounts {med['pack mount']['median']:.2f} s")
        print(f"{'measure':34} {'seconds':>8} {'GB/s':>7} {'x baseline':>10}")
        for name, s, g, x in rows:
            print(f"{name:34} {s:8.3f} {g:7.3f} {('%.2f' % x) if x is not None else '':>10}")
        print(f"baseline: {base_name} ({base_gbs:.3f} GB/s)")
        print("ratios: " + ", ".join(f"{k} {('%.2f' % v) if v is not None else 'n/a'}" for k, v in ratios.items()))
        print("the same as time ratios (download's seconds over the read's): "
              + ", ".join(f"{k} {v:.2f}" for k, v in times.items()))
        print("network bytes per byte read: " + ", ".join(
            f"{k} {('%.2f' % v) if v is not None else 'n/a'}" for k, v in extra["network_bytes_per_byte_read"].items()))
        parts_net = [st.get("bytes", 0) for st in extra.get("cached_parts_remote_stats", []) if st]
        opens = [st.get("passthrough_opens") for st in extra.get("cached_remote_stats", []) if st]
        print(f"second mount with the disk cache filled: {cached_gbs:.3f} GB/s vs a local copy {local_gbs:.3f} GB/s "
              f"({cached_gbs / local_gbs:.2f}x), network bytes per round {cached_net}, passthrough opens {opens}; "
              f"from the fetched parts (disk_cache_files=off) {parts_gbs:.3f} GB/s ({parts_gbs / local_gbs:.2f}x), "
              f"network bytes {parts_net}")
        if a.peers:
            print("peers (--peers):")
            for kind, info in peers.items():
                print(f"  {kind}: " + (f"{info['exe']} ({info['version']})" if "exe" in info
                                       else f"skipped: {info['skipped']}"))
            for name, s, g, x in peer_rows:
                print(f"{name:40} {s:8.3f} " + (f"{g:7.3f} {x:10.2f}" if g is not None else "")
                      + (f"  {s / med['pack mount+cat']['median']:.1f}x xpackfs's time" if name.startswith("seed") else ""))
            if "pack_vs_mountpoint_s3_cat" in ratios:
                print(f"xpackfs pack read vs mountpoint-s3's read of the GGUF: {ratios['pack_vs_mountpoint_s3_cat']:.2f}x "
                      "(throughputs; target >= 1.2x)")
            if "xpackfs_vs_fastest_seed" in ratios:
                print(f"xpackfs mount + pack read vs the faster seed build ({extra['fastest_seed']}): "
                      f"{ratios['xpackfs_vs_fastest_seed']:.1f}x faster (target >= 5x)")
            print("per round: seconds, bytes the server sent (IP packets), xpackfs's own count (stats.json):")
            stats_bytes = [st.get("bytes", 0) for st in extra.get("pack_remote_stats", [])]
            for i, row in enumerate(net_rounds):
                for name in row:
                    sec = round_secs[i].get(name)
                    print(f"  round {i + 1} {name:28} " + (f"{sec:8.2f} s " if sec is not None else "  failed   ")
                          + (f"{row[name] / 1e6:9.1f} MB" if row[name] is not None else "        n/a")
                          + (f"  ({stats_bytes[i] / 1e6:.1f} MB in stats.json)"
                             if name == "pack mount+cat" and i < len(stats_bytes) else ""))
            for e in peer_errors:
                print(f"failed: {e}")
        if "mmap" in extra:
            mm = extra["mmap"]
            print(f"mmap of the bf16-cache view's shards over s3:// ({mm['view_bytes'] / 1e6:.0f} MB, page by page): "
                  f"{mm['fetched_bytes'] / 2**20:.0f} MiB fetched in {mm['requests']} requests, {mm['window_resets']} window "
                  f"resets ({mm['window_resets_per_gib']:.2f}/GiB), {mm['direct_reads']} GETs of their own range")
        if a.json:
            a.json.write_text(json.dumps(out, indent=1))
        print(json.dumps(out))
        cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
