/* bench_util — closed-loop client threads, latency reservoirs, result lines. */
#include "bench_util.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Samples kept per client; past it, reservoir sampling keeps the percentiles unbiased
 * while memory stays bounded at 64 clients. */
#define LAT_CAP_TOTAL (1u << 21)
#define LAT_CAP_MIN 4096u

double mfb_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

uint64_t mfb_rand(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

double mfb_rand01(uint64_t *state)
{
    return (double)(mfb_rand(state) >> 11) * (1.0 / 9007199254740992.0);
}

uint8_t *mfb_buffer_new(size_t len, size_t *cap)
{
    *cap = (len + 15) & ~(size_t)15;
    uint8_t *b = aligned_alloc(16, *cap ? *cap : 16);
    if (b)
        memset(b, 0, *cap);
    return b;
}

void mfb_client_error(mfb_client_t *c, const char *fmt, ...)
{
    if (c->err[0])
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err, sizeof(c->err), fmt, ap);
    va_end(ap);
}

/* Algorithm R: sample i (0-based, of the n seen so far) replaces a random slot. */
static void lat_add(uint32_t *lat, size_t *n, size_t cap, uint64_t seen, uint64_t *rng,
                    uint32_t ticks)
{
    if (*n < cap) {
        lat[(*n)++] = ticks;
        return;
    }
    uint64_t j = mfb_rand(rng) % (seen + 1);
    if (j < cap)
        lat[j] = ticks;
}

typedef struct run_shared {
    const mfb_job_t *job;
    pthread_barrier_t opened, start;
    int open_failed;
    double t_start;         /* one start and one deadline for every client */
    pthread_mutex_t lock;
} run_shared_t;

typedef struct run_thread {
    run_shared_t *sh;
    mfb_client_t c;
    pthread_t tid;
} run_thread_t;

static void *client_main(void *p)
{
    run_thread_t *t = p;
    const mfb_job_t *job = t->sh->job;
    mfb_client_t *c = &t->c;
    int opened = job->open ? job->open(c, job->arg) == 0 : 1;
    if (!opened) {
        pthread_mutex_lock(&t->sh->lock);
        t->sh->open_failed = 1;
        pthread_mutex_unlock(&t->sh->lock);
    }
    /* Every client starts at the same instant and stops at the same deadline, so the
     * wall time is one window in which all of them were running. One that failed to
     * open makes the whole run void. */
    if (pthread_barrier_wait(&t->sh->opened) == PTHREAD_BARRIER_SERIAL_THREAD)
        t->sh->t_start = mfb_now();
    pthread_barrier_wait(&t->sh->start);
    pthread_mutex_lock(&t->sh->lock);
    int skip = t->sh->open_failed;
    pthread_mutex_unlock(&t->sh->lock);
    c->t_start = t->sh->t_start;
    double deadline = c->t_start + job->seconds;
    double now = mfb_now();
    while (!skip && now < deadline && (!job->max_ops || c->ops < job->max_ops)) {
        uint64_t bytes = 0;
        c->kind = 0;
        mfb_op_rc_t rc = job->step(c, job->arg, &bytes);
        double end = mfb_now();
        if (rc == MFB_OP_DONE)
            break;
        if (rc == MFB_OP_ERR) {
            c->errors++;
            break;
        }
        double ticks = (end - now) * 1e7; /* 100 ns units: 0.1 µs .. 429 s */
        uint32_t t32 = ticks > 4e9 ? 4000000000u : (uint32_t)ticks;
        lat_add(c->lat, &c->lat_n, c->lat_cap, c->ops, &c->rng, t32);
        if (job->n_kinds > 0 && c->kind >= 0 && c->kind < job->n_kinds) {
            int k = c->kind;
            lat_add(c->kind_lat[k], &c->kind_n[k], c->lat_cap, c->kind_ops[k], &c->rng, t32);
            c->kind_ops[k]++;
        }
        c->ops++;
        c->bytes += bytes;
        now = end;
    }
    c->t_end = now;
    if (opened && job->close)
        job->close(c, job->arg);
    return NULL;
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

/* Nearest-rank percentile of sorted samples, in microseconds. */
static double pct_us(const uint32_t *s, size_t n, double p)
{
    if (!n)
        return 0;
    size_t i = (size_t)(p * (double)n);
    if (i >= n)
        i = n - 1;
    return s[i] / 10.0; /* 100 ns ticks → µs */
}

/* Gathers every client's samples of one kind (-1 = all ops) and sorts them. */
static uint32_t *merge_lat(run_thread_t *th, int n, int kind, size_t *out_n)
{
    size_t total = 0;
    for (int i = 0; i < n; i++)
        total += kind < 0 ? th[i].c.lat_n : th[i].c.kind_n[kind];
    uint32_t *all = malloc((total ? total : 1) * sizeof(uint32_t));
    if (!all)
        return NULL;
    size_t k = 0;
    for (int i = 0; i < n; i++) {
        const uint32_t *src = kind < 0 ? th[i].c.lat : th[i].c.kind_lat[kind];
        size_t m = kind < 0 ? th[i].c.lat_n : th[i].c.kind_n[kind];
        memcpy(all + k, src, m * sizeof(uint32_t));
        k += m;
    }
    qsort(all, total, sizeof(uint32_t), cmp_u32);
    *out_n = total;
    return all;
}

static void free_threads(run_thread_t *th, int n)
{
    for (int i = 0; i < n; i++) {
        free(th[i].c.lat);
        for (int k = 0; k < 4; k++)
            free(th[i].c.kind_lat[k]);
    }
    free(th);
}

int mfb_run(const mfb_job_t *job, mfb_result_t *out)
{
    memset(out, 0, sizeof(*out));
    int n = job->n_clients;
    if (n < 1 || n > MFB_MAX_CLIENTS || job->n_kinds > 4) {
        snprintf(out->err, sizeof(out->err), "bad client count %d", n);
        return -1;
    }
    run_shared_t sh = {.job = job};
    run_thread_t *th = calloc((size_t)n, sizeof(*th));
    if (!th)
        return -1;
    size_t cap = LAT_CAP_TOTAL / (size_t)n;
    if (cap < LAT_CAP_MIN)
        cap = LAT_CAP_MIN;
    for (int i = 0; i < n; i++) {
        mfb_client_t *c = &th[i].c;
        th[i].sh = &sh;
        c->id = i;
        c->n_clients = n;
        c->rng = 0x5eed0000ull + (uint64_t)i * 7919u;
        c->lat_cap = cap;
        c->lat = malloc(cap * sizeof(uint32_t));
        int bad = !c->lat;
        for (int k = 0; k < job->n_kinds; k++)
            bad |= !(c->kind_lat[k] = malloc(cap * sizeof(uint32_t)));
        if (bad) {
            free_threads(th, n);
            snprintf(out->err, sizeof(out->err), "out of memory for latency samples");
            return -1;
        }
    }
    pthread_mutex_init(&sh.lock, NULL);
    pthread_barrier_init(&sh.opened, NULL, (unsigned)n);
    pthread_barrier_init(&sh.start, NULL, (unsigned)n);
    int started = 0;
    for (; started < n; started++)
        if (pthread_create(&th[started].tid, NULL, client_main, &th[started]))
            break;
    if (started < n) {
        /* The barrier can never fill: nothing started may be left waiting on it, so a
         * failed start is fatal for the process (the bench is a tool, not a library). */
        fprintf(stderr, "bench: cannot start client thread %d of %d\n", started, n);
        abort();
    }
    for (int i = 0; i < n; i++)
        pthread_join(th[i].tid, NULL);
    pthread_barrier_destroy(&sh.opened);
    pthread_barrier_destroy(&sh.start);
    pthread_mutex_destroy(&sh.lock);

    double t0 = th[0].c.t_start, t1 = th[0].c.t_end;
    for (int i = 0; i < n; i++) {
        mfb_client_t *c = &th[i].c;
        out->ops += c->ops;
        out->bytes += c->bytes;
        out->errors += c->errors;
        if (c->t_start < t0)
            t0 = c->t_start;
        if (c->t_end > t1)
            t1 = c->t_end;
        if (c->err[0] && !out->err[0])
            snprintf(out->err, sizeof(out->err), "client %d: %.160s", i, c->err);
    }
    out->wall_s = t1 - t0;
    if (sh.open_failed) {
        if (!out->err[0])
            snprintf(out->err, sizeof(out->err), "a client could not open");
        free_threads(th, n);
        return -1;
    }
    if (out->wall_s > 0) {
        out->ops_per_s = (double)out->ops / out->wall_s;
        out->gbps = (double)out->bytes / out->wall_s / 1e9;
    }
    size_t m = 0;
    uint32_t *all = merge_lat(th, n, -1, &m);
    if (all && m) {
        double sum = 0;
        for (size_t i = 0; i < m; i++)
            sum += all[i];
        out->mean_us = sum / (double)m / 10.0;
        out->p50_us = pct_us(all, m, 0.50);
        out->p99_us = pct_us(all, m, 0.99);
    }
    free(all);
    out->n_kinds = job->n_kinds;
    for (int k = 0; k < job->n_kinds; k++) {
        uint32_t *s = merge_lat(th, n, k, &m);
        for (int i = 0; i < n; i++)
            out->kind[k].ops += th[i].c.kind_ops[k];
        if (s && m) {
            out->kind[k].p50_us = pct_us(s, m, 0.50);
            out->kind[k].p99_us = pct_us(s, m, 0.99);
        }
        free(s);
    }
    free_threads(th, n);
    return 0;
}

void mfb_result_print(const mfb_job_t *job, const mfb_result_t *r, const char *extra)
{
    printf("RESULT\tsystem=%s\top=%s\tclients=%d\tops=%llu\tbytes=%llu\terrors=%llu"
           "\twall_s=%.3f\tops_s=%.1f\tgbps=%.3f\tp50_us=%.1f\tp99_us=%.1f\tmean_us=%.1f",
           job->system, job->op, job->n_clients, (unsigned long long)r->ops,
           (unsigned long long)r->bytes, (unsigned long long)r->errors, r->wall_s,
           r->ops_per_s, r->gbps, r->p50_us, r->p99_us, r->mean_us);
    if (extra && *extra)
        printf("\t%s", extra);
    if (r->err[0])
        printf("\terr=%s", r->err);
    printf("\n");
    for (int k = 0; k < r->n_kinds; k++)
        printf("RESULT\tsystem=%s\top=%s/%s\tclients=%d\tops=%llu\tbytes=0\terrors=0"
               "\twall_s=%.3f\tops_s=%.1f\tgbps=0\tp50_us=%.1f\tp99_us=%.1f\tmean_us=0\n",
               job->system, job->op, job->kind_names[k], job->n_clients,
               (unsigned long long)r->kind[k].ops, r->wall_s,
               r->wall_s > 0 ? (double)r->kind[k].ops / r->wall_s : 0, r->kind[k].p50_us,
               r->kind[k].p99_us);
    fflush(stdout);
}
