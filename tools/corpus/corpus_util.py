"""Shared by the hostile-input corpus generators (tools/corpus/make_bad_*.py): the case record the
harness (tests/hostile.rs) reads, a byte-level safetensors writer, and special files.

A case is one input run through every entry point (`mount` and `materialize --verify` for
every view, `digest`, `validate-int8`, `inspect`). Whatever the entry point, nothing may
panic, abort, hang or use more than the RSS target. `expect` names what the entry points the
case is about must do:

    {"mount": RULE | "ok" | "eio", "materialize": RULE | "ok", "digest": ..., "validate-int8": ..., "inspect": ...}

RULE is a substring the refusal (exit 1 or 2) must contain; "ok" means it must succeed;
"eio" (mount only) means the mount succeeds and reading some file gives EIO (content that
only reading can find). `views` limits the mount/materialize expectations to those views
(default: every view); a key `mount:VIEW` or `materialize:VIEW` sets that view's own. `names` is a substring (the offending file's name) the refusal must
also contain. The harness gives `view=` and `digest_store=` first, so a case's own options
win. Python standard library only.
"""
from __future__ import annotations

import json
import os
import random
import shutil
import struct
from pathlib import Path

VIEWS = ["auto", "expert-pack", "bf16-cache", "requant", "kt-int8"]


class Corpus:
    def __init__(self, out: Path, klass: str):
        self.out = out
        self.klass = klass
        self.cases: list[dict] = []
        # Start clean: writing into a previous run's FIFOs would block. Only a directory this
        # tool wrote (it has cases.json) is removed.
        if (out / "cases.json").is_file():
            shutil.rmtree(out)
        elif out.exists() and any(out.iterdir()):
            raise SystemExit(f"{out} is not empty and holds no corpus (cases.json): refusing to write there")
        out.mkdir(parents=True, exist_ok=True)

    def path(self, rel: str) -> Path:
        p = self.out / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        return p

    def add(self, cid: str, source: str, expect: dict, *, options=(), args=(), views=None, names=None,
            mountpoint: str = "dir", note: str = "") -> None:
        """`source` is relative to the corpus directory (or absolute)."""
        for k in expect:
            entry, _, v = k.partition(":")
            assert entry in ("mount", "materialize", "digest", "validate-int8", "inspect") and (not v or v in VIEWS), k
        if any(c["id"] == f"{self.klass}/{cid}" for c in self.cases):
            raise ValueError(f"duplicate case {cid}")
        self.cases.append({
            "id": f"{self.klass}/{cid}", "class": self.klass, "source": source, "options": list(options),
            "args": list(args), "expect": expect, "views": views, "names": names, "mountpoint": mountpoint,
            "note": note,
        })

    def write(self) -> None:
        (self.out / "cases.json").write_text(json.dumps(self.cases, indent=1))
        print(f"{len(self.cases)} {self.klass} cases in {self.out}")


def refused_everywhere(rule: str) -> dict:
    """A source every entry point that opens it must refuse (parser-level rules)."""
    return {"mount": rule, "materialize": rule, "digest": rule}


def mkfifo(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() or path.is_symlink():
        path.unlink()
    os.mkfifo(path)


def symlink(path: Path, target: str | Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() or path.is_symlink():
        path.unlink()
    os.symlink(target, path)


# --- safetensors, byte by byte (so that every field can be made wrong) ---

DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
               "F8_E4M3": 1, "F8_E8M0": 1, "BOOL": 1}


def st_header(tensors, metadata=None) -> dict:
    """tensors: [(name, dtype, shape, data)] in data order; returns the header dict."""
    h = {}
    if metadata is not None:
        h["__metadata__"] = metadata
    off = 0
    for name, dtype, shape, data in tensors:
        h[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + len(data)]}
        off += len(data)
    return h


def st_bytes(tensors, metadata=None, header: dict | None = None, header_text: bytes | None = None) -> bytes:
    text = header_text if header_text is not None else json.dumps(
        header if header is not None else st_header(tensors, metadata), separators=(",", ":")).encode()
    text += b" " * ((-len(text)) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(t[3] for t in tensors)


class Rand:
    """Deterministic tensor contents (fast: whole byte strings, mapped through tables)."""

    def __init__(self, seed: int):
        self.r = random.Random(seed)

    def bytes(self, n: int) -> bytes:
        return self.r.randbytes(n)

    def bf16(self, n: int) -> bytes:
        """Finite values of magnitude 2^-8..2^-6, either sign."""
        out = bytearray(2 * n)
        out[0::2] = self.r.randbytes(n)
        out[1::2] = self.r.randbytes(n).translate(bytes((0x3C if b < 128 else 0xBC) + (b & 1) for b in range(256)))
        return bytes(out)

    def f32(self, n: int) -> bytes:
        out = bytearray(self.r.randbytes(4 * n))
        out[3::4] = bytes(out[3::4]).translate(bytes((0x3C if b < 128 else 0xBC) + (b & 1) for b in range(256)))
        return bytes(out)

    def fp8(self, n: int) -> bytes:
        """E4M3 without the NaN codes (0x7F, 0xFF)."""
        return self.r.randbytes(n).translate(bytes(0x38 if b & 0x7F == 0x7F else b for b in range(256)))

    def e8m0(self, n: int) -> bytes:
        """Scales 2^-9..2^2."""
        return self.r.randbytes(n).translate(bytes(118 + b % 12 for b in range(256)))

    def i8(self, n: int) -> bytes:
        return self.r.randbytes(n)


def numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
