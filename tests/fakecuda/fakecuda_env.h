/*
 * fakecuda_env.h — where tests find the fake CUDA driver and how they select it, so every
 * GPU-path test (daemon and client) does it the same way. Header-only.
 *
 * fakecuda_path: $MF_BUILD/lib/tests/libfakecuda.so when MF_BUILD is set (make test sets
 * it), else ../../lib/tests/libfakecuda.so next to the running test binary
 * (build/bin/tests/X → build/lib/tests). fakecuda_use: sets MF_CUDA_DRIVER (read once per
 * process by mf_cudrv, so call it before the first mf_cudrv_get) and FAKECUDA_DEVICES /
 * FAKECUDA_NO_PEER, which children (a forked mapflowd) inherit.
 */
#ifndef FAKECUDA_ENV_H
#define FAKECUDA_ENV_H

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* 0 and the absolute path in out, or -1 when the library is not there. */
static inline int fakecuda_path(char *out, size_t cap)
{
    const char *b = getenv("MF_BUILD");
    char exe[PATH_MAX];
    if (b && *b) {
        char rel[PATH_MAX];
        snprintf(rel, sizeof(rel), "%s/lib/tests/libfakecuda.so", b);
        if (!realpath(rel, exe))
            return -1;
    } else {
        ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
        if (n <= 0)
            return -1;
        exe[n] = 0;
        char *slash = strrchr(exe, '/');
        if (!slash)
            return -1;
        snprintf(slash, sizeof(exe) - (size_t)(slash - exe), "/../../lib/tests/libfakecuda.so");
        char real[PATH_MAX];
        if (!realpath(exe, real))
            return -1;
        snprintf(exe, sizeof(exe), "%s", real);
    }
    if (access(exe, R_OK) != 0)
        return -1;
    snprintf(out, cap, "%s", exe);
    return 0;
}

/* Selects the fake driver with `devices` devices (and no peer access when no_peer). */
static inline int fakecuda_use(int devices, int no_peer)
{
    char p[PATH_MAX], n[16];
    if (fakecuda_path(p, sizeof(p)) != 0)
        return -1;
    snprintf(n, sizeof(n), "%d", devices);
    setenv("MF_CUDA_DRIVER", p, 1);
    setenv("FAKECUDA_DEVICES", n, 1);
    if (no_peer)
        setenv("FAKECUDA_NO_PEER", "1", 1);
    else
        unsetenv("FAKECUDA_NO_PEER");
    return 0;
}

#endif /* FAKECUDA_ENV_H */
