"""Object FIFO buffer rotation as the pinned static lowering fixes it in the cores' code
(``iron.targets.npu.rotation``): the emulator gives each acquire the buffer the unrolled code
names, so a design whose rotation drifts computes the wrong thing from its second dispatch
(or iteration) on and says so; the rule finds the same designs without running them; every
design of the catalogue keeps its rotation."""

import dataclasses

import numpy as np
import pytest

import iron
from iron.operators import GEMV, ElementwiseAdd
from iron.resolution import legal_settings, resolve
from iron.targets import npu
from iron.targets.npu.ir import Acquire, Loop, Release
from iron.targets.npu.emulator import Emulation, EmulationError
from iron.targets.npu.mlir import render
from iron.targets.npu.rotation import (Copy, RotationError, Slot, Unrolled, check, lower,
                                       problems)
from iron.targets.npu.verify import Problem, check_text
from opcases import SMALL, OneStep, case_inputs
from test_npu import host_cores


def design_of(op, dev="npu2"):
    return npu.design_of(resolve(op, dev), dev)


def with_depth(design, depth, *names):
    """``design`` with the FIFOs ``names`` (all, when none) declared ``depth`` deep."""
    return dataclasses.replace(design, fifos=tuple(
        dataclasses.replace(f, depth=depth) if not names or f.name in names else f
        for f in design.fifos))


def add_576():
    """Nine tiles of 64 per dispatch, double-buffered: ``designs`` writes the first tile's
    iteration out ahead of the loop over the other eight (``rotation.peeled``)."""
    return design_of(ElementwiseAdd(size=576, tile_size=64, num_aie_columns=1, num_channels=1))


def as_one_loop(design):
    """``design`` with each core's peeled iteration folded back into its loop, as the
    designs were drawn before: a program that is one loop of the nine tiles."""
    cores = []
    for core in design.cores:
        loop = core.body[-1]
        assert isinstance(loop, Loop) and core.body[:-1] == loop.body
        cores.append(dataclasses.replace(core, body=(Loop(loop.count + 1, loop.body),)))
    return dataclasses.replace(design, cores=tuple(cores))


def bf16(rng, n):
    return rng.standard_normal(n).astype(iron.bfloat16)


def test_a_loop_is_unrolled_by_the_depth_and_its_acquires_get_buffers_in_program_order():
    """Nine iterations at depth 2: four of a pair of copies (buffers 0, 1), then one more copy
    (buffer 0 again), so the next dispatch's code starts at buffer 0 where the DMA is at 1."""
    d = as_one_loop(add_576())
    (copy,) = lower(d, d.cores[0])
    unrolled, rest = copy
    assert isinstance(unrolled, Unrolled) and unrolled.count == 4
    assert [[op.index for op in c if isinstance(op, Slot) and op.fifo == "in0_0_0"]
            for c in unrolled.copies] == [[0], [1]]
    assert isinstance(rest, Copy) and rest.index == 8
    assert [op.index for op in rest.body if isinstance(op, Slot)] == [0, 0, 0]


def test_a_drifting_design_computes_wrong_data_from_its_second_dispatch_and_says_so():
    d = as_one_loop(add_576())
    loaded = Emulation(d, host_cores())
    rng = np.random.default_rng(3)
    for dispatch in (1, 2):
        a, b, out = bf16(rng, 576), bf16(rng, 576), np.zeros(576, iron.bfloat16)
        expected = (a.astype(np.float32) + b.astype(np.float32)).astype(iron.bfloat16)
        if dispatch == 1:
            loaded.dispatch([a, b, out])
            assert np.array_equal(out.view(np.uint16), expected.view(np.uint16))
            continue
        with pytest.raises(EmulationError, match=r"core tile \(0, 2\) acquires buffer 0 of "
                           r"in0_0_0 for its element 9 \(dispatch 2\), where the tile's DMA "
                           r"filled buffer 1: the buffer rotation .* drifted, the data are wrong"
                           r" .*acquires in0_0_0 \(consume\) 3 time\(s\), not a multiple of its "
                           r"2 buffers"):
            loaded.dispatch([a, b, out])
        assert not np.array_equal(out.view(np.uint16), expected.view(np.uint16))
    fixed = Emulation(add_576(), host_cores())
    for _ in range(3):  # as drawn: the loop until reconfiguration unrolled by two
        fixed.dispatch([bf16(rng, 576), bf16(rng, 576), np.zeros(576, iron.bfloat16)])


def test_a_loop_repeating_an_odd_rotation_drifts_inside_the_first_dispatch():
    """The quantized GEMV's W acquired in a loop of one inside the loop over four 16-row
    tiles (how it was drawn): the loop of one is not unrolled, the outer one has no acquire of
    its own and is not unrolled either, so every tile's code takes buffer 0."""
    op = GEMV(M=64, K=64, batches=1, weight_format="q4_1", group_size=32, tile_size_input=16,
              tile_size_output=64, num_aie_columns=1)
    d = design_of(op)

    def nested(body):
        out = []
        for o in body:
            if isinstance(o, Loop) and isinstance(o.body[0], Acquire) and o.body[0].fifo == "W_0":
                head = o.body[:3]
                assert isinstance(head[2], Release)
                o = dataclasses.replace(o, body=(Loop(1, head), *o.body[3:]))
            elif isinstance(o, Loop):
                o = dataclasses.replace(o, body=tuple(nested(o.body)))
            out.append(o)
        return out

    drawn = dataclasses.replace(d, cores=(dataclasses.replace(
        d.cores[0], body=tuple(nested(d.cores[0].body))),))
    assert drawn != d
    assert problems(d) == []
    assert any("the code of each iteration of a loop of 4, as unrolled, acquires W_0 (consume) "
               "1 time(s), not a multiple of its 2 buffers" in p for p in problems(drawn))
    x = bf16(np.random.default_rng(0), 64)
    w = np.random.default_rng(1).integers(0, 256, drawn.args[0].numel, np.uint8)
    with pytest.raises(EmulationError, match=r"acquires buffer 0 of W_0 for its element 1 "
                       r"\(dispatch 1\), where the tile's DMA filled buffer 1"):
        Emulation(drawn, host_cores()).dispatch([w, x, np.zeros(64, iron.bfloat16)])


def test_the_loop_until_reconfiguration_unrolls_when_it_acquires_directly():
    """A bf16 GEMV of one output tile: its y acquired right in the loop around its program
    (the loop over the tiles, of one, written out), which the lowering unrolls into two
    copies, so one y per dispatch still closes the rotation, every two dispatches.  Kept in
    its loop of one, that loop has y's acquire, but the loop around it has none."""
    d = design_of(GEMV(M=64, K=32, batches=1, tile_size_input=2, tile_size_output=64,
                       num_aie_columns=1))
    assert d.fifo("x_0").depth == 1 and d.fifo("y_0").depth == 2
    copies = lower(d, d.cores[0])
    assert [[op.index for op in c if isinstance(op, Slot) and op.fifo == "y_0"]
            for c in copies] == [[0], [1]]
    assert problems(d) == []
    take, *tile, give = d.cores[0].body
    kept = dataclasses.replace(d, cores=(dataclasses.replace(
        d.cores[0], body=(take, Loop(1, tuple(tile)), give)),))
    assert any("acquires y_0 (produce) 1 time(s)" in p for p in problems(kept))
    assert problems(with_depth(d, 2, "x_0")) == []  # x in that loop too: both unrolled
    rng = np.random.default_rng(5)
    loaded = Emulation(d, host_cores())
    for _ in range(3):
        w, x, y = bf16(rng, 64 * 32), bf16(rng, 32), np.zeros(64, iron.bfloat16)
        loaded.dispatch([w, x, y])
        want = (w.astype(np.float32).reshape(64, 32) @ x.astype(np.float32))
        np.testing.assert_allclose(y.astype(np.float32), want, rtol=0.02, atol=0.05)


def test_the_rule_rejects_a_design_edited_to_drift_citing_the_lowering():
    d = add_576()
    check(d)
    with pytest.raises(RotationError, match=r"ElementwiseAdd.*in0_0_0 \(consume\) 3 time\(s\), "
                       r"not a multiple of its 2 buffers.*AIEObjectFifoStatefulTransform.cpp: "
                       r"unrollForLoops"):
        check(as_one_loop(d))
    check(with_depth(as_one_loop(d), 1))  # one buffer: any count is whole rotations


@pytest.mark.slow
@pytest.mark.parametrize("dev", ("npu1", "npu2"))
def test_every_design_of_the_catalogue_keeps_its_rotation(dev):
    """Every legal setting of every small case (the fast lane's emulation sweep dispatches
    each twice, which fails on a drift too; this names every drifting FIFO at once)."""
    drifting = []
    for name, shape in SMALL:
        cls, fields, inputs = case_inputs(name, shape, np.random.default_rng(0))
        op = OneStep(cls, fields, dev).record_like(inputs).ops[0]
        for setting in legal_settings(op, dev):
            drifting += problems(npu.design_of(dataclasses.replace(op, **setting), dev))
    assert drifting == []


@pytest.mark.slow
def test_every_design_the_llama_bundles_place_keeps_its_rotation(smollm2):
    """The designs of ``doit device=npu2`` (quantized and bf16 weights) and ``device=npu1``
    (bf16) under the committed profiles."""
    from iron.pipeline.app import app_profile, load_app

    drifting, seen = [], set()
    for dev, weights in (("npu2", None), ("npu2", "bf16"), ("npu1", "bf16")):
        app = load_app("llama", smollm2, **({"weights": weights} if weights else {}))
        for program in app.programs(iron.device(dev), app_profile("llama", dev)).values():
            for op in program.ops:
                d = npu.design_of(op, dev)
                if d is not None and (dev, d.name) not in seen:
                    seen.add((dev, d.name))
                    drifting += problems(d)
    assert len(seen) > 50 and drifting == []


def test_verify_rejects_a_module_edited_to_drift_unless_its_core_lowers_dynamically():
    """The same rule on the parsed module (``preconditions.RULES``): the nine tiles of 64 in
    one loop."""
    check_text(render(add_576(), generic=True))
    drifting = render(as_one_loop(add_576()), generic=True)
    with pytest.raises(Problem, match=r":\d+: 'aie.core': core tile \(0, 2\): the code of each "
                       r"iteration of its loop until reconfiguration \(a dispatch\), as unrolled, "
                       r"acquires in0_0_0 \(consume\) 3 time\(s\), not a multiple of its 2 "
                       r"buffers.*unrollForLoops\) \[fifo_rotation\]"):
        check_text(drifting)
    check_text(drifting.replace('"aie.core"(%tile_0_2) ({', '"aie.core"(%tile_0_2) '
                                '<{dynamic_objfifo_lowering = true}> ({'))
