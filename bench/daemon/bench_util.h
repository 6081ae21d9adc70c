/*
 * bench_util — the closed-loop load harness of mapflow-bench-daemon: N client threads,
 * each with its own state (a channel, a redis connection, a buffer), run one operation
 * in a loop until a time bound or a count bound, recording every latency (reservoir
 * sampled past a cap, so percentiles stay unbiased on long runs).
 *
 * Ownership: the job and its shared argument belong to the caller; each client's state
 * is created by job->open and freed by job->close on the client's own thread.
 * Thread safety: mfb_run is called from one thread at a time; the job callbacks run on
 * the client threads, concurrently, so anything shared through job->arg must be
 * read-only or atomic. The RNG helpers are pure on caller state.
 */
#ifndef BENCH_UTIL_H
#define BENCH_UTIL_H

#include <stddef.h>
#include <stdint.h>

#define MFB_MAX_CLIENTS 256

/* What one step of a client loop did. */
typedef enum mfb_op_rc {
    MFB_OP_OK = 0,    /* one operation done, *bytes moved */
    MFB_OP_DONE = 1,  /* nothing left for this client (pass-style jobs) */
    MFB_OP_ERR = -1,  /* the operation failed; the loop stops for this client */
} mfb_op_rc_t;

typedef struct mfb_client {
    int id;
    int n_clients;
    void *state;           /* job->open sets it */
    uint64_t rng;          /* seeded per client */
    uint64_t ops, bytes, errors;
    uint32_t *lat;         /* latency samples in 100 ns ticks (reservoir) */
    size_t lat_n, lat_cap;
    double t_start, t_end; /* monotonic seconds */
    char err[200];         /* first error of this client */
    /* Extra per-op-kind samples for mixed jobs (kind chosen by the step). */
    int kind;              /* the step sets the kind of the op it just did */
    uint64_t kind_ops[4];
    uint32_t *kind_lat[4];
    size_t kind_n[4];
} mfb_client_t;

typedef struct mfb_job {
    const char *system;    /* "mapflow", "redis", "rocksdb", "memcpy" */
    const char *op;        /* "get_copy", "lookup_512x16", ... */
    int n_clients;
    double seconds;        /* time bound of the measured loop */
    uint64_t max_ops;      /* per-client count bound; 0 = none */
    int n_kinds;           /* > 0: record per-kind latencies too (mixed workloads) */
    const char *const *kind_names;
    void *arg;
    int (*open)(mfb_client_t *c, void *arg);   /* 0 = ok; untimed */
    mfb_op_rc_t (*step)(mfb_client_t *c, void *arg, uint64_t *bytes);
    void (*close)(mfb_client_t *c, void *arg); /* untimed */
} mfb_job_t;

typedef struct mfb_result {
    uint64_t ops, bytes, errors;
    double wall_s, ops_per_s, gbps;  /* gbps: 1e9 bytes per second */
    double p50_us, p99_us, mean_us;
    char err[200];                   /* first error, "" if none */
    int n_kinds;                     /* mixed jobs: per-kind counts and latencies */
    struct {
        uint64_t ops;
        double p50_us, p99_us;
    } kind[4];
} mfb_result_t;

double mfb_now(void);

/* Runs the job; 0 on success (even with op errors, which are counted), -1 if the
 * clients could not be started or opened. */
int mfb_run(const mfb_job_t *job, mfb_result_t *out);

/* One machine-readable line on stdout (plus one per kind of a mixed job, op "OP/KIND"):
 * RESULT<TAB>system=..<TAB>op=..<TAB>clients=N<TAB>ops=..<TAB>... */
void mfb_result_print(const mfb_job_t *job, const mfb_result_t *r, const char *extra);

/* Sets the client's first error (printf style) unless one is already recorded. */
void mfb_client_error(mfb_client_t *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* A client's own 16-byte aligned buffer of at least len bytes (*cap gets its size),
 * with every page touched so page faults stay out of the measured copies. Free it. */
uint8_t *mfb_buffer_new(size_t len, size_t *cap);

/* splitmix64: small, seedable, good enough for workloads. */
uint64_t mfb_rand(uint64_t *state);
double mfb_rand01(uint64_t *state);

#endif /* BENCH_UTIL_H */
