#!/usr/bin/env bash
# Issue 13 on one H200 (GPU 0 only), in one call of at most ~9 minutes: each hand-written kernel checked
# against its torch reference on CUDA and timed, then compiled zero2o runs of the 1B profile switching the
# kernels on one at a time (cumulative), all-on at larger micro-batches, deterministic + replay, the HF
# reference bench against the all-on run, and a kernel profile (self CUDA time + Chrome trace) of it.
#   OUT=dir bash scripts/gpu/h200_kernels.sh     (PY=python3; knobs: H200_STEPS=13, H200_BUDGET_S=530,
#                                             H200_SKIP="phase names", H200_MB_BIG="24 32",
#                                             H200_CE_CHUNK=16384: loss chunk of the runs with the loss kernel)
# Writes at most 8 files into $OUT: log.txt, kernels-check.json, runs.json (every run's summary),
# bench-vs-reference.json, profile.txt, trace.json.gz, extra.tar.gz (every evidence JSON and log) and prints
# a short table last. Every phase is time-limited by itself and by what is left of the budget; none aborts.
set -uo pipefail
# NVLink multicast off in NCCL, PyTorch and NVSHMEM: always (shared hosts), whatever the caller set.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export CUDA_VISIBLE_DEVICES=0
cd "$(dirname "$0")/../.."
OUT=${OUT:-.evidence/h200-kernels}; mkdir -p "$OUT"
PY=${PY:-python3}
STEPS=${H200_STEPS:-13}; SKIP=${H200_SKIP:-}; BUDGET=${H200_BUDGET_S:-530}; MB_BIG=${H200_MB_BIG:-"24 32"}
CE_CHUNK=${H200_CE_CHUNK:-16384}  # fewer chunks, fewer fp32 read-modify-writes of the head gradient
WORK=$(mktemp -d); LOG="$OUT/log.txt"; : >"$LOG"
RUN=(scripts/run_mfu_dist.py --profile mfu-dense-1b-dp1 --device cuda --reduction zero2o --compile)
T0=$SECONDS

phase() {  # phase NAME LIMIT_S CMD...: time-limited (by LIMIT_S and the budget left), logged, never aborts
    local name=$1 limit=$2; shift 2
    if [[ " $SKIP " == *" $name "* ]]; then echo "== $name skipped" | tee -a "$LOG"; return 0; fi
    local left=$((BUDGET - (SECONDS - T0) - 20))  # 20 s stay for the table and the tarball
    if ((left < 25)); then echo "== $name not run: budget spent" | tee -a "$LOG"; return 124; fi
    ((limit > left)) && limit=$left
    local t0=$SECONDS
    timeout "$limit" "$@" >"$WORK/$name.log" 2>&1; local rc=$?
    echo "== $name rc=$rc $((SECONDS - t0))s (limit ${limit}s)" | tee -a "$LOG"
    grep -E "kernels active|\[train\] mfu|\[bench\]|\[check\] [0-9]|FAIL|Error|error:" "$WORK/$name.log" \
        | tail -6 | tee -a "$LOG"
    return $rc
}

train() {  # train NAME KERNELS MB [extra flags...]: one compiled zero2o run -> $WORK/mfu-NAME.json
    local name=$1 kern=$2 mb=$3 chunk=""; shift 3
    [ "$kern" != none ] && chunk=$CE_CHUNK  # the baseline keeps the profile's chunk (main as it is)
    VH_KERNELS=$kern VH_CE_CHUNK=$chunk phase "$name" "${LIMIT:-110}" $PY "${RUN[@]}" --micro-batch "$mb" \
        --steps "$STEPS" --out "$WORK/mfu-$name.json" "$@"
}

nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm,power.draw --format=csv >>"$LOG" 2>&1
phase check 100 $PY -m remote.kernels.check --out "$OUT/kernels-check.json"
train 1-base-mb16 none 16
train 2-loss-mb16 loss 16
train 3-swiglu-mb16 loss,swiglu 16
train 4-all-mb16 loss,swiglu,optim 16
LIMIT=150 train 5-det-mb16 all 16 --deterministic --replay
ours="$WORK/mfu-4-all-mb16.json"
phase bench 110 $PY scripts/bench/bench_vs_reference.py --micro-batch 16 --steps "$STEPS" \
    --runs hf-layer,hf+liger-layer \
    $([ -f "$ours" ] && echo --ours-evidence "$ours") $([ -f "$WORK/mfu-5-det-mb16.json" ] && echo --deterministic-evidence "$WORK/mfu-5-det-mb16.json") --out "$OUT/bench-vs-reference.json"
for mb in $MB_BIG; do
    [ "$mb" = 32 ] && continue  # last: only if the budget still allows it
    train "6-all-mb$mb" all "$mb"
done
VH_KERNELS=all VH_CE_CHUNK=$CE_CHUNK VH_TORCH_PROFILE_OUT="$OUT/profile.txt" VH_TORCH_TRACE_OUT="$WORK/trace.json" \
    phase profile 100 $PY "${RUN[@]}" --micro-batch 16 --steps 6 --out "$WORK/profile-run.json"
if [ -f "$WORK/trace.json" ]; then
    gzip -c "$WORK/trace.json" >"$WORK/trace.json.gz" && rm -f "$WORK/trace.json"
    # the device tool returns files of at most 16 MiB
    if [ "$(stat -c %s "$WORK/trace.json.gz")" -lt 16000000 ]; then mv "$WORK/trace.json.gz" "$OUT/"; fi
fi
[[ " $MB_BIG " == *" 32 "* ]] && LIMIT=120 train 7-all-mb32 all 32
files=$(ls "$WORK"/mfu-*.json "$OUT"/bench-vs-reference.json 2>/dev/null)
[ -n "$files" ] && phase evidence-check 40 $PY scripts/check_gpu_evidence.py --kind mfu $files
echo "== total $((SECONDS - T0))s" | tee -a "$LOG"
$PY - "$WORK" "$OUT" <<'PY' | tee -a "$LOG"
import json, pathlib, sys
work, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
rows, summary = [], []
for p in sorted(work.glob("mfu-*.json")):
    d = json.loads(p.read_text())
    row = {"run": p.stem[4:], "mb": d["micro_batch"], "mfu": d["mfu"], "tokens_per_s": d["tokens_per_s"],
           "peak_mem_gib": max(d["rank_peak_mem_gib"]), "replay": d.get("replay_match", "-"),
           "kernels": ",".join(d.get("kernels", {}).get("active", [])) or "none",
           "attention": d["attention_backend"], "step_s": sorted(d["step_times_s"])[len(d["step_times_s"]) // 2],
           "ce_chunk": d.get("kernels", {}).get("ce_chunk_tokens")}
    summary.append(row)
    rows.append(f"{row['run']:16s} mb={row['mb']:<3d} mfu={row['mfu']:.4f} tok/s={row['tokens_per_s']:>7.0f} "
                f"mem={row['peak_mem_gib']:6.1f}GiB replay={row['replay']!s:5s} step={row['step_s'] * 1e3:6.1f}ms "
                f"{row['attention']:6s} chunk={row['ce_chunk']} [{row['kernels']}]")
(out / "runs.json").write_text(json.dumps(summary, indent=1) + "\n")
check = out / "kernels-check.json"
if check.exists():
    c = json.loads(check.read_text())
    bad = [x["name"] for x in c["checks"] if not x["ok"]]
    print(f"kernel checks: {len(c['checks']) - len(bad)}/{len(c['checks'])} ok" + (f"; FAILED {bad}" if bad else ""))
    for t in c["timings"]:
        bw = f"{t['tb_s']:.2f} TB/s" if t.get("tb_s") else ""
        print(f"  {t['name'][:88]:88s} {t['ms']:8.3f} ms {bw}")
bench = out / "bench-vs-reference.json"
if bench.exists():
    b = json.loads(bench.read_text())
    refs = " ".join(f"{r['name']} {r['mfu']:.4f}" for r in b["references"])
    print(f"bench mb{b['micro_batch']}: ours {b.get('ours', {}).get('mfu')} references {refs} "
          f"strongest {b.get('strongest')} ratio {b.get('ratio_vs_strongest')}")
print("\n".join(rows))
PY
tar -czf "$OUT/extra.tar.gz" -C "$WORK" . 2>/dev/null
ls -la "$OUT" >>"$LOG"
