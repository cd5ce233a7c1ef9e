"""The tuner: enumeration, rejection, resume, --only, budget, determinism, refusal.

Most tests run a small fake application (AXPY, GEMV and Embedding steps, decode and prefill)
with a fake benchmark whose "times" are a fixed function of the setting, so runs are instant and
repeatable; one test compiles and runs real candidates through the cpu target.
"""

import itertools
import json
import subprocess
import sys
import time
import zlib

import numpy as np
import pytest

import iron
from iron.errors import CompileError, DeviceError, IronError
from iron.operator import Operator
from iron.operators import AXPY, GEMM, GEMV, Attention, Embedding, RMSNorm
from iron.profile import diff as profile_diff
from iron.resolution import legal, legal_settings, resolve
from iron.targets import cpu
from iron.tuning.check import mismatch
from iron.tuning.log import Comparison, TuneLog
from iron.tuning.candidates import candidates, instances
from iron.tuning.measure import Measurement, TargetBenchmark
from iron.tuning.events import PrintSink
from iron.tuning.tuner import IMPLAUSIBLE, MIN_GAIN, TuneOptions, tune
from tunetools import Chain, FakeApp, fake_time, FakeBench  # noqa: F401


def expected_choice(outcome):
    """The sweep's fastest if it beats the setting in use by MIN_GAIN, else the setting in use."""
    best, current = outcome.best, outcome.instance.current
    return best if fake_time(current) / fake_time(best) >= MIN_GAIN else current


def run(tmp_path, bench, app=None, runner=None, **options):
    """Tune ``app`` (default ``FakeApp``) with ``bench``; the events printed to out.txt."""
    return tune(app or FakeApp(), "cpu",
                TuneOptions(profile_path=tmp_path / "profiles" / "cpu.json",
                            log_path=tmp_path / "tune.jsonl", **options),
                benchmark=bench, runner=runner,
                events=PrintSink(open(tmp_path / "out.txt", "a")))


def tunable_count():
    found = instances(FakeApp().programs(iron.device("cpu"), iron.Profile()))
    return sum(len(c) for c in (candidates(i.op, "cpu") for i in found) if len(c) > 1)


def logged_keys(path):
    return {json.loads(line)["key"] for line in path.read_text().splitlines()
            if json.loads(line)["status"] in ("ok", "rejected")}


# ---- enumeration ------------------------------------------------------------------------------


@pytest.mark.parametrize("dev", ["cpu", "npu1", "npu2"])
def test_candidates_are_exactly_the_settings_the_rules_allow(dev):
    ops = [AXPY(size=2048, scalar_factor=1.0), GEMV(M=576, K=576), GEMM(M=32, K=576, N=96),
           RMSNorm(rows=8, size=576, weighted=True),
           Attention(rows=1, heads=9, kv_heads=3, head_dim=64, ctx=256)]
    for op in ops:
        device = iron.device(dev)
        space = op.space(device)
        names = op.tunables()
        allowed = []
        for values in itertools.product(*(space[n] for n in names)):
            cand = op.__class__(**{**op.config(), **dict(zip(names, values))})
            if legal(cand, device):
                allowed.append(cand)
        got = candidates(op, device)
        assert got == allowed and got, op.describe()
        assert [c.tunable_values() for c in got] == legal_settings(op, device)
        for c in got:
            assert resolve(c, device) == c  # resolve accepts every candidate as it is


def test_instances_are_deduplicated_and_single_setting_ones_skipped(tmp_path):
    found = instances(FakeApp().programs(iron.device("cpu"), iron.Profile()))
    names = sorted(i.describe() for i in found)
    assert names == sorted([
        "Embedding(vocab=10, dim=64, rows=1, weight_format='bf16', group_size=32)",
        "AXPY(size=64, scalar_factor=2.0)",
        "GEMV(M=16, K=64, batches=1, weight_format='bf16', group_size=32, "
        "output_dtype='bf16')",
        "AXPY(size=128, scalar_factor=2.0)",
        "GEMV(M=16, K=64, batches=2, weight_format='bf16', group_size=32, "
        "output_dtype='bf16')"])
    assert all(i.uses == 1 for i in found if not i.describe().startswith("Embedding"))
    assert [i.uses for i in found if i.describe().startswith("Embedding")] == [2]
    bench = FakeBench()
    result = run(tmp_path, bench)
    assert len(bench.measured) == tunable_count()
    assert f"{tunable_count()} candidates" in (tmp_path / "out.txt").read_text()
    assert not any(type(op) is Embedding for op in bench.measured)
    assert "Embedding" not in result.path.read_text()  # one legal setting: no entry


# ---- the chosen setting, the profile file -----------------------------------------------------


def test_fastest_valid_setting_wins_and_the_file_is_one_full_entry_per_instance(tmp_path):
    result = run(tmp_path, FakeBench())
    assert result.complete
    lines = result.path.read_text().splitlines()
    assert len(lines) == 2 + 4 and len(result.profile) == 4
    for o in result.outcomes:
        assert o.best == min(candidates(o.instance.op, "cpu"), key=fake_time)
        chosen = expected_choice(o)
        assert o.chosen == chosen
        entry = [e for e in result.profile.entries if e.operator == type(chosen).__name__
                 and dict(e.match) == {p: getattr(chosen, p) for p in chosen.params()}]
        assert len(entry) == 1 and dict(entry[0].sets) == chosen.tunable_values()
    # the application picks the tuned settings up
    again = instances(FakeApp().programs(iron.device("cpu"), iron.Profile.load(result.path)))
    chosen = {o.instance.op: o.chosen for o in result.outcomes}
    assert all(i.current == chosen[i.op] for i in again if i.op in chosen)


def test_moved_table_compares_against_the_previous_profile(tmp_path):
    bench = FakeBench()
    first = run(tmp_path, bench)
    changed = [o for o in first.outcomes if o.chosen != o.instance.current]
    assert changed  # the pseudo-times make some default slower than another setting
    assert [m.instance for m in first.moved] == [o.instance.describe() for o in changed]
    for m in first.moved:
        assert m.gain == pytest.approx(m.old_time / m.new_time) and m.gain >= MIN_GAIN
    assert "instances moved" in (tmp_path / "out.txt").read_text()
    # every winner that differs from the setting in use went head-to-head against it, once
    # (twice where the gain was implausible: beyond IMPLAUSIBLE it is measured again)
    expected = []
    for o in first.outcomes:
        if o.best != o.instance.current:
            gain = fake_time(o.instance.current) / fake_time(o.best)
            expected += [(o.best, o.instance.current)] * (1 if gain <= IMPLAUSIBLE else 2)
    assert bench.compared == expected
    second_bench = FakeBench()
    second = run(tmp_path, second_bench)
    assert second.moved == [] and second.measured_now == 0


def test_a_winner_moves_only_when_it_wins_the_head_to_head(tmp_path):
    """The sweep's medians can mislead; the alternating head-to-head has the last word."""
    small = run(tmp_path, FakeBench(head_to_head=lambda new, old: (1.0, 1.01, 1.02)))
    assert small.moved == [] and small.complete
    assert all(o.chosen == o.instance.current for o in small.outcomes)
    assert "kept their setting" in (tmp_path / "out.txt").read_text()
    erratic = run(tmp_path, FakeBench(head_to_head=lambda new, old: (0.9, 1.2, 1.5)), fresh=True)
    assert erratic.moved == []  # a big median gain, but slower in a quarter of the rounds
    # the verdict is logged: a re-run with another head-to-head result reuses it
    again = run(tmp_path, FakeBench(head_to_head=lambda new, old: (1.9, 2.0, 2.1)))
    assert again.moved == []
    fresh = run(tmp_path, FakeBench(head_to_head=lambda new, old: (1.9, 2.0, 2.1)), fresh=True)
    assert fresh.moved and all(o.chosen == o.best for o in fresh.outcomes)


def test_written_file_is_byte_identical_across_runs_from_the_same_log(tmp_path):
    run(tmp_path, FakeBench())
    path = tmp_path / "profiles" / "cpu.json"
    first = path.read_bytes()
    path.unlink()
    bench = FakeBench()
    run(tmp_path, bench)
    assert bench.measured == [] and path.read_bytes() == first
    run(tmp_path, FakeBench())  # previous profile = the tuned one
    assert path.read_bytes() == first
    other = tmp_path / "other"
    other.mkdir()
    run(other, FakeBench())  # a fresh log with the same timings
    assert (other / "profiles" / "cpu.json").read_bytes() == first


# ---- rejection -------------------------------------------------------------------------------


def test_rejected_candidate_is_logged_and_never_chosen_even_if_fastest(tmp_path):
    fastest = {}
    for i in instances(FakeApp().programs(iron.device("cpu"), iron.Profile())):
        c = candidates(i.op, "cpu")
        if len(c) > 1:
            fastest[i.op] = min(c, key=fake_time)
    result = run(tmp_path, FakeBench(wrong=lambda op: op in fastest.values()))
    for o in result.outcomes:
        assert o.best is not None and o.best != fastest[o.instance.op]
        assert o.chosen != fastest[o.instance.op]
        assert o.rejected == 1
    bad = {cpu.recipe_for(op).key for op in fastest.values()}
    for line in (tmp_path / "tune.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if rec["key"] in bad and rec["status"] != "started":
            assert rec["status"] == "rejected" and "deliberately corrupted" in rec["reason"]


class CorruptingBench(TargetBenchmark):
    """The real benchmark, but one setting's kernel output is corrupted after it runs."""

    def __init__(self, corrupt, **kw):
        super().__init__(min_time=0.005, min_runs=3, quiet=None, **kw)  # timings unused
        self.corrupt = corrupt
        self.current = None

    def measure(self, instance, op, best):
        self.current = op
        return super().measure(instance, op, best)

    def run_once(self, exe, arrays):
        outputs, seconds = super().run_once(exe, arrays)
        if self.current == self.corrupt:
            outputs[0][0] = outputs[0][0] + 1  # one element off by one
        return outputs, seconds


class OnlyAxpy(iron.Graph):
    def body(self, x, y):
        return AXPY.step(x, y, scalar_factor=0.5)


class AxpyApp(FakeApp):
    name = "axpy"

    def programs(self, device, profile):
        return {"decode": OnlyAxpy(device, profile).record((64,), (64,))}


class OnlyGemv(iron.Graph):
    def body(self, x):
        return GEMV.step(self.weight("w", (512, 1024)), x)


class GemvApp(FakeApp):
    name = "gemv"

    def programs(self, device, profile):
        return {"decode": OnlyGemv(device, profile).record((1024,))}


@pytest.mark.slow
def test_real_benchmark_rejects_wrong_results_and_compile_errors(tmp_path, monkeypatch):
    op = AXPY(size=64, scalar_factor=0.5)
    cands = candidates(op, "cpu")
    assert len(cands) >= 4
    wrong, broken = cands[-1], cands[-2]
    real_compile = cpu.TARGET.compile

    def compile_recipe(recipe, store=None):
        if recipe.key == cpu.TARGET.key(broken):
            raise CompileError(f"compiling {broken.describe(True)} failed: deliberately")
        return real_compile(recipe, store)

    monkeypatch.setattr(cpu.TARGET, "compile", compile_recipe)
    result = run(tmp_path, CorruptingBench(wrong), app=AxpyApp(), in_program=False)
    (o,) = result.outcomes
    assert o.measured == len(cands) and o.rejected == 2
    assert o.best not in (wrong, broken) and o.best in cands
    records = [json.loads(line) for line in (tmp_path / "tune.jsonl").read_text().splitlines()]
    rejected = {(tuple(r["fields"][n] for n in op.tunables()), r["reason"].split(":")[0])
                for r in records if r["status"] == "rejected"}
    assert rejected == {(tuple(wrong.tunable_values().values()), "wrong result"),
                        (tuple(broken.tunable_values().values()), "compile error")}
    assert all(r["median"] > 0 and r["runs"] >= 1 for r in records if r["status"] == "ok")


@pytest.mark.slow
def test_real_head_to_head_finds_a_setting_even_with_itself_and_a_slow_one_slower(tmp_path):
    """The real alternating comparison: no gain of a setting over itself; a gain over the
    slowest setting of a 1 MB GEMV's sweep (which setting is slow depends on the host: on one
    the single-threaded one, on another the two-threaded one)."""
    (inst,) = [i for i in instances(GemvApp().programs(iron.device("cpu"), iron.Profile()))]
    fast = inst.current
    # timings taken only on a quiet machine: the comparison waits for one (up to a minute)
    bench = TargetBenchmark(min_time=0.02, blocks=8, patience=60)
    try:
        even = bench.compare(inst, fast, fast)
        assert even.rounds == 8 and even.low <= even.gain <= even.high
        assert 0.8 < even.gain < 1.25  # same kernel, same inputs: a tie up to scheduling noise
        times = {op: bench.measure(inst, op, None).median for op in candidates(inst.op, "cpu")}
        best, worst = min(times, key=times.get), max(times, key=times.get)
        if times[worst] < 1.5 * times[best]:
            pytest.skip(f"host: no setting is clearly slower on this host: the sweep spans "
                        f"{times[worst] / times[best]:.2f}x")
        gain = bench.compare(inst, best, worst)
    except iron.IronError as e:
        pytest.skip(f"host: no quiet minute on this shared machine: {e}")
    assert gain.low <= gain.gain <= gain.high and gain.gain > 1.0, (gain, times)


def test_mismatch_reports_the_worst_element():
    ref = np.linspace(-1, 1, 16, dtype=np.float32)
    assert mismatch("AXPY", ref.astype(iron.bfloat16), ref) is None
    out = ref.copy()
    out[3] += 0.5
    message = mismatch("AXPY", out, ref)
    assert "1 of 16 elements off" in message and "(3,)" in message
    nan = ref.copy()
    nan[0] = np.nan
    assert "1 of 16" in mismatch("AXPY", nan, ref)


# ---- resume, budget, changed sources ------------------------------------------------------------


def test_interrupted_run_resumes_without_remeasuring_and_ends_with_the_same_profile(tmp_path):
    total = tunable_count()
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path, FakeBench(interrupt_after=20))
    assert not (tmp_path / "profiles" / "cpu.json").exists()  # nothing half-written
    logged = logged_keys(tmp_path / "tune.jsonl")
    assert len(logged) == 20
    bench = FakeBench()
    resumed = run(tmp_path, bench)
    assert len(bench.measured) == total - 20
    assert not {cpu.recipe_for(op).key for op in bench.measured} & logged
    uninterrupted = tmp_path / "clean"
    uninterrupted.mkdir()
    run(uninterrupted, FakeBench())
    assert resumed.path.read_bytes() == (uninterrupted / "profiles" / "cpu.json").read_bytes()


def test_a_kill_mid_write_and_a_candidate_that_crashes_twice(tmp_path):
    log = tmp_path / "tune.jsonl"
    log.write_text('{"key": "a", "status": "started"}\n{"key": "b", "status": "started"}\n'
                   '{"key": "b", "status": "started"}\n{"key": "c", "sta')
    with TuneLog(log, "m") as t:
        assert t.get("a") is None  # killed once: tried again
        assert not t.get("b").ok and "crashed or hung" in t.get("b").reason
        assert t.get("c") is None
        t.start("c")
    assert log.read_text().endswith('sta\n{"key": "c", "status": "started"}\n')


def test_budget_stops_midway_keeping_the_best_so_far_and_a_rerun_finishes(tmp_path):
    total = tunable_count()
    first = FakeBench(sleep=0.05)
    partial = run(tmp_path, first, budget=0.6)
    assert not partial.complete and 3 <= len(first.measured) < total
    assert partial.seconds < 1.5
    measured = {o.instance.op: o for o in partial.outcomes if o.best is not None}
    assert measured  # the first instance got its current setting and more measured
    for o in partial.outcomes:
        if o.best is None:  # never measured: keeps the default, no entry
            assert not any(e.operator == type(o.instance.op).__name__
                           and dict(e.match) == {p: getattr(o.instance.op, p)
                                                 for p in o.instance.op.params()}
                           for e in partial.profile.entries)
    bench = FakeBench()
    done = run(tmp_path, bench)
    assert done.complete and len(bench.measured) == total - len(first.measured)


def test_changed_kernel_source_remeasures_only_that_kernel(tmp_path, monkeypatch):
    run(tmp_path, FakeBench())
    sources = tmp_path / "kernels" / "cpu"
    sources.mkdir(parents=True)
    for f in cpu.SOURCE_DIR.iterdir():
        (sources / f.name).write_bytes(f.read_bytes())
    with open(sources / "gemv.c", "a") as f:
        f.write("/* edited */\n")
    monkeypatch.setattr(cpu, "SOURCE_DIR", sources)
    monkeypatch.setattr(Operator, "kernel_root", sources.parent)
    bench = FakeBench()
    run(tmp_path, bench)
    assert bench.measured and all(type(op) is GEMV for op in bench.measured)
    assert len(bench.measured) == 2 * len(candidates(GEMV(M=16, K=64), "cpu"))


def test_fresh_measures_everything_again(tmp_path):
    run(tmp_path, FakeBench())
    bench = FakeBench()
    run(tmp_path, bench, fresh=True)
    assert len(bench.measured) == tunable_count()


# ---- --only ---------------------------------------------------------------------------------


def test_only_tunes_the_named_operators_and_keeps_hand_written_entries(tmp_path):
    path = tmp_path / "profiles" / "cpu.json"
    hand = (iron.Profile(device="cpu")
            .add(GEMV, M=16, K=64, batches=1, tile_size_input=1, tile_size_output=4,
                 num_aie_columns=1)
            .add(GEMV, num_aie_columns=1))
    hand.save(path)
    bench = FakeBench()
    result = run(tmp_path, bench, only=("AXPY",))
    assert bench.measured and all(type(op) is AXPY for op in bench.measured)
    after = iron.Profile.load(path)
    assert set(hand.entries) <= set(after.entries)
    assert {e.operator for e in after.entries} == {"AXPY", "GEMV"} and len(after) == 4
    assert all(m.instance.startswith("AXPY") for m in result.moved)
    with pytest.raises(IronError, match="no such operator.*AXPY, Embedding, GEMV"):
        run(tmp_path, FakeBench(), only=("GEMM",))
    base = FakeBench()
    run(tmp_path, base, only=("Elementwise",))  # a base class name selects its subclasses
    assert base.measured == []  # already logged


# ---- devices, diff, CLI ----------------------------------------------------------------------


@pytest.mark.parametrize("dev", ["npu1", "npu2"])
def test_npu_devices_are_refused_not_faked(tmp_path, dev):
    with pytest.raises(DeviceError, match=f"cannot tune for {dev}.*running on {dev} itself needs"):
        tune(FakeApp(), dev, TuneOptions(profile_path=tmp_path / "p.json",
                                         log_path=tmp_path / "l.jsonl"), benchmark=FakeBench())
    assert not (tmp_path / "p.json").exists() and not (tmp_path / "l.jsonl").exists()


def test_profile_diff_names_moved_added_and_removed_entries(tmp_path, capsys):
    a = (iron.Profile(device="cpu").add(GEMV, M=16, K=64, tile_size_output=8)
         .add(AXPY, tile_size=16))
    b = (iron.Profile(device="cpu").add(GEMV, M=16, K=64, tile_size_output=16)
         .add(RMSNorm, rows=1, size=64, weighted=True, tile_size=1))
    a.save(tmp_path / "a.json")
    b.save(tmp_path / "b.json")
    text = [c.describe() for c in profile_diff.diff(a, b)]
    assert text == ["~ GEMV(M=16, K=64): tile_size_output 8 -> 16",
                    "+ RMSNorm(rows=1, size=64, weighted=True): tile_size=1",
                    "- AXPY (every instance): tile_size=16"]
    assert profile_diff.main(["diff", str(tmp_path / "a.json"), str(tmp_path / "b.json")]) == 1
    assert profile_diff.main(["diff", str(tmp_path / "a.json"), str(tmp_path / "a.json")]) == 0
    assert "set the same tunables" in capsys.readouterr().out


def test_cli_reports_an_unknown_application():
    done = subprocess.run([sys.executable, "-m", "iron.lm.tune", "nosuchapp"],
                          capture_output=True, text=True)
    assert done.returncode == 2 and "unknown application 'nosuchapp'" in done.stderr


class OnlyQ41Gemv(iron.Graph):
    def body(self, x):
        w = self.weight("w", (256, 640), np.uint8)  # 256 rows of K = 1024 in Q4_1 blocks
        return GEMV.step(w, x, weight_format="q4_1")


class Q41GemvApp(FakeApp):
    name = "gemv-q4_1"

    def programs(self, device, profile):
        return {"decode": OnlyQ41Gemv(device, profile).record((1024,))}


@pytest.mark.slow
def test_real_benchmark_checks_and_times_quantized_instances():
    """A quantized weight gets valid blocks (finite scales) as its random input, so every
    candidate is checked against the reference and timed, not rejected."""
    (inst,) = instances(Q41GemvApp().programs(iron.device("cpu"), iron.Profile()))
    assert (inst.op.weight_format, inst.op.K) == ("q4_1", 1024)
    bench = TargetBenchmark(min_time=0.01, blocks=2)
    cands = candidates(inst.op, "cpu")
    assert len(cands) > 4
    cpu.compile_all(cands[:3])
    for op in cands[:3]:
        m = bench.measure(inst, op, None)
        assert m.error is None and m.median > 0, m


# ---- host classes: which cpu profile a host picks ------------------------------------------


def test_a_host_class_names_the_kernel_paths_its_build_compiles_and_its_cores():
    from iron import host

    assert host.isa_class({"avx2", "fma", "sse4_2"}) == "avx2"  # Zen 3, or x86-64-v3 anywhere
    zen4 = {"avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16"}
    assert host.isa_class(zen4) == "avx2-avx512-vnni-bf16"
    assert host.isa_class(zen4 | {"amx_tile", "amx_bf16"}) == "avx2-avx512-vnni-bf16-amx"
    assert host.isa_class({"sse2"}) == "x86-64"
    # a named level's class does not depend on the host that builds it
    assert host.class_name(2, "x86-64-v3") == "avx2-2t"
    assert host.class_name(1, "x86-64-v4") == "avx2-avx512-1t"
    assert host.class_name(2, "sapphirerapids") == "avx2-avx512-vnni-bf16-amx-2t"


def test_every_isa_macro_the_kernels_branch_on_belongs_to_a_named_kernel_path():
    import re

    from iron import host
    from iron.paths import KERNELS_DIR

    named = {host.normalize(f) for _, needs in host.KERNEL_PATHS for f in needs}
    found = set()
    for path in (KERNELS_DIR / "cpu").glob("*.[ch]"):
        for line in path.read_text().splitlines():
            if re.match(r"\s*#\s*(el)?if", line):
                found |= set(re.findall(r"__([A-Z][A-Z0-9_]*)__", line)) - {"GNUC"}
    assert found, "the kernels branch on no ISA macro: this check reads the wrong files"
    missing = {m for m in found
               if host.normalize(host.CPUINFO_ALIASES.get(m, m)) not in named}
    assert not missing, f"kernel paths not in iron.host.KERNEL_PATHS: {sorted(missing)}"


def test_threads_and_march_select_their_own_cpu_profile(monkeypatch):
    from iron.pipeline.app import profile_path

    monkeypatch.setenv("IRON_MARCH", "x86-64-v3")
    monkeypatch.setenv("IRON_THREADS", "1")
    assert profile_path("llama", "cpu").name == "cpu-avx2-1t.json"
    assert profile_path("llama", "npu2").name == "npu2.json"
    monkeypatch.delenv("IRON_THREADS")
    assert profile_path("llama", "cpu", "avx2-avx512-vnni-bf16-2t").name == \
        "cpu-avx2-avx512-vnni-bf16-2t.json"


def test_a_profile_tuned_on_another_class_is_refused_and_a_missing_one_means_defaults(
        tmp_path, monkeypatch):
    from iron.errors import ProfileError
    from iron.pipeline import app as app_module

    monkeypatch.setattr(app_module, "profiles_dir", lambda: tmp_path)
    assert len(app_module.app_profile("demo", "cpu")) == 0  # no file: resolve() defaults
    path = app_module.profile_path("demo", "cpu")
    path.parent.mkdir(parents=True)
    iron.Profile(device="cpu", host={"class": "avx2-avx512-vnni-bf16-9t"}).add(
        AXPY, tile_size=64).save(path)
    with pytest.raises(ProfileError, match="tuned on host class 'avx2-avx512-vnni-bf16-9t'"):
        app_module.app_profile("demo", "cpu")


def test_committed_cpu_profiles_record_the_class_their_name_gives():
    from iron.paths import project_root

    files = sorted((project_root() / "profiles").glob("*/cpu-*.json"))
    assert files
    for path in files:
        profile = iron.Profile.load(path)
        assert profile.host["class"] == path.stem.partition("-")[2], path


# ---- in-program head-to-heads and the whole-model A/B ---------------------------------------


class FakeRunner:
    """Program times from ``fake_time`` summed over the steps, scaled by ``factor(program)``,
    with a small repeatable wobble per round; versions that run the same code share times."""

    def __init__(self, factor=lambda program: 1.0):
        self.target = cpu.TARGET
        self.factor, self.load, self.calls = factor, 0.0, []

    def evictors(self, name, programs, phases):
        return []  # fake times have no cache

    def rounds(self, versions, rounds=10, seconds=None, between=()):
        from iron.tuning.program import signature

        self.calls.append(sorted(versions))
        out = {}
        for label, program in versions.items():
            base = sum(fake_time(op) for op in program.ops) * self.factor(program)
            wobble = int(signature(program, self.target), 16) % 7
            out[label] = [base * (1 + 0.002 * ((r + wobble) % 3)) for r in range(rounds)]
        return out


def test_head_to_heads_run_in_the_program_and_the_report_ends_with_the_whole_model_lines(
        tmp_path):
    runner = FakeRunner()
    result = run(tmp_path, FakeBench(), runner=runner)
    assert result.verdict is not None and result.written
    text = (tmp_path / "out.txt").read_text().rstrip().splitlines()
    assert text[-1].startswith("  programs: ")
    assert any(line.startswith("whole model: ") for line in text[-8:])
    assert "against resolve() defaults" in "\n".join(text[-8:])
    compared = [line for line in text if "head-to-head in the" in line]
    assert compared and all("program" in line for line in compared)
    # every program whose new version runs faster than its default keeps its entries
    for name, kept in result.verdict.kept.items():
        t = result.verdict.times[name]
        faster = [d / n for d, n in zip(t["defaults"], t["new"])]
        assert (kept == "new") == (np.percentile(faster, 25) > 1.0), name
    # each program this tune changed gets its own line: its ratio, and whether it was written
    assert result.verdict.proposed
    for name, s in result.verdict.proposed.items():
        fate = "-> written" if result.verdict.kept[name] == "new" else "-> not written"
        line = next(x for x in text if x.startswith(f"  {name} ") and "this tune's" in x)
        assert f"{s.median:.3f}x" in line and line.endswith(fate), line


def test_a_program_the_new_entries_make_slower_gets_no_entries(tmp_path):
    """Each move won its own head-to-head, but together (the whole-model A/B, which times the
    programs in three versions) every program runs 10% slower than with the defaults."""
    class Together(FakeRunner):
        def rounds(self, versions, rounds=10, seconds=None, between=()):
            out = super().rounds(versions, rounds, seconds, between)
            if len(versions) == 3:  # the A/B: every program, new entries together
                out["new"] = [t * 1.1 * out["defaults"][0] / out["new"][0] for t in out["new"]]
            return out

    result = run(tmp_path, FakeBench(), runner=Together())
    times = result.verdict.times["decode"]
    assert any(o.chosen != o.instance.current for o in result.outcomes)  # moves were proposed
    assert result.verdict.kept["decode"] == "defaults"
    decode = FakeApp().programs(iron.device("cpu"), iron.Profile())["decode"]
    assert not [e for e in result.profile.entries if any(e.applies_to(s.op)
                                                        for s in decode.steps)]
    assert all(final == default for final, default in zip(times["final"], times["defaults"]))
    text = (tmp_path / "out.txt").read_text()
    assert "no entries (no measurable gain over the defaults) for decode" in text


def test_spread_says_beyond_only_when_three_rounds_of_four_are_ahead():
    from iron.tuning.whole import Spread, spread

    assert spread([1.1] * 8, [1.0] * 8).beyond()
    assert not Spread((1.2, 1.2, 0.9, 0.9, 1.2, 0.9, 1.2, 0.9)).beyond()
    assert Spread((1.0,) * 6).exact and not Spread((1.0,) * 6).beyond()
    assert "ahead in 3 of 4" in Spread((1.1, 1.2, 0.9, 1.05)).text()


@pytest.mark.slow
def test_real_program_head_to_head_of_a_setting_with_itself_is_exactly_even(tmp_path):
    from iron.tuning.program import InProgram, ProgramRunner, program_inputs

    dev = iron.device("cpu")
    app = FakeApp()
    programs = app.programs(dev, iron.Profile())
    runner = ProgramRunner(dev, dict(app.weights()), quiet=None)
    inst = next(i for i in instances(programs) if isinstance(i.op, GEMV))
    bench = InProgram(TargetBenchmark(quiet=None), runner, programs, rounds=6)
    same = bench.compare(inst, inst.current, inst.current)
    assert same.program == "decode" and same.gain == same.low == same.high == 1.0
    other = next(op for op in candidates(inst.op, dev) if op != inst.current)
    c = bench.compare(inst, other, inst.current)
    assert c.program == "decode" and c.rounds >= 6 and c.gain > 0 and c.against.endswith(
        bench.context(inst))
    tokens = program_inputs(programs["decode"], np.random.default_rng(0))[2]
    assert tokens.dtype == np.int32 and 0 <= tokens.min() and tokens.max() < 10


def test_near_misses_in_a_program_are_proposed_together_for_the_whole_model_to_judge():
    """A winner ahead in its program's head-to-head but within the spread is proposed (the
    whole-model A/B then decides); a clear loss, a kernel-alone comparison, an undecided one
    and an instance that already moved are left as they were."""
    from types import SimpleNamespace

    from iron.tuning.events import Collect, NearMissesProposed
    from iron.tuning.tuner import Outcome, propose_near_misses

    old, new = GEMV(M=64, K=64, tile_size_input=4, tile_size_output=16, num_aie_columns=1), \
        GEMV(M=64, K=64, tile_size_input=4, tile_size_output=32, num_aie_columns=1)
    inst = SimpleNamespace(current=old)

    def outcome(**kw):
        fields = dict(instance=inst, total=2, measured=2, rejected=0, best=new, best_time=1.0,
                      old_time=1.1, chosen=old, gain=1.02, program="decode")
        return Outcome(**{**fields, **kw})

    near = outcome()
    kept = [outcome(gain=0.98), outcome(program=""), outcome(decided=False),
            outcome(chosen=new, gain=1.2)]
    events = Collect()
    result = propose_near_misses([near, *kept], events)
    assert result[0].chosen == new and result[1:] == kept
    assert events.events == [NearMissesProposed(1)]
    assert "1 instances were ahead head-to-head within the spread" in events.events[0].text()


class LayersThenHead(iron.Graph):
    """A step's two programs: ``decode`` reads a 32 KiB weight, ``head`` an 8 KiB one."""

    def __init__(self, dev, profile, weight, rows):
        super().__init__(dev, profile)
        self.weight_name, self.rows = weight, rows

    def body(self, x):
        return GEMV.step(self.weight(self.weight_name, (self.rows, 64)), x)


def layers_then_head(cache):
    from iron.tuning.program import ProgramRunner

    dev = iron.device("cpu")
    programs = {name: LayersThenHead(dev, iron.Profile(), name, rows).record((64,))
                for name, rows in (("decode", 256), ("head", 64))}
    weights = {name: np.full((p.named("weight")[name].shape), 0.01, iron.bfloat16)
               for name, p in programs.items()}
    return programs, ProgramRunner(dev, weights, quiet=None, cache=cache)


def test_a_program_that_fits_the_cache_is_timed_after_what_evicts_it_in_the_model():
    """The head (8 KiB) fits a 16 KiB cache and the decode step's weights (40 KiB) do not: the
    model never finds the head's weights in the cache, so its rounds run decode first; decode
    (32 KiB) evicts itself; with a cache that holds both, or outside a phase, nothing runs
    between."""
    phases = {"decode": (("decode", "head"), 1)}
    programs, runner = layers_then_head(cache=16 << 10)
    assert runner.evictors("head", programs, phases) == ["decode"]
    assert runner.evictors("decode", programs, phases) == []
    assert runner.evictors("head", programs, None) == []
    assert runner.evictors("head", programs, {"head": (("head",), 1)}) == []
    programs, roomy = layers_then_head(cache=1 << 20)
    assert roomy.evictors("head", programs, phases) == []


def test_rounds_run_the_evictors_before_every_timed_run(monkeypatch):
    from iron.tuning.program import ProgramRunner

    programs, runner = layers_then_head(cache=16 << 10)
    names = {id(runner.executable(p)): n for n, p in programs.items()}
    ran = []
    timed = ProgramRunner.run_once

    def run_once(exe, inputs):
        ran.append(names[id(exe)])
        return timed(exe, inputs)

    monkeypatch.setattr(ProgramRunner, "run_once", staticmethod(run_once))
    times = runner.rounds({"a": programs["head"]}, rounds=2, seconds=None,
                          between=[programs["decode"]])
    assert len(times["a"]) == 2 and ran.count("head") > 2
    assert all(ran[i - 1] == "decode" for i, n in enumerate(ran) if n == "head")
