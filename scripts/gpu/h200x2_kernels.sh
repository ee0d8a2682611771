#!/usr/bin/env bash
# Two H200s, after the kernels and the lazy parameter all-gather: dp1 vs dp2 (zero2o, zero2), NVLink vs PCIe
# mode, deterministic dp2 roots (zero2o == zero2, replay), then the mfu profile end to end again.
#   device run (kind nvidia-h200-x2, carry .whl):  OUT=$OUT bash scripts/gpu/h200x2_kernels.sh
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
cd "$(dirname "$0")/../.."
export OUT=${OUT:-/tmp/vh-x2k}; mkdir -p "$OUT"
PY=${PY:-python3}
W=$(mktemp -d); LOG="$OUT/log.txt"; : >"$LOG"
T0=$SECONDS; BUDGET=${X2_BUDGET_S:-500}
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
    grep -E "kernels active|\[train\] mfu|replay|Error|error" "$W/$name.log" | tail -4 | tee -a "$LOG"
    tar -czf "$OUT/runs.tar.gz" -C "$W" . 2>/dev/null
    return $rc
}
pair() {  # pair NAME0 NAME1 MB0 MB1: two dp1 zero2o runs at once, one per GPU
    CUDA_VISIBLE_DEVICES=0 timeout "$LIMIT" $PY "${RUN[@]}" --profile mfu-dense-1b-dp1 --reduction zero2o --compile \
        --micro-batch "$3" --out "$W/$1.json" >"$W/$1.run.log" 2>&1 & local p0=$!
    CUDA_VISIBLE_DEVICES=1 timeout "$LIMIT" $PY "${RUN[@]}" --profile mfu-dense-1b-dp1 --reduction zero2o --compile \
        --micro-batch "$4" --out "$W/$2.json" >"$W/$2.run.log" 2>&1 & local p1=$!
    wait $p0; local r0=$?; wait $p1; local r1=$?; cat "$W/$1.run.log" "$W/$2.run.log"; return $(( r0 | r1 ))
}
git log --oneline -1 >"$W/commit.txt" 2>/dev/null
phase dp1 150 pair k-dp1-zero2o-mb16 k-dp1-zero2o-mb24 16 24
phase dp2-zero2o-mb16 100 "${TR[@]}" "${RUN[@]}" --profile mfu-dense-1b-dp2 --reduction zero2o --compile --micro-batch 16 --out "$W/k-dp2-zero2o-mb16.json"
phase dp2-zero2o-mb16-pcie 100 "${TR[@]}" "${RUN[@]}" --profile mfu-dense-1b-dp2 --reduction zero2o --compile --micro-batch 16 --nccl-pcie --out "$W/k-dp2-zero2o-mb16-pcie.json"
phase dp2-zero2-mb16 100 "${TR[@]}" "${RUN[@]}" --profile mfu-dense-1b-dp2 --reduction zero2 --compile --micro-batch 16 --out "$W/k-dp2-zero2-mb16.json"
phase dp2-det-zero2o 100 "${TR[@]}" "${RUN[@]/13/6}" --profile mfu-dense-1b-dp2 --reduction zero2o --deterministic --replay --out "$W/k-dp2-det-zero2o.json"
phase dp2-det-zero2 100 "${TR[@]}" "${RUN[@]/13/6}" --profile mfu-dense-1b-dp2 --reduction zero2 --deterministic --out "$W/k-dp2-det-zero2.json"
phase e2e 200 bash scripts/gpu/h200_e2e.sh mfu --max-minutes 30 --max-usd 3
echo "total $((SECONDS - T0)) s" | tee -a "$LOG"
tar -xzf "$OUT/mfu-evidence.tar.gz" -C "$W" --wildcards '*/remote/*.json' 2>/dev/null
tar -czf "$OUT/runs.tar.gz" -C "$W" . 2>/dev/null
$PY scripts/gpu/dp2_report.py "$W" | tee "$OUT/table.txt"
