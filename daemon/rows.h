/*
 * rows — the data-path requests of a connection's namespace: PutBegin / PutCommit /
 * PutAbort (reservations, placement GPU → host with fallback, commit through the store),
 * Lookup (leading-block counts per layer), Get (GET_COPY and GET_LEASE, by keys or by
 * prefix, with the block-chain verification of DESIGN §4) and Release.
 *
 * Keys are always built under the connection's namespace, so other namespaces are
 * invisible. Bounds: max_batch (rows per Get), max_lookup (blocks hashed / probed per
 * request), max_frame (a copy reply; rows past it are OUT_OF_RANGE), reservation_share.
 * A Get or Lookup naming `peer` (config `peers` only, else PERMISSION_DENIED) goes to
 * peer.c, which calls back here once it is done; the Get then resumes its own operation.
 * SSD reads and synced writes answer later: the connection is held meanwhile.
 *
 * Ownership: each request's operation (get_op, commit_op) is owned here until it replies;
 * lease groups and reservations, once granted, belong to lease.c's tickets.
 * Thread safety: loop thread only.
 */
#ifndef MFD_ROWS_H
#define MFD_ROWS_H

#include <stddef.h>
#include <stdint.h>
#include "conn.h"

void mfd_rows_put_begin(mfd_conn_t *c, uint64_t rid, const Mapflow__V1__PutBegin *m);
/* t0: when the request was dispatched (mf_now_s), for the latency histograms. */
void mfd_rows_put_commit(mfd_conn_t *c, uint64_t rid, const Mapflow__V1__PutCommit *m,
                         const uint8_t *payload, size_t plen, double t0);
void mfd_rows_put_abort(mfd_conn_t *c, uint64_t rid, const Mapflow__V1__PutAbort *m);
/* Put regions (mapflow.proto PutRegionBegin): one GPU arena block for a layer's rows. */
void mfd_rows_region_begin(mfd_conn_t *c, uint64_t rid, const Mapflow__V1__PutRegionBegin *m);
void mfd_rows_region_commit(mfd_conn_t *c, uint64_t rid, const Mapflow__V1__PutRegionCommit *m,
                            double t0);
void mfd_rows_region_abort(mfd_conn_t *c, uint64_t rid, const Mapflow__V1__PutRegionAbort *m);
void mfd_rows_lookup(mfd_conn_t *c, uint64_t rid, const Mapflow__V1__Lookup *m,
                     const uint8_t *payload, size_t plen, double t0);
void mfd_rows_get(mfd_conn_t *c, uint64_t rid, const Mapflow__V1__Get *m,
                  const uint8_t *payload, size_t plen, double t0);
void mfd_rows_release(mfd_conn_t *c, uint64_t rid, const Mapflow__V1__Release *m);

#endif /* MFD_ROWS_H */
