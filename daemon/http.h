/*
 * http — the HTTP endpoint (libevent evhttp) on the loop: GET /metrics (Prometheus
 * text format 0.0.4), /healthz (200 while the loop runs), /readyz (200 once the tiers
 * are open and listeners bound, 503 while starting or draining). Binds config `http`
 * (host:port, port 0 = any) and logs "http on HOST:PORT" with the real port.
 * Thread safety: loop thread only.
 */
#ifndef MFD_HTTP_H
#define MFD_HTTP_H

#include "server.h"

mf_status_t mfd_http_start(mfd_server_t *s, char *err, size_t errlen);
void mfd_http_stop(mfd_server_t *s);

#endif /* MFD_HTTP_H */
