"""Devices: the figures resolution reads about where an operator will run.

A ``Device`` is what an operator's own rules and candidate values (``Operator.rules(dev)``,
``Operator.space(dev)``) may depend on: how many columns it has, how many DMA channels a
column streams through, and below how much work a team of columns costs more than it saves.
Everything else a target knows about its devices (an NPU's memories, descriptors and MAC
shapes) lives in the target's package; the host CPU's facts (ISA, model, cores) in
``iron.host``, below every layer that reads them.

The NPU numbers are those of mlir-aie's AIE target model (``AIETargetModel.h`` in
github.com/Xilinx/mlir-aie): npu1 (Phoenix / Hawk Point, AIE2) has 4 usable columns, npu2
(Strix / Krackan, AIE2P) has 8; each column's shim tile has two DMA channels into the array
and two out of it (``iron/targets/npu/resources.py`` counts the rest).  They are the same on
every host, so a profile entry beyond them is an error.  On the host CPU a "column" is a
worker thread, so its column count is the number of cores this process may use
(``iron.host.usable_cores``): a host figure, so a profile entry tuned on a larger host falls back to
the defaults here with a warning.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from .errors import DeviceError
from .host import usable_cores


@dataclass(frozen=True)
class Device:
    """One device, as the legality rules and the default tunables see it."""

    name: str
    kind: str  # selects the target that compiles and runs: "cpu" or "npu"
    columns: int  # usable AIE columns; on the cpu, worker threads
    shim_channels: int  # DMA channels per column and direction (cpu: 1, a thread's own loads)
    #: Below this many bytes of work one column is preferred: on the cpu a thread team's fork
    #: and join (a few microseconds) costs more than it saves (one core streams about 10 KB a
    #: microsecond); an NPU's columns cost nothing to start.
    parallel_bytes: int = 0
    #: True when the figures are the same on every host (an NPU generation); False when they
    #: are this host's (the cpu's cores), so a profile tuned elsewhere may not fit them.
    fixed: bool = True

    def __str__(self) -> str:
        return self.name


def _cpu() -> Device:
    return Device("cpu", "cpu", columns=usable_cores(), shim_channels=1,
                  parallel_bytes=64 * 1024, fixed=False)


#: The one statement of each NPU's usable columns: the npu target's resources and its
#: transcription of mlir-aie's target model (``preconditions.target_model``) read them here.
_NPUS = {
    "npu1": Device("npu1", "npu", columns=4, shim_channels=2),
    "npu2": Device("npu2", "npu", columns=8, shim_channels=2),
}

DEVICE_NAMES = ("cpu", *_NPUS)


def device(name: str | Device | None = None) -> Device:
    """The device called ``name``; ``None`` means ``$IRON_DEVICE``, else the host ``cpu``."""
    if isinstance(name, Device):
        return name
    if name is None:
        name = os.environ.get("IRON_DEVICE") or "cpu"
    if name == "cpu":
        return _cpu()
    if name in _NPUS:
        return _NPUS[name]
    raise DeviceError(f"unknown device {name!r}: iron knows {', '.join(DEVICE_NAMES)}")
