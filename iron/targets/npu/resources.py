"""The resources of the NPU devices, as the legality rules and the designs count them.

Every number names its public source.  "Target model" is mlir-aie's
``include/aie/Dialect/AIE/IR/AIETargetModel.h`` / ``lib/Dialect/AIE/IR/AIETargetModel.cpp``
(class ``AIE2TargetModel`` and its NPU subclasses ``NPU1TargetModel`` / ``NPU2TargetModel``);
"DMA verifier" is ``lib/Dialect/AIEX/IR/AIEXDialect.cpp`` (``NpuDmaMemcpyNdOp::verify``, the
runtime sequence's ``aiex.npu.dma_memcpy_nd``); AM020 is AMD's "Versal Adaptive SoC AIE-ML
Architecture Manual" (AIE2, the tile architecture of both NPU generations).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class NpuResources:
    """One NPU generation's array, counted per tile and per column."""

    name: str
    arch: str  # the mlir-aie device name used in aie.device(...)
    columns: int  # usable columns (target model: npu1 = 4 of the array's 5, npu2 = 8)
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
    mac_bf16: tuple[int, int, int] = (4, 8, 4)  # r x s x t of one bf16 MAC (aie_kernels/aie2)


NPUS = {
    # Phoenix / Hawk Point, AIE2: mlir-aie device npu1 (4 usable columns; the 5th column of
    # the array is not available to applications, see mlir-aie's NPU1TargetModel)
    "npu1": NpuResources("npu1", "npu1", columns=4, mac_bf16=(4, 8, 4)),
    # Strix / Strix Halo / Krackan, AIE2P: mlir-aie device npu2; bf16 through the bfp16
    # 8x8x8 MAC (mlir-aie aie_kernels/aie2p/mm.cc)
    "npu2": NpuResources("npu2", "npu2", columns=8, mac_bf16=(8, 8, 8)),
}


def resources(name: str) -> NpuResources:
    return NPUS[name]
