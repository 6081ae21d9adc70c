/* listen — the unix, admin and TCP listeners (see listen.h). */
#include "listen.h"
#include "mf_clock.h"
#include "log.h"
#include "mf_addr.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>

static void set_listening(mfd_server_t *s, int on)
{
    struct evconnlistener *ls[3] = {s->unix_l, s->admin_l, s->tcp_l};
    for (int i = 0; i < 3; i++)
        if (ls[i])
            (on ? evconnlistener_enable : evconnlistener_disable)(ls[i]);
}

/* Listeners off at the descriptor limit go back on once one is free (or a tick later). */
void mfd_listen_resume(mfd_server_t *s)
{
    if (!s->accept_paused || s->draining)
        return;
    s->accept_paused = 0;
    set_listening(s, 1);
}

static void on_accept(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa,
                      int socklen, void *arg)
{
    (void)socklen;
    mfd_server_t *s = arg;
    const mfd_transport_t *tp = sa->sa_family == AF_UNIX ? &mfd_transport_unix
                                                         : &mfd_transport_tcp;
    char peer[80];
    if (sa->sa_family == AF_INET) {
        struct sockaddr_in *in = (struct sockaddr_in *)sa;
        char ip[INET_ADDRSTRLEN];
        inet_ntop(AF_INET, &in->sin_addr, ip, sizeof(ip));
        snprintf(peer, sizeof(peer), "tcp:%s:%u", ip, ntohs(in->sin_port));
    } else if (sa->sa_family == AF_INET6) {
        snprintf(peer, sizeof(peer), "tcp6:#%d", fd);
    } else {
        snprintf(peer, sizeof(peer), "%s:#%d", l == s->admin_l ? "admin" : "unix", fd);
    }
    mfd_conn_t *c;
    if (mfd_conn_adopt(s, fd, tp, peer, &c) != MF_OK)
        return;
    if (l == s->admin_l)
        c->admin = MFD_ADMIN_SOCKET;
    struct ucred uc;
    socklen_t ul = sizeof(uc);
    if (sa->sa_family == AF_UNIX && getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &uc, &ul) == 0)
        snprintf(c->creds, sizeof(c->creds), "pid %d uid %u", (int)uc.pid, (unsigned)uc.uid);
}

/* evhttp's listener calls back with evhttp's argument, not ours: it only stops itself
 * (libevent would log and retry in a loop) and the tick turns it on again. */
void mfd_listen_http_error(struct evconnlistener *l, void *arg)
{
    (void)arg;
    static mfd_log_limit_t limit; /* evhttp's callback has no server to keep it in */
    int err = EVUTIL_SOCKET_ERROR();
    uint64_t dropped;
    evconnlistener_disable(l);
    if (mfd_log_limit_pass(&limit, mf_now_ms(), 10000, &dropped))
        mfd_warn("http accept: %s; paused for a tick (%llu more such events not logged)",
                 strerror(err), (unsigned long long)dropped);
}

/* accept() failed. At the descriptor limit the listening socket stays readable, so
 * accepting on would spin: stop listening until a connection closes (or a tick passes). */
static void on_accept_error(struct evconnlistener *l, void *arg)
{
    (void)l;
    mfd_server_t *s = arg;
    int err = EVUTIL_SOCKET_ERROR();
    char what[160];
    snprintf(what, sizeof(what), "accept: %s%s", strerror(err),
             err == EMFILE || err == ENFILE ? "; not accepting until a descriptor is free" : "");
    mfd_conn_warn_limited(s, what);
    if (err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM) {
        if (!s->accept_paused)
            mfd_count(&s->metrics, MFD_C_ACCEPT_PAUSED, 1);
        s->accept_paused = 1;
        set_listening(s, 0);
    }
}


/* ==== listeners ======================================================================= */

/* The tenant socket (0660) or the admin socket (0600: only our user runs admin requests
 * through it). */
static mf_status_t listen_unix(mfd_server_t *s, const char *path, mode_t mode,
                               struct evconnlistener **out, char *bound, size_t bound_len,
                               char *err, size_t errlen)
{
    struct sockaddr_un sun = {0};
    sun.sun_family = AF_UNIX;
    if (strlen(path) >= sizeof(sun.sun_path)) {
        snprintf(err, errlen, "socket path longer than %zu bytes: %s", sizeof(sun.sun_path) - 1,
                 path);
        return MF_INVALID_ARGUMENT;
    }
    strcpy(sun.sun_path, path);
    struct stat sb;
    if (lstat(sun.sun_path, &sb) == 0) {
        if (!S_ISSOCK(sb.st_mode)) {
            snprintf(err, errlen, "%s exists and is not a socket", sun.sun_path);
            return MF_ALREADY_EXISTS;
        }
        /* A live daemon answers; a stale socket file from a crash does not. */
        int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        int alive = probe >= 0 && connect(probe, (struct sockaddr *)&sun, sizeof(sun)) == 0;
        if (probe >= 0)
            close(probe);
        if (alive) {
            snprintf(err, errlen, "another daemon is listening on %s", sun.sun_path);
            return MF_ALREADY_EXISTS;
        }
        unlink(sun.sun_path);
    }
    /* Created without group/other access at all, then opened up to `mode`: no window in
     * which another user can connect to the admin socket. */
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    mode_t old = umask(0177);
    int bad = fd < 0 || bind(fd, (struct sockaddr *)&sun, sizeof(sun)) != 0;
    umask(old);
    if (bad || chmod(sun.sun_path, mode) != 0 || listen(fd, 128) != 0) {
        snprintf(err, errlen, "unix socket %s: %s", sun.sun_path, strerror(errno));
        if (fd >= 0)
            close(fd);
        return MF_UNAVAILABLE;
    }
    *out = evconnlistener_new(s->base, on_accept, s, LEV_OPT_CLOSE_ON_FREE, -1, fd);
    if (!*out) {
        close(fd);
        snprintf(err, errlen, "cannot listen on %s", sun.sun_path);
        return MF_UNAVAILABLE;
    }
    evconnlistener_set_error_cb(*out, on_accept_error);
    snprintf(bound, bound_len, "%s", sun.sun_path);
    mfd_info("listening on %s:%s (mode %04o)", out == &s->admin_l ? "admin" : "unix", bound,
             (unsigned)mode);
    return MF_OK;
}

/* host:port as bound, with the real port when 0 was asked for. */
void mfd_format_bound(int fd, char *out, size_t n)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    char ip[INET6_ADDRSTRLEN] = "?";
    unsigned port = 0;
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) == 0) {
        if (ss.ss_family == AF_INET) {
            inet_ntop(AF_INET, &((struct sockaddr_in *)&ss)->sin_addr, ip, sizeof(ip));
            port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
        } else if (ss.ss_family == AF_INET6) {
            inet_ntop(AF_INET6, &((struct sockaddr_in6 *)&ss)->sin6_addr, ip, sizeof(ip));
            port = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
        }
    }
    snprintf(out, n, ss.ss_family == AF_INET6 ? "[%s]:%u" : "%s:%u", ip, port);
}

static mf_status_t listen_tcp(mfd_server_t *s, char *err, size_t errlen)
{
    struct sockaddr_storage ss;
    socklen_t len;
    if (mf_addr_resolve(s->cfg.tcp, 1, &ss, &len) != MF_OK) {
        snprintf(err, errlen, "tcp: cannot parse '%s' as host:port", s->cfg.tcp);
        return MF_INVALID_ARGUMENT;
    }
    if (!mf_addr_is_loopback(&ss) && !s->cfg.token[0]) {
        snprintf(err, errlen,
                 "tcp: refusing to listen on non-loopback %s without a token (set `token`)",
                 s->cfg.tcp);
        return MF_FAILED_PRECONDITION;
    }
    s->tcp_l = evconnlistener_new_bind(s->base, on_accept, s,
                                       LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE |
                                           LEV_OPT_CLOSE_ON_EXEC,
                                       128, (struct sockaddr *)&ss, (int)len);
    if (!s->tcp_l) {
        snprintf(err, errlen, "tcp: cannot listen on %s: %s", s->cfg.tcp, strerror(errno));
        return MF_UNAVAILABLE;
    }
    evconnlistener_set_error_cb(s->tcp_l, on_accept_error);
    mfd_format_bound(evconnlistener_get_fd(s->tcp_l), s->tcp_addr, sizeof(s->tcp_addr));
    mfd_info("listening on tcp:%s%s", s->tcp_addr, s->cfg.token[0] ? " (token required)" : "");
    return MF_OK;
}


mf_status_t mfd_listen_start(mfd_server_t *s, char *err, size_t errlen)
{
    mf_status_t st = listen_unix(s, s->cfg.socket, 0660, &s->unix_l, s->unix_path,
                                 sizeof(s->unix_path), err, errlen);
    if (st != MF_OK)
        return st;
    if (strcmp(s->cfg.admin_socket, s->cfg.socket) == 0) {
        snprintf(err, errlen, "admin_socket must differ from socket (%s)", s->cfg.socket);
        return MF_INVALID_ARGUMENT;
    }
    if ((st = listen_unix(s, s->cfg.admin_socket, 0600, &s->admin_l, s->admin_path,
                          sizeof(s->admin_path), err, errlen)) != MF_OK)
        return st;
    if (s->cfg.tcp[0] && (st = listen_tcp(s, err, errlen)) != MF_OK)
        return st;
    return MF_OK;
}

void mfd_listen_stop(mfd_server_t *s)
{
    if (s->unix_l) {
        evconnlistener_free(s->unix_l);
        s->unix_l = NULL;
        unlink(s->unix_path);
    }
    if (s->admin_l) {
        evconnlistener_free(s->admin_l);
        s->admin_l = NULL;
        unlink(s->admin_path);
    }
    if (s->tcp_l) {
        evconnlistener_free(s->tcp_l);
        s->tcp_l = NULL;
    }
}
