/* test_daemon_config — the config table: units, bad values, every key, files, sample. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "config.h"
#include "mf_parse.h"

static void test_units(void **state)
{
    (void)state;
    uint64_t v;
    assert_int_equal(mf_parse_size("512", &v), MF_OK);
    assert_int_equal(v, 512);
    assert_int_equal(mf_parse_size("4kb", &v), MF_OK);
    assert_int_equal(v, 4096);
    assert_int_equal(mf_parse_size("1.5GiB", &v), MF_OK);
    assert_int_equal(v, 1536ull << 20);
    assert_int_equal(mf_parse_size("2T", &v), MF_OK);
    assert_int_equal(v, 2ull << 40);
    assert_int_equal(mf_parse_size(" 64 mb ", &v), MF_OK);
    assert_int_equal(v, 64ull << 20);
    const char *bad[] = {"", "-1", "1xb", "mb", "1.5b", "99999999999tb", "1 2", "0x10", NULL};
    for (int i = 0; bad[i]; i++)
        assert_int_equal(mf_parse_size(bad[i], &v), MF_INVALID_ARGUMENT);
    assert_int_equal(mf_parse_duration_ms("30s", &v), MF_OK);
    assert_int_equal(v, 30000);
    assert_int_equal(mf_parse_duration_ms("250ms", &v), MF_OK);
    assert_int_equal(v, 250);
    assert_int_equal(mf_parse_duration_ms("2", &v), MF_OK); /* bare = seconds */
    assert_int_equal(v, 2000);
    assert_int_equal(mf_parse_duration_ms("1h", &v), MF_OK);
    assert_int_equal(v, 3600000);
    assert_int_equal(mf_parse_duration_ms("0.5ms", &v), MF_INVALID_ARGUMENT);
    assert_int_equal(mf_parse_duration_ms("5d", &v), MF_INVALID_ARGUMENT);
}

/* Every key: the default reads back, and set(get(x)) is a fixed point. */
static void test_every_key_round_trips(void **state)
{
    (void)state;
    mfd_config_t a, b;
    char err[MFD_CONFIG_ERRLEN], v1[4400], v2[4400];
    assert_int_equal(mfd_config_init(&a), MF_OK);
    assert_int_equal(mfd_config_init(&b), MF_OK);
    assert_true(mfd_config_count() >= 14);
    const char *must[] = {"socket", "data_dir", "http", "tcp", "token", "host_bytes",
                          "ssd_bytes", "gpu_bytes", "high_watermark", "low_watermark",
                          "write_through", "lease_ttl", "max_frame", "log_level", NULL};
    for (int i = 0; must[i]; i++)
        assert_true(mfd_config_is_live(must[i]) >= 0);
    for (size_t i = 0; i < mfd_config_count(); i++) {
        const char *k = mfd_config_key(i);
        assert_int_equal(mfd_config_get(&a, k, 0, v1, sizeof(v1)), MF_OK);
        assert_int_equal(mfd_config_set(&b, k, v1, 0, err, sizeof(err)), MF_OK);
        assert_int_equal(mfd_config_get(&b, k, 0, v2, sizeof(v2)), MF_OK);
        assert_string_equal(v1, v2);
    }
    assert_int_equal(a.host_bytes, 1ull << 30);
    assert_int_equal(a.lease_ttl_ms, 30000);
    assert_int_equal(a.write_through, MFD_WT_ASYNC);
    mfd_config_deinit(&a);
    mfd_config_deinit(&b);
}

static void test_bad_values(void **state)
{
    (void)state;
    mfd_config_t c;
    char err[MFD_CONFIG_ERRLEN];
    mfd_config_init(&c);
    struct {
        const char *k, *v;
        mf_status_t want;
    } cases[] = {
        {"nope", "1", MF_NOT_FOUND},
        {"host_bytes", "12q", MF_INVALID_ARGUMENT},
        {"host_bytes", "1kb", MF_INVALID_ARGUMENT},     /* below the 1 MiB floor */
        {"max_frame", "4gb", MF_INVALID_ARGUMENT},      /* above 1 GiB */
        {"high_watermark", "0", MF_INVALID_ARGUMENT},
        {"high_watermark", "1.01", MF_INVALID_ARGUMENT},
        {"low_watermark", "0.95", MF_INVALID_ARGUMENT}, /* above high (0.9) */
        {"write_through", "sometimes", MF_INVALID_ARGUMENT},
        {"log_level", "loud", MF_INVALID_ARGUMENT},
        {"http", "localhost", MF_INVALID_ARGUMENT},
        {"tcp", "127.0.0.1:70000", MF_INVALID_ARGUMENT},
        {"io_threads", "0", MF_INVALID_ARGUMENT},
        {"max_batch", "-3", MF_INVALID_ARGUMENT},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        err[0] = 0;
        assert_int_equal(mfd_config_set(&c, cases[i].k, cases[i].v, 0, err, sizeof(err)),
                         cases[i].want);
        assert_true(strlen(err) > 0);
    }
    /* The failed sets left the defaults alone. */
    assert_true(c.high_watermark == 0.9 && c.low_watermark == 0.8);
    /* Live-only refuses start-up keys. */
    assert_int_equal(mfd_config_set(&c, "socket", "/x", 1, err, sizeof(err)),
                     MF_FAILED_PRECONDITION);
    assert_int_equal(mfd_config_set(&c, "lease_ttl", "5s", 1, err, sizeof(err)), MF_OK);
    assert_int_equal(c.lease_ttl_ms, 5000);
    mfd_config_deinit(&c);
}

static void test_file_parsing(void **state)
{
    (void)state;
    mfd_config_t c;
    char err[MFD_CONFIG_ERRLEN];
    mfd_config_init(&c);
    const char *text = "# comment\n"
                       "  host_bytes   256mb   # trailing comment\n"
                       "\n"
                       "tcp \"\"\n"
                       "token s3cr#t\n"
                       "write_through sync\n";
    assert_int_equal(mfd_config_parse_text(&c, "t.conf", text, strlen(text), err, sizeof(err)),
                     MF_OK);
    assert_int_equal(c.host_bytes, 256ull << 20);
    assert_string_equal(c.tcp, "");
    assert_string_equal(c.token, "s3cr#t"); /* '#' inside a word is not a comment */
    assert_int_equal(c.write_through, MFD_WT_SYNC);
    char v[64];
    mfd_config_get(&c, "token", 1, v, sizeof(v));
    assert_string_equal(v, "***");
    const char *bad = "host_bytes 1gb\nbogus_key 3\n";
    assert_int_equal(mfd_config_parse_text(&c, "b.conf", bad, strlen(bad), err, sizeof(err)),
                     MF_INVALID_ARGUMENT);
    assert_non_null(strstr(err, "b.conf:2"));
    assert_non_null(strstr(err, "bogus_key"));
    mfd_config_deinit(&c);
}

/* The generated sample parses back to the defaults. */
static void test_sample_parses(void **state)
{
    (void)state;
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    mfd_config_print_sample(f);
    fclose(f);
    mfd_config_t a, b;
    char err[MFD_CONFIG_ERRLEN], v1[4400], v2[4400];
    mfd_config_init(&a);
    mfd_config_init(&b);
    assert_int_equal(mfd_config_parse_text(&a, "sample", buf, len, err, sizeof(err)), MF_OK);
    for (size_t i = 0; i < mfd_config_count(); i++) {
        const char *k = mfd_config_key(i);
        assert_non_null(strstr(buf, k));
        mfd_config_get(&a, k, 0, v1, sizeof(v1));
        mfd_config_get(&b, k, 0, v2, sizeof(v2));
        assert_string_equal(v1, v2);
    }
    free(buf);
    mfd_config_deinit(&a);
    mfd_config_deinit(&b);
}

/* Writes `text` to a fresh file of mode `mode`; returns its path (static buffer per slot). */
static const char *write_file(int slot, const char *text, size_t len, mode_t mode)
{
    static char paths[4][64];
    snprintf(paths[slot], sizeof(paths[slot]), "/tmp/mf-tokfile-%d-XXXXXX", slot);
    int fd = mkstemp(paths[slot]);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, len), (ssize_t)len);
    assert_int_equal(fchmod(fd, mode), 0);
    close(fd);
    return paths[slot];
}

static void random_token(char *out, size_t n)
{
    static const char abc[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_";
    for (size_t i = 0; i + 1 < n; i++)
        out[i] = abc[rand() % (int)(sizeof(abc) - 1)];
    out[n - 1] = 0;
}

/* token_file: first line (newline stripped), 0600 only, bounded, exclusive with token. */
static void test_token_file(void **state)
{
    (void)state;
    srand((unsigned)time(NULL) ^ (unsigned)getpid());
    mfd_config_t c;
    char err[MFD_CONFIG_ERRLEN], v[128], tok[49], text[128];
    assert_int_equal(mfd_config_init(&c), MF_OK);
    random_token(tok, sizeof(tok));
    int n = snprintf(text, sizeof(text), "%s\r\nsecond line ignored\n", tok);
    const char *good = write_file(0, text, (size_t)n, 0600);

    /* Good file: the token is the first line, get shows the path and a redacted token. */
    assert_int_equal(mfd_config_set(&c, "token_file", good, 0, err, sizeof(err)), MF_OK);
    assert_string_equal(c.token, tok);
    mfd_config_get(&c, "token", 1, v, sizeof(v));
    assert_string_equal(v, "***");
    mfd_config_get(&c, "token_file", 1, v, sizeof(v));
    assert_string_equal(v, good);
    assert_int_equal(mfd_config_is_live("token_file"), 1);

    /* Both keys set: an error naming both, in either order, and nothing changed. */
    err[0] = 0;
    assert_int_equal(mfd_config_set(&c, "token", "other", 0, err, sizeof(err)),
                     MF_INVALID_ARGUMENT);
    assert_non_null(strstr(err, "token and token_file"));
    assert_string_equal(c.token, tok);
    mfd_config_t d;
    mfd_config_init(&d);
    const char *both = "token literal\ntoken_file /nonexistent\n";
    assert_int_equal(mfd_config_parse_text(&d, "both.conf", both, strlen(both), err,
                                           sizeof(err)), MF_INVALID_ARGUMENT);
    assert_non_null(strstr(err, "both.conf:2"));
    assert_non_null(strstr(err, "token and token_file"));
    mfd_config_deinit(&d);

    /* A rotated file is re-read by setting the same path again (and by a reload's copy). */
    char tok2[33];
    random_token(tok2, sizeof(tok2));
    FILE *f = fopen(good, "w");
    assert_non_null(f);
    fprintf(f, "%s", tok2); /* no trailing newline */
    fclose(f);
    mfd_config_init(&d);
    assert_int_equal(mfd_config_set(&d, "token_file", good, 0, err, sizeof(err)), MF_OK);
    int changed = 0;
    assert_int_equal(mfd_config_take_token(&c, &d, &changed), MF_OK);
    assert_true(changed);
    assert_string_equal(c.token, tok2);
    mfd_config_deinit(&d);

    /* Loose permissions, a missing file, an empty first line, too big: clear errors, and the
     * token in effect stays. */
    const char *loose = write_file(1, text, (size_t)n, 0640);
    err[0] = 0;
    assert_int_equal(mfd_config_set(&c, "token_file", loose, 0, err, sizeof(err)),
                     MF_INVALID_ARGUMENT);
    assert_non_null(strstr(err, "group or others"));
    assert_non_null(strstr(err, "0640"));
    chmod(loose, 0604);
    assert_int_equal(mfd_config_set(&c, "token_file", loose, 0, err, sizeof(err)),
                     MF_INVALID_ARGUMENT);
    assert_int_equal(mfd_config_set(&c, "token_file", "/nonexistent/mf-token", 0, err,
                                    sizeof(err)), MF_INVALID_ARGUMENT);
    assert_non_null(strstr(err, "/nonexistent/mf-token"));
    assert_non_null(strstr(err, "No such file"));
    const char *empty = write_file(2, "\nx\n", 3, 0400);
    assert_int_equal(mfd_config_set(&c, "token_file", empty, 0, err, sizeof(err)),
                     MF_INVALID_ARGUMENT);
    assert_non_null(strstr(err, "empty"));
    static char big[4097];
    memset(big, 'k', sizeof(big));
    const char *huge = write_file(3, big, sizeof(big), 0600);
    assert_int_equal(mfd_config_set(&c, "token_file", huge, 0, err, sizeof(err)),
                     MF_INVALID_ARGUMENT);
    assert_non_null(strstr(err, "4096"));
    assert_string_equal(c.token, tok2);

    /* token_file "" drops the file's token; then token may be set. */
    assert_int_equal(mfd_config_set(&c, "token_file", "", 1, err, sizeof(err)), MF_OK);
    assert_string_equal(c.token, "");
    assert_int_equal(mfd_config_set(&c, "token", tok, 1, err, sizeof(err)), MF_OK);
    assert_int_equal(mfd_config_set(&c, "token_file", good, 1, err, sizeof(err)),
                     MF_INVALID_ARGUMENT);
    assert_non_null(strstr(err, "token and token_file"));
    assert_string_equal(c.token, tok);
    unlink(good);
    unlink(loose);
    unlink(empty);
    unlink(huge);
    mfd_config_deinit(&c);
}

/* peers: a list or a file; only exact listed host:port text is allowed; copies keep it. */
static void test_peers(void **state)
{
    (void)state;
    mfd_config_t c, d;
    char err[MFD_CONFIG_ERRLEN], a[40], b[40], text[256];
    assert_int_equal(mfd_config_init(&c), MF_OK);
    unsigned pa = 1024u + (unsigned)rand() % 60000u, pb = 1024u + (unsigned)rand() % 60000u;
    snprintf(a, sizeof(a), "10.1.%u.7:%u", pa % 250u, pa);
    snprintf(b, sizeof(b), "node-%u:%u", pb % 97u, pb);
    assert_int_equal(mfd_config_peer_allowed(&c, a), 0); /* default: none */
    snprintf(text, sizeof(text), "%s, %s", a, b);
    assert_int_equal(mfd_config_set(&c, "peers", text, 1, err, sizeof(err)), MF_OK);
    assert_int_equal(mfd_config_peer_allowed(&c, a), 1);
    assert_int_equal(mfd_config_peer_allowed(&c, b), 1);
    /* Prefixes, suffixes and near misses of listed addresses are not listed. */
    char near[96];
    snprintf(near, sizeof(near), "%s0", a);
    assert_int_equal(mfd_config_peer_allowed(&c, near), 0);
    assert_int_equal(mfd_config_peer_allowed(&c, a + 1), 0);
    assert_int_equal(mfd_config_peer_allowed(&c, ""), 0);
    snprintf(near, sizeof(near), "%s\n%s", a, b);
    assert_int_equal(mfd_config_peer_allowed(&c, near), 0);
    assert_int_equal(mfd_config_copy(&d, &c), MF_OK);
    assert_int_equal(mfd_config_peer_allowed(&d, b), 1);
    mfd_config_deinit(&d);
    /* A file: one per line, comments and blanks; then a bad entry keeps the old list. */
    int n = snprintf(text, sizeof(text), "# peers\n  %s  \n\n%s # rack 2\n", b, a);
    const char *f = write_file(3, text, (size_t)n, 0644);
    assert_int_equal(mfd_config_set(&c, "peers", f, 1, err, sizeof(err)), MF_OK);
    assert_int_equal(mfd_config_peer_allowed(&c, a), 1);
    assert_int_equal(mfd_config_peer_allowed(&c, b), 1);
    assert_int_equal(mfd_config_set(&c, "peers", a, 1, err, sizeof(err)), MF_OK);
    assert_int_equal(mfd_config_peer_allowed(&c, b), 0);
    assert_int_equal(mfd_config_set(&c, "peers", "nocolon", 1, err, sizeof(err)),
                     MF_INVALID_ARGUMENT);
    assert_non_null(strstr(err, "nocolon"));
    assert_int_equal(mfd_config_set(&c, "peers", "/nonexistent/peers", 1, err, sizeof(err)),
                     MF_INVALID_ARGUMENT);
    assert_int_equal(mfd_config_peer_allowed(&c, a), 1);
    unlink(f);
    mfd_config_deinit(&c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_units),
        cmocka_unit_test(test_every_key_round_trips),
        cmocka_unit_test(test_bad_values),
        cmocka_unit_test(test_file_parsing),
        cmocka_unit_test(test_sample_parses),
        cmocka_unit_test(test_token_file),
        cmocka_unit_test(test_peers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
