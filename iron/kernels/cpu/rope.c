/* rope: rotary position embedding, rotate-half layout (Hugging Face Llama).
 *
 * args: x (ROWS, HEADS * HEAD_DIM) bf16, pos (ROWS) int32, inv_freq (HEAD_DIM / 2) float32
 *       -> out (ROWS, HEADS * HEAD_DIM) bf16.
 * For row r, head h, i < HEAD_DIM / 2, with a = pos[r] * inv_freq[i] in float32:
 *   out[i]              = x[i] * cos(a) - x[i + HEAD_DIM/2] * sin(a)
 *   out[i + HEAD_DIM/2] = x[i + HEAD_DIM/2] * cos(a) + x[i] * sin(a)
 * cos/sin are computed once per row and shared by all heads.
 * macros:
 *   IRON_ROWS             rows (tokens)
 *   IRON_HEADS            heads per row
 *   IRON_HEAD_DIM         head dimension (even)
 *   IRON_TILE_SIZE        rows per tile; tiles are the parallel items
 *   IRON_NUM_AIE_COLUMNS  worker threads
 * legality (the operator's rules(), asserted below): ROWS % (TILE_SIZE * NUM_AIE_COLUMNS) == 0,
 *   HEAD_DIM even.
 */
#include "iron_cpu.h"

#if !defined(IRON_ROWS) || !defined(IRON_HEADS) || !defined(IRON_HEAD_DIM) \
    || !defined(IRON_TILE_SIZE) || !defined(IRON_NUM_AIE_COLUMNS)
#error "rope.c needs IRON_ROWS, IRON_HEADS, IRON_HEAD_DIM, IRON_TILE_SIZE, IRON_NUM_AIE_COLUMNS"
#endif
_Static_assert(IRON_ROWS % (IRON_NUM_AIE_COLUMNS * IRON_TILE_SIZE) == 0,
               "rows % (num_aie_columns * tile_size) == 0");
_Static_assert(IRON_HEAD_DIM % 2 == 0, "head_dim is even");

#define HALF (IRON_HEAD_DIM / 2)

void iron_kernel(void *const *args) {
    const uint16_t *x = args[0];
    const int32_t *pos = args[1];
    const float *inv_freq = args[2];
    uint16_t *out = args[3];

#if IRON_NUM_AIE_COLUMNS > 1  /* even a team of one costs a GOMP_parallel call */
    #pragma omp parallel for num_threads(IRON_NUM_AIE_COLUMNS) schedule(static)
#endif
    for (long t = 0; t < IRON_ROWS / IRON_TILE_SIZE; t++) {
        float c[HALF], s[HALF];
        for (long r = t * IRON_TILE_SIZE; r < (t + 1) * IRON_TILE_SIZE; r++) {
            const float p = (float)pos[r];
            for (int i = 0; i < HALF; i++) {
                const float a = p * inv_freq[i];
                c[i] = cosf(a);
                s[i] = sinf(a);
            }
            for (int h = 0; h < IRON_HEADS; h++) {
                const long off = (r * IRON_HEADS + h) * (long)IRON_HEAD_DIM;
                const uint16_t *xl = x + off, *xh = x + off + HALF;
                uint16_t *ol = out + off, *oh = out + off + HALF;
                for (int i = 0; i < HALF; i++) {
                    const float lo = iron_bf16_to_f32(xl[i]), hi = iron_bf16_to_f32(xh[i]);
                    ol[i] = iron_f32_to_bf16(lo * c[i] - hi * s[i]);
                    oh[i] = iron_f32_to_bf16(hi * c[i] + lo * s[i]);
                }
            }
        }
    }
}
