/*
 * abi — mf_abi_layout(): the sizes and member offsets of the public structs of
 * mapflow.h and the proto/ headers it re-exports, for bindings that mirror them
 * (client/python/mapflow checks its ctypes mirror against this at import). Static data,
 * any thread. A struct member added to a header but not here still changes the struct's
 * own size entry, so a binding that has not caught up is refused either way.
 */
#include <stddef.h>

#include "mapflow.h"

#define T_(T) {#T, "", 0, (uint32_t)sizeof(T)}
#define M_(T, m) {#T, #m, (uint32_t)offsetof(T, m), (uint32_t)sizeof(((T *)0)->m)}

static const mf_abi_field_t layout[] = {
    T_(mf_status_t), T_(mf_tier_t), T_(mf_codec_t), T_(mf_verify_t), T_(mf_get_mode_t),
    T_(mf_cq_event_type_t),
    T_(mf_abi_field_t), M_(mf_abi_field_t, type), M_(mf_abi_field_t, member),
    M_(mf_abi_field_t, offset), M_(mf_abi_field_t, size),
    T_(mf_hash128_t), M_(mf_hash128_t, lo), M_(mf_hash128_t, hi),
    T_(mf_row_view_t), M_(mf_row_view_t, base), M_(mf_row_view_t, size),
    M_(mf_row_view_t, codec), M_(mf_row_view_t, layer), M_(mf_row_view_t, block_index),
    M_(mf_row_view_t, block_size), M_(mf_row_view_t, n_heads), M_(mf_row_view_t, n_cols),
    M_(mf_row_view_t, n_entries), M_(mf_row_view_t, top_p), M_(mf_row_view_t, model),
    M_(mf_row_view_t, model_len), M_(mf_row_view_t, parent), M_(mf_row_view_t, hash),
    M_(mf_row_view_t, tokens), M_(mf_row_view_t, cols), M_(mf_row_view_t, col_off),
    M_(mf_row_view_t, head_mask), M_(mf_row_view_t, mass), M_(mf_row_view_t, scales),
    M_(mf_row_view_t, tiles), M_(mf_row_view_t, tile_bytes),
    T_(mf_retry_policy_t), M_(mf_retry_policy_t, max_retries),
    M_(mf_retry_policy_t, initial_backoff_ms), M_(mf_retry_policy_t, max_backoff_ms),
    M_(mf_retry_policy_t, multiplier), M_(mf_retry_policy_t, jitter),
    T_(mf_channel_params_t), M_(mf_channel_params_t, field_mask), M_(mf_channel_params_t, ns),
    M_(mf_channel_params_t, token), M_(mf_channel_params_t, client_name),
    M_(mf_channel_params_t, want_arena), M_(mf_channel_params_t, timeout_ms),
    M_(mf_channel_params_t, max_frame), M_(mf_channel_params_t, retry),
    M_(mf_channel_params_t, verify), M_(mf_channel_params_t, gpu_device),
    M_(mf_channel_params_t, admin_token),
    T_(mf_server_info_t), M_(mf_server_info_t, daemon_version),
    M_(mf_server_info_t, session_id), M_(mf_server_info_t, host_arena_bytes),
    M_(mf_server_info_t, max_frame), M_(mf_server_info_t, max_batch),
    M_(mf_server_info_t, gpu_tier), M_(mf_server_info_t, connected),
    M_(mf_server_info_t, reconnects), M_(mf_server_info_t, in_flight),
    T_(mf_gpu_arena_info_t), M_(mf_gpu_arena_info_t, index), M_(mf_gpu_arena_info_t, bytes),
    M_(mf_gpu_arena_info_t, mapped), M_(mf_gpu_arena_info_t, device),
    M_(mf_gpu_arena_info_t, peer), M_(mf_gpu_arena_info_t, pci_bus_id),
    M_(mf_gpu_arena_info_t, why),
    T_(mf_gpu_info_t), M_(mf_gpu_info_t, gpu_device), M_(mf_gpu_info_t, driver),
    M_(mf_gpu_info_t, why), M_(mf_gpu_info_t, n_announced), M_(mf_gpu_info_t, n_mapped),
    M_(mf_gpu_info_t, n_peer), M_(mf_gpu_info_t, arenas), M_(mf_gpu_info_t, host_arena_pinned),
    T_(mf_key_t), M_(mf_key_t, model), M_(mf_key_t, layer), M_(mf_key_t, hash),
    T_(mf_cq_event_t), M_(mf_cq_event_t, type), M_(mf_cq_event_t, tag),
    M_(mf_cq_event_t, status), M_(mf_cq_event_t, message),
    T_(mf_put_result_t), M_(mf_put_result_t, tier), M_(mf_put_result_t, durable),
    M_(mf_put_result_t, replaced),
    T_(mf_put_item_t), M_(mf_put_item_t, row), M_(mf_put_item_t, len),
    M_(mf_put_item_t, status), M_(mf_put_item_t, result),
    T_(mf_put_region_params_t), M_(mf_put_region_params_t, field_mask),
    M_(mf_put_region_params_t, gpu_arena), M_(mf_put_region_params_t, capacities),
    T_(mf_put_region_result_t), M_(mf_put_region_result_t, committed),
    M_(mf_put_region_result_t, replaced), M_(mf_put_region_result_t, first_failed),
    M_(mf_put_region_result_t, checked_on_gpu),
    T_(mf_row_ref_t), M_(mf_row_ref_t, status), M_(mf_row_ref_t, layer),
    M_(mf_row_ref_t, block), M_(mf_row_ref_t, tier), M_(mf_row_ref_t, data),
    M_(mf_row_ref_t, length), M_(mf_row_ref_t, lease_id), M_(mf_row_ref_t, view),
    M_(mf_row_ref_t, on_device), M_(mf_row_ref_t, gpu_arena),
    T_(mf_get_result_t), M_(mf_get_result_t, n_rows), M_(mf_get_result_t, rows),
    M_(mf_get_result_t, lease_ttl_ms), M_(mf_get_result_t, priv_),
    T_(mf_row_columns_t), M_(mf_row_columns_t, cap), M_(mf_row_columns_t, status),
    M_(mf_row_columns_t, layer), M_(mf_row_columns_t, block), M_(mf_row_columns_t, tier),
    M_(mf_row_columns_t, data), M_(mf_row_columns_t, length),
    M_(mf_row_columns_t, lease_id), M_(mf_row_columns_t, on_device),
    M_(mf_row_columns_t, gpu_arena),
    T_(mf_lease_t), M_(mf_lease_t, data), M_(mf_lease_t, length), M_(mf_lease_t, lease_id),
    M_(mf_lease_t, view), M_(mf_lease_t, ttl_ms), M_(mf_lease_t, on_device),
    M_(mf_lease_t, gpu_arena),
    T_(mf_entry_info_t), M_(mf_entry_info_t, model), M_(mf_entry_info_t, layer),
    M_(mf_entry_info_t, hash), M_(mf_entry_info_t, block), M_(mf_entry_info_t, size),
    M_(mf_entry_info_t, tier), M_(mf_entry_info_t, on_ssd), M_(mf_entry_info_t, pins),
    M_(mf_entry_info_t, last_access_ms),
    T_(mf_list_page_t), M_(mf_list_page_t, n_entries), M_(mf_list_page_t, entries),
    M_(mf_list_page_t, next_page_token), M_(mf_list_page_t, next_page_token_len),
    T_(mf_profile_info_t), M_(mf_profile_info_t, source_model),
    M_(mf_profile_info_t, target_model), M_(mf_profile_info_t, block_size),
    M_(mf_profile_info_t, l0), M_(mf_profile_info_t, target_layers),
    M_(mf_profile_info_t, mapped_layers), M_(mf_profile_info_t, created_by),
    M_(mf_profile_info_t, encoded_bytes),
    T_(mf_profile_page_t), M_(mf_profile_page_t, n_profiles),
    M_(mf_profile_page_t, profiles), M_(mf_profile_page_t, next_page_token),
    M_(mf_profile_page_t, next_page_token_len),
    T_(mf_tier_stats_t), M_(mf_tier_stats_t, tier), M_(mf_tier_stats_t, enabled),
    M_(mf_tier_stats_t, used_bytes), M_(mf_tier_stats_t, capacity_bytes),
    M_(mf_tier_stats_t, entries), M_(mf_tier_stats_t, why_off),
    T_(mf_counter_t), M_(mf_counter_t, name), M_(mf_counter_t, value),
    T_(mf_stats_t), M_(mf_stats_t, n_tiers), M_(mf_stats_t, tiers),
    M_(mf_stats_t, n_counters), M_(mf_stats_t, counters), M_(mf_stats_t, uptime_ms),
    M_(mf_stats_t, connections),
    T_(mf_config_item_t), M_(mf_config_item_t, key), M_(mf_config_item_t, value),
    M_(mf_config_item_t, live),
    T_(mf_health_t), M_(mf_health_t, ok), M_(mf_health_t, ready), M_(mf_health_t, status),
    M_(mf_health_t, n_tiers), M_(mf_health_t, tiers),
};

MF_EXPORT const mf_abi_field_t *mf_abi_layout(size_t *n)
{
    if (n)
        *n = sizeof(layout) / sizeof(layout[0]);
    return layout;
}
