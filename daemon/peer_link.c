/* peer_link — links to peer daemons: Hello, RemoteArena, calls and their deadlines
 * (see peer_link.h). */
#include "peer_link.h"
#include "conn.h"
#include "log.h"
#include "mf_clock.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

peer_stat_t *mfd_peer_stat(mfd_peers_t *ps, const char *addr)
{
    for (size_t i = 0; i < ps->n_stats; i++)
        if (strcmp(ps->stats[i].addr, addr) == 0)
            return &ps->stats[i];
    if (ps->n_stats == MAX_PEER_STATS) {
        snprintf(ps->stats[MAX_PEER_STATS].addr, sizeof(ps->stats[0].addr), "other");
        return &ps->stats[MAX_PEER_STATS];
    }
    peer_stat_t *s = &ps->stats[ps->n_stats++];
    snprintf(s->addr, sizeof(s->addr), "%s", addr);
    return s;
}

/* ==== links ============================================================================ */

void mfd_link_unref(link_t *l)
{
    if (--l->refs > 0)
        return;
    mf_session_deinit(&l->sess);
    free(l);
}

/* The link is done for: fail its calls and waiters, close the endpoint, leave the cache. */
void mfd_link_kill(link_t *l, mf_status_t st, const char *fmt, ...)
{
    if (l->dead)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(l->why, sizeof(l->why), fmt, ap);
    va_end(ap);
    l->dead = 1;
    l->dead_st = st;
    l->stat->errors++;
    mfd_peers_t *ps = l->ps;
    mfd_log(ps->destroying ? MFD_LOG_DEBUG : MFD_LOG_WARN, "peer %s (namespace '%s'): %s: %s",
            l->addr, l->ns, mf_status_name(st), l->why);
    for (link_t **pp = &ps->links; *pp; pp = &(*pp)->next)
        if (*pp == l) {
            *pp = l->next;
            break;
        }
    l->refs++; /* callbacks below may drop the last operation's reference */
    mfd_ucx_close(l->ep);
    l->ep = NULL;
    while (l->waiters) {
        waiter_t *w = l->waiters;
        l->waiters = w->next;
        w->fn(w->arg, st, l->why);
        free(w);
    }
    call_t *c;
    while ((c = mf_session_drain(&l->sess, NULL))) {
        c->cb(c->arg, st, l->why, NULL, NULL);
        free(c);
    }
    l->refs--;  /* the cache's reference */
    mfd_link_unref(l);
}

mf_status_t mfd_link_call(link_t *l, mf_envelope_t *env, const void *payload, size_t plen,
                             reply_cb cb, void *arg)
{
    if (l->dead)
        return l->dead_st;
    call_t *c = malloc(sizeof(*c));
    if (!c)
        return MF_RESOURCE_EXHAUSTED;
    *c = (call_t){cb, arg};
    uint64_t rid;
    mf_status_t st = mf_session_add(&l->sess, mf_now_ms() + MFD_PEER_CALL_MS, c, &rid);
    if (st != MF_OK) {
        free(c);
        return st;
    }
    env->request_id = rid;
    uint8_t *frame;
    size_t flen;
    st = mf_frame_encode(env, payload, plen, l->ps->max_frame, &frame, &flen);
    if (st == MF_OK) {
        st = mfd_ucx_send(l->ep, frame, flen);
        free(frame);
    }
    if (st != MF_OK) {
        free(mf_session_take(&l->sess, rid));
        return st;
    }
    l->stat->requests++;
    return MF_OK;
}

static void link_ready(link_t *l)
{
    mfd_debug("peer %s (namespace '%s'): ready", l->addr, l->ns);
    l->refs++;
    while (l->waiters && mfd_link_ready(l)) {
        waiter_t *w = l->waiters;
        l->waiters = w->next;
        w->fn(w->arg, MF_OK, NULL);
        free(w);
    }
    mfd_link_unref(l);
}

static void on_arena_reply(void *arg, mf_status_t st, const char *why, const mf_envelope_t *env,
                           const mf_frame_t *f)
{
    (void)f;
    link_t *l = arg;
    char err[200];
    if (st == MF_OK)
        st = mf_session_far_arena(&l->far, env, err, sizeof(err));
    else
        snprintf(err, sizeof(err), "%s", why);
    if (st != MF_OK) {
        mfd_link_kill(l, st, "RemoteArena: %s", err);
        return;
    }
    const Mapflow__V1__RemoteArenaReply *r = env->remote_arena_reply;
    st = mfd_ucx_set_remote(l->ep, r->address, r->bytes, r->rkey.data, r->rkey.len);
    if (st != MF_OK) {
        mfd_link_kill(l, st == MF_UNAVAILABLE ? st : MF_INTERNAL, "cannot use the peer's rkey");
        return;
    }
    link_ready(l);
}

static void on_hello_reply(void *arg, mf_status_t st, const char *why, const mf_envelope_t *env,
                           const mf_frame_t *f)
{
    (void)f;
    link_t *l = arg;
    char err[200];
    if (st == MF_OK)
        st = mf_session_far_hello(&l->far, env, l->ps->max_frame,
                                  MF_SESSION_NEED_ARENA | MF_SESSION_REMOTE, err, sizeof(err));
    else
        snprintf(err, sizeof(err), "%s", why);
    if (st != MF_OK) {
        mfd_link_kill(l, st, "Hello: %s", err);
        return;
    }
    l->max_batch = l->far.max_batch ? l->far.max_batch : 1;
    Mapflow__V1__RemoteArena ra = MAPFLOW__V1__REMOTE_ARENA__INIT;
    mf_envelope_t e = MAPFLOW__V1__ENVELOPE__INIT;
    e.body_case = MAPFLOW__V1__ENVELOPE__BODY_REMOTE_ARENA;
    e.remote_arena = &ra;
    if ((st = mfd_link_call(l, &e, NULL, 0, on_arena_reply, l)) != MF_OK)
        mfd_link_kill(l, st, "cannot send RemoteArena");
}

static void link_on_frame(void *arg, const uint8_t *frame, size_t len)
{
    link_t *l = arg;
    mf_frame_t f;
    size_t used;
    const char *why = NULL;
    mf_envelope_t *env = NULL;
    if (mf_frame_parse(frame, len, l->ps->max_frame, &f, &used, &why) != MF_OK ||
        mf_envelope_decode(&f, &env, &why) != MF_OK) {
        mfd_link_kill(l, MF_INTERNAL, "undecodable frame from the peer: %s", why ? why : "?");
        return;
    }
    char err[256];
    mf_status_t st = mf_session_reply_status(env, 0, err, sizeof(err));
    call_t *c = mf_session_take(&l->sess, env->request_id);
    if (!c) { /* an error nobody asked for ends the link; other strays are dropped */
        if (st != MF_OK)
            mfd_link_kill(l, st, "%s", err);
        mf_envelope_free(env);
        return;
    }
    c->cb(c->arg, st, st == MF_OK ? NULL : err, env, &f);
    free(c);
    mf_envelope_free(env);
}

static void link_on_error(void *arg, mf_status_t st, const char *why)
{
    link_t *l = arg;
    mfd_link_kill(l, st == MF_CANCELLED ? MF_UNAVAILABLE : st, "connection failed: %s", why);
}

link_t *mfd_link_get(mfd_peers_t *ps, const char *addr, const char *ns, char *err,
                        size_t errlen, mf_status_t *st)
{
    for (link_t *l = ps->links; l; l = l->next)
        if (strcmp(l->addr, addr) == 0 && strcmp(l->ns, ns) == 0)
            return l;
    link_t *l = calloc(1, sizeof(*l));
    if (!l) {
        *st = MF_RESOURCE_EXHAUSTED;
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    l->ps = ps;
    snprintf(l->addr, sizeof(l->addr), "%s", addr);
    snprintf(l->ns, sizeof(l->ns), "%s", ns);
    l->stat = mfd_peer_stat(ps, addr);
    mf_session_init(&l->sess, 0);
    mfd_ucx_ep_cbs_t cbs = {link_on_frame, link_on_error, l};
    if ((*st = mfd_ucx_connect(ps->ucx, addr, &cbs, &l->ep, err, errlen)) != MF_OK) {
        l->stat->errors++;
        free(l);
        return NULL;
    }
    l->refs = 1;
    l->next = ps->links;
    ps->links = l;
    const char *token = ps->srv ? ps->srv->cfg.token : ps->token;
    Mapflow__V1__Hello h;
    mf_session_hello_init(&h, l->ns, token, "mapflowd-peer", 1);
    mf_envelope_t e = MAPFLOW__V1__ENVELOPE__INIT;
    e.body_case = MAPFLOW__V1__ENVELOPE__BODY_HELLO;
    e.hello = &h;
    if ((*st = mfd_link_call(l, &e, NULL, 0, on_hello_reply, l)) != MF_OK) {
        snprintf(err, errlen, "cannot send Hello to %s", addr);
        mfd_link_kill(l, *st, "cannot send Hello");
        return NULL;
    }
    mfd_info("peer %s (namespace '%s'): connecting over UCX", addr, ns);
    return l;
}

/* fn runs once: now if the link is ready, else when it becomes ready or dies. */
void mfd_link_when_ready(link_t *l, ready_cb fn, void *arg)
{
    if (mfd_link_ready(l)) {
        fn(arg, MF_OK, NULL);
        return;
    }
    waiter_t *w = malloc(sizeof(*w));
    if (!w) {
        fn(arg, MF_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    *w = (waiter_t){fn, arg, NULL};
    waiter_t **pp = &l->waiters;
    while (*pp)
        pp = &(*pp)->next;
    *pp = w;
}

/* A peer that stops answering is as good as dead: its calls have a deadline. */
void mfd_links_sweep(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    mfd_peers_t *ps = arg;
    int64_t now = mf_now_ms();
    for (link_t *l = ps->links, *next; l; l = next) {
        next = l->next;
        if (mf_session_next_deadline(&l->sess) <= now)
            mfd_link_kill(l, MF_UNAVAILABLE, "no answer within %u ms", MFD_PEER_CALL_MS);
    }
}
