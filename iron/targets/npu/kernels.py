"""The core kernels iron links on each NPU, and their shapes, read from their sources.

npu1 (Phoenix, Hawk Point) has AIE2 cores and npu2 (Strix, Krackan) AIE2P ones; the kernels
in ``iron/kernels/npu`` are one source per operator, built per architecture with
``IRON_AIE_ARCH`` (the value of the device compiler's ``__AIE_ARCH__``: 20 for AIE2, 21 for
AIE2P), and take the architecture's API where it differs (the exponential, the GEMM's MMUL).
The legality rules (``designs``) and the cost model (``cost``) need the vector width and the
MMUL shape of the kernels a design calls; both are constants in those sources (the width in
``iron_aie.h``, the MMUL shapes and output row width in ``gemm.cc``, the quantized kernels'
code lanes and activation block in ``qmatrix.cc``), read here so that the model prices the
kernel that is linked and cannot drift from it.
"""

from __future__ import annotations

import functools
import re

from ...errors import CompileError
from ...paths import KERNELS_DIR

SOURCE_DIR = KERNELS_DIR / "npu"

#: The core architecture of each NPU device (mlir-aie's target models: NPU1TargetModel is an
#: AIE2 model, NPU2TargetModel an AIE2P one) and the ``__AIE_ARCH__`` value of each.
ARCH = {"npu1": "aie2", "npu2": "aie2p"}
AIE_ARCH = {"aie2": 20, "aie2p": 21}


def arch(device: str) -> str:
    """The core architecture of an NPU device (``npu1`` or ``npu2``)."""
    try:
        return ARCH[device]
    except KeyError:
        raise CompileError(f"npu device {device!r} has no known core architecture (iron "
                           f"knows {', '.join(sorted(ARCH))})") from None


#: (rtol, atol) of the operators whose AIE2 kernels take exp from bf16 lookup tables, as
#: upstream's AIE2 kernels do (``iron_exp`` in ``iron_aie.h``, mlir-aie's
#: ``aie_kernels/aie2/softmax.cc`` getExpBf16): the argument is rounded to bf16 before the
#: lookup, so the error grows with |x| (about 2^-9 |x| of the value), to 1.8% of the outputs
#: above 1e-3 and 2e-4 absolute below on the test inputs, unbiased (their sum within 5e-4 of
#: the reference's); attention's outputs sum p * v over positions, so an error of up to 2^-5
#: in each p is up to 2^-5 sum p|v| absolute, 2^-6 at the test inputs' scale (measured 0.004).
#: AIE2P's ``aie::exp2`` keeps within the operators' own bounds.
AIE2_LUT_EXP = {"SiLU": (2.0 ** -5, 2.0 ** -10), "SwiGLU": (2.0 ** -5, 2.0 ** -10),
                "Softmax": (2.0 ** -5, 2.0 ** -10), "Attention": (2.0 ** -5, 2.0 ** -6),
                "SlotAttention": (2.0 ** -5, 2.0 ** -6)}


def tolerance(cls, device: str) -> tuple[float, float]:
    """``Target.tolerance`` on an npu device: the operator's own, widened to the lookup-table
    exponential's on AIE2."""
    if arch(device) == "aie2" and cls.__name__ in AIE2_LUT_EXP:
        return tuple(max(a, b) for a, b in zip(cls.tolerance, AIE2_LUT_EXP[cls.__name__]))
    return cls.tolerance


def arch_macro(device: str) -> int:
    """``IRON_AIE_ARCH`` for the host build of ``device``'s kernels."""
    return AIE_ARCH[arch(device)]


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


@functools.lru_cache(maxsize=4)
def mmul_shape(device: str) -> tuple[int, int, int]:
    """The GEMM kernel's ``aie::mmul`` shape on ``device`` (rows of A, K, columns of B)."""
    name = arch(device).upper()
    r, s, t = _constant("gemm.cc", name + r"_MMUL\[3\] = \{(\d+), (\d+), (\d+)\}")
    return r, s, t


@functools.lru_cache(maxsize=1)
def gemm_row_lanes() -> int:
    """bf16 lanes of one output row vector of the GEMM kernel's store (tile_n's multiple)."""
    return _constant("gemm.cc", r"constexpr unsigned SW = (\d+);")[0]


@functools.lru_cache(maxsize=1)
def qmatrix_lanes() -> int:
    """int16 lanes of one code vector of the quantized matrix kernels (16 rows x 2 values)."""
    return _constant("qmatrix.cc", r"constexpr unsigned QL = (\d+);")[0]


@functools.lru_cache(maxsize=1)
def qmatrix_block() -> int:
    """Values of x per int8 scale in the quantized matrix kernels."""
    return _constant("qmatrix.cc", r"constexpr int32_t QBLOCK = (\d+);")[0]


@functools.lru_cache(maxsize=4)
def qmatrix_mmul(device: str) -> tuple[int, int, int]:
    """The quantized kernels' int8 ``aie::mmul`` shape on ``device`` (vectors, K, rows)."""
    name = arch(device).upper()
    m, k, n = _constant("qmatrix.cc", r"QMM_" + name + r"\[3\] = \{(\d+), (\d+), (\d+)\}")
    return m, k, n


@functools.lru_cache(maxsize=1)
def qmatrix_mmul_min_vectors() -> int:
    """Vectors from which the quantized kernels take the MMUL (fewer: the lane path)."""
    return _constant("qmatrix.cc", r"constexpr int32_t QMMUL_MIN_VECTORS = (\d+);")[0]
