"""The npu target: designs checked against the devices' resources, emulated against the
reference over every legal setting (two dispatches each, on different data), rendered as
MLIR-AIE and verified against the transcription of mlir-aie's op definitions."""

import dataclasses
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import pytest

import iron
from iron.operators import AXPY, GEMM, GEMV, ElementwiseAdd, RMSNorm
from iron.resolution import legal_settings, resolve
from iron.store import USED, Store
from iron.targets import npu, target_for
from iron.targets.npu.bds import allocate
from iron.targets.npu.check import design_rules, pattern_rules
from iron.targets.npu.ir import Call, Loop, Pattern, Transfer, design_from_json, walk_ops
from iron.targets.npu.emulator import Emulation, EmulationError, emulate_design
from iron.targets.npu.mlir import FOREVER, render
from iron.targets.npu.resources import resources
from iron.targets.npu.verify import Problem, check_text
from opcases import OneStep, assert_close, case_inputs, tolerance_on
from opcases import SMALL  # noqa: F401

#: Every designed operator at small shapes; each is emulated at every legal setting.
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
    """Each setting's design is loaded once and dispatched twice in a row on different data,
    as a decode step dispatches the same configuration again: its cores keep looping."""
    cls, fields, inputs, settings, ref = sweep(dev, name, shape)
    again = case_inputs(name, shape, np.random.default_rng(99))[2]
    assert len(settings) >= 2, f"{name} on {dev}: only {settings} legal"
    for setting in settings:
        graph = OneStep(cls, {**fields, **setting}, dev)
        exe = target_for(graph.device).emulated().load(graph.record_like(inputs))
        for xs, expected in ((inputs, ref), (again, graph.reference(*again))):
            assert_close(name, exe.run(xs)[0], expected, tolerance_on(name, dev))


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


def with_loop_count(d, delta):
    core = d.cores[0]
    *first, loop = core.body  # the loop's first iteration written out, then the loop
    return dataclasses.replace(d, cores=(dataclasses.replace(
        core, body=(*first, dataclasses.replace(loop, count=loop.count + delta))),))


def test_a_core_loop_one_too_long_only_works_once_and_is_refused():
    """One iteration too many per dispatch: the first dispatch's outputs are complete, but the
    core has started on the next one's first input, so the second would come out shifted."""
    d = design_of(AXPY(size=1024, scalar_factor=2.0, tile_size=256, num_aie_columns=1))
    lib = host_cores()
    args = flat_inputs(d, np.random.default_rng(0))
    loaded = Emulation(d, lib)
    for _ in range(3):
        loaded.dispatch(args)  # the design as drawn runs again and again
    with pytest.raises(EmulationError, match=r"after dispatch 1 core tile \(0, 2\) has taken 4 "
                       r"elements of in0_0_0, its program 5 per dispatch .*only works once"):
        emulate_design(with_loop_count(d, +1), args, lib)


def test_a_core_loop_one_too_short_only_works_once_too():
    d = design_of(AXPY(size=1024, scalar_factor=2.0, tile_size=256, num_aie_columns=1))
    with pytest.raises(EmulationError, match=r"has taken 4 elements of in0_0_0, its program 3"):
        emulate_design(with_loop_count(d, -1), flat_inputs(d, np.random.default_rng(0)),
                       host_cores())


def test_an_input_never_sent_is_a_deadlock_naming_the_waiting_actors():
    d = design_of(AXPY(size=1024, scalar_factor=2.0, tile_size=256, num_aie_columns=1))
    t_in0, _, t_out = d.sequence[0]
    bad = dataclasses.replace(d, sequence=((t_in0, t_out),))
    with pytest.raises(EmulationError, match=r"deadlock in AXPY.*core tile \(0, 2\) waits to "
                       r"acquire in1_0_0 \(empty\);.* shim tile \(0, 0\) out out_0_0 waits "
                       r"to drain out_0_0 \(empty\)"):
        emulate_design(bad, flat_inputs(d, np.random.default_rng(0)), host_cores())


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


def with_call_arg(d, index, value):
    """``d`` with argument ``index`` of every kernel call replaced."""
    def patch(body):
        out = []
        for op in body:
            if isinstance(op, Loop):
                op = dataclasses.replace(op, body=patch(op.body))
            elif isinstance(op, Call):
                args = list(op.args)
                args[index] = value(args[index])
                op = dataclasses.replace(op, args=tuple(args))
            out.append(op)
        return tuple(out)

    return dataclasses.replace(d, cores=tuple(dataclasses.replace(c, body=patch(c.body))
                                              for c in d.cores))


def test_a_kernel_told_257_elements_of_a_256_element_buffer_is_caught():
    """The vector loads and stores check the buffers a call was given: the 17th vector of a
    256-element tile reads past every one of them."""
    d = design_of(ElementwiseAdd(size=1024, tile_size=256, num_aie_columns=1, num_channels=1))
    lib = host_cores()
    emulate_design(d, flat_inputs(d, np.random.default_rng(0)), lib)
    with pytest.raises(EmulationError, match=r"kernel add_bf16 on core tile \(0, 2\) accessed "
                       r"memory outside the buffers it was given: load_v of 32 bytes at byte "
                       r"512 of in[01]_0_0\[0\] \(512 bytes long\)"):
        emulate_design(with_call_arg(d, 3, lambda n: 257), flat_inputs(d, np.random.default_rng(0)),
                       lib)


def test_a_scalar_store_past_a_buffer_hits_its_guard_region():
    """The GEMV kernel stores each result with a plain store: placed one tile of output rows
    too far, it writes past its output buffer into the guard region behind it."""
    d = design_of(GEMV(M=64, K=32, batches=1, tile_size_input=4, tile_size_output=8,
                       num_aie_columns=1))
    bad = with_call_arg(d, 7, lambda iv: dataclasses.replace(iv, scale=iv.scale + 1))
    with pytest.raises(EmulationError, match=r"kernel gemv_bf16 on core tile \(0, 2\) accessed "
                       r"memory outside .*wrote \d+ bytes past its end of y_0\[\d\]"):
        emulate_design(bad, flat_inputs(bad, np.random.default_rng(0)), host_cores())


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


def test_fifo_buffers_are_counted_as_mlir_aie_allocates_them():
    """A compute tile holds one buffer more than its largest acquire (a depth of 4 acquired
    one at a time is a ping-pong pair), a depth-1 FIFO acquired one at a time one buffer, a
    memory tile the declared depth."""
    from iron.targets.npu.check import buffers_at

    d = design_of(GEMV(M=64, K=32, batches=1, tile_size_input=4, tile_size_output=8,
                       num_aie_columns=1))
    core, mem = d.cores[0].tile, iron.targets.npu.ir.Tile(0, 1)
    a, x = d.fifo("A_0"), d.fifo("x_0")
    assert (a.depth, x.depth) == (2, 1)
    assert buffers_at(d, a, core) == 2 and buffers_at(d, x, core) == 1
    assert buffers_at(d, dataclasses.replace(a, depth=4), core) == 2
    assert buffers_at(d, dataclasses.replace(a, depth=4), mem) == 4
    assert buffers_at(d, a, a.producer) == 0  # the shim: host memory


def test_gemm_tiles_follow_the_kernels_mmul_shape():
    """gemm.cc's MMUL is 4x8x4 on npu1's AIE2 and 4x8x8 on npu2's AIE2P; output rows leave as
    8-lane bf16 vectors, so tile_n is a multiple of 8 on both."""
    op = GEMM(M=64, K=64, N=64, tile_m=4, tile_k=32, tile_n=16, num_aie_columns=1)
    assert resolve(op, "npu1") and resolve(op, "npu2")
    for dev, shape in (("npu1", "4x8x4"), ("npu2", "4x8x8")):
        with pytest.raises(iron.ResolveError, match=rf"tile_m % 4 == 0, tile_k % 8 == 0, "
                           rf"tile_n % 8 == 0 \(the kernel's {shape} bf16 MMUL on {dev}"):
            resolve(dataclasses.replace(op, tile_n=4), dev)


def test_long_transfers_fit_the_dma_limits_or_are_refused():
    """An odd row cannot be moved in whole 32-bit words; long tensors fold into 4 dims."""
    d = design_of(RMSNorm(rows=2, size=64, weighted=False, tile_size=1, num_aie_columns=1))
    t = d.sequence[0][0]
    odd = dataclasses.replace(t, pattern=Pattern(0, (1, 1, 2, 63), (0, 0, 63, 1)))
    bad = dataclasses.replace(d, sequence=((odd, *d.sequence[0][1:]),))
    problem = [r.text for r in pattern_rules(bad, resources("npu1"), "") if not r.ok]
    assert problem and "innermost run 63 x 2 B or offset 0 is not whole 4-byte words" in problem[0]
    with pytest.raises(iron.ResolveError, match=r"size % 16 == 0"):
        resolve(RMSNorm(rows=1, size=63, weighted=False, tile_size=1, num_aie_columns=1), "npu1")
    d = design_of(AXPY(size=1 << 22, scalar_factor=1.0, tile_size=1024, num_aie_columns=1))
    sizes = d.sequence[0][0].pattern.sizes
    assert len(sizes) == 4 and max(sizes) <= 2046 and np.prod(sizes) == 1 << 22


# ---- buffer descriptors ----------------------------------------------------------------------


def test_descriptor_ids_are_per_shim_tile_and_reused_only_after_the_wait():
    """A 4-column GEMM over 4 phases: 3 transfers per column and phase, ids 0..2 on every
    shim tile, the same ids again in each phase (after the previous phase's wait)."""
    d = design_of(GEMM(M=128, K=64, N=64, tile_m=8, tile_k=32, tile_n=16, num_aie_columns=4),
                  "npu1")
    plan = allocate(d, 16)
    assert len(d.sequence) == 4 and plan.overflow is None
    for phase, ids in zip(d.sequence, plan.ids):
        for col in range(4):
            assert [i for t, i in zip(phase, ids) if t.tile.col == col] == [0, 1, 2]
    custom = render(d)
    found = [int(i) for i in re.findall(r"\{id = (\d+) : i64", custom)]
    assert len(found) == 48 and max(found) == 2


def test_a_phase_needing_more_descriptors_than_a_shim_tile_has_is_refused_before_any_mlir():
    d = design_of(AXPY(size=1024, scalar_factor=2.0, tile_size=256, num_aie_columns=1))
    t_in, t_in1, t_out = d.sequence[0]
    many = tuple(dataclasses.replace(t_in, pattern=Pattern(k * 64, (1, 1, 1, 64), (0, 0, 0, 1)))
                 for k in range(16))
    bad = dataclasses.replace(d, sequence=((*many, t_in1, t_out),))
    broken = [r.text for r in design_rules(bad, resources("npu1"), ("tile_size",)) if not r.ok]
    assert broken == ["buffer descriptors of the shim tiles: runtime phase 0 needs 18 buffer "
                      "descriptors on shim tile (0, 0) at once (transfers issued before their "
                      "wait), it has 16"]
    with pytest.raises(ValueError, match="needs 18 buffer descriptors"):
        render(bad)


def test_the_emulator_checks_that_a_wait_covers_the_phases_inputs():
    """The allocator frees a phase's input descriptors at the wait on its outputs; an output
    that can finish before an input has would let the next phase reprogram a running one."""
    d = design_of(AXPY(size=1024, scalar_factor=2.0, tile_size=256, num_aie_columns=1))
    spare = dataclasses.replace(d.fifos[0], name="spare")  # no core takes its elements
    extra = Transfer("in", 0, "spare", d.sequence[0][0].tile, Pattern(0, (1, 1, 3, 256),
                                                                      (0, 0, 256, 1)))
    early = dataclasses.replace(d, fifos=(*d.fifos, spare),
                                sequence=((*d.sequence[0], extra),))
    with pytest.raises(EmulationError, match=r"phase 0's wait returned while transfer in via "
                       r"spare had not finished"):
        emulate_design(early, flat_inputs(early, np.random.default_rng(0)), host_cores())


# ---- MLIR ------------------------------------------------------------------------------------


def test_custom_and_generic_forms_hold_the_same_design():
    d = design_of(GEMM(M=32, K=64, N=64, tile_m=8, tile_k=32, tile_n=16, num_aie_columns=2))
    custom, generic = render(d), render(d, generic=True)
    assert design_from_json(d.to_json()) == dataclasses.replace(d, memory_fields=())
    assert custom.startswith("module {\n  aie.device(npu2) {")
    assert generic.startswith('"builtin.module"() ({\n  "aie.device"() <{device = 8 : i32}> ({')
    for op in ("aie.tile", "aie.objectfifo", "aie.objectfifo.link", "aie.core",
               "aie.objectfifo.acquire", "aie.objectfifo.release", "func.call", "func.func",
               "aie.runtime_sequence", "aiex.npu.dma_memcpy_nd", "aiex.npu.dma_wait",
               "scf.for"):
        assert custom.count(f"{op} ") + custom.count(f"{op}(") == generic.count(f'"{op}"'), op
    assert ("aie.objectfifo.link [@A_0] -> [@A_0_0, @A_0_1, @A_0_2, @A_0_3] ([] [0, 256, 512, "
            "768])") in custom
    assert ('func.func private @gemm_bf16(memref<8x32xbf16>, memref<16x32xbf16>, '
            'memref<8x16xf32>, i32, i32, i32) attributes {link_with = "gemm.o"}') in custom
    assert "link_with" not in custom.split("aie.core", 1)[1].split("func.call", 1)[0]


@pytest.mark.slow
def test_every_core_loops_until_reconfiguration_and_every_bd_id_fits_its_tile(designs):
    """Each core's region is one loop to the largest index around its per-dispatch program,
    as mlir-aie's tests and IRON's range_(sys.maxsize) write it; every descriptor id is below
    the 16 of a shim tile."""
    for d in designs:
        custom = render(d)
        ids = [int(i) for i in re.findall(r"\{id = (\d+) : i64", custom)]
        assert len(ids) == sum(map(len, d.sequence)) and max(ids) < 16
        cores = custom.split("aie.core(")[1:]
        assert len(cores) == len(d.cores)
        for text in cores:
            body = text.split("\n")
            consts = {m.group(1): m.group(2) for m in
                      re.finditer(r"(%c\d+) = arith.constant (\d+) : index", text)}
            first = next(line for line in body[1:] if "arith.constant" not in line)
            loop = re.match(r"\s*scf.for %i\d+ = (%c\d+) to (%c\d+) step (%c\d+) \{", first)
            assert loop, first
            assert [consts[g] for g in loop.groups()] == ["0", str(FOREVER), "1"]


def verify_all(texts: list[tuple[str, str]]) -> list[str]:
    problems = []
    for generic, custom in texts:
        try:
            check_text(generic, custom_text=custom)
        except Problem as e:
            problems.append(str(e))
    return problems


@pytest.mark.slow
def test_every_emulated_design_verifies_against_mlir_aies_op_definitions(designs):
    """The generic form of each design of the sweep, checked by xDSL against ``ods`` and the
    lowering's preconditions, and its custom form read as the same module (two processes:
    xDSL parses in Python, about 0.5 s per design)."""
    texts = [(render(d, generic=True), render(d)) for d in designs]
    with ProcessPoolExecutor(2) as pool:
        problems = [p for part in pool.map(verify_all, [texts[0::2], texts[1::2]]) for p in part]
    assert problems == []


GOOD = None


def good_module() -> str:
    global GOOD
    if GOOD is None:
        GOOD = render(design_of(GEMM(M=32, K=64, N=64, tile_m=8, tile_k=32, tile_n=16,
                                     num_aie_columns=1)), generic=True)
    return GOOD


@pytest.mark.parametrize("old,new,message", [
    ('"aie.objectfifo.acquire"', '"aie.objectfifo.aquire"',
     "Operation aie.objectfifo.aquire is not registered"),
    ("device = 8 : i32", 'device = "npu2"', '"npu2" should be of base attribute integer'),
    ("device = 8 : i32", "device = 99 : i32", "'device' = 99 is not a case of its enum"),
    (" elemNumber = 2 : i32,", "", "property 'elemNumber' expected"),
    ("elemNumber = 2 : i32", "elemNum = 2 : i32", "property 'elemNumber' expected"),
    ("elemNumber = 2 : i32", 'elemNumber = "two"', "integer"),
    ("col = 0 : i32", "col = 0 : i64", "i64"),
    ("dst_offsets = [0, 256, 512, 768]", "dst_offsets = array<i64: 0, 256, 512, 768>",
     "expected ArrayAttr"),
    (", operandSegmentSizes = array<i32: 1, 0, 0, 0>", "", "operandSegmentSizes"),
    ("static_sizes = array<i64: ", "static_sizes = array<i64: 1, ", "DenseArrayCount<4>"),
    ("callee = @gemm_bf16", "callee = @gemm_f16", "gemm_f16"),
])
def test_a_broken_module_is_rejected_naming_the_problem(old, new, message):
    text = good_module()
    check_text(text)  # the module as rendered verifies
    assert old in text
    with pytest.raises(Problem) as e:
        check_text(text.replace(old, new, 1), "design.generic.mlir")
    assert str(e.value).startswith("design.generic.mlir:") and message in str(e.value), e.value


def test_the_verify_command_exits_non_zero_naming_the_first_problem(tmp_path):
    good, bad = tmp_path / "good.generic.mlir", tmp_path / "bad.generic.mlir"
    good.write_text(good_module())
    bad.write_text(good_module().replace('"aie.end"() : () -> ()\n  }) : () -> ()', "})"))
    run = [sys.executable, "-m", "iron.targets.npu.verify"]
    ok = subprocess.run(run + [str(good)], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0 and "1 module(s) verify against mlir-aie" in ok.stdout
    failed = subprocess.run(run + [str(good), str(bad)], capture_output=True, text=True,
                            timeout=120)
    assert failed.returncode == 1 and failed.stderr.startswith(f"error: {bad}:"), failed.stderr


def mlir_opt(text: str, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([MLIR_OPT, "--allow-unregistered-dialect", "--split-input-file",
                           *flags, "-o", os.devnull], input=text, capture_output=True, text=True,
                          timeout=300)


def with_calls_unregistered(generic: str) -> str:
    """The generic form with its kernel calls as unregistered ops: MLIR looks a call's callee
    up in the nearest symbol table, and an unregistered ``aie.device`` is not known to be
    one, so a ``func.call`` inside it cannot resolve (``verify`` resolves them against the
    device's declarations)."""
    return generic.replace('"func.call"(', '"iron.kernel_call"(')


needs_mlir_opt = pytest.mark.skipif(
    MLIR_OPT is None, reason="mlir-opt-22 not found: install Debian's mlir-22-tools "
    "(apt-get install mlir-22-tools); .ci/run does")


@needs_mlir_opt
def test_upstream_mlir_verifies_the_standard_dialects_inside_every_design(designs):
    text = "\n// -----\n".join(with_calls_unregistered(render(d, generic=True))
                               for d in designs)
    full = mlir_opt(text)
    assert full.returncode == 0, full.stderr[:2000]


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
    assert sorted(p.name for p in (entry.path / "kernels").iterdir()) == [
        "aie_api_host.h", "iron_aie.h", "norm.cc"]
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
                       (peano / "bin" / "clang++", STAND_IN_CLANG)):
        path.write_text(text.format(python=sys.executable))
        path.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("PEANO_INSTALL_DIR", str(peano))
    include = tmp_path / "mlir-aie" / "include"
    (include / "aie_api").mkdir(parents=True)
    (include / "aie_api" / "aie.hpp").write_text("")
    monkeypatch.setenv("MLIR_AIE_INCLUDE_DIR", str(include))
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
    clang = (entry.path / "clang-args.txt").read_text().split("\n")
    assert "--target=aie2p-none-unknown-elf" in clang and f"-I{include}" in clang
    assert clang[-3:] == ["kernels/eltwise.cc", "-o", "eltwise.o"]
