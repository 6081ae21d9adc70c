/* bench_mapflow — libmapflow clients for the benchmark (one channel per client thread). */
#include "bench_mapflow.h"
#include "mf_addr.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CALL_TIMEOUT_MS 60000 /* generous: 64 clients share 2 cores */

const char *const mfb_mixed_kinds[4] = {"put", "lookup", "prefix_lease", "get_copy"};
enum { KIND_PUT, KIND_LOOKUP, KIND_PREFIX_LEASE, KIND_GET_COPY };

typedef struct mf_client {
    mf_channel_t *ch;
    uint8_t *buf;     /* the client's own buffer for copy gets */
    size_t cap;
    uint32_t *layers; /* 0..mask_layers-1 */
    uint32_t *blocks;
} mf_client_t;

mf_status_t mfb_mapflow_open(const char *target, mf_channel_t **out)
{
    return mfb_mapflow_open_with(target, 1, MF_VERIFY_FULL, out);
}

mf_status_t mfb_mapflow_open_with(const char *target, int want_arena, mf_verify_t verify,
                                  mf_channel_t **out)
{
    mf_channel_params_t p = {
        .field_mask = MF_CHANNEL_PARAM_NS | MF_CHANNEL_PARAM_CLIENT_NAME |
                      MF_CHANNEL_PARAM_WANT_ARENA | MF_CHANNEL_PARAM_TIMEOUT_MS |
                      MF_CHANNEL_PARAM_VERIFY,
        .ns = MFB_NS,
        .client_name = "mapflow-bench-daemon",
        .want_arena = want_arena,
        .timeout_ms = CALL_TIMEOUT_MS,
        .verify = verify,
    };
    *out = NULL;
    mf_status_t st = mf_channel_open(target, &p, out);
    if (st != MF_OK) {
        fprintf(stderr, "bench: cannot open %s: %s (%s)\n", target, mf_status_name(st),
                *out ? mf_channel_last_error(*out) : "");
        mf_channel_close(*out);
        *out = NULL;
    }
    return st;
}

/* Row of the FP8 set this client uses for its n-th op: clients start spread out. */
static const mfb_row_t *fp8_pick(const mfb_mf_arg_t *a, const mfb_client_t *c, uint64_t n)
{
    return &a->w->fp8[(c->id + n * (uint64_t)c->n_clients) % a->w->n_fp8];
}

/*
 * Untimed: leases once each FP8 row this client's ops will pick (fp8_pick) and reads one
 * byte of every page of it, so this channel's mapping of the arena has its page-table
 * entries before the timed loop. A channel maps the arena on its own, and its first
 * touch of each 4 KiB page is a page fault (tens of us on a VM): a start-up cost of each
 * channel, not of each get, which a 0.5 s point would otherwise mostly measure.
 */
static int warm_arena(mfb_client_t *c, mf_client_t *m, const mfb_mf_arg_t *a)
{
    const mfb_workload_t *w = a->w;
    uint8_t *seen = calloc(w->n_fp8, 1);
    if (!seen)
        return -1;
    volatile uint8_t sink = 0;
    int rc = 0;
    for (uint64_t n = 0; n < w->n_fp8 && rc == 0; n++) {
        const mfb_row_t *r = fp8_pick(a, c, n);
        if (seen[r - w->fp8]++)
            continue;
        mf_key_t key = {w->fp8_cx.model, r->layer, r->hash};
        mf_lease_t l;
        if (mf_get_lease(m->ch, &key, &l, MF_TIMEOUT_DEFAULT) != MF_OK) {
            rc = -1;
            break;
        }
        for (size_t off = 0; off < l.length; off += 4096)
            sink ^= ((const uint8_t *)l.data)[off];
        rc = mf_release(m->ch, &l.lease_id, 1, NULL, MF_TIMEOUT_DEFAULT) == MF_OK ? 0 : -1;
    }
    (void)sink;
    free(seen);
    return rc;
}

static int client_open(mfb_client_t *c, void *argp)
{
    mfb_mf_arg_t *a = argp;
    mf_client_t *m = calloc(1, sizeof(*m));
    if (!m)
        return -1;
    c->state = m;
    m->buf = mfb_buffer_new(a->w->fp8_max_len, &m->cap);
    m->layers = malloc(a->w->mask_layers * sizeof(uint32_t));
    m->blocks = malloc(a->w->mask_layers * sizeof(uint32_t));
    if (!m->buf || !m->layers || !m->blocks)
        return -1;
    for (uint32_t l = 0; l < a->w->mask_layers; l++)
        m->layers[l] = l;
    if (mfb_mapflow_open_with(a->target, !a->no_arena,
                              a->verify_header ? MF_VERIFY_HEADER : MF_VERIFY_FULL,
                              &m->ch) != MF_OK)
        return -1;
    int reads_host = a->op == MFB_MF_GET_COPY || a->op == MFB_MF_GET_LEASE ||
                     a->op == MFB_MF_GET_LEASE_COPY || a->op == MFB_MF_MIXED;
    return reads_host && !a->no_arena ? warm_arena(c, m, a) : 0;
}

static void client_close(mfb_client_t *c, void *argp)
{
    (void)argp;
    mf_client_t *m = c->state;
    if (!m)
        return;
    mf_channel_close(m->ch);
    free(m->buf);
    free(m->layers);
    free(m->blocks);
    free(m);
    c->state = NULL;
}

static mfb_op_rc_t fail(mfb_client_t *c, mf_client_t *m, const char *what, mf_status_t st)
{
    mfb_client_error(c, "%s: %s: %s", what, mf_status_name(st), mf_channel_last_error(m->ch));
    return MFB_OP_ERR;
}

static mfb_op_rc_t do_put_row(mfb_client_t *c, mf_client_t *m, const mfb_row_t *r,
                              uint64_t *bytes)
{
    mf_status_t st = mf_put(m->ch, r->data, r->len, 0, NULL, MF_TIMEOUT_DEFAULT);
    if (st != MF_OK)
        return fail(c, m, "put", st);
    *bytes = r->len;
    return MFB_OP_OK;
}

static mfb_op_rc_t do_get_copy(mfb_client_t *c, mf_client_t *m, const mfb_workload_t *w,
                               const mfb_row_t *r, uint64_t *bytes)
{
    mf_key_t key = {w->fp8_cx.model, r->layer, r->hash};
    size_t len = 0;
    mf_status_t st = mf_get(m->ch, &key, m->buf, m->cap, &len, MF_TIMEOUT_DEFAULT);
    if (st != MF_OK)
        return fail(c, m, "get", st);
    if (len != r->len) {
        mfb_client_error(c, "get returned %zu bytes, row has %zu", len, r->len);
        return MFB_OP_ERR;
    }
    /* Compare the bytes on each client's first get only: a check, not a second copy. */
    if (c->ops == 0 && memcmp(m->buf, r->data, len)) {
        mfb_client_error(c, "get returned different bytes");
        return MFB_OP_ERR;
    }
    *bytes = len;
    return MFB_OP_OK;
}

/* copy != 0: copy the leased row into the client's buffer before releasing it. */
static mfb_op_rc_t do_get_lease(mfb_client_t *c, mf_client_t *m, const mfb_workload_t *w,
                                const mfb_row_t *r, int copy, uint64_t *bytes)
{
    mf_key_t key = {w->fp8_cx.model, r->layer, r->hash};
    mf_lease_t l;
    mf_status_t st = mf_get_lease(m->ch, &key, &l, MF_TIMEOUT_DEFAULT);
    if (st == MF_OK && l.length != r->len) {
        mfb_client_error(c, "lease of %zu bytes, row has %zu", l.length, r->len);
        st = MF_DATA_LOSS;
    }
    if (st == MF_OK && c->ops == 0 && memcmp(l.data, r->data, r->len)) {
        mfb_client_error(c, "leased view differs from the row put");
        st = MF_DATA_LOSS;
    }
    if (st == MF_OK && copy)
        memcpy(m->buf, l.data, l.length);
    mf_status_t rs = l.lease_id ? mf_release(m->ch, &l.lease_id, 1, NULL, MF_TIMEOUT_DEFAULT)
                                : MF_OK;
    if (st != MF_OK)
        return c->err[0] ? MFB_OP_ERR : fail(c, m, "get_lease", st);
    if (rs != MF_OK)
        return fail(c, m, "release", rs);
    *bytes = r->len;
    return MFB_OP_OK;
}

static mfb_op_rc_t do_lookup(mfb_client_t *c, mf_client_t *m, const mfb_workload_t *w,
                             uint32_t n_blocks, uint64_t *bytes)
{
    const mfb_context_t *cx = &w->mask_cx;
    uint32_t total = 0;
    mf_status_t st = mf_lookup(m->ch, cx->model, cx->block_size, cx->tokens,
                               (size_t)n_blocks * cx->block_size, m->layers, w->mask_layers,
                               m->blocks, &total, MF_TIMEOUT_DEFAULT);
    if (st != MF_OK)
        return fail(c, m, "lookup", st);
    for (uint32_t l = 0; l < w->mask_layers; l++)
        if (m->blocks[l] != n_blocks) {
            mfb_client_error(c, "lookup: layer %u has %u of %u blocks", l, m->blocks[l],
                             n_blocks);
            return MFB_OP_ERR;
        }
    *bytes = 0;
    return MFB_OP_OK;
}

static mfb_op_rc_t do_prefix(mfb_client_t *c, mf_client_t *m, const mfb_workload_t *w,
                             uint32_t n_layers, uint32_t n_blocks, mf_get_mode_t mode,
                             uint64_t *bytes)
{
    const mfb_context_t *cx = &w->mask_cx;
    mf_get_result_t *res = NULL;
    mf_status_t st = mf_get_prefix(m->ch, cx->model, cx->block_size, cx->tokens, cx->n_tokens,
                                   m->layers, n_layers, 0, n_blocks, mode, &res,
                                   MF_TIMEOUT_DEFAULT);
    if (st != MF_OK)
        return fail(c, m, "get_prefix", st);
    uint64_t got = 0;
    size_t bad = 0;
    for (size_t i = 0; i < res->n_rows; i++) {
        if (res->rows[i].status == MF_OK)
            got += res->rows[i].length;
        else
            bad++;
    }
    if (mode == MF_GET_LEASE)
        st = mf_release_result(m->ch, res, MF_TIMEOUT_DEFAULT);
    size_t n_rows = res->n_rows;
    mf_get_result_free(res);
    if (st != MF_OK)
        return fail(c, m, "release", st);
    if (bad || n_rows != (size_t)n_layers * n_blocks) {
        mfb_client_error(c, "get_prefix: %zu rows, %zu not OK (want %u × %u)", n_rows, bad,
                         n_layers, n_blocks);
        return MFB_OP_ERR;
    }
    *bytes = got;
    return MFB_OP_OK;
}

/* SSD pass: each FP8 row exactly once over all clients, by key, into a buffer the call
 * returns (one copy, as rocksdb_get's value is: the caller's to keep, so no second copy
 * into the client's buffer), recording which tier served it. */
static mfb_op_rc_t do_ssd_get(mfb_client_t *c, mf_client_t *m, mfb_mf_arg_t *a,
                              uint64_t *bytes)
{
    size_t i = atomic_fetch_add(&a->next, 1);
    if (i >= a->w->n_fp8)
        return MFB_OP_DONE;
    const mfb_row_t *r = &a->w->fp8[i];
    mf_key_t key = {a->w->fp8_cx.model, r->layer, r->hash};
    mf_get_result_t *res = NULL;
    mf_status_t st = mf_get_keys(m->ch, &key, 1, MF_GET_COPY, &res, MF_TIMEOUT_DEFAULT);
    if (st == MF_OK && res->rows[0].status != MF_OK)
        st = res->rows[0].status;
    if (st != MF_OK) {
        mf_get_result_free(res);
        return fail(c, m, "ssd get", st);
    }
    const mf_row_ref_t *rr = &res->rows[0];
    int ok = rr->length == r->len && (c->ops || !memcmp(rr->data, r->data, r->len));
    if (ok) {
        if (rr->tier == MF_TIER_SSD)
            atomic_fetch_add(&a->ssd_rows, 1);
    }
    mf_get_result_free(res);
    if (!ok) {
        mfb_client_error(c, "ssd get: wrong length or bytes");
        return MFB_OP_ERR;
    }
    *bytes = r->len;
    return MFB_OP_OK;
}

/* Mixed: 10% puts (a source storing a row), 30% whole-prefix lookups, 30% leased prefix
 * fetches of the MASK rows (64 blocks × every layer, what a mask-mode target reads for
 * a 4k context), 30% copy gets of one FP8 row (a prob-mode target). */
static mfb_op_rc_t do_mixed(mfb_client_t *c, mf_client_t *m, mfb_mf_arg_t *a,
                            uint64_t *bytes)
{
    const mfb_workload_t *w = a->w;
    double u = mfb_rand01(&c->rng);
    const mfb_row_t *r = &w->fp8[mfb_rand(&c->rng) % w->n_fp8];
    uint32_t nb = w->mask_cx.n_blocks < 64 ? (uint32_t)w->mask_cx.n_blocks : 64;
    if (u < 0.10) {
        c->kind = KIND_PUT;
        return do_put_row(c, m, r, bytes);
    }
    if (u < 0.40) {
        c->kind = KIND_LOOKUP;
        return do_lookup(c, m, w, (uint32_t)w->mask_cx.n_blocks, bytes);
    }
    if (u < 0.70) {
        c->kind = KIND_PREFIX_LEASE;
        return do_prefix(c, m, w, w->mask_layers, nb, MF_GET_LEASE, bytes);
    }
    c->kind = KIND_GET_COPY;
    return do_get_copy(c, m, w, r, bytes);
}

static mfb_op_rc_t do_populate(mfb_client_t *c, mf_client_t *m, mfb_mf_arg_t *a,
                               uint64_t *bytes)
{
    size_t i = atomic_fetch_add(&a->next, 1);
    const mfb_workload_t *w = a->w;
    if (i >= w->n_mask + w->n_fp8)
        return MFB_OP_DONE;
    const mfb_row_t *r = i < w->n_mask ? &w->mask[i] : &w->fp8[i - w->n_mask];
    return do_put_row(c, m, r, bytes);
}

static mfb_op_rc_t client_step(mfb_client_t *c, void *argp, uint64_t *bytes)
{
    mfb_mf_arg_t *a = argp;
    mf_client_t *m = c->state;
    const mfb_workload_t *w = a->w;
    switch (a->op) {
    case MFB_MF_PUT:
        return do_put_row(c, m, fp8_pick(a, c, c->ops), bytes);
    case MFB_MF_GET_COPY:
        return do_get_copy(c, m, w, fp8_pick(a, c, c->ops), bytes);
    case MFB_MF_GET_LEASE:
        return do_get_lease(c, m, w, fp8_pick(a, c, c->ops), 0, bytes);
    case MFB_MF_GET_LEASE_COPY:
        return do_get_lease(c, m, w, fp8_pick(a, c, c->ops), 1, bytes);
    case MFB_MF_LOOKUP:
        return do_lookup(c, m, w, a->lookup_blocks, bytes);
    case MFB_MF_PREFIX_COPY:
        return do_prefix(c, m, w, a->prefix_layers, a->prefix_blocks, MF_GET_COPY, bytes);
    case MFB_MF_PREFIX_LEASE:
        return do_prefix(c, m, w, a->prefix_layers, a->prefix_blocks, MF_GET_LEASE, bytes);
    case MFB_MF_SSD_GET:
        return do_ssd_get(c, m, a, bytes);
    case MFB_MF_MIXED:
        return do_mixed(c, m, a, bytes);
    case MFB_MF_POPULATE:
        return do_populate(c, m, a, bytes);
    }
    return MFB_OP_ERR;
}

void mfb_mapflow_job(mfb_job_t *job, mfb_mf_arg_t *arg)
{
    job->system = "mapflow";
    job->arg = arg;
    job->open = client_open;
    job->step = client_step;
    job->close = client_close;
    job->n_kinds = arg->op == MFB_MF_MIXED ? 4 : 0;
    job->kind_names = mfb_mixed_kinds;
    atomic_store(&arg->next, 0);
    atomic_store(&arg->ssd_rows, 0);
}

mf_status_t mfb_mapflow_evict_host(const char *target, uint64_t *evicted_bytes)
{
    mf_channel_t *ch;
    mf_status_t st = mfb_mapflow_open(target, &ch);
    if (st != MF_OK)
        return st;
    mf_stats_t *s = NULL;
    uint64_t used = 0, entries = 0;
    *evicted_bytes = 0;
    st = mf_stats(ch, &s, MF_TIMEOUT_DEFAULT);
    for (size_t i = 0; st == MF_OK && i < s->n_tiers; i++)
        if (s->tiers[i].tier == MF_TIER_HOST)
            used = s->tiers[i].used_bytes;
    mf_stats_free(s);
    if (st == MF_OK && used)
        st = mf_evict(ch, MF_TIER_HOST, used, evicted_bytes, &entries, MF_TIMEOUT_DEFAULT);
    if (st != MF_OK)
        fprintf(stderr, "bench: evict: %s: %s\n", mf_status_name(st), mf_channel_last_error(ch));
    mf_channel_close(ch);
    return st;
}

/* Host tier bytes in use, or -1 when stats fail. */
static int64_t host_used(mf_channel_t *ch)
{
    mf_stats_t *s = NULL;
    if (mf_stats(ch, &s, MF_TIMEOUT_DEFAULT) != MF_OK)
        return -1;
    int64_t used = -1;
    for (size_t i = 0; i < s->n_tiers; i++)
        if (s->tiers[i].tier == MF_TIER_HOST)
            used = (int64_t)s->tiers[i].used_bytes;
    mf_stats_free(s);
    return used;
}

void mfb_mapflow_settle(const char *target, double max_s, const char *when)
{
    mf_channel_t *ch;
    if (mfb_mapflow_open(target, &ch) != MF_OK)
        return;
    /* StatsReply carries counters, not the ssd_inflight gauge of /metrics (and
     * ssd_writes_total counts submissions). A replaced row stays pinned in the arena
     * until its queued SSD write completes, so the queue has drained once the host
     * tier's used bytes stop moving for 300 ms. */
    double t0 = mfb_now(), still_since = t0;
    int64_t first = host_used(ch), last = first;
    while (last >= 0 && mfb_now() - still_since < 0.3 && mfb_now() - t0 < max_s) {
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
        int64_t u = host_used(ch);
        if (u != last)
            still_since = mfb_now();
        last = u;
    }
    if (first >= 0 && last >= 0)
        printf("INFO\t%s: host tier %.1f -> %.1f MB while waiting %.2f s for the "
               "write-through queue\n", when, first / 1e6, last / 1e6,
               mfb_now() - t0 - 0.3);
    fflush(stdout);
    mf_channel_close(ch);
}

/* Tier entries of one stats reply: *host and *ssd (-1 when absent). 0 = ok. */
static int tier_entries(mf_channel_t *ch, int64_t *host, int64_t *ssd)
{
    mf_stats_t *s = NULL;
    *host = *ssd = -1;
    if (mf_stats(ch, &s, MF_TIMEOUT_DEFAULT) != MF_OK)
        return -1;
    for (size_t i = 0; i < s->n_tiers; i++) {
        if (s->tiers[i].tier == MF_TIER_HOST)
            *host = (int64_t)s->tiers[i].entries;
        else if (s->tiers[i].tier == MF_TIER_SSD)
            *ssd = (int64_t)s->tiers[i].entries;
    }
    mf_stats_free(s);
    return 0;
}

int mfb_mapflow_wait_ssd(const char *target, double max_s, const char *when)
{
    mf_channel_t *ch;
    if (mfb_mapflow_open(target, &ch) != MF_OK)
        return -1;
    /* The SSD tier counts a row once its write completed; new rows do not move the host
     * tier's bytes, so mfb_mapflow_settle cannot see this queue drain. Some rows may
     * never be written through (they reach the SSD when evicted), so "drained" is also
     * the count standing still for 500 ms. */
    double t0 = mfb_now(), still_since = t0;
    int64_t host = -1, ssd = -1, last = -1;
    int ok = 0;
    while (tier_entries(ch, &host, &ssd) == 0 && mfb_now() - t0 < max_s) {
        if (ssd != last)
            still_since = mfb_now();
        last = ssd;
        if ((ok = ssd >= host || mfb_now() - still_since >= 0.5))
            break;
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    printf("INFO\t%s: ssd tier %lld of %lld host-tier rows written after %.2f s%s\n", when,
           (long long)ssd, (long long)host, mfb_now() - t0, ok ? "" : " (gave up)");
    fflush(stdout);
    mf_channel_close(ch);
    return ok ? 0 : -1;
}

mf_status_t mfb_mapflow_config(const char *target, const char *key, const char *value)
{
    /* ConfigSet is an admin request: a unix-socket daemon's admin socket is beside it. */
    char apath[4096], atarget[4200];
    if (!strncmp(target, "unix:", 5)) {
        mf_admin_socket_path(target + 5, apath, sizeof apath);
        snprintf(atarget, sizeof atarget, "unix:%s", apath);
        target = atarget;
    }
    mf_channel_t *ch;
    mf_status_t st = mfb_mapflow_open(target, &ch);
    if (st != MF_OK)
        return st;
    st = mf_config_set(ch, key, value, NULL, MF_TIMEOUT_DEFAULT);
    if (st != MF_OK)
        fprintf(stderr, "bench: config set %s %s: %s: %s\n", key, value, mf_status_name(st),
                mf_channel_last_error(ch));
    mf_channel_close(ch);
    return st;
}

void mfb_mapflow_print_stats(const char *target, const char *when)
{
    mf_channel_t *ch;
    if (mfb_mapflow_open(target, &ch) != MF_OK)
        return;
    mf_stats_t *s = NULL;
    if (mf_stats(ch, &s, MF_TIMEOUT_DEFAULT) == MF_OK) {
        for (size_t i = 0; i < s->n_tiers; i++)
            printf("INFO\tdaemon %s: tier %s used %.1f MB of %.1f MB, %llu entries\n", when,
                   mf_tier_name(s->tiers[i].tier), s->tiers[i].used_bytes / 1e6,
                   s->tiers[i].capacity_bytes / 1e6,
                   (unsigned long long)s->tiers[i].entries);
        mf_stats_free(s);
    }
    mf_channel_close(ch);
    fflush(stdout);
}
