/* The store's tier-blind put boundary (store.h: mfd_store_place / write / commit_slot /
 * unplace) on a real store (host tier, no GPU, no SSD): placement without a GPU tier
 * lands on the host whatever is preferred, writes land at the slot's offset and are
 * bounded by its size, a full arena refuses RESOURCE_EXHAUSTED and recovers when slots
 * go back, a valid row commits (visible, bytes equal; its view is the host block) and a
 * corrupted one is refused with its block returned. Random rows and tokens, seeded per run. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <time.h>

/* Only its row builder is used here (no daemon): its client helpers stay unused. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#include "test_daemon_util.h"
#pragma GCC diagnostic pop

#include "store.h"

typedef struct fx {
    char dir[64];
    mfd_config_t cfg;
    mfd_metrics_t m;
    mfd_store_t st;
    unsigned seed;
} fx_t;

static int setup(void **state)
{
    fx_t *f = calloc(1, sizeof(*f));
    char err[MFD_CONFIG_ERRLEN];
    snprintf(f->dir, sizeof(f->dir), "/tmp/mfd-slot-XXXXXX");
    if (!mkdtemp(f->dir))
        return -1;
    mfd_config_init(&f->cfg);
    mfd_config_set(&f->cfg, "data_dir", f->dir, 0, err, sizeof(err));
    mfd_config_set(&f->cfg, "host_bytes", "1mb", 0, err, sizeof(err));
    mfd_config_set(&f->cfg, "ssd_bytes", "0", 0, err, sizeof(err));
    mfd_config_set(&f->cfg, "gpu_bytes", "0", 0, err, sizeof(err));
    mfd_metrics_init(&f->m);
    if (mfd_store_open(&f->st, &f->cfg, &f->m, err, sizeof(err)) != MF_OK) {
        fprintf(stderr, "store: %s\n", err);
        return -1;
    }
    f->st.cfg = &f->cfg;
    f->seed = (unsigned)time(NULL);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fx_t *f = *state;
    mfd_store_close(&f->st);
    mfd_config_deinit(&f->cfg);
    rmdir(f->dir);
    free(f);
    return 0;
}

static void noop_done(void *arg, mf_status_t st, int durable)
{
    (void)arg;
    (void)st;
    (void)durable;
}

static void test_place_write_bounds(void **state)
{
    fx_t *f = *state;
    uint64_t used0 = mfd_arena_used(f->st.arena);
    for (int prefer_host = 0; prefer_host < 2; prefer_host++) {
        uint64_t size = 64 + (uint64_t)(rand_r(&f->seed) % 8192);
        mfd_slot_t s;
        assert_int_equal(mfd_store_place(&f->st, size, prefer_host, -1, &s), MF_OK);
        assert_false(s.gpu); /* no GPU tier: the host, whatever was asked */
        assert_int_equal(s.size, size);
        uint8_t *src = malloc(size);
        for (uint64_t i = 0; i < size; i++)
            src[i] = (uint8_t)rand_r(&f->seed);
        assert_int_equal(mfd_store_write(&f->st, &s, src, size), MF_OK);
        assert_memory_equal(mfd_arena_base(f->st.arena) + mfd_slot_offset(&s), src, size);
        assert_int_equal(mfd_store_write(&f->st, &s, src, size + 1), MF_INVALID_ARGUMENT);
        assert_true(mfd_arena_used(f->st.arena) > used0);
        mfd_store_unplace(&f->st, &s);
        assert_null(s.blk);
        mfd_store_unplace(&f->st, &s); /* twice is harmless */
        assert_int_equal(mfd_arena_used(f->st.arena), used0);
        free(src);
    }
}

static void test_full_arena_refuses_then_recovers(void **state)
{
    fx_t *f = *state;
    enum { MAX = 4096 };
    mfd_slot_t *s = calloc(MAX, sizeof(*s));
    uint64_t size = 4096 + (uint64_t)(rand_r(&f->seed) % 4096);
    size_t n = 0;
    mf_status_t st = MF_OK;
    while (n < MAX && (st = mfd_store_place(&f->st, size, 1, -1, &s[n])) == MF_OK)
        n++;
    assert_int_equal(st, MF_RESOURCE_EXHAUSTED); /* nothing unpinned to evict: slots only */
    assert_true(n >= (1u << 20) / (size + 4096) && n <= (1u << 20) / size);
    mfd_store_unplace(&f->st, &s[n / 2]);
    assert_int_equal(mfd_store_place(&f->st, size, 0, -1, &s[n / 2]), MF_OK);
    for (size_t i = 0; i < n; i++)
        mfd_store_unplace(&f->st, &s[i]);
    assert_int_equal(mfd_arena_used(f->st.arena), 0);
    free(s);
}

static void test_commit_valid_and_corrupt(void **state)
{
    fx_t *f = *state;
    const uint32_t B = 16;
    uint32_t tokens[4 * 16];
    for (size_t i = 0; i < 4 * B; i++)
        tokens[i] = 1 + (uint32_t)(rand_r(&f->seed) % 50000);
    uint32_t blk = (uint32_t)(rand_r(&f->seed) % 4), layer = 1 + (uint32_t)(rand_r(&f->seed) % 30);
    size_t size;
    uint8_t *row = td_row("ns", "m", layer, B, tokens, blk, &size, &f->seed);
    assert_non_null(row);
    mf_hash128_t h = td_block_hash("ns", "m", B, tokens, blk);
    uint8_t hb[16];
    mf_hash_to_le(h, hb);
    mfd_key_t key;
    assert_int_equal(mfd_key_make(&key, "ns", 2, "m", 1, layer, hb), MF_OK);

    /* Corrupted (one payload byte past the header flipped): refused, block returned. */
    uint64_t used0 = mfd_arena_used(f->st.arena);
    mfd_slot_t s;
    assert_int_equal(mfd_store_place(&f->st, size, 0, -1, &s), MF_OK);
    size_t at = MF_ROW_HEADER + (size_t)rand_r(&f->seed) % (size - MF_ROW_HEADER);
    row[at] ^= 0x5a;
    assert_int_equal(mfd_store_write(&f->st, &s, row, size), MF_OK);
    int pending, durable, replaced;
    const char *why = NULL;
    assert_int_not_equal(mfd_store_commit_slot(&f->st, &key, &s, 0, noop_done, NULL, &pending,
                                               &durable, &replaced, &why),
                         MF_OK);
    assert_null(s.blk);
    assert_non_null(why);
    assert_null(mfd_store_find(&f->st, &key));
    assert_int_equal(mfd_arena_used(f->st.arena), used0);

    /* The same row intact: visible, on the host, its bytes. */
    row[at] ^= 0x5a;
    assert_int_equal(mfd_store_place(&f->st, size, 0, -1, &s), MF_OK);
    assert_int_equal(mfd_store_write(&f->st, &s, row, size), MF_OK);
    assert_int_equal(mfd_store_commit_slot(&f->st, &key, &s, 0, noop_done, NULL, &pending,
                                           &durable, &replaced, &why),
                     MF_OK);
    assert_null(s.blk);
    assert_int_equal(pending, 0);
    assert_int_equal(replaced, 0);
    mfd_entry_t *e = mfd_store_find(&f->st, &key);
    assert_non_null(e);
    assert_non_null(e->host);
    assert_int_equal(e->size, size);
    assert_memory_equal(mfd_store_bytes(&f->st, e), row, size);

    /* Its view, either mode, with any GPU mask: the host block itself (nothing owned). */
    for (int lease = 0; lease < 2; lease++) {
        mfd_view_t v;
        assert_int_equal(mfd_store_view(&f->st, e, lease, (uint64_t)rand_r(&f->seed), &v),
                         MF_OK);
        assert_int_equal(v.tier, MAPFLOW__V1__TIER__TIER_HOST);
        assert_false(v.need_read);
        assert_null(v.owned);
        assert_ptr_equal(v.bytes, mfd_store_bytes(&f->st, e));
    }
    free(row);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_place_write_bounds, setup, teardown),
        cmocka_unit_test_setup_teardown(test_full_arena_refuses_then_recovers, setup, teardown),
        cmocka_unit_test_setup_teardown(test_commit_valid_and_corrupt, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
