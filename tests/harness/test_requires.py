"""A profile's `[requires]`: validated naming the field, checked on every offer before renting, and said per
dropped GPU family by `offers` and `--dry-run`. The mfu and proofs profiles never pick a GPU they cannot
measure (no sourced bf16 peak) or that is too small for their micro-batches (the memory fit: test_fit.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.harness.clirun import cli
from vast_harness.errors import ConfigError
from vast_harness.market.offers import OfferCriteria, build_query, check_offer
from vast_harness.market.peaks import load_peaks
from vast_harness.market.requires import dropped_families, requires_reasons
from vast_harness.sim.market import CATALOG
from vast_harness.spec.profile import Filters, load_profile
from vast_harness.spec.requires import Requires
from vast_harness.spec.resolve import RunOptions, resolve
from vast_harness.vast.models import Offer

ROOT = Path(__file__).resolve().parents[2]
RAM_MIB = {g.name: g.ram_mb for g in CATALOG}
# A peak, capability 8.0 and a fixed 76 GiB floor (what the mfu profile required before its memory was fitted
# from its settings): the checks themselves, on plain requirements.
MFU_NEEDS = Requires(sourced_bf16_peak=True, min_gpu_ram_gib=76, min_compute_cap=8.0)


def offer(gpu: str, **extra: object) -> Offer:
    cap = {g.name: g.compute_cap for g in CATALOG}.get(gpu, 800)
    return Offer.model_validate({"id": hash(gpu) % 10_000_000, "gpu_name": gpu, "num_gpus": 1, "gpu_ram": RAM_MIB.get(gpu),
                                 "compute_cap": cap, "cuda_max_good": 12.8} | extra)


@pytest.mark.parametrize(("gpu", "reasons"), [
    ("H100 SXM", []),
    ("H200", []),
    ("A100 SXM4", []),
    ("RTX 3090", ["no sourced bf16 peak for RTX 3090 (remote/peaks.json)", "GPU memory 24.0 GiB < 76 GiB"]),
    ("L40S", ["no sourced bf16 peak for L40S (remote/peaks.json)", "GPU memory 45.0 GiB < 76 GiB"]),
    ("RTX 4090", ["GPU memory 24.0 GiB < 76 GiB"]),
    ("A100 PCIE", ["GPU memory 40.0 GiB < 76 GiB"]),
])
def test_each_offer_is_checked_against_the_requirements(gpu, reasons):
    assert requires_reasons(offer(gpu), MFU_NEEDS) == reasons


def test_an_unsourced_peak_row_is_refused_like_no_row():
    assert load_peaks().sourced_tflops("H200 NVL") is None  # known, peak unconfirmed (tflops 0)
    assert "no sourced bf16 peak for H200 NVL" in requires_reasons(offer("H200 NVL", gpu_ram=143771), MFU_NEEDS)[0]


def test_missing_or_non_finite_figures_fail_a_requirement():
    assert requires_reasons(offer("H100 SXM", gpu_ram=None), MFU_NEEDS) == ["GPU memory unknown < 76 GiB"]
    assert requires_reasons(offer("H100 SXM", gpu_ram=float("nan")), MFU_NEEDS)
    assert requires_reasons(offer("H100 SXM", compute_cap=None), MFU_NEEDS) == ["compute capability unknown < 8"]
    assert requires_reasons(offer("H100 SXM", cuda_max_good=12.2), Requires(min_cuda=12.8)) == [
        "driver CUDA 12.2 < 12.8"]
    assert requires_reasons(offer("RTX 4090"), Requires(gpu_names=["H100 SXM", "H200"])) == [
        "RTX 4090 is not one of the GPUs it runs on (H100 SXM, H200)"]


def test_dropped_offers_are_said_once_per_family():
    families = dropped_families([offer("RTX 3090", id=1), offer("RTX 3090", id=2), offer("H100 SXM", id=3),
                                 offer("RTX 4090", id=4)], MFU_NEEDS)
    assert [(f.gpu, f.offers) for f in families] == [("RTX 3090", 2), ("RTX 4090", 1)]
    assert families[0].line() == ("RTX 3090 (2 offers): no sourced bf16 peak for RTX 3090 (remote/peaks.json); "
                                  "GPU memory 24.0 GiB < 76 GiB")


def test_requires_narrow_the_search_and_are_checked_again_on_the_answer():
    criteria = OfferCriteria(filters=Filters(gpu_names=["H100 SXM", "RTX 3090"], min_gpu_ram_gb=10), image_cuda=12.8,
                             disk_gb=20, min_duration_s=60, max_minutes=10, max_usd=5,
                             requires=Requires(gpu_names=["H100 SXM", "H200"], min_gpu_ram_gib=76, min_compute_cap=8.0))
    query = build_query(criteria)
    assert query["gpu_ram"] == {"gte": 76 * 1024} and query["compute_cap"] == {"gte": 800}
    assert query["gpu_name"] == {"in": ["H100 SXM"]}  # the filters' names that it can run on
    unnarrowed = build_query(criteria, with_requires=False)
    assert unnarrowed["gpu_ram"] == {"gte": 10_000} and "compute_cap" not in unnarrowed
    assert any("is not one of the GPUs" in r for r in check_offer(offer("RTX 3090"), criteria))


@pytest.mark.parametrize(("table", "field"), [
    ('min_gpu_ram_gib = "lots"', "requires.min_gpu_ram_gib"),
    ("min_gpu_ram_gib = -1", "requires.min_gpu_ram_gib"),
    ("min_compute_cap = 0.5", "requires.min_compute_cap"),
    ("min_cuda = inf", "requires.min_cuda"),
    ('gpu_names = ["H100 SXM", "H100 SXM"]', "requires.gpu_names"),
    ('gpu_names = [""]', "requires.gpu_names.0"),
    ('sourced_bf16_peak = "yes"', "requires.sourced_bf16_peak"),
    ("min_gpu_ram_gb = 80", "requires.min_gpu_ram_gb"),  # an unknown key: the GiB field is named for its unit
])
def test_a_bad_requires_table_is_refused_naming_the_field(tmp_path, table, field):
    text = (ROOT / "profiles/harness/smoke.toml").read_text() + f"\n[requires]\n{table}\n"
    path = tmp_path / "p.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=rf"field {field.replace('.', '[.]')}:"):
        load_profile(str(path))


@pytest.mark.parametrize("name", ["mfu", "proofs"])
def test_the_gpu_profiles_declare_what_they_can_run_on(name):
    """A peak to divide by and capability 8.0 (bf16, the fast attention paths); no GPU list and no memory
    number: the memory follows from what the steps run (their `fit`), and nothing they run needs Hopper."""
    profile = load_profile(name)
    assert profile.requires == Requires(sourced_bf16_peak=True, min_compute_cap=8.0)
    assert not profile.filters.gpu_names and [s.fit for s in profile.steps if s.fit]


@pytest.mark.parametrize("name", ["mfu", "proofs"])
def test_the_memory_floor_a_run_is_held_to_is_its_fits(name, tmp_path):
    spec = resolve(RunOptions(profile=name, sim=True, dry_run=True, state_dir=tmp_path), environ={})
    assert spec.fit is not None and spec.profile.requires.min_gpu_ram_gib == round(spec.fit.floor_gib, 2)
    narrowed = resolve(RunOptions(profile=name, sim=True, dry_run=True, state_dir=tmp_path, min_gpu_ram_gb=100),
                       environ={})
    assert narrowed.profile.requires.min_gpu_ram_gib == pytest.approx(97.66)  # a stricter floor of the user's wins


def test_the_mfu_dry_run_on_the_simulator_picks_a_gpu_it_can_measure_and_says_why_others_were_dropped(tmp_path):
    p = cli("--profile", "mfu", "--sim", "--dry-run", "--json", "--evidence-dir", str(tmp_path))
    assert p.returncode == 0, p.stderr[-3000:]
    plan = json.loads(p.stdout)
    gpu = plan["offer"]["gpu_name"]
    assert load_peaks().sourced_tflops(gpu) is not None and not plan["fit"]["dropped"], gpu
    assert all(r["need_gib"] <= RAM_MIB[gpu] / 1024 for r in plan["fit"]["runs"])
    assert plan["requires"] == {"sourced_bf16_peak": True, "min_gpu_ram_gib": 26.7, "min_compute_cap": 8.0}
    dropped = {f["gpu"]: f["reasons"] for f in plan["dropped_by_requires"]}
    # the case: the seeded --sim market's cheapest 2-GPU offer was a 2x RTX 3090 the sweep refuses
    assert "no sourced bf16 peak for RTX 3090 (remote/peaks.json)" in dropped["RTX 3090"]
    assert any("needs 26.7 GiB per GPU even with" in r and "24.0 GiB here" in r for r in dropped["RTX 3090"])


@pytest.mark.slow
def test_the_proofs_dry_run_on_the_simulator_picks_a_gpu_it_can_measure(tmp_path):
    p = cli("--profile", "proofs", "--sim", "--dry-run", "--json", "--evidence-dir", str(tmp_path))
    assert p.returncode == 0, p.stderr[-3000:]
    plan = json.loads(p.stdout)
    gpu = plan["offer"]["gpu_name"]
    assert load_peaks().sourced_tflops(gpu) is not None and plan["offer"]["num_gpus"] == 2
    assert plan["requires"]["min_compute_cap"] == 8.0 and "gpu_names" not in plan["requires"]
    assert [r["run"] for r in plan["fit"]["runs"]] == ["proof-round"]


def test_the_dry_run_table_prints_the_dropped_families(tmp_path):
    p = cli("--profile", "mfu", "--sim", "--dry-run", "--evidence-dir", str(tmp_path))
    assert p.returncode == 0, p.stderr[-3000:]
    assert "requires: sourced_bf16_peak=True, min_gpu_ram_gib=26.7" in p.stdout
    assert "  dropped RTX" in p.stdout and "GiB here" in p.stdout


@pytest.mark.slow
def test_offers_ranks_only_qualifying_gpus_and_names_the_dropped_families(tmp_path):
    p = cli("offers", "--sim", "--json", "--evidence-dir", str(tmp_path))
    assert p.returncode == 0, p.stderr[-3000:]
    data = json.loads(p.stdout)
    fits = {row["gpu"]: row["fits"] for row in data["fit_by_gpu"]}
    assert data["ranked"] and all(fits[r["gpu"]] and load_peaks().sourced_tflops(r["gpu"]) for r in data["ranked"])
    assert data["requires"]["min_gpu_ram_gib"] == 26.7 and data["dropped_by_requires"]
