/* channel — connections, the I/O thread and the operation engine (see channel.h). */
#include "channel.h"
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
#include <time.h>
#include <unistd.h>

#include "cq.h"

#define RECV_CHUNK (64u << 10)
#define TABLE_SLOTS 4096u        /* id table buckets (power of two) */
#define UCX_WAKE_MS 200          /* longest sleep of the I/O thread on a UCX connection */

struct mf__outbuf {              /* bytes of frames the socket did not take at once */
    mf__outbuf_t *next;
    size_t len, off;
    uint8_t data[];
};

struct mf__retired {             /* what an earlier connection left, freed at close */
    mf__retired_t *next;
    uint8_t *arena;              /* leased views may still point here */
    size_t bytes;
    mf__gpu_pin_t *arena_pin;    /* unregistered before the munmap */
    mf__gpu_set_t gpu;           /* GPU arenas likewise (or taken over by a reconnect) */
    char *daemon_version;        /* mf_channel_info handed it out */
};

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

/* Absolute deadline (monotonic ms) for a call; INT64_MAX = none. */
static int64_t deadline_of(const mf_channel_t *ch, int64_t timeout_ms)
{
    if (timeout_ms == MF_TIMEOUT_DEFAULT)
        timeout_ms = ch->timeout_ms;
    if (timeout_ms < 0)
        return INT64_MAX;
    return mf_now_ms() + timeout_ms;
}

/* Milliseconds left for poll(2); -1 = forever, 0 = expired. */
static int poll_ms(int64_t deadline)
{
    if (deadline == INT64_MAX)
        return -1;
    int64_t left = deadline - mf_now_ms();
    if (left <= 0)
        return 0;
    return left > 1000000 ? 1000000 : (int)left;
}

static void errf(char *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void errf(char *err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, MF__ERR_LEN, fmt, ap);
    va_end(ap);
}

mf_status_t mf__chan_error(mf_channel_t *ch, mf_status_t st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    pthread_mutex_lock(&ch->mu);
    vsnprintf(ch->err, sizeof(ch->err), fmt, ap);
    pthread_mutex_unlock(&ch->mu);
    va_end(ap);
    return st;
}

static void wake_io(mf_channel_t *ch)
{
    uint64_t one = 1;
    ssize_t w = write(ch->wake_fd, &one, sizeof(one));
    (void)w; /* a full counter is still a pending wake-up */
}

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
        int ms = poll_ms(deadline);
        int r = ms == 0 ? 0 : poll(&p, 1, ms);
        if (r > 0)
            return MF_OK;
        if (r == 0) {
            errf(err, "deadline exceeded");
            return MF_DEADLINE_EXCEEDED;
        }
        if (errno != EINTR) {
            errf(err, "poll: %s", strerror(errno));
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
        errf(err, "fcntl: %s", strerror(errno));
        st = MF_INTERNAL;
    } else if (connect(fd, sa, len) != 0) {
        if (errno != EINPROGRESS && errno != EAGAIN) {
            errf(err, "cannot connect to %s: %s", what, strerror(errno));
            st = MF_UNAVAILABLE;
        } else if ((st = wait_fd(fd, POLLOUT, deadline, err)) == MF_OK) {
            int e = 0;
            socklen_t el = sizeof(e);
            if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &el) < 0)
                e = errno;
            if (e) {
                errf(err, "cannot connect to %s: %s", what, strerror(e));
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
        errf(err, "unix socket path is empty or longer than %zu bytes", sizeof(sa.sun_path) - 1);
        return MF_INVALID_ARGUMENT;
    }
    memcpy(sa.sun_path, path, strlen(path) + 1);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        errf(err, "socket: %s", strerror(errno));
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
        errf(err, "tcp target must be HOST:PORT, got '%s'", hostport);
        return MF_INVALID_ARGUMENT;
    }
    snprintf(port_s, sizeof(port_s), "%u", (unsigned)port);
    /* Every address of the name is tried in turn, so this resolves here, not in mf_addr. */
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_family = AF_UNSPEC,
                             .ai_flags = AI_NUMERICSERV};
    struct addrinfo *res = NULL;
    int gai = getaddrinfo(host, port_s, &hints, &res);
    if (gai != 0) {
        errf(err, "cannot resolve %s: %s", hostport, gai_strerror(gai));
        return MF_UNAVAILABLE;
    }
    mf_status_t st = MF_UNAVAILABLE;
    errf(err, "no address for %s", hostport);
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
            errf(err, "send: %s", strerror(errno));
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
    if (mf_frame_reader_space(rd, RECV_CHUNK, &p, &avail) != MF_OK) {
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
        errf(err, "host arena fd is smaller than the %llu bytes announced",
             (unsigned long long)bytes);
        return MF_INTERNAL;
    }
    void *p = mmap(NULL, (size_t)bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        errf(err, "mmap of the host arena: %s", strerror(errno));
        return MF_RESOURCE_EXHAUSTED;
    }
    c->arena = p;
    c->arena_bytes = (size_t)bytes;
    return MF_OK;
}

static void conn_release(mf_channel_t *ch, mf__conn_t *c)
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

/* Turns an ErrorReply or a reply of the wrong type into a status and message. */
static mf_status_t reply_status(const mf_envelope_t *env, int want_case, char *err)
{
    if ((int)env->body_case == want_case)
        return MF_OK;
    if (env->body_case == MAPFLOW__V1__ENVELOPE__BODY_ERROR) {
        uint32_t code = env->error->code;
        mf_status_t st = (code != 0 && mf_status_valid((int)code)) ? (mf_status_t)code
                                                                   : MF_UNKNOWN;
        /* The message only: the status travels as the return value, and every caller
         * that prints both (mapflowctl, the Python binding) adds the name itself. */
        errf(err, "%s", env->error->message && env->error->message[0] ? env->error->message
                                                                     : mf_strerror((int)st));
        return st;
    }
    errf(err, "daemon answered %s where %s was expected",
         mf_envelope_body_name((int)env->body_case), mf_envelope_body_name(want_case));
    return MF_INTERNAL;
}

/* ---- the connection's byte moves, whatever the transport --------------------------- */

static mf_status_t conn_send(mf__conn_t *c, const uint8_t *buf, size_t len, int64_t deadline,
                             char *err)
{
    if (!c->ucx)
        return send_all(c->fd, buf, len, deadline, err);
    mf_status_t st = mf__ucx_send(c->ucx, buf, len);
    if (st != MF_OK)
        errf(err, "send: %s", st == MF_UNAVAILABLE ? mf__ucx_error(c->ucx) : "out of memory");
    return st;
}

/* As recv_some (r = 0: the connection is gone). */
static ssize_t conn_recv(mf__conn_t *c, mf_frame_reader_t *rd, int *fd_out)
{
    return c->ucx ? mf__ucx_recv(c->ucx, rd) : recv_some(c->fd, c->is_unix, rd, fd_out);
}

static const char *conn_gone_why(const mf__conn_t *c)
{
    return c->ucx ? mf__ucx_error(c->ucx) : "daemon closed the connection";
}

static mf_status_t conn_wait(mf__conn_t *c, int64_t deadline, char *err)
{
    if (!c->ucx)
        return wait_fd(c->fd, POLLIN, deadline, err);
    mf_status_t st = mf__ucx_wait(c->ucx, deadline);
    if (st != MF_OK)
        errf(err, "deadline exceeded");
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
        errf(err, "cannot encode %s", mf_envelope_body_name((int)req->body_case));
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
            errf(err, "bad reply frame from the daemon: %s", why);
            st = MF_INTERNAL;
        } else if (!have) {
            ssize_t r = conn_recv(c, &ch->rd, fd);
            if (r == 0) {
                errf(err, "%s", conn_gone_why(c));
                st = MF_UNAVAILABLE;
            } else if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
                st = conn_wait(c, deadline, err);
            } else if (r < 0) {
                errf(err, "recv: %s", strerror(errno));
                st = MF_UNAVAILABLE;
            }
        } else if ((st = mf_envelope_decode(&f, &env, &why)) != MF_OK) {
            errf(err, "undecodable reply from the daemon: %s", why);
            st = MF_INTERNAL;
        }
    }
    if (st == MF_OK)
        st = reply_status(env, want_case, err);
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
    st = mf__ucx_set_remote(c->ucx, r->address, r->bytes, r->rkey.data, r->rkey.len);
    if (st != MF_OK)
        errf(err, "RemoteArenaReply: %s", st == MF_UNAVAILABLE ? mf__ucx_error(c->ucx)
                                                               : "unusable address or rkey");
    else
        c->remote_bytes = r->bytes;
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
    Mapflow__V1__Hello h = MAPFLOW__V1__HELLO__INIT;
    h.protocol_version = MF_PROTOCOL_VERSION;
    h.namespace_ = ch->ns;
    h.token = ch->token ? ch->token : "";
    h.admin_token = ch->admin_token ? ch->admin_token : "";
    h.client_name = ch->client_name ? ch->client_name : "libmapflow";
    /* On UCX the arena is never mapped here, but asking for it allows RMA on it. */
    h.want_host_arena = ch->want_arena || c->ucx;
    /* Without a usable device nothing could be opened: the daemon then stages our GPU rows
     * through host memory, as for any client that did not ask. */
    h.want_gpu_arena = c->is_unix && mf__gpu_usable(ch->gpu) && env_on("MAPFLOW_GPU_ARENAS");
    ENV(req, HELLO, hello) = &h;
    req.request_id = rid;
    int fd = -1;
    mf_envelope_t *env = NULL;
    mf_status_t st = exchange(ch, c, &req, MAPFLOW__V1__ENVELOPE__BODY_HELLO_REPLY, deadline,
                              &fd, &env, err);
    if (st == MF_OK) {
        Mapflow__V1__HelloReply *hr = env->hello_reply;
        c->daemon_version = mf__strdup(hr->daemon_version ? hr->daemon_version : "");
        c->session_id = hr->session_id;
        c->server_max_frame = hr->max_frame >= MF_FRAME_MIN_MAX && hr->max_frame < ch->max_frame
                                  ? hr->max_frame
                                  : ch->max_frame;
        c->max_batch = hr->max_batch;
        c->gpu_tier = hr->gpu_tier;
        if (c->ucx)
            st = remote_arena(ch, c, rid + 1, deadline, err);
        else if (ch->want_arena && hr->host_arena_fd && fd >= 0)
            st = map_arena(c, fd, hr->host_arena_bytes, err);
        else if (ch->want_arena && hr->host_arena_fd) {
            errf(err, "HelloReply announced an arena fd that did not arrive");
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
                errf(err, "out of memory");
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
static mf_status_t conn_open(mf_channel_t *ch, mf__conn_t *c, uint64_t rid, int64_t deadline,
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
        errf(err, "target must be unix:PATH, tcp:HOST:PORT or ucx:HOST:PORT, got '%s'", t);
        st = MF_INVALID_ARGUMENT;
    }
    if (st != MF_OK)
        return st;
    if (ch->want_arena && !c->is_unix && !c->ucx) {
        errf(err, "the host arena is only passed over a unix socket");
        st = MF_INVALID_ARGUMENT;
    }
    mf_frame_reader_deinit(&ch->rd);
    if (st == MF_OK && mf_frame_reader_init(&ch->rd, ch->max_frame) != MF_OK) {
        errf(err, "out of memory");
        st = MF_RESOURCE_EXHAUSTED;
    }
    if (st == MF_OK)
        st = hello(ch, c, rid, deadline, err);
    if (st != MF_OK)
        conn_release(ch, c);
    return st;
}

/* ==== operations: table, list, completion ============================================ */

mf__op_t *mf__op_new(mf_channel_t *ch, const mf__op_vt_t *vt, void *priv)
{
    mf__op_t *op = calloc(1, sizeof(*op));
    if (!op)
        return NULL;
    op->ch = ch;
    op->vt = vt;
    op->priv = priv;
    op->refs = 1;
    op->deadline = INT64_MAX;
    return op;
}

void mf__op_unref(mf__op_t *op)
{
    if (!op || __atomic_sub_fetch(&op->refs, 1, __ATOMIC_ACQ_REL) > 0)
        return;
    if (op->vt->destroy)
        op->vt->destroy(op);
    if (op->has_cv)
        pthread_cond_destroy(&op->cv);
    free(op->req);
    free(op);
}

int mf__op_error(mf__op_t *op, mf_status_t st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(op->err, sizeof(op->err), fmt, ap);
    va_end(ap);
    return (int)st;
}

const mf__conn_t *mf__op_conn(const mf__op_t *op)
{
    return &op->ch->conn;
}

mf_status_t mf__op_pack(mf__op_t *op, const mf_envelope_t *env, const void *payload,
                        size_t payload_len, int want_case)
{
    /* Packed once without request_id; every send appends field 1 (protobuf: the last
     * occurrence of a scalar field wins), so a retry needs no re-encoding. */
    mf_envelope_t e = *env;
    e.request_id = 0;
    size_t n = mapflow__v1__envelope__get_packed_size(&e);
    uint8_t *b = malloc(n ? n : 1);
    if (!b)
        return (mf_status_t)mf__op_error(op, MF_RESOURCE_EXHAUSTED, "out of memory");
    mapflow__v1__envelope__pack(&e, b);
    free(op->req);
    op->req = b;
    op->req_len = n;
    op->payload = payload;
    op->payload_len = payload_len;
    op->want_case = want_case;
    return MF_OK;
}

static size_t table_slot(const mf_channel_t *ch, uint64_t rid)
{
    return (size_t)(rid * 0x9E3779B97F4A7C15ull >> 40) & ch->table_mask;
}

static void do_table_put(mf_channel_t *ch, mf__op_t *op)
{
    size_t s = table_slot(ch, op->rid);
    op->hnext = ch->table[s];
    ch->table[s] = op;
}

static mf__op_t *do_table_take(mf_channel_t *ch, uint64_t rid)
{
    mf__op_t **pp = &ch->table[table_slot(ch, rid)];
    for (; *pp; pp = &(*pp)->hnext)
        if ((*pp)->rid == rid) {
            mf__op_t *op = *pp;
            *pp = op->hnext;
            op->hnext = NULL;
            return op;
        }
    return NULL;
}

static void do_note_due(mf_channel_t *ch, int64_t t)
{
    if (t < ch->next_due)
        ch->next_due = t;
    if (t < ch->io_sleep_until)
        wake_io(ch);
}

static void do_kid_done(mf_channel_t *ch, mf__op_t *kid);

/* The op's final status is known: undo, unlink, tell its owner, drop the library ref. */
static void do_complete(mf_channel_t *ch, mf__op_t *op, mf_status_t st)
{
    if (op->state == MF__OP_DONE)
        return;
    if (op->state == MF__OP_IN_FLIGHT)
        do_table_take(ch, op->rid);
    if (st != MF_OK && op->vt->undo)
        op->vt->undo(op);
    if (op->prev)
        op->prev->next = op->next;
    else
        ch->ops = op->next;
    if (op->next)
        op->next->prev = op->prev;
    op->prev = op->next = NULL;
    ch->n_live--;
    op->state = MF__OP_DONE;
    op->status = st;
    if (st == MF_OK)
        op->err[0] = '\0';
    else if (!op->err[0])
        snprintf(op->err, sizeof(op->err), "%s", mf_strerror((int)st));
    if (op->group)
        do_kid_done(ch, op);
    else
        op->done(op);
    mf__op_unref(op);
}

/* Backoff before retry n (0-based): initial × multiplier^n, capped, ± jitter. */
static int64_t do_backoff(mf_channel_t *ch, uint32_t n)
{
    const mf_retry_policy_t *r = &ch->retry;
    double d = r->initial_backoff_ms;
    for (uint32_t i = 0; i < n && d < r->max_backoff_ms; i++)
        d *= r->multiplier;
    if (d > r->max_backoff_ms)
        d = r->max_backoff_ms;
    ch->rng ^= ch->rng << 13;
    ch->rng ^= ch->rng >> 7;
    ch->rng ^= ch->rng << 17;
    double u = (double)(ch->rng >> 11) / (double)(1ull << 53); /* [0, 1) */
    d *= 1.0 + r->jitter * (2.0 * u - 1.0);
    return d < 1 ? 1 : (int64_t)d;
}

/* An attempt failed with st: retry it later when st is UNAVAILABLE and the policy and
 * deadline allow, else complete the op with st. */
static void do_attempt_failed(mf_channel_t *ch, mf__op_t *op, mf_status_t st, const char *why)
{
    if (op->state == MF__OP_IN_FLIGHT)
        do_table_take(ch, op->rid);
    if (why && why != op->err)
        snprintf(op->err, sizeof(op->err), "%s", why);
    if (st == MF_UNAVAILABLE && !op->cancel_req && op->attempts < ch->retry.max_retries &&
        !ch->closing) {
        int64_t at = mf_now_ms() + do_backoff(ch, op->attempts);
        if (at < op->deadline) {
            if (op->vt->undo)
                op->vt->undo(op);
            op->attempts++;
            op->state = MF__OP_WAIT_SEND;
            op->retry_at = at;
            do_note_due(ch, at);
            return;
        }
    }
    do_complete(ch, op, st);
}

/* ==== sending ======================================================================== */

static void do_queue(mf_channel_t *ch, const struct iovec *iov, int n, size_t skip)
{
    size_t total = 0;
    for (int i = 0; i < n; i++)
        total += iov[i].iov_len;
    mf__outbuf_t *b = malloc(sizeof(*b) + total - skip);
    if (!b) {
        /* Part of a frame is on the wire and the rest cannot be kept: the stream is lost. */
        ch->broken = 1;
        wake_io(ch);
        return;
    }
    b->next = NULL;
    b->len = total - skip;
    b->off = 0;
    size_t o = 0;
    for (int i = 0; i < n; i++) {
        size_t l = iov[i].iov_len;
        const uint8_t *p = iov[i].iov_base;
        if (skip >= l) {
            skip -= l;
            continue;
        }
        memcpy(b->data + o, p + skip, l - skip);
        o += l - skip;
        skip = 0;
    }
    int was_empty = ch->outq == NULL;
    if (ch->outq_tail)
        ch->outq_tail->next = b;
    else
        ch->outq = b;
    ch->outq_tail = b;
    if (was_empty)
        wake_io(ch); /* it must now poll for POLLOUT */
}

/* Writes a frame (head + payload) now if nothing is queued, queueing what the socket
 * does not take; never blocks. */
static void do_write_frame(mf_channel_t *ch, const uint8_t *head, size_t head_len,
                           const void *payload, size_t payload_len)
{
    struct iovec iov[2] = {{(void *)head, head_len}, {(void *)payload, payload_len}};
    int n = payload_len ? 2 : 1;
    /* UCX: the endpoint is the I/O thread's alone; each queued buffer is one frame. */
    if (ch->outq || ch->broken || ch->conn.ucx) {
        if (!ch->broken)
            do_queue(ch, iov, n, 0);
        return;
    }
    struct msghdr m = {.msg_iov = iov, .msg_iovlen = (size_t)n};
    ssize_t w;
    do
        w = sendmsg(ch->conn.fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
    while (w < 0 && errno == EINTR);
    if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
        snprintf(ch->conn_err, sizeof(ch->conn_err), "send: %s", strerror(errno));
        ch->broken = 1;
        wake_io(ch);
        return;
    }
    size_t sent = w < 0 ? 0 : (size_t)w;
    if (sent < head_len + payload_len)
        do_queue(ch, iov, n, sent);
}

/* Encodes the op's current request with a fresh id and writes it. Lock held, connected. */
static void do_send(mf_channel_t *ch, mf__op_t *op)
{
    uint8_t idf[11];
    size_t il = 0;
    uint64_t rid = ++ch->next_id;
    idf[il++] = 0x08; /* field 1, varint */
    for (uint64_t v = rid; ; v >>= 7) {
        idf[il++] = (uint8_t)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
        if (v <= 0x7f)
            break;
    }
    size_t msg_len = op->req_len + il;
    uint64_t frame_len = 4 + (uint64_t)msg_len + op->payload_len;
    uint32_t limit = ch->conn.server_max_frame ? ch->conn.server_max_frame : ch->max_frame;
    if (frame_len + 4 > limit) {
        mf__op_error(op, MF_RESOURCE_EXHAUSTED, "request of %zu payload bytes exceeds "
                     "max_frame %u", op->payload_len, limit);
        do_complete(ch, op, MF_RESOURCE_EXHAUSTED);
        return;
    }
    uint8_t stackbuf[512];
    size_t head_len = 8 + msg_len;
    uint8_t *head = head_len <= sizeof(stackbuf) ? stackbuf : malloc(head_len);
    if (!head) {
        mf__op_error(op, MF_RESOURCE_EXHAUSTED, "out of memory");
        do_complete(ch, op, MF_RESOURCE_EXHAUSTED);
        return;
    }
    uint32_t fl = (uint32_t)frame_len, ml = (uint32_t)msg_len;
    for (int i = 0; i < 4; i++) {
        head[i] = (uint8_t)(fl >> (8 * i));
        head[4 + i] = (uint8_t)(ml >> (8 * i));
    }
    memcpy(head + 8, op->req, op->req_len);
    memcpy(head + 8 + op->req_len, idf, il);
    op->rid = rid;
    op->gen = ch->gen;
    op->state = MF__OP_IN_FLIGHT;
    do_table_put(ch, op);
    do_write_frame(ch, head, head_len, op->payload, op->payload_len);
    if (head != stackbuf)
        free(head);
}

void mf__send_oneway(mf_channel_t *ch, const mf_envelope_t *env)
{
    pthread_mutex_lock(&ch->mu);
    mf__do_send_oneway(ch, env);
    pthread_mutex_unlock(&ch->mu);
}

void mf__do_send_oneway(mf_channel_t *ch, const mf_envelope_t *env)
{
    if (ch->state != MF__CONNECTED || ch->broken)
        return;
    mf_envelope_t e = *env;
    e.request_id = ++ch->next_id;
    uint8_t *buf;
    size_t len;
    uint32_t limit = ch->conn.server_max_frame ? ch->conn.server_max_frame : ch->max_frame;
    if (mf_frame_encode(&e, NULL, 0, limit, &buf, &len) != MF_OK)
        return;
    do_write_frame(ch, buf, len, NULL, 0);
    free(buf);
}

/* Begins an attempt: packs the first request and sends it, or waits for a connection. */
static void do_begin_attempt(mf_channel_t *ch, mf__op_t *op)
{
    mf_status_t st = op->vt->start(op);
    if (st != MF_OK) {
        do_complete(ch, op, st);
        return;
    }
    if (ch->state == MF__CONNECTED && !ch->broken) {
        do_send(ch, op);
        return;
    }
    op->state = MF__OP_WAIT_SEND;
    op->retry_at = mf_now_ms();
    do_note_due(ch, op->retry_at);
}

/* ==== the I/O thread ================================================================= */

/* Hands one queued buffer (a whole frame) to the UCX endpoint: 0, or -1 = broken. */
static int do_flush_ucx(mf_channel_t *ch, mf__outbuf_t *b)
{
    if (mf__ucx_send(ch->conn.ucx, b->data, b->len) == MF_OK) {
        b->off = b->len;
        return 0;
    }
    const char *why = mf__ucx_error(ch->conn.ucx);
    snprintf(ch->conn_err, sizeof(ch->conn_err), "send: %s", why[0] ? why : "out of memory");
    ch->broken = 1;
    return -1;
}

static void do_flush_outq(mf_channel_t *ch)
{
    while (ch->outq && !ch->broken) {
        mf__outbuf_t *b = ch->outq;
        if (ch->conn.ucx) {
            if (do_flush_ucx(ch, b) < 0)
                return;
        } else {
            ssize_t w = send(ch->conn.fd, b->data + b->off, b->len - b->off,
                             MSG_NOSIGNAL | MSG_DONTWAIT);
            if (w < 0) {
                if (errno == EINTR)
                    continue;
                if (errno != EAGAIN && errno != EWOULDBLOCK) {
                    snprintf(ch->conn_err, sizeof(ch->conn_err), "send: %s", strerror(errno));
                    ch->broken = 1;
                }
                return;
            }
            b->off += (size_t)w;
        }
        if (b->off == b->len) {
            ch->outq = b->next;
            if (!ch->outq)
                ch->outq_tail = NULL;
            free(b);
        }
    }
}

/* The connection is gone: fail what was sent on it (st: UNAVAILABLE, or INTERNAL for a
 * protocol violation, which a retry would not fix). The arena stays mapped (retired). */
static void do_disconnect(mf_channel_t *ch, mf_status_t st, const char *why)
{
    if (ch->state != MF__CONNECTED)
        return;
    char msg[MF__ERR_LEN];
    snprintf(msg, sizeof(msg), "%s", why);
    snprintf(ch->conn_err, sizeof(ch->conn_err), "%s", why);
    ch->state = MF__DISCONNECTED;
    ch->broken = 0;
    if (ch->conn.fd >= 0)
        close(ch->conn.fd);
    ch->conn.fd = -1;
    mf__ucx_close(ch->conn.ucx);
    ch->conn.ucx = NULL;
    ch->conn.remote_bytes = 0;
    mf__retired_t *r = malloc(sizeof(*r));
    if (r) {
        r->arena = ch->conn.arena;
        r->bytes = ch->conn.arena_bytes;
        r->arena_pin = ch->conn.arena_pin;
        r->daemon_version = ch->conn.daemon_version;
        r->gpu = ch->conn.gpu;
        r->next = ch->retired;
        ch->retired = r;
    } /* else: leak them rather than pull memory from under a leased view */
    memset(&ch->conn.gpu, 0, sizeof(ch->conn.gpu));
    ch->conn.arena = NULL;
    ch->conn.arena_bytes = 0;
    ch->conn.arena_pin = NULL;
    ch->conn.daemon_version = NULL;
    ch->conn.aops = mf__arena_ops_pick(&ch->conn, &ch->conn.arena_reach); /* none now */
    while (ch->outq) {
        mf__outbuf_t *b = ch->outq;
        ch->outq = b->next;
        free(b);
    }
    ch->outq_tail = NULL;
    mf_frame_reader_deinit(&ch->rd);
    mf_frame_reader_init(&ch->rd, ch->max_frame);
    ch->connect_after = mf_now_ms(); /* the next call may try at once */
    mf__op_t *next;
    for (mf__op_t *op = ch->ops; op; op = next) {
        next = op->next;
        if (op->state == MF__OP_IN_FLIGHT)
            do_attempt_failed(ch, op, st, msg);
    }
}

/* Reconnects (lock dropped meanwhile); on failure the due attempts fail. */
static void do_reconnect(mf_channel_t *ch, int64_t deadline)
{
    ch->state = MF__CONNECTING;
    mf__conn_t nc;
    char err[MF__ERR_LEN] = "";
    uint64_t rid = ++ch->next_id;
    pthread_mutex_unlock(&ch->mu);
    mf_status_t st = conn_open(ch, &nc, rid, deadline, err);
    pthread_mutex_lock(&ch->mu);
    int64_t now = mf_now_ms();
    if (st == MF_OK) {
        ch->conn = nc; /* the old one's leftovers are on ch->retired */
        ch->gen++;
        ch->reconnects++;
        ch->state = MF__CONNECTED;
        ch->reconnect_delay = ch->retry.initial_backoff_ms;
        ch->conn_err[0] = '\0';
        return;
    }
    ch->state = MF__DISCONNECTED;
    snprintf(ch->conn_err, sizeof(ch->conn_err), "reconnect: %.480s", err);
    ch->connect_after = now + ch->reconnect_delay;
    ch->reconnect_delay *= 2;
    if (ch->reconnect_delay > ch->retry.max_backoff_ms)
        ch->reconnect_delay = ch->retry.max_backoff_ms;
    if (ch->reconnect_delay < 1)
        ch->reconnect_delay = 1;
    /* A refused Hello (token, namespace) is final; anything else may heal. */
    mf_status_t fail = st == MF_DEADLINE_EXCEEDED ? MF_UNAVAILABLE : st;
    mf__op_t *next;
    for (mf__op_t *op = ch->ops; op; op = next) {
        next = op->next;
        if (op->state == MF__OP_WAIT_SEND && op->retry_at <= now)
            do_attempt_failed(ch, op, fail, ch->conn_err);
    }
}

/* Deadlines, cancellations, due (re)sends; recomputes next_due. */
static void do_timers(mf_channel_t *ch)
{
    int64_t now = mf_now_ms();
    int cancels = ch->cancels;
    ch->cancels = 0;
    if (now < ch->next_due && !cancels)
        return;
    int64_t due = INT64_MAX, connect_by = INT64_MAX;
    int want_send = 0;
    mf__op_t *next;
    for (mf__op_t *op = ch->ops; op; op = next) {
        next = op->next;
        if (op->state == MF__OP_IN_STEP)
            continue;
        if (op->cancel_req) {
            mf__op_error(op, MF_CANCELLED, "cancelled");
            do_complete(ch, op, MF_CANCELLED);
            continue;
        }
        if (op->deadline <= now) {
            mf__op_error(op, MF_DEADLINE_EXCEEDED, "deadline exceeded%s%s",
                         op->attempts ? " after retries: " : "", op->attempts ? op->err : "");
            do_complete(ch, op, MF_DEADLINE_EXCEEDED);
            continue;
        }
        if (op->deadline < due)
            due = op->deadline;
        if (op->state == MF__OP_WAIT_SEND) {
            if (op->retry_at <= now) {
                want_send = 1;
                if (op->deadline < connect_by)
                    connect_by = op->deadline;
            } else if (op->retry_at < due) {
                due = op->retry_at;
            }
        }
    }
    ch->next_due = due;
    if (!want_send)
        return;
    if (ch->state == MF__DISCONNECTED && now >= ch->connect_after) {
        int64_t cap = now + (ch->timeout_ms >= 0 ? ch->timeout_ms : MF__DEFAULT_TIMEOUT_MS);
        do_reconnect(ch, connect_by < cap ? connect_by : cap);
        if (ch->closing)
            return;
    }
    now = mf_now_ms();
    for (mf__op_t *op = ch->ops; op; op = next) {
        next = op->next;
        if (op->state != MF__OP_WAIT_SEND || op->retry_at > now)
            continue;
        if (ch->state == MF__CONNECTED && !ch->broken) {
            op->state = MF__OP_NEW;
            do_begin_attempt(ch, op);
        } else if (ch->retry.max_retries > op->attempts && ch->connect_after < op->deadline) {
            op->retry_at = ch->connect_after; /* wait for the next connect, not a retry */
            do_note_due(ch, op->retry_at);
        } else {
            do_attempt_failed(ch, op, MF_UNAVAILABLE,
                              ch->conn_err[0] ? ch->conn_err : "not connected");
        }
    }
}

/* Handles one reply frame. */
static void do_dispatch(mf_channel_t *ch, const mf_frame_t *f)
{
    mf_envelope_t *env = NULL;
    const char *why = NULL;
    mf_status_t st = mf_envelope_decode(f, &env, &why);
    if (st == MF_UNIMPLEMENTED)
        return; /* a reply type newer than us: not ours to interpret */
    if (st != MF_OK) {
        char msg[MF__ERR_LEN];
        snprintf(msg, sizeof(msg), "undecodable reply from the daemon: %s", why);
        do_disconnect(ch, MF_INTERNAL, msg);
        return;
    }
    mf__op_t *op = env->request_id ? do_table_take(ch, env->request_id) : NULL;
    if (!op) { /* a reply to a call that gave up (deadline, cancel) or to a one-way */
        mf_envelope_free(env);
        return;
    }
    op->state = MF__OP_IN_STEP;
    int r = reply_status(env, op->want_case, op->err);
    if (r == MF_OK) {
        mf__reply_t rep = {env, f->payload, f->payload_len};
        pthread_mutex_unlock(&ch->mu);
        r = op->vt->step(op, &rep);
        pthread_mutex_lock(&ch->mu);
    }
    mf_envelope_free(env);
    if (r == MF_OK)
        do_complete(ch, op, MF_OK);
    else if (op->cancel_req)
        do_complete(ch, op, (mf_status_t)mf__op_error(op, MF_CANCELLED, "cancelled"));
    else if (r == MF__CONTINUE && op->deadline <= mf_now_ms())
        do_complete(ch, op, (mf_status_t)mf__op_error(op, MF_DEADLINE_EXCEEDED,
                                                      "deadline exceeded"));
    else if (r == MF__CONTINUE)
        do_send(ch, op);
    else
        do_attempt_failed(ch, op, (mf_status_t)r, NULL);
}

static void do_read(mf_channel_t *ch)
{
    for (int rounds = 0; rounds < 64 && ch->state == MF__CONNECTED; rounds++) {
        ssize_t r = conn_recv(&ch->conn, &ch->rd, NULL);
        if (r == 0) {
            do_disconnect(ch, MF_UNAVAILABLE, conn_gone_why(&ch->conn));
            return;
        }
        if (r < 0) {
            if (errno != EAGAIN && errno != EWOULDBLOCK) {
                char msg[128];
                snprintf(msg, sizeof(msg), "recv: %s", strerror(errno));
                do_disconnect(ch, MF_UNAVAILABLE, msg);
            }
            return;
        }
        for (;;) {
            mf_frame_t f;
            int have;
            const char *why = NULL;
            if (mf_frame_reader_next(&ch->rd, &f, &have, &why) != MF_OK) {
                char msg[MF__ERR_LEN];
                snprintf(msg, sizeof(msg), "bad reply frame from the daemon: %s", why);
                do_disconnect(ch, MF_INTERNAL, msg);
                return;
            }
            if (!have)
                break;
            do_dispatch(ch, &f);
            if (ch->state != MF__CONNECTED)
                return;
        }
    }
}

static void *io_main(void *arg)
{
    mf_channel_t *ch = arg;
    pthread_mutex_lock(&ch->mu);
    while (!ch->closing) {
        if (ch->broken && ch->state == MF__CONNECTED)
            do_disconnect(ch, MF_UNAVAILABLE, ch->conn_err[0] ? ch->conn_err
                                                              : "connection broken");
        do_timers(ch);
        if (ch->closing)
            break;
        if (ch->state == MF__CONNECTED)
            do_flush_outq(ch);
        if (ch->broken)
            continue;
        struct pollfd p[2] = {{.fd = ch->wake_fd, .events = POLLIN}, {.fd = -1}};
        int n = 1;
        mf__ucx_t *ucx = ch->state == MF__CONNECTED ? ch->conn.ucx : NULL;
        if (ch->state == MF__CONNECTED) {
            p[1].fd = ucx ? mf__ucx_efd(ucx) : ch->conn.fd;
            p[1].events = POLLIN | (ch->outq && !ucx ? POLLOUT : 0);
            n = 2;
        }
        ch->io_sleep_until = ch->next_due;
        int ms = poll_ms(ch->io_sleep_until);
        /* UCX: sleep only on an armed worker, and wake now and then for the progress
         * that its event fd does not announce (wire-up, keepalive). */
        if (ucx && (ms < 0 || ms > UCX_WAKE_MS))
            ms = UCX_WAKE_MS;
        if (ucx && !mf__ucx_arm(ucx))
            ms = 0;
        pthread_mutex_unlock(&ch->mu);
        int r = poll(p, (nfds_t)n, ms);
        pthread_mutex_lock(&ch->mu);
        ch->io_sleep_until = INT64_MIN;
        if (r > 0 && (p[0].revents & POLLIN)) {
            uint64_t v;
            ssize_t rr = read(ch->wake_fd, &v, sizeof(v));
            (void)rr;
        }
        if (r >= 0 && n == 2 && ch->state == MF__CONNECTED && (p[1].revents || ucx))
            do_read(ch); /* POLLHUP / POLLERR show up as EOF or an error here */
    }
    /* Closing: every call still running ends now. */
    mf__op_t *next;
    for (mf__op_t *op = ch->ops; op; op = next) {
        next = op->next;
        mf__op_error(op, MF_CANCELLED, "channel closed");
        do_complete(ch, op, MF_CANCELLED);
    }
    pthread_mutex_unlock(&ch->mu);
    return NULL;
}

/* ==== starting and waiting =========================================================== */

/* Starts op with an absolute deadline. Lock held. */
static mf_status_t do_op_start(mf_channel_t *ch, mf__op_t *op, int64_t deadline)
{
    if (ch->closing || !ch->io_started)
        return (mf_status_t)mf__op_error(op, MF_UNAVAILABLE, "channel is not connected%s%s",
                                         ch->conn_err[0] ? ": " : "", ch->conn_err);
    op->deadline = deadline;
    __atomic_add_fetch(&op->refs, 1, __ATOMIC_ACQ_REL); /* the engine's, dropped at done */
    op->next = ch->ops;
    if (ch->ops)
        ch->ops->prev = op;
    ch->ops = op;
    ch->n_live++;
    if (op->deadline != INT64_MAX)
        do_note_due(ch, op->deadline);
    if (ch->state == MF__CONNECTED || ch->retry.max_retries > 0 || mf_now_ms() >= ch->connect_after)
        do_begin_attempt(ch, op);
    else /* fail fast: no retries and a reconnect was just refused */
        do_attempt_failed(ch, op, MF_UNAVAILABLE, ch->conn_err);
    return MF_OK;
}

static mf_status_t group_run(mf__op_t *g, int64_t timeout_ms);

mf_status_t mf__op_start(mf__op_t *op, int64_t timeout_ms)
{
    mf_channel_t *ch = op->ch;
    if (op->kids) /* a group: its kids are the operations */
        return group_run(op, timeout_ms);
    pthread_mutex_lock(&ch->mu);
    mf_status_t st = do_op_start(ch, op, deadline_of(ch, timeout_ms));
    pthread_mutex_unlock(&ch->mu);
    return st;
}

static void done_sync(mf__op_t *op)
{
    op->finished = 1;
    pthread_cond_signal(&op->cv);
}

mf_status_t mf__op_run(mf__op_t *op, int64_t timeout_ms)
{
    mf_channel_t *ch = op->ch;
    pthread_cond_init(&op->cv, NULL);
    op->has_cv = 1;
    op->done = done_sync;
    mf_status_t st = mf__op_start(op, timeout_ms);
    pthread_mutex_lock(&ch->mu);
    if (st == MF_OK) {
        while (!op->finished)
            pthread_cond_wait(&op->cv, &ch->mu);
        st = op->status;
    }
    snprintf(ch->err, sizeof(ch->err), "%s", st == MF_OK ? "" : op->err);
    pthread_mutex_unlock(&ch->mu);
    mf__op_unref(op);
    return st;
}

static void done_cq(mf__op_t *op)
{
    mf__cq_post(op->cq, op->tag, op->status, op->err);
}

mf_status_t mf__op_run_async(mf__op_t *op, int64_t timeout_ms, mf_cq_t *cq, void *tag,
                             mf_call_t **call)
{
    mf_channel_t *ch = op->ch;
    if (call)
        *call = NULL;
    mf_status_t st = cq ? mf__cq_begin(cq) : MF_INVALID_ARGUMENT;
    if (st != MF_OK) {
        mf__chan_error(ch, st, cq ? "the completion queue is shut down" : "no completion queue");
        mf__op_unref(op);
        return st;
    }
    op->cq = cq;
    op->tag = tag;
    op->done = done_cq;
    if (call) {
        __atomic_add_fetch(&op->refs, 1, __ATOMIC_ACQ_REL);
        *call = op;
    }
    st = mf__op_start(op, timeout_ms);
    if (st != MF_OK) {
        mf__cq_abandon(cq);
        pthread_mutex_lock(&ch->mu);
        snprintf(ch->err, sizeof(ch->err), "%s", op->err);
        pthread_mutex_unlock(&ch->mu);
        if (call) {
            *call = NULL;
            mf__op_unref(op);
        }
    }
    mf__op_unref(op);
    return st;
}

MF_EXPORT mf_status_t mf_call_cancel(mf_call_t *call)
{
    if (!call)
        return MF_INVALID_ARGUMENT;
    mf_channel_t *ch = call->ch;
    pthread_mutex_lock(&ch->mu);
    mf_status_t st = MF_OK;
    if (call->state == MF__OP_DONE) {
        st = MF_FAILED_PRECONDITION;
    } else {
        call->cancel_req = 1;
        for (size_t i = 0; i < call->n_kids; i++)
            call->kids[i]->cancel_req = 1;
        ch->cancels = 1;
        wake_io(ch);
    }
    pthread_mutex_unlock(&ch->mu);
    return st;
}

MF_EXPORT void mf_call_free(mf_call_t *call)
{
    mf__op_unref(call);
}

/* ==== one-request operations ========================================================= */

typedef struct simple {
    mf__take_fn take;
    void *arg;
    void (*free_arg)(void *);
} simple_t;

static mf_status_t simple_start(mf__op_t *op)
{
    (void)op; /* packed once at creation; a retry sends the same bytes */
    return MF_OK;
}

static int simple_step(mf__op_t *op, const mf__reply_t *rep)
{
    simple_t *s = op->priv;
    return s->take ? (int)s->take(op, rep, s->arg) : MF_OK;
}

static void simple_destroy(mf__op_t *op)
{
    simple_t *s = op->priv;
    if (s->free_arg)
        s->free_arg(s->arg);
    free(s);
}

static const mf__op_vt_t simple_vt = {simple_start, simple_step, NULL, simple_destroy};

mf__op_t *mf__simple_new(mf_channel_t *ch, const mf_envelope_t *req, const void *payload,
                         size_t payload_len, int want_case, mf__take_fn take, void *arg,
                         void (*free_arg)(void *))
{
    simple_t *s = malloc(sizeof(*s));
    mf__op_t *op = s ? mf__op_new(ch, &simple_vt, s) : NULL;
    if (!op) {
        free(s);
        if (free_arg)
            free_arg(arg);
        mf__chan_error(ch, MF_RESOURCE_EXHAUSTED, "out of memory");
        return NULL;
    }
    *s = (simple_t){take, arg, free_arg};
    if (mf__op_pack(op, req, payload, payload_len, want_case) != MF_OK) {
        mf__chan_error(ch, MF_RESOURCE_EXHAUSTED, "out of memory");
        mf__op_unref(op);
        return NULL;
    }
    return op;
}

/* ==== groups (batched calls) ========================================================= */

static mf_status_t group_start(mf__op_t *op)
{
    (void)op;
    return MF_INTERNAL; /* a group sends nothing itself */
}

static void group_destroy(mf__op_t *op)
{
    for (size_t i = 0; i < op->n_kids; i++)
        mf__op_unref(op->kids[i]);
    free(op->kids);
    if (op->group_free)
        op->group_free(op->priv);
}

static const mf__op_vt_t group_vt = {group_start, NULL, NULL, group_destroy};

mf__op_t *mf__group_new(mf_channel_t *ch, size_t n, void *priv, void (*free_priv)(void *))
{
    mf__op_t *g = mf__op_new(ch, &group_vt, priv);
    mf__op_t **kids = calloc(n ? n : 1, sizeof(*kids));
    if (!g || !kids) {
        free(g);
        free(kids);
        if (free_priv)
            free_priv(priv);
        mf__chan_error(ch, MF_RESOURCE_EXHAUSTED, "out of memory");
        return NULL;
    }
    g->kids = kids;
    g->group_free = free_priv;
    return g;
}

void mf__group_add(mf__op_t *g, mf__op_t *kid)
{
    kid->group = g;
    kid->done = NULL;
    g->kids[g->n_kids++] = kid; /* the group's reference */
}

static void do_group_pump(mf_channel_t *ch, mf__op_t *g);

/* A kid finished (lock held): record it, start more; the last one finishes the group. */
static void do_kid_done(mf_channel_t *ch, mf__op_t *kid)
{
    mf__op_t *g = kid->group;
    g->window_bytes -= kid->weight;
    if (kid->status != MF_OK && (g->status == MF_OK || kid->group_index < g->fail_index)) {
        g->status = kid->status;
        g->fail_index = kid->group_index;
        snprintf(g->err, sizeof(g->err), "item %zu: %.400s", kid->group_index, kid->err);
    }
    if (g->group_kid_done)
        g->group_kid_done(kid);
    if (--g->kids_left > 0) {
        if (!g->pumping)
            do_group_pump(ch, g);
        return;
    }
    g->state = MF__OP_DONE;
    g->done(g);
    mf__op_unref(g); /* the engine's reference */
}

/* Starts kids while their bytes fit the window (at least one runs): a batch pipelines
 * as far as the daemon can hold the reservations at once, never all of a huge batch.
 * Lock held. */
static void do_group_pump(mf_channel_t *ch, mf__op_t *g)
{
    __atomic_add_fetch(&g->refs, 1, __ATOMIC_ACQ_REL); /* a failing start may finish g */
    g->pumping = 1;
    while (g->next_kid < g->n_kids) {
        mf__op_t *k = g->kids[g->next_kid];
        if (g->window_bytes > 0 && g->window_bytes + k->weight > g->window_budget)
            break;
        k->group_index = g->next_kid++;
        g->window_bytes += k->weight;
        if (do_op_start(ch, k, g->deadline) != MF_OK) { /* closing: it never ran */
            k->state = MF__OP_DONE;
            k->status = MF_UNAVAILABLE;
            do_kid_done(ch, k);
        }
    }
    g->pumping = 0;
    mf__op_unref(g);
}

/* Starts the kids; the group completes through g->done when the last one finishes. */
static mf_status_t group_run(mf__op_t *g, int64_t timeout_ms)
{
    mf_channel_t *ch = g->ch;
    pthread_mutex_lock(&ch->mu);
    g->status = MF_OK;
    g->fail_index = SIZE_MAX;
    g->kids_left = g->n_kids;
    g->state = MF__OP_IN_FLIGHT;
    g->deadline = deadline_of(ch, timeout_ms);
    /* A quarter of the arena (the daemon's host tier); 16 MiB without one. */
    uint64_t arena = ch->conn.arena_reach;
    g->window_budget = arena ? arena / 4 : (16u << 20);
    __atomic_add_fetch(&g->refs, 1, __ATOMIC_ACQ_REL); /* the engine's */
    do_group_pump(ch, g);
    pthread_mutex_unlock(&ch->mu);
    return MF_OK;
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
    ch->table_mask = TABLE_SLOTS - 1;
    ch->table = calloc(TABLE_SLOTS, sizeof(*ch->table));
    ch->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (!ch->target || !ch->table || ch->wake_fd < 0)
        return mf__chan_error(ch, MF_RESOURCE_EXHAUSTED, "out of memory or fds");

    st = conn_open(ch, &ch->conn, ++ch->next_id, deadline_of(ch, MF_TIMEOUT_DEFAULT), ch->err);
    snprintf(ch->conn_err, sizeof(ch->conn_err), "%s", ch->err);
    if (st != MF_OK)
        return st;
    ch->gen = 1;
    ch->state = MF__CONNECTED;
    if (pthread_create(&ch->io, NULL, io_main, ch) != 0)
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
        wake_io(ch);
        pthread_mutex_unlock(&ch->mu);
        pthread_join(ch->io, NULL);
    }
    conn_release(ch, &ch->conn);
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
    free(ch->table);
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
    out->session_id = ch->conn.session_id;
    out->host_arena_bytes = ch->conn.arena_reach;
    out->max_frame = ch->conn.server_max_frame;
    out->max_batch = ch->conn.max_batch;
    out->gpu_tier = ch->conn.gpu_tier;
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
