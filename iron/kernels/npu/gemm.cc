// GEMM core kernels with the AIE API's MMUL of bf16 tiles, MR x MK x MN = 4 x 8 x 4 (a shape
// the API lists for bf16 on AIE-ML and AIE2P; mlir-aie's aie_kernels/aie2/mm.cc uses it):
//   gemm_bf16: acc (tm x tn, float32) += A (tm x tk) * B^T, B (tn x tk) in Linear-weight layout;
//   zero_f32 clears the accumulator; store_bf16 rounds it into the row-major output tile.
// The accumulator is kept in MR x MN blocks (block (i, j) at (i * tn / MN + j) * MR * MN), so
// each MMUL loads and stores its C block with one vector access.  tm % 4, tk % 8, tn % 4 == 0.
#include "iron_aie.h"

namespace {
constexpr unsigned MR = 4, MK = 8, MN = 4;
using MMUL = aie::mmul<MR, MK, MN, bfloat16, bfloat16, accfloat>;
}  // namespace

extern "C" {

void zero_f32(float *acc, int32_t n) {
    for (int32_t i = 0; i < n; i += 16) aie::store_v(acc + i, aie::zeros<float, 16>());
}

void gemm_bf16(const bfloat16 *a, const bfloat16 *b, float *acc, int32_t tm, int32_t tk,
               int32_t tn) {
    for (int32_t i = 0; i < tm; i += MR)
        for (int32_t j = 0; j < tn; j += MN) {
            float *c = acc + (i / MR * (tn / MN) + j / MN) * MR * MN;
            MMUL C(aie::load_v<MR * MN>(c));
            for (int32_t p = 0; p < tk; p += MK) {
                const bfloat16 *ar = a + i * tk + p, *br = b + j * tk + p;
                auto A = aie::concat(aie::load_v<MK>(ar), aie::load_v<MK>(ar + tk),
                                     aie::load_v<MK>(ar + 2 * tk), aie::load_v<MK>(ar + 3 * tk));
                auto Bt = aie::concat(aie::load_v<MK>(br), aie::load_v<MK>(br + tk),
                                      aie::load_v<MK>(br + 2 * tk), aie::load_v<MK>(br + 3 * tk));
                C.mac(A, aie::transpose(Bt, MN, MK));  // rows of B are columns of B^T
            }
            aie::store_v(c, C.template to_vector<float>());
        }
}

void store_bf16(const float *acc, bfloat16 *c, int32_t tm, int32_t tn) {
    for (int32_t i = 0; i < tm; i += MR)
        for (int32_t j = 0; j < tn; j += MN) {
            aie::vector<float, MR * MN> blk =
                aie::load_v<MR * MN>(acc + (i / MR * (tn / MN) + j / MN) * MR * MN);
            aie::accum<accfloat, MR * MN> t;
            t.from_vector(blk);
            aie::vector<bfloat16, MR * MN> v = t.template to_vector<bfloat16>();
            for (unsigned r = 0; r < MR; r++) {
                aie::vector<bfloat16, MN> row;
                for (unsigned q = 0; q < MN; q++) row.set(v.get(r * MN + q), q);
                aie::store_v(c + (i + r) * tn + j, row);
            }
        }
}

}  // extern "C"
