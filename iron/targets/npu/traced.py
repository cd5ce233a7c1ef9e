"""A lowering precondition: every memref a runtime sequence hands to a transfer or a run can be
traced back to the sequence's own arguments, as mlir-aie's DMA-to-NPU lowering traces it.

The pinned lowering (``lib/Dialect/AIEX/Transforms/AIEDmaToNpu.cpp``, which patches each
transfer's host address) finds the host buffer and byte offset of an
``aiex.npu.dma_memcpy_nd`` operand with ``traceSubviewToBlockArgument``
(``lib/Dialect/AIEX/Utils/AIEUtils.cpp``).  It walks from the operand towards a block argument
of the runtime sequence and follows only three ops:

- ``memref.cast``: passed through;
- ``memref.reinterpret_cast``: passed through if its source is contiguous (every stride of a
  strided source layout 1);
- ``memref.subview``: static offsets, sizes and strides only, every stride 1, a
  byte-addressable element type, static layout offsets on both sides;

anything else (``memref.view`` among them) fails the lowering with "memref must be a block
argument or subview/cast/reinterpret_cast of a block argument with static offsets, sizes, and
strides".  ``aiex.run`` inlines its callee's sequence on its operands, so theirs are traced the
same way.  iron asks one thing more of a ``memref.reinterpret_cast`` (upstream does not check
it): no dynamic operand, since ``aiex.run`` needs its callee's static types.

``untraceable`` applies the rule to one op; ``preconditions.traced_to_arguments`` runs it in
``verify``'s table on every runtime sequence.
"""

from __future__ import annotations

from typing import Iterator

#: The ops whose memref operands the lowering traces, and which of their operands are memrefs
#: (a slice of the operand list).
TRACED = {"aiex.npu.dma_memcpy_nd": slice(0, 1), "aiex.run": slice(None)}
#: ``ShapedType::kDynamic``, the marker of a dynamic entry in a static offsets/sizes array.
DYNAMIC = -(1 << 63)
WHERE = "mlir-aie traceSubviewToBlockArgument (lib/Dialect/AIEX/Utils/AIEUtils.cpp)"


class Untraceable(Exception):
    """A memref the DMA-to-NPU lowering cannot trace to a runtime-sequence argument."""


def sequence_args(op) -> set:
    """The entry block arguments of the runtime sequence around ``op`` (empty if none)."""
    parent = op.parent_op()
    while parent is not None and parent.name != "aie.runtime_sequence":
        parent = parent.parent_op()
    if parent is None or not parent.regions or not parent.regions[0].blocks:
        return set()
    return set(parent.regions[0].blocks.first.args)


def statics(op) -> Iterator[tuple[str, int]]:
    """(array name, value) of every static offset, size and stride of a view op."""
    for name in ("static_offsets", "static_sizes", "static_strides"):
        for value in op.properties[name].get_values():
            yield name, value


def strides_of(memref_type) -> tuple[int, ...] | None:
    """The strides of a strided layout; None for the identity layout (contiguous)."""
    layout = getattr(memref_type, "layout", None)
    strides = getattr(layout, "get_strides", None)
    return None if strides is None else tuple(strides())


def trace(value, roots: set, what: str) -> None:
    """Follow ``value`` back to one of ``roots`` as the lowering does; raise ``Untraceable``
    naming the first op it would not follow."""
    from xdsl.ir import BlockArgument

    while True:
        if isinstance(value, BlockArgument):
            if value in roots:
                return
            raise Untraceable(f"{what} reaches a block argument that is not one of its runtime "
                              f"sequence's arguments ({WHERE})")
        op = value.owner
        if op.name == "memref.cast":
            value = op.operands[0]
            continue
        if op.name == "memref.reinterpret_cast":
            if len(op.operands) > 1 or any(v == DYNAMIC for _, v in statics(op)):
                raise Untraceable(f"{what} comes from a memref.reinterpret_cast with a dynamic "
                                  "offset, size or stride: aiex.run needs its callee's static "
                                  "types")
            source = op.operands[0]
            if any(s != 1 for s in strides_of(source.type) or ()):
                raise Untraceable(f"{what} comes from a memref.reinterpret_cast of a "
                                  f"non-contiguous memref {source.type} ({WHERE} requires every "
                                  "stride of its source to be 1)")
            value = source
            continue
        if op.name == "memref.subview":
            dynamic = [n for n, v in statics(op) if v == DYNAMIC]
            if len(op.operands) > 1 or dynamic:
                raise Untraceable(f"{what} comes from a memref.subview with dynamic "
                                  f"{', '.join(sorted(set(dynamic))) or 'operands'} ({WHERE} "
                                  "follows only static offsets, sizes and strides)")
            strides = [v for n, v in statics(op) if n == "static_strides"]
            if any(s != 1 for s in strides):
                raise Untraceable(f"{what} comes from a memref.subview with strides {strides} "
                                  f"({WHERE} follows only unit strides)")
            width = op.operands[0].type.get_element_type().bitwidth
            if width % 8:
                raise Untraceable(f"{what} comes from a memref.subview of {width}-bit elements "
                                  f"({WHERE} follows only byte-addressable ones)")
            value = op.operands[0]
            continue
        raise Untraceable(f"{what} comes from a {op.name}, which {WHERE} does not follow (only "
                          "memref.subview, memref.cast and memref.reinterpret_cast with static "
                          "offsets, sizes and strides)")


def untraceable(op) -> Iterator[str]:
    """The problem of each memref operand of ``op`` the lowering cannot trace (none unless
    ``op`` is a transfer or a run)."""
    if op.name not in TRACED:
        return
    roots = sequence_args(op)
    for k, operand in enumerate(op.operands[TRACED[op.name]]):
        try:
            trace(operand, roots, f"{op.name} operand {k}")
        except Untraceable as e:
            yield str(e)
