/*
 * transport_ucx — libmapflow's `ucx:HOST:PORT` transport: one UCX context, worker and
 * endpoint per connection (made again by every reconnect), carrying the protocol's frames
 * as one eager active message each (MF_UCX_AM_FRAME: eager keeps the frames of one
 * endpoint in order), plus one-sided RMA on the daemon's host arena (RemoteArenaReply:
 * address, size, packed rkey). Context, worker and endpoint are made by the setup the
 * daemon shares (proto/mf_ucx_setup.h).
 *
 * Why not daemon/ucx.c: it lives on a libevent loop and the daemon's log; the client has
 * one I/O thread that polls, so this module is a poll-driven subset of it. The worker's
 * event fd (mf__ucx_efd) goes into the I/O thread's poll set once mf__ucx_arm says the
 * worker may sleep; every wait in here progresses the worker itself.
 *
 * Frames that arrive while the owner waits for something else (an RMA, a flush) are kept
 * in an inbound queue and handed over by mf__ucx_recv, never in the middle of a reply the
 * caller is still reading. The endpoint uses UCP_ERR_HANDLING_MODE_PEER: a dead daemon is
 * an error (mf__ucx_recv returns 0, RMA fails with UNAVAILABLE), never a hang.
 *
 * Ownership: mf__ucx_t owns every UCX object and the inbound queue; sends copy the frame.
 * Thread safety: none inside. One thread at a time (the connecting thread, then the
 * channel's I/O thread); the worker is UCS_THREAD_MODE_SERIALIZED for that hand-over.
 */
#ifndef MF_CLIENT_TRANSPORT_UCX_H
#define MF_CLIENT_TRANSPORT_UCX_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "mf_frame.h"
#include "mf_status.h"


typedef struct mf__ucx mf__ucx_t;

/* Creates the context and worker and starts connecting to "HOST:PORT" / "[v6]:PORT".
 * The connection itself is established lazily by UCX: a daemon that is not there shows
 * up as an error on the first wait. err: MF__ERR_LEN-sized (channel.h). */
mf_status_t mf__ucx_connect(const char *hostport, uint32_t max_frame, mf__ucx_t **out,
                            char *err, size_t errlen);
/* Flushes what was sent (bounded, unless the endpoint failed), closes, frees. NULL ok. */
void mf__ucx_close(mf__ucx_t *u);

/* Sends one whole frame (copied) as one eager active message. MF_UNAVAILABLE once the
 * endpoint failed (why in mf__ucx_error). */
mf_status_t mf__ucx_send(mf__ucx_t *u, const void *frame, size_t len);

/* Progresses the worker and feeds the frames received so far into rd. Returns the bytes
 * fed (> 0); 0 when the endpoint failed and nothing is left (why in mf__ucx_error);
 * -1 with errno EAGAIN when there is nothing now, ENOMEM when rd cannot take them. */
ssize_t mf__ucx_recv(mf__ucx_t *u, mf_frame_reader_t *rd);

/* The worker's event fd (poll for POLLIN), and arming it: 1 = nothing pending, the
 * caller may sleep on the fd; 0 = work arrived meanwhile, call mf__ucx_recv first. */
int mf__ucx_efd(const mf__ucx_t *u);
int mf__ucx_arm(mf__ucx_t *u);

/* Waits until something may have arrived (or the endpoint failed) or the deadline
 * (monotonic ms, INT64_MAX = none) passes: MF_OK or MF_DEADLINE_EXCEEDED. */
mf_status_t mf__ucx_wait(mf__ucx_t *u, int64_t deadline);

/* Why the endpoint failed ("" while it works). */
const char *mf__ucx_error(const mf__ucx_t *u);

/* The daemon's arena from RemoteArenaReply; later RMA addresses [0, bytes) of it. */
mf_status_t mf__ucx_set_remote(mf__ucx_t *u, uint64_t address, uint64_t bytes,
                               const void *rkey, size_t rkey_len);
uint64_t mf__ucx_remote_bytes(const mf__ucx_t *u);

/* One piece of a one-sided transfer: remote arena bytes [off, off + len) <-> local. */
typedef struct mf__ucx_rma {
    uint64_t off;
    void *local;
    size_t len;
} mf__ucx_rma_t;

/*
 * Reads the n pieces (all in flight at once) and waits for all of them, bounded by the
 * deadline. MF_OUT_OF_RANGE if a piece leaves the remote arena (nothing started),
 * MF_UNAVAILABLE if the endpoint failed, MF_DEADLINE_EXCEEDED. On failure the local
 * buffers may hold part of the bytes. Message in err.
 */
mf_status_t mf__ucx_get(mf__ucx_t *u, const mf__ucx_rma_t *v, size_t n, int64_t deadline,
                        char *err, size_t errlen);
/* Writes the n pieces, then flushes the endpoint: on MF_OK the bytes are in the remote
 * arena (what a PutCommit sent afterwards relies on). Same errors as mf__ucx_get. */
mf_status_t mf__ucx_put(mf__ucx_t *u, const mf__ucx_rma_t *v, size_t n, int64_t deadline,
                        char *err, size_t errlen);

#endif /* MF_CLIENT_TRANSPORT_UCX_H */
