#!/usr/bin/env python3
"""materialize throughput against its peers on the same bytes, in one run.

    python3 tools/bench/bench_materialize.py [--workdir /tmp/xpackfs-bench] [--skip-seed]
    XPACKFS_GGML_LIB=... python3 tools/bench/bench_materialize.py    # adds the requant view vs the fourth seed

Expert pack (the large random-MXFP4 GGUF that tools/bench/bench_read.py makes, made here if missing):
  - `cp` of the source followed by `sync` (the floor: same byte count, no hashing);
  - `xpackfs materialize` with the source's digests already in the store (fsynced, sha256
    while writing, manifest and checkpoint from those digests);
  - the same split in two parts run at once and `--finalize` (one machine: this shows the
    overhead of partitioning, not a speed-up, with 2 cores and one disk);
  - from nothing: `xpackfs digest` + materialize against the first seed's own build, which
    also hashes the source first (tools/peers/run_seed_expert_pack.py).
Requantised shards (with XPACKFS_GGML_LIB): materialize against the fourth seed's
`convert --jobs 2` on the same fixture and cores.
The page cache is warm for the source in every case.
"""
import argparse
import hashlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools/bench"))
from bench_common import bench_gguf  # noqa: E402


def timed(cmd, **kw) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True, **kw)
    return time.perf_counter() - t0


def tree_bytes(d: Path) -> int:
    return sum(p.stat().st_size for p in d.rglob("*") if p.is_file())


def row(name: str, nbytes: int, seconds: float, ref: float | None = None, ref_name: str = "") -> None:
    rate = nbytes / 1e6 / seconds
    extra = f"  {ref / seconds:5.2f}x {ref_name}" if ref else ""
    print(f"  {name:<52} {nbytes / 1e6:8.0f} MB {seconds:7.2f} s {rate:7.0f} MB/s{extra}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/xpackfs-bench"))
    ap.add_argument("--xpackfs", default=str(REPO / "target/release/xpackfs"))
    ap.add_argument("--seeds", default=str(REPO.parent / "shared" / "seeds"))
    ap.add_argument("--skip-seed", action="store_true")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    x = a.xpackfs
    src = bench_gguf(a.workdir)
    subprocess.run(["cat", str(src)], stdout=subprocess.DEVNULL, check=True)  # warm
    work = a.workdir / "materialize"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    store = work / "digests"
    opts = f"top_k=2,digest_store={store}"
    t_digest = timed([x, "digest", str(src), "--digest-store", str(store)])

    print(f"expert pack of {src.name} ({src.stat().st_size / 1e6:.0f} MB source); "
          f"cp and materialize alternate, {a.rounds} rounds, medians (this disk's write speed varies a lot)")
    dst = work / "copy.bin"
    out = work / "single"
    cps, mats = [], []
    for _ in range(a.rounds):
        cps.append(timed(["sh", "-c", f"cp '{src}' '{dst}' && sync '{dst}'"]))
        dst.unlink()
        subprocess.run(["sync"], check=True)
        mats.append(timed([x, "materialize", str(src), "--out", str(out), "--margin-gib", "0", "-o", opts]))
        n = tree_bytes(out)
        pack_sha = hashlib.sha256((out / f"{src.stem}.pack").read_bytes()).hexdigest()
        shutil.rmtree(out)
        subprocess.run(["sync"], check=True)
    t_cp, t_mat = statistics.median(cps), statistics.median(mats)
    print(f"  cp runs {', '.join(f'{t:.2f}' for t in cps)} s; materialize runs {', '.join(f'{t:.2f}' for t in mats)} s")
    out = work / "parts"
    t0 = time.perf_counter()
    procs = [subprocess.Popen([x, "materialize", str(src), "--out", str(out), "--margin-gib", "0", "-o", opts,
                               "--partition", f"{i}/2", "--piece-size", "256M"], stderr=subprocess.DEVNULL) for i in range(2)]
    assert all(p.wait() == 0 for p in procs)
    t_parts = time.perf_counter() - t0
    t_fin = timed([x, "materialize", str(src), "--out", str(out), "--margin-gib", "0", "-o", opts, "--finalize"])
    same = hashlib.sha256((out / f"{src.stem}.pack").read_bytes()).hexdigest() == pack_sha
    shutil.rmtree(out)
    row("cp + sync of the source", src.stat().st_size, t_cp)
    row("materialize (digests in the store)", n, t_mat, t_cp * n / src.stat().st_size, "cp")
    row("materialize --partition 0/2 + 1/2 at once", n, t_parts)
    row("  + --finalize (re-hash of the cut pack, manifests)", n, t_fin)
    row("  partitioned total", n, t_parts + t_fin, t_mat, "the single run")
    print(f"  partitioned pack identical to the single run's: {same}")

    if not a.skip_seed:
        with tempfile.TemporaryDirectory(dir=work) as tmp:
            ident = "11" * 32
            t_seed = timed([sys.executable, str(REPO / "tools/peers/run_seed_expert_pack.py"), "--seeds", a.seeds,
                            "--source", str(src), "--out", tmp, "--model-identity-sha256", ident,
                            "--config-sha256", ident, "--top-k", "2"])
            seed_bytes = tree_bytes(Path(tmp))
        fresh = work / "fresh-digests"
        out = work / "fresh"
        t_all = timed([x, "digest", str(src), "--digest-store", str(fresh)])
        t_all += timed([x, "materialize", str(src), "--out", str(out), "--margin-gib", "0",
                        "-o", f"top_k=2,model_identity_sha256={ident},config_sha256={ident},digest_store={fresh}"])
        row("first seed build (hashes the source, then copies)", seed_bytes, t_seed)
        row("xpackfs digest + materialize, from nothing", tree_bytes(out), t_all, t_seed, "the seed")
        shutil.rmtree(out)
    print(f"  (hashing the source once: {t_digest:.2f} s)")

    lib = os.environ.get("XPACKFS_GGML_LIB")
    if lib:
        with tempfile.TemporaryDirectory(dir=work) as tmp:
            fx, seed_out, out = Path(tmp) / "src", Path(tmp) / "seed", Path(tmp) / "mat"
            subprocess.run([sys.executable, str(REPO / "tools/fixtures/make_v4_fixture.py"), str(fx), "--variant", "v41",
                            "--hidden", "2048", "--inter", "1024", "--experts", "8", "--layers", "2"], check=True,
                           capture_output=True)
            r = subprocess.run([sys.executable, str(REPO / "tools/peers/run_seed_requant.py"), "--seeds", a.seeds,
                                "--source", str(fx), "--out", str(seed_out), "--ggml-lib", lib, "--jobs", "2"],
                               check=True, capture_output=True, text=True)
            seed_s = float(r.stdout.strip().splitlines()[-1])
            t_req = timed([x, "materialize", str(fx), "--out", str(out), "--margin-gib", "0",
                           "-o", "view=requant,digest_store=none"])
            same = all((seed_out / p.name).read_bytes() == p.read_bytes() for p in out.iterdir())
            print("requantised shards (V4.1 fixture, 2 layers x 8 experts)")
            row("fourth seed convert --jobs 2", tree_bytes(seed_out), seed_s)
            row("xpackfs materialize view=requant", tree_bytes(out), t_req, seed_s, "the seed")
            print(f"  identical to the seed's output: {same}")
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
