#!/usr/bin/env python3
"""Run SGLang's own Kimi K3 pack code (`shared/reference/sglang/`: kimi_ggml.py and the
runtime reader in expert_pack.py) on a shard set, a pack and a manifest.

    run_sglang_kimi.py write    --gguf-dir D --config C --out PACK [--relax-audit]
    run_sglang_kimi.py validate --gguf-dir D --config C --pack PACK [--payload-samples N] [--full-pack-hash] [--relax-audit]
    run_sglang_kimi.py manifest --gguf-dir D --config C --tokenizer-dir T --pack PACK --out JSON
                                [--payload-samples N] [--full-source-hashes] [--full-pack-hash] [--relax-audit]
    run_sglang_kimi.py reader   --gguf-dir D --pack PACK --manifest JSON [--direct-io] [--sample N] [--relax-layers]
    run_sglang_kimi.py text     --manifest JSON     # is it json.dump(indent=2, sort_keys, ensure_ascii=False) + "\\n"?

write: discover_gguf_shards, scan_gguf_shards, validate_expert_tensors, write_ggml_moe_pack,
then validate_ggml_moe_pack(full_pack_hash=True) of what it wrote (prepare_kimi_pack's
steps). validate: validate_ggml_moe_pack of PACK. manifest: create_manifest, written with
write_json_atomic (prepare_kimi_manifest's steps; repo=None, so sglang_git_sha is "unknown").
Each prints its result as JSON; a refusal exits 1 with SGLang's message on stderr.

--relax-audit lets small models through: the spec is built with KimiK3Spec's dataclass
constructor (what from_config does without validate_kimi_k3), and for create_manifest, which
calls from_config itself, validate_kimi_k3 is replaced by a no-op. Nothing else changes.

reader: KimiGGMLExpertPackStore opens PACK and the manifest (expected dimensions from the
manifest's model), builds its device cache on the stand-in torch (tools/peers/sglang_standin: no
GPU, no torch), and acquire() reads every object (or N sampled layers and the first and last
experts of the first and last layers with --sample N) through its own read path (preadv of
read_splits ranges into page-aligned staging buffers, with O_DIRECT under --direct-io, then
the copy into the cache); each cached object must equal os.pread of PACK at the object's
offset and the up, gate and down slices of the source tensors as gguf-py's GGUFReader
locates them. --relax-layers replaces the reader's one audited check, `active_layers ==
tuple(range(1, 93))`, by the layout rule `tuple(range(1, num_hidden_layers))` in the
module's source text before loading it; the top-k 16 rule stays.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def sglang_dir() -> Path:
    shared = Path(os.environ.get("XPACKFS_SHARED", HERE.parents[2] / "shared"))
    return shared / "reference" / "sglang"


def load_kimi_ggml():
    sys.path.insert(0, str(sglang_dir()))
    import kimi_ggml

    return kimi_ggml


def spec_of(kimi_ggml, config_path: Path, relax: bool):
    config = json.loads(config_path.read_text(encoding="utf-8"))
    if not relax:
        return kimi_ggml.KimiK3Spec.from_config(config)
    text = config.get("text_config", config)
    layers = int(text["num_hidden_layers"])
    first = int(text["first_k_dense_replace"])
    return kimi_ggml.KimiK3Spec(
        num_hidden_layers=layers,
        first_k_dense_replace=first,
        num_experts=int(text["num_experts"]),
        top_k=int(text["num_experts_per_token"]),
        num_shared_experts=int(text["num_shared_experts"]),
        hidden_size=int(text["hidden_size"]),
        routed_expert_hidden_size=int(text["routed_expert_hidden_size"]),
        moe_intermediate_size=int(text["moe_intermediate_size"]),
        hidden_act=str(text["hidden_act"]),
        active_moe_layer_ids=tuple(range(first, layers)),
    )


def expert_tensors(kimi_ggml, gguf_dir: Path, spec):
    shards = kimi_ggml.discover_gguf_shards(gguf_dir)
    _, tensors, _ = kimi_ggml.scan_gguf_shards(shards)
    return kimi_ggml.validate_expert_tensors(tensors, spec)


def cmd_write(a) -> dict:
    k = load_kimi_ggml()
    spec = spec_of(k, a.config, a.relax_audit)
    experts = expert_tensors(k, a.gguf_dir, spec)
    size = k.write_ggml_moe_pack(a.out, experts, spec)
    result = k.validate_ggml_moe_pack(a.out, experts, spec, payload_samples=6, full_pack_hash=True)
    assert result["size"] == size
    return result


def cmd_validate(a) -> dict:
    k = load_kimi_ggml()
    spec = spec_of(k, a.config, a.relax_audit)
    experts = expert_tensors(k, a.gguf_dir, spec)
    return k.validate_ggml_moe_pack(a.pack, experts, spec, payload_samples=a.payload_samples, full_pack_hash=a.full_pack_hash)


def cmd_manifest(a) -> dict:
    k = load_kimi_ggml()
    if a.relax_audit:
        k.KimiK3Spec.validate_kimi_k3 = lambda self: None
    manifest = k.create_manifest(
        gguf_dir=a.gguf_dir,
        expert_pack=a.pack,
        model_config=a.config.resolve(strict=True),
        tokenizer_dir=a.tokenizer_dir,
        payload_samples=a.payload_samples,
        full_source_hashes=a.full_source_hashes,
        full_pack_hash=a.full_pack_hash,
        repo=None,
    )
    k.write_json_atomic(a.out.resolve(), manifest)
    return {"manifest": str(a.out), "entries": manifest["expert_pack"]["index_count"]}


AUDITED_LAYER_CHECK = "if active_layers != tuple(range(1, 93)):"
LAYOUT_LAYER_CHECK = 'if active_layers != tuple(range(1, int(model["num_hidden_layers"]))):'


def load_expert_pack(relax_layers: bool):
    sys.path.insert(0, str(HERE / "sglang_standin"))
    import torch  # the stand-in

    assert torch.__version__.endswith("xpackfs-standin"), torch.__file__
    path = sglang_dir() / "expert_pack.py"
    text = path.read_text(encoding="utf-8")
    if relax_layers:
        assert text.count(AUDITED_LAYER_CHECK) == 1, "the reader's layer check is not where it was"
        text = text.replace(AUDITED_LAYER_CHECK, LAYOUT_LAYER_CHECK)
    spec = importlib.util.spec_from_loader("expert_pack", loader=None, origin=str(path))
    module = importlib.util.module_from_spec(spec)
    sys.modules["expert_pack"] = module
    exec(compile(text, str(path), "exec"), module.__dict__)
    return torch, module


def source_slices(gguf_dir: Path):
    """(layer, role) -> (shard path, data offset, bytes per expert), from gguf-py."""
    import gguf

    out = {}
    manifest_dir = sorted(gguf_dir.glob("*.gguf"))
    for p in manifest_dir:
        r = gguf.GGUFReader(p)
        for t in r.tensors:
            parts = t.name.split(".")
            if len(parts) == 4 and parts[0] == "blk" and parts[2].endswith("_exps") and parts[3] == "weight":
                role = parts[2][len("ffn_") : -len("_exps")]
                out[(int(parts[1]), role)] = (str(p), int(t.data_offset), int(t.n_bytes) // int(t.shape[-1]))
        del r
    return out


def cmd_reader(a) -> dict:
    torch, ep = load_expert_pack(a.relax_layers)
    manifest = json.loads(a.manifest.read_text(encoding="utf-8"))
    model = manifest["model"]
    layers, experts, top_k = int(model["num_hidden_layers"]), int(model["num_experts"]), int(model["num_experts_per_token"])
    object_bytes = int(manifest["expert_pack"]["object_bytes"])
    slots = 2 * top_k
    reserve_mib = 1
    torch.cuda.set_free_bytes(reserve_mib * 1024 * 1024 + slots * object_bytes)
    store = ep.KimiGGMLExpertPackStore(
        a.pack,
        manifest_path=a.manifest,
        expected_layers=layers,
        expected_experts=experts,
        expected_top_k=top_k,
        cache_vram_mib=1 << 20,
        cache_vram_reserve_mib=reserve_mib,
        stage_slots=4,
        direct_io=a.direct_io,
    )
    store.initialize_device_cache("cuda")
    active = sorted(store.active_moe_layer_ids)
    if a.sample:
        rng = random.Random(a.sample)
        routes = [(active[0], list(range(top_k))), (active[-1], list(range(experts - top_k, experts)))]
        for layer in rng.sample(active, min(a.sample, len(active))):
            routes.append((layer, rng.sample(range(experts), top_k)))
    else:
        routes = []
        for layer in active:
            for start in range(0, experts, top_k):
                ids = list(range(start, min(start + top_k, experts)))
                routes.append((layer, ids + ids[: top_k - len(ids)]))
    where = source_slices(a.gguf_dir)
    fd = os.open(a.pack, os.O_RDONLY)
    sources = {}
    checked = set()
    try:
        for layer, ids in routes:
            _, slot_ids = store.acquire(layer, torch.tensor([ids], dtype=torch.int64))
            for expert, slot in zip(ids, slot_ids):
                cached = store.device_cache[slot].numpy_view().tobytes()
                offset = store.object_offsets[(layer, expert)]
                if cached != os.pread(fd, object_bytes, offset):
                    raise SystemExit(f"FAIL: object {(layer, expert)} in the reader's cache differs from pread of the pack")
                want = b""
                for role in ("up", "gate", "down"):
                    shard, data_offset, per = where[(layer, role)]
                    if shard not in sources:
                        sources[shard] = os.open(shard, os.O_RDONLY)
                    at = store.role_offsets[role]
                    want += bytes(at - len(want)) + os.pread(sources[shard], per, data_offset + expert * per)
                if cached != want:
                    raise SystemExit(f"FAIL: object {(layer, expert)} differs from the source slices")
                checked.add((layer, expert))
            store.mark_used(slot_ids)
    finally:
        os.close(fd)
        for f in sources.values():
            os.close(f)
        stats = store.snapshot()
        store.close()
    return {"objects_checked": len(checked), "object_bytes": object_bytes, "pack_reads": stats["pack_reads"],
            "pack_read_bytes": stats["pack_read_bytes"], "cache_misses": stats["cache_misses"], "direct_io": a.direct_io}


def cmd_text(a) -> dict:
    text = a.manifest.read_text(encoding="utf-8")
    again = json.dumps(json.loads(text), ensure_ascii=False, indent=2, sort_keys=True) + "\n"
    if text != again:
        raise SystemExit("FAIL: the manifest is not what json.dump(indent=2, sort_keys=True, ensure_ascii=False) writes")
    return {"bytes": len(text.encode())}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("write", "validate", "manifest", "reader", "text"):
        p = sub.add_parser(name)
        if name != "text":
            p.add_argument("--gguf-dir", type=Path, required=True)
        if name in ("write", "validate", "manifest"):
            p.add_argument("--config", type=Path, required=True)
            p.add_argument("--relax-audit", action="store_true")
        if name in ("validate", "manifest", "reader"):
            p.add_argument("--pack", type=Path, required=True)
        if name in ("validate", "manifest"):
            p.add_argument("--payload-samples", type=int, default=6)
            p.add_argument("--full-pack-hash", action="store_true")
        if name == "write":
            p.add_argument("--out", type=Path, required=True)
        if name == "manifest":
            p.add_argument("--tokenizer-dir", type=Path, required=True)
            p.add_argument("--out", type=Path, required=True)
            p.add_argument("--full-source-hashes", action="store_true")
        if name in ("reader", "text"):
            p.add_argument("--manifest", type=Path, required=True)
        if name == "reader":
            p.add_argument("--direct-io", action="store_true")
            p.add_argument("--sample", type=int, default=0)
            p.add_argument("--relax-layers", action="store_true")
    a = ap.parse_args()
    run = {"write": cmd_write, "validate": cmd_validate, "manifest": cmd_manifest, "reader": cmd_reader, "text": cmd_text}[a.cmd]
    try:
        result = run(a)
    except (ValueError, OSError, EOFError) as e:
        print(f"SGLang refused: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
