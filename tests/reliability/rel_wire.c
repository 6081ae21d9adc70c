/* rel_wire — blocking wire client and row helpers for the reliability drivers. */
#include "rel_wire.h"
#include "mf_addr.h"
/* The default secret (XXH3_kSecret) is only visible to an inlined copy of xxhash. */
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define ENV_INIT(e, CASE, field, msg)                                                   \
    mf_envelope_t e = MAPFLOW__V1__ENVELOPE__INIT;                                        \
    e.body_case = MAPFLOW__V1__ENVELOPE__BODY_##CASE;                                   \
    e.field = (msg)

static int dial_tcp(const char *hostport)
{
    char host[256];
    const char *colon = strrchr(hostport, ':');
    if (!colon || (size_t)(colon - hostport) >= sizeof(host))
        return -1;
    memcpy(host, hostport, (size_t)(colon - hostport));
    host[colon - hostport] = 0;
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(host, colon + 1, &hints, &res) != 0 || !res)
        return -1;
    int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) != 0) {
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    return fd;
}

int rel_dial(rel_conn_t *c, const char *target, int timeout_ms)
{
    memset(c, 0, sizeof(*c));
    c->fd = -1;
    c->next_id = 1;
    if (mf_frame_reader_init(&c->rd, MF_FRAME_DEFAULT_MAX) != MF_OK)
        return -1;
    if (strncmp(target, "tcp:", 4) == 0) {
        c->fd = dial_tcp(target + 4);
    } else {
        const char *path = strncmp(target, "unix:", 5) == 0 ? target + 5 : target;
        struct sockaddr_un sun = {0};
        sun.sun_family = AF_UNIX;
        snprintf(sun.sun_path, sizeof(sun.sun_path), "%s", path);
        c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (c->fd >= 0 && connect(c->fd, (struct sockaddr *)&sun, sizeof(sun)) != 0) {
            close(c->fd);
            c->fd = -1;
        }
    }
    if (c->fd < 0) {
        mf_frame_reader_deinit(&c->rd);
        return -1;
    }
    if (timeout_ms > 0) {
        struct timeval tv = {timeout_ms / 1000, (timeout_ms % 1000) * 1000};
        setsockopt(c->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
        setsockopt(c->fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    }
    return 0;
}

void rel_close(rel_conn_t *c)
{
    if (c->arena)
        munmap(c->arena, c->arena_len);
    if (c->fd >= 0)
        close(c->fd);
    mf_frame_reader_deinit(&c->rd);
    free(c->payload);
    memset(c, 0, sizeof(*c));
    c->fd = -1;
}

int rel_send_raw(rel_conn_t *c, const void *buf, size_t len)
{
    const uint8_t *p = buf;
    while (len) {
        ssize_t n = send(c->fd, p, len, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

int rel_send(rel_conn_t *c, mf_envelope_t *env, const void *payload, size_t plen)
{
    uint8_t *buf;
    size_t len;
    if (mf_frame_encode(env, payload, plen, MF_FRAME_DEFAULT_MAX, &buf, &len) != MF_OK)
        return -1;
    int rc = rel_send_raw(c, buf, len);
    free(buf);
    return rc;
}

mf_envelope_t *rel_recv(rel_conn_t *c, int *fd_out)
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
            c->payload = aligned_alloc(64, ((size_t)f.payload_len + 64) & ~(size_t)63);
            if (!c->payload) {
                mf_envelope_free(env);
                return NULL;
            }
            memcpy(c->payload, f.payload, f.payload_len);
            c->payload_len = f.payload_len;
            return env;
        }
        ssize_t n = rel_recv_into(c->fd, &c->rd, 0, fd_out);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return NULL;
    }
}

ssize_t rel_recv_into(int fd, mf_frame_reader_t *rd, int flags, int *fd_out)
{
    uint8_t *p;
    size_t avail;
    if (mf_frame_reader_space(rd, 65536, &p, &avail) != MF_OK)
        return -1;
    char cbuf[CMSG_SPACE(sizeof(int))];
    struct iovec iov = {p, avail};
    struct msghdr msg = {0};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf;
    msg.msg_controllen = sizeof(cbuf);
    ssize_t n = recvmsg(fd, &msg, flags | MSG_CMSG_CLOEXEC);
    if (n <= 0)
        return n;
    struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
    if (cm && cm->cmsg_type == SCM_RIGHTS) {
        int got;
        memcpy(&got, CMSG_DATA(cm), sizeof(int));
        if (fd_out)
            *fd_out = got;
        else
            close(got);
    }
    mf_frame_reader_commit(rd, (size_t)n);
    return n;
}

mf_envelope_t *rel_call(rel_conn_t *c, mf_envelope_t *req, const void *payload, size_t plen)
{
    req->request_id = c->next_id++;
    if (rel_send(c, req, payload, plen) != 0)
        return NULL;
    mf_envelope_t *r = rel_recv(c, NULL);
    if (r && r->request_id != req->request_id && r->request_id != 0) {
        mf_envelope_free(r);
        return NULL;
    }
    return r;
}

int rel_status(const mf_envelope_t *r, int want_case, rel_conn_t *c)
{
    if (!r)
        return -1;
    if ((int)r->body_case == want_case)
        return 0;
    if (r->body_case == MAPFLOW__V1__ENVELOPE__BODY_ERROR) {
        if (c)
            snprintf(c->err, sizeof(c->err), "%s", r->error->message ? r->error->message : "");
        return r->error->code ? (int)r->error->code : -1;
    }
    return -1;
}

int rel_hello(rel_conn_t *c, const char *ns, const char *token, int want_arena)
{
    return rel_hello_admin(c, ns, token, NULL, want_arena);
}

int rel_hello_admin(rel_conn_t *c, const char *ns, const char *token, const char *admin_token,
                    int want_arena)
{
    Mapflow__V1__Hello h = MAPFLOW__V1__HELLO__INIT;
    h.protocol_version = MF_PROTOCOL_VERSION;
    h.namespace_ = (char *)ns;
    h.token = (char *)(token ? token : "");
    h.admin_token = (char *)(admin_token ? admin_token : "");
    h.client_name = "rel";
    h.want_host_arena = want_arena;
    ENV_INIT(env, HELLO, hello, &h);
    env.request_id = c->next_id++;
    if (rel_send(c, &env, NULL, 0) != 0)
        return -1;
    int fd = -1;
    mf_envelope_t *r = rel_recv(c, &fd);
    int rc = rel_status(r, MAPFLOW__V1__ENVELOPE__BODY_HELLO_REPLY, c);
    if (rc == 0)
        c->max_batch = r->hello_reply->max_batch;
    if (rc == 0 && r->hello_reply->host_arena_fd && fd >= 0) {
        c->arena_len = r->hello_reply->host_arena_bytes;
        c->arena = mmap(NULL, c->arena_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (c->arena == MAP_FAILED) {
            c->arena = NULL;
            rc = -1;
        }
    }
    if (fd >= 0)
        close(fd);
    if (r)
        mf_envelope_free(r);
    return rc;
}

int rel_open(rel_conn_t *c, const char *target, const char *ns, const char *token,
             int want_arena, int timeout_ms)
{
    if (rel_dial(c, target, timeout_ms) != 0)
        return -1;
    int rc = rel_hello(c, ns, token, want_arena);
    if (rc != 0)
        rel_close(c);
    return rc;
}

/* Key of a sealed row, from its own header. */
static int row_key(const uint8_t *row, size_t len, Mapflow__V1__Key *k, char *model,
                   uint8_t hash[16])
{
    mf_row_view_t v;
    const char *why;
    if (mf_row_decode(row, len, MF_ROW_NO_CHECKSUM, &v, &why) != MF_OK)
        return -1;
    memcpy(model, v.model, v.model_len);
    model[v.model_len] = 0;
    mf_hash_to_le(v.hash, hash);
    mapflow__v1__key__init(k);
    k->model = model;
    k->layer = v.layer;
    k->hash.data = hash;
    k->hash.len = 16;
    return 0;
}

static int put_begin(rel_conn_t *c, const uint8_t *row, size_t len, int durable,
                     uint64_t *rid, uint64_t *off, int *in_arena)
{
    char model[MF_ROW_MAX_MODEL + 1];
    uint8_t hash[16];
    Mapflow__V1__Key k;
    if (row_key(row, len, &k, model, hash) != 0)
        return -1;
    Mapflow__V1__PutBegin pb = MAPFLOW__V1__PUT_BEGIN__INIT;
    pb.key = &k;
    pb.size = len;
    pb.durable = durable;
    ENV_INIT(env, PUT_BEGIN, put_begin, &pb);
    mf_envelope_t *r = rel_call(c, &env, NULL, 0);
    int rc = rel_status(r, MAPFLOW__V1__ENVELOPE__BODY_PUT_BEGIN_REPLY, c);
    if (rc == 0) {
        *rid = r->put_begin_reply->reservation_id;
        *off = r->put_begin_reply->arena_offset;
        *in_arena = r->put_begin_reply->in_arena;
    }
    if (r)
        mf_envelope_free(r);
    return rc;
}

int rel_put_begin(rel_conn_t *c, const uint8_t *row, size_t len, uint64_t *rid)
{
    uint64_t off;
    int in_arena;
    return put_begin(c, row, len, 0, rid, &off, &in_arena);
}

int rel_put(rel_conn_t *c, const uint8_t *row, size_t len, int durable, int *durable_out)
{
    uint64_t rid, off;
    int in_arena;
    int rc = put_begin(c, row, len, durable, &rid, &off, &in_arena);
    if (rc != 0)
        return rc;
    int use_arena = in_arena && c->arena && off + len <= c->arena_len;
    if (use_arena)
        memcpy(c->arena + off, row, len);
    Mapflow__V1__PutCommit pc = MAPFLOW__V1__PUT_COMMIT__INIT;
    pc.reservation_id = rid;
    ENV_INIT(env, PUT_COMMIT, put_commit, &pc);
    mf_envelope_t *r = rel_call(c, &env, use_arena ? NULL : row, use_arena ? 0 : len);
    rc = rel_status(r, MAPFLOW__V1__ENVELOPE__BODY_PUT_COMMIT_REPLY, c);
    if (rc == 0 && durable_out)
        *durable_out = r->put_commit_reply->durable;
    if (r)
        mf_envelope_free(r);
    return rc;
}

int rel_lookup(rel_conn_t *c, const char *model, uint32_t B, const uint32_t *layers,
               size_t nl, const uint32_t *tokens, size_t ntok, uint32_t *blocks)
{
    Mapflow__V1__Lookup m = MAPFLOW__V1__LOOKUP__INIT;
    m.model = (char *)model;
    m.block_size = B;
    m.n_layers = nl;
    m.layers = (uint32_t *)layers;
    ENV_INIT(env, LOOKUP, lookup, &m);
    mf_envelope_t *r = rel_call(c, &env, tokens, ntok * 4);
    int rc = rel_status(r, MAPFLOW__V1__ENVELOPE__BODY_LOOKUP_REPLY, c);
    if (rc == 0) {
        if (r->lookup_reply->n_blocks != nl)
            rc = -1;
        for (size_t i = 0; rc == 0 && i < nl; i++)
            blocks[i] = r->lookup_reply->blocks[i];
    }
    if (r)
        mf_envelope_free(r);
    return rc;
}

mf_envelope_t *rel_get_prefix(rel_conn_t *c, const char *model, uint32_t B,
                              const uint32_t *layers, size_t nl, const uint32_t *tokens,
                              size_t ntok, uint32_t first, uint32_t n, int lease)
{
    Mapflow__V1__Get m = MAPFLOW__V1__GET__INIT;
    m.model = (char *)model;
    m.block_size = B;
    m.n_layers = nl;
    m.layers = (uint32_t *)layers;
    m.first_block = first;
    m.n_blocks = n;
    m.mode = lease ? MAPFLOW__V1__GET_MODE__GET_LEASE : MAPFLOW__V1__GET_MODE__GET_COPY;
    ENV_INIT(env, GET, get, &m);
    return rel_call(c, &env, tokens, ntok * 4);
}

mf_envelope_t *rel_get_key(rel_conn_t *c, const char *model, uint32_t layer, mf_hash128_t h)
{
    uint8_t hash[16];
    mf_hash_to_le(h, hash);
    Mapflow__V1__Key k = MAPFLOW__V1__KEY__INIT;
    k.model = (char *)model;
    k.layer = layer;
    k.hash.data = hash;
    k.hash.len = 16;
    Mapflow__V1__Key *keys[1] = {&k};
    Mapflow__V1__Get m = MAPFLOW__V1__GET__INIT;
    m.n_keys = 1;
    m.keys = keys;
    m.mode = MAPFLOW__V1__GET_MODE__GET_COPY;
    ENV_INIT(env, GET, get, &m);
    return rel_call(c, &env, NULL, 0);
}

int rel_release(rel_conn_t *c, const uint64_t *ids, size_t n, uint32_t *released)
{
    Mapflow__V1__Release m = MAPFLOW__V1__RELEASE__INIT;
    m.n_lease_ids = n;
    m.lease_ids = (uint64_t *)ids;
    ENV_INIT(env, RELEASE, release, &m);
    mf_envelope_t *r = rel_call(c, &env, NULL, 0);
    int rc = rel_status(r, MAPFLOW__V1__ENVELOPE__BODY_RELEASE_REPLY, c);
    if (rc == 0 && released)
        *released = r->release_reply->released;
    if (r)
        mf_envelope_free(r);
    return rc;
}

uint64_t rel_counter(rel_conn_t *c, const char *name)
{
    /* Daemon-wide counters are the admin's (a tenant's Stats covers its namespace): ask on
     * the admin socket beside c's unix socket, else on c. */
    struct sockaddr_un sun = {0};
    socklen_t sl = sizeof(sun);
    char admin[sizeof(sun.sun_path) + 16];
    rel_conn_t a;
    rel_conn_t *q = c;
    if (getpeername(c->fd, (struct sockaddr *)&sun, &sl) == 0 && sun.sun_family == AF_UNIX) {
        mf_admin_socket_path(sun.sun_path, admin, sizeof(admin));
        if (access(admin, F_OK) == 0 && rel_open(&a, admin, "rel-stats", NULL, 0, 5000) == 0)
            q = &a;
    }
    Mapflow__V1__Stats m = MAPFLOW__V1__STATS__INIT;
    ENV_INIT(env, STATS, stats, &m);
    mf_envelope_t *r = rel_call(q, &env, NULL, 0);
    if (q != c) {
        rel_close(&a);
        q = c;
    }
    uint64_t v = UINT64_MAX;
    if (rel_status(r, MAPFLOW__V1__ENVELOPE__BODY_STATS_REPLY, q) == 0)
        for (size_t i = 0; i < r->stats_reply->n_counters; i++)
            if (strcmp(r->stats_reply->counters[i]->name, name) == 0)
                v = r->stats_reply->counters[i]->value;
    if (r)
        mf_envelope_free(r);
    return v;
}

int rel_flush_scope(rel_conn_t *c, int all_namespaces, uint64_t *n)
{
    Mapflow__V1__Flush m = MAPFLOW__V1__FLUSH__INIT;
    m.all_namespaces = all_namespaces ? 1 : 0;
    ENV_INIT(env, FLUSH, flush, &m);
    mf_envelope_t *r = rel_call(c, &env, NULL, 0);
    int rc = rel_status(r, MAPFLOW__V1__ENVELOPE__BODY_FLUSH_REPLY, c);
    if (rc == 0 && n)
        *n = r->flush_reply->entries;
    if (r)
        mf_envelope_free(r);
    return rc;
}

int rel_list_count(rel_conn_t *c, const char *model, uint64_t *n)
{
    Mapflow__V1__List m = MAPFLOW__V1__LIST__INIT;
    m.model = (char *)(model ? model : "");
    m.page_size = 1000;
    ENV_INIT(env, LIST, list, &m);
    mf_envelope_t *r = rel_call(c, &env, NULL, 0);
    int rc = rel_status(r, MAPFLOW__V1__ENVELOPE__BODY_LIST_REPLY, c);
    if (rc == 0 && n)
        *n = r->list_reply->n_entries;
    if (r)
        mf_envelope_free(r);
    return rc;
}

int rel_delete_model(rel_conn_t *c, const char *model, uint64_t *n)
{
    Mapflow__V1__Delete m = MAPFLOW__V1__DELETE__INIT;
    m.model = (char *)model;
    ENV_INIT(env, DELETE, delete_, &m);
    mf_envelope_t *r = rel_call(c, &env, NULL, 0);
    int rc = rel_status(r, MAPFLOW__V1__ENVELOPE__BODY_DELETE_REPLY, c);
    if (rc == 0 && n)
        *n = r->delete_reply->deleted;
    if (r)
        mf_envelope_free(r);
    return rc;
}

int rel_evict(rel_conn_t *c, int tier, uint64_t *entries)
{
    Mapflow__V1__Evict m = MAPFLOW__V1__EVICT__INIT;
    m.tier = (Mapflow__V1__Tier)tier;
    ENV_INIT(env, EVICT, evict, &m);
    mf_envelope_t *r = rel_call(c, &env, NULL, 0);
    int rc = rel_status(r, MAPFLOW__V1__ENVELOPE__BODY_EVICT_REPLY, c);
    if (rc == 0 && entries)
        *entries = r->evict_reply->entries;
    if (r)
        mf_envelope_free(r);
    return rc;
}

/* ---- rows ------------------------------------------------------------------------- */

void rel_tokens(uint32_t *t, size_t n, uint64_t seed)
{
    uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        t[i] = 1 + (uint32_t)(x % 120000);
    }
}

static uint64_t le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static void put_word(uint32_t *t, uint64_t v)
{
    t[0] = (uint32_t)v;
    t[1] = (uint32_t)(v >> 32);
}

int rel_collide_block(uint32_t *blk, uint32_t B, uint32_t *partner, uint64_t seed)
{
    if (B != 8 && B != 16)
        return -1;
    uint64_t s16 = le64(XXH3_kSecret + 16), s24 = le64(XXH3_kSecret + 24);
    uint64_t d = seed * 0x9e3779b97f4a7c15ull + 0x632be59bd9b4e019ull;
    if (d == s24)
        d++;
    put_word(blk + B - 4, s16);
    put_word(blk + B - 2, d);
    memcpy(partner, blk, (B - 4) * sizeof(uint32_t));
    put_word(partner + B - 4, s16 + d - s24);
    put_word(partner + B - 2, s24);
    mf_hash128_t parent = {seed ^ 0x5bd1e995u, ~seed};
    mf_hash128_t a = mf_hash_next(parent, blk, B), b = mf_hash_next(parent, partner, B);
    return mf_hash_eq(a, b) && memcmp(blk, partner, B * sizeof(uint32_t)) != 0 ? 0 : -1;
}

void rel_block_hashes(const char *ns, const char *model, uint32_t B, const uint32_t *tokens,
                      uint32_t i, mf_hash128_t *parent, mf_hash128_t *hash)
{
    mf_hash128_t h = mf_hash_root(B, ns, strlen(ns), model, strlen(model)), p = h;
    for (uint32_t b = 0; b <= i; b++) {
        p = h;
        h = mf_hash_next(h, tokens + (size_t)b * B, B);
    }
    *parent = p;
    *hash = h;
}

uint8_t *rel_row(const rel_row_spec_t *s, size_t *size)
{
    mf_hash128_t parent, h;
    rel_block_hashes(s->ns, s->model, s->B, s->tokens, s->block, &parent, &h);
    if (s->force_hash)
        h = *s->force_hash;
    mf_row_spec_t spec = {s->model, s->layer, s->block, s->B, 2, s->codec, 0.9f, parent, h,
                          s->tokens + (size_t)s->block * s->B};
    uint32_t cols[2] = {0, s->block};
    uint64_t masks[2] = {3, 3};
    uint32_t n_cols = s->block ? 2 : 1;
    unsigned seed = s->seed | 1u;
    float mass[4];
    for (int k = 0; k < 4; k++)
        mass[k] = 0.001f + (float)(rand_r(&seed) % 999) / 1000.0f;
    float *tiles = NULL;
    if (s->codec != MF_CODEC_MASK) {
        size_t nt = 4 * (size_t)s->B * s->B;
        tiles = malloc(nt * sizeof(float));
        if (!tiles)
            return NULL;
        for (size_t k = 0; k < nt; k++)
            tiles[k] = (float)(rand_r(&seed) % 1000) / 1000.0f;
    }
    size_t need = 0;
    const char *why;
    mf_row_build(NULL, 0, &spec, n_cols, cols, masks, mass, tiles, &need, &why);
    uint8_t *buf = need ? aligned_alloc(64, (need + 63) & ~(size_t)63) : NULL;
    if (!buf || mf_row_build(buf, need, &spec, n_cols, cols, masks, mass, tiles, size, &why) !=
                    MF_OK) {
        free(buf);
        buf = NULL;
    }
    free(tiles);
    return buf;
}

int rel_row_check(const uint8_t *row, size_t len, const char *ns, const char *model,
                  uint32_t layer, uint32_t B, const uint32_t *tokens, uint32_t i,
                  const char **why)
{
    mf_row_view_t v;
    if (mf_row_decode(row, len, 0, &v, why) != MF_OK)
        return -1;
    mf_hash128_t parent, h;
    rel_block_hashes(ns, model, B, tokens, i, &parent, &h);
    if (v.model_len != strlen(model) || memcmp(v.model, model, v.model_len) != 0 ||
        v.layer != layer || v.block_index != i || v.block_size != B) {
        *why = "row header names another model / layer / block";
        return -1;
    }
    if (!mf_hash_eq(v.parent, parent) || !mf_hash_eq(v.hash, h) ||
        memcmp(v.tokens, tokens + (size_t)i * B, (size_t)B * 4) != 0) {
        *why = "row tokens or hashes differ from the request (wrong map)";
        return -1;
    }
    return 0;
}

long rel_rss_anon_kb(int pid)
{
    char path[64], line[256];
    snprintf(path, sizeof(path), "/proc/%d/status", pid);
    FILE *f = fopen(path, "r");
    long kb = -1;
    while (f && fgets(line, sizeof(line), f))
        if (sscanf(line, "RssAnon: %ld kB", &kb) == 1)
            break;
    if (f)
        fclose(f);
    return kb;
}
