"""Designs for GEMV and GEMM over block-quantized weights (q4_0, q4_1, q8_0, uint4; see
``iron.quant``), one scheme for both, after the cpu kernels' (``kernels/cpu/qmatmul.h``):

- the weight streams from host memory as the bundle stores it (the tiled layout: per 16-row
  tile, group after group, the codes then the 16 rows' scales and minimums), one FIFO element
  a 16-row tile times ``tile_k`` values (whole groups, contiguous in the layout, so every
  transfer carries whole blocks and whole 32-bit words), double-buffered (a GEMM of several
  blocks of rows only where its counts are even: ``rotation``); columns split the rows;
- the vectors of x (GEMV) or the rows of A (GEMM) arrive one at a time and are rounded on the
  core to int8 codes per 16 values, as the cpu rounds them (``iron.quant.activation_values``),
  into core buffers: codes, block scales, group sums;
- the core multiplies each tile by every held vector in integer arithmetic (``qmatrix.cc``),
  accumulating in float32 over the tiles of K, and rounds once to bf16 into the output tile
  (``tile_size_output`` / ``tile_n`` rows of W by the vectors held).

A GEMV is the case of one block of ``batches`` vectors and the whole of K per element; a GEMM
holds ``tile_m`` rows of A at a time (one runtime phase per block of rows, each streaming the
column's share of W again) and takes K ``tile_k`` values at a time.
"""

from __future__ import annotations

from typing import Iterator

from ...operator import Operator, Rule, rule
from ...operators import GEMM, GEMV
from ...quant import TILE, row_bytes
from .ir import (Acquire, Arg, Buf, Buffer, Call, Core, Design, Fifo, Iv, Loop, Pattern,
                     Release, Tile, Transfer, linear)
from .kernels import qmatrix_block
from .resources import NpuResources
from .rotation import peeled, rotating

KERNEL_SOURCE = "qmatrix.cc"


#: The formats ``qmatrix.cc`` has a kernel for.  The K-quants (q4_k, q6_k: super-blocks of 256
#: with packed sub-block scales) and f16 (IEEE halves, which the bf16 designs do not read) have
#: none yet: such a GEMV or GEMM is placed on the host.
FORMATS = ("q4_0", "q4_1", "q8_0", "uint4")


def quantized(op: Operator) -> bool:
    """A GEMV or GEMM whose weight is not bf16 (block-quantized, or f16): no bf16 design applies
    to it (a quantized Embedding table is a gather, placed on the host)."""
    return isinstance(op, (GEMV, GEMM)) and op.weight_format != "bf16"


def designed(op: Operator) -> bool:
    """A quantized GEMV or GEMM in a format these designs stream."""
    return quantized(op) and op.weight_format in FORMATS


def shape(op) -> tuple[int, int, int, int, int]:
    """(vectors, vectors per block, rows of W, output rows per element, K per element)."""
    if isinstance(op, GEMV):
        return op.batches, op.batches, op.M, op.tile_size_output, op.K
    return op.M, op.tile_m, op.N, op.tile_n, op.tile_k


def rules(op: Operator, res: NpuResources) -> Iterator[Rule]:
    """What the scheme needs beyond the operator's own rules (which already ask for whole
    16-row tiles and, in a GEMM, tile_k of whole groups)."""
    block = qmatrix_block()
    yield rule(op.K % block == 0, "",
               f"K % {block} == 0 (x is rounded to int8 codes per {block} values)")
    yield rule(op.x_block == block, "", f"x_block == {block} (the core rounds x per {block} "
               "values)")
    if isinstance(op, GEMM):
        yield rule(op.M % op.tile_m == 0, "tile_m", "M % tile_m == 0 (the core holds tile_m "
                   "rows of A at a time)")
        yield rule(op.tile_n % TILE == 0 and op.tile_k % op.group_size == 0,
                   "tile_n tile_k", f"tile_n % {TILE} == 0 and tile_k % group_size == 0")
        yield rule(op.M // op.tile_m <= res.ap_repeat_max, "tile_m",
                   f"M / tile_m <= {res.ap_repeat_max} runtime phases")


def padded(n: int) -> int:
    """Floats per vector of the block scales and group sums: read as 16-lane vectors."""
    return -(-n // 16) * 16


def output_dtype(op: GEMV | GEMM) -> str:
    """The design dtype of a matrix product's output: bf16, or f32 for float32 (logits)."""
    return "f32" if op.output_dtype == "float32" else "bf16"


def byte_run(offset: int, count: int) -> Pattern:
    """``count`` contiguous bytes (whole 32-bit words) as a pattern of at most 1023-word rows."""
    p = linear(offset // 4, count // 4, inner_max=1023)
    return Pattern(offset, (*p.sizes[:-1], p.sizes[-1] * 4), (*(4 * s for s in p.strides[:-1]),
                                                                1))


def design(op, res: NpuResources) -> Design:
    fmt, group, K, cols = op.weight_format, op.group_size, op.K, op.num_aie_columns
    vectors, tm, rows, tn, tk = shape(op)
    share, kt, mt = rows // cols, K // tk, vectors // tm
    nt, t16 = share // tn, tn // TILE
    # One block of vectors (a GEMV): the first output tile written out ahead of the loop
    # over the others puts an acquire right in the loop until reconfiguration, which the
    # static lowering unrolls by two (``rotation.peeled``), so every FIFO keeps two buffers.
    # Several blocks repeat x, y and W in a loop with no acquire of its own: two buffers
    # only where that loop's code takes whole rotations (x in blocks of tm rows, y tile by
    # tile, W over K or, in one piece, over the 16-row tiles).
    x_depth, y_depth = (2, 2) if mt == 1 else (rotating(tm), rotating(nt))
    w_depth = 2 if mt == 1 else rotating(kt if kt > 1 else t16)
    tile_bytes = TILE * row_bytes(fmt, tk, group)
    whole = TILE * row_bytes(fmt, K, group)  # one tile of W, all of K
    fifos, buffers, cores = [], [], []
    y_dtype = output_dtype(op)
    for c in range(cols):
        core, s = Tile(c, 2), Tile(c, 0)
        x, w, y = f"x_{c}", f"W_{c}", f"y_{c}"
        xq, dx, xs, acc = f"xq_{c}", f"dx_{c}", f"xs_{c}", f"acc_{c}"
        fifos += [Fifo(x, s, (core,), x_depth, (K,)),
                  Fifo(w, s, (core,), w_depth, (tile_bytes,), "u8"),
                  Fifo(y, core, (s,), y_depth, (tm, tn), y_dtype)]
        buffers += [Buffer(xq, core, (tm * K,), "i8"),
                    Buffer(dx, core, (tm * padded(K // 16),), "f32"),
                    Buffer(xs, core, (tm * padded(K // group),), "f32"),
                    Buffer(acc, core, (tm * TILE,), "f32")]
        held = (Buf(xq), Buf(dx), Buf(xs))
        take = Loop(tm, (Acquire(x, "consume"),
                         Call("qmatrix_quantize", (x, *held, K, 1, group, Iv(0, 1))),
                         Release(x, "consume")))
        store = Call("qmatrix_store" if y_dtype == "bf16" else "qmatrix_store_f32",
                     (Buf(acc), y, tm, tn, Iv(0, TILE)))
        if kt == 1:  # W's acquire right in the loop over the tiles, which unrolls it
            tiles = Loop(t16, (Acquire(w, "consume"),
                               Call(f"qmatrix_{fmt}", (w, *held, Buf(acc), tk, tm, group, 0, K,
                                                       0)),
                               Release(w, "consume"), store))
        else:
            k_loop = Loop(kt, (Acquire(w, "consume"),
                               Call(f"qmatrix_{fmt}", (w, *held, Buf(acc), tk, tm, group,
                                                       Iv(0, tk), K, Iv(0, 1))),
                               Release(w, "consume")))
            tiles = Loop(t16, (k_loop, store))
        out = Loop(nt, (Acquire(y, "produce"), tiles, Release(y, "produce")))
        program = (take, *peeled(out)) if mt == 1 else (Loop(mt, (take, out)),)
        cores.append(Core(core, program))
    # runtime arguments: the step's inputs in its order (GEMV W, x; GEMM A, B), then the output
    xa, wa = (1, 0) if isinstance(op, GEMV) else (0, 1)
    sequence = []
    for m in range(mt):
        phase = []
        for c in range(cols):
            s = Tile(c, 0)
            phase += [Transfer("in", xa, f"x_{c}", s, linear(m * tm * K, tm * K)),
                      Transfer("in", wa, f"W_{c}", s, byte_run(c * share // TILE * whole,
                                                              share // TILE * whole)),
                      Transfer("out", 2, f"y_{c}", s,
                               Pattern(m * tm * rows + c * share, (1, nt, tm, tn),
                                       (0, tn, rows, 1)))]
        sequence.append(tuple(phase))
    ins = [Arg("x" if isinstance(op, GEMV) else "A", vectors * K),
           Arg("W" if isinstance(op, GEMV) else "B", rows // TILE * whole, "u8")]
    args = (ins[xa], ins[wa], Arg("y" if isinstance(op, GEMV) else "C", vectors * rows, y_dtype))
    fields = (("tile_size_output",) if isinstance(op, GEMV) else ("tile_m", "tile_k", "tile_n"))
    return Design(op.describe(True), res.name, args, tuple(fifos), (), tuple(buffers),
                  tuple(cores), tuple(sequence), KERNEL_SOURCE, fields)
