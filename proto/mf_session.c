/* mf_session — request ids, the pending table with deadlines, reply routing and the far
 * side's handshake state, without I/O (see mf_session.h).
 *
 * The table is a binary min-heap of pending requests ordered by (deadline, id), so the
 * earliest deadline is at the top, plus an open-addressing index (linear probing,
 * backward-shift deletion) from id to heap position, so a reply finds its request in
 * O(1) and leaves in O(log n). */
#include "mf_session.h"
#include "mf_errf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct mf_session_pend {
    int64_t deadline;
    uint64_t rid;
    void *user;
};

void mf_session_init(mf_session_t *s, size_t max_pending)
{
    memset(s, 0, sizeof(*s));
    s->max_pending = max_pending == 0 || max_pending > MF_SESSION_MAX_PENDING
                         ? MF_SESSION_MAX_PENDING
                         : max_pending;
}

void mf_session_deinit(mf_session_t *s)
{
    free(s->heap);
    free(s->index);
    s->heap = NULL;
    s->index = NULL;
    s->n = s->cap = 0;
    s->index_mask = 0;
}

uint64_t mf_session_next_id(mf_session_t *s)
{
    if (++s->last_id == 0) /* 2^64 requests later: 0 stays "no request" */
        s->last_id = 1;
    return s->last_id;
}

size_t mf_session_pending(const mf_session_t *s)
{
    return s->n;
}

/* ---- the index: id → heap position ---- */

static size_t home(const mf_session_t *s, uint64_t rid)
{
    return (size_t)((rid * 0x9E3779B97F4A7C15ull) >> 32) & s->index_mask;
}

/* The index slot holding rid, or SIZE_MAX. */
static size_t slot_of(const mf_session_t *s, uint64_t rid)
{
    if (!s->index)
        return SIZE_MAX;
    for (size_t i = home(s, rid);; i = (i + 1) & s->index_mask) {
        uint32_t v = s->index[i];
        if (v == 0)
            return SIZE_MAX;
        if (s->heap[v - 1].rid == rid)
            return i;
    }
}

static void index_put(mf_session_t *s, uint64_t rid, size_t pos)
{
    size_t i = home(s, rid);
    while (s->index[i])
        i = (i + 1) & s->index_mask;
    s->index[i] = (uint32_t)(pos + 1);
}

/* Empties slot i and moves later entries of the run back so every probe still finds
 * its id (no tombstones). */
static void index_del(mf_session_t *s, size_t i)
{
    size_t j = i;
    for (;;) {
        s->index[i] = 0;
        for (;;) {
            j = (j + 1) & s->index_mask;
            if (s->index[j] == 0)
                return;
            size_t h = home(s, s->heap[s->index[j] - 1].rid);
            /* j's entry may fill i unless its home lies cyclically in (i, j]. */
            if (i <= j ? (i < h && h <= j) : (i < h || h <= j))
                continue;
            break;
        }
        s->index[i] = s->index[j];
        i = j;
    }
}

/* ---- the heap ---- */

static int before(const mf_session_pend_t *a, const mf_session_pend_t *b)
{
    return a->deadline < b->deadline || (a->deadline == b->deadline && a->rid < b->rid);
}

/* Puts e at heap position pos and points its index slot there. */
static void place(mf_session_t *s, size_t pos, mf_session_pend_t e, size_t slot)
{
    s->heap[pos] = e;
    s->index[slot] = (uint32_t)(pos + 1);
}

/* Moves the entry at pos up or down until the heap holds again. */
static void fix(mf_session_t *s, size_t pos)
{
    mf_session_pend_t e = s->heap[pos];
    size_t slot = slot_of(s, e.rid);
    while (pos > 0) {
        size_t up = (pos - 1) / 2;
        if (!before(&e, &s->heap[up]))
            break;
        place(s, pos, s->heap[up], slot_of(s, s->heap[up].rid));
        pos = up;
    }
    for (;;) {
        size_t l = 2 * pos + 1, best = pos;
        const mf_session_pend_t *b = &e;
        if (l < s->n && before(&s->heap[l], b))
            best = l, b = &s->heap[l];
        if (l + 1 < s->n && before(&s->heap[l + 1], b))
            best = l + 1;
        if (best == pos)
            break;
        place(s, pos, s->heap[best], slot_of(s, s->heap[best].rid));
        pos = best;
    }
    place(s, pos, e, slot);
}

/* Room for one more: doubles the heap and rebuilds the index at twice its size. */
static mf_status_t grow(mf_session_t *s)
{
    size_t cap = s->cap ? s->cap * 2 : 16;
    if (cap > s->max_pending)
        cap = s->max_pending;
    size_t isz = 1;
    while (isz < 2 * cap)
        isz <<= 1;
    mf_session_pend_t *heap = realloc(s->heap, cap * sizeof(*heap));
    if (!heap)
        return MF_RESOURCE_EXHAUSTED;
    s->heap = heap;
    uint32_t *index = calloc(isz, sizeof(*index));
    if (!index)
        return MF_RESOURCE_EXHAUSTED;
    free(s->index);
    s->index = index;
    s->index_mask = isz - 1;
    s->cap = cap;
    for (size_t p = 0; p < s->n; p++)
        index_put(s, s->heap[p].rid, p);
    return MF_OK;
}

/* Removes the entry at heap position pos; returns its user pointer. */
static void *remove_at(mf_session_t *s, size_t pos, uint64_t *rid)
{
    mf_session_pend_t e = s->heap[pos];
    index_del(s, slot_of(s, e.rid));
    if (--s->n > pos) {
        mf_session_pend_t last = s->heap[s->n];
        size_t ls = slot_of(s, last.rid);
        place(s, pos, last, ls);
        fix(s, pos);
    }
    if (rid)
        *rid = e.rid;
    return e.user;
}

mf_status_t mf_session_add(mf_session_t *s, int64_t deadline, void *user, uint64_t *rid)
{
    if (!user)
        return MF_INVALID_ARGUMENT;
    if (s->n >= s->max_pending)
        return MF_RESOURCE_EXHAUSTED;
    if (s->n == s->cap && grow(s) != MF_OK)
        return MF_RESOURCE_EXHAUSTED;
    mf_session_pend_t e = {deadline, mf_session_next_id(s), user};
    size_t pos = s->n++;
    s->heap[pos] = e;
    index_put(s, e.rid, pos);
    fix(s, pos);
    *rid = e.rid;
    return MF_OK;
}

void *mf_session_take(mf_session_t *s, uint64_t rid)
{
    size_t slot = rid ? slot_of(s, rid) : SIZE_MAX;
    return slot == SIZE_MAX ? NULL : remove_at(s, s->index[slot] - 1, NULL);
}

void *mf_session_find(const mf_session_t *s, uint64_t rid)
{
    size_t slot = rid ? slot_of(s, rid) : SIZE_MAX;
    return slot == SIZE_MAX ? NULL : s->heap[s->index[slot] - 1].user;
}

int64_t mf_session_next_deadline(const mf_session_t *s)
{
    return s->n ? s->heap[0].deadline : INT64_MAX;
}

void *mf_session_expire(mf_session_t *s, int64_t now, uint64_t *rid)
{
    if (!s->n || s->heap[0].deadline > now)
        return NULL;
    return remove_at(s, 0, rid);
}

void *mf_session_drain(mf_session_t *s, uint64_t *rid)
{
    return s->n ? remove_at(s, s->n - 1, rid) : NULL;
}

/* ---- replies ---- */


mf_status_t mf_session_reply_status(const mf_envelope_t *env, int want_case, char *err,
                                    size_t errlen)
{
    if (env->body_case == MAPFLOW__V1__ENVELOPE__BODY_ERROR) {
        uint32_t code = env->error->code;
        mf_status_t st = (code != 0 && mf_status_valid((int)code)) ? (mf_status_t)code
                                                                   : MF_UNKNOWN;
        /* The message only: the status travels as the return value, and every caller
         * that prints both (mapflowctl, the Python binding, the daemon's log) adds the
         * name itself. */
        mf_errf(err, errlen, "%s", env->error->message && env->error->message[0]
                                    ? env->error->message
                                    : mf_strerror((int)st));
        return st;
    }
    if (want_case == 0 || (int)env->body_case == want_case)
        return MF_OK;
    mf_errf(err, errlen, "%s answered where %s was expected",
         mf_envelope_body_name((int)env->body_case), mf_envelope_body_name(want_case));
    return MF_INTERNAL;
}

/* ---- the far side ---- */

void mf_session_hello_init(Mapflow__V1__Hello *h, const char *ns, const char *token,
                           const char *client_name, int want_host_arena)
{
    mapflow__v1__hello__init(h);
    h->protocol_version = MF_PROTOCOL_VERSION;
    h->namespace_ = (char *)ns;
    h->token = (char *)(token ? token : "");
    h->client_name = (char *)client_name;
    h->want_host_arena = want_host_arena != 0;
}

mf_status_t mf_session_far_hello(mf_session_far_t *far, const mf_envelope_t *env,
                                 uint32_t own_max_frame, unsigned flags, char *err,
                                 size_t errlen)
{
    mf_status_t st = mf_session_reply_status(env, MAPFLOW__V1__ENVELOPE__BODY_HELLO_REPLY,
                                             err, errlen);
    if (st != MF_OK)
        return st;
    const Mapflow__V1__HelloReply *hr = env->hello_reply;
    if ((flags & MF_SESSION_NEED_ARENA) && !hr->host_arena_bytes) {
        mf_errf(err, errlen, "the far side offers no host arena");
        return MF_FAILED_PRECONDITION;
    }
    memset(far, 0, sizeof(*far));
    far->session_id = hr->session_id;
    far->max_frame = hr->max_frame >= MF_FRAME_MIN_MAX && hr->max_frame < own_max_frame
                         ? hr->max_frame
                         : own_max_frame;
    far->max_batch = hr->max_batch;
    far->gpu_tier = hr->gpu_tier;
    far->host_arena_bytes = hr->host_arena_bytes;
    far->host_arena_fd = hr->host_arena_fd;
    far->n_gpu_arenas = hr->n_gpu_arenas;
    far->stage = (flags & MF_SESSION_REMOTE) ? MF_SESSION_ARENA : MF_SESSION_READY;
    return MF_OK;
}

mf_status_t mf_session_far_arena(mf_session_far_t *far, const mf_envelope_t *env, char *err,
                                 size_t errlen)
{
    if (far->stage != MF_SESSION_ARENA) {
        mf_errf(err, errlen, "RemoteArenaReply without a RemoteArena request");
        return MF_INTERNAL;
    }
    mf_status_t st = mf_session_reply_status(
        env, MAPFLOW__V1__ENVELOPE__BODY_REMOTE_ARENA_REPLY, err, errlen);
    if (st != MF_OK)
        return st;
    const Mapflow__V1__RemoteArenaReply *r = env->remote_arena_reply;
    if (!r->bytes || r->address + r->bytes < r->address || !r->rkey.len ||
        r->rkey.len > MF_SESSION_MAX_RKEY) {
        mf_errf(err, errlen, "RemoteArenaReply: unusable arena (%llu bytes at 0x%llx, rkey of "
             "%zu bytes)", (unsigned long long)r->bytes, (unsigned long long)r->address,
             r->rkey.len);
        return MF_INTERNAL;
    }
    far->remote_address = r->address;
    far->remote_bytes = r->bytes;
    far->stage = MF_SESSION_READY;
    return MF_OK;
}
