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

/* A job of `kind` for key[0..kl) whose completion calls cb / page_cb with arg, not yet
 * queued (the caller sets its options, then mfd_ssd_submit); packed (put: the record) is
 * taken over. NULL when out of memory (packed freed). */
static mfd_ssd_job_t *job_new(mfd_ssd_op_t kind, const uint8_t *key, size_t kl,
                              uint8_t *packed, mfd_profile_cb cb, mfd_profile_page_cb page_cb,
                              void *arg)
{
    profile_op_t *op = calloc(1, sizeof(*op));
    mfd_ssd_job_t *j = mfd_ssd_job_new(kind, key, kl);
    if (!op || !j) {
        free(op);
        free(packed);
        mfd_ssd_job_free(j);
        return NULL;
    }
    *op = (profile_op_t){cb, page_cb, arg, packed};
    j->arg = op;
    j->cb = on_done;
    return j;
}

static mf_status_t no_memory(const char **why)
{
    *why = "out of memory";
    return MF_RESOURCE_EXHAUSTED;
}

static mf_status_t tier_off(const char **why)
{
    *why = "profiles live in the SSD tier, which is off";
    return MF_UNAVAILABLE;
}

/* The record key of (ns, src, tgt), or 0 with *why set. */
static size_t profile_key(uint8_t key[MFD_SSD_KEY_MAX], const char *ns, const char *src,
                          const char *tgt, const char **why)
{
    size_t kl = src && *src && tgt && *tgt ? mfd_ssd_profile_key(key, ns, src, tgt) : 0;
    if (!kl)
        *why = "source and target model must be 1..255 bytes";
    return kl;
}

mf_status_t mfd_profile_put(mfd_store_t *st, const char *ns, const char *src, const char *tgt,
                            uint8_t *packed, size_t len, mfd_profile_cb cb, void *arg,
                            const char **why)
{
    uint8_t key[MFD_SSD_KEY_MAX];
    size_t kl;
    if (!st->ssd || !(kl = profile_key(key, ns, src, tgt, why))) {
        free(packed);
        return st->ssd ? MF_INVALID_ARGUMENT : tier_off(why);
    }
    mfd_ssd_job_t *j = job_new(MFD_SSD_PUT_RAW, key, kl, packed, cb, NULL, arg);
    if (!j)
        return no_memory(why);
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
    size_t kl;
    if (!st->ssd)
        return tier_off(why);
    if (!(kl = profile_key(key, ns, src, tgt, why)))
        return MF_INVALID_ARGUMENT;
    mfd_ssd_job_t *j = job_new(MFD_SSD_GET_RAW, key, kl, NULL, cb, NULL, arg);
    if (!j)
        return no_memory(why);
    mfd_ssd_submit(st->ssd, j);
    return MF_OK;
}

mf_status_t mfd_profile_list(mfd_store_t *st, const char *ns, const uint8_t *token,
                             size_t tlen, uint32_t page, mfd_profile_page_cb cb, void *arg,
                             const char **why)
{
    uint8_t key[MFD_SSD_KEY_MAX];
    if (!st->ssd)
        return tier_off(why);
    size_t pl = mfd_ssd_profile_prefix(key, ns);
    if (!pl || pl + tlen > MFD_SSD_KEY_MAX) {
        *why = "namespace or token too long";
        return MF_INVALID_ARGUMENT;
    }
    if (tlen)
        memcpy(key + pl, token, tlen);
    mfd_ssd_job_t *j = job_new(MFD_SSD_SCAN_RAW, key, pl + tlen, NULL, NULL, cb, arg);
    if (!j)
        return no_memory(why);
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
