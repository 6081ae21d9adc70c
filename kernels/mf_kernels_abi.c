/*
 * mf_kernels_abi — the layout table of the kernel argument structs (mf_kernels_abi.h).
 * The CUDA structs are listed too: their header needs no CUDA headers, and one table in
 * both libraries means one mirror check in the binding.
 */
#include "mf_kernels_abi.h"

#include "mapflow_kernels.h"
#include "mapflow_kernels_cuda.h"

/* The same two macros as client/abi.c: an entry for the type, one per member. */
#define T_(T) {#T, "", 0, (uint32_t)sizeof(T)}
#define M_(T, m) {#T, #m, (uint32_t)offsetof(T, m), (uint32_t)sizeof(((T *)0)->m)}

static const mf_abi_field_t layout[] = {
    T_(mf_dtype_t), T_(mf_head_mode_t), T_(mf_apply_impl_t), T_(mf_codec_t), T_(mf_status_t),
    T_(mf_qkv_t), M_(mf_qkv_t, q), M_(mf_qkv_t, k), M_(mf_qkv_t, v), M_(mf_qkv_t, dtype),
    M_(mf_qkv_t, n_tokens), M_(mf_qkv_t, n_q_heads), M_(mf_qkv_t, n_kv_heads),
    M_(mf_qkv_t, head_dim),
    T_(mf_layer_map_t), M_(mf_layer_map_t, n_target_heads),
    M_(mf_layer_map_t, n_source_heads), M_(mf_layer_map_t, w), M_(mf_layer_map_t, mode),
    M_(mf_layer_map_t, top_p),
    T_(mf_extract_args_t), M_(mf_extract_args_t, src), M_(mf_extract_args_t, lse),
    M_(mf_extract_args_t, block_size), M_(mf_extract_args_t, top_p),
    M_(mf_extract_args_t, codec), M_(mf_extract_args_t, i0), M_(mf_extract_args_t, i1),
    M_(mf_extract_args_t, model), M_(mf_extract_args_t, ns), M_(mf_extract_args_t, layer),
    M_(mf_extract_args_t, tokens), M_(mf_extract_args_t, fields),
    M_(mf_extract_args_t, sample_stride), M_(mf_extract_args_t, sample_offset),
    T_(mf_apply_args_t), M_(mf_apply_args_t, rows), M_(mf_apply_args_t, n_rows),
    M_(mf_apply_args_t, map), M_(mf_apply_args_t, tgt), M_(mf_apply_args_t, block_size),
    M_(mf_apply_args_t, exact), M_(mf_apply_args_t, exact_first),
    M_(mf_apply_args_t, exact_last), M_(mf_apply_args_t, q0), M_(mf_apply_args_t, q1),
    M_(mf_apply_args_t, o),
    T_(mf_apply_stats_t), M_(mf_apply_stats_t, exact_blocks),
    M_(mf_apply_stats_t, prob_tiles), M_(mf_apply_stats_t, mask_blocks),
    M_(mf_apply_stats_t, mask_candidates),
    T_(mf_extract_cuda_args_t), M_(mf_extract_cuda_args_t, src),
    M_(mf_extract_cuda_args_t, lse), M_(mf_extract_cuda_args_t, block_size),
    M_(mf_extract_cuda_args_t, top_p), M_(mf_extract_cuda_args_t, codec),
    M_(mf_extract_cuda_args_t, i0), M_(mf_extract_cuda_args_t, i1),
    M_(mf_extract_cuda_args_t, model), M_(mf_extract_cuda_args_t, ns),
    M_(mf_extract_cuda_args_t, layer), M_(mf_extract_cuda_args_t, tokens),
    M_(mf_extract_cuda_args_t, rows), M_(mf_extract_cuda_args_t, caps),
    M_(mf_extract_cuda_args_t, sizes), M_(mf_extract_cuda_args_t, failed_block),
    M_(mf_extract_cuda_args_t, mass_out), M_(mf_extract_cuda_args_t, fields),
    M_(mf_extract_cuda_args_t, sample_stride), M_(mf_extract_cuda_args_t, sample_offset),
    T_(mf_export_cuda_args_t), M_(mf_export_cuda_args_t, ex), M_(mf_export_cuda_args_t, o),
    M_(mf_export_cuda_args_t, lse), M_(mf_export_cuda_args_t, mass),
    M_(mf_export_cuda_args_t, scratch), M_(mf_export_cuda_args_t, scratch_bytes),
    M_(mf_export_cuda_args_t, o_dtype), M_(mf_export_cuda_args_t, rows_stream),
    T_(mf_apply_cuda_args_t), M_(mf_apply_cuda_args_t, rows),
    M_(mf_apply_cuda_args_t, n_rows), M_(mf_apply_cuda_args_t, map),
    M_(mf_apply_cuda_args_t, tgt), M_(mf_apply_cuda_args_t, block_size),
    M_(mf_apply_cuda_args_t, exact), M_(mf_apply_cuda_args_t, exact_first),
    M_(mf_apply_cuda_args_t, exact_last), M_(mf_apply_cuda_args_t, o),
    M_(mf_apply_cuda_args_t, bad_rows), M_(mf_apply_cuda_args_t, o_dtype),
};

const mf_abi_field_t *mf_kernels_abi_layout(size_t *n)
{
    if (n)
        *n = sizeof(layout) / sizeof(layout[0]);
    return layout;
}
