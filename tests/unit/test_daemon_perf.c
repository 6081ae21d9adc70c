/*
 * test_daemon_perf — functional checks of mapflowd's fast paths (issue 13), not timings:
 * one lease ticket per Get with per-row ids (partial Release, Flush, gauges), copy gets
 * of rows large enough to leave by reference (packing, bytes, a client that hangs up
 * before reading still unpins), bounded async write-through under a put burst (no
 * RESOURCE_EXHAUSTED, every write accounted for, the last version of each key on the SSD
 * after a restart), SSD reads straight into the promotion block, and the row a commit
 * acknowledges never being the one its watermark demotion drops.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <signal.h>
#include <time.h>

#include "test_daemon_util.h"

#define B 128          /* FP16 tiles of 128 × 128: rows of ~128 KiB, above REF_MIN_BYTES */
#define NB 6
#define MODEL "perf-model"

typedef struct fixture {
    td_daemon_t d;
    uint32_t tokens[NB * B];
} fixture_t;

static int setup_with(void **state, const char *const *extra)
{
    fixture_t *f = calloc(1, sizeof(*f));
    unsigned seed = 4242;
    for (int i = 0; i < NB * B; i++)
        f->tokens[i] = 7 + (uint32_t)(rand_r(&seed) % 60000);
    if (td_start(&f->d, extra) != 0)
        return -1;
    *state = f;
    return 0;
}

static int setup(void **state)
{
    return setup_with(state, NULL);
}

static int setup_no_ssd(void **state)
{
    static const char *const extra[] = {"ssd_bytes", "0", "host_bytes", "2mb", NULL};
    return setup_with(state, extra);
}

static int teardown(void **state)
{
    fixture_t *f = *state;
    if (f->d.srv)
        td_stop(&f->d);
    td_rmdir(&f->d);
    free(f);
    return 0;
}

/* An FP16 row for block i (2 heads, sink + diagonal); `version` seeds its values. */
static uint8_t *big_row(const char *ns, uint32_t layer, const uint32_t *tokens, uint32_t i,
                        unsigned version, size_t *size)
{
    mf_hash128_t h = mf_hash_root(B, ns, strlen(ns), MODEL, strlen(MODEL)), parent = h;
    for (uint32_t b = 0; b <= i; b++) {
        parent = h;
        h = mf_hash_next(h, tokens + (size_t)b * B, B);
    }
    mf_row_spec_t spec = {MODEL, layer, i, B, 2, MF_CODEC_FP16, 0.9f, parent, h,
                          tokens + (size_t)i * B};
    uint32_t cols[2] = {0, i};
    uint64_t masks[2] = {3, 3};
    uint32_t n_cols = i ? 2 : 1, n_e = 2 * n_cols;
    unsigned seed = version * 131u + layer * 17u + i;
    float mass[4], *tiles = malloc((size_t)n_e * B * B * sizeof(float));
    for (uint32_t k = 0; k < n_e; k++)
        mass[k] = (float)(rand_r(&seed) % 1000) / 1000.0f;
    for (size_t k = 0; k < (size_t)n_e * B * B; k++)
        tiles[k] = (float)(rand_r(&seed) % 1024) / 1024.0f;
    size_t need = 0;
    const char *why;
    mf_row_build(NULL, 0, &spec, n_cols, cols, masks, mass, tiles, &need, &why);
    uint8_t *buf = aligned_alloc(64, (need + 63) & ~(size_t)63);
    if (mf_row_build(buf, need, &spec, n_cols, cols, masks, mass, tiles, size, &why) != MF_OK) {
        free(buf);
        buf = NULL;
    }
    free(tiles);
    return buf;
}

/* Puts (ns, layer, block i, version) through the arena; returns the status (0 = OK). */
static int put_big(td_cli_t *c, const char *ns, uint32_t layer, const uint32_t *tokens,
                   uint32_t i, unsigned version)
{
    size_t size;
    uint8_t *row = big_row(ns, layer, tokens, i, version, &size);
    assert_non_null(row);
    const mf_row_header_t *hdr = (const mf_row_header_t *)row;
    uint8_t want[16];
    mf_hash_to_le(td_block_hash(ns, MODEL, B, tokens, i), want);
    assert_memory_equal(hdr->hash, want, 16);
    int rc = td_put(c, MODEL, layer, mf_hash_from_le(hdr->hash), row, size, 0, NULL);
    free(row);
    return rc;
}

/* Puts n keys' rows pipelined on one connection: n PutBegins, then n PutCommits sent
 * back to back, so the daemon commits them in one go (a burst its SSD cannot follow). */
static void put_pipelined(td_cli_t *c, const char *ns, const uint32_t *layer,
                          const uint32_t *block, size_t n, const uint32_t *tokens,
                          unsigned version)
{
    uint8_t *rows[16];
    size_t sizes[16];
    uint64_t res[16];
    assert_true(n <= 16);
    for (size_t k = 0; k < n; k++) {
        rows[k] = big_row(ns, layer[k], tokens, block[k], version, &sizes[k]);
        Mapflow__V1__Key key = MAPFLOW__V1__KEY__INIT;
        key.model = MODEL;
        key.layer = layer[k];
        key.hash.data = (uint8_t *)((const mf_row_header_t *)rows[k])->hash;
        key.hash.len = 16;
        Mapflow__V1__PutBegin pb = MAPFLOW__V1__PUT_BEGIN__INIT;
        pb.key = &key;
        pb.size = sizes[k];
        mf_envelope_t env = MAPFLOW__V1__ENVELOPE__INIT;
        env.request_id = c->next_id++;
        env.body_case = MAPFLOW__V1__ENVELOPE__BODY_PUT_BEGIN;
        env.put_begin = &pb;
        assert_int_equal(td_send(c, &env, NULL, 0), 0);
    }
    for (size_t k = 0; k < n; k++) {
        mf_envelope_t *r = td_recv(c, NULL);
        assert_non_null(r);
        assert_int_equal(r->body_case, MAPFLOW__V1__ENVELOPE__BODY_PUT_BEGIN_REPLY);
        res[k] = r->put_begin_reply->reservation_id;
        memcpy(c->arena + r->put_begin_reply->arena_offset, rows[k], sizes[k]);
        mf_envelope_free(r);
        free(rows[k]);
    }
    for (size_t k = 0; k < n; k++) {
        Mapflow__V1__PutCommit pc = MAPFLOW__V1__PUT_COMMIT__INIT;
        pc.reservation_id = res[k];
        mf_envelope_t env = MAPFLOW__V1__ENVELOPE__INIT;
        env.request_id = c->next_id++;
        env.body_case = MAPFLOW__V1__ENVELOPE__BODY_PUT_COMMIT;
        env.put_commit = &pc;
        assert_int_equal(td_send(c, &env, NULL, 0), 0);
    }
    for (size_t k = 0; k < n; k++) {
        mf_envelope_t *r = td_recv(c, NULL);
        assert_non_null(r);
        assert_int_equal(r->body_case, MAPFLOW__V1__ENVELOPE__BODY_PUT_COMMIT_REPLY);
        mf_envelope_free(r);
    }
}

static mf_envelope_t *get_prefix(td_cli_t *c, const uint32_t *tokens, const uint32_t *layers,
                                 size_t n_layers, uint32_t first, uint32_t n, int lease)
{
    Mapflow__V1__Get g = MAPFLOW__V1__GET__INIT;
    g.model = MODEL;
    g.block_size = B;
    g.layers = (uint32_t *)layers;
    g.n_layers = n_layers;
    g.first_block = first;
    g.n_blocks = n;
    g.mode = lease ? MAPFLOW__V1__GET_MODE__GET_LEASE : MAPFLOW__V1__GET_MODE__GET_COPY;
    mf_envelope_t env = MAPFLOW__V1__ENVELOPE__INIT;
    env.body_case = MAPFLOW__V1__ENVELOPE__BODY_GET;
    env.get = &g;
    return td_call(c, &env, tokens, (size_t)NB * B * 4);
}

/* A small MASK row of block i on `layer`: a block a prefix Get's chain needs stored (a
 * block of its range of which no row is stored breaks it) without one of the big rows. */
static void put_small(td_cli_t *c, const char *ns, uint32_t layer, const uint32_t *tokens,
                      uint32_t i)
{
    size_t size;
    unsigned seed = 31 * layer + i;
    uint8_t *row = td_row(ns, MODEL, layer, B, tokens, i, &size, &seed);
    assert_non_null(row);
    assert_int_equal(td_put(c, MODEL, layer, td_block_hash(ns, MODEL, B, tokens, i), row, size,
                            0, NULL),
                     0);
    free(row);
}

static uint64_t release(td_cli_t *c, const uint64_t *ids, size_t n)
{
    Mapflow__V1__Release rel = MAPFLOW__V1__RELEASE__INIT;
    rel.lease_ids = (uint64_t *)ids;
    rel.n_lease_ids = n;
    mf_envelope_t *r = td_simple(c, MAPFLOW__V1__ENVELOPE__BODY_RELEASE, &rel);
    assert_int_equal(r->body_case, MAPFLOW__V1__ENVELOPE__BODY_RELEASE_REPLY);
    uint64_t got = r->release_reply->released;
    mf_envelope_free(r);
    return got;
}

/* Bytes of a copy-mode row equal a fresh build of (layer, block, version). */
static void check_copy(const td_cli_t *c, const Mapflow__V1__RowRef *ref, const char *ns,
                       const uint32_t *tokens, unsigned version)
{
    size_t size;
    uint8_t *want = big_row(ns, ref->layer, tokens, ref->block, version, &size);
    td_assert_copy(c, ref, want, size);
    free(want);
}

/* ---- tests ---------------------------------------------------------------------------- */

static void test_lease_group_partial_release(void **state)
{
    fixture_t *f = *state;
    td_cli_t c;
    assert_int_equal(td_connect(&c, f->d.sock, "ns-lease", 1), 0);
    for (uint32_t l = 0; l < 2; l++)
        for (uint32_t i = 0; i < 4; i++)
            assert_int_equal(put_big(&c, "ns-lease", l, f->tokens, i, 1), 0);
    uint32_t layers[2] = {0, 1};
    mf_envelope_t *r = get_prefix(&c, f->tokens, layers, 2, 0, 4, 1);
    assert_int_equal(r->body_case, MAPFLOW__V1__ENVELOPE__BODY_GET_REPLY);
    assert_int_equal(r->get_reply->n_rows, 8);
    uint64_t ids[8];
    for (size_t k = 0; k < 8; k++) {
        const Mapflow__V1__RowRef *ref = r->get_reply->rows[k];
        assert_int_equal(ref->status, MF_OK);
        ids[k] = ref->lease_id;
        for (size_t j = 0; j < k; j++)
            assert_true(ids[j] != ids[k]); /* every row keeps its own id */
        size_t size;
        uint8_t *want = big_row("ns-lease", ref->layer, f->tokens, ref->block, 1, &size);
        assert_memory_equal(c.arena + ref->arena_offset, want, size);
        free(want);
    }
    mf_envelope_free(r);
    assert_int_equal(td_stat(&c, "leases"), 8);
    /* Release three rows: only those; again: nothing. */
    uint64_t some[3] = {ids[0], ids[2], ids[5]};
    assert_int_equal(release(&c, some, 3), 3);
    assert_int_equal(td_stat(&c, "leases"), 5);
    assert_int_equal(release(&c, some, 3), 0);
    /* Flush skips leased rows: exactly the three released ones go. */
    r = td_simple(&c, MAPFLOW__V1__ENVELOPE__BODY_FLUSH, &(Mapflow__V1__Flush)MAPFLOW__V1__FLUSH__INIT);
    assert_int_equal(r->flush_reply->entries, 3);
    mf_envelope_free(r);
    /* The rest, plus ids that name no row of that group or no group at all. */
    uint64_t rest[8] = {ids[1], ids[3], ids[4], ids[6], ids[7], ids[7] + 1, 999999, 0};
    assert_int_equal(release(&c, rest, 8), 5);
    assert_int_equal(td_stat(&c, "leases"), 0);
    assert_int_equal(td_stat(&c, "leases_granted_total"), 8);
    /* Another connection cannot release this one's leases. */
    r = get_prefix(&c, f->tokens, layers, 1, 1, 1, 1);
    uint64_t id = r->get_reply->rows[0]->lease_id;
    mf_envelope_free(r);
    td_cli_t o;
    assert_int_equal(td_connect(&o, f->d.sock, "ns-lease", 1), 0);
    assert_int_equal(release(&o, &id, 1), 0);
    td_close(&o);
    assert_int_equal(td_stat(&c, "leases"), 1);
    td_close(&c); /* disconnect releases it */
    assert_int_equal(td_connect(&c, f->d.sock, "ns-lease", 0), 0);
    uint64_t left = 1;
    for (int tries = 0; tries < 100 && (left = td_stat(&c, "leases")) != 0; tries++)
        usleep(10 * 1000); /* the daemon may see the hang-up after this Hello */
    assert_int_equal(left, 0);
    td_close(&c);
}

static void test_copy_by_reference(void **state)
{
    fixture_t *f = *state;
    td_cli_t c;
    assert_int_equal(td_connect(&c, f->d.sock, "ns-copy", 1), 0);
    /* Blocks 0..5 of layer 3 except block 2: a miss in the middle of the reply (block 2
     * stored on layer 4 only, so the chain goes on past it). */
    for (uint32_t i = 0; i < NB; i++)
        if (i != 2)
            assert_int_equal(put_big(&c, "ns-copy", 3, f->tokens, i, 9), 0);
    put_small(&c, "ns-copy", 4, f->tokens, 2);
    uint32_t layer = 3;
    for (int round = 0; round < 2; round++) {
        mf_envelope_t *r = get_prefix(&c, f->tokens, &layer, 1, 0, NB, 0);
        assert_int_equal(r->body_case, MAPFLOW__V1__ENVELOPE__BODY_GET_REPLY);
        assert_int_equal(r->get_reply->n_rows, NB);
        size_t end = 0;
        for (size_t k = 0; k < NB; k++) {
            const Mapflow__V1__RowRef *ref = r->get_reply->rows[k];
            if (k == 2) {
                assert_int_equal(ref->status, MF_NOT_FOUND);
                continue;
            }
            check_copy(&c, ref, "ns-copy", f->tokens, 9);
            assert_true(ref->payload_offset >= end); /* packed in row order */
            end = ref->payload_offset + ref->length;
        }
        assert_int_equal(c.payload_len, end);
        mf_envelope_free(r);
    }
    /* A client that asks for 5 large rows and hangs up without reading: the rows the
     * reply referenced are unpinned when its buffer goes, so Evict can move them all. */
    td_cli_t q;
    assert_int_equal(td_connect(&q, f->d.sock, "ns-copy", 0), 0);
    Mapflow__V1__Get g = MAPFLOW__V1__GET__INIT;
    g.model = MODEL;
    g.block_size = B;
    g.layers = &layer;
    g.n_layers = 1;
    g.mode = MAPFLOW__V1__GET_MODE__GET_COPY;
    mf_envelope_t env = MAPFLOW__V1__ENVELOPE__INIT;
    env.body_case = MAPFLOW__V1__ENVELOPE__BODY_GET;
    env.get = &g;
    for (int k = 0; k < 4; k++)
        assert_int_equal(td_send(&q, &env, f->tokens, sizeof(f->tokens)), 0);
    usleep(100 * 1000);
    td_close(&q);
    uint64_t used = 0;
    for (int tries = 0; tries < 100; tries++) {
        Mapflow__V1__Evict ev = MAPFLOW__V1__EVICT__INIT;
        ev.tier = MAPFLOW__V1__TIER__TIER_HOST;
        ev.bytes = 1ull << 40;
        mf_envelope_t *r = td_simple(&c, MAPFLOW__V1__ENVELOPE__BODY_EVICT, &ev);
        assert_int_equal(r->body_case, MAPFLOW__V1__ENVELOPE__BODY_EVICT_REPLY);
        mf_envelope_free(r);
        if ((used = td_stat(&c, "host_used")) == 0)
            break;
        usleep(20 * 1000); /* the daemon may not have seen the hang-up yet */
    }
    assert_int_equal(used, 0);
    /* Now from the SSD tier: read into the promotion block, then from the host. */
    for (int round = 0; round < 2; round++) {
        mf_envelope_t *r = get_prefix(&c, f->tokens, &layer, 1, 3, 3, 0);
        for (size_t k = 0; k < 3; k++) {
            const Mapflow__V1__RowRef *ref = r->get_reply->rows[k];
            assert_int_equal(ref->tier, round ? MAPFLOW__V1__TIER__TIER_HOST
                                              : MAPFLOW__V1__TIER__TIER_SSD);
            check_copy(&c, ref, "ns-copy", f->tokens, 9);
        }
        mf_envelope_free(r);
    }
    assert_int_equal(td_stat(&c, "promotions_total"), 3);
    td_close(&c);
}

/* Waits (bounded) until the write-through backlog is empty. */
static void settle(td_cli_t *c)
{
    for (int tries = 0; tries < 500; tries++) {
        if (td_stat(c, "ssd_write_backlog_bytes") == 0 && td_stat(c, "ssd_inflight") == 0)
            return;
        usleep(20 * 1000);
    }
    fail_msg("write-through backlog did not drain in 10 s");
}

static void test_put_burst_async_write_through(void **state)
{
    fixture_t *f = *state;
    td_cli_t c;
    assert_int_equal(td_connect(&c, f->d.sock, "ns-burst", 1), 0);
    /* 8 MiB arena, ~128 KiB rows: 1 MiB of queued write-through at most. 20 versions of
     * 12 keys is 30 MiB of puts; none may be refused. */
    enum { VERSIONS = 20, KEYS = 12 };
    uint32_t lay[KEYS], blk[KEYS];
    for (uint32_t k = 0; k < KEYS; k++) {
        lay[k] = k / NB;
        blk[k] = k % NB;
    }
    for (unsigned v = 1; v <= VERSIONS; v++) {
        if (v % 2) /* one at a time, then pipelined */
            for (uint32_t k = 0; k < KEYS; k++)
                assert_int_equal(put_big(&c, "ns-burst", lay[k], f->tokens, blk[k], v), 0);
        else
            put_pipelined(&c, "ns-burst", lay, blk, KEYS, f->tokens, v);
    }
    settle(&c);
    uint64_t sub = td_stat(&c, "ssd_writes_total"), done = td_stat(&c, "ssd_writes_completed_total");
    uint64_t cancelled = td_stat(&c, "ssd_writes_cancelled_total");
    print_message("put burst: %llu writes submitted, %llu completed, %llu cancelled\n",
                  (unsigned long long)sub, (unsigned long long)done,
                  (unsigned long long)cancelled);
    assert_int_equal(td_stat(&c, "ssd_errors_total"), 0);
    assert_int_equal(sub, done + cancelled);
    assert_true(done >= KEYS && done <= (uint64_t)VERSIONS * KEYS);
    td_close(&c);
    /* After a restart only the SSD tier has rows: each key's last version. */
    td_stop(&f->d);
    assert_int_equal(td_start(&f->d, NULL), 0);
    assert_int_equal(td_connect(&c, f->d.sock, "ns-burst", 0), 0);
    uint32_t layers[2] = {0, 1};
    mf_envelope_t *r = get_prefix(&c, f->tokens, layers, 2, 0, NB, 0);
    assert_int_equal(r->get_reply->n_rows, KEYS);
    for (size_t k = 0; k < KEYS; k++) {
        assert_int_equal(r->get_reply->rows[k]->tier, MAPFLOW__V1__TIER__TIER_SSD);
        check_copy(&c, r->get_reply->rows[k], "ns-burst", f->tokens, VERSIONS);
    }
    mf_envelope_free(r);
    td_close(&c);
}

static void test_commit_never_drops_its_row(void **state)
{
    fixture_t *f = *state;
    td_cli_t c;
    assert_int_equal(td_connect(&c, f->d.sock, "ns-keep", 1), 0);
    /* SSD tier off, 2 MiB arena: lease every row put, until the arena is over its high
     * watermark; then one more put. Its row is the only unpinned one: the watermark
     * demotion must not drop it right after acknowledging it. */
    enum { MAX_ROWS = 32 };
    uint64_t ids[MAX_ROWS];
    size_t n_ids = 0;
    uint32_t k = 0, layer;
    uint64_t cap = 2u << 20;
    /* Blocks 1..NB-1 only: rows of one size (~128 KiB). */
    while (td_stat(&c, "host_used") < cap * 9 / 10 - (140u << 10) && k < MAX_ROWS) {
        layer = k / (NB - 1);
        assert_int_equal(put_big(&c, "ns-keep", layer, f->tokens, 1 + k % (NB - 1), 3), 0);
        mf_envelope_t *r = get_prefix(&c, f->tokens, &layer, 1, 1 + k % (NB - 1), 1, 1);
        assert_int_equal(r->get_reply->rows[0]->status, MF_OK);
        ids[n_ids++] = r->get_reply->rows[0]->lease_id;
        mf_envelope_free(r);
        k++;
    }
    layer = k / (NB - 1);
    assert_int_equal(put_big(&c, "ns-keep", layer, f->tokens, 1 + k % (NB - 1), 4), 0);
    assert_true(td_stat(&c, "host_used") > cap * 9 / 10);
    mf_envelope_t *r = get_prefix(&c, f->tokens, &layer, 1, 1 + k % (NB - 1), 1, 0);
    assert_int_equal(r->get_reply->rows[0]->status, MF_OK);
    check_copy(&c, r->get_reply->rows[0], "ns-keep", f->tokens, 4);
    mf_envelope_free(r);
    assert_int_equal(release(&c, ids, n_ids), n_ids);
    td_close(&c);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN); /* as mapflowd's main: a client hanging up is not fatal */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_lease_group_partial_release, setup, teardown),
        cmocka_unit_test_setup_teardown(test_copy_by_reference, setup, teardown),
        cmocka_unit_test_setup_teardown(test_put_burst_async_write_through, setup, teardown),
        cmocka_unit_test_setup_teardown(test_commit_never_drops_its_row, setup_no_ssd,
                                        teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
