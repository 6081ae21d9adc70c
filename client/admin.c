/*
 * admin — libmapflow's admin calls: list, stats, evict, flush, config get / set, health,
 * profile put / get / list. Declared and documented in mapflow.h. Results are copied out of the
 * decoded reply into memory the caller frees with the matching …_free.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "channel.h"

/* One request/reply exchange; the reply is handed to `take` (on the channel's I/O
 * thread), which copies what the caller needs before the reply is freed. */
static mf_status_t call(mf_channel_t *ch, mf_envelope_t *req, int want_case,
                        int64_t timeout_ms, mf__take_fn take, void *arg)
{
    if (!ch)
        return MF_INVALID_ARGUMENT;
    mf__op_t *op = mf__simple_new(ch, req, NULL, 0, want_case, take, arg, NULL);
    return op ? mf__op_run(op, timeout_ms) : MF_RESOURCE_EXHAUSTED;
}

static mf_status_t call_async(mf_channel_t *ch, mf_envelope_t *req, int want_case,
                              int64_t timeout_ms, mf__take_fn take, void *arg, mf_cq_t *cq,
                              void *tag, mf_call_t **call_out)
{
    if (!ch)
        return MF_INVALID_ARGUMENT;
    mf__op_t *op = mf__simple_new(ch, req, NULL, 0, want_case, take, arg, NULL);
    return op ? mf__op_run_async(op, timeout_ms, cq, tag, call_out) : MF_RESOURCE_EXHAUSTED;
}

static mf_status_t oom(mf__op_t *op)
{
    return (mf_status_t)mf__op_error(op, MF_RESOURCE_EXHAUSTED, "out of memory");
}

MF_EXPORT const char *mf_tier_name(mf_tier_t t)
{
    switch (t) {
    case MF_TIER_GPU: return "gpu";
    case MF_TIER_HOST: return "host";
    case MF_TIER_SSD: return "ssd";
    default: return "none";
    }
}

MF_EXPORT mf_status_t mf_tier_parse(const char *s, mf_tier_t *out)
{
    static const mf_tier_t all[] = {MF_TIER_NONE, MF_TIER_GPU, MF_TIER_HOST, MF_TIER_SSD};
    for (size_t i = 0; s && i < sizeof(all) / sizeof(all[0]); i++)
        if (strcmp(s, mf_tier_name(all[i])) == 0) {
            *out = all[i];
            return MF_OK;
        }
    return MF_INVALID_ARGUMENT;
}

static void tier_from_pb(mf_tier_stats_t *t, const Mapflow__V1__TierStats *pb)
{
    t->tier = (mf_tier_t)pb->tier;
    t->enabled = pb->enabled;
    t->used_bytes = pb->used_bytes;
    t->capacity_bytes = pb->capacity_bytes;
    t->entries = pb->entries;
    snprintf(t->why_off, sizeof(t->why_off), "%s", pb->why_off ? pb->why_off : "");
}

/* ==== list =========================================================================== */

static mf_status_t take_list(mf__op_t *op, const mf__reply_t *rep, void *arg)
{
    const mf_envelope_t *env = rep->env;
    Mapflow__V1__ListReply *lr = env->list_reply;
    mf_list_page_t *p = calloc(1, sizeof(*p));
    if (!p)
        return oom(op);
    p->entries = calloc(lr->n_entries ? lr->n_entries : 1, sizeof(mf_entry_info_t));
    if (lr->next_page_token.len) {
        p->next_page_token = malloc(lr->next_page_token.len);
        p->next_page_token_len = lr->next_page_token.len;
    }
    if (!p->entries || (lr->next_page_token.len && !p->next_page_token)) {
        mf_list_page_free(p);
        return oom(op);
    }
    if (lr->next_page_token.len)
        memcpy(p->next_page_token, lr->next_page_token.data, lr->next_page_token.len);
    for (size_t i = 0; i < lr->n_entries; i++) {
        const Mapflow__V1__EntryInfo *e = lr->entries[i];
        mf_entry_info_t *o = &p->entries[p->n_entries];
        if (!e->key || e->key->hash.len != 16)
            continue; /* unusable entry: skip rather than invent a key */
        snprintf(o->model, sizeof(o->model), "%s", e->key->model ? e->key->model : "");
        o->layer = e->key->layer;
        o->hash = mf_hash_from_le(e->key->hash.data);
        o->block = e->block;
        o->size = e->size;
        o->tier = (mf_tier_t)e->tier;
        o->on_ssd = e->on_ssd;
        o->pins = e->pins;
        o->last_access_ms = e->last_access_ms;
        p->n_entries++;
    }
    *(mf_list_page_t **)arg = p;
    return MF_OK;
}

MF_EXPORT mf_status_t mf_list(mf_channel_t *ch, const char *model, int64_t layer,
                              uint32_t page_size, const void *page_token,
                              size_t page_token_len, mf_list_page_t **out,
                              int64_t timeout_ms)
{
    if (!out)
        return MF_INVALID_ARGUMENT;
    *out = NULL;
    Mapflow__V1__List l = MAPFLOW__V1__LIST__INIT;
    l.model = model ? (char *)model : "";
    l.has_layer = layer >= 0;
    l.layer = layer >= 0 ? (uint32_t)layer : 0;
    l.page_size = page_size;
    l.page_token.data = (uint8_t *)page_token;
    l.page_token.len = page_token ? page_token_len : 0;
    ENV(req, LIST, list) = &l;
    return call(ch, &req, MAPFLOW__V1__ENVELOPE__BODY_LIST_REPLY, timeout_ms, take_list, out);
}

MF_EXPORT void mf_list_page_free(mf_list_page_t *p)
{
    if (!p)
        return;
    free(p->entries);
    free(p->next_page_token);
    free(p);
}

/* ==== stats ========================================================================== */

static mf_status_t take_stats(mf__op_t *op, const mf__reply_t *rep, void *arg)
{
    const mf_envelope_t *env = rep->env;
    Mapflow__V1__StatsReply *sr = env->stats_reply;
    mf_stats_t *s = calloc(1, sizeof(*s));
    if (!s)
        return oom(op);
    s->tiers = calloc(sr->n_tiers ? sr->n_tiers : 1, sizeof(*s->tiers));
    s->counters = calloc(sr->n_counters ? sr->n_counters : 1, sizeof(*s->counters));
    if (!s->tiers || !s->counters) {
        mf_stats_free(s);
        return oom(op);
    }
    for (size_t i = 0; i < sr->n_tiers; i++)
        tier_from_pb(&s->tiers[s->n_tiers++], sr->tiers[i]);
    for (size_t i = 0; i < sr->n_counters; i++) {
        char *name = mf__strdup(sr->counters[i]->name ? sr->counters[i]->name : "");
        if (!name) {
            mf_stats_free(s);
            return oom(op);
        }
        s->counters[s->n_counters].name = name;
        s->counters[s->n_counters++].value = sr->counters[i]->value;
    }
    s->uptime_ms = sr->uptime_ms;
    s->connections = sr->connections;
    *(mf_stats_t **)arg = s;
    return MF_OK;
}

MF_EXPORT mf_status_t mf_stats(mf_channel_t *ch, mf_stats_t **out, int64_t timeout_ms)
{
    if (!out)
        return MF_INVALID_ARGUMENT;
    *out = NULL;
    Mapflow__V1__Stats s = MAPFLOW__V1__STATS__INIT;
    ENV(req, STATS, stats) = &s;
    return call(ch, &req, MAPFLOW__V1__ENVELOPE__BODY_STATS_REPLY, timeout_ms, take_stats, out);
}

MF_EXPORT mf_status_t mf_stats_async(mf_channel_t *ch, mf_stats_t **out, int64_t timeout_ms,
                                     mf_cq_t *cq, void *tag, mf_call_t **call)
{
    if (!out)
        return MF_INVALID_ARGUMENT;
    *out = NULL;
    Mapflow__V1__Stats s = MAPFLOW__V1__STATS__INIT;
    ENV(req, STATS, stats) = &s;
    return call_async(ch, &req, MAPFLOW__V1__ENVELOPE__BODY_STATS_REPLY, timeout_ms,
                      take_stats, out, cq, tag, call);
}

MF_EXPORT void mf_stats_free(mf_stats_t *s)
{
    if (!s)
        return;
    for (size_t i = 0; i < s->n_counters; i++)
        free(s->counters[i].name);
    free(s->counters);
    free(s->tiers);
    free(s);
}

MF_EXPORT uint64_t mf_stats_counter(const mf_stats_t *s, const char *name, int *found)
{
    for (size_t i = 0; s && name && i < s->n_counters; i++)
        if (strcmp(s->counters[i].name, name) == 0) {
            if (found)
                *found = 1;
            return s->counters[i].value;
        }
    if (found)
        *found = 0;
    return 0;
}

/* ==== evict, flush =================================================================== */

static mf_status_t take_evict(mf__op_t *op, const mf__reply_t *rep, void *arg)
{
    const mf_envelope_t *env = rep->env;
    (void)op;
    uint64_t **o = arg;
    if (o[0])
        *o[0] = env->evict_reply->bytes;
    if (o[1])
        *o[1] = env->evict_reply->entries;
    return MF_OK;
}

static mf_status_t evict(mf_channel_t *ch, int all, mf_tier_t tier, uint64_t bytes,
                         uint64_t *evicted_bytes, uint64_t *evicted_entries, int64_t timeout_ms)
{
    Mapflow__V1__Evict e = MAPFLOW__V1__EVICT__INIT;
    e.tier = (Mapflow__V1__Tier)tier;
    e.bytes = bytes;
    e.all_namespaces = all;
    ENV(req, EVICT, evict) = &e;
    uint64_t *outs[2] = {evicted_bytes, evicted_entries};
    return call(ch, &req, MAPFLOW__V1__ENVELOPE__BODY_EVICT_REPLY, timeout_ms, take_evict, outs);
}

MF_EXPORT mf_status_t mf_evict(mf_channel_t *ch, mf_tier_t tier, uint64_t bytes,
                               uint64_t *evicted_bytes, uint64_t *evicted_entries,
                               int64_t timeout_ms)
{
    return evict(ch, 0, tier, bytes, evicted_bytes, evicted_entries, timeout_ms);
}

MF_EXPORT mf_status_t mf_evict_all(mf_channel_t *ch, mf_tier_t tier, uint64_t bytes,
                                   uint64_t *evicted_bytes, uint64_t *evicted_entries,
                                   int64_t timeout_ms)
{
    return evict(ch, 1, tier, bytes, evicted_bytes, evicted_entries, timeout_ms);
}

static mf_status_t take_flush(mf__op_t *op, const mf__reply_t *rep, void *arg)
{
    const mf_envelope_t *env = rep->env;
    (void)op;
    if (arg)
        *(uint64_t *)arg = env->flush_reply->entries;
    return MF_OK;
}

static mf_status_t flush(mf_channel_t *ch, int all, uint64_t *entries, int64_t timeout_ms)
{
    Mapflow__V1__Flush f = MAPFLOW__V1__FLUSH__INIT;
    f.all_namespaces = all;
    ENV(req, FLUSH, flush) = &f;
    return call(ch, &req, MAPFLOW__V1__ENVELOPE__BODY_FLUSH_REPLY, timeout_ms, take_flush,
                entries);
}

MF_EXPORT mf_status_t mf_flush(mf_channel_t *ch, uint64_t *entries, int64_t timeout_ms)
{
    return flush(ch, 0, entries, timeout_ms);
}

MF_EXPORT mf_status_t mf_flush_all(mf_channel_t *ch, uint64_t *entries, int64_t timeout_ms)
{
    return flush(ch, 1, entries, timeout_ms);
}

/* ==== config ========================================================================= */

static mf_status_t items_copy(mf__op_t *op, Mapflow__V1__ConfigItem **in, size_t n,
                              mf_config_item_t **items)
{
    mf_config_item_t *it = calloc(n ? n : 1, sizeof(*it));
    if (!it)
        return oom(op);
    for (size_t i = 0; i < n; i++) {
        it[i].key = mf__strdup(in[i]->key ? in[i]->key : "");
        it[i].value = mf__strdup(in[i]->value ? in[i]->value : "");
        it[i].live = in[i]->live;
        if (!it[i].key || !it[i].value) {
            mf_config_items_free(it, i + 1);
            return oom(op);
        }
    }
    *items = it;
    return MF_OK;
}

typedef struct config_out {
    mf_config_item_t **items;
    size_t *n;
} config_out_t;

static mf_status_t take_config_get(mf__op_t *op, const mf__reply_t *rep, void *arg)
{
    const mf_envelope_t *env = rep->env;
    config_out_t *o = arg;
    Mapflow__V1__ConfigGetReply *r = env->config_get_reply;
    mf_status_t st = items_copy(op, r->items, r->n_items, o->items);
    if (st == MF_OK)
        *o->n = r->n_items;
    return st;
}

MF_EXPORT mf_status_t mf_config_get(mf_channel_t *ch, const char *key,
                                    mf_config_item_t **items, size_t *n, int64_t timeout_ms)
{
    if (!items || !n)
        return MF_INVALID_ARGUMENT;
    *items = NULL;
    *n = 0;
    Mapflow__V1__ConfigGet g = MAPFLOW__V1__CONFIG_GET__INIT;
    g.key = key ? (char *)key : "";
    ENV(req, CONFIG_GET, config_get) = &g;
    config_out_t o = {items, n};
    return call(ch, &req, MAPFLOW__V1__ENVELOPE__BODY_CONFIG_GET_REPLY, timeout_ms,
                take_config_get, &o);
}

static mf_status_t take_config_set(mf__op_t *op, const mf__reply_t *rep, void *arg)
{
    const mf_envelope_t *env = rep->env;
    Mapflow__V1__ConfigItem *it = env->config_set_reply->item;
    if (!arg || !it)
        return MF_OK;
    return items_copy(op, &it, 1, arg);
}

MF_EXPORT mf_status_t mf_config_set(mf_channel_t *ch, const char *key, const char *value,
                                    mf_config_item_t **item, int64_t timeout_ms)
{
    if (item)
        *item = NULL;
    if (!key || !key[0] || !value)
        return ch ? mf__chan_error(ch, MF_INVALID_ARGUMENT, "config set needs KEY VALUE")
                  : MF_INVALID_ARGUMENT;
    Mapflow__V1__ConfigSet s = MAPFLOW__V1__CONFIG_SET__INIT;
    s.key = (char *)key;
    s.value = (char *)value;
    ENV(req, CONFIG_SET, config_set) = &s;
    return call(ch, &req, MAPFLOW__V1__ENVELOPE__BODY_CONFIG_SET_REPLY, timeout_ms,
                take_config_set, item);
}

MF_EXPORT void mf_config_items_free(mf_config_item_t *items, size_t n)
{
    if (!items)
        return;
    for (size_t i = 0; i < n; i++) {
        free(items[i].key);
        free(items[i].value);
    }
    free(items);
}

/* ==== health ========================================================================= */

static mf_status_t take_health(mf__op_t *op, const mf__reply_t *rep, void *arg)
{
    const mf_envelope_t *env = rep->env;
    (void)op;
    mf_health_t *h = arg;
    Mapflow__V1__HealthReply *r = env->health_reply;
    h->ok = r->ok;
    h->ready = r->ready;
    snprintf(h->status, sizeof(h->status), "%s", r->status ? r->status : "");
    for (size_t i = 0; i < r->n_tiers && h->n_tiers < 4; i++)
        tier_from_pb(&h->tiers[h->n_tiers++], r->tiers[i]);
    return MF_OK;
}

MF_EXPORT mf_status_t mf_health(mf_channel_t *ch, mf_health_t *out, int64_t timeout_ms)
{
    if (!out)
        return MF_INVALID_ARGUMENT;
    memset(out, 0, sizeof(*out));
    Mapflow__V1__Health h = MAPFLOW__V1__HEALTH__INIT;
    ENV(req, HEALTH, health) = &h;
    return call(ch, &req, MAPFLOW__V1__ENVELOPE__BODY_HEALTH_REPLY, timeout_ms, take_health,
                out);
}

MF_EXPORT mf_status_t mf_health_async(mf_channel_t *ch, mf_health_t *out, int64_t timeout_ms,
                                      mf_cq_t *cq, void *tag, mf_call_t **call)
{
    if (!out)
        return MF_INVALID_ARGUMENT;
    memset(out, 0, sizeof(*out));
    Mapflow__V1__Health h = MAPFLOW__V1__HEALTH__INIT;
    ENV(req, HEALTH, health) = &h;
    return call_async(ch, &req, MAPFLOW__V1__ENVELOPE__BODY_HEALTH_REPLY, timeout_ms,
                      take_health, out, cq, tag, call);
}

/* ==== profiles ======================================================================= */

MF_EXPORT mf_status_t mf_profile_put(mf_channel_t *ch, const void *profile_pb, size_t len,
                                     int64_t timeout_ms)
{
    if (!ch || !profile_pb)
        return MF_INVALID_ARGUMENT;
    Mapflow__V1__MappingProfile *mp =
        mapflow__v1__mapping_profile__unpack(NULL, len, profile_pb);
    if (!mp)
        return mf__chan_error(ch, MF_INVALID_ARGUMENT, "profile is not an encoded "
                              "mapflow.v1.MappingProfile");
    Mapflow__V1__ProfilePut pp = MAPFLOW__V1__PROFILE_PUT__INIT;
    pp.profile = mp;
    ENV(req, PROFILE_PUT, profile_put) = &pp;
    mf_status_t st = call(ch, &req, MAPFLOW__V1__ENVELOPE__BODY_PROFILE_PUT_REPLY, timeout_ms,
                          NULL, NULL);
    mapflow__v1__mapping_profile__free_unpacked(mp, NULL);
    return st;
}

typedef struct profile_out {
    void **pb;
    size_t *len;
} profile_out_t;

static mf_status_t take_profile(mf__op_t *op, const mf__reply_t *rep, void *arg)
{
    const mf_envelope_t *env = rep->env;
    profile_out_t *o = arg;
    const Mapflow__V1__MappingProfile *mp = env->profile_get_reply->profile;
    if (!mp)
        return (mf_status_t)mf__op_error(op, MF_NOT_FOUND, "daemon returned no profile");
    size_t n = mapflow__v1__mapping_profile__get_packed_size(mp);
    uint8_t *b = malloc(n ? n : 1);
    if (!b)
        return oom(op);
    mapflow__v1__mapping_profile__pack(mp, b);
    *o->pb = b;
    *o->len = n;
    return MF_OK;
}

MF_EXPORT mf_status_t mf_profile_get(mf_channel_t *ch, const char *source_model,
                                     const char *target_model, void **profile_pb,
                                     size_t *len, int64_t timeout_ms)
{
    if (!profile_pb || !len || !source_model || !target_model)
        return MF_INVALID_ARGUMENT;
    *profile_pb = NULL;
    *len = 0;
    Mapflow__V1__ProfileGet pg = MAPFLOW__V1__PROFILE_GET__INIT;
    pg.source_model = (char *)source_model;
    pg.target_model = (char *)target_model;
    ENV(req, PROFILE_GET, profile_get) = &pg;
    profile_out_t o = {profile_pb, len};
    return call(ch, &req, MAPFLOW__V1__ENVELOPE__BODY_PROFILE_GET_REPLY, timeout_ms,
                take_profile, &o);
}

static mf_status_t take_profile_list(mf__op_t *op, const mf__reply_t *rep, void *arg)
{
    const Mapflow__V1__ProfileListReply *lr = rep->env->profile_list_reply;
    mf_profile_page_t *p = calloc(1, sizeof(*p));
    if (!p)
        return oom(op);
    p->profiles = calloc(lr->n_profiles ? lr->n_profiles : 1, sizeof(*p->profiles));
    if (!p->profiles)
        goto oom;
    if (lr->next_page_token.len) {
        p->next_page_token = malloc(lr->next_page_token.len);
        if (!p->next_page_token)
            goto oom;
        memcpy(p->next_page_token, lr->next_page_token.data, lr->next_page_token.len);
        p->next_page_token_len = lr->next_page_token.len;
    }
    for (size_t i = 0; i < lr->n_profiles; i++) {
        const Mapflow__V1__ProfileInfo *e = lr->profiles[i];
        mf_profile_info_t *o = &p->profiles[p->n_profiles];
        const char *src = e->source_model ? e->source_model : "";
        const char *tgt = e->target_model ? e->target_model : "";
        if (strlen(src) >= sizeof(o->source_model) || strlen(tgt) >= sizeof(o->target_model))
            continue; /* the daemon bounds names to 255 bytes: skip rather than truncate */
        o->created_by = strdup(e->created_by ? e->created_by : "");
        if (!o->created_by)
            goto oom;
        snprintf(o->source_model, sizeof(o->source_model), "%s", src);
        snprintf(o->target_model, sizeof(o->target_model), "%s", tgt);
        o->block_size = e->block_size;
        o->l0 = e->l0;
        o->target_layers = e->target_layers;
        o->mapped_layers = e->mapped_layers;
        o->encoded_bytes = e->encoded_bytes;
        p->n_profiles++;
    }
    *(mf_profile_page_t **)arg = p;
    return MF_OK;
oom:
    mf_profile_page_free(p);
    return oom(op);
}

MF_EXPORT mf_status_t mf_profile_list(mf_channel_t *ch, uint32_t page_size,
                                      const void *page_token, size_t page_token_len,
                                      mf_profile_page_t **out, int64_t timeout_ms)
{
    if (!out)
        return MF_INVALID_ARGUMENT;
    *out = NULL;
    Mapflow__V1__ProfileList pl = MAPFLOW__V1__PROFILE_LIST__INIT;
    pl.page_size = page_size;
    pl.page_token.data = (uint8_t *)page_token;
    pl.page_token.len = page_token ? page_token_len : 0;
    ENV(req, PROFILE_LIST, profile_list) = &pl;
    return call(ch, &req, MAPFLOW__V1__ENVELOPE__BODY_PROFILE_LIST_REPLY, timeout_ms,
                take_profile_list, out);
}

MF_EXPORT void mf_profile_page_free(mf_profile_page_t *p)
{
    if (!p)
        return;
    for (size_t i = 0; p->profiles && i < p->n_profiles; i++)
        free(p->profiles[i].created_by);
    free(p->profiles);
    free(p->next_page_token);
    free(p);
}
