/* test_daemon_metrics — the Prometheus text: HELP/TYPE before samples, names with the
 * mapflowd_ prefix (process_* aside) and base-unit suffixes (microsecond counters shown
 * as seconds), cumulative histogram buckets ending in +Inf equal to _count, token
 * counters with their denominators; the process_* values read from /proc/self. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include "metrics.h"

static double sample(const char *text, const char *name)
{
    const char *p = text;
    size_t n = strlen(name);
    while ((p = strstr(p, name))) {
        if ((p == text || p[-1] == '\n') && p[n] == ' ')
            return strtod(p + n + 1, NULL);
        p += n;
    }
    return -1;
}

static void test_render(void **state)
{
    (void)state;
    mfd_metrics_t m;
    mfd_metrics_init(&m);
    unsigned seed = 5;
    double obs[200];
    for (int i = 0; i < 200; i++) {
        obs[i] = 1e-6 * (1 + rand_r(&seed) % 2000000); /* 1 µs .. 2 s */
        mfd_metrics_observe(&m, MFD_H_GET, obs[i]);
    }
    mfd_count(&m, MFD_C_GET_REQ_TOKENS, 640);
    mfd_count(&m, MFD_C_GET_HIT_TOKENS_HOST, 320);
    mfd_count(&m, MFD_C_GET_HIT_TOKENS_SSD, 64);
    mfd_metrics_error(&m, MF_NOT_FOUND);
    mfd_metrics_error(&m, MF_NOT_FOUND);
    uint64_t us = 1 + (uint64_t)rand_r(&seed) % 90000000; /* up to 90 s in µs */
    mfd_count(&m, MFD_C_GPU_COMMIT_CHECK_US, us);
    mfd_gauges_t g = {0};
    assert_int_equal(mfd_process_read(&g.proc), MF_OK);
    g.tiers[0] = (mfd_tier_gauge_t){"gpu", 0, 0, 0, 0};
    g.tiers[1] = (mfd_tier_gauge_t){"host", 1, 4096, 1 << 20, 3};
    g.tiers[2] = (mfd_tier_gauge_t){"ssd", 1, 8192, 1 << 30, 5};
    g.version = "9.9.9";
    size_t len;
    char *t = mfd_metrics_render(&m, &g, NULL, NULL, &len);
    assert_non_null(t);
    assert_int_equal(strlen(t), len);
    assert_int_equal(t[len - 1], '\n');
    assert_true(sample(t, "mapflowd_get_requested_tokens_total") == 640);
    assert_true(sample(t, "mapflowd_get_hit_tokens_total{tier=\"host\"}") == 320);
    assert_true(sample(t, "mapflowd_get_hit_tokens_total{tier=\"ssd\"}") == 64);
    assert_true(sample(t, "mapflowd_errors_total{code=\"NOT_FOUND\"}") == 2);
    assert_true(sample(t, "mapflowd_tier_used_bytes{tier=\"ssd\"}") == 8192);
    assert_true(sample(t, "mapflowd_tier_capacity_bytes{tier=\"host\"}") == 1 << 20);
    assert_true(sample(t, "mapflowd_build_info{version=\"9.9.9\",protocol=\"1\"}") == 1);
    /* Microseconds in, seconds out, under the _seconds_total name only. */
    double secs = sample(t, "mapflowd_gpu_commit_check_seconds_total");
    assert_true(fabs(secs - (double)us / 1e6) < 1e-6);
    assert_null(strstr(t, "microseconds"));
    assert_true(sample(t, "process_open_fds") == (double)g.proc.open_fds);
    assert_true(sample(t, "process_resident_memory_bytes") == (double)g.proc.resident_bytes);
    assert_true(sample(t, "process_start_time_seconds") > 0);
    /* Histogram: cumulative, monotone, +Inf == count, sum matches. */
    double prev = 0, sum = 0;
    char name[128];
    for (int i = 0; i < MFD_HIST_BUCKETS; i++) {
        snprintf(name, sizeof(name),
                 "mapflowd_request_duration_seconds_bucket{op=\"get\",le=\"%g\"}", mfd_hist_bound(i));
        double v = sample(t, name);
        int want = 0;
        for (int k = 0; k < 200; k++)
            want += obs[k] <= mfd_hist_bound(i);
        assert_true(v == want);
        assert_true(v >= prev);
        prev = v;
    }
    for (int k = 0; k < 200; k++)
        sum += obs[k];
    assert_true(sample(t, "mapflowd_request_duration_seconds_bucket{op=\"get\",le=\"+Inf\"}") == 200);
    assert_true(sample(t, "mapflowd_request_duration_seconds_count{op=\"get\"}") == 200);
    double got_sum = sample(t, "mapflowd_request_duration_seconds_sum{op=\"get\"}");
    assert_true(got_sum > sum * 0.999999 && got_sum < sum * 1.000001);
    assert_true(mfd_hist_bound(0) == 1e-5 && mfd_hist_bound(MFD_HIST_BUCKETS - 1) == 1.0);
    /* Every sample line names a family announced by # TYPE before it; units are base. */
    char *save, *copy = strdup(t);
    char types[200][96];
    int nt = 0;
    for (char *line = strtok_r(copy, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        if (!strncmp(line, "# TYPE ", 7)) {
            sscanf(line + 7, "%95s", types[nt++]);
            continue;
        }
        if (line[0] == '#')
            continue;
        assert_true(!strncmp(line, "mapflowd_", 9) || !strncmp(line, "process_", 8));
        assert_null(strstr(line, "_ms"));
        int found = 0;
        for (int i = 0; i < nt && !found; i++)
            found = !strncmp(line, types[i], strlen(types[i]));
        assert_true(found);
    }
    free(copy);
    free(t);
}

static void visit(const char *name, uint64_t value, void *arg)
{
    uint64_t *v = arg;
    if (!strcmp(name, "puts_total"))
        v[0] = value;
    if (!strcmp(name, "gpu_commit_microseconds_total"))
        v[1] = value;
}

/* Stats keeps integer microseconds under the _microseconds_total name. */
/* Another module's families through the builder (peer.c's path): appended by the render's
 * callback, label values escaped, a histogram cumulative with +Inf = _count. */
typedef struct more_arg {
    char label[40];
    uint64_t v;
    mfd_hist_t h;
} more_arg_t;

static void more_families(mfd_prom_t *b, void *arg)
{
    more_arg_t *a = arg;
    mfd_prom_family(b, "test_items_total", "counter", "items, by peer");
    mfd_prom_labelled(b, "test_items_total", "peer", a->label, a->v);
    mfd_prom_family(b, "test_duration_seconds", "histogram", "durations");
    mfd_prom_hist(b, "test_duration_seconds", "", &a->h);
}

static void test_more_families(void **state)
{
    (void)state;
    unsigned seed = (unsigned)time(NULL);
    more_arg_t a = {{0}, 0, {{0}, 0, 0}};
    /* A random label holding each character the format must escape. */
    static const char alpha[] = "ab:9.\\\"\n";
    for (int i = 0; i < 30; i++)
        a.label[i] = alpha[rand_r(&seed) % (sizeof(alpha) - 1)];
    a.label[30] = '"';
    a.label[31] = '\\';
    a.label[32] = '\n';
    a.v = 1 + (uint64_t)rand_r(&seed);
    int n_obs = 1 + rand_r(&seed) % 100;
    for (int i = 0; i < n_obs; i++)
        mfd_hist_observe(&a.h, 1e-6 * (1 + rand_r(&seed) % 3000000));
    mfd_metrics_t m;
    mfd_metrics_init(&m);
    mfd_gauges_t g = {0};
    g.tiers[0] = (mfd_tier_gauge_t){"gpu", 0, 0, 0, 0};
    g.tiers[1] = (mfd_tier_gauge_t){"host", 0, 0, 0, 0};
    g.tiers[2] = (mfd_tier_gauge_t){"ssd", 0, 0, 0, 0};
    size_t len;
    char *t = mfd_metrics_render(&m, &g, more_families, &a, &len);
    assert_non_null(t);
    char want[200], *w = want;
    w += sprintf(w, "\nmapflowd_test_items_total{peer=\"");
    for (const char *c = a.label; *c; c++) {
        if (*c == '\\' || *c == '"')
            *w++ = '\\', *w++ = *c;
        else if (*c == '\n')
            *w++ = '\\', *w++ = 'n';
        else
            *w++ = *c;
    }
    sprintf(w, "\"} %llu\n", (unsigned long long)a.v);
    assert_non_null(strstr(t, want));
    assert_non_null(strstr(t, "# TYPE mapflowd_test_duration_seconds histogram\n"));
    char inf[96];
    snprintf(inf, sizeof(inf), "mapflowd_test_duration_seconds_bucket{le=\"+Inf\"}");
    assert_true(sample(t, inf) == n_obs);
    assert_true(sample(t, "mapflowd_test_duration_seconds_count") == n_obs);
    /* Buckets never decrease. */
    double prev = 0;
    for (int i = 0; i < MFD_HIST_BUCKETS; i++) {
        char name[96];
        snprintf(name, sizeof(name), "mapflowd_test_duration_seconds_bucket{le=\"%g\"}",
                 mfd_hist_bound(i));
        double v = sample(t, name);
        assert_true(v >= prev && v <= n_obs);
        prev = v;
    }
    free(t);
}

static void test_visit_names(void **state)
{
    (void)state;
    mfd_metrics_t m;
    mfd_metrics_init(&m);
    unsigned seed = (unsigned)time(NULL);
    uint64_t puts = 1 + (uint64_t)rand_r(&seed) % 1000, us = 1 + (uint64_t)rand_r(&seed);
    mfd_count(&m, MFD_C_PUTS, puts);
    mfd_count(&m, MFD_C_GPU_COMMIT_US, us);
    uint64_t v[2] = {0, 0};
    mfd_metrics_visit(&m, visit, v);
    assert_int_equal(v[0], puts);
    assert_int_equal(v[1], us);
}

/* process_* follow this process: CPU time grows with work, an opened fd is counted, the
 * start time is before now and not in the far past, RSS covers memory just touched. */
static void test_process(void **state)
{
    (void)state;
    mfd_process_gauge_t a, b;
    assert_int_equal(mfd_process_read(&a), MF_OK);
    assert_true(a.ok && a.open_fds >= 3 && a.resident_bytes > 0 && a.virtual_bytes >= a.resident_bytes);
    int fds[5];
    for (int i = 0; i < 5; i++)
        assert_true((fds[i] = open("/dev/null", O_RDONLY)) >= 0);
    size_t big = 64u << 20;
    unsigned char *p = malloc(big);
    assert_non_null(p);
    unsigned seed = 3;
    for (size_t i = 0; i < big; i += 4096)
        p[i] = (unsigned char)rand_r(&seed);
    volatile double x = 0;
    clock_t c0 = clock();
    while (clock() - c0 < CLOCKS_PER_SEC / 5)
        x += sqrt((double)rand_r(&seed));
    assert_int_equal(mfd_process_read(&b), MF_OK);
    assert_int_equal(b.open_fds, a.open_fds + 5);
    assert_true(b.resident_bytes >= a.resident_bytes + big / 2);
    assert_true(b.cpu_seconds >= a.cpu_seconds + 0.1);
    double now = (double)time(NULL);
    assert_true(b.start_time_seconds <= now + 2 && b.start_time_seconds > now - 3600);
    assert_true(b.max_fds == 0 || b.max_fds >= b.open_fds);
    for (int i = 0; i < 5; i++)
        close(fds[i]);
    free(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_render),
        cmocka_unit_test(test_visit_names),
        cmocka_unit_test(test_more_families),
        cmocka_unit_test(test_process),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
