// The subset of the AIE API (AMD's aie_api/aie.hpp, documented at
// https://xilinx.github.io/aie_api/) that iron's npu kernels use, implemented for the host so
// that the emulator runs the kernels' own source.  Only the semantics the kernels rely on are
// reproduced: element-wise arithmetic with float32 accumulators ("accfloat"), one rounding to
// bfloat16 (to nearest even) where the API converts an accumulator to a bf16 vector, lane
// reductions, and the MMUL of bf16 tiles; for the quantized matrix kernels (qmatrix.cc) int16
// vectors with 32-bit integer accumulators ("acc32", exact), shifts and masks, lane filters,
// reinterpretation (cast_to), and conversions between float and fixed point.  Transcendental functions (exp2, inv,
// invsqrt) are computed in float32 and rounded to their result type; on the device they are
// approximations whose error is not modelled here.
//
// Every vector load and store checks its address range against the buffers the running call
// was given (iron_npu_set_bounds, called by the emulator before each call): a kernel reading
// or writing outside them records the first violation, which iron_npu_violation returns.
#ifndef IRON_AIE_API_HOST_H
#define IRON_AIE_API_HOST_H

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
using uint8 = uint8_t;
using int16 = int16_t;
using uint16 = uint16_t;
using int32 = int32_t;
using uint32 = uint32_t;

struct accfloat {};
struct acc32 {};

namespace aie {

template <typename T, unsigned N>
struct vector {
    T v[N];
    static constexpr unsigned size() { return N; }
    T get(unsigned i) const { return v[i]; }
    void set(T x, unsigned i) { v[i] = x; }
    T operator[](unsigned i) const { return v[i]; }
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
    using value_type = typename std::conditional<std::is_same<Tag, acc32>::value, int64_t,
                                                 float>::type;
    value_type v[N];
    template <typename T>
    vector<T, N> to_vector() const {
        vector<T, N> r;
        for (unsigned i = 0; i < N; i++) r.v[i] = T(v[i]);
        return r;
    }
    template <typename T>
    accum &from_vector(const vector<T, N> &x) {
        for (unsigned i = 0; i < N; i++) {
            if constexpr (std::is_same<T, bfloat16>::value)
                v[i] = value_type(float(x.v[i]));
            else
                v[i] = value_type(x.v[i]);
        }
        return *this;
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

// Accumulator + vector: stays in the accumulator.
template <unsigned N, typename T>
accum<accfloat, N> add(const accum<accfloat, N> &a, const vector<T, N> &b) {
    accum<accfloat, N> r;
    for (unsigned i = 0; i < N; i++) r.v[i] = a.v[i] + float(b.v[i]);
    return r;
}

// Multiplications return an accumulator (the products are exact in float32 for bf16 inputs).
template <typename T, typename U, unsigned N>
accum<accfloat, N> mul(const vector<T, N> &a, const vector<U, N> &b) {
    accum<accfloat, N> r;
    for (unsigned i = 0; i < N; i++) r.v[i] = float(a.v[i]) * float(b.v[i]);
    return r;
}

template <typename T, unsigned N>
accum<accfloat, N> mul(const vector<T, N> &a, float s) {
    accum<accfloat, N> r;
    for (unsigned i = 0; i < N; i++) r.v[i] = float(a.v[i]) * s;
    return r;
}

template <typename T, typename U, unsigned N>
accum<accfloat, N> mac(const accum<accfloat, N> &acc, const vector<T, N> &a,
                       const vector<U, N> &b) {
    accum<accfloat, N> r;
    for (unsigned i = 0; i < N; i++) r.v[i] = acc.v[i] + float(a.v[i]) * float(b.v[i]);
    return r;
}

template <typename T, unsigned N>
accum<accfloat, N> mac(const accum<accfloat, N> &acc, const vector<T, N> &a, float s) {
    accum<accfloat, N> r;
    for (unsigned i = 0; i < N; i++) r.v[i] = acc.v[i] + float(a.v[i]) * s;
    return r;
}

// int8 lanes widened to int16 (unpack) and int16 lanes narrowed to int8, saturating (pack).
template <unsigned N>
vector<int16_t, N> unpack(const vector<int8_t, N> &a) {
    vector<int16_t, N> r;
    for (unsigned i = 0; i < N; i++) r.v[i] = a.v[i];
    return r;
}

template <unsigned N>
vector<int8_t, N> pack(const vector<int16_t, N> &a) {
    vector<int8_t, N> r;
    for (unsigned i = 0; i < N; i++) r.v[i] = int8_t(a.v[i] < -128 ? -128 : a.v[i] > 127 ? 127 : a.v[i]);
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

template <typename R, unsigned N>
vector<R, N> exp2(const vector<float, N> &a) {
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

// C (M x N, accfloat) += A (M x K) * B (K x N), operands as row-major vectors.
template <unsigned M, unsigned K, unsigned N, typename TA, typename TB, typename TAcc>
struct mmul {
    accum<accfloat, M * N> c;
    mmul() { c = zeros<accfloat, M * N>(); }
    template <typename T>
    explicit mmul(const vector<T, M * N> &x) { c.from_vector(x); }
    void mac(const vector<TA, M * K> &a, const vector<TB, K * N> &b) {
        for (unsigned i = 0; i < M; i++)
            for (unsigned j = 0; j < N; j++) {
                float s = c.v[i * N + j];
                for (unsigned k = 0; k < K; k++) s += float(a.v[i * K + k]) * float(b.v[k * N + j]);
                c.v[i * N + j] = s;
            }
    }
    template <typename T>
    vector<T, M * N> to_vector() const { return c.template to_vector<T>(); }
    const accum<accfloat, M * N> &to_accum() const { return c; }
};

// Four vectors side by side.
template <typename T, unsigned N>
vector<T, 4 * N> concat(const vector<T, N> &a, const vector<T, N> &b, const vector<T, N> &c,
                        const vector<T, N> &d) {
    vector<T, 4 * N> r;
    const vector<T, N> *parts[4] = {&a, &b, &c, &d};
    for (unsigned k = 0; k < 4; k++)
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

#endif
