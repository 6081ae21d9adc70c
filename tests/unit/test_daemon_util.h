/*
 * test_daemon_util — a tiny blocking client and row builder for the daemon's unit
 * tests: runs mfd_server in a thread on a unix socket in a temp dir and talks to it
 * with real frames (proto/mf_frame.h), so the request handlers run exactly as in
 * mapflowd. Header-only; every test binary that includes it gets its own copy.
 */
#ifndef TEST_DAEMON_UTIL_H
#define TEST_DAEMON_UTIL_H

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "config.h"
#include "mf_addr.h"
#include "mf_frame.h"
#include "mf_hash.h"
#include "mf_row.h"
#include "server.h"

typedef struct td_daemon {
    char dir[256];
    char sock[300];
    char admin[320];         /* the admin socket mapflowd puts beside sock */
    mfd_server_t *srv;
    pthread_t tid;
} td_daemon_t;

static void *td_run(void *arg)
{
    mfd_server_run(arg);
    return NULL;
}

/* Starts a daemon on dir (created when dir[0] == 0); extra = "key", "value", ..., NULL. */
static int td_start(td_daemon_t *d, const char *const *extra)
{
    if (!d->dir[0]) {
        snprintf(d->dir, sizeof(d->dir), "/tmp/mfd-test-XXXXXX");
        if (!mkdtemp(d->dir))
            return -1;
    }
    snprintf(d->sock, sizeof(d->sock), "%s/d.sock", d->dir);
    snprintf(d->admin, sizeof(d->admin), "%s/d-admin.sock", d->dir);
    mfd_config_t cfg;
    char err[MFD_CONFIG_ERRLEN], data[300];
    snprintf(data, sizeof(data), "%s/data", d->dir);
    mfd_config_init(&cfg);
    mfd_config_set(&cfg, "socket", d->sock, 0, err, sizeof(err));
    mfd_config_set(&cfg, "data_dir", data, 0, err, sizeof(err));
    mfd_config_set(&cfg, "http", "", 0, err, sizeof(err));
    mfd_config_set(&cfg, "host_bytes", "8mb", 0, err, sizeof(err));
    mfd_config_set(&cfg, "log_level", "warn", 0, err, sizeof(err));
    for (size_t i = 0; extra && extra[i]; i += 2)
        if (mfd_config_set(&cfg, extra[i], extra[i + 1], 0, err, sizeof(err)) != MF_OK) {
            fprintf(stderr, "td_start: %s\n", err);
            return -1;
        }
    if (mfd_server_create(&cfg, NULL, NULL, 0, &d->srv, err, sizeof(err)) != MF_OK) {
        fprintf(stderr, "td_start: %s\n", err);
        mfd_config_deinit(&cfg);
        return -1;
    }
    mfd_config_deinit(&cfg);
    return pthread_create(&d->tid, NULL, td_run, d->srv) == 0 ? 0 : -1;
}

static void td_stop(td_daemon_t *d)
{
    mfd_server_stop(d->srv);
    pthread_join(d->tid, NULL);
    mfd_server_destroy(d->srv);
    d->srv = NULL;
}

static void td_rmdir(td_daemon_t *d)
{
    char cmd[400];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", d->dir);
    if (system(cmd) != 0)
        fprintf(stderr, "cannot remove %s\n", d->dir);
}

/* ---- client ------------------------------------------------------------------------ */

typedef struct td_cli {
    int fd;
    uint8_t *arena;
    size_t arena_len;
    uint64_t next_id;
    mf_frame_reader_t rd;
    uint8_t *payload;      /* of the last reply (copy) */
    size_t payload_len;
} td_cli_t;

static int td_raw_connect(td_cli_t *c, const char *path)
{
    memset(c, 0, sizeof(*c));
    c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un sun = {0};
    sun.sun_family = AF_UNIX;
    snprintf(sun.sun_path, sizeof(sun.sun_path), "%s", path);
    mf_frame_reader_init(&c->rd, MF_FRAME_DEFAULT_MAX);
    c->next_id = 1;
    return connect(c->fd, (struct sockaddr *)&sun, sizeof(sun));
}

static int td_send(td_cli_t *c, mf_envelope_t *env, const void *payload, size_t plen)
{
    uint8_t *buf;
    size_t len;
    if (mf_frame_encode(env, payload, plen, MF_FRAME_DEFAULT_MAX, &buf, &len) != MF_OK)
        return -1;
    ssize_t n = send(c->fd, buf, len, MSG_NOSIGNAL);
    free(buf);
    return n == (ssize_t)len ? 0 : -1;
}

/* Next reply; NULL when the daemon closed the connection. Receives an fd if one comes. */
static mf_envelope_t *td_recv(td_cli_t *c, int *fd_out)
{
    for (;;) {
        mf_frame_t f;
        int have;
        const char *why;
        if (mf_frame_reader_next(&c->rd, &f, &have, &why) != MF_OK)
            return NULL;
        if (have) {
            mf_envelope_t *env;
            if (mf_envelope_decode(&f, &env, &why) != MF_OK)
                return NULL;
            free(c->payload);
            c->payload = malloc(f.payload_len + 16);
            memcpy(c->payload, f.payload, f.payload_len);
            c->payload_len = f.payload_len;
            return env;
        }
        uint8_t *p;
        size_t avail;
        mf_frame_reader_space(&c->rd, 65536, &p, &avail);
        char cbuf[CMSG_SPACE(sizeof(int))];
        struct iovec iov = {p, avail};
        struct msghdr msg = {0};
        msg.msg_iov = &iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf;
        msg.msg_controllen = sizeof(cbuf);
        ssize_t n = recvmsg(c->fd, &msg, MSG_CMSG_CLOEXEC);
        if (n <= 0)
            return NULL;
        struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
        if (cm && cm->cmsg_type == SCM_RIGHTS && fd_out)
            memcpy(fd_out, CMSG_DATA(cm), sizeof(int));
        mf_frame_reader_commit(&c->rd, (size_t)n);
    }
}

/* One request, one reply (sequential use only). */
static mf_envelope_t *td_call(td_cli_t *c, mf_envelope_t *req, const void *payload, size_t plen)
{
    req->request_id = c->next_id++;
    if (td_send(c, req, payload, plen) != 0)
        return NULL;
    mf_envelope_t *r = td_recv(c, NULL);
    if (r && r->request_id != req->request_id) {
        mf_envelope_free(r);
        return NULL;
    }
    return r;
}

/* Hello; maps the arena when asked. Returns the reply's body case or the error code. */
static int td_connect(td_cli_t *c, const char *path, const char *ns, int want_arena)
{
    if (td_raw_connect(c, path) != 0)
        return -1;
    Mapflow__V1__Hello h = MAPFLOW__V1__HELLO__INIT;
    h.protocol_version = 1;
    h.namespace_ = (char *)ns;
    h.client_name = "unit-test";
    h.want_host_arena = want_arena;
    mf_envelope_t env = MAPFLOW__V1__ENVELOPE__INIT;
    env.body_case = MAPFLOW__V1__ENVELOPE__BODY_HELLO;
    env.hello = &h;
    env.request_id = c->next_id++;
    if (td_send(c, &env, NULL, 0) != 0)
        return -1;
    int fd = -1;
    mf_envelope_t *r = td_recv(c, &fd);
    if (!r)
        return -1;
    int rc = -1;
    if (r->body_case == MAPFLOW__V1__ENVELOPE__BODY_HELLO_REPLY) {
        rc = 0;
        if (r->hello_reply->host_arena_fd && fd >= 0) {
            c->arena_len = r->hello_reply->host_arena_bytes;
            c->arena = mmap(NULL, c->arena_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
            close(fd);
            if (c->arena == MAP_FAILED)
                rc = -1;
        }
    } else if (r->body_case == MAPFLOW__V1__ENVELOPE__BODY_ERROR) {
        rc = (int)r->error->code;
    }
    mf_envelope_free(r);
    return rc;
}

static void td_close(td_cli_t *c)
{
    if (c->arena && c->arena != MAP_FAILED)
        munmap(c->arena, c->arena_len);
    close(c->fd);
    mf_frame_reader_deinit(&c->rd);
    free(c->payload);
    memset(c, 0, sizeof(*c));
}

/* ---- rows -------------------------------------------------------------------------- */

/* A valid MASK row (2 heads, sink + diagonal) for block i of `tokens` (B each), whose
 * parent and hash are those of `tokens` but whose own block carries `carried` (B tokens;
 * NULL: block i of `tokens`) — a hash collision when they differ; the daemon refuses
 * a row whose hash is not H(parent, carried), so `carried` must be a real collision
 * partner (tests/reliability rel_collide_block). Returns a 16-aligned
 * malloc'd row; hashes computed from (ns, model) exactly as the daemon does. */
static inline uint8_t *td_row_carrying(const char *ns, const char *model, uint32_t layer,
                                       uint32_t B, const uint32_t *tokens, uint32_t i,
                                       const uint32_t *carried, size_t *size, unsigned *seed)
{
    mf_hash128_t h = mf_hash_root(B, ns, strlen(ns), model, strlen(model)), parent = h;
    for (uint32_t b = 0; b <= i; b++) {
        parent = h;
        h = mf_hash_next(h, tokens + (size_t)b * B, B);
    }
    mf_row_spec_t spec = {model, layer, i, B, 2, MF_CODEC_MASK, 0.9f, parent, h,
                          carried ? carried : tokens + (size_t)i * B};
    uint32_t cols[2] = {0, i};
    uint64_t masks[2] = {3, 3};
    uint32_t n_cols = i ? 2 : 1;
    float mass[4];
    for (int k = 0; k < 4; k++)
        mass[k] = (float)(rand_r(seed) % 1000) / 1000.0f;
    size_t need = 0;
    const char *why;
    mf_row_build(NULL, 0, &spec, n_cols, cols, masks, mass, NULL, &need, &why);
    uint8_t *buf = aligned_alloc(64, (need + 63) & ~(size_t)63);
    if (mf_row_build(buf, need, &spec, n_cols, cols, masks, mass, NULL, size, &why) != MF_OK) {
        free(buf);
        return NULL;
    }
    return buf;
}

/* The row of block i of `tokens` (td_row_carrying with the block's own tokens). */
static inline uint8_t *td_row(const char *ns, const char *model, uint32_t layer, uint32_t B,
                              const uint32_t *tokens, uint32_t i, size_t *size, unsigned *seed)
{
    return td_row_carrying(ns, model, layer, B, tokens, i, NULL, size, seed);
}

static mf_hash128_t td_block_hash(const char *ns, const char *model, uint32_t B,
                                  const uint32_t *tokens, uint32_t i)
{
    mf_hash128_t h = mf_hash_root(B, ns, strlen(ns), model, strlen(model));
    for (uint32_t b = 0; b <= i; b++)
        h = mf_hash_next(h, tokens + (size_t)b * B, B);
    return h;
}

/* A GET_COPY row of a reply is OK, 16-byte aligned, inside the payload and equal to want.
 * (Callers include cmocka before this header.) */
static inline void td_assert_copy(const td_cli_t *c, const Mapflow__V1__RowRef *ref,
                                  const uint8_t *want, size_t size)
{
    assert_int_equal(ref->status, MF_OK);
    assert_int_equal(ref->length, size);
    assert_int_equal(ref->payload_offset % 16, 0);
    assert_true(ref->payload_offset + size <= c->payload_len);
    assert_memory_equal(c->payload + ref->payload_offset, want, size);
}

/* ---- requests ---------------------------------------------------------------------- */

/* A request whose reply carries no payload. */
static inline mf_envelope_t *td_simple(td_cli_t *c, int body_case, void *msg)
{
    mf_envelope_t env = MAPFLOW__V1__ENVELOPE__INIT;
    env.body_case = body_case;
    env.health = msg; /* every body member is a message pointer in the same union */
    return td_call(c, &env, NULL, 0);
}

/* The daemon-wide StatsReply (the caller frees it), asked on the admin socket beside the
 * one c is connected to (a tenant's Stats covers its own namespace only); on c itself
 * when there is none. */
static inline mf_envelope_t *td_admin_stats(td_cli_t *c)
{
    struct sockaddr_un sun = {0};
    socklen_t sl = sizeof(sun);
    char admin[sizeof(sun.sun_path) + 16];
    td_cli_t a;
    td_cli_t *q = c;
    if (getpeername(c->fd, (struct sockaddr *)&sun, &sl) == 0 && sun.sun_family == AF_UNIX) {
        mf_admin_socket_path(sun.sun_path, admin, sizeof(admin));
        if (access(admin, F_OK) == 0) {
            if (td_connect(&a, admin, "td-stats", 0) == 0)
                q = &a;
            else
                td_close(&a);
        }
    }
    mf_envelope_t *r = td_simple(q, MAPFLOW__V1__ENVELOPE__BODY_STATS,
                                 &(Mapflow__V1__Stats)MAPFLOW__V1__STATS__INIT);
    if (q != c)
        td_close(&a);
    return r;
}

/* A daemon-wide Stats counter or gauge by name (td_admin_stats); host tier used bytes
 * for "host_used". */
static inline uint64_t td_stat(td_cli_t *c, const char *name)
{
    mf_envelope_t *r = td_admin_stats(c);
    assert_non_null(r);
    assert_int_equal(r->body_case, MAPFLOW__V1__ENVELOPE__BODY_STATS_REPLY);
    uint64_t v = UINT64_MAX;
    if (!strcmp(name, "host_used")) {
        for (size_t k = 0; k < r->stats_reply->n_tiers; k++)
            if (r->stats_reply->tiers[k]->tier == MAPFLOW__V1__TIER__TIER_HOST)
                v = r->stats_reply->tiers[k]->used_bytes;
    }
    for (size_t k = 0; k < r->stats_reply->n_counters; k++)
        if (!strcmp(r->stats_reply->counters[k]->name, name))
            v = r->stats_reply->counters[k]->value;
    mf_envelope_free(r);
    assert_true(v != UINT64_MAX);
    return v;
}

/* The pieces of a two-phase put, for td_put and tests that put differently (GPU arenas):
 * a Key over hb (16 bytes the caller keeps), PutBegin, and PutCommit with an optional
 * payload. The replies are the caller's to free. */
static inline void td_key(Mapflow__V1__Key *key, uint8_t hb[16], const char *model,
                          uint32_t layer, mf_hash128_t h)
{
    mf_hash_to_le(h, hb);
    *key = (Mapflow__V1__Key)MAPFLOW__V1__KEY__INIT;
    key->model = (char *)model;
    key->layer = layer;
    key->hash.data = hb;
    key->hash.len = 16;
}

static inline mf_envelope_t *td_put_begin(td_cli_t *c, Mapflow__V1__PutBegin *pb)
{
    mf_envelope_t env = MAPFLOW__V1__ENVELOPE__INIT;
    env.body_case = MAPFLOW__V1__ENVELOPE__BODY_PUT_BEGIN;
    env.put_begin = pb;
    return td_call(c, &env, NULL, 0);
}

static inline mf_envelope_t *td_put_commit(td_cli_t *c, uint64_t rid, const void *payload,
                                           size_t len)
{
    Mapflow__V1__PutCommit pc = MAPFLOW__V1__PUT_COMMIT__INIT;
    pc.reservation_id = rid;
    mf_envelope_t env = MAPFLOW__V1__ENVELOPE__INIT;
    env.body_case = MAPFLOW__V1__ENVELOPE__BODY_PUT_COMMIT;
    env.put_commit = &pc;
    return td_call(c, &env, payload, len);
}

/* Two-phase put of `row` under (model, layer, hash): through the arena when the client
 * mapped it, as a payload otherwise. Returns the commit reply's status (0 = OK) and fills
 * *got_durable when not NULL. (Callers include cmocka before this header.) */
static inline int td_put(td_cli_t *c, const char *model, uint32_t layer, mf_hash128_t h,
                         const uint8_t *row, size_t size, int durable, int *got_durable)
{
    uint8_t hash[16];
    Mapflow__V1__Key key;
    td_key(&key, hash, model, layer, h);
    Mapflow__V1__PutBegin pb = MAPFLOW__V1__PUT_BEGIN__INIT;
    pb.key = &key;
    pb.size = size;
    pb.durable = durable;
    mf_envelope_t *r = td_put_begin(c, &pb);
    int rc = -1;
    if (!r || r->body_case != MAPFLOW__V1__ENVELOPE__BODY_PUT_BEGIN_REPLY) {
        rc = r && r->body_case == MAPFLOW__V1__ENVELOPE__BODY_ERROR ? (int)r->error->code : -1;
        mf_envelope_free(r);
        return rc;
    }
    uint64_t rid = r->put_begin_reply->reservation_id;
    int in_arena = r->put_begin_reply->in_arena;
    assert_int_equal(in_arena, c->arena != NULL);
    if (in_arena) {
        assert_int_equal(r->put_begin_reply->arena_offset % 16, 0);
        memcpy(c->arena + r->put_begin_reply->arena_offset, row, size);
    }
    mf_envelope_free(r);
    r = td_put_commit(c, rid, in_arena ? NULL : row, in_arena ? 0 : size);
    if (r && r->body_case == MAPFLOW__V1__ENVELOPE__BODY_PUT_COMMIT_REPLY) {
        rc = 0;
        if (got_durable)
            *got_durable = r->put_commit_reply->durable;
    } else if (r && r->body_case == MAPFLOW__V1__ENVELOPE__BODY_ERROR) {
        rc = (int)r->error->code;
    }
    mf_envelope_free(r);
    return rc;
}

/* Lookup → leading blocks per requested layer into out[]; returns total_blocks (-1: the
 * reply was not a LookupReply). */
static inline int td_lookup(td_cli_t *c, const char *model, uint32_t B,
                            const uint32_t *tokens, size_t n_tok, const uint32_t *layers,
                            size_t n_layers, uint32_t *out)
{
    Mapflow__V1__Lookup lk = MAPFLOW__V1__LOOKUP__INIT;
    lk.model = (char *)model;
    lk.block_size = B;
    lk.layers = (uint32_t *)layers;
    lk.n_layers = n_layers;
    mf_envelope_t env = MAPFLOW__V1__ENVELOPE__INIT;
    env.body_case = MAPFLOW__V1__ENVELOPE__BODY_LOOKUP;
    env.lookup = &lk;
    mf_envelope_t *r = td_call(c, &env, tokens, n_tok * 4);
    if (!r || r->body_case != MAPFLOW__V1__ENVELOPE__BODY_LOOKUP_REPLY) {
        mf_envelope_free(r);
        return -1;
    }
    for (size_t i = 0; i < n_layers; i++)
        out[i] = r->lookup_reply->blocks[i];
    int total = (int)r->lookup_reply->total_blocks;
    mf_envelope_free(r);
    return total;
}

#endif /* TEST_DAEMON_UTIL_H */
