/* channel_call — running an operation: synchronously (the caller waits on a condition)
 * or on a completion queue, cancel / free of a call handle, one-request operations, and
 * groups (a batch of kids completing as one call, pumped through a byte window). See
 * channel.h; the engine underneath is channel.c. */
#include "channel.h"
#include "channel_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cq.h"


static void done_sync(mf__op_t *op)
{
    op->finished = 1;
    pthread_cond_signal(&op->cv);
}

mf_status_t mf__op_run(mf__op_t *op, int64_t timeout_ms)
{
    mf_channel_t *ch = op->ch;
    pthread_cond_init(&op->cv, NULL);
    op->has_cv = 1;
    op->done = done_sync;
    mf_status_t st = mf__op_start(op, timeout_ms);
    pthread_mutex_lock(&ch->mu);
    if (st == MF_OK) {
        while (!op->finished)
            pthread_cond_wait(&op->cv, &ch->mu);
        st = op->status;
    }
    snprintf(ch->err, sizeof(ch->err), "%s", st == MF_OK ? "" : op->err);
    pthread_mutex_unlock(&ch->mu);
    mf__op_unref(op);
    return st;
}

static void done_cq(mf__op_t *op)
{
    mf__cq_post(op->cq, op->tag, op->status, op->err);
}

mf_status_t mf__op_run_async(mf__op_t *op, int64_t timeout_ms, mf_cq_t *cq, void *tag,
                             mf_call_t **call)
{
    mf_channel_t *ch = op->ch;
    if (call)
        *call = NULL;
    mf_status_t st = cq ? mf__cq_begin(cq) : MF_INVALID_ARGUMENT;
    if (st != MF_OK) {
        mf__chan_error(ch, st, cq ? "the completion queue is shut down" : "no completion queue");
        mf__op_unref(op);
        return st;
    }
    op->cq = cq;
    op->tag = tag;
    op->done = done_cq;
    if (call) {
        __atomic_add_fetch(&op->refs, 1, __ATOMIC_ACQ_REL);
        *call = op;
    }
    st = mf__op_start(op, timeout_ms);
    if (st != MF_OK) {
        mf__cq_abandon(cq);
        pthread_mutex_lock(&ch->mu);
        snprintf(ch->err, sizeof(ch->err), "%s", op->err);
        pthread_mutex_unlock(&ch->mu);
        if (call) {
            *call = NULL;
            mf__op_unref(op);
        }
    }
    mf__op_unref(op);
    return st;
}

MF_EXPORT mf_status_t mf_call_cancel(mf_call_t *call)
{
    if (!call)
        return MF_INVALID_ARGUMENT;
    mf_channel_t *ch = call->ch;
    pthread_mutex_lock(&ch->mu);
    mf_status_t st = MF_OK;
    if (call->state == MF__OP_DONE) {
        st = MF_FAILED_PRECONDITION;
    } else {
        call->cancel_req = 1;
        for (size_t i = 0; i < call->n_kids; i++)
            call->kids[i]->cancel_req = 1;
        ch->cancels = 1;
        mf__wake_io(ch);
    }
    pthread_mutex_unlock(&ch->mu);
    return st;
}

MF_EXPORT void mf_call_free(mf_call_t *call)
{
    mf__op_unref(call);
}

/* ==== one-request operations ========================================================= */

typedef struct simple {
    mf__take_fn take;
    void *arg;
    void (*free_arg)(void *);
} simple_t;

static mf_status_t simple_start(mf__op_t *op)
{
    (void)op; /* packed once at creation; a retry sends the same bytes */
    return MF_OK;
}

static int simple_step(mf__op_t *op, const mf__reply_t *rep)
{
    simple_t *s = op->priv;
    return s->take ? (int)s->take(op, rep, s->arg) : MF_OK;
}

static void simple_destroy(mf__op_t *op)
{
    simple_t *s = op->priv;
    if (s->free_arg)
        s->free_arg(s->arg);
    free(s);
}

static const mf__op_vt_t simple_vt = {simple_start, simple_step, NULL, simple_destroy};

mf__op_t *mf__simple_new(mf_channel_t *ch, const mf_envelope_t *req, const void *payload,
                         size_t payload_len, int want_case, mf__take_fn take, void *arg,
                         void (*free_arg)(void *))
{
    simple_t *s = malloc(sizeof(*s));
    mf__op_t *op = s ? mf__op_new(ch, &simple_vt, s) : NULL;
    if (!op) {
        free(s);
        if (free_arg)
            free_arg(arg);
        mf__chan_error(ch, MF_RESOURCE_EXHAUSTED, "out of memory");
        return NULL;
    }
    *s = (simple_t){take, arg, free_arg};
    if (mf__op_pack(op, req, payload, payload_len, want_case) != MF_OK) {
        mf__chan_error(ch, MF_RESOURCE_EXHAUSTED, "out of memory");
        mf__op_unref(op);
        return NULL;
    }
    return op;
}

/* ==== groups (batched calls) ========================================================= */

static mf_status_t group_start(mf__op_t *op)
{
    (void)op;
    return MF_INTERNAL; /* a group sends nothing itself */
}

static void group_destroy(mf__op_t *op)
{
    for (size_t i = 0; i < op->n_kids; i++)
        mf__op_unref(op->kids[i]);
    free(op->kids);
    if (op->group_free)
        op->group_free(op->priv);
}

static const mf__op_vt_t group_vt = {group_start, NULL, NULL, group_destroy};

mf__op_t *mf__group_new(mf_channel_t *ch, size_t n, void *priv, void (*free_priv)(void *))
{
    mf__op_t *g = mf__op_new(ch, &group_vt, priv);
    mf__op_t **kids = calloc(n ? n : 1, sizeof(*kids));
    if (!g || !kids) {
        free(g);
        free(kids);
        if (free_priv)
            free_priv(priv);
        mf__chan_error(ch, MF_RESOURCE_EXHAUSTED, "out of memory");
        return NULL;
    }
    g->kids = kids;
    g->group_free = free_priv;
    return g;
}

void mf__group_add(mf__op_t *g, mf__op_t *kid)
{
    kid->group = g;
    kid->done = NULL;
    g->kids[g->n_kids++] = kid; /* the group's reference */
}

static void do_group_pump(mf_channel_t *ch, mf__op_t *g);

/* A kid finished (lock held): record it, start more; the last one finishes the group. */
void mf__do_kid_done(mf_channel_t *ch, mf__op_t *kid)
{
    mf__op_t *g = kid->group;
    g->window_bytes -= kid->weight;
    if (kid->status != MF_OK && (g->status == MF_OK || kid->group_index < g->fail_index)) {
        g->status = kid->status;
        g->fail_index = kid->group_index;
        snprintf(g->err, sizeof(g->err), "item %zu: %.400s", kid->group_index, kid->err);
    }
    if (g->group_kid_done)
        g->group_kid_done(kid);
    if (--g->kids_left > 0) {
        if (!g->pumping)
            do_group_pump(ch, g);
        return;
    }
    g->state = MF__OP_DONE;
    g->done(g);
    mf__op_unref(g); /* the engine's reference */
}

/* Starts kids while their bytes fit the window (at least one runs): a batch pipelines
 * as far as the daemon can hold the reservations at once, never all of a huge batch.
 * Lock held. */
static void do_group_pump(mf_channel_t *ch, mf__op_t *g)
{
    __atomic_add_fetch(&g->refs, 1, __ATOMIC_ACQ_REL); /* a failing start may finish g */
    g->pumping = 1;
    while (g->next_kid < g->n_kids) {
        mf__op_t *k = g->kids[g->next_kid];
        if (g->window_bytes > 0 && g->window_bytes + k->weight > g->window_budget)
            break;
        k->group_index = g->next_kid++;
        g->window_bytes += k->weight;
        if (mf__do_op_start(ch, k, g->deadline) != MF_OK) { /* closing: it never ran */
            k->state = MF__OP_DONE;
            k->status = MF_UNAVAILABLE;
            mf__do_kid_done(ch, k);
        }
    }
    g->pumping = 0;
    mf__op_unref(g);
}

/* Starts the kids; the group completes through g->done when the last one finishes. */
mf_status_t mf__group_run(mf__op_t *g, int64_t timeout_ms)
{
    mf_channel_t *ch = g->ch;
    pthread_mutex_lock(&ch->mu);
    g->status = MF_OK;
    g->fail_index = SIZE_MAX;
    g->kids_left = g->n_kids;
    g->state = MF__OP_IN_FLIGHT;
    g->deadline = mf__deadline_of(ch, timeout_ms);
    /* A quarter of the arena (the daemon's host tier); 16 MiB without one. */
    uint64_t arena = ch->conn.arena_reach;
    g->window_budget = arena ? arena / 4 : (16u << 20);
    __atomic_add_fetch(&g->refs, 1, __ATOMIC_ACQ_REL); /* the engine's */
    do_group_pump(ch, g);
    pthread_mutex_unlock(&ch->mu);
    return MF_OK;
}
