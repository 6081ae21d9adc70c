/* channel — connect, Hello, arena mapping, frame I/O with deadlines (see channel.h). */
#include "channel.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define RECV_CHUNK (64u << 10)

/* ==== small helpers ================================================================== */

char *mf__strdup(const char *s)
{
    if (!s)
        return NULL;
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d)
        memcpy(d, s, n);
    return d;
}

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Absolute deadline (monotonic ms) for a call; INT64_MAX = none. */
static int64_t deadline_of(const mf_channel_t *ch, int64_t timeout_ms)
{
    if (timeout_ms == MF_TIMEOUT_DEFAULT)
        timeout_ms = ch->timeout_ms;
    if (timeout_ms < 0)
        return INT64_MAX;
    return now_ms() + timeout_ms;
}

/* Milliseconds left for poll(2); -1 = forever, 0 = expired. */
static int poll_ms(int64_t deadline)
{
    if (deadline == INT64_MAX)
        return -1;
    int64_t left = deadline - now_ms();
    if (left <= 0)
        return 0;
    return left > 1000000 ? 1000000 : (int)left;
}

void mf__chan_lock(mf_channel_t *ch)
{
    pthread_mutex_lock(&ch->mu);
}

void mf__chan_unlock(mf_channel_t *ch)
{
    pthread_mutex_unlock(&ch->mu);
}

mf_status_t mf__chan_error(mf_channel_t *ch, mf_status_t st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ch->err, sizeof(ch->err), fmt, ap);
    va_end(ap);
    return st;
}

/* The stream can no longer be trusted (partial frame sent, bad frame read, EOF). */
static mf_status_t chan_break(mf_channel_t *ch, mf_status_t st, const char *fmt, const char *a)
{
    ch->broken = 1;
    return mf__chan_error(ch, st, fmt, a);
}

/* Waits until fd is ready for events or the deadline passes. */
static mf_status_t wait_fd(mf_channel_t *ch, short events, int64_t deadline)
{
    for (;;) {
        struct pollfd p = {.fd = ch->fd, .events = events};
        int ms = poll_ms(deadline);
        if (ms == 0)
            return mf__chan_error(ch, MF_DEADLINE_EXCEEDED, "deadline exceeded");
        int r = poll(&p, 1, ms);
        if (r > 0)
            return MF_OK;
        if (r == 0)
            return mf__chan_error(ch, MF_DEADLINE_EXCEEDED, "deadline exceeded");
        if (errno != EINTR)
            return chan_break(ch, MF_UNAVAILABLE, "poll: %s", strerror(errno));
    }
}

/* ==== frame I/O ====================================================================== */

/* Sends all of iov; a deadline after a partial write breaks the channel (the peer holds
 * half a frame, so nothing later can be framed correctly). */
static mf_status_t send_iov(mf_channel_t *ch, struct iovec *iov, int n, int64_t deadline)
{
    size_t sent_total = 0;
    while (n > 0) {
        struct msghdr m = {.msg_iov = iov, .msg_iovlen = (size_t)n};
        ssize_t w = sendmsg(ch->fd, &m, MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                mf_status_t st = wait_fd(ch, POLLOUT, deadline);
                if (st != MF_OK) {
                    if (sent_total > 0)
                        ch->broken = 1;
                    return st;
                }
                continue;
            }
            return chan_break(ch, MF_UNAVAILABLE, "send: %s", strerror(errno));
        }
        sent_total += (size_t)w;
        while (n > 0 && (size_t)w >= iov->iov_len) {
            w -= (ssize_t)iov->iov_len;
            iov++;
            n--;
        }
        if (n > 0) {
            iov->iov_base = (uint8_t *)iov->iov_base + w;
            iov->iov_len -= (size_t)w;
        }
    }
    return MF_OK;
}

static mf_status_t send_request(mf_channel_t *ch, mf_envelope_t *req, const void *payload,
                                size_t payload_len, int64_t deadline)
{
    uint8_t *head;
    size_t head_len;
    uint32_t limit = ch->server_max_frame ? ch->server_max_frame : ch->max_frame;
    mf_status_t st = mf_frame_encode_head(req, payload_len, limit, &head, &head_len);
    if (st != MF_OK)
        return mf__chan_error(ch, st, "request of %zu payload bytes exceeds max_frame %u",
                              payload_len, limit);
    struct iovec iov[2] = {{head, head_len}, {(void *)payload, payload_len}};
    st = send_iov(ch, iov, payload_len ? 2 : 1, deadline);
    free(head);
    return st;
}

/* Reads more bytes into the frame reader; an fd that arrives with them (the host arena,
 * sent with HelloReply) is kept in *fd_out if wanted, else closed. */
static mf_status_t recv_more(mf_channel_t *ch, int64_t deadline, int *fd_out)
{
    uint8_t *p;
    size_t avail;
    if (mf_frame_reader_space(&ch->rd, RECV_CHUNK, &p, &avail) != MF_OK)
        return mf__chan_error(ch, MF_RESOURCE_EXHAUSTED, "out of memory for the reply");
    for (;;) {
        union {
            struct cmsghdr h;
            char buf[CMSG_SPACE(sizeof(int) * 4)];
        } cm;
        struct iovec iov = {p, avail};
        struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};
        if (ch->is_unix) {
            m.msg_control = cm.buf;
            m.msg_controllen = sizeof(cm.buf);
        }
        ssize_t r = recvmsg(ch->fd, &m, MSG_CMSG_CLOEXEC);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                mf_status_t st = wait_fd(ch, POLLIN, deadline);
                if (st != MF_OK)
                    return st;
                continue;
            }
            return chan_break(ch, MF_UNAVAILABLE, "recv: %s", strerror(errno));
        }
        for (struct cmsghdr *c = ch->is_unix ? CMSG_FIRSTHDR(&m) : NULL; c;
             c = CMSG_NXTHDR(&m, c)) {
            if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
                continue;
            size_t nfd = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
            for (size_t i = 0; i < nfd; i++) {
                int fd;
                memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
                if (fd_out && *fd_out < 0)
                    *fd_out = fd;
                else
                    close(fd);
            }
        }
        if (r == 0)
            return chan_break(ch, MF_UNAVAILABLE, "%s", "daemon closed the connection");
        mf_frame_reader_commit(&ch->rd, (size_t)r);
        return MF_OK;
    }
}

/* The reply dispatcher: reads frames until the one answering request_id. */
static mf_status_t recv_reply(mf_channel_t *ch, uint64_t request_id, int64_t deadline,
                              int *fd_out, mf__reply_t *rep)
{
    for (;;) {
        mf_frame_t f;
        int have;
        const char *why = NULL;
        mf_status_t st = mf_frame_reader_next(&ch->rd, &f, &have, &why);
        if (st != MF_OK)
            return chan_break(ch, MF_INTERNAL, "bad reply frame from the daemon: %s", why);
        if (!have) {
            st = recv_more(ch, deadline, fd_out);
            if (st != MF_OK)
                return st;
            continue;
        }
        mf_envelope_t *env = NULL;
        st = mf_envelope_decode(&f, &env, &why);
        if (st == MF_UNIMPLEMENTED)
            continue; /* a reply type newer than us: not ours to interpret */
        if (st != MF_OK)
            return chan_break(ch, MF_INTERNAL, "undecodable reply from the daemon: %s", why);
        if (env->request_id != request_id && env->request_id != 0) {
            /* Reply to a call that already gave up at its deadline. */
            mf_envelope_free(env);
            continue;
        }
        rep->env = env;
        rep->payload = f.payload;
        rep->payload_len = f.payload_len;
        return MF_OK;
    }
}

void mf__reply_done(mf__reply_t *rep)
{
    mf_envelope_free(rep->env);
    rep->env = NULL;
}

/* Turns an ErrorReply or a reply of the wrong type into a status. */
static mf_status_t check_reply(mf_channel_t *ch, mf__reply_t *rep, int want_case)
{
    mf_envelope_t *env = rep->env;
    if ((int)env->body_case == want_case)
        return MF_OK;
    mf_status_t st;
    if (env->body_case == MAPFLOW__V1__ENVELOPE__BODY_ERROR) {
        uint32_t code = env->error->code;
        st = (code != 0 && mf_status_valid((int)code)) ? (mf_status_t)code : MF_UNKNOWN;
        mf__chan_error(ch, st, "%s: %s", mf_status_name((int)st),
                       env->error->message && env->error->message[0] ? env->error->message
                                                                     : mf_strerror((int)st));
    } else {
        st = mf__chan_error(ch, MF_INTERNAL, "daemon answered %s where %s was expected",
                            mf_envelope_body_name((int)env->body_case),
                            mf_envelope_body_name(want_case));
    }
    mf__reply_done(rep);
    return st;
}

static mf_status_t do_call(mf_channel_t *ch, mf_envelope_t *req, const void *payload,
                           size_t payload_len, int want_case, int64_t timeout_ms,
                           int *fd_out, mf__reply_t *rep)
{
    rep->env = NULL;
    if (ch->fd < 0 || ch->broken)
        return mf__chan_error(ch, MF_UNAVAILABLE, "channel is not connected%s%s",
                              ch->err[0] ? ": " : "", ch->err[0] ? ch->err : "");
    int64_t deadline = deadline_of(ch, timeout_ms);
    req->request_id = ++ch->next_id;
    ch->err[0] = '\0';
    mf_status_t st = send_request(ch, req, payload, payload_len, deadline);
    if (st != MF_OK)
        return st;
    st = recv_reply(ch, req->request_id, deadline, fd_out, rep);
    if (st != MF_OK)
        return st;
    return check_reply(ch, rep, want_case);
}

mf_status_t mf__chan_do_call(mf_channel_t *ch, mf_envelope_t *req, const void *payload,
                             size_t payload_len, int want_case, int64_t timeout_ms,
                             mf__reply_t *rep)
{
    return do_call(ch, req, payload, payload_len, want_case, timeout_ms, NULL, rep);
}

mf_status_t mf__chan_do_send(mf_channel_t *ch, mf_envelope_t *req, int64_t timeout_ms)
{
    if (ch->fd < 0 || ch->broken)
        return MF_UNAVAILABLE;
    req->request_id = ++ch->next_id;
    return send_request(ch, req, NULL, 0, deadline_of(ch, timeout_ms));
}

/* ==== connect ======================================================================== */

static int set_nonblock(int fd)
{
    int fl = fcntl(fd, F_GETFL);
    return fl < 0 ? -1 : fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

/* Non-blocking connect bounded by the deadline. */
static mf_status_t connect_fd(mf_channel_t *ch, int fd, const struct sockaddr *sa,
                              socklen_t len, int64_t deadline, const char *what)
{
    ch->fd = fd;
    if (set_nonblock(fd) < 0)
        return mf__chan_error(ch, MF_INTERNAL, "fcntl: %s", strerror(errno));
    if (connect(fd, sa, len) == 0)
        return MF_OK;
    if (errno != EINPROGRESS && errno != EAGAIN)
        return mf__chan_error(ch, MF_UNAVAILABLE, "cannot connect to %s: %s", what,
                              strerror(errno));
    mf_status_t st = wait_fd(ch, POLLOUT, deadline);
    if (st != MF_OK)
        return st;
    int err = 0;
    socklen_t el = sizeof(err);
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) < 0)
        err = errno;
    if (err)
        return mf__chan_error(ch, MF_UNAVAILABLE, "cannot connect to %s: %s", what,
                              strerror(err));
    return MF_OK;
}

static mf_status_t connect_unix(mf_channel_t *ch, const char *path, int64_t deadline)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (!path[0] || strlen(path) >= sizeof(sa.sun_path))
        return mf__chan_error(ch, MF_INVALID_ARGUMENT, "unix socket path is empty or longer "
                              "than %zu bytes", sizeof(sa.sun_path) - 1);
    memcpy(sa.sun_path, path, strlen(path) + 1);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return mf__chan_error(ch, MF_UNAVAILABLE, "socket: %s", strerror(errno));
    ch->is_unix = 1;
    char what[sizeof(sa.sun_path) + 8];
    snprintf(what, sizeof(what), "unix:%s", path);
    return connect_fd(ch, fd, (struct sockaddr *)&sa, sizeof(sa), deadline, what);
}

static mf_status_t connect_tcp(mf_channel_t *ch, const char *hostport, int64_t deadline)
{
    char host[256];
    const char *colon = strrchr(hostport, ':');
    if (!colon || colon == hostport || !colon[1] || (size_t)(colon - hostport) >= sizeof(host))
        return mf__chan_error(ch, MF_INVALID_ARGUMENT, "tcp target must be HOST:PORT, got "
                              "'%s'", hostport);
    size_t hl = (size_t)(colon - hostport);
    const char *h = hostport;
    if (hl >= 2 && h[0] == '[' && h[hl - 1] == ']') { /* [v6]:port */
        h++;
        hl -= 2;
    }
    memcpy(host, h, hl);
    host[hl] = '\0';
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_family = AF_UNSPEC};
    struct addrinfo *res = NULL;
    int gai = getaddrinfo(host, colon + 1, &hints, &res);
    if (gai != 0)
        return mf__chan_error(ch, MF_UNAVAILABLE, "cannot resolve %s: %s", hostport,
                              gai_strerror(gai));
    mf_status_t st = MF_UNAVAILABLE;
    for (struct addrinfo *a = res; a; a = a->ai_next) {
        int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0)
            continue;
        st = connect_fd(ch, fd, a->ai_addr, a->ai_addrlen, deadline, hostport);
        if (st == MF_OK)
            break;
        close(fd);
        ch->fd = -1;
    }
    freeaddrinfo(res);
    if (st == MF_OK) {
        int one = 1;
        setsockopt(ch->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    }
    return st;
}

/* ==== Hello ========================================================================== */

static mf_status_t map_arena(mf_channel_t *ch, int fd, uint64_t bytes)
{
    struct stat sb;
    if (fstat(fd, &sb) < 0 || (uint64_t)sb.st_size < bytes || bytes == 0)
        return mf__chan_error(ch, MF_INTERNAL, "host arena fd is smaller than the %llu bytes "
                              "announced", (unsigned long long)bytes);
    void *p = mmap(NULL, (size_t)bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED)
        return mf__chan_error(ch, MF_RESOURCE_EXHAUSTED, "mmap of the host arena: %s",
                              strerror(errno));
    ch->arena = p;
    ch->arena_bytes = (size_t)bytes;
    return MF_OK;
}

static mf_status_t hello(mf_channel_t *ch, const mf_channel_params_t *p, int want_arena)
{
    Mapflow__V1__Hello h = MAPFLOW__V1__HELLO__INIT;
    mf_envelope_t req = MAPFLOW__V1__ENVELOPE__INIT;
    h.protocol_version = MF_PROTOCOL_VERSION;
    h.namespace_ = ch->ns;
    h.token = (p && (p->field_mask & MF_CHANNEL_PARAM_TOKEN) && p->token) ? (char *)p->token
                                                                          : "";
    h.client_name = (p && (p->field_mask & MF_CHANNEL_PARAM_CLIENT_NAME) && p->client_name)
                        ? (char *)p->client_name
                        : "libmapflow";
    h.want_host_arena = want_arena;
    req.body_case = MAPFLOW__V1__ENVELOPE__BODY_HELLO;
    req.hello = &h;

    int fd = -1;
    mf__reply_t rep;
    mf_status_t st = do_call(ch, &req, NULL, 0, MAPFLOW__V1__ENVELOPE__BODY_HELLO_REPLY,
                             MF_TIMEOUT_DEFAULT, &fd, &rep);
    if (st != MF_OK) {
        if (fd >= 0)
            close(fd);
        /* The daemon closes after refusing a Hello; nothing more can go over it. */
        ch->broken = 1;
        return st;
    }
    Mapflow__V1__HelloReply *hr = rep.env->hello_reply;
    ch->daemon_version = mf__strdup(hr->daemon_version ? hr->daemon_version : "");
    ch->session_id = hr->session_id;
    ch->server_max_frame = hr->max_frame >= MF_FRAME_MIN_MAX && hr->max_frame < ch->max_frame
                               ? hr->max_frame
                               : ch->max_frame;
    ch->max_batch = hr->max_batch;
    ch->gpu_tier = hr->gpu_tier;
    if (want_arena && hr->host_arena_fd && fd >= 0)
        st = map_arena(ch, fd, hr->host_arena_bytes);
    else if (want_arena && hr->host_arena_fd)
        st = mf__chan_error(ch, MF_INTERNAL, "HelloReply announced an arena fd that did not "
                            "arrive");
    if (fd >= 0)
        close(fd); /* the mapping keeps the memory; the fd itself is not needed */
    mf__reply_done(&rep);
    return st;
}

/* ==== public channel API ============================================================= */

MF_EXPORT const char *mf_version(void)
{
    return MF_VERSION_STRING;
}

MF_EXPORT mf_status_t mf_channel_open(const char *target, const mf_channel_params_t *p,
                                      mf_channel_t **out)
{
    if (!out)
        return MF_INVALID_ARGUMENT;
    *out = NULL;
    mf_channel_t *ch = calloc(1, sizeof(*ch));
    if (!ch)
        return MF_RESOURCE_EXHAUSTED;
    pthread_mutex_init(&ch->mu, NULL);
    ch->fd = -1;
    ch->timeout_ms = MF__DEFAULT_TIMEOUT_MS;
    ch->max_frame = MF_FRAME_DEFAULT_MAX;
    *out = ch;
    uint64_t m = p ? p->field_mask : 0;
    if (m & MF_CHANNEL_PARAM_TIMEOUT_MS)
        ch->timeout_ms = p->timeout_ms;
    if ((m & MF_CHANNEL_PARAM_MAX_FRAME) && p->max_frame) {
        if (p->max_frame < MF_FRAME_MIN_MAX)
            return mf__chan_error(ch, MF_INVALID_ARGUMENT, "max_frame must be at least %u",
                                  MF_FRAME_MIN_MAX);
        ch->max_frame = p->max_frame;
    }
    const char *ns = (m & MF_CHANNEL_PARAM_NS) && p->ns ? p->ns : "default";
    size_t nl = strlen(ns);
    if (nl == 0 || nl > MF__MAX_NS)
        return mf__chan_error(ch, MF_INVALID_ARGUMENT, "namespace must be 1..%d bytes",
                              MF__MAX_NS);
    memcpy(ch->ns, ns, nl + 1);
    if (mf_frame_reader_init(&ch->rd, ch->max_frame) != MF_OK)
        return mf__chan_error(ch, MF_INVALID_ARGUMENT, "bad max_frame");
    if (!target || !target[0])
        return mf__chan_error(ch, MF_INVALID_ARGUMENT, "no target given");

    int64_t deadline = deadline_of(ch, MF_TIMEOUT_DEFAULT);
    mf_status_t st;
    if (strncmp(target, "unix:", 5) == 0)
        st = connect_unix(ch, target + 5, deadline);
    else if (strncmp(target, "tcp:", 4) == 0)
        st = connect_tcp(ch, target + 4, deadline);
    else if (strchr(target, '/') || !strchr(target, ':'))
        st = connect_unix(ch, target, deadline);
    else
        st = mf__chan_error(ch, MF_INVALID_ARGUMENT, "target must be unix:PATH or "
                            "tcp:HOST:PORT, got '%s'", target);
    if (st != MF_OK) {
        if (ch->fd >= 0) {
            close(ch->fd);
            ch->fd = -1;
        }
        return st;
    }
    int want_arena = (m & MF_CHANNEL_PARAM_WANT_ARENA) && p->want_arena;
    if (want_arena && !ch->is_unix)
        return mf__chan_error(ch, MF_INVALID_ARGUMENT, "the host arena is only passed over "
                              "a unix socket");
    return hello(ch, p, want_arena);
}

MF_EXPORT void mf_channel_close(mf_channel_t *ch)
{
    if (!ch)
        return;
    if (ch->fd >= 0)
        close(ch->fd);
    if (ch->arena)
        munmap(ch->arena, ch->arena_bytes);
    mf_frame_reader_deinit(&ch->rd);
    free(ch->daemon_version);
    pthread_mutex_destroy(&ch->mu);
    free(ch);
}

MF_EXPORT const char *mf_channel_last_error(const mf_channel_t *ch)
{
    return ch ? ch->err : "no channel";
}

MF_EXPORT int mf_channel_has_arena(const mf_channel_t *ch)
{
    return ch && ch->arena != NULL;
}

MF_EXPORT void mf_channel_info(const mf_channel_t *ch, mf_server_info_t *out)
{
    memset(out, 0, sizeof(*out));
    if (!ch)
        return;
    out->daemon_version = ch->daemon_version ? ch->daemon_version : "";
    out->session_id = ch->session_id;
    out->host_arena_bytes = ch->arena_bytes;
    out->max_frame = ch->server_max_frame;
    out->max_batch = ch->max_batch;
    out->gpu_tier = ch->gpu_tier;
}
