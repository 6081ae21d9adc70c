/*
 * mapflowctl — admin CLI of mapflowd, a thin shell over libmapflow (mapflow.h).
 *
 * Exit codes: 0 ok, 1 error reported by the daemon (or a failed check such as an
 * unhealthy daemon), 2 usage, 3 cannot connect. Machine output (--json) goes to stdout,
 * diagnostics to stderr; with --json every failure is also one {"error": ...} object on
 * stdout (report()). The commands are one table (`commands`): dispatch, `help`,
 * `CMD --help` and the manual read it. Single-threaded tool; exit() only from main's
 * helpers here.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ctl.h"
#include "mf_clock.h"
#include "mapflow.h"
#include "mapflow.pb-c.h"
#include "mf_addr.h"
#include "mf_parse.h"

/* The sections of the manual around COMMANDS, which comes from the command table. */
static const char usage_head[] =
    "NAME\n"
    "    mapflowctl - talk to a mapflowd daemon\n"
    "\n"
    "SYNOPSIS\n"
    "    mapflowctl [--socket PATH | --addr HOST:PORT] [--ns NS] [--token T] [--json]\n"
    "               [--admin-socket PATH] [--admin-token T] [--timeout MS] COMMAND [ARGS]\n"
    "    mapflowctl help [COMMAND] | COMMAND --help\n"
    "\n"
    "COMMANDS\n";
static const char usage_tail[] =
    "\n"
    "OPTIONS\n"
    "    --socket PATH   unix socket (default: $MAPFLOW_SOCKET, else the daemon's own default:\n"
    "                    /run/mapflowd/mapflowd.sock (systemd unit, DaemonSet) if that\n"
    "                    socket exists, else $XDG_RUNTIME_DIR/mapflowd/mapflowd.sock, else\n"
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
    "    --json          machine-readable output (every command); every failure, usage and\n"
    "                    connect failures included, is {\"error\":{\"code\":N,\"status\":S,\n"
    "                    \"message\":M}} on stdout (the exit status as below)\n"
    "    --timeout MS    per-call deadline (default 30000)\n"
    "\n"
    "FILES\n"
    "    Token files are raw little-endian u32 arrays. Rows are the proto/mf_row.h format.\n"
    "    Sizes take the daemon's grammar: 512, 512b, 4k, 64mb, 1.5GiB (powers of 1024).\n"
    "\n"
    "EXIT STATUS\n"
    "    0 ok, 1 error from the daemon, 2 usage, 3 cannot connect.\n";

/* ==== parsing helpers ================================================================ */

/* Command-level options: getopt_long over argv after the command word. */
/*
 * The command table: dispatch, `mapflowctl help`, `CMD --help` and the COMMANDS section
 * of --help all read it. opts: the cmd_opts letters (below) the command takes; prepare:
 * usage checks before connecting (so they exit 2, not 3), returning 1 when the command
 * needs the admin path; fn runs it (argv: the words from the command on).
 */
typedef struct cmd {
    const char *name;
    int (*fn)(ctl_t *c, int argc, char **argv, const cmd_opts_t *o);
    int (*prepare)(int argc, char **argv, cmd_opts_t *o);
    const char *opts;
    int local;               /* needs no daemon */
    const char *usage;       /* synopsis lines, then indented description lines */
} cmd_t;

static const struct option cmd_lo[] = {
    {"model", 1, 0, 'm'},  {"layer", 1, 0, 'l'},     {"hash", 1, 0, 'H'},
    {"out", 1, 0, 'o'},    {"tokens", 1, 0, 't'},    {"layers", 1, 0, 'L'},
    {"block", 1, 0, 'b'},  {"tier", 1, 0, 'T'},      {"bytes", 1, 0, 'B'},
    {"row", 1, 0, 'r'},    {"durable", 0, 0, 'd'},   {"file", 1, 0, 'f'},
    {"source", 1, 0, 's'}, {"target", 1, 0, 'g'},    {"page-size", 1, 0, 'p'},
    {"ns", 1, 0, 'n'},     {"pages", 1, 0, 'P'},     {"page-token", 1, 0, 'k'},
    {"interval", 1, 0, 'i'}, {"count", 1, 0, 'c'},   {"peer", 1, 0, 'e'},
    {"all-namespaces", 0, 0, 'A'}, {"help", 0, 0, 'h'}, {0, 0, 0, 0}};

static void print_cmd_usage(FILE *f, const cmd_t *cmd);

/* Options of cmd from argv (argv[0]: the word before them); --help prints cmd's usage
 * and exits 0; an option of another command is a usage error naming it. */
static void parse_cmd_opts(int argc, char **argv, cmd_opts_t *o, const cmd_t *cmd)
{
    memset(o, 0, sizeof(*o));
    o->layer = -1;
    optind = 1;
    opterr = 0;
    int c, li = -1;
    while ((c = getopt_long(argc, argv, "", cmd_lo, &li)) != -1) {
        if (c == 'h') {
            print_cmd_usage(stdout, cmd);
            exit(0);
        }
        if (c == '?' || c == ':')
            usage_fail("%s: bad option '%s'", cmd->name, argv[optind - 1]);
        if (!strchr(cmd->opts, c))
            usage_fail("--%s is not an option of %s", cmd_lo[li].name, cmd->name);
        switch (c) {
        case 'm': o->model = optarg; break;
        case 'l': o->layer = parse_u32(optarg, "--layer"); break;
        case 'H': o->hash = optarg; break;
        case 'o': o->out = optarg; break;
        case 't': o->tokens = optarg; break;
        case 'L': o->layers = optarg; break;
        case 'b': o->block = parse_u32(optarg, "--block"); break;
        case 'T': o->tier = optarg; break;
        case 'B': o->bytes = parse_size(optarg, "--bytes"); break;
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
        }
    }
    if (optind < argc)
        usage_fail("%s: unexpected argument '%s'", cmd->name, argv[optind]);
}

/* ==== commands ======================================================================= */

static int cmd_health(ctl_t *c, int argc, char **argv, const cmd_opts_t *o)
{
    (void)argc, (void)argv, (void)o;
    mf_health_t h;
    mf_status_t st = mf_health(c->ch, &h, c->timeout_ms);
    if (st != MF_OK)
        return ctl_fail(c, "health", st);
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

static int cmd_stats(ctl_t *c, int argc, char **argv, const cmd_opts_t *o)
{
    (void)argc, (void)argv;
    mf_stats_t *prev = NULL;
    double t_prev = 0;
    int rc = 0, tty = isatty(1);
    for (uint32_t n = 0;; n++) {
        mf_stats_t *s;
        mf_status_t st = mf_stats(c->ch, &s, c->timeout_ms);
        if (st != MF_OK) {
            rc = ctl_fail(c, "stats", st);
            break;
        }
        double t = mf_now_s();
        if (o->interval <= 0)
            print_stats(s, c->json);
        else if (c->json)
            print_stats_json(s, prev, t - t_prev);
        else {
            if (tty)
                printf("\033[H\033[J"); /* redraw in place: home, clear below */
            else if (n)
                printf("\n");
            print_stats_watch(s, prev, t - t_prev);
        }
        fflush(stdout);
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

static int prep_stats(int argc, char **argv, cmd_opts_t *o)
{
    (void)argc, (void)argv;
    if (o->count && o->interval <= 0)
        usage_fail("--count needs --interval");
    return 1; /* the daemon's tiers and counters: a tenant's Stats has its namespace's only */
}

static mf_status_t fetch_entries(ctl_t *c, const cmd_opts_t *o, const uint8_t *tok,
                                 size_t tok_len, void **page, uint8_t **next, size_t *next_len)
{
    mf_list_page_t *p;
    mf_status_t st = mf_list(c->ch, o->model, o->layer, o->page_size, tok, tok_len, &p,
                             c->timeout_ms);
    if (st != MF_OK)
        return st;
    *page = p;
    *next = p->next_page_token;
    *next_len = p->next_page_token_len;
    p->next_page_token = NULL;
    return MF_OK;
}

static size_t print_entries(const void *page, int json, size_t shown)
{
    const mf_list_page_t *p = page;
    for (size_t i = 0; i < p->n_entries; i++)
        print_entry(&p->entries[i], json, shown + i == 0);
    return p->n_entries;
}

static void free_entries(void *page) { mf_list_page_free(page); }

static int cmd_ls(ctl_t *c, int argc, char **argv, const cmd_opts_t *o)
{
    (void)argc, (void)argv;
    static const pager_t pg = {"ls", "entries", fetch_entries, print_entries, free_entries};
    return run_pages(c, o, &pg);
}

int prep_ls(int argc, char **argv, cmd_opts_t *o)
{
    (void)argc, (void)argv;
    if (o->page_token) {
        uint8_t *t;
        parse_hex_bytes(o->page_token, "--page-token", &t);
        free(t);
    }
    return 0;
}

static int cmd_put(ctl_t *c, int argc, char **argv, const cmd_opts_t *o)
{
    (void)argc, (void)argv;
    mf_put_item_t items[64];
    for (int i = 0; i < o->n_rows; i++) {
        items[i] = (mf_put_item_t){0};
        items[i].row = read_file(o->rows[i], &items[i].len);
        if (!items[i].row) {
            for (int k = 0; k < i; k++)
                free((void *)items[k].row);
            return file_fail(o->rows[i], EXIT_USAGE);
        }
    }
    /* One batch: every PutBegin goes out at once (a round trip for all, not per row). */
    mf_status_t st = mf_put_batch(c->ch, items, (size_t)o->n_rows,
                                  o->durable ? MF_PUT_DURABLE : 0, c->timeout_ms);
    int rc = 0;
    for (int i = 0; i < o->n_rows; i++) {
        const mf_put_result_t *r = &items[i].result;
        if (items[i].status != MF_OK) {
            /* One line per row that failed; the batch's message is its first failure's. */
            int first = rc == 0;
            report(items[i].status, o->rows[i], "%s",
                   first ? mf_channel_last_error(c->ch) : mf_strerror(items[i].status));
            if (first)
                rc = st == MF_UNAVAILABLE ? EXIT_CONNECT : EXIT_DAEMON;
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
            printf(",\"model\":");
            json_strn(v.model, v.model_len);
            printf(",\"layer\":%u,\"block\":%u,\"hash\":\"%s\",\"size\":%zu,"
                   "\"tier\":\"%s\",\"durable\":%s,\"replaced\":%s}\n", v.layer,
                   v.block_index, hex, items[i].len, mf_tier_name(r->tier),
                   r->durable ? "true" : "false", r->replaced ? "true" : "false");
        } else {
            printf("put ");
            text_strn(v.model, v.model_len);
            printf(" layer %u block %u %s (%zu bytes) -> %s%s%s\n", v.layer, v.block_index, hex,
                   items[i].len, mf_tier_name(r->tier), r->durable ? ", durable" : "",
                   r->replaced ? ", replaced" : "");
        }
        free((void *)items[i].row);
    }
    return rc;
}

static int prep_put(int argc, char **argv, cmd_opts_t *o)
{
    (void)argc, (void)argv;
    if (o->n_rows == 0)
        usage_fail("put needs --row FILE");
    return 0;
}

static int cmd_get(ctl_t *c, int argc, char **argv, const cmd_opts_t *o)
{
    (void)argc, (void)argv;
    mf_key_t k = {o->model, (uint32_t)o->layer, parse_hash(o->hash)};
    mf_get_result_t *r;
    mf_status_t st = mf_get_keys_peer(c->ch, o->peer, &k, 1, MF_GET_COPY, &r, c->timeout_ms);
    if (st != MF_OK)
        return ctl_fail(c, "get", st);
    st = r->rows[0].status;
    int rc = st == MF_OK ? write_file(o->out, r->rows[0].data, r->rows[0].length)
                         : ctl_fail(c, "get", st);
    if (rc == 0 && c->json) {
        printf("{\"out\":");
        json_str(o->out);
        printf(",\"size\":%zu,\"tier\":\"%s\"}\n", r->rows[0].length,
               mf_tier_name(r->rows[0].tier));
    } else if (rc == 0) {
        printf("%zu bytes from %s -> %s\n", r->rows[0].length, mf_tier_name(r->rows[0].tier),
               o->out);
    }
    mf_get_result_free(r);
    return rc;
}

static void check_peer(const cmd_opts_t *o)
{
    if (o->peer && !strchr(o->peer, ':'))
        usage_fail("--peer: '%s' is not HOST:PORT", o->peer);
}

/* The daemon's block-size rule (mf_row.h), applied before anything is hashed or sent. */
static void check_block(const cmd_opts_t *o, const char *cmd)
{
    if (!o->block)
        usage_fail("%s needs --block B", cmd);
    if (!mf_row_block_size_ok(o->block))
        usage_fail("--block: %u is not a power of two in [%d, %d] (the daemon's rule)",
                   o->block, MF_ROW_MIN_BLOCK, MF_ROW_MAX_BLOCK);
}

static int prep_get(int argc, char **argv, cmd_opts_t *o)
{
    (void)argc, (void)argv;
    need(o->model, "--model", "get");
    need(o->hash, "--hash", "get");
    need(o->out, "--out", "get");
    if (o->layer < 0)
        usage_fail("get needs --layer");
    parse_hash(o->hash);
    check_peer(o);
    return 0;
}

static int prep_lookup(int argc, char **argv, cmd_opts_t *o)
{
    (void)argc, (void)argv;
    need(o->model, "--model", "lookup");
    need(o->layers, "--layers", "lookup");
    need(o->tokens, "--tokens", "lookup");
    check_block(o, "lookup");
    check_peer(o);
    uint32_t *layers;
    parse_layers(o->layers, &layers);
    free(layers);
    return 0;
}

static int cmd_lookup(ctl_t *c, int argc, char **argv, const cmd_opts_t *o)
{
    (void)argc, (void)argv;
    size_t nt;
    uint32_t *tokens = read_tokens(o->tokens, &nt), *layers, total = 0;
    size_t nl = parse_layers(o->layers, &layers);
    uint32_t *blocks = calloc(nl, sizeof(*blocks));
    int rc = 0;
    mf_status_t st = blocks ? mf_lookup_peer(c->ch, o->peer, o->model, o->block, tokens, nt,
                                             layers, nl, blocks, &total, c->timeout_ms)
                            : MF_RESOURCE_EXHAUSTED;
    if (st != MF_OK) {
        rc = ctl_fail(c, "lookup", st);
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

static int prep_del(int argc, char **argv, cmd_opts_t *o)
{
    (void)argc, (void)argv;
    need(o->model, "--model", "del");
    if (o->hash && o->layer < 0)
        usage_fail("del --hash needs --layer");
    if (o->hash)
        parse_hash(o->hash);
    return 0;
}

static int cmd_del(ctl_t *c, int argc, char **argv, const cmd_opts_t *o)
{
    (void)argc, (void)argv;
    uint64_t n = 0;
    mf_status_t st;
    if (o->hash) {
        mf_key_t k = {o->model, (uint32_t)o->layer, parse_hash(o->hash)};
        st = mf_delete(c->ch, &k, &n, c->timeout_ms);
    } else {
        st = mf_delete_model(c->ch, o->model, o->layer, &n, c->timeout_ms);
    }
    if (st != MF_OK)
        return ctl_fail(c, "del", st);
    printf(c->json ? "{\"deleted\":%" PRIu64 "}\n" : "deleted %" PRIu64 "\n", n);
    return 0;
}

static mf_tier_t evict_tier(const cmd_opts_t *o)
{
    mf_tier_t t;
    need(o->tier, "--tier gpu|host|ssd", "evict");
    if (mf_tier_parse(o->tier, &t) != MF_OK || t == MF_TIER_NONE)
        usage_fail("--tier: '%s' is not gpu, host or ssd", o->tier);
    return t;
}

/* --all-namespaces is an admin request. */
static int prep_evict(int argc, char **argv, cmd_opts_t *o)
{
    (void)argc, (void)argv;
    evict_tier(o);
    return o->all_ns;
}

static int prep_flush(int argc, char **argv, cmd_opts_t *o)
{
    (void)argc, (void)argv;
    return o->all_ns;
}

static int cmd_evict(ctl_t *c, int argc, char **argv, const cmd_opts_t *o)
{
    (void)argc, (void)argv;
    mf_tier_t t = evict_tier(o);
    uint64_t b = 0, e = 0;
    mf_status_t st = o->all_ns ? mf_evict_all(c->ch, t, o->bytes, &b, &e, c->timeout_ms)
                               : mf_evict(c->ch, t, o->bytes, &b, &e, c->timeout_ms);
    if (st != MF_OK)
        return ctl_fail(c, "evict", st);
    printf(c->json ? "{\"bytes\":%" PRIu64 ",\"entries\":%" PRIu64 "}\n"
                   : "evicted %" PRIu64 " bytes, %" PRIu64 " entries\n", b, e);
    return 0;
}

static int cmd_flush(ctl_t *c, int argc, char **argv, const cmd_opts_t *o)
{
    (void)argc, (void)argv;
    uint64_t n = 0;
    mf_status_t st = o->all_ns ? mf_flush_all(c->ch, &n, c->timeout_ms)
                               : mf_flush(c->ch, &n, c->timeout_ms);
    if (st != MF_OK)
        return ctl_fail(c, "flush", st);
    printf(c->json ? "{\"entries\":%" PRIu64 "}\n" : "flushed %" PRIu64 " entries\n", n);
    return 0;
}

static int prep_config_get(int argc, char **argv, cmd_opts_t *o)
{
    (void)argv, (void)o;
    if (argc > 2)
        usage_fail("config get takes at most one KEY");
    return 0;
}

/* An admin request. */
static int prep_config_set(int argc, char **argv, cmd_opts_t *o)
{
    (void)argv, (void)o;
    if (argc != 3)
        usage_fail("config set takes KEY VALUE");
    return 1;
}

static int cmd_config_get(ctl_t *c, int argc, char **argv, const cmd_opts_t *o)
{
    (void)o;
    mf_config_item_t *it = NULL;
    size_t n = 0;
    mf_status_t st = mf_config_get(c->ch, argc == 2 ? argv[1] : "", &it, &n, c->timeout_ms);
    if (st != MF_OK)
        return ctl_fail(c, "config get", st);
    print_items(it, n, c->json);
    mf_config_items_free(it, n);
    return 0;
}

static int cmd_config_set(ctl_t *c, int argc, char **argv, const cmd_opts_t *o)
{
    (void)argc, (void)o;
    mf_config_item_t *it = NULL;
    mf_status_t st = mf_config_set(c->ch, argv[1], argv[2], &it, c->timeout_ms);
    if (st != MF_OK)
        return ctl_fail(c, "config set", st);
    print_items(it, it ? 1 : 0, c->json);
    mf_config_items_free(it, it ? 1 : 0);
    return 0;
}

static int prep_hash(int argc, char **argv, cmd_opts_t *o)
{
    (void)argc, (void)argv;
    need(o->model, "--model", "hash");
    need(o->tokens, "--tokens", "hash");
    check_block(o, "hash");
    return 0;
}

static int cmd_hash(ctl_t *c, int argc, char **argv, const cmd_opts_t *o)
{
    (void)argc, (void)argv;
    size_t nt;
    uint32_t *tokens = read_tokens(o->tokens, &nt);
    size_t nb = nt / o->block, n = 0;
    mf_hash128_t *h = malloc((nb ? nb : 1) * sizeof(*h));
    const char *ns = o->ns ? o->ns : c->ns;
    mf_status_t st = h ? mf_hash_prefix(ns, o->model, o->block, tokens, nt, h, nb, &n)
                       : MF_RESOURCE_EXHAUSTED;
    if (st != MF_OK) {
        report(st, "hash", "%s", mf_strerror(st));
        free(h);
        free(tokens);
        return EXIT_USAGE;
    }
    if (c->json) {
        printf("{\"ns\":");
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

static int cmd_help(ctl_t *c, int argc, char **argv, const cmd_opts_t *o);
static int prep_help(int argc, char **argv, cmd_opts_t *o);

static const cmd_t commands[] = {
    {"health", cmd_health, NULL, "", 0,
     "health\n"
     "    daemon and tier health (exit 1 if not ok)\n"},
    {"stats", cmd_stats, prep_stats, "ic", 0,
     "stats [--interval S [--count N]]\n"
     "    the daemon's tiers and counters (admin); with --interval, again every S\n"
     "    seconds, redrawn in place:\n"
     "    the counters that are not zero with per-second rates, the gauges (no rates)\n"
     "    a few per line; N samples (default: until interrupted)\n"},
    {"ls", cmd_ls, prep_ls, "mlpPk", 0,
     "ls [--model M] [--layer L] [--page-size N] [--pages P] [--page-token T]\n"
     "    list entries of the namespace: every page, or P pages from token T (hex); the\n"
     "    token of the page after them is printed (stderr; --json: {\"entries\": [...],\n"
     "    \"next_page_token\": T or null}); control characters in names as \\xNN\n"},
    {"put", cmd_put, prep_put, "rd", 0,
     "put --row FILE [--row FILE...] [--durable]\n"
     "    store encoded rows (all in one batch); the key is read from the row\n"},
    {"get", cmd_get, prep_get, "mlHoe", 0,
     "get --model M --layer L --hash HEX --out FILE [--peer H:P]\n"
     "    fetch one row by key into FILE; with --peer, a row missing here is read through\n"
     "    from the daemon whose UCX listener is H:P (and cached here)\n"},
    {"lookup", cmd_lookup, prep_lookup, "mbtLe", 0,
     "lookup --model M --block B --tokens FILE --layers LIST [--peer H:P]\n"
     "    cached leading blocks per layer (LIST: 0,1,4-7); with --peer, the larger of this\n"
     "    daemon's and the peer's count\n"},
    {"del", cmd_del, prep_del, "mlH", 0,
     "del --model M [--layer L] [--hash HEX]\n"
     "    delete one key (with --hash), a layer or a model\n"},
    {"evict", cmd_evict, prep_evict, "TBA", 0,
     "evict --tier gpu|host|ssd [--bytes N] [--all-namespaces]\n"
     "    demote (gpu -> host -> ssd) / drop (ssd) unpinned entries (N: a size, 0 = to\n"
     "    the low watermark); a tier that is off fails; --all-namespaces: of every\n"
     "    namespace (admin)\n"},
    {"flush", cmd_flush, prep_flush, "A", 0,
     "flush [--all-namespaces]\n"
     "    drop every unpinned entry of the namespace (of every namespace: admin)\n"},
    {"config get", cmd_config_get, prep_config_get, NULL, 0,
     "config get [KEY]\n"
     "    show one key or all\n"},
    {"config set", cmd_config_set, prep_config_set, NULL, 0,
     "config set KEY VALUE\n"
     "    change a live key (admin)\n"},
    {"profile put", cmd_profile_put, prep_profile_put, "f", 0,
     "profile put --file F\n"
     "    store a mapping profile (encoded MappingProfile; admin) and say which\n"},
    {"profile get", cmd_profile_get, prep_profile_get, "sgo", 0,
     "profile get --source S --target T [--out F]\n"
     "    fetch one (raw protobuf to F or a pipe; --json: its fields as JSON)\n"},
    {"profile ls", cmd_profile_ls, prep_ls, "pPk", 0,
     "profile ls [--page-size N] [--pages P] [--page-token T]\n"
     "    list the namespace's profiles (source, target, block, mapped / target layers,\n"
     "    bytes, created_by): every page, or P pages from token T (hex), as ls\n"},
    {"hash", cmd_hash, prep_hash, "mbtn", 1,
     "hash --model M --block B --tokens FILE [--ns NS]\n"
     "    print one prefix hash per full block (no daemon; B as the daemon allows it)\n"},
    {"help", cmd_help, prep_help, NULL, 1,
     "help [COMMAND]\n"
     "    this manual, or the usage of one command (as COMMAND --help)\n"},
};
#define N_COMMANDS (sizeof(commands) / sizeof(commands[0]))

static void print_cmd_usage(FILE *f, const cmd_t *cmd)
{
    fprintf(f, "usage: mapflowctl [OPTIONS] %s", cmd->usage);
}

static void print_manual(FILE *f)
{
    fputs(usage_head, f);
    for (size_t i = 0; i < N_COMMANDS; i++)
        for (const char *l = commands[i].usage; *l;) {
            size_t n = strcspn(l, "\n");
            fprintf(f, "    %.*s\n", (int)n, l);
            l += n + (l[n] == '\n');
        }
    fputs(usage_tail, f);
}

/* The command that argv's first words name (NULL: none); *words: how many it took. */
static const cmd_t *find_cmd(int argc, char **argv, int *words)
{
    for (size_t i = 0; i < N_COMMANDS; i++) {
        const char *name = commands[i].name, *sp = strchr(name, ' ');
        size_t n1 = sp ? (size_t)(sp - name) : strlen(name);
        if (strlen(argv[0]) != n1 || strncmp(argv[0], name, n1))
            continue;
        if (!sp) {
            *words = 1;
            return &commands[i];
        }
        if (argc > 1 && !strcmp(argv[1], sp + 1)) {
            *words = 2;
            return &commands[i];
        }
    }
    return NULL;
}

/* The sub-commands of a group word ("profile": "put, get"), for its usage error. */
static int group_words(const char *word, char *out, size_t cap)
{
    size_t len = 0, n = 0;
    out[0] = '\0';
    for (size_t i = 0; i < N_COMMANDS; i++) {
        const char *name = commands[i].name, *sp = strchr(name, ' ');
        if (sp && (size_t)(sp - name) == strlen(word) && !strncmp(name, word, strlen(word))) {
            int w = snprintf(out + len, cap - len, "%s%s", n++ ? ", " : "", sp + 1);
            if (w > 0 && (size_t)w < cap - len)
                len += (size_t)w;
        }
    }
    return n > 0;
}

static int prep_help(int argc, char **argv, cmd_opts_t *o)
{
    (void)o;
    int words;
    if (argc > 1 && !find_cmd(argc - 1, argv + 1, &words)) {
        char subs[256];
        if (!group_words(argv[1], subs, sizeof(subs)))
            usage_fail("help: unknown command '%s'", argv[1]);
    }
    return 0;
}

static int cmd_help(ctl_t *c, int argc, char **argv, const cmd_opts_t *o)
{
    (void)c, (void)o;
    int words;
    const cmd_t *cmd = argc > 1 ? find_cmd(argc - 1, argv + 1, &words) : NULL;
    if (cmd) {
        print_cmd_usage(stdout, cmd);
    } else if (argc > 1) { /* a group word: every command of the group */
        for (size_t i = 0; i < N_COMMANDS; i++)
            if (!strncmp(commands[i].name, argv[1], strlen(argv[1])) &&
                commands[i].name[strlen(argv[1])] == ' ')
                print_cmd_usage(stdout, &commands[i]);
    } else {
        print_manual(stdout);
    }
    return 0;
}

/* ==== main =========================================================================== */

static const char *default_socket(char *buf, size_t cap)
{
    const char *env = getenv("MAPFLOW_SOCKET");
    if (env && env[0])
        return env;
    mf_default_socket_path(buf, cap, 0); /* the daemon's rule (mf_addr.h) */
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
    report(st, target, "%s", mf_channel_last_error(c->ch));
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
    /* --json anywhere before the command: usage errors met on the way are JSON too. */
    for (int i = 1; i < argc && argv[i][0] == '-'; i++) {
        g_json |= !strcmp(argv[i], "--json");
        for (const struct option *l = lo; l->name; l++)
            if (l->has_arg && !strcmp(argv[i] + 2, l->name))
                i++; /* skip the option's value */
    }
    int o;
    opterr = 0;
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
        case 'T': c.timeout_ms = (int64_t)parse_u64(optarg, "--timeout"); break;
        case 'h': print_manual(stdout); return 0;
        case 'V': printf("mapflowctl %s\n", mf_version()); return 0;
        default: usage_fail("unknown option '%s'", argv[optind - 1]);
        }
    }
    g_json = c.json;
    if (optind >= argc)
        usage_fail("no command given (mapflowctl help lists them)");
    if (c.socket && c.addr)
        usage_fail("--socket and --addr exclude each other");
    int cargc = argc - optind, words = 0;
    char **cargv = argv + optind;
    const cmd_t *cmd = find_cmd(cargc, cargv, &words);
    if (!cmd) {
        char subs[256];
        if (!group_words(cargv[0], subs, sizeof(subs)))
            usage_fail("unknown command '%s' (mapflowctl help lists them)", cargv[0]);
        if (cargc > 1 && !strcmp(cargv[1], "--help")) {
            char *hv[] = {"help", cargv[0]};
            return cmd_help(&c, 2, hv, NULL);
        }
        g_cmd = cargv[0];
        usage_fail("%s: expected one of: %s", cargv[0], subs);
    }
    g_cmd = cmd->name;
    /* From here argv[0] is the command's last word, as getopt expects. */
    cargc -= words - 1;
    cargv += words - 1;
    cmd_opts_t co;
    memset(&co, 0, sizeof(co));
    co.layer = -1;
    if (cmd->opts) {
        parse_cmd_opts(cargc, cargv, &co, cmd);
    } else {
        for (int i = 1; i < cargc; i++)
            if (!strcmp(cargv[i], "--help")) {
                print_cmd_usage(stdout, cmd);
                return 0;
            }
    }
    /* Admin requests go to the admin socket (or carry the admin token over --addr). */
    c.admin = cmd->prepare ? cmd->prepare(cargc, cargv, &co) : 0;
    int rc = cmd->local ? 0 : connect_ctl(&c);
    if (rc == 0)
        rc = cmd->fn(&c, cargc, cargv, &co);
    mf_channel_close(c.ch);
    return rc;
}
