/*
 * cq — completion queues of libmapflow's async calls (mf_cq_*, declared in mapflow.h):
 * a mutex-guarded FIFO of finished calls' events, with a count of calls started on it
 * and not yet finished so that mf_cq_next can tell "empty for now" from "shut down and
 * drained", as gRPC's completion queue does.
 *
 * Ownership: the queue owns its queued events (copied out by mf_cq_next). It is freed
 * by mf_cq_destroy, after mf_cq_shutdown and once mf_cq_next returned SHUTDOWN.
 * Thread safety: every function may be called from any thread; the channel's I/O thread
 * posts with the channel lock held (the queue never takes a channel lock).
 */
#ifndef MF_CLIENT_CQ_H
#define MF_CLIENT_CQ_H

#include "mapflow.h"

/* Counts a call about to start on cq; FAILED_PRECONDITION once the queue is shut down. */
mf_status_t mf__cq_begin(mf_cq_t *cq);
/* Undoes mf__cq_begin for a call that did not start after all. */
void mf__cq_abandon(mf_cq_t *cq);
/* Queues the event of a finished call (one per mf__cq_begin). */
void mf__cq_post(mf_cq_t *cq, void *tag, mf_status_t st, const char *message);

#endif /* MF_CLIENT_CQ_H */
