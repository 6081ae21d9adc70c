/*
 * store_internal — what the three parts of the store share and nothing else sees:
 * store.c (open / close, reservations, commit, reads, the tier-blind calls),
 * store_ssd.c (write-through, the deferred write-through FIFO, SSD writes and reads,
 * the SSD budget) and store_evict.c (demotion and eviction, host and GPU, the watermark
 * balance). Other modules use store.h.
 *
 * Owns nothing itself; what the store owns is store.h's. Thread safety: loop thread only.
 * The store's type is named by its tag: this header does not include store.h, so that
 * store.c including it makes no circle of modules.
 */
#ifndef MFD_STORE_INTERNAL_H
#define MFD_STORE_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include "index.h"
#include "mf_row.h"
#include "mf_status.h"

struct mfd_store;

/* Demotes down to the low watermark once over the high one, never `keep`. */
void mfd_store_balance(struct mfd_store *st, const mfd_entry_t *keep);
/* A GPU arena over its high watermark demotes down to the low one, never `keep`. */
void mfd_store_balance_gpu(struct mfd_store *st, uint32_t arena, const mfd_entry_t *keep);
/* Takes back e's async write-through if no worker started it (the row was replaced or
 * removed first): 1 when cancelled, i.e. nothing of it reached the SSD tier. e must
 * still be linked (the write's pin is dropped here). */
int mfd_store_cancel_write(struct mfd_store *st, mfd_entry_t *e);
/* The decoded row must be the one its key names. */
mf_status_t mfd_store_check_key(const mf_row_view_t *v, const mfd_key_t *key, const char **why);
void mfd_store_defer_add(struct mfd_store *st, mfd_entry_t *e);
void mfd_store_defer_remove(struct mfd_store *st, mfd_entry_t *e);
/* Moves an unpinned host row down a tier; returns the host bytes freed. */
uint64_t mfd_store_demote(struct mfd_store *st, mfd_entry_t *e);
void mfd_store_drop_gpu(struct mfd_store *st, mfd_entry_t *e);
void mfd_store_drop_host(struct mfd_store *st, mfd_entry_t *e);
/* A durable put of `size` bytes under key fits the SSD budget (dropping non-durable SSD
 * copies as needed; the SSD record of the row it replaces counts as free). 0: refuse it
 * (RESOURCE_EXHAUSTED, counted), never evict acknowledged durable rows for it. */
int mfd_store_durable_room(struct mfd_store *st, const mfd_key_t *key, uint64_t size,
                           const char **why);
/* arena < 0: every arena. keep: never demoted (the row a commit just acknowledged). */
void mfd_store_evict_gpu(struct mfd_store *st, int arena, uint64_t want, const uint8_t *prefix,
                         size_t plen, const mfd_entry_t *keep, uint64_t *bytes, uint64_t *entries);
/* keep: an entry never demoted here (the row a commit just acknowledged). */
void mfd_store_evict_host(struct mfd_store *st, uint64_t want, const uint8_t *prefix, size_t plen,
                          const mfd_entry_t *keep, uint64_t *bytes, uint64_t *entries);
/* A 64-aligned host buffer with a GPU row's bytes (DtoH), or NULL. */
uint8_t *mfd_store_gpu_copy_out(struct mfd_store *st, const mfd_entry_t *e);
/* Marks e's layer in its block index node from a row validated in full just now. */
void mfd_store_note_row(struct mfd_store *st, mfd_entry_t *e, const uint8_t *row, size_t len);
/* Drops e's SSD record (queued write included) from the accounting and deletes it. */
void mfd_store_ssd_forget(struct mfd_store *st, mfd_entry_t *e);
/* Queues a write of e's bytes; 0 when the SSD tier is off, full or out of memory.
 * wt: an async write-through straight from the host block (counted in wt_bytes and
 * cancellable until a worker starts it). */
int mfd_store_ssd_write(struct mfd_store *st, mfd_entry_t *e, const uint8_t *bytes, int sync,
                        void (*done)(void *arg, mf_status_t status, int durable),
                        void *done_arg, int wt);
uint64_t mfd_store_wt_limit(const struct mfd_store *st);
/* Starts deferred write-throughs while the backlog has room (all: every one). A row
 * that left the host tier, reached the SSD otherwise or lost write_through is dropped
 * from the list. */
void mfd_store_wt_pump(struct mfd_store *st, int all);
/* Async write-through of a host row: now when the backlog allows, else deferred. */
void mfd_store_wt_start(struct mfd_store *st, mfd_entry_t *e);
/* Starts the async write-through of a row in memory: from its host block, else (a GPU row)
 * from a DtoH copy held in wbuf until the write completes. Counted in wt_bytes either way,
 * so GPU rows' copies are bounded like the host blocks pinned for writing. */
void mfd_store_wt_write(struct mfd_store *st, mfd_entry_t *e);

#endif /* MFD_STORE_INTERNAL_H */
