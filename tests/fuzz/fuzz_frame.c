/* libFuzzer target: the incremental frame reader and the Envelope decoder, fed in
 * pieces whose sizes come from the input itself. */
#include <stdint.h>
#include <stdlib.h>

#include "mf_frame.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    mf_frame_reader_t r;
    if (size < 1 || mf_frame_reader_init(&r, 1u << 16) != MF_OK)
        return 0;
    size_t step = 1 + data[0] % 64, off = 1;
    while (off < size) {
        size_t n = size - off < step ? size - off : step;
        mf_frame_reader_feed(&r, data + off, n);
        off += n;
        for (;;) {
            mf_frame_t f;
            int have;
            if (mf_frame_reader_next(&r, &f, &have, NULL) != MF_OK || !have)
                break;
            mf_envelope_t *env;
            if (mf_envelope_decode(&f, &env, NULL) == MF_OK) {
                (void)mf_envelope_body_name((int)env->body_case);
                mf_envelope_free(env);
            }
        }
    }
    mf_frame_reader_deinit(&r);
    return 0;
}
