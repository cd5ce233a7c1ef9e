"""The npu target: designs checked against the devices' resources, emulated against the
reference over every legal setting, rendered as MLIR-AIE and parsed by upstream MLIR."""

import dataclasses
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import iron
from iron.operators import AXPY, GEMM, RMSNorm
from iron.resolution import legal_settings, resolve
from iron.store import USED, Store
from iron.targets import npu, target_for
from iron.targets.npu.design import Pattern, design_from_json
from iron.targets.npu.emulator import EmulationError, emulate_design
from iron.targets.npu.mlir import render
from opcases import OneStep, assert_close, case_inputs

#: Every designed operator at small shapes; each is emulated at every legal setting.
SMALL = [
    ("AXPY", {"shape": (1024,)}), ("ElementwiseAdd", {"shape": (512,)}),
    ("ElementwiseMul", {"shape": (2, 256)}), ("SiLU", {"shape": (512,)}),
    ("SwiGLU", {"rows": 2, "size": 256}),
    ("RMSNorm", {"rows": 8, "size": 64, "weighted": True}),
    ("RMSNorm", {"rows": 4, "size": 96, "weighted": False}),
    ("Softmax", {"rows": 8, "size": 64}),
    ("GEMV", {"M": 64, "K": 32, "batches": 1}), ("GEMV", {"M": 32, "K": 48, "batches": 3}),
    ("GEMM", {"M": 32, "K": 64, "N": 64}),
]
DEVICES = ("npu1", "npu2")
MLIR_OPT = shutil.which("mlir-opt-22")


def sweep(dev, name, shape):
    """(graph, inputs, reference) per legal setting of one case on one device."""
    rng = np.random.default_rng(len(name) + sum(map(ord, dev)))
    cls, fields, inputs = case_inputs(name, shape, rng)
    op = OneStep(cls, fields, dev).record_like(inputs).ops[0]
    settings = legal_settings(op, dev)
    ref = OneStep(cls, fields, dev).reference(*inputs)
    return cls, fields, inputs, settings, ref


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("name,shape", SMALL, ids=[f"{n}-{i}" for i, (n, _) in enumerate(SMALL)])
def test_emulation_matches_the_reference_at_every_legal_setting(dev, name, shape):
    cls, fields, inputs, settings, ref = sweep(dev, name, shape)
    assert len(settings) >= 2, f"{name} on {dev}: only {settings} legal"
    for setting in settings:
        out = OneStep(cls, {**fields, **setting}, dev).emulate(*inputs)
        assert_close(name, out, ref)


@pytest.fixture(scope="module")
def designs():
    """The design of every setting the emulation sweep runs."""
    found = []
    for dev in DEVICES:
        for name, shape in SMALL:
            cls, fields, inputs = case_inputs(name, shape, np.random.default_rng(0))
            op = OneStep(cls, fields, dev).record_like(inputs).ops[0]
            for setting in legal_settings(op, dev):
                found.append(npu.design_of(dataclasses.replace(op, **setting), dev))
    return found


def test_host_placed_steps_run_their_numpy_maths_between_npu_steps():
    rng = np.random.default_rng(1)
    cls, fields, inputs = case_inputs("Embedding", {"vocab": 50, "dim": 64, "rows": 4}, rng)
    graph = OneStep(cls, fields, "npu2")
    assert npu.design_of(graph.record_like(inputs).ops[0], "npu2") is None
    out = graph.emulate(*inputs)
    assert np.array_equal(out.view(np.uint16), graph.reference(*inputs).view(np.uint16))


def host_cores(store=None) -> str:
    """The core kernels' host build (the npu target's executor artifact)."""
    target = target_for(iron.device("npu2"))
    return str(target.artifact(target.compile(target.recipe(None), store)))


def design_of(op, dev="npu2"):
    return npu.design_of(resolve(op, dev), dev)


def flat_inputs(design, rng):
    return [(rng.standard_normal(a.numel)).astype(iron.bfloat16) for a in design.args]


def test_a_core_loop_one_too_long_is_a_deadlock_naming_the_waiting_actors():
    d = design_of(AXPY(size=1024, scalar_factor=2.0, tile_size=256, num_aie_columns=1))
    core = d.cores[0]
    loop = core.body[0]
    longer = dataclasses.replace(core, body=(dataclasses.replace(loop, count=loop.count + 1),))
    bad = dataclasses.replace(d, cores=(longer,))
    lib = host_cores()
    args = flat_inputs(bad, np.random.default_rng(0))
    emulate_design(d, args, lib)  # the design as drawn runs
    with pytest.raises(EmulationError, match=r"deadlock in AXPY.*core tile \(0, 2\) waits to "
                       r"acquire in0_0_0 \(empty\)"):
        emulate_design(bad, args, lib)


def test_a_transfer_outside_its_tensor_is_refused_before_anything_runs():
    d = design_of(AXPY(size=1024, scalar_factor=2.0, tile_size=256, num_aie_columns=2))
    phase = list(d.sequence[0])
    t = phase[0]
    phase[0] = dataclasses.replace(t, pattern=Pattern(t.pattern.offset + 600, t.pattern.sizes,
                                                      t.pattern.strides))
    bad = dataclasses.replace(d, sequence=(tuple(phase),))
    lib = host_cores()
    with pytest.raises(EmulationError, match=r"transfer in of in0 via in0_0_0 \(offset 600, "
                       r"sizes \[1, 1, 1, 512\].*reaches elements 600..1111, outside its 1024"):
        emulate_design(bad, flat_inputs(bad, np.random.default_rng(0)), lib)


def test_a_profile_entry_overflowing_l1_is_refused_with_the_figures():
    """Upstream IRON's hole: a GEMM tile whose float32 accumulator alone is 64 KiB."""

    class Mm(iron.Graph):
        def body(self, a, b):
            return GEMM.step(a, b)

    profile = iron.Profile(device="npu1")
    profile.add(GEMM, M=256, K=256, N=256, tile_m=64, tile_k=32, tile_n=256, num_aie_columns=1)
    graph = Mm("npu1", profile)
    with pytest.raises(iron.ResolveError) as e:
        graph.record(a=(256, 256), b=(256, 256))
    message = str(e.value)
    assert "(from profile entry" in message and "tile_m=64" in message
    assert ("L1 of core tile (0, 2): A_0_0 2 x 4096 B + B_0_cores 2 x 16384 B + C_0_0 2 x "
            "32768 B + acc_0_0 65536 B + stack 1024 B = 173056 B (169 KiB) <= 65536 B "
            "(64 KiB) of data memory on npu1") in message


def test_gemm_tiles_follow_each_devices_mac_shape():
    op = GEMM(M=64, K=64, N=64, tile_m=4, tile_k=32, tile_n=16, num_aie_columns=1)
    assert resolve(op, "npu1")  # 4x8x4
    with pytest.raises(iron.ResolveError, match=r"tile_m % 8 == 0, tile_k % 8 == 0, "
                       r"tile_n % 8 == 0 \(the 8x8x8 bf16 MAC of npu2\)"):
        resolve(op, "npu2")


def test_long_transfers_fit_the_dma_limits_or_are_refused():
    """An odd row cannot be moved in whole 32-bit words; long tensors fold into 4 dims."""
    with pytest.raises(iron.ResolveError, match="whole 4-byte words"):
        resolve(RMSNorm(rows=1, size=63, weighted=False, tile_size=1, num_aie_columns=1), "npu1")
    d = design_of(AXPY(size=1 << 22, scalar_factor=1.0, tile_size=1024, num_aie_columns=1))
    sizes = d.sequence[0][0].pattern.sizes
    assert len(sizes) == 4 and max(sizes) <= 2046 and np.prod(sizes) == 1 << 22


# ---- MLIR ------------------------------------------------------------------------------------


def test_custom_and_generic_forms_hold_the_same_design():
    d = design_of(GEMM(M=32, K=64, N=64, tile_m=8, tile_k=32, tile_n=16, num_aie_columns=2))
    custom, generic = render(d), render(d, generic=True)
    assert design_from_json(d.to_json()) == dataclasses.replace(d, memory_fields=())
    assert custom.startswith("module {\n  aie.device(npu2) {")
    for op in ("aie.tile", "aie.objectfifo", "aie.objectfifo.link", "aie.core",
               "aie.objectfifo.acquire", "aie.objectfifo.release", "func.call",
               "aiex.npu.dma_memcpy_nd", "aiex.npu.dma_wait", "scf.for"):
        assert custom.count(f"{op} ") + custom.count(f"{op}(") == generic.count(f'"{op}"'), op
    assert ("aie.objectfifo.link [@A_0] -> [@A_0_0, @A_0_1, @A_0_2, @A_0_3] ([] [0, 256, 512, "
            "768])") in custom


def mlir_opt(text: str, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([MLIR_OPT, "--allow-unregistered-dialect", "--split-input-file",
                           *flags, "-o", os.devnull], input=text, capture_output=True, text=True,
                          timeout=300)


def verifiable(generic: str) -> str:
    """The generic form with its kernel calls as unregistered ops: MLIR looks a call's callee
    up in the nearest symbol table, and an unregistered ``aie.core`` may be one, so a
    ``func.call`` inside it cannot resolve; everything else (arith, scf, operand counts and
    types, dominance) is verified in full."""
    return generic.replace('"func.call"(', '"iron.kernel_call"(')


needs_mlir_opt = pytest.mark.skipif(
    MLIR_OPT is None, reason="mlir-opt-22 not found: install Debian's mlir-22-tools "
    "(apt-get install mlir-22-tools); .ci/run does")


@needs_mlir_opt
def test_every_emulated_design_parses_with_upstream_mlir(designs):
    text = "\n// -----\n".join(render(d, generic=True) for d in designs)
    syntax = mlir_opt(text, "--mlir-very-unsafe-disable-verifier-on-parsing",
                      "--verify-each=false")
    assert syntax.returncode == 0, syntax.stderr[:2000]
    full = mlir_opt(verifiable(text))
    assert full.returncode == 0, full.stderr[:2000]


@needs_mlir_opt
def test_the_mlir_check_catches_a_broken_module():
    d = design_of(AXPY(size=1024, scalar_factor=2.0, tile_size=256, num_aie_columns=1))
    text = verifiable(render(d, generic=True))
    first_const = next(line for line in text.splitlines() if '"arith.constant"' in line)
    broken = text.replace(first_const, "")  # its value is still used: undefined
    result = mlir_opt(broken)
    assert result.returncode != 0 and "use of undeclared SSA value" in result.stderr


# ---- compile artifacts and the aiecc path --------------------------------------------------


def test_compile_writes_design_artifacts_and_no_cpu_library(tmp_path):
    store = Store(tmp_path / "ops")
    dev = iron.device("npu1")
    target = target_for(dev)
    op = resolve(RMSNorm(rows=8, size=64, weighted=True, eps=1e-5), dev)
    entry = target.compile(target.recipe(op), store)
    names = sorted(p.name for p in entry.path.iterdir() if p.name != USED)
    assert names == ["design.generic.mlir", "design.json", "design.mlir", "kernels",
                     "manifest.json", "step.json"]
    assert sorted(p.name for p in (entry.path / "kernels").iterdir()) == ["iron_npu.h",
                                                                          "norm.c"]
    host_op = iron.operators.Embedding(vocab=10, dim=4, rows=2, num_aie_columns=1)
    assert target.placement(host_op) == "host" and target.placement(op) == "npu"
    host = target.compile(target.recipe(host_op), store)
    assert sorted(p.name for p in host.path.iterdir() if p.name != USED) == ["manifest.json",
                                                                             "step.json"]
    assert not [p for p in (tmp_path / "ops").rglob("*.so")]


STAND_IN_AIECC = """#!{python}
import pathlib, sys
pathlib.Path("aiecc-args.txt").write_text("\\n".join(sys.argv[1:]))
pathlib.Path("final.xclbin").write_bytes(b"xclbin")
pathlib.Path("insts.bin").write_bytes(b"insts")
"""
STAND_IN_CLANG = """#!{python}
import pathlib, sys
pathlib.Path("clang-args.txt").write_text("\\n".join(sys.argv[1:]))
pathlib.Path(sys.argv[sys.argv.index("-o") + 1]).write_bytes(b"elf")
"""


def test_aiecc_runs_where_it_is_on_path_with_the_documented_arguments(tmp_path, monkeypatch):
    bin_dir, peano = tmp_path / "bin", tmp_path / "peano"
    (peano / "bin").mkdir(parents=True)
    bin_dir.mkdir()
    for path, text in ((bin_dir / "aiecc.py", STAND_IN_AIECC),
                       (peano / "bin" / "clang", STAND_IN_CLANG)):
        path.write_text(text.format(python=sys.executable))
        path.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("PEANO_INSTALL_DIR", str(peano))
    store = Store(tmp_path / "ops")
    dev = iron.device("npu2")
    target = target_for(dev)
    op = resolve(AXPY(size=2048, scalar_factor=1.5), dev)
    recipe = target.recipe(op)
    assert recipe.description["aiecc"] == str((bin_dir / "aiecc.py").resolve())
    entry = target.compile(recipe, store)
    for name in ("final.xclbin", "insts.bin", "eltwise.o", "design.mlir", "design.json"):
        assert (entry.path / name).is_file(), name
    assert (entry.path / "aiecc-args.txt").read_text().split("\n") == [
        "--no-xchesscc", "--no-xbridge", "--peano", str(peano), "--aie-generate-xclbin",
        "--xclbin-name=final.xclbin", "--aie-generate-npu-insts", "--npu-insts-name=insts.bin",
        "--no-compile-host", "design.mlir"]
    assert "--target=aie2p-none-unknown-elf" in (entry.path / "clang-args.txt").read_text()
