/*
 * mf_session — the sans-IO core of one protocol session, for both ends that call a
 * daemon: libmapflow's channel (client/channel*.c) and mapflowd's peer links
 * (daemon/peer_link.c). It holds what the wire protocol needs and no I/O does:
 *
 *  - request ids: fresh, increasing, never 0 (0 means "no request" on the wire);
 *  - the table of pending requests, each with the caller's pointer and a deadline, a
 *    bound on how many may be pending (a full table is RESOURCE_EXHAUSTED, not growth
 *    without end), and the earliest deadline for the caller's timer;
 *  - routing a reply to its request by id (a duplicate or unknown id finds nothing);
 *  - the reply rule: an ErrorReply becomes its status (a code outside the status table,
 *    or 0, is MF_UNKNOWN) and message, a reply of the wrong type is MF_INTERNAL;
 *  - the far side's Hello / RemoteArena state (mf_session_far_t): what its HelloReply
 *    and RemoteArenaReply said, checked and bounded, and how far the handshake is.
 *
 * No sockets, threads, event loops or UCX, and no clock: the caller passes deadlines and
 * `now` (mf_clock.h milliseconds) and drives it from its own loop (the client's poll
 * thread, the daemon's libevent loop), sending the bytes itself.
 *
 * Ownership: a session owns its table; the user pointers in it stay the caller's (a
 * request taken out by take / expire / drain is the caller's to finish). Thread safety:
 * none of its own; the caller serialises (the channel under ch->mu, a peer link on the
 * loop thread).
 */
#ifndef MF_SESSION_H
#define MF_SESSION_H

#include <stddef.h>
#include <stdint.h>
#include "mf_frame.h"
#include "mf_status.h"

/* Most pending requests a session ever holds unless its owner asks for fewer. */
#define MF_SESSION_MAX_PENDING (1u << 20)
/* Longest rkey a RemoteArenaReply may carry (UCX packs a few hundred bytes). */
#define MF_SESSION_MAX_RKEY 4096u

typedef struct mf_session_pend mf_session_pend_t; /* private: one pending request */

typedef struct mf_session {
    uint64_t last_id;           /* the last id handed out */
    size_t max_pending;
    size_t n;                   /* pending now */
    size_t cap;                 /* heap slots allocated */
    mf_session_pend_t *heap;    /* min-heap by deadline */
    uint32_t *index;            /* open addressing: id → heap position + 1 (0 = empty) */
    size_t index_mask;
} mf_session_t;

/* An empty session allowing max_pending (1..MF_SESSION_MAX_PENDING; 0 = the most)
 * pending requests. Allocates nothing yet; cannot fail. */
void mf_session_init(mf_session_t *s, size_t max_pending);
/* Frees the table (the pending requests' user pointers are not touched). */
void mf_session_deinit(mf_session_t *s);

/* A fresh request id for a request nobody waits for (Hello on a blocking exchange, a
 * one-way Release); never 0, never one handed out before. */
uint64_t mf_session_next_id(mf_session_t *s);

/* Records a pending request due by deadline (INT64_MAX = none) with the caller's user
 * pointer (not NULL); its fresh id goes to *rid. MF_RESOURCE_EXHAUSTED when max_pending
 * are pending (the table is full) or memory runs out; nothing is recorded then. */
mf_status_t mf_session_add(mf_session_t *s, int64_t deadline, void *user, uint64_t *rid);
/* Takes the pending request of id rid out: its user pointer, or NULL when there is none
 * (an id never sent, already answered: a duplicate reply, expired, or 0). */
void *mf_session_take(mf_session_t *s, uint64_t rid);
/* The user pointer of pending request rid, left in the table; NULL when there is none. */
void *mf_session_find(const mf_session_t *s, uint64_t rid);
/* The earliest deadline of a pending request; INT64_MAX when none is pending. */
int64_t mf_session_next_deadline(const mf_session_t *s);
/* Takes out one pending request whose deadline is at or before now (the earliest):
 * its user pointer (id in *rid when rid is not NULL), or NULL when none is due. */
void *mf_session_expire(mf_session_t *s, int64_t now, uint64_t *rid);
/* Takes out any one pending request (the connection is gone: fail them all); NULL when
 * none is left. */
void *mf_session_drain(mf_session_t *s, uint64_t *rid);
/* How many requests are pending. */
size_t mf_session_pending(const mf_session_t *s);

/*
 * The reply rule for a decoded envelope answering a request that wants body want_case
 * (0 = any body but an ErrorReply): MF_OK, or the ErrorReply's status with its message
 * (the status table's text when it has none), or MF_INTERNAL naming both types. The
 * message goes to err (errlen bytes, always terminated).
 */
mf_status_t mf_session_reply_status(const mf_envelope_t *env, int want_case, char *err,
                                    size_t errlen);

/* ---- the far side: Hello and RemoteArena ---- */

enum mf_session_stage {
    MF_SESSION_HELLO = 0,       /* Hello sent, no HelloReply yet */
    MF_SESSION_ARENA,           /* RemoteArena sent (UCX), no reply yet */
    MF_SESSION_READY,           /* the handshake is done */
};

typedef struct mf_session_far {
    int stage;                  /* enum mf_session_stage */
    uint64_t session_id;
    uint32_t max_frame;         /* the smaller of ours and the far side's */
    uint32_t max_batch;         /* as announced (0: the far side said nothing) */
    int gpu_tier;
    uint64_t host_arena_bytes;
    int host_arena_fd;          /* an fd came with the HelloReply (unix sockets) */
    size_t n_gpu_arenas;
    uint64_t remote_address;    /* RemoteArena: where the arena starts, how large */
    uint64_t remote_bytes;
} mf_session_far_t;

/* Flags of mf_session_far_hello. */
#define MF_SESSION_NEED_ARENA 1u   /* refuse a far side that offers no host arena */
#define MF_SESSION_REMOTE 2u       /* RemoteArena comes next (UCX: rows move by RMA) */

/* Fills h with what every Hello says: protocol version, namespace, token, client name,
 * want_host_arena (the strings are borrowed; NULL token = ""). */
void mf_session_hello_init(Mapflow__V1__Hello *h, const char *ns, const char *token,
                           const char *client_name, int want_host_arena);
/*
 * The reply to Hello: checks it (reply rule above; flags MF_SESSION_NEED_ARENA), fills
 * far (max_frame: the far side's when it is at least MF_FRAME_MIN_MAX and below
 * own_max_frame, else own_max_frame) and moves it to MF_SESSION_ARENA (flag
 * MF_SESSION_REMOTE) or MF_SESSION_READY. Otherwise the status and message (err).
 */
mf_status_t mf_session_far_hello(mf_session_far_t *far, const mf_envelope_t *env,
                                 uint32_t own_max_frame, unsigned flags, char *err,
                                 size_t errlen);
/*
 * The reply to RemoteArena (stage MF_SESSION_ARENA): checks it (a zero-sized arena, an
 * address range that wraps, an empty rkey or one over MF_SESSION_MAX_RKEY bytes are
 * MF_INTERNAL), records the arena and moves far to MF_SESSION_READY. The caller hands
 * the rkey (env->remote_arena_reply->rkey) to its transport.
 */
mf_status_t mf_session_far_arena(mf_session_far_t *far, const mf_envelope_t *env, char *err,
                                 size_t errlen);

#endif /* MF_SESSION_H */
