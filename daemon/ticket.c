/* ticket — id/owner/deadline tickets for leases and reservations (see ticket.h). */
#include "ticket.h"

#include <stdlib.h>
#include <time.h>

#define N_BUCKETS 4096

struct mfd_tickets {
    mfd_ticket_t *buckets[N_BUCKETS];
    mfd_ticket_t *head;
    uint64_t next_id;
    size_t count[4];
};

mf_status_t mfd_tickets_create(mfd_tickets_t **out)
{
    mfd_tickets_t *t = calloc(1, sizeof(*t));
    if (!t)
        return MF_RESOURCE_EXHAUSTED;
    t->next_id = 1;
    *out = t;
    return MF_OK;
}

void mfd_tickets_destroy(mfd_tickets_t *t)
{
    free(t);
}

mf_status_t mfd_tickets_add(mfd_tickets_t *tab, mfd_ticket_t *t, int kind, void *owner,
                            uint64_t deadline_ms)
{
    t->id = tab->next_id++;
    t->kind = kind;
    t->owner = owner;
    t->deadline_ms = deadline_ms;
    mfd_ticket_t **b = &tab->buckets[t->id % N_BUCKETS];
    t->hnext = *b;
    *b = t;
    t->prev = NULL;
    t->next = tab->head;
    if (tab->head)
        tab->head->prev = t;
    tab->head = t;
    tab->count[kind]++;
    return MF_OK;
}

mfd_ticket_t *mfd_tickets_find(mfd_tickets_t *tab, uint64_t id, int kind, void *owner)
{
    for (mfd_ticket_t *t = tab->buckets[id % N_BUCKETS]; t; t = t->hnext)
        if (t->id == id)
            return t->kind == kind && t->owner == owner ? t : NULL;
    return NULL;
}

void mfd_tickets_remove(mfd_tickets_t *tab, mfd_ticket_t *t)
{
    mfd_ticket_t **pp = &tab->buckets[t->id % N_BUCKETS];
    while (*pp && *pp != t)
        pp = &(*pp)->hnext;
    if (!*pp)
        return;
    *pp = t->hnext;
    if (t->prev)
        t->prev->next = t->next;
    else
        tab->head = t->next;
    if (t->next)
        t->next->prev = t->prev;
    t->prev = t->next = t->hnext = NULL;
    tab->count[t->kind]--;
}

/* Walks the list; `next` is read before cb so cb may remove (and free) the ticket. */
static size_t walk(mfd_tickets_t *tab, int mode, uint64_t now, void *owner, mfd_ticket_cb cb,
                   void *arg)
{
    size_t n = 0;
    for (mfd_ticket_t *t = tab->head, *nx; t; t = nx) {
        nx = t->next;
        int hit = mode == 0 ? t->deadline_ms <= now : mode == 1 ? t->owner == owner : 1;
        if (hit) {
            cb(t, arg);
            n++;
        }
    }
    return n;
}

size_t mfd_tickets_expire(mfd_tickets_t *tab, uint64_t now_ms, mfd_ticket_cb cb, void *arg)
{
    return walk(tab, 0, now_ms, NULL, cb, arg);
}

size_t mfd_tickets_of_owner(mfd_tickets_t *tab, void *owner, mfd_ticket_cb cb, void *arg)
{
    return walk(tab, 1, 0, owner, cb, arg);
}

size_t mfd_tickets_all(mfd_tickets_t *tab, mfd_ticket_cb cb, void *arg)
{
    return walk(tab, 2, 0, NULL, cb, arg);
}

size_t mfd_tickets_count(const mfd_tickets_t *tab, int kind)
{
    return (kind >= 1 && kind <= 3) ? tab->count[kind] : 0;
}
