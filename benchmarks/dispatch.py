"""Per-call overhead of a 300-step program: is a call dominated by Python?

A chain of 300 tiny ``ElementwiseAdd`` steps (16 elements, where the kernel's own work is a few
nanoseconds) is run through ``Executable.run`` — one ctypes call into the compiled executor —
and timed per call and per step, next to the same 300 additions as a Python loop of numpy calls
and next to the executor's own per-step kernel time (``run_timed``).

    python benchmarks/dispatch.py
"""

import numpy as np

import iron
from iron.operators import ElementwiseAdd
from iron.targets import cpu
from timing import median_seconds

STEPS, SIZE = 300, 16


class Chain(iron.Graph):
    def body(self, x, y):
        for _ in range(STEPS):
            x = ElementwiseAdd.step(x, y)
        return x


def main():
    x = np.zeros(SIZE, iron.bfloat16)
    y = np.full(SIZE, 1e-3, iron.bfloat16)
    exe = cpu.load(Chain().record_like([x, y]))
    ours = median_seconds(lambda: exe.run([x, y], copy=False), repeats=200, warmup=10)
    seconds = np.zeros(STEPS)
    exe.run_timed([x, y], seconds)
    kernels = seconds.sum()
    x32, y32 = x.astype(np.float32), y.astype(np.float32)

    def numpy_loop():
        a = x32
        for _ in range(STEPS):
            a = a + y32
        return a

    theirs = median_seconds(numpy_loop, repeats=200, warmup=10)
    print(f"{STEPS}-step program: iron {ours * 1e6:.1f} us per call ({ours / STEPS * 1e9:.0f} ns "
          f"per step; kernels alone {kernels / STEPS * 1e9:.0f} ns per step), numpy loop "
          f"{theirs * 1e6:.1f} us ({theirs / STEPS * 1e9:.0f} ns per step); ratio "
          f"{theirs / ours:.1f}x")


if __name__ == "__main__":
    main()
