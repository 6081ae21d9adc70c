/*
 * index — key → reference-counted entry, plus the LRU lists placement walks.
 *
 * A key is (namespace, model, layer, prefix hash) serialised as bytes:
 *     u8 ns_len | ns | u8 model_len | model | u32 BE layer | 16-byte hash (LE form)
 * The same bytes are the SSD tier's record key, so keys sort by namespace, model,
 * layer, hash — the stable order List pages through — and a namespace is a key prefix:
 * a connection only ever builds keys under its own namespace, so other namespaces'
 * entries cannot be named (they are simply not found).
 *
 * Reference counting: the index holds an entry while it is linked; every lease and
 * every in-flight SSD operation adds a pin. Pinned entries are never evicted, demoted
 * or moved. Unlinking (delete, replace, flush, drop) removes the entry from lookup at
 * once; its memory (and arena block, through the free callback) goes when the last
 * pin goes. (memcached's item_get / item_remove.)
 *
 * LRU: three lists, entries resident on the host tier, on the GPU tier and present on
 * the SSD tier; the head is the most recently used.
 *
 * Order: linked entries are also on a skip list in key-byte order (namespace, model,
 * layer, hash), so a namespace's entries (collect) or a List page (seek, then next) cost
 * O(log n + what is returned), not a walk of the whole table.
 *
 * Blocks: a second table, one node per (namespace, model, prefix hash) — the entry key
 * without its layer — counting the linked entries of that block and holding, once, the
 * block's parent hash, block size and tokens as a row of the block showed them, plus a
 * bitmap of the layers (< MFD_BLOCK_LAYERS) whose linked row carries exactly those, and
 * its linked entries sorted by layer (so a prefix Get finds a block's rows with one probe). A
 * lookup checks a prefix with one probe and one token compare per block instead of one
 * per (block, layer) (DESIGN §4 semantics unchanged: a layer counts only if its row's
 * parent and tokens are the request's). A layer is marked only through
 * mfd_index_block_note, by code that has just read the row's bytes; unlinking clears it.
 *
 * Ownership: the index owns entries; the free callback releases what the entry points
 * to (arena block, buffers). Thread safety: loop thread only.
 */
#ifndef MFD_INDEX_H
#define MFD_INDEX_H

#include <stddef.h>
#include <stdint.h>
#include "arena.h"
#include "mf_status.h"

#define MFD_NS_MAX    128
#define MFD_MODEL_MAX 255
#define MFD_KEY_MAX   (1 + MFD_NS_MAX + 1 + MFD_MODEL_MAX + 4 + 16)

typedef struct mfd_key {
    uint16_t len;
    uint8_t b[MFD_KEY_MAX];
} mfd_key_t;

/* Parsed view of a key's bytes (pointers into the key). */
typedef struct mfd_key_parts {
    const char *ns;
    size_t ns_len;
    const char *model;
    size_t model_len;
    uint32_t layer;
    const uint8_t *hash;
} mfd_key_parts_t;

/* MF_INVALID_ARGUMENT when ns is not 1..128 bytes or model 1..255 bytes. */
mf_status_t mfd_key_make(mfd_key_t *k, const char *ns, size_t ns_len, const char *model,
                         size_t model_len, uint32_t layer, const uint8_t hash[16]);
/* MF_INVALID_ARGUMENT when the bytes are not a well-formed key. */
mf_status_t mfd_key_parse(const uint8_t *b, size_t len, mfd_key_parts_t *out);

typedef struct mfd_lru_link {
    struct mfd_entry *prev, *next;
} mfd_lru_link_t;

#define MFD_SL_LEVELS 12 /* key-order skip list: p = 1/4 per level, ~4^12 entries */

typedef struct mfd_entry {
    struct mfd_entry *hnext;
    mfd_lru_link_t host_lru, ssd_lru, gpu_lru;
    uint64_t khash;
    uint64_t size;            /* row bytes */
    uint32_t layer, block;    /* block = the row's block_index */
    uint32_t pins;            /* leases + in-flight SSD operations */
    uint32_t leases;          /* the pins held by client leases (Flush skips these) */
    uint64_t last_access_ms;
    mfd_ablock_t *host;       /* resident on the host tier when non-NULL */
    mfd_ablock_t *gpu;        /* resident on the GPU tier (arena gpu_arena) when non-NULL */
    uint8_t *ghead;           /* GPU rows: host copy of the header, model and tokens (the
                               * hit check reads it, never device memory) */
    uint32_t gpu_arena;
    uint8_t *wbuf;            /* private copy while a demotion write is in flight */
    struct mfd_ssd_job *wjob; /* the SSD write in flight (store.c; cancelled on replace) */
    struct mfd_entry *wt_prev, *wt_next; /* store.c's deferred write-through list */
    struct mfd_block *bnode;  /* this entry's block (NULL when out of memory) */
    unsigned linked : 1;      /* reachable through the index */
    unsigned on_host_lru : 1;
    unsigned on_ssd_lru : 1;
    unsigned on_gpu_lru : 1;
    unsigned on_ssd : 1;      /* a completed SSD write holds these bytes */
    unsigned ssd_writing : 1; /* an SSD write is in flight */
    unsigned durable : 1;     /* written with sync = 1 */
    unsigned wt_deferred : 1; /* on the deferred write-through list (backlog full) */
    unsigned wt_arena : 1;    /* the write in flight reads the host block (async) */
    mfd_key_t key;
    /* Key order (levels < sl_level); last, away from the fields a Get touches. */
    uint8_t sl_level;
    struct mfd_entry *sl_next[MFD_SL_LEVELS];
} mfd_entry_t;

typedef struct mfd_index mfd_index_t;
typedef void (*mfd_entry_free_cb)(mfd_entry_t *e, void *ctx);

mf_status_t mfd_index_create(mfd_entry_free_cb on_free, void *ctx, mfd_index_t **out);
/* Frees every entry (pinned or not) through the callback. */
void mfd_index_destroy(mfd_index_t *ix);

/* A new unlinked entry holding a copy of key (pins 0). NULL when out of memory. */
mfd_entry_t *mfd_entry_new(const mfd_key_t *key);
/* Frees an entry that was never inserted (calls the free callback). */
void mfd_index_discard(mfd_index_t *ix, mfd_entry_t *e);

mfd_entry_t *mfd_index_find(mfd_index_t *ix, const uint8_t *key, size_t len);
/* Links e; returns the entry it displaced (already unlinked, maybe freed: do not
 * touch it unless you pinned it) through *old as a flag: 1 if one was replaced. */
mf_status_t mfd_index_insert(mfd_index_t *ix, mfd_entry_t *e, int *replaced);
/* Removes e from lookup and both LRUs; frees it now if unpinned. */
void mfd_index_unlink(mfd_index_t *ix, mfd_entry_t *e);

void mfd_entry_pin(mfd_entry_t *e);
/* Drops a pin; frees the entry if it was unlinked and this was the last pin. */
void mfd_index_unpin(mfd_index_t *ix, mfd_entry_t *e);

size_t mfd_index_count(const mfd_index_t *ix);

/* LRU maintenance (lists: 0 = host, 1 = ssd, 2 = gpu). */
enum { MFD_LRU_HOST = 0, MFD_LRU_SSD = 1, MFD_LRU_GPU = 2 };
void mfd_lru_add(mfd_index_t *ix, int list, mfd_entry_t *e);     /* at the MRU end */
void mfd_lru_remove(mfd_index_t *ix, int list, mfd_entry_t *e);
void mfd_lru_touch(mfd_index_t *ix, int list, mfd_entry_t *e);   /* to the MRU end */
mfd_entry_t *mfd_lru_coldest(mfd_index_t *ix, int list);
mfd_entry_t *mfd_lru_warmer(const mfd_entry_t *e, int list);     /* toward the MRU end */

/*
 * Linked entries whose key starts with `prefix` (e.g. a namespace, or a namespace and
 * model), into a malloc'd array in key-byte order (a walk of that key range only). The
 * caller frees the array; entries stay owned by the index (pin them if they must outlive
 * a callback).
 */
mf_status_t mfd_index_collect(mfd_index_t *ix, const uint8_t *prefix, size_t prefix_len,
                              mfd_entry_t ***out, size_t *n_out);

/* ---- blocks ------------------------------------------------------------------------- */

#define MFD_BLOCK_LAYERS 256   /* layers the bitmap covers; rows of higher layers are
                                * never marked (their hit check reads the row) */
#define MFD_BKEY_MAX (MFD_KEY_MAX - 4)

typedef struct mfd_block mfd_block_t;

/* The block key of an entry key: its bytes without the 4 layer bytes. Returns the length. */
size_t mfd_bkey_of(const uint8_t *key, size_t len, uint8_t out[MFD_BKEY_MAX]);
const mfd_block_t *mfd_index_block_find(const mfd_index_t *ix, const uint8_t *bkey,
                                        size_t len);
/*
 * The linked entry of `key` (layer `layer`) found through its block b, the node
 * mfd_index_block_find gave for key's block key (NULL: none): the same answer as
 * mfd_index_find(key), without hashing and comparing the key of each row of a block
 * (a prefix Get probes layers x blocks). Falls back to mfd_index_find while some entry
 * is in no block's table (linked while out of memory).
 */
mfd_entry_t *mfd_index_block_entry(mfd_index_t *ix, const mfd_block_t *b, uint32_t layer,
                                   const mfd_key_t *key);
/* 1 when the block's recorded parent (LE form), block size and tokens are these. */
int mfd_block_matches(const mfd_block_t *b, uint32_t block_size, const uint8_t parent[16],
                      const uint32_t *tokens);
/* 1 when `layer`'s linked row is known to carry the block's recorded parent and tokens. */
int mfd_block_has_layer(const mfd_block_t *b, uint32_t layer);
/*
 * e (linked) was just read and holds these parent (LE form), block size and tokens: the
 * first note of a block records them; e's layer is marked when they equal the record.
 */
void mfd_index_block_note(mfd_index_t *ix, mfd_entry_t *e, uint32_t block_size,
                          const uint8_t parent[16], const uint32_t *tokens);
size_t mfd_index_block_count(const mfd_index_t *ix);

/* In key order: the first linked entry whose key is > (inclusive: >=) key[0..len), or
 * NULL; then the next one after e (linked), or NULL. */
mfd_entry_t *mfd_index_seek(const mfd_index_t *ix, const uint8_t *key, size_t len,
                            int inclusive);
mfd_entry_t *mfd_index_next(const mfd_entry_t *e);

/* Byte order of keys (memcmp, then shorter first). */
int mfd_key_cmp(const uint8_t *a, size_t alen, const uint8_t *b, size_t blen);

#endif /* MFD_INDEX_H */
