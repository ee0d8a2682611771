#!/usr/bin/env bash
# Issue 24 on one H200 (GPU 0), one call of at most ~9.5 minutes: the kernel checks (each kernel against its
# torch reference, plus cudnn-det attention against fp64 math SDPA, and the attention paths timed), then
# scripts/bench_vs_reference.py at mb 16 (ours with the profile's settings, ours deterministic + replay, HF
# per-layer / whole-model compile, HF + Liger per-layer / whole-model), then extra runs named in H200_EXTRA.
#   OUT=dir bash scripts/h200_vs_reference.sh   (PY=python3; H200_STEPS=13, H200_BUDGET_S=540,
#       H200_RUNS=bench runs, H200_EXTRA="name|ENV=..|flags;..." extra run_mfu_dist runs, each limited to
#       H200_EXTRA_LIMIT_S=150, H200_SKIP=phases)
# Wheels (liger-kernel, nvidia-cudnn-frontend) are installed from .whl/ when it exists (the device README's
# carried-wheel recipe). Writes into $OUT: log.txt, kernels-check.json, bench-vs-reference.json, runs.json,
# extra.tar.gz (every run's JSON and log), and prints a short table last.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export CUDA_VISIBLE_DEVICES=0
cd "$(dirname "$0")/.."
OUT=${OUT:-.evidence/h200-vs-reference}; mkdir -p "$OUT"
PY=${PY:-python3}
STEPS=${H200_STEPS:-13}; SKIP=${H200_SKIP:-}; BUDGET=${H200_BUDGET_S:-540}
RUNS=${H200_RUNS:-ours,deterministic,hf-layer,hf-model,hf+liger-layer,hf+liger-model}
WORK=$(mktemp -d); LOG="$OUT/log.txt"; : >"$LOG"
T0=$SECONDS
WHEELS=$(ls ../.whl/*.whl .whl/*.whl 2>/dev/null | head -8)
if [ -n "$WHEELS" ]; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $WHEELS \
        >>"$LOG" 2>&1 && export PYTHONPATH=/tmp/site
fi
echo "wheels: $(echo $WHEELS | xargs -n1 basename 2>/dev/null | tr '\n' ' ')" | tee -a "$LOG"

phase() {  # phase NAME LIMIT_S CMD...: time-limited (by LIMIT_S and the budget left), logged, never aborts
    local name=$1 limit=$2; shift 2
    if [[ " $SKIP " == *" $name "* ]]; then echo "== $name skipped" | tee -a "$LOG"; return 0; fi
    local left=$((BUDGET - (SECONDS - T0) - 15))
    if ((left < 30)); then echo "== $name not run: budget spent" | tee -a "$LOG"; return 124; fi
    ((limit > left)) && limit=$left
    local t0=$SECONDS
    timeout "$limit" "$@" >"$WORK/$name.log" 2>&1; local rc=$?
    echo "== $name rc=$rc $((SECONDS - t0))s (limit ${limit}s)" | tee -a "$LOG"
    grep -E "\[bench\]|\[train\] mfu|\[train\] attention|\[check\] [0-9]|FAIL|Error|error:" "$WORK/$name.log" \
        | tail -12 | tee -a "$LOG"
    return $rc
}

nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm,power.draw,driver_version --format=csv >>"$LOG" 2>&1
$PY -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cudnn', torch.backends.cudnn.version())" 2>&1 | tee -a "$LOG"
phase check 110 $PY -m remote.kernels.check --out "$OUT/kernels-check.json"
mkdir -p "$WORK/bench"
phase bench 440 $PY scripts/bench_vs_reference.py --micro-batch 16 --steps "$STEPS" --runs "$RUNS" \
    --timeout-s 130 --work "$WORK/bench" --out "$OUT/bench-vs-reference.json"
# extra runs: "name|ENV=V ENV2=V2|flags", separated by ';'
IFS=';' read -ra EXTRA <<<"${H200_EXTRA:-}"
for spec in "${EXTRA[@]}"; do
    [ -z "$spec" ] && continue
    IFS='|' read -r name envs flags <<<"$spec"
    [[ $name == prof* ]] && envs="$envs VH_TORCH_PROFILE_OUT=$WORK/bench/$name-profile.txt"
    phase "x-$name" "${H200_EXTRA_LIMIT_S:-150}" env $envs $PY scripts/run_mfu_dist.py --profile mfu-dense-1b-dp1 --device cuda \
        --reduction zero2o --compile --micro-batch 16 --steps "$STEPS" --out "$WORK/bench/mfu-x-$name.json" $flags
done
files=$(ls "$WORK"/bench/mfu-*.json "$OUT"/bench-vs-reference.json 2>/dev/null)
[ -n "$files" ] && phase evidence-check 40 $PY scripts/check_gpu_evidence.py --kind mfu $files
echo "== total $((SECONDS - T0))s" | tee -a "$LOG"
$PY - "$WORK/bench" "$OUT" <<'PY' | tee -a "$LOG"
import json, pathlib, sys
work, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
rows = []
for p in sorted(work.glob("mfu-*.json")):
    d = json.loads(p.read_text())
    k = d.get("kernels", {})
    rows.append({"run": p.stem[4:], "mb": d["micro_batch"], "mfu": d["mfu"], "tokens_per_s": d["tokens_per_s"],
                 "peak_mem_gib": max(d["rank_peak_mem_gib"]), "replay": d.get("replay_match", "-"),
                 "attention": d["attention_backend"], "ce_chunk": k.get("ce_chunk_tokens"),
                 "env": k.get("env", {}), "step_ms": sorted(d["step_times_s"])[len(d["step_times_s"]) // 2] * 1e3})
(out / "runs.json").write_text(json.dumps(rows, indent=1) + "\n")
c = out / "kernels-check.json"
if c.exists():
    c = json.loads(c.read_text())
    bad = [x["name"] for x in c["checks"] if not x["ok"]]
    print(f"kernel checks: {len(c['checks']) - len(bad)}/{len(c['checks'])} ok" + (f"; FAILED {bad}" if bad else ""))
    for t in c["timings"]:
        if "attention" in t["name"] or "copy" in t["name"]:
            print(f"  {t['name'][:80]:80s} {t['ms']:8.3f} ms {t.get('note', '')}")
for r in rows:
    print(f"{r['run']:22s} mfu={r['mfu']:.4f} tok/s={r['tokens_per_s']:7.0f} step={r['step_ms']:6.1f}ms "
          f"mem={r['peak_mem_gib']:5.1f} replay={r['replay']!s:5s} {r['attention']:9s} chunk={r['ce_chunk']} {r['env']}")
b = out / "bench-vs-reference.json"
if b.exists():
    b = json.loads(b.read_text())
    for r in b["references"]:
        print(f"ref {r['name']:18s} mfu={r['mfu']:.4f} tok/s={r['tokens_per_s']:7.0f} mem={r['peak_mem_gib']:5.1f}")
    print(f"strongest {b.get('strongest')} ratio_vs_strongest {b.get('ratio_vs_strongest')} "
          f"det/fast {b.get('deterministic_vs_fast')} met {b.get('met')} failed {b.get('failed')}")
PY
tar -czf "$OUT/extra.tar.gz" -C "$WORK" . 2>/dev/null
ls -la "$OUT" >>"$LOG"
