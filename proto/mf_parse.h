/*
 * mf_parse — the number grammars an operator types, one for mapflowd's config (file,
 * command line, `config set`) and mapflowctl's options, so both accept the same text.
 *
 *   size:     plain decimal, optional unit b, k/kb/kib, m/mb/mib, g/gb/gib, t/tb/tib
 *             (case-insensitive, powers of 1024, spaces around allowed): "512b", "1.5GiB"
 *   duration: plain decimal, optional unit ms, s, m, h; bare = seconds: "250ms", "30"
 *
 * No sign, hex or exponent; a fraction of a byte / millisecond or an overflow is
 * MF_INVALID_ARGUMENT. Ownership: none. Thread safety: pure functions, any thread.
 */
#ifndef MF_PARSE_H
#define MF_PARSE_H

#include <stdint.h>

#include "mf_status.h"

#ifdef __cplusplus
extern "C" {
#endif

mf_status_t mf_parse_size(const char *s, uint64_t *out);
mf_status_t mf_parse_duration_ms(const char *s, uint64_t *out);

#ifdef __cplusplus
}
#endif
#endif /* MF_PARSE_H */
