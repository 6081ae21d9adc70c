/*
 * channel — libmapflow's connection internals: socket connect (unix / tcp), the Hello
 * exchange with the host arena fd (SCM_RIGHTS) and its mapping, frame I/O with a
 * deadline, request ids and the reply dispatcher, and the per-channel error message.
 *
 * Structure (so the async half is an extension, not a rewrite): every request gets a
 * fresh request_id; replies are read by one reader (mf__chan_do_call) that matches them
 * to the waiting request by id. In the sync half only one request waits at a time, so a
 * reply with another id belongs to an earlier call that gave up at its deadline and is
 * dropped; the async half will hand such replies to their completion queue instead.
 *
 * Ownership: the channel owns its socket, reader buffer, arena mapping and strings. A
 * reply (mf__reply_t) owns its decoded envelope; its payload points into the channel's
 * reader buffer and is valid until the next exchange on the channel.
 * Thread safety: mf__chan_lock/unlock around every mf__chan_do_call and the use of its
 * reply ("do_" = the caller holds the lock).
 */
#ifndef MF_CLIENT_CHANNEL_H
#define MF_CLIENT_CHANNEL_H

#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>

#include "mapflow.h"
#include "mf_frame.h"

#define MF__ERR_LEN 512
#define MF__DEFAULT_TIMEOUT_MS 30000
#define MF__MAX_NS 128

struct mf_channel {
    pthread_mutex_t mu;
    int fd;
    int is_unix;
    int broken;                 /* stream state unknown: every later call fails */
    mf_frame_reader_t rd;
    uint64_t next_id;
    int64_t timeout_ms;
    uint32_t max_frame;         /* largest frame we accept and send */
    char ns[MF__MAX_NS + 1];
    /* From HelloReply. */
    char *daemon_version;
    uint64_t session_id;
    uint32_t server_max_frame;
    uint32_t max_batch;
    int gpu_tier;
    /* Host arena, mapped MAP_SHARED when the daemon passed its fd. */
    uint8_t *arena;
    size_t arena_bytes;
    char err[MF__ERR_LEN];
};

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

void mf__chan_lock(mf_channel_t *ch);
void mf__chan_unlock(mf_channel_t *ch);

/* Records the message of a failed call and returns st. */
mf_status_t mf__chan_error(mf_channel_t *ch, mf_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/*
 * Sends req (its request_id is assigned here) followed by payload, then waits for the
 * reply with the same id whose body is want_case. An ErrorReply becomes its status and
 * message. On OK, *rep holds the reply; free it with mf__reply_done. The caller holds
 * the lock.
 */
mf_status_t mf__chan_do_call(mf_channel_t *ch, mf_envelope_t *req, const void *payload,
                             size_t payload_len, int want_case, int64_t timeout_ms,
                             mf__reply_t *rep);
/* Sends a request whose reply nobody waits for (PutAbort on an error path). */
mf_status_t mf__chan_do_send(mf_channel_t *ch, mf_envelope_t *req, int64_t timeout_ms);
void mf__reply_done(mf__reply_t *rep);

/* Copies a C string into a newly malloc'd one (NULL stays NULL). */
char *mf__strdup(const char *s);

#endif /* MF_CLIENT_CHANNEL_H */
