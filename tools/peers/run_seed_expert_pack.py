#!/usr/bin/env python3
"""Run the first seed (`shared/seeds/sglang_expert_pack_build.py.txt`) itself on a GGUF.

The seed imports a sibling `format.py` that is not shipped; `expert_pack_format.py`
(written from the published struct formats) stands in for it. The seed also records
`git rev-parse HEAD` of its checkout, so it is run from a throwaway git repository.

    python3 tools/peers/run_seed_expert_pack.py --seeds ../shared/seeds --source samples/sample-moe.gguf \
        --out /tmp/seedpack --model-identity-sha256 HEX --config-sha256 HEX --top-k 2 [--alignment 4096]

Writes OUT/<stem>.pack, .pack.manifest.json and .pack.checkpoint.json.
"""
from __future__ import annotations

import argparse
import hashlib
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import gguf

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tools/: xptools
from xptools.seeds import seed_text  # noqa: E402

HERE = Path(__file__).resolve().parent


def seed_source(seeds: Path) -> str:
    return seed_text(seeds, "sglang_expert_pack_build.py.txt")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=Path, required=True)
    ap.add_argument("--source", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--model-identity-sha256", required=True)
    ap.add_argument("--config-sha256", required=True)
    ap.add_argument("--top-k", type=int, required=True)
    ap.add_argument("--alignment", type=int, default=4096)
    ap.add_argument("--model-ref", default="deepseek-v4-flash")
    args = ap.parse_args()

    reader = gguf.GGUFReader(args.source, "r")
    layers = sorted({int(t.name.split(".")[1]) for t in reader.tensors if t.name.endswith("_exps.weight")})
    experts = int([t for t in reader.tensors if t.name.endswith("_exps.weight")][0].shape[-1])
    with open(args.source, "rb") as f:
        source_sha = hashlib.file_digest(f, "sha256").hexdigest()

    with tempfile.TemporaryDirectory() as tmp:
        tool = Path(tmp) / "sglang" / "tools" / "expert_pack"
        tool.mkdir(parents=True)
        (tool / "build.py").write_text(seed_source(args.seeds), encoding="utf-8")
        shutil.copy(HERE / "expert_pack_format.py", tool / "format.py")
        repo = Path(tmp) / "sglang"
        git = ["git", "-c", "user.email=seed@localhost", "-c", "user.name=seed", "-c", "init.defaultBranch=main"]
        subprocess.run(git + ["init", "-q"], cwd=repo, check=True)
        subprocess.run(git + ["add", "."], cwd=repo, check=True)
        subprocess.run(git + ["commit", "-q", "-m", "seed"], cwd=repo, check=True)
        args.out.mkdir(parents=True, exist_ok=True)
        stem = args.source.name.removesuffix(".gguf")
        cmd = [
            sys.executable, str(tool / "build.py"),
            "--source", str(args.source), "--source-sha256", source_sha,
            "--output", str(args.out / f"{stem}.pack"),
            "--model-ref", args.model_ref,
            "--model-identity-sha256", args.model_identity_sha256,
            "--config-sha256", args.config_sha256,
            "--num-layers", str(len(layers)), "--num-experts", str(experts),
            "--top-k", str(args.top_k), "--alignment", str(args.alignment),
            "--safety-margin-gib", "0",
        ]
        return subprocess.run(cmd).returncode


if __name__ == "__main__":
    sys.exit(main())
