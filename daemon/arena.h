/*
 * arena — the host tier's memory: one memfd shared-memory region (passed to same-node
 * clients over the unix socket with SCM_RIGHTS) with the offset allocator (oalloc.h, the
 * same one the GPU arenas use) over it.
 *
 * Security: the memfd is sealed against shrinking and growing (a client truncating it
 * would SIGBUS the daemon). Same-node clients that hold the socket can read and write
 * the whole region: isolation between namespaces is enforced by the API (offsets are
 * only handed out for the caller's own keys), not against a hostile local process.
 *
 * Ownership: the arena owns the fd, the mapping and its allocator; a block handle stays
 * valid until mfd_arena_free. Thread safety: allocation and free belong to the loop
 * thread; other threads may read/write the bytes of a block they were handed while the
 * loop keeps it allocated.
 */
#ifndef MFD_ARENA_H
#define MFD_ARENA_H

#include <stddef.h>
#include <stdint.h>
#include "mf_status.h"
#include "oalloc.h"

typedef struct mfd_arena mfd_arena_t;

/* Creates a sealed memfd of `bytes` (rounded up to MFD_ARENA_ALIGN) and maps it. */
mf_status_t mfd_arena_create(uint64_t bytes, mfd_arena_t **out);
void mfd_arena_destroy(mfd_arena_t *a);

/* MF_RESOURCE_EXHAUSTED when no free block is large enough (size 0 is invalid). */
mf_status_t mfd_arena_alloc(mfd_arena_t *a, uint64_t size, mfd_ablock_t **blk);
void mfd_arena_free(mfd_arena_t *a, mfd_ablock_t *blk);

uint8_t *mfd_arena_base(const mfd_arena_t *a);
int mfd_arena_fd(const mfd_arena_t *a);
uint64_t mfd_arena_capacity(const mfd_arena_t *a);
uint64_t mfd_arena_used(const mfd_arena_t *a);
uint64_t mfd_arena_largest_free(const mfd_arena_t *a);
size_t mfd_arena_free_blocks(const mfd_arena_t *a);  /* fragmentation, for tests/stats */

#endif /* MFD_ARENA_H */
