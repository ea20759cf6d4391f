"""The four seed programs are kept as text files in shared/seeds/ with a preamble before the
program proper; these helpers cut the program out (from its first line) and write it where a
tool can run or import it."""
from __future__ import annotations

from pathlib import Path

SHEBANG = "#!/usr/bin/env python3"


def seed_text(seeds: Path, name: str, marker: str = SHEBANG) -> str:
    """The program in seeds/NAME, from the first occurrence of `marker`."""
    text = (Path(seeds) / name).read_text(encoding="utf-8")
    return text[text.index(marker):]


def write_seed(seeds: Path, name: str, dest: Path, marker: str = SHEBANG) -> Path:
    """Write the program in seeds/NAME to `dest` and return `dest`."""
    dest = Path(dest)
    dest.write_text(seed_text(seeds, name, marker), encoding="utf-8")
    return dest
