#!/usr/bin/env python3
"""Write a corpus of broken kt-kernel persistent INT8 trees and what each must produce.

    python3 tools/corpus/make_bad_int8.py OUTDIR
writes OUTDIR/<case>/ (a tree: kt-weight-manifest.json or the legacy kt-ephemeral-manifest.json,
_layer_L/_numa_i/INT8_*_.kt) and OUTDIR/cases.json in the format of tools/corpus/corpus_util.py.
`validate-int8 ROOT` and a mount of ROOT (an INT8 tree mount, whatever the view option) must
give the same verdict and the same rule.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from corpus_util import VIEWS, Corpus, mkfifo, symlink  # noqa: E402

LAYOUT = "kt-int8-n32-k64-vnni-v1"
MANIFEST = "kt-weight-manifest.json"
LEGACY = "kt-ephemeral-manifest.json"


def sizes(hidden: int, inter: int, numa: int) -> dict:
    per = inter // numa
    m = (1 << 64) - 1  # what 64-bit unsigned arithmetic gives (the overflow cases)
    return {("gate", "quant"): hidden * per & m, ("up", "quant"): hidden * per & m, ("down", "quant"): hidden * per & m,
            ("gate", "scale"): per * 4 & m, ("up", "scale"): per * 4 & m, ("down", "scale"): hidden * 4 & m}


def write_tree(root: Path, layers=(0, 1), numa=1, experts=2, hidden=128, inter=64, schema=2, edit=None, file_sizes=None) -> dict:
    """A valid tree (tiny files of deterministic bytes); `edit(manifest)` may change the manifest."""
    root.mkdir(parents=True, exist_ok=True)
    sz = file_sizes or sizes(hidden, inter, numa)
    layer_entries, total = [], 0
    for layer in layers:
        files, lbytes = [], 0
        for n in range(numa):
            d = root / f"_layer_{layer}" / f"_numa_{n}"
            d.mkdir(parents=True, exist_ok=True)
            for proj in ("gate", "up", "down"):
                for e in range(experts):
                    for kind in ("quant", "scale"):
                        size = sz[(proj, kind)]
                        name = f"INT8_{proj}_{e}_{size}Byte_{kind}_.kt"
                        data = bytes((layer * 31 + n * 7 + e * 3 + i) % 251 for i in range(size))
                        (d / name).write_bytes(data)
                        entry = {"path": f"_layer_{layer}/_numa_{n}/{name}", "size_bytes": size}
                        if schema >= 2:
                            entry["sha256"] = hashlib.sha256(data).hexdigest()
                        files.append(entry)
                        lbytes += size
        layer_entries.append({"index": layer, "numa_count": numa, "state": "ready", "files": files, "bytes": lbytes})
        total += lbytes
    m = {"schema_version": schema, "state": "ready", "expert_weight_format": "int8", "threadpool_count": numa,
         "expert_num": experts, "hidden_size": hidden, "intermediate_size": inter, "layers": layer_entries, "bytes": total}
    if schema >= 2:
        m.update(layout=LAYOUT, backend="int8")
    else:
        m.update(backend="AMXINT8")
    if edit:
        edit(m)
    (root / (MANIFEST if schema >= 2 else LEGACY)).write_text(json.dumps(m, indent=2))
    return m


def main() -> int:
    c = Corpus(Path(sys.argv[1]), "int8")
    out = c.out

    def both(rule):
        """validate-int8 and an INT8 tree mount (view=auto); a view that reads checkpoints,
        given a tree, says that it was given a tree."""
        return {"validate-int8": rule, "mount:auto": rule,
                **{f"mount:{v}": "is an INT8 tree, not a checkpoint (mount it with view=auto)" for v in VIEWS if v != "auto"}}

    def tree(name, expect, **kw):
        write_tree(out / name, **kw)
        c.add(name, name, expect)
        return out / name

    tree("ok", both("ok"))
    tree("ok_numa2", both("ok"), numa=2)
    tree("ok_schema1", both("ok"), schema=1)

    # -- the root and the manifest file --
    (out / "root_is_file").write_bytes(b"not a directory\n")
    c.add("root_is_file", "root_is_file", {"validate-int8": "persistent INT8 weight root must be a directory"})
    write_tree(out / "symlink_target")
    symlink(out / "root_symlink", "symlink_target")
    c.add("root_symlink", "root_symlink", both("persistent INT8 weight root must not be a symlink"))
    c.add("root_missing", "no_such_tree", {"validate-int8": "No such file or directory", "mount": "No such file or directory"})
    (out / "no_manifest/_layer_0").mkdir(parents=True, exist_ok=True)
    c.add("no_manifest", "no_manifest", {"validate-int8": "requires exactly one manifest (kt-weight-manifest.json or legacy kt-ephemeral-manifest.json); found none"})
    p = tree("two_manifests", both("requires exactly one manifest (kt-weight-manifest.json or legacy kt-ephemeral-manifest.json); found kt-weight-manifest.json, kt-ephemeral-manifest.json"))
    (p / LEGACY).write_text((p / MANIFEST).read_text())

    def manifest_case(name, make, rule):
        p = out / name
        write_tree(p)
        (p / MANIFEST).unlink()
        make(p / MANIFEST)
        c.add(name, name, both(rule))

    manifest_case("manifest_fifo", mkfifo, "INT8 manifest must be a regular file")
    manifest_case("manifest_dev_zero", lambda m: symlink(m, "/dev/zero"), "INT8 manifest must be a regular file")
    manifest_case("manifest_directory", lambda m: m.mkdir(), "INT8 manifest must be a regular file")
    manifest_case("manifest_not_utf8", lambda m: m.write_bytes(b'{"schema_version": 2, "x": "\xff\xfe"}'), "cannot read INT8 manifest")
    manifest_case("manifest_empty", lambda m: m.write_bytes(b""), "cannot read INT8 manifest")
    manifest_case("manifest_nested", lambda m: m.write_bytes(b'{"schema_version": 2, "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"), "recursion limit exceeded")
    manifest_case("manifest_nested_objects", lambda m: m.write_bytes(b'{"a":' * 50_000 + b"1" + b"}" * 50_000), "recursion limit exceeded")
    manifest_case("manifest_not_object", lambda m: m.write_bytes(b"[1, 2, 3]"), "INT8 manifest root must be a JSON object")

    def huge(m):
        with open(m, "wb") as f:
            f.truncate(1_500_000_000)
    manifest_case("manifest_1_5gb", huge, "is 1500000000 bytes, over the cap of 134217728")

    def millions(m):
        entry = b'{"path":"_layer_0/_numa_0/x","size_bytes":1,"sha256":""}'
        with open(m, "wb") as f:
            f.write(b'{"schema_version":2,"state":"ready","expert_weight_format":"int8","threadpool_count":1,"expert_num":333334,'
                    b'"hidden_size":128,"intermediate_size":64,"layout":"' + LAYOUT.encode() + b'","layers":[{"index":0,"numa_count":1,'
                    b'"state":"ready","bytes":1,"files":[')
            f.write(b",".join([entry] * 700_000))
            f.write(b']}],"bytes":1}')
    manifest_case("manifest_700k_files", millions, "holds more than 4194304 JSON values (the cap)")

    # -- declared numbers: caps and overflow --
    def meta(**kv):
        return lambda m: m.update(kv)

    def layer(**kv):
        return lambda m: [l.update(kv) for l in m["layers"]]

    tree("numa_huge", both("INT8 manifest threadpool_count 1000000000 exceeds the cap of 4096"),
         edit=lambda m: (m.update(threadpool_count=10 ** 9, intermediate_size=64 * 10 ** 9), [l.update(numa_count=10 ** 9) for l in m["layers"]]))
    tree("expert_num_overflow", both("persistent INT8 layer 0: threadpool_count 1 x expert_num 4611686018427387904 x 6 files overflows"),
         edit=meta(expert_num=1 << 62))
    tree("expert_num_huge", both("persistent INT8 layer 0 must list exactly 6000000000 files"), edit=meta(expert_num=10 ** 9))
    h, i = (1 << 62) + 16, (1 << 62) + 8
    tree("sizes_overflow", both("INT8 size contract for _layer_0/_numa_0/INT8_gate_0_128Byte_quant_.kt overflows"),
         layers=(0,), experts=1, hidden=h, inter=i)
    tree("hidden_i64_max", both("overflows"), layers=(0,), experts=1, edit=meta(hidden_size=(1 << 63) - 1))
    tree("hidden_u64", both("INT8 manifest hidden_size must be a positive integer"), edit=meta(hidden_size=1 << 63))
    tree("hidden_float", both("INT8 manifest hidden_size must be a positive integer"), edit=meta(hidden_size=128.5))
    tree("hidden_bool", both("INT8 manifest hidden_size must be a positive integer"), edit=meta(hidden_size=True))
    tree("numa_zero", both("INT8 manifest threadpool_count must be a positive integer"), edit=meta(threadpool_count=0))
    tree("inter_not_divisible", both("persistent INT8 intermediate_size must be divisible by threadpool_count: 64 % 3 != 0"), edit=meta(threadpool_count=3))
    tree("layer_index_huge", both("missing or unsafe persistent INT8 layer directory"), layers=(0,), edit=lambda m: m["layers"][0].update(index=(1 << 63) - 1))
    tree("layer_index_negative", both("non-negative"), layers=(0,), edit=lambda m: m["layers"][0].update(index=-1))
    tree("layers_not_list", both("persistent INT8 manifest layers must be a list"), edit=meta(layers={"0": 1}))
    tree("layer_files_count", both("persistent INT8 layer 0 must list exactly 12 files"), edit=lambda m: m["layers"][0]["files"].pop())
    tree("layer_file_not_object", both("persistent INT8 layer 0 has a non-object file entry"), edit=lambda m: m["layers"][0]["files"].__setitem__(0, "x"))
    tree("layer_path_traversal", both("unsafe INT8 manifest path: '../../etc/passwd'"), edit=lambda m: m["layers"][0]["files"][0].update(path="../../etc/passwd"))
    tree("layer_path_absolute", both("unsafe INT8 manifest path: '/etc/passwd'"), edit=lambda m: m["layers"][0]["files"][0].update(path="/etc/passwd"))
    tree("size_bytes_huge", both("INT8 size contract mismatch"), edit=lambda m: m["layers"][0]["files"][0].update(size_bytes=(1 << 63) - 1))
    tree("layer_bytes_mismatch", both("persistent INT8 layer 0 byte total mismatch"), edit=lambda m: m["layers"][0].update(bytes=1))
    tree("state_not_ready", both("persistent INT8 manifest state mismatch: expected 'ready', got 'loading'"), edit=meta(state="loading"))
    tree("layout_wrong", both("persistent INT8 manifest layout mismatch"), edit=meta(layout="kt-int8-v0"))
    p = tree("sha_mismatch", {"validate-int8": "INT8 SHA256 mismatch"})
    f = next((p / "_layer_1/_numa_0").iterdir())
    b = bytearray(f.read_bytes())
    b[0] ^= 1
    f.write_bytes(bytes(b))

    # -- special files inside the tree --
    p = tree("extra_fifo", both("unexpected non-regular persistent INT8 entry"))
    mkfifo(p / "_layer_0/_numa_0/extra.kt")
    p = tree("kt_file_fifo", both("unexpected non-regular persistent INT8 entry"))
    f = next((p / "_layer_0/_numa_0").iterdir())
    f.unlink()
    mkfifo(f)
    p = tree("kt_file_symlink", both("unexpected non-regular persistent INT8 entry"))
    f = next((p / "_layer_1/_numa_0").iterdir())
    f.unlink()
    symlink(f, "/dev/zero")
    p = tree("layer_dir_symlink", both("missing or unsafe persistent INT8 layer directory"))
    os.rename(p / "_layer_1", p / "elsewhere")
    symlink(p / "_layer_1", "elsewhere")
    p = tree("root_extra_file", both("persistent INT8 root entries differ from its manifest: extra=['notes.txt']"))
    (p / "notes.txt").write_text("x")
    p = tree("root_extra_fifo", both("persistent INT8 root entries differ from its manifest: extra=['pipe']"))
    mkfifo(p / "pipe")
    p = tree("root_symlink_entry", both("persistent INT8 root must not contain symlinks"))
    symlink(p / "link", "_layer_0")
    c.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
