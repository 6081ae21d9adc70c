/*
 * conn — the lowest layer of mapflowd's control plane: one client connection (frame
 * input with mf_frame_reader, replies queued in an evbuffer, reply / error / hold, the
 * fatal-error close) and the daemon state every request handler reaches through c->srv.
 *
 * Protocol rules (proto/mapflow.proto): a malformed frame gets ErrorReply and the
 * connection closes; an undecodable body gets UNIMPLEMENTED and the connection stays;
 * replies carry the request's id and may come out of order. Decoded requests go to
 * s->dispatch (dispatch.c sets it): this layer knows no request types.
 * Bounds: max_unsent (output; past it the connection closes), backpressure (reading stops
 * while the output backlog is large), max_connections (mfd_conn_adopt refuses).
 *
 * Ownership: the server (daemon.c) owns the mfd_server_t; this module allocates and frees
 * connections. A closed connection stays allocated while `pending` holds (async
 * operations that will still reply); its tickets go at close through s->on_close.
 * Thread safety: loop thread only.
 */
#ifndef MFD_CONN_H
#define MFD_CONN_H

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/listener.h>
#include <stddef.h>
#include <stdint.h>
#include "config.h"
#include "log.h"
#include "metrics.h"
#include "mf_frame.h"
#include "store.h"
#include "ticket.h"
#include "tier.h"

typedef struct mfd_server mfd_server_t;
typedef struct mfd_conn mfd_conn_t;
typedef struct mfd_http mfd_http_t;

/* How a connection reached the daemon: unix and tcp (listen.c), ucx (peer.c: a bridged
 * UCX endpoint). */
typedef struct mfd_transport {
    const char *name;          /* "unix", "tcp", "ucx" */
    int requires_token;        /* Hello.token must match config `token` */
    int can_pass_fds;          /* SCM_RIGHTS possible (host arena) */
} mfd_transport_t;

extern const mfd_transport_t mfd_transport_unix;
extern const mfd_transport_t mfd_transport_tcp;

typedef enum mfd_admin_via { MFD_ADMIN_NO, MFD_ADMIN_SOCKET, MFD_ADMIN_TOKEN } mfd_admin_via_t;

struct mfd_conn {
    mfd_server_t *srv;
    const mfd_transport_t *tp;
    int fd;
    struct event *rev, *wev;
    struct evbuffer *out;
    mf_frame_reader_t rd;
    int hello_done, has_arena;
    int admin;               /* mfd_admin_via_t: may run admin requests (dispatch.c) */
    struct mfd_ns_acct *acct; /* this namespace's reservation bytes (after Hello; lease.h) */
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
};

/* Handles one decoded request (dispatch.c's mfd_server_dispatch). */
typedef void (*mfd_dispatch_fn)(mfd_conn_t *c, const mf_envelope_t *env,
                                const uint8_t *payload, size_t payload_len);
/* A connection closes: releases what it owned; returns how many tickets went. */
typedef size_t (*mfd_close_fn)(mfd_server_t *s, mfd_conn_t *c);

/* The daemon. Fields are grouped by the module that writes them; any module that holds a
 * connection may read the shared part. */
struct mfd_server {
    /* shared: written by daemon.c at create / reload, read by every handler */
    mfd_config_t cfg;
    struct event_base *base;
    mfd_store_t store;
    mfd_metrics_t metrics;
    mfd_tickets_t *tickets;
    struct mfd_peers *peers; /* UCX listener and peer links (peer.h) */
    uint64_t start_ms;
    int ready, draining;
    mfd_dispatch_fn dispatch;
    mfd_close_fn on_close;
    /* conn.c */
    mfd_conn_t *conns;
    size_t n_conns;
    mfd_log_limit_t accept_log; /* rate limit of accept warnings */
    /* dispatch.c (Hello) */
    uint64_t next_session;
    mfd_log_limit_t denied_log; /* rate limit of "X refused: not an admin connection" */
    /* lease.c */
    uint64_t leased_rows;    /* rows under a lease (a lease ticket covers a Get's rows) */
    struct mfd_ns_acct *ns_accts; /* namespaces with a live connection */
    /* listen.c */
    struct evconnlistener *unix_l, *tcp_l, *admin_l;
    char unix_path[4096], admin_path[4096];
    int accept_paused;       /* out of descriptors: listeners off until a connection closes */
    char tcp_addr[128];      /* as bound (actual port) */
    /* daemon.c */
    char *config_path;       /* -c FILE, for SIGHUP; NULL if none */
    char **overrides;        /* "key", "value" pairs from the command line, for reload */
    size_t n_overrides;
    char http_addr[128];     /* as bound (actual port) */
    mfd_http_t *http;
    struct evconnlistener *http_l; /* evhttp's listener (http.c), NULL when off */
    struct event *sig_term, *sig_int, *sig_hup, *tick, *stop_ev;
};

/* Serves an already connected byte stream fd as transport tp (an accepted socket, a
 * bridged UCX endpoint); takes fd over, closing it when refused (draining,
 * max_connections). *out (may be NULL) is the new connection. */
mf_status_t mfd_conn_adopt(mfd_server_t *s, int fd, const mfd_transport_t *tp,
                           const char *peer_name, mfd_conn_t **out);

/* Queues a reply frame; payload is copied. */
void mfd_conn_reply(mfd_conn_t *c, mf_envelope_t *env, const void *payload, size_t len);
void mfd_conn_error(mfd_conn_t *c, uint64_t request_id, mf_status_t code, const char *fmt,
                    ...) __attribute__((format(printf, 4, 5)));
/* Fatal protocol error: ErrorReply, then close once it is written. */
void mfd_conn_fail(mfd_conn_t *c, uint64_t rid, mf_status_t code, const char *msg);
/* Writes what the socket takes of c->out; schedules the rest (after appending to it). */
void mfd_conn_flush(mfd_conn_t *c);
void mfd_conn_close(mfd_conn_t *c);
/* An async operation starts / ends (keeps a closed connection's memory alive). */
void mfd_conn_hold(mfd_conn_t *c);
void mfd_conn_unhold(mfd_conn_t *c);

/* "connection unix:#7 (pid 12 uid 1000, admin socket), client 'x', namespace 'y'". */
void mfd_conn_describe(const mfd_conn_t *c, char *out, size_t n);
/* Accept / refusal trouble: logged once, then at most every 10 s with the count between. */
void mfd_conn_warn_limited(mfd_server_t *s, const char *what);
/* Names clients choose (namespace, model, client name) reach logs, keys and file names
 * of tools: 1 when p has a control byte. */
int mfd_has_control(const char *p);

/* Stats / Health / metrics views (the tiers themselves: mfd_store_tiers). */
void mfd_server_gauges(mfd_server_t *s, mfd_gauges_t *g);

/* A reply with body `field` of case CASE. */
#define MFD_REPLY(c, rid, CASE, field, msg, payload, len)                               \
    do {                                                                                \
        mf_envelope_t env_ = MAPFLOW__V1__ENVELOPE__INIT;                                 \
        env_.request_id = (rid);                                                        \
        env_.body_case = MAPFLOW__V1__ENVELOPE__BODY_##CASE;                            \
        env_.field = (msg);                                                             \
        mfd_conn_reply((c), &env_, (payload), (len));                                   \
    } while (0)

#define MFD_VERSION_STR MFD_VERSION

#endif /* MFD_CONN_H */
