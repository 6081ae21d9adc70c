/*
 * rel_security — attacks on a daemon started with a unix socket, a loopback TCP listener
 * and a token: Hello without / with a wrong token on TCP, requests before Hello, another
 * namespace's keys through every call that names or walks keys, lengths and counts out
 * of bounds on the wire, and a planted hash collision (a row stored under the key of a
 * block whose tokens differ).
 */
#include "mf_addr.h"
#include "rel_tool.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MODEL "sec-model"
#define B 16

/* Sends env (+ payload) and expects an ErrorReply with `want`; returns 1 if so. */
static int expect_code(rel_conn_t *c, mf_envelope_t *env, const void *pl, size_t plen,
                       int want, const char *what)
{
    mf_envelope_t *r = rel_call(c, env, pl, plen);
    int code = r && r->body_case == MAPFLOW__V1__ENVELOPE__BODY_ERROR ? (int)r->error->code
               : r ? 0 : -1;
    if (r)
        mf_envelope_free(r);
    return REL_CHECK(code == want, "%s: got %d (%s), want %s", what, code,
                     code > 0 ? mf_status_name((mf_status_t)code) : "reply/none",
                     mf_status_name((mf_status_t)want));
}

/* 1 when the daemon closed the connection (EOF, no more replies). */
static int closed(rel_conn_t *c)
{
    mf_envelope_t *r = rel_recv(c, NULL);
    if (r)
        mf_envelope_free(r);
    return r == NULL;
}

static int tcp_token(const char *tcp, const char *token)
{
    char target[300], wrong[256], longer[300];
    snprintf(target, sizeof(target), "tcp:%s", tcp);
    snprintf(wrong, sizeof(wrong), "%s", token);
    wrong[strlen(wrong) - 1] ^= 1;
    snprintf(longer, sizeof(longer), "%sx", token);
    const char *bad[] = {"", wrong, longer, "x"};
    int refused = 0;
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        rel_conn_t c;
        if (!REL_CHECK(rel_dial(&c, target, 5000) == 0, "tcp dial"))
            return 1;
        int rc = rel_hello(&c, "tenant", bad[i], 0);
        refused += REL_CHECK(rc == MF_UNAUTHENTICATED, "tcp Hello with bad token %zu: %d", i, rc) &&
                   REL_CHECK(closed(&c), "tcp connection left open after a bad token");
        rel_close(&c);
    }
    /* A request before Hello: refused and closed, nothing executed. */
    rel_conn_t c;
    REL_CHECK(rel_dial(&c, target, 5000) == 0, "tcp dial");
    Mapflow__V1__Flush fl = MAPFLOW__V1__FLUSH__INIT;
    mf_envelope_t env = MAPFLOW__V1__ENVELOPE__INIT;
    env.body_case = MAPFLOW__V1__ENVELOPE__BODY_FLUSH;
    env.flush = &fl;
    int pre = expect_code(&c, &env, NULL, 0, MF_FAILED_PRECONDITION, "Flush before Hello") &&
              REL_CHECK(closed(&c), "open after a request before Hello");
    rel_close(&c);
    int good = REL_CHECK(rel_open(&c, target, "tenant", token, 0, 5000) == 0,
                         "tcp Hello with the right token");
    rel_close(&c);
    /* Unix socket: no token needed (its file mode guards it). */
    rel_result("tcp-token", "TCP without / with a wrong token",
               "Hello with no token, a one-bit-off token, token+1 byte, 1 byte; Flush before "
               "Hello",
               "%d/4 refused UNAUTHENTICATED and closed; pre-Hello request FAILED_PRECONDITION "
               "and closed: %s; right token accepted: %s; comparison constant-time over the "
               "bytes (dispatch.c token_equal)",
               refused, pre ? "yes" : "NO", good ? "yes" : "NO");
    return 0;
}

/* Puts the NB×2 rows of ctx tokens t under ns; returns how many committed. */
static int put_ctx(rel_conn_t *c, const char *ns, const uint32_t *t, int nb)
{
    int n = 0;
    for (uint32_t layer = 0; layer < 2; layer++)
        for (int b = 0; b < nb; b++) {
            rel_row_spec_t rs = {ns, MODEL, layer, B, t, (uint32_t)b, MF_CODEC_MASK,
                                 (unsigned)(b + 7), NULL};
            size_t len;
            uint8_t *row = rel_row(&rs, &len);
            n += row && rel_put(c, row, len, 0, NULL) == 0;
            free(row);
        }
    return n;
}

static int count_status(const mf_envelope_t *r, uint32_t status)
{
    int n = 0;
    for (size_t i = 0; r && r->body_case == MAPFLOW__V1__ENVELOPE__BODY_GET_REPLY &&
                       i < r->get_reply->n_rows; i++)
        n += r->get_reply->rows[i]->status == status;
    return n;
}

static int namespaces(const char *unix_path)
{
    rel_conn_t alice, bob;
    if (!REL_CHECK(rel_open(&alice, unix_path, "alice", NULL, 1, 5000) == 0 &&
                       rel_open(&bob, unix_path, "bob", NULL, 1, 5000) == 0,
                   "connect"))
        return 1;
    uint32_t t[4 * B], layers[2] = {0, 1}, blocks[2];
    rel_tokens(t, 4 * B, 31337);
    REL_CHECK(put_ctx(&alice, "alice", t, 4) == 8, "alice's puts");
    int leaks = 0;
    /* bob names alice's tokens, keys and model through every call. */
    leaks += !REL_CHECK(rel_lookup(&bob, MODEL, B, layers, 2, t, 4 * B, blocks) == 0 &&
                            blocks[0] == 0 && blocks[1] == 0,
                        "bob's Lookup sees alice's blocks");
    for (int lease = 0; lease < 2; lease++) {
        mf_envelope_t *r = rel_get_prefix(&bob, MODEL, B, layers, 2, t, 4 * B, 0, 4, lease);
        leaks += !REL_CHECK(count_status(r, MF_NOT_FOUND) == 8, "bob's Get (lease %d)", lease);
        if (r)
            mf_envelope_free(r);
    }
    Mapflow__V1__Key k = MAPFLOW__V1__KEY__INIT, *kp = &k;
    uint8_t hle[16];
    mf_hash128_t parent, h;
    rel_block_hashes("alice", MODEL, B, t, 0, &parent, &h);
    mf_hash_to_le(h, hle);
    k.model = MODEL;
    k.hash.data = hle;
    k.hash.len = 16;
    Mapflow__V1__Get g = MAPFLOW__V1__GET__INIT;
    g.n_keys = 1;
    g.keys = &kp;
    mf_envelope_t env = MAPFLOW__V1__ENVELOPE__INIT;
    env.body_case = MAPFLOW__V1__ENVELOPE__BODY_GET;
    env.get = &g;
    mf_envelope_t *r = rel_call(&bob, &env, NULL, 0);
    leaks += !REL_CHECK(count_status(r, MF_NOT_FOUND) == 1, "bob's Get by alice's key");
    if (r)
        mf_envelope_free(r);
    uint64_t n = 99;
    leaks += !REL_CHECK(rel_list_count(&bob, NULL, &n) == 0 && n == 0, "bob's List: %llu",
                        (unsigned long long)n);
    leaks += !REL_CHECK(rel_delete_model(&bob, MODEL, &n) == 0 && n == 0, "bob's Delete: %llu",
                        (unsigned long long)n);
    Mapflow__V1__Delete d = MAPFLOW__V1__DELETE__INIT;
    d.key = &k;
    env = (mf_envelope_t)MAPFLOW__V1__ENVELOPE__INIT;
    env.body_case = MAPFLOW__V1__ENVELOPE__BODY_DELETE;
    env.delete_ = &d;
    r = rel_call(&bob, &env, NULL, 0);
    leaks += !REL_CHECK(r && r->body_case == MAPFLOW__V1__ENVELOPE__BODY_DELETE_REPLY &&
                            r->delete_reply->deleted == 0,
                        "bob's Delete of alice's key");
    if (r)
        mf_envelope_free(r);
    leaks += !REL_CHECK(rel_flush(&bob, &n) == 0 && n == 0, "bob's Flush: %llu",
                        (unsigned long long)n);
    uint64_t ev = 99;
    leaks += !REL_CHECK(rel_evict(&bob, MAPFLOW__V1__TIER__TIER_HOST, &ev) == 0 && ev == 0,
                        "bob's Evict touched %llu entries", (unsigned long long)ev);
    /* Stats: counters and tiers only — no key, model or namespace of anyone. */
    Mapflow__V1__Stats st = MAPFLOW__V1__STATS__INIT;
    env = (mf_envelope_t)MAPFLOW__V1__ENVELOPE__INIT;
    env.body_case = MAPFLOW__V1__ENVELOPE__BODY_STATS;
    env.stats = &st;
    r = rel_call(&bob, &env, NULL, 0);
    if (REL_CHECK(r && r->body_case == MAPFLOW__V1__ENVELOPE__BODY_STATS_REPLY, "Stats")) {
        size_t plen = mapflow__v1__stats_reply__get_packed_size(r->stats_reply);
        uint8_t *buf = malloc(plen + 1);
        mapflow__v1__stats_reply__pack(r->stats_reply, buf);
        leaks += !REL_CHECK(!memmem(buf, plen, "alice", 5) && !memmem(buf, plen, MODEL, 9) &&
                                !memmem(buf, plen, hle, 16),
                            "bob's Stats reply names alice, her model or a key");
        free(buf);
    }
    if (r)
        mf_envelope_free(r);
    /* alice still has everything. */
    REL_CHECK(rel_lookup(&alice, MODEL, B, layers, 2, t, 4 * B, blocks) == 0 && blocks[0] == 4 &&
                  blocks[1] == 4,
              "alice lost rows to bob: %u %u", blocks[0], blocks[1]);
    REL_CHECK(rel_list_count(&alice, NULL, &n) == 0 && n == 8, "alice's List: %llu",
              (unsigned long long)n);
    /* Peer path: bob names a peer (none listens there). Either the build has no peers
     * (UNIMPLEMENTED) or it answers from here alone — and still shows bob nothing. */
    Mapflow__V1__Lookup lk = MAPFLOW__V1__LOOKUP__INIT;
    lk.model = MODEL;
    lk.block_size = B;
    lk.n_layers = 2;
    lk.layers = layers;
    lk.peer = "127.0.0.1:1";
    env = (mf_envelope_t)MAPFLOW__V1__ENVELOPE__INIT;
    env.body_case = MAPFLOW__V1__ENVELOPE__BODY_LOOKUP;
    env.lookup = &lk;
    mf_envelope_t *pr = rel_call(&bob, &env, t, sizeof(t));
    int peer_code = !pr ? -1 : pr->body_case == MAPFLOW__V1__ENVELOPE__BODY_ERROR
                                  ? (int)pr->error->code : 0;
    int peer_zero = pr && pr->body_case == MAPFLOW__V1__ENVELOPE__BODY_LOOKUP_REPLY &&
                    pr->lookup_reply->n_blocks == 2 && pr->lookup_reply->blocks[0] == 0 &&
                    pr->lookup_reply->blocks[1] == 0;
    leaks += !REL_CHECK(peer_zero || peer_code == MF_UNIMPLEMENTED || peer_code == MF_UNAVAILABLE,
                        "bob's Lookup via an unreachable peer: code %d", peer_code);
    if (pr)
        mf_envelope_free(pr);
    rel_close(&alice);
    rel_close(&bob);
    rel_result("namespaces", "another namespace's keys",
               "bob names alice's tokens / keys / model in Lookup, Get (copy, lease, by key), "
               "List, Delete (key, model), Flush, Evict, Stats",
               "%d leaks: bob saw and removed nothing, Stats names no key; alice kept 8/8 rows",
               leaks);
    rel_result("peer", "a peer that vanished / never answers (UCX)",
               "bob's Lookup naming a peer address where nothing listens",
               "%s; the daemon kept serving",
               peer_zero ? "answered from this daemon alone: 0 blocks for bob (no leak)"
               : peer_code == MF_UNIMPLEMENTED ? "UNIMPLEMENTED: no UCX peers in this build"
                                               : "UNAVAILABLE");
    return 0;
}

static int collision(const char *unix_path)
{
    rel_conn_t c;
    if (!REL_CHECK(rel_open(&c, unix_path, "victim", NULL, 1, 5000) == 0, "connect"))
        return 1;
    uint32_t t1[B], t2[B], layer = 5, blocks = 9;
    rel_tokens(t1, B, 1111);
    /* t2: a real XXH3-128 collision of t1's block (the daemon refuses a row whose hash
     * is not H(parent, tokens), so a forced header hash no longer plants one). */
    REL_CHECK(rel_collide_block(t1, B, t2, 2222) == 0, "no collision built");
    mf_hash128_t parent, h1, h2;
    rel_block_hashes("victim", MODEL, B, t1, 0, &parent, &h1);
    rel_block_hashes("victim", MODEL, B, t2, 0, &parent, &h2);
    REL_CHECK(mf_hash_eq(h1, h2), "t1 and t2 hash differently");
    uint64_t mm0 = rel_counter(&c, "hash_mismatches_total");
    /* A row of context t2, stored under the key of context t1's block. */
    rel_row_spec_t rs = {"victim", MODEL, layer, B, t2, 0, MF_CODEC_MASK, 5, NULL};
    size_t len;
    uint8_t *row = rel_row(&rs, &len);
    int rc = row ? rel_put(&c, row, len, 0, NULL) : -1;
    free(row);
    REL_CHECK(rc == 0, "planting the colliding row: %d (%s)", rc, c.err);
    REL_CHECK(rel_lookup(&c, MODEL, B, &layer, 1, t1, B, &blocks) == 0 && blocks == 0,
              "Lookup of t1 counts the colliding row (%u)", blocks);
    int outcomes[2];
    for (int lease = 0; lease < 2; lease++) {
        mf_envelope_t *r = rel_get_prefix(&c, MODEL, B, &layer, 1, t1, B, 0, 1, lease);
        outcomes[lease] = r && r->body_case == MAPFLOW__V1__ENVELOPE__BODY_GET_REPLY &&
                                  r->get_reply->n_rows == 1
                              ? (int)r->get_reply->rows[0]->status
                              : -1;
        REL_CHECK(outcomes[lease] == MF_NOT_FOUND, "Get (lease %d) of t1: status %d", lease,
                  outcomes[lease]);
        if (r && outcomes[lease] == MF_NOT_FOUND)
            REL_CHECK(r->get_reply->rows[0]->lease_id == 0, "a lease on the other map");
        if (r)
            mf_envelope_free(r);
    }
    uint64_t mm1 = rel_counter(&c, "hash_mismatches_total");
    REL_CHECK(mm1 != UINT64_MAX && mm1 >= mm0 + 3, "hash_mismatches_total %llu -> %llu",
              (unsigned long long)mm0, (unsigned long long)mm1);
    rel_close(&c);
    rel_result("collision", "hash collision planted",
               "a row of context B stored under context A's key (B's block a real XXH3-128 "
               "collision of A's); Lookup, Get copy and Get lease of A",
               "Lookup 0 blocks; Get copy %s, Get lease %s (no lease, no bytes); "
               "hash_mismatches_total +%llu",
               mf_status_name((mf_status_t)outcomes[0]), mf_status_name((mf_status_t)outcomes[1]),
               (unsigned long long)(mm1 - mm0));
    return 0;
}

/* Each malformed length or count: the expected status, and the daemon still serves. */
static int bounds(const char *unix_path)
{
    int tried = 0, held = 0;
    rel_conn_t c;
    mf_envelope_t env;
#define FRESH() (rel_close(&c), rel_open(&c, unix_path, "bounds", NULL, 0, 5000))
    rel_open(&c, unix_path, "bounds", NULL, 0, 5000);
    /* Raw frame headers: too long, too short, msg_len past the frame, garbage envelope. */
    static const struct { uint32_t flen, mlen; int want; const char *what; } raw[] = {
        {0xffffffffu, 0, MF_RESOURCE_EXHAUSTED, "frame_len 4 GiB"},
        {2, 0, MF_INVALID_ARGUMENT, "frame_len 2"},
        {16, 100, MF_INVALID_ARGUMENT, "msg_len > frame_len"},
        {16, 12, MF_INVALID_ARGUMENT, "garbage envelope"},
    };
    for (size_t i = 0; i < sizeof(raw) / sizeof(raw[0]); i++) {
        uint8_t f[24];
        memset(f, 0xee, sizeof(f));
        memcpy(f, &raw[i].flen, 4);
        memcpy(f + 4, &raw[i].mlen, 4);
        rel_send_raw(&c, f, raw[i].flen == 16 ? 20 : 8);
        mf_envelope_t *r = rel_recv(&c, NULL);
        int code = r && r->body_case == MAPFLOW__V1__ENVELOPE__BODY_ERROR ? (int)r->error->code : -1;
        if (r)
            mf_envelope_free(r);
        tried++;
        held += REL_CHECK(code == raw[i].want, "%s: code %d", raw[i].what, code) &&
                REL_CHECK(closed(&c), "%s: connection left open", raw[i].what);
        FRESH();
    }
    /* Hello with a 129-byte namespace. */
    rel_close(&c);
    rel_dial(&c, unix_path, 5000);
    char ns[130];
    memset(ns, 'n', 129);
    ns[129] = 0;
    tried++;
    held += REL_CHECK(rel_hello(&c, ns, NULL, 0) == MF_INVALID_ARGUMENT, "129-byte namespace");
    FRESH();
    /* Requests with out-of-range sizes and counts. */
    char model300[301];
    memset(model300, 'm', 300);
    model300[300] = 0;
    uint8_t h16[16] = {1}, h15[15] = {1}, tok[64] = {1};
    Mapflow__V1__Key k = MAPFLOW__V1__KEY__INIT;
    k.model = MODEL;
    k.hash.data = h16;
    k.hash.len = 16;
    Mapflow__V1__PutBegin pb = MAPFLOW__V1__PUT_BEGIN__INIT;
    pb.key = &k;
    uint64_t sizes[] = {1ull << 40, 10, 0};
    for (size_t i = 0; i < 3; i++) {
        pb.size = sizes[i];
        env = (mf_envelope_t)MAPFLOW__V1__ENVELOPE__INIT;
        env.body_case = MAPFLOW__V1__ENVELOPE__BODY_PUT_BEGIN;
        env.put_begin = &pb;
        tried++;
        held += expect_code(&c, &env, NULL, 0, MF_INVALID_ARGUMENT, "PutBegin size");
    }
    pb.size = 4096;
    k.hash.data = h15;
    k.hash.len = 15;
    tried++;
    held += expect_code(&c, &env, NULL, 0, MF_INVALID_ARGUMENT, "PutBegin 15-byte hash");
    k.hash.data = h16;
    k.hash.len = 16;
    k.model = model300;
    tried++;
    held += expect_code(&c, &env, NULL, 0, MF_INVALID_ARGUMENT, "PutBegin 300-byte model");
    k.model = MODEL;
    /* Lookup: 0 layers, max_batch + 1 layers, tokens not a multiple of 4, bad block size. */
    uint32_t max_batch = c.max_batch;
    REL_CHECK(max_batch >= 16384, "HelloReply max_batch %u (the default is 16384)", max_batch);
    uint32_t *many = malloc(((size_t)max_batch + 1) * sizeof(*many));
    if (!REL_CHECK(many != NULL, "out of memory")) {
        rel_close(&c);
        return 1;
    }
    unsigned seed = 4099;
    for (uint32_t i = 0; i <= max_batch; i++)
        many[i] = (uint32_t)rand_r(&seed) % 64;
    Mapflow__V1__Lookup lk = MAPFLOW__V1__LOOKUP__INIT;
    lk.model = MODEL;
    lk.block_size = B;
    env = (mf_envelope_t)MAPFLOW__V1__ENVELOPE__INIT;
    env.body_case = MAPFLOW__V1__ENVELOPE__BODY_LOOKUP;
    env.lookup = &lk;
    tried += 4;
    held += expect_code(&c, &env, tok, 64, MF_INVALID_ARGUMENT, "Lookup 0 layers");
    lk.n_layers = (size_t)max_batch + 1;
    lk.layers = many;
    held += expect_code(&c, &env, tok, 64, MF_INVALID_ARGUMENT, "Lookup max_batch + 1 layers");
    lk.n_layers = 1;
    held += expect_code(&c, &env, tok, 7, MF_INVALID_ARGUMENT, "Lookup 7 token bytes");
    lk.block_size = 1u << 31;
    held += expect_code(&c, &env, tok, 64, MF_INVALID_ARGUMENT, "Lookup block_size 2^31");
    /* Get: first_block / n_blocks past the tokens, layers × blocks over max_batch. */
    Mapflow__V1__Get g = MAPFLOW__V1__GET__INIT;
    g.model = MODEL;
    g.block_size = 8;
    g.n_layers = 1;
    g.layers = many;
    env = (mf_envelope_t)MAPFLOW__V1__ENVELOPE__INIT;
    env.body_case = MAPFLOW__V1__ENVELOPE__BODY_GET;
    env.get = &g;
    tried += 3;
    g.first_block = 0xffffffffu;
    held += expect_code(&c, &env, tok, 64, MF_INVALID_ARGUMENT, "Get first_block 2^32-1");
    g.first_block = 0;
    g.n_blocks = 0xffffffffu;
    held += expect_code(&c, &env, tok, 64, MF_INVALID_ARGUMENT, "Get n_blocks 2^32-1");
    g.n_blocks = 2;
    g.n_layers = max_batch / 2 + 1;
    held += expect_code(&c, &env, tok, 64, MF_INVALID_ARGUMENT,
                        "Get max_batch / 2 + 1 layers × 2 blocks");
    free(many);
    /* List: page_size and page_token out of range. */
    Mapflow__V1__List ls = MAPFLOW__V1__LIST__INIT;
    uint8_t tokbuf[2000] = {0};
    env = (mf_envelope_t)MAPFLOW__V1__ENVELOPE__INIT;
    env.body_case = MAPFLOW__V1__ENVELOPE__BODY_LIST;
    env.list = &ls;
    tried += 2;
    ls.page_size = 100000;
    held += expect_code(&c, &env, NULL, 0, MF_INVALID_ARGUMENT, "List page_size 100000");
    ls.page_size = 10;
    ls.page_token.data = tokbuf;
    ls.page_token.len = sizeof(tokbuf);
    held += expect_code(&c, &env, NULL, 0, MF_INVALID_ARGUMENT, "List 2000-byte page_token");
    /* Profile with 100000 × 2 heads. */
    Mapflow__V1__MappingProfile prof = MAPFLOW__V1__MAPPING_PROFILE__INIT;
    Mapflow__V1__LayerMap lm = MAPFLOW__V1__LAYER_MAP__INIT, *lmp = &lm;
    prof.source_model = "a";
    prof.target_model = "b";
    prof.n_layers = 1;
    prof.layers = &lmp;
    lm.target_heads = 100000;
    lm.source_heads = 2;
    Mapflow__V1__ProfilePut pp = MAPFLOW__V1__PROFILE_PUT__INIT;
    pp.profile = &prof;
    env = (mf_envelope_t)MAPFLOW__V1__ENVELOPE__INIT;
    env.body_case = MAPFLOW__V1__ENVELOPE__BODY_PROFILE_PUT;
    env.profile_put = &pp;
    tried++;
    /* Profiles are written by admins: the check runs on the admin socket. */
    char admin_path[4200];
    rel_conn_t adm;
    mf_admin_socket_path(unix_path, admin_path, sizeof(admin_path));
    if (REL_CHECK(rel_open(&adm, admin_path, "bounds", NULL, 0, 5000) == 0, "admin socket %s",
                  admin_path)) {
        held += expect_code(&adm, &env, NULL, 0, MF_INVALID_ARGUMENT, "Profile 100000 heads");
        rel_close(&adm);
    }
    /* PutCommit of an unknown reservation; Release of 10000 unknown leases. */
    Mapflow__V1__PutCommit pc = MAPFLOW__V1__PUT_COMMIT__INIT;
    pc.reservation_id = 0xdeadbeef;
    env = (mf_envelope_t)MAPFLOW__V1__ENVELOPE__INIT;
    env.body_case = MAPFLOW__V1__ENVELOPE__BODY_PUT_COMMIT;
    env.put_commit = &pc;
    tried++;
    held += expect_code(&c, &env, tok, 64, MF_NOT_FOUND, "PutCommit unknown reservation");
    static uint64_t ids[10000];
    for (size_t i = 0; i < 10000; i++)
        ids[i] = i + 1000000;
    uint32_t rel_n = 99;
    tried++;
    held += REL_CHECK(rel_release(&c, ids, 10000, &rel_n) == 0 && rel_n == 0,
                      "Release of 10000 unknown ids released %u", rel_n);
    rel_close(&c);
    rel_conn_t after;
    int alive = rel_open(&after, unix_path, "bounds", NULL, 0, 5000) == 0;
    REL_CHECK(alive, "daemon does not serve after the bounds attacks");
    if (alive)
        rel_close(&after);
    rel_result("bounds", "lengths and counts out of bounds on the wire",
               "frame_len 4 GiB / 2, msg_len past the frame, garbage envelope, 129-byte "
               "namespace, PutBegin size 2^40 / 10 / 0, 15-byte hash, 300-byte model, Lookup "
               "0 / max_batch + 1 layers, 7 token bytes, block 2^31, Get first_block / n_blocks "
               "2^32-1, (max_batch / 2 + 1)×2 rows, List page 100000 / 2000-byte token, profile 100000 heads, unknown "
               "reservation, 10000 unknown leases",
               "%d/%d answered with the expected status (frame errors close the connection); "
               "daemon kept serving",
               held, tried);
#undef FRESH
    return 0;
}

int rel_cmd_security(int argc, char **argv)
{
    const char *unix_path = rel_opt(argc, argv, "--unix", NULL);
    const char *tcp = rel_opt(argc, argv, "--tcp", NULL);
    const char *token = rel_opt(argc, argv, "--token", NULL);
    if (!unix_path || !tcp || !token || !token[0])
        return 2;
    int rc = tcp_token(tcp, token);
    rc |= namespaces(unix_path);
    rc |= collision(unix_path);
    rc |= bounds(unix_path);
    return rc;
}
