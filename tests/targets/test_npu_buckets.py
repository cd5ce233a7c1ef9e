"""Context buckets (``iron/targets/npu/buckets.py``): a compiled design per bucket for each
KV-cache step, reading and writing the cache's first ``bucket`` positions in the host's layout,
the emulated runtime picking the smallest bucket covering the position at each dispatch; what
each bucket moves, priced from the built designs; every bucket's module verified."""

import dataclasses
import json

import numpy as np
import pytest

import iron
from iron.errors import BundleError
from iron.operators import (Attention, CacheWrite, QKVRoPE, SlotAttention, SlotQKVRoPE)
from iron.targets import npu, target_for
from iron.targets.npu.buckets import (FLOOR, at_bucket, bucket_costs, bucket_designs,
                                      bucket_positions, context_buckets, covering, moved_bytes,
                                      reached, readdress)
from iron.targets.npu.cost import design_estimate
from iron.targets.npu.fold import render as render_fold
from iron.targets.npu.ir import Pattern
from iron.targets.npu.mlir import render
from iron.targets.npu.runner import Bucketed, Emulated
from iron.targets.npu.verify import check_text

ATTEND = Attention(rows=1, heads=9, kv_heads=3, head_dim=64, ctx=2048, tile_size=64,
                   num_aie_columns=3)
ROTATE = QKVRoPE(rows=1, heads=9, kv_heads=3, head_dim=64, ctx=2048)
WRITE = CacheWrite(kv_heads=3, ctx=2048, head_dim=64, rows=1)
KV_ROW = 3 * 64 * 2  # bytes of one position of one cache (keys or values), every KV head


def test_the_buckets_are_powers_of_two_up_to_the_context():
    assert context_buckets(8192, 64) == [64, 128, 256, 512, 1024, 2048, 4096, 8192]
    assert context_buckets(300, 64) == [64, 128, 256, 300]
    assert context_buckets(48, 64) == [48] and context_buckets(1) == [1]
    assert bucket_positions(dataclasses.replace(ATTEND, ctx=8192)) == [
        128, 256, 512, 1024, 2048, 4096, 8192]  # from FLOOR: 6 designs more per step
    assert bucket_positions(dataclasses.replace(ROTATE, ctx=FLOOR)) == [FLOOR]


def test_the_bucket_covering_a_position_is_the_smallest_holding_it():
    """Bucket b holds positions 0 .. b - 1: the boundary position b - 1 is b's, b the next
    one's; past the context, the whole context's design (which masks it)."""
    sizes = [128, 256, 512]
    assert [covering(sizes, p) for p in (-1, 0, 127, 128, 255, 256, 511, 512, 900)] == [
        128, 128, 128, 256, 256, 512, 512, 512, 512]
    chunk = dataclasses.replace(ROTATE, rows=8)  # rows follow pos[0]: the last is pos[0] + 7
    assert reached(chunk, np.arange(120, 128)) == 127 and reached(chunk, [121] * 8) == 128
    slot = SlotAttention(rows=3, slots=4, heads=9, kv_heads=3, head_dim=64, ctx=2048,
                         tile_size=64, num_aie_columns=3)
    assert reached(slot, [5, 300, -1]) == 300  # every row its own position; -1: padding


def test_a_bucket_design_moves_its_positions_of_the_whole_layout_and_the_last_is_built():
    """Attention reads keys and values (2 caches), QKVRoPE reads and writes them (4),
    CacheWrite reads and writes one (2): each bucket twice the one before in its cache part,
    the rest (queries, rows, positions, frequencies, outputs) the same; the arguments keep the
    whole cache's size and the transfers its layout (KV head h starts at h * ctx positions)."""
    for op, caches in ((ATTEND, 2), (ROTATE, 4), (WRITE, 2)):
        built = npu.design_of(op, "npu2")
        variants = bucket_designs(op, "npu2")
        assert sorted(variants) == [128, 256, 512, 1024]
        buckets = bucket_costs([(op.ctx, built, variants)] * 2)  # two layers
        fixed = buckets[0].bytes - 2 * caches * buckets[0].positions * KV_ROW
        assert fixed > 0
        for b in buckets:
            assert b.bytes == fixed + 2 * caches * b.positions * KV_ROW, (op, b)
        assert buckets[-1].positions == 2048 and buckets[-1].bytes == 2 * moved_bytes(built)
        assert buckets[-1].seconds == 2 * design_estimate(built).seconds
        assert [b.seconds for b in buckets] == sorted(b.seconds for b in buckets)
        for d in variants.values():
            assert [a.numel for a in d.args] == [a.numel for a in built.args]
            starts = sorted({t.pattern.offset // (2048 * 64) for p in d.sequence for t in p
                             if d.args[t.arg].name in ("k_cache", "cache")})
            assert starts == [0, 1, 2], starts  # each KV head's run of the whole layout
    assert at_bucket(built, variants, 1024) is variants[1024]
    assert at_bucket(built, variants, 1025) is built


def test_a_pattern_crossing_runs_unevenly_is_refused():
    with pytest.raises(BundleError, match="crosses a run of 128"):
        readdress(Pattern(64, (1, 1, 1, 128), (0, 0, 0, 1)), 128, 512)
    assert readdress(Pattern(130, (1, 2, 1, 64), (0, 256, 0, 1)), 128, 512) == Pattern(
        514, (1, 2, 1, 64), (0, 1024, 0, 1))


class Layer(iron.Graph):
    """One attention layer's KV-cache steps of a small model, decode or slotted decode."""

    KV_HEADS, HEADS, HEAD_DIM, CTX = 2, 4, 32, 512

    def __init__(self, device, slots=None):
        super().__init__(device)
        self.slots = slots

    def body(self, qkv, pos, inv_freq, slot=None):
        cache = (self.KV_HEADS, self.CTX, self.HEAD_DIM)
        if self.slots is None:
            q, k, v = QKVRoPE.step(qkv, pos, inv_freq, self.state("k", cache),
                                   self.state("v", cache))
            return Attention.step(q, k, v, pos)
        cache = (self.slots, *cache)
        q, k, v = SlotQKVRoPE.step(qkv, pos, inv_freq, self.state("k", cache),
                                   self.state("v", cache), slot)
        return SlotAttention.step(q, k, v, pos, slot)


def layer_inputs(rng, positions, slots=None):
    width = (Layer.HEADS + 2 * Layer.KV_HEADS) * Layer.HEAD_DIM
    qkv = rng.standard_normal((len(positions), width)).astype(iron.bfloat16)
    inv_freq = (1e4 ** -(np.arange(0, Layer.HEAD_DIM, 2) / Layer.HEAD_DIM)).astype(np.float32)
    xs = [qkv, np.asarray(positions, np.int32), inv_freq]
    return xs if slots is None else [*xs, np.asarray(slots, np.int32)]


def bits(a):
    return a.view(np.uint16) if a.dtype.itemsize == 2 else a


@pytest.mark.parametrize("device", ["npu2", "npu1"])
@pytest.mark.parametrize("slotted", [False, True])
def test_an_emulated_decode_across_buckets_is_bit_for_bit_the_whole_context(device, slotted):
    """A decode from random caches crossing the buckets' boundaries (128 | 256 | 512): every
    output and cache, dispatch after dispatch, the same bits as the whole-context designs give
    (the same program run with ``buckets=False``), and each dispatch ran the bucket covering
    its position (slotted: the furthest row's)."""
    rng = np.random.default_rng(1)
    slots = 3 if slotted else None
    graph = Layer(device, slots)
    runs = [[126], [127], [128], [255], [256], [511]]
    if slotted:
        runs = [[p, 3, -1] for p in (126, 127, 128, 255, 256, 511)]
    first = layer_inputs(rng, runs[0], [0, 1, 2] if slotted else None)
    exe = target_for(graph.device).emulated().load(graph.record_like(first))
    whole = Emulated(exe.program, exe.step_files, exe.library, buckets=False)
    chosen = [s for s in exe.segments if isinstance(s, Bucketed)]
    assert chosen and not any(isinstance(s, Bucketed) for s in whole.segments)
    start = {n: rng.standard_normal(a.shape).astype(a.dtype) for n, a in exe.states.items()}
    for e in (exe, whole):
        e.bind_state({n: a.copy() for n, a in start.items()})
    for positions in runs:
        xs = layer_inputs(rng, positions, [2, 0, 1] if slotted else None)
        got, want = exe.run([x.copy() for x in xs]), whole.run([x.copy() for x in xs])
        for g, w in zip(got, want):
            assert np.array_equal(bits(g), bits(w)), positions
        for name in start:
            assert np.array_equal(bits(exe.state(name)), bits(whole.state(name))), positions
    per_dispatch = [128, 128, 256, 256, None, None]  # None: the whole context, 512
    assert all(s.chosen == per_dispatch for s in chosen), [s.chosen for s in chosen]


def test_every_bucket_design_is_in_the_step_file_and_verifies():
    """The step file of a KV-cache step carries each bucket's design and both forms of its
    module (what aiecc compiles per bucket); each verifies against mlir-aie's op definitions
    and the lowering's preconditions, custom form included, and so does each bucket's fold."""
    graph = Layer("npu2")
    exe = target_for(graph.device).emulated().load(
        graph.record_like(layer_inputs(np.random.default_rng(0), [0])))
    checked = 0
    for path in exe.step_files:
        doc = json.loads(path.read_text())
        assert [b["positions"] for b in doc["buckets"]] == [128, 256]
        assert all((path.parent / f"bucket{b['positions']}" / "design.mlir").read_text()
                   == b["mlir"] for b in doc["buckets"])
        for b in doc["buckets"]:
            assert check_text(b["mlir_generic"], str(path), b["mlir"]) is None
            checked += 1
    assert checked == 4
    folds = [f for s in exe.segments if isinstance(s, Bucketed) for f in s.variants.values()]
    assert len(folds) == 2  # the fold of QKVRoPE and Attention, at 128 and at 256
    for fold in folds:
        assert check_text(render_fold(fold, generic=True), fold.name, render_fold(fold)) is None
    for op in (dataclasses.replace(ATTEND, ctx=512), SlotAttention(
            rows=8, slots=8, heads=9, kv_heads=3, head_dim=64, ctx=512, tile_size=64,
            num_aie_columns=3), SlotQKVRoPE(rows=8, slots=8, heads=9, kv_heads=3, head_dim=64,
                                            ctx=512), dataclasses.replace(WRITE, ctx=512)):
        for d in bucket_designs(op, "npu2").values():
            assert check_text(render(d, generic=True), d.name, render(d)) is None


@pytest.mark.parametrize("device", ["npu2", "npu1"])
def test_a_slotted_design_serves_fewer_live_rows_than_its_slots(device):
    """A batch of 1 .. N sequences on a design of 2 rows over 4 slots (``iron.lm.batch`` pads
    the rows past the live count at position -1 of slot 0): each live row's output and cache row
    are, bit for bit, what the one-row decode gives on its own slot's cache, the padding row
    writes nothing, and every other slot's cache keeps its bits."""
    rng = np.random.default_rng(2)
    slotted = target_for(iron.device(device)).emulated().load(Layer(device, 4).record_like(
        layer_inputs(rng, [0, 0], [0, 0])))
    one = target_for(iron.device(device)).emulated().load(Layer(device).record_like(
        layer_inputs(rng, [0])))
    start = {n: rng.standard_normal(a.shape).astype(a.dtype)
             for n, a in slotted.states.items()}
    slotted.bind_state({n: a.copy() for n, a in start.items()})
    for live, position in (([3], 200), ([1, 2], 127)):
        xs = layer_inputs(rng, [position] * len(live) + [-1] * (2 - len(live)),
                          live + [0] * (2 - len(live)))
        before = {n: a.copy() for n, a in slotted.states.items()}
        (got,) = slotted.run([x.copy() for x in xs])
        for r, s in enumerate(live):
            one.bind_state({n: a[s].copy() for n, a in before.items()})
            (want,) = one.run([xs[0][r:r + 1].copy(), xs[1][r:r + 1].copy(), xs[2]])
            assert np.array_equal(bits(got[r:r + 1]), bits(want)), (live, r)
            for n in start:
                assert np.array_equal(bits(slotted.state(n)[s]), bits(one.state(n))), (n, s)
        for s in set(range(4)) - set(live):  # the padding row's slot 0 among them
            for n in start:
                assert np.array_equal(bits(slotted.state(n)[s]), bits(before[n][s])), (n, s)


def test_every_batched_program_of_an_npu_bundle_shares_the_largest_batchs_slots():
    """An npu design moves exactly its slots' caches, so a runtime's one cache of N slots must
    match every ``decode_slots<B>`` program: on an npu they are recorded over the largest B's
    slots (a batch of n runs the smallest B >= n, padded); on the cpu over their own B."""
    from apps.llama.config import LlamaConfig
    from apps.llama.programs import record
    from tiny_llama import TINY_CONFIG

    config = LlamaConfig.from_dict({**TINY_CONFIG, "head_dim": 32, "hidden_size": 128})
    for device, want in (("npu2", {2: 8, 4: 8, 8: 8}), ("cpu", {2: 2, 4: 4, 8: 8})):
        programs = record(config, 256, 64, device=device, batch=8)
        slots = {int(name.removeprefix("decode_slots")): {op.slots for op in p.ops
                                                          if hasattr(op, "slots")}
                 for name, p in programs.items() if name.startswith("decode_slots")}
        assert slots == {b: {n} for b, n in want.items()}, (device, slots)
