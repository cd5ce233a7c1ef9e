"""Cost models: what a target's ``cost(op)`` returns, and the NPU numbers a design's model needs.

A cost model estimates the time of one resolved operator instance from the work it does and the
machine it runs on, without running it.  The tuner uses it to rank candidates: on the cpu to
measure only the most promising settings (``--prune K``), on a device it cannot measure (an
NPU without XRT) to choose by the model alone, saying so (``"source": "model"``).

``Target.cost(op)`` returns an ``Estimate`` or ``None`` (the target has no model).  An estimate
is seconds per call of the instance and its named bottleneck, with every term it took the
maximum or the sum of, so a person can check it by hand:

- ``terms``: seconds per resource, each computed as if it were the only limit; ``bottleneck`` is
  the name of the largest, one of ``BOTTLENECKS``;
- ``seconds``: the launch terms (``LAUNCH``: a per-call overhead that does not overlap anything)
  plus the largest of the others, which overlap (double-buffered data movement beside compute).

What an NPU design's ``cost()`` must return (``iron.targets.npu``, one model per design):

- ``compute``: MACs per core over the device's MACs per cycle per core for the dtype
  (``MACS_PER_CYCLE``; elementwise and row-wise work: elements over ``VECTOR_LANES_BF16``), over
  the clock (``CLOCK_HZ``); cores = the columns used x the compute tiles the design uses in each;
- ``shim DMA``: bytes crossing each column's shim tile, over the channels the design uses per
  column and direction (at most ``SHIM_CHANNELS``), at ``DMA_BYTES_PER_CYCLE`` per channel;
  inputs and outputs move on separate channels, so the larger direction counts;
- ``memtile``: bytes through a column's memory tile (GEMM's A split and C join), each byte
  once in and once out, at ``DMA_BYTES_PER_CYCLE`` per memory-tile channel in use;
- ``launch``: ``LAUNCH_SECONDS`` per call (the host dispatches one kernel run through XRT).
  ``RECONFIGURE_CYCLES`` per column is what a whole-program model adds where a step's design
  differs from the previous step's; one instance's ``cost()`` does not know its neighbours.

In code: ``estimate({COMPUTE: c, SHIM_DMA: s, MEMTILE: m}, {LAUNCH: LAUNCH_SECONDS})``.

FIFO depth 2 (double buffering) is what lets compute and data movement overlap; a design with
depth-1 FIFOs on its main stream must add its compute and DMA terms instead of taking the
maximum.  The constants below are public figures; each names where it comes from.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping

#: The resources an estimate can name as its bottleneck.
COMPUTE, MEMORY, SHIM_DMA, MEMTILE, LAUNCH = "compute", "memory", "shim DMA", "memtile", "launch"
BOTTLENECKS = (COMPUTE, MEMORY, SHIM_DMA, MEMTILE, LAUNCH)


@dataclass(frozen=True)
class Estimate:
    """Modelled seconds per call of one instance, and the resource that sets them."""

    seconds: float
    bottleneck: str
    terms: Mapping[str, float] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if self.bottleneck not in BOTTLENECKS:
            raise ValueError(f"estimate bottleneck {self.bottleneck!r} is not one of "
                             f"{', '.join(BOTTLENECKS)}")
        if not (math.isfinite(self.seconds) and self.seconds > 0):
            raise ValueError(f"estimate of {self.seconds!r} s: a modelled time is a positive "
                             "finite number of seconds")

    def describe(self) -> str:
        parts = ", ".join(f"{k} {v * 1e6:.1f}" for k, v in self.terms.items())
        return f"{self.seconds * 1e6:.1f} us ({self.bottleneck}-bound; {parts} us)"


def estimate(terms: Mapping[str, float], launch: Mapping[str, float] | None = None) -> Estimate:
    """The estimate of overlapping ``terms`` after non-overlapping ``launch`` terms.

    seconds = sum(launch) + max(terms); the bottleneck is the largest single term of either.
    """
    launch = dict(launch or {})
    every = {**terms, **{k: v + terms.get(k, 0.0) for k, v in launch.items()}}
    bottleneck = max(every, key=lambda k: every[k])
    return Estimate(sum(launch.values()) + max(terms.values(), default=0.0), bottleneck, every)


# ---- the NPU numbers a design's model needs ------------------------------------------------
#
# Sources: mlir-aie (github.com/Xilinx/mlir-aie): the AIE target model
# (include/aie/Dialect/AIE/IR/AIETargetModel.h) and the matmul kernels
# (aie_kernels/aie2/mm.cc, aie_kernels/aie2p/mm.cc, whose MMUL shapes are the MAC shapes);
# AMD AM020 "Versal Adaptive SoC AIE-ML Architecture Manual" (AIE2 tiles, DMA);
# upstream IRON (github.com/amd/IRON), its operators' designs and its Llama application.

#: bf16 MACs per cycle per compute tile: npu1 (AIE2) multiplies 4x8 by 8x4 blocks (mlir-aie
#: aie_kernels/aie2/mm.cc, bf16 MMUL 4x8x4 = 128); npu2 (AIE2P) 8x8 by 8x8 through bfp16
#: (aie_kernels/aie2p/mm.cc, 8x8x8 = 512).
MACS_PER_CYCLE = {"npu1": {"bf16": 4 * 8 * 4}, "npu2": {"bf16": 8 * 8 * 8}}

#: bf16 elements per cycle per compute tile for vector (elementwise, row-wise) work: one 512-bit
#: vector of 32 bf16 lanes per cycle (AM020, the AIE-ML vector unit).
VECTOR_LANES_BF16 = 32

#: Bytes a DMA channel moves per cycle: a 32-bit AXI4-Stream (AM020, tile DMA and stream switch).
DMA_BYTES_PER_CYCLE = 4

#: DMA channels per direction: shim tile 2, memory tile 6, compute tile 2 (AM020, and the
#: channel counts of mlir-aie's target model).
SHIM_CHANNELS, MEMTILE_CHANNELS, CORE_CHANNELS = 2, 6, 2

#: Compute tiles per column (rows 2..5; mlir-aie target model getNumRows - 2).
CORES_PER_COLUMN = 4

#: Array clock.  npu1: AMD rates the Phoenix NPU at 10 int8 TOPS over its 20 AIE-ML cores
#: (5 columns x 4), each 256 int8 MACs per cycle (the 4x8x8 int8 MMUL): 10e12 / (20 x 256 x 2)
#: is about 1.0 GHz.  npu2: the 1.8 GHz upstream IRON's performance checks assume for AIE2P.
#: The Linux driver's DPM tables (drivers/accel/amdxdna/npu*_regs.c) list the real levels.
CLOCK_HZ = {"npu1": 1.0e9, "npu2": 1.8e9}

#: Host-side cost of one kernel dispatch through XRT.  Upstream IRON's Llama 3.2 1B decode runs
#: at 2.7-5 tokens/s with about 180 dispatches per token and about three quarters of the time in
#: dispatch: 0.8-1.5 ms each; 1 ms is the middle.
LAUNCH_SECONDS = 1.0e-3

#: Reconfiguring a column for a different design: about 40k cycles per column, as measured on
#: npu2 by KU Leuven MICAS's Stream design-space exploration project.
RECONFIGURE_CYCLES = 40_000
