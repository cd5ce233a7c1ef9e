"""Buffer planning: memory for a program's temporaries, shared where lifetimes allow.

Any target that runs a ``Program`` on host memory (the cpu executor, the npu emulator) asks
``temp_buffers`` for its temps' arrays.
"""

from __future__ import annotations

import math

import numpy as np

from .program import Program


def temp_buffers(program: Program) -> dict[int, np.ndarray]:
    """Arrays for the program's temps, sharing memory between temps that are never live at once.

    As in ggml's allocator: in step order, a step's new temps take the smallest free block that
    fits, and a temp's block goes back to the pool once the last step that touches it has run.
    The program's outputs get blocks of their own (callers read them after the run).
    """
    def nbytes(t: int) -> int:
        tensor = program.tensors[t]
        return math.prod(tensor.shape) * np.dtype(tensor.dtype).itemsize

    last: dict[int, int] = {}
    for i, s in enumerate(program.steps):
        for t in (*s.inputs, *s.outputs):
            last[t] = i
    ends: dict[int, list[int]] = {}  # step -> temps whose block is free after it
    for t, i in last.items():
        if program.tensors[t].kind == "temp" and t not in program.outputs:
            ends.setdefault(i, []).append(t)
    free: list[np.ndarray] = []  # uint8 blocks, sorted by size
    block: dict[int, np.ndarray] = {}
    for i, s in enumerate(program.steps):
        for t in s.outputs:
            if program.tensors[t].kind != "temp" or t in block:
                continue  # state, or written in place over an earlier temp
            fit = next((k for k, b in enumerate(free) if b.nbytes >= nbytes(t)), None)
            if fit is not None and t not in program.outputs:
                block[t] = free.pop(fit)  # the smallest that fits
            else:
                block[t] = aligned_bytes(nbytes(t))
        free = sorted(free + [block[t] for t in ends.get(i, ())], key=lambda b: b.nbytes)
    return {t: b[:nbytes(t)].view(program.tensors[t].dtype).reshape(program.tensors[t].shape)
            for t, b in block.items()}


def aligned_bytes(n: int, alignment: int = 64) -> np.ndarray:
    """``n`` zeroed bytes starting on an ``alignment`` boundary."""
    raw = np.zeros(max(n, 1) + alignment, np.uint8)
    skip = -raw.ctypes.data % alignment
    return raw[skip:skip + n]
