"""Tensors packed into one runtime argument (``iron/targets/npu/ir.py``'s ``Place``) in a fold:
QKVRoPE's q behind its rows and its variant's weights, the slotted forms' slots behind their
positions, the caches written in place, so every design takes at most the five buffers aiecc's
xclbin kernel binds (``trip_rules.sequence_arguments``).  A fold lays each packed group out
together in one host buffer (``fold.packed``) and hands each design its arguments as windows
of it; a layer's attention half, QKVRoPE into Attention, runs in one fold against the
reference, token after token."""

import re

import numpy as np
import pytest

import iron
from iron.operators import Attention, QKVRoPE, SlotAttention, SlotQKVRoPE
from iron.operator import normal, rope_frequencies
from iron.targets import target_for
from iron.targets.npu.fold import Fold, render
from iron.targets.npu.verify import check_text
from opcases import assert_close, tolerance_on

HEADS, KV_HEADS, HEAD_DIM, CTX = 4, 2, 32, 64
WIDTH = (HEADS + 2 * KV_HEADS) * HEAD_DIM


class RopeThenAttend(iron.Graph):
    """QKVRoPE (slotted: SlotQKVRoPE) with Qwen2's bias, its q and caches into Attention
    (SlotAttention): the positions (and slots) shared by both."""

    def __init__(self, slots: int):
        super().__init__("npu2")
        self.slots = slots

    def body(self, *xs):
        qkv, pos, *slot = xs
        cache = (self.slots,) * bool(self.slots) + (KV_HEADS, CTX, HEAD_DIM)
        inv_freq = self.weight("inv_freq", (HEAD_DIM // 2,), np.float32)
        k, v = self.state("k", cache), self.state("v", cache)
        bias = self.weight("bias", (WIDTH,))
        if self.slots:
            q, k, v = SlotQKVRoPE.step(qkv, pos, inv_freq, k, v, *slot, bias)
            return SlotAttention.step(q, k, v, pos, *slot)
        q, k, v = QKVRoPE.step(qkv, pos, inv_freq, k, v, bias)
        return Attention.step(q, k, v, pos)


def inputs(rows: int, slots: int, token: int, rng) -> list[np.ndarray]:
    """Token ``token``'s rows: at positions ``token ..`` (slotted: each row its own slot)."""
    xs = [normal(rng, rows, WIDTH), np.arange(token, token + rows, dtype=np.int32)]
    return xs + ([np.arange(rows, dtype=np.int32) % slots] if slots else [])


def one_fold(slots: int, rows: int):
    graph = RopeThenAttend(slots)
    rng = np.random.default_rng(slots)
    graph.weights = {"inv_freq": rope_frequencies(HEAD_DIM),
                     "bias": normal(rng, WIDTH, scale=2)}
    program = graph.record_like(inputs(rows, slots, 0, rng))
    exe = target_for(graph.device).emulated().load(program)
    exe.bind_weights(graph.weights)
    folds = [s.fold for s in exe.segments if not isinstance(s, int)]
    assert len(folds) == 1 and len(folds[0].runs) == 2, "both steps designed, one fold"
    return graph, program, exe, folds[0]


@pytest.mark.parametrize("slots,rows", [(0, 1), (3, 2)], ids=["decode", "slotted"])
def test_a_packed_layer_half_runs_in_one_fold_as_the_reference(slots, rows):
    graph, program, exe, fold = one_fold(slots, rows)
    rng = np.random.default_rng(7)
    state: dict = {}
    for token in range(3):  # the caches, written in place, carry across dispatches
        xs = inputs(rows, slots, 5 * token, rng)
        want = program.reference(xs, graph.weights, state)[0]
        got = exe.run([x.copy() for x in xs])[0]
        name = "SlotAttention" if slots else "Attention"
        assert_close(name, got, want, tolerance_on(name, "npu2"))
    for name in ("k", "v"):
        assert np.array_equal(exe.states[name], state[name].astype(exe.states[name].dtype))


def slot_of(program, fold: Fold, step: int, index: int):
    return fold.slot(program.steps[step].inputs[index])


@pytest.mark.parametrize("slots,rows", [(0, 1), (3, 2)], ids=["decode", "slotted"])
def test_each_packed_group_lies_together_in_one_buffer(slots, rows):
    """q right behind the rows and the bias, in the buffer of the host's tensors (the rows are
    the host's); the slots right behind the positions; every design takes five arguments."""
    _, program, _, fold = one_fold(slots, rows)
    rope, attend = program.steps
    qkv, bias = slot_of(program, fold, 0, 0), slot_of(program, fold, 0, 5 + bool(slots))
    q = fold.slot(rope.outputs[0])
    assert q == slot_of(program, fold, 1, 0)
    assert bias.buffer == q.buffer == qkv.buffer
    assert (bias.offset, q.offset) == (qkv.offset + qkv.nbytes, bias.offset + bias.nbytes)
    assert fold.buffers[qkv.buffer].role == "io"
    if slots:
        pos, slot = slot_of(program, fold, 0, 1), slot_of(program, fold, 0, 5)
        assert slot == slot_of(program, fold, 1, 4) and slot.buffer == pos.buffer
        assert slot.offset == pos.offset + pos.nbytes
    assert [len(d.args) for d in fold.designs] == [5, 5]
    check_text(render(fold, generic=True), fold.name, render(fold))


def test_a_folds_main_sequence_is_not_held_to_five_buffers():
    """A module of several devices compiles only to a full ELF, which declares as many
    arguments as the longest sequence takes: the rule is for a design compiled alone, so
    ``verify`` takes a fold whose main sequence has eight buffers more than its own."""
    _, _, _, fold = one_fold(0, 1)
    text = render(fold, generic=True)
    at = text.index("^bb0(", text.index('sym_name = "main"')) + len("^bb0(")
    extra = "".join(f"%extra{i}: memref<16xbf16>, " for i in range(8))
    wider = text[:at] + extra + text[at:]
    params = re.findall(r"%\w+: memref", wider[at:wider.index("\n", at)])
    assert len(params) == len(fold.buffers) + 8 > 5
    check_text(wider, fold.name)
