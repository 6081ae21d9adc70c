/*
 * test_daemon_lookup — Lookup answered through the block index (daemon/index.h): per
 * layer, only leading blocks whose row carries the request's parent and tokens count,
 * whichever layer's row recorded the block first; collided rows (the right key, another
 * context's tokens) stop only their own layer; replace, delete, flush, eviction to the
 * SSD tier and a restart keep the answers right; layers past the bitmap still work; a
 * row the block index vouches for is not read again, and Get copy still checks it; a
 * prefix Get finds its rows through the block nodes with the same answers; a block of a
 * Get's range with no stored row breaks its chain.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "rel_wire.h"
#include "test_daemon_util.h"

#define B 16
#define NB 8
#define MODEL "lk-model"
#define NS "ns-lk"

typedef struct fixture {
    td_daemon_t d;
    uint32_t tokens[NB * B];
    uint32_t other[NB * B];  /* block i's real collision partner (rel_collide_block): what
                              * a collided row of block i carries, under the same key */
    unsigned seed;
} fixture_t;

static int setup(void **state)
{
    fixture_t *f = calloc(1, sizeof(*f));
    f->seed = 4242;
    for (int i = 0; i < NB * B; i++)
        f->tokens[i] = 7 + (uint32_t)(rand_r(&f->seed) % 60000);
    for (uint32_t i = 0; i < NB; i++)
        if (rel_collide_block(f->tokens + i * B, B, f->other + i * B, rand_r(&f->seed)) != 0)
            return -1;
    if (td_start(&f->d, NULL) != 0)
        return -1;
    *state = f;
    return 0;
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

/* Puts block i of layer under the context's key; carrying `other` when collided. */
static void put(fixture_t *f, td_cli_t *c, uint32_t layer, uint32_t i, int collided)
{
    size_t size;
    unsigned s = 1000 * layer + i;
    uint8_t *row = td_row_carrying(NS, MODEL, layer, B, f->tokens, i,
                                   collided ? f->other + (size_t)i * B : NULL, &size, &s);
    assert_non_null(row);
    assert_int_equal(td_put(c, MODEL, layer, td_block_hash(NS, MODEL, B, f->tokens, i), row,
                            size, 0, NULL),
                     0);
    free(row);
}

/* Lookup of the whole context on `layers`; blocks into out[]. */
static void lookup(fixture_t *f, td_cli_t *c, const uint32_t *tokens, const uint32_t *layers,
                   size_t n, uint32_t *out)
{
    assert_int_equal(td_lookup(c, MODEL, B, tokens ? tokens : f->tokens, NB * B, layers, n, out),
                     NB);
}

/* Every layer and order: the block's record comes from a collided row (block 3, put
 * first) or from a right one (block 5, the collided row put last). */
static void test_collisions_stop_only_their_layer(void **state)
{
    fixture_t *f = *state;
    td_cli_t c;
    assert_int_equal(td_connect(&c, f->d.sock, NS, 1), 0);
    put(f, &c, 1, 3, 1);
    for (uint32_t i = 0; i < NB; i++) {
        put(f, &c, 0, i, 0);
        if (i != 3)
            put(f, &c, 1, i, 0);
        if (i != 5)
            put(f, &c, 2, i, 0);
        put(f, &c, 300, i, 0); /* past the block bitmap: the row is read every time */
    }
    put(f, &c, 2, 5, 1);
    uint32_t layers[5] = {0, 1, 2, 3, 300}, blocks[5];
    uint64_t mism0 = td_stat(&c, "hash_mismatches_total");
    for (int pass = 0; pass < 3; pass++) { /* first pass reads rows, later ones need not */
        memset(blocks, 0xff, sizeof(blocks));
        lookup(f, &c, NULL, layers, 5, blocks);
        assert_int_equal(blocks[0], NB);
        assert_int_equal(blocks[1], 3);
        assert_int_equal(blocks[2], 5);
        assert_int_equal(blocks[3], 0);
        assert_int_equal(blocks[4], NB);
    }
    assert_int_equal(td_stat(&c, "hash_mismatches_total") - mism0, 2 * 3);
    /* A request that differs from block 4 on: layer 2 now stops there, layer 1 still at 3. */
    uint32_t t2[NB * B];
    memcpy(t2, f->tokens, sizeof(t2));
    t2[4 * B + 1] ^= 0x55;
    lookup(f, &c, t2, layers, 5, blocks);
    assert_int_equal(blocks[0], 4);
    assert_int_equal(blocks[1], 3);
    assert_int_equal(blocks[2], 4);
    assert_int_equal(blocks[4], 4);
    /* The same layer twice, and a layer list in another order. */
    uint32_t again[3] = {2, 0, 2};
    lookup(f, &c, NULL, again, 3, blocks);
    assert_int_equal(blocks[0], 5);
    assert_int_equal(blocks[1], NB);
    assert_int_equal(blocks[2], 5);
    td_close(&c);
}

/* Replace, delete, flush: the block index follows the rows. */
static void test_replace_delete_flush(void **state)
{
    fixture_t *f = *state;
    td_cli_t c;
    assert_int_equal(td_connect(&c, f->d.sock, NS, 0), 0);
    for (uint32_t i = 0; i < NB; i++) {
        put(f, &c, 0, i, 0);
        put(f, &c, 1, i, 0);
    }
    uint32_t layers[2] = {0, 1}, blocks[2];
    lookup(f, &c, NULL, layers, 2, blocks);
    assert_int_equal(blocks[0], NB);
    assert_int_equal(blocks[1], NB);
    put(f, &c, 0, 2, 1); /* replaced by a collided row */
    lookup(f, &c, NULL, layers, 2, blocks);
    assert_int_equal(blocks[0], 2);
    assert_int_equal(blocks[1], NB);
    put(f, &c, 0, 2, 0); /* and back */
    lookup(f, &c, NULL, layers, 2, blocks);
    assert_int_equal(blocks[0], NB);
    /* Delete layer 1's block 6 by key. */
    uint8_t hash[16];
    mf_hash_to_le(td_block_hash(NS, MODEL, B, f->tokens, 6), hash);
    Mapflow__V1__Key key = MAPFLOW__V1__KEY__INIT;
    key.model = MODEL;
    key.layer = 1;
    key.hash.data = hash;
    key.hash.len = 16;
    Mapflow__V1__Delete del = MAPFLOW__V1__DELETE__INIT;
    del.key = &key;
    mf_envelope_t *r = td_simple(&c, MAPFLOW__V1__ENVELOPE__BODY_DELETE, &del);
    assert_non_null(r);
    assert_int_equal(r->body_case, MAPFLOW__V1__ENVELOPE__BODY_DELETE_REPLY);
    assert_int_equal(r->delete_reply->deleted, 1);
    mf_envelope_free(r);
    lookup(f, &c, NULL, layers, 2, blocks);
    assert_int_equal(blocks[0], NB);
    assert_int_equal(blocks[1], 6);
    /* Another namespace never sees these blocks. */
    td_cli_t o;
    assert_int_equal(td_connect(&o, f->d.sock, "ns-other", 0), 0);
    assert_int_equal(td_lookup(&o, MODEL, B, f->tokens, NB * B, layers, 2, blocks), NB);
    assert_int_equal(blocks[0], 0);
    td_close(&o);
    r = td_simple(&c, MAPFLOW__V1__ENVELOPE__BODY_FLUSH,
                  &(Mapflow__V1__Flush)MAPFLOW__V1__FLUSH__INIT);
    assert_int_equal(r->body_case, MAPFLOW__V1__ENVELOPE__BODY_FLUSH_REPLY);
    mf_envelope_free(r);
    lookup(f, &c, NULL, layers, 2, blocks);
    assert_int_equal(blocks[0], 0);
    assert_int_equal(blocks[1], 0);
    td_close(&c);
}

/* Rows only on the SSD tier (after Evict, after a restart) count as present, as before;
 * a Get that reads one back marks its layer again. */
static void test_ssd_rows_and_restart(void **state)
{
    fixture_t *f = *state;
    td_cli_t c;
    assert_int_equal(td_connect(&c, f->d.sock, NS, 1), 0);
    for (uint32_t i = 0; i < NB; i++)
        put(f, &c, 0, i, 0);
    put(f, &c, 1, 0, 0);
    put(f, &c, 1, 1, 1);
    Mapflow__V1__Evict ev = MAPFLOW__V1__EVICT__INIT;
    ev.tier = MAPFLOW__V1__TIER__TIER_HOST;
    ev.bytes = UINT64_MAX / 2;
    uint32_t layers[2] = {0, 1}, blocks[2];
    mf_envelope_t *r = NULL;
    for (int tries = 0; tries < 200; tries++) { /* write-through may still be in flight */
        r = td_simple(&c, MAPFLOW__V1__ENVELOPE__BODY_EVICT, &ev);
        assert_int_equal(r->body_case, MAPFLOW__V1__ENVELOPE__BODY_EVICT_REPLY);
        mf_envelope_free(r);
        if (td_stat(&c, "host_used") == 0)
            break;
        usleep(10000);
    }
    assert_int_equal(td_stat(&c, "host_used"), 0);
    lookup(f, &c, NULL, layers, 2, blocks);
    assert_int_equal(blocks[0], NB);
    assert_int_equal(blocks[1], 2); /* SSD-only rows not vouched for count as present */
    td_close(&c);

    td_stop(&f->d);
    assert_int_equal(td_start(&f->d, NULL), 0);
    assert_int_equal(td_connect(&c, f->d.sock, NS, 1), 0);
    lookup(f, &c, NULL, layers, 2, blocks);
    assert_int_equal(blocks[0], NB);
    assert_int_equal(blocks[1], 2); /* known only by key now */
    /* A Get reads the rows back: the right one is handed out, the collided one is not. */
    Mapflow__V1__Get g = MAPFLOW__V1__GET__INIT;
    g.model = MODEL;
    g.block_size = B;
    g.layers = layers;
    g.n_layers = 2;
    g.first_block = 0;
    g.n_blocks = 2;
    g.mode = MAPFLOW__V1__GET_MODE__GET_COPY;
    mf_envelope_t env = MAPFLOW__V1__ENVELOPE__INIT;
    env.body_case = MAPFLOW__V1__ENVELOPE__BODY_GET;
    env.get = &g;
    r = td_call(&c, &env, f->tokens, 2 * B * 4);
    assert_non_null(r);
    assert_int_equal(r->body_case, MAPFLOW__V1__ENVELOPE__BODY_GET_REPLY);
    assert_int_equal(r->get_reply->n_rows, 4);
    assert_int_equal(r->get_reply->rows[0]->status, MF_OK);
    assert_int_equal(r->get_reply->rows[2]->status, MF_OK);
    assert_int_equal(r->get_reply->rows[3]->status, MF_NOT_FOUND);
    mf_envelope_free(r);
    lookup(f, &c, NULL, layers, 2, blocks);
    assert_int_equal(blocks[0], NB);
    assert_int_equal(blocks[1], 1);
    td_close(&c);
}

/* A row the block index vouches for is not read by Lookup; Get copy reads it and refuses
 * it when its bytes in the arena no longer carry the request's tokens (a lease is not
 * checked here: the client checks what it reads from the arena, at the time it reads). */
static void test_vouched_rows_still_checked_by_get(void **state)
{
    fixture_t *f = *state;
    td_cli_t c;
    assert_int_equal(td_connect(&c, f->d.sock, NS, 1), 0);
    for (uint32_t i = 0; i < 2; i++)
        put(f, &c, 0, i, 0);
    uint32_t layer = 0, blocks[1];
    lookup(f, &c, NULL, &layer, 1, blocks);
    assert_int_equal(blocks[0], 2);
    /* Lease block 1 to learn where it lies, then alter one of its tokens in the arena. */
    Mapflow__V1__Get g = MAPFLOW__V1__GET__INIT;
    g.model = MODEL;
    g.block_size = B;
    g.layers = &layer;
    g.n_layers = 1;
    g.first_block = 1;
    g.n_blocks = 1;
    g.mode = MAPFLOW__V1__GET_MODE__GET_LEASE;
    mf_envelope_t env = MAPFLOW__V1__ENVELOPE__INIT;
    env.body_case = MAPFLOW__V1__ENVELOPE__BODY_GET;
    env.get = &g;
    mf_envelope_t *r = td_call(&c, &env, f->tokens, 2 * B * 4);
    assert_int_equal(r->body_case, MAPFLOW__V1__ENVELOPE__BODY_GET_REPLY);
    assert_int_equal(r->get_reply->rows[0]->status, MF_OK);
    uint8_t *row = c.arena + r->get_reply->rows[0]->arena_offset;
    uint64_t id = r->get_reply->rows[0]->lease_id;
    mf_envelope_free(r);
    const mf_row_header_t *h = (const mf_row_header_t *)row;
    size_t toff = (MF_ROW_HEADER + h->model_len + MF_ROW_ALIGN - 1) & ~(size_t)(MF_ROW_ALIGN - 1);
    row[toff] ^= 0x01;
    Mapflow__V1__Release rel = MAPFLOW__V1__RELEASE__INIT;
    rel.lease_ids = &id;
    rel.n_lease_ids = 1;
    r = td_simple(&c, MAPFLOW__V1__ENVELOPE__BODY_RELEASE, &rel);
    mf_envelope_free(r);
    lookup(f, &c, NULL, &layer, 1, blocks);
    assert_int_equal(blocks[0], 2); /* answered from the block index */
    g.mode = MAPFLOW__V1__GET_MODE__GET_COPY;
    r = td_call(&c, &env, f->tokens, 2 * B * 4);
    assert_int_equal(r->body_case, MAPFLOW__V1__ENVELOPE__BODY_GET_REPLY);
    assert_int_equal(r->get_reply->rows[0]->status, MF_NOT_FOUND);
    mf_envelope_free(r);
    td_close(&c);
}

/* The row put() stored for (layer, block i), rebuilt (same seed: the same bytes). */
static uint8_t *row_of(fixture_t *f, uint32_t layer, uint32_t i, size_t *size)
{
    unsigned s = 1000 * layer + i;
    return td_row(NS, MODEL, layer, B, f->tokens, i, size, &s);
}

/* A prefix Get finds its rows through the block nodes and skips reading the rows a
 * matching block vouches for when leasing: per (layer, block) the statuses are those of
 * the rows (a collided row NOT_FOUND, a missing layer NOT_FOUND, a layer past the bitmap
 * read and served), every lease points at exactly the stored row, and copy mode agrees. */
static void test_prefix_get_through_blocks(void **state)
{
    fixture_t *f = *state;
    td_cli_t c;
    assert_int_equal(td_connect(&c, f->d.sock, NS, 1), 0);
    for (uint32_t i = 0; i < NB; i++) {
        put(f, &c, 0, i, 0);
        put(f, &c, 1, i, i == 3); /* after layer 0's: block 3's record is the right one */
        put(f, &c, 300, i, 0);
    }
    uint32_t layers[4] = {300, 1, 3, 0};
    Mapflow__V1__Get g = MAPFLOW__V1__GET__INIT;
    g.model = MODEL;
    g.block_size = B;
    g.layers = layers;
    g.n_layers = 4;
    mf_envelope_t env = MAPFLOW__V1__ENVELOPE__INIT;
    env.body_case = MAPFLOW__V1__ENVELOPE__BODY_GET;
    env.get = &g;
    for (int pass = 0; pass < 4; pass++) { /* lease, copy, lease, copy */
        int lease = pass % 2 == 0;
        g.mode = lease ? MAPFLOW__V1__GET_MODE__GET_LEASE : MAPFLOW__V1__GET_MODE__GET_COPY;
        uint64_t mism0 = td_stat(&c, "hash_mismatches_total");
        mf_envelope_t *r = td_call(&c, &env, f->tokens, sizeof(f->tokens));
        assert_int_equal(r->body_case, MAPFLOW__V1__ENVELOPE__BODY_GET_REPLY);
        assert_int_equal(r->get_reply->n_rows, 4 * NB);
        uint64_t ids[4 * NB];
        size_t n_ids = 0;
        for (uint32_t l = 0; l < 4; l++) {
            for (uint32_t i = 0; i < NB; i++) {
                const Mapflow__V1__RowRef *ref = r->get_reply->rows[l * NB + i];
                assert_int_equal(ref->layer, layers[l]);
                assert_int_equal(ref->block, i);
                int want_ok = layers[l] != 3 && !(layers[l] == 1 && i == 3);
                assert_int_equal(ref->status, want_ok ? MF_OK : MF_NOT_FOUND);
                if (!want_ok)
                    continue;
                size_t size;
                uint8_t *want = row_of(f, layers[l], i, &size);
                assert_non_null(want);
                if (lease) {
                    assert_int_equal(ref->length, size);
                    assert_memory_equal(c.arena + ref->arena_offset, want, size);
                    ids[n_ids++] = ref->lease_id;
                } else {
                    td_assert_copy(&c, ref, want, size);
                }
                free(want);
            }
        }
        mf_envelope_free(r);
        assert_int_equal(td_stat(&c, "hash_mismatches_total") - mism0, 1);
        if (n_ids) {
            Mapflow__V1__Release rel = MAPFLOW__V1__RELEASE__INIT;
            rel.lease_ids = ids;
            rel.n_lease_ids = n_ids;
            r = td_simple(&c, MAPFLOW__V1__ENVELOPE__BODY_RELEASE, &rel);
            assert_int_equal(r->body_case, MAPFLOW__V1__ENVELOPE__BODY_RELEASE_REPLY);
            assert_int_equal(r->release_reply->released, n_ids);
            mf_envelope_free(r);
        }
    }
    td_close(&c);
}

/* Statuses of a prefix Get of blocks [first, NB) on `layers` into st[l * n + i]; leases
 * are released. Returns the number of OK rows. */
static size_t get_statuses(fixture_t *f, td_cli_t *c, const uint32_t *layers, size_t nl,
                           uint32_t first, int lease, int *st)
{
    Mapflow__V1__Get g = MAPFLOW__V1__GET__INIT;
    g.model = MODEL;
    g.block_size = B;
    g.layers = (uint32_t *)layers;
    g.n_layers = nl;
    g.first_block = first;
    g.mode = lease ? MAPFLOW__V1__GET_MODE__GET_LEASE : MAPFLOW__V1__GET_MODE__GET_COPY;
    mf_envelope_t env = MAPFLOW__V1__ENVELOPE__INIT;
    env.body_case = MAPFLOW__V1__ENVELOPE__BODY_GET;
    env.get = &g;
    mf_envelope_t *r = td_call(c, &env, f->tokens, sizeof(f->tokens));
    assert_int_equal(r->body_case, MAPFLOW__V1__ENVELOPE__BODY_GET_REPLY);
    size_t n = nl * (NB - first), ok = 0;
    assert_int_equal(r->get_reply->n_rows, n);
    for (size_t i = 0; i < n; i++) {
        const Mapflow__V1__RowRef *ref = r->get_reply->rows[i];
        st[i] = (int)ref->status;
        ok += st[i] == MF_OK;
        if (lease && st[i] == MF_OK) {
            uint64_t id = ref->lease_id;
            Mapflow__V1__Release rel = MAPFLOW__V1__RELEASE__INIT;
            rel.lease_ids = &id;
            rel.n_lease_ids = 1;
            mf_envelope_free(td_simple(c, MAPFLOW__V1__ENVELOPE__BODY_RELEASE, &rel));
        }
    }
    mf_envelope_free(r);
    return ok;
}

/* A block of the Get's range of which no row is stored breaks the chain (issue 22):
 * blocks 1.. of another context whose block 0 collides with the request's carry exactly
 * the request's parents and tokens, so only block 0 (gone from here) could tell them
 * apart; they are not served until the request's own block 0 is stored. A missing block
 * in the middle stops the blocks after it. A range that starts past a missing block
 * (first_block > 0: the caller has that head) is served from its first stored block on. */
static void test_missing_block_breaks_chain(void **state)
{
    fixture_t *f = *state;
    td_cli_t c;
    assert_int_equal(td_connect(&c, f->d.sock, NS, 1), 0);
    for (uint32_t i = 1; i < NB; i++)
        put(f, &c, 0, i, 0);
    uint32_t layer = 0;
    int st[NB];
    for (int lease = 0; lease < 2; lease++) {
        uint64_t mism0 = td_stat(&c, "hash_mismatches_total");
        assert_int_equal(get_statuses(f, &c, &layer, 1, 0, lease, st), 0);
        for (uint32_t i = 0; i < NB; i++)
            assert_int_equal(st[i], MF_NOT_FOUND);
        assert_int_equal(td_stat(&c, "hash_mismatches_total") - mism0, NB - 1);
        assert_int_equal(get_statuses(f, &c, &layer, 1, 2, lease, st), NB - 2);
    }
    put(f, &c, 0, 0, 0);
    for (int lease = 0; lease < 2; lease++) {
        assert_int_equal(get_statuses(f, &c, &layer, 1, 0, lease, st), NB);
        assert_int_equal(get_statuses(f, &c, &layer, 1, 2, lease, st), NB - 2);
    }
    /* Block 2 gone (its only row deleted): blocks 0, 1 served, 2.. not. */
    Mapflow__V1__Key key;
    uint8_t hb[16];
    td_key(&key, hb, MODEL, 0, td_block_hash(NS, MODEL, B, f->tokens, 2));
    Mapflow__V1__Delete d = MAPFLOW__V1__DELETE__INIT;
    d.key = &key;
    mf_envelope_t *r = td_simple(&c, MAPFLOW__V1__ENVELOPE__BODY_DELETE, &d);
    assert_int_equal(r->delete_reply->deleted, 1);
    mf_envelope_free(r);
    for (int lease = 0; lease < 2; lease++) {
        assert_int_equal(get_statuses(f, &c, &layer, 1, 0, lease, st), 2);
        assert_int_equal(st[0], MF_OK);
        assert_int_equal(st[1], MF_OK);
        for (uint32_t i = 2; i < NB; i++)
            assert_int_equal(st[i], MF_NOT_FOUND);
    }
    td_close(&c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_collisions_stop_only_their_layer, setup, teardown),
        cmocka_unit_test_setup_teardown(test_replace_delete_flush, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ssd_rows_and_restart, setup, teardown),
        cmocka_unit_test_setup_teardown(test_vouched_rows_still_checked_by_get, setup, teardown),
        cmocka_unit_test_setup_teardown(test_prefix_get_through_blocks, setup, teardown),
        cmocka_unit_test_setup_teardown(test_missing_block_breaks_chain, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
