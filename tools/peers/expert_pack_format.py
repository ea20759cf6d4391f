"""SGLANG-EXPERTPACK-v1 structures, written from the published facts
(`shared/reference/expert-pack.md`): the struct formats, flags and helpers that the
first seed (`sglang_expert_pack_build.py`) imports as its sibling `format.py`.

Used two ways: as `format.py` next to the seed so that the seed itself runs here, and
by `check_pack.py` as an independent reader of packs (not derived from xpackfs code).
"""
from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import asdict, dataclass, field
from pathlib import Path

MAGIC = b"SGLANG-EXPERTPACK-v1\0\0\0\0"
VERSION = 1
HEADER_STRUCT = struct.Struct("<24sIIIIQQQIIII32s32s32s")
ENTRY_STRUCT = struct.Struct("<HHBBH16s80sQQQQQQ32s32s32s4Q16s16sQQ")
FLAG_IDENTITY_PAYLOAD = 1 << 0
FLAG_TRIPLET_OBJECTS = 1 << 1
ROLE_NAMES = ("gate", "up", "down")
assert HEADER_STRUCT.size == 176 and ENTRY_STRUCT.size == 328


def align_up(value: int, alignment: int) -> int:
    if alignment <= 0 or alignment & (alignment - 1):
        raise ValueError(f"alignment must be a positive power of two, got {alignment}")
    return (value + alignment - 1) // alignment * alignment


def sha256_file(path: Path, chunk: int = 16 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb", buffering=0) as stream:
        while block := stream.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def _fixed(text: str, width: int, what: str) -> bytes:
    raw = text.encode("ascii")
    if len(raw) >= width:
        raise ValueError(f"{what} {text!r} does not fit {width} bytes")
    return raw


def _text(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode("ascii")


@dataclass
class PackHeader:
    flags: int
    index_count: int
    data_start: int
    alignment: int
    num_layers: int
    num_experts: int
    top_k: int
    role_count: int
    model_identity_sha256: str
    source_blob_sha256: str
    config_sha256: str
    version: int = VERSION
    header_bytes: int = HEADER_STRUCT.size
    entry_bytes: int = ENTRY_STRUCT.size

    def pack(self) -> bytes:
        return HEADER_STRUCT.pack(
            MAGIC, self.version, self.header_bytes, self.entry_bytes, self.flags,
            self.index_count, self.data_start, self.alignment,
            self.num_layers, self.num_experts, self.top_k, self.role_count,
            bytes.fromhex(self.model_identity_sha256), bytes.fromhex(self.source_blob_sha256),
            bytes.fromhex(self.config_sha256),
        )

    @classmethod
    def unpack(cls, raw: bytes) -> "PackHeader":
        (magic, version, header_bytes, entry_bytes, flags, index_count, data_start, alignment,
         num_layers, num_experts, top_k, role_count, model, source, config) = HEADER_STRUCT.unpack(raw[:HEADER_STRUCT.size])
        if magic != MAGIC:
            raise ValueError(f"bad magic {magic!r}")
        return cls(flags, index_count, data_start, alignment, num_layers, num_experts, top_k, role_count,
                   model.hex(), source.hex(), config.hex(), version, header_bytes, entry_bytes)


@dataclass
class IndexEntry:
    layer: int
    expert: int
    role: str
    dtype_id: int
    dtype: str
    tensor_name: str
    source_tensor_offset: int
    source_tensor_nbytes: int
    source_slice_offset: int
    source_slice_nbytes: int
    pack_offset: int
    pack_nbytes: int
    source_tensor_sha256: str
    source_slice_sha256: str
    checksum: str
    shape: tuple
    quant_scheme: str
    transform_id: str
    block_size: int
    generation: int

    @property
    def role_id(self) -> int:
        return ROLE_NAMES.index(self.role)

    def pack(self) -> bytes:
        shape = tuple(int(v) for v in self.shape)
        if not 1 <= len(shape) <= 4:
            raise ValueError(f"rank {len(shape)} out of range for {self.tensor_name}")
        return ENTRY_STRUCT.pack(
            self.layer, self.expert, self.role_id, len(shape), self.dtype_id,
            _fixed(self.dtype, 16, "dtype"), _fixed(self.tensor_name, 80, "tensor_name"),
            self.source_tensor_offset, self.source_tensor_nbytes, self.source_slice_offset,
            self.source_slice_nbytes, self.pack_offset, self.pack_nbytes,
            bytes.fromhex(self.source_tensor_sha256), bytes.fromhex(self.source_slice_sha256),
            bytes.fromhex(self.checksum), *(shape + (0,) * (4 - len(shape))),
            _fixed(self.quant_scheme, 16, "quant_scheme"), _fixed(self.transform_id, 16, "transform_id"),
            self.block_size, self.generation,
        )

    @classmethod
    def unpack(cls, raw: bytes) -> "IndexEntry":
        v = ENTRY_STRUCT.unpack(raw)
        rank = v[3]
        return cls(
            layer=v[0], expert=v[1], role=ROLE_NAMES[v[2]], dtype_id=v[4], dtype=_text(v[5]),
            tensor_name=_text(v[6]), source_tensor_offset=v[7], source_tensor_nbytes=v[8],
            source_slice_offset=v[9], source_slice_nbytes=v[10], pack_offset=v[11], pack_nbytes=v[12],
            source_tensor_sha256=v[13].hex(), source_slice_sha256=v[14].hex(), checksum=v[15].hex(),
            shape=tuple(v[16:16 + rank]), quant_scheme=_text(v[20]), transform_id=_text(v[21]),
            block_size=v[22], generation=v[23],
        )

    def to_dict(self) -> dict:
        d = asdict(self)
        d["shape"] = list(self.shape)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "IndexEntry":
        d = dict(d)
        d["shape"] = tuple(d["shape"])
        return cls(**d)


def write_index(stream, header: PackHeader, entries: list) -> str:
    ordered = sorted(entries, key=lambda e: (e.layer, e.expert, e.role_id))
    if len(ordered) != header.index_count:
        raise ValueError(f"{len(ordered)} entries for index_count {header.index_count}")
    raw = b"".join(entry.pack() for entry in ordered)
    stream.seek(HEADER_STRUCT.size)
    stream.write(raw)
    return hashlib.sha256(raw).hexdigest()


def read_pack_index(path: Path) -> tuple[PackHeader, list[IndexEntry], bytes]:
    with open(path, "rb") as stream:
        header = PackHeader.unpack(stream.read(HEADER_STRUCT.size))
        raw = stream.read(header.index_count * ENTRY_STRUCT.size)
    entries = [IndexEntry.unpack(raw[i:i + ENTRY_STRUCT.size]) for i in range(0, len(raw), ENTRY_STRUCT.size)]
    return header, entries, raw


def inspect_pack(path: Path, limit: int = 12) -> None:
    header, entries, _ = read_pack_index(Path(path))
    roles: dict[str, int] = {}
    for e in entries:
        roles[e.role] = roles.get(e.role, 0) + 1
    print(json.dumps({
        "path": str(path), "header": asdict(header), "role_counts": roles,
        "payload_bytes": sum(e.pack_nbytes for e in entries),
        "entries": [e.to_dict() for e in entries[:limit]],
    }, indent=2, sort_keys=True))
