"""Shared test helpers (moved out of tests/tuning/test_tuner.py so no test imports another)."""

import json
import time
import zlib
import numpy as np
import iron
from iron.operators import AXPY, GEMV, Embedding
from iron.pipeline.app import Application
from iron.targets import cpu
from iron.tuning.log import Comparison
from iron.tuning.measure import Benchmark, Measurement


class Chain(iron.Graph):
    """x, y -> AXPY -> GEMV with a weight; plus an embedding lookup with one legal setting."""

    def body(self, x, y, tokens):
        w = self.weight("w", (16, 64))
        table = self.weight("table", (10, 64))
        e = Embedding.step(table, tokens)
        h = AXPY.step(x, y, scalar_factor=2.0)
        return GEMV.step(w, h), e


class FakeApp(Application):
    """``Chain``'s decode and prefill programs, with real weights: they run on the cpu target."""

    name = "fake"

    def __init__(self, graph=Chain):
        self.graph = graph

    def programs(self, device, profile):
        g = self.graph(device, profile)
        tok = iron.spec((1,), np.int32)
        return {"decode": g.record((64,), (64,), tok), "prefill": g.record((2, 64), (2, 64), tok)}

    def weights(self):
        rng = np.random.default_rng(1)
        yield "w", (rng.standard_normal((16, 64)) * 0.1).astype(iron.bfloat16)
        yield "table", rng.standard_normal((10, 64)).astype(iron.bfloat16)


def fake_time(op):
    """A repeatable pseudo-time per setting: 1 .. 1000 microseconds."""
    return (zlib.crc32(json.dumps(op.config(), sort_keys=True).encode()) % 1000 + 1) * 1e-6


class FakeBench(Benchmark):
    """Times from ``fake_time``; counts calls; can reject settings or interrupt after N calls."""

    method = "fake"

    def __init__(self, wrong=lambda op: False, interrupt_after=None, sleep=0.0,
                 head_to_head=None):
        self.wrong, self.interrupt_after, self.sleep = wrong, interrupt_after, sleep
        # (first quartile, median, third quartile) of the per-round gains of new over old
        self.head_to_head = head_to_head or (
            lambda new, old: (fake_time(old) / fake_time(new),) * 3)
        self.measured, self.compared = [], []

    def key(self, op):
        return cpu.recipe_for(op).key

    def compile(self, ops, deadline):
        return {self.key(op): None for op in ops}

    def measure(self, instance, op, best):
        if self.interrupt_after is not None and len(self.measured) >= self.interrupt_after:
            raise KeyboardInterrupt
        self.measured.append(op)
        time.sleep(self.sleep)
        if self.wrong(op):
            return Measurement(error="wrong result: deliberately corrupted")
        return Measurement(fake_time(op), 0.0, 1)

    def compare(self, instance, new, old):
        self.compared.append((new, old))
        low, gain, high = self.head_to_head(new, old)
        return Comparison(self.key(new), self.key(old), gain, low, high, 1, self.method)
