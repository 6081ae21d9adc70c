/* profiles — mapping profiles over the store's SSD tier (see profiles.h). */
#include "profiles.h"

#include <stdlib.h>
#include <string.h>
#include "tier_ssd.h"

typedef struct profile_op {
    mfd_profile_cb cb;
    mfd_profile_page_cb page_cb;
    void *arg;
    uint8_t *packed; /* put: the record, freed with the job */
} profile_op_t;

static void on_done(mfd_ssd_job_t *j)
{
    profile_op_t *op = j->arg;
    if (op->page_cb) {
        op->page_cb(op->arg, j->status == MF_OK ? MF_OK
                             : j->status == MF_DATA_LOSS ? MF_DATA_LOSS : MF_UNAVAILABLE, j);
    } else if (j->op == MFD_SSD_PUT_RAW) {
        op->cb(op->arg, j->status == MF_OK ? MF_OK : MF_UNAVAILABLE, NULL, 0);
    } else {
        mf_status_t st = j->status == MF_OK || j->status == MF_NOT_FOUND ? j->status
                                                                         : MF_UNAVAILABLE;
        op->cb(op->arg, st, st == MF_OK ? j->out : NULL, st == MF_OK ? j->out_len : 0);
    }
    free(op->packed);
    free(op);
    mfd_ssd_job_free(j);
}

/* A job for (ns, src, tgt) with its op, or NULL with *st / *why set. */
static mfd_ssd_job_t *job_for(mfd_store_t *st, mfd_ssd_op_t kind, const uint8_t *key,
                              size_t kl, mf_status_t *s, const char **why)
{
    if (!st->ssd) {
        *s = MF_UNAVAILABLE;
        *why = "profiles live in the SSD tier, which is off";
        return NULL;
    }
    profile_op_t *op = calloc(1, sizeof(*op));
    mfd_ssd_job_t *j = mfd_ssd_job_new(kind, key, kl);
    if (!op || !j) {
        free(op);
        mfd_ssd_job_free(j);
        *s = MF_RESOURCE_EXHAUSTED;
        *why = "out of memory";
        return NULL;
    }
    j->arg = op;
    j->cb = on_done;
    return j;
}

static size_t profile_key(uint8_t key[MFD_SSD_KEY_MAX], const char *ns, const char *src,
                          const char *tgt, const char **why)
{
    size_t sl = src ? strlen(src) : 0, tl = tgt ? strlen(tgt) : 0;
    size_t kl = mfd_ssd_profile_key(key, ns, src ? src : "", tgt ? tgt : "");
    if (!kl || sl < 1 || tl < 1) {
        *why = "source and target model must be 1..255 bytes";
        return 0;
    }
    return kl;
}

mf_status_t mfd_profile_put(mfd_store_t *st, const char *ns, const char *src, const char *tgt,
                            uint8_t *packed, size_t len, mfd_profile_cb cb, void *arg,
                            const char **why)
{
    uint8_t key[MFD_SSD_KEY_MAX];
    mf_status_t s = MF_INVALID_ARGUMENT;
    size_t kl = st->ssd ? profile_key(key, ns, src, tgt, why) : 1;
    mfd_ssd_job_t *j = kl ? job_for(st, MFD_SSD_PUT_RAW, key, kl, &s, why) : NULL;
    if (!j) {
        free(packed);
        return s;
    }
    profile_op_t *op = j->arg;
    op->cb = cb;
    op->arg = arg;
    op->packed = packed;
    j->value = packed;
    j->vlen = len;
    j->sync = 1; /* small and expensive to refit: keep them through a crash */
    mfd_ssd_submit(st->ssd, j);
    return MF_OK;
}

mf_status_t mfd_profile_get(mfd_store_t *st, const char *ns, const char *src, const char *tgt,
                            mfd_profile_cb cb, void *arg, const char **why)
{
    uint8_t key[MFD_SSD_KEY_MAX];
    mf_status_t s = MF_INVALID_ARGUMENT;
    size_t kl = st->ssd ? profile_key(key, ns, src, tgt, why) : 1;
    mfd_ssd_job_t *j = kl ? job_for(st, MFD_SSD_GET_RAW, key, kl, &s, why) : NULL;
    if (!j)
        return s;
    profile_op_t *op = j->arg;
    op->cb = cb;
    op->arg = arg;
    mfd_ssd_submit(st->ssd, j);
    return MF_OK;
}

mf_status_t mfd_profile_list(mfd_store_t *st, const char *ns, const uint8_t *token,
                             size_t tlen, uint32_t page, mfd_profile_page_cb cb, void *arg,
                             const char **why)
{
    uint8_t key[MFD_SSD_KEY_MAX];
    mf_status_t s = MF_INVALID_ARGUMENT;
    size_t pl = st->ssd ? mfd_ssd_profile_prefix(key, ns) : 1;
    if (st->ssd && (!pl || pl + tlen > MFD_SSD_KEY_MAX)) {
        *why = "namespace or token too long";
        return MF_INVALID_ARGUMENT;
    }
    if (st->ssd && tlen)
        memcpy(key + pl, token, tlen);
    mfd_ssd_job_t *j = job_for(st, MFD_SSD_SCAN_RAW, key, pl + tlen, &s, why);
    if (!j)
        return s;
    profile_op_t *op = j->arg;
    op->page_cb = cb;
    op->arg = arg;
    j->prefix_len = pl;
    j->max_items = page;
    j->skip_first = tlen > 0;
    mfd_ssd_submit(st->ssd, j);
    return MF_OK;
}

int mfd_profile_page_next(const mfd_profile_page_t *pg, size_t *pos, const uint8_t **key,
                          size_t *klen, const uint8_t **val, size_t *vlen)
{
    return mfd_ssd_scan_next(pg, pos, key, klen, val, vlen);
}

size_t mfd_profile_page_count(const mfd_profile_page_t *pg) { return pg->n_items; }

int mfd_profile_page_more(const mfd_profile_page_t *pg) { return pg->more; }
