/* rel_tool — command dispatch and the helpers every command shares (see rel_tool.h). */
#include "rel_tool.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

atomic_int rel_failures;

int rel_check(int ok, const char *file, int line, const char *fmt, ...)
{
    if (ok)
        return 1;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "CHECK FAILED %s:%d: ", file, line);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    atomic_fetch_add(&rel_failures, 1);
    return 0;
}

void rel_result(const char *id, const char *what, const char *how, const char *fmt, ...)
{
    char out[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(out, sizeof(out), fmt, ap);
    va_end(ap);
    printf("RESULT|%s|%s|%s|%s\n", id, what, how, out);
    fflush(stdout);
}

const char *rel_opt(int argc, char **argv, const char *name, const char *dflt)
{
    for (int i = 0; i + 1 < argc; i++)
        if (strcmp(argv[i], name) == 0)
            return argv[i + 1];
    return dflt;
}

long rel_opt_l(int argc, char **argv, const char *name, long dflt)
{
    const char *v = rel_opt(argc, argv, name, NULL);
    return v ? strtol(v, NULL, 10) : dflt;
}

uint64_t rel_rand(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

pid_t rel_exec_daemon(const char *bin, const char *sock, const char *data,
                      const char *const *extra, const char *log)
{
    const char *argv[64];
    int n = 0;
    argv[n++] = bin;
    argv[n++] = "--socket";
    argv[n++] = sock;
    argv[n++] = "--data_dir";
    argv[n++] = data;
    argv[n++] = "--http";
    argv[n++] = "";
    for (int i = 0; extra && extra[i] && n < 62; i++)
        argv[n++] = extra[i];
    argv[n] = NULL;
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        int fd = open(log ? log : "/dev/null", O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
            close(fd);
        }
        execv(bin, (char *const *)argv);
        _exit(127);
    }
    return pid;
}

int rel_wait_exit(pid_t pid, int timeout_ms)
{
    int64_t until = mf_now_ms() + timeout_ms;
    int status;
    while (waitpid(pid, &status, WNOHANG) != pid) {
        if (mf_now_ms() >= until) {
            kill(pid, SIGKILL);
            waitpid(pid, NULL, 0);
            return -1;
        }
        usleep(10000);
    }
    return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
}

pid_t rel_spawn_daemon(const char *bin, const char *sock, const char *data,
                       const char *const *extra, const char *log)
{
    pid_t pid = rel_exec_daemon(bin, sock, data, extra, log);
    if (pid < 0)
        return -1;
    /* Bounded wait: 20 s (a sanitizer build recovering a large RocksDB is slow). */
    int64_t until = mf_now_ms() + 20000;
    while (mf_now_ms() < until) {
        int status;
        if (waitpid(pid, &status, WNOHANG) == pid) {
            fprintf(stderr, "rel: %s exited during start (status %d)\n", bin, status);
            return -1;
        }
        rel_conn_t c;
        if (rel_open(&c, sock, "probe", NULL, 0, 2000) == 0) {
            rel_close(&c);
            return pid;
        }
        usleep(10000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    fprintf(stderr, "rel: %s did not come up on %s\n", bin, sock);
    return -1;
}

int rel_stop_daemon(pid_t pid, int sig)
{
    int status = 0;
    kill(pid, sig);
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    if (WIFSIGNALED(status))
        return 128 + WTERMSIG(status);
    return WEXITSTATUS(status);
}

static int usage(void)
{
    fprintf(stderr,
            "usage: rel_tool crash --mapflowd BIN --dir DIR [--cycles N] [--seed S]\n"
            "       rel_tool load --target T [--clients N] [--seconds S] [--seed S]\n"
            "       rel_tool fault-arena|fault-slow-reader|fault-half-frame|fault-disk-full\n"
            "                |fault-corrupt-put|fault-corrupt-check --target T [--pid PID]\n"
            "       rel_tool security --unix PATH --tcp HOST:PORT --token TOKEN\n"
            "       rel_tool storage --mapflowd BIN --dir DIR [--part ssd-open|collision|"
            "durable-full] [--asan BIN]\n"
            "       rel_tool admin-roles|admin-names --unix PATH --tcp HOST:PORT --token T\n"
            "                [--admin-token A]\n"
            "       rel_tool admin-peers|admin-timeouts|admin-lookup --unix PATH\n"
            "       rel_tool admin-unsent|admin-fds --unix PATH --pid PID [--n N]\n"
            "       rel_tool admin-quota --unix PATH --host-bytes N\n");
    return 2;
}

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc < 2)
        return usage();
    const char *cmd = argv[1];
    int rc;
    if (strcmp(cmd, "crash") == 0)
        rc = rel_cmd_crash(argc - 2, argv + 2);
    else if (strcmp(cmd, "load") == 0)
        rc = rel_cmd_load(argc - 2, argv + 2);
    else if (strncmp(cmd, "fault-", 6) == 0)
        rc = rel_cmd_fault(cmd + 6, argc - 2, argv + 2);
    else if (strcmp(cmd, "security") == 0)
        rc = rel_cmd_security(argc - 2, argv + 2);
    else if (strcmp(cmd, "storage") == 0)
        rc = rel_cmd_storage(argc - 2, argv + 2);
    else if (strncmp(cmd, "admin-", 6) == 0)
        rc = rel_cmd_admin(cmd + 6, argc - 2, argv + 2);
    else
        return usage();
    int fails = atomic_load(&rel_failures);
    if (rc == 2)
        return usage();
    printf("rel_tool %s: %s (%d failed checks)\n", cmd, rc == 0 && fails == 0 ? "ok" : "FAILED",
           fails);
    return rc == 0 && fails == 0 ? 0 : 1;
}
