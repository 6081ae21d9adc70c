/*
 * arena_ops — the three ways rows reach the daemon's host arena (channel.h,
 * mf__arena_ops_t), so that put and get steps (calls.c) do not branch on the transport:
 * the arena mapped here (memcpy; device rows copied straight from the device), the
 * daemon's arena over UCX (one-sided RMA, device rows staged through host memory first),
 * and none (a TCP channel, or a unix one that did not ask for the arena).
 *
 * Ownership: nothing; the ops use the op's connection (mf__op_conn) and the channel's
 * CUDA device. Thread safety: the I/O thread, inside a step (as the steps themselves).
 */
#include <stdlib.h>
#include <string.h>

#include "channel.h"

static mf_status_t mapped_write(mf__op_t *op, uint64_t off, const void *src, size_t len,
                                int on_device)
{
    uint8_t *dst = mf__op_conn(op)->arena + off;
    if (on_device)
        return mf__gpu_copy(op->ch->gpu, MF__DTOH, (uintptr_t)dst, (uintptr_t)src, len,
                            op->err, sizeof(op->err));
    memcpy(dst, src, len);
    return MF_OK;
}

static mf_status_t mapped_read(mf__op_t *op, const mf__ucx_rma_t *v, size_t n)
{
    const uint8_t *arena = mf__op_conn(op)->arena;
    for (size_t i = 0; i < n; i++)
        memcpy(v[i].local, arena + v[i].off, v[i].len);
    return MF_OK;
}

/* One-sided write, flushed: the bytes are there before the PutCommit that follows. */
static mf_status_t ucx_write(mf__op_t *op, uint64_t off, const void *src, size_t len,
                             int on_device)
{
    void *stage = NULL;
    if (on_device) { /* RMA reads host memory: bring the row over first */
        stage = aligned_alloc(MF_ROW_ALIGN, (len + 15) & ~(size_t)15);
        if (!stage)
            return (mf_status_t)mf__op_error(op, MF_RESOURCE_EXHAUSTED, "out of memory");
        mf_status_t st = mf__gpu_copy(op->ch->gpu, MF__DTOH, (uintptr_t)stage,
                                      (uintptr_t)src, len, op->err, sizeof(op->err));
        if (st != MF_OK) {
            free(stage);
            return st;
        }
        src = stage;
    }
    mf__ucx_rma_t v = {off, (void *)src, len};
    mf_status_t st = mf__ucx_put(mf__op_conn(op)->ucx, &v, 1, op->deadline, op->err,
                                 sizeof(op->err));
    free(stage);
    return st;
}

static mf_status_t ucx_read(mf__op_t *op, const mf__ucx_rma_t *v, size_t n)
{
    return mf__ucx_get(mf__op_conn(op)->ucx, v, n, op->deadline, op->err, sizeof(op->err));
}

/* Never reached with bytes to move (arena_reach is 0), kept so no caller tests for NULL. */
static mf_status_t none_write(mf__op_t *op, uint64_t off, const void *src, size_t len,
                              int on_device)
{
    (void)off, (void)src, (void)len, (void)on_device;
    return (mf_status_t)mf__op_error(op, MF_INTERNAL, "this connection has no host arena");
}

static mf_status_t none_read(mf__op_t *op, const mf__ucx_rma_t *v, size_t n)
{
    (void)v;
    return n ? (mf_status_t)mf__op_error(op, MF_INTERNAL, "this connection has no host arena")
             : MF_OK;
}

static const mf__arena_ops_t mapped_ops = {"mapped", 0, mapped_write, mapped_read};
static const mf__arena_ops_t ucx_ops = {"ucx", 1, ucx_write, ucx_read};
static const mf__arena_ops_t none_ops = {"none", 0, none_write, none_read};

const mf__arena_ops_t *mf__arena_ops_pick(const mf__conn_t *c, uint64_t *reach)
{
    if (c->ucx) {
        *reach = c->far.remote_bytes;
        return &ucx_ops;
    }
    if (c->arena) {
        *reach = c->arena_bytes;
        return &mapped_ops;
    }
    *reach = 0;
    return &none_ops;
}
