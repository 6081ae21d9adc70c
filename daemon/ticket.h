/*
 * ticket — tickets with an id, an owner and a deadline: read leases (a pin on an entry),
 * put reservations (an arena block waiting for its commit) and put regions (one GPU
 * arena block for a layer's rows). The server embeds an
 * mfd_ticket_t at the start of its lease / reservation structs.
 *
 * A ticket is found by id only together with its owner (the connection), so one
 * client can never release or commit another's. Expiry is a sweep over all tickets
 * (called from a loop timer); disconnect releases an owner's tickets the same way.
 *
 * Ownership: the table links tickets but never allocates or frees them: the callback
 * given to the sweep / owner walk removes and frees each one. Ids are never reused.
 * Thread safety: loop thread only.
 */
#ifndef MFD_TICKET_H
#define MFD_TICKET_H

#include <stddef.h>
#include <stdint.h>
#include "mf_clock.h"
#include "mf_status.h"

enum { MFD_TICKET_LEASE = 1, MFD_TICKET_RESERVATION = 2, MFD_TICKET_REGION = 3 };

typedef struct mfd_ticket {
    uint64_t id;
    uint64_t deadline_ms;
    void *owner;
    int kind;
    struct mfd_ticket *hnext, *prev, *next;
} mfd_ticket_t;

typedef struct mfd_tickets mfd_tickets_t;
typedef void (*mfd_ticket_cb)(mfd_ticket_t *t, void *arg);

mf_status_t mfd_tickets_create(mfd_tickets_t **out);
/* Caller must have emptied the table (mfd_tickets_all). */
void mfd_tickets_destroy(mfd_tickets_t *t);

/* Assigns t->id and links t. */
mf_status_t mfd_tickets_add(mfd_tickets_t *tab, mfd_ticket_t *t, int kind, void *owner,
                            uint64_t deadline_ms);
/* NULL unless a ticket of that id, kind and owner exists. */
mfd_ticket_t *mfd_tickets_find(mfd_tickets_t *tab, uint64_t id, int kind, void *owner);
void mfd_tickets_remove(mfd_tickets_t *tab, mfd_ticket_t *t);

/* cb for every ticket past its deadline / of that owner / at all; cb must remove it. */
size_t mfd_tickets_expire(mfd_tickets_t *tab, uint64_t now_ms, mfd_ticket_cb cb, void *arg);
size_t mfd_tickets_of_owner(mfd_tickets_t *tab, void *owner, mfd_ticket_cb cb, void *arg);
size_t mfd_tickets_all(mfd_tickets_t *tab, mfd_ticket_cb cb, void *arg);

size_t mfd_tickets_count(const mfd_tickets_t *tab, int kind);

#endif /* MFD_TICKET_H */
