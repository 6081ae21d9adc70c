/*
 * bench_baselines — what a user would use instead of mapflowd, measured on the same FP8
 * rows in the same run: memcpy in one process (the ceiling of a same-node copy), Redis
 * over a unix socket (hiredis; SET / GET of the same row bytes) and RocksDB opened
 * directly through its C API with the daemon's own options (the ceiling of the SSD tier).
 *
 * Ownership: the arg belongs to the caller; mfb_rocks_open/close own the DB handle in
 * it. Thread safety: job callbacks run on the harness's client threads; the RocksDB
 * handle is shared (RocksDB is thread-safe), each Redis connection is per client.
 */
#ifndef BENCH_BASELINES_H
#define BENCH_BASELINES_H

#include <stdatomic.h>

#include "bench_rows.h"
#include "bench_util.h"

typedef enum mfb_base_op {
    MFB_BASE_MEMCPY,    /* memcpy of one FP8 row into the client's buffer */
    MFB_BASE_VERIFY,    /* mf_row_decode with the checksum: what libmapflow spends per row */
    MFB_BASE_REDIS_SET,
    MFB_BASE_REDIS_GET,
    MFB_BASE_ROCKS_GET, /* one pass: each FP8 row once, rocksdb_get */
} mfb_base_op_t;

typedef struct mfb_base_arg {
    const mfb_workload_t *w;
    mfb_base_op_t op;
    const char *redis_socket;
    void *rocks;           /* rocksdb_t *, from mfb_rocks_open */
    void *rocks_ro;        /* rocksdb_readoptions_t * */
    atomic_size_t next;
} mfb_base_arg_t;

/* 1 when built with hiredis (pkg-config found it), else the Redis jobs are skipped. */
int mfb_have_redis(void);

void mfb_base_job(mfb_job_t *job, mfb_base_arg_t *arg);

/* Stores every FP8 row in Redis once (SET). 0 = ok. */
int mfb_redis_load(mfb_base_arg_t *arg);

/*
 * Opens a fresh RocksDB in dir with the daemon's SSD-tier options (blob files for values
 * ≥ 4 KiB, no compression, WAL on), writes every FP8 row and flushes the memtable so
 * reads come from the blob files as the daemon's do in steady state. direct_reads: reads
 * with O_DIRECT (use_direct_reads), past the page cache. 0 = ok.
 */
int mfb_rocks_open(mfb_base_arg_t *arg, const char *dir, int direct_reads);
void mfb_rocks_close(mfb_base_arg_t *arg);

#endif /* BENCH_BASELINES_H */
