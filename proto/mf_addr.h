/*
 * mf_addr — "HOST:PORT" addresses as every MapFlow listener and client spells them
 * ("127.0.0.1:9477", "[::1]:0", "node7:5000"): split, resolve, loopback test. One parser
 * so the daemon's TCP and UCX listeners, its peers and libmapflow agree on the syntax.
 *
 * Ownership: callers own every buffer. Thread safety: any thread (getaddrinfo is).
 */
#ifndef MF_ADDR_H
#define MF_ADDR_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "mf_status.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Splits spec into host (brackets of "[v6]" removed, at most cap−1 bytes) and port.
 * Port 0 ("any port") only when allow_port0. MF_INVALID_ARGUMENT on any other shape.
 */
mf_status_t mf_addr_split(const char *spec, char *host, size_t cap, uint16_t *port,
                          int allow_port0);

/*
 * Splits and resolves to the first address getaddrinfo gives. passive: for a listener
 * (AI_PASSIVE, port 0 allowed). MF_INVALID_ARGUMENT for a malformed spec, MF_UNAVAILABLE
 * when the host does not resolve.
 */
mf_status_t mf_addr_resolve(const char *spec, int passive, struct sockaddr_storage *ss,
                            socklen_t *len);

/* 1 for 127.0.0.0/8 and ::1. */
int mf_addr_is_loopback(const struct sockaddr_storage *ss);

/* The daemon's default admin socket beside its unix socket: "D/NAME.sock" becomes
 * "D/NAME-admin.sock", any other PATH "PATH-admin" (mapflowd and mapflowctl agree). */
void mf_admin_socket_path(const char *socket, char *out, size_t n);

/*
 * The default unix socket, one rule for mapflowd (listen = 1) and its clients (0):
 *   1. MF_SYSTEM_SOCKET, the path of the systemd unit and the DaemonSet, when its
 *      directory /run/mapflowd exists and (listen) is writable or (client) holds the socket;
 *   2. else $XDG_RUNTIME_DIR/mapflowd/mapflowd.sock when XDG_RUNTIME_DIR is absolute and
 *      writable;
 *   3. else /tmp/mapflowd-UID/mapflowd.sock.
 */
#define MF_SYSTEM_SOCKET_DIR "/run/mapflowd"
#define MF_SYSTEM_SOCKET MF_SYSTEM_SOCKET_DIR "/mapflowd.sock"
void mf_default_socket_path(char *out, size_t n, int listen);

#ifdef __cplusplus
}
#endif
#endif /* MF_ADDR_H */
