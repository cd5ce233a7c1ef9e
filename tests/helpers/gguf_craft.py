"""GGUF files taken apart and written back with any field changed, for hostile-input tests.

``Parts.read(path)`` holds a valid file's metadata (key -> (type, is_array, value)), its tensor
entries and its data section; ``write`` serialises them byte by byte, so a test can store what
no writer would: a count of 2^40, an offset that wraps, a token that is not UTF-8.  ``raw``
replaces one key's encoded value (type field included) with given bytes.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gguf.constants import GGUFValueType as V

from iron.lm.gguf_file import GGUFFile

_FORMATS = {V.UINT8: "<B", V.INT8: "<b", V.UINT16: "<H", V.INT16: "<h", V.UINT32: "<I",
            V.INT32: "<i", V.FLOAT32: "<f", V.BOOL: "<?", V.UINT64: "<Q", V.INT64: "<q",
            V.FLOAT64: "<d"}


def string(s: str | bytes) -> bytes:
    raw = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(raw)) + raw


def scalar(t: V, value: Any) -> bytes:
    return string(value) if t == V.STRING else struct.pack(_FORMATS[t], value)


def value_bytes(t: V, is_array: bool, value: Any) -> bytes:
    """The encoded type field(s) and value of one metadata entry."""
    if not is_array:
        return struct.pack("<I", t) + scalar(t, value)
    head = struct.pack("<IIQ", V.ARRAY, t, len(value))
    return head + b"".join(scalar(t, v) for v in value)


@dataclass
class Parts:
    kv: dict[str, tuple[V, bool, Any]]
    tensors: list[dict[str, Any]]  # name, dims, type, offset
    data: bytes
    alignment: int = 32
    raw: dict[str, bytes] = field(default_factory=dict)

    @classmethod
    def read(cls, path: Path) -> Parts:
        f = GGUFFile.open(path)
        kv = {k: (v.type, v.is_array, v.contents()) for k, v in f.fields.items()}
        tensors = [{"name": t.name, "dims": list(t.dims), "type": int(t.tensor_type),
                    "offset": t.offset} for t in f.tensors]
        return cls(kv, tensors, bytes(f.buf[f.data_offset:]), f.alignment)

    def tensor(self, name: str) -> dict[str, Any]:
        return next(t for t in self.tensors if t["name"] == name)

    def encode(self) -> bytes:
        out = [b"GGUF", struct.pack("<IQQ", 3, len(self.tensors), len(self.kv))]
        for key, (t, is_array, value) in self.kv.items():
            out += [string(key), self.raw.get(key) or value_bytes(t, is_array, value)]
        for t in self.tensors:
            out += [string(t["name"]), struct.pack("<I", len(t["dims"])),
                    b"".join(struct.pack("<Q", d) for d in t["dims"]),
                    struct.pack("<IQ", t["type"], t["offset"])]
        head = b"".join(out)
        pad = -len(head) % self.alignment
        return head + b"\0" * pad + self.data

    def write(self, path: Path) -> Path:
        path.write_bytes(self.encode())
        return path
