// What every npu core kernel includes: the AIE API itself when Peano compiles the kernel for a
// core (__AIE_ARCH__ is defined), its host implementation (aie_api_host.h) when the host
// compiler builds the same source for the emulator.  Kernels take whole FIFO elements
// (buffers) and sizes as arguments, as the functions an mlir-aie design calls with func.call
// do, and touch memory only through aie::load_v / aie::store_v, except for scalar results.
//
// IRON_AIE_ARCH is the architecture a kernel is built for, with the values of __AIE_ARCH__:
// 20 for AIE2 (npu1), 21 for AIE2P (npu2).  Where the device API differs between the two,
// the helpers below (and the kernels) choose by it: the exponential (a lookup table on AIE2,
// the exp2 instruction on AIE2P) and the GEMM's MMUL shape (gemm.cc).
#ifndef IRON_AIE_H
#define IRON_AIE_H
#include <stdint.h>
#if defined(__AIE_ARCH__)
#define IRON_AIE_ARCH __AIE_ARCH__
#include <aie_api/aie.hpp>
#if IRON_AIE_ARCH == 20
#include <lut_based_ops.h>
#endif
#else
#include "aie_api_host.h"
#endif

// bf16 lanes of one vector operation in the element-wise and row-wise kernels: 16 (a 256-bit
// vector), the width of mlir-aie's aie_kernels/aie2/add.cc, silu.cc and aie2p/rms_norm.cc.
constexpr unsigned IRON_LANES = 16;

// Loop annotations as mlir-aie's aie_kernels/aie_kernel_utils.h spells them: for Chess the
// attributes, for Peano (clang) the loop pragma; nothing on the host.  IRON_PIPELINED marks
// a loop for software pipelining, IRON_MIN_ITERATIONS(n) promises at least n trips (the
// kernels promise only what the designs' legality rules guarantee).
#define IRON_PRAGMA(x) _Pragma(#x)
#if defined(__chess__)
#define IRON_PIPELINED [[chess::prepare_for_pipelining]]
#define IRON_MIN_ITERATIONS(n) [[chess::min_loop_count(n)]]
#elif defined(__AIE_ARCH__)
#define IRON_PIPELINED
#define IRON_MIN_ITERATIONS(n) IRON_PRAGMA(clang loop min_iteration_count(n))
#else
#define IRON_PIPELINED
#define IRON_MIN_ITERATIONS(n)
#endif

// One scalar of a buffer the kernel was given (a position, a running maximum): a plain load or
// store on a core, checked against the call's buffers on the host like aie::load_v / store_v.
template <typename T>
inline T iron_load(const T *p) {
#if !defined(__AIE_ARCH__)
    iron_npu_check_access(p, (int64_t)sizeof(T), "scalar load");
#endif
    return *p;
}

template <typename T>
inline void iron_store(T *p, T x) {
#if !defined(__AIE_ARCH__)
    iron_npu_check_access(p, (int64_t)sizeof(T), "scalar store");
#endif
    *p = x;
}

// bf16 lanes widened to float (exact), through an accumulator: the API multiplies only
// operands of one element type, so a bf16 vector meets a float one only widened.
inline aie::vector<float, IRON_LANES> iron_widen(const aie::vector<bfloat16, IRON_LANES> &x) {
    aie::accum<accfloat, IRON_LANES> acc;
    acc.from_vector(x);
    return acc.template to_vector<float>();
}

// e^x, rounded to bf16, of IRON_LANES float lanes.  AIE2: x rounded to bf16, clamped to
// [-128, 127] (the lookup's fixed-point range; e^-128 is zero in bf16 and e^88 already its
// largest table entry), then the lookup-table exponential of mlir-aie's
// aie_kernels/aie2/softmax.cc (getExpBf16).  AIE2P: exp2(x log2 e) with the API's exp2, as
// mlir-aie's aie_kernels/aie2p/softmax.cc computes it.
inline aie::vector<bfloat16, IRON_LANES> iron_exp(const aie::vector<float, IRON_LANES> &x) {
#if IRON_AIE_ARCH == 20
    aie::vector<float, IRON_LANES> clamped =
        aie::min(aie::max(x, aie::broadcast<float, IRON_LANES>(-128.0f)),
                 aie::broadcast<float, IRON_LANES>(127.0f));
    aie::accum<accfloat, IRON_LANES> acc;
    acc.from_vector(clamped);
    aie::accum<accfloat, IRON_LANES> e(getExpBf16(acc.template to_vector<bfloat16>()));
    return e.template to_vector<bfloat16>();
#else
    constexpr float kLog2e = 1.44269504088896f;
    return aie::exp2<bfloat16>(aie::mul(x, kLog2e).template to_vector<float>());
#endif
}
#endif
