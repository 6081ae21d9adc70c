/*
 * test_daemon_gpu_driver — proto/mf_cudrv (the dlopen'ed driver table) against the fake
 * driver (tests/fakecuda): a missing library is UNAVAILABLE with a reason; allocation and
 * copies move random bytes exactly and refuse ranges outside an allocation; an IPC handle
 * opened in a forked child maps the parent's bytes (both directions), is refused in the
 * exporting process (as CUDA does); FAKECUDA_NO_PEER makes another device's handle fail
 * with PEER_ACCESS_UNSUPPORTED while the same device still opens it.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include "../fakecuda/fakecuda_env.h"
#include "mf_cudrv.h"

#define N (256u << 10)

static const mf_cudrv_t *cu;

static void fill(uint8_t *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)(rand_r(&seed) >> 3);
}

/* Runs fn in a child; its exit status (0 = pass). */
static int in_child(int (*fn)(void *), void *arg)
{
    pid_t pid = fork();
    if (pid == 0)
        _exit(fn(arg));
    int st = 0;
    if (pid < 0 || waitpid(pid, &st, 0) != pid)
        return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 100;
}

static int child_missing(void *arg)
{
    (void)arg;
    setenv("MF_CUDA_DRIVER", "/nonexistent/libcuda.so.1", 1);
    const mf_cudrv_t *t = (const mf_cudrv_t *)1;
    const char *why = NULL;
    if (mf_cudrv_get(&t, &why) != MF_UNAVAILABLE || t != NULL || !why)
        return 1;
    return strstr(why, "no CUDA driver") ? 0 : 2;
}

/* First: the process has not loaded any driver yet, so the child starts clean. */
static void test_missing_driver(void **state)
{
    (void)state;
    assert_int_equal(in_child(child_missing, NULL), 0);
}

static void test_load_alloc_copy(void **state)
{
    (void)state;
    assert_int_equal(fakecuda_use(2, 0), 0);
    const char *why = NULL;
    assert_int_equal(mf_cudrv_get(&cu, &why), MF_OK);
    int n = 0;
    assert_int_equal(cu->cuDeviceGetCount(&n), 0);
    assert_int_equal(n, 2);
    char bus0[32], bus1[32];
    mf_cu_uuid_t u0, u1;
    assert_int_equal(cu->cuDeviceGetPCIBusId(bus0, sizeof(bus0), 0), 0);
    assert_int_equal(cu->cuDeviceGetPCIBusId(bus1, sizeof(bus1), 1), 0);
    assert_string_not_equal(bus0, bus1);
    assert_int_equal(cu->cuDeviceGetUuid(&u0, 0), 0);
    assert_int_equal(cu->cuDeviceGetUuid(&u1, 1), 0);
    assert_memory_not_equal(u0.bytes, u1.bytes, 16);

    mf_cu_deviceptr_t d;
    /* No context current yet: memory calls fail as on CUDA. */
    assert_int_equal(cu->cuMemAlloc(&d, N), MF_CUDA_ERROR_INVALID_CONTEXT);
    mf_cu_context_t ctx;
    assert_int_equal(cu->cuDevicePrimaryCtxRetain(&ctx, 0), 0);
    assert_int_equal(cu->cuCtxSetCurrent(ctx), 0);
    assert_int_equal(cu->cuMemAlloc(&d, N), 0);
    size_t fr, tot;
    assert_int_equal(cu->cuMemGetInfo(&fr, &tot), 0);
    assert_int_equal(tot - fr, N);

    uint8_t *src = malloc(N), *dst = malloc(N);
    fill(src, N, 7);
    assert_int_equal(cu->cuMemcpyHtoD(d, src, N), 0);
    assert_int_equal(cu->cuMemcpyDtoD(d + 4096, d, 8192), 0);
    assert_int_equal(cu->cuMemcpyDtoH(dst, d, N), 0);
    assert_memory_equal(dst, src, 4096);
    assert_memory_equal(dst + 4096, src, 8192);
    assert_memory_equal(dst + 12288, src + 12288, N - 12288);
    /* One byte past the allocation is refused, not copied. */
    assert_int_equal(cu->cuMemcpyHtoD(d + 1, src, N), MF_CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cu->cuMemcpyDtoH(dst, d + N - 8, 16), MF_CUDA_ERROR_INVALID_VALUE);
    int ord = -1;
    assert_int_equal(cu->cuPointerGetAttribute(&ord, MF_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                               d + 100), 0);
    assert_int_equal(ord, 0);
    assert_true(strstr(mf_cudrv_strerror(MF_CUDA_ERROR_OUT_OF_MEMORY), "out of memory"));
    assert_int_equal(cu->cuMemFree(d), 0);
    assert_int_equal(cu->cuMemFree(d), MF_CUDA_ERROR_INVALID_VALUE);
    free(src);
    free(dst);
}

typedef struct ipc_arg {
    mf_cu_ipc_mem_handle_t h;
    const uint8_t *want;
    int dev;            /* the child's context */
    int no_peer;
    int expect;         /* CUresult the open must give */
} ipc_arg_t;

static int child_open(void *p)
{
    ipc_arg_t *a = p;
    if (a->no_peer) {
        setenv("FAKECUDA_NO_PEER", "1", 1);
        if (cu->cuInit(0) != 0)
            return 10;
    }
    mf_cu_context_t ctx;
    if (cu->cuDevicePrimaryCtxRetain(&ctx, a->dev) || cu->cuCtxSetCurrent(ctx))
        return 11;
    int can = -1;
    cu->cuDeviceCanAccessPeer(&can, a->dev, 1 - a->dev);
    if (can != !a->no_peer)
        return 12;
    mf_cu_deviceptr_t d = 0;
    int r = cu->cuIpcOpenMemHandle(&d, a->h, MF_CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
    if (r != a->expect)
        return 13;
    if (r != 0)
        return 0;
    uint8_t *got = malloc(N);
    if (cu->cuMemcpyDtoH(got, d, N) != 0 || memcmp(got, a->want, N) != 0)
        return 14;
    /* Write back through the mapping: the exporter must see it. */
    memset(got, 0xa5, 64);
    if (cu->cuMemcpyHtoD(d + N - 64, got, 64) != 0 || cu->cuCtxSynchronize() != 0)
        return 15;
    free(got);
    return cu->cuIpcCloseMemHandle(d) == 0 ? 0 : 16;
}

static void test_ipc_fork_and_peer(void **state)
{
    (void)state;
    assert_non_null(cu);
    mf_cu_context_t ctx;
    assert_int_equal(cu->cuDevicePrimaryCtxRetain(&ctx, 0), 0);
    assert_int_equal(cu->cuCtxSetCurrent(ctx), 0);
    mf_cu_deviceptr_t d;
    assert_int_equal(cu->cuMemAlloc(&d, N), 0);
    uint8_t *src = malloc(N);
    fill(src, N, 99);
    assert_int_equal(cu->cuMemcpyHtoD(d, src, N), 0);
    /* Another process sees the bytes only after they landed (pageable HtoD returns early). */
    assert_int_equal(cu->cuCtxSynchronize(), 0);
    ipc_arg_t a = {.want = src, .dev = 0, .expect = 0};
    assert_int_equal(cu->cuIpcGetMemHandle(&a.h, d), 0);
    /* The exporting process cannot open its own handle (CUDA's rule). */
    mf_cu_deviceptr_t self;
    assert_int_equal(cu->cuIpcOpenMemHandle(&self, a.h, 1), MF_CUDA_ERROR_INVALID_CONTEXT);

    assert_int_equal(in_child(child_open, &a), 0);
    uint8_t tail[64], want[64];
    memset(want, 0xa5, 64);
    assert_int_equal(cu->cuMemcpyDtoH(tail, d + N - 64, 64), 0);
    assert_memory_equal(tail, want, 64);
    memcpy(src + N - 64, want, 64);

    /* Device 1 with peer access opens device 0's memory ... */
    a.dev = 1;
    assert_int_equal(in_child(child_open, &a), 0);
    /* ... without it, it cannot, while device 0 itself still can. */
    a.no_peer = 1;
    a.expect = MF_CUDA_ERROR_PEER_ACCESS_UNSUPPORTED;
    assert_int_equal(in_child(child_open, &a), 0);
    a.dev = 0;
    a.expect = 0;
    assert_int_equal(in_child(child_open, &a), 0);
    assert_int_equal(cu->cuMemFree(d), 0);
    free(src);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_missing_driver),
        cmocka_unit_test(test_load_alloc_copy),
        cmocka_unit_test(test_ipc_fork_and_peer),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
