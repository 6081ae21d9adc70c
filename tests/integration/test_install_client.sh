#!/usr/bin/env bash
# `make install-client` (run by `make install`) into temporary DESTDIRs for PREFIX=/usr/local
# and /usr: headers (self-contained), libmapflow.so.X.Y.Z with its SONAME links, the static
# library, mapflow.pc, mapflowctl and the Python binding land in place and no installed
# file contains DESTDIR. Then a tiny program is built against the installed library with
# `pkg-config --cflags --libs mapflow` (and once statically with --static) and run against
# a real daemon: health, an async call on a completion queue, a lookup; the installed
# mapflowctl answers --help / health, and the installed Python package imports.
source "$(dirname "$0")/lib.sh"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD_DIR=${MF_BUILD:-build}
cd "$ROOT"
major=$(sed -n 's/^#define MF_VERSION_MAJOR \([0-9]*\)$/\1/p' client/mapflow.h)
ver=$(sed -n 's/^#define MF_VERSION_STRING "\(.*\)"$/\1/p' client/mapflow.h)

run_install() { # DESTDIR PREFIX: only this target, nothing of the outer make's state
  env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make --no-print-directory BUILD="$BUILD_DIR" \
    -o "$BUILD_DIR/lib/libmapflow.so.$ver" -o "$BUILD_DIR/lib/libmapflow.a" \
    -o "$BUILD_DIR/bin/mapflowctl" DESTDIR="$1" PREFIX="$2" install-client \
    >"$MF_TMP/make.log" 2>&1 || { cat "$MF_TMP/make.log"; fail "make install-client DESTDIR=$1 PREFIX=$2"; }
}

for prefix in /usr/local /usr; do
  d=$MF_TMP/root${prefix//\//_}
  run_install "$d" "$prefix"
  for f in include/mapflow/mapflow.h include/mapflow/mf_status.h include/mapflow/mf_hash.h \
           include/mapflow/mf_row.h lib/libmapflow.so.$ver lib/libmapflow.a \
           lib/pkgconfig/mapflow.pc bin/mapflowctl lib/python3/dist-packages/mapflow/__init__.py; do
    [ -f "$d$prefix/$f" ] || fail "PREFIX=$prefix: $f not installed"
  done
  [ "$(readlink "$d$prefix/lib/libmapflow.so.$major")" = "libmapflow.so.$ver" ] || fail "SONAME link"
  [ "$(readlink "$d$prefix/lib/libmapflow.so")" = "libmapflow.so.$major" ] || fail "dev link"
  readelf -d "$d$prefix/lib/libmapflow.so.$ver" | grep -q "SONAME.*\[libmapflow.so.$major\]" \
    || fail "SONAME of the installed library"
  if grep -rlF "$MF_TMP" "$d" >/dev/null; then fail "DESTDIR written into $(grep -rlF "$MF_TMP" "$d")"; fi
  grep -qx "prefix=$prefix" "$d$prefix/lib/pkgconfig/mapflow.pc" || fail "mapflow.pc prefix"
  echo "PREFIX=$prefix: $(find "$d" -type f | wc -l) files, $(find "$d" -type l | wc -l) links, no DESTDIR in contents"
done

# Build against the /usr/local install as a user would, through pkg-config.
d=$MF_TMP/root_usr_local
export PKG_CONFIG_PATH=$d/usr/local/lib/pkgconfig PKG_CONFIG_SYSROOT_DIR=$d
expect_eq "$(pkg-config --modversion mapflow)" "$ver" "pkg-config --modversion"
cat >"$MF_TMP/p.c" <<'C'
#include <mapflow.h>
#include <stdio.h>
#include <string.h>
int main(int argc, char **argv)
{
    if (argc != 2) return 2;
    char target[512];
    snprintf(target, sizeof(target), "unix:%s", argv[1]);
    mf_channel_t *ch = NULL;
    mf_status_t st = mf_channel_open(target, NULL, &ch);
    if (st != MF_OK) { printf("open: %s %s\n", mf_status_name(st), mf_channel_last_error(ch)); return 3; }
    mf_cq_t *cq = NULL;
    mf_health_t h;
    mf_cq_event_t ev;
    int tag = 7;
    if (mf_cq_create(&cq) != MF_OK ||
        mf_health_async(ch, &h, 5000, cq, &tag, NULL) != MF_OK ||
        mf_cq_next(cq, 10000, &ev) != MF_CQ_CALL_DONE || ev.tag != &tag || ev.status != MF_OK || !h.ok)
        return 4;
    uint32_t tokens[64], layer = 1, blocks = 99, total = 0;
    for (int i = 0; i < 64; i++) tokens[i] = 100u + 3u * (uint32_t)i;
    st = mf_lookup(ch, "m", 16, tokens, 64, &layer, 1, &blocks, &total, MF_TIMEOUT_DEFAULT);
    printf("%s health=%s lookup=%s %u/%u\n", mf_version(), h.status, mf_status_name(st), blocks, total);
    mf_cq_shutdown(cq);
    mf_cq_destroy(cq);
    mf_channel_close(ch);
    return st == MF_OK && blocks == 0 && total == 4 ? 0 : 5;
}
C
# shellcheck disable=SC2046
cc -std=c11 -Wall -Werror "$MF_TMP/p.c" -o "$MF_TMP/p" $(pkg-config --cflags --libs mapflow) \
  || fail "cannot build against the installed library with pkg-config"
cc -std=c11 -Wall -Werror "$MF_TMP/p.c" -o "$MF_TMP/p-static" \
  $(pkg-config --cflags mapflow) $(pkg-config --static --libs mapflow | sed 's/-lmapflow/-l:libmapflow.a/') \
  || fail "cannot link the installed static library with pkg-config --static"
# ldd's output is taken whole first: `ldd | grep -q` under pipefail fails when grep exits
# before ldd has written everything (SIGPIPE).
deps=$(LD_LIBRARY_PATH=$d/usr/local/lib ldd "$MF_TMP/p")
grep -q "libmapflow.so.$major => $d/usr/local/lib/" <<<"$deps" || fail "not linked to the installed .so: $deps"
deps=$(ldd "$MF_TMP/p-static")
if grep -q libmapflow <<<"$deps"; then fail "static build still needs libmapflow.so"; fi

mf_start
out=$(LD_LIBRARY_PATH=$d/usr/local/lib "$MF_TMP/p" "$MF_SOCK") || fail "installed-library program: $out"
echo "$out"
expect_eq "${out%% *}" "$ver" "version reported by the program"
"$MF_TMP/p-static" "$MF_SOCK" >/dev/null || fail "static program"
"$d/usr/local/bin/mapflowctl" --help | grep -q "EXIT STATUS" || fail "installed mapflowctl --help"
"$d/usr/local/bin/mapflowctl" --socket "$MF_SOCK" health >/dev/null || fail "installed mapflowctl health"
MAPFLOW_LIB= LD_LIBRARY_PATH=$d/usr/local/lib PYTHONPATH=$d/usr/local/lib/python3/dist-packages \
  "$PYTHON" -c "
import mapflow, sys
assert mapflow.version() == '$ver', mapflow.version()
with mapflow.Channel('unix:' + sys.argv[1]) as ch:
    assert ch.health()['ok']
" "$MF_SOCK" || fail "installed Python binding"
mf_stop

# The kernel libraries (`make install-kernels-libs`, also run by `make install`): installed
# beside libmapflow, and mapflow.kernels loads the installed C reference (its argument
# structs checked against the library's layout) and runs a real call on random rows.
d=$MF_TMP/root_usr_local
env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make --no-print-directory BUILD="$BUILD_DIR" \
  -o "$BUILD_DIR/lib/libmfkernels_ref.so" -o "$BUILD_DIR/lib/libmfkernels_cuda.so" \
  DESTDIR="$d" PREFIX=/usr/local install-kernels-libs >"$MF_TMP/make.log" 2>&1 \
  || { cat "$MF_TMP/make.log"; fail "make install-kernels-libs"; }
for f in lib/libmfkernels_ref.so include/mapflow/mapflow_kernels.h; do
  [ -f "$d/usr/local/$f" ] || fail "install-kernels-libs: $f not installed"
done
if grep -rlF "$MF_TMP" "$d" >/dev/null; then fail "DESTDIR written into $(grep -rlF "$MF_TMP" "$d")"; fi
MAPFLOW_KERNELS_LIB=$d/usr/local/lib LD_LIBRARY_PATH=$d/usr/local/lib \
  PYTHONPATH=$d/usr/local/lib/python3/dist-packages "$PYTHON" -c "
import os, sys, numpy as np, mapflow.kernels as K
lib = K.library('ref')
assert os.path.dirname(lib._name) == sys.argv[1], lib._name
rng = np.random.default_rng()
n, hq, hkv, d = 48, 4, 2, 16
q, k, v = (rng.standard_normal((n, h, d)).astype(np.float32) for h in (hq, hkv, hkv))
o, lse = K.attention_dense_ref(q, k, v)
kk, vv = np.repeat(k, hq // hkv, 1).astype(np.float64), np.repeat(v, hq // hkv, 1).astype(np.float64)
s = np.einsum('qhd,khd->hqk', q.astype(np.float64), kk) / np.sqrt(d)
s[:, np.triu(np.ones((n, n), bool), 1)] = -np.inf
want = np.log(np.exp(s - s.max(-1, keepdims=True)).sum(-1)) + s.max(-1)
assert np.abs(lse - want).max() < 1e-9, np.abs(lse - want).max()
p = np.exp(s - want[..., None])
assert np.abs(o - np.einsum('hqk,khd->qhd', p, vv)).max() < 1e-9
" "$d/usr/local/lib" || fail "installed kernel library through mapflow.kernels"
echo "test_install_client: ok"
