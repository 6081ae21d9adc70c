/*
 * mapflow.h — libmapflow, the C client of mapflowd (DESIGN §8).
 *
 * A channel is one connection to one daemon (`unix:PATH`, `tcp:HOST:PORT` or
 * `ucx:HOST:PORT`), bound to one namespace at open (keys of other namespaces are
 * invisible). Calls return an
 * mf_status_t (gRPC numbering, proto/mf_status.h) and, on failure, leave a message
 * readable with mf_channel_last_error() (sync calls) or in the completion event (async).
 *
 * Sync and async. Every data call has a synchronous form (returns when the call is
 * done) and most an `_async` form that returns at once and completes on a completion
 * queue (mf_cq_t): mf_cq_next() hands out one event per call, carrying the caller's tag
 * and the final status, as gRPC's C core does. Both forms run on the same engine: each
 * request carries a request id and a per-channel I/O thread matches replies to calls, so
 * any number of calls (from any number of threads) are in flight on one channel at once.
 *
 * Deadlines: every call takes timeout_ms (MF_TIMEOUT_DEFAULT = the channel's timeout_ms,
 * MF_TIMEOUT_INFINITE, or milliseconds). A call still running at its deadline completes
 * with DEADLINE_EXCEEDED; a reply that arrives later is dropped.
 *
 * Retries and reconnection: an attempt that fails with UNAVAILABLE (the connection broke,
 * the daemon was not there, or it answered UNAVAILABLE while draining) is started again
 * after an exponential backoff with jitter (mf_retry_policy_t; default 5 retries, 20 ms
 * doubling to 1 s, ±20 %), as long as the deadline allows. The calls are idempotent at
 * the key level (a put of an identical row is "replaced"), so a retry after a lost reply
 * is harmless. When the connection breaks, the channel connects again by itself at the
 * next attempt (Hello again, the new host arena mapped): the caller never rebuilds it.
 * With max_retries = 0 calls fail fast with UNAVAILABLE while the daemon is away and
 * succeed again once it is back. A reconnect starts a new daemon session: leases and
 * put reservations of the old connection are gone (the daemon released them when the
 * connection dropped); views into the old arena stay mapped, so they never fault, but the
 * daemon no longer protects their bytes — get the rows again.
 *
 * Thread safety: an mf_channel_t may be shared by any number of threads; every call may
 * run concurrently with every other, except mf_channel_close(), which must not race with
 * calls on the same channel (it cancels the async calls still running: their events
 * arrive with CANCELLED before it returns). mf_channel_last_error() is the message of the
 * last sync call that finished on the channel, by any thread: read it from the thread that
 * made the call before others use the channel, or copy it. Completion queues may be used
 * from any thread. Functions on result structs (…_free) touch only the caller's memory.
 *
 * Ownership: the caller owns every buffer it passes. A sync call reads its inputs only
 * while it runs. An async call copies its small inputs (keys, tokens, layers) at once,
 * but the row buffers of mf_put_async / mf_put_batch_async and every output pointer
 * (results, lengths, buffers) must stay valid until the call's event has been taken from
 * the queue; the library writes the outputs before it posts the event. Results returned
 * through a pointer to pointer (mf_get_result_t, mf_list_page_t, mf_stats_t, config
 * items, profiles, mf_profile_page_t) are allocated by the library and freed by the caller with the matching
 * …_free function. Leased row views point into the daemon's host arena, mapped
 * MAP_SHARED into this process; they stay valid until released (mf_release*), until the
 * lease expires (the GetReply's lease_ttl_ms), until a reconnect (see above) or until
 * the channel closes — never write through them. Device views (on_device, see GPU
 * arenas) follow the same rules in the daemon's GPU arenas.
 *
 * Remote workers (`ucx:HOST:PORT`, the daemon's `ucx` listener). The same API over UCX:
 * control messages travel as active messages on one endpoint, rows move one-sided on the
 * daemon's host arena (RemoteArena after Hello, which always asks for it): a put writes
 * its PutBegin reservation with ucp_put_nbx, flushes, then commits; a get (either mode)
 * takes leases, reads the rows with ucp_get_nbx into memory the result owns and releases
 * the leases at once — remote zero-copy views are impossible, so rows' lease_id is 0,
 * mf_release_result is a no-op, mf_get_lease fails with FAILED_PRECONDITION, and
 * mf_channel_has_arena() is 0 (want_arena is ignored). The token is required by the
 * daemon as on TCP. Transfers run on the channel's I/O thread, bounded by the call's
 * deadline; a dead daemon fails the calls in flight with UNAVAILABLE (then retries and
 * reconnection as above). UCX (libucp.so.0) is loaded on the first ucx: open, so
 * programs that never use it neither need it nor get its memory hooks; without it the
 * open fails with FAILED_PRECONDITION. UCX reads its UCX_* environment (e.g. UCX_TLS).
 *
 * fork(): a channel belongs to the process that opened it. Its I/O thread, connection,
 * arena mappings (MAP_SHARED: a child inherits them) and leases are the parent's; a
 * child of fork() (vLLM forks its workers) gets none of the threads, so the parent's
 * channels and completion queues are dead in the child: it must not call anything on
 * them — not even mf_channel_close, which waits for the I/O thread and so hangs there —
 * nor read views of the parent's leases (the daemon may reuse those bytes once the parent
 * releases them). The child opens its own channels (a new daemon session) and lets the
 * inherited ones leak; the parent goes on using its channels, on the same connection
 * (tests/python/test_binding_views.py checks both). Open channels after forking where
 * you can. CUDA itself does not survive fork(): after a parent used gpu_device, a child
 * opens its channels without MF_CHANNEL_PARAM_GPU (or the workers are spawned, not
 * forked). Functions that touch no channel (mf_hash_*, mf_row_*, mf_status_*,
 * mf_version, mf_abi_layout) are fine in the child. The Python binding enforces this:
 * its Channel and CompletionQueue refuse calls in a child and close there as no-ops.
 *
 * Link with -lmapflow only (pkg-config --cflags --libs mapflow); this header re-exports
 * the proto/ headers users need (status codes, prefix hash, map rows). The shared library
 * exports exactly the functions declared in these headers (version node MAPFLOW_0).
 */
#ifndef MAPFLOW_H
#define MAPFLOW_H

#include <stddef.h>
#include <stdint.h>

#include "mf_hash.h"
#include "mf_row.h"
#include "mf_status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MF_VERSION_MAJOR 0
#define MF_VERSION_MINOR 4
#define MF_VERSION_PATCH 0
#define MF_VERSION_STRING "0.4.0"

#if defined(MF_BUILDING_LIBRARY)
#define MF_EXPORT __attribute__((visibility("default")))
#else
#define MF_EXPORT
#endif

/* Version of the library actually loaded ("MAJOR.MINOR.PATCH"). Any thread. */
MF_EXPORT const char *mf_version(void);

/*
 * The layout of every public struct (and the size of every public enum) as this library
 * was built, for bindings that mirror the structs without a compiler (Python's ctypes):
 * they compare their mirror at load time and refuse a library that differs. One entry
 * per member, in declaration order, after one entry for the type itself (member "",
 * offset 0, size = sizeof). Static storage; *n receives the count. Any thread.
 */
typedef struct mf_abi_field {
    const char *type;        /* "mf_row_ref_t" */
    const char *member;      /* "view"; "" for the type itself */
    uint32_t offset;         /* offsetof(type, member) */
    uint32_t size;           /* sizeof the member (or the type) */
} mf_abi_field_t;
MF_EXPORT const mf_abi_field_t *mf_abi_layout(size_t *n);

/* ==== channel ========================================================================= */

typedef struct mf_channel mf_channel_t;

/* Which fields of mf_channel_params_t are set (UCX style: unset fields take defaults,
 * and fields added later do not break callers built against an older header). */
enum mf_channel_param_field {
    MF_CHANNEL_PARAM_NS          = 1u << 0, /* default "default" */
    MF_CHANNEL_PARAM_TOKEN       = 1u << 1, /* default none */
    MF_CHANNEL_PARAM_CLIENT_NAME = 1u << 2, /* default "libmapflow" */
    MF_CHANNEL_PARAM_WANT_ARENA  = 1u << 3, /* default 0 */
    MF_CHANNEL_PARAM_TIMEOUT_MS  = 1u << 4, /* default 30000 */
    MF_CHANNEL_PARAM_MAX_FRAME   = 1u << 5, /* default MF_FRAME_DEFAULT_MAX (64 MiB) */
    MF_CHANNEL_PARAM_RETRY       = 1u << 6, /* default mf_retry_policy_default() */
    MF_CHANNEL_PARAM_VERIFY      = 1u << 7, /* default MF_VERIFY_FULL */
    MF_CHANNEL_PARAM_GPU         = 1u << 8, /* default -1: no GPU mapping */
    MF_CHANNEL_PARAM_ADMIN_TOKEN = 1u << 9, /* default none */
};

/*
 * How much of a row read straight from the mapped host arena (leased gets, and copy gets
 * on an arena channel, which lease, copy and release) the client checks. The daemon
 * validated every row, checksum included, when it was committed.
 * FULL: header, key/tokens and the whole-row checksum (reads every byte once more).
 * HEADER: header and key/tokens only. Faster for large rows, but the arena is shared
 * memory: a same-node process that can write it could alter a row after its commit, and
 * only FULL catches that. Rows that travel in a reply payload or by RMA are always FULL.
 */
typedef enum mf_verify {
    MF_VERIFY_FULL = 0,
    MF_VERIFY_HEADER = 1,
} mf_verify_t;

/* Retries of attempts that fail with UNAVAILABLE: before retry n (0-based) the call
 * waits min(initial_backoff_ms × multiplier^n, max_backoff_ms) × (1 ± jitter). Bounded
 * by max_retries (≤ 100) and by the call's deadline. max_retries 0 = fail fast. */
typedef struct mf_retry_policy {
    uint32_t max_retries;
    uint32_t initial_backoff_ms;  /* > 0 */
    uint32_t max_backoff_ms;      /* ≥ initial_backoff_ms */
    float multiplier;             /* 1..10 */
    float jitter;                 /* 0..1 */
} mf_retry_policy_t;

/* Fills p with the defaults: 5 retries, 20 ms, 1000 ms, × 2, ± 0.2. Any thread. */
MF_EXPORT void mf_retry_policy_default(mf_retry_policy_t *p);

typedef struct mf_channel_params {
    uint64_t field_mask;
    const char *ns;          /* namespace, 1..128 bytes */
    const char *token;       /* shared secret; required by the daemon on TCP */
    const char *client_name; /* free text shown in the daemon's logs */
    int want_arena;          /* unix socket: receive and map the host arena (zero copy) */
    int64_t timeout_ms;      /* default deadline of each call, including open */
    uint32_t max_frame;      /* largest reply frame accepted */
    mf_retry_policy_t retry; /* MF_CHANNEL_PARAM_RETRY */
    mf_verify_t verify;      /* MF_CHANNEL_PARAM_VERIFY: checks on arena rows */
    int gpu_device;          /* MF_CHANNEL_PARAM_GPU: see GPU arenas below; -1 = none */
    const char *admin_token; /* the daemon's admin_token: admin calls (config set, profile
                                put, flush / evict of every namespace) on any listener;
                                without it only a channel on the daemon's admin socket
                                (mode 0600) may make them (others: PERMISSION_DENIED) */
} mf_channel_params_t;

/* Per-call deadline arguments (every call's last parameter, in milliseconds). */
#define MF_TIMEOUT_DEFAULT (-1) /* the channel's timeout_ms */
#define MF_TIMEOUT_INFINITE (-2)

/*
 * Connects, sends Hello, waits for HelloReply and starts the channel's I/O thread.
 * target: "unix:PATH", "tcp:HOST:PORT", "ucx:HOST:PORT" (see Remote workers above), or
 * a bare path (taken as a unix socket). The
 * first connection must succeed (later ones are made by the channel itself). On failure
 * *out is still set when memory allowed, so mf_channel_last_error() can say why; close it
 * with mf_channel_close() (calls on it fail with UNAVAILABLE). UNAVAILABLE: cannot
 * connect; UNAUTHENTICATED: token refused; INVALID_ARGUMENT: bad target or params. The
 * params (and their strings) are copied. Any thread.
 */
MF_EXPORT mf_status_t mf_channel_open(const char *target, const mf_channel_params_t *params,
                                      mf_channel_t **out);
/* Cancels the calls still running (their events arrive with CANCELLED), stops the I/O
 * thread, closes the connection and unmaps every arena (leased views die with it).
 * NULL is a no-op. Must not race with other calls on ch; call handles (mf_call_t) of
 * this channel may only be freed afterwards, not cancelled. */
MF_EXPORT void mf_channel_close(mf_channel_t *ch);
/* Message of the last sync call that finished ("" if it succeeded). Owned by the
 * channel; valid until the next call on it. Any thread. */
MF_EXPORT const char *mf_channel_last_error(const mf_channel_t *ch);
/* 1 if the host arena of the current connection is mapped (zero-copy put and leased
 * gets are possible). Any thread. */
MF_EXPORT int mf_channel_has_arena(const mf_channel_t *ch);
/* What the daemon said in its last HelloReply, and the channel's state. Strings are
 * owned by the channel and valid until it closes. Any thread. */
typedef struct mf_server_info {
    const char *daemon_version;
    uint64_t session_id;
    uint64_t host_arena_bytes;
    uint32_t max_frame;
    uint32_t max_batch;
    int gpu_tier;
    int connected;           /* a connection is up right now */
    uint64_t reconnects;     /* successful reconnects since open */
    size_t in_flight;        /* calls started and not yet finished */
} mf_server_info_t;
MF_EXPORT void mf_channel_info(const mf_channel_t *ch, mf_server_info_t *out);

/*
 * GPU arenas (the daemon's gpu tier, DESIGN §7). With MF_CHANNEL_PARAM_GPU and
 * gpu_device ≥ 0 (this process's CUDA ordinal, as CUDA_VISIBLE_DEVICES numbers it) on a
 * unix socket, the channel asks for the daemon's GPU arenas in Hello, matches each to a
 * device of this process by PCI bus id / UUID and opens it with cuIpcOpenMemHandle (lazy
 * peer access) in the primary context of gpu_device. The CUDA driver is loaded with
 * dlopen ($MF_CUDA_DRIVER, else libcuda.so.1): no link-time CUDA dependency. Without a
 * driver or device the channel still opens and works through host memory
 * (mf_channel_gpu_info says why). An arena that cannot be opened (no peer access, the
 * device is hidden) stays unmapped; the daemon then hands this client its rows staged
 * in the host arena (or copied). Leased rows of a mapped arena come back with on_device
 * = 1: `data` is a device address valid in gpu_device's context, `view` is zeroed (the
 * host never reads device memory; the GPU kernels check the header). A reconnect maps
 * the new session's arenas; the old mappings stay open until close, as host arenas do.
 * Copies between host and device run on the library's threads with gpu_device's primary
 * context made current for the copy only (the caller's current context is restored).
 */
#define MF_GPU_MAX_ARENAS 16

typedef struct mf_gpu_arena_info {
    uint32_t index;          /* the daemon's arena index */
    uint64_t bytes;
    int mapped;              /* opened in this process */
    int device;              /* this process's ordinal of the arena's GPU; -1 = not visible */
    int peer;                /* mapped from another device than gpu_device (peer access) */
    char pci_bus_id[32];
    char why[256];           /* why it is not mapped ("" when mapped) */
} mf_gpu_arena_info_t;

typedef struct mf_gpu_info {
    int gpu_device;          /* as given at open; -1 = none */
    int driver;              /* the CUDA driver loaded and gpu_device usable */
    char why[256];           /* why not (driver, device), "" otherwise */
    uint32_t n_announced;    /* arenas in the current session's HelloReply */
    uint32_t n_mapped;
    uint32_t n_peer;         /* mapped through peer access */
    mf_gpu_arena_info_t arenas[MF_GPU_MAX_ARENAS]; /* the first n_announced (≤ max) */
    /* The mapped host arena page-locked for CUDA (cuMemHostRegister, done in the
     * background after connecting, so staged rows copy to the device by DMA): 1 done,
     * 0 not (yet, or no gpu_device / host arena, or MAPFLOW_HOST_PIN=off in the
     * environment), -1 the driver refused (pageable). MAPFLOW_GPU_ARENAS=off: the
     * channel does not ask for the daemon's GPU arenas (rows come back staged in the host
     * arena, which it still pins). */
    int host_arena_pinned;
} mf_gpu_info_t;

/* The GPU arenas of the current connection. Any thread. */
MF_EXPORT void mf_channel_gpu_info(const mf_channel_t *ch, mf_gpu_info_t *out);

/* ==== keys and rows ================================================================== */

typedef enum mf_tier {
    MF_TIER_NONE = 0,
    MF_TIER_GPU = 1,
    MF_TIER_HOST = 2,
    MF_TIER_SSD = 3,
} mf_tier_t;

/* "none", "gpu", "host", "ssd"; mf_tier_parse accepts the same names. */
MF_EXPORT const char *mf_tier_name(mf_tier_t t);
MF_EXPORT mf_status_t mf_tier_parse(const char *s, mf_tier_t *out);

typedef struct mf_key {
    const char *model;       /* NUL-terminated, 1..255 bytes */
    uint32_t layer;
    mf_hash128_t hash;       /* prefix hash of the row's block */
} mf_key_t;

/* ==== completion queues and async calls ============================================== */

typedef struct mf_cq mf_cq_t;
/* Handle of one async call, for cancelling it (optional; see mf_call_cancel). */
typedef struct mf_call mf_call_t;

typedef enum mf_cq_event_type {
    MF_CQ_CALL_DONE = 1,     /* a call finished: tag, status, message */
    MF_CQ_TIMEOUT = 2,       /* nothing finished before the timeout */
    MF_CQ_SHUTDOWN = 3,      /* shut down and every call started on it has been reported */
} mf_cq_event_type_t;

typedef struct mf_cq_event {
    mf_cq_event_type_t type;
    void *tag;               /* as given to the _async call */
    mf_status_t status;      /* the call's final status */
    char message[256];       /* why it failed ("" on OK) */
} mf_cq_event_t;

/* A new, empty queue. Any thread. */
MF_EXPORT mf_status_t mf_cq_create(mf_cq_t **out);
/*
 * Waits up to timeout_ms (0 = poll, MF_TIMEOUT_INFINITE = until something happens) for
 * the next finished call, in completion order. Returns the event type, also in ev->type.
 * Every call started on the queue yields exactly one MF_CQ_CALL_DONE. Any number of
 * threads may wait on one queue; each event goes to one of them.
 */
MF_EXPORT mf_cq_event_type_t mf_cq_next(mf_cq_t *cq, int64_t timeout_ms, mf_cq_event_t *ev);
/* No new calls may start on cq (they fail with FAILED_PRECONDITION); mf_cq_next keeps
 * handing out the events of calls already started, then returns MF_CQ_SHUTDOWN. */
MF_EXPORT void mf_cq_shutdown(mf_cq_t *cq);
/* Frees the queue: only after mf_cq_next returned MF_CQ_SHUTDOWN (or before any call was
 * started on it), with no thread still waiting on it. */
MF_EXPORT void mf_cq_destroy(mf_cq_t *cq);

/*
 * Asks a running call to stop: it completes with CANCELLED unless it finished first
 * (its event says which). FAILED_PRECONDITION if it has already finished. A cancelled
 * get may leave a lease the daemon holds until its TTL; a cancelled put's reservation is
 * aborted. Any thread, while the call's channel is open.
 */
MF_EXPORT mf_status_t mf_call_cancel(mf_call_t *call);
/* Drops the handle (the call itself runs on). Any thread, any time; NULL is a no-op. */
MF_EXPORT void mf_call_free(mf_call_t *call);

/*
 * Every _async call takes, after the sync form's parameters, the completion queue, a tag
 * for its event and an optional handle (call may be NULL; otherwise free it with
 * mf_call_free). It returns MF_OK when the call started — exactly one event follows —
 * or a failure with no event at all (bad arguments, a shut-down queue; message in
 * mf_channel_last_error()). Outputs are written before the event is posted.
 */

/* ==== data calls ===================================================================== */
/* Every data call: any thread, concurrently with any other call on the same channel; the
 * inputs are only read (see Ownership above for how long async calls read them). */

#define MF_PUT_DURABLE 1u /* acknowledged only after a synced SSD write */

typedef struct mf_put_result {
    mf_tier_t tier;
    int durable;
    int replaced;
} mf_put_result_t;

/*
 * Stores one encoded row (proto/mf_row.h); the key is read from the row header, which is
 * validated here first (checksum included). Two-phase inside: PutBegin, then the row is
 * written into the host arena (when the daemon reserved it there) or sent as the
 * payload, then PutCommit; on any failure after PutBegin the reservation is aborted.
 * res may be NULL.
 */
MF_EXPORT mf_status_t mf_put(mf_channel_t *ch, const void *row, size_t len, unsigned flags,
                             mf_put_result_t *res, int64_t timeout_ms);
/* mf_put as an async call; row (and res) must stay valid until the event. */
MF_EXPORT mf_status_t mf_put_async(mf_channel_t *ch, const void *row, size_t len,
                                   unsigned flags, mf_put_result_t *res, int64_t timeout_ms,
                                   mf_cq_t *cq, void *tag, mf_call_t **call);

/* One row of a batched put: row/len in, status/result out. */
typedef struct mf_put_item {
    const void *row;
    size_t len;
    mf_status_t status;      /* this row's outcome */
    mf_put_result_t result;
} mf_put_item_t;

#define MF_PUT_BATCH_MAX 65536u

/*
 * Stores many rows without a round trip per row: the PutBegins are sent back to back,
 * each row is written (arena) or sent (payload) with its PutCommit as soon as its
 * reservation arrives, so n rows take about two round trips. At most about a quarter of
 * the host arena (16 MiB without one) is reserved at a time: a batch larger than that
 * flows through that window instead of failing for want of room. Every row is
 * validated first (a bad row
 * fails with INVALID_ARGUMENT / DATA_LOSS before anything is sent). Returns OK when every
 * row was stored, else the status of the first row (in order) that was not; each item's
 * status says what happened to it. 1 ≤ n ≤ MF_PUT_BATCH_MAX.
 */
MF_EXPORT mf_status_t mf_put_batch(mf_channel_t *ch, mf_put_item_t *items, size_t n,
                                   unsigned flags, int64_t timeout_ms);
/* mf_put_batch as one async call (one event for the whole batch); items and their rows
 * must stay valid until the event. */
MF_EXPORT mf_status_t mf_put_batch_async(mf_channel_t *ch, mf_put_item_t *items, size_t n,
                                         unsigned flags, int64_t timeout_ms, mf_cq_t *cq,
                                         void *tag, mf_call_t **call);

/*
 * Stores one encoded row that sits in device memory (dev_row: a device address valid in
 * the channel's gpu_device context; the work that wrote it must be finished, e.g. the
 * stream synchronized). Its header is read here (DtoH) and checked, the daemon reserves
 * room (the gpu tier when it is on and has room, else the host tier), the row is copied
 * device to device into the mapped GPU arena (or staged through host memory when the
 * reservation is on the host tier, the arena is not mapped, or the channel has no GPU),
 * then committed; the daemon validates the whole row (checksum) before it is visible.
 * FAILED_PRECONDITION when the channel has no usable CUDA device (see mf_channel_gpu_info).
 */
MF_EXPORT mf_status_t mf_put_device(mf_channel_t *ch, const void *dev_row, size_t len,
                                    unsigned flags, mf_put_result_t *res, int64_t timeout_ms);
/* mf_put_batch for rows in device memory (items[i].row are device addresses). */
MF_EXPORT mf_status_t mf_put_device_batch(mf_channel_t *ch, mf_put_item_t *items, size_t n,
                                          unsigned flags, int64_t timeout_ms);

/*
 * Put regions: a layer's rows written in place (issue 20). mf_put_region_begin reserves
 * ONE contiguous block of a GPU arena this channel mapped for n rows of the given lengths
 * (all of one model and layer) and returns each row's device address, valid in the
 * channel's gpu_device context: the source's own kernels write (and seal) the rows there —
 * no device-to-device copy, no round trip per row. Once that work is finished (its stream
 * synchronized), mf_put_region_commit makes the daemon check every row before it becomes
 * visible — header and tables from a copy of each row's bytes before its tiles, the
 * checksum on the GPU (daemon/README.md says what a corrupt row can and cannot get past)
 * — and answers per row: statuses[i] (caller's array of n, may be NULL) is MF_OK for a
 * visible row, else why it was refused (the others stay visible). It returns MF_OK when
 * every row is visible, else the first refused row's status (message: its index and why).
 * Nothing is durable (MF_PUT_DURABLE is refused; write-through as the daemon configures).
 * mf_put_region_abort gives the block back. A region belongs to the connection it was
 * begun on: the daemon frees it when that connection closes (a reconnect: commit answers
 * ABORTED, put the rows again) or its TTL (reservation_ttl) passes.
 * Fallback: FAILED_PRECONDITION (the channel has no usable GPU, the daemon's GPU tier is
 * off, no GPU arena is mapped) or RESOURCE_EXHAUSTED (no mapped arena has room, or the
 * namespace's reservation_share of it is used) — put the rows with mf_put_device_batch.
 * Bounds: 1 ≤ n ≤ MF_PUT_BATCH_MAX, each length (or capacity) in [MF_ROW_HEADER,
 * MF_ROW_MAX_BYTES], the total (each row rounded up to 64 bytes) within one arena.
 * Thread safety: begin / commit / abort / free of one region from one thread at a time;
 * different regions and other calls on the channel run concurrently. A region handle
 * refers to its channel: free it before mf_channel_close.
 */
typedef struct mf_put_region mf_put_region_t;

#define MF_PUT_REGION_PARAM_GPU_ARENA 1u  /* gpu_arena is set */
#define MF_PUT_REGION_PARAM_CAPACITIES 2u /* capacities is set */

typedef struct mf_put_region_params {
    uint64_t field_mask;
    uint32_t gpu_arena;      /* MF_PUT_REGION_PARAM_GPU_ARENA: the daemon's arena index to
                                try first (mf_channel_gpu_info); default: the channel's */
    int capacities;          /* MF_PUT_REGION_PARAM_CAPACITIES: nonzero = lens are each
                                row's capacity (an upper bound, e.g. mf_extract_row_bound:
                                the exporter writes before it knows the sizes); the actual
                                lengths go to mf_put_region_set_lengths before the commit,
                                which gives each row's slack back to the arena. Default 0:
                                lens are exact */
} mf_put_region_params_t;

typedef struct mf_put_region_result {
    size_t committed;        /* rows made visible */
    size_t replaced;         /* of those, rows that replaced an existing key */
    size_t first_failed;     /* index of the first refused row; n when none */
    int checked_on_gpu;      /* 1: every row longer than 4 KiB was checksummed on the GPU
                                (shorter ones are copied whole and checked on the host
                                either way); 0: rows were copied whole */
} mf_put_region_result_t;

/* params may be NULL; dev_rows (caller's array of n, may be NULL) receives the rows'
 * device addresses, also read with mf_put_region_row. */
MF_EXPORT mf_status_t mf_put_region_begin(mf_channel_t *ch, const char *model, uint32_t layer,
                                          const size_t *lens, size_t n, unsigned flags,
                                          const mf_put_region_params_t *params,
                                          void **dev_rows, mf_put_region_t **out,
                                          int64_t timeout_ms);
/* Row i's device address (NULL when i ≥ n) and the region's row count. */
MF_EXPORT void *mf_put_region_row(const mf_put_region_t *r, size_t i);
MF_EXPORT size_t mf_put_region_rows(const mf_put_region_t *r);
/* The actual lengths of a region begun with capacities: lens[i] (n = the region's rows)
 * in [MF_ROW_HEADER, row i's capacity], each the row's header total_size (what the
 * exporter wrote, e.g. mf_extract_cuda's sizes). The next commit sends them; calling again
 * replaces them. INVALID_ARGUMENT for an exact region, a count or a length out of range
 * (nothing changes); FAILED_PRECONDITION once committed or aborted. */
MF_EXPORT mf_status_t mf_put_region_set_lengths(mf_put_region_t *r, const size_t *lens,
                                                size_t n);
/* res may be NULL. A second commit, or one after abort: FAILED_PRECONDITION; a region
 * begun with capacities whose lengths were not set: FAILED_PRECONDITION. */
MF_EXPORT mf_status_t mf_put_region_commit(mf_put_region_t *r, mf_status_t *statuses,
                                           mf_put_region_result_t *res, int64_t timeout_ms);
/* mf_put_region_commit as an async call (the source's thread need not wait for the
 * check); statuses and res must stay valid, and r untouched, until the event. */
MF_EXPORT mf_status_t mf_put_region_commit_async(mf_put_region_t *r, mf_status_t *statuses,
                                                 mf_put_region_result_t *res,
                                                 int64_t timeout_ms, mf_cq_t *cq, void *tag,
                                                 mf_call_t **call);
MF_EXPORT mf_status_t mf_put_region_abort(mf_put_region_t *r, int64_t timeout_ms);
/* Frees the handle; a region neither committed nor aborted is aborted (best effort, no
 * wait). NULL is a no-op. */
MF_EXPORT void mf_put_region_free(mf_put_region_t *r);

/*
 * How many leading full blocks of tokens[0:n_tokens] are cached, per layer:
 * blocks[i] for layers[i] (caller's array of n_layers). *total_blocks (may be NULL)
 * receives n_tokens / block_size.
 */
MF_EXPORT mf_status_t mf_lookup(mf_channel_t *ch, const char *model, uint32_t block_size,
                                const uint32_t *tokens, size_t n_tokens,
                                const uint32_t *layers, size_t n_layers, uint32_t *blocks,
                                uint32_t *total_blocks, int64_t timeout_ms);
/*
 * mf_lookup that also asks a peer daemon: peer is "HOST:PORT" of another daemon's UCX
 * listener (the daemon this channel talks to connects to it with its own token); each
 * layer's answer is the larger of the local and the peer's count, the local one alone if
 * the peer fails. peer NULL or "" = mf_lookup.
 */
MF_EXPORT mf_status_t mf_lookup_peer(mf_channel_t *ch, const char *peer, const char *model,
                                     uint32_t block_size, const uint32_t *tokens,
                                     size_t n_tokens, const uint32_t *layers, size_t n_layers,
                                     uint32_t *blocks, uint32_t *total_blocks,
                                     int64_t timeout_ms);
/* mf_lookup as an async call (tokens and layers are copied; blocks and total_blocks must
 * stay valid until the event). */
MF_EXPORT mf_status_t mf_lookup_async(mf_channel_t *ch, const char *model, uint32_t block_size,
                                      const uint32_t *tokens, size_t n_tokens,
                                      const uint32_t *layers, size_t n_layers,
                                      uint32_t *blocks, uint32_t *total_blocks,
                                      int64_t timeout_ms, mf_cq_t *cq, void *tag,
                                      mf_call_t **call);

typedef enum mf_get_mode {
    MF_GET_COPY = 0,  /* row bytes copied into memory the result owns */
    MF_GET_LEASE = 1, /* zero-copy views of the host arena; needs want_arena (on ucx:
                         copies, leases already released: see Remote workers); rows of
                         a mapped GPU arena come back as device views (on_device) */
} mf_get_mode_t;

typedef struct mf_row_ref {
    mf_status_t status;      /* OK, NOT_FOUND, DATA_LOSS, OUT_OF_RANGE (ask again) */
    uint32_t layer;
    uint32_t block;
    mf_tier_t tier;
    const void *data;        /* the row (status OK): in the result or in the arena */
    size_t length;
    uint64_t lease_id;       /* MF_GET_LEASE: nonzero while leased */
    mf_row_view_t view;      /* decoded and verified here (status OK); zeroed on device */
    int on_device;           /* 1: data is a device address in a mapped GPU arena (leases) */
    uint32_t gpu_arena;      /* that arena's index (tier GPU) */
} mf_row_ref_t;

typedef struct mf_get_result {
    size_t n_rows;           /* layer-major: for each layer, each block in order */
    mf_row_ref_t *rows;
    uint64_t lease_ttl_ms;
    void *priv_;             /* library-owned copy of the rows (MF_GET_COPY) */
} mf_get_result_t;

/*
 * Batch get for a whole prefix × many layers in one round trip: blocks
 * [first_block, first_block + n_blocks) (n_blocks 0 = every full block of tokens) of
 * each layer. Every OK row is decoded and checked here too (mf_row_decode, key and
 * tokens); a row that fails becomes DATA_LOSS. The call's status is OK when the
 * exchange worked, whatever the per-row statuses. Free with mf_get_result_free; leases
 * stay until mf_release_result (or expiry / close).
 */
MF_EXPORT mf_status_t mf_get_prefix(mf_channel_t *ch, const char *model, uint32_t block_size,
                                    const uint32_t *tokens, size_t n_tokens,
                                    const uint32_t *layers, size_t n_layers,
                                    uint32_t first_block, uint32_t n_blocks,
                                    mf_get_mode_t mode, mf_get_result_t **out,
                                    int64_t timeout_ms);
/* mf_get_prefix as an async call; *out is set before the event (NULL on failure). */
MF_EXPORT mf_status_t mf_get_prefix_async(mf_channel_t *ch, const char *model,
                                          uint32_t block_size, const uint32_t *tokens,
                                          size_t n_tokens, const uint32_t *layers,
                                          size_t n_layers, uint32_t first_block,
                                          uint32_t n_blocks, mf_get_mode_t mode,
                                          mf_get_result_t **out, int64_t timeout_ms,
                                          mf_cq_t *cq, void *tag, mf_call_t **call);
/*
 * mf_get_prefix with read-through from a peer daemon ("HOST:PORT" of its UCX listener):
 * rows missing at this channel's daemon are pulled from the peer, verified and cached
 * there first, then served as usual. Rows the peer could not deliver carry its status
 * (NOT_FOUND, UNAVAILABLE, UNAUTHENTICATED, DATA_LOSS). peer NULL or "" = mf_get_prefix.
 */
MF_EXPORT mf_status_t mf_get_prefix_peer(mf_channel_t *ch, const char *peer, const char *model,
                                         uint32_t block_size, const uint32_t *tokens,
                                         size_t n_tokens, const uint32_t *layers,
                                         size_t n_layers, uint32_t first_block,
                                         uint32_t n_blocks, mf_get_mode_t mode,
                                         mf_get_result_t **out, int64_t timeout_ms);
/* Rows by explicit key (admin use; checksum-verified only), in key order. */
MF_EXPORT mf_status_t mf_get_keys(mf_channel_t *ch, const mf_key_t *keys, size_t n_keys,
                                  mf_get_mode_t mode, mf_get_result_t **out,
                                  int64_t timeout_ms);
MF_EXPORT mf_status_t mf_get_keys_async(mf_channel_t *ch, const mf_key_t *keys,
                                        size_t n_keys, mf_get_mode_t mode,
                                        mf_get_result_t **out, int64_t timeout_ms,
                                        mf_cq_t *cq, void *tag, mf_call_t **call);
/* mf_get_keys with read-through from a peer daemon, as mf_get_prefix_peer. */
MF_EXPORT mf_status_t mf_get_keys_peer(mf_channel_t *ch, const char *peer,
                                       const mf_key_t *keys, size_t n_keys, mf_get_mode_t mode,
                                       mf_get_result_t **out, int64_t timeout_ms);
/* Frees the result (does not release leases). NULL is a no-op. Any thread. */
MF_EXPORT void mf_get_result_free(mf_get_result_t *r);

/*
 * The rows' fields of a result as columns in the caller's arrays (a struct of arrays),
 * for code that hands them on whole (e.g. a 32k prefix × 30 layers: 15,360 device
 * addresses for the apply kernel) instead of walking mf_row_ref_t. Each non-NULL array
 * receives r->n_rows entries in the result's order; cap is how many each holds.
 */
typedef struct mf_row_columns {
    size_t cap;
    int32_t *status;         /* mf_status_t */
    uint32_t *layer;
    uint32_t *block;
    int32_t *tier;           /* mf_tier_t */
    uint64_t *data;          /* the row's address (device when on_device); 0 unless OK */
    uint64_t *length;        /* 0 unless OK */
    uint64_t *lease_id;
    uint8_t *on_device;      /* 0 / 1 */
    uint32_t *gpu_arena;
} mf_row_columns_t;
/* INVALID_ARGUMENT (nothing written) when r or cols is NULL or r->n_rows > cols->cap.
 * Any thread; r is not changed. */
MF_EXPORT mf_status_t mf_get_result_columns(const mf_get_result_t *r,
                                            const mf_row_columns_t *cols);
/* Releases every lease of a result (and zeroes their lease_id). */
MF_EXPORT mf_status_t mf_release_result(mf_channel_t *ch, mf_get_result_t *r,
                                        int64_t timeout_ms);

/*
 * One row by key, copied into buf (cap bytes, 16-byte aligned if you want to decode it
 * in place). *len receives its size; RESOURCE_EXHAUSTED when cap is too small (*len then
 * says how much is needed). NOT_FOUND, DATA_LOSS as per row.
 */
MF_EXPORT mf_status_t mf_get(mf_channel_t *ch, const mf_key_t *key, void *buf, size_t cap,
                             size_t *len, int64_t timeout_ms);
/* mf_get as an async call; buf and len must stay valid until the event. */
MF_EXPORT mf_status_t mf_get_async(mf_channel_t *ch, const mf_key_t *key, void *buf,
                                   size_t cap, size_t *len, int64_t timeout_ms, mf_cq_t *cq,
                                   void *tag, mf_call_t **call);

typedef struct mf_lease {
    const void *data;        /* in the arena; read only */
    size_t length;
    uint64_t lease_id;
    mf_row_view_t view;      /* zeroed when on_device */
    uint64_t ttl_ms;
    int on_device;           /* as mf_row_ref_t */
    uint32_t gpu_arena;
} mf_lease_t;
/* One row by key as a leased zero-copy view; release with mf_release(ch, &id, 1, ...). */
MF_EXPORT mf_status_t mf_get_lease(mf_channel_t *ch, const mf_key_t *key, mf_lease_t *out,
                                   int64_t timeout_ms);

/* Releases leases; *released (may be NULL) counts those the daemon still held. */
MF_EXPORT mf_status_t mf_release(mf_channel_t *ch, const uint64_t *lease_ids, size_t n,
                                 uint32_t *released, int64_t timeout_ms);
MF_EXPORT mf_status_t mf_release_async(mf_channel_t *ch, const uint64_t *lease_ids, size_t n,
                                       uint32_t *released, int64_t timeout_ms, mf_cq_t *cq,
                                       void *tag, mf_call_t **call);

/* Deletes one key. *deleted (may be NULL) is 0 or 1. */
MF_EXPORT mf_status_t mf_delete(mf_channel_t *ch, const mf_key_t *key, uint64_t *deleted,
                                int64_t timeout_ms);
MF_EXPORT mf_status_t mf_delete_async(mf_channel_t *ch, const mf_key_t *key,
                                      uint64_t *deleted, int64_t timeout_ms, mf_cq_t *cq,
                                      void *tag, mf_call_t **call);
/* Deletes every key of model (layer < 0: all layers). */
MF_EXPORT mf_status_t mf_delete_model(mf_channel_t *ch, const char *model, int64_t layer,
                                      uint64_t *deleted, int64_t timeout_ms);

/* ==== admin calls ==================================================================== */
/* Synchronous (health and stats also async); any thread; the same deadline and retry
 * rules as the data calls. */

typedef struct mf_entry_info {
    char model[256];
    uint32_t layer;
    mf_hash128_t hash;
    uint32_t block;
    uint64_t size;
    mf_tier_t tier;
    int on_ssd;
    uint32_t pins;
    uint64_t last_access_ms;
} mf_entry_info_t;

typedef struct mf_list_page {
    size_t n_entries;
    mf_entry_info_t *entries;
    uint8_t *next_page_token; /* NULL/0 on the last page; pass it back to continue */
    size_t next_page_token_len;
} mf_list_page_t;

/* model NULL or "" = all; layer < 0 = all; page_size 0 = the daemon's default (100). */
MF_EXPORT mf_status_t mf_list(mf_channel_t *ch, const char *model, int64_t layer,
                              uint32_t page_size, const void *page_token,
                              size_t page_token_len, mf_list_page_t **out,
                              int64_t timeout_ms);
MF_EXPORT void mf_list_page_free(mf_list_page_t *p);

typedef struct mf_tier_stats {
    mf_tier_t tier;
    int enabled;
    uint64_t used_bytes;
    uint64_t capacity_bytes;
    uint64_t entries;
    char why_off[128];       /* why the tier is off ("" when on or not said); truncated */
} mf_tier_stats_t;

typedef struct mf_counter {
    char *name;              /* same names as /metrics without the mapflowd_ prefix */
    uint64_t value;
} mf_counter_t;

typedef struct mf_stats {
    size_t n_tiers;
    mf_tier_stats_t *tiers;
    size_t n_counters;
    mf_counter_t *counters;
    uint64_t uptime_ms;
    uint32_t connections;
} mf_stats_t;

MF_EXPORT mf_status_t mf_stats(mf_channel_t *ch, mf_stats_t **out, int64_t timeout_ms);
/* *out (valid until the event) receives the stats, NULL on failure. */
MF_EXPORT mf_status_t mf_stats_async(mf_channel_t *ch, mf_stats_t **out, int64_t timeout_ms,
                                     mf_cq_t *cq, void *tag, mf_call_t **call);
MF_EXPORT void mf_stats_free(mf_stats_t *s);
/* Value of a named counter in s, or 0 with *found = 0. found may be NULL. */
MF_EXPORT uint64_t mf_stats_counter(const mf_stats_t *s, const char *name, int *found);

/* Demotes (gpu → host → ssd) or drops (ssd) unpinned entries; bytes 0 = to the low
 * watermark. A tier that is off is MF_FAILED_PRECONDITION. */
MF_EXPORT mf_status_t mf_evict(mf_channel_t *ch, mf_tier_t tier, uint64_t bytes,
                               uint64_t *evicted_bytes, uint64_t *evicted_entries,
                               int64_t timeout_ms);
/* Drops every unpinned entry of the channel's namespace. */
MF_EXPORT mf_status_t mf_flush(mf_channel_t *ch, uint64_t *entries, int64_t timeout_ms);
/* mf_evict / mf_flush of every namespace: admin calls (MF_PERMISSION_DENIED on a channel
 * that is not on the admin socket and has no admin_token). */
MF_EXPORT mf_status_t mf_evict_all(mf_channel_t *ch, mf_tier_t tier, uint64_t bytes,
                                   uint64_t *evicted_bytes, uint64_t *evicted_entries,
                                   int64_t timeout_ms);
MF_EXPORT mf_status_t mf_flush_all(mf_channel_t *ch, uint64_t *entries, int64_t timeout_ms);

typedef struct mf_config_item {
    char *key;
    char *value;
    int live;                /* settable at run time */
} mf_config_item_t;

/* key NULL or "" = every key. Free with mf_config_items_free(items, n). */
MF_EXPORT mf_status_t mf_config_get(mf_channel_t *ch, const char *key,
                                    mf_config_item_t **items, size_t *n, int64_t timeout_ms);
/* Sets a live key; *item (may be NULL) receives the value now in effect (free it with
 * mf_config_items_free(item, 1)). */
MF_EXPORT mf_status_t mf_config_set(mf_channel_t *ch, const char *key, const char *value,
                                    mf_config_item_t **item, int64_t timeout_ms);
MF_EXPORT void mf_config_items_free(mf_config_item_t *items, size_t n);

typedef struct mf_health {
    int ok;
    int ready;
    char status[256];
    size_t n_tiers;
    mf_tier_stats_t tiers[4];
} mf_health_t;
MF_EXPORT mf_status_t mf_health(mf_channel_t *ch, mf_health_t *out, int64_t timeout_ms);
/* *out must stay valid until the event (a cheap call to probe or wait for the daemon). */
MF_EXPORT mf_status_t mf_health_async(mf_channel_t *ch, mf_health_t *out, int64_t timeout_ms,
                                      mf_cq_t *cq, void *tag, mf_call_t **call);

/*
 * Mapping profiles travel as the protobuf encoding of mapflow.v1.MappingProfile
 * (proto/mapflow.proto), so this header stays free of generated types. profile_get
 * returns a malloc'd buffer the caller frees with free(); NOT_FOUND when absent.
 */
MF_EXPORT mf_status_t mf_profile_put(mf_channel_t *ch, const void *profile_pb, size_t len,
                                     int64_t timeout_ms);
MF_EXPORT mf_status_t mf_profile_get(mf_channel_t *ch, const char *source_model,
                                     const char *target_model, void **profile_pb,
                                     size_t *len, int64_t timeout_ms);

/* One stored profile, as ProfileList summarises it (mf_profile_get fetches it whole). */
typedef struct mf_profile_info {
    char source_model[256];
    char target_model[256];
    uint32_t block_size;
    uint32_t l0;
    uint32_t target_layers;
    uint32_t mapped_layers;   /* LayerMap entries */
    char *created_by;         /* "" when unset; owned by the page */
    uint64_t encoded_bytes;   /* size of the stored MappingProfile */
} mf_profile_info_t;

typedef struct mf_profile_page {
    size_t n_profiles;
    mf_profile_info_t *profiles;
    uint8_t *next_page_token; /* NULL/0 on the last page; pass it back to continue */
    size_t next_page_token_len;
} mf_profile_page_t;

/* The profiles of the channel's namespace in key order (source, then target; each name
 * shorter first, then bytewise); page_size 0 =
 * the daemon's default (100), at most 1000. UNAVAILABLE when the SSD tier is off. */
MF_EXPORT mf_status_t mf_profile_list(mf_channel_t *ch, uint32_t page_size,
                                      const void *page_token, size_t page_token_len,
                                      mf_profile_page_t **out, int64_t timeout_ms);
MF_EXPORT void mf_profile_page_free(mf_profile_page_t *p);

#ifdef __cplusplus
}
#endif
#endif /* MAPFLOW_H */
