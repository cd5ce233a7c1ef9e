// The subset of the AIE API (AMD's aie_api/aie.hpp, documented at
// https://xilinx.github.io/aie_api/) that iron's npu kernels use, implemented for the host so
// that the emulator runs the kernels' own source.  Only the semantics the kernels rely on are
// reproduced: element-wise arithmetic with float32 accumulators ("accfloat"), one rounding to
// bfloat16 (to nearest even) where the API converts an accumulator to a bf16 vector, lane
// reductions, and the MMUL of bf16 and int8 tiles; for the quantized matrix kernels
// (qmatrix.cc) int16 vectors with 32-bit integer accumulators ("acc32", exact), shifts and
// masks, lane filters, reinterpretation (cast_to), and conversions between float and fixed
// point.  Transcendental functions (exp2, inv, invsqrt) are computed in float32 and rounded to
// their result type; on the device they are approximations whose error is not modelled here.
// AIE2's lookup-table exponential (getExpBf16, below) is computed as the device does.
//
// Every vector load and store checks its address range against the buffers the running call
// was given (iron_npu_set_bounds, called by the emulator before each call): a kernel reading
// or writing outside them records the first violation, which iron_npu_violation returns.
//
// The header refuses at compile time (static_assert) what the device's API does not offer, so
// that the emulator never runs a kernel Peano would refuse: vectors other than 128, 256, 512
// or 1024 bits and accumulators other than 8, 16 or 32 lanes (AMD UG1603, "Supported Vector
// Data Types and Sizes"; UG1583, "Accumulator Data Types"); multiplications mixing element
// types (a bf16 vector times a float vector or scalar); aie::exp2 on AIE2, where the API has
// none (mlir-aie's aie_kernels/aie2 kernels use a lookup-table exponential instead); and an
// aie::mmul shape the architecture does not have.  IRON_AIE_ARCH names the architecture being
// emulated, with the values of the device compiler's __AIE_ARCH__: 20 for AIE2 (npu1), 21 for
// AIE2P (npu2).
#ifndef IRON_AIE_API_HOST_H
#define IRON_AIE_API_HOST_H

#if !defined(IRON_AIE_ARCH) || (IRON_AIE_ARCH != 20 && IRON_AIE_ARCH != 21)
#error "build the npu kernels for the host with -DIRON_AIE_ARCH=20 (AIE2) or 21 (AIE2P)"
#endif

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <type_traits>

extern "C" {
void iron_npu_set_bounds(int32_t n, const void *const *bases, const int64_t *sizes);
const char *iron_npu_violation(void);
void iron_npu_check_access(const void *p, int64_t bytes, const char *what);
}

struct bfloat16 {
    uint16_t bits;
    bfloat16() = default;
    bfloat16(float f) { bits = round(f); }
    operator float() const {
        uint32_t u = (uint32_t)bits << 16;
        float f;
        std::memcpy(&f, &u, 4);
        return f;
    }
    static uint16_t round(float f) {  // to nearest even; NaN stays NaN
        uint32_t u;
        std::memcpy(&u, &f, 4);
        if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
        u += 0x7fffu + ((u >> 16) & 1u);
        return (uint16_t)(u >> 16);
    }
};

// The AIE compiler's names of the integer element types.
using int8 = int8_t;
// A signed 4-bit lane (-8 .. 7), one per byte on the host; vectors of it count 4 bits a lane.
struct int4 {
    int8_t value;
    int4() = default;
    explicit int4(int x) : value(int8_t(x)) {}
    operator int() const { return value; }
};
using uint8 = uint8_t;
using int16 = int16_t;
using uint16 = uint16_t;
using int32 = int32_t;
using uint32 = uint32_t;

struct accfloat {};
struct acc32 {};

namespace aie {

// Bits of one lane of an element type.
template <typename T>
constexpr unsigned lane_bits() {
    return std::is_same<T, int4>::value ? 4 : unsigned(sizeof(T) * 8);
}

template <typename T, unsigned N>
struct vector {
    static_assert(lane_bits<T>() * N == 128 || lane_bits<T>() * N == 256 ||
                      lane_bits<T>() * N == 512 || lane_bits<T>() * N == 1024,
                  "aie::vector<T, N> must be 128, 256, 512 or 1024 bits (bf16: 8, 16, 32 or "
                  "64 lanes; float and int32: 4 to 32; int8: 16 to 128)");
    T v[N];
    static constexpr unsigned size() { return N; }
    T get(unsigned i) const { return v[i]; }
    void set(T x, unsigned i) { v[i] = x; }
    T operator[](unsigned i) const { return v[i]; }
    // Lanes idx * M .. (idx + 1) * M - 1 as a vector of their own.
    template <unsigned M>
    vector<T, M> extract(unsigned idx) const {
        static_assert(N % M == 0, "extract takes whole parts of the vector");
        vector<T, M> r;
        std::memcpy(r.v, v + idx * M, sizeof(r.v));
        return r;
    }
    // The same bits as a vector of another element type (the register reinterpreted).
    template <typename U>
    vector<U, N * sizeof(T) / sizeof(U)> cast_to() const {
        static_assert((N * sizeof(T)) % sizeof(U) == 0, "cast_to keeps the vector's bits");
        vector<U, N * sizeof(T) / sizeof(U)> r;
        std::memcpy(r.v, v, sizeof(v));
        return r;
    }
};

// accfloat lanes hold float32; acc32 lanes a 32-bit integer sum (kept exactly: the kernels'
// sums stay far inside its range).
template <typename Tag, unsigned N>
struct accum {
    // 8 to 32 lanes (UG1583); AIE2P's int8 8x8x8 MMUL (mlir-aie's aie_kernels/aie2p/mm.cc)
    // fills 64 acc32 lanes
    static_assert(N == 8 || N == 16 || N == 32 ||
                      (IRON_AIE_ARCH == 21 && N == 64 && std::is_same<Tag, acc32>::value),
                  "aie::accum<accfloat or acc32, N> must have 8, 16 or 32 lanes");
    using value_type = typename std::conditional<std::is_same<Tag, acc32>::value, int64_t,
                                                 float>::type;
    value_type v[N];
    template <typename T>
    vector<T, N> to_vector() const {
        vector<T, N> r;
        for (unsigned i = 0; i < N; i++) r.v[i] = T(v[i]);
        return r;
    }
    // Lanes idx * M .. (idx + 1) * M - 1 as an accumulator of their own.
    template <unsigned M>
    accum<Tag, M> extract(unsigned idx) const {
        static_assert(N % M == 0, "extract takes whole parts of the accumulator");
        accum<Tag, M> r;
        for (unsigned i = 0; i < M; i++) r.v[i] = v[idx * M + i];
        return r;
    }
    // Returns nothing, as on the device: it cannot be chained on a temporary accumulator.
    template <typename T>
    void from_vector(const vector<T, N> &x) {
        for (unsigned i = 0; i < N; i++) {
            if constexpr (std::is_same<T, bfloat16>::value)
                v[i] = value_type(float(x.v[i]));
            else
                v[i] = value_type(x.v[i]);
        }
    }
};

template <unsigned N, typename T>
vector<T, N> load_v(const T *p) {
    iron_npu_check_access(p, (int64_t)sizeof(T) * N, "load_v");
    vector<T, N> r;
    std::memcpy(r.v, p, sizeof(T) * N);
    return r;
}

template <typename T, unsigned N>
void store_v(T *p, const vector<T, N> &x) {
    iron_npu_check_access(p, (int64_t)sizeof(T) * N, "store_v");
    std::memcpy(p, x.v, sizeof(T) * N);
}

template <typename T, unsigned N>
vector<T, N> broadcast(T x) {
    vector<T, N> r;
    for (unsigned i = 0; i < N; i++) r.v[i] = x;
    return r;
}

template <typename T, unsigned N>
auto zeros() {
    if constexpr (std::is_same<T, accfloat>::value || std::is_same<T, acc32>::value) {
        accum<T, N> r;
        for (unsigned i = 0; i < N; i++) r.v[i] = 0;
        return r;
    } else {
        return broadcast<T, N>(T(0.0f));
    }
}

// Vector + vector, vector - vector: the result type of the inputs, one rounding (integers:
// exact, wrapping as the hardware's lanes do).
template <typename T, unsigned N>
vector<T, N> add(const vector<T, N> &a, const vector<T, N> &b) {
    vector<T, N> r;
    for (unsigned i = 0; i < N; i++) {
        if constexpr (std::is_integral<T>::value)
            r.v[i] = T((int64_t)a.v[i] + (int64_t)b.v[i]);
        else
            r.v[i] = T(float(a.v[i]) + float(b.v[i]));
    }
    return r;
}

template <typename T, unsigned N>
vector<T, N> sub(const vector<T, N> &a, const vector<T, N> &b) {
    vector<T, N> r;
    for (unsigned i = 0; i < N; i++) {
        if constexpr (std::is_integral<T>::value)
            r.v[i] = T((int64_t)a.v[i] - (int64_t)b.v[i]);
        else
            r.v[i] = T(float(a.v[i]) - float(b.v[i]));
    }
    return r;
}

// Integer lanes: arithmetic shift right / left by a constant, bitwise and / or.
template <typename T, unsigned N>
vector<T, N> downshift(const vector<T, N> &a, unsigned shift) {
    static_assert(std::is_integral<T>::value, "downshift takes integer lanes");
    vector<T, N> r;
    for (unsigned i = 0; i < N; i++) r.v[i] = T(a.v[i] >> shift);
    return r;
}

template <typename T, unsigned N>
vector<T, N> upshift(const vector<T, N> &a, unsigned shift) {
    static_assert(std::is_integral<T>::value, "upshift takes integer lanes");
    vector<T, N> r;
    using U = typename std::make_unsigned<T>::type;
    for (unsigned i = 0; i < N; i++) r.v[i] = T(U(U(a.v[i]) << shift));
    return r;
}

template <typename T, unsigned N>
vector<T, N> bit_and(const vector<T, N> &a, const vector<T, N> &b) {
    vector<T, N> r;
    for (unsigned i = 0; i < N; i++) r.v[i] = T(a.v[i] & b.v[i]);
    return r;
}

template <typename T, unsigned N>
vector<T, N> bit_or(const vector<T, N> &a, const vector<T, N> &b) {
    vector<T, N> r;
    for (unsigned i = 0; i < N; i++) r.v[i] = T(a.v[i] | b.v[i]);
    return r;
}

template <typename T, unsigned N>
vector<T, N> abs(const vector<T, N> &a) {
    vector<T, N> r;
    for (unsigned i = 0; i < N; i++) {
        if constexpr (std::is_same<T, bfloat16>::value)
            r.v[i].bits = (uint16_t)(a.v[i].bits & 0x7fffu);
        else
            r.v[i] = a.v[i] < T(0) ? T(-a.v[i]) : a.v[i];
    }
    return r;
}

// Lanes in groups of ``step``: the even groups, or the odd ones (half the lanes).
template <typename T, unsigned N>
vector<T, N / 2> filter_even(const vector<T, N> &a, unsigned step = 1) {
    vector<T, N / 2> r;
    for (unsigned i = 0; i < N / 2; i++) r.v[i] = a.v[i / step * 2 * step + i % step];
    return r;
}

template <typename T, unsigned N>
vector<T, N / 2> filter_odd(const vector<T, N> &a, unsigned step = 1) {
    vector<T, N / 2> r;
    for (unsigned i = 0; i < N / 2; i++) r.v[i] = a.v[i / step * 2 * step + step + i % step];
    return r;
}

// Fixed point <-> float: value * 2^-shift, and float * 2^shift rounded to nearest even
// (the mode the API documents for AIE-ML's emulated float-to-fixed conversion), saturated.
template <typename TR = float, typename T, unsigned N>
vector<TR, N> to_float(const vector<T, N> &a, int shift = 0) {
    static_assert(std::is_integral<T>::value, "to_float takes integer lanes");
    vector<TR, N> r;
    for (unsigned i = 0; i < N; i++) r.v[i] = TR(std::ldexp(double(a.v[i]), -shift));
    return r;
}

template <typename TR = int32_t, typename T, unsigned N>
vector<TR, N> to_fixed(const vector<T, N> &a, int shift = 0) {
    vector<TR, N> r;
    const double lo = double(std::numeric_limits<TR>::min());
    const double hi = double(std::numeric_limits<TR>::max());
    for (unsigned i = 0; i < N; i++) {
        double x = std::nearbyint(std::ldexp(double(float(a.v[i])), shift));
        r.v[i] = TR(x < lo ? lo : x > hi ? hi : x);
    }
    return r;
}

// Accumulator + vector (bf16 or float lanes): stays in the accumulator.
template <unsigned N, typename T>
accum<accfloat, N> add(const accum<accfloat, N> &a, const vector<T, N> &b) {
    static_assert(std::is_same<T, bfloat16>::value || std::is_same<T, float>::value,
                  "aie::add(accfloat accumulator, vector) takes bf16 or float lanes");
    accum<accfloat, N> r;
    for (unsigned i = 0; i < N; i++) r.v[i] = a.v[i] + float(b.v[i]);
    return r;
}

// The operand types of one floating-point multiplication: both bf16 or both float.  A bf16
// vector times a float (vector or scalar) is not an operation of the device's API: widen the
// bf16 operand to float first (exact), or round the float one to bf16.
template <typename T, typename U>
constexpr void check_float_operands() {
    static_assert(std::is_same<T, U>::value,
                  "aie::mul / aie::mac: both operands must have the same element type (no bf16 "
                  "x float): widen the bf16 operand to float first");
    static_assert(std::is_same<T, bfloat16>::value || std::is_same<T, float>::value,
                  "aie::mul / aie::mac into an accfloat accumulator take bf16 or float lanes");
}

// Multiplications return an accumulator (the products are exact in float32 for bf16 inputs).
template <typename T, typename U, unsigned N>
accum<accfloat, N> mul(const vector<T, N> &a, const vector<U, N> &b) {
    check_float_operands<T, U>();
    accum<accfloat, N> r;
    for (unsigned i = 0; i < N; i++) r.v[i] = float(a.v[i]) * float(b.v[i]);
    return r;
}

template <typename T, unsigned N, typename S>
accum<accfloat, N> mul(const vector<T, N> &a, S s) {
    check_float_operands<T, S>();
    accum<accfloat, N> r;
    for (unsigned i = 0; i < N; i++) r.v[i] = float(a.v[i]) * float(s);
    return r;
}

template <typename T, typename U, unsigned N>
accum<accfloat, N> mac(const accum<accfloat, N> &acc, const vector<T, N> &a,
                       const vector<U, N> &b) {
    check_float_operands<T, U>();
    accum<accfloat, N> r;
    for (unsigned i = 0; i < N; i++) r.v[i] = acc.v[i] + float(a.v[i]) * float(b.v[i]);
    return r;
}

template <typename T, unsigned N, typename S>
accum<accfloat, N> mac(const accum<accfloat, N> &acc, const vector<T, N> &a, S s) {
    check_float_operands<T, S>();
    accum<accfloat, N> r;
    for (unsigned i = 0; i < N; i++) r.v[i] = acc.v[i] + float(a.v[i]) * float(s);
    return r;
}

// int8 lanes widened to int16 (unpack) and int16 lanes narrowed to int8, saturating (pack).
template <unsigned N>
vector<int16_t, N> unpack(const vector<int8_t, N> &a) {
    vector<int16_t, N> r;
    for (unsigned i = 0; i < N; i++) r.v[i] = a.v[i];
    return r;
}

// int8 lanes narrowed to int4, saturating.
template <unsigned N>
vector<int4, N> pack(const vector<int8_t, N> &a) {
    vector<int4, N> r;
    for (unsigned i = 0; i < N; i++) r.v[i] = int4(a.v[i] < -8 ? -8 : a.v[i] > 7 ? 7 : a.v[i]);
    return r;
}

template <unsigned N>
vector<int8_t, N> pack(const vector<int16_t, N> &a) {
    vector<int8_t, N> r;
    for (unsigned i = 0; i < N; i++)
        r.v[i] = int8_t(a.v[i] < -128 ? -128 : a.v[i] > 127 ? 127 : a.v[i]);
    return r;
}

// Integer multiply-accumulate of int16 lanes into 32-bit integer lanes: exact.
template <unsigned N>
accum<acc32, N> mac(const accum<acc32, N> &acc, const vector<int16_t, N> &a,
                    const vector<int16_t, N> &b) {
    accum<acc32, N> r;
    for (unsigned i = 0; i < N; i++) r.v[i] = acc.v[i] + (int64_t)a.v[i] * (int64_t)b.v[i];
    return r;
}

template <typename T, unsigned N>
vector<T, N> max(const vector<T, N> &a, const vector<T, N> &b) {
    vector<T, N> r;
    for (unsigned i = 0; i < N; i++) r.v[i] = float(a.v[i]) > float(b.v[i]) ? a.v[i] : b.v[i];
    return r;
}

template <typename T, unsigned N>
vector<T, N> min(const vector<T, N> &a, const vector<T, N> &b) {
    vector<T, N> r;
    for (unsigned i = 0; i < N; i++) r.v[i] = float(a.v[i]) < float(b.v[i]) ? a.v[i] : b.v[i];
    return r;
}

// Lane reductions: summed in the order of a binary tree of halves, as a vector unit does.
template <typename T, unsigned N>
T reduce_add(const vector<T, N> &a) {
    float t[N];
    for (unsigned i = 0; i < N; i++) t[i] = float(a.v[i]);
    for (unsigned w = N / 2; w > 0; w /= 2)
        for (unsigned i = 0; i < w; i++) t[i] = t[i] + t[i + w];
    return T(t[0]);
}

template <typename T, unsigned N>
T reduce_max(const vector<T, N> &a) {
    T m = a.v[0];
    for (unsigned i = 1; i < N; i++)
        if (float(a.v[i]) > float(m)) m = a.v[i];
    return m;
}

// 2^x: an instruction of AIE2P only; AIE2 kernels take e^x from lookup tables (getExpBf16).
template <typename R, unsigned N>
vector<R, N> exp2(const vector<float, N> &a) {
    static_assert(IRON_AIE_ARCH == 21 && N > 0, "aie::exp2 exists on AIE2P (npu2) only: on "
                  "AIE2 use the lookup-table exponential getExpBf16, as mlir-aie's "
                  "aie_kernels/aie2/softmax.cc does");
    vector<R, N> r;
    for (unsigned i = 0; i < N; i++) r.v[i] = R(std::exp2(a.v[i]));
    return r;
}

inline float inv(float x) { return 1.0f / x; }

template <unsigned N>
vector<float, N> inv(const vector<float, N> &a) {
    vector<float, N> r;
    for (unsigned i = 0; i < N; i++) r.v[i] = 1.0f / a.v[i];
    return r;
}
inline float invsqrt(float x) { return 1.0f / std::sqrt(x); }

// The aie::mmul shapes M x K x N of each architecture, for the operand types iron uses.  AIE2
// (AIE-ML): the AIE API's table of matrix multiplication modes (AMD UG1529, "Matrix
// Multiplication"); AIE2P: the shapes of mlir-aie's aie_kernels/aie2p/mm.cc (bf16 4x8x8, int8
// 8x8x8, int16 4x4x8).  The bf16 shapes of the two do not overlap, so a kernel written for
// one architecture's MMUL does not build for the other.
template <unsigned M, unsigned K, unsigned N, typename TA, typename TB>
constexpr bool mmul_shape_exists() {
    constexpr bool bf16 = std::is_same<TA, bfloat16>::value && std::is_same<TB, bfloat16>::value;
    constexpr bool i8 = std::is_same<TA, int8_t>::value && std::is_same<TB, int8_t>::value;
    constexpr bool i8x4 = std::is_same<TA, int8_t>::value && std::is_same<TB, int4>::value;
    constexpr bool i16 = std::is_same<TA, int16_t>::value && std::is_same<TB, int16_t>::value;
    if (IRON_AIE_ARCH == 20) {
        if (bf16)
            return (M == 4 && K == 8 && N == 4) || (M == 8 && K == 8 && N == 4) ||
                   (M == 4 && K == 16 && N == 8) || (M == 8 && K == 8 && N == 8);
        if (i8)
            return (M == 4 && K == 8 && N == 4) || (M == 4 && K == 16 && N == 4) ||
                   (M == 8 && K == 8 && N == 4) || (M == 2 && K == 8 && N == 8) ||
                   (M == 4 && K == 8 && N == 8) || (M == 8 && K == 8 && N == 8) ||
                   (M == 1 && K == 16 && N == 8) || (M == 2 && K == 16 && N == 8) ||
                   (M == 4 && K == 16 && N == 8);
        if (i8x4)
            return (M == 4 && K == 16 && N == 8) || (M == 8 && K == 16 && N == 8) ||
                   (M == 4 && K == 32 && N == 8);
        if (i16)
            return (M == 4 && K == 4 && N == 4) || (M == 2 && K == 4 && N == 8) ||
                   (M == 4 && K == 4 && N == 8) || (M == 4 && K == 2 && N == 8) ||
                   (M == 8 && K == 2 && N == 8) || (M == 8 && K == 1 && N == 8);
        return false;
    }
    if (bf16) return M == 4 && K == 8 && N == 8;
    if (i8) return M == 8 && K == 8 && N == 8;
    if (i16) return M == 4 && K == 4 && N == 8;
    return false;
}

// One lane's value in the accumulator's type.
template <typename V, typename T>
V lane(const T &x) {
    if constexpr (std::is_same<T, int4>::value)
        return V(x.value);
    else
        return V(x);
}

// C (M x N) += A (M x K) * B (K x N), operands as row-major vectors; bf16 operands accumulate
// in float32 (accfloat), integer ones exactly (acc32).
template <unsigned M, unsigned K, unsigned N, typename TA, typename TB, typename TAcc>
struct mmul {
    static_assert(mmul_shape_exists<M, K, N, TA, TB>(),
                  "aie::mmul: this M x K x N shape and operand types are not an MMUL of the "
                  "architecture being built (AIE2 bf16: 4x8x4, 8x8x4, 4x16x8, 8x8x8; AIE2P "
                  "bf16: 4x8x8; AIE2 int8 x int4: 4x16x8, 8x16x8, 4x32x8; AIE2P int8: "
                  "8x8x8)");
    using Tag = typename std::conditional<std::is_same<TA, bfloat16>::value, accfloat,
                                          acc32>::type;
    accum<Tag, M * N> c;
    mmul() { c = zeros<Tag, M * N>(); }
    template <typename T>
    explicit mmul(const vector<T, M * N> &x) { c.from_vector(x); }
    void mac(const vector<TA, M * K> &a, const vector<TB, K * N> &b) {
        using V = typename accum<Tag, M * N>::value_type;
        for (unsigned i = 0; i < M; i++)
            for (unsigned j = 0; j < N; j++) {
                V s = c.v[i * N + j];
                for (unsigned k = 0; k < K; k++)
                    s += lane<V>(a.v[i * K + k]) * lane<V>(b.v[k * N + j]);
                c.v[i * N + j] = s;
            }
    }
    template <typename T>
    vector<T, M * N> to_vector() const { return c.template to_vector<T>(); }
    const accum<Tag, M * N> &to_accum() const { return c; }
};

// Vectors side by side.
template <typename T, unsigned N, typename... More>
vector<T, N * (1 + sizeof...(More))> concat(const vector<T, N> &first, const More &...more) {
    vector<T, N * (1 + sizeof...(More))> r;
    const vector<T, N> *parts[] = {&first, &more...};
    for (unsigned k = 0; k < 1 + sizeof...(More); k++)
        for (unsigned i = 0; i < N; i++) r.v[k * N + i] = parts[k]->v[i];
    return r;
}

// Transpose a Rows x Cols row-major vector into Cols x Rows.
template <typename T, unsigned N>
vector<T, N> transpose(const vector<T, N> &a, unsigned rows, unsigned cols) {
    vector<T, N> r;
    for (unsigned i = 0; i < rows; i++)
        for (unsigned j = 0; j < cols; j++) r.v[j * rows + i] = a.v[i * cols + j];
    return r;
}

}  // namespace aie

#if IRON_AIE_ARCH == 20
// e^x of 16 bf16 lanes as AIE2 computes it with mlir-aie's lookup tables
// (aie_runtime_lib/AIE2/lut_based_ops.h, getExpBf16): x is converted to fixed point with 8
// fraction bits (bfloat16_to_int(x, 8): to 32 bits rounding down, as the AIE API documents
// for AIE-ML's native bf16-to-integer conversion, of which the low 16 bits are kept), its
// high byte (the integer part, -128..127) indexes a table of e^i and its low byte (the
// fraction f / 256) a table of e^(f / 256); the two bf16 entries are multiplied into a float
// accumulator.  The tables hold e^i and e^(f / 256) rounded to bf16, e^i for i > 88 saturated
// at e^88 (the largest power below bf16's maximum); their entries are computed here, and
// tests/targets/test_npu_kernels.py checks samples of them against the published tables.
// The conversion wraps outside -128 <= x < 128, as on the device: kernels clamp x first.
namespace iron_lut {
struct Tables {
    uint16_t whole[256], fraction[256];
    Tables() {
        for (int b = 0; b < 256; b++) {
            int i = b < 128 ? b : b - 256;  // the high byte as a signed integer part
            whole[b] = bfloat16::round(float(std::exp(double(i < 89 ? i : 88))));
            fraction[b] = bfloat16::round(float(std::exp(b / 256.0)));
        }
    }
};

inline const Tables &tables() {
    static const Tables t;  // built once, thread-safely
    return t;
}
}  // namespace iron_lut

inline aie::accum<accfloat, 16> getExpBf16(const aie::vector<bfloat16, 16> &x) {
    aie::accum<accfloat, 16> r;
    for (unsigned i = 0; i < 16; i++) {
        double scaled = std::floor(double(float(x.v[i])) * 256.0);
        int64_t q = scaled < -2147483648.0 ? INT32_MIN : scaled > 2147483647.0 ? INT32_MAX
                                                                                 : int64_t(scaled);
        uint16_t fixed = uint16_t(uint32_t(int32_t(q)) & 0xffffu);
        bfloat16 whole, part;
        whole.bits = iron_lut::tables().whole[fixed >> 8];
        part.bits = iron_lut::tables().fraction[fixed & 0xffu];
        r.v[i] = float(whole) * float(part);
    }
    return r;
}
#endif

#endif
