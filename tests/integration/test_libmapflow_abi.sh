#!/usr/bin/env bash
# libmapflow as users get it: SONAME and symlinks, only the API exported (no channel
# internals), and a program linked with -lmapflow alone (proto/ is inside the library)
# that hashes a prefix and gets UNAVAILABLE from a socket nobody listens on.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
LIBDIR=$(cd "$ROOT/${MF_BUILD:-build}/lib" && pwd)
TMP=$(mktemp -d /tmp/mfabi-XXXXXX)
trap 'rm -rf "$TMP"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

major=$(sed -n 's/^#define MF_VERSION_MAJOR \([0-9]*\)$/\1/p' "$ROOT/client/mapflow.h")
[ "$(readlink "$LIBDIR/libmapflow.so")" = "libmapflow.so.$major" ] || fail "libmapflow.so symlink"
readelf -d "$LIBDIR/libmapflow.so" | grep -q "SONAME.*\[libmapflow.so.$major\]" || fail "SONAME"
# Names without their version (mf_put@@MAPFLOW_0); the full list is checked against
# the headers by tests/python/test_abi_symbols.py.
syms=$(nm -D --defined-only "$LIBDIR/libmapflow.so" | awk '{sub(/@.*/, "", $3); print $3}')
for s in mf_channel_open mf_put mf_get_prefix mf_lookup mf_release mf_stats mf_health \
         mf_strerror mf_hash_prefix mf_row_decode mf_version; do
  grep -qx "$s" <<<"$syms" || fail "$s not exported"
done
if grep -E '^(mf__|do_call|send_iov|recv_reply|take_)' <<<"$syms"; then fail "internals exported"; fi

cat >"$TMP/p.c" <<'C'
#include <stdio.h>
#include <string.h>
#include "mapflow.h"
int main(void)
{
    uint32_t t[32];
    for (int i = 0; i < 32; i++) t[i] = 1000u + 7u * (uint32_t)i;
    mf_hash128_t h[2]; size_t n = 0;
    if (mf_hash_prefix("ns", "m", 16, t, 32, h, 2, &n) != MF_OK || n != 2) return 10;
    char hex[MF_HASH_HEX_LEN + 1]; mf_hash_to_hex(h[1], hex);
    mf_channel_t *ch = NULL;
    mf_status_t st = mf_channel_open("unix:/nonexistent/mapflowd.sock", NULL, &ch);
    printf("%s %s %s %s\n", mf_version(), hex, mf_status_name(st), mf_channel_last_error(ch));
    mf_channel_close(ch);
    return st == MF_UNAVAILABLE ? 0 : 11;
}
C
cc -std=c11 -Wall -Werror -I"$ROOT/client" -I"$ROOT/proto" "$TMP/p.c" -o "$TMP/p" \
  -L"$LIBDIR" -lmapflow || fail "cannot link with -lmapflow alone"
out=$(LD_LIBRARY_PATH=$LIBDIR "$TMP/p") || fail "program failed: $out"
echo "$out"
deps=$(ldd "$TMP/p")  # whole output first: grep -q under pipefail can SIGPIPE ldd
printf "%s\n" "$deps" | grep -q "libmapflow.so.$major" || fail "not linked against the shared library"
echo "test_libmapflow_abi: ok"
