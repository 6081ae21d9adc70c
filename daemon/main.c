/*
 * mapflowd — entry point: builds the config from the table (defaults, then -c FILE,
 * then --key value overrides), handles --help / --print-config / --check-config FILE /
 * --version, and runs the server until SIGTERM. Exit codes: 0 clean stop (or a valid
 * config with --check-config), 1 runtime failure, 2 usage or invalid config.
 */
#include <signal.h>
#include <sys/resource.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "log.h"
#include "server.h"

static int usage_error(const char *msg)
{
    fprintf(stderr, "mapflowd: %s (see mapflowd --help)\n", msg);
    return 2;
}

int main(int argc, char **argv)
{
    mfd_config_t cfg;
    char err[MFD_CONFIG_ERRLEN];
    const char *config_path = NULL;
    int check_only = 0;
    if (mfd_config_init(&cfg) != MF_OK) {
        fprintf(stderr, "mapflowd: out of memory\n");
        return 1;
    }
    /* Overrides are collected first so the file (wherever -c appears) never wins. */
    char **ov = calloc((size_t)argc * 2 + 2, sizeof(char *));
    size_t n_ov = 0;
    int rc = 0;
    char *owned[64];
    size_t n_owned = 0;
    if (!ov) {
        rc = 1;
        goto out;
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            mfd_config_print_help(stdout);
            goto out;
        }
        if (!strcmp(a, "--print-config")) {
            mfd_config_print_sample(stdout);
            goto out;
        }
        if (!strcmp(a, "--version")) {
            printf("mapflowd %s (protocol %u)\n", MFD_VERSION_STR, MF_PROTOCOL_VERSION);
            goto out;
        }
        if (!strcmp(a, "--check-config")) {
            /* Parse the file (and any overrides) exactly as a start would, then stop. */
            if (i + 1 >= argc) {
                rc = usage_error("--check-config needs a file");
                goto out;
            }
            config_path = argv[++i];
            check_only = 1;
            continue;
        }
        if (!strcmp(a, "-c") || !strcmp(a, "--config")) {
            if (i + 1 >= argc) {
                rc = usage_error("-c needs a file");
                goto out;
            }
            config_path = argv[++i];
            continue;
        }
        if (strncmp(a, "--", 2) != 0) {
            snprintf(err, sizeof(err), "unexpected argument '%s'", a);
            rc = usage_error(err);
            goto out;
        }
        const char *eq = strchr(a + 2, '=');
        if (eq) {
            if (n_owned == 64) {
                rc = usage_error("too many --key=value arguments");
                goto out;
            }
            char *k = strndup(a + 2, (size_t)(eq - a - 2));
            owned[n_owned++] = k;
            ov[2 * n_ov] = k;
            ov[2 * n_ov + 1] = (char *)eq + 1;
        } else {
            if (i + 1 >= argc) {
                snprintf(err, sizeof(err), "%s needs a value", a);
                rc = usage_error(err);
                goto out;
            }
            ov[2 * n_ov] = (char *)a + 2;
            ov[2 * n_ov + 1] = argv[++i];
        }
        if (mfd_config_is_live(ov[2 * n_ov]) < 0) {
            snprintf(err, sizeof(err), "unknown option --%s", ov[2 * n_ov]);
            rc = usage_error(err);
            goto out;
        }
        n_ov++;
    }
    if (config_path && mfd_config_load_file(&cfg, config_path, err, sizeof(err)) != MF_OK) {
        fprintf(stderr, "mapflowd: %s\n", err);
        rc = 2;
        goto out;
    }
    for (size_t i = 0; i < n_ov; i++) {
        if (mfd_config_set(&cfg, ov[2 * i], ov[2 * i + 1], 0, err, sizeof(err)) != MF_OK) {
            rc = usage_error(err);
            goto out;
        }
    }
    if (check_only) {
        printf("mapflowd: %s: configuration ok\n", config_path);
        goto out;
    }
    signal(SIGPIPE, SIG_IGN);
    mfd_log_init(); /* before any thread: picks journal priorities or timestamps */
    /* Each client holds a descriptor: take all the kernel allows this process, so the
     * limit an operator sets is the hard one (the daemon stops accepting there). */
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rlim_t was = rl.rlim_cur;
        rl.rlim_cur = rl.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &rl) == 0)
            mfd_info("RLIMIT_NOFILE raised from %llu to %llu", (unsigned long long)was,
                     (unsigned long long)rl.rlim_max);
    }
    mfd_server_t *srv;
    if (mfd_server_create(&cfg, config_path, ov, n_ov, &srv, err, sizeof(err)) != MF_OK) {
        mfd_error("cannot start: %s", err);
        rc = 1;
        goto out;
    }
    rc = mfd_server_run(srv) == MF_OK ? 0 : 1;
    mfd_server_destroy(srv);
out:
    for (size_t i = 0; i < n_owned; i++)
        free(owned[i]);
    free(ov);
    mfd_config_deinit(&cfg);
    return rc;
}
