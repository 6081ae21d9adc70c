/*
 * gpu_util.h — what the GPU checkers (tests/gpu/gpu_check.c, ipc_check.c) share: CK(), which
 * stops a checker with status 2 (a setup error, not a failed check) on any CUDA runtime error.
 * Tools, single-threaded: exit() is theirs to call.
 */
#ifndef MF_TESTS_GPU_UTIL_H
#define MF_TESTS_GPU_UTIL_H

#include <stdio.h>
#include <stdlib.h>

#include <cuda_runtime.h>

#define CK(x)                                                                           \
    do {                                                                                \
        cudaError_t e_ = (x);                                                           \
        if (e_ != cudaSuccess) {                                                        \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x,                   \
                    cudaGetErrorString(e_));                                            \
            exit(2);                                                                    \
        }                                                                               \
    } while (0)

#endif /* MF_TESTS_GPU_UTIL_H */
