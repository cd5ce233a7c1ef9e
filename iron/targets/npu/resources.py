"""The resources of the NPU devices, as the legality rules and the designs count them.

Every number names its public source.  "Target model" is mlir-aie's
``include/aie/Dialect/AIE/IR/AIETargetModel.h`` / ``lib/Dialect/AIE/IR/AIETargetModel.cpp``
(class ``AIE2TargetModel`` and its NPU subclasses ``NPU1TargetModel`` / ``NPU2TargetModel``);
"DMA verifier" is ``lib/Dialect/AIEX/IR/AIEXDialect.cpp`` (``NpuDmaMemcpyNdOp::verify``, the
runtime sequence's ``aiex.npu.dma_memcpy_nd``); AM020 is AMD's "Versal Adaptive SoC AIE-ML
Architecture Manual" (AIE2, the tile architecture of both NPU generations), at
docs.amd.com/r/en-US/am020-versal-aie-ml.

The second group of fields, and the constants below the class, are what the designs' cost model
(``iron.targets.npu.cost``) prices a design with; the kernels' own widths are read from their
sources (``iron.targets.npu.kernels``).  Where no public figure exists the number is
marked as an assumption, with the reasoning behind it; a measurement on a device replaces it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...devices import device


@dataclass(frozen=True)
class NpuResources:
    """One NPU generation's array, counted per tile and per column."""

    name: str
    arch: str  # the mlir-aie device name used in aie.device(...)
    columns: int  # usable columns: the device's, as ``iron.devices`` states them
    compute_rows: int = 4  # rows 2..5 of each column (target model: getNumRows - 2)
    core_memory: int = 64 * 1024  # data memory per compute tile (target model getLocalMemorySize)
    stack_bytes: int = 1024  # the core's stack, carved from data memory (aie.core stack_size 0x400)
    memtile_memory: int = 512 * 1024  # per memory tile (target model getMemTileSize, AM020)
    core_bds: int = 16  # buffer descriptors per compute tile DMA (target model getNumBDs)
    memtile_bds: int = 48  # per memory tile (target model getNumBDs for mem tiles)
    shim_bds: int = 16  # per shim tile (target model getNumBDs for shim NOC tiles)
    core_locks: int = 16  # locks per compute tile (target model getNumLocks)
    memtile_locks: int = 64  # locks per memory tile (target model getNumLocks)
    core_channels: int = 2  # DMA channels per direction, compute tile (AM020: 2 MM2S + 2 S2MM)
    memtile_channels: int = 6  # per direction, memory tile (AM020: 6 MM2S + 6 S2MM)
    shim_channels: int = 2  # per direction, shim tile (AM020: 2 MM2S + 2 S2MM)
    ap_dims: int = 4  # dimensions of a runtime-sequence access pattern (DMA verifier)
    ap_size_max: int = 1023  # sizes of the three inner dimensions (DMA verifier: [0:1023])
    ap_repeat_max: int = 64  # size of the outermost (repeat) dimension (DMA verifier: [1:64])
    ap_stride_max: int = 1 << 20  # strides, in 32-bit words (DMA verifier: [1:1M])
    word_bytes: int = 4  # the DMA's unit: innermost runs are whole 32-bit words (DMA verifier)
    # ---- speeds (the cost model's) ----
    #: Array clock.  npu1: AMD rates the Phoenix NPU at 10 int8 TOPS over its 20 AIE-ML cores
    #: (5 columns x 4), each 256 int8 MACs per cycle (the 4x8x8 int8 MMUL of mlir-aie's
    #: aie_kernels/aie2/mm.cc): 10e12 / (20 x 256 x 2) is about 1.0 GHz.  npu2: 1.8 GHz, the
    #: upstream IRON's (github.com/amd/IRON) performance checks assume for AIE2P, is the top
    #: level of the driver's DPM table (amd/xdna-driver ``npu4_regs.c``, ``npu4_dpm_clk_table``:
    #: H-clock 792 to 1800 MHz over 8 levels), reached in its turbo power mode, not a clock the
    #: array sustains in the default mode: the compute terms are lower bounds.
    clock_hz: float = 1.0e9
    #: Bytes per cycle of one DMA channel.  Shim: "each channel can sustain 4 bytes per cycle"
    #: (AM020, Array Interface DMA Memory-Mapped AXI4 Master Interface).  Memory and compute
    #: tiles: 32-bit stream ports (AM020, memory tile and tile DMA chapters); AIE-ML v2's memory
    #: tile has 64-bit ones (AM027), but whether npu2's AIE2P does is not published, so 4 B
    #: is assumed for both.
    dma_bytes_per_cycle: int = 4
    #: Host memory behind all the shim tiles together: LPDDR5X-7500 on a 128-bit bus, 120 GB/s
    #: peak, the memory AMD lists for the Ryzen 7040 / 8040 (npu1) and Ryzen AI 300 (npu2)
    #: laptop chips.  A peak, not what the NPU draws: upstream IRON's largest measured npu2
    #: GEMV (``GEMV_9b077fca...`` in ``decode_costs_npu2.json``, 37.4 ms; if, as its size
    #: suggests, it is Llama 3.2 1B's 128256 x 2048 bf16 head, 525 MB) moved about 14 GB/s,
    #: so where this term binds the model is a lower bound.  It binds only where
    #: npu2's shim channels would move more (its 8 columns x 4 channels x 4 B x 1.8 GHz =
    #: 230 GB/s in and out together).
    dram_bytes_per_second: float = 120e9


NPUS = {
    # Phoenix / Hawk Point, AIE2: mlir-aie device npu1 (one column of its array is not
    # available to applications, see mlir-aie's NPU1TargetModel)
    "npu1": NpuResources("npu1", "npu1", columns=device("npu1").columns, clock_hz=1.0e9),
    # Strix / Strix Halo / Krackan, AIE2P: mlir-aie device npu2
    "npu2": NpuResources("npu2", "npu2", columns=device("npu2").columns, clock_hz=1.8e9),
}


#: Host-side cost of one kernel dispatch through XRT (``kernel(...)`` then ``run.wait()``):
#: an empty mlir-aie design measured 45 us, a small one 60 us (Xilinx/mlir-aie issue #2381,
#: "Lower bound on kernel execution time"); upstream IRON's calibration on Strix Halo measured
#: 43.7-50.1 us per dispatch (``dispatch_us`` in amd/IRON's
#: ``iron/applications/llama_3_2_1b/decode_costs_npu2.json``, 2026-09-26, turbo power mode).
#: The same for every setting of an instance.
DISPATCH_SECONDS = 45e-6

#: Loading another device configuration onto the array, per change of design between
#: consecutive steps: upstream IRON measured 38.5, 38.6 and 39.3 us (``switch_us`` of its three
#: calibration pairs in the same file; loading the same design again, ``reset_us``, 33.5-38.7
#: us), on npu2.  The mean, 38.8 us, prices every load on either device: npu1 has no published
#: figure (nod-ai/iree-amd-aie #1187 measured 79-192 us per whole-array reconfiguration on
#: Strix through another runtime, so this is the low end).
SWITCH_SECONDS = 38.8e-6

#: What upstream IRON measured for a small design dispatched alone, configuration load and
#: host round trip included (``alone_us`` of its ElementwiseAdd/Mul, SiLU, RoPE, RMSNorm and
#: copy steps in the same file: 120-180 us).  iron's model of such a step (a dispatch, a load
#: and its modelled time, well under 100 us) is lower; the report states both.
SMALL_DESIGN_ALONE_SECONDS = (120e-6, 180e-6)

#: Issuing one runtime-sequence transfer: the NPU's controller writes the shim buffer
#: descriptor (about eight 32-bit registers) and pushes it on the channel's task queue.
#: Assumption (no published figure): 1 us, so that each transfer a design adds (more columns,
#: more channels) costs a little launch time.
TRANSFER_ISSUE_SECONDS = 1e-6

#: Cycles a DMA channel loses per FIFO buffer: loading the next buffer descriptor and the lock
#: handshake with the other end.  Assumption (not published): 32 cycles.
BD_CYCLES = 32

#: Cycles a core loses per kernel call: acquiring and releasing its FIFO buffers' locks, the
#: call and return, and the software-pipelined vector loop's prologue and epilogue.
#: Assumption (not published): 64 cycles.
CALL_CYCLES = 64

#: Cycles per row of a row reduction (RMSNorm, Softmax, each GEMV output): summing a vector's
#: lanes and a scalar inverse square root or reciprocal.  Assumption: 32 cycles.
ROW_CYCLES = 32


def resources(name: str) -> NpuResources:
    return NPUS[name]
