/*
 * libmapflow against a scripted fake daemon (a thread on a unix socket in a temp dir):
 * framing, Hello with the arena fd over SCM_RIGHTS, both put paths, token payloads,
 * copy and lease gets with client-side verification, ErrorReply → status + message,
 * deadlines with stale replies dropped, stray replies (unknown ids, id 0, duplicates)
 * ignored, a malformed reply (then a reconnect), and concurrent callers.
 */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cmocka.h>

#include "mf_frame.h"
#include "test_client_util.h"

#define ARENA_BYTES (1u << 20)
#define NS "tenant-a"
#define MODEL "src-7b"
#define B 16

/* ==== fake daemon ==================================================================== */

typedef struct fake {
    char dir[48], path[100];
    int lfd, cfd, memfd;
    uint8_t *arena;
    pthread_t th;
    /* behaviour */
    int in_arena;          /* PutBeginReply.in_arena when the client holds the arena */
    int hold_flush;        /* do not answer Flush until the next request arrives */
    int garbage_on_stats;  /* answer Stats with a malformed frame */
    int strays;            /* around each HealthReply: replies nobody asked for */
    /* what it saw */
    char ns[200], token[64];
    int want_arena;
    uint8_t *row;          /* last committed row */
    size_t row_len;
    uint64_t row_off;      /* where the committed row sits in the arena */
    int put_begins, commits_ok, accepted;
    uint32_t tokens[1024];
    size_t n_tokens;
    uint64_t released;
} fake_t;

static void send_env(fake_t *f, mf_envelope_t *env, const void *payload, size_t len, int fd)
{
    assert_int_equal(tc_send_frame(f->cfd, env, payload, len, fd), MF_OK);
}

static void reply_error(fake_t *f, uint64_t id, mf_status_t code, const char *msg)
{
    Mapflow__V1__ErrorReply e = MAPFLOW__V1__ERROR_REPLY__INIT;
    e.code = code;
    e.message = (char *)msg;
    mf_envelope_t r = MAPFLOW__V1__ENVELOPE__INIT;
    r.request_id = id;
    r.body_case = MAPFLOW__V1__ENVELOPE__BODY_ERROR;
    r.error = &e;
    send_env(f, &r, NULL, 0, -1);
}

/* A GetReply with the stored row for every requested row whose block/key matches. */
static void reply_get(fake_t *f, const mf_envelope_t *q)
{
    const Mapflow__V1__Get *g = q->get;
    size_t n = g->n_keys ? g->n_keys : g->n_layers * g->n_blocks;
    Mapflow__V1__RowRef *rr = calloc(n, sizeof(*rr));
    Mapflow__V1__RowRef **rp = calloc(n, sizeof(*rp));
    mf_row_view_t v;
    int have = f->row && mf_row_decode(f->row, f->row_len, 0, &v, NULL) == MF_OK;
    size_t pay = 0;
    uint8_t *payload = calloc(n, (f->row_len + 15) & ~(size_t)15);
    for (size_t i = 0; i < n; i++) {
        mapflow__v1__row_ref__init(&rr[i]);
        rp[i] = &rr[i];
        uint32_t layer = g->n_keys ? g->keys[i]->layer : g->layers[i / g->n_blocks];
        uint32_t block = g->n_keys ? 0 : g->first_block + (uint32_t)(i % g->n_blocks);
        rr[i].layer = layer;
        rr[i].block = block;
        int hit = have && layer == v.layer && (g->n_keys ? 1 : block >= v.block_index);
        if (!hit) {
            rr[i].status = MF_NOT_FOUND;
            continue;
        }
        /* For prefix gets every block >= the stored one answers with the stored row: the
         * client must notice the wrong block / tokens and refuse it. */
        rr[i].status = MF_OK;
        rr[i].tier = MAPFLOW__V1__TIER__TIER_HOST;
        rr[i].length = f->row_len;
        if (g->mode == MAPFLOW__V1__GET_MODE__GET_LEASE) {
            memcpy(f->arena + f->row_off, f->row, f->row_len);
            rr[i].arena_offset = f->row_off;
            rr[i].lease_id = 100 + i;
        } else {
            rr[i].payload_offset = pay;
            memcpy(payload + pay, f->row, f->row_len);
            pay += (f->row_len + 15) & ~(size_t)15;
        }
    }
    Mapflow__V1__GetReply gr = MAPFLOW__V1__GET_REPLY__INIT;
    gr.n_rows = n;
    gr.rows = rp;
    gr.lease_ttl_ms = 5000;
    mf_envelope_t r = MAPFLOW__V1__ENVELOPE__INIT;
    r.request_id = q->request_id;
    r.body_case = MAPFLOW__V1__ENVELOPE__BODY_GET_REPLY;
    r.get_reply = &gr;
    send_env(f, &r, payload, pay, -1);
    free(payload);
    free(rp);
    free(rr);
}

/* Answers one request; returns 0 to stop. */
static int serve_one(fake_t *f, const mf_envelope_t *q, const mf_frame_t *fr,
                     uint64_t *held_flush)
{
    mf_envelope_t r = MAPFLOW__V1__ENVELOPE__INIT;
    r.request_id = q->request_id;
    if (*held_flush) { /* the late reply to a call that gave up */
        Mapflow__V1__FlushReply fl = MAPFLOW__V1__FLUSH_REPLY__INIT;
        fl.entries = 999;
        mf_envelope_t late = MAPFLOW__V1__ENVELOPE__INIT;
        late.request_id = *held_flush;
        late.body_case = MAPFLOW__V1__ENVELOPE__BODY_FLUSH_REPLY;
        late.flush_reply = &fl;
        send_env(f, &late, NULL, 0, -1);
        *held_flush = 0;
    }
    switch (q->body_case) {
    case MAPFLOW__V1__ENVELOPE__BODY_HELLO: {
        snprintf(f->ns, sizeof(f->ns), "%s", q->hello->namespace_);
        snprintf(f->token, sizeof(f->token), "%s", q->hello->token);
        f->want_arena = q->hello->want_host_arena;
        Mapflow__V1__HelloReply h = MAPFLOW__V1__HELLO_REPLY__INIT;
        h.protocol_version = 1;
        h.daemon_version = "fake-1";
        h.session_id = 42;
        h.max_frame = MF_FRAME_DEFAULT_MAX;
        h.max_batch = 4096;
        h.host_arena_fd = f->want_arena;
        h.host_arena_bytes = f->want_arena ? ARENA_BYTES : 0;
        r.body_case = MAPFLOW__V1__ENVELOPE__BODY_HELLO_REPLY;
        r.hello_reply = &h;
        send_env(f, &r, NULL, 0, f->want_arena ? f->memfd : -1);
        return 1;
    }
    case MAPFLOW__V1__ENVELOPE__BODY_PUT_BEGIN: {
        f->put_begins++;
        free(f->row);
        f->row_len = q->put_begin->size;
        f->row = aligned_alloc(16, (f->row_len + 15) & ~(size_t)15);
        Mapflow__V1__PutBeginReply p = MAPFLOW__V1__PUT_BEGIN_REPLY__INIT;
        p.reservation_id = 7;
        p.in_arena = f->want_arena && f->in_arena;
        p.arena_offset = f->row_off = 4096;
        r.body_case = MAPFLOW__V1__ENVELOPE__BODY_PUT_BEGIN_REPLY;
        r.put_begin_reply = &p;
        send_env(f, &r, NULL, 0, -1);
        return 1;
    }
    case MAPFLOW__V1__ENVELOPE__BODY_PUT_COMMIT: {
        const uint8_t *src = fr->payload_len ? fr->payload : f->arena + f->row_off;
        if (fr->payload_len && fr->payload_len != f->row_len) {
            reply_error(f, q->request_id, MF_INVALID_ARGUMENT, "payload length != size");
            return 1;
        }
        memcpy(f->row, src, f->row_len);
        const char *why;
        mf_row_view_t v;
        mf_status_t st = mf_row_decode(f->row, f->row_len, 0, &v, &why);
        if (st != MF_OK) {
            reply_error(f, q->request_id, st, why);
            return 1;
        }
        f->commits_ok++;
        Mapflow__V1__PutCommitReply c = MAPFLOW__V1__PUT_COMMIT_REPLY__INIT;
        c.tier = MAPFLOW__V1__TIER__TIER_HOST;
        r.body_case = MAPFLOW__V1__ENVELOPE__BODY_PUT_COMMIT_REPLY;
        r.put_commit_reply = &c;
        send_env(f, &r, NULL, 0, -1);
        return 1;
    }
    case MAPFLOW__V1__ENVELOPE__BODY_LOOKUP: {
        f->n_tokens = fr->payload_len / 4;
        if (f->n_tokens > 1024)
            f->n_tokens = 1024;
        memcpy(f->tokens, fr->payload, f->n_tokens * 4);
        uint32_t bl[16] = {0};
        size_t nl = q->lookup->n_layers < 16 ? q->lookup->n_layers : 16;
        for (size_t i = 0; i < nl; i++)
            bl[i] = q->lookup->layers[i] * 2 % 5; /* something the client must copy */
        Mapflow__V1__LookupReply l = MAPFLOW__V1__LOOKUP_REPLY__INIT;
        l.n_blocks = nl;
        l.blocks = bl;
        l.total_blocks = (uint32_t)(f->n_tokens / q->lookup->block_size);
        r.body_case = MAPFLOW__V1__ENVELOPE__BODY_LOOKUP_REPLY;
        r.lookup_reply = &l;
        send_env(f, &r, NULL, 0, -1);
        return 1;
    }
    case MAPFLOW__V1__ENVELOPE__BODY_GET:
        reply_get(f, q);
        return 1;
    case MAPFLOW__V1__ENVELOPE__BODY_RELEASE: {
        f->released += q->release->n_lease_ids;
        Mapflow__V1__ReleaseReply rl = MAPFLOW__V1__RELEASE_REPLY__INIT;
        rl.released = (uint32_t)q->release->n_lease_ids;
        r.body_case = MAPFLOW__V1__ENVELOPE__BODY_RELEASE_REPLY;
        r.release_reply = &rl;
        send_env(f, &r, NULL, 0, -1);
        return 1;
    }
    case MAPFLOW__V1__ENVELOPE__BODY_FLUSH:
        if (f->hold_flush) {
            *held_flush = q->request_id;
            return 1;
        }
        reply_error(f, q->request_id, MF_UNIMPLEMENTED, "no flush here");
        return 1;
    case MAPFLOW__V1__ENVELOPE__BODY_STATS: {
        if (f->garbage_on_stats) {
            uint8_t junk[12] = {8, 0, 0, 0, 4, 0, 0, 0, 0xff, 0xff, 0xff, 0xff};
            ssize_t w = write(f->cfd, junk, sizeof(junk));
            (void)w;
            return 1;
        }
        Mapflow__V1__Counter c1 = MAPFLOW__V1__COUNTER__INIT, c2 = MAPFLOW__V1__COUNTER__INIT;
        c1.name = "puts_total";
        c1.value = (uint64_t)f->commits_ok;
        c2.name = "lookups_total";
        c2.value = 17;
        Mapflow__V1__Counter *cs[2] = {&c1, &c2};
        Mapflow__V1__TierStats t = MAPFLOW__V1__TIER_STATS__INIT;
        t.tier = MAPFLOW__V1__TIER__TIER_HOST;
        t.enabled = 1;
        t.capacity_bytes = ARENA_BYTES;
        t.used_bytes = f->row_len;
        Mapflow__V1__TierStats *ts[1] = {&t};
        Mapflow__V1__StatsReply s = MAPFLOW__V1__STATS_REPLY__INIT;
        s.n_counters = 2;
        s.counters = cs;
        s.n_tiers = 1;
        s.tiers = ts;
        s.uptime_ms = 1234;
        r.body_case = MAPFLOW__V1__ENVELOPE__BODY_STATS_REPLY;
        r.stats_reply = &s;
        send_env(f, &r, NULL, 0, -1);
        return 1;
    }
    case MAPFLOW__V1__ENVELOPE__BODY_HEALTH: {
        Mapflow__V1__HealthReply h = MAPFLOW__V1__HEALTH_REPLY__INIT;
        h.ok = 1;
        h.ready = 1;
        h.status = "serving";
        r.body_case = MAPFLOW__V1__ENVELOPE__BODY_HEALTH_REPLY;
        r.health_reply = &h;
        if (f->strays) { /* before: ids never sent, an error to id 0, a wrong-typed one */
            mf_envelope_t s = r;
            s.request_id = q->request_id + 1000 + (uint64_t)f->strays * 7;
            h.status = "stray";
            send_env(f, &s, NULL, 0, -1);
            reply_error(f, 0, MF_INTERNAL, "an error nobody asked for");
            reply_error(f, q->request_id + 1, MF_DATA_LOSS, "an error to an id not sent yet");
            h.status = "serving";
        }
        send_env(f, &r, NULL, 0, -1);
        if (f->strays) { /* after: the same reply again (a duplicate) */
            h.status = "duplicate";
            send_env(f, &r, NULL, 0, -1);
        }
        return 1;
    }
    case MAPFLOW__V1__ENVELOPE__BODY_CONFIG_GET:
        reply_error(f, q->request_id, MF_NOT_FOUND, "no such config key");
        return 1;
    default:
        reply_error(f, q->request_id, MF_UNIMPLEMENTED, "fake");
        return 1;
    }
}

/* Serves one connection until the client closes it. */
static void fake_serve(fake_t *f)
{
    mf_frame_reader_t rd;
    mf_frame_reader_init(&rd, MF_FRAME_DEFAULT_MAX);
    uint64_t held = 0;
    for (;;) {
        mf_frame_t fr;
        int have;
        if (mf_frame_reader_next(&rd, &fr, &have, NULL) != MF_OK)
            break;
        if (!have) {
            uint8_t *p;
            size_t avail;
            mf_frame_reader_space(&rd, 65536, &p, &avail);
            ssize_t n = read(f->cfd, p, avail);
            if (n <= 0)
                break;
            mf_frame_reader_commit(&rd, (size_t)n);
            continue;
        }
        mf_envelope_t *q;
        if (mf_envelope_decode(&fr, &q, NULL) != MF_OK)
            break;
        int go = serve_one(f, q, &fr, &held);
        mf_envelope_free(q);
        if (!go)
            break;
    }
    mf_frame_reader_deinit(&rd);
    close(f->cfd);
}

/* Connections one after another (a reconnect is a second one) until teardown. */
static void *fake_main(void *arg)
{
    fake_t *f = arg;
    while ((f->cfd = accept(f->lfd, NULL, NULL)) >= 0) {
        f->accepted++;
        fake_serve(f);
    }
    return NULL;
}

static int fake_setup(void **state)
{
    fake_t *f = calloc(1, sizeof(*f));
    snprintf(f->dir, sizeof(f->dir), "/tmp/mfclient-XXXXXX");
    if (!mkdtemp(f->dir))
        return -1;
    snprintf(f->path, sizeof(f->path), "%s/fake.sock", f->dir);
    f->lfd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", f->path);
    if (bind(f->lfd, (struct sockaddr *)&sa, sizeof(sa)) || listen(f->lfd, 4))
        return -1;
    f->memfd = memfd_create("fake-arena", MFD_CLOEXEC);
    if (f->memfd < 0 || ftruncate(f->memfd, ARENA_BYTES))
        return -1;
    f->arena = mmap(NULL, ARENA_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, f->memfd, 0);
    f->in_arena = 1;
    pthread_create(&f->th, NULL, fake_main, f);
    *state = f;
    return 0;
}

static int fake_teardown(void **state)
{
    fake_t *f = *state;
    shutdown(f->lfd, SHUT_RDWR);
    pthread_join(f->th, NULL);
    close(f->lfd);
    close(f->memfd);
    munmap(f->arena, ARENA_BYTES);
    unlink(f->path);
    rmdir(f->dir);
    free(f->row);
    free(f);
    return 0;
}

static mf_channel_t *open_fake(fake_t *f, int want_arena, int64_t timeout_ms)
{
    char target[160];
    snprintf(target, sizeof(target), "unix:%s", f->path);
    mf_channel_params_t p = {
        .field_mask = MF_CHANNEL_PARAM_NS | MF_CHANNEL_PARAM_WANT_ARENA |
                      MF_CHANNEL_PARAM_TIMEOUT_MS | MF_CHANNEL_PARAM_TOKEN,
        .ns = NS, .want_arena = want_arena, .timeout_ms = timeout_ms, .token = "tok-1"};
    mf_channel_t *ch = NULL;
    mf_status_t st = mf_channel_open(target, &p, &ch);
    if (st != MF_OK)
        fail_msg("open: %s: %s", mf_status_name(st), mf_channel_last_error(ch));
    return ch;
}

/* ==== tests ========================================================================== */

static void test_open_errors(void **state)
{
    (void)state;
    mf_channel_t *ch = NULL;
    assert_int_equal(mf_channel_open("tcp:no-port", NULL, &ch), MF_INVALID_ARGUMENT);
    assert_non_null(strstr(mf_channel_last_error(ch), "HOST:PORT"));
    mf_channel_close(ch);
    assert_int_equal(mf_channel_open("unix:/nonexistent-dir/x.sock", NULL, &ch), MF_UNAVAILABLE);
    assert_non_null(strstr(mf_channel_last_error(ch), "/nonexistent-dir/x.sock"));
    /* Calls on a channel that never connected fail cleanly. */
    mf_health_t h;
    assert_int_equal(mf_health(ch, &h, MF_TIMEOUT_DEFAULT), MF_UNAVAILABLE);
    mf_channel_close(ch);
    char big[200];
    memset(big, 'n', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    mf_channel_params_t p = {.field_mask = MF_CHANNEL_PARAM_NS, .ns = big};
    assert_int_equal(mf_channel_open("unix:/tmp/x", &p, &ch), MF_INVALID_ARGUMENT);
    mf_channel_close(ch);
}

static void put_one(fake_t *f, int want_arena, int in_arena)
{
    f->in_arena = in_arena;
    mf_channel_t *ch = open_fake(f, want_arena, 5000);
    assert_int_equal(mf_channel_has_arena(ch), want_arena);
    mf_server_info_t info;
    mf_channel_info(ch, &info);
    assert_string_equal(info.daemon_version, "fake-1");
    assert_int_equal(info.session_id, 42);
    assert_int_equal(info.host_arena_bytes, want_arena ? ARENA_BYTES : 0);
    assert_string_equal(f->ns, NS);
    assert_string_equal(f->token, "tok-1");

    uint32_t tokens[4 * B];
    tc_tokens(tokens, 4 * B, 11 + (uint64_t)in_arena);
    size_t len;
    uint8_t *row = tc_make_row(NS, MODEL, 3, B, 8, tokens, 2, MF_CODEC_FP16, 5, &len);
    assert_non_null(row);
    mf_put_result_t res = {0};
    mf_status_t st = mf_put(ch, row, len, MF_PUT_DURABLE, &res, MF_TIMEOUT_DEFAULT);
    assert_int_equal(st, MF_OK);
    assert_int_equal(res.tier, MF_TIER_HOST);
    assert_int_equal(f->commits_ok, 1);
    assert_int_equal(f->row_len, len);
    assert_memory_equal(f->row, row, len);
    if (want_arena && in_arena) /* the bytes went through the shared arena */
        assert_memory_equal(f->arena + 4096, row, len);

    /* A corrupted row never leaves the client. */
    row[len / 2] ^= 0x5a;
    st = mf_put(ch, row, len, 0, NULL, MF_TIMEOUT_DEFAULT);
    assert_true(st == MF_DATA_LOSS || st == MF_INVALID_ARGUMENT);
    assert_non_null(strstr(mf_channel_last_error(ch), "rejected before sending"));
    assert_int_equal(f->put_begins, 1);
    free(row);
    mf_channel_close(ch);
}

static void test_put_in_arena(void **state)
{
    put_one(*state, 1, 1);
}

static void test_put_payload(void **state)
{
    put_one(*state, 0, 0);
}

static void test_lookup_sends_full_blocks(void **state)
{
    fake_t *f = *state;
    mf_channel_t *ch = open_fake(f, 0, 5000);
    uint32_t tokens[3 * B + 5], layers[4] = {0, 3, 4, 9}, blocks[4], total = 0;
    tc_tokens(tokens, 3 * B + 5, 99);
    assert_int_equal(mf_lookup(ch, MODEL, B, tokens, 3 * B + 5, layers, 4, blocks, &total,
                               MF_TIMEOUT_DEFAULT), MF_OK);
    assert_int_equal(f->n_tokens, 3 * B); /* the partial block is not sent */
    assert_memory_equal(f->tokens, tokens, 3 * B * 4);
    assert_int_equal(total, 3);
    for (int i = 0; i < 4; i++)
        assert_int_equal(blocks[i], layers[i] * 2 % 5);
    assert_int_equal(mf_lookup(ch, "", B, tokens, 10, layers, 4, blocks, NULL,
                               MF_TIMEOUT_DEFAULT), MF_INVALID_ARGUMENT);
    mf_channel_close(ch);
}

/* mf_get_result_columns of r equals its rows (data and length 0 unless OK); a cap one
 * short, no result or no columns: INVALID_ARGUMENT with nothing written; NULL columns
 * are skipped. */
static void check_columns(const mf_get_result_t *r)
{
    size_t n = r->n_rows;
    int32_t *st = malloc(n * 4), *tier = malloc(n * 4);
    uint32_t *layer = malloc(n * 4), *block = malloc(n * 4), *arena = malloc(n * 4);
    uint64_t *data = malloc(n * 8), *len = malloc(n * 8), *lease = malloc(n * 8);
    uint8_t *dev = malloc(n);
    memset(data, 0xa5, n * 8);
    mf_row_columns_t c = {n - 1, st, layer, block, tier, data, len, lease, dev, arena};
    assert_int_equal(mf_get_result_columns(r, &c), MF_INVALID_ARGUMENT);
    for (size_t i = 0; i < n; i++)
        assert_true(data[i] == 0xa5a5a5a5a5a5a5a5ull);
    assert_int_equal(mf_get_result_columns(NULL, &c), MF_INVALID_ARGUMENT);
    assert_int_equal(mf_get_result_columns(r, NULL), MF_INVALID_ARGUMENT);
    c.cap = n;
    c.lease_id = NULL; /* not asked for: not written */
    assert_int_equal(mf_get_result_columns(r, &c), MF_OK);
    for (size_t i = 0; i < n; i++) {
        const mf_row_ref_t *x = &r->rows[i];
        int ok = x->status == MF_OK;
        assert_int_equal(st[i], x->status);
        assert_int_equal(layer[i], x->layer);
        assert_int_equal(block[i], x->block);
        assert_int_equal(tier[i], x->tier);
        assert_true(data[i] == (ok ? (uint64_t)(uintptr_t)x->data : 0));
        assert_true(len[i] == (ok ? x->length : 0));
        assert_int_equal(dev[i], x->on_device);
        assert_int_equal(arena[i], x->gpu_arena);
    }
    c.lease_id = lease;
    assert_int_equal(mf_get_result_columns(r, &c), MF_OK);
    for (size_t i = 0; i < n; i++)
        assert_true(lease[i] == r->rows[i].lease_id);
    free(st);
    free(tier);
    free(layer);
    free(block);
    free(arena);
    free(data);
    free(len);
    free(lease);
    free(dev);
}

static void get_prefix(fake_t *f, mf_get_mode_t mode)
{
    mf_channel_t *ch = open_fake(f, mode == MF_GET_LEASE, 5000);
    uint32_t tokens[4 * B];
    tc_tokens(tokens, 4 * B, 1234);
    size_t len;
    uint8_t *row = tc_make_row(NS, MODEL, 5, B, 4, tokens, 1, MF_CODEC_MASK, 77, &len);
    assert_int_equal(mf_put(ch, row, len, 0, NULL, MF_TIMEOUT_DEFAULT), MF_OK);

    uint32_t layers[2] = {5, 6};
    mf_get_result_t *r = NULL;
    assert_int_equal(mf_get_prefix(ch, MODEL, B, tokens, 4 * B, layers, 2, 0, 3, mode, &r,
                                   MF_TIMEOUT_DEFAULT), MF_OK);
    assert_int_equal(r->n_rows, 6);
    /* layer 5: block 0 missing, block 1 = the stored row, block 2 gets the block-1 row
     * back from the (lying) fake and must be refused; layer 6 missing everywhere. */
    assert_int_equal(r->rows[0].status, MF_NOT_FOUND);
    assert_int_equal(r->rows[1].status, MF_OK);
    assert_int_equal(r->rows[1].length, len);
    assert_memory_equal(r->rows[1].data, row, len);
    assert_int_equal(r->rows[1].view.block_index, 1);
    assert_memory_equal(r->rows[1].view.tokens, tokens + B, B * 4);
    assert_int_equal(r->rows[2].status, MF_DATA_LOSS);
    assert_null(r->rows[2].data);
    for (int i = 3; i < 6; i++)
        assert_int_equal(r->rows[i].status, MF_NOT_FOUND);
    check_columns(r);
    if (mode == MF_GET_LEASE) {
        /* Zero copy: the view is the arena itself. */
        assert_ptr_not_equal(r->rows[1].data, NULL);
        assert_int_equal(r->rows[1].lease_id, 101);
        assert_int_equal(mf_release_result(ch, r, MF_TIMEOUT_DEFAULT), MF_OK);
        assert_int_equal(f->released, 2); /* row 1 and the refused row 2 */
        assert_int_equal(r->rows[1].lease_id, 0);
        check_columns(r); /* lease ids now 0 */
    }
    mf_get_result_free(r);

    /* By key, into a caller buffer; too small a buffer says how much is needed. */
    mf_key_t k = {MODEL, 5, {0, 0}};
    mf_row_view_t v;
    assert_int_equal(mf_row_decode(row, len, 0, &v, NULL), MF_OK);
    k.hash = v.hash;
    uint8_t *buf = aligned_alloc(16, (len + 15) & ~(size_t)15);
    size_t got = 0;
    assert_int_equal(mf_get(ch, &k, buf, len - 1, &got, MF_TIMEOUT_DEFAULT),
                     MF_RESOURCE_EXHAUSTED);
    assert_int_equal(got, len);
    assert_int_equal(mf_get(ch, &k, buf, len, &got, MF_TIMEOUT_DEFAULT), MF_OK);
    assert_memory_equal(buf, row, len);
    /* A key the returned row does not carry is DATA_LOSS, never wrong bytes. */
    k.hash.lo ^= 1;
    assert_int_equal(mf_get(ch, &k, buf, len, &got, MF_TIMEOUT_DEFAULT), MF_DATA_LOSS);
    free(buf);
    free(row);
    mf_channel_close(ch);
}

static void test_get_prefix_copy(void **state)
{
    get_prefix(*state, MF_GET_COPY);
}

static void test_get_prefix_lease(void **state)
{
    get_prefix(*state, MF_GET_LEASE);
}

static void test_lease_needs_arena(void **state)
{
    mf_channel_t *ch = open_fake(*state, 0, 5000);
    mf_key_t k = {MODEL, 1, {1, 2}};
    mf_lease_t l;
    assert_int_equal(mf_get_lease(ch, &k, &l, MF_TIMEOUT_DEFAULT), MF_FAILED_PRECONDITION);
    assert_non_null(strstr(mf_channel_last_error(ch), "arena"));
    mf_channel_close(ch);
}

static void test_error_reply_and_stats(void **state)
{
    mf_channel_t *ch = open_fake(*state, 0, 5000);
    mf_config_item_t *it;
    size_t n;
    assert_int_equal(mf_config_get(ch, "nope", &it, &n, MF_TIMEOUT_DEFAULT), MF_NOT_FOUND);
    assert_non_null(strstr(mf_channel_last_error(ch), "no such config key"));
    mf_stats_t *s;
    assert_int_equal(mf_stats(ch, &s, MF_TIMEOUT_DEFAULT), MF_OK);
    assert_int_equal(mf_stats_counter(s, "lookups_total", NULL), 17);
    int found = 1;
    assert_int_equal(mf_stats_counter(s, "missing_total", &found), 0);
    assert_int_equal(found, 0);
    assert_int_equal(s->n_tiers, 1);
    assert_int_equal(s->tiers[0].capacity_bytes, ARENA_BYTES);
    assert_int_equal(s->uptime_ms, 1234);
    mf_stats_free(s);
    mf_channel_close(ch);
}

static void test_deadline_then_stale_reply_dropped(void **state)
{
    fake_t *f = *state;
    f->hold_flush = 1;
    mf_channel_t *ch = open_fake(f, 0, 5000);
    uint64_t n = 0;
    assert_int_equal(mf_flush(ch, &n, 100), MF_DEADLINE_EXCEEDED);
    assert_non_null(strstr(mf_channel_last_error(ch), "deadline"));
    /* The fake now sends the late FlushReply first; health must skip it. */
    mf_health_t h;
    assert_int_equal(mf_health(ch, &h, MF_TIMEOUT_DEFAULT), MF_OK);
    assert_true(h.ok);
    assert_string_equal(h.status, "serving");
    mf_channel_close(ch);
}

/* Replies to ids nobody waits for (never sent, 0, answered already) are dropped, the
 * right one is taken, and the connection stays up. */
static void test_stray_replies_ignored(void **state)
{
    fake_t *f = *state;
    f->strays = 1;
    mf_channel_t *ch = open_fake(f, 0, 5000);
    for (int i = 0; i < 20; i++) {
        mf_health_t h;
        assert_int_equal(mf_health(ch, &h, MF_TIMEOUT_DEFAULT), MF_OK);
        assert_string_equal(h.status, "serving");
        f->strays = 1 + i;
    }
    mf_server_info_t info;
    mf_channel_info(ch, &info);
    assert_int_equal(info.reconnects, 0);
    assert_true(info.connected);
    assert_int_equal(info.in_flight, 0);
    mf_channel_close(ch);
}

/* A malformed reply fails the call with INTERNAL (not retried: a retry would not fix
 * it) and drops the connection; the next call reconnects on its own. */
static void test_malformed_reply_reconnects(void **state)
{
    fake_t *f = *state;
    f->garbage_on_stats = 1;
    mf_channel_t *ch = open_fake(f, 0, 5000);
    mf_stats_t *s = NULL;
    assert_int_equal(mf_stats(ch, &s, MF_TIMEOUT_DEFAULT), MF_INTERNAL);
    assert_non_null(strstr(mf_channel_last_error(ch), "undecodable reply"));
    assert_null(s);
    mf_health_t h;
    assert_int_equal(mf_health(ch, &h, MF_TIMEOUT_DEFAULT), MF_OK);
    assert_true(h.ok);
    mf_server_info_t info;
    mf_channel_info(ch, &info);
    assert_int_equal(info.reconnects, 1);
    assert_int_equal(f->accepted, 2);
    assert_string_equal(f->ns, NS); /* the Hello of the reconnect carried the same params */
    assert_string_equal(f->token, "tok-1");
    mf_channel_close(ch);
}

static void *health_loop(void *arg)
{
    mf_channel_t *ch = arg;
    for (int i = 0; i < 200; i++) {
        mf_health_t h;
        if (mf_health(ch, &h, MF_TIMEOUT_DEFAULT) != MF_OK || !h.ok)
            return (void *)1;
    }
    return NULL;
}

static void test_threads_share_a_channel(void **state)
{
    mf_channel_t *ch = open_fake(*state, 0, 5000);
    pthread_t t[4];
    for (int i = 0; i < 4; i++)
        pthread_create(&t[i], NULL, health_loop, ch);
    int bad = 0;
    for (int i = 0; i < 4; i++) {
        void *r;
        pthread_join(t[i], &r);
        bad += r != NULL;
    }
    assert_int_equal(bad, 0);
    mf_channel_close(ch);
}

static void test_version_and_tiers(void **state)
{
    (void)state;
    assert_string_equal(mf_version(), MF_VERSION_STRING);
    mf_tier_t t;
    assert_int_equal(mf_tier_parse("ssd", &t), MF_OK);
    assert_int_equal(t, MF_TIER_SSD);
    assert_string_equal(mf_tier_name(MF_TIER_HOST), "host");
    assert_int_equal(mf_tier_parse("disk", &t), MF_INVALID_ARGUMENT);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_open_errors),
        cmocka_unit_test(test_version_and_tiers),
        cmocka_unit_test_setup_teardown(test_put_in_arena, fake_setup, fake_teardown),
        cmocka_unit_test_setup_teardown(test_put_payload, fake_setup, fake_teardown),
        cmocka_unit_test_setup_teardown(test_lookup_sends_full_blocks, fake_setup, fake_teardown),
        cmocka_unit_test_setup_teardown(test_get_prefix_copy, fake_setup, fake_teardown),
        cmocka_unit_test_setup_teardown(test_get_prefix_lease, fake_setup, fake_teardown),
        cmocka_unit_test_setup_teardown(test_lease_needs_arena, fake_setup, fake_teardown),
        cmocka_unit_test_setup_teardown(test_error_reply_and_stats, fake_setup, fake_teardown),
        cmocka_unit_test_setup_teardown(test_deadline_then_stale_reply_dropped, fake_setup,
                                        fake_teardown),
        cmocka_unit_test_setup_teardown(test_stray_replies_ignored, fake_setup, fake_teardown),
        cmocka_unit_test_setup_teardown(test_malformed_reply_reconnects, fake_setup,
                                        fake_teardown),
        cmocka_unit_test_setup_teardown(test_threads_share_a_channel, fake_setup, fake_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
