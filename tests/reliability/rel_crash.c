/*
 * rel_crash — crash consistency: a bounded put/get load against a real mapflowd that is
 * SIGKILLed at a random moment, restarted and checked, `--cycles` times:
 *   - every put acknowledged as durable is present after the restart and verifies
 *     (checksum, model/layer/block, tokens, parent and hash — checked by this client);
 *   - a reservation never committed, or a commit the daemon rejected, is never visible;
 *   - a put in doubt (no reply before the kill, or acknowledged without durability) may
 *     be present or not, but if present it verifies;
 *   - no read, during the load or after a restart, returns bytes failing those checks.
 */
#include "rel_tool.h"

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define B 16
#define NBLK 2
#define MODEL "crash-model"
#define NS "crash"
#define MAX_OPS (1u << 18)
#define VERIFY_BATCH 512

enum { S_DOUBT, S_ACKED, S_UNCOMMITTED, S_REJECTED };

typedef struct op {
    uint32_t ctx;
    uint8_t block, state;
} op_t;

typedef struct crash {
    const char *sock;
    uint64_t seed;
    pthread_mutex_t mu;
    op_t *ops;
    uint32_t n_ops;
    uint32_t next_ctx;
    atomic_int stop;
    atomic_ulong reads_ok, reads_bad, rejected_ok;
} crash_t;

static void ctx_tokens(const crash_t *cr, uint32_t ctx, uint32_t *t)
{
    rel_tokens(t, NBLK * B, cr->seed * 1000003u + ctx);
}

static uint32_t add_op(crash_t *cr, uint32_t ctx, int block, int state)
{
    pthread_mutex_lock(&cr->mu);
    uint32_t i = cr->n_ops < MAX_OPS ? cr->n_ops++ : UINT32_MAX;
    if (i != UINT32_MAX)
        cr->ops[i] = (op_t){ctx, (uint8_t)block, (uint8_t)state};
    pthread_mutex_unlock(&cr->mu);
    return i;
}

static void set_state(crash_t *cr, uint32_t i, int state)
{
    pthread_mutex_lock(&cr->mu);
    cr->ops[i].state = (uint8_t)state;
    pthread_mutex_unlock(&cr->mu);
}

/* Reads one row by key (a context's block 1 may be stored without its block 0, which a
 * prefix Get would need); the client checks tokens, parent and hash. 1 = present and
 * verified, 0 = absent, -1 = I/O, -2 = bad. */
static int read_row(crash_t *cr, rel_conn_t *c, uint32_t ctx, int block)
{
    uint32_t t[NBLK * B];
    ctx_tokens(cr, ctx, t);
    mf_hash128_t parent, h;
    rel_block_hashes(NS, MODEL, B, t, (uint32_t)block, &parent, &h);
    mf_envelope_t *r = rel_get_key(c, MODEL, 0, h);
    if (rel_status(r, MAPFLOW__V1__ENVELOPE__BODY_GET_REPLY, c) != 0) {
        if (r)
            mf_envelope_free(r);
        return -1;
    }
    int rc = -2;
    const Mapflow__V1__RowRef *ref = r->get_reply->n_rows == 1 ? r->get_reply->rows[0] : NULL;
    const char *why = "no row in the reply";
    if (ref && ref->status == MF_NOT_FOUND) {
        rc = 0;
    } else if (ref && ref->status == MF_OK && ref->payload_offset + ref->length <= c->payload_len) {
        rc = rel_row_check(c->payload + ref->payload_offset, ref->length, NS, MODEL, 0, B, t,
                           (uint32_t)block, &why) == 0 ? 1 : -2;
    } else if (ref) {
        why = mf_status_name((mf_status_t)ref->status);
    }
    if (rc == -2)
        fprintf(stderr, "crash: ctx %u block %d read back bad: %s\n", ctx, block, why);
    mf_envelope_free(r);
    atomic_fetch_add(rc == -2 ? &cr->reads_bad : &cr->reads_ok, 1);
    return rc;
}

static void *worker(void *arg)
{
    crash_t *cr = arg;
    uint64_t rng = cr->seed ^ (uint64_t)(uintptr_t)pthread_self();
    rel_conn_t c;
    int arena = rel_rand(&rng) & 1;
    if (rel_open(&c, cr->sock, NS, NULL, arena, 5000) != 0)
        return NULL;
    while (!atomic_load(&cr->stop)) {
        unsigned r = (unsigned)(rel_rand(&rng) % 100);
        if (r >= 84) { /* read an acknowledged row: it must be there now */
            pthread_mutex_lock(&cr->mu);
            op_t o = {0, 0, S_DOUBT};
            for (int tries = 0; tries < 8 && cr->n_ops && o.state != S_ACKED; tries++)
                o = cr->ops[rel_rand(&rng) % cr->n_ops];
            pthread_mutex_unlock(&cr->mu);
            if (o.state != S_ACKED)
                continue;
            int rc = read_row(cr, &c, o.ctx, o.block);
            if (rc == -1)
                break;
            REL_CHECK(rc == 1, "acknowledged durable row ctx %u block %u not readable (%d)",
                      o.ctx, o.block, rc);
            continue;
        }
        pthread_mutex_lock(&cr->mu);
        uint32_t ctx = cr->next_ctx++;
        pthread_mutex_unlock(&cr->mu);
        int block = (int)(rel_rand(&rng) % NBLK);
        uint32_t t[NBLK * B];
        ctx_tokens(cr, ctx, t);
        rel_row_spec_t rs = {NS, MODEL, 0, B, t, (uint32_t)block, MF_CODEC_MASK,
                             (unsigned)rel_rand(&rng), NULL};
        size_t len;
        uint8_t *row = rel_row(&rs, &len);
        if (!row)
            break;
        int rc;
        if (r < 70) { /* put: durable (60%) or not (10%) */
            int durable = r < 60, got = 0;
            uint32_t i = add_op(cr, ctx, block, S_DOUBT);
            rc = rel_put(&c, row, len, durable, &got);
            if (rc == 0 && durable && i != UINT32_MAX) {
                REL_CHECK(got, "durable put acknowledged without durable = 1");
                set_state(cr, i, S_ACKED);
            }
        } else if (r < 78) { /* a reservation that is never committed */
            uint64_t rid;
            add_op(cr, ctx, block, S_UNCOMMITTED);
            rc = rel_put_begin(&c, row, len, &rid);
        } else { /* a corrupt row: the commit must be refused */
            row[len - 1] ^= 0x40;
            add_op(cr, ctx, block, S_REJECTED);
            rc = rel_put(&c, row, len, 1, NULL);
            if (rc > 0)
                atomic_fetch_add(&cr->rejected_ok, 1);
            REL_CHECK(rc != 0, "a corrupt row was committed");
            rc = rc > 0 ? 0 : rc;
        }
        free(row);
        if (rc < 0)
            break; /* the daemon is gone */
    }
    rel_close(&c);
    return NULL;
}

typedef struct vstats {
    uint64_t acked, acked_ok, doubt, doubt_present, absent_checked, visible_bad;
} vstats_t;

/* After a restart: every op checked, in batches of Get-by-keys (checksum by the daemon,
 * tokens / parent / hash by this client). */
static int verify_all(crash_t *cr, vstats_t *vs)
{
    rel_conn_t c;
    if (rel_open(&c, cr->sock, NS, NULL, 0, 10000) != 0)
        return -1;
    memset(vs, 0, sizeof(*vs));
    Mapflow__V1__Key keys[VERIFY_BATCH], *kp[VERIFY_BATCH];
    uint8_t hashes[VERIFY_BATCH][16];
    uint32_t toks[VERIFY_BATCH][NBLK * B];
    for (uint32_t base = 0; base < cr->n_ops; base += VERIFY_BATCH) {
        uint32_t n = cr->n_ops - base < VERIFY_BATCH ? cr->n_ops - base : VERIFY_BATCH;
        for (uint32_t k = 0; k < n; k++) {
            const op_t *o = &cr->ops[base + k];
            mf_hash128_t parent, h;
            ctx_tokens(cr, o->ctx, toks[k]);
            rel_block_hashes(NS, MODEL, B, toks[k], o->block, &parent, &h);
            mf_hash_to_le(h, hashes[k]);
            mapflow__v1__key__init(&keys[k]);
            keys[k].model = MODEL;
            keys[k].hash.data = hashes[k];
            keys[k].hash.len = 16;
            kp[k] = &keys[k];
        }
        Mapflow__V1__Get g = MAPFLOW__V1__GET__INIT;
        g.n_keys = n;
        g.keys = kp;
        mf_envelope_t env = MAPFLOW__V1__ENVELOPE__INIT;
        env.body_case = MAPFLOW__V1__ENVELOPE__BODY_GET;
        env.get = &g;
        mf_envelope_t *r = rel_call(&c, &env, NULL, 0);
        if (rel_status(r, MAPFLOW__V1__ENVELOPE__BODY_GET_REPLY, &c) != 0 ||
            r->get_reply->n_rows != n) {
            REL_CHECK(0, "verify: Get of %u keys failed: %s", n, c.err);
            if (r)
                mf_envelope_free(r);
            rel_close(&c);
            return -1;
        }
        for (uint32_t k = 0; k < n; k++) {
            const op_t *o = &cr->ops[base + k];
            const Mapflow__V1__RowRef *ref = r->get_reply->rows[k];
            const char *why = "status";
            int present = ref->status == MF_OK;
            int good = present && ref->payload_offset + ref->length <= c.payload_len &&
                       rel_row_check(c.payload + ref->payload_offset, ref->length, NS, MODEL, 0,
                                     B, toks[k], o->block, &why) == 0;
            if (ref->status != MF_OK && ref->status != MF_NOT_FOUND) {
                REL_CHECK(0, "verify: ctx %u: row status %s", o->ctx,
                          mf_status_name((mf_status_t)ref->status));
                vs->visible_bad++;
            } else if (present && !good) {
                REL_CHECK(0, "verify: ctx %u block %u: bytes fail the check: %s", o->ctx,
                          o->block, why);
                vs->visible_bad++;
            }
            switch (o->state) {
            case S_ACKED:
                vs->acked++;
                vs->acked_ok += good;
                REL_CHECK(good, "verify: durable-acknowledged ctx %u block %u is %s", o->ctx,
                          o->block, mf_status_name((mf_status_t)ref->status));
                break;
            case S_DOUBT:
                vs->doubt++;
                vs->doubt_present += good;
                break;
            default:
                vs->absent_checked++;
                REL_CHECK(!present, "verify: ctx %u (%s) is visible", o->ctx,
                          o->state == S_UNCOMMITTED ? "never committed" : "rejected");
            }
        }
        mf_envelope_free(r);
    }
    rel_close(&c);
    return 0;
}

int rel_cmd_crash(int argc, char **argv)
{
    const char *bin = rel_opt(argc, argv, "--mapflowd", NULL);
    const char *dir = rel_opt(argc, argv, "--dir", NULL);
    long cycles = rel_opt_l(argc, argv, "--cycles", 20);
    long threads = rel_opt_l(argc, argv, "--threads", 4);
    long max_ms = rel_opt_l(argc, argv, "--max-ms", 600);
    if (!bin || !dir || cycles < 1 || threads < 1 || threads > 64)
        return 2;
    crash_t cr = {0};
    char sock[512], data[512], log[512];
    snprintf(sock, sizeof(sock), "%s/d.sock", dir);
    snprintf(data, sizeof(data), "%s/data", dir);
    snprintf(log, sizeof(log), "%s/daemon.log", dir);
    cr.sock = sock;
    cr.seed = (uint64_t)rel_opt_l(argc, argv, "--seed", 1);
    cr.ops = calloc(MAX_OPS, sizeof(op_t));
    pthread_mutex_init(&cr.mu, NULL);
    uint64_t rng = cr.seed, kills = 0, t0 = mf_now_ms();
    const char *extra[] = {"--host_bytes", "32mb", "--log_level", "warn", "--write_through",
                           "async", NULL};
    vstats_t vs = {0};
    for (long cyc = 0; cyc <= cycles; cyc++) {
        pid_t pid = rel_spawn_daemon(bin, sock, data, extra, log);
        if (!REL_CHECK(pid > 0, "cycle %ld: mapflowd did not restart", cyc))
            break;
        if (verify_all(&cr, &vs) != 0) {
            rel_stop_daemon(pid, SIGKILL);
            break;
        }
        if (cyc == cycles) { /* the last restart: verified; now a clean stop */
            int rc = rel_stop_daemon(pid, SIGTERM);
            REL_CHECK(rc == 0, "final SIGTERM: exit %d", rc);
            break;
        }
        atomic_store(&cr.stop, 0);
        pthread_t tid[64];
        for (long i = 0; i < threads; i++)
            pthread_create(&tid[i], NULL, worker, &cr);
        usleep((useconds_t)(50 + rel_rand(&rng) % (uint64_t)max_ms) * 1000u);
        int rc = rel_stop_daemon(pid, SIGKILL);
        REL_CHECK(rc == 128 + SIGKILL, "cycle %ld: daemon exited %d before the kill", cyc, rc);
        kills++;
        atomic_store(&cr.stop, 1);
        for (long i = 0; i < threads; i++)
            pthread_join(tid[i], NULL);
    }
    uint64_t secs = (mf_now_ms() - t0 + 500) / 1000;
    unsigned long bad = atomic_load(&cr.reads_bad);
    REL_CHECK(bad == 0 && vs.visible_bad == 0, "%lu bad reads, %llu bad rows after restart",
              bad, (unsigned long long)vs.visible_bad);
    REL_CHECK(vs.acked > 0, "no durable put was acknowledged at all");
    printf("crash: %llu SIGKILLs in %llu s; %u ops; durable-acked %llu (%llu verified after "
           "the last restart); in doubt %llu (%llu present, all verified); uncommitted or "
           "rejected %llu (none visible); %lu reads during load (%lu bad); %lu corrupt "
           "commits refused\n",
           (unsigned long long)kills, (unsigned long long)secs, cr.n_ops,
           (unsigned long long)vs.acked, (unsigned long long)vs.acked_ok,
           (unsigned long long)vs.doubt, (unsigned long long)vs.doubt_present,
           (unsigned long long)vs.absent_checked, atomic_load(&cr.reads_ok) + bad, bad,
           atomic_load(&cr.rejected_ok));
    rel_result("crash", "SIGKILL during put/get load",
               "4 clients (durable / async puts, reservations never committed, corrupt rows, "
               "reads); kill at a random 50-" "600 ms point; restart; check every op",
               "%llu kills: %llu/%llu durable-acked rows present and verified; %llu never-"
               "committed/rejected rows invisible; %llu in-doubt (%llu present, verified); "
               "%lu bad reads",
               (unsigned long long)kills, (unsigned long long)vs.acked_ok,
               (unsigned long long)vs.acked, (unsigned long long)vs.absent_checked,
               (unsigned long long)vs.doubt, (unsigned long long)vs.doubt_present, bad);
    free(cr.ops);
    return kills == (uint64_t)cycles ? 0 : 1;
}
