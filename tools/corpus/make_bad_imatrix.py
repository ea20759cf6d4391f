#!/usr/bin/env python3
"""Write a corpus of broken llama.cpp importance matrices and what the requant view must do.

    python3 tools/corpus/make_bad_imatrix.py OUTDIR
writes a valid DeepSeek V4 checkpoint (OUTDIR/base_v4, from tools/corpus/make_bad_safetensors.py),
importance matrices (OUTDIR/*.gguf: the GGUF format, OUTDIR/*.dat: legacy imatrix.dat;
special files under OUTDIR/special/) and OUTDIR/cases.json in the format of
tools/corpus/corpus_util.py: `-o view=requant,imatrix=FILE` on the base must be refused at mount
(and by materialize) with the rule, or succeed for the controls.
"""
from __future__ import annotations

import struct
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from corpus_util import Corpus, mkfifo, symlink  # noqa: E402
from make_bad_gguf import STR, F32T, gguf, kv  # noqa: E402
from make_bad_safetensors import V4, v4_checkpoint  # noqa: E402

L, E, H, I = V4["L"], V4["E"], V4["H"], V4["I"]
F16T = 1


def entries():
    """(llama.cpp entry name, row length k) for every routed-expert weight of the base."""
    for layer in range(L):
        for role, k in (("gate", H), ("up", H), ("down", I)):
            yield f"blk.{layer}.ffn_{role}_exps.weight", k


def sums(k: int, rows: int, seed: int) -> list[float]:
    return [1.0 + ((i * 13 + seed) % 17) / 4 for i in range(k * rows)]


def gguf_imatrix(patch=None, counts_patch=None, dtype=F32T, k_override=None, skip=()) -> bytes:
    tensors, data = [], {}
    for n, (name, k) in enumerate(entries()):
        if name in skip:
            continue
        k = k_override or k
        v = sums(k, E, n)
        c = [10.0] * E
        if patch and name in patch:
            for idx, val in patch[name]:
                v[idx] = val
        if counts_patch and name in counts_patch:
            for idx, val in counts_patch[name]:
                c[idx] = val
        tensors.append((f"{name}.in_sum2", [k, E], dtype))
        tensors.append((f"{name}.counts", [1, E], F32T))
        data[f"{name}.in_sum2"] = struct.pack(f"<{k * E}f", *v) if dtype == F32T else struct.pack(f"<{k * E}e", *v)
        data[f"{name}.counts"] = struct.pack(f"<{E}f", *c)
    return gguf(tensors, kvs=[kv("general.type", STR, "imatrix")], data=data)


def legacy(patch=None, ncall=10, count=None, name_len=None, nval=None) -> bytes:
    out = b""
    items = list(entries())
    for n, (name, k) in enumerate(items):
        v = sums(k, E, n)
        if patch and name in patch:
            for idx, val in patch[name]:
                v[idx] = val
        raw = name.encode()
        out += struct.pack("<i", name_len if name_len is not None and n == 0 else len(raw)) + raw
        out += struct.pack("<ii", ncall, nval if nval is not None and n == 0 else len(v)) + struct.pack(f"<{len(v)}f", *v)
    return struct.pack("<i", count if count is not None else len(items)) + out


def main() -> int:
    c = Corpus(Path(sys.argv[1]), "imatrix")
    out = c.out.resolve()
    v4_checkpoint(out / "base_v4")
    gate0 = "blk.0.ffn_gate_exps.weight"

    def case(name, file: str, rule, note=""):
        c.add(name, "base_v4", {"mount": rule, "materialize": rule}, options=[f"imatrix={out / file}"], views=["requant"], note=note)

    def write(file, data: bytes) -> str:
        c.path(file).write_bytes(data)
        return file

    case("ok_gguf", write("ok.gguf", gguf_imatrix()), "ok")
    case("ok_legacy", write("ok.dat", legacy()), "ok")
    # -- not a regular file: refused before it is opened for reading --
    mkfifo(out / "special/fifo.dat")
    case("fifo", "special/fifo.dat", "is a FIFO, not a regular file")
    symlink(out / "special/link_to_fifo.dat", "fifo.dat")
    case("symlink_to_fifo", "special/link_to_fifo.dat", "is a FIFO, not a regular file")
    c.add("dev_zero", "base_v4", {"mount": "/dev/zero: is a character device, not a regular file", "materialize": "/dev/zero: is a character device, not a regular file"},
          options=["imatrix=/dev/zero"], views=["requant"])
    (out / "special/dir.dat").mkdir(parents=True, exist_ok=True)
    case("directory", "special/dir.dat", "is a directory, not a regular file")
    case("missing", "special/none.dat", "No such file or directory")
    # -- GGUF imatrix content --
    case("gguf_nan_sum", write("nan_sum.gguf", gguf_imatrix(patch={gate0: [(H + 5, float("nan"))]})),
         f"{gate0} row 1: importance NaN at column 5 is not a finite number in 0..=1e30")
    case("gguf_negative_sum", write("neg_sum.gguf", gguf_imatrix(patch={gate0: [(7, -2.0)]})),
         f"{gate0} row 0: importance -0.2 at column 7 is not a finite number in 0..=1e30")
    case("gguf_inf_sum", write("inf_sum.gguf", gguf_imatrix(patch={"blk.1.ffn_down_exps.weight": [(3 * I, float("inf"))]})),
         "blk.1.ffn_down_exps.weight row 3: importance inf at column 0 is not a finite number in 0..=1e30")
    case("gguf_nan_count", write("nan_count.gguf", gguf_imatrix(counts_patch={gate0: [(2, float("nan"))]})),
         f"{gate0}: count NaN of row 2 is not a finite number in 0..=1e30")
    case("gguf_negative_count", write("neg_count.gguf", gguf_imatrix(counts_patch={gate0: [(1, -3.0)]})),
         f"{gate0}: count -3.0 of row 1 is not a finite number in 0..=1e30")
    case("gguf_inf_count", write("inf_count.gguf", gguf_imatrix(counts_patch={gate0: [(0, float("inf"))]})),
         f"{gate0}: count inf of row 0 is not a finite number in 0..=1e30")
    case("gguf_f16_sums", write("f16.gguf", gguf_imatrix(dtype=F16T)), f"{gate0}: sums and counts must be F32")
    case("gguf_short_rows", write("short.gguf", gguf_imatrix(k_override=128)), f"importance entry {gate0} has rows of 128, layers.0.ffn.experts.0.w1.weight needs 256")
    case("gguf_missing_entry", write("no_down.gguf", gguf_imatrix(skip={"blk.0.ffn_down_exps.weight"})),
         "no importance entry blk.0.ffn_down_exps.weight for layers.0.ffn.experts.0.w2.weight")
    t = [("blk.0.ffn_gate_exps.weight.in_sum2", [H, E], F32T)]
    case("gguf_sums_without_counts", write("no_counts.gguf", gguf(t, kvs=[kv("general.type", STR, "imatrix")])), f"{gate0}: in_sum2 without counts")
    case("gguf_not_imatrix", write("model.gguf", gguf([("output_norm.weight", [64], F32T)])), "no importance entries")
    case("gguf_bad_header", write("bad_header.gguf", b"GGUF" + struct.pack("<IQQ", 3, 1 << 40, 0)), "tensor count 1099511627776 exceeds the cap")
    # 16 M rows of one value (a 128 MB sparse file): the row count is capped before anything is read.
    p = c.path("many_rows.gguf")
    n = 1 << 24
    p.write_bytes(gguf([(f"{gate0}.in_sum2", [1, n], F32T), (f"{gate0}.counts", [n], F32T)], kvs=[kv("general.type", STR, "imatrix")]))
    with open(p, "r+b") as f:
        f.truncate(4096 + 2 * 4 * n)
    case("gguf_16m_rows", "many_rows.gguf", f"{gate0}: 16777216 rows, over the cap of 65536")
    # -- legacy imatrix.dat --
    case("legacy_nan", write("nan.dat", legacy(patch={gate0: [(2 * H + 9, float("nan"))]})),
         f"{gate0} row 2: importance NaN at column 9 is not a finite number in 0..=1e30")
    case("legacy_negative", write("neg.dat", legacy(patch={gate0: [(1, -1.0)]})),
         f"{gate0} row 0: importance -0.1 at column 1 is not a finite number in 0..=1e30")
    case("legacy_inf", write("inf.dat", legacy(patch={gate0: [(0, float("-inf"))]})),
         f"{gate0} row 0: importance -inf at column 0 is not a finite number in 0..=1e30")
    case("legacy_negative_ncall", write("neg_ncall.dat", legacy(ncall=-5)), f"entry {gate0}: ncall -5 is negative")
    case("legacy_huge_count", write("huge_count.dat", legacy(count=(1 << 31) - 1)), "entry count 2147483647 is not plausible")
    case("legacy_huge_name", write("huge_name.dat", legacy(name_len=(1 << 31) - 1)), "entry 0: bad name length 2147483647")
    case("legacy_huge_nval", write("huge_nval.dat", legacy(nval=(1 << 31) - 1)), f"entry {gate0}: 2147483647 values do not fit the file")
    many = struct.pack("<i", 100_000) + b"".join(struct.pack("<i", 8) + b"x%07d" % i + struct.pack("<iif", 1, 1, 1.0) for i in range(100_000))
    case("legacy_100k_entries", write("many.dat", many), "entry count 100000 exceeds the cap of 65536")
    case("empty", write("empty.dat", b""), "truncated at offset 0")
    case("text", write("notes.dat", b"this is not an importance matrix\n"), "is not plausible")
    # No rule expected (only: no panic, hang or memory blow-up): a row of zeros.
    c.add("gguf_zero_row", "base_v4", {}, options=[f"imatrix={out / write('zero_row.gguf', gguf_imatrix(patch={gate0: [(i, 0.0) for i in range(H)]}))}"], views=["requant"])
    case("gguf_huge_finite", write("huge.gguf", gguf_imatrix(patch={gate0: [(i, 3e38) for i in range(H)]})),
         f"{gate0} row 0: importance 3e37 at column 0 is not a finite number in 0..=1e30")
    c.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
