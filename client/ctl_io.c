/* ctl_io — mapflowctl's reporting, escaping and parsing helpers (ctl.h). */
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "ctl.h"
#include "mf_parse.h"

int g_json;
const char *g_cmd;

void json_error(mf_status_t st, const char *msg)
{
    printf("{\"error\":{\"code\":%d,\"status\":\"%s\",\"message\":", (int)st,
           mf_status_name(st));
    json_strn(msg, strlen(msg));
    printf("}}\n");
    fflush(stdout);
}

/* Every failure is reported here: "mapflowctl: WHAT: STATUS: message" on stderr and, with
 * --json, the error object on stdout (its message is "WHAT: message"). */
void report(mf_status_t st, const char *what,
                                                          const char *fmt, ...)
{
    char msg[1024], full[1200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    fprintf(stderr, "mapflowctl: %s: %s%s%s\n", what, mf_status_name(st), msg[0] ? ": " : "",
            msg);
    snprintf(full, sizeof(full), "%s%s%s", what, msg[0] ? ": " : "", msg);
    if (g_json)
        json_error(st, full);
}

void usage_fail(const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    fprintf(stderr, "mapflowctl: %s\n(see mapflowctl %s%s--help)\n", msg, g_cmd ? g_cmd : "",
            g_cmd ? " " : "");
    if (g_json)
        json_error(MF_INVALID_ARGUMENT, msg);
    exit(EXIT_USAGE);
}

/* A local file that cannot be read or written, as a status. */
int file_fail(const char *path, int rc)
{
    int e = errno;
    report(e == ENOENT ? MF_NOT_FOUND : e == EACCES ? MF_PERMISSION_DENIED : MF_INTERNAL, path,
           "%s", strerror(e));
    return rc;
}

uint64_t parse_u64(const char *s, const char *what)
{
    char *end;
    errno = 0;
    if (!s || !*s || *s == '-')
        usage_fail("%s: expected a number", what);
    unsigned long long v = strtoull(s, &end, 0);
    if (errno || *end)
        usage_fail("%s: '%s' is not a valid number", what, s);
    return (uint64_t)v;
}

/* A size in the daemon's grammar (mf_parse.h), so `--bytes 512b` means what
 * `config set host_bytes 512b` does. */
uint64_t parse_size(const char *s, const char *what)
{
    uint64_t v;
    if (mf_parse_size(s, &v) != MF_OK)
        usage_fail("%s: '%s' is not a size (e.g. 512b, 64mb, 1.5GiB)", what, s);
    return v;
}

uint32_t parse_u32(const char *s, const char *what)
{
    uint64_t v = parse_u64(s, what);
    if (v > UINT32_MAX)
        usage_fail("%s: %s is out of range", what, s);
    return (uint32_t)v;
}

/* Seconds, fractions allowed: 0.001 .. 86400. */
double parse_seconds(const char *s, const char *what)
{
    char *end;
    errno = 0;
    double v = s ? strtod(s, &end) : 0;
    if (!s || !*s || errno || *end || !(v >= 0.001 && v <= 86400))
        usage_fail("%s: '%s' is not a number of seconds in [0.001, 86400]", what, s ? s : "");
    return v;
}

/* Hex text → bytes (page tokens); the caller frees *out. */
size_t parse_hex_bytes(const char *s, const char *what, uint8_t **out)
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

void print_hex(FILE *f, const uint8_t *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        fprintf(f, "%02x", b[i]);
}

/* "0,1,4-7" → layers; the caller frees *out. */
size_t parse_layers(const char *s, uint32_t **out)
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
void *read_file(const char *path, size_t *len)
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

uint32_t *read_tokens(const char *path, size_t *n)
{
    if (!path)
        usage_fail("--tokens FILE is required");
    size_t len;
    uint32_t *t = read_file(path, &len);
    if (!t)
        exit(file_fail(path, EXIT_USAGE));
    if (len % 4)
        usage_fail("%s: %zu bytes is not a whole number of u32 tokens", path, len);
    *n = len / 4;
    return t;
}

int write_file(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    int bad = !f || fwrite(data, 1, len, f) != len;
    if (f && fclose(f) != 0)
        bad = 1;
    return bad ? file_fail(path, EXIT_DAEMON) : 0;
}

/* Prints a JSON string literal of n bytes (control characters as \u00XX). */
void json_strn(const char *s, size_t n)
{
    putchar('"');
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch == '"' || ch == '\\')
            printf("\\%c", ch);
        else if (ch < 0x20)
            printf("\\u%04x", ch);
        else
            putchar(ch);
    }
    putchar('"');
}

void json_str(const char *s)
{
    json_strn(s, strlen(s));
}

/* A name from the daemon (or a row) for a terminal: control characters, DEL and the
 * backslash as \xNN, so a model name cannot move the cursor or forge a line. */
void text_strn(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch < 0x20 || ch == 0x7f || ch == '\\')
            printf("\\x%02x", ch);
        else
            putchar(ch);
    }
}

void need(const void *v, const char *opt, const char *cmd)
{
    if (!v)
        usage_fail("%s needs %s", cmd, opt);
}

mf_hash128_t parse_hash(const char *s)
{
    mf_hash128_t h;
    if (mf_hash_from_hex(s, &h) != MF_OK)
        usage_fail("--hash: '%s' is not 32 hex digits", s);
    return h;
}

/* Reports a failed call and returns the exit code it maps to. */
int ctl_fail(ctl_t *c, const char *what, mf_status_t st)
{
    report(st, what, "%s", c->ch ? mf_channel_last_error(c->ch) : "");
    return st == MF_UNAVAILABLE ? EXIT_CONNECT : EXIT_DAEMON;
}

/* Every page (or --pages P from --page-token), fetched before anything is printed, so a
 * failure on a later page leaves stdout with one error object, not half a list. JSON:
 * always {ITEMS: [...], "next_page_token": hex | null}. */
int run_pages(ctl_t *c, const cmd_opts_t *o, const pager_t *pg)
{
    uint8_t *token = NULL;
    size_t token_len = 0, n_pages = 0, cap = 0;
    void **pages = NULL;
    int rc = 0;
    if (o->page_token)
        token_len = parse_hex_bytes(o->page_token, "--page-token", &token);
    for (uint32_t page = 0; !o->pages || page < o->pages; page++) {
        if (n_pages == cap) {
            cap = cap ? 2 * cap : 8;
            void **np = realloc(pages, cap * sizeof(*np));
            if (!np) {
                report(MF_RESOURCE_EXHAUSTED, pg->what, "out of memory");
                rc = EXIT_DAEMON;
                break;
            }
            pages = np;
        }
        void *p;
        uint8_t *next = NULL;
        size_t next_len = 0;
        mf_status_t st = pg->fetch(c, o, token, token_len, &p, &next, &next_len);
        free(token);
        token = NULL;
        token_len = 0;
        if (st != MF_OK) {
            rc = ctl_fail(c, pg->what, st);
            break;
        }
        pages[n_pages++] = p;
        if (!next_len)
            break;
        token = next;
        token_len = next_len;
    }
    if (rc == 0) {
        size_t shown = 0;
        if (c->json)
            printf("{\"%s\":[", pg->items);
        for (size_t k = 0; k < n_pages; k++)
            shown += pg->print(pages[k], c->json, shown);
        if (c->json) {
            printf("],\"next_page_token\":");
            if (token) {
                putchar('"');
                print_hex(stdout, token, token_len);
                putchar('"');
            } else {
                printf("null");
            }
            printf("}\n");
        } else if (token) {
            fprintf(stderr, "next page: --page-token ");
            print_hex(stderr, token, token_len);
            fputc('\n', stderr);
        }
    }
    for (size_t k = 0; k < n_pages; k++)
        pg->free_page(pages[k]);
    free(pages);
    free(token);
    return rc;
}
