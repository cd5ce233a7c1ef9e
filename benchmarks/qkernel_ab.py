"""The quantized or f16 GEMV and GEMM kernels of two source trees, timed in one process.

A kernel change is often a few percent on a host whose other core runs someone else's job,
where one program timed after another sees a different machine. Here each instance is compiled
from both trees (their ``iron/kernels/cpu``, the macros of this checkout's operator) and the two
libraries are called in turn, round after round, so both see the same load; printed per
instance: the best and the median round of each side. GEMV cycles through copies of W twice the
last-level cache, in huge pages like a bundle's weights (W streams from memory, as in a decode
step), figure in GB/s of W; GEMM (a
prompt chunk of 64 rows) in GFLOP/s.

    python benchmarks/qkernel_ab.py --tree before=/path/to/old/checkout --tree after=.
        [--formats q4_k q6_k] [--threads 1]
"""

from __future__ import annotations

import argparse
import ctypes
import itertools
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import iron
from iron import quant
from iron.memory import huge_page_copy
from iron.operators import GEMM, GEMV
from iron.targets import cpu
from iron.host import cache_bytes

BF16 = iron.bfloat16
GEMV_SHAPES = ((16384, 2048), (2048, 8192), (49152, 2048), (3072, 2048))  # Llama 1B: M x K
GEMM_SHAPES = ((64, 2048, 16384), (64, 8192, 2048), (64, 2048, 3072))    # M x K x N
BUILDS = itertools.count()  # library file names: a loaded library's file is not overwritten


class One(iron.Graph):
    def __init__(self, cls, fields):
        super().__init__("cpu")
        self.cls, self.fields = cls, fields

    def body(self, *inputs):
        return self.cls.step(*inputs, **self.fields)


def weight(fmt, m, k, rng):
    group = quant.GROUPS[fmt][0]
    return quant.tile(fmt, quant.random_matrix(fmt, m, k, group, rng), k, group)


def build(op, trees, folder):
    """op's kernel compiled from each tree's sources with this checkout's macros and flags."""
    recipe = cpu.recipe_for(op)
    kernels = {}
    for side, tree in trees.items():
        source = Path(tree) / "iron" / "kernels" / "cpu" / cpu.kernel_source(op).name
        lib = Path(folder) / f"{side}-{next(BUILDS)}.so"
        subprocess.run([cpu.compiler()[0], *cpu.flags(), f"-I{source.parent}",
                        *(f"-D{m}={v}" for m, v in recipe.macros), str(source), "-o", str(lib)],
                       check=True)
        kernels[side] = ctypes.CDLL(str(lib)).iron_kernel
    return kernels


def args_of(arrays):
    return (ctypes.c_void_p * len(arrays))(*(a.ctypes.data for a in arrays))


def quantized_gemm(fmt, m, k, n, threads, tree, folder, rng, x_block=16):
    """The GEMM of an (m, k) activation by an (n, k) ``fmt`` weight, x rounded per
    ``x_block`` values, as ``tree``'s sources compile it, on ``threads`` threads: (kernel, its
    arguments, the arrays they point at, to keep alive while it runs)."""
    w = weight(fmt, n, k, rng)
    a = rng.standard_normal((m, k)).astype(BF16)
    fields = {"weight_format": fmt, "group_size": quant.GROUPS[fmt][0],
              "num_aie_columns": threads, "x_block": x_block}
    op = One(GEMM, fields).record_like([a, w]).ops[0]
    kernel = build(op, {"tree": tree}, folder)["tree"]
    arrays = [a, w, np.zeros((m, n), BF16)]
    return kernel, args_of(arrays), arrays


def alternate(kernels, calls, rounds):
    """Seconds per call, per side and round; the sides take turns within every round."""
    times = {side: [] for side in kernels}
    for kernel in kernels.values():  # warm-up
        for a in calls:
            kernel(a)
    for _ in range(rounds):
        for side, kernel in kernels.items():
            start = time.perf_counter()
            for a in calls:
                kernel(a)
            times[side].append((time.perf_counter() - start) / len(calls))
    return times


def label(op):
    return ", ".join(f"{n}={getattr(op, n)}" for n in op.tunables())


def bench_gemv(fmt, m, k, trees, threads, folder, rng, rounds=15):
    w0 = weight(fmt, m, k, rng)
    x = rng.standard_normal((1, k)).astype(BF16)
    fields = {"weight_format": fmt, "group_size": quant.GROUPS[fmt][0]}
    if threads:
        fields["num_aie_columns"] = threads
    op = One(GEMV, fields).record_like([w0, x]).ops[0]
    kernels = build(op, trees, folder)
    copies = max(2, -(-2 * cache_bytes() // w0.nbytes))
    out = np.zeros((1, m), BF16)
    # in huge pages, as a bundle's weights are: from 4 KiB pages the same kernel read 24-26
    # GB/s where the model's GEMVs stream 30-31 (a Xeon; every format alike)
    keep = [(huge_page_copy(w), x, out)
            for w in [w0, *(weight(fmt, m, k, rng) for _ in range(copies - 1))]]
    times = alternate(kernels, [args_of(a) for a in keep], rounds)
    print(f"GEMV {fmt} {m}x{k} [{label(op)}] " + "  ".join(
        f"{side}: best {w0.nbytes / min(t) / 1e9:5.1f} GB/s median "
        f"{w0.nbytes / statistics.median(t) / 1e9:5.1f}" for side, t in times.items()), flush=True)


def bench_gemm(fmt, m, k, n, trees, threads, folder, rng, rounds=9):
    w = weight(fmt, n, k, rng)
    a = rng.standard_normal((m, k)).astype(BF16)
    fields = {"weight_format": fmt, "group_size": quant.GROUPS[fmt][0]}
    if threads:
        fields["num_aie_columns"] = threads
    op = One(GEMM, fields).record_like([a, w]).ops[0]
    kernels = build(op, trees, folder)
    out = np.zeros((m, n), BF16)
    times = alternate(kernels, [args_of([a, w, out])] * 3, rounds)
    flops = 2 * m * k * n
    print(f"GEMM {fmt} {m}x{k}x{n} [{label(op)}] " + "  ".join(
        f"{side}: best {flops / min(t) / 1e9:6.1f} GFLOP/s median "
        f"{flops / statistics.median(t) / 1e9:6.1f}" for side, t in times.items()), flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", action="append", required=True, metavar="NAME=DIR",
                        help="a checkout whose iron/kernels/cpu to compile (twice or more)")
    parser.add_argument("--formats", nargs="+", default=["q4_k", "q6_k"],
                        choices=[*quant.QUANTIZED, "f16"])
    parser.add_argument("--threads", type=int, default=None,
                        help="num_aie_columns (default: the profile's)")
    parser.add_argument("--no-gemm", action="store_true")
    args = parser.parse_args()
    trees = dict(t.split("=", 1) for t in args.tree)
    if len(trees) < 2:
        sys.exit("--tree NAME=DIR at least twice")
    rng = np.random.default_rng(0)
    with open("/proc/loadavg") as f:
        print(f"load average {f.read().split()[:3]} at {time.strftime('%H:%M:%S')}")
    with tempfile.TemporaryDirectory() as folder:
        for fmt in args.formats:
            for m, k in GEMV_SHAPES:
                bench_gemv(fmt, m, k, trees, args.threads, folder, rng)
            if not args.no_gemm:
                for m, k, n in GEMM_SHAPES:
                    bench_gemm(fmt, m, k, n, trees, args.threads, folder, rng)
    with open("/proc/loadavg") as f:
        print(f"load average {f.read().split()[:3]} at {time.strftime('%H:%M:%S')}")


if __name__ == "__main__":
    main()
