/*
 * mf_clock — the one monotonic clock of every MapFlow process (daemon, library, tools,
 * tests): CLOCK_MONOTONIC as signed nanoseconds / microseconds / milliseconds (signed so
 * deadline arithmetic may go below zero) and as seconds (latencies, rates).
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

#endif /* MF_CLOCK_H */
