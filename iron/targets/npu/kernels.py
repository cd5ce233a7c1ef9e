"""The shapes of the core kernels iron links, read from their sources.

The legality rules (``designs``) and the cost model (``cost``) need the vector width and the
MMUL shape of the kernels a design calls; both are constants in ``iron/kernels/npu`` (the
width in ``iron_aie.h``, the MMUL shape in ``gemm.cc``, the quantized kernels' code lanes and
activation block in ``qmatrix.cc``), read here so that the model prices the kernel that is
linked and cannot drift from it.
"""

from __future__ import annotations

import functools
import re

from ...paths import KERNELS_DIR

SOURCE_DIR = KERNELS_DIR / "npu"


def _constant(file: str, pattern: str) -> tuple[int, ...]:
    text = (SOURCE_DIR / file).read_text()
    found = re.search(pattern, text)
    if found is None:
        raise RuntimeError(f"{SOURCE_DIR / file}: no match for {pattern!r}: the npu kernels' "
                           "shapes moved; update iron/targets/npu/kernels.py")
    return tuple(int(g) for g in found.groups())


@functools.lru_cache(maxsize=1)
def lanes() -> int:
    """bf16 lanes of one vector operation in the element-wise, row-wise and GEMV kernels."""
    return _constant("iron_aie.h", r"constexpr unsigned IRON_LANES = (\d+);")[0]


@functools.lru_cache(maxsize=1)
def mmul_shape() -> tuple[int, int, int]:
    """The GEMM kernel's ``aie::mmul`` shape (rows of A, K, columns of B)."""
    r, s, t = _constant("gemm.cc", r"constexpr unsigned MR = (\d+), MK = (\d+), MN = (\d+);")
    return r, s, t


@functools.lru_cache(maxsize=1)
def qmatrix_lanes() -> int:
    """int16 lanes of one code vector of the quantized matrix kernels (16 rows x 2 values)."""
    return _constant("qmatrix.cc", r"constexpr unsigned QL = (\d+);")[0]


@functools.lru_cache(maxsize=1)
def qmatrix_block() -> int:
    """Values of x per int8 scale in the quantized matrix kernels."""
    return _constant("qmatrix.cc", r"constexpr int32_t QBLOCK = (\d+);")[0]
