"""The doit build graph, run for real with the doit CLI in a temporary copy of the
project, on the small demo application so each build takes seconds."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from iron.targets.cpu.build import compiler
from iron.host import class_name
from conftest import copy_project
from buildtools import (ROOT, demo_error, doit, executed, compile_tasks, set_profile,  # noqa: F401
                        run_bundle, terminal_interrupt)

pytestmark = pytest.mark.slow  # end to end: bundles, servers, doit runs




def test_build_then_noop_then_profile_edit_then_revert(project):
    first = doit(project)
    assert len(executed(first)) == 5 and executed(first, "bundle") == ["bundle"]
    second = doit(project)
    assert executed(second) == [] and executed(second, "bundle") == []
    assert len(compile_tasks(second)) == 5

    set_profile(project, [{"operator": "GEMV", "M": 512, "K": 256, "tile_size_output": 32}])
    edited = doit(project)
    moved = executed(edited)
    assert len(moved) == 1 and moved[0].startswith("compile:GEMV-M512-K256-")
    assert executed(edited, "bundle") == ["bundle"]
    bundle = json.loads((project / "build/demo/cpu/profile.json").read_text())
    assert bundle["entries"][0]["tile_size_output"] == 32

    set_profile(project, [{"operator": "GEMV", "M": 512, "K": 256, "tile_size_output": 64,
                           "tile_size_input": 4, "num_aie_columns": 2}])
    reverted = doit(project)  # the same tunables as the defaults: the first build's artifacts
    assert executed(reverted) == []
    assert compile_tasks(reverted) == compile_tasks(second)


def test_kernel_source_edit_recompiles_that_operator_only(project):
    doit(project)
    silu = project / "iron/kernels/cpu/silu.c"
    silu.write_text(silu.read_text() + "\n/* edited */\n")
    result = doit(project)
    assert [t.split("-")[0] for t in executed(result)] == ["compile:SiLU"]
    assert executed(result, "bundle") == ["bundle"]


def test_invalid_profile_fails_the_build_and_keeps_the_previous_bundle(project):
    doit(project)
    manifest = (project / "build/demo/cpu/manifest.json").read_bytes()
    set_profile(project, [{"operator": "SiLU", "size": 512, "tile_size": 3}])
    result = doit(project, check=False)
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert "SiLU(size=512) on cpu: tile_size=3 (from profile entry" in output
    assert "size % (num_aie_columns * tile_size) == 0" in output
    assert (project / "build/demo/cpu/manifest.json").read_bytes() == manifest
    ok = run_bundle(project / "build/demo/cpu",
                    {**os.environ, "PYTHONPATH": str(project)})
    assert ok.returncode == 0, ok.stderr


def test_bundle_runs_elsewhere_without_a_compiler(project, tmp_path):
    doit(project)
    moved = tmp_path / "elsewhere" / "bundle"
    shutil.copytree(project / "build/demo/cpu", moved)
    env = {"PATH": str(tmp_path / "no-bin"), "PYTHONPATH": str(project), "HOME": str(tmp_path)}
    result = run_bundle(moved, env)
    assert result.returncode == 0, result.stderr
    assert demo_error(result.stdout) == 0


def test_parallel_build_makes_the_same_bundle(project, tmp_path):
    other = tmp_path / "other"
    shutil.copytree(project, other)
    doit(project, "-n", "1")
    doit(other, "-n", "2")
    a = json.loads((project / "build/demo/cpu/manifest.json").read_text())
    b = json.loads((other / "build/demo/cpu/manifest.json").read_text())
    assert a == b


def test_gc_removes_unreferenced_entries(project):
    doit(project)
    set_profile(project, [{"operator": "GEMV", "M": 512, "K": 256, "tile_size_output": 32}])
    doit(project)
    ops = project / "build/ops"
    before = set(os.listdir(ops))
    shutil.rmtree(project / "build/demo/cpu")  # the only bundle gone: only current keys stay
    result = doit(project, "gc")
    assert "gc: removed 1 cache entries" in result.stdout
    assert len(set(os.listdir(ops))) == len(before) - 1


def test_doit_tune_takes_the_tuner_options_and_a_rebuild_follows_the_profile(project):
    """`doit tune only=... budget=...` runs the real tuner on the demo app; `doit` then
    recompiles only instances of the tuned operators; a re-run measures nothing again."""
    doit(project)
    # max_load: the timings are not what this checks, so a busy shared machine may take them
    tuned = doit(project, "tune", "only=AXPY,SiLU", "budget=300", "max_load=99")
    assert "tuning demo on cpu: 2 instances" in tuned.stdout, tuned.stdout
    assert "tuning complete" in tuned.stdout
    assert "whole model:" in tuned.stdout, tuned.stdout  # the report ends with the A/B lines
    profile = json.loads((project / "profiles" / "demo" / f"cpu-{class_name()}.json").read_text())
    # an entry is written only where its program gained beyond the spread of the A/B rounds,
    # so on a given machine either tuned operator may or may not have one
    assert {e["operator"] for e in profile["entries"]} <= {"AXPY", "SiLU"}
    rebuilt = executed(doit(project))
    assert all(t.startswith(("compile:AXPY", "compile:SiLU")) for t in rebuilt), rebuilt
    again = doit(project, "tune", "only=AXPY", "max_load=99")
    assert "0 candidates measured this run" in again.stdout, again.stdout


def test_doit_tune_on_an_npu_ranks_by_the_cost_model_and_the_npu_build_uses_it(project):
    """`doit tune device=npu2` writes the demo's npu2 profile from the npu cost model (the
    device cannot run here), and `doit device=npu2` builds with that profile."""
    tuned = doit(project, "tune", "device=npu2")
    assert tuned.stdout.count("source: model") == 2 and "tuning complete" in tuned.stdout
    written = project / "profiles" / "demo" / "npu2.json"
    assert len(json.loads(written.read_text())["entries"]) == 4  # GEMV x2, AXPY, SiLU
    doit(project, "device=npu2")
    assert (project / "build/demo/npu2/profile.json").read_bytes() == written.read_bytes()
    assert "nothing moved" in doit(project, "tune", "device=npu2").stdout  # stable


def test_npu_build_writes_designs_and_no_cpu_library(project):
    """`doit device=npu2`: one design (or a host placement) per instance in the store, no
    shared library for an instance; the bundle runs in the emulator and refuses to run on
    the NPU without XRT."""
    result = doit(project, "device=npu2")
    tasks = executed(result)
    assert len(tasks) == 5 and executed(result, "bundle") == ["bundle"]
    bundle = project / "build/demo/npu2"
    manifest = json.loads((bundle / "manifest.json").read_text())
    block = manifest["programs"]["block"]
    assert block["placements"] == ["npu"] * 5
    for name in block["kernels"]:
        step = json.loads((bundle / name).read_text())
        assert step["placement"] == "npu" and step["mlir"].startswith("module {")
        assert step["design"]["device"] == "npu2" and step["design"]["fifos"]
    assert sorted(p.suffix for p in (bundle / "kernels").iterdir()) == [".json"] * 5 + [".so"]
    assert manifest["runtime"].endswith(".so")  # the core kernels' host build
    entries = [p for p in (project / "build/ops").iterdir() if (p / "design.mlir").exists()]
    assert len(entries) == 5 and all((p / "design.generic.mlir").exists() for p in entries)
    assert not list((project / "build/ops").rglob("kernel.so"))
    env = {**os.environ, "PYTHONPATH": str(project)}
    emulated = subprocess.run([sys.executable, "-m", "apps.demo", str(bundle), "--emulate"],
                              capture_output=True, text=True, env=env, timeout=120)
    assert emulated.returncode == 0, emulated.stderr
    # the npu kernels sum in another order than the reference: at most one bf16 ulp of the
    # block's outputs, which stay below 4 in magnitude (the cpu build's error is exactly 0)
    assert demo_error(emulated.stdout) <= 2.0 ** -6
    refused = run_bundle(bundle, env)
    assert refused.returncode == 2
    assert refused.stderr.startswith("error: ") and refused.stderr.count("\n") == 1
    assert "running on npu2 itself needs" in refused.stderr and "--emulate" in refused.stderr


def test_unknown_device_is_one_line(project):
    result = doit(project, "device=npu9", check=False)
    assert result.returncode != 0
    assert "device='npu9': must be one of cpu, npu1, npu2" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr


def test_npu_profile_entry_overflowing_l1_stops_before_any_compile(project):
    (project / "profiles" / "demo" / "npu2.json").write_text(
        '{"device": "npu2", "entries": [\n  {"operator": "GEMV", "M": 512, "K": 256, '
        '"tile_size_input": 64, "tile_size_output": 64, "num_aie_columns": 1}\n]}\n')
    result = doit(project, "device=npu2", check=False)
    assert result.returncode != 0 and executed(result) == []
    said = result.stdout + result.stderr  # doit reports a failed task on stdout
    assert "Traceback" not in said
    assert "npu2.json line 2" in said
    assert ("L1 of core tile (0, 2): A_0 2 x 32768 B + x_0 1 x 512 B + y_0 2 x 128 B + stack "
            "1024 B = 67328 B (65.75 KiB) <= 65536 B (64 KiB) of data memory on npu2"
            ) in said
    assert not (project / "build" / "ops").exists() or not list(
        (project / "build" / "ops").iterdir())


def test_npu_build_after_a_tune_in_the_readme_order_and_after_losing_a_cache_entry(project):
    """`doit tune device=npu2`, `doit device=npu2`, then another selection, in that order, and
    again once a cache entry is gone: the builds that reuse the programs recorded
    by an earlier process (under build/.programs/) compile npu instances too."""
    doit(project, "tune", "device=npu2")
    doit(project, "tune", "device=npu2")  # the profile is now stable: its record is reused
    doit(project, "device=npu2")
    doit(project, "device=npu2", "hidden=256")  # another selection (llama: weights=bf16)
    # an entry the device=npu2 bundle holds (its step files are named by their entries' keys),
    # not one only the other selection uses
    manifest = json.loads((project / "build/demo/npu2/manifest.json").read_text())
    used = sorted(Path(f).stem for p in manifest["programs"].values() for f in p["kernels"])
    lost = next(project / "build/ops" / key for key in used
                if (project / "build/ops" / key / "design.mlir").exists())
    shutil.rmtree(lost)
    rebuilt = doit(project, "device=npu2")
    assert len(executed(rebuilt)) == 1 and (lost / "design.mlir").exists()


def test_doit_is_quiet_and_lists_every_variable_with_its_default(project):
    """Without verbose=1 a build says what it built in one line (two with the progress line),
    a no-op in one; `doit list` and `doit help TASK` show each variable with its default, the
    application's own included; the run command's flags only when the application declares
    them (the demo's command takes none)."""
    first = doit(project, verbose=False)
    lines = first.stdout.splitlines()
    assert len(lines) == 2 and lines[0].startswith("building ") and \
        lines[1].startswith(f"built {project}/build/demo/cpu: compiled 5 instances"), lines
    assert doit(project, verbose=False).stdout.splitlines() == [
        f"{project}/build/demo/cpu is up to date (5 instances)"]
    listed = doit(project, "list", verbose=False).stdout
    bundle = next(line for line in listed.splitlines() if line.startswith("bundle "))
    assert "app=demo device=($IRON_DEVICE or cpu)" in bundle and "hidden=512" in bundle
    generate = next(line for line in listed.splitlines() if line.startswith("generate "))
    assert "prompt=(the bundle's)" in generate and "max_new_tokens" not in generate
    helped = doit(project, "help", "bundle", verbose=False).stdout
    assert "march=($IRON_MARCH or native)" in helped and "hidden=512" in helped


def test_application_variables_are_checked_and_name_the_bundle(project):
    """apps/demo declares `hidden`: a bad value is one line naming it, a good one builds
    build/demo/cpu-h256 with that width; the pipeline names no application."""
    bad = doit(project, "hidden=0", check=False)
    assert bad.returncode != 0 and "hidden='0': must be an integer from 1 to 4096" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
    doit(project, "hidden=256")
    manifest = json.loads((project / "build/demo/cpu-h256/manifest.json").read_text())
    assert manifest["build"]["variables"] == {"hidden": "256"}
    first = manifest["programs"]["block"]["steps"][0]
    assert first["operator"] == "GEMV" and first["fields"]["M"] == 256  # up: (hidden, 256)
    for source in (ROOT / "iron" / "pipeline").glob("*.py"):
        assert "llama" not in source.read_text().lower(), source


def test_ctrl_c_during_a_build_is_one_line_and_keeps_the_previous_bundle(project):
    import signal
    import time

    doit(project)
    bundle = project / "build/demo/cpu"
    before = (bundle / "manifest.json").read_bytes()
    set_profile(project, [{"operator": "GEMV", "M": 512, "K": 256, "tile_size_output": 32}])
    # the build's own compiler, made to take a second, so that the build is still compiling
    # when the signal comes, however fast the host (a small kernel compiles in under 0.2 s on
    # some)
    slow_cc = project / "slow-cc"
    slow_cc.write_text(f"#!/bin/sh\nsleep 1\nexec {compiler()[0]} \"$@\"\n")
    slow_cc.chmod(0o755)
    env = {**os.environ, "PYTHONPATH": str(project), "CC": str(slow_cc)}
    process = subprocess.Popen([sys.executable, "-m", "doit", "app=demo"], cwd=project, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               preexec_fn=terminal_interrupt)
    assert process.stdout.readline().startswith("building ")  # a compile has started
    time.sleep(0.5)
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 130, (out, err)
    assert err.strip().splitlines() == ["interrupted: the previous bundle and every finished "
                                        "compile are kept; the same command resumes"], err
    assert (bundle / "manifest.json").read_bytes() == before
    resumed = doit(project)
    assert executed(resumed, "bundle") == ["bundle"]
