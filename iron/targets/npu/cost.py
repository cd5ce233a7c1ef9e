"""The cost model of an npu design: seconds per call, read off the design itself.

Every design of ``designs`` is priced the same way, from the data the emulator runs, so a new
design needs no model of its own (only its kernels' cycle counts in ``kernel_cycles``):

- ``compute``: each core's kernel calls (loop counts times the cycles of one call: the
  kernel's work over the device's vector lanes or MACs per cycle, plus ``CALL_CYCLES``), over
  the clock; the slowest core sets the term, as the cores run side by side;
- ``shim DMA`` / ``memtile``: each object FIFO occupies one DMA channel at each end; its time
  is its bytes over the channel's rate plus ``BD_CYCLES`` per buffer; a tile's term is its
  busiest channel (or its FIFOs' total over its channels, if more FIFOs than channels share
  a direction).  A FIFO's time is the same at both ends, so the compute tiles' own channels
  are never the limit of a legal design and are not counted separately.  Behind the shims,
  every byte in and out shares the host memory's bandwidth: the shim DMA term is at least
  their total over it;
- overlap: with double-buffered FIFOs (depth 2) data movement and compute overlap, so the
  steady state is the largest of those terms; a streamed FIFO of depth 1 serialises them
  (the sum is taken instead).  Each runtime phase then pays the pipeline's fill: the first
  element's way from the shim to a core (through the memory tile, if linked) and the last
  one's way back (``fill``, never named as the bottleneck);
- ``launch``: the dispatch (``DISPATCH_SECONDS``) plus ``TRANSFER_ISSUE_SECONDS`` per
  runtime transfer; it adds to the rest.

So more columns win while a design is limited by its shim channels or its cores, until the
transfers they add and the dispatch dominate; tiny tiles lose to the per-buffer and per-call
cycles; very large ones to the fill.  The device numbers and their sources (or the reasoning
of an assumption) are in ``resources``.

The kernels are priced as they are written (``iron/kernels/npu/*.cc``, shapes read by
``kernels``): the element-wise, row-wise and GEMV kernels issue one ``kernels.lanes()``-wide
(16) bf16 vector operation per step, priced one per cycle (the AIE-ML vector unit issues one
vector operation per cycle, AM020); the operations per element below are counted from their
source, with the exponential of the architecture the device's kernels are built for
(``EXP_OPS``: a lookup table on npu1's AIE2, the exp2 instruction on npu2's AIE2P); the GEMM
kernel issues one ``aie::mmul`` of ``kernels.mmul_shape(device)`` per step (npu1 4x8x4 = 128
bf16 MACs, the AIE-ML's bf16 peak per cycle, AM020; npu2 4x8x8 = 256, assumed to take a
cycle too), priced one per cycle.
"""

from __future__ import annotations

import math
from collections import defaultdict

from ..cost import COMPUTE, LAUNCH, MEMTILE, SHIM_DMA, Estimate
from . import kernels
from .ir import Acquire, Call, Design, Fifo, Loop, Tile
from .resources import (BD_CYCLES, CALL_CYCLES, DISPATCH_SECONDS, ROW_CYCLES,
                        TRANSFER_ISSUE_SECONDS, NpuResources, resources)

#: Vector operations of one exponential of a vector (``iron_exp`` in ``iron_aie.h``), per core
#: architecture: AIE2's lookup table a clamp (2), the rounding to bf16, the conversion to fixed
#: point, the lane filter, two lookups, their product and its rounding (9); AIE2P's a multiply
#: by log2(e) and the exp2 (2).
EXP_OPS = {"aie2": 9, "aie2p": 2}
#: Vector operations per vector of the element-wise kernels (``eltwise.cc``), besides their
#: exponentials (``EXPONENTIALS``, priced by ``EXP_OPS``): add and mul one; axpy a widening, a
#: multiply and an add (3); SiLU a widening, a negation, two adds, the inverse and a multiply
#: (6, the inverse counted as one operation: an assumption); SwiGLU SiLU, a widening and a
#: multiply (8).
ELEMENTWISE_OPS = {"add_bf16": 1, "mul_bf16": 1, "axpy_bf16": 3, "silu_bf16": 6,
                   "swiglu_bf16": 8}
#: Per vector of a row (``norm.cc``, ``softmax.cc``): RMSNorm a MAC, then a widening and a
#: multiply (and a weight's widening and multiply); Softmax a max, then a widening, a
#: subtract, the exponential and an add, then a widening and a multiply (6 and one
#: exponential).
ROW_OPS = {"rmsnorm_bf16": 3, "rmsnorm_weighted_bf16": 5, "softmax_bf16": 6}
#: Exponentials per vector of the kernels that take them.
EXPONENTIALS = {"silu_bf16": 1, "swiglu_bf16": 1, "softmax_bf16": 1}


#: The quantized matrix kernels (``qmatrix.cc``), vector operations counted from the source.
#: Per block of 16 values of one vector and one 16-row tile: the tile's code vectors are
#: ``kernels.qmatrix_lanes()`` (32) int16 lanes, 16 rows x a pair of values, so the block takes
#: 16 * 16 / 32 = 8 MACs, each after extracting its codes (a shift, a mask, the broadcast of
#: x's pair: 3; q8_0 joins the low and high planes' nibbles of four codes at once, 8
#: operations, then takes each code out of its byte, 1 or 2, so 14 per 4 MACs plus the
#: broadcast: 4.5); plus
#: the code loads (2 planes, q8_0 4), x's codes (a load, an unpack) and the block's sum (the
#: accumulator to a vector, two lane filters, an add, the conversion to float and the scaled
#: MAC: 6).
QMATRIX_EXTRACT_OPS = {"qmatrix_q4_0": 3, "qmatrix_q4_1": 3, "qmatrix_q8_0": 4.5,
                       "qmatrix_uint4": 3}
QMATRIX_LOADS = {"qmatrix_q4_0": 2, "qmatrix_q4_1": 2, "qmatrix_q8_0": 4, "qmatrix_uint4": 2}
QMATRIX_BLOCK_OPS = 2 + 6
#: Per group of one vector: the scales widened (a load, two conversions, fp16: two masks, two
#: shifts, a multiply and an or; bf16: a shift), the offsets likewise (the minimums) or a
#: multiply, the two MACs into the rows' sums, the group sum's load and the sum's conversion.
QMATRIX_GROUP_OPS = {"qmatrix_q4_0": 9 + 1 + 4, "qmatrix_q4_1": 9 + 9 + 4,
                     "qmatrix_q8_0": 9 + 1 + 4, "qmatrix_uint4": 4 + 4 + 4}
#: The MMUL path of the quantized kernels (``vectors_times``, 4 or more vectors at a time,
#: ``kernels.qmatrix_mmul``), per block of 16 values and one 16-row tile: each plane's codes
#: extracted once for all the vectors (a load and 8 operations, q8_0 two loads and 14), the
#: MMUL's B operands built from them (16 pieces of two value rows: two lane filters, two
#: extracts, a concat, the offset's subtract and the narrowing, 7 each), the A operand (a load
#: per vector and the concats: 1 + vectors, AIE2P's half blocks also two filters per pair of
#: vectors), the MMULs (two per 16 / K; on AIE2 each 4-bit B operand narrowed to int4 first),
#: and per vector the x code sum (a load, a widening, a
#: reduction), the two halves' extracts, conversions and concat, the offset's add and
#: broadcast, the scales' load, the conversion to float and the scaled MAC (13).
QMMUL_PLANE_OPS = {"qmatrix_q4_0": 9, "qmatrix_q4_1": 9, "qmatrix_q8_0": 16, "qmatrix_uint4": 9}
QMMUL_PIECES, QMMUL_PIECE_OPS, QMMUL_VECTOR_OPS = 16, 7, 13


def qmatrix_mmul_cycles(f: str, k: int, n: int, group: int, device: str) -> float:
    """Cycles of one MMUL group of ``n`` vectors times a tile of ``k`` values."""
    m, kk, _ = kernels.qmatrix_mmul(device)
    block = kernels.qmatrix_block()
    a_ops = (1 + n) * block // kk + (m if kk < block else 0)
    narrow = 1 if kernels.arch(device) == "aie2" and f != "qmatrix_q8_0" else 0
    per_block = (2 * QMMUL_PLANE_OPS[f] + QMMUL_PIECES * QMMUL_PIECE_OPS + a_ops
                 + 2 * block // kk * (1 + narrow) + n * QMMUL_VECTOR_OPS)
    return k // block * per_block + n * (k // group * QMATRIX_GROUP_OPS[f] + 2)


#: Rounding x, per block of 16 values: a load, the absolute value, the lane maximum, the two
#: scalar divisions (counted as one operation each: an assumption), the multiply, the add and
#: subtract that round, the conversion, the narrowing and the store; then the block's sum (a
#: load, a widening, a lane sum, a multiply-add): 15.
QUANTIZE_BLOCK_OPS = 15


#: Per query and key of an attention tile (``attention.cc``), in vector operations over the
#: head: the score's MACs and the weighted value's widening and MACs (3 per head_dim / lanes),
#: plus per key the subtract, add, widening, max and the score's reduction and store (6 per
#: lanes keys, with the reduction counted as one operation: an assumption) and the
#: exponential (``EXP_OPS``).
ATTENTION_KEY_OPS = 6


def kernel_cycles(call: Call, res: NpuResources) -> float:
    """Cycles of one call of a core kernel, from its integer arguments (the tile sizes)."""
    n = [a for a in call.args if type(a) is int]
    f, lanes = call.function, kernels.lanes()
    exp = EXP_OPS[kernels.arch(res.name)]
    if f in ELEMENTWISE_OPS:
        return n[0] * (ELEMENTWISE_OPS[f] + EXPONENTIALS.get(f, 0) * exp) / lanes
    if f in ROW_OPS:
        rows, size = n[0], n[1]
        ops = ROW_OPS[f] + EXPONENTIALS.get(f, 0) * exp
        return rows * size * ops / lanes + rows * ROW_CYCLES
    if f in ("gemv_bf16", "gemv_bf16_f32"):  # rows of W, K, batches, (output tile): a vector
        # MAC per step
        rows, k, batches = n[0], n[1], n[2]
        return rows * k * batches / lanes + rows * batches * ROW_CYCLES
    if f == "gemm_bf16":  # tile_m x tile_k x tile_n: one MMUL per cycle
        return n[0] * n[1] * n[2] / math.prod(kernels.mmul_shape(res.name))
    if f in QMATRIX_EXTRACT_OPS:  # k of the tile, vectors, group, K of x: MMUL groups of
        k, vectors, group = n[0], n[1], n[2]  # up to its M vectors, the rest one at a time
        block = kernels.qmatrix_block()
        macs = block * 16 // kernels.qmatrix_lanes()
        per_block = macs * (1 + QMATRIX_EXTRACT_OPS[f]) + QMATRIX_LOADS[f] + QMATRIX_BLOCK_OPS
        cycles, m = 0.0, kernels.qmatrix_mmul(res.name)[0]
        while vectors >= kernels.qmatrix_mmul_min_vectors():
            cycles += qmatrix_mmul_cycles(f, k, min(m, vectors), group, res.name)
            vectors -= min(m, vectors)
        return cycles + vectors * (k // block * per_block + k // group * QMATRIX_GROUP_OPS[f]
                                   + 2)
    if f == "qmatrix_quantize":  # K, vectors, group
        return n[1] * n[0] / kernels.qmatrix_block() * QUANTIZE_BLOCK_OPS
    if f == "qmatrix_store":  # vectors: a load, a rounding and a store each
        return n[0] * 3
    if f == "qmatrix_store_f32":  # vectors: a load and a store each
        return n[0] * 2
    if f == "attn_tile":  # kv_heads, rb, follow, group, hd, tile, ctx, rows: every query x
        _, rb, _, group, hd, tile, _, _ = n[-8:]  # key (a slotted row in every slot's pass)
        queries = rb * group
        return queries * (3 * tile * hd / lanes + (ATTENTION_KEY_OPS + exp) * tile / lanes
                          + 2 * hd / lanes) + queries * ROW_CYCLES
    if f in ("attn_init", "attn_finish"):  # queries x hd: a store (a multiply and a store)
        return n[0] * n[1] / lanes * (1 if f == "attn_init" else 2) + n[0] * ROW_CYCLES
    if f in ("attn_positions", "rope_positions", "rope_frequencies"):  # (offset,) words: a
        return n[-1] * 2  # scalar load and store each
    if f == "qkv_head_row":  # h, iv, heads, kv_heads, hd: one KV head's group of q and its k
        heads, kvh, hd = n[-3:]  # rotated (per rotated pair of vectors two multiplies and two
        # MACs, and the angles' sine and cosine, ~40 scalar cycles), its v copied
        return (heads // kvh + 1) * hd / lanes * 2 + hd / 2 * 40 + hd / lanes
    if f == "qkv_head_row_qwen":  # bias, qk_norm, heads, kv_heads, hd: as qkv_head_row, the
        bias, norm, heads, kvh, hd = n[-5:]  # angles twice (q, then k), and each of the group's
        prepared = heads // kvh + 2  # q heads, k and v first a load, an add, a store and a MAC
        return ((heads // kvh + 1) * hd / lanes * 2 + hd * 40 + hd / lanes  # per vector, normed
                + prepared * hd / lanes * (3 + bias + 3 * norm) + 2 * norm * ROW_CYCLES)  # 3 more
    if f == "cache_rows_head":  # h, iv, hd: a head's row copied
        return n[-1] / lanes * 2
    if f == "cache_patch":  # (slot,) tile, hd, rows, follow: the tile copied, the rows
        tile, hd, rows = n[-4:-1]  # landing in it too
        return tile * hd / lanes * 2 + rows * ROW_CYCLES
    if f == "zero_f32":  # a 16-float store per step
        return n[0] / 16
    if f in ("store_bf16", "store_f32"):  # per MMUL block a load and a conversion (f32: a
        # move); per output row vector
        r, _, t = kernels.mmul_shape(res.name)  # its lanes inserted one by one and a store
        w = kernels.gemm_row_lanes()
        return n[0] * n[1] / (r * w) * (2 * w / t + r * (w + 1))
    raise ValueError(f"the npu cost model has no cycle count for the core kernel {f!r} "
                     f"(called with {call.args}); add it to iron/targets/npu/cost.py")


def core_cycles(body, res: NpuResources, times: int = 1) -> float:
    """Cycles of a core's program: every call, times its enclosing loop counts."""
    cycles = 0.0
    for op in body:
        if isinstance(op, Loop):
            cycles += core_cycles(op.body, res, times * op.count)
        elif isinstance(op, Call):
            cycles += times * (kernel_cycles(op, res) + CALL_CYCLES)
    return cycles


def acquires(body, times: int = 1, counts: dict | None = None) -> dict[tuple[str, str], int]:
    """How many elements a core program takes of each (FIFO, port)."""
    counts = defaultdict(int) if counts is None else counts
    for op in body:
        if isinstance(op, Loop):
            acquires(op.body, times * op.count, counts)
        elif isinstance(op, Acquire):
            counts[(op.fifo, op.port)] += times
    return counts


def elements(design: Design) -> dict[str, int]:
    """Buffers each FIFO moves per call: from the runtime transfers where a shim tile is an
    end, else from the acquires of the compute tiles at its ends."""
    moved: dict[str, int] = defaultdict(int)
    for phase in design.sequence:
        for t in phase:
            moved[t.fifo] += t.pattern.numel
    count = {f.name: moved[f.name] // f.numel for f in design.fifos if f.name in moved}
    for core in design.cores:
        for (fifo, _), n in acquires(core.body).items():
            if fifo not in moved:
                count[fifo] = max(count.get(fifo, 0), n)
    return count


def channel_seconds(fifo: Fifo, n: int, res: NpuResources) -> float:
    """A FIFO's ``n`` buffers through one DMA channel."""
    return (n * fifo.nbytes / res.dma_bytes_per_cycle + n * BD_CYCLES) / res.clock_hz


def busiest(loads: dict[tuple[Tile, str], list[float]], channels: int) -> float:
    """The slowest direction of any tile: its busiest channel, or its FIFOs' total spread
    over its channels when more FIFOs than channels share it."""
    return max((max(max(t), sum(t) / channels) for t in loads.values()), default=0.0)


def fill_seconds(design: Design, res: NpuResources) -> float:
    """One element's way in to the cores and the last one's way out, through linked FIFOs."""
    upstream = {d: link.srcs for link in design.links for d in link.dsts}
    downstream = {s: link.dsts for link in design.links for s in link.srcs}
    hop = {f.name: channel_seconds(f, 1, res) for f in design.fifos}

    def way_in(name: str) -> float:
        return hop[name] + max((way_in(s) for s in upstream.get(name, ())), default=0.0)

    def way_out(name: str) -> float:
        return hop[name] + max((way_out(d) for d in downstream.get(name, ())), default=0.0)

    into = [f.name for f in design.fifos if any(c.kind == "core" for c in f.consumers)]
    out = [f.name for f in design.fifos if f.producer.kind == "core"]
    return (max(map(way_in, into), default=0.0) + max(map(way_out, out), default=0.0))


def design_estimate(design: Design) -> Estimate:
    """The modelled time of one call of ``design`` on its own device, its bottleneck named."""
    return design_cost(design, resources(design.device))


def design_cost(design: Design, res: NpuResources) -> Estimate:
    """The modelled seconds of one call of ``design`` on ``res``; see the module docstring."""
    count = elements(design)
    shim: dict[tuple[Tile, str], list[float]] = defaultdict(list)
    mem: dict[tuple[Tile, str], list[float]] = defaultdict(list)
    serial, dram = False, 0
    for f in design.fifos:
        n = count.get(f.name, 0)
        seconds = channel_seconds(f, n, res)
        serial |= f.depth < 2 and n > 1
        dram += n * f.nbytes if "shim" in (f.producer.kind, *(c.kind for c in f.consumers)) else 0
        for tile, direction in ((f.producer, "out"), *((c, "in") for c in f.consumers)):
            table = shim if tile.kind == "shim" else mem if tile.kind == "memtile" else None
            if table is not None:  # a broadcast is one channel out of its producer
                table[(tile, direction)].append(seconds)
    compute = max((core_cycles(c.body, res) for c in design.cores), default=0.0) / res.clock_hz
    terms = {COMPUTE: compute, SHIM_DMA: max(busiest(shim, res.shim_channels),
                                             dram / res.dram_bytes_per_second)}
    if mem:
        terms[MEMTILE] = busiest(mem, res.memtile_channels)
    steady = sum(terms.values()) if serial else max(terms.values())
    transfers = sum(len(phase) for phase in design.sequence)
    launch = DISPATCH_SECONDS + transfers * TRANSFER_ISSUE_SECONDS
    fill = len(design.sequence) * fill_seconds(design, res)
    named = {**terms, LAUNCH: launch}
    bottleneck = max(named, key=lambda k: named[k])
    return Estimate(launch + fill + steady, bottleneck, {**named, "fill": fill})
