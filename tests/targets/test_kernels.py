"""The cpu kernels against each operator's reference maths: a grid of shapes (odd and minimum
sizes included) and, for one shape per operator, every legal tunable setting."""

import ctypes

import numpy as np
import pytest
from ml_dtypes import bfloat16
from opcases import (SHAPES, SWEEP, OneStep, assert_builds_agree, assert_close, build,
                     case_inputs, run_built)

from iron.memplan import temp_buffers
from iron.resolution import legal_settings
from iron.targets import cpu
from iron import host


def run_case(name, shape, tunables=None, seed=0):
    rng = np.random.default_rng(seed)
    cls, fields, inputs = case_inputs(name, shape, rng)
    graph = OneStep(cls, {**fields, **(tunables or {})})
    out = graph(*inputs)
    ref = graph.reference(*inputs)
    for o, r in zip(*(x if isinstance(x, tuple) else (x,) for x in (out, ref))):
        assert_close(name, o, r)
    return graph


GRID = [(name, shape) for name, shapes in SHAPES.items() for shape in shapes]


@pytest.mark.parametrize("name,shape", GRID, ids=[f"{n}-{i}" for n, s in SHAPES.items()
                                                  for i in range(len(s))])
def test_kernel_matches_reference(name, shape):
    run_case(name, shape)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SWEEP))
def test_every_legal_setting_matches_reference(name):
    rng = np.random.default_rng(1)
    cls, fields, inputs = case_inputs(name, SWEEP[name], rng)
    op = OneStep(cls, fields).record_like(inputs).ops[0]
    settings = legal_settings(op, "cpu")
    assert settings, f"{op.describe()} has no legal setting on cpu"
    programs = [OneStep(cls, {**fields, **s}).record_like(inputs) for s in settings]
    cpu.compile_all([p.ops[0] for p in programs])  # in parallel, before running any
    for setting, program in zip(settings, programs):
        exe = cpu.load(program)
        out = exe.run(inputs)
        ref = program.reference(inputs)
        try:
            for o, r in zip(out, ref):
                assert_close(name, o, r)
        except AssertionError as e:
            raise AssertionError(f"{setting}: {e}") from None


def test_cache_write_updates_state_in_place_across_calls():
    import iron
    from iron.operators import CacheWrite

    class Write(iron.Graph):
        def body(self, x, pos):
            cache = self.state("cache", (2, 8, 4))
            return CacheWrite.step(cache, x, pos)

    graph = Write()
    x = np.arange(8, dtype=np.float32).reshape(1, 8).astype(iron.bfloat16)
    exe = cpu.load(graph.record(iron.spec((1, 8)), iron.spec((1,), np.int32)))
    exe.run([x, np.array([3], np.int32)])
    out = exe.run([x + 1, np.array([5], np.int32)])[0].astype(np.float32)
    assert np.array_equal(out[:, 3], np.arange(8).reshape(2, 4))
    assert np.array_equal(out[:, 5], np.arange(1, 9).reshape(2, 4))
    assert not out[:, [0, 1, 2, 4, 6, 7]].any()


def test_in_place_step_leaves_the_callers_input_alone():
    rng = np.random.default_rng(2)
    shape = SHAPES["QKVRoPE"][1]
    cls, fields, inputs = case_inputs("QKVRoPE", shape, rng)
    before = [a.copy() for a in inputs]
    q, k_cache, v_cache = OneStep(cls, fields)(*inputs)
    for a, b in zip(inputs, before):
        assert np.array_equal(a.view(np.uint8), b.view(np.uint8))
    assert not np.array_equal(k_cache.view(np.uint8), inputs[3].view(np.uint8))


def test_temps_share_memory_only_when_never_live_at_once(tmp_path):
    """The temp planner on a Llama prefill program: overlapping lifetimes never overlap in
    memory, outputs own their memory, and the plan needs far less than a buffer per temp."""
    from tiny_llama import write_tiny_llama

    import iron
    from iron.pipeline.app import load_app

    app = load_app("llama", write_tiny_llama(tmp_path / "tiny", seed=5), chunk=8)
    program = app.programs(iron.device("cpu"), iron.Profile(device="cpu"))["prefill"]
    buffers = temp_buffers(program)
    temps = [t.index for t in program.tensors if t.kind == "temp"]
    assert sorted(buffers) == sorted(temps)
    live = {}
    for i, s in enumerate(program.steps):
        for t in (*s.inputs, *s.outputs):
            first, _ = live.get(t, (i, i))
            live[t] = (first, i)
    for t in program.outputs:
        live[t] = (live[t][0], len(program.steps))  # read after the run

    def span(t):
        start = buffers[t].ctypes.data
        return start, start + buffers[t].nbytes

    for a in temps:
        for b in temps:
            if a < b and live[a][0] <= live[b][1] and live[b][0] <= live[a][1]:
                (a0, a1), (b0, b1) = span(a), span(b)
                assert a1 <= b0 or b1 <= a0, (program.tensors[a], program.tensors[b])
    blocks = {id(b.base): b.base.nbytes for b in buffers.values()}  # the allocations
    assert sum(blocks.values()) < sum(b.nbytes for b in buffers.values()) / 2
    assert len(blocks) < len(temps) / 3


def test_swiglu_16_lane_path_gives_the_8_lane_paths_bits():
    """SwiGLU runs 16 columns at a time where AVX-512 is there and 8 at a time in a tile's rest:
    a row's bits must not depend on which path its columns took (a batched decode step and a
    one-row step must agree). Every bf16 gate value, NaNs and infinities included, through a
    tile of 16 (the wide path, on such a host) and tiles of 8 (the narrow one)."""
    from ml_dtypes import bfloat16

    from iron.operator import Operator

    rng = np.random.default_rng(3)
    gate = np.arange(1 << 16, dtype=np.uint16).view(bfloat16).reshape(-1, 16)
    up = rng.normal(0, 2, gate.shape).astype(bfloat16)
    x = np.concatenate([gate, up], axis=1)
    outs = {}
    for tile in (16, 8):
        graph = OneStep(Operator.registry["SwiGLU"], {"tile_size": tile, "num_aie_columns": 1})
        outs[tile] = np.asarray(graph(x)).view(np.uint16)
    differ = np.flatnonzero(outs[16] != outs[8])
    assert differ.size == 0, (
        f"SwiGLU: {differ.size} of {outs[8].size} outputs differ between the 16- and 8-column "
        f"paths; first at gate bits {gate.reshape(-1).view(np.uint16)[differ[0]]:#06x}: "
        f"{outs[16].reshape(-1)[differ[0]]:#06x} against {outs[8].reshape(-1)[differ[0]]:#06x}")


#: Attention as a bundle runs it: a prompt's rows, decode at a full cache with a tail of keys
#: that is not a whole vector, the slotted form of a batched step; head dims 64, 16 and 24.
ATTENTION_CASES = [
    ("Attention", {"rows": 1, "heads": 9, "kv_heads": 3, "head_dim": 64, "ctx": 300,
                   "pos": 299}),
    ("Attention", {"rows": 5, "heads": 4, "kv_heads": 2, "head_dim": 16, "ctx": 40, "pos": 3}),
    ("Attention", {"rows": 3, "heads": 8, "kv_heads": 2, "head_dim": 24, "ctx": 50, "pos": 20}),
    ("SlotAttention", {"rows": 4, "slots": 5, "heads": 9, "kv_heads": 3, "head_dim": 64,
                       "ctx": 300}),
]


@pytest.mark.skipif("avx512f" not in host.features(),
                    reason="host: runs an AVX-512 build: needs a host that has it")
@pytest.mark.parametrize("name,shape", ATTENTION_CASES,
                         ids=[f"{n}-{s['head_dim']}" for n, s in ATTENTION_CASES])
def test_attention_avx512_build_gives_the_avx2_builds_bits(name, shape, tmp_path):
    """Attention gives the same bits built for an AVX-512 host and for AVX2 alone: its dot
    products and sums keep their order, and what the compiler vectorizes wider is elementwise.
    So a model's tokens do not depend on the -march its bundle was built for. The AVX-512
    build's code is AVX-512's own: zmm registers (GCC's Zen 4 tuning), or, where the tuning
    prefers 256-bit vectors (GCC's Sapphire Rapids), registers 16-31, which only AVX-512's
    encoding reaches."""
    assert_builds_agree(name, shape, "native", "x86-64-v3", rb"zmm|[xy]mm(1[6-9]|2\d|3[01])",
                        tmp_path, seed=5)


def summation_order_cases(rows, heads, kv_heads, head_dim, ctx):
    """Attention inputs (q, k, v) whose bf16 outputs depend on the order of each pair's two
    products. Both cancel large values: summed small first, a small value is rounded at
    2^20's scale (to 1/8) before the next pair's -2^20 cancels it; summed 2^20 first, it is
    not. In the first, every pair of dimensions of a key is (+-2^20, small) against a query of
    ones, so its scores move; in the second, every key scores 0 (p = 1) and every pair of value
    rows is (+-2^20, small) in each dimension, so its sums move, and the last dimension of every
    value is the smallest subnormal bf16, which the products take as zero."""
    rng = np.random.default_rng(11)
    small = rng.standard_normal((kv_heads, ctx, head_dim)).astype(bfloat16)
    q = np.ones((rows, heads * head_dim), bfloat16)
    big = np.where(np.arange(head_dim) // 16 % 2 == 0, 2.0 ** 20, -(2.0 ** 20))
    k = np.where(np.arange(head_dim) % 2 == 0, big, small).astype(bfloat16)
    keys = np.arange(ctx)[None, :, None]
    big = np.where(keys // 2 % 2 == 0, 2.0 ** 20, -(2.0 ** 20))
    v = np.where(keys % 2 == 0, big, small).astype(bfloat16)
    v[..., -1] = np.uint16(1).view(bfloat16)
    return [(q, k, small), (q, np.zeros_like(k), v)]


@pytest.mark.skipif("avx512_bf16" not in host.features(),
                    reason="host: runs an AVX512-BF16 build: needs a host that has it")
def test_attention_without_avx512_bf16_does_vdpbf16ps_arithmetic(tmp_path):
    """attention.c sums pairs of bf16 products as VDPBF16PS does (the odd product first, each
    step rounded, subnormals taken as zero); the x86-64-v3 build does it with FMAs under
    MXCSR's flush-to-zero and denormals-are-zero. On inputs whose bits depend on both
    (summation_order_cases), the two builds agree: a prompt's tokens do not depend on the bundle's -march."""
    shape = {"rows": 8, "heads": 9, "kv_heads": 3, "head_dim": 64, "ctx": 300, "pos": 200}
    pos = np.arange(200, 208, dtype=np.int32)  # over 2 blocks of 128 keys, odd lengths too
    libs = {}
    for march in ("native", "x86-64-v3"):
        _, _, lib, code = build("Attention", shape, march, tmp_path, np.random.default_rng(0))
        if code is not None and march == "native":
            assert b"vdpbf16ps" in code, "the native build has no VDPBF16PS"
        libs[march] = ctypes.CDLL(str(lib)).iron_kernel
    cases = summation_order_cases(**{n: shape[n] for n in shape if n != "pos"})
    for case, (q, k, v) in enumerate(cases):
        outs = {}
        for march, kernel in libs.items():
            out = np.zeros_like(q)
            arrays = [q, k, v, pos, out]
            kernel((ctypes.c_void_p * 5)(*(a.ctypes.data for a in arrays)))
            outs[march] = out.view(np.uint16)
        differ = np.flatnonzero(outs["native"] != outs["x86-64-v3"])
        assert differ.size == 0, f"Attention case {case}: {differ.size} of {q.size} differ"


AMX_GEMM = ("GEMM", {"M": 48, "K": 96, "N": 64})  # K % 32 == 0: gemm.c's AMX tile path applies


def test_amx_gemm_builds_on_any_host_and_agrees_with_the_avx512_build_where_it_runs(tmp_path):
    """gemm.c's AMX path, built for Sapphire Rapids on whatever host runs the tests (building
    runs nothing): its code holds the bf16 tile product. Where the host has AMX it runs, and
    agrees with the reference and with the AVX-512 build within GEMM's tolerance (the tile
    unit sums pairs of products in its own order, so not bit for bit)."""
    name, shape = AMX_GEMM
    tunables = {"tile_n": 16, "num_aie_columns": 1}
    _, _, _, code = build(name, shape, "sapphirerapids", tmp_path, np.random.default_rng(4),
                          tunables)
    if code is not None:
        assert b"tdpbf16ps" in code, "-march=sapphirerapids build has no AMX tile product"
    if not {"amx_tile", "amx_bf16"} <= host.features():
        pytest.skip("host: the AMX build was checked as built; running it needs an AMX host")
    out, reference, _ = run_built(name, shape, "sapphirerapids", tmp_path,
                                  np.random.default_rng(4), tunables)
    avx512, _, _ = run_built(name, shape, "icelake-server", tmp_path,
                             np.random.default_rng(4), tunables)
    assert_close(name, out, reference)
    assert_close(name, out, avx512.astype(np.float32))
