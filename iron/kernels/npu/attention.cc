// Attention core kernels (pos: the positions of this dispatch, and slotted the rows' slots after
// them, as the relay core copied them): one work unit is a block of rb query rows of one KV head
// with its `group` query heads (rb * group query vectors of head_dim, bf16), scored against the
// unit's key tiles one tile at a time with an online softmax, as upstream IRON's MHA kernels
// keep a running maximum and sum per query: scores q.k * scale in float32, the tile's maximum,
// weights e^(s - max) with iron_exp (bf16; the lookup table on AIE2, exp2 on AIE2P), the
// accumulator (float32, a core buffer) and the sum rescaled by e^(old max - new max).  Query
// row r of the unit attends keys 0 .. its position (causal); keys past it, and keys an earlier
// tile already scored (the last tile is read shifted back to end at ctx), weigh nothing.
#include "iron_aie.h"

namespace {
constexpr unsigned V = IRON_LANES;
constexpr float kLowest = -3.0e38f;  // "minus infinity" that stays finite in differences

// The position of query row `row` of the dispatch: pos[0] + row when the rows of a chunk follow
// each other (follow = 1), else the row's own position pos[row] (slotted: every row its own
// sequence, its slot at pos[rows + row]).
int32_t row_position(const int32_t *pos, int32_t row, int32_t follow) {
    return follow ? iron_load(pos) + row : iron_load(pos + row);
}

float exp_scalar(float x) {
    return float(iron_exp(aie::broadcast<float, V>(x)).get(0));
}
}  // namespace

extern "C" {

// acc (n x hd float32) = 0; running maximum (ml[0 .. n)) lowest, sums (ml[n .. 2n)) zero.
void attn_init(float *acc, float *ml, int32_t n, int32_t hd) {
    for (int32_t i = 0; i < n * hd; i += V) aie::store_v(acc + i, aie::zeros<float, V>());
    for (int32_t i = 0; i < n; i++) {
        iron_store(ml + i, kLowest);
        iron_store(ml + n + i, 0.0f);
    }
}

// kv: the tile's keys (tile x hd) followed by its values (tile x hd), joined in the memory tile;
// key tile kt of slot `slot` (-1: not slotted), whose rows alone it scores.
void attn_tile(const bfloat16 *q, const bfloat16 *kv, float *acc, float *ml, float *scores,
               const int32_t *pos, int32_t base, int32_t unit, int32_t slot, int32_t kt,
               int32_t kv_heads, int32_t rb, int32_t follow, int32_t group, int32_t hd,
               int32_t tile, int32_t ctx, int32_t rows, float scale) {
    const int32_t n = rb * group;
    const bfloat16 *k = kv, *v = kv + tile * hd;
    const int32_t first_row = (base + unit) / kv_heads * rb;
    const int32_t fresh = kt * tile;                                // first key not yet scored
    const int32_t start = fresh + tile <= ctx ? fresh : ctx - tile;  // first key of this tile
    for (int32_t i = 0; i < n; i++) {
        const int32_t row = first_row + i / group;
        if (slot >= 0 && iron_load(pos + rows + row) != slot) continue;  // another slot's row
        int32_t p = row_position(pos, row, follow);
        int32_t last = (p < ctx - 1 ? p : ctx - 1) - start;  // last key of the tile it attends
        if (last > tile - 1) last = tile - 1;
        int32_t lo = fresh - start;                           // first key it has not scored
        if (last < lo) continue;
        const bfloat16 *qi = q + i * hd;
        for (int32_t j = 0; j < tile; j++) {
            float s = kLowest;
            if (j >= lo && j <= last) {
                aie::accum<accfloat, V> d = aie::zeros<accfloat, V>();
                for (int32_t c = 0; c < hd; c += V)
                    d = aie::mac(d, aie::load_v<V>(qi + c), aie::load_v<V>(k + j * hd + c));
                s = aie::reduce_add(d.template to_vector<float>()) * scale;
            }
            iron_store(scores + j, s);
        }
        const int32_t whole = (tile + V - 1) / V * V;  // the scores buffer: whole vectors
        for (int32_t j = tile; j < whole; j++) iron_store(scores + j, kLowest);
        aie::vector<float, V> m = aie::load_v<V>(scores);
        for (int32_t j = V; j < whole; j += V) m = aie::max(m, aie::load_v<V>(scores + j));
        float m_old = iron_load(ml + i);
        float m_tile = aie::reduce_max(m);
        float m_new = m_tile > m_old ? m_tile : m_old;
        float corr = exp_scalar(m_old - m_new);
        aie::vector<float, V> shift = aie::broadcast<float, V>(m_new);
        aie::accum<accfloat, V> sum = aie::zeros<accfloat, V>();
        for (int32_t j = 0; j < whole; j += V) {
            aie::vector<bfloat16, V> e = iron_exp(aie::sub(aie::load_v<V>(scores + j), shift));
            sum = aie::add(sum, e);
            aie::store_v(scores + j, iron_widen(e));
        }
        iron_store(ml + i, m_new);
        iron_store(ml + n + i, iron_load(ml + n + i) * corr +
                                   aie::reduce_add(sum.template to_vector<float>()));
        float *ai = acc + i * hd;
        for (int32_t c = 0; c < hd; c += V) {
            aie::accum<accfloat, V> a = aie::mul(aie::load_v<V>(ai + c), corr);
            for (int32_t j = lo; j <= last; j++)
                a = aie::mac(a, iron_widen(aie::load_v<V>(v + j * hd + c)),
                             iron_load(scores + j));
            aie::store_v(ai + c, a.template to_vector<float>());
        }
    }
}

// out (n x hd bf16) = acc / sum per query; a query that attended no key gives zeros.
void attn_finish(const float *acc, const float *ml, bfloat16 *out, int32_t n, int32_t hd) {
    for (int32_t i = 0; i < n; i++) {
        float l = iron_load(ml + n + i);
        float inv = l > 0.0f ? aie::inv(l) : 0.0f;
        for (int32_t c = 0; c < hd; c += V)
            aie::store_v(out + i * hd + c, aie::mul(aie::load_v<V>(acc + i * hd + c), inv)
                                               .template to_vector<bfloat16>());
    }
}

// The relay core of the positions (a tile the attention core shares memory with): n words
// (positions, or slots) from the FIFO the runtime sequence fills into the FIFO the attention
// core reads, from word `at` on.
void attn_positions(const int32_t *in, int32_t *out, int32_t at, int32_t n) {
    for (int32_t i = 0; i < n; i++) iron_store(out + at + i, iron_load(in + i));
}

}  // extern "C"
