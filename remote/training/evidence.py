"""The MFU evidence record (docs/mfu.md; README "The workload") and its atomic writer.

Checked by remote.checks.mfu; the field names below are the contract, so add fields rather than rename.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from remote.accounting import mfu
from remote.checks.mfu import MFU_SCHEMA
from remote.host import envprobe
from remote.training import parallel
from remote.training.model import FLOPS_FORMULA


def attention_record(choice: Choice) -> dict[str, Any]:
    from remote.attention import backend as attention

    return attention.versions(choice)


if TYPE_CHECKING:
    from remote.attention.backend import Choice
    from remote.training.profiles import Profile

SCHEMA = MFU_SCHEMA


@dataclass
class RoundResult:
    """What one round measured (remote.training.train.run_round): the record's input."""

    losses: list[float]
    step_times_s: list[float]
    peak_mem_gib: float
    step_peak_mem_gib: float
    optimizer_numel: int
    leaf_root: str | None
    extra: dict[str, Any] = field(default_factory=dict)


def step_spread(times_s: list[float]) -> dict[str, Any]:
    """How the timed steps spread, in ms: min/median/max, and the mean of even against odd steps, so an
    alternating slow step (issue 32: every other step 11-17 ms slower) shows as a large |even - odd|."""
    ms = [t * 1e3 for t in times_s]
    if not ms:
        return {}
    srt = sorted(ms)
    even, odd = ms[0::2], ms[1::2]
    rec = {"min_ms": srt[0], "median_ms": srt[len(srt) // 2], "max_ms": srt[-1],
           "spread_pct": (srt[-1] - srt[0]) / srt[len(srt) // 2] * 100}
    if even and odd:
        rec |= {"even_mean_ms": sum(even) / len(even), "odd_mean_ms": sum(odd) / len(odd)}
        rec["alternation_ms"] = rec["odd_mean_ms"] - rec["even_mean_ms"]
    return rec


def _fa4_versions() -> dict[str, Any]:
    from remote.attention import fa4

    v = fa4.versions()
    return {"flash_attn_4": v["flash-attn-4"], "nvidia_cutlass_dsl": v["nvidia-cutlass-dsl"]}


def build(*, args: argparse.Namespace, profile: Profile, world: int, peak: mfu.Peak, choice: Choice,
          first: RoundResult, second: RoundResult | None, identities: list[dict[str, Any]], mems: list[tuple[Any, ...]],
          env: dict[str, Any], det: dict[str, Any], mps: dict[str, Any] | None, device: torch.device) -> dict[str, Any]:
    cfg = profile.model
    micro_batch = first.extra["micro_batch"]
    fpt = cfg.flops_per_token()
    fpt_half = cfg.flops_per_token(causal_halved=True)
    # Mean over timed steps (total tokens / total time), not the median: stalls count against us.
    tokens_per_s = world * micro_batch * cfg.seq_len * len(first.step_times_s) / sum(first.step_times_s)
    per_gpu = tokens_per_s / world
    record = {
        "schema": SCHEMA,
        "created_unix": time.time(),
        "profile": profile.name,
        "required_attention": list(profile.required_attention),
        "device": device.type,
        "model": dataclasses.asdict(cfg) | {"padded_vocab": cfg.padded_vocab,
                                            "param_counts": cfg.param_counts()},
        "mfu": mfu.mfu(per_gpu, fpt, peak.tflops),
        "mfu_causal_halved": mfu.mfu(per_gpu, fpt_half, peak.tflops),
        "peak_tflops": peak.tflops,
        "peak_source": peak.source,
        "flops_per_token": fpt,
        "flops_per_token_formula": FLOPS_FORMULA,
        "flops_per_token_causal_halved": fpt_half,
        "tokens_per_s": tokens_per_s,
        "tokens_per_s_per_gpu": per_gpu,
        "achieved_tflops_per_gpu": per_gpu * fpt / 1e12,
        "step_times_s": first.step_times_s,
        "step_time_spread": step_spread(first.step_times_s),
        "all_step_times_s": first.extra["all_step_times_s"],
        "warmup_steps": profile.train.warmup_steps,
        "steps": first.extra["steps"],
        "loss_per_step": first.losses,
        "rank_peak_mem_gib": [m[0] for m in mems],
        "rank_step_peak_mem_gib": [m[1] for m in mems],
        "rank_optimizer_numel": [m[2] for m in mems],
        "attention_backend": choice.path,
        "attention": attention_record(choice),
        "attention_kv_mode": choice.kv_mode,
        "attention_rejected": choice.rejected,
        "world_size": world,
        "micro_batch": micro_batch,
        "seq_len": cfg.seq_len,
        "reduction": args.reduction,
        "reduce_order": first.extra["reduce_order"],  # remote/training/parallel.py: the owner reduction's add order
        "flags": {"act_ckpt": args.act_ckpt, "compile": args.compile, "nccl_pcie": args.nccl_pcie,
                  "deterministic": args.deterministic, "replay": args.replay, "attention": args.attention,
                  "peak_tflops_override": args.peak_tflops},
        "determinism": det,
        "nccl_env": env | parallel.recorded_env(),
        "versions": envprobe.versions() | {"gpu_name": identities[0]["name"],
                                           "gpu_uuids": [i["uuid"] for i in identities]} | _fa4_versions(),
        "ranks": identities,
        "leaf_root": first.leaf_root,
        "mps": mps,
    }
    if second is not None:
        record |= {"replay_leaf_root": second.leaf_root, "replay_match": second.leaf_root == first.leaf_root,
                   "replay_loss_per_step": second.losses, "replay_step_times_s": second.step_times_s}
    return record


def write(path: str | os.PathLike[str], record: dict[str, Any]) -> None:
    """Write-then-rename, so a reader never sees half a file."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".tmp")
    tmp.write_text(json.dumps(record, indent=1, sort_keys=False) + "\n")
    os.replace(tmp, out)
