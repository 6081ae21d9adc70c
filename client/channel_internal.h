/*
 * channel_internal — what the three parts of the channel share and nothing else sees:
 * channel_conn.c (connect, Hello, arena mapping; open / close / info of a channel),
 * channel.c (the operation engine: id table, completion, retries, sending, the I/O
 * thread) and channel_call.c (running an operation sync or async, one-request
 * operations, groups). Everything else in the library uses channel.h.
 *
 * Owns nothing itself; the ownership and locking rules are channel.h's: functions named
 * mf__do_* expect ch->mu held, mf__conn_open runs on the thread that (re)connects with
 * the lock dropped, mf__io_main is the I/O thread's body.
 */
#ifndef MF_CLIENT_CHANNEL_INTERNAL_H
#define MF_CLIENT_CHANNEL_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "gpu.h"
#include "mapflow.h"
#include "mf_frame.h"

/* The channel's own types (channel.h) by their tags: this header does not include it, so
 * that channel.c including this one makes no circle of modules. */
struct mf__conn;
struct mf__outbuf;
struct mf__retired;

#define MF__RECV_CHUNK (64u << 10)
#define MF__UCX_WAKE_MS 200      /* longest sleep of the I/O thread on a UCX connection */

struct mf__outbuf {              /* bytes of frames the socket did not take at once */
    struct mf__outbuf *next;
    size_t len, off;
    uint8_t data[];
};

struct mf__retired {             /* what an earlier connection left, freed at close */
    struct mf__retired *next;
    uint8_t *arena;              /* leased views may still point here */
    size_t bytes;
    mf__gpu_pin_t *arena_pin;    /* unregistered before the munmap */
    mf__gpu_set_t gpu;           /* GPU arenas likewise (or taken over by a reconnect) */
    char *daemon_version;        /* mf_channel_info handed it out */
};

/* ---- small helpers (channel.c) ---- */

/* Absolute deadline (monotonic ms) for a call; INT64_MAX = none. */
int64_t mf__deadline_of(const mf_channel_t *ch, int64_t timeout_ms);
/* Milliseconds left for poll(2); -1 = forever, 0 = expired. */
int mf__poll_ms(int64_t deadline);
/* Formats a message into an MF__ERR_LEN buffer. */
void mf__errf(char *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Wakes the I/O thread (eventfd). */
void mf__wake_io(mf_channel_t *ch);

/* ---- the connection (channel_conn.c) ---- */

/* Connects to ch->target and says Hello (request id rid, and rid + 1 for RemoteArena on
 * UCX: mf__do_hello_ids hands out both); on success *c is the new connection. Lock not
 * held. */
mf_status_t mf__conn_open(mf_channel_t *ch, struct mf__conn *c, uint64_t rid, int64_t deadline,
                          char *err);
/* Closes c's transport and unmaps what it mapped. */
void mf__conn_release(mf_channel_t *ch, struct mf__conn *c);
/* Reads into the frame reader: r = 0: the connection is gone; r < 0 with errno EAGAIN:
 * nothing now. An fd arriving with the bytes goes to *fd_out if it is -1 (else closed). */
ssize_t mf__conn_recv(struct mf__conn *c, mf_frame_reader_t *rd, int *fd_out);
/* Why c's peer went away (for the message of the calls it fails). */
const char *mf__conn_gone_why(const struct mf__conn *c);

/* ---- the engine (channel.c) ---- */

/* Two consecutive fresh request ids for mf__conn_open (Hello, RemoteArena): the first.
 * Lock held. */
uint64_t mf__do_hello_ids(mf_channel_t *ch);
/* The I/O thread (arg: the channel). */
void *mf__io_main(void *arg);
/* Starts op with an absolute deadline. Lock held. */
mf_status_t mf__do_op_start(mf_channel_t *ch, mf_call_t *op, int64_t deadline);

/* ---- groups (channel_call.c) ---- */

/* A kid of a group finished (lock held): record it, start more, finish the group. */
void mf__do_kid_done(mf_channel_t *ch, mf_call_t *kid);
/* Starts a group's kids; it completes through g->done when the last one finishes. */
mf_status_t mf__group_run(mf_call_t *g, int64_t timeout_ms);

#endif /* MF_CLIENT_CHANNEL_INTERNAL_H */
