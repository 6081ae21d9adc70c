/* cq — completion queues (see cq.h). */
#include "cq.h"
#include "mf_clock.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct cq_item {
    struct cq_item *next;
    mf_cq_event_t ev;
} cq_item_t;

struct mf_cq {
    pthread_mutex_t mu;
    pthread_cond_t cv;          /* CLOCK_MONOTONIC */
    cq_item_t *head, *tail;
    size_t outstanding;         /* started, not yet posted */
    int shutdown;
};

MF_EXPORT mf_status_t mf_cq_create(mf_cq_t **out)
{
    if (!out)
        return MF_INVALID_ARGUMENT;
    mf_cq_t *cq = calloc(1, sizeof(*cq));
    if (!cq)
        return MF_RESOURCE_EXHAUSTED;
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_mutex_init(&cq->mu, NULL);
    pthread_cond_init(&cq->cv, &a);
    pthread_condattr_destroy(&a);
    *out = cq;
    return MF_OK;
}

mf_status_t mf__cq_begin(mf_cq_t *cq)
{
    pthread_mutex_lock(&cq->mu);
    mf_status_t st = cq->shutdown ? MF_FAILED_PRECONDITION : MF_OK;
    if (st == MF_OK)
        cq->outstanding++;
    pthread_mutex_unlock(&cq->mu);
    return st;
}

void mf__cq_abandon(mf_cq_t *cq)
{
    pthread_mutex_lock(&cq->mu);
    cq->outstanding--;
    pthread_cond_broadcast(&cq->cv); /* a shut-down queue may now be drained */
    pthread_mutex_unlock(&cq->mu);
}

void mf__cq_post(mf_cq_t *cq, void *tag, mf_status_t st, const char *message)
{
    cq_item_t *it = malloc(sizeof(*it));
    pthread_mutex_lock(&cq->mu);
    cq->outstanding--;
    if (it) {
        it->next = NULL;
        it->ev.type = MF_CQ_CALL_DONE;
        it->ev.tag = tag;
        it->ev.status = st;
        snprintf(it->ev.message, sizeof(it->ev.message), "%s", message ? message : "");
        if (cq->tail)
            cq->tail->next = it;
        else
            cq->head = it;
        cq->tail = it;
    }
    /* Out of memory loses this event; nothing better can be done without blocking the
     * I/O thread, and a 300-byte malloc failing means the process is about to die. */
    pthread_cond_signal(&cq->cv);
    pthread_mutex_unlock(&cq->mu);
}

MF_EXPORT mf_cq_event_type_t mf_cq_next(mf_cq_t *cq, int64_t timeout_ms, mf_cq_event_t *ev)
{
    mf_cq_event_t dummy;
    if (!ev)
        ev = &dummy;
    memset(ev, 0, sizeof(*ev));
    ev->type = MF_CQ_TIMEOUT;
    if (!cq)
        return ev->type;
    struct timespec dl = mf_timespec_after_ms(timeout_ms >= 0 ? timeout_ms : 0);
    pthread_mutex_lock(&cq->mu);
    for (;;) {
        if (cq->head) {
            cq_item_t *it = cq->head;
            cq->head = it->next;
            if (!cq->head)
                cq->tail = NULL;
            *ev = it->ev;
            free(it);
            break;
        }
        if (cq->shutdown && cq->outstanding == 0) {
            ev->type = MF_CQ_SHUTDOWN;
            break;
        }
        if (timeout_ms == 0)
            break;
        int r = timeout_ms < 0 ? pthread_cond_wait(&cq->cv, &cq->mu)
                               : pthread_cond_timedwait(&cq->cv, &cq->mu, &dl);
        if (r == ETIMEDOUT)
            break;
    }
    pthread_mutex_unlock(&cq->mu);
    return ev->type;
}

MF_EXPORT void mf_cq_shutdown(mf_cq_t *cq)
{
    if (!cq)
        return;
    pthread_mutex_lock(&cq->mu);
    cq->shutdown = 1;
    pthread_cond_broadcast(&cq->cv);
    pthread_mutex_unlock(&cq->mu);
}

MF_EXPORT void mf_cq_destroy(mf_cq_t *cq)
{
    if (!cq)
        return;
    while (cq->head) {
        cq_item_t *it = cq->head;
        cq->head = it->next;
        free(it);
    }
    pthread_cond_destroy(&cq->cv);
    pthread_mutex_destroy(&cq->mu);
    free(cq);
}
