/*
 * oalloc — the offset allocator every arena uses (the host tier's memfd arena, arena.h,
 * and the GPU tier's cuMemAlloc arenas, tier_gpu.h): hands out [offset, offset + size)
 * ranges of a region it never touches, so the same code serves host and device memory.
 *
 * A TLSF-style good-fit allocator. Every block (free or used) is an out-of-band node in
 * an address-ordered list, so freeing coalesces with both neighbours in O(1); free
 * blocks also sit in 64 power-of-two size bins with a bitmap, so allocation is O(1)
 * apart from a short bounded scan of the exact bin. Why: rows are variable-sized (a few
 * KiB for masks to MiBs for fp16 tiles); a slab allocator would waste memory across size
 * classes and a buddy allocator up to 2x, and the metadata must live outside the region
 * because clients can write into it. Offsets and sizes are multiples of MFD_ARENA_ALIGN
 * (64: a cache line, and the 16-byte alignment rows need).
 *
 * Ownership: the allocator owns every block node; a block handle stays valid until
 * mfd_oalloc_free. Thread safety: none inside; the owner (the loop thread) serialises.
 */
#ifndef MFD_OALLOC_H
#define MFD_OALLOC_H

#include <stddef.h>
#include <stdint.h>
#include "mf_status.h"

#define MFD_ARENA_ALIGN 64u

typedef struct mfd_oalloc mfd_oalloc_t;
typedef struct mfd_ablock mfd_ablock_t;

static inline uint64_t mfd_arena_round(uint64_t n)
{
    return (n + MFD_ARENA_ALIGN - 1) & ~(uint64_t)(MFD_ARENA_ALIGN - 1);
}

/* An allocator over `cap` bytes (a multiple of MFD_ARENA_ALIGN, > 0). */
mf_status_t mfd_oalloc_create(uint64_t cap, mfd_oalloc_t **out);
void mfd_oalloc_destroy(mfd_oalloc_t *o);

/* MF_RESOURCE_EXHAUSTED when no free block is large enough (size 0 is invalid). */
mf_status_t mfd_oalloc_alloc(mfd_oalloc_t *o, uint64_t size, mfd_ablock_t **blk);
void mfd_oalloc_free(mfd_oalloc_t *o, mfd_ablock_t *blk);
/* Cuts used block blk at `at` (a multiple of MFD_ARENA_ALIGN strictly inside it): blk
 * keeps [offset, offset + at), *rest gets the remainder as a used block of its own (a put
 * region becoming one block per row). MF_RESOURCE_EXHAUSTED when no node can be had,
 * MF_INVALID_ARGUMENT for a bad cut. */
mf_status_t mfd_oalloc_split(mfd_oalloc_t *o, mfd_ablock_t *blk, uint64_t at,
                             mfd_ablock_t **rest);

uint64_t mfd_ablock_offset(const mfd_ablock_t *b);
uint64_t mfd_ablock_size(const mfd_ablock_t *b);      /* rounded size */

uint64_t mfd_oalloc_capacity(const mfd_oalloc_t *o);
uint64_t mfd_oalloc_used(const mfd_oalloc_t *o);
uint64_t mfd_oalloc_largest_free(const mfd_oalloc_t *o);
size_t mfd_oalloc_free_blocks(const mfd_oalloc_t *o);

#endif /* MFD_OALLOC_H */
