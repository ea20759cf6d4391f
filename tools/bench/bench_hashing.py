#!/usr/bin/env python3
"""Hashing at the machine's speed (issue 27): each measure against its peer, in one run.

    python3 tools/bench/bench_hashing.py [--workdir /tmp/xpackfs-bench] [--rounds 3] [--baseline OLD_XPACKFS]

  - `xpackfs digest` of the bench GGUF (tools/bench/bench_common.py: random MXFP4, 8 layers x 32
    experts) vs one OpenSSL sha256 stream of the same file (Python's hashlib.file_digest),
    page cache warm;
  - `xpackfs materialize` of its expert pack, first run (empty digest store), vs `cp` + `sync`
    of the pack it writes (the same bytes);
  - `xpackfs validate-int8 --verify-hashes` vs the second seed's validator
    (tools/peers/seed_validate_int8.py) on a kt-int8 tree of a 4-layer source, page cache warm.
With --baseline, the same xpackfs measures of another build run alternately with this one.
Rounds alternate the two sides; medians are reported, with each ratio of medians.
"""
import argparse
import hashlib
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools/bench"))
from bench_common import bench_gguf  # noqa: E402


def timed(cmd, **kw) -> float:
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode:
        raise SystemExit(f"{' '.join(map(str, cmd))} failed: {r.stderr[-2000:]}")
    return time.perf_counter() - t0


def openssl_stream(path: Path) -> float:
    t0 = time.perf_counter()
    with open(path, "rb") as f:
        hashlib.file_digest(f, "sha256")
    return time.perf_counter() - t0


def med(xs):
    return statistics.median(xs)


def report(name, ours, peer, peer_name):
    print(f"  {name:<44} {med(ours):6.2f} s vs {peer_name} {med(peer):6.2f} s = {med(peer) / med(ours):.2f}x"
          f"   (runs {', '.join(f'{x:.2f}' for x in ours)} | {', '.join(f'{x:.2f}' for x in peer)})")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/xpackfs-bench"))
    ap.add_argument("--xpackfs", default=str(REPO / "target/release/xpackfs"))
    ap.add_argument("--baseline", help="another xpackfs binary, measured alternately")
    ap.add_argument("--seeds", default=str(REPO.parent / "shared" / "seeds"))
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    bins = [("xpackfs", a.xpackfs)] + ([("baseline", a.baseline)] if a.baseline else [])
    src = bench_gguf(a.workdir)
    work = a.workdir / "hashing"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    subprocess.run(["cat", str(src)], stdout=subprocess.DEVNULL, check=True)

    print(f"digest of {src.name} ({src.stat().st_size / 1e6:.0f} MB), page cache warm, {a.rounds} rounds")
    t = {n: [] for n, _ in bins}
    t_ssl = []
    for _ in range(a.rounds):
        t_ssl.append(openssl_stream(src))
        for n, x in bins:
            t[n].append(timed([x, "digest", str(src), "--digest-store", "none"]))
    for n, _ in bins:
        report(f"{n} digest", t[n], t_ssl, "OpenSSL stream")

    print(f"materialize of the expert pack, first run (empty digest store), vs cp + sync of the pack")
    pack = work / "pack-copy-src"
    subprocess.run([a.xpackfs, "materialize", str(src), "--out", str(pack), "--margin-gib", "0", "-o", "top_k=2,digest_store=none"],
                   check=True, capture_output=True)
    pack_file = next(pack.glob("*.pack"))
    t = {n: [] for n, _ in bins}
    t_cp = []
    for _ in range(a.rounds):
        dst = work / "copy.bin"
        subprocess.run(["sync"], check=True)
        t_cp.append(timed(["sh", "-c", f"cp '{pack_file}' '{dst}' && sync '{dst}'"]))
        dst.unlink()
        for n, x in bins:
            out, store = work / f"out-{n}", work / f"store-{n}"
            shutil.rmtree(out, ignore_errors=True)
            shutil.rmtree(store, ignore_errors=True)
            subprocess.run(["sync"], check=True)
            t[n].append(timed([x, "materialize", str(src), "--out", str(out), "--margin-gib", "0", "-o", f"top_k=2,digest_store={store}"]))
            same = (out / pack_file.name).read_bytes() == pack_file.read_bytes()
            if not same:
                raise SystemExit(f"{n}: the materialized pack differs")
            shutil.rmtree(out)
    shutil.rmtree(pack)
    for n, _ in bins:
        report(f"{n} materialize, first run", t[n], t_cp, "cp + sync")

    int8_src = a.workdir / "int8-4x32x2048x1536.gguf"
    if not int8_src.exists():
        subprocess.run([sys.executable, str(REPO / "tools/fixtures/make_sample_gguf.py"), str(int8_src), "--fast-random", "--layers", "4",
                        "--experts", "32", "--hidden", "2048", "--ff", "1536"], check=True)
    tree = work / "int8-tree"
    subprocess.run([a.xpackfs, "materialize", str(int8_src), "--out", str(tree), "--margin-gib", "0", "-o",
                    "view=kt-int8,numa_count=2,digest_store=none"], check=True, capture_output=True)
    files = list(tree.rglob("*.kt"))
    size = sum(p.stat().st_size for p in files)
    expect = ["--layers", "0,1,2,3", "--numa-count", "2", "--expert-num", "32", "--hidden-size", "2048", "--intermediate-size", "1536"]
    subprocess.run(["cat"] + [str(p) for p in files], stdout=subprocess.DEVNULL)
    print(f"validate-int8 --verify-hashes, kt-int8 tree of {len(files)} files ({size / 1e6:.0f} MB), page cache warm")
    t = {n: [] for n, _ in bins}
    t_seed = []
    for _ in range(a.rounds):
        t_seed.append(timed([sys.executable, str(REPO / "tools/peers/seed_validate_int8.py"), "--seeds", a.seeds, str(tree), *expect, "--verify-hashes"]))
        for n, x in bins:
            t[n].append(timed([x, "validate-int8", str(tree), *expect, "--verify-hashes"]))
    for n, _ in bins:
        report(f"{n} validate-int8 --verify-hashes", t[n], t_seed, "seed 001")
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
