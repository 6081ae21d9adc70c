/* index — chained hash table of refcounted entries + LRU lists (see index.h). */
#include "index.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

/* One linked entry of a block, by layer (the layer kept here so a probe never reads the
 * entry it skips). */
typedef struct mfd_bslot {
    uint32_t layer;
    mfd_entry_t *e;
} mfd_bslot_t;

struct mfd_block {
    struct mfd_block *hnext;
    uint64_t khash;
    uint32_t n_entries;       /* linked entries of this block, any layer */
    uint32_t n_slots, cap_slots;
    mfd_bslot_t *slots;       /* n_slots of the linked entries, sorted by layer */
    uint32_t block_size;      /* 0: nothing recorded yet */
    uint32_t *tokens;         /* block_size tokens as a row of the block showed them */
    uint8_t parent[16];
    uint64_t layers[MFD_BLOCK_LAYERS / 64]; /* rows known to carry parent + tokens */
    uint16_t klen;
    uint8_t key[];
};

struct mfd_index {
    mfd_entry_t **buckets;
    size_t n_buckets, count;
    mfd_block_t **bbuckets;
    size_t n_bbuckets, bcount;
    size_t unslotted;         /* linked entries in no block's slots (out of memory) */
    mfd_entry_t *lru_head[3], *lru_tail[3];   /* head = MRU, tail = coldest */
    mfd_entry_t *sl_head[MFD_SL_LEVELS];      /* the key-order skip list */
    uint64_t sl_rng;                          /* its level draws (xorshift64) */
    mfd_entry_free_cb on_free;
    void *ctx;
};

mf_status_t mfd_key_make(mfd_key_t *k, const char *ns, size_t ns_len, const char *model,
                         size_t model_len, uint32_t layer, const uint8_t hash[16])
{
    if (ns_len < 1 || ns_len > MFD_NS_MAX || model_len < 1 || model_len > MFD_MODEL_MAX)
        return MF_INVALID_ARGUMENT;
    uint8_t *p = k->b;
    *p++ = (uint8_t)ns_len;
    memcpy(p, ns, ns_len);
    p += ns_len;
    *p++ = (uint8_t)model_len;
    memcpy(p, model, model_len);
    p += model_len;
    /* Big-endian so byte order sorts layers numerically. */
    *p++ = (uint8_t)(layer >> 24);
    *p++ = (uint8_t)(layer >> 16);
    *p++ = (uint8_t)(layer >> 8);
    *p++ = (uint8_t)layer;
    memcpy(p, hash, 16);
    p += 16;
    k->len = (uint16_t)(p - k->b);
    return MF_OK;
}

mf_status_t mfd_key_parse(const uint8_t *b, size_t len, mfd_key_parts_t *out)
{
    if (len < 1 || b[0] < 1 || b[0] > MFD_NS_MAX || len < 1u + b[0] + 1u)
        return MF_INVALID_ARGUMENT;
    size_t ns_len = b[0];
    size_t model_len = b[1 + ns_len];
    if (model_len < 1 || len != 1 + ns_len + 1 + model_len + 4 + 16)
        return MF_INVALID_ARGUMENT;
    out->ns = (const char *)b + 1;
    out->ns_len = ns_len;
    out->model = (const char *)b + 2 + ns_len;
    out->model_len = model_len;
    const uint8_t *l = b + 2 + ns_len + model_len;
    out->layer = ((uint32_t)l[0] << 24) | ((uint32_t)l[1] << 16) | ((uint32_t)l[2] << 8) | l[3];
    out->hash = l + 4;
    return MF_OK;
}

int mfd_key_cmp(const uint8_t *a, size_t alen, const uint8_t *b, size_t blen)
{
    int c = memcmp(a, b, alen < blen ? alen : blen);
    if (c)
        return c;
    return alen < blen ? -1 : alen > blen;
}

mf_status_t mfd_index_create(mfd_entry_free_cb on_free, void *ctx, mfd_index_t **out)
{
    mfd_index_t *ix = calloc(1, sizeof(*ix));
    if (!ix)
        return MF_RESOURCE_EXHAUSTED;
    ix->n_buckets = 1024;
    ix->buckets = calloc(ix->n_buckets, sizeof(*ix->buckets));
    if (!ix->buckets) {
        free(ix);
        return MF_RESOURCE_EXHAUSTED;
    }
    ix->n_bbuckets = 1024;
    ix->bbuckets = calloc(ix->n_bbuckets, sizeof(*ix->bbuckets));
    if (!ix->bbuckets) {
        free(ix->buckets);
        free(ix);
        return MF_RESOURCE_EXHAUSTED;
    }
    ix->on_free = on_free;
    ix->ctx = ctx;
    ix->sl_rng = 0x9e3779b97f4a7c15ull ^ (uint64_t)(uintptr_t)ix;
    *out = ix;
    return MF_OK;
}

static void entry_free(mfd_index_t *ix, mfd_entry_t *e)
{
    if (ix->on_free)
        ix->on_free(e, ix->ctx);
    free(e);
}

void mfd_index_destroy(mfd_index_t *ix)
{
    if (!ix)
        return;
    for (size_t i = 0; i < ix->n_buckets; i++) {
        for (mfd_entry_t *e = ix->buckets[i], *n; e; e = n) {
            n = e->hnext;
            entry_free(ix, e);
        }
    }
    free(ix->buckets);
    for (size_t i = 0; i < ix->n_bbuckets; i++) {
        for (mfd_block_t *b = ix->bbuckets[i], *n; b; b = n) {
            n = b->hnext;
            free(b->tokens);
            free(b->slots);
            free(b);
        }
    }
    free(ix->bbuckets);
    free(ix);
}

static void block_attach(mfd_index_t *ix, mfd_entry_t *e);
static void block_detach(mfd_index_t *ix, mfd_entry_t *e);

mfd_entry_t *mfd_entry_new(const mfd_key_t *key)
{
    mfd_entry_t *e = calloc(1, sizeof(*e));
    if (!e)
        return NULL;
    e->key.len = key->len;
    memcpy(e->key.b, key->b, key->len);
    e->khash = XXH3_64bits(key->b, key->len);
    return e;
}

void mfd_index_discard(mfd_index_t *ix, mfd_entry_t *e)
{
    if (e)
        entry_free(ix, e);
}

mfd_entry_t *mfd_index_find(mfd_index_t *ix, const uint8_t *key, size_t len)
{
    uint64_t h = XXH3_64bits(key, len);
    for (mfd_entry_t *e = ix->buckets[h & (ix->n_buckets - 1)]; e; e = e->hnext)
        if (e->khash == h && e->key.len == len && memcmp(e->key.b, key, len) == 0)
            return e;
    return NULL;
}

static void grow(mfd_index_t *ix)
{
    size_t nb = ix->n_buckets * 2;
    mfd_entry_t **b = calloc(nb, sizeof(*b));
    if (!b)
        return; /* longer chains, still correct */
    for (size_t i = 0; i < ix->n_buckets; i++) {
        for (mfd_entry_t *e = ix->buckets[i], *n; e; e = n) {
            n = e->hnext;
            e->hnext = b[e->khash & (nb - 1)];
            b[e->khash & (nb - 1)] = e;
        }
    }
    free(ix->buckets);
    ix->buckets = b;
    ix->n_buckets = nb;
}

static void hash_remove(mfd_index_t *ix, mfd_entry_t *e)
{
    mfd_entry_t **pp = &ix->buckets[e->khash & (ix->n_buckets - 1)];
    while (*pp && *pp != e)
        pp = &(*pp)->hnext;
    if (*pp) {
        *pp = e->hnext;
        ix->count--;
    }
    e->hnext = NULL;
}

/* ---- key order (skip list) ---------------------------------------------------------- */

/* upd[lvl]: the link at level lvl that points at the first entry whose key is >= key (or
 * > key with `after`), where an entry of that key is spliced in or out. */
static void sl_find(mfd_index_t *ix, const uint8_t *key, size_t len, int after,
                    mfd_entry_t **upd[MFD_SL_LEVELS])
{
    mfd_entry_t **p = ix->sl_head;
    for (int lvl = MFD_SL_LEVELS - 1; lvl >= 0; lvl--) {
        for (mfd_entry_t *x; (x = p[lvl]);) {
            int c = mfd_key_cmp(x->key.b, x->key.len, key, len);
            if (c > 0 || (c == 0 && !after))
                break;
            p = x->sl_next;
        }
        upd[lvl] = &p[lvl];
    }
}

static void sl_insert(mfd_index_t *ix, mfd_entry_t *e)
{
    uint64_t r = ix->sl_rng; /* xorshift64: each further level kept with p = 1/4 */
    r ^= r << 13;
    r ^= r >> 7;
    r ^= r << 17;
    ix->sl_rng = r;
    uint8_t level = 1;
    while (level < MFD_SL_LEVELS && (r & 3) == 0) {
        level++;
        r >>= 2;
    }
    mfd_entry_t **upd[MFD_SL_LEVELS];
    sl_find(ix, e->key.b, e->key.len, 0, upd);
    e->sl_level = level;
    for (int lvl = 0; lvl < MFD_SL_LEVELS; lvl++) {
        e->sl_next[lvl] = lvl < level ? *upd[lvl] : NULL;
        if (lvl < level)
            *upd[lvl] = e;
    }
}

static void sl_remove(mfd_index_t *ix, mfd_entry_t *e)
{
    mfd_entry_t **upd[MFD_SL_LEVELS];
    sl_find(ix, e->key.b, e->key.len, 0, upd);
    for (int lvl = 0; lvl < e->sl_level; lvl++)
        if (*upd[lvl] == e) /* keys of linked entries are unique */
            *upd[lvl] = e->sl_next[lvl];
    e->sl_level = 0;
}

mfd_entry_t *mfd_index_seek(const mfd_index_t *ix, const uint8_t *key, size_t len,
                            int inclusive)
{
    mfd_entry_t **upd[MFD_SL_LEVELS];
    sl_find((mfd_index_t *)ix, key, len, !inclusive, upd);
    return *upd[0];
}

mfd_entry_t *mfd_index_next(const mfd_entry_t *e)
{
    return e->sl_next[0];
}

mf_status_t mfd_index_insert(mfd_index_t *ix, mfd_entry_t *e, int *replaced)
{
    mfd_entry_t *old = mfd_index_find(ix, e->key.b, e->key.len);
    if (replaced)
        *replaced = old != NULL;
    if (old)
        mfd_index_unlink(ix, old);
    if (ix->count + 1 > ix->n_buckets)
        grow(ix);
    size_t i = e->khash & (ix->n_buckets - 1);
    e->hnext = ix->buckets[i];
    ix->buckets[i] = e;
    e->linked = 1;
    ix->count++;
    block_attach(ix, e);
    sl_insert(ix, e);
    return MF_OK;
}

void mfd_index_unlink(mfd_index_t *ix, mfd_entry_t *e)
{
    if (!e->linked)
        return;
    hash_remove(ix, e);
    block_detach(ix, e);
    sl_remove(ix, e);
    mfd_lru_remove(ix, MFD_LRU_HOST, e);
    mfd_lru_remove(ix, MFD_LRU_SSD, e);
    mfd_lru_remove(ix, MFD_LRU_GPU, e);
    e->linked = 0;
    if (e->pins == 0)
        entry_free(ix, e);
}

void mfd_entry_pin(mfd_entry_t *e)
{
    e->pins++;
}

void mfd_index_unpin(mfd_index_t *ix, mfd_entry_t *e)
{
    if (e->pins > 0)
        e->pins--;
    if (e->pins == 0 && !e->linked)
        entry_free(ix, e);
}

size_t mfd_index_count(const mfd_index_t *ix)
{
    return ix->count;
}

/* ---- LRU ---------------------------------------------------------------------------- */

static mfd_lru_link_t *link_of(mfd_entry_t *e, int list)
{
    return list == MFD_LRU_HOST ? &e->host_lru : list == MFD_LRU_GPU ? &e->gpu_lru : &e->ssd_lru;
}

static unsigned on_list(const mfd_entry_t *e, int list)
{
    return list == MFD_LRU_HOST ? e->on_host_lru : list == MFD_LRU_GPU ? e->on_gpu_lru
                                                                       : e->on_ssd_lru;
}

static void set_on_list(mfd_entry_t *e, int list, unsigned v)
{
    if (list == MFD_LRU_HOST)
        e->on_host_lru = v;
    else if (list == MFD_LRU_GPU)
        e->on_gpu_lru = v;
    else
        e->on_ssd_lru = v;
}

void mfd_lru_add(mfd_index_t *ix, int list, mfd_entry_t *e)
{
    if (on_list(e, list))
        return;
    mfd_lru_link_t *l = link_of(e, list);
    l->prev = NULL;
    l->next = ix->lru_head[list];
    if (l->next)
        link_of(l->next, list)->prev = e;
    else
        ix->lru_tail[list] = e;
    ix->lru_head[list] = e;
    set_on_list(e, list, 1);
}

void mfd_lru_remove(mfd_index_t *ix, int list, mfd_entry_t *e)
{
    if (!on_list(e, list))
        return;
    mfd_lru_link_t *l = link_of(e, list);
    if (l->prev)
        link_of(l->prev, list)->next = l->next;
    else
        ix->lru_head[list] = l->next;
    if (l->next)
        link_of(l->next, list)->prev = l->prev;
    else
        ix->lru_tail[list] = l->prev;
    l->prev = l->next = NULL;
    set_on_list(e, list, 0);
}

void mfd_lru_touch(mfd_index_t *ix, int list, mfd_entry_t *e)
{
    if (!on_list(e, list) || ix->lru_head[list] == e)
        return;
    mfd_lru_remove(ix, list, e);
    mfd_lru_add(ix, list, e);
}

mfd_entry_t *mfd_lru_coldest(mfd_index_t *ix, int list)
{
    return ix->lru_tail[list];
}

mfd_entry_t *mfd_lru_warmer(const mfd_entry_t *e, int list)
{
    return list == MFD_LRU_HOST ? e->host_lru.prev
           : list == MFD_LRU_GPU ? e->gpu_lru.prev
                                 : e->ssd_lru.prev;
}

/* ---- blocks ----------------------------------------------------------------------- */

static uint32_t key_layer(const mfd_entry_t *e)
{
    const uint8_t *l = e->key.b + e->key.len - 20;
    return ((uint32_t)l[0] << 24) | ((uint32_t)l[1] << 16) | ((uint32_t)l[2] << 8) | l[3];
}

size_t mfd_bkey_of(const uint8_t *key, size_t len, uint8_t out[MFD_BKEY_MAX])
{
    memcpy(out, key, len - 20);
    memcpy(out + len - 20, key + len - 16, 16);
    return len - 4;
}

const mfd_block_t *mfd_index_block_find(const mfd_index_t *ix, const uint8_t *bkey,
                                        size_t len)
{
    uint64_t h = XXH3_64bits(bkey, len);
    for (mfd_block_t *b = ix->bbuckets[h & (ix->n_bbuckets - 1)]; b; b = b->hnext)
        if (b->khash == h && b->klen == len && memcmp(b->key, bkey, len) == 0)
            return b;
    return NULL;
}

static void block_grow(mfd_index_t *ix)
{
    size_t nb = ix->n_bbuckets * 2;
    mfd_block_t **v = calloc(nb, sizeof(*v));
    if (!v)
        return; /* longer chains, still correct */
    for (size_t i = 0; i < ix->n_bbuckets; i++) {
        for (mfd_block_t *b = ix->bbuckets[i], *n; b; b = n) {
            n = b->hnext;
            b->hnext = v[b->khash & (nb - 1)];
            v[b->khash & (nb - 1)] = b;
        }
    }
    free(ix->bbuckets);
    ix->bbuckets = v;
    ix->n_bbuckets = nb;
}

/* Index of the first slot of b whose layer is >= layer. */
static uint32_t slot_lower(const mfd_block_t *b, uint32_t layer)
{
    uint32_t lo = 0, hi = b->n_slots;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (b->slots[mid].layer < layer)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* 0 when out of memory (e then stays out of b's slots). */
static int slot_add(mfd_index_t *ix, mfd_block_t *b, mfd_entry_t *e)
{
    (void)ix;
    if (b->n_slots == b->cap_slots) {
        uint32_t cap = b->cap_slots ? b->cap_slots * 2 : 8;
        mfd_bslot_t *v = realloc(b->slots, cap * sizeof(*v));
        if (!v)
            return 0;
        b->slots = v;
        b->cap_slots = cap;
    }
    uint32_t layer = key_layer(e), i = slot_lower(b, layer);
    memmove(b->slots + i + 1, b->slots + i, (b->n_slots - i) * sizeof(*b->slots));
    b->slots[i] = (mfd_bslot_t){layer, e};
    b->n_slots++;
    return 1;
}

/* 0 when e was not in b's slots. */
static int slot_remove(mfd_block_t *b, mfd_entry_t *e)
{
    uint32_t i = slot_lower(b, key_layer(e));
    if (i >= b->n_slots || b->slots[i].e != e)
        return 0;
    memmove(b->slots + i, b->slots + i + 1, (b->n_slots - i - 1) * sizeof(*b->slots));
    b->n_slots--;
    return 1;
}

/* Out of memory leaves e without a block: lookups then miss it (never a false hit), and
 * block-wise finds fall back to the entry table (unslotted). */
static void block_attach(mfd_index_t *ix, mfd_entry_t *e)
{
    uint8_t bk[MFD_BKEY_MAX];
    size_t len = mfd_bkey_of(e->key.b, e->key.len, bk);
    mfd_block_t *b = (mfd_block_t *)mfd_index_block_find(ix, bk, len);
    if (!b) {
        b = calloc(1, sizeof(*b) + len);
        if (!b) {
            ix->unslotted++;
            return;
        }
        b->khash = XXH3_64bits(bk, len);
        b->klen = (uint16_t)len;
        memcpy(b->key, bk, len);
        if (ix->bcount + 1 > ix->n_bbuckets)
            block_grow(ix);
        size_t i = b->khash & (ix->n_bbuckets - 1);
        b->hnext = ix->bbuckets[i];
        ix->bbuckets[i] = b;
        ix->bcount++;
    }
    b->n_entries++;
    e->bnode = b;
    if (!slot_add(ix, b, e))
        ix->unslotted++;
}

static void block_detach(mfd_index_t *ix, mfd_entry_t *e)
{
    mfd_block_t *b = e->bnode;
    if (!b) {
        ix->unslotted--;
        return;
    }
    if (!slot_remove(b, e))
        ix->unslotted--;
    e->bnode = NULL;
    uint32_t layer = key_layer(e);
    if (layer < MFD_BLOCK_LAYERS)
        b->layers[layer / 64] &= ~(1ull << (layer % 64));
    if (--b->n_entries)
        return;
    mfd_block_t **pp = &ix->bbuckets[b->khash & (ix->n_bbuckets - 1)];
    while (*pp && *pp != b)
        pp = &(*pp)->hnext;
    if (*pp) {
        *pp = b->hnext;
        ix->bcount--;
    }
    free(b->tokens);
    free(b->slots);
    free(b);
}

mfd_entry_t *mfd_index_block_entry(mfd_index_t *ix, const mfd_block_t *b, uint32_t layer,
                                   const mfd_key_t *key)
{
    if (ix->unslotted)
        return mfd_index_find(ix, key->b, key->len);
    if (!b)
        return NULL;
    uint32_t i = slot_lower(b, layer);
    return i < b->n_slots && b->slots[i].layer == layer ? b->slots[i].e : NULL;
}

int mfd_block_matches(const mfd_block_t *b, uint32_t block_size, const uint8_t parent[16],
                      const uint32_t *tokens)
{
    return b->block_size && b->block_size == block_size && memcmp(b->parent, parent, 16) == 0 &&
           memcmp(b->tokens, tokens, (size_t)block_size * sizeof(uint32_t)) == 0;
}

int mfd_block_has_layer(const mfd_block_t *b, uint32_t layer)
{
    return layer < MFD_BLOCK_LAYERS && ((b->layers[layer / 64] >> (layer % 64)) & 1u);
}

void mfd_index_block_note(mfd_index_t *ix, mfd_entry_t *e, uint32_t block_size,
                          const uint8_t parent[16], const uint32_t *tokens)
{
    (void)ix;
    mfd_block_t *b = e->bnode;
    uint32_t layer = key_layer(e);
    if (!e->linked || !b || layer >= MFD_BLOCK_LAYERS || block_size == 0)
        return;
    int marked = 0;
    for (size_t w = 0; w < MFD_BLOCK_LAYERS / 64; w++)
        marked |= b->layers[w] != 0;
    if (!marked && !mfd_block_matches(b, block_size, parent, tokens)) {
        /* Nothing depends on the old record (none, or its rows are gone): take this one. */
        uint32_t *t = realloc(b->tokens, (size_t)block_size * sizeof(uint32_t));
        if (!t)
            return;
        memcpy(t, tokens, (size_t)block_size * sizeof(uint32_t));
        b->tokens = t;
        b->block_size = block_size;
        memcpy(b->parent, parent, 16);
    }
    if (mfd_block_matches(b, block_size, parent, tokens))
        b->layers[layer / 64] |= 1ull << (layer % 64);
}

size_t mfd_index_block_count(const mfd_index_t *ix)
{
    return ix->bcount;
}

/* ---- collection --------------------------------------------------------------------- */

mf_status_t mfd_index_collect(mfd_index_t *ix, const uint8_t *prefix, size_t prefix_len,
                              mfd_entry_t ***out, size_t *n_out)
{
    size_t cap = 64, n = 0;
    mfd_entry_t **v = malloc(cap * sizeof(*v));
    if (!v)
        return MF_RESOURCE_EXHAUSTED;
    for (mfd_entry_t *e = mfd_index_seek(ix, prefix, prefix_len, 1);
         e && e->key.len >= prefix_len && memcmp(e->key.b, prefix, prefix_len) == 0;
         e = mfd_index_next(e)) {
        if (n == cap) {
            mfd_entry_t **nv = realloc(v, cap * 2 * sizeof(*v));
            if (!nv) {
                free(v);
                return MF_RESOURCE_EXHAUSTED;
            }
            v = nv;
            cap *= 2;
        }
        v[n++] = e;
    }
    *out = v;
    *n_out = n;
    return MF_OK;
}
