#!/usr/bin/env bash
# Two GPUs on one host (device kind nvidia-h200-x2), one call: the mfu profile end to end at dp2, then the
# measurements beside it, most important first, each phase time-limited so the call ends inside 10 minutes.
#   device run (carry .whl):  OUT=$OUT bash scripts/gpu/h200x2_dp.sh
# Writes into $OUT: environment.txt, mfu-run.log and mfu-evidence.tar.gz (from h200_e2e.sh), log.txt,
# runs.tar.gz (every run's JSON, log and MPS manifest; refreshed after each phase) and prints a table last.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
cd "$(dirname "$0")/../.."
export OUT=${OUT:-/tmp/vh-x2}; mkdir -p "$OUT"
PY=${PY:-python3}
W=$(mktemp -d); LOG="$OUT/log.txt"; : >"$LOG"
T0=$SECONDS; BUDGET=${X2_BUDGET_S:-570}
RUN=(scripts/run_mfu_dist.py --device cuda --steps 13)
TR=($PY -m torch.distributed.run --standalone --nproc-per-node 2)

phase() {  # phase NAME LIMIT_S CMD...: time-limited, logged, never aborts; skipped when the budget is spent
    local name=$1 limit=$2; shift 2
    local left=$((BUDGET - (SECONDS - T0)))
    if (( left < 30 )); then echo "== $name skipped (budget)" | tee -a "$LOG"; return 0; fi
    (( limit > left )) && limit=$left
    local t0=$SECONDS
    if declare -F "$1" >/dev/null; then LIMIT=$limit "$@" >"$W/$name.log" 2>&1; else
        timeout "$limit" "$@" >"$W/$name.log" 2>&1; fi; local rc=$?
    echo "== $name rc=$rc $((SECONDS - t0))s" | tee -a "$LOG"
    grep -E "attention backend|\[train\] mfu|\[allreduce\]|replay|Error|error" "$W/$name.log" | tail -4 | tee -a "$LOG"
    tar -czf "$OUT/runs.tar.gz" -C "$W" . 2>/dev/null
    return $rc
}
pair() {  # pair NAME0 NAME1 MB0 MB1 REDUCTION: two dp1 runs at once, one per GPU
    CUDA_VISIBLE_DEVICES=0 timeout "$LIMIT" $PY "${RUN[@]}" --profile mfu-dense-1b-dp1 --reduction "$5" --compile --micro-batch "$3" \
        --out "$W/$1.json" >"$W/$1.run.log" 2>&1 & local p0=$!
    CUDA_VISIBLE_DEVICES=1 timeout "$LIMIT" $PY "${RUN[@]}" --profile mfu-dense-1b-dp1 --reduction "$5" --compile --micro-batch "$4" \
        --out "$W/$2.json" >"$W/$2.run.log" 2>&1 & local p1=$!
    wait $p0; local r0=$?; wait $p1; local r1=$?; cat "$W/$1.run.log" "$W/$2.run.log"; return $(( r0 | r1 ))
}
{ nvidia-smi topo -m; nvidia-smi --query-gpu=index,name,uuid,driver_version,clocks.sm,clocks.max.sm --format=csv
  $PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'gpus', torch.cuda.device_count(), 'nccl', torch.cuda.nccl.version())"
} >"$W/topology.txt" 2>&1; cat "$W/topology.txt" | tee -a "$LOG"

# 1. The mfu profile end to end (simulated market, real SSH/upload/MPS/GPUs): dp2 sweep mb 8+16, replay under MPS.
phase e2e 300 bash scripts/gpu/h200_e2e.sh mfu --max-minutes 30 --max-usd 3
# 2. dp1 baselines (both GPUs at once, one run each): zero2o mb 8 and mb 16.
phase dp1-zero2o 150 pair dp1-zero2o-mb8 dp1-zero2o-mb16 8 16 zero2o
# 3. PCIe mode (P2P off, Ring, Simple) against NVLink at dp2, zero2o mb 16.
phase dp2-zero2o-mb16-pcie 100 "${TR[@]}" "${RUN[@]}" --profile mfu-dense-1b-dp2 --reduction zero2o --compile --micro-batch 16 --nccl-pcie --out "$W/dp2-zero2o-mb16-pcie.json"
# 4. MPS under DP: the same dp2 fast run under our MPS daemon (both ranks attached, manifest), and all-reduce off/on.
phase dp2-zero2o-mb16-mps 110 $PY -m remote.mps --manifest "$W/mps-manifest-fast.json" -- "${TR[@]}" "${RUN[@]}" --profile mfu-dense-1b-dp2 --reduction zero2o --compile --micro-batch 16 --out "$W/dp2-zero2o-mb16-mps.json"
phase allreduce-off 60 "${TR[@]}" scripts/bench/bench_allreduce.py --label off --out "$W/allreduce-off.json"
phase allreduce-mps 60 $PY -m remote.mps --manifest "$W/mps-manifest-allreduce.json" -- "${TR[@]}" scripts/bench/bench_allreduce.py --label mps --out "$W/allreduce-mps.json"
# 5. Deterministic dp2 without MPS (zero2o, zero2): leaf roots vs each other and vs the e2e replay under MPS.
phase dp2-det-zero2o 100 "${TR[@]}" "${RUN[@]/13/6}" --profile mfu-dense-1b-dp2 --reduction zero2o --deterministic --out "$W/dp2-det-zero2o.json"
phase dp2-det-zero2 100 "${TR[@]}" "${RUN[@]/13/6}" --profile mfu-dense-1b-dp2 --reduction zero2 --deterministic --out "$W/dp2-det-zero2.json"
# 6. The other reductions at dp2 (zero2, ddp), mb 16.
phase dp2-zero2-mb16 100 "${TR[@]}" "${RUN[@]}" --profile mfu-dense-1b-dp2 --reduction zero2 --compile --micro-batch 16 --out "$W/dp2-zero2-mb16.json"
phase dp2-ddp-mb16 100 "${TR[@]}" "${RUN[@]}" --profile mfu-dense-1b-dp2 --reduction ddp --compile --micro-batch 16 --out "$W/dp2-ddp-mb16.json"
echo "total $((SECONDS - T0)) s" | tee -a "$LOG"
tar -xzf "$OUT/mfu-evidence.tar.gz" -C "$W" --wildcards '*/remote/*.json' 2>/dev/null
tar -czf "$OUT/runs.tar.gz" -C "$W" . 2>/dev/null
$PY scripts/gpu/dp2_report.py "$W" | tee "$OUT/table.txt"
