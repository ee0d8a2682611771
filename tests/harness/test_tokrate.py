"""`offers --rank-by usd-per-mtok`: measured tokens/s from committed evidence and the user's real fleet results,
the figure and its source named per offer, $/h (said so) for GPUs with no measurement."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.harness.clirun import cli
from vast_harness.market.token_rate import gpu_key, load_measurements

KEY = "sim-tokrate-key"


SIM_OPTIONS = dict(seed=0, rate_scale=0.01, num_offers=1000)  # conftest.sim


def offers(sim, evidence_dir: Path, *extra: str) -> dict:
    p = cli("offers", "--profile", "mfu", "--num-gpus", "1", "--min-pcie-bw", "0", "--rank-by", "usd-per-mtok", "--json",
            "--evidence-dir", str(evidence_dir), *extra, sim=sim, key=KEY)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def test_gpu_names_match_by_their_distinguishing_words():
    assert gpu_key("NVIDIA H200") == gpu_key("H200")
    assert gpu_key("NVIDIA H100 80GB HBM3") == gpu_key("H100 SXM")
    assert gpu_key("NVIDIA GeForce RTX 4090") == gpu_key("RTX 4090")
    assert gpu_key("H200 NVL") != gpu_key("NVIDIA H200")
    assert gpu_key("H100 PCIE") != gpu_key("H100 SXM")


@pytest.mark.slow
def test_committed_h200_evidence_ranks_h200_first_and_others_fall_back_to_dph(sim, tmp_path):
    doc = offers(sim, tmp_path)
    ranked = doc["ranked"]
    h200 = [r for r in ranked if r["gpu"] == "H200"]
    assert h200 and all(r["usd_per_mtok"] is not None for r in h200)
    for r in h200:
        assert r["usd_per_mtok"] == pytest.approx(r["dph"] / (r["tokens_per_s"] * 3600 / 1e6), rel=1e-3)
        assert ".evidence/h200" in r["basis"]  # where the figure came from
    others = [r for r in ranked if r["usd_per_mtok"] is None]
    assert others and all("ranked by $/h" in r["basis"] for r in others)
    assert ranked.index(h200[-1]) < ranked.index(others[0])  # measured first
    assert [r["dph"] for r in others] == sorted(r["dph"] for r in others)
    assert any(m["source"].startswith(".evidence/h200") for m in doc["measurements"])


@pytest.mark.slow
def test_a_real_fleet_result_is_used_and_a_simulated_one_is_not(sim, tmp_path):
    def fleet(name: str, sim_flag: bool, tps: float) -> None:
        d = tmp_path / name
        d.mkdir()
        (d / "fleet-result.json").write_text(json.dumps({"sim": sim_flag, "rows": [
            {"gpu": "RTX 4090", "tokens_per_s": tps, "tokens_per_s_per_gpu": tps, "mfu": 0.4}]}))

    fleet("fleet-sim", True, 999_999.0)
    assert not [m for m in load_measurements(tmp_path) if "RTX 4090" in m.gpu_name]
    fleet("fleet-real", False, 20_000.0)
    doc = offers(sim, tmp_path, "--profile", "smoke")  # mfu's [requires] drops a 24 GB card
    rtx = [r for r in doc["ranked"] if r["gpu"] == "RTX 4090"]
    assert rtx and all(r["tokens_per_s"] == 20_000.0 and "fleet-real" in r["basis"] for r in rtx)
