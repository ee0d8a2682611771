#!/usr/bin/env bash
# The receipt on a lent GPU machine (issue 44): the driver's view first, then two receipts (the default 90 s
# budget, and a shorter one for the run-to-run spread), each checked as GPU evidence. Run from the repo root:
#   OUT=/some/dir TAG=h100 bash scripts/gpu/receipt.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:?set OUT to the output directory}
TAG=${TAG:-gpu}
export PYTHONUNBUFFERED=1
log="$OUT/receipt-$TAG.log"
{
  echo "== $(date -u +%FT%TZ) $TAG"
  nvidia-smi -L
  nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.max,pcie.link.width.max,clocks.max.sm,power.limit --format=csv
  nvidia-smi --help-query-gpu | grep -E '^"(clocks_event_reasons|clocks_throttle_reasons)\.active"|^"pcie\.link\.(gen|width)\.(current|max)"' || true
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0))'
} >"$log" 2>&1
for run in 1 2; do
  if [ "$run" = 1 ]; then args=(); else args=(--budget-s 60); fi
  start=$(date +%s.%N)
  python3 -m remote.receipt --out "$OUT/receipt-$TAG-$run.json" "${args[@]}" >>"$log" 2>&1
  rc=$?
  end=$(date +%s.%N)
  echo "run $run: rc $rc, wall $(python3 -c "print(round($end-$start,1))") s, args ${args[*]:-default}" | tee -a "$log"
  python3 scripts/check_gpu_evidence.py --kind receipt "$OUT/receipt-$TAG-$run.json" 2>&1 | tee -a "$log"
done
python3 - "$OUT" "$TAG" <<'PY' | tee -a "$log"
import json, sys, pathlib
out, tag = pathlib.Path(sys.argv[1]), sys.argv[2]
print(f"{'run':<4}{'gpu':<26}{'mm TF/s':>9}{'8192^3':>8}{'HBM GB/s':>10}{'h2d':>7}{'d2h':>7}{'gen/w':>7}{'burn med':>9}{'burn min':>9}{'clk MHz':>8}{'W':>6}{'wall s':>8}")
for run in (1, 2):
    p = out / f"receipt-{tag}-{run}.json"
    if not p.exists():
        print(run, "missing"); continue
    r = json.loads(p.read_text())
    for g in r["gpus"]:
        b, l = g.get("burn", {}), g.get("pcie_link", {})
        sq = g["matmul"]["shapes"][0].get("median")
        print(f"{run:<4}{g['name'][:25]:<26}{g['matmul']['tflops']!s:>9}{sq!s:>8}{g['hbm_copy'].get('median')!s:>10}"
              f"{g['h2d'].get('median')!s:>7}{g['d2h'].get('median')!s:>7}{str(l.get('gen_under_load'))+'x'+str(l.get('width_under_load')):>7}"
              f"{b.get('tflops_median')!s:>9}{b.get('tflops_min')!s:>9}{b.get('sm_clock_mhz_median')!s:>8}{b.get('power_w_median')!s:>6}{r['wall_s']:>8}")
        print("    reasons:", b.get("event_reasons_share"), "ecc:", g.get("ecc_after"), "remap:", g.get("remap"))
PY
