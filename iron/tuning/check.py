"""How close a kernel's output must be to the reference maths: shared by the tests and the tuner.

Both sides are rounded to the output's dtype before they are compared, so an element may differ
by ``atol + rtol * |ref|`` (the operator's ``tolerance``, or the target's where its kernels
approximate more coarsely: ``Target.tolerance``) plus one ulp of the reference in that dtype
(bf16, or float32 for a float32 output such as logits): the one rounding step by which two
correct results of the same float32 sum may differ.  And the
elements together may not lean one way: the sum of the errors stays within ``BIAS`` of the sum
of |ref|. Rounding and the kernels' approximations are unbiased, a systematic error (a wrong
constant, a missing term) is not, so a 1% one fails even where elements may each be 3% off.
The tuner rejects a candidate whose output breaks either bound; the kernel tests assert them.
"""

from __future__ import annotations

import numpy as np

from ..operator import Operator


#: the largest sum of errors, as a fraction of sum |ref|: half a bf16 rounding step (measured:
#: 0 on every cpu kernel, at most 5e-4 on the AIE2 lookup-table exponential's)
BIAS = 2.0 ** -9


def tolerance(name: str) -> tuple[float, float]:
    """(rtol, atol) of the operator called ``name``."""
    return Operator.registry[name].tolerance


def bf16_ulp(x: np.ndarray) -> np.ndarray:
    """The spacing of bf16 numbers at |x| (8 significant bits)."""
    _, exponent = np.frexp(np.abs(x).astype(np.float32))
    return np.ldexp(np.float32(1), exponent - 8).astype(np.float32)


def float32_ulp(x: np.ndarray) -> np.ndarray:
    """The spacing of float32 numbers at |x| (24 significant bits)."""
    return np.spacing(np.abs(x).astype(np.float32))


def mismatch(name: str, out: np.ndarray, ref: np.ndarray,
             tol: tuple[float, float] | None = None) -> str | None:
    """Why ``out`` is not close enough to ``ref`` for operator ``name`` (within ``tol``, by
    default the operator's own tolerance); None when it is."""
    rtol, atol = tol or tolerance(name)
    ulp = float32_ulp if np.asarray(out).dtype == np.float32 else bf16_ulp
    out, ref = np.asarray(out, np.float32), np.asarray(ref, np.float32)
    if out.shape != ref.shape:
        return f"{name}: output has shape {out.shape}, the reference {ref.shape}"
    bound = atol + rtol * np.abs(ref) + ulp(ref)
    error = np.abs(out - ref)
    bad = ~(error <= bound)  # NaN counts as off
    if not bad.any():
        lean = float(np.sum(out.astype(np.float64) - ref))
        scale = float(np.sum(np.abs(ref.astype(np.float64))))
        if abs(lean) <= BIAS * scale:
            return None
        return (f"{name}: the errors lean one way: they sum to {lean:.4g}, "
                f"{abs(lean) / scale:.3%} of sum |ref| = {scale:.4g} (at most {BIAS:.3%}: a "
                "systematic error)")
    worst = np.unravel_index(np.argmax(np.where(bad, np.nan_to_num(error - bound, nan=np.inf),
                                                -np.inf)), ref.shape)
    return (f"{name}: {bad.sum()} of {bad.size} elements off; worst |out-ref|="
            f"{float(error[worst]):.4g} at {tuple(int(i) for i in worst)} "
            f"(out {float(out[worst]):.4g}, reference {float(ref[worst]):.4g}, "
            f"allowed {float(bound[worst]):.4g})")


def assert_close(name: str, out: np.ndarray, ref: np.ndarray,
                 tol: tuple[float, float] | None = None) -> None:
    """Fail with ``mismatch``'s message when ``out`` is not close enough to ``ref``."""
    problem = mismatch(name, out, ref, tol)
    assert problem is None, problem
