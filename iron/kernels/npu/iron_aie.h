// What every npu core kernel includes: the AIE API itself when Peano compiles the kernel for a
// core (__AIE_ARCH__ is defined), its host implementation (aie_api_host.h) when the host
// compiler builds the same source for the emulator.  Kernels take whole FIFO elements
// (buffers) and sizes as arguments, as the functions an mlir-aie design calls with func.call
// do, and touch memory only through aie::load_v / aie::store_v, except for scalar results.
#ifndef IRON_AIE_H
#define IRON_AIE_H
#include <stdint.h>
#if defined(__AIE_ARCH__)
#include <aie_api/aie.hpp>
#else
#include "aie_api_host.h"
#endif

// bf16 lanes of one vector operation in the element-wise and row-wise kernels: 16 (a 256-bit
// vector), the width of mlir-aie's aie_kernels/aie2/add.cc, silu.cc and aie2p/rms_norm.cc.
constexpr unsigned IRON_LANES = 16;

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
#endif
