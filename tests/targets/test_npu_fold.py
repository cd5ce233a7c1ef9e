"""Folded configurations: consecutive NPU steps in one module of several devices, one dispatch,
emulated with the same results as the steps one dispatch each, verified against the
transcription of mlir-aie's ODS (aiex.configure / aiex.run included), and the report's
figures against the per-step cost model."""

import dataclasses
import os
import re
import shutil
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest

import iron
from iron.errors import BundleError
from iron.operators import ElementwiseAdd, Embedding, RMSNorm, SiLU
from iron.targets import target_for
from iron.targets.npu.fold import ALIGN, Fold, plan, render
from iron.targets.npu.buckets import KV_CACHE, moved_bytes
from iron.targets.npu.cost import design_estimate
from iron.targets.npu.report import PACKED, bucket_markdown, markdown, program_report
from iron.targets.npu.coresidence import columns, fits, loads, loads_per_pass, pack, relocate
from iron.targets.npu.resources import DISPATCH_SECONDS, SWITCH_SECONDS
from iron.targets.npu.runner import Emulated
from iron.targets.npu.verify import Problem, check_text
from tiny_llama import TINY_CONFIG, random_weights

from apps.llama.config import LlamaConfig
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


def loaded(program, weights, fold, pack=False):
    target = target_for(program.device).emulated()
    entries = target.compile_all([*program.ops, None])
    lib = target.artifact(entries.pop())
    exe = Emulated(program, [target.artifact(e) for e in entries], lib, fold=fold, pack=pack)
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
    return graph, program, random_weights(program)


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
    assert all(s.offset % ALIGN == 0 and s.offset + s.nbytes <= fold.buffers[s.buffer].nbytes
               for _, s in fold.slots)


def test_every_fold_verifies_and_lays_its_tensors_apart():
    """Both forms, the custom one read as the same module as the generic one."""
    _, program, _ = tiny_decoder()
    exe = loaded(program, None, True)
    for packed in (False, True):
        folds = [s for s in plan(program, exe.designs, packed=packed) if isinstance(s, Fold)]
        merged = [c for f in folds for c in f.configurations if c.merged]
        assert bool(merged) == packed  # packed, some devices are merged packs
        for f in folds:
            layout_ok(f)
            custom = render(f)
            check_text(render(f, generic=True), f.name, custom)
            assert custom.count("aiex.configure @") == len(f.configures())
            assert custom.count("aiex.run @") == len(f.runs)
            assert packed or custom.count("aiex.run @sequence(") == len(f.runs)


def test_intermediates_stay_in_the_fold_and_the_host_gets_back_only_what_it_reads():
    rng = np.random.default_rng(3)
    graph, inputs = chain_case(rng)
    program = graph.record_like(inputs)
    exe = loaded(program, graph.weights, True)
    first, second = (s.fold for s in exe.segments if not isinstance(s, int))
    x, y, table, tokens = program.inputs
    norm, add1, add2, silu, embed, norm2, add3 = program.steps
    w = norm.inputs[1]

    def role(fold, t):
        return fold.buffers[fold.slot(t).buffer].role

    # [norm, add, add, silu]: x, w, y in; only silu's output (the second fold reads it) out
    assert set(first.reads) == {x, w, y} and first.writes == (silu.outputs[0],)
    assert {role(first, t) for t in (norm.outputs[0], add1.outputs[0],
                                     add2.outputs[0])} == {"scratch"}
    assert role(first, w) == "weights" and role(first, silu.outputs[0]) == "io"
    # [norm, add] after the host's Embedding: its output, w and silu's output in, the result out
    assert set(second.reads) == {embed.outputs[0], w, silu.outputs[0]}
    assert second.writes == tuple(program.outputs)
    assert role(second, norm2.outputs[0]) == "scratch"
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


def test_the_report_adds_up_to_the_per_step_model_and_prices_dispatches_and_loads():
    _, program, weights = tiny_decoder()
    exe = loaded(program, weights, True)
    r = program_report("decode", [program], [exe.designs])
    per_step = sum(design_estimate(d).seconds for d in exe.designs if d is not None)
    assert r.model_sum == pytest.approx(per_step, rel=1e-12)
    assert r.unfolded.total - r.unfolded.reconfiguration == pytest.approx(per_step, rel=1e-12)
    runs = npu_runs(exe.designs)
    npu = sum(map(len, runs))
    assert (r.npu_steps, r.dispatches, r.folded_dispatches) == (npu, npu, len(runs))
    # folding saves dispatches only; every load is priced at upstream's measured switch
    assert r.folded.total == pytest.approx(per_step - (npu - len(runs)) * DISPATCH_SECONDS
                                           + r.loads * SWITCH_SECONDS, rel=1e-12)
    assert r.unfolded.reconfiguration == r.folded.reconfiguration == r.loads * SWITCH_SECONDS
    assert (r.folded.kernel, r.folded.data_movement) == (r.unfolded.kernel,
                                                        r.unfolded.data_movement)
    d = exe.designs
    host = Counter(type(program.steps[i].op).__name__ for i in range(len(d)) if d[i] is None)
    assert r.host_steps == dict(host) and host["Embedding"] == 1
    assert r.handovers == sum((a is None) != (b is None) for a, b in zip(d, d[1:]))
    # the loads a call costs are the loads the emulator's array makes in a steady call
    for p in range(2):
        exe.run([np.array([7 + p], np.int32), np.array([p], np.int32)])
        before = exe.array.loads
    exe.run([np.array([9], np.int32), np.array([2], np.int32)])
    assert exe.array.loads - before == r.loads > 0
    assert 0 < r.packed_loads < r.loads  # the tiny designs leave room to pack
    assert r.packed.total == pytest.approx(r.folded.total - (r.loads - r.packed_loads)
                                           * SWITCH_SECONDS, rel=1e-12)
    table = markdown(r).splitlines()
    assert len(table) == 7 and table[6] == PACKED  # the packed row is what the folds run
    # per context bucket, what the KV-cache steps would move: the last, what they move now
    kv = [d for op, d in zip(program.ops, exe.designs) if isinstance(op, KV_CACHE)]
    assert kv and r.buckets[-1].bytes == sum(map(moved_bytes, kv))
    assert r.buckets[-1].seconds == pytest.approx(sum(design_estimate(d).seconds for d in kv),
                                                  rel=1e-12)
    assert f"| {r.buckets[0].positions} | {r.buckets[0].bytes:,} |" in bucket_markdown(r)
    assert table[2].startswith(f"| decode, one dispatch per step | npu2 | {npu} | {npu} | "
                               f"{r.loads} | {r.unfolded.kernel * 1e6:,.0f} |")
    hosted = ", ".join(f"{k} {v}" for k, v in sorted(host.items()))
    assert table[4].startswith(f"| decode, folded + packed | npu2 | {npu} | {len(runs)} | "
                               f"{r.packed_loads} |")
    assert table[4].endswith(f"| {r.packed.total * 1e6:,.0f} | {hosted} |")


def test_packed_designs_share_the_array_with_the_same_results_and_fewer_loads():
    """Packed, the emulator runs each member as the merged device holds it (its columns and
    symbols its own), and a member's cores and FIFOs stay as its last dispatch left them while
    the other members run: the same bits over three tokens, and the loads the report counts."""
    _, program, weights = tiny_decoder()
    packed, alone = loaded(program, weights, True, pack=True), loaded(program, weights, True)
    merged = [c for s in packed.segments if not isinstance(s, int)
              for c in s.fold.configurations if c.merged]
    assert merged and not any(c.merged for s in alone.segments if not isinstance(s, int)
                              for c in s.fold.configurations)
    ran: list = []  # the design of every emulation the array dispatched
    configure = packed.array.configure
    packed.array.configure = lambda c, d: ran.append(configure(c, d)) or ran[-1]
    loads = []
    for p in range(3):
        xs = [np.array([7 + p], np.int32), np.array([p], np.int32)]
        got, want = packed.run(xs)[0], alone.run(xs)[0]
        assert np.array_equal(got.view(np.uint16), want.view(np.uint16))
        loads.append((packed.array.loads, alone.array.loads))
    for m in (m for c in merged for m in c.members):  # run relocated and renamed
        assert any(e.design is m.placed for e in ran) and m.placed != m.design
        assert all(f.name.startswith(f"{m.symbol}__") for f in m.placed.fifos)
    r = program_report("decode", [program], [packed.designs])
    assert loads[2][0] - loads[1][0] == r.packed_loads < r.loads == loads[2][1] - loads[1][1]
    for name in packed.states:
        assert np.array_equal(packed.states[name], alone.states[name])


def test_npu1_reports_one_dispatch_per_step_and_says_it_has_no_folds():
    rng = np.random.default_rng(3)
    _, inputs = chain_case(rng)
    program = Chain("npu1").record_like(inputs)
    designs = loaded(program, None, True).designs
    r = program_report("chain", [program], [designs])
    assert not r.folds and r.dispatches == r.folded_dispatches == r.npu_steps == 6
    assert r.loads == r.packed_loads == 5  # norm add (add) silu | norm add, around the cycle
    assert r.folded == r.packed == r.unfolded
    table = markdown(r)
    assert "| chain, one dispatch per step | npu1 | 6 | 6 | 5 |" in table
    assert "folded" not in table and "npu1 has no folds" in table


def test_packing_is_upstreams_greedy_walk_over_designs_that_fit_the_columns_left():
    _, program, _ = tiny_decoder()
    designs = [d for d in loaded(program, None, True).designs if d is not None]
    a, b, c, e = (next(d for d in designs if d.name.startswith(f"{kind}("))
                  for kind in ("RMSNorm", "QKVRoPE", "Attention", "ElementwiseAdd"))
    assert [columns(d) for d in (a, b, c, e)] == [1, 2, 2, 4]
    assert loads_per_pass([a, b, a, b], 8, packed=False) == 4
    assert loads_per_pass([a, b, a, b], 3, packed=True) == 0  # one pack serves all: no load
    assert loads_per_pass([a, b, a, b], 2, packed=True) == 4  # no room beside a
    # [a b] fit 4 columns, c does not beside them and starts the next pack; a met again
    # outside it closes that pack, so e starts a third: a|b -> c -> a|b -> e -> (around) a|b
    assert pack([a, b, c, a, e], 4) == {id(a): 0, id(b): 0, id(c): 1, id(e): 2}
    assert loads_per_pass([a, b, c, a, e], 4, packed=True) == 4
    # a design met again outside the current pack closes it, even where the next would fit
    assert pack([b, c, b, a], 3) == {id(b): 0, id(c): 1, id(a): 2}
    assert loads([0, 0, 1, 1, 0]) == 2 and loads([3]) == 0


def packed_fold() -> tuple[Fold, int]:
    """The tiny decoder's first fold holding a pack of several designs, and that pack's index
    among its configurations."""
    _, program, _ = tiny_decoder()
    designs = list(loaded(program, None, True).designs)
    fold = next(s for s in plan(program, designs) if isinstance(s, Fold)
                and any(c.merged for c in s.configurations))
    return fold, next(k for k, c in enumerate(fold.configurations) if c.merged)


def test_a_pack_is_one_device_of_its_members_side_by_side_each_with_its_own_sequence():
    fold, k = packed_fold()
    p = fold.configurations[k]
    used = [{t.col for t in m.placed.tiles()} for m in p.members]
    assert all(not a & b for i, a in enumerate(used) for b in used[i + 1:])
    assert max(map(max, used)) < 8 and min(used[1]) == columns(p.members[0].design)
    names = [x.name for m in p.members for x in (*m.placed.fifos, *m.placed.buffers)]
    assert len(names) == len(set(names))  # no symbol of one member collides with another's
    text = render(fold)
    device = text[text.index(f"aie.device(npu2) @{p.symbol} "):text.index("aie.device", text.index(
        f"@{p.symbol} ") + 1)]
    assert device.count("aie.runtime_sequence @") == len(p.members) > 1
    for m in p.members:
        assert f"aie.runtime_sequence @{m.symbol}(" in device
        for f in m.design.fifos:  # every FIFO under its member's name, none under its own
            assert f"aie.objectfifo @{m.symbol}__{f.name}(" in device
            assert f"aie.objectfifo @{f.name}(" not in device
    configures = [runs for c, runs in fold.configures() if c == k]  # once per layer
    assert text.count(f"aiex.configure @{p.symbol} ") == len(configures) > 0
    assert all([r.design for r in runs] == [fold.designs.index(m.design) for m in p.members]
               for runs in configures)  # each configure runs every member, in turn
    # every rule on the merged device: test_every_fold_verifies_and_lays_its_tensors_apart


def test_verify_refuses_a_pack_whose_members_overlap_columns():
    fold, k = packed_fold()
    p = fold.configurations[k]
    second = p.members[1]
    onto_the_first = dataclasses.replace(second, placed=relocate(second.design, 0,
                                                                  second.symbol))
    bad = dataclasses.replace(p, members=(p.members[0], onto_the_first, *p.members[2:]))
    configurations = list(fold.configurations)
    configurations[k] = bad
    broken = dataclasses.replace(fold, configurations=tuple(configurations))
    with pytest.raises(Problem, match=r"a second aie.core on core tile \(0, \d\).*"
                       r"\[one_core_per_tile\]$"):
        check_text(render(broken, generic=True), "fold")


def test_designs_declaring_one_kernel_function_differently_are_not_packed():
    """Kernel declarations keep their names (the object file's symbols), so two members
    calling one function with other argument types cannot share a device, however many
    columns are free; designs of distinct kernels can."""
    _, program, _ = tiny_decoder()
    designs = [d for d in loaded(program, None, True).designs if d is not None]
    g1, g2 = [d for d in dict.fromkeys(designs) if d.name.startswith("GEMV(")][:2]
    norm = next(d for d in designs if d.name.startswith("RMSNorm("))
    assert "gemv_bf16 is declared" in fits([g1, g2], 64)
    assert pack([g1, g2], 64) == {id(g1): 0, id(g2): 1}
    assert fits([norm, g1], 64) is None and pack([norm, g1], 64) == {id(norm): 0, id(g1): 0}
    assert "columns side by side > the 8" in fits([norm, g1], 8)


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


# ---- views as upstream builds them, and the lowering's trace of them -------------------------

MLIR_OPT = shutil.which("mlir-opt-22")
needs_mlir_opt = pytest.mark.skipif(
    MLIR_OPT is None, reason="mlir-opt-22 not found: install Debian's mlir-22-tools "
    "(apt-get install mlir-22-tools); .ci/run does")


def first_fold() -> Fold:
    """The tiny decoder's first fold."""
    _, program, _ = tiny_decoder()
    designs = list(loaded(program, None, True).designs)
    return next(s for s in plan(program, designs) if isinstance(s, Fold))


def main_sequence_views(text: str) -> str:
    """The memref ops of a fold's main sequence as a function of its host buffers: standard
    MLIR that mlir-opt verifies with its own memref verifiers."""
    main = text[text.index("@main" if "aie.device(" in text else 'sym_name = "main"'):]
    params = re.search(r"(?:@sequence\(|\^bb0\()(.*?)\)(?: \{|:$)", main, re.M).group(1)
    ops = [x for x in main.splitlines() if re.match(r'\s*%\w+ = "?memref\.', x)]
    return f"func.func @views({params}) {{\n" + "\n".join(ops) + "\n  return\n}\n"


def test_a_fold_hands_each_tensor_over_as_a_subview_cast_to_the_callees_static_type():
    fold = first_fold()
    for text in (render(fold), render(fold, generic=True)):
        assert "memref.view" not in text and "?x" not in text
        runs = len(fold.runs)
        args = sum(len(fold.designs[r.design].args) for r in fold.runs)
        assert text.count("memref.subview") == text.count("memref.reinterpret_cast") == args
        assert text.count("aiex.run") == runs
    # one host buffer per role and element type, each tensor inside its own buffer
    assert len({(b.role, b.dtype) for b in fold.buffers}) == len(fold.buffers)
    for t, s in fold.slots:
        b = fold.buffers[s.buffer]
        assert s.offset % b.itemsize == 0 and s.offset + s.nbytes <= b.nbytes


@needs_mlir_opt
def test_upstream_mlir_verifies_the_views_and_both_forms_print_the_same():
    """mlir-opt's memref verifiers (the subview's result layout, the reinterpret_cast's) on
    the views of both forms, and both forms read back to the same ops."""
    fold = first_fold()
    printed = []
    for generic in (False, True):
        text = main_sequence_views(render(fold, generic))
        assert "memref.cast" not in text
        result = subprocess.run([MLIR_OPT, "-"], input=text, capture_output=True, text=True,
                                timeout=120)
        assert result.returncode == 0, result.stderr[:2000]
        printed.append(result.stdout)
    assert printed[0] == printed[1]
    wrong = main_sequence_views(render(fold)).replace("offset: 0>>", "offset: 8>>", 1)
    result = subprocess.run([MLIR_OPT, "-"], input=wrong, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode != 0 and "subview" in result.stderr


def as_memref_view(text: str) -> str:
    """The first view a memref.view of a byte buffer, as iron's folds were written before."""
    line = next(x for x in text.splitlines() if '"memref.reinterpret_cast"(' in x)
    name, ty = re.match(r"\s*(%\w+) = .* -> (memref<[^>]*>)$", line).groups()
    nbytes = int(re.match(r"memref<(\d+)x", ty).group(1)) * 8
    return text.replace(line, (
        f'        %raw = "memref.alloc"() <{{operandSegmentSizes = array<i32: 0, 0>}}> : () -> '
        f"memref<{nbytes}xi8>\n"
        f'        %at = "arith.constant"() <{{value = 0 : index}}> : () -> index\n'
        f'        {name} = "memref.view"(%raw, %at) : (memref<{nbytes}xi8>, index) -> {ty}'), 1)


def with_dynamic_size(text: str) -> str:
    """The first subview's size a runtime value."""
    line = next(x for x in text.splitlines() if '"memref.subview"(' in x)
    name, source, size = re.match(r"\s*(%\w+) = \"memref.subview\"\((%\w+)\).*static_sizes = "
                                  r"array<i64: (\d+)>", line).groups()
    changed = (line.replace(f"({source})", f"({source}, %dyn)")
               .replace("array<i32: 1, 0, 0, 0>", "array<i32: 1, 0, 1, 0>")
               .replace(f"static_sizes = array<i64: {size}>",
                        "static_sizes = array<i64: -9223372036854775808>")
               .replace(f"-> memref<{size}x", "-> memref<?x")
               .replace(") -> memref<?x", ", index) -> memref<?x"))
    changed = (f'        %dyn = "arith.constant"() <{{value = {size} : index}}> : () -> index\n'
               + changed)
    use = next(x for x in text.splitlines() if f'"memref.reinterpret_cast"({name})' in x)
    return text.replace(line, changed, 1).replace(
        use, use.replace(f": (memref<{size}x", ": (memref<?x"), 1)


@pytest.mark.parametrize("change,message", [
    (as_memref_view, "comes from a memref.view, which mlir-aie traceSubviewToBlockArgument"),
    (with_dynamic_size, "memref.subview with dynamic static_sizes"),
])
def test_verify_rejects_a_view_the_lowering_cannot_trace_naming_the_trace_rule(change, message):
    """The op definitions and the earlier rules accept the broken fold (the first problem is
    the trace rule's); ``test_every_fold_verifies_and_lays_its_tensors_apart`` and the design
    tests show the rule passes what iron writes."""
    text = render(first_fold(), generic=True)
    broken = change(text)
    assert broken != text
    with pytest.raises(Problem, match=re.escape(message) + r".*\[traced_to_arguments\]$"):
        check_text(broken, "fold")


def test_npu1_has_no_folds_each_npu_step_is_its_own_dispatch():
    """Phoenix has no full-ELF flow: every NPU step its own xclbin, one dispatch each, even
    where npu2 folds; the one-step units run but are never rendered as a module."""
    rng = np.random.default_rng(3)
    _, inputs = chain_case(rng)
    graph = Chain("npu1")
    graph.weights = {"w": (1 + 0.1 * rng.standard_normal(256)).astype(iron.bfloat16)}
    program = graph.record_like(inputs)
    exe = loaded(program, graph.weights, True)
    units = [s.fold for s in exe.segments if not isinstance(s, int)]
    assert [len(u.runs) for u in units] == [1] * 6
    got = exe.run(inputs)[0]
    np.testing.assert_allclose(got.astype(np.float32),
                               graph.reference(*inputs).astype(np.float32), rtol=3e-2, atol=3e-2)
    assert exe.dispatches() == 6
    with pytest.raises(BundleError, match="npu1 has no full-ELF flow, so no folds"):
        render(units[0])


#: Stand-ins for aiecc.py and Peano's clang++: each records its arguments and writes the file
#: its command line names as output (aiecc's ``--full-elf-name``, clang's ``-o``).
RECORDING_TOOL = """#!{python}
import pathlib, sys
args = sys.argv[1:]
pathlib.Path("{name}-args.txt").write_text("\\n".join(args))
out = [a.split("=", 1)[1] for a in args if a.startswith("--full-elf-name=")]
out += [args[i + 1] for i, a in enumerate(args) if a == "-o"]
pathlib.Path(out[0]).write_bytes(b"elf")
"""


def test_a_fold_compiles_with_aiecc_full_elf_option_where_aiecc_is_installed(tmp_path,
                                                                            monkeypatch):
    from iron.targets.npu import SOURCE_DIR
    from iron.targets.npu.aiecc import run_full_elf

    fold, out = first_fold(), tmp_path / "fold0"  # designs compiled before aiecc is on PATH
    bin_dir, peano = tmp_path / "bin", tmp_path / "peano"
    (peano / "bin").mkdir(parents=True)
    bin_dir.mkdir()
    for path, name in ((bin_dir / "aiecc.py", "aiecc"), (peano / "bin" / "clang++", "clang")):
        path.write_text(RECORDING_TOOL.format(python=sys.executable, name=name))
        path.chmod(0o755)
    include = tmp_path / "mlir-aie" / "include"
    (include / "aie_api").mkdir(parents=True)
    (include / "aie_api" / "aie.hpp").write_text("")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("PEANO_INSTALL_DIR", str(peano))
    monkeypatch.setenv("MLIR_AIE_INCLUDE_DIR", str(include))
    run_full_elf(out, fold, SOURCE_DIR)
    assert (out / "fold.mlir").read_text() == render(fold)
    assert (out / "aiecc-args.txt").read_text().split("\n") == [
        "--no-xchesscc", "--no-xbridge", "--peano", str(peano), "--no-compile-host",
        "--generate-full-elf", "--full-elf-name=fold.elf", "fold.mlir"]
    assert (out / "fold.elf").is_file()
    for source in {d.kernel_source for d in fold.designs}:  # every kernel a device links with
        assert (out / source.replace(".cc", ".o")).is_file(), source
        assert f'link_with = "{source.replace(".cc", ".o")}"' in render(fold)
    clang = (out / "clang-args.txt").read_text().split("\n")
    assert "--target=aie2p-none-unknown-elf" in clang and f"-I{include}" in clang
