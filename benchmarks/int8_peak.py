"""The host's int8 dot-product peak and the share of it iron's Q4_0 prefill GEMM reaches.

The quantized GEMM of a prompt chunk multiplies W's 4-bit codes by x's int8 codes with
VPDPBUSD (``iron/kernels/cpu/qmatmul_vnni.h``; AVX2 hosts emulate it), so its ceiling is that
instruction's rate on every core. ``int8_peak.c`` measures it: VPDPBUSD back to back into
independent accumulators on each thread (zmm with AVX512-VNNI, ymm with AVX-VNNI), best of 9
runs. Then iron's q4_0 GEMM, as this checkout compiles it, runs a 1B Llama's prefill shapes
(a 64-row chunk against the FFN up, FFN down and QKV weights), with x rounded per 16 values
and per 32 (the operator's ``x_block``: the Llama app's choice for the attention output and
the MLP), best of the rounds, on one thread and on ``--threads``; each is printed in int8
multiply-adds per second (M x K x N per call) and as a fraction of the peak on as many
threads.

    python benchmarks/int8_peak.py [--threads 2] [--rounds 9]

Needs VPDPBUSD (AVX512-VNNI or AVX-VNNI) and Linux. One thread is timed in CPU time, the peak
and the GEMM alike, so its fraction holds on a shared machine; the team is timed in wall time,
which only a quiet machine makes meaningful (the script prints the load average it saw).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

from iron.targets import cpu

from qkernel_ab import GEMM_SHAPES, quantized_gemm

SOURCE = Path(__file__).with_name("int8_peak.c")


def peak(threads: int, folder: str) -> tuple[float, float, int]:
    """VPDPBUSD multiply-adds per second on ``threads`` threads, per second of wall time and
    of the busiest thread's CPU time, and the instruction's bytes."""
    exe = Path(folder) / "int8_peak"
    if not exe.exists():
        subprocess.run([cpu.compiler()[0], "-O2", "-march=native", "-fopenmp", str(SOURCE),
                        "-o", str(exe)], check=True)
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OMP_PROC_BIND="close")
    wall, busy, width = subprocess.run([str(exe)], env=env, check=True, capture_output=True,
                                       text=True).stdout.split()
    return float(wall), float(busy), int(width)


def gemm_rate(m: int, k: int, n: int, threads: int, folder: str, rounds: int,
              x_block: int) -> float:
    """iron's q4_0 GEMM of (m, k) x (n, k)^T, x rounded per ``x_block`` values, on ``threads``
    threads: multiply-adds per second, best of ``rounds`` calls; per second of CPU time with
    one thread, else of wall time."""
    kernel, call, _keep = quantized_gemm("q4_0", m, k, n, threads,
                                         Path(__file__).resolve().parents[1], folder,
                                         np.random.default_rng(0), x_block)
    clock = time.process_time if threads == 1 else time.perf_counter
    kernel(call)  # warm-up
    best = float("inf")
    for _ in range(rounds):
        start = clock()
        kernel(call)
        best = min(best, clock() - start)
    return m * k * n / best


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f}")
    with tempfile.TemporaryDirectory() as folder:
        _, one, width = peak(1, folder)
        every, _, _ = peak(args.threads, folder)
        print(f"VPDPBUSD ({width * 8}-bit): {one / 1e9:.0f} G multiply-adds/s on 1 thread "
              f"(per CPU second), {every / 1e9:.0f} G on {args.threads} (per wall second)")
        print(f"| q4_0 GEMM M x K x N | x block | 1 thread: G/s | of the peak | "
              f"{args.threads} threads: G/s | of the peak |")
        print("|---|---|---|---|---|---|")
        for m, k, n in GEMM_SHAPES:
            for x_block in (16, 32):
                rates = [gemm_rate(m, k, n, t, folder, args.rounds, x_block)
                         for t in (1, args.threads)]
                print(f"| {m} x {k} x {n} | {x_block} | {rates[0] / 1e9:.0f} | "
                      f"{rates[0] / one:.0%} | {rates[1] / 1e9:.0f} | {rates[1] / every:.0%} |",
                      flush=True)
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
