#!/usr/bin/env bash
# One version everywhere: client/mapflow.h's MF_VERSION_* (the one source; `make
# version`) = `mapflowd --version` = `mapflowctl --version` = libmapflow's file name =
# mapflowd_build_info{version} on a live daemon's /metrics = every image tag in deploy/
# (DaemonSet, example pod, kustomize images:, Dockerfile ARG, README) = CHANGELOG.md's
# newest release.
source "$(dirname "$0")/lib.sh"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
maj=$(sed -n 's/^#define MF_VERSION_MAJOR \([0-9]*\)$/\1/p' "$ROOT/client/mapflow.h")
min=$(sed -n 's/^#define MF_VERSION_MINOR \([0-9]*\)$/\1/p' "$ROOT/client/mapflow.h")
pat=$(sed -n 's/^#define MF_VERSION_PATCH \([0-9]*\)$/\1/p' "$ROOT/client/mapflow.h")
V=$maj.$min.$pat
[[ $V =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || fail "client/mapflow.h: no MF_VERSION_MAJOR/MINOR/PATCH ($V)"

expect_eq "$("$MAPFLOWD" --version | awk '{print $2}')" "$V" "mapflowd --version"
expect_eq "$("$CTL" --version | awk '{print $2}')" "$V" "mapflowctl --version"
LIBDIR=$(cd "$MF_BIN/../lib" && pwd)
[ -f "$LIBDIR/libmapflow.so.$V" ] || fail "no $LIBDIR/libmapflow.so.$V ($(ls "$LIBDIR" | grep so))"

mf_start --host_bytes 4mb
got=$(mf_http /metrics | sed -n 's/^mapflowd_build_info{version="\([^"]*\)".*} 1$/\1/p')
expect_eq "$got" "$V" "mapflowd_build_info version"
mf_stop

# Image tags: every registry.example.com/mapflow/mapflowd:TAG written in deploy/.
tags=$(grep -rhoE 'mapflow/mapflowd:[^ "$]+' "$ROOT/deploy" | sed 's/.*://' | sort -u)  # not $(make -s version)
[ -n "$tags" ] || fail "no image tag found under deploy/"
expect_eq "$tags" "$V" "image tags under deploy/"
expect_eq "$(sed -n 's/^ *newTag: *//p' "$ROOT/deploy/k8s/kustomization.yaml")" "$V" "kustomization images: newTag"
expect_eq "$(sed -n 's/^ARG MAPFLOW_VERSION=//p' "$ROOT/deploy/docker/Dockerfile")" "$V" "Dockerfile ARG MAPFLOW_VERSION"
expect_eq "$(grep -m1 -oE '^## \[?[0-9]+\.[0-9]+\.[0-9]+' "$ROOT/CHANGELOG.md" | tr -d '#[ ')" "$V" \
  "CHANGELOG.md's newest release"
echo "test_version: $V everywhere (mapflowd, mapflowctl, libmapflow.so.$V, build_info, image tags, CHANGELOG)"
