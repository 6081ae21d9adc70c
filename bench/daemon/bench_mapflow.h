/*
 * bench_mapflow — the mapflowd side of the benchmark: each client thread opens its own
 * libmapflow channel (unix socket, host arena mapped) and runs one kind of call in a
 * loop; plus the untimed helpers that load the workload into the daemon and push it
 * down to the SSD tier.
 *
 * Ownership: the arg (and the workload it points to) belong to the caller and must
 * outlive the job. Thread safety: the job callbacks run on the harness's client threads;
 * they only read the workload and touch the arg's atomics.
 */
#ifndef BENCH_MAPFLOW_H
#define BENCH_MAPFLOW_H

#include <stdatomic.h>
#include <stdint.h>

#include "bench_rows.h"
#include "bench_util.h"
#include "mapflow.h"

typedef enum mfb_mf_op {
    MFB_MF_PUT,          /* mf_put of FP8 rows (replacing the same keys) */
    MFB_MF_GET_COPY,     /* mf_get of one FP8 row into the client's buffer (see the arg's
                          * verify_header and no_arena for the channel's variants) */
    MFB_MF_GET_LEASE,    /* mf_get_lease + mf_release: zero-copy view of the arena */
    MFB_MF_GET_LEASE_COPY, /* lease, memcpy into the client's buffer, release: what mf_get
                            * could do on a channel holding the arena */
    MFB_MF_LOOKUP,       /* mf_lookup: lookup_blocks × all mask layers in one call */
    MFB_MF_PREFIX_COPY,  /* mf_get_prefix, copy mode: all blocks × prefix_layers */
    MFB_MF_PREFIX_LEASE, /* mf_get_prefix, lease mode, then mf_release_result */
    MFB_MF_SSD_GET,      /* one pass: each FP8 row once (copied into the client's buffer) */
    MFB_MF_MIXED,        /* sources put, targets look up and fetch (see the .c) */
    MFB_MF_POPULATE,     /* one pass: put every row of the workload (untimed setup) */
} mfb_mf_op_t;

typedef struct mfb_mf_arg {
    const char *target;          /* "unix:PATH" */
    const mfb_workload_t *w;
    mfb_mf_op_t op;
    uint32_t lookup_blocks;      /* LOOKUP: prefix length in blocks */
    uint32_t prefix_layers;      /* PREFIX_*: layers per call */
    uint32_t prefix_blocks;      /* PREFIX_*: blocks per layer (0 = all) */
    atomic_size_t next;          /* pass-style ops: next row to take */
    atomic_uint_fast64_t ssd_rows; /* SSD_GET: rows the daemon said came from the ssd tier */
    int verify_header;           /* client channels skip the checksum of arena rows
                                  * (MF_VERIFY_HEADER) */
    int no_arena;                /* client channels do not map the arena: copy gets come
                                  * over the socket */
} mfb_mf_arg_t;

/* Fills job with the callbacks for arg->op; the caller sets clients / seconds / names. */
void mfb_mapflow_job(mfb_job_t *job, mfb_mf_arg_t *arg);

/* Names of the mixed workload's op kinds, in the kind order the job records. */
extern const char *const mfb_mixed_kinds[4];

/* Opens one channel with the host arena; prints why on failure. */
mf_status_t mfb_mapflow_open(const char *target, mf_channel_t **out);
/* The same with the arena only when want_arena, checking arena rows as `verify`. */
mf_status_t mfb_mapflow_open_with(const char *target, int want_arena, mf_verify_t verify,
                                  mf_channel_t **out);

/*
 * Demotes everything on the host tier (host → ssd) and checks that the FP8 rows are
 * gone from it. *evicted_bytes receives what the daemon reports. Untimed helper.
 */
mf_status_t mfb_mapflow_evict_host(const char *target, uint64_t *evicted_bytes);

/*
 * Waits (at most max_s) until the daemon's SSD write-through queue has drained, so the
 * next measurement does not pay for the previous one's backlog. Prints how long it took
 * and how many writes completed meanwhile. Untimed helper.
 */
void mfb_mapflow_settle(const char *target, double max_s, const char *when);

/* Sets a live daemon config key (e.g. write_through); prints why on failure. */
mf_status_t mfb_mapflow_config(const char *target, const char *key, const char *value);

/* Waits (at most max_s) until the SSD tier holds as many rows as the host tier, or its
 * row count stands still for 500 ms (the write-through queue is idle); prints an INFO
 * line. 0 = drained. */
int mfb_mapflow_wait_ssd(const char *target, double max_s, const char *when);

/* Prints "INFO\tdaemon ..." lines with tier usage from mf_stats. */
void mfb_mapflow_print_stats(const char *target, const char *when);

#endif /* BENCH_MAPFLOW_H */
