"""Section 7 — Profiles and Tunables: a profile chooses AXPY's tunables; numpy checks the result.

    python3 examples/profiles.py                # the walkthrough (exercise 1)
    python3 examples/profiles.py --exercise 2   # a second entry; a different shape picks it
    python3 examples/profiles.py --exercise 3   # the call's own num_aie_columns wins
"""

import argparse

import numpy as np

import iron
from iron.operators import AXPY


class Scaled(iron.Graph):
    """``1.5 * x + y``: one ``AXPY`` step, its tunables left to the profile."""

    def body(self, x, y):
        return AXPY.step(x, y, scalar_factor=1.5)


class ScaledOneColumn(iron.Graph):
    """Exercise 3: the call names ``num_aie_columns=1`` itself."""

    def body(self, x, y):
        return AXPY.step(x, y, scalar_factor=1.5, num_aie_columns=1)


def tunables(op):
    return ", ".join(f"{name}={getattr(op, name)}" for name in op.tunables())


def main(exercise: int = 1) -> None:
    profile = iron.Profile()
    profile.add(AXPY, size=2048, tile_size=1024, num_aie_columns=2)
    if exercise == 2:
        profile.add(AXPY, size=1024, tile_size=256, num_aie_columns=1)

    graph = ScaledOneColumn() if exercise == 3 else Scaled()
    graph.profile = profile

    x, y = (np.random.rand(2048).astype(iron.bfloat16) for _ in range(2))
    out = graph(x, y)
    ref = graph.reference(x, y)
    expected = (1.5 * x.astype(np.float32) + y.astype(np.float32)).astype(iron.bfloat16)
    op = graph.record(x=(2048,), y=(2048,)).ops[0]
    print(f"size=2048 on {graph.device}: {tunables(op)}")
    np.testing.assert_allclose(out.astype(np.float32), ref.astype(np.float32), rtol=0.04, atol=1e-6)
    np.testing.assert_allclose(out.astype(np.float32), expected.astype(np.float32), rtol=0.04,
                               atol=1e-6)
    print("matches numpy: max |out - 1.5*x - y| =",
          float(np.max(np.abs(out.astype(np.float32) - expected.astype(np.float32)))))
    if exercise in (2, 3):
        small = graph.record(x=(1024,), y=(1024,)).ops[0]
        print(f"size=1024 on {graph.device}: {tunables(small)}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--exercise", type=int, choices=(1, 2, 3), default=1)
    main(parser.parse_args().exercise)
