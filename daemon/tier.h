/*
 * tier — what every tier reports: mfd_tier_info_t, the Stats / Health / metrics view of
 * the host tier (arena.h), the SSD tier (tier_ssd.h) and the GPU tier (tier_gpu.h: a
 * cuMemAlloc arena per device, exported as CUDA IPC handles; off, with why, without a
 * driver or GPU). A plain description, filled by mfd_store_tiers (store.c).
 * (Transports — unix, TCP, UCX — are conn.h's mfd_transport_t.)
 *
 * Ownership: the strings point into the store or static text, valid while it is open.
 * Thread safety: none of its own (data only); filled on the loop thread.
 */
#ifndef MFD_TIER_H
#define MFD_TIER_H

#include <stdint.h>
#include "mapflow.pb-c.h"

typedef struct mfd_tier_info {
    Mapflow__V1__Tier tier;
    const char *name;          /* "gpu", "host", "ssd" */
    int enabled;
    uint64_t used_bytes, capacity_bytes, entries;
    const char *why_off;       /* when !enabled */
} mfd_tier_info_t;

#endif /* MFD_TIER_H */
