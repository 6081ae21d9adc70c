/* libFuzzer target: the map-row decoder on arbitrary bytes (copied to an aligned buffer
 * of exactly that length, so ASan flags any read past it). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "mf_row.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t *b = aligned_alloc(16, (size + 16) & ~(size_t)15);
    if (!b)
        return 0;
    memcpy(b, data, size);
    /* Half the inputs get a correct checksum, so the structural checks are reached. */
    if (size >= 16 && (data[size - 1] & 1) && mf_row_seal(b, size) != MF_OK) {
        /* header size disagrees: decode anyway */
    }
    mf_row_view_t v;
    const char *why;
    if (mf_row_decode(b, size, 0, &v, &why) == MF_OK) {
        /* Touch everything a consumer would: every entry's mass and tile corners. */
        volatile float acc = 0;
        for (uint32_t c = 0; c < v.n_cols; c++)
            for (uint32_t h = 0; h < v.n_heads; h++) {
                int64_t e = mf_row_entry(&v, c, h);
                if (e < 0)
                    continue;
                acc += mf_row_mass(&v, (uint32_t)e);
                acc += mf_row_tile_value(&v, (uint32_t)e, v.block_size - 1, v.block_size - 1);
            }
        (void)acc;
    }
    free(b);
    return 0;
}
