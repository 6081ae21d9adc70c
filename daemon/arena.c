/* arena — memfd region + the offset allocator (see arena.h). */
#include "arena.h"
#include "log.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

struct mfd_arena {
    int fd;
    uint8_t *base;
    mfd_oalloc_t *alloc;
};

mf_status_t mfd_arena_create(uint64_t bytes, mfd_arena_t **out)
{
    bytes = mfd_arena_round(bytes);
    if (bytes == 0)
        return MF_INVALID_ARGUMENT;
    mfd_arena_t *a = calloc(1, sizeof(*a));
    if (!a || mfd_oalloc_create(bytes, &a->alloc) != MF_OK)
        goto fail_alloc;
    a->fd = memfd_create("mapflowd-host-arena", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (a->fd < 0) {
        mfd_error("arena: memfd_create: %s", strerror(errno));
        goto fail_alloc;
    }
    if (ftruncate(a->fd, (off_t)bytes) != 0) {
        mfd_error("arena: ftruncate %llu: %s", (unsigned long long)bytes, strerror(errno));
        goto fail_fd;
    }
    /* Clients get this fd: they must not be able to shrink it under us (SIGBUS). */
    if (fcntl(a->fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0)
        mfd_warn("arena: sealing the memfd failed: %s", strerror(errno));
    a->base = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, a->fd, 0);
    if (a->base == MAP_FAILED) {
        mfd_error("arena: mmap %llu: %s", (unsigned long long)bytes, strerror(errno));
        goto fail_fd;
    }
    *out = a;
    return MF_OK;

fail_fd:
    close(a->fd);
fail_alloc:
    if (a)
        mfd_oalloc_destroy(a->alloc);
    free(a);
    return MF_RESOURCE_EXHAUSTED;
}

void mfd_arena_destroy(mfd_arena_t *a)
{
    if (!a)
        return;
    munmap(a->base, mfd_oalloc_capacity(a->alloc));
    mfd_oalloc_destroy(a->alloc);
    close(a->fd);
    free(a);
}

mf_status_t mfd_arena_alloc(mfd_arena_t *a, uint64_t size, mfd_ablock_t **blk)
{
    return mfd_oalloc_alloc(a->alloc, size, blk);
}

void mfd_arena_free(mfd_arena_t *a, mfd_ablock_t *blk)
{
    mfd_oalloc_free(a->alloc, blk);
}

uint8_t *mfd_arena_base(const mfd_arena_t *a) { return a->base; }
int mfd_arena_fd(const mfd_arena_t *a) { return a->fd; }
uint64_t mfd_arena_capacity(const mfd_arena_t *a) { return mfd_oalloc_capacity(a->alloc); }
uint64_t mfd_arena_used(const mfd_arena_t *a) { return mfd_oalloc_used(a->alloc); }
uint64_t mfd_arena_largest_free(const mfd_arena_t *a) { return mfd_oalloc_largest_free(a->alloc); }
size_t mfd_arena_free_blocks(const mfd_arena_t *a) { return mfd_oalloc_free_blocks(a->alloc); }
