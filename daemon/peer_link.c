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
    free(l);
}

/* The link is done for: fail its calls and waiters, close the endpoint, leave the cache. */
void mfd_link_kill(link_t *l, mf_status_t st, const char *fmt, ...)
{
    if (l->state == L_DEAD)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(l->why, sizeof(l->why), fmt, ap);
    va_end(ap);
    l->state = L_DEAD;
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
    while (l->calls) {
        call_t *c = l->calls;
        l->calls = c->next;
        c->cb(c->arg, st, l->why, NULL, NULL);
        free(c);
    }
    l->refs--;  /* the cache's reference */
    mfd_link_unref(l);
}

mf_status_t mfd_link_call(link_t *l, mf_envelope_t *env, const void *payload, size_t plen,
                             reply_cb cb, void *arg)
{
    if (l->state == L_DEAD)
        return l->dead_st;
    call_t *c = calloc(1, sizeof(*c));
    if (!c)
        return MF_RESOURCE_EXHAUSTED;
    env->request_id = ++l->next_rid;
    uint8_t *frame;
    size_t flen;
    mf_status_t st = mf_frame_encode(env, payload, plen, l->ps->max_frame, &frame, &flen);
    if (st == MF_OK) {
        st = mfd_ucx_send(l->ep, frame, flen);
        free(frame);
    }
    if (st != MF_OK) {
        free(c);
        return st;
    }
    *c = (call_t){env->request_id, mf_now_ms() + MFD_PEER_CALL_MS, cb, arg, l->calls};
    l->calls = c;
    l->stat->requests++;
    return MF_OK;
}

static void link_ready(link_t *l)
{
    l->state = L_READY;
    mfd_debug("peer %s (namespace '%s'): ready", l->addr, l->ns);
    l->refs++;
    while (l->waiters && l->state == L_READY) {
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
    if (st != MF_OK) {
        mfd_link_kill(l, st, "RemoteArena: %s", why);
        return;
    }
    if (env->body_case != MAPFLOW__V1__ENVELOPE__BODY_REMOTE_ARENA_REPLY) {
        mfd_link_kill(l, MF_INTERNAL, "RemoteArena answered by %s",
                  mf_envelope_body_name((int)env->body_case));
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
    if (st != MF_OK) {
        mfd_link_kill(l, st, "Hello: %s", why);
        return;
    }
    if (env->body_case != MAPFLOW__V1__ENVELOPE__BODY_HELLO_REPLY ||
        !env->hello_reply->host_arena_bytes) {
        mfd_link_kill(l, MF_FAILED_PRECONDITION, "the peer offers no host arena over UCX");
        return;
    }
    l->max_batch = env->hello_reply->max_batch ? env->hello_reply->max_batch : 1;
    l->state = L_ARENA;
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
    call_t **pp = &l->calls, *c = NULL;
    for (; *pp; pp = &(*pp)->next)
        if ((*pp)->rid == env->request_id) {
            c = *pp;
            *pp = c->next;
            break;
        }
    if (!c) {
        if (env->body_case == MAPFLOW__V1__ENVELOPE__BODY_ERROR)
            mfd_link_kill(l, (mf_status_t)env->error->code, "%s", env->error->message);
        mf_envelope_free(env);
        return;
    }
    if (env->body_case == MAPFLOW__V1__ENVELOPE__BODY_ERROR) {
        mf_status_t code = (mf_status_t)env->error->code;
        c->cb(c->arg, code == MF_OK ? MF_INTERNAL : code, env->error->message, env, &f);
    } else {
        c->cb(c->arg, MF_OK, NULL, env, &f);
    }
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
    Mapflow__V1__Hello h = MAPFLOW__V1__HELLO__INIT;
    h.protocol_version = MF_PROTOCOL_VERSION;
    h.namespace_ = l->ns;
    h.token = (char *)(token ? token : "");
    h.client_name = (char *)"mapflowd-peer";
    h.want_host_arena = 1;
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
    if (l->state == L_READY) {
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
    uint64_t now = mf_now_ms();
    for (link_t *l = ps->links, *next; l; l = next) {
        next = l->next;
        for (call_t *c = l->calls; c; c = c->next)
            if (c->deadline_ms <= now) {
                mfd_link_kill(l, MF_UNAVAILABLE, "no answer within %u ms", MFD_PEER_CALL_MS);
                break;
            }
    }
}
