/*
 * arena — the host tier's memory: one memfd shared-memory region (passed to same-node
 * clients over the unix socket with SCM_RIGHTS) and an offset allocator over it.
 *
 * Allocator: a TLSF-style good-fit allocator. Every block (free or used) is an
 * out-of-band node in an address-ordered list, so freeing coalesces with both
 * neighbours in O(1); free blocks also sit in 64 power-of-two size bins with a
 * bitmap, so allocation is O(1) apart from a short bounded scan of the exact bin.
 * Why: rows are variable-sized (a few KiB for masks to MiBs for fp16 tiles); a slab
 * allocator would waste memory across size classes and a buddy allocator up to 2x,
 * and the metadata must live outside the region because clients can write into it.
 * Offsets and sizes are multiples of MFD_ARENA_ALIGN (64: a cache line, and the
 * 16-byte alignment rows need).
 *
 * Security: the memfd is sealed against shrinking and growing (a client truncating it
 * would SIGBUS the daemon). Same-node clients that hold the socket can read and write
 * the whole region: isolation between namespaces is enforced by the API (offsets are
 * only handed out for the caller's own keys), not against a hostile local process.
 *
 * Ownership: the arena owns the fd, the mapping and every block node; a block handle
 * stays valid until mfd_arena_free. Thread safety: allocation and free belong to the
 * loop thread; other threads may read/write the bytes of a block they were handed
 * while the loop keeps it allocated.
 */
#ifndef MFD_ARENA_H
#define MFD_ARENA_H

#include <stddef.h>
#include <stdint.h>
#include "mf_status.h"

#define MFD_ARENA_ALIGN 64u

typedef struct mfd_arena mfd_arena_t;
typedef struct mfd_ablock mfd_ablock_t;

/* Creates a sealed memfd of `bytes` (rounded up to MFD_ARENA_ALIGN) and maps it. */
mf_status_t mfd_arena_create(uint64_t bytes, mfd_arena_t **out);
void mfd_arena_destroy(mfd_arena_t *a);

/* MF_RESOURCE_EXHAUSTED when no free block is large enough (size 0 is invalid). */
mf_status_t mfd_arena_alloc(mfd_arena_t *a, uint64_t size, mfd_ablock_t **blk);
void mfd_arena_free(mfd_arena_t *a, mfd_ablock_t *blk);

uint64_t mfd_ablock_offset(const mfd_ablock_t *b);
uint64_t mfd_ablock_size(const mfd_ablock_t *b);      /* rounded size */
static inline uint64_t mfd_arena_round(uint64_t n)
{
    return (n + MFD_ARENA_ALIGN - 1) & ~(uint64_t)(MFD_ARENA_ALIGN - 1);
}

uint8_t *mfd_arena_base(const mfd_arena_t *a);
int mfd_arena_fd(const mfd_arena_t *a);
uint64_t mfd_arena_capacity(const mfd_arena_t *a);
uint64_t mfd_arena_used(const mfd_arena_t *a);
uint64_t mfd_arena_largest_free(const mfd_arena_t *a);
size_t mfd_arena_free_blocks(const mfd_arena_t *a);  /* fragmentation, for tests/stats */

#endif /* MFD_ARENA_H */
