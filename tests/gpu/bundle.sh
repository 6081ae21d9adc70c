#!/usr/bin/env bash
# Packs what tests/gpu/all.sh needs on the GPU machine into .gpu-carry/bundle.tar.xz (git
# ignores it): the CUDA binaries are ~10 MB each unpacked, over the device tool's carry
# limit together, ~3x smaller compressed. Also makes .gpu-libs (the Debian runtime
# libraries the GPU machine lacks) when it is missing.
# Usage: tests/gpu/bundle.sh   (after `make -j2` with nvcc present; the test binaries it
# packs are (re)built here: `make` alone does not build them, and a stale one was shipped)
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
[ -d .gpu-libs ] || ../shared/tools/gpu-runtime-libs.sh .gpu-libs  # beside the checkout
for l in libcmocka.so.0 libevent_core-2.1.so.7; do
    [ -e ".gpu-libs/usr/lib/x86_64-linux-gnu/$l" ] || cp -L "/lib/x86_64-linux-gnu/$l" .gpu-libs/usr/lib/x86_64-linux-gnu/
done
files="build/bin/mapflowd build/bin/mapflowctl build/bin/mapflow-synth build/bin/mapflow-worker
  build/bin/tests/gpu_check build/bin/tests/ipc_check build/bin/tests/test_daemon_gpu
  build/lib/libmapflow.so build/lib/libmapflow.so.0 $(readlink -f build/lib/libmapflow.so.0 | sed "s|$root/||")
  build/lib/libmfkernels_cuda.so build/lib/libmfkernels_ref.so build/lib/tests .gpu-libs"
make -j2 --no-print-directory build/bin/tests/gpu_check build/bin/tests/ipc_check \
    build/bin/tests/test_daemon_gpu build/lib/tests/libfakecuda.so >/dev/null
for f in $files; do [ -e "$f" ] || { echo "bundle: $f missing (build it first)"; exit 2; }; done
mkdir -p .gpu-carry
grep -qx '/.gpu-carry/' .git/info/exclude 2>/dev/null || echo '/.gpu-carry/' >> .git/info/exclude
# shellcheck disable=SC2086
tar -cf - $files | xz -T2 -6 > .gpu-carry/bundle.tar.xz
ls -la .gpu-carry/bundle.tar.xz
