/* transport_ucx — UCX context, worker, endpoint, frames and arena RMA (see transport_ucx.h). */
#include "transport_ucx.h"
#include "mf_clock.h"

#include "mf_addr.h"
#include "mf_ucx_setup.h"

#include <dlfcn.h>
#include <errno.h>
#include <netdb.h>
#include <pthread.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <ucp/api/ucp.h>

/* A sleeping wait wakes at least this often: some UCX work (wire-up, keepalive) is only
 * advanced by progress, not announced on the event fd. */
#define WAKE_MS 100
/* Closing waits at most this long for sent frames to leave (a Release, a PutAbort). */
#define CLOSE_MS 1000

/* UCX is loaded on first use, not linked: processes that only talk over unix sockets
 * (most workers) neither need libucx installed nor get UCX's memory hooks. */
#define UCX_LIB "libucp.so.0"
/* Besides those of the shared setup (mf_ucx_setup.h, MF_UCX_SETUP_FUNCS). */
#define UCX_FUNCS(X) \
    X(ucs_status_string) \
    X(ucp_cleanup) \
    X(ucp_worker_destroy) \
    X(ucp_worker_arm) \
    X(ucp_worker_progress) \
    X(ucp_am_data_release) \
    X(ucp_am_send_nbx) \
    X(ucp_ep_close_nbx) \
    X(ucp_ep_flush_nbx) \
    X(ucp_ep_rkey_unpack) \
    X(ucp_rkey_destroy) \
    X(ucp_get_nbx) \
    X(ucp_put_nbx) \
    X(ucp_request_free) \
    X(ucp_request_check_status)

static struct {
#define X(f) __typeof__(f) *f;
    UCX_FUNCS(X)
#undef X
} ucx;
static mf_ucx_api_t ucx_setup; /* the setup's functions, loaded alongside */
static pthread_once_t ucx_once = PTHREAD_ONCE_INIT;
static char ucx_load_err[256];

static void ucx_load(void)
{
    void *h = dlopen(UCX_LIB, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(ucx_load_err, sizeof(ucx_load_err), "UCX is not available: %s", dlerror());
        return;
    }
#define X(f)                                                                               \
    if (!ucx_load_err[0] && !(*(void **)&ucx.f = dlsym(h, #f)))                            \
        snprintf(ucx_load_err, sizeof(ucx_load_err), "UCX is not usable: %s missing in "    \
                 UCX_LIB, #f);
    UCX_FUNCS(X)
#undef X
#define X(f)                                                                               \
    if (!ucx_load_err[0] && !(*(void **)&ucx_setup.f = dlsym(h, #f)))                      \
        snprintf(ucx_load_err, sizeof(ucx_load_err), "UCX is not usable: %s missing in "    \
                 UCX_LIB, #f);
    MF_UCX_SETUP_FUNCS(X)
#undef X
    /* h stays open: the process keeps UCX once it used it. */
}

struct mf__ucx {
    ucp_context_h ctx;
    ucp_worker_h worker;
    ucp_ep_h ep;
    int efd;
    ucp_rkey_h rkey;
    uint64_t rbase, rbytes;
    uint32_t max_frame;
    int failed;
    char why[256];
    unsigned sending;            /* frames handed to UCX, not yet completed */
    uint8_t *in;                 /* frames received, not yet handed to the reader */
    size_t in_len, in_cap;
};

typedef struct send_op {
    mf__ucx_t *u;
    uint8_t data[];
} send_op_t;

/* Completion of a group of RMA operations (and the flush after puts). Heap-allocated:
 * a request still running when its waiter gives up must not point at a dead stack. */
typedef struct batch {
    size_t pending;
    ucs_status_t status;
    int abandoned;
} batch_t;

static void fail(mf__ucx_t *u, const char *why)
{
    if (u->failed)
        return;
    u->failed = 1;
    snprintf(u->why, sizeof(u->why), "ucx: %s", why);
}

static void progress(mf__ucx_t *u)
{
    while (ucx.ucp_worker_progress(u->worker))
        ;
}

/* ==== frames ============================================================================ */

static void on_ep_error(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    (void)ep;
    fail(arg, ucx.ucs_status_string(status));
}

static ucs_status_t on_am(void *arg, const void *header, size_t header_length, void *data,
                          size_t length, const ucp_am_recv_param_t *param)
{
    (void)header;
    (void)header_length;
    mf__ucx_t *u = arg;
    if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
        /* The daemon only sends eager; anything else is not a frame of ours. */
        ucx.ucp_am_data_release(u->worker, data);
        fail(u, "rendezvous message refused");
        return UCS_OK;
    }
    if (u->failed)
        return UCS_OK;
    mf_frame_t f;
    size_t used;
    const char *why = NULL;
    if (mf_frame_parse(data, length, u->max_frame, &f, &used, &why) != MF_OK ||
        used != length) {
        fail(u, why ? why : "message is not exactly one frame");
        return UCS_OK;
    }
    /* Bounded: replies the owner does not pick up mean something is badly wrong. */
    if (u->in_len + length > 4 * (size_t)u->max_frame) {
        fail(u, "daemon sends faster than replies are read");
        return UCS_OK;
    }
    if (u->in_len + length > u->in_cap) {
        size_t cap = u->in_cap ? u->in_cap : 4096;
        while (cap < u->in_len + length)
            cap *= 2;
        uint8_t *p = realloc(u->in, cap);
        if (!p) {
            fail(u, "out of memory for a received frame");
            return UCS_OK;
        }
        u->in = p;
        u->in_cap = cap;
    }
    memcpy(u->in + u->in_len, data, length);
    u->in_len += length;
    return UCS_OK;
}

static void on_sent(void *req, ucs_status_t st, void *user)
{
    send_op_t *op = user;
    op->u->sending--;
    if (st != UCS_OK && st != UCS_ERR_CANCELED)
        fail(op->u, ucx.ucs_status_string(st));
    free(op);
    ucx.ucp_request_free(req);
}

mf_status_t mf__ucx_send(mf__ucx_t *u, const void *frame, size_t len)
{
    if (u->failed || !u->ep)
        return MF_UNAVAILABLE;
    send_op_t *op = malloc(sizeof(*op) + len);
    if (!op)
        return MF_RESOURCE_EXHAUSTED;
    op->u = u;
    memcpy(op->data, frame, len);
    ucp_request_param_t p = {0};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                     UCP_OP_ATTR_FIELD_FLAGS;
    p.cb.send = on_sent;
    p.user_data = op;
    /* Eager: in order. REPLY: the daemon answers the endpoint a message came from. */
    p.flags = UCP_AM_SEND_FLAG_EAGER | UCP_AM_SEND_FLAG_REPLY;
    void *r = ucx.ucp_am_send_nbx(u->ep, MF_UCX_AM_FRAME, NULL, 0, op->data, len, &p);
    if (r == NULL) { /* done at once: no callback */
        free(op);
        return MF_OK;
    }
    if (UCS_PTR_IS_ERR(r)) {
        free(op);
        fail(u, ucx.ucs_status_string(UCS_PTR_STATUS(r)));
        return MF_UNAVAILABLE;
    }
    u->sending++;
    return MF_OK;
}

ssize_t mf__ucx_recv(mf__ucx_t *u, mf_frame_reader_t *rd)
{
    progress(u);
    if (u->in_len == 0) {
        if (u->failed)
            return 0;
        errno = EAGAIN;
        return -1;
    }
    if (mf_frame_reader_feed(rd, u->in, u->in_len) != MF_OK) {
        errno = ENOMEM;
        return -1;
    }
    ssize_t n = (ssize_t)u->in_len;
    u->in_len = 0;
    return n;
}

int mf__ucx_efd(const mf__ucx_t *u)
{
    return u->efd;
}

int mf__ucx_arm(mf__ucx_t *u)
{
    progress(u);
    if (u->in_len || u->failed)
        return 0;
    ucs_status_t st = ucx.ucp_worker_arm(u->worker);
    return st == UCS_OK;
}

/* Sleeps on the event fd for at most ms (the caller checks what happened). */
static void sleep_efd(mf__ucx_t *u, int ms)
{
    if (!mf__ucx_arm(u))
        return;
    struct pollfd p = {.fd = u->efd, .events = POLLIN};
    if (ms > WAKE_MS || ms < 0)
        ms = WAKE_MS;
    (void)poll(&p, 1, ms);
}

static int ms_left(int64_t deadline)
{
    if (deadline == INT64_MAX)
        return WAKE_MS;
    int64_t l = deadline - mf_now_ms();
    return l <= 0 ? 0 : l > WAKE_MS ? WAKE_MS : (int)l;
}

mf_status_t mf__ucx_wait(mf__ucx_t *u, int64_t deadline)
{
    progress(u);
    if (u->in_len || u->failed)
        return MF_OK;
    int ms = ms_left(deadline);
    if (ms == 0)
        return MF_DEADLINE_EXCEEDED;
    sleep_efd(u, ms);
    return MF_OK;
}

const char *mf__ucx_error(const mf__ucx_t *u)
{
    return u->failed ? u->why : "";
}

/* ==== RMA =============================================================================== */

mf_status_t mf__ucx_set_remote(mf__ucx_t *u, uint64_t address, uint64_t bytes,
                               const void *rkey, size_t rkey_len)
{
    if (u->failed || !u->ep)
        return MF_UNAVAILABLE;
    if (!rkey || !rkey_len || !bytes || address + bytes < address)
        return MF_INVALID_ARGUMENT;
    if (u->rkey)
        ucx.ucp_rkey_destroy(u->rkey);
    u->rkey = NULL;
    if (ucx.ucp_ep_rkey_unpack(u->ep, rkey, &u->rkey) != UCS_OK) {
        u->rkey = NULL;
        return MF_INVALID_ARGUMENT;
    }
    u->rbase = address;
    u->rbytes = bytes;
    return MF_OK;
}

uint64_t mf__ucx_remote_bytes(const mf__ucx_t *u)
{
    return u->rkey ? u->rbytes : 0;
}

static void on_rma(void *req, ucs_status_t st, void *user)
{
    batch_t *b = user;
    if (st != UCS_OK && b->status == UCS_OK)
        b->status = st;
    if (req)
        ucx.ucp_request_free(req);
    if (--b->pending == 0 && b->abandoned)
        free(b);
}

/* Accounts for one posted request r (NULL: completed at once). */
static void batch_post(mf__ucx_t *u, batch_t *b, void *r)
{
    if (r == NULL)
        return;
    if (UCS_PTR_IS_ERR(r)) {
        if (b->status == UCS_OK)
            b->status = UCS_PTR_STATUS(r);
        fail(u, ucx.ucs_status_string(UCS_PTR_STATUS(r)));
        return;
    }
    b->pending++;
}

static void force_close(mf__ucx_t *u)
{
    if (!u->ep)
        return;
    ucp_request_param_t p = {0};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_EP_CLOSE_FLAG_FORCE;
    void *r = ucx.ucp_ep_close_nbx(u->ep, &p);
    u->ep = NULL;
    if (UCS_PTR_IS_PTR(r)) {
        for (int64_t until = mf_now_ms() + CLOSE_MS;
             ucx.ucp_request_check_status(r) == UCS_INPROGRESS && mf_now_ms() < until;)
            progress(u);
        ucx.ucp_request_free(r);
    }
}

/* Waits for the batch; on a deadline or a failed endpoint the endpoint is closed by
 * force (the requests then complete as cancelled) and the connection counts as failed. */
static mf_status_t batch_wait(mf__ucx_t *u, batch_t *b, int64_t deadline, const char *what,
                              char *err, size_t errlen)
{
    mf_status_t st = MF_OK;
    while (b->pending > 0) {
        progress(u);
        if (b->pending == 0)
            break;
        if (u->failed) {
            st = MF_UNAVAILABLE;
            break;
        }
        int ms = ms_left(deadline);
        if (ms == 0) {
            st = MF_DEADLINE_EXCEEDED;
            fail(u, "one-sided transfer outlived its deadline");
            break;
        }
        sleep_efd(u, ms);
    }
    if (b->pending > 0) {
        force_close(u);
        for (int64_t until = mf_now_ms() + CLOSE_MS; b->pending > 0 && mf_now_ms() < until;)
            progress(u);
    }
    if (st == MF_OK && (b->status != UCS_OK || u->failed))
        st = MF_UNAVAILABLE;
    if (st == MF_DEADLINE_EXCEEDED)
        snprintf(err, errlen, "%s: deadline exceeded", what);
    else if (st != MF_OK)
        snprintf(err, errlen, "%s: %s", what, u->failed ? u->why
                                                      : ucx.ucs_status_string(b->status));
    if (b->pending > 0)
        b->abandoned = 1; /* the last completion frees it */
    else
        free(b);
    return st;
}

static mf_status_t rma(mf__ucx_t *u, int put, const mf__ucx_rma_t *v, size_t n,
                       int64_t deadline, char *err, size_t errlen)
{
    const char *what = put ? "one-sided put" : "one-sided get";
    if (u->failed || !u->ep) {
        snprintf(err, errlen, "%s: %s", what, u->failed ? u->why : "not connected");
        return MF_UNAVAILABLE;
    }
    if (!u->rkey) {
        snprintf(err, errlen, "%s: no remote arena", what);
        return MF_FAILED_PRECONDITION;
    }
    for (size_t i = 0; i < n; i++)
        if (v[i].off > u->rbytes || v[i].len > u->rbytes - v[i].off) {
            snprintf(err, errlen, "%s: bytes [%llu, +%zu) outside the daemon's arena of %llu",
                     what, (unsigned long long)v[i].off, v[i].len,
                     (unsigned long long)u->rbytes);
            return MF_OUT_OF_RANGE;
        }
    batch_t *b = calloc(1, sizeof(*b));
    if (!b) {
        snprintf(err, errlen, "%s: out of memory", what);
        return MF_RESOURCE_EXHAUSTED;
    }
    ucp_request_param_t p = {0};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    p.cb.send = on_rma;
    p.user_data = b;
    for (size_t i = 0; i < n && !u->failed; i++) {
        uint64_t raddr = u->rbase + v[i].off;
        if (!v[i].len)
            continue;
        batch_post(u, b, put ? ucx.ucp_put_nbx(u->ep, v[i].local, v[i].len, raddr, u->rkey, &p)
                             : ucx.ucp_get_nbx(u->ep, v[i].local, v[i].len, raddr, u->rkey, &p));
    }
    /* A put is only in the remote memory once the endpoint is flushed. */
    if (put && !u->failed)
        batch_post(u, b, ucx.ucp_ep_flush_nbx(u->ep, &p));
    return batch_wait(u, b, deadline, what, err, errlen);
}

mf_status_t mf__ucx_get(mf__ucx_t *u, const mf__ucx_rma_t *v, size_t n, int64_t deadline,
                        char *err, size_t errlen)
{
    return rma(u, 0, v, n, deadline, err, errlen);
}

mf_status_t mf__ucx_put(mf__ucx_t *u, const mf__ucx_rma_t *v, size_t n, int64_t deadline,
                        char *err, size_t errlen)
{
    return rma(u, 1, v, n, deadline, err, errlen);
}

/* ==== connect / close =================================================================== */

mf_status_t mf__ucx_connect(const char *hostport, uint32_t max_frame, mf__ucx_t **out,
                            char *err, size_t errlen)
{
    *out = NULL;
    struct sockaddr_storage ss;
    socklen_t sl;
    mf_status_t ret = mf_addr_resolve(hostport, 0, &ss, &sl);
    if (ret != MF_OK) {
        snprintf(err, errlen, ret == MF_INVALID_ARGUMENT
                                  ? "ucx target must be ucx:HOST:PORT, got 'ucx:%s'"
                                  : "cannot resolve %s", hostport);
        return ret;
    }
    pthread_once(&ucx_once, ucx_load);
    if (ucx_load_err[0]) {
        snprintf(err, errlen, "%s", ucx_load_err);
        return MF_FAILED_PRECONDITION;
    }
    mf__ucx_t *u = calloc(1, sizeof(*u));
    if (!u) {
        snprintf(err, errlen, "out of memory");
        return MF_RESOURCE_EXHAUSTED;
    }
    u->max_frame = max_frame;
    u->efd = -1;
    /* The I/O thread drives the worker; the channel's other threads reach it only under
     * the channel's lock: serialized. */
    ret = mf_ucx_worker_open(&ucx_setup, "libmapflow", UCS_THREAD_MODE_SERIALIZED, on_am, u,
                             &u->ctx, &u->worker, &u->efd, err, errlen);
    if (ret != MF_OK) {
        free(u);
        return ret;
    }
    ucs_status_t st = mf_ucx_ep_open(&ucx_setup, u->worker, &ss, sl, on_ep_error, u, &u->ep);
    if (st != UCS_OK) {
        snprintf(err, errlen, "ucx: cannot connect to %s: %s", hostport,
                 ucx.ucs_status_string(st));
        mf_ucx_worker_close(&ucx_setup, u->ctx, u->worker);
        free(u);
        return MF_UNAVAILABLE;
    }
    *out = u;
    return MF_OK;
}

void mf__ucx_close(mf__ucx_t *u)
{
    if (!u)
        return;
    /* Frames already handed over (a Release, a PutAbort) leave before the close. */
    for (int64_t until = mf_now_ms() + CLOSE_MS; u->sending && !u->failed && mf_now_ms() < until;)
        sleep_efd(u, 10);
    if (u->rkey)
        ucx.ucp_rkey_destroy(u->rkey);
    u->rkey = NULL;
    force_close(u);
    progress(u);
    mf_ucx_worker_close(&ucx_setup, u->ctx, u->worker);
    free(u->in);
    free(u);
}
