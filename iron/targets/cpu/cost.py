"""The cpu target's cost model: a roofline of each kernel setting on this host.

For one resolved instance the model counts what its kernel (``iron/kernels/cpu/<op>.c``) does:
bytes read from memory (weights and KV caches, which the model reads once per token) and from
cache (activations, outputs), 8-lane vector instructions (the kernels' AVX2 loops, scalar tails
counted one element at a time, AMX tile products in cycles), parallel work items and threads.
It prices them with this host's figures (``calibration.Calibration``: bandwidths, FMA
throughput, fork / join and work-item costs by thread count, measured once by ``calibrate.c``)
and returns ``fork/join + items per thread x item cost + max(memory time, compute time)``
(``iron.targets.cost.Estimate``), where a team whose items do not split evenly counts as fewer
threads (``items / ceil(items / threads)``).  Instruction counts per element are read off the
kernels' inner loops (e.g. a bf16 -> float32 widening is a load and a shift); they are stated
next to each formula, so a kernel change that moves them is a one-line edit here.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ...operator import Operator
from ...quant import PLAIN
from ..cost import COMPUTE, LAUNCH, MEMORY, Estimate, estimate
from .calibration import Calibration, calibration

LANES = 8  # float32 lanes of the kernels' AVX2 vectors
FMA_PER_CYCLE = 2  # FMA units per core on the x86 cores iron targets (Intel and AMD since 2013)
AMX_DP_CYCLES = 16  # cycles per TDPBF16PS (16x16x32 tile product; Intel optimization manual)
BF16_STORE8 = 7  # iron_store8_bf16: round-to-nearest-even and pack, per 8 outputs
EXP8 = 18  # iron_exp8 per 8 lanes: range clamp, round, two fnmadds, degree-5 polynomial, scale


# ---- the work of each kernel ------------------------------------------------------------


@dataclass(frozen=True)
class Work:
    """What one call of a kernel setting does."""

    cold: float  # bytes from memory (weights, KV caches)
    warm: float  # bytes from cache (activations, outputs)
    ops: float  # 8-lane vector instructions (scalar steps count one each)
    items: int  # parallel work items
    threads: int  # the team size (1: no parallel region)
    cycles: float = 0.0  # core cycles of matrix-unit work (AMX), spread over the threads


def vector_ops(n: int, per8: float, scalar: float | None = None) -> float:
    """Instructions for ``n`` elements done 8 at a time, the remainder one at a time."""
    return n // LANES * per8 + n % LANES * (per8 if scalar is None else scalar)


def _elementwise(op, threads: int, h: Calibration) -> Work:
    """iron_elementwise.h: load + widen per input, op, store."""
    per8 = 2 * op.arity + (EXP8 + 2 if op.kernel == "silu" else 1) + BF16_STORE8
    tiles = op.size // op.tile_size
    return Work(0, (op.arity + 1) * op.size * 2,
                tiles * vector_ops(op.tile_size, per8, scalar=4 * op.arity + 8), tiles, threads)


def _swiglu(op, threads: int, h: Calibration) -> Work:
    """swiglu.c: gate and up widened, silu, multiply, store."""
    tiles = op.size // op.tile_size
    per_row = tiles * vector_ops(op.tile_size, 4 + EXP8 + 2 + 1 + BF16_STORE8, 30)
    return Work(0, 3 * op.rows * op.size * 2, op.rows * per_row, tiles, threads)


def _rowwise(op, threads: int, h: Calibration) -> Work:
    """rmsnorm.c / softmax.c: a reduction pass, then a scaling pass."""
    passes = 3 + (2 + 2 * getattr(op, "weighted", 0) + 1 + BF16_STORE8)
    if op.kernel == "softmax":
        passes += EXP8 + 4
    tiles = op.rows // op.tile_size
    return Work(0, (op.streams * op.rows + 1) * op.size * 2,
                op.rows * vector_ops(op.size, passes, 2 * passes), tiles, threads)


def _embedding(op, threads: int, h: Calibration) -> Work:
    """embedding.c: one row copy per token."""
    return Work(op.rows * op.dim * 2, op.rows * op.dim * 2, op.rows * op.dim / 16,
                op.rows, threads if op.rows > 1 else 1)


def no_estimate(op, threads: int, h: Calibration) -> None:
    """The hook of a family the model does not price: the tuner measures every candidate of
    its instances (and an operator without tunables has nothing to rank)."""
    return None


@functools.lru_cache(maxsize=None)
def hooks() -> dict[type, Callable[[Operator, int, Calibration], "Work | None"]]:
    """Each operator family's cost hook, by class: the ``Work`` of a setting, or None for "no
    estimate".  Every operator with a cpu kernel must find one along its class's bases (a test
    checks it), so a new family is a decision — a formula, or ``no_estimate`` — never a
    silent constant that would make ``--prune K`` measure the first K candidates in order."""
    from ...operators import (GEMM, GEMV, Attention, CacheWrite, Concat, Elementwise,
                             Embedding, QKVRoPE, RowWise, SwiGLU)

    return {Elementwise: _elementwise, SwiGLU: _swiglu, RowWise: _rowwise,
            Embedding: _embedding, GEMV: lambda op, t, h: _gemv(op, t),
            GEMM: _gemm, Attention: _attention,
            CacheWrite: no_estimate, QKVRoPE: no_estimate, Concat: no_estimate}


def hook_for(cls: type) -> Callable[[Operator, int, Calibration], "Work | None"] | None:
    """The cost hook of operator class ``cls``: its own or its nearest base's; None if none."""
    table = hooks()
    return next((table[c] for c in cls.__mro__ if c in table), None)


def work(op: Operator, h: Calibration) -> Work | None:
    """The ``Work`` of ``op``'s cpu kernel (see each hook for the loops counted); None when its
    family's hook gives no estimate.  A family without a hook is an error naming it."""
    hook = hook_for(type(op))
    if hook is None:
        raise LookupError(f"the cpu cost model has no hook for {type(op).__name__}: add one to "
                          "iron.targets.cpu.cost.hooks (a formula, or no_estimate)")
    return hook(op, getattr(op, "num_aie_columns", 1) or 1, h)


def _out_bytes(op) -> int:
    """Bytes per element of a matrix product's output (its ``output_dtype``): 2 for bf16, 4
    for the float32 logits the Llama head writes (a vocabulary-sized row per token)."""
    from ...operators.matrix import stored_dtype

    return np.dtype(stored_dtype(op)).itemsize


def _gemv(op, threads: int) -> Work:
    """gemv.c: per 16 elements of W one load, two widenings, two FMAs, and 2 / TI loads of x
    (TI rows share them); per row a reduction of 2 x UNROLL accumulators and a store. A
    quantized W (_gemv_tiled) is read in its own bytes; an f16 W like a bf16 one (F16C's
    conversion in place of the widening)."""
    if op.weight_format not in PLAIN:
        return _gemv_tiled(op, threads)
    ti = op.tile_size_input
    unroll = 1 if ti >= 2 else 2
    per16 = 5 + 2 / ti
    ops = op.batches * (op.M * (op.K // 16) * per16 + op.M * (op.K % 16) * 2
                        + op.M * (2 * unroll + 8)) + op.batches * op.K * 2
    return Work(op.M * op.K * 2, op.batches * (op.K * 2 + op.M * _out_bytes(op)), ops,
                op.M // op.tile_size_output, threads)


def _gemv_tiled(op, threads: int) -> Work:
    return _tiled(op.weight_format, op.group_size, op.M, op.K, op.batches,
                  op.M // op.tile_size_output, threads, _out_bytes(op))


def _tiled(fmt: str, group: int, rows: int, k: int, vectors: int, items: int,
           threads: int, out_bytes: int) -> Work:
    """qmatmul.h (the quantized GEMV, and the GEMM with a row of A per vector): ``rows`` of W in
    16-row tiles times ``vectors`` x, counted for AVX512-VNNI (a 512-bit op counted as two
    8-lane ones; AVX2's vpmaddubsw + vpmaddwd on two 8-row halves come to about as many): per
    32-value chunk of a tile and 4-bit code set, 4 loads, 4 shifts and 8
    masks make the codes into bytes (once per pass of up to 8 vectors, 4 for q6_k; two sets,
    q8_0's and q6_k's, are merged into one byte per code by those masks), and each vector takes 8
    vpdpbusd; per chunk and vector 4 ops scale the integer sums of x's two blocks by their
    scales, per group and vector 2 FMAs apply the rows' scales and bias. x is rounded to int8
    once per call; each output element is ``out_bytes``."""
    from ...quant import K_BLOCK, row_bytes

    sets = 2 if fmt in ("q8_0", "q6_k") else 1
    tiles, chunks, groups = rows // 16, k // 32, k // min(group, 32 if fmt in K_BLOCK else group)
    passes = math.ceil(vectors / (4 if fmt == "q6_k" else 8))
    per_chunk = sets * 2 * 16 * passes + 2 * 8 * vectors + 2 * 4 * vectors
    ops = tiles * (chunks * per_chunk + groups * (4 + 4 * vectors)) + vectors * k * 2
    return Work(rows * row_bytes(fmt, k, group, tiled=True),
                vectors * (k * 2 + rows * out_bytes), ops, items, threads)


def _gemm(op, threads: int, h: Calibration) -> Work:
    """gemm.c, whichever of its three paths this host compiles for the instance; a quantized
    B runs the GEMV's tile scheme with a row of A per vector."""
    M, K, N = op.M, op.K, op.N
    if op.weight_format not in PLAIN:
        return _tiled(op.weight_format, op.group_size, N, K, M, N // op.tile_n, threads,
                      _out_bytes(op))
    items = N // op.tile_n
    a_and_c = M * K * 2 + M * N * _out_bytes(op)
    pack_a = M * K / LANES * 3
    bf16 = op.weight_format == "bf16"  # an f16 B takes the float32 FMA path on every host
    if bf16 and h.amx and K % 32 == 0 and op.tile_n % 16 == 0:
        mb, nb = math.ceil(M / 16), math.ceil(N / 16)
        dp = mb * nb * (K // 32)  # TDPBF16PS per call
        loads = math.ceil(M / 32) * nb * (K // 32) + math.ceil(N / 32) * mb * (K // 32)
        write_c = mb * nb * (16 * 4 + 16)  # a 16x16 transpose and 16 stores per block
        return Work(N * K * 2, a_and_c + math.ceil(N / 32) * M * K * 2,
                    pack_a + loads + write_c, items, threads, cycles=dp * AMX_DP_CYCLES)
    k_tiles = K // op.tile_k
    panels = math.ceil(op.tile_n / 16)
    if bf16 and h.avx512_bf16:  # vdpbf16ps on 16 lanes, a k-pair per instruction, up to 8
        # rows x 2 panels
        rows = next(r for r in (8, 4, 2, 1) if op.tile_m >= r)
        pairs = math.ceil(op.tile_k / 2)
        products = M * items * panels * k_tiles * pairs  # per row, panel and k-pair
        ops = products * (1 + 1 / rows + 1 / min(2, panels) * 0.5)
    else:  # AVX2: float32 FMAs on 8 lanes, up to 6 rows x 16 columns; A converted once
        rows = next(r for r in (6, 4, 2, 1) if op.tile_m >= r)
        products = M * items * panels * 2 * K
        ops = products * (1 + 1 / rows) + pack_a
    pack_b = N * K / LANES * 3  # every B tile widened or paired once
    c_traffic = k_tiles * M * items * panels * 2 * 2  # the float32 C block, per k-tile
    return Work(N * K * 2, a_and_c + items * M * K * 2,
                ops + pack_b + c_traffic, items, threads)


def _attention(op, threads: int, h: Calibration) -> Work:
    """attention.c: per key and query head, its q.k in pairs of bf16 values (per 16 of head_dim
    one VDPBF16PS where the host has AVX512-BF16, else its two FMAs and four and/shift steps,
    and a share of the key's load among the pass's heads), a share of the 8-key reduction and
    scale, exp, rounding p to bf16 and the block sum; then its v row added the same way, two
    keys at a time (the two rows' loads and interleave shared by the pass's heads); per block
    of ``tile_size`` keys a rescale of the accumulator and a scalar exp. The tuner times it at
    a mid-context position."""
    start = (op.ctx - op.rows) // 2
    lengths = [min(start + r + 1, op.ctx) for r in range(op.rows)]
    keys = op.heads * sum(lengths)
    blocks = op.heads * sum(math.ceil(n / op.tile_size) for n in lengths)
    d16 = math.ceil(op.head_dim / 16)
    dot2 = 1 if h.avx512_bf16 else 6
    heads_per_pass = min(op.heads // op.kv_heads, 4)
    scores = d16 * (dot2 + 1 / heads_per_pass) + 12 / LANES
    softmax = (EXP8 + BF16_STORE8 + 5) / LANES
    sums = d16 * (dot2 + 2 / heads_per_pass)
    per_block = 2 * math.ceil(op.head_dim / LANES) + 40
    kv = op.kv_heads * max(lengths) * op.head_dim * 2 * 2
    return Work(kv, op.heads * sum(lengths) * op.head_dim * 2 * 2 - kv
                + 2 * op.rows * op.heads * op.head_dim * 2,
                keys * (scores + softmax + sums) + blocks * per_block, op.rows * op.heads,
                threads)


def cost(op: Operator, h: Calibration | None = None) -> Estimate | None:
    """The modelled time of ``op``'s kernel on this host (see the module docstring); None when
    its family's hook says "no estimate"."""
    h = h or calibration()
    w = work(op, h)
    if w is None:
        return None
    team = max(1, min(w.threads, h.threads))
    per_thread = math.ceil(w.items / team)
    busy = w.items / per_thread  # threads' worth of work: fewer than team when unbalanced
    memory = w.cold / h.at(h.memory_bw, busy) + w.warm / h.at(h.cache_bw, busy)
    fma = h.at(h.fma_rate, busy)
    compute = w.ops / fma + w.cycles * FMA_PER_CYCLE / (fma / busy) / busy
    launch = (h.fork[team - 1] if w.threads > 1 else 0.0) + per_thread * h.item
    return estimate({COMPUTE: compute, MEMORY: memory}, {LAUNCH: launch})
