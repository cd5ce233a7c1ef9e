"""The cpu cost model's figures of this host, measured by ``calibrate.c`` and cached.

``calibration()`` returns a ``Calibration``: memory and cache read bandwidth with 1 .. N
threads, vector FMA throughput with 1 .. N threads (the best of several repetitions: the
hardware's peak, not the neighbours'), the cost of an OpenMP fork / join and of one small work
item (the median repetition), and which of gemm.c's paths the CPU has.  It is measured once (a
few seconds) and kept in ``build/cost/``, keyed by the probe's artifact key (its source, the
compiler, the flags and, for ``native``, the host CPU) and the core count; ``python
benchmarks/cost_model.py --recalibrate`` measures again.
"""

from __future__ import annotations

import ctypes
import functools
import json
import math
import os
import statistics
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from ...cache import default_store
from ...paths import build_dir
from ...util import atomic_write_bytes
from ... import host
from .build import LIBRARY, SOURCE_DIR, build, source_recipe

#: Bumped when what a calibration file holds, or how it is measured, changes.
CALIBRATION_VERSION = 3
#: The caller's own work between two parallel regions in the fork / join probe: about what the
#: tuner spends in Python between two timed runs; a team that waited longer has gone to sleep.
FORK_GAP = 50e-6


@dataclass(frozen=True)
class Calibration:
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


def _probe_recipe():
    """``calibrate.c`` as a recipe: keyed by its source, the compiler, flags and host."""
    return source_recipe("calibrate", SOURCE_DIR / "calibrate.c")


def _probe_library() -> ctypes.CDLL:
    """``calibrate.c`` compiled like a kernel, through the artifact store; built here, not by
    the cpu target, whose cost model reads this module's figures."""
    recipe = _probe_recipe()
    entry = default_store().get_or_build(recipe.key, recipe.description,
                                         lambda folder: build(recipe, folder))
    lib = ctypes.CDLL(str(entry.file(LIBRARY)))
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


def measure(threads: int | None = None) -> Calibration:
    """Run the probes (a few seconds); see ``calibrate.c``."""
    from ...memory import huge_page_copy

    threads = threads or os.cpu_count() or 1
    lib = _probe_library()
    memory = huge_page_copy(np.ones(min(1 << 30, max(256 << 20, 2 * host.cache_bytes())) // 4,
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
    flags = host.features()
    # A team of t threads can leave one idle, so its aggregate throughput is at least t - 1's:
    # a lower best-of figure means another process held a core through every repetition.
    memory_bw, cache_bw, fma = (_at_least_fewer(v) for v in (memory_bw, cache_bw, fma))
    # what an item of 16 elements costs beyond its share of one long item's work
    overhead = max((small - whole) / (items.size // 16), 1e-10)
    return Calibration(tuple(memory_bw), tuple(cache_bw), tuple(fma), tuple(fork), overhead,
                "amx_bf16" in flags and "amx_tile" in flags, "avx512_bf16" in flags,
                os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0)


def _at_least_fewer(rates: list[float]) -> list[float]:
    """Throughputs by thread count, each raised to the best of fewer threads."""
    return [max(rates[:t]) for t in range(1, len(rates) + 1)]


def calibration_path() -> Path:
    key = _probe_recipe().key[:16]
    return build_dir() / "cost" / f"cpu-v{CALIBRATION_VERSION}-{key}-{os.cpu_count()}threads.json"


@functools.lru_cache(maxsize=None)
def calibration() -> Calibration:
    """This host's numbers: measured once, then read from ``build/cost/``."""
    path = calibration_path()
    if path.is_file():
        try:
            doc = json.loads(path.read_text())
            cached = Calibration(**{k: tuple(v) if isinstance(v, list) else v
                                    for k, v in doc.items()})
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
    measured = measure()
    atomic_write_bytes(path, json.dumps(asdict(measured), indent=1).encode() + b"\n")
    return measured


def describe(h: Calibration) -> str:
    """One line of the host's numbers, for reports."""
    return (f"memory {', '.join(f'{b / 1e9:.1f}' for b in h.memory_bw)} GB/s, cache "
            f"{', '.join(f'{b / 1e9:.0f}' for b in h.cache_bw)} GB/s, FMA "
            f"{', '.join(f'{r / 1e9:.2f}' for r in h.fma_rate)} G/s (1..{h.threads} threads); "
            f"fork/join {', '.join(f'{f * 1e6:.1f}' for f in h.fork[1:])} us; item "
            f"{h.item * 1e9:.1f} ns; load average {h.load:.1f} when measured")


