/*
 * mapflowctl — admin CLI of mapflowd, a thin shell over libmapflow (mapflow.h).
 *
 * Exit codes: 0 ok, 1 error reported by the daemon (or a failed check such as an
 * unhealthy daemon), 2 usage, 3 cannot connect. Machine output (--json) goes to stdout,
 * diagnostics to stderr. Single-threaded tool; exit() only from main's helpers here.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "mapflow.h"
#include "mapflow.pb-c.h"
#include "mf_addr.h"

#define EXIT_DAEMON 1
#define EXIT_USAGE 2
#define EXIT_CONNECT 3

static const char usage_text[] =
    "NAME\n"
    "    mapflowctl - talk to a mapflowd daemon\n"
    "\n"
    "SYNOPSIS\n"
    "    mapflowctl [--socket PATH | --addr HOST:PORT] [--ns NS] [--token T] [--json]\n"
    "               [--admin-socket PATH] [--admin-token T] [--timeout MS] COMMAND [ARGS]\n"
    "\n"
    "COMMANDS\n"
    "    health                       daemon and tier health (exit 1 if not ok)\n"
    "    stats [--interval S [--count N]]\n"
    "                                 tiers and counters; with --interval, again every S\n"
    "                                 seconds (watch-style) with per-second rates of the\n"
    "                                 counters, N samples (default: until interrupted)\n"
    "    ls [--model M] [--layer L] [--page-size N] [--pages P] [--page-token T]\n"
    "                                 list entries of the namespace: every page, or P pages\n"
    "                                 from token T (hex); the token of the page after them\n"
    "                                 is printed (stderr; \"next_page_token\" with --json)\n"
    "    put --row FILE [--row FILE...] [--durable]\n"
    "                                 store encoded rows (all in one batch); the key is\n"
    "                                 read from the row\n"
    "    get --model M --layer L --hash HEX --out FILE [--peer H:P]\n"
    "                                 fetch one row by key into FILE; with --peer, a row\n"
    "                                 missing here is read through from the daemon whose\n"
    "                                 UCX listener is H:P (and cached here)\n"
    "    lookup --model M --block B --tokens FILE --layers LIST [--peer H:P]\n"
    "                                 cached leading blocks per layer (LIST: 0,1,4-7); with\n"
    "                                 --peer, the larger of this daemon's and the peer's\n"
    "                                 count\n"
    "    del --model M [--layer L] [--hash HEX]\n"
    "                                 delete one key (with --hash), a layer or a model\n"
    "    evict --tier gpu|host|ssd [--bytes N] [--all-namespaces]\n"
    "                                 demote (gpu -> host -> ssd) / drop (ssd) unpinned\n"
    "                                 entries (N: 0 = to the low watermark; units k, m,\n"
    "                                 g, t = powers of 1024); a tier that is off fails;\n"
    "                                 --all-namespaces: of every namespace (admin)\n"
    "    flush [--all-namespaces]     drop every unpinned entry of the namespace (of every\n"
    "                                 namespace: admin)\n"
    "    config get [KEY]             show one key or all\n"
    "    config set KEY VALUE         change a live key (admin)\n"
    "    profile put --file F         store a mapping profile (encoded MappingProfile; admin)\n"
    "    profile get --source S --target T [--out F]\n"
    "                                 fetch one (raw protobuf to F or a pipe; --json: its\n"
    "                                 fields as JSON)\n"
    "    hash --model M --block B --tokens FILE [--ns NS]\n"
    "                                 print one prefix hash per full block (no daemon)\n"
    "\n"
    "OPTIONS\n"
    "    --socket PATH   unix socket (default: $MAPFLOW_SOCKET, else\n"
    "                    $XDG_RUNTIME_DIR/mapflowd/mapflowd.sock, else\n"
    "                    /tmp/mapflowd-$UID/mapflowd.sock)\n"
    "    --addr H:P      TCP instead of the unix socket (needs --token if the daemon has one);\n"
    "                    ucx:H:P: UCX to the daemon's ucx listener (rows move one-sided;\n"
    "                    needs --token; UCX_* variables apply, e.g. UCX_TLS=tcp)\n"
    "    --ns NS         namespace (default \"default\")\n"
    "    --token T       shared token (default: $MAPFLOW_TOKEN)\n"
    "    --admin-socket PATH\n"
    "                    the daemon's admin socket, used by the commands marked admin\n"
    "                    (default: $MAPFLOW_ADMIN_SOCKET, else the socket path with\n"
    "                    NAME.sock -> NAME-admin.sock); with --addr, admin commands go there\n"
    "                    and need --admin-token\n"
    "    --admin-token T the daemon's admin_token, sent in Hello (default:\n"
    "                    $MAPFLOW_ADMIN_TOKEN)\n"
    "    --json          machine-readable output (every command; errors as\n"
    "                    {\"error\":{...}} on stdout)\n"
    "    --timeout MS    per-call deadline (default 30000)\n"
    "\n"
    "FILES\n"
    "    Token files are raw little-endian u32 arrays. Rows are the proto/mf_row.h format.\n"
    "\n"
    "EXIT STATUS\n"
    "    0 ok, 1 error from the daemon, 2 usage, 3 cannot connect.\n";

typedef struct ctl {
    const char *socket;
    const char *addr;
    const char *ns;
    const char *token;
    const char *admin_socket, *admin_token;
    int admin;               /* this command needs the admin path */
    int json;
    int64_t timeout_ms;
    mf_channel_t *ch;
} ctl_t;

static __attribute__((noreturn, format(printf, 1, 2))) void usage_fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("mapflowctl: ", stderr);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputs("\n(see mapflowctl --help)\n", stderr);
    exit(EXIT_USAGE);
}

/* Reports a failed call and returns the exit code it maps to. */
static int fail(ctl_t *c, const char *what, mf_status_t st)
{
    const char *msg = c->ch ? mf_channel_last_error(c->ch) : "";
    fprintf(stderr, "mapflowctl: %s: %s%s%s\n", what, mf_status_name(st), msg[0] ? ": " : "",
            msg);
    if (c->json)
        printf("{\"error\":{\"code\":%d,\"status\":\"%s\"}}\n", (int)st, mf_status_name(st));
    return st == MF_UNAVAILABLE ? EXIT_CONNECT : EXIT_DAEMON;
}

/* ==== parsing helpers ================================================================ */

static uint64_t parse_u64(const char *s, const char *what, int units)
{
    char *end;
    errno = 0;
    if (!s || !*s || *s == '-')
        usage_fail("%s: expected a number", what);
    unsigned long long v = strtoull(s, &end, 0);
    int shift = 0;
    if (units && *end) {
        const char *u = "kmgt";
        const char *p = strchr(u, *end | 0x20);
        if (p) {
            shift = 10 * (int)(p - u + 1);
            end++;
            if ((*end | 0x20) == 'i')
                end++;
            if ((*end | 0x20) == 'b')
                end++;
        }
    }
    if (errno || *end || (shift && v > (UINT64_MAX >> shift)))
        usage_fail("%s: '%s' is not a valid number", what, s);
    return (uint64_t)v << shift;
}

static uint32_t parse_u32(const char *s, const char *what)
{
    uint64_t v = parse_u64(s, what, 0);
    if (v > UINT32_MAX)
        usage_fail("%s: %s is out of range", what, s);
    return (uint32_t)v;
}

/* Seconds, fractions allowed: 0.001 .. 86400. */
static double parse_seconds(const char *s, const char *what)
{
    char *end;
    errno = 0;
    double v = s ? strtod(s, &end) : 0;
    if (!s || !*s || errno || *end || !(v >= 0.001 && v <= 86400))
        usage_fail("%s: '%s' is not a number of seconds in [0.001, 86400]", what, s ? s : "");
    return v;
}

/* Hex text → bytes (page tokens); the caller frees *out. */
static size_t parse_hex_bytes(const char *s, const char *what, uint8_t **out)
{
    size_t n = strlen(s);
    if (n == 0 || n % 2 || n > 4096)
        usage_fail("%s: expected an even number of hex digits", what);
    uint8_t *b = malloc(n / 2);
    if (!b)
        usage_fail("out of memory");
    for (size_t i = 0; i < n / 2; i++) {
        unsigned v;
        if (sscanf(s + 2 * i, "%2x", &v) != 1 || !strchr("0123456789abcdefABCDEF", s[2 * i]) ||
            !strchr("0123456789abcdefABCDEF", s[2 * i + 1]))
            usage_fail("%s: '%s' is not hex", what, s);
        b[i] = (uint8_t)v;
    }
    *out = b;
    return n / 2;
}

static void print_hex(FILE *f, const uint8_t *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        fprintf(f, "%02x", b[i]);
}

/* "0,1,4-7" → layers; the caller frees *out. */
static size_t parse_layers(const char *s, uint32_t **out)
{
    size_t n = 0, cap = 16;
    uint32_t *v = malloc(cap * sizeof(*v));
    char *dup = strdup(s ? s : "");
    if (!v || !dup)
        usage_fail("out of memory");
    char *save = NULL;
    for (char *tok = strtok_r(dup, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char *dash = strchr(tok, '-');
        if (dash)
            *dash = '\0';
        uint32_t lo = parse_u32(tok, "--layers"), hi = dash ? parse_u32(dash + 1, "--layers") : lo;
        if (hi < lo || hi - lo > 65536)
            usage_fail("--layers: bad range %u-%u", lo, hi);
        for (uint64_t l = lo; l <= hi; l++) {
            if (n == cap) {
                cap *= 2;
                v = realloc(v, cap * sizeof(*v));
                if (!v)
                    usage_fail("out of memory");
            }
            v[n++] = (uint32_t)l;
        }
    }
    free(dup);
    if (n == 0)
        usage_fail("--layers: empty list");
    *out = v;
    return n;
}

/* Reads a whole file; *len receives its size. NULL (and errno set) on failure. */
static void *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 1 << 16, n = 0;
    uint8_t *b = aligned_alloc(16, cap);
    while (b) {
        size_t r = fread(b + n, 1, cap - n, f);
        n += r;
        if (r == 0)
            break;
        if (n == cap) {
            uint8_t *nb = aligned_alloc(16, cap * 2);
            if (nb)
                memcpy(nb, b, n);
            free(b);
            b = nb;
            cap *= 2;
        }
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(b);
        errno = EIO;
        return NULL;
    }
    *len = n;
    return b;
}

static uint32_t *read_tokens(const char *path, size_t *n)
{
    if (!path)
        usage_fail("--tokens FILE is required");
    size_t len;
    uint32_t *t = read_file(path, &len);
    if (!t) {
        fprintf(stderr, "mapflowctl: %s: %s\n", path, strerror(errno));
        exit(EXIT_USAGE);
    }
    if (len % 4)
        usage_fail("%s: %zu bytes is not a whole number of u32 tokens", path, len);
    *n = len / 4;
    return t;
}

static int write_file(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, len, f) != len || fclose(f) != 0) {
        fprintf(stderr, "mapflowctl: %s: %s\n", path, strerror(errno));
        return EXIT_DAEMON;
    }
    return 0;
}

/* Prints a JSON string literal (the only escaping our values need). */
static void json_str(const char *s)
{
    putchar('"');
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            printf("\\%c", ch);
        else if (ch < 0x20)
            printf("\\u%04x", ch);
        else
            putchar(ch);
    }
    putchar('"');
}

/* Command-level options: getopt_long over argv after the command word. */
typedef struct cmd_opts {
    const char *model, *hash, *out, *tokens, *layers, *tier, *file, *source, *target, *ns;
    const char *page_token;
    const char *rows[64];
    int n_rows;
    int64_t layer;
    uint32_t block, page_size, pages, count;
    uint64_t bytes;
    double interval;
    int durable, all_ns;
    const char *peer;
} cmd_opts_t;

static void parse_cmd_opts(int argc, char **argv, cmd_opts_t *o)
{
    static const struct option lo[] = {
        {"model", 1, 0, 'm'},  {"layer", 1, 0, 'l'},     {"hash", 1, 0, 'H'},
        {"out", 1, 0, 'o'},    {"tokens", 1, 0, 't'},    {"layers", 1, 0, 'L'},
        {"block", 1, 0, 'b'},  {"tier", 1, 0, 'T'},      {"bytes", 1, 0, 'B'},
        {"row", 1, 0, 'r'},    {"durable", 0, 0, 'd'},   {"file", 1, 0, 'f'},
        {"source", 1, 0, 's'}, {"target", 1, 0, 'g'},    {"page-size", 1, 0, 'p'},
        {"ns", 1, 0, 'n'},     {"pages", 1, 0, 'P'},     {"page-token", 1, 0, 'k'},
        {"interval", 1, 0, 'i'}, {"count", 1, 0, 'c'},   {"peer", 1, 0, 'e'},
        {"all-namespaces", 0, 0, 'A'}, {0, 0, 0, 0}};
    memset(o, 0, sizeof(*o));
    o->layer = -1;
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (c) {
        case 'm': o->model = optarg; break;
        case 'l': o->layer = parse_u32(optarg, "--layer"); break;
        case 'H': o->hash = optarg; break;
        case 'o': o->out = optarg; break;
        case 't': o->tokens = optarg; break;
        case 'L': o->layers = optarg; break;
        case 'b': o->block = parse_u32(optarg, "--block"); break;
        case 'T': o->tier = optarg; break;
        case 'B': o->bytes = parse_u64(optarg, "--bytes", 1); break;
        case 'r':
            if (o->n_rows == 64)
                usage_fail("at most 64 --row files");
            o->rows[o->n_rows++] = optarg;
            break;
        case 'd': o->durable = 1; break;
        case 'f': o->file = optarg; break;
        case 's': o->source = optarg; break;
        case 'g': o->target = optarg; break;
        case 'p': o->page_size = parse_u32(optarg, "--page-size"); break;
        case 'n': o->ns = optarg; break;
        case 'P': o->pages = parse_u32(optarg, "--pages"); break;
        case 'k': o->page_token = optarg; break;
        case 'i': o->interval = parse_seconds(optarg, "--interval"); break;
        case 'c': o->count = parse_u32(optarg, "--count"); break;
        case 'e': o->peer = optarg; break;
        case 'A': o->all_ns = 1; break;
        default: usage_fail("bad option for %s", argv[0]);
        }
    }
}

static void need(const void *v, const char *opt, const char *cmd)
{
    if (!v)
        usage_fail("%s needs %s", cmd, opt);
}

static mf_hash128_t parse_hash(const char *s)
{
    mf_hash128_t h;
    if (mf_hash_from_hex(s, &h) != MF_OK)
        usage_fail("--hash: '%s' is not 32 hex digits", s);
    return h;
}

/* ==== commands ======================================================================= */

static void print_tiers(const mf_tier_stats_t *t, size_t n, int json)
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

static int cmd_health(ctl_t *c)
{
    mf_health_t h;
    mf_status_t st = mf_health(c->ch, &h, c->timeout_ms);
    if (st != MF_OK)
        return fail(c, "health", st);
    if (c->json) {
        printf("{\"ok\":%s,\"ready\":%s,\"status\":", h.ok ? "true" : "false",
               h.ready ? "true" : "false");
        json_str(h.status);
        printf(",\"tiers\":[");
        print_tiers(h.tiers, h.n_tiers, 1);
        printf("]}\n");
    } else {
        printf("ok %s, ready %s: %s\n", h.ok ? "yes" : "no", h.ready ? "yes" : "no", h.status);
        print_tiers(h.tiers, h.n_tiers, 0);
    }
    return h.ok ? 0 : EXIT_DAEMON;
}

static void print_stats(const mf_stats_t *s, const mf_stats_t *prev, double dt, int json)
{
    if (json) {
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
    } else {
        printf("uptime %" PRIu64 " ms, %u connections\n", s->uptime_ms, s->connections);
        print_tiers(s->tiers, s->n_tiers, 0);
    }
    /* Rates: per second over the last interval; a counter that went down (a daemon
     * restart) counts from zero. */
    if (json && prev)
        printf(",\"interval_s\":%.3f,\"rates\":{", dt);
    for (size_t i = 0, k = 0; i < s->n_counters; i++) {
        int found = 0;
        uint64_t was = prev ? mf_stats_counter(prev, s->counters[i].name, &found) : 0;
        uint64_t now = s->counters[i].value;
        double rate = found && dt > 0 ? (double)(now >= was ? now - was : now) / dt : 0;
        if (json && prev) {
            printf("%s", k++ ? "," : "");
            json_str(s->counters[i].name);
            printf(":%.3f", rate);
        } else if (!json && prev) {
            printf("%-40s %16" PRIu64 " %12.1f/s\n", s->counters[i].name, now, rate);
        } else if (!json) {
            printf("%s %" PRIu64 "\n", s->counters[i].name, now);
        }
    }
    if (json)
        printf("%s}\n", prev ? "}" : "");
    fflush(stdout);
}

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static int cmd_stats(ctl_t *c, const cmd_opts_t *o)
{
    mf_stats_t *prev = NULL;
    double t_prev = 0;
    int rc = 0;
    for (uint32_t n = 0;; n++) {
        mf_stats_t *s;
        mf_status_t st = mf_stats(c->ch, &s, c->timeout_ms);
        if (st != MF_OK) {
            rc = fail(c, "stats", st);
            break;
        }
        double t = mono_s();
        if (o->interval > 0 && !c->json && isatty(1))
            printf("\033[H\033[2J"); /* watch-style: redraw in place */
        print_stats(s, prev, t - t_prev, c->json);
        mf_stats_free(prev);
        prev = s;
        t_prev = t;
        if (o->interval <= 0 || (o->count && n + 1 >= o->count))
            break;
        struct timespec ts = {(time_t)o->interval,
                              (long)((o->interval - (double)(time_t)o->interval) * 1e9)};
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
            ;
    }
    mf_stats_free(prev);
    return rc;
}

static int cmd_ls(ctl_t *c, const cmd_opts_t *o)
{
    uint8_t *token = NULL;
    size_t token_len = 0, shown = 0;
    if (o->page_token)
        token_len = parse_hex_bytes(o->page_token, "--page-token", &token);
    /* With --pages the JSON is an object carrying the token of the next page; without,
     * the plain list of every entry (as before). */
    int paged = o->pages > 0;
    if (c->json)
        printf(paged ? "{\"entries\":[" : "[");
    for (uint32_t page = 0; !paged || page < o->pages; page++) {
        mf_list_page_t *p;
        mf_status_t st = mf_list(c->ch, o->model, o->layer, o->page_size, token, token_len, &p,
                                 c->timeout_ms);
        free(token);
        token = NULL;
        token_len = 0;
        if (st != MF_OK) {
            if (c->json)
                printf(paged ? "]}\n" : "]\n");
            return fail(c, "ls", st);
        }
        for (size_t i = 0; i < p->n_entries; i++, shown++) {
            const mf_entry_info_t *e = &p->entries[i];
            char hex[MF_HASH_HEX_LEN + 1];
            mf_hash_to_hex(e->hash, hex);
            if (c->json) {
                printf("%s{\"model\":", shown ? "," : "");
                json_str(e->model);
                printf(",\"layer\":%u,\"block\":%u,\"hash\":\"%s\",\"size\":%" PRIu64
                       ",\"tier\":\"%s\",\"on_ssd\":%s,\"pins\":%u,\"last_access_ms\":%" PRIu64
                       "}", e->layer, e->block, hex, e->size, mf_tier_name(e->tier),
                       e->on_ssd ? "true" : "false", e->pins, e->last_access_ms);
            } else {
                printf("%s\t%u\t%u\t%s\t%" PRIu64 "\t%s%s\t%u\n", e->model, e->layer,
                       e->block, hex, e->size, mf_tier_name(e->tier),
                       e->on_ssd && e->tier != MF_TIER_SSD ? "+ssd" : "", e->pins);
            }
        }
        if (p->next_page_token_len) {
            token = p->next_page_token;
            token_len = p->next_page_token_len;
            p->next_page_token = NULL;
        }
        mf_list_page_free(p);
        if (!token)
            break;
    }
    if (c->json && paged) {
        printf("],\"next_page_token\":");
        if (token) {
            putchar('"');
            print_hex(stdout, token, token_len);
            putchar('"');
        } else {
            printf("null");
        }
        printf("}\n");
    } else if (c->json) {
        printf("]\n");
    } else if (token) {
        fprintf(stderr, "next page: --page-token ");
        print_hex(stderr, token, token_len);
        fputc('\n', stderr);
    }
    free(token);
    return 0;
}

static int cmd_put(ctl_t *c, const cmd_opts_t *o)
{
    if (o->n_rows == 0)
        usage_fail("put needs --row FILE");
    mf_put_item_t items[64];
    for (int i = 0; i < o->n_rows; i++) {
        items[i] = (mf_put_item_t){0};
        items[i].row = read_file(o->rows[i], &items[i].len);
        if (!items[i].row) {
            fprintf(stderr, "mapflowctl: %s: %s\n", o->rows[i], strerror(errno));
            for (int k = 0; k < i; k++)
                free((void *)items[k].row);
            return EXIT_USAGE;
        }
    }
    /* One batch: every PutBegin goes out at once (a round trip for all, not per row). */
    mf_status_t st = mf_put_batch(c->ch, items, (size_t)o->n_rows,
                                  o->durable ? MF_PUT_DURABLE : 0, c->timeout_ms);
    int rc = 0;
    for (int i = 0; i < o->n_rows; i++) {
        const mf_put_result_t *r = &items[i].result;
        if (items[i].status != MF_OK) {
            if (rc == 0)
                rc = fail(c, o->rows[i], st);
            free((void *)items[i].row);
            continue;
        }
        mf_row_view_t v;
        mf_row_decode(items[i].row, items[i].len, MF_ROW_NO_CHECKSUM, &v, NULL); /* validated */
        char hex[MF_HASH_HEX_LEN + 1];
        mf_hash_to_hex(v.hash, hex);
        if (c->json) {
            printf("{\"file\":");
            json_str(o->rows[i]);
            printf(",\"model\":\"%.*s\",\"layer\":%u,\"block\":%u,\"hash\":\"%s\",\"size\":%zu,"
                   "\"tier\":\"%s\",\"durable\":%s,\"replaced\":%s}\n", (int)v.model_len,
                   v.model, v.layer, v.block_index, hex, items[i].len, mf_tier_name(r->tier),
                   r->durable ? "true" : "false", r->replaced ? "true" : "false");
        } else {
            printf("put %.*s layer %u block %u %s (%zu bytes) -> %s%s%s\n", (int)v.model_len,
                   v.model, v.layer, v.block_index, hex, items[i].len, mf_tier_name(r->tier),
                   r->durable ? ", durable" : "", r->replaced ? ", replaced" : "");
        }
        free((void *)items[i].row);
    }
    return rc;
}

static int cmd_get(ctl_t *c, const cmd_opts_t *o)
{
    need(o->model, "--model", "get");
    need(o->hash, "--hash", "get");
    need(o->out, "--out", "get");
    if (o->layer < 0)
        usage_fail("get needs --layer");
    mf_key_t k = {o->model, (uint32_t)o->layer, parse_hash(o->hash)};
    mf_get_result_t *r;
    mf_status_t st = mf_get_keys_peer(c->ch, o->peer, &k, 1, MF_GET_COPY, &r, c->timeout_ms);
    if (st != MF_OK)
        return fail(c, "get", st);
    st = r->rows[0].status;
    int rc = st == MF_OK ? write_file(o->out, r->rows[0].data, r->rows[0].length)
                         : fail(c, "get", st);
    if (rc == 0 && c->json)
        printf("{\"out\":\"%s\",\"size\":%zu,\"tier\":\"%s\"}\n", o->out, r->rows[0].length,
               mf_tier_name(r->rows[0].tier));
    else if (rc == 0)
        printf("%zu bytes from %s -> %s\n", r->rows[0].length, mf_tier_name(r->rows[0].tier),
               o->out);
    mf_get_result_free(r);
    return rc;
}

static int cmd_lookup(ctl_t *c, const cmd_opts_t *o)
{
    need(o->model, "--model", "lookup");
    need(o->layers, "--layers", "lookup");
    if (!o->block)
        usage_fail("lookup needs --block B");
    size_t nt;
    uint32_t *tokens = read_tokens(o->tokens, &nt), *layers, total = 0;
    size_t nl = parse_layers(o->layers, &layers);
    uint32_t *blocks = calloc(nl, sizeof(*blocks));
    int rc = 0;
    mf_status_t st = blocks ? mf_lookup_peer(c->ch, o->peer, o->model, o->block, tokens, nt,
                                             layers, nl, blocks, &total, c->timeout_ms)
                            : MF_RESOURCE_EXHAUSTED;
    if (st != MF_OK) {
        rc = fail(c, "lookup", st);
    } else if (c->json) {
        printf("{\"total_blocks\":%u,\"layers\":{", total);
        for (size_t i = 0; i < nl; i++)
            printf("%s\"%u\":%u", i ? "," : "", layers[i], blocks[i]);
        printf("}}\n");
    } else {
        for (size_t i = 0; i < nl; i++)
            printf("layer %u: %u/%u blocks\n", layers[i], blocks[i], total);
    }
    free(blocks);
    free(layers);
    free(tokens);
    return rc;
}

static int cmd_del(ctl_t *c, const cmd_opts_t *o)
{
    need(o->model, "--model", "del");
    uint64_t n = 0;
    mf_status_t st;
    if (o->hash) {
        if (o->layer < 0)
            usage_fail("del --hash needs --layer");
        mf_key_t k = {o->model, (uint32_t)o->layer, parse_hash(o->hash)};
        st = mf_delete(c->ch, &k, &n, c->timeout_ms);
    } else {
        st = mf_delete_model(c->ch, o->model, o->layer, &n, c->timeout_ms);
    }
    if (st != MF_OK)
        return fail(c, "del", st);
    printf(c->json ? "{\"deleted\":%" PRIu64 "}\n" : "deleted %" PRIu64 "\n", n);
    return 0;
}

static int cmd_evict(ctl_t *c, const cmd_opts_t *o)
{
    mf_tier_t t;
    need(o->tier, "--tier gpu|host|ssd", "evict");
    if (mf_tier_parse(o->tier, &t) != MF_OK || t == MF_TIER_NONE)
        usage_fail("--tier: '%s' is not gpu, host or ssd", o->tier);
    uint64_t b = 0, e = 0;
    mf_status_t st = o->all_ns ? mf_evict_all(c->ch, t, o->bytes, &b, &e, c->timeout_ms)
                               : mf_evict(c->ch, t, o->bytes, &b, &e, c->timeout_ms);
    if (st != MF_OK)
        return fail(c, "evict", st);
    printf(c->json ? "{\"bytes\":%" PRIu64 ",\"entries\":%" PRIu64 "}\n"
                   : "evicted %" PRIu64 " bytes, %" PRIu64 " entries\n", b, e);
    return 0;
}

static int cmd_flush(ctl_t *c, const cmd_opts_t *o)
{
    uint64_t n = 0;
    mf_status_t st = o->all_ns ? mf_flush_all(c->ch, &n, c->timeout_ms)
                               : mf_flush(c->ch, &n, c->timeout_ms);
    if (st != MF_OK)
        return fail(c, "flush", st);
    printf(c->json ? "{\"entries\":%" PRIu64 "}\n" : "flushed %" PRIu64 " entries\n", n);
    return 0;
}

static void print_items(const mf_config_item_t *it, size_t n, int json)
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

static int cmd_config(ctl_t *c, int argc, char **argv)
{
    if (argc < 2)
        usage_fail("config get [KEY] | config set KEY VALUE");
    mf_config_item_t *it = NULL;
    size_t n = 0;
    mf_status_t st;
    if (strcmp(argv[1], "get") == 0 && argc <= 3) {
        st = mf_config_get(c->ch, argc == 3 ? argv[2] : "", &it, &n, c->timeout_ms);
    } else if (strcmp(argv[1], "set") == 0 && argc == 4) {
        st = mf_config_set(c->ch, argv[2], argv[3], &it, c->timeout_ms);
        n = it ? 1 : 0;
    } else {
        usage_fail("config get [KEY] | config set KEY VALUE");
    }
    if (st != MF_OK)
        return fail(c, "config", st);
    print_items(it, n, c->json);
    mf_config_items_free(it, n);
    return 0;
}

static void json_float(float f)
{
    if (isfinite(f))
        printf("%.9g", (double)f);
    else
        printf("null");
}

/* A MappingProfile (proto/mapflow.proto) as JSON, field names as in the .proto. */
static int print_profile_json(const void *pb, size_t len, const char *out)
{
    static const char *const modes[] = {"compute", "prob", "mask"};
    Mapflow__V1__MappingProfile *p = mapflow__v1__mapping_profile__unpack(NULL, len, pb);
    if (!p) {
        fprintf(stderr, "mapflowctl: the daemon returned an undecodable profile\n");
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

static int cmd_profile(ctl_t *c, int argc, char **argv)
{
    if (argc < 2)
        usage_fail("profile put --file F | profile get --source S --target T [--out F]");
    const char *sub = argv[1];
    cmd_opts_t o;
    parse_cmd_opts(argc - 1, argv + 1, &o);
    if (strcmp(sub, "put") == 0) {
        need(o.file, "--file", "profile put");
        size_t len;
        void *pb = read_file(o.file, &len);
        if (!pb) {
            fprintf(stderr, "mapflowctl: %s: %s\n", o.file, strerror(errno));
            return EXIT_USAGE;
        }
        mf_status_t st = mf_profile_put(c->ch, pb, len, c->timeout_ms);
        free(pb);
        if (st != MF_OK)
            return fail(c, "profile put", st);
        printf(c->json ? "{\"stored\":true}\n" : "stored\n");
        return 0;
    }
    if (strcmp(sub, "get") != 0)
        usage_fail("profile put|get");
    need(o.source, "--source", "profile get");
    need(o.target, "--target", "profile get");
    void *pb;
    size_t len;
    mf_status_t st = mf_profile_get(c->ch, o.source, o.target, &pb, &len, c->timeout_ms);
    if (st != MF_OK)
        return fail(c, "profile get", st);
    int rc = 0;
    if (o.out)
        rc = write_file(o.out, pb, len);
    if (c->json && rc == 0)
        rc = print_profile_json(pb, len, o.out);
    else if (o.out)
        ;
    else if (isatty(1))
        printf("%zu bytes (use --out FILE)\n", len);
    else
        rc = fwrite(pb, 1, len, stdout) == len ? 0 : EXIT_DAEMON;
    free(pb);
    return rc;
}

static int cmd_hash(const ctl_t *c, const cmd_opts_t *o)
{
    need(o->model, "--model", "hash");
    if (!o->block)
        usage_fail("hash needs --block B");
    size_t nt;
    uint32_t *tokens = read_tokens(o->tokens, &nt);
    size_t nb = nt / o->block, n = 0;
    mf_hash128_t *h = malloc((nb ? nb : 1) * sizeof(*h));
    const char *ns = o->ns ? o->ns : c->ns;
    mf_status_t st = h ? mf_hash_prefix(ns, o->model, o->block, tokens, nt, h, nb, &n)
                       : MF_RESOURCE_EXHAUSTED;
    if (st != MF_OK) {
        fprintf(stderr, "mapflowctl: hash: %s\n", mf_strerror(st));
        free(h);
        free(tokens);
        return EXIT_USAGE;
    }
    if (c->json)
        printf("{\"ns\":");
    if (c->json) {
        json_str(ns);
        printf(",\"model\":");
        json_str(o->model);
        printf(",\"block_size\":%u,\"tokens\":%zu,\"hashes\":[", o->block, nt);
    }
    for (size_t i = 0; i < n; i++) {
        char hex[MF_HASH_HEX_LEN + 1];
        mf_hash_to_hex(h[i], hex);
        if (c->json)
            printf("%s\"%s\"", i ? "," : "", hex);
        else
            puts(hex);
    }
    if (c->json)
        printf("]}\n");
    free(h);
    free(tokens);
    return 0;
}

/* ==== main =========================================================================== */

/* Required options, checked before connecting so usage errors exit 2, not 3. */
static void check_required(const char *cmd, const cmd_opts_t *o)
{
    if (!strcmp(cmd, "get")) {
        need(o->model, "--model", cmd);
        need(o->hash, "--hash", cmd);
        need(o->out, "--out", cmd);
        if (o->layer < 0)
            usage_fail("get needs --layer");
        parse_hash(o->hash);
    } else if (!strcmp(cmd, "lookup")) {
        need(o->model, "--model", cmd);
        need(o->layers, "--layers", cmd);
        need(o->tokens, "--tokens", cmd);
        if (!o->block)
            usage_fail("lookup needs --block B");
    } else if (!strcmp(cmd, "del")) {
        need(o->model, "--model", cmd);
        if (o->hash && o->layer < 0)
            usage_fail("del --hash needs --layer");
    } else if (!strcmp(cmd, "evict")) {
        need(o->tier, "--tier gpu|host|ssd", cmd);
    } else if (!strcmp(cmd, "put") && o->n_rows == 0) {
        usage_fail("put needs --row FILE");
    } else if (!strcmp(cmd, "ls") && o->page_token) {
        uint8_t *t;
        parse_hex_bytes(o->page_token, "--page-token", &t);
        free(t);
    }
    if (o->count && o->interval <= 0)
        usage_fail("--count needs --interval");
    if (o->interval > 0 && strcmp(cmd, "stats"))
        usage_fail("--interval is an option of stats");
    if (o->peer && strcmp(cmd, "get") && strcmp(cmd, "lookup"))
        usage_fail("--peer is an option of get and lookup");
    if (o->peer && !strchr(o->peer, ':'))
        usage_fail("--peer: '%s' is not HOST:PORT", o->peer);
    if (o->all_ns && strcmp(cmd, "flush") && strcmp(cmd, "evict"))
        usage_fail("--all-namespaces is an option of flush and evict");
}

static const char *default_socket(char *buf, size_t cap)
{
    const char *env = getenv("MAPFLOW_SOCKET");
    if (env && env[0])
        return env;
    const char *xdg = getenv("XDG_RUNTIME_DIR");
    if (xdg && xdg[0])
        snprintf(buf, cap, "%s/mapflowd/mapflowd.sock", xdg);
    else
        snprintf(buf, cap, "/tmp/mapflowd-%u/mapflowd.sock", (unsigned)getuid());
    return buf;
}

static int connect_ctl(ctl_t *c)
{
    char path[4096], target[4200];
    if (c->addr && (!strncmp(c->addr, "ucx:", 4) || !strncmp(c->addr, "tcp:", 4)))
        snprintf(target, sizeof(target), "%s", c->addr);
    else if (c->addr)
        snprintf(target, sizeof(target), "tcp:%s", c->addr);
    else if (c->admin && c->admin_socket)
        snprintf(target, sizeof(target), "unix:%s", c->admin_socket);
    else if (c->admin) {
        /* The daemon's default admin socket sits beside its socket (mf_addr.h). */
        char admin[4096];
        mf_admin_socket_path(c->socket ? c->socket : default_socket(path, sizeof(path)), admin,
                             sizeof(admin));
        snprintf(target, sizeof(target), "unix:%s", admin);
    } else
        snprintf(target, sizeof(target), "unix:%s",
                 c->socket ? c->socket : default_socket(path, sizeof(path)));
    mf_channel_params_t p = {
        .field_mask = MF_CHANNEL_PARAM_NS | MF_CHANNEL_PARAM_CLIENT_NAME |
                      MF_CHANNEL_PARAM_TIMEOUT_MS | (c->token ? MF_CHANNEL_PARAM_TOKEN : 0) |
                      (c->admin && c->admin_token ? MF_CHANNEL_PARAM_ADMIN_TOKEN : 0),
        .ns = c->ns,
        .token = c->token,
        .client_name = "mapflowctl",
        .timeout_ms = c->timeout_ms,
        .admin_token = c->admin_token,
    };
    mf_status_t st = mf_channel_open(target, &p, &c->ch);
    if (st == MF_OK)
        return 0;
    fprintf(stderr, "mapflowctl: %s: %s: %s\n", target, mf_status_name(st),
            mf_channel_last_error(c->ch));
    if (st == MF_INVALID_ARGUMENT)
        return EXIT_USAGE;
    return st == MF_UNAVAILABLE || st == MF_DEADLINE_EXCEEDED ? EXIT_CONNECT : EXIT_DAEMON;
}

int main(int argc, char **argv)
{
    static const struct option lo[] = {
        {"socket", 1, 0, 's'}, {"addr", 1, 0, 'a'}, {"ns", 1, 0, 'n'},
        {"token", 1, 0, 't'},  {"json", 0, 0, 'j'}, {"timeout", 1, 0, 'T'},
        {"help", 0, 0, 'h'},   {"version", 0, 0, 'V'}, {"admin-socket", 1, 0, 'S'},
        {"admin-token", 1, 0, 'K'}, {0, 0, 0, 0}};
    const char *env_admin = getenv("MAPFLOW_ADMIN_SOCKET");
    ctl_t c = {.ns = "default", .timeout_ms = 30000, .token = getenv("MAPFLOW_TOKEN"),
               .admin_token = getenv("MAPFLOW_ADMIN_TOKEN"),
               .admin_socket = env_admin && env_admin[0] ? env_admin : NULL};
    int o;
    /* "+": stop at the command word; its options are parsed per command. */
    while ((o = getopt_long(argc, argv, "+h", lo, NULL)) != -1) {
        switch (o) {
        case 's': c.socket = optarg; break;
        case 'a': c.addr = optarg; break;
        case 'n': c.ns = optarg; break;
        case 't': c.token = optarg; break;
        case 'S': c.admin_socket = optarg; break;
        case 'K': c.admin_token = optarg; break;
        case 'j': c.json = 1; break;
        case 'T': c.timeout_ms = (int64_t)parse_u64(optarg, "--timeout", 0); break;
        case 'h': fputs(usage_text, stdout); return 0;
        case 'V': printf("mapflowctl %s\n", mf_version()); return 0;
        default: usage_fail("unknown option");
        }
    }
    if (optind >= argc)
        usage_fail("no command given");
    if (c.socket && c.addr)
        usage_fail("--socket and --addr exclude each other");
    int cargc = argc - optind;
    char **cargv = argv + optind;
    const char *cmd = cargv[0];
    cmd_opts_t co;
    int takes_opts = strcmp(cmd, "config") != 0 && strcmp(cmd, "profile") != 0;
    if (takes_opts)
        parse_cmd_opts(cargc, cargv, &co);
    if (takes_opts && optind < cargc)
        usage_fail("%s: unexpected argument '%s'", cmd, cargv[optind]);
    if (strcmp(cmd, "hash") == 0)
        return cmd_hash(&c, &co);

    static const char *const known[] = {"health", "stats", "ls", "put", "get", "lookup",
                                        "del", "evict", "flush", "config", "profile"};
    size_t k;
    for (k = 0; k < sizeof(known) / sizeof(known[0]) && strcmp(cmd, known[k]); k++)
        ;
    if (k == sizeof(known) / sizeof(known[0]))
        usage_fail("unknown command '%s'", cmd);
    if (takes_opts)
        check_required(cmd, &co);
    /* Admin requests go to the admin socket (or carry the admin token over --addr). */
    c.admin = (takes_opts && co.all_ns) ||
              (!strcmp(cmd, "config") && cargc > 1 && !strcmp(cargv[1], "set")) ||
              (!strcmp(cmd, "profile") && cargc > 1 && !strcmp(cargv[1], "put"));
    int rc = connect_ctl(&c);
    if (rc == 0) {
        if (!strcmp(cmd, "health")) rc = cmd_health(&c);
        else if (!strcmp(cmd, "stats")) rc = cmd_stats(&c, &co);
        else if (!strcmp(cmd, "ls")) rc = cmd_ls(&c, &co);
        else if (!strcmp(cmd, "put")) rc = cmd_put(&c, &co);
        else if (!strcmp(cmd, "get")) rc = cmd_get(&c, &co);
        else if (!strcmp(cmd, "lookup")) rc = cmd_lookup(&c, &co);
        else if (!strcmp(cmd, "del")) rc = cmd_del(&c, &co);
        else if (!strcmp(cmd, "evict")) rc = cmd_evict(&c, &co);
        else if (!strcmp(cmd, "flush")) rc = cmd_flush(&c, &co);
        else if (!strcmp(cmd, "config")) rc = cmd_config(&c, cargc, cargv);
        else rc = cmd_profile(&c, cargc, cargv);
    }
    mf_channel_close(c.ch);
    return rc;
}
