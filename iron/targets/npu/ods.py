"""mlir-aie's op definitions for every aie / aiex op and type iron emits, as xDSL definitions.

A transcription, by hand, of the ODS (TableGen) of the pinned mlir-aie (``UPSTREAM``):
``include/aie/Dialect/AIE/IR/AIEOps.td`` (ops), ``AIETypes.td`` (the object FIFO types),
``AIEAttrs.td`` (enums, the BD layout attributes, ``AIEI32Attr``) and
``include/aie/Dialect/AIEX/IR/AIEX.td`` (the runtime sequence's DMA ops).  Each class names the
``def`` it transcribes; its operands, results, regions, properties and their kinds follow the
``arguments`` / ``results`` / ``regions`` of that def, and ``verify_`` adds the confinements
ODS states as ``ConfinedAttr`` (``IntMinValue``, ``DenseArrayCount``) and the enum cases
(``I32EnumAttr`` is an ``i32`` integer holding one of the listed values).  Traits the checks
rely on are carried over: ``SymbolTable`` on ``aie.device`` (so ``func.call`` resolves its
callee there, as in mlir-aie), ``Symbol``, ``HasParent``, ``IsTerminator`` / ``NoTerminator``.

Only what iron emits is transcribed, and only the ODS-level rules here: mlir-aie's C++
verifiers (``hasVerifier = 1``: tile coordinates against the device's target model, links)
and its passes' preconditions are ``preconditions``' rules, and the custom syntax is
``custom``'s; ``check`` measures designs against the same limits before any MLIR is written.
Inherent attributes are properties (mlir-aie's dialects use MLIR's default, properties), so a
module printed by mlir-aie's ``--mlir-print-op-generic`` carries them in ``<{...}>``.
"""

from __future__ import annotations


from xdsl.dialects.builtin import (I32, I64, ArrayAttr, BoolAttr, DenseArrayBase, IndexType,
                                   IntegerAttr, MemRefType, StringAttr, SymbolRefAttr)
from xdsl.ir import Attribute, Dialect, ParametrizedAttribute, TypeAttribute
from xdsl.irdl import (AttrSizedOperandSegments, IRDLOperation, irdl_attr_definition,
                       irdl_op_definition, opt_prop_def, operand_def, param_def, prop_def,
                       region_def, result_def, traits_def, var_operand_def)
from xdsl.parser import AttrParser
from xdsl.printer import Printer
from xdsl.traits import (HasParent, IsolatedFromAbove, IsTerminator, NoTerminator,
                         SymbolOpInterface, SymbolTable)
from xdsl.utils.exceptions import VerifyException

#: The mlir-aie source transcribed here and whose syntax ``mlir`` emits: no release tag of
#: mlir-aie is readable with the tools iron was written with, so the pin is the newest commit
#: of its main branch that is (it includes PR #2708, ``aie.runtime_sequence``, and PR #2922,
#: ``link_with`` on ``func.func``; release v1.1.3 predates the latter).
UPSTREAM = "mlir-aie main @ 1e400306 (2026-03-13)"

#: ``AIEDevice`` (AIEAttrs.td): case name -> value.
AIE_DEVICE = {"xcvc1902": 1, "xcve2302": 2, "xcve2802": 3, "npu1": 4, "npu1_1col": 5,
              "npu1_2col": 6, "npu1_3col": 7, "npu2": 8, "npu2_1col": 9, "npu2_2col": 10,
              "npu2_3col": 11, "npu2_4col": 12, "npu2_5col": 13, "npu2_6col": 14,
              "npu2_7col": 15}
#: ``ObjectFifoPort`` (AIEAttrs.td).
OBJECTFIFO_PORT = {"Produce": 0, "Consume": 1}


def _int(op: IRDLOperation, name: str, attr: Attribute | None, *, minimum: int | None = None,
         cases: dict[str, int] | None = None) -> None:
    """ConfinedAttr<..., [IntMinValue<minimum>]> and I32EnumAttr case checks."""
    if attr is None:
        return
    assert isinstance(attr, IntegerAttr)
    value = attr.value.data
    if minimum is not None and value < minimum:
        raise VerifyException(f"'{op.name}' op property '{name}' = {value} breaks "
                              f"IntMinValue<{minimum}>")
    if cases is not None and value not in cases.values():
        raise VerifyException(f"'{op.name}' op property '{name}' = {value} is not a case of "
                              f"its enum ({', '.join(f'{k} = {v}' for k, v in cases.items())})")


# ---- types and attributes (AIETypes.td, AIEAttrs.td) ---------------------------------------


class _MemrefInAngles:
    """Parsing and printing of a type whose one parameter is a memref in angle brackets."""

    @classmethod
    def parse_parameters(cls, parser: AttrParser):
        with parser.in_angle_brackets():
            return (parser.parse_type(),)

    def print_parameters(self, printer: Printer) -> None:
        with printer.in_angle_brackets():
            printer.print_attribute(self.memref)


@irdl_attr_definition
class ObjectFifoType(_MemrefInAngles, ParametrizedAttribute, TypeAttribute):
    """def AIE_ObjectFifoType: ``!aie.objectfifo<memref>``."""

    name = "aie.objectfifo"
    memref: MemRefType = param_def()


@irdl_attr_definition
class ObjectFifoSubviewType(_MemrefInAngles, ParametrizedAttribute, TypeAttribute):
    """def AIE_ObjectFifoSubviewType: ``!aie.objectfifosubview<memref>``."""

    name = "aie.objectfifosubview"
    memref: MemRefType = param_def()


@irdl_attr_definition
class BDDimLayoutArrayAttr(ParametrizedAttribute):
    """def BDDimLayoutArrayAttr: ArrayOfAttr of ``bd_dim_layout``, printed
    ``#aie<bd_dim_layout_array[...]>``; iron emits only the empty array (no transformation)."""

    name = "aie.bd_dim_layout_array"
    layouts: ArrayAttr = param_def()

    @classmethod
    def parse_parameters(cls, parser: AttrParser):
        parser.parse_punctuation("[")
        parser.parse_punctuation("]")
        return (ArrayAttr(()),)

    def print_parameters(self, printer: Printer) -> None:
        printer.print_string("[]")


@irdl_attr_definition
class BDDimLayoutArrayArrayAttr(ParametrizedAttribute):
    """def BDDimLayoutArrayArrayAttr: ArrayOfAttr of ``BDDimLayoutArrayAttr``, one per
    consumer: ``#aie<bd_dim_layout_array_array[[], ...]>`` (elements printed stripped)."""

    name = "aie.bd_dim_layout_array_array"
    arrays: ArrayAttr = param_def()

    @classmethod
    def parse_parameters(cls, parser: AttrParser):
        def element():
            parser.parse_punctuation("[")
            parser.parse_punctuation("]")
            return BDDimLayoutArrayAttr(ArrayAttr(()))

        items = parser.parse_comma_separated_list(parser.Delimiter.SQUARE, element)
        return (ArrayAttr(items),)

    def print_parameters(self, printer: Printer) -> None:
        printer.print_string("[" + ", ".join("[]" for _ in self.arrays.data) + "]")


# ---- aie ops (AIEOps.td) -------------------------------------------------------------------


@irdl_op_definition
class EndOp(IRDLOperation):
    """def AIE_EndOp: AIE_Op<"end", [Terminator]>."""

    name = "aie.end"
    traits = traits_def(IsTerminator())


@irdl_op_definition
class DeviceOp(IRDLOperation):
    """def AIE_DeviceOp: ``ins AIEDevice:$device, DefaultValuedAttr<SymbolNameAttr>:$sym_name``,
    ``region AnyRegion:$body_region``; [Symbol, HasParent<ModuleOp>, SymbolTable,
    SingleBlockImplicitTerminator<"EndOp">, IsolatedFromAbove] (the terminator is explicit in
    generic form: ``aie.end`` closes the region)."""

    name = "aie.device"
    device = prop_def(IntegerAttr[I32])
    sym_name = opt_prop_def(StringAttr)
    body_region = region_def("single_block")
    traits = traits_def(SymbolTable(), IsolatedFromAbove())

    def verify_(self) -> None:
        _int(self, "device", self.device, cases=AIE_DEVICE)
        block = self.body_region.block
        if block.last_op is None or not isinstance(block.last_op, EndOp):
            raise VerifyException("'aie.device' op region must end with 'aie.end' "
                                  "(SingleBlockImplicitTerminator<\"EndOp\">)")


@irdl_op_definition
class TileOp(IRDLOperation):
    """def AIE_TileOp: ``ConfinedAttr<AIEI32Attr, [IntMinValue<0>]>:$col, $row``,
    ``OptionalAttr<StrAttr>:$allocation_scheme``; ``outs Index:$result``."""

    name = "aie.tile"
    col = prop_def(IntegerAttr[I32])
    row = prop_def(IntegerAttr[I32])
    allocation_scheme = opt_prop_def(StringAttr)
    result = result_def(IndexType)
    traits = traits_def(HasParent(DeviceOp))

    def verify_(self) -> None:
        _int(self, "col", self.col, minimum=0)
        _int(self, "row", self.row, minimum=0)


@irdl_op_definition
class CoreOp(IRDLOperation):
    """def AIE_CoreOp: ``ins Index:$tile, DefaultValuedAttr<AIEI32Attr, "0x400">:$stack_size,
    OptionalAttr<StrAttr>:$link_with (deprecated), OptionalAttr<StrArrayAttr>:$link_files,
    OptionalAttr<StrAttr>:$elf_file, OptionalAttr<BoolAttr>:$dynamic_objfifo_lowering``;
    ``region AnyRegion:$body``; ``outs Index``."""

    name = "aie.core"
    tile = operand_def(IndexType)
    stack_size = opt_prop_def(IntegerAttr[I32])
    link_with = opt_prop_def(StringAttr)
    link_files = opt_prop_def(ArrayAttr[StringAttr])
    elf_file = opt_prop_def(StringAttr)
    dynamic_objfifo_lowering = opt_prop_def(BoolAttr)
    body = region_def()
    result = result_def(IndexType)
    traits = traits_def(HasParent(DeviceOp))

    def verify_(self) -> None:
        if self.link_with is not None and self.link_files is not None:
            raise VerifyException("'aie.core' op cannot specify both 'link_with' (deprecated) "
                                  "and 'link_files'")


@irdl_op_definition
class BufferOp(IRDLOperation):
    """def AIE_BufferOp: ``ins Index:$tile, OptionalAttr<StrAttr>:$sym_name,
    OptionalAttr<AIEI32Attr>:$address, OptionalAttr<ElementsAttr>:$initial_value,
    OptionalAttr<AIEI32Attr>:$mem_bank``; ``outs AnyMemRef:$buffer``."""

    name = "aie.buffer"
    tile = operand_def(IndexType)
    sym_name = opt_prop_def(StringAttr)
    address = opt_prop_def(IntegerAttr[I32])
    mem_bank = opt_prop_def(IntegerAttr[I32])
    buffer = result_def(MemRefType)
    traits = traits_def(HasParent(DeviceOp))


@irdl_op_definition
class ObjectFifoCreateOp(IRDLOperation):
    """def AIE_ObjectFifoCreateOp: AIE_Op<"objectfifo", [HasParent<"DeviceOp">, Symbol]>:
    ``SymbolNameAttr:$sym_name, Index:$producerTile, Variadic<Index>:$consumerTiles,
    AIE_ObjectFifo_Depth:$elemNumber, TypeAttrOf<AIE_ObjectFifoType>:$elemType,
    BDDimLayoutArrayAttr:$dimensionsToStream,
    BDDimLayoutArrayArrayAttr:$dimensionsFromStreamPerConsumer``, then defaulted or optional
    ``via_DMA``, ``plio``, ``disable_synchronization`` (BoolAttr), ``repeat_count``,
    ``iter_count`` (AIEI32Attr); ``AIE_ObjectFifo_Depth`` is a non-negative AIEI32Attr (or an
    array of them; iron emits one)."""

    name = "aie.objectfifo"
    sym_name = prop_def(StringAttr)
    producerTile = operand_def(IndexType)
    consumerTiles = var_operand_def(IndexType)
    elemNumber = prop_def(IntegerAttr[I32])
    elemType = prop_def(ObjectFifoType)
    dimensionsToStream = prop_def(BDDimLayoutArrayAttr)
    dimensionsFromStreamPerConsumer = prop_def(BDDimLayoutArrayArrayAttr)
    via_DMA = opt_prop_def(BoolAttr)
    plio = opt_prop_def(BoolAttr)
    disable_synchronization = opt_prop_def(BoolAttr)
    repeat_count = opt_prop_def(IntegerAttr[I32])
    iter_count = opt_prop_def(IntegerAttr[I32])
    traits = traits_def(HasParent(DeviceOp), SymbolOpInterface())

    def verify_(self) -> None:
        _int(self, "elemNumber", self.elemNumber, minimum=0)
        _int(self, "repeat_count", self.repeat_count, minimum=1)
        if len(self.dimensionsFromStreamPerConsumer.arrays.data) != len(self.consumerTiles):
            raise VerifyException("'aie.objectfifo' op dimensionsFromStreamPerConsumer needs "
                                  "one layout array per consumer tile")


@irdl_op_definition
class ObjectFifoLinkOp(IRDLOperation):
    """def AIE_ObjectFifoLinkOp: ``SymbolRefArrayAttr:$fifoIns, SymbolRefArrayAttr:$fifoOuts,
    I64ArrayAttr:$src_offsets, I64ArrayAttr:$dst_offsets``."""

    name = "aie.objectfifo.link"
    fifoIns = prop_def(ArrayAttr[SymbolRefAttr])
    fifoOuts = prop_def(ArrayAttr[SymbolRefAttr])
    src_offsets = prop_def(ArrayAttr[IntegerAttr[I64]])
    dst_offsets = prop_def(ArrayAttr[IntegerAttr[I64]])
    traits = traits_def(HasParent(DeviceOp))


@irdl_op_definition
class ObjectFifoAcquireOp(IRDLOperation):
    """def AIE_ObjectFifoAcquireOp: ``ObjectFifoPort:$port, FlatSymbolRefAttr:$objFifo_name,
    ConfinedAttr<AIEI32Attr, [IntMinValue<1>]>:$size``;
    ``outs AIE_ObjectFifoSubviewType:$subview``."""

    name = "aie.objectfifo.acquire"
    port = prop_def(IntegerAttr[I32])
    objFifo_name = prop_def(SymbolRefAttr)
    size = prop_def(IntegerAttr[I32])
    subview = result_def(ObjectFifoSubviewType)

    def verify_(self) -> None:
        _int(self, "port", self.port, cases=OBJECTFIFO_PORT)
        _int(self, "size", self.size, minimum=1)
        _flat(self, "objFifo_name", self.objFifo_name)


@irdl_op_definition
class ObjectFifoReleaseOp(IRDLOperation):
    """def AIE_ObjectFifoReleaseOp: ``ObjectFifoPort:$port, FlatSymbolRefAttr:$objFifo_name,
    ConfinedAttr<AIEI32Attr, [IntMinValue<1>]>:$size``."""

    name = "aie.objectfifo.release"
    port = prop_def(IntegerAttr[I32])
    objFifo_name = prop_def(SymbolRefAttr)
    size = prop_def(IntegerAttr[I32])

    def verify_(self) -> None:
        _int(self, "port", self.port, cases=OBJECTFIFO_PORT)
        _int(self, "size", self.size, minimum=1)
        _flat(self, "objFifo_name", self.objFifo_name)


@irdl_op_definition
class ObjectFifoSubviewAccessOp(IRDLOperation):
    """def AIE_ObjectFifoSubviewAccessOp: ``AIE_ObjectFifoSubviewType:$subview,
    ConfinedAttr<AIEI32Attr, [IntMinValue<0>]>:$index``; ``outs AnyMemRef:$output``."""

    name = "aie.objectfifo.subview.access"
    subview = operand_def(ObjectFifoSubviewType)
    index = prop_def(IntegerAttr[I32])
    output = result_def(MemRefType)

    def verify_(self) -> None:
        _int(self, "index", self.index, minimum=0)


@irdl_op_definition
class RuntimeSequenceOp(IRDLOperation):
    """def AIE_RuntimeSequenceOp: AIE_Op<"runtime_sequence", [Symbol, NoTerminator,
    HasParent<"DeviceOp">]>: ``DefaultValuedAttr<SymbolNameAttr, "sequence">:$sym_name``,
    ``region AnyRegion:$body`` (its block arguments are the host buffers)."""

    name = "aie.runtime_sequence"
    sym_name = opt_prop_def(StringAttr)
    body = region_def("single_block")
    traits = traits_def(HasParent(DeviceOp), NoTerminator())


def _flat(op: IRDLOperation, name: str, ref: SymbolRefAttr) -> None:
    if ref.nested_references.data:
        raise VerifyException(f"'{op.name}' op property '{name}' must be a flat symbol "
                              "reference (FlatSymbolRefAttr)")


# ---- aiex ops (AIEX.td) --------------------------------------------------------------------


@irdl_op_definition
class NpuDmaMemcpyNdOp(IRDLOperation):
    """def AIE_NpuDmaMemcpyNdOp: AIEX_Op<"npu.dma_memcpy_nd", [AttrSizedOperandSegments]>:
    ``AnyRankedOrUnrankedMemRef:$memref, Variadic<I64>:$offsets, $sizes, $strides,
    ConfinedAttr<DenseI64ArrayAttr, [DenseArrayCount<4>]>:$static_offsets, $static_sizes,
    $static_strides, OptionalAttr<PacketInfoAttr>:$packet, SymbolRefAttr:$metadata,
    I64Attr:$id, DefaultValuedOptionalAttr<BoolAttr>:$issue_token``, and the defaulted
    ``d*_zero_before/after``, ``burst_length`` (I64Attr)."""

    name = "aiex.npu.dma_memcpy_nd"
    irdl_options = (AttrSizedOperandSegments(as_property=True),)
    memref = operand_def(MemRefType)
    offsets = var_operand_def(I64)
    sizes = var_operand_def(I64)
    strides = var_operand_def(I64)
    static_offsets = prop_def(DenseArrayBase)
    static_sizes = prop_def(DenseArrayBase)
    static_strides = prop_def(DenseArrayBase)
    metadata = prop_def(SymbolRefAttr)
    id = prop_def(IntegerAttr[I64])
    issue_token = opt_prop_def(BoolAttr)
    d0_zero_before = opt_prop_def(IntegerAttr[I64])
    d1_zero_before = opt_prop_def(IntegerAttr[I64])
    d2_zero_before = opt_prop_def(IntegerAttr[I64])
    d0_zero_after = opt_prop_def(IntegerAttr[I64])
    d1_zero_after = opt_prop_def(IntegerAttr[I64])
    d2_zero_after = opt_prop_def(IntegerAttr[I64])
    burst_length = opt_prop_def(IntegerAttr[I64])
    traits = traits_def(HasParent(RuntimeSequenceOp))

    def verify_(self) -> None:
        for name in ("static_offsets", "static_sizes", "static_strides"):
            arr = getattr(self, name)
            if arr.elt_type != I64 and str(arr.elt_type) != "i64":
                raise VerifyException(f"'{self.name}' op property '{name}' must be a "
                                      "DenseI64ArrayAttr")
            if len(arr.get_values()) != 4:
                raise VerifyException(f"'{self.name}' op property '{name}' must hold 4 "
                                      f"values (DenseArrayCount<4>), has "
                                      f"{len(arr.get_values())}")


@irdl_op_definition
class NpuDmaWaitOp(IRDLOperation):
    """def AIE_NpuDmaWaitOp: AIEX_Op<"npu.dma_wait">: ``FlatSymbolRefAttr:$symbol``."""

    name = "aiex.npu.dma_wait"
    symbol = prop_def(SymbolRefAttr)
    traits = traits_def(HasParent(RuntimeSequenceOp))

    def verify_(self) -> None:
        _flat(self, "symbol", self.symbol)


def _module_device(op: IRDLOperation, symbol: str) -> DeviceOp | None:
    """The ``aie.device`` named ``symbol`` among the devices of ``op``'s module."""
    module = op
    while module.parent_op() is not None:
        module = module.parent_op()
    for other in module.walk():
        if isinstance(other, DeviceOp) and other.sym_name is not None and \
                other.sym_name.data == symbol:
            return other
    return None


@irdl_op_definition
class ConfigureOp(IRDLOperation):
    """def AIE_ConfigureOp: AIEX_Op<"configure", [HasParent<"AIE::RuntimeSequenceOp">,
    NoTerminator]>: ``FlatSymbolRefAttr:$symbol``, ``region AnyRegion:$body``; its verifier
    (``ConfigureOp::verify``) resolves ``symbol`` to a device of the module of the same device
    type as the one it is in (mlir-aie's messages: "No such device", "Device types do not
    match").  Newer mlir-aie adds an optional ``expand_mode``; iron neither emits nor
    transcribes it."""

    name = "aiex.configure"
    symbol = prop_def(SymbolRefAttr)
    body = region_def("single_block")
    traits = traits_def(HasParent(RuntimeSequenceOp), NoTerminator())

    def verify_(self) -> None:
        _flat(self, "symbol", self.symbol)
        target = _module_device(self, self.symbol.root_reference.data)
        if target is None:
            raise VerifyException(f"No such device: '{self.symbol.root_reference.data}'")
        own = self.parent_op()
        while own is not None and not isinstance(own, DeviceOp):
            own = own.parent_op()
        if own is not None and own.device.value.data != target.device.value.data:
            raise VerifyException(f"Device types do not match: {own.device.value.data} vs. "
                                  f"{target.device.value.data}")


@irdl_op_definition
class RunOp(IRDLOperation):
    """def AIE_RunOp: AIEX_Op<"run", [HasParent<"ConfigureOp">]>:
    ``FlatSymbolRefAttr:$runtime_sequence_symbol, Variadic<AnyType>:$args``; the callee is a
    runtime sequence of the configured device (mlir-aie's verifier: "No such runtime sequence
    for device"), taking as many arguments (the count check of mlir-aie's lowering, made here)
    of the same types (iron's own check: the run inlines the callee with these buffers)."""

    name = "aiex.run"
    runtime_sequence_symbol = prop_def(SymbolRefAttr)
    args = var_operand_def()
    traits = traits_def(HasParent(ConfigureOp))

    def verify_(self) -> None:
        _flat(self, "runtime_sequence_symbol", self.runtime_sequence_symbol)
        configure = self.parent_op()
        device_name = configure.symbol.root_reference.data
        device = _module_device(self, device_name)
        want = self.runtime_sequence_symbol.root_reference.data
        callee = None if device is None else next(
            (op for op in device.body_region.block.ops if isinstance(op, RuntimeSequenceOp)
             and (op.sym_name.data if op.sym_name is not None else "sequence") == want), None)
        if callee is None:
            raise VerifyException(f"No such runtime sequence for device '{device_name}': "
                                  f"'{want}'")
        params = [a.type for a in callee.body.block.args]
        given = [a.type for a in self.args]
        if len(params) != len(given):
            raise VerifyException(f"number of run op arguments ({len(given)}) does not match "
                                  f"number of callee runtime sequence arguments ({len(params)})")
        for i, (p, g) in enumerate(zip(params, given)):
            if p != g:
                raise VerifyException(f"run op argument {i} is {g}, the callee runtime "
                                      f"sequence's {p}")
@irdl_op_definition
class NpuWriteRTPOp(IRDLOperation):
    """def AIE_NpuWriteRTPOp: AIEX_Op<"npu.rtp_write", []>: ``FlatSymbolRefAttr:$buffer,
    UI32Attr:$index, I32Attr:$value``."""

    name = "aiex.npu.rtp_write"
    buffer = prop_def(SymbolRefAttr)
    index = prop_def(IntegerAttr)
    value = prop_def(IntegerAttr[I32])
    traits = traits_def(HasParent(RuntimeSequenceOp))

    def verify_(self) -> None:
        _flat(self, "buffer", self.buffer)
        kind = self.index.type
        if str(kind) != "ui32":
            raise VerifyException(f"'{self.name}' op property 'index' must be a UI32Attr, "
                                  f"got {kind}")


AIE = Dialect("aie", [EndOp, DeviceOp, TileOp, CoreOp, BufferOp, ObjectFifoCreateOp,
                      ObjectFifoLinkOp, ObjectFifoAcquireOp, ObjectFifoReleaseOp,
                      ObjectFifoSubviewAccessOp, RuntimeSequenceOp],
              [ObjectFifoType, ObjectFifoSubviewType, BDDimLayoutArrayAttr,
               BDDimLayoutArrayArrayAttr])
AIEX = Dialect("aiex", [NpuDmaMemcpyNdOp, NpuDmaWaitOp, NpuWriteRTPOp, ConfigureOp, RunOp],
               [])
