"""The npu core kernels per architecture, and the host AIE API header's refusals.

Small C++ snippets are compiled against ``iron_aie.h`` (the host implementation of the AIE API)
for AIE2 (``IRON_AIE_ARCH=20``, npu1) and AIE2P (21, npu2): each form the device API does not
offer must fail to compile with the header's message, and its legal counterpart must compile,
so the emulator never runs a kernel Peano would refuse.  The AIE2 lookup-table exponential is
checked against entries of mlir-aie's published tables (``aie_runtime_lib/AIE2/
lut_based_ops.cpp``: ``exp_ilut_ab`` holds bf16(e^i) by the integer part's byte,
``exp_flut_ab`` bf16(e^(f/256)) by the fraction's; each logical entry is stored twice per
8-entry group there) and against e^x.
"""

import ctypes
import shutil
import subprocess
import textwrap

import numpy as np
import pytest

import iron
from iron.targets import target_for
from iron.targets.npu.kernels import SOURCE_DIR

CXX = shutil.which("c++") or shutil.which("g++")
pytestmark = pytest.mark.skipif(CXX is None, reason="no host C++ compiler (install g++)")
AIE2, AIE2P = 20, 21


def compile_snippet(body: str, arch: int | None, tmp_path, run: bool = False):
    """Compile ``body`` (statements inside a function) with the host header for ``arch``;
    the compiler's result, or with ``run`` the program's output."""
    source = tmp_path / "snippet.cc"
    source.write_text('#include "iron_aie.h"\n#include <cstdio>\n'
                      f"int main() {{\n{textwrap.indent(textwrap.dedent(body), '    ')}\n"
                      "    return 0;\n}\n")
    flags = [] if arch is None else [f"-DIRON_AIE_ARCH={arch}"]
    if not run:
        return subprocess.run([CXX, "-std=c++17", "-fsyntax-only", *flags, f"-I{SOURCE_DIR}",
                               str(source)], capture_output=True, text=True)
    exe = tmp_path / "snippet"
    built = subprocess.run([CXX, "-std=c++17", "-O1", *flags, f"-I{SOURCE_DIR}", str(source),
                            str(SOURCE_DIR / "bounds.cc"), "-o", str(exe), "-lm"],
                           capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    return subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout


V16 = "aie::vector<bfloat16, 16> b = aie::zeros<bfloat16, 16>();\n"
F16 = "aie::vector<float, 16> f = aie::zeros<float, 16>();\n"
A32 = "aie::vector<bfloat16, 32> a = aie::zeros<bfloat16, 32>();\n"

#: (what, the illegal form, its legal counterpart, architectures, the header's message)
CASES = [
    ("a 64-bit bf16 vector", "aie::vector<bfloat16, 4> v = aie::zeros<bfloat16, 4>();",
     "aie::vector<bfloat16, 8> v = aie::zeros<bfloat16, 8>();", (AIE2, AIE2P),
     "must be 128, 256, 512 or 1024 bits"),
    ("a 2048-bit float vector", "aie::vector<float, 64> v;", "aie::vector<float, 32> v;",
     (AIE2, AIE2P), "must be 128, 256, 512 or 1024 bits"),
    ("a 4-lane float accumulator", "aie::accum<accfloat, 4> acc;", "aie::accum<accfloat, 8> acc;",
     (AIE2, AIE2P), "must have 8, 16 or 32 lanes"),
    ("a bf16 vector times a float scalar", V16 + "auto r = aie::mul(b, 2.0f);",
     V16 + "auto r = aie::mul(b, bfloat16(2.0f));", (AIE2, AIE2P), "same element type"),
    ("a bf16 vector times a float vector", V16 + F16 + "auto r = aie::mul(b, f);",
     V16 + F16 + "auto r = aie::mul(iron_widen(b), f);", (AIE2, AIE2P), "same element type"),
    ("a bf16 x float MAC", V16 + "auto acc = aie::zeros<accfloat, 16>();\n"
     "acc = aie::mac(acc, b, 0.5f);", V16 + "auto acc = aie::zeros<accfloat, 16>();\n"
     "acc = aie::mac(acc, iron_widen(b), 0.5f);", (AIE2, AIE2P), "same element type"),
    ("from_vector chained on a temporary accumulator",
     V16 + "auto w = aie::accum<accfloat, 16>().from_vector(b).to_vector<float>();",
     V16 + "aie::accum<accfloat, 16> t;\nt.from_vector(b);\nauto w = t.to_vector<float>();",
     (AIE2, AIE2P), "void"),
    ("aie::exp2 on AIE2", F16 + "auto e = aie::exp2<bfloat16>(f);",
     F16 + "auto e = iron_exp(f);", (AIE2,), "exists on AIE2P (npu2) only"),
    ("AIE2's bf16 4x8x4 MMUL on AIE2P", A32 + "aie::mmul<4, 8, 4, bfloat16, bfloat16, accfloat> m;"
     "\nm.mac(a, aie::zeros<bfloat16, 32>());", "aie::mmul<4, 8, 8, bfloat16, bfloat16, "
     "accfloat> m;\nm.mac(aie::zeros<bfloat16, 32>(), aie::zeros<bfloat16, 64>());", (AIE2P,),
     "not an MMUL of the architecture"),
    ("AIE2's int8 x int4 MMUL on AIE2P", "aie::mmul<4, 16, 8, int8, int4, acc32> m;",
     "aie::mmul<8, 8, 8, int8, int8, acc32> m;", (AIE2P,), "not an MMUL of the architecture"),
    ("a 64-bit int4 vector", "aie::vector<int4, 16> v;", "aie::vector<int4, 32> v;",
     (AIE2, AIE2P), "must be 128, 256, 512 or 1024 bits"),
    ("AIE2P's bf16 4x8x8 MMUL on AIE2", "aie::mmul<4, 8, 8, bfloat16, bfloat16, accfloat> m;",
     "aie::mmul<4, 8, 4, bfloat16, bfloat16, accfloat> m;", (AIE2,),
     "not an MMUL of the architecture"),
]


@pytest.mark.parametrize("what,bad,good,archs,message", CASES, ids=[c[0] for c in CASES])
def test_the_host_api_refuses_what_the_device_api_does_not_offer(what, bad, good, archs,
                                                                 message, tmp_path):
    for arch in archs:
        refused = compile_snippet(bad, arch, tmp_path)
        assert refused.returncode != 0, f"{what} compiled for arch {arch}"
        assert message in refused.stderr, refused.stderr[-2000:]
        accepted = compile_snippet(good, arch, tmp_path)
        assert accepted.returncode == 0, f"arch {arch}:\n{accepted.stderr[-2000:]}"


def test_the_host_header_needs_an_architecture(tmp_path):
    result = compile_snippet("", None, tmp_path)
    assert result.returncode != 0 and "-DIRON_AIE_ARCH=20 (AIE2) or 21 (AIE2P)" in result.stderr
    assert compile_snippet("", AIE2P, tmp_path).returncode == 0


#: Logical entries of mlir-aie's AIE2 exponential tables (aie_runtime_lib/AIE2/
#: lut_based_ops.cpp), as (byte, bf16 bits): e^i by the integer part's byte (i < 0 as
#: 256 + i; e^89 and above saturate at e^88; e^-89 and below are bf16 subnormals, then 0) ...
WHOLE = [(0, 16256), (1, 16430), (2, 16620), (7, 17545), (88, 32505), (89, 32505),
         (127, 32505), (128, 0), (164, 1), (166, 9), (167, 24), (168, 66), (255, 16060)]
#: ... and e^(f / 256) by the fraction's byte.
FRACTION = [(0, 16256), (1, 16257), (2, 16257), (7, 16260), (128, 16339), (255, 16429)]


def test_the_aie2_exponential_tables_are_mlir_aies(tmp_path):
    out = compile_snippet("""
        for (int b = 0; b < 256; b++)
            std::printf("%d %d\\n", iron_lut::tables().whole[b], iron_lut::tables().fraction[b]);
    """, AIE2, tmp_path, run=True)
    table = np.array([line.split() for line in out.splitlines()], dtype=np.int64)
    assert [(b, table[b, 0]) for b, _ in WHOLE] == WHOLE
    assert [(b, table[b, 1]) for b, _ in FRACTION] == FRACTION


def test_the_aie2_exponential_is_e_to_the_x_within_bf16_rounding(tmp_path):
    """getExpBf16 on 16 lanes at a time over bf16 values in [-30, 30): within 3 bf16 steps of
    e^x (x is floored to 1/256, the two entries are rounded); iron_exp clamps what the
    fixed-point lookup would wrap."""
    xs = np.linspace(-30, 30, 640, endpoint=False, dtype=np.float32)
    xs = xs.astype(iron.bfloat16).astype(np.float32)  # the bf16 values the kernel sees
    out = compile_snippet(f"""
        const float xs[] = {{{", ".join(f"{float(x)!r}f" for x in xs)}}};
        for (unsigned i = 0; i < {len(xs)}; i += 16) {{
            aie::vector<bfloat16, 16> v;
            for (unsigned j = 0; j < 16; j++) v.set(bfloat16(xs[i + j]), j);
            aie::vector<float, 16> e = getExpBf16(v).to_vector<float>();
            for (unsigned j = 0; j < 16; j++) std::printf("%.9g\\n", e.get(j));
        }}
        aie::vector<float, 16> wild = aie::broadcast<float, 16>(-3.0e38f);
        wild.set(-200.0f, 1);
        wild.set(500.0f, 2);
        aie::vector<bfloat16, 16> clamped = iron_exp(wild);
        std::printf("%.9g %.9g %.9g\\n", float(clamped.get(0)), float(clamped.get(1)),
                    float(clamped.get(2)));
        aie::vector<bfloat16, 16> raw;
        for (unsigned j = 0; j < 16; j++) raw.set(bfloat16(-200.0f), j);
        std::printf("%.9g\\n", getExpBf16(raw).to_vector<float>().get(0));
    """, AIE2, tmp_path, run=True).split()
    got = np.array(out[:len(xs)], dtype=np.float64)
    want = np.exp(xs.astype(np.float64))
    assert np.all(np.abs(got - want) <= 3 * 2.0 ** -8 * want), np.max(np.abs(got / want - 1))
    low, very_low, high = (float(v) for v in out[len(xs):len(xs) + 3])
    assert low == 0.0 and very_low == 0.0  # clamped to -128: e^-128 is 0 in bf16
    assert high == pytest.approx(np.exp(88.0), rel=2.0 ** -7)  # 127: the table's e^88
    assert float(out[-1]) > 1.0  # unclamped, -200 wraps to a positive power: what iron_exp avoids


def test_each_device_runs_its_own_architectures_kernels():
    """npu1's host cores take e^x from the AIE2 tables, npu2's from exp2: the softmax of one
    row differs between them, bit for bit, and both stay within bf16 rounding of the exact
    softmax."""
    x = (np.linspace(-6, 6, 64, dtype=np.float32)).astype(iron.bfloat16)
    want = np.exp(x.astype(np.float64) - x.astype(np.float64).max())
    want /= want.sum()
    results = {}
    for dev in ("npu1", "npu2"):
        target = target_for(iron.device(dev))
        lib = ctypes.CDLL(str(target.artifact(target.compile(target.recipe(None)))))
        out = np.zeros_like(x)
        lib.softmax_bf16(x.ctypes.data_as(ctypes.c_void_p), out.ctypes.data_as(ctypes.c_void_p),
                         ctypes.c_int32(1), ctypes.c_int32(64))
        got = out.astype(np.float64)
        # e^d with d = x - max rounded to bf16 on AIE2 (half a step of d: |d| 2^-9), floored
        # to 1/256 and two table entries, the sum and the scale: a few bf16 steps
        d = np.abs(x.astype(np.float64) - x.astype(np.float64).max())
        assert np.all(np.abs(got - want) <= (d + 5) * 2.0 ** -8 * want), dev
        results[dev] = out.view(np.uint16)
    assert not np.array_equal(results["npu1"], results["npu2"])


def host_library(dev: str) -> ctypes.CDLL:
    target = target_for(iron.device(dev))
    return ctypes.CDLL(str(target.artifact(target.compile(target.recipe(None)))))


def pointer(a: np.ndarray) -> ctypes.c_void_p:
    return a.ctypes.data_as(ctypes.c_void_p)


#: The quantized formats the kernels take: (4-bit code sets per chunk, a minimum per group).
QFORMATS = {"q4_0": (1, False), "q4_1": (1, True), "q8_0": (2, False), "uint4": (1, True)}


@pytest.mark.parametrize("dev", ("npu1", "npu2"))
def test_the_quantized_mmul_gives_each_vectors_lane_result_bit_for_bit(dev):
    """qmatrix.cc takes 4 or more vectors through the architecture's MMUL (AIE2 4x16x8, int8 x
    int4 for 4-bit codes, int8 x int8 for q8_0; AIE2P int8 8x8x8); its integer sums and float steps are those of one vector at a time, so 7
    vectors in one call (AIE2: an MMUL group of 4, then 3 alone; AIE2P: one group of 7) give
    each vector's own single-vector result, bit for bit, for every format."""
    lib = host_library(dev)
    rng = np.random.default_rng(7)
    k, group, vectors = 64, 32, 7
    x = rng.standard_normal((vectors, k)).astype(iron.bfloat16)
    xq = np.zeros((vectors, k), np.int8)
    dx, xs = np.zeros((vectors, 16), np.float32), np.zeros((vectors, 16), np.float32)
    lib.qmatrix_quantize(pointer(x), pointer(xq), pointer(dx), pointer(xs), k, vectors, group, 0)
    for fmt, (nib, has_min) in QFORMATS.items():
        group_bytes = nib * 256 + 2 * 16 * (1 + has_min)
        w = rng.integers(0, 256, (k // group, group_bytes), dtype=np.uint8)
        w[:, nib * 256:].view(np.uint16)[:] &= 0x3bff  # finite fp16 / bf16 parameters
        kernel = getattr(lib, f"qmatrix_{fmt}")
        for accumulate in (0, 1):
            start = rng.standard_normal((vectors, 16)).astype(np.float32)
            together = start.copy()
            kernel(pointer(w), pointer(xq), pointer(dx), pointer(xs), pointer(together), k,
                   vectors, group, 0, k, accumulate)
            for b in range(vectors):
                alone = start[b].copy()
                kernel(pointer(w), pointer(xq[b]), pointer(dx[b]), pointer(xs[b]),
                       pointer(alone), k, 1, group, 0, k, accumulate)
                assert np.array_equal(together[b].view(np.uint32), alone.view(np.uint32)), (
                    f"{fmt} on {dev}, vector {b}, accumulate {accumulate}")
            assert np.all(np.isfinite(together)) and np.any(together != start)
