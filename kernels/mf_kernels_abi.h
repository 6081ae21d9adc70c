/*
 * mf_kernels_abi — mf_kernels_abi_layout(): the sizes and member offsets of the argument
 * structs of mapflow_kernels.h and mapflow_kernels_cuda.h, in mf_abi_layout()'s format
 * (client/mapflow.h), for bindings that mirror them (client/python/mapflow/kernels.py
 * checks its ctypes mirror against this when it loads libmfkernels_ref.so or
 * libmfkernels_cuda.so; both carry it). Static data, any thread.
 */
#ifndef MF_KERNELS_ABI_H
#define MF_KERNELS_ABI_H

#include <stddef.h>

#include "mapflow.h"

#ifdef __cplusplus
extern "C" {
#endif

const mf_abi_field_t *mf_kernels_abi_layout(size_t *n);

#ifdef __cplusplus
}
#endif
#endif /* MF_KERNELS_ABI_H */
