/* mf_session, the sans-IO protocol core: ids, the pending table against a plain model
 * under random add / reply / duplicate / unknown / expire orders and a full table, the
 * reply rule, and the far side's Hello / RemoteArena checks. The seed is printed;
 * MF_TEST_SEED repeats a run. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <cmocka.h>

#include "mf_session.h"

static uint64_t rng_state;

static uint64_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static void seed_rng(void)
{
    const char *e = getenv("MF_TEST_SEED");
    uint64_t seed = e ? strtoull(e, NULL, 0) : (uint64_t)time(NULL) ^ (uint64_t)clock();
    print_message("seed %llu (MF_TEST_SEED repeats it)\n", (unsigned long long)seed);
    rng_state = seed * 0x9E3779B97F4A7C15ull | 1;
}

/* ---- the table against a model ---- */

typedef struct model_req {
    uint64_t rid;
    int64_t deadline;
    int live;                   /* pending in the model */
    int tag;                    /* the user pointer points here */
} model_req_t;

/* The live request the session must expire first at `now`: the earliest deadline, ties
 * by id; NULL when none is due. */
static model_req_t *model_due(model_req_t *m, size_t n, int64_t now)
{
    model_req_t *best = NULL;
    for (size_t i = 0; i < n; i++)
        if (m[i].live && m[i].deadline <= now &&
            (!best || m[i].deadline < best->deadline ||
             (m[i].deadline == best->deadline && m[i].rid < best->rid)))
            best = &m[i];
    return best;
}

static int64_t model_next(const model_req_t *m, size_t n)
{
    int64_t t = INT64_MAX;
    for (size_t i = 0; i < n; i++)
        if (m[i].live && m[i].deadline < t)
            t = m[i].deadline;
    return t;
}

static void test_random_orders(void **state)
{
    (void)state;
    seed_rng();
    enum { OPS = 40000, MAXP = 173 };
    model_req_t *m = calloc(OPS, sizeof(*m));
    assert_non_null(m);
    size_t n = 0, live = 0, fulls = 0, dups = 0, unknown = 0, expired = 0, replies = 0;
    mf_session_t s;
    mf_session_init(&s, MAXP);
    int64_t now = 1000;
    uint64_t last_rid = 0;
    for (int op = 0; op < OPS; op++) {
        unsigned what = (unsigned)(rnd() % 100);
        if (what < 45) { /* send a request */
            int64_t dl = rnd() % 8 == 0 ? INT64_MAX : now + (int64_t)(rnd() % 3000);
            uint64_t rid = 0;
            mf_status_t st = mf_session_add(&s, dl, &m[n].tag, &rid);
            if (live == MAXP) {
                assert_int_equal(st, MF_RESOURCE_EXHAUSTED);
                assert_int_equal(mf_session_pending(&s), MAXP);
                fulls++;
                continue;
            }
            assert_int_equal(st, MF_OK);
            assert_true(rid > last_rid); /* fresh: never an id handed out before */
            last_rid = rid;
            m[n] = (model_req_t){rid, dl, 1, (int)n};
            n++;
            live++;
        } else if (what < 75 && n) { /* a reply, mostly to a live request */
            model_req_t *r = &m[rnd() % n];
            for (int tries = 0; tries < 16 && !r->live && rnd() % 5; tries++)
                r = &m[n - 1 - rnd() % (n < 400 ? n : 400)]; /* the live ones are recent */
            void *u = mf_session_take(&s, r->rid);
            if (r->live) {
                assert_ptr_equal(u, &r->tag);
                r->live = 0;
                live--;
                replies++;
            } else {
                assert_null(u); /* a duplicate reply, or one to an expired request */
                dups++;
            }
        } else if (what < 82) { /* a reply nobody asked for */
            uint64_t rid = rnd() % 3 == 0 ? 0 : last_rid + 1 + rnd() % 1000;
            assert_null(mf_session_take(&s, rid));
            assert_null(mf_session_find(&s, rid));
            unknown++;
        } else if (what < 92) { /* time passes; the due ones expire in order */
            now += (int64_t)(rnd() % 100);
            for (;;) {
                model_req_t *d = model_due(m, n, now);
                uint64_t rid = 0;
                void *u = mf_session_expire(&s, now, &rid);
                if (!d) {
                    assert_null(u);
                    break;
                }
                assert_ptr_equal(u, &d->tag);
                assert_int_equal(rid, d->rid);
                d->live = 0;
                live--;
                expired++;
            }
        } else if (n) { /* look without taking */
            model_req_t *r = &m[rnd() % n];
            void *u = mf_session_find(&s, r->rid);
            if (r->live)
                assert_ptr_equal(u, &r->tag);
            else
                assert_null(u);
        }
        assert_int_equal(mf_session_pending(&s), live);
        assert_true(mf_session_next_deadline(&s) == model_next(m, n));
    }
    /* The connection goes: every pending request comes out exactly once. */
    uint64_t rid;
    void *u;
    size_t drained = 0;
    while ((u = mf_session_drain(&s, &rid))) {
        model_req_t *r = (model_req_t *)((char *)u - offsetof(model_req_t, tag));
        assert_int_equal(r->rid, rid);
        assert_true(r->live);
        r->live = 0;
        drained++;
    }
    assert_int_equal(drained, live);
    assert_int_equal(mf_session_pending(&s), 0);
    assert_true(mf_session_next_deadline(&s) == INT64_MAX);
    print_message("%zu requests: %zu replies, %zu duplicates, %zu unknown ids, %zu expired, "
                  "%zu refused (full), %zu drained\n", n, replies, dups, unknown, expired,
                  fulls, drained);
    /* Every kind of event happened (a run that never filled the table proves nothing). */
    assert_true(replies > 0 && dups > 0 && unknown > 0 && expired > 0 && fulls > 0);
    mf_session_deinit(&s);
    free(m);
}

static void test_ids_and_bounds(void **state)
{
    (void)state;
    mf_session_t s;
    mf_session_init(&s, 3);
    int a, b, c, d;
    uint64_t r1, r2, r3, r4;
    assert_int_equal(mf_session_add(&s, 50, &a, &r1), MF_OK);
    assert_int_equal(mf_session_add(&s, 50, &b, &r2), MF_OK);
    assert_int_equal(mf_session_add(&s, 10, &c, &r3), MF_OK);
    assert_true(r1 != 0 && r2 > r1 && r3 > r2);
    /* Full: refused, nothing recorded, no id used up. */
    assert_int_equal(mf_session_add(&s, 1, &d, &r4), MF_RESOURCE_EXHAUSTED);
    assert_int_equal(mf_session_pending(&s), 3);
    assert_int_equal(mf_session_next_deadline(&s), 10);
    uint64_t one_way = mf_session_next_id(&s);
    assert_int_equal(one_way, r3 + 1);
    /* Expiry: earliest first, equal deadlines by id; nothing before its time. */
    uint64_t rid;
    assert_null(mf_session_expire(&s, 9, &rid));
    assert_ptr_equal(mf_session_expire(&s, 60, &rid), &c);
    assert_int_equal(rid, r3);
    assert_ptr_equal(mf_session_expire(&s, 60, &rid), &a);
    assert_int_equal(rid, r1);
    /* A slot is free again. */
    assert_int_equal(mf_session_add(&s, INT64_MAX, &d, &r4), MF_OK);
    assert_int_equal(r4, one_way + 1);
    assert_ptr_equal(mf_session_take(&s, r2), &b);
    assert_null(mf_session_take(&s, r2));
    assert_int_equal(mf_session_next_deadline(&s), INT64_MAX);
    assert_null(mf_session_expire(&s, INT64_MAX - 1, &rid));
    assert_int_equal(mf_session_add(&s, 5, NULL, &rid), MF_INVALID_ARGUMENT);
    mf_session_deinit(&s);
    /* Ids never come back as 0, even after 2^64 of them. */
    mf_session_init(&s, 0);
    assert_int_equal(s.max_pending, MF_SESSION_MAX_PENDING);
    s.last_id = UINT64_MAX - 1;
    assert_int_equal(mf_session_next_id(&s), UINT64_MAX);
    assert_int_equal(mf_session_next_id(&s), 1);
    mf_session_deinit(&s);
}

/* Many pending at once (the index grows and rehashes) and taken in random order. */
static void test_growth(void **state)
{
    (void)state;
    seed_rng();
    enum { N = 5000 };
    mf_session_t s;
    mf_session_init(&s, N);
    static int tags[N];
    uint64_t rids[N];
    for (int i = 0; i < N; i++)
        assert_int_equal(mf_session_add(&s, (int64_t)(rnd() % 100000), &tags[i], &rids[i]),
                         MF_OK);
    int order[N];
    for (int i = 0; i < N; i++)
        order[i] = i;
    for (int i = N - 1; i > 0; i--) {
        int j = (int)(rnd() % (uint64_t)(i + 1)), t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    for (int k = 0; k < N; k++) {
        int i = order[k];
        assert_ptr_equal(mf_session_find(&s, rids[i]), &tags[i]);
        assert_ptr_equal(mf_session_take(&s, rids[i]), &tags[i]);
        assert_null(mf_session_find(&s, rids[i]));
    }
    assert_int_equal(mf_session_pending(&s), 0);
    mf_session_deinit(&s);
}

/* ---- replies and the far side ---- */

static void test_reply_status(void **state)
{
    (void)state;
    char err[64];
    Mapflow__V1__ErrorReply er = MAPFLOW__V1__ERROR_REPLY__INIT;
    mf_envelope_t e = MAPFLOW__V1__ENVELOPE__INIT;
    e.body_case = MAPFLOW__V1__ENVELOPE__BODY_ERROR;
    e.error = &er;
    er.code = MF_NOT_FOUND;
    er.message = "no such row";
    assert_int_equal(mf_session_reply_status(&e, MAPFLOW__V1__ENVELOPE__BODY_GET_REPLY, err,
                                             sizeof err), MF_NOT_FOUND);
    assert_string_equal(err, "no such row");
    assert_int_equal(mf_session_reply_status(&e, 0, err, sizeof err), MF_NOT_FOUND);
    /* Codes outside the table (or 0: an error that is no error) are UNKNOWN; an empty
     * message becomes the table's text. */
    er.message = "";
    er.code = 0;
    assert_int_equal(mf_session_reply_status(&e, 0, err, sizeof err), MF_UNKNOWN);
    assert_string_equal(err, mf_strerror(MF_UNKNOWN));
    er.code = 4242;
    assert_int_equal(mf_session_reply_status(&e, 0, err, sizeof err), MF_UNKNOWN);
    /* A long message is cut to the buffer, terminated. */
    char longmsg[300];
    memset(longmsg, 'x', sizeof longmsg - 1);
    longmsg[sizeof longmsg - 1] = '\0';
    er.code = MF_INTERNAL;
    er.message = longmsg;
    assert_int_equal(mf_session_reply_status(&e, 0, err, sizeof err), MF_INTERNAL);
    assert_int_equal(strlen(err), sizeof err - 1);
    /* The wrong reply type. */
    Mapflow__V1__LookupReply lr = MAPFLOW__V1__LOOKUP_REPLY__INIT;
    mf_envelope_t l = MAPFLOW__V1__ENVELOPE__INIT;
    l.body_case = MAPFLOW__V1__ENVELOPE__BODY_LOOKUP_REPLY;
    l.lookup_reply = &lr;
    assert_int_equal(mf_session_reply_status(&l, MAPFLOW__V1__ENVELOPE__BODY_GET_REPLY, err,
                                             sizeof err), MF_INTERNAL);
    assert_non_null(strstr(err, "expected"));
    assert_int_equal(mf_session_reply_status(&l, MAPFLOW__V1__ENVELOPE__BODY_LOOKUP_REPLY,
                                             err, sizeof err), MF_OK);
    assert_int_equal(mf_session_reply_status(&l, 0, NULL, 0), MF_OK);
}

static void test_far_side(void **state)
{
    (void)state;
    seed_rng();
    char err[128];
    Mapflow__V1__HelloReply hr = MAPFLOW__V1__HELLO_REPLY__INIT;
    mf_envelope_t e = MAPFLOW__V1__ENVELOPE__INIT;
    e.body_case = MAPFLOW__V1__ENVELOPE__BODY_HELLO_REPLY;
    e.hello_reply = &hr;
    for (int round = 0; round < 200; round++) {
        uint32_t own = MF_FRAME_MIN_MAX + (uint32_t)(rnd() % (1u << 24));
        hr.max_frame = (uint32_t)(rnd() % (2u * own));
        hr.session_id = rnd() | 1;
        hr.max_batch = (uint32_t)(rnd() % 1000);
        hr.host_arena_bytes = rnd() % 4 ? rnd() % (1ull << 40) : 0;
        hr.gpu_tier = (protobuf_c_boolean)(rnd() & 1);
        unsigned flags = (unsigned)(rnd() % 4);
        mf_session_far_t far;
        memset(&far, 0xa5, sizeof far);
        mf_status_t st = mf_session_far_hello(&far, &e, own, flags, err, sizeof err);
        if ((flags & MF_SESSION_NEED_ARENA) && !hr.host_arena_bytes) {
            assert_int_equal(st, MF_FAILED_PRECONDITION);
            continue;
        }
        assert_int_equal(st, MF_OK);
        uint32_t want = hr.max_frame >= MF_FRAME_MIN_MAX && hr.max_frame < own ? hr.max_frame
                                                                                : own;
        assert_int_equal(far.max_frame, want);
        assert_true(far.max_frame >= MF_FRAME_MIN_MAX && far.max_frame <= own);
        assert_int_equal(far.session_id, hr.session_id);
        assert_int_equal(far.max_batch, hr.max_batch);
        assert_int_equal(far.host_arena_bytes, hr.host_arena_bytes);
        assert_int_equal(far.gpu_tier, hr.gpu_tier);
        assert_int_equal(far.stage, (flags & MF_SESSION_REMOTE) ? MF_SESSION_ARENA
                                                                  : MF_SESSION_READY);
    }
    /* An ErrorReply to Hello (a refused token) is its status. */
    Mapflow__V1__ErrorReply er = MAPFLOW__V1__ERROR_REPLY__INIT;
    er.code = MF_PERMISSION_DENIED;
    er.message = "bad token";
    mf_envelope_t ee = MAPFLOW__V1__ENVELOPE__INIT;
    ee.body_case = MAPFLOW__V1__ENVELOPE__BODY_ERROR;
    ee.error = &er;
    mf_session_far_t far = {0};
    assert_int_equal(mf_session_far_hello(&far, &ee, 1u << 20, 0, err, sizeof err),
                     MF_PERMISSION_DENIED);
    assert_string_equal(err, "bad token");

    /* RemoteArena: only after a Hello that said one comes; every field bounded. */
    hr.host_arena_bytes = 1u << 20;
    hr.max_frame = 0;
    assert_int_equal(mf_session_far_hello(&far, &e, 1u << 20, MF_SESSION_REMOTE, err,
                                          sizeof err), MF_OK);
    assert_int_equal(far.max_frame, 1u << 20);
    uint8_t rkey[MF_SESSION_MAX_RKEY + 1];
    for (size_t i = 0; i < sizeof rkey; i++)
        rkey[i] = (uint8_t)rnd();
    Mapflow__V1__RemoteArenaReply ra = MAPFLOW__V1__REMOTE_ARENA_REPLY__INIT;
    mf_envelope_t re = MAPFLOW__V1__ENVELOPE__INIT;
    re.body_case = MAPFLOW__V1__ENVELOPE__BODY_REMOTE_ARENA_REPLY;
    re.remote_arena_reply = &ra;
    struct { uint64_t addr, bytes; size_t rk; } bad[] = {
        {0x1000, 0, 16},                       /* no arena */
        {UINT64_MAX - 10, 100, 16},            /* wraps */
        {0x1000, 4096, 0},                     /* no rkey */
        {0x1000, 4096, MF_SESSION_MAX_RKEY + 1}, /* rkey too long */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ra.address = bad[i].addr;
        ra.bytes = bad[i].bytes;
        ra.rkey.data = rkey;
        ra.rkey.len = bad[i].rk;
        assert_int_equal(mf_session_far_arena(&far, &re, err, sizeof err), MF_INTERNAL);
        assert_int_equal(far.stage, MF_SESSION_ARENA);
    }
    ra.address = rnd() >> 2;
    ra.bytes = 1 + rnd() % (1ull << 36);
    ra.rkey.len = 1 + rnd() % MF_SESSION_MAX_RKEY;
    assert_int_equal(mf_session_far_arena(&far, &re, err, sizeof err), MF_OK);
    assert_int_equal(far.stage, MF_SESSION_READY);
    assert_int_equal(far.remote_address, ra.address);
    assert_int_equal(far.remote_bytes, ra.bytes);
    /* A second RemoteArenaReply (nobody asked) is refused. */
    assert_int_equal(mf_session_far_arena(&far, &re, err, sizeof err), MF_INTERNAL);

    Mapflow__V1__Hello h;
    mf_session_hello_init(&h, "ns1", NULL, "test", 1);
    assert_int_equal(h.protocol_version, MF_PROTOCOL_VERSION);
    assert_string_equal(h.namespace_, "ns1");
    assert_string_equal(h.token, "");
    assert_string_equal(h.client_name, "test");
    assert_true(h.want_host_arena);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ids_and_bounds),
        cmocka_unit_test(test_random_orders),
        cmocka_unit_test(test_growth),
        cmocka_unit_test(test_reply_status),
        cmocka_unit_test(test_far_side),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
