/*
 * test_daemon_server — drives mapflowd's request handlers in-process: a real server
 * (mfd_server_t) runs in a thread on a unix socket in a temp dir and the tests speak
 * the wire protocol to it. Covers Hello + arena fd, two-phase put (arena and payload),
 * row validation, Lookup, Get (copy and lease), Release, namespaces, protocol errors,
 * durability across a restart, watermark demotion, List paging, config, profiles,
 * frame_timeout (a client stuck mid-frame is closed, others are not).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <poll.h>

#include "test_daemon_util.h"

#define B 16
#define NB 4
#define MODEL "src-model"

typedef struct fixture {
    td_daemon_t d;
    uint32_t tokens[NB * B + 8]; /* 8 extra: a partial block Lookup ignores */
    unsigned seed;
} fixture_t;

static int setup(void **state)
{
    fixture_t *f = calloc(1, sizeof(*f));
    f->seed = 12345;
    for (int i = 0; i < NB * B + 8; i++)
        f->tokens[i] = 1000 + (uint32_t)(rand_r(&f->seed) % 50000);
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

/* Puts one row; returns the commit reply's status (0 = OK) and fills *durable. */
static int put_row(td_cli_t *c, const char *ns, uint32_t layer, const uint32_t *tokens,
                   uint32_t i, int durable, int *got_durable, unsigned *seed, int corrupt)
{
    size_t size;
    uint8_t *row = td_row(ns, MODEL, layer, B, tokens, i, &size, seed);
    if (!row)
        return -1;
    if (corrupt)
        row[size - 1] ^= 0x5a;
    int rc = td_put(c, MODEL, layer, td_block_hash(ns, MODEL, B, tokens, i), row, size,
                    durable, got_durable);
    free(row);
    return rc;
}

/* Puts blocks 0..n-1 of one layer (row seeds seed0 + i); returns the rows' total bytes. */
static uint32_t put_counted(td_cli_t *c, const char *ns, uint32_t layer, const uint32_t *tokens,
                            uint32_t n, unsigned seed0)
{
    uint32_t bytes = 0;
    for (uint32_t i = 0; i < n; i++) {
        size_t size;
        unsigned s = seed0 + i;
        uint8_t *row = td_row(ns, MODEL, layer, B, tokens, i, &size, &s);
        assert_non_null(row);
        bytes += (uint32_t)size;
        free(row);
        s = seed0 + i;
        assert_int_equal(put_row(c, ns, layer, tokens, i, 0, NULL, &s, 0), 0);
    }
    return bytes;
}

/* Lookup → blocks per layer into out[]; returns total_blocks. */
static int lookup(td_cli_t *c, const uint32_t *tokens, size_t n_tok, const uint32_t *layers,
                  size_t n_layers, uint32_t *out)
{
    return td_lookup(c, MODEL, B, tokens, n_tok, layers, n_layers, out);
}

static mf_envelope_t *get_rows(td_cli_t *c, const uint32_t *tokens, size_t n_tok,
                               const uint32_t *layers, size_t n_layers, uint32_t first,
                               uint32_t n, int lease)
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
    return td_call(c, &env, tokens, n_tok * 4);
}

/* Checks a GET_COPY row against a freshly built copy of what was put. */
static void check_copy_row(const td_cli_t *c, const Mapflow__V1__RowRef *ref, const char *ns,
                           const uint32_t *tokens, unsigned seed_at_put)
{
    unsigned s = seed_at_put;
    size_t size;
    uint8_t *want = td_row(ns, MODEL, ref->layer, B, tokens, ref->block, &size, &s);
    td_assert_copy(c, ref, want, size);
    free(want);
}

/* A one-layer profile MODEL → "tgt" (heads × heads weights w) and its ProfilePut, all in
 * the struct (pp points into it: do not copy the struct, copy pp). */
typedef struct one_profile {
    float w[4];
    Mapflow__V1__LayerMap lm;
    Mapflow__V1__LayerMap *lms[1];
    Mapflow__V1__MappingProfile mp;
    Mapflow__V1__ProfilePut pp;
} one_profile_t;

static void one_profile_init(one_profile_t *p, uint32_t target_layer, uint32_t source_layer,
                             uint32_t heads, const float *w)
{
    memcpy(p->w, w, (size_t)heads * heads * sizeof(float));
    p->lm = (Mapflow__V1__LayerMap)MAPFLOW__V1__LAYER_MAP__INIT;
    p->lm.target_layer = target_layer;
    p->lm.source_layer = source_layer;
    p->lm.target_heads = p->lm.source_heads = heads;
    p->lm.w = p->w;
    p->lm.n_w = (size_t)heads * heads;
    p->lms[0] = &p->lm;
    p->mp = (Mapflow__V1__MappingProfile)MAPFLOW__V1__MAPPING_PROFILE__INIT;
    p->mp.source_model = MODEL;
    p->mp.target_model = "tgt";
    p->mp.block_size = B;
    p->mp.n_layers = 1;
    p->mp.layers = p->lms;
    p->pp = (Mapflow__V1__ProfilePut)MAPFLOW__V1__PROFILE_PUT__INIT;
    p->pp.profile = &p->mp;
}

/* ---- tests ---------------------------------------------------------------------------- */

static void test_put_lookup_get_lease(void **state)
{
    fixture_t *f = *state;
    td_cli_t c;
    assert_int_equal(td_connect(&c, f->d.sock, "ns-a", 1), 0);
    assert_non_null(c.arena);
    /* Each row's masses come from its own seed so the test can rebuild it. */
    for (uint32_t l = 0; l < 2; l++)
        for (uint32_t i = 0; i < NB; i++) {
            unsigned s = 100 * l + i;
            assert_int_equal(put_row(&c, "ns-a", l, f->tokens, i, 0, NULL, &s, 0), 0);
        }
    uint32_t layers[3] = {0, 1, 7}, blocks[3];
    assert_int_equal(lookup(&c, f->tokens, NB * B + 5, layers, 3, blocks), NB);
    assert_int_equal(blocks[0], NB);
    assert_int_equal(blocks[1], NB);
    assert_int_equal(blocks[2], 0);
    /* A different token in block 2 changes its hash and every later one. */
    uint32_t t2[NB * B];
    memcpy(t2, f->tokens, sizeof(t2));
    t2[2 * B + 3] ^= 1;
    assert_int_equal(lookup(&c, t2, NB * B, layers, 2, blocks), NB);
    assert_int_equal(blocks[0], 2);
    assert_int_equal(blocks[1], 2);

    mf_envelope_t *r = get_rows(&c, f->tokens, NB * B, layers, 2, 1, 2, 0);
    assert_non_null(r);
    assert_int_equal(r->body_case, MAPFLOW__V1__ENVELOPE__BODY_GET_REPLY);
    assert_int_equal(r->get_reply->n_rows, 4);
    for (size_t k = 0; k < 4; k++) {
        const Mapflow__V1__RowRef *ref = r->get_reply->rows[k];
        assert_int_equal(ref->layer, layers[k / 2]);      /* layer-major */
        assert_int_equal(ref->block, 1 + k % 2);
        check_copy_row(&c, ref, "ns-a", f->tokens, 100 * ref->layer + ref->block);
    }
    mf_envelope_free(r);

    r = get_rows(&c, f->tokens, NB * B, layers, 1, 0, 0, 1);
    assert_non_null(r);
    assert_int_equal(r->body_case, MAPFLOW__V1__ENVELOPE__BODY_GET_REPLY);
    assert_int_equal(r->get_reply->n_rows, NB);
    assert_true(r->get_reply->lease_ttl_ms > 0);
    uint64_t ids[NB];
    for (size_t k = 0; k < NB; k++) {
        const Mapflow__V1__RowRef *ref = r->get_reply->rows[k];
        assert_int_equal(ref->status, MF_OK);
        assert_int_not_equal(ref->lease_id, 0);
        unsigned s = (unsigned)k;
        size_t size;
        uint8_t *want = td_row("ns-a", MODEL, 0, B, f->tokens, (uint32_t)k, &size, &s);
        assert_memory_equal(c.arena + ref->arena_offset, want, size);
        free(want);
        ids[k] = ref->lease_id;
    }
    mf_envelope_free(r);
    /* Leased rows are pinned: Flush drops everything else. */
    r = td_simple(&c, MAPFLOW__V1__ENVELOPE__BODY_FLUSH, &(Mapflow__V1__Flush)MAPFLOW__V1__FLUSH__INIT);
    assert_int_equal(r->body_case, MAPFLOW__V1__ENVELOPE__BODY_FLUSH_REPLY);
    assert_int_equal(r->flush_reply->entries, NB); /* layer 1's rows */
    mf_envelope_free(r);
    Mapflow__V1__Release rel = MAPFLOW__V1__RELEASE__INIT;
    uint64_t bogus[NB + 1];
    memcpy(bogus, ids, sizeof(ids));
    bogus[NB] = 999999;
    rel.lease_ids = bogus;
    rel.n_lease_ids = NB + 1;
    r = td_simple(&c, MAPFLOW__V1__ENVELOPE__BODY_RELEASE, &rel);
    assert_int_equal(r->release_reply->released, NB);
    mf_envelope_free(r);
    td_close(&c);
}

static void test_payload_put_and_validation(void **state)
{
    fixture_t *f = *state;
    td_cli_t c;
    unsigned s = 7;
    assert_int_equal(td_connect(&c, f->d.sock, "ns-b", 0), 0);
    assert_null(c.arena);
    assert_int_equal(put_row(&c, "ns-b", 3, f->tokens, 0, 0, NULL, &s, 0), 0);
    /* A flipped byte fails the checksum: DATA_LOSS, and nothing becomes visible. */
    assert_int_equal(put_row(&c, "ns-b", 3, f->tokens, 1, 0, NULL, &s, 1), MF_DATA_LOSS);
    uint32_t layer = 3, blocks[1];
    assert_int_equal(lookup(&c, f->tokens, NB * B, &layer, 1, blocks), NB);
    assert_int_equal(blocks[0], 1);
    /* GET_LEASE needs the arena. */
    mf_envelope_t *r = get_rows(&c, f->tokens, NB * B, &layer, 1, 0, 1, 1);
    assert_int_equal(r->body_case, MAPFLOW__V1__ENVELOPE__BODY_ERROR);
    assert_int_equal(r->error->code, MF_FAILED_PRECONDITION);
    mf_envelope_free(r);
    /* Tokens that do not cover the requested blocks. */
    r = get_rows(&c, f->tokens, B, &layer, 1, 0, 2, 0);
    assert_int_equal(r->error->code, MF_INVALID_ARGUMENT);
    mf_envelope_free(r);
    /* Get of a missing block: per-row NOT_FOUND. */
    r = get_rows(&c, f->tokens, NB * B, &layer, 1, 0, 2, 0);
    assert_int_equal(r->get_reply->rows[0]->status, MF_OK);
    assert_int_equal(r->get_reply->rows[1]->status, MF_NOT_FOUND);
    mf_envelope_free(r);
    /* Another namespace sees nothing. */
    td_cli_t o;
    assert_int_equal(td_connect(&o, f->d.sock, "ns-other", 0), 0);
    assert_int_equal(lookup(&o, f->tokens, NB * B, &layer, 1, blocks), NB);
    assert_int_equal(blocks[0], 0);
    td_close(&o);
    td_close(&c);
}

static void test_protocol_errors(void **state)
{
    fixture_t *f = *state;
    td_cli_t c;
    /* First frame not Hello: FAILED_PRECONDITION, then the daemon closes. */
    assert_int_equal(td_raw_connect(&c, f->d.sock), 0);
    mf_envelope_t *r = td_simple(&c, MAPFLOW__V1__ENVELOPE__BODY_HEALTH,
                              &(Mapflow__V1__Health)MAPFLOW__V1__HEALTH__INIT);
    assert_non_null(r);
    assert_int_equal(r->error->code, MF_FAILED_PRECONDITION);
    mf_envelope_free(r);
    assert_null(td_recv(&c, NULL));
    td_close(&c);
    /* A frame longer than max_frame: RESOURCE_EXHAUSTED, then closed. */
    assert_int_equal(td_connect(&c, f->d.sock, "ns", 0), 0);
    uint8_t bad[8] = {0xff, 0xff, 0xff, 0x7f, 0, 0, 0, 0};
    assert_int_equal(send(c.fd, bad, 8, MSG_NOSIGNAL), 8);
    r = td_recv(&c, NULL);
    assert_non_null(r);
    assert_int_equal(r->error->code, MF_RESOURCE_EXHAUSTED);
    mf_envelope_free(r);
    assert_null(td_recv(&c, NULL));
    td_close(&c);
    /* A reply-only body is UNIMPLEMENTED and the connection stays usable. */
    assert_int_equal(td_connect(&c, f->d.sock, "ns", 0), 0);
    r = td_simple(&c, MAPFLOW__V1__ENVELOPE__BODY_FLUSH_REPLY,
               &(Mapflow__V1__FlushReply)MAPFLOW__V1__FLUSH_REPLY__INIT);
    assert_int_equal(r->error->code, MF_UNIMPLEMENTED);
    mf_envelope_free(r);
    r = td_simple(&c, MAPFLOW__V1__ENVELOPE__BODY_HEALTH,
               &(Mapflow__V1__Health)MAPFLOW__V1__HEALTH__INIT);
    assert_int_equal(r->body_case, MAPFLOW__V1__ENVELOPE__BODY_HEALTH_REPLY);
    assert_true(r->health_reply->ready);
    mf_envelope_free(r);
    td_close(&c);
    /* Namespace too long. */
    char ns[200];
    memset(ns, 'x', sizeof(ns) - 1);
    ns[sizeof(ns) - 1] = 0;
    assert_int_equal(td_connect(&c, f->d.sock, ns, 0), MF_INVALID_ARGUMENT);
    td_close(&c);
}

static void test_durable_survives_restart(void **state)
{
    fixture_t *f = *state;
    td_cli_t c;
    assert_int_equal(td_connect(&c, f->d.sock, "ns-d", 1), 0);
    for (uint32_t i = 0; i < NB; i++) {
        unsigned s = 500 + i;
        int durable = 0;
        assert_int_equal(put_row(&c, "ns-d", 2, f->tokens, i, 1, &durable, &s, 0), 0);
        assert_int_equal(durable, 1);
    }
    td_close(&c);
    td_stop(&f->d);
    assert_int_equal(td_start(&f->d, NULL), 0);
    assert_int_equal(td_connect(&c, f->d.sock, "ns-d", 0), 0);
    uint32_t layer = 2, blocks[1];
    assert_int_equal(lookup(&c, f->tokens, NB * B, &layer, 1, blocks), NB);
    assert_int_equal(blocks[0], NB);
    mf_envelope_t *r = get_rows(&c, f->tokens, NB * B, &layer, 1, 0, 0, 0);
    assert_int_equal(r->get_reply->n_rows, NB);
    for (size_t k = 0; k < NB; k++) {
        assert_int_equal(r->get_reply->rows[k]->tier, MAPFLOW__V1__TIER__TIER_SSD);
        check_copy_row(&c, r->get_reply->rows[k], "ns-d", f->tokens, 500 + (unsigned)k);
    }
    mf_envelope_free(r);
    /* Promoted by that hit: the second read comes from the host tier. */
    r = get_rows(&c, f->tokens, NB * B, &layer, 1, 0, 1, 0);
    assert_int_equal(r->get_reply->rows[0]->tier, MAPFLOW__V1__TIER__TIER_HOST);
    mf_envelope_free(r);
    td_close(&c);
}

static void test_admin_list_config_profile(void **state)
{
    fixture_t *f = *state;
    td_cli_t c;
    assert_int_equal(td_connect(&c, f->d.sock, "ns-l", 0), 0);
    for (uint32_t l = 0; l < 2; l++)
        for (uint32_t i = 0; i < NB; i++) {
            unsigned s = l * 10 + i;
            assert_int_equal(put_row(&c, "ns-l", l, f->tokens, i, 0, NULL, &s, 0), 0);
        }
    /* Pages of 3 over 8 entries: 3 + 3 + 2, strictly rising keys, no repeats. */
    Mapflow__V1__List ls = MAPFLOW__V1__LIST__INIT;
    ls.page_size = 3;
    size_t seen = 0, pages = 0;
    uint8_t token[MFD_KEY_MAX];
    size_t tlen = 0;
    uint32_t last_layer = 0;
    do {
        ls.page_token.data = token;
        ls.page_token.len = tlen;
        mf_envelope_t *r = td_simple(&c, MAPFLOW__V1__ENVELOPE__BODY_LIST, &ls);
        assert_int_equal(r->body_case, MAPFLOW__V1__ENVELOPE__BODY_LIST_REPLY);
        for (size_t k = 0; k < r->list_reply->n_entries; k++) {
            assert_true(r->list_reply->entries[k]->key->layer >= last_layer);
            last_layer = r->list_reply->entries[k]->key->layer;
        }
        seen += r->list_reply->n_entries;
        tlen = r->list_reply->next_page_token.len;
        assert_true(tlen <= sizeof(token));
        if (tlen)
            memcpy(token, r->list_reply->next_page_token.data, tlen);
        pages++;
        mf_envelope_free(r);
    } while (tlen && pages < 10);
    assert_int_equal(seen, 2 * NB);
    assert_int_equal(pages, 3);
    /* Filter by layer, then delete that layer. */
    ls.page_size = 0;
    ls.page_token.len = 0;
    ls.has_layer = 1;
    ls.layer = 1;
    mf_envelope_t *r = td_simple(&c, MAPFLOW__V1__ENVELOPE__BODY_LIST, &ls);
    assert_int_equal(r->list_reply->n_entries, NB);
    mf_envelope_free(r);
    Mapflow__V1__Delete del = MAPFLOW__V1__DELETE__INIT;
    del.model = MODEL;
    del.has_layer = 1;
    del.layer = 1;
    r = td_simple(&c, MAPFLOW__V1__ENVELOPE__BODY_DELETE, &del);
    assert_int_equal(r->delete_reply->deleted, NB);
    mf_envelope_free(r);

    /* Config: a tenant may not set; on the admin socket a live key is set, a non-live one
     * refused, a bad value refused; get reads back. */
    Mapflow__V1__ConfigSet cs = MAPFLOW__V1__CONFIG_SET__INIT;
    cs.key = "lease_ttl";
    cs.value = "1500ms";
    r = td_simple(&c, MAPFLOW__V1__ENVELOPE__BODY_CONFIG_SET, &cs);
    assert_int_equal(r->error->code, MF_PERMISSION_DENIED);
    mf_envelope_free(r);
    td_cli_t tenant = c;
    assert_int_equal(td_connect(&c, f->d.admin, "ns-l", 0), 0);
    r = td_simple(&c, MAPFLOW__V1__ENVELOPE__BODY_CONFIG_SET, &cs);
    assert_int_equal(r->body_case, MAPFLOW__V1__ENVELOPE__BODY_CONFIG_SET_REPLY);
    assert_string_equal(r->config_set_reply->item->value, "1500ms");
    mf_envelope_free(r);
    cs.key = "host_bytes";
    cs.value = "1gb";
    r = td_simple(&c, MAPFLOW__V1__ENVELOPE__BODY_CONFIG_SET, &cs);
    assert_int_equal(r->error->code, MF_FAILED_PRECONDITION);
    mf_envelope_free(r);
    cs.key = "high_watermark";
    cs.value = "1.5";
    r = td_simple(&c, MAPFLOW__V1__ENVELOPE__BODY_CONFIG_SET, &cs);
    assert_int_equal(r->error->code, MF_INVALID_ARGUMENT);
    mf_envelope_free(r);
    Mapflow__V1__ConfigGet cg = MAPFLOW__V1__CONFIG_GET__INIT;
    cg.key = "";
    r = td_simple(&c, MAPFLOW__V1__ENVELOPE__BODY_CONFIG_GET, &cg);
    assert_int_equal(r->config_get_reply->n_items, mfd_config_count());
    mf_envelope_free(r);

    /* Profiles: NOT_FOUND, put, get back equal. */
    Mapflow__V1__ProfileGet pg = MAPFLOW__V1__PROFILE_GET__INIT;
    pg.source_model = MODEL;
    pg.target_model = "tgt";
    r = td_simple(&c, MAPFLOW__V1__ENVELOPE__BODY_PROFILE_GET, &pg);
    assert_int_equal(r->error->code, MF_NOT_FOUND);
    mf_envelope_free(r);
    const float w[4] = {0.25f, 0.75f, 1.0f, 0.0f};
    one_profile_t op;
    one_profile_init(&op, 5, 9, 2, w);
    op.mp.l0 = 2;
    Mapflow__V1__ProfilePut pp = op.pp;
    r = td_simple(&tenant, MAPFLOW__V1__ENVELOPE__BODY_PROFILE_PUT, &pp);
    assert_int_equal(r->error->code, MF_PERMISSION_DENIED);
    mf_envelope_free(r);
    r = td_simple(&c, MAPFLOW__V1__ENVELOPE__BODY_PROFILE_PUT, &pp);
    assert_int_equal(r->body_case, MAPFLOW__V1__ENVELOPE__BODY_PROFILE_PUT_REPLY);
    mf_envelope_free(r);
    r = td_simple(&c, MAPFLOW__V1__ENVELOPE__BODY_PROFILE_GET, &pg);
    assert_int_equal(r->body_case, MAPFLOW__V1__ENVELOPE__BODY_PROFILE_GET_REPLY);
    assert_int_equal(r->profile_get_reply->profile->layers[0]->source_layer, 9);
    assert_true(r->profile_get_reply->profile->layers[0]->w[1] == 0.75f);
    mf_envelope_free(r);
    op.w[1] = 0.5f; /* row no longer sums to 1 */
    r = td_simple(&c, MAPFLOW__V1__ENVELOPE__BODY_PROFILE_PUT, &pp);
    assert_int_equal(r->error->code, MF_INVALID_ARGUMENT);
    mf_envelope_free(r);
    td_close(&c);
    td_close(&tenant);
}

/* Profiles live in the SSD tier (daemon/profiles.c): with it off, put / get / list are
 * refused UNAVAILABLE saying why, and the connection keeps serving. */
static void test_profiles_need_ssd(void **state)
{
    fixture_t *f = *state;
    td_stop(&f->d);
    const char *extra[] = {"ssd_bytes", "0", NULL};
    assert_int_equal(td_start(&f->d, extra), 0);
    td_cli_t c;
    assert_int_equal(td_connect(&c, f->d.admin, "ns-p", 0), 0);
    const float w[1] = {1.0f};
    one_profile_t op;
    one_profile_init(&op, 1 + rand_r(&f->seed) % 30, rand_r(&f->seed) % 30, 1, w);
    Mapflow__V1__ProfilePut pp = op.pp;
    Mapflow__V1__ProfileGet pg = MAPFLOW__V1__PROFILE_GET__INIT;
    pg.source_model = MODEL;
    pg.target_model = "tgt";
    Mapflow__V1__ProfileList pl = MAPFLOW__V1__PROFILE_LIST__INIT;
    const struct { int body; void *msg; } calls[] = {
        {MAPFLOW__V1__ENVELOPE__BODY_PROFILE_PUT, &pp},
        {MAPFLOW__V1__ENVELOPE__BODY_PROFILE_GET, &pg},
        {MAPFLOW__V1__ENVELOPE__BODY_PROFILE_LIST, &pl},
    };
    for (size_t i = 0; i < 3; i++) {
        mf_envelope_t *r = td_simple(&c, calls[i].body, calls[i].msg);
        assert_non_null(r);
        assert_int_equal(r->body_case, MAPFLOW__V1__ENVELOPE__BODY_ERROR);
        assert_int_equal(r->error->code, MF_UNAVAILABLE);
        assert_non_null(strstr(r->error->message, "SSD tier, which is off"));
        mf_envelope_free(r);
    }
    Mapflow__V1__Health h = MAPFLOW__V1__HEALTH__INIT;
    mf_envelope_t *r = td_simple(&c, MAPFLOW__V1__ENVELOPE__BODY_HEALTH, &h);
    assert_int_equal(r->body_case, MAPFLOW__V1__ENVELOPE__BODY_HEALTH_REPLY);
    mf_envelope_free(r);
    td_close(&c);
}

static void test_watermark_demotion(void **state)
{
    fixture_t *f = *state;
    td_stop(&f->d);
    /* A 1 MiB arena and 6000 rows of 256 bytes (1.5 MiB): demotion must run. */
    const char *extra[] = {"host_bytes", "1mb", "write_through", "off", NULL};
    assert_int_equal(td_start(&f->d, extra), 0);
    td_cli_t c;
    assert_int_equal(td_connect(&c, f->d.sock, "ns-w", 0), 0);
    enum { NT = 6000 * B };
    uint32_t *tok = malloc(NT * sizeof(uint32_t));
    for (int i = 0; i < NT; i++)
        tok[i] = (uint32_t)rand_r(&f->seed);
    for (uint32_t i = 0; i < NT / B; i++) {
        unsigned s = i;
        assert_int_equal(put_row(&c, "ns-w", 0, tok, i, 0, NULL, &s, 0), 0);
    }
    mfd_server_t *srv = f->d.srv;
    /* Read the counters through Stats (the loop thread owns them). */
    mf_envelope_t *r = td_admin_stats(&c); /* daemon-wide: the admin socket's */
    uint64_t demotions = 0;
    for (size_t k = 0; k < r->stats_reply->n_counters; k++)
        if (!strcmp(r->stats_reply->counters[k]->name, "demotions_total"))
            demotions = r->stats_reply->counters[k]->value;
    assert_true(demotions > 0);
    const Mapflow__V1__TierStats *host = r->stats_reply->tiers[1];
    assert_true(host->used_bytes <= (uint64_t)(0.9 * (double)host->capacity_bytes) + 4096);
    mf_envelope_free(r);
    (void)srv;
    /* Every block is still found and served: cold ones come back from the SSD tier. */
    uint32_t layer = 0, blocks[1];
    assert_int_equal(lookup(&c, tok, NT, &layer, 1, blocks), NT / B);
    assert_int_equal(blocks[0], NT / B);
    r = get_rows(&c, tok, NT, &layer, 1, 0, 8, 0);
    for (size_t k = 0; k < 8; k++)
        check_copy_row(&c, r->get_reply->rows[k], "ns-w", tok, (unsigned)k);
    mf_envelope_free(r);
    free(tok);
    td_close(&c);
}

/* frame_timeout: a client that sent 3 bytes of a frame header and stopped is closed (and
 * counted), while a client that completes its frames, or sends nothing, keeps working. */
static void test_frame_timeout(void **state)
{
    fixture_t *f = *state;
    td_stop(&f->d);
    const char *extra[] = {"frame_timeout", "300ms", NULL};
    assert_int_equal(td_start(&f->d, extra), 0);
    td_cli_t ok, idle, stuck;
    assert_int_equal(td_connect(&ok, f->d.sock, "ns-t", 0), 0);
    assert_int_equal(td_connect(&idle, f->d.sock, "ns-t", 0), 0);
    assert_int_equal(td_raw_connect(&stuck, f->d.sock), 0);
    /* The first 3 bytes of a real frame: a header the daemon must wait for. */
    Mapflow__V1__Hello h = MAPFLOW__V1__HELLO__INIT;
    h.protocol_version = 1;
    h.client_name = "stuck";
    mf_envelope_t env = MAPFLOW__V1__ENVELOPE__INIT;
    env.body_case = MAPFLOW__V1__ENVELOPE__BODY_HELLO;
    env.hello = &h;
    env.request_id = 1 + (uint64_t)(rand_r(&f->seed) % 1000);
    uint8_t *buf;
    size_t len;
    assert_int_equal(mf_frame_encode(&env, NULL, 0, MF_FRAME_DEFAULT_MAX, &buf, &len), MF_OK);
    assert_int_equal(send(stuck.fd, buf, 3, MSG_NOSIGNAL), 3);
    free(buf);
    /* Wait (bounded: 20 s) for the daemon to close `stuck`; `ok` is served meanwhile. */
    int closed = 0, served = 0;
    for (int i = 0; i < 400 && !closed; i++) {
        struct pollfd p = {stuck.fd, POLLIN, 0};
        if (poll(&p, 1, 50) == 1) {
            char b;
            closed = recv(stuck.fd, &b, 1, 0) == 0;
        }
        td_stat(&ok, "connections_accepted_total");
        served++;
    }
    assert_true(closed);
    assert_true(served > 0);
    assert_int_equal(td_stat(&ok, "connections_closed_total{reason=\"frame_timeout\"}"), 1);
    /* A connection with no partial frame is not timed out however long it idles. */
    assert_int_equal(td_stat(&idle, "connections_closed_total{reason=\"frame_timeout\"}"), 1);
    td_close(&stuck);
    td_close(&idle);
    td_close(&ok);
}

/* The counters and tiers of one StatsReply (n counters by name; tier used / entries). */
static uint64_t stat_of(const mf_envelope_t *r, const char *name)
{
    for (size_t k = 0; k < r->stats_reply->n_counters; k++)
        if (!strcmp(r->stats_reply->counters[k]->name, name))
            return r->stats_reply->counters[k]->value;
    return UINT64_MAX;
}

static const Mapflow__V1__TierStats *tier_of(const mf_envelope_t *r, Mapflow__V1__Tier t)
{
    for (size_t k = 0; k < r->stats_reply->n_tiers; k++)
        if (r->stats_reply->tiers[k]->tier == t)
            return r->stats_reply->tiers[k];
    fail_msg("no tier %d", (int)t);
    return NULL;
}

/* Stats of a tenant covers its own namespace (issue 22): its rows, bytes and leases, per
 * tier its rows and bytes, its connections, and no daemon-wide counter; the admin socket
 * still gets the daemon's. Two tenants with random, different row counts. */
static void test_stats_per_namespace(void **state)
{
    fixture_t *f = *state;
    td_cli_t a, a2, b;
    assert_int_equal(td_connect(&a, f->d.sock, "ns-sa", 1), 0);
    assert_int_equal(td_connect(&a2, f->d.sock, "ns-sa", 0), 0);
    assert_int_equal(td_connect(&b, f->d.sock, "ns-sb", 1), 0);
    unsigned seed = f->seed;
    uint32_t na = 2 + (uint32_t)(rand_r(&seed) % (NB - 2)), nb = 1, bytes_a = 0, bytes_b = 0;
    bytes_a = put_counted(&a, "ns-sa", 1, f->tokens, na, 100);
    bytes_b = put_counted(&b, "ns-sb", 2, f->tokens, nb, 200);
    uint32_t layer = 1;
    mf_envelope_t *g = get_rows(&a, f->tokens, NB * B, &layer, 1, 0, 2, 1); /* 2 leases */
    assert_int_equal(g->get_reply->rows[1]->status, MF_OK);
    mf_envelope_free(g);
    mf_envelope_t *r = td_simple(&a, MAPFLOW__V1__ENVELOPE__BODY_STATS,
                                 &(Mapflow__V1__Stats)MAPFLOW__V1__STATS__INIT);
    assert_int_equal(r->body_case, MAPFLOW__V1__ENVELOPE__BODY_STATS_REPLY);
    assert_int_equal(stat_of(r, "namespace_entries"), na);
    assert_int_equal(stat_of(r, "namespace_bytes"), bytes_a);
    assert_int_equal(stat_of(r, "leases"), 2);
    assert_int_equal(stat_of(r, "puts_total"), UINT64_MAX); /* no daemon-wide counters */
    assert_int_equal(r->stats_reply->n_counters, 3);
    assert_int_equal(r->stats_reply->connections, 2);
    const Mapflow__V1__TierStats *h = tier_of(r, MAPFLOW__V1__TIER__TIER_HOST);
    assert_int_equal(h->entries, na);
    assert_int_equal(h->used_bytes, bytes_a);
    assert_true(h->enabled && h->capacity_bytes == (8u << 20));
    mf_envelope_free(r);
    r = td_simple(&b, MAPFLOW__V1__ENVELOPE__BODY_STATS,
                  &(Mapflow__V1__Stats)MAPFLOW__V1__STATS__INIT);
    assert_int_equal(stat_of(r, "namespace_entries"), nb);
    assert_int_equal(stat_of(r, "namespace_bytes"), bytes_b);
    assert_int_equal(stat_of(r, "leases"), 0);
    assert_int_equal(r->stats_reply->connections, 1);
    assert_int_equal(tier_of(r, MAPFLOW__V1__TIER__TIER_HOST)->entries, nb);
    mf_envelope_free(r);
    /* The admin socket: every namespace's rows and the daemon's counters. */
    r = td_admin_stats(&a);
    assert_true(stat_of(r, "puts_total") >= na + nb);
    assert_int_equal(tier_of(r, MAPFLOW__V1__TIER__TIER_HOST)->entries, na + nb);
    assert_int_equal(r->stats_reply->connections, 4); /* a, a2, b and the admin's own */
    mf_envelope_free(r);
    td_close(&a);
    td_close(&a2);
    td_close(&b);
}

/* List of `model` (NULL: any) and layer (has_layer) in pages of `page`: the (layer,
 * block) pairs in order into out (up to cap), how many returned, *pages; with `deleter`,
 * each page's last row is deleted before the next page is asked for. */
static size_t list_all(td_cli_t *c, const char *model, int has_layer, uint32_t layer,
                       uint32_t page, uint32_t (*out)[2], size_t cap, size_t *pages,
                       td_cli_t *deleter)
{
    Mapflow__V1__List ls = MAPFLOW__V1__LIST__INIT;
    ls.model = (char *)(model ? model : "");
    ls.has_layer = has_layer;
    ls.layer = layer;
    ls.page_size = page;
    uint8_t token[MFD_KEY_MAX];
    size_t tlen = 0, n = 0;
    *pages = 0;
    do {
        ls.page_token.data = token;
        ls.page_token.len = tlen;
        mf_envelope_t *r = td_simple(c, MAPFLOW__V1__ENVELOPE__BODY_LIST, &ls);
        assert_int_equal(r->body_case, MAPFLOW__V1__ENVELOPE__BODY_LIST_REPLY);
        assert_true(r->list_reply->n_entries <= page);
        for (size_t k = 0; k < r->list_reply->n_entries && n < cap; k++, n++) {
            out[n][0] = r->list_reply->entries[k]->key->layer;
            out[n][1] = r->list_reply->entries[k]->block;
        }
        tlen = r->list_reply->next_page_token.len;
        if (tlen)
            memcpy(token, r->list_reply->next_page_token.data, tlen);
        /* The page's last row goes before the next page: it resumes after its key anyway. */
        if (deleter && r->list_reply->n_entries) {
            const Mapflow__V1__Key *k = r->list_reply->entries[r->list_reply->n_entries - 1]->key;
            Mapflow__V1__Delete d = MAPFLOW__V1__DELETE__INIT;
            d.key = (Mapflow__V1__Key *)k;
            mf_envelope_t *dr = td_simple(deleter, MAPFLOW__V1__ENVELOPE__BODY_DELETE, &d);
            assert_int_equal(dr->body_case, MAPFLOW__V1__ENVELOPE__BODY_DELETE_REPLY);
            assert_int_equal(dr->delete_reply->deleted, 1);
            mf_envelope_free(dr);
        }
        (*pages)++;
        mf_envelope_free(r);
    } while (tlen && *pages < 100);
    return n;
}

/* List walks the index in key order from the page token: pages of a model and layer (a
 * key prefix), of a layer across models (a filter), next to a namespace and a model whose
 * names extend this one's, and resuming after a key deleted between pages. */
static void test_list_pages_in_key_order(void **state)
{
    fixture_t *f = *state;
    td_cli_t c, o;
    assert_int_equal(td_connect(&c, f->d.sock, "ns-k", 0), 0);
    assert_int_equal(td_connect(&o, f->d.sock, "ns-k2", 0), 0);
    static const char *const models[2] = {"mk", "mk2"};
    unsigned seed = f->seed + 5;
    uint32_t layers[3] = {7, 2, 300};
    for (int mi = 0; mi < 2; mi++)
        for (int li = 0; li < 3; li++)
            for (uint32_t i = 0; i < NB; i++) {
                size_t size;
                for (int who = 0; who < 2; who++) {
                    const char *ns = who ? "ns-k2" : "ns-k";
                    uint8_t *row = td_row(ns, models[mi], layers[li], B, f->tokens, i, &size,
                                          &seed);
                    assert_int_equal(td_put(who ? &o : &c, models[mi], layers[li],
                                            td_block_hash(ns, models[mi], B, f->tokens, i),
                                            row, size, 0, NULL),
                                     0);
                    free(row);
                }
            }
    uint32_t got[64][2];
    size_t pages;
    /* (mk, layer 7): NB rows, blocks ascending by hash order: every block once. */
    size_t n = list_all(&c, "mk", 1, 7, 3, got, 64, &pages, NULL);
    assert_int_equal(n, NB);
    assert_int_equal(pages, (NB + 2) / 3);
    unsigned seen = 0;
    for (size_t k = 0; k < n; k++) {
        assert_int_equal(got[k][0], 7);
        seen |= 1u << got[k][1];
    }
    assert_int_equal(seen, (1u << NB) - 1);
    /* Layer 300 of any model: both models', and nothing of ns-k2. */
    n = list_all(&c, NULL, 1, 300, 4, got, 64, &pages, NULL);
    assert_int_equal(n, 2 * NB);
    /* Model "mk" only (not "mk2"): 3 layers, in layer order 2, 7, 300. */
    n = list_all(&c, "mk", 0, 0, 5, got, 64, &pages, NULL);
    assert_int_equal(n, 3 * NB);
    for (size_t k = 0; k + 1 < n; k++)
        assert_true(got[k][0] <= got[k + 1][0]);
    assert_int_equal(got[0][0], 2);
    assert_int_equal(got[n - 1][0], 300);
    /* Everything, deleting each page's last row before asking for the next page: the
     * pages still cover every row once (those deleted included, as they were listed). */
    n = list_all(&o, NULL, 0, 0, 4, got, 64, &pages, &o);
    assert_int_equal(n, 2 * 3 * NB);
    assert_int_equal(pages, (2 * 3 * NB + 3) / 4);
    td_close(&c);
    td_close(&o);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_put_lookup_get_lease, setup, teardown),
        cmocka_unit_test_setup_teardown(test_payload_put_and_validation, setup, teardown),
        cmocka_unit_test_setup_teardown(test_protocol_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_durable_survives_restart, setup, teardown),
        cmocka_unit_test_setup_teardown(test_admin_list_config_profile, setup, teardown),
        cmocka_unit_test_setup_teardown(test_profiles_need_ssd, setup, teardown),
        cmocka_unit_test_setup_teardown(test_watermark_demotion, setup, teardown),
        cmocka_unit_test_setup_teardown(test_frame_timeout, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stats_per_namespace, setup, teardown),
        cmocka_unit_test_setup_teardown(test_list_pages_in_key_order, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
