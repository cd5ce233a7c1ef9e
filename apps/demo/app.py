"""The demo application's ``App``: a residual MLP block of a few chained operators, with
random weights made from a fixed seed instead of a checkpoint."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Iterator

import numpy as np

import iron
from iron.operators import GEMV, AXPY, RMSNorm, SiLU
from iron.pipeline.app import Application

from . import DIM, HIDDEN


class Block(iron.Graph):
    """``rmsnorm(x + 0.5 * down(silu(up(x))))`` for one vector x."""

    def __init__(self, hidden: int = HIDDEN, **graph):
        super().__init__(**graph)
        self.hidden = hidden

    def body(self, x):  # x: (1, DIM)
        h = SiLU.step(GEMV.step(self.weight("up", (self.hidden, DIM)), x))  # (1, hidden)
        y = GEMV.step(self.weight("down", (DIM, self.hidden)), h)  # (1, DIM)
        return RMSNorm.step(AXPY.step(y, x, scalar_factor=0.5), self.weight("norm", (DIM,)))


class App(Application):
    name = "demo"

    def __init__(self, checkpoint: str | Path | None = None, hidden: int = HIDDEN):
        self.seed, self.hidden = 0, hidden

    def programs(self, device, profile) -> dict:
        return {"block": Block(self.hidden, device=device, profile=profile).record(x=(1, DIM))}

    def weights(self) -> Iterator[tuple[str, np.ndarray]]:
        rng = np.random.default_rng(self.seed)
        n = self.hidden
        yield "up", (rng.standard_normal((n, DIM)) / DIM ** 0.5).astype(iron.bfloat16)
        yield "down", (rng.standard_normal((DIM, n)) / n ** 0.5).astype(iron.bfloat16)
        yield "norm", np.ones(DIM, iron.bfloat16)

    def meta(self) -> dict[str, Any]:
        return {"dim": DIM}

    def run_command(self, bundle: Path, prompt: str | None = None,
                    options: dict[str, str] | None = None) -> list[str]:
        return [sys.executable, "-m", "apps.demo", str(bundle)]
