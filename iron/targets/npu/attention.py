"""NPU designs of the KV-cache operators: ``QKVRoPE`` (the rotation and the cache write),
``Attention`` (decode, one query row, and prefill chunks; grouped-query heads), ``CacheWrite``
and the slotted ``SlotQKVRoPE`` / ``SlotAttention`` of batched decode.

**The KV cache** lives in DRAM as the host keeps it, one layout for the design and the host:
``(kv_heads, ctx, head_dim)`` bf16, row-major (slotted: ``(slots, kv_heads, ctx, head_dim)``),
so position ``p`` of KV head ``h`` in slot ``s`` is the ``head_dim`` elements at
``((s * kv_heads + h) * ctx + p) * head_dim``.  The designs write it in place.

**Attention, QKVRoPE and CacheWrite run what was compiled.** Their core loops have constant
trip counts and their runtime sequences are the same at every position: the positions travel as
data of the ``pos`` argument, to a relay core on the tile above the working core and on through
a FIFO the two share in memory (``relay``: the working core's two input channels are taken),
and the kernels use them where the data cannot: Attention reads every key tile of the context
and scores only the keys up to each row's position; QKVRoPE passes every cache tile through its
core and replaces the rows that land in it (``cache_patch``), as CacheWrite does.
(``aiex.npu.rtp_write`` cannot carry a position instead: its value is an ``I32Attr``, a
constant of the compiled instruction stream.) The price is bytes moved per layer and dispatch,
whatever the position: Attention reads ``2 * kv_heads * ctx * head_dim * 2`` bytes of keys and
values, QKVRoPE reads and writes them, twice that (SmolLM2's 3 x 64 at ctx 8192: 6 MiB and
12 MiB). A sequence per context bucket (powers of two up to the context, the smallest covering the
position chosen per dispatch) would cut both to the bucket's size; it is not built.

**The slotted forms still follow the position on the host** (``render``,
``RENDERERS``): they write it as runtime parameters (``Rtp``, ``aiex.npu.rtp_write``) that a
kernel reads after the core's first acquire and turns into a loop's trip count
(``Call.result``, ``Loop.dynamic``), and their transfers (a row's slot, its key tiles and the
cache rows it lands on) are drawn per dispatch.  Their ``sequence`` is the one at the bound
(the last rows of the context, every key tile): what the legality rules measure and ``mlir``
writes; the cost model prices them at the middle of the context (``PRICED_AT``).
``trip_rules`` names what the pinned toolchain would refuse in them, and QKVRoPE's 8 buffers.

**Attention.** A work unit is a block of ``row_block`` query rows of one KV head with its
``heads // kv_heads`` query heads, so each key tile is read once for the group; columns split
the units, one compute tile per column.  A shim tile has two channels into the array and a core
two inputs, so the keys and values come from a second shim tile and are joined in the column's
memory tile, one ``(2 * tile_size, head_dim)`` element per tile.  Per unit the core takes its
queries, then the joined tiles, keeps the online softmax state (running maximum and sum,
float32 accumulator) in core buffers and writes the unit's rows at the end.  Every unit is one
runtime phase (queries, keys, values in, its output out, a wait).  When ``ctx`` is not a
multiple of ``tile_size`` the last tile is read shifted back to end at ``ctx`` (a shim
descriptor cannot pad) and the kernel skips the keys an earlier tile scored.

**QKVRoPE.** One pass per KV head on one compute tile: the chunk's rows in, their query heads
of that head's group rotated out to q (rotate-half RoPE, angle ``pos[r] * inv_freq`` in
float32; sine and cosine computed in the kernel, since the AIE API's ``sin`` / ``cos`` exist
only on the first-generation AIE), the rotated key head and the value head kept in core
buffers, then the head's cache tiles of keys and of values through the core and back.
**SlotQKVRoPE** rotates each row whole and splits it in the memory tile into q and the k, v
rows of its slot.  **CacheWrite** is QKVRoPE's cache half: per KV head the rows in, then the
head's cache tiles through the core.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Iterator

import numpy as np

from ...operator import Rule, rule
from ...operators import Attention, CacheWrite, QKVRoPE
from ...operators.llm import Slotted
from .design import (Arg, Buf, Buffer, Call, Core, Design, Fifo, Iv, Link, Loop, Pattern, Rtp,
                     Tile, Transfer, consume, linear, produce, release, shim)
from .kernels import lanes
from . import qkv_weights
from .resources import NpuResources
from .rotation import rotating

#: Where the cost model prices a design whose transfers follow the position: the middle of
#: its context (a decode token at position ctx / 2 reads half of its keys).
PRICED_AT = 0.5
#: Query rows of one attention work unit at most (prefill): 8 rows of 3 heads of 64 keep a
#: unit's queries, output and accumulator at 18 KiB of a core's 64.
ROW_BLOCK = 8
DESIGNED = (QKVRoPE, Attention, CacheWrite)
#: The shim tiles a Qwen QKVRoPE's weights come from (shims 0 and 1 feed the rows, the cache
#: tiles, the positions and the frequencies): two channels each.
WEIGHT_FEEDS = (shim(2), shim(2), shim(3))


def has_design(op) -> bool:
    """Whether ``op`` is drawn here; the slotted QKVRoPE's Qwen variants (``bias``,
    ``qk_norm``) are not yet, so they run on the host between NPU calls."""
    return isinstance(op, DESIGNED) and not (slotted(op) and isinstance(op, QKVRoPE)
                                             and (op.bias or op.qk_norm))


def slotted(op) -> bool:
    """A slotted form (``SlotQKVRoPE``, ``SlotAttention``): every row its own sequence, at
    ``pos[r]`` of cache slot ``slot[r]``; the caches are ``(slots, kv_heads, ctx, head_dim)``."""
    return isinstance(op, Slotted)


def row_block(op: Attention) -> int:
    if slotted(op):  # rows of different sequences share no keys
        return 1
    return max(d for d in range(1, min(op.rows, ROW_BLOCK) + 1) if op.rows % d == 0)


def units(op: Attention) -> int:
    return op.rows // row_block(op) * op.kv_heads


def family_rules(op, res: NpuResources) -> Iterator[Rule]:
    v = lanes()
    if isinstance(op, CacheWrite):
        yield rule(op.head_dim % v == 0, "", f"head_dim % {v} == 0 (the kernel copies whole "
                   f"{v}-lane bf16 vectors of a head)")
        yield rule(op.rows <= 1023 and op.kv_heads <= 1023, "", "rows <= 1023 and kv_heads <= "
                   "1023 (the write's access pattern walks each in one dimension)")
        return
    if isinstance(op, QKVRoPE):
        yield rule(op.head_dim % (2 * v) == 0, "", f"head_dim % {2 * v} == 0 (the kernel "
                   f"rotates whole {v}-lane bf16 vectors of each half of a head)")
        yield rule(op.rows <= 1023, "", "rows <= 1023 (the cache write's access pattern "
                   "walks the rows in one dimension)")
        return
    yield rule(op.head_dim % v == 0, "", f"head_dim % {v} == 0 (the kernels take whole "
               f"{v}-lane bf16 vectors of a head)")
    yield rule(2 * op.num_aie_columns <= res.columns, "num_aie_columns",
               f"2 * num_aie_columns <= {res.columns} columns of {res.name} (each column's "
               "keys and values come from a second shim tile: a shim tile has two channels "
               "to the array and a unit needs three streams)")
    if isinstance(op, Attention):
        n = units(op)
        yield rule(n % op.num_aie_columns == 0, "num_aie_columns",
                   f"num_aie_columns divides the {n} (row block, KV head) units")


def design_for(op, res: NpuResources) -> Design:
    if isinstance(op, CacheWrite):
        return cache_write(op, res)
    return attention(op, res) if isinstance(op, Attention) else qkv_rope(op, res)


# ---- attention -----------------------------------------------------------------------------


def rtp_words(rows: int) -> int:
    """Words of a core's runtime-parameter buffer: a position per row, whole 16-word rows."""
    return rows + (-rows) % 16


def attention(op: Attention, res: NpuResources) -> Design:
    if slotted(op):
        return slot_attention(op, res)
    rows, cols = op.rows, op.num_aie_columns
    fifos, links, buffers, cores = [], [], [], []
    for c in range(cols):
        core, (pos,) = relay(fifos, shim(c), Tile(c, 3), Tile(c, 2),
                             (("pos", (rows,), "i32", "attn_positions"),), f"_{c}")
        cores.append(core)
        units_loop = attention_units(op, c, pos, fifos, links, buffers)
        cores.append(Core(Tile(c, 2), (*consume(pos), units_loop, *release("consume", pos))))
    cache = op.kv_heads * op.ctx * op.head_dim
    args = (Arg("q", rows * op.heads * op.head_dim), Arg("k_cache", cache),
            Arg("v_cache", cache), Arg("pos", rows, "i32"),
            Arg("out", rows * op.heads * op.head_dim))
    return Design(op.describe(True), res.name, args, tuple(fifos), tuple(links),
                  tuple(buffers), tuple(cores), attention_sequence(op), "attention.cc",
                  ("tile_size",))


def attention_units(op: Attention, c: int, pos, fifos: list, links: list, buffers: list,
                    counted: bool = False) -> Loop:
    """Column ``c``'s FIFOs, link and core buffers (added to the lists) and its core's loop
    over its units: per unit the queries, the key tiles one by one, the output.  ``pos`` is
    what the kernels read the positions from (a FIFO or a core buffer); ``counted``: the
    slotted form, whose kernel counts the unit's key tiles from its row's position
    (``attn_tiles``) and loops that many times, at most every tile."""
    kvh, hd, ctx, tile = op.kv_heads, op.head_dim, op.ctx, op.tile_size
    group, rb, cols = op.heads // kvh, row_block(op), op.num_aie_columns
    per, most, follow = units(op) // cols, -(-ctx // tile), 0 if counted else 1
    core, mem, feed = Tile(c, 2), Tile(c, 1), shim(cols + c)
    q, k, v, kv, out = (f"{n}_{c}" for n in ("q", "k", "v", "kv", "out"))
    acc, ml, scores = f"acc_{c}", f"ml_{c}", f"scores_{c}"
    unit, key = (2, 2) if counted else (rotating(per), rotating(most))
    fifos += [Fifo(q, shim(c), (core,), unit, (rb * group, hd)),
              Fifo(k, feed, (mem,), 2, (tile, hd)),
              Fifo(v, feed, (mem,), 2, (tile, hd)),
              Fifo(kv, mem, (core,), key, (2 * tile, hd)),
              Fifo(out, core, (shim(c),), unit, (rb * group, hd))]
    links.append(Link((k, v), (kv,), (0, tile * hd)))
    buffers += [Buffer(acc, core, (rb * group, hd)),
                Buffer(ml, core, (2 * rb * group + (-2 * rb * group) % 16,)),
                Buffer(scores, core, (tile + (-tile) % lanes(),))]
    shape = (kvh, rb, follow, group, hd, tile, ctx)
    tiles = Loop(most, (*consume(kv),
                        Call("attn_tile", (q, kv, Buf(acc), Buf(ml), Buf(scores), pos, c * per,
                                           Iv(1, 1), Iv(0, 1), *shape,
                                           float(1 / math.sqrt(hd)))),
                        *release("consume", kv)), dynamic="tiles" if counted else "")
    count = (Call("attn_tiles", (pos, c * per, Iv(0, 1), kvh, rb, follow, tile, ctx),
                  "tiles"),) if counted else ()
    return Loop(per, (*consume(q), *produce(out), *count,
                      Call("attn_init", (Buf(acc), Buf(ml), rb * group, hd)),
                      tiles,
                      Call("attn_finish", (Buf(acc), Buf(ml), out, rb * group, hd)),
                      *release("consume", q), *release("produce", out)))


def relay(fifos: list, feed: Tile, at: Tile, to: Tile, params,
          suffix: str = "") -> tuple[Core, list[str]]:
    """How data of the dispatch reach a compute tile ``to`` whose two input channels are taken
    (Attention's queries and keys, QKVRoPE's rows and cache tiles): the runtime sequence sends
    each parameter ``(stem, shape, dtype, function)`` (the positions, as data: the same transfer
    at every position) from ``feed`` to the neighbouring tile ``at``, whose core copies it (a
    call of ``function``) into a FIFO the two share in memory, with no DMA channel (mlir-aie's
    object FIFO lowering, ``requiresDMAs``: one consumer sharing the producer's memory). The
    FIFO's locks are the handshake: ``to``'s core acquires the copy, once per dispatch, after
    the relay released it. Adds the FIFOs (``<stem>_in<suffix>`` from ``feed``,
    ``<stem><suffix>`` shared); returns the relay core and the shared FIFOs' names."""
    ins, shared, calls = [], [], []
    for stem, shape, dtype, function in params:
        into, out = f"{stem}_in{suffix}", f"{stem}{suffix}"
        fifos += [Fifo(into, feed, (at,), 1, shape, dtype), Fifo(out, at, (to,), 1, shape, dtype)]
        ins.append(into)
        shared.append(out)
        calls.append(Call(function, (into, out, math.prod(shape))))
    core = Core(at, (*consume(*ins), *produce(*shared), *calls, *release("consume", *ins),
                     *release("produce", *shared)))
    return core, shared


def attention_sequence(op: Attention) -> tuple:
    """The one sequence every dispatch runs: the positions to each column's relay first, then
    per unit its queries, every key and value tile of its KV head (the whole context: the
    kernel scores only the keys up to each row's position, so the data moved does not depend
    on it) and its output, and a wait."""
    rows, heads, kvh, hd, ctx, tile = (op.rows, op.heads, op.kv_heads, op.head_dim, op.ctx,
                                       op.tile_size)
    group, rb, cols = heads // kvh, row_block(op), op.num_aie_columns
    per, most = units(op) // cols, -(-ctx // tile)
    phases = []
    for i in range(per):
        phase = [Transfer("in", 3, f"pos_in_{c}", shim(c), linear(0, rows))
                 for c in range(cols)] if i == 0 else []
        for c in range(cols):
            b, h = divmod(c * per + i, kvh)
            qp = Pattern(b * rb * heads * hd + h * group * hd, (1, 1, rb, group * hd),
                         (0, 0, heads * hd, 1))
            phase.append(Transfer("in", 0, f"q_{c}", shim(c), qp))
            for arg, name in ((1, "k"), (2, "v")):
                phase += tile_transfers(arg, f"{name}_{c}", shim(cols + c), h * ctx * hd, most,
                                        tile, hd, ctx)
            phase.append(Transfer("out", 4, f"out_{c}", shim(c), qp))
        phases.append(tuple(phase))
    return tuple(phases)


def slot_attention(op: Attention, res: NpuResources) -> Design:
    rows, cols = op.rows, op.num_aie_columns
    fifos, links, buffers, cores = [], [], [], []
    for c in range(cols):
        rtp = f"rtp_{c}"
        buffers.append(Buffer(rtp, Tile(c, 2), (rtp_words(rows),), "i32"))
        cores.append(Core(Tile(c, 2), (attention_units(op, c, Buf(rtp), fifos, links, buffers,
                                                       counted=True),)))
    args = (Arg("q", rows * op.heads * op.head_dim), Arg("k_cache", 0), Arg("v_cache", 0),
            Arg("pos", rows, "i32"), Arg("slot", rows, "i32"),
            Arg("out", rows * op.heads * op.head_dim))
    params = (("cols", cols), ("ctx", op.ctx), ("head_dim", op.head_dim), ("heads", op.heads),
              ("kind", "slot_attention"), ("kv_heads", op.kv_heads),
              ("rows", rows), ("tile", op.tile_size))
    design = Design(op.describe(True), res.name, args, tuple(fifos), tuple(links),
                    tuple(buffers), tuple(cores), (), "attention.cc", ("tile_size",), params)
    return at_bound(design)


def key_tiles(first: int, last: int, tile: int, ctx: int) -> int:
    """Key tiles a block of query rows at positions ``first .. last`` attends: those holding
    keys ``0 .. min(last, ctx - 1)``; none when every row is padding (``last < 0``).  The same
    count as ``attn_tiles`` in ``attention.cc``."""
    if last < 0:
        return 0
    return -(-min(last + 1, ctx) // tile)


def tile_transfers(arg: int, fifo: str, feed: Tile, base: int, n: int, tile: int, hd: int,
                   ctx: int) -> list[Transfer]:
    """``n`` key (or value) tiles of one head from element ``base``: one contiguous run, the
    last tile shifted back to end at ``ctx`` when it would pass it (its own descriptor)."""
    if n == 0:
        return []
    if n * tile <= ctx:
        return [Transfer("in", arg, fifo, feed, linear(base, n * tile * hd))]
    head = [Transfer("in", arg, fifo, feed, linear(base, (n - 1) * tile * hd))] if n > 1 \
        else []
    return head + [Transfer("in", arg, fifo, feed, linear(base + (ctx - tile) * hd, tile * hd))]


def attention_dispatch(p: dict, pos: np.ndarray, slot: np.ndarray):
    """SlotAttention: unit (row r, KV head h) reads the key tiles of ``pos[r]`` in slot
    ``slot[r]``."""
    rows, heads, kvh, hd, ctx, tile, cols = (p[k] for k in (
        "rows", "heads", "kv_heads", "head_dim", "ctx", "tile", "cols"))
    group = heads // kvh
    per = rows * kvh // cols
    rtps = tuple(Rtp(f"rtp_{c}", r, int(pos[r])) for c in range(cols) for r in range(rows))
    phases = []
    for i in range(per):
        phase = []
        for c in range(cols):
            r, h = divmod(c * per + i, kvh)
            qp = Pattern(r * heads * hd + h * group * hd, (1, 1, 1, group * hd),
                         (0, 0, heads * hd, 1))
            phase.append(Transfer("in", 0, f"q_{c}", shim(c), qp))
            n = key_tiles(int(pos[r]), int(pos[r]), tile, ctx)
            for arg, name in ((1, "k"), (2, "v")):
                phase += tile_transfers(arg, f"{name}_{c}", shim(cols + c),
                                        (int(slot[r]) * kvh + h) * ctx * hd, n, tile, hd, ctx)
            phase.append(Transfer("out", 5, f"out_{c}", shim(c), qp))
        phases.append(tuple(phase))
    return rtps, tuple(phases)


# ---- QKVRoPE -------------------------------------------------------------------------------


def qkv_rope(op: QKVRoPE, res: NpuResources) -> Design:
    """One pass per KV head h on compute tile (0, 2): the chunk's rows in, their query heads of
    group h rotated out to q, the rotated key head h and value head h kept in core buffers;
    then every cache tile of head h's keys and values through the core, the rows that land in
    it replaced (``cache_patch``), back to the cache.  The positions and frequencies reach the
    core through the tile above it (``relay``), as Attention's positions do.  Every count is
    constant: a dispatch moves the whole cache, at any position."""
    if slotted(op):
        return slot_qkv_rope(op, res)
    rows, heads, kvh, hd, ctx = op.rows, op.heads, op.kv_heads, op.head_dim, op.ctx
    group, width, tile = heads // kvh, (heads + 2 * kvh) * hd, cache_tile(ctx)
    tiles = ctx // tile
    core = Tile(0, 2)
    fifos: list = []
    cores = []
    relayed, (pos, freq) = relay(fifos, shim(1), Tile(0, 3), core, (
        ("pos", (rows,), "i32", "rope_positions"),
        ("freq", (hd // 2,), "f32", "rope_frequencies")))
    cores.append(relayed)
    row_fifos, links = qkv_weights.row_fifos(op, core, Tile(0, 1), rotating(rows),
                                             WEIGHT_FEEDS, shim(0))
    fifos += [*row_fifos,
              Fifo("q", core, (shim(0),), rotating(rows), (group * hd,)),
              Fifo("cache_in", shim(0), (core,), rotating(tiles), (tile, hd)),
              Fifo("cache_out", core, (shim(0),), rotating(tiles), (tile, hd))]
    buffers = (Buffer("k_rows", core, (rows, hd), "bf16"),
               Buffer("v_rows", core, (rows, hd), "bf16"), *qkv_weights.head_buffer(op, core))

    rotate = Loop(rows, (*consume("qkv"), *produce("q"),
                         qkv_weights.head_row_call(op, pos, freq),
                         *release("consume", "qkv"), *release("produce", "q")))
    body = (*consume(pos, freq), Loop(kvh, (rotate, patch_loop(ctx, hd, rows, "k_rows", pos),
                                            patch_loop(ctx, hd, rows, "v_rows", pos))),
            *release("consume", pos, freq))
    cores.append(Core(core, body))
    cache = kvh * ctx * hd
    args = (Arg("qkv", rows * width), Arg("pos", rows, "i32"), Arg("inv_freq", hd // 2, "f32"),
            Arg("k_cache", cache), Arg("v_cache", cache),
            *(Arg(name, n) for name, n in qkv_weights.weights(op)), Arg("q", rows * heads * hd),
            Arg("k_cache_out", cache), Arg("v_cache_out", cache))
    return Design(op.describe(True), res.name, args, tuple(fifos), tuple(links), buffers,
                  tuple(cores), qkv_rope_sequence(op, res), "rope.cc")


def patch_loop(ctx: int, hd: int, rows: int, kept: str, pos: str) -> Loop:
    """One head's cache tiles through the core: each copied out with the chunk's rows that
    land in it (core buffer ``kept``, at the positions of FIFO ``pos``) in place."""
    tile = cache_tile(ctx)
    return Loop(ctx // tile, (*consume("cache_in"), *produce("cache_out"),
                              Call("cache_patch", ("cache_in", "cache_out", Buf(kept), pos,
                                                   Iv(0, 1), tile, hd, rows)),
                              *release("consume", "cache_in"),
                              *release("produce", "cache_out")))


def cache_pass(h: int, ctx: int, hd: int, ins: tuple[int, ...], outs: tuple[int, ...]) -> list:
    """The transfers of head ``h``'s cache tiles: in from each runtime argument of ``ins``
    (keys, then values), out to each of ``outs``, the whole head every time."""
    head = linear(h * ctx * hd, ctx * hd)
    return ([Transfer("in", a, "cache_in", shim(0), head) for a in ins]
            + [Transfer("out", a, "cache_out", shim(0), head) for a in outs])


def cache_tile(ctx: int) -> int:
    """Rows of a cache tile QKVRoPE patches: the largest divisor of ``ctx`` up to 32 (a tile
    of 32 rows of 64 is 4 KiB; the tiles cover the cache exactly, so no row is written twice)."""
    return max(d for d in range(1, min(ctx, 32) + 1) if ctx % d == 0)


def qkv_rope_sequence(op: QKVRoPE, res: NpuResources) -> tuple:
    """The one sequence every dispatch runs: the positions and frequencies to the relay, then
    per KV head a phase: the chunk's rows in (a Qwen variant's weights with each,
    ``qkv_weights``), the head group's rotated q out (strided into the q rows), the head's keys
    and then its values through the core and back, a wait."""
    rows, heads, kvh, hd, ctx = op.rows, op.heads, op.kv_heads, op.head_dim, op.ctx
    group, q = heads // kvh, 5 + len(qkv_weights.weights(op))  # q's runtime argument
    phases = []
    for h in range(kvh):
        phase = [Transfer("in", 1, "pos_in", shim(1), linear(0, rows)),
                 Transfer("in", 2, "freq_in", shim(1), linear(0, hd // 2))] if h == 0 else []
        phase += [*qkv_weights.row_transfers(op, 0, rows, WEIGHT_FEEDS, shim(0), res),
                  Transfer("out", q, "q", shim(0), Pattern(h * group * hd, (1, 1, rows,
                                                                           group * hd),
                                                          (0, 0, heads * hd, 1))),
                  *cache_pass(h, ctx, hd, (3, 4), (q + 1, q + 2))]
        phases.append(tuple(phase))
    return tuple(phases)


def slot_qkv_rope(op: QKVRoPE, res: NpuResources) -> Design:
    """SlotQKVRoPE: every row its own sequence, at ``pos[r]`` of slot ``slot[r]``, its cache
    rows rendered per dispatch."""
    rows, heads, kvh, hd, ctx = op.rows, op.heads, op.kv_heads, op.head_dim, op.ctx
    width = (heads + 2 * kvh) * hd
    core, mem = Tile(0, 2), Tile(0, 1)
    fifos = (Fifo("freq", shim(0), (core,), 1, (hd // 2,), "f32"),
             Fifo("qkv", shim(0), (core,), 2, (width,)),
             Fifo("rot", core, (mem,), 2, (width,)),
             Fifo("q", mem, (shim(0),), 2, (heads * hd,)),
             Fifo("k", mem, (shim(1),), 2, (kvh * hd,)),
             Fifo("v", mem, (shim(1),), 2, (kvh * hd,)),
             Fifo("q_past", core, (shim(0),), 2, (heads * hd,)))
    links = (Link(("rot",), ("q", "k", "v"), (0, heads * hd, (heads + kvh) * hd)),)
    buffers = (Buffer("rtp", core, (rtp_words(rows),), "i32"),)
    shape = (heads, kvh, hd)
    # each row stored or not on its own position: loops of 0 or 1
    one = Loop(1, (*consume("qkv"), *produce("rot"),
                   Call("qkv_rope_row", ("qkv", Buf("rtp"), "freq", "rot", 0, Iv(1, 1),
                                         *shape)),
                   *release("consume", "qkv"), *release("produce", "rot")),
               dynamic="stored")
    none = Loop(1, (*consume("qkv"), *produce("q_past"),
                    Call("q_rope_row", ("qkv", Buf("rtp"), "freq", "q_past", 0, Iv(1, 1),
                                        *shape)),
                    *release("consume", "qkv"), *release("produce", "q_past")),
                dynamic="past")
    row = Loop(rows, (Call("slot_row_stored", (Buf("rtp"), Iv(0, 1), ctx), "stored"), one,
                      Call("slot_row_past", (Buf("rtp"), Iv(0, 1), ctx), "past"), none))
    body = (*consume("freq"), row, *release("consume", "freq"))
    # caches of 0 elements: as many slots as the caller's cache has
    args = (Arg("qkv", rows * width), Arg("pos", rows, "i32"), Arg("inv_freq", hd // 2, "f32"),
            Arg("k_cache", 0), Arg("v_cache", 0), Arg("slot", rows, "i32"),
            Arg("q", rows * heads * hd), Arg("k_cache_out", 0), Arg("v_cache_out", 0))
    params = (("ctx", ctx), ("head_dim", hd), ("heads", heads), ("kind", "slot_qkv_rope"),
              ("kv_heads", kvh), ("rows", rows))
    design = Design(op.describe(True), res.name, args, fifos, links, buffers,
                    (Core(core, body),), (), "rope.cc", (), params)
    return at_bound(design)


def qkv_rope_dispatch(p: dict, pos: np.ndarray, slot: np.ndarray):
    """SlotQKVRoPE, one phase per row: q, and k, v at ``pos[r]`` of slot ``slot[r]`` when
    stored."""
    rows, heads, kvh, hd, ctx = (p[k] for k in ("rows", "heads", "kv_heads", "head_dim", "ctx"))
    width, qw = (heads + 2 * kvh) * hd, heads * hd
    rtps = tuple(Rtp("rtp", r, int(pos[r])) for r in range(rows))
    phases = []
    for r in range(rows):
        phase = [Transfer("in", 2, "freq", shim(0), linear(0, hd // 2))] if r == 0 else []
        phase.append(Transfer("in", 0, "qkv", shim(0), linear(r * width, width)))
        if 0 <= int(pos[r]) < ctx:
            at = Pattern((int(slot[r]) * kvh * ctx + int(pos[r])) * hd, (1, 1, kvh, hd),
                         (0, 0, ctx * hd, 1))
            phase += [Transfer("out", 6, "q", shim(0), linear(r * qw, qw)),
                      Transfer("out", 7, "k", shim(1), at),
                      Transfer("out", 8, "v", shim(1), at)]
        else:
            phase.append(Transfer("out", 6, "q_past", shim(0), linear(r * qw, qw)))
        phases.append(tuple(phase))
    return rtps, tuple(phases)


# ---- CacheWrite ----------------------------------------------------------------------------


def cache_write(op: CacheWrite, res: NpuResources) -> Design:
    """One pass per KV head on compute tile (0, 2): the rows in, the head's part kept in a
    core buffer, then every cache tile of the head through the core with the rows that land in
    it replaced (``cache_patch``) and back; the positions come through the tile above
    (``relay``).  Constant loops and one sequence at every position: a dispatch moves the
    head's whole cache in and out."""
    kvh, ctx, hd, rows = op.kv_heads, op.ctx, op.head_dim, op.rows
    core, tiles = Tile(0, 2), ctx // cache_tile(ctx)
    fifos: list = []
    relayed, (pos,) = relay(fifos, shim(1), Tile(0, 3), core,
                            (("pos", (rows,), "i32", "rope_positions"),))
    fifos += [Fifo("x", shim(0), (core,), rotating(rows), (kvh * hd,)),
              Fifo("cache_in", shim(0), (core,), rotating(tiles), (cache_tile(ctx), hd)),
              Fifo("cache_out", core, (shim(0),), rotating(tiles), (cache_tile(ctx), hd))]
    take = Loop(rows, (*consume("x"),
                       Call("cache_rows_head", ("x", Buf("head_rows"), Iv(1, 1), Iv(0, 1), hd)),
                       *release("consume", "x")))
    body = (*consume(pos), Loop(kvh, (take, patch_loop(ctx, hd, rows, "head_rows", pos))),
            *release("consume", pos))
    cache = kvh * ctx * hd
    args = (Arg("cache", cache), Arg("x", rows * kvh * hd), Arg("pos", rows, "i32"),
            Arg("cache_out", cache))
    phases = tuple(tuple(([Transfer("in", 2, "pos_in", shim(1), linear(0, rows))] if h == 0
                          else [])
                         + [Transfer("in", 1, "x", shim(0), linear(0, rows * kvh * hd)),
                            *cache_pass(h, ctx, hd, (0,), (3,))]) for h in range(kvh))
    return Design(op.describe(True), res.name, args, tuple(fifos), (),
                  (Buffer("head_rows", core, (rows, hd), "bf16"),), (relayed, Core(core, body)),
                  phases, "rope.cc")


# ---- per-dispatch rendering ------------------------------------------------------------------

#: Per design kind: its renderer (parameters, positions -> runtime parameters and sequence)
#: and the runtime argument holding the positions.
RENDERERS = {"slot_attention": (attention_dispatch, 3, 4),
             "slot_qkv_rope": (qkv_rope_dispatch, 1, 5)}


def render(design: Design, args):
    """The runtime parameters and runtime sequence of one dispatch, drawn for the positions
    among ``args``."""
    p = dict(design.renderer)
    dispatch, pos_arg, slot_arg = RENDERERS[p["kind"]]
    slot = None if slot_arg is None else np.asarray(args[slot_arg]).reshape(-1)
    return dispatch(p, np.asarray(args[pos_arg]).reshape(-1), slot)


def positions(design: Design, start: int) -> list:
    """Arguments carrying only the positions ``start ..`` (all the renderers read); slotted,
    every row at ``start`` in slot 0."""
    p = dict(design.renderer)
    _, pos_arg, slot_arg = RENDERERS[p["kind"]]
    args: list = [None] * len(design.args)
    if slot_arg is None:
        args[pos_arg] = np.arange(start, start + p["rows"], dtype=np.int32)
    else:
        args[pos_arg] = np.full(p["rows"], start + p["rows"] - 1, np.int32)
        args[slot_arg] = np.zeros(p["rows"], np.int32)
    return args


def at_bound(design: Design) -> Design:
    """The design with the sequence of its bound: the last rows of the context, every key
    tile read (what the legality rules measure and ``mlir`` writes)."""
    p = dict(design.renderer)
    rtps, sequence = render(design, positions(design, max(0, p["ctx"] - p["rows"])))
    return replace(design, rtps=rtps, sequence=sequence)


def priced(design: Design) -> Design:
    """The design as the cost model prices it: its sequence at ``PRICED_AT`` of the context and
    each core's dynamic loops at the counts its kernel returns there (a column's mean)."""
    p = dict(design.renderer)
    start = int((p["ctx"] - p["rows"]) * PRICED_AT) if p["ctx"] > p["rows"] else 0
    rtps, sequence = render(design, positions(design, start))
    counts = {}
    if p["kind"] == "slot_attention":
        pos = positions(design, start)[RENDERERS[p["kind"]][1]]
        n = key_tiles(int(pos[0]), int(pos[0]), p["tile"], p["ctx"])
        counts = {Tile(c, 2): {"tiles": n} for c in range(p["cols"])}
    else:  # slot_qkv_rope
        counts[Tile(0, 2)] = {"stored": 1, "past": 0}

    def fix(body, mine):
        return tuple(replace(op, body=fix(op.body, mine), dynamic="",
                             count=mine[op.dynamic] if op.dynamic else op.count)
                     if isinstance(op, Loop) else op for op in body)

    cores = tuple(replace(c, body=fix(c.body, counts[c.tile])) for c in design.cores)
    return replace(design, cores=cores, rtps=rtps, sequence=sequence, renderer=())
