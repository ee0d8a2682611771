"""The memory fit (vast_harness/spec/fit.py, market/requires.py, remote/host/fit.py): the profile's 1B runs read
from their settings, each offer judged by what its GPU holds, the design's own commands picking the design's
hardware on the simulator, and the host making the same decision from HT_FIT.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from remote.host import fit as host_fit
from tests.harness.clirun import cli
from vast_harness.errors import ConfigError
from vast_harness.market.requires import requires_reasons
from vast_harness.sim.market import CATALOG
from vast_harness.spec.fit import HOST_VAR, workload_fit
from vast_harness.spec.resolve import RunOptions, resolve
from vast_harness.vast.models import Offer

ROOT = Path(__file__).resolve().parents[2]
RAM_MIB = {g.name: g.ram_mb for g in CATALOG}
# The design's headline command and its proofs command, as its users type them (issue 48), on the simulator.
DESIGN_MFU = ["--profile", "mfu", "--num-gpus", "2", "--min-pcie-bw", "50", "--max-usd", "3", "--max-minutes", "50",
              "--remote-env", "HT_MFU_WORLDS=2", "--remote-env", "HT_MFU_COMPILE=1", "--remote-env", "HT_MFU_MB=8"]
DESIGN_PROOFS = ["--profile", "proofs", "--max-usd", "8", "--max-minutes", "45"]
SWEEP = [("mfu-sweep", "mfu-sweep"), ("replay", "mfu-replay")]


def offer(gpu: str, **extra: object) -> Offer:
    cap = {g.name: g.compute_cap for g in CATALOG}[gpu]
    return Offer.model_validate({"id": 1, "gpu_name": gpu, "num_gpus": 2, "gpu_ram": RAM_MIB[gpu], "compute_cap": cap,
                                 "cuda_max_good": 12.8} | extra)


def dry_run(*args: str, tmp_path: Path) -> dict:
    p = cli(*args, "--sim", "--dry-run", "--json", "--evidence-dir", str(tmp_path))
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout)


# --- the design's commands on the simulator -----------------------------------------------------------------


def test_the_designs_mfu_command_rents_the_designs_2x_rtx_5090_and_quotes_what_each_run_needs(tmp_path):
    plan = dry_run(*DESIGN_MFU, tmp_path=tmp_path)
    assert (plan["offer"]["gpu_name"], plan["offer"]["num_gpus"]) == ("RTX 5090", 2)
    runs = {r["run"]: r for r in plan["fit"]["runs"]}
    assert set(runs) == {"dp2-mb8-compile", "replay"}
    # micro-batch 8 at dp2 does not fit 31.8 GiB as asked (43.0 GiB measured allocated at dp2 on an H200): the
    # quote says it runs checkpointed, with what that needs, and what as asked would have needed
    sweep = runs["dp2-mb8-compile"]
    assert sweep["runs_as"] == "compile, act-ckpt" and sweep["need_gib"] <= plan["fit"]["gpu_gib"]
    assert sweep["needs_gib"]["none"] > plan["fit"]["gpu_gib"] > sweep["needs_gib"]["ckpt"]
    assert runs["replay"]["option"] in ("ckpt", "compile+ckpt") and not plan["fit"]["dropped"]
    assert "HT_FIT" in plan["remote_env"] and plan["remote_env"]["HT_ACT_CKPT"] == "auto"


def test_the_designs_proofs_command_rents_a_2x_rtx_5090_too(tmp_path):
    plan = dry_run(*DESIGN_PROOFS, tmp_path=tmp_path)
    assert (plan["offer"]["gpu_name"], plan["offer"]["num_gpus"]) == ("RTX 5090", 2)
    (round_,) = plan["fit"]["runs"]
    assert round_["run"] == "proof-round" and round_["world"] == 2 and round_["micro_batch"] == 8
    assert round_["need_gib"] <= plan["fit"]["gpu_gib"]
    assert plan["remote_env"]["HT_PROOF_WORLD"] == "2"
    assert "H100 SXM" not in json.dumps(plan["requires"])  # no GPU list: what the proofs need, not a family


def test_the_chosen_offer_is_the_cheapest_that_fits(tmp_path):
    """`offers` with the design's flags: every ranked offer fits, the first is a 2x RTX 5090, and an offer the
    fit refused is refused for memory its runs would use."""
    p = cli("offers", *DESIGN_MFU, "--sim", "--json", "--evidence-dir", str(tmp_path))
    assert p.returncode == 0, p.stderr[-3000:]
    data = json.loads(p.stdout)
    ranked = data["ranked"]
    assert ranked[0]["gpu"] == "RTX 5090" and ranked[0]["n"] == 2
    assert [r["worst_case_usd"] for r in ranked] == sorted(r["worst_case_usd"] for r in ranked)
    fits = {row["gpu"]: row for row in data["fit_by_gpu"]}
    assert all(fits[r["gpu"]]["fits"] for r in ranked)


# --- offers: which GPU families hold which micro-batch --------------------------------------------------------


def test_offers_shows_the_fit_per_gpu_family(tmp_path):
    p = cli("offers", "--profile", "mfu", "--sim", "--json", "--evidence-dir", str(tmp_path))
    assert p.returncode == 0, p.stderr[-3000:]
    fits = {row["gpu"]: row for row in json.loads(p.stdout)["fit_by_gpu"]}
    five = fits["RTX 5090"]
    assert [r["run"] for r in five["runs"]] == ["dp2-mb8-compile", "dp2-mb16-compile", "replay"]
    assert [r["runs_as"] for r in five["runs"][:2]] == ["compile, act-ckpt"] * 2 and five["fits"]
    largest = five["largest_micro_batch"]["dp2 compile"]
    assert largest["none"] < 8 <= 16 <= largest["ckpt"]  # 32 GB: under 8 as asked, 16 and more checkpointed
    h100 = fits["H100 SXM"]
    assert [r["runs_as"] for r in h100["runs"][:2]] == ["compile"] * 2  # 80 GB: as asked, no recompute
    text = cli("offers", "--profile", "mfu", "--sim", "--evidence-dir", str(tmp_path)).stdout
    assert "Memory fit per GPU" in text and "act-ckpt 26.7" in text and "largest micro-batch" in text


def test_offers_takes_the_settings_it_shows_the_fit_for(tmp_path):
    p = cli("offers", "--profile", "mfu", "--remote-env", "HT_MFU_MB=12", "--remote-env", "HT_ACT_CKPT=0", "--sim",
            "--json", "--evidence-dir", str(tmp_path))
    assert p.returncode == 0, p.stderr[-3000:]
    data = json.loads(p.stdout)
    fits = {row["gpu"]: row for row in data["fit_by_gpu"]}
    assert [r["run"] for r in fits["H200"]["runs"]] == ["dp2-mb12-compile", "replay"]
    assert not fits["RTX 5090"]["fits"]  # no checkpointing allowed: 32 GB holds neither
    assert all(r["gpu"] != "RTX 5090" for r in data["ranked"])


# --- what cannot fit -----------------------------------------------------------------------------------------


def test_a_micro_batch_no_offered_gpu_can_hold_is_exit_5_naming_the_need_and_the_largest_offer(tmp_path):
    p = cli(*DESIGN_MFU[:-2], "--remote-env", "HT_MFU_MB=4096", "--max-usd", "50", "--sim", "--dry-run",
            "--evidence-dir", str(tmp_path))
    assert p.returncode == 5, (p.stdout[-2000:], p.stderr[-2000:])
    said = " ".join(p.stderr.split())  # the console wraps long lines
    assert "micro-batch 4096 (dp2, compile) needs 1601.0 GiB per GPU even with activation checkpointing; the " \
           "largest GPU offered has 140.4 GiB (H200, offer" in said, said


def test_an_offer_too_small_for_the_requested_micro_batch_is_rejected_naming_the_largest_that_fits(tmp_path):
    spec = resolve(RunOptions(profile="mfu", sim=True, dry_run=True, state_dir=tmp_path,
                              remote_env=["HT_MFU_MB=8", "HT_MFU_WORLDS=2"]), environ={})
    reasons = requires_reasons(offer("RTX 4090"), spec.profile.requires, fit=spec.fit)
    assert any("micro-batch 8 (dp2, compile) needs 26.7 GiB per GPU even with activation checkpointing; 24.0 GiB "
               "here: the largest micro-batch that fits is 2 (activation checkpointing)" in r for r in reasons), reasons
    assert not requires_reasons(offer("RTX 5090"), spec.profile.requires, fit=spec.fit)


def test_a_sweep_drops_what_cannot_fit_on_that_gpu_and_says_so(tmp_path):
    plan = dry_run(*DESIGN_MFU[:-2], "--remote-env", "HT_MFU_MB=8 12 64", tmp_path=tmp_path)
    assert (plan["offer"]["gpu_name"], plan["offer"]["num_gpus"]) == ("RTX 5090", 2)
    assert plan["fit"]["dropped"] == ["dp2-mb64-compile"]
    runs = {r["run"]: r for r in plan["fit"]["runs"]}
    assert runs["dp2-mb64-compile"]["dropped"] and runs["dp2-mb64-compile"]["largest_micro_batch"] >= 12
    assert not runs["dp2-mb12-compile"]["dropped"]
    text = cli(*DESIGN_MFU[:-2], "--remote-env", "HT_MFU_MB=8 12 64", "--sim", "--dry-run",
               "--evidence-dir", str(tmp_path)).stdout
    assert "Memory fit on 2x RTX 5090" in text and "dropped: does not fit" in text


def test_no_gpu_is_dropped_for_memory_its_runs_would_not_use(tmp_path):
    """At the boundary: a GPU one tenth of a GiB over the need holds the profile, one under it does not."""
    spec = resolve(RunOptions(profile="mfu", sim=True, dry_run=True, state_dir=tmp_path), environ={})
    fit = spec.fit
    assert fit is not None and spec.profile.requires.min_gpu_ram_gib == round(fit.floor_gib, 2)
    for mib, ok in ((fit.floor_gib * 1024, True), ((fit.floor_gib - 0.1) * 1024, False)):
        assert (not requires_reasons(offer("RTX 5090", gpu_ram=mib), spec.profile.requires, fit=fit)) is ok


# --- the settings ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["8 x", "0", "-1", "8.5", "", "8,16", "٨", "99999"])
def test_an_ht_mfu_mb_that_is_not_a_list_of_positive_integers_is_refused(value):
    with pytest.raises(ConfigError, match="HT_MFU_MB=.*a list of positive integers"):
        workload_fit(SWEEP, {"HT_MFU_MB": value}, 2)


def test_a_bad_ht_mfu_mb_on_the_command_line_is_exit_2(tmp_path):
    p = cli(*DESIGN_MFU[:-2], "--remote-env", "HT_MFU_MB=8 big", "--sim", "--dry-run", "--evidence-dir", str(tmp_path))
    assert p.returncode == 2 and "HT_MFU_MB='8 big': a list of positive integers" in " ".join(p.stderr.split())


@pytest.mark.parametrize(("env", "needle"), [
    ({"HT_ACT_CKPT": "sometimes"}, "HT_ACT_CKPT='sometimes': 0 (never), 1 (always) or auto"),
    ({"HT_MFU_WORLDS": "4"}, "world size 4 needs 4 GPUs; the offer has 2"),
    ({"HT_MFU_WORLDS": "3"}, "HT_MFU_WORLDS: world size 3 needs 3 GPUs"),
    ({"HT_MFU_COMPILE": "yes"}, "HT_MFU_COMPILE='yes'"),
    ({"HT_MFU_REDUCTION": "fsdp"}, "HT_MFU_REDUCTION='fsdp': one of ddp, zero2, zero2o"),
])
def test_every_setting_the_fit_reads_is_checked(env, needle):
    with pytest.raises(ConfigError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        workload_fit(SWEEP, env, 2)


def test_a_world_without_a_model_profile_is_refused():
    with pytest.raises(ConfigError, match="no model profile for world size 3"):
        workload_fit(SWEEP, {"HT_MFU_WORLDS": "3"}, 4)


def test_the_fit_reads_the_same_settings_the_host_does():
    fit = workload_fit(SWEEP, {"HT_MFU_WORLDS": "1 2", "HT_MFU_MB": "8 16 8", "HT_MFU_COMPILE": "1 0",
                               "HT_MFU_EXTRA": "--act-ckpt"}, 2)
    assert fit is not None
    tags = [r.tag for r in fit.runs]
    assert tags == ["dp1-mb8-compile", "dp1-mb8-eager", "dp1-mb16-compile", "dp1-mb16-eager", "dp2-mb8-compile",
                    "dp2-mb8-eager", "dp2-mb16-compile", "dp2-mb16-eager", "replay"]
    assert all(r.options == ("ckpt",) for r in fit.runs[:-1])  # --act-ckpt in HT_MFU_EXTRA: always
    assert fit.runs[-1].world == 1  # the replay runs at the sweep's first world, as its step does
    single = workload_fit(SWEEP, {"HT_MFU_MB": "8", "HT_MFU_WORLDS": "2"}, 2)
    assert single is not None and not single.runs[0].droppable  # one micro-batch asked: it must fit


def test_ht_fit_is_the_harnesss_to_write(tmp_path):
    p = cli(*DESIGN_MFU, "--remote-env", "HT_FIT=replay=none:1", "--sim", "--dry-run", "--evidence-dir", str(tmp_path))
    assert p.returncode == 2 and "HT_FIT is written by the harness" in " ".join(p.stderr.split())


def test_a_setting_the_fit_reads_cannot_hide_as_a_secret(tmp_path):
    with pytest.raises(ConfigError, match="HT_MFU_MB: the memory fit reads it"):
        resolve(RunOptions(profile="mfu", sim=True, dry_run=True, state_dir=tmp_path,
                           remote_secret=["HT_MFU_MB=64"]), environ={})


def test_fleet_under_sim_runs_the_smoke_steps_and_so_has_no_fit(tmp_path):
    from vast_harness.fleet.plan import spec_for_gpu

    spec = resolve(RunOptions(profile="mfu", sim=True, dry_run=True, state_dir=tmp_path), environ={})
    assert spec.fit is not None
    assert spec_for_gpu(spec, "RTX 4090", 1.0).fit is None


# --- on the host ----------------------------------------------------------------------------------------------


def test_the_host_reads_what_the_harness_writes(tmp_path):
    spec = resolve(RunOptions(profile="mfu", sim=True, dry_run=True, state_dir=tmp_path), environ={})
    fit = spec.fit
    assert fit is not None
    parsed = host_fit.parse(spec.remote_env[HOST_VAR])
    assert list(parsed) == [r.tag for r in fit.runs]
    for run in fit.runs:
        assert parsed[run.tag] == [(o, round(g, 1)) for o, g in run.needs().items()]
        for gib in (24.0, 31.8, 79.6, 140.4):  # the same decision on both sides, on each catalog size
            placement = fit.on(gib * 1024).placements[[r.tag for r in fit.runs].index(run.tag)]
            flags, _ = host_fit.decide(run.tag, {HOST_VAR: spec.remote_env[HOST_VAR]}, gib)
            want = None if placement.option is None else host_fit.OPTION_FLAGS[placement.option]
            assert flags == want, (run.tag, gib)


def test_the_host_without_ht_fit_does_what_ht_act_ckpt_says():
    assert host_fit.decide("dp2-mb8-compile", {}, 32.0)[0] == []
    assert host_fit.decide("dp2-mb8-compile", {"HT_ACT_CKPT": "1"}, 32.0)[0] == ["--act-ckpt"]
    with pytest.raises(host_fit.FitError, match="no entry for 'replay'"):
        host_fit.decide("replay", {HOST_VAR: "dp2-mb8-compile=none:46.1"}, 32.0)
    with pytest.raises(host_fit.FitError, match="cannot read"):
        host_fit.parse("replay=fast:3")


def _fake_smi(bin_dir: Path, mib: int) -> None:
    bin_dir.mkdir(exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\necho {mib}\necho {mib}\n")
    smi.chmod(smi.stat().st_mode | stat.S_IXUSR)


def _host_env(tmp_path: Path, mib: int, fit_value: str) -> dict[str, str]:
    _fake_smi(tmp_path / "bin", mib)
    return {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", HOST_VAR: fit_value,
            "PYTHONPATH": str(ROOT)}


def test_a_step_runs_with_the_flags_the_host_needs_or_stops_naming_the_need(tmp_path):
    value = "replay=none:65.3,ckpt:41.8,compile+ckpt:26.7"
    echo = [sys.executable, "-c", "import sys; print(' '.join(sys.argv[1:]))", "--out", "x.json"]
    ran = subprocess.run([sys.executable, "-m", "remote.host.fit", "run", "replay", "--", *echo], cwd=tmp_path,
                         env=_host_env(tmp_path, 32607, value), capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split() == ["--out", "x.json", "--compile", "--act-ckpt"]
    assert "compile+ckpt (needs 26.7 GiB of 31.8 GiB per GPU)" in ran.stderr
    small = subprocess.run([sys.executable, "-m", "remote.host.fit", "run", "replay", "--", *echo], cwd=tmp_path,
                           env=_host_env(tmp_path, 24564, value), capture_output=True, text=True, timeout=60)
    assert small.returncode == 1 and not small.stdout
    assert "needs 26.7 GiB per GPU at least" in small.stderr and "this GPU has 24.0 GiB" in small.stderr


def test_the_sweep_on_the_host_drops_the_point_that_does_not_fit_and_checkpoints_the_one_that_needs_it(tmp_path):
    """scripts/vast_mfu_remote.sh with the harness's HT_FIT on a 32 GB GPU: mb 8 runs checkpointed (tag -ckpt),
    mb 64 is dropped and said, and the sweep passes."""
    bin_dir, log = tmp_path / "bin", tmp_path / "argv.log"
    _fake_smi(bin_dir, 32607)
    fake = bin_dir / "python3"  # the real python for the fit helper; torchrun and the checks only logged
    fake.write_text(f"""#!/bin/bash
if [ "$1 $2" = "-m remote.host.fit" ]; then exec {sys.executable} "$@"; fi
echo "$*" >> {log}
prev=""
for a in "$@"; do [ "$prev" = --out ] && echo '{{}}' > "$a"; prev="$a"; done
exit 0
""")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    fit = workload_fit(SWEEP, {"HT_MFU_WORLDS": "2", "HT_MFU_MB": "8 64", "HT_ACT_CKPT": "auto"}, 2)
    assert fit is not None
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HT_MFU_WORLDS": "2", "HT_MFU_MB": "8 64", "HT_MFU_OUT": str(tmp_path / "ev"),
           HOST_VAR: fit.host_value(), "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "vast_mfu_remote.sh")], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "-- dp2-zero2o-mb64-compile-p2pon dropped: it does not fit this GPU" in proc.stdout
    runs = [line for line in log.read_text().splitlines() if "run_mfu_dist.py" in line]
    assert len(runs) == 1 and "--micro-batch 8 " in runs[0] and "--act-ckpt" in runs[0]
    assert (tmp_path / "ev" / "mfu-dp2-zero2o-mb8-compile-ckpt-p2pon.json").exists()


def test_the_rtx_5090_attention_path_is_recorded_as_expected_not_measured():
    """profiles/attention-qualification.json's sm_120 row says what the code would do there, from sources: it
    must agree with the code (FA4's qualified architectures, the probe orders, the paths the evidence accepts)."""
    pytest.importorskip("torch")
    from remote.attention import backend, fa4
    from remote.training.profiles import load_profile as load_model

    rows = json.loads((ROOT / "profiles" / "attention-qualification.json").read_text())["expected"]
    (row,) = [r for r in rows if r["gpu"] == "NVIDIA GeForce RTX 5090"]
    assert row["measured"] is False and row["compute_capability"] == "12.0"
    assert 12 not in fa4.QUALIFIED_MAJORS and "refused before any probe" in row["fast"]["fa4"]
    assert row["fast"]["order"] == backend.FAST_ORDER["cuda"]
    assert row["deterministic"]["order"] == backend.DETERMINISTIC_ORDER["cuda"]
    required = load_model("mfu-dense-1b-dp2").required_attention
    assert {"cudnn", "cudnn-det", "flash"} <= set(required) and row["fast"]["chosen"] in required
