/* config — the settings table and everything generated from it (see config.h). */
#include "config.h"
#include "mf_errf.h"
#include "log.h"
#include "mf_addr.h"
#include "mf_parse.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

typedef enum ctype {
    CT_STR,      /* free text */
    CT_ADDR,     /* host:port or "" */
    CT_SIZE,     /* bytes with units */
    CT_COUNT,    /* plain integer */
    CT_RATIO,    /* (0, 1] */
    CT_DURATION, /* milliseconds with units */
    CT_WT,       /* off | async | sync */
    CT_LEVEL,    /* error | warn | info | debug */
    CT_ONOFF,    /* on | off (also true/false, yes/no, 1/0) */
} ctype_t;

typedef struct cdef {
    const char *name;
    ctype_t type;
    size_t off;
    const char *def;
    uint64_t min, max;       /* CT_SIZE / CT_COUNT / CT_DURATION bounds */
    int live;
    const char *help;
    const char *example;     /* sample-file value for keys whose default is "" (auto/off) */
} cdef_t;

#define OFF(f) offsetof(mfd_config_t, f)
#define KB 1024ull
#define MB (1024ull * KB)
#define GB (1024ull * MB)
#define TB (1024ull * GB)

static const cdef_t g_table[] = {
    {"socket", CT_STR, OFF(socket), "", 0, 0, 0,
     "unix socket for same-node clients (mode 0660); empty = /run/mapflowd/mapflowd.sock "
     "if /run/mapflowd is writable, else $XDG_RUNTIME_DIR/mapflowd/mapflowd.sock, else "
     "/tmp/mapflowd-UID/mapflowd.sock (mapflowctl looks in the same order)",
     "/run/mapflowd/mapflowd.sock"},
    {"data_dir", CT_STR, OFF(data_dir), "", 0, 0, 0,
     "directory of the SSD tier (RocksDB); empty = $XDG_DATA_HOME/mapflowd or "
     "~/.local/share/mapflowd",
     "/var/lib/mapflowd"},
    {"http", CT_ADDR, OFF(http), "127.0.0.1:9477", 0, 0, 0,
     "HTTP listener for /metrics, /healthz, /readyz (host:port, port 0 = any; empty = off)",
     NULL},
    {"tcp", CT_ADDR, OFF(tcp), "", 0, 0, 0,
     "TCP control listener (host:port, port 0 = any; empty = off); clients must send token",
     "127.0.0.1:9478"},
    {"ucx", CT_ADDR, OFF(ucx), "", 0, 0, 0,
     "UCX listener for peer daemons and remote clients (host:port, port 0 = any; empty = "
     "off); non-loopback needs token",
     "127.0.0.1:9479"},
    {"token", CT_STR, OFF(token), "", 0, 0, 1,
     "shared secret TCP and UCX clients (and peer daemons) must present in Hello (empty = "
     "none); also what this daemon presents to its peers",
     "change-me"},
    {"admin_socket", CT_STR, OFF(admin_socket), "", 0, 0, 0,
     "unix socket for admin requests (mode 0600: config set, profile put, flush / evict of "
     "every namespace); empty = beside socket, NAME-admin.sock",
     "/run/mapflowd/mapflowd-admin.sock"},
    {"admin_token", CT_STR, OFF(admin_token), "", 0, 0, 1,
     "secret that makes a connection on any listener an admin one when its Hello carries "
     "it (empty = admin only on admin_socket)",
     "change-me-too"},
    {"peers", CT_STR, OFF(peers), "", 0, 0, 1,
     "peer daemons (UCX host:port) a Lookup / Get may name, comma-separated, or a file "
     "(a path with '/': one address per line, '#' comments); others are refused and never "
     "dialled (empty = none)",
     "10.0.0.2:9479,10.0.0.3:9479"},
    {"token_file", CT_STR, OFF(token_file), "", 0, 0, 1,
     "file whose first line is the token (instead of token, which shows in the process's "
     "command line when passed as --token); must not be accessible by group or others; "
     "at most 4 KiB; re-read by SIGHUP and `config set token_file`",
     "/run/secrets/mapflowd/token"},
    {"host_bytes", CT_SIZE, OFF(host_bytes), "1gb", 1 * MB, 16 * TB, 0,
     "size of the shared-memory host arena (memfd)", NULL},
    {"ssd_bytes", CT_SIZE, OFF(ssd_bytes), "16gb", 0, 1024 * TB, 1,
     "budget of the SSD tier (0 = SSD tier off)", NULL},
    {"ssd_reset", CT_ONOFF, OFF(ssd_reset), "off", 0, 0, 0,
     "when the SSD database cannot be opened or scanned (corrupt, or data files without "
     "CURRENT), move data_dir/rocksdb aside to rocksdb.bad-SECONDS and start empty; off = "
     "refuse to start (never a new database over old rows)",
     NULL},
    {"gpu_bytes", CT_SIZE, OFF(gpu_bytes), "0", 0, 1024 * GB, 0,
     "size of the GPU arena per device (0 = GPU tier off; needs the CUDA driver and a GPU)",
     NULL},
    {"gpu_devices", CT_STR, OFF(gpu_devices), "all", 0, 0, 0,
     "GPUs that get an arena: all, or a comma list of this daemon's CUDA ordinals", NULL},
    {"host_pin", CT_ONOFF, OFF(host_pin), "on", 0, 0, 0,
     "with the GPU tier on, page-lock the host arena for CUDA (cuMemHostRegister, in a "
     "background thread at start) so copies between the GPU and host tiers are DMA'd "
     "directly; makes the whole host arena resident",
     NULL},
    {"gpu_promote", CT_ONOFF, OFF(gpu_promote), "off", 0, 0, 1,
     "copy a host-tier row to the GPU tier when it is hit (on costs PCIe traffic per hit)",
     NULL},
    {"high_watermark", CT_RATIO, OFF(high_watermark), "0.9", 0, 0, 1,
     "host tier fill ratio that starts demotion to the SSD tier", NULL},
    {"low_watermark", CT_RATIO, OFF(low_watermark), "0.8", 0, 0, 1,
     "host tier fill ratio demotion stops at", NULL},
    {"write_through", CT_WT, OFF(write_through), "async", 0, 0, 1,
     "copy committed rows to the SSD tier: off | async | sync (sync = ack after fsync)",
     NULL},
    {"lease_ttl", CT_DURATION, OFF(lease_ttl_ms), "30s", 10, 24 * 3600 * 1000ull, 1,
     "lifetime of a read lease not released by its client", NULL},
    {"reservation_ttl", CT_DURATION, OFF(reservation_ttl_ms), "30s", 10,
     24 * 3600 * 1000ull, 1, "lifetime of an uncommitted put reservation", NULL},
    {"max_frame", CT_SIZE, OFF(max_frame), "64mb", 64 * KB, 1 * GB, 0,
     "largest protocol frame (bounds every request and reply)", NULL},
    /* 16384 = a 32k-token prefix (512 blocks of 64) x 32 layers in one Get, so a target
     * takes every lease of a hand-off in one call; such a Get holds the loop ~6 ms on a
     * loaded 2-core box (bench/results/get-prefix-lease-cpu.md), like max_lookup's bound.
     * The ceiling is the lease id's row field (MFD_LEASE_ROW_BITS). */
    {"max_batch", CT_COUNT, OFF(max_batch), "16384", 1, 1u << 20, 1,
     "most rows one Get (layers x blocks) or layers one Lookup may name", NULL},
    {"io_threads", CT_COUNT, OFF(io_threads), "2", 1, 64, 0,
     "SSD tier worker threads", NULL},
    {"max_connections", CT_COUNT, OFF(max_connections), "1024", 1, 1u << 20, 1,
     "most client connections at once", NULL},
    {"frame_timeout", CT_DURATION, OFF(frame_timeout_ms), "30s", 0, 3600 * 1000ull, 1,
     "close a connection whose partial frame has waited this long for the rest of its bytes "
     "(a client that stopped mid-frame holds a connection slot until then); 0 = off",
     NULL},
    {"hello_timeout", CT_DURATION, OFF(hello_timeout_ms), "10s", 0, 3600 * 1000ull, 1,
     "close a connection that has not completed Hello this long after it was accepted; "
     "0 = off", NULL},
    {"idle_timeout", CT_DURATION, OFF(idle_timeout_ms), "15m", 0, 7 * 24 * 3600 * 1000ull, 1,
     "close a connection that sent nothing this long (and awaits no reply); 0 = off", NULL},
    {"max_unsent", CT_SIZE, OFF(max_unsent), "256mb", 1 * MB, 64 * GB, 0,
     "most reply bytes one connection may leave unread: reading it pauses at half of "
     "this (or 2 x max_frame), and it is closed beyond it; at least max_frame", NULL},
    {"max_lookup", CT_COUNT, OFF(max_lookup), "262144", 1, 1u << 26, 1,
     "most (layer, block) pairs one Lookup may ask about, and most blocks one Lookup or "
     "Get may hash (bounds the loop time one request takes)", NULL},
    {"reservation_share", CT_RATIO, OFF(reservation_share), "0.5", 0, 0, 1,
     "largest share of the host arena one namespace's uncommitted put reservations may "
     "hold", NULL},
    {"log_level", CT_LEVEL, OFF(log_level), "info", 0, 0, 1,
     "error | warn | info | debug", NULL},
};
#define N_KEYS (sizeof(g_table) / sizeof(g_table[0]))

static const char *const wt_names[] = {"off", "async", "sync"};


static const cdef_t *find_key(const char *key)
{
    for (size_t i = 0; i < N_KEYS; i++)
        if (strcmp(g_table[i].name, key) == 0)
            return &g_table[i];
    return NULL;
}

size_t mfd_config_count(void)
{
    return N_KEYS;
}

const char *mfd_config_key(size_t i)
{
    return i < N_KEYS ? g_table[i].name : NULL;
}

int mfd_config_is_live(const char *key)
{
    const cdef_t *d = find_key(key);
    return d ? d->live : -1;
}

/* ---- unit parsers ----------------------------------------------------------------- */

static mf_status_t parse_count(const char *s, uint64_t *out)
{
    while (isspace((unsigned char)*s))
        s++;
    if (!isdigit((unsigned char)*s))
        return MF_INVALID_ARGUMENT;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    while (isspace((unsigned char)*end))
        end++;
    if (errno || *end)
        return MF_INVALID_ARGUMENT;
    *out = v;
    return MF_OK;
}

/* host:port with port 0..65535; "" is allowed (off). */
static mf_status_t check_addr(const char *s)
{
    if (!*s)
        return MF_OK;
    const char *colon = strrchr(s, ':');
    if (!colon || colon == s || !colon[1] || strlen(colon + 1) > 5)
        return MF_INVALID_ARGUMENT;
    for (const char *p = colon + 1; *p; p++)
        if (!isdigit((unsigned char)*p))
            return MF_INVALID_ARGUMENT;
    return atoi(colon + 1) <= 65535 ? MF_OK : MF_INVALID_ARGUMENT;
}

/* ---- set / get ------------------------------------------------------------------- */

static char **str_field(mfd_config_t *cfg, const cdef_t *d)
{
    return (char **)((char *)cfg + d->off);
}

#define TOKEN_FILE_MAX 4096

/* The first line of a token file (no group/other access, at most TOKEN_FILE_MAX bytes). */
static mf_status_t read_token_file(const char *path, char **out, char *err, size_t errlen)
{
    char buf[TOKEN_FILE_MAX + 1];
    mf_status_t st = MF_INVALID_ARGUMENT;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
    if (fd < 0) {
        mf_errf(err, errlen, "token_file: %s: %s", path, strerror(errno));
        return MF_INVALID_ARGUMENT;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        mf_errf(err, errlen, "token_file: %s is not a regular file", path);
        goto close_fd;
    }
    /* Like ssh with a private key: a secret others can read is already leaked. */
    if (sb.st_mode & (S_IRWXG | S_IRWXO)) {
        mf_errf(err, errlen,
                "token_file: %s is accessible by group or others (mode %04o); chmod 600 it",
                path, (unsigned)(sb.st_mode & 07777));
        goto close_fd;
    }
    size_t n = 0;
    while (n < sizeof(buf)) {
        ssize_t r = read(fd, buf + n, sizeof(buf) - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            mf_errf(err, errlen, "token_file: %s: %s", path, strerror(errno));
            goto close_fd;
        }
        if (r == 0)
            break;
        n += (size_t)r;
    }
    if (n > TOKEN_FILE_MAX) {
        mf_errf(err, errlen, "token_file: %s is larger than %d bytes", path, TOKEN_FILE_MAX);
        goto close_fd;
    }
    size_t len = 0;
    while (len < n && buf[len] != '\n')
        len++;
    if (len && buf[len - 1] == '\r')
        len--;
    if (memchr(buf, 0, len)) {
        mf_errf(err, errlen, "token_file: %s: NUL byte in the token", path);
        goto close_fd;
    }
    if (!len) {
        mf_errf(err, errlen, "token_file: %s: the first line (the token) is empty", path);
        goto close_fd;
    }
    buf[len] = 0;
    *out = strdup(buf);
    st = *out ? MF_OK : MF_RESOURCE_EXHAUSTED;
close_fd:
    close(fd);
    explicit_bzero(buf, sizeof(buf));
    return st;
}

#define PEERS_FILE_MAX (64 * 1024)

/* Appends one address of a peers list (checked like any host:port key) to *list. */
static mf_status_t add_peer(char **list, size_t *len, const char *a, size_t n, char *err,
                            size_t errlen)
{
    char addr[256];
    if (n == 0)
        return MF_OK;
    if (n >= sizeof(addr)) {
        mf_errf(err, errlen, "peers: an address is longer than %zu bytes", sizeof(addr) - 1);
        return MF_INVALID_ARGUMENT;
    }
    memcpy(addr, a, n);
    addr[n] = 0;
    for (size_t i = 0; i < n; i++) {
        if ((unsigned char)addr[i] <= 0x20 || addr[i] == 0x7f) {
            mf_errf(err, errlen, "peers: space or control byte in address");
            return MF_INVALID_ARGUMENT;
        }
    }
    if (check_addr(addr) != MF_OK) {
        mf_errf(err, errlen, "peers: '%s' is not host:port", addr);
        return MF_INVALID_ARGUMENT;
    }
    char *nl = realloc(*list, *len + n + 2);
    if (!nl)
        return MF_RESOURCE_EXHAUSTED;
    memcpy(nl + *len, addr, n);
    nl[*len + n] = '\n';
    nl[*len + n + 1] = 0;
    *list = nl;
    *len += n + 1;
    return MF_OK;
}

/* peers: "a:1,b:2" or a file of one address per line. The parsed list is kept as
 * "\na:1\nb:2\n" so a check is one exact match (no resolution before the decision). */
static mf_status_t store_peers(mfd_config_t *cfg, const char *value, char *err, size_t errlen)
{
    char *text = NULL, *list = strdup("\n");
    size_t len = 1;
    mf_status_t st = list ? MF_OK : MF_RESOURCE_EXHAUSTED;
    int is_file = strchr(value, '/') != NULL;
    if (st == MF_OK && is_file) {
        FILE *f = fopen(value, "r");
        if (!f) {
            mf_errf(err, errlen, "peers: %s: %s", value, strerror(errno));
            st = MF_INVALID_ARGUMENT;
        } else if (!(text = calloc(1, PEERS_FILE_MAX + 1))) {
            st = MF_RESOURCE_EXHAUSTED;
        } else if (fread(text, 1, PEERS_FILE_MAX + 1, f) > PEERS_FILE_MAX) {
            mf_errf(err, errlen, "peers: %s is larger than %d bytes", value, PEERS_FILE_MAX);
            st = MF_INVALID_ARGUMENT;
        }
        if (f)
            fclose(f);
    }
    const char *p = is_file ? text : value;
    while (st == MF_OK && p && *p) {
        size_t n = strcspn(p, is_file ? "\n#" : ", \t");
        const char *tok = p;
        p += n;
        if (is_file && *p == '#')
            p += strcspn(p, "\n");
        while (is_file && n && (tok[n - 1] == ' ' || tok[n - 1] == '\t' || tok[n - 1] == '\r'))
            n--;
        while (is_file && n && (*tok == ' ' || *tok == '\t'))
            tok++, n--;
        st = add_peer(&list, &len, tok, n, err, errlen);
        if (*p)
            p++;
    }
    free(text);
    char *copy = st == MF_OK ? strdup(value) : NULL;
    if (st == MF_OK && !copy)
        st = MF_RESOURCE_EXHAUSTED;
    if (st != MF_OK) {
        free(list);
        return st;
    }
    free(cfg->peers);
    cfg->peers = copy;
    free(cfg->peer_list);
    cfg->peer_list = list;
    return MF_OK;
}

int mfd_config_peer_allowed(const mfd_config_t *cfg, const char *addr)
{
    size_t n = strlen(addr);
    if (!cfg->peer_list || n == 0 || strchr(addr, '\n'))
        return 0;
    for (const char *p = cfg->peer_list; (p = strstr(p, addr)); p++)
        if (p[-1] == '\n' && p[n] == '\n')
            return 1;
    return 0;
}

static void replace_str(char **field, char *value)
{
    if (*field)
        explicit_bzero(*field, strlen(*field));
    free(*field);
    *field = value;
}

/* token / token_file: one of them at most; token_file sets token to the file's line. */
static mf_status_t store_token(mfd_config_t *cfg, int is_file, const char *value, char *err,
                               size_t errlen)
{
    char *path = NULL, *tok = NULL;
    if (!is_file) {
        if (cfg->token_file && cfg->token_file[0]) {
            mf_errf(err, errlen,
                    "token and token_file are mutually exclusive: token_file is %s (set "
                    "token_file \"\" first)", cfg->token_file);
            return MF_INVALID_ARGUMENT;
        }
        if (!(tok = strdup(value)))
            return MF_RESOURCE_EXHAUSTED;
        replace_str(&cfg->token, tok);
        cfg->token_from_file = 0;
        return MF_OK;
    }
    if (value[0] && cfg->token && cfg->token[0] && !cfg->token_from_file) {
        mf_errf(err, errlen,
                "token and token_file are mutually exclusive: token is set too (set token "
                "\"\" first)");
        return MF_INVALID_ARGUMENT;
    }
    if (value[0]) {
        mf_status_t st = read_token_file(value, &tok, err, errlen);
        if (st != MF_OK)
            return st;
    } else if (!cfg->token || cfg->token_from_file) {
        tok = strdup(""); /* token_file "" drops the file's token */
    }
    if (!(path = strdup(value)) || (!tok && (!cfg->token || cfg->token_from_file))) {
        free(path);
        replace_str(&tok, NULL);
        return MF_RESOURCE_EXHAUSTED;
    }
    replace_str(&cfg->token_file, path);
    if (tok) {
        replace_str(&cfg->token, tok);
        cfg->token_from_file = value[0] != 0;
    }
    return MF_OK;
}

static mf_status_t store_value(mfd_config_t *cfg, const cdef_t *d, const char *value,
                               char *err, size_t errlen)
{
    void *field = (char *)cfg + d->off;
    uint64_t u = 0;
    mf_status_t st = MF_OK;
    switch (d->type) {
    case CT_ADDR:
        if (check_addr(value) != MF_OK) {
            mf_errf(err, errlen, "%s: '%s' is not host:port (or empty)", d->name, value);
            return MF_INVALID_ARGUMENT;
        }
        /* fall through */
    case CT_STR: {
        if (strlen(value) > 4095) {
            mf_errf(err, errlen, "%s: value longer than 4095 bytes", d->name);
            return MF_INVALID_ARGUMENT;
        }
        if (d->off == OFF(token) || d->off == OFF(token_file))
            return store_token(cfg, d->off == OFF(token_file), value, err, errlen);
        if (d->off == OFF(peers))
            return store_peers(cfg, value, err, errlen);
        char *copy = strdup(value);
        if (!copy)
            return MF_RESOURCE_EXHAUSTED;
        free(*str_field(cfg, d));
        *str_field(cfg, d) = copy;
        return MF_OK;
    }
    case CT_SIZE:
        st = mf_parse_size(value, &u);
        break;
    case CT_DURATION:
        st = mf_parse_duration_ms(value, &u);
        break;
    case CT_COUNT:
        st = parse_count(value, &u);
        break;
    case CT_RATIO: {
        char *end;
        errno = 0;
        double r = strtod(value, &end);
        while (isspace((unsigned char)*end))
            end++;
        if (errno || end == value || *end || !(r > 0.0 && r <= 1.0)) {
            mf_errf(err, errlen, "%s: '%s' is not a ratio in (0, 1]", d->name, value);
            return MF_INVALID_ARGUMENT;
        }
        double hi = d->off == OFF(high_watermark) ? r : cfg->high_watermark;
        double lo = d->off == OFF(low_watermark) ? r : cfg->low_watermark;
        if (lo > hi) {
            mf_errf(err, errlen, "%s: low_watermark (%g) must not exceed high_watermark (%g)",
                    d->name, lo, hi);
            return MF_INVALID_ARGUMENT;
        }
        *(double *)field = r;
        return MF_OK;
    }
    case CT_WT:
        for (int i = 0; i < 3; i++) {
            if (strcasecmp(value, wt_names[i]) == 0) {
                *(int *)field = i;
                return MF_OK;
            }
        }
        mf_errf(err, errlen, "%s: '%s' is not one of off, async, sync", d->name, value);
        return MF_INVALID_ARGUMENT;
    case CT_ONOFF: {
        static const char *const on[] = {"on", "true", "yes", "1"}, *const off[] = {"off", "false", "no", "0"};
        for (int i = 0; i < 4; i++) {
            if (strcasecmp(value, on[i]) == 0 || strcasecmp(value, off[i]) == 0) {
                *(int *)field = strcasecmp(value, on[i]) == 0;
                return MF_OK;
            }
        }
        mf_errf(err, errlen, "%s: '%s' is not on or off", d->name, value);
        return MF_INVALID_ARGUMENT;
    }
    case CT_LEVEL: {
        mfd_log_level_t lv;
        if (mfd_log_parse_level(value, &lv) != MF_OK) {
            mf_errf(err, errlen, "%s: '%s' is not one of error, warn, info, debug", d->name,
                    value);
            return MF_INVALID_ARGUMENT;
        }
        *(int *)field = (int)lv;
        return MF_OK;
    }
    }
    if (st != MF_OK) {
        mf_errf(err, errlen, "%s: cannot parse '%s'%s", d->name, value,
                d->type == CT_SIZE       ? " as a size (e.g. 512mb, 4gb)"
                : d->type == CT_DURATION ? " as a duration (e.g. 500ms, 30s, 5m)"
                                         : " as a whole number");
        return MF_INVALID_ARGUMENT;
    }
    if (u < d->min || u > d->max) {
        mf_errf(err, errlen, "%s: %s is outside [%llu, %llu]%s", d->name, value,
                (unsigned long long)d->min, (unsigned long long)d->max,
                d->type == CT_SIZE ? " bytes" : d->type == CT_DURATION ? " ms" : "");
        return MF_INVALID_ARGUMENT;
    }
    *(uint64_t *)field = u;
    return MF_OK;
}

mf_status_t mfd_config_set(mfd_config_t *cfg, const char *key, const char *value,
                           int live_only, char *err, size_t errlen)
{
    const cdef_t *d = find_key(key);
    if (!d) {
        mf_errf(err, errlen, "unknown config key '%s'", key);
        return MF_NOT_FOUND;
    }
    if (live_only && !d->live) {
        mf_errf(err, errlen, "%s cannot change at run time (restart with the new value)",
                key);
        return MF_FAILED_PRECONDITION;
    }
    return store_value(cfg, d, value ? value : "", err, errlen);
}

/* Exact binary units where they divide, else bytes. */
static void format_size(uint64_t v, char *out, size_t n)
{
    static const char *const u[] = {"tb", "gb", "mb", "kb"};
    static const uint64_t m[] = {TB, GB, MB, KB};
    for (int i = 0; i < 4; i++) {
        if (v && v % m[i] == 0) {
            snprintf(out, n, "%llu%s", (unsigned long long)(v / m[i]), u[i]);
            return;
        }
    }
    snprintf(out, n, "%llu", (unsigned long long)v);
}

static void format_duration(uint64_t ms, char *out, size_t n)
{
    if (ms && ms % 3600000 == 0)
        snprintf(out, n, "%lluh", (unsigned long long)(ms / 3600000));
    else if (ms && ms % 60000 == 0)
        snprintf(out, n, "%llum", (unsigned long long)(ms / 60000));
    else if (ms % 1000 == 0)
        snprintf(out, n, "%llus", (unsigned long long)(ms / 1000));
    else
        snprintf(out, n, "%llums", (unsigned long long)ms);
}

static void format_value(const mfd_config_t *cfg, const cdef_t *d, int redact, char *out,
                         size_t n)
{
    const void *field = (const char *)cfg + d->off;
    switch (d->type) {
    case CT_STR:
    case CT_ADDR: {
        const char *s = *(char *const *)field;
        if (redact && (d->off == OFF(token) || d->off == OFF(admin_token)) && s && *s)
            s = "***";
        snprintf(out, n, "%s", s ? s : "");
        break;
    }
    case CT_SIZE:
        format_size(*(const uint64_t *)field, out, n);
        break;
    case CT_DURATION:
        format_duration(*(const uint64_t *)field, out, n);
        break;
    case CT_COUNT:
        snprintf(out, n, "%llu", (unsigned long long)*(const uint64_t *)field);
        break;
    case CT_RATIO:
        snprintf(out, n, "%g", *(const double *)field);
        break;
    case CT_WT:
        snprintf(out, n, "%s", wt_names[*(const int *)field]);
        break;
    case CT_LEVEL:
        snprintf(out, n, "%s", mfd_log_level_name((mfd_log_level_t) * (const int *)field));
        break;
    case CT_ONOFF:
        snprintf(out, n, "%s", *(const int *)field ? "on" : "off");
        break;
    }
}

mf_status_t mfd_config_get(const mfd_config_t *cfg, const char *key, int redact, char *out,
                           size_t outlen)
{
    const cdef_t *d = find_key(key);
    if (!d)
        return MF_NOT_FOUND;
    format_value(cfg, d, redact, out, outlen);
    return MF_OK;
}

/* ---- lifecycle ------------------------------------------------------------------- */

mf_status_t mfd_config_init(mfd_config_t *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    /* Ratios are checked as a pair; start from the extremes so defaults always fit. */
    cfg->high_watermark = 1.0;
    cfg->low_watermark = 0.0;
    for (size_t i = 0; i < N_KEYS; i++) {
        mf_status_t st = store_value(cfg, &g_table[i], g_table[i].def, NULL, 0);
        if (st != MF_OK) {
            mfd_config_deinit(cfg);
            return st;
        }
    }
    return MF_OK;
}

void mfd_config_deinit(mfd_config_t *cfg)
{
    for (size_t i = 0; i < N_KEYS; i++) {
        if (g_table[i].type == CT_STR || g_table[i].type == CT_ADDR) {
            free(*str_field(cfg, &g_table[i]));
            *str_field(cfg, &g_table[i]) = NULL;
        }
    }
    free(cfg->peer_list);
    cfg->peer_list = NULL;
}

mf_status_t mfd_config_copy(mfd_config_t *dst, const mfd_config_t *src)
{
    *dst = *src;
    for (size_t i = 0; i < N_KEYS; i++)
        if (g_table[i].type == CT_STR || g_table[i].type == CT_ADDR)
            *str_field(dst, &g_table[i]) = NULL;
    if (!(dst->peer_list = strdup(src->peer_list ? src->peer_list : "\n")))
        return MF_RESOURCE_EXHAUSTED;
    for (size_t i = 0; i < N_KEYS; i++) {
        if (g_table[i].type != CT_STR && g_table[i].type != CT_ADDR)
            continue;
        const char *s = *(char *const *)((const char *)src + g_table[i].off);
        if (!(*str_field(dst, &g_table[i]) = strdup(s ? s : ""))) {
            mfd_config_deinit(dst);
            return MF_RESOURCE_EXHAUSTED;
        }
    }
    return MF_OK;
}

mf_status_t mfd_config_take_token(mfd_config_t *cfg, const mfd_config_t *from, int *changed)
{
    char *tok = strdup(from->token ? from->token : "");
    char *path = strdup(from->token_file ? from->token_file : "");
    if (!tok || !path) {
        free(tok);
        free(path);
        return MF_RESOURCE_EXHAUSTED;
    }
    *changed = strcmp(tok, cfg->token ? cfg->token : "") != 0;
    replace_str(&cfg->token, tok);
    replace_str(&cfg->token_file, path);
    cfg->token_from_file = from->token_from_file;
    return MF_OK;
}

/* ---- files ----------------------------------------------------------------------- */

mf_status_t mfd_config_parse_text(mfd_config_t *cfg, const char *name, const char *text,
                                  size_t len, char *err, size_t errlen)
{
    size_t pos = 0;
    unsigned lineno = 0;
    char line[4352];
    while (pos < len) {
        lineno++;
        size_t end = pos;
        while (end < len && text[end] != '\n')
            end++;
        size_t n = end - pos;
        if (n >= sizeof(line)) {
            mf_errf(err, errlen, "%s:%u: line longer than %zu bytes", name, lineno,
                    sizeof(line) - 1);
            return MF_INVALID_ARGUMENT;
        }
        memcpy(line, text + pos, n);
        line[n] = 0;
        pos = end + 1;
        if (memchr(line, 0, n)) {
            mf_errf(err, errlen, "%s:%u: NUL byte in line", name, lineno);
            return MF_INVALID_ARGUMENT;
        }
        /* A '#' at the start or after blank space begins a comment. */
        for (size_t i = 0; i < n; i++) {
            if (line[i] == '#' && (i == 0 || isspace((unsigned char)line[i - 1]))) {
                line[i] = 0;
                break;
            }
        }
        char *p = line;
        while (isspace((unsigned char)*p))
            p++;
        if (!*p)
            continue;
        char *key = p;
        while (*p && !isspace((unsigned char)*p))
            p++;
        if (*p)
            *p++ = 0;
        while (isspace((unsigned char)*p))
            p++;
        char *val = p;
        size_t vl = strlen(val);
        while (vl && isspace((unsigned char)val[vl - 1]))
            val[--vl] = 0;
        if (vl >= 2 && val[0] == '"' && val[vl - 1] == '"') { /* "" = explicitly empty */
            val[vl - 1] = 0;
            val++;
        }
        char why[MFD_CONFIG_ERRLEN];
        mf_status_t st = mfd_config_set(cfg, key, val, 0, why, sizeof(why));
        if (st != MF_OK) {
            mf_errf(err, errlen, "%s:%u: %s", name, lineno, why);
            return st == MF_NOT_FOUND ? MF_INVALID_ARGUMENT : st;
        }
    }
    return MF_OK;
}

mf_status_t mfd_config_load_file(mfd_config_t *cfg, const char *path, char *err,
                                 size_t errlen)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        mf_errf(err, errlen, "%s: %s", path, strerror(errno));
        return errno == ENOENT ? MF_NOT_FOUND : MF_PERMISSION_DENIED;
    }
    /* Config files are small; refuse anything absurd before reading it whole. */
    char *buf = malloc(1 << 20);
    if (!buf) {
        fclose(f);
        return MF_RESOURCE_EXHAUSTED;
    }
    size_t n = fread(buf, 1, 1 << 20, f);
    int too_big = n == (1 << 20);
    fclose(f);
    mf_status_t st;
    if (too_big) {
        mf_errf(err, errlen, "%s: larger than 1 MiB", path);
        st = MF_INVALID_ARGUMENT;
    } else {
        st = mfd_config_parse_text(cfg, path, buf, n, err, errlen);
    }
    free(buf);
    return st;
}

static mf_status_t make_dirs(const char *path, char *err, size_t errlen)
{
    char tmp[4096];
    if (snprintf(tmp, sizeof(tmp), "%s", path) >= (int)sizeof(tmp)) {
        mf_errf(err, errlen, "path too long: %s", path);
        return MF_INVALID_ARGUMENT;
    }
    for (char *p = tmp + 1;; p++) {
        if (*p == '/' || *p == 0) {
            char c = *p;
            *p = 0;
            if (mkdir(tmp, 0700) != 0 && errno != EEXIST) {
                mf_errf(err, errlen, "mkdir %s: %s", tmp, strerror(errno));
                return MF_PERMISSION_DENIED;
            }
            *p = c;
            if (!c)
                break;
        }
    }
    return MF_OK;
}

/* A directory others may write to lets them swap the socket for their own (clients would
 * then hand it tokens and rows): refuse one that is world-writable and not ours. */
static mf_status_t check_socket_dir(const char *dir, char *err, size_t errlen)
{
    struct stat sb;
    if (stat(dir, &sb) != 0) {
        mf_errf(err, errlen, "socket directory %s: %s", dir, strerror(errno));
        return MF_PERMISSION_DENIED;
    }
    if ((sb.st_mode & S_IWOTH) && sb.st_uid != geteuid()) {
        mf_errf(err, errlen,
                "socket directory %s is world-writable (mode %04o) and owned by uid %u, not "
                "us (uid %u): anyone could replace the socket; use a private directory",
                dir, (unsigned)(sb.st_mode & 07777), (unsigned)sb.st_uid, (unsigned)geteuid());
        return MF_PERMISSION_DENIED;
    }
    return MF_OK;
}

mf_status_t mfd_config_resolve_paths(mfd_config_t *cfg, char *err, size_t errlen)
{
    char buf[4096];
    const char *xd = getenv("XDG_DATA_HOME");
    const char *home = getenv("HOME");
    if (!cfg->socket[0]) {
        mf_default_socket_path(buf, sizeof(buf), 1);
        mf_status_t st = mfd_config_set(cfg, "socket", buf, 0, err, errlen);
        if (st != MF_OK)
            return st;
    }
    if (!cfg->data_dir[0]) {
        if (xd && xd[0] == '/')
            snprintf(buf, sizeof(buf), "%s/mapflowd", xd);
        else if (home && home[0] == '/' && access(home, W_OK) == 0)
            snprintf(buf, sizeof(buf), "%s/.local/share/mapflowd", home);
        else
            snprintf(buf, sizeof(buf), "/tmp/mapflowd-%u/data", (unsigned)getuid());
        mf_status_t st = mfd_config_set(cfg, "data_dir", buf, 0, err, errlen);
        if (st != MF_OK)
            return st;
    }
    if (!cfg->admin_socket[0]) {
        mf_admin_socket_path(cfg->socket, buf, sizeof(buf));
        mf_status_t st = mfd_config_set(cfg, "admin_socket", buf, 0, err, errlen);
        if (st != MF_OK)
            return st;
    }
    /* The sockets' directories, then the data directory. */
    const char *socks[2] = {cfg->socket, cfg->admin_socket};
    for (int i = 0; i < 2; i++) {
        snprintf(buf, sizeof(buf), "%s", socks[i]);
        char *slash = strrchr(buf, '/');
        if (!slash)
            snprintf(buf, sizeof(buf), ".");
        else if (slash == buf)
            buf[1] = 0;
        else
            *slash = 0;
        mf_status_t st = make_dirs(buf, err, errlen);
        if (st == MF_OK)
            st = check_socket_dir(buf, err, errlen);
        if (st != MF_OK)
            return st;
    }
    return make_dirs(cfg->data_dir, err, errlen);
}

/* ---- generated text ----------------------------------------------------------------- */

static const char *type_hint(ctype_t t)
{
    switch (t) {
    case CT_SIZE: return "SIZE";
    case CT_DURATION: return "DURATION";
    case CT_COUNT: return "N";
    case CT_RATIO: return "RATIO";
    case CT_ADDR: return "HOST:PORT";
    case CT_WT: return "off|async|sync";
    case CT_LEVEL: return "LEVEL";
    case CT_ONOFF: return "on|off";
    default: return "TEXT";
    }
}

void mfd_config_print_help(FILE *f)
{
    fprintf(f,
            "usage: mapflowd [-c FILE] [--KEY VALUE ...] [--help] [--print-config] "
            "[--check-config FILE] [--version]\n\n"
            "mapflowd keeps attention-map rows for LLM hand-offs in a host arena and an SSD\n"
            "tier and serves them over a unix socket (and optional TCP).\n\n"
            "  -c, --config FILE   read KEY VALUE lines from FILE (command line wins)\n"
            "  --print-config      print a complete sample config file and exit\n"
            "  --check-config FILE parse FILE (and overrides) as a start would; exit 0 if valid\n"
            "  --help              this text\n\nkeys (each also --KEY VALUE or --KEY=VALUE):\n");
    for (size_t i = 0; i < N_KEYS; i++) {
        const cdef_t *d = &g_table[i];
        char flag[64];
        snprintf(flag, sizeof(flag), "--%s %s", d->name, type_hint(d->type));
        fprintf(f, "  %-30s %s\n  %-30s default: %s%s\n", flag, d->help, "",
                d->def[0] ? d->def : "\"\"", d->live ? "  [live]" : "");
    }
    fprintf(f, "\nSIZE takes b, kb, mb, gb, tb (powers of 1024; bare = bytes); DURATION takes\n"
               "ms, s, m, h (bare = seconds). [live] keys change at run time through\n"
               "`mapflowctl config set` or SIGHUP (reloads -c FILE). SIGTERM drains and exits.\n");
}

void mfd_config_print_sample(FILE *f)
{
    fprintf(f, "# mapflowd configuration (generated by `mapflowd --print-config`).\n"
               "# One \"key value\" per line; '#' starts a comment. Sizes take b, kb, mb, gb, tb\n"
               "# (powers of 1024); durations take ms, s, m, h. Keys marked [live] may change\n"
               "# at run time (`mapflowctl config set KEY VALUE`, or edit and send SIGHUP).\n"
               "# Every key has a default; a line left commented keeps it.\n");
    for (size_t i = 0; i < N_KEYS; i++) {
        const cdef_t *d = &g_table[i];
        fprintf(f, "\n# %s%s\n", d->help, d->live ? " [live]" : "");
        if (d->def[0])
            fprintf(f, "%s %s\n", d->name, d->def);
        else
            fprintf(f, "#%s %s\n", d->name, d->example ? d->example : "");
    }
}

mf_status_t mfd_config_apply(mfd_config_t *cfg, const char *key, const char *value,
                             const char *who, char *err, size_t errlen)
{
    mf_status_t st = mfd_config_set(cfg, key, value, 1, err, errlen);
    if (st == MF_OK) {
        mfd_log_set_level((mfd_log_level_t)cfg->log_level);
        char v[256];
        mfd_config_get(cfg, key, 1, v, sizeof(v));
        mfd_info("config: %s = %s (set by %s)", key, v, who);
    } else {
        mfd_info("config: set %s refused (by %s): %s", key, who, err);
    }
    return st;
}
