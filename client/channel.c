/* channel — the operation engine: requests in flight (ch->sess, proto/mf_session.h),
 * completion, deadlines, retries and backoff, sending, and the I/O thread (see
 * channel.h, channel_internal.h). */
#include "channel.h"
#include "channel_internal.h"
#include "mf_clock.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

/* ==== small helpers ================================================================== */

char *mf__strdup(const char *s)
{
    if (!s)
        return NULL;
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d)
        memcpy(d, s, n);
    return d;
}

/* Absolute deadline (monotonic ms) for a call; INT64_MAX = none. */
int64_t mf__deadline_of(const mf_channel_t *ch, int64_t timeout_ms)
{
    if (timeout_ms == MF_TIMEOUT_DEFAULT)
        timeout_ms = ch->timeout_ms;
    if (timeout_ms < 0)
        return INT64_MAX;
    return mf_now_ms() + timeout_ms;
}

/* Milliseconds left for poll(2); -1 = forever, 0 = expired. */
int mf__poll_ms(int64_t deadline)
{
    if (deadline == INT64_MAX)
        return -1;
    int64_t left = deadline - mf_now_ms();
    if (left <= 0)
        return 0;
    return left > 1000000 ? 1000000 : (int)left;
}

void mf__errf(char *err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, MF__ERR_LEN, fmt, ap);
    va_end(ap);
}

mf_status_t mf__chan_error(mf_channel_t *ch, mf_status_t st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    pthread_mutex_lock(&ch->mu);
    vsnprintf(ch->err, sizeof(ch->err), fmt, ap);
    pthread_mutex_unlock(&ch->mu);
    va_end(ap);
    return st;
}

void mf__wake_io(mf_channel_t *ch)
{
    uint64_t one = 1;
    ssize_t w = write(ch->wake_fd, &one, sizeof(one));
    (void)w; /* a full counter is still a pending wake-up */
}

/* ==== operations: table, list, completion ============================================ */

mf__op_t *mf__op_new(mf_channel_t *ch, const mf__op_vt_t *vt, void *priv)
{
    mf__op_t *op = calloc(1, sizeof(*op));
    if (!op)
        return NULL;
    op->ch = ch;
    op->vt = vt;
    op->priv = priv;
    op->refs = 1;
    op->deadline = INT64_MAX;
    return op;
}

void mf__op_unref(mf__op_t *op)
{
    if (!op || __atomic_sub_fetch(&op->refs, 1, __ATOMIC_ACQ_REL) > 0)
        return;
    if (op->vt->destroy)
        op->vt->destroy(op);
    if (op->has_cv)
        pthread_cond_destroy(&op->cv);
    free(op->req);
    free(op);
}

int mf__op_error(mf__op_t *op, mf_status_t st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(op->err, sizeof(op->err), fmt, ap);
    va_end(ap);
    return (int)st;
}

const mf__conn_t *mf__op_conn(const mf__op_t *op)
{
    return &op->ch->conn;
}

mf_status_t mf__op_pack(mf__op_t *op, const mf_envelope_t *env, const void *payload,
                        size_t payload_len, int want_case)
{
    /* Packed once without request_id; every send appends field 1 (protobuf: the last
     * occurrence of a scalar field wins), so a retry needs no re-encoding. */
    mf_envelope_t e = *env;
    e.request_id = 0;
    size_t n = mapflow__v1__envelope__get_packed_size(&e);
    uint8_t *b = malloc(n ? n : 1);
    if (!b)
        return (mf_status_t)mf__op_error(op, MF_RESOURCE_EXHAUSTED, "out of memory");
    mapflow__v1__envelope__pack(&e, b);
    free(op->req);
    op->req = b;
    op->req_len = n;
    op->payload = payload;
    op->payload_len = payload_len;
    op->want_case = want_case;
    return MF_OK;
}

uint64_t mf__do_hello_ids(mf_channel_t *ch)
{
    uint64_t rid = mf_session_next_id(&ch->sess);
    if (mf_session_next_id(&ch->sess) != rid + 1) /* wrapped past 2^64: take a fresh pair */
        rid = mf_session_next_id(&ch->sess), mf_session_next_id(&ch->sess);
    return rid;
}

static void do_note_due(mf_channel_t *ch, int64_t t)
{
    if (t < ch->next_due)
        ch->next_due = t;
    if (t < ch->io_sleep_until)
        mf__wake_io(ch);
}


/* The op's final status is known: undo, unlink, tell its owner, drop the library ref. */
static void do_complete(mf_channel_t *ch, mf__op_t *op, mf_status_t st)
{
    if (op->state == MF__OP_DONE)
        return;
    if (op->state == MF__OP_IN_FLIGHT)
        mf_session_take(&ch->sess, op->rid);
    if (st != MF_OK && op->vt->undo)
        op->vt->undo(op);
    if (op->prev)
        op->prev->next = op->next;
    else
        ch->ops = op->next;
    if (op->next)
        op->next->prev = op->prev;
    op->prev = op->next = NULL;
    ch->n_live--;
    op->state = MF__OP_DONE;
    op->status = st;
    if (st == MF_OK)
        op->err[0] = '\0';
    else if (!op->err[0])
        snprintf(op->err, sizeof(op->err), "%s", mf_strerror((int)st));
    if (op->group)
        mf__do_kid_done(ch, op);
    else
        op->done(op);
    mf__op_unref(op);
}

/* Backoff before retry n (0-based): initial × multiplier^n, capped, ± jitter. */
static int64_t do_backoff(mf_channel_t *ch, uint32_t n)
{
    const mf_retry_policy_t *r = &ch->retry;
    double d = r->initial_backoff_ms;
    for (uint32_t i = 0; i < n && d < r->max_backoff_ms; i++)
        d *= r->multiplier;
    if (d > r->max_backoff_ms)
        d = r->max_backoff_ms;
    ch->rng ^= ch->rng << 13;
    ch->rng ^= ch->rng >> 7;
    ch->rng ^= ch->rng << 17;
    double u = (double)(ch->rng >> 11) / (double)(1ull << 53); /* [0, 1) */
    d *= 1.0 + r->jitter * (2.0 * u - 1.0);
    return d < 1 ? 1 : (int64_t)d;
}

/* An attempt failed with st: retry it later when st is UNAVAILABLE and the policy and
 * deadline allow, else complete the op with st. */
static void do_attempt_failed(mf_channel_t *ch, mf__op_t *op, mf_status_t st, const char *why)
{
    if (op->state == MF__OP_IN_FLIGHT)
        mf_session_take(&ch->sess, op->rid);
    if (why && why != op->err)
        snprintf(op->err, sizeof(op->err), "%s", why);
    if (st == MF_UNAVAILABLE && !op->cancel_req && op->attempts < ch->retry.max_retries &&
        !ch->closing) {
        int64_t at = mf_now_ms() + do_backoff(ch, op->attempts);
        if (at < op->deadline) {
            if (op->vt->undo)
                op->vt->undo(op);
            op->attempts++;
            op->state = MF__OP_WAIT_SEND;
            op->retry_at = at;
            do_note_due(ch, at);
            return;
        }
    }
    do_complete(ch, op, st);
}

/* ==== sending ======================================================================== */

static void do_queue(mf_channel_t *ch, const struct iovec *iov, int n, size_t skip)
{
    size_t total = 0;
    for (int i = 0; i < n; i++)
        total += iov[i].iov_len;
    mf__outbuf_t *b = malloc(sizeof(*b) + total - skip);
    if (!b) {
        /* Part of a frame is on the wire and the rest cannot be kept: the stream is lost. */
        ch->broken = 1;
        mf__wake_io(ch);
        return;
    }
    b->next = NULL;
    b->len = total - skip;
    b->off = 0;
    size_t o = 0;
    for (int i = 0; i < n; i++) {
        size_t l = iov[i].iov_len;
        const uint8_t *p = iov[i].iov_base;
        if (skip >= l) {
            skip -= l;
            continue;
        }
        memcpy(b->data + o, p + skip, l - skip);
        o += l - skip;
        skip = 0;
    }
    int was_empty = ch->outq == NULL;
    if (ch->outq_tail)
        ch->outq_tail->next = b;
    else
        ch->outq = b;
    ch->outq_tail = b;
    if (was_empty)
        mf__wake_io(ch); /* it must now poll for POLLOUT */
}

/* Writes a frame (head + payload) now if nothing is queued, queueing what the socket
 * does not take; never blocks. */
static void do_write_frame(mf_channel_t *ch, const uint8_t *head, size_t head_len,
                           const void *payload, size_t payload_len)
{
    struct iovec iov[2] = {{(void *)head, head_len}, {(void *)payload, payload_len}};
    int n = payload_len ? 2 : 1;
    /* UCX: the endpoint is the I/O thread's alone; each queued buffer is one frame. */
    if (ch->outq || ch->broken || ch->conn.ucx) {
        if (!ch->broken)
            do_queue(ch, iov, n, 0);
        return;
    }
    struct msghdr m = {.msg_iov = iov, .msg_iovlen = (size_t)n};
    ssize_t w;
    do
        w = sendmsg(ch->conn.fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
    while (w < 0 && errno == EINTR);
    if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
        snprintf(ch->conn_err, sizeof(ch->conn_err), "send: %s", strerror(errno));
        ch->broken = 1;
        mf__wake_io(ch);
        return;
    }
    size_t sent = w < 0 ? 0 : (size_t)w;
    if (sent < head_len + payload_len)
        do_queue(ch, iov, n, sent);
}

/* Encodes the op's current request with a fresh id and writes it. Lock held, connected. */
static void do_send(mf_channel_t *ch, mf__op_t *op)
{
    uint64_t rid;
    if (mf_session_add(&ch->sess, op->deadline, op, &rid) != MF_OK) {
        mf__op_error(op, MF_RESOURCE_EXHAUSTED, "%zu requests in flight: the most one channel "
                     "holds", mf_session_pending(&ch->sess));
        do_complete(ch, op, MF_RESOURCE_EXHAUSTED);
        return;
    }
    op->rid = rid;
    op->state = MF__OP_IN_FLIGHT; /* a failure below completes it and takes rid out */
    uint8_t idf[11];
    size_t il = 0;
    idf[il++] = 0x08; /* field 1, varint */
    for (uint64_t v = rid; ; v >>= 7) {
        idf[il++] = (uint8_t)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
        if (v <= 0x7f)
            break;
    }
    size_t msg_len = op->req_len + il;
    uint64_t frame_len = 4 + (uint64_t)msg_len + op->payload_len;
    uint32_t limit = ch->conn.far.max_frame ? ch->conn.far.max_frame : ch->max_frame;
    if (frame_len + 4 > limit) {
        mf__op_error(op, MF_RESOURCE_EXHAUSTED, "request of %zu payload bytes exceeds "
                     "max_frame %u", op->payload_len, limit);
        do_complete(ch, op, MF_RESOURCE_EXHAUSTED);
        return;
    }
    uint8_t stackbuf[512];
    size_t head_len = 8 + msg_len;
    uint8_t *head = head_len <= sizeof(stackbuf) ? stackbuf : malloc(head_len);
    if (!head) {
        mf__op_error(op, MF_RESOURCE_EXHAUSTED, "out of memory");
        do_complete(ch, op, MF_RESOURCE_EXHAUSTED);
        return;
    }
    uint32_t fl = (uint32_t)frame_len, ml = (uint32_t)msg_len;
    for (int i = 0; i < 4; i++) {
        head[i] = (uint8_t)(fl >> (8 * i));
        head[4 + i] = (uint8_t)(ml >> (8 * i));
    }
    memcpy(head + 8, op->req, op->req_len);
    memcpy(head + 8 + op->req_len, idf, il);
    op->gen = ch->gen;
    do_write_frame(ch, head, head_len, op->payload, op->payload_len);
    if (head != stackbuf)
        free(head);
}

void mf__send_oneway(mf_channel_t *ch, const mf_envelope_t *env)
{
    pthread_mutex_lock(&ch->mu);
    mf__do_send_oneway(ch, env);
    pthread_mutex_unlock(&ch->mu);
}

void mf__do_send_oneway(mf_channel_t *ch, const mf_envelope_t *env)
{
    if (ch->state != MF__CONNECTED || ch->broken)
        return;
    mf_envelope_t e = *env;
    e.request_id = mf_session_next_id(&ch->sess);
    uint8_t *buf;
    size_t len;
    uint32_t limit = ch->conn.far.max_frame ? ch->conn.far.max_frame : ch->max_frame;
    if (mf_frame_encode(&e, NULL, 0, limit, &buf, &len) != MF_OK)
        return;
    do_write_frame(ch, buf, len, NULL, 0);
    free(buf);
}

/* Begins an attempt: packs the first request and sends it, or waits for a connection. */
static void do_begin_attempt(mf_channel_t *ch, mf__op_t *op)
{
    mf_status_t st = op->vt->start(op);
    if (st != MF_OK) {
        do_complete(ch, op, st);
        return;
    }
    if (ch->state == MF__CONNECTED && !ch->broken) {
        do_send(ch, op);
        return;
    }
    op->state = MF__OP_WAIT_SEND;
    op->retry_at = mf_now_ms();
    do_note_due(ch, op->retry_at);
}

/* ==== the I/O thread ================================================================= */

/* Hands one queued buffer (a whole frame) to the UCX endpoint: 0, or -1 = broken. */
static int do_flush_ucx(mf_channel_t *ch, mf__outbuf_t *b)
{
    if (mf__ucx_send(ch->conn.ucx, b->data, b->len) == MF_OK) {
        b->off = b->len;
        return 0;
    }
    const char *why = mf__ucx_error(ch->conn.ucx);
    snprintf(ch->conn_err, sizeof(ch->conn_err), "send: %s", why[0] ? why : "out of memory");
    ch->broken = 1;
    return -1;
}

static void do_flush_outq(mf_channel_t *ch)
{
    while (ch->outq && !ch->broken) {
        mf__outbuf_t *b = ch->outq;
        if (ch->conn.ucx) {
            if (do_flush_ucx(ch, b) < 0)
                return;
        } else {
            ssize_t w = send(ch->conn.fd, b->data + b->off, b->len - b->off,
                             MSG_NOSIGNAL | MSG_DONTWAIT);
            if (w < 0) {
                if (errno == EINTR)
                    continue;
                if (errno != EAGAIN && errno != EWOULDBLOCK) {
                    snprintf(ch->conn_err, sizeof(ch->conn_err), "send: %s", strerror(errno));
                    ch->broken = 1;
                }
                return;
            }
            b->off += (size_t)w;
        }
        if (b->off == b->len) {
            ch->outq = b->next;
            if (!ch->outq)
                ch->outq_tail = NULL;
            free(b);
        }
    }
}

/* The connection is gone: fail what was sent on it (st: UNAVAILABLE, or INTERNAL for a
 * protocol violation, which a retry would not fix). The arena stays mapped (retired). */
static void do_disconnect(mf_channel_t *ch, mf_status_t st, const char *why)
{
    if (ch->state != MF__CONNECTED)
        return;
    char msg[MF__ERR_LEN];
    snprintf(msg, sizeof(msg), "%s", why);
    snprintf(ch->conn_err, sizeof(ch->conn_err), "%s", why);
    ch->state = MF__DISCONNECTED;
    ch->broken = 0;
    if (ch->conn.fd >= 0)
        close(ch->conn.fd);
    ch->conn.fd = -1;
    mf__ucx_close(ch->conn.ucx);
    ch->conn.ucx = NULL;
    ch->conn.far.remote_bytes = 0;
    mf__retired_t *r = malloc(sizeof(*r));
    if (r) {
        r->arena = ch->conn.arena;
        r->bytes = ch->conn.arena_bytes;
        r->arena_pin = ch->conn.arena_pin;
        r->daemon_version = ch->conn.daemon_version;
        r->gpu = ch->conn.gpu;
        r->next = ch->retired;
        ch->retired = r;
    } /* else: leak them rather than pull memory from under a leased view */
    memset(&ch->conn.gpu, 0, sizeof(ch->conn.gpu));
    ch->conn.arena = NULL;
    ch->conn.arena_bytes = 0;
    ch->conn.arena_pin = NULL;
    ch->conn.daemon_version = NULL;
    ch->conn.aops = mf__arena_ops_pick(&ch->conn, &ch->conn.arena_reach); /* none now */
    while (ch->outq) {
        mf__outbuf_t *b = ch->outq;
        ch->outq = b->next;
        free(b);
    }
    ch->outq_tail = NULL;
    mf_frame_reader_deinit(&ch->rd);
    mf_frame_reader_init(&ch->rd, ch->max_frame);
    ch->connect_after = mf_now_ms(); /* the next call may try at once */
    mf__op_t *next;
    for (mf__op_t *op = ch->ops; op; op = next) {
        next = op->next;
        if (op->state == MF__OP_IN_FLIGHT)
            do_attempt_failed(ch, op, st, msg);
    }
}

/* Reconnects (lock dropped meanwhile); on failure the due attempts fail. */
static void do_reconnect(mf_channel_t *ch, int64_t deadline)
{
    ch->state = MF__CONNECTING;
    mf__conn_t nc;
    char err[MF__ERR_LEN] = "";
    uint64_t rid = mf__do_hello_ids(ch);
    pthread_mutex_unlock(&ch->mu);
    mf_status_t st = mf__conn_open(ch, &nc, rid, deadline, err);
    pthread_mutex_lock(&ch->mu);
    int64_t now = mf_now_ms();
    if (st == MF_OK) {
        ch->conn = nc; /* the old one's leftovers are on ch->retired */
        ch->gen++;
        ch->reconnects++;
        ch->state = MF__CONNECTED;
        ch->reconnect_delay = ch->retry.initial_backoff_ms;
        ch->conn_err[0] = '\0';
        return;
    }
    ch->state = MF__DISCONNECTED;
    snprintf(ch->conn_err, sizeof(ch->conn_err), "reconnect: %.480s", err);
    ch->connect_after = now + ch->reconnect_delay;
    ch->reconnect_delay *= 2;
    if (ch->reconnect_delay > ch->retry.max_backoff_ms)
        ch->reconnect_delay = ch->retry.max_backoff_ms;
    if (ch->reconnect_delay < 1)
        ch->reconnect_delay = 1;
    /* A refused Hello (token, namespace) is final; anything else may heal. */
    mf_status_t fail = st == MF_DEADLINE_EXCEEDED ? MF_UNAVAILABLE : st;
    mf__op_t *next;
    for (mf__op_t *op = ch->ops; op; op = next) {
        next = op->next;
        if (op->state == MF__OP_WAIT_SEND && op->retry_at <= now)
            do_attempt_failed(ch, op, fail, ch->conn_err);
    }
}

/* op asked to be cancelled or is past its deadline: it ends now. */
static void do_end_due(mf_channel_t *ch, mf__op_t *op)
{
    if (op->cancel_req) {
        mf__op_error(op, MF_CANCELLED, "cancelled");
        do_complete(ch, op, MF_CANCELLED);
        return;
    }
    char last[MF__ERR_LEN];
    snprintf(last, sizeof(last), "%s", op->attempts ? op->err : "");
    mf__op_error(op, MF_DEADLINE_EXCEEDED, "deadline exceeded%s%.400s",
                 op->attempts ? " after retries: " : "", last);
    do_complete(ch, op, MF_DEADLINE_EXCEEDED);
}

/* Deadlines, cancellations, due (re)sends; recomputes next_due. */
static void do_timers(mf_channel_t *ch)
{
    int64_t now = mf_now_ms();
    int cancels = ch->cancels;
    ch->cancels = 0;
    if (now < ch->next_due && !cancels)
        return;
    /* Requests in flight past their deadline come out of the session's table; the ops
     * that wait to be sent are checked on the list below. */
    mf__op_t *op;
    while ((op = mf_session_expire(&ch->sess, now, NULL))) {
        op->state = MF__OP_NEW; /* out of the table already */
        do_end_due(ch, op);
    }
    int64_t due = INT64_MAX, connect_by = INT64_MAX;
    int want_send = 0;
    mf__op_t *next;
    for (op = ch->ops; op; op = next) {
        next = op->next;
        if (op->state == MF__OP_IN_STEP)
            continue;
        if (op->cancel_req || op->deadline <= now) {
            do_end_due(ch, op);
            continue;
        }
        if (op->deadline < due)
            due = op->deadline;
        if (op->state == MF__OP_WAIT_SEND) {
            if (op->retry_at <= now) {
                want_send = 1;
                if (op->deadline < connect_by)
                    connect_by = op->deadline;
            } else if (op->retry_at < due) {
                due = op->retry_at;
            }
        }
    }
    ch->next_due = due;
    if (!want_send)
        return;
    if (ch->state == MF__DISCONNECTED && now >= ch->connect_after) {
        int64_t cap = now + (ch->timeout_ms >= 0 ? ch->timeout_ms : MF__DEFAULT_TIMEOUT_MS);
        do_reconnect(ch, connect_by < cap ? connect_by : cap);
        if (ch->closing)
            return;
    }
    now = mf_now_ms();
    for (op = ch->ops; op; op = next) {
        next = op->next;
        if (op->state != MF__OP_WAIT_SEND || op->retry_at > now)
            continue;
        if (ch->state == MF__CONNECTED && !ch->broken) {
            op->state = MF__OP_NEW;
            do_begin_attempt(ch, op);
        } else if (ch->retry.max_retries > op->attempts && ch->connect_after < op->deadline) {
            op->retry_at = ch->connect_after; /* wait for the next connect, not a retry */
            do_note_due(ch, op->retry_at);
        } else {
            do_attempt_failed(ch, op, MF_UNAVAILABLE,
                              ch->conn_err[0] ? ch->conn_err : "not connected");
        }
    }
}

/* Handles one reply frame. */
static void do_dispatch(mf_channel_t *ch, const mf_frame_t *f)
{
    mf_envelope_t *env = NULL;
    const char *why = NULL;
    mf_status_t st = mf_envelope_decode(f, &env, &why);
    if (st == MF_UNIMPLEMENTED)
        return; /* a reply type newer than us: not ours to interpret */
    if (st != MF_OK) {
        char msg[MF__ERR_LEN];
        snprintf(msg, sizeof(msg), "undecodable reply from the daemon: %s", why);
        do_disconnect(ch, MF_INTERNAL, msg);
        return;
    }
    mf__op_t *op = mf_session_take(&ch->sess, env->request_id);
    if (!op) { /* a reply to a call that gave up (deadline, cancel) or to a one-way */
        mf_envelope_free(env);
        return;
    }
    op->state = MF__OP_IN_STEP;
    int r = mf_session_reply_status(env, op->want_case, op->err, sizeof(op->err));
    if (r == MF_OK) {
        mf__reply_t rep = {env, f->payload, f->payload_len};
        pthread_mutex_unlock(&ch->mu);
        r = op->vt->step(op, &rep);
        pthread_mutex_lock(&ch->mu);
    }
    mf_envelope_free(env);
    if (r == MF_OK)
        do_complete(ch, op, MF_OK);
    else if (op->cancel_req)
        do_complete(ch, op, (mf_status_t)mf__op_error(op, MF_CANCELLED, "cancelled"));
    else if (r == MF__CONTINUE && op->deadline <= mf_now_ms())
        do_complete(ch, op, (mf_status_t)mf__op_error(op, MF_DEADLINE_EXCEEDED,
                                                      "deadline exceeded"));
    else if (r == MF__CONTINUE)
        do_send(ch, op);
    else
        do_attempt_failed(ch, op, (mf_status_t)r, NULL);
}

static void do_read(mf_channel_t *ch)
{
    for (int rounds = 0; rounds < 64 && ch->state == MF__CONNECTED; rounds++) {
        ssize_t r = mf__conn_recv(&ch->conn, &ch->rd, NULL);
        if (r == 0) {
            do_disconnect(ch, MF_UNAVAILABLE, mf__conn_gone_why(&ch->conn));
            return;
        }
        if (r < 0) {
            if (errno != EAGAIN && errno != EWOULDBLOCK) {
                char msg[128];
                snprintf(msg, sizeof(msg), "recv: %s", strerror(errno));
                do_disconnect(ch, MF_UNAVAILABLE, msg);
            }
            return;
        }
        for (;;) {
            mf_frame_t f;
            int have;
            const char *why = NULL;
            if (mf_frame_reader_next(&ch->rd, &f, &have, &why) != MF_OK) {
                char msg[MF__ERR_LEN];
                snprintf(msg, sizeof(msg), "bad reply frame from the daemon: %s", why);
                do_disconnect(ch, MF_INTERNAL, msg);
                return;
            }
            if (!have)
                break;
            do_dispatch(ch, &f);
            if (ch->state != MF__CONNECTED)
                return;
        }
    }
}

void *mf__io_main(void *arg)
{
    mf_channel_t *ch = arg;
    pthread_mutex_lock(&ch->mu);
    while (!ch->closing) {
        if (ch->broken && ch->state == MF__CONNECTED)
            do_disconnect(ch, MF_UNAVAILABLE, ch->conn_err[0] ? ch->conn_err
                                                              : "connection broken");
        do_timers(ch);
        if (ch->closing)
            break;
        if (ch->state == MF__CONNECTED)
            do_flush_outq(ch);
        if (ch->broken)
            continue;
        struct pollfd p[2] = {{.fd = ch->wake_fd, .events = POLLIN}, {.fd = -1}};
        int n = 1;
        mf__ucx_t *ucx = ch->state == MF__CONNECTED ? ch->conn.ucx : NULL;
        if (ch->state == MF__CONNECTED) {
            p[1].fd = ucx ? mf__ucx_efd(ucx) : ch->conn.fd;
            p[1].events = POLLIN | (ch->outq && !ucx ? POLLOUT : 0);
            n = 2;
        }
        ch->io_sleep_until = ch->next_due;
        int ms = mf__poll_ms(ch->io_sleep_until);
        /* UCX: sleep only on an armed worker, and wake now and then for the progress
         * that its event fd does not announce (wire-up, keepalive). */
        if (ucx && (ms < 0 || ms > MF__UCX_WAKE_MS))
            ms = MF__UCX_WAKE_MS;
        if (ucx && !mf__ucx_arm(ucx))
            ms = 0;
        pthread_mutex_unlock(&ch->mu);
        int r = poll(p, (nfds_t)n, ms);
        pthread_mutex_lock(&ch->mu);
        ch->io_sleep_until = INT64_MIN;
        if (r > 0 && (p[0].revents & POLLIN)) {
            uint64_t v;
            ssize_t rr = read(ch->wake_fd, &v, sizeof(v));
            (void)rr;
        }
        if (r >= 0 && n == 2 && ch->state == MF__CONNECTED && (p[1].revents || ucx))
            do_read(ch); /* POLLHUP / POLLERR show up as EOF or an error here */
    }
    /* Closing: every call still running ends now. */
    mf__op_t *next;
    for (mf__op_t *op = ch->ops; op; op = next) {
        next = op->next;
        mf__op_error(op, MF_CANCELLED, "channel closed");
        do_complete(ch, op, MF_CANCELLED);
    }
    pthread_mutex_unlock(&ch->mu);
    return NULL;
}

/* ==== starting and waiting =========================================================== */

/* Starts op with an absolute deadline. Lock held. */
mf_status_t mf__do_op_start(mf_channel_t *ch, mf__op_t *op, int64_t deadline)
{
    if (ch->closing || !ch->io_started)
        return (mf_status_t)mf__op_error(op, MF_UNAVAILABLE, "channel is not connected%s%s",
                                         ch->conn_err[0] ? ": " : "", ch->conn_err);
    op->deadline = deadline;
    __atomic_add_fetch(&op->refs, 1, __ATOMIC_ACQ_REL); /* the engine's, dropped at done */
    op->next = ch->ops;
    if (ch->ops)
        ch->ops->prev = op;
    ch->ops = op;
    ch->n_live++;
    if (op->deadline != INT64_MAX)
        do_note_due(ch, op->deadline);
    if (ch->state == MF__CONNECTED || ch->retry.max_retries > 0 || mf_now_ms() >= ch->connect_after)
        do_begin_attempt(ch, op);
    else /* fail fast: no retries and a reconnect was just refused */
        do_attempt_failed(ch, op, MF_UNAVAILABLE, ch->conn_err);
    return MF_OK;
}


mf_status_t mf__op_start(mf__op_t *op, int64_t timeout_ms)
{
    mf_channel_t *ch = op->ch;
    if (op->kids) /* a group: its kids are the operations */
        return mf__group_run(op, timeout_ms);
    pthread_mutex_lock(&ch->mu);
    mf_status_t st = mf__do_op_start(ch, op, mf__deadline_of(ch, timeout_ms));
    pthread_mutex_unlock(&ch->mu);
    return st;
}
