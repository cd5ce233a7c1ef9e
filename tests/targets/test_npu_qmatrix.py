"""The npu designs of GEMV and GEMM over block-quantized weights (iron/targets/npu/qmatrix.py,
iron/kernels/npu/qmatrix.cc): emulated against the operators' reference at every legal
setting of small shapes in every format, verified against mlir-aie's op definitions, their
descriptors, bounds and memory refusals."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import iron
from iron.operators import GEMM, GEMV
from iron.quant import row_bytes
from iron.resolution import legal_settings, resolve
from iron.targets import npu, target_for
from iron.targets.npu.bds import allocate
from iron.targets.npu.ir import Call, Iv, Loop
from iron.targets.npu.emulator import EmulationError, emulate_design
from iron.targets.npu.mlir import render
from iron.targets.npu.resources import resources
from iron.targets.npu.verify import check_text
from opcases import OneStep, assert_close, case_inputs
from test_npu import MLIR_OPT, host_cores, mlir_opt, with_calls_unregistered

#: Every format and group size the cpu runs, GEMV with one and several vectors, GEMM with K
#: split into tiles and M into blocks.
CASES = [
    ("GEMV", {"M": 32, "K": 64, "batches": 1, "weight_format": "q4_1"}),
    ("GEMV", {"M": 32, "K": 96, "batches": 3, "weight_format": "q4_0"}),
    ("GEMV", {"M": 32, "K": 64, "batches": 2, "weight_format": "q8_0"}),
    ("GEMV", {"M": 32, "K": 64, "batches": 1, "weight_format": "uint4", "group_size": 32}),
    ("GEMV", {"M": 32, "K": 256, "batches": 2, "weight_format": "uint4", "group_size": 128}),
    ("GEMM", {"M": 8, "K": 128, "N": 32, "weight_format": "q4_1"}),
    ("GEMM", {"M": 7, "K": 64, "N": 48, "weight_format": "q8_0"}),
    ("GEMM", {"M": 8, "K": 64, "N": 32, "weight_format": "q4_0"}),
    ("GEMM", {"M": 4, "K": 256, "N": 16, "weight_format": "uint4", "group_size": 128}),
    ("GEMV", {"M": 32, "K": 64, "batches": 2, "weight_format": "q8_0",
              "output_dtype": "float32"}),  # a quantized head's float32 logits
]
IDS = [f"{n}-{s['weight_format']}-{i}" for i, (n, s) in enumerate(CASES)]


def settings_of(name, shape, dev):
    rng = np.random.default_rng(len(name) + sum(map(ord, dev)))
    cls, fields, inputs = case_inputs(name, shape, rng)
    op = OneStep(cls, fields, dev).record_like(inputs).ops[0]
    return cls, fields, inputs, op, legal_settings(op, dev)


@pytest.mark.parametrize("dev", ("npu1", "npu2"))
@pytest.mark.parametrize("name,shape", CASES, ids=IDS)
def test_emulation_matches_the_reference_at_every_legal_setting(dev, name, shape):
    """Each setting's design is loaded once and dispatched twice on different data (the
    cores keep looping); the reference rounds x to int8 codes per 16 values as the kernel."""
    cls, fields, inputs, op, settings = settings_of(name, shape, dev)
    assert len(settings) >= 2, f"{name} on {dev}: only {settings} legal"
    again = case_inputs(name, shape, np.random.default_rng(99))[2]
    for setting in settings:
        graph = OneStep(cls, {**fields, **setting}, dev)
        assert npu.design_of(graph.record_like(inputs).ops[0], dev).kernel_source == "qmatrix.cc"
        exe = target_for(graph.device).emulated().load(graph.record_like(inputs))
        for xs in (inputs, again):
            assert_close(name, exe.run(xs)[0], graph.reference(*xs))


#: The bf16 outputs: rounded once, they are the cpu's bits; a float32 output keeps the last
#: bits that the order of the float additions changes (the emulation test bounds it).
ROUNDED = [(i, case) for i, case in zip(IDS, CASES) if "output_dtype" not in case[1]]


@pytest.mark.parametrize("dev", ("npu1", "npu2"))
@pytest.mark.parametrize("name,shape", [case for _, case in ROUNDED], ids=[i for i, _ in ROUNDED])
def test_emulated_results_are_the_cpu_kernels_bits(dev, name, shape):
    """Same integer sums and float steps as kernels/cpu/qmatmul.h, an independent
    implementation: the emulated design's bf16 output is the cpu target's, bit for bit (the
    README says so)."""
    cls, fields, inputs = case_inputs(name, shape, np.random.default_rng(5))
    cpu = np.asarray(OneStep(cls, fields, "cpu")(*inputs))
    emulated = np.asarray(OneStep(cls, fields, dev).emulate(*inputs))
    differ = np.flatnonzero(emulated.view(np.uint16) != cpu.view(np.uint16))
    assert differ.size == 0, f"{differ.size} of {cpu.size} outputs differ from the cpu's"


def qgemv(**kw) -> GEMV:
    base = dict(M=64, K=64, batches=1, weight_format="q4_1", group_size=32, tile_size_input=16,
                tile_size_output=16, num_aie_columns=1)
    return resolve(GEMV(**{**base, **kw}), "npu2")


def weight_inputs(design, rng):
    """Random bytes for the weight (any bytes are codes and fp16 parameters; the check is on
    memory accesses, not values), bf16 normals for x."""
    out = []
    for a in design.args:
        if a.dtype == "u8":
            w = rng.integers(0, 256, a.numel, dtype=np.uint8)
            w.view(np.uint16)[:] &= 0x3bff  # finite fp16 parameters
            out.append(w)
        else:
            out.append(rng.standard_normal(a.numel).astype(iron.bfloat16))
    return out


def with_arg(d, function, index, value):
    """``d`` with argument ``index`` of every call of ``function`` set to ``value``."""
    def patch(body):
        out = []
        for op in body:
            if isinstance(op, Loop):
                op = dataclasses.replace(op, body=patch(op.body))
            elif isinstance(op, Call) and op.function == function:
                op = dataclasses.replace(op, args=op.args[:index] + (value,) + op.args[index + 1:])
            out.append(op)
        return tuple(out)

    return dataclasses.replace(d, cores=tuple(dataclasses.replace(c, body=patch(c.body))
                                              for c in d.cores))


def test_a_kernel_told_a_longer_k_than_its_tile_is_caught():
    """qmatrix_q4_1 told k=96 on a 64-value tile goes a group past what it holds: its first
    access there, the x codes of value 64 of a 64-code buffer, is named by the host AIE API's
    bounds check."""
    d = npu.design_of(qgemv(), "npu2")
    lib = host_cores()
    emulate_design(d, weight_inputs(d, np.random.default_rng(0)), lib)
    bad = with_arg(d, "qmatrix_q4_1", 5, 96)
    with pytest.raises(EmulationError, match=r"kernel qmatrix_q4_1 on core tile \(0, 2\) "
                       r"accessed memory outside the buffers it was given: load_v of 16 bytes "
                       r"at byte 64 of xq_0 \(64 bytes long\)"):
        emulate_design(bad, weight_inputs(bad, np.random.default_rng(0)), lib)


def test_an_output_tile_one_too_far_is_caught():
    d = npu.design_of(qgemv(tile_size_output=32), "npu2")
    bad = with_arg(d, "qmatrix_store", 4, Iv(0, 32))
    with pytest.raises(EmulationError, match=r"qmatrix_store on core tile \(0, 2\) accessed "
                       r"memory outside .*store_v of 32 bytes at byte 64 of y_0\[\d\] \(64 bytes long\)"):
        emulate_design(bad, weight_inputs(bad, np.random.default_rng(0)), host_cores())


def test_transfers_carry_whole_blocks_and_words():
    """The weight arrives a 16-row tile of whole groups per element, as the bundle stores it
    (the column's rows contiguous), and every access pattern is whole 32-bit words."""
    op = resolve(GEMM(M=8, K=1536, N=64, weight_format="q4_1", group_size=32, tile_m=8,
                      tile_k=512, tile_n=32, num_aie_columns=2), "npu2")
    d = npu.design_of(op, "npu2")
    w = d.fifo("W_0")
    assert (w.dtype, w.nbytes) == ("u8", 16 * row_bytes("q4_1", 512, 32))
    tr = [t for t in d.sequence[0] if t.fifo == "W_1"][0]
    assert tr.pattern.offset == 32 * row_bytes("q4_1", 1536, 32)
    assert tr.pattern.numel == 32 * row_bytes("q4_1", 1536, 32)
    assert tr.pattern.sizes[-1] % 4 == 0 and tr.pattern.sizes[-1] // 4 <= 1023


def test_a_tile_that_does_not_fit_l1_is_refused_with_the_figures():
    """A GEMV of K = 8192 in q8_0: two 16-row tiles of the whole row are 2 x 139264 bytes."""
    with pytest.raises(iron.ResolveError, match=r"L1 of core tile \(0, 2\): x_0 2 x 16384 B \+ "
                       r"W_0 2 x 139264 B \+ y_0 2 x 32 B \+ xq_0 8192 B .* <= 65536 B \(64 KiB\) "
                       r"of data memory on npu2"):
        qgemv(M=16, K=8192, weight_format="q8_0")


def test_every_design_verifies_and_fits_the_shim_descriptors():
    """The generic form of one design per case and device passes xDSL against mlir-aie's op
    definitions (and Debian's mlir-opt, when installed); at most 16 BDs per shim tile."""
    texts = []
    for dev in ("npu1", "npu2"):
        for name, shape in CASES:
            op = settings_of(name, shape, dev)[3]
            for setting in legal_settings(op, dev)[:2]:
                d = npu.design_of(dataclasses.replace(op, **setting), dev)
                plan = allocate(d, resources(dev).shim_bds)
                assert plan.overflow is None and max(plan.peak.values()) <= 16
                text = render(d, generic=True)
                check_text(text)
                texts.append(text)
    assert "memref<640xi8>" in texts[0]  # the weight's bytes, a q4_1 tile of K = 64
    if MLIR_OPT:
        full = mlir_opt("\n// -----\n".join(with_calls_unregistered(t) for t in texts))
        assert full.returncode == 0, full.stderr[:2000]


@pytest.mark.parametrize("fmt", ["q4_k", "q6_k"])
def test_a_k_quant_matrix_has_no_design_and_is_placed_on_the_host(fmt):
    """qmatrix.cc has no K-quant kernel: such a GEMV runs on the host, never as a bf16 design."""
    op = GEMV(M=32, K=256, batches=1, weight_format=fmt, group_size=256, tile_size_input=16,
              tile_size_output=16, num_aie_columns=1)
    npu2 = target_for(iron.device("npu2"))
    assert npu2.placement(op) == "host" and npu2.cost(op) is None
