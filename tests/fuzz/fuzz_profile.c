/* libFuzzer target: mapping profiles as the kernels and clients read them
 * (kernels/mf_profile.c: unpack + validate), then every layer turned into the plain
 * arrays mf_apply_ref takes and looked up by target layer. */
#include <stdint.h>
#include <stdlib.h>

#include "mf_profile.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    Mapflow__V1__MappingProfile *p = NULL;
    const char *why = NULL;
    if (mf_profile_decode(data, size, &p, &why) != MF_OK)
        return 0;
    uint8_t modes[1024];
    float top_p[1024];
    for (size_t i = 0; i < p->n_layers; i++) {
        const Mapflow__V1__LayerMap *lm = p->layers[i];
        mf_layer_map_t out;
        if (lm->target_heads <= 1024)
            (void)mf_layer_map_from_proto(lm, &out, modes, top_p);
        if (mf_profile_layer(p, lm->target_layer) == NULL)
            abort(); /* a listed layer must be found */
    }
    mf_profile_free(p);
    return 0;
}
