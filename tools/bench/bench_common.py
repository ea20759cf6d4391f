"""Shared by the bench tools: the large random-MXFP4 GGUF they all read."""
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def bench_gguf(workdir: Path, layers: int = 8, experts: int = 32, hidden: int = 2048, ff: int = 1536) -> Path:
    """Path of `bench-LxExHxF.gguf` in workdir, written by make_sample_gguf.py --fast-random if missing."""
    workdir.mkdir(parents=True, exist_ok=True)
    src = workdir / f"bench-{layers}x{experts}x{hidden}x{ff}.gguf"
    if not src.exists():
        subprocess.run([sys.executable, str(REPO / "tools/fixtures/make_sample_gguf.py"), str(src), "--fast-random",
                        "--layers", str(layers), "--experts", str(experts), "--hidden", str(hidden), "--ff", str(ff)], check=True)
    return src
