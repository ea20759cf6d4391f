#!/usr/bin/env python3
"""The reference ggml, through ctypes: golden vectors and differential tests for xpackfs's codecs.

The reference is libggml-base.so as `pip install llama-cpp-python==0.3.36` builds it
(x86-64 baseline, no -march, so no FMA), found via --lib, $XPACKFS_GGML_LIB, or the
installed llama_cpp package (llama_cpp/lib/libggml-base.so).

    python3 tools/peers/ggml_ref.py golden [--out tests/golden]
        regenerate the golden vectors that `cargo test` checks byte for byte
    python3 tools/peers/ggml_ref.py diff --rows 100000 [--seed 1] [--types q2_k,q2_k_imat,iq2_xxs,q8_0]
                                  (--types legacy: the Q4_0..Q5_1 and IQ4 variants, rows of 256
                                  and, for the 32-value types, every third batch rows of 32)
                                  [--levels scalar,avx2,avx512] [--k-rows 20000]
        randomized differential test of `xpackfs codec quantize` against the reference,
        over several distributions (adversarial ones included), at every SIMD level this
        CPU has (XPACKFS_SIMD=level; --levels to choose); prints mismatches and exits 1 if
        there are any
    python3 tools/peers/ggml_ref.py bench [--rows 4096]
        decoder throughput, xpackfs vs the numpy peers (gguf.quants.dequantize, the
        fourth seed's MXFP4 formula); quantisers vs ggml are in `cargo bench --bench codecs`

The K-quants (QUANT_K: q3_k, q4_k, q5_k, q6_k and their _imat variants) run --k-rows
rows each (edge_rows first) and have their golden records in tests/golden/quantize_k.bin.

Golden file format (little-endian), tests/golden/{quantize,dequantize}{,_legacy}.bin and
tests/golden/quantize_k.bin:
    b"XPG1", u32 record count, then per record:
    str name, str type, u32 n_per_row, u32 rows, u32 has_importance,
    bytes input, [f32 importance x n_per_row], bytes expected
    where str = u32 length + UTF-8 and bytes = u32 length + raw bytes.
    quantize: input = f32 rows, expected = ggml blocks (quantize_<type>).
    dequantize: input = ggml blocks, expected = f32 (dequantize_row_<type>), importance unused.
"""
from __future__ import annotations

import argparse
import ctypes
import os
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import gguf

REPO = Path(__file__).resolve().parents[2]
T = gguf.GGMLQuantizationType
QUANT = {  # name -> (ggml type, importance kind)
    "q8_0": (T.Q8_0, None),
    "q2_k": (T.Q2_K, None),
    "q2_k_imat": (T.Q2_K, "imatrix"),
    "q2_k_unit": (T.Q2_K, "unit"),
    "iq2_xxs": (T.IQ2_XXS, "imatrix"),
    "iq2_xxs_unit": (T.IQ2_XXS, "unit"),
}
# The K-quants Q3_K..Q6_K: golden records in their own file (quantize_k.bin), fewer
# differential rows (K_ROWS) to keep the test's time in bounds.
QUANT_K = {
    "q3_k": (T.Q3_K, None),
    "q3_k_imat": (T.Q3_K, "imatrix"),
    "q4_k": (T.Q4_K, None),
    "q4_k_imat": (T.Q4_K, "imatrix"),
    "q5_k": (T.Q5_K, None),
    "q5_k_imat": (T.Q5_K, "imatrix"),
    "q6_k": (T.Q6_K, None),
    "q6_k_imat": (T.Q6_K, "imatrix"),
}
QUANT.update(QUANT_K)
# The legacy 32-value types and the IQ4 ones: quantize_<type> with imatrix NULL ("qX_Y") and
# with one ("qX_Y_imat"). Their golden vectors are a separate, smaller file
# (tests/golden/quantize_legacy.bin, dequantize_legacy.bin), so the files above stay as they are.
LEGACY = {f"{t.name.lower()}{suffix}": (t, kind)
          for t in (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.IQ4_NL, T.IQ4_XS) for suffix, kind in (("", None), ("_imat", "imatrix"))}
# quantize.bin's variants: neither the K-quants (quantize_k.bin) nor these.
GOLDEN_QUANT = [q for q in QUANT if q not in QUANT_K]
QUANT.update(LEGACY)
DEQUANT = [T.Q8_0, T.Q2_K, T.Q4_K, T.Q6_K, T.IQ2_XXS, T.MXFP4, T.F16, T.BF16]


def find_lib(explicit: str | None) -> Path:
    candidates = [explicit, os.environ.get("XPACKFS_GGML_LIB")]
    try:
        import importlib.util
        spec = importlib.util.find_spec("llama_cpp")
        if spec and spec.origin:
            candidates.append(str(Path(spec.origin).parent / "lib" / "libggml-base.so"))
    except Exception:
        pass
    for c in candidates:
        if c and Path(c).is_file():
            return Path(c)
    raise SystemExit("reference libggml-base.so not found: pip install llama-cpp-python==0.3.36, or pass --lib / set XPACKFS_GGML_LIB")


class Ggml:
    def __init__(self, path: Path):
        self.lib = ctypes.CDLL(str(path))
        f32p, vp, i64 = ctypes.POINTER(ctypes.c_float), ctypes.c_void_p, ctypes.c_int64
        for name in ("quantize_q8_0", "quantize_q2_K", "quantize_iq2_xxs"):
            fn = getattr(self.lib, name)
            fn.argtypes = [f32p, vp, i64, i64, f32p]
            fn.restype = ctypes.c_size_t
        self.lib.ggml_quantize_init.argtypes = [ctypes.c_int]
        self.lib.ggml_quantize_init(int(T.IQ2_XXS))
        self.f32p = f32p

    def quantize(self, qtype: T, rows: np.ndarray, imatrix: np.ndarray | None) -> bytes:
        rows = np.ascontiguousarray(rows, dtype=np.float32)
        nrow, n = rows.shape
        bs, ts = gguf.GGML_QUANT_SIZES[qtype]
        out = ctypes.create_string_buffer(nrow * n // bs * ts)
        fn = getattr(self.lib, "quantize_" + qtype.name.lower().replace("_k", "_K"))
        fn.argtypes = [self.f32p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, self.f32p]
        fn.restype = ctypes.c_size_t
        imp = None
        if imatrix is not None:
            imatrix = np.ascontiguousarray(imatrix, dtype=np.float32)
            imp = imatrix.ctypes.data_as(self.f32p)
        fn(rows.ctypes.data_as(self.f32p), out, nrow, n, imp)
        return out.raw

    def dequantize(self, qtype: T, data: bytes) -> np.ndarray:
        bs, ts = gguf.GGML_QUANT_SIZES[qtype]
        n = len(data) // ts * bs
        out = np.zeros(n, dtype=np.float32)
        if qtype in (T.F16, T.BF16):
            fn = getattr(self.lib, "ggml_fp16_to_fp32_row" if qtype == T.F16 else "ggml_bf16_to_fp32_row")
        else:
            fn = getattr(self.lib, "dequantize_row_" + qtype.name.lower().replace("_k", "_K"))
        fn.argtypes = [ctypes.c_char_p, self.f32p, ctypes.c_int64]
        fn(data, out.ctypes.data_as(self.f32p), n)
        return out


def cpu_levels() -> list[str]:
    """The SIMD levels xpackfs can run here (its own detection: avx2 needs AVX2 + F16C,
    avx512 also AVX-512 F/BW/VL)."""
    flags: set[str] = set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        pass
    levels = ["scalar"]
    if {"avx2", "f16c"} <= flags:
        levels.append("avx2")
        if {"avx512f", "avx512bw", "avx512vl"} <= flags:
            levels.append("avx512")
    return levels


def xpackfs_quantize(binary: str, qtype: T, rows: np.ndarray, imatrix: np.ndarray | None, threads: int | None = None,
                     tmp: Path = Path("/tmp"), level: str | None = None) -> tuple[bytes, float]:
    cmd = [binary, "codec", "quantize", "--type", qtype.name, "--n-per-row", str(rows.shape[1])]
    if imatrix is not None:
        imp = tmp / f"xpackfs-imp-{os.getpid()}.f32"
        imp.write_bytes(np.ascontiguousarray(imatrix, dtype="<f4").tobytes())
        cmd += ["--importance", str(imp)]
    if threads:
        cmd += ["--threads", str(threads)]
    env = dict(os.environ)
    if level:
        env["XPACKFS_SIMD"] = level
    t0 = time.perf_counter()
    r = subprocess.run(cmd, input=np.ascontiguousarray(rows, dtype="<f4").tobytes(), capture_output=True, env=env)
    dt = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"xpackfs codec quantize failed: {r.stderr.decode()}")
    return r.stdout, dt


# ---------------------------------------------------------------- inputs

def edge_rows(n: int) -> list[tuple[str, np.ndarray]]:
    """Rows that stress the quantisers' corner cases (length n, a multiple of 256)."""
    i = np.arange(n, dtype=np.float32)
    rows = [
        ("zeros", np.zeros(n)),
        ("constant_pos", np.full(n, 0.37)),
        ("constant_neg", np.full(n, -1.25)),
        ("tiny_subnormal", np.full(n, 1e-40) * np.where(i % 3 == 0, -1, 1)),
        ("tiny_mixed", (np.sin(i) * 1e-38)),
        ("below_group_eps", np.full(n, 1e-16)),
        ("huge", np.cos(i) * 1e17),
        ("large", np.cos(i) * 1e12),
        ("single_outlier", np.where(i == 77, 1000.0, 0.0)),
        ("single_negative_outlier", np.where(i == 5, -3.0, 0.001)),
        ("outlier_in_noise", np.where(i == 200, 50.0, np.sin(i * 0.7) * 0.01)),
        ("alternating", np.where(i % 2 == 0, 1.0, -1.0)),
        ("ramp", i / n - 0.5),
        ("ramp_positive", i / n),
        ("integer_levels", (i % 4).astype(np.float32)),            # exact ties for 2-bit levels
        ("half_levels", (i % 4) * 0.5 + 0.25),                      # x.5 ties after scaling
        ("odd_levels", (2 * (i % 4) + 1) * np.where(i % 5 == 0, -1, 1)),  # IQ2 grid points
        ("odd_levels_flip_parity", (2 * (i % 4) + 1) * np.where(i % 8 == 0, -1, 1)),
        ("mostly_negative", -np.abs(np.sin(i)) + 0.01),
        ("sparse", np.where(i % 17 == 0, np.cos(i), 0.0)),
        ("two_values", np.where(i % 3 == 0, 2.0, -0.5)),
        ("power_of_two_edges", np.ldexp(np.ones(n), (i % 20 - 10).astype(int)) * np.where(i % 2 == 0, 1, -1)),
        ("near_power_below", np.nextafter(np.float32(2.0), np.float32(0)) * np.ones(n) * np.where(i % 7 == 0, -1, 1)),
    ]
    return [(name, np.asarray(r, dtype=np.float32)) for name, r in rows]


def random_rows(rng: np.random.Generator, dist: str, nrow: int, n: int) -> np.ndarray:
    shape = (nrow, n)
    if dist == "normal":
        x = rng.standard_normal(shape)
    elif dist == "uniform":
        x = rng.uniform(-1, 1, shape)
    elif dist == "laplace":
        x = rng.laplace(0, 1, shape)
    elif dist == "student_t2":
        x = rng.standard_t(2, shape)
    elif dist == "scaled_normal":
        x = rng.standard_normal(shape) * np.exp(rng.uniform(-20, 20, (nrow, 1)))
    elif dist == "sparse":
        x = rng.standard_normal(shape) * (rng.random(shape) < 0.05)
    elif dist == "quantized_grid":
        x = rng.integers(-4, 5, shape) * 0.125
    elif dist == "positive":
        x = np.abs(rng.standard_normal(shape))
    elif dist == "weights_like":
        x = rng.standard_normal(shape) * 0.02 + rng.standard_normal((1, n)) * 0.005
    # Adversarial: the lanes of one vector (16-value sub-blocks, 32-value blocks, rows) on
    # different paths.
    elif dist == "mixed_magnitudes":
        g = np.exp(rng.uniform(-25, 25, (nrow, n // 16, 1))) * (rng.random((nrow, n // 16, 1)) < 0.9)
        x = (rng.standard_normal((nrow, n // 16, 16)) * g).reshape(shape)
    elif dist == "denormal":
        tiny = rng.standard_normal(shape) * 1e-39
        x = np.where(rng.random((nrow, n // 32, 1)).repeat(32, axis=2).reshape(shape) < 0.7, tiny, rng.standard_normal(shape))
    elif dist == "ties":
        # Half-integer levels on a power-of-two scale, each 32-block led by 127 * scale
        # (Q8_0's d = scale exactly, so x.5 ties survive the scaling).
        e = np.exp2(rng.integers(-20, 20, (nrow, 1)).astype(np.float64))
        x = rng.integers(-16, 17, shape) * 0.5 * e
        x[:, ::32] = 127 * e * np.where(rng.random((nrow, n // 32)) < 0.5, 1, -1)
    elif dist == "constant_blocks":
        x = np.repeat(rng.standard_normal((nrow, n // 16)) * np.where(rng.random((nrow, n // 16)) < 0.2, 0, 1), 16, axis=1)
    elif dist == "extremes":
        # NaN- and infinity-free extremes. IQ2_XXS's reference aborts beyond ~1e17, so
        # callers cap it (see EXTREME_CAP).
        mags = np.array([3.0e38, 1.0e30, 1.0e12, 1.0, 1e-20, 1.2e-38, 1e-45, 0.0])
        x = mags[rng.integers(0, len(mags), shape)] * np.where(rng.random(shape) < 0.5, 1, -1) * rng.uniform(0.5, 1.0, shape)
    else:
        raise ValueError(dist)
    return x.astype(np.float32)


# The golden vectors use the first nine (the committed files are generated from exactly these).
GOLDEN_DISTS = ["normal", "uniform", "laplace", "student_t2", "scaled_normal", "sparse", "quantized_grid", "positive", "weights_like"]
DISTS = GOLDEN_DISTS + ["mixed_magnitudes", "denormal", "ties", "constant_blocks", "extremes"]
EXTREME_CAP = {T.IQ2_XXS: 1e12}


def importance_for(kind: str | None, rng: np.random.Generator, n: int) -> np.ndarray | None:
    if kind is None:
        return None
    if kind == "unit":
        return np.ones(n, dtype=np.float32)
    imp = np.exp(rng.normal(0, 2, n)).astype(np.float32)
    imp[rng.random(n) < 0.03] = 0.0
    return imp


# ---------------------------------------------------------------- golden

def put_str(out: bytearray, s: str) -> None:
    b = s.encode()
    out += struct.pack("<I", len(b)) + b


def put_bytes(out: bytearray, b: bytes) -> None:
    out += struct.pack("<I", len(b)) + b


def golden(ref: Ggml, outdir: Path) -> None:
    rng = np.random.default_rng(20261130)
    quant = bytearray(b"XPG1\0\0\0\0")
    count = 0
    for qname in GOLDEN_QUANT:
        qtype, kind = QUANT[qname]
        cases = [(f"{qname}/{name}", row[None, :]) for name, row in edge_rows(512)
                 # The reference aborts on IQ2_XXS rows this large (GGML_ASSERT(grid_index >= 0)).
                 if not (qtype == T.IQ2_XXS and name == "huge")]
        cases += [(f"{qname}/random_{d}", random_rows(rng, d, 6, 512)) for d in GOLDEN_DISTS]
        for name, rows in cases:
            imp = importance_for(kind, rng, rows.shape[1])
            expected = ref.quantize(qtype, rows, imp)
            put_str(quant, name)
            put_str(quant, qtype.name)
            quant += struct.pack("<III", rows.shape[1], rows.shape[0], imp is not None)
            put_bytes(quant, rows.astype("<f4").tobytes())
            if imp is not None:
                quant += imp.astype("<f4").tobytes()
            put_bytes(quant, expected)
            count += 1
    quant[4:8] = struct.pack("<I", count)
    deq = bytearray(b"XPG1\0\0\0\0")
    dcount = 0
    for qtype in DEQUANT:
        bs, ts = gguf.GGML_QUANT_SIZES[qtype]
        nblocks = 64
        if qtype in (T.F16, T.BF16):
            raw = rng.standard_normal(nblocks * 32).astype(np.float16 if qtype == T.F16 else np.float32)
            data = raw.tobytes() if qtype == T.F16 else (raw.view(np.uint32) >> 16).astype(np.uint16).tobytes()
        elif qtype == T.MXFP4:
            blocks = rng.integers(0, 256, (nblocks, ts), dtype=np.uint8)
            blocks[:, 0] = rng.integers(0, 255, nblocks)  # any E8M0 but 255 (NaN)
            data = blocks.tobytes()
        else:
            # Realistic blocks: quantised from random data (so fp16 scales are finite), plus raw random bytes
            # with the fp16 fields forced finite.
            rows = random_rows(rng, "normal", nblocks * bs // 256 if bs == 256 else nblocks * bs // 32, 256 if bs == 256 else 32)
            data = ref.quantize(qtype, rows, np.ones(rows.shape[1], np.float32) if qtype == T.IQ2_XXS else None)
        expected = ref.dequantize(qtype, data)
        if qtype not in (T.F16, T.BF16):
            gp = gguf.quants.dequantize(np.frombuffer(data, dtype=np.uint8).reshape(-1, ts), qtype).reshape(-1)
            ndiff = int(np.sum(gp.view(np.uint32) != expected.view(np.uint32)))
            print(f"dequantize {qtype.name}: gguf.quants.dequantize differs from the C reference in {ndiff} of {expected.size} values")
        put_str(deq, f"dequant/{qtype.name}")
        put_str(deq, qtype.name)
        deq += struct.pack("<III", bs, len(data) // ts, 0)
        put_bytes(deq, data)
        put_bytes(deq, expected.astype("<f4").tobytes())
        dcount += 1
    deq[4:8] = struct.pack("<I", dcount)
    outdir.mkdir(parents=True, exist_ok=True)
    (outdir / "quantize.bin").write_bytes(bytes(quant))
    (outdir / "dequantize.bin").write_bytes(bytes(deq))
    print(f"wrote {count} quantize and {dcount} dequantize records to {outdir}")
    golden_k(ref, outdir)


# Edge rows the importance variants' golden records carry (all of them cost too many bytes).
K_IMAT_EDGES = ["zeros", "constant_neg", "tiny_subnormal", "below_group_eps", "huge", "single_outlier", "integer_levels", "mostly_negative"]
K_GOLDEN_DISTS = ["student_t2", "scaled_normal", "weights_like"]


def golden_k(ref: Ggml, outdir: Path) -> None:
    """tests/golden/quantize_k.bin: the QUANT_K variants (rows of 256; every edge row for
    the reference paths, K_IMAT_EDGES for the importance paths, one row of each of
    K_GOLDEN_DISTS), and dequantize records for Q3_K and Q5_K; same format as above."""
    rng = np.random.default_rng(20270126)
    out = bytearray(b"XPG1\0\0\0\0")
    count = 0
    for qname, (qtype, kind) in QUANT_K.items():
        edges = [(name, row) for name, row in edge_rows(256) if kind is None or name in K_IMAT_EDGES]
        cases = [(f"{qname}/edge/{name}", row[None, :]) for name, row in edges]
        cases += [(f"{qname}/random_{d}", random_rows(rng, d, 1, 256)) for d in K_GOLDEN_DISTS]
        imp = importance_for(kind, rng, 256)
        if imp is not None:  # one importance vector per record: two records of several rows
            cases = [(f"{qname}/edge/{'+'.join(n for n, _ in edges)}", np.stack([r for _, r in edges])),
                     (f"{qname}/random_{'+'.join(K_GOLDEN_DISTS)}", np.concatenate([r for _, r in cases[len(edges):]]))]
        for name, rows in cases:
            put_str(out, name)
            put_str(out, qtype.name)
            out += struct.pack("<III", rows.shape[1], rows.shape[0], imp is not None)
            put_bytes(out, rows.astype("<f4").tobytes())
            if imp is not None:
                out += imp.astype("<f4").tobytes()
            put_bytes(out, ref.quantize(qtype, rows, imp))
            count += 1
    for qtype in (T.Q3_K, T.Q5_K):
        _, ts = gguf.GGML_QUANT_SIZES[qtype]
        data = bytearray(ref.quantize(qtype, random_rows(rng, "weights_like", 3, 256), None))
        raw = rng.integers(0, 256, (1, ts), dtype=np.uint8)  # any bits, fp16 fields finite
        dpos = {T.Q3_K: [108], T.Q5_K: [0, 2]}[qtype]
        for p in dpos:
            raw[:, p + 1] &= 0x3B
        data += raw.tobytes()
        put_str(out, f"dequant/{qtype.name}")
        put_str(out, qtype.name)
        out += struct.pack("<III", 256, len(data) // ts, 0)
        put_bytes(out, bytes(data))
        put_bytes(out, ref.dequantize(qtype, bytes(data)).astype("<f4").tobytes())
        count += 1
    out[4:8] = struct.pack("<I", count)
    (outdir / "quantize_k.bin").write_bytes(bytes(out))
    print(f"wrote {count} K-quant records ({len(out)} bytes) to {outdir / 'quantize_k.bin'}")


def golden_legacy(ref: Ggml, outdir: Path) -> None:
    """The LEGACY variants' golden vectors, kept small (under 150 KB): per variant one record
    of the edge rows, 32 values each (256 for IQ4_XS; the block holding the row's largest
    |value|), and one of a row of 64 values (256) per golden distribution (the first five
    for IQ4_XS); and 16 decoded blocks of each type (4 of IQ4_XS)."""
    rng = np.random.default_rng(20261201)
    quant = bytearray(b"XPG1\0\0\0\0")
    count = 0
    for qname, (qtype, kind) in LEGACY.items():
        bs = gguf.GGML_QUANT_SIZES[qtype][0]
        n_edge, n_rand, dists = (256, 256, GOLDEN_DISTS[:5]) if bs == 256 else (32, 64, GOLDEN_DISTS)
        edges = []
        for _, row in edge_rows(256):
            w = int(np.argmax(np.abs(row))) // n_edge * n_edge
            edges.append(row[w:w + n_edge])
        cases = [(f"{qname}/edge_rows", np.stack(edges)),
                 (f"{qname}/random", np.concatenate([random_rows(rng, d, 1, n_rand) for d in dists]))]
        for name, rows in cases:
            imp = importance_for(kind, rng, rows.shape[1])
            expected = ref.quantize(qtype, rows, imp)
            put_str(quant, name)
            put_str(quant, qtype.name)
            quant += struct.pack("<III", rows.shape[1], rows.shape[0], imp is not None)
            put_bytes(quant, rows.astype("<f4").tobytes())
            if imp is not None:
                quant += imp.astype("<f4").tobytes()
            put_bytes(quant, expected)
            count += 1
    quant[4:8] = struct.pack("<I", count)
    deq = bytearray(b"XPG1\0\0\0\0")
    dcount = 0
    for qtype in (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.IQ4_NL, T.IQ4_XS):
        bs, ts = gguf.GGML_QUANT_SIZES[qtype]
        nblocks = 4 if bs == 256 else 16
        rows = random_rows(rng, "normal", 2 if bs == 256 else 8, 2 * bs if bs == 256 else 64)
        data = ref.quantize(qtype, rows, None)[:nblocks * ts]
        expected = ref.dequantize(qtype, data)
        put_str(deq, f"dequant/{qtype.name}")
        put_str(deq, qtype.name)
        deq += struct.pack("<III", bs, nblocks, 0)
        put_bytes(deq, data)
        put_bytes(deq, expected.astype("<f4").tobytes())
        dcount += 1
    deq[4:8] = struct.pack("<I", dcount)
    outdir.mkdir(parents=True, exist_ok=True)
    (outdir / "quantize_legacy.bin").write_bytes(bytes(quant))
    (outdir / "dequantize_legacy.bin").write_bytes(bytes(deq))
    print(f"wrote {count} quantize and {dcount} dequantize records of the legacy and IQ4 types to {outdir}")


# ---------------------------------------------------------------- diff

def diff(ref: Ggml, binary: str, rows_total: int, seed: int, types: list[str], levels: list[str], batch: int = 4096,
         k_rows: int | None = None) -> int:
    """Each batch is quantised once by the reference and by xpackfs at every level.
    QUANT_K variants run at most `k_rows` rows, the first batch being edge_rows(256)."""
    rng = np.random.default_rng(seed)
    failures = 0
    print(f"levels: {', '.join(levels)}")
    all_rows = rows_total
    for qname in types:
        qtype, kind = QUANT[qname]
        bs, ts = gguf.GGML_QUANT_SIZES[qtype]
        done, t_ref = 0, 0.0
        mism = {lv: 0 for lv in levels}
        t_ours = {lv: 0.0 for lv in levels}
        per_dist: dict[str, int] = {}
        rows_total = min(all_rows, k_rows) if qname in QUANT_K and k_rows else all_rows
        edges = np.stack([r for _, r in edge_rows(256)]) if qname in QUANT_K else None
        nbatch = 0
        # Smaller batches for these, so that their smaller row counts still see every
        # distribution twice (and rows of 32 in both rounds).
        qbatch = min(batch, max(64, rows_total // (2 * len(DISTS)))) if qname in LEGACY else batch
        while done < rows_total:
            for dist in DISTS:
                if done >= rows_total:
                    break
                nrow = min(qbatch, rows_total - done)
                if edges is not None:
                    dist, rows, edges, n = "edge_rows", edges[:nrow], None, 256
                    nrow = rows.shape[0]
                else:
                    # The 32-value types also see rows of one block (the imatrix paths' sigma2 is per row).
                    n = 32 if qname in LEGACY and bs == 32 and nbatch % 3 == 2 else 256
                    nbatch += 1
                    rows = random_rows(rng, dist, nrow, n)
                cap = EXTREME_CAP.get(qtype)
                if cap is not None:
                    rows = np.clip(rows, -cap, cap)
                imp = importance_for(kind, rng, n)
                # The reference quantises on a thread while xpackfs runs at each level: ctypes
                # lets go of the GIL in the call, and the xpackfs processes leave a core idle
                # much of the time (start, pipes), so the test takes less wall time.
                ref_out: list = []

                def reference(rows=rows, imp=imp, qtype=qtype, out=ref_out):
                    t0 = time.perf_counter()
                    try:
                        out.append(ref.quantize(qtype, rows, imp))
                    except BaseException as e:  # re-raised below, on the main thread
                        out.append(e)
                    out.append(time.perf_counter() - t0)

                worker = threading.Thread(target=reference)
                worker.start()
                ours = {}
                try:
                    for lv in levels:
                        ours[lv] = xpackfs_quantize(binary, qtype, rows, imp, level=lv)
                finally:
                    worker.join()
                if isinstance(ref_out[0], BaseException):
                    raise ref_out[0]
                want, dt_ref = ref_out
                t_ref += dt_ref
                rb = n // bs * ts
                for lv in levels:
                    got, dt = ours[lv]
                    t_ours[lv] += dt
                    if got == want:
                        continue
                    for r in range(nrow):
                        if want[r * rb:(r + 1) * rb] != got[r * rb:(r + 1) * rb]:
                            mism[lv] += 1
                            per_dist[f"{lv}/{dist}"] = per_dist.get(f"{lv}/{dist}", 0) + 1
                            if mism[lv] <= 5:
                                print(f"MISMATCH {qname} level={lv} dist={dist} row={r}: x[:8]={rows[r, :8].tolist()}")
                                print(f"  reference {want[r * rb:(r + 1) * rb].hex()}")
                                print(f"  xpackfs   {got[r * rb:(r + 1) * rb].hex()}")
                done += nrow
        counts = ", ".join(f"{lv} {mism[lv]} mismatches ({t_ours[lv]:.1f}s)" for lv in levels)
        print(f"{qname}: {done} rows of {'256 and 32' if qname in LEGACY and bs == 32 else 256} per level over {len(DISTS)} distributions, seed {seed}: {counts} {per_dist or ''}"
              f"  (reference {t_ref:.1f}s; xpackfs times include process start and pipes)")
        failures += sum(mism.values())
    return 1 if failures else 0


# ---------------------------------------------------------------- bench

def bench(ref: Ggml, binary: str, nrows: int) -> None:
    """Decoders: xpackfs (one thread, timed in-process by `codec dequantize --time`)
    against the numpy peers (gguf.quants.dequantize, and the fourth seed's decode_mxfp4
    formula for DeepSeek MXFP4) on the same blocks. Quantisers: see `cargo bench`."""
    rng = np.random.default_rng(7)
    n = nrows * 4096
    print(f"decoders, {n / 1e6:.0f}M values, best of 3 (M values/s)")
    print(f"{'type':<18} {'numpy':>9} {'xpackfs':>9} {'ratio':>7}")
    for qtype in [T.Q8_0, T.Q2_K, T.Q4_K, T.Q6_K, T.IQ2_XXS, T.MXFP4]:
        bs, ts = gguf.GGML_QUANT_SIZES[qtype]
        if qtype == T.MXFP4:
            blocks = rng.integers(0, 256, (n // bs, ts), dtype=np.uint8)
            blocks[:, 0] = rng.integers(100, 150, n // bs)
        else:
            rows = random_rows(rng, "weights_like", nrows, 4096)
            blocks = np.frombuffer(ref.quantize(qtype, rows, np.ones(4096, np.float32) if qtype == T.IQ2_XXS else None),
                                   dtype=np.uint8).reshape(-1, ts)
        t_np = min(timed(lambda: gguf.quants.dequantize(blocks, qtype)) for _ in range(3))
        r = subprocess.run([binary, "codec", "dequantize", "--type", qtype.name, "--time"], input=blocks.tobytes(),
                           capture_output=True)
        assert r.returncode == 0, r.stderr
        t_ours = float(r.stderr.decode().strip().splitlines()[-1])
        print(f"{qtype.name:<18} {n / 1e6 / t_np:>9.0f} {n / 1e6 / t_ours:>9.0f} {t_np / t_ours:>7.2f}")
    # DeepSeek-layout MXFP4, the seed's numpy formula vs xpackfs (in-process figure from `cargo bench`).
    weight = rng.integers(0, 256, (nrows, 2048), dtype=np.uint8)
    scale = rng.integers(100, 150, (nrows, 128), dtype=np.uint8)
    table = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6], dtype=np.float32)
    def seed_decode():
        out = np.empty((nrows, 4096), dtype=np.float32)
        out[:, 0::2] = table[weight & 0x0F]
        out[:, 1::2] = table[(weight >> 4) & 0x0F]
        return out * np.repeat(np.exp2(scale.astype(np.int16) - np.int16(127)).astype(np.float32), 32, axis=-1)
    t_seed = min(timed(seed_decode) for _ in range(3))
    print(f"{'MXFP4 (DeepSeek)':<18} {n / 1e6 / t_seed:>9.0f} {'(cargo bench)':>9}")


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=["golden", "diff", "bench"])
    ap.add_argument("--lib")
    ap.add_argument("--out", type=Path, default=REPO / "tests" / "golden")
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--types", default="q8_0,q2_k,q2_k_imat,q2_k_unit,iq2_xxs,iq2_xxs_unit," + ",".join(QUANT_K))
    ap.add_argument("--k-rows", type=int, default=20_000, help="rows per QUANT_K variant (at most --rows)")
    ap.add_argument("--xpackfs", default=str(REPO / "target" / "release" / "xpackfs"))
    ap.add_argument("--levels", default=",".join(cpu_levels()), help="SIMD levels to test (default: all this CPU has)")
    args = ap.parse_args()
    ref = Ggml(find_lib(args.lib))
    if args.mode == "golden":
        golden(ref, args.out)
        golden_legacy(ref, args.out)
        return 0
    if args.mode == "diff":
        types = [t for name in args.types.split(",") for t in (list(LEGACY) if name == "legacy" else [name])]
        return diff(ref, args.xpackfs, args.rows, args.seed, types, args.levels.split(","), k_rows=args.k_rows)
    bench(ref, args.xpackfs, args.rows if args.rows != 100_000 else 4096)
    return 0


if __name__ == "__main__":
    sys.exit(main())
