/* embedding: out[r] = table[tokens[r]]; a token outside [0, VOCAB) gives a row of zeros.
 *
 * args: table (VOCAB, DIM) bf16 (copied) or f16 (rounded to bf16), or (VOCAB, row bytes)
 *   uint8 in a quantized format whose
 *   rows are expanded to bf16 (iron_quant.h: VOCAB a multiple of its 16-row tiles), tokens (ROWS) int32 -> out (ROWS, DIM) bf16.
 * macros:
 *   IRON_VOCAB            rows of the table
 *   IRON_DIM              row length
 *   IRON_ROWS             tokens looked up
 *   IRON_NUM_AIE_COLUMNS  worker threads over the tokens
 *   IRON_WEIGHT_FORMAT, IRON_GROUP_SIZE   how the table is stored (iron_quant.h)
 */
#include "iron_cpu.h"
#include "iron_quant.h"

#if !defined(IRON_VOCAB) || !defined(IRON_DIM) || !defined(IRON_ROWS) \
    || !defined(IRON_NUM_AIE_COLUMNS)
#error "embedding.c needs IRON_VOCAB, IRON_DIM, IRON_ROWS, IRON_NUM_AIE_COLUMNS"
#endif
_Static_assert(IRON_ROWS % IRON_NUM_AIE_COLUMNS == 0, "rows % num_aie_columns == 0");
_Static_assert(Q_PLAIN || (IRON_DIM % 32 == 0 && IRON_DIM % Q_SUPER_VALUES == 0
                                         && IRON_VOCAB % Q_TILE == 0),
               "a quantized table holds whole groups, 32-value chunks and 16-row tiles");

void iron_kernel(void *const *args) {
    const uint8_t *table = args[0];
    const int32_t *tokens = args[1];
    uint16_t *out = args[2];

#if IRON_NUM_AIE_COLUMNS > 1 && IRON_ROWS > 1  /* even a team of one costs a GOMP_parallel call */
    #pragma omp parallel for num_threads(IRON_NUM_AIE_COLUMNS) schedule(static)
#endif
    for (long r = 0; r < IRON_ROWS; r++) {
        const int32_t tok = tokens[r];
        uint16_t *o = out + r * (long)IRON_DIM;
        if (tok >= 0 && tok < IRON_VOCAB) {
#if QFMT == IRON_FMT_BF16
            memcpy(o, table + (long)tok * IRON_DIM * 2, sizeof(uint16_t) * IRON_DIM);
#elif QFMT == IRON_FMT_F16
            const uint16_t *h = (const uint16_t *)table + (long)tok * IRON_DIM;
            for (long i = 0; i < IRON_DIM; i++) o[i] = iron_f32_to_bf16(_cvtsh_ss(h[i]));
#else
            float row[IRON_DIM];
            q_lane_f32(table + (long)(tok / Q_TILE) * Q_TILE_BYTES(IRON_DIM), IRON_DIM,
                       tok % Q_TILE, 0, IRON_DIM, row);
            for (long i = 0; i < IRON_DIM; i++) o[i] = iron_f32_to_bf16(row[i]);
#endif
        } else
            memset(o, 0, sizeof(uint16_t) * IRON_DIM);
    }
}
