#!/usr/bin/env bash
# The sample /etc/mapflowd.conf (build/deploy/mapflowd.conf, generated at build time):
# it is `mapflowd --print-config` with only the socket and data_dir lines set for the
# systemd unit, it names every key of `mapflowd --help`, it passes
# `mapflowd --check-config`, and broken copies do not.
set -u
cd "$(dirname "$0")/../.."
BUILD_DIR=${MF_BUILD:-build}
MAPFLOWD=${MF_BIN:-$PWD/build/bin}/mapflowd
CONF=$BUILD_DIR/deploy/mapflowd.conf
fail=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

[ -x "$MAPFLOWD" ] || { echo "FAIL: $MAPFLOWD not built"; exit 1; }
[ -s "$CONF" ] || { echo "FAIL: $CONF missing (make builds it from mapflowd --print-config)"; exit 1; }

"$MAPFLOWD" --print-config > "$tmp/printed" || { echo "FAIL: mapflowd --print-config exited $?"; exit 1; }
changed=$(diff "$tmp/printed" "$CONF" | grep '^[<>]' | sed 's/^[<>] //' | awk '{print $1}' | sort -u | tr '\n' ' ')
if [ "$changed" = "#data_dir #socket data_dir socket " ] || [ "$changed" = "data_dir socket " ]; then
  echo "sample = mapflowd --print-config except: $(grep -E '^(socket|data_dir) ' "$CONF" | tr '\n' ';')"
else
  echo "FAIL: $CONF differs from --print-config in more than socket/data_dir: [$changed]"; fail=1
fi
for want in "socket /run/mapflowd/mapflowd.sock" "data_dir /var/lib/mapflowd"; do
  grep -qx "$want" "$CONF" || { echo "FAIL: '$want' not set in $CONF"; fail=1; }
done

# Every key the daemon knows (--help lists them after "keys") is in the sample.
keys=$("$MAPFLOWD" --help 2>&1 | sed -n '/^keys/,$p' | grep -oE '^  --[a-z_]+ ' | sed 's/^  --//; s/ $//' | sort -u)
nkeys=0; missing=""
for k in $keys; do
  nkeys=$((nkeys + 1))
  grep -qE "^#?$k( |$)" "$CONF" || missing="$missing $k"
done
if [ "$nkeys" -lt 10 ]; then echo "FAIL: mapflowd --help listed only $nkeys keys"; fail=1
elif [ -n "$missing" ]; then echo "FAIL: keys missing from the sample:$missing"; fail=1
else echo "sample names all $nkeys keys of mapflowd --help"; fi

if ! "$MAPFLOWD" --help 2>&1 | grep -q -- '--check-config'; then
  echo "FAIL: mapflowd has no --check-config FILE yet (needed to validate the sample; the lead adds it)"
  exit 1
fi
if out=$("$MAPFLOWD" --check-config "$CONF" 2>&1); then
  echo "mapflowd --check-config $CONF: ok"
else
  echo "FAIL: mapflowd --check-config rejects the sample: $out"; fail=1
fi

n=0; rejected=0
reject() {   # LINE_TO_APPEND
  n=$((n + 1))
  { cat "$CONF"; printf '%s\n' "$1"; } > "$tmp/bad.conf"
  line=$(wc -l < "$tmp/bad.conf")
  out=$("$MAPFLOWD" --check-config "$tmp/bad.conf" 2>&1); rc=$?
  if [ $rc -ne 0 ] && [ $rc -lt 128 ] && grep -qE "(^|[^0-9])$line([^0-9]|$)" <<<"$out"; then
    rejected=$((rejected + 1)); echo "rejected as expected: '$1' -> $(head -1 <<<"$out")"
  else echo "FAIL: '$1' (line $line): rc=$rc, message without the line number: $out"; fail=1; fi
}
reject "host_bytes 12zb"
reject "no_such_key 1"
reject "low_watermark 0.95"
reject "write_through maybe"
reject "max_frame -1"
reject "lease_ttl 10 parsecs"
echo "config negative cases: $rejected of $n rejected with the line number"
[ $fail -eq 0 ] && [ $rejected -eq $n ]
