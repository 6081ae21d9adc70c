/* server — listeners, connections, frames, dispatch, data-path requests (see server.h). */
#include "server.h"
#include "admin.h"
#include "http.h"
#include "log.h"
#include "mf_addr.h"
#include "notify.h"
#include "peer.h"

#include <errno.h>
#include <event2/thread.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netdb.h>

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "tokens travel as u32 LE and are used in place: little-endian hosts only"
#endif

#define READ_CHUNK (64u << 10)
#define TICK_MS 250

/* A lease group: pins on the rows one Get leased, owned by a connection. Row k's
 * lease id is (t.id << LEASE_ROW_BITS) | k, so every row keeps its own id (Release of
 * one id releases that row) while a Get costs one ticket, not one per row. */
#define LEASE_ROW_BITS 20    /* max_batch ≤ 2^20 rows */
typedef struct lease {
    mfd_ticket_t t;          /* first: tickets are cast back to leases */
    uint32_t n, live;        /* rows leased, rows not yet released */
    mfd_entry_t *e[];        /* NULL once released */
} lease_t;

static void lease_drop_row(mfd_server_t *s, lease_t *l, uint32_t k);

/* One namespace with a live connection: the bytes its uncommitted reservations hold
 * (reservation_share bounds them, so one tenant cannot reserve the whole arena). */
typedef struct mfd_ns_acct {
    struct mfd_ns_acct *next;
    unsigned refs;           /* connections bound to it */
    uint64_t reserved;
    size_t len;
    char ns[MFD_NS_MAX + 1];
} mfd_ns_acct_t;

static mfd_ns_acct_t *acct_get(mfd_server_t *s, const char *ns, size_t len)
{
    mfd_ns_acct_t *a;
    for (a = s->ns_accts; a; a = a->next)
        if (a->len == len && memcmp(a->ns, ns, len) == 0)
            break;
    if (!a && (a = calloc(1, sizeof(*a)))) {
        memcpy(a->ns, ns, len);
        a->len = len;
        a->next = s->ns_accts;
        s->ns_accts = a;
    }
    if (a)
        a->refs++;
    return a;
}

static void acct_put(mfd_server_t *s, mfd_ns_acct_t *a)
{
    if (!a || --a->refs)
        return;
    for (mfd_ns_acct_t **pp = &s->ns_accts; *pp; pp = &(*pp)->next) {
        if (*pp == a) {
            *pp = a->next;
            break;
        }
    }
    free(a);
}

/* A put reservation: an arena block (host, or GPU arena `arena`) waiting for PutCommit. */
typedef struct reservation {
    mfd_ticket_t t;
    mfd_key_t key;
    mfd_ns_acct_t *acct;     /* counted there until committed or released */
    uint64_t size;
    int durable;
    int gpu;                 /* blk is in GPU arena `arena` */
    int in_arena;            /* the client writes the row itself (no payload) */
    uint32_t arena;
    mfd_ablock_t *blk;
} reservation_t;

static void reservation_unaccount(reservation_t *r)
{
    if (r->acct)
        r->acct->reserved -= r->size;
    r->acct = NULL;
}

static void reservation_free(mfd_server_t *s, reservation_t *r)
{
    reservation_unaccount(r);
    if (r->gpu)
        mfd_store_unreserve_gpu(&s->store, r->arena, r->blk);
    else
        mfd_store_unreserve(&s->store, r->blk);
    free(r);
}

/* Arenas of this connection's GPU mask: only announced ones, only on the unix socket. */
static uint64_t gpu_mask(const mfd_conn_t *c, uint64_t asked)
{
    size_t n = c->gpu_arenas;
    return n ? asked & (n >= 64 ? ~0ull : (1ull << n) - 1) : 0;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ==== connections: output ============================================================ */

static void conn_free(mfd_conn_t *c)
{
    acct_put(c->srv, c->acct);
    mf_frame_reader_deinit(&c->rd);
    if (c->out)
        evbuffer_free(c->out);
    free(c);
}

static void release_ticket(mfd_ticket_t *t, void *arg)
{
    mfd_server_t *s = arg;
    mfd_tickets_remove(s->tickets, t);
    if (t->kind == MFD_TICKET_LEASE) {
        lease_t *l = (lease_t *)t;
        for (uint32_t k = 0; k < l->n; k++)
            if (l->e[k])
                lease_drop_row(s, l, k);
        free(l);
    } else {
        reservation_free(s, (reservation_t *)t);
    }
}

static void set_listening(mfd_server_t *s, int on)
{
    struct evconnlistener *ls[3] = {s->unix_l, s->admin_l, s->tcp_l};
    for (int i = 0; i < 3; i++)
        if (ls[i])
            (on ? evconnlistener_enable : evconnlistener_disable)(ls[i]);
}

/* Listeners off at the descriptor limit go back on once one is free (or a tick later). */
static void accept_resume(mfd_server_t *s)
{
    if (!s->accept_paused || s->draining)
        return;
    s->accept_paused = 0;
    set_listening(s, 1);
}

/* Accept trouble is logged once, then at most every 10 s with the count in between (an
 * accept loop at the fd limit once wrote 18.8 M lines). */
static void accept_warn(mfd_server_t *s, const char *what)
{
    uint64_t now = mfd_now_ms();
    if (s->accept_log_ms && now - s->accept_log_ms < 10000) {
        s->accept_log_suppressed++;
        return;
    }
    mfd_warn("%s (%llu more such events not logged)", what,
             (unsigned long long)s->accept_log_suppressed);
    s->accept_log_ms = now;
    s->accept_log_suppressed = 0;
}

static void conn_close(mfd_conn_t *c)
{
    if (c->dead)
        return;
    mfd_server_t *s = c->srv;
    c->dead = 1;
    event_free(c->rev);
    event_free(c->wev);
    c->rev = c->wev = NULL;
    close(c->fd);
    c->fd = -1;
    /* A dead client never pins memory: its leases and reservations go now. */
    size_t n = mfd_tickets_of_owner(s->tickets, c, release_ticket, s);
    mfd_debug("connection %s (%s, ns '%s') closed; %zu leases/reservations released",
              c->peer, c->name, c->ns, n);
    if (c->prev)
        c->prev->next = c->next;
    else
        s->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    s->n_conns--;
    if (c->pending == 0)
        conn_free(c);
    accept_resume(s); /* a descriptor came free */
}

void mfd_conn_hold(mfd_conn_t *c)
{
    c->pending++;
}

void mfd_conn_unhold(mfd_conn_t *c)
{
    if (--c->pending == 0 && c->dead)
        conn_free(c);
}

/* Writes what the socket takes; schedules the rest. */
static void conn_flush(mfd_conn_t *c)
{
    while (evbuffer_get_length(c->out) > 0) {
        int n = evbuffer_write(c->out, c->fd);
        if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
                break;
            mfd_debug("connection %s: write: %s", c->peer, strerror(errno));
            conn_close(c);
            return;
        }
        if (n == 0)
            break;
    }
    size_t left = evbuffer_get_length(c->out);
    const mfd_config_t *cfg = &c->srv->cfg;
    if (left > cfg->max_unsent) {
        /* Replies to requests read before the pause kept coming: past the cap, close. */
        mfd_warn("connection %s (%s): %zu reply bytes unread (max_unsent %llu), closing",
                 c->peer, c->name[0] ? c->name : "no hello", left,
                 (unsigned long long)cfg->max_unsent);
        mfd_count(&c->srv->metrics, MFD_C_CONN_UNSENT, 1);
        conn_close(c);
        return;
    }
    if (left > 0) {
        event_add(c->wev, NULL);
        /* Backpressure: a client that does not read its replies stops being read. */
        uint64_t pause_at = 2 * cfg->max_frame < cfg->max_unsent / 2 ? 2 * cfg->max_frame
                                                                      : cfg->max_unsent / 2;
        if (!c->read_paused && left > pause_at) {
            event_del(c->rev);
            c->read_paused = 1;
        }
        return;
    }
    event_del(c->wev);
    if (c->closing) {
        conn_close(c);
        return;
    }
    if (c->read_paused) {
        c->read_paused = 0;
        event_add(c->rev, NULL);
        /* The wait was ours, not the client's: its partial frame starts its clock now. */
        if (c->partial_since_ms)
            c->partial_since_ms = mfd_now_ms();
    }
}

void mfd_conn_reply(mfd_conn_t *c, mf_envelope_t *env, const void *payload, size_t len)
{
    if (c->dead)
        return;
    uint8_t *head;
    size_t hlen;
    mf_status_t st = mf_frame_encode_head(env, len, (uint32_t)c->srv->cfg.max_frame, &head,
                                          &hlen);
    if (st != MF_OK) {
        /* Only a reply the handlers failed to bound can get here. */
        mfd_error("connection %s: reply of %zu payload bytes does not fit max_frame", c->peer,
                  len);
        mfd_conn_error(c, env->request_id, MF_INTERNAL, "reply exceeds max_frame");
        return;
    }
    evbuffer_add(c->out, head, hlen);
    free(head);
    if (len)
        evbuffer_add(c->out, payload, len);
    conn_flush(c);
}

void mfd_conn_error(mfd_conn_t *c, uint64_t request_id, mf_status_t code, const char *fmt,
                    ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    mfd_metrics_error(&c->srv->metrics, code);
    mfd_debug("connection %s: request %llu: %s: %s", c->peer, (unsigned long long)request_id,
              mf_status_name(code), msg);
    Mapflow__V1__ErrorReply er = MAPFLOW__V1__ERROR_REPLY__INIT;
    er.code = (uint32_t)code;
    er.message = msg;
    mf_envelope_t env = MAPFLOW__V1__ENVELOPE__INIT;
    env.request_id = request_id;
    env.body_case = MAPFLOW__V1__ENVELOPE__BODY_ERROR;
    env.error = &er;
    mfd_conn_reply(c, &env, NULL, 0);
}

/* Fatal protocol error: ErrorReply, then close once it is written. */
static void conn_fail(mfd_conn_t *c, uint64_t rid, mf_status_t code, const char *msg)
{
    mfd_conn_error(c, rid, code, "%s", msg);
    if (c->dead)
        return;
    c->closing = 1;
    event_del(c->rev);
    conn_flush(c);
}

#define REPLY(c, rid, CASE, field, msg, payload, len)                                   \
    do {                                                                                \
        mf_envelope_t env_ = MAPFLOW__V1__ENVELOPE__INIT;                                 \
        env_.request_id = (rid);                                                        \
        env_.body_case = MAPFLOW__V1__ENVELOPE__BODY_##CASE;                            \
        env_.field = (msg);                                                             \
        mfd_conn_reply((c), &env_, (payload), (len));                                   \
    } while (0)

/* ==== Hello ========================================================================= */

/* Length and every byte, in time that depends on the offered length only (the frame
 * decoder already refused a NUL inside, so strlen is the wire length). */
static int token_equal(const char *offered, const char *want)
{
    size_t lo = strlen(offered), lw = strlen(want);
    unsigned char d = (unsigned char)(lo != lw);
    for (size_t i = 0; i < lo; i++)
        d |= (unsigned char)(offered[i] ^ (lw ? want[i % lw] : 0));
    return d == 0;
}

/* Names clients choose (namespace, model, client name) reach logs, keys and file names
 * of tools: no control bytes (NUL is refused for every string when the frame decodes). */
static int has_control(const char *p)
{
    for (; p && *p; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f)
            return 1;
    return 0;
}

void mfd_conn_describe(const mfd_conn_t *c, char *out, size_t n)
{
    snprintf(out, n, "connection %s (%s%s), client '%s', namespace '%s'", c->peer,
             c->creds[0] ? c->creds : "no credentials",
             c->admin == MFD_ADMIN_SOCKET  ? ", admin socket"
             : c->admin == MFD_ADMIN_TOKEN ? ", admin_token"
                                           : "",
             c->name, c->ns);
}

static void handle_hello(mfd_conn_t *c, uint64_t rid, const Mapflow__V1__Hello *h)
{
    mfd_server_t *s = c->srv;
    if (c->hello_done) {
        mfd_conn_error(c, rid, MF_FAILED_PRECONDITION, "Hello was already sent");
        return;
    }
    if (h->protocol_version != MF_PROTOCOL_VERSION) {
        mfd_count(&s->metrics, MFD_C_CONN_REJECTED, 1);
        conn_fail(c, rid, MF_FAILED_PRECONDITION, "unsupported protocol_version (want 1)");
        return;
    }
    size_t nl = h->namespace_ ? strlen(h->namespace_) : 0;
    if (nl < 1 || nl > MFD_NS_MAX || has_control(h->namespace_) ||
        has_control(h->client_name)) {
        mfd_count(&s->metrics, MFD_C_CONN_REJECTED, 1);
        conn_fail(c, rid, MF_INVALID_ARGUMENT,
                  "namespace must be 1..128 bytes; namespace and client_name without control "
                  "characters");
        return;
    }
    if (c->tp->requires_token && s->cfg.token[0] &&
        !token_equal(h->token ? h->token : "", s->cfg.token)) {
        mfd_count(&s->metrics, MFD_C_CONN_REJECTED, 1);
        mfd_warn("connection %s: bad token, closing", c->peer);
        conn_fail(c, rid, MF_UNAUTHENTICATED, "token required and not matched");
        return;
    }
    /* An admin_token that is offered must be right: a wrong one is an attack, not a
     * tenant (and with none configured no Hello can claim admin this way). */
    if (h->admin_token && h->admin_token[0]) {
        if (!s->cfg.admin_token[0] || !token_equal(h->admin_token, s->cfg.admin_token)) {
            mfd_count(&s->metrics, MFD_C_CONN_REJECTED, 1);
            mfd_warn("connection %s (%s): admin_token refused, closing", c->peer,
                     c->creds[0] ? c->creds : "no credentials");
            conn_fail(c, rid, MF_UNAUTHENTICATED, "admin_token not matched");
            return;
        }
        if (!c->admin)
            c->admin = MFD_ADMIN_TOKEN;
    }
    if (!(c->acct = acct_get(s, h->namespace_, nl))) {
        conn_fail(c, rid, MF_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    memcpy(c->ns, h->namespace_, nl);
    c->ns[nl] = 0;
    c->ns_len = nl;
    snprintf(c->name, sizeof(c->name), "%s", h->client_name ? h->client_name : "");
    c->hello_done = 1;
    c->session_id = ++s->next_session;
    int pass_fd = h->want_host_arena && c->tp->can_pass_fds;
    /* UCX: the arena is reached one-sided; RemoteArena hands out its rkey. */
    int remote = h->want_host_arena && c->tp == &mfd_transport_ucx;
    c->has_arena = remote;

    Mapflow__V1__HelloReply r = MAPFLOW__V1__HELLO_REPLY__INIT;
    r.protocol_version = MF_PROTOCOL_VERSION;
    r.daemon_version = (char *)MFD_VERSION_STR;
    r.session_id = c->session_id;
    r.host_arena_bytes = pass_fd || remote ? mfd_arena_capacity(s->store.arena) : 0;
    r.host_arena_fd = pass_fd;
    r.max_frame = (uint32_t)s->cfg.max_frame;
    r.max_batch = (uint32_t)s->cfg.max_batch;
    r.gpu_tier = s->store.gpu != NULL;
    /* GPU arenas: CUDA IPC works between processes of one node only, so unix clients. */
    Mapflow__V1__GpuArena ga[MFD_GPU_MAX_ARENAS], *gp[MFD_GPU_MAX_ARENAS];
    mfd_gpu_t *g = s->store.gpu;
    if (h->want_gpu_arena && g && c->tp == &mfd_transport_unix) {
        for (size_t i = 0; i < g->n; i++) {
            mapflow__v1__gpu_arena__init(&ga[i]);
            ga[i].index = g->a[i].index;
            ga[i].ipc_handle.data = (uint8_t *)g->a[i].ipc.reserved;
            ga[i].ipc_handle.len = MF_CU_IPC_HANDLE_SIZE;
            ga[i].bytes = g->a[i].bytes;
            ga[i].pci_bus_id = g->a[i].pci;
            ga[i].uuid.data = g->a[i].uuid;
            ga[i].uuid.len = 16;
            gp[i] = &ga[i];
        }
        r.n_gpu_arenas = g->n;
        r.gpu_arenas = gp;
        c->gpu_arenas = g->n;
    }
    /* Per connection: DEBUG, or a busy node's INFO log is all hellos. */
    mfd_debug("connection %s: hello from '%s', namespace '%s'%s%s%s", c->peer, c->name, c->ns,
              pass_fd ? ", host arena passed" : "", c->gpu_arenas ? ", gpu arenas announced" : "",
              c->admin ? ", admin" : "");
    if (!pass_fd) {
        REPLY(c, rid, HELLO_REPLY, hello_reply, &r, NULL, 0);
        return;
    }
    /* The fd rides on the HelloReply frame itself: one sendmsg, nothing queued before. */
    mf_envelope_t env = MAPFLOW__V1__ENVELOPE__INIT;
    env.request_id = rid;
    env.body_case = MAPFLOW__V1__ENVELOPE__BODY_HELLO_REPLY;
    env.hello_reply = &r;
    uint8_t *frame;
    size_t flen;
    if (mf_frame_encode(&env, NULL, 0, (uint32_t)s->cfg.max_frame, &frame, &flen) != MF_OK) {
        conn_fail(c, rid, MF_INTERNAL, "cannot encode HelloReply");
        return;
    }
    int afd = mfd_arena_fd(s->store.arena);
    char cbuf[CMSG_SPACE(sizeof(int))];
    memset(cbuf, 0, sizeof(cbuf));
    struct iovec iov = {frame, flen};
    struct msghdr msg = {0};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf;
    msg.msg_controllen = sizeof(cbuf);
    struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cm), &afd, sizeof(int));
    ssize_t n = evbuffer_get_length(c->out) == 0 ? sendmsg(c->fd, &msg, MSG_NOSIGNAL) : -1;
    if (n < 0) {
        free(frame);
        mfd_warn("connection %s: cannot pass the arena fd: %s", c->peer, strerror(errno));
        conn_close(c);
        return;
    }
    c->has_arena = 1;
    if ((size_t)n < flen) /* the fd went with the first byte; the rest is plain data */
        evbuffer_add(c->out, frame + n, flen - (size_t)n);
    free(frame);
    conn_flush(c);
}

/* ==== keys ============================================================================ */

static mf_status_t key_from_msg(const mfd_conn_t *c, const Mapflow__V1__Key *k, mfd_key_t *out,
                                const char **why)
{
    if (!k) {
        *why = "missing key";
        return MF_INVALID_ARGUMENT;
    }
    size_t ml = k->model ? strlen(k->model) : 0;
    if (ml < 1 || ml > MFD_MODEL_MAX || has_control(k->model)) {
        *why = "key.model must be 1..255 bytes without control characters";
        return MF_INVALID_ARGUMENT;
    }
    if (k->hash.len != 16) {
        *why = "key.hash must be 16 bytes";
        return MF_INVALID_ARGUMENT;
    }
    mfd_key_make(out, c->ns, c->ns_len, k->model, ml, k->layer, k->hash.data);
    return MF_OK;
}

static mf_status_t check_model_block(const char *model, uint32_t B, const char **why)
{
    size_t ml = model ? strlen(model) : 0;
    if (ml < 1 || ml > MFD_MODEL_MAX || has_control(model)) {
        *why = "model must be 1..255 bytes without control characters";
        return MF_INVALID_ARGUMENT;
    }
    if (B < MF_ROW_MIN_BLOCK || B > MF_ROW_MAX_BLOCK || (B & (B - 1))) {
        *why = "block_size must be a power of two in [8, 256]";
        return MF_INVALID_ARGUMENT;
    }
    return MF_OK;
}

/* Aligned copy of the u32 tokens of a payload (frames are not 4-byte aligned). */
static mf_status_t tokens_from_payload(const uint8_t *p, size_t len, uint32_t **out,
                                       size_t *n, const char **why)
{
    if (len % 4) {
        *why = "token payload length is not a multiple of 4";
        return MF_INVALID_ARGUMENT;
    }
    *n = len / 4;
    *out = malloc(len ? len : 4);
    if (!*out) {
        *why = "out of memory";
        return MF_RESOURCE_EXHAUSTED;
    }
    memcpy(*out, p, len);
    return MF_OK;
}

/* Hashes h(-1) .. h(n-1) into hashes[0..n] (hashes[0] = root). */
static mf_status_t prefix_hashes(const mfd_conn_t *c, const char *model, uint32_t B,
                                 const uint32_t *tokens, size_t n_blocks, mf_hash128_t **out)
{
    mf_hash128_t *h = malloc((n_blocks + 1) * sizeof(*h));
    if (!h)
        return MF_RESOURCE_EXHAUSTED;
    h[0] = mf_hash_root(B, c->ns, c->ns_len, model, strlen(model));
    for (size_t b = 0; b < n_blocks; b++)
        h[b + 1] = mf_hash_next(h[b], tokens + b * B, B);
    *out = h;
    return MF_OK;
}

/* The key of (namespace, model) built once; each probe patches layer and hash in. */
typedef struct key_tmpl {
    mfd_key_t k;
    size_t at;               /* offset of the layer (then the hash) in k.b */
} key_tmpl_t;

static void key_tmpl_init(key_tmpl_t *t, const mfd_conn_t *c, const char *model)
{
    static const uint8_t zero[16];
    mfd_key_make(&t->k, c->ns, c->ns_len, model, strlen(model), 0, zero);
    t->at = t->k.len - 20u;
}

static const mfd_key_t *key_tmpl_set(key_tmpl_t *t, uint32_t layer, mf_hash128_t h)
{
    uint8_t *p = t->k.b + t->at;
    p[0] = (uint8_t)(layer >> 24);
    p[1] = (uint8_t)(layer >> 16);
    p[2] = (uint8_t)(layer >> 8);
    p[3] = (uint8_t)layer;
    mf_hash_to_le(h, p + 4);
    return &t->k;
}

/* ==== Put ============================================================================= */

static void handle_put_begin(mfd_conn_t *c, uint64_t rid, const Mapflow__V1__PutBegin *m)
{
    mfd_server_t *s = c->srv;
    const char *why = NULL;
    mfd_key_t key;
    if (key_from_msg(c, m->key, &key, &why) != MF_OK) {
        mfd_conn_error(c, rid, MF_INVALID_ARGUMENT, "PutBegin: %s", why);
        return;
    }
    uint64_t cap = mfd_arena_capacity(s->store.arena);
    if (m->size < MF_ROW_HEADER || m->size > s->cfg.max_frame || m->size > MF_ROW_MAX_BYTES ||
        m->size > cap) {
        mfd_conn_error(c, rid, MF_INVALID_ARGUMENT,
                       "PutBegin: size %llu outside [%u, %llu] (row header, max_frame, host arena)",
                       (unsigned long long)m->size, MF_ROW_HEADER,
                       (unsigned long long)(s->cfg.max_frame < cap ? s->cfg.max_frame : cap));
        return;
    }
    uint64_t quota = (uint64_t)(s->cfg.reservation_share * (double)cap);
    if (c->acct && c->acct->reserved + m->size > quota) {
        mfd_conn_error(c, rid, MF_RESOURCE_EXHAUSTED,
                       "PutBegin: namespace '%s' already holds %llu bytes of uncommitted "
                       "reservations; %llu more exceed its quota of %llu (reservation_share "
                       "%g of the host arena)",
                       c->ns, (unsigned long long)c->acct->reserved,
                       (unsigned long long)m->size, (unsigned long long)quota,
                       s->cfg.reservation_share);
        return;
    }
    reservation_t *r = calloc(1, sizeof(*r));
    if (!r) {
        mfd_conn_error(c, rid, MF_RESOURCE_EXHAUSTED, "PutBegin: out of memory");
        return;
    }
    /* Placement: the GPU tier when on (unless the client asked for host), else host; each
     * falls back to the other when it has no room. */
    mf_status_t st = MF_UNAVAILABLE;
    int pref = m->gpu_arena ? (int)m->gpu_arena - 1 : -1;
    if (s->store.gpu && m->want_tier != MAPFLOW__V1__TIER__TIER_HOST)
        st = mfd_store_reserve_gpu(&s->store, m->size, pref, &r->arena, &r->blk);
    r->gpu = st == MF_OK;
    if (st != MF_OK)
        st = mfd_store_reserve(&s->store, m->size, &r->blk);
    if (st != MF_OK && s->store.gpu && m->want_tier == MAPFLOW__V1__TIER__TIER_HOST) {
        st = mfd_store_reserve_gpu(&s->store, m->size, pref, &r->arena, &r->blk);
        r->gpu = st == MF_OK;
    }
    if (st != MF_OK) {
        free(r);
        mfd_conn_error(c, rid, MF_RESOURCE_EXHAUSTED,
                       "PutBegin: no room for %llu bytes in the %s arena (pinned or reserved)",
                       (unsigned long long)m->size, s->store.gpu ? "GPU or host" : "host");
        return;
    }
    r->key = key;
    r->size = m->size;
    r->acct = c->acct;
    if (r->acct)
        r->acct->reserved += r->size;
    r->durable = m->durable;
    r->in_arena = r->gpu ? (int)((gpu_mask(c, m->gpu_mapped) >> r->arena) & 1) : c->has_arena;
    mfd_tickets_add(s->tickets, &r->t, MFD_TICKET_RESERVATION, c,
                    mfd_now_ms() + s->cfg.reservation_ttl_ms);
    Mapflow__V1__PutBeginReply rep = MAPFLOW__V1__PUT_BEGIN_REPLY__INIT;
    rep.reservation_id = r->t.id;
    rep.in_arena = r->in_arena;
    rep.arena_offset = r->in_arena ? mfd_ablock_offset(r->blk) : 0;
    rep.ttl_ms = s->cfg.reservation_ttl_ms;
    rep.tier = r->gpu ? MAPFLOW__V1__TIER__TIER_GPU : MAPFLOW__V1__TIER__TIER_HOST;
    rep.gpu_arena = r->gpu ? r->arena : 0;
    REPLY(c, rid, PUT_BEGIN_REPLY, put_begin_reply, &rep, NULL, 0);
}

typedef struct commit_op {
    mfd_conn_t *c;
    uint64_t rid;
    int replaced;
    int gpu;
    double t0;
} commit_op_t;

static void reply_commit(mfd_conn_t *c, uint64_t rid, int gpu, int durable, int replaced,
                         double t0)
{
    Mapflow__V1__PutCommitReply rep = MAPFLOW__V1__PUT_COMMIT_REPLY__INIT;
    rep.tier = gpu ? MAPFLOW__V1__TIER__TIER_GPU : MAPFLOW__V1__TIER__TIER_HOST;
    rep.durable = durable;
    rep.replaced = replaced;
    mfd_metrics_observe(&c->srv->metrics, MFD_H_PUT, now_s() - t0);
    REPLY(c, rid, PUT_COMMIT_REPLY, put_commit_reply, &rep, NULL, 0);
}

static void on_commit_synced(void *arg, mf_status_t st, int durable)
{
    commit_op_t *op = arg;
    if (st != MF_OK)
        mfd_conn_error(op->c, op->rid, MF_UNAVAILABLE,
                       "row is visible but its synced SSD write failed: %s", mf_strerror(st));
    else
        reply_commit(op->c, op->rid, op->gpu, durable, op->replaced, op->t0);
    mfd_conn_unhold(op->c);
    free(op);
}

static void handle_put_commit(mfd_conn_t *c, uint64_t rid, const Mapflow__V1__PutCommit *m,
                              const uint8_t *payload, size_t plen, double t0)
{
    mfd_server_t *s = c->srv;
    mfd_ticket_t *t = mfd_tickets_find(s->tickets, m->reservation_id, MFD_TICKET_RESERVATION, c);
    if (!t) {
        mfd_conn_error(c, rid, MF_NOT_FOUND, "PutCommit: unknown or expired reservation %llu",
                       (unsigned long long)m->reservation_id);
        return;
    }
    reservation_t *r = (reservation_t *)t;
    if ((plen || !r->in_arena) && plen != r->size) {
        mfd_conn_error(c, rid, MF_INVALID_ARGUMENT,
                       "PutCommit: payload of %zu bytes, reservation is %llu", plen,
                       (unsigned long long)r->size);
        release_ticket(t, s);
        return;
    }
    if (plen && r->gpu &&
        mfd_gpu_write(s->store.gpu, r->arena, r->blk, payload, plen) != MF_OK) {
        mfd_conn_error(c, rid, MF_INTERNAL, "PutCommit: copy into the GPU arena failed");
        release_ticket(t, s);
        return;
    }
    if (plen && !r->gpu)
        memcpy(mfd_arena_base(s->store.arena) + mfd_ablock_offset(r->blk), payload, plen);
    mfd_tickets_remove(s->tickets, t);
    reservation_unaccount(r); /* committing: the block becomes a row (or is freed) */
    commit_op_t *op = calloc(1, sizeof(*op));
    if (!op) {
        reservation_free(s, r);
        mfd_conn_error(c, rid, MF_RESOURCE_EXHAUSTED, "PutCommit: out of memory");
        return;
    }
    *op = (commit_op_t){c, rid, 0, r->gpu, t0};
    int pending, durable, replaced;
    const char *why = "invalid row";
    mf_status_t st =
        r->gpu ? mfd_store_commit_gpu(&s->store, &r->key, r->arena, r->blk, r->size, r->durable,
                                      on_commit_synced, op, &pending, &durable, &replaced, &why)
               : mfd_store_commit(&s->store, &r->key, r->blk, r->size, r->durable,
                                  on_commit_synced, op, &pending, &durable, &replaced, &why);
    int gpu = r->gpu;
    free(r);
    if (st != MF_OK) {
        free(op);
        mfd_conn_error(c, rid, st, "PutCommit: %s", why);
        return;
    }
    if (pending) {
        op->replaced = replaced;
        mfd_conn_hold(c);
        return;
    }
    free(op);
    reply_commit(c, rid, gpu, durable, replaced, t0);
}

static void handle_put_abort(mfd_conn_t *c, uint64_t rid, const Mapflow__V1__PutAbort *m)
{
    mfd_ticket_t *t = mfd_tickets_find(c->srv->tickets, m->reservation_id,
                                       MFD_TICKET_RESERVATION, c);
    if (!t) {
        mfd_conn_error(c, rid, MF_NOT_FOUND, "PutAbort: unknown or expired reservation %llu",
                       (unsigned long long)m->reservation_id);
        return;
    }
    release_ticket(t, c->srv);
    Mapflow__V1__PutAbortReply rep = MAPFLOW__V1__PUT_ABORT_REPLY__INIT;
    REPLY(c, rid, PUT_ABORT_REPLY, put_abort_reply, &rep, NULL, 0);
}

/* ==== Lookup ========================================================================== */

/* The hit check of one (layer, block) that the block index does not vouch for: reads
 * the row (header, parent, tokens); a row only on the SSD tier counts as present (Get
 * verifies it when read). A row that passes marks its layer in the block index. */
static int lookup_row_hit(mfd_server_t *s, key_tmpl_t *kt, uint32_t layer,
                          const mf_hash128_t *h, size_t b, const uint32_t *tok, uint32_t B,
                          const uint8_t parent[16])
{
    mfd_entry_t *e = mfd_store_find(&s->store, key_tmpl_set(kt, layer, h[b + 1]));
    if (!e)
        return 0;
    const uint8_t *row = mfd_store_head(&s->store, e); /* a GPU-only row: its head copy */
    if (!row)
        return 1;
    const char *why = NULL;
    mf_status_t vs = mfd_row_verify(row, e->size, 0, tok, B, h[b], h[b + 1], &why);
    if (vs != MF_OK) {
        mfd_count(&s->metrics, vs == MF_NOT_FOUND ? MFD_C_HASH_MISMATCH : MFD_C_DATA_LOSS, 1);
        return 0;
    }
    mfd_index_block_note(s->store.ix, e, B, parent, tok);
    return 1;
}

/* Peers come from the configuration only: naming any other address would make this
 * daemon dial it and present its token there. */
static int peer_refused(mfd_conn_t *c, uint64_t rid, const char *what, const char *peer)
{
    if (mfd_config_peer_allowed(&c->srv->cfg, peer))
        return 0;
    mfd_count(&c->srv->metrics, MFD_C_ADMIN_DENIED, 1);
    mfd_debug("%s: %s names peer '%s', which is not in `peers`; refused", what, c->peer,
              peer);
    mfd_conn_error(c, rid, MF_PERMISSION_DENIED,
                   "%s: peer '%s' is not one of this daemon's configured peers", what, peer);
    return 1;
}

/* peer_blocks: the peer's answer (resume); via_peer: ask m->peer first. */
static void handle_lookup(mfd_conn_t *c, uint64_t rid, const Mapflow__V1__Lookup *m,
                          const uint8_t *payload, size_t plen, double t0, int via_peer,
                          const uint32_t *peer_blocks, size_t n_peer_blocks)
{
    mfd_server_t *s = c->srv;
    const char *why = NULL;
    if (check_model_block(m->model, m->block_size, &why) != MF_OK) {
        mfd_conn_error(c, rid, MF_INVALID_ARGUMENT, "Lookup: %s", why);
        return;
    }
    if (m->n_layers < 1 || m->n_layers > s->cfg.max_batch) {
        mfd_conn_error(c, rid, MF_INVALID_ARGUMENT, "Lookup: %zu layers (want 1..%llu)",
                       m->n_layers, (unsigned long long)s->cfg.max_batch);
        return;
    }
    /* One request may hold the loop only so long: every (layer, block) is a probe (and
     * checked before a peer is asked to do the same work). */
    size_t nb_req = plen / 4 / m->block_size;
    if (nb_req > s->cfg.max_lookup || (uint64_t)nb_req * m->n_layers > s->cfg.max_lookup) {
        mfd_conn_error(c, rid, MF_INVALID_ARGUMENT,
                       "Lookup: %zu layers x %zu blocks exceed max_lookup %llu (split the "
                       "request)",
                       m->n_layers, nb_req, (unsigned long long)s->cfg.max_lookup);
        return;
    }
    if (via_peer && m->peer && m->peer[0]) {
        if (peer_refused(c, rid, "Lookup", m->peer))
            return;
        mfd_peers_lookup(c, rid, m, payload, plen, t0);
        return;
    }
    uint32_t *tokens = NULL;
    mf_hash128_t *h = NULL;
    uint32_t *blocks = NULL, *alive = NULL;
    size_t n_tok;
    mf_status_t st = tokens_from_payload(payload, plen, &tokens, &n_tok, &why);
    if (st != MF_OK) {
        mfd_conn_error(c, rid, st, "Lookup: %s", why);
        return;
    }
    uint32_t B = m->block_size;
    size_t nb = n_tok / B;
    blocks = calloc(m->n_layers, sizeof(*blocks));
    alive = malloc(m->n_layers * sizeof(*alive));
    if (!blocks || !alive || prefix_hashes(c, m->model, B, tokens, nb, &h) != MF_OK) {
        mfd_conn_error(c, rid, MF_RESOURCE_EXHAUSTED, "Lookup: out of memory");
        goto done;
    }
    uint64_t hit_blocks = 0;
    key_tmpl_t kt;
    key_tmpl_init(&kt, c, m->model);
    /* Blocks outer, layers inner: one block-index probe and one token compare per block;
     * a layer leaves `alive` at its first miss (only leading blocks count). */
    uint8_t bk[MFD_BKEY_MAX], parent[16];
    memcpy(bk, kt.k.b, kt.at);
    mf_hash_to_le(h[0], parent);
    size_t n_alive = m->n_layers;
    for (size_t l = 0; l < n_alive; l++)
        alive[l] = (uint32_t)l;
    for (size_t b = 0; b < nb && n_alive; b++) {
        if (b)
            memcpy(parent, bk + kt.at, 16); /* block b's parent is block b - 1's hash */
        mf_hash_to_le(h[b + 1], bk + kt.at);
        const mfd_block_t *blk = mfd_index_block_find(s->store.ix, bk, kt.at + 16);
        if (!blk)
            break;
        const uint32_t *tok = tokens + b * B;
        int match = mfd_block_matches(blk, B, parent, tok);
        size_t keep = 0;
        for (size_t i = 0; i < n_alive; i++) {
            uint32_t l = alive[i];
            int hit;
            if (mfd_block_has_layer(blk, m->layers[l])) {
                hit = match; /* the row carries the block's record: no need to read it */
                if (!match)
                    mfd_count(&s->metrics, MFD_C_HASH_MISMATCH, 1);
            } else {
                hit = lookup_row_hit(s, &kt, m->layers[l], h, b, tok, B, parent);
            }
            if (hit) {
                blocks[l]++;
                alive[keep++] = l;
            }
        }
        n_alive = keep;
    }
    for (size_t l = 0; l < m->n_layers; l++) {
        if (peer_blocks && l < n_peer_blocks && peer_blocks[l] > blocks[l])
            blocks[l] = peer_blocks[l] < nb ? peer_blocks[l] : (uint32_t)nb;
        hit_blocks += blocks[l];
    }
    mfd_count(&s->metrics, MFD_C_LOOKUP_REQ_TOKENS, (uint64_t)m->n_layers * nb * B);
    mfd_count(&s->metrics, MFD_C_LOOKUP_HIT_TOKENS, hit_blocks * B);
    Mapflow__V1__LookupReply rep = MAPFLOW__V1__LOOKUP_REPLY__INIT;
    rep.n_blocks = m->n_layers;
    rep.blocks = blocks;
    rep.total_blocks = (uint32_t)nb;
    mfd_metrics_observe(&s->metrics, MFD_H_LOOKUP, now_s() - t0);
    REPLY(c, rid, LOOKUP_REPLY, lookup_reply, &rep, NULL, 0);
done:
    free(alive);
    free(blocks);
    free(h);
    free(tokens);
}

/* ==== Get ============================================================================= */

typedef struct get_op get_op_t;

typedef struct get_row {
    get_op_t *op;
    mfd_entry_t *e;          /* pinned while the op holds it (NULL: not found) */
    uint32_t block_rel;      /* index into the op's hash / token arrays (prefix mode) */
    const uint8_t *src;      /* copy mode, status OK: the verified bytes to send */
    uint8_t *buf;            /* copy mode: bytes this row owns (SSD read, demotion copy) */
    Mapflow__V1__RowRef ref;
} get_row_t;

struct get_op {
    mfd_conn_t *c;
    uint64_t rid;
    int lease_mode, prefix_mode;
    uint64_t gpu_mapped;     /* GPU arenas the client opened (leases may point into them) */
    uint32_t B;
    uint32_t *tokens;        /* prefix mode: all tokens */
    mf_hash128_t *h;         /* h[0] = root, h[b + 1] = block b */
    uint32_t first, nb;      /* prefix mode: blocks [first, first + nb) of each layer */
    key_tmpl_t kt;           /* prefix mode: (namespace, model) key */
    size_t n_rows, outstanding;
    get_row_t *rows;
    double t0;
};

static void get_op_free(get_op_t *op)
{
    /* rows is NULL when the request failed its bounds checks (n_rows may be huge). */
    for (size_t i = 0; op->rows && i < op->n_rows; i++) {
        if (op->rows[i].e)
            mfd_index_unpin(op->c->srv->store.ix, op->rows[i].e);
        free(op->rows[i].buf);
    }
    free(op->rows);
    free(op->tokens);
    free(op->h);
    free(op);
}

/* Checks one row's bytes against the request; the caller set ref.status = OK first.
 * Every row here was validated in full when it was committed or read from the SSD
 * tier, so this is the hit check (header, parent, hash, tokens), not a checksum: the
 * client library checks the checksum of what it receives. */
static void verify_row(get_op_t *op, get_row_t *r, const uint8_t *bytes)
{
    const char *why = NULL;
    mf_status_t st;
    if (op->prefix_mode) {
        uint32_t b = r->block_rel;
        st = mfd_row_verify(bytes, r->e->size, 0, op->tokens + (size_t)b * op->B, op->B,
                            op->h[b], op->h[b + 1], &why);
    } else {
        st = mfd_row_verify(bytes, r->e->size, 0, NULL, 0, (mf_hash128_t){0, 0},
                            (mf_hash128_t){0, 0}, &why);
    }
    if (st != MF_OK) {
        /* NOT_FOUND: a collision — another context's row, never handed out as this one. */
        mfd_count(&op->c->srv->metrics,
                  st == MF_NOT_FOUND ? MFD_C_HASH_MISMATCH : MFD_C_DATA_LOSS, 1);
        mfd_debug("get: layer %u block %u: %s", r->ref.layer, r->ref.block, why ? why : "");
        r->ref.status = st;
    }
}

/* Block j of a prefix Get is verified when its block-index record (made from a row
 * validated at commit or read back) carries the request's parent and tokens. A block
 * known only from the SSD index has no record yet: one is made from a row of a requested
 * layer that is in memory, if any (else the block stays unverified). A block of which no
 * row is stored at all has nothing to contradict the request and does not stop the chain
 * (a Get past block 0 of a range whose earlier blocks live elsewhere, e.g. on a peer). */
static int block_verified(get_op_t *op, size_t n_layers, uint32_t j)
{
    mfd_store_t *st = &op->c->srv->store;
    uint8_t parent[16], bk[MFD_BKEY_MAX];
    mf_hash_to_le(op->h[j], parent);
    const uint32_t *tok = op->tokens + (size_t)j * op->B;
    const mfd_key_t *k = key_tmpl_set(&op->kt, op->rows[0].ref.layer, op->h[j + 1]);
    const mfd_block_t *b = mfd_index_block_find(st->ix, bk, mfd_bkey_of(k->b, k->len, bk));
    if (!b)
        return 1;
    if (mfd_block_matches(b, op->B, parent, tok))
        return 1;
    for (size_t l = 0; l < n_layers; l++) {
        mfd_entry_t *e = mfd_store_find(
            st, key_tmpl_set(&op->kt, op->rows[l * op->nb].ref.layer, op->h[j + 1]));
        const uint8_t *row = e ? mfd_store_head(st, e) : NULL;
        const char *why;
        if (row && mfd_row_verify(row, e->size, 0, tok, op->B, op->h[j], op->h[j + 1], &why) ==
                       MF_OK) {
            mfd_index_block_note(st->ix, e, op->B, parent, tok); /* records only if unrecorded */
            return mfd_block_matches(b, op->B, parent, tok);
        }
    }
    return 0;
}

/* A hit at block i needs blocks 0..i-1 of the request verified too (DESIGN §4; issue 22):
 * a block-0 collision would otherwise make every later block of the other context (same
 * parent hash, same tokens) hit. Rows past the first block whose stored rows do not vouch
 * for the request become NOT_FOUND. */
static void verify_chain(get_op_t *op)
{
    if (!op->prefix_mode || !op->nb)
        return;
    size_t n_layers = op->n_rows / op->nb;
    uint32_t last = op->first + op->nb - 1, ok = 0; /* blocks [0, ok) verified */
    while (ok < last && block_verified(op, n_layers, ok))
        ok++;
    for (size_t i = 0; i < op->n_rows; i++) {
        get_row_t *r = &op->rows[i];
        if (r->ref.status == MF_OK && r->block_rel > ok) {
            r->ref.status = MF_NOT_FOUND;
            mfd_count(&op->c->srv->metrics, MFD_C_HASH_MISMATCH, 1);
        }
    }
}

/* Drops leased row k of group l (release, expiry, disconnect). */
static void lease_drop_row(mfd_server_t *s, lease_t *l, uint32_t k)
{
    mfd_entry_t *e = l->e[k];
    l->e[k] = NULL;
    l->live--;
    s->leased_rows--;
    e->leases--;
    mfd_index_unpin(s->store.ix, e);
}

/* One lease group for every row of the Get that is OK (ids: group << LEASE_ROW_BITS | k). */
static void grant_leases(get_op_t *op)
{
    mfd_server_t *s = op->c->srv;
    uint32_t n = 0;
    for (size_t i = 0; i < op->n_rows; i++)
        n += op->rows[i].ref.status == MF_OK;
    if (!n)
        return;
    lease_t *l = op->c->dead ? NULL : calloc(1, sizeof(*l) + n * sizeof(l->e[0]));
    for (size_t i = 0; i < op->n_rows; i++) {
        get_row_t *r = &op->rows[i];
        if (r->ref.status != MF_OK)
            continue;
        if (!l) {
            r->ref.status = op->c->dead ? MF_CANCELLED : MF_RESOURCE_EXHAUSTED;
            continue;
        }
        uint32_t k = l->n++;
        l->e[k] = r->e;
        mfd_entry_pin(r->e);
        r->e->leases++;
        r->ref.arena_offset = mfd_ablock_offset(
            r->ref.tier == MAPFLOW__V1__TIER__TIER_GPU ? r->e->gpu : r->e->host);
    }
    if (!l)
        return;
    l->live = l->n;
    s->leased_rows += l->n;
    mfd_tickets_add(s->tickets, &l->t, MFD_TICKET_LEASE, op->c,
                    mfd_now_ms() + s->cfg.lease_ttl_ms);
    for (size_t i = 0, k = 0; i < op->n_rows; i++)
        if (op->rows[i].ref.status == MF_OK)
            op->rows[i].ref.lease_id = (l->t.id << LEASE_ROW_BITS) | k++;
    mfd_count(&s->metrics, MFD_C_LEASES_GRANTED, l->n);
}

/* A row referenced by a reply buffer: its pin goes when libevent is done with it. */
typedef struct row_pin {
    mfd_store_t *st;
    mfd_entry_t *e;
} row_pin_t;

static void on_row_sent(const void *data, size_t len, void *arg)
{
    (void)data;
    (void)len;
    row_pin_t *p = arg;
    mfd_index_unpin(p->st->ix, p->e);
    free(p);
}

static void on_buf_sent(const void *data, size_t len, void *arg)
{
    (void)len;
    (void)arg;
    free((void *)data);
}

/* Rows at least this large go out by reference (no copy into the evbuffer). */
#define REF_MIN_BYTES (64u << 10)

/* Appends a copy-mode row to the reply: a reference to the host block (the op's pin
 * moves to the buffer) or to the row's own buffer, or a copy when small. */
static int add_row_bytes(struct evbuffer *out, mfd_store_t *st, get_row_t *r)
{
    size_t len = r->ref.length;
    if (len < REF_MIN_BYTES)
        return evbuffer_add(out, r->src, len);
    if (r->buf) {
        if (evbuffer_add_reference(out, r->buf, len, on_buf_sent, NULL) != 0)
            return -1;
        r->buf = NULL;
        return 0;
    }
    row_pin_t *p = malloc(sizeof(*p));
    if (!p || evbuffer_add_reference(out, r->src, len, on_row_sent, p) != 0) {
        free(p);
        return evbuffer_add(out, r->src, len);
    }
    *p = (row_pin_t){st, r->e};
    r->e = NULL;
    return 0;
}

/* Sends a copy-mode GetReply: the OK rows packed 16-byte aligned, in row order. */
static void reply_get_copy(get_op_t *op, mf_envelope_t *env, size_t plen)
{
    mfd_conn_t *c = op->c;
    if (c->dead)
        return;
    uint8_t *head;
    size_t hlen;
    if (mf_frame_encode_head(env, plen, (uint32_t)c->srv->cfg.max_frame, &head, &hlen) != MF_OK) {
        mfd_error("connection %s: get reply of %zu payload bytes does not fit max_frame",
                  c->peer, plen);
        mfd_conn_error(c, op->rid, MF_INTERNAL, "reply exceeds max_frame");
        return;
    }
    /* Built aside, so a failure midway never leaves half a frame in c->out. */
    struct evbuffer *f = evbuffer_new();
    static const uint8_t zeros[MF_ROW_ALIGN];
    int bad = !f || evbuffer_add(f, head, hlen) != 0;
    free(head);
    size_t off = 0;
    for (size_t i = 0; !bad && i < op->n_rows; i++) {
        get_row_t *r = &op->rows[i];
        if (r->ref.status != MF_OK)
            continue;
        bad = evbuffer_add(f, zeros, r->ref.payload_offset - off) != 0 ||
              add_row_bytes(f, &c->srv->store, r) != 0;
        off = r->ref.payload_offset + r->ref.length;
    }
    if (bad) {
        if (f)
            evbuffer_free(f);
        mfd_conn_error(c, op->rid, MF_RESOURCE_EXHAUSTED, "Get: out of memory");
        return;
    }
    evbuffer_add_buffer(c->out, f);
    evbuffer_free(f);
    conn_flush(c);
}

static void finish_get(get_op_t *op)
{
    mfd_server_t *s = op->c->srv;
    verify_chain(op);
    if (op->lease_mode)
        grant_leases(op);
    Mapflow__V1__RowRef **refs = malloc(op->n_rows * sizeof(*refs));
    size_t end = 0;
    uint64_t B = op->prefix_mode ? op->B : 0;
    for (size_t i = 0; i < op->n_rows; i++) {
        Mapflow__V1__RowRef *ref = &op->rows[i].ref;
        if (refs)
            refs[i] = ref;
        if (ref->status == MF_OK) {
            /* Copy mode: packed now, so failed rows leave no gap to zero. */
            if (!op->lease_mode) {
                ref->payload_offset = (end + MF_ROW_ALIGN - 1) & ~(size_t)(MF_ROW_ALIGN - 1);
                end = ref->payload_offset + ref->length;
            }
            mfd_count(&s->metrics,
                      ref->tier == MAPFLOW__V1__TIER__TIER_SSD   ? MFD_C_GET_HIT_TOKENS_SSD
                      : ref->tier == MAPFLOW__V1__TIER__TIER_GPU ? MFD_C_GET_HIT_TOKENS_GPU
                                                                 : MFD_C_GET_HIT_TOKENS_HOST,
                      B);
        } else {
            ref->payload_offset = 0;
            if (ref->status != MF_NOT_FOUND)
                mfd_metrics_error(&s->metrics, (mf_status_t)ref->status);
            mfd_count(&s->metrics, MFD_C_GET_MISS_TOKENS, B);
        }
    }
    mfd_count(&s->metrics, MFD_C_GET_REQ_TOKENS, B * op->n_rows);
    if (!refs) {
        mfd_conn_error(op->c, op->rid, MF_RESOURCE_EXHAUSTED, "Get: out of memory");
    } else {
        Mapflow__V1__GetReply rep = MAPFLOW__V1__GET_REPLY__INIT;
        rep.n_rows = op->n_rows;
        rep.rows = refs;
        rep.lease_ttl_ms = op->lease_mode ? s->cfg.lease_ttl_ms : 0;
        mfd_metrics_observe(&s->metrics, MFD_H_GET, now_s() - op->t0);
        mf_envelope_t env = MAPFLOW__V1__ENVELOPE__INIT;
        env.request_id = op->rid;
        env.body_case = MAPFLOW__V1__ENVELOPE__BODY_GET_REPLY;
        env.get_reply = &rep;
        if (op->lease_mode)
            mfd_conn_reply(op->c, &env, NULL, 0);
        else
            reply_get_copy(op, &env, end);
    }
    free(refs);
    get_op_free(op);
}

static void on_get_read(void *arg, mfd_entry_t *e, mf_status_t st, uint8_t *buf, size_t len)
{
    get_row_t *r = arg;
    get_op_t *op = r->op;
    const uint8_t *bytes = buf ? buf : e->host ? mfd_store_bytes(&op->c->srv->store, e) : NULL;
    if (st != MF_OK) {
        r->ref.status = st == MF_DATA_LOSS ? MF_DATA_LOSS : st == MF_NOT_FOUND ? MF_NOT_FOUND
                                                                              : MF_UNAVAILABLE;
    } else if (op->lease_mode && (!e->host || !e->linked)) {
        r->ref.status = MF_RESOURCE_EXHAUSTED; /* no room to promote it for a lease */
    } else if (!bytes || len != r->ref.length) {
        r->ref.status = MF_DATA_LOSS;
    } else {
        /* The store checked the checksum as it read the row. */
        r->ref.tier = MAPFLOW__V1__TIER__TIER_SSD;
        verify_row(op, r, bytes);
        if (!op->lease_mode && r->ref.status == MF_OK) {
            r->src = bytes;
            r->buf = buf;
            buf = NULL;
        }
    }
    free(buf);
    mfd_conn_t *c = op->c;
    if (--op->outstanding == 0) {
        finish_get(op);
        mfd_conn_unhold(c);
    }
}

/* Resolves row r now, or starts its SSD read. */
static void resolve_row(get_op_t *op, get_row_t *r)
{
    mfd_server_t *s = op->c->srv;
    mfd_entry_t *e = r->e;
    mfd_store_touch(&s->store, e);
    if (op->lease_mode && e->gpu && ((op->gpu_mapped >> e->gpu_arena) & 1)) {
        /* A device view: the client mapped this arena. The hit check reads the head copy. */
        r->ref.tier = MAPFLOW__V1__TIER__TIER_GPU;
        r->ref.gpu_arena = e->gpu_arena;
        verify_row(op, r, mfd_store_head(&s->store, e));
        return;
    }
    /* A client that cannot reach the row's GPU arena gets it staged in the host arena
     * (the entry keeps that copy; the lease pins it like any host row). */
    if (op->lease_mode && !e->host && e->gpu &&
        mfd_store_stage_host(&s->store, e) != MF_OK) {
        r->ref.status = MF_RESOURCE_EXHAUSTED;
        return;
    }
    const uint8_t *bytes = mfd_store_bytes(&s->store, e);
    if (op->lease_mode && e->host) {
        r->ref.tier = MAPFLOW__V1__TIER__TIER_HOST;
        verify_row(op, r, bytes);
        mfd_store_promote_gpu(&s->store, e);
        return;
    }
    if (!op->lease_mode && r->ref.status != MF_OK)
        return; /* OUT_OF_RANGE: no room in this reply */
    if (!op->lease_mode && !e->host && e->gpu) {
        /* GET_COPY of a GPU row: DtoH into a buffer the reply sends. */
        r->buf = aligned_alloc(64, mfd_arena_round(e->size));
        if (!r->buf || mfd_store_gpu_read(&s->store, e, r->buf) != MF_OK) {
            r->ref.status = r->buf ? MF_INTERNAL : MF_RESOURCE_EXHAUSTED;
            return;
        }
        r->ref.tier = MAPFLOW__V1__TIER__TIER_GPU;
        verify_row(op, r, r->buf);
        r->src = r->buf;
        return;
    }
    if (!op->lease_mode && bytes) {
        r->ref.tier = e->host ? MAPFLOW__V1__TIER__TIER_HOST : MAPFLOW__V1__TIER__TIER_SSD;
        verify_row(op, r, bytes);
        if (r->ref.status != MF_OK)
            return;
        if (e->host) {
            r->src = bytes; /* the host block stays put while the row is pinned */
            mfd_store_promote_gpu(&s->store, e);
            return;
        }
        /* A demotion copy is freed when its write completes, maybe before the reply. */
        r->buf = malloc(e->size);
        if (!r->buf) {
            r->ref.status = MF_RESOURCE_EXHAUSTED;
            return;
        }
        memcpy(r->buf, bytes, e->size);
        r->src = r->buf;
        return;
    }
    op->outstanding++;
    mfd_store_read(&s->store, e, 1, on_get_read, r);
}

/* forced: NULL on a first pass (rows missing here may go to m->peer); on a resume, the
 * peer's status of each row still missing. */
static void handle_get(mfd_conn_t *c, uint64_t rid, const Mapflow__V1__Get *m,
                       const uint8_t *payload, size_t plen, double t0,
                       const mf_status_t *forced)
{
    mfd_server_t *s = c->srv;
    const char *why = NULL;
    get_op_t *op = calloc(1, sizeof(*op));
    if (!op) {
        mfd_conn_error(c, rid, MF_RESOURCE_EXHAUSTED, "Get: out of memory");
        return;
    }
    op->c = c;
    op->rid = rid;
    op->t0 = t0;
    op->lease_mode = m->mode == MAPFLOW__V1__GET_MODE__GET_LEASE;
    op->prefix_mode = m->n_keys == 0;
    op->gpu_mapped = gpu_mask(c, m->gpu_mapped);
    if (op->lease_mode && !c->has_arena) {
        mfd_conn_error(c, rid, MF_FAILED_PRECONDITION,
                       "Get: GET_LEASE needs the host arena (unix socket, Hello.want_host_arena)");
        goto fail;
    }
    if (!forced && m->peer && m->peer[0] && peer_refused(c, rid, "Get", m->peer))
        goto fail;
    size_t n_blocks = 0;
    if (op->prefix_mode) {
        if (check_model_block(m->model, m->block_size, &why) != MF_OK) {
            mfd_conn_error(c, rid, MF_INVALID_ARGUMENT, "Get: %s", why);
            goto fail;
        }
        size_t n_tok;
        mf_status_t st = tokens_from_payload(payload, plen, &op->tokens, &n_tok, &why);
        if (st != MF_OK) {
            mfd_conn_error(c, rid, st, "Get: %s", why);
            goto fail;
        }
        op->B = m->block_size;
        size_t total = n_tok / op->B;
        if (m->first_block > total || (m->n_blocks && m->first_block + (uint64_t)m->n_blocks > total)) {
            mfd_conn_error(c, rid, MF_INVALID_ARGUMENT,
                           "Get: tokens hold %zu full blocks, fewer than first_block %u + n_blocks %u",
                           total, m->first_block, m->n_blocks);
            goto fail;
        }
        n_blocks = m->n_blocks ? m->n_blocks : total - m->first_block;
        if (m->n_layers == 0) {
            mfd_conn_error(c, rid, MF_INVALID_ARGUMENT, "Get: no layers");
            goto fail;
        }
        op->n_rows = m->n_layers * n_blocks;
        if (n_blocks && op->n_rows / n_blocks != m->n_layers)
            op->n_rows = SIZE_MAX;
    } else {
        op->n_rows = m->n_keys;
    }
    if (op->n_rows > s->cfg.max_batch) {
        mfd_conn_error(c, rid, MF_INVALID_ARGUMENT, "Get: %zu rows exceed max_batch %llu",
                       op->n_rows, (unsigned long long)s->cfg.max_batch);
        goto fail;
    }
    if (op->prefix_mode) {
        /* Hashes of blocks [0, first_block + n_blocks): the chain starts at block 0. */
        size_t upto = m->first_block + n_blocks;
        if (upto > s->cfg.max_lookup) {
            mfd_conn_error(c, rid, MF_INVALID_ARGUMENT,
                           "Get: %zu blocks to hash exceed max_lookup %llu", upto,
                           (unsigned long long)s->cfg.max_lookup);
            goto fail;
        }
        if (prefix_hashes(c, m->model, op->B, op->tokens, upto, &op->h) != MF_OK) {
            mfd_conn_error(c, rid, MF_RESOURCE_EXHAUSTED, "Get: out of memory");
            goto fail;
        }
    }
    op->rows = calloc(op->n_rows ? op->n_rows : 1, sizeof(*op->rows));
    if (!op->rows) {
        mfd_conn_error(c, rid, MF_RESOURCE_EXHAUSTED, "Get: out of memory");
        goto fail;
    }
    /* Pass 1: find entries, lay the copy payload out (bounded by max_frame). */
    size_t budget = s->cfg.max_frame - 4 - 256 - op->n_rows * 64;
    size_t off = 0;
    key_tmpl_t *kt = &op->kt;
    if (op->prefix_mode) {
        key_tmpl_init(kt, c, m->model);
        op->first = m->first_block;
        op->nb = (uint32_t)n_blocks;
    }
    for (size_t i = 0; i < op->n_rows; i++) {
        get_row_t *r = &op->rows[i];
        mapflow__v1__row_ref__init(&r->ref);
        r->op = op;
        mfd_key_t k;
        const mfd_key_t *kp = &k;
        if (op->prefix_mode) {
            size_t l = i / n_blocks, b = i % n_blocks;
            r->block_rel = (uint32_t)(m->first_block + b);
            r->ref.layer = m->layers[l];
            r->ref.block = r->block_rel;
            kp = key_tmpl_set(kt, m->layers[l], op->h[r->block_rel + 1]);
        } else if (key_from_msg(c, m->keys[i], &k, &why) != MF_OK) {
            r->ref.status = MF_INVALID_ARGUMENT;
            continue;
        } else {
            r->ref.layer = m->keys[i]->layer;
        }
        r->e = mfd_store_find(&s->store, kp);
        if (!r->e) {
            r->ref.status = forced && forced[i] ? forced[i] : MF_NOT_FOUND;
            continue;
        }
        mfd_entry_pin(r->e);
        if (!op->prefix_mode)
            r->ref.block = r->e->block;
        r->ref.status = MF_OK;
        r->ref.length = r->e->size;
        if (!op->lease_mode) {
            size_t at = (off + MF_ROW_ALIGN - 1) & ~(size_t)(MF_ROW_ALIGN - 1);
            if (at + r->e->size > budget) {
                r->ref.status = MF_OUT_OF_RANGE;
            } else {
                r->ref.payload_offset = at;
                off = at + r->e->size;
            }
        }
    }
    if (!forced && m->peer && m->peer[0]) {
        /* Read-through: the peer fills in what is missing, then this Get runs again. */
        uint32_t *miss = malloc(op->n_rows * sizeof(*miss) + 1);
        size_t n_miss = 0;
        for (size_t i = 0; miss && i < op->n_rows; i++)
            if (!op->rows[i].e && op->rows[i].ref.status == MF_NOT_FOUND)
                miss[n_miss++] = (uint32_t)i;
        if (!miss)
            mfd_conn_error(c, rid, MF_RESOURCE_EXHAUSTED, "Get: out of memory");
        else if (n_miss)
            mfd_peers_get(c, rid, m, payload, plen, t0, miss, n_miss);
        free(miss);
        if (!miss || n_miss) {
            get_op_free(op);
            return;
        }
    }
    /* Pass 2: copy / lease what is in memory, read the rest from the SSD tier. */
    op->outstanding = 1; /* held by this function until every row has started */
    mfd_conn_hold(c);
    for (size_t i = 0; i < op->n_rows; i++)
        if (op->rows[i].e && (op->rows[i].ref.status == MF_OK ||
                              op->rows[i].ref.status == MF_OUT_OF_RANGE))
            resolve_row(op, &op->rows[i]);
    if (--op->outstanding == 0) {
        finish_get(op);
        mfd_conn_unhold(c);
    }
    return;
fail:
    get_op_free(op);
}

static void handle_release(mfd_conn_t *c, uint64_t rid, const Mapflow__V1__Release *m)
{
    mfd_server_t *s = c->srv;
    uint32_t n = 0;
    lease_t *l = NULL; /* the last group found: a Get's ids come together */
    for (size_t i = 0; i < m->n_lease_ids; i++) {
        uint64_t gid = m->lease_ids[i] >> LEASE_ROW_BITS;
        uint64_t k = m->lease_ids[i] & ((1u << LEASE_ROW_BITS) - 1);
        if (!l || l->t.id != gid)
            l = (lease_t *)mfd_tickets_find(s->tickets, gid, MFD_TICKET_LEASE, c);
        if (!l || k >= l->n || !l->e[k])
            continue;
        lease_drop_row(s, l, (uint32_t)k);
        n++;
        if (l->live == 0) {
            mfd_tickets_remove(s->tickets, &l->t);
            free(l);
            l = NULL;
        }
    }
    Mapflow__V1__ReleaseReply rep = MAPFLOW__V1__RELEASE_REPLY__INIT;
    rep.released = n;
    REPLY(c, rid, RELEASE_REPLY, release_reply, &rep, NULL, 0);
}

void mfd_server_get_resume(mfd_conn_t *c, uint64_t rid, const Mapflow__V1__Get *m,
                           const uint8_t *payload, size_t plen, double t0,
                           const mf_status_t *forced)
{
    if (!c->dead)
        handle_get(c, rid, m, payload, plen, t0, forced);
}

void mfd_server_lookup_resume(mfd_conn_t *c, uint64_t rid, const Mapflow__V1__Lookup *m,
                              const uint8_t *payload, size_t plen, double t0,
                              const uint32_t *peer_blocks, size_t n_peer_blocks)
{
    if (!c->dead)
        handle_lookup(c, rid, m, payload, plen, t0, 0, peer_blocks, n_peer_blocks);
}

/* ==== dispatch ======================================================================== */

/* Requests that act beyond the caller's namespace or on the daemon itself; NULL = any
 * connection may send it. */
static const char *admin_request(const mf_envelope_t *env)
{
    switch (env->body_case) {
    case MAPFLOW__V1__ENVELOPE__BODY_CONFIG_SET: return "ConfigSet";
    case MAPFLOW__V1__ENVELOPE__BODY_PROFILE_PUT: return "ProfilePut";
    case MAPFLOW__V1__ENVELOPE__BODY_FLUSH:
        return env->flush->all_namespaces ? "Flush of every namespace" : NULL;
    case MAPFLOW__V1__ENVELOPE__BODY_EVICT:
        return env->evict->all_namespaces ? "Evict of every namespace" : NULL;
    default: return NULL;
    }
}

void mfd_server_dispatch(mfd_conn_t *c, const mf_envelope_t *env, const uint8_t *payload,
                         size_t plen)
{
    double t0 = now_s();
    uint64_t rid = env->request_id;
    mfd_metrics_request(&c->srv->metrics, (int)env->body_case);
    if (!c->hello_done && env->body_case != MAPFLOW__V1__ENVELOPE__BODY_HELLO) {
        mfd_count(&c->srv->metrics, MFD_C_CONN_REJECTED, 1);
        conn_fail(c, rid, MF_FAILED_PRECONDITION, "the first frame must be Hello");
        return;
    }
    const char *adm = admin_request(env);
    if (adm && !c->admin) {
        char who[320];
        mfd_conn_describe(c, who, sizeof(who));
        mfd_count(&c->srv->metrics, MFD_C_ADMIN_DENIED, 1);
        mfd_info("%s refused: %s is not an admin connection", adm, who);
        mfd_conn_error(c, rid, MF_PERMISSION_DENIED,
                       "%s needs an admin connection (the admin socket, or Hello.admin_token)",
                       adm);
        return;
    }
    switch (env->body_case) {
    case MAPFLOW__V1__ENVELOPE__BODY_HELLO: handle_hello(c, rid, env->hello); break;
    case MAPFLOW__V1__ENVELOPE__BODY_PUT_BEGIN: handle_put_begin(c, rid, env->put_begin); break;
    case MAPFLOW__V1__ENVELOPE__BODY_PUT_COMMIT:
        handle_put_commit(c, rid, env->put_commit, payload, plen, t0);
        break;
    case MAPFLOW__V1__ENVELOPE__BODY_PUT_ABORT: handle_put_abort(c, rid, env->put_abort); break;
    case MAPFLOW__V1__ENVELOPE__BODY_LOOKUP:
        handle_lookup(c, rid, env->lookup, payload, plen, t0, 1, NULL, 0);
        break;
    case MAPFLOW__V1__ENVELOPE__BODY_GET:
        handle_get(c, rid, env->get, payload, plen, t0, NULL);
        break;
    case MAPFLOW__V1__ENVELOPE__BODY_REMOTE_ARENA: mfd_peers_remote_arena(c, rid); break;
    case MAPFLOW__V1__ENVELOPE__BODY_RELEASE: handle_release(c, rid, env->release); break;
    case MAPFLOW__V1__ENVELOPE__BODY_DELETE: mfd_admin_delete(c, rid, env->delete_); break;
    case MAPFLOW__V1__ENVELOPE__BODY_LIST: mfd_admin_list(c, rid, env->list); break;
    case MAPFLOW__V1__ENVELOPE__BODY_STATS: mfd_admin_stats(c, rid); break;
    case MAPFLOW__V1__ENVELOPE__BODY_EVICT: mfd_admin_evict(c, rid, env->evict); break;
    case MAPFLOW__V1__ENVELOPE__BODY_FLUSH: mfd_admin_flush(c, rid, env->flush); break;
    case MAPFLOW__V1__ENVELOPE__BODY_CONFIG_GET:
        mfd_admin_config_get(c, rid, env->config_get);
        break;
    case MAPFLOW__V1__ENVELOPE__BODY_CONFIG_SET:
        mfd_admin_config_set(c, rid, env->config_set);
        break;
    case MAPFLOW__V1__ENVELOPE__BODY_HEALTH: mfd_admin_health(c, rid); break;
    case MAPFLOW__V1__ENVELOPE__BODY_PROFILE_PUT:
        mfd_admin_profile_put(c, rid, env->profile_put);
        break;
    case MAPFLOW__V1__ENVELOPE__BODY_PROFILE_GET:
        mfd_admin_profile_get(c, rid, env->profile_get);
        break;
    default:
        mfd_conn_error(c, rid, MF_UNIMPLEMENTED, "%s is not a request this daemon serves",
                       mf_envelope_body_name((int)env->body_case));
        break;
    }
}

/* ==== connections: input ============================================================== */

static void on_writable(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    conn_flush(arg);
}

static void on_readable(evutil_socket_t fd, short what, void *arg)
{
    (void)what;
    mfd_conn_t *c = arg;
    uint8_t *p;
    size_t avail;
    if (mf_frame_reader_space(&c->rd, READ_CHUNK, &p, &avail) != MF_OK) {
        conn_close(c);
        return;
    }
    ssize_t n = read(fd, p, avail);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
        conn_close(c);
        return;
    }
    if (n < 0)
        return;
    mf_frame_reader_commit(&c->rd, (size_t)n);
    c->last_rx_ms = mfd_now_ms();
    /* Keep the connection alive across dispatch: a handler may close it. */
    mfd_conn_hold(c);
    while (!c->dead && !c->closing) {
        mf_frame_t f;
        int have;
        const char *why = NULL;
        mf_status_t st = mf_frame_reader_next(&c->rd, &f, &have, &why);
        if (st != MF_OK) {
            conn_fail(c, 0, st, why ? why : "malformed frame");
            break;
        }
        if (!have)
            break;
        mf_envelope_t *env = NULL;
        st = mf_envelope_decode(&f, &env, &why);
        if (st == MF_UNIMPLEMENTED) {
            mfd_conn_error(c, 0, MF_UNIMPLEMENTED, "%s", why);
            continue;
        }
        if (st != MF_OK) {
            conn_fail(c, 0, st, why ? why : "undecodable envelope");
            break;
        }
        mfd_server_dispatch(c, env, f.payload, f.payload_len);
        mf_envelope_free(env);
        c->partial_since_ms = 0; /* bytes left over begin the next frame */
    }
    /* frame_timeout counts from the first byte of a frame, not from the last progress, so
     * a client trickling a byte at a time cannot hold a slot forever either. */
    if (!c->dead && mf_frame_reader_pending(&c->rd) == 0)
        c->partial_since_ms = 0;
    else if (!c->dead && !c->partial_since_ms)
        c->partial_since_ms = mfd_now_ms();
    mfd_conn_unhold(c);
}

static mf_status_t adopt(mfd_server_t *s, int fd, const mfd_transport_t *tp,
                         const char *peer_name, mfd_conn_t **out)
{
    *out = NULL;
    if (s->draining || s->n_conns >= s->cfg.max_connections) {
        mfd_count(&s->metrics, MFD_C_CONN_REJECTED, 1);
        char what[96];
        snprintf(what, sizeof(what), "refusing a %s connection: %s", tp->name,
                 s->draining ? "draining" : "max_connections reached");
        accept_warn(s, what);
        close(fd);
        return MF_UNAVAILABLE;
    }
    mfd_conn_t *c = calloc(1, sizeof(*c));
    if (!c) {
        close(fd);
        return MF_RESOURCE_EXHAUSTED;
    }
    c->srv = s;
    c->tp = tp;
    c->fd = fd;
    c->out = evbuffer_new();
    c->rev = event_new(s->base, fd, EV_READ | EV_PERSIST, on_readable, c);
    c->wev = event_new(s->base, fd, EV_WRITE | EV_PERSIST, on_writable, c);
    if (!c->out || !c->rev || !c->wev ||
        mf_frame_reader_init(&c->rd, (uint32_t)s->cfg.max_frame) != MF_OK) {
        if (c->rev)
            event_free(c->rev);
        if (c->wev)
            event_free(c->wev);
        close(fd);
        conn_free(c);
        return MF_RESOURCE_EXHAUSTED;
    }
    snprintf(c->peer, sizeof(c->peer), "%s", peer_name);
    c->accepted_ms = c->last_rx_ms = mfd_now_ms();
    c->next = s->conns;
    if (s->conns)
        s->conns->prev = c;
    s->conns = c;
    s->n_conns++;
    mfd_count(&s->metrics, MFD_C_CONN_ACCEPTED, 1);
    event_add(c->rev, NULL);
    *out = c;
    return MF_OK;
}

mf_status_t mfd_server_adopt(mfd_server_t *s, int fd, const mfd_transport_t *tp,
                             const char *peer_name)
{
    mfd_conn_t *c;
    return adopt(s, fd, tp, peer_name, &c);
}

static void on_accept(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa,
                      int socklen, void *arg)
{
    (void)socklen;
    mfd_server_t *s = arg;
    const mfd_transport_t *tp = sa->sa_family == AF_UNIX ? &mfd_transport_unix
                                                         : &mfd_transport_tcp;
    char peer[80];
    if (sa->sa_family == AF_INET) {
        struct sockaddr_in *in = (struct sockaddr_in *)sa;
        char ip[INET_ADDRSTRLEN];
        inet_ntop(AF_INET, &in->sin_addr, ip, sizeof(ip));
        snprintf(peer, sizeof(peer), "tcp:%s:%u", ip, ntohs(in->sin_port));
    } else if (sa->sa_family == AF_INET6) {
        snprintf(peer, sizeof(peer), "tcp6:#%d", fd);
    } else {
        snprintf(peer, sizeof(peer), "%s:#%d", l == s->admin_l ? "admin" : "unix", fd);
    }
    mfd_conn_t *c;
    if (adopt(s, fd, tp, peer, &c) != MF_OK)
        return;
    if (l == s->admin_l)
        c->admin = MFD_ADMIN_SOCKET;
    struct ucred uc;
    socklen_t ul = sizeof(uc);
    if (sa->sa_family == AF_UNIX && getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &uc, &ul) == 0)
        snprintf(c->creds, sizeof(c->creds), "pid %d uid %u", (int)uc.pid, (unsigned)uc.uid);
}

/* evhttp's listener calls back with evhttp's argument, not ours: it only stops itself
 * (libevent would log and retry in a loop) and the tick turns it on again. */
static void on_http_accept_error(struct evconnlistener *l, void *arg)
{
    (void)arg;
    static uint64_t last_ms, suppressed;
    int err = EVUTIL_SOCKET_ERROR();
    uint64_t now = mfd_now_ms();
    evconnlistener_disable(l);
    if (last_ms && now - last_ms < 10000) {
        suppressed++;
        return;
    }
    mfd_warn("http accept: %s; paused for a tick (%llu more such events not logged)",
             strerror(err), (unsigned long long)suppressed);
    last_ms = now;
    suppressed = 0;
}

/* accept() failed. At the descriptor limit the listening socket stays readable, so
 * accepting on would spin: stop listening until a connection closes (or a tick passes). */
static void on_accept_error(struct evconnlistener *l, void *arg)
{
    (void)l;
    mfd_server_t *s = arg;
    int err = EVUTIL_SOCKET_ERROR();
    char what[160];
    snprintf(what, sizeof(what), "accept: %s%s", strerror(err),
             err == EMFILE || err == ENFILE ? "; not accepting until a descriptor is free" : "");
    accept_warn(s, what);
    if (err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM) {
        if (!s->accept_paused)
            mfd_count(&s->metrics, MFD_C_ACCEPT_PAUSED, 1);
        s->accept_paused = 1;
        set_listening(s, 0);
    }
}

/* ==== listeners ======================================================================= */

/* The tenant socket (0660) or the admin socket (0600: only our user runs admin requests
 * through it). */
static mf_status_t listen_unix(mfd_server_t *s, const char *path, mode_t mode,
                               struct evconnlistener **out, char *bound, size_t bound_len,
                               char *err, size_t errlen)
{
    struct sockaddr_un sun = {0};
    sun.sun_family = AF_UNIX;
    if (strlen(path) >= sizeof(sun.sun_path)) {
        snprintf(err, errlen, "socket path longer than %zu bytes: %s", sizeof(sun.sun_path) - 1,
                 path);
        return MF_INVALID_ARGUMENT;
    }
    strcpy(sun.sun_path, path);
    struct stat sb;
    if (lstat(sun.sun_path, &sb) == 0) {
        if (!S_ISSOCK(sb.st_mode)) {
            snprintf(err, errlen, "%s exists and is not a socket", sun.sun_path);
            return MF_ALREADY_EXISTS;
        }
        /* A live daemon answers; a stale socket file from a crash does not. */
        int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        int alive = probe >= 0 && connect(probe, (struct sockaddr *)&sun, sizeof(sun)) == 0;
        if (probe >= 0)
            close(probe);
        if (alive) {
            snprintf(err, errlen, "another daemon is listening on %s", sun.sun_path);
            return MF_ALREADY_EXISTS;
        }
        unlink(sun.sun_path);
    }
    /* Created without group/other access at all, then opened up to `mode`: no window in
     * which another user can connect to the admin socket. */
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    mode_t old = umask(0177);
    int bad = fd < 0 || bind(fd, (struct sockaddr *)&sun, sizeof(sun)) != 0;
    umask(old);
    if (bad || chmod(sun.sun_path, mode) != 0 || listen(fd, 128) != 0) {
        snprintf(err, errlen, "unix socket %s: %s", sun.sun_path, strerror(errno));
        if (fd >= 0)
            close(fd);
        return MF_UNAVAILABLE;
    }
    *out = evconnlistener_new(s->base, on_accept, s, LEV_OPT_CLOSE_ON_FREE, -1, fd);
    if (!*out) {
        close(fd);
        snprintf(err, errlen, "cannot listen on %s", sun.sun_path);
        return MF_UNAVAILABLE;
    }
    evconnlistener_set_error_cb(*out, on_accept_error);
    snprintf(bound, bound_len, "%s", sun.sun_path);
    mfd_info("listening on %s:%s (mode %04o)", out == &s->admin_l ? "admin" : "unix", bound,
             (unsigned)mode);
    return MF_OK;
}

/* host:port as bound, with the real port when 0 was asked for. */
void mfd_format_bound(int fd, char *out, size_t n)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    char ip[INET6_ADDRSTRLEN] = "?";
    unsigned port = 0;
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) == 0) {
        if (ss.ss_family == AF_INET) {
            inet_ntop(AF_INET, &((struct sockaddr_in *)&ss)->sin_addr, ip, sizeof(ip));
            port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
        } else if (ss.ss_family == AF_INET6) {
            inet_ntop(AF_INET6, &((struct sockaddr_in6 *)&ss)->sin6_addr, ip, sizeof(ip));
            port = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
        }
    }
    snprintf(out, n, ss.ss_family == AF_INET6 ? "[%s]:%u" : "%s:%u", ip, port);
}

static mf_status_t listen_tcp(mfd_server_t *s, char *err, size_t errlen)
{
    struct sockaddr_storage ss;
    socklen_t len;
    if (mf_addr_resolve(s->cfg.tcp, 1, &ss, &len) != MF_OK) {
        snprintf(err, errlen, "tcp: cannot parse '%s' as host:port", s->cfg.tcp);
        return MF_INVALID_ARGUMENT;
    }
    if (!mf_addr_is_loopback(&ss) && !s->cfg.token[0]) {
        snprintf(err, errlen,
                 "tcp: refusing to listen on non-loopback %s without a token (set `token`)",
                 s->cfg.tcp);
        return MF_FAILED_PRECONDITION;
    }
    s->tcp_l = evconnlistener_new_bind(s->base, on_accept, s,
                                       LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE |
                                           LEV_OPT_CLOSE_ON_EXEC,
                                       128, (struct sockaddr *)&ss, (int)len);
    if (!s->tcp_l) {
        snprintf(err, errlen, "tcp: cannot listen on %s: %s", s->cfg.tcp, strerror(errno));
        return MF_UNAVAILABLE;
    }
    evconnlistener_set_error_cb(s->tcp_l, on_accept_error);
    mfd_format_bound(evconnlistener_get_fd(s->tcp_l), s->tcp_addr, sizeof(s->tcp_addr));
    mfd_info("listening on tcp:%s%s", s->tcp_addr, s->cfg.token[0] ? " (token required)" : "");
    return MF_OK;
}

/* ==== timers and signals ============================================================== */

static void expire_ticket(mfd_ticket_t *t, void *arg)
{
    mfd_server_t *s = arg;
    mfd_count(&s->metrics, t->kind == MFD_TICKET_LEASE ? MFD_C_LEASES_EXPIRED
                                                       : MFD_C_RESERVATIONS_EXPIRED,
              t->kind == MFD_TICKET_LEASE ? ((lease_t *)t)->live : 1);
    release_ticket(t, s);
}

/* Closes connections whose partial frame is older than frame_timeout (not while we stopped
 * reading them for backpressure: that wait is ours). */
static void expire_partial_frames(mfd_server_t *s, uint64_t now)
{
    uint64_t limit = s->cfg.frame_timeout_ms;
    if (!limit)
        return;
    for (mfd_conn_t *c = s->conns, *next; c; c = next) {
        next = c->next;
        if (c->dead || c->closing || c->read_paused || !c->partial_since_ms ||
            now - c->partial_since_ms < limit)
            continue;
        mfd_warn("connection %s (%s): %zu bytes of a frame waited %llu ms for the rest "
                 "(frame_timeout %llu ms), closing",
                 c->peer, c->name[0] ? c->name : "no hello", mf_frame_reader_pending(&c->rd),
                 (unsigned long long)(now - c->partial_since_ms), (unsigned long long)limit);
        mfd_count(&s->metrics, MFD_C_CONN_FRAME_TIMEOUT, 1);
        conn_close(c);
    }
}

/* Closes connections that never sent Hello within hello_timeout, or sent nothing for
 * idle_timeout while awaiting no reply (each holds a descriptor and a slot). */
static void expire_silent(mfd_server_t *s, uint64_t now)
{
    uint64_t hello = s->cfg.hello_timeout_ms, idle = s->cfg.idle_timeout_ms;
    for (mfd_conn_t *c = s->conns, *next; c; c = next) {
        next = c->next;
        if (c->dead || c->closing)
            continue;
        if (!c->hello_done && hello && now - c->accepted_ms >= hello) {
            mfd_info("connection %s: no Hello within hello_timeout (%llu ms), closing", c->peer,
                     (unsigned long long)hello);
            mfd_count(&s->metrics, MFD_C_CONN_HELLO_TIMEOUT, 1);
            conn_close(c);
        } else if (c->hello_done && idle && !c->pending && !c->read_paused &&
                   now - c->last_rx_ms >= idle) {
            mfd_info("connection %s (%s): silent for idle_timeout (%llu ms), closing", c->peer,
                     c->name, (unsigned long long)idle);
            mfd_count(&s->metrics, MFD_C_CONN_IDLE_TIMEOUT, 1);
            conn_close(c);
        }
    }
}

static void on_tick(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    mfd_server_t *s = arg;
    uint64_t now = mfd_now_ms();
    mfd_tickets_expire(s->tickets, now, expire_ticket, s);
    expire_partial_frames(s, now);
    expire_silent(s, now);
    /* Descriptors may come free without a connection closing (RocksDB files, peers). */
    accept_resume(s);
    if (s->http_l && !s->draining)
        evconnlistener_enable(s->http_l);
}

static void on_signal(evutil_socket_t sig, short what, void *arg)
{
    (void)what;
    mfd_server_t *s = arg;
    if (sig == SIGHUP) {
        char err[MFD_CONFIG_ERRLEN];
        mfd_notify_reloading();
        if (mfd_server_reload(s, err, sizeof(err)) != MF_OK)
            mfd_error("reload failed, keeping the running configuration: %s", err);
        mfd_notify_ready("serving");
        return;
    }
    mfd_info("%s: draining", sig == SIGTERM ? "SIGTERM" : "SIGINT");
    mfd_server_stop(s);
}

static void on_stop(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    event_base_loopbreak(((mfd_server_t *)arg)->base);
}

void mfd_server_stop(mfd_server_t *s)
{
    /* An activated event survives until the loop runs; a bare loopbreak issued before
     * event_base_dispatch would be cleared by it. */
    event_active(s->stop_ev, EV_READ, 0);
}

/* ==== lifecycle ======================================================================= */

mf_status_t mfd_server_create(mfd_config_t *cfg, const char *config_path,
                              char *const *overrides, size_t n_overrides,
                              mfd_server_t **out, char *err, size_t errlen)
{
    mfd_server_t *s = calloc(1, sizeof(*s));
    if (!s)
        return MF_RESOURCE_EXHAUSTED;
    s->cfg = *cfg;
    memset(cfg, 0, sizeof(*cfg));
    s->start_ms = mfd_now_ms();
    mfd_metrics_init(&s->metrics);
    mf_status_t st = MF_RESOURCE_EXHAUSTED;
    if (config_path && !(s->config_path = strdup(config_path)))
        goto fail;
    if (n_overrides) {
        s->overrides = calloc(n_overrides * 2, sizeof(char *));
        if (!s->overrides)
            goto fail;
        s->n_overrides = n_overrides;
        for (size_t i = 0; i < 2 * n_overrides; i++)
            if (!(s->overrides[i] = strdup(overrides[i])))
                goto fail;
    }
    mfd_log_set_level((mfd_log_level_t)s->cfg.log_level);
    if ((st = mfd_config_resolve_paths(&s->cfg, err, errlen)) != MF_OK)
        goto fail;
    /* mfd_server_stop may come from another thread (tests, embedding). */
    evthread_use_pthreads();
    s->base = event_base_new();
    if (!s->base || mfd_tickets_create(&s->tickets) != MF_OK) {
        snprintf(err, errlen, "cannot create the event loop");
        st = MF_INTERNAL;
        goto fail;
    }
    mfd_info("mapflowd %s starting: socket %s, data_dir %s", MFD_VERSION_STR, s->cfg.socket,
             s->cfg.data_dir);
    if ((st = mfd_store_open(&s->store, &s->cfg, &s->metrics, err, errlen)) != MF_OK)
        goto fail;
    s->store.cfg = &s->cfg;
    mfd_gpu_t *g = s->store.gpu;
    if (!g)
        mfd_info("gpu tier off: %s", s->store.gpu_why);
    for (size_t i = 0; g && i < g->n; i++)
        mfd_info("gpu tier: arena %zu on device %d (%s), %llu bytes, watermarks %.2f/%.2f%s", i,
                 g->a[i].ordinal, g->a[i].pci, (unsigned long long)g->a[i].bytes,
                 s->cfg.high_watermark, s->cfg.low_watermark,
                 s->cfg.gpu_promote ? ", gpu_promote on" : "");
    if (g)
        mfd_info("gpu tier: rows validated on the %s (%s)", g->verify_gpu ? "GPU" : "host",
                 g->verify_why);
    mfd_info("host tier: %llu bytes (memfd), watermarks %.2f/%.2f",
             (unsigned long long)mfd_arena_capacity(s->store.arena), s->cfg.high_watermark,
             s->cfg.low_watermark);
    if (s->store.ssd)
        mfd_info("ssd tier: budget %llu bytes in %s/rocksdb, write_through %s",
                 (unsigned long long)s->cfg.ssd_bytes, s->cfg.data_dir,
                 s->cfg.write_through == MFD_WT_OFF     ? "off"
                 : s->cfg.write_through == MFD_WT_ASYNC ? "async"
                                                        : "sync");
    else
        mfd_info("ssd tier off (ssd_bytes 0)");
    if ((st = mfd_store_attach(&s->store, s->base)) != MF_OK) {
        snprintf(err, errlen, "cannot attach the SSD tier to the loop");
        goto fail;
    }
    if (s->cfg.max_unsent < s->cfg.max_frame) {
        snprintf(err, errlen, "max_unsent (%llu) must be at least max_frame (%llu): one reply "
                 "may be that large", (unsigned long long)s->cfg.max_unsent,
                 (unsigned long long)s->cfg.max_frame);
        st = MF_INVALID_ARGUMENT;
        goto fail;
    }
    if ((st = listen_unix(s, s->cfg.socket, 0660, &s->unix_l, s->unix_path,
                          sizeof(s->unix_path), err, errlen)) != MF_OK)
        goto fail;
    if (strcmp(s->cfg.admin_socket, s->cfg.socket) == 0) {
        snprintf(err, errlen, "admin_socket must differ from socket (%s)", s->cfg.socket);
        st = MF_INVALID_ARGUMENT;
        goto fail;
    }
    if ((st = listen_unix(s, s->cfg.admin_socket, 0600, &s->admin_l, s->admin_path,
                          sizeof(s->admin_path), err, errlen)) != MF_OK)
        goto fail;
    if (s->cfg.tcp[0] && (st = listen_tcp(s, err, errlen)) != MF_OK)
        goto fail;
    if ((st = mfd_peers_create(s, &s->peers, err, errlen)) != MF_OK)
        goto fail;
    if (s->cfg.http[0] && (st = mfd_http_start(s, err, errlen)) != MF_OK)
        goto fail;
    if (s->http_l)
        evconnlistener_set_error_cb(s->http_l, on_http_accept_error);
    s->sig_term = evsignal_new(s->base, SIGTERM, on_signal, s);
    s->sig_int = evsignal_new(s->base, SIGINT, on_signal, s);
    s->sig_hup = evsignal_new(s->base, SIGHUP, on_signal, s);
    s->tick = event_new(s->base, -1, EV_PERSIST, on_tick, s);
    s->stop_ev = event_new(s->base, -1, 0, on_stop, s);
    struct timeval tv = {0, TICK_MS * 1000};
    if (!s->sig_term || !s->sig_int || !s->sig_hup || !s->tick || !s->stop_ev || event_add(s->sig_term, NULL) ||
        event_add(s->sig_int, NULL) || event_add(s->sig_hup, NULL) || event_add(s->tick, &tv)) {
        snprintf(err, errlen, "cannot install signal handlers");
        st = MF_INTERNAL;
        goto fail;
    }
    s->ready = 1;
    *out = s;
    return MF_OK;
fail:
    mfd_server_destroy(s);
    return st;
}

mf_status_t mfd_server_run(mfd_server_t *s)
{
    char status[4400];
    snprintf(status, sizeof(status), "serving on unix:%s%s%s", s->unix_path,
             s->tcp_addr[0] ? " tcp:" : "", s->tcp_addr);
    mfd_info("ready");
    mfd_notify_ready(status);
    event_base_dispatch(s->base);
    /* Drain: stop taking work, finish SSD writes (durable puts), then close clients. */
    s->draining = 1;
    s->ready = 0;
    mfd_notify_stopping();
    if (s->unix_l) {
        evconnlistener_free(s->unix_l);
        s->unix_l = NULL;
        unlink(s->unix_path);
    }
    if (s->admin_l) {
        evconnlistener_free(s->admin_l);
        s->admin_l = NULL;
        unlink(s->admin_path);
    }
    if (s->tcp_l) {
        evconnlistener_free(s->tcp_l);
        s->tcp_l = NULL;
    }
    mfd_peers_stop_listening(s->peers);
    mfd_store_drain(&s->store);
    while (s->conns) {
        mfd_conn_t *c = s->conns;
        if (evbuffer_get_length(c->out))
            evbuffer_write(c->out, c->fd); /* best effort: replies already made */
        conn_close(c);
    }
    mfd_info("stopped");
    return MF_OK;
}

void mfd_server_destroy(mfd_server_t *s)
{
    if (!s)
        return;
    while (s->conns)
        conn_close(s->conns);
    if (s->tickets) {
        mfd_tickets_all(s->tickets, release_ticket, s);
    }
    mfd_http_stop(s);
    if (s->unix_l) {
        evconnlistener_free(s->unix_l);
        unlink(s->unix_path);
    }
    if (s->admin_l) {
        evconnlistener_free(s->admin_l);
        unlink(s->admin_path);
    }
    if (s->tcp_l)
        evconnlistener_free(s->tcp_l);
    /* Before the store: failing peer fetches unreserves their arena blocks. */
    mfd_peers_destroy(s->peers);
    s->peers = NULL;
    if (s->store.ix) {
        /* Closing the store runs pending SSD callbacks; they may still name connections. */
        mfd_store_close(&s->store);
    }
    if (s->tickets)
        mfd_tickets_destroy(s->tickets);
    if (s->sig_term)
        event_free(s->sig_term);
    if (s->sig_int)
        event_free(s->sig_int);
    if (s->sig_hup)
        event_free(s->sig_hup);
    if (s->tick)
        event_free(s->tick);
    if (s->stop_ev)
        event_free(s->stop_ev);
    if (s->base)
        event_base_free(s->base);
    for (size_t i = 0; s->overrides && i < 2 * s->n_overrides; i++)
        free(s->overrides[i]);
    free(s->overrides);
    free(s->config_path);
    mfd_config_deinit(&s->cfg);
    free(s);
}

/* ==== config ========================================================================== */

mf_status_t mfd_server_config_set(mfd_server_t *s, const char *key, const char *value,
                                  const char *who, char *err, size_t errlen)
{
    mf_status_t st = mfd_config_set(&s->cfg, key, value, 1, err, errlen);
    if (st == MF_OK) {
        mfd_log_set_level((mfd_log_level_t)s->cfg.log_level);
        char v[256];
        mfd_config_get(&s->cfg, key, 1, v, sizeof(v));
        mfd_info("config: %s = %s (set by %s)", key, v, who);
    } else {
        mfd_info("config: set %s refused (by %s): %s", key, who, err);
    }
    return st;
}

/* Appends ", name" (or "name" first) to a bounded list; "..." once it is full. */
static size_t append_name(char *buf, size_t cap, size_t len, const char *name)
{
    if (len + 4 >= cap)
        return len;
    int n = snprintf(buf + len, cap - len, "%s%s", len ? ", " : "", name);
    if (n < 0 || (size_t)n >= cap - len - 4) {
        snprintf(buf + len, cap - len, "%s...", len ? ", " : "");
        return cap;
    }
    return len + (size_t)n;
}

mf_status_t mfd_server_reload(mfd_server_t *s, char *err, size_t errlen)
{
    if (!s->config_path) {
        mfd_info("SIGHUP: no config file (-c) to reload");
        return MF_OK;
    }
    mfd_config_t fresh;
    mf_status_t st = mfd_config_init(&fresh);
    if (st != MF_OK)
        return st;
    st = mfd_config_load_file(&fresh, s->config_path, err, errlen);
    for (size_t i = 0; st == MF_OK && i < s->n_overrides; i++)
        st = mfd_config_set(&fresh, s->overrides[2 * i], s->overrides[2 * i + 1], 0, err, errlen);
    if (st != MF_OK) {
        mfd_config_deinit(&fresh);
        return st;
    }
    /* Resolve auto paths the same way so they do not read as changes. */
    char e2[MFD_CONFIG_ERRLEN];
    if (!fresh.socket[0])
        mfd_config_set(&fresh, "socket", s->cfg.socket, 0, e2, sizeof(e2));
    if (!fresh.data_dir[0])
        mfd_config_set(&fresh, "data_dir", s->cfg.data_dir, 0, e2, sizeof(e2));
    if (!fresh.admin_socket[0])
        mfd_config_set(&fresh, "admin_socket", s->cfg.admin_socket, 0, e2, sizeof(e2));
    /* token / token_file are one setting (a rotated file, or a switch between the two,
     * would fail key by key): take them together. */
    int token_changed = 0;
    if (mfd_config_take_token(&s->cfg, &fresh, &token_changed) != MF_OK) {
        mfd_config_deinit(&fresh);
        return MF_RESOURCE_EXHAUSTED;
    }
    if (token_changed)
        mfd_info("reload: token changed%s", s->cfg.token_from_file ? " (token_file)" : "");
    /* Watermarks are a pair: widen first so either order of assignment is valid; their
     * values from before the widening are what a change is judged against. */
    char wm_old[2][64];
    mfd_config_get(&s->cfg, "high_watermark", 0, wm_old[0], sizeof(wm_old[0]));
    mfd_config_get(&s->cfg, "low_watermark", 0, wm_old[1], sizeof(wm_old[1]));
    s->cfg.high_watermark = 1.0;
    s->cfg.low_watermark = 0.0;
    size_t changed = (size_t)token_changed;
    char names[512] = "";
    size_t nlen = 0;
    if (token_changed)
        nlen = append_name(names, sizeof(names), nlen, "token");
    for (size_t i = 0; i < mfd_config_count(); i++) {
        const char *k = mfd_config_key(i);
        int wm = !strcmp(k, "high_watermark") ? 0 : !strcmp(k, "low_watermark") ? 1 : -1;
        char a[4352], b[4352];
        if (wm >= 0)
            snprintf(a, sizeof(a), "%s", wm_old[wm]);
        else
            mfd_config_get(&s->cfg, k, 0, a, sizeof(a));
        mfd_config_get(&fresh, k, 0, b, sizeof(b));
        if (strcmp(a, b) == 0 && wm < 0)
            continue;
        if (mfd_config_is_live(k)) {
            /* A watermark is set back even when unchanged (it was widened above). */
            if (mfd_config_set(&s->cfg, k, b, 1, e2, sizeof(e2)) == MF_OK && strcmp(a, b)) {
                changed++;
                nlen = append_name(names, sizeof(names), nlen, k);
            }
        } else {
            mfd_warn("reload: %s changed in %s but needs a restart; keeping %s", k,
                     s->config_path, a);
        }
    }
    /* A peers file may change under the same path: compare what it lists. */
    if (strcmp(fresh.peer_list, s->cfg.peer_list) != 0) {
        char *t = s->cfg.peer_list;
        s->cfg.peer_list = fresh.peer_list;
        fresh.peer_list = t;
        mfd_info("reload: peers changed");
        nlen = append_name(names, sizeof(names), nlen, "peers");
        changed++;
    }
    mfd_log_set_level((mfd_log_level_t)s->cfg.log_level);
    mfd_config_deinit(&fresh);
    mfd_info("reloaded %s: %zu live keys changed%s%s", s->config_path, changed,
             changed ? ": " : "", names);
    return MF_OK;
}

/* ==== views =========================================================================== */

void mfd_server_tiers(mfd_server_t *s, mfd_tier_info_t out[3])
{
    memset(out, 0, 3 * sizeof(*out));
    mfd_gpu_t *g = s->store.gpu;
    out[0] = (mfd_tier_info_t){MAPFLOW__V1__TIER__TIER_GPU, "gpu", g != NULL, mfd_gpu_used(g),
                               mfd_gpu_capacity(g), s->store.gpu_entries,
                               g ? NULL : s->store.gpu_why};
    out[1] = (mfd_tier_info_t){MAPFLOW__V1__TIER__TIER_HOST, "host", 1,
                               mfd_arena_used(s->store.arena),
                               mfd_arena_capacity(s->store.arena), s->store.host_entries, NULL};
    out[2] = (mfd_tier_info_t){MAPFLOW__V1__TIER__TIER_SSD, "ssd", s->store.ssd != NULL,
                               s->store.ssd_used, s->store.ssd ? s->cfg.ssd_bytes : 0,
                               s->store.ssd_entries, s->store.ssd ? NULL : "ssd_bytes is 0"};
}

void mfd_server_gauges(mfd_server_t *s, mfd_gauges_t *g)
{
    memset(g, 0, sizeof(*g));
    mfd_tier_info_t t[3];
    mfd_server_tiers(s, t);
    for (int i = 0; i < 3; i++)
        g->tiers[i] = (mfd_tier_gauge_t){t[i].name, t[i].enabled, t[i].used_bytes,
                                         t[i].capacity_bytes, t[i].entries};
    for (size_t i = 0; s->store.gpu && i < s->store.gpu->n && i < MFD_GAUGE_GPU_ARENAS; i++) {
        const mfd_gpu_arena_t *a = &s->store.gpu->a[i];
        g->gpu[g->n_gpu++] = (mfd_gpu_gauge_t){a->ordinal, mfd_oalloc_used(a->alloc), a->bytes,
                                               a->entries};
    }
    g->connections = s->n_conns;
    g->leases = s->leased_rows;
    g->reservations = mfd_tickets_count(s->tickets, MFD_TICKET_RESERVATION);
    g->ssd_inflight = s->store.ssd ? mfd_ssd_inflight(s->store.ssd) : 0;
    g->wt_backlog_bytes = s->store.wt_bytes + s->store.wt_deferred_bytes;
    g->uptime_s = (double)(mfd_now_ms() - s->start_ms) / 1000.0;
    g->ready = s->ready;
    g->version = MFD_VERSION_STR;
}
