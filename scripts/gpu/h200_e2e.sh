#!/usr/bin/env bash
# A harness profile end to end on the lent H200, the marketplace simulated, everything else real: the
# simulator's host is this GPU machine, so SSH, upload, MPS, the GPU tests, the 1B rounds and replay, MPS
# stop, delete and the absence proof all run for real, through the same plan the profile runs on Vast.
# The harness's own dependencies travel as wheels in .whl/ (carried by the device tool); the workload uses
# the machine's PyTorch.
#
#   device run (carry .whl):  bash scripts/gpu/h200_e2e.sh proofs
#                             bash scripts/gpu/h200_e2e.sh mfu --num-gpus 1 --remote-env HT_MFU_WORLDS=1 ...
# Writes $OUT/<profile>-evidence.tar.gz (the run directory and ledger), the run log and the checker's verdict.
set -uo pipefail
cd "$(dirname "$0")/../.."
profile=${1:?usage: h200_e2e.sh PROFILE [vast_e2e flags...]}
shift
export PYTHONUNBUFFERED=1
out=${OUT:-/tmp/vh-out}
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/vh-site .whl/*.whl \
  || { echo "wheel install failed"; exit 1; }
export PYTHONPATH=/tmp/vh-site
ev=/tmp/vh-ev
rm -rf "$ev"
{
  date -u +%FT%TZ
  nvidia-smi --query-gpu=name,driver_version,uuid,clocks.sm,clocks.max.sm --format=csv
  python3 -c "import torch, paramiko, pydantic; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'paramiko', paramiko.__version__, 'pydantic', pydantic.VERSION)"
} 2>&1 | tee "$out/environment.txt"

start=$(date +%s.%N)
python3 scripts/vast_e2e.py --profile "$profile" --sim --evidence-dir "$ev" "$@" 2>&1 | tee "$out/$profile-run.log"
rc=${PIPESTATUS[0]}
end=$(date +%s.%N)
run=$(ls -d "$ev"/2*/ | tail -1)
echo "harness exit $rc, wall $(python3 -c "print(round($end-$start,1))") s, run dir $run" | tee -a "$out/$profile-run.log"
[ "$profile" = proofs ] && python3 scripts/check_gpu_evidence.py --kind proofs "$run" 2>&1 | tee -a "$out/$profile-run.log"
echo "MPS processes left (a <defunct> entry is an exited daemon not yet reaped by the container's init): $(pgrep -fa nvidia-cuda-mps | grep -v pgrep || echo none)" | tee -a "$out/$profile-run.log"
tar -czf "$out/$profile-evidence.tar.gz" -C "$ev" .
python3 - "$run" <<'PY' | tee -a "$out/$profile-run.log"
import json, sys
r = json.load(open(sys.argv[1] + "/harness-result.json"))
total = r["timings"]["total_s"]; work = r["timings"]["workload_steps_s"]
print(f"{'step':<16}{'rc':>4}{'seconds':>10}{'workload':>10}")
for s in r["steps"]:
    print(f"{s['name']:<16}{str(s['rc']):>4}{s['seconds']:>10.1f}{str(s['workload']):>10}")
print(f"total {total:.1f} s, workload steps {work:.1f} s, everything else {total-work:.1f} s "
      f"({100*(total-work)/total:.1f}% of the wall time; target < 10%)")
print("timings:", json.dumps(r["timings"]))
PY
exit "$rc"
