#!/usr/bin/env bash
# systemd unit (deploy/systemd/mapflowd.service): the policy checker
# (deploy/tools/unit_check.py: Type=notify, LimitMEMLOCK=infinity, no PrivateDevices=yes,
# ...), broken copies it must reject, and `systemd-analyze verify` where systemd exists
# (skipped with a message where it does not), which must print nothing for the unit.
set -u
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
UNIT=deploy/systemd/mapflowd.service
BIN_DIR=${MF_BIN:-$PWD/build/bin}
SA=${SYSTEMD_ANALYZE:-systemd-analyze}   # override to exercise the skip path
fail=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

echo "--- policy"
$PY deploy/tools/unit_check.py "$UNIT" || fail=1

n=0; rejected=0
reject() {   # SED_EXPR EXPECTED_MESSAGE_FRAGMENT
  n=$((n + 1))
  sed "$1" "$UNIT" > "$tmp/mapflowd.service"
  if cmp -s "$tmp/mapflowd.service" "$UNIT"; then echo "FAIL: '$1' changed nothing"; fail=1; return; fi
  out=$($PY deploy/tools/unit_check.py "$tmp/mapflowd.service" 2>&1); rc=$?
  if [ $rc -ne 0 ] && grep -qF -- "$2" <<<"$out"; then
    rejected=$((rejected + 1)); echo "rejected as expected: '$1' -> $(grep -F -- "$2" <<<"$out" | head -1 | sed 's/.*FAIL //')"
  else echo "FAIL: '$1' not rejected with '$2' (rc=$rc)"; echo "$out" | tail -3; fail=1; fi
}
reject 's/^NoNewPrivileges=yes$/&\nPrivateDevices=yes/' 'no PrivateDevices=yes'
reject 's/^NoNewPrivileges=yes$/&\nPrivateDevices=true/' 'no PrivateDevices=yes'
reject 's/^Type=notify$/Type=simple/' 'Type=notify'
reject 's/^LimitMEMLOCK=infinity$/LimitMEMLOCK=64K/' 'LimitMEMLOCK=infinity'
reject '/^LimitMEMLOCK=/d' 'LimitMEMLOCK=infinity'
reject '/^ExecReload=/d' 'ExecReload sends SIGHUP'
reject 's/^User=mapflowd$/User=root/' 'dedicated User='
reject '/^RuntimeDirectory=/d' 'RuntimeDirectory=mapflowd'
reject '/^StateDirectory=/d' 'StateDirectory=mapflowd'
reject 's/^LimitNOFILE=.*/LimitNOFILE=1024/' 'LimitNOFILE>=4096'
reject 's/^\[Service\]$/Service/' "not 'Key=value' inside a [Section]"
echo "unit negative cases: $rejected of $n rejected with the expected reason"
[ $rejected -eq $n ] || fail=1

echo "--- systemd-analyze verify"
if ! command -v "$SA" >/dev/null 2>&1; then
  echo "SKIPPED: $SA not found (no systemd on this machine); policy checks above still ran"
else
  # verify wants ExecStart= to exist: point it at the built daemon (or /bin/true before
  # mapflowd is built). Warnings come back with exit 0, so any output about the unit fails.
  exe="$BIN_DIR/mapflowd"; [ -x "$exe" ] || { echo "note: $exe not built, verifying with /bin/true"; exe=/bin/true; }
  mkdir -p "$tmp/v"
  sed "s|^ExecStart=/usr/local/bin/mapflowd|ExecStart=$exe|" "$UNIT" > "$tmp/v/mapflowd.service"
  out=$("$SA" verify "$tmp/v/mapflowd.service" 2>&1); rc=$?
  if [ $rc -ne 0 ] || grep -q 'mapflowd.service' <<<"$out"; then
    echo "FAIL: systemd-analyze verify (rc=$rc):"; echo "$out"; fail=1
  else
    echo "systemd-analyze verify: clean ($("$SA" --version | head -1))"
  fi
  # The same verify must notice a misspelt key, or the clean result above means nothing.
  sed -i 's/^UMask=/UMaks=/' "$tmp/v/mapflowd.service"
  if "$SA" verify "$tmp/v/mapflowd.service" 2>&1 | grep -q "Unknown key 'UMaks'"; then
    echo "systemd-analyze verify: flags a misspelt key as expected"
  else echo "FAIL: systemd-analyze verify did not flag UMaks="; fail=1; fi
fi

# What Type=notify and ExecReload rely on, against the real daemon and the sample config.
echo "--- sd_notify protocol (this script plays systemd)"
conf=${MF_BUILD:-build}/deploy/mapflowd.conf
if [ -x "$BIN_DIR/mapflowd" ] && [ -s "$conf" ]; then
  $PY deploy/tools/daemon_check.py --mapflowd "$BIN_DIR/mapflowd" --config "$conf" --notify || fail=1
else
  echo "FAIL: $BIN_DIR/mapflowd or $conf not built"; fail=1
fi
[ $fail -eq 0 ]
