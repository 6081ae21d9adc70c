/* oalloc — TLSF-style offset allocator (see oalloc.h). */
#include "oalloc.h"

#include <stdlib.h>

#define N_BINS 64
#define BIN_SCAN 16   /* nodes looked at in the exact bin before moving up */

struct mfd_ablock {
    uint64_t off, size;
    mfd_ablock_t *prev, *next;     /* address order, every block */
    mfd_ablock_t *fprev, *fnext;   /* bin list, free blocks only */
    int free;
};

struct mfd_oalloc {
    uint64_t cap, used;
    size_t n_free;
    uint64_t bitmap;               /* bit b set = bin b non-empty */
    mfd_ablock_t *bins[N_BINS];
    mfd_ablock_t *head;
};

static int bin_of(uint64_t size)
{
    return 63 - __builtin_clzll(size);
}

static void bin_insert(mfd_oalloc_t *a, mfd_ablock_t *b)
{
    int i = bin_of(b->size);
    b->free = 1;
    b->fprev = NULL;
    b->fnext = a->bins[i];
    if (b->fnext)
        b->fnext->fprev = b;
    a->bins[i] = b;
    a->bitmap |= 1ull << i;
    a->n_free++;
}

static void bin_remove(mfd_oalloc_t *a, mfd_ablock_t *b)
{
    int i = bin_of(b->size);
    if (b->fprev)
        b->fprev->fnext = b->fnext;
    else
        a->bins[i] = b->fnext;
    if (b->fnext)
        b->fnext->fprev = b->fprev;
    if (!a->bins[i])
        a->bitmap &= ~(1ull << i);
    b->free = 0;
    b->fprev = b->fnext = NULL;
    a->n_free--;
}

mf_status_t mfd_oalloc_create(uint64_t cap, mfd_oalloc_t **out)
{
    if (cap == 0 || cap != mfd_arena_round(cap))
        return MF_INVALID_ARGUMENT;
    mfd_oalloc_t *a = calloc(1, sizeof(*a));
    mfd_ablock_t *b = calloc(1, sizeof(*b));
    if (!a || !b) {
        free(a);
        free(b);
        return MF_RESOURCE_EXHAUSTED;
    }
    a->cap = cap;
    b->off = 0;
    b->size = cap;
    a->head = b;
    bin_insert(a, b);
    *out = a;
    return MF_OK;
}

void mfd_oalloc_destroy(mfd_oalloc_t *a)
{
    if (!a)
        return;
    for (mfd_ablock_t *b = a->head, *n; b; b = n) {
        n = b->next;
        free(b);
    }
    free(a);
}

static mfd_ablock_t *find_fit(mfd_oalloc_t *a, uint64_t size)
{
    int i = bin_of(size);
    int scanned = 0;
    for (mfd_ablock_t *b = a->bins[i]; b && scanned < BIN_SCAN; b = b->fnext, scanned++)
        if (b->size >= size)
            return b;
    /* Any block of a higher bin is at least 2^(i+1) > size. */
    uint64_t higher = i + 1 < N_BINS ? a->bitmap & (~0ull << (i + 1)) : 0;
    if (higher)
        return a->bins[__builtin_ctzll(higher)];
    /* Exact bin beyond the scan limit: finish the scan rather than fail. */
    for (mfd_ablock_t *b = a->bins[i]; b; b = b->fnext)
        if (b->size >= size)
            return b;
    return NULL;
}

mf_status_t mfd_oalloc_alloc(mfd_oalloc_t *a, uint64_t size, mfd_ablock_t **blk)
{
    if (size == 0 || size > a->cap)
        return size ? MF_RESOURCE_EXHAUSTED : MF_INVALID_ARGUMENT;
    size = mfd_arena_round(size);
    mfd_ablock_t *b = find_fit(a, size);
    if (!b)
        return MF_RESOURCE_EXHAUSTED;
    if (b->size > size) {
        mfd_ablock_t *rest = calloc(1, sizeof(*rest));
        if (!rest)
            return MF_RESOURCE_EXHAUSTED;
        bin_remove(a, b);
        rest->off = b->off + size;
        rest->size = b->size - size;
        rest->prev = b;
        rest->next = b->next;
        if (b->next)
            b->next->prev = rest;
        b->next = rest;
        b->size = size;
        bin_insert(a, rest);
    } else {
        bin_remove(a, b);
    }
    a->used += b->size;
    *blk = b;
    return MF_OK;
}

/* Absorbs `n` (free, right after `b`) into `b`. */
static void merge_next(mfd_oalloc_t *a, mfd_ablock_t *b, mfd_ablock_t *n)
{
    bin_remove(a, n);
    b->size += n->size;
    b->next = n->next;
    if (n->next)
        n->next->prev = b;
    free(n);
}

void mfd_oalloc_free(mfd_oalloc_t *a, mfd_ablock_t *b)
{
    if (!b)
        return;
    a->used -= b->size;
    if (b->next && b->next->free)
        merge_next(a, b, b->next);
    if (b->prev && b->prev->free) {
        mfd_ablock_t *p = b->prev;
        bin_remove(a, p);
        /* p absorbs b: b is not in a bin, so unlink it by hand. */
        p->size += b->size;
        p->next = b->next;
        if (b->next)
            b->next->prev = p;
        free(b);
        b = p;
    }
    bin_insert(a, b);
}

mf_status_t mfd_oalloc_split(mfd_oalloc_t *a, mfd_ablock_t *b, uint64_t at,
                             mfd_ablock_t **rest)
{
    (void)a; /* used bytes do not change: both halves stay used */
    if (!b || b->free || at == 0 || at >= b->size || at != mfd_arena_round(at))
        return MF_INVALID_ARGUMENT;
    mfd_ablock_t *r = calloc(1, sizeof(*r));
    if (!r)
        return MF_RESOURCE_EXHAUSTED;
    r->off = b->off + at;
    r->size = b->size - at;
    r->prev = b;
    r->next = b->next;
    if (b->next)
        b->next->prev = r;
    b->next = r;
    b->size = at;
    *rest = r;
    return MF_OK;
}

uint64_t mfd_ablock_offset(const mfd_ablock_t *b) { return b->off; }
uint64_t mfd_ablock_size(const mfd_ablock_t *b) { return b->size; }
uint64_t mfd_oalloc_capacity(const mfd_oalloc_t *a) { return a->cap; }
uint64_t mfd_oalloc_used(const mfd_oalloc_t *a) { return a->used; }
size_t mfd_oalloc_free_blocks(const mfd_oalloc_t *a) { return a->n_free; }

uint64_t mfd_oalloc_largest_free(const mfd_oalloc_t *a)
{
    if (!a->bitmap)
        return 0;
    int top = 63 - __builtin_clzll(a->bitmap);
    uint64_t best = 0;
    for (mfd_ablock_t *b = a->bins[top]; b; b = b->fnext)
        if (b->size > best)
            best = b->size;
    return best;
}
