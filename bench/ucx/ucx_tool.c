/*
 * mapflow-ucx-tool — drives the UCX peer path for tests/integration/test_ucx_*.sh and
 * bench/ucx/run.sh. Rows are deterministic from (seed, layer, block, size), so a reader
 * can rebuild what a writer stored and compare bytes.
 *
 *   put    --socket S  ...           PutBegin/PutCommit of every row (unix socket)
 *   get    --socket S  [--peer A]    Get by prefix (GET_COPY) through a daemon, naming a
 *                                    peer; compares every returned row with the expected one
 *   lookup --socket S  [--peer A]    Lookup; prints the blocks per layer
 *   flush  --socket S                Flush the namespace
 *   fetch  --ucx A --token T ...     a standalone UCX client (daemon/peer.c's fetch engine):
 *                                    leases + pipelined one-sided gets, --iters times, timed
 *
 * Shape options: --ns N (default "t") --model M (default "m") --seed X --layers L
 * --first-block F --blocks N --size BYTES [--vary] (row sizes ×1..×4 by layer and block).
 * Output is one `key=value` line per command for scripts. Exit: 0 answered, 1 the daemon
 * refused the request (ErrorReply), 2 usage, 3 cannot connect.
 */
#include <errno.h>
#include <event2/event.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "mf_frame.h"
#include "mf_hash.h"
#include "mf_row.h"
#include "peer.h"

#define B 64u

typedef struct opts {
    const char *cmd, *socket, *ns, *model, *peer, *ucx, *token;
    uint64_t seed, size;
    uint32_t layers, first_block, blocks, iters;
    int vary, lease;
} opts_t;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ==== deterministic rows =============================================================== */

static uint64_t mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

typedef struct ctx {
    uint32_t *tokens;
    size_t n_blocks;
    mf_hash128_t *h;        /* h[0] root, h[b + 1] block b */
} ctx_t;

static int ctx_init(ctx_t *cx, const opts_t *o)
{
    cx->n_blocks = (size_t)o->first_block + o->blocks;
    cx->tokens = malloc(cx->n_blocks * B * sizeof(uint32_t));
    cx->h = malloc((cx->n_blocks + 1) * sizeof(*cx->h));
    if (!cx->tokens || !cx->h)
        return -1;
    uint64_t s = mix(o->seed);
    for (size_t i = 0; i < cx->n_blocks * B; i++) {
        s = mix(s);
        cx->tokens[i] = 1 + (uint32_t)(s % 50000);
    }
    cx->h[0] = mf_hash_root(B, o->ns, strlen(o->ns), o->model, strlen(o->model));
    for (size_t b = 0; b < cx->n_blocks; b++)
        cx->h[b + 1] = mf_hash_next(cx->h[b], cx->tokens + b * B, B);
    return 0;
}

static uint64_t row_target(const opts_t *o, uint32_t layer, uint32_t block)
{
    return o->vary ? o->size * (1 + (layer * 7u + block) % 4u) : o->size;
}

/* An FP16 row of about `target` bytes: heads × cols entries of 8 KiB tiles, random. */
static uint8_t *row_make(const opts_t *o, const ctx_t *cx, uint32_t layer, uint32_t block,
                         size_t *len)
{
    uint64_t tile = (uint64_t)B * B * 2 + 1;
    uint64_t want = row_target(o, layer, block) / tile;
    uint32_t max_cols = block + 1;
    uint32_t cols = (uint32_t)((want + 63) / 64);
    if (cols < 2)
        cols = 2;
    if (cols > max_cols)
        cols = max_cols;
    uint32_t heads = (uint32_t)(want / cols);
    if (heads < 1)
        heads = 1;
    if (heads > 64)
        heads = 64;
    uint32_t col[4096];
    uint64_t mask[4096];
    if (cols > 4096)
        cols = 4096;
    for (uint32_t c = 0; c < cols; c++) { /* sink 0 … diagonal `block`, evenly spread */
        col[c] = cols == 1 ? 0 : (uint32_t)((uint64_t)c * block / (cols - 1));
        if (c && col[c] <= col[c - 1])
            col[c] = col[c - 1] + 1;
        mask[c] = heads == 64 ? ~0ull : ((1ull << heads) - 1);
    }
    col[cols - 1] = block;
    mf_row_spec_t sp = {o->model, layer, block, B, heads, MF_CODEC_FP16, 0.95f,
                        cx->h[block], cx->h[block + 1], cx->tokens + (size_t)block * B};
    size_t need;
    const char *why = NULL;
    if (mf_row_size(&sp, cols, mask, &need) != MF_OK)
        return NULL;
    uint8_t *buf = aligned_alloc(64, (need + 63) & ~(size_t)63);
    mf_row_wview_t w;
    if (!buf || mf_row_init(buf, need, &sp, cols, col, mask, &w, &why) != MF_OK) {
        fprintf(stderr, "row: %s\n", why ? why : "out of memory");
        free(buf);
        return NULL;
    }
    uint64_t s = mix(o->seed ^ ((uint64_t)layer << 40) ^ ((uint64_t)block << 20) ^ 0x55);
    for (uint32_t e = 0; e < w.n_entries; e++) {
        s = mix(s);
        w.mass[e] = (uint8_t)(1 + s % 250);
    }
    /* fp16 values in [0, 1): exponent ≤ 14, any mantissa. */
    uint16_t *t = w.tiles;
    size_t nt = (size_t)w.n_entries * w.tile_bytes / 2;
    for (size_t i = 0; i < nt; i++) {
        if ((i & 3) == 0)
            s = mix(s);
        uint16_t v = (uint16_t)(s >> ((i & 3) * 16));
        t[i] = (uint16_t)(v & 0x3bff);
    }
    if (mf_row_seal(buf, w.size) != MF_OK) {
        free(buf);
        return NULL;
    }
    *len = w.size;
    return buf;
}

/* ==== a blocking frame client on the unix socket ======================================= */

static int write_all(int fd, const void *p, size_t n)
{
    const uint8_t *b = p;
    while (n) {
        ssize_t k = write(fd, b, n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return -1;
        b += k;
        n -= (size_t)k;
    }
    return 0;
}

static int read_all(int fd, void *p, size_t n)
{
    uint8_t *b = p;
    while (n) {
        ssize_t k = read(fd, b, n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return -1;
        b += k;
        n -= (size_t)k;
    }
    return 0;
}

static uint64_t g_rid;
static uint32_t g_layers[4096]; /* 0 .. layers-1: every command names layers from 0 */

/* Sends env (+ payload); returns the reply envelope and its frame (caller frees both). */
static mf_envelope_t *call(int fd, mf_envelope_t *env, const void *payload, size_t plen,
                           uint8_t **frame_out, mf_frame_t *f)
{
    env->request_id = ++g_rid;
    uint8_t *head;
    size_t hlen;
    if (mf_frame_encode_head(env, plen, 1u << 30, &head, &hlen) != MF_OK)
        return NULL;
    int bad = write_all(fd, head, hlen) || (plen && write_all(fd, payload, plen));
    free(head);
    uint8_t lenb[4];
    if (bad || read_all(fd, lenb, 4))
        return NULL;
    uint32_t flen = (uint32_t)lenb[0] | (uint32_t)lenb[1] << 8 | (uint32_t)lenb[2] << 16 |
                    (uint32_t)lenb[3] << 24;
    uint8_t *fr = aligned_alloc(64, ((size_t)flen + 4 + 63) & ~(size_t)63);
    if (!fr)
        return NULL;
    memcpy(fr, lenb, 4);
    size_t used;
    const char *why;
    mf_envelope_t *rep = NULL;
    if (read_all(fd, fr + 4, flen) || mf_frame_parse(fr, flen + 4, 1u << 30, f, &used, &why) ||
        mf_envelope_decode(f, &rep, &why)) {
        free(fr);
        return NULL;
    }
    *frame_out = fr;
    return rep;
}

static int connect_unix(const opts_t *o)
{
    struct sockaddr_un sun = {0};
    sun.sun_family = AF_UNIX;
    snprintf(sun.sun_path, sizeof(sun.sun_path), "%s", o->socket);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&sun, sizeof(sun)) != 0) {
        fprintf(stderr, "cannot connect to %s: %s\n", o->socket, strerror(errno));
        if (fd >= 0)
            close(fd);
        return -1;
    }
    Mapflow__V1__Hello h = MAPFLOW__V1__HELLO__INIT;
    h.protocol_version = MF_PROTOCOL_VERSION;
    h.namespace_ = (char *)o->ns;
    h.client_name = (char *)"mapflow-ucx-tool";
    mf_envelope_t e = MAPFLOW__V1__ENVELOPE__INIT;
    e.body_case = MAPFLOW__V1__ENVELOPE__BODY_HELLO;
    e.hello = &h;
    uint8_t *fr;
    mf_frame_t f;
    mf_envelope_t *r = call(fd, &e, NULL, 0, &fr, &f);
    int ok = r && r->body_case == MAPFLOW__V1__ENVELOPE__BODY_HELLO_REPLY;
    if (r) {
        mf_envelope_free(r);
        free(fr);
    }
    if (!ok) {
        fprintf(stderr, "Hello refused by %s\n", o->socket);
        close(fd);
        return -1;
    }
    return fd;
}

/* 1 (and prints it, and frees the reply) when r is an ErrorReply or missing. */
static int is_error(mf_envelope_t *r, uint8_t *frame, const char *what)
{
    if (!r) {
        printf("%s error=UNAVAILABLE message=connection lost\n", what);
        return 1;
    }
    if (r->body_case != MAPFLOW__V1__ENVELOPE__BODY_ERROR)
        return 0;
    printf("%s error=%s message=%s\n", what, mf_status_name((int)r->error->code),
           r->error->message);
    mf_envelope_free(r);
    free(frame);
    return 1;
}

/* ==== commands ========================================================================= */

static int cmd_put(const opts_t *o, const ctx_t *cx, int fd)
{
    size_t n = 0, bytes = 0;
    double t0 = now_s();
    for (uint32_t l = 0; l < o->layers; l++)
        for (uint32_t b = o->first_block; b < o->first_block + o->blocks; b++) {
            size_t len;
            uint8_t *row = row_make(o, cx, l, b, &len);
            if (!row)
                return 1;
            uint8_t hle[16];
            mf_hash_to_le(cx->h[b + 1], hle);
            Mapflow__V1__Key k = MAPFLOW__V1__KEY__INIT;
            k.model = (char *)o->model;
            k.layer = l;
            k.hash.data = hle;
            k.hash.len = 16;
            Mapflow__V1__PutBegin pb = MAPFLOW__V1__PUT_BEGIN__INIT;
            pb.key = &k;
            pb.size = len;
            mf_envelope_t e = MAPFLOW__V1__ENVELOPE__INIT;
            e.body_case = MAPFLOW__V1__ENVELOPE__BODY_PUT_BEGIN;
            e.put_begin = &pb;
            uint8_t *fr;
            mf_frame_t f;
            mf_envelope_t *r = call(fd, &e, NULL, 0, &fr, &f);
            if (is_error(r, fr, "put")) {
                free(row);
                return 1;
            }
            Mapflow__V1__PutCommit pc = MAPFLOW__V1__PUT_COMMIT__INIT;
            pc.reservation_id = r->put_begin_reply->reservation_id;
            mf_envelope_free(r);
            free(fr);
            e.body_case = MAPFLOW__V1__ENVELOPE__BODY_PUT_COMMIT;
            e.put_commit = &pc;
            r = call(fd, &e, row, len, &fr, &f);
            free(row);
            if (is_error(r, fr, "put"))
                return 1;
            mf_envelope_free(r);
            free(fr);
            n++;
            bytes += len;
        }
    printf("put rows=%zu bytes=%zu ms=%.1f\n", n, bytes, (now_s() - t0) * 1e3);
    return 0;
}

static int cmd_get(const opts_t *o, const ctx_t *cx, int fd)
{
    Mapflow__V1__Get g = MAPFLOW__V1__GET__INIT;
    g.model = (char *)o->model;
    g.block_size = B;
    g.n_layers = o->layers;
    g.layers = g_layers;
    g.first_block = o->first_block;
    g.n_blocks = o->blocks;
    g.peer = (char *)(o->peer ? o->peer : "");
    mf_envelope_t e = MAPFLOW__V1__ENVELOPE__INIT;
    e.body_case = MAPFLOW__V1__ENVELOPE__BODY_GET;
    e.get = &g;
    uint8_t *fr;
    mf_frame_t f;
    double t0 = now_s();
    mf_envelope_t *r = call(fd, &e, cx->tokens, cx->n_blocks * B * 4, &fr, &f);
    double ms = (now_s() - t0) * 1e3;
    if (is_error(r, fr, "get"))
        return 1;
    size_t cnt[MF_STATUS_COUNT] = {0}, identical = 0, host = 0, ssd = 0, bytes = 0;
    const Mapflow__V1__GetReply *rep = r->get_reply;
    for (size_t i = 0; i < rep->n_rows; i++) {
        const Mapflow__V1__RowRef *ref = rep->rows[i];
        cnt[ref->status < MF_STATUS_COUNT ? ref->status : MF_UNKNOWN]++;
        if (ref->status != MF_OK)
            continue;
        host += ref->tier == MAPFLOW__V1__TIER__TIER_HOST;
        ssd += ref->tier == MAPFLOW__V1__TIER__TIER_SSD;
        size_t len;
        uint8_t *want = row_make(o, cx, ref->layer, ref->block, &len);
        if (want && len == ref->length && ref->payload_offset + len <= f.payload_len &&
            memcmp(f.payload + ref->payload_offset, want, len) == 0)
            identical++;
        bytes += ref->length;
        free(want);
    }
    printf("get rows=%zu ok=%zu identical=%zu host=%zu ssd=%zu not_found=%zu unavailable=%zu "
           "unauthenticated=%zu data_loss=%zu other=%zu bytes=%zu ms=%.2f\n",
           rep->n_rows, cnt[MF_OK], identical, host, ssd, cnt[MF_NOT_FOUND],
           cnt[MF_UNAVAILABLE], cnt[MF_UNAUTHENTICATED], cnt[MF_DATA_LOSS],
           rep->n_rows - cnt[MF_OK] - cnt[MF_NOT_FOUND] - cnt[MF_UNAVAILABLE] -
               cnt[MF_UNAUTHENTICATED] - cnt[MF_DATA_LOSS],
           bytes, ms);
    mf_envelope_free(r);
    free(fr);
    return 0;
}

static int cmd_lookup(const opts_t *o, const ctx_t *cx, int fd)
{
    Mapflow__V1__Lookup lk = MAPFLOW__V1__LOOKUP__INIT;
    lk.model = (char *)o->model;
    lk.block_size = B;
    lk.n_layers = o->layers;
    lk.layers = g_layers;
    lk.peer = (char *)(o->peer ? o->peer : "");
    mf_envelope_t e = MAPFLOW__V1__ENVELOPE__INIT;
    e.body_case = MAPFLOW__V1__ENVELOPE__BODY_LOOKUP;
    e.lookup = &lk;
    uint8_t *fr;
    mf_frame_t f;
    mf_envelope_t *r = call(fd, &e, cx->tokens, cx->n_blocks * B * 4, &fr, &f);
    if (is_error(r, fr, "lookup"))
        return 1;
    printf("lookup total=%u blocks=", r->lookup_reply->total_blocks);
    for (size_t i = 0; i < r->lookup_reply->n_blocks; i++)
        printf("%s%u", i ? "," : "", r->lookup_reply->blocks[i]);
    printf("\n");
    mf_envelope_free(r);
    free(fr);
    return 0;
}

static int cmd_flush(int fd)
{
    Mapflow__V1__Flush fl = MAPFLOW__V1__FLUSH__INIT;
    mf_envelope_t e = MAPFLOW__V1__ENVELOPE__INIT;
    e.body_case = MAPFLOW__V1__ENVELOPE__BODY_FLUSH;
    e.flush = &fl;
    uint8_t *fr;
    mf_frame_t f;
    mf_envelope_t *r = call(fd, &e, NULL, 0, &fr, &f);
    if (is_error(r, fr, "flush"))
        return 1;
    printf("flush entries=%llu\n", (unsigned long long)r->flush_reply->entries);
    mf_envelope_free(r);
    free(fr);
    return 0;
}

/* ---- fetch: the standalone UCX client ------------------------------------------------- */

typedef struct fetch_state {
    struct event_base *base;
    int done;
} fetch_state_t;

static void on_fetched(void *arg)
{
    fetch_state_t *fs = arg;
    fs->done = 1;
    event_base_loopbreak(fs->base);
}

static int cmd_fetch(const opts_t *o, const ctx_t *cx)
{
    struct event_base *base = event_base_new();
    mfd_peers_t *ps = NULL;
    char err[256];
    if (!base ||
        mfd_peers_create_client(base, o->token, 1u << 30, &ps, err, sizeof(err)) != MF_OK) {
        fprintf(stderr, "fetch: %s\n", base ? err : "no event loop");
        return 3;
    }
    size_t n = (size_t)o->layers * o->blocks;
    mfd_peer_row_t *rows = calloc(n, sizeof(*rows));
    if (!rows)
        return 1;
    size_t total = 0, i = 0;
    for (uint32_t l = 0; l < o->layers; l++)
        for (uint32_t b = o->first_block; b < o->first_block + o->blocks; b++, i++) {
            rows[i].layer = l;
            mf_hash_to_le(cx->h[b + 1], rows[i].hash);
            rows[i].cap = row_target(o, l, b) + (1u << 20);
            rows[i].dst = aligned_alloc(64, (rows[i].cap + 63) & ~(uint64_t)63);
            if (!rows[i].dst)
                return 1;
            memset(rows[i].dst, 0, rows[i].cap); /* first touch outside the timing */
        }
    double best = 1e30, sum = 0;
    int rc = 0;
    size_t ok = 0, identical = 0;
    for (uint32_t it = 0; it < o->iters + 1 && rc == 0; it++) { /* iteration 0: warm-up */
        fetch_state_t fs = {base, 0};
        double t0 = now_s();
        if (mfd_peers_fetch(ps, o->ucx, o->ns, o->model, rows, n, on_fetched, &fs) != MF_OK) {
            rc = 3;
            break;
        }
        while (!fs.done)
            event_base_dispatch(base);
        double dt = now_s() - t0;
        total = ok = 0;
        for (i = 0; i < n; i++) {
            ok += rows[i].status == MF_OK;
            total += rows[i].len;
        }
        if (ok != n) {
            fprintf(stderr, "fetch: %zu of %zu rows failed (first: %s)\n", n - ok, n,
                    mf_status_name(rows[0].status));
            rc = 1;
        }
        if (it == 0) {
            i = 0;
            for (uint32_t l = 0; l < o->layers; l++)
                for (uint32_t b = o->first_block; b < o->first_block + o->blocks; b++, i++) {
                    size_t len;
                    uint8_t *want = row_make(o, cx, l, b, &len);
                    identical += want && len == rows[i].len &&
                                 memcmp(want, rows[i].dst, len) == 0;
                    free(want);
                }
            continue;
        }
        sum += dt;
        if (dt < best)
            best = dt;
    }
    if (rc == 0)
        printf("fetch rows=%zu ok=%zu identical=%zu row_bytes=%zu iters=%u best_ms=%.3f "
               "mean_ms=%.3f best_gbps=%.3f mean_gbps=%.3f\n",
               n, ok, identical, n ? total / n : 0, o->iters, best * 1e3,
               sum / o->iters * 1e3, (double)total / best / 1e9,
               (double)total * o->iters / sum / 1e9);
    mfd_peers_destroy(ps);
    for (i = 0; i < n; i++)
        free(rows[i].dst);
    free(rows);
    event_base_free(base);
    return rc;
}

/* ==== main ============================================================================= */

static int usage(void)
{
    fprintf(stderr,
            "usage: mapflow-ucx-tool put|get|lookup|flush --socket PATH [options]\n"
            "       mapflow-ucx-tool fetch --ucx HOST:PORT [--token T] [--iters N] [options]\n"
            "options: --ns N --model M --seed X --layers L --first-block F --blocks N\n"
            "         --size BYTES [--vary] [--peer HOST:PORT]\n");
    return 2;
}

int main(int argc, char **argv)
{
    opts_t o = {0};
    o.ns = "t";
    o.model = "m";
    o.seed = 1;
    o.layers = 1;
    o.blocks = 1;
    o.size = 65536;
    o.iters = 5;
    if (argc < 2)
        return usage();
    o.cmd = argv[1];
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--vary")) {
            o.vary = 1;
            continue;
        }
        if (!v)
            return usage();
        i++;
        if (!strcmp(a, "--socket"))
            o.socket = v;
        else if (!strcmp(a, "--ns"))
            o.ns = v;
        else if (!strcmp(a, "--model"))
            o.model = v;
        else if (!strcmp(a, "--peer"))
            o.peer = v;
        else if (!strcmp(a, "--ucx"))
            o.ucx = v;
        else if (!strcmp(a, "--token"))
            o.token = v;
        else if (!strcmp(a, "--seed"))
            o.seed = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--size"))
            o.size = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--layers"))
            o.layers = (uint32_t)strtoul(v, NULL, 10);
        else if (!strcmp(a, "--first-block"))
            o.first_block = (uint32_t)strtoul(v, NULL, 10);
        else if (!strcmp(a, "--blocks"))
            o.blocks = (uint32_t)strtoul(v, NULL, 10);
        else if (!strcmp(a, "--iters"))
            o.iters = (uint32_t)strtoul(v, NULL, 10);
        else
            return usage();
    }
    if (!o.layers || !o.blocks || o.layers > 4096 || o.blocks > 4096 || !o.size ||
        o.size > (1ull << 31) || !o.iters)
        return usage();
    for (uint32_t l = 0; l < o.layers; l++)
        g_layers[l] = l;
    ctx_t cx;
    if (ctx_init(&cx, &o) != 0)
        return 1;
    int rc;
    if (!strcmp(o.cmd, "fetch")) {
        if (!o.ucx)
            return usage();
        rc = cmd_fetch(&o, &cx);
    } else {
        if (!o.socket)
            return usage();
        int fd = connect_unix(&o);
        if (fd < 0)
            return 3;
        if (!strcmp(o.cmd, "put"))
            rc = cmd_put(&o, &cx, fd);
        else if (!strcmp(o.cmd, "get"))
            rc = cmd_get(&o, &cx, fd);
        else if (!strcmp(o.cmd, "lookup"))
            rc = cmd_lookup(&o, &cx, fd);
        else if (!strcmp(o.cmd, "flush"))
            rc = cmd_flush(fd);
        else
            rc = usage();
        close(fd);
    }
    free(cx.tokens);
    free(cx.h);
    return rc;
}
