"""Per-operator speed of the cpu kernels on SmolLM2's shapes, next to numpy float32 in one run.

Matrix-vector products stream their weights: each side cycles through enough distinct copies
of W (twice the last-level cache) that every call reads W from memory, as a decode step does.  For
GEMV the figure is bytes of W per second (iron reads bf16, numpy float32, so the same shape
moves half the bytes for iron); for GEMM it is GFLOP/s.  The other operators report time per
call.  The iron side is one program of many steps, run with one ctypes call, so its time per
step includes dispatch.

    python benchmarks/operators.py [--profile profiles/llama/cpu-avx2-2t.json]
    python benchmarks/operators.py --weights q4_1 [--shapes 1b]   # quantized W, Llama 1B shapes
    python benchmarks/operators.py --weights q4_k --shapes 1b     # a K-quant (256-value groups)

With ``--weights`` the matrices are random valid blocks of that format in the kernels' tiled
layout (``iron.quant``): GEMV bytes per second are the quantized bytes, numpy's float32 figure
stays for scale. ``--shapes 1b`` takes the shapes of a Llama 3.2 1B model instead of SmolLM2's.
"""

from __future__ import annotations

import argparse
import time
import numpy as np

import iron
from iron import quant
from iron.host import cache_bytes
from iron.operators import GEMM, GEMV, ElementwiseAdd, RMSNorm, SwiGLU, Attention
from iron.targets import cpu
from timing import median_seconds

L3_BYTES = cache_bytes()
BF16 = iron.bfloat16

GEMV_SHAPES = {"q/o proj": (576, 576), "k/v proj": (192, 576), "gate|up": (3072, 576),
               "down": (576, 1536), "lm head": (49152, 576)}
GEMM_SHAPES = {"prefill q/o": (32, 576, 576), "prefill gate|up": (32, 576, 3072),
               "prefill down": (32, 1536, 576)}
GEMV_SHAPES_1B = {"q|k|v": (3072, 2048), "o proj": (2048, 2048), "gate|up": (16384, 2048),
                  "down": (2048, 8192), "lm head": (49152, 2048)}
GEMM_SHAPES_1B = {"prefill q|k|v": (64, 2048, 3072), "prefill gate|up": (64, 2048, 16384),
                  "prefill down": (64, 8192, 2048)}


def weight(rng, m, k, fmt):
    """A random (m, k) weight: bf16 values, or valid blocks of ``fmt`` in the tiled layout
    (groups of the format's first group size: 32, or a K-quant's 256-value super-block)."""
    if fmt == "bf16":
        return rng.standard_normal((m, k)).astype(BF16)
    group = quant.GROUPS[fmt][0]
    return quant.tile(fmt, quant.random_matrix(fmt, m, k, group, rng), k, group)


def fields(fmt):
    if fmt == "bf16":
        return {}
    return {"weight_format": fmt, "group_size": quant.GROUPS[fmt][0]}


class Repeated(iron.Graph):
    """``copies`` steps of one operator, each on its own weight, so weights stream."""

    def __init__(self, make_step, copies, **graph):
        super().__init__(**graph)
        self.make_step, self.copies = make_step, copies

    def body(self, x):
        return tuple(self.make_step(self, i, x) for i in range(self.copies))


def copies_for(nbytes):
    return max(2, -(-2 * L3_BYTES // nbytes))


def quiet_blas():
    """Let OpenBLAS's threads, still spinning after numpy's last call, go to sleep before
    iron's threads are timed (they would otherwise compete for the same two cores)."""
    time.sleep(0.5)


def bench_gemv(name, m, k, profile, rng, fmt="bf16"):
    w0 = weight(rng, m, k, fmt)
    nbytes = w0.nbytes
    n = copies_for(nbytes)
    graph = Repeated(lambda g, i, x: GEMV.step(g.weight(f"w{i}", w0.shape, w0.dtype), x,
                                               **fields(fmt)), n, profile=profile)
    graph.weights = {f"w{i}": w0 if i == 0 else weight(rng, m, k, fmt) for i in range(n)}
    x = rng.standard_normal((1, k)).astype(BF16)
    program = graph.record_like([x])
    exe = cpu.load(program)
    exe.bind_weights(graph.weights)
    quiet_blas()
    ours = median_seconds(lambda: exe.run([x], copy=False)) / n
    n32 = copies_for(m * k * 4)
    w32 = [rng.standard_normal((m, k)).astype(np.float32) for _ in range(n32)]
    x32 = x.astype(np.float32).ravel()
    theirs = median_seconds(lambda: [w @ x32 for w in w32]) / n32
    op = program.ops[0]
    print(f"GEMV {name:15s} {m:>5}x{k:<5} {fmt} iron {nbytes / ours / 1e9:6.1f} GB/s "
          f"({ours * 1e6:7.1f} us)  numpy f32 {m * k * 4 / theirs / 1e9:6.1f} GB/s "
          f"({theirs * 1e6:7.1f} us)  bandwidth ratio {nbytes / ours / (m * k * 4 / theirs):.2f}"
          f"  time ratio {theirs / ours:.2f}x  [{tunables(op)}]")


def bench_gemm(name, m, k, n, profile, rng, fmt="bf16"):
    a = rng.standard_normal((m, k)).astype(BF16)
    w = weight(rng, n, k, fmt)

    class One(iron.Graph):
        def body(self, x):
            return GEMM.step(x, self.weight("w", w.shape, w.dtype), **fields(fmt))

    graph = One(profile=profile)
    graph.weights = {"w": w}
    program = graph.record_like([a])
    exe = cpu.load(program)
    exe.bind_weights(graph.weights)
    quiet_blas()
    ours = median_seconds(lambda: exe.run([a], copy=False))
    a32, w32 = a.astype(np.float32), rng.standard_normal((n, k)).astype(np.float32)
    theirs = median_seconds(lambda: a32 @ w32.T)
    flops = 2 * m * k * n
    print(f"GEMM {name:15s} {m}x{k}x{n:<6} {fmt} iron {flops / ours / 1e9:6.1f} GFLOP/s  numpy f32 "
          f"{flops / theirs / 1e9:6.1f} GFLOP/s  ratio {theirs / ours:.2f}x  "
          f"[{tunables(program.ops[0])}]")


def bench_small(name, cls, inputs, numpy_fn, profile, fields=None):
    class One(iron.Graph):
        def body(self, *xs):
            return cls.step(*xs, **(fields or {}))

    graph = One(profile=profile)
    program = graph.record_like(inputs)
    exe = cpu.load(program)
    quiet_blas()
    ours = median_seconds(lambda: exe.run(inputs, copy=False), repeats=51)
    f32 = [a.astype(np.float32) if a.dtype == BF16 else a for a in inputs]
    theirs = median_seconds(lambda: numpy_fn(*f32), repeats=51)
    print(f"{name:20s} iron {ours * 1e6:7.1f} us  numpy f32 {theirs * 1e6:7.1f} us  "
          f"ratio {theirs / ours:.2f}x  [{tunables(program.ops[0])}]")


def tunables(op):
    return ", ".join(f"{n}={getattr(op, n)}" for n in op.tunables())


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default=None, help="a profile file (default: resolve())")
    parser.add_argument("--weights", default="bf16", choices=quant.FORMATS[:4] + ("q4_k", "q6_k"),
                        help="the GEMV and GEMM weights' format")
    parser.add_argument("--shapes", default="smollm2", choices=("smollm2", "1b"))
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    big = args.shapes == "1b"
    for name, (m, k) in (GEMV_SHAPES_1B if big else GEMV_SHAPES).items():
        bench_gemv(name, m, k, args.profile, rng, args.weights)
    for name, (m, k, n) in (GEMM_SHAPES_1B if big else GEMM_SHAPES).items():
        bench_gemm(name, m, k, n, args.profile, rng, args.weights)
    if big:
        return
    x = rng.standard_normal((1, 576)).astype(BF16)
    w = rng.standard_normal(576).astype(BF16)
    bench_small("RMSNorm 1x576", RMSNorm, [x, w], lambda x, w: x / np.sqrt(
        (x * x).mean(-1, keepdims=True) + 1e-5) * w, args.profile)
    gu = rng.standard_normal((1, 3072)).astype(BF16)
    bench_small("SwiGLU 1x1536", SwiGLU, [gu], lambda g: g[:, :1536] / (
        1 + np.exp(-g[:, :1536])) * g[:, 1536:], args.profile)
    bench_small("Add 576", ElementwiseAdd, [x, x], np.add, args.profile)
    q = rng.standard_normal((1, 576)).astype(BF16)
    kc, vc = (rng.standard_normal((3, 2048, 64)).astype(BF16) for _ in range(2))
    pos = np.array([511], np.int32)

    def attention(q, k, v, pos):
        n = int(pos[0]) + 1
        qh = q.reshape(3, 3, 64)
        s = np.einsum("gqd,gkd->gqk", qh, k[:, :n]) / 8.0
        p = np.exp(s - s.max(-1, keepdims=True))
        return np.einsum("gqk,gkd->gqd", p / p.sum(-1, keepdims=True), v[:, :n])

    bench_small("Attention len 512", Attention, [q, kc, vc, pos], attention, args.profile)


if __name__ == "__main__":
    main()
