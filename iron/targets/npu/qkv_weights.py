"""How QKVRoPE's Qwen variants bring their weights to the core that rotates the rows.

Qwen2 adds a q|k|v bias to each row and Qwen3 RMS-norms each q and k head with a weight of its
own (``QKVRoPE.bias``, ``QKVRoPE.qk_norm``).  The rotating core's two input channels already
carry the rows and the cache tiles, and its relay's the positions and frequencies, so the
weights ride with the rows: each comes from a shim tile into the column's memory tile, which
joins one row and one copy of every weight into one element for the core (a ``Link`` join, as
Attention joins its keys and values).  The runtime sequence sends each weight once per row, as
shim transfers whose outermost dimension repeats the weight with stride 0 (the repeat mlir-aie's
``verifyStridesWraps`` allows in that dimension only, at most ``ap_repeat_max`` times each).
The core calls ``qkv_head_row_qwen`` (``rope.cc``): each head plus its bias, normed, in float32
before it is rotated.  Llama's instances (no weights) keep their plain row FIFO and kernel.
"""

from __future__ import annotations

from dataclasses import replace

from ...operators import QKVRoPE
from .ir import Arg, Buf, Buffer, Call, Fifo, Iv, Link, Tile, Transfer, linear
from .resources import NpuResources


def weights(op: QKVRoPE) -> list[tuple[str, int]]:
    """(name, elements) of the variant's weights, in the order they follow a row."""
    return [(name, shape[0]) for name, shape in op.extra_inputs()]


def row_width(op: QKVRoPE) -> int:
    return (op.heads + 2 * op.kv_heads) * op.head_dim


def row_fifos(op: QKVRoPE, core: Tile, mem: Tile, depth: int, feeds: tuple[Tile, ...],
              source: Tile) -> tuple[list[Fifo], list[Link]]:
    """The FIFO ``qkv`` the core takes its rows from (``depth`` elements at the core): straight
    from ``source`` for Llama; for a Qwen variant a row joined in ``mem`` with a copy of each
    weight, the row from ``source`` (``qkv_in``) and the weights from ``feeds`` in turn."""
    width = row_width(op)
    parts = weights(op)
    if not parts:
        return [Fifo("qkv", source, (core,), depth, (width,))], []
    fifos = [Fifo("qkv_in", source, (mem,), 2, (width,))]
    fifos += [Fifo(f"{name}_in", feed, (mem,), 2, (n,)) for (name, n), feed in zip(parts, feeds)]
    offsets, at = [], 0
    for f in fifos:
        offsets.append(at)
        at += f.shape[0]
    fifos.append(Fifo("qkv", mem, (core,), depth, (at,)))
    return fifos, [Link(tuple(f.name for f in fifos[:-1]), ("qkv",), tuple(offsets))]


def offsets(op: QKVRoPE) -> list[int]:
    """Where runtime argument 0 (``rows_arg``) holds each of its tensors, in elements: the
    rows at 0, then each weight of the variant, then the rotated q; last its end."""
    at = [0, op.rows * row_width(op)]
    for _, n in weights(op):
        at.append(at[-1] + n)
    return at + [at[-1] + op.rows * op.heads * op.head_dim]


def rows_arg(op: QKVRoPE) -> Arg:
    """Runtime argument 0: the rows, the variant's weights and the rotated q packed in one
    buffer (``offsets``), so every variant takes five (aiecc's xclbin kernel binds five,
    ``trip_rules``): the positions, frequencies and the two caches (written in place) are
    the others."""
    names = ["qkv", *(name for name, _ in weights(op)), "q"]
    return Arg("+".join(names), offsets(op)[-1])


def row_transfers(op: QKVRoPE, first: int, rows: int, feeds: tuple[Tile, ...], source: Tile,
                  res: NpuResources) -> list[Transfer]:
    """The rows ``first ..`` (``rows`` of them) of runtime argument 0 into the row FIFO, and for a
    variant a copy of each weight (behind the rows in the same argument, ``offsets``) per
    row."""
    width = row_width(op)
    parts = weights(op)
    out = [Transfer("in", 0, "qkv_in" if parts else "qkv", source,
                    linear(first * width, rows * width))]
    for (name, n), feed, at in zip(parts, feeds, offsets(op)[1:]):
        out += repeated(0, at, f"{name}_in", feed, n, rows, res)
    return out


def repeated(arg: int, at: int, fifo: str, tile: Tile, n: int, times: int,
             res: NpuResources) -> list[Transfer]:
    """``times`` copies of the ``n`` elements of runtime argument ``arg`` from element ``at``:
    transfers whose outermost dimension repeats them with stride 0, at most
    ``res.ap_repeat_max`` times each."""
    one = linear(at, n)
    out = []
    while times:
        r = min(times, res.ap_repeat_max)
        out.append(Transfer("in", arg, fifo, tile, replace(one, sizes=(r, *one.sizes[1:]),
                                                          strides=(0, *one.strides[1:]))))
        times -= r
    return out


def head_buffer(op: QKVRoPE, core: Tile) -> tuple[Buffer, ...]:
    """The variant kernel's float32 scratch: the q heads of one KV head's group."""
    if not weights(op):
        return ()
    return (Buffer("head", core, (op.heads // op.kv_heads * op.head_dim,), "f32"),)


def head_row_call(op: QKVRoPE, pos: str, freq: str) -> Call:
    """The core's call per row of a KV head's pass (row ``Iv(0)`` of head ``Iv(1)``)."""
    shape = (op.heads, op.kv_heads, op.head_dim)
    rows = (Buf("k_rows"), Buf("v_rows"))
    if not weights(op):
        return Call("qkv_head_row", ("qkv", pos, freq, "q", *rows, Iv(1, 1), Iv(0, 1), *shape))
    return Call("qkv_head_row_qwen", ("qkv", pos, freq, "q", *rows, Buf("head"), float(op.eps),
                                      Iv(1, 1), Iv(0, 1), int(op.bias), int(op.qk_norm),
                                      *shape))
