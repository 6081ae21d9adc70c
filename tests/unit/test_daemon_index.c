/* test_daemon_index — refcounted entries (pinned never freed), LRU order, namespace
 * isolation by key prefix, key encoding, sorted collection and the block nodes (their
 * layer marks and their entries, found by layer) and the key order (seek, next, collect). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "index.h"

static int g_freed;

static void on_free(mfd_entry_t *e, void *ctx)
{
    (void)e;
    (void)ctx;
    g_freed++;
}

static mfd_entry_t *make(mfd_index_t *ix, const char *ns, uint32_t layer, unsigned seed)
{
    uint8_t h[16];
    for (int i = 0; i < 16; i++)
        h[i] = (uint8_t)rand_r(&seed);
    mfd_key_t k;
    assert_int_equal(mfd_key_make(&k, ns, strlen(ns), "m", 1, layer, h), MF_OK);
    mfd_entry_t *e = mfd_entry_new(&k);
    assert_non_null(e);
    e->layer = layer;
    int replaced = -1;
    assert_int_equal(mfd_index_insert(ix, e, &replaced), MF_OK);
    assert_int_equal(replaced, 0);
    return e;
}

static void test_keys(void **state)
{
    (void)state;
    mfd_key_t k;
    uint8_t h[16] = {1, 2, 3};
    assert_int_equal(mfd_key_make(&k, "", 0, "m", 1, 0, h), MF_INVALID_ARGUMENT);
    char big[300];
    memset(big, 'a', sizeof(big));
    assert_int_equal(mfd_key_make(&k, "ns", 2, big, 256, 0, h), MF_INVALID_ARGUMENT);
    assert_int_equal(mfd_key_make(&k, "ns", 2, "model", 5, 0x01020304, h), MF_OK);
    mfd_key_parts_t p;
    assert_int_equal(mfd_key_parse(k.b, k.len, &p), MF_OK);
    assert_int_equal(p.ns_len, 2);
    assert_memory_equal(p.model, "model", 5);
    assert_int_equal(p.layer, 0x01020304);
    assert_memory_equal(p.hash, h, 16);
    assert_int_equal(mfd_key_parse(k.b, k.len - 1, &p), MF_INVALID_ARGUMENT);
    /* Layers sort numerically in byte order (big-endian). */
    mfd_key_t k2, k3;
    mfd_key_make(&k2, "ns", 2, "model", 5, 2, h);
    mfd_key_make(&k3, "ns", 2, "model", 5, 256, h);
    assert_true(mfd_key_cmp(k2.b, k2.len, k3.b, k3.len) < 0);
}

static void test_pins_and_unlink(void **state)
{
    (void)state;
    mfd_index_t *ix;
    g_freed = 0;
    assert_int_equal(mfd_index_create(on_free, NULL, &ix), MF_OK);
    mfd_entry_t *e = make(ix, "ns", 1, 7);
    mfd_entry_pin(e);
    mfd_entry_pin(e);
    mfd_key_t k = e->key;
    mfd_index_unlink(ix, e);
    /* Gone from lookup at once, memory kept while pinned. */
    assert_null(mfd_index_find(ix, k.b, k.len));
    assert_int_equal(g_freed, 0);
    mfd_index_unpin(ix, e);
    assert_int_equal(g_freed, 0);
    mfd_index_unpin(ix, e);
    assert_int_equal(g_freed, 1);
    /* Replacing a key unlinks the old entry; an unpinned one goes immediately. */
    mfd_entry_t *a = make(ix, "ns", 2, 8);
    mfd_entry_t *b = mfd_entry_new(&a->key);
    int replaced = 0;
    mfd_index_insert(ix, b, &replaced);
    assert_int_equal(replaced, 1);
    assert_int_equal(g_freed, 2);
    assert_ptr_equal(mfd_index_find(ix, b->key.b, b->key.len), b);
    assert_int_equal(mfd_index_count(ix), 1);
    mfd_index_destroy(ix);
    assert_int_equal(g_freed, 3);
}

static void test_lru_order(void **state)
{
    (void)state;
    mfd_index_t *ix;
    assert_int_equal(mfd_index_create(on_free, NULL, &ix), MF_OK);
    mfd_entry_t *e[5];
    for (int i = 0; i < 5; i++) {
        e[i] = make(ix, "ns", (uint32_t)i, 100u + (unsigned)i);
        mfd_lru_add(ix, MFD_LRU_HOST, e[i]);
    }
    /* Touch 0 and 2: the coldest-first walk is 1, 3, 4, 0, 2. */
    mfd_lru_touch(ix, MFD_LRU_HOST, e[0]);
    mfd_lru_touch(ix, MFD_LRU_HOST, e[2]);
    int want[5] = {1, 3, 4, 0, 2}, k = 0;
    for (mfd_entry_t *x = mfd_lru_coldest(ix, MFD_LRU_HOST); x; x = mfd_lru_warmer(x, MFD_LRU_HOST))
        assert_ptr_equal(x, e[want[k++]]);
    assert_int_equal(k, 5);
    /* Unlinking removes from the list; the SSD list is independent. */
    mfd_lru_add(ix, MFD_LRU_SSD, e[3]);
    mfd_index_unlink(ix, e[3]);
    k = 0;
    for (mfd_entry_t *x = mfd_lru_coldest(ix, MFD_LRU_HOST); x; x = mfd_lru_warmer(x, MFD_LRU_HOST))
        k++;
    assert_int_equal(k, 4);
    assert_null(mfd_lru_coldest(ix, MFD_LRU_SSD));
    mfd_index_destroy(ix);
}

static void test_namespace_prefix_and_sort(void **state)
{
    (void)state;
    mfd_index_t *ix;
    assert_int_equal(mfd_index_create(on_free, NULL, &ix), MF_OK);
    for (unsigned i = 0; i < 300; i++)
        make(ix, (i % 3) ? "alpha" : "alphabet", i, 1000 + i);
    /* "alpha" is a prefix of "alphabet" as text, but not as a key: the length byte differs. */
    uint8_t p1[6] = {5, 'a', 'l', 'p', 'h', 'a'};
    mfd_entry_t **v;
    size_t n;
    assert_int_equal(mfd_index_collect(ix, p1, sizeof(p1), &v, &n), MF_OK);
    assert_int_equal(n, 200);
    for (size_t i = 1; i < n; i++)
        assert_true(mfd_key_cmp(v[i - 1]->key.b, v[i - 1]->key.len, v[i]->key.b, v[i]->key.len) < 0);
    for (size_t i = 0; i < n; i++)
        assert_true(v[i]->layer % 3 != 0);
    free(v);
    mfd_index_destroy(ix);
}

/* Block nodes: one per (ns, model, hash) over every layer; a layer is marked only when its
 * noted parent + tokens equal the block's record; unlink and replace clear the mark; the
 * node goes with its last entry, and the bucket table grows without losing any. */
static void test_blocks(void **state)
{
    (void)state;
    mfd_index_t *ix;
    assert_int_equal(mfd_index_create(on_free, NULL, &ix), MF_OK);
    unsigned seed = 99;
    uint32_t t1[32], t2[32];
    uint8_t p1[16], p2[16];
    for (int i = 0; i < 32; i++) {
        t1[i] = (uint32_t)rand_r(&seed);
        t2[i] = (uint32_t)rand_r(&seed);
    }
    for (int i = 0; i < 16; i++) {
        p1[i] = (uint8_t)rand_r(&seed);
        p2[i] = (uint8_t)(p1[i] ^ (i == 7));
    }
    /* Same seed: the same hash under layers 0, 1, 2 and 300 (past the bitmap). */
    mfd_entry_t *e0 = make(ix, "ns", 0, 5), *e1 = make(ix, "ns", 1, 5);
    mfd_entry_t *e2 = make(ix, "ns", 2, 5), *e300 = make(ix, "ns", 300, 5);
    make(ix, "ns", 0, 6); /* another block */
    assert_int_equal(mfd_index_block_count(ix), 2);
    uint8_t bk[MFD_BKEY_MAX];
    size_t bl = mfd_bkey_of(e0->key.b, e0->key.len, bk);
    assert_int_equal(bl, e0->key.len - 4);
    const mfd_block_t *b = mfd_index_block_find(ix, bk, bl);
    assert_non_null(b);
    assert_false(mfd_block_matches(b, 32, p1, t1)); /* nothing recorded yet */
    assert_false(mfd_block_has_layer(b, 0));
    mfd_index_block_note(ix, e0, 32, p1, t1);
    assert_true(mfd_block_matches(b, 32, p1, t1));
    assert_false(mfd_block_matches(b, 16, p1, t1));
    assert_false(mfd_block_matches(b, 32, p2, t1));
    assert_false(mfd_block_matches(b, 32, p1, t2));
    assert_true(mfd_block_has_layer(b, 0));
    mfd_index_block_note(ix, e1, 32, p1, t2); /* differs from the record: not marked */
    mfd_index_block_note(ix, e2, 32, p2, t1);
    mfd_index_block_note(ix, e300, 32, p1, t1);
    assert_false(mfd_block_has_layer(b, 1));
    assert_false(mfd_block_has_layer(b, 2));
    assert_false(mfd_block_has_layer(b, 300));
    mfd_index_block_note(ix, e2, 32, p1, t1);
    assert_true(mfd_block_has_layer(b, 2));
    /* Replacing layer 2's entry clears its mark until the new row is noted. */
    mfd_entry_t *n2 = mfd_entry_new(&e2->key);
    mfd_index_insert(ix, n2, NULL);
    assert_ptr_equal(mfd_index_block_find(ix, bk, bl), b);
    assert_false(mfd_block_has_layer(b, 2));
    /* With no layer marked the record follows the next note. */
    mfd_index_unlink(ix, e0);
    assert_false(mfd_block_has_layer(b, 0));
    mfd_index_block_note(ix, e1, 32, p1, t2);
    assert_true(mfd_block_has_layer(b, 1));
    assert_true(mfd_block_matches(b, 32, p1, t2));
    /* A pinned, unlinked entry has left its block and is never marked again. */
    mfd_entry_pin(e1);
    mfd_index_unlink(ix, e1);
    assert_false(mfd_block_has_layer(b, 1));
    mfd_index_block_note(ix, e1, 32, p1, t2);
    assert_false(mfd_block_has_layer(b, 1));
    mfd_index_unpin(ix, e1);
    mfd_index_unlink(ix, n2);
    assert_int_equal(mfd_index_block_count(ix), 2);
    mfd_index_unlink(ix, e300);
    assert_int_equal(mfd_index_block_count(ix), 1);
    assert_null(mfd_index_block_find(ix, bk, bl));
    /* Growth: 3000 blocks x 2 layers, each found again. */
    mfd_entry_t *many[3000];
    for (unsigned i = 0; i < 3000; i++) {
        many[i] = make(ix, "grow", 0, 10000 + i);
        make(ix, "grow", 1, 10000 + i);
    }
    assert_int_equal(mfd_index_block_count(ix), 3001);
    for (unsigned i = 0; i < 3000; i++) {
        bl = mfd_bkey_of(many[i]->key.b, many[i]->key.len, bk);
        assert_non_null(mfd_index_block_find(ix, bk, bl));
    }
    mfd_index_destroy(ix);
}

/* mfd_index_block_entry answers as mfd_index_find does through random inserts, replaces
 * and unlinks (pinned ones too) over blocks of many layers, past the bitmap included. */
static void test_block_entries(void **state)
{
    (void)state;
    mfd_index_t *ix;
    assert_int_equal(mfd_index_create(on_free, NULL, &ix), MF_OK);
    enum { NBLK = 40, NLAY = 70, STEPS = 6000 };
    uint32_t layers[NLAY];
    unsigned seed = 4711;
    for (int l = 0; l < NLAY; l++) /* distinct layers, some past MFD_BLOCK_LAYERS */
        layers[l] = (uint32_t)(l * 7 + (l % 3) * 150);
    mfd_entry_t *live[NBLK][NLAY];
    memset(live, 0, sizeof(live));
    mfd_entry_t *pinned[64];
    size_t n_pinned = 0;
    for (int step = 0; step < STEPS; step++) {
        int b = rand_r(&seed) % NBLK, l = rand_r(&seed) % NLAY, op = rand_r(&seed) % 3;
        uint8_t h[16];
        unsigned hs = 777 + (unsigned)b;
        for (int i = 0; i < 16; i++)
            h[i] = (uint8_t)rand_r(&hs);
        mfd_key_t k;
        assert_int_equal(mfd_key_make(&k, "ns", 2, "m", 1, layers[l], h), MF_OK);
        if (op < 2) { /* insert or replace */
            mfd_entry_t *e = mfd_entry_new(&k);
            int replaced = -1;
            assert_int_equal(mfd_index_insert(ix, e, &replaced), MF_OK);
            assert_int_equal(replaced, live[b][l] != NULL);
            live[b][l] = e;
        } else if (live[b][l]) {
            if (n_pinned < 64 && rand_r(&seed) % 2)
                mfd_entry_pin(pinned[n_pinned++] = live[b][l]);
            mfd_index_unlink(ix, live[b][l]);
            live[b][l] = NULL;
        }
        /* Every layer of this block (and a layer never stored) agrees with the table. */
        uint8_t bk[MFD_BKEY_MAX];
        size_t bl = mfd_bkey_of(k.b, k.len, bk);
        const mfd_block_t *node = mfd_index_block_find(ix, bk, bl);
        for (int j = 0; j <= NLAY; j++) {
            uint32_t layer = j < NLAY ? layers[j] : 5; /* 5: not one of layers[] */
            mfd_key_t kj;
            mfd_key_make(&kj, "ns", 2, "m", 1, layer, h);
            mfd_entry_t *want = mfd_index_find(ix, kj.b, kj.len);
            assert_ptr_equal(mfd_index_block_entry(ix, node, layer, &kj), want);
            if (j < NLAY)
                assert_ptr_equal(want, live[b][j]);
        }
    }
    for (size_t i = 0; i < n_pinned; i++)
        mfd_index_unpin(ix, pinned[i]);
    mfd_index_destroy(ix);
}

static int cmp_keys(const void *a, const void *b)
{
    const mfd_key_t *x = a, *y = b;
    return mfd_key_cmp(x->b, x->len, y->b, y->len);
}

/* The key order (skip list) through random inserts, replaces and unlinks over three
 * namespaces: a walk from the start is every linked key, sorted; seek lands on the first
 * key after (or at) any probe; collect of a namespace or (namespace, model) is exactly its
 * keys in order. */
static void test_key_order(void **state)
{
    (void)state;
    mfd_index_t *ix;
    assert_int_equal(mfd_index_create(on_free, NULL, &ix), MF_OK);
    enum { SLOTS = 600, STEPS = 4000 };
    static mfd_entry_t *live[SLOTS];
    static mfd_key_t keys[SLOTS], sorted[SLOTS];
    static const char *const ns[3] = {"a", "ab", "b"}, *const models[2] = {"m", "m2"};
    unsigned seed = 31337;
    for (int i = 0; i < SLOTS; i++) {
        uint8_t h[16];
        for (int j = 0; j < 16; j++)
            h[j] = (uint8_t)rand_r(&seed);
        const char *n = ns[i % 3], *md = models[(i / 3) % 2];
        assert_int_equal(mfd_key_make(&keys[i], n, strlen(n), md, strlen(md),
                                      (uint32_t)rand_r(&seed) % 300, h),
                         MF_OK);
    }
    for (int step = 0; step < STEPS; step++) {
        int i = rand_r(&seed) % SLOTS;
        if (rand_r(&seed) % 3) {
            mfd_entry_t *e = mfd_entry_new(&keys[i]);
            assert_int_equal(mfd_index_insert(ix, e, NULL), MF_OK);
            live[i] = e;
        } else if (live[i]) {
            mfd_index_unlink(ix, live[i]);
            live[i] = NULL;
        }
        if (step % 500 != 499)
            continue;
        size_t n = 0;
        for (int k = 0; k < SLOTS; k++)
            if (live[k])
                sorted[n++] = keys[k];
        qsort(sorted, n, sizeof(sorted[0]), cmp_keys);
        size_t got = 0;
        for (mfd_entry_t *e = mfd_index_seek(ix, (const uint8_t *)"", 0, 1); e;
             e = mfd_index_next(e), got++) {
            assert_true(got < n);
            assert_memory_equal(e->key.b, sorted[got].b, sorted[got].len);
        }
        assert_int_equal(got, n);
        /* seek: first key > / >= a probe (a stored key, or one with its last byte off). */
        for (int t = 0; t < 50 && n; t++) {
            size_t j = (size_t)rand_r(&seed) % n;
            mfd_entry_t *ge = mfd_index_seek(ix, sorted[j].b, sorted[j].len, 1);
            mfd_entry_t *gt = mfd_index_seek(ix, sorted[j].b, sorted[j].len, 0);
            assert_non_null(ge);
            assert_memory_equal(ge->key.b, sorted[j].b, sorted[j].len);
            if (j + 1 < n)
                assert_memory_equal(gt->key.b, sorted[j + 1].b, sorted[j + 1].len);
            else
                assert_null(gt);
        }
        /* collect: namespace "a" only (not "ab"), then ("ab", "m2"). */
        uint8_t pre[16] = {1, 'a'};
        mfd_entry_t **v;
        size_t nv, want = 0;
        assert_int_equal(mfd_index_collect(ix, pre, 2, &v, &nv), MF_OK);
        for (size_t k = 0; k < n; k++)
            if (sorted[k].b[0] == 1 && sorted[k].b[1] == 'a') {
                assert_true(want < nv);
                assert_memory_equal(v[want]->key.b, sorted[k].b, sorted[k].len);
                want++;
            }
        assert_int_equal(nv, want);
        free(v);
        uint8_t pre2[16] = {2, 'a', 'b', 2, 'm', '2'};
        assert_int_equal(mfd_index_collect(ix, pre2, 6, &v, &nv), MF_OK);
        want = 0;
        for (size_t k = 0; k < n; k++)
            want += memcmp(sorted[k].b, pre2, 6) == 0;
        assert_int_equal(nv, want);
        for (size_t k = 0; k + 1 < nv; k++)
            assert_true(mfd_key_cmp(v[k]->key.b, v[k]->key.len, v[k + 1]->key.b,
                                    v[k + 1]->key.len) < 0);
        free(v);
    }
    mfd_index_destroy(ix);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_keys),
        cmocka_unit_test(test_pins_and_unlink),
        cmocka_unit_test(test_lru_order),
        cmocka_unit_test(test_namespace_prefix_and_sort),
        cmocka_unit_test(test_blocks),
        cmocka_unit_test(test_block_entries),
        cmocka_unit_test(test_key_order),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
