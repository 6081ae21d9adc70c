#!/usr/bin/env bash
# Hand-off benchmark at real model shapes (issue 10) on one GPU, in one call: starts
# mapflowd (unix socket in a temp dir, GPU tier on when the Python binding can use it),
# runs bench/handoff/handoff.py (source → mapflowd → target against dense SDPA/cuDNN,
# FlexPrefill and pooled-QK-only on flex_attention, a density sweep at the largest N,
# sim.py's three workloads), stops the daemon and prints the tables last.
#   bench/handoff/run.sh [--dry] [handoff.py args]
# Output in $OUT (default bench/results/tmp/handoff): handoff.json, handoff.png, table.md,
# run.log, daemon.log.
# Env: HANDOFF_NS (N list, default 32768,16384,8192), HANDOFF_REPS (5), HANDOFF_DENSITY
# (0.10, the headline), HANDOFF_DENSITIES (the sweep at the largest N, default
# 0.05,0.10,0.20,0.35), HANDOFF_SWEEP_VARIANTS (mask), HANDOFF_TAU / HANDOFF_MIN_BUDGET
# (FlexPrefill's τ 0.1 / 1024), HANDOFF_L0 (2), HANDOFF_VARIANTS (prob_fp8,prob_u8log,mask),
# HANDOFF_PUT (inplace, the default: the fused exporter writes mask rows straight into a put
# region reserved by capacity | region: rows copied into an exact put region per layer | batch:
# put_device_batch), HANDOFF_ROWS_STREAM (1: the rows' kernels on a second stream; 0: in line),
# HANDOFF_O_FP32 (1: O in fp32 + a cast, for an A/B),
# HANDOFF_FLEX (1), HANDOFF_EXPORTER (extract | fused: the source's exported layers through
# mf_export_cuda, attention + rows in one pass; HANDOFF_QUALITY_JSON: the headline density from
# a bench/quality operating point),
# HANDOFF_PATH (auto|gpu|host), BUDGET (seconds for the whole run, default 290),
# HANDOFF_GPU_MB / HANDOFF_HOST_MB (daemon tiers), PYTHON, MAPFLOWD,
# HANDOFF_FAKECUDA (--dry only: a fake CUDA driver .so, e.g. build/lib/tests/libfakecuda.so,
# to run the GPU-tier path on the CPU).
# Two GPUs (issue 14): HANDOFF_TARGET_DEVICE=1 — mapflowd's GPU tier on GPU 0 only
# (gpu_devices 0), the source on GPU 0, the target in its own process on GPU 1 reading the
# rows in place through CUDA IPC + peer access, a second target process with
# CUDA_VISIBLE_DEVICES=1 for the staged fallback (HANDOFF_STAGED=0: not run); defaults
# then N = 32768, variant prob_fp8, no FlexPrefill-like, BUDGET 200, host tier 48 GiB
# (staged rows). --dry: FAKECUDA_DEVICES=2 unless set (FAKECUDA_NO_PEER=1: no peer access).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cd "$root"
out=${OUT:-$root/bench/results/tmp/handoff}
mkdir -p "$out"
exec > >(tee "$out/run.log") 2>&1
[ -d "$root/.gpu-libs" ] && export LD_LIBRARY_PATH="$root/.gpu-libs/usr/lib/x86_64-linux-gnu:$root/.gpu-libs/usr/lib/x86_64-linux-gnu/ucx:${LD_LIBRARY_PATH:-}"
dry=0
for a in "$@"; do [ "$a" = --dry ] && dry=1; done
py=${PYTHON:-python3}
if ! "$py" -c 'import torch, numpy' 2>/dev/null; then
    py=/usr/bin/python3   # Debian's python3-torch (CPU) on the dev VM
fi
export PYTHONPATH="$root/client/python:${PYTHONPATH:-}"
tdev=${HANDOFF_TARGET_DEVICE:-0}
budget=${BUDGET:-290}
devs=all
if [ "$tdev" != 0 ]; then
    budget=${BUDGET:-200}
    devs=0
    [ $dry = 1 ] && export FAKECUDA_DEVICES=${FAKECUDA_DEVICES:-2}
    export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
fi
mapflowd=${MAPFLOWD:-$root/build/bin/mapflowd}
need="$mapflowd build/lib/libmapflow.so.0"
if [ $dry = 1 ]; then need="$need build/lib/libmfkernels_ref.so"; else need="$need build/lib/libmfkernels_cuda.so"; fi
for f in $need; do [ -e "$f" ] || { echo "missing $f (build it first: make; make $f)"; exit 2; }; done

# Which put/get path can run: the GPU tier needs the binding's gpu_device / put_device.
gpu_api=$("$py" -c 'import inspect, mapflow
print(int("gpu_device" in inspect.signature(mapflow.Channel.__init__).parameters
          and hasattr(mapflow.Channel, "put_device")))' 2>/dev/null || echo 0)
path=${HANDOFF_PATH:-auto}
if [ $dry = 1 ]; then
    if [ -n "${HANDOFF_FAKECUDA:-}" ] && [ "$gpu_api" = 1 ]; then
        export MF_CUDA_DRIVER=$HANDOFF_FAKECUDA
        gpu_mb=${HANDOFF_GPU_MB:-256}; path=gpu
    else
        gpu_mb=0; path=host
    fi
    host_mb=${HANDOFF_HOST_MB:-1024}
    if [ $path = gpu ]; then row_mb=$((gpu_mb * 8 / 10)); else row_mb=$((host_mb * 8 / 10)); fi
elif [ "$path" = host ] || [ "$gpu_api" = 0 ]; then
    # host tier: rows of one variant at 32k (≈ 34 GB at 10 %) in the host arena, and
    # copied to the GPU by the target
    path=host
    gpu_mb=${HANDOFF_GPU_MB:-0}; host_mb=${HANDOFF_HOST_MB:-49152}
    row_mb=$((host_mb * 8 / 10))
else
    # GPU arena: one variant's rows (≈ 34 GB at 32k, 10 %) + slack; models ≈ 46 GB,
    # activations and the source's row scratch ≈ 15 GB: ≈ 117 GB of the H200's 141.
    # Eviction starts at the daemon's 0.9 high watermark: rows get 80 % of the arena
    # (prob mode on as many layers as fit, mask on the rest).
    gpu_mb=${HANDOFF_GPU_MB:-57344}; host_mb=${HANDOFF_HOST_MB:-8192}
    # two GPUs: the staged target holds one variant's rows (≈ 36 GB at 32k) in host blocks
    [ "$tdev" != 0 ] && [ "${HANDOFF_STAGED:-1}" != 0 ] && host_mb=${HANDOFF_HOST_MB:-49152}
    row_mb=$((gpu_mb * 8 / 10))
fi
export HANDOFF_ROW_BYTES=$((row_mb * 1048576))
echo "== handoff: binding GPU API $gpu_api, path $path, daemon gpu ${gpu_mb} MiB (devices $devs), host ${host_mb} MiB, rows ≤ ${row_mb} MiB, target device $tdev, python $py"

tmp=$(mktemp -d /tmp/mfhandoff-XXXXXX)
sock=$tmp/d.sock
dpid=
cleanup() {
    if [ -n "$dpid" ] && kill -0 "$dpid" 2>/dev/null; then
        kill -TERM "$dpid" 2>/dev/null || true
        for _ in $(seq 1 100); do kill -0 "$dpid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$dpid" 2>/dev/null || true
        wait "$dpid" 2>/dev/null || true
    fi
    rm -rf "$tmp"
}
trap cleanup EXIT
"$mapflowd" --socket "$sock" --data_dir "$tmp/data" --http 127.0.0.1:0 \
    --gpu_bytes "${gpu_mb}mb" --gpu_devices "$devs" --host_bytes "${host_mb}mb" --ssd_bytes 1gb \
    --write_through off --max_batch 65536 --lease_ttl 120s --reservation_ttl 120s \
    >"$out/daemon.log" 2>&1 &
dpid=$!
for _ in $(seq 1 600); do
    kill -0 "$dpid" 2>/dev/null || { echo "mapflowd exited:"; tail -n 30 "$out/daemon.log"; exit 1; }
    [ -S "$sock" ] && "$root/build/bin/mapflowctl" --socket "$sock" --timeout 1000 health \
        >/dev/null 2>&1 && break
    sleep 0.05
done
grep -aiE "tier|gpu|listening" "$out/daemon.log" | head -n 8 | sed 's/^/  mapflowd: /'
# How the daemon validates GPU rows (DtoH + CPU checksum, or on the GPU) bounds the put
# times: print its line when its log has one (at start, and again with the table).
validation() {
    grep -aiE "validat" "$out/daemon.log" | head -n 3 | sed 's/^/mapflowd validation: /' || true
}
validation

rc=0
# --dry also checks the routing simulation's known answers (CPU, ~1 s)
[ $dry = 1 ] && { "$py" "$here/sim.py" || exit 1; }
left=$((budget - SECONDS - 10))
HANDOFF_PATH=$path "$py" "$here/handoff.py" --socket "$sock" --out "$out" \
    --budget "$((left > 30 ? left : 30))" "$@" || rc=$?
kill -TERM "$dpid" 2>/dev/null || true
drc=0
wait "$dpid" || drc=$?
dpid=
echo "== mapflowd stopped (exit $drc); results in $out"
vl=$(validation)
[ -n "$vl" ] || vl="mapflowd validation: no validation line in daemon.log"
[ -f "$out/table.md" ] && { printf '%s\n' "$vl" >>"$out/table.md"; echo; cat "$out/table.md"; }
exit $rc
