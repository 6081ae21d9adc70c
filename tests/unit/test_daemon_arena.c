/* test_daemon_arena — the host arena's offset allocator: random alloc/free with no
 * overlap, coalescing back to one block, exhaustion, alignment, shared mapping, a put
 * region's block cut into per-row blocks. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <cmocka.h>

#include "arena.h"
#include "oalloc.h"

#define CAP (4u << 20)
#define N 600

static void test_random_no_overlap_and_coalesce(void **state)
{
    (void)state;
    mfd_arena_t *a;
    assert_int_equal(mfd_arena_create(CAP, &a), MF_OK);
    mfd_ablock_t *blk[N] = {0};
    uint8_t tag[N];
    uint8_t *base = mfd_arena_base(a);
    unsigned seed = 99;
    for (int round = 0; round < 20000; round++) {
        int i = rand_r(&seed) % N;
        if (blk[i]) {
            /* Its bytes are still its own: nobody else was handed them. */
            uint64_t off = mfd_ablock_offset(blk[i]), sz = mfd_ablock_size(blk[i]);
            for (uint64_t k = 0; k < sz; k += 61)
                assert_int_equal(base[off + k], tag[i]);
            mfd_arena_free(a, blk[i]);
            blk[i] = NULL;
        } else {
            uint64_t sz = 1 + (uint64_t)(rand_r(&seed) % 40000);
            if (mfd_arena_alloc(a, sz, &blk[i]) != MF_OK) {
                blk[i] = NULL;
                continue;
            }
            assert_int_equal(mfd_ablock_offset(blk[i]) % MFD_ARENA_ALIGN, 0);
            assert_true(mfd_ablock_size(blk[i]) >= sz);
            assert_true(mfd_ablock_offset(blk[i]) + mfd_ablock_size(blk[i]) <= CAP);
            tag[i] = (uint8_t)(1 + rand_r(&seed) % 255);
            memset(base + mfd_ablock_offset(blk[i]), tag[i], mfd_ablock_size(blk[i]));
        }
    }
    uint64_t used = 0;
    for (int i = 0; i < N; i++)
        if (blk[i])
            used += mfd_ablock_size(blk[i]);
    assert_int_equal(mfd_arena_used(a), used);
    for (int i = 0; i < N; i++)
        if (blk[i])
            mfd_arena_free(a, blk[i]);
    /* Everything coalesced back into one free block of the whole arena. */
    assert_int_equal(mfd_arena_used(a), 0);
    assert_int_equal(mfd_arena_free_blocks(a), 1);
    assert_int_equal(mfd_arena_largest_free(a), CAP);
    mfd_arena_destroy(a);
}

static void test_exhaustion_and_fragmentation(void **state)
{
    (void)state;
    mfd_arena_t *a;
    assert_int_equal(mfd_arena_create(1u << 20, &a), MF_OK);
    mfd_ablock_t *b[16];
    for (int i = 0; i < 16; i++)
        assert_int_equal(mfd_arena_alloc(a, 65536, &b[i]), MF_OK);
    mfd_ablock_t *x;
    assert_int_equal(mfd_arena_alloc(a, 1, &x), MF_RESOURCE_EXHAUSTED);
    assert_int_equal(mfd_arena_alloc(a, 0, &x), MF_INVALID_ARGUMENT);
    /* Free every other block: 512 KiB free, but no 128 KiB hole. */
    for (int i = 0; i < 16; i += 2)
        mfd_arena_free(a, b[i]);
    assert_int_equal(mfd_arena_alloc(a, 131072, &x), MF_RESOURCE_EXHAUSTED);
    assert_int_equal(mfd_arena_largest_free(a), 65536);
    /* Freeing a neighbour merges three blocks into one 192 KiB hole. */
    mfd_arena_free(a, b[1]);
    assert_int_equal(mfd_arena_largest_free(a), 3 * 65536);
    assert_int_equal(mfd_arena_alloc(a, 131072, &x), MF_OK);
    assert_int_equal(mfd_ablock_offset(x), 0);
    mfd_arena_destroy(a);
}

/* The memfd maps again (as a client would) and shows the same bytes. */
/* A put region: one block cut into per-row blocks (mfd_oalloc_split), freed in random
 * order (some right away: refused rows), used bytes exact throughout, coalescing back. */
static void test_split_region(void **state)
{
    (void)state;
    mfd_oalloc_t *o;
    assert_int_equal(mfd_oalloc_create(CAP, &o), MF_OK);
    unsigned seed = 4711;
    for (int round = 0; round < 50; round++) {
        enum { ROWS = 64 };
        uint64_t len[ROWS], total = 0;
        for (int i = 0; i < ROWS; i++)
            total += len[i] = mfd_arena_round(80 + (uint64_t)(rand_r(&seed) % 20000));
        mfd_ablock_t *lead = NULL, *pad = NULL, *b = NULL;
        /* A used neighbour on each side: the cut blocks must not merge into them. */
        assert_int_equal(mfd_oalloc_alloc(o, 4096, &lead), MF_OK);
        assert_int_equal(mfd_oalloc_alloc(o, total, &b), MF_OK);
        assert_int_equal(mfd_oalloc_alloc(o, 4096, &pad), MF_OK);
        uint64_t at = mfd_ablock_offset(b);
        mfd_ablock_t *piece[ROWS], *rest = NULL;
        assert_int_equal(mfd_oalloc_split(o, b, 0, &rest), MF_INVALID_ARGUMENT);
        assert_int_equal(mfd_oalloc_split(o, b, 100, &rest), MF_INVALID_ARGUMENT);
        assert_int_equal(mfd_oalloc_split(o, b, total, &rest), MF_INVALID_ARGUMENT);
        for (int i = 0; i < ROWS; i++) {
            piece[i] = b;
            if (i + 1 < ROWS) {
                assert_int_equal(mfd_oalloc_split(o, b, len[i], &rest), MF_OK);
                b = rest;
            }
            assert_int_equal(mfd_ablock_offset(piece[i]), at);
            assert_int_equal(mfd_ablock_size(piece[i]), len[i]);
            at += len[i];
        }
        assert_int_equal(mfd_oalloc_used(o), total + 8192);
        uint64_t freed = 0;
        for (int left = ROWS; left > 0; left--) {
            int k = rand_r(&seed) % ROWS;
            while (!piece[k])
                k = (k + 1) % ROWS;
            mfd_oalloc_free(o, piece[k]);
            freed += len[k];
            piece[k] = NULL;
            assert_int_equal(mfd_oalloc_used(o), total + 8192 - freed);
        }
        mfd_oalloc_free(o, lead);
        mfd_oalloc_free(o, pad);
        assert_int_equal(mfd_oalloc_used(o), 0);
        assert_int_equal(mfd_oalloc_free_blocks(o), 1);
        assert_int_equal(mfd_oalloc_largest_free(o), CAP);
    }
    mfd_oalloc_destroy(o);
}

static void test_shared_mapping(void **state)
{
    (void)state;
    mfd_arena_t *a;
    assert_int_equal(mfd_arena_create(1u << 20, &a), MF_OK);
    mfd_ablock_t *b;
    assert_int_equal(mfd_arena_alloc(a, 100, &b), MF_OK);
    uint8_t *view = mmap(NULL, 1u << 20, PROT_READ | PROT_WRITE, MAP_SHARED, mfd_arena_fd(a), 0);
    assert_true(view != MAP_FAILED);
    view[mfd_ablock_offset(b) + 7] = 0xab;
    assert_int_equal(mfd_arena_base(a)[mfd_ablock_offset(b) + 7], 0xab);
    munmap(view, 1u << 20);
    mfd_arena_free(a, b);
    mfd_arena_destroy(a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_random_no_overlap_and_coalesce),
        cmocka_unit_test(test_exhaustion_and_fragmentation),
        cmocka_unit_test(test_split_region),
        cmocka_unit_test(test_shared_mapping),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
