/*
 * server — mapflowd as a whole (daemon.c): creates the tiers, binds the listeners, runs
 * one libevent loop until SIGTERM / SIGINT / mfd_server_stop, drains (durable SSD writes
 * finish, replies already made are written) and tears down. SIGHUP re-reads the config
 * file and applies changed live keys (the command line wins over the file); the tick
 * (250 ms) expires leases and reservations and enforces hello_timeout, idle_timeout and
 * frame_timeout. The layers below, top to bottom: dispatch.h (Hello, the request switch),
 * rows.h / admin.h / peer.h (requests), lease.h, listen.h, conn.h (connections and the
 * mfd_server_t every handler reaches), store.h (tiers); http.h renders through callbacks.
 *
 * Ownership: the server owns the config it was given, the store, every connection and
 * all tickets. Thread safety: everything runs on the loop thread; mfd_server_stop may
 * be called from any thread, even before mfd_server_run starts (it activates an event).
 */
#ifndef MFD_SERVER_H
#define MFD_SERVER_H

#include <stddef.h>
#include "config.h"
#include "conn.h"
#include "dispatch.h"

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

#endif /* MFD_SERVER_H */
