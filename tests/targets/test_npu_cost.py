"""The npu designs' cost model, and the npu1 / npu2 profiles the tuner writes with it.

The model is checked by hand on a small design, by the choices it must make (more columns for
a big GEMV, fewer for a tiny one, no tiny tiles), and by its rules (double buffering overlaps,
depth 1 serialises).  The committed profiles are checked against a fresh model-only tune of
both devices and both weight modes, entry for entry legal, and every entry emulated at the
decoder's shapes against the reference maths.
"""

import dataclasses
import io
from pathlib import Path

import numpy as np
import pytest

import iron
from iron.operators import GEMM, GEMV, ElementwiseAdd
from iron.pipeline.app import app_profile, load_app
from iron.targets import target_for
from iron.targets.cost import BOTTLENECKS, COMPUTE, LAUNCH, MEMTILE, SHIM_DMA
from iron.targets.npu import design_of
from iron.targets.npu.cost import design_cost, design_estimate
from iron.targets.npu.mlir import render
from iron.targets.npu.verify import check_text
from iron.targets.npu.resources import (BD_CYCLES, CALL_CYCLES, DISPATCH_SECONDS,
                                        TRANSFER_ISSUE_SECONDS, resources)
from iron.resolution import legal, legal_settings
from iron.tuning.candidates import candidates, instances
from iron.tuning.check import mismatch
from iron.tuning.measure import single_step
from iron.tuning.events import PrintSink
from iron.tuning.tuner import TuneOptions, tune
from opcases import case_inputs, OneStep
from opcases import SMALL

REPO = Path(__file__).resolve().parents[2]
DEVICES = ("npu1", "npu2")
#: The commands that write the committed profiles, in order, as (device, weights option).
RUNS = [(dev, weights) for dev in DEVICES for weights in (None, "bf16")]


def cost(op, dev):
    return target_for(iron.device(dev)).cost(op)


def gemv(M, K, columns, tsi=4, tso=32):
    return GEMV(M=M, K=K, batches=1, tile_size_input=tsi, tile_size_output=tso,
                num_aie_columns=columns)


# ---- the model ---------------------------------------------------------------------------------


def test_a_small_design_costs_what_the_hand_count_says():
    """ElementwiseAdd of 2048 on one npu1 column, 8 tiles of 256, counted by hand: each call
    256 adds over the kernel's 16 lanes + the call's cycles; each input FIFO 4096 B at 4 B per cycle + a
    buffer descriptor per tile; one tile in and one out to fill the pipeline; 3 transfers."""
    op = ElementwiseAdd(size=2048, tile_size=256, num_aie_columns=1, num_channels=1)
    e = cost(op, "npu1")
    clock = 1.0e9
    compute = 8 * (256 / 16 + CALL_CYCLES) / clock
    shim = (4096 / 4 + 8 * BD_CYCLES) / clock
    fill = 2 * (512 / 4 + BD_CYCLES) / clock
    launch = DISPATCH_SECONDS + 3 * TRANSFER_ISSUE_SECONDS
    assert e.terms[COMPUTE] == pytest.approx(compute, rel=1e-12)
    assert e.terms[SHIM_DMA] == pytest.approx(shim, rel=1e-12)
    assert e.terms["fill"] == pytest.approx(fill, rel=1e-12)
    assert e.terms[LAUNCH] == pytest.approx(launch, rel=1e-12)
    assert e.seconds == pytest.approx(launch + fill + max(compute, shim), rel=1e-12)
    assert e.bottleneck == LAUNCH and MEMTILE not in e.terms
    assert design_estimate(design_of(op, "npu1")) == e  # the target's cost is the design's


@pytest.mark.parametrize("dev", DEVICES)
def test_every_legal_setting_of_every_design_has_a_consistent_estimate(dev):
    for name, shape in SMALL:
        cls, fields, inputs = case_inputs(name, shape, np.random.default_rng(0))
        op = OneStep(cls, fields, dev).record_like(inputs).ops[0]
        for setting in legal_settings(op, dev):
            e = cost(dataclasses.replace(op, **setting), dev)
            steady = [e.terms[k] for k in (COMPUTE, SHIM_DMA, MEMTILE) if k in e.terms]
            assert e.bottleneck in BOTTLENECKS and min(e.terms.values()) >= 0
            assert e.seconds == pytest.approx(e.terms[LAUNCH] + e.terms["fill"] + max(steady))
            assert (MEMTILE in e.terms) == (name == "GEMM")  # only GEMM goes through memtiles


def test_more_columns_win_for_a_big_gemv_and_lose_for_a_tiny_one():
    big = [cost(gemv(8192, 2048, c), "npu2") for c in (1, 2, 4, 8)]
    assert [e.seconds for e in big] == sorted((e.seconds for e in big), reverse=True)
    assert big[0].bottleneck == SHIM_DMA  # one column's two shim channels carry all of W
    assert 2 < big[0].seconds / big[-1].seconds < 8  # the launch does not shrink with columns
    tiny = [cost(gemv(64, 64, c, tso=8), "npu2") for c in (1, 2, 4, 8)]
    assert [e.seconds for e in tiny] == sorted(e.seconds for e in tiny)  # each column's
    assert all(e.bottleneck == LAUNCH for e in tiny)  # transfers cost more than they save


def test_columns_stop_paying_when_the_host_memory_behind_the_shims_is_saturated():
    """A 1M-element add moves 6 MiB: on npu2 eight columns' channels could take it faster
    than the host memory's 120 GB/s delivers it, so the eighth column gains little."""
    def add(columns):
        return cost(ElementwiseAdd(size=1 << 20, tile_size=2048, num_aie_columns=columns,
                                   num_channels=1), "npu2")

    one, two, four, eight = (add(c) for c in (1, 2, 4, 8))
    assert eight.terms[SHIM_DMA] == pytest.approx(3 * 2 * (1 << 20) / 120e9)  # in + in + out
    assert one.terms[SHIM_DMA] / two.terms[SHIM_DMA] == pytest.approx(2, rel=1e-6)
    assert four.terms[SHIM_DMA] / eight.terms[SHIM_DMA] < 1.5


def test_a_big_gemm_takes_every_column_its_shim_traffic_is_split_over():
    def gemm(columns):
        return GEMM(M=256, K=1024, N=2048, tile_m=32, tile_k=64, tile_n=64,
                    num_aie_columns=columns)

    times = [cost(gemm(c), "npu1").seconds for c in (1, 2, 3, 4)]
    assert all(a > 1.2 * b for a, b in zip(times, times[1:]))  # each column adds shim channels
    assert cost(gemm(4), "npu1").bottleneck == SHIM_DMA  # A is streamed once per tile of N
    best = min(candidates(GEMM(M=256, K=1024, N=2048), "npu1"),
               key=lambda op: cost(op, "npu1").seconds)
    assert best.num_aie_columns == 4


def test_tiny_tiles_lose_to_per_call_and_per_buffer_cycles():
    def add(tile):
        return ElementwiseAdd(size=65536, tile_size=tile, num_aie_columns=1, num_channels=1)

    small, mid = cost(add(16), "npu2"), cost(add(1024), "npu2")
    assert small.seconds > 2 * mid.seconds and small.bottleneck == COMPUTE
    assert cost(add(4096), "npu2").terms["fill"] > mid.terms["fill"]  # bigger tiles fill slower
    ranked = sorted(candidates(ElementwiseAdd(size=65536), "npu2"),
                    key=lambda op: cost(op, "npu2").seconds)
    assert ranked[0].tile_size >= 512 and ranked[-1].tile_size == 16


def test_a_gemm_tile_costs_the_mmul_of_the_linked_kernel_on_either_device():
    """gemm.cc issues one MMUL per cycle: 4x8x4 on npu1's AIE2, 4x8x8 on npu2's AIE2P, so a
    tile's MMUL cycles halve on npu2 (and its clock is 1.8x npu1's)."""
    from iron.targets.npu.cost import kernel_cycles
    from iron.targets.npu.ir import Call

    op = GEMM(M=256, K=256, N=256, tile_m=64, tile_k=64, tile_n=64, num_aie_columns=1)
    gemm = next(c for c in calls_of(design_of(op, "npu2")) if c.function == "gemm_bf16")
    assert isinstance(gemm, Call)
    one, two = (kernel_cycles(gemm, resources(dev)) for dev in DEVICES)
    assert one == 64 * 64 * 64 / (4 * 8 * 4) and two == 64 * 64 * 64 / (4 * 8 * 8)
    calls = (256 // 4 // 64) * (256 // 64)  # per core: its row blocks of M times tiles of N
    mmuls = calls * (256 // 64) * 64 * 64 * 64 / (4 * 8 * 4)
    assert cost(op, "npu1").terms[COMPUTE] * 1.0e9 > mmuls


def calls_of(design):
    """Every kernel call of a design's cores, loops unrolled once."""
    from iron.targets.npu.ir import Call, Loop

    def walk(body):
        for op in body:
            if isinstance(op, Loop):
                yield from walk(op.body)
            elif isinstance(op, Call):
                yield op

    return [c for core in design.cores for c in walk(core.body)]


def test_a_depth_one_stream_serialises_what_double_buffering_overlaps():
    op = ElementwiseAdd(size=65536, tile_size=1024, num_aie_columns=1, num_channels=1)
    design = design_of(op, "npu2")
    single = dataclasses.replace(design, fifos=tuple(dataclasses.replace(f, depth=1)
                                                     for f in design.fifos))
    res = resources("npu2")
    double, serial = design_cost(design, res), design_cost(single, res)
    t = double.terms
    assert serial.seconds == pytest.approx(t[LAUNCH] + t["fill"] + t[COMPUTE] + t[SHIM_DMA])
    assert serial.seconds > double.seconds


def test_a_kernel_the_model_does_not_know_is_an_error_naming_it():
    op = ElementwiseAdd(size=2048, tile_size=256, num_aie_columns=1, num_channels=1)
    design = design_of(op, "npu1")
    *first, loop = design.cores[0].body  # the first iteration written out, the loop
    renamed = dataclasses.replace(loop.body[3], function="fft_bf16")
    core = dataclasses.replace(design.cores[0], body=(*first, dataclasses.replace(
        loop, body=(*loop.body[:3], renamed, *loop.body[4:])),))
    with pytest.raises(ValueError, match="no cycle count for the core kernel 'fft_bf16'"):
        design_cost(dataclasses.replace(design, cores=(core,)), resources("npu1"))


# ---- the committed profiles ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def apps(smollm2):
    return {w: load_app("llama", smollm2, **({"weights": w} if w else {}))
            for w in (None, "bf16")}


@pytest.mark.slow
def test_committed_npu_profiles_are_what_the_model_tune_writes_now(apps, tmp_path):
    """``python -m iron.lm.tune llama --device D`` then ``... --var weights=bf16``, from no
    profile and no log, for npu1 and npu2, give the bytes of the committed files (which
    another process wrote): no timestamps, no host data, ties broken by the legal order."""
    for dev, weights in RUNS:
        out = io.StringIO()
        result = tune(apps[weights], dev, TuneOptions(profile_path=tmp_path / f"{dev}.json",
                                                      log_path=tmp_path / f"{dev}.jsonl"),
                      events=PrintSink(out))
        assert result.source == "model" and result.complete, out.getvalue()
        assert out.getvalue().count("source: model") == 2  # when it starts, and its report
    for dev in DEVICES:
        written = (tmp_path / f"{dev}.json").read_bytes()
        assert written == (REPO / "profiles" / "llama" / f"{dev}.json").read_bytes(), dev


@pytest.mark.slow
@pytest.mark.parametrize("dev", DEVICES)
def test_every_entry_is_legal_applied_and_emulates_correctly(apps, dev):
    """Each entry of the committed profile is the setting the decoder resolves (what ``doit
    device=D`` builds), legal by the resource rules, its design emulated at the decoder's
    shapes matches the reference maths, and its MLIR verifies against mlir-aie's op
    definitions; each npu-placed instance with a choice has one."""
    profile = app_profile("llama", dev)
    device, target = iron.device(dev), target_for(iron.device(dev))
    entries = {(e.operator, tuple(sorted(e.match))): dict(e.sets) for e in profile.entries}
    covered = set()
    for app in apps.values():
        for inst in instances(app.tuned_programs(device, profile)):
            op = inst.current
            if target.placement(op) != "npu" or len(candidates(inst.op, device)) < 2:
                continue
            key = (type(op).__name__, tuple(sorted((p, getattr(op, p)) for p in op.params())))
            assert key in entries, f"{op.describe()} has no entry in {dev}.json"
            assert entries[key] == op.tunable_values(), op.describe(True)  # what doit builds
            covered.add(key)
            assert legal(op, device), op.describe(True)
            program = single_step(inst, op, device)
            rng = np.random.default_rng(0)
            arrays = [inst.op.example_input(i, s.shape, s.dtype, rng)
                      for i, s in enumerate(inst.inputs)]
            out = target.emulated().load(program).run(arrays)
            problem = mismatch(type(op).__name__, out[0], program.reference(arrays)[0],
                               target.tolerance(type(op)))
            assert problem is None, f"{op.describe(True)} on {dev}: {problem}"
            check_text(render(design_of(op, dev), generic=True), op.describe(True))
    assert covered == set(entries)  # no entry for a host-placed or absent instance
