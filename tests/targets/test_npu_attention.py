"""The npu designs of the KV-cache operators (``iron/targets/npu/attention.py``): QKVRoPE,
Attention (decode and prefill chunks, grouped-query heads) and their slotted forms, emulated
against the operators' references at several positions on the same loaded design, each running
its one compiled sequence, and their modules verified against mlir-aie's op definitions."""

import dataclasses
import os
import shutil
import subprocess

import numpy as np
import pytest

from iron.operators import Attention, CacheWrite, QKVRoPE, SlotAttention, SlotQKVRoPE
from iron.resolution import legal_settings
from iron.targets import npu, target_for
from iron.targets.npu import attention
from iron.targets.npu.bds import allocate
from iron.targets.npu.check import design_rules
from iron.targets.npu.ir import Tile
from iron.targets.npu.mlir import render
from iron.targets.npu.resources import resources
from iron.targets.npu.trip_rules import constant_trip_counts, sequence_arguments
from iron.targets.npu.verify import violations as rule_violations
from iron.targets.npu.verify import check_text
from opcases import OneStep, assert_close, tolerance_on

#: (operator, shape, positions of the dispatches in a row, device, tunables or None: every
#: legal setting).  Positions: the middle and the end of the context, the start, rows past the
#: end, padding rows before the start (prefill); a ctx that is not a multiple of the tile (the
#: last tile read shifted back).
CASES = [
    (Attention, dict(rows=1, heads=9, kv_heads=3, head_dim=64, ctx=64), (31, 63, 0), "npu2",
     None),
    (Attention, dict(rows=1, heads=9, kv_heads=3, head_dim=64, ctx=300), (299, 150, 7), "npu2",
     dict(tile_size=64, num_aie_columns=3)),
    (Attention, dict(rows=8, heads=9, kv_heads=3, head_dim=64, ctx=64), (56, 0, -3), "npu1",
     None),
    (Attention, dict(rows=5, heads=4, kv_heads=2, head_dim=16, ctx=40), (3, 35, 38), "npu2",
     None),
    (QKVRoPE, dict(rows=1, heads=9, kv_heads=3, head_dim=64, ctx=64), (63, 0, 64), "npu2", {}),
    (QKVRoPE, dict(rows=8, heads=4, kv_heads=2, head_dim=32, ctx=40), (36, 0, 30), "npu1", {}),
    (SlotAttention, dict(rows=2, slots=3, heads=9, kv_heads=3, head_dim=64, ctx=300), (), "npu2",
     dict(tile_size=64, num_aie_columns=3)),
    (SlotAttention, dict(rows=4, slots=5, heads=8, kv_heads=2, head_dim=16, ctx=64), (), "npu2",
     None),
    (SlotQKVRoPE, dict(rows=4, slots=6, heads=9, kv_heads=3, head_dim=64, ctx=64), (), "npu2",
     {}),
    (CacheWrite, dict(kv_heads=3, ctx=64, head_dim=64, rows=8), (60, 0, 70), "npu2", {}),
    (CacheWrite, dict(kv_heads=3, ctx=64, head_dim=64, rows=1), (63, 5, 64), "npu1", {}),
]


def violations(text: str) -> list[str]:
    """The trip-count and argument rules' messages on ``text``."""
    return rule_violations(text, (constant_trip_counts, sequence_arguments))


def case_inputs(cls, shape, position, seed):
    fields = {k: v for k, v in shape.items()}
    at = {Attention: 3, QKVRoPE: 1, CacheWrite: 2}.get(cls)  # the positions input
    if at is not None:
        fields["pos"] = 0
    _, inputs = cls.example(np.random.default_rng(seed), **fields)
    if at is not None:
        inputs[at] = np.arange(position, position + shape["rows"], dtype=np.int32)
    return inputs


def settings(cls, shape, dev, given):
    inputs = case_inputs(cls, shape, 0, 0)
    op = OneStep(cls, {}, dev).record_like(inputs).ops[0] if given is None else None
    return legal_settings(op, dev) if given is None else [given]


@pytest.mark.parametrize("cls,shape,positions,dev,given", CASES,
                         ids=[f"{c.__name__}-{i}" for i, c in enumerate(x[0] for x in CASES)])
def test_emulation_matches_the_reference_dispatch_after_dispatch(cls, shape, positions, dev,
                                                                given):
    """One loaded design per setting, dispatched at each position in a row (slotted: random
    positions, padding rows of position -1 among them, and distinct slots, three times)."""
    found = settings(cls, shape, dev, given)
    assert found, f"{cls.__name__} {shape} has no legal setting on {dev}"
    for setting in found:
        graph = OneStep(cls, setting, dev)
        first = case_inputs(cls, shape, positions[0] if positions else 0, 0)
        exe = target_for(graph.device).emulated().load(graph.record_like(first))
        assert all(d is not None for d in exe.designs), "placed on the host"
        for seed, position in enumerate(positions or (0, 0, 0)):
            xs = case_inputs(cls, shape, position, seed)
            want = graph.reference(*[x.copy() for x in xs])
            got = exe.run([x.copy() for x in xs])
            for g, w in zip(got, want if isinstance(want, tuple) else (want,)):
                assert_close(cls.__name__, g, w, tolerance_on(cls.__name__, dev))


DECODE = Attention(rows=1, heads=9, kv_heads=3, head_dim=64, ctx=8192, tile_size=64,
                   num_aie_columns=3)


def position_args(design, pos):
    args = [np.zeros(a.numel, np.int32) if a.dtype == "i32" else None for a in design.args]
    args[3][:] = np.arange(pos, pos + args[3].size)
    return args


def moved(design, args) -> int:
    """Elements the design's sequence moves to or from the runtime arguments ``args``."""
    return sum(t.pattern.numel for p in design.sequence for t in p if t.arg in args)


def test_attention_runs_its_compiled_sequence_at_every_position():
    """No host rendering: every dispatch runs the design's own sequence (what ``mlir`` wrote),
    the positions travelling as data of its ``pos`` argument; a decode token reads every key
    and value of the context, the kernel scoring those up to the position."""
    d = npu.design_of(DECODE, "npu2")
    assert moved(d, (1,)) == 3 * 8192 * 64
    assert [t.arg for t in d.sequence[0][:3]] == [3, 3, 3]  # the positions go first
    generic = render(d, generic=True)
    assert "aiex.npu.rtp_write" not in generic and violations(generic) == []


def test_qkv_rope_runs_its_compiled_sequence_at_every_position():
    """QKVRoPE moves the whole cache through its core at every position (the rows that land
    in a tile replaced there), so its sequence and loops are fixed; the caches are written in
    place and q lies behind the rows, so it takes five buffers."""
    op = QKVRoPE(rows=8, heads=9, kv_heads=3, head_dim=64, ctx=2048)
    d = npu.design_of(op, "npu2")
    assert moved(d, (3, 4)) == 4 * 3 * 2048 * 64  # keys and values, in and out, in place
    assert {t.direction for p in d.sequence for t in p if t.arg == 3} == {"in", "out"}
    assert attention.cache_tile(2048) == 32 and attention.cache_tile(40) == 20
    generic = render(d, generic=True)
    assert "aiex.npu.rtp_write" not in generic
    assert len(d.args) == 5 and violations(generic) == []


def test_cache_write_runs_its_compiled_sequence_at_every_position():
    """CacheWrite, as QKVRoPE's cache half: every cache tile through a core that replaces the
    rows landing in it; four buffers, constant loops."""
    d = npu.design_of(CacheWrite(kv_heads=3, ctx=2048, head_dim=64, rows=8), "npu2")
    assert len(d.args) == 4 and moved(d, (0, 3)) == 2 * 3 * 2048 * 64
    assert violations(render(d, generic=True)) == []


SLOTTED = (SlotAttention(rows=4, slots=6, heads=9, kv_heads=3, head_dim=64, ctx=2048,
                         tile_size=64, num_aie_columns=3),
           SlotQKVRoPE(rows=4, slots=6, heads=9, kv_heads=3, head_dim=64, ctx=2048))


def test_the_slotted_forms_move_every_slot_in_one_compiled_sequence():
    """The slotted forms as the unslotted ones: positions and slots relayed as data (the slots
    packed behind the positions in one argument, the second element of the relay's input,
    one transfer filling both), constant loops, every slot's cache moved (one transfer
    striding over the slots per head and direction) and static argument sizes; five buffers
    each."""
    attend, rope = (npu.design_of(op, "npu2") for op in SLOTTED)
    cache = 6 * 3 * 2048 * 64
    assert [a.numel for a in attend.args] == [4 * 9 * 64, cache, cache, 2 * 4, 4 * 9 * 64]
    assert moved(attend, (1, 2)) == 2 * cache
    relayed = [t for t in attend.sequence[0] if t.fifo.startswith("pos_in")]
    assert [(t.arg, t.pattern.numel) for t in relayed] == [(3, 2 * 4)] * 3
    assert [a.numel for a in rope.args][1:] == [2 * 4, 32, cache, cache]
    assert moved(rope, (3, 4)) == 4 * cache
    assert sum(t.arg == 3 and t.direction == "in" for p in rope.sequence for t in p) == 3
    for d in (attend, rope):
        assert len(d.args) == 5 and violations(render(d, generic=True)) == []


def test_the_last_tile_is_read_shifted_back_when_ctx_is_not_a_multiple():
    op = dataclasses.replace(DECODE, ctx=300, num_aie_columns=1)
    d = npu.design_of(op, "npu2")
    keys = [t.pattern for t in d.sequence[0] if t.arg == 1]
    assert [(p.offset, p.numel) for p in keys] == [(0, 256 * 64), ((300 - 64) * 64, 64 * 64)]


def test_the_positions_reach_the_attention_core_through_a_neighbour_it_shares_memory_with():
    """The attention core's two input channels carry queries and keys; the positions come by
    DMA to the tile above and on through shared memory.  Moving the relay two rows up (no
    shared memory) costs the attention core a third input channel, which the rules refuse."""
    d = npu.design_of(DECODE, "npu2")
    assert all(r.ok for r in design_rules(d, resources("npu2"), ("tile_size",)))
    far = dataclasses.replace(d, fifos=tuple(
        dataclasses.replace(f, producer=Tile(f.producer.col, 4)) if f.name.startswith("pos_")
        and not f.name.startswith("pos_in") else dataclasses.replace(
            f, consumers=(Tile(f.consumers[0].col, 4),)) if f.name.startswith("pos_in") else f
        for f in d.fifos), cores=tuple(
        dataclasses.replace(c, tile=Tile(c.tile.col, 4)) if c.tile.row == 3 else c
        for c in d.cores))
    broken = [r.text for r in design_rules(far, resources("npu2"), ("tile_size",)) if not r.ok]
    assert len(broken) == 1 and "DMA channels into core tile (0, 2): 3" in broken[0], broken


def test_every_design_fits_its_descriptors_and_verifies_against_mlir_aies_op_definitions():
    ops = [DECODE, dataclasses.replace(DECODE, rows=64, num_aie_columns=4),
           dataclasses.replace(DECODE, rows=32, num_aie_columns=4),
           QKVRoPE(rows=64, heads=9, kv_heads=3, head_dim=64, ctx=8192),
           QKVRoPE(rows=1, heads=9, kv_heads=3, head_dim=64, ctx=8192),
           SlotAttention(rows=8, slots=8, heads=9, kv_heads=3, head_dim=64, ctx=8192,
                         tile_size=64, num_aie_columns=3),
           SlotQKVRoPE(rows=8, slots=8, heads=9, kv_heads=3, head_dim=64, ctx=8192),
           CacheWrite(kv_heads=3, ctx=8192, head_dim=64, rows=64)]
    for op in ops:
        for dev in ("npu1", "npu2"):
            if 2 * getattr(op, "num_aie_columns", 1) > resources(dev).columns:
                continue
            d = npu.design_of(op, dev)
            assert allocate(d, resources(dev).shim_bds).overflow is None
            generic = render(d, generic=True)
            assert check_text(generic, op.describe(True)) is None
            assert "aiex.npu.rtp_write" not in generic
            assert rule_violations(generic, (constant_trip_counts,)) == []


@pytest.mark.skipif(shutil.which("mlir-opt-22") is None, reason="mlir-opt-22 not found: "
                    "install Debian's mlir-22-tools (apt-get install mlir-22-tools); .ci/run does")
def test_upstream_mlir_verifies_the_standard_dialects_inside_the_designs():
    """Debian's mlir-opt-22 parses every generic module and verifies the arith / scf / func ops
    inside.  The kernel calls become unregistered ops, as in ``test_npu`` (an unregistered
    ``aie.device`` is no symbol table a ``func.call`` could resolve its callee in)."""
    ops = [DECODE, QKVRoPE(rows=8, heads=9, kv_heads=3, head_dim=64, ctx=8192),
           *SLOTTED,
           CacheWrite(kv_heads=3, ctx=8192, head_dim=64, rows=8)]
    text = "\n// -----\n".join(render(npu.design_of(op, "npu2"), generic=True).replace(
        '"func.call"(', '"iron.kernel_call"(') for op in ops)
    done = subprocess.run(["mlir-opt-22", "--allow-unregistered-dialect", "--split-input-file",
                           "-o", os.devnull], input=text, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[:2000]
