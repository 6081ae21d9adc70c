/* tier_ssd — RocksDB + worker pool + eventfd completions (see tier_ssd.h). */
#include "tier_ssd.h"
#include "log.h"

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <rocksdb/c.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

typedef struct worker {
    pthread_t tid;
    mfd_ssd_t *s;
    pthread_mutex_t mu;
    pthread_cond_t cv;          /* work arrived / stop */
    pthread_cond_t idle_cv;     /* queue drained */
    mfd_ssd_job_t *head, *tail;
    int busy, stop;
} worker_t;

struct mfd_ssd {
    rocksdb_t *db;
    rocksdb_options_t *opts;
    rocksdb_writeoptions_t *wo_async, *wo_sync;
    rocksdb_readoptions_t *ro;
    unsigned n_workers;
    worker_t *workers;
    pthread_mutex_t done_mu;
    mfd_ssd_job_t *done_head, *done_tail;
    int efd;
    struct event *ev;
    size_t inflight;            /* loop thread only */
    /* Set by the first failed write (e.g. ENOSPC): RocksDB then holds a background error
     * and its WAL writer must not be used again (this librocksdb asserts on it), so the
     * tier stays read-only until restart. */
    atomic_int write_failed;
};

mfd_ssd_job_t *mfd_ssd_job_new(mfd_ssd_op_t op, const uint8_t *key, size_t klen)
{
    int raw = op == MFD_SSD_PUT_RAW || op == MFD_SSD_GET_RAW || op == MFD_SSD_SCAN_RAW;
    if (klen > (raw ? MFD_SSD_KEY_MAX : MFD_KEY_MAX))
        return NULL;
    mfd_ssd_job_t *j = calloc(1, sizeof(*j));
    if (!j)
        return NULL;
    j->op = op;
    memcpy(j->key, key, klen);
    j->klen = klen;
    return j;
}

void mfd_ssd_job_free(mfd_ssd_job_t *j)
{
    if (!j)
        return;
    free(j->out);
    free(j);
}

static void put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static uint64_t get_u64(const uint8_t *p)
{
    return (uint64_t)get_u32(p) | ((uint64_t)get_u32(p + 4) << 32);
}

/* A RocksDB error string's status: its Status::ToString() starts with the code name. */
static mf_status_t status_of(const char *rerr)
{
    return strncmp(rerr, "Corruption", 10) == 0 ? MF_DATA_LOSS : MF_UNAVAILABLE;
}

/* SCAN_RAW on a worker: copies matching records into j->out (see tier_ssd.h), bounded
 * by max_items and MFD_SSD_SCAN_BYTES. */
static void scan_raw(mfd_ssd_t *s, mfd_ssd_job_t *j, char **err)
{
    size_t cap = 4096, used = 0;
    uint8_t *buf = malloc(cap);
    if (!buf) {
        j->status = MF_RESOURCE_EXHAUSTED;
        return;
    }
    rocksdb_iterator_t *it = rocksdb_create_iterator(s->db, s->ro);
    rocksdb_iter_seek(it, (const char *)j->key, j->klen);
    for (; rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
        size_t kl, vl;
        const char *k = rocksdb_iter_key(it, &kl);
        if (kl < j->prefix_len || memcmp(k, j->key, j->prefix_len) != 0)
            break;
        if (j->skip_first && kl == j->klen && memcmp(k, j->key, kl) == 0)
            continue;
        const char *v = rocksdb_iter_value(it, &vl);
        size_t need = 2 + (kl - j->prefix_len) + 4 + vl;
        if (j->n_items == j->max_items || kl - j->prefix_len > UINT16_MAX ||
            vl > UINT32_MAX || used + need > MFD_SSD_SCAN_BYTES) {
            j->more = 1;
            break;
        }
        if (used + need > cap) {
            size_t ncap = cap;
            while (ncap < used + need)
                ncap *= 2;
            uint8_t *nb = realloc(buf, ncap);
            if (!nb) {
                j->status = MF_RESOURCE_EXHAUSTED;
                break;
            }
            buf = nb;
            cap = ncap;
        }
        uint8_t *p = buf + used;
        size_t sl = kl - j->prefix_len;
        p[0] = (uint8_t)sl;
        p[1] = (uint8_t)(sl >> 8);
        memcpy(p + 2, k + j->prefix_len, sl);
        put_u32(p + 2 + sl, (uint32_t)vl);
        memcpy(p + 6 + sl, v, vl);
        used += need;
        j->n_items++;
    }
    rocksdb_iter_get_error(it, err);
    rocksdb_iter_destroy(it);
    j->out = buf;
    j->out_len = used;
}

int mfd_ssd_scan_next(const mfd_ssd_job_t *j, size_t *pos, const uint8_t **suffix,
                      size_t *slen, const uint8_t **val, size_t *vlen)
{
    /* The worker wrote every record whole; the checks keep a reader inside out_len. */
    if (!j->out || *pos + 2 > j->out_len)
        return 0;
    const uint8_t *p = j->out + *pos;
    size_t sl = (size_t)p[0] | (size_t)p[1] << 8;
    if (*pos + 6 + sl > j->out_len)
        return 0;
    size_t vl = get_u32(p + 2 + sl);
    if (*pos + 6 + sl + vl > j->out_len)
        return 0;
    *suffix = p + 2;
    *slen = sl;
    *val = p + 6 + sl;
    *vlen = vl;
    *pos += 6 + sl + vl;
    return 1;
}

/* Runs one job on a worker thread. */
static void run_job(mfd_ssd_t *s, mfd_ssd_job_t *j)
{
    char *err = NULL;
    uint8_t rk[MFD_KEY_MAX + 1], mk[MFD_KEY_MAX + 1];
    rk[0] = 'r';
    mk[0] = 'm';
    if (j->op == MFD_SSD_PUT_ROW || j->op == MFD_SSD_GET_ROW || j->op == MFD_SSD_DEL_ROW) {
        memcpy(rk + 1, j->key, j->klen);
        memcpy(mk + 1, j->key, j->klen);
    }
    rocksdb_writeoptions_t *wo = j->sync ? s->wo_sync : s->wo_async;
    j->status = MF_OK;
    int is_write = j->op == MFD_SSD_PUT_ROW || j->op == MFD_SSD_DEL_ROW ||
                   j->op == MFD_SSD_PUT_RAW;
    if (is_write && atomic_load(&s->write_failed)) {
        j->status = MF_UNAVAILABLE;
        return;
    }
    switch (j->op) {
    case MFD_SSD_PUT_ROW: {
        uint8_t meta[16];
        put_u64(meta, j->vlen);
        put_u32(meta + 8, j->block);
        put_u32(meta + 12, j->sync ? 1u : 0u);
        rocksdb_writebatch_t *wb = rocksdb_writebatch_create();
        rocksdb_writebatch_put(wb, (const char *)rk, j->klen + 1, j->value, j->vlen);
        rocksdb_writebatch_put(wb, (const char *)mk, j->klen + 1, (const char *)meta, 16);
        rocksdb_write(s->db, wo, wb, &err);
        rocksdb_writebatch_destroy(wb);
        break;
    }
    case MFD_SSD_DEL_ROW: {
        rocksdb_writebatch_t *wb = rocksdb_writebatch_create();
        rocksdb_writebatch_delete(wb, (const char *)rk, j->klen + 1);
        rocksdb_writebatch_delete(wb, (const char *)mk, j->klen + 1);
        rocksdb_write(s->db, wo, wb, &err);
        rocksdb_writebatch_destroy(wb);
        break;
    }
    case MFD_SSD_PUT_RAW:
        rocksdb_put(s->db, wo, (const char *)j->key, j->klen, j->value, j->vlen, &err);
        break;
    case MFD_SSD_GET_ROW:
    case MFD_SSD_GET_RAW: {
        size_t len = 0;
        const uint8_t *k = j->op == MFD_SSD_GET_ROW ? rk : j->key;
        size_t kl = j->op == MFD_SSD_GET_ROW ? j->klen + 1 : j->klen;
        /* Pinned: the value is copied once, from RocksDB's buffer to where it goes. */
        rocksdb_pinnableslice_t *ps = rocksdb_get_pinned(s->db, s->ro, (const char *)k, kl,
                                                         &err);
        const char *v = ps ? rocksdb_pinnableslice_value(ps, &len) : NULL;
        if (!err && !v) {
            j->status = MF_NOT_FOUND;
        } else if (v && j->expect_len && len != j->expect_len) {
            j->status = MF_DATA_LOSS;
            j->why = "size differs from the index";
            j->out_len = len;
        } else if (v) {
            /* Rows are decoded in place and need 16-byte alignment. */
            uint8_t *buf = j->dst ? j->dst : aligned_alloc(64, (len + 63) & ~(size_t)63);
            if (!buf) {
                j->status = MF_RESOURCE_EXHAUSTED;
            } else {
                memcpy(buf, v, len);
                j->out = j->dst ? NULL : buf;
                j->out_len = len;
                if (j->check)
                    j->status = j->check(buf, len, j, &j->why);
            }
        }
        rocksdb_pinnableslice_destroy(ps);
        break;
    }
    case MFD_SSD_SCAN_RAW:
        scan_raw(s, j, &err);
        break;
    }
    if (err) {
        if (is_write && !atomic_exchange(&s->write_failed, 1))
            mfd_error("ssd: write: %s; the SSD tier is read-only until restart", err);
        else if (!is_write)
            mfd_error("ssd: read: %s", err);
        j->status = status_of(err);
        if (j->status == MF_DATA_LOSS)
            j->why = "RocksDB reports corruption";
        rocksdb_free(err);
    }
}

static void push_done(mfd_ssd_t *s, mfd_ssd_job_t *j)
{
    j->next = NULL;
    pthread_mutex_lock(&s->done_mu);
    if (s->done_tail)
        s->done_tail->next = j;
    else
        s->done_head = j;
    s->done_tail = j;
    pthread_mutex_unlock(&s->done_mu);
    uint64_t one = 1;
    ssize_t w = write(s->efd, &one, sizeof(one));
    (void)w; /* the counter saturating is harmless: one wake-up drains everything */
}

static void *worker_main(void *arg)
{
    worker_t *w = arg;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (!w->head && !w->stop)
            pthread_cond_wait(&w->cv, &w->mu);
        if (!w->head && w->stop)
            break;
        mfd_ssd_job_t *j = w->head;
        w->head = j->next;
        if (w->head)
            w->head->prev = NULL;
        else
            w->tail = NULL;
        j->queued = 0;
        w->busy = 1;
        pthread_mutex_unlock(&w->mu);
        run_job(w->s, j);
        push_done(w->s, j);
        pthread_mutex_lock(&w->mu);
        w->busy = 0;
        if (!w->head)
            pthread_cond_broadcast(&w->idle_cv);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

/* Runs the callbacks of finished jobs (loop thread). */
static void run_done(mfd_ssd_t *s)
{
    pthread_mutex_lock(&s->done_mu);
    mfd_ssd_job_t *j = s->done_head;
    s->done_head = s->done_tail = NULL;
    pthread_mutex_unlock(&s->done_mu);
    while (j) {
        mfd_ssd_job_t *n = j->next;
        s->inflight--;
        if (j->cb)
            j->cb(j);
        else
            mfd_ssd_job_free(j);
        j = n;
    }
}

static void on_efd(evutil_socket_t fd, short what, void *arg)
{
    (void)what;
    uint64_t v;
    ssize_t r = read(fd, &v, sizeof(v));
    (void)r;
    run_done(arg);
}

/* RocksDB's own data files in a database directory: what a fresh database (created when
 * CURRENT is missing) would silently delete. Counts them; *example gets one name. */
static size_t data_files(const char *path, char *example, size_t exlen)
{
    DIR *d = opendir(path);
    size_t n = 0;
    if (!d)
        return 0;
    for (struct dirent *de; (de = readdir(d));) {
        const char *nm = de->d_name, *dot = strrchr(nm, '.');
        if (strncmp(nm, "MANIFEST-", 9) == 0 ||
            (dot && (!strcmp(dot, ".sst") || !strcmp(dot, ".blob") || !strcmp(dot, ".log")))) {
            if (!n++)
                snprintf(example, exlen, "%s", nm);
        }
    }
    closedir(d);
    return n;
}

mf_status_t mfd_ssd_set_aside(const char *dir, char *err, size_t errlen)
{
    char from[4200], to[4300];
    snprintf(from, sizeof(from), "%s/rocksdb", dir);
    long long now = (long long)time(NULL);
    snprintf(to, sizeof(to), "%s.bad-%lld", from, now);
    for (int i = 1; i < 100 && access(to, F_OK) == 0; i++) /* two resets in one second */
        snprintf(to, sizeof(to), "%s.bad-%lld-%d", from, now, i);
    if (rename(from, to) != 0) {
        snprintf(err, errlen, "ssd_reset: cannot rename %s to %s: %s", from, to,
                 strerror(errno));
        return MF_UNAVAILABLE;
    }
    mfd_warn("ssd_reset: the SSD database was moved to %s (nothing deleted); starting "
             "with an empty SSD tier", to);
    return MF_OK;
}

/* Refuses to let RocksDB create a database over the files of one that lost CURRENT. */
static mf_status_t check_current(const char *path, char *err, size_t errlen)
{
    char cur[4300], example[256] = "";
    snprintf(cur, sizeof(cur), "%s/CURRENT", path);
    if (access(cur, F_OK) == 0)
        return MF_OK;
    size_t n = data_files(path, example, sizeof(example));
    if (!n)
        return MF_OK; /* a new database, or an empty directory */
    snprintf(err, errlen,
             "SSD tier: %s has %zu RocksDB data files (e.g. %s) but no CURRENT; refusing to "
             "create a new database over them (that would drop every stored row). Restore "
             "CURRENT, or start once with --ssd_reset on to move them aside",
             path, n, example);
    return MF_FAILED_PRECONDITION;
}

mf_status_t mfd_ssd_open(const mfd_ssd_options_t *opt, mfd_ssd_t **out, char *err,
                         size_t errlen)
{
    char path[4200];
    char *rerr = NULL;
    snprintf(path, sizeof(path), "%s/rocksdb", opt->dir);
    mf_status_t st = check_current(path, err, errlen);
    if (st != MF_OK && opt->reset) {
        mfd_warn("%s", err);
        st = mfd_ssd_set_aside(opt->dir, err, errlen);
    }
    if (st != MF_OK)
        return st;
    mfd_ssd_t *s = calloc(1, sizeof(*s));
    if (!s)
        return MF_RESOURCE_EXHAUSTED;
    s->efd = -1;
    s->opts = rocksdb_options_create();
    rocksdb_options_set_create_if_missing(s->opts, 1);
    rocksdb_options_increase_parallelism(s->opts, 2);
    rocksdb_options_set_enable_blob_files(s->opts, 1);
    rocksdb_options_set_min_blob_size(s->opts, 4096);
    rocksdb_options_set_enable_blob_gc(s->opts, 1);
    /* Map rows are dense quantised numbers: compression costs CPU and gains little. */
    rocksdb_options_set_compression(s->opts, rocksdb_no_compression);
    rocksdb_options_set_blob_compression_type(s->opts, rocksdb_no_compression);
    /* RocksDB's LOG file sits on the data disk; when that disk is full, logging the
     * write error fails and this librocksdb aborts on the failed log writer (assertion in
     * WritableFileWriter). The daemon logs SSD errors itself: keep LOG to fatal lines. */
    rocksdb_options_set_info_log_level(s->opts, 4 /* FATAL */);
    rocksdb_options_set_keep_log_file_num(s->opts, 3);
    rocksdb_options_set_max_log_file_size(s->opts, 4 << 20);
    s->db = rocksdb_open(s->opts, path, &rerr);
    if (!s->db && opt->reset) {
        mfd_warn("SSD tier: rocksdb open %s: %s", path, rerr ? rerr : "?");
        rocksdb_free(rerr);
        rerr = NULL;
        if ((st = mfd_ssd_set_aside(opt->dir, err, errlen)) != MF_OK) {
            rocksdb_options_destroy(s->opts);
            free(s);
            return st;
        }
        s->db = rocksdb_open(s->opts, path, &rerr);
    }
    if (!s->db) {
        st = rerr ? status_of(rerr) : MF_UNAVAILABLE;
        snprintf(err, errlen, "SSD tier: rocksdb open %s: %s (the daemon does not start "
                 "over a database it cannot read; --ssd_reset on moves it aside)",
                 path, rerr ? rerr : "?");
        rocksdb_free(rerr);
        rocksdb_options_destroy(s->opts);
        free(s);
        return st;
    }
    s->wo_async = rocksdb_writeoptions_create();
    s->wo_sync = rocksdb_writeoptions_create();
    rocksdb_writeoptions_set_sync(s->wo_sync, 1);
    s->ro = rocksdb_readoptions_create();
    pthread_mutex_init(&s->done_mu, NULL);
    s->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    s->n_workers = opt->io_threads ? opt->io_threads : 1;
    s->workers = calloc(s->n_workers, sizeof(worker_t));
    if (s->efd < 0 || !s->workers) {
        snprintf(err, errlen, "ssd: eventfd/workers: %s", strerror(errno));
        s->n_workers = 0;
        mfd_ssd_close(s);
        return MF_RESOURCE_EXHAUSTED;
    }
    for (unsigned i = 0; i < s->n_workers; i++) {
        worker_t *w = &s->workers[i];
        w->s = s;
        pthread_mutex_init(&w->mu, NULL);
        pthread_cond_init(&w->cv, NULL);
        pthread_cond_init(&w->idle_cv, NULL);
        if (pthread_create(&w->tid, NULL, worker_main, w) != 0) {
            snprintf(err, errlen, "ssd: cannot start worker thread");
            s->n_workers = i;
            mfd_ssd_close(s);
            return MF_RESOURCE_EXHAUSTED;
        }
    }
    *out = s;
    return MF_OK;
}

mf_status_t mfd_ssd_attach(mfd_ssd_t *s, struct event_base *base)
{
    s->ev = event_new(base, s->efd, EV_READ | EV_PERSIST, on_efd, s);
    if (!s->ev || event_add(s->ev, NULL) != 0)
        return MF_INTERNAL;
    return MF_OK;
}

static worker_t *worker_of(mfd_ssd_t *s, const mfd_ssd_job_t *j)
{
    return &s->workers[XXH3_64bits(j->key, j->klen) % s->n_workers];
}

void mfd_ssd_submit(mfd_ssd_t *s, mfd_ssd_job_t *j)
{
    worker_t *w = worker_of(s, j);
    j->next = NULL;
    s->inflight++;
    pthread_mutex_lock(&w->mu);
    j->prev = w->tail;
    j->queued = 1;
    if (w->tail)
        w->tail->next = j;
    else
        w->head = j;
    w->tail = j;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

int mfd_ssd_cancel(mfd_ssd_t *s, mfd_ssd_job_t *j)
{
    worker_t *w = worker_of(s, j);
    pthread_mutex_lock(&w->mu);
    int taken = j->queued;
    if (taken) {
        if (j->prev)
            j->prev->next = j->next;
        else
            w->head = j->next;
        if (j->next)
            j->next->prev = j->prev;
        else
            w->tail = j->prev;
        j->next = j->prev = NULL;
        j->queued = 0;
        if (!w->head && !w->busy)
            pthread_cond_broadcast(&w->idle_cv);
    }
    pthread_mutex_unlock(&w->mu);
    if (taken)
        s->inflight--;
    return taken;
}

size_t mfd_ssd_inflight(const mfd_ssd_t *s)
{
    return s->inflight;
}

void mfd_ssd_drain(mfd_ssd_t *s)
{
    /* Callbacks may submit follow-up jobs (e.g. a delete after a write), so repeat. */
    while (s->inflight) {
        for (unsigned i = 0; i < s->n_workers; i++) {
            worker_t *w = &s->workers[i];
            pthread_mutex_lock(&w->mu);
            while (w->head || w->busy)
                pthread_cond_wait(&w->idle_cv, &w->mu);
            pthread_mutex_unlock(&w->mu);
        }
        run_done(s);
    }
}

void mfd_ssd_close(mfd_ssd_t *s)
{
    if (!s)
        return;
    if (s->n_workers)
        mfd_ssd_drain(s);
    for (unsigned i = 0; i < s->n_workers; i++) {
        worker_t *w = &s->workers[i];
        pthread_mutex_lock(&w->mu);
        w->stop = 1;
        pthread_cond_signal(&w->cv);
        pthread_mutex_unlock(&w->mu);
        pthread_join(w->tid, NULL);
        pthread_mutex_destroy(&w->mu);
        pthread_cond_destroy(&w->cv);
        pthread_cond_destroy(&w->idle_cv);
    }
    free(s->workers);
    if (s->ev)
        event_free(s->ev);
    if (s->efd >= 0)
        close(s->efd);
    pthread_mutex_destroy(&s->done_mu);
    if (s->wo_async)
        rocksdb_writeoptions_destroy(s->wo_async);
    if (s->wo_sync)
        rocksdb_writeoptions_destroy(s->wo_sync);
    if (s->ro)
        rocksdb_readoptions_destroy(s->ro);
    rocksdb_close(s->db);
    rocksdb_options_destroy(s->opts);
    free(s);
}

mf_status_t mfd_ssd_scan(mfd_ssd_t *s, mfd_ssd_scan_cb cb, void *arg, char *errbuf,
                         size_t errlen)
{
    rocksdb_iterator_t *it = rocksdb_create_iterator(s->db, s->ro);
    rocksdb_iter_seek(it, "m", 1);
    for (; rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
        size_t kl, vl;
        const char *k = rocksdb_iter_key(it, &kl);
        if (kl < 1 || k[0] != 'm')
            break;
        const uint8_t *v = (const uint8_t *)rocksdb_iter_value(it, &vl);
        mfd_key_parts_t parts;
        if (vl != 16 || mfd_key_parse((const uint8_t *)k + 1, kl - 1, &parts) != MF_OK) {
            mfd_warn("ssd: skipping a malformed index record (%zu key bytes)", kl);
            continue;
        }
        cb((const uint8_t *)k + 1, kl - 1, get_u64(v), get_u32(v + 8), get_u32(v + 12), arg);
    }
    char *err = NULL;
    rocksdb_iter_get_error(it, &err);
    rocksdb_iter_destroy(it);
    if (err) {
        mf_status_t st = status_of(err);
        snprintf(errbuf, errlen, "SSD tier: scanning the row index: %s", err);
        rocksdb_free(err);
        return st;
    }
    return MF_OK;
}

size_t mfd_ssd_profile_prefix(uint8_t out[MFD_SSD_KEY_MAX], const char *ns)
{
    size_t a = strlen(ns);
    if (a > 255)
        return 0;
    out[0] = 'p';
    out[1] = (uint8_t)a;
    memcpy(out + 2, ns, a);
    return 2 + a;
}

size_t mfd_ssd_profile_key(uint8_t out[MFD_SSD_KEY_MAX], const char *ns,
                           const char *src, const char *tgt)
{
    size_t b = strlen(src), c = strlen(tgt);
    size_t n = mfd_ssd_profile_prefix(out, ns);
    if (!n || b > 255 || c > 255 || n + 2 + b + c > MFD_SSD_KEY_MAX)
        return 0;
    uint8_t *p = out + n;
    *p++ = (uint8_t)b;
    memcpy(p, src, b);
    p += b;
    *p++ = (uint8_t)c;
    memcpy(p, tgt, c);
    p += c;
    return (size_t)(p - out);
}
