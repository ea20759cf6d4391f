#!/usr/bin/env python3
"""Write a corpus of broken GGUF sources and what each must produce.

    python3 tools/corpus/make_bad_gguf.py OUTDIR
writes OUTDIR/<case>.gguf (special files, FIFOs and links to devices, under OUTDIR/special/,
split sets under OUTDIR/split/) and OUTDIR/cases.json in the format of tools/corpus/corpus_util.py:
per case the rule each entry point must report (a substring naming the rule, and the tensor
where there is one). GGUF is written byte by byte here (not with GGUFWriter) so that every
field can be made wrong.
"""
from __future__ import annotations

import os
import random
import struct
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from corpus_util import Corpus, mkfifo, refused_everywhere, symlink  # noqa: E402

U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
# ggml type id -> (name, elements per block, bytes per block)
GGML = {0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 8: ("Q8_0", 32, 34), 10: ("Q2_K", 256, 84),
        11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210),
        15: ("Q8_K", 256, 292), 16: ("IQ2_XXS", 256, 66), 19: ("IQ1_S", 256, 50), 23: ("IQ4_XS", 256, 136),
        24: ("I8", 1, 1), 28: ("F64", 1, 8), 30: ("BF16", 1, 2), 35: ("TQ2_0", 256, 66), 39: ("MXFP4", 32, 17),
        40: ("NVFP4", 64, 36)}
TYPE_ID = {v[0]: k for k, v in GGML.items()}
MXFP4, F32T, Q8_0 = 39, 0, 8
# What the kt-int8 view decodes (src/codec/mod.rs `dequantize`).
KT_INT8_DECODABLE = "F32, F16, BF16, Q8_0, Q2_K, Q4_K, Q6_K, IQ2_XXS, MXFP4"


def s(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


def kv(key, vtype, value) -> bytes:
    fmt = {U8: "B", I8: "b", U16: "H", I16: "h", U32: "I", I32: "i", F32: "f", BOOL: "?", U64: "Q", I64: "q", F64: "d"}
    body = s(value) if vtype == STR else struct.pack("<" + fmt[vtype], value)
    return s(key) + struct.pack("<I", vtype) + body


def nbytes(ne, t):
    if t not in GGML:
        return 0
    _, bs, ts = GGML[t]
    n = 1
    for d in ne:
        n *= d
    return n // bs * ts


def tensor_data(size: int, t: int, seed: int) -> bytes:
    """Contents that decode to finite values: MXFP4 blocks get E8M0 scales near 1, F32 small floats."""
    if t == MXFP4:
        r = random.Random(seed)
        out = bytearray()
        for _ in range(size // 17):
            out.append(r.randrange(118, 130))
            out += bytes(r.randrange(256) for _ in range(16))
        return bytes(out)
    if t == F32T:
        return struct.pack(f"<{size // 4}f", *[((i * 37 + seed) % 101 - 50) / 64 for i in range(size // 4)])
    return bytes((i * 7 + 3 + seed) % 251 for i in range(size))


def gguf(tensors, kvs=None, version=3, alignment=32, magic=b"GGUF", data_pad=0, counts=None, offsets=None, data=None):
    """tensors: [(name, ne, type)]; offsets default to the packed running sum; data: {name: bytes}."""
    kvs = kvs if kvs is not None else [kv("general.architecture", STR, "deepseek2")]
    infos, off, placed = b"", 0, []
    for i, (name, ne, t) in enumerate(tensors):
        o = offsets[i] if offsets else off
        infos += s(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", d) for d in ne) + struct.pack("<IQ", t, o)
        size = nbytes(ne, t)
        if o + size < 1 << 24:  # absurd sizes are the point of some cases: do not allocate them
            placed.append((o, size, t, name))
        off = (o + size + alignment - 1) // alignment * alignment
    n_t, n_kv = counts if counts else (len(tensors), len(kvs))
    head = magic + struct.pack("<IQQ", version, n_t, n_kv) + b"".join(kvs) + infos
    pad = (-len(head)) % alignment
    body = bytearray(max([o + size for o, size, _, _ in placed], default=0) + data_pad)
    for k, (o, size, t, name) in enumerate(placed):
        chunk = (data or {}).get(name) or tensor_data(size, t, k)
        body[o:o + size] = chunk[:size]
    return head + b"\0" * pad + bytes(body)


def experts(layers=2, e=4, h=64, ff=32, t=MXFP4, skip=(), override=None, first_layer=0):
    out = []
    for layer in range(first_layer, first_layer + layers):
        for role in ("gate", "up", "down"):
            name = f"blk.{layer}.ffn_{role}_exps.weight"
            if name in skip:
                continue
            ne = [h, ff, e] if role != "down" else [ff, h, e]
            if override and name in override:
                ne = override[name]
            out.append((name, ne, t))
    return out


def arch(*extra):
    return [kv("general.architecture", STR, "deepseek2"), *extra]


def main() -> int:
    c = Corpus(Path(sys.argv[1]), "gguf")
    out = c.out
    good = gguf(experts() + [("output_norm.weight", [64], F32T)])
    EP = ["auto", "expert-pack"]  # where the expert-pack rules apply (auto is expert-pack for GGUF)
    KT = ["kt-int8"]

    def parser(name, data, rule, options=()):
        """Refused by the GGUF reader: by every view, and by digest; the message names the file."""
        c.path(f"{name}.gguf").write_bytes(data)
        c.add(name, f"{name}.gguf", refused_everywhere(rule), options=options, names=f"{name}.gguf")

    def view(name, data, rule, views, options=(), mount=None, materialize=None):
        c.path(f"{name}.gguf").write_bytes(data)
        c.add(name, f"{name}.gguf", {"mount": mount or rule, "materialize": materialize or rule}, views=views, options=options)

    # -- the header reader (src/source/gguf.rs) --
    parser("bad_magic", b"GGUX" + good[4:], "bad magic")
    parser("version_1", good[:4] + struct.pack("<I", 1) + good[8:], "unsupported GGUF version 1")
    parser("version_4", good[:4] + struct.pack("<I", 4) + good[8:], "unsupported GGUF version 4")
    parser("empty", b"", "truncated: magic")
    parser("truncated_in_counts", good[:20], "truncated: metadata count")
    parser("truncated_in_kv", good[:40], "truncated")
    parser("truncated_data", good[:-100], "beyond the end of the file")
    parser("huge_tensor_count", gguf(experts(), counts=(1 << 60, 1)), "tensor count 1152921504606846976 exceeds the cap of 65536")
    parser("huge_kv_count", gguf(experts(), counts=(6, 1 << 40)), "metadata count 1099511627776 exceeds the cap of 65536")
    parser("tensor_count_beyond_file", gguf(experts(), counts=(60000, 1)), "tensor count 60000 cannot fit in the")
    parser("huge_string", gguf(experts(), kvs=[b"\xff" * 8 + b"k"]), "string length 18446744073709551615 exceeds the cap")
    parser("huge_array", gguf(experts(), kvs=[s("a") + struct.pack("<IIQ", ARR, U32, 1 << 61)]), "array of 2305843009213693952 elements cannot fit")
    parser("nested_array", gguf(experts(), kvs=[s("a") + struct.pack("<IIQ", ARR, ARR, 1)]), "nested arrays are not allowed")
    parser("unknown_value_type", gguf(experts(), kvs=[s("k") + struct.pack("<I", 13)]), "unknown value type 13")
    parser("unknown_array_type", gguf(experts(), kvs=[s("k") + struct.pack("<IIQ", ARR, 13, 1)]), "unknown array element type 13")
    parser("bad_bool", gguf(experts(), kvs=[s("k") + struct.pack("<IB", BOOL, 2)]), "bool value 2")
    parser("bad_utf8_key", gguf(experts(), kvs=[s(b"k\xff") + struct.pack("<IB", U8, 1)]), "not valid UTF-8")
    parser("bad_utf8_value", gguf(experts(), kvs=[s("k") + struct.pack("<I", STR) + s(b"\xc3\x28")]), "not valid UTF-8")
    parser("duplicate_key", gguf(experts(), kvs=[kv("k", U8, 1), kv("k", U8, 2)]), "duplicate metadata key \"k\"")
    parser("alignment_not_pow2", gguf(experts(), kvs=[kv("general.alignment", U32, 48)]), "general.alignment must be a UINT32 power of two")
    parser("alignment_zero", gguf(experts(), kvs=[kv("general.alignment", U32, 0)]), "general.alignment must be a UINT32 power of two")
    parser("alignment_wrong_type", gguf(experts(), kvs=[kv("general.alignment", U64, 32)]), "general.alignment must be a UINT32 power of two")
    parser("alignment_2g", gguf(experts(), kvs=[kv("general.alignment", U32, 1 << 31)]), "truncated: the data section starts at 2147483648")
    parser("unknown_ggml_type", gguf(experts() + [("x.weight", [32], 4)]), "tensor \"x.weight\": unknown ggml type id 4")
    parser("ggml_type_huge", gguf(experts() + [("x.weight", [32], 0xFFFFFFFF)]), "tensor \"x.weight\": unknown ggml type id 4294967295")
    parser("name_too_long", gguf(experts() + [("n" * 64, [4], F32T)]), "name is 64 bytes")
    parser("duplicate_tensor", gguf(experts() + [("o.weight", [4], F32T), ("o.weight", [4], F32T)]), "tensor \"o.weight\": duplicate tensor name")
    parser("five_dims", gguf(experts() + [("x.weight", [1, 1, 1, 1, 1], F32T)]), "tensor \"x.weight\": 5 dimensions")
    parser("zero_dims", gguf(experts() + [("x.weight", [], F32T)]), "tensor \"x.weight\": 0 dimensions")
    info = s("x.weight") + struct.pack("<I", 0xFFFFFFFF) + struct.pack("<Q", 1) * 8
    parser("huge_dims_count", b"GGUF" + struct.pack("<IQQ", 3, 1, 1) + kv("general.architecture", STR, "deepseek2") + info, "tensor \"x.weight\": 4294967295 dimensions")
    parser("block_mismatch", gguf(experts() + [("q.weight", [33, 2], Q8_0)]), "tensor \"q.weight\": first dimension 33 is not a multiple of the Q8_0 block size 32")
    parser("size_overflow", gguf(experts() + [("big.weight", [1 << 40, 1 << 40], F32T)]), "tensor \"big.weight\": byte size of shape")
    # A row whose byte size overflows is an overflow, not a block-size problem (F32's block is 1).
    parser("row_bytes_overflow", gguf(experts() + [("wide.weight", [1 << 62, 1], F32T)]), "tensor \"wide.weight\": row byte size overflows: first dimension 4611686018427387904 of F32")
    parser("element_overflow", gguf(experts() + [("big.weight", [1, 1 << 32, 1 << 32, 1 << 32], F32T)]), "tensor \"big.weight\": element count overflows")
    parser("misaligned_offset", gguf([("a.weight", [8], F32T)], offsets=[4]), "tensor \"a.weight\": offset 4 is not a multiple of the alignment 32")
    parser("out_of_bounds", gguf([("a.weight", [8], F32T)], offsets=[1 << 40]), "tensor \"a.weight\": data [")
    parser("offset_overflow", gguf([("a.weight", [8], F32T)], offsets=[(1 << 64) - 32]), "tensor \"a.weight\": offset overflows")
    parser("overlapping", gguf([("a.weight", [64], F32T), ("b.weight", [64], F32T)], offsets=[0, 128]), "overlaps tensor \"a.weight\"")
    # Header sizes against the caps (memory for a refused input stays small).
    # 64 M-element array: refused at the header cap (the zeros are a hole in a sparse file).
    with open(c.path("array_64m_elements.gguf"), "wb") as f:
        f.write(b"GGUF" + struct.pack("<IQQ", 3, 0, 2) + kv("general.architecture", STR, "deepseek2")
                + s("tokenizer.ggml.scores") + struct.pack("<IIQ", ARR, U8, 64 << 20))
        f.truncate(f.tell() + (64 << 20))
    c.add("array_64m_elements", "array_64m_elements.gguf", refused_everywhere("header exceeds the 67108864 byte cap"), names="array_64m_elements.gguf")
    # 40 arrays of 1 M elements (a 40 MB header, the zeros written as holes): valid and within
    # the caps; the values beyond the kept budget are parsed, not kept: bounded memory.
    tensors = experts()
    with open(c.path("kept_arrays_40m.gguf"), "wb") as f:
        f.write(b"GGUF" + struct.pack("<IQQ", 3, len(tensors), 41) + kv("general.architecture", STR, "deepseek2"))
        for i in range(40):
            f.write(s(f"a{i}") + struct.pack("<IIQ", ARR, I8, 1 << 20))
            f.seek(1 << 20, os.SEEK_CUR)
        off = 0
        for name, ne, ty in tensors:
            f.write(s(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", d) for d in ne) + struct.pack("<IQ", ty, off))
            off += (nbytes(ne, ty) + 31) // 32 * 32
        f.write(b"\0" * ((-f.tell()) % 32))
        for k, (name, ne, ty) in enumerate(tensors):
            f.write(tensor_data(nbytes(ne, ty), ty, k).ljust((nbytes(ne, ty) + 31) // 32 * 32, b"\0"))
    c.add("kept_arrays_40m", "kept_arrays_40m.gguf", {"mount": "ok", "digest": "ok"}, views=EP,
          note="40 arrays of 1 M elements (40 MB of header): valid, within the caps; must mount in bounded memory")
    tens = b"".join(s(f"t{i}") + struct.pack("<IQIQ", 1, 0, F32T, 0) for i in range(300_000))
    parser("tensors_300k", b"GGUF" + struct.pack("<IQQ", 3, 300_000, 1) + kv("general.architecture", STR, "deepseek2") + tens, "tensor count 300000 exceeds the cap of 65536")
    kvs = b"".join(kv(f"k{i}", U8, 1) for i in range(100_000))
    parser("kv_100k", b"GGUF" + struct.pack("<IQQ", 3, 0, 100_000) + kvs, "metadata count 100000 exceeds the cap of 65536")

    # -- special files: refused before they are opened for reading (no open() blocking on a FIFO) --
    mkfifo(out / "special/fifo.gguf")
    c.add("fifo_source", "special/fifo.gguf", refused_everywhere("is a FIFO, not a regular file"), names="fifo.gguf")
    (out / "special/real.gguf").write_bytes(good)
    symlink(out / "special/link_to_fifo.gguf", "fifo.gguf")
    c.add("symlink_to_fifo", "special/link_to_fifo.gguf", refused_everywhere("is a FIFO, not a regular file"))
    symlink(out / "special/dev_zero.gguf", "/dev/zero")
    c.add("symlink_to_dev_zero", "special/dev_zero.gguf", refused_everywhere("is a character device, not a regular file"))
    symlink(out / "special/dangling.gguf", "does-not-exist.gguf")
    c.add("dangling_symlink", "special/dangling.gguf", {"mount": "No such file or directory", "materialize": "No such file or directory", "digest": "No such file or directory"})
    symlink(out / "special/link_to_real.gguf", "real.gguf")
    c.add("symlink_to_regular", "special/link_to_real.gguf", {"mount": "ok", "digest": "ok"}, views=EP, note="symlinks to regular files are fine")

    # -- split sets (src/source/gguf.rs: split naming) --
    def split_set(d: str, parts: int, skip=()):
        tensors = experts()
        per = -(-len(tensors) // parts)
        for i in range(parts):
            name = f"{d}/m-{i + 1:05d}-of-{parts:05d}.gguf"
            if i + 1 in skip:
                continue
            kvs = arch(kv("split.no", U16, i), kv("split.count", U16, parts), kv("split.tensors.count", I32, len(tensors)))
            c.path(name).write_bytes(gguf(tensors[i * per:(i + 1) * per], kvs=kvs))
    split_set("split/ok", 3)
    c.add("split_ok", "split/ok/m-00002-of-00003.gguf", {"mount": "ok", "digest": "ok"}, views=EP)
    split_set("split/part0", 3)
    (out / "split/part0/m-00000-of-00003.gguf").write_bytes(good)
    c.add("split_part_0", "split/part0/m-00000-of-00003.gguf", refused_everywhere("split part number 0 is out of range 1..=3"))
    split_set("split/part4", 3)
    (out / "split/part4/m-00004-of-00003.gguf").write_bytes(good)
    c.add("split_part_4_of_3", "split/part4/m-00004-of-00003.gguf", refused_everywhere("split part number 4 is out of range 1..=3"))
    split_set("split/count0", 1)
    (out / "split/count0/m-00001-of-00000.gguf").write_bytes(good)
    c.add("split_count_0", "split/count0/m-00001-of-00000.gguf", refused_everywhere("split count 0 is out of range"))
    split_set("split/missing", 3, skip={2})
    c.add("split_missing_part", "split/missing/m-00001-of-00003.gguf", refused_everywhere("part of a 3-file split set is missing"))
    split_set("split/fifo", 3, skip={2})
    mkfifo(out / "split/fifo/m-00002-of-00003.gguf")
    c.add("split_fifo_part", "split/fifo/m-00001-of-00003.gguf", refused_everywhere("is a FIFO, not a regular file"), names="m-00002-of-00003.gguf")
    split_set("split/linkfifo", 3, skip={3})
    mkfifo(out / "split/linkfifo/pipe")
    symlink(out / "split/linkfifo/m-00003-of-00003.gguf", "pipe")
    c.add("split_symlinked_fifo_part", "split/linkfifo/m-00001-of-00003.gguf", refused_everywhere("is a FIFO, not a regular file"), names="m-00003-of-00003.gguf")
    split_set("split/badkeys", 2)
    p = out / "split/badkeys/m-00002-of-00002.gguf"
    p.write_bytes(gguf(experts()[3:], kvs=arch(kv("split.no", U16, 0), kv("split.count", U16, 2))))
    c.add("split_keys_disagree", "split/badkeys/m-00001-of-00002.gguf", refused_everywhere("expected 1 of 2 from the file name"))

    # -- the expert-pack view (src/view/expert_pack/mod.rs) --
    view("no_experts", gguf([("output_norm.weight", [64], F32T)]), "no routed-expert tensors", EP)
    view("missing_role", gguf(experts(skip={"blk.1.ffn_up_exps.weight"})), "routed-expert tensors missing (1): blk.1.ffn_up_exps.weight", EP)
    view("layer_gap", gguf([t for t in experts(layers=3) if not t[0].startswith("blk.1.")]), "missing (3): blk.1.ffn_gate_exps.weight", EP)
    view("duplicate_role", gguf(experts() + [("blk.01.ffn_gate_exps.weight", [64, 32, 4], MXFP4)]), "duplicate routed-expert tensor for layer 1 role gate", EP)
    view("unequal_roles", gguf(experts(override={"blk.0.ffn_down_exps.weight": [64, 64, 4]})), "triplet v1 requires uniform role sizes", EP)
    view("unequal_experts", gguf(experts(override={"blk.1.ffn_up_exps.weight": [64, 32, 8]})), "blk.1.ffn_up_exps.weight: 8 experts, but other expert tensors have 4", EP)
    view("two_dim_expert", gguf(experts(override={"blk.0.ffn_gate_exps.weight": [64, 128]})), "blk.0.ffn_gate_exps.weight: expected a 3-dimensional expert tensor", EP)
    view("metadata_expert_count", gguf(experts(), kvs=arch(kv("deepseek2.expert_count", U32, 16))), "metadata expert_count is 16 but the expert tensors hold 4", EP)
    view("num_layers_option", good, "option num_layers: 5 disagrees with the source", EP, options=["num_layers=5"])
    view("num_experts_option", good, "option num_experts: 3 disagrees with the source", EP, options=["num_experts=3"])
    view("source_sha_option", good, "source sha256 mismatch: expected " + "ab" * 32, EP, options=["source_sha256=" + "ab" * 32])
    view("top_k_option", good, "option top_k: 9 must be between 1 and the expert count 4", EP, options=["top_k=9"])
    view("top_k_zero_option", good, "'--top-k <TOP_K>': 0 must be an integer from 1 to 65536", EP, options=["top_k=0"])
    view("expert_used_count_zero", gguf(experts(), kvs=arch(kv("deepseek2.expert_used_count", U32, 0))),
         "GGUF metadata deepseek2.expert_used_count is 0, not between 1 and the expert count 4", EP)
    view("layer_index_u32_max", gguf(experts(layers=1, first_layer=0xFFFFFFFF)), "blk.4294967295.ffn_gate_exps.weight: layer index 4294967295 is beyond any real model (at most 4095)", EP)
    view("layer_index_70000", gguf(experts(layers=1, first_layer=70000)), "blk.70000.ffn_gate_exps.weight: layer index 70000 is beyond any real model (at most 4095)", EP)
    view("zero_sized_ff", gguf(experts(ff=0)), "blk.0.ffn_gate_exps.weight: expected a 3-dimensional expert tensor without zero dimensions, shape is [64, 0, 4]", EP)
    view("zero_experts", gguf(experts(e=0)), "blk.0.ffn_gate_exps.weight: expected a 3-dimensional expert tensor without zero dimensions, shape is [64, 32, 0]", EP)
    view("experts_70000", gguf(experts(layers=1, e=70000, h=1, ff=1, t=F32T)), "layer and expert numbers must fit the index's u16 fields", EP)
    c.path("good.gguf").write_bytes(good)
    c.add("good", "good.gguf", {"mount": "ok", "materialize": "ok", "digest": "ok"}, views=EP)

    # -- the kt-int8 view of GGUF experts (src/view/kt_int8/mod.rs) --
    good_int8 = gguf(experts(h=128, ff=64) + [("output_norm.weight", [128], F32T)])
    c.path("good_int8.gguf").write_bytes(good_int8)
    c.add("good_int8", "good_int8.gguf", {"mount": "ok", "materialize": "ok", "digest": "ok"}, views=EP + KT)
    view("int8_zero_experts", gguf(experts(e=0, h=128, ff=64)), "kt-int8: blk.0.ffn_gate_exps.weight: expected 3 non-zero dimensions, shape is [128, 64, 0]", KT)
    view("int8_zero_ff", gguf(experts(h=128, ff=0)), "kt-int8: blk.0.ffn_gate_exps.weight: expected 3 non-zero dimensions, shape is [128, 0, 4]", KT)
    view("int8_zero_experts_huge_dims", gguf(experts(e=0, h=1 << 20, ff=1 << 20)), "kt-int8: blk.0.ffn_gate_exps.weight: expected 3 non-zero dimensions, shape is [1048576, 1048576, 0]", KT)
    view("int8_down_like_gate", gguf(experts(h=128, ff=64, override={"blk.0.ffn_down_exps.weight": [128, 64, 4]})),
         "kt-int8: blk.0.ffn_down_exps.weight: the down matrix is 64x128, but blk.0.ffn_gate_exps.weight makes gate/up 64x128 and down 128x64", KT)
    view("int8_swapped_layers", gguf(experts(layers=1, h=128, ff=64) + experts(layers=1, h=64, ff=128, first_layer=1)),
         "kt-int8: blk.1.ffn_gate_exps.weight: the gate matrix is 128x64, but blk.0.ffn_gate_exps.weight makes gate/up 64x128", KT)
    view("int8_gate_up_differ", gguf(experts(h=128, ff=64, override={"blk.0.ffn_up_exps.weight": [128, 128, 4]})),
         "kt-int8: blk.0.ffn_up_exps.weight: the up matrix is 128x128, but blk.0.ffn_gate_exps.weight makes gate/up 64x128", KT)
    view("int8_unequal_experts", gguf(experts(h=128, ff=64, override={"blk.1.ffn_up_exps.weight": [128, 64, 8]})),
         "kt-int8: blk.1.ffn_up_exps.weight: 8 experts", KT)
    view("int8_two_dim", gguf(experts(h=128, ff=64, override={"blk.0.ffn_gate_exps.weight": [128, 256]})), "kt-int8: blk.0.ffn_gate_exps.weight: expected 3 non-zero dimensions, shape is [128, 256]", KT)
    view("int8_layer_u32_max", gguf(experts(layers=1, h=128, ff=64, first_layer=0xFFFFFFFF)),
         "kt-int8: blk.4294967295.ffn_gate_exps.weight: layer 4294967295 / 4 experts exceed the caps (4095, 65536)", KT)
    for tname in ["Q4_0", "Q5_K", "Q3_K", "IQ4_XS", "TQ2_0", "IQ1_S", "NVFP4", "Q8_K", "I8", "F64"]:
        view(f"int8_undecodable_{tname.lower()}", gguf(experts(layers=1, e=2, h=256, ff=256, t=TYPE_ID[tname])),
             f"kt-int8: blk.0.ffn_gate_exps.weight: {tname} experts cannot be decoded by this view (it decodes {KT_INT8_DECODABLE})", KT)
    nan = bytearray(tensor_data(nbytes([128, 64, 2], F32T), F32T, 1))
    nan[400:404] = struct.pack("<f", float("nan"))
    c.path("int8_nan_weight.gguf").write_bytes(gguf(experts(layers=1, e=2, h=128, ff=64, t=F32T), data={"blk.0.ffn_up_exps.weight": bytes(nan)}))
    c.add("int8_nan_weight", "int8_nan_weight.gguf", {"mount": "eio", "materialize": "blk.0.ffn_up_exps.weight: non-finite weight"}, views=KT,
          note="content only reading finds: EIO on read, and materialize leaves no final file")
    c.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
