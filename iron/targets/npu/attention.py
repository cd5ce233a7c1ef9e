"""NPU designs of the KV-cache operators: ``QKVRoPE`` (the rotation and the cache write),
``Attention`` (decode, one query row, and prefill chunks; grouped-query heads), ``CacheWrite``
and the slotted ``SlotQKVRoPE`` / ``SlotAttention`` of batched decode.

**The KV cache** lives in DRAM as the host keeps it, one layout for the design and the host:
``(kv_heads, ctx, head_dim)`` bf16, row-major (slotted: ``(slots, kv_heads, ctx, head_dim)``),
so position ``p`` of KV head ``h`` in slot ``s`` is the ``head_dim`` elements at
``((s * kv_heads + h) * ctx + p) * head_dim``.  The designs write it in place.

**Every design runs what was compiled.** Their core loops have constant trip counts and their
runtime sequences are the same at every position: the positions (slotted: and the rows' slots)
travel as data of the ``pos`` (and ``slot``) argument, to a relay core on the tile above the
working core and on through a FIFO the two share in memory (``relay``: the working core's two
input channels are taken), and the kernels use them where the data cannot: Attention reads
every key tile of the context and scores only the keys up to each row's position; QKVRoPE
passes every cache tile through its core and replaces the rows that land in it
(``cache_patch``), as CacheWrite does.
(``aiex.npu.rtp_write`` cannot carry a position instead: its value is an ``I32Attr``, a
constant of the compiled instruction stream.) The price is bytes moved per layer and dispatch,
whatever the position: Attention reads ``2 * kv_heads * ctx * head_dim * 2`` bytes of keys and
values, QKVRoPE reads and writes them, twice that (SmolLM2's 3 x 64 at ctx 8192: 6 MiB and
12 MiB). A design per context bucket (powers of two up to the context, the smallest covering the
position chosen per dispatch, ``buckets``) cuts both to the bucket's size.

**The slotted forms** (batched decode, every row its own sequence at ``pos[r]`` of cache slot
``slot[r]``) are the same designs over ``slots`` caches: the slots follow the positions through
the relay (a second element of its input FIFO: the positions' shim tile has no third channel;
the slots packed behind the positions in one runtime argument, ``pos+slot``, which one
transfer sends, so every design takes at most aiecc's five buffers), the cache tiles of every
slot pass (one transfer striding over the slots per head and direction), and the kernels
score a row, or patch its cache row, only in its own slot's pass.  A dispatch moves ``slots``
times the bytes above, whatever the positions and slots; the design serves exactly ``slots``
slots (static argument sizes, as ``aiex.run`` needs), the operator's ``slots`` param.

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
buffers, then the head's cache tiles of keys and of values (of each slot in turn, slotted)
through the core and back.  **CacheWrite** is QKVRoPE's cache half: per KV head the rows in,
then the head's cache tiles through the core.
"""

from __future__ import annotations

import math
from typing import Iterator

from ...operator import Rule, rule
from ...operators import Attention, CacheWrite, QKVRoPE
from ...operators.llm import Slotted
from .ir import (Arg, Buf, Buffer, Call, Core, Design, Fifo, Iv, Link, Loop, Pattern, Place,
                 Tile, Transfer, consume, linear, produce, release, shim)
from .kernels import lanes
from . import qkv_weights
from .resources import NpuResources
from .rotation import rotating

#: Query rows of one attention work unit at most (prefill): 8 rows of 3 heads of 64 keep a
#: unit's queries, output and accumulator at 18 KiB of a core's 64.
ROW_BLOCK = 8
DESIGNED = (QKVRoPE, Attention, CacheWrite)
#: The shim tiles a Qwen QKVRoPE's weights come from (shims 0 and 1 feed the rows, the cache
#: tiles, the positions and the frequencies): two channels each.
WEIGHT_FEEDS = (shim(2), shim(2), shim(3))


def has_design(op) -> bool:
    return isinstance(op, DESIGNED)


def slotted(op) -> bool:
    """A slotted form (``SlotQKVRoPE``, ``SlotAttention``): every row its own sequence, at
    ``pos[r]`` of cache slot ``slot[r]``; the caches are ``(slots, kv_heads, ctx, head_dim)``."""
    return isinstance(op, Slotted)


def row_block(op: Attention) -> int:
    """Query rows of a work unit: the largest divisor of the rows up to ``ROW_BLOCK`` (slotted
    too: rows of different slots share the unit's pass over every slot's keys)."""
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


def attention(op: Attention, res: NpuResources) -> Design:
    rows, cols, slots = op.rows, op.num_aie_columns, slot_count(op)
    fifos, links, buffers, cores = [], [], [], []
    for c in range(cols):
        core, (pos,) = relay(fifos, shim(c), Tile(c, 3), Tile(c, 2),
                             (position_param(op, "attn_positions"),), f"_{c}")
        cores.append(core)
        units_loop = attention_units(op, c, pos, fifos, links, buffers)
        cores.append(Core(Tile(c, 2), (*consume(pos), units_loop, *release("consume", pos))))
    cache = slots * op.kv_heads * op.ctx * op.head_dim
    args = (Arg("q", rows * op.heads * op.head_dim), Arg("k_cache", cache),
            Arg("v_cache", cache), position_arg(op), Arg("out", rows * op.heads * op.head_dim))
    places = (*map(Place, range(4)), Place(3, rows), Place(4)) if slotted(op) else ()
    return Design(op.describe(True), res.name, args, tuple(fifos), tuple(links),
                  tuple(buffers), tuple(cores), attention_sequence(op), "attention.cc",
                  ("tile_size",), places)


def slot_count(op) -> int:
    """Cache slots a design moves: the slotted forms' ``slots``, else the one sequence."""
    return op.slots if slotted(op) else 1


def position_arg(op) -> Arg:
    """The runtime argument of the positions: slotted, the rows' slots packed behind them
    (``pos+slot``, one buffer: aiecc's xclbin kernel binds five, ``trip_rules``)."""
    return Arg("pos+slot", 2 * op.rows, "i32") if slotted(op) else Arg("pos", op.rows, "i32")


def position_param(op, function: str) -> tuple:
    """The relay parameter carrying the positions (``relay``): the rows' positions, and in a
    slotted form their slots after them (two elements of the relay's input, one transfer
    each: the positions' shim tile has no third channel for a FIFO of their own)."""
    if slotted(op):
        return ("pos", (2 * op.rows,), "i32", function, 2)
    return ("pos", (op.rows,), "i32", function, 1)


def attention_units(op: Attention, c: int, pos, fifos: list, links: list,
                    buffers: list) -> Loop:
    """Column ``c``'s FIFOs, link and core buffers (added to the lists) and its core's loop
    over its units: per unit the queries, the key tiles one by one (slotted: every slot's, the
    kernel scoring a row only in its own slot), the output.  ``pos`` is the FIFO the kernels
    read the positions (and slots) from."""
    kvh, hd, ctx, tile = op.kv_heads, op.head_dim, op.ctx, op.tile_size
    group, rb, cols = op.heads // kvh, row_block(op), op.num_aie_columns
    per, most, follow = units(op) // cols, -(-ctx // tile), 0 if slotted(op) else 1
    core, mem, feed = Tile(c, 2), Tile(c, 1), shim(cols + c)
    q, k, v, kv, out = (f"{n}_{c}" for n in ("q", "k", "v", "kv", "out"))
    acc, ml, scores = f"acc_{c}", f"ml_{c}", f"scores_{c}"
    fifos += [Fifo(q, shim(c), (core,), rotating(per), (rb * group, hd)),
              Fifo(k, feed, (mem,), 2, (tile, hd)),
              Fifo(v, feed, (mem,), 2, (tile, hd)),
              Fifo(kv, mem, (core,), rotating(most), (2 * tile, hd)),
              Fifo(out, core, (shim(c),), rotating(per), (rb * group, hd))]
    links.append(Link((k, v), (kv,), (0, tile * hd)))
    buffers += [Buffer(acc, core, (rb * group, hd)),
                Buffer(ml, core, (2 * rb * group + (-2 * rb * group) % 16,)),
                Buffer(scores, core, (tile + (-tile) % lanes(),))]
    shape = (kvh, rb, follow, group, hd, tile, ctx, op.rows)
    if slotted(op):  # the unit, the slot, the key tile
        unit, slot, key = Iv(2, 1), Iv(1, 1), Iv(0, 1)
    else:
        unit, slot, key = Iv(1, 1), -1, Iv(0, 1)
    tiles = Loop(most, (*consume(kv),
                        Call("attn_tile", (q, kv, Buf(acc), Buf(ml), Buf(scores), pos, c * per,
                                           unit, slot, key, *shape,
                                           float(1 / math.sqrt(hd)))),
                        *release("consume", kv)))
    keys = Loop(op.slots, (tiles,)) if slotted(op) else tiles
    return Loop(per, (*consume(q), *produce(out),
                      Call("attn_init", (Buf(acc), Buf(ml), rb * group, hd)),
                      keys,
                      Call("attn_finish", (Buf(acc), Buf(ml), out, rb * group, hd)),
                      *release("consume", q), *release("produce", out)))


def relay(fifos: list, feed: Tile, at: Tile, to: Tile, params,
          suffix: str = "") -> tuple[Core, list[str]]:
    """How data of the dispatch reach a compute tile ``to`` whose two input channels are taken
    (Attention's queries and keys, QKVRoPE's rows and cache tiles): the runtime sequence sends
    each parameter ``(stem, shape, dtype, function, parts)`` (the positions, as data: the same
    transfer at every position) from ``feed`` to the neighbouring tile ``at``, in ``parts``
    elements (one transfer each), whose core copies them (calls of ``function``: input, output,
    offset, count) into one element of a FIFO the two share in memory, with no DMA channel
    (mlir-aie's object FIFO lowering, ``requiresDMAs``: one consumer sharing the producer's
    memory). The FIFO's locks are the handshake: ``to``'s core acquires the copy, once per
    dispatch, after the relay released it. Adds the FIFOs (``<stem>_in<suffix>`` from
    ``feed``, ``<stem><suffix>`` shared); returns the relay core and the shared FIFOs' names."""
    body, shared = [], []
    for stem, shape, dtype, function, parts in params:
        into, out = f"{stem}_in{suffix}", f"{stem}{suffix}"
        n = math.prod(shape) // parts
        fifos += [Fifo(into, feed, (at,), rotating(parts), (n,), dtype),
                  Fifo(out, at, (to,), 1, shape, dtype)]
        shared.append(out)
        copy = (*consume(into), Call(function, (into, out, Iv(0, n) if parts > 1 else 0, n)),
                *release("consume", into))
        body += [*produce(out), *((Loop(parts, copy),) if parts > 1 else copy)]
    core = Core(at, (*body, *release("produce", *shared)))
    return core, shared


def relay_transfer(feed: Tile, stem: str, arg: Arg, at: int, suffix: str = "") -> Transfer:
    """The transfer filling relay parameter ``stem`` from runtime argument ``arg`` (index
    ``at``), all of it: every element of the parameter's input FIFO in turn (slotted
    positions: the positions, then the slots packed behind them).  32-bit words: at most
    1023 to a DMA dimension."""
    return Transfer("in", at, f"{stem}_in{suffix}", feed, linear(0, arg.numel, 1023))


def attention_sequence(op: Attention) -> tuple:
    """The one sequence every dispatch runs: the positions (and slots) to each column's relay
    first, then per unit its queries, every key and value tile of its KV head (of every slot,
    slotted: the whole context of each; the kernel scores only the keys up to each row's
    position in its own slot, so the data moved depend on neither) and its output, and a
    wait."""
    rows, heads, kvh, hd, ctx, tile = (op.rows, op.heads, op.kv_heads, op.head_dim, op.ctx,
                                       op.tile_size)
    group, rb, cols = heads // kvh, row_block(op), op.num_aie_columns
    per, most = units(op) // cols, -(-ctx // tile)
    phases = []
    for i in range(per):
        phase = [relay_transfer(shim(c), "pos", position_arg(op), 3, f"_{c}")
                 for c in range(cols)] if i == 0 else []
        for c in range(cols):
            b, h = divmod(c * per + i, kvh)
            qp = Pattern(b * rb * heads * hd + h * group * hd, (1, 1, rb, group * hd),
                         (0, 0, heads * hd, 1))
            phase.append(Transfer("in", 0, f"q_{c}", shim(c), qp))
            for arg, name in ((1, "k"), (2, "v")):
                phase += slot_tile_transfers(op, arg, f"{name}_{c}", shim(cols + c), h, most)
            phase.append(Transfer("out", 4, f"out_{c}", shim(c), qp))
        phases.append(tuple(phase))
    return tuple(phases)


def slot_tile_transfers(op: Attention, arg: int, fifo: str, feed: Tile, h: int,
                        most: int) -> list[Transfer]:
    """Every key (or value) tile of KV head ``h``, slot after slot: one transfer striding over
    the slots when the tiles cover the context exactly, else each slot's own."""
    hd, ctx, tile, slots = op.head_dim, op.ctx, op.tile_size, slot_count(op)
    if most * tile == ctx:
        return [Transfer("in", arg, fifo, feed, p) for p in over_slots(op, h)]
    return [t for s in range(slots) for t in tile_transfers(
        arg, fifo, feed, (s * op.kv_heads + h) * ctx * hd, most, tile, hd, ctx)]


def over_slots(op, h: int) -> list[Pattern]:
    """KV head ``h``'s whole context in every slot, in slot order: one pattern striding over
    the slots where the head's run fits three dimensions, else one run per slot."""
    hd, ctx, kvh, slots = op.head_dim, op.ctx, op.kv_heads, slot_count(op)
    run = linear(h * ctx * hd, ctx * hd)
    if slots == 1:
        return [run]
    if run.sizes[1] == 1 and slots <= 1023:
        return [Pattern(run.offset, (1, slots, *run.sizes[2:]),
                        (0, kvh * ctx * hd, *run.strides[2:]))]
    return [linear((s * kvh + h) * ctx * hd, ctx * hd) for s in range(slots)]


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


# ---- QKVRoPE -------------------------------------------------------------------------------


def qkv_rope(op: QKVRoPE, res: NpuResources) -> Design:
    """One pass per KV head h on compute tile (0, 2): the chunk's rows in, their query heads of
    group h rotated out to q, the rotated key head h and value head h kept in core buffers;
    then every cache tile of head h's keys and values (of every slot, slotted) through the
    core, the rows that land in it replaced (``cache_patch``), back to the cache.  The
    positions (and slots) and frequencies reach the core through the tile above it
    (``relay``), as Attention's positions do.  Every count is constant: a dispatch moves the
    whole cache, at any position."""
    rows, heads, kvh, hd, ctx = op.rows, op.heads, op.kv_heads, op.head_dim, op.ctx
    group, width, tile = heads // kvh, (heads + 2 * kvh) * hd, cache_tile(ctx)
    tiles, slots = ctx // tile, slot_count(op)
    core = Tile(0, 2)
    fifos: list = []
    cores = []
    relayed, (pos, freq) = relay(fifos, shim(1), Tile(0, 3), core, (
        position_param(op, "rope_positions"),
        ("freq", (hd // 2,), "f32", "rope_frequencies", 1)))
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
    body = (*consume(pos, freq), Loop(kvh, (rotate, *patch_loops(op, "k_rows", pos),
                                            *patch_loops(op, "v_rows", pos))),
            *release("consume", pos, freq))
    cores.append(Core(core, body))
    cache = slots * kvh * ctx * hd
    rows_arg = qkv_weights.rows_arg(op)
    args = (rows_arg, position_arg(op), Arg("inv_freq", hd // 2, "f32"), Arg("k_cache", cache),
            Arg("v_cache", cache))
    *weights, q, _ = qkv_weights.offsets(op)[1:]
    places = (*map(Place, range(5)), *((Place(1, rows),) if slotted(op) else ()),
              *(Place(0, at) for at in weights), Place(0, q), Place(3), Place(4))
    return Design(op.describe(True), res.name, args, tuple(fifos), tuple(links), buffers,
                  tuple(cores), qkv_rope_sequence(op, res), "rope.cc", (), places)


def patch_loops(op, kept: str, pos: str) -> tuple[Loop, ...]:
    """One head's cache tiles through the core (of each slot in turn, slotted): each copied out
    with the chunk's rows that land in it (core buffer ``kept``, at the positions of FIFO
    ``pos``; slotted, only the rows of that slot) in place."""
    ctx, hd, rows = op.ctx, op.head_dim, op.rows
    tile = cache_tile(ctx)
    follow, slot = (0, Iv(1, 1)) if slotted(op) else (1, -1)
    tiles = Loop(ctx // tile, (*consume("cache_in"), *produce("cache_out"),
                               Call("cache_patch", ("cache_in", "cache_out", Buf(kept), pos,
                                                    Iv(0, 1), slot, tile, hd, rows, follow)),
                               *release("consume", "cache_in"),
                               *release("produce", "cache_out")))
    return (Loop(op.slots, (tiles,)),) if slotted(op) else (tiles,)


def cache_pass(op, h: int, ins: tuple[int, ...], outs: tuple[int, ...]) -> list:
    """The transfers of head ``h``'s cache tiles: in from each runtime argument of ``ins``
    (keys, then values), out to each of ``outs``, the whole head (of every slot) every time."""
    runs = over_slots(op, h)
    return ([Transfer("in", a, "cache_in", shim(0), p) for a in ins for p in runs]
            + [Transfer("out", a, "cache_out", shim(0), p) for a in outs for p in runs])


def cache_tile(ctx: int) -> int:
    """Rows of a cache tile QKVRoPE patches: the largest divisor of ``ctx`` up to 32 (a tile
    of 32 rows of 64 is 4 KiB; the tiles cover the cache exactly, so no row is written twice)."""
    return max(d for d in range(1, min(ctx, 32) + 1) if ctx % d == 0)


def qkv_rope_sequence(op: QKVRoPE, res: NpuResources) -> tuple:
    """The one sequence every dispatch runs: the positions (and slots) and frequencies to the
    relay, then per KV head a phase: the chunk's rows in (a Qwen variant's weights with each,
    ``qkv_weights``), the head group's rotated q out (strided into the q rows), the head's keys
    and then its values through the core and back (of every slot, slotted), a wait."""
    rows, heads, kvh, hd = op.rows, op.heads, op.kv_heads, op.head_dim
    group, q = heads // kvh, qkv_weights.offsets(op)[-2]  # where q starts in argument 0
    phases = []
    for h in range(kvh):
        phase = [relay_transfer(shim(1), "pos", position_arg(op), 1),
                 relay_transfer(shim(1), "freq", Arg("inv_freq", hd // 2, "f32"), 2)
                 ] if h == 0 else []
        phase += [*qkv_weights.row_transfers(op, 0, rows, WEIGHT_FEEDS, shim(0), res),
                  Transfer("out", 0, "q", shim(0), Pattern(q + h * group * hd,
                                                           (1, 1, rows, group * hd),
                                                           (0, 0, heads * hd, 1))),
                  *cache_pass(op, h, (3, 4), (3, 4))]
        phases.append(tuple(phase))
    return tuple(phases)


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
                            (position_param(op, "rope_positions"),))
    fifos += [Fifo("x", shim(0), (core,), rotating(rows), (kvh * hd,)),
              Fifo("cache_in", shim(0), (core,), rotating(tiles), (cache_tile(ctx), hd)),
              Fifo("cache_out", core, (shim(0),), rotating(tiles), (cache_tile(ctx), hd))]
    take = Loop(rows, (*consume("x"),
                       Call("cache_rows_head", ("x", Buf("head_rows"), Iv(1, 1), Iv(0, 1), hd)),
                       *release("consume", "x")))
    body = (*consume(pos), Loop(kvh, (take, *patch_loops(op, "head_rows", pos))),
            *release("consume", pos))
    cache = kvh * ctx * hd
    args = (Arg("cache", cache), Arg("x", rows * kvh * hd), Arg("pos", rows, "i32"),
            Arg("cache_out", cache))
    phases = tuple(tuple(([relay_transfer(shim(1), "pos", args[2], 2)] if h == 0 else [])
                         + [Transfer("in", 1, "x", shim(0), linear(0, rows * kvh * hd)),
                            *cache_pass(op, h, (0,), (3,))]) for h in range(kvh))
    return Design(op.describe(True), res.name, args, tuple(fifos), (),
                  (Buffer("head_rows", core, (rows, hd), "bf16"),), (relayed, Core(core, body)),
                  phases, "rope.cc")
