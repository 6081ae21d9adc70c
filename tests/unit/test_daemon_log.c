/* test_daemon_log — the log's rate limit (daemon/log.h mfd_log_limit_pass): one line per
 * interval whatever the event rate, every event in between counted and handed to the
 * next line, independent limits independent, and a clock starting at 0 still limits. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <cmocka.h>

#include "log.h"

static void test_limit_counts_what_it_drops(void **state)
{
    (void)state;
    mfd_log_limit_t a = {0}, b = {0};
    unsigned seed = 8123;
    uint64_t now = 1000 + (uint64_t)(rand_r(&seed) % 100000), dropped = 12345;
    assert_true(mfd_log_limit_pass(&a, now, 10000, &dropped));
    assert_int_equal(dropped, 0);
    /* Random bursts: within each 10 s window exactly one line, and it reports the events
     * dropped since the previous line. */
    uint64_t window_start = now, events = 0, lines = 1, reported = 0;
    for (int i = 0; i < 5000; i++) {
        now += (uint64_t)(rand_r(&seed) % 40); /* ~100 s in all */
        events++;
        if (mfd_log_limit_pass(&a, now, 10000, &dropped)) {
            assert_true(now - window_start >= 10000);
            window_start = now;
            lines++;
            reported += dropped;
        }
    }
    assert_true(lines >= 5 && lines <= 11);
    assert_int_equal(reported + (lines - 1) + a.suppressed, events);
    /* Another limit is not affected by a's state. */
    assert_true(mfd_log_limit_pass(&b, now, 10000, &dropped));
    assert_int_equal(dropped, 0);
    /* A clock at 0 (a fresh monotonic clock) still starts a window. */
    mfd_log_limit_t z = {0};
    assert_true(mfd_log_limit_pass(&z, 0, 10000, &dropped));
    assert_false(mfd_log_limit_pass(&z, 5, 10000, &dropped));
    assert_true(mfd_log_limit_pass(&z, 10001, 10000, &dropped));
    assert_int_equal(dropped, 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_limit_counts_what_it_drops),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
