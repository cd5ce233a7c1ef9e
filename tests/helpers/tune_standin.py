"""A deterministic stand-in benchmark that Dask workers can import: its "time" of a setting is a
fixed function of the setting, some settings are "wrong", and it can kill its worker once."""

import json
import os
import time
import zlib
from pathlib import Path

from iron.targets import cpu
from iron.tuning.log import Comparison
from iron.tuning.measure import Benchmark, Measurement


def standin_time(op) -> float:
    """A repeatable pseudo-time per setting: 1 .. 1000 microseconds."""
    return (zlib.crc32(json.dumps(op.config(), sort_keys=True).encode()) % 1000 + 1) * 1e-6


def standin_wrong(op) -> bool:
    return zlib.crc32(json.dumps(op.config(), sort_keys=True).encode()) % 7 == 0


class StandInBench(Benchmark):
    """Times from ``standin_time``; with ``crash_key``, the first process to measure that
    candidate dies mid-measurement (it leaves ``crash_marker`` behind), or every process does
    when there is no marker; each measurement takes ``delay`` seconds."""

    method = "stand-in"

    def __init__(self, crash_key: str | None = None, crash_marker: str | None = None,
                 delay: float = 0.0):
        self.crash_key, self.crash_marker, self.delay = crash_key, crash_marker, delay

    def key(self, op):
        return cpu.recipe_for(op).key

    def compile(self, ops, deadline):
        return {self.key(op): None for op in ops}

    def measure(self, instance, op, best):
        time.sleep(self.delay)
        if self.crash_key == self.key(op):
            if self.crash_marker is None:
                os._exit(1)
            if not Path(self.crash_marker).exists():
                Path(self.crash_marker).write_text(str(os.getpid()))
                os._exit(1)  # the worker dies mid-task, as a machine that goes away would
        if standin_wrong(op):
            return Measurement(error="wrong result: stand-in rejection")
        return Measurement(standin_time(op), 0.0, 1)

    def compare(self, instance, new, old):
        gain = standin_time(old) / standin_time(new)
        return Comparison(self.key(new), self.key(old), gain, gain, gain, 1, self.method)
