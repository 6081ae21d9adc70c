/*
 * profiles — mapping profiles kept by the store: one record per (namespace, source model,
 * target model) in the SSD tier's RocksDB ('p' records of tier_ssd.h), written synced
 * (small, expensive to refit: they survive a crash). A small module over the store so
 * that the admin handlers never touch RocksDB: put / get / list are asynchronous on the
 * SSD worker and complete on the loop. With the SSD tier off every call is refused
 * (MF_UNAVAILABLE, *why says so).
 *
 * Ownership: a call that returns MF_OK owns its job until its callback has run (exactly
 * once, on the loop); a failed call runs no callback. mfd_profile_put takes the packed
 * record over in every case. A list page is valid only inside its callback.
 * Thread safety: loop thread only.
 */
#ifndef MFD_PROFILES_H
#define MFD_PROFILES_H

#include <stddef.h>
#include <stdint.h>
#include "mf_status.h"
#include "store.h"

/* A list page: the records of one SCAN of the namespace (opaque; read with the calls
 * below, inside the page callback only). */
typedef struct mfd_ssd_job mfd_profile_page_t;

/* put: st MF_OK or MF_UNAVAILABLE (write failed); get: MF_OK with the stored bytes (valid
 * during the call), MF_NOT_FOUND, MF_UNAVAILABLE. */
typedef void (*mfd_profile_cb)(void *arg, mf_status_t st, const uint8_t *val, size_t len);
/* st MF_OK, MF_DATA_LOSS (the scan met corruption) or MF_UNAVAILABLE. */
typedef void (*mfd_profile_page_cb)(void *arg, mf_status_t st, const mfd_profile_page_t *pg);

mf_status_t mfd_profile_put(mfd_store_t *st, const char *ns, const char *src, const char *tgt,
                            uint8_t *packed, size_t len, mfd_profile_cb cb, void *arg,
                            const char **why);
mf_status_t mfd_profile_get(mfd_store_t *st, const char *ns, const char *src, const char *tgt,
                            mfd_profile_cb cb, void *arg, const char **why);
/* Up to `page` records of ns after `token` (a page's mfd_profile_page_token; empty: from
 * the start), in key order. */
mf_status_t mfd_profile_list(mfd_store_t *st, const char *ns, const uint8_t *token,
                             size_t tlen, uint32_t page, mfd_profile_page_cb cb, void *arg,
                             const char **why);

/* Steps through a page: *pos starts at 0; returns 0 at the end, else 1 with the record's
 * key after the namespace (u8 len, source, u8 len, target) and its value. */
int mfd_profile_page_next(const mfd_profile_page_t *pg, size_t *pos, const uint8_t **key,
                          size_t *klen, const uint8_t **val, size_t *vlen);
size_t mfd_profile_page_count(const mfd_profile_page_t *pg);
/* 1 when records remain after the page. */
int mfd_profile_page_more(const mfd_profile_page_t *pg);

#endif /* MFD_PROFILES_H */
