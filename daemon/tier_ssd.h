/*
 * tier_ssd — the SSD tier: RocksDB under data_dir/rocksdb (blob files for values of
 * 4 KiB and more, WAL on) driven by a small pool of worker threads.
 *
 * Records (the first byte says which):
 *   'r' key  → the row bytes (key = index.h's key bytes)
 *   'm' key  → 16 bytes: u64 LE row size, u32 LE block index, u32 LE flags (1 = durable)
 *   'p' u8 ns_len ns u8 src_len src u8 tgt_len tgt → a packed MappingProfile
 * 'r' and 'm' of one key are written and deleted in one WriteBatch. At start the
 * daemon rebuilds its index from the small 'm' records alone (mfd_ssd_scan), so a
 * restart — even after SIGKILL, for rows written with sync — finds every row again.
 *
 * Threads: jobs are queued to worker (hash(key) mod io_threads), so operations on one
 * key run in submission order (a delete never overtakes the write it follows). A
 * finished job goes on a done list and an eventfd wakes the loop, which runs the
 * job's callback on the loop thread (mfd_ssd_attach). Submit, attach, drain and
 * destroy are loop-thread calls; callbacks run on the loop thread.
 *
 * Ownership: the caller allocates a job (mfd_ssd_job_new) and gets it back in the
 * callback, then frees it (mfd_ssd_job_free, which also frees a GET's result buffer
 * unless the caller took it). A PUT's value is borrowed: it must stay valid and
 * unchanged until the callback.
 */
#ifndef MFD_TIER_SSD_H
#define MFD_TIER_SSD_H

#include <event2/event.h>
#include <stddef.h>
#include <stdint.h>
#include "index.h"
#include "mf_status.h"

#define MFD_SSD_KEY_MAX 800 /* row keys ≤ MFD_KEY_MAX; profile keys ≤ 4 + 128 + 2×255 */

typedef enum mfd_ssd_op {
    MFD_SSD_PUT_ROW,   /* 'r' + 'm' */
    MFD_SSD_GET_ROW,   /* 'r' */
    MFD_SSD_DEL_ROW,   /* 'r' + 'm' */
    MFD_SSD_PUT_RAW,   /* key used as given (profiles) */
    MFD_SSD_GET_RAW,
    MFD_SSD_SCAN_RAW,  /* keys sharing key[0..prefix_len) from key on (profile lists) */
} mfd_ssd_op_t;

/* A scan's result buffer holds at most this many bytes of keys and values: a page is
 * cut short (more = 1) rather than grown past it. */
#define MFD_SSD_SCAN_BYTES (16u << 20)

typedef struct mfd_ssd mfd_ssd_t;
typedef struct mfd_ssd_job mfd_ssd_job_t;
typedef void (*mfd_ssd_cb)(mfd_ssd_job_t *job);

struct mfd_ssd_job {
    mfd_ssd_op_t op;
    uint8_t key[MFD_SSD_KEY_MAX];
    size_t klen;
    const void *value;         /* PUT: borrowed */
    size_t vlen;
    uint32_t block;            /* PUT_ROW meta */
    int sync;                  /* PUT / DEL: WriteOptions.sync */
    /* GET_ROW options: expect_len (0 = any) is the only length accepted (else
     * MF_DATA_LOSS); dst (expect_len bytes, 16-byte aligned, e.g. an arena block) takes
     * the value instead of a malloc'd `out`; check runs on the worker over the bytes
     * read (a non-OK result becomes the job's status, why its reason). */
    size_t expect_len;
    uint8_t *dst;
    mf_status_t (*check)(const uint8_t *row, size_t len, const mfd_ssd_job_t *j,
                         const char **why);
    const char *why;
    /* SCAN_RAW options: records whose key starts with key[0..prefix_len), from key on
     * (skipping key itself when skip_first), at most max_items of them. */
    size_t prefix_len;
    size_t max_items;
    int skip_first;
    mfd_ssd_cb cb;             /* NULL: fire and forget (the pool frees the job) */
    void *arg;
    void *arg2;
    /* results */
    mf_status_t status;        /* MF_OK, MF_NOT_FOUND (GET), MF_DATA_LOSS (GET: RocksDB
                                * reports corruption, or check refused the bytes),
                                * MF_INTERNAL / MF_UNAVAILABLE */
    uint8_t *out;              /* GET: malloc'd, 16-byte aligned, out_len bytes (no dst);
                                * SCAN: n_items records of u16 LE key-suffix length, the
                                * key after the prefix, u32 LE value length, the value
                                * (read them with mfd_ssd_scan_next) */
    size_t out_len;
    size_t n_items;            /* SCAN: records in out */
    int more;                  /* SCAN: matching records remain after the last one */
    mfd_ssd_job_t *next, *prev; /* the worker's queue (its mutex) */
    int queued;                 /* still in that queue, not started (its mutex) */
};

typedef struct mfd_ssd_options {
    const char *dir;           /* data_dir; the database lives in dir/rocksdb */
    unsigned io_threads;
    int reset;                 /* ssd_reset: a database that cannot be opened is moved aside */
} mfd_ssd_options_t;

/*
 * Opens (or creates) dir/rocksdb. A fresh database is created only where there is none:
 * a directory holding RocksDB data files (.sst, .blob, .log, MANIFEST-*) but no CURRENT
 * is refused (MF_FAILED_PRECONDITION; RocksDB would start empty and delete them), and a
 * database RocksDB cannot open is refused with its status in err (MF_DATA_LOSS for
 * corruption, else MF_UNAVAILABLE). With opt->reset such a directory is renamed to
 * dir/rocksdb.bad-SECONDS (mfd_ssd_set_aside) and an empty database created instead.
 */
mf_status_t mfd_ssd_open(const mfd_ssd_options_t *opt, mfd_ssd_t **out, char *err,
                         size_t errlen);
/* Renames dir/rocksdb to dir/rocksdb.bad-SECONDS[-N] (nothing is deleted); logs the new
 * name. */
mf_status_t mfd_ssd_set_aside(const char *dir, char *err, size_t errlen);
/* Registers the completion eventfd with the loop. */
mf_status_t mfd_ssd_attach(mfd_ssd_t *s, struct event_base *base);
/* Waits for every queued job and runs the pending callbacks (shutdown). */
void mfd_ssd_drain(mfd_ssd_t *s);
/* Drains, stops the workers and closes RocksDB. */
void mfd_ssd_close(mfd_ssd_t *s);

mfd_ssd_job_t *mfd_ssd_job_new(mfd_ssd_op_t op, const uint8_t *key, size_t klen);
void mfd_ssd_job_free(mfd_ssd_job_t *j);
void mfd_ssd_submit(mfd_ssd_t *s, mfd_ssd_job_t *j);
/* Takes a job back that no worker has started: 1 = done, its callback will never run
 * and the caller owns (and frees) it; 0 = it already runs or ran (the callback comes). */
int mfd_ssd_cancel(mfd_ssd_t *s, mfd_ssd_job_t *j);
/* Jobs submitted whose callbacks have not run yet. */
size_t mfd_ssd_inflight(const mfd_ssd_t *s);

/* Synchronous scan of the 'm' records (startup, before serving). A RocksDB error (e.g.
 * a corrupt block) is MF_DATA_LOSS / MF_UNAVAILABLE with its status in err. */
typedef void (*mfd_ssd_scan_cb)(const uint8_t *key, size_t klen, uint64_t size,
                                uint32_t block, uint32_t flags, void *arg);
mf_status_t mfd_ssd_scan(mfd_ssd_t *s, mfd_ssd_scan_cb cb, void *arg, char *err,
                         size_t errlen);

/* Steps through a SCAN_RAW result: *pos starts at 0; returns 0 at the end. */
int mfd_ssd_scan_next(const mfd_ssd_job_t *j, size_t *pos, const uint8_t **suffix,
                      size_t *slen, const uint8_t **val, size_t *vlen);

/* Builds a 'p' record key; returns its length or 0 when a part is too long. */
size_t mfd_ssd_profile_key(uint8_t out[MFD_SSD_KEY_MAX], const char *ns,
                           const char *src, const char *tgt);
/* The prefix every 'p' key of namespace ns starts with ('p' u8 ns_len ns); its length. */
size_t mfd_ssd_profile_prefix(uint8_t out[MFD_SSD_KEY_MAX], const char *ns);

#endif /* MFD_TIER_SSD_H */
