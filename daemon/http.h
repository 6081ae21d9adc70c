/*
 * http — the HTTP endpoint (libevent evhttp) on the loop: GET /metrics (Prometheus
 * text format 0.0.4), /healthz (200 while the loop runs), /readyz (200 once the tiers
 * are open and listeners bound, 503 while starting or draining). What the pages say comes
 * from render callbacks given at start (daemon.c), so this module knows no daemon state.
 * Bounds: GET and HEAD only, 16 KiB of headers, no body.
 *
 * Ownership: mfd_http_start returns the endpoint; mfd_http_stop frees it (and its
 * listener). The render context must outlive it.
 * Thread safety: loop thread only.
 */
#ifndef MFD_HTTP_H
#define MFD_HTTP_H

#include <event2/event.h>
#include <event2/listener.h>
#include <stddef.h>
#include "mf_status.h"

typedef struct mfd_http mfd_http_t;

typedef struct mfd_http_render {
    void *ctx;
    /* The /metrics page, malloc'd (*len bytes, NUL-terminated); NULL on OOM (500). */
    char *(*metrics)(void *ctx, size_t *len);
    /* Non-zero while /readyz answers 200. */
    int (*ready)(void *ctx);
} mfd_http_render_t;

/* Binds addr (host:port, port 0 = any; [v6]:port). *listener is evhttp's, for pausing
 * it at the descriptor limit; its fd tells the bound port. Errors go to `err`. */
mf_status_t mfd_http_start(struct event_base *base, const char *addr,
                           const mfd_http_render_t *render, mfd_http_t **out,
                           struct evconnlistener **listener, char *err, size_t errlen);
void mfd_http_stop(mfd_http_t *h);

#endif /* MFD_HTTP_H */
