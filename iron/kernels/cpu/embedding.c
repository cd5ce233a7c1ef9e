/* embedding: out[r] = table[tokens[r]]; a token outside [0, VOCAB) gives a row of zeros.
 *
 * args: table (VOCAB, DIM) bf16, tokens (ROWS) int32 -> out (ROWS, DIM) bf16.
 * macros:
 *   IRON_VOCAB            rows of the table
 *   IRON_DIM              row length
 *   IRON_ROWS             tokens looked up
 *   IRON_NUM_AIE_COLUMNS  worker threads over the tokens
 */
#include "iron_cpu.h"

#if !defined(IRON_VOCAB) || !defined(IRON_DIM) || !defined(IRON_ROWS) \
    || !defined(IRON_NUM_AIE_COLUMNS)
#error "embedding.c needs IRON_VOCAB, IRON_DIM, IRON_ROWS, IRON_NUM_AIE_COLUMNS"
#endif
_Static_assert(IRON_ROWS % IRON_NUM_AIE_COLUMNS == 0, "rows % num_aie_columns == 0");

void iron_kernel(void *const *args) {
    const uint16_t *table = args[0];
    const int32_t *tokens = args[1];
    uint16_t *out = args[2];

#if IRON_NUM_AIE_COLUMNS > 1 && IRON_ROWS > 1  /* even a team of one costs a GOMP_parallel call */
    #pragma omp parallel for num_threads(IRON_NUM_AIE_COLUMNS) schedule(static)
#endif
    for (long r = 0; r < IRON_ROWS; r++) {
        const int32_t tok = tokens[r];
        uint16_t *o = out + r * (long)IRON_DIM;
        if (tok >= 0 && tok < IRON_VOCAB)
            memcpy(o, table + (long)tok * IRON_DIM, sizeof(uint16_t) * IRON_DIM);
        else
            memset(o, 0, sizeof(uint16_t) * IRON_DIM);
    }
}
