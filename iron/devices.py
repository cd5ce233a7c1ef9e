"""Devices: what ``Operator.resolve`` needs to know about where an operator will run.

The NPU numbers are those of mlir-aie's AIE target model (``AIETargetModel.h`` in
github.com/Xilinx/mlir-aie): npu1 (Phoenix / Hawk Point, AIE2) has 4 usable columns, npu2
(Strix / Krackan, AIE2P) has 8; each compute tile has 64 KiB of data memory; each column's shim
tile has two DMA channels into the array and two out of it.  Every resource an npu design is
checked against (memories, DMA channels, buffer descriptors, access-pattern limits, MAC shapes)
is counted in ``iron/targets/npu/resources.py``.  On the host CPU a "column" is a worker
thread, so its column count is the number of cores this process may use (its
affinity, see ``iron.targets.cpu.host``), and its local memory is a core's L2 cache.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from .errors import DeviceError


@dataclass(frozen=True)
class Device:
    """One device kind, as the legality rules and the default tunables see it."""

    name: str
    kind: str  # "cpu" or "npu": selects the target that compiles and runs
    columns: int  # usable AIE columns; on the cpu, worker threads
    tile_memory: int  # bytes of data memory per compute tile (cpu: L2 per core)
    shim_channels: int  # DMA channels per column and direction (host -> array, array -> host)

    def __str__(self) -> str:
        return self.name


def host_cache_bytes() -> int:
    """The host's last-level cache as Linux reports it (32 MiB when it reports none): what a
    benchmark must stream past for its data to come from memory."""
    try:
        text = open("/sys/devices/system/cpu/cpu0/cache/index3/size").read().strip()
        return int(text[:-1]) * 1024 if text.endswith("K") else int(text)
    except (OSError, ValueError):
        return 32 << 20


def _cpu() -> Device:
    from .targets.cpu.host import usable_cores

    return Device("cpu", "cpu", columns=usable_cores(), tile_memory=512 * 1024,
                  shim_channels=1 << 30)


_NPUS = {
    "npu1": Device("npu1", "npu", columns=4, tile_memory=64 * 1024, shim_channels=2),
    "npu2": Device("npu2", "npu", columns=8, tile_memory=64 * 1024, shim_channels=2),
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
