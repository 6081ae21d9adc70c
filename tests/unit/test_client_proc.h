/*
 * test_client_proc.h — a real mapflowd for the client tests (tests/unit/test_client_*.c):
 * fork/exec of $MF_MAPFLOWD or $MF_BIN/mapflowd (else next to the test binary) on a unix
 * socket and data directory in a temp dir, HTTP / TCP on 127.0.0.1:0; bounded waits for
 * it to accept a Hello and to exit; SIGTERM must give exit status 0. Header-only so each
 * test stays one .c file; single-threaded test code only.
 */
#ifndef TEST_CLIENT_PROC_H
#define TEST_CLIENT_PROC_H

#include <fcntl.h>
#include <libgen.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "mapflow.h"

static char g_mapflowd[4096];

typedef struct daemon {
    char dir[32];
    char sock[100];
    char log[128];
    char data[128];
    pid_t pid;
} daemon_t;

static inline void msleep(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static inline void dump_log(const daemon_t *d)
{
    FILE *f = fopen(d->log, "r");
    char line[512];
    fprintf(stderr, "---- %s\n", d->log);
    while (f && fgets(line, sizeof(line), f))
        fputs(line, stderr);
    if (f)
        fclose(f);
}

static inline mf_channel_t *chan(const daemon_t *d, const char *ns, int arena)
{
    char target[160];
    snprintf(target, sizeof(target), "unix:%s", d->sock);
    mf_channel_params_t p = {.field_mask = MF_CHANNEL_PARAM_NS | MF_CHANNEL_PARAM_WANT_ARENA |
                                           MF_CHANNEL_PARAM_TIMEOUT_MS,
                             .ns = ns, .want_arena = arena, .timeout_ms = 10000};
    mf_channel_t *ch = NULL;
    mf_status_t st = mf_channel_open(target, &p, &ch);
    if (st != MF_OK) {
        dump_log(d);
        fail_msg("open %s: %s: %s", target, mf_status_name(st), mf_channel_last_error(ch));
    }
    return ch;
}

/* Starts mapflowd with the test's socket / data dir and extra "--key value" args
 * (NULL-terminated); waits (bounded) until it accepts a Hello. */
static inline void daemon_start(daemon_t *d, int keep_dir, ...)
{
    if (!keep_dir) {
        snprintf(d->dir, sizeof(d->dir), "/tmp/mfit-XXXXXX");
        assert_non_null(mkdtemp(d->dir));
        snprintf(d->sock, sizeof(d->sock), "%s/d.sock", d->dir);
        snprintf(d->log, sizeof(d->log), "%s/daemon.log", d->dir);
        snprintf(d->data, sizeof(d->data), "%s/data", d->dir);
    }
    const char *argv[64] = {g_mapflowd, "--socket", d->sock, "--data_dir", d->data,
                            "--http", "127.0.0.1:0", "--log_level", "debug"};
    int n = 9;
    va_list ap;
    va_start(ap, keep_dir);
    for (const char *a; n < 62 && (a = va_arg(ap, const char *));)
        argv[n++] = a;
    va_end(ap);
    argv[n] = NULL;
    d->pid = fork();
    assert_true(d->pid >= 0);
    if (d->pid == 0) {
        int fd = open(d->log, O_WRONLY | O_CREAT | O_APPEND, 0600);
        dup2(fd, 1);
        dup2(fd, 2);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    for (int i = 0; i < 500; i++) { /* up to ~10 s */
        int status;
        if (waitpid(d->pid, &status, WNOHANG) == d->pid) {
            dump_log(d);
            fail_msg("mapflowd exited during start (status %d)", status);
        }
        char target[160];
        snprintf(target, sizeof(target), "unix:%s", d->sock);
        mf_channel_params_t p = {.field_mask = MF_CHANNEL_PARAM_TIMEOUT_MS, .timeout_ms = 1000};
        mf_channel_t *ch = NULL;
        mf_status_t st = mf_channel_open(target, &p, &ch);
        mf_channel_close(ch);
        if (st == MF_OK)
            return;
        msleep(20);
    }
    dump_log(d);
    fail_msg("mapflowd did not accept connections on %s", d->sock);
}

/* Waits for the daemon to exit (bounded), returning its wait status. */
static inline int daemon_wait(daemon_t *d)
{
    int status = -1;
    for (int i = 0; i < 1000; i++) {
        if (waitpid(d->pid, &status, WNOHANG) == d->pid)
            return status;
        msleep(10);
    }
    kill(d->pid, SIGKILL);
    waitpid(d->pid, &status, 0);
    dump_log(d);
    fail_msg("mapflowd did not exit within 10 s");
    return status;
}

/* SIGTERM must drain and exit 0. */
static inline void daemon_stop(daemon_t *d, int remove)
{
    kill(d->pid, SIGTERM);
    int status = daemon_wait(d);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        dump_log(d);
        fail_msg("mapflowd exited with status 0x%x on SIGTERM", status);
    }
    if (remove) {
        char cmd[160];
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", d->dir);
        assert_int_equal(system(cmd), 0);
    }
}

/* Port the daemon logged for a listener of this kind ("http" or "tcp"). */
static inline int log_port(const daemon_t *d, const char *kind)
{
    FILE *f = fopen(d->log, "r");
    char line[512];
    int port = -1;
    while (f && fgets(line, sizeof(line), f)) {
        const char *a = strstr(line, "127.0.0.1:");
        int is_http = strstr(line, "http") != NULL;
        if (!a || (strcmp(kind, "http") == 0) != is_http || !strstr(line, kind))
            continue;
        port = atoi(a + 10);
    }
    if (f)
        fclose(f);
    return port;
}

/* Resolves the daemon binary (call first in main). */
static inline void tp_find_mapflowd(const char *argv0)
{
    const char *env = getenv("MF_MAPFLOWD");
    const char *bin = getenv("MF_BIN");
    if (env && env[0])
        snprintf(g_mapflowd, sizeof(g_mapflowd), "%s", env);
    else if (bin && bin[0])
        snprintf(g_mapflowd, sizeof(g_mapflowd), "%s/mapflowd", bin);
    else { /* build/bin/tests/test_x → build/bin/mapflowd */
        char *d = strdup(argv0);
        snprintf(g_mapflowd, sizeof(g_mapflowd), "%s/../mapflowd", d ? dirname(d) : ".");
        free(d);
    }
}

#endif /* TEST_CLIENT_PROC_H */
