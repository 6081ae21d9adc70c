/*
 * test_client_util.h — helpers shared by the client tests (tests/unit/test_client_*.c):
 * a seeded random map row builder (real rows, checksum and all, never zeros) and a
 * temporary directory, and the frame sender of the scripted fake daemons. Header-only so each test binary stays one .c file.
 */
#ifndef TEST_CLIENT_UTIL_H
#define TEST_CLIENT_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "mapflow.h"
#include "mf_frame.h"

/* xorshift64*: deterministic per seed. */
static inline uint64_t tc_rand(uint64_t *s)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 0x2545F4914F6CDD1Dull;
}

static inline void tc_tokens(uint32_t *t, size_t n, uint64_t seed)
{
    uint64_t s = seed | 1;
    for (size_t i = 0; i < n; i++)
        t[i] = (uint32_t)(tc_rand(&s) % 50000) + 1;
}

/*
 * Builds the row of block `block` of tokens (prefix hashed with ns/model/B) with random
 * masses, every head keeping blocks {0, block} plus a random middle block. Returns a
 * malloc'd 16-byte aligned row (size in *len), or NULL.
 */
static inline void *tc_make_row(const char *ns, const char *model, uint32_t layer,
                                uint32_t B, uint32_t heads, const uint32_t *tokens,
                                uint32_t block, mf_codec_t codec, uint64_t seed, size_t *len)
{
    mf_hash128_t *h = malloc((block + 1) * sizeof(*h));
    size_t nh = 0;
    if (!h || mf_hash_prefix(ns, model, B, tokens, (size_t)(block + 1) * B, h, block + 1, &nh) ||
        nh != block + 1) {
        free(h);
        return NULL;
    }
    uint64_t s = seed | 1;
    uint32_t cols[3], nc = 0;
    cols[nc++] = 0;
    if (block >= 2)
        cols[nc++] = 1 + (uint32_t)(tc_rand(&s) % (block - 1));
    if (block >= 1)
        cols[nc++] = block;
    uint64_t mask[3];
    uint64_t all = heads == 64 ? ~0ull : ((1ull << heads) - 1);
    for (uint32_t c = 0; c < nc; c++)
        mask[c] = (c == 0 || cols[c] == block) ? all : (all & (tc_rand(&s) | 1));
    uint32_t E = 0;
    for (uint32_t c = 0; c < nc; c++)
        E += (uint32_t)__builtin_popcountll(mask[c]);
    mf_row_spec_t spec = {
        .model = model, .layer = layer, .block_index = block, .block_size = B,
        .n_heads = heads, .codec = codec, .top_p = 0.9f,
        .parent = block ? h[block - 1] : mf_hash_root(B, ns, strlen(ns), model, strlen(model)),
        .hash = h[block], .tokens = tokens + (size_t)block * B,
    };
    float *mass = malloc(E * sizeof(float));
    float *tiles = codec == MF_CODEC_MASK ? NULL : malloc((size_t)E * B * B * sizeof(float));
    size_t need = 0;
    void *row = NULL;
    if (mass && (codec == MF_CODEC_MASK || tiles)) {
        for (uint32_t e = 0; e < E; e++)
            mass[e] = (float)(tc_rand(&s) % 1000 + 1) / 1001.0f;
        for (size_t i = 0; tiles && i < (size_t)E * B * B; i++)
            tiles[i] = (float)(tc_rand(&s) % 1000 + 1) / 1001.0f;
        if (mf_row_size(&spec, nc, mask, &need) == MF_OK)
            row = aligned_alloc(16, (need + 15) & ~(size_t)15);
        if (row && mf_row_build(row, need, &spec, nc, cols, mask, mass, tiles, len, NULL)) {
            free(row);
            row = NULL;
        }
    }
    free(tiles);
    free(mass);
    free(h);
    return row;
}

/*
 * A scripted fake daemon's send: one frame (Envelope + payload) on sock, with fd passed as
 * SCM_RIGHTS when fd >= 0 (the host arena). Returns the encode status; a failed send is
 * ignored on purpose (the client under test may already have closed its end).
 */
static inline mf_status_t tc_send_frame(int sock, mf_envelope_t *env, const void *payload,
                                        size_t len, int fd)
{
    uint8_t *buf;
    size_t n;
    mf_status_t st = mf_frame_encode(env, payload, len, MF_FRAME_DEFAULT_MAX, &buf, &n);
    if (st != MF_OK)
        return st;
    struct iovec iov = {buf, n};
    union {
        struct cmsghdr h;
        char b[CMSG_SPACE(sizeof(int))];
    } cm;
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};
    if (fd >= 0) {
        m.msg_control = cm.b;
        m.msg_controllen = sizeof(cm.b);
        struct cmsghdr *c = CMSG_FIRSTHDR(&m);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(c), &fd, sizeof(int));
    }
    ssize_t w = sendmsg(sock, &m, MSG_NOSIGNAL);
    (void)w;
    free(buf);
    return MF_OK;
}

#endif /* TEST_CLIENT_UTIL_H */
