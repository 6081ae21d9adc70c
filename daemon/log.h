/*
 * log — mapflowd's stderr logger: one line per event, "2025-01-02T03:04:05.678Z LEVEL msg".
 *
 * The level is a process-wide atomic, so config set/SIGHUP may change it while the
 * SSD worker threads log. Each line is written with one write(2) so lines from
 * different threads never interleave. No allocation; messages longer than 1 KiB are cut.
 * Thread safety: every function may be called from any thread.
 */
#ifndef MFD_LOG_H
#define MFD_LOG_H

#include "mf_status.h"

typedef enum mfd_log_level {
    MFD_LOG_ERROR = 0,
    MFD_LOG_WARN = 1,
    MFD_LOG_INFO = 2,
    MFD_LOG_DEBUG = 3,
} mfd_log_level_t;

void mfd_log_set_level(mfd_log_level_t level);
mfd_log_level_t mfd_log_get_level(void);
/* "error" | "warn" | "info" | "debug" → level; MF_INVALID_ARGUMENT otherwise. */
mf_status_t mfd_log_parse_level(const char *s, mfd_log_level_t *out);
const char *mfd_log_level_name(mfd_log_level_t level);

void mfd_log(mfd_log_level_t level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define mfd_error(...) mfd_log(MFD_LOG_ERROR, __VA_ARGS__)
#define mfd_warn(...)  mfd_log(MFD_LOG_WARN, __VA_ARGS__)
#define mfd_info(...)  mfd_log(MFD_LOG_INFO, __VA_ARGS__)
#define mfd_debug(...) mfd_log(MFD_LOG_DEBUG, __VA_ARGS__)

#endif /* MFD_LOG_H */
