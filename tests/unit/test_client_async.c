/*
 * libmapflow's async half against a real mapflowd (test_client_proc.h): 1,000 calls in
 * flight on one channel (the daemon held with SIGSTOP while they are issued) complete
 * exactly once each with the right results; deadlines reported as DEADLINE_EXCEEDED and
 * their late replies dropped; cancellation; a restarted daemon makes calls fail with
 * UNAVAILABLE (no retries) and then succeed on the same channel after it reconnects (new
 * session, new arena, zero-copy leases again); with retries a call started while the
 * daemon is down succeeds once it is back; batched puts of a 32k-token context (512
 * blocks × 2 layers in one call) and larger than the daemon's arena; completion-queue
 * shutdown and channel close with calls
 * running. No timed assertions: every wait is a bounded poll or an event.
 */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <sys/socket.h>

#include <cmocka.h>

#include "test_client_proc.h"
#include "test_client_util.h"

#define MODEL "async-src"
#define NS "ns-async"
#define B 16
#define HEADS 4
#define NB 40                  /* blocks in the small test context */
#define N_CALLS 1000

typedef struct ctx {
    uint32_t tokens[NB * B];
    uint8_t *row[NB];
    size_t len[NB];
    mf_hash128_t hash[NB];
} ctx_t;

static void ctx_make(ctx_t *c, uint32_t layer, uint64_t seed)
{
    tc_tokens(c->tokens, NB * B, seed);
    for (uint32_t b = 0; b < NB; b++) {
        c->row[b] = tc_make_row(NS, MODEL, layer, B, HEADS, c->tokens, b, MF_CODEC_FP16,
                                seed * 131 + b, &c->len[b]);
        assert_non_null(c->row[b]);
        mf_row_view_t v;
        assert_int_equal(mf_row_decode(c->row[b], c->len[b], 0, &v, NULL), MF_OK);
        c->hash[b] = v.hash;
    }
}

static void ctx_free(ctx_t *c)
{
    for (uint32_t b = 0; b < NB; b++)
        free(c->row[b]);
}

/* A channel with an explicit retry policy (max_retries 0 = fail fast). */
static mf_channel_t *chan_retry(const daemon_t *d, int arena, uint32_t retries)
{
    char target[160];
    snprintf(target, sizeof(target), "unix:%s", d->sock);
    mf_channel_params_t p = {.field_mask = MF_CHANNEL_PARAM_NS | MF_CHANNEL_PARAM_WANT_ARENA |
                                           MF_CHANNEL_PARAM_TIMEOUT_MS | MF_CHANNEL_PARAM_RETRY,
                             .ns = NS, .want_arena = arena, .timeout_ms = 20000};
    mf_retry_policy_default(&p.retry);
    p.retry.max_retries = retries;
    p.retry.initial_backoff_ms = 10;
    p.retry.max_backoff_ms = 200;
    mf_channel_t *ch = NULL;
    mf_status_t st = mf_channel_open(target, &p, &ch);
    if (st != MF_OK)
        fail_msg("open: %s: %s", mf_status_name(st), mf_channel_last_error(ch));
    return ch;
}

static void put_all(mf_channel_t *ch, const ctx_t *c, unsigned flags)
{
    mf_put_item_t it[NB];
    for (size_t b = 0; b < NB; b++)
        it[b] = (mf_put_item_t){.row = c->row[b], .len = c->len[b]};
    mf_status_t st = mf_put_batch(ch, it, NB, flags, MF_TIMEOUT_DEFAULT);
    if (st != MF_OK)
        fail_msg("put batch: %s: %s", mf_status_name(st), mf_channel_last_error(ch));
    for (size_t b = 0; b < NB; b++)
        assert_int_equal(it[b].status, MF_OK);
}

/* Takes the next event, failing the test after 30 s of silence. */
static mf_cq_event_t next_event(mf_cq_t *cq)
{
    mf_cq_event_t ev;
    if (mf_cq_next(cq, 30000, &ev) != MF_CQ_CALL_DONE)
        fail_msg("no completion event within 30 s (type %d)", (int)ev.type);
    return ev;
}

static size_t in_flight(mf_channel_t *ch)
{
    mf_server_info_t info;
    mf_channel_info(ch, &info);
    return info.in_flight;
}

/* ==== 1,000 calls in flight ========================================================== */

typedef struct slot {
    int kind;                   /* 0 lookup, 1 get by key, 2 get_prefix */
    uint32_t block;
    uint32_t blocks[2], total;
    uint8_t *buf;
    size_t len;
    mf_get_result_t *res;
    int seen;
} slot_t;

static void test_thousand_in_flight(void **state)
{
    (void)state;
    daemon_t d;
    daemon_start(&d, 0, "--host_bytes", "64mb", NULL);
    mf_channel_t *ch = chan_retry(&d, 1, 0);
    ctx_t *c = calloc(1, sizeof(*c));
    ctx_make(c, 5, 77);
    put_all(ch, c, 0);
    mf_cq_t *cq;
    assert_int_equal(mf_cq_create(&cq), MF_OK);
    slot_t *s = calloc(N_CALLS, sizeof(*s));
    uint32_t layers[2] = {5, 6};

    /* Hold the daemon so every call is demonstrably in flight at once. */
    assert_int_equal(kill(d.pid, SIGSTOP), 0);
    uint64_t rng = 99;
    for (size_t i = 0; i < N_CALLS; i++) {
        s[i].kind = (int)(tc_rand(&rng) % 3);
        s[i].block = (uint32_t)(tc_rand(&rng) % NB);
        mf_status_t st;
        if (s[i].kind == 0) {
            st = mf_lookup_async(ch, MODEL, B, c->tokens, (size_t)(s[i].block + 1) * B + 3,
                                 layers, 2, s[i].blocks, &s[i].total, MF_TIMEOUT_DEFAULT, cq,
                                 &s[i], NULL);
        } else if (s[i].kind == 1) {
            s[i].buf = aligned_alloc(16, (c->len[s[i].block] + 15) & ~(size_t)15);
            mf_key_t k = {MODEL, 5, c->hash[s[i].block]};
            st = mf_get_async(ch, &k, s[i].buf, c->len[s[i].block], &s[i].len,
                              MF_TIMEOUT_DEFAULT, cq, &s[i], NULL);
        } else {
            st = mf_get_prefix_async(ch, MODEL, B, c->tokens, NB * B, layers, 1, s[i].block, 1,
                                     MF_GET_LEASE, &s[i].res, MF_TIMEOUT_DEFAULT, cq, &s[i],
                                     NULL);
        }
        assert_int_equal(st, MF_OK);
    }
    assert_int_equal(in_flight(ch), N_CALLS);
    assert_int_equal(kill(d.pid, SIGCONT), 0);

    size_t n_kind[3] = {0};
    for (size_t n = 0; n < N_CALLS; n++) {
        mf_cq_event_t ev = next_event(cq);
        slot_t *x = ev.tag;
        assert_true(x >= s && x < s + N_CALLS);
        x->seen++;
        if (ev.status != MF_OK)
            fail_msg("call %zu (kind %d): %s: %s", (size_t)(x - s), x->kind,
                     mf_status_name(ev.status), ev.message);
        n_kind[x->kind]++;
        uint32_t b = x->block;
        if (x->kind == 0) {
            assert_int_equal(x->total, b + 1);
            assert_int_equal(x->blocks[0], b + 1); /* every block of layer 5 is cached */
            assert_int_equal(x->blocks[1], 0);
        } else if (x->kind == 1) {
            assert_int_equal(x->len, c->len[b]);
            assert_memory_equal(x->buf, c->row[b], c->len[b]);
        } else {
            assert_int_equal(x->res->n_rows, 1);
            assert_int_equal(x->res->rows[0].status, MF_OK);
            assert_int_equal(x->res->rows[0].block, b);
            assert_memory_equal(x->res->rows[0].data, c->row[b], c->len[b]);
            assert_int_equal(mf_release_result(ch, x->res, MF_TIMEOUT_DEFAULT), MF_OK);
        }
    }
    for (size_t i = 0; i < N_CALLS; i++)
        assert_int_equal(s[i].seen, 1);
    assert_true(n_kind[0] > 0 && n_kind[1] > 0 && n_kind[2] > 0);
    /* Exactly once: nothing more comes. */
    mf_cq_event_t ev;
    assert_int_equal(mf_cq_next(cq, 0, &ev), MF_CQ_TIMEOUT);
    assert_int_equal(in_flight(ch), 0);
    mf_cq_shutdown(cq);
    assert_int_equal(mf_cq_next(cq, MF_TIMEOUT_INFINITE, &ev), MF_CQ_SHUTDOWN);
    mf_cq_destroy(cq);
    for (size_t i = 0; i < N_CALLS; i++) {
        free(s[i].buf);
        mf_get_result_free(s[i].res);
    }
    free(s);
    mf_channel_close(ch);
    ctx_free(c);
    free(c);
    daemon_stop(&d, 1);
}

/* ==== deadlines and cancellation ===================================================== */

static void test_deadline_and_cancel(void **state)
{
    (void)state;
    daemon_t d;
    daemon_start(&d, 0, NULL);
    mf_channel_t *ch = chan_retry(&d, 0, 3);
    mf_cq_t *cq;
    assert_int_equal(mf_cq_create(&cq), MF_OK);
    assert_int_equal(kill(d.pid, SIGSTOP), 0);

    mf_health_t h;
    assert_int_equal(mf_health(ch, &h, 100), MF_DEADLINE_EXCEEDED);
    assert_non_null(strstr(mf_channel_last_error(ch), "deadline"));

    uint32_t tokens[4 * B], layer = 1, blocks = 77;
    tc_tokens(tokens, 4 * B, 5);
    int tag_a, tag_b;
    mf_call_t *call = NULL;
    assert_int_equal(mf_lookup_async(ch, MODEL, B, tokens, 4 * B, &layer, 1, &blocks, NULL, 50,
                                     cq, &tag_a, NULL), MF_OK);
    assert_int_equal(mf_lookup_async(ch, MODEL, B, tokens, 4 * B, &layer, 1, &blocks, NULL,
                                     MF_TIMEOUT_INFINITE, cq, &tag_b, &call), MF_OK);
    mf_cq_event_t ev = next_event(cq);
    assert_ptr_equal(ev.tag, &tag_a);
    assert_int_equal(ev.status, MF_DEADLINE_EXCEEDED);
    assert_non_null(strstr(ev.message, "deadline"));
    assert_int_equal(mf_call_cancel(call), MF_OK);
    ev = next_event(cq);
    assert_ptr_equal(ev.tag, &tag_b);
    assert_int_equal(ev.status, MF_CANCELLED);
    assert_int_equal(mf_call_cancel(call), MF_FAILED_PRECONDITION); /* already done */
    mf_call_free(call);
    assert_int_equal(blocks, 77); /* nothing was written for the calls that gave up */

    /* The daemon answers the three late requests; their replies are dropped. */
    assert_int_equal(kill(d.pid, SIGCONT), 0);
    assert_int_equal(mf_health(ch, &h, MF_TIMEOUT_DEFAULT), MF_OK);
    assert_true(h.ok);
    assert_int_equal(mf_lookup(ch, MODEL, B, tokens, 4 * B, &layer, 1, &blocks, NULL,
                               MF_TIMEOUT_DEFAULT), MF_OK);
    assert_int_equal(blocks, 0);
    assert_int_equal(mf_cq_next(cq, 0, &ev), MF_CQ_TIMEOUT);
    mf_cq_shutdown(cq);
    assert_int_equal(mf_cq_next(cq, 0, &ev), MF_CQ_SHUTDOWN);
    mf_cq_destroy(cq);
    mf_channel_close(ch);
    daemon_stop(&d, 1);
}

/* ==== restart: fail fast, then reconnect ============================================ */

static void test_restart_unavailable_then_reconnect(void **state)
{
    (void)state;
    daemon_t d;
    daemon_start(&d, 0, "--write_through", "off", NULL);
    mf_channel_t *ch = chan_retry(&d, 1, 0);
    ctx_t *c = calloc(1, sizeof(*c));
    ctx_make(c, 2, 4242);
    put_all(ch, c, MF_PUT_DURABLE); /* survives the restart on the SSD tier */
    mf_server_info_t before;
    mf_channel_info(ch, &before);
    assert_true(before.connected);
    mf_lease_t lease;
    mf_key_t k = {MODEL, 2, c->hash[3]};
    assert_int_equal(mf_get_lease(ch, &k, &lease, MF_TIMEOUT_DEFAULT), MF_OK);

    /* Calls in flight when the daemon dies fail with UNAVAILABLE. */
    mf_cq_t *cq;
    assert_int_equal(mf_cq_create(&cq), MF_OK);
    assert_int_equal(kill(d.pid, SIGSTOP), 0);
    uint32_t layer = 2, blocks[20];
    for (int i = 0; i < 20; i++)
        assert_int_equal(mf_lookup_async(ch, MODEL, B, c->tokens, NB * B, &layer, 1, &blocks[i],
                                         NULL, MF_TIMEOUT_DEFAULT, cq, &blocks[i], NULL), MF_OK);
    assert_int_equal(kill(d.pid, SIGKILL), 0);
    daemon_wait(&d);
    for (int i = 0; i < 20; i++) {
        mf_cq_event_t ev = next_event(cq);
        if (ev.status != MF_UNAVAILABLE)
            fail_msg("in-flight call: %s: %s", mf_status_name(ev.status), ev.message);
    }
    /* While it is away, calls fail fast with UNAVAILABLE. */
    mf_health_t h;
    assert_int_equal(mf_health(ch, &h, MF_TIMEOUT_DEFAULT), MF_UNAVAILABLE);
    assert_true(mf_channel_last_error(ch)[0] != '\0');

    daemon_start(&d, 1, "--write_through", "off", NULL);
    /* Same channel: UNAVAILABLE until the reconnect, then OK; nothing else. */
    mf_status_t st = MF_UNAVAILABLE;
    for (int i = 0; i < 500 && st == MF_UNAVAILABLE; i++) {
        st = mf_health(ch, &h, MF_TIMEOUT_DEFAULT);
        if (st == MF_UNAVAILABLE)
            msleep(20);
    }
    if (st != MF_OK)
        fail_msg("after restart: %s: %s", mf_status_name(st), mf_channel_last_error(ch));
    mf_server_info_t after;
    mf_channel_info(ch, &after);
    assert_true(after.connected);
    assert_true(after.reconnects >= 1);
    assert_true(mf_channel_has_arena(ch));
    /* The old lease view still reads (old arena kept mapped), the lease itself is gone. */
    assert_int_equal(lease.view.block_index, 3);
    uint32_t released = 9;
    assert_int_equal(mf_release(ch, &lease.lease_id, 1, &released, MF_TIMEOUT_DEFAULT), MF_OK);
    assert_int_equal(released, 0);
    /* Durable rows come back zero-copy from the new arena. */
    mf_get_result_t *g = NULL;
    assert_int_equal(mf_get_prefix(ch, MODEL, B, c->tokens, NB * B, &layer, 1, 0, 0,
                                   MF_GET_LEASE, &g, MF_TIMEOUT_DEFAULT), MF_OK);
    assert_int_equal(g->n_rows, NB);
    for (size_t b = 0; b < NB; b++) {
        if (g->rows[b].status != MF_OK)
            fail_msg("row %zu: %s", b, mf_status_name(g->rows[b].status));
        assert_memory_equal(g->rows[b].data, c->row[b], c->len[b]);
    }
    assert_int_equal(mf_release_result(ch, g, MF_TIMEOUT_DEFAULT), MF_OK);
    mf_get_result_free(g);
    mf_cq_shutdown(cq);
    mf_cq_destroy(cq);
    mf_channel_close(ch);
    ctx_free(c);
    free(c);
    daemon_stop(&d, 1);
}

/* ==== restart: retries ride it out =================================================== */

static void test_retry_rides_out_restart(void **state)
{
    (void)state;
    daemon_t d;
    daemon_start(&d, 0, NULL);
    mf_channel_t *ch = chan_retry(&d, 0, 100);
    daemon_stop(&d, 0);
    mf_cq_t *cq;
    assert_int_equal(mf_cq_create(&cq), MF_OK);
    mf_health_t h;
    int tag;
    /* Started while nobody listens; it keeps retrying within its 20 s deadline. */
    assert_int_equal(mf_health_async(ch, &h, MF_TIMEOUT_DEFAULT, cq, &tag, NULL), MF_OK);
    daemon_start(&d, 1, NULL);
    mf_cq_event_t ev = next_event(cq);
    if (ev.status != MF_OK)
        fail_msg("retried call: %s: %s", mf_status_name(ev.status), ev.message);
    assert_true(h.ok);
    mf_server_info_t info;
    mf_channel_info(ch, &info);
    assert_true(info.reconnects >= 1);
    mf_cq_shutdown(cq);
    mf_cq_destroy(cq);
    mf_channel_close(ch);
    daemon_stop(&d, 1);
}

/* ==== batched put: a 32k-token context ============================================== */

#define LB 64
#define LNB 512                /* 32768 tokens */

static void test_put_batch_long_context(void **state)
{
    (void)state;
    daemon_t d;
    daemon_start(&d, 0, "--host_bytes", "256mb", NULL);
    mf_channel_t *ch = chan_retry(&d, 1, 0);
    uint32_t *tokens = malloc(LNB * LB * sizeof(uint32_t));
    tc_tokens(tokens, LNB * LB, 3232);
    size_t n = 2 * LNB;
    mf_put_item_t *it = calloc(n, sizeof(*it));
    for (size_t i = 0; i < n; i++) {
        size_t len;
        it[i].row = tc_make_row(NS, MODEL, (uint32_t)(10 + i / LNB), LB, HEADS, tokens,
                                (uint32_t)(i % LNB), MF_CODEC_MASK, 5000 + i, &len);
        assert_non_null(it[i].row);
        it[i].len = len;
    }
    mf_status_t st = mf_put_batch(ch, it, n, 0, MF_TIMEOUT_DEFAULT);
    if (st != MF_OK)
        fail_msg("put batch: %s: %s", mf_status_name(st), mf_channel_last_error(ch));
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(it[i].status, MF_OK);
        assert_int_equal(it[i].result.tier, MF_TIER_HOST);
        assert_false(it[i].result.replaced);
    }
    uint32_t layers[2] = {10, 11}, blocks[2], total = 0;
    assert_int_equal(mf_lookup(ch, MODEL, LB, tokens, LNB * LB, layers, 2, blocks, &total,
                               MF_TIMEOUT_DEFAULT), MF_OK);
    assert_int_equal(total, LNB);
    assert_int_equal(blocks[0], LNB);
    assert_int_equal(blocks[1], LNB);
    mf_get_result_t *g = NULL;
    assert_int_equal(mf_get_prefix(ch, MODEL, LB, tokens, LNB * LB, layers, 2, 0, 0,
                                   MF_GET_COPY, &g, MF_TIMEOUT_DEFAULT), MF_OK);
    assert_int_equal(g->n_rows, n);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(g->rows[i].status, MF_OK);
        assert_int_equal(g->rows[i].length, it[i].len);
        assert_memory_equal(g->rows[i].data, it[i].row, it[i].len);
    }
    mf_get_result_free(g);

    /* The same rows again, async: every one "replaced"; one event for the batch. */
    mf_cq_t *cq;
    assert_int_equal(mf_cq_create(&cq), MF_OK);
    assert_int_equal(mf_put_batch_async(ch, it, n, 0, MF_TIMEOUT_DEFAULT, cq, it, NULL), MF_OK);
    mf_cq_event_t ev = next_event(cq);
    assert_ptr_equal(ev.tag, it);
    assert_int_equal(ev.status, MF_OK);
    for (size_t i = 0; i < n; i++)
        assert_true(it[i].result.replaced);
    assert_int_equal(mf_cq_next(cq, 0, &ev), MF_CQ_TIMEOUT);

    /* A corrupt row fails the batch before anything is sent. */
    uint8_t *bad = (uint8_t *)it[7].row;
    bad[it[7].len - 1] ^= 0x5a;
    uint64_t deleted = 0;
    assert_int_equal(mf_delete_model(ch, MODEL, -1, &deleted, MF_TIMEOUT_DEFAULT), MF_OK);
    assert_int_equal(deleted, n);
    st = mf_put_batch(ch, it, 16, 0, MF_TIMEOUT_DEFAULT);
    assert_int_not_equal(st, MF_OK);
    assert_int_equal(it[7].status, st);
    assert_non_null(strstr(mf_channel_last_error(ch), "item 7"));
    assert_int_equal(it[0].status, MF_ABORTED);
    mf_list_page_t *p = NULL;
    assert_int_equal(mf_list(ch, NULL, -1, 0, NULL, 0, &p, MF_TIMEOUT_DEFAULT), MF_OK);
    assert_int_equal(p->n_entries, 0);
    mf_list_page_free(p);
    assert_int_equal(mf_put_batch(ch, it, 0, 0, MF_TIMEOUT_DEFAULT), MF_INVALID_ARGUMENT);

    mf_cq_shutdown(cq);
    mf_cq_destroy(cq);
    for (size_t i = 0; i < n; i++)
        free((void *)it[i].row);
    free(it);
    free(tokens);
    mf_channel_close(ch);
    daemon_stop(&d, 1);
}

/* A batch larger than the daemon's host arena: the library keeps only about a quarter
 * of the arena reserved at once, so every row lands (the daemon demotes older ones to
 * the SSD tier meanwhile) instead of reservations failing for want of room. */
static void test_put_batch_bigger_than_arena(void **state)
{
    (void)state;
    daemon_t d;
    daemon_start(&d, 0, "--host_bytes", "2mb", "--write_through", "off", NULL);
    mf_channel_t *ch = chan_retry(&d, 1, 0);
    mf_server_info_t info;
    mf_channel_info(ch, &info);
    enum { NR = 40, BB = 32 };
    uint32_t tokens[NR * BB];
    tc_tokens(tokens, NR * BB, 606);
    mf_put_item_t it[NR];
    size_t total = 0;
    for (uint32_t b = 0; b < NR; b++) {
        size_t len;
        it[b] = (mf_put_item_t){.row = tc_make_row(NS, MODEL, 1, BB, 16, tokens, b,
                                                   MF_CODEC_FP16, 700 + b, &len)};
        assert_non_null(it[b].row);
        it[b].len = len;
        total += len;
    }
    assert_true(total > info.host_arena_bytes); /* more than the arena holds at once */
    mf_status_t st = mf_put_batch(ch, it, NR, 0, MF_TIMEOUT_DEFAULT);
    if (st != MF_OK)
        fail_msg("put batch: %s: %s", mf_status_name(st), mf_channel_last_error(ch));
    for (uint32_t b = 0; b < NR; b++)
        assert_int_equal(it[b].status, MF_OK);
    uint32_t layer = 1, blocks = 0;
    assert_int_equal(mf_lookup(ch, MODEL, BB, tokens, NR * BB, &layer, 1, &blocks, NULL,
                               MF_TIMEOUT_DEFAULT), MF_OK);
    assert_int_equal(blocks, NR);
    for (uint32_t b = 0; b < NR; b++)
        free((void *)it[b].row);
    mf_channel_close(ch);
    daemon_stop(&d, 1);
}

/* ==== shutdown and close ============================================================= */

static void test_cq_shutdown_and_close(void **state)
{
    (void)state;
    daemon_t d;
    daemon_start(&d, 0, NULL);
    mf_channel_t *ch = chan_retry(&d, 0, 0);
    mf_cq_t *cq;
    assert_int_equal(mf_cq_create(&cq), MF_OK);
    mf_cq_event_t ev;
    assert_int_equal(mf_cq_next(cq, 0, &ev), MF_CQ_TIMEOUT);
    assert_int_equal(kill(d.pid, SIGSTOP), 0);
    mf_health_t h[8];
    for (int i = 0; i < 8; i++)
        assert_int_equal(mf_health_async(ch, &h[i], MF_TIMEOUT_INFINITE, cq, &h[i], NULL), MF_OK);
    /* Shut down with 8 calls running: their events still come, then SHUTDOWN. */
    mf_cq_shutdown(cq);
    assert_int_equal(mf_health_async(ch, &h[0], MF_TIMEOUT_DEFAULT, cq, NULL, NULL),
                     MF_FAILED_PRECONDITION);
    assert_int_equal(mf_cq_next(cq, 0, &ev), MF_CQ_TIMEOUT);
    mf_channel_close(ch); /* cancels them */
    for (int i = 0; i < 8; i++) {
        assert_int_equal(mf_cq_next(cq, 0, &ev), MF_CQ_CALL_DONE);
        assert_int_equal(ev.status, MF_CANCELLED);
        assert_true((mf_health_t *)ev.tag >= h && (mf_health_t *)ev.tag < h + 8);
    }
    assert_int_equal(mf_cq_next(cq, MF_TIMEOUT_INFINITE, &ev), MF_CQ_SHUTDOWN);
    mf_cq_destroy(cq);
    assert_int_equal(kill(d.pid, SIGCONT), 0);
    daemon_stop(&d, 1);
}

int main(int argc, char **argv)
{
    (void)argc;
    tp_find_mapflowd(argv[0]);
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_thousand_in_flight),
        cmocka_unit_test(test_deadline_and_cancel),
        cmocka_unit_test(test_restart_unavailable_then_reconnect),
        cmocka_unit_test(test_retry_rides_out_restart),
        cmocka_unit_test(test_put_batch_long_context),
        cmocka_unit_test(test_put_batch_bigger_than_arena),
        cmocka_unit_test(test_cq_shutdown_and_close),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
