#!/usr/bin/env bash
# Activation checkpointing's memory on one lent GPU (issue 48): the 1B at world 1 with --act-ckpt, compiled and
# eager, micro-batch 8 and 12, kernels off (the memory model's bound: vast_harness/spec/memory.py) and one run
# with the default kernels; each record checked as mfu evidence. Run from the repo root:
#   OUT=/some/dir bash scripts/gpu/memory_ckpt.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:?set OUT to the output directory}
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
log="$OUT/memory-ckpt.log"
run() {  # tag, VH_KERNELS, extra flags
  local tag=$1 kernels=$2; shift 2
  echo "== $tag (VH_KERNELS=$kernels $*)" >>"$log"
  VH_KERNELS=$kernels timeout 200 torchrun --standalone --nproc-per-node 1 scripts/run_mfu_dist.py \
    --profile mfu-dense-1b-dp1 --device cuda --reduction zero2o --steps 6 --out "$OUT/mfu-$tag.json" "$@" >>"$log" 2>&1
  echo "rc $?" >>"$log"
  python3 scripts/check_gpu_evidence.py --kind mfu "$OUT/mfu-$tag.json" >>"$log" 2>&1
}
run ckpt-compile-mb8-nokernels none --act-ckpt --compile --micro-batch 8
run ckpt-compile-mb12-nokernels none --act-ckpt --compile --micro-batch 12
run ckpt-eager-mb8-nokernels none --act-ckpt --micro-batch 8
run ckpt-compile-mb8-kernels all --act-ckpt --compile --micro-batch 8
python3 - "$OUT" <<'PY' | tee -a "$log"
import json, pathlib, sys
for p in sorted(pathlib.Path(sys.argv[1]).glob("mfu-*.json")):
    d = json.loads(p.read_text())
    print(f"{p.name:<40} mb {d['micro_batch']:>3} mfu {d['mfu']:.4f} peak {max(d['rank_peak_mem_gib']):.2f} "
          f"step-peak {max(d.get('rank_step_peak_mem_gib') or [0]):.2f} GiB flags {d['flags']}")
PY
