#!/usr/bin/env bash
# The MPS evidence run on a GPU host (the one script run there): the real daemon around two attached
# processes (manifest validated), fail-closed and SIGKILL-orphan checks, then the on/off benchmark.
# Never touches clocks, compute mode or persistence. Writes under $OUT (default .evidence/tmp/h200-mps).
set -u
OUT=${OUT:-.evidence/tmp/h200-mps}
PY=${PY:-python3}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
mkdir -p "$OUT"
exec > >(tee "$OUT/h200-mps.log") 2>&1
say() { echo; echo "== $(date +%T) $*"; }
mps_procs() { pgrep -af nvidia-cuda-mps || echo "(no nvidia-cuda-mps process)"; }

say host
nvidia-smi --query-gpu=name,uuid,driver_version,compute_mode --format=csv
if ! command -v nvidia-cuda-mps-control >/dev/null; then
  cand=$(find /usr/local/nvidia /usr/bin /usr/local/bin /opt -name nvidia-cuda-mps-control 2>/dev/null | head -1)
  [ -n "$cand" ] && export VH_MPS_CONTROL_BIN=$cand
fi
echo "control binary: $(command -v nvidia-cuda-mps-control || echo "${VH_MPS_CONTROL_BIN:-MISSING}")"
echo "CUDA_MPS_PIPE_DIRECTORY=${CUDA_MPS_PIPE_DIRECTORY:-unset}"; ls -la /tmp/nvidia-mps 2>&1 | head -5
mps_procs

say "1. wrapper around two attached processes (learner + helper)"
$PY -m remote.mps --manifest "$OUT/mps-manifest.json" --log-dir "$OUT/mps-logs" -- $PY -m remote.mps.demo
echo "wrapper rc=$?"
$PY -m remote.checks.mps "$OUT/mps-manifest.json"; echo "checker rc=$?"
echo "after stop:"; mps_procs

say "2. fail closed: CUDA used but attachment never proven -> expect rc 1"
$PY -m remote.mps --manifest /tmp/neg.json --log-dir /tmp/neg-logs -- $PY -m remote.mps.demo --no-attach
echo "wrapper rc=$? (expect 1)"
$PY -m remote.checks.mps /tmp/neg.json; echo "checker rc=$? (expect 1)"
mps_procs

say "3. SIGKILL of the wrapper -> the supervisor stops the daemon"
$PY -m remote.mps --log-dir /tmp/kill-logs -- $PY -m remote.mps.demo --hold-s 120 &
W=$!
for _ in $(seq 60); do [ -n "$(ls /tmp/kill-logs 2>/dev/null | grep supervisor)" ] && grep -q "NEW CLIENT" /tmp/kill-logs/control.log 2>/dev/null && break; sleep 0.5; done
sleep 4; echo "before kill:"; mps_procs
kill -9 "$W"
for _ in $(seq 60); do pgrep -f nvidia-cuda-mps >/dev/null || break; sleep 0.5; done
echo "after SIGKILL of wrapper $W:"; mps_procs
cat /tmp/kill-logs/supervisor-stop.json 2>/dev/null | head -40

say "4. benchmark (3 reps, interleaved, fresh daemon per rep)"
timeout -s INT 250 $PY scripts/bench/bench_mps.py --out "$OUT/bench-mps.json" --reps 3 --log-root /tmp/bench-logs
echo "bench rc=$?"
say end; mps_procs
