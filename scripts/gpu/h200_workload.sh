#!/usr/bin/env bash
# The one script to run on a single-GPU H200 (or H100) host: quick correctness, then the measured runs.
#   OUT=dir bash scripts/gpu/h200_workload.sh       (PY=python3 by default; knobs: H200_MB, H200_DET_MB,
#                                                 H200_BENCH_MB, H200_STEPS, H200_PROFILE=0|1, H200_SKIP)
# Writes at most 8 files into $OUT (envprobe.json, attention-qual.json, dp1-fast.json,
# dp1-deterministic.json, bench-vs-reference.json, profile.txt, log.txt, extra.tar.gz with every
# per-run JSON and log) and prints a short table last.
set -uo pipefail
# NVLink multicast off in NCCL, PyTorch and NVSHMEM: always (shared hosts), whatever the caller set.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
cd "$(dirname "$0")/../.."
OUT=${OUT:-.evidence/h200-run}; mkdir -p "$OUT"
PY=${PY:-python3}
MB_LIST=${H200_MB:-"8 16"}; DET_MB=${H200_DET_MB:-16}; BENCH_MB=${H200_BENCH_MB:-8}
STEPS=${H200_STEPS:-13}; SKIP=${H200_SKIP:-}
WORK=$(mktemp -d); LOG="$OUT/log.txt"; : >"$LOG"
RUN=(scripts/run_mfu_dist.py --profile mfu-dense-1b-dp1 --device cuda)

phase() {  # phase NAME LIMIT_S CMD...: run with a time limit, log, never abort the script
    local name=$1 limit=$2; shift 2
    if [[ " $SKIP " == *" $name "* ]]; then echo "== $name skipped" | tee -a "$LOG"; return 0; fi
    local t0=$SECONDS
    timeout "$limit" "$@" >"$WORK/$name.log" 2>&1; local rc=$?
    echo "== $name rc=$rc $((SECONDS - t0))s" | tee -a "$LOG"
    grep -E "attention backend|\[train\] mfu|\[bench\]|error|Error" "$WORK/$name.log" | tail -4 | tee -a "$LOG"
    return $rc
}

phase envprobe 60 $PY -m remote.host.envprobe --out "$OUT/envprobe.json"
phase qualify 150 $PY -m remote.attention.backend --qualify --device cuda --out "$OUT/attention-qual.json"
phase smoke 150 $PY "${RUN[@]/mfu-dense-1b-dp1/tiny-cpu}" --reduction zero2o --deterministic --replay \
    --out "$WORK/mfu-smoke-tiny-cuda.json"
for mb in $MB_LIST; do
    phase "fast-mb$mb" 300 $PY "${RUN[@]}" --reduction zero2o --compile --micro-batch "$mb" --steps "$STEPS" \
        --out "$WORK/mfu-dp1-fast-mb$mb.json"
done
best=$($PY - "$WORK" <<'PY'
import json, pathlib, sys
runs = [(json.loads(p.read_text())["mfu"], p) for p in pathlib.Path(sys.argv[1]).glob("mfu-dp1-fast-mb*.json")]
print(max(runs)[1] if runs else "")
PY
)
[ -n "$best" ] && cp "$best" "$OUT/dp1-fast.json"
phase deterministic 360 $PY "${RUN[@]}" --reduction zero2o --compile --deterministic --replay \
    --micro-batch "$DET_MB" --steps "$STEPS" --out "$WORK/mfu-dp1-deterministic-mb$DET_MB.json"
cp "$WORK/mfu-dp1-deterministic-mb$DET_MB.json" "$OUT/dp1-deterministic.json" 2>/dev/null
ours="$WORK/mfu-dp1-fast-mb$BENCH_MB.json"
phase bench 300 $PY scripts/bench/bench_vs_reference.py --micro-batch "$BENCH_MB" --steps "$STEPS" \
    --runs hf-layer,hf+liger-layer \
    $([ -f "$ours" ] && echo --ours-evidence "$ours") $([ -f "$WORK/mfu-dp1-deterministic-mb$DET_MB.json" ] && echo --deterministic-evidence "$WORK/mfu-dp1-deterministic-mb$DET_MB.json") --out "$OUT/bench-vs-reference.json"
if [ "${H200_PROFILE:-1}" = 1 ] && [ -n "$best" ]; then
    pmb=$($PY -c "import json,sys; print(json.load(open(sys.argv[1]))['micro_batch'])" "$best")
    VH_TORCH_PROFILE_OUT="$OUT/profile.txt" phase profile 200 $PY "${RUN[@]}" --reduction zero2o --compile \
        --micro-batch "$pmb" --steps 6 --out "$WORK/mfu-profile-run.json"
fi
files=$(ls "$OUT"/dp1-*.json "$OUT"/bench-vs-reference.json 2>/dev/null)
[ -n "$files" ] && phase check 60 $PY scripts/check_gpu_evidence.py --kind mfu $files
tar -czf "$OUT/extra.tar.gz" -C "$WORK" . 2>/dev/null
$PY - "$WORK" "$OUT" <<'PY'
import json, pathlib, sys
rows = []
for p in sorted(pathlib.Path(sys.argv[1]).glob("mfu-*.json")) + [pathlib.Path(sys.argv[2]) / "bench-vs-reference.json"]:
    if not p.exists():
        continue
    d = json.loads(p.read_text())
    if "references" in d:
        refs = " ".join(f"{r['name']} {r['mfu']:.4f}" for r in d["references"])
        print(f"bench: ours {d.get('ours', {}).get('mfu')} {refs} ratio {d.get('ratio_vs_strongest')}")
        continue
    rows.append(f"{p.stem:34s} mb={d['micro_batch']:<3d} mfu={d['mfu']:.4f} tok/s={d['tokens_per_s']:>9.0f} "
                f"attn={d['attention_backend']:6s} mem={max(d['rank_peak_mem_gib']):6.1f}GiB "
                f"replay={d.get('replay_match', '-')}")
print("\n".join(rows))
PY
