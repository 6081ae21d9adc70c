/* mf_addr — HOST:PORT parsing and resolution shared by daemon and client (mf_addr.h). */
#include "mf_addr.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

mf_status_t mf_addr_split(const char *spec, char *host, size_t cap, uint16_t *port,
                          int allow_port0)
{
    const char *colon = spec ? strrchr(spec, ':') : NULL;
    size_t hl = colon ? (size_t)(colon - spec) : 0;
    if (!colon || hl == 0 || !colon[1] || strlen(colon + 1) > 5)
        return MF_INVALID_ARGUMENT;
    unsigned long p = 0;
    for (const char *c = colon + 1; *c; c++) {
        if (*c < '0' || *c > '9')
            return MF_INVALID_ARGUMENT;
        p = p * 10 + (unsigned long)(*c - '0');
    }
    if (p > 65535 || (p == 0 && !allow_port0))
        return MF_INVALID_ARGUMENT;
    const char *h = spec;
    if (hl > 2 && h[0] == '[' && h[hl - 1] == ']') { /* [v6]:port */
        h++;
        hl -= 2;
    }
    if (hl >= cap)
        return MF_INVALID_ARGUMENT;
    memcpy(host, h, hl);
    host[hl] = '\0';
    *port = (uint16_t)p;
    return MF_OK;
}

mf_status_t mf_addr_resolve(const char *spec, int passive, struct sockaddr_storage *ss,
                            socklen_t *len)
{
    char host[256], port_s[8];
    uint16_t port;
    mf_status_t st = mf_addr_split(spec, host, sizeof(host), &port, passive);
    if (st != MF_OK)
        return st;
    snprintf(port_s, sizeof(port_s), "%u", (unsigned)port);
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
    if (getaddrinfo(host, port_s, &hints, &res) != 0 || !res)
        return MF_UNAVAILABLE;
    memset(ss, 0, sizeof(*ss));
    memcpy(ss, res->ai_addr, res->ai_addrlen);
    *len = res->ai_addrlen;
    freeaddrinfo(res);
    return MF_OK;
}

int mf_addr_is_loopback(const struct sockaddr_storage *ss)
{
    if (ss->ss_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)ss)->sin_addr.s_addr) >> 24) == 127;
    if (ss->ss_family == AF_INET6)
        return IN6_IS_ADDR_LOOPBACK(&((const struct sockaddr_in6 *)ss)->sin6_addr);
    return 0;
}

void mf_admin_socket_path(const char *socket, char *out, size_t n)
{
    size_t l = strlen(socket);
    if (l > 5 && strcmp(socket + l - 5, ".sock") == 0)
        snprintf(out, n, "%.*s-admin.sock", (int)(l - 5), socket);
    else
        snprintf(out, n, "%s-admin", socket);
}

void mf_default_socket_path(char *out, size_t n, int listen)
{
    const char *xr = getenv("XDG_RUNTIME_DIR");
    if (listen ? access(MF_SYSTEM_SOCKET_DIR, W_OK | X_OK) == 0
               : access(MF_SYSTEM_SOCKET, F_OK) == 0)
        snprintf(out, n, "%s", MF_SYSTEM_SOCKET);
    else if (xr && xr[0] == '/' && access(xr, W_OK) == 0)
        snprintf(out, n, "%s/mapflowd/mapflowd.sock", xr);
    else
        snprintf(out, n, "/tmp/mapflowd-%u/mapflowd.sock", (unsigned)getuid());
}
