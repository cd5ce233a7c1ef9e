"""The custom form of the aie / aiex ops iron emits, parsed as mlir-aie's parsers read it.

aiecc reads ``design.mlir``, the custom form; ``verify`` checks the generic form against the
op definitions (``ods``) and the lowering's preconditions (``preconditions``).  This module
closes the gap: it parses the custom form with the assembly formats of the pinned mlir-aie
(``ods.UPSTREAM``) and ``verify`` requires the module it reads to print, in generic form,
exactly as the generic text does.  A writer bug that puts one thing in ``design.mlir`` and
another in the generic form the checks saw (a depth, a tile, an offset, a dropped
``dma_wait``) is then an error.

Each op below subclasses its ``ods`` definition (same operands, properties, verifier) and
adds the syntax of its ODS ``assemblyFormat`` in mlir-aie's ``AIEOps.td`` / ``AIEX.td``, as
an xDSL declarative format where one exists, else as a ``parse`` method transcribing the
format's custom directives (``AIEDialect.cpp`` ``parseObjectFifoProducerTile`` /
``parseObjectFifoConsumerTiles``: no ``dimensionsToStream`` keyword gives an empty layout,
one empty layout per consumer; ``DeviceOp`` and its implicit ``aie.end`` terminator;
``RuntimeSequenceOp::parse``).  Only the forms iron writes are read: no BD layouts, no
depth arrays, static DMA offsets / sizes / strides.  The builtin, func, arith, scf and memref
ops are xDSL's own parsers, which read MLIR's custom forms.  An op added to ``ods`` gets its
syntax here too (``CUSTOM``; one line with ``formatted`` where its format is declarative).
"""

from __future__ import annotations

import dataclasses
import functools

from xdsl.dialects.builtin import (ArrayAttr, DenseArrayBase, IndexType, IntegerAttr,
                                   IntegerType, Signedness, SymbolRefAttr, i32, i64)
from xdsl.dialects import memref
from xdsl.ir import Dialect
from xdsl.irdl import IRDLOperation, ParsePropInAttrDict
from xdsl.irdl.declarative_assembly_format import FormatProgram
from xdsl.parser import Parser

from . import ods


def formatted(base: type[IRDLOperation], fmt: str):
    """``base`` read with the declarative assembly format ``fmt`` (xDSL's reading of an ODS
    ``assemblyFormat``); properties not named in ``fmt`` come from the attribute dictionary,
    as MLIR takes an inherent attribute written there."""
    op_def = base.get_irdl_definition()
    options = [*op_def.options, ParsePropInAttrDict()]
    program = FormatProgram.from_str(fmt, dataclasses.replace(
        op_def, assembly_format=fmt, options=options))
    return type(base.__name__, (base,), {
        "parse": classmethod(lambda cls, parser: program.parse(parser, cls)),
        "__doc__": f"``{base.name} {fmt}``"})


def _symbol(parser: Parser) -> SymbolRefAttr:
    return SymbolRefAttr(parser.parse_symbol_name())


def _case(parser: Parser, cases: dict[str, int], enum: str) -> IntegerAttr:
    """An ``I32EnumAttr`` written as its case name: the case's ``i32`` value."""
    word = parser.parse_identifier()
    if word not in cases:
        parser.raise_error(f"{word!r} is not a case of {enum} ({', '.join(cases)})")
    return IntegerAttr(cases[word], i32)


def _fifo_port_size(parser: Parser) -> dict:
    """``@fifo(Port, size)`` of an acquire or release: its properties."""
    fifo = _symbol(parser)
    parser.parse_punctuation("(")
    port = _case(parser, ods.OBJECTFIFO_PORT, "ObjectFifoPort")
    parser.parse_punctuation(",")
    size = parser.parse_integer()
    parser.parse_punctuation(")")
    return {"objFifo_name": fifo, "port": port, "size": IntegerAttr(size, i32)}


class DeviceOp(ods.DeviceOp):
    """``aie.device(npu2) [@name] { ... }``: the device case by name; the region's
    ``aie.end`` is implicit (``SingleBlockImplicitTerminator<"EndOp">``)."""

    @classmethod
    def parse(cls, parser: Parser) -> DeviceOp:
        parser.parse_punctuation("(")
        device = _case(parser, ods.AIE_DEVICE, "AIEDevice")
        parser.parse_punctuation(")")
        symbol = parser.parse_optional_symbol_name()
        region = parser.parse_region()
        block = region.block
        if not isinstance(block.last_op, ods.EndOp):
            block.add_op(ods.EndOp())
        props = {"device": device}
        if symbol is not None:
            props["sym_name"] = symbol
        return cls.build(properties=props, regions=[region])


EndOp = formatted(ods.EndOp, "attr-dict")
TileOp = formatted(ods.TileOp, "`(` $col `,` $row `)` attr-dict")


CoreOp = formatted(ods.CoreOp, "`(` $tile `)` $body attr-dict")


BufferOp = formatted(ods.BufferOp, "`(` $tile `)` attr-dict `:` type($buffer)")


class ObjectFifoCreateOp(ods.ObjectFifoCreateOp):
    """``aie.objectfifo @name(%producer, {%consumer, ...}, depth : i32) : !aie.objectfifo<T>``
    (``custom<ObjectFifoProducerTile>``, ``custom<ObjectFifoConsumerTiles>``)."""

    @classmethod
    def parse(cls, parser: Parser) -> ObjectFifoCreateOp:
        name = parser.parse_symbol_name()
        parser.parse_punctuation("(")
        producer = parser.parse_operand(IndexType())
        parser.parse_punctuation(",")
        consumers = parser.parse_comma_separated_list(
            parser.Delimiter.BRACES, lambda: parser.parse_operand(IndexType()))
        parser.parse_punctuation(",")
        depth = parser.parse_attribute()
        parser.parse_punctuation(")")
        extra = parser.parse_optional_attr_dict()
        parser.parse_punctuation(":")
        elem = parser.parse_type()
        empty = ods.BDDimLayoutArrayAttr(ArrayAttr(()))
        props = {"sym_name": name, "elemNumber": depth, "elemType": elem,
                 "dimensionsToStream": empty,
                 "dimensionsFromStreamPerConsumer": ods.BDDimLayoutArrayArrayAttr(
                     ArrayAttr([empty] * len(consumers))), **extra}
        return cls.build(operands=[producer, consumers], properties=props)


ObjectFifoLinkOp = formatted(
    ods.ObjectFifoLinkOp, "$fifoIns `->` $fifoOuts `(` $src_offsets $dst_offsets `)` attr-dict")


class ObjectFifoAcquireOp(ods.ObjectFifoAcquireOp):
    """``aie.objectfifo.acquire @fifo(Consume, 1) : !aie.objectfifosubview<T>``."""

    @classmethod
    def parse(cls, parser: Parser) -> ObjectFifoAcquireOp:
        props = _fifo_port_size(parser)
        parser.parse_punctuation(":")
        return cls.build(result_types=[parser.parse_type()], properties=props)


class ObjectFifoReleaseOp(ods.ObjectFifoReleaseOp):
    """``aie.objectfifo.release @fifo(Consume, 1)``."""

    @classmethod
    def parse(cls, parser: Parser) -> ObjectFifoReleaseOp:
        return cls.build(properties=_fifo_port_size(parser))


ObjectFifoSubviewAccessOp = formatted(
    ods.ObjectFifoSubviewAccessOp,
    "$subview `[` $index `]` attr-dict `:` type($subview) `->` type($output)")


class RuntimeSequenceOp(ods.RuntimeSequenceOp):
    """``aie.runtime_sequence @name(%arg0: memref<...>, ...) { ... }``."""

    @classmethod
    def parse(cls, parser: Parser) -> RuntimeSequenceOp:
        name = parser.parse_optional_symbol_name()
        args = parser.parse_comma_separated_list(parser.Delimiter.PAREN,
                                                 parser.parse_argument)
        region = parser.parse_region(args)
        return cls.build(properties={"sym_name": name} if name else {}, regions=[region])


class NpuDmaMemcpyNdOp(ods.NpuDmaMemcpyNdOp):
    """``aiex.npu.dma_memcpy_nd(%arg[offsets][sizes][strides]) {...} : memref<...>`` with
    static offsets, sizes and strides (``custom<DynamicIndexList>`` without operands)."""

    @classmethod
    def parse(cls, parser: Parser) -> NpuDmaMemcpyNdOp:
        parser.parse_punctuation("(")
        source = parser.parse_unresolved_operand()
        lists = [parser.parse_comma_separated_list(parser.Delimiter.SQUARE,
                                                   parser.parse_integer) for _ in range(3)]
        parser.parse_punctuation(")")
        props = parser.parse_optional_attr_dict()
        parser.parse_punctuation(":")
        memref = parser.parse_type()
        names = ("static_offsets", "static_sizes", "static_strides")
        props.update({n: DenseArrayBase.from_list(i64, v) for n, v in zip(names, lists)})
        return cls.build(operands=[parser.resolve_operand(source, memref), [], [], []],
                         properties=props)


NpuDmaWaitOp = formatted(ods.NpuDmaWaitOp, "attr-dict")


class NpuWriteRTPOp(ods.NpuWriteRTPOp):
    """``aiex.npu.rtp_write(@buffer, index, value)``: the bare integers take their ODS
    storage types (``UI32Attr``, ``I32Attr``), as MLIR's parser gives them."""

    @classmethod
    def parse(cls, parser: Parser) -> NpuWriteRTPOp:
        parser.parse_punctuation("(")
        buffer = _symbol(parser)
        parser.parse_punctuation(",")
        index = parser.parse_integer(allow_negative=False)
        parser.parse_punctuation(",")
        value = parser.parse_integer()
        parser.parse_punctuation(")")
        ui32 = IntegerType(32, Signedness.UNSIGNED)
        props = {"buffer": buffer, "index": IntegerAttr(index, ui32),
                 "value": IntegerAttr(value, i32), **parser.parse_optional_attr_dict()}
        return cls.build(properties=props)


ConfigureOp = formatted(ods.ConfigureOp, "$symbol $body attr-dict")


class RunOp(ods.RunOp):
    """``aiex.run @sequence(%a, %b) : (memref<...>, memref<...>)``."""

    @classmethod
    def parse(cls, parser: Parser) -> RunOp:
        symbol = _symbol(parser)
        operands = parser.parse_comma_separated_list(parser.Delimiter.PAREN,
                                                     parser.parse_unresolved_operand)
        parser.parse_punctuation(":")
        types = parser.parse_comma_separated_list(parser.Delimiter.PAREN, parser.parse_type)
        if len(types) != len(operands):
            parser.raise_error(f"aiex.run: {len(operands)} operands, {len(types)} types")
        args = [parser.resolve_operand(o, t) for o, t in zip(operands, types)]
        return cls.build(operands=[args], properties={"runtime_sequence_symbol": symbol})


#: MLIR's ``memref.cast`` (``MemRefOps.td``: ``$source attr-dict `:` type($source) `to`
#: type($dest)``), which xDSL's memref dialect reads only in generic form.
MemrefCastOp = formatted(memref.CastOp, "$source attr-dict `:` type($source) `to` type($dest)")

CUSTOM = {op.name: op for op in (
    EndOp, DeviceOp, TileOp, CoreOp, BufferOp, ObjectFifoCreateOp, ObjectFifoLinkOp,
    ObjectFifoAcquireOp, ObjectFifoReleaseOp, ObjectFifoSubviewAccessOp, RuntimeSequenceOp,
    NpuDmaMemcpyNdOp, NpuDmaWaitOp, NpuWriteRTPOp, ConfigureOp, RunOp, MemrefCastOp)}


def _with_custom(dialect: Dialect) -> Dialect:
    ops = [CUSTOM.get(op.name, op) for op in dialect.operations]
    return Dialect(dialect.name, ops, list(dialect.attributes))


@functools.lru_cache(maxsize=1)
def context():
    """xDSL's builtin, func, arith, scf and memref (its ``memref.cast`` with MLIR's syntax),
    and ``ods``' aie / aiex with the custom syntax above."""
    from xdsl.context import Context
    from xdsl.dialects import arith, builtin, func, scf

    ctx = Context()
    for dialect in (builtin.Builtin, func.Func, arith.Arith, scf.Scf, _with_custom(memref.MemRef),
                    _with_custom(ods.AIE), _with_custom(ods.AIEX)):
        ctx.load_dialect(dialect)
    return ctx




def _values(module) -> dict:
    """Every SSA value of ``module`` numbered in definition order (block arguments, then
    each op's results), so two modules' operands can be compared by position."""
    numbers: dict = {}
    for op in module.walk():
        for region in op.regions:
            for block in region.blocks:
                for arg in block.args:
                    numbers[arg] = len(numbers)
        for result in op.results:
            numbers[result] = len(numbers)
    return numbers


def difference(custom, generic) -> tuple[object, str] | None:
    """The first op where the module read from the custom form differs from the one read
    from the generic form, with what differs; None when they are the same module (op by op:
    name, properties, attributes, operands by position, result and block argument types,
    region and block structure)."""
    ours, theirs = _values(custom), _values(generic)
    a_ops, b_ops = list(custom.walk()), list(generic.walk())
    for a, b in zip(a_ops, b_ops):
        if a.name != b.name:
            return a, f"is {a.name} where the generic form has {b.name}"
        for kind in ("properties", "attributes"):
            x, y = getattr(a, kind), getattr(b, kind)
            for key in sorted(set(x) | set(y)):
                if x.get(key) != y.get(key):
                    return a, (f"{kind[:-3]}y {key} = {x.get(key)} where the generic form "
                               f"has {y.get(key)}")
        if [ours[v] for v in a.operands] != [theirs[v] for v in b.operands]:
            return a, "takes other operands than in the generic form"
        if [r.type for r in a.results] != [r.type for r in b.results]:
            return a, "has other result types than in the generic form"
        shape_a = [[[arg.type for arg in blk.args] for blk in r.blocks] for r in a.regions]
        shape_b = [[[arg.type for arg in blk.args] for blk in r.blocks] for r in b.regions]
        if shape_a != shape_b:
            return a, "has other regions or block arguments than in the generic form"
    if len(a_ops) != len(b_ops):
        extra = a_ops[len(b_ops)] if len(a_ops) > len(b_ops) else b_ops[len(a_ops)]
        return extra, (f"the custom form has {len(a_ops)} ops, the generic form "
                       f"{len(b_ops)}")
    return None
