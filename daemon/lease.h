/*
 * lease — what a connection holds between requests: lease groups (the pins on the rows
 * one GET_LEASE Get handed out), put reservations (an arena block waiting for its
 * PutCommit), put regions (a GPU arena block for a layer's rows, PutRegionCommit) and the per-namespace account of reserved bytes that reservation_share
 * bounds. Both kinds are tickets (ticket.h) owned by the connection: Release / PutCommit
 * find them by id and owner, the tick expires them, and a closing connection drops them.
 *
 * Ownership: a group or reservation is allocated by its handler (rows.c) and freed here
 * when it is released, expired or its owner closes; accounts are reference-counted by the
 * connections bound to the namespace (Hello takes one, close drops it).
 * Thread safety: loop thread only.
 */
#ifndef MFD_LEASE_H
#define MFD_LEASE_H

#include <stddef.h>
#include <stdint.h>
#include "conn.h"
#include "store.h"
#include "ticket.h"

/* A lease group: pins on the rows one Get leased, owned by a connection. Row k's
 * lease id is (t.id << MFD_LEASE_ROW_BITS) | k, so every row keeps its own id (Release of
 * one id releases that row) while a Get costs one ticket, not one per row. */
#define MFD_LEASE_ROW_BITS 20    /* max_batch ≤ 2^20 rows */
typedef struct mfd_lease {
    mfd_ticket_t t;          /* first: tickets are cast back to leases */
    uint32_t n, live;        /* rows leased, rows not yet released */
    mfd_entry_t *e[];        /* NULL once released */
} mfd_lease_t;

/* One namespace with a live connection: the bytes its uncommitted reservations hold
 * (reservation_share bounds them, so one tenant cannot reserve the whole arena). */
typedef struct mfd_ns_acct {
    struct mfd_ns_acct *next;
    unsigned refs;           /* connections bound to it */
    uint64_t reserved;
    size_t len;
    char ns[MFD_NS_MAX + 1];
} mfd_ns_acct_t;

/* A put reservation: a store slot (host or GPU arena block) waiting for PutCommit. */
typedef struct mfd_reservation {
    mfd_ticket_t t;
    mfd_key_t key;
    mfd_ns_acct_t *acct;     /* counted there (slot.size bytes) until committed or released */
    int durable;
    int in_arena;            /* the client writes the row itself (no payload) */
    mfd_slot_t slot;
} mfd_reservation_t;

/* A put region (PutRegionBegin): one GPU arena block holding n rows at the given offsets,
 * written by the client in place, waiting for PutRegionCommit. Owned by its connection. */
#define MFD_REGION_MAX_ROWS 65536u /* = MF_PUT_BATCH_MAX */
typedef struct mfd_region {
    mfd_ticket_t t;
    mfd_ns_acct_t *acct;     /* counted there (bytes) until committed or released */
    uint32_t arena;
    mfd_ablock_t *blk;       /* [off[0], off[0] + bytes) of the arena */
    uint64_t bytes;
    char model[MF_ROW_MAX_MODEL + 1];
    char ns[MFD_NS_MAX + 1]; /* the namespace it was begun in (its rows' keys) */
    uint32_t layer;
    uint32_t n;
    int caps;                /* len are capacities: the commit names the actual lengths */
    uint64_t *off, *len;     /* each row's arena offset and length (or capacity) */
} mfd_region_t;

/* The account of namespace ns (created on first use, one more reference); NULL on OOM. */
mfd_ns_acct_t *mfd_acct_get(mfd_server_t *s, const char *ns, size_t len);
void mfd_acct_put(mfd_server_t *s, mfd_ns_acct_t *a);

/* Takes r's bytes off its namespace's account (it is being committed or freed). */
void mfd_reservation_unaccount(mfd_reservation_t *r);
/* Unaccounts r, gives its block back to the store and frees it (not in the table). */
void mfd_reservation_free(mfd_server_t *s, mfd_reservation_t *r);

/* Unaccounts g, gives its block back to the store and frees it (not in the table). */
void mfd_region_free(mfd_server_t *s, mfd_region_t *g);

/* Drops leased row k of group l (release, expiry, disconnect). */
void mfd_lease_drop_row(mfd_server_t *s, mfd_lease_t *l, uint32_t k);

/* mfd_ticket_cb (arg = the server): removes a lease group or reservation and frees it. */
void mfd_ticket_release(mfd_ticket_t *t, void *arg);
/* mfd_ticket_cb for the expiry sweep: counts the expiry, then releases. */
void mfd_ticket_expire(mfd_ticket_t *t, void *arg);
/* A connection closes: its tickets and its namespace account go; returns the tickets. */
size_t mfd_lease_release_owner(mfd_server_t *s, mfd_conn_t *c);

#endif /* MFD_LEASE_H */
