#!/usr/bin/env bash
# `make install-deploy` (run by `make install`) into temporary DESTDIRs: the unit, the
# sysusers entry and mapflowd.conf land where deploy/README.md says for
# PREFIX=/usr/local, PREFIX=/usr and PREFIX=/opt/mapflow (the config in PREFIX/etc, /etc
# only for /usr: nothing outside PREFIX), ExecStart follows PREFIX and SYSCONFDIR, no
# file contains DESTDIR, and an existing config is kept.
set -u
cd "$(dirname "$0")/../.."
BUILD_DIR=${MF_BUILD:-build}
PY=${PYTHON:-python3}
fail=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
[ -x "$BUILD_DIR/bin/mapflowd" ] || { echo "FAIL: $BUILD_DIR/bin/mapflowd not built"; exit 1; }

# A clean make of only this target: nothing of the outer make's state, nothing rebuilt
# on account of the daemon (-o), whatever other folders are doing meanwhile.
run_install() {   # DESTDIR PREFIX
  env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make --no-print-directory -o "$BUILD_DIR/bin/mapflowd" \
    BUILD="$BUILD_DIR" DESTDIR="$1" PREFIX="$2" install-deploy > "$tmp/make.log" 2>&1
  local rc=$?
  [ $rc -eq 0 ] || { echo "FAIL: make install-deploy DESTDIR=$1 PREFIX=$2 exited $rc"; cat "$tmp/make.log"; }
  return $rc
}

expect_file() {   # PATH MODE
  if [ ! -f "$1" ]; then echo "FAIL: $1 not installed"; fail=1; return 1; fi
  local m; m=$(stat -c %a "$1")
  [ "$m" = "$2" ] || { echo "FAIL: $1 mode $m, want $2"; fail=1; }
}

for prefix in /usr/local /usr /opt/mapflow; do
  d="$tmp/root${prefix//\//_}"
  run_install "$d" "$prefix" || { fail=1; continue; }
  sysroot=$prefix/lib; etc=$prefix/etc
  [ "$prefix" = /usr ] && { sysroot=/lib; etc=/etc; }
  unit="$d$sysroot/systemd/system/mapflowd.service"
  expect_file "$unit" 644
  expect_file "$d$sysroot/sysusers.d/mapflowd.conf" 644
  expect_file "$d$etc/mapflowd.conf" 644
  got=$(grep '^ExecStart=' "$unit" 2>/dev/null)
  [ "$got" = "ExecStart=$prefix/bin/mapflowd -c $etc/mapflowd.conf" ] || { echo "FAIL: PREFIX=$prefix: $got"; fail=1; }
  # Outside PREFIX only PREFIX=/usr may write: /etc and the merged-/usr /lib.
  outside=$(cd "$d" && find . -type f | sed 's|^\.||' | grep -v "^$prefix/" || true)
  [ "$prefix" = /usr ] && outside=$(grep -vx '/etc/mapflowd.conf\|/lib/systemd/system/mapflowd.service\|/lib/sysusers.d/mapflowd.conf' <<<"$outside" || true)
  [ -z "$outside" ] || { echo "FAIL: PREFIX=$prefix wrote outside PREFIX: $outside"; fail=1; }
  if grep -rlF "$tmp" "$d" >/dev/null; then echo "FAIL: DESTDIR written into $(grep -rlF "$tmp" "$d")"; fail=1; fi
  cmp -s "$d$etc/mapflowd.conf" "$BUILD_DIR/deploy/mapflowd.conf" || { echo "FAIL: installed config differs from $BUILD_DIR/deploy/mapflowd.conf"; fail=1; }
  $PY deploy/tools/unit_check.py "$unit" > /dev/null || fail=1
  n=$(find "$d" -type f | wc -l)
  [ "$n" -eq 3 ] || { echo "FAIL: PREFIX=$prefix installed $n files, want 3: $(find "$d" -type f)"; fail=1; }
  echo "PREFIX=$prefix: $n files under DESTDIR (unit at ${sysroot}/systemd/system, config in $etc, $got), no DESTDIR in contents"
done

# The admin's config survives a re-install; the unit is replaced.
d="$tmp/root_usr_local"
echo "host_bytes 3gb   # the admin's" >> "$d/usr/local/etc/mapflowd.conf"
sum=$(md5sum < "$d/usr/local/etc/mapflowd.conf")
echo "stale" > "$d/usr/local/lib/systemd/system/mapflowd.service"
if run_install "$d" /usr/local; then
  [ "$(md5sum < "$d/usr/local/etc/mapflowd.conf")" = "$sum" ] || { echo "FAIL: re-install overwrote /usr/local/etc/mapflowd.conf"; fail=1; }
  grep -q "keeping existing" "$tmp/make.log" || { echo "FAIL: re-install did not say it kept the config"; fail=1; }
  grep -q '^Type=notify$' "$d/usr/local/lib/systemd/system/mapflowd.service" || { echo "FAIL: unit not replaced"; fail=1; }
  echo "re-install: existing /usr/local/etc/mapflowd.conf kept, unit replaced"
else fail=1; fi

# The whole `make install` as the image's build stage runs it (PREFIX=/usr, a staging
# DESTDIR): the program the unit starts and the HEALTHCHECK's mapflowctl must be there,
# or the image (COPY --from=build /staging/usr/) has no daemon. Nothing is rebuilt (-o).
d="$tmp/staging"
if env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make --no-print-directory -o build-all \
     -o "$BUILD_DIR/bin/mapflowd" -o "$BUILD_DIR/bin/mapflowctl" \
     BUILD="$BUILD_DIR" DESTDIR="$d" PREFIX=/usr install > "$tmp/make.log" 2>&1; then
  exe=$(sed -n 's/^ExecStart=\([^ ]*\).*/\1/p' "$d/lib/systemd/system/mapflowd.service")
  missing=""
  for f in "$exe" /usr/bin/mapflowctl /etc/mapflowd.conf; do
    [ -x "$d$f" ] || [ "$f" = /etc/mapflowd.conf -a -f "$d$f" ] || missing="$missing $f"
  done
  if [ -n "$missing" ]; then
    echo "FAIL: make install PREFIX=/usr does not install:$missing (the unit's ExecStart and the"
    echo "      image's HEALTHCHECK need them; the top-level install rule must install the programs)"
    fail=1
  else
    echo "make install PREFIX=/usr DESTDIR=staging: $exe, /usr/bin/mapflowctl, /etc/mapflowd.conf present"
  fi
else
  echo "FAIL: make install PREFIX=/usr DESTDIR=staging failed:"; tail -5 "$tmp/make.log"; fail=1
fi
[ $fail -eq 0 ]
