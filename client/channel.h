/*
 * channel — libmapflow's connection internals: socket connect (unix / tcp) or a UCX
 * endpoint (ucx:, transport_ucx.h), the Hello exchange with the host arena fd (SCM_RIGHTS)
 * and its mapping (or, on UCX, RemoteArena: the daemon's arena for one-sided RMA), the
 * per-channel I/O thread, and the operation engine every call (sync or async) runs on.
 *
 * UCX: only the I/O thread touches the endpoint once the channel is open, so every
 * request is queued (the out queue) and sent by it; steps that move rows by RMA (put
 * into a reservation, get under a lease) run on it and wait for their transfer there.
 *
 * Request ids, the table of requests in flight with their deadlines, reply routing by id
 * and the checks of HelloReply / RemoteArenaReply are the protocol core shared with the
 * daemon's peer links (proto/mf_session.h): ch->sess and conn.far.
 *
 * Structure. A call is an operation (mf__op_t, also the public mf_call_t): a small state
 * machine of request/reply steps described by a vtable (start packs the first request,
 * step consumes one reply and either finishes or packs the next request, undo gives back
 * what a failed attempt still holds). Every request gets a fresh request_id; the I/O
 * thread reads every reply and hands it to the operation waiting on that id, so many
 * calls are in flight on one connection and replies may come in any order. Sync calls
 * are async calls whose completion wakes the calling thread: there is one code path.
 *
 * The I/O thread also owns deadlines (an expired call completes with DEADLINE_EXCEEDED
 * and its late reply is dropped), retries (an attempt that fails with UNAVAILABLE is
 * started again after an exponential backoff with jitter while retries and the deadline
 * allow) and reconnection (a broken connection fails the attempts in flight; the next
 * attempt that needs the daemon connects again, sends Hello and maps the new arena).
 *
 * Ownership: the channel owns its socket, reader buffer, arena mappings (the current
 * one and those retired by reconnects, unmapped at close so old leased views never
 * fault; the daemon's GPU arenas likewise, gpu.h), its CUDA device (primary context
 * retained while it is open), the out queue and the operations until they complete. An operation owns its
 * packed requests and private data; the caller's result storage is written by the step
 * that completes it. A reply (mf__reply_t) owns its decoded envelope; its payload points
 * into the reader buffer and is valid only during the step it is passed to.
 *
 * Files: channel_conn.c (connect, Hello, arenas; open / close / info), channel.c (the
 * engine: id table, completion, retries, sending, the I/O thread), channel_call.c (sync /
 * async runs, one-request operations, groups); what only they share: channel_internal.h.
 *
 * Thread safety: ch->mu guards the connection state, the tables and the out queue.
 * Functions named do_* / mf__do_* expect it held. Steps run on the I/O thread without
 * the lock (the operation is in no table meanwhile); vt->undo runs with it held.
 */
#ifndef MF_CLIENT_CHANNEL_H
#define MF_CLIENT_CHANNEL_H

#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>

#include "gpu.h"
#include "mapflow.h"
#include "mf_frame.h"
#include "mf_session.h"
#include "transport_ucx.h"

#define MF__ERR_LEN 512
#define MF__DEFAULT_TIMEOUT_MS 30000
#define MF__MAX_NS 128
#define MF__CONTINUE (-1)      /* step result: the next request is packed, send it */

/* Declares envelope `name` with body NAME; the statement goes on to set its body field:
 * ENV(req, PUT_BEGIN, put_begin) = &pb; */
#define ENV(name, NAME, msg)                                                              \
    mf_envelope_t name = MAPFLOW__V1__ENVELOPE__INIT;                                     \
    name.body_case = MAPFLOW__V1__ENVELOPE__BODY_##NAME;                                  \
    name.msg

typedef struct mf__reply {
    mf_envelope_t *env;
    const uint8_t *payload;     /* in the channel's reader buffer */
    uint32_t payload_len;
} mf__reply_t;

/* The operation struct is the public mf_call_t (mapflow.h). */
typedef struct mf_call mf__op_t;

typedef struct mf__op_vt {
    /* Packs the first request (mf__op_pack); called again for every retry. */
    mf_status_t (*start)(mf__op_t *op);
    /* Consumes the reply (of want_case) to the current request: MF_OK = done, MF__CONTINUE
     * = the next request is packed, or a failure status (message via mf__op_error). */
    int (*step)(mf__op_t *op, const mf__reply_t *rep);
    /* Gives back what an attempt that did not succeed still holds (a put reservation);
     * lock held; may send with mf__do_send_oneway. NULL = nothing to undo. */
    void (*undo)(mf__op_t *op);
    /* Frees the private data. NULL = nothing. */
    void (*destroy)(mf__op_t *op);
} mf__op_vt_t;

/* How a finished operation tells its owner: wake a sync caller, post to a completion
 * queue, or count down a batch. Called once, lock held. */
typedef void (*mf__done_fn)(mf__op_t *op);

enum mf__op_state {
    MF__OP_NEW = 0,
    MF__OP_WAIT_SEND,           /* needs (re)sending at retry_at (connection or backoff) */
    MF__OP_IN_FLIGHT,           /* sent; in the id table */
    MF__OP_IN_STEP,             /* its reply is being handled on the I/O thread */
    MF__OP_DONE,
};

struct mf_call {
    mf_channel_t *ch;
    const mf__op_vt_t *vt;
    void *priv;                 /* the call's own state */
    /* current request */
    uint8_t *req;               /* packed Envelope without request_id (owned) */
    size_t req_len;
    const void *payload;        /* caller's memory (must outlive the call) */
    size_t payload_len;
    int want_case;
    /* engine */
    int state;
    uint64_t rid;               /* id of the request in flight (in ch->sess) */
    uint32_t gen;               /* connection it was sent on */
    int64_t deadline;           /* monotonic ms; INT64_MAX = none */
    int64_t retry_at;
    uint32_t attempts;
    int cancel_req;
    int refs;                   /* library + a user handle (mf_call_t) */
    mf__op_t *prev, *next;      /* all live operations of the channel */
    /* completion */
    mf_status_t status;
    char err[MF__ERR_LEN];
    mf__done_fn done;
    void *done_arg;
    mf_cq_t *cq;
    void *tag;
    int finished;               /* sync waiters */
    pthread_cond_t cv;
    int has_cv;
    /* groups (a batch of kids completing as one call) */
    mf__op_t *group;            /* a kid's group */
    size_t group_index;         /* a kid's place in it */
    mf__op_t **kids;            /* a group's kids (one reference each) */
    size_t n_kids, kids_left, fail_index, next_kid;
    size_t weight;              /* a kid's bytes (its share of the group's window) */
    size_t window_bytes, window_budget;
    int pumping;
    void (*group_free)(void *priv);
    void (*group_kid_done)(mf__op_t *kid); /* lock held */
};

/*
 * How rows reach the daemon's host arena on one connection, picked once at connect
 * (client/arena_ops.c): memcpy and device→arena copies into the mapped arena, one-sided
 * UCX RMA into the daemon's, or nothing (no arena). Callers check ranges against the
 * connection's arena_reach first; the ops run on the I/O thread inside a step.
 */
typedef struct mf__arena_ops {
    const char *name;           /* "mapped", "ucx", "none" */
    /* 1: rows cannot be viewed in place; reads copy them here and the leases go back */
    int remote;
    /* Writes len bytes of src (device memory when on_device) at arena offset off. */
    mf_status_t (*write)(mf__op_t *op, uint64_t off, const void *src, size_t len,
                         int on_device);
    /* Reads the n pieces (arena offset → local host memory), all before returning. */
    mf_status_t (*read)(mf__op_t *op, const mf__ucx_rma_t *v, size_t n);
} mf__arena_ops_t;

/* The connection a channel currently talks over (replaced by a reconnect). */
typedef struct mf__conn {
    const mf__arena_ops_t *aops; /* set at connect; never NULL on an open connection */
    uint64_t arena_reach;       /* bytes aops reaches: [0, arena_reach) */
    int fd;                     /* -1 on a UCX connection */
    int is_unix;
    mf__ucx_t *ucx;             /* ucx:HOST:PORT: frames as active messages, rows by RMA */
    uint8_t *arena;
    size_t arena_bytes;
    mf__gpu_pin_t *arena_pin;   /* the arena page-locked for CUDA (gpu_device channels) */
    char *daemon_version;
    mf_session_far_t far;       /* what HelloReply (and on UCX RemoteArenaReply) said */
    mf__gpu_set_t gpu;          /* the daemon's GPU arenas (mapped or with their why) */
} mf__conn_t;

typedef struct mf__outbuf mf__outbuf_t;
typedef struct mf__retired mf__retired_t;

enum mf__chan_state { MF__DISCONNECTED = 0, MF__CONNECTING, MF__CONNECTED };

struct mf_channel {
    pthread_mutex_t mu;
    /* what open was given, kept for reconnects */
    char *target;
    char *token;
    char *admin_token;       /* "" = none */
    char *client_name;
    int want_arena;
    int remote;                 /* a ucx: target: no mapped arena, rows move by RMA */
    char ns[MF__MAX_NS + 1];
    int64_t timeout_ms;
    uint32_t max_frame;         /* largest frame we accept and send */
    mf_retry_policy_t retry;
    mf_verify_t verify;         /* checks on rows read from the arena; fixed at open */
    int gpu_device;             /* -1 = no GPU mapping */
    mf__gpu_t *gpu;             /* that device (NULL when -1); read-only after open */
    uint64_t rng;               /* jitter */
    /* connection */
    int state;
    int broken;                 /* a caller's send failed: the I/O thread tears down */
    mf__conn_t conn;
    uint32_t gen;               /* bumped by every (re)connect */
    uint64_t reconnects;
    int64_t connect_after;      /* no new connect attempt before this (monotonic ms) */
    int64_t reconnect_delay;    /* grows while connects fail, reset on success */
    char conn_err[MF__ERR_LEN]; /* why the last connect failed */
    mf__retired_t *retired;     /* arenas of earlier connections */
    mf_frame_reader_t rd;       /* I/O thread only */
    mf__outbuf_t *outq, *outq_tail;
    /* operations */
    mf_session_t sess;          /* request ids; the ops in flight (request_id → op) */
    mf__op_t *ops;              /* live list */
    size_t n_live;
    int64_t next_due;           /* earliest deadline / retry_at (never later than it) */
    int cancels;                /* some op asked to be cancelled */
    /* I/O thread */
    pthread_t io;
    int io_started;
    int wake_fd;                /* eventfd */
    int closing;
    int64_t io_sleep_until;     /* when the sleeping I/O thread wakes by itself */
    char err[MF__ERR_LEN];      /* last failed call's message */
};

/* Records a message for a call that fails before it becomes an operation. */
mf_status_t mf__chan_error(mf_channel_t *ch, mf_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* ---- operations ---- */

/* A new operation (one library reference). NULL when memory runs out. */
mf__op_t *mf__op_new(mf_channel_t *ch, const mf__op_vt_t *vt, void *priv);
/* Drops a reference; the last frees the op (vt->destroy included). */
void mf__op_unref(mf__op_t *op);
/* Records the op's failure message and returns st. */
int mf__op_error(mf__op_t *op, mf_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Packs env (its request_id is set per send) as the op's current request. */
mf_status_t mf__op_pack(mf__op_t *op, const mf_envelope_t *env, const void *payload,
                        size_t payload_len, int want_case);
/* The connection the op's reply arrived on (arena pointer and bytes, GPU arenas): steps
 * use it. */
const mf__conn_t *mf__op_conn(const mf__op_t *op);

/*
 * Starts op with timeout_ms (MF_TIMEOUT_DEFAULT / INFINITE / ms). On MF_OK, exactly one
 * completion follows through op->done; otherwise nothing was started (the op is not
 * consumed: the caller unrefs it) and the message is in op->err.
 */
mf_status_t mf__op_start(mf__op_t *op, int64_t timeout_ms);

/* Runs op synchronously: start, wait, copy the message into the channel, unref.
 * Returns the op's status. */
mf_status_t mf__op_run(mf__op_t *op, int64_t timeout_ms);

/* Starts op as an async call completing on cq with tag; *call (may be NULL) receives a
 * user reference. */
mf_status_t mf__op_run_async(mf__op_t *op, int64_t timeout_ms, mf_cq_t *cq, void *tag,
                             mf_call_t **call);

/* The reply handler of a one-request operation (runs on the I/O thread, no lock). */
typedef mf_status_t (*mf__take_fn)(mf__op_t *op, const mf__reply_t *rep, void *arg);

/*
 * An operation of one request, packed now from req (+ payload, which must live as long
 * as the op: keep it in arg), whose reply is handed to take(op, rep, arg) (NULL = just
 * succeed). free_arg(arg) runs when the op is freed. NULL when memory runs out (the
 * message is in the channel; arg is freed).
 */
mf__op_t *mf__simple_new(mf_channel_t *ch, const mf_envelope_t *req, const void *payload,
                         size_t payload_len, int want_case, mf__take_fn take, void *arg,
                         void (*free_arg)(void *));

/*
 * Groups: one call made of n kid operations (a batched put). mf__group_new makes the
 * group (priv freed by free_priv with it); mf__group_add hands it a kid (and the kid's
 * reference). Run it like any op (mf__op_run / mf__op_run_async): the group's status is
 * OK or that of the first kid (by index) that failed; g->group_kid_done, if set, sees
 * every kid finish (lock held).
 */
mf__op_t *mf__group_new(mf_channel_t *ch, size_t n, void *priv, void (*free_priv)(void *));
void mf__group_add(mf__op_t *g, mf__op_t *kid);

/* Sends a request nobody waits for (PutAbort on an error path). Lock held. */
void mf__do_send_oneway(mf_channel_t *ch, const mf_envelope_t *env);
/* The same from a step (I/O thread, lock not held): a Release after a UCX fetch. */
void mf__send_oneway(mf_channel_t *ch, const mf_envelope_t *env);

/* The GPU arenas the current connection mapped, as Get / PutBegin.gpu_mapped, and the
 * preferred one (PutBegin.gpu_arena). Takes the lock; mf__do_* expect it held. */
uint64_t mf__chan_gpu_mapped(mf_channel_t *ch);
void mf__do_gpu_want(mf_channel_t *ch, uint64_t *mapped, uint32_t *preferred);

/* The host-arena ops of connection c (after Hello: its arena mapped or its remote arena
 * known); *reach receives the bytes they reach. */
const mf__arena_ops_t *mf__arena_ops_pick(const mf__conn_t *c, uint64_t *reach);

/* Copies a C string into a newly malloc'd one (NULL stays NULL). */
char *mf__strdup(const char *s);

#endif /* MF_CLIENT_CHANNEL_H */
