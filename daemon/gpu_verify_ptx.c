/*
 * gpu_verify_ptx — the PTX of gpu_verify.cu, embedded in mapflowd at build time (daemon.mk:
 * nvcc -ptx, then .incbin of that file here; MFD_VERIFY_PTX names it). Built without nvcc,
 * there is no PTX and the GPU tier validates rows on the host.
 */
#include "tier_gpu.h"

#ifdef MFD_VERIFY_PTX
__asm__(".section .rodata\n"
        ".balign 16\n"
        ".globl mfd_verify_ptx_begin\n"
        ".hidden mfd_verify_ptx_begin\n"
        "mfd_verify_ptx_begin:\n"
        ".incbin \"" MFD_VERIFY_PTX "\"\n"
        ".globl mfd_verify_ptx_end\n"
        ".hidden mfd_verify_ptx_end\n"
        "mfd_verify_ptx_end:\n"
        ".byte 0\n" /* cuModuleLoadData reads PTX as a NUL-terminated string */
        ".previous\n");
extern const char mfd_verify_ptx_begin[], mfd_verify_ptx_end[];

const char *mfd_gpu_verify_ptx(size_t *len)
{
    *len = (size_t)(mfd_verify_ptx_end - mfd_verify_ptx_begin);
    return *len ? mfd_verify_ptx_begin : NULL;
}
#else
const char *mfd_gpu_verify_ptx(size_t *len)
{
    *len = 0;
    return NULL;
}
#endif
