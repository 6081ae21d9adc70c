/*
 * libFuzzer target: message sequences into mapflowd's request handler. One real server
 * (mfd_server_t: unix listener, host arena 1 MiB, SSD tier off, max_batch 64) lives for
 * the whole run, and its state carries over between inputs (rows, leases held by other
 * inputs' connections are released when those close). Each input is one connection on
 * the real socket, driven by this thread pumping the server's event loop:
 *
 *   byte 0: bit 0 = skip Hello, bit 1 = want_host_arena
 *   then ops: u8 op, then op-specific bytes (missing bytes read as 0):
 *     0 raw bytes (u8 len) written as they are — frames cut anywhere, garbage
 *     1 PutBegin+PutCommit of a valid row (ctx, block, layer; payload or arena)
 *     2 PutCommit with the last reservation and raw bytes as the row
 *     3 Lookup   4 Get copy   5 Get lease   6 Release of leases seen   7 List
 *     8 Delete   9 Flush / Stats / Health / Evict   10 a Key-mode Get of seen keys
 *     11 ProfilePut with small random W   12 a PutBegin of a raw size
 * Replies are read back (reservation and lease ids feed later ops); an ErrorReply is
 * fine, a crash / sanitizer report / hang is the bug. Links tests/reliability/rel_wire.c.
 */
#include <errno.h>
#include <event2/event.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "config.h"
#include "mf_frame.h"
#include "mf_hash.h"
#include "mf_row.h"
#include "rel_wire.h"
#include "server.h"

#define B 16
#define NCTX 4
#define MODEL "fz"
#define NS "fuzz"

static mfd_server_t *g_srv;
static char g_dir[64], g_sock[100];

typedef struct in {
    const uint8_t *p;
    size_t n;
} in_t;

static uint8_t u8(in_t *in)
{
    if (!in->n)
        return 0;
    in->n--;
    return *in->p++;
}

typedef struct cli {
    int fd;
    mf_frame_reader_t rd;
    uint64_t next_id, rid, leases[16];
    size_t n_leases;
    int has_arena;
    uint64_t arena_off;
} cli_t;

static void pump(void)
{
    for (int i = 0; i < 4; i++)
        event_base_loop(g_srv->base, EVLOOP_NONBLOCK);
}

/* Reads every reply available; remembers ids. */
static void drain(cli_t *c)
{
    pump();
    for (;;) {
        int afd = -1;
        if (rel_recv_into(c->fd, &c->rd, MSG_DONTWAIT, &afd) <= 0)
            break;
        if (afd >= 0) {
            close(afd);
            c->has_arena = 1;
        }
        pump();
    }
    for (;;) {
        mf_frame_t f;
        int have;
        const char *why;
        if (mf_frame_reader_next(&c->rd, &f, &have, &why) != MF_OK || !have)
            return;
        mf_envelope_t *e;
        if (mf_envelope_decode(&f, &e, &why) != MF_OK)
            abort(); /* the daemon must only send well-formed replies */
        if (e->body_case == MAPFLOW__V1__ENVELOPE__BODY_PUT_BEGIN_REPLY) {
            c->rid = e->put_begin_reply->reservation_id;
            c->arena_off = e->put_begin_reply->in_arena ? e->put_begin_reply->arena_offset
                                                        : UINT64_MAX;
        } else if (e->body_case == MAPFLOW__V1__ENVELOPE__BODY_GET_REPLY) {
            for (size_t i = 0; i < e->get_reply->n_rows; i++)
                if (e->get_reply->rows[i]->lease_id && c->n_leases < 16)
                    c->leases[c->n_leases++] = e->get_reply->rows[i]->lease_id;
        }
        mf_envelope_free(e);
    }
}

static void send_raw(cli_t *c, const void *buf, size_t len)
{
    const uint8_t *p = buf;
    while (len) {
        ssize_t n = send(c->fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n <= 0) {
            if (n < 0 && errno == EAGAIN) {
                drain(c);
                continue;
            }
            return;
        }
        p += n;
        len -= (size_t)n;
    }
}

static void send_env(cli_t *c, mf_envelope_t *env, const void *payload, size_t plen)
{
    uint8_t *buf;
    size_t len;
    env->request_id = c->next_id++;
    if (mf_frame_encode(env, payload, plen, MF_FRAME_DEFAULT_MAX, &buf, &len) != MF_OK)
        return;
    send_raw(c, buf, len);
    free(buf);
    drain(c);
}

static void ctx_tokens(uint32_t ctx, uint32_t *t)
{
    for (int i = 0; i < 4 * B; i++)
        t[i] = 1 + (ctx * 2654435761u + (uint32_t)i * 40503u) % 50000u;
}

/* A valid MASK row: block i of context ctx, layer. */
static uint8_t *make_row(uint32_t ctx, uint32_t i, uint32_t layer, size_t *size, mf_hash128_t *h)
{
    uint32_t t[4 * B];
    ctx_tokens(ctx, t);
    mf_hash128_t hh = mf_hash_root(B, NS, strlen(NS), MODEL, strlen(MODEL)), parent = hh;
    for (uint32_t b = 0; b <= i; b++) {
        parent = hh;
        hh = mf_hash_next(hh, t + b * B, B);
    }
    *h = hh;
    mf_row_spec_t spec = {MODEL, layer, i, B, 2, MF_CODEC_MASK, 0.9f, parent, hh, t + i * B};
    uint32_t cols[2] = {0, i};
    uint64_t masks[2] = {3, 3};
    float mass[4] = {0.5f, 0.25f, 0.125f, 0.0625f};
    size_t need = 0;
    const char *why;
    mf_row_build(NULL, 0, &spec, i ? 2 : 1, cols, masks, mass, NULL, &need, &why);
    uint8_t *buf = aligned_alloc(64, (need + 63) & ~(size_t)63);
    if (buf && mf_row_build(buf, need, &spec, i ? 2 : 1, cols, masks, mass, NULL, size, &why) !=
                   MF_OK) {
        free(buf);
        buf = NULL;
    }
    return buf;
}

#define ENV(e, CASE, field, msg)                                                        \
    mf_envelope_t e = MAPFLOW__V1__ENVELOPE__INIT;                                        \
    e.body_case = MAPFLOW__V1__ENVELOPE__BODY_##CASE;                                   \
    e.field = (msg)

static void op_put(cli_t *c, in_t *in, int raw_row)
{
    uint32_t ctx = u8(in) % NCTX, blk = u8(in) % 4, layer = u8(in) % 3;
    size_t len = 0;
    mf_hash128_t h;
    uint8_t *row = make_row(ctx, blk, layer, &len, &h);
    if (!row)
        return;
    if (!raw_row) {
        uint8_t hle[16];
        mf_hash_to_le(h, hle);
        Mapflow__V1__Key k = MAPFLOW__V1__KEY__INIT;
        k.model = MODEL;
        k.layer = layer;
        k.hash.data = hle;
        k.hash.len = 16;
        Mapflow__V1__PutBegin pb = MAPFLOW__V1__PUT_BEGIN__INIT;
        pb.key = &k;
        pb.size = len;
        pb.durable = u8(in) & 1;
        ENV(e, PUT_BEGIN, put_begin, &pb);
        c->arena_off = UINT64_MAX;
        send_env(c, &e, NULL, 0);
    }
    Mapflow__V1__PutCommit pc = MAPFLOW__V1__PUT_COMMIT__INIT;
    pc.reservation_id = c->rid;
    ENV(e, PUT_COMMIT, put_commit, &pc);
    if (raw_row) { /* the row's bytes come from the input: validation must refuse junk */
        uint8_t n = u8(in);
        uint8_t junk[256];
        memset(junk, 0, sizeof(junk));
        for (int i = 0; i < n; i++)
            junk[i] = u8(in);
        send_env(c, &e, junk, n);
    } else if (c->arena_off != UINT64_MAX &&
               c->arena_off + len <= mfd_arena_capacity(g_srv->store.arena)) {
        memcpy(mfd_arena_base(g_srv->store.arena) + c->arena_off, row, len);
        if (u8(in) == 0xff) /* sometimes scribble on it, as a hostile client may */
            mfd_arena_base(g_srv->store.arena)[c->arena_off + u8(in) % len] ^= 1;
        send_env(c, &e, NULL, 0);
    } else {
        send_env(c, &e, row, len);
    }
    free(row);
}

static void op_get(cli_t *c, in_t *in, int kind)
{
    uint32_t ctx = u8(in) % NCTX, t[4 * B], layers[3] = {0, 1, 2};
    ctx_tokens(ctx, t);
    uint8_t a = u8(in), b = u8(in);
    size_t ntok = (size_t)(u8(in) % (4 * B + 1));
    if (kind == 3) {
        Mapflow__V1__Lookup m = MAPFLOW__V1__LOOKUP__INIT;
        m.model = a & 0x80 ? "" : MODEL;
        m.block_size = a & 0x40 ? (uint32_t)b : B;
        m.n_layers = a % 4;
        m.layers = layers;
        ENV(e, LOOKUP, lookup, &m);
        send_env(c, &e, t, ntok * 4 - (a & 0x20 ? 1 : 0) * (ntok > 0));
        return;
    }
    Mapflow__V1__Get m = MAPFLOW__V1__GET__INIT;
    m.model = MODEL;
    m.block_size = a & 0x40 ? (uint32_t)b : B;
    m.n_layers = a % 4;
    m.layers = layers;
    m.first_block = b % 5;
    m.n_blocks = (b >> 4) % 5;
    m.mode = kind == 5 ? MAPFLOW__V1__GET_MODE__GET_LEASE : MAPFLOW__V1__GET_MODE__GET_COPY;
    ENV(e, GET, get, &m);
    send_env(c, &e, t, ntok * 4);
}

static void op_keys(cli_t *c, in_t *in)
{
    Mapflow__V1__Key k[4], *kp[4];
    uint8_t h[4][16];
    size_t n = u8(in) % 5;
    for (size_t i = 0; i < n; i++) {
        size_t len;
        mf_hash128_t hh;
        uint32_t layer = u8(in) % 3;
        uint8_t *row = make_row(u8(in) % NCTX, u8(in) % 4, layer, &len, &hh);
        free(row);
        mf_hash_to_le(hh, h[i]);
        mapflow__v1__key__init(&k[i]);
        k[i].model = MODEL;
        k[i].layer = layer;
        k[i].hash.data = h[i];
        k[i].hash.len = u8(in) == 7 ? 15 : 16;
        kp[i] = &k[i];
    }
    Mapflow__V1__Get m = MAPFLOW__V1__GET__INIT;
    m.n_keys = n;
    m.keys = kp;
    m.mode = u8(in) & 1;
    ENV(e, GET, get, &m);
    send_env(c, &e, NULL, 0);
}

static void op_admin(cli_t *c, in_t *in, int op)
{
    uint8_t a = u8(in);
    if (op == 6) {
        Mapflow__V1__Release m = MAPFLOW__V1__RELEASE__INIT;
        uint64_t ids[17];
        memcpy(ids, c->leases, c->n_leases * sizeof(uint64_t));
        ids[c->n_leases] = a;
        m.n_lease_ids = c->n_leases + 1;
        m.lease_ids = ids;
        c->n_leases = 0;
        ENV(e, RELEASE, release, &m);
        send_env(c, &e, NULL, 0);
    } else if (op == 7) {
        Mapflow__V1__List m = MAPFLOW__V1__LIST__INIT;
        uint8_t tok[8] = {2, 'f', 'u', 2, 'f', 'z', 0, 1};
        m.model = a & 1 ? MODEL : "";
        m.has_layer = (a >> 1) & 1;
        m.layer = (a >> 2) & 3;
        m.page_size = u8(in) % 4;
        if (a & 0x80) {
            m.page_token.data = tok;
            m.page_token.len = a % 9;
        }
        ENV(e, LIST, list, &m);
        send_env(c, &e, NULL, 0);
    } else if (op == 8) {
        Mapflow__V1__Delete m = MAPFLOW__V1__DELETE__INIT;
        m.model = a & 1 ? MODEL : "";
        m.has_layer = (a >> 1) & 1;
        m.layer = (a >> 2) & 3;
        ENV(e, DELETE, delete_, &m);
        send_env(c, &e, NULL, 0);
    } else if (op == 9) {
        Mapflow__V1__Flush f = MAPFLOW__V1__FLUSH__INIT;
        Mapflow__V1__Stats s = MAPFLOW__V1__STATS__INIT;
        Mapflow__V1__Health h = MAPFLOW__V1__HEALTH__INIT;
        Mapflow__V1__Evict ev = MAPFLOW__V1__EVICT__INIT;
        ev.tier = (Mapflow__V1__Tier)(u8(in) % 5);
        ev.bytes = (uint64_t)u8(in) << 10;
        mf_envelope_t e = MAPFLOW__V1__ENVELOPE__INIT;
        switch (a % 4) {
        case 0: e.body_case = MAPFLOW__V1__ENVELOPE__BODY_FLUSH; e.flush = &f; break;
        case 1: e.body_case = MAPFLOW__V1__ENVELOPE__BODY_STATS; e.stats = &s; break;
        case 2: e.body_case = MAPFLOW__V1__ENVELOPE__BODY_HEALTH; e.health = &h; break;
        default: e.body_case = MAPFLOW__V1__ENVELOPE__BODY_EVICT; e.evict = &ev; break;
        }
        send_env(c, &e, NULL, 0);
    } else if (op == 11) {
        uint32_t ht = 1 + a % 3, hs = 1 + (a >> 2) % 3;
        float w[9];
        for (uint32_t i = 0; i < ht * hs; i++)
            w[i] = (float)u8(in) / 255.0f;
        Mapflow__V1__LayerMap lm = MAPFLOW__V1__LAYER_MAP__INIT, *lmp = &lm;
        lm.target_heads = ht;
        lm.source_heads = hs;
        lm.n_w = ht * hs - (a >> 7);
        lm.w = w;
        Mapflow__V1__MappingProfile p = MAPFLOW__V1__MAPPING_PROFILE__INIT;
        p.source_model = MODEL;
        p.target_model = "t";
        p.n_layers = 1;
        p.layers = &lmp;
        Mapflow__V1__ProfilePut m = MAPFLOW__V1__PROFILE_PUT__INIT;
        m.profile = &p;
        ENV(e, PROFILE_PUT, profile_put, &m);
        send_env(c, &e, NULL, 0);
    } else {
        Mapflow__V1__Key k = MAPFLOW__V1__KEY__INIT;
        uint8_t h[16] = {a};
        k.model = MODEL;
        k.hash.data = h;
        k.hash.len = 16;
        Mapflow__V1__PutBegin pb = MAPFLOW__V1__PUT_BEGIN__INIT;
        pb.key = &k;
        pb.size = ((uint64_t)u8(in) << 16) | ((uint64_t)u8(in) << 8) | a;
        ENV(e, PUT_BEGIN, put_begin, &pb);
        send_env(c, &e, NULL, 0);
    }
}

static void stop_server(void)
{
    char path[128];
    mfd_server_destroy(g_srv); /* also unlinks the socket */
    g_srv = NULL;
    snprintf(path, sizeof(path), "%s/data", g_dir);
    rmdir(path);
    rmdir(g_dir);
}

static int start_server(void)
{
    snprintf(g_dir, sizeof(g_dir), "/tmp/mf-fuzz-XXXXXX");
    if (!mkdtemp(g_dir))
        return -1;
    char *sock = g_sock, data[128], err[MFD_CONFIG_ERRLEN];
    snprintf(g_sock, sizeof(g_sock), "%s/d.sock", g_dir);
    snprintf(data, sizeof(data), "%s/data", g_dir);
    const char *kv[] = {"socket", sock, "data_dir", data, "http", "", "host_bytes", "1mb",
                        "ssd_bytes", "0", "max_batch", "64", "max_frame", "256kb",
                        "log_level", "error", "lease_ttl", "1s", NULL};
    mfd_config_t cfg;
    mfd_config_init(&cfg);
    for (int i = 0; kv[i]; i += 2)
        if (mfd_config_set(&cfg, kv[i], kv[i + 1], 0, err, sizeof(err)) != MF_OK)
            return -1;
    if (mfd_server_create(&cfg, NULL, NULL, 0, &g_srv, err, sizeof(err)) != MF_OK) {
        fprintf(stderr, "fuzz_daemon: %s\n", err);
        return -1;
    }
    mfd_config_deinit(&cfg);
    atexit(stop_server);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!g_srv && start_server() != 0)
        abort();
    in_t in = {data, size};
    cli_t c = {0};
    c.next_id = 1;
    c.fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un sun = {0};
    sun.sun_family = AF_UNIX;
    memcpy(sun.sun_path, g_sock, sizeof(g_sock));
    if (c.fd < 0 || connect(c.fd, (struct sockaddr *)&sun, sizeof(sun)) != 0 ||
        mf_frame_reader_init(&c.rd, MF_FRAME_DEFAULT_MAX) != MF_OK)
        abort();
    pump();
    uint8_t flags = u8(&in);
    if (!(flags & 1)) {
        Mapflow__V1__Hello h = MAPFLOW__V1__HELLO__INIT;
        h.protocol_version = 1;
        h.namespace_ = NS;
        h.want_host_arena = (flags >> 1) & 1;
        ENV(e, HELLO, hello, &h);
        send_env(&c, &e, NULL, 0);
    }
    for (int ops = 0; in.n && ops < 64; ops++) {
        uint8_t op = u8(&in) % 13;
        if (op == 0) {
            uint8_t n = u8(&in), buf[256];
            for (int i = 0; i < n; i++)
                buf[i] = u8(&in);
            send_raw(&c, buf, n);
            drain(&c);
        } else if (op == 1 || op == 2) {
            op_put(&c, &in, op == 2);
        } else if (op >= 3 && op <= 5) {
            op_get(&c, &in, op);
        } else if (op == 10) {
            op_keys(&c, &in);
        } else {
            op_admin(&c, &in, op);
        }
    }
    close(c.fd);
    mf_frame_reader_deinit(&c.rd);
    pump(); /* the daemon sees the close: leases and reservations go */
    return 0;
}
