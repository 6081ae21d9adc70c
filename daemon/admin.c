/* admin — List, Stats, Evict, Flush, Delete, Config, Health, Profiles (see admin.h). */
#include "admin.h"
#include "profiles.h"
#include "mf_clock.h"
#include "log.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define REPLY(c, rid, CASE, field, msg) MFD_REPLY(c, rid, CASE, field, msg, NULL, 0)

/* u8 ns_len | ns [| u8 model_len | model]: the key prefix of a namespace (and model). */
static size_t key_prefix(const mfd_conn_t *c, const char *model, uint8_t *out)
{
    size_t n = 0;
    out[n++] = (uint8_t)c->ns_len;
    memcpy(out + n, c->ns, c->ns_len);
    n += c->ns_len;
    if (model && *model) {
        size_t ml = strlen(model);
        out[n++] = (uint8_t)ml;
        memcpy(out + n, model, ml);
        n += ml;
    }
    return n;
}

static uint64_t wall_ms_of(uint64_t mono_ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t wall = (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
    uint64_t now = mf_now_ms();
    return mono_ms && mono_ms <= now ? wall - (now - mono_ms) : 0;
}

/* ---- List --------------------------------------------------------------------------- */

typedef struct list_item {
    Mapflow__V1__EntryInfo info;
    Mapflow__V1__Key key;
    char model[MFD_MODEL_MAX + 1];
    const mfd_entry_t *e;
} list_item_t;

void mfd_admin_list(mfd_conn_t *c, uint64_t rid, const Mapflow__V1__List *m)
{
    mfd_server_t *s = c->srv;
    size_t ml = m->model ? strlen(m->model) : 0;
    uint32_t page = m->page_size ? m->page_size : 100;
    if (page > 1000 || ml > MFD_MODEL_MAX || m->page_token.len > MFD_KEY_MAX) {
        mfd_conn_error(c, rid, MF_INVALID_ARGUMENT,
                       "List: page_size ≤ 1000, model ≤ 255 bytes, page_token from a ListReply");
        return;
    }
    uint8_t prefix[MFD_KEY_MAX];
    size_t plen = key_prefix(c, m->model, prefix);
    if (m->has_layer && m->model && *m->model) { /* (ns, model, layer) is a key prefix too */
        prefix[plen++] = (uint8_t)(m->layer >> 24);
        prefix[plen++] = (uint8_t)(m->layer >> 16);
        prefix[plen++] = (uint8_t)(m->layer >> 8);
        prefix[plen++] = (uint8_t)m->layer;
    }
    list_item_t *items = calloc(page, sizeof(*items));
    Mapflow__V1__EntryInfo **ptrs = calloc(page, sizeof(*ptrs));
    if (!items || !ptrs) {
        mfd_conn_error(c, rid, MF_RESOURCE_EXHAUSTED, "List: out of memory");
        goto done;
    }
    /* The page resumes right after the token's key (or at the prefix) in the index's key
     * order: O(log n + the entries walked), never the whole index. Without a model, a
     * layer filter walks the namespace's other layers too. */
    const uint8_t *from = prefix;
    size_t flen = plen;
    int after = 0;
    if (m->page_token.len &&
        mfd_key_cmp(m->page_token.data, m->page_token.len, prefix, plen) >= 0) {
        from = m->page_token.data;
        flen = m->page_token.len;
        after = 1;
    }
#define IN_PREFIX(e) ((e)->key.len >= plen && memcmp((e)->key.b, prefix, plen) == 0)
    mfd_entry_t *e = mfd_index_seek(s->store.ix, from, flen, !after);
    size_t k = 0;
    for (; e && IN_PREFIX(e) && k < page; e = mfd_index_next(e)) {
        if (m->has_layer && e->layer != m->layer)
            continue;
        mfd_key_parts_t p;
        mfd_key_parse(e->key.b, e->key.len, &p);
        list_item_t *it = &items[k];
        it->e = e;
        mapflow__v1__entry_info__init(&it->info);
        mapflow__v1__key__init(&it->key);
        memcpy(it->model, p.model, p.model_len);
        it->model[p.model_len] = 0;
        it->key.model = it->model;
        it->key.layer = p.layer;
        it->key.hash.data = (uint8_t *)p.hash;
        it->key.hash.len = 16;
        it->info.key = &it->key;
        it->info.size = e->size;
        it->info.tier = e->gpu    ? MAPFLOW__V1__TIER__TIER_GPU
                        : e->host ? MAPFLOW__V1__TIER__TIER_HOST
                                  : MAPFLOW__V1__TIER__TIER_SSD;
        it->info.on_ssd = e->on_ssd;
        it->info.pins = e->pins;
        it->info.block = e->block;
        it->info.last_access_ms = wall_ms_of(e->last_access_ms);
        ptrs[k++] = &it->info;
    }
    /* More matching entries after this page? Then the last key is the page token. */
    int more = 0;
    for (; e && IN_PREFIX(e) && !more; e = mfd_index_next(e))
        more = !m->has_layer || e->layer == m->layer;
#undef IN_PREFIX
    Mapflow__V1__ListReply rep = MAPFLOW__V1__LIST_REPLY__INIT;
    rep.n_entries = k;
    rep.entries = ptrs;
    if (more && k) {
        /* The token is the last key's bytes; the entry holds them until the reply is sent. */
        rep.next_page_token.data = (uint8_t *)items[k - 1].e->key.b;
        rep.next_page_token.len = items[k - 1].e->key.len;
    }
    REPLY(c, rid, LIST_REPLY, list_reply, &rep);
done:
    free(items);
    free(ptrs);
}

/* ---- Stats / Health ------------------------------------------------------------------ */

typedef struct counter_vec {
    Mapflow__V1__Counter *items;
    Mapflow__V1__Counter **ptrs;
    char (*names)[160];
    size_t n, cap;
} counter_vec_t;

static void add_counter(const char *name, uint64_t value, void *arg)
{
    counter_vec_t *cv = arg;
    if (cv->n == cv->cap)
        return;
    Mapflow__V1__Counter *it = &cv->items[cv->n];
    mapflow__v1__counter__init(it);
    snprintf(cv->names[cv->n], sizeof(cv->names[0]), "%s", name);
    it->name = cv->names[cv->n];
    it->value = value;
    cv->ptrs[cv->n++] = it;
}

static void fill_tiers(mfd_server_t *s, Mapflow__V1__TierStats ts[3],
                       Mapflow__V1__TierStats *ptrs[3])
{
    mfd_tier_info_t t[3];
    mfd_store_tiers(&s->store, t);
    for (int i = 0; i < 3; i++) {
        mapflow__v1__tier_stats__init(&ts[i]);
        ts[i].tier = t[i].tier;
        ts[i].enabled = t[i].enabled;
        ts[i].used_bytes = t[i].used_bytes;
        ts[i].capacity_bytes = t[i].capacity_bytes;
        ts[i].entries = t[i].entries;
        ts[i].why_off = t[i].enabled || !t[i].why_off ? NULL : (char *)t[i].why_off;
        ptrs[i] = &ts[i];
    }
}

/* A tenant's Stats: its own namespace only (issue 22: daemon-wide counters and tier use
 * tell a tenant what the others do). Tiers keep their state and capacity (configuration,
 * which ConfigGet shows anyway) with the namespace's rows and bytes on each; counters are
 * the namespace's rows, bytes and leased rows; connections are the namespace's. It walks
 * the namespace's entries once (as List does). */
static void tenant_stats(mfd_conn_t *c, uint64_t rid)
{
    mfd_server_t *s = c->srv;
    uint8_t prefix[MFD_KEY_MAX];
    size_t plen = key_prefix(c, NULL, prefix);
    mfd_entry_t **v = NULL;
    size_t n = 0;
    if (mfd_index_collect(s->store.ix, prefix, plen, &v, &n) != MF_OK) {
        mfd_conn_error(c, rid, MF_RESOURCE_EXHAUSTED, "Stats: out of memory");
        return;
    }
    Mapflow__V1__TierStats ts[3], *tp[3];
    fill_tiers(s, ts, tp);
    uint64_t bytes = 0, leased = 0;
    for (int i = 0; i < 3; i++)
        ts[i].used_bytes = ts[i].entries = 0;
    for (size_t i = 0; i < n; i++) {
        const mfd_entry_t *e = v[i];
        bytes += e->size;
        leased += e->leases;
        for (int t = 0; t < 3; t++) {
            Mapflow__V1__Tier tier = ts[t].tier;
            int on = tier == MAPFLOW__V1__TIER__TIER_GPU    ? e->gpu != NULL
                     : tier == MAPFLOW__V1__TIER__TIER_HOST ? e->host != NULL
                                                            : e->on_ssd;
            ts[t].used_bytes += on ? e->size : 0;
            ts[t].entries += on;
        }
    }
    free(v);
    uint32_t conns = 0;
    for (const mfd_conn_t *k = s->conns; k; k = k->next)
        conns += !k->dead && k->hello_done && k->ns_len == c->ns_len &&
                 memcmp(k->ns, c->ns, c->ns_len) == 0;
    Mapflow__V1__Counter cs[3], *cp[3];
    const char *names[3] = {"namespace_entries", "namespace_bytes", "leases"};
    uint64_t vals[3] = {n, bytes, leased};
    for (int i = 0; i < 3; i++) {
        mapflow__v1__counter__init(&cs[i]);
        cs[i].name = (char *)names[i];
        cs[i].value = vals[i];
        cp[i] = &cs[i];
    }
    Mapflow__V1__StatsReply rep = MAPFLOW__V1__STATS_REPLY__INIT;
    rep.n_tiers = 3;
    rep.tiers = tp;
    rep.n_counters = 3;
    rep.counters = cp;
    rep.uptime_ms = mf_now_ms() - s->start_ms;
    rep.connections = conns;
    REPLY(c, rid, STATS_REPLY, stats_reply, &rep);
}

void mfd_admin_stats(mfd_conn_t *c, uint64_t rid)
{
    mfd_server_t *s = c->srv;
    if (!c->admin) {
        tenant_stats(c, rid);
        return;
    }
    enum { CAP = MFD_C_COUNT + MF_STATUS_COUNT + MFD_H_COUNT + 8 + 2 * MFD_GAUGE_GPU_ARENAS };
    counter_vec_t cv = {calloc(CAP, sizeof(Mapflow__V1__Counter)),
                        calloc(CAP, sizeof(Mapflow__V1__Counter *)), calloc(CAP, 160), 0, CAP};
    if (!cv.items || !cv.ptrs || !cv.names) {
        mfd_conn_error(c, rid, MF_RESOURCE_EXHAUSTED, "Stats: out of memory");
        goto done;
    }
    mfd_metrics_visit(&s->metrics, add_counter, &cv);
    /* The gauges of /metrics too, so a client sees leases and the SSD backlog. */
    mfd_gauges_t g;
    mfd_server_gauges(s, &g);
    add_counter("leases", g.leases, &cv);
    add_counter("reservations", g.reservations, &cv);
    add_counter("put_regions", g.regions, &cv);
    add_counter("ssd_inflight", g.ssd_inflight, &cv);
    add_counter("ssd_write_backlog_bytes", g.wt_backlog_bytes, &cv);
    /* Per GPU arena (the /metrics gauges of the same names). */
    for (size_t i = 0; i < g.n_gpu; i++) {
        char name[64];
        snprintf(name, sizeof(name), "gpu_arena_used_bytes{arena=\"%zu\",device=\"%d\"}", i,
                 g.gpu[i].device);
        add_counter(name, g.gpu[i].used, &cv);
        snprintf(name, sizeof(name), "gpu_arena_entries{arena=\"%zu\",device=\"%d\"}", i,
                 g.gpu[i].device);
        add_counter(name, g.gpu[i].entries, &cv);
    }
    Mapflow__V1__TierStats ts[3], *tp[3];
    fill_tiers(s, ts, tp);
    Mapflow__V1__StatsReply rep = MAPFLOW__V1__STATS_REPLY__INIT;
    rep.n_tiers = 3;
    rep.tiers = tp;
    rep.n_counters = cv.n;
    rep.counters = cv.ptrs;
    rep.uptime_ms = mf_now_ms() - s->start_ms;
    rep.connections = (uint32_t)s->n_conns;
    REPLY(c, rid, STATS_REPLY, stats_reply, &rep);
done:
    free(cv.items);
    free(cv.ptrs);
    free(cv.names);
}

void mfd_admin_health(mfd_conn_t *c, uint64_t rid)
{
    mfd_server_t *s = c->srv;
    Mapflow__V1__TierStats ts[3], *tp[3];
    fill_tiers(s, ts, tp);
    char status[512], gpu[320];
    if (s->store.gpu)
        snprintf(gpu, sizeof(gpu), "gpu on (%zu arena%s, %llu/%llu bytes)", s->store.gpu->n,
                 s->store.gpu->n == 1 ? "" : "s", (unsigned long long)ts[0].used_bytes,
                 (unsigned long long)ts[0].capacity_bytes);
    else
        snprintf(gpu, sizeof(gpu), "gpu off (%s)", s->store.gpu_why);
    snprintf(status, sizeof(status), "%s; host %llu/%llu bytes; ssd %s; %s",
             s->ready ? "serving" : "not ready", (unsigned long long)ts[1].used_bytes,
             (unsigned long long)ts[1].capacity_bytes, s->store.ssd ? "on" : "off", gpu);
    Mapflow__V1__HealthReply rep = MAPFLOW__V1__HEALTH_REPLY__INIT;
    rep.ok = 1;
    rep.ready = s->ready;
    rep.status = status;
    rep.n_tiers = 3;
    rep.tiers = tp;
    REPLY(c, rid, HEALTH_REPLY, health_reply, &rep);
}

/* ---- Evict / Flush / Delete ---------------------------------------------------------- */

void mfd_admin_evict(mfd_conn_t *c, uint64_t rid, const Mapflow__V1__Evict *m)
{
    if (m->tier != MAPFLOW__V1__TIER__TIER_HOST && m->tier != MAPFLOW__V1__TIER__TIER_SSD &&
        m->tier != MAPFLOW__V1__TIER__TIER_GPU) {
        mfd_conn_error(c, rid, MF_INVALID_ARGUMENT, "Evict: tier must be TIER_GPU, TIER_HOST or TIER_SSD");
        return;
    }
    if (m->tier == MAPFLOW__V1__TIER__TIER_GPU && !c->srv->store.gpu) {
        mfd_conn_error(c, rid, MF_FAILED_PRECONDITION, "Evict: the GPU tier is off (%s)",
                       c->srv->store.gpu_why);
        return;
    }
    if (m->tier == MAPFLOW__V1__TIER__TIER_SSD && !c->srv->store.ssd) {
        mfd_conn_error(c, rid, MF_FAILED_PRECONDITION, "Evict: the SSD tier is off");
        return;
    }
    uint64_t bytes, entries;
    uint8_t prefix[MFD_KEY_MAX];
    size_t plen = m->all_namespaces ? 0 : key_prefix(c, NULL, prefix);
    mfd_store_evict(&c->srv->store, (int)m->tier, m->bytes, prefix, plen, &bytes, &entries);
    Mapflow__V1__EvictReply rep = MAPFLOW__V1__EVICT_REPLY__INIT;
    rep.bytes = bytes;
    rep.entries = entries;
    REPLY(c, rid, EVICT_REPLY, evict_reply, &rep);
}

/* Removes matching entries of the connection's namespace (of all with `all`: the
 * dispatcher let only admin connections ask); returns how many. */
static mf_status_t remove_matching(mfd_conn_t *c, int all, const char *model, int has_layer,
                                   uint32_t layer, int skip_leased, uint64_t *count)
{
    uint8_t prefix[MFD_KEY_MAX];
    size_t plen = all ? 0 : key_prefix(c, model, prefix);
    mfd_entry_t **v;
    size_t n;
    *count = 0;
    if (mfd_index_collect(c->srv->store.ix, prefix, plen, &v, &n) != MF_OK)
        return MF_RESOURCE_EXHAUSTED;
    for (size_t i = 0; i < n; i++) {
        if ((has_layer && v[i]->layer != layer) || (skip_leased && v[i]->leases))
            continue;
        mfd_store_remove(&c->srv->store, v[i]);
        (*count)++;
    }
    free(v);
    return MF_OK;
}

void mfd_admin_flush(mfd_conn_t *c, uint64_t rid, const Mapflow__V1__Flush *m)
{
    uint64_t n;
    if (remove_matching(c, m->all_namespaces, NULL, 0, 0, 1, &n) != MF_OK) {
        mfd_conn_error(c, rid, MF_RESOURCE_EXHAUSTED, "Flush: out of memory");
        return;
    }
    if (m->all_namespaces) {
        char who[320];
        mfd_conn_describe(c, who, sizeof(who));
        mfd_info("flush: every namespace: %llu entries dropped (by %s)", (unsigned long long)n,
                 who);
    } else {
        mfd_info("flush: namespace '%s': %llu entries dropped", c->ns, (unsigned long long)n);
    }
    Mapflow__V1__FlushReply rep = MAPFLOW__V1__FLUSH_REPLY__INIT;
    rep.entries = n;
    REPLY(c, rid, FLUSH_REPLY, flush_reply, &rep);
}

void mfd_admin_delete(mfd_conn_t *c, uint64_t rid, const Mapflow__V1__Delete *m)
{
    uint64_t n = 0;
    if (m->key) {
        mfd_key_t k;
        size_t ml = m->key->model ? strlen(m->key->model) : 0;
        if (ml < 1 || ml > MFD_MODEL_MAX || m->key->hash.len != 16) {
            mfd_conn_error(c, rid, MF_INVALID_ARGUMENT,
                           "Delete: key needs a model of 1..255 bytes and a 16-byte hash");
            return;
        }
        mfd_key_make(&k, c->ns, c->ns_len, m->key->model, ml, m->key->layer, m->key->hash.data);
        mfd_entry_t *e = mfd_store_find(&c->srv->store, &k);
        if (e) {
            mfd_store_remove(&c->srv->store, e);
            n = 1;
        }
    } else {
        size_t ml = m->model ? strlen(m->model) : 0;
        if (ml < 1 || ml > MFD_MODEL_MAX) {
            mfd_conn_error(c, rid, MF_INVALID_ARGUMENT, "Delete: give a key or a model");
            return;
        }
        if (remove_matching(c, 0, m->model, m->has_layer, m->layer, 0, &n) != MF_OK) {
            mfd_conn_error(c, rid, MF_RESOURCE_EXHAUSTED, "Delete: out of memory");
            return;
        }
    }
    Mapflow__V1__DeleteReply rep = MAPFLOW__V1__DELETE_REPLY__INIT;
    rep.deleted = n;
    REPLY(c, rid, DELETE_REPLY, delete_reply, &rep);
}

/* ---- Config -------------------------------------------------------------------------- */

void mfd_admin_config_get(mfd_conn_t *c, uint64_t rid, const Mapflow__V1__ConfigGet *m)
{
    mfd_server_t *s = c->srv;
    size_t total = mfd_config_count();
    Mapflow__V1__ConfigItem items[64], *ptrs[64];
    char (*values)[4352] = calloc(64, sizeof(*values));
    size_t n = 0;
    if (!values) {
        mfd_conn_error(c, rid, MF_RESOURCE_EXHAUSTED, "ConfigGet: out of memory");
        return;
    }
    for (size_t i = 0; i < total && n < 64; i++) {
        const char *k = mfd_config_key(i);
        if (m->key && m->key[0] && strcmp(m->key, k) != 0)
            continue;
        mapflow__v1__config_item__init(&items[n]);
        mfd_config_get(&s->cfg, k, 1, values[n], sizeof(values[n]));
        items[n].key = (char *)k;
        items[n].value = values[n];
        items[n].live = mfd_config_is_live(k) == 1;
        ptrs[n] = &items[n];
        n++;
    }
    if (n == 0) {
        mfd_conn_error(c, rid, MF_NOT_FOUND, "ConfigGet: unknown key '%s'", m->key);
    } else {
        Mapflow__V1__ConfigGetReply rep = MAPFLOW__V1__CONFIG_GET_REPLY__INIT;
        rep.n_items = n;
        rep.items = ptrs;
        REPLY(c, rid, CONFIG_GET_REPLY, config_get_reply, &rep);
    }
    free(values);
}

void mfd_admin_config_set(mfd_conn_t *c, uint64_t rid, const Mapflow__V1__ConfigSet *m)
{
    char err[MFD_CONFIG_ERRLEN], who[320];
    const char *key = m->key ? m->key : "";
    mfd_conn_describe(c, who, sizeof(who));
    mf_status_t st = mfd_config_apply(&c->srv->cfg, key, m->value ? m->value : "", who, err,
                                      sizeof(err));
    if (st != MF_OK) {
        mfd_conn_error(c, rid, st, "ConfigSet: %s", err);
        return;
    }
    char value[4352];
    mfd_config_get(&c->srv->cfg, key, 1, value, sizeof(value));
    Mapflow__V1__ConfigItem item = MAPFLOW__V1__CONFIG_ITEM__INIT;
    item.key = (char *)key;
    item.value = value;
    item.live = 1;
    Mapflow__V1__ConfigSetReply rep = MAPFLOW__V1__CONFIG_SET_REPLY__INIT;
    rep.item = &item;
    REPLY(c, rid, CONFIG_SET_REPLY, config_set_reply, &rep);
}

/* ---- Profiles ------------------------------------------------------------------------ */

typedef struct profile_req {
    mfd_conn_t *c;
    uint64_t rid;
} profile_req_t;

/* A request's context, or NULL after replying RESOURCE_EXHAUSTED. */
static profile_req_t *profile_req(mfd_conn_t *c, uint64_t rid)
{
    profile_req_t *r = calloc(1, sizeof(*r));
    if (!r) {
        mfd_conn_error(c, rid, MF_RESOURCE_EXHAUSTED, "profile: out of memory");
        return NULL;
    }
    r->c = c;
    r->rid = rid;
    return r;
}

/* A profile call that did not start: its error, as before the store owned profiles
 * ("profiles live in the SSD tier, which is off" stands alone). */
static void profile_refused(mfd_conn_t *c, uint64_t rid, profile_req_t *r, mf_status_t st,
                            const char *what, const char *why)
{
    free(r);
    if (st == MF_UNAVAILABLE)
        mfd_conn_error(c, rid, st, "%s", why);
    else
        mfd_conn_error(c, rid, st, "%s: %s", what, why);
}

static mf_status_t check_profile(const Mapflow__V1__MappingProfile *p, const char **why)
{
    size_t sl = p->source_model ? strlen(p->source_model) : 0;
    size_t tl = p->target_model ? strlen(p->target_model) : 0;
    if (sl < 1 || sl > MFD_MODEL_MAX || tl < 1 || tl > MFD_MODEL_MAX) {
        *why = "source_model and target_model must be 1..255 bytes";
        return MF_INVALID_ARGUMENT;
    }
    for (size_t i = 0; i < p->n_layers; i++) {
        const Mapflow__V1__LayerMap *l = p->layers[i];
        if (l->target_heads < 1 || l->target_heads > 1024 || l->source_heads < 1 ||
            l->source_heads > 1024 ||
            l->n_w != (size_t)l->target_heads * l->source_heads) {
            *why = "a layer's w must hold target_heads × source_heads values (heads 1..1024)";
            return MF_INVALID_ARGUMENT;
        }
        if (l->n_heads && l->n_heads != l->target_heads) {
            *why = "a layer's heads must be empty or hold target_heads entries";
            return MF_INVALID_ARGUMENT;
        }
        for (uint32_t t = 0; t < l->target_heads; t++) {
            double sum = 0;
            for (uint32_t s = 0; s < l->source_heads; s++) {
                float w = l->w[(size_t)t * l->source_heads + s];
                if (!isfinite(w) || w < 0) {
                    *why = "w must be finite and non-negative";
                    return MF_INVALID_ARGUMENT;
                }
                sum += w;
            }
            if (fabs(sum - 1.0) > 1e-3) {
                *why = "each row of w must sum to 1";
                return MF_INVALID_ARGUMENT;
            }
        }
    }
    return MF_OK;
}

static void on_profile_put(void *arg, mf_status_t st, const uint8_t *val, size_t len)
{
    profile_req_t *r = arg;
    (void)val;
    (void)len;
    if (st != MF_OK) {
        mfd_conn_error(r->c, r->rid, MF_UNAVAILABLE, "ProfilePut: SSD write failed");
    } else {
        Mapflow__V1__ProfilePutReply rep = MAPFLOW__V1__PROFILE_PUT_REPLY__INIT;
        REPLY(r->c, r->rid, PROFILE_PUT_REPLY, profile_put_reply, &rep);
    }
    mfd_conn_unhold(r->c);
    free(r);
}

static void on_profile_get(void *arg, mf_status_t st, const uint8_t *val, size_t len)
{
    profile_req_t *r = arg;
    if (st == MF_NOT_FOUND) {
        mfd_conn_error(r->c, r->rid, MF_NOT_FOUND, "ProfileGet: no such profile");
    } else if (st != MF_OK) {
        mfd_conn_error(r->c, r->rid, MF_UNAVAILABLE, "ProfileGet: SSD read failed");
    } else {
        Mapflow__V1__MappingProfile *p = mapflow__v1__mapping_profile__unpack(NULL, len, val);
        if (!p) {
            mfd_conn_error(r->c, r->rid, MF_DATA_LOSS, "ProfileGet: stored profile is corrupt");
        } else {
            Mapflow__V1__ProfileGetReply rep = MAPFLOW__V1__PROFILE_GET_REPLY__INIT;
            rep.profile = p;
            REPLY(r->c, r->rid, PROFILE_GET_REPLY, profile_get_reply, &rep);
            mapflow__v1__mapping_profile__free_unpacked(p, NULL);
        }
    }
    mfd_conn_unhold(r->c);
    free(r);
}

void mfd_admin_profile_put(mfd_conn_t *c, uint64_t rid, const Mapflow__V1__ProfilePut *m)
{
    const char *why = NULL;
    if (!m->profile) {
        mfd_conn_error(c, rid, MF_INVALID_ARGUMENT, "ProfilePut: missing profile");
        return;
    }
    if (check_profile(m->profile, &why) != MF_OK) {
        mfd_conn_error(c, rid, MF_INVALID_ARGUMENT, "ProfilePut: %s", why);
        return;
    }
    profile_req_t *r = profile_req(c, rid);
    if (!r)
        return;
    size_t len = mapflow__v1__mapping_profile__get_packed_size(m->profile);
    uint8_t *packed = malloc(len ? len : 1);
    if (!packed) {
        free(r);
        mfd_conn_error(c, rid, MF_RESOURCE_EXHAUSTED, "ProfilePut: out of memory");
        return;
    }
    mapflow__v1__mapping_profile__pack(m->profile, packed);
    mfd_conn_hold(c); /* the callback unholds; a refused call does below */
    mf_status_t st = mfd_profile_put(&c->srv->store, c->ns, m->profile->source_model,
                                     m->profile->target_model, packed, len, on_profile_put, r,
                                     &why);
    if (st != MF_OK) {
        mfd_conn_unhold(c);
        profile_refused(c, rid, r, st, "profile", why);
    }
}

void mfd_admin_profile_get(mfd_conn_t *c, uint64_t rid, const Mapflow__V1__ProfileGet *m)
{
    const char *why = NULL;
    profile_req_t *r = profile_req(c, rid);
    if (!r)
        return;
    mfd_conn_hold(c); /* the callback unholds; a refused call does below */
    mf_status_t st = mfd_profile_get(&c->srv->store, c->ns, m->source_model, m->target_model,
                                     on_profile_get, r, &why);
    if (st != MF_OK) {
        mfd_conn_unhold(c);
        profile_refused(c, rid, r, st, "profile", why);
    }
}

/* ProfileList: one page of the namespace's profiles from the page token on. The token is
 * the last listed key after the namespace (u8 len src u8 len tgt). */
static void on_profile_list(void *arg, mf_status_t st, const mfd_profile_page_t *pg)
{
    profile_req_t *op = arg;
    size_t n = mfd_profile_page_count(pg);
    Mapflow__V1__ProfileInfo *items = calloc(n ? n : 1, sizeof(*items));
    Mapflow__V1__ProfileInfo **ptrs = calloc(n ? n : 1, sizeof(*ptrs));
    char (*names)[2][MFD_MODEL_MAX + 1] = calloc(n ? n : 1, sizeof(*names));
    /* Decoded records stay until the reply is packed: created_by points into them. */
    Mapflow__V1__MappingProfile **decoded = calloc(n ? n : 1, sizeof(*decoded));
    if (st != MF_OK) {
        mfd_conn_error(op->c, op->rid, st, "ProfileList: SSD scan failed");
        goto done;
    }
    if (!items || !ptrs || !names || !decoded) {
        mfd_conn_error(op->c, op->rid, MF_RESOURCE_EXHAUSTED, "ProfileList: out of memory");
        goto done;
    }
    size_t pos = 0, k = 0, slen, vlen, last_len = 0;
    const uint8_t *suf, *val, *last = NULL;
    while (k < n && mfd_profile_page_next(pg, &pos, &suf, &slen, &val, &vlen)) {
        Mapflow__V1__ProfileInfo *it = &items[k];
        mapflow__v1__profile_info__init(it);
        /* The names come from the key (they are what ProfileGet takes); the rest from
         * the record, which a corrupt value leaves at zero rather than failing the page. */
        size_t a = slen ? suf[0] : 0;
        size_t b = 1 + a < slen ? suf[1 + a] : 0;
        if (slen != 2 + a + b) {
            mfd_warn("ssd: skipping a malformed profile key (%zu bytes)", slen);
            continue;
        }
        memcpy(names[k][0], suf + 1, a);
        memcpy(names[k][1], suf + 2 + a, b);
        it->source_model = names[k][0];
        it->target_model = names[k][1];
        it->encoded_bytes = vlen;
        Mapflow__V1__MappingProfile *p = mapflow__v1__mapping_profile__unpack(NULL, vlen, val);
        decoded[k] = p;
        if (p) {
            it->block_size = p->block_size;
            it->l0 = p->l0;
            it->target_layers = p->target_layers;
            it->mapped_layers = (uint32_t)p->n_layers;
            it->created_by = p->created_by;
        }
        last = suf;
        last_len = slen;
        ptrs[k++] = it;
    }
    Mapflow__V1__ProfileListReply rep = MAPFLOW__V1__PROFILE_LIST_REPLY__INIT;
    rep.n_profiles = k;
    rep.profiles = ptrs;
    if (mfd_profile_page_more(pg) && last_len) {
        rep.next_page_token.data = (uint8_t *)last;
        rep.next_page_token.len = last_len;
    }
    REPLY(op->c, op->rid, PROFILE_LIST_REPLY, profile_list_reply, &rep);
    for (size_t i = 0; i < k; i++)
        if (decoded[i])
            mapflow__v1__mapping_profile__free_unpacked(decoded[i], NULL);
done:
    free(items);
    free(ptrs);
    free(names);
    free(decoded);
    mfd_conn_unhold(op->c);
    free(op);
}

void mfd_admin_profile_list(mfd_conn_t *c, uint64_t rid, const Mapflow__V1__ProfileList *m)
{
    uint32_t page = m->page_size ? m->page_size : 100;
    if (page > 1000 || m->page_token.len > 2 + 2 * MFD_MODEL_MAX) {
        mfd_conn_error(c, rid, MF_INVALID_ARGUMENT,
                       "ProfileList: page_size ≤ 1000, page_token from a ProfileListReply");
        return;
    }
    const char *why = NULL;
    profile_req_t *r = profile_req(c, rid);
    if (!r)
        return;
    mfd_conn_hold(c); /* the callback unholds; a refused call does below */
    mf_status_t st = mfd_profile_list(&c->srv->store, c->ns, m->page_token.data,
                                      m->page_token.len, page, on_profile_list, r, &why);
    if (st != MF_OK) {
        mfd_conn_unhold(c);
        profile_refused(c, rid, r, st, "ProfileList", why);
    }
}
