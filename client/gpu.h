/*
 * gpu — libmapflow's side of the daemon's GPU arenas (mapflow.h "GPU arenas"): the
 * client's CUDA device (its primary context, retained for the channel's life), the
 * arenas a HelloReply announced, checked and matched to this process's devices by PCI
 * bus id / UUID and opened with cuIpcOpenMemHandle, and the copies between host memory,
 * the caller's device memory and those arenas. Every CUDA call goes through the dlopen'ed
 * driver table (proto/mf_cudrv.h), with the device's primary context made current for
 * the call and the thread's previous context restored after it.
 *
 * Ownership: an mf__gpu_t belongs to its channel; an mf__gpu_set_t (one connection's
 * arenas) to its connection, then to the channel's retired list after a disconnect
 * (leased device views may still point into it), unmapped at channel close.
 * Thread safety: mf__gpu_t is read-only after mf__gpu_open; a set is changed only by the
 * thread that (re)connects or closes (the channel's rules), read by steps on the I/O
 * thread and, under the channel lock, by mf_channel_gpu_info. Copies may run on any
 * thread.
 */
#ifndef MF_CLIENT_GPU_H
#define MF_CLIENT_GPU_H

#include <stddef.h>
#include <stdint.h>

#include "mapflow.h"
#include "mf_cudrv.h"
#include "mf_frame.h"

#define MF__GPU_MAX_DEVICES 64
#define MF__GPU_MAX_ARENAS 64      /* more in a HelloReply are ignored */
#define MF__GPU_MAX_ARENA_BYTES (1ull << 44) /* 16 TiB: anything larger is a bad reply */

typedef struct mf__gpu_arena {
    uint32_t index;
    uint64_t bytes;
    uint8_t handle[MF_CU_IPC_HANDLE_SIZE];
    char pci[32];
    uint8_t uuid[16];
    int has_uuid;
    int valid;                  /* the announcement itself was well formed */
    mf_cu_deviceptr_t base;     /* 0 = not mapped */
    int device;                 /* this process's ordinal of its GPU, -1 = not visible */
    int peer;                   /* opened from another device than the channel's */
    char why[256];              /* why not mapped */
} mf__gpu_arena_t;

typedef struct mf__gpu_set {
    size_t n;
    mf__gpu_arena_t *a;
} mf__gpu_set_t;

typedef struct mf__gpu {
    const mf_cudrv_t *cu;       /* NULL: CUDA unusable (why) */
    int ordinal;                /* the channel's gpu_device */
    mf_cu_device_t dev;
    mf_cu_context_t ctx;        /* primary context of dev, retained */
    int n_dev;                  /* devices of this process (≤ MF__GPU_MAX_DEVICES) */
    char pci[MF__GPU_MAX_DEVICES][32];
    uint8_t uuid[MF__GPU_MAX_DEVICES][16];
    int has_uuid[MF__GPU_MAX_DEVICES];
    char why[256];
} mf__gpu_t;

/* The channel's device (gpu_device ≥ 0). NULL only when memory runs out; a device that
 * cannot be used gives an mf__gpu_t with cu NULL and why set. */
mf__gpu_t *mf__gpu_open(int ordinal);
void mf__gpu_close(mf__gpu_t *g);
int mf__gpu_usable(const mf__gpu_t *g);

/* Copies the arenas of a HelloReply into s (unmapped), checking every size: a malformed
 * announcement is kept with its why and never mapped. MF_RESOURCE_EXHAUSTED on OOM. */
mf_status_t mf__gpu_set_parse(mf__gpu_set_t *s, const Mapflow__V1__HelloReply *hr);

/* Opens every valid arena of s in g's context. A mapping in `pool` (retired sets of
 * earlier connections) with the same handle is taken over instead of opened again (the
 * same daemon after a broken connection). Arenas that fail keep their why. */
void mf__gpu_set_map(mf__gpu_t *g, mf__gpu_set_t *s, mf__gpu_set_t *const *pool,
                     size_t n_pool);

/* Closes every mapping of s and frees it (s is then empty). */
void mf__gpu_set_free(mf__gpu_t *g, mf__gpu_set_t *s);

/* The mapped arena `index` of s, or NULL. */
const mf__gpu_arena_t *mf__gpu_find(const mf__gpu_set_t *s, uint32_t index);
/* Bit i set: arena index i is mapped (PutBegin / Get gpu_mapped; indices ≥ 64 never). */
uint64_t mf__gpu_mask(const mf__gpu_set_t *s);
/* Index + 1 of the first mapped arena on g's own device (else any mapped one), 0 = none:
 * PutBegin.gpu_arena. */
uint32_t mf__gpu_preferred(const mf__gpu_t *g, const mf__gpu_set_t *s);

enum mf__gpu_copy_kind { MF__HTOD, MF__DTOH, MF__DTOD };
/* One synchronous copy in g's context; err (MF__ERR_LEN-like errlen) says why not. */
mf_status_t mf__gpu_copy(const mf__gpu_t *g, int kind, uintptr_t dst, uintptr_t src, size_t n,
                         char *err, size_t errlen);
/*
 * Writes a row into a mapped arena (src on the device: DtoD, else HtoD) and reads its
 * first bytes back: that read waits for the copy (DtoD and pageable HtoD may return
 * before it lands) and checks them against `head` (the row's first head_len bytes).
 */
mf_status_t mf__gpu_write_row(const mf__gpu_t *g, mf_cu_deviceptr_t dst, const void *src,
                              int src_on_device, size_t n, const uint8_t *head,
                              size_t head_len, char *err, size_t errlen);

/*
 * Page-locking of the mapped host arena (cuMemHostRegister, PORTABLE) so the caller's HtoD
 * copies out of staged host views (rows of arenas it could not map) are direct DMA, not the
 * driver's pageable bounce. Registering faults in and locks every page (seconds for tens of
 * GB), so it runs on a thread of its own: copies before it ends are pageable, a failure
 * leaves the arena pageable (state -1). NULL when g is unusable or memory runs out.
 * mf__gpu_pin_end joins the thread and unregisters; call it before the munmap.
 */
typedef struct mf__gpu_pin mf__gpu_pin_t;
mf__gpu_pin_t *mf__gpu_pin_start(const mf__gpu_t *g, void *p, size_t n);
void mf__gpu_pin_end(mf__gpu_pin_t *pin);
/* 0 in progress (or no pin), 1 registered, -1 failed. Any thread. */
int mf__gpu_pin_state(const mf__gpu_pin_t *pin);

/* Fills the public summary (lock held by the caller). */
void mf__gpu_info(const mf__gpu_t *g, int ordinal, const mf__gpu_set_t *s, mf_gpu_info_t *out);

#endif /* MF_CLIENT_GPU_H */
