/* tier — GPU tier probe and the built-in transports' descriptions (see tier.h). */
#include "tier.h"

const mfd_transport_t mfd_transport_unix = {"unix", 0, 1};
const mfd_transport_t mfd_transport_tcp = {"tcp", 1, 0};

int mfd_tier_gpu_probe(uint64_t gpu_bytes, const char **why)
{
    if (gpu_bytes == 0) {
        *why = "gpu_bytes is 0";
        return 0;
    }
    *why = "this mapflowd was built without CUDA";
    return 0;
}
