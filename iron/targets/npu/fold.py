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
fusion.py``): the operators of a layer in one fused runtime sequence, its tensors carved out of
three host buffers by ``memref.subview`` + ``memref.reinterpret_cast``, consecutive runs of one
operator under one configure.
``Fold`` is that module as data, drawn from designs iron already has, so a new design folds
with nothing of its own:

- each ``aiex.configure`` loads one configuration: a design's own device, or (``plan``'s
  ``packed``, the default) a pack of consecutive designs merged into one device side by side,
  each member in columns of its own with its symbols renamed and its own runtime sequence,
  which the configure's ``aiex.run`` names (``coresidence``, as upstream IRON packs them).
  Stepping between members of a loaded pack loads nothing; any other change of configuration
  costs a reconfiguration (``resources.SWITCH_SECONDS``).  Every design's tiles, channels,
  locks and memories are checked per design (``check``), and ``verify`` checks each merged
  device with every rule;
- a design's runtime sequence must end with a wait (``aiex.npu.dma_wait`` on an output):
  reconfiguring under a transfer still running would reprogram its buffer descriptors, so a
  design whose last phase waits on nothing ends its fold.  Each run's sequence keeps its own
  buffer-descriptor ids (``bds``): every id is free again after the run's last wait;
- the host buffers: XRT binds a handful of buffer objects to an NPU kernel run, so, as upstream,
  every tensor the fold touches lies in a few host buffers, one per role (``ROLES``: the
  weights, the tensors the host reads or writes, the fold's own intermediates) and element
  type (``HostBuffer``), each tensor at a 64-byte aligned offset.  A tensor reaches its design
  as upstream IRON's fusion builds it: a ``memref.subview`` of its buffer (static offset, size
  and unit stride) and a ``memref.reinterpret_cast`` to the callee's static type, which
  ``aiex.run`` requires exactly.  mlir-aie's DMA-to-NPU lowering finds a transfer's host
  buffer and byte offset by ``traceSubviewToBlockArgument`` (``lib/Dialect/AIEX/Utils/
  AIEUtils.cpp``), which follows only ``memref.subview``, ``memref.cast`` and
  ``memref.reinterpret_cast`` with static offsets, sizes and strides: a ``memref.view`` (the
  only op that turns bytes into another element type) is not followed, hence a buffer per
  element type (every design's arguments have static sizes).  The intermediates never travel
  to the host: a step's output is the next step's input in device memory.  An output an
  operator writes in place of an input (its class's ``inplace``: output position -> input
  position, a KV cache) shares that input's place;
- the devices that have folds: a multi-device module compiles only to a full ELF (aiecc's
  ``--generate-full-elf``, ``aiecc``), which npu2 (AIE2P) has and npu1 (Phoenix, AIE2) does
  not (amd/Triton-XDNA #53: "full ELF is not supported for Phoenix"; mlir-air restricts its
  ELF output to npu2 because it needs ``aiebu-asm aie2_config``).  On npu1 every NPU step is
  its own xclbin and instruction stream, dispatched alone, as upstream IRON runs Phoenix
  (``FULL_ELF_DEVICES``, ``plan``).

``plan`` cuts a program into host steps and folds (maximal runs of consecutive NPU steps; on
npu1 one step each);
``render`` writes a fold's module in custom and generic form (``verify`` checks the generic
one against the transcription of mlir-aie's ODS, ``aiex.configure`` / ``aiex.run`` included);
``Configured`` runs a fold in the emulator: the tensors laid out in its host buffers,
every configure a load of its configuration on the array (``Array``: none when it is the one
loaded already, as the firmware skips reloading the same PDI), every run a dispatch of its
design's runtime sequence, as the configuration holds the design, on views of those buffers.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from ...errors import BundleError
from ...program import Program
from .coresidence import Pack, make_pack, pack
from .ir import DTYPE_BYTES, Arg, Design, Place
from .resources import resources

#: The roles of a folded configuration's host buffers, in the main runtime sequence's argument
#: order (each role has a buffer per element type it holds).
ROLES = ("weights", "io", "scratch")
#: The devices whose folds compile: those with a full-ELF flow (see the module docstring).
FULL_ELF_DEVICES = ("npu2",)
#: Byte alignment of every tensor inside its buffer (the shim DMA needs whole 32-bit words; a
#: 64-byte line keeps every tensor on its own line).
ALIGN = 64
#: The main device's and every runtime sequence's symbol (upstream IRON's fusion names them so).
MAIN, SEQUENCE = "main", "sequence"


@dataclass(frozen=True)
class HostBuffer:
    """One argument of a fold's main runtime sequence: a role's tensors of one element type
    (a design argument's dtype), ``nbytes`` long."""

    role: str
    dtype: str
    nbytes: int

    @property
    def name(self) -> str:
        return f"{self.role}_{self.dtype}"

    @property
    def itemsize(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def numel(self) -> int:
        return self.nbytes // self.itemsize


@dataclass(frozen=True)
class Slot:
    """Where a tensor lies: ``buffer`` (index into ``Fold.buffers``), byte ``offset``, size."""

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
    buffers: tuple[HostBuffer, ...]
    reads: tuple[int, ...]  # tensors the fold takes from the host (weights included)
    writes: tuple[int, ...]  # tensors the host reads after it
    #: the device configurations the fold loads (``coresidence.Pack``: a design's own device,
    #: or designs packed side by side in one), and per design the index of the one holding it
    configurations: tuple[Pack, ...] = ()
    where: tuple[int, ...] = ()

    def configures(self) -> list[tuple[int, list[Run]]]:
        """The main sequence: consecutive runs of one configuration under one configure (index
        into ``configurations``)."""
        out: list[tuple[int, list[Run]]] = []
        for run in self.runs:
            c = self.where[run.design]
            if out and out[-1][0] == c:
                out[-1][1].append(run)
            else:
                out.append((c, [run]))
        return out

    def kernel_designs(self) -> list[Design]:
        """Every design whose kernels the fold's devices link with: each configuration's
        members, run in this fold or not (a pack is one device wherever it is loaded)."""
        return [m.design for c in self.configurations for m in c.members]

    def slot(self, tensor: int) -> Slot:
        return dict(self.slots)[tensor]


def ends_with_wait(design: Design) -> bool:
    """Whether every transfer has finished when the design's runtime sequence returns: its
    last phase waits on an output (a wait covers the phase's inputs, ``bds``)."""
    return bool(design.sequence) and any(t.direction == "out" for t in design.sequence[-1])


def folds_on(device: str) -> bool:
    """Whether ``device`` runs folds (several designs behind one dispatch): only with a
    full-ELF flow; elsewhere each NPU step is its own xclbin, dispatched alone."""
    return device in FULL_ELF_DEVICES


def plan(program: Program, designs: Sequence[Design | None], fold: bool = True,
         packed: bool = True) -> list[int | Fold]:
    """The program as host steps (their index) and folds, in order.  ``fold=False``, and on a
    device without folds (``folds_on``): one fold per NPU step, each its own dispatch (a fold
    of one step is only how the emulator runs a lone dispatch; on npu1 it is never rendered).
    ``packed`` (with folds only): consecutive designs packed side by side into one
    configuration where they fit (``coresidence.pack`` over the program's NPU steps)."""
    segments: list[int | Fold] = []
    current: list[int] = []
    packs = program_packs(designs) if fold and packed else {}

    def close():
        if current:
            k = sum(isinstance(s, Fold) for s in segments)
            segments.append(make_fold(program, designs, list(current), k, packs))
            current.clear()

    for i, design in enumerate(designs):
        if design is None:
            close()
            segments.append(i)
            continue
        alone = not (fold and folds_on(design.device))
        if current and (alone or designs[current[-1]].device != design.device):
            close()
        current.append(i)
        if not ends_with_wait(design):
            close()
    close()
    return segments


def program_packs(designs: Sequence[Design | None]) -> dict[int, Pack]:
    """id(design) -> the pack it runs in, for every design packed with others (upstream's
    adjacent packing over the program's NPU steps, on a device with folds); each pack merges
    its members in the order the program first runs them."""
    npu = [d for d in designs if d is not None and folds_on(d.device)]
    if not npu:
        return {}
    group = pack(npu, resources(npu[0].device).columns)
    members: dict[int, dict[int, Design]] = {}
    for d in npu:
        members.setdefault(group[id(d)], {})[id(d)] = d
    out: dict[int, Pack] = {}
    for g, found in members.items():
        if len(found) > 1:
            p = make_pack(f"pack{g}", list(found.values()), stem)
            out.update((i, p) for i in found)
    return out


def stem(design: Design) -> str:
    return Path(design.kernel_source).stem


def make_fold(program: Program, designs: Sequence[Design | None], steps: list[int],
              k: int, packs: dict[int, Pack] | None = None) -> Fold:
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
        if len(tensors) != len(d.placed()):
            raise BundleError(f"step {i} ({step.op.describe()}) has {len(tensors)} tensors, "
                              f"its design places {len(d.placed())}")
        runs.append(Run(i, found[id(d)], tensors))
    inside = set(steps)
    used_outside = {t for j, s in enumerate(program.steps) if j not in inside
                    for t in (*s.inputs, *s.outputs)} | set(program.outputs)
    written: set[int] = set()
    reads: list[int] = []
    writes: list[int] = []
    kinds: dict[int, int] = {}  # tensor -> its role (index into ROLES)
    elements: dict[int, str] = {}  # tensor -> the dtype its designs take it as
    alias: dict[int, int] = {}  # an output written in place -> the input whose place it takes
    for run in runs:
        d = distinct[run.design]
        step = program.steps[run.step]
        n_in = len(step.inputs)
        for out, j in type(step.op).inplace.items():
            source = step.inputs[j]
            if step.outputs[out] != source:  # a state is often its own output: one tensor
                alias[step.outputs[out]] = alias.get(source, source)
        for pos, (t, place) in enumerate(zip(run.tensors, d.placed())):
            tensor = program.tensors[t]
            if tensor.kind == "weight":
                kinds[t] = 0
            elif tensor.kind == "temp" and t not in used_outside:
                kinds.setdefault(t, 2)
            else:
                kinds[t] = 1
            arg = d.args[place.arg]
            if arg.dtype not in DTYPE_BYTES:
                raise BundleError(f"step {run.step}: design argument {arg.name} has dtype "
                                  f"{arg.dtype!r}, which iron.targets.npu.ir.DTYPE_BYTES "
                                  "does not size")
            if elements.setdefault(t, arg.dtype) != arg.dtype:
                raise BundleError(f"step {run.step}: design argument {arg.name} takes tensor {t} "
                                  f"({tensor.name or 'temp'}) as {arg.dtype}, an earlier step as "
                                  f"{elements[t]}: a fold's tensor has one element type")
            want = share(d, place) * DTYPE_BYTES[arg.dtype]
            have = int(np.prod(tensor.shape)) * np.dtype(tensor.dtype).itemsize
            if want != have:
                raise BundleError(f"step {run.step}: design argument {arg.name} gives "
                                  f"{want} bytes from element {place.offset}, the program's "
                                  f"tensor {t} ({tensor.name or 'temp'}) is {have} bytes")
            if pos < n_in and t not in written and t not in reads:
                reads.append(t)
            if pos >= n_in:
                written.add(t)
                if kinds[t] == 1 and t not in writes:
                    writes.append(t)
    for t, source in alias.items():  # one place for both: the host's if either is the host's
        if kinds.pop(t) == 1:
            kinds[source] = 1
        if elements.pop(t) != elements[source]:
            raise BundleError(f"tensor {t} is written in place of tensor {source} with another "
                              "element type")
    configurations: dict[tuple[int, ...], int] = {}
    chosen: list[Pack] = []
    where = []
    for j, d in enumerate(distinct):
        p = (packs or {}).get(id(d)) or make_pack(f"d{j}_{stem(d)}", [d], stem)
        if p.key() not in configurations:
            configurations[p.key()] = len(chosen)
            chosen.append(p)
        where.append(configurations[p.key()])
    pins = packed(program, [(distinct[r.design], r) for r in runs], alias, kinds)
    return Fold(f"fold{k}", distinct[0].device, tuple(distinct), tuple(runs),
                *layout(program, kinds, elements, alias, pins), tuple(reads), tuple(writes),
                tuple(chosen), tuple(where))


def share(design: Design, place: Place) -> int:
    """Elements of argument ``place.arg`` from ``place.offset`` up to the next tensor's start
    in it (or its end): what the tensor placed there must fill exactly."""
    starts = {p.offset for p in design.placed() if p.arg == place.arg}
    later = [o for o in starts if o > place.offset]
    return (min(later) if later else design.args[place.arg].numel) - place.offset


def starts(design: Design, tensors: Sequence[int]) -> list[int]:
    """The tensor at element 0 of each runtime argument: where the argument's window begins
    (a packed argument's other tensors follow it, ``packed``)."""
    first = {}
    for t, p in zip(tensors, design.placed()):
        if p.offset == 0:
            first.setdefault(p.arg, t)
    missing = [a.name for i, a in enumerate(design.args) if i not in first]
    if missing:
        raise BundleError(f"{design.name}: no tensor starts runtime argument {missing[0]} "
                          "(a design places one at element 0 of every argument)")
    return [first[i] for i in range(len(design.args))]


def packed(program: Program, runs: list[tuple[Design, Run]], alias: dict[int, int],
           kinds: dict[int, int]) -> dict[int, tuple[int, int, int]]:
    """The tensors a design packs behind another in one runtime argument: tensor -> (the
    argument's first tensor, byte offset from it, the argument's bytes).  They must lie there
    in every design of the fold; the group takes the role of its most host-facing member (the
    host's, else the weights', else the fold's own), so one buffer holds it."""
    pins: dict[int, tuple[int, int, int]] = {}
    for design, run in runs:
        first = starts(design, run.tensors)
        for t, p in zip(run.tensors, design.placed()):
            t, anchor = alias.get(t, t), alias.get(first[p.arg], first[p.arg])
            if t == anchor:
                continue
            arg = design.args[p.arg]
            pin = (anchor, p.offset * DTYPE_BYTES[arg.dtype], arg.numel * DTYPE_BYTES[arg.dtype])
            if pins.setdefault(t, pin)[:2] != pin[:2]:
                raise BundleError(f"step {run.step}: {design.name} packs tensor {t} "
                                  f"{pin[1]} bytes after tensor {anchor}, an earlier step "
                                  f"{pins[t][1]} bytes after tensor {pins[t][0]}: a fold "
                                  "lays a tensor out once")
    for t, (anchor, _, _) in pins.items():
        if anchor in pins:
            raise BundleError(f"tensor {anchor} starts a packed argument and is packed behind "
                              f"tensor {pins[anchor][0]} in another: a fold lays a group "
                              "out only from its first tensor")
    for anchor in {a for a, _, _ in pins.values()}:
        group = [anchor, *(t for t, pin in pins.items() if pin[0] == anchor)]
        role = next(r for r in (1, 0, 2) if any(kinds[t] == r for t in group))
        kinds.update(dict.fromkeys(group, role))
    return pins


def layout(program: Program, kinds: dict[int, int], elements: dict[int, str],
           alias: dict[int, int], pins: dict[int, tuple[int, int, int]]
           ) -> tuple[tuple[tuple[int, Slot], ...], tuple[HostBuffer, ...]]:
    """Every tensor's place: a host buffer per (role, element type), in ``ROLES`` order, each
    tensor at the next ``ALIGN``-ed offset of its buffer; an in-place output at its input's; a
    packed tensor (``pins``) at its offset from its argument's first tensor, whose place
    spans the whole argument."""
    keys = sorted({(kinds[t], elements[t]) for t in kinds})
    sizes = dict.fromkeys(keys, 0)
    spans: dict[int, int] = {}
    for anchor, _, nbytes in pins.values():
        spans[anchor] = max(spans.get(anchor, 0), nbytes)
    placed: dict[int, Slot] = {}

    def nbytes(t: int) -> int:
        tensor = program.tensors[t]
        return int(np.prod(tensor.shape)) * np.dtype(tensor.dtype).itemsize

    for t in sorted(kinds, key=lambda t: (kinds[t], t)):
        if t in pins:
            continue
        key = (kinds[t], elements[t])
        placed[t] = Slot(keys.index(key), sizes[key], nbytes(t))
        sizes[key] += -(-max(nbytes(t), spans.get(t, 0)) // ALIGN) * ALIGN
    for t, (anchor, at, _) in pins.items():
        placed[t] = Slot(placed[anchor].buffer, placed[anchor].offset + at, nbytes(t))
    slots = [(t, placed[t]) for t in placed] + [(t, placed[s]) for t, s in alias.items()]
    buffers = tuple(HostBuffer(ROLES[role], dtype, sizes[(role, dtype)]) for role, dtype in keys)
    return tuple(slots), buffers


# ---- the module -------------------------------------------------------------------------------


def render(fold: Fold, generic: bool = False) -> str:
    """The fold's MLIR-AIE module: every design's device under its symbol, then the main
    device whose runtime sequence configures and runs them (custom form unless ``generic``).
    Only a device with folds has one (``folds_on``)."""
    from .mlir import ELEM, Writer, device_close, device_open

    if not folds_on(fold.device):
        raise BundleError(f"{fold.name}: {fold.device} has no full-ELF flow, so no folds: each "
                          "of its NPU steps is its own xclbin (iron.targets.npu.fold)")
    custom = not generic
    lines = ["module {" if custom else '"builtin.module"() ({']
    for p in fold.configurations:
        w = (Writer(p.union(), custom, p.symbol, tuple((m.placed, m.symbol) for m in p.members))
             if p.merged else Writer(p.members[0].design, custom, p.symbol))
        w.device()
        lines += w.lines
    params = ", ".join(f"%{b.name}: memref<{b.numel}x{ELEM[b.dtype]}>" for b in fold.buffers)
    lines.append("  " + device_open(fold.device, MAIN, custom))
    if custom:
        lines.append(f"    aie.runtime_sequence @{SEQUENCE}({params}) {{")
    else:
        lines.append(f'    "aie.runtime_sequence"() <{{sym_name = "{SEQUENCE}"}}> ({{')
        lines.append(f"    ^bb0({params}):")
    names = iter(range(1, 1 << 62))
    for c, runs in fold.configures():
        configuration = fold.configurations[c]
        lines.append(f"      aiex.configure @{configuration.symbol} {{" if custom else
                     f'      "aiex.configure"() <{{symbol = @{configuration.symbol}}}> ({{')
        for run in runs:
            design = fold.designs[run.design]
            callee = configuration.member(design).symbol
            values, types = [], []
            for t, a in zip(starts(design, run.tensors), design.args):
                at = fold.slot(t)
                whole = Slot(at.buffer, at.offset, a.numel * DTYPE_BYTES[a.dtype])
                value, ty = view(lines, fold, whole, a.numel, next(names), custom)
                values.append(value)
                types.append(ty)
            if custom:
                lines.append(f"        aiex.run @{callee}({', '.join(values)}) : "
                             f"({', '.join(types)})")
            else:
                lines.append(f'        "aiex.run"({", ".join(values)}) <{{runtime_sequence_'
                             f'symbol = @{callee}}}> : ({", ".join(types)}) -> ()')
        lines.append("      }" if custom else "      }) : () -> ()")
    lines.append("    }" if custom else "    }) : () -> ()")
    lines += device_close(custom)
    lines.append("}" if custom else "}) : () -> ()")
    return "\n".join(lines) + "\n"


def view(lines: list[str], fold: Fold, slot: Slot, numel: int, n: int, custom: bool
         ) -> tuple[str, str]:
    """Append the ops that hand a callee its tensor, as upstream IRON's fusion does: a
    ``memref.subview`` of the host buffer (static offset and size, unit stride), then a
    ``memref.reinterpret_cast`` to the callee's static type (``memref<numel x element>``).
    Returns the value and its type."""
    from .mlir import ELEM

    buffer = fold.buffers[slot.buffer]
    element = ELEM[buffer.dtype]
    size, offset = slot.nbytes // buffer.itemsize, slot.offset // buffer.itemsize
    whole = f"memref<{buffer.numel}x{element}>"
    window = f"memref<{size}x{element}, strided<[1], offset: {offset}>>"
    callee = f"memref<{numel}x{element}>"
    ops = [("memref.subview", f"%s{n}", f"%{buffer.name}", offset, whole, window),
           ("memref.reinterpret_cast", f"%v{n}", f"%s{n}", 0, window, callee)]
    for op, result, source, at, source_type, result_type in ops:
        if not custom:
            segments = (f" <{{operandSegmentSizes = array<i32: 1, 0, 0, 0>, static_offsets = "
                        f"array<i64: {at}>, static_sizes = array<i64: {size}>, static_strides = "
                        "array<i64: 1>}>")
            text = f'"{op}"({source}){segments} : ({source_type}) -> {result_type}'
        elif op == "memref.subview":
            text = f"{op} {source}[{at}] [{size}] [1] : {source_type} to {result_type}"
        else:
            text = (f"{op} {source} to offset: [{at}], sizes: [{size}], strides: [1] : "
                    f"{source_type} to {result_type}")
        lines.append(f"        {result} = {text}")
    return f"%v{n}", callee


# ---- running it -------------------------------------------------------------------------------


class Array:
    """The NPU array of one executable in the emulator: the configuration loaded last.  A
    configure of the configuration already loaded loads nothing (the firmware skips reloading
    the same PDI), so its cores keep looping where the last dispatch left them; any other is a
    fresh load (cores starting, FIFOs empty).  A pack's members (``coresidence.Pack``) share
    one configuration: each runs as the pack's device holds it (its columns and symbols its
    own), and its cores and FIFOs stay as its last dispatch left them while the others run."""

    def __init__(self, lib: str):
        self.lib = lib
        self.loaded: object = None  # the configuration loaded (``Pack.key``)
        self.members: dict[int, object] = {}  # id(design) -> its Emulation, in that load
        self.loads = 0

    def configure(self, configuration: Pack, design: Design):
        """The emulation of ``design`` in ``configuration``, loading it unless loaded."""
        from .emulator import Emulation

        if self.loaded != configuration.key():
            self.loaded, self.members = configuration.key(), {}
            self.loads += 1
        if id(design) not in self.members:  # a member's cores start with the load
            self.members[id(design)] = Emulation(configuration.member(design).placed,
                                                 self.lib)
        return self.members[id(design)]


class Configured:
    """A fold in the emulator: its host buffers (as bytes), and one ``dispatch`` per call."""

    def __init__(self, fold: Fold, array: Array):
        from .emulator import NP_DTYPE

        self.fold, self.array = fold, array
        self.buffers = [np.zeros(max(b.nbytes, 1), np.uint8) for b in fold.buffers]
        self.np_dtype = NP_DTYPE
        self.dispatches = 0
        self.bound: dict[int, np.ndarray] = {}  # weight tensor -> the array put in place

    def view(self, tensor: int, dtype: str) -> np.ndarray:
        s = self.fold.slot(tensor)
        return self.buffers[s.buffer][s.offset:s.offset + s.nbytes].view(self.np_dtype[dtype])

    def window(self, tensor: int, arg: Arg) -> np.ndarray:
        """Runtime argument ``arg`` as its design sees it: from ``tensor``'s place on (a
        packed argument's other tensors follow it)."""
        s = self.fold.slot(tensor)
        end = s.offset + arg.numel * DTYPE_BYTES[arg.dtype]
        return self.buffers[s.buffer][s.offset:end].view(self.np_dtype[arg.dtype])

    def put(self, tensor: int, value: np.ndarray) -> None:
        """Write a tensor the host holds into its place (before the dispatch); a weight once,
        while the host binds the same array (weights are bound once, not changed)."""
        s = self.fold.slot(tensor)
        if self.fold.buffers[s.buffer].role == "weights":
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

    def dispatch(self, fold: Fold | None = None) -> None:
        """The main runtime sequence once: per configure its design loaded on the array
        (``Array``), each run a dispatch of that design's sequence on views of the buffers.
        ``fold``: another fold of the same steps and layout to run instead (a context
        bucket's, ``runner.Bucketed``)."""
        fold = fold or self.fold
        for c, runs in fold.configures():
            for run in runs:
                design = fold.designs[run.design]
                loaded = self.array.configure(fold.configurations[c], design)
                loaded.dispatch([self.window(t, a) for t, a in zip(
                    starts(design, run.tensors), design.args)])
        self.dispatches += 1
