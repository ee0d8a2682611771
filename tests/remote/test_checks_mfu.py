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


def test_bench_ratio_and_embedded_evidence_are_checked(tmp_path: Path) -> None:
    assert "ratio" in mfu_check.check(tampered(tmp_path, "bench-vs-reference.json",
                                               lambda d: d.update(ratio=1.5)))[0]
    failed = mfu_check.check(tampered(tmp_path, "bench-vs-reference.json", lambda d: d["ours"].update(mfu=2.0)))
    assert failed[0].startswith("ours: mfu 2.0")


def test_unreadable_file(tmp_path: Path) -> None:
    (tmp_path / "x.json").write_text("{not json")
    assert mfu_check.check(tmp_path / "x.json")[0].startswith("unreadable evidence")
