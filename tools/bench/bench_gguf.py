#!/usr/bin/env python3
"""The GGUF output view's benchmarks (issue 26), in one run, as ratios against llama.cpp.

1. Cold read of the virtual FTYPE file (default Q4_K_M) of a BF16 qwen3moe GGUF (about 0.9 GB,
   written here once and kept in --workdir) against llama.cpp's own `llama-quantize` of the
   same file (tools/llama_quantize_tool.sh: llama.cpp 0c1e57098 as vendored by
   llama-cpp-python 0.3.36; its output to /dev/shm, so the peer pays no disk write), with the
   same threads (the mount's compute_threads, the command's nthread). Each round drops the
   source's page cache, then times the peer, then `mount` + one sequential 1 MiB-read pass
   over the mounted file (a fresh mount: no chunk is cached); medians of --rounds. The
   mounted bytes are compared with the peer's file after the timed rounds.
2. Mount start-up and daemon RSS for a full-size sparse BF16 GGUF with the shapes of
   Qwen3-235B-A22B (94 layers, 128 experts: 470 GB apparent, no disk used): headers only are
   read. Medians of 3, the header's page cache dropped before each mount.

The quantizers one thread against ggml are in-process: `cargo bench --bench codecs`.

    python3 tools/bench/bench_gguf.py [--rounds 3] [--threads 1,2] [--ftype Q4_K_M] [--skip-sparse | --sparse-only]
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as T

REPO = Path(__file__).resolve().parents[2]
ALIGN = 32


def drop(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)


def qwen3moe_tensors(n_layer: int, n_embd: int, n_head: int, n_kv: int, hd: int, n_exp: int, n_ff_exp: int, n_vocab: int):
    """(name, numpy-order shape, type) of a qwen3moe model, in the converter's order."""
    t = [("token_embd.weight", (n_vocab, n_embd), T.BF16), ("output_norm.weight", (n_embd,), T.F32),
         ("output.weight", (n_vocab, n_embd), T.BF16)]
    for i in range(n_layer):
        p = f"blk.{i}"
        t += [(f"{p}.attn_norm.weight", (n_embd,), T.F32), (f"{p}.attn_q.weight", (n_head * hd, n_embd), T.BF16),
              (f"{p}.attn_k.weight", (n_kv * hd, n_embd), T.BF16), (f"{p}.attn_v.weight", (n_kv * hd, n_embd), T.BF16),
              (f"{p}.attn_output.weight", (n_embd, n_head * hd), T.BF16), (f"{p}.attn_q_norm.weight", (hd,), T.F32),
              (f"{p}.attn_k_norm.weight", (hd,), T.F32), (f"{p}.ffn_norm.weight", (n_embd,), T.F32),
              (f"{p}.ffn_gate_inp.weight", (n_exp, n_embd), T.F32),
              (f"{p}.ffn_gate_exps.weight", (n_exp, n_ff_exp, n_embd), T.BF16),
              (f"{p}.ffn_up_exps.weight", (n_exp, n_ff_exp, n_embd), T.BF16),
              (f"{p}.ffn_down_exps.weight", (n_exp, n_embd, n_ff_exp), T.BF16)]
    return t


def write_qwen3moe(out: Path, sparse: bool, n_layer: int, n_embd: int, n_head: int, n_kv: int, hd: int, n_exp: int,
                   n_used: int, n_ff_exp: int, n_vocab: int) -> None:
    """A BF16 qwen3moe GGUF (no vocabulary) with gguf-py's writer: the header and tensor table,
    then each tensor's data (Gaussian weights with outliers, rounded to BF16), or, when sparse,
    nothing: the file is extended to its full size without writing data."""
    tmp = out.with_suffix(".partial")
    w = gguf.GGUFWriter(str(tmp), "qwen3moe")
    w.add_name("xpackfs bench qwen3moe")
    w.add_context_length(4096)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff_exp * 8)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_rope_dimension_count(hd)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(1000000.0)
    w.add_file_type(32)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_expert_count(n_exp)
    w.add_expert_used_count(n_used)
    w.add_expert_feed_forward_length(n_ff_exp)
    w.add_tokenizer_model("no_vocab")
    w.add_vocab_size(n_vocab)
    tensors = qwen3moe_tensors(n_layer, n_embd, n_head, n_kv, hd, n_exp, n_ff_exp, n_vocab)
    sizes = []
    for name, shape, ty in tensors:
        n = int(np.prod(shape)) * (4 if ty == T.F32 else 2)
        w.add_tensor_info(name, shape, np.dtype(np.float32) if ty == T.F32 else np.dtype(np.uint16), n, raw_dtype=ty)
        sizes.append(n)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    start = (tmp.stat().st_size + ALIGN - 1) // ALIGN * ALIGN
    rng = np.random.default_rng(26)
    with open(tmp, "r+b") as f:
        f.truncate(start)
        off = start
        for (name, shape, ty), n in zip(tensors, sizes):
            off = (off + ALIGN - 1) // ALIGN * ALIGN
            if not sparse:
                f.seek(off)
                for lo in range(0, int(np.prod(shape)), 1 << 24):  # 16 Mi values at a time
                    k = min(1 << 24, int(np.prod(shape)) - lo)
                    if ty == T.F32:
                        f.write((1.0 + 0.1 * rng.standard_normal(k, dtype=np.float32)).tobytes())
                        continue
                    x = rng.standard_normal(k, dtype=np.float32) * np.float32(0.02)
                    x[rng.integers(0, k, size=max(1, k // 997))] *= np.float32(40.0)
                    b = x.view(np.uint32)
                    f.write(((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16).tobytes())
            off += n
        f.truncate(off)
    tmp.rename(out)


def daemon_pid(src: Path, mnt: Path) -> int:
    out = subprocess.run(["pgrep", "-f", f"xpackfs mount {src} {mnt}"], capture_output=True, text=True).stdout.split()
    return int(out[0])


def rss_kb(pid: int, key: str = "VmRSS:") -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith(key):
            return int(line.split()[1])
    return 0


def read_all(path: Path) -> int:
    fd = os.open(path, os.O_RDONLY)
    n = 0
    try:
        while chunk := os.read(fd, 1 << 20):
            n += len(chunk)
    finally:
        os.close(fd)
    return n


def same_bytes(a: Path, b: Path) -> bool:
    with open(a, "rb") as fa, open(b, "rb") as fb:
        while True:
            x, y = fa.read(1 << 24), fb.read(1 << 24)
            if x != y:
                return False
            if not x:
                return True


def cold_read(a, quantize: str) -> None:
    src = a.workdir / f"qwen3moe-L{a.layers}-E{a.experts}-H{a.hidden}-F{a.ff}-bf16.gguf"
    if not src.exists():
        print(f"writing {src.name} ...", flush=True)
        write_qwen3moe(src, False, a.layers, a.hidden, a.hidden // 128, 4, 128, a.experts, 8, a.ff, a.vocab)
    mnt = a.workdir / "mnt"
    mnt.mkdir(exist_ok=True)
    subprocess.run(["umount", str(mnt)], stderr=subprocess.DEVNULL)
    peer_out = Path("/dev/shm/xpackfs-bench-gguf-peer.gguf")
    name = f"{src.stem}-{a.ftype}.gguf"
    print(f"\ncold read of the virtual {a.ftype} file vs llama-quantize (llama.cpp 0c1e57098), "
          f"{src.stat().st_size / 1e9:.2f} GB BF16 qwen3moe ({a.layers} layers, {a.experts} experts, hidden {a.hidden}, "
          f"expert ff {a.ff}); medians of {a.rounds}, alternating")
    print("| threads | llama-quantize (s) | xpackfs mount + read (s) | xpackfs MB/s of output | ratio | bytes |")
    print("|---|---|---|---|---|---|")
    for threads in a.threads:
        peer_t, ours_t, size = [], [], 0
        for _ in range(a.rounds):
            subprocess.run(["sync"], check=True)
            drop(src)
            t0 = time.perf_counter()
            subprocess.run([quantize, str(src), str(peer_out), a.ftype, str(threads)], check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            peer_t.append(time.perf_counter() - t0)
            drop(src)
            t0 = time.perf_counter()
            subprocess.run([a.xpackfs, "mount", str(src), str(mnt), "-o",
                            f"view=gguf,ftype={a.ftype},digest_store=none,compute_threads={threads}"],
                           check=True, stderr=subprocess.DEVNULL)
            try:
                size = read_all(mnt / name)
                ours_t.append(time.perf_counter() - t0)
            finally:
                subprocess.run(["umount", str(mnt)], check=True)
        subprocess.run([a.xpackfs, "mount", str(src), str(mnt), "-o", f"view=gguf,ftype={a.ftype},digest_store=none"],
                       check=True, stderr=subprocess.DEVNULL)
        try:
            same = same_bytes(mnt / name, peer_out)
        finally:
            subprocess.run(["umount", str(mnt)], check=True)
        p, o = statistics.median(peer_t), statistics.median(ours_t)
        print(f"| {threads} | {p:.2f} ({min(peer_t):.2f}-{max(peer_t):.2f}) | {o:.2f} ({min(ours_t):.2f}-{max(ours_t):.2f}) "
              f"| {size / o / 1e6:.0f} | **{p / o:.2f}x** | {'identical' if same else 'DIFFER'} |", flush=True)
        peer_out.unlink(missing_ok=True)
        if not same:
            raise SystemExit("the mounted file differs from llama-quantize's")


def sparse_mount(a) -> None:
    # Qwen3-235B-A22B: 94 layers, hidden 4096, 64 query heads and 4 KV heads of 128, 128
    # experts (8 used) with ff 1536, vocabulary 151936.
    src = a.workdir / "qwen3-235b-a22b-shaped-bf16.gguf"
    if not src.exists():
        write_qwen3moe(src, True, 94, 4096, 64, 4, 128, 128, 8, 1536, 151936)
    mnt = a.workdir / "mnt-sparse"
    mnt.mkdir(exist_ok=True)
    subprocess.run(["umount", str(mnt)], stderr=subprocess.DEVNULL)
    o = f"view=gguf,ftype={a.ftype},digest_store=none"
    times, rss, hwm, files = [], 0, 0, {}
    for _ in range(3):
        subprocess.run(["sync"], check=True)
        drop(src)
        t0 = time.perf_counter()
        subprocess.run([a.xpackfs, "mount", str(src), str(mnt), "-o", o], check=True, stderr=subprocess.DEVNULL)
        try:
            files = {p.name: p.stat().st_size for p in mnt.iterdir()}
            times.append(time.perf_counter() - t0)  # mounted, listed and the file's size known
            pid = daemon_pid(src, mnt)
            rss, hwm = rss_kb(pid), rss_kb(pid, "VmHWM:")
        finally:
            subprocess.run(["umount", str(mnt)], check=True)
    print(f"\nmount of a sparse full-size BF16 GGUF, Qwen3-235B-A22B's shapes ({src.stat().st_size / 1e9:.0f} GB apparent), "
          f"view=gguf,ftype={a.ftype}: start-up {statistics.median(times):.3f} s (median of 3, {min(times):.3f}-{max(times):.3f}, "
          f"header page cache dropped), daemon RSS {rss / 1024:.1f} MiB (peak {hwm / 1024:.1f} MiB); serves "
          + ", ".join(f"{k} ({v / 1e9:.1f} GB)" for k, v in files.items() if not k.startswith(".")))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", type=Path, default=Path("/var/tmp/xpackfs-bench-gguf"))
    ap.add_argument("--xpackfs", default=str(REPO / "target/release/xpackfs"))
    ap.add_argument("--ftype", default="Q4_K_M")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", default=f"1,{os.cpu_count()}", type=lambda s: [int(x) for x in s.split(",")])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--ff", type=int, default=768)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--skip-sparse", action="store_true")
    ap.add_argument("--sparse-only", action="store_true")
    a = ap.parse_args()
    a.workdir.mkdir(parents=True, exist_ok=True)
    if not a.sparse_only:
        quantize = subprocess.run(["bash", str(REPO / "tools/llama_quantize_tool.sh")], check=True, capture_output=True,
                                  text=True).stdout.strip()
        cold_read(a, quantize)
    if not a.skip_sparse:
        sparse_mount(a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
