/*
 * mf_errf — the one helper that formats a reason into a caller's error buffer (err,
 * errlen), used by every module that reports "why" through such a buffer (proto, the
 * daemon's config, the client). Nothing is written when err is NULL or errlen is 0; the
 * text is truncated to the buffer (always NUL-terminated). Header-only (static inline):
 * proto, daemon and client each compile it in, and libmapflow exports nothing new.
 * Thread safety: any thread (writes only to err).
 */
#ifndef MF_ERRF_H
#define MF_ERRF_H

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>

static inline void mf_errf(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static inline void mf_errf(char *err, size_t errlen, const char *fmt, ...)
{
    if (!err || !errlen)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

#endif /* MF_ERRF_H */
