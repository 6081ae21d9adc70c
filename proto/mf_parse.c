/* mf_parse — the size and duration grammars (see mf_parse.h). */
#include "mf_parse.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define KB 1024ull
#define MB (1024ull * KB)
#define GB (1024ull * MB)
#define TB (1024ull * GB)

/* Splits "123unit" into a number and a lower-case unit; no sign, no garbage. */
static mf_status_t split_number(const char *s, double *num, char unit[8])
{
    while (isspace((unsigned char)*s))
        s++;
    if (!isdigit((unsigned char)*s) && *s != '.')
        return MF_INVALID_ARGUMENT;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || !isfinite(v) || v < 0)
        return MF_INVALID_ARGUMENT;
    for (const char *p = s; p < end; p++) /* plain decimals only: no hex, no exponent */
        if (!isdigit((unsigned char)*p) && *p != '.')
            return MF_INVALID_ARGUMENT;
    while (isspace((unsigned char)*end))
        end++;
    size_t n = 0;
    while (*end && !isspace((unsigned char)*end)) {
        if (n >= 7 || !isalpha((unsigned char)*end))
            return MF_INVALID_ARGUMENT;
        unit[n++] = (char)tolower((unsigned char)*end++);
    }
    unit[n] = 0;
    while (isspace((unsigned char)*end))
        end++;
    if (*end)
        return MF_INVALID_ARGUMENT;
    *num = v;
    return MF_OK;
}

mf_status_t mf_parse_size(const char *s, uint64_t *out)
{
    static const struct {
        const char *u;
        uint64_t mul;
    } units[] = {{"", 1},       {"b", 1},       {"k", KB},  {"kb", KB}, {"kib", KB},
                 {"m", MB},     {"mb", MB},     {"mib", MB}, {"g", GB}, {"gb", GB},
                 {"gib", GB},   {"t", TB},      {"tb", TB}, {"tib", TB}};
    double v;
    char unit[8];
    if (split_number(s, &v, unit) != MF_OK)
        return MF_INVALID_ARGUMENT;
    for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
        if (strcmp(unit, units[i].u) == 0) {
            double bytes = v * (double)units[i].mul;
            if (bytes >= 18446744073709551616.0 || bytes != floor(bytes))
                return MF_INVALID_ARGUMENT; /* overflow or a fraction of a byte */
            *out = (uint64_t)bytes;
            return MF_OK;
        }
    }
    return MF_INVALID_ARGUMENT;
}

mf_status_t mf_parse_duration_ms(const char *s, uint64_t *out)
{
    static const struct {
        const char *u;
        double mul;
    } units[] = {{"", 1000}, {"ms", 1}, {"s", 1000}, {"m", 60000}, {"h", 3600000}};
    double v;
    char unit[8];
    if (split_number(s, &v, unit) != MF_OK)
        return MF_INVALID_ARGUMENT;
    for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
        if (strcmp(unit, units[i].u) == 0) {
            double ms = v * units[i].mul;
            if (ms >= 1e15 || ms != floor(ms))
                return MF_INVALID_ARGUMENT;
            *out = (uint64_t)ms;
            return MF_OK;
        }
    }
    return MF_INVALID_ARGUMENT;
}
