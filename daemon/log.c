/* log — timestamped stderr lines, or priority-prefixed lines into the journal (see log.h). */
#include "log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static _Atomic int g_level = MFD_LOG_INFO;
static _Atomic int g_journal;
static const char *const level_names[] = {"error", "warn", "info", "debug"};

int mfd_log_init(void)
{
    /* systemd documents JOURNAL_STREAM as "DEV:INODE" of the stream it connected; a
     * redirected stderr (2>file) no longer matches and keeps timestamps. */
    const char *js = getenv("JOURNAL_STREAM");
    unsigned long long dev, ino;
    struct stat st;
    int on = js && sscanf(js, "%llu:%llu", &dev, &ino) == 2 && fstat(STDERR_FILENO, &st) == 0 &&
             (unsigned long long)st.st_dev == dev && (unsigned long long)st.st_ino == ino;
    atomic_store(&g_journal, on);
    return on;
}

int mfd_log_priority(mfd_log_level_t level)
{
    static const int prio[] = {3, 4, 6, 7}; /* LOG_ERR, LOG_WARNING, LOG_INFO, LOG_DEBUG */
    return level >= MFD_LOG_ERROR && level <= MFD_LOG_DEBUG ? prio[level] : 6;
}

void mfd_log_set_level(mfd_log_level_t level)
{
    atomic_store(&g_level, (int)level);
}

mfd_log_level_t mfd_log_get_level(void)
{
    return (mfd_log_level_t)atomic_load(&g_level);
}

mf_status_t mfd_log_parse_level(const char *s, mfd_log_level_t *out)
{
    for (int i = 0; i <= MFD_LOG_DEBUG; i++) {
        if (strcasecmp(s, level_names[i]) == 0) {
            *out = (mfd_log_level_t)i;
            return MF_OK;
        }
    }
    return MF_INVALID_ARGUMENT;
}

const char *mfd_log_level_name(mfd_log_level_t level)
{
    return (level >= MFD_LOG_ERROR && level <= MFD_LOG_DEBUG) ? level_names[level] : "?";
}

/* Control bytes from names a client chose (a "\n" would forge a line) become \xNN. */
static size_t escape_controls(const char *in, size_t n, char *out, size_t cap)
{
    static const char hex[] = "0123456789abcdef";
    size_t o = 0;
    for (size_t i = 0; i < n && o + 4 < cap; i++) {
        unsigned char ch = (unsigned char)in[i];
        if (ch >= 0x20 && ch != 0x7f) {
            out[o++] = (char)ch;
            continue;
        }
        out[o++] = '\\';
        out[o++] = 'x';
        out[o++] = hex[ch >> 4];
        out[o++] = hex[ch & 15];
    }
    return o;
}

void mfd_log(mfd_log_level_t level, const char *fmt, ...)
{
    if ((int)level > atomic_load(&g_level))
        return;
    char line[1200];
    static const char *const tags[] = {"ERROR", "WARN ", "INFO ", "DEBUG"};
    int n;
    if (atomic_load(&g_journal)) {
        n = snprintf(line, sizeof(line), "<%d>%s ", mfd_log_priority(level), tags[level]);
    } else {
        struct timespec ts;
        struct tm tm;
        clock_gettime(CLOCK_REALTIME, &ts);
        gmtime_r(&ts.tv_sec, &tm);
        n = snprintf(line, sizeof(line), "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %s ",
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
                     tm.tm_sec, ts.tv_nsec / 1000000, tags[level]);
    }
    char msg[1200];
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    size_t mlen = m < 0 ? 0 : (size_t)m < sizeof(msg) ? (size_t)m : sizeof(msg) - 1;
    size_t len = (size_t)n + escape_controls(msg, mlen, line + n, sizeof(line) - (size_t)n - 1);
    line[len++] = '\n';
    /* One write per line: lines from several threads stay whole. */
    ssize_t w = write(STDERR_FILENO, line, len);
    (void)w;
}

int mfd_log_limit_pass(mfd_log_limit_t *l, uint64_t now_ms, uint64_t interval_ms,
                       uint64_t *dropped)
{
    if (l->last_ms && now_ms - l->last_ms < interval_ms) {
        l->suppressed++;
        return 0;
    }
    *dropped = l->suppressed;
    l->last_ms = now_ms ? now_ms : 1; /* 0 means "never" */
    l->suppressed = 0;
    return 1;
}
