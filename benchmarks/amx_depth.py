"""What the block of x's int8 rounding costs AMX: the tile unit's rate at each block size.

iron rounds x (a token's activations) to int8 codes with one scale per 16 values, and the
quantized GEMV and GEMM must give a row the same bits, so a GEMM may only sum 16 codes before it
scales the sum: an AMX tile product of depth 16, a quarter of the unit's width (64). Coarser
blocks round x worse (``benchmarks/activation_scale.py``: KL 0.0018 per 16, 0.0034 per 32,
0.0080 per 64) but let a product run deeper. W's own blocks bound the depth as well: a product
cannot span two of W's scales, 32 values in Q4_0, Q4_1, Q8_0 and Q4_K, 16 in Q6_K, so 64 is out
of reach for GGUF's formats whatever x's rounding (it is timed as the unit's width). This times
the tile unit at depths 16, 32 and 64 on a prompt chunk's shape (``amx_depth.c``): integer
sums only, with x's scale, and with x's and W's scales (the fewest float steps a kernel on
quantized W can take), beside iron's own quantized GEMM (q4_0, the AVX512-VNNI kernel) on the
same shape in the same run, and prints each as a ratio of iron's.

    python benchmarks/amx_depth.py [--threads 2]

Needs AMX-INT8 (Sapphire Rapids or later) and Linux.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from iron.targets import cpu

from qkernel_ab import alternate, quantized_gemm

M, K, N = 64, 2048, 2048  # as amx_depth.c
SOURCE = Path(__file__).with_name("amx_depth.c")
STEPS = ("integer sums only", "x's scale", "x's and W's scales")  # amx_depth.c's FLOAT 0, 1, 2


def has_amx_int8():
    with open("/proc/cpuinfo") as f:
        return any(line.startswith("flags") and " amx_int8" in line for line in f)


def amx_seconds(depth, steps, threads, folder):
    exe = Path(folder) / f"amx-{depth}-{steps}"
    subprocess.run([cpu.compiler()[0], "-O2", "-mavx512f", "-mamx-tile", "-mamx-int8",
                    "-fopenmp", f"-DDEPTH={depth}", f"-DFLOAT={steps}", str(SOURCE),
                    "-o", str(exe)], check=True)
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OMP_PROC_BIND="close")
    return float(subprocess.run([str(exe)], env=env, check=True, capture_output=True,
                                text=True).stdout)


def iron_gemm_seconds(threads, folder, rounds=9):
    kernel, call, _keep = quantized_gemm("q4_0", M, K, N, threads,
                                         Path(__file__).resolve().parents[1], folder,
                                         np.random.default_rng(0))
    return min(alternate({"iron": kernel}, [call] * 3, rounds)["iron"])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    if not has_amx_int8():
        raise SystemExit("amx_depth: this host has no AMX-INT8 (no amx_int8 in /proc/cpuinfo)")
    ops = 2 * M * K * N
    with tempfile.TemporaryDirectory() as folder:
        base = iron_gemm_seconds(args.threads, folder)
        rows = [("iron q4_0 GEMM (VNNI, depth 16, all float steps)", base)]
        for depth in (16, 32, 64):
            for steps, what in enumerate(STEPS):
                rows.append((f"AMX depth {depth}, {what}",
                             amx_seconds(depth, steps, args.threads, folder)))
    print(f"{M} x {K} x {N}, {args.threads} threads, best of 20 runs (AMX) and of 9 rounds (iron)")
    print("| kernel | TOP/s | / iron |")
    print("|---|---|---|")
    for name, seconds in rows:
        print(f"| {name} | {ops / seconds / 1e12:.2f} | {base / seconds:.2f}x |")


if __name__ == "__main__":
    main()
