/* mf_profile — mapping profiles on disk (see mf_profile.h). */
#include "mf_profile.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define FAIL(msg)                    \
    do {                             \
        *why = (msg);                \
        return MF_INVALID_ARGUMENT;  \
    } while (0)

static mf_status_t check_layer(const Mapflow__V1__LayerMap *lm, const char **why)
{
    if (!lm)
        FAIL("null layer entry");
    uint32_t ht = lm->target_heads, hs = lm->source_heads;
    if (ht < 1 || ht > MF_ROW_MAX_HEADS || hs < 1 || hs > MF_ROW_MAX_HEADS)
        FAIL("layer head counts out of range (1..64)");
    if (lm->n_w != (size_t)ht * hs)
        FAIL("W does not have target_heads x source_heads entries");
    if (lm->n_heads != ht)
        FAIL("head profiles do not match target_heads");
    if (!(lm->error >= 0.0f) || !isfinite(lm->error))
        FAIL("layer error is negative or not finite");
    for (uint32_t t = 0; t < ht; t++) {
        double sum = 0;
        for (uint32_t s = 0; s < hs; s++) {
            float x = lm->w[(size_t)t * hs + s];
            if (!(x >= 0.0f) || !isfinite(x))
                FAIL("W has a negative or non-finite weight");
            sum += x;
        }
        if (fabs(sum - 1.0) > 1e-3)
            FAIL("a row of W does not sum to 1");
        const Mapflow__V1__HeadProfile *hp = lm->heads[t];
        if (!hp)
            FAIL("null head profile");
        if ((unsigned)hp->mode > MAPFLOW__V1__HEAD_MODE__HEAD_MASK)
            FAIL("unknown head mode");
        if (!(hp->error >= 0.0f) || !isfinite(hp->error))
            FAIL("head error is negative or not finite");
        if (!(hp->top_p >= 0.0f && hp->top_p <= 1.0f))
            FAIL("head top_p outside [0, 1]");
    }
    return MF_OK;
}

mf_status_t mf_profile_validate(const Mapflow__V1__MappingProfile *p, const char **why)
{
    const char *dummy;
    if (!why)
        why = &dummy;
    *why = "";
    if (!p)
        FAIL("null profile");
    uint32_t b = p->block_size;
    if (b < MF_ROW_MIN_BLOCK || b > MF_ROW_MAX_BLOCK || (b & (b - 1)))
        FAIL("block size must be a power of two in [8, 256]");
    if (p->n_layers > MF_PROFILE_MAX_LAYERS)
        FAIL("more than 4096 layers");
    if (p->target_layers && p->l0 > p->target_layers)
        FAIL("l0 beyond the target's layer count");
    for (size_t k = 0; k < p->n_layers; k++) {
        const Mapflow__V1__LayerMap *lm = p->layers[k];
        mf_status_t st = check_layer(lm, why);
        if (st != MF_OK)
            return st;
        if (lm->target_layer < p->l0)
            FAIL("a mapped layer lies below l0");
        if (p->target_layers && lm->target_layer >= p->target_layers)
            FAIL("a mapped layer lies beyond target_layers");
        if (k > 0 && lm->target_layer <= p->layers[k - 1]->target_layer)
            FAIL("target layers not strictly rising");
    }
    return MF_OK;
}

mf_status_t mf_profile_decode(const void *buf, size_t len,
                              Mapflow__V1__MappingProfile **profile, const char **why)
{
    const char *dummy;
    if (!why)
        why = &dummy;
    if (!profile || (!buf && len)) {
        *why = "null argument";
        return MF_INVALID_ARGUMENT;
    }
    *profile = NULL;
    if (len > MF_PROFILE_MAX_BYTES) {
        *why = "profile larger than 64 MiB";
        return MF_INVALID_ARGUMENT;
    }
    Mapflow__V1__MappingProfile *p = mapflow__v1__mapping_profile__unpack(NULL, len, buf);
    if (!p) {
        *why = "not a serialized MappingProfile";
        return MF_INVALID_ARGUMENT;
    }
    mf_status_t st = mf_profile_validate(p, why);
    if (st != MF_OK) {
        mf_profile_free(p);
        return st;
    }
    *profile = p;
    return MF_OK;
}

void mf_profile_free(Mapflow__V1__MappingProfile *profile)
{
    if (profile)
        mapflow__v1__mapping_profile__free_unpacked(profile, NULL);
}

mf_status_t mf_profile_read(const char *path, Mapflow__V1__MappingProfile **profile,
                            char *err, size_t errlen)
{
    struct stat sb;
    mf_status_t st;
    const char *why = "";
    char dummy[1];
    if (!err) {
        err = dummy;
        errlen = sizeof dummy;
    }
    if (!path || !profile) {
        snprintf(err, errlen, "null argument");
        return MF_INVALID_ARGUMENT;
    }
    *profile = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return errno == ENOENT ? MF_NOT_FOUND : MF_PERMISSION_DENIED;
    }
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_size > MF_PROFILE_MAX_BYTES) {
        snprintf(err, errlen, "%s: not a regular file of at most 64 MiB", path);
        st = MF_INVALID_ARGUMENT;
        goto out_fd;
    }
    size_t len = (size_t)sb.st_size;
    uint8_t *buf = malloc(len ? len : 1);
    if (!buf) {
        snprintf(err, errlen, "%s: out of memory", path);
        st = MF_RESOURCE_EXHAUSTED;
        goto out_fd;
    }
    size_t got = 0;
    while (got < len) {
        ssize_t n = read(fd, buf + got, len - got);
        if (n <= 0) {
            snprintf(err, errlen, "%s: short read", path);
            st = MF_DATA_LOSS;
            goto out_buf;
        }
        got += (size_t)n;
    }
    st = mf_profile_decode(buf, len, profile, &why);
    if (st != MF_OK)
        snprintf(err, errlen, "%s: %s", path, why);
out_buf:
    free(buf);
out_fd:
    close(fd);
    return st;
}

mf_status_t mf_profile_load(const char *path, Mapflow__V1__MappingProfile **profile)
{
    return mf_profile_read(path, profile, NULL, 0);
}

mf_status_t mf_profile_save(const char *path, const Mapflow__V1__MappingProfile *p)
{
    char tmp[4096];
    const char *why;
    if (!path || mf_profile_validate(p, &why) != MF_OK)
        return MF_INVALID_ARGUMENT;
    if ((size_t)snprintf(tmp, sizeof tmp, "%s.tmp", path) >= sizeof tmp)
        return MF_INVALID_ARGUMENT;
    size_t len = mapflow__v1__mapping_profile__get_packed_size(p);
    uint8_t *buf = malloc(len ? len : 1);
    if (!buf)
        return MF_RESOURCE_EXHAUSTED;
    mapflow__v1__mapping_profile__pack(p, buf);
    mf_status_t st = MF_OK;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        st = MF_NOT_FOUND;
        goto out_buf;
    }
    size_t off = 0;
    while (off < len) {
        ssize_t n = write(fd, buf + off, len - off);
        if (n <= 0) {
            st = MF_DATA_LOSS;
            break;
        }
        off += (size_t)n;
    }
    if (fsync(fd) != 0 && st == MF_OK)
        st = MF_DATA_LOSS;
    close(fd);
    if (st == MF_OK && rename(tmp, path) != 0)
        st = MF_DATA_LOSS;
    if (st != MF_OK)
        unlink(tmp);
out_buf:
    free(buf);
    return st;
}

const Mapflow__V1__LayerMap *mf_profile_layer(const Mapflow__V1__MappingProfile *p,
                                              uint32_t target_layer)
{
    if (!p || target_layer < p->l0)
        return NULL;
    for (size_t k = 0; k < p->n_layers; k++)
        if (p->layers[k]->target_layer == target_layer)
            return p->layers[k];
    return NULL;
}

mf_status_t mf_layer_map_from_proto(const Mapflow__V1__LayerMap *lm, mf_layer_map_t *out,
                                    uint8_t *mode_buf, float *top_p_buf)
{
    const char *why;
    if (!out || !mode_buf || !top_p_buf || check_layer(lm, &why) != MF_OK)
        return MF_INVALID_ARGUMENT;
    for (uint32_t t = 0; t < lm->target_heads; t++) {
        mode_buf[t] = (uint8_t)lm->heads[t]->mode;
        top_p_buf[t] = lm->heads[t]->top_p > 0.0f ? lm->heads[t]->top_p : 1.0f;
    }
    out->n_target_heads = lm->target_heads;
    out->n_source_heads = lm->source_heads;
    out->w = lm->w;
    out->mode = mode_buf;
    out->top_p = top_p_buf;
    return MF_OK;
}

mf_status_t mf_profile_export_plan(const Mapflow__V1__MappingProfile *p, mf_codec_t prob_codec,
                                   mf_export_layer_t *out, uint32_t cap, uint32_t *n,
                                   const char **why)
{
    const char *dummy;
    if (!why)
        why = &dummy;
    if (!n || (!out && cap))
        FAIL("null argument");
    *n = 0;
    if ((unsigned)prob_codec >= MF_CODEC_COUNT || prob_codec == MF_CODEC_MASK)
        FAIL("the prob codec must be one with tiles (fp16, bf16, fp8, u8log)");
    mf_status_t st = mf_profile_validate(p, why);
    if (st != MF_OK)
        return st;
    /* Insertion into the sorted plan: at most 4096 maps, so O(layers²) stays small and the
     * output is the only storage (no allocation). */
    uint32_t len = 0;
    for (size_t i = 0; i < p->n_layers; i++) {
        const Mapflow__V1__LayerMap *lm = p->layers[i];
        int prob = 0, mask = 0;
        for (size_t t = 0; t < lm->n_heads; t++) {
            prob |= lm->heads[t]->mode == MAPFLOW__V1__HEAD_MODE__HEAD_PROB;
            mask |= lm->heads[t]->mode == MAPFLOW__V1__HEAD_MODE__HEAD_MASK;
        }
        if (!prob && !mask)
            continue;
        uint32_t s = lm->source_layer, k = 0;
        while (k < len && out[k].source_layer < s)
            k++;
        if (k < len && out[k].source_layer == s) {
            if (prob)
                out[k].codec = prob_codec;
            continue;
        }
        if (len == cap) {
            *why = "more source layers than the plan's capacity";
            return MF_RESOURCE_EXHAUSTED;
        }
        memmove(out + k + 1, out + k, sizeof *out * (len - k));
        out[k].source_layer = s;
        out[k].codec = prob ? prob_codec : MF_CODEC_MASK;
        len++;
    }
    *n = len;
    return MF_OK;
}
