/*
 * peer — peer daemons over UCX (DESIGN §7 "Peers"): the daemon's UCX side and its peer
 * client.
 *
 * Serving: with config `ucx` set, mfd_peers_create starts ucx.c with the host arena
 * registered and a listener whose connections the server adopts as transport "ucx"
 * (token required when the daemon has one). Such a connection gets has_arena from
 * Hello{want_host_arena}, so GET_LEASE and in-arena puts work over it, and RemoteArena
 * (mfd_peers_remote_arena) hands it the arena's address, size and packed rkey.
 *
 * Fetching (read-through): a Get naming `peer` whose rows are partly missing here comes
 * to mfd_peers_get (rows.c passes only peers listed in config `peers`). One link per (peer address, namespace) — Hello with this daemon's
 * `token`, then RemoteArena — asks the peer for leases on exactly the missing keys
 * (Get by keys, GET_LEASE), pulls the rows with pipelined one-sided gets (chunks of
 * MFD_PEER_CHUNK, up to MFD_PEER_WINDOW in flight) straight into reserved blocks of our
 * own arena, releases the leases, verifies each row (checksum, and for a prefix Get its
 * tokens and parent hash) and commits it; only then does the Get's operation resume
 * (the mfd_peer_get_done callback), so nothing half-written is ever visible. Rows the peer could
 * not deliver carry the reason: UNAVAILABLE (peer dead, unreachable or too slow — the
 * transfer must end within the peer's lease TTL), UNAUTHENTICATED (token refused),
 * DATA_LOSS (failed verification), NOT_FOUND, RESOURCE_EXHAUSTED (no room here).
 * A Lookup naming `peer` asks the peer too and answers, per layer, the larger of the two
 * leading-block counts (a lower bound of what a Get through the peer can serve); if the
 * peer cannot answer, the local counts go back and the peer's error is counted.
 *
 * The links (Hello, RemoteArena, calls with deadlines) are peer_link.c's, private to
 * this module. The UCX context is created at start when `ucx` is set, else on the first
 * request that names a peer (no listener then). Metrics: mfd_peers_metrics (appended to /metrics).
 *
 * Ownership: the server owns its mfd_peers_t; links are reference-counted by the cache
 * and the operations using them. A client connection waiting on a peer is held
 * (mfd_conn_hold) and its request copied, so it may close meanwhile.
 * Thread safety: loop thread only.
 */
#ifndef MFD_PEER_H
#define MFD_PEER_H

#include <stddef.h>
#include <stdint.h>
#include "mapflow.pb-c.h"
#include "mf_status.h"
#include "conn.h"
#include "ucx.h"

#define MFD_PEER_CHUNK ((size_t)1 << 20)
#define MFD_PEER_WINDOW 16u

struct mfd_server;
struct mfd_conn;
typedef struct mfd_peers mfd_peers_t;

extern const mfd_transport_t mfd_transport_ucx;

/* Server side: always succeeds without `ucx` (nothing started until a peer is named). */
mf_status_t mfd_peers_create(struct mfd_server *s, mfd_peers_t **out, char *err,
                             size_t errlen);
void mfd_peers_stop_listening(mfd_peers_t *ps);
/* Fails every operation in flight (rows UNAVAILABLE, replies to live clients), closes. */
void mfd_peers_destroy(mfd_peers_t *ps);
mfd_ucx_t *mfd_peers_ucx(const mfd_peers_t *ps);

/* ---- request hooks (dispatch.c, rows.c) ---------------------------------------------- */

void mfd_peers_remote_arena(struct mfd_conn *c, uint64_t rid);

/* A read-through fetch is over. m is the client's Get (the peer's copy, valid during the
 * call) and forced[i] (non-zero) row i's status when it is still missing here; both NULL
 * when this module already answered the client with an error (the caller only frees). */
typedef void (*mfd_peer_get_done)(void *arg, const Mapflow__V1__Get *m,
                                  const mf_status_t *forced);
/* m is the client's Get; missing[] the indexes (layer-major row order) not found here.
 * done(arg, ...) runs exactly once, maybe before this returns. */
void mfd_peers_get(struct mfd_conn *c, uint64_t rid, const Mapflow__V1__Get *m,
                   const uint8_t *payload, size_t plen, double t0, const uint32_t *missing,
                   size_t n_missing, mfd_peer_get_done done, void *done_arg);

/* The peer's per-layer leading-block counts (NULL: it did not answer); m, payload: the
 * client's Lookup. Not called when the request failed here (the client got the error). */
typedef void (*mfd_peer_lookup_done)(struct mfd_conn *c, uint64_t rid,
                                     const Mapflow__V1__Lookup *m, const uint8_t *payload,
                                     size_t plen, double t0, const uint32_t *peer_blocks,
                                     size_t n_peer_blocks);
void mfd_peers_lookup(struct mfd_conn *c, uint64_t rid, const Mapflow__V1__Lookup *m,
                      const uint8_t *payload, size_t plen, double t0,
                      mfd_peer_lookup_done done);

/* Appends the peer families to /metrics (an mfd_prom_more_cb; arg: the mfd_peers_t, or
 * NULL for the families with no samples). */
void mfd_peers_metrics(mfd_prom_t *b, void *arg);

/* ---- standalone client (tools, benchmarks): fetch rows into caller buffers ------------- */

typedef struct mfd_peer_row {
    uint32_t layer;
    uint8_t hash[16];          /* key at the peer (model given per fetch) */
    uint8_t *dst;              /* caller's buffer of `cap` bytes */
    uint64_t cap;
    uint64_t len;              /* out: row length */
    mf_status_t status;        /* out */
} mfd_peer_row_t;

/* A client-only instance on `base` (creates its own UCX context; no listener). */
mf_status_t mfd_peers_create_client(struct event_base *base, const char *token,
                                    uint32_t max_frame, mfd_peers_t **out, char *err,
                                    size_t errlen);
/* Fetches rows (any number; sent in batches the peer accepts); done runs once, later. */
mf_status_t mfd_peers_fetch(mfd_peers_t *ps, const char *addr, const char *ns,
                            const char *model, mfd_peer_row_t *rows, size_t n,
                            void (*done)(void *arg), void *arg);

#endif /* MFD_PEER_H */
