#!/usr/bin/env python3
"""Drive SGLang's own expert-pack reader (`ExpertPackStore` in
../shared/reference/sglang/expert_pack.py, verbatim) over a pack, without a GPU: torch is
the stand-in in tools/peers/sglang_standin/. Every (layer, expert) object is read once through
`acquire` (SGLang's staging slots, read executor and `os.preadv` per object or per split,
short reads raised as errors), one layer at a time with every expert routed.

    python3 tools/peers/sglang_read.py PACK [--direct-io] [--splits N] [--verify] [--json]

--direct-io opens the pack with O_DIRECT (SGLang's loader default), --splits sets
read_splits (the store's default is 4, the loader reads one range per object); --verify
checks each object's three role payloads against the sha256 its index entry declares
(`checksum`) before they are "installed" in the device cache. Prints GB/s, or with --json
{"bytes", "seconds", "objects", "verified", "io_errors"}.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SHARED = Path(os.environ.get("XPACKFS_SHARED", REPO.parent / "shared"))
sys.path.insert(0, str(REPO / "tools/peers/sglang_standin"))
sys.path.insert(0, str(SHARED / "reference/sglang"))

import expert_pack  # noqa: E402  (SGLang's module)
import torch  # noqa: E402  (the stand-in)


def open_store(pack: Path, direct_io: bool, splits: int) -> expert_pack.ExpertPackStore:
    with open(pack, "rb", buffering=0) as f:  # the header only: no read-ahead of objects
        h = expert_pack.ExpertPackHeader.read(f)
    store = expert_pack.ExpertPackStore(pack, expected_layers=h.num_layers, expected_experts=h.num_experts,
                                        expected_top_k=h.top_k, read_splits=splits, direct_io=direct_io)
    # One layer's objects must fit the device cache (acquire never evicts the routed set).
    store.cache_vram_mib = max(1, (h.num_experts + 1) * store.object_payload_bytes >> 20) + 1
    store.initialize_device_cache("cuda")
    return store


def read_all(store: expert_pack.ExpertPackStore, verify: bool) -> dict:
    h = store.header
    verified = 0
    if verify:
        install = store._install_staging

        def checked(staging, slot_index, stream):
            nonlocal verified
            layer, expert = store._cache_slots[slot_index].key
            data = staging.numpy()
            for role in range(len(expert_pack.ROLE_NAMES)):
                e = store.entries[(layer, expert, role)]
                start = e.pack_offset - store.object_offsets[(layer, expert)]
                got = hashlib.sha256(data[start:start + e.pack_nbytes]).hexdigest()
                if got != e.checksum:
                    raise SystemExit(f"object ({layer}, {expert}) role {role}: sha256 {got} != index {e.checksum}")
            verified += 1
            return install(staging, slot_index, stream)

        store._install_staging = checked
    # Every expert of a layer routed once: rows of top_k experts.
    ids = list(range(h.num_experts))
    ids += ids[: (-len(ids)) % h.top_k]
    rows = [ids[i:i + h.top_k] for i in range(0, len(ids), h.top_k)]
    t0 = time.perf_counter()
    for layer in range(h.num_layers):
        slots = store.acquire(layer, torch.tensor(rows, dtype=torch.int32), is_prefill=True)[1]
        store.mark_used(slots)
    seconds = time.perf_counter() - t0
    s = store.snapshot()
    return {"bytes": s["pack_read_bytes"], "seconds": seconds, "objects": s["pack_reads"], "verified": verified,
            "io_errors": s["io_errors"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("pack", type=Path)
    ap.add_argument("--direct-io", action="store_true")
    ap.add_argument("--splits", type=int, default=expert_pack.READ_SPLITS)
    ap.add_argument("--verify", action="store_true")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    store = open_store(a.pack, a.direct_io, a.splits)
    try:
        r = read_all(store, a.verify)
    finally:
        store.close()
    if a.json:
        print(json.dumps(r))
    else:
        print(f"{r['bytes'] / 1e9:.3f} GB in {r['seconds']:.3f} s: {r['bytes'] / r['seconds'] / 1e9:.2f} GB/s "
              f"({r['objects']} objects{', verified' if a.verify else ''})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
