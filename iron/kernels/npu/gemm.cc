// GEMM core kernels with the AIE API's MMUL of bf16 tiles, MR x MK x MN per architecture:
// 4 x 8 x 4 on AIE2 (mlir-aie's aie_kernels/aie2/mm.cc), 4 x 8 x 8 on AIE2P
// (aie_kernels/aie2p/mm.cc); the API has no bf16 shape common to both.
//   gemm_bf16: acc (tm x tn, float32) += A (tm x tk) * B^T, B (tn x tk) in Linear-weight layout;
//   zero_f32 clears the accumulator; store_bf16 rounds it into the row-major output tile
//   (store_f32 stores it as float32: a model's logits).
// The accumulator is kept in MR x MN blocks (block (i, j) at (i * tn / MN + j) * MR * MN), so
// each MMUL loads and stores its C block with one vector access.  Output rows leave as SW-lane
// bf16 vectors (128 bits, the narrowest the API has).  tm % MR, tk % MK, tn % SW == 0.
#include <utility>

#include "iron_aie.h"

namespace {
constexpr unsigned AIE2_MMUL[3] = {4, 8, 4}, AIE2P_MMUL[3] = {4, 8, 8};
constexpr unsigned MR = IRON_AIE_ARCH == 20 ? AIE2_MMUL[0] : AIE2P_MMUL[0];
constexpr unsigned MK = IRON_AIE_ARCH == 20 ? AIE2_MMUL[1] : AIE2P_MMUL[1];
constexpr unsigned MN = IRON_AIE_ARCH == 20 ? AIE2_MMUL[2] : AIE2P_MMUL[2];
constexpr unsigned SW = 8;
static_assert(SW % MN == 0, "an output row vector holds whole MMUL block rows");
using MMUL = aie::mmul<MR, MK, MN, bfloat16, bfloat16, accfloat>;

// Rows p, p + stride, ... (one per index) of MK bf16 each, side by side.
template <unsigned... I>
aie::vector<bfloat16, sizeof...(I) * MK> rows(const bfloat16 *p, int32_t stride,
                                              std::integer_sequence<unsigned, I...>) {
    return aie::concat(aie::load_v<MK>(p + I * stride)...);
}

template <typename Out>
void store(const float *acc, Out *c, int32_t tm, int32_t tn) {
    constexpr unsigned BLOCKS = SW / MN;  // MMUL blocks side by side in one output row vector
    for (int32_t i = 0; i < tm; i += MR)
        for (int32_t j = 0; j < tn; j += SW) {
            aie::vector<Out, MR * MN> v[BLOCKS];
            for (unsigned k = 0; k < BLOCKS; k++) {
                aie::accum<accfloat, MR * MN> t;
                t.from_vector(aie::load_v<MR * MN>(
                    acc + (i / MR * (tn / MN) + j / MN + k) * MR * MN));
                v[k] = t.template to_vector<Out>();
            }
            for (unsigned r = 0; r < MR; r++) {
                aie::vector<Out, SW> row;
                for (unsigned q = 0; q < SW; q++) row.set(v[q / MN].get(r * MN + q % MN), q);
                aie::store_v(c + (i + r) * tn + j, row);
            }
        }
}
}  // namespace

extern "C" {

void zero_f32(float *acc, int32_t n) {
    IRON_PIPELINED IRON_MIN_ITERATIONS(1)
    for (int32_t i = 0; i < n; i += 16) aie::store_v(acc + i, aie::zeros<float, 16>());
}

void gemm_bf16(const bfloat16 *a, const bfloat16 *b, float *acc, int32_t tm, int32_t tk,
               int32_t tn) {
    for (int32_t i = 0; i < tm; i += MR)
        for (int32_t j = 0; j < tn; j += MN) {
            float *c = acc + (i / MR * (tn / MN) + j / MN) * MR * MN;
            MMUL C(aie::load_v<MR * MN>(c));
            IRON_PIPELINED IRON_MIN_ITERATIONS(1)
            for (int32_t p = 0; p < tk; p += MK) {
                auto A = rows(a + i * tk + p, tk, std::make_integer_sequence<unsigned, MR>());
                auto Bt = rows(b + j * tk + p, tk, std::make_integer_sequence<unsigned, MN>());
                C.mac(A, aie::transpose(Bt, MN, MK));  // rows of B are columns of B^T
            }
            aie::store_v(c, C.template to_vector<float>());
        }
}

void store_bf16(const float *acc, bfloat16 *c, int32_t tm, int32_t tn) { store(acc, c, tm, tn); }

void store_f32(const float *acc, float *c, int32_t tm, int32_t tn) { store(acc, c, tm, tn); }

}  // extern "C"
