/*
 * store — placement over the tiers (DESIGN §7): admits committed rows to the GPU tier
 * (when on and the put was placed there) or the host tier, writes them through to the SSD tier (off | async | sync), demotes cold
 * unpinned rows host → SSD between the high and low watermarks (or drops them when
 * the SSD tier already holds them or is off), keeps the SSD tier within ssd_bytes,
 * reads SSD rows back and promotes them, and removes rows (delete, flush, evict).
 *
 * Async write-through hands RocksDB the host block itself (no copy), which pins the row
 * until the write ran. At most an eighth of the arena is pinned that way; later rows
 * wait unpinned on a FIFO (written as earlier writes finish, or when demoted), a row
 * replaced or removed before RocksDB started its write has that write cancelled, and a
 * commit never demotes the row it just made visible. So a put burst neither fills the
 * arena with pinned rows nor loses an acknowledged row.
 *
 * GPU tier (tier_gpu.h): a GPU row is validated at commit from a DtoH staging copy, keeps
 * a host copy of its head (header, model, tokens) for hit checks, is written through to
 * the SSD tier from a host copy (DtoH, bounded like the host rows' write-through), and
 * demotes GPU → host (DtoH into a host block; straight to the SSD tier when the host
 * arena has no room) between the same high/low watermarks, per arena. A row may sit on
 * both the GPU and the host tier (a staged copy for a client that cannot map the GPU
 * arena, or gpu_promote); either copy then goes without any copying when evicted.
 * Pinned rows (leases, SSD operations) are never evicted from any tier, and durable rows
 * (written with sync) never leave the SSD tier but by delete / flush: a durable put that
 * does not fit ssd_bytes is refused (RESOURCE_EXHAUSTED) instead. A committed row's hash
 * must be H(parent, tokens) (block 0: parent = the root). An SSD database that cannot be
 * opened or scanned fails mfd_store_open (ssd_reset: moved aside once, then empty).
 *
 * Ownership: the store owns the index, the arena and the SSD tier. Entries it hands
 * out are owned by the index; pin them (mfd_entry_pin) to keep them past the current
 * loop callback. Thread safety: loop thread only (SSD completions arrive there).
 */
#ifndef MFD_STORE_H
#define MFD_STORE_H

#include <event2/event.h>
#include <stddef.h>
#include <stdint.h>
#include "arena.h"
#include "config.h"
#include "index.h"
#include "mapflow.pb-c.h"
#include "metrics.h"
#include "mf_row.h"
#include "tier.h"
#include "tier_gpu.h"
#include "tier_ssd.h"

typedef struct mfd_store {
    const mfd_config_t *cfg;   /* borrowed: live keys are read at each use */
    mfd_metrics_t *metrics;    /* borrowed */
    mfd_index_t *ix;
    mfd_arena_t *arena;
    mfd_ssd_t *ssd;            /* NULL: SSD tier off */
    mfd_gpu_t *gpu;            /* NULL: GPU tier off (gpu_why says why) */
    char gpu_why[256];
    uint64_t ssd_used, ssd_entries, host_entries, gpu_entries;
    /* Async write-through: bytes of host blocks pinned by queued SSD writes (bounded by
     * a fraction of the arena), and the rows waiting unpinned behind that bound. */
    uint64_t wt_bytes, wt_deferred_bytes;
    mfd_entry_t *wt_head, *wt_tail;
    int wt_pumping;
} mfd_store_t;

mf_status_t mfd_store_open(mfd_store_t *st, const mfd_config_t *cfg, mfd_metrics_t *m,
                           char *err, size_t errlen);
mf_status_t mfd_store_attach(mfd_store_t *st, struct event_base *base);
/* Queues every deferred write-through and waits for all SSD work (drain, shutdown). */
void mfd_store_drain(mfd_store_t *st);
/* Finishes SSD work (shutdown) and frees everything. */
void mfd_store_close(mfd_store_t *st);

/* The host arena as others need to see it (UCX registration, Hello's arena size, put
 * bounds, logs), and where a reserved block's bytes are: nobody outside the store and the
 * tier modules reaches into the arena itself. */
uint8_t *mfd_store_host_base(const mfd_store_t *st);
uint64_t mfd_store_host_capacity(const mfd_store_t *st);
int mfd_store_host_fd(const mfd_store_t *st); /* the memfd Hello passes to local clients */
uint8_t *mfd_store_block_ptr(const mfd_store_t *st, const mfd_ablock_t *blk);
/* Each tier's state for Health / Stats / logs: [0] gpu, [1] host, [2] ssd. */
void mfd_store_tiers(const mfd_store_t *st, mfd_tier_info_t out[3]);

/* An arena block for a put; evicts unpinned rows to make room. */
mf_status_t mfd_store_reserve(mfd_store_t *st, uint64_t size, mfd_ablock_t **blk);
void mfd_store_unreserve(mfd_store_t *st, mfd_ablock_t *blk);

typedef void (*mfd_store_done_cb)(void *arg, mf_status_t status, int durable);
/*
 * Validates the row in blk (full decode + checksum, model / layer / hash == key) and
 * makes it visible, taking blk over. Returns MF_OK with *pending = 0 when the reply can
 * go now (*durable, *replaced filled), MF_OK with *pending = 1 when `done` will be
 * called after the synced SSD write, or the row's error (blk is then freed).
 */
mf_status_t mfd_store_commit(mfd_store_t *st, const mfd_key_t *key, mfd_ablock_t *blk,
                             uint64_t size, int durable, mfd_store_done_cb done, void *arg,
                             int *pending, int *is_durable, int *replaced, const char **why);

/* The GPU-tier counterparts of reserve / unreserve / commit. reserve_gpu: a block in
 * arena `pref` (-1: the arena with the most room, else any other), evicting unpinned GPU
 * rows of that arena (GPU → host) to make room; MF_UNAVAILABLE when the tier is off.
 * commit_gpu copies the row out (DtoH) to validate it exactly as mfd_store_commit does,
 * and takes blk over. */
mf_status_t mfd_store_reserve_gpu(mfd_store_t *st, uint64_t size, int pref, uint32_t *arena,
                                  mfd_ablock_t **blk);
/* reserve_gpu restricted to the arenas of `mask` (bit i = arena i; arenas past 63 always
 * qualify); MF_RESOURCE_EXHAUSTED when none of them has room. */
mf_status_t mfd_store_reserve_gpu_in(mfd_store_t *st, uint64_t size, uint64_t mask, int pref,
                                     uint32_t *arena, mfd_ablock_t **blk);
void mfd_store_unreserve_gpu(mfd_store_t *st, uint32_t arena, mfd_ablock_t *blk);
mf_status_t mfd_store_commit_gpu(mfd_store_t *st, const mfd_key_t *key, uint32_t arena,
                                 mfd_ablock_t *blk, uint64_t size, int durable,
                                 mfd_store_done_cb done, void *arg, int *pending,
                                 int *is_durable, int *replaced, const char **why);

/* One row of a put region after mfd_gpu_check_rows: validated from its checked bytes
 * exactly as mfd_store_commit_gpu validates, then visible in blk (its own block, cut
 * from the region), or blk is freed and the row's error returned. Not durable; the
 * configured write-through applies. */
mf_status_t mfd_store_commit_region_row(mfd_store_t *st, const mfd_key_t *key, uint32_t arena,
                                        mfd_ablock_t *blk, const mfd_gpu_rowcheck_t *chk,
                                        int *replaced, const char **why);

/* ---- a put's row, tier-blind: place, write, commit (rows.c, lease.c) --------------------
 * A slot is a reserved block for one row in the host arena or a GPU arena; the caller
 * holds it until it commits (the store takes the block) or unplaces it. */
typedef struct mfd_slot {
    mfd_ablock_t *blk;
    uint64_t size;
    uint32_t arena;            /* gpu: which GPU arena */
    int gpu;                   /* blk is in GPU arena `arena`, else in the host arena */
} mfd_slot_t;

/* Places a row of `size` bytes: the GPU tier when on (arena `pref`, -1: the roomiest)
 * unless prefer_host, else the host tier; each falls back to the other when it has no
 * room. MF_RESOURCE_EXHAUSTED when neither has (pinned or reserved). */
mf_status_t mfd_store_place(mfd_store_t *st, uint64_t size, int prefer_host, int pref,
                            mfd_slot_t *out);
void mfd_store_unplace(mfd_store_t *st, mfd_slot_t *slot);
/* The slot's offset in its arena (what a client that maps the arena writes to). */
uint64_t mfd_slot_offset(const mfd_slot_t *slot);
/* Copies len (= slot->size) bytes of the row into the slot (HtoD for a GPU slot). */
mf_status_t mfd_store_write(mfd_store_t *st, const mfd_slot_t *slot, const void *src,
                            size_t len);
/* mfd_store_commit or mfd_store_commit_gpu by the slot's tier; takes the slot's block
 * over either way (slot->blk is NULL on return). */
mf_status_t mfd_store_commit_slot(mfd_store_t *st, const mfd_key_t *key, mfd_slot_t *slot,
                                  int durable, mfd_store_done_cb done, void *arg,
                                  int *pending, int *is_durable, int *replaced,
                                  const char **why);

mfd_entry_t *mfd_store_find(mfd_store_t *st, const mfd_key_t *key);
/* Bytes for the hit check (mfd_row_verify with full_checksum 0: header and tokens only):
 * the row in memory (mfd_store_bytes) or, for a GPU-only row, its head copy. NULL when the
 * row is only on the SSD tier. */
const uint8_t *mfd_store_head(const mfd_store_t *st, const mfd_entry_t *e);
/* A GPU row's bytes copied out (DtoH) into dst (e->size bytes). */
mf_status_t mfd_store_gpu_read(mfd_store_t *st, const mfd_entry_t *e, uint8_t *dst);
/* Gives a GPU row a host-tier copy (DtoH into a host block) if it has none: the staging of
 * a lease for a client that did not map the row's GPU arena. e must be pinned. */
mf_status_t mfd_store_stage_host(mfd_store_t *st, mfd_entry_t *e);
/* gpu_promote: gives a host row a GPU-tier copy (HtoD) when there is room; e pinned. */
void mfd_store_promote_gpu(mfd_store_t *st, mfd_entry_t *e);
/* Row bytes held in memory (host block or a demotion copy), or NULL (SSD only). */
const uint8_t *mfd_store_bytes(const mfd_store_t *st, const mfd_entry_t *e);
/* ---- a Get's row, tier-blind: which copy a client gets (rows.c) -----------------------
 * lease: the client reads the row in place (GET_LEASE; it maps the host arena and the GPU
 * arenas of gpu_mapped, bit i = arena i); else it gets the bytes in the reply (GET_COPY). */
typedef struct mfd_view {
    Mapflow__V1__Tier tier;    /* where the client's copy is (SSD: a demotion copy) */
    uint32_t gpu_arena;        /* tier GPU, lease */
    const uint8_t *bytes;      /* the hit check's bytes (a GPU lease: the head copy); copy
                                  mode: the bytes to send */
    uint8_t *owned;            /* copy mode: malloc'd bytes (DtoH, demotion copy) the
                                  caller now owns and frees; NULL: bytes is the host block,
                                  stable while e is pinned */
    int need_read;             /* only on the SSD tier: mfd_store_read it */
} mfd_view_t;

/* The tier matrix of a hit (e pinned): a mapped GPU arena → a device view; a GPU row for a
 * lease client that did not map it → staged in the host arena; a host row → the host
 * block; GET_COPY of a GPU row → DtoH; a demotion copy → copied; else need_read.
 * MF_RESOURCE_EXHAUSTED (no room to stage, no memory), MF_INTERNAL (DtoH failed). */
mf_status_t mfd_store_view(mfd_store_t *st, mfd_entry_t *e, int lease, uint64_t gpu_mapped,
                           mfd_view_t *v);

/* Marks a hit for the LRUs. _at: as of now_ms (mf_now_ms), read once for a batch of hits
 * (a 15,360-row Get would otherwise read the clock once per row). */
void mfd_store_touch(mfd_store_t *st, mfd_entry_t *e);
void mfd_store_touch_at(mfd_store_t *st, mfd_entry_t *e, uint64_t now_ms);

/*
 * Reads e from the SSD tier, validates it (checksum) and promotes it to the host tier
 * when `promote` (and space allows). cb gets the bytes: buf == NULL means they are in
 * the host block (e->host); otherwise buf is malloc'd and the callee owns it.
 * e stays pinned until cb returns.
 */
typedef void (*mfd_store_read_cb)(void *arg, mfd_entry_t *e, mf_status_t status,
                                  uint8_t *buf, size_t len);
void mfd_store_read(mfd_store_t *st, mfd_entry_t *e, int promote, mfd_store_read_cb cb,
                    void *arg);

/* Unlinks e and deletes its SSD record. */
void mfd_store_remove(mfd_store_t *st, mfd_entry_t *e);

/* Demotes/drops unpinned rows of `tier` (MF tier numbers: 1 gpu, 2 host, 3 ssd) until `bytes`
 * are freed (0 = down to the low watermark). Only keys starting with `prefix` (a
 * namespace, so a client never evicts another namespace's rows; plen 0 = all). */
void mfd_store_evict(mfd_store_t *st, int tier, uint64_t bytes, const uint8_t *prefix,
                     size_t plen, uint64_t *freed_bytes, uint64_t *freed_entries);

/* Token / parent-hash verification of a row against the request (DESIGN §4):
 * MF_DATA_LOSS when the row is malformed or fails its checksum, MF_NOT_FOUND when it is
 * sound but belongs to another context (tokens / parent differ: a hash collision).
 * full_checksum 0 is for rows this daemon validated already (at commit or SSD read): it
 * checks the header and compares parent, hash and tokens at their fixed offsets, never
 * reading past len; 1 decodes the whole row and checks its checksum (rows from a peer). */
mf_status_t mfd_row_verify(const uint8_t *row, size_t len, int full_checksum,
                           const uint32_t *tokens, uint32_t block_size,
                           mf_hash128_t parent, mf_hash128_t hash, const char **why);

#endif /* MFD_STORE_H */
