"""Quantized weight formats: the layout against gguf's own blocks, the uint4 quantizer, the
int8 rounding of x, the operators' format checks, and the kernels' AVX2 build (the fallback for
cpus without AVX512-VNNI), compiled with -march=znver3 and run here against the reference and,
on an AVX512-VNNI host, against the VNNI build's bits."""

import ctypes
import dataclasses
import shutil
import subprocess

import gguf
import numpy as np
import pytest
from gguf.quants import dequantize as gguf_dequantize
from gguf.quants import quantize as gguf_quantize

import iron
from iron import quant
from iron.errors import ResolveError, ShapeError
from iron.operators import GEMV
from iron.resolution import legal_settings
from iron.targets import cpu
from iron import host

from opcases import OneStep, assert_builds_agree, assert_close, case_inputs, run_built


@pytest.mark.parametrize("fmt", ["q4_0", "q4_1", "q8_0"])
def test_layout_keeps_gguf_blocks_and_dequantizes_like_gguf(fmt):
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((6, 96)) * 0.3).astype(np.float32)
    qtype = getattr(gguf.GGMLQuantizationType, fmt.upper())
    blocks = gguf_quantize(w, qtype)
    packed = quant.from_gguf(fmt, blocks)
    assert packed.shape == (6, quant.row_bytes(fmt, 96, 32)) == blocks.shape
    assert np.array_equal(quant.to_gguf(fmt, packed), blocks)  # bytes moved, none changed
    ours = quant.dequantize(fmt, packed, 96, 32)
    assert np.array_equal(ours, gguf_dequantize(blocks, qtype))  # bit for bit


def k_blocks(fmt, rows, k, rng):
    """Random bytes as K-quant blocks, but for finite fp16 super-block scales (d, dmin): every
    code, 6-bit scale and minimum, int8 scale takes any value the format can hold."""
    w = rng.integers(0, 256, (rows, quant.row_bytes(fmt, k, 256)), dtype=np.uint8)
    b = w.reshape(rows, k // 256, -1)
    fields = [slice(0, 2), slice(2, 4)] if fmt == "q4_k" else [slice(208, 210)]
    for f in fields:
        b[..., f] = rng.uniform(-0.01, 0.01, b.shape[:2] + (1,)).astype(np.float16).view(np.uint8)
    return w


@pytest.mark.parametrize("fmt", ["q4_k", "q6_k"])
def test_k_quant_blocks_are_kept_and_dequantize_like_gguf(fmt):
    """The row layout of a K-quant is the GGUF blocks as they are; the dequantization is gguf's,
    bit for bit, on blocks of random bytes; the tiled layout gives back the very bytes."""
    rng = np.random.default_rng(7)
    blocks = k_blocks(fmt, 32, 768, rng)
    assert quant.from_gguf(fmt, blocks) is not None
    assert np.array_equal(quant.to_gguf(fmt, quant.from_gguf(fmt, blocks)), blocks)
    ours = quant.dequantize(fmt, blocks, 768, 256)
    theirs = gguf_dequantize(blocks, getattr(gguf.GGMLQuantizationType, fmt.upper()))
    assert np.array_equal(ours.view(np.uint32), theirs.astype(np.float32).view(np.uint32))
    tiled = quant.tile(fmt, blocks, 768, 256)
    assert tiled.shape == (32, quant.row_bytes(fmt, 768, 256, tiled=True))
    assert np.array_equal(quant.untile(fmt, tiled, 768, 256), blocks)
    index = np.array([31, 0, 17, 17, 5])
    assert np.array_equal(quant.tiled_rows(fmt, tiled, 768, 256, index), blocks[index])


def test_q4_k_tiled_layout_puts_codes_scales_and_d_where_the_kernels_read_them():
    """A super-block of a tile is 8 groups of 32 values (their code planes, then 16 scales and
    16 minimums as bytes), then 16 d and 16 dmin (fp16)."""
    rng = np.random.default_rng(8)
    w = k_blocks("q4_k", 32, 512, rng)
    tiled = quant.tile("q4_k", w, 512, 256).reshape(-1)
    super_bytes, group_bytes = 16 * 148, 256 + 32
    second = tiled[16 * 2 * 148 + super_bytes:][:super_bytes]  # tile 1, super-block 1
    block = w[16 + 3].reshape(2, 144)[1]  # its row 3
    sc, mn = quant._q4_k_scales(block[4:16])
    group5 = second[5 * group_bytes:][:group_bytes]
    assert group5[256 + 3] == sc[5] and group5[256 + 16 + 3] == mn[5]
    assert second[8 * group_bytes + 6:][:2].tobytes() == block[0:2].tobytes()  # d
    assert second[8 * group_bytes + 32 + 6:][:2].tobytes() == block[2:4].tobytes()  # dmin
    words = group5[:256].view("<u4").reshape(4, 16)  # (plane j, row)
    codes = quant._k_codes("q4_k", block[None, None])[0, 0, 160:192]  # group 5's 32 codes
    for j, s in ((0, 0), (2, 3), (3, 1)):
        assert (words[j, 3] >> 4 * s) & 0xF == codes[8 * j + 2 * s]
        assert (words[j, 3] >> 16 + 4 * s) & 0xF == codes[8 * j + 2 * s + 1]


@pytest.mark.parametrize("fmt,group", [("q4_0", 32), ("q4_1", 32), ("q8_0", 32), ("uint4", 128)])
def test_tiled_layout_moves_bytes_to_where_the_kernels_read_them(fmt, group):
    """tile / untile are inverse, and the tiled bytes sit where iron_quant.h reads them: word i
    of plane j of a chunk holds row i's codes 8j+2s (bits 4s) and 8j+2s+1 (bits 16+4s); q8_0
    stores q + 128 as a low and a high nibble set; a group's 16 scales follow its codes."""
    rng = np.random.default_rng(6)
    rows, k = 32, 2 * group
    w = quant.random_matrix(fmt, rows, k, group, rng)
    tiled = quant.tile(fmt, w, k, group)
    assert tiled.shape == w.shape and np.array_equal(quant.untile(fmt, tiled, k, group), w)
    index = np.array([[3, 31], [16, 3]])
    assert np.array_equal(quant.tiled_rows(fmt, tiled, k, group, index), w[index])
    u = quant.unpack_codes(fmt, w[:, :quant.code_bytes(fmt, k)]).astype(np.int64)
    u = u + 128 if fmt == "q8_0" else u
    group_bytes = quant.row_bytes(fmt, group, group) * 16
    second_tile_group1 = tiled.reshape(-1)[16 * w.shape[1] + group_bytes:][:group_bytes]
    words = second_tile_group1[:quant.code_bytes(fmt, group) * 16].view("<u4")
    words = words.reshape(group // 32, -1, 4, 16)  # (chunk, nibble set, plane, row)
    for row, chunk, j, s in ((5, 0, 2, 1), (15, group // 32 - 1, 3, 3), (0, 0, 0, 0)):
        for h in range(words.shape[1]):
            value = u[16 + row, group + 32 * chunk + 8 * j + 2 * s: ][:2] >> 4 * h & 0xF
            word = int(words[chunk, h, j, row])
            assert [word >> 4 * s & 0xF, word >> 16 + 4 * s & 0xF] == list(value)
    scales = second_tile_group1[quant.code_bytes(fmt, group) * 16:][:32].view(np.uint16)
    row_scales = w[16:, quant.code_bytes(fmt, k):].view(np.uint16)
    assert np.array_equal(scales, row_scales[:, 1])
    with pytest.raises(quant.FormatError, match="rows must be a multiple of 16"):
        quant.tile(fmt, w[:24], k, group)


@pytest.mark.parametrize("group", [32, 128])
def test_uint4_round_to_nearest_error_is_within_half_a_step(group):
    rng = np.random.default_rng(1)
    w = (rng.standard_normal((5, 256)) * 0.05).astype(np.float32)
    w[0, :group] = 0.25  # a constant group: scale 0, every value exact
    packed = quant.quantize_uint4(w, group)
    assert packed.shape == (5, 128 + 4 * 256 // group)
    back = quant.dequantize("uint4", packed, 256, group)
    step = (w.reshape(5, -1, group).max(2) - w.reshape(5, -1, group).min(2)) / 15
    err = np.abs(back - w).reshape(5, -1, group).max(2)
    # half a step, plus what rounding scale and minimum to bf16 moves the grid by
    assert np.all(err <= 0.5 * step + 8 * 2.0 ** -9 * np.abs(w).reshape(5, -1, group).max(2))
    assert np.array_equal(back[0, :group], w[0, :group])


def test_bad_format_and_group_are_refused_naming_the_value():
    graph = OneStep(GEMV, {"weight_format": "q5_k"})
    with pytest.raises(ShapeError, match="weight_format='q5_k' is not one of"):
        graph.record(iron.spec((8, 40), np.uint8), iron.spec((64,)))
    graph = OneStep(GEMV, {"weight_format": "q4_1", "group_size": 128})
    with pytest.raises(ShapeError, match="group_size=128 is not supported by weight_format"):
        graph.record(iron.spec((8, 40), np.uint8), iron.spec((64,)))
    graph = OneStep(GEMV, {"weight_format": "q4_1"})
    with pytest.raises(ShapeError, match="not a whole number of 20-byte groups"):
        graph.record(iron.spec((8, 41), np.uint8), iron.spec((64,)))
    with pytest.raises(ShapeError, match="x has 96 columns, W has K=64"):
        graph.record(iron.spec((16, 40), np.uint8), iron.spec((96,)))
    with pytest.raises(ShapeError, match="q4_1 weight of 8 rows: .* tiles of 16 rows"):
        graph.record(iron.spec((8, 40), np.uint8), iron.spec((64,)))


def test_quantized_gemm_tile_k_must_hold_whole_groups():
    rng = np.random.default_rng(2)
    cls, fields, inputs = case_inputs(
        "GEMM", {"M": 4, "K": 256, "N": 16, "weight_format": "uint4", "group_size": 128}, rng)
    op = OneStep(cls, fields).record_like(inputs).ops[0]
    assert {s["tile_k"] for s in legal_settings(op, "cpu")} == {128, 256}
    with pytest.raises(ResolveError, match="tile_k % group_size == 0"):
        OneStep(cls, {**fields, "tile_k": 64}).record_like(inputs)


AVX2_CASES = [
    ("GEMV", {"M": 16, "K": 576, "batches": 2, "weight_format": "q4_1"}),
    ("GEMV", {"M": 16, "K": 256, "batches": 5, "weight_format": "q4_0"}),
    ("GEMV", {"M": 32, "K": 96, "batches": 1, "weight_format": "q8_0"}),
    ("GEMV", {"M": 16, "K": 256, "batches": 1, "weight_format": "uint4", "group_size": 128}),
    ("GEMM", {"M": 5, "K": 64, "N": 32, "weight_format": "q4_1"}),
    ("Embedding", {"vocab": 32, "dim": 64, "rows": 3, "weight_format": "q8_0"}),
    ("GEMV", {"M": 16, "K": 512, "batches": 3, "weight_format": "q4_k", "group_size": 256}),
    ("GEMV", {"M": 32, "K": 256, "batches": 2, "weight_format": "q6_k", "group_size": 256}),
]


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")
@pytest.mark.parametrize("name,shape", AVX2_CASES,
                         ids=[f"{n}-{s['weight_format']}" for n, s in AVX2_CASES])
def test_avx2_build_matches_reference(name, shape, tmp_path):
    """The same kernel compiled for Zen 3 (AVX2, no AVX-512) runs here and agrees."""
    out, reference, code = run_built(name, shape, "znver3", tmp_path, np.random.default_rng(3))
    if code is not None:  # really the AVX2 code: no 512-bit register anywhere
        assert b"zmm" not in code
    assert_close(name, out, reference)


#: Every format through both tile kernels; the K-quants also where the VNNI kernel takes 4
#: vectors per pass and a rest (5: 4 + 1; 7: 4 + 3), and as the GEMM of a prefill chunk.
VNNI_CASES = [
    ("GEMV", {"M": 32, "K": 512, "batches": 1, "weight_format": "q4_k", "group_size": 256}),
    ("GEMV", {"M": 48, "K": 768, "batches": 5, "weight_format": "q4_k", "group_size": 256}),
    ("GEMV", {"M": 32, "K": 512, "batches": 1, "weight_format": "q6_k", "group_size": 256}),
    ("GEMV", {"M": 48, "K": 768, "batches": 7, "weight_format": "q6_k", "group_size": 256}),
    ("GEMM", {"M": 9, "K": 512, "N": 48, "weight_format": "q4_k", "group_size": 256}),
    ("GEMM", {"M": 6, "K": 512, "N": 32, "weight_format": "q6_k", "group_size": 256}),
    ("GEMV", {"M": 16, "K": 256, "batches": 5, "weight_format": "q4_0"}),
    ("GEMV", {"M": 16, "K": 576, "batches": 2, "weight_format": "q4_1"}),
    ("GEMV", {"M": 32, "K": 96, "batches": 3, "weight_format": "q8_0"}),
    ("GEMV", {"M": 16, "K": 256, "batches": 1, "weight_format": "uint4", "group_size": 128}),
    # x rounded per 32 values: one conversion per chunk of the two blocks' integer sums
    ("GEMV", {"M": 32, "K": 512, "batches": 9, "weight_format": "q4_0", "x_block": 32}),
    ("GEMM", {"M": 9, "K": 512, "N": 48, "weight_format": "q4_k", "group_size": 256,
              "x_block": 32}),
    ("GEMV", {"M": 32, "K": 96, "batches": 3, "weight_format": "q8_0", "x_block": 32}),
    ("GEMV", {"M": 16, "K": 256, "batches": 2, "weight_format": "uint4", "group_size": 128,
              "x_block": 32}),
]


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")
@pytest.mark.skipif(not {"avx512_vnni", "avx512bw"} <= host.features(),
                    reason="host: runs an AVX512-VNNI build: needs a host that has it")
@pytest.mark.parametrize("march", ["native", "icelake-server"])  # this host; VNNI without BF16
@pytest.mark.parametrize("name,shape", VNNI_CASES,
                         ids=[f"{n}-{s['weight_format']}-{s.get('batches', s['M'])}"
                              f"-x{s.get('x_block', 16)}" for n, s in VNNI_CASES])
def test_avx512_vnni_build_gives_the_avx2_builds_bits(name, shape, march, tmp_path):
    """The AVX512-VNNI tile kernel (vpdpbusd on 16 rows) and the AVX2 one (vpmaddubsw +
    vpmaddwd on two halves of 8) sum the same integers and take the same float steps, so a
    bundle gives the same bits whichever the host compiles; both agree with the reference.
    The outputs are bf16: any difference in the integer sums, the lanes or the scales shows,
    a float step taken in another order only where it moves a bf16 rounding."""
    assert_builds_agree(name, shape, march, "znver3", b"vpdpbusd", tmp_path, seed=4)


def test_kernel_format_numbers_match_iron_quant():
    import re

    header = (cpu.SOURCE_DIR / "iron_quant.h").read_text()
    numbers = {name.lower(): int(n) for name, n in
               re.findall(r"#define IRON_FMT_(\w+) (\d+)", header)}
    assert numbers == {fmt: i for i, fmt in enumerate(quant.FORMATS)}


def test_profile_entries_match_on_the_weight_format():
    profile = iron.Profile()
    profile.add(GEMV, M=64, K=576, tile_size_output=32)
    profile.add(GEMV, M=64, K=576, weight_format="q4_1", tile_size_output=16)
    rng = np.random.default_rng(4)
    for fmt, tile in (("bf16", 32), ("q4_1", 16), ("q8_0", 32)):
        cls, fields, inputs = case_inputs(
            "GEMV", {"M": 64, "K": 576, "batches": 1, "weight_format": fmt}, rng)
        graph = OneStep(cls, fields)
        graph.profile = profile
        assert graph.record_like(inputs).ops[0].tile_size_output == tile, fmt
    with pytest.raises(iron.errors.ProfileError, match="weight_format='q9' is not one of bf16"):
        profile.add(GEMV, weight_format="q9", tile_size_input=2)


@pytest.mark.parametrize("fmt,group,k", [("q4_1", 32, 96), ("q8_0", 32, 64), ("uint4", 128, 256),
                                         ("q4_k", 256, 512), ("q6_k", 256, 256)])
def test_quantized_gemv_over_work_items_and_vector_counts(fmt, group, k):
    """The kernel computes a tile of 16 rows for up to 4 vectors per pass (2 or 1 without
    AVX512-VNNI), the rest in a last pass: one and nine vectors, work items of one and two
    tiles, an odd count of 32-value chunks for q4_1, against the reference."""
    rng = np.random.default_rng(5)
    for batches, tile in ((1, 16), (9, 32)):
        shape = {"M": 64, "K": k, "batches": batches, "weight_format": fmt, "group_size": group}
        cls, fields, inputs = case_inputs("GEMV", shape, rng)
        program = OneStep(cls, {**fields, "tile_size_output": tile,
                                "num_aie_columns": 2}).record_like(inputs)
        out = cpu.load(program).run(inputs)[0]
        assert_close("GEMV", out, program.reference(inputs)[0])


def test_x_is_rounded_to_int8_codes_per_block():
    """Each block of 16 becomes codes in -127..127 times max |x| / 127, rounded half to even:
    the largest magnitude is kept exactly, a half-way value goes to the even code, and a block
    of zeros or of values so small that 127 / max |x| overflows becomes zeros."""
    assert quant.ACTIVATION_BLOCK == 16
    x = np.zeros((4, 16), np.float32)
    x[0] = np.linspace(-1, 1, 16) ** 3
    x[1, :2] = 127.0, 2.5  # scale 1: 2.5 is half-way between codes 2 and 3
    x[2, :2] = 2e-38, -1e-38  # 127 / 2e-38 overflows float32
    out = quant.activation_values(x.reshape(-1)).reshape(4, 16)
    assert out[0, 0] == x[0, 0] and out[0, -1] == x[0, -1]
    scale = np.float32(1) / np.float32(127)
    codes = out[0] / scale
    assert np.all(np.abs(codes - np.rint(codes)) < 1e-3) and np.abs(codes).max() <= 127
    assert np.all(np.abs(out[0] - x[0]) <= scale / 2 * 1.0001)
    assert out[1, 0] == 127.0 and out[1, 1] == 2.0
    assert not out[2:].any()


def test_x_block_32_gives_both_halves_of_a_chunk_one_scale():
    """With x_block 32 a value shares the scale of the largest in its 32, not in its 16: 2.5
    beside 127 in the same 32 rounds to the even code 2 at scale 1, where blocks of 16 keep it
    (the largest of its own 16); a 32-block of its own is kept at its maximum."""
    x = np.zeros(64, np.float32)
    x[0], x[20], x[40] = 127.0, 2.5, 1.0
    per32, per16 = quant.activation_values(x, 32), quant.activation_values(x)
    assert per32[0] == 127.0 and per32[20] == 2.0 and per32[40] == 1.0
    assert per16[20] == 2.5


@pytest.mark.parametrize("fmt,group", [("q6_k", 256), ("bf16", 32)])
def test_x_block_32_is_refused_where_the_weight_cannot_take_it(fmt, group):
    """Q6_K's scale changes every 16 values, and a bf16 weight multiplies x unrounded: x_block
    32 is a one-line error naming the value, the format and the rule."""
    shape = {"M": 16, "K": 256, "batches": 1, "weight_format": fmt, "group_size": group}
    cls, fields, inputs = case_inputs("GEMV", shape, np.random.default_rng(0))
    with pytest.raises(ShapeError, match=f"x_block=32 is not one of 16 for weight_format "
                                         f"'{fmt}'"):
        OneStep(cls, {**fields, "x_block": 32}).record_like(inputs)


def test_npu_designs_take_x_block_16_only():
    """The npu cores round x per 16 values (qmatrix.cc): a GEMV asking for 32 has no legal
    setting there, and keeps its settings on the cpu."""
    shape = {"M": 64, "K": 256, "batches": 1, "weight_format": "q4_0"}
    cls, fields, inputs = case_inputs("GEMV", shape, np.random.default_rng(0))
    for x_block, npu_settings in ((16, True), (32, False)):
        op = OneStep(cls, {**fields, "x_block": x_block}).record_like(inputs).ops[0]
        unset = dataclasses.replace(op, **{n: None for n in cls.tunables()})
        assert bool(legal_settings(unset, "npu2")) == npu_settings, x_block
        assert legal_settings(unset, "cpu")


def test_the_activation_scale_benchmark_rounds_blocks_of_16_as_the_kernels_do():
    """benchmarks/activation_scale.py measures coarser scale blocks by rounding in torch; at 16
    values it must give activation_values' bits, edge cases included."""
    torch = pytest.importorskip("torch")
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from activation_scale import round_blocks

    x = np.random.default_rng(3).standard_normal((5, 64)).astype(np.float32) * 3
    x[0, :16] = np.linspace(-1, 1, 16) ** 3
    x[1, :2] = 127.0, 2.5
    x[2, :16] = 0.0
    x[2, 16:18] = 2e-38, -1e-38
    ours = round_blocks(torch.from_numpy(x), 16).numpy()
    assert np.array_equal(ours, quant.activation_values(x))
    row = round_blocks(torch.from_numpy(x), None).numpy()  # one scale for the whole row
    assert np.array_equal(np.abs(row).max(axis=1), np.abs(x).max(axis=1))


def test_quantized_gemv_matches_the_reference_on_blocks_at_the_edges_of_int8():
    """x blocks of zeros, of values too small to scale, with one outlier, and of half-way
    values: the kernel rounds x as activation_values does, so it stays within the GEMV
    tolerance of the reference built on it."""
    rng = np.random.default_rng(11)
    cls, fields, inputs = case_inputs(
        "GEMV", {"M": 32, "K": 128, "batches": 2, "weight_format": "q4_1"}, rng)
    x = np.zeros((2, 128), np.float32)
    x[0, 32:48] = 1e-38
    x[0, 64:96] = rng.standard_normal(32) * 1e-3
    x[0, 64] = 1000.0
    x[1] = (rng.integers(-127, 128, 128) + 0.5) * 0.25  # half-way between codes of scale 0.25
    x[1, ::16] = 127 * 0.25
    inputs = [inputs[0], x.astype(iron.bfloat16)]
    program = OneStep(cls, {**fields, "tile_size_output": 16,
                            "num_aie_columns": 2}).record_like(inputs)
    out = cpu.load(program).run(inputs)[0]
    assert_close("GEMV", out, program.reference(inputs)[0])


@pytest.mark.parametrize("fmt,group,k", [("q4_1", 32, 96), ("q8_0", 32, 64), ("q4_0", 32, 64),
                                         ("uint4", 128, 256), ("q4_k", 256, 512),
                                         ("q6_k", 256, 512)])
def test_quantized_gemm_rows_are_bit_identical_to_the_gemv(fmt, group, k):
    """A prefill chunk's GEMM multiplies each row as the decode GEMV multiplies x (the same
    int8 rounding, integer sums and float steps), whatever the row blocking (passes of up to
    8 vectors and a rest of 2, 6 or 7) and threads: so a prompt row gives the same bits through
    either kernel."""
    from iron.operators import GEMM

    rng = np.random.default_rng(12)
    w = quant.tile(fmt, quant.random_matrix(fmt, 48, k, group, rng), k, group)
    a = rng.standard_normal((30, k)).astype(iron.bfloat16)
    fmt_fields = {"weight_format": fmt, "group_size": group}
    gemv = cpu.load(OneStep(GEMV, {**fmt_fields, "tile_size_output": 16,
                                   "num_aie_columns": 1}).record_like([w, a[0]]))
    rows = np.stack([gemv.run([w, row])[0] for row in a])
    for tile_m, tile_n in ((30, 16), (15, 48), (10, 16), (6, 16), (3, 16)):
        program = OneStep(GEMM, {**fmt_fields, "tile_m": tile_m, "tile_n": tile_n,
                                 "tile_k": k, "num_aie_columns": 2}).record_like([a, w])
        out = cpu.load(program).run([a, w])[0]
        assert np.array_equal(out.view(np.uint16), rows.view(np.uint16)), (tile_m, tile_n)
        assert_close("GEMM", out, program.reference([a, w])[0])


@pytest.mark.parametrize("fmt,group,k", [("q4_1", 32, 96), ("q4_k", 256, 512), ("q6_k", 256, 256)])
def test_batched_quantized_gemv_rows_are_bit_identical_to_one_row(fmt, group, k):
    """Decode's batched GEMV (1 to 9 vectors, passes of 2 or 4 and a rest) gives each vector
    the bits the one-vector GEMV gives it: a sequence's logits do not depend on its batch."""
    rng = np.random.default_rng(13)
    w = quant.tile(fmt, quant.random_matrix(fmt, 32, k, group, rng), k, group)
    x = rng.standard_normal((9, k)).astype(iron.bfloat16)
    fields = {"weight_format": fmt, "group_size": group, "tile_size_output": 16,
              "num_aie_columns": 2}
    one = cpu.load(OneStep(GEMV, fields).record_like([w, x[0]]))
    rows = np.stack([one.run([w, row])[0] for row in x])
    for batches in (2, 3, 9):
        out = cpu.load(OneStep(GEMV, fields).record_like([w, x[:batches]])).run([w, x[:batches]])[0]
        assert np.array_equal(out.view(np.uint16), rows[:batches].view(np.uint16)), batches


@pytest.mark.parametrize("fmt", ["q4_k", "q6_k"])
def test_k_quant_blocks_of_llama_cpps_quantizer_dequantize_like_gguf_and_llama_cpp(fmt):
    """Blocks made by llama.cpp's own quantizer (quantize_row_q4_K_ref / q6_K_ref, in the
    llama.cpp library of the test extra's xllamacpp wheel) from float rows of very different
    magnitudes: our dequantization equals gguf's and llama.cpp's dequantize_row_* bit for bit,
    and the GEMV on them agrees with the reference."""
    import importlib.util

    spec = importlib.util.find_spec("xllamacpp.xllamacpp") if importlib.util.find_spec(
        "xllamacpp") else None
    if spec is None:
        pytest.skip("needs the test extra's xllamacpp (llama.cpp's library)")
    lib = ctypes.CDLL(spec.origin)
    name = fmt[:-1] + "K"
    rng = np.random.default_rng(14)
    x = (rng.standard_normal((32, 512)) * rng.uniform(1e-3, 2, (32, 1))).astype(np.float32)
    blocks = np.zeros((32, quant.row_bytes(fmt, 512, 256)), np.uint8)
    theirs = np.zeros_like(x)
    for fn, args in ((f"quantize_row_{name}_ref", (x, blocks)),
                     (f"dequantize_row_{name}", (blocks, theirs))):
        getattr(lib, fn).argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
        getattr(lib, fn)(args[0].ctypes.data, args[1].ctypes.data, x.size)
    ours = quant.dequantize(fmt, blocks, 512, 256)
    assert np.array_equal(ours.view(np.uint32), theirs.view(np.uint32))
    gguf_values = gguf_dequantize(blocks, getattr(gguf.GGMLQuantizationType, fmt.upper()))
    assert np.array_equal(ours.view(np.uint32), gguf_values.astype(np.float32).view(np.uint32))
    assert np.abs(ours - x).max() <= 0.1 * np.abs(x).max()  # they are x's blocks
    w = quant.tile(fmt, blocks, 512, 256)
    v = rng.standard_normal((3, 512)).astype(iron.bfloat16)
    program = OneStep(GEMV, {"weight_format": fmt, "group_size": 256}).record_like([w, v])
    assert_close("GEMV", cpu.load(program).run([w, v])[0], program.reference([w, v])[0])


@pytest.mark.parametrize("fmt", ["q4_1", "q8_0"])
def test_quantized_gemv_rows_do_not_depend_on_the_batch_or_who_rounds_x(fmt):
    """Up to 4 vectors (decode's batches) every thread rounds all of x itself, without a
    barrier; more are shared out among the threads: either way a vector's outputs are the bits
    the 1-vector GEMV gives it, with 1 and 2 threads."""
    rng = np.random.default_rng(13)
    k = 96
    w = quant.tile(fmt, quant.random_matrix(fmt, 64, k, 32, rng), k, 32)
    x = rng.standard_normal((5, k)).astype(iron.bfloat16)
    fields = {"weight_format": fmt, "group_size": 32, "tile_size_output": 16}
    one = cpu.load(OneStep(GEMV, {**fields, "num_aie_columns": 1}).record_like([w, x[0]]))
    rows = np.stack([one.run([w, row])[0] for row in x])
    for batches in (4, 5):
        for threads in (1, 2):
            program = OneStep(GEMV, {**fields, "num_aie_columns": threads}).record_like(
                [w, x[:batches]])
            out = cpu.load(program).run([w, x[:batches]])[0]
            assert np.array_equal(out.view(np.uint16), rows[:batches].view(np.uint16)), \
                (batches, threads)
