"""Checker for MFU evidence (remote.training.evidence) and bench-vs-reference records.

check(path) -> failed claims, in the order they are checked (the first is the one to report).
Claims are recomputed from the record's own numbers wherever possible, so a hand-edited figure fails.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from remote.host.paths import MODEL_PROFILES_DIR
from remote.knobs import KERNEL_PREFIXES

MFU_SCHEMA = "vast-harness/mfu/1"  # remote/training/evidence.py writes it; kept here so checks never import torch

BENCH_SCHEMA = "vast-harness/bench-vs-reference/1"
BENCH_SCHEMA_2 = "vast-harness/bench-vs-reference/2"  # scripts/bench/bench_vs_reference.py: ours, deterministic, references
REFERENCE_FIELDS = ("name", "mfu", "tokens_per_s", "step_times_s", "micro_batch", "seq_len", "flops_per_token",
                    "peak_tflops", "peak_mem_gib", "versions", "warmup_steps")
HEX64 = re.compile(r"^[0-9a-f]{64}$")
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
PROFILE_DIR = MODEL_PROFILES_DIR

# field -> accepted types
REQUIRED: dict[str, tuple[type, ...]] = {
    "schema": (str,), "profile": (str,), "device": (str,), "mfu": (float,), "peak_tflops": (int, float),
    "peak_source": (str,), "flops_per_token": (int, float), "flops_per_token_formula": (str,),
    "tokens_per_s": (int, float), "step_times_s": (list,), "warmup_steps": (int,),
    "rank_peak_mem_gib": (list,), "rank_step_peak_mem_gib": (list,), "attention_backend": (str,),
    "world_size": (int,), "micro_batch": (int,), "seq_len": (int,), "reduction": (str,), "flags": (dict,),
    "nccl_env": (dict,), "versions": (dict,), "leaf_root": (str,), "loss_per_step": (list,),
    "required_attention": (list,),
}
VERSION_KEYS = ("torch", "cuda", "driver", "gpu_name", "gpu_uuids")


def _close(a: float, b: float, rel: float = 1e-6) -> bool:
    return math.isclose(a, b, rel_tol=rel, abs_tol=0.0)


def _schema(d: dict[str, Any]) -> list[str]:
    failed = []
    for key, types in REQUIRED.items():
        if key not in d:
            failed.append(f"schema: field {key!r} is missing")
        elif not isinstance(d[key], types) or isinstance(d[key], bool):
            failed.append(f"schema: field {key!r} has type {type(d[key]).__name__}")
    if not failed and d["schema"] != MFU_SCHEMA:
        failed.append(f"schema: {d['schema']!r} is not {MFU_SCHEMA!r}")
    return failed


def _required_attention(d: dict[str, Any]) -> list[str]:
    """The profile file in this tree is authoritative; the recorded copy is the fallback."""
    path = PROFILE_DIR / f"{d['profile']}.toml"
    if path.is_file():
        import tomllib

        return list(tomllib.loads(path.read_text()).get("required_attention", []))
    return list(d["required_attention"])


def _claims(d: dict[str, Any]) -> list[str]:
    failed = []
    if not (0.0 < d["mfu"] < 1.0):
        failed.append(f"mfu {d['mfu']} is not in (0, 1)")
    times = d["step_times_s"]
    if not times or not all(isinstance(t, (int, float)) and t > 0 for t in times):
        failed.append("step_times_s must be a non-empty list of positive seconds")
    if d["warmup_steps"] < 3:
        failed.append(f"warmup_steps {d['warmup_steps']} < 3: warm-up must be excluded from timing")
    if times and all(isinstance(t, (int, float)) and t > 0 for t in times):
        tps = d["world_size"] * d["micro_batch"] * d["seq_len"] * len(times) / sum(times)
        if not _close(tps, d["tokens_per_s"]):
            failed.append(f"tokens_per_s {d['tokens_per_s']} does not match the step times ({tps})")
        mfu = tps / d["world_size"] * d["flops_per_token"] / (d["peak_tflops"] * 1e12)
        if not _close(mfu, d["mfu"]):
            failed.append(f"mfu {d['mfu']} does not follow from tokens_per_s, flops_per_token, peak ({mfu})")
    model = d.get("model", {})
    if {"n_layers", "d_model", "seq_len", "param_counts"} <= set(model):
        pc = model["param_counts"]
        fpt = 6 * (pc["non_embedding"] + pc["lm_head"]) + 12 * model["n_layers"] * model["d_model"] * model["seq_len"]
        if not _close(fpt, d["flops_per_token"]):
            failed.append(f"flops_per_token {d['flops_per_token']} is not 6*(N_nonembed+N_head)+12*L*d*T ({fpt})")
    else:
        failed.append("model: shape and param_counts are missing, flops_per_token cannot be verified")
    if d["peak_tflops"] <= 0 or not d["peak_source"].strip():
        failed.append("peak_tflops must be positive and peak_source named")
    if d["world_size"] < 1 or len(d["rank_peak_mem_gib"]) != d["world_size"] or \
            len(d["rank_step_peak_mem_gib"]) != d["world_size"]:
        failed.append("rank_peak_mem_gib and rank_step_peak_mem_gib need one entry per rank")
    if d["micro_batch"] < 1:
        failed.append(f"micro_batch {d['micro_batch']} < 1")
    if d["reduction"] not in ("ddp", "zero2", "zero2o"):
        failed.append(f"reduction {d['reduction']!r} is not ddp, zero2 or zero2o")
    if d.get("reduce_order", "backend") not in ("rank", "backend"):  # absent in records before issue 26
        failed.append(f"reduce_order {d['reduce_order']!r} is not rank or backend")
    required = _required_attention(d)
    if d["device"] == "cuda" and required and d["attention_backend"] not in required:
        failed.append(f"attention_backend {d['attention_backend']!r} is not one the profile requires {required}")
    for key, value in MULTICAST_OFF.items():
        if d["nccl_env"].get(key) != value:
            failed.append(f"nccl_env: {key} must be {value} (NVLink multicast off), got {d['nccl_env'].get(key)!r}")
    missing = [k for k in VERSION_KEYS if k not in d["versions"]]
    if missing:
        failed.append(f"versions: missing {missing}")
    elif d["device"] == "cuda" and (not d["versions"]["driver"] or len(d["versions"]["gpu_uuids"]) != d["world_size"]
                                    or not all(d["versions"]["gpu_uuids"])):
        failed.append("versions: a CUDA run must record the driver and one GPU UUID per rank")
    if not HEX64.match(d["leaf_root"]):
        failed.append(f"leaf_root {d['leaf_root']!r} is not a sha256 hex digest")
    kern = d.get("kernels")
    if isinstance(kern, dict) and isinstance(kern.get("probes"), dict):  # recorded since the kernel registry
        unprobed = [k for k in kern.get("active", []) if not (kern["probes"].get(k) or {}).get("passed")]
        if unprobed:
            failed.append(f"kernels {unprobed} ran without a passing probe on the device")
        both = sorted(set(kern.get("active", [])) & set(kern.get("rejected", {})))
        if both:
            failed.append(f"kernels {both} are recorded both active and rejected")
    losses = d["loss_per_step"]
    if not losses or not all(isinstance(x, (int, float)) and math.isfinite(x) for x in losses):
        failed.append("loss_per_step must be a non-empty list of finite numbers")
    if d["flags"].get("replay"):
        if d.get("replay_match") is not True:
            failed.append(f"replay was asked but replay_match is {d.get('replay_match')!r}")
        elif d.get("replay_leaf_root") != d["leaf_root"]:
            failed.append("replay_match is true but replay_leaf_root differs from leaf_root")
    return failed


def check_record(d: dict[str, Any]) -> list[str]:
    failed = _schema(d)
    return failed if failed else _claims(d)


def _check_bench(d: dict[str, Any]) -> list[str]:
    failed = [f"ours: {c}" for c in check_record(d.get("ours", {}))]
    ref = d.get("reference", {})
    for key in ("mfu", "tokens_per_s", "step_times_s", "micro_batch", "seq_len", "flops_per_token"):
        if key not in ref:
            failed.append(f"reference: field {key!r} is missing")
    if failed:
        return failed
    if not (0.0 < ref["mfu"] < 1.0):
        failed.append(f"reference: mfu {ref['mfu']} is not in (0, 1)")
    ours = d["ours"]
    if (ref["micro_batch"], ref["seq_len"]) != (ours["micro_batch"], ours["seq_len"]):
        failed.append("reference and ours differ in micro_batch or seq_len")
    if not _close(ref["flops_per_token"], ours["flops_per_token"]):
        failed.append("reference and ours are scored with different flops_per_token")
    if not _close(d.get("ratio", -1.0), ours["mfu"] / ref["mfu"]):
        failed.append(f"ratio {d.get('ratio')} is not ours.mfu / reference.mfu")
    return failed


def _profile_ce_chunk(profile: str) -> int | None:
    path = PROFILE_DIR / f"{profile}.toml"
    if not path.is_file():
        return None
    import tomllib

    return int(tomllib.loads(path.read_text()).get("train", {}).get("ce_chunk_tokens", 8192))


def _check_ours_v2(d: dict[str, Any], key: str) -> list[str]:
    """ours / deterministic: a full MFU record, run with the profile's own settings (no kernel knobs)."""
    rec = d.get(key)
    if not isinstance(rec, dict):
        return [f"{key}: missing"]
    failed = [f"{key}: {c}" for c in check_record(rec)]
    if failed:
        return failed
    if rec["micro_batch"] != d.get("micro_batch"):
        failed.append(f"{key}: micro_batch {rec['micro_batch']} is not the bench's {d.get('micro_batch')}")
    det = key == "deterministic"
    if bool(rec["flags"].get("deterministic")) != det or (det and not rec["flags"].get("replay")):
        failed.append(f"{key}: flags deterministic/replay are {rec['flags'].get('deterministic')}/"
                      f"{rec['flags'].get('replay')}, expected {det}/{det}")
    if det and rec.get("replay_match") is not True:
        failed.append(f"{key}: replay_match is {rec.get('replay_match')!r}, not true")
    knobs = sorted(k for k in rec.get("kernels", {}).get("env", {}) if k.startswith(KERNEL_PREFIXES))
    if knobs:
        failed.append(f"{key}: ran with kernel knobs {knobs} in the environment, not the profile's settings")
    chunk = rec.get("kernels", {}).get("ce_chunk_tokens")
    if rec.get("ce_chunk_tokens") != chunk:
        failed.append(f"{key}: ce_chunk_tokens {rec.get('ce_chunk_tokens')} is not the run's {chunk}")
    default = _profile_ce_chunk(rec["profile"])
    if default is not None and rec.get("ce_chunk_is_profile_default") is not (chunk == default):
        failed.append(f"{key}: ce_chunk_is_profile_default {rec.get('ce_chunk_is_profile_default')} but the "
                      f"run's chunk is {chunk} and the profile's {default}")
    return failed


def _check_reference_v2(ref: dict[str, Any], ours: dict[str, Any]) -> list[str]:
    name = ref.get("name", "?")
    missing = [k for k in REFERENCE_FIELDS if k not in ref]
    if missing:
        return [f"reference {name}: fields {missing} are missing"]
    failed = []
    times = ref["step_times_s"]
    if not times or not all(isinstance(t, (int, float)) and t > 0 for t in times):
        return [f"reference {name}: step_times_s must be a non-empty list of positive seconds"]
    if not _close(ref["flops_per_token"], ours["flops_per_token"]) or \
            not _close(ref["peak_tflops"], ours["peak_tflops"]):
        failed.append(f"reference {name}: scored with another flops_per_token or peak than ours")
    if ref["warmup_steps"] < 3:
        failed.append(f"reference {name}: warmup_steps {ref['warmup_steps']} < 3")
    tps = ref["micro_batch"] * ref["seq_len"] * len(times) / sum(times)
    if not _close(tps, ref["tokens_per_s"]):
        failed.append(f"reference {name}: tokens_per_s {ref['tokens_per_s']} does not match the step times ({tps})")
    mfu = tps * ref["flops_per_token"] / (ref["peak_tflops"] * 1e12)
    if not _close(mfu, ref["mfu"]) or not 0.0 < ref["mfu"] < 1.0:
        failed.append(f"reference {name}: mfu {ref['mfu']} does not follow from its numbers ({mfu})")
    if (ref["micro_batch"], ref["seq_len"]) != (ours["micro_batch"], ours["seq_len"]):
        failed.append(f"reference {name}: micro_batch/seq_len differ from ours")
    if not ref["versions"].get("torch") or not (ref["versions"].get("transformers") or
                                                ref["versions"].get("torchtitan")):
        failed.append(f"reference {name}: versions must name torch and transformers (or torchtitan)")
    return failed


def _check_bench_v2(d: dict[str, Any]) -> list[str]:
    failed = _check_ours_v2(d, "ours") + _check_ours_v2(d, "deterministic")
    if failed:
        return failed
    ours, det = d["ours"], d["deterministic"]
    refs = d.get("references")
    if not isinstance(refs, list) or not refs:
        return ["references: none measured"]
    for ref in refs:
        failed += _check_reference_v2(ref, ours)
    if failed:
        return failed
    names = [r["name"] for r in refs]
    if len(set(names)) != len(names):
        failed.append(f"references: names repeat {names}")
    best = max(refs, key=lambda r: r["mfu"])
    if d.get("strongest") != best["name"]:
        failed.append(f"strongest {d.get('strongest')!r} is not the reference with the highest mfu ({best['name']})")
    if not _close(d.get("ratio_vs_strongest", -1.0), ours["mfu"] / best["mfu"]):
        failed.append(f"ratio_vs_strongest {d.get('ratio_vs_strongest')} is not ours.mfu / {best['name']}.mfu")
    if not _close(d.get("deterministic_vs_fast", -1.0), det["mfu"] / ours["mfu"]):
        failed.append(f"deterministic_vs_fast {d.get('deterministic_vs_fast')} is not deterministic.mfu / ours.mfu")
    prev = d.get("previous_fast")
    if prev is not None:
        failed += [f"previous_fast: {c}" for c in check_record(prev)]
        if not failed and "deterministic_vs_previous_fast" in d and \
                not _close(d["deterministic_vs_previous_fast"], det["mfu"] / prev["mfu"]):
            failed.append("deterministic_vs_previous_fast is not deterministic.mfu / previous_fast.mfu")
    base = d.get("baseline_fast")
    if base is not None:
        failed += [f"baseline_fast: {c}" for c in check_record(base)]
        if not failed and not _close(d.get("deterministic_vs_baseline_fast", -1.0), det["mfu"] / base["mfu"]):
            failed.append(f"deterministic_vs_baseline_fast {d.get('deterministic_vs_baseline_fast')} is not "
                          "deterministic.mfu / baseline_fast.mfu")
    for key, target in d.get("targets", {}).items():
        if key in d and d.get("met", {}).get(key) is not (d[key] >= target):
            failed.append(f"met.{key} {d.get('met', {}).get(key)} does not follow from {d[key]} vs {target}")
    return failed


def check(path: Path) -> list[str]:
    try:
        d = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        return [f"unreadable evidence: {exc}"]
    if not isinstance(d, dict):
        return ["evidence is not a JSON object"]
    if d.get("schema") == BENCH_SCHEMA:
        return _check_bench(d)
    if d.get("schema") == BENCH_SCHEMA_2:
        return _check_bench_v2(d)
    return check_record(d)
