/*
 * ctl — what mapflowctl's files share. client/ctl_io.c: failure reporting (one stderr
 * line, and with --json one {"error": ...} object on stdout), JSON and terminal escaping,
 * argument and file parsing (usage errors exit 2 from here). client/ctl_print.c:
 * renderers of daemon replies, text and JSON; the pager of paged listings (ls, profile
 * ls) is in ctl_io.c. client/ctl_profile.c: the profile commands. client/mapflowctl.c:
 * the command table, the other commands and main.
 *
 * Ownership: callers own every buffer; read_file / read_tokens / parse_* allocations are
 * the caller's to free. Thread safety: single-threaded tool (g_json, g_cmd are globals).
 */
#ifndef MF_CLIENT_CTL_H
#define MF_CLIENT_CTL_H

#include <stdint.h>
#include <stdio.h>

#include "mapflow.h"

#define EXIT_DAEMON 1
#define EXIT_USAGE 2
#define EXIT_CONNECT 3

extern int g_json;          /* --json (usage errors are met before the options are done) */
extern const char *g_cmd;   /* the command, once known: usage errors point at its help */

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


/* ---- ctl_io.c ---- */
void json_error(mf_status_t st, const char *msg);
/* "mapflowctl: WHAT: STATUS: message" on stderr; with --json the error object on stdout
 * (its message "WHAT: message"). */
void report(mf_status_t st, const char *what, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* A usage error: reported as INVALID_ARGUMENT, exit 2. */
void usage_fail(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));
/* A local file that cannot be read or written (errno), reported as a status; returns rc. */
int file_fail(const char *path, int rc);
uint64_t parse_u64(const char *s, const char *what);
uint64_t parse_size(const char *s, const char *what);
uint32_t parse_u32(const char *s, const char *what);
double parse_seconds(const char *s, const char *what);
size_t parse_hex_bytes(const char *s, const char *what, uint8_t **out);
size_t parse_layers(const char *s, uint32_t **out);
mf_hash128_t parse_hash(const char *s);
void need(const void *v, const char *opt, const char *cmd);
void *read_file(const char *path, size_t *len);
uint32_t *read_tokens(const char *path, size_t *n);
int write_file(const char *path, const void *data, size_t len);
void print_hex(FILE *f, const uint8_t *b, size_t n);
void json_strn(const char *s, size_t n);
void json_str(const char *s);
void text_strn(const char *s, size_t n);
/* Reports a failed call (the channel's last error) and returns the exit code it maps to. */
int ctl_fail(ctl_t *c, const char *what, mf_status_t st);
/* A paged listing (ls, profile ls): fetch one page from a token, taking the next token
 * out of it; print its items (shown: items printed before it); free it. */
typedef struct pager {
    const char *what, *items; /* the command, and the JSON array's name */
    mf_status_t (*fetch)(ctl_t *c, const cmd_opts_t *o, const uint8_t *tok, size_t tok_len,
                         void **page, uint8_t **next, size_t *next_len);
    size_t (*print)(const void *page, int json, size_t shown);
    void (*free_page)(void *page);
} pager_t;
int run_pages(ctl_t *c, const cmd_opts_t *o, const pager_t *pg);

/* ---- ctl_print.c ---- */
void print_tiers(const mf_tier_stats_t *t, size_t n, int json);
int is_counter(const char *name);
void print_stats(const mf_stats_t *s, int json);
void print_stats_json(const mf_stats_t *s, const mf_stats_t *prev, double dt);
void print_stats_watch(const mf_stats_t *s, const mf_stats_t *prev, double dt);
void print_entry(const mf_entry_info_t *e, int json, int first);
void print_profile_info(const mf_profile_info_t *p, int json, int first);
void print_items(const mf_config_item_t *it, size_t n, int json);
/* A MappingProfile as JSON; EXIT_DAEMON (reported) when it does not decode. */
int print_profile_json(const void *pb, size_t len, const char *out);

/* ---- ctl_profile.c ---- */
int prep_profile_put(int argc, char **argv, cmd_opts_t *o);
int cmd_profile_put(ctl_t *c, int argc, char **argv, const cmd_opts_t *o);
int prep_profile_get(int argc, char **argv, cmd_opts_t *o);
int cmd_profile_get(ctl_t *c, int argc, char **argv, const cmd_opts_t *o);
int cmd_profile_ls(ctl_t *c, int argc, char **argv, const cmd_opts_t *o);

/* ---- mapflowctl.c ---- */
/* --page-token checked before connecting (ls, profile ls). */
int prep_ls(int argc, char **argv, cmd_opts_t *o);

#endif /* MF_CLIENT_CTL_H */
