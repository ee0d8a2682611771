#!/usr/bin/env bash
# MFU sweep on a GPU host: HT_MFU_WORLDS x HT_MFU_MB x HT_MFU_COMPILE x HT_MFU_P2P, one mfu-<tag>.json each
# into $HT_MFU_OUT, then every file checked and a table (scripts/sweep_report.py).
#   HT_MFU_WORLDS="1 2"  HT_MFU_MB="8 16"  HT_MFU_COMPILE="1 0"  HT_MFU_P2P="on off" (off = --nccl-pcie)
#   HT_MFU_REDUCTION=zero2o  HT_MFU_STEPS=13  HT_MFU_EXTRA="--act-ckpt"  HT_MFU_OUT=./evidence  PY=python3
#   HT_ACT_CKPT=0|1|auto  HT_FIT (written by the harness: how each point fits this GPU, remote/host/fit.py)
# World size w runs profile mfu-dense-1b-dp<w>. A point the harness's memory fit says this GPU cannot hold is
# dropped and said; one it holds only with activation checkpointing runs with it (tag "-ckpt"). A failed run is
# logged and the sweep goes on; the exit code is non-zero if any run or check failed.
set -uo pipefail
# NVLink multicast off in NCCL, PyTorch and NVSHMEM: always, whatever the caller's environment says.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.."
OUT=${HT_MFU_OUT:-./evidence}; mkdir -p "$OUT"
PY=${PY:-python3}
WORLDS=${HT_MFU_WORLDS:-"1 2"}; MBS=${HT_MFU_MB:-"8 16"}; COMPILES=${HT_MFU_COMPILE:-"1"}
P2PS=${HT_MFU_P2P:-"on"}; REDUCTION=${HT_MFU_REDUCTION:-zero2o}; STEPS=${HT_MFU_STEPS:-13}
EXTRA=${HT_MFU_EXTRA:-}
failed=0
for w in $WORLDS; do for mb in $MBS; do for c in $COMPILES; do for p2p in $P2PS; do
    mode=$([ "$c" = 1 ] && echo compile || echo eager)
    fit=$($PY -m remote.host.fit flags "dp$w-mb$mb-$mode"); rc=$?
    if [ "$rc" = 3 ]; then echo "-- dp$w-$REDUCTION-mb$mb-$mode-p2p$p2p dropped: it does not fit this GPU (fit: above)"
        continue; fi
    if [ "$rc" != 0 ]; then echo "!! dp$w-mb$mb-$mode: the memory fit cannot be read (exit $rc)"; failed=1; continue; fi
    case " $fit " in *" --act-ckpt "*) mode="$mode-ckpt" ;; esac
    tag="dp$w-$REDUCTION-mb$mb-$mode-p2p$p2p"
    flags=(--profile "mfu-dense-1b-dp$w" --device cuda --reduction "$REDUCTION" --micro-batch "$mb"
           --steps "$STEPS" --out "$OUT/mfu-$tag.json")
    [ "$c" = 1 ] && flags+=(--compile)
    # shellcheck disable=SC2206 # the fit's flags are words on purpose
    flags+=($fit)
    [ "$p2p" = off ] && flags+=(--nccl-pcie)
    echo "== $tag"
    # shellcheck disable=SC2086 # EXTRA is a flag list on purpose
    if ! $PY -m torch.distributed.run --standalone --nproc-per-node "$w" scripts/run_mfu_dist.py \
            "${flags[@]}" $EXTRA 2>&1 | tee "$OUT/mfu-$tag.log" | grep -E "attention backend|\[train\] mfu|error"; then
        echo "!! $tag produced no result line"
    fi
    [ -f "$OUT/mfu-$tag.json" ] || { echo "!! $tag failed (see $OUT/mfu-$tag.log)"; failed=1; }
done; done; done; done
shopt -s nullglob
files=("$OUT"/mfu-*.json)
if [ ${#files[@]} -gt 0 ]; then
    $PY scripts/check_gpu_evidence.py --kind mfu "${files[@]}" || failed=1
    $PY scripts/sweep_report.py "$OUT" || failed=1
else
    echo "no evidence written"; failed=1
fi
exit $failed
