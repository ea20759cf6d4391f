#!/usr/bin/env python3
"""Write a corpus of broken expert packs (SGLANG-EXPERTPACK-v1) for `xpackfs inspect`.

    python3 tools/corpus/make_bad_pack.py OUTDIR
writes OUTDIR/<case>.pack (special files under OUTDIR/special/) and OUTDIR/cases.json in the
format of tools/corpus/corpus_util.py. Layouts: shared/reference/expert-pack.md (176-byte header,
328-byte index entries).
"""
from __future__ import annotations

import struct
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from corpus_util import Corpus, mkfifo, symlink  # noqa: E402

MAGIC = b"SGLANG-EXPERTPACK-v1\0\0\0\0"
HEADER, ENTRY = 176, 328


def header(index_count=3, data_start=4096, header_bytes=HEADER, entry_bytes=ENTRY, magic=MAGIC) -> bytes:
    h = magic + struct.pack("<IIII", 1, header_bytes, entry_bytes, 3) + struct.pack("<QQQ", index_count, data_start, 4096)
    h += struct.pack("<IIII", 1, 1, 1, 3) + bytes(range(32)) * 3
    assert len(h) == HEADER
    return h


def entry(role=0, pack_nbytes=1024, name=b"blk.0.ffn_gate_exps.weight") -> bytes:
    e = struct.pack("<HHBBH", 0, 0, role, 3, 39) + b"MXFP4".ljust(16, b"\0") + name.ljust(80, b"\0")[:80]
    e += struct.pack("<6Q", 0, 3072, 0, 1024, 4096 + role * 1024, pack_nbytes) + bytes(96)
    e += struct.pack("<4Q", 64, 32, 1, 0) + b"mxfp4".ljust(16, b"\0") + b"identity-v1".ljust(16, b"\0") + struct.pack("<QQ", 32, 7)
    assert len(e) == ENTRY, len(e)
    return e


def pack(h: bytes, entries: list[bytes], size=8192) -> bytes:
    b = h + b"".join(entries)
    return b + bytes(max(0, size - len(b)))


def main() -> int:
    c = Corpus(Path(sys.argv[1]), "pack")
    out = c.out

    def case(name, data: bytes | None, rule):
        if data is not None:
            c.path(f"{name}.pack").write_bytes(data)
        c.add(name, f"{name}.pack", {"inspect": rule}, names=f"{name}.pack")

    case("ok", pack(header(), [entry(r) for r in range(3)]), "ok")
    case("empty", b"", "cannot read the header")
    case("truncated_header", header()[:100], "cannot read the header")
    case("bad_magic", pack(header(magic=b"X" * 24), []), "not an SGLANG-EXPERTPACK-v1 file (bad magic)")
    case("header_bytes_wrong", pack(header(header_bytes=200), []), "header_bytes/entry_bytes are 200/328, expected 176/328")
    case("index_count_huge", pack(header(index_count=10 ** 15), []), "index of 1000000000000000 entries does not fit")
    wrap = ((1 << 64) - 1) // ENTRY  # index_count * 328 fits u64, 176 + that does not
    case("index_bytes_wrap", pack(header(index_count=wrap), []), f"index of {wrap} entries does not fit")
    case("index_count_overflow", pack(header(index_count=(1 << 64) - 1), []), f"index of {(1 << 64) - 1} entries does not fit")
    case("data_start_before_index", pack(header(index_count=3, data_start=200), [entry(r) for r in range(3)]), "does not fit before data_start 200")
    case("index_past_end", pack(header(index_count=30), [entry(r) for r in range(3)], size=0), "index of 30 entries does not fit")
    case("payload_overflow", pack(header(), [entry(0, 1 << 63), entry(1, 1 << 63), entry(2)]), "index entry 1: pack_nbytes 9223372036854775808 makes the payload total overflow")
    case("unknown_role", pack(header(), [entry(7) for _ in range(3)]), "ok")
    case("name_not_utf8", pack(header(), [entry(0, name=b"\xff\xfe" * 40)] * 3), "ok")
    mkfifo(out / "special/fifo.pack")
    c.add("fifo", "special/fifo.pack", {"inspect": "is a FIFO, not a regular file"}, names="fifo.pack")
    symlink(out / "special/zero.pack", "/dev/zero")
    c.add("dev_zero", "special/zero.pack", {"inspect": "is a character device, not a regular file"}, names="zero.pack")
    (out / "special/dir.pack").mkdir(parents=True, exist_ok=True)
    c.add("directory", "special/dir.pack", {"inspect": "is a directory, not a regular file"}, names="dir.pack")
    c.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
