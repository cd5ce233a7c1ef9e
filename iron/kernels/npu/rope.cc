// QKVRoPE core kernels: one stacked q|k|v row (bf16) per call; pos is the core's runtime-
// parameter buffer (a position per row, written by the runtime sequence).  q and k are rotated
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

// Rotate `heads` heads of hd from `x` into `out` at the angles of position p.
void rotate(const bfloat16 *x, bfloat16 *out, const float *inv_freq, int32_t p, int32_t heads,
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
            aie::vector<float, V> a = iron_widen(aie::load_v<V>(x + h * hd + c));
            aie::vector<float, V> b = iron_widen(aie::load_v<V>(x + h * hd + half + c));
            aie::store_v(out + h * hd + c, aie::mac(aie::mul(a, cs), b, nsn)
                                               .template to_vector<bfloat16>());
            aie::store_v(out + h * hd + half + c, aie::mac(aie::mul(b, cs), a, sn)
                                                      .template to_vector<bfloat16>());
        }
    }
}
}  // namespace

extern "C" {

// Rows of the chunk that land in the cache: from position pos[0] up to ctx.
int32_t qkv_stored(const int32_t *pos, int32_t rows, int32_t ctx) {
    int32_t start = iron_load(pos);
    if (start < 0) return 0;
    int32_t n = ctx - start;
    return n < 0 ? 0 : n < rows ? n : rows;
}

int32_t qkv_past(const int32_t *pos, int32_t rows, int32_t ctx) {
    return rows - qkv_stored(pos, rows, ctx);
}

// Slotted: row iv is stored (1) when its own position lies in the cache, else only its q
// leaves (slot_row_past 1).
int32_t slot_row_stored(const int32_t *pos, int32_t iv, int32_t ctx) {
    int32_t p = iron_load(pos + iv);
    return p >= 0 && p < ctx ? 1 : 0;
}

int32_t slot_row_past(const int32_t *pos, int32_t iv, int32_t ctx) {
    return 1 - slot_row_stored(pos, iv, ctx);
}

// Row base + iv into out, laid out as the row: q and k rotated, v copied.
void qkv_rope_row(const bfloat16 *qkv, const int32_t *pos, const float *inv_freq, bfloat16 *out,
                  int32_t base, int32_t iv, int32_t heads, int32_t kv_heads, int32_t hd) {
    int32_t p = iron_load(pos + base + iv);
    rotate(qkv, out, inv_freq, p, heads + kv_heads, hd);
    const int32_t v = (heads + kv_heads) * hd;
    for (int32_t i = 0; i < kv_heads * hd; i += V)
        aie::store_v(out + v + i, aie::load_v<V>(qkv + v + i));
}

// Row base + iv past the cache's end: q only.
void q_rope_row(const bfloat16 *qkv, const int32_t *pos, const float *inv_freq, bfloat16 *q,
                int32_t base, int32_t iv, int32_t heads, int32_t kv_heads, int32_t hd) {
    rotate(qkv, q, inv_freq, iron_load(pos + base + iv), heads, hd);
}

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

// Cache tile t (rows t * tile .. of one head, tile x hd) through the core: copied, and the
// chunk's rows that land in it (row r at position pos[0] + r, none when pos[0] < 0) replaced
// by row r of `rows_in` (rows x hd).
void cache_patch(const bfloat16 *in, bfloat16 *out, const bfloat16 *rows_in,
                 const int32_t *pos, int32_t t, int32_t tile, int32_t hd, int32_t rows) {
    for (int32_t i = 0; i < tile * hd; i += V) aie::store_v(out + i, aie::load_v<V>(in + i));
    const int32_t start = iron_load(pos);
    if (start < 0) return;
    for (int32_t r = 0; r < rows; r++) {
        const int32_t at = start + r - t * tile;
        if (at < 0 || at >= tile) continue;
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

// The relay core of QKVRoPE's parameters: n positions, or n frequencies, from the FIFO the
// runtime sequence fills into the FIFO the rotating core reads.
void rope_positions(const int32_t *in, int32_t *out, int32_t n) {
    for (int32_t i = 0; i < n; i++) iron_store(out + i, iron_load(in + i));
}

void rope_frequencies(const float *in, float *out, int32_t n) {
    for (int32_t i = 0; i < n; i++) iron_store(out + i, iron_load(in + i));
}

}  // extern "C"
