/* tier — the built-in transports' descriptions (see tier.h). */
#include "tier.h"

const mfd_transport_t mfd_transport_unix = {"unix", 0, 1};
const mfd_transport_t mfd_transport_tcp = {"tcp", 1, 0};
