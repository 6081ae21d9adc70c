/*
 * rel_load — `--clients` concurrent connections (one thread each) doing a mixed put /
 * lookup / get (copy) / get (lease) + release workload on shared contexts for
 * `--seconds`. Every row read back is checked by the client (checksum, tokens, parent,
 * hash); the only error status allowed is RESOURCE_EXHAUSTED. Prints per-op counts.
 * `--flush 1` flushes every namespace at the end (memory comparisons without the rows).
 */
#include "rel_tool.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define B 16
#define NBLK 4
#define NCTX 48
#define NNS 8
#define MODEL "load-model"

enum { OP_PUT, OP_LOOKUP, OP_GET, OP_LEASE, OP_N };
static const char *const op_names[OP_N] = {"put", "lookup", "get", "lease+release"};

typedef struct load {
    const char *target;
    uint64_t seed;
    int64_t deadline;          /* mf_now_ms */
    atomic_ulong ops[OP_N], exhausted, other_err, rows_checked, io_fail, connected;
} load_t;

typedef struct client {
    load_t *ld;
    int idx;
} client_t;

static void ctx_tokens(uint64_t seed, int ctx, uint32_t *t)
{
    rel_tokens(t, NBLK * B, seed * 7919u + (uint64_t)ctx);
}

/* 0 ok, 1 allowed (RESOURCE_EXHAUSTED), -1 I/O, -2 unexpected error. */
static int classify(load_t *ld, int rc, int op, const rel_conn_t *c)
{
    if (rc == 0)
        return 0;
    if (rc == MF_RESOURCE_EXHAUSTED) {
        atomic_fetch_add(&ld->exhausted, 1);
        return 1;
    }
    if (rc < 0) {
        atomic_fetch_add(&ld->io_fail, 1);
        return -1;
    }
    atomic_fetch_add(&ld->other_err, 1);
    REL_CHECK(0, "%s: unexpected %s: %s", op_names[op], mf_status_name((mf_status_t)rc), c->err);
    return -2;
}

/* Checks each OK row of a GetReply (copy: in the payload; lease: in the arena). */
static int check_rows(load_t *ld, rel_conn_t *c, const mf_envelope_t *r, const char *ns,
                      const uint32_t *t, const uint32_t *layers, int lease, uint64_t *ids,
                      size_t *n_ids)
{
    for (size_t i = 0; i < r->get_reply->n_rows; i++) {
        const Mapflow__V1__RowRef *ref = r->get_reply->rows[i];
        if (ref->status == MF_NOT_FOUND || ref->status == MF_RESOURCE_EXHAUSTED)
            continue;
        if (!REL_CHECK(ref->status == MF_OK, "get row status %s",
                       mf_status_name((mf_status_t)ref->status)))
            return -2;
        const uint8_t *row = lease ? c->arena + ref->arena_offset
                                   : c->payload + ref->payload_offset;
        size_t limit = lease ? c->arena_len : c->payload_len;
        size_t at = lease ? ref->arena_offset : ref->payload_offset;
        const char *why = "outside the buffer";
        if (!REL_CHECK(at + ref->length <= limit &&
                           rel_row_check(row, ref->length, ns, MODEL, layers[i / NBLK], B, t,
                                         (uint32_t)(i % NBLK), &why) == 0,
                       "row layer %u block %u read back bad: %s", ref->layer, ref->block, why))
            return -2;
        atomic_fetch_add(&ld->rows_checked, 1);
        if (lease)
            ids[(*n_ids)++] = ref->lease_id;
    }
    return 0;
}

static void *client_main(void *arg)
{
    client_t *cl = arg;
    load_t *ld = cl->ld;
    uint64_t rng = ld->seed * 1315423911u + (uint64_t)cl->idx;
    char ns[16];
    snprintf(ns, sizeof(ns), "load%d", cl->idx % NNS);
    int arena = cl->idx % 2;
    rel_conn_t c;
    int rc = -1;
    for (int tries = 0; tries < 50 && rc != 0; tries++) /* the accept backlog may be full */
        if ((rc = rel_open(&c, ld->target, ns, NULL, arena, 20000)) != 0)
            usleep(20000);
    if (!REL_CHECK(rc == 0, "client %d cannot connect (%d)", cl->idx, rc))
        return NULL;
    atomic_fetch_add(&ld->connected, 1);
    uint32_t t[NBLK * B], layers[2] = {0, 1};
    uint64_t ids[2 * NBLK];
    while (mf_now_ms() < ld->deadline) {
        int ctx = (int)(rel_rand(&rng) % NCTX);
        ctx_tokens(ld->seed, ctx, t);
        int op = (int)(rel_rand(&rng) % OP_N);
        if (op == OP_LEASE && !arena)
            op = OP_GET;
        if (op == OP_PUT) {
            rel_row_spec_t rs = {ns, MODEL, (uint32_t)(rel_rand(&rng) % 2), B, t,
                                 (uint32_t)(rel_rand(&rng) % NBLK), MF_CODEC_MASK,
                                 (unsigned)rel_rand(&rng), NULL};
            size_t len;
            uint8_t *row = rel_row(&rs, &len);
            rc = row ? rel_put(&c, row, len, 0, NULL) : -1;
            free(row);
        } else if (op == OP_LOOKUP) {
            uint32_t blocks[2];
            rc = rel_lookup(&c, MODEL, B, layers, 2, t, NBLK * B, blocks);
        } else {
            mf_envelope_t *r = rel_get_prefix(&c, MODEL, B, layers, 2, t, NBLK * B, 0, NBLK,
                                              op == OP_LEASE);
            rc = rel_status(r, MAPFLOW__V1__ENVELOPE__BODY_GET_REPLY, &c);
            size_t n_ids = 0;
            if (rc == 0 && r->get_reply->n_rows != 2 * NBLK)
                rc = -2;
            if (rc == 0)
                rc = check_rows(ld, &c, r, ns, t, layers, op == OP_LEASE, ids, &n_ids);
            if (r)
                mf_envelope_free(r);
            if (rc == 0 && n_ids) {
                uint32_t released = 0;
                rc = rel_release(&c, ids, n_ids, &released);
                REL_CHECK(rc != 0 || released == n_ids, "released %u of %zu leases", released,
                          n_ids);
            }
        }
        atomic_fetch_add(&ld->ops[op], 1);
        if (rc != -2 && classify(ld, rc, op, &c) == -1)
            break; /* -2: a failed check, already counted */
    }
    rel_close(&c);
    return NULL;
}

int rel_cmd_load(int argc, char **argv)
{
    load_t ld = {0};
    ld.target = rel_opt(argc, argv, "--target", NULL);
    long clients = rel_opt_l(argc, argv, "--clients", 256);
    double seconds = atof(rel_opt(argc, argv, "--seconds", "3"));
    ld.seed = (uint64_t)rel_opt_l(argc, argv, "--seed", 1);
    const char *label = rel_opt(argc, argv, "--label", "load");
    if (!ld.target || clients < 1 || clients > 4096 || seconds <= 0 || seconds > 600)
        return 2;
    ld.deadline = mf_now_ms() + (int64_t)(seconds * 1000);
    pthread_t *tid = calloc((size_t)clients, sizeof(*tid));
    client_t *cl = calloc((size_t)clients, sizeof(*cl));
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setstacksize(&at, 256u << 10);
    long started = 0;
    for (long i = 0; i < clients; i++) {
        cl[i] = (client_t){&ld, (int)i};
        if (pthread_create(&tid[i], &at, client_main, &cl[i]) == 0)
            started++;
        else
            tid[i] = 0;
    }
    for (long i = 0; i < clients; i++)
        if (tid[i])
            pthread_join(tid[i], NULL);
    pthread_attr_destroy(&at);
    if (rel_opt(argc, argv, "--flush", NULL)) { /* empty the index: memory is compared bare */
        for (int n = 0; n < NNS; n++) {
            char ns[16];
            rel_conn_t c;
            snprintf(ns, sizeof(ns), "load%d", n);
            REL_CHECK(rel_open(&c, ld.target, ns, NULL, 0, 20000) == 0 && rel_flush(&c, NULL) == 0,
                      "flush of %s", ns);
            rel_close(&c);
        }
    }
    unsigned long total = 0;
    char per[256] = "";
    for (int o = 0; o < OP_N; o++) {
        unsigned long n = atomic_load(&ld.ops[o]);
        total += n;
        size_t l = strlen(per);
        snprintf(per + l, sizeof(per) - l, "%s%s %lu", l ? ", " : "", op_names[o], n);
    }
    unsigned long other = atomic_load(&ld.other_err), io = atomic_load(&ld.io_fail);
    REL_CHECK(started == clients, "%ld of %ld client threads started", started, clients);
    REL_CHECK(atomic_load(&ld.connected) == (unsigned long)clients, "%lu of %ld connected",
              atomic_load(&ld.connected), clients);
    REL_CHECK(io == 0, "%lu I/O failures (daemon closed or timed out)", io);
    REL_CHECK(total > (unsigned long)clients, "only %lu operations", total);
    printf("%s: %ld clients, %.1f s: %lu ops (%s); rows verified %lu; RESOURCE_EXHAUSTED %lu; "
           "other errors %lu; I/O failures %lu\n",
           label, clients, seconds, total, per, atomic_load(&ld.rows_checked),
           atomic_load(&ld.exhausted), other, io);
    rel_result(label, "concurrent clients (unix socket)",
               "mixed put / lookup / get copy / get lease + release, 8 namespaces",
               "%ld clients × %.0f s: %lu ops, %lu rows verified, %lu RESOURCE_EXHAUSTED, "
               "%lu other errors",
               clients, seconds, total, atomic_load(&ld.rows_checked),
               atomic_load(&ld.exhausted), other + io);
    free(tid);
    free(cl);
    return 0;
}
