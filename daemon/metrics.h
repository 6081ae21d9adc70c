/*
 * metrics — mapflowd's counters, gauges and latency histograms, rendered in the
 * Prometheus text format (version 0.0.4) for GET /metrics and as name/value pairs for
 * the Stats reply (the same names without the `mapflowd_` prefix).
 *
 * Names follow Prometheus conventions: one prefix, base units (`_bytes`, `_seconds`),
 * `_total` on counters, low-cardinality labels (tier, op, code). Token-level hit
 * counters come with their denominators (…_requested_tokens_total), so hit rates
 * can be computed per tier. Histograms use exponential buckets 1e-5 s … 1 s (×√10).
 * A counter family named `…_microseconds_total` below counts whole microseconds: Stats
 * (integers) carries it under that name, /metrics as `…_seconds_total` in seconds (the
 * base unit `promtool check metrics` asks for). /metrics also has the standard process_*
 * families of the client libraries (CPU seconds, resident and virtual memory, open and
 * maximum fds, start time), read from /proc/self at each scrape.
 *
 * Ownership: plain struct, no allocation except the rendered text (caller frees).
 * Thread safety: updated and rendered on the loop thread only (SSD completions are
 * delivered there too), so nothing is atomic.
 */
#ifndef MFD_METRICS_H
#define MFD_METRICS_H

#include <stddef.h>
#include <stdint.h>
#include "mf_status.h"

/* X(ID, family, labels, help) — rows of one family must be adjacent. */
#define MFD_COUNTERS(X)                                                                     \
    X(LOOKUP_REQ_TOKENS, "lookup_requested_tokens_total", "",                               \
      "tokens asked about by Lookup, summed over requested layers")                         \
    X(LOOKUP_HIT_TOKENS, "lookup_hit_tokens_total", "",                                     \
      "tokens Lookup found cached, summed over requested layers")                           \
    X(GET_REQ_TOKENS, "get_requested_tokens_total", "", "tokens requested by prefix Get")   \
    X(GET_HIT_TOKENS_HOST, "get_hit_tokens_total", "tier=\"host\"",                         \
      "tokens served by Get, by the tier the row came from")                                \
    X(GET_HIT_TOKENS_SSD, "get_hit_tokens_total", "tier=\"ssd\"", "")                       \
    X(GET_HIT_TOKENS_GPU, "get_hit_tokens_total", "tier=\"gpu\"", "")                       \
    X(GET_MISS_TOKENS, "get_miss_tokens_total", "", "tokens requested by Get and not served") \
    X(PUTS, "puts_total", "", "rows committed")                                             \
    X(PUT_BYTES, "put_bytes_total", "", "bytes of rows committed")                          \
    X(PUT_REPLACED, "put_replaced_total", "", "commits that replaced an existing key")       \
    X(PUT_REJECTED, "put_rejected_total", "", "commits whose row failed validation")        \
    X(EVICT_HOST, "evictions_total", "tier=\"host\"",                                       \
      "entries that left a tier (watermark, Evict or budget)")                              \
    X(EVICT_SSD, "evictions_total", "tier=\"ssd\"", "")                                     \
    X(EVICT_GPU, "evictions_total", "tier=\"gpu\"", "")                                     \
    X(DEMOTIONS, "demotions_total", "", "rows moved from the host to the SSD tier")         \
    X(PROMOTIONS, "promotions_total", "", "rows moved from the SSD to the host tier")       \
    X(GPU_DEMOTIONS, "gpu_demotions_total", "",                                             \
      "GPU-tier rows copied down (DtoH) to the host tier, or the SSD tier when host is full") \
    X(GPU_PROMOTIONS, "gpu_promotions_total", "",                                           \
      "host-tier rows copied to the GPU tier on a hit (gpu_promote on)")                    \
    X(GPU_STAGED, "gpu_staged_total", "",                                                   \
      "GPU rows copied to host memory for a client that did not map their arena")           \
    X(GPU_VERIFY_GPU, "gpu_rows_validated_total", "on=\"gpu\"",                             \
      "GPU-tier rows accepted at commit, by where their checksum ran")                      \
    X(GPU_VERIFY_HOST, "gpu_rows_validated_total", "on=\"host\"", "")                       \
    X(GPU_COMMIT_CHECK_US, "gpu_commit_check_microseconds_total", "",                       \
      "time commits of GPU rows spent getting bytes and checksum from the GPU (copies, "    \
      "kernels, synchronize)")                                                              \
    X(GPU_COMMIT_US, "gpu_commit_microseconds_total", "",                                   \
      "time commits of GPU rows spent in the store (the check above, decode, index)")       \
    X(REGION_COMMITS, "put_regions_committed_total", "",                                    \
      "put regions committed (PutRegionCommit)")                                            \
    X(REGION_CHECK_US, "put_region_check_microseconds_total", "",                           \
      "time region commits spent getting headers, prefixes and checksums from the GPU")     \
    X(SSD_WRITES, "ssd_writes_total", "", "rows submitted for writing to the SSD tier")     \
    X(SSD_WRITES_DONE, "ssd_writes_completed_total", "",                                    \
      "SSD tier writes that finished successfully")                                         \
    X(SSD_WRITES_CANCELLED, "ssd_writes_cancelled_total", "",                               \
      "queued write-throughs taken back because their row was replaced or removed first")   \
    X(SSD_WRITE_BYTES, "ssd_write_bytes_total", "", "bytes written to the SSD tier")        \
    X(SSD_READS, "ssd_reads_total", "", "rows read from the SSD tier")                      \
    X(SSD_READ_BYTES, "ssd_read_bytes_total", "", "bytes read from the SSD tier")           \
    X(SSD_ERRORS, "ssd_errors_total", "", "failed RocksDB operations")                      \
    X(DATA_LOSS, "data_loss_total", "",                                                     \
      "hits refused: token / parent-hash mismatch or checksum failure")                     \
    X(HASH_MISMATCH, "hash_mismatches_total", "",                                           \
      "hits whose stored tokens or parent hash differ from the request (answered as misses)") \
    X(SSD_CORRUPT, "ssd_corrupt_rows_total", "",                                            \
      "rows read back from the SSD tier corrupt (RocksDB or row checksum): DATA_LOSS, dropped") \
    X(SSD_FULL, "ssd_full_refusals_total", "",                                              \
      "durable puts refused (RESOURCE_EXHAUSTED): the SSD budget is held by durable rows")  \
    X(LEASES_GRANTED, "leases_granted_total", "", "read leases granted")                   \
    X(LEASES_EXPIRED, "leases_expired_total", "", "read leases that ran out their TTL")     \
    X(RESERVATIONS_EXPIRED, "reservations_expired_total", "",                               \
      "put reservations that ran out their TTL")                                            \
    X(CONN_ACCEPTED, "connections_accepted_total", "", "client connections accepted")       \
    X(CONN_REJECTED, "connections_rejected_total", "",                                      \
      "connections refused (limit, bad Hello, bad token)")                                 \
    X(CONN_FRAME_TIMEOUT, "connections_closed_total", "reason=\"frame_timeout\"",            \
      "connections the daemon closed, by reason (the config key that closed it: a partial " \
      "frame, no Hello, silence, unread replies)")                                       \
    X(CONN_HELLO_TIMEOUT, "connections_closed_total", "reason=\"hello_timeout\"", "")        \
    X(CONN_IDLE_TIMEOUT, "connections_closed_total", "reason=\"idle_timeout\"", "")          \
    X(CONN_UNSENT, "connections_closed_total", "reason=\"max_unsent\"", "")                  \
    X(ACCEPT_PAUSED, "accept_paused_total", "",                                             \
      "times the listeners stopped accepting because the daemon ran out of descriptors")   \
    X(ADMIN_DENIED, "admin_denied_total", "",                                               \
      "admin requests and peer names refused with PERMISSION_DENIED")

typedef enum mfd_counter {
#define MFD_CNT_ENUM_(id, fam, lab, help) MFD_C_##id,
    MFD_COUNTERS(MFD_CNT_ENUM_)
#undef MFD_CNT_ENUM_
    MFD_C_COUNT
} mfd_counter_t;

typedef enum mfd_hist_id { MFD_H_PUT, MFD_H_GET, MFD_H_LOOKUP, MFD_H_COUNT } mfd_hist_id_t;
#define MFD_HIST_BUCKETS 11 /* 1e-5 … 1 s, ×√10 */

typedef struct mfd_hist {
    uint64_t bucket[MFD_HIST_BUCKETS]; /* non-cumulative; rendered cumulative */
    uint64_t count;
    double sum;
} mfd_hist_t;

#define MFD_MAX_OPS 80

typedef struct mfd_metrics {
    uint64_t c[MFD_C_COUNT];
    uint64_t errors[MF_STATUS_COUNT];   /* ErrorReply / per-row failures by status */
    uint64_t requests[MFD_MAX_OPS];     /* by Envelope body case */
    mfd_hist_t hist[MFD_H_COUNT];
} mfd_metrics_t;

/* Gauges the renderer asks the daemon for. Tier index: 0 gpu, 1 host, 2 ssd. */
typedef struct mfd_tier_gauge {
    const char *name;
    int enabled;
    uint64_t used, capacity, entries;
} mfd_tier_gauge_t;

/* One GPU arena (the gpu tier's rows per device). */
#define MFD_GAUGE_GPU_ARENAS 16 /* arenas shown; more are summed in tiers[0] only */
typedef struct mfd_gpu_gauge {
    int device;              /* the daemon's CUDA ordinal */
    uint64_t used, capacity, entries;
} mfd_gpu_gauge_t;

/* The process_* families, from /proc/self (Linux). ok = 0: not rendered. */
typedef struct mfd_process_gauge {
    int ok;
    double cpu_seconds;        /* user + system */
    double start_time_seconds; /* since the Unix epoch */
    uint64_t resident_bytes, virtual_bytes, open_fds, max_fds;
} mfd_process_gauge_t;

/* Fills *p from /proc/self/stat, /proc/stat (boot time), /proc/self/fd and
 * RLIMIT_NOFILE; MF_UNAVAILABLE (p->ok = 0) where /proc cannot be read. */
mf_status_t mfd_process_read(mfd_process_gauge_t *p);

typedef struct mfd_gauges {
    mfd_tier_gauge_t tiers[3];
    size_t n_gpu;
    mfd_gpu_gauge_t gpu[MFD_GAUGE_GPU_ARENAS];
    uint64_t connections, leases, reservations, regions, ssd_inflight;
    uint64_t wt_backlog_bytes;  /* async write-through: queued + deferred row bytes */
    double uptime_s;
    int ready;
    const char *version;
    mfd_process_gauge_t proc; /* /metrics only (mfd_process_read) */
} mfd_gauges_t;

void mfd_metrics_init(mfd_metrics_t *m);
static inline void mfd_count(mfd_metrics_t *m, mfd_counter_t c, uint64_t n)
{
    m->c[c] += n;
}
void mfd_metrics_error(mfd_metrics_t *m, mf_status_t st);
void mfd_metrics_request(mfd_metrics_t *m, int body_case);
void mfd_metrics_observe(mfd_metrics_t *m, mfd_hist_id_t h, double seconds);
/* One observation into any histogram with the standard buckets (e.g. a peer's own). */
void mfd_hist_observe(mfd_hist_t *x, double seconds);

/* Upper bound of bucket i, in seconds. */
double mfd_hist_bound(int i);

/*
 * The Prometheus text builder, for families other modules own (peer.c's): a family's
 * HELP / TYPE once, then its samples. Names are given without the `mapflowd_` prefix;
 * `labels` is "" or preformatted constant pairs (`tier="host"`); a label value from
 * outside (a peer address) goes through mfd_prom_labelled, which escapes it. Out of
 * memory is sticky: later calls do nothing and the render returns NULL.
 */
typedef struct mfd_prom {
    char *p;
    size_t len, cap;
    int oom;
} mfd_prom_t;
void mfd_prom_family(mfd_prom_t *b, const char *name, const char *type, const char *help);
void mfd_prom_u64(mfd_prom_t *b, const char *name, const char *labels, uint64_t v);
void mfd_prom_labelled(mfd_prom_t *b, const char *name, const char *key, const char *value,
                       uint64_t v);
/* A histogram's _bucket (cumulative, le appended to labels), _sum and _count rows. */
void mfd_prom_hist(mfd_prom_t *b, const char *name, const char *labels, const mfd_hist_t *h);

/* Appends the families of another module (may be NULL). */
typedef void (*mfd_prom_more_cb)(mfd_prom_t *b, void *arg);

/* Prometheus text; malloc'd, NUL-terminated; *len excludes the NUL. NULL on OOM. */
char *mfd_metrics_render(const mfd_metrics_t *m, const mfd_gauges_t *g, mfd_prom_more_cb more,
                         void *more_arg, size_t *len);

/* Counter rows as Stats names (`family{labels}`), for the Stats reply. */
typedef void (*mfd_metric_visit_cb)(const char *name, uint64_t value, void *arg);
void mfd_metrics_visit(const mfd_metrics_t *m, mfd_metric_visit_cb cb, void *arg);

#endif /* MFD_METRICS_H */
