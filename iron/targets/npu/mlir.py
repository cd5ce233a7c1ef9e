"""A design as MLIR-AIE text, in custom form (what aiecc.py reads) and in generic form.

Both follow the pinned mlir-aie (``ods.UPSTREAM``): ``aie.device`` with the device as its enum
(an ``i32`` in generic form) and an ``aie.end`` closing its region; ``func.func`` declarations
of the core kernels carrying ``link_with`` (the object file); ``aie.tile``, ``aie.objectfifo``
with every property its ODS requires, ``aie.objectfifo.link`` with ``I64ArrayAttr`` offsets;
each ``aie.core`` running its program in a loop until the array is reconfigured (an
``scf.for`` to the largest ``index``, as mlir-aie's tests and IRON's ``range_(sys.maxsize)``
write it), one iteration per dispatch; ``aie.runtime_sequence`` with ``aiex.npu.dma_memcpy_nd``
(descriptor ids from ``bds``, ``issue_token`` on every transfer that is waited on, operand
segment sizes) and ``aiex.npu.dma_wait``, after the ``aiex.npu.rtp_write`` of its runtime
parameters.  The generic form is what mlir-aie's ``--mlir-print-op-generic`` prints: inherent
attributes as properties ``<{...}>``.  ``verify`` checks it against the transcription of
mlir-aie's op definitions in ``ods``.
"""

from __future__ import annotations

from .bds import allocate
from .ir import (DTYPE_BYTES, Acquire, Buf, Call, Design, Fifo, Iv, Loop, Release,
                     walk_ops)
from .ods import AIE_DEVICE, OBJECTFIFO_PORT, UPSTREAM
from .resources import resources

SYNTAX = UPSTREAM
ELEM = {"bf16": "bf16", "f32": "f32", "i32": "i32", "i8": "i8", "u8": "i8"}
#: The bound of a core's loop "until reconfiguration": the largest index.
FOREVER = (1 << 63) - 1


def memref(shape, dtype: str) -> str:
    return f"memref<{'x'.join(map(str, shape))}x{ELEM[dtype]}>"


def fifo_type(f: Fifo) -> str:
    return f"!aie.objectfifo<{memref(f.shape, f.dtype)}>"


def subview_type(f: Fifo) -> str:
    return f"!aie.objectfifosubview<{memref(f.shape, f.dtype)}>"


def tile_name(t) -> str:
    return f"%tile_{t.col}_{t.row}"


def object_file(source: str) -> str:
    """The object file Peano makes of a kernel source (``aiecc``)."""
    return source.rsplit(".", 1)[0] + ".o"


def arg_type(design: Design, a) -> str:
    """The MLIR type of a kernel call's argument ``a`` in ``design``."""
    if isinstance(a, float):
        return "f32"
    if isinstance(a, (int, Iv)):
        return "i32"
    if isinstance(a, Buf):
        b = next(b for b in design.buffers if b.name == a.name)
        return memref(b.shape, b.dtype)
    f = design.fifo(a)
    return memref(f.shape, f.dtype)


class Writer:
    """Shared walk of a design; ``custom`` selects the syntax of every line.  With
    ``sequences`` (a pack's members, ``coresidence.Pack``: each placed design and its
    sequence's symbol) ``design`` is their union and the device holds every member's runtime
    sequence under its symbol, each function declared with its member's object file."""

    def __init__(self, design: Design, custom: bool, symbol: str | None = None,
                 sequences: tuple[tuple[Design, str], ...] = ()):
        self.d, self.custom, self.symbol = design, custom, symbol
        self.sequences = sequences or ((design, "sequence"),)
        self.lines: list[str] = []
        self.n = 0
        self.fifos = {f.name: f for f in design.fifos}
        self.cores_named: set[str] = set()
        plan = allocate(design, resources(design.device).shim_bds)
        if plan.overflow:
            raise ValueError(f"{design.name}: {plan.overflow}")  # the legality rule refuses it
        self.bd_ids = plan.ids

    def fresh(self, stem: str = "v") -> str:
        self.n += 1
        return f"%{stem}{self.n}"

    def emit(self, depth: int, text: str) -> None:
        self.lines.append("  " * depth + text)

    def arg_type(self, a) -> str:
        return arg_type(self.d, a)

    def const(self, depth: int, value, kind: str) -> str:
        """A constant of the core being written, defined once at the top of its region."""
        key = (value, kind)
        if key in self.consts:
            return self.consts[key]
        name = self.consts[key] = self.fresh("c")
        lit = f"{value:.8e}" if kind == "f32" else str(value)  # MLIR floats need a point
        if self.custom:
            self.emit(depth, f"{name} = arith.constant {lit} : {kind}")
        else:
            self.emit(depth, f'{name} = "arith.constant"() <{{value = {lit} : {kind}}}> : '
                      f"() -> {kind}")
        return name

    # ---- the module ------------------------------------------------------------------------

    def render(self) -> str:
        self.emit(0, "module {" if self.custom else '"builtin.module"() ({')
        self.device()
        self.emit(0, "}" if self.custom else "}) : () -> ()")
        return "\n".join(self.lines) + "\n"

    def device(self) -> None:
        """The design's ``aie.device`` op; named ``symbol`` when it is one of several devices
        of a module (a folded configuration, ``fold``)."""
        d = self.d
        self.emit(1, device_open(d.device, self.symbol, self.custom))
        links = {name: object_file(m.kernel_source) for m, _ in self.sequences
                 for name in m.functions()}
        for name, args in sorted(d.functions().items()):
            link = links[name]
            types = ", ".join(self.arg_type(a) for a in args)
            if self.custom:
                self.emit(2, f'func.func private @{name}({types}) attributes {{link_with = '
                          f'"{link}"}}')
            else:
                self.emit(2, f'"func.func"() <{{function_type = ({types}) -> (), sym_name = '
                          f'"{name}", sym_visibility = "private"}}> ({{\n'
                          f'    }}) {{link_with = "{link}"}} : () -> ()')
        for t in d.tiles():
            self.emit(2, f"{tile_name(t)} = aie.tile({t.col}, {t.row})" if self.custom else
                      f'{tile_name(t)} = "aie.tile"() <{{col = {t.col} : i32, row = {t.row} : '
                      "i32}> : () -> index")
        for f in d.fifos:
            cons = ", ".join(tile_name(t) for t in f.consumers)
            if self.custom:
                self.emit(2, f"aie.objectfifo @{f.name}({tile_name(f.producer)}, {{{cons}}}, "
                          f"{f.depth} : i32) : {fifo_type(f)}")
            else:
                types = ", ".join(["index"] * (1 + len(f.consumers)))
                per_consumer = ", ".join("[]" for _ in f.consumers)
                self.emit(2, f'"aie.objectfifo"({tile_name(f.producer)}, {cons}) '
                          f"<{{dimensionsFromStreamPerConsumer = #aie<bd_dim_layout_array_array"
                          f"[{per_consumer}]>, dimensionsToStream = #aie<bd_dim_layout_array[]>,"
                          f" elemNumber = {f.depth} : i32, elemType = {fifo_type(f)}, "
                          f'sym_name = "{f.name}"}}> : ({types}) -> ()')
        for k in d.links:
            srcs = ", ".join(f"@{s}" for s in k.srcs)
            dsts = ", ".join(f"@{s}" for s in k.dsts)
            src_off = list(k.offsets) if k.kind == "join" else []
            dst_off = list(k.offsets) if k.kind == "split" else []
            if self.custom:
                self.emit(2, f"aie.objectfifo.link [{srcs}] -> [{dsts}] ({src_off} {dst_off})")
            else:
                self.emit(2, f'"aie.objectfifo.link"() <{{dst_offsets = {dst_off}, fifoIns = '
                          f"[{srcs}], fifoOuts = [{dsts}], src_offsets = {src_off}}}> : "
                          "() -> ()")
        for b in d.buffers:
            t = memref(b.shape, b.dtype)
            self.emit(2, f'%{b.name} = aie.buffer({tile_name(b.tile)}) {{sym_name = "{b.name}"}} '
                      f": {t}" if self.custom else
                      f'%{b.name} = "aie.buffer"({tile_name(b.tile)}) <{{sym_name = "{b.name}"}}> '
                      f": (index) -> {t}")
        for core in d.cores:
            self.core(core)
        if self.sequences[0][0] is d:
            self.sequence()
        else:  # a pack: each member's sequence, its own descriptor ids
            for member, name in self.sequences:
                w = Writer(member, self.custom)
                w.sequence(name)
                self.lines += w.lines
        self.lines += device_close(self.custom)

    def core(self, core) -> None:
        """The core's program, one iteration per dispatch, until reconfiguration."""
        name = f"%core_{core.tile.col}_{core.tile.row}"
        while name in self.cores_named:  # a second core on one tile: verify names the fault
            name += "_again"
        self.cores_named.add(name)
        if self.custom:
            self.emit(2, f"{name} = aie.core({tile_name(core.tile)}) {{")
        else:
            self.emit(2, f'{name} = "aie.core"({tile_name(core.tile)}) ({{')
        self.held: dict[str, str] = {}
        self.ivs: list[str] = []
        self.consts: dict[tuple, str] = {}
        program = (Loop(FOREVER, core.body),)
        for op in walk_ops(program):  # constants first: one definition each, used in the loops
            if isinstance(op, Loop):
                for v in (0, op.count, 1):
                    self.const(3, v, "index")
            elif isinstance(op, Call):
                for a in op.args:
                    if isinstance(a, Iv):
                        self.const(3, a.scale, "i32")
                    elif isinstance(a, (int, float)):
                        self.const(3, a, self.arg_type(a))
        self.body(3, program)
        self.emit(3, "aie.end" if self.custom else '"aie.end"() : () -> ()')
        self.emit(2, "}" if self.custom else "}) : (index) -> index")

    def body(self, depth: int, ops) -> None:
        for op in ops:
            if isinstance(op, Loop):
                lo, step = (self.const(depth, v, "index") for v in (0, 1))
                hi = self.const(depth, op.count, "index")
                iv = self.fresh("i")
                if self.custom:
                    self.emit(depth, f"scf.for {iv} = {lo} to {hi} step {step} {{")
                else:
                    self.emit(depth, f'"scf.for"({lo}, {hi}, {step}) ({{')
                    self.emit(depth, f"^bb0({iv}: index):")
                self.ivs.append(iv)
                self.body(depth + 1, op.body)
                self.ivs.pop()
                if self.custom:
                    self.emit(depth, "}")
                else:
                    self.emit(depth + 1, '"scf.yield"() : () -> ()')
                    self.emit(depth, "}) : (index, index, index) -> ()")
            elif isinstance(op, Acquire):
                f = self.fifos[op.fifo]
                word = op.port.capitalize()
                sub, elem = self.fresh("s"), self.fresh("e")
                mt = memref(f.shape, f.dtype)
                if self.custom:
                    self.emit(depth, f"{sub} = aie.objectfifo.acquire @{f.name}({word}, 1) : "
                              f"{subview_type(f)}")
                    self.emit(depth, f"{elem} = aie.objectfifo.subview.access {sub}[0] : "
                              f"{subview_type(f)} -> {mt}")
                else:
                    self.emit(depth, f'{sub} = "aie.objectfifo.acquire"() <{{objFifo_name = '
                              f"@{f.name}, port = {OBJECTFIFO_PORT[word]} : i32, size = 1 : "
                              f"i32}}> : () -> {subview_type(f)}")
                    self.emit(depth, f'{elem} = "aie.objectfifo.subview.access"({sub}) '
                              f"<{{index = 0 : i32}}> : ({subview_type(f)}) -> {mt}")
                self.held[op.fifo] = elem
            elif isinstance(op, Release):
                word = op.port.capitalize()
                self.emit(depth, f"aie.objectfifo.release @{op.fifo}({word}, 1)" if self.custom
                          else f'"aie.objectfifo.release"() <{{objFifo_name = @{op.fifo}, '
                          f"port = {OBJECTFIFO_PORT[word]} : i32, size = 1 : i32}}> : () -> ()")
            elif isinstance(op, Call):
                self.call(depth, op)

    def call(self, depth: int, op: Call) -> None:
        values = []
        for a in op.args:
            if isinstance(a, Buf):
                values.append(f"%{a.name}")
            elif isinstance(a, str):
                values.append(self.held[a])
            elif isinstance(a, Iv):
                iv = self.ivs[-1 - a.level]
                x, m = self.fresh("x"), self.fresh("m")
                scale = self.const(depth, a.scale, "i32")
                if self.custom:
                    self.emit(depth, f"{x} = arith.index_cast {iv} : index to i32")
                    self.emit(depth, f"{m} = arith.muli {x}, {scale} : i32")
                else:
                    self.emit(depth, f'{x} = "arith.index_cast"({iv}) : (index) -> i32')
                    self.emit(depth, f'{m} = "arith.muli"({x}, {scale}) <{{overflowFlags = '
                              "#arith.overflow<none>}> : (i32, i32) -> i32")
                values.append(m)
            else:
                values.append(self.const(depth, a, self.arg_type(a)))
        types = ", ".join(self.arg_type(a) for a in op.args)
        if self.custom:
            self.emit(depth, f"func.call @{op.function}({', '.join(values)}) : ({types}) -> ()")
        else:
            self.emit(depth, f'"func.call"({", ".join(values)}) <{{callee = '
                      f"@{op.function}}}> : ({types}) -> ()")

    def sequence(self, name: str = "sequence") -> None:
        d = self.d
        types = [memref((a.numel,), a.dtype) for a in d.args]
        params = ", ".join(f"%arg{i}: {t}" for i, t in enumerate(types))
        if self.custom:
            self.emit(2, f"aie.runtime_sequence @{name}({params}) {{")
        else:
            self.emit(2, f'"aie.runtime_sequence"() <{{sym_name = "{name}"}}> ({{')
            self.emit(2, f"^bb0({params}):")
        for phase, ids in zip(d.sequence, self.bd_ids):
            for t, ident in zip(phase, ids):
                p = t.pattern
                offsets = [0] * (len(p.sizes) - 1) + [p.offset]
                token = str(t.direction == "out").lower()  # outputs are waited on
                if self.custom:
                    self.emit(3, f"aiex.npu.dma_memcpy_nd(%arg{t.arg}{offsets}{list(p.sizes)}"
                              f"{list(p.strides)}) {{id = {ident} : i64, issue_token = {token}, "
                              f"metadata = @{t.fifo}}} : {types[t.arg]}")
                else:
                    arr = lambda v: f"array<i64: {', '.join(map(str, v))}>"  # noqa: E731
                    self.emit(3, f'"aiex.npu.dma_memcpy_nd"(%arg{t.arg}) <{{id = {ident} : i64, '
                              f"issue_token = {token}, metadata = @{t.fifo}, operandSegmentSizes"
                              f" = array<i32: 1, 0, 0, 0>, static_offsets = {arr(offsets)}, "
                              f"static_sizes = {arr(p.sizes)}, static_strides = "
                              f"{arr(p.strides)}}}> : ({types[t.arg]}) -> ()")
            for t in phase:
                if t.direction == "out":
                    self.emit(3, f"aiex.npu.dma_wait {{symbol = @{t.fifo}}}" if self.custom
                              else f'"aiex.npu.dma_wait"() <{{symbol = @{t.fifo}}}> : () -> ()')
        self.emit(2, "}" if self.custom else "}) : () -> ()")


def device_open(device: str, symbol: str | None, custom: bool) -> str:
    """The first line of an ``aie.device`` op; ``symbol`` names it."""
    if custom:
        return f"aie.device({device}) {'@' + symbol + ' ' if symbol else ''}{{"
    name = f', sym_name = "{symbol}"' if symbol else ""
    return f'"aie.device"() <{{device = {AIE_DEVICE[device]} : i32{name}}}> ({{'


def device_close(custom: bool) -> list[str]:
    """The lines closing an ``aie.device`` op at depth 1 (its ``aie.end``, explicit in generic
    form)."""
    return ["  }"] if custom else ['    "aie.end"() : () -> ()', "  }) : () -> ()"]


def render(design: Design, generic: bool = False) -> str:
    """The design's MLIR-AIE module, custom form unless ``generic``."""
    return Writer(design, custom=not generic).render()


__all__ = ["render", "SYNTAX", "DTYPE_BYTES", "walk_ops"]
