/* metrics — counters, histograms and the Prometheus text renderer (see metrics.h). */
#include "metrics.h"

#include <dirent.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>
#include "mf_frame.h"

/* The Stats-side unit suffix a counter family may carry; /metrics shows seconds. */
#define US_SUFFIX "_microseconds_total"

typedef struct cdesc {
    const char *family, *labels, *help;
} cdesc_t;

static const cdesc_t g_counters[] = {
#define MFD_CNT_DESC_(id, fam, lab, help) {fam, lab, help},
    MFD_COUNTERS(MFD_CNT_DESC_)
#undef MFD_CNT_DESC_
};

static const char *const g_hist_ops[MFD_H_COUNT] = {"put", "get", "lookup"};

void mfd_metrics_init(mfd_metrics_t *m)
{
    memset(m, 0, sizeof(*m));
}

void mfd_metrics_error(mfd_metrics_t *m, mf_status_t st)
{
    if ((int)st >= 0 && (int)st < MF_STATUS_COUNT)
        m->errors[st]++;
}

void mfd_metrics_request(mfd_metrics_t *m, int body_case)
{
    if (body_case >= 0 && body_case < MFD_MAX_OPS)
        m->requests[body_case]++;
}

double mfd_hist_bound(int i)
{
    return pow(10.0, -5.0 + 0.5 * i);
}

void mfd_metrics_observe(mfd_metrics_t *m, mfd_hist_id_t h, double seconds)
{
    mfd_hist_observe(&m->hist[h], seconds);
}

void mfd_hist_observe(mfd_hist_t *x, double seconds)
{
    int i = 0;
    while (i < MFD_HIST_BUCKETS && seconds > mfd_hist_bound(i))
        i++;
    if (i < MFD_HIST_BUCKETS)
        x->bucket[i]++;
    x->count++;
    x->sum += seconds;
}

/* ---- text builder ------------------------------------------------------------------ */

typedef mfd_prom_t sbuf_t;

static void sb_printf(sbuf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf_t *b, const char *fmt, ...)
{
    if (b->oom)
        return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->oom = 1;
            return;
        }
        if ((size_t)n < b->cap - b->len) {
            b->len += (size_t)n;
            return;
        }
        size_t ncap = b->cap * 2 + (size_t)n;
        char *np = realloc(b->p, ncap);
        if (!np) {
            b->oom = 1;
            return;
        }
        b->p = np;
        b->cap = ncap;
    }
}

void mfd_prom_family(mfd_prom_t *b, const char *name, const char *type, const char *help)
{
    sb_printf(b, "# HELP mapflowd_%s %s\n# TYPE mapflowd_%s %s\n", name, help, name, type);
}

void mfd_prom_u64(mfd_prom_t *b, const char *name, const char *labels, uint64_t v)
{
    sb_printf(b, "mapflowd_%s%s%s%s %llu\n", name, labels[0] ? "{" : "", labels,
              labels[0] ? "}" : "", (unsigned long long)v);
}

/* Label values escaped as the text format asks: backslash, double quote, newline. */
void mfd_prom_labelled(mfd_prom_t *b, const char *name, const char *key, const char *value,
                       uint64_t v)
{
    sb_printf(b, "mapflowd_%s{%s=\"", name, key);
    for (const char *c = value; *c; c++) {
        if (*c == '\\' || *c == '"')
            sb_printf(b, "\\%c", *c);
        else if (*c == '\n')
            sb_printf(b, "\\n");
        else
            sb_printf(b, "%c", *c);
    }
    sb_printf(b, "\"} %llu\n", (unsigned long long)v);
}

void mfd_prom_hist(mfd_prom_t *b, const char *name, const char *labels, const mfd_hist_t *h)
{
    const char *sep = labels[0] ? "," : "";
    uint64_t cum = 0;
    for (int i = 0; i < MFD_HIST_BUCKETS; i++) {
        cum += h->bucket[i];
        sb_printf(b, "mapflowd_%s_bucket{%s%sle=\"%g\"} %llu\n", name, labels, sep,
                  mfd_hist_bound(i), (unsigned long long)cum);
    }
    sb_printf(b, "mapflowd_%s_bucket{%s%sle=\"+Inf\"} %llu\n", name, labels, sep,
              (unsigned long long)h->count);
    sb_printf(b, "mapflowd_%s_sum%s%s%s %.9g\n", name, labels[0] ? "{" : "", labels,
              labels[0] ? "}" : "", h->sum);
    sb_printf(b, "mapflowd_%s_count%s%s%s %llu\n", name, labels[0] ? "{" : "", labels,
              labels[0] ? "}" : "", (unsigned long long)h->count);
}

/* The /metrics name of a counter family: `x_microseconds_total` → `x_seconds_total`.
 * Returns 1 when the value is in microseconds (to be divided by 1e6). */
static int prom_family(const char *fam, char *out, size_t cap)
{
    size_t n = strlen(fam), k = strlen(US_SUFFIX);
    if (n > k && !strcmp(fam + n - k, US_SUFFIX)) {
        snprintf(out, cap, "%.*s_seconds_total", (int)(n - k), fam);
        return 1;
    }
    snprintf(out, cap, "%s", fam);
    return 0;
}

/* process_* carry no mapflowd_ prefix: the names every Prometheus client library uses. */
static void process_families(sbuf_t *b, const mfd_process_gauge_t *p)
{
    static const struct {
        const char *name, *type, *help;
    } f[] = {
        {"process_cpu_seconds_total", "counter", "user and system CPU time spent, in seconds"},
        {"process_resident_memory_bytes", "gauge", "resident memory size, in bytes"},
        {"process_virtual_memory_bytes", "gauge", "virtual memory size, in bytes"},
        {"process_open_fds", "gauge", "open file descriptors"},
        {"process_max_fds", "gauge", "the file descriptor limit (RLIMIT_NOFILE, soft)"},
        {"process_start_time_seconds", "gauge",
         "start time of the process since the Unix epoch, in seconds"},
    };
    if (!p->ok)
        return;
    double v[] = {p->cpu_seconds,         (double)p->resident_bytes, (double)p->virtual_bytes,
                  (double)p->open_fds,    (double)p->max_fds,        p->start_time_seconds};
    for (size_t i = 0; i < sizeof(f) / sizeof(f[0]); i++)
        sb_printf(b, "# HELP %s %s\n# TYPE %s %s\n%s %.15g\n", f[i].name, f[i].help, f[i].name,
                  f[i].type, f[i].name, v[i]);
}

mf_status_t mfd_process_read(mfd_process_gauge_t *p)
{
    memset(p, 0, sizeof(*p));
    char buf[1024];
    FILE *f = fopen("/proc/self/stat", "r");
    size_t n = f ? fread(buf, 1, sizeof(buf) - 1, f) : 0;
    if (f)
        fclose(f);
    buf[n] = 0;
    /* Fields after the command name, which may hold spaces and ')': the last ')'. */
    char *q = strrchr(buf, ')');
    unsigned long long ut, stt, start, vsize;
    long long rss;
    if (!q || sscanf(q + 2,
                     "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu %*d %*d %*d %*d "
                     "%*d %*d %llu %llu %lld",
                     &ut, &stt, &start, &vsize, &rss) != 5)
        return MF_UNAVAILABLE;
    long tck = sysconf(_SC_CLK_TCK), page = sysconf(_SC_PAGESIZE);
    unsigned long long btime = 0;
    f = fopen("/proc/stat", "r");
    while (f && fgets(buf, sizeof(buf), f))
        if (sscanf(buf, "btime %llu", &btime) == 1)
            break;
    if (f)
        fclose(f);
    DIR *d = opendir("/proc/self/fd");
    if (tck <= 0 || page <= 0 || !btime || !d) {
        if (d)
            closedir(d);
        return MF_UNAVAILABLE;
    }
    uint64_t fds = 0;
    for (struct dirent *e; (e = readdir(d));)
        fds += e->d_name[0] != '.';
    closedir(d);
    struct rlimit rl;
    p->cpu_seconds = (double)(ut + stt) / (double)tck;
    p->start_time_seconds = (double)btime + (double)start / (double)tck;
    p->resident_bytes = rss > 0 ? (uint64_t)rss * (uint64_t)page : 0;
    p->virtual_bytes = vsize;
    p->open_fds = fds ? fds - 1 : 0; /* less the descriptor opendir held */
    p->max_fds = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY
                     ? (uint64_t)rl.rlim_cur
                     : 0;
    p->ok = 1;
    return MF_OK;
}

static void tier_gauge(sbuf_t *b, const mfd_gauges_t *g, const char *name, const char *help,
                       size_t field)
{
    mfd_prom_family(b, name, "gauge", help);
    for (int t = 0; t < 3; t++) {
        const char *base = (const char *)&g->tiers[t];
        uint64_t v = field == (size_t)-1 ? (uint64_t)g->tiers[t].enabled
                                         : *(const uint64_t *)(base + field);
        mfd_prom_labelled(b, name, "tier", g->tiers[t].name, v);
    }
}

char *mfd_metrics_render(const mfd_metrics_t *m, const mfd_gauges_t *g, mfd_prom_more_cb more,
                         void *more_arg, size_t *len)
{
    sbuf_t b = {malloc(16384), 0, 16384, 0};
    if (!b.p)
        return NULL;
    b.p[0] = 0;

    mfd_prom_family(&b, "build_info", "gauge", "version of this mapflowd (value is always 1)");
    sb_printf(&b, "mapflowd_build_info{version=\"%s\",protocol=\"%u\"} 1\n",
              g->version ? g->version : "", MF_PROTOCOL_VERSION);
    mfd_prom_family(&b, "uptime_seconds", "gauge", "seconds since the daemon started");
    sb_printf(&b, "mapflowd_uptime_seconds %.3f\n", g->uptime_s);
    mfd_prom_family(&b, "ready", "gauge",
                    "1 when every enabled tier is up and listeners are bound");
    sb_printf(&b, "mapflowd_ready %d\n", g->ready);
    mfd_prom_family(&b, "connections", "gauge", "client connections open now");
    mfd_prom_u64(&b, "connections", "", g->connections);
    mfd_prom_family(&b, "leases", "gauge", "read leases held now");
    mfd_prom_u64(&b, "leases", "", g->leases);
    mfd_prom_family(&b, "reservations", "gauge", "put reservations not yet committed");
    mfd_prom_u64(&b, "reservations", "", g->reservations);
    mfd_prom_family(&b, "put_regions", "gauge", "put regions not yet committed");
    mfd_prom_u64(&b, "put_regions", "", g->regions);
    mfd_prom_family(&b, "ssd_inflight", "gauge", "SSD tier operations queued or running");
    mfd_prom_u64(&b, "ssd_inflight", "", g->ssd_inflight);
    mfd_prom_family(&b, "ssd_write_backlog_bytes", "gauge",
                    "row bytes of async write-throughs not yet on the SSD tier (queued or "
                    "deferred)");
    mfd_prom_u64(&b, "ssd_write_backlog_bytes", "", g->wt_backlog_bytes);

    tier_gauge(&b, g, "tier_enabled", "1 when the tier is on", (size_t)-1);
    tier_gauge(&b, g, "tier_used_bytes", "bytes held by the tier",
               offsetof(mfd_tier_gauge_t, used));
    tier_gauge(&b, g, "tier_capacity_bytes", "bytes the tier may hold",
               offsetof(mfd_tier_gauge_t, capacity));
    tier_gauge(&b, g, "tier_entries", "rows held by the tier",
               offsetof(mfd_tier_gauge_t, entries));
    if (g->n_gpu) {
        static const char *const fam[3][2] = {
            {"gpu_arena_used_bytes", "bytes held in one GPU arena"},
            {"gpu_arena_capacity_bytes", "size of one GPU arena"},
            {"gpu_arena_entries", "rows held in one GPU arena"}};
        for (int f = 0; f < 3; f++) {
            mfd_prom_family(&b, fam[f][0], "gauge", fam[f][1]);
            for (size_t i = 0; i < g->n_gpu; i++) {
                const mfd_gpu_gauge_t *x = &g->gpu[i];
                uint64_t v = f == 0 ? x->used : f == 1 ? x->capacity : x->entries;
                sb_printf(&b, "mapflowd_%s{arena=\"%zu\",device=\"%d\"} %llu\n", fam[f][0], i,
                          x->device, (unsigned long long)v);
            }
        }
    }

    for (int i = 0; i < MFD_C_COUNT; i++) {
        const cdesc_t *d = &g_counters[i];
        char fam[128];
        int us = prom_family(d->family, fam, sizeof(fam));
        if (i == 0 || strcmp(d->family, g_counters[i - 1].family) != 0)
            mfd_prom_family(&b, fam, "counter", d->help);
        if (us)
            sb_printf(&b, "mapflowd_%s%s%s%s %.6f\n", fam, d->labels[0] ? "{" : "", d->labels,
                      d->labels[0] ? "}" : "", (double)m->c[i] / 1e6);
        else
            mfd_prom_u64(&b, fam, d->labels, m->c[i]);
    }

    mfd_prom_family(&b, "requests_total", "counter", "requests received, by message type");
    for (int i = 0; i < MFD_MAX_OPS; i++)
        if (m->requests[i])
            mfd_prom_labelled(&b, "requests_total", "op", mf_envelope_body_name(i),
                              m->requests[i]);

    mfd_prom_family(&b, "errors_total", "counter", "failed requests and rows, by status code");
    for (int s = 1; s < MF_STATUS_COUNT; s++)
        mfd_prom_labelled(&b, "errors_total", "code", mf_status_name(s), m->errors[s]);

    mfd_prom_family(&b, "request_duration_seconds", "histogram",
           "time from a request's arrival to its reply being queued");
    for (int h = 0; h < MFD_H_COUNT; h++) {
        char lab[32];
        snprintf(lab, sizeof(lab), "op=\"%s\"", g_hist_ops[h]);
        mfd_prom_hist(&b, "request_duration_seconds", lab, &m->hist[h]);
    }
    process_families(&b, &g->proc);
    if (more)
        more(&b, more_arg);
    if (b.oom) {
        free(b.p);
        return NULL;
    }
    *len = b.len;
    return b.p;
}

void mfd_metrics_visit(const mfd_metrics_t *m, mfd_metric_visit_cb cb, void *arg)
{
    char name[160];
    for (int i = 0; i < MFD_C_COUNT; i++) {
        const cdesc_t *d = &g_counters[i];
        if (d->labels[0])
            snprintf(name, sizeof(name), "%s{%s}", d->family, d->labels);
        else
            snprintf(name, sizeof(name), "%s", d->family);
        cb(name, m->c[i], arg);
    }
    for (int s = 1; s < MF_STATUS_COUNT; s++) {
        snprintf(name, sizeof(name), "errors_total{code=\"%s\"}", mf_status_name(s));
        cb(name, m->errors[s], arg);
    }
    for (int h = 0; h < MFD_H_COUNT; h++) {
        snprintf(name, sizeof(name), "request_duration_seconds_count{op=\"%s\"}",
                 g_hist_ops[h]);
        cb(name, m->hist[h].count, arg);
    }
}
