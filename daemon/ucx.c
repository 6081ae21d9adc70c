/* ucx — UCX context, worker on the loop, listener, endpoints, arena RMA (see ucx.h). */
#include "ucx.h"
#include "log.h"
#include "mf_addr.h"
#include "mf_frame.h"
#include "mf_ucx_setup.h"

#include <arpa/inet.h>
#include <errno.h>
#include <event2/buffer.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#define READ_CHUNK (64u << 10)
/* Frames queued towards one peer before its bridge stops reading the server end. */
#define SEND_HIGH ((size_t)32 << 20)
/* A safety net beside the event fd: some UCX work (keepalive, pending queues) is only
 * advanced by progress. Slow enough to be no busy poll. */
#define SWEEP_MS 200

typedef enum { EP_CLIENT, EP_BRIDGE } ep_kind_t;

struct mfd_ucx_ep {
    mfd_ucx_t *u;
    ep_kind_t kind;
    ucp_ep_h ep;                 /* NULL once closed */
    void *close_req;             /* ucp_ep_close_nbx still running */
    ucp_rkey_h rkey;
    uint64_t rbase, rbytes;
    unsigned ops;                /* operations in flight (each holds the memory) */
    int failed, closing, closed, user_closed, force;
    size_t sending;              /* frame bytes handed to UCX, not yet sent */
    char name[96];
    mfd_ucx_ep_cbs_t cbs;        /* EP_CLIENT */
    int fd;                      /* EP_BRIDGE: our end of the socketpair */
    struct event *rev, *wev;
    struct evbuffer *in;         /* frames from the peer towards the server end */
    mf_frame_reader_t rd;        /* frames from the server end towards the peer */
    int rd_init, read_paused, eof;
    struct mfd_ucx_ep *prev, *next;
};

struct mfd_ucx {
    struct event_base *base;
    ucp_context_h ctx;
    ucp_worker_h worker;
    struct event *efd_ev, *kick_ev, *reap_ev, *sweep_ev;
    ucp_listener_h listener;
    char bound[128];
    ucp_mem_h memh;
    void *rkey_buf;
    size_t rkey_len;
    uint8_t *arena;
    uint64_t arena_bytes;
    uint32_t max_frame;
    mfd_ucx_adopt_cb adopt;
    void *adopt_arg;
    mfd_ucx_ep_t *eps;           /* every endpoint not yet freed */
    size_t n_eps;
    int in_progress, destroying;
};

typedef struct rma_op {
    mfd_ucx_ep_t *e;
    mfd_ucx_done_cb cb;
    void *arg;
} rma_op_t;

typedef struct send_op {
    mfd_ucx_ep_t *e;
    size_t len;
    uint8_t data[];
} send_op_t;

static void ep_fail(mfd_ucx_ep_t *e, mf_status_t st, const char *why);
static void bridge_pump(mfd_ucx_ep_t *e);

/* The shared setup's UCX functions: mapflowd links UCX, so they are UCX's own. */
static const mf_ucx_api_t ucx_api = {
#define X(f) f,
    MF_UCX_SETUP_FUNCS(X)
#undef X
};

static mf_status_t from_ucs(ucs_status_t st)
{
    return st == UCS_OK ? MF_OK : st == UCS_ERR_CANCELED ? MF_CANCELLED : MF_UNAVAILABLE;
}

/* ==== progress ========================================================================= */

/* Progress until the worker can be armed: only then may the loop sleep on the efd. */
static void progress(mfd_ucx_t *u)
{
    if (u->in_progress)
        return;
    u->in_progress = 1;
    for (;;) {
        while (ucp_worker_progress(u->worker))
            ;
        ucs_status_t st = ucp_worker_arm(u->worker);
        if (st == UCS_ERR_BUSY)
            continue;
        if (st != UCS_OK)
            mfd_warn("ucx: worker arm: %s", ucs_status_string(st));
        break;
    }
    u->in_progress = 0;
}

static void kick(mfd_ucx_t *u)
{
    event_active(u->kick_ev, EV_READ, 0);
}

static void on_progress_ev(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    progress(arg);
}

/* ==== endpoint lifetime ================================================================ */

static mfd_ucx_ep_t *ep_new(mfd_ucx_t *u, ep_kind_t kind)
{
    mfd_ucx_ep_t *e = calloc(1, sizeof(*e));
    if (!e)
        return NULL;
    e->u = u;
    e->kind = kind;
    e->fd = -1;
    e->next = u->eps;
    if (u->eps)
        u->eps->prev = e;
    u->eps = e;
    u->n_eps++;
    return e;
}

static void ep_free(mfd_ucx_ep_t *e)
{
    mfd_ucx_t *u = e->u;
    if (e->prev)
        e->prev->next = e->next;
    else
        u->eps = e->next;
    if (e->next)
        e->next->prev = e->prev;
    u->n_eps--;
    if (e->rd_init)
        mf_frame_reader_deinit(&e->rd);
    free(e);
}

static void bridge_close_fd(mfd_ucx_ep_t *e)
{
    if (e->rev)
        event_free(e->rev);
    if (e->wev)
        event_free(e->wev);
    e->rev = e->wev = NULL;
    if (e->in)
        evbuffer_free(e->in);
    e->in = NULL;
    if (e->fd >= 0)
        close(e->fd); /* the server sees EOF and closes its connection */
    e->fd = -1;
}

/* Marks e for closing; the reap event does the UCX part outside of any UCX callback. */
static void ep_close_later(mfd_ucx_ep_t *e, int force)
{
    e->force |= force;
    if (e->closing)
        return;
    e->closing = 1;
    event_active(e->u->reap_ev, EV_READ, 0);
}

static void do_close(mfd_ucx_ep_t *e)
{
    if (e->kind == EP_BRIDGE)
        bridge_close_fd(e);
    if (e->rkey) {
        ucp_rkey_destroy(e->rkey);
        e->rkey = NULL;
    }
    if (e->ep) {
        ucp_request_param_t p = {0};
        /* A failed peer cannot confirm anything: force. A live one gets its last frames
         * (an ErrorReply before a close, say) flushed first. */
        p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
        p.flags = (e->force || e->failed) ? UCP_EP_CLOSE_FLAG_FORCE : 0;
        void *r = ucp_ep_close_nbx(e->ep, &p);
        e->ep = NULL;
        if (UCS_PTR_IS_PTR(r))
            e->close_req = r;
    }
    e->closed = 1;
}

/* Closes endpoints marked closing; frees those whose operations and close are done. */
static void reap(mfd_ucx_t *u)
{
    mfd_ucx_ep_t *e = u->eps, *next;
    for (; e; e = next) {
        next = e->next;
        if (!e->closing)
            continue;
        /* Frames handed to UCX go first unless forced; then close. */
        if (!e->closed && (e->force || e->failed || e->sending == 0))
            do_close(e);
        if (e->close_req && ucp_request_check_status(e->close_req) != UCS_INPROGRESS) {
            ucp_request_free(e->close_req);
            e->close_req = NULL;
        }
        if (e->closed && !e->close_req && e->ops == 0 && e->user_closed)
            ep_free(e);
    }
}

static void on_reap(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    mfd_ucx_t *u = arg;
    reap(u);
    progress(u);
    /* Progress may have completed close requests or last operations. */
    for (mfd_ucx_ep_t *e = u->eps; e; e = e->next)
        if (e->closing) {
            reap(u);
            break;
        }
}

static void on_sweep(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    mfd_ucx_t *u = arg;
    progress(u);
    for (mfd_ucx_ep_t *e = u->eps; e; e = e->next)
        if (e->closing) {
            reap(u);
            break;
        }
}

static void ep_fail(mfd_ucx_ep_t *e, mf_status_t st, const char *why)
{
    if (e->failed)
        return;
    e->failed = 1;
    mfd_debug("ucx: endpoint %s failed: %s (%s)", e->name, why, mf_status_name(st));
    if (e->kind == EP_CLIENT) {
        if (!e->user_closed && e->cbs.on_error)
            e->cbs.on_error(e->cbs.arg, st, why);
    } else {
        e->user_closed = 1; /* a bridge has no user: it goes when its work is done */
    }
    ep_close_later(e, 1);
}

static void on_ep_error(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    (void)ep;
    mfd_ucx_ep_t *e = arg;
    ep_fail(e, MF_UNAVAILABLE, ucs_status_string(status));
}

static mfd_ucx_ep_t *ep_find(mfd_ucx_t *u, ucp_ep_h ep)
{
    for (mfd_ucx_ep_t *e = u->eps; e; e = e->next)
        if (e->ep == ep && !e->closed)
            return e;
    return NULL;
}

/* ==== frames =========================================================================== */

static void on_sent(void *req, ucs_status_t st, void *user)
{
    send_op_t *op = user;
    mfd_ucx_ep_t *e = op->e;
    ucp_request_free(req);
    e->sending -= op->len;
    e->ops--;
    free(op);
    if (st != UCS_OK && st != UCS_ERR_CANCELED)
        ep_fail(e, MF_UNAVAILABLE, ucs_status_string(st));
    if (e->kind == EP_BRIDGE && !e->failed) {
        if (e->eof && e->sending == 0)
            ep_close_later(e, 0);
        else if (e->read_paused && e->sending < SEND_HIGH / 2 && e->rev) {
            e->read_paused = 0;
            event_add(e->rev, NULL);
        }
    }
    if (e->closing)
        event_active(e->u->reap_ev, EV_READ, 0);
}

static mf_status_t send_frame(mfd_ucx_ep_t *e, const void *frame, size_t len)
{
    if (e->failed || e->closing || !e->ep)
        return MF_UNAVAILABLE;
    send_op_t *op = malloc(sizeof(*op) + len);
    if (!op)
        return MF_RESOURCE_EXHAUSTED;
    op->e = e;
    op->len = len;
    memcpy(op->data, frame, len);
    ucp_request_param_t p = {0};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                     UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
    p.cb.send = on_sent;
    p.user_data = op;
    /* Eager keeps one endpoint's frames in order; REPLY names the sender to the receiver. */
    p.flags = UCP_AM_SEND_FLAG_EAGER | UCP_AM_SEND_FLAG_REPLY;
    void *r = ucp_am_send_nbx(e->ep, MF_UCX_AM_FRAME, NULL, 0, op->data, len, &p);
    if (UCS_PTR_IS_ERR(r)) {
        free(op);
        return MF_UNAVAILABLE;
    }
    e->sending += len;
    e->ops++;
    kick(e->u);
    return MF_OK;
}

mf_status_t mfd_ucx_send(mfd_ucx_ep_t *ep, const void *frame, size_t len)
{
    return send_frame(ep, frame, len);
}

static ucs_status_t on_am(void *arg, const void *header, size_t header_length, void *data,
                          size_t length, const ucp_am_recv_param_t *param)
{
    (void)header;
    (void)header_length;
    mfd_ucx_t *u = arg;
    if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
        /* We only ever send eager; a rendezvous frame is not ours to take. */
        ucp_am_data_release(u->worker, data);
        mfd_ucx_ep_t *e = (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP)
                              ? ep_find(u, param->reply_ep) : NULL;
        if (e)
            ep_fail(e, MF_INVALID_ARGUMENT, "rendezvous frame refused");
        return UCS_OK;
    }
    if (!(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP))
        return UCS_OK; /* anonymous: nobody to answer */
    mfd_ucx_ep_t *e = ep_find(u, param->reply_ep);
    if (!e || e->failed || e->closing)
        return UCS_OK;
    mf_frame_t f;
    size_t used;
    const char *why = NULL;
    if (mf_frame_parse(data, length, u->max_frame, &f, &used, &why) != MF_OK || used != length) {
        ep_fail(e, MF_INVALID_ARGUMENT, why ? why : "message is not exactly one frame");
        return UCS_OK;
    }
    if (e->kind == EP_CLIENT) {
        if (!e->user_closed && e->cbs.on_frame)
            e->cbs.on_frame(e->cbs.arg, data, length);
        return UCS_OK;
    }
    /* Bridge: towards the server end. Its reader pauses us only by not reading; a peer
     * that keeps sending while the server holds back is cut off. */
    if (evbuffer_get_length(e->in) > 4 * (size_t)u->max_frame) {
        ep_fail(e, MF_RESOURCE_EXHAUSTED, "peer sends faster than it reads replies");
        return UCS_OK;
    }
    evbuffer_add(e->in, data, length);
    bridge_pump(e);
    return UCS_OK;
}

/* ==== bridge (listener side) =========================================================== */

/* Writes queued peer frames into the server end. */
static void bridge_pump(mfd_ucx_ep_t *e)
{
    while (e->fd >= 0 && evbuffer_get_length(e->in) > 0) {
        int n = evbuffer_write(e->in, e->fd);
        if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
                break;
            ep_fail(e, MF_UNAVAILABLE, "server end closed");
            return;
        }
        if (n == 0)
            break;
    }
    if (e->wev) {
        if (evbuffer_get_length(e->in) > 0)
            event_add(e->wev, NULL);
        else
            event_del(e->wev);
    }
}

static void on_bridge_writable(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    bridge_pump(arg);
}

/* Frames the server wrote → one active message each. */
static void on_bridge_readable(evutil_socket_t fd, short what, void *arg)
{
    (void)what;
    mfd_ucx_ep_t *e = arg;
    uint8_t *p;
    size_t avail;
    if (mf_frame_reader_space(&e->rd, READ_CHUNK, &p, &avail) != MF_OK) {
        ep_fail(e, MF_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    ssize_t n = read(fd, p, avail);
    if (n < 0 && (errno == EAGAIN || errno == EINTR))
        return;
    if (n <= 0) {
        /* The server closed the connection (after its last reply, e.g. a refused Hello):
         * close the endpoint once those frames have left. */
        event_del(e->rev);
        e->eof = 1;
        if (e->sending == 0)
            ep_close_later(e, 0);
        return;
    }
    mf_frame_reader_commit(&e->rd, (size_t)n);
    for (;;) {
        mf_frame_t f;
        int have;
        const char *why = NULL;
        if (mf_frame_reader_next(&e->rd, &f, &have, &why) != MF_OK) {
            ep_fail(e, MF_INTERNAL, why ? why : "bad frame from the server");
            return;
        }
        if (!have)
            break;
        const uint8_t *start = f.msg - MF_FRAME_HEADER;
        size_t len = MF_FRAME_HEADER + f.msg_len + f.payload_len;
        if (send_frame(e, start, len) != MF_OK) {
            ep_fail(e, MF_UNAVAILABLE, "cannot send to the peer");
            return;
        }
    }
    if (e->sending > SEND_HIGH && !e->read_paused) {
        event_del(e->rev);
        e->read_paused = 1;
    }
}

static void format_sockaddr(const struct sockaddr_storage *ss, char *out, size_t n)
{
    char ip[INET6_ADDRSTRLEN] = "?";
    unsigned port = 0;
    if (ss->ss_family == AF_INET) {
        inet_ntop(AF_INET, &((const struct sockaddr_in *)ss)->sin_addr, ip, sizeof(ip));
        port = ntohs(((const struct sockaddr_in *)ss)->sin_port);
    } else if (ss->ss_family == AF_INET6) {
        inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)ss)->sin6_addr, ip, sizeof(ip));
        port = ntohs(((const struct sockaddr_in6 *)ss)->sin6_port);
    }
    snprintf(out, n, ss->ss_family == AF_INET6 ? "[%s]:%u" : "%s:%u", ip, port);
}

static void on_conn_request(ucp_conn_request_h req, void *arg)
{
    mfd_ucx_t *u = arg;
    char who[80] = "?";
    ucp_conn_request_attr_t ra = {.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR};
    if (ucp_conn_request_query(req, &ra) == UCS_OK)
        format_sockaddr(&ra.client_address, who, sizeof(who));
    int sv[2] = {-1, -1};
    mfd_ucx_ep_t *e = u->destroying ? NULL : ep_new(u, EP_BRIDGE);
    if (!e) {
        ucp_listener_reject(u->listener, req);
        return;
    }
    snprintf(e->name, sizeof(e->name), "ucx:%s", who);
    e->user_closed = 1; /* freed by the module once closed */
    ucp_ep_params_t ep = {0};
    ep.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                    UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.conn_request = req;
    ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ep.err_handler.cb = on_ep_error;
    ep.err_handler.arg = e;
    ucs_status_t st = ucp_ep_create(u->worker, &ep, &e->ep);
    if (st != UCS_OK) {
        mfd_warn("ucx: cannot accept %s: %s", who, ucs_status_string(st));
        e->ep = NULL;
        e->closed = 1;
        ep_free(e);
        return;
    }
    e->in = evbuffer_new();
    if (!e->in || mf_frame_reader_init(&e->rd, u->max_frame) != MF_OK ||
        socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) != 0) {
        ep_fail(e, MF_RESOURCE_EXHAUSTED, "cannot bridge the endpoint");
        return;
    }
    e->rd_init = 1;
    e->fd = sv[0];
    e->rev = event_new(u->base, e->fd, EV_READ | EV_PERSIST, on_bridge_readable, e);
    e->wev = event_new(u->base, e->fd, EV_WRITE | EV_PERSIST, on_bridge_writable, e);
    if (!e->rev || !e->wev) {
        close(sv[1]);
        ep_fail(e, MF_RESOURCE_EXHAUSTED, "cannot bridge the endpoint");
        return;
    }
    if (u->adopt(u->adopt_arg, sv[1], e->name) != MF_OK) {
        ep_fail(e, MF_UNAVAILABLE, "refused by the server");
        return;
    }
    event_add(e->rev, NULL);
    mfd_debug("ucx: accepted %s", e->name);
}

/* ==== addresses ======================================================================== */


/* ==== context ========================================================================== */

static mf_status_t start_listener(mfd_ucx_t *u, const char *spec, char *err, size_t errlen)
{
    struct sockaddr_storage ss;
    socklen_t sl;
    if (mf_addr_resolve(spec, 1, &ss, &sl) != MF_OK) {
        snprintf(err, errlen, "ucx: cannot parse '%s' as host:port", spec);
        return MF_INVALID_ARGUMENT;
    }
    ucp_listener_params_t lp = {0};
    lp.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
    lp.sockaddr.addr = (const struct sockaddr *)&ss;
    lp.sockaddr.addrlen = sl;
    lp.conn_handler.cb = on_conn_request;
    lp.conn_handler.arg = u;
    ucs_status_t st = ucp_listener_create(u->worker, &lp, &u->listener);
    if (st != UCS_OK) {
        u->listener = NULL;
        snprintf(err, errlen, "ucx: cannot listen on %s: %s", spec, ucs_status_string(st));
        return MF_UNAVAILABLE;
    }
    ucp_listener_attr_t la = {.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR};
    if (ucp_listener_query(u->listener, &la) == UCS_OK)
        format_sockaddr(&la.sockaddr, u->bound, sizeof(u->bound));
    else
        snprintf(u->bound, sizeof(u->bound), "%s", spec);
    return MF_OK;
}

mf_status_t mfd_ucx_create(const mfd_ucx_params_t *p, mfd_ucx_t **out, char *err,
                           size_t errlen)
{
    mfd_ucx_t *u = calloc(1, sizeof(*u));
    if (!u || !p->base) {
        free(u);
        snprintf(err, errlen, "ucx: %s", p->base ? "out of memory" : "no event loop");
        return p->base ? MF_RESOURCE_EXHAUSTED : MF_INVALID_ARGUMENT;
    }
    u->base = p->base;
    u->max_frame = (p->field_mask & MFD_UCX_P_MAX_FRAME) && p->max_frame ? p->max_frame
                                                                         : MF_FRAME_DEFAULT_MAX;
    /* A restarted daemon must rebind its port at once (UCX defaults this to n); an
     * operator's own UCX_TCP_CM_REUSEADDR still wins. */
    setenv("UCX_TCP_CM_REUSEADDR", "y", 0);
    int efd;
    mf_status_t ret = mf_ucx_worker_open(&ucx_api, "mapflowd", UCS_THREAD_MODE_SINGLE, on_am,
                                         u, &u->ctx, &u->worker, &efd, err, errlen);
    if (ret != MF_OK)
        goto fail;
    ret = MF_UNAVAILABLE;
    ucs_status_t st;
    u->efd_ev = event_new(u->base, efd, EV_READ | EV_PERSIST, on_progress_ev, u);
    u->kick_ev = event_new(u->base, -1, 0, on_progress_ev, u);
    u->reap_ev = event_new(u->base, -1, 0, on_reap, u);
    u->sweep_ev = event_new(u->base, -1, EV_PERSIST, on_sweep, u);
    struct timeval tv = {0, SWEEP_MS * 1000};
    if (!u->efd_ev || !u->kick_ev || !u->reap_ev || !u->sweep_ev ||
        event_add(u->efd_ev, NULL) || event_add(u->sweep_ev, &tv)) {
        snprintf(err, errlen, "ucx: cannot register the worker on the loop");
        ret = MF_INTERNAL;
        goto fail;
    }
    if ((p->field_mask & MFD_UCX_P_ARENA) && p->arena && p->arena_bytes) {
        ucp_mem_map_params_t mp = {0};
        mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
        mp.address = p->arena;
        mp.length = p->arena_bytes;
        if ((st = ucp_mem_map(u->ctx, &mp, &u->memh)) != UCS_OK) {
            u->memh = NULL;
            snprintf(err, errlen, "ucx: registering the arena: %s", ucs_status_string(st));
            goto fail;
        }
        if ((st = ucp_rkey_pack(u->ctx, u->memh, &u->rkey_buf, &u->rkey_len)) != UCS_OK) {
            u->rkey_buf = NULL;
            snprintf(err, errlen, "ucx: packing the arena rkey: %s", ucs_status_string(st));
            goto fail;
        }
        u->arena = p->arena;
        u->arena_bytes = p->arena_bytes;
    }
    if (p->field_mask & MFD_UCX_P_LISTEN) {
        if (!p->adopt || !p->listen) {
            snprintf(err, errlen, "ucx: a listener needs an address and an adopt callback");
            ret = MF_INVALID_ARGUMENT;
            goto fail;
        }
        u->adopt = p->adopt;
        u->adopt_arg = p->adopt_arg;
        if ((ret = start_listener(u, p->listen, err, errlen)) != MF_OK)
            goto fail;
    }
    progress(u);
    *out = u;
    return MF_OK;
fail:
    mfd_ucx_destroy(u);
    return ret;
}

void mfd_ucx_stop_listening(mfd_ucx_t *u)
{
    if (u && u->listener) {
        ucp_listener_destroy(u->listener);
        u->listener = NULL;
    }
}

void mfd_ucx_destroy(mfd_ucx_t *u)
{
    if (!u)
        return;
    u->destroying = 1;
    mfd_ucx_stop_listening(u);
    if (u->worker) {
        for (mfd_ucx_ep_t *e = u->eps; e; e = e->next) {
            ep_fail(e, MF_CANCELLED, "shutting down");
            e->user_closed = 1;
            e->force = 1;
        }
        /* Force-closing completes every operation; close requests need a little progress. */
        for (int i = 0; i < 2000 && u->eps; i++) {
            reap(u);
            while (ucp_worker_progress(u->worker))
                ;
            if (u->eps && i > 0)
                usleep(1000);
        }
        if (u->eps)
            mfd_warn("ucx: %zu endpoints did not close in time", u->n_eps);
    }
    if (u->rkey_buf)
        ucp_rkey_buffer_release(u->rkey_buf);
    if (u->memh)
        ucp_mem_unmap(u->ctx, u->memh);
    if (u->efd_ev)
        event_free(u->efd_ev);
    if (u->kick_ev)
        event_free(u->kick_ev);
    if (u->reap_ev)
        event_free(u->reap_ev);
    if (u->sweep_ev)
        event_free(u->sweep_ev);
    if (!u->eps)
        mf_ucx_worker_close(&ucx_api, u->ctx, u->worker);
    free(u);
}

const char *mfd_ucx_bound(const mfd_ucx_t *u)
{
    return u && u->listener ? u->bound : "";
}

mf_status_t mfd_ucx_arena_key(const mfd_ucx_t *u, uint64_t *address, uint64_t *bytes,
                              const void **rkey, size_t *rkey_len)
{
    if (!u || !u->rkey_buf)
        return MF_FAILED_PRECONDITION;
    *address = (uint64_t)(uintptr_t)u->arena;
    *bytes = u->arena_bytes;
    *rkey = u->rkey_buf;
    *rkey_len = u->rkey_len;
    return MF_OK;
}

size_t mfd_ucx_endpoints(const mfd_ucx_t *u)
{
    size_t n = 0;
    for (const mfd_ucx_ep_t *e = u ? u->eps : NULL; e; e = e->next)
        n += !e->closing;
    return n;
}

/* ==== client endpoints ================================================================= */

mf_status_t mfd_ucx_connect(mfd_ucx_t *u, const char *addr, const mfd_ucx_ep_cbs_t *cbs,
                            mfd_ucx_ep_t **out, char *err, size_t errlen)
{
    struct sockaddr_storage ss;
    socklen_t sl;
    if (mf_addr_resolve(addr, 0, &ss, &sl) != MF_OK) {
        snprintf(err, errlen, "ucx: cannot parse '%s' as host:port", addr ? addr : "");
        return MF_INVALID_ARGUMENT;
    }
    mfd_ucx_ep_t *e = ep_new(u, EP_CLIENT);
    if (!e) {
        snprintf(err, errlen, "ucx: out of memory");
        return MF_RESOURCE_EXHAUSTED;
    }
    snprintf(e->name, sizeof(e->name), "ucx:%s", addr);
    e->cbs = *cbs;
    ucs_status_t st = mf_ucx_ep_open(&ucx_api, u->worker, &ss, sl, on_ep_error, e, &e->ep);
    if (st != UCS_OK) {
        e->closed = 1;
        ep_free(e);
        snprintf(err, errlen, "ucx: cannot connect to %s: %s", addr, ucs_status_string(st));
        return MF_UNAVAILABLE;
    }
    kick(u);
    *out = e;
    return MF_OK;
}

void mfd_ucx_close(mfd_ucx_ep_t *e)
{
    if (!e || e->user_closed)
        return;
    e->user_closed = 1;
    ep_close_later(e, 1);
}

mf_status_t mfd_ucx_set_remote(mfd_ucx_ep_t *e, uint64_t address, uint64_t bytes,
                               const void *rkey, size_t rkey_len)
{
    if (e->failed || e->closing || !e->ep)
        return MF_UNAVAILABLE;
    if (e->rkey) {
        ucp_rkey_destroy(e->rkey);
        e->rkey = NULL;
    }
    if (!rkey || !rkey_len || address + bytes < address)
        return MF_INVALID_ARGUMENT;
    ucs_status_t st = ucp_ep_rkey_unpack(e->ep, rkey, &e->rkey);
    if (st != UCS_OK) {
        e->rkey = NULL;
        return MF_INVALID_ARGUMENT;
    }
    e->rbase = address;
    e->rbytes = bytes;
    return MF_OK;
}

static void on_rma_done(void *req, ucs_status_t st, void *user)
{
    rma_op_t *op = user;
    mfd_ucx_ep_t *e = op->e;
    if (req)
        ucp_request_free(req);
    e->ops--;
    op->cb(op->arg, from_ucs(st));
    free(op);
    if (e->closing)
        event_active(e->u->reap_ev, EV_READ, 0);
}

static void on_flush_done(void *req, ucs_status_t st, void *user)
{
    on_rma_done(req, st, user);
}

static rma_op_t *rma_begin(mfd_ucx_ep_t *e, uint64_t off, size_t len, mfd_ucx_done_cb cb,
                           void *arg, mf_status_t *st)
{
    if (e->failed || e->closing || !e->ep) {
        *st = MF_UNAVAILABLE;
        return NULL;
    }
    if (!e->rkey) {
        *st = MF_FAILED_PRECONDITION;
        return NULL;
    }
    if (off > e->rbytes || len > e->rbytes - off) {
        *st = MF_OUT_OF_RANGE;
        return NULL;
    }
    rma_op_t *op = malloc(sizeof(*op));
    if (!op) {
        *st = MF_RESOURCE_EXHAUSTED;
        return NULL;
    }
    *op = (rma_op_t){e, cb, arg};
    return op;
}

static void rma_param(const mfd_ucx_ep_t *e, rma_op_t *op, const void *local, size_t len,
                      ucp_request_param_t *p)
{
    memset(p, 0, sizeof(*p));
    p->op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                      UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
    p->cb.send = on_rma_done;
    p->user_data = op;
    const uint8_t *a = e->u->arena, *l = local;
    /* Local buffers inside our registered arena go zero-copy with their handle. */
    if (e->u->memh && l >= a && l + len <= a + e->u->arena_bytes) {
        p->op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
        p->memh = e->u->memh;
    }
}

static mf_status_t rma_post(mfd_ucx_ep_t *e, rma_op_t *op, void *r)
{
    if (UCS_PTR_IS_ERR(r)) {
        free(op);
        return MF_UNAVAILABLE;
    }
    e->ops++;
    kick(e->u);
    return MF_OK;
}

mf_status_t mfd_ucx_get(mfd_ucx_ep_t *e, uint64_t off, void *dst, size_t len,
                        mfd_ucx_done_cb cb, void *arg)
{
    mf_status_t st;
    rma_op_t *op = rma_begin(e, off, len, cb, arg, &st);
    if (!op)
        return st;
    ucp_request_param_t p;
    rma_param(e, op, dst, len, &p);
    return rma_post(e, op, ucp_get_nbx(e->ep, dst, len, e->rbase + off, e->rkey, &p));
}

mf_status_t mfd_ucx_put(mfd_ucx_ep_t *e, uint64_t off, const void *src, size_t len,
                        mfd_ucx_done_cb cb, void *arg)
{
    mf_status_t st;
    rma_op_t *op = rma_begin(e, off, len, cb, arg, &st);
    if (!op)
        return st;
    ucp_request_param_t p;
    rma_param(e, op, src, len, &p);
    return rma_post(e, op, ucp_put_nbx(e->ep, src, len, e->rbase + off, e->rkey, &p));
}

mf_status_t mfd_ucx_flush(mfd_ucx_ep_t *e, mfd_ucx_done_cb cb, void *arg)
{
    mf_status_t st;
    rma_op_t *op = rma_begin(e, 0, 0, cb, arg, &st);
    if (!op)
        return st;
    ucp_request_param_t p;
    rma_param(e, op, NULL, 0, &p);
    p.cb.send = on_flush_done;
    return rma_post(e, op, ucp_ep_flush_nbx(e->ep, &p));
}
