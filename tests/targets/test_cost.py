"""Cost models: the estimate contract, the cpu roofline, pruning, and tuning by a model.

The cpu model is priced here with fixed host numbers (a calibration file written into a
temporary build folder, read by the real cache code), so its rankings are deterministic; the
tuner's pruning is checked with the deterministic stand-in benchmark of ``test_tuner``; the
``source: model`` path with the npu designs' own model (``tests/targets/test_npu_cost.py`` checks
that model itself).
"""

import dataclasses
import json
import math
import os

import numpy as np
import pytest

import iron
from iron.errors import DeviceError
from iron.operators import GEMM, GEMV, Attention, ElementwiseAdd, Embedding, SiLU, SwiGLU
from iron.targets import Target, target_for
from iron.targets.cpu import calibration
from iron.targets.cpu import cost as cpu_model
from iron.targets.cost import BOTTLENECKS, COMPUTE, LAUNCH, MEMORY, Estimate, estimate
from iron.tuning import __main__ as tuning_cli
from iron.tuning.candidates import candidates, instances, unset
from iron.tuning.model import ModelBenchmark, prune, ranked, spearman
from iron.tuning.events import PrintSink
from iron.tuning.tuner import MIN_GAIN, TuneOptions, tune

from opcases import OneStep, operators_under_test
from tunetools import FakeApp, FakeBench, fake_time

#: A host: 10 GB/s from memory with one thread, 16 with two; cache 100 / 200 GB/s; 4 / 8 G
#: vector FMAs per second; a 5 us fork / join; 1 ns per work item; AMX.
HOST = calibration.Calibration(memory_bw=(10e9, 16e9), cache_bw=(100e9, 200e9), fma_rate=(4e9, 8e9),
                      fork=(0.0, 5e-6), item=1e-9, amx=True, avx512_bf16=True, load=0.0)


@pytest.fixture
def fixed_host(tmp_path, monkeypatch):
    """The cpu target's model priced with ``HOST``, through the calibration cache."""
    monkeypatch.setenv("IRON_BUILD_DIR", str(tmp_path / "build"))
    path = calibration.calibration_path()
    path.parent.mkdir(parents=True)
    host = dataclasses.replace(HOST, load=os.getloadavg()[0])  # calibrated "just now"
    path.write_text(json.dumps(dataclasses.asdict(host)))
    calibration.calibration.cache_clear()
    yield host
    calibration.calibration.cache_clear()


# ---- the estimate contract ------------------------------------------------------------------


def test_estimate_is_launch_plus_the_largest_overlapping_term_and_names_it():
    e = estimate({COMPUTE: 3e-6, MEMORY: 5e-6}, {LAUNCH: 1e-6})
    assert e.seconds == pytest.approx(6e-6) and e.bottleneck == MEMORY
    assert estimate({COMPUTE: 1e-6, MEMORY: 5e-7}, {LAUNCH: 4e-6}).bottleneck == LAUNCH
    assert "memory-bound" in e.describe()


@pytest.mark.parametrize("bad", [dict(seconds=1e-6, bottleneck="disk"),
                                 dict(seconds=0.0, bottleneck=COMPUTE),
                                 dict(seconds=float("nan"), bottleneck=COMPUTE)])
def test_estimate_refuses_an_unknown_bottleneck_or_a_time_that_is_not_positive(bad):
    with pytest.raises(ValueError, match="bottleneck|positive"):
        Estimate(**bad)


def test_a_target_without_a_model_and_a_host_placed_npu_step_say_none():
    gemv = GEMV(M=64, K=64, tile_size_input=4, tile_size_output=16, num_aie_columns=1)
    assert Target().cost(gemv) is None
    npu2 = target_for(iron.device("npu2"))
    assert npu2.cost(gemv) is not None  # a design: modelled
    lookup = Embedding(vocab=64, dim=32, rows=1, num_aie_columns=1)  # a gather: on the host
    assert npu2.placement(lookup) == "host" and npu2.cost(lookup) is None


# ---- the cpu roofline ---------------------------------------------------------------------


def every_tunable_case():
    """Every legal cpu setting of every operator's test shapes that has tunables."""
    for cls in operators_under_test():
        for shape in cls.test_shapes:
            fields, arrays = cls.example(np.random.default_rng(0), **shape)
            specs = [iron.spec(a.shape, a.dtype) for a in arrays]
            (op,) = OneStep(cls, fields).record(*specs).ops
            if op.tunables():
                yield from candidates(unset(op), "cpu")


def test_every_cpu_setting_gets_a_positive_estimate_with_a_named_bottleneck():
    ops = list(every_tunable_case())
    assert len(ops) > 100
    for op in ops:
        e = cpu_model.cost(op, HOST)
        assert e.bottleneck in BOTTLENECKS and math.isfinite(e.seconds) and e.seconds > 0, op


def test_gemv_streaming_weights_is_memory_bound_at_the_hosts_bandwidth():
    op = GEMV(M=3072, K=576, tile_size_input=4, tile_size_output=64, num_aie_columns=2)
    e = cpu_model.cost(op, HOST)
    assert e.bottleneck == MEMORY
    weights = 3072 * 576 * 2
    assert weights / 16e9 <= e.seconds <= 1.2 * weights / 16e9 + 5e-6  # + fork and items
    one = cpu_model.cost(dataclasses.replace(op, num_aie_columns=1), HOST)
    assert one.seconds == pytest.approx(weights / 10e9, rel=0.05)  # one thread, 10 GB/s


@pytest.mark.parametrize("op", [
    GEMV(M=49152, K=576, batches=2, tile_size_input=4, tile_size_output=64, num_aie_columns=2),
    GEMV(M=49152, K=576, batches=2, weight_format="q8_0", tile_size_output=64,
         num_aie_columns=2),
    GEMM(M=64, K=576, N=49152, tile_m=16, tile_k=64, tile_n=32, num_aie_columns=2),
    GEMM(M=64, K=576, N=49152, weight_format="q4_1", tile_n=32, num_aie_columns=2)],
    ids=["gemv", "gemv-q8_0", "gemm", "gemm-q4_1"])
def test_a_float32_output_is_counted_as_four_bytes_an_element(op):
    """The head's float32 logits are 4 bytes each: the bytes a product moves grow by 2 per
    output element against its bf16 output, on every path (plain, quantized, GEMV, GEMM)."""
    outputs = op.batches * op.M if isinstance(op, GEMV) else op.M * op.N
    bf16 = cpu_model.work(op, HOST)
    f32 = cpu_model.work(dataclasses.replace(op, output_dtype="float32"), HOST)
    assert f32.warm - bf16.warm == 2 * outputs
    assert (f32.cold, f32.ops) == (bf16.cold, bf16.ops)


def test_an_unbalanced_team_counts_as_fewer_threads():
    # 576 rows in items of 64: 9 items, 5 on one thread and 4 on the other; items of 32: 18
    uneven = GEMV(M=576, K=1536, tile_size_input=4, tile_size_output=64, num_aie_columns=2)
    even = dataclasses.replace(uneven, tile_size_output=32)
    assert cpu_model.cost(even, HOST).seconds < cpu_model.cost(uneven, HOST).seconds


def test_a_small_operator_prefers_one_thread_a_large_one_two():
    small = ElementwiseAdd(size=576, tile_size=288, num_aie_columns=2, num_channels=1)
    assert cpu_model.cost(dataclasses.replace(small, num_aie_columns=1, tile_size=576),
                          HOST).seconds < cpu_model.cost(small, HOST).seconds
    assert cpu_model.cost(small, HOST).bottleneck == LAUNCH  # the 5 us fork / join
    large = SiLU(size=1 << 20, tile_size=1 << 14, num_aie_columns=2, num_channels=1)
    assert cpu_model.cost(large, HOST).seconds < cpu_model.cost(
        dataclasses.replace(large, num_aie_columns=1), HOST).seconds
    assert cpu_model.cost(large, HOST).bottleneck == COMPUTE  # exp on every element


def test_tiny_work_items_cost_their_overhead():
    big = SwiGLU(rows=1, size=1536, tile_size=1536, num_aie_columns=1)
    assert cpu_model.cost(big, HOST).seconds < cpu_model.cost(
        dataclasses.replace(big, tile_size=16), HOST).seconds


def test_attention_blocks_pay_their_rescale():
    op = Attention(rows=32, heads=9, kv_heads=3, head_dim=64, ctx=2048, tile_size=16,
                   num_aie_columns=1)
    assert cpu_model.cost(dataclasses.replace(op, tile_size=256), HOST).seconds < \
        cpu_model.cost(op, HOST).seconds


def test_amx_gemm_ignores_the_tiles_the_hardware_fixes():
    op = GEMM(M=64, K=576, N=576, tile_m=16, tile_k=64, tile_n=32, num_aie_columns=2)
    other = dataclasses.replace(op, tile_m=64, tile_k=576)
    assert cpu_model.cost(op, HOST) == cpu_model.cost(other, HOST)
    avx512 = dataclasses.replace(HOST, amx=False)
    assert cpu_model.cost(op, avx512) != cpu_model.cost(other, avx512)


def test_a_calibration_from_a_much_busier_or_quieter_moment_is_reported_stale(fixed_host):
    path = calibration.calibration_path()
    path.write_text(json.dumps(dataclasses.asdict(dataclasses.replace(
        fixed_host, load=os.getloadavg()[0] + 50))))
    calibration.calibration.cache_clear()
    with pytest.warns(UserWarning, match="calibrated at load average .* --recalibrate"):
        assert calibration.calibration().memory_bw == HOST.memory_bw


def test_the_calibration_is_read_from_the_build_folder_once_written(fixed_host):
    assert calibration.calibration() == fixed_host
    assert iron.targets.target_for(iron.device("cpu")).cost(
        GEMV(M=64, K=64, tile_size_input=4, tile_size_output=16, num_aie_columns=1)) == \
        cpu_model.cost(GEMV(M=64, K=64, tile_size_input=4, tile_size_output=16,
                            num_aie_columns=1), HOST)


# ---- ranking and pruning --------------------------------------------------------------------


def test_spearman_matches_the_textbook_formula_and_handles_ties():
    # no ties: 1 - 6 * sum(d^2) / (n (n^2 - 1)) = 1 - 6 * 4 / 120
    assert spearman([1, 2, 3, 4, 5], [2, 1, 4, 3, 5]) == pytest.approx(0.8)
    assert spearman([1, 2, 3], [30, 20, 10]) == pytest.approx(-1.0)
    # ties share their mean rank: [1, 2.5, 2.5, 4] against [1, 2, 3, 4]
    r = np.array([1, 2.5, 2.5, 4]) - 2.5
    s = np.array([1, 2, 3, 4]) - 2.5
    assert spearman([1, 7, 7, 9], [1, 2, 3, 4]) == pytest.approx(
        (r * s).sum() / math.sqrt((r * r).sum() * (s * s).sum()))
    assert math.isnan(spearman([1, 1, 1], [1, 2, 3]))


def test_prune_keeps_the_models_fastest_and_the_setting_in_use_in_their_order(fixed_host):
    target = iron.targets.target_for(iron.device("cpu"))
    ops = candidates(GEMV(M=576, K=1536), "cpu")
    best = [op for op, _ in ranked(target, ops)]
    slowest = best[-1]
    kept = prune(target, ops, slowest, 3)
    assert set(kept) == set(best[:3]) | {slowest} and len(kept) == 4
    assert kept == [op for op in ops if op in kept]
    assert prune(target, ops, slowest, 0) == ops


def test_prune_spends_its_candidates_on_settings_that_run_different_code(fixed_host):
    """A quantized GEMM's cpu kernel ignores tile_k: the model prices its tile_k variants
    alike, and pruning keeps one of them, so its k candidates differ in tile_m, tile_n or
    threads. A bf16 GEMM's kernel blocks by tile_k, which keeps distinguishing them there."""
    target = iron.targets.target_for(iron.device("cpu"))
    quantized = candidates(GEMM(M=64, K=2048, N=2048, weight_format="q4_0"), "cpu")
    slowest = ranked(target, quantized)[-1][0]
    kept = prune(target, quantized, slowest, 4)
    code = {(op.tile_m, op.tile_n, op.num_aie_columns) for op in kept if op != slowest}
    assert len(kept) == 5 and len(code) == 4
    assert len({op.tile_k for op in quantized}) > 1  # there were tile_k variants to skip
    plain = candidates(GEMM(M=64, K=2048, N=2048), "cpu")
    assert target.ignored_tunables(plain[0]) == frozenset()
    assert target.ignored_tunables(quantized[0]) == {"tile_k"}


def test_pruned_tune_measures_only_the_models_top_k_plus_the_setting_in_use(tmp_path,
                                                                         fixed_host):
    bench = FakeBench()
    result = tune(FakeApp(), "cpu", TuneOptions(prune=2, profile_path=tmp_path / "p.json",
                                                log_path=tmp_path / "l.jsonl"),
                  benchmark=bench, events=PrintSink(open(tmp_path / "o", "w")))
    target = iron.targets.target_for(iron.device("cpu"))
    found = instances(FakeApp().programs(iron.device("cpu"), iron.Profile()))
    expected = set()
    for inst in found:
        cands = candidates(inst.op, "cpu")
        if len(cands) > 1:
            expected |= {op for op, _ in ranked(target, cands)[:2]} | {inst.current}
    assert set(bench.measured) == expected
    assert result.pruned == 2 and result.legal > len(expected)
    for o in result.outcomes:  # the sweep's winner is the fastest of what was measured
        kept = [op for op in bench.measured if type(op) is type(o.instance.op)
                and dataclasses.replace(op, **{n: None for n in op.tunables()}) == o.instance.op]
        assert o.best == min(kept, key=fake_time)
    text = (tmp_path / "o").read_text()
    assert "the cost model's 2 fastest" in text and "pruned by the cost model" in text


def record_tunes(monkeypatch) -> dict:
    """Let ``python -m iron.tuning`` run up to ``tune``: what it opened and passed, kept."""
    seen: dict = {}

    def tune(app, dev, options, benchmark=None):
        seen.update(dev=dev, options=options, benchmark=benchmark)

    monkeypatch.setattr(tuning_cli, "tune", tune)
    monkeypatch.setattr(tuning_cli, "open_app", lambda name, checkpoint, variables:
                        seen.update(app=name, variables=variables))
    return seen


def test_cli_prune_and_full(monkeypatch):
    seen = record_tunes(monkeypatch)
    assert tuning_cli.main(["demo"]) == 0 and seen["options"].prune == tuning_cli.DEFAULT_PRUNE
    assert tuning_cli.main(["demo", "--prune", "3"]) == 0 and seen["options"].prune == 3
    assert tuning_cli.main(["demo", "--full"]) == 0 and seen["options"].prune == 0
    with pytest.raises(SystemExit):
        tuning_cli.main(["demo", "--prune", "-1"])


def test_cli_ranks_a_device_it_cannot_run_by_the_model_and_passes_app_variables(monkeypatch):
    seen = record_tunes(monkeypatch)
    assert tuning_cli.main(["llama", "--var", "weights=bf16", "--device", "npu2"]) == 0
    assert seen["dev"] == "npu2" and seen["benchmark"] is None  # tune() picks the model
    assert seen["variables"] == {"weights": "bf16"}
    assert tuning_cli.main(["llama"]) == 0 and seen["benchmark"].source == "measured"
    assert seen["variables"] == {}


def test_cli_checks_app_variables_through_open_app(capsys):
    """The variables go through ``open_app``: an unknown one and a bad value are each one line
    naming it, before any application is opened; a ``--var`` that is not NAME=VALUE, or a
    name given twice, is refused."""
    assert tuning_cli.main(["demo", "--var", "weights=bf16"]) == 2
    assert "weights" in capsys.readouterr().err
    assert tuning_cli.main(["llama", "--var=weights=int3"]) == 2
    assert "variable weights='int3'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        tuning_cli.main(["demo", "--var", "hidden"])
    assert "--var 'hidden': an application variable is NAME=VALUE" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        tuning_cli.main(["demo", "--var", "hidden=1", "--var", "hidden=2"])
    assert "hidden: the variable is given twice" in capsys.readouterr().err


# ---- tuning by the model alone ----------------------------------------------------------------


@pytest.mark.parametrize("dev", ["npu1", "npu2"])
def test_a_device_that_cannot_run_is_tuned_by_its_model_and_says_so(tmp_path, dev):
    profile, log, out = tmp_path / "p.json", tmp_path / "l.jsonl", tmp_path / "out.txt"
    result = tune(FakeApp(), dev, TuneOptions(profile_path=profile, log_path=log),
                  events=PrintSink(open(out, "w")))
    assert result.source == "model" and result.complete
    records = [json.loads(line) for line in log.read_text().splitlines()]
    ok = [r for r in records if r["status"] == "ok"]
    assert ok and all(r["source"] == "model" and r["runs"] == 0 for r in ok)
    model = target_for(iron.device(dev)).cost  # the npu designs' own model
    for r in ok:  # each record names the bottleneck of its candidate's estimate
        op = iron.Operator.registry[r["operator"]](**r["fields"])
        assert r["bottleneck"] == model(op).bottleneck
    text = out.read_text()
    assert text.count("source: model") == 2  # when it starts, and in the report
    # nothing ran: no line may speak of a head-to-head, rounds, or a measured gain
    for word in ("head-to-head", "rounds", "measured this run", "whole model"):
        assert word not in text, word
    assert "modelled against the setting in use" in text
    saved = iron.Profile.load(profile)
    assert saved.device == dev and len(saved) > 0
    assert "Embedding" not in profile.read_text()  # placed on the host: not an npu entry
    for o in result.outcomes:  # the model's fastest, if the model has it MIN_GAIN faster
        best = min(candidates(o.instance.op, dev), key=lambda op: model(op).seconds)
        gain = model(o.instance.current).seconds / model(best).seconds
        assert o.chosen == (best if gain >= MIN_GAIN else o.instance.current)
    assert any(o.chosen != o.instance.current for o in result.outcomes)
    first = profile.read_bytes()
    profile.unlink()
    tune(FakeApp(), dev, TuneOptions(profile_path=profile, log_path=tmp_path / "again.jsonl"),
         events=PrintSink(open(out, "w")))
    assert profile.read_bytes() == first  # reproducible: same model, same bytes


def test_model_records_are_not_mixed_with_measurements(tmp_path):
    bench = ModelBenchmark(target_for(iron.device("npu1")), iron.device("npu1"))
    assert bench.source == "model" and "model" in bench.method
    with pytest.raises(DeviceError, match="cannot tune for npu1"):  # a measuring stand-in
        tune(FakeApp(), "npu1", TuneOptions(profile_path=tmp_path / "p.json",
                                            log_path=tmp_path / "l.jsonl"), benchmark=FakeBench())


def test_a_contended_calibration_never_rates_a_bigger_team_slower():
    """Best-of probes taken while another process held a core can rate two threads below one;
    a team can leave a thread idle, so each figure is raised to the best of fewer threads."""
    assert calibration._at_least_fewer([29e9, 21e9, 40e9]) == [29e9, 29e9, 40e9]


def test_every_operator_has_a_cost_hook_on_every_target_that_runs_it():
    """A family added without a hook is a failure here, not a constant estimate that would make
    --prune K measure the first K candidates in order; a hook may say "no estimate"."""
    from iron.operator import Operator

    on_cpu = [c for c in Operator.registry.values() if isinstance(getattr(c, "kernel", None), str)
              and (c.kernel_root / "cpu" / f"{c.kernel}.c").is_file()]
    assert len(on_cpu) > 10
    for cls in on_cpu:
        assert cpu_model.hook_for(cls) is not None, cls.__name__
    cpu_ops = list(every_tunable_case())
    for dev in ("npu1", "npu2"):  # every instance the npu runs (has a design for) is priced
        target = target_for(iron.device(dev))
        priced = 0
        for op in {unset(op) for op in cpu_ops}:
            for cand in candidates(op, dev):
                if target.placement(cand) == "npu":
                    assert target.cost(cand) is not None, (dev, cand)
                    priced += 1
        assert priced > 50, dev


def test_a_family_without_an_estimate_is_measured_in_full_when_pruning(tmp_path, fixed_host,
                                                                        monkeypatch):
    table = dict(cpu_model.hooks())
    table[GEMV] = cpu_model.no_estimate
    monkeypatch.setattr(cpu_model, "hooks", lambda: table)
    bench = FakeBench()
    out = tmp_path / "o"
    tune(FakeApp(), "cpu", TuneOptions(prune=1, profile_path=tmp_path / "p.json",
                                       log_path=tmp_path / "l.jsonl"),
         benchmark=bench, events=PrintSink(open(out, "w")))
    found = instances(FakeApp().programs(iron.device("cpu"), iron.Profile()))
    for inst in found:
        cands = candidates(inst.op, "cpu")
        measured = [op for op in bench.measured if unset(op) == inst.op]
        if isinstance(inst.op, GEMV):
            assert set(measured) == set(cands)  # all of them: the model cannot rank them
        elif len(cands) > 1:
            assert len(set(measured)) <= 2  # the model's fastest and the setting in use
    assert "instances without a cost estimate measured in full" in out.read_text()
