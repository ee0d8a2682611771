#!/usr/bin/env bash
# Issues 24/32 on one H200 (GPU 0), one call of at most ~9.5 minutes: the kernel checks (each kernel against
# its torch reference, plus fa4 / fa4-det / cudnn-det attention against fp64 math SDPA, and the attention paths
# timed), then scripts/bench/bench_vs_reference.py at mb 16 (ours with the profile's settings, ours deterministic +
# replay, fast-cudnn = the fast default before FA4, HF per-layer / whole-model compile, HF + Liger per-layer /
# whole-model), then extra runs named in H200_EXTRA (a name starting "prof" also writes a Chrome trace of the
# last VH_TORCH_PROFILE_STEPS steps, split by step with remote.accounting.steptrace). nvidia-smi samples clocks, power and
# clock-event reasons every 100 ms all along (smi.csv in extra.tar.gz): the alternating slow step's cause.
#   OUT=dir bash scripts/gpu/h200_vs_reference.sh   (PY=python3; H200_STEPS=13, H200_BUDGET_S=540,
#       H200_RUNS=bench runs, H200_EXTRA="name|ENV=..|flags;..." extra run_mfu_dist runs, each limited to
#       H200_EXTRA_LIMIT_S=150, H200_BENCH_LIMIT_S=440, H200_CHECK_LIMIT_S=110, H200_CHECK_ONLY=sections of the
#       kernel check, H200_SKIP=phases)
# Wheels (liger-kernel, nvidia-cudnn-frontend; torchtitan with torchdata and tyro) are installed from .whl/ when it
# exists (the device README's carried-wheel recipe), or come unpacked in site-*.tar.xz; FA4 and its support
# libraries come unpacked in xz tarballs (fa4-*.tar.xz, or
# $FA4_TARBALL: the cu13 support wheel alone is 92 MB, over a call's 64 MiB), extracted into the same folder.
# Writes into $OUT: log.txt, kernels-check.json, bench-vs-reference.json, runs.json, extra.tar.gz (every run's JSON and log), and prints a short table last.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export CUDA_VISIBLE_DEVICES=0
cd "$(dirname "$0")/../.."
OUT=${OUT:-.evidence/h200-vs-reference}; mkdir -p "$OUT"
PY=${PY:-python3}
STEPS=${H200_STEPS:-13}; SKIP=${H200_SKIP:-}; BUDGET=${H200_BUDGET_S:-540}
RUNS=${H200_RUNS:-ours,deterministic,fast-cudnn,hf-layer,hf+liger-layer,hf-model,hf+liger-model}
WORK=$(mktemp -d); LOG="$OUT/log.txt"; : >"$LOG"
T0=$SECONDS
WHEELS=$(ls ../.whl/*.whl .whl/*.whl 2>/dev/null | head -16)
if [ -n "$WHEELS" ]; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $WHEELS \
        >>"$LOG" 2>&1 && export PYTHONPATH=/tmp/site
fi
# site-*.tar.xz: other carried packages unpacked the same way (wheels compress ~40% better as one xz tarball)
FA4_TARBALL=${FA4_TARBALL:-$(ls ../fa4-*.tar.xz fa4-*.tar.xz ../site-*.tar.xz site-*.tar.xz 2>/dev/null)}
for tb in $FA4_TARBALL; do  # one or several parts, each unpacked site-packages content
    mkdir -p /tmp/site && tar -xJf "$tb" -C /tmp/site >>"$LOG" 2>&1 && export PYTHONPATH=/tmp/site
done
# FA4 JIT-compiles its kernels; the on-disk cache lets every later process of this call reuse them.
export FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1 FLASH_ATTENTION_CUTE_DSL_CACHE_DIR=$WORK/fa4-cache
echo "wheels: $(echo $WHEELS | xargs -n1 basename 2>/dev/null | tr '\n' ' ') fa4: ${FA4_TARBALL:-none}" | tr '\n' ' ' | tee -a "$LOG"; echo | tee -a "$LOG"
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,power.limit,temperature.gpu,clocks_event_reasons.active \
    --format=csv -lms 100 >"$WORK/smi.csv" 2>&1 &
SMI_PID=$!

phase() {  # phase NAME LIMIT_S CMD...: time-limited (by LIMIT_S and the budget left), logged, never aborts
    local name=$1 limit=$2; shift 2
    if [[ " $SKIP " == *" $name "* ]]; then echo "== $name skipped" | tee -a "$LOG"; return 0; fi
    local left=$((BUDGET - (SECONDS - T0) - 15))
    if ((left < 30)); then echo "== $name not run: budget spent" | tee -a "$LOG"; return 124; fi
    ((limit > left)) && limit=$left
    local t0=$SECONDS
    timeout "$limit" "$@" >"$WORK/$name.log" 2>&1; local rc=$?
    echo "== $name rc=$rc $((SECONDS - t0))s (limit ${limit}s)" | tee -a "$LOG"
    grep -E "\[bench\]|\[train\] mfu|\[train\] attention|\[train\] step ms|\[steptrace\]|\[check\] [0-9]|FAIL|Error|error:" "$WORK/$name.log" \
        | tail -12 | tee -a "$LOG"
    return $rc
}

nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm,power.draw,driver_version --format=csv >>"$LOG" 2>&1
$PY -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cudnn', torch.backends.cudnn.version())" 2>&1 | tee -a "$LOG"
$PY -c "from remote.attention import fa4; import torch; print('fa4', fa4.versions(), fa4.unqualified(torch.device('cuda')) or 'importable')" 2>&1 | tail -2 | tee -a "$LOG"
phase check "${H200_CHECK_LIMIT_S:-110}" $PY -m remote.kernels.check --out "$OUT/kernels-check.json" \
    ${H200_CHECK_ONLY:+--only "$H200_CHECK_ONLY"}
mkdir -p "$WORK/bench"
phase bench "${H200_BENCH_LIMIT_S:-440}" $PY scripts/bench/bench_vs_reference.py --micro-batch 16 --steps "$STEPS" --runs "$RUNS" \
    --timeout-s 130 --work "$WORK/bench" --out "$OUT/bench-vs-reference.json"
# extra runs: "name|ENV=V ENV2=V2|flags", separated by ';'
IFS=';' read -ra EXTRA <<<"${H200_EXTRA:-}"
for spec in "${EXTRA[@]}"; do
    [ -z "$spec" ] && continue
    IFS='|' read -r name envs flags <<<"$spec"
    [[ $name == prof* ]] && envs="$envs VH_TORCH_PROFILE_OUT=$WORK/bench/$name-profile.txt VH_TORCH_TRACE_OUT=$WORK/$name-trace.json"
    phase "x-$name" "${H200_EXTRA_LIMIT_S:-150}" env $envs $PY scripts/run_mfu_dist.py --profile mfu-dense-1b-dp1 --device cuda \
        --reduction zero2o --compile --micro-batch 16 --steps "$STEPS" --out "$WORK/bench/mfu-x-$name.json" $flags
    if [ -f "$WORK/$name-trace.json" ]; then
        phase "steptrace-$name" 60 $PY -m remote.accounting.steptrace "$WORK/$name-trace.json" --out "$WORK/bench/$name-steptrace.json"
        gzip -f "$WORK/$name-trace.json"
    fi
done
kill "$SMI_PID" 2>/dev/null
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
                 "spread": d.get("step_time_spread", {}), "fa4": d.get("versions", {}).get("flash_attn_4"),
                 "cutlass": d.get("versions", {}).get("nvidia_cutlass_dsl"),
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
    sp = r["spread"]
    print(f"{r['run']:22s} mfu={r['mfu']:.4f} tok/s={r['tokens_per_s']:7.0f} step={r['step_ms']:6.1f}ms "
          f"[{sp.get('min_ms', 0):.1f}-{sp.get('max_ms', 0):.1f} even {sp.get('even_mean_ms', 0):.1f} odd "
          f"{sp.get('odd_mean_ms', 0):.1f}] mem={r['peak_mem_gib']:5.1f} replay={r['replay']!s:5s} "
          f"{r['attention']:9s} fa4={r['fa4']} cutlass={r['cutlass']} {r['env']}")
b = out / "bench-vs-reference.json"
if b.exists():
    b = json.loads(b.read_text())
    for r in b["references"]:
        print(f"ref {r['name']:18s} mfu={r['mfu']:.4f} tok/s={r['tokens_per_s']:7.0f} mem={r['peak_mem_gib']:5.1f}")
    print(f"strongest {b.get('strongest')} ratio_vs_strongest {b.get('ratio_vs_strongest')} "
          f"det/fast {b.get('deterministic_vs_fast')} det/baseline-fast {b.get('deterministic_vs_baseline_fast')} "
          f"met {b.get('met')} failed {b.get('failed')}")
PY
tar -czf "$OUT/extra.tar.gz" -C "$WORK" . 2>/dev/null
ls -la "$OUT" >>"$LOG"
