#!/usr/bin/env bash
# GPU correctness on an H200 (or any sm_90 GPU): gpu_check against the C reference and
# float64 on fresh random inputs, then compute-sanitizer memcheck on the small case.
# Usage: tests/gpu/run.sh [gpu_check args]   (MF_BIN: build/bin by default)
# Exit status: non-zero if either step fails.
set -u
bin=${MF_BIN:-build/bin}
"$bin/tests/gpu_check" "$@"
rc=$?
san=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
if [ -n "$san" ]; then
    "$san" --tool memcheck --error-exitcode 3 --print-limit 20 "$bin/tests/gpu_check" --small \
        > "${OUT:-/tmp}/sanitizer.log" 2>&1
    src=$?
    tail -n 4 "${OUT:-/tmp}/sanitizer.log"
else
    echo "compute-sanitizer not found: memcheck skipped"
    src=0
fi
echo "gpu_check exit $rc, memcheck exit $src"
[ "$rc" = 0 ] && [ "$src" = 0 ]
