/*
 * log — mapflowd's stderr logger: one line per event, "2025-01-02T03:04:05.678Z LEVEL msg".
 * When stderr is the systemd journal (JOURNAL_STREAM names stderr's device:inode, as
 * systemd sets it for StandardError=journal) a line is "<N>LEVEL msg" instead: the
 * sd-daemon(3) priority prefix (3 err, 4 warning, 6 info, 7 debug), so
 * `journalctl -p err` filters, and no timestamp (the journal keeps its own).
 *
 * The level is a process-wide atomic, so config set/SIGHUP may change it while the
 * SSD worker threads log. Each line is written with one write(2) so lines from
 * different threads never interleave. No allocation; messages longer than 1 KiB are cut.
 * Ownership: the level and the line format are the only state (process-wide); stderr is
 * the caller's.
 * Thread safety: mfd_log_init once from main before other threads start; every other
 * function may be called from any thread.
 */
#ifndef MFD_LOG_H
#define MFD_LOG_H

#include <stdint.h>
#include "mf_status.h"

typedef enum mfd_log_level {
    MFD_LOG_ERROR = 0,
    MFD_LOG_WARN = 1,
    MFD_LOG_INFO = 2,
    MFD_LOG_DEBUG = 3,
} mfd_log_level_t;

/* Picks the line format: journal (priority prefix) when JOURNAL_STREAM matches stderr,
 * else timestamped. Without a call lines are timestamped. Returns 1 for journal. */
int mfd_log_init(void);
/* The sd-daemon priority of a level: 3, 4, 6 or 7. */
int mfd_log_priority(mfd_log_level_t level);

void mfd_log_set_level(mfd_log_level_t level);
mfd_log_level_t mfd_log_get_level(void);
/* "error" | "warn" | "info" | "debug" → level; MF_INVALID_ARGUMENT otherwise. */
mf_status_t mfd_log_parse_level(const char *s, mfd_log_level_t *out);
const char *mfd_log_level_name(mfd_log_level_t level);

void mfd_log(mfd_log_level_t level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/*
 * A rate limit for one kind of line that a client (or the kernel) can repeat at will: at
 * most one line per interval, the events in between counted and reported with the next
 * line (an accept loop at the fd limit once wrote 18.8 M lines). The state is the
 * caller's, who serialises its use (the daemon's live on the loop thread).
 */
typedef struct mfd_log_limit {
    uint64_t last_ms;        /* when the last line went out (0: none yet) */
    uint64_t suppressed;     /* events since then that were not logged */
} mfd_log_limit_t;

/* 1: log this event now (*dropped = events not logged since the previous line, and the
 * count starts again); 0: counted, not logged. */
int mfd_log_limit_pass(mfd_log_limit_t *l, uint64_t now_ms, uint64_t interval_ms,
                       uint64_t *dropped);

#define mfd_error(...) mfd_log(MFD_LOG_ERROR, __VA_ARGS__)
#define mfd_warn(...)  mfd_log(MFD_LOG_WARN, __VA_ARGS__)
#define mfd_info(...)  mfd_log(MFD_LOG_INFO, __VA_ARGS__)
#define mfd_debug(...) mfd_log(MFD_LOG_DEBUG, __VA_ARGS__)

#endif /* MFD_LOG_H */
