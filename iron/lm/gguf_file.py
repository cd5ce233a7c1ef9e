"""GGUF files read with every count and length bounded by the bytes the file has left.

The ``gguf`` package's ``GGUFReader`` trusts the file: an array whose count says 2^40 makes it
loop past the end of the file, each element a numpy array of its own, until memory runs out;
a truncated file ends in "index 0 is out of bounds".  This reader applies llama.cpp's rules
(``ggml/src/gguf.cpp``, bounded since ggml-org/llama.cpp#19856) before anything is allocated:

- a string is at most ``MAX_STRING`` bytes and no longer than what is left of the file;
- an array has at most ``MAX_ARRAY`` elements, and ``count * smallest element`` bytes must be
  left (8 per string: its length field); arrays of arrays are refused, as gguf.cpp does;
- the key/value and tensor counts are bounded the same way, by the smallest entry;
- a tensor has at most 4 dimensions, a known GGML type, rows a whole number of blocks, a name
  under 64 bytes, an offset aligned to ``general.alignment`` (a power of two, uint32), and its
  bytes inside the data section, overlapping no other tensor (offsets are Python integers: no
  sum wraps into the header);
- every string is UTF-8;
- a read past the end names what was being read, where, and how many bytes it needed.

Values are typed Python values (``int``, ``float``, ``bool``, ``str``) and arrays are read
lazily: ``GGUFValue.contents()`` decodes them when asked, so a caller can check an array's
``count`` against what the rest of the file can hold (a vocabulary against its embedding)
before building anything of that size.  Tensor data are read-only numpy views of a memory map,
shaped as the ``gguf`` package shapes them (``data``: elements for F32/F16/F64 and the
integer types, else bytes)::

    f = GGUFFile.open("model.gguf")
    f.fields["llama.block_count"].contents()        # 30
    f.fields["tokenizer.ggml.tokens"].count          # 49152, nothing decoded yet
    f.tensors[0].name, f.tensors[0].data.shape
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

from iron.errors import CheckpointError
from iron.util import open_regular

#: gguf.cpp's ``GGUF_MAX_STRING_LENGTH`` and ``GGUF_MAX_ARRAY_ELEMENTS`` (1 GiB, 2^30 elements).
MAX_STRING = 1 << 30
MAX_ARRAY = 1 << 30
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_NAME = 64  # GGML_MAX_NAME: a tensor name is shorter
DEFAULT_ALIGNMENT = 32  # GGUF_DEFAULT_ALIGNMENT
VERSIONS = (2, 3)  # version 1 had 32-bit lengths; gguf.cpp reads 2 and 3 too

_MAGIC = b"GGUF"
_SCALARS: dict[GGUFValueType, str] = {  # little-endian struct formats
    GGUFValueType.UINT8: "<B", GGUFValueType.INT8: "<b", GGUFValueType.UINT16: "<H",
    GGUFValueType.INT16: "<h", GGUFValueType.UINT32: "<I", GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f", GGUFValueType.BOOL: "<b", GGUFValueType.UINT64: "<Q",
    GGUFValueType.INT64: "<q", GGUFValueType.FLOAT64: "<d",
}
_NUMPY = {t: np.dtype(f) for t, f in _SCALARS.items()}
_STRING_PREFIX = 8  # a string's uint64 length
# the smallest key/value entry: key length, a one-byte key, the type, a one-byte value; the
# smallest tensor entry: name length (an empty name), n_dims, type, offset
_MIN_KV, _MIN_TENSOR = 8 + 1 + 4 + 1, 8 + 4 + 4 + 8
# tensor types whose data the gguf package exposes as elements rather than bytes
_ELEMENT_TYPES = {
    GGMLQuantizationType.F32: np.float32, GGMLQuantizationType.F16: np.float16,
    GGMLQuantizationType.F64: np.float64, GGMLQuantizationType.I8: np.int8,
    GGMLQuantizationType.I16: np.int16, GGMLQuantizationType.I32: np.int32,
    GGMLQuantizationType.I64: np.int64,
}


def type_name(t: GGUFValueType, is_array: bool = False) -> str:
    """``uint32``, ``string``, ``array of int32``: how messages name a value's type."""
    name = t.name.lower()
    return f"array of {name}" if is_array else name


class _Cursor:
    """A position in the file's bytes; every read checks what is left first."""

    def __init__(self, buf: Any, source: str):
        self.buf, self.source, self.pos, self.size = buf, source, 0, len(buf)

    def left(self) -> int:
        return self.size - self.pos

    def truncated(self, what: str, need: int) -> CheckpointError:
        return CheckpointError(
            f"{self.source}: truncated: {what} at byte {self.pos} needs {need} bytes, the file "
            f"ends {self.left()} bytes later (at byte {self.size}); a GGUF file must hold every "
            "entry its header counts")

    def take(self, n: int, what: str) -> int:
        """Advance past ``n`` bytes; return where they start."""
        if n > self.left():
            raise self.truncated(what, n)
        start = self.pos
        self.pos += n
        return start

    def scalar(self, t: GGUFValueType, what: str) -> Any:
        fmt = _SCALARS[t]
        value = struct.unpack_from(fmt, self.buf, self.take(struct.calcsize(fmt), what))[0]
        return bool(value) if t == GGUFValueType.BOOL else value

    def u32(self, what: str) -> int:
        return self.scalar(GGUFValueType.UINT32, what)

    def u64(self, what: str) -> int:
        return self.scalar(GGUFValueType.UINT64, what)

    def string_span(self, what: str) -> tuple[int, int]:
        """(start, length) of a length-prefixed string, bounded before anything is read."""
        n = self.u64(f"the length of {what}")
        if n > MAX_STRING:
            raise CheckpointError(f"{self.source}: {what} at byte {self.pos - 8} says it is {n} "
                                  f"bytes long; GGUF strings are at most {MAX_STRING} bytes")
        if n > self.left():
            raise self.truncated(what, n)
        return self.take(n, what), n

    def string(self, what: str) -> str:
        start, n = self.string_span(what)
        return _utf8(self.buf[start:start + n], self.source, what)


def _utf8(raw: bytes, source: str, what: str) -> str:
    try:
        return str(raw, "utf-8")
    except UnicodeDecodeError as e:
        raise CheckpointError(f"{source}: {what} is not UTF-8 text ({e.reason} at byte "
                              f"{e.start} of {raw[:40]!r}); GGUF strings are UTF-8") from None


_U64 = struct.Struct("<Q")


def _skip_strings(cur: _Cursor, count: int, key: str) -> None:
    """Move past an array of ``count`` strings, checking each length; the strings are decoded
    when asked for.  The loop is ``_Cursor.string_span`` inlined (a vocabulary has 10^5 to
    10^7 of them); at the first bad length, ``string_span`` itself says what is wrong."""
    buf, pos, size, unpack = cur.buf, cur.pos, cur.size, _U64.unpack_from
    for j in range(count):
        n = unpack(buf, pos)[0] if pos + 8 <= size else -1
        if n < 0 or n > MAX_STRING or n > size - pos - 8:
            cur.pos = pos
            cur.string_span(f"{key!r}[{j}]")
            raise AssertionError("string_span accepted what the loop refused")
        pos += 8 + n
    cur.pos = pos


@dataclass(frozen=True)
class GGUFValue:
    """One metadata value: its type (the element type, for an array), its element count, and
    where it lies in the file; ``contents()`` decodes it (arrays on first use)."""

    key: str
    type: GGUFValueType
    is_array: bool
    count: int
    offset: int
    _file: GGUFFile = field(repr=False, compare=False)

    def type_name(self) -> str:
        return type_name(self.type, self.is_array)

    def contents(self) -> Any:
        """The value: a Python scalar or string, or a list for an array (decoded once)."""
        decoded = self._file.decoded
        if self.key not in decoded:
            decoded[self.key] = self._decode()
        return decoded[self.key]

    def _decode(self) -> Any:
        cur = _Cursor(self._file.buf, self._file.source)
        cur.pos = self.offset
        if not self.is_array:
            if self.type == GGUFValueType.STRING:
                return cur.string(f"the value of {self.key!r}")
            return cur.scalar(self.type, f"the value of {self.key!r}")
        if self.type == GGUFValueType.STRING:
            return [cur.string(f"{self.key!r}[{i}]") for i in range(self.count)]
        values = np.frombuffer(self._file.buf, _NUMPY[self.type], self.count, self.offset)
        if self.type == GGUFValueType.BOOL:
            return [bool(v) for v in values]
        return values.tolist()


@dataclass(frozen=True)
class GGUFTensor:
    """One tensor: GGUF dims (innermost first, as stored), type, byte range in the file."""

    name: str
    tensor_type: GGMLQuantizationType
    dims: tuple[int, ...]
    offset: int  # into the data section
    n_bytes: int
    _file: GGUFFile = field(repr=False, compare=False)

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.dims, dtype=object)) if self.dims else 1

    @property
    def data(self) -> np.ndarray:
        """A read-only view: elements (F32, F16, F64, integers) in numpy order (dims
        reversed), or the blocks' bytes, rows of ``ne[0] / block * type size`` bytes."""
        shape = tuple(reversed(self.dims))
        start = self._file.data_offset + self.offset
        item = _ELEMENT_TYPES.get(self.tensor_type)
        if item is None:
            block, size = GGML_QUANT_SIZES[self.tensor_type]
            shape = (*shape[:-1], shape[-1] // block * size) if shape else (size,)
            item = np.uint8
        count = int(np.prod(shape, dtype=np.int64)) if shape else 1
        return np.frombuffer(self._file.buf, item, count, start).reshape(shape)


class GGUFFile:
    """A GGUF file's metadata (``fields``: key -> ``GGUFValue``) and tensors, every count and
    offset checked against the file; see the module docstring for the rules."""

    def __init__(self, buf: Any, source: str):
        self.buf, self.source = buf, source
        self.fields: dict[str, GGUFValue] = {}
        self.decoded: dict[str, Any] = {}  # key -> contents(), kept once decoded
        self.tensors: list[GGUFTensor] = []
        self.alignment = DEFAULT_ALIGNMENT
        self.data_offset = 0
        self.version = 0

    @classmethod
    def open(cls, path: str | Path) -> GGUFFile:
        """Read and check ``path``'s header; ``CheckpointError`` names the rule it breaks."""
        try:
            with open_regular(path) as f:
                size = os.fstat(f.fileno()).st_size
                buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
        except OSError as e:
            raise CheckpointError(f"{path}: cannot read the GGUF file ({e})") from None
        out = cls(buf, str(path))
        out._parse()
        return out

    # -- the header -----------------------------------------------------------------------

    def _parse(self) -> None:
        cur = _Cursor(self.buf, self.source)
        magic = bytes(self.buf[cur.take(4, "the magic 'GGUF'"):4])
        if magic != _MAGIC:
            raise CheckpointError(f"{self.source}: starts with {magic!r}, not the GGUF magic "
                                  f"{_MAGIC!r}; not a GGUF file")
        self.version = cur.u32("the version")
        if self.version & 0xFFFF == 0 and self.version:
            raise CheckpointError(f"{self.source}: version field {self.version:#x} reads as a "
                                  "big-endian GGUF file, which is not supported")
        if self.version not in VERSIONS:
            raise CheckpointError(f"{self.source}: GGUF version {self.version} is not "
                                  f"supported (only {', '.join(map(str, VERSIONS))})")
        n_tensors = cur.u64("the tensor count")
        n_kv = cur.u64("the metadata key/value count")
        for count, least, what in ((n_kv, _MIN_KV, "metadata entries"),
                                   (n_tensors, _MIN_TENSOR, "tensors")):
            if count * least > cur.left():
                raise CheckpointError(
                    f"{self.source}: the header counts {count} {what}, which need at least "
                    f"{count * least} bytes ({least} each), but only {cur.left()} bytes follow: "
                    "the file is truncated or its header is wrong")
        for i in range(n_kv):
            self._read_kv(cur, i)
        self._read_alignment()
        infos = [self._read_tensor_info(cur, i) for i in range(n_tensors)]
        pad = -cur.pos % self.alignment
        if n_tensors and pad > cur.left():
            raise cur.truncated("the padding before the data section", pad)
        self.data_offset = cur.pos + (pad if n_tensors else 0)
        self._place_tensors(infos)

    def _read_kv(self, cur: _Cursor, i: int) -> None:
        key = cur.string(f"the key of metadata entry #{i}")
        if not key:
            raise CheckpointError(f"{self.source}: metadata entry #{i} has an empty key")
        if key in self.fields:
            raise CheckpointError(f"{self.source}: metadata key {key!r} appears twice")
        t = self._value_type(cur.u32(f"the type of {key!r}"), key)
        is_array, count = t == GGUFValueType.ARRAY, 1
        if is_array:
            t = self._value_type(cur.u32(f"the element type of {key!r}"), key)
            if t == GGUFValueType.ARRAY:
                raise CheckpointError(f"{self.source}: metadata {key!r} is an array of arrays, "
                                      "which GGUF readers (llama.cpp's gguf.cpp) refuse")
            count = cur.u64(f"the element count of {key!r}")
            least = _STRING_PREFIX if t == GGUFValueType.STRING else _NUMPY[t].itemsize
            if count > MAX_ARRAY or count * least > cur.left():
                raise CheckpointError(
                    f"{self.source}: metadata {key!r} says it holds {count} {t.name.lower()} "
                    f"elements, which need at least {count * least} bytes, but "
                    f"{cur.left()} bytes are left in the file (and an array holds at most "
                    f"{MAX_ARRAY} elements)")
        start = cur.pos
        if t != GGUFValueType.STRING:
            cur.take(count * _NUMPY[t].itemsize, f"the value of {key!r}")
        elif not is_array:
            cur.string_span(f"the value of {key!r}")
        else:
            _skip_strings(cur, count, key)
        self.fields[key] = GGUFValue(key, t, is_array, count, start, self)

    def _value_type(self, raw: int, key: str) -> GGUFValueType:
        try:
            return GGUFValueType(raw)
        except ValueError:
            raise CheckpointError(f"{self.source}: metadata {key!r} has type {raw}, which is "
                                  "not a GGUF value type (0..12)") from None

    def _read_alignment(self) -> None:
        f = self.fields.get("general.alignment")
        if f is None:
            return
        if f.type != GGUFValueType.UINT32 or f.is_array:
            raise CheckpointError(f"{self.source}: general.alignment is {f.type_name()}; it "
                                  "must be a uint32")
        value = f.contents()
        if value == 0 or value & (value - 1):
            raise CheckpointError(f"{self.source}: general.alignment = {value} must be a "
                                  "power of two")
        self.alignment = value

    # -- tensors --------------------------------------------------------------------------

    def _read_tensor_info(self, cur: _Cursor, i: int) -> tuple[str, int, tuple[int, ...], int]:
        name = cur.string(f"the name of tensor #{i}")
        where = f"{self.source}: tensor {name!r}"
        if len(name.encode()) >= MAX_NAME:
            raise CheckpointError(f"{where}: the name is {len(name.encode())} bytes; GGUF "
                                  f"tensor names are shorter than {MAX_NAME}")
        n_dims = cur.u32(f"the dimension count of tensor {name!r}")
        if n_dims > MAX_DIMS:
            raise CheckpointError(f"{where}: has {n_dims} dimensions; GGML tensors have at "
                                  f"most {MAX_DIMS}")
        dims = tuple(cur.u64(f"dimension {d} of tensor {name!r}") for d in range(n_dims))
        raw_type = cur.u32(f"the type of tensor {name!r}")
        offset = cur.u64(f"the data offset of tensor {name!r}")
        return name, raw_type, dims, offset

    def _place_tensors(self, infos: list[tuple[str, int, tuple[int, ...], int]]) -> None:
        data_len = len(self.buf) - self.data_offset
        seen: set[str] = set()
        for name, raw_type, dims, offset in infos:
            where = f"{self.source}: tensor {name!r}"
            if name in seen:
                raise CheckpointError(f"{where}: the name appears twice")
            seen.add(name)
            try:
                ttype = GGMLQuantizationType(raw_type)
                block, type_size = GGML_QUANT_SIZES[ttype]
            except (ValueError, KeyError):
                raise CheckpointError(f"{where}: type {raw_type} is not a GGML tensor type "
                                      "this gguf package knows") from None
            n = 1
            for d in dims:
                n *= d
            if n >= 1 << 63:
                raise CheckpointError(f"{where}: dims {list(dims)} hold {n} elements; GGML "
                                      "counts elements in an int64")
            if dims and dims[0] % block:
                raise CheckpointError(f"{where}: rows of {dims[0]} elements are not a whole "
                                      f"number of {ttype.name} blocks of {block}")
            n_bytes = n // block * type_size
            if offset % self.alignment:
                raise CheckpointError(f"{where}: data offset {offset} is not a multiple of the "
                                      f"alignment {self.alignment}")
            if offset + n_bytes > data_len:
                raise CheckpointError(
                    f"{where}: bytes {offset}..{offset + n_bytes} of the data section lie "
                    f"outside it: it has {data_len} bytes (from byte {self.data_offset} of "
                    "the file); the offset or the dims are wrong, or the file is truncated")
            self.tensors.append(GGUFTensor(name, ttype, dims, offset, n_bytes, self))
        ordered = sorted(self.tensors, key=lambda t: (t.offset, t.n_bytes))
        for a, b in zip(ordered, ordered[1:]):
            if b.offset < a.offset + a.n_bytes:
                raise CheckpointError(
                    f"{self.source}: tensors {a.name!r} (data bytes {a.offset}.."
                    f"{a.offset + a.n_bytes}) and {b.name!r} (from {b.offset}) overlap")
