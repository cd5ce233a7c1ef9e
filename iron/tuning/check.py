"""How close a kernel's output must be to the reference maths: shared by the tests and the tuner.

Both sides are rounded to bfloat16 before they are compared, so an element may differ by
``atol + rtol * |ref|`` (the operator's ``tolerance``) plus one bf16 ulp of the reference: the
one rounding step by which two correct bf16 results of the same float32 sum may differ.  The
tuner rejects a candidate whose output breaks this bound; the kernel tests assert it.
"""

from __future__ import annotations

import numpy as np

from ..operator import Operator


def tolerance(name: str) -> tuple[float, float]:
    """(rtol, atol) of the operator called ``name``."""
    return Operator.registry[name].tolerance


def bf16_ulp(x: np.ndarray) -> np.ndarray:
    """The spacing of bf16 numbers at |x| (8 significant bits)."""
    _, exponent = np.frexp(np.abs(x).astype(np.float32))
    return np.ldexp(np.float32(1), exponent - 8).astype(np.float32)


def mismatch(name: str, out: np.ndarray, ref: np.ndarray) -> str | None:
    """Why ``out`` is not close enough to ``ref`` for operator ``name``; None when it is."""
    rtol, atol = tolerance(name)
    out, ref = np.asarray(out, np.float32), np.asarray(ref, np.float32)
    if out.shape != ref.shape:
        return f"{name}: output has shape {out.shape}, the reference {ref.shape}"
    bound = atol + rtol * np.abs(ref) + bf16_ulp(ref)
    error = np.abs(out - ref)
    bad = ~(error <= bound)  # NaN counts as off
    if not bad.any():
        return None
    worst = np.unravel_index(np.argmax(np.where(bad, np.nan_to_num(error - bound, nan=np.inf),
                                                -np.inf)), ref.shape)
    return (f"{name}: {bad.sum()} of {bad.size} elements off; worst |out-ref|="
            f"{float(error[worst]):.4g} at {tuple(int(i) for i in worst)} "
            f"(out {float(out[worst]):.4g}, reference {float(ref[worst]):.4g}, "
            f"allowed {float(bound[worst]):.4g})")


def assert_close(name: str, out: np.ndarray, ref: np.ndarray) -> None:
    """Fail with ``mismatch``'s message when ``out`` is not close enough to ``ref``."""
    problem = mismatch(name, out, ref)
    assert problem is None, problem
