"""Whether the machine is quiet enough to time kernels, measured rather than assumed.

The load average is a minute-long moving average that counts the tuner itself; what distorts a
timing is another process using a core *now*.  ``others_busy`` reads the machine's CPU time
(``/proc/stat``) and this process's own (``os.times``) over a short interval: the difference is
how many cores' worth other processes used.  ``wait_quiet`` pauses while that is above a
limit, and gives up with an error after a while, so a tune never records timings taken beside
a busy neighbour without saying so.
"""

from __future__ import annotations

import os
import time

from ..errors import IronError
from .events import Paused, PrintSink, QuietAgain, Sink

class BusyError(IronError):
    """The machine stayed busy: the tune stops rather than record timings taken under load."""


#: Cores' worth of CPU other processes may use while the tuner measures.
QUIET = 0.25
#: Seconds ``wait_quiet`` pauses for a busy machine before refusing.
PATIENCE = 300.0


def _machine_busy_seconds() -> float | None:
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    user, nice, system, idle, iowait, irq, softirq, steal = map(int, fields[1:9])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


class LoadMeter:
    """``with LoadMeter() as m: ...``; then ``m.load`` is the cores' worth of CPU other
    processes used during the block (0 where the machine's CPU time cannot be read)."""

    load = 0.0

    def __enter__(self) -> LoadMeter:
        self._start = (_machine_busy_seconds(), sum(os.times()[:4]), time.monotonic())
        return self

    def __exit__(self, *exc) -> None:
        machine, own, start = self._start
        end = _machine_busy_seconds()
        elapsed = time.monotonic() - start
        if machine is None or end is None or elapsed <= 0:
            return
        others = (end - machine) - (sum(os.times()[:4]) - own)
        self.load = max(0.0, others / elapsed)


def others_busy(interval: float = 0.25) -> float:
    """Cores' worth of CPU that other processes used over the next ``interval`` seconds."""
    with LoadMeter() as meter:
        time.sleep(interval)
    return meter.load


def wait_quiet(limit: float = QUIET, patience: float = PATIENCE,
               events: Sink | None = None) -> float:
    """Return others' load once it is at most ``limit``; pause while it is above, saying so to
    ``events`` (default: a ``PrintSink``); raise ``BusyError`` if it stays above for
    ``patience`` seconds."""
    emit = events or PrintSink()
    waited, said = 0.0, False
    while True:
        busy = others_busy()
        if busy <= limit:
            if said:
                emit(QuietAgain(waited))
            return busy
        if waited >= patience:
            raise BusyError(f"the machine stayed busy for {waited:.0f} s (other processes used "
                            f"{busy:.2f} cores' worth, the limit is {limit:g}); timings taken "
                            "now would be wrong: tune on a quiet machine")
        if not said:
            emit(Paused(busy, limit))
            said = True
        time.sleep(2.0)
        waited += 2.25
