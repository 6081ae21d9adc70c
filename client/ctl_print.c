/* ctl_print — mapflowctl's renderers of daemon replies, text and JSON (ctl.h). */
#include <inttypes.h>
#include <math.h>
#include <string.h>

#include "ctl.h"
#include "mapflow.pb-c.h"

void print_tiers(const mf_tier_stats_t *t, size_t n, int json)
{
    for (size_t i = 0; i < n; i++) {
        if (json)
            printf("%s{\"tier\":\"%s\",\"enabled\":%s,\"used_bytes\":%" PRIu64
                   ",\"capacity_bytes\":%" PRIu64 ",\"entries\":%" PRIu64,
                   i ? "," : "", mf_tier_name(t[i].tier), t[i].enabled ? "true" : "false",
                   t[i].used_bytes, t[i].capacity_bytes, t[i].entries);
        else
            printf("tier %-4s %-3s used %" PRIu64 " / %" PRIu64 " bytes, %" PRIu64
                   " entries", mf_tier_name(t[i].tier), t[i].enabled ? "on" : "off",
                   t[i].used_bytes, t[i].capacity_bytes, t[i].entries);
        /* An operator's first question about a tier that is off is why. */
        if (json) {
            if (!t[i].enabled) {
                printf(",\"why_off\":");
                json_str(t[i].why_off);
            }
            printf("}");
        } else {
            if (!t[i].enabled && t[i].why_off[0])
                printf(" (off: %s)", t[i].why_off);
            printf("\n");
        }
    }
}

/* Prometheus naming: counters end in _total (or are a histogram's _count); everything
 * else (leases, reservations, backlog, arena use) is a gauge, which has no rate. */
int is_counter(const char *name)
{
    size_t n = strcspn(name, "{");
    return (n > 6 && !strncmp(name + n - 6, "_total", 6)) ||
           (n > 6 && !strncmp(name + n - 6, "_count", 6));
}

double counter_rate(const mf_stats_t *s, const mf_stats_t *prev, size_t i, double dt)
{
    int found = 0;
    uint64_t was = prev ? mf_stats_counter(prev, s->counters[i].name, &found) : 0;
    uint64_t now = s->counters[i].value;
    /* A counter that went down (a daemon restart) counts from zero. */
    return found && dt > 0 ? (double)(now >= was ? now - was : now) / dt : 0;
}

void print_stats_json(const mf_stats_t *s, const mf_stats_t *prev, double dt)
{
    printf("{\"uptime_ms\":%" PRIu64 ",\"connections\":%u,\"tiers\":[", s->uptime_ms,
           s->connections);
    print_tiers(s->tiers, s->n_tiers, 1);
    printf("],\"counters\":{");
    for (size_t i = 0; i < s->n_counters; i++) {
        printf("%s", i ? "," : "");
        json_str(s->counters[i].name);
        printf(":%" PRIu64, s->counters[i].value);
    }
    printf("}");
    if (prev) { /* per second over the last interval, counters only */
        printf(",\"interval_s\":%.3f,\"rates\":{", dt);
        for (size_t i = 0, k = 0; i < s->n_counters; i++) {
            if (!is_counter(s->counters[i].name))
                continue;
            printf("%s", k++ ? "," : "");
            json_str(s->counters[i].name);
            printf(":%.3f", counter_rate(s, prev, i, dt));
        }
        printf("}");
    }
    printf("}\n");
}

/* The watch view of --interval: tiers on one line, the counters that are not zero with
 * their rates, the gauges packed a few per line, and a count of the zero counters. */
void print_stats_watch(const mf_stats_t *s, const mf_stats_t *prev, double dt)
{
    printf("uptime %" PRIu64 " ms, %u connections;", s->uptime_ms, s->connections);
    for (size_t i = 0; i < s->n_tiers; i++) {
        const mf_tier_stats_t *t = &s->tiers[i];
        if (t->enabled)
            printf(" %s %" PRIu64 "/%" PRIu64 " B %" PRIu64 " entries%s", mf_tier_name(t->tier),
                   t->used_bytes, t->capacity_bytes, t->entries, i + 1 < s->n_tiers ? "," : "");
        else
            printf(" %s off%s", mf_tier_name(t->tier), i + 1 < s->n_tiers ? "," : "");
    }
    printf("\n");
    size_t zero = 0, col = 0;
    for (size_t i = 0; i < s->n_counters; i++) {
        const mf_counter_t *k = &s->counters[i];
        if (!is_counter(k->name))
            continue;
        if (k->value == 0) {
            zero++;
            continue;
        }
        printf("  %-44s %14" PRIu64, k->name, k->value);
        if (prev)
            printf(" %12.1f/s", counter_rate(s, prev, i, dt));
        printf("\n");
    }
    for (size_t i = 0; i < s->n_counters; i++) {
        const mf_counter_t *k = &s->counters[i];
        if (is_counter(k->name))
            continue;
        int w = printf("%s%s %" PRIu64, col ? "  " : "  gauges: ", k->name, k->value);
        col += w > 0 ? (size_t)w : 0;
        if (col > 80) {
            printf("\n");
            col = 0;
        }
    }
    printf("%s  (%zu counters at 0)\n", col ? "\n" : "", zero);
}

void print_stats(const mf_stats_t *s, int json)
{
    if (json) {
        print_stats_json(s, NULL, 0);
        return;
    }
    printf("uptime %" PRIu64 " ms, %u connections\n", s->uptime_ms, s->connections);
    print_tiers(s->tiers, s->n_tiers, 0);
    for (size_t i = 0; i < s->n_counters; i++)
        printf("%s %" PRIu64 "\n", s->counters[i].name, s->counters[i].value);
}

void print_entry(const mf_entry_info_t *e, int json, int first)
{
    char hex[MF_HASH_HEX_LEN + 1];
    mf_hash_to_hex(e->hash, hex);
    if (json) {
        printf("%s{\"model\":", first ? "" : ",");
        json_str(e->model);
        printf(",\"layer\":%u,\"block\":%u,\"hash\":\"%s\",\"size\":%" PRIu64
               ",\"tier\":\"%s\",\"on_ssd\":%s,\"pins\":%u,\"last_access_ms\":%" PRIu64 "}",
               e->layer, e->block, hex, e->size, mf_tier_name(e->tier),
               e->on_ssd ? "true" : "false", e->pins, e->last_access_ms);
        return;
    }
    text_strn(e->model, strlen(e->model));
    printf("\t%u\t%u\t%s\t%" PRIu64 "\t%s%s\t%u\n", e->layer, e->block, hex, e->size,
           mf_tier_name(e->tier), e->on_ssd && e->tier != MF_TIER_SSD ? "+ssd" : "", e->pins);
}

void print_profile_info(const mf_profile_info_t *p, int json, int first)
{
    if (json) {
        printf("%s{\"source_model\":", first ? "" : ",");
        json_str(p->source_model);
        printf(",\"target_model\":");
        json_str(p->target_model);
        printf(",\"block_size\":%u,\"l0\":%u,\"target_layers\":%u,\"mapped_layers\":%u,"
               "\"encoded_bytes\":%" PRIu64 ",\"created_by\":",
               p->block_size, p->l0, p->target_layers, p->mapped_layers, p->encoded_bytes);
        json_str(p->created_by);
        printf("}");
        return;
    }
    text_strn(p->source_model, strlen(p->source_model));
    putchar('\t');
    text_strn(p->target_model, strlen(p->target_model));
    printf("\t%u\t%u/%u\t%" PRIu64 "\t", p->block_size, p->mapped_layers, p->target_layers,
           p->encoded_bytes);
    text_strn(p->created_by, strlen(p->created_by));
    putchar('\n');
}

void print_items(const mf_config_item_t *it, size_t n, int json)
{
    if (json)
        printf("{");
    for (size_t i = 0; i < n; i++) {
        if (json) {
            printf("%s", i ? "," : "");
            json_str(it[i].key);
            printf(":{\"value\":");
            json_str(it[i].value);
            printf(",\"live\":%s}", it[i].live ? "true" : "false");
        } else {
            printf("%s %s%s\n", it[i].key, it[i].value, it[i].live ? "" : "  # restart");
        }
    }
    if (json)
        printf("}\n");
}

void json_float(float f)
{
    if (isfinite(f))
        printf("%.9g", (double)f);
    else
        printf("null");
}

/* A MappingProfile (proto/mapflow.proto) as JSON, field names as in the .proto. */
int print_profile_json(const void *pb, size_t len, const char *out)
{
    static const char *const modes[] = {"compute", "prob", "mask"};
    Mapflow__V1__MappingProfile *p = mapflow__v1__mapping_profile__unpack(NULL, len, pb);
    if (!p) {
        report(MF_DATA_LOSS, "profile get", "the daemon returned an undecodable profile");
        return EXIT_DAEMON;
    }
    printf("{\"source_model\":");
    json_str(p->source_model ? p->source_model : "");
    printf(",\"target_model\":");
    json_str(p->target_model ? p->target_model : "");
    printf(",\"block_size\":%u,\"l0\":%u,\"target_layers\":%u,\"created_by\":", p->block_size,
           p->l0, p->target_layers);
    json_str(p->created_by ? p->created_by : "");
    printf(",\"recompute\":{\"last_blocks\":%u,\"first_blocks\":%u}",
           p->recompute ? p->recompute->last_blocks : 0,
           p->recompute ? p->recompute->first_blocks : 0);
    printf(",\"bytes\":%zu", len);
    if (out) {
        printf(",\"out\":");
        json_str(out);
    }
    printf(",\"layers\":[");
    for (size_t i = 0; i < p->n_layers; i++) {
        const Mapflow__V1__LayerMap *l = p->layers[i];
        printf("%s{\"target_layer\":%u,\"source_layer\":%u,\"target_heads\":%u,"
               "\"source_heads\":%u,\"error\":", i ? "," : "", l->target_layer,
               l->source_layer, l->target_heads, l->source_heads);
        json_float(l->error);
        printf(",\"w\":[");
        for (size_t k = 0; k < l->n_w; k++) {
            printf("%s", k ? "," : "");
            json_float(l->w[k]);
        }
        printf("],\"heads\":[");
        for (size_t k = 0; k < l->n_heads; k++) {
            const Mapflow__V1__HeadProfile *h = l->heads[k];
            printf("%s{\"mode\":\"%s\",\"error\":", k ? "," : "",
                   (unsigned)h->mode < 3 ? modes[h->mode] : "unknown");
            json_float(h->error);
            printf(",\"top_p\":");
            json_float(h->top_p);
            printf("}");
        }
        printf("]}");
    }
    printf("]}\n");
    mapflow__v1__mapping_profile__free_unpacked(p, NULL);
    return 0;
}
