/*
 * dispatch — the top of a request's path: Hello (protocol version, namespace, token and
 * admin_token, the host arena's memfd over SCM_RIGHTS, GPU arena handles) and the switch
 * that hands every other request to rows.c, admin.c or peer.c.
 *
 * Rules: the first frame must be Hello (else FAILED_PRECONDITION and close); a request
 * this daemon does not serve gets UNIMPLEMENTED and the connection stays. Admin requests
 * (ConfigSet, ProfilePut, Flush / Evict of every namespace) need an admin connection —
 * the admin socket, or Hello.admin_token — and get PERMISSION_DENIED otherwise.
 * On the unix socket, Hello{want_host_arena} passes the whole host arena: anyone who can
 * open the socket can read and write it, so namespace isolation is enforced by this API,
 * not against a hostile local process — guard the socket's directory and group.
 *
 * Ownership: Hello binds the connection to its namespace (and takes the namespace's
 * reservation account, lease.h); nothing else is kept between requests here.
 * Thread safety: loop thread only.
 */
#ifndef MFD_DISPATCH_H
#define MFD_DISPATCH_H

#include <stddef.h>
#include <stdint.h>
#include "conn.h"

/* Handles one decoded request (an mfd_dispatch_fn; exported for in-process tests). */
void mfd_server_dispatch(mfd_conn_t *c, const mf_envelope_t *env, const uint8_t *payload,
                         size_t payload_len);

#endif /* MFD_DISPATCH_H */
