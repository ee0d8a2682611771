"""The mfu checker against the committed H200 evidence and tampered copies of it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from remote.checks import mfu as mfu_check

H200 = Path(__file__).resolve().parents[2] / ".evidence" / "h200"


def tampered(tmp_path: Path, source: str, edit) -> Path:
    d = json.loads((H200 / source).read_text())
    edit(d)
    out = tmp_path / source
    out.write_text(json.dumps(d))
    return out


@pytest.mark.parametrize("name", ["dp1-fast.json", "dp1-deterministic.json", "bench-vs-reference.json"])
def test_committed_h200_evidence_is_valid(name: str) -> None:
    assert mfu_check.check(H200 / name) == []


@pytest.mark.parametrize(("edit", "claim"), [
    (lambda d: d.update(mfu=1.2), "mfu 1.2 is not in (0, 1)"),
    (lambda d: d.update(mfu=d["mfu"] * 1.1), "does not follow from tokens_per_s"),
    (lambda d: d.update(tokens_per_s=d["tokens_per_s"] * 2), "tokens_per_s"),
    (lambda d: d["step_times_s"].__setitem__(0, -0.1), "step_times_s must be"),
    (lambda d: d.update(warmup_steps=1), "warmup_steps 1 < 3"),
    (lambda d: d.update(attention_backend="math"), "attention_backend 'math' is not one the profile requires"),
    (lambda d: d["nccl_env"].pop("NCCL_NVLS_ENABLE"), "NCCL_NVLS_ENABLE must be 0"),
    (lambda d: d.update(flops_per_token=d["flops_per_token"] / 2), "flops_per_token"),
    (lambda d: d.update(leaf_root="abc"), "leaf_root 'abc'"),
    (lambda d: d.pop("versions"), "schema: field 'versions' is missing"),
    (lambda d: d["versions"].update(gpu_uuids=[]), "one GPU UUID per rank"),
    (lambda d: d.update(rank_peak_mem_gib=[]), "one entry per rank"),
    (lambda d: d.update(reduce_order="tree"), "reduce_order 'tree' is not rank or backend"),
])
def test_tampered_fast_evidence_fails_naming_the_claim(tmp_path: Path, edit, claim: str) -> None:
    failed = mfu_check.check(tampered(tmp_path, "dp1-fast.json", edit))
    assert failed and claim in failed[0], failed


@pytest.mark.parametrize(("edit", "claim"), [
    (lambda d: d.update(replay_match=False), "replay was asked but replay_match is False"),
    (lambda d: d.pop("replay_match"), "replay_match is None"),
    (lambda d: d.update(replay_leaf_root="0" * 64), "replay_leaf_root differs"),
])
def test_replay_claims(tmp_path: Path, edit, claim: str) -> None:
    failed = mfu_check.check(tampered(tmp_path, "dp1-deterministic.json", edit))
    assert failed and claim in failed[0], failed


def with_probes(d: dict) -> dict:
    """The record as a run with the kernel registry writes it: every active kernel's probe passed."""
    d["kernels"] = {"requested": ["loss", "norm"], "active": ["loss"], "rejected": {"norm": "probe failed: x"},
                    "probes": {"loss": {"passed": True, "reason": None, "seconds": 0.1},
                               "norm": {"passed": False, "reason": "x", "seconds": 0.1}}, "env": {}}
    return d


def test_kernel_probes_are_checked_where_recorded(tmp_path: Path) -> None:
    assert mfu_check.check(tampered(tmp_path, "dp1-fast.json", with_probes)) == []
    unprobed = mfu_check.check(tampered(tmp_path, "dp1-fast.json",
                                        lambda d: with_probes(d)["kernels"]["active"].append("norm")))
    assert "kernels ['norm'] ran without a passing probe" in unprobed[0]
    assert "recorded both active and rejected" in unprobed[1]


def test_bench_ratio_and_embedded_evidence_are_checked(tmp_path: Path) -> None:
    assert "ratio" in mfu_check.check(tampered(tmp_path, "bench-vs-reference.json",
                                               lambda d: d.update(ratio=1.5)))[0]
    failed = mfu_check.check(tampered(tmp_path, "bench-vs-reference.json", lambda d: d["ours"].update(mfu=2.0)))
    assert failed[0].startswith("ours: mfu 2.0")


def test_unreadable_file(tmp_path: Path) -> None:
    (tmp_path / "x.json").write_text("{not json")
    assert mfu_check.check(tmp_path / "x.json")[0].startswith("unreadable evidence")


# --- schema 2 (scripts/bench/bench_vs_reference.py): ours, deterministic, every reference, strongest, ratios ------


def _bench_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench", H200.parents[1] / "scripts/bench/bench_vs_reference.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def _bench_v2() -> dict:
    """A schema-2 record assembled by the bench script's own summarize() from committed H200 evidence."""
    bench = _bench_module()
    ours, det = (json.loads((H200 / n).read_text()) for n in ("dp1-fast.json", "dp1-deterministic.json"))
    for rec in (ours, det):
        rec["kernels"] = {"env": {}, "ce_chunk_tokens": 8192}
        rec |= {"ce_chunk_tokens": 8192, "ce_chunk_is_profile_default": True}
    v1 = json.loads((H200.parent / "h200-kernels" / "bench-vs-reference.json").read_text())["reference"]
    refs = []
    for name, slow in (("hf-layer", 1.0), ("hf+liger-layer", 0.98), ("hf+liger-model", 1.2)):
        times = [t * slow for t in v1["step_times_s"]]
        tps = v1["micro_batch"] * v1["seq_len"] * len(times) / sum(times)
        refs.append(v1 | {"name": name, "step_times_s": times, "tokens_per_s": tps, "warmup_steps": 3,
                          "peak_tflops": ours["peak_tflops"],
                          "mfu": tps * v1["flops_per_token"] / (ours["peak_tflops"] * 1e12),
                          "versions": {"torch": "2.11.0", "transformers": "5.17.0", "liger_kernel": "0.8.5"}})
    return bench.summarize({"schema": bench.SCHEMA, "profile": ours["profile"], "micro_batch": 16, "ours": ours,
                            "deterministic": det, "references": refs, "failed": {}})


def _write(tmp_path: Path, d: dict) -> Path:
    out = tmp_path / "bench-v2.json"
    out.write_text(json.dumps(d))
    return out


def test_bench_v2_assembled_record_is_valid_and_names_the_strongest(tmp_path: Path) -> None:
    d = _bench_v2()
    assert d["strongest"] == "hf+liger-layer" and d["met"].keys() == {"ratio_vs_strongest", "deterministic_vs_fast"}
    assert mfu_check.check(_write(tmp_path, d)) == []


def test_bench_v2_with_torchtitan_and_the_previous_fast_default(tmp_path: Path) -> None:
    """A torchtitan reference names torchtitan (not transformers) in its versions; previous_fast (the fast
    default before the norm / rope kernels) gives ours_vs_previous_fast and deterministic_vs_previous_fast."""
    d = _bench_v2()
    tt = d["references"][0] | {"name": "torchtitan", "versions": {"torch": "2.11.0", "torchtitan": "0.2.2"}}
    prev = json.loads(json.dumps(d["deterministic"]))  # any full, self-consistent run record
    d = _bench_module().summarize(d | {"references": [*d["references"], tt], "previous_fast": prev})
    assert abs(d["deterministic_vs_previous_fast"] - d["deterministic"]["mfu"] / prev["mfu"]) < 1e-12
    assert abs(d["ours_vs_previous_fast"] - d["ours"]["mfu"] / prev["mfu"]) < 1e-12
    assert d["met"]["deterministic_vs_previous_fast"] is True
    assert mfu_check.check(_write(tmp_path, d)) == []
    d["deterministic_vs_previous_fast"] *= 1.01
    assert "deterministic_vs_previous_fast" in mfu_check.check(_write(tmp_path, d))[0]


@pytest.mark.parametrize(("edit", "claim"), [
    (lambda d: d.update(strongest="hf-layer"), "is not the reference with the highest mfu"),
    (lambda d: d.update(ratio_vs_strongest=1.2), "ratio_vs_strongest"),
    (lambda d: d.update(deterministic_vs_fast=0.99), "deterministic_vs_fast"),
    (lambda d: d["met"].update(ratio_vs_strongest=True), "met.ratio_vs_strongest"),
    (lambda d: d["references"][1].update(mfu=0.9), "reference hf+liger-layer: mfu"),
    (lambda d: d["references"][0].update(peak_tflops=700.0), "another flops_per_token or peak"),
    (lambda d: d["references"][0]["versions"].pop("transformers"), "versions must name"),
    (lambda d: d["references"].clear(), "references: none measured"),
    (lambda d: d.pop("deterministic"), "deterministic: missing"),
    (lambda d: d["deterministic"].update(replay_match=False), "replay"),
    (lambda d: d["ours"]["kernels"]["env"].update(VH_CE_CHUNK="16384"), "kernel knobs ['VH_CE_CHUNK']"),
    (lambda d: d["ours"].update(ce_chunk_is_profile_default=False), "ce_chunk_is_profile_default"),
    (lambda d: d["ours"]["flags"].update(deterministic=True), "flags deterministic/replay"),
])
def test_bench_v2_tampered_fails_naming_the_claim(tmp_path: Path, edit, claim: str) -> None:
    d = _bench_v2()
    edit(d)
    failed = mfu_check.check(_write(tmp_path, d))
    assert failed and claim in failed[0], failed


@pytest.mark.slow
def test_bench_script_takes_earlier_runs_as_evidence_and_checker_wants_references(tmp_path: Path) -> None:
    """--ours-evidence/--deterministic-evidence (scripts/gpu/h200_kernels.sh): nothing is run again, the chunk
    is annotated, and a record without any reference is not evidence of a ratio."""
    import subprocess
    import sys

    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, str(H200.parents[1] / "scripts/bench/bench_vs_reference.py"), "--runs",
                           "ours,deterministic", "--ours-evidence", str(H200 / "dp1-fast.json"),
                           "--deterministic-evidence", str(H200 / "dp1-deterministic.json"), "--out", str(out)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    d = json.loads(out.read_text())
    assert d["ours"]["ce_chunk_is_profile_default"] is False and d["references"] == [] and "strongest" not in d
    assert d["deterministic_vs_fast"] == d["deterministic"]["mfu"] / d["ours"]["mfu"]
    assert mfu_check.check(out) == ["references: none measured"]


def test_bench_v2_baseline_fast_ratio_is_recomputed(tmp_path: Path) -> None:
    """fast-cudnn (the fast default before FA4) is the deterministic run's yardstick in issue 32."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench", H200.parents[1] / "scripts/bench/bench_vs_reference.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    d = _bench_v2()
    d["baseline_fast"] = json.loads(json.dumps(d["ours"]))
    d = bench.summarize(d)
    assert d["deterministic_vs_baseline_fast"] == d["deterministic"]["mfu"] / d["baseline_fast"]["mfu"]
    assert d["met"]["deterministic_vs_baseline_fast"] is (d["deterministic_vs_baseline_fast"] >= 1.0)
    assert mfu_check.check(_write(tmp_path, d)) == []
    d["deterministic_vs_baseline_fast"] = 1.5
    failed = mfu_check.check(_write(tmp_path, d))
    assert failed and "deterministic_vs_baseline_fast" in failed[0], failed
