/*
 * admin — the admin requests (List, Stats, Evict, Flush, ConfigGet, ConfigSet, Health,
 * ProfilePut, ProfileGet, ProfileList) and Delete, each answering on the requesting connection.
 * Profiles are stored per namespace under (source, target) by profiles.c (the store's
 * SSD tier); with the SSD tier off they are refused (UNAVAILABLE).
 * ConfigSet, ProfilePut and Flush / Evict of every namespace reach these handlers only
 * from admin connections (dispatch.c refuses others PERMISSION_DENIED). Stats answers an
 * admin connection with the daemon's counters and tiers, a tenant with its namespace's
 * own (rows, bytes and leases; per tier its rows and bytes). Every other request acts
 * inside the connection's namespace only.
 *
 * Ownership: nothing outlives a request except a profile call (profiles.h owns its record
 * and job), whose context holds the connection until it replies.
 * Thread safety: loop thread only (the SSD job's completion runs on the loop too).
 */
#ifndef MFD_ADMIN_H
#define MFD_ADMIN_H

#include "conn.h"

void mfd_admin_list(mfd_conn_t *c, uint64_t rid, const Mapflow__V1__List *m);
void mfd_admin_stats(mfd_conn_t *c, uint64_t rid);
void mfd_admin_evict(mfd_conn_t *c, uint64_t rid, const Mapflow__V1__Evict *m);
void mfd_admin_flush(mfd_conn_t *c, uint64_t rid, const Mapflow__V1__Flush *m);
void mfd_admin_delete(mfd_conn_t *c, uint64_t rid, const Mapflow__V1__Delete *m);
void mfd_admin_config_get(mfd_conn_t *c, uint64_t rid, const Mapflow__V1__ConfigGet *m);
void mfd_admin_config_set(mfd_conn_t *c, uint64_t rid, const Mapflow__V1__ConfigSet *m);
void mfd_admin_health(mfd_conn_t *c, uint64_t rid);
void mfd_admin_profile_put(mfd_conn_t *c, uint64_t rid, const Mapflow__V1__ProfilePut *m);
void mfd_admin_profile_get(mfd_conn_t *c, uint64_t rid, const Mapflow__V1__ProfileGet *m);
/* Lists the connection's own namespace's profiles (an SSD scan on a worker, paged). */
void mfd_admin_profile_list(mfd_conn_t *c, uint64_t rid, const Mapflow__V1__ProfileList *m);

#endif /* MFD_ADMIN_H */
