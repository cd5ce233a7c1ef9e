// QKVRoPE core kernels: one stacked q|k|v row (bf16) per call; pos holds a position per row, as
// the relay core copied them (slotted: the rows' slots after them).  q and k are rotated
// (rotate-half RoPE: for each head the halves a, b become a cos - b sin and b cos + a sin) with
// the angle pos[r] * inv_freq[i] in float32, and rounded once to bf16; v is copied.  The AIE
// API's sin and cos exist only on the first-generation AIE, so the kernel computes them: Cody-
// Waite reduction by pi/2 (three parts, exact for positions below 2^16) and the single-
// precision minimax polynomials of Cephes' sinf / cosf on [-pi/4, pi/4].
#include "iron_aie.h"

namespace {
constexpr unsigned V = IRON_LANES;
constexpr float kTwoOverPi = 0.636619772367581f;
constexpr float kPio2[3] = {1.5703125f, 4.837512969970703125e-4f, 7.54978995489188216e-8f};

void sincos(float a, float *s, float *c) {
    float kf = a * kTwoOverPi;
    int32_t k = (int32_t)(kf < 0.0f ? kf - 0.5f : kf + 0.5f);
    float x = ((a - (float)k * kPio2[0]) - (float)k * kPio2[1]) - (float)k * kPio2[2];
    float z = x * x;
    float sx = ((-1.9515295891e-4f * z + 8.3321608736e-3f) * z - 1.6666654611e-1f) * z * x + x;
    float cx = ((2.443315711809948e-5f * z - 1.388731625493765e-3f) * z +
                4.166664568298827e-2f) * z * z - 0.5f * z + 1.0f;
    switch (k & 3) {
        case 0: *s = sx; *c = cx; break;
        case 1: *s = cx; *c = -sx; break;
        case 2: *s = -sx; *c = -cx; break;
        default: *s = -cx; *c = sx; break;
    }
}

// V lanes of a head as float32: bf16 lanes widened (exact), or float32 lanes as they are.
aie::vector<float, V> lanes_f32(const bfloat16 *p) { return iron_widen(aie::load_v<V>(p)); }
aie::vector<float, V> lanes_f32(const float *p) { return aie::load_v<V>(p); }

// Rotate `heads` heads of hd from `x` (bf16, or float32 prepared by `prepare`) into `out` at
// the angles of position p.
template <typename T>
void rotate(const T *x, bfloat16 *out, const float *inv_freq, int32_t p, int32_t heads,
            int32_t hd) {
    const int32_t half = hd / 2;
    for (int32_t c = 0; c < half; c += V) {
        aie::vector<float, V> cs, sn, nsn;
        for (unsigned i = 0; i < V; i++) {
            float s, co;
            sincos((float)p * iron_load(inv_freq + c + i), &s, &co);
            cs.set(co, i);
            sn.set(s, i);
            nsn.set(-s, i);
        }
        for (int32_t h = 0; h < heads; h++) {
            aie::vector<float, V> a = lanes_f32(x + h * hd + c);
            aie::vector<float, V> b = lanes_f32(x + h * hd + half + c);
            aie::store_v(out + h * hd + c, aie::mac(aie::mul(a, cs), b, nsn)
                                               .template to_vector<bfloat16>());
            aie::store_v(out + h * hd + half + c, aie::mac(aie::mul(b, cs), a, sn)
                                                      .template to_vector<bfloat16>());
        }
    }
}

// One head of a Qwen row as float32 into `out` (hd): x plus `bias` (Qwen2; none when null),
// then with `norm` (Qwen3) RMS-normed over the head, epsilon eps, and scaled by norm: the
// squares summed a vector at a time in float32, one lane reduction and the API's invsqrt, as
// the RMSNorm kernel (norm.cc) does.
void prepare(const bfloat16 *x, const bfloat16 *bias, const bfloat16 *norm, float eps,
             float *out, int32_t hd) {
    aie::accum<accfloat, V> ss = aie::zeros<accfloat, V>();
    for (int32_t i = 0; i < hd; i += V) {
        aie::vector<float, V> v = lanes_f32(x + i);
        if (bias) v = aie::add(v, lanes_f32(bias + i));
        aie::store_v(out + i, v);
        ss = aie::mac(ss, v, v);
    }
    if (!norm) return;
    const float mean = aie::reduce_add(ss.template to_vector<float>()) / (float)hd;
    const float scale = aie::invsqrt(mean + eps);
    for (int32_t i = 0; i < hd; i += V) {
        aie::accum<accfloat, V> y = aie::mul(aie::load_v<V>(out + i), scale);
        y = aie::mul(y.template to_vector<float>(), lanes_f32(norm + i));
        aie::store_v(out + i, y.template to_vector<float>());
    }
}
}  // namespace

extern "C" {

// QKVRoPE's pass over KV head h: row iv's query heads of group h rotated into q (group x hd),
// its key head h rotated and its value head h copied into row iv of k_rows / v_rows (rows x hd).
void qkv_head_row(const bfloat16 *qkv, const int32_t *pos, const float *inv_freq, bfloat16 *q,
                  bfloat16 *k_rows, bfloat16 *v_rows, int32_t h, int32_t iv, int32_t heads,
                  int32_t kv_heads, int32_t hd) {
    const int32_t p = iron_load(pos + iv), group = heads / kv_heads;
    rotate(qkv + h * group * hd, q, inv_freq, p, group, hd);
    rotate(qkv + (heads + h) * hd, k_rows + iv * hd, inv_freq, p, 1, hd);
    const bfloat16 *v = qkv + (heads + kv_heads + h) * hd;
    for (int32_t i = 0; i < hd; i += V) aie::store_v(v_rows + iv * hd + i, aie::load_v<V>(v + i));
}

// qkv_head_row for QKVRoPE's Qwen variants: `row` is a q|k|v row followed by its weights, as
// the memory tile joins them: the q|k|v bias (when bias), then the q and k norm weights (when
// qk_norm).  Each head is prepared in float32 (`head`: the group's q heads, group x hd) before
// it is rotated; v plus its bias is rounded to bf16 once.
void qkv_head_row_qwen(const bfloat16 *row, const int32_t *pos, const float *inv_freq,
                       bfloat16 *q, bfloat16 *k_rows, bfloat16 *v_rows, float *head, float eps,
                       int32_t h, int32_t iv, int32_t bias, int32_t qk_norm, int32_t heads,
                       int32_t kv_heads, int32_t hd) {
    const int32_t p = iron_load(pos + iv), group = heads / kv_heads;
    const int32_t width = (heads + 2 * kv_heads) * hd;
    const bfloat16 *b = bias ? row + width : nullptr;
    const bfloat16 *q_norm = qk_norm ? row + width * (1 + bias) : nullptr;
    const bfloat16 *k_norm = qk_norm ? q_norm + hd : nullptr;
    for (int32_t g = 0; g < group; g++) {
        const int32_t at = (h * group + g) * hd;
        prepare(row + at, b ? b + at : nullptr, q_norm, eps, head + g * hd, hd);
    }
    rotate(head, q, inv_freq, p, group, hd);
    const int32_t k = (heads + h) * hd, v = (heads + kv_heads + h) * hd;
    prepare(row + k, b ? b + k : nullptr, k_norm, eps, head, hd);
    rotate(head, k_rows + iv * hd, inv_freq, p, 1, hd);
    prepare(row + v, b ? b + v : nullptr, nullptr, eps, head, hd);
    for (int32_t i = 0; i < hd; i += V)
        aie::store_v(v_rows + iv * hd + i, aie::add(aie::zeros<accfloat, V>(),
                                                    aie::load_v<V>(head + i))
                                               .template to_vector<bfloat16>());
}

// Cache tile t (rows t * tile .. of one head, tile x hd) of slot `slot` (-1: not slotted) through
// the core: copied, and the chunk's rows that land in it replaced by their rows of `rows_in`
// (rows x hd).  Row r lands at pos[0] + r when the chunk's rows follow each other (follow = 1;
// none when pos[0] < 0), else at its own pos[r] when that is in the cache and its slot
// pos[rows + r] is `slot`.
void cache_patch(const bfloat16 *in, bfloat16 *out, const bfloat16 *rows_in,
                 const int32_t *pos, int32_t t, int32_t slot, int32_t tile, int32_t hd,
                 int32_t rows, int32_t follow) {
    for (int32_t i = 0; i < tile * hd; i += V) aie::store_v(out + i, aie::load_v<V>(in + i));
    if (follow && iron_load(pos) < 0) return;
    for (int32_t r = 0; r < rows; r++) {
        if (slot >= 0 && iron_load(pos + rows + r) != slot) continue;
        const int32_t p = follow ? iron_load(pos) + r : iron_load(pos + r);
        const int32_t at = p - t * tile;
        if (p < 0 || at < 0 || at >= tile) continue;
        for (int32_t i = 0; i < hd; i += V)
            aie::store_v(out + at * hd + i, aie::load_v<V>(rows_in + r * hd + i));
    }
}

// CacheWrite's pass over KV head h: head h of the row x (kv_heads * hd), the chunk's row iv,
// into row iv of rows_out (rows x hd).
void cache_rows_head(const bfloat16 *x, bfloat16 *rows_out, int32_t h, int32_t iv,
                     int32_t hd) {
    for (int32_t i = 0; i < hd; i += V)
        aie::store_v(rows_out + iv * hd + i, aie::load_v<V>(x + h * hd + i));
}

// The relay core of QKVRoPE's parameters: n positions (or slots), or n frequencies, from the
// FIFO the runtime sequence fills into the FIFO the rotating core reads, from word `at` on.
void rope_positions(const int32_t *in, int32_t *out, int32_t at, int32_t n) {
    for (int32_t i = 0; i < n; i++) iron_store(out + at + i, iron_load(in + i));
}

void rope_frequencies(const float *in, float *out, int32_t at, int32_t n) {
    for (int32_t i = 0; i < n; i++) iron_store(out + at + i, iron_load(in + i));
}

}  // extern "C"
