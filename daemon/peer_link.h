/*
 * peer_link — the links of the peer client (peer.h): one UCX endpoint per (peer address,
 * namespace), opened with Hello (this daemon's token, want_host_arena) then RemoteArena;
 * a call's reply goes to its callback, and every call has a deadline (a peer that stops
 * answering is killed by the sweep). Request ids, the pending table, reply routing and
 * the handshake's checks are the shared protocol core, proto/mf_session.h. Also the
 * mfd_peers_t state that peer.c's fetches, read-through and Lookup share with it, and the
 * per-peer counters.
 *
 * Only peer.c includes this; other modules use peer.h. The UCX context must exist
 * (peer.c's ensure_ucx) before mfd_link_get.
 *
 * Ownership: the cache (ps->links) holds one reference to each live link, every
 * operation using it another (mfd_link_unref frees at zero); a call's callback runs
 * exactly once (reply, error, link death). Thread safety: loop thread only.
 */
#ifndef MFD_PEER_LINK_H
#define MFD_PEER_LINK_H

#include <event2/event.h>
#include <stddef.h>
#include <stdint.h>
#include "mapflow.pb-c.h"
#include "mf_frame.h"
#include "mf_session.h"
#include "mf_status.h"
#include "index.h"
#include "metrics.h"
#include "ucx.h"

/* Bound on a peer's answer to a control request (Hello, Get, Lookup). */
#define MFD_PEER_CALL_MS 10000u
#define MAX_PEER_STATS 64   /* label cardinality bound: later peers share one row */

struct mfd_server;
typedef struct mfd_peers mfd_peers_t;

typedef struct peer_stat {
    char addr[128];
    uint64_t rows, bytes, errors, requests;
} peer_stat_t;

typedef struct link link_t;
typedef void (*reply_cb)(void *arg, mf_status_t st, const char *why, const mf_envelope_t *env,
                         const mf_frame_t *f);
typedef void (*ready_cb)(void *arg, mf_status_t st, const char *why);

typedef struct call {         /* a pending call: the session's user pointer */
    reply_cb cb;
    void *arg;
} call_t;

typedef struct waiter {
    ready_cb fn;
    void *arg;
    struct waiter *next;
} waiter_t;

struct link {
    mfd_peers_t *ps;
    char addr[128];
    char ns[MFD_NS_MAX + 1];
    mfd_ucx_ep_t *ep;
    mf_session_t sess;       /* ids and pending calls */
    mf_session_far_t far;    /* the handshake (far.stage) and what the peer said */
    int dead;
    mf_status_t dead_st;
    char why[200];
    uint32_t max_batch;
    waiter_t *waiters;
    unsigned refs;           /* the cache while alive + every operation using it */
    peer_stat_t *stat;
    link_t *next;
};

struct mfd_peers {
    struct mfd_server *srv;  /* NULL: standalone client */
    struct event_base *base;
    mfd_ucx_t *ucx;
    const char *token;       /* srv: read from the live config at each connect */
    char own_token[256];
    uint32_t max_frame;
    link_t *links;           /* live links (cache) */
    struct event *sweep;
    peer_stat_t stats[MAX_PEER_STATS + 1];
    size_t n_stats;
    mfd_hist_t hist;         /* fetch duration */
    uint64_t fetch_bytes, fetch_rows;
    int destroying;
};

/* Hello and RemoteArena are done and the link is alive. */
static inline int mfd_link_ready(const link_t *l)
{
    return !l->dead && l->far.stage == MF_SESSION_READY;
}

/* The counters of peer addr (the shared "other" row past MAX_PEER_STATS peers). */
peer_stat_t *mfd_peer_stat(mfd_peers_t *ps, const char *addr);
/* The cached link to addr for ns, or a new one (Hello sent); NULL with *st and err. */
link_t *mfd_link_get(mfd_peers_t *ps, const char *addr, const char *ns, char *err,
                     size_t errlen, mf_status_t *st);
/* Sends env (its request_id assigned here); cb runs once with the reply or the failure. */
mf_status_t mfd_link_call(link_t *l, mf_envelope_t *env, const void *payload, size_t plen,
                          reply_cb cb, void *arg);
/* fn runs once: now if the link is ready, else when it becomes ready or dies. */
void mfd_link_when_ready(link_t *l, ready_cb fn, void *arg);
/* The link is done for: fail its calls and waiters, close the endpoint, leave the cache. */
void mfd_link_kill(link_t *l, mf_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void mfd_link_unref(link_t *l);
/* The sweep timer's callback (arg: the mfd_peers_t): kills links with a call past due. */
void mfd_links_sweep(evutil_socket_t fd, short what, void *arg);

#endif /* MFD_PEER_LINK_H */
