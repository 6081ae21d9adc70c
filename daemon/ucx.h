/*
 * ucx — mapflowd's UCX transport (DESIGN §7): one context (RMA + AM + WAKEUP), one
 * worker driven by the daemon's libevent loop through its event fd (ucp_worker_get_efd,
 * then ucp_worker_arm before the loop sleeps: nothing spins while idle), the host arena
 * registered once (ucp_mem_map) with its packed rkey, an optional listener, and endpoints.
 *
 * Messages: one protocol frame (proto/mf_frame.h) = one active message (MF_UCX_AM_FRAME),
 * always sent eager so the frames of one endpoint arrive in the order they were sent.
 * Context, worker and client endpoints are made by the setup libmapflow shares
 * (proto/mf_ucx_setup.h).
 *
 * Listener side: every accepted endpoint is bridged to a socketpair. One end goes to the
 * `adopt` callback (the server serves it like any accepted stream: Hello and token, a
 * namespace, leases that die with the connection, backpressure); ucx.c moves whole frames
 * between the other end and the endpoint. Why: one connection implementation in
 * conn.c for every transport. Only control frames cross the pair — rows move by
 * one-sided RMA on the arena — so the extra copy is small.
 * Client side (peer.c, tools): mfd_ucx_connect returns an endpoint whose frames arrive
 * whole at a callback; mfd_ucx_get / mfd_ucx_put move bytes one-sided through the
 * remote arena's unpacked rkey, bounds-checked against the remote arena size.
 *
 * Errors: every endpoint uses UCP_ERR_HANDLING_MODE_PEER, so a dead peer is an error,
 * never a hang: its operations in flight complete with MF_UNAVAILABLE (MF_CANCELLED after
 * mfd_ucx_close) and on_error is called once. A bridged endpoint that fails closes its
 * socketpair end, so the server releases that connection's leases and reservations.
 *
 * Ownership: mfd_ucx_t owns the UCX objects, the listener and every endpoint's memory;
 * a client endpoint handle stays valid until mfd_ucx_close (its memory lives on until
 * its last operation completes). Callbacks run on the loop thread, from inside worker
 * progress: they may start operations and close endpoints (closing is deferred).
 * Thread safety: loop thread only (the worker is UCS_THREAD_MODE_SINGLE).
 */
#ifndef MFD_UCX_H
#define MFD_UCX_H

#include <event2/event.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include "mf_status.h"

typedef struct mfd_ucx mfd_ucx_t;
typedef struct mfd_ucx_ep mfd_ucx_ep_t;

/* Hands an accepted, bridged stream to the server; it owns fd from now on (also on error). */
typedef mf_status_t (*mfd_ucx_adopt_cb)(void *arg, int fd, const char *peer_name);

enum {
    MFD_UCX_P_ARENA = 1u << 0,    /* arena, arena_bytes */
    MFD_UCX_P_LISTEN = 1u << 1,   /* listen, adopt, adopt_arg */
    MFD_UCX_P_MAX_FRAME = 1u << 2,
};

typedef struct mfd_ucx_params {
    unsigned field_mask;           /* MFD_UCX_P_*; base is required */
    struct event_base *base;
    void *arena;                   /* registered with ucp_mem_map (remote RMA target) */
    uint64_t arena_bytes;
    const char *listen;            /* "host:port" (port 0 = any) */
    mfd_ucx_adopt_cb adopt;
    void *adopt_arg;
    uint32_t max_frame;            /* largest frame accepted (default 64 MiB) */
} mfd_ucx_params_t;

mf_status_t mfd_ucx_create(const mfd_ucx_params_t *p, mfd_ucx_t **out, char *err,
                           size_t errlen);
/* Force-closes every endpoint (their operations complete with MF_CANCELLED), then frees. */
void mfd_ucx_destroy(mfd_ucx_t *u);
/* Stops accepting (drain); endpoints stay. */
void mfd_ucx_stop_listening(mfd_ucx_t *u);
/* "host:port" the listener is bound to (real port), "" without one. */
const char *mfd_ucx_bound(const mfd_ucx_t *u);
/* The arena registration for RemoteArenaReply: base address, size, packed rkey. */
mf_status_t mfd_ucx_arena_key(const mfd_ucx_t *u, uint64_t *address, uint64_t *bytes,
                              const void **rkey, size_t *rkey_len);
/* Endpoints open now (bridged + client), for gauges and tests. */
size_t mfd_ucx_endpoints(const mfd_ucx_t *u);

/* Addresses ("host:port", "[v6]:port") are parsed by proto/mf_addr.h. */

/* ---- client endpoints ---------------------------------------------------------------- */

typedef struct mfd_ucx_ep_cbs {
    /* One whole frame (8-byte header included), already length-checked; valid only
     * during the call. */
    void (*on_frame)(void *arg, const uint8_t *frame, size_t len);
    /* Once, when the endpoint fails (peer died, refused, unreachable, protocol error). */
    void (*on_error)(void *arg, mf_status_t st, const char *why);
    void *arg;
} mfd_ucx_ep_cbs_t;

mf_status_t mfd_ucx_connect(mfd_ucx_t *u, const char *addr, const mfd_ucx_ep_cbs_t *cbs,
                            mfd_ucx_ep_t **out, char *err, size_t errlen);
/* No callback of cbs runs after this; operations in flight complete with MF_CANCELLED. */
void mfd_ucx_close(mfd_ucx_ep_t *ep);

/* Sends one frame (copied). MF_UNAVAILABLE once the endpoint has failed. */
mf_status_t mfd_ucx_send(mfd_ucx_ep_t *ep, const void *frame, size_t len);

/* The peer's arena (RemoteArenaReply): later gets / puts address [0, bytes) of it. */
mf_status_t mfd_ucx_set_remote(mfd_ucx_ep_t *ep, uint64_t address, uint64_t bytes,
                               const void *rkey, size_t rkey_len);

typedef void (*mfd_ucx_done_cb)(void *arg, mf_status_t st);
/*
 * One-sided read of remote arena bytes [off, off + len) into dst / write of src there.
 * cb runs exactly once, later, from worker progress (never inside this call) — unless
 * this call returns an error, in which case it never runs. MF_OUT_OF_RANGE when the
 * range leaves the remote arena, MF_FAILED_PRECONDITION without mfd_ucx_set_remote.
 * A put is complete at the peer only after mfd_ucx_flush's callback.
 */
mf_status_t mfd_ucx_get(mfd_ucx_ep_t *ep, uint64_t off, void *dst, size_t len,
                        mfd_ucx_done_cb cb, void *arg);
mf_status_t mfd_ucx_put(mfd_ucx_ep_t *ep, uint64_t off, const void *src, size_t len,
                        mfd_ucx_done_cb cb, void *arg);
mf_status_t mfd_ucx_flush(mfd_ucx_ep_t *ep, mfd_ucx_done_cb cb, void *arg);

#endif /* MFD_UCX_H */
