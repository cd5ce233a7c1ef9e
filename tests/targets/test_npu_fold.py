"""Folded configurations: consecutive NPU steps in one module of several devices, one dispatch,
emulated with the same results as the steps one dispatch each, verified against the
transcription of mlir-aie's ODS (aiex.configure / aiex.run included), and the report's
figures against the per-step cost model."""

import dataclasses
import re
from collections import Counter

import numpy as np
import pytest

import iron
from iron.lm.checkpoint import LlamaConfig
from iron.operators import ElementwiseAdd, Embedding, RMSNorm, SiLU
from iron.targets import target_for
from iron.targets.npu.fold import ALIGN, BUFFERS, Fold, plan, render
from iron.targets.npu.report import markdown, program_report
from iron.targets.npu.resources import DISPATCH_SECONDS
from iron.targets.npu.runner import Emulated
from iron.targets.npu.verify import Problem, check_text
from tiny_llama import TINY_CONFIG

from apps.llama.model import Decoder


class Chain(iron.Graph):
    """NPU steps around a host step: norm, add, add (the same design twice in a row), SiLU,
    then an embedding lookup on the host, then a norm and an add on the NPU again."""

    def body(self, x, y, table, tokens):
        h = RMSNorm.step(x, self.weight("w", (x.shape[1],)))
        a = ElementwiseAdd.step(h, y)
        b = ElementwiseAdd.step(a, y)
        s = SiLU.step(b)
        e = Embedding.step(table, tokens)
        return ElementwiseAdd.step(RMSNorm.step(e, self.weight("w", (x.shape[1],))), s)


def loaded(program, weights, fold):
    target = target_for(program.device).emulated()
    entries = target.compile_all([*program.ops, None])
    lib = target.artifact(entries.pop())
    exe = Emulated(program, [target.artifact(e) for e in entries], lib, fold=fold)
    if weights is not None:
        exe.bind_weights(weights)
    return exe


def chain_case(rng):
    graph = Chain("npu2")
    graph.weights = {"w": (1 + 0.1 * rng.standard_normal(256)).astype(iron.bfloat16)}
    inputs = [rng.standard_normal((4, 256)).astype(iron.bfloat16),
              rng.standard_normal((4, 256)).astype(iron.bfloat16),
              rng.standard_normal((50, 256)).astype(iron.bfloat16),
              rng.integers(0, 50, 4).astype(np.int32)]
    return graph, inputs


def test_a_chain_folds_around_its_host_step_and_matches_the_steps_run_one_by_one():
    rng = np.random.default_rng(3)
    graph, inputs = chain_case(rng)
    program = graph.record_like(inputs)
    folded, single = loaded(program, graph.weights, True), loaded(program, graph.weights, False)
    for k in range(2):  # twice: a fold's buffers and loads start over at every dispatch
        xs = inputs if k == 0 else [inputs[0] * 2, *inputs[1:]]
        got, one_by_one = folded.run(xs)[0], single.run(xs)[0]
        assert np.array_equal(got.view(np.uint16), one_by_one.view(np.uint16))
        # six steps, each rounding its output to bf16 (2^-8 relative) where the reference
        # rounds the same outputs from float32 maths: a few bf16 steps of difference
        np.testing.assert_allclose(got.astype(np.float32),
                                   graph.reference(*xs).astype(np.float32), rtol=3e-2, atol=3e-2)
    # 6 NPU steps: [norm, add, add, silu] [norm, add] around the embedding
    assert single.dispatches() == 2 * 6 and folded.dispatches() == 2 * 2
    first = folded.segments[0].fold
    assert [len(runs) for _, runs in first.configures()] == [1, 2, 1]  # add, add: one load
    # loads: norm, add, silu, (host), norm, add per call: the next call's first norm is a
    # load again, as the last design loaded was the add
    assert folded.array.loads == 2 * 5


#: The tiny checkpoint with heads of 32 (whole 16-lane vectors in each half of a head).
DECODER = {**TINY_CONFIG, "head_dim": 32, "num_attention_heads": 2, "num_key_value_heads": 1}


def npu_runs(designs) -> list[list[int]]:
    """The steps of each maximal run of consecutive NPU-placed steps."""
    runs: list[list[int]] = []
    for i, d in enumerate(designs):
        if d is not None:
            if runs and runs[-1][-1] == i - 1:
                runs[-1].append(i)
            else:
                runs.append([i])
    return runs


def tiny_decoder():
    config = LlamaConfig.from_dict(DECODER)
    graph = Decoder(config, rows=1, ctx=32, device="npu2")  # bf16 matrices: GEMVs designed
    program = graph.record_like([np.zeros(1, np.int32), np.zeros(1, np.int32)])
    rng = np.random.default_rng(0)
    weights = {}
    for name, t in program.named("weight").items():
        if name == "rope.inv_freq":
            weights[name] = (10000.0 ** -(np.arange(t.shape[0]) / t.shape[0])).astype(t.dtype)
        elif name.endswith("norm.weight"):
            weights[name] = (1 + 0.1 * rng.standard_normal(t.shape)).astype(t.dtype)
        else:
            weights[name] = (0.1 * rng.standard_normal(t.shape)).astype(t.dtype)
    return graph, program, weights


def test_the_llama_layers_fold_between_their_host_steps_with_unchanged_results():
    graph, program, weights = tiny_decoder()
    folded, single = loaded(program, weights, True), loaded(program, weights, False)
    state: dict = {}
    for p in range(3):  # three tokens: the KV cache (state) carries across calls
        xs = [np.array([7 + p], np.int32), np.array([p], np.int32)]
        got, one_by_one = folded.run(xs)[0], single.run(xs)[0]
        assert np.array_equal(got.view(np.uint16), one_by_one.view(np.uint16))
        want = program.reference(xs, weights, state)[0]
        # the emulated steps round as the device kernels do (float32 accumulation, one bf16
        # rounding per output); the reference rounds each step's output once
        err = np.abs(got.astype(np.float32) - want.astype(np.float32)).max()
        assert err <= 0.05 * np.abs(want.astype(np.float32)).max(), err
    for name in folded.states:
        assert np.array_equal(folded.states[name], single.states[name])
    # the host steps (the Embedding, and the attention where it has no design) cut the NPU
    # steps into folds: with QKVRoPE and Attention on the host, 19 NPU steps in 3 folds
    folds = [s.fold for s in folded.segments if not isinstance(s, int)]
    runs = npu_runs(folded.designs)
    assert [[r.step for r in f.runs] for f in folds] == runs
    assert sum(map(len, runs)) > len(runs) >= 1
    assert folded.dispatches() == 3 * len(runs)
    assert single.dispatches() == 3 * sum(map(len, runs))


def layout_ok(fold: Fold) -> None:
    """No two places overlap (an output written in place has its input's very place)."""
    spans = sorted({(s.buffer, s.offset, s.offset + s.nbytes) for _, s in fold.slots})
    for (b0, _, end), (b1, start, _) in zip(spans, spans[1:]):
        assert b0 != b1 or end <= start
    assert all(s.offset % ALIGN == 0 and s.offset + s.nbytes <= fold.sizes[s.buffer]
               for _, s in fold.slots)


def test_every_fold_verifies_and_lays_its_tensors_apart():
    _, program, _ = tiny_decoder()
    exe = loaded(program, None, True)
    folds = [s for s in plan(program, exe.designs) if isinstance(s, Fold)]
    for f in folds:
        layout_ok(f)
        check_text(render(f, generic=True), f.name)
        custom = render(f)
        assert custom.count("aiex.configure @") == len(f.configures())
        assert custom.count("aiex.run @sequence(") == len(f.runs)


def test_intermediates_stay_in_the_fold_and_the_host_gets_back_only_what_it_reads():
    rng = np.random.default_rng(3)
    graph, inputs = chain_case(rng)
    program = graph.record_like(inputs)
    exe = loaded(program, graph.weights, True)
    first, second = (s.fold for s in exe.segments if not isinstance(s, int))
    x, y, table, tokens = program.inputs
    norm, add1, add2, silu, embed, norm2, add3 = program.steps
    w = norm.inputs[1]
    io, weights, scratch = (BUFFERS.index(n) for n in ("io", "weights", "scratch"))
    # [norm, add, add, silu]: x, w, y in; only silu's output (the second fold reads it) out
    assert set(first.reads) == {x, w, y} and first.writes == (silu.outputs[0],)
    assert {first.slot(t).buffer for t in (norm.outputs[0], add1.outputs[0],
                                           add2.outputs[0])} == {scratch}
    assert first.slot(w).buffer == weights and first.slot(silu.outputs[0]).buffer == io
    # [norm, add] after the host's Embedding: its output, w and silu's output in, the result out
    assert set(second.reads) == {embed.outputs[0], w, silu.outputs[0]}
    assert second.writes == tuple(program.outputs)
    assert second.slot(norm2.outputs[0]).buffer == scratch
    for f in (first, second):
        layout_ok(f)


def one_argument_fewer(text: str) -> str:
    """The first aiex.run without its last argument."""
    line = next(x for x in text.splitlines() if '"aiex.run"(' in x)
    fixed = re.sub(r", %v\d+\)", ")", line, count=1)
    fixed = re.sub(r", (memref<[^>]*>)\) -> \(\)$", ") -> ()", fixed)
    return text.replace(line, fixed, 1)


@pytest.mark.parametrize("change,message", [
    (lambda t: t.replace('"aiex.configure"() <{symbol = @d0_', '"aiex.configure"() <{symbol '
                         "= @nowhere_", 1), "No such device"),
    (lambda t: t.replace("runtime_sequence_symbol = @sequence", "runtime_sequence_symbol = "
                         "@other", 1), "No such runtime sequence for device"),
    (one_argument_fewer, r"number of run op arguments \(2\) does not match"),
    (lambda t: t.replace('"aie.runtime_sequence"() <{sym_name = "sequence"}> ({\n    ^bb0(',
                         '"aiex.run"() <{runtime_sequence_symbol = @sequence}> : () -> ()\n'
                         '  "aie.runtime_sequence"() <{sym_name = "sequence"}> ({\n    ^bb0(',
                         1), "aiex.configure"),
])
def test_a_broken_fold_is_rejected_naming_the_problem(change, message):
    _, program, _ = tiny_decoder()
    exe = loaded(program, None, True)
    fold = next(s for s in plan(program, exe.designs) if isinstance(s, Fold))
    text = render(fold, generic=True)
    broken = change(text)
    assert broken != text
    with pytest.raises(Problem, match=message):
        check_text(broken, "fold")


def test_a_design_whose_sequence_ends_without_a_wait_ends_its_fold():
    rng = np.random.default_rng(3)
    graph, inputs = chain_case(rng)
    program = graph.record_like(inputs)
    exe = loaded(program, graph.weights, True)
    designs = list(exe.designs)
    d = designs[1]  # the first add: drop the waits by making its last phase inputs only
    designs[1] = dataclasses.replace(d, sequence=d.sequence + (tuple(
        t for t in d.sequence[-1] if t.direction == "in"),))
    runs = [[r.step for r in s.runs] for s in plan(program, designs) if isinstance(s, Fold)]
    assert runs == [[0, 1], [2, 3], [5, 6]]


def test_the_report_adds_up_to_the_per_step_model_and_folding_saves_only_dispatches():
    _, program, _ = tiny_decoder()
    exe = loaded(program, None, True)
    r = program_report("decode", program, exe.designs)
    per_step = sum(d.cost().seconds for d in exe.designs if d is not None)
    assert r.unfolded.total == pytest.approx(per_step, rel=1e-12)
    assert r.model_sum == pytest.approx(per_step, rel=1e-12)
    runs = npu_runs(exe.designs)
    npu = sum(map(len, runs))
    assert (r.npu_steps, r.dispatches, r.folded_dispatches) == (npu, npu, len(runs))
    assert r.folded.total == pytest.approx(per_step - (npu - len(runs)) * DISPATCH_SECONDS,
                                           rel=1e-12)
    assert (r.folded.kernel, r.folded.data_movement) == (r.unfolded.kernel,
                                                        r.unfolded.data_movement)
    d = exe.designs
    host = Counter(type(program.steps[i].op).__name__ for i in range(len(d)) if d[i] is None)
    assert r.host_steps == dict(host) and host["Embedding"] == 1
    # a configuration per change of design within each run of NPU steps
    assert r.configures == sum(1 + sum(d[a] is not d[b] for a, b in zip(run, run[1:]))
                               for run in runs)
    assert r.handovers == sum((a is None) != (b is None) for a, b in zip(d, d[1:]))
    table = markdown([r]).splitlines()
    assert len(table) == 4
    assert table[2].startswith(f"| decode, unfolded | npu2 | {npu} | {npu} | "
                               f"{r.unfolded.kernel * 1e6:,.0f} |")
    hosted = ", ".join(f"{k} {v}" for k, v in sorted(host.items()))
    assert f"| {r.folded.total * 1e6:,.0f} | {r.configures} | {hosted} |" in table[3]


def test_an_output_written_in_place_shares_its_inputs_place(monkeypatch):
    """An operator whose class declares ``inplace`` (output -> input it overwrites, as a KV
    cache write does) gets no place of its own: its design writes into the input's."""
    rng = np.random.default_rng(5)
    graph, inputs = chain_case(rng)
    program = graph.record_like(inputs)
    monkeypatch.setattr(ElementwiseAdd, "inplace", {0: 0})
    exe = loaded(program, graph.weights, True)
    first = exe.segments[0].fold
    add = program.steps[1]
    assert first.slot(add.outputs[0]) == first.slot(add.inputs[0])
    layout_ok(first)
    np.testing.assert_allclose(exe.run(inputs)[0].astype(np.float32),
                               graph.reference(*inputs).astype(np.float32), rtol=3e-2, atol=3e-2)
