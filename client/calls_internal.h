/*
 * calls_internal — what libmapflow's data calls share: calls.c (the argument checks and
 * small helpers below, lookup, release, delete), calls_put.c (put, single and batched)
 * and calls_get.c (get by prefix or by keys, copy or lease). Nothing else includes it.
 *
 * Owns nothing. Thread safety: the checks run in the caller's thread and report through
 * the channel's message (mf__chan_error); nothing here touches the connection.
 */
#ifndef MF_CLIENT_CALLS_INTERNAL_H
#define MF_CLIENT_CALLS_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "channel.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "libmapflow sends token arrays as they sit in memory: little-endian hosts only"
#endif

/* Sync and async entry points share the op builder: run it or post it. */
typedef struct mf__async_args {
    mf_cq_t *cq;
    void *tag;
    mf_call_t **call;
} mf__async_args_t;

/* Runs op (NULL: it could not be built, st says why) synchronously, or posts it to a->cq. */
mf_status_t mf__run_op(mf__op_t *op, mf_status_t st, int64_t timeout_ms,
                       const mf__async_args_t *a);
/* MF_OK when model is 1..MF_ROW_MAX_MODEL bytes, else INVALID_ARGUMENT with a message. */
mf_status_t mf__check_model(mf_channel_t *ch, const char *model);
/* A peer daemon's UCX listener for read-through (NULL or "" = none): HOST:PORT. */
mf_status_t mf__check_peer(mf_channel_t *ch, const char *peer);
/* Fills a protobuf Key from an mf_key_t; hb holds the 16 hash bytes it points to. */
mf_status_t mf__key_to_pb(mf_channel_t *ch, const mf_key_t *key, Mapflow__V1__Key *pb,
                          uint8_t hb[16]);
/* A malloc'd copy of n bytes of p (at least one byte allocated); NULL when out of memory. */
void *mf__dup_mem(const void *p, size_t n);

#endif /* MF_CLIENT_CALLS_INTERNAL_H */
