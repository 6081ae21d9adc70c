/*
 * tier — the seam where tiers and transports plug in (DESIGN §7).
 *
 * A tier reports mfd_tier_info_t (the Stats / Health / metrics view): the host tier
 * (arena.h), the SSD tier (tier_ssd.h) and the GPU tier (tier_gpu.h: a cuMemAlloc arena
 * per device, exported as CUDA IPC handles; off, with why, without a driver or GPU).
 * A transport (unix socket and TCP today; UCX later) is a listener
 * that hands accepted byte streams to the server: mfd_transport_t below is what a UCX
 * listener will implement.
 *
 * Thread safety: loop thread only.
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

/* A control-plane transport: starts listening and reports its bound address. */
typedef struct mfd_transport {
    const char *name;          /* "unix", "tcp", later "ucx" */
    int requires_token;        /* Hello.token must match config `token` */
    int can_pass_fds;          /* SCM_RIGHTS possible (host arena) */
} mfd_transport_t;

extern const mfd_transport_t mfd_transport_unix;
extern const mfd_transport_t mfd_transport_tcp;

#endif /* MFD_TIER_H */
