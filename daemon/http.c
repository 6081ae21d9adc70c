/* http — /metrics, /healthz, /readyz over evhttp (see http.h). */
#include "http.h"

#include <event2/buffer.h>
#include <event2/http.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct mfd_http {
    struct evhttp *h;
    mfd_http_render_t render;
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
    mfd_http_t *h = arg;
    size_t len;
    char *text = h->render.metrics(h->render.ctx, &len);
    if (!text) {
        evhttp_send_error(req, 500, "out of memory");
        return;
    }
    reply_text(req, 200, "OK", "text/plain; version=0.0.4; charset=utf-8", text, len);
    free(text);
}

static void on_healthz(struct evhttp_request *req, void *arg)
{
    (void)arg;
    reply_text(req, 200, "OK", "text/plain", "ok\n", 3);
}

static void on_readyz(struct evhttp_request *req, void *arg)
{
    mfd_http_t *h = arg;
    if (h->render.ready(h->render.ctx))
        reply_text(req, 200, "OK", "text/plain", "ready\n", 6);
    else
        reply_text(req, 503, "Service Unavailable", "text/plain", "not ready\n", 10);
}

mf_status_t mfd_http_start(struct event_base *base, const char *addr,
                           const mfd_http_render_t *render, mfd_http_t **out,
                           struct evconnlistener **listener, char *err, size_t errlen)
{
    char host[128];
    const char *colon = strrchr(addr, ':');
    size_t hl = colon ? (size_t)(colon - addr) : 0;
    *out = NULL;
    *listener = NULL;
    if (!colon || hl == 0 || hl >= sizeof(host)) {
        snprintf(err, errlen, "http: '%s' is not host:port", addr);
        return MF_INVALID_ARGUMENT;
    }
    memcpy(host, addr, hl);
    host[hl] = 0;
    if (host[0] == '[' && hl > 2 && host[hl - 1] == ']') { /* [::1]:port */
        memmove(host, host + 1, hl - 2);
        host[hl - 2] = 0;
    }
    int port = atoi(colon + 1);
    mfd_http_t *h = calloc(1, sizeof(*h));
    if (!h || !(h->h = evhttp_new(base))) {
        free(h);
        snprintf(err, errlen, "http: cannot create the server");
        return MF_INTERNAL;
    }
    h->render = *render;
    evhttp_set_allowed_methods(h->h, EVHTTP_REQ_GET | EVHTTP_REQ_HEAD);
    evhttp_set_max_headers_size(h->h, 16384);
    evhttp_set_max_body_size(h->h, 0);
    evhttp_set_cb(h->h, "/metrics", on_metrics, h);
    evhttp_set_cb(h->h, "/healthz", on_healthz, h);
    evhttp_set_cb(h->h, "/readyz", on_readyz, h);
    struct evhttp_bound_socket *bs = evhttp_bind_socket_with_handle(h->h, host,
                                                                    (ev_uint16_t)port);
    if (!bs) {
        mfd_http_stop(h);
        snprintf(err, errlen, "http: cannot listen on %s", addr);
        return MF_UNAVAILABLE;
    }
    *listener = evhttp_bound_socket_get_listener(bs);
    *out = h;
    return MF_OK;
}

void mfd_http_stop(mfd_http_t *h)
{
    if (!h)
        return;
    if (h->h)
        evhttp_free(h->h);
    free(h);
}
