/* lease — lease groups, reservations and namespace accounts (see lease.h). */
#include "lease.h"

#include <stdlib.h>
#include <string.h>

mfd_ns_acct_t *mfd_acct_get(mfd_server_t *s, const char *ns, size_t len)
{
    mfd_ns_acct_t *a;
    for (a = s->ns_accts; a; a = a->next)
        if (a->len == len && memcmp(a->ns, ns, len) == 0)
            break;
    if (!a && (a = calloc(1, sizeof(*a)))) {
        memcpy(a->ns, ns, len);
        a->len = len;
        a->next = s->ns_accts;
        s->ns_accts = a;
    }
    if (a)
        a->refs++;
    return a;
}

void mfd_acct_put(mfd_server_t *s, mfd_ns_acct_t *a)
{
    if (!a || --a->refs)
        return;
    for (mfd_ns_acct_t **pp = &s->ns_accts; *pp; pp = &(*pp)->next) {
        if (*pp == a) {
            *pp = a->next;
            break;
        }
    }
    free(a);
}

void mfd_reservation_unaccount(mfd_reservation_t *r)
{
    if (r->acct)
        r->acct->reserved -= r->slot.size;
    r->acct = NULL;
}

void mfd_reservation_free(mfd_server_t *s, mfd_reservation_t *r)
{
    mfd_reservation_unaccount(r);
    mfd_store_unplace(&s->store, &r->slot);
    free(r);
}

void mfd_region_free(mfd_server_t *s, mfd_region_t *g)
{
    if (g->acct)
        g->acct->reserved -= g->bytes;
    if (g->blk)
        mfd_store_unreserve_gpu(&s->store, g->arena, g->blk);
    free(g->off);
    free(g->len);
    free(g);
}

void mfd_lease_drop_row(mfd_server_t *s, mfd_lease_t *l, uint32_t k)
{
    mfd_entry_t *e = l->e[k];
    l->e[k] = NULL;
    l->live--;
    s->leased_rows--;
    e->leases--;
    mfd_index_unpin(s->store.ix, e);
}

void mfd_ticket_release(mfd_ticket_t *t, void *arg)
{
    mfd_server_t *s = arg;
    mfd_tickets_remove(s->tickets, t);
    if (t->kind == MFD_TICKET_LEASE) {
        mfd_lease_t *l = (mfd_lease_t *)t;
        for (uint32_t k = 0; k < l->n; k++)
            if (l->e[k])
                mfd_lease_drop_row(s, l, k);
        free(l);
    } else if (t->kind == MFD_TICKET_REGION) {
        mfd_region_free(s, (mfd_region_t *)t);
    } else {
        mfd_reservation_free(s, (mfd_reservation_t *)t);
    }
}

void mfd_ticket_expire(mfd_ticket_t *t, void *arg)
{
    mfd_server_t *s = arg;
    mfd_count(&s->metrics, t->kind == MFD_TICKET_LEASE ? MFD_C_LEASES_EXPIRED
                                                       : MFD_C_RESERVATIONS_EXPIRED,
              t->kind == MFD_TICKET_LEASE ? ((mfd_lease_t *)t)->live : 1);
    mfd_ticket_release(t, s);
}

size_t mfd_lease_release_owner(mfd_server_t *s, mfd_conn_t *c)
{
    size_t n = mfd_tickets_of_owner(s->tickets, c, mfd_ticket_release, s);
    mfd_acct_put(s, c->acct);
    c->acct = NULL;
    return n;
}
