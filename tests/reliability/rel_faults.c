/*
 * rel_faults — one injected fault per command, against a daemon the calling script
 * started with the configuration the fault needs. In each, a bystander client must keep
 * being served, and the fault must show up as a status and a Stats counter.
 *
 *   arena        host arena exhausted by a client holding leases, then that client is
 *                SIGKILLed (host_bytes small, ssd_bytes 0)
 *   slow-reader  a client that sends Gets and never reads the replies (max_frame 1mb)
 *   half-frame   clients that send part of a frame and sleep
 *   disk-full    durable puts into a data_dir on a small tmpfs (ENOSPC from RocksDB)
 */
#include "rel_tool.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#define MODEL "fault-model"

/* A put + get round trip of a fresh small row in `c`'s namespace; 0 when both work. */
static int bystander_op(rel_conn_t *c, const char *ns, uint64_t seed)
{
    uint32_t t[16], layer = 0;
    rel_tokens(t, 16, seed);
    rel_row_spec_t rs = {ns, MODEL, 0, 16, t, 0, MF_CODEC_MASK, (unsigned)seed, NULL};
    size_t len;
    uint8_t *row = rel_row(&rs, &len);
    int rc = row ? rel_put(c, row, len, 0, NULL) : -1;
    free(row);
    if (rc != 0)
        return rc;
    mf_envelope_t *r = rel_get_prefix(c, MODEL, 16, &layer, 1, t, 16, 0, 1, 0);
    rc = rel_status(r, MAPFLOW__V1__ENVELOPE__BODY_GET_REPLY, c);
    const char *why;
    if (rc == 0 && (r->get_reply->n_rows != 1 || r->get_reply->rows[0]->status != MF_OK ||
                    rel_row_check(c->payload, r->get_reply->rows[0]->length, ns, MODEL, 0, 16, t,
                                  0, &why) != 0))
        rc = -3;
    if (r)
        mf_envelope_free(r);
    return rc;
}

static int bystander_ops(rel_conn_t *c, const char *ns, int n, uint64_t seed)
{
    int ok = 0;
    for (int i = 0; i < n; i++)
        ok += bystander_op(c, ns, seed + (uint64_t)i) == 0;
    return ok;
}

/* ---- arena exhausted by leases; the holder is killed -------------------------------- */

static int holder(const char *target, int wfd)
{
    rel_conn_t c;
    if (rel_open(&c, target, "holder", NULL, 1, 5000) != 0)
        return 1;
    int held = 0, rc = 0, leased = 1;
    /* Leases first; once the watermark drops each new row at once (nothing else is
     * unpinned), reservations take the rest: neither can be evicted. */
    for (uint64_t ctx = 1; ctx < 4096; ctx++) {
        uint32_t t[64], layer = 0;
        rel_tokens(t, 64, 777000 + ctx);
        rel_row_spec_t rs = {"holder", MODEL, 0, 64, t, 0, MF_CODEC_FP8_E4M3, (unsigned)ctx, NULL};
        size_t len;
        uint64_t rid;
        uint8_t *row = rel_row(&rs, &len);
        rc = !row ? -1 : leased ? rel_put(&c, row, len, 0, NULL) : rel_put_begin(&c, row, len, &rid);
        free(row);
        if (rc != 0)
            break;
        if (!leased)
            continue;
        mf_envelope_t *r = rel_get_prefix(&c, MODEL, 64, &layer, 1, t, 64, 0, 1, 1);
        leased = rel_status(r, MAPFLOW__V1__ENVELOPE__BODY_GET_REPLY, &c) == 0 &&
                 r->get_reply->n_rows == 1 && r->get_reply->rows[0]->status == MF_OK;
        held += leased;
        if (r)
            mf_envelope_free(r);
    }
    /* Tell the parent how far it got, then hold the leases until killed. */
    int msg[2] = {held, rc};
    if (write(wfd, msg, sizeof(msg)) != (ssize_t)sizeof(msg))
        return 1;
    for (;;)
        pause();
}

static int fault_arena(const char *target)
{
    int p[2];
    if (pipe(p) != 0)
        return 1;
    pid_t pid = fork();
    if (pid == 0) {
        close(p[0]);
        _exit(holder(target, p[1]));
    }
    close(p[1]);
    int msg[2] = {0, 0};
    ssize_t n = read(p[0], msg, sizeof(msg));
    close(p[0]);
    if (!REL_CHECK(n == (ssize_t)sizeof(msg) && msg[0] > 0, "holder did not fill the arena")) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        return 1;
    }
    REL_CHECK(msg[1] == MF_RESOURCE_EXHAUSTED, "holder's last put ended with %d, not "
              "RESOURCE_EXHAUSTED", msg[1]);
    rel_conn_t c;
    if (!REL_CHECK(rel_open(&c, target, "bystander", NULL, 0, 5000) == 0, "bystander connect")) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        return 1;
    }
    const char *cname = "errors_total{code=\"RESOURCE_EXHAUSTED\"}";
    uint64_t before = rel_counter(&c, cname);
    uint32_t bt[64];
    rel_tokens(bt, 64, 4711);
    rel_row_spec_t brs = {"bystander", MODEL, 0, 64, bt, 0, MF_CODEC_FP8_E4M3, 9, NULL};
    size_t blen;
    uint8_t *brow = rel_row(&brs, &blen);
    int rc = brow ? rel_put(&c, brow, blen, 0, NULL) : -1;
    REL_CHECK(rc == MF_RESOURCE_EXHAUSTED, "put into a full arena: %d (%s)", rc, c.err);
    char msg_seen[160];
    snprintf(msg_seen, sizeof(msg_seen), "%s", c.err);
    uint64_t after = rel_counter(&c, cname);
    REL_CHECK(after > before && after != UINT64_MAX, "%s did not rise (%llu -> %llu)", cname,
              (unsigned long long)before, (unsigned long long)after);
    uint32_t t[16], blocks = 99, layer = 0;
    rel_tokens(t, 16, 5);
    REL_CHECK(rel_lookup(&c, MODEL, 16, &layer, 1, t, 16, &blocks) == 0 && blocks == 0,
              "lookup while the arena is full");
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    /* The holder's connection closes; its leases go; the next put can evict. */
    int polls = 0;
    for (rc = -1; rc != 0 && polls < 250; polls++) {
        rc = rel_put(&c, brow, blen, 0, NULL);
        if (rc != 0)
            usleep(20000);
    }
    free(brow);
    REL_CHECK(bystander_op(&c, "bystander", 2) == 0, "bystander put+get after the kill");
    REL_CHECK(rc == 0, "put still failing %d polls after the lease holder was killed: %d",
              polls, rc);
    rel_close(&c);
    rel_result("arena", "host arena exhausted (leases + reservations)",
               "host_bytes 1mb, ssd off; a client leases rows, then reserves until PutBegin "
               "fails; then a bystander puts",
               "bystander PutBegin: RESOURCE_EXHAUSTED \"%s\"; %s +%llu; lookups still served",
               msg_seen, cname, (unsigned long long)(after - before));
    rel_result("lease-kill", "client killed while holding leases",
               "SIGKILL the process whose leases and reservations pin the whole arena",
               "its %d leases (and reservations) were released on disconnect; the bystander's put succeeded %s",
               msg[0], polls <= 1 ? "at once" : "after the close was noticed");
    return 0;
}

/* ---- a client that never reads its replies ------------------------------------------ */

static int fault_slow_reader(const char *target, int pid)
{
    rel_conn_t w, slow, by;
    if (!REL_CHECK(rel_open(&w, target, "slow", NULL, 0, 5000) == 0 &&
                       rel_open(&slow, target, "slow", NULL, 0, 5000) == 0 &&
                       rel_open(&by, target, "bystander", NULL, 0, 5000) == 0,
                   "connect"))
        return 1;
    uint32_t t[64], layer = 0;
    rel_tokens(t, 64, 4242);
    rel_row_spec_t rs = {"slow", MODEL, 0, 64, t, 0, MF_CODEC_FP8_E4M3, 3, NULL};
    size_t len;
    uint8_t *row = rel_row(&rs, &len);
    REL_CHECK(row && rel_put(&w, row, len, 0, NULL) == 0, "put the row to read");
    free(row);
    long rss0 = rel_rss_anon_kb(pid);
    struct timeval tv = {0, 300000};
    setsockopt(slow.fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    Mapflow__V1__Get g = MAPFLOW__V1__GET__INIT;
    g.model = MODEL;
    g.block_size = 64;
    g.n_layers = 1;
    g.layers = &layer;
    g.n_blocks = 1;
    mf_envelope_t env = MAPFLOW__V1__ENVELOPE__INIT;
    env.body_case = MAPFLOW__V1__ENVELOPE__BODY_GET;
    env.get = &g;
    int sent = 0;
    for (; sent < 20000; sent++) { /* 20000 × 8.6 KiB replies = 170 MB if nothing pushed back */
        env.request_id = (uint64_t)sent + 1;
        if (rel_send(&slow, &env, t, sizeof(t)) != 0)
            break;
    }
    REL_CHECK(sent < 20000, "the daemon kept reading a client that never reads (%d requests)",
              sent);
    long rss1 = rel_rss_anon_kb(pid);
    int ok = bystander_ops(&by, "bystander", 50, 100);
    REL_CHECK(ok == 50, "bystander: %d of 50 put+get rounds while a client does not read", ok);
    long grew = rss0 >= 0 && rss1 >= 0 ? rss1 - rss0 : -1;
    REL_CHECK(grew >= 0 && grew < 64 * 1024, "daemon RssAnon grew %ld kB for the stalled client",
              grew);
    rel_close(&slow);
    ok = bystander_ops(&by, "bystander", 10, 200);
    REL_CHECK(ok == 10, "bystander after the slow reader left: %d of 10", ok);
    rel_close(&w);
    rel_close(&by);
    rel_result("slow-reader", "client stops reading its replies",
               "max_frame 1mb; one client sends 8 KiB Gets without reading; a bystander works",
               "daemon stopped reading it after %d requests (backlog > 2 × max_frame); RssAnon "
               "+%ld kB; bystander 60/60 ok",
               sent, grew);
    return 0;
}

/* ---- half a frame, then silence -------------------------------------------------------- */

static int fault_half_frame(const char *target)
{
    enum { N = 64 };
    rel_conn_t h[N], by;
    int opened = 0;
    for (int i = 0; i < N; i++) {
        if (rel_dial(&h[i], target, 300) != 0)
            break;
        opened++;
        /* i = 0: 1 MB frame announced, 100 bytes sent; others: 3 bytes of a length. */
        uint8_t hdr[8 + 100] = {0};
        uint32_t flen = i == 0 ? 1000000u : 200u;
        memcpy(hdr, &flen, 4);
        memset(hdr + 8, 0x5a, 100);
        rel_send_raw(&h[i], hdr, i == 0 ? sizeof(hdr) : 3);
    }
    REL_CHECK(opened == N, "opened %d of %d half-frame connections", opened, N);
    REL_CHECK(rel_open(&by, target, "bystander", NULL, 0, 5000) == 0, "bystander connect");
    int ok = bystander_ops(&by, "bystander", 50, 300);
    REL_CHECK(ok == 50, "bystander: %d of 50 while %d clients sit on half frames", ok, opened);
    /* The stalled client gets nothing yet (no reply, no close) ... */
    mf_envelope_t *r = rel_recv(&h[1], NULL);
    REL_CHECK(r == NULL, "a half frame got a reply");
    if (r)
        mf_envelope_free(r);
    /* ... and when its frame completes as garbage: an ErrorReply, then the close. */
    uint8_t rest[197];
    memset(rest, 0xff, sizeof(rest));
    uint8_t one = 0;
    rel_send_raw(&h[1], &one, 1);   /* last byte of frame_len (200) */
    rel_send_raw(&h[1], (uint8_t[4]){0x20, 0, 0, 0}, 4); /* msg_len 32 */
    rel_send_raw(&h[1], rest, sizeof(rest) - 1);
    struct timeval tv = {5, 0};
    setsockopt(h[1].fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    r = rel_recv(&h[1], NULL);
    int code = r && r->body_case == MAPFLOW__V1__ENVELOPE__BODY_ERROR ? (int)r->error->code : -1;
    REL_CHECK(code == MF_INVALID_ARGUMENT, "completed garbage frame: code %d", code);
    if (r)
        mf_envelope_free(r);
    for (int i = 0; i < opened; i++)
        rel_close(&h[i]);
    ok = bystander_ops(&by, "bystander", 10, 400);
    REL_CHECK(ok == 10, "bystander after the half-frame clients left: %d of 10", ok);
    rel_close(&by);
    rel_result("half-frame", "clients send half a frame and sleep",
               "64 connections: one announces a 1 MB frame and sends 100 bytes, 63 send 3 bytes "
               "of a length; a bystander works; one stalled frame is then completed with garbage",
               "bystander 60/60 ok; stalled clients get no reply and hold only their bytes; the "
               "garbage frame got ErrorReply %s and a close (stalled frames are also closed "
               "after frame_timeout, 30 s by default, longer than this test)",
               mf_status_name((mf_status_t)code));
    return 0;
}

/* ---- disk full under the SSD tier ------------------------------------------------------ */

static int fault_disk_full(const char *target)
{
    rel_conn_t a, by;
    if (!REL_CHECK(rel_open(&a, target, "filler", NULL, 0, 10000) == 0 &&
                       rel_open(&by, target, "bystander", NULL, 0, 10000) == 0,
                   "connect"))
        return 1;
    uint64_t err0 = rel_counter(&a, "ssd_errors_total");
    int rc = 0, n = 0;
    char first_err[160] = "";
    for (; n < 4000 && rc == 0; n++) {
        uint32_t t[64];
        rel_tokens(t, 64, 90000 + (uint64_t)n);
        rel_row_spec_t rs = {"filler", MODEL, 0, 64, t, 0, MF_CODEC_FP8_E4M3, (unsigned)n, NULL};
        size_t len;
        uint8_t *row = rel_row(&rs, &len);
        rc = row ? rel_put(&a, row, len, 1, NULL) : -1;
        free(row);
    }
    snprintf(first_err, sizeof(first_err), "%s", a.err);
    REL_CHECK(rc == MF_UNAVAILABLE, "durable puts into a full disk ended with %d after %d puts",
              rc, n);
    uint64_t err1 = rel_counter(&a, "ssd_errors_total");
    REL_CHECK(err1 != UINT64_MAX && err1 > err0, "ssd_errors_total did not rise");
    int ok = bystander_ops(&by, "bystander", 20, 500);
    REL_CHECK(ok == 20, "bystander (non-durable puts, gets): %d of 20 with the disk full", ok);
    rel_conn_t h;
    REL_CHECK(rel_open(&h, target, "late", NULL, 0, 5000) == 0, "new connection on a full disk");
    rel_close(&h);
    rel_close(&a);
    rel_close(&by);
    rel_result("disk-full", "SSD tier disk full (RocksDB write errors)",
               "data_dir on a small tmpfs; 8 KiB durable puts until one fails; a bystander "
               "keeps putting (non-durable) and getting",
               "durable put #%d answered UNAVAILABLE \"%s\"; ssd_errors_total +%llu; bystander "
               "20/20 ok; new connections accepted",
               n, first_err, (unsigned long long)(err1 - err0));
    return 0;
}

int rel_cmd_fault(const char *which, int argc, char **argv)
{
    const char *target = rel_opt(argc, argv, "--target", NULL);
    int pid = (int)rel_opt_l(argc, argv, "--pid", -1);
    if (!target)
        return 2;
    if (strcmp(which, "arena") == 0)
        return fault_arena(target);
    if (strcmp(which, "slow-reader") == 0)
        return fault_slow_reader(target, pid);
    if (strcmp(which, "half-frame") == 0)
        return fault_half_frame(target);
    if (strcmp(which, "disk-full") == 0)
        return fault_disk_full(target);
    return 2;
}
