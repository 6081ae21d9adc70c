#!/usr/bin/env bash
# Container image recipe (deploy/docker/Dockerfile), checked offline: no Docker engine
# is needed (none exists in CI). deploy/tools/dockerfile_check.py compares the build
# stage's make steps with deploy/README.md and the runtime packages with the built
# binaries' DT_NEEDED libraries; broken copies must be rejected.
set -u
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
BIN_DIR=${MF_BIN:-$PWD/build/bin}
fail=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

bins=()
for b in mapflowd mapflowctl; do
  if [ -x "$BIN_DIR/$b" ]; then bins+=("$BIN_DIR/$b"); else echo "note: $BIN_DIR/$b not built; its libraries are not compared"; fi
done
if ! command -v readelf >/dev/null || ! command -v dpkg >/dev/null; then
  echo "note: readelf or dpkg missing; runtime libraries not compared"; bins=()
fi

echo "--- the Dockerfile as shipped"
libs=()
if [ ${#bins[@]} -gt 0 ]; then libs=(--needed-to "$tmp/needed.json"); fi
$PY deploy/tools/dockerfile_check.py "${libs[@]}" deploy/docker/Dockerfile deploy/README.md "${bins[@]}" || fail=1
# The broken copies reuse the binaries' package list (dpkg -S is slow).
[ ${#bins[@]} -gt 0 ] && libs=(--needed-from "$tmp/needed.json")

n=0; rejected=0
# reject WHICH(dockerfile|readme) SED_EXPR EXPECTED_MESSAGE_FRAGMENT
reject() {
  n=$((n + 1))
  cp deploy/docker/Dockerfile "$tmp/Dockerfile"; cp deploy/README.md "$tmp/README.md"
  local f="$tmp/Dockerfile"; [ "$1" = readme ] && f="$tmp/README.md"
  sed -i "$2" "$f"
  if cmp -s "$f" "$([ "$1" = readme ] && echo deploy/README.md || echo deploy/docker/Dockerfile)"; then
    echo "FAIL: mutation '$2' changed nothing"; fail=1; return
  fi
  out=$($PY deploy/tools/dockerfile_check.py "${libs[@]}" "$tmp/Dockerfile" "$tmp/README.md" 2>&1); rc=$?
  if [ $rc -ne 0 ] && grep -qF -- "$3" <<<"$out"; then
    rejected=$((rejected + 1)); echo "rejected as expected: $1 '$2' -> $(grep -F -- "$3" <<<"$out" | head -1)"
  else
    echo "FAIL: $1 '$2' not rejected with '$3' (rc=$rc)"; echo "$out" | tail -4; fail=1
  fi
}

echo "--- broken copies"
reject dockerfile 's/^RUN make deps$/RUN make depends/' 'build steps match the README'
reject dockerfile '/^RUN make$/d' 'build steps match the README'
reject readme 's/^sudo make install$/sudo make install-all/' 'build steps match the README'
reject readme 's/^<!-- build-steps -->$//' 'marker missing'
reject dockerfile 's/^USER 10001:10001$/USER root/' 'runtime USER is not root'
reject dockerfile 's/"mapflowctl", //' 'HEALTHCHECK runs mapflowctl health'
reject dockerfile 's/^FROM debian:12-slim AS runtime$/FROM ubuntu:24.04 AS runtime/' 'runtime stage FROM debian:12-slim'
reject dockerfile 's/ libxxhash0 / libxxhash0 libevent-dev /' 'no -dev packages or compilers'
reject dockerfile 's/^ARG MAPFLOW_VERSION=.*$/ARG MAPFLOW_VERSION/' 'no ARG MAPFLOW_VERSION=X.Y.Z'
reject dockerfile '/make -s version/d' 'no ARG MAPFLOW_VERSION + RUN comparing it'
reject dockerfile 's/image.version="$MAPFLOW_VERSION"/image.version="latest"/' 'LABEL org.opencontainers.image.version'
if [ ${#bins[@]} -gt 0 ]; then
  reject dockerfile 's/ libprotobuf-c1 / /' 'missing libprotobuf-c1'
  reject dockerfile 's/ libxxhash0 / libxxhash0 libcurl4 /' "unneeded: ['libcurl4']"
fi
# The image's HEALTHCHECK command against the real daemon running the sample config
# (the image's /etc/mapflowd.conf); a health check on a wrong socket must fail.
hc=$($PY -c 'import json, sys; sys.path.insert(0, "deploy/tools"); import dockerfile_check as d
st = d.stages(d.instructions(open("deploy/docker/Dockerfile").read()))
a = [a for k, a in st[-1]["instrs"] if k == "HEALTHCHECK"][-1]
print(a[a.index("CMD") + 3:].strip())')
conf=${MF_BUILD:-build}/deploy/mapflowd.conf
if [ -x "$BIN_DIR/mapflowd" ] && [ -x "$BIN_DIR/mapflowctl" ] && [ -s "$conf" ]; then
  echo "--- HEALTHCHECK $hc against a real mapflowd"
  $PY deploy/tools/daemon_check.py --mapflowd "$BIN_DIR/mapflowd" --config "$conf" \
    --health-cmd "$hc" --bin-dir "$BIN_DIR" || fail=1
  n=$((n + 1))
  bad=${hc//\/run\/mapflowd\/mapflowd.sock/\/nonexistent\/mapflowd.sock}
  if $PY deploy/tools/daemon_check.py --mapflowd "$BIN_DIR/mapflowd" --config "$conf" \
       --health-cmd "$bad" --bin-dir "$BIN_DIR" > "$tmp/hc.log" 2>&1; then
    echo "FAIL: a health check on /nonexistent/mapflowd.sock passed"; fail=1
  else rejected=$((rejected + 1)); echo "rejected as expected: $(grep -m1 FAIL "$tmp/hc.log")"; fi
else
  echo "FAIL: mapflowd, mapflowctl or $conf not built; HEALTHCHECK not run"; fail=1
fi
echo "docker negative cases: $rejected of $n rejected with the expected reason"
echo "note: no Docker engine here; the image itself is not built by make test"
[ $fail -eq 0 ] && [ $rejected -eq $n ]
