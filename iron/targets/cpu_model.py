"""The cpu target's cost model: a roofline of each kernel setting on this host.

For one resolved instance the model counts what its kernel (``iron/kernels/cpu/<op>.c``) does:
bytes read from memory (weights and KV caches, which the model reads once per token) and from
cache (activations, outputs), 8-lane vector instructions (the kernels' AVX2 loops, scalar tails
counted one element at a time, AMX tile products in cycles), parallel work items and threads.
It prices them with this host's numbers, measured once by ``calibrate.c`` and cached in
``build/cost/``:

- memory and cache read bandwidth with 1 .. N threads, vector FMA throughput with 1 .. N
  threads (the best of several repetitions: the hardware's peak, not the neighbours'), the cost
  of an OpenMP fork / join and of one small work item (the median repetition);

and returns ``fork/join + items per thread x item cost + max(memory time, compute time)``
(``iron.targets.cost.Estimate``), where a team whose items do not split evenly counts as fewer
threads (``items / ceil(items / threads)``).  Instruction counts per element are read off the
kernels' inner loops (e.g. a bf16 -> float32 widening is a load and a shift); they are stated
next to each formula, so a kernel change that moves them is a one-line edit here.
"""

from __future__ import annotations

import ctypes
import functools
import json
import math
import os
import re
import statistics
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from ..devices import host_cache_bytes
from ..operator import Operator
from ..paths import build_dir
from ..util import atomic_write_bytes
from .cost import COMPUTE, LAUNCH, MEMORY, Estimate, estimate

LANES = 8  # float32 lanes of the kernels' AVX2 vectors
FMA_PER_CYCLE = 2  # FMA units per core on the x86 cores iron targets (Intel and AMD since 2013)
AMX_DP_CYCLES = 16  # cycles per TDPBF16PS (16x16x32 tile product; Intel optimization manual)
BF16_STORE8 = 7  # iron_store8_bf16: round-to-nearest-even and pack, per 8 outputs
#: Bumped when what a calibration file holds, or how it is measured, changes.
CALIBRATION_VERSION = 3
#: The caller's own work between two parallel regions in the fork / join probe: about what the
#: tuner spends in Python between two timed runs; a team that waited longer has gone to sleep.
FORK_GAP = 50e-6
EXP8 = 18  # iron_exp8 per 8 lanes: range clamp, round, two fnmadds, degree-5 polynomial, scale


@dataclass(frozen=True)
class Host:
    """This machine's numbers, index t - 1 for t threads (see ``calibrate.c``)."""

    memory_bw: tuple[float, ...]  # bytes/s streaming from memory
    cache_bw: tuple[float, ...]  # bytes/s from a cache-resident working set
    fma_rate: tuple[float, ...]  # 8-lane FMA instructions per second, all threads together
    fork: tuple[float, ...]  # seconds per omp parallel region
    item: float  # seconds a work item costs beyond its elements' work (loop, addressing)
    amx: bool  # AMX-BF16: gemm.c's tile path
    avx512_bf16: bool  # gemm.c's vdpbf16ps path
    load: float  # the load average when measured (on a busy machine peaks are rarer)

    @property
    def threads(self) -> int:
        return len(self.memory_bw)

    def at(self, values: tuple[float, ...], threads: float) -> float:
        """``values`` at a fractional thread count (an unbalanced team), linearly."""
        t = min(max(threads, 1.0), len(values))
        lo = int(math.floor(t))
        hi = min(lo + 1, len(values))
        return values[lo - 1] + (values[hi - 1] - values[lo - 1]) * (t - lo)


# ---- calibration --------------------------------------------------------------------------


def _probe_recipe():
    """``calibrate.c`` as a recipe: keyed by its source, the compiler, flags and host."""
    from . import cpu

    return cpu.source_recipe("calibrate", cpu.SOURCE_DIR / "calibrate.c")


def _probe_library() -> ctypes.CDLL:
    """``calibrate.c`` compiled like a kernel, through the artifact store."""
    from . import cpu

    entry = cpu.TARGET.compile(_probe_recipe())
    lib = ctypes.CDLL(str(cpu.TARGET.artifact(entry)))
    seconds = ctypes.POINTER(ctypes.c_double)
    lib.iron_probe_read.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_int, ctypes.c_int,
                                    seconds]
    lib.iron_probe_fma.argtypes = [ctypes.c_long, ctypes.c_int, ctypes.c_int, seconds]
    lib.iron_probe_fork.argtypes = [ctypes.c_int, ctypes.c_double, ctypes.c_int, seconds]
    lib.iron_probe_items.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long,
                                     ctypes.c_long, ctypes.c_int, seconds]
    return lib


def _seconds(run: Callable[[int, ctypes.Array], None], reps: int) -> list[float]:
    out = (ctypes.c_double * reps)()
    run(reps, out)
    return list(out[1:] if reps > 2 else out)  # the first run warms up


def _fastest(run: Callable[[int, ctypes.Array], None], reps: int) -> float:
    """A throughput probe's best repetition: what the hardware does when nothing interferes
    (on a shared machine the typical one measures the neighbours)."""
    return min(_seconds(run, reps))


def _typical(run: Callable[[int, ctypes.Array], None], reps: int) -> float:
    """A cost probe's median repetition: an overhead paid on every call."""
    return statistics.median(_seconds(run, reps))


def measure_host(threads: int | None = None) -> Host:
    """Run the probes (a few seconds); see ``calibrate.c``."""
    from ..memory import huge_page_copy

    threads = threads or os.cpu_count() or 1
    lib = _probe_library()
    memory = huge_page_copy(np.ones(min(1 << 30, max(256 << 20, 2 * host_cache_bytes())) // 4,
                                    np.float32))
    cache_floats = (1 << 20) // 4  # 1 MiB per thread: in a core's L2 on current x86 cores
    cache = np.ones(cache_floats * threads, np.float32)
    items = np.ones(1 << 14, np.uint16) * 0x3F80
    out = np.empty_like(items)
    memory_bw, cache_bw, fma, fork = [], [], [], []
    for t in range(1, threads + 1):
        memory_bw.append(memory.nbytes / _fastest(lambda r, s: lib.iron_probe_read(
            memory.ctypes.data, memory.size, t, r, s), 5))
        n = cache_floats * t
        cache_bw.append(n * 4 / _fastest(lambda r, s: lib.iron_probe_read(
            cache.ctypes.data, n, t, r, s), 101))
        iters = 200_000
        fma.append(t * iters * 8 / _fastest(lambda r, s: lib.iron_probe_fma(iters, t, r, s), 21))
        fork.append(_typical(lambda r, s: lib.iron_probe_fork(t, FORK_GAP, r, s), 1001)
                    if t > 1 else 0.0)
    small = _typical(lambda r, s: lib.iron_probe_items(items.ctypes.data, out.ctypes.data,
                                                      items.size, 16, r, s), 201)
    whole = _typical(lambda r, s: lib.iron_probe_items(items.ctypes.data, out.ctypes.data,
                                                      items.size, items.size, r, s), 201)
    flags = _cpu_flags()
    # A team of t threads can leave one idle, so its aggregate throughput is at least t - 1's:
    # a lower best-of figure means another process held a core through every repetition.
    memory_bw, cache_bw, fma = (_at_least_fewer(v) for v in (memory_bw, cache_bw, fma))
    # what an item of 16 elements costs beyond its share of one long item's work
    overhead = max((small - whole) / (items.size // 16), 1e-10)
    return Host(tuple(memory_bw), tuple(cache_bw), tuple(fma), tuple(fork), overhead,
                "amx_bf16" in flags and "amx_tile" in flags, "avx512_bf16" in flags,
                os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0)


def _at_least_fewer(rates: list[float]) -> list[float]:
    """Throughputs by thread count, each raised to the best of fewer threads."""
    return [max(rates[:t]) for t in range(1, len(rates) + 1)]


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    found = re.search(r"^flags\s*:\s*(.*)$", text, re.M)
    return set(found.group(1).split()) if found else set()


def calibration_path() -> Path:
    key = _probe_recipe().key[:16]
    return build_dir() / "cost" / f"cpu-v{CALIBRATION_VERSION}-{key}-{os.cpu_count()}threads.json"


@functools.lru_cache(maxsize=None)
def host() -> Host:
    """This host's numbers: measured once, then read from ``build/cost/``."""
    path = calibration_path()
    if path.is_file():
        try:
            doc = json.loads(path.read_text())
            cached = Host(**{k: tuple(v) if isinstance(v, list) else v for k, v in doc.items()})
        except (ValueError, TypeError):
            cached = None  # a damaged file: measure again
        if cached is not None:
            now = os.getloadavg()[0] if hasattr(os, "getloadavg") else cached.load
            low, high = sorted((now, cached.load))
            if high - low > 2.0 and high > 2 * low:  # much busier, or much quieter, now
                warnings.warn(f"the cpu cost model was calibrated at load average "
                              f"{cached.load:.1f} and the machine is at {now:.1f}: its thread "
                              f"team numbers may be stale ({path}; python "
                              "benchmarks/cost_model.py --recalibrate measures them again)")
            return cached
    measured = measure_host()
    atomic_write_bytes(path, json.dumps(asdict(measured), indent=1).encode() + b"\n")
    return measured


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


def _elementwise(op, threads: int, h: Host) -> Work:
    """iron_elementwise.h: load + widen per input, op, store."""
    per8 = 2 * op.arity + (EXP8 + 2 if op.kernel == "silu" else 1) + BF16_STORE8
    tiles = op.size // op.tile_size
    return Work(0, (op.arity + 1) * op.size * 2,
                tiles * vector_ops(op.tile_size, per8, scalar=4 * op.arity + 8), tiles, threads)


def _swiglu(op, threads: int, h: Host) -> Work:
    """swiglu.c: gate and up widened, silu, multiply, store."""
    tiles = op.size // op.tile_size
    per_row = tiles * vector_ops(op.tile_size, 4 + EXP8 + 2 + 1 + BF16_STORE8, 30)
    return Work(0, 3 * op.rows * op.size * 2, op.rows * per_row, tiles, threads)


def _rowwise(op, threads: int, h: Host) -> Work:
    """rmsnorm.c / softmax.c: a reduction pass, then a scaling pass."""
    passes = 3 + (2 + 2 * getattr(op, "weighted", 0) + 1 + BF16_STORE8)
    if op.kernel == "softmax":
        passes += EXP8 + 4
    tiles = op.rows // op.tile_size
    return Work(0, (op.streams * op.rows + 1) * op.size * 2,
                op.rows * vector_ops(op.size, passes, 2 * passes), tiles, threads)


def _embedding(op, threads: int, h: Host) -> Work:
    """embedding.c: one row copy per token."""
    return Work(op.rows * op.dim * 2, op.rows * op.dim * 2, op.rows * op.dim / 16,
                op.rows, threads if op.rows > 1 else 1)


def no_estimate(op, threads: int, h: Host) -> None:
    """The hook of a family the model does not price: the tuner measures every candidate of
    its instances (and an operator without tunables has nothing to rank)."""
    return None


@functools.lru_cache(maxsize=None)
def hooks() -> dict[type, Callable[[Operator, int, Host], "Work | None"]]:
    """Each operator family's cost hook, by class: the ``Work`` of a setting, or None for "no
    estimate".  Every operator with a cpu kernel must find one along its class's bases (a test
    checks it), so a new family is a decision — a formula, or ``no_estimate`` — never a
    silent constant that would make ``--prune K`` measure the first K candidates in order."""
    from ..operators import (GEMM, GEMV, Attention, CacheWrite, Elementwise, Embedding,
                             QKVRoPE, RowWise, SwiGLU)

    return {Elementwise: _elementwise, SwiGLU: _swiglu, RowWise: _rowwise,
            Embedding: _embedding, GEMV: lambda op, t, h: _gemv(op, t),
            GEMM: _gemm, Attention: lambda op, t, h: _attention(op, t),
            CacheWrite: no_estimate, QKVRoPE: no_estimate}


def hook_for(cls: type) -> Callable[[Operator, int, Host], "Work | None"] | None:
    """The cost hook of operator class ``cls``: its own or its nearest base's; None if none."""
    table = hooks()
    return next((table[c] for c in cls.__mro__ if c in table), None)


def work(op: Operator, h: Host) -> Work | None:
    """The ``Work`` of ``op``'s cpu kernel (see each hook for the loops counted); None when its
    family's hook gives no estimate.  A family without a hook is an error naming it."""
    hook = hook_for(type(op))
    if hook is None:
        raise LookupError(f"the cpu cost model has no hook for {type(op).__name__}: add one to "
                          "iron.targets.cpu_model.hooks (a formula, or no_estimate)")
    return hook(op, getattr(op, "num_aie_columns", 1) or 1, h)


def _gemv(op, threads: int) -> Work:
    """gemv.c: per 16 elements of W one load, two widenings, two FMAs, and 2 / TI loads of x
    (TI rows share them); per row a reduction of 2 x UNROLL accumulators and a store. A
    quantized W (_gemv_tiled) is read in its own bytes."""
    if op.weight_format != "bf16":
        return _gemv_tiled(op, threads)
    ti = op.tile_size_input
    unroll = 1 if ti >= 2 else 2
    per16 = 5 + 2 / ti
    ops = op.batches * (op.M * (op.K // 16) * per16 + op.M * (op.K % 16) * 2
                        + op.M * (2 * unroll + 8)) + op.batches * op.K * 2
    return Work(op.M * op.K * 2, op.batches * (op.K + op.M) * 2, ops,
                op.M // op.tile_size_output, threads)


def _gemv_tiled(op, threads: int) -> Work:
    """gemv.c on a quantized W, in 16-row tiles, with AVX512-VNNI (a 512-bit op counted as two
    8-lane ones): per 32-value chunk of a tile and 4-bit code set, 4 loads, 4 shifts and 8
    masks make the codes into bytes (once per pass of up to 4 vectors), and each vector takes
    8 vpdpbusd; per chunk and vector 4 ops (6 for q8_0's two sets) scale the integer sums of
    x's two blocks by their scales, per group and vector 2 FMAs apply the rows' scales and
    bias. x is rounded to int8 once per call."""
    from ..quant import row_bytes

    sets = 2 if op.weight_format == "q8_0" else 1
    tiles, chunks, groups = op.M // 16, op.K // 32, op.K // op.group_size
    passes = math.ceil(op.batches / 4)
    per_chunk = sets * (2 * 16 * passes + 2 * 8 * op.batches) + 2 * (2 + 2 * sets) * op.batches
    ops = tiles * (chunks * per_chunk + groups * (4 + 4 * op.batches)) + op.batches * op.K * 2
    return Work(op.M * row_bytes(op.weight_format, op.K, op.group_size),
                op.batches * (op.K + op.M) * 2, ops, op.M // op.tile_size_output, threads)


def _gemm(op, threads: int, h: Host) -> Work:
    """gemm.c, whichever of its three paths this host compiles for the instance."""
    M, K, N = op.M, op.K, op.N
    items = N // op.tile_n
    pack_a = M * K / LANES * 3
    if h.amx and K % 32 == 0 and op.tile_n % 16 == 0:
        mb, nb = math.ceil(M / 16), math.ceil(N / 16)
        dp = mb * nb * (K // 32)  # TDPBF16PS per call
        loads = math.ceil(M / 32) * nb * (K // 32) + math.ceil(N / 32) * mb * (K // 32)
        write_c = mb * nb * (16 * 4 + 16)  # a 16x16 transpose and 16 stores per block
        return Work(N * K * 2, (M * K + M * N) * 2 + math.ceil(N / 32) * M * K * 2,
                    pack_a + loads + write_c, items, threads, cycles=dp * AMX_DP_CYCLES)
    k_tiles = K // op.tile_k
    panels = math.ceil(op.tile_n / 16)
    if h.avx512_bf16:  # vdpbf16ps on 16 lanes, a k-pair per instruction, up to 8 rows x 2 panels
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
    return Work(N * K * 2, (M * K + M * N) * 2 + items * M * K * 2,
                ops + pack_b + c_traffic, items, threads)


def _attention(op, threads: int) -> Work:
    """attention.c: per key a q.k dot (widen + FMA per 8 of head_dim), its share of the
    8-key reduction, exp and the block sum, and a v row added into the accumulator (widen,
    FMA, load and store of acc per 8); per block of ``tile_size`` keys a rescale of the
    accumulator and a scalar exp.  The tuner times it at a mid-context position."""
    start = (op.ctx - op.rows) // 2
    lengths = [min(start + r + 1, op.ctx) for r in range(op.rows)]
    keys = op.heads * sum(lengths)
    blocks = op.heads * sum(math.ceil(n / op.tile_size) for n in lengths)
    d8 = math.ceil(op.head_dim / LANES)
    per_key = 3 * d8 + 12 / LANES + (EXP8 + 3) / LANES + 4 * d8
    per_block = 2 * d8 + 40
    kv = op.kv_heads * max(lengths) * op.head_dim * 2 * 2
    return Work(kv, op.heads * sum(lengths) * op.head_dim * 2 * 2 - kv
                + 2 * op.rows * op.heads * op.head_dim * 2,
                keys * per_key + blocks * per_block, op.rows * op.heads, threads)


def cost(op: Operator, h: Host | None = None) -> Estimate | None:
    """The modelled time of ``op``'s kernel on this host (see the module docstring); None when
    its family's hook says "no estimate"."""
    h = h or host()
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


def describe(h: Host) -> str:
    """One line of the host's numbers, for reports."""
    return (f"memory {', '.join(f'{b / 1e9:.1f}' for b in h.memory_bw)} GB/s, cache "
            f"{', '.join(f'{b / 1e9:.0f}' for b in h.cache_bw)} GB/s, FMA "
            f"{', '.join(f'{r / 1e9:.2f}' for r in h.fma_rate)} G/s (1..{h.threads} threads); "
            f"fork/join {', '.join(f'{f * 1e6:.1f}' for f in h.fork[1:])} us; item "
            f"{h.item * 1e9:.1f} ns; load average {h.load:.1f} when measured")


