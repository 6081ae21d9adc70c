/*
 * mf_clock — the one monotonic clock of every MapFlow process (daemon, library, tools,
 * tests): CLOCK_MONOTONIC as signed nanoseconds / microseconds / milliseconds (signed so
 * deadline arithmetic may go below zero), as seconds (latencies, rates), and as the
 * timespec of an absolute deadline for condition waits.
 *
 * Owns nothing. Thread safety: any thread (clock_gettime only).
 */
#ifndef MF_CLOCK_H
#define MF_CLOCK_H

#include <stdint.h>
#include <time.h>

static inline int64_t mf_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static inline int64_t mf_now_us(void) { return mf_now_ns() / 1000; }
static inline int64_t mf_now_ms(void) { return mf_now_ns() / 1000000; }
static inline double mf_now_s(void) { return (double)mf_now_ns() * 1e-9; }

/* The CLOCK_MONOTONIC instant ms (>= 0) from now as a timespec: the absolute deadline of
 * a pthread_cond_timedwait on a condition set to CLOCK_MONOTONIC (pthread_condattr_setclock). */
static inline struct timespec mf_timespec_after_ms(int64_t ms)
{
    int64_t now = mf_now_ns();
    struct timespec ts = {(time_t)(now / 1000000000 + ms / 1000),
                          (long)(now % 1000000000 + ms % 1000 * 1000000)};
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    return ts;
}

#endif /* MF_CLOCK_H */
