"""Consecutive NPU steps of a program folded into one device configuration: one dispatch.

Without folding every NPU step is its own XRT kernel run (a dispatch, about 45 us of host
work each, ``resources.DISPATCH_SECONDS``), with a round trip to the host between steps.
mlir-aie expresses several designs behind one dispatch as one module of several named
``aie.device`` ops (PR #2532, "Allow multiple devices in one design"): each design keeps its
own device, tiles, object FIFOs, cores and runtime sequence, and a main device's runtime
sequence runs them in order with ``aiex.configure @dev { aiex.run @sequence(...) }``
(configure: load that device's configuration, program memories and stream switches;
run: inline its runtime sequence with the given buffers; lowered since PR #2775).  That is
how upstream IRON runs its Llama decoder (amd/IRON PR #71, ``iron/common/compilation/
fusion.py``): the operators of a layer in one fused runtime sequence, its buffers carved out of
three byte buffers with ``memref.view``, consecutive runs of one operator under one configure.
``Fold`` is that module as data, drawn from designs iron already has, so a new design folds
with nothing of its own:

- the designs never share the array: each ``aiex.configure`` reloads it, so their tiles,
  channels, locks and memories are checked per design (``check``) and cannot collide; the cost
  is a reconfiguration per change of design, the same number as when each step is its own
  dispatch of its own configuration;
- a design's runtime sequence must end with a wait (``aiex.npu.dma_wait`` on an output):
  reconfiguring under a transfer still running would reprogram its buffer descriptors, so a
  design whose last phase waits on nothing ends its fold.  Each run's sequence keeps its own
  buffer-descriptor ids (``bds``): every id is free again after the run's last wait;
- the host buffers: XRT binds a handful of buffer objects to an NPU kernel run, so, as upstream,
  every tensor the fold touches lies in one of three byte buffers (``BUFFERS``: the weights,
  the tensors the host reads or writes, and the fold's own intermediates), each at a 64-byte
  aligned offset, and reaches its design as a ``memref.view`` of it.  The intermediates never
  travel to the host: a step's output is the next step's input in device memory.  An output
  an operator writes in place of an input (its class's ``inplace``: output position -> input
  position, a KV cache) shares that input's place.

``plan`` cuts a program into host steps and folds (maximal runs of consecutive NPU steps);
``render`` writes a fold's module in custom and generic form (``verify`` checks the generic
one against the transcription of mlir-aie's ODS, ``aiex.configure`` / ``aiex.run`` included);
``Configured`` runs a fold in the emulator: the tensors laid out in the three byte buffers,
every configure a load of its design on the array (``Array``: none when that design is the
one loaded already, as the firmware skips reloading the same PDI), every run a dispatch of its
design's runtime sequence on views of those buffers.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from ...errors import BundleError
from ...program import Program
from .design import DTYPE_BYTES, Design

#: The host buffers of a folded configuration, in the main runtime sequence's argument order.
BUFFERS = ("weights", "io", "scratch")
#: Byte alignment of every tensor inside its buffer (the shim DMA needs whole 32-bit words; a
#: 64-byte line keeps every tensor on its own line).
ALIGN = 64
#: The main device's and every runtime sequence's symbol (upstream IRON's fusion names them so).
MAIN, SEQUENCE = "main", "sequence"


@dataclass(frozen=True)
class Slot:
    """Where a tensor lies: ``buffer`` (index into ``BUFFERS``), byte ``offset``, size."""

    buffer: int
    offset: int
    nbytes: int


@dataclass(frozen=True)
class Run:
    """One step inside a fold: its design (index into ``Fold.designs``) and the program tensor
    behind each of the design's runtime arguments."""

    step: int
    design: int
    tensors: tuple[int, ...]


@dataclass(frozen=True)
class Fold:
    """One device configuration running several consecutive steps: one dispatch."""

    name: str
    device: str
    designs: tuple[Design, ...]
    runs: tuple[Run, ...]
    slots: tuple[tuple[int, Slot], ...]  # program tensor -> its place
    sizes: tuple[int, ...]  # bytes of each of BUFFERS
    reads: tuple[int, ...]  # tensors the fold takes from the host (weights included)
    writes: tuple[int, ...]  # tensors the host reads after it

    def configures(self) -> list[tuple[int, list[Run]]]:
        """The main sequence: consecutive runs of one design under one configure."""
        out: list[tuple[int, list[Run]]] = []
        for run in self.runs:
            if out and out[-1][0] == run.design:
                out[-1][1].append(run)
            else:
                out.append((run.design, [run]))
        return out

    def slot(self, tensor: int) -> Slot:
        return dict(self.slots)[tensor]

    def symbol(self, design: int) -> str:
        return f"d{design}_{Path(self.designs[design].kernel_source).stem}"


def ends_with_wait(design: Design) -> bool:
    """Whether every transfer has finished when the design's runtime sequence returns: its
    last phase waits on an output (a wait covers the phase's inputs, ``bds``)."""
    return bool(design.sequence) and any(t.direction == "out" for t in design.sequence[-1])


def plan(program: Program, designs: Sequence[Design | None], fold: bool = True
         ) -> list[int | Fold]:
    """The program as host steps (their index) and folds, in order.  ``fold=False``: one fold
    per NPU step, each its own dispatch (how the steps ran before folding)."""
    segments: list[int | Fold] = []
    current: list[int] = []

    def close():
        if current:
            k = sum(isinstance(s, Fold) for s in segments)
            segments.append(make_fold(program, designs, list(current), k))
            current.clear()

    for i, design in enumerate(designs):
        if design is None:
            close()
            segments.append(i)
            continue
        if current and (not fold or designs[current[-1]].device != design.device):
            close()
        current.append(i)
        if not ends_with_wait(design):
            close()
    close()
    return segments


def make_fold(program: Program, designs: Sequence[Design | None], steps: list[int],
              k: int) -> Fold:
    found: dict[int, int] = {}  # id(design) -> index
    distinct: list[Design] = []
    runs = []
    for i in steps:
        d = designs[i]
        if id(d) not in found:
            found[id(d)] = len(distinct)
            distinct.append(d)
        step = program.steps[i]
        tensors = tuple(step.inputs) + tuple(step.outputs)
        if len(tensors) != len(d.args):
            raise BundleError(f"step {i} ({step.op.describe()}) has {len(tensors)} tensors, "
                              f"its design {len(d.args)} runtime arguments")
        runs.append(Run(i, found[id(d)], tensors))
    inside = set(steps)
    used_outside = {t for j, s in enumerate(program.steps) if j not in inside
                    for t in (*s.inputs, *s.outputs)} | set(program.outputs)
    written: set[int] = set()
    reads: list[int] = []
    writes: list[int] = []
    kinds: dict[int, int] = {}
    alias: dict[int, int] = {}  # an output written in place -> the input whose place it takes
    for run in runs:
        d = distinct[run.design]
        step = program.steps[run.step]
        n_in = len(step.inputs)
        for k, j in type(step.op).inplace.items():
            source = step.inputs[j]
            if step.outputs[k] != source:  # a state is often its own output: one tensor
                alias[step.outputs[k]] = alias.get(source, source)
        for pos, t in enumerate(run.tensors):
            tensor = program.tensors[t]
            if tensor.kind == "weight":
                kinds[t] = 0
            elif tensor.kind == "temp" and t not in used_outside:
                kinds.setdefault(t, 2)
            else:
                kinds[t] = 1
            arg = d.args[pos]
            if arg.dtype not in DTYPE_BYTES:
                raise BundleError(f"step {run.step}: design argument {arg.name} has dtype "
                                  f"{arg.dtype!r}, which iron.targets.npu.design.DTYPE_BYTES "
                                  "does not size")
            want = arg.numel * DTYPE_BYTES[arg.dtype]
            have = int(np.prod(tensor.shape)) * np.dtype(tensor.dtype).itemsize
            if arg.numel and want != have:  # numel 0: sized by the caller (the tensor)
                raise BundleError(f"step {run.step}: design argument {arg.name} is {want} "
                                  f"bytes, the program's tensor {t} ({tensor.name or 'temp'}) "
                                  f"{have} bytes")
            if pos < n_in and t not in written and t not in reads:
                reads.append(t)
            if pos >= n_in:
                written.add(t)
                if kinds[t] == 1 and t not in writes:
                    writes.append(t)
    for t, source in alias.items():  # one place for both: the host's if either is the host's
        if kinds.pop(t) == 1:
            kinds[source] = 1
    sizes = [0] * len(BUFFERS)
    placed: dict[int, Slot] = {}
    for t in sorted(kinds, key=lambda t: (kinds[t], t)):
        b = kinds[t]
        tensor = program.tensors[t]
        nbytes = int(np.prod(tensor.shape)) * np.dtype(tensor.dtype).itemsize
        placed[t] = Slot(b, sizes[b], nbytes)
        sizes[b] += -(-nbytes // ALIGN) * ALIGN
    slots = [(t, placed[t]) for t in placed] + [(t, placed[s]) for t, s in alias.items()]
    device = distinct[0].device
    return Fold(f"fold{k}", device, tuple(distinct), tuple(runs), tuple(slots), tuple(sizes),
                tuple(reads), tuple(writes))


# ---- the module -------------------------------------------------------------------------------


def render(fold: Fold, generic: bool = False) -> str:
    """The fold's MLIR-AIE module: every design's device under its symbol, then the main
    device whose runtime sequence configures and runs them (custom form unless ``generic``)."""
    from .mlir import Writer, device_close, device_open, memref

    custom = not generic
    lines = ["module {" if custom else '"builtin.module"() ({']
    for k, design in enumerate(fold.designs):
        w = Writer(design, custom, fold.symbol(k))
        w.device()
        lines += w.lines
    used = [b for b in range(len(BUFFERS)) if fold.sizes[b]]
    buf_type = {b: f"memref<{fold.sizes[b]}xi8>" for b in used}
    arg = {b: f"%{BUFFERS[b]}" for b in used}
    params = ", ".join(f"{arg[b]}: {buf_type[b]}" for b in used)
    lines.append("  " + device_open(fold.device, MAIN, custom))
    if custom:
        lines.append(f"    aie.runtime_sequence @{SEQUENCE}({params}) {{")
    else:
        lines.append(f'    "aie.runtime_sequence"() <{{sym_name = "{SEQUENCE}"}}> ({{')
        lines.append(f"    ^bb0({params}):")
    n = 0
    for k, runs in fold.configures():
        design = fold.designs[k]
        lines.append(f"      aiex.configure @{fold.symbol(k)} {{" if custom else
                     f'      "aiex.configure"() <{{symbol = @{fold.symbol(k)}}}> ({{')
        for run in runs:
            values, types = [], []
            for t, a in zip(run.tensors, design.args):
                s = fold.slot(t)
                n += 1
                c, v, size = f"%c{n}", f"%v{n}", f"%n{n}"
                ty = memref((a.numel or "?",), a.dtype)  # ?: the tensor gives the size
                sizes = [] if a.numel else [(size, s.nbytes // DTYPE_BYTES[a.dtype])]
                for name, value in [(c, s.offset), *sizes]:
                    lines.append(f"        {name} = arith.constant {value} : index" if custom
                                 else f'        {name} = "arith.constant"() <{{value = '
                                 f"{value} : index}}> : () -> index")
                dyn = ", ".join(name for name, _ in sizes)
                if custom:
                    lines.append(f"        {v} = memref.view {arg[s.buffer]}[{c}][{dyn}] : "
                                 f"{buf_type[s.buffer]} to {ty}")
                else:
                    operands = ", ".join([arg[s.buffer], c, *(x for x, _ in sizes)])
                    kinds = ", ".join([buf_type[s.buffer], "index", *("index" for _ in sizes)])
                    lines.append(f'        {v} = "memref.view"({operands}) : ({kinds}) -> {ty}')
                values.append(v)
                types.append(ty)
            if custom:
                lines.append(f"        aiex.run @{SEQUENCE}({', '.join(values)}) : "
                             f"({', '.join(types)})")
            else:
                lines.append(f'        "aiex.run"({", ".join(values)}) <{{runtime_sequence_'
                             f'symbol = @{SEQUENCE}}}> : ({", ".join(types)}) -> ()')
        lines.append("      }" if custom else "      }) : () -> ()")
    lines.append("    }" if custom else "    }) : () -> ()")
    lines += device_close(custom)
    lines.append("}" if custom else "}) : () -> ()")
    return "\n".join(lines) + "\n"


# ---- running it -------------------------------------------------------------------------------


class Array:
    """The NPU array of one executable in the emulator: the configuration loaded last.  A
    configure of the design already loaded loads nothing (the firmware skips reloading the
    same PDI), so its cores keep looping where the last dispatch left them; any other design
    is a fresh load (cores starting, FIFOs empty)."""

    def __init__(self, lib: str):
        self.lib = lib
        self.loaded = None  # (design, Emulation)
        self.loads = 0

    def configure(self, design: Design):
        from .emulator import Emulation

        if self.loaded is None or self.loaded[0] is not design:
            self.loaded = (design, Emulation(design, self.lib))
            self.loads += 1
        return self.loaded[1]


class Configured:
    """A fold in the emulator: its three byte buffers, and one ``dispatch`` per call."""

    def __init__(self, fold: Fold, array: Array):
        from .emulator import NP_DTYPE

        self.fold, self.array = fold, array
        self.buffers = [np.zeros(max(n, 1), np.uint8) for n in fold.sizes]
        self.np_dtype = NP_DTYPE
        self.dispatches = 0
        self.bound: dict[int, np.ndarray] = {}  # weight tensor -> the array put in place

    def view(self, tensor: int, dtype: str) -> np.ndarray:
        s = self.fold.slot(tensor)
        return self.buffers[s.buffer][s.offset:s.offset + s.nbytes].view(self.np_dtype[dtype])

    def put(self, tensor: int, value: np.ndarray) -> None:
        """Write a tensor the host holds into its place (before the dispatch); a weight once,
        while the host binds the same array (weights are bound once, not changed)."""
        s = self.fold.slot(tensor)
        if s.buffer == 0:
            if self.bound.get(tensor) is value:
                return
            self.bound[tensor] = value
        raw = np.ascontiguousarray(value).reshape(-1).view(np.uint8)
        self.buffers[s.buffer][s.offset:s.offset + s.nbytes] = raw

    def get(self, tensor: int, dtype: np.dtype, shape) -> np.ndarray:
        """A tensor out of its place (after the dispatch), as the host reads it."""
        s = self.fold.slot(tensor)
        return self.buffers[s.buffer][s.offset:s.offset + s.nbytes].view(dtype).reshape(
            shape).copy()

    def dispatch(self) -> None:
        """The main runtime sequence once: per configure its design loaded on the array
        (``Array``), each run a dispatch of that design's sequence on views of the buffers."""
        for k, runs in self.fold.configures():
            design = self.fold.designs[k]
            loaded = self.array.configure(design)
            for run in runs:
                loaded.dispatch([self.view(t, a.dtype) for t, a in zip(run.tensors,
                                                                       design.args)])
        self.dispatches += 1
