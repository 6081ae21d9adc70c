/*
 * rel_admin — issue 22's attacks on the admin boundary and on bounds (rel_tool admin-*):
 *
 *   admin-roles    a tenant tries every admin request (ConfigSet token / ssd_bytes /
 *                  max_connections, ProfilePut, Flush and Evict of every namespace); a
 *                  wrong admin_token; the admin socket and a right admin_token succeed
 *   admin-peers    Lookup / Get naming an address not in `peers`: refused, and the
 *                  listener we opened there sees no connection
 *   admin-timeouts a connection without Hello, a silent one, a busy one
 *   admin-unsent   a client that never reads its replies: closed at max_unsent
 *   admin-quota    one namespace's reservations stop at reservation_share; others put
 *   admin-lookup   Lookup / Get over max_lookup refused; a bystander's Health latency
 *                  while another client sends the largest allowed lookups
 *   admin-names    NUL in namespace / token (hand-made frames), control bytes in names
 *   admin-fds      at the descriptor limit: connections wait, the daemon does not spin,
 *                  and serves again once descriptors are free
 *
 * Each prints RESULT rows (tests/RELIABILITY.md) and counts failed checks.
 * Thread safety: admin-lookup runs one attacker thread; everything else is sequential.
 */
#include "mf_addr.h"
#include "rel_tool.h"

#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define MODEL "adm-model"

#define ENV_INIT(e, CASE, field, msg)                                                   \
    mf_envelope_t e = MAPFLOW__V1__ENVELOPE__INIT;                                        \
    e.body_case = MAPFLOW__V1__ENVELOPE__BODY_##CASE;                                   \
    e.field = (msg)

/* Status of one call: 0 = the wanted reply, an ErrorReply code, -1 = none. */
static int call_code(rel_conn_t *c, mf_envelope_t *env, const void *pl, size_t plen,
                     int want_case)
{
    mf_envelope_t *r = rel_call(c, env, pl, plen);
    int rc = rel_status(r, want_case, c);
    if (r)
        mf_envelope_free(r);
    return rc;
}

static int config_set(rel_conn_t *c, const char *key, const char *value)
{
    Mapflow__V1__ConfigSet m = MAPFLOW__V1__CONFIG_SET__INIT;
    m.key = (char *)key;
    m.value = (char *)value;
    ENV_INIT(env, CONFIG_SET, config_set, &m);
    return call_code(c, &env, NULL, 0, MAPFLOW__V1__ENVELOPE__BODY_CONFIG_SET_REPLY);
}

static int evict_all(rel_conn_t *c)
{
    Mapflow__V1__Evict m = MAPFLOW__V1__EVICT__INIT;
    m.tier = MAPFLOW__V1__TIER__TIER_HOST;
    m.all_namespaces = 1;
    ENV_INIT(env, EVICT, evict, &m);
    return call_code(c, &env, NULL, 0, MAPFLOW__V1__ENVELOPE__BODY_EVICT_REPLY);
}

static int profile_put(rel_conn_t *c)
{
    float w[1] = {1.0f};
    Mapflow__V1__LayerMap lm = MAPFLOW__V1__LAYER_MAP__INIT, *lmp = &lm;
    lm.target_heads = lm.source_heads = 1;
    lm.w = w;
    lm.n_w = 1;
    Mapflow__V1__MappingProfile prof = MAPFLOW__V1__MAPPING_PROFILE__INIT;
    prof.source_model = MODEL;
    prof.target_model = "adm-target";
    prof.n_layers = 1;
    prof.layers = &lmp;
    Mapflow__V1__ProfilePut pp = MAPFLOW__V1__PROFILE_PUT__INIT;
    pp.profile = &prof;
    ENV_INIT(env, PROFILE_PUT, profile_put, &pp);
    return call_code(c, &env, NULL, 0, MAPFLOW__V1__ENVELOPE__BODY_PROFILE_PUT_REPLY);
}

/* n small rows of consecutive blocks of one context (layer 0). */
static int put_rows(rel_conn_t *c, const char *ns, uint32_t B, const uint32_t *t, uint32_t n,
                    mf_codec_t codec)
{
    for (uint32_t b = 0; b < n; b++) {
        rel_row_spec_t rs = {ns, MODEL, 0, B, t, b, codec, 7 + b, NULL};
        size_t len;
        uint8_t *row = rel_row(&rs, &len);
        int rc = row ? rel_put(c, row, len, 0, NULL) : -1;
        free(row);
        if (rc != 0)
            return rc;
    }
    return 0;
}

static void admin_path(const char *unix_path, char *out, size_t n)
{
    mf_admin_socket_path(unix_path, out, n);
}

/* 1 when the daemon closed c within timeout_ms (EOF), measured into *ms. */
static int closed_within(rel_conn_t *c, int timeout_ms, uint64_t *ms)
{
    uint64_t t0 = mf_now_ms();
    while (mf_now_ms() - t0 < (uint64_t)timeout_ms) {
        char b;
        ssize_t n = recv(c->fd, &b, 1, 0);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
            *ms = mf_now_ms() - t0;
            return 1;
        }
    }
    *ms = mf_now_ms() - t0;
    return 0;
}

/* ---- roles -------------------------------------------------------------------------- */

static int cmd_roles(int argc, char **argv)
{
    const char *unix_path = rel_opt(argc, argv, "--unix", NULL);
    const char *tcp = rel_opt(argc, argv, "--tcp", NULL);
    const char *token = rel_opt(argc, argv, "--token", NULL);
    const char *atok = rel_opt(argc, argv, "--admin-token", NULL);
    if (!unix_path || !tcp || !token || !atok)
        return 2;
    char apath[4200], tcpt[300];
    admin_path(unix_path, apath, sizeof(apath));
    snprintf(tcpt, sizeof(tcpt), "tcp:%s", tcp);
    rel_conn_t alice, m, a;
    uint32_t t[8 * 4];
    rel_tokens(t, 32, 2201);
    if (!REL_CHECK(rel_open(&alice, unix_path, "alice", NULL, 0, 5000) == 0, "alice connects") ||
        !REL_CHECK(put_rows(&alice, "alice", 8, t, 4, MF_CODEC_MASK) == 0, "alice puts"))
        return 1;
    if (!REL_CHECK(rel_open(&m, unix_path, "mallory", NULL, 0, 5000) == 0, "mallory connects"))
        return 1;
    /* Every admin request from a tenant: PERMISSION_DENIED, and nothing changes. */
    static const char *const sets[][2] = {
        {"token", ""}, {"token", "locked-out"}, {"max_connections", "2"},
        {"write_through", "off"}, {"ssd_bytes", "4kb"}, {"token_file", "/etc/passwd"},
        {"peers", "127.0.0.1:9"}};
    int denied = 0, tried = 0;
    for (size_t i = 0; i < sizeof(sets) / sizeof(sets[0]); i++, tried++)
        denied += REL_CHECK(config_set(&m, sets[i][0], sets[i][1]) == MF_PERMISSION_DENIED,
                            "tenant ConfigSet %s: not PERMISSION_DENIED (%s)", sets[i][0], m.err);
    tried += 3;
    denied += REL_CHECK(profile_put(&m) == MF_PERMISSION_DENIED, "tenant ProfilePut");
    denied += REL_CHECK(rel_flush_scope(&m, 1, NULL) == MF_PERMISSION_DENIED, "tenant Flush all");
    denied += REL_CHECK(evict_all(&m) == MF_PERMISSION_DENIED, "tenant Evict all");
    uint64_t own = 99;
    REL_CHECK(rel_flush(&m, &own) == 0 && own == 0, "a tenant's own Flush still works");
    uint64_t kept = 0;
    REL_CHECK(rel_list_count(&alice, MODEL, &kept) == 0 && kept == 4,
              "alice kept %llu/4 rows after mallory", (unsigned long long)kept);
    /* Tenants still connect over TCP with the (unchanged) token. */
    rel_conn_t tt;
    int tcp_ok = rel_open(&tt, tcpt, "mallory", token, 0, 5000) == 0;
    REL_CHECK(tcp_ok, "TCP with the real token after the attempts");
    if (tcp_ok)
        rel_close(&tt);
    /* A wrong admin_token is refused outright; the right one makes an admin. */
    int wrong = -1;
    if (rel_dial(&tt, tcpt, 5000) == 0) {
        char bad[256];
        snprintf(bad, sizeof(bad), "%s", atok);
        bad[0] ^= 1;
        wrong = rel_hello_admin(&tt, "mallory", token, bad, 0);
        rel_close(&tt);
    }
    REL_CHECK(wrong == MF_UNAUTHENTICATED, "wrong admin_token: %d", wrong);
    int by_token = -1;
    if (rel_dial(&tt, tcpt, 5000) == 0) {
        by_token = rel_hello_admin(&tt, "ops", token, atok, 0);
        if (by_token == 0)
            by_token = config_set(&tt, "lease_ttl", "20s");
        rel_close(&tt);
    }
    REL_CHECK(by_token == 0, "ConfigSet with the admin_token over TCP: %d", by_token);
    int by_sock = -1;
    uint64_t flushed = 0;
    if (REL_CHECK(rel_open(&a, apath, "ops", NULL, 0, 5000) == 0, "admin socket %s", apath)) {
        by_sock = config_set(&a, "lease_ttl", "25s");
        REL_CHECK(profile_put(&a) == 0, "admin ProfilePut: %s", a.err);
        REL_CHECK(rel_flush_scope(&a, 1, &flushed) == 0 && flushed >= 4, "admin Flush of every "
                  "namespace dropped %llu", (unsigned long long)flushed);
        rel_close(&a);
    }
    REL_CHECK(by_sock == 0, "ConfigSet on the admin socket: %d", by_sock);
    REL_CHECK(rel_list_count(&alice, MODEL, &kept) == 0 && kept == 0,
              "alice has %llu rows after the admin flush", (unsigned long long)kept);
    rel_close(&m);
    rel_close(&alice);
    rel_result("admin", "a tenant runs admin requests",
               "namespace 'mallory' on the unix socket: ConfigSet token \"\" / token X / "
               "max_connections 2 / write_through off / ssd_bytes 4kb / token_file / peers, "
               "ProfilePut, Flush and Evict of every namespace; a wrong Hello.admin_token; "
               "then the admin socket and the right admin_token",
               "%d/%d refused PERMISSION_DENIED, alice kept 4/4 rows, TCP token unchanged; "
               "wrong admin_token UNAUTHENTICATED; admin socket and admin_token: ConfigSet ok, "
               "Flush of every namespace dropped %llu",
               denied, tried, (unsigned long long)flushed);
    return 0;
}

/* ---- peers -------------------------------------------------------------------------- */

static int cmd_peers(int argc, char **argv)
{
    const char *unix_path = rel_opt(argc, argv, "--unix", NULL);
    if (!unix_path)
        return 2;
    /* A listener standing in for the attacker's address: it must see no connection. */
    int lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof(sa);
    if (lfd < 0 || bind(lfd, (struct sockaddr *)&sa, sizeof(sa)) != 0 || listen(lfd, 8) != 0 ||
        getsockname(lfd, (struct sockaddr *)&sa, &sl) != 0)
        return 1;
    char peer[64];
    snprintf(peer, sizeof(peer), "127.0.0.1:%u", ntohs(sa.sin_port));
    rel_conn_t c;
    if (!REL_CHECK(rel_open(&c, unix_path, "mallory", NULL, 0, 5000) == 0, "connect"))
        return 1;
    uint32_t t[16 * 2], layer = 0;
    rel_tokens(t, 32, 77);
    Mapflow__V1__Lookup lk = MAPFLOW__V1__LOOKUP__INIT;
    lk.model = MODEL;
    lk.block_size = 16;
    lk.n_layers = 1;
    lk.layers = &layer;
    lk.peer = peer;
    ENV_INIT(e1, LOOKUP, lookup, &lk);
    int lc = call_code(&c, &e1, t, sizeof(t), MAPFLOW__V1__ENVELOPE__BODY_LOOKUP_REPLY);
    Mapflow__V1__Get g = MAPFLOW__V1__GET__INIT;
    g.model = MODEL;
    g.block_size = 16;
    g.n_layers = 1;
    g.layers = &layer;
    g.peer = peer;
    ENV_INIT(e2, GET, get, &g);
    int gc = call_code(&c, &e2, t, sizeof(t), MAPFLOW__V1__ENVELOPE__BODY_GET_REPLY);
    REL_CHECK(lc == MF_PERMISSION_DENIED, "Lookup naming %s: %d (%s)", peer, lc, c.err);
    REL_CHECK(gc == MF_PERMISSION_DENIED, "Get naming %s: %d (%s)", peer, gc, c.err);
    usleep(200000); /* a dial would have arrived by now */
    int dialled = 0;
    for (int fd; (fd = accept(lfd, NULL, NULL)) >= 0; close(fd))
        dialled++;
    REL_CHECK(dialled == 0, "the daemon connected %d times to an unlisted address", dialled);
    close(lfd);
    rel_close(&c);
    rel_result("peer-list", "a request names an unlisted peer (token leak)",
               "Lookup and Get with peer = a TCP listener of the test (not in `peers`)",
               "Lookup %s, Get %s; connections to the listener: %d (nothing dialled, no token "
               "sent)",
               mf_status_name((mf_status_t)lc), mf_status_name((mf_status_t)gc), dialled);
    return 0;
}

/* ---- timeouts ----------------------------------------------------------------------- */

static int cmd_timeouts(int argc, char **argv)
{
    const char *unix_path = rel_opt(argc, argv, "--unix", NULL);
    if (!unix_path)
        return 2;
    rel_conn_t mute, quiet, busy, probe;
    uint64_t t_mute = 0, t_quiet = 0, waited = 0;
    REL_CHECK(rel_dial(&mute, unix_path, 200) == 0, "dial");
    REL_CHECK(rel_open(&quiet, unix_path, "quiet", NULL, 0, 2000) == 0, "quiet hello");
    REL_CHECK(rel_open(&busy, unix_path, "busy", NULL, 0, 2000) == 0, "busy hello");
    int mute_closed = closed_within(&mute, 5000, &t_mute);
    /* The busy client keeps talking past idle_timeout and must stay. */
    int busy_ok = 1;
    uint64_t t0 = mf_now_ms();
    while (mf_now_ms() - t0 < 2500) {
        Mapflow__V1__Health h = MAPFLOW__V1__HEALTH__INIT;
        ENV_INIT(env, HEALTH, health, &h);
        busy_ok &= call_code(&busy, &env, NULL, 0, MAPFLOW__V1__ENVELOPE__BODY_HEALTH_REPLY) == 0;
        usleep(250000);
    }
    waited = mf_now_ms() - t0;
    int quiet_closed = closed_within(&quiet, 5000, &t_quiet);
    t_quiet += waited;
    REL_CHECK(mute_closed && t_mute >= 200, "no-Hello connection closed: %d after %llu ms",
              mute_closed, (unsigned long long)t_mute);
    REL_CHECK(quiet_closed, "silent connection not closed after %llu ms",
              (unsigned long long)t_quiet);
    REL_CHECK(busy_ok, "a busy connection was disturbed");
    uint64_t nh = UINT64_MAX, ni = UINT64_MAX;
    if (REL_CHECK(rel_open(&probe, unix_path, "probe", NULL, 0, 2000) == 0, "probe")) {
        nh = rel_counter(&probe, "connections_closed_total{reason=\"hello_timeout\"}");
        ni = rel_counter(&probe, "connections_closed_total{reason=\"idle_timeout\"}");
        rel_close(&probe);
    }
    REL_CHECK(nh >= 1 && nh != UINT64_MAX && ni >= 1 && ni != UINT64_MAX,
              "counters hello_timeout %llu idle_timeout %llu", (unsigned long long)nh,
              (unsigned long long)ni);
    rel_close(&mute);
    rel_close(&quiet);
    rel_close(&busy);
    rel_result("idle", "connections that never send Hello, or go silent",
               "hello_timeout 500ms, idle_timeout 1s: one connection sends nothing, one "
               "sends Hello then nothing, one sends Health every 250 ms",
               "no-Hello closed after %llu ms, silent one closed within %llu ms, busy one "
               "served throughout: %s; connections_closed_total hello_timeout %llu, "
               "idle_timeout %llu",
               (unsigned long long)t_mute, (unsigned long long)t_quiet, busy_ok ? "yes" : "no",
               (unsigned long long)nh, (unsigned long long)ni);
    return 0;
}

/* ---- unsent output ----------------------------------------------------------------- */

static int cmd_unsent(int argc, char **argv)
{
    const char *unix_path = rel_opt(argc, argv, "--unix", NULL);
    long pid = rel_opt_l(argc, argv, "--pid", 0);
    if (!unix_path || pid <= 0)
        return 2;
    enum { B = 64, NB = 8, NREQ = 200 };
    uint32_t t[B * NB], layers[4] = {0, 1, 2, 3};
    rel_tokens(t, B * NB, 3301);
    rel_conn_t w, r, by;
    if (!REL_CHECK(rel_open(&w, unix_path, "hog", NULL, 0, 5000) == 0, "writer"))
        return 1;
    for (uint32_t l = 0; l < 4; l++) {
        for (uint32_t b = 0; b < NB; b++) {
            rel_row_spec_t rs = {"hog", MODEL, l, B, t, b, MF_CODEC_FP8_E4M3, 7 + b, NULL};
            size_t len;
            uint8_t *row = rel_row(&rs, &len);
            REL_CHECK(row && rel_put(&w, row, len, 0, NULL) == 0, "row %u/%u: %s", l, b, w.err);
            free(row);
        }
    }
    /* How large one reply is (read normally once). */
    mf_envelope_t *g1 = rel_get_prefix(&w, MODEL, B, layers, 4, t, B * NB, 0, NB, 0);
    size_t reply = g1 && g1->body_case == MAPFLOW__V1__ENVELOPE__BODY_GET_REPLY ? w.payload_len : 0;
    if (g1)
        mf_envelope_free(g1);
    REL_CHECK(reply > 0, "a Get copy of the context failed");
    rel_close(&w);
    long rss0 = rel_rss_anon_kb((int)pid);
    /* NREQ Get copies in one write, never read: one read of the daemon takes several
     * (~2 KiB each), so their replies (~0.5 MiB each) pass max_unsent before it can stop
     * reading. */
    if (!REL_CHECK(rel_open(&r, unix_path, "hog", NULL, 0, 5000) == 0, "reader"))
        return 1;
    Mapflow__V1__Get g = MAPFLOW__V1__GET__INIT;
    g.model = MODEL;
    g.block_size = B;
    g.n_layers = 4;
    g.layers = layers;
    uint8_t *batch = NULL;
    size_t blen = 0;
    for (int i = 0; i < NREQ; i++) {
        ENV_INIT(env, GET, get, &g);
        env.request_id = (uint64_t)i + 100;
        uint8_t *f;
        size_t flen;
        if (mf_frame_encode(&env, t, sizeof(t), MF_FRAME_DEFAULT_MAX, &f, &flen) != MF_OK)
            break;
        uint8_t *nb = realloc(batch, blen + flen);
        if (nb) {
            memcpy(nb + blen, f, flen);
            batch = nb;
            blen += flen;
        }
        free(f);
    }
    struct timeval tv = {0, 500000}; /* a send that blocks means the daemon stopped reading */
    setsockopt(r.fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    int all_sent = batch && rel_send_raw(&r, batch, blen) == 0;
    free(batch);
    uint64_t closes = 0;
    long rss1 = rel_rss_anon_kb((int)pid);
    if (REL_CHECK(rel_open(&by, unix_path, "bystander", NULL, 0, 5000) == 0, "bystander")) {
        uint64_t t0 = mf_now_ms();
        do {
            closes = rel_counter(&by, "connections_closed_total{reason=\"max_unsent\"}");
        } while ((closes == 0 || closes == UINT64_MAX) && mf_now_ms() - t0 < 5000 &&
                 !usleep(50000));
        uint32_t blocks = 0;
        REL_CHECK(rel_lookup(&by, MODEL, B, layers, 1, t, B * NB, &blocks) == 0,
                  "bystander lookup");
        rel_close(&by);
    }
    REL_CHECK(closes >= 1 && closes != UINT64_MAX, "max_unsent closes: %llu",
              (unsigned long long)closes);
    rel_close(&r);
    rel_result("unsent", "client never reads its replies (max_unsent)",
               "max_frame 1mb, max_unsent 2mb: 200 Get copies of a context (4 layers x 8 FP8 "
               "rows, B = 64) written at once, never read",
               "replies of %zu KiB each; the connection was closed past max_unsent "
               "(connections_closed_total{reason=\"max_unsent\"} %llu; all 200 requests "
               "taken: %s); RssAnon %+ld kB; bystander served",
               reply / 1024, (unsigned long long)closes, all_sent ? "yes" : "no",
               rss1 >= 0 && rss0 >= 0 ? rss1 - rss0 : 0);
    return 0;
}

/* ---- reservation quota ------------------------------------------------------------- */

static int cmd_quota(int argc, char **argv)
{
    const char *unix_path = rel_opt(argc, argv, "--unix", NULL);
    long arena = rel_opt_l(argc, argv, "--host-bytes", 0);
    if (!unix_path || arena <= 0)
        return 2;
    enum { B = 64 };
    rel_conn_t hog, other;
    if (!REL_CHECK(rel_open(&hog, unix_path, "hog", NULL, 0, 5000) == 0, "hog"))
        return 1;
    uint64_t reserved = 0;
    int n = 0, rc = 0;
    size_t len = 0;
    char why[160] = "";
    for (; n < 10000; n++) {
        uint32_t t[B];
        rel_tokens(t, B, 9000 + (uint64_t)n);
        rel_row_spec_t rs = {"hog", MODEL, 0, B, t, 0, MF_CODEC_FP8_E4M3, (unsigned)n, NULL};
        uint64_t rid;
        uint8_t *row = rel_row(&rs, &len);
        rc = row ? rel_put_begin(&hog, row, len, &rid) : -1;
        free(row);
        if (rc != 0)
            break;
        reserved += len;
    }
    snprintf(why, sizeof(why), "%s", hog.err);
    REL_CHECK(rc == MF_RESOURCE_EXHAUSTED && strstr(why, "quota"), "hog stopped with %d (%s)",
              rc, why);
    REL_CHECK(reserved <= (uint64_t)arena / 2, "hog reserved %llu of %ld bytes",
              (unsigned long long)reserved, arena);
    int ok = 0;
    if (REL_CHECK(rel_open(&other, unix_path, "other", NULL, 0, 5000) == 0, "other")) {
        uint32_t t[B * 4];
        rel_tokens(t, B * 4, 4242);
        ok = put_rows(&other, "other", B, t, 4, MF_CODEC_FP8_E4M3) == 0;
        REL_CHECK(ok, "another namespace's puts while the hog holds its quota: %s", other.err);
        rel_close(&other);
    }
    rel_close(&hog);
    rel_result("quota", "one namespace reserves the whole arena",
               "host_bytes 8mb, reservation_share 0.5: 'hog' sends PutBegin and never "
               "commits, until refused; then 'other' puts",
               "hog got %d reservations of %zu KiB (%llu bytes, %.0f%% of the arena), then "
               "RESOURCE_EXHAUSTED \"%.90s...\"; other's 4/4 puts %s",
               n, len / 1024, (unsigned long long)reserved, 100.0 * (double)reserved / (double)arena,
               why, ok ? "succeeded" : "FAILED");
    return 0;
}

/* ---- lookup bounds ----------------------------------------------------------------- */

typedef struct lookup_attack {
    const char *path;
    atomic_int stop;
    uint64_t done;
} lookup_attack_t;

/* The largest Lookup max_lookup allows (64 layers x 4096 blocks), over and over. */
static void *attacker(void *arg)
{
    lookup_attack_t *a = arg;
    rel_conn_t c;
    if (rel_open(&c, a->path, "big", NULL, 0, 10000) != 0)
        return NULL;
    enum { B = 8, NB = 4096, NL = 64 };
    uint32_t *t = malloc(sizeof(uint32_t) * B * NB), layers[NL], blocks[NL];
    if (t) {
        rel_tokens(t, (size_t)B * NB, 555);
        for (uint32_t l = 0; l < NL; l++)
            layers[l] = l;
        put_rows(&c, "big", B, t, 512, MF_CODEC_MASK); /* layer 0 hits 512 blocks */
        while (!atomic_load(&a->stop) &&
               rel_lookup(&c, MODEL, B, layers, NL, t, (size_t)B * NB, blocks) == 0)
            a->done++;
    }
    free(t);
    rel_close(&c);
    return NULL;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static int cmd_lookup(int argc, char **argv)
{
    const char *unix_path = rel_opt(argc, argv, "--unix", NULL);
    if (!unix_path)
        return 2;
    rel_conn_t c;
    if (!REL_CHECK(rel_open(&c, unix_path, "big", NULL, 0, 10000) == 0, "connect"))
        return 1;
    /* 4096 layers x 256 blocks (1 M pairs), and a Get hashing 300000 blocks. */
    enum { B = 8 };
    size_t ntok = 300000u * B;
    uint32_t *t = malloc(ntok * 4), layers[4096], blocks[4096];
    if (!t)
        return 1;
    rel_tokens(t, ntok, 99);
    for (uint32_t l = 0; l < 4096; l++)
        layers[l] = l;
    int lc = rel_lookup(&c, MODEL, B, layers, 4096, t, 256 * B, blocks);
    char lwhy[160];
    snprintf(lwhy, sizeof(lwhy), "%s", c.err);
    REL_CHECK(lc == MF_INVALID_ARGUMENT && strstr(lwhy, "max_lookup"), "1 M-pair Lookup: %d (%s)",
              lc, lwhy);
    mf_envelope_t *r = rel_get_prefix(&c, MODEL, B, layers, 1, t, ntok, 299990, 1, 0);
    int gc = rel_status(r, MAPFLOW__V1__ENVELOPE__BODY_GET_REPLY, &c);
    if (r)
        mf_envelope_free(r);
    REL_CHECK(gc == MF_INVALID_ARGUMENT && strstr(c.err, "max_lookup"),
              "Get hashing 300000 blocks: %d (%s)", gc, c.err);
    free(t);
    rel_close(&c);
    /* A bystander's Health while the attacker sends the largest allowed lookups. */
    lookup_attack_t a = {unix_path, 0, 0};
    pthread_t th;
    pthread_create(&th, NULL, attacker, &a);
    rel_conn_t by;
    enum { N = 200 };
    uint64_t lat[N];
    size_t n = 0;
    if (REL_CHECK(rel_open(&by, unix_path, "bystander", NULL, 0, 5000) == 0, "bystander")) {
        usleep(300000);
        for (; n < N; n++) {
            Mapflow__V1__Health h = MAPFLOW__V1__HEALTH__INIT;
            ENV_INIT(env, HEALTH, health, &h);
            int64_t t0 = mf_now_us();
            if (call_code(&by, &env, NULL, 0, MAPFLOW__V1__ENVELOPE__BODY_HEALTH_REPLY) != 0)
                break;
            lat[n] = (uint64_t)(mf_now_us() - t0);
            usleep(2000);
        }
        rel_close(&by);
    }
    atomic_store(&a.stop, 1);
    pthread_join(th, NULL);
    REL_CHECK(n == N, "bystander Health %zu/%d", n, N);
    REL_CHECK(a.done > 0, "the attacker's lookups were not served");
    qsort(lat, n, sizeof(lat[0]), cmp_u64);
    rel_result("lookup-size", "one client's huge lookups (loop time)",
               "Lookup of 4096 layers x 256 blocks, Get hashing 300000 blocks; then one "
               "client loops the largest allowed Lookup (64 layers x 4096 blocks, layer 0 "
               "cached for 512) while a bystander sends 200 Health",
               "both refused INVALID_ARGUMENT (max_lookup 262144); %llu large lookups served "
               "meanwhile; bystander Health p50 %.2f ms, p99 %.2f ms",
               (unsigned long long)a.done, n ? (double)lat[n / 2] / 1000.0 : 0.0,
               n ? (double)lat[n * 99 / 100] / 1000.0 : 0.0);
    return 0;
}

/* ---- names ------------------------------------------------------------------------- */

/* A Hello frame made by hand: protobuf-c cannot write a NUL inside a string. */
static size_t raw_hello(uint8_t *f, const char *ns, size_t nsl, const char *tok, size_t tl)
{
    uint8_t h[512];
    size_t n = 0;
    h[n++] = 0x08, h[n++] = 1;                       /* protocol_version = 1 */
    h[n++] = 0x12, h[n++] = (uint8_t)nsl;            /* namespace */
    memcpy(h + n, ns, nsl), n += nsl;
    if (tok) {
        h[n++] = 0x1a, h[n++] = (uint8_t)tl;         /* token */
        memcpy(h + n, tok, tl), n += tl;
    }
    size_t m = 8;
    f[m++] = 0x08, f[m++] = 1;                       /* request_id = 1 */
    f[m++] = 0x52, f[m++] = (uint8_t)n;              /* Envelope.hello (field 10) */
    memcpy(f + m, h, n), m += n;
    uint32_t mlen = (uint32_t)(m - 8), flen = mlen + 4;
    memcpy(f, &flen, 4);
    memcpy(f + 4, &mlen, 4);
    return m;
}

/* Sends a raw Hello; returns the ErrorReply code (0 = accepted, -1 = none) and whether the
 * daemon then closed the connection. */
static int raw_hello_code(const char *target, const char *ns, size_t nsl, const char *tok,
                          size_t tl, int *closed)
{
    rel_conn_t c;
    if (rel_dial(&c, target, 3000) != 0)
        return -1;
    uint8_t f[600];
    size_t len = raw_hello(f, ns, nsl, tok, tl);
    int code = -1;
    if (rel_send_raw(&c, f, len) == 0) {
        mf_envelope_t *r = rel_recv(&c, NULL);
        code = rel_status(r, MAPFLOW__V1__ENVELOPE__BODY_HELLO_REPLY, &c);
        if (r)
            mf_envelope_free(r);
        uint64_t ms;
        if (closed)
            *closed = closed_within(&c, 2000, &ms);
    }
    rel_close(&c);
    return code;
}

static int cmd_names(int argc, char **argv)
{
    const char *unix_path = rel_opt(argc, argv, "--unix", NULL);
    const char *tcp = rel_opt(argc, argv, "--tcp", NULL);
    const char *token = rel_opt(argc, argv, "--token", NULL);
    if (!unix_path || !tcp || !token || strlen(token) > 200)
        return 2;
    char tcpt[300], tokj[256], apath[4200];
    snprintf(tcpt, sizeof(tcpt), "tcp:%s", tcp);
    admin_path(unix_path, apath, sizeof(apath));
    int held = 0, tried = 0, cl = 0;
    tried++;
    held += REL_CHECK(raw_hello_code(unix_path, "ab\0cd", 5, NULL, 0, &cl) == MF_INVALID_ARGUMENT
                      && cl, "namespace ab\\0cd not refused and closed");
    tried++;
    held += REL_CHECK(raw_hello_code(unix_path, "ab", 2, NULL, 0, NULL) == 0,
                      "plain raw Hello refused");
    size_t tl = strlen(token);
    memcpy(tokj, token, tl);
    memcpy(tokj + tl, "\0junk", 5);
    tried++;
    held += REL_CHECK(raw_hello_code(tcpt, "t", 1, tokj, tl + 5, &cl) == MF_INVALID_ARGUMENT && cl,
                      "token + \\0junk accepted");
    tried++;
    held += REL_CHECK(raw_hello_code(tcpt, "t", 1, token, tl, NULL) == 0,
                      "the raw Hello with the right token was refused");
    rel_conn_t c;
    tried++;
    held += REL_CHECK(rel_open(&c, unix_path, "evil\nINFO  forged line", NULL, 0, 3000) ==
                          MF_INVALID_ARGUMENT, "namespace with \\n accepted");
    tried++;
    int lc = -1;
    if (rel_open(&c, unix_path, "names", NULL, 0, 3000) == 0) {
        uint32_t t[16], layer = 0, blocks;
        rel_tokens(t, 16, 5);
        lc = rel_lookup(&c, "model\x1b[31m", 16, &layer, 1, t, 16, &blocks);
        rel_close(&c);
    }
    held += REL_CHECK(lc == MF_INVALID_ARGUMENT, "model with ESC in a Lookup: %d", lc);
    /* Something a client chose that is logged with its control bytes: an unknown key. */
    tried++;
    int kc = -1;
    if (rel_open(&c, apath, "ops", NULL, 0, 3000) == 0) {
        kc = config_set(&c, "nokey\nINFO  forged", "1");
        rel_close(&c);
    }
    held += REL_CHECK(kc == MF_NOT_FOUND, "ConfigSet of an unknown key: %d", kc);
    rel_result("names", "NUL and control bytes in names, namespaces and tokens",
               "hand-made Hello with namespace \"ab\\0cd\", TCP token + \"\\0junk\"; namespace "
               "with \\n, model with ESC, a ConfigSet key with \\n (logged)",
               "%d/%d as expected: NUL refused INVALID_ARGUMENT and closed (not read as \"ab\" "
               "or as the token), control bytes refused, the logged key escaped (\\x0a)",
               held, tried);
    return 0;
}

/* ---- descriptor limit -------------------------------------------------------------- */

static long cpu_ticks(long pid)
{
    char p[64], buf[1024];
    snprintf(p, sizeof(p), "/proc/%ld/stat", pid);
    FILE *f = fopen(p, "r");
    if (!f)
        return -1;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *s = strrchr(buf, ')');
    unsigned long ut = 0, st = 0;
    /* state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime */
    if (!s || sscanf(s + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2)
        return -1;
    return (long)(ut + st);
}

static int cmd_fds(int argc, char **argv)
{
    const char *unix_path = rel_opt(argc, argv, "--unix", NULL);
    long pid = rel_opt_l(argc, argv, "--pid", 0);
    int want = (int)rel_opt_l(argc, argv, "--n", 80);
    if (!unix_path || pid <= 0 || want < 1 || want > 120)
        return 2;
    rel_conn_t cs[120];
    int opened = 0, served = 0;
    for (; opened < want; opened++) {
        if (rel_dial(&cs[opened], unix_path, 300) != 0)
            break;
        Mapflow__V1__Hello h = MAPFLOW__V1__HELLO__INIT;
        h.protocol_version = MF_PROTOCOL_VERSION;
        h.namespace_ = "fd";
        ENV_INIT(env, HELLO, hello, &h);
        rel_send(&cs[opened], &env, NULL, 0);
    }
    /* The HTTP listener too (libevent's own accept loop would spin there). */
    long http_port = rel_opt_l(argc, argv, "--http-port", 0);
    rel_conn_t hc = {.fd = -1};
    char hp[64];
    snprintf(hp, sizeof(hp), "tcp:127.0.0.1:%ld", http_port);
    int http_dialled = http_port > 0 && rel_dial(&hc, hp, 300) == 0;
    long c0 = cpu_ticks(pid);
    usleep(1000000);
    long c1 = cpu_ticks(pid);
    if (http_dialled)
        rel_close(&hc);
    for (int i = 0; i < opened; i++) {
        mf_envelope_t *r = rel_recv(&cs[i], NULL);
        served += r && r->body_case == MAPFLOW__V1__ENVELOPE__BODY_HELLO_REPLY;
        if (r)
            mf_envelope_free(r);
    }
    long hz = sysconf(_SC_CLK_TCK);
    double cpu_s = c0 >= 0 && c1 >= 0 ? (double)(c1 - c0) / (double)hz : -1;
    REL_CHECK(served > 0 && served < opened, "%d of %d connections served (want some, not all)",
              served, opened);
    REL_CHECK(cpu_s >= 0 && cpu_s < 0.5, "daemon used %.2f s CPU in 1 s at the limit", cpu_s);
    for (int i = 0; i < opened; i++)
        rel_close(&cs[i]);
    rel_conn_t by;
    uint64_t t0 = mf_now_ms(), paused = UINT64_MAX;
    int ok = -1;
    while (ok != 0 && mf_now_ms() - t0 < 5000) {
        ok = rel_open(&by, unix_path, "bystander", NULL, 0, 1000);
        if (ok != 0)
            usleep(50000);
    }
    uint64_t wait_ms = mf_now_ms() - t0;
    if (REL_CHECK(ok == 0, "no connection after the others closed")) {
        paused = rel_counter(&by, "accept_paused_total");
        rel_close(&by);
    }
    REL_CHECK(paused >= 1 && paused != UINT64_MAX, "accept_paused_total %llu",
              (unsigned long long)paused);
    rel_result("fd-limit", "clients exhaust the descriptor limit",
               "mapflowd under ulimit -n 48 (soft = hard), ssd off; 80 connections send "
               "Hello, one more dials the HTTP port; then all close and a bystander connects",
               "%d opened, %d served, the rest waited in the backlog; daemon CPU %.2f s in 1 s at the limit "
               "(no accept spin); accept_paused_total %llu; bystander connected %llu ms after "
               "the close",
               opened, served, cpu_s, (unsigned long long)paused, (unsigned long long)wait_ms);
    return 0;
}

int rel_cmd_admin(const char *which, int argc, char **argv)
{
    if (strcmp(which, "roles") == 0)
        return cmd_roles(argc, argv);
    if (strcmp(which, "peers") == 0)
        return cmd_peers(argc, argv);
    if (strcmp(which, "timeouts") == 0)
        return cmd_timeouts(argc, argv);
    if (strcmp(which, "unsent") == 0)
        return cmd_unsent(argc, argv);
    if (strcmp(which, "quota") == 0)
        return cmd_quota(argc, argv);
    if (strcmp(which, "lookup") == 0)
        return cmd_lookup(argc, argv);
    if (strcmp(which, "names") == 0)
        return cmd_names(argc, argv);
    if (strcmp(which, "fds") == 0)
        return cmd_fds(argc, argv);
    return 2;
}
