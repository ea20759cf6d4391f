#!/usr/bin/env python3
"""Read random ranges of every file under MOUNT with pread, mmap and O_DIRECT for a bounded
time, comparing each byte with the same file under REF. Exit 1 on the first difference.

    python3 tools/peers/stress_reader.py MOUNT REF [--seconds 3] [--seed 1]
"""
import mmap
import os
import random
import sys
import time
from pathlib import Path


def main() -> int:
    mount, ref = Path(sys.argv[1]), Path(sys.argv[2])
    seconds = float(sys.argv[sys.argv.index("--seconds") + 1]) if "--seconds" in sys.argv else 3.0
    seed = int(sys.argv[sys.argv.index("--seed") + 1]) if "--seed" in sys.argv else 1
    rng = random.Random(seed)
    files = [p.relative_to(ref) for p in ref.rglob("*") if p.is_file() and p.stat().st_size > 0]
    refs = {f: (ref / f).read_bytes() for f in files}
    end = time.monotonic() + seconds
    n = 0
    buf = mmap.mmap(-1, 1 << 20)
    while time.monotonic() < end:
        f = rng.choice(files)
        want = refs[f]
        mode = rng.choice(["pread", "mmap", "direct"])
        if mode == "direct" and len(want) >= 4096:
            off = rng.randrange(0, len(want) // 4096) * 4096
            ln = min(len(buf), (rng.randrange(1, 64)) * 4096)
            fd = os.open(mount / f, os.O_RDONLY | os.O_DIRECT)
            try:
                got_n = os.preadv(fd, [memoryview(buf)[:ln]], off)
            finally:
                os.close(fd)
            got = bytes(buf[:got_n])
        else:
            off = rng.randrange(0, len(want))
            ln = rng.randrange(1, min(len(want) - off, 1 << 20) + 1)
            if mode == "mmap":
                with open(mount / f, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as m:
                    got = bytes(m[off:off + ln])
            else:
                fd = os.open(mount / f, os.O_RDONLY)
                try:
                    got = os.pread(fd, ln, off)
                finally:
                    os.close(fd)
        if got != want[off:off + len(got)] or (mode != "direct" and len(got) != ln):
            print(f"MISMATCH {f} {mode} off={off} len={ln}", file=sys.stderr)
            return 1
        n += 1
    print(n)
    return 0


if __name__ == "__main__":
    sys.exit(main())
