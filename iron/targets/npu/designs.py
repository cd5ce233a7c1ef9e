"""A design per resolved operator instance, in the structure of upstream IRON's designs
(amd/IRON ``iron/operators/*/design.py``), written for iron's data model.

- Elementwise (AXPY, add, mul, SiLU) and SwiGLU: per column ``num_channels`` compute tiles,
  each fed by one FIFO per input straight from the column's shim tile and drained by one
  output FIFO; double-buffered tiles of ``tile_size`` elements; each worker takes a contiguous
  share of the tensor.
- RMSNorm, Softmax: per column one compute tile taking ``tile_size`` rows at a time; the
  norm's weight reaches every column once (depth 1).
- GEMV: per column one compute tile; rows of W stream in ``tile_size_input`` at a time, x
  arrives once (depth 1), y leaves ``tile_size_output`` rows at a time; columns split M.
- GEMM: per column four compute tiles (one per row); A comes through the memory tile, split
  by rows over the four cores; B is broadcast to them; their C tiles are joined in the memory
  tile; columns split N; accumulation is float32 in a core buffer.
- GEMV and GEMM over block-quantized weights: ``qmatrix``.
- QKVRoPE, Attention: ``attention`` (the KV cache in DRAM, the position read by the cores and
  rendered into each dispatch's transfers).

mlir-aie's static lowering fixes the buffer of every acquire in a core's code, so a dispatch
taking an odd number of elements of a double-buffered FIFO would leave the next dispatch's
code on the other buffer than its DMA (``rotation``).  Each core's program therefore starts
with its main loop's first iteration written out (``rotation.peeled``): the program then
acquires right in the loop until reconfiguration, which the lowering unrolls by two, and two
dispatches' code take a whole rotation whatever the count.

``design_for`` returns ``None`` for an operator without a design: it is placed on the host.
"""

from __future__ import annotations

import math
from typing import Iterator

from ...operator import Operator, Rule, rule
from ...operators import (AXPY, GEMM, GEMV, ElementwiseAdd, ElementwiseMul, RMSNorm, SiLU,
                          Softmax, SwiGLU)
from . import attention, qmatrix
from .ir import (Arg, Buf, Buffer, Call, Core, Design, Fifo, Iv, Link, Loop, Pattern, Tile,
                     Transfer, consume, linear, produce, release, shim)
from .kernels import gemm_row_lanes, lanes, mmul_shape
from .resources import NpuResources
from .rotation import peeled

ELEMENTWISE = {AXPY: "axpy_bf16", ElementwiseAdd: "add_bf16", ElementwiseMul: "mul_bf16",
               SiLU: "silu_bf16"}


def family_rules(op: Operator, res: NpuResources) -> Iterator[Rule]:
    """Rules a design needs before it can be drawn (beyond the operator's own)."""
    if qmatrix.quantized(op):
        if qmatrix.designed(op):
            yield from qmatrix.rules(op, res)
        return
    if attention.has_design(op):
        yield from attention.family_rules(op, res)
        return
    v = lanes()
    if type(op) in ELEMENTWISE or isinstance(op, SwiGLU):
        yield rule(op.tile_size % v == 0, "tile_size", f"tile_size % {v} == 0 (the kernel "
                   f"takes whole {v}-lane bf16 vectors)")
    if type(op) in ELEMENTWISE:
        workers = op.num_aie_columns * op.num_channels
        yield rule(op.size % (workers * op.tile_size) == 0, "tile_size num_aie_columns "
                   "num_channels", "size % (num_aie_columns * num_channels * tile_size) == 0 "
                   "(each compute tile takes whole tiles)")
        yield rule(op.num_channels <= res.compute_rows, "num_channels",
                   f"num_channels <= {res.compute_rows} compute tiles per column")
    elif isinstance(op, (RMSNorm, Softmax)):
        yield rule(op.size % v == 0, "", f"size % {v} == 0 (the kernel takes whole {v}-lane "
                   "bf16 vectors of a row)")
    elif isinstance(op, GEMV):
        yield rule(op.K % v == 0, "", f"K % {v} == 0 (the kernel's dot products take whole "
                   f"{v}-lane bf16 vectors)")
    elif isinstance(op, GEMM):
        r, s, t = mmul_shape(res.name)
        n = math.lcm(t, gemm_row_lanes())
        yield rule(op.tile_m % r == 0 and op.tile_k % s == 0 and op.tile_n % n == 0,
                   "tile_m tile_k tile_n",
                   f"tile_m % {r} == 0, tile_k % {s} == 0, tile_n % {n} == 0 (the kernel's "
                   f"{r}x{s}x{t} bf16 MMUL on {res.name}, rows stored as {gemm_row_lanes()}-"
                   "lane bf16 vectors)")


def design_for(op: Operator, res: NpuResources) -> Design | None:
    if qmatrix.quantized(op):  # block-quantized weights: iron/targets/npu/qmatrix.py
        return qmatrix.design(op, res) if qmatrix.designed(op) else None
    if attention.has_design(op):
        return attention.design_for(op, res)
    if type(op) in ELEMENTWISE:
        return elementwise(op, res)
    if isinstance(op, SwiGLU):
        return swiglu(op, res)
    if isinstance(op, (RMSNorm, Softmax)):
        return rowwise(op, res)
    if isinstance(op, GEMV):
        return gemv(op, res)
    if isinstance(op, GEMM):
        return gemm(op, res)
    return None


def elementwise(op, res: NpuResources) -> Design:
    arity, cols, chans, tile = op.arity, op.num_aie_columns, op.num_channels, op.tile_size
    per = op.size // (cols * chans)
    extra = (float(op.scalar_factor),) if isinstance(op, AXPY) else ()
    fifos, cores, phase = [], [], []
    for c in range(cols):
        for k in range(chans):
            core, w = Tile(c, 2 + k), c * chans + k
            ins = [f"in{i}_{c}_{k}" for i in range(arity)]
            out = f"out_{c}_{k}"
            fifos += [Fifo(n, shim(c), (core,), 2, (tile,)) for n in ins]
            fifos.append(Fifo(out, core, (shim(c),), 2, (tile,)))
            body = (*consume(*ins), *produce(out),
                    Call(ELEMENTWISE[type(op)], (*ins, out, tile, *extra)),
                    *release("consume", *ins), *release("produce", out))
            cores.append(Core(core, peeled(Loop(per // tile, body))))
            phase += [Transfer("in", i, n, shim(c), linear(w * per, per)) for i, n in
                      enumerate(ins)]
            phase.append(Transfer("out", arity, out, shim(c), linear(w * per, per)))
    args = tuple(Arg(f"in{i}", op.size) for i in range(arity)) + (Arg("out", op.size),)
    return Design(op.describe(True), res.name, args, tuple(fifos), (), (), tuple(cores),
                  (tuple(phase),), "eltwise.cc", ("tile_size", "num_channels"))


def swiglu(op: SwiGLU, res: NpuResources) -> Design:
    cols, tile, rows, size = op.num_aie_columns, op.tile_size, op.rows, op.size
    share = size // cols
    fifos, cores, phase = [], [], []
    for c in range(cols):
        core = Tile(c, 2)
        gate, up, out = f"gate_{c}", f"up_{c}", f"out_{c}"
        fifos += [Fifo(gate, shim(c), (core,), 2, (tile,)),
                  Fifo(up, shim(c), (core,), 2, (tile,)),
                  Fifo(out, core, (shim(c),), 2, (tile,))]
        body = (*consume(gate, up), *produce(out), Call("swiglu_bf16", (gate, up, out, tile)),
                *release("consume", gate, up), *release("produce", out))
        cores.append(Core(core, peeled(Loop(rows * share // tile, body))))
        sizes = (1, rows, share // tile, tile)
        row = (0, 2 * size, tile, 1)
        phase += [Transfer("in", 0, gate, shim(c), Pattern(c * share, sizes, row)),
                  Transfer("in", 0, up, shim(c), Pattern(size + c * share, sizes, row)),
                  Transfer("out", 1, out, shim(c), Pattern(c * share, sizes, (0, size, tile, 1)))]
    args = (Arg("x", rows * 2 * size), Arg("out", rows * size))
    return Design(op.describe(True), res.name, args, tuple(fifos), (), (), tuple(cores),
                  (tuple(phase),), "eltwise.cc", ("tile_size",))


def rowwise(op, res: NpuResources) -> Design:
    cols, tile, rows, size = op.num_aie_columns, op.tile_size, op.rows, op.size
    share = rows // cols
    weighted = isinstance(op, RMSNorm) and op.weighted
    fifos, cores, phase = [], [], []
    out_arg = 2 if weighted else 1
    for c in range(cols):
        core = Tile(c, 2)
        x, out, w = f"x_{c}", f"out_{c}", f"w_{c}"
        fifos += [Fifo(x, shim(c), (core,), 2, (tile, size)),
                  Fifo(out, core, (shim(c),), 2, (tile, size))]
        if isinstance(op, Softmax):
            call = Call("softmax_bf16", (x, out, tile, size))
        elif weighted:
            call = Call("rmsnorm_weighted_bf16", (x, w, out, tile, size, float(op.eps)))
        else:
            call = Call("rmsnorm_bf16", (x, out, tile, size, float(op.eps)))
        body = (*consume(x), *produce(out), call, *release("consume", x),
                *release("produce", out))
        loop = peeled(Loop(share // tile, body))
        if weighted:
            fifos.append(Fifo(w, shim(c), (core,), 1, (size,)))
            cores.append(Core(core, (*consume(w), *loop, *release("consume", w))))
            phase.append(Transfer("in", 1, w, shim(c), linear(0, size)))
        else:
            cores.append(Core(core, loop))
        phase += [Transfer("in", 0, x, shim(c), linear(c * share * size, share * size)),
                  Transfer("out", out_arg, out, shim(c), linear(c * share * size, share * size))]
    args = (Arg("x", rows * size),) + ((Arg("w", size),) if weighted else ()) + (
        Arg("out", rows * size),)
    return Design(op.describe(True), res.name, args, tuple(fifos), (), (), tuple(cores),
                  (tuple(phase),), "softmax.cc" if isinstance(op, Softmax) else "norm.cc",
                  ("tile_size",))


def gemv(op: GEMV, res: NpuResources) -> Design:
    cols, tsi, tso, M, K, B = (op.num_aie_columns, op.tile_size_input, op.tile_size_output,
                               op.M, op.K, op.batches)
    share = M // cols
    fifos, cores, phase = [], [], []
    outer, inner = share // tso, tso // tsi
    out = qmatrix.output_dtype(op)
    kernel = "gemv_bf16" if out == "bf16" else "gemv_bf16_f32"
    for c in range(cols):
        core = Tile(c, 2)
        a, x, y = f"A_{c}", f"x_{c}", f"y_{c}"
        fifos += [Fifo(a, shim(c), (core,), 2, (tsi, K)), Fifo(x, shim(c), (core,), 1, (B, K)),
                  Fifo(y, core, (shim(c),), 2, (B, tso), out)]
        rows = Loop(inner, (*consume(a), Call(kernel, (a, x, y, tsi, K, B, tso, Iv(0, tsi))),
                            *release("consume", a)))
        tiles = Loop(outer, (*produce(y), rows, *release("produce", y)))
        cores.append(Core(core, (*consume(x), *peeled(tiles), *release("consume", x))))
        phase += [Transfer("in", 0, a, shim(c), linear(c * share * K, share * K)),
                  Transfer("in", 1, x, shim(c), linear(0, B * K)),
                  Transfer("out", 2, y, shim(c), Pattern(c * share, (1, share // tso, B, tso),
                                                         (0, tso, M, 1)))]
    args = (Arg("W", M * K), Arg("x", B * K), Arg("y", B * M, out))
    return Design(op.describe(True), res.name, args, tuple(fifos), (), (), tuple(cores),
                  (tuple(phase),), "gemv.cc", ("tile_size_input", "tile_size_output"))


def gemm(op: GEMM, res: NpuResources) -> Design:
    cols, tm, tk, tn, M, K, N = (op.num_aie_columns, op.tile_m, op.tile_k, op.tile_n, op.M,
                                 op.K, op.N)
    rows = res.compute_rows
    share = N // cols
    mt, nt, kt = M // (rows * tm), share // tn, K // tk
    fifos, links, buffers, cores = [], [], [], []
    out = qmatrix.output_dtype(op)
    for c in range(cols):
        mem = Tile(c, 1)
        workers = tuple(Tile(c, 2 + r) for r in range(rows))
        a, b, cc = f"A_{c}", f"B_{c}", f"C_{c}"
        a_r = [f"A_{c}_{r}" for r in range(rows)]
        c_r = [f"C_{c}_{r}" for r in range(rows)]
        bw = f"B_{c}_cores"
        fifos += [Fifo(a, shim(c), (mem,), 2, (rows * tm, tk)),
                  *(Fifo(n, mem, (w,), 2, (tm, tk)) for n, w in zip(a_r, workers)),
                  Fifo(b, shim(c), (mem,), 2, (tn, tk)), Fifo(bw, mem, workers, 2, (tn, tk)),
                  *(Fifo(n, w, (mem,), 2, (tm, tn), out) for n, w in zip(c_r, workers)),
                  Fifo(cc, mem, (shim(c),), 2, (rows * tm, tn), out)]
        links += [Link((a,), tuple(a_r), tuple(r * tm * tk for r in range(rows))),
                  Link((b,), (bw,)),
                  Link(tuple(c_r), (cc,), tuple(r * tm * tn for r in range(rows)))]
        for r, w in enumerate(workers):
            acc = f"acc_{c}_{r}"
            buffers.append(Buffer(acc, w, (tm, tn), "f32"))
            k_loop = Loop(kt, (*consume(a_r[r], bw),
                               Call("gemm_bf16", (a_r[r], bw, Buf(acc), tm, tk, tn)),
                               *release("consume", a_r[r], bw)))
            body = (*produce(c_r[r]), Call("zero_f32", (Buf(acc), tm * tn)), k_loop,
                    Call(f"store_{out}", (Buf(acc), c_r[r], tm, tn)),
                    *release("produce", c_r[r]))
            cores.append(Core(w, peeled(Loop(mt * nt, body))))
    sequence = []
    for m in range(mt):
        phase = []
        for c in range(cols):
            a = Pattern(m * rows * tm * K, (nt, kt, rows * tm, tk), (0, tk, K, 1))
            b = Pattern(c * share * K, (nt, kt, tn, tk), (tn * K, tk, K, 1))
            c_out = Pattern(m * rows * tm * N + c * share, (1, nt, rows * tm, tn),
                            (0, tn, N, 1))
            phase += [Transfer("in", 0, f"A_{c}", shim(c), a),
                      Transfer("in", 1, f"B_{c}", shim(c), b),
                      Transfer("out", 2, f"C_{c}", shim(c), c_out)]
        sequence.append(tuple(phase))
    args = (Arg("A", M * K), Arg("B", N * K), Arg("C", M * N, out))
    return Design(op.describe(True), res.name, args, tuple(fifos), tuple(links),
                  tuple(buffers), tuple(cores), tuple(sequence), "gemm.cc",
                  ("tile_m", "tile_k", "tile_n"))
