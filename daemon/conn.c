/* conn — connections: output, input, adoption; the daemon's views (see conn.h). */
#include "conn.h"
#include "mf_clock.h"
#include "log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define READ_CHUNK (64u << 10)

const mfd_transport_t mfd_transport_unix = {"unix", 0, 1};
const mfd_transport_t mfd_transport_tcp = {"tcp", 1, 0};

/* ==== connections: output ============================================================ */

static void conn_free(mfd_conn_t *c)
{
    mf_frame_reader_deinit(&c->rd);
    if (c->out)
        evbuffer_free(c->out);
    free(c);
}

/* (An accept loop at the fd limit once wrote 18.8 M lines.) */
void mfd_conn_warn_limited(mfd_server_t *s, const char *what)
{
    uint64_t dropped;
    if (mfd_log_limit_pass(&s->accept_log, mf_now_ms(), 10000, &dropped))
        mfd_warn("%s (%llu more such events not logged)", what, (unsigned long long)dropped);
}

void mfd_conn_close(mfd_conn_t *c)
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
    /* A dead client never pins memory: its leases and reservations go now (and the
     * listeners, paused at the descriptor limit, may resume). */
    size_t n = s->on_close ? s->on_close(s, c) : 0;
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

void mfd_conn_flush(mfd_conn_t *c)
{
    while (evbuffer_get_length(c->out) > 0) {
        int n = evbuffer_write(c->out, c->fd);
        if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
                break;
            mfd_debug("connection %s: write: %s", c->peer, strerror(errno));
            mfd_conn_close(c);
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
        mfd_conn_close(c);
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
        mfd_conn_close(c);
        return;
    }
    if (c->read_paused) {
        c->read_paused = 0;
        event_add(c->rev, NULL);
        /* The wait was ours, not the client's: its partial frame starts its clock now. */
        if (c->partial_since_ms)
            c->partial_since_ms = mf_now_ms();
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
    mfd_conn_flush(c);
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

void mfd_conn_fail(mfd_conn_t *c, uint64_t rid, mf_status_t code, const char *msg)
{
    mfd_conn_error(c, rid, code, "%s", msg);
    if (c->dead)
        return;
    c->closing = 1;
    event_del(c->rev);
    mfd_conn_flush(c);
}

int mfd_has_control(const char *p)
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

/* ==== connections: input ============================================================== */

static void on_writable(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    mfd_conn_flush(arg);
}

static void on_readable(evutil_socket_t fd, short what, void *arg)
{
    (void)what;
    mfd_conn_t *c = arg;
    uint8_t *p;
    size_t avail;
    if (mf_frame_reader_space(&c->rd, READ_CHUNK, &p, &avail) != MF_OK) {
        mfd_conn_close(c);
        return;
    }
    ssize_t n = read(fd, p, avail);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
        mfd_conn_close(c);
        return;
    }
    if (n < 0)
        return;
    mf_frame_reader_commit(&c->rd, (size_t)n);
    c->last_rx_ms = mf_now_ms();
    /* Keep the connection alive across dispatch: a handler may close it. */
    mfd_conn_hold(c);
    while (!c->dead && !c->closing) {
        mf_frame_t f;
        int have;
        const char *why = NULL;
        mf_status_t st = mf_frame_reader_next(&c->rd, &f, &have, &why);
        if (st != MF_OK) {
            mfd_conn_fail(c, 0, st, why ? why : "malformed frame");
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
            mfd_conn_fail(c, 0, st, why ? why : "undecodable envelope");
            break;
        }
        c->srv->dispatch(c, env, f.payload, f.payload_len);
        mf_envelope_free(env);
        c->partial_since_ms = 0; /* bytes left over begin the next frame */
    }
    /* frame_timeout counts from the first byte of a frame, not from the last progress, so
     * a client trickling a byte at a time cannot hold a slot forever either. */
    if (!c->dead && mf_frame_reader_pending(&c->rd) == 0)
        c->partial_since_ms = 0;
    else if (!c->dead && !c->partial_since_ms)
        c->partial_since_ms = mf_now_ms();
    mfd_conn_unhold(c);
}

mf_status_t mfd_conn_adopt(mfd_server_t *s, int fd, const mfd_transport_t *tp,
                           const char *peer_name, mfd_conn_t **out)
{
    if (out)
        *out = NULL;
    if (s->draining || s->n_conns >= s->cfg.max_connections) {
        mfd_count(&s->metrics, MFD_C_CONN_REJECTED, 1);
        char what[96];
        snprintf(what, sizeof(what), "refusing a %s connection: %s", tp->name,
                 s->draining ? "draining" : "max_connections reached");
        mfd_conn_warn_limited(s, what);
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
    c->accepted_ms = c->last_rx_ms = mf_now_ms();
    c->next = s->conns;
    if (s->conns)
        s->conns->prev = c;
    s->conns = c;
    s->n_conns++;
    mfd_count(&s->metrics, MFD_C_CONN_ACCEPTED, 1);
    event_add(c->rev, NULL);
    if (out)
        *out = c;
    return MF_OK;
}

/* ==== views =========================================================================== */

void mfd_server_gauges(mfd_server_t *s, mfd_gauges_t *g)
{
    memset(g, 0, sizeof(*g));
    mfd_tier_info_t t[3];
    mfd_store_tiers(&s->store, t);
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
    g->regions = mfd_tickets_count(s->tickets, MFD_TICKET_REGION);
    g->ssd_inflight = s->store.ssd ? mfd_ssd_inflight(s->store.ssd) : 0;
    g->wt_backlog_bytes = s->store.wt_bytes + s->store.wt_deferred_bytes;
    g->uptime_s = (double)(mf_now_ms() - s->start_ms) / 1000.0;
    g->ready = s->ready;
    g->version = MFD_VERSION_STR;
}
