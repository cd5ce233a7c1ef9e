"""What mlir-aie's passes require of a module before they run, checked on the parsed module.

``ods`` transcribes mlir-aie's op definitions (the TableGen level); this module transcribes
the C++ that runs after parsing: the ops' ``verify()`` methods (``hasVerifier = 1``), the
device's target model, and the preconditions of the passes aiecc runs (the object FIFO
lowering, buffer-descriptor assignment, the runtime sequence's DMA-to-NPU lowering).  A
module that breaks one of them is refused here, with the op, the value and the rule in one
line, instead of by aie-opt on a machine that has it.

The upstream files were read from stored copies of mlir-aie whose dates are not all the pin's
(``ods.UPSTREAM``, main of 2026-03-13); each rule says which copy it follows and where that
copy differs from the pin.  Paths are mlir-aie's: ``AIETargetModel.h`` is
``include/aie/Dialect/AIE/IR/AIETargetModel.h``, ``AIEDialect.cpp`` is
``lib/Dialect/AIE/IR/AIEDialect.cpp``, the object FIFO lowering is
``lib/Dialect/AIE/Transforms/AIEObjectFifoStatefulTransform.cpp``, the descriptor assignment
``lib/Dialect/AIE/Transforms/AIEAssignBufferDescriptorIDs.cpp`` and the DMA-to-NPU lowering
``lib/Dialect/AIEX/Transforms/AIEDmaToNpu.cpp``.

A rule is a function from a ``Device`` (one parsed ``aie.device`` op, its tiles, FIFOs,
links, cores and runtime sequence indexed once) to the ``Violation`` s it finds.  ``RULES``
is the one table ``verify`` runs on every device of every module: adding a rule is writing
its function and adding one line there.
"""

from __future__ import annotations

import functools
import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Callable, Iterator

from xdsl.dialects.builtin import MemRefType
from xdsl.ir import Operation, SSAValue

from ...devices import device as get_device
from . import ods
from .check import shares_memory
from .coresidence import one_core_per_tile
from .ir import DTYPE_BYTES, Fifo, Tile
from .rotation import fifo_rotation
from .traced import untraceable
from .trip_rules import constant_trip_counts, sequence_arguments
from .violation import Violation

# ---- the target model (AIETargetModel.h) ---------------------------------------------------


@dataclass(frozen=True)
class TargetModel:
    """The figures of mlir-aie's target model a rule needs, for one ``AIEDevice`` case.

    ``AIETargetModel.h`` (stored copy with the register database, newer than the pin; the
    figures below are the same in the older copies read): ``BaseNPU1TargetModel`` /
    ``BaseNPU2TargetModel`` have ``rows() == 6``, ``isShimNOCTile`` row 0, ``isMemTile``
    row 1, ``isCoreTile`` row > 1; ``AIEDialect.cpp`` ``getTargetModel(AIEDevice)`` maps
    ``npu1`` to ``VirtualizedNPU1TargetModel(4)`` (4 columns), ``npu1_Ncol`` to N columns,
    ``npu2`` to ``NPU2TargetModel`` (8 columns) and ``npu2_Ncol`` to N; the tile kinds are
    ``ir.Tile.kind``'s.  ``AIE2TargetModel``
    (both NPUs derive from it): ``getLocalMemorySize`` 0x10000, ``getMemTileSize`` 0x80000,
    ``getNumBDs`` 48 on a memory tile and 16 elsewhere, ``isBdChannelAccessible``: a memory
    tile's even channels reach descriptors 0-23 and its odd ones 24-47; DMA stream ports
    (``getNumSourceSwitchboxConnections``, ``getNumDestShimMuxConnections`` for
    ``WireBundle::DMA``) 2 per direction on a core or shim tile, 6 on a memory tile."""

    device: str
    columns: int
    rows: int = 6
    local_memory: int = 0x10000
    memtile_memory: int = 0x80000
    core_bds: int = 16
    memtile_bds: int = 48
    memtile_bds_per_channel: int = 24
    channels: int = 2
    memtile_channels: int = 6


def target_model(device: str) -> TargetModel:
    if device in ("npu1", "npu2"):  # their columns as iron.devices states them
        return TargetModel(device, get_device(device).columns)
    base, _, cols = device.partition("_")
    if base in ("npu1", "npu2") and cols.endswith("col"):
        return TargetModel(device, int(cols[:-3]))
    raise ValueError(f"aie.device {device}: no NPU target model (iron emits npu1 and npu2)")


#: ``aie.core`` ``stack_size`` when not given (AIEOps.td: ``DefaultValuedAttr<AIEI32Attr,
#: "0x400">``); the stack is carved out of the core tile's data memory.
DEFAULT_STACK = 0x400


# ---- one device, indexed -------------------------------------------------------------------


def _element(t: MemRefType) -> tuple[tuple[int, ...], str]:
    """A memref's shape and element type, as ``ir.Fifo`` holds them."""
    dtype = str(t.element_type)
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"memref element type {dtype}: not one iron emits "
                         f"({', '.join(DTYPE_BYTES)})")
    return tuple(t.get_shape()), dtype


class Device:
    """One ``aie.device`` op's parts, indexed once for every rule."""

    def __init__(self, op: ods.DeviceOp):
        self.op = op
        names = {v: k for k, v in ods.AIE_DEVICE.items()}
        self.name = names[op.device.value.data]
        self.model = target_model(self.name)
        ops = list(op.body_region.block.ops)
        self.tiles = [o for o in ops if isinstance(o, ods.TileOp)]
        self._tile = {t.result: Tile(t.col.value.data, t.row.value.data) for t in self.tiles}
        self.fifo_ops = {o.sym_name.data: o for o in ops if isinstance(o, ods.ObjectFifoCreateOp)}
        self.fifos = {name: Fifo(name, self.tile(o.producerTile),
                                 tuple(self.tile(c) for c in o.consumerTiles),
                                 o.elemNumber.value.data, *_element(o.elemType.memref))
                      for name, o in self.fifo_ops.items()}
        self.links = [o for o in ops if isinstance(o, ods.ObjectFifoLinkOp)]
        self.cores = [o for o in ops if isinstance(o, ods.CoreOp)]
        self.buffers = [o for o in ops if isinstance(o, ods.BufferOp)]
        self.sequence = [inner for o in ops if isinstance(o, ods.RuntimeSequenceOp)
                         for inner in o.body.walk() if inner is not o]

    def tile(self, value: SSAValue) -> Tile:
        return self._tile[value]

    @functools.cached_property
    def most_acquired(self) -> dict[tuple[Tile, str], int]:
        """Per (core tile, FIFO): the largest ``size`` of its acquires on that tile."""
        found: dict = {}
        for core in self.cores:
            tile = self.tile(core.tile)
            for o in core.body.walk():
                if isinstance(o, ods.ObjectFifoAcquireOp):
                    key = (tile, o.objFifo_name.root_reference.data)
                    found[key] = max(found.get(key, 0), o.size.value.data)
        return found

    def buffers_at(self, fifo: Fifo, tile: Tile) -> int:
        """Buffers the object FIFO lowering allocates for ``fifo`` on ``tile``
        (``findObjectFifoSize``): a memory tile its declared depth; a shim tile none (the
        runtime sequence's host buffers); a core tile one more than the most it acquires at
        once, except one buffer when that is one and the depth is 1.  That exception is the
        pin's: PR #2986 (opened 2026-03-18, after the pin) removes it, so a scalar depth of
        1 then gives two buffers and only a ``[1, 1]`` depth array gives one.  A core tile
        with no acquire of the FIFO keeps the declared depth, and so does a FIFO between
        neighbouring cores (``shared``), which is not split into two ends."""
        kind = tile.kind
        if kind == "shim":
            return 0
        if kind == "memtile" or self.shared(fifo):
            return fifo.depth
        most = self.most_acquired.get((tile, fifo.name), 0)
        if most == 0:
            return fifo.depth
        return 1 if (most == 1 and fifo.depth == 1) else most + 1

    @functools.cached_property
    def link_of(self) -> dict[str, ods.ObjectFifoLinkOp]:
        return {s.root_reference.data: link for link in self.links
                for s in (*link.fifoIns.data, *link.fifoOuts.data)}

    def holds_buffers(self, fifo: Fifo, tile: Tile) -> bool:
        """Whether ``tile`` holds buffers of its own for this end of ``fifo``: every
        non-shim end does, except on a link's memory tile, where only the link's single
        side (the input of a distribute or forward, the output of a join) gets buffers and
        the others' DMAs address them (the lowering's ``objFifoLinks`` target).  Which side
        of a forward holds them is not modelled beyond this: in iron's forwards both sides
        have the same depth and element, so the count is the same either way."""
        if tile.kind == "shim":
            return False
        if self.shared(fifo):
            return tile == fifo.producer
        link = self.link_of.get(fifo.name)
        if link is None or tile.kind != "memtile":
            return True
        single = link.fifoOuts.data[0] if len(link.fifoIns.data) > 1 else link.fifoIns.data[0]
        return single.root_reference.data == fifo.name

    def shared(self, fifo: Fifo) -> bool:
        """A FIFO between neighbouring cores of a column (``check.shares_memory``): no DMA,
        one set of buffers, on the producer's tile (``isSharedMemory`` gives direction -1
        when the consumer reaches the producer's memory, and ``createObjectFifoElements``
        then creates the buffers there)."""
        return shares_memory(fifo, fifo.name in self.link_of)

    def ends(self) -> Iterator[tuple[Fifo, Tile]]:
        for f in self.fifos.values():
            for t in (f.producer, *f.consumers):
                yield f, t


def devices(module: Operation) -> Iterator[Device]:
    for op in module.walk():
        if isinstance(op, ods.DeviceOp):
            yield Device(op)


# ---- the rules -------------------------------------------------------------------------------


def tiles_in_array(d: Device) -> Iterator[Violation]:
    """``AIEDialect.cpp`` ``TileOp::verify``: the column below the target model's
    ``columns()``, the row below its ``rows()`` (and neither negative: ``isValidTile``)."""
    m = d.model
    for t in d.tiles:
        col, row = d.tile(t.result).col, d.tile(t.result).row
        if not 0 <= col < m.columns:
            yield Violation(t, f"tile ({col}, {row}): column index {col} must be in 0.."
                            f"{m.columns - 1} (the {m.columns} columns of {m.device})")
        elif not 0 <= row < m.rows:
            yield Violation(t, f"tile ({col}, {row}): row index {row} must be in 0.."
                            f"{m.rows - 1} (the {m.rows} rows of {m.device})")


def tile_kinds(d: Device) -> Iterator[Violation]:
    """``AIEDialect.cpp`` ``CoreOp::verify`` ("CoreOp cannot be created on shim tile" /
    "on mem tile": a core only on a core tile, ``isCoreTile`` row > 1) and
    ``ObjectFifoAcquireOp::verify`` / ``ObjectFifoReleaseOp::verify`` (the producer port only
    from the FIFO's producer tile's core, the consumer port only from a consumer's)."""
    for core in d.cores:
        tile = d.tile(core.tile)
        if tile.kind != "core":
            yield Violation(core, f"aie.core on {tile}: a core runs only "
                            "on a core tile (row > 1)")
            continue
        for o in core.body.walk():
            if isinstance(o, (ods.ObjectFifoAcquireOp, ods.ObjectFifoReleaseOp)):
                fifo = d.fifos.get(o.objFifo_name.root_reference.data)
                if fifo is None:
                    yield Violation(o, f"{o.objFifo_name} names no aie.objectfifo")
                    continue
                produce = o.port.value.data == ods.OBJECTFIFO_PORT["Produce"]
                ends = (fifo.producer,) if produce else fifo.consumers
                if tile not in ends:
                    port = "producer" if produce else "consumer"
                    yield Violation(o, f"{port} port of @{fifo.name} accessed by the core of "
                                    f"{tile}, not of its {port} "
                                    f"({', '.join(map(str, ends))})")


def link_legality(d: Device) -> Iterator[Violation]:
    """``AIEDialect.cpp`` ``ObjectFifoLinkOp::verify`` and ``getOptionalSharedTile``: not a
    join and a distribute at once; a link point (a join's inputs all consumed where its
    output is produced, a distribute's outputs all produced where its input is consumed, a
    forward's output produced at one of its input's consumers); one offset per FIFO of the
    many side and none on the other.  The object FIFO lowering's ``verifyObjectFifoLinks``:
    a FIFO in at most one link.  Its DMAs move, for FIFO i of the many side,
    ``getJoinTransferLengths`` / ``getDistributeTransferLengths`` elements: offset[i + 1] -
    offset[i], the last the single side's element size minus its offset; each must be FIFO
    i's element size, or the pieces overlap, leave a gap, or overrun it."""
    seen: set[str] = set()
    for link in d.links:
        ins = [s.root_reference.data for s in link.fifoIns.data]
        outs = [s.root_reference.data for s in link.fifoOuts.data]
        missing = [n for n in ins + outs if n not in d.fifos]
        if missing:
            yield Violation(link, f"link names @{missing[0]}, which is no aie.objectfifo")
            continue
        src = [a.value.data for a in link.src_offsets.data]
        dst = [a.value.data for a in link.dst_offsets.data]
        fi, fo = [d.fifos[n] for n in ins], [d.fifos[n] for n in outs]
        join, distribute = len(ins) > 1, len(outs) > 1
        if join and distribute:
            yield Violation(link, "a link cannot join and distribute at the same time")
            continue
        if join:
            point = all(f.consumers[0] == fo[0].producer for f in fi)
        elif distribute:
            point = all(fi[0].consumers[0] == f.producer for f in fo)
        else:
            point = fo[0].producer in fi[0].consumers
        if not point:
            yield Violation(link, f"link {ins} -> {outs} has no link point: no tile both "
                            "consumes its inputs and produces its outputs")
            continue
        again = [n for n in ins + outs if n in seen]
        seen.update(ins + outs)
        if again:
            yield Violation(link, f"@{again[0]} is in more than one aie.objectfifo.link")
            continue
        many, offsets, other, single = (fi, src, dst, fo[0]) if join else (fo, dst, src, fi[0])
        if join or distribute:
            side = "src" if join else "dst"
            if len(offsets) != len(many) or other:
                yield Violation(link, f"{side}_offsets {offsets} must give one offset per "
                                f"FIFO of {ins if join else outs} and the other side none")
                continue
            ends = offsets[1:] + [single.numel]
            for f, start, end in zip(many, offsets, ends):
                if end - start != f.numel:
                    yield Violation(link, f"{side}_offsets {offsets}: @{f.name} gets "
                                    f"{end - start} elements from offset {start} of "
                                    f"@{single.name}'s {single.numel}, its element has "
                                    f"{f.numel}")
                    break
        elif src and dst:
            yield Violation(link, "all offsets should be empty if there is no join or "
                            "distribute")


def descriptors(d: Device) -> Iterator[Violation]:
    """``AIEAssignBufferDescriptorIDs.cpp``: every DMA buffer descriptor gets an id from its
    tile's ``getNumBDs``, on a memory tile only among those its channel reaches
    (``isBdChannelAccessible``), else "Allocator exhausted available BD IDs".  The object FIFO
    lowering's ``createDMA`` chains one descriptor per buffer of the FIFO end on that end's
    channel; on a link's memory tile each FIFO of the link runs its own channel over the
    link's shared buffers.  This is what bounds a FIFO's depth (mlir-aie issue #2304:
    "large objectfifo depths are currently directly limited by number of available DMA
    BDs"): on a core tile the lowering allocates by acquires, not depth, but a memory tile
    allocates the declared depth.  Counted here: each channel's chain (at most 24 on a
    memory tile) and each tile's total (16 on a core tile, 48 on a memory tile); which
    channel gets which parity is the lowering's choice and is not modelled."""
    per_tile: dict[Tile, int] = defaultdict(int)
    chains: dict[Tile, list[str]] = defaultdict(list)
    m = d.model
    for f, tile in d.ends():
        kind = tile.kind
        if kind == "shim" or d.shared(f):  # a shared-memory FIFO has no DMA
            continue
        owner = f
        link = d.link_of.get(f.name)
        if kind == "memtile" and link is not None and not d.holds_buffers(f, tile):
            single = (link.fifoOuts.data[0] if len(link.fifoIns.data) > 1
                      else link.fifoIns.data[0])
            owner = d.fifos[single.root_reference.data]
        n = d.buffers_at(owner, tile)
        per_tile[tile] += n
        chains[tile].append(f"@{f.name} {n}")
        if kind == "memtile" and n > m.memtile_bds_per_channel:
            yield Violation(d.fifo_ops[f.name], f"@{f.name} on {tile}: {n} buffers need {n} "
                            f"buffer descriptors on one DMA channel, which reaches "
                            f"{m.memtile_bds_per_channel} (depth {f.depth})")
            return
    for tile, total in per_tile.items():
        limit = m.memtile_bds if tile.kind == "memtile" else m.core_bds
        if total > limit:
            fifo = next(f for f, t in d.ends() if t == tile)
            yield Violation(d.fifo_ops[fifo.name], f"{tile}: {total} buffer descriptors "
                            f"({', '.join(chains[tile])}) > the {limit} of its DMA")
            return


def dma_channels(d: Device) -> Iterator[Violation]:
    """The object FIFO lowering's ``DMAChannelAnalysis::getDMAChannelIndex`` hands each FIFO
    end a DMA channel of its tile, one MM2S per FIFO produced there (a broadcast's consumers
    share it) and one S2MM per FIFO consumed there, and fails with "number of output / input
    DMA channel exceeded!" past the tile's stream-switch DMA ports (``AIE2TargetModel``
    ``getNumSourceSwitchboxConnections`` / ``getNumDestShimMuxConnections`` for
    ``WireBundle::DMA``: 2 on a core or shim tile, 6 on a memory tile, per direction)."""
    used: dict[tuple[Tile, str], list[str]] = defaultdict(list)
    for f in d.fifos.values():
        if d.shared(f):  # neighbours' shared memory: no DMA
            continue
        used[(f.producer, "MM2S")].append(f.name)
        for t in f.consumers:
            used[(t, "S2MM")].append(f.name)
    for (tile, direction), names in used.items():
        limit = d.model.memtile_channels if tile.kind == "memtile" else d.model.channels
        if len(names) > limit:
            yield Violation(d.fifo_ops[names[limit]], f"{tile}: {len(names)} {direction} DMA "
                            f"channels ({', '.join('@' + n for n in names)}) > the {limit} "
                            "it has")
            return


def memory(d: Device) -> Iterator[Violation]:
    """Object FIFO buffers per tile, counted as the lowering allocates them (``buffers_at``,
    ``holds_buffers``), with the tile's ``aie.buffer`` s and, on a core tile, the core's stack
    (``stack_size``, default 0x400): within ``getLocalMemorySize`` on a core tile and
    ``getMemTileSize`` on a memory tile (``AIEAssignBuffers.cpp`` fails when they do not
    fit)."""
    used: dict[Tile, list[tuple[str, int]]] = defaultdict(list)
    for f, tile in d.ends():
        if d.holds_buffers(f, tile):
            n = d.buffers_at(f, tile)
            used[tile].append((f"@{f.name} {n} x {f.nbytes} B", n * f.nbytes))
    for b in d.buffers:
        shape, dtype = _element(b.buffer.type)
        nbytes = math.prod(shape) * DTYPE_BYTES[dtype]
        name = b.sym_name.data if b.sym_name else "aie.buffer"
        used[d.tile(b.tile)].append((f"{name} {nbytes} B", nbytes))
    for core in d.cores:
        stack = core.stack_size.value.data if core.stack_size else DEFAULT_STACK
        used[d.tile(core.tile)].append((f"stack {stack} B", stack))
    for tile, parts in used.items():
        limit = d.model.memtile_memory if tile.kind == "memtile" else d.model.local_memory
        total = sum(n for _, n in parts)
        if total > limit:
            op = next((d.fifo_ops[f.name] for f, t in d.ends() if t == tile), d.op)
            yield Violation(op, f"{tile}: {' + '.join(p for p, _ in parts)}"
                            f" = {total} B > the {limit} B of its memory")


def tokens_waited(d: Device) -> Iterator[Violation]:
    """``AIEDmaToNpu.cpp``: ``aiex.npu.dma_memcpy_nd`` becomes a descriptor write and a push
    on its channel's task queue carrying ``issue_token``; ``aiex.npu.dma_wait`` becomes an
    ``npu.sync`` on the channel of its symbol's ``shim_dma_allocation``, which waits for the
    task-complete token only a push with ``issue_token`` sends.  So: a wait needs a token
    issued on its symbol and not yet waited for (else the sync waits forever); every issued
    token is waited for before the sequence ends (else it is left for the next dispatch's
    sync); and every transfer out of the array (its FIFO consumed by a shim tile) issues one,
    since the host reads its output once the sequence's last sync returns."""
    pending: dict[str, list[Operation]] = defaultdict(list)
    for o in d.sequence:
        if isinstance(o, ods.NpuDmaMemcpyNdOp):
            name = o.metadata.root_reference.data
            token = bool(o.issue_token and o.issue_token.value.data)
            fifo = d.fifos.get(name)
            if fifo and not token and any(t.kind == "shim" for t in fifo.consumers):
                yield Violation(o, f"transfer out of the array via @{name} has issue_token = "
                                "false: nothing can wait for it before the host reads it")
            if token:
                pending[name].append(o)
        elif isinstance(o, ods.NpuDmaWaitOp):
            name = o.symbol.root_reference.data
            if not pending[name]:
                yield Violation(o, f"dma_wait on @{name}: no transfer on it issued a token "
                                "since the last wait, so its sync never returns")
            else:
                pending[name].pop(0)
    for name, ops in pending.items():
        if ops:
            yield Violation(ops[0], f"transfer via @{name} issues a token that no later "
                            f"aiex.npu.dma_wait on @{name} waits for")


def traced_to_arguments(d: Device) -> Iterator[Violation]:
    """``AIEDmaToNpu.cpp`` finds each ``aiex.npu.dma_memcpy_nd``'s host buffer with
    ``traceSubviewToBlockArgument`` (``lib/Dialect/AIEX/Utils/AIEUtils.cpp``), and an
    ``aiex.run`` inlines its callee's transfers on its operands: each must reach a runtime
    sequence argument only through ``memref.subview`` / ``memref.cast`` /
    ``memref.reinterpret_cast`` with static offsets, sizes and strides (``traced``)."""
    for o in d.sequence:
        for message in untraceable(o):
            yield Violation(o, message)


#: Every precondition ``verify`` checks, in the order a lowering would meet them.
RULES: tuple[Callable[[Device], Iterator[Violation]], ...] = (
    tiles_in_array,
    one_core_per_tile,
    tile_kinds,
    link_legality,
    tokens_waited,
    traced_to_arguments,
    dma_channels,
    descriptors,
    memory,
    constant_trip_counts,
    sequence_arguments,
    fifo_rotation,
)

