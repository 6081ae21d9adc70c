/* http — /metrics, /healthz, /readyz over evhttp (see http.h). */
#include "http.h"
#include "log.h"
#include "peer.h"

#include <event2/buffer.h>
#include <event2/http.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct mfd_http {
    struct evhttp *h;
};

static void reply_text(struct evhttp_request *req, int code, const char *reason,
                       const char *ctype, const char *body, size_t len)
{
    struct evbuffer *b = evbuffer_new();
    if (!b) {
        evhttp_send_error(req, 500, "out of memory");
        return;
    }
    evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type", ctype);
    evbuffer_add(b, body, len);
    evhttp_send_reply(req, code, reason, b);
    evbuffer_free(b);
}

static void on_metrics(struct evhttp_request *req, void *arg)
{
    mfd_server_t *s = arg;
    mfd_gauges_t g;
    mfd_server_gauges(s, &g);
    mfd_process_read(&g.proc); /* no /proc: the process_* families are left out */
    size_t len;
    char *text = mfd_metrics_render(&s->metrics, &g, &len);
    size_t plen = 0;
    char *peers = text ? mfd_peers_metrics(s->peers, &plen) : NULL; /* UCX transfers */
    char *all = peers ? realloc(text, len + plen + 1) : NULL;
    if (!all) {
        free(text);
        free(peers);
        evhttp_send_error(req, 500, "out of memory");
        return;
    }
    memcpy(all + len, peers, plen + 1);
    free(peers);
    reply_text(req, 200, "OK", "text/plain; version=0.0.4; charset=utf-8", all, len + plen);
    free(all);
}

static void on_healthz(struct evhttp_request *req, void *arg)
{
    (void)arg;
    reply_text(req, 200, "OK", "text/plain", "ok\n", 3);
}

static void on_readyz(struct evhttp_request *req, void *arg)
{
    mfd_server_t *s = arg;
    if (s->ready)
        reply_text(req, 200, "OK", "text/plain", "ready\n", 6);
    else
        reply_text(req, 503, "Service Unavailable", "text/plain", "not ready\n", 10);
}

mf_status_t mfd_http_start(mfd_server_t *s, char *err, size_t errlen)
{
    char host[128];
    const char *colon = strrchr(s->cfg.http, ':');
    size_t hl = colon ? (size_t)(colon - s->cfg.http) : 0;
    if (!colon || hl == 0 || hl >= sizeof(host)) {
        snprintf(err, errlen, "http: '%s' is not host:port", s->cfg.http);
        return MF_INVALID_ARGUMENT;
    }
    memcpy(host, s->cfg.http, hl);
    host[hl] = 0;
    if (host[0] == '[' && hl > 2 && host[hl - 1] == ']') { /* [::1]:port */
        memmove(host, host + 1, hl - 2);
        host[hl - 2] = 0;
    }
    int port = atoi(colon + 1);
    s->http = calloc(1, sizeof(*s->http));
    if (!s->http || !(s->http->h = evhttp_new(s->base))) {
        snprintf(err, errlen, "http: cannot create the server");
        return MF_INTERNAL;
    }
    evhttp_set_allowed_methods(s->http->h, EVHTTP_REQ_GET | EVHTTP_REQ_HEAD);
    evhttp_set_max_headers_size(s->http->h, 16384);
    evhttp_set_max_body_size(s->http->h, 0);
    evhttp_set_cb(s->http->h, "/metrics", on_metrics, s);
    evhttp_set_cb(s->http->h, "/healthz", on_healthz, s);
    evhttp_set_cb(s->http->h, "/readyz", on_readyz, s);
    struct evhttp_bound_socket *bs = evhttp_bind_socket_with_handle(s->http->h, host,
                                                                    (ev_uint16_t)port);
    if (!bs) {
        snprintf(err, errlen, "http: cannot listen on %s", s->cfg.http);
        return MF_UNAVAILABLE;
    }
    s->http_l = evhttp_bound_socket_get_listener(bs); /* paused at the fd limit (server.c) */
    mfd_format_bound(evhttp_bound_socket_get_fd(bs), s->http_addr, sizeof(s->http_addr));
    mfd_info("http on %s (/metrics /healthz /readyz)", s->http_addr);
    return MF_OK;
}

void mfd_http_stop(mfd_server_t *s)
{
    if (!s->http)
        return;
    if (s->http->h)
        evhttp_free(s->http->h);
    s->http_l = NULL;
    free(s->http);
    s->http = NULL;
}
