/*
 * rel_tool — the reliability driver (`build/bin/tests/rel_tool COMMAND ...`), run by
 * tests/integration/test_rel_*.sh and `make soak`:
 *
 *   crash     SIGKILL mapflowd at random points of a put/get load, restart, verify
 *   load      many concurrent clients doing mixed put / lookup / get / release
 *   fault-*   one injected fault each (arena, slow reader, half frame, disk full, corrupt)
 *   security  tokens, namespaces, wire bounds, a planted hash collision
 *   storage   damaged SSD databases, colliding blocks, a full SSD budget of durable rows
 *   admin-*   issue 22: the admin boundary, configured peers, connection bounds, names
 *
 * Every command prints `RESULT|id|what was tried|how|what happened` lines (the shell
 * turns them into tests/RELIABILITY.md rows) and exits 0 only when every check held.
 * Ownership: each command owns the connections and children it starts and ends them.
 * Thread safety: the helpers here are safe from any thread (check counting is atomic).
 */
#ifndef REL_TOOL_H
#define REL_TOOL_H

#include <stdatomic.h>
#include <sys/types.h>

#include "rel_wire.h"

extern atomic_int rel_failures;

/* Counts a failed check and prints it; returns cond. */
#define REL_CHECK(cond, ...) rel_check(!!(cond), __FILE__, __LINE__, __VA_ARGS__)
int rel_check(int ok, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* One row of tests/RELIABILITY.md. */
void rel_result(const char *id, const char *what, const char *how, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Value of --name in argv (NULL when absent) / as a number. */
const char *rel_opt(int argc, char **argv, const char *name, const char *dflt);
long rel_opt_l(int argc, char **argv, const char *name, long dflt);

/* Starts `bin --socket dir/d.sock --data_dir data --http "" extra...`; waits (bounded)
 * until a Hello on the socket succeeds. Returns the pid or -1. */
pid_t rel_spawn_daemon(const char *bin, const char *sock, const char *data,
                       const char *const *extra, const char *log);
/* The same command line, started only (no wait). Returns the pid or -1. */
pid_t rel_exec_daemon(const char *bin, const char *sock, const char *data,
                      const char *const *extra, const char *log);
/* Waits (bounded) for pid to exit: its exit status, 128 + signal, or -1 after SIGKILL
 * once timeout_ms passed. */
int rel_wait_exit(pid_t pid, int timeout_ms);
/* SIGKILL or SIGTERM + wait; returns the exit status (128 + signal when signalled). */
int rel_stop_daemon(pid_t pid, int sig);

/* Splitmix-style RNG for drivers (one state per thread). */
uint64_t rel_rand(uint64_t *s);

int rel_cmd_crash(int argc, char **argv);
int rel_cmd_load(int argc, char **argv);
int rel_cmd_fault(const char *which, int argc, char **argv);
int rel_cmd_security(int argc, char **argv);
int rel_cmd_storage(int argc, char **argv);
int rel_cmd_admin(const char *which, int argc, char **argv);

#endif /* REL_TOOL_H */
