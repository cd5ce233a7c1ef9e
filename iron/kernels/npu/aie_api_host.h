// The subset of the AIE API (AMD's aie_api/aie.hpp, documented at
// https://xilinx.github.io/aie_api/) that iron's npu kernels use, implemented for the host so
// that the emulator runs the kernels' own source.  Only the semantics the kernels rely on are
// reproduced: element-wise arithmetic with float32 accumulators ("accfloat"), one rounding to
// bfloat16 (to nearest even) where the API converts an accumulator to a bf16 vector, lane
// reductions, and the MMUL of bf16 tiles.  Transcendental functions (exp2, inv,
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

struct accfloat {};

namespace aie {

template <typename T, unsigned N>
struct vector {
    T v[N];
    static constexpr unsigned size() { return N; }
    T get(unsigned i) const { return v[i]; }
    void set(T x, unsigned i) { v[i] = x; }
    T operator[](unsigned i) const { return v[i]; }
};

template <typename Tag, unsigned N>
struct accum {
    float v[N];
    template <typename T>
    vector<T, N> to_vector() const {
        vector<T, N> r;
        for (unsigned i = 0; i < N; i++) r.v[i] = T(v[i]);
        return r;
    }
    template <typename T>
    accum &from_vector(const vector<T, N> &x) {
        for (unsigned i = 0; i < N; i++) v[i] = float(x.v[i]);
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
    if constexpr (std::is_same<T, accfloat>::value) {
        accum<accfloat, N> r;
        for (unsigned i = 0; i < N; i++) r.v[i] = 0.0f;
        return r;
    } else {
        return broadcast<T, N>(T(0.0f));
    }
}

// Vector + vector, vector - vector: the result type of the inputs, one rounding.
template <typename T, unsigned N>
vector<T, N> add(const vector<T, N> &a, const vector<T, N> &b) {
    vector<T, N> r;
    for (unsigned i = 0; i < N; i++) r.v[i] = T(float(a.v[i]) + float(b.v[i]));
    return r;
}

template <typename T, unsigned N>
vector<T, N> sub(const vector<T, N> &a, const vector<T, N> &b) {
    vector<T, N> r;
    for (unsigned i = 0; i < N; i++) r.v[i] = T(float(a.v[i]) - float(b.v[i]));
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
