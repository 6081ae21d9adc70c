/*
 * config — the one table of mapflowd settings (DESIGN §7). The table drives the config
 * file parser (`key value` lines, `#` comments, size and duration units), the
 * command-line overrides (`--key value`), run-time `config get/set` (live keys only),
 * `mapflowd --help` and `mapflowd --print-config` (a complete sample file).
 *
 * Units: sizes take b, k|kb|kib, m|mb|mib, g|gb|gib, t|tb|tib (all powers of 1024;
 * a bare number is bytes). Durations take ms, s, m, h (a bare number is seconds).
 * Ratios are numbers in (0, 1]. Booleans/enums are words.
 *
 * Ownership: mfd_config_t owns its strings (free with mfd_config_deinit). Errors are
 * written into the caller's buffer. Thread safety: a config belongs to the loop thread;
 * nothing here is locked (log_level is mirrored into log.h's atomic by the caller).
 */
#ifndef MFD_CONFIG_H
#define MFD_CONFIG_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include "mf_status.h"

typedef enum mfd_write_through {
    MFD_WT_OFF = 0,
    MFD_WT_ASYNC = 1,
    MFD_WT_SYNC = 2,
} mfd_write_through_t;

typedef struct mfd_config {
    char *socket;              /* "" = auto (per-user runtime dir) until resolved */
    char *data_dir;            /* "" = auto (per-user data dir) until resolved */
    char *http;                /* host:port, "" = off */
    char *tcp;                 /* host:port, "" = off */
    char *ucx;                 /* UCX listener host:port (peers, remote clients), "" = off */
    char *token;               /* shared secret required on TCP; "" = none (the file's
                                  first line when token_file is set) */
    char *admin_socket;        /* "" = auto (beside socket) until resolved */
    char *admin_token;         /* Hello.admin_token that makes a connection admin; "" = none */
    char *peers;               /* as given: addresses or a file */
    char *peer_list;           /* not a key: peers parsed, "\nHOST:PORT\n..." */
    char *token_file;          /* file holding the token (0600 or stricter); "" = none */
    int token_from_file;       /* token was read from token_file (not a key of its own) */
    uint64_t host_bytes;
    uint64_t ssd_bytes;        /* 0 = SSD tier off */
    int ssd_reset;             /* an SSD database that cannot be opened is moved aside */
    uint64_t gpu_bytes;        /* per device; 0 = GPU tier off */
    char *gpu_devices;         /* "all" or a comma list of CUDA ordinals */
    int gpu_promote;           /* copy host-tier hits to the GPU tier */
    int host_pin;              /* register the host arena with CUDA when the GPU tier is on */
    double high_watermark;
    double low_watermark;
    int write_through;         /* mfd_write_through_t */
    uint64_t lease_ttl_ms;
    uint64_t reservation_ttl_ms;
    uint64_t max_frame;
    uint64_t max_batch;
    uint64_t io_threads;
    uint64_t max_connections;
    uint64_t frame_timeout_ms; /* a partial frame older than this closes its connection; 0 = off */
    uint64_t hello_timeout_ms; /* close a connection without Hello after this; 0 = off */
    uint64_t idle_timeout_ms;  /* close a silent connection after this; 0 = off */
    uint64_t max_unsent;       /* close a connection with more reply bytes unread */
    uint64_t max_lookup;       /* (layer, block) pairs per Lookup; blocks hashed per request */
    double reservation_share;  /* of the host arena, per namespace's uncommitted puts */
    int log_level;             /* mfd_log_level_t */
} mfd_config_t;

#define MFD_CONFIG_ERRLEN 256

/* Defaults from the table. MF_RESOURCE_EXHAUSTED on allocation failure. */
mf_status_t mfd_config_init(mfd_config_t *cfg);
void mfd_config_deinit(mfd_config_t *cfg);
/* Deep copy (dst is initialised by this call). */
mf_status_t mfd_config_copy(mfd_config_t *dst, const mfd_config_t *src);

/* Number of keys in the table and the name / liveness of key i (for iteration). */
size_t mfd_config_count(void);
const char *mfd_config_key(size_t i);
int mfd_config_is_live(const char *key);      /* -1 unknown key */

/*
 * Parses and stores one value. MF_NOT_FOUND (unknown key), MF_INVALID_ARGUMENT (bad
 * value or a watermark pair out of order); `err` receives a message. `live_only`
 * refuses keys that cannot change at run time with MF_FAILED_PRECONDITION.
 */
mf_status_t mfd_config_set(mfd_config_t *cfg, const char *key, const char *value,
                           int live_only, char *err, size_t errlen);
/* A live key set at run time (ConfigSet): mfd_config_set(live_only) plus its side effects
 * (the log level); the log line names `who` made the change. */
mf_status_t mfd_config_apply(mfd_config_t *cfg, const char *key, const char *value,
                             const char *who, char *err, size_t errlen);

/* Current value in canonical text (token shown as "***" when `redact`). */
mf_status_t mfd_config_get(const mfd_config_t *cfg, const char *key, int redact,
                           char *out, size_t outlen);

/*
 * token and token_file are one setting: set one of them, never both (an error names both).
 * Takes both from `from` into cfg (SIGHUP reload: a rotated file, or a switch between the
 * two, is applied at once); *changed = whether the token changed.
 */
mf_status_t mfd_config_take_token(mfd_config_t *cfg, const mfd_config_t *from, int *changed);

/* Whether addr is one of the configured `peers` (exact host:port text). */
int mfd_config_peer_allowed(const mfd_config_t *cfg, const char *addr);

/* Reads a config file into cfg. Errors name the file and line. */
mf_status_t mfd_config_load_file(mfd_config_t *cfg, const char *path, char *err,
                                 size_t errlen);
/* Parses text as a config file would be (used by the loader and by tests / fuzzing). */
mf_status_t mfd_config_parse_text(mfd_config_t *cfg, const char *name, const char *text,
                                  size_t len, char *err, size_t errlen);

/* Fills auto paths (socket, admin_socket, data_dir) from XDG_RUNTIME_DIR / XDG_DATA_HOME /
 * HOME / /tmp, creating the directories (mode 0700). A socket directory that is
 * world-writable and owned by another user is refused (MF_PERMISSION_DENIED). */
mf_status_t mfd_config_resolve_paths(mfd_config_t *cfg, char *err, size_t errlen);

void mfd_config_print_help(FILE *f);
void mfd_config_print_sample(FILE *f);

#endif /* MFD_CONFIG_H */
