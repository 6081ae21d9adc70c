/* channel_conn — a channel's connection: socket connect (unix / tcp) or a UCX endpoint,
 * the Hello exchange with the host arena fd and its mapping (RemoteArena on UCX), the
 * daemon's GPU arenas; and the public open / close / info of a channel (see channel.h,
 * channel_internal.h). mf__conn_open runs on the thread that (re)connects, lock not held. */
#include "channel.h"
#include "channel_internal.h"
#include "mf_clock.h"

#include "mf_addr.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

/* ==== connection: connect, Hello, arena ============================================== */

static int set_nonblock(int fd)
{
    int fl = fcntl(fd, F_GETFL);
    return fl < 0 ? -1 : fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

/* Waits until fd is ready for events or the deadline passes. */
static mf_status_t wait_fd(int fd, short events, int64_t deadline, char *err)
{
    for (;;) {
        struct pollfd p = {.fd = fd, .events = events};
        int ms = mf__poll_ms(deadline);
        int r = ms == 0 ? 0 : poll(&p, 1, ms);
        if (r > 0)
            return MF_OK;
        if (r == 0) {
            mf__errf(err, "deadline exceeded");
            return MF_DEADLINE_EXCEEDED;
        }
        if (errno != EINTR) {
            mf__errf(err, "poll: %s", strerror(errno));
            return MF_UNAVAILABLE;
        }
    }
}

/* Non-blocking connect bounded by the deadline; fd is closed on failure. */
static mf_status_t connect_fd(int fd, const struct sockaddr *sa, socklen_t len,
                              int64_t deadline, const char *what, char *err)
{
    mf_status_t st = MF_OK;
    if (set_nonblock(fd) < 0) {
        mf__errf(err, "fcntl: %s", strerror(errno));
        st = MF_INTERNAL;
    } else if (connect(fd, sa, len) != 0) {
        if (errno != EINPROGRESS && errno != EAGAIN) {
            mf__errf(err, "cannot connect to %s: %s", what, strerror(errno));
            st = MF_UNAVAILABLE;
        } else if ((st = wait_fd(fd, POLLOUT, deadline, err)) == MF_OK) {
            int e = 0;
            socklen_t el = sizeof(e);
            if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &el) < 0)
                e = errno;
            if (e) {
                mf__errf(err, "cannot connect to %s: %s", what, strerror(e));
                st = MF_UNAVAILABLE;
            }
        }
    }
    if (st != MF_OK)
        close(fd);
    return st;
}

static mf_status_t connect_unix(mf__conn_t *c, const char *path, int64_t deadline, char *err)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (!path[0] || strlen(path) >= sizeof(sa.sun_path)) {
        mf__errf(err, "unix socket path is empty or longer than %zu bytes",
                 sizeof(sa.sun_path) - 1);
        return MF_INVALID_ARGUMENT;
    }
    memcpy(sa.sun_path, path, strlen(path) + 1);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        mf__errf(err, "socket: %s", strerror(errno));
        return MF_UNAVAILABLE;
    }
    char what[sizeof(sa.sun_path) + 8];
    snprintf(what, sizeof(what), "unix:%s", path);
    mf_status_t st = connect_fd(fd, (struct sockaddr *)&sa, sizeof(sa), deadline, what, err);
    if (st == MF_OK) {
        c->fd = fd;
        c->is_unix = 1;
    }
    return st;
}

static mf_status_t connect_tcp(mf__conn_t *c, const char *hostport, int64_t deadline,
                               char *err)
{
    char host[256], port_s[8];
    uint16_t port;
    if (mf_addr_split(hostport, host, sizeof(host), &port, 0) != MF_OK) {
        mf__errf(err, "tcp target must be HOST:PORT, got '%s'", hostport);
        return MF_INVALID_ARGUMENT;
    }
    snprintf(port_s, sizeof(port_s), "%u", (unsigned)port);
    /* Every address of the name is tried in turn, so this resolves here, not in mf_addr. */
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_family = AF_UNSPEC,
                             .ai_flags = AI_NUMERICSERV};
    struct addrinfo *res = NULL;
    int gai = getaddrinfo(host, port_s, &hints, &res);
    if (gai != 0) {
        mf__errf(err, "cannot resolve %s: %s", hostport, gai_strerror(gai));
        return MF_UNAVAILABLE;
    }
    mf_status_t st = MF_UNAVAILABLE;
    mf__errf(err, "no address for %s", hostport);
    for (struct addrinfo *a = res; a && st != MF_OK; a = a->ai_next) {
        int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0)
            continue;
        st = connect_fd(fd, a->ai_addr, a->ai_addrlen, deadline, hostport, err);
        if (st == MF_OK) {
            int one = 1;
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
            c->fd = fd;
        }
    }
    freeaddrinfo(res);
    return st;
}

/* Sends all of buf on a fresh connection (Hello only: nothing else is queued yet). */
static mf_status_t send_all(int fd, const uint8_t *buf, size_t len, int64_t deadline,
                            char *err)
{
    while (len > 0) {
        ssize_t w = send(fd, buf, len, MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                mf_status_t st = wait_fd(fd, POLLOUT, deadline, err);
                if (st != MF_OK)
                    return st;
                continue;
            }
            mf__errf(err, "send: %s", strerror(errno));
            return MF_UNAVAILABLE;
        }
        buf += w;
        len -= (size_t)w;
    }
    return MF_OK;
}

/* Reads into the frame reader; an fd that arrives with the bytes (the host arena, sent
 * with HelloReply) is kept in *fd_out if it is still -1, else closed. r = 0: EOF,
 * r < 0 with errno EAGAIN: nothing now. */
static ssize_t recv_some(int fd, int is_unix, mf_frame_reader_t *rd, int *fd_out)
{
    uint8_t *p;
    size_t avail;
    if (mf_frame_reader_space(rd, MF__RECV_CHUNK, &p, &avail) != MF_OK) {
        errno = ENOMEM;
        return -1;
    }
    union {
        struct cmsghdr h;
        char buf[CMSG_SPACE(sizeof(int) * 4)];
    } cm;
    struct iovec iov = {p, avail};
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};
    if (is_unix) {
        m.msg_control = cm.buf;
        m.msg_controllen = sizeof(cm.buf);
    }
    ssize_t r;
    do
        r = recvmsg(fd, &m, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
    while (r < 0 && errno == EINTR);
    for (struct cmsghdr *c = is_unix && r >= 0 ? CMSG_FIRSTHDR(&m) : NULL; c;
         c = CMSG_NXTHDR(&m, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
            continue;
        size_t nfd = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < nfd; i++) {
            int got;
            memcpy(&got, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
            if (fd_out && *fd_out < 0)
                *fd_out = got;
            else
                close(got);
        }
    }
    if (r > 0)
        mf_frame_reader_commit(rd, (size_t)r);
    return r;
}

static mf_status_t map_arena(mf__conn_t *c, int fd, uint64_t bytes, char *err)
{
    struct stat sb;
    if (fstat(fd, &sb) < 0 || (uint64_t)sb.st_size < bytes || bytes == 0) {
        mf__errf(err, "host arena fd is smaller than the %llu bytes announced",
                 (unsigned long long)bytes);
        return MF_INTERNAL;
    }
    void *p = mmap(NULL, (size_t)bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        mf__errf(err, "mmap of the host arena: %s", strerror(errno));
        return MF_RESOURCE_EXHAUSTED;
    }
    c->arena = p;
    c->arena_bytes = (size_t)bytes;
    return MF_OK;
}

void mf__conn_release(mf_channel_t *ch, mf__conn_t *c)
{
    mf__gpu_set_free(ch->gpu, &c->gpu);
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    mf__ucx_close(c->ucx);
    c->ucx = NULL;
    mf__gpu_pin_end(c->arena_pin);
    c->arena_pin = NULL;
    if (c->arena)
        munmap(c->arena, c->arena_bytes);
    c->arena = NULL;
    free(c->daemon_version);
    c->daemon_version = NULL;
}

/* ---- the connection's byte moves, whatever the transport --------------------------- */

static mf_status_t conn_send(mf__conn_t *c, const uint8_t *buf, size_t len, int64_t deadline,
                             char *err)
{
    if (!c->ucx)
        return send_all(c->fd, buf, len, deadline, err);
    mf_status_t st = mf__ucx_send(c->ucx, buf, len);
    if (st != MF_OK)
        mf__errf(err, "send: %s", st == MF_UNAVAILABLE ? mf__ucx_error(c->ucx) : "out of memory");
    return st;
}

/* As recv_some (r = 0: the connection is gone). */
ssize_t mf__conn_recv(mf__conn_t *c, mf_frame_reader_t *rd, int *fd_out)
{
    return c->ucx ? mf__ucx_recv(c->ucx, rd) : recv_some(c->fd, c->is_unix, rd, fd_out);
}

const char *mf__conn_gone_why(const mf__conn_t *c)
{
    return c->ucx ? mf__ucx_error(c->ucx) : "daemon closed the connection";
}

static mf_status_t conn_wait(mf__conn_t *c, int64_t deadline, char *err)
{
    if (!c->ucx)
        return wait_fd(c->fd, POLLIN, deadline, err);
    mf_status_t st = mf__ucx_wait(c->ucx, deadline);
    if (st != MF_OK)
        mf__errf(err, "deadline exceeded");
    return st;
}

/* One request and its reply on a connection the I/O thread does not serve yet (Hello,
 * RemoteArena). Uses ch->rd, which only the thread that (re)connects touches. An fd that
 * arrives with the reply is put in *fd (if fd is not NULL and *fd is -1). */
static mf_status_t exchange(mf_channel_t *ch, mf__conn_t *c, mf_envelope_t *req, int want_case,
                            int64_t deadline, int *fd, mf_envelope_t **reply, char *err)
{
    *reply = NULL;
    uint8_t *buf;
    size_t len;
    if (mf_frame_encode(req, NULL, 0, ch->max_frame, &buf, &len) != MF_OK) {
        mf__errf(err, "cannot encode %s", mf_envelope_body_name((int)req->body_case));
        return MF_INVALID_ARGUMENT;
    }
    mf_status_t st = conn_send(c, buf, len, deadline, err);
    free(buf);
    mf_envelope_t *env = NULL;
    while (st == MF_OK && !env) {
        mf_frame_t f;
        int have;
        const char *why = NULL;
        if (mf_frame_reader_next(&ch->rd, &f, &have, &why) != MF_OK) {
            mf__errf(err, "bad reply frame from the daemon: %s", why);
            st = MF_INTERNAL;
        } else if (!have) {
            ssize_t r = mf__conn_recv(c, &ch->rd, fd);
            if (r == 0) {
                mf__errf(err, "%s", mf__conn_gone_why(c));
                st = MF_UNAVAILABLE;
            } else if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
                st = conn_wait(c, deadline, err);
            } else if (r < 0) {
                mf__errf(err, "recv: %s", strerror(errno));
                st = MF_UNAVAILABLE;
            }
        } else if ((st = mf_envelope_decode(&f, &env, &why)) != MF_OK) {
            mf__errf(err, "undecodable reply from the daemon: %s", why);
            st = MF_INTERNAL;
        }
    }
    if (st == MF_OK)
        st = mf_session_reply_status(env, want_case, err, MF__ERR_LEN);
    if (st == MF_OK)
        *reply = env;
    else if (env)
        mf_envelope_free(env);
    return st;
}

/* UCX: where the daemon's arena is, for the RMA of puts and gets. */
static mf_status_t remote_arena(mf_channel_t *ch, mf__conn_t *c, uint64_t rid, int64_t deadline,
                                char *err)
{
    Mapflow__V1__RemoteArena ra = MAPFLOW__V1__REMOTE_ARENA__INIT;
    ENV(req, REMOTE_ARENA, remote_arena) = &ra;
    req.request_id = rid;
    mf_envelope_t *env;
    mf_status_t st = exchange(ch, c, &req, MAPFLOW__V1__ENVELOPE__BODY_REMOTE_ARENA_REPLY,
                              deadline, NULL, &env, err);
    if (st != MF_OK)
        return st;
    const Mapflow__V1__RemoteArenaReply *r = env->remote_arena_reply;
    st = mf_session_far_arena(&c->far, env, err, MF__ERR_LEN);
    if (st == MF_OK) {
        st = mf__ucx_set_remote(c->ucx, r->address, r->bytes, r->rkey.data, r->rkey.len);
        if (st != MF_OK)
            mf__errf(err, "RemoteArenaReply: %s", st == MF_UNAVAILABLE ? mf__ucx_error(c->ucx)
                                                                       : "unusable rkey");
    }
    mf_envelope_free(env);
    return st;
}

/* Opens the GPU arenas a HelloReply announced; mappings retired by earlier connections
 * of the same daemon are taken over. Runs on the thread that (re)connects: ch->retired
 * changes only there (and at close). */
static void map_gpu_arenas(mf_channel_t *ch, mf__conn_t *c)
{
    size_t n = 0;
    for (mf__retired_t *r = ch->retired; r; r = r->next)
        n += r->gpu.n > 0;
    mf__gpu_set_t **pool = n ? malloc(n * sizeof(*pool)) : NULL;
    size_t k = 0;
    for (mf__retired_t *r = ch->retired; pool && r; r = r->next)
        if (r->gpu.n)
            pool[k++] = &r->gpu;
    mf__gpu_set_map(ch->gpu, &c->gpu, pool, k);
    free(pool);
}

/* 0 when the environment variable says off (or 0). MAPFLOW_HOST_PIN=off: leave the host
 * arena pageable (a process that cannot afford page-locking the whole arena, or to
 * compare). MAPFLOW_GPU_ARENAS=off: a gpu_device channel does not ask for the daemon's GPU
 * arenas (its GPU rows come back staged in the pinned host arena: the staged path measured
 * on its own, as with a GPU the arenas cannot be opened from). */
static int env_on(const char *name)
{
    const char *v = getenv(name);
    return !(v && (!strcmp(v, "off") || !strcmp(v, "0")));
}

/* Hello on a new connection: waits for HelloReply (and the arena fd); on UCX then asks
 * for the remote arena. */
static mf_status_t hello(mf_channel_t *ch, mf__conn_t *c, uint64_t rid, int64_t deadline,
                         char *err)
{
    Mapflow__V1__Hello h;
    /* On UCX the arena is never mapped here, but asking for it allows RMA on it. */
    mf_session_hello_init(&h, ch->ns, ch->token,
                          ch->client_name ? ch->client_name : "libmapflow",
                          ch->want_arena || c->ucx);
    h.admin_token = ch->admin_token ? ch->admin_token : "";
    /* Without a usable device nothing could be opened: the daemon then stages our GPU rows
     * through host memory, as for any client that did not ask. */
    h.want_gpu_arena = c->is_unix && mf__gpu_usable(ch->gpu) && env_on("MAPFLOW_GPU_ARENAS");
    ENV(req, HELLO, hello) = &h;
    req.request_id = rid;
    int fd = -1;
    mf_envelope_t *env = NULL;
    mf_status_t st = exchange(ch, c, &req, MAPFLOW__V1__ENVELOPE__BODY_HELLO_REPLY, deadline,
                              &fd, &env, err);
    if (st == MF_OK)
        st = mf_session_far_hello(&c->far, env, ch->max_frame, c->ucx ? MF_SESSION_REMOTE : 0,
                                  err, MF__ERR_LEN);
    if (st == MF_OK) {
        Mapflow__V1__HelloReply *hr = env->hello_reply;
        c->daemon_version = mf__strdup(hr->daemon_version ? hr->daemon_version : "");
        if (c->ucx)
            st = remote_arena(ch, c, rid + 1, deadline, err);
        else if (ch->want_arena && c->far.host_arena_fd && fd >= 0)
            st = map_arena(c, fd, c->far.host_arena_bytes, err);
        else if (ch->want_arena && c->far.host_arena_fd) {
            mf__errf(err, "HelloReply announced an arena fd that did not arrive");
            st = MF_INTERNAL;
        }
        /* Rows of GPU arenas we cannot map come back staged in the host arena and the
         * caller copies them to its device: pinned, that HtoD is direct DMA. */
        if (st == MF_OK && c->arena && mf__gpu_usable(ch->gpu) && env_on("MAPFLOW_HOST_PIN"))
            c->arena_pin = mf__gpu_pin_start(ch->gpu, c->arena, c->arena_bytes);
        if (st == MF_OK)
            c->aops = mf__arena_ops_pick(c, &c->arena_reach);
        if (st == MF_OK && h.want_gpu_arena && hr->n_gpu_arenas) {
            if (mf__gpu_set_parse(&c->gpu, hr) != MF_OK) {
                mf__errf(err, "out of memory");
                st = MF_RESOURCE_EXHAUSTED;
            } else {
                map_gpu_arenas(ch, c);
            }
        }
    }
    if (fd >= 0)
        close(fd); /* the mapping keeps the memory; the fd itself is not needed */
    if (env)
        mf_envelope_free(env);
    return st;
}

/* Connects to ch->target and says Hello; on success *c is the new connection. */
mf_status_t mf__conn_open(mf_channel_t *ch, mf__conn_t *c, uint64_t rid, int64_t deadline,
                          char *err)
{
    memset(c, 0, sizeof(*c));
    c->fd = -1;
    const char *t = ch->target;
    mf_status_t st;
    if (strncmp(t, "unix:", 5) == 0)
        st = connect_unix(c, t + 5, deadline, err);
    else if (strncmp(t, "tcp:", 4) == 0)
        st = connect_tcp(c, t + 4, deadline, err);
    else if (strncmp(t, "ucx:", 4) == 0)
        st = mf__ucx_connect(t + 4, ch->max_frame, &c->ucx, err, MF__ERR_LEN);
    else if (strchr(t, '/') || !strchr(t, ':'))
        st = connect_unix(c, t, deadline, err);
    else {
        mf__errf(err, "target must be unix:PATH, tcp:HOST:PORT or ucx:HOST:PORT, got '%s'", t);
        st = MF_INVALID_ARGUMENT;
    }
    if (st != MF_OK)
        return st;
    if (ch->want_arena && !c->is_unix && !c->ucx) {
        mf__errf(err, "the host arena is only passed over a unix socket");
        st = MF_INVALID_ARGUMENT;
    }
    mf_frame_reader_deinit(&ch->rd);
    if (st == MF_OK && mf_frame_reader_init(&ch->rd, ch->max_frame) != MF_OK) {
        mf__errf(err, "out of memory");
        st = MF_RESOURCE_EXHAUSTED;
    }
    if (st == MF_OK)
        st = hello(ch, c, rid, deadline, err);
    if (st != MF_OK)
        mf__conn_release(ch, c);
    return st;
}

/* ==== public channel API ============================================================= */

MF_EXPORT const char *mf_version(void)
{
    return MF_VERSION_STRING;
}

MF_EXPORT void mf_retry_policy_default(mf_retry_policy_t *p)
{
    if (!p)
        return;
    p->max_retries = 5;
    p->initial_backoff_ms = 20;
    p->max_backoff_ms = 1000;
    p->multiplier = 2.0f;
    p->jitter = 0.2f;
}

static mf_status_t open_params(mf_channel_t *ch, const mf_channel_params_t *p)
{
    uint64_t m = p ? p->field_mask : 0;
    if (m & MF_CHANNEL_PARAM_TIMEOUT_MS)
        ch->timeout_ms = p->timeout_ms;
    if ((m & MF_CHANNEL_PARAM_MAX_FRAME) && p->max_frame) {
        if (p->max_frame < MF_FRAME_MIN_MAX)
            return mf__chan_error(ch, MF_INVALID_ARGUMENT, "max_frame must be at least %u",
                                  MF_FRAME_MIN_MAX);
        ch->max_frame = p->max_frame;
    }
    if (m & MF_CHANNEL_PARAM_RETRY) {
        const mf_retry_policy_t *r = &p->retry;
        if (r->max_retries > 100 || r->initial_backoff_ms == 0 ||
            r->max_backoff_ms < r->initial_backoff_ms || !(r->multiplier >= 1.0f) ||
            r->multiplier > 10.0f || !(r->jitter >= 0.0f) || r->jitter > 1.0f)
            return mf__chan_error(ch, MF_INVALID_ARGUMENT, "retry policy: max_retries <= 100, "
                                  "0 < initial_backoff_ms <= max_backoff_ms, multiplier in "
                                  "[1, 10], jitter in [0, 1]");
        ch->retry = *r;
    }
    if (m & MF_CHANNEL_PARAM_VERIFY) {
        if (p->verify != MF_VERIFY_FULL && p->verify != MF_VERIFY_HEADER)
            return mf__chan_error(ch, MF_INVALID_ARGUMENT, "verify must be MF_VERIFY_FULL or "
                                  "MF_VERIFY_HEADER");
        ch->verify = p->verify;
    }
    const char *ns = (m & MF_CHANNEL_PARAM_NS) && p->ns ? p->ns : "default";
    size_t nl = strlen(ns);
    if (nl == 0 || nl > MF__MAX_NS)
        return mf__chan_error(ch, MF_INVALID_ARGUMENT, "namespace must be 1..%d bytes",
                              MF__MAX_NS);
    memcpy(ch->ns, ns, nl + 1);
    ch->want_arena = (m & MF_CHANNEL_PARAM_WANT_ARENA) && p->want_arena;
    ch->gpu_device = (m & MF_CHANNEL_PARAM_GPU) ? p->gpu_device : -1;
    if (ch->gpu_device < -1)
        return mf__chan_error(ch, MF_INVALID_ARGUMENT, "gpu_device must be a CUDA ordinal "
                              "or -1, got %d", ch->gpu_device);
    if (ch->gpu_device >= 0 && !(ch->gpu = mf__gpu_open(ch->gpu_device)))
        return mf__chan_error(ch, MF_RESOURCE_EXHAUSTED, "out of memory");
    const char *tok = (m & MF_CHANNEL_PARAM_TOKEN) && p->token ? p->token : "";
    const char *cn = (m & MF_CHANNEL_PARAM_CLIENT_NAME) && p->client_name ? p->client_name
                                                                         : "libmapflow";
    const char *atok = (m & MF_CHANNEL_PARAM_ADMIN_TOKEN) && p->admin_token ? p->admin_token
                                                                             : "";
    ch->token = mf__strdup(tok);
    ch->admin_token = mf__strdup(atok);
    ch->client_name = mf__strdup(cn);
    if (!ch->token || !ch->admin_token || !ch->client_name)
        return mf__chan_error(ch, MF_RESOURCE_EXHAUSTED, "out of memory");
    return MF_OK;
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
    mf_session_init(&ch->sess, 0);
    ch->conn.fd = -1;
    ch->wake_fd = -1;
    ch->gpu_device = -1;
    ch->timeout_ms = MF__DEFAULT_TIMEOUT_MS;
    ch->max_frame = MF_FRAME_DEFAULT_MAX;
    mf_retry_policy_default(&ch->retry);
    ch->next_due = INT64_MAX;
    ch->io_sleep_until = INT64_MIN;
    *out = ch;
    mf_status_t st = open_params(ch, p);
    if (st != MF_OK)
        return st;
    ch->reconnect_delay = ch->retry.initial_backoff_ms;
    ch->rng = (uint64_t)(uintptr_t)ch ^ (uint64_t)mf_now_ms() ^ 0x9E3779B97F4A7C15ull;
    if (mf_frame_reader_init(&ch->rd, ch->max_frame) != MF_OK)
        return mf__chan_error(ch, MF_INVALID_ARGUMENT, "bad max_frame");
    if (!target || !target[0])
        return mf__chan_error(ch, MF_INVALID_ARGUMENT, "no target given");
    ch->target = mf__strdup(target);
    ch->remote = strncmp(target, "ucx:", 4) == 0;
    ch->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (!ch->target || ch->wake_fd < 0)
        return mf__chan_error(ch, MF_RESOURCE_EXHAUSTED, "out of memory or fds");

    st = mf__conn_open(ch, &ch->conn, mf__do_hello_ids(ch),
                       mf__deadline_of(ch, MF_TIMEOUT_DEFAULT), ch->err);
    snprintf(ch->conn_err, sizeof(ch->conn_err), "%s", ch->err);
    if (st != MF_OK)
        return st;
    ch->gen = 1;
    ch->state = MF__CONNECTED;
    if (pthread_create(&ch->io, NULL, mf__io_main, ch) != 0)
        return mf__chan_error(ch, MF_RESOURCE_EXHAUSTED, "cannot start the I/O thread");
    ch->io_started = 1;
    return MF_OK;
}

MF_EXPORT void mf_channel_close(mf_channel_t *ch)
{
    if (!ch)
        return;
    if (ch->io_started) {
        pthread_mutex_lock(&ch->mu);
        ch->closing = 1;
        mf__wake_io(ch);
        pthread_mutex_unlock(&ch->mu);
        pthread_join(ch->io, NULL);
    }
    mf__conn_release(ch, &ch->conn);
    while (ch->retired) {
        mf__retired_t *r = ch->retired;
        ch->retired = r->next;
        mf__gpu_pin_end(r->arena_pin);
        if (r->arena)
            munmap(r->arena, r->bytes);
        mf__gpu_set_free(ch->gpu, &r->gpu);
        free(r->daemon_version);
        free(r);
    }
    while (ch->outq) {
        mf__outbuf_t *b = ch->outq;
        ch->outq = b->next;
        free(b);
    }
    mf__gpu_close(ch->gpu);
    if (ch->wake_fd >= 0)
        close(ch->wake_fd);
    mf_frame_reader_deinit(&ch->rd);
    mf_session_deinit(&ch->sess);
    free(ch->target);
    free(ch->token);
    if (ch->admin_token) /* a secret: not left in freed memory */
        explicit_bzero(ch->admin_token, strlen(ch->admin_token));
    free(ch->admin_token);
    free(ch->client_name);
    pthread_mutex_destroy(&ch->mu);
    free(ch);
}

MF_EXPORT const char *mf_channel_last_error(const mf_channel_t *ch)
{
    return ch ? ch->err : "no channel";
}

MF_EXPORT int mf_channel_has_arena(const mf_channel_t *ch)
{
    if (!ch)
        return 0;
    pthread_mutex_lock((pthread_mutex_t *)&ch->mu);
    int has = ch->conn.arena != NULL;
    pthread_mutex_unlock((pthread_mutex_t *)&ch->mu);
    return has;
}

MF_EXPORT void mf_channel_info(const mf_channel_t *ch, mf_server_info_t *out)
{
    memset(out, 0, sizeof(*out));
    if (!ch)
        return;
    pthread_mutex_lock((pthread_mutex_t *)&ch->mu);
    out->daemon_version = ch->conn.daemon_version ? ch->conn.daemon_version : "";
    out->session_id = ch->conn.far.session_id;
    out->host_arena_bytes = ch->conn.arena_reach;
    out->max_frame = ch->conn.far.max_frame;
    out->max_batch = ch->conn.far.max_batch;
    out->gpu_tier = ch->conn.far.gpu_tier;
    out->connected = ch->state == MF__CONNECTED && !ch->broken;
    out->reconnects = ch->reconnects;
    out->in_flight = ch->n_live;
    pthread_mutex_unlock((pthread_mutex_t *)&ch->mu);
}

void mf__do_gpu_want(mf_channel_t *ch, uint64_t *mapped, uint32_t *preferred)
{
    *mapped = ch->state == MF__CONNECTED ? mf__gpu_mask(&ch->conn.gpu) : 0;
    *preferred = *mapped ? mf__gpu_preferred(ch->gpu, &ch->conn.gpu) : 0;
}

uint64_t mf__chan_gpu_mapped(mf_channel_t *ch)
{
    uint64_t m;
    uint32_t pref;
    pthread_mutex_lock(&ch->mu);
    mf__do_gpu_want(ch, &m, &pref);
    pthread_mutex_unlock(&ch->mu);
    return m;
}

MF_EXPORT void mf_channel_gpu_info(const mf_channel_t *ch, mf_gpu_info_t *out)
{
    if (!out)
        return;
    if (!ch) {
        memset(out, 0, sizeof(*out));
        out->gpu_device = -1;
        return;
    }
    pthread_mutex_lock((pthread_mutex_t *)&ch->mu);
    mf__gpu_info(ch->gpu, ch->gpu_device, &ch->conn.gpu, out);
    out->host_arena_pinned = mf__gpu_pin_state(ch->conn.arena_pin);
    pthread_mutex_unlock((pthread_mutex_t *)&ch->mu);
}
