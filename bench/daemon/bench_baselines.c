/* bench_baselines — memcpy, Redis (hiredis) and direct RocksDB on the benchmark's rows. */
#include "bench_baselines.h"

#include <rocksdb/c.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef MFB_HAVE_HIREDIS
#include <hiredis/hiredis.h>
#endif

typedef struct base_client {
    uint8_t *buf;
    size_t cap;
#ifdef MFB_HAVE_HIREDIS
    redisContext *redis;
#endif
} base_client_t;

int mfb_have_redis(void)
{
#ifdef MFB_HAVE_HIREDIS
    return 1;
#else
    return 0;
#endif
}

/* Same key bytes for Redis and RocksDB: model, layer, prefix hash (as the daemon keys it,
 * minus the namespace), so both stores see keys of realistic length. */
static size_t row_key(const mfb_workload_t *w, const mfb_row_t *r, char *out, size_t cap)
{
    uint8_t h[16];
    mf_hash_to_le(r->hash, h);
    int n = snprintf(out, cap, "%s/%s/%u/", MFB_NS, w->fp8_cx.model, r->layer);
    if (n < 0 || (size_t)n + 16 > cap)
        return 0;
    memcpy(out + n, h, 16);
    return (size_t)n + 16;
}

#ifdef MFB_HAVE_HIREDIS
static redisContext *redis_connect(const char *path, char *err, size_t errlen)
{
    redisContext *rc = redisConnectUnix(path);
    if (!rc || rc->err) {
        snprintf(err, errlen, "redis connect %s: %s", path, rc ? rc->errstr : "no memory");
        if (rc)
            redisFree(rc);
        return NULL;
    }
    return rc;
}

/* SET key row; 0 = ok. */
static int redis_set(redisContext *rc, const mfb_workload_t *w, const mfb_row_t *r, char *err,
                     size_t errlen)
{
    char key[320];
    size_t kl = row_key(w, r, key, sizeof(key));
    redisReply *rep = redisCommand(rc, "SET %b %b", key, kl, r->data, r->len);
    int ok = rep && rep->type == REDIS_REPLY_STATUS;
    if (!ok)
        snprintf(err, errlen, "redis SET: %s", rep ? (rep->str ? rep->str : "?") : rc->errstr);
    if (rep)
        freeReplyObject(rep);
    return ok ? 0 : -1;
}
#endif

static int client_open(mfb_client_t *c, void *argp)
{
    mfb_base_arg_t *a = argp;
    base_client_t *b = calloc(1, sizeof(*b));
    if (!b)
        return -1;
    c->state = b;
    if (!(b->buf = mfb_buffer_new(a->w->fp8_max_len, &b->cap)))
        return -1;
    if (a->op == MFB_BASE_REDIS_SET || a->op == MFB_BASE_REDIS_GET) {
#ifdef MFB_HAVE_HIREDIS
        b->redis = redis_connect(a->redis_socket, c->err, sizeof(c->err));
        if (!b->redis) {
            fprintf(stderr, "bench: %s\n", c->err);
            return -1;
        }
#else
        return -1;
#endif
    }
    return 0;
}

static void client_close(mfb_client_t *c, void *argp)
{
    (void)argp;
    base_client_t *b = c->state;
    if (!b)
        return;
#ifdef MFB_HAVE_HIREDIS
    if (b->redis)
        redisFree(b->redis);
#endif
    free(b->buf);
    free(b);
    c->state = NULL;
}

static const mfb_row_t *fp8_pick(const mfb_base_arg_t *a, const mfb_client_t *c)
{
    return &a->w->fp8[(c->id + c->ops * (uint64_t)c->n_clients) % a->w->n_fp8];
}

static mfb_op_rc_t step_redis(mfb_client_t *c, mfb_base_arg_t *a, base_client_t *b,
                              uint64_t *bytes)
{
#ifdef MFB_HAVE_HIREDIS
    const mfb_row_t *r = fp8_pick(a, c);
    if (a->op == MFB_BASE_REDIS_SET) {
        if (redis_set(b->redis, a->w, r, c->err, sizeof(c->err)))
            return MFB_OP_ERR;
        *bytes = r->len;
        return MFB_OP_OK;
    }
    char key[320];
    size_t kl = row_key(a->w, r, key, sizeof(key));
    redisReply *rep = redisCommand(b->redis, "GET %b", key, kl);
    mfb_op_rc_t rc = MFB_OP_OK;
    if (!rep || rep->type != REDIS_REPLY_STRING || (size_t)rep->len != r->len) {
        mfb_client_error(c, "redis GET: %s", rep ? "wrong reply" : b->redis->errstr);
        rc = MFB_OP_ERR;
    } else if (c->ops == 0 && memcmp(rep->str, r->data, r->len)) {
        mfb_client_error(c, "redis GET returned different bytes");
        rc = MFB_OP_ERR;
    }
    /* hiredis has already copied the value out of its read buffer into the reply: that
     * is the copy the caller gets, so no further memcpy is charged to Redis. */
    if (rep)
        freeReplyObject(rep);
    *bytes = r->len;
    return rc;
#else
    (void)c, (void)a, (void)b, (void)bytes;
    return MFB_OP_ERR;
#endif
}

static mfb_op_rc_t step_rocks(mfb_client_t *c, mfb_base_arg_t *a, base_client_t *b,
                              uint64_t *bytes)
{
    size_t i = atomic_fetch_add(&a->next, 1);
    if (i >= a->w->n_fp8)
        return MFB_OP_DONE;
    const mfb_row_t *r = &a->w->fp8[i];
    char key[320], *err = NULL;
    size_t kl = row_key(a->w, r, key, sizeof(key)), vl = 0;
    /* The fastest read the C API offers: pinned (no allocation of a multi-MiB value per
     * get, which rocksdb_get pays in page faults), then one copy into the client's
     * reused buffer: the caller's copy, as the daemon's SSD tier makes it. */
    rocksdb_pinnableslice_t *ps = rocksdb_get_pinned(a->rocks, a->rocks_ro, key, kl, &err);
    const char *v = ps ? rocksdb_pinnableslice_value(ps, &vl) : NULL;
    mfb_op_rc_t rc = MFB_OP_OK;
    if (err || !v || vl != r->len || vl > b->cap) {
        mfb_client_error(c, "rocksdb_get_pinned: %s", err ? err : "missing or wrong length");
        rc = MFB_OP_ERR;
    } else {
        memcpy(b->buf, v, vl);
        __asm__ __volatile__("" : : "r"(b->buf) : "memory");
        if (c->ops == 0 && memcmp(b->buf, r->data, vl)) {
            mfb_client_error(c, "rocksdb returned different bytes");
            rc = MFB_OP_ERR;
        }
    }
    rocksdb_free(err);
    rocksdb_pinnableslice_destroy(ps);
    *bytes = r->len;
    return rc;
}

static mfb_op_rc_t client_step(mfb_client_t *c, void *argp, uint64_t *bytes)
{
    mfb_base_arg_t *a = argp;
    base_client_t *b = c->state;
    switch (a->op) {
    case MFB_BASE_MEMCPY: {
        const mfb_row_t *r = fp8_pick(a, c);
        memcpy(b->buf, r->data, r->len);
        /* Keep the compiler from proving the copy dead. */
        __asm__ __volatile__("" : : "r"(b->buf) : "memory");
        *bytes = r->len;
        return MFB_OP_OK;
    }
    case MFB_BASE_VERIFY: {
        const mfb_row_t *r = fp8_pick(a, c);
        mf_row_view_t v;
        const char *why = "";
        if (mf_row_decode(r->data, r->len, 0, &v, &why) != MF_OK) {
            mfb_client_error(c, "decode: %s", why);
            return MFB_OP_ERR;
        }
        *bytes = r->len;
        return MFB_OP_OK;
    }
    case MFB_BASE_REDIS_SET:
    case MFB_BASE_REDIS_GET:
        return step_redis(c, a, b, bytes);
    case MFB_BASE_ROCKS_GET:
        return step_rocks(c, a, b, bytes);
    }
    return MFB_OP_ERR;
}

void mfb_base_job(mfb_job_t *job, mfb_base_arg_t *arg)
{
    static const char *const systems[] = {"memcpy", "memcpy", "redis", "redis", "rocksdb"};
    job->system = systems[arg->op];
    job->arg = arg;
    job->open = client_open;
    job->step = client_step;
    job->close = client_close;
    job->n_kinds = 0;
    atomic_store(&arg->next, 0);
}

int mfb_redis_load(mfb_base_arg_t *arg)
{
#ifdef MFB_HAVE_HIREDIS
    char err[256];
    redisContext *rc = redis_connect(arg->redis_socket, err, sizeof(err));
    int bad = !rc;
    for (size_t i = 0; !bad && i < arg->w->n_fp8; i++)
        bad = redis_set(rc, arg->w, &arg->w->fp8[i], err, sizeof(err)) != 0;
    if (bad)
        fprintf(stderr, "bench: %s\n", err);
    if (rc)
        redisFree(rc);
    return bad ? -1 : 0;
#else
    (void)arg;
    return -1;
#endif
}

int mfb_rocks_open(mfb_base_arg_t *arg, const char *dir, int direct_reads)
{
    char *err = NULL;
    rocksdb_options_t *o = rocksdb_options_create();
    rocksdb_options_set_create_if_missing(o, 1);
    rocksdb_options_increase_parallelism(o, 2);
    rocksdb_options_set_enable_blob_files(o, 1);
    rocksdb_options_set_min_blob_size(o, 4096);
    rocksdb_options_set_enable_blob_gc(o, 1);
    rocksdb_options_set_compression(o, rocksdb_no_compression);
    rocksdb_options_set_blob_compression_type(o, rocksdb_no_compression);
    rocksdb_options_set_use_direct_reads(o, direct_reads ? 1 : 0);
    rocksdb_t *db = rocksdb_open(o, dir, &err);
    rocksdb_options_destroy(o);
    if (!db) {
        fprintf(stderr, "bench: rocksdb_open %s: %s\n", dir, err ? err : "?");
        rocksdb_free(err);
        return -1;
    }
    rocksdb_writeoptions_t *wo = rocksdb_writeoptions_create();
    for (size_t i = 0; !err && i < arg->w->n_fp8; i++) {
        const mfb_row_t *r = &arg->w->fp8[i];
        char key[320];
        size_t kl = row_key(arg->w, r, key, sizeof(key));
        rocksdb_put(db, wo, key, kl, (const char *)r->data, r->len, &err);
    }
    rocksdb_writeoptions_destroy(wo);
    if (!err) {
        rocksdb_flushoptions_t *fo = rocksdb_flushoptions_create();
        rocksdb_flushoptions_set_wait(fo, 1);
        rocksdb_flush(db, fo, &err);
        rocksdb_flushoptions_destroy(fo);
    }
    if (err) {
        fprintf(stderr, "bench: rocksdb load: %s\n", err);
        rocksdb_free(err);
        rocksdb_close(db);
        return -1;
    }
    arg->rocks = db;
    arg->rocks_ro = rocksdb_readoptions_create();
    return 0;
}

void mfb_rocks_close(mfb_base_arg_t *arg)
{
    if (arg->rocks_ro)
        rocksdb_readoptions_destroy(arg->rocks_ro);
    if (arg->rocks)
        rocksdb_close(arg->rocks);
    arg->rocks = arg->rocks_ro = NULL;
}
