/* daemon — mapflowd's lifecycle: create, run, drain, destroy; timers, signals, reload
 * (see server.h). */
#include "server.h"
#include "mf_clock.h"
#include "dispatch.h"
#include "http.h"
#include "lease.h"
#include "listen.h"
#include "log.h"
#include "notify.h"
#include "peer.h"

#include <event2/thread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define TICK_MS 250

/* ==== hooks =========================================================================== */

/* s->on_close: tickets and the namespace account go; a descriptor came free. */
static size_t on_conn_close(mfd_server_t *s, mfd_conn_t *c)
{
    size_t n = mfd_lease_release_owner(s, c);
    mfd_listen_resume(s);
    return n;
}

/* /metrics: the daemon's families, then the peers' (UCX transfers). */
static char *render_metrics(void *ctx, size_t *len_out)
{
    mfd_server_t *s = ctx;
    mfd_gauges_t g;
    mfd_server_gauges(s, &g);
    mfd_process_read(&g.proc); /* no /proc: the process_* families are left out */
    return mfd_metrics_render(&s->metrics, &g, mfd_peers_metrics, s->peers, len_out);
}

static int render_ready(void *ctx)
{
    return ((mfd_server_t *)ctx)->ready;
}

/* ==== timers and signals ============================================================== */

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
        mfd_conn_close(c);
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
            mfd_conn_close(c);
        } else if (c->hello_done && idle && !c->pending && !c->read_paused &&
                   now - c->last_rx_ms >= idle) {
            mfd_info("connection %s (%s): silent for idle_timeout (%llu ms), closing", c->peer,
                     c->name, (unsigned long long)idle);
            mfd_count(&s->metrics, MFD_C_CONN_IDLE_TIMEOUT, 1);
            mfd_conn_close(c);
        }
    }
}

static void on_tick(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    mfd_server_t *s = arg;
    uint64_t now = mf_now_ms();
    mfd_tickets_expire(s->tickets, now, mfd_ticket_expire, s);
    expire_partial_frames(s, now);
    expire_silent(s, now);
    /* Descriptors may come free without a connection closing (RocksDB files, peers). */
    mfd_listen_resume(s);
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
    s->start_ms = mf_now_ms();
    s->dispatch = mfd_server_dispatch;
    s->on_close = on_conn_close;
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
    if (g)
        mfd_info("gpu tier: put regions checksummed on the %s (%s)",
                 g->kernels ? "GPU" : "host, rows copied whole", g->region_why);
    mfd_info("host tier: %llu bytes (memfd), watermarks %.2f/%.2f",
             (unsigned long long)mfd_store_host_capacity(&s->store), s->cfg.high_watermark,
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
    if ((st = mfd_listen_start(s, err, errlen)) != MF_OK)
        goto fail;
    if ((st = mfd_peers_create(s, &s->peers, err, errlen)) != MF_OK)
        goto fail;
    if (s->cfg.http[0]) {
        mfd_http_render_t render = {s, render_metrics, render_ready};
        if ((st = mfd_http_start(s->base, s->cfg.http, &render, &s->http, &s->http_l, err,
                                 errlen)) != MF_OK)
            goto fail;
        evconnlistener_set_error_cb(s->http_l, mfd_listen_http_error);
        mfd_format_bound(evconnlistener_get_fd(s->http_l), s->http_addr, sizeof(s->http_addr));
        mfd_info("http on %s (/metrics /healthz /readyz)", s->http_addr);
    }
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
    mfd_listen_stop(s);
    mfd_peers_stop_listening(s->peers);
    mfd_store_drain(&s->store);
    while (s->conns) {
        mfd_conn_t *c = s->conns;
        if (evbuffer_get_length(c->out))
            evbuffer_write(c->out, c->fd); /* best effort: replies already made */
        mfd_conn_close(c);
    }
    mfd_info("stopped");
    return MF_OK;
}

void mfd_server_destroy(mfd_server_t *s)
{
    if (!s)
        return;
    while (s->conns)
        mfd_conn_close(s->conns);
    if (s->tickets) {
        mfd_tickets_all(s->tickets, mfd_ticket_release, s);
    }
    mfd_http_stop(s->http);
    s->http = NULL;
    s->http_l = NULL;
    mfd_listen_stop(s);
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
