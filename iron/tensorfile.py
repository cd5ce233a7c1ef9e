"""Safetensors files, read without any library code path that could execute data.

A file is an 8-byte little-endian header length, a JSON header, then the data section.  The
header is parsed and checked strictly (duplicate keys, dtypes, shapes against byte ranges,
overlaps); tensors come back as read-only numpy views, in the dtype stored (bfloat16 is
``ml_dtypes.bfloat16``), either over a memory map (checkpoints) or over one read into huge
pages (weights a model streams on every call, see ``iron.memory``).  Checkpoints and bundles
both read their tensors here.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from .errors import CheckpointError
from .jsonfile import loads
from .memory import huge_page_buffer
from .util import open_regular


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


SAFETENSORS_DTYPES: dict[str, np.dtype] = {
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "F16": np.dtype("<f2"),
    "F32": np.dtype("<f4"),
    "U8": np.dtype(np.uint8),  # quantized weight blocks (iron.quant)
}
_MAX_HEADER = 100_000_000  # the safetensors format's own limit


@dataclass(frozen=True)
class TensorInfo:
    """One tensor's entry in a safetensors header; offsets are into the data section."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


def _reject_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"duplicate key {k!r}")
        out[k] = v
    return out


def read_safetensors_metadata(path: Path) -> dict[str, str]:
    """The ``__metadata__`` object of a safetensors file (validated like the whole header)."""
    read_safetensors_header(path)
    with open_regular(path) as f:
        n = int.from_bytes(f.read(8), "little")
        return loads(f.read(n).decode("utf-8")).get("__metadata__", {})


def read_safetensors_header(path: Path) -> tuple[int, dict[str, TensorInfo]]:
    """Parse and validate a safetensors header: ``(data section offset, name -> TensorInfo)``.

    Checks: the header length fits the file, the JSON is an object without duplicate keys,
    every entry has exactly ``dtype``/``shape``/``data_offsets``, the dtype is BF16, F16, F32 or U8,
    the byte range matches the shape and lies inside the data section, and no two overlap.
    """
    try:
        with open_regular(path) as f:  # a FIFO or a device is refused, not waited on
            size = os.fstat(f.fileno()).st_size
            head = f.read(8)
            n = int.from_bytes(head, "little") if len(head) == 8 else -1
            if n < 2 or n > _MAX_HEADER or 8 + n > size:
                raise CheckpointError(
                    f"{path}: bad safetensors header length {n} for a file of {size} bytes "
                    "(the first 8 bytes must give a JSON header length that fits the file)")
            raw = f.read(n)
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read safetensors file ({e.strerror})") from e
    try:
        header = loads(raw.decode("utf-8"), object_pairs_hook=_reject_duplicates)
    except (UnicodeDecodeError, ValueError) as e:
        raise CheckpointError(f"{path}: safetensors header is not valid JSON ({e})") from e
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: safetensors header must be a JSON object")
    data_start = 8 + n
    data_len = size - data_start
    infos: dict[str, TensorInfo] = {}
    for name, entry in header.items():
        if name == "__metadata__":
            if not isinstance(entry, dict) or not all(
                    isinstance(k, str) and isinstance(v, str) for k, v in entry.items()):
                raise CheckpointError(f"{path}: __metadata__ must map strings to strings")
            continue
        where = f"{path}: tensor {name!r}"
        if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
            raise CheckpointError(f"{where}: header entry {entry!r} must have exactly the keys "
                                  "dtype, shape, data_offsets")
        dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
        if dtype not in SAFETENSORS_DTYPES:
            raise CheckpointError(f"{where}: dtype {dtype!r} is not supported "
                                  f"(use one of {', '.join(SAFETENSORS_DTYPES)})")
        if not (isinstance(shape, list) and all(_is_int(d) and d >= 0 for d in shape)):
            raise CheckpointError(f"{where}: shape {shape!r} must be a list of "
                                  "non-negative integers")
        if not (isinstance(offsets, list) and len(offsets) == 2
                and all(_is_int(o) for o in offsets)):
            raise CheckpointError(f"{where}: data_offsets {offsets!r} must be [begin, end]")
        begin, end = offsets
        if not 0 <= begin <= end <= data_len:
            raise CheckpointError(f"{where}: data_offsets {offsets} are outside the data "
                                  f"section of {data_len} bytes")
        nbytes = math.prod(shape) * SAFETENSORS_DTYPES[dtype].itemsize
        if end - begin != nbytes:
            raise CheckpointError(f"{where}: data_offsets {offsets} span {end - begin} bytes "
                                  f"but {dtype} {tuple(shape)} needs {nbytes}")
        infos[name] = TensorInfo(name, dtype, tuple(shape), begin, end)
    ordered = sorted(infos.values(), key=lambda t: (t.begin, t.end))
    for a, b in zip(ordered, ordered[1:]):
        if b.begin < a.end:
            raise CheckpointError(f"{path}: tensors {a.name!r} (bytes {a.begin}..{a.end}) and "
                                  f"{b.name!r} (bytes {b.begin}..{b.end}) overlap")
    return data_start, infos


def read_safetensors(path: str | Path, digest: list | None = None) -> dict[str, np.ndarray]:
    """Every tensor of one safetensors file, read into huge-page memory (see ``iron.memory``).

    For weights a model streams on every call: reading costs a copy at load (a fraction of a
    second for SmolLM2) and makes every later pass over them faster than a file mapping would.
    With ``digest`` (a list), the xxh3-128 of the whole file is appended to it, computed on each
    block just read, while it is still in cache.
    """
    path = Path(path)
    start, infos = read_safetensors_header(path)
    data = huge_page_buffer(path.stat().st_size - start)
    hasher = None
    if digest is not None:
        import xxhash

        hasher = xxhash.xxh3_128()
    with open_regular(path) as f:
        if hasher is not None:
            hasher.update(f.read(start))
        f.seek(start)
        done = 0
        while done < len(data):
            n = f.readinto(memoryview(data[done:done + (8 << 20)]))
            if not n:
                raise CheckpointError(f"{path}: the file ended after {start + done} bytes, "
                                      f"its header describes {start + len(data)}")
            if hasher is not None:
                hasher.update(memoryview(data[done:done + n]))
            done += n
        if hasher is not None:
            hasher.update(f.read())  # bytes past the data section (there should be none)
    if digest is not None:
        digest.append(hasher.hexdigest())
    return {name: tensor_view(data, info) for name, info in infos.items()}


def tensor_view(mm: np.ndarray, info: TensorInfo) -> np.ndarray:
    """One tensor of a data section (mapped or read), read-only, in its stored dtype and shape."""
    view = mm[info.begin:info.end].view(SAFETENSORS_DTYPES[info.dtype]).reshape(info.shape)
    view.flags.writeable = False
    return view
