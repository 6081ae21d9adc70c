/*
 * mapflow-bench-daemon — measures a running mapflowd against memcpy, Redis and direct
 * RocksDB on the same map rows (MapFlow issue 13). bench/daemon/run.sh starts the
 * daemon and redis-server and calls this; it prints one RESULT line per measurement
 * (bench_util.h) and INFO lines, and bench/daemon/report.py turns them into the table.
 *
 * Phases (--only takes a comma list of these names):
 *   memcpy  put  lookup  get  prefix  mixed  ssd  rocksdb  redis
 * Every measured loop is bounded by --seconds and the SSD / RocksDB passes by the row
 * count, at each client count of --clients (threads, each with its own connection),
 * repeated --reps times (one RESULT line each; report.py prints min / median / max).
 * --redis-io names a second redis-server (io-threads on) measured the same way as
 * system "redis-io"; --drop-caches empties the page cache before every SSD pass of both
 * mapflowd and RocksDB, so those passes read the disk (needs root).
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_baselines.h"
#include "bench_mapflow.h"
#include "bench_rows.h"
#include "bench_util.h"

#define MAX_COUNTS 8

typedef struct options {
    const char *target;
    const char *redis_socket;
    const char *redis_io_socket;
    const char *rocks_dir;
    const char *only;
    int clients[MAX_COUNTS];
    int n_clients;
    double seconds;
    double budget;   /* seconds for mapflowd's points; later ones are skipped past it */
    uint32_t lookup_blocks; /* 0: lookups of 64 blocks and of the whole context */
    int reps;        /* repetitions of every point */
    int drop_caches; /* empty the page cache before each SSD pass */
    double t0;
    mfb_workload_params_t wp;
} options_t;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: mapflow-bench-daemon --daemon unix:PATH [--redis PATH] [--rocks-dir DIR]\n"
            "         [--quick] [--clients 1,4,16,64] [--seconds S] [--only PHASES]\n"
            "         [--ctx-tokens N] [--mask-layers L] [--fp8-rows N] [--fp8-layers L]\n"
            "         [--seed N] [--budget S] [--lookup-blocks N] [--reps N]\n"
            "         [--redis-io PATH] [--drop-caches]\n"
            "phases: memcpy put lookup get prefix mixed ssd rocksdb redis (default: all)\n"
            "Prints RESULT and INFO lines (tab separated); bench/daemon/run.sh drives it.\n");
}

static int phase_on(const options_t *o, const char *name)
{
    if (!o->only || !*o->only)
        return 1;
    size_t n = strlen(name);
    for (const char *p = o->only; (p = strstr(p, name)); p += n)
        if ((p == o->only || p[-1] == ',') && (p[n] == ',' || p[n] == '\0'))
            return 1;
    return 0;
}

static int parse_counts(const char *s, options_t *o)
{
    o->n_clients = 0;
    char *end;
    while (*s && o->n_clients < MAX_COUNTS) {
        long v = strtol(s, &end, 10);
        if (end == s || v < 1 || v > MFB_MAX_CLIENTS)
            return -1;
        o->clients[o->n_clients++] = (int)v;
        s = *end == ',' ? end + 1 : end;
        if (*end && *end != ',')
            return -1;
    }
    return o->n_clients ? 0 : -1;
}

static int parse_args(int argc, char **argv, options_t *o)
{
    enum { O_REDIS = 256, O_ROCKS, O_QUICK, O_CLIENTS, O_SECONDS, O_ONLY, O_CTX, O_MASKL,
           O_FP8R, O_FP8L, O_SEED, O_BUDGET, O_LOOKUPB, O_REPS, O_REDIS_IO, O_DROP };
    static const struct option longs[] = {
        {"daemon", required_argument, NULL, 'd'},   {"redis", required_argument, NULL, O_REDIS},
        {"rocks-dir", required_argument, NULL, O_ROCKS}, {"quick", no_argument, NULL, O_QUICK},
        {"clients", required_argument, NULL, O_CLIENTS},
        {"seconds", required_argument, NULL, O_SECONDS},
        {"only", required_argument, NULL, O_ONLY}, {"ctx-tokens", required_argument, NULL, O_CTX},
        {"mask-layers", required_argument, NULL, O_MASKL},
        {"fp8-rows", required_argument, NULL, O_FP8R},
        {"fp8-layers", required_argument, NULL, O_FP8L},
        {"seed", required_argument, NULL, O_SEED},  {"budget", required_argument, NULL, O_BUDGET},
        {"lookup-blocks", required_argument, NULL, O_LOOKUPB},
        {"reps", required_argument, NULL, O_REPS},
        {"redis-io", required_argument, NULL, O_REDIS_IO},
        {"drop-caches", no_argument, NULL, O_DROP},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0}};
    /* Defaults: the full run; --quick shrinks the row set and the time per point. */
    *o = (options_t){.seconds = 2.0,
                     .budget = 480,
                     .reps = 1,
                     .wp = {.ctx_tokens = 32768, .mask_layers = 16, .fp8_rows = 32,
                            .fp8_layers = 2, .fp8_first_block = 95, .seed = 13}};
    parse_counts("1,4,16,64", o);
    int quick = 0, c;
    double secs = -1, budget = -1;
    long fp8r = -1, fp8l = -1;
    while ((c = getopt_long(argc, argv, "d:h", longs, NULL)) != -1) {
        switch (c) {
        case 'd': o->target = optarg; break;
        case O_REDIS: o->redis_socket = optarg; break;
        case O_ROCKS: o->rocks_dir = optarg; break;
        case O_QUICK: quick = 1; break;
        case O_CLIENTS:
            if (parse_counts(optarg, o))
                return -1;
            break;
        case O_SECONDS: secs = atof(optarg); break;
        case O_ONLY: o->only = optarg; break;
        case O_CTX: o->wp.ctx_tokens = strtoul(optarg, NULL, 10); break;
        case O_MASKL: o->wp.mask_layers = (uint32_t)strtoul(optarg, NULL, 10); break;
        case O_FP8R: fp8r = strtol(optarg, NULL, 10); break;
        case O_FP8L: fp8l = strtol(optarg, NULL, 10); break;
        case O_SEED: o->wp.seed = strtoull(optarg, NULL, 10); break;
        case O_BUDGET: budget = atof(optarg); break;
        case O_LOOKUPB: o->lookup_blocks = (uint32_t)strtoul(optarg, NULL, 10); break;
        case O_REPS: o->reps = (int)strtol(optarg, NULL, 10); break;
        case O_REDIS_IO: o->redis_io_socket = optarg; break;
        case O_DROP: o->drop_caches = 1; break;
        case 'h': usage(stdout); exit(0);
        default: return -1;
        }
    }
    if (quick) {
        o->seconds = 0.5;
        o->budget = 90;
        o->wp.fp8_rows = 16;
        o->wp.fp8_layers = 1;
    }
    if (secs > 0)
        o->seconds = secs;
    if (budget > 0)
        o->budget = budget;
    if (fp8r > 0)
        o->wp.fp8_rows = (uint32_t)fp8r;
    if (fp8l > 0)
        o->wp.fp8_layers = (uint32_t)fp8l;
    if (optind != argc || !o->target || o->seconds <= 0 || o->seconds > 60 ||
        o->wp.mask_layers < 1 || o->wp.mask_layers > 64 || o->wp.ctx_tokens < 8192 ||
        o->wp.ctx_tokens > 131072 || o->reps < 1 || o->reps > 50)
        return -1;
    return 0;
}

/* Runs one job at every client count and prints its lines. */
static int sweep(const options_t *o, mfb_job_t *job, const char *op, void (*reset)(void *),
                 void *reset_arg, const char *(*extra)(void *), void *extra_arg)
{
    int bad = 0;
    /* Only mapflowd's points are skipped past the budget: the baselines run last and
     * every ratio of the table needs them (each is bounded by --seconds or its rows). */
    int budgeted = strcmp(job->system, "mapflow") == 0;
    for (int n = 0; n < o->n_clients * o->reps; n++) {
        /* Repetitions back to back at one client count, then the next count. */
        int i = n / o->reps;
        if (budgeted && mfb_now() - o->t0 > o->budget) {
            printf("INFO\tskipped %s/%s at %d clients: run budget of %.0f s spent\n",
                   job->system, op, o->clients[i], o->budget);
            n = (i + 1) * o->reps - 1;
            continue;
        }
        if (reset)
            reset(reset_arg);
        job->op = op;
        job->n_clients = o->clients[i];
        mfb_result_t r;
        if (mfb_run(job, &r) != 0) {
            fprintf(stderr, "bench: %s/%s at %d clients: %s\n", job->system, op,
                    job->n_clients, r.err);
            bad = 1;
            continue;
        }
        mfb_result_print(job, &r, extra ? extra(extra_arg) : NULL);
        bad |= r.errors != 0;
    }
    return bad;
}

typedef struct phase_ctx {
    const options_t *o;
    const mfb_workload_t *w;
    mfb_mf_arg_t mf;
    mfb_base_arg_t base;
} phase_ctx_t;

/* Writes back dirty pages and empties the page cache so the next pass reads the disk;
 * says whether that worked (it needs root) the first time and whenever that changes. */
static void drop_page_cache(const options_t *o)
{
    static int last = -1;
    if (!o->drop_caches)
        return;
    sync();
    FILE *f = fopen("/proc/sys/vm/drop_caches", "w");
    int ok = f && fputs("3\n", f) >= 0;
    if (f && fclose(f) != 0)
        ok = 0;
    if (ok == last)
        return;
    last = ok;
    printf("INFO\tpage cache %s before every ssd pass (mapflowd and rocksdb)\n",
           ok ? "dropped (echo 3 > /proc/sys/vm/drop_caches)"
              : "NOT dropped (no write access to /proc/sys/vm/drop_caches): passes may read "
                "cached pages");
}

static void evict_before_pass(void *p)
{
    phase_ctx_t *x = p;
    uint64_t ev = 0;
    atomic_store(&x->mf.next, 0);
    atomic_store(&x->mf.ssd_rows, 0);
    if (mfb_mapflow_evict_host(x->o->target, &ev) == MF_OK)
        printf("INFO\tevicted %.1f MB from the host tier before the ssd pass\n", ev / 1e6);
    drop_page_cache(x->o);
}

static const char *ssd_extra(void *p)
{
    static char buf[64];
    phase_ctx_t *x = p;
    snprintf(buf, sizeof(buf), "ssd_rows=%llu/%zu",
             (unsigned long long)atomic_load(&x->mf.ssd_rows), x->w->n_fp8);
    return buf;
}

/* Loads every row once with 8 clients (untimed for the table, printed as INFO). */
static int populate(phase_ctx_t *x)
{
    mfb_job_t job = {0};
    x->mf.op = MFB_MF_POPULATE;
    mfb_mapflow_job(&job, &x->mf);
    job.op = "populate";
    job.n_clients = 8;
    job.seconds = 600;
    mfb_result_t r;
    if (mfb_run(&job, &r) != 0 || r.errors) {
        fprintf(stderr, "bench: populate: %s\n", r.err);
        return -1;
    }
    printf("INFO\tpopulated %llu rows (%.1f MB) in %.2f s\n", (unsigned long long)r.ops,
           r.bytes / 1e6, r.wall_s);
    mfb_mapflow_settle(x->o->target, 60, "after populate");
    mfb_mapflow_print_stats(x->o->target, "after populate");
    return 0;
}

/*
 * The daemon's RocksDB keeps what was written last in its memtable (RAM, 64 MiB by
 * default) until that fills, and the FP8 rows are populated last: without this, part of
 * an "SSD" pass would be memtable hits. Rows of a second context (another seed: other
 * keys), written after them, push them out to the blob files as steady state would: its
 * MASK rows alone (32 layers, 84 MB) exceed the memtable, since large FP8 rows may not
 * be written through before they are evicted.
 */
static int push_out_memtable(phase_ctx_t *x)
{
    mfb_workload_params_t wp = x->o->wp;
    wp.seed ^= 0x9e3779b97f4a7c15ull;
    wp.mask_layers = 32;
    wp.fp8_rows = 1;
    wp.fp8_layers = 1;
    mfb_workload_t fw;
    const char *why = "";
    mf_status_t st = mfb_workload_build(&fw, &wp, &why);
    if (st != MF_OK) {
        fprintf(stderr, "bench: filler workload: %s: %s\n", mf_status_name(st), why);
        return -1;
    }
    phase_ctx_t y = {.o = x->o, .w = &fw};
    y.mf.target = x->mf.target;
    y.mf.w = &fw;
    printf("INFO\tbefore the ssd passes: writing %.1f MB of other rows so the daemon's "
           "memtable no longer holds the FP8 rows\n", (fw.mask_bytes + fw.fp8_bytes) / 1e6);
    int rc = populate(&y);
    mfb_workload_free(&fw);
    if (!rc && mfb_mapflow_wait_ssd(x->o->target, 20, "after the filler rows"))
        printf("INFO\tWARNING: write-through not drained: the first ssd pass may still "
               "find FP8 rows in the memtable\n");
    return rc;
}

static void settle_put(void *p)
{
    phase_ctx_t *x = p;
    mfb_mapflow_settle(x->o->target, 60, "before put");
}

/* One mapflowd operation at every client count. */
static int mf_sweep(phase_ctx_t *x, mfb_mf_op_t op, const char *name, double seconds,
                    void (*reset)(void *), const char *(*extra)(void *))
{
    mfb_job_t job = {0};
    x->mf.op = op;
    mfb_mapflow_job(&job, &x->mf);
    job.seconds = seconds;
    return sweep(x->o, &job, name, reset, x, extra, x);
}

static int mapflow_phases(phase_ctx_t *x)
{
    const options_t *o = x->o;
    int bad = 0;
    char name[64];
    uint32_t nb = (uint32_t)x->w->mask_cx.n_blocks, nl = x->w->mask_layers;
    if (phase_on(o, "lookup")) {
        uint32_t lens[2] = {nb < 64 ? nb : 64, nb}, one = o->lookup_blocks;
        for (int k = one ? 1 : 0; k < 2; k++) {
            if (one) /* one prefix length only (e.g. to read the daemon's time for it) */
                lens[k] = one < nb ? one : nb;
            x->mf.lookup_blocks = lens[k];
            snprintf(name, sizeof(name), "lookup_%ux%u", lens[k], nl);
            bad |= mf_sweep(x, MFB_MF_LOOKUP, name, o->seconds, NULL, NULL);
        }
    }
    if (phase_on(o, "get")) {
        bad |= mf_sweep(x, MFB_MF_GET_COPY, "get_copy", o->seconds, NULL, NULL);
        /* What the client's checksum of arena rows costs, and a channel without the
         * arena (rows come over the socket: what a TCP client gets). */
        x->mf.verify_header = 1;
        bad |= mf_sweep(x, MFB_MF_GET_COPY, "get_copy_hdr", o->seconds, NULL, NULL);
        x->mf.verify_header = 0;
        x->mf.no_arena = 1;
        bad |= mf_sweep(x, MFB_MF_GET_COPY, "get_copy_sock", o->seconds, NULL, NULL);
        x->mf.no_arena = 0;
        bad |= mf_sweep(x, MFB_MF_GET_LEASE, "get_lease", o->seconds, NULL, NULL);
        bad |= mf_sweep(x, MFB_MF_GET_LEASE_COPY, "get_lease_copy", o->seconds, NULL, NULL);
    }
    if (phase_on(o, "prefix")) {
        /* A whole 32k prefix of MASK rows, as many layers as one call may carry. */
        x->mf.prefix_layers = nl < 8 ? nl : 8;
        x->mf.prefix_blocks = nb;
        for (int k = 0; k < 2; k++) {
            snprintf(name, sizeof(name), "prefix_%s_%ux%u", k ? "lease" : "copy", nb,
                     x->mf.prefix_layers);
            bad |= mf_sweep(x, k ? MFB_MF_PREFIX_LEASE : MFB_MF_PREFIX_COPY, name,
                            o->seconds, NULL, NULL);
        }
        /* Where a leased prefix's time goes (issue 20): the client's checksum of every
         * arena row (header-only check), and every layer in one call instead of chunks
         * (needs the daemon's max_batch ≥ layers × blocks). */
        x->mf.verify_header = 1;
        snprintf(name, sizeof(name), "prefix_lease_hdr_%ux%u", nb, x->mf.prefix_layers);
        bad |= mf_sweep(x, MFB_MF_PREFIX_LEASE, name, o->seconds, NULL, NULL);
        x->mf.verify_header = 0;
        if (nl > x->mf.prefix_layers) {
            x->mf.prefix_layers = nl;
            for (int k = 0; k < 2; k++) {
                x->mf.verify_header = k;
                snprintf(name, sizeof(name), "prefix_lease%s_%ux%u", k ? "_hdr" : "", nb, nl);
                bad |= mf_sweep(x, MFB_MF_PREFIX_LEASE, name, o->seconds, NULL, NULL);
            }
            x->mf.verify_header = 0;
        }
    }
    if (phase_on(o, "put")) {
        bad |= mf_sweep(x, MFB_MF_PUT, "put", o->seconds, settle_put, NULL);
        mfb_mapflow_print_stats(o->target, "after put");
        mfb_mapflow_settle(o->target, 60, "after put");
        /* The same puts with the SSD write-through off: what the host tier alone takes. */
        if (mfb_mapflow_config(o->target, "write_through", "off") == MF_OK) {
            bad |= mf_sweep(x, MFB_MF_PUT, "put_wt_off", o->seconds, NULL, NULL);
            bad |= mfb_mapflow_config(o->target, "write_through", "async") != MF_OK;
        }
        /* Put bursts push the MASK rows down to the SSD tier: load them back so the
         * mixed workload starts from the same state as the read measurements. */
        if (phase_on(o, "mixed") && populate(x))
            return 1;
        mfb_mapflow_settle(o->target, 60, "after the second populate");
    }
    if (phase_on(o, "mixed"))
        bad |= mf_sweep(x, MFB_MF_MIXED, "mixed", o->seconds, NULL, NULL);
    if (phase_on(o, "ssd")) {
        if (push_out_memtable(x))
            return 1;
        /* A pass is bounded by the row count, not by --seconds. */
        bad |= mf_sweep(x, MFB_MF_SSD_GET, "ssd_get", 120, evict_before_pass, ssd_extra);
        x->mf.verify_header = 1;
        bad |= mf_sweep(x, MFB_MF_SSD_GET, "ssd_get_hdr", 120, evict_before_pass, ssd_extra);
        x->mf.verify_header = 0;
        mfb_mapflow_print_stats(o->target, "after ssd");
    }
    return bad;
}

static void reset_next(void *p)
{
    atomic_store(&((mfb_base_arg_t *)p)->next, 0);
}

static void reset_next_cold(void *p)
{
    phase_ctx_t *x = p;
    reset_next(&x->base);
    drop_page_cache(x->o);
}

/* One baseline operation at every client count; system overrides the job's name (NULL:
 * keep it). reset gets the phase context. */
static int base_sweep(phase_ctx_t *x, mfb_base_op_t op, const char *name, double seconds,
                      void (*reset)(void *), const char *system)
{
    mfb_job_t job = {0};
    x->base.op = op;
    mfb_base_job(&job, &x->base);
    if (system)
        job.system = system;
    job.seconds = seconds;
    return sweep(x->o, &job, name, reset, x, NULL, NULL);
}

static int memcpy_phase(phase_ctx_t *x)
{
    int bad = base_sweep(x, MFB_BASE_MEMCPY, "copy", x->o->seconds, NULL, NULL);
    return bad | base_sweep(x, MFB_BASE_VERIFY, "verify", x->o->seconds, NULL, NULL);
}

/* Direct RocksDB passes over the FP8 rows: buffered reads (page cache dropped before
 * each pass with --drop-caches), then a second database read with O_DIRECT, which needs
 * no root to stay off the page cache. */
static int rocksdb_phase(phase_ctx_t *x)
{
    int bad = 0;
    for (int direct = 0; direct < 2; direct++) {
        char dir[4096];
        snprintf(dir, sizeof(dir), "%s%s", x->o->rocks_dir, direct ? "-odirect" : "");
        if (mfb_rocks_open(&x->base, dir, direct) != 0)
            return 1;
        /* A pass is bounded by the row count, not by --seconds. */
        bad |= base_sweep(x, MFB_BASE_ROCKS_GET, direct ? "ssd_get_odirect" : "ssd_get", 120,
                          reset_next_cold, NULL);
        mfb_rocks_close(&x->base);
    }
    return bad;
}

/* SET then GET of the FP8 rows against the redis-server at socket, as system. */
static int redis_phase(phase_ctx_t *x, const char *socket, const char *system)
{
    if (!mfb_have_redis()) {
        printf("INFO\tredis skipped: built without hiredis (apt-get install libhiredis-dev)\n");
        return 0;
    }
    x->base.redis_socket = socket;
    if (mfb_redis_load(&x->base) != 0)
        return 1;
    int bad = base_sweep(x, MFB_BASE_REDIS_SET, "put", x->o->seconds, NULL, system);
    return bad | base_sweep(x, MFB_BASE_REDIS_GET, "get_copy", x->o->seconds, NULL, system);
}

int main(int argc, char **argv)
{
    options_t o;
    if (parse_args(argc, argv, &o)) {
        usage(stderr);
        return 2;
    }
    double t0 = o.t0 = mfb_now();
    mfb_workload_t w;
    const char *why = "";
    mf_status_t st = mfb_workload_build(&w, &o.wp, &why);
    if (st != MF_OK) {
        fprintf(stderr, "bench: workload: %s: %s\n", mf_status_name(st), why);
        return 1;
    }
    printf("INFO\tworkload: %zu-token context, B=%u, %u heads, density 10%%\n",
           w.mask_cx.n_tokens, MFB_BLOCK, MFB_HEADS);
    printf("INFO\tmask rows: %zu (%u layers x %zu blocks), %.1f MB, mean %.1f KB\n", w.n_mask,
           w.mask_layers, w.mask_cx.n_blocks, w.mask_bytes / 1e6,
           w.mask_bytes / 1e3 / (double)w.n_mask);
    printf("INFO\tfp8 rows: %zu (%u layers x %u blocks %u..%zu), %.1f MB, %.2f..%.2f MiB, "
           "mean %.2f MiB\n",
           w.n_fp8, o.wp.fp8_layers, o.wp.fp8_rows, o.wp.fp8_first_block,
           w.mask_cx.n_blocks - 1, w.fp8_bytes / 1e6, w.fp8_min_len / 1048576.0,
           w.fp8_max_len / 1048576.0, w.fp8_bytes / 1048576.0 / (double)w.n_fp8);
    printf("INFO\tbuilt the workload in %.2f s\n", mfb_now() - t0);
    fflush(stdout);

    phase_ctx_t x = {.o = &o, .w = &w};
    x.mf.target = o.target;
    x.mf.w = &w;
    x.base.w = &w;
    x.base.redis_socket = o.redis_socket;

    /* memcpy first (nothing else running), the other stores last so their load does
     * not overlap the daemon's measurements. */
    int bad = 0;
    if (phase_on(&o, "memcpy"))
        bad |= memcpy_phase(&x);
    if (phase_on(&o, "put") || phase_on(&o, "lookup") || phase_on(&o, "get") ||
        phase_on(&o, "prefix") || phase_on(&o, "mixed") || phase_on(&o, "ssd")) {
        if (populate(&x))
            return 1;
        bad |= mapflow_phases(&x);
    }
    if (phase_on(&o, "rocksdb") && o.rocks_dir)
        bad |= rocksdb_phase(&x);
    if (phase_on(&o, "redis") && o.redis_socket)
        bad |= redis_phase(&x, o.redis_socket, "redis");
    if (phase_on(&o, "redis") && o.redis_io_socket)
        bad |= redis_phase(&x, o.redis_io_socket, "redis-io");
    printf("INFO\tbench finished in %.1f s\n", mfb_now() - t0);
    mfb_workload_free(&w);
    return bad ? 1 : 0;
}
