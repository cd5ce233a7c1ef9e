"""Two preconditions of the pinned mlir-aie toolchain (``ods.UPSTREAM``) as rules over a
parsed ``aie.device`` (``preconditions.Device``), both in ``preconditions.RULES``: every design
loops a constant number of times and takes at most five runtime buffers.

**Constant trip counts around acquires** (``constant_trip_counts``).  mlir-aie's object FIFO
lowering (``lib/Dialect/AIE/Transforms/AIEObjectFifoStatefulTransform.cpp``) gives each
``objectfifo.acquire`` its buffer at compile time: ``unrollForLoops`` unrolls every ``scf.for``
whose body acquires, by the least common multiple of the FIFOs' depths, taking the trip count
from constant bounds (``getStaticTripCount``); bounds computed at run time give an unroll
factor of 0 and the pass fails ("could not be unrolled with unrollFactor = 0, check loop
boundaries").  A loop around an unrolled one runs its acquires a data-dependent number of
times, so an acquire at any depth counts.  Only a core with ``dynamic_objfifo_lowering =
true`` takes the other path (``dynamicGlobalObjectFifos``: the buffer index kept at run time);
there the stored copy of the pass (newer than the pin) refuses an acquire or release inside an
``scf.if`` in a loop ("cannot statically analyze cyclostatic acquire pattern",
``peelCyclostaticAcquires``), which this rule checks instead.

**Runtime-sequence arguments** (``sequence_arguments``).  aiecc writes the xclbin's kernel
description with ``emit_design_kernel_json`` (``python/compiler/aiecc/main.py``), called with
no ``buffer_args``: the kernel declares ``opcode``, ``instr``, ``ninstr`` and five buffers,
``bo0`` .. ``bo4`` (``AIECC_BUFFERS``), and XRT binds no more to a run.  A runtime sequence
taking more buffers cannot be called through that xclbin.  The rule is for a design compiled
alone, a module of one ``aie.device``: a module of several (a fold) compiles only to a full ELF
(``fold``), where the devices' sequences are inlined by ``aiex.run`` and the main sequence goes
to aiecc's full-ELF flow, which has no such limit: its kernel description
(``generate_full_elf_config_json`` in the same file, read in a stored copy newer than the
pin, mlir-aie e97e1fe0) declares each device's kernel with as many ``char *`` arguments as
its longest runtime sequence takes (``max_arg_count``).  Whether XRT binds that many to a run
was not read (on the bundles of 2026-12-04 the folds' main sequences take 6 buffers).
The designs meet it by packing: a design's ``places`` put several of its step's tensors in
one runtime argument at element offsets (``ir.Place``), the folds lay such a group out
together (``fold.packed``), and an output written in place shares its input's argument.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

from xdsl.dialects import arith, scf

from . import ods
from .violation import Violation

if TYPE_CHECKING:  # preconditions lists these rules: it imports this module
    from .preconditions import Device

#: Buffer arguments of the kernel aiecc's ``emit_design_kernel_json`` declares by default.
AIECC_BUFFERS = 5
UNROLL = ("AIEObjectFifoStatefulTransform.cpp, unrollForLoops: a loop that acquires is "
          "unrolled and needs a constant trip count")
PEEL = ("AIEObjectFifoStatefulTransform.cpp, peelCyclostaticAcquires: the dynamic lowering "
        "cannot analyse an acquire or release inside a conditional")


def _acquired(op) -> list[str]:
    return sorted({o.objFifo_name.root_reference.data for o in op.walk()
                   if isinstance(o, ods.ObjectFifoAcquireOp)})


def _runtime_bound(loop: scf.ForOp) -> str | None:
    """What computes a bound of ``loop`` at run time (the defining op's name), or None when
    its lower bound, upper bound and step are all constants."""
    for value in (loop.lb, loop.ub, loop.step):
        owner = value.owner
        if not isinstance(owner, arith.ConstantOp):
            return getattr(owner, "name", "a block argument")
    return None


def constant_trip_counts(d: Device) -> Iterator[Violation]:
    for core in d.cores:
        tile = d.tile(core.tile)
        dynamic = core.dynamic_objfifo_lowering
        if dynamic is not None and dynamic.value.data:
            for branch in core.body.walk():
                if isinstance(branch, scf.IfOp) and any(
                        isinstance(o, (ods.ObjectFifoAcquireOp, ods.ObjectFifoReleaseOp))
                        for o in branch.walk()):
                    yield Violation(branch, f"{tile} declares dynamic_objfifo_lowering and "
                                    f"acquires or releases inside an scf.if ({PEEL})")
            continue
        for loop in core.body.walk():
            if not isinstance(loop, scf.ForOp):
                continue
            source, fifos = _runtime_bound(loop), _acquired(loop)
            if source is not None and fifos:
                yield Violation(loop, f"{tile}: a loop whose bound comes from {source} at run "
                                f"time acquires {', '.join(fifos)}, and the core does not "
                                f"declare dynamic_objfifo_lowering ({UNROLL})")


def sequence_arguments(d: Device) -> Iterator[Violation]:
    module = d.op.parent_op()
    if module is not None and sum(isinstance(o, ods.DeviceOp) for o in module.walk()) > 1:
        return  # a full-ELF module (a fold): see the module docstring
    for o in d.op.body_region.block.ops:
        if isinstance(o, ods.RuntimeSequenceOp):
            n = len(o.body.block.args)
            if n > AIECC_BUFFERS:
                yield Violation(o, f"the runtime sequence takes {n} buffers, more than the "
                                f"{AIECC_BUFFERS} aiecc's xclbin kernel declares "
                                "(python/compiler/aiecc/main.py, emit_design_kernel_json: "
                                "bo0..bo4)")
