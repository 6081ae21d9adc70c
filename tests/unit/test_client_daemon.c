/*
 * libmapflow against a real mapflowd process (fork/exec of $MF_BIN/mapflowd, or
 * $MF_MAPFLOWD, on a unix socket and data directory in a temp dir; HTTP / TCP on
 * 127.0.0.1:0). Each test starts its own daemon and stops it with SIGTERM, asserting
 * exit status 0 (under AddressSanitizer that also means no leak).
 *
 * Covers: put/get round trips (host and SSD tier, bytes identical), lookup of partial
 * prefixes, demotion under a small host budget and promotion on a hit, leased entries
 * never evicted, reservations reclaimed at their TTL and on disconnect, a killed client's
 * leases released, durable entries surviving SIGKILL + restart, namespace isolation, the
 * TCP token, malformed frames answered with an error while others are served, and copy
 * gets on an arena channel (lease + copy + release) with both verify levels.
 * Waits are bounded polls (no timed assertions).
 */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "mf_frame.h"
#include "test_client_proc.h"
#include "test_client_util.h"

#define MODEL "src-model"
#define B 32
#define HEADS 16

/* ==== rows =========================================================================== */

typedef struct rows {
    size_t n;
    uint8_t *row[16];
    size_t len[16];
    mf_hash128_t hash[16];
    uint32_t layer[16];
} rows_t;

/* Rows of blocks [0, nb) of `tokens` for one layer, fp16 tiles (about 80 KiB each). */
static void make_rows(rows_t *r, const char *ns, uint32_t layer, const uint32_t *tokens,
                      uint32_t nb, uint64_t seed)
{
    for (uint32_t b = 0; b < nb; b++) {
        size_t i = r->n++;
        r->row[i] = tc_make_row(ns, MODEL, layer, B, HEADS, tokens, b, MF_CODEC_FP16,
                                seed + b, &r->len[i]);
        assert_non_null(r->row[i]);
        mf_row_view_t v;
        assert_int_equal(mf_row_decode(r->row[i], r->len[i], 0, &v, NULL), MF_OK);
        r->hash[i] = v.hash;
        r->layer[i] = layer;
    }
}

static void free_rows(rows_t *r)
{
    for (size_t i = 0; i < r->n; i++)
        free(r->row[i]);
    r->n = 0;
}

/* Puts with a bounded retry while the daemon makes room in the background. */
static void put_ok(mf_channel_t *ch, const void *row, size_t len, unsigned flags)
{
    mf_status_t st = MF_UNKNOWN;
    for (int i = 0; i < 200; i++) {
        st = mf_put(ch, row, len, flags, NULL, MF_TIMEOUT_DEFAULT);
        if (st != MF_RESOURCE_EXHAUSTED && st != MF_UNAVAILABLE)
            break;
        msleep(20);
    }
    if (st != MF_OK)
        fail_msg("put: %s: %s", mf_status_name(st), mf_channel_last_error(ch));
}

static void get_key_equal(mf_channel_t *ch, const rows_t *r, size_t i)
{
    mf_key_t k = {MODEL, r->layer[i], r->hash[i]};
    uint8_t *buf = aligned_alloc(16, (r->len[i] + 15) & ~(size_t)15);
    size_t len = 0;
    mf_status_t st = mf_get(ch, &k, buf, r->len[i], &len, MF_TIMEOUT_DEFAULT);
    if (st != MF_OK)
        fail_msg("get row %zu: %s: %s", i, mf_status_name(st), mf_channel_last_error(ch));
    assert_int_equal(len, r->len[i]);
    assert_memory_equal(buf, r->row[i], len);
    free(buf);
}

/* Tier of a key according to List (MF_TIER_NONE if absent); *pins as listed. */
static mf_tier_t listed_tier(mf_channel_t *ch, const rows_t *r, size_t i, uint32_t *pins)
{
    mf_list_page_t *p = NULL;
    assert_int_equal(mf_list(ch, MODEL, r->layer[i], 1000, NULL, 0, &p, MF_TIMEOUT_DEFAULT),
                     MF_OK);
    mf_tier_t t = MF_TIER_NONE;
    for (size_t e = 0; e < p->n_entries; e++)
        if (mf_hash_eq(p->entries[e].hash, r->hash[i])) {
            t = p->entries[e].tier;
            if (pins)
                *pins = p->entries[e].pins;
        }
    mf_list_page_free(p);
    return t;
}

/* Waits (bounded) until no entry of the namespace is pinned: async write-through holds
 * an internal pin while its SSD write runs, and only unpinned entries can move. */
static void wait_unpinned(mf_channel_t *ch)
{
    for (int i = 0; i < 1000; i++) {
        mf_list_page_t *p = NULL;
        assert_int_equal(mf_list(ch, NULL, -1, 1000, NULL, 0, &p, MF_TIMEOUT_DEFAULT), MF_OK);
        size_t pinned = 0;
        for (size_t e = 0; e < p->n_entries; e++)
            pinned += p->entries[e].pins != 0;
        mf_list_page_free(p);
        if (!pinned)
            return;
        msleep(10);
    }
    fail_msg("entries stayed pinned for 10 s");
}

static uint64_t tier_used(mf_channel_t *ch, mf_tier_t tier)
{
    mf_stats_t *s;
    assert_int_equal(mf_stats(ch, &s, MF_TIMEOUT_DEFAULT), MF_OK);
    uint64_t used = 0;
    for (size_t i = 0; i < s->n_tiers; i++)
        if (s->tiers[i].tier == tier)
            used = s->tiers[i].used_bytes;
    mf_stats_free(s);
    return used;
}

/* ==== tests ========================================================================== */

static void test_roundtrip_and_lookup(void **state)
{
    (void)state;
    daemon_t d;
    daemon_start(&d, 0, "--host_bytes", "64mb", NULL);
    mf_channel_t *ch = chan(&d, "ns-a", 1);
    uint32_t tokens[8 * B];
    tc_tokens(tokens, 8 * B, 7);
    rows_t r = {0};
    make_rows(&r, "ns-a", 2, tokens, 6, 100);
    for (size_t i = 0; i < r.n; i++)
        put_ok(ch, r.row[i], r.len[i], 0);

    /* Lookup: 6 of 8 blocks on layer 2, none on layer 3; then a hole at block 2. */
    uint32_t layers[2] = {2, 3}, blocks[2], total;
    assert_int_equal(mf_lookup(ch, MODEL, B, tokens, 8 * B + 10, layers, 2, blocks, &total,
                               MF_TIMEOUT_DEFAULT), MF_OK);
    assert_int_equal(total, 8);
    assert_int_equal(blocks[0], 6);
    assert_int_equal(blocks[1], 0);

    /* Batch get, both modes: every row byte-identical and verified. */
    for (int mode = MF_GET_COPY; mode <= MF_GET_LEASE; mode++) {
        mf_get_result_t *g = NULL;
        assert_int_equal(mf_get_prefix(ch, MODEL, B, tokens, 8 * B, layers, 1, 0, 8,
                                       (mf_get_mode_t)mode, &g, MF_TIMEOUT_DEFAULT), MF_OK);
        assert_int_equal(g->n_rows, 8);
        for (size_t i = 0; i < 8; i++) {
            if (i >= 6) {
                assert_int_equal(g->rows[i].status, MF_NOT_FOUND);
                continue;
            }
            if (g->rows[i].status != MF_OK)
                fail_msg("row %zu: %s: %s", i, mf_status_name(g->rows[i].status),
                         mf_channel_last_error(ch));
            assert_int_equal(g->rows[i].length, r.len[i]);
            assert_memory_equal(g->rows[i].data, r.row[i], r.len[i]);
            assert_int_equal(g->rows[i].lease_id != 0, mode == MF_GET_LEASE);
        }
        assert_int_equal(mf_release_result(ch, g, MF_TIMEOUT_DEFAULT), MF_OK);
        mf_get_result_free(g);
    }

    mf_key_t k = {MODEL, 2, r.hash[2]};
    uint64_t del = 0;
    assert_int_equal(mf_delete(ch, &k, &del, MF_TIMEOUT_DEFAULT), MF_OK);
    assert_int_equal(del, 1);
    assert_int_equal(mf_lookup(ch, MODEL, B, tokens, 8 * B, layers, 2, blocks, NULL,
                               MF_TIMEOUT_DEFAULT), MF_OK);
    assert_int_equal(blocks[0], 2);
    /* A different token in block 4 ends the prefix there for that request. */
    put_ok(ch, r.row[2], r.len[2], 0);
    tokens[4 * B + 3] ^= 0x40;
    assert_int_equal(mf_lookup(ch, MODEL, B, tokens, 8 * B, layers, 1, blocks, NULL,
                               MF_TIMEOUT_DEFAULT), MF_OK);
    assert_int_equal(blocks[0], 4);

    /* SSD tier: demote everything, read back identical bytes. */
    uint64_t eb = 0, ee = 0;
    wait_unpinned(ch);
    assert_int_equal(mf_evict(ch, MF_TIER_HOST, 1ull << 40, &eb, &ee, MF_TIMEOUT_DEFAULT), MF_OK);
    if (ee < 6)
        fail_msg("evict moved %llu entries (%llu bytes), expected 6", (unsigned long long)ee,
                 (unsigned long long)eb);
    for (size_t i = 0; i < r.n; i++)
        assert_int_equal(listed_tier(ch, &r, i, NULL), MF_TIER_SSD);
    for (size_t i = 0; i < r.n; i++)
        get_key_equal(ch, &r, i);
    /* Promoted back by the hit (possibly just after the reply). */
    mf_tier_t t = MF_TIER_NONE;
    for (int i = 0; i < 500 && (t = listed_tier(ch, &r, 0, NULL)) != MF_TIER_HOST; i++)
        msleep(10);
    assert_int_equal(t, MF_TIER_HOST);
    mf_channel_close(ch);
    free_rows(&r);
    daemon_stop(&d, 1);
}

static void test_small_budget_demotes_and_promotes(void **state)
{
    (void)state;
    daemon_t d;
    daemon_start(&d, 0, "--host_bytes", "1mb", NULL);
    mf_channel_t *ch = chan(&d, "ns-b", 1);
    uint32_t tokens[16 * B];
    tc_tokens(tokens, 16 * B, 21);
    rows_t r = {0};
    make_rows(&r, "ns-b", 0, tokens, 16, 300); /* about 16 × 80 KiB > 1 MiB */
    size_t total = 0;
    for (size_t i = 0; i < r.n; i++) {
        put_ok(ch, r.row[i], r.len[i], 0);
        total += r.len[i];
    }
    assert_true(total > (1u << 20));
    size_t on_ssd = 0;
    for (size_t i = 0; i < r.n; i++)
        on_ssd += listed_tier(ch, &r, i, NULL) == MF_TIER_SSD;
    assert_true(on_ssd > 0);
    assert_true(tier_used(ch, MF_TIER_HOST) <= (1u << 20));
    for (size_t i = 0; i < r.n; i++) /* every row, wherever it went */
        get_key_equal(ch, &r, i);
    mf_channel_close(ch);
    free_rows(&r);
    daemon_stop(&d, 1);
}

static void test_leased_entry_never_evicted(void **state)
{
    (void)state;
    daemon_t d;
    daemon_start(&d, 0, "--host_bytes", "4mb", NULL);
    mf_channel_t *ch = chan(&d, "ns-c", 1);
    uint32_t tokens[2 * B];
    tc_tokens(tokens, 2 * B, 5);
    rows_t r = {0};
    make_rows(&r, "ns-c", 1, tokens, 2, 500);
    put_ok(ch, r.row[0], r.len[0], 0);
    put_ok(ch, r.row[1], r.len[1], 0);
    wait_unpinned(ch);
    mf_key_t k = {MODEL, 1, r.hash[0]};
    mf_lease_t l;
    assert_int_equal(mf_get_lease(ch, &k, &l, MF_TIMEOUT_DEFAULT), MF_OK);
    assert_int_equal(mf_evict(ch, MF_TIER_HOST, 1ull << 40, NULL, NULL, MF_TIMEOUT_DEFAULT),
                     MF_OK);
    mf_channel_t *other = chan(&d, "ns-c", 0);
    assert_int_equal(mf_flush(other, NULL, MF_TIMEOUT_DEFAULT), MF_OK);
    uint32_t pins = 0;
    assert_int_equal(listed_tier(ch, &r, 0, &pins), MF_TIER_HOST);
    assert_true(pins >= 1);
    assert_memory_equal(l.data, r.row[0], r.len[0]); /* the leased bytes did not move */
    assert_int_equal(listed_tier(ch, &r, 1, NULL), MF_TIER_NONE); /* flushed */
    uint32_t rel = 0;
    assert_int_equal(mf_release(ch, &l.lease_id, 1, &rel, MF_TIMEOUT_DEFAULT), MF_OK);
    assert_int_equal(rel, 1);
    wait_unpinned(ch);
    assert_int_equal(mf_evict(ch, MF_TIER_HOST, 1ull << 40, NULL, NULL, MF_TIMEOUT_DEFAULT),
                     MF_OK);
    assert_int_not_equal(listed_tier(ch, &r, 0, NULL), MF_TIER_HOST);
    mf_channel_close(other);
    mf_channel_close(ch);
    free_rows(&r);
    daemon_stop(&d, 1);
}

/* A unix channel with the arena and the given verify level (INVALID_ARGUMENT → NULL). */
static mf_channel_t *chan_verify(const daemon_t *d, const char *ns, int verify, mf_status_t *st)
{
    char target[160];
    snprintf(target, sizeof(target), "unix:%s", d->sock);
    mf_channel_params_t p = {.field_mask = MF_CHANNEL_PARAM_NS | MF_CHANNEL_PARAM_WANT_ARENA |
                                           MF_CHANNEL_PARAM_VERIFY,
                             .ns = ns, .want_arena = 1, .verify = (mf_verify_t)verify};
    mf_channel_t *ch = NULL;
    *st = mf_channel_open(target, &p, &ch);
    if (*st != MF_OK) {
        mf_channel_close(ch);
        return NULL;
    }
    return ch;
}

/* Copy gets on an arena channel lease, copy and release: bytes identical, no lease left
 * in the result, every pin gone afterwards. A byte altered in the shared arena after
 * commit: FULL (the default) reports DATA_LOSS, HEADER hands the bytes out. */
static void test_arena_copy_and_verify(void **state)
{
    (void)state;
    daemon_t d;
    daemon_start(&d, 0, "--host_bytes", "16mb", NULL);
    mf_channel_t *ch = chan(&d, "ns-v", 1);
    assert_true(mf_channel_has_arena(ch));
    uint32_t tokens[4 * B];
    tc_tokens(tokens, 4 * B, 77);
    rows_t r = {0};
    make_rows(&r, "ns-v", 3, tokens, 4, 900);
    for (size_t i = 0; i < r.n; i++)
        put_ok(ch, r.row[i], r.len[i], 0);
    wait_unpinned(ch);

    mf_key_t keys[4];
    for (size_t i = 0; i < r.n; i++) {
        keys[i] = (mf_key_t){MODEL, 3, r.hash[i]};
        get_key_equal(ch, &r, i);
    }
    mf_get_result_t *g = NULL;
    assert_int_equal(mf_get_keys(ch, keys, 4, MF_GET_COPY, &g, MF_TIMEOUT_DEFAULT), MF_OK);
    for (size_t i = 0; i < 4; i++) {
        assert_int_equal(g->rows[i].status, MF_OK);
        assert_int_equal(g->rows[i].lease_id, 0);
        assert_int_equal(g->rows[i].length, r.len[i]);
        assert_memory_equal(g->rows[i].data, r.row[i], r.len[i]);
        assert_int_equal((uintptr_t)g->rows[i].data % 16, 0);
    }
    mf_get_result_free(g);
    /* A too small buffer: RESOURCE_EXHAUSTED with the size, and the lease still released. */
    uint8_t small[64];
    size_t len = 0;
    assert_int_equal(mf_get(ch, &keys[1], small, sizeof(small), &len, MF_TIMEOUT_DEFAULT),
                     MF_RESOURCE_EXHAUSTED);
    assert_int_equal(len, r.len[1]);
    wait_unpinned(ch); /* fails after 10 s if a copy get left its lease behind */

    mf_status_t st;
    assert_null(chan_verify(&d, "ns-v", 7, &st));
    assert_int_equal(st, MF_INVALID_ARGUMENT);
    mf_channel_t *hdr = chan_verify(&d, "ns-v", MF_VERIFY_HEADER, &st);
    assert_non_null(hdr);
    mf_lease_t l;
    assert_int_equal(mf_get_lease(ch, &keys[2], &l, MF_TIMEOUT_DEFAULT), MF_OK);
    uint8_t *p = (uint8_t *)(uintptr_t)l.data + l.length - 1;
    *p ^= 0x5a; /* the tail of the last tile: inside the checksum, outside the header */
    uint8_t *buf = aligned_alloc(16, (r.len[2] + 15) & ~(size_t)15);
    assert_int_equal(mf_get(ch, &keys[2], buf, r.len[2], &len, MF_TIMEOUT_DEFAULT),
                     MF_DATA_LOSS);
    assert_int_equal(mf_get(hdr, &keys[2], buf, r.len[2], &len, MF_TIMEOUT_DEFAULT), MF_OK);
    assert_int_equal(len, r.len[2]);
    assert_int_equal(buf[len - 1], r.row[2][len - 1] ^ 0x5a);
    assert_memory_equal(buf, r.row[2], len - 1);
    *p ^= 0x5a;
    assert_int_equal(mf_get(ch, &keys[2], buf, r.len[2], &len, MF_TIMEOUT_DEFAULT), MF_OK);
    assert_memory_equal(buf, r.row[2], len);
    free(buf);
    assert_int_equal(mf_release(ch, &l.lease_id, 1, NULL, MF_TIMEOUT_DEFAULT), MF_OK);
    wait_unpinned(ch);
    mf_channel_close(hdr);
    mf_channel_close(ch);
    free_rows(&r);
    daemon_stop(&d, 1);
}

/* A raw connection that sent Hello (for requests the API never sends). */
static int raw_connect(const daemon_t *d, const char *ns)
{
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", d->sock);
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    if (ns) {
        Mapflow__V1__Hello h = MAPFLOW__V1__HELLO__INIT;
        h.protocol_version = 1;
        h.namespace_ = (char *)ns;
        mf_envelope_t e = MAPFLOW__V1__ENVELOPE__INIT;
        e.request_id = 1;
        e.body_case = MAPFLOW__V1__ENVELOPE__BODY_HELLO;
        e.hello = &h;
        uint8_t *b;
        size_t n;
        assert_int_equal(mf_frame_encode(&e, NULL, 0, MF_FRAME_DEFAULT_MAX, &b, &n), MF_OK);
        assert_int_equal(write(fd, b, n), (ssize_t)n);
        free(b);
    }
    return fd;
}

/* Reads one reply frame (bounded wait); NULL at EOF. */
static mf_envelope_t *raw_reply(int fd)
{
    mf_frame_reader_t rd;
    mf_frame_reader_init(&rd, MF_FRAME_DEFAULT_MAX);
    mf_envelope_t *env = NULL;
    for (;;) {
        mf_frame_t f;
        int have = 0;
        if (mf_frame_reader_next(&rd, &f, &have, NULL) != MF_OK)
            break;
        if (have) {
            assert_int_equal(mf_envelope_decode(&f, &env, NULL), MF_OK);
            break;
        }
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 10000) != 1)
            fail_msg("no reply within 10 s");
        uint8_t *sp;
        size_t avail;
        mf_frame_reader_space(&rd, 4096, &sp, &avail);
        ssize_t r = read(fd, sp, avail);
        if (r <= 0)
            break;
        mf_frame_reader_commit(&rd, (size_t)r);
    }
    mf_frame_reader_deinit(&rd);
    return env;
}

static void raw_send(int fd, mf_envelope_t *e)
{
    uint8_t *b;
    size_t n;
    assert_int_equal(mf_frame_encode(e, NULL, 0, MF_FRAME_DEFAULT_MAX, &b, &n), MF_OK);
    assert_int_equal(write(fd, b, n), (ssize_t)n);
    free(b);
}

static int raw_put_begin(const daemon_t *d, const rows_t *r, size_t i, uint64_t size)
{
    int fd = raw_connect(d, "ns-d");
    mf_envelope_t *rep = raw_reply(fd);
    assert_non_null(rep);
    assert_int_equal(rep->body_case, MAPFLOW__V1__ENVELOPE__BODY_HELLO_REPLY);
    mf_envelope_free(rep);
    uint8_t hb[16];
    mf_hash_to_le(r->hash[i], hb);
    Mapflow__V1__Key k = MAPFLOW__V1__KEY__INIT;
    k.model = MODEL;
    k.layer = r->layer[i];
    k.hash.data = hb;
    k.hash.len = 16;
    Mapflow__V1__PutBegin pb = MAPFLOW__V1__PUT_BEGIN__INIT;
    pb.key = &k;
    pb.size = size;
    mf_envelope_t e = MAPFLOW__V1__ENVELOPE__INIT;
    e.request_id = 2;
    e.body_case = MAPFLOW__V1__ENVELOPE__BODY_PUT_BEGIN;
    e.put_begin = &pb;
    raw_send(fd, &e);
    rep = raw_reply(fd);
    assert_non_null(rep);
    assert_int_equal(rep->body_case, MAPFLOW__V1__ENVELOPE__BODY_PUT_BEGIN_REPLY);
    mf_envelope_free(rep);
    return fd;
}

static void test_reservations_reclaimed(void **state)
{
    (void)state;
    daemon_t d;
    /* reservation_share 1: this one namespace may reserve (nearly) the whole arena. */
    daemon_start(&d, 0, "--host_bytes", "1mb", "--reservation_ttl", "1s", "--ssd_bytes", "0",
                 "--reservation_share", "1", NULL);
    mf_channel_t *ch = chan(&d, "ns-d", 1);
    uint32_t tokens[3 * B];
    tc_tokens(tokens, 3 * B, 9);
    rows_t r = {0};
    make_rows(&r, "ns-d", 0, tokens, 3, 700);
    /* A reservation of most of the arena, never committed, on a live connection. */
    int fd = raw_put_begin(&d, &r, 0, 1000u << 10);
    assert_int_equal(mf_put(ch, r.row[1], r.len[1], 0, NULL, MF_TIMEOUT_DEFAULT),
                     MF_RESOURCE_EXHAUSTED);
    put_ok(ch, r.row[1], r.len[1], 0); /* retried until the TTL reclaims the space */
    close(fd);
    assert_int_equal(mf_flush(ch, NULL, MF_TIMEOUT_DEFAULT), MF_OK);
    /* On disconnect: the space comes back without waiting for the TTL. */
    fd = raw_put_begin(&d, &r, 0, 1000u << 10);
    close(fd);
    put_ok(ch, r.row[2], r.len[2], 0);
    mf_channel_close(ch);
    free_rows(&r);
    daemon_stop(&d, 1);
}

static void test_killed_client_leases_released(void **state)
{
    (void)state;
    daemon_t d;
    daemon_start(&d, 0, "--host_bytes", "4mb", "--lease_ttl", "1h", NULL);
    mf_channel_t *ch = chan(&d, "ns-e", 1);
    uint32_t tokens[B];
    tc_tokens(tokens, B, 13);
    rows_t r = {0};
    make_rows(&r, "ns-e", 4, tokens, 1, 900);
    put_ok(ch, r.row[0], r.len[0], 0);
    int pfd[2];
    assert_int_equal(pipe(pfd), 0);
    pid_t kid = fork();
    if (kid == 0) {
        mf_channel_t *kc = chan(&d, "ns-e", 1);
        mf_key_t k = {MODEL, 4, r.hash[0]};
        mf_lease_t l;
        char c = mf_get_lease(kc, &k, &l, MF_TIMEOUT_DEFAULT) == MF_OK ? 'y' : 'n';
        ssize_t w = write(pfd[1], &c, 1);
        (void)w;
        pause();
        _exit(0);
    }
    char c = 0;
    assert_int_equal(read(pfd[0], &c, 1), 1);
    assert_int_equal(c, 'y');
    uint32_t pins = 0;
    assert_int_equal(listed_tier(ch, &r, 0, &pins), MF_TIER_HOST);
    assert_true(pins >= 1);
    kill(kid, SIGKILL);
    waitpid(kid, NULL, 0);
    for (int i = 0; i < 500 && pins; i++) { /* the daemon notices the EOF */
        msleep(10);
        listed_tier(ch, &r, 0, &pins);
    }
    assert_int_equal(pins, 0);
    assert_int_equal(mf_evict(ch, MF_TIER_HOST, 1ull << 40, NULL, NULL, MF_TIMEOUT_DEFAULT),
                     MF_OK);
    assert_int_not_equal(listed_tier(ch, &r, 0, NULL), MF_TIER_HOST);
    close(pfd[0]);
    close(pfd[1]);
    mf_channel_close(ch);
    free_rows(&r);
    daemon_stop(&d, 1);
}

static void test_restart_keeps_durable(void **state)
{
    (void)state;
    daemon_t d;
    daemon_start(&d, 0, "--write_through", "off", NULL);
    mf_channel_t *ch = chan(&d, "ns-f", 0);
    uint32_t tokens[4 * B];
    tc_tokens(tokens, 4 * B, 17);
    rows_t r = {0};
    make_rows(&r, "ns-f", 7, tokens, 4, 1100);
    for (size_t i = 0; i < r.n; i++) {
        mf_put_result_t pr;
        assert_int_equal(mf_put(ch, r.row[i], r.len[i], MF_PUT_DURABLE, &pr,
                                MF_TIMEOUT_DEFAULT), MF_OK);
        assert_true(pr.durable);
    }
    mf_channel_close(ch);
    kill(d.pid, SIGKILL); /* durable means acknowledged after a synced write */
    daemon_wait(&d);
    daemon_start(&d, 1, "--write_through", "off", NULL);
    ch = chan(&d, "ns-f", 0);
    mf_list_page_t *p = NULL;
    assert_int_equal(mf_list(ch, NULL, -1, 0, NULL, 0, &p, MF_TIMEOUT_DEFAULT), MF_OK);
    assert_int_equal(p->n_entries, 4);
    mf_list_page_free(p);
    for (size_t i = 0; i < r.n; i++)
        get_key_equal(ch, &r, i);
    uint32_t layer = 7, blocks = 0;
    assert_int_equal(mf_lookup(ch, MODEL, B, tokens, 4 * B, &layer, 1, &blocks, NULL,
                               MF_TIMEOUT_DEFAULT), MF_OK);
    assert_int_equal(blocks, 4);
    mf_channel_close(ch);
    free_rows(&r);
    daemon_stop(&d, 1);
}

static void test_namespace_isolation(void **state)
{
    (void)state;
    daemon_t d;
    daemon_start(&d, 0, NULL);
    mf_channel_t *a = chan(&d, "tenant-a", 0), *b = chan(&d, "tenant-b", 0);
    uint32_t tokens[2 * B];
    tc_tokens(tokens, 2 * B, 23);
    rows_t r = {0};
    make_rows(&r, "tenant-a", 0, tokens, 2, 1300);
    put_ok(a, r.row[0], r.len[0], 0);
    put_ok(a, r.row[1], r.len[1], 0);
    uint32_t layer = 0, blocks = 9;
    assert_int_equal(mf_lookup(b, MODEL, B, tokens, 2 * B, &layer, 1, &blocks, NULL,
                               MF_TIMEOUT_DEFAULT), MF_OK);
    assert_int_equal(blocks, 0);
    mf_key_t k = {MODEL, 0, r.hash[0]};
    uint8_t buf[16];
    size_t len;
    assert_int_equal(mf_get(b, &k, buf, sizeof(buf), &len, MF_TIMEOUT_DEFAULT), MF_NOT_FOUND);
    mf_list_page_t *p = NULL;
    assert_int_equal(mf_list(b, NULL, -1, 0, NULL, 0, &p, MF_TIMEOUT_DEFAULT), MF_OK);
    assert_int_equal(p->n_entries, 0);
    mf_list_page_free(p);
    uint64_t del = 7, fl = 7;
    assert_int_equal(mf_delete(b, &k, &del, MF_TIMEOUT_DEFAULT), MF_OK);
    assert_int_equal(del, 0);
    assert_int_equal(mf_flush(b, &fl, MF_TIMEOUT_DEFAULT), MF_OK);
    assert_int_equal(fl, 0);
    /* Still all there for the owner. */
    assert_int_equal(mf_lookup(a, MODEL, B, tokens, 2 * B, &layer, 1, &blocks, NULL,
                               MF_TIMEOUT_DEFAULT), MF_OK);
    assert_int_equal(blocks, 2);
    mf_channel_close(a);
    mf_channel_close(b);
    free_rows(&r);
    daemon_stop(&d, 1);
}

static mf_status_t tcp_open(int port, const char *token, mf_channel_t **ch)
{
    char target[64];
    snprintf(target, sizeof(target), "tcp:127.0.0.1:%d", port);
    mf_channel_params_t p = {.field_mask = MF_CHANNEL_PARAM_TIMEOUT_MS |
                                           (token ? MF_CHANNEL_PARAM_TOKEN : 0),
                             .token = token, .timeout_ms = 10000};
    return mf_channel_open(target, &p, ch);
}

static void test_tcp_needs_token(void **state)
{
    (void)state;
    daemon_t d;
    daemon_start(&d, 0, "--tcp", "127.0.0.1:0", "--token", "s3cret", NULL);
    int port = log_port(&d, "tcp");
    if (port <= 0) {
        dump_log(&d);
        fail_msg("no tcp port in the daemon log");
    }
    mf_channel_t *ch = NULL;
    assert_int_equal(tcp_open(port, NULL, &ch), MF_UNAUTHENTICATED);
    mf_channel_close(ch);
    assert_int_equal(tcp_open(port, "wrong", &ch), MF_UNAUTHENTICATED);
    mf_channel_close(ch);
    assert_int_equal(tcp_open(port, "s3cret", &ch), MF_OK);
    mf_health_t h;
    assert_int_equal(mf_health(ch, &h, MF_TIMEOUT_DEFAULT), MF_OK);
    assert_true(h.ok);
    mf_channel_close(ch);
    daemon_stop(&d, 1);
}

static void test_malformed_frames(void **state)
{
    (void)state;
    daemon_t d;
    daemon_start(&d, 0, NULL);
    mf_channel_t *good = chan(&d, "ns-g", 0);

    /* First frame not Hello → FAILED_PRECONDITION, then close. */
    int fd = raw_connect(&d, NULL);
    Mapflow__V1__Health hq = MAPFLOW__V1__HEALTH__INIT;
    mf_envelope_t e = MAPFLOW__V1__ENVELOPE__INIT;
    e.request_id = 5;
    e.body_case = MAPFLOW__V1__ENVELOPE__BODY_HEALTH;
    e.health = &hq;
    raw_send(fd, &e);
    mf_envelope_t *rep = raw_reply(fd);
    assert_non_null(rep);
    assert_int_equal(rep->body_case, MAPFLOW__V1__ENVELOPE__BODY_ERROR);
    assert_int_equal(rep->error->code, MF_FAILED_PRECONDITION);
    mf_envelope_free(rep);
    assert_null(raw_reply(fd));
    close(fd);

    /* Unknown body: UNIMPLEMENTED, connection kept. */
    fd = raw_connect(&d, "ns-g");
    mf_envelope_free(raw_reply(fd));
    mf_envelope_t empty = MAPFLOW__V1__ENVELOPE__INIT;
    empty.request_id = 6;
    raw_send(fd, &empty);
    rep = raw_reply(fd);
    assert_non_null(rep);
    assert_int_equal(rep->body_case, MAPFLOW__V1__ENVELOPE__BODY_ERROR);
    assert_int_equal(rep->error->code, MF_UNIMPLEMENTED);
    mf_envelope_free(rep);
    e.request_id = 7;
    raw_send(fd, &e);
    rep = raw_reply(fd);
    assert_non_null(rep);
    assert_int_equal(rep->body_case, MAPFLOW__V1__ENVELOPE__BODY_HEALTH_REPLY);
    assert_int_equal(rep->request_id, 7);
    mf_envelope_free(rep);

    /* Bad lengths (msg_len > frame_len): an error reply, then that connection closes. */
    uint8_t bad[12] = {8, 0, 0, 0, 200, 0, 0, 0, 1, 2, 3, 4};
    assert_int_equal(write(fd, bad, sizeof(bad)), (ssize_t)sizeof(bad));
    rep = raw_reply(fd);
    assert_non_null(rep);
    assert_int_equal(rep->body_case, MAPFLOW__V1__ENVELOPE__BODY_ERROR);
    mf_envelope_free(rep);
    assert_null(raw_reply(fd));
    close(fd);

    /* A frame over max_frame: refused from its length alone. */
    fd = raw_connect(&d, "ns-g");
    mf_envelope_free(raw_reply(fd));
    uint8_t huge[8] = {0xff, 0xff, 0xff, 0x7f, 0, 0, 0, 0};
    assert_int_equal(write(fd, huge, sizeof(huge)), (ssize_t)sizeof(huge));
    rep = raw_reply(fd);
    assert_non_null(rep);
    assert_int_equal(rep->body_case, MAPFLOW__V1__ENVELOPE__BODY_ERROR);
    assert_int_equal(rep->error->code, MF_RESOURCE_EXHAUSTED);
    mf_envelope_free(rep);
    close(fd);

    /* Undecodable envelope bytes. */
    fd = raw_connect(&d, "ns-g");
    mf_envelope_free(raw_reply(fd));
    uint8_t junk[14] = {10, 0, 0, 0, 6, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
    assert_int_equal(write(fd, junk, sizeof(junk)), (ssize_t)sizeof(junk));
    rep = raw_reply(fd);
    assert_non_null(rep);
    assert_int_equal(rep->body_case, MAPFLOW__V1__ENVELOPE__BODY_ERROR);
    assert_int_equal(rep->error->code, MF_INVALID_ARGUMENT);
    mf_envelope_free(rep);
    close(fd);

    /* The well-behaved client never noticed. */
    mf_health_t h;
    assert_int_equal(mf_health(good, &h, MF_TIMEOUT_DEFAULT), MF_OK);
    assert_true(h.ok);
    mf_channel_close(good);
    daemon_stop(&d, 1);
}

int main(int argc, char **argv)
{
    (void)argc;
    tp_find_mapflowd(argv[0]);
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip_and_lookup),
        cmocka_unit_test(test_small_budget_demotes_and_promotes),
        cmocka_unit_test(test_leased_entry_never_evicted),
        cmocka_unit_test(test_arena_copy_and_verify),
        cmocka_unit_test(test_reservations_reclaimed),
        cmocka_unit_test(test_killed_client_leases_released),
        cmocka_unit_test(test_restart_keeps_durable),
        cmocka_unit_test(test_namespace_isolation),
        cmocka_unit_test(test_tcp_needs_token),
        cmocka_unit_test(test_malformed_frames),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
