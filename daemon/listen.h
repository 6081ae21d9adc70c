/*
 * listen — the control plane's listeners: the tenant unix socket (0660), the admin socket
 * (0600: connections on it may send admin requests), and TCP when config `tcp` is set
 * (non-loopback only with a token). Accepted sockets become connections (conn.h), tagged
 * with their transport, admin origin and SO_PEERCRED. At the descriptor limit accepting
 * stops (accept would spin) until a connection closes or a tick passes.
 *
 * Ownership: the listeners are fields of mfd_server_t, created and freed here; a stale
 * socket file from a crash is replaced, a live daemon's is refused (ALREADY_EXISTS).
 * Thread safety: loop thread only.
 */
#ifndef MFD_LISTEN_H
#define MFD_LISTEN_H

#include <stddef.h>
#include "conn.h"

/* Binds socket, admin_socket and tcp from s->cfg and logs each; errors go to `err`. */
mf_status_t mfd_listen_start(mfd_server_t *s, char *err, size_t errlen);
/* Closes the listeners and unlinks the socket files (drain, destroy). */
void mfd_listen_stop(mfd_server_t *s);
/* Listeners paused at the descriptor limit go back on (a descriptor may be free). */
void mfd_listen_resume(mfd_server_t *s);
/* evconnlistener error callback for evhttp's listener: pauses it until the next tick. */
void mfd_listen_http_error(struct evconnlistener *l, void *arg);

/* "host:port" a listening socket is bound to (the real port when 0 was asked for). */
void mfd_format_bound(int fd, char *out, size_t n);

#endif /* MFD_LISTEN_H */
