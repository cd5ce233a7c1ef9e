"""A design as MLIR-AIE text, in custom form (what aiecc.py reads) and in generic form.

The custom form follows mlir-aie's object-FIFO dialect syntax as of mlir-aie v1.1
(``aie.device``, ``aie.tile``, ``aie.objectfifo``, ``aie.objectfifo.link``, ``aie.core``
with ``scf.for`` loops and ``func.call`` s to the core kernels, ``aiex.runtime_sequence`` with
``aiex.npu.dma_memcpy_nd`` and ``aiex.npu.dma_wait``).  The generic form is the same module in
MLIR's generic operation syntax, which any MLIR tool parses without the AIE dialect
(``mlir-opt --allow-unregistered-dialect``), so the standard dialects inside (arith, scf,
func) are verified by upstream MLIR itself.
"""

from __future__ import annotations

from .design import DTYPE_BYTES, Acquire, Buf, Call, Design, Fifo, Iv, Loop, Release, walk_ops

SYNTAX = "mlir-aie v1.1 (object FIFO dialect)"
ELEM = {"bf16": "bf16", "f32": "f32", "i32": "i32"}
PORT = {"produce": ("Produce", 0), "consume": ("Consume", 1)}


def memref(shape, dtype: str) -> str:
    return f"memref<{'x'.join(map(str, shape))}x{ELEM[dtype]}>"


def fifo_type(f: Fifo) -> str:
    return f"!aie.objectfifo<{memref(f.shape, f.dtype)}>"


def subview_type(f: Fifo) -> str:
    return f"!aie.objectfifosubview<{memref(f.shape, f.dtype)}>"


def tile_name(t) -> str:
    return f"%tile_{t.col}_{t.row}"


class Writer:
    """Shared walk of a design; ``custom`` selects the syntax of every line."""

    def __init__(self, design: Design, custom: bool):
        self.d, self.custom = design, custom
        self.lines: list[str] = []
        self.n = 0
        self.fifos = {f.name: f for f in design.fifos}

    def fresh(self, stem: str = "v") -> str:
        self.n += 1
        return f"%{stem}{self.n}"

    def emit(self, depth: int, text: str) -> None:
        self.lines.append("  " * depth + text)

    def arg_type(self, a) -> str:
        if isinstance(a, float):
            return "f32"
        if isinstance(a, (int, Iv)):
            return "i32"
        if isinstance(a, Buf):
            b = next(b for b in self.d.buffers if b.name == a.name)
            return memref(b.shape, b.dtype)
        f = self.fifos[a]
        return memref(f.shape, f.dtype)

    def const(self, depth: int, value, kind: str) -> str:
        name = self.fresh("c")
        lit = f"{value:.8e}" if kind == "f32" else str(value)  # MLIR floats need a point
        if self.custom:
            self.emit(depth, f"{name} = arith.constant {lit} : {kind}")
        else:
            self.emit(depth, f'{name} = "arith.constant"() <{{value = {lit} : {kind}}}> : '
                      f"() -> {kind}")
        return name

    # ---- the module ------------------------------------------------------------------------

    def render(self) -> str:
        d = self.d
        self.emit(0, "module {")
        self.emit(1, f"aie.device({d.device}) {{" if self.custom else
                  f'"aie.device"() <{{device = "{d.device}"}}> ({{')
        for name, args in sorted(d.functions().items()):
            ftype = f"({', '.join(self.arg_type(a) for a in args)}) -> ()"
            if self.custom:
                types = ", ".join(self.arg_type(a) for a in args)
                self.emit(2, f"func.func private @{name}({types})")
            else:
                self.emit(2, f'"func.func"() <{{function_type = {ftype}, sym_name = "{name}", '
                          'sym_visibility = "private"}> ({}) : () -> ()')
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
                self.emit(2, f'"aie.objectfifo"({tile_name(f.producer)}, {cons}) <{{elemNumber = '
                          f'{f.depth} : i32, elemType = {fifo_type(f)}, sym_name = "{f.name}"}}> : '
                          f"({types}) -> ()")
        for k in d.links:
            srcs = ", ".join(f"@{s}" for s in k.srcs)
            dsts = ", ".join(f"@{s}" for s in k.dsts)
            src_off = list(k.offsets) if k.kind == "join" else []
            dst_off = list(k.offsets) if k.kind == "split" else []
            if self.custom:
                self.emit(2, f"aie.objectfifo.link [{srcs}] -> [{dsts}] ({src_off} {dst_off})")
            else:
                self.emit(2, f'"aie.objectfifo.link"() <{{fifoIns = [{srcs}], fifoOuts = '
                          f"[{dsts}], src_offsets = array<i64{': ' if src_off else ''}"
                          f"{', '.join(map(str, src_off))}>, dst_offsets = array<i64"
                          f"{': ' if dst_off else ''}{', '.join(map(str, dst_off))}>}}> : () -> ()")
        for b in d.buffers:
            t = memref(b.shape, b.dtype)
            self.emit(2, f'%{b.name} = aie.buffer({tile_name(b.tile)}) {{sym_name = "{b.name}"}} '
                      f": {t}" if self.custom else
                      f'%{b.name} = "aie.buffer"({tile_name(b.tile)}) <{{sym_name = "{b.name}"}}> '
                      f": (index) -> {t}")
        for core in d.cores:
            self.core(core)
        self.sequence()
        self.emit(1, "}" if self.custom else "}) : () -> ()")
        self.emit(0, "}")
        return "\n".join(self.lines) + "\n"

    def core(self, core) -> None:
        name = f"%core_{core.tile.col}_{core.tile.row}"
        if self.custom:
            self.emit(2, f"{name} = aie.core({tile_name(core.tile)}) {{")
        else:
            self.emit(2, f'{name} = "aie.core"({tile_name(core.tile)}) ({{')
        self.held: dict[str, str] = {}
        self.ivs: list[str] = []
        self.body(3, core.body)
        self.emit(3, "aie.end" if self.custom else '"aie.end"() : () -> ()')
        link = f'link_with = "{self.d.kernel_source.replace(".c", ".o")}"'
        self.emit(2, f"}} {{{link}}}" if self.custom else
                  f"}}) {{{link}}} : (index) -> index")

    def body(self, depth: int, ops) -> None:
        for op in ops:
            if isinstance(op, Loop):
                lo, hi, step = (self.const(depth, v, "index") for v in (0, op.count, 1))
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
                word, num = PORT[op.port]
                sub, elem = self.fresh("s"), self.fresh("e")
                mt = memref(f.shape, f.dtype)
                if self.custom:
                    self.emit(depth, f"{sub} = aie.objectfifo.acquire @{f.name}({word}, 1) : "
                              f"{subview_type(f)}")
                    self.emit(depth, f"{elem} = aie.objectfifo.subview.access {sub}[0] : "
                              f"{subview_type(f)} -> {mt}")
                else:
                    self.emit(depth, f'{sub} = "aie.objectfifo.acquire"() <{{objFifo_name = '
                              f"@{f.name}, port = {num} : i32, size = 1 : i32}}> : () -> "
                              f"{subview_type(f)}")
                    self.emit(depth, f'{elem} = "aie.objectfifo.subview.access"({sub}) '
                              f"<{{index = 0 : i32}}> : ({subview_type(f)}) -> {mt}")
                self.held[op.fifo] = elem
            elif isinstance(op, Release):
                word, num = PORT[op.port]
                self.emit(depth, f"aie.objectfifo.release @{op.fifo}({word}, 1)" if self.custom
                          else f'"aie.objectfifo.release"() <{{objFifo_name = @{op.fifo}, '
                          f"port = {num} : i32, size = 1 : i32}}> : () -> ()")
            elif isinstance(op, Call):
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
                            self.emit(depth, f'{m} = "arith.muli"({x}, {scale}) : '
                                      "(i32, i32) -> i32")
                        values.append(m)
                    else:
                        values.append(self.const(depth, a, self.arg_type(a)))
                types = ", ".join(self.arg_type(a) for a in op.args)
                if self.custom:
                    self.emit(depth, f"func.call @{op.function}({', '.join(values)}) : "
                              f"({types}) -> ()")
                else:
                    self.emit(depth, f'"func.call"({", ".join(values)}) <{{callee = '
                              f"@{op.function}}}> : ({types}) -> ()")

    def sequence(self) -> None:
        d = self.d
        types = [memref((a.numel,), a.dtype) for a in d.args]
        params = ", ".join(f"%arg{i}: {t}" for i, t in enumerate(types))
        if self.custom:
            self.emit(2, f"aiex.runtime_sequence @sequence({params}) {{")
        else:
            self.emit(2, '"aiex.runtime_sequence"() <{sym_name = "sequence"}> ({')
            self.emit(2, f"^bb0({params}):")
        ident = 0
        for phase in d.sequence:
            for t in phase:
                p = t.pattern
                offsets = [0] * (len(p.sizes) - 1) + [p.offset]
                if self.custom:
                    self.emit(3, f"aiex.npu.dma_memcpy_nd(%arg{t.arg}{offsets}{list(p.sizes)}"
                              f"{list(p.strides)}) {{id = {ident} : i64, metadata = @{t.fifo}, "
                              f"issue_token = {str(t.direction == 'out').lower()}}} : "
                              f"{types[t.arg]}")
                else:
                    arr = lambda v: f"array<i64: {', '.join(map(str, v))}>"  # noqa: E731
                    self.emit(3, f'"aiex.npu.dma_memcpy_nd"(%arg{t.arg}) <{{id = {ident} : i64, '
                              f"metadata = @{t.fifo}, static_offsets = {arr(offsets)}, "
                              f"static_sizes = {arr(p.sizes)}, static_strides = "
                              f"{arr(p.strides)}}}> : ({types[t.arg]}) -> ()")
                ident += 1
            for t in phase:
                if t.direction == "out":
                    self.emit(3, f"aiex.npu.dma_wait {{symbol = @{t.fifo}}}" if self.custom
                              else f'"aiex.npu.dma_wait"() <{{symbol = @{t.fifo}}}> : () -> ()')
        self.emit(2, "}" if self.custom else "}) : () -> ()")


def render(design: Design, generic: bool = False) -> str:
    """The design's MLIR-AIE module, custom form unless ``generic``."""
    return Writer(design, custom=not generic).render()


__all__ = ["render", "SYNTAX", "DTYPE_BYTES", "walk_ops"]
