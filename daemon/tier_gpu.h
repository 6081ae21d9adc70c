/*
 * tier_gpu — the GPU tier's memory (DESIGN §7): one cuMemAlloc arena of gpu_bytes per
 * device named by gpu_devices, each with the offset allocator the host arena uses
 * (oalloc.h) and a CUDA IPC handle of its base that HelloReply hands to local clients.
 * Every CUDA call goes through proto/mf_cudrv (dlopen; no link-time CUDA), so a daemon
 * without a driver or a GPU runs unchanged with the tier off and says why.
 *
 * Copies are synchronous (cuMemcpyHtoD / DtoH on the loop thread, the arena's primary
 * context made current first): simple and correct, but each one blocks the loop for
 * the PCIe transfer (a 1 MiB row is ~50 µs on an H200). Streams with callbacks (DESIGN
 * §7) are the next step if puts or demotions of large rows show up in loop latency.
 *
 * Commit validation (mfd_gpu_check_row): by default every row is copied into a pinned
 * staging buffer and validated on the host (faster on the H200, and no kernels of ours
 * time-slicing the GPU with the workers). With MFD_GPU_VERIFY=gpu, rows of at least
 * MF_ROW_HEADER + MFD_GPU_VERIFY_MIN_TILES bytes are checksummed ON the GPU by the kernels
 * of gpu_verify.cu
 * (PTX embedded at build time, loaded per arena context with cuModuleLoadData, run on a
 * non-blocking stream of that context); only the row's first 64 KiB are copied DtoH on
 * the same stream (pinned), then ONE stream synchronize per commit (a second copy only
 * when the prefix up to the tiles — header, model, tokens, column tables, masses, scales:
 * what the host decoder reads — is longer). Without PTX, when the module does not load (the
 * fake driver), without MFD_GPU_VERIFY=gpu in the environment, or after a kernel failure,
 * rows are copied whole into one reused pinned staging buffer and validated on the host;
 * `verify_why` says why.
 *
 * Host pinning (mfd_gpu_pin_host, config host_pin): the host arena is registered with the
 * driver once (cuMemHostRegister, PORTABLE: pinned for every arena's context), so the
 * DtoH of a staged or demoted row and the HtoD of a promoted one are direct DMA instead
 * of the driver's pageable bounce (~1 GB/s measured on the H200 for the memfd arena).
 * Registering faults in and locks every page (seconds for tens of GB), so it runs on a
 * thread of its own started at open; copies before it finishes are pageable, and a
 * failure is logged and leaves the arena pageable. mfd_gpu_close joins that thread and
 * unregisters before the arena may be unmapped.
 *
 * Ownership: the tier owns the device allocations, the primary-context references, the
 * modules, streams, scratch and staging buffers, and the block handles (valid until
 * mfd_gpu_free). Thread safety: loop thread only (the pinning thread touches only the
 * pin_* fields and the driver; host_pinned is atomic).
 */
#ifndef MFD_TIER_GPU_H
#define MFD_TIER_GPU_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include "mf_cudrv.h"
#include "mf_status.h"
#include "oalloc.h"

#define MFD_GPU_MAX_ARENAS 64

typedef struct mfd_gpu_arena {
    uint32_t index;                 /* position in the tier (RowRef.gpu_arena) */
    int ordinal;                    /* the daemon's CUDA ordinal */
    mf_cu_device_t dev;
    mf_cu_context_t ctx;            /* primary context, retained */
    mf_cu_deviceptr_t base;
    uint64_t bytes;
    mfd_oalloc_t *alloc;
    mf_cu_ipc_mem_handle_t ipc;
    char pci[32];
    uint8_t uuid[16];
    uint64_t entries;               /* rows resident (the store counts them) */
    /* Validation kernels in this arena's context (mod NULL: host validation). */
    mf_cu_module_t mod;
    mf_cu_function_t f_blocks, f_final;
    /* A region's rows in one launch each (NULL: per-row launches; also when their start-up
     * self-test against the host's XXH3 failed). */
    mf_cu_function_t f_rows_blocks, f_rows_final;
    mf_cu_stream_t stream;
    mf_cu_deviceptr_t scratch;      /* [0]: the checksum out; then 64 B per 1 KiB block */
    uint64_t scratch_cap;
} mfd_gpu_arena_t;

typedef struct mfd_gpu {
    const mf_cudrv_t *cu;
    size_t n;
    int kernels;                    /* 1: the checksum kernels are loaded (regions use them) */
    int verify_gpu;                 /* 1: single-row puts are checksummed on the GPU too */
    char verify_why[200];           /* why not (host validation) */
    char region_why[200];           /* why put regions are validated on the host */
    uint64_t *rc_out;               /* pinned: a region chunk's checksums (MFD_GPU_RC_ROWS) */
    uint64_t *rc_tab;               /* pinned: its rows' (offset, length, first block) */
    uint8_t *stage;                 /* reused DtoH staging (pinned when the driver gave it) */
    size_t stage_cap;
    int stage_pinned;
    uint64_t *out;                  /* pinned 8 bytes: the kernel's checksum */
    /* Host arena registration (mfd_gpu_pin_host). */
    pthread_t pin_thread;
    int pin_started;                /* pin_thread must be joined */
    void *pin_base;
    size_t pin_bytes;
    atomic_int host_pinned;         /* 0 not (yet), 1 registered, -1 failed */
    mfd_gpu_arena_t a[MFD_GPU_MAX_ARENAS];
} mfd_gpu_t;

/* Rows shorter than the header plus this are validated on the host (a copy of a small row
 * costs less than the kernels' round trip). */
#define MFD_GPU_VERIFY_MIN_TILES (16u << 10)

/* The PTX of gpu_verify.cu built into this binary (NUL-terminated), or NULL with *len 0
 * when mapflowd was built without nvcc. */
const char *mfd_gpu_verify_ptx(size_t *len);

/*
 * Opens the tier: the driver loads, the devices of `devices` ("all" or "0,2") exist,
 * and gpu_bytes could be allocated on each. MF_UNAVAILABLE (tier off) with `why` when
 * gpu_bytes is 0 or anything fails (nothing stays allocated then); MF_INVALID_ARGUMENT
 * for a malformed device list.
 */
mf_status_t mfd_gpu_open(uint64_t gpu_bytes, const char *devices, mfd_gpu_t **out,
                         char *why, size_t whylen);
void mfd_gpu_close(mfd_gpu_t *g);

/* A block of `size` in arena `arena`. MF_RESOURCE_EXHAUSTED when it does not fit. */
mf_status_t mfd_gpu_alloc(mfd_gpu_t *g, uint32_t arena, uint64_t size, mfd_ablock_t **blk);
void mfd_gpu_free(mfd_gpu_t *g, uint32_t arena, mfd_ablock_t *blk);
/* Cuts blk at `at` (mfd_oalloc_split): a put region's block becomes one block per row. */
mf_status_t mfd_gpu_split(mfd_gpu_t *g, uint32_t arena, mfd_ablock_t *blk, uint64_t at,
                          mfd_ablock_t **rest);

/* Synchronous copies into / out of a block (offset within the block). MF_INTERNAL with
 * the CUDA error logged when the driver refuses. */
mf_status_t mfd_gpu_write(mfd_gpu_t *g, uint32_t arena, const mfd_ablock_t *blk,
                          const void *src, size_t n);
mf_status_t mfd_gpu_read(mfd_gpu_t *g, uint32_t arena, const mfd_ablock_t *blk, void *dst,
                         size_t n);

/*
 * Brings a committed row's bytes to the host for validation. *bytes (the tier's staging
 * buffer: valid until the next call) holds the row's first *have bytes: the whole row
 * (*gpu_sum_valid 0: validate on the host, checksum included) or, on the GPU path, its
 * first bytes (at least its prefix up to the tiles) with *gpu_sum the row checksum computed on the GPU
 * (*gpu_sum_valid 1: decode with MF_ROW_NO_CHECKSUM and compare *gpu_sum to the header's).
 * A row whose header does not describe `size` bytes comes back with only its first bytes
 * (the decoder refuses it from the header). MF_INTERNAL when a copy fails.
 */
mf_status_t mfd_gpu_check_row(mfd_gpu_t *g, uint32_t arena, const mfd_ablock_t *blk,
                              uint64_t size, const uint8_t **bytes, size_t *have,
                              uint64_t *gpu_sum, int *gpu_sum_valid);

/*
 * A put region's rows (one layer, written in place by the client): the host gets what the
 * decoder reads and nothing more. With the kernels loaded, each row longer than
 * MFD_GPU_RC_HEAD has its checksum computed on the GPU on the arena's verify stream — all
 * of a chunk's rows in one launch of each batched kernel (mfd_verify_rows_blocks /
 * _final, from a table of (offset, length, first block) copied HtoD), or both per-row
 * kernels per row when the batched ones are missing, failed their start-up self-test
 * against the host's XXH3, or MFD_REGION_BATCHED=0 — while its first MFD_GPU_RC_HEAD bytes
 * are copied out (shorter rows are copied whole and checksummed on the host: their bytes
 * are what the decoder reads anyway, and a launch costs more); then the rest of each
 * row's prefix up to its tiles (header, model, tokens, column tables, masses, scales) is
 * copied, adjacent prefixes in one copy; two stream synchronizes per chunk. Without the
 * kernels (no PTX, the fake driver by default, MFD_GPU_VERIFY=host, or a kernel failure)
 * rows are copied whole (adjacent rows in one copy) and checked on the host. A chunk is at
 * most MFD_GPU_RC_ROWS rows and MFD_GPU_RC_BYTES of staging (one row at least); the caller
 * validates the chunk's rows
 * before the next call, which reuses the staging buffer.
 */
#define MFD_GPU_RC_ROWS 4096u
#define MFD_GPU_RC_BYTES (64u << 20)
#define MFD_GPU_RC_HEAD 4096u        /* first bytes copied with the kernels */

typedef struct mfd_gpu_rowcheck {
    uint64_t off, size;             /* in: the row's offset in the arena and its length */
    const uint8_t *bytes;           /* out: its first `have` bytes (staging) */
    size_t have;
    uint64_t sum;                   /* the checksum computed on the GPU, when sum_valid */
    int sum_valid;
    mf_status_t st;                 /* MF_OK, or MF_INTERNAL (a copy failed; why says so) */
    const char *why;
} mfd_gpu_rowcheck_t;

/* Checks rows[0..n) of arena `arena` (offsets inside it); returns how many (≥ 1) this
 * chunk covered, their out fields filled. */
size_t mfd_gpu_check_rows(mfd_gpu_t *g, uint32_t arena, mfd_gpu_rowcheck_t *rows, size_t n);

/* Starts registering [base, base + bytes) (the host arena) with the driver, PORTABLE, on a
 * thread of its own; the outcome and the time it took are logged. Once per tier. */
void mfd_gpu_pin_host(mfd_gpu_t *g, void *base, size_t bytes);

uint64_t mfd_gpu_used(const mfd_gpu_t *g);
uint64_t mfd_gpu_capacity(const mfd_gpu_t *g);

#endif /* MFD_TIER_GPU_H */
