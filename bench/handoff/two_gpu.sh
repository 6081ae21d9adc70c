#!/usr/bin/env bash
# Issue 14 on two GPUs of one node (nvidia-h200-x2), one step of ≤ 300 s:
#   1. ipc_check --peer-device 1: rows put on GPU 0 read in place from GPU 1 through CUDA
#      IPC + peer access, bit-exact apply; peer-access status and GPU0→GPU1 bytes/s of
#      cudaMemcpyPeer in one process next to the copies from the IPC views (≤ 40 s);
#   2. ipc_check --target-visible 1: the target with GPU 0 hidden (staged host views, or
#      the hidden GPU's arena opened anyway — the log says which) (≤ 40 s);
#   3. the hand-off benchmark across GPUs (bench/handoff/run.sh, HANDOFF_TARGET_DEVICE=1,
#      N = 32k, prob_fp8; ≤ 200 s).
# Prints the GPU topology (NVLink or PCIe), each step's key lines, and the hand-off table
# last. Output in $OUT (4 files): two_gpu.md (what is printed last), handoff.json,
# topo.txt, logs.tar.xz (every log).
# Usage: bash bench/handoff/two_gpu.sh   (from any directory; binaries from build/ or
# .gpu-carry/bundle.tar.xz as in tests/gpu/all.sh). Env: HANDOFF_NS (32768), BUDGET (185,
# seconds for the hand-off script), any bench/handoff/run.sh variable.
# --dry (dev VM, to check the script): the hand-off step with --dry (fake CUDA driver with 2
# devices when build/lib/tests/libfakecuda.so exists); the ipc_check steps fail there.
# Exit status: non-zero if a step fails.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
out=${OUT:-/tmp/mf-2gpu-out}
mkdir -p "$out"
work=$(mktemp -d /tmp/mf-2gpu-XXXXXX)
trap 'rm -rf "$work"' EXIT
case ":${LD_LIBRARY_PATH:-}:" in
*"/.gpu-libs/"*) ;;
*) export LD_LIBRARY_PATH="$root/.gpu-libs/usr/lib/x86_64-linux-gnu:$root/.gpu-libs/usr/lib/x86_64-linux-gnu/ucx${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" ;;
esac
export PYTHONUNBUFFERED=1
dry=()
if [ "${1:-}" = --dry ]; then
    dry=(--dry)
    [ -f build/lib/tests/libfakecuda.so ] &&
        export HANDOFF_FAKECUDA=${HANDOFF_FAKECUDA:-$root/build/lib/tests/libfakecuda.so}
    export HANDOFF_NS=${HANDOFF_NS:-512}
elif [ -f .gpu-carry/bundle.tar.xz ]; then  # as all.sh: the carried binaries win
    tar -xJf .gpu-carry/bundle.tar.xz -C "$root" || { echo "bundle: unpack failed"; exit 2; }
fi

{ nvidia-smi --query-gpu=index,name,pci.bus_id,memory.total --format=csv,noheader
  nvidia-smi topo -m; nvidia-smi nvlink --status 2>&1 | head -n 40; } >"$work/topo.txt" 2>&1
cp "$work/topo.txt" "$out/topo.txt"
echo "==== GPUs and how they are linked (nvidia-smi topo -m: NV# = NVLink, PIX/PXB/PHB/NODE/SYS = PCIe)"
head -n 12 "$work/topo.txt"

step() { # name limit command...: runs with its own OUT, log in $work/NAME.log
    local name=$1 secs=$2
    shift 2
    mkdir -p "$work/$name"
    local t0=$SECONDS
    OUT="$work/$name" timeout -k 10 "$secs" "$@" >"$work/$name.log" 2>&1
    local rc=$?
    summary+=("$(printf '%-12s %4ss  exit %s%s' "$name" $((SECONDS - t0)) "$rc" \
        "$([ "$rc" = 124 ] && echo ' (time limit)')")")
    [ "$rc" = 0 ] || fail=1
}
summary=()
fail=0

echo "==== 1. ipc_check --peer-device 1"
IPC_ONLY=1 IPC_CHECK_ARGS="--peer-device 1" step ipc-peer 40 bash tests/gpu/run.sh
grep -aE "FAIL|arena|peer|bandwidth|ipc_check( target)?:|exit" "$work/ipc-peer.log" | head -n 30

echo "==== 2. ipc_check --target-visible 1 (GPU 0 hidden from the target)"
IPC_ONLY=1 IPC_CHECK_ARGS="--target-visible 1" step ipc-hidden 40 bash tests/gpu/run.sh
grep -aE "FAIL|arena|peer|device views|bandwidth|ipc_check( target)?:|exit" \
    "$work/ipc-hidden.log" | head -n 30

echo "==== 3. hand-off across GPUs (source GPU 0, target GPU 1; N = ${HANDOFF_NS:-32768})"
HANDOFF_TARGET_DEVICE=1 HANDOFF_NS=${HANDOFF_NS:-32768} BUDGET=${BUDGET:-185} \
    step handoff-2gpu 200 bash bench/handoff/run.sh "${dry[@]}"
grep -aE "^\[|Traceback|Error|mapflowd" "$work/handoff-2gpu.log" | grep -avE "^\|" | tail -n 25
cp "$work/handoff-2gpu/handoff.json" "$out/handoff.json" 2>/dev/null

{
    echo "## Two GPUs (issue 14): $(date -u +%FT%TZ)"
    echo
    echo "GPUs: $(head -n 2 "$work/topo.txt" | tr '\n' ';')"
    grep -aE "^GPU0|^GPU1" "$work/topo.txt" | head -n 2 | sed 's/^/topo: /'
    echo
    echo "ipc_check --peer-device 1:"
    grep -aE "arena [0-9]|peer access|peer bandwidth|^bandwidth|ipc_check( target)?:" \
        "$work/ipc-peer.log" | sed 's/^/    /'
    echo "ipc_check --target-visible 1:"
    grep -aE "arena [0-9]|device views|^peer|^bandwidth|ipc_check( target)?:" \
        "$work/ipc-hidden.log" | sed 's/^/    /'
    echo
    if [ -f "$work/handoff-2gpu/table.md" ]; then
        cat "$work/handoff-2gpu/table.md"
    else
        echo "hand-off: no table (see logs.tar.xz: handoff-2gpu.log)"
        tail -n 15 "$work/handoff-2gpu.log"
    fi
    echo
    echo "steps:"
    printf '    %s\n' "${summary[@]}"
} >"$out/two_gpu.md"
tar -cJf "$out/logs.tar.xz" -C "$work" . 2>/dev/null
echo
echo "==== table"
cat "$out/two_gpu.md"
exit $fail
