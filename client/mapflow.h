/*
 * mapflow.h — libmapflow, the C client of mapflowd (DESIGN §8). Synchronous half.
 *
 * A channel is one connection to one daemon (`unix:PATH` or `tcp:HOST:PORT`), bound to
 * one namespace at open (keys of other namespaces are invisible). Every call sends one
 * request and waits for its reply until a per-call deadline; it returns an mf_status_t
 * (gRPC numbering, proto/mf_status.h) and, on failure, leaves a message readable with
 * mf_channel_last_error().
 *
 * Thread safety: an mf_channel_t may be shared by several threads. Each call holds the
 * channel's mutex for its whole exchange, so calls from different threads are serialised
 * (the async half will multiplex them by request id instead). mf_channel_close() must not
 * race with other calls on the same channel. mf_channel_last_error() returns the message
 * of the last failed call on the channel by any thread, so read it from the thread that
 * made the call before others use the channel, or copy it. Functions on result structs
 * (…_free) touch only the caller's memory.
 *
 * Ownership: the caller owns every buffer it passes. Results returned through a pointer
 * to pointer (mf_get_result_t, mf_list_page_t, mf_stats_t, config items, profiles) are
 * allocated by the library and freed by the caller with the matching …_free function.
 * Leased row views point into the daemon's host arena, mapped MAP_SHARED into this
 * process; they stay valid until released (mf_release*), until the lease expires (the
 * GetReply's lease_ttl_ms) or until the channel closes — never write through them.
 *
 * Link with -lmapflow only; this header re-exports the proto/ headers users need
 * (status codes, prefix hash, map rows).
 */
#ifndef MAPFLOW_H
#define MAPFLOW_H

#include <stddef.h>
#include <stdint.h>

#include "mf_hash.h"
#include "mf_row.h"
#include "mf_status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MF_VERSION_MAJOR 0
#define MF_VERSION_MINOR 1
#define MF_VERSION_PATCH 0
#define MF_VERSION_STRING "0.1.0"

#if defined(MF_BUILDING_LIBRARY)
#define MF_EXPORT __attribute__((visibility("default")))
#else
#define MF_EXPORT
#endif

/* Version of the library actually loaded ("MAJOR.MINOR.PATCH"). Any thread. */
MF_EXPORT const char *mf_version(void);

/* ==== channel ========================================================================= */

typedef struct mf_channel mf_channel_t;

/* Which fields of mf_channel_params_t are set (UCX style: unset fields take defaults,
 * and fields added later do not break callers built against an older header). */
enum mf_channel_param_field {
    MF_CHANNEL_PARAM_NS          = 1u << 0, /* default "default" */
    MF_CHANNEL_PARAM_TOKEN       = 1u << 1, /* default none */
    MF_CHANNEL_PARAM_CLIENT_NAME = 1u << 2, /* default "libmapflow" */
    MF_CHANNEL_PARAM_WANT_ARENA  = 1u << 3, /* default 0 */
    MF_CHANNEL_PARAM_TIMEOUT_MS  = 1u << 4, /* default 30000 */
    MF_CHANNEL_PARAM_MAX_FRAME   = 1u << 5, /* default MF_FRAME_DEFAULT_MAX (64 MiB) */
};

typedef struct mf_channel_params {
    uint64_t field_mask;
    const char *ns;          /* namespace, 1..128 bytes */
    const char *token;       /* shared secret; required by the daemon on TCP */
    const char *client_name; /* free text shown in the daemon's logs */
    int want_arena;          /* unix socket: receive and map the host arena (zero copy) */
    int64_t timeout_ms;      /* default deadline of each call, including open */
    uint32_t max_frame;      /* largest reply frame accepted */
} mf_channel_params_t;

/* Per-call deadline arguments (every call's last parameter, in milliseconds). */
#define MF_TIMEOUT_DEFAULT (-1) /* the channel's timeout_ms */
#define MF_TIMEOUT_INFINITE (-2)

/*
 * Connects, sends Hello and waits for HelloReply. target: "unix:PATH", "tcp:HOST:PORT",
 * or a bare path (taken as a unix socket). On failure *out is still set when memory
 * allowed, so mf_channel_last_error() can say why; close it with mf_channel_close().
 * UNAVAILABLE: cannot connect; UNAUTHENTICATED: token refused; INVALID_ARGUMENT: bad
 * target or params. Any thread.
 */
MF_EXPORT mf_status_t mf_channel_open(const char *target, const mf_channel_params_t *params,
                                      mf_channel_t **out);
/* Closes the connection and unmaps the arena (leased views die with it). NULL is a no-op. */
MF_EXPORT void mf_channel_close(mf_channel_t *ch);
/* Message of the last failed call ("" if none). Owned by the channel; valid until the next
 * call on it. */
MF_EXPORT const char *mf_channel_last_error(const mf_channel_t *ch);
/* 1 if the host arena is mapped (zero-copy put and leased gets are possible). */
MF_EXPORT int mf_channel_has_arena(const mf_channel_t *ch);
/* What the daemon said in HelloReply. Strings are owned by the channel. */
typedef struct mf_server_info {
    const char *daemon_version;
    uint64_t session_id;
    uint64_t host_arena_bytes;
    uint32_t max_frame;
    uint32_t max_batch;
    int gpu_tier;
} mf_server_info_t;
MF_EXPORT void mf_channel_info(const mf_channel_t *ch, mf_server_info_t *out);

/* ==== keys and rows ================================================================== */

typedef enum mf_tier {
    MF_TIER_NONE = 0,
    MF_TIER_GPU = 1,
    MF_TIER_HOST = 2,
    MF_TIER_SSD = 3,
} mf_tier_t;

/* "none", "gpu", "host", "ssd"; mf_tier_parse accepts the same names. */
MF_EXPORT const char *mf_tier_name(mf_tier_t t);
MF_EXPORT mf_status_t mf_tier_parse(const char *s, mf_tier_t *out);

typedef struct mf_key {
    const char *model;       /* NUL-terminated, 1..255 bytes */
    uint32_t layer;
    mf_hash128_t hash;       /* prefix hash of the row's block */
} mf_key_t;

/* ==== data calls ===================================================================== */

#define MF_PUT_DURABLE 1u /* acknowledged only after a synced SSD write */

typedef struct mf_put_result {
    mf_tier_t tier;
    int durable;
    int replaced;
} mf_put_result_t;

/*
 * Stores one encoded row (proto/mf_row.h); the key is read from the row header, which is
 * validated here first (checksum included). Two-phase inside: PutBegin, then the row is
 * written into the host arena (when the daemon reserved it there) or sent as the
 * payload, then PutCommit; on any failure after PutBegin the reservation is aborted.
 * res may be NULL.
 */
MF_EXPORT mf_status_t mf_put(mf_channel_t *ch, const void *row, size_t len, unsigned flags,
                             mf_put_result_t *res, int64_t timeout_ms);

/*
 * How many leading full blocks of tokens[0:n_tokens] are cached, per layer:
 * blocks[i] for layers[i] (caller's array of n_layers). *total_blocks (may be NULL)
 * receives n_tokens / block_size.
 */
MF_EXPORT mf_status_t mf_lookup(mf_channel_t *ch, const char *model, uint32_t block_size,
                                const uint32_t *tokens, size_t n_tokens,
                                const uint32_t *layers, size_t n_layers, uint32_t *blocks,
                                uint32_t *total_blocks, int64_t timeout_ms);

typedef enum mf_get_mode {
    MF_GET_COPY = 0,  /* row bytes copied into memory the result owns */
    MF_GET_LEASE = 1, /* zero-copy views of the host arena; needs want_arena */
} mf_get_mode_t;

typedef struct mf_row_ref {
    mf_status_t status;      /* OK, NOT_FOUND, DATA_LOSS, OUT_OF_RANGE (ask again) */
    uint32_t layer;
    uint32_t block;
    mf_tier_t tier;
    const void *data;        /* the row (status OK): in the result or in the arena */
    size_t length;
    uint64_t lease_id;       /* MF_GET_LEASE: nonzero while leased */
    mf_row_view_t view;      /* decoded and verified here (status OK) */
} mf_row_ref_t;

typedef struct mf_get_result {
    size_t n_rows;           /* layer-major: for each layer, each block in order */
    mf_row_ref_t *rows;
    uint64_t lease_ttl_ms;
    void *priv_;             /* library-owned copy of the rows (MF_GET_COPY) */
} mf_get_result_t;

/*
 * Batch get for a whole prefix × many layers in one round trip: blocks
 * [first_block, first_block + n_blocks) (n_blocks 0 = every full block of tokens) of
 * each layer. Every OK row is decoded and checked here too (mf_row_decode, key and
 * tokens); a row that fails becomes DATA_LOSS. The call's status is OK when the
 * exchange worked, whatever the per-row statuses. Free with mf_get_result_free; leases
 * stay until mf_release_result (or expiry / close).
 */
MF_EXPORT mf_status_t mf_get_prefix(mf_channel_t *ch, const char *model, uint32_t block_size,
                                    const uint32_t *tokens, size_t n_tokens,
                                    const uint32_t *layers, size_t n_layers,
                                    uint32_t first_block, uint32_t n_blocks,
                                    mf_get_mode_t mode, mf_get_result_t **out,
                                    int64_t timeout_ms);
/* Rows by explicit key (admin use; checksum-verified only), in key order. */
MF_EXPORT mf_status_t mf_get_keys(mf_channel_t *ch, const mf_key_t *keys, size_t n_keys,
                                  mf_get_mode_t mode, mf_get_result_t **out,
                                  int64_t timeout_ms);
/* Frees the result (does not release leases). NULL is a no-op. Any thread. */
MF_EXPORT void mf_get_result_free(mf_get_result_t *r);
/* Releases every lease of a result (and zeroes their lease_id). */
MF_EXPORT mf_status_t mf_release_result(mf_channel_t *ch, mf_get_result_t *r,
                                        int64_t timeout_ms);

/*
 * One row by key, copied into buf (cap bytes, 16-byte aligned if you want to decode it
 * in place). *len receives its size; RESOURCE_EXHAUSTED when cap is too small (*len then
 * says how much is needed). NOT_FOUND, DATA_LOSS as per row.
 */
MF_EXPORT mf_status_t mf_get(mf_channel_t *ch, const mf_key_t *key, void *buf, size_t cap,
                             size_t *len, int64_t timeout_ms);

typedef struct mf_lease {
    const void *data;        /* in the arena; read only */
    size_t length;
    uint64_t lease_id;
    mf_row_view_t view;
    uint64_t ttl_ms;
} mf_lease_t;
/* One row by key as a leased zero-copy view; release with mf_release(ch, &id, 1, ...). */
MF_EXPORT mf_status_t mf_get_lease(mf_channel_t *ch, const mf_key_t *key, mf_lease_t *out,
                                   int64_t timeout_ms);

/* Releases leases; *released (may be NULL) counts those the daemon still held. */
MF_EXPORT mf_status_t mf_release(mf_channel_t *ch, const uint64_t *lease_ids, size_t n,
                                 uint32_t *released, int64_t timeout_ms);

/* Deletes one key. *deleted (may be NULL) is 0 or 1. */
MF_EXPORT mf_status_t mf_delete(mf_channel_t *ch, const mf_key_t *key, uint64_t *deleted,
                                int64_t timeout_ms);
/* Deletes every key of model (layer < 0: all layers). */
MF_EXPORT mf_status_t mf_delete_model(mf_channel_t *ch, const char *model, int64_t layer,
                                      uint64_t *deleted, int64_t timeout_ms);

/* ==== admin calls ==================================================================== */

typedef struct mf_entry_info {
    char model[256];
    uint32_t layer;
    mf_hash128_t hash;
    uint32_t block;
    uint64_t size;
    mf_tier_t tier;
    int on_ssd;
    uint32_t pins;
    uint64_t last_access_ms;
} mf_entry_info_t;

typedef struct mf_list_page {
    size_t n_entries;
    mf_entry_info_t *entries;
    uint8_t *next_page_token; /* NULL/0 on the last page; pass it back to continue */
    size_t next_page_token_len;
} mf_list_page_t;

/* model NULL or "" = all; layer < 0 = all; page_size 0 = the daemon's default (100). */
MF_EXPORT mf_status_t mf_list(mf_channel_t *ch, const char *model, int64_t layer,
                              uint32_t page_size, const void *page_token,
                              size_t page_token_len, mf_list_page_t **out,
                              int64_t timeout_ms);
MF_EXPORT void mf_list_page_free(mf_list_page_t *p);

typedef struct mf_tier_stats {
    mf_tier_t tier;
    int enabled;
    uint64_t used_bytes;
    uint64_t capacity_bytes;
    uint64_t entries;
} mf_tier_stats_t;

typedef struct mf_counter {
    char *name;              /* same names as /metrics without the mapflowd_ prefix */
    uint64_t value;
} mf_counter_t;

typedef struct mf_stats {
    size_t n_tiers;
    mf_tier_stats_t *tiers;
    size_t n_counters;
    mf_counter_t *counters;
    uint64_t uptime_ms;
    uint32_t connections;
} mf_stats_t;

MF_EXPORT mf_status_t mf_stats(mf_channel_t *ch, mf_stats_t **out, int64_t timeout_ms);
MF_EXPORT void mf_stats_free(mf_stats_t *s);
/* Value of a named counter in s, or 0 with *found = 0. found may be NULL. */
MF_EXPORT uint64_t mf_stats_counter(const mf_stats_t *s, const char *name, int *found);

/* Demotes (host → ssd) or drops (ssd) unpinned entries; bytes 0 = to the low watermark. */
MF_EXPORT mf_status_t mf_evict(mf_channel_t *ch, mf_tier_t tier, uint64_t bytes,
                               uint64_t *evicted_bytes, uint64_t *evicted_entries,
                               int64_t timeout_ms);
/* Drops every unpinned entry of the channel's namespace. */
MF_EXPORT mf_status_t mf_flush(mf_channel_t *ch, uint64_t *entries, int64_t timeout_ms);

typedef struct mf_config_item {
    char *key;
    char *value;
    int live;                /* settable at run time */
} mf_config_item_t;

/* key NULL or "" = every key. Free with mf_config_items_free(items, n). */
MF_EXPORT mf_status_t mf_config_get(mf_channel_t *ch, const char *key,
                                    mf_config_item_t **items, size_t *n, int64_t timeout_ms);
/* Sets a live key; *item (may be NULL) receives the value now in effect (free it with
 * mf_config_items_free(item, 1)). */
MF_EXPORT mf_status_t mf_config_set(mf_channel_t *ch, const char *key, const char *value,
                                    mf_config_item_t **item, int64_t timeout_ms);
MF_EXPORT void mf_config_items_free(mf_config_item_t *items, size_t n);

typedef struct mf_health {
    int ok;
    int ready;
    char status[256];
    size_t n_tiers;
    mf_tier_stats_t tiers[4];
} mf_health_t;
MF_EXPORT mf_status_t mf_health(mf_channel_t *ch, mf_health_t *out, int64_t timeout_ms);

/*
 * Mapping profiles travel as the protobuf encoding of mapflow.v1.MappingProfile
 * (proto/mapflow.proto), so this header stays free of generated types. profile_get
 * returns a malloc'd buffer the caller frees with free(); NOT_FOUND when absent.
 */
MF_EXPORT mf_status_t mf_profile_put(mf_channel_t *ch, const void *profile_pb, size_t len,
                                     int64_t timeout_ms);
MF_EXPORT mf_status_t mf_profile_get(mf_channel_t *ch, const char *source_model,
                                     const char *target_model, void **profile_pb,
                                     size_t *len, int64_t timeout_ms);

#ifdef __cplusplus
}
#endif
#endif /* MAPFLOW_H */
