/*
 * server — mapflowd's control plane on one libevent loop: the unix-socket and TCP
 * listeners, connections (frame I/O with mf_frame_reader, replies queued in an
 * evbuffer), the request dispatcher, leases and reservations, the expiry timer,
 * signals (SIGTERM/SIGINT drain, SIGHUP reload) and the HTTP endpoint's data.
 *
 * Protocol rules (proto/mapflow.proto and the issue): the first frame must be Hello;
 * a malformed frame gets ErrorReply and the connection closes; an unknown body gets
 * UNIMPLEMENTED and the connection stays; replies carry the request's id and may come
 * out of order (SSD reads and synced writes complete later). Each connection is bound
 * to one namespace; keys are always built under it, so other namespaces are invisible.
 * On the unix socket, Hello{want_host_arena} gets the host arena's memfd with the
 * HelloReply (SCM_RIGHTS, one sendmsg). Anyone who can open the socket can then read
 * and write the whole arena: namespace isolation is enforced by this API, not against
 * a hostile local process — guard the socket's directory and group.
 *
 * Admin: connections on the admin socket (0600) or with Hello.admin_token may send the
 * admin requests (ConfigSet, ProfilePut, Flush / Evict of every namespace); the
 * dispatcher refuses others PERMISSION_DENIED. Peers named by a request must be in config
 * `peers`. Bounds: hello_timeout / idle_timeout / frame_timeout (tick), max_unsent (output),
 * max_lookup (per request), reservation_share (per namespace, mfd_ns_acct), and the
 * listeners pause at the descriptor limit.
 *
 * Ownership: the server owns the config it was given, the store, every connection and
 * all tickets. Thread safety: everything runs on the loop thread; mfd_server_stop may
 * be called from any thread, even before mfd_server_run starts (it activates an event).
 */
#ifndef MFD_SERVER_H
#define MFD_SERVER_H

#include <event2/event.h>
#include <event2/buffer.h>
#include <event2/listener.h>
#include <stddef.h>
#include <stdint.h>
#include "config.h"
#include "lease.h"
#include "metrics.h"
#include "mf_frame.h"
#include "store.h"
#include "tier.h"

typedef struct mfd_server mfd_server_t;
typedef struct mfd_http mfd_http_t;

typedef enum mfd_admin_via { MFD_ADMIN_NO, MFD_ADMIN_SOCKET, MFD_ADMIN_TOKEN } mfd_admin_via_t;

typedef struct mfd_conn {
    mfd_server_t *srv;
    const mfd_transport_t *tp;
    int fd;
    struct event *rev, *wev;
    struct evbuffer *out;
    mf_frame_reader_t rd;
    int hello_done, has_arena;
    int admin;               /* mfd_admin_via_t: may run admin requests (server.c) */
    struct mfd_ns_acct *acct; /* this namespace's reservation bytes (after Hello) */
    size_t gpu_arenas;       /* GPU arenas announced in HelloReply (want_gpu_arena, unix) */
    int closing;             /* flush the output, then close (after a fatal error) */
    int dead;                /* closed; freed when `pending` reaches 0 */
    int read_paused;         /* output backlog too large */
    uint64_t partial_since_ms; /* when the partial frame now buffered began; 0 = none */
    uint64_t accepted_ms, last_rx_ms; /* hello_timeout / idle_timeout clocks */
    unsigned pending;        /* async operations that will reply later */
    char ns[MFD_NS_MAX + 1];
    size_t ns_len;
    char name[64];           /* Hello.client_name, for logs */
    char peer[80];
    char creds[48];          /* unix sockets: "pid P uid U" (SO_PEERCRED), for logs */
    uint64_t session_id;
    struct mfd_conn *prev, *next;
} mfd_conn_t;

struct mfd_server {
    mfd_config_t cfg;
    char *config_path;       /* -c FILE, for SIGHUP; NULL if none */
    char **overrides;        /* "key", "value" pairs from the command line, for reload */
    size_t n_overrides;
    struct event_base *base;
    mfd_store_t store;
    mfd_metrics_t metrics;
    mfd_tickets_t *tickets;
    uint64_t leased_rows;    /* rows under a lease (a lease ticket covers a Get's rows) */
    struct evconnlistener *unix_l, *tcp_l, *admin_l;
    char unix_path[4096], admin_path[4096];
    int accept_paused;       /* out of descriptors: listeners off until a connection closes */
    uint64_t accept_log_ms, accept_log_suppressed; /* rate limit of accept warnings */
    struct mfd_ns_acct *ns_accts; /* namespaces with a live connection */
    char tcp_addr[128], http_addr[128];   /* as bound (actual port) */
    mfd_http_t *http;
    struct evconnlistener *http_l; /* evhttp's listener (http.c), NULL when off */
    struct event *sig_term, *sig_int, *sig_hup, *tick, *stop_ev;
    mfd_conn_t *conns;
    size_t n_conns;
    uint64_t next_session;
    uint64_t start_ms;
    int ready, draining;
    struct mfd_peers *peers; /* UCX listener and peer links (peer.h) */
};

/*
 * Takes over *cfg (zeroed on return). config_path and the overrides are copied; they
 * are re-applied on SIGHUP (command line wins over the file). Opens the tiers, binds
 * the listeners and logs what it chose. Errors go to `err`.
 */
mf_status_t mfd_server_create(mfd_config_t *cfg, const char *config_path,
                              char *const *overrides, size_t n_overrides,
                              mfd_server_t **out, char *err, size_t errlen);
/* Runs the loop until SIGTERM / SIGINT / mfd_server_stop, then drains. */
mf_status_t mfd_server_run(mfd_server_t *s);
void mfd_server_stop(mfd_server_t *s);
void mfd_server_destroy(mfd_server_t *s);

/* SIGHUP: re-reads the config file and applies changed live keys. */
mf_status_t mfd_server_reload(mfd_server_t *s, char *err, size_t errlen);

/* Applies a live key (config set / reload) and its side effects (log level); the log
 * line names `who` made the change. */
mf_status_t mfd_server_config_set(mfd_server_t *s, const char *key, const char *value,
                                  const char *who, char *err, size_t errlen);
/* "connection unix:#7 (pid 12 uid 1000, admin socket), client 'x', namespace 'y'". */
void mfd_conn_describe(const mfd_conn_t *c, char *out, size_t n);

/* ---- used by admin.c / http.c (loop thread) ------------------------------------------ */

void mfd_server_gauges(mfd_server_t *s, mfd_gauges_t *g);
/* Tiers in the order gpu, host, ssd. */
void mfd_server_tiers(mfd_server_t *s, mfd_tier_info_t out[3]);

/* Queues a reply frame; payload is copied. Latency is observed for `hist` >= 0. */
void mfd_conn_reply(mfd_conn_t *c, mf_envelope_t *env, const void *payload, size_t len);
void mfd_conn_error(mfd_conn_t *c, uint64_t request_id, mf_status_t code, const char *fmt,
                    ...) __attribute__((format(printf, 4, 5)));
/* An async operation starts / ends (keeps a closed connection's memory alive). */
void mfd_conn_hold(mfd_conn_t *c);
void mfd_conn_unhold(mfd_conn_t *c);

/* "host:port" a listening socket is bound to (the real port when 0 was asked for). */
void mfd_format_bound(int fd, char *out, size_t n);

/* ---- used by peer.c (loop thread) ----------------------------------------------------- */

/* Serves an already connected byte stream (a bridged UCX endpoint) as transport tp; takes
 * fd over, closing it when refused (draining, max_connections). */
mf_status_t mfd_server_adopt(mfd_server_t *s, int fd, const mfd_transport_t *tp,
                             const char *peer_name);
/* A Get / Lookup naming a peer, run again locally once the peer has answered: forced[i]
 * (non-zero) is row i's status when it is still missing here; peer_blocks[l] raises
 * layer l's count (NULL: the peer did not answer). Neither goes to the peer again. */
void mfd_server_get_resume(mfd_conn_t *c, uint64_t rid, const Mapflow__V1__Get *m,
                           const uint8_t *payload, size_t plen, double t0,
                           const mf_status_t *forced);
void mfd_server_lookup_resume(mfd_conn_t *c, uint64_t rid, const Mapflow__V1__Lookup *m,
                              const uint8_t *payload, size_t plen, double t0,
                              const uint32_t *peer_blocks, size_t n_peer_blocks);

/* Handles one decoded request (the dispatcher; exported for in-process tests). */
void mfd_server_dispatch(mfd_conn_t *c, const mf_envelope_t *env, const uint8_t *payload,
                         size_t payload_len);

#define MFD_VERSION_STR MFD_VERSION

#endif /* MFD_SERVER_H */
