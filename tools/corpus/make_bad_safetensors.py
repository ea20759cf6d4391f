#!/usr/bin/env python3
"""Write a corpus of broken safetensors sources and what each must produce.

    python3 tools/corpus/make_bad_safetensors.py OUTDIR
writes single-file cases (OUTDIR/hdr/*.safetensors: shard headers), checkpoint directories
(OUTDIR/dir/<case>/: index, shards, config.json; DeepSeek V4 native MXFP4 and Hugging Face
dense MoE layouts) and OUTDIR/cases.json in the format of tools/corpus/corpus_util.py. Files are
written byte by byte (tools/corpus/corpus_util.py), so that every field can be made wrong.

`v4_checkpoint` and `hf_checkpoint` are also the valid bases of the imatrix and option
corpora.
"""
from __future__ import annotations

import json
import os
import struct
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from corpus_util import Corpus, Rand, mkfifo, numel, refused_everywhere, st_bytes, st_header, symlink  # noqa: E402

V4 = dict(L=2, E=4, H=256, I=256)
HF = dict(L=2, E=4, H=128, I=64)


def v4_tensors(L=2, E=4, H=256, I=256, block=128, seed=41):
    """DeepSeek V4 native layout: {shard: [(name, dtype, shape, data)]}. Shard 1 holds the
    non-expert tensors, shard 2 the routed experts (each scale with its weight)."""
    r = Rand(seed)
    dense, experts = [], []

    def bf16(name, *shape):
        dense.append((name, "BF16", list(shape), r.bf16(numel(shape))))

    def fp8(name, rows, cols):
        dense.append((name + ".weight", "F8_E4M3", [rows, cols], r.fp8(rows * cols)))
        sb = [-(-rows // block), -(-cols // block)]
        dense.append((name + ".scale", "F8_E8M0", sb, r.e8m0(numel(sb))))

    bf16("embed.weight", 64, H)
    bf16("head.weight", 64, H)
    bf16("norm.weight", H)
    for layer in range(L):
        p = f"layers.{layer}"
        bf16(f"{p}.attn_norm.weight", H)
        bf16(f"{p}.ffn_norm.weight", H)
        fp8(f"{p}.attn.wq_a", 192, H)
        bf16(f"{p}.ffn.gate.weight", E, H)
        dense.append((f"{p}.ffn.gate.bias", "F32", [E], r.f32(E)))
        for e in range(E):
            for proj, (n, k) in (("w1", (I, H)), ("w3", (I, H)), ("w2", (H, I))):
                q = f"{p}.ffn.experts.{e}.{proj}"
                experts.append((q + ".weight", "I8", [n, k // 2], r.i8(n * k // 2)))
                experts.append((q + ".scale", "F8_E8M0", [n, k // 32], r.e8m0(n * k // 32)))
    return {"model-00001-of-00002.safetensors": dense, "model-00002-of-00002.safetensors": experts}


def v4_config(L=2, E=4, H=256, I=256, block=128, **over):
    cfg = {"model_type": "deepseek_v4", "num_hidden_layers": L, "n_routed_experts": E, "hidden_size": H,
           "moe_intermediate_size": I, "num_experts_per_tok": 2,
           "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [block, block], "scale_fmt": "ue8m0"}}
    cfg.update(over)
    return cfg


def write_checkpoint(d: Path, shards: dict, config: dict | None, index: bool = True, weight_map: dict | None = None) -> None:
    d.mkdir(parents=True, exist_ok=True)
    wm = {}
    for name, tensors in shards.items():
        (d / name).write_bytes(st_bytes(tensors, metadata={"format": "pt"}))
        wm.update({t[0]: name for t in tensors})
    if config is not None:
        (d / "config.json").write_text(json.dumps(config, indent=2))
    if index:
        (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map or wm}, indent=2))


def v4_checkpoint(d: Path, edit=None, config=None, **dims) -> dict:
    """Write a valid V4 checkpoint, after `edit(shards)` when given; returns the shards."""
    dims = {**V4, **dims}
    shards = v4_tensors(**dims)
    if edit:
        edit(shards)
    write_checkpoint(d, shards, config if config is not None else v4_config(**dims))
    return shards


def hf_tensors(L=2, E=4, H=128, I=64, seed=3, dtype="BF16"):
    r = Rand(seed)
    out = []
    for layer in range(L):
        for e in range(E):
            for proj, shape in (("gate", (I, H)), ("up", (I, H)), ("down", (H, I))):
                data = r.bf16(numel(shape)) if dtype == "BF16" else r.f32(numel(shape))
                out.append((f"model.layers.{layer}.mlp.experts.{e}.{proj}_proj.weight", dtype, list(shape), data))
    out.append(("model.norm.weight", "BF16", [H], r.bf16(H)))
    return out


def hf_checkpoint(d: Path, edit=None, **dims) -> None:
    dims = {**HF, **dims}
    tensors = hf_tensors(**dims)
    if edit:
        edit(tensors)
    d.mkdir(parents=True, exist_ok=True)
    (d / "model.safetensors").write_bytes(st_bytes(tensors, metadata={"format": "pt"}))
    (d / "config.json").write_text(json.dumps({"model_type": "toy_moe", "num_hidden_layers": dims["L"]}))


def replace(tensors: list, name: str, dtype=None, shape=None, data=None, new_name=None) -> None:
    for i, (n, dt, sh, da) in enumerate(tensors):
        if n == name:
            tensors[i] = (new_name or n, dtype or dt, shape if shape is not None else sh, data if data is not None else da)
            return
    raise KeyError(name)


def main() -> int:
    c = Corpus(Path(sys.argv[1]), "safetensors")
    out = c.out
    ok_w = [("a", "F32", [2], struct.pack("<2f", 1.0, 2.0))]

    def hdr(name, data: bytes, rule):
        c.path(f"hdr/{name}.safetensors").write_bytes(data)
        c.add(f"hdr_{name}", f"hdr/{name}.safetensors", refused_everywhere(rule), names=f"{name}.safetensors")

    # -- one shard's header (src/source/safetensors.rs) --
    hdr("truncated", b"\x01\x02\x03", "truncated: 3 bytes, the header length alone needs 8")
    hdr("header_len_max", struct.pack("<Q", (1 << 64) - 1) + b"{}", "header length 18446744073709551615 exceeds the cap of 33554432 bytes")
    hdr("header_past_end", struct.pack("<Q", 1000) + b"{}      ", "header length 1000 runs past the end of the file")
    hdr("header_zero", struct.pack("<Q", 0), "invalid JSON in header")
    with open(c.path("hdr/header_40mb.safetensors"), "wb") as f:  # refused by its length: the rest is a hole
        f.write(struct.pack("<Q", 40 << 20) + b"{")
        f.truncate(8 + (40 << 20))
    c.add("hdr_header_40mb", "hdr/header_40mb.safetensors", refused_everywhere("header length 41943040 exceeds the cap of 33554432 bytes"), names="header_40mb.safetensors")
    hdr("not_json", st_bytes([], header_text=b'{"a":'), "invalid JSON in header")
    hdr("not_object", st_bytes([], header_text=b"[1,2,3]"), "invalid JSON in header")
    hdr("not_utf8", st_bytes([], header_text=b'{"\xff\xfe":1}'), "header is not UTF-8")
    hdr("unknown_dtype", st_bytes([], header={"a": {"dtype": "Q9", "shape": [2], "data_offsets": [0, 8]}}) + bytes(8), "unknown variant")
    hdr("duplicate_key", st_bytes([], header_text=b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}') + bytes(8), "duplicate key in the safetensors header")
    hdr("overlap", st_bytes([], header={"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}) + bytes(12), "tensor \"b\": data offsets are overlapping")
    hdr("gap", st_bytes([], header={"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, "b": {"dtype": "F32", "shape": [2], "data_offsets": [12, 20]}}) + bytes(20), "tensor \"b\": data offsets are overlapping")
    hdr("shape_mismatch", st_bytes([], header={"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}) + bytes(8), "do not match its shape")
    hdr("trailing_bytes", st_bytes(ok_w) + b"\0", "does not end exactly at the end of the file")
    hdr("short_data", st_bytes(ok_w)[:-4], "does not end exactly at the end of the file")
    hdr("shape_overflow", st_bytes([], header={"a": {"dtype": "F32", "shape": [1 << 40, 1 << 40], "data_offsets": [0, 0]}}), "overflow computing buffer size from shape and/or element type")
    hdr("offsets_reversed", st_bytes([], header={"a": {"dtype": "F32", "shape": [0], "data_offsets": [8, 0]}}) + bytes(8), "tensor \"a\": data offsets are overlapping")
    hdr("metadata_not_strings", st_bytes([], header_text=b'{"__metadata__":{"a":[1]}}'), "invalid JSON in header")
    deep = b'{"__metadata__":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    hdr("deep_nesting", st_bytes([], header_text=deep), "invalid JSON in header")
    entries = b",".join(b'"t%d":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}' % i for i in range(400_000))
    hdr("tensors_400k", st_bytes([], header_text=b"{" + entries + b"}"), "header lists 400000 tensors, over the cap of 262144")
    meta = b",".join(b'"k%d":"v"' % i for i in range(100_000))
    hdr("metadata_100k", st_bytes([], header_text=b'{"__metadata__":{' + meta + b"}}"), "__metadata__ holds 100000 entries, over the cap of 65536")
    c.path("hdr/scalar.safetensors").write_bytes(st_bytes([("s", "F32", [], struct.pack("<f", 1.0))]))
    c.add("hdr_scalar_tensor", "hdr/scalar.safetensors", {"digest": "ok"}, note="a rank-0 tensor is valid safetensors")
    mkfifo(out / "hdr/fifo.safetensors")
    c.add("fifo_file", "hdr/fifo.safetensors", refused_everywhere("is a FIFO, not a regular file"), names="fifo.safetensors")
    symlink(out / "hdr/zero.safetensors", "/dev/zero")
    c.add("dev_zero_file", "hdr/zero.safetensors", refused_everywhere("is a character device, not a regular file"))

    # -- checkpoint directories --
    def d(name):
        return out / "dir" / name

    def add_dir(name, expect, views=None, names=None, note=""):
        c.add(name, f"dir/{name}", expect, views=views, names=names, note=note)

    v4_checkpoint(d("v4_ok"))
    add_dir("v4_ok", {"mount": "ok", "materialize": "ok", "digest": "ok"}, views=["auto", "bf16-cache", "requant", "kt-int8"])
    hf_checkpoint(d("hf_ok"))
    add_dir("hf_ok", {"mount": "ok", "materialize": "ok", "digest": "ok"}, views=["kt-int8"])

    def index_case(name, index_text: bytes, rule, names="model.safetensors.index.json"):
        v4_checkpoint(d(name))
        (d(name) / "model.safetensors.index.json").write_bytes(index_text)
        add_dir(name, refused_everywhere(rule), names=names)

    index_case("index_weight_map_list", b'{"weight_map": []}', "index has no weight_map object")
    index_case("index_weight_map_empty", b'{"weight_map": {}}', "index weight_map is empty")
    index_case("index_value_not_string", b'{"weight_map": {"norm.weight": 7}}', "tensor \"norm.weight\": weight_map value is not a string")
    index_case("index_shard_escape", b'{"weight_map": {"norm.weight": "../escape.safetensors"}}', "shard name \"../escape.safetensors\" is not a plain file name")
    index_case("index_shard_absolute", b'{"weight_map": {"norm.weight": "/etc/hostname"}}', "shard name \"/etc/hostname\" is not a plain file name")
    index_case("index_shard_missing", b'{"weight_map": {"norm.weight": "model-00009-of-00009.safetensors"}}', "model-00009-of-00009.safetensors: No such file or directory", names=None)
    index_case("index_not_json", b'{"weight_map": {', "the safetensors index is not valid JSON")
    index_case("index_not_utf8", b'{"weight_map": {"\xff": "a"}}', "the safetensors index is not valid JSON")
    index_case("index_deep", b'{"x":' + b"[" * 100_000 + b"]" * 100_000 + b', "weight_map": {}}', "recursion limit exceeded")
    wm = b",".join(b'"t%d":"s"' % i for i in range(1_100_000))
    index_case("index_1m_entries", b'{"weight_map":{' + wm + b"}}", "the safetensors index holds more than 2101248 JSON values (the cap)")
    v4_checkpoint(d("index_huge"))
    with open(d("index_huge") / "model.safetensors.index.json", "r+b") as f:
        f.truncate(100 << 20)
    add_dir("index_huge", refused_everywhere("the safetensors index is 104857600 bytes, over the 33554432 byte cap"))
    v4_checkpoint(d("index_fifo"))
    mkfifo(d("index_fifo") / "model.safetensors.index.json")
    add_dir("index_fifo", refused_everywhere("model.safetensors.index.json: is a FIFO, not a regular file"))
    v4_checkpoint(d("index_dev_zero"))
    symlink(d("index_dev_zero") / "model.safetensors.index.json", "/dev/zero")
    add_dir("index_dev_zero", refused_everywhere("model.safetensors.index.json: is a character device, not a regular file"))

    def shard_special(name, make, rule):
        v4_checkpoint(d(name))
        p = d(name) / "model-00002-of-00002.safetensors"
        p.unlink()
        make(p)
        add_dir(name, refused_everywhere(rule), names="model-00002-of-00002.safetensors")

    shard_special("shard_fifo", mkfifo, "is a FIFO, not a regular file")

    def link_fifo(p):
        mkfifo(p.parent / "pipe")
        symlink(p, "pipe")
    shard_special("shard_symlink_fifo", link_fifo, "is a FIFO, not a regular file")
    shard_special("shard_dev_zero", lambda p: symlink(p, "/dev/zero"), "is a character device, not a regular file")
    shard_special("shard_directory", lambda p: p.mkdir(), "is a directory, not a regular file")
    # A shard linked to a blob elsewhere (the Hugging Face cache layout) is fine.
    v4_checkpoint(d("shard_symlink_blob"))
    blob = out / "dir/blobs/shard2"
    blob.parent.mkdir(parents=True, exist_ok=True)
    os.replace(d("shard_symlink_blob") / "model-00002-of-00002.safetensors", blob)
    symlink(d("shard_symlink_blob") / "model-00002-of-00002.safetensors", "../blobs/shard2")
    add_dir("shard_symlink_blob", {"mount": "ok", "digest": "ok"}, views=["bf16-cache"])

    def config_case(name, make, rule):
        v4_checkpoint(d(name))
        p = d(name) / "config.json"
        p.unlink()
        make(p)
        add_dir(name, refused_everywhere(rule), names="config.json")

    config_case("config_fifo", mkfifo, "config.json: is a FIFO, not a regular file")
    config_case("config_dev_zero", lambda p: symlink(p, "/dev/zero"), "config.json: is a character device, not a regular file")
    config_case("config_not_json", lambda p: p.write_text("{model_type: v4}"), "config.json is not valid JSON")

    def big_config(p):
        with open(p, "wb") as f:
            f.truncate(100 << 20)
    config_case("config_huge", big_config, "config.json is 104857600 bytes, over the 16777216 byte cap")
    config_case("config_5m_values", lambda p: p.write_bytes(b'{"x":[' + b"0," * 5_000_000 + b'0]}'), "config.json holds more than 1048576 JSON values (the cap)")
    config_case("config_deep", lambda p: p.write_bytes(b'{"x":' + b"[" * 100_000 + b"]" * 100_000 + b"}"), "recursion limit exceeded")

    # Tensor inventory (src/source/safetensors.rs).
    v4_checkpoint(d("index_ghost_tensor"))
    idx = json.loads((d("index_ghost_tensor") / "model.safetensors.index.json").read_text())
    idx["weight_map"]["layers.0.attn.ghost.weight"] = "model-00001-of-00002.safetensors"
    (d("index_ghost_tensor") / "model.safetensors.index.json").write_text(json.dumps(idx))
    add_dir("index_ghost_tensor", refused_everywhere("tensor \"layers.0.attn.ghost.weight\": named by the index in shard model-00001-of-00002.safetensors, but no shard holds it"))
    v4_checkpoint(d("index_wrong_shard"))
    idx = json.loads((d("index_wrong_shard") / "model.safetensors.index.json").read_text())
    idx["weight_map"]["norm.weight"] = "model-00002-of-00002.safetensors"
    (d("index_wrong_shard") / "model.safetensors.index.json").write_text(json.dumps(idx))
    add_dir("index_wrong_shard", refused_everywhere("tensor \"norm.weight\": index says shard model-00002-of-00002.safetensors, but it is in model-00001-of-00002.safetensors"))
    v4_checkpoint(d("tensor_not_in_index"))
    idx = json.loads((d("tensor_not_in_index") / "model.safetensors.index.json").read_text())
    del idx["weight_map"]["norm.weight"]
    (d("tensor_not_in_index") / "model.safetensors.index.json").write_text(json.dumps(idx))
    add_dir("tensor_not_in_index", refused_everywhere("tensor \"norm.weight\": in the shard but not in the index"))

    def dup(sh):
        sh["model-00002-of-00002.safetensors"].append(("norm.weight", "BF16", [256], bytes(512)))
    v4_checkpoint(d("tensor_in_two_shards"), edit=dup)
    add_dir("tensor_in_two_shards", refused_everywhere("tensor \"norm.weight\": tensor also in shard model-00001-of-00002.safetensors"))
    d("empty_dir").mkdir(parents=True, exist_ok=True)
    add_dir("empty_dir", refused_everywhere("neither model.safetensors.index.json nor model.safetensors in the directory"))

    # -- view rules on safetensors checkpoints (src/view/{bf16_cache,requant,kt_int8}) --
    for key, value in [("n_routed_experts", 10 ** 9), ("num_hidden_layers", 10 ** 12)]:
        name = f"config_{key}_huge"
        v4_checkpoint(d(name), config=v4_config(**{**V4, "E" if key == "n_routed_experts" else "L": value}))
        add_dir(name, {"mount": f"config.json {key} = {value} is beyond any real model", "materialize": f"config.json {key} = {value} is beyond any real model"}, views=["bf16-cache"])
    # config.json shapes that are not what a V4 config is: each message says what is wrong.
    def config_shape(name, config, rule):
        v4_checkpoint(d(name), config=config)
        add_dir(name, {"mount": rule, "materialize": rule}, views=["bf16-cache"], names="config.json")
    config_shape("config_is_a_list", [v4_config()], "config.json must be a JSON object, it is a list")
    config_shape("v41_text_config_list", {"model_type": "deepseek_v41", "text_config": [v4_config()]},
                 "deepseek_v41 config.json text_config must be an object, it is a list")
    config_shape("config_hidden_zero", v4_config(hidden_size=0), "native V4 dimension config.json hidden_size must be a positive integer (got 0)")
    config_shape("config_experts_missing", {k: v for k, v in v4_config().items() if k != "n_routed_experts"},
                 "native V4 dimension config.json n_routed_experts must be a positive integer (missing)")
    exp = "model-00002-of-00002.safetensors"
    w1 = "layers.0.ffn.experts.0.w1.weight"
    dense = "model-00001-of-00002.safetensors"
    scale0 = "layers.0.attn.wq_a.scale"
    # A scale that is there but of the wrong type is not "missing".
    v4_checkpoint(d("fp8_scale_as_f32"), edit=lambda sh: replace(sh[dense], scale0, dtype="F32", data=bytes(4 * numel([2, 2]))))
    add_dir("fp8_scale_as_f32", {"mount": f"native FP8 scale {scale0} of layers.0.attn.wq_a.weight is F32, expected F8_E8M0",
                                 "materialize": f"native FP8 scale {scale0} of layers.0.attn.wq_a.weight is F32, expected F8_E8M0"}, views=["bf16-cache"])

    def v4_view(name, edit, expect, views, note=""):
        v4_checkpoint(d(name), edit=edit)
        add_dir(name, expect, views=views, note=note)

    def both(rule):
        return {"mount": rule, "materialize": rule}

    RQ_WIDER = "requant: layers.0.ffn.experts.1.w1.weight: shape [256, 256], but layers.0.ffn.experts.0.w1.weight of the same projection has [256, 128]"
    # The block rule fires before the shapes are compared across layers.
    RQ_SWAP = "requant: layers.1.ffn.experts.0.w2.weight: 128 is not a multiple of 256"

    v4_view("v4_expert_rank0", lambda sh: replace(sh[exp], w1, shape=[], data=b"\1"),
            {**both(f"kt-int8: {w1}: expected 2 non-zero dimensions, shape is []"),
             "mount:bf16-cache": f"invalid native MXFP4 tensor {w1}", "materialize:bf16-cache": f"invalid native MXFP4 tensor {w1}",
             "mount:requant": f"{w1}: expected a 2-D packed MXFP4 weight", "materialize:requant": f"{w1}: expected a 2-D packed MXFP4 weight"},
            ["bf16-cache", "requant", "kt-int8"])
    v4_view("v4_expert_rank1", lambda sh: replace(sh[exp], w1, shape=[256 * 128]),
            {**both(f"kt-int8: {w1}: expected 2 non-zero dimensions, shape is [32768]"),
             "mount:requant": f"{w1}: expected a 2-D packed MXFP4 weight", "materialize:requant": f"{w1}: expected a 2-D packed MXFP4 weight"},
            ["requant", "kt-int8"])
    v4_view("v4_expert_f32", lambda sh: replace(sh[exp], w1, dtype="F32", shape=[256, 128], data=Rand(5).f32(256 * 128)),
            {**both(f"kt-int8: {w1}: DeepSeek experts must be packed MXFP4 (I8/U8 nibbles), got F32"),
             "mount:bf16-cache": f"invalid native MXFP4 tensor {w1}", "materialize:bf16-cache": f"invalid native MXFP4 tensor {w1}",
             "mount:requant": f"{w1}: MXFP4 needs I8/U8 weights and F8_E8M0 scales, got F32", "materialize:requant": f"{w1}: MXFP4 needs I8/U8 weights and F8_E8M0 scales, got F32"},
            ["bf16-cache", "requant", "kt-int8"])

    def drop_expert(sh, layer=0, e=2):
        sh[exp][:] = [t for t in sh[exp] if f"layers.{layer}.ffn.experts.{e}." not in t[0]]
    v4_view("v4_expert_gap", drop_expert,
            {**both("kt-int8: layer 0 has no gate projection for expert(s) 2 (every layer needs experts 0..4)"),
             "mount:bf16-cache": "incomplete native MXFP4 checkpoint", "materialize:bf16-cache": "incomplete native MXFP4 checkpoint",
             "mount:requant": "requant: layer 0 has no w1 projection for routed expert(s) 2 (every layer with routed experts needs experts 0..4)", "materialize:requant": "requant: layer 0 has no w1 projection for routed expert(s) 2 (every layer with routed experts needs experts 0..4)"},
            ["bf16-cache", "requant", "kt-int8"])

    def extra_expert(sh, index="4294967295"):
        for proj, (n, k) in (("w1", (256, 256)), ("w3", (256, 256)), ("w2", (256, 256))):
            q = f"layers.0.ffn.experts.{index}.{proj}"
            sh[exp].append((q + ".weight", "I8", [n, k // 2], Rand(7).i8(n * k // 2)))
            sh[exp].append((q + ".scale", "F8_E8M0", [n, k // 32], Rand(8).e8m0(n * k // 32)))
    v4_view("v4_expert_index_huge", extra_expert,
            {**both('kt-int8: layers.0.ffn.experts.4294967295.w1.weight: expert index "4294967295" is not a number from 0 to 65535'),
             "mount:bf16-cache": "unexpected routed-expert tensor: layers.0.ffn.experts.4294967295", "materialize:bf16-cache": "unexpected routed-expert tensor: layers.0.ffn.experts.4294967295",
             "mount:requant": 'requant: layers.0.ffn.experts.4294967295.w1.weight: expert index "4294967295" is not a number from 0 to 65535', "materialize:requant": 'requant: layers.0.ffn.experts.4294967295.w1.weight: expert index "4294967295" is not a number from 0 to 65535'},
            ["bf16-cache", "requant", "kt-int8"])

    def leading_zero(sh):
        for proj in ("w1", "w3", "w2"):
            for kind in ("weight", "scale"):
                replace(sh[exp], f"layers.0.ffn.experts.1.{proj}.{kind}", new_name=f"layers.0.ffn.experts.01.{proj}.{kind}")
    v4_view("v4_expert_leading_zero", leading_zero,
            {**both('layers.0.ffn.experts.01.w1.weight: expert index "01" is not a number from 0 to 65535'),
             "mount:bf16-cache": "unexpected routed-expert tensor: layers.0.ffn.experts.01", "materialize:bf16-cache": "unexpected routed-expert tensor: layers.0.ffn.experts.01"},
            ["bf16-cache", "requant", "kt-int8"])

    def wider(sh):
        replace(sh[exp], "layers.0.ffn.experts.1.w1.weight", shape=[256, 256], data=Rand(9).i8(256 * 256))
        replace(sh[exp], "layers.0.ffn.experts.1.w1.scale", shape=[256, 16], data=Rand(9).e8m0(256 * 16))
    v4_view("v4_expert_shape_differs", wider,
            {**both("kt-int8: layers.0.ffn.experts.1.w1.weight: the gate matrix is 256x512, but layers.0.ffn.experts.0.w1.weight makes gate/up 256x256"),
             "mount:requant": RQ_WIDER, "materialize:requant": RQ_WIDER,
             "mount:bf16-cache": "invalid native MXFP4 tensor layers.0.ffn.experts.1.w1.weight", "materialize:bf16-cache": "invalid native MXFP4 tensor layers.0.ffn.experts.1.w1.weight"},
            ["bf16-cache", "requant", "kt-int8"])

    def swap_layer(sh):
        # Layer 1's experts shaped for H=256 <-> I=128: w1/w3 [128, 128], w2 [256, 64].
        for e in range(4):
            for proj, (n, k) in (("w1", (128, 256)), ("w3", (128, 256)), ("w2", (256, 128))):
                q = f"layers.1.ffn.experts.{e}.{proj}"
                replace(sh[exp], q + ".weight", shape=[n, k // 2], data=Rand(e).i8(n * k // 2))
                replace(sh[exp], q + ".scale", shape=[n, k // 32], data=Rand(e).e8m0(n * k // 32))
    v4_view("v4_layer_dims_differ", swap_layer,
            {**both("kt-int8: layers.1.ffn.experts.0.w1.weight: the gate matrix is 128x256, but layers.0.ffn.experts.0.w1.weight makes gate/up 256x256"),
             "mount:requant": RQ_SWAP, "materialize:requant": RQ_SWAP,
             "mount:bf16-cache": "invalid native MXFP4 tensor layers.1.ffn.experts.0.w1.weight", "materialize:bf16-cache": "invalid native MXFP4 tensor layers.1.ffn.experts.0.w1.weight"},
            ["bf16-cache", "requant", "kt-int8"])

    def nan_scale(sh):
        for i, t in enumerate(sh[exp]):
            if t[0] == "layers.1.ffn.experts.0.w1.scale":
                b = bytearray(t[3])
                b[10] = 255
                sh[exp][i] = (t[0], t[1], t[2], bytes(b))
    v4_view("v4_expert_e8m0_nan", nan_scale,
            {"mount": "eio", "materialize": "layers.1.ffn.experts.0.w1"}, ["requant", "kt-int8"],
            note="content only reading finds: EIO on read; materialize names the tensor and leaves no final file")

    def inf_norm(sh):
        replace(sh["model-00001-of-00002.safetensors"], "norm.weight", data=b"\x80\x7f" * 256)
    v4_view("v4_nonfinite_bf16", inf_norm, {"mount": "eio", "materialize": "norm.weight"}, ["bf16-cache"],
            note="content only reading finds: EIO on read; materialize names the tensor and leaves no final file")

    gate0 = "model.layers.0.mlp.experts.0.gate_proj.weight"

    def hf_view(name, edit, expect, note=""):
        hf_checkpoint(d(name), edit=edit)
        add_dir(name, expect, views=["kt-int8"], note=note)

    hf_view("hf_expert_rank0", lambda ts: replace(ts, gate0, shape=[], data=b"\0\0"), both(f"kt-int8: {gate0}: expected 2 non-zero dimensions, shape is []"))
    hf_view("hf_expert_rank1", lambda ts: replace(ts, gate0, shape=[64 * 128]), both(f"kt-int8: {gate0}: expected 2 non-zero dimensions, shape is [8192]"))
    hf_checkpoint(d("hf_inter_zero"), I=0)
    add_dir("hf_inter_zero", both("kt-int8: model.layers.0.mlp.experts.0.gate_proj.weight: expected 2 non-zero dimensions, shape is [0, 128]"), views=["kt-int8"])
    hf_view("hf_transposed", lambda ts: replace(ts, "model.layers.0.mlp.experts.1.gate_proj.weight", shape=[128, 64]),
            both("kt-int8: model.layers.0.mlp.experts.1.gate_proj.weight: the gate matrix is 128x64, but model.layers.0.mlp.experts.0.gate_proj.weight makes gate/up 64x128"))
    hf_view("hf_up_differs", lambda ts: replace(ts, "model.layers.1.mlp.experts.2.up_proj.weight", shape=[32, 256]),
            both("kt-int8: model.layers.1.mlp.experts.2.up_proj.weight: the up matrix is 32x256, but model.layers.0.mlp.experts.0.gate_proj.weight makes gate/up 64x128"))
    hf_view("hf_expert_i8", lambda ts: replace(ts, gate0, dtype="I8", shape=[64, 256]),
            both(f"kt-int8: {gate0}: dense experts must be BF16, F16 or F32, got I8"))
    c.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
