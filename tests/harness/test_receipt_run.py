"""The receipt in whole runs on the simulator: a host lying in each of the five ways is refused after its receipt,
deleted and proven gone before the next offer is rented, its machine remembered and skipped by the next run;
when no offer passes the run exits 1 naming the measure, the measured and the expected value; an image without
torch is "not measured" (a refusal only where the profile gates on the receipt); the caps hold throughout.
Judged by the simulator's own record (`/_sim/state`: the receipt each host answered, when each command started).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import SecretStr

from tests.harness.clirun import cli
from tests.harness.sim_receipts import sim_offer, sim_receipt
from vast_harness.console.output import Output
from vast_harness.host.bundle import bundle_for
from vast_harness.market.plan import plan_run
from vast_harness.run.runner import GuardedRun
from vast_harness.sim import SimServer
from vast_harness.spec.profile import Step, load_driver_policy, load_profile
from vast_harness.spec.receipt import ReceiptPolicy
from vast_harness.spec.resolve import RunOptions, RunSpec, resolve
from vast_harness.state.machines import EMBEDDED_SIM, MachineHistory
from vast_harness.vast.client import VastClient

SCALE = 0.01
KEY = "sim-receipt-key"
SIM_OPTIONS = dict(seed=44, rate_scale=SCALE, boot_seconds=0.1, num_offers=400)  # conftest.sim
pytestmark = pytest.mark.usefixtures("clean_sim")
COPY_RECEIPT = load_profile("mfu").steps[2]  # the mfu profile's own step: the host's receipt into its evidence


def make_spec(sim: SimServer, home: Path, *, boot_retries: int = 1, gpu: str = "H100 SXM",
              receipt: ReceiptPolicy | None = None, steps: list[Step] | None = None) -> RunSpec:
    spec = resolve(RunOptions(profile="smoke", sim=True, evidence_dir=home / "ev", state_dir=home / "state" / "sim",
                              proof_interval_s=0.05, max_usd=5.0, max_minutes=5.0), environ={})
    prof = spec.profile.model_copy(update={
        "steps": steps or [Step(name="work", run="echo worked > evidence/w.txt", timeout_s=20), COPY_RECEIPT],
        **({"receipt": receipt} if receipt is not None else {})})
    return spec.model_copy(update={"profile": prof, "filters": spec.filters.model_copy(update={"gpu_names": [gpu]}),
                                   "api_url": sim.url, "api_key": SecretStr(KEY),
                                   "boot_retries": boot_retries}).with_timings(teardown_margin_s=2.0)


def run(spec: RunSpec) -> tuple[GuardedRun, Any]:
    with VastClient(KEY, base_url=spec.api_url, pacing_scale=SCALE) as client:
        guarded = GuardedRun(spec, client, load_driver_policy(), Output(quiet=True))
        result = guarded.execute()
    return guarded, result


def mine(sim: SimServer, guarded: GuardedRun) -> list[dict[str, Any]]:
    state = httpx.get(f"{sim.url}/_sim/state", timeout=10).json()
    return sorted((i for i in state["instances"] if i["label"] and guarded.run_id in i["label"]),
                  key=lambda i: i["created_at"])


def record(guarded: GuardedRun) -> dict[str, Any]:
    return json.loads((guarded.ev.dir / "harness-result.json").read_text())


LIES = {  # fault -> the measures its receipt fails on
    "pcie_slow:0.4:1": {"h2d"},
    "gpu_slow:0.6:1": {"matmul", "burn"},
    "hbm_slow:0.5:1": {"hbm_copy"},
    "throttle:5:1": {"burn", "throttle"},
    "ecc_error:1": {"ecc"},
}


@pytest.mark.parametrize("fault", sorted(LIES))
def test_a_lying_host_of_each_kind_is_refused_and_replaced_within_the_caps(sim, tmp_path, fault):
    sim.set_faults(fault)
    guarded, result = run(spec := make_spec(sim, tmp_path))
    assert result.exit_code == 0, result.message
    liar, honest = mine(sim, guarded)
    assert liar["receipt_faults"] and not honest["receipt_faults"]
    assert not liar["live"] and not honest["live"] and liar["destroyed_at"] <= honest["created_at"]
    assert liar["machine_id"] != honest["machine_id"]
    # nothing ran on the liar after its receipt: no upload's unpack, no step
    assert liar["receipt"] is not None and all(t < liar["receipt"]["started_unix"] for t in liar["exec_times"])
    assert any(t > honest["receipt"]["started_unix"] for t in honest["exec_times"])  # the work ran there
    rec = record(guarded)
    refused, ran = rec["receipts_refused"], rec["receipt"]
    assert [r["instance_id"] for r in refused] == [liar["id"]] and refused[0]["verdict"] == "failed"
    assert {c["measure"] for c in refused[0]["checks"] if c["verdict"] == "fail"} <= LIES[fault] | {"spread"}
    assert ran["instance_id"] == honest["id"] and ran["verdict"] == "passed" and ran["simulated"]
    assert (guarded.ev.dir / refused[0]["file"]).is_file() and (guarded.ev.dir / ran["file"]).is_file()
    # the caps: every instance's life inside the time cap, every dollar inside the cost cap
    assert sum(i["billed_usd"] for i in (liar, honest)) <= spec.caps.max_usd
    assert max(i["destroyed_at"] for i in (liar, honest)) - guarded.state.t0_unix <= spec.max_seconds
    assert ran["billed_usd"] > 0 and ran["wall_s"] > 0 and rec["timings"]["receipt_s"] > 0
    # the machines' history: the liar's machine skipped from now on, with what failed
    history = MachineHistory(spec.state_dir)
    assert history.skipped(EMBEDDED_SIM) == {liar["machine_id"]}
    report = " ".join((guarded.ev.dir / "report.html").read_text().split())
    assert "refused on their receipt: instance " + str(liar["id"]) in report and "receipt-checks" in report
    # the steps found the receipt on the host (VH_RECEIPT): the mfu sweep's fraction of it reads this file
    assert json.loads((guarded.ev.dir / "remote" / "receipt.json").read_text()) == honest["receipt"]


def test_when_no_offer_passes_the_run_exits_1_naming_measure_measured_and_expected(sim, tmp_path):
    sim.set_faults("gpu_slow:0.5:*")
    guarded, result = run(make_spec(sim, tmp_path, boot_retries=1))
    assert result.exit_code == 1
    assert "no host passed its receipt after 2 attempt(s)" in result.message
    assert "GPU 0 matmul" in result.message and "TFLOP/s, expected >= " in result.message
    assert "(90% of the reference " in result.message
    hosts = mine(sim, guarded)
    assert len(hosts) == 2 and not any(i["live"] for i in hosts)
    rec = record(guarded)
    assert rec["receipt"] is None and len(rec["receipts_refused"]) == 2 and rec["absence"]["verdict"] == "gone"


def test_a_machine_that_failed_is_skipped_next_time_until_it_is_forgotten(sim, tmp_path):
    sim.set_faults("pcie_slow:0.3:1")
    guarded, result = run(spec := make_spec(sim, tmp_path))
    assert result.exit_code == 0, result.message
    bad = mine(sim, guarded)[0]["machine_id"]
    sim.set_faults(None)
    with VastClient(KEY, base_url=sim.url, pacing_scale=SCALE) as client:
        plan = plan_run(spec, client, load_driver_policy(), bundle_for(spec))
    assert plan.chosen.offer.machine_id != bad and plan.skipped_machines == 1
    listed = cli("machines", "--sim", "--json", home=tmp_path)
    assert listed.returncode == 0, listed.stderr
    doc = json.loads(listed.stdout)
    row = next(m for m in doc["machines"] if m["machine_id"] == bad)
    assert doc["skipped"] == [bad] and row["last_verdict"] == "failed" and row["failed"][0]["measure"] == "h2d"
    assert "expected >= " in row["failed"][0]["line"] and row["last_unix"] > 0
    table = cli("machines", "--sim", home=tmp_path)
    assert str(bad) in table.stdout and "SKIPPED" in table.stdout and "h2d" in table.stdout
    forgot = cli("machines", "--sim", "--forget", str(bad), "--json", home=tmp_path)
    assert forgot.returncode == 0 and json.loads(forgot.stdout)["skipped"] == []
    with VastClient(KEY, base_url=sim.url, pacing_scale=SCALE) as client:
        again = plan_run(spec, client, load_driver_policy(), bundle_for(spec))
    assert again.chosen.offer.machine_id == bad and again.skipped_machines == 0
    unknown = cli("machines", "--sim", "--forget", "1", home=tmp_path)
    assert unknown.returncode == 2 and "no machine 1" in unknown.stderr


NO_TORCH_IMAGE = "nvidia/cuda:base-cuda12.8@sha256:" + "a" * 64


def test_an_image_without_torch_is_not_measured_and_the_run_goes_on(tmp_path):
    (tmp_path / "wd").mkdir()
    (tmp_path / "wd" / "train.py").write_text("print('hello')\n")
    done = cli("run", "--sim", "--image", NO_TORCH_IMAGE, "--workdir", str(tmp_path / "wd"), "--", "echo", "hello",
               home=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "receipt not measured: no torch in this image" in " ".join(done.stderr.split())
    result = json.loads(next((tmp_path / "state" / "sim").glob("*/harness-result.json")).read_text())
    assert result["receipt"]["verdict"] == "not_measured" and "no torch" in result["receipt"]["reason"]


def test_a_profile_that_gates_on_the_receipt_refuses_a_host_that_cannot_measure(tmp_path):
    profile = tmp_path / "gated.toml"
    text = (Path(__file__).resolve().parents[2] / "profiles/harness/smoke.toml").read_text()
    profile.write_text(text.replace("pytorch/pytorch:2.11.0-cuda12.8-cudnn9-runtime@", "nvidia/cuda:base-cuda12.8@")
                       + '\n[receipt]\nh2d = "gate"\n')
    refused = cli("--profile", str(profile), "--sim", home=tmp_path)
    assert refused.returncode == 1, refused.stderr
    said = " ".join((refused.stderr + refused.stdout).split())  # the console wraps long lines
    assert "no host passed its receipt after 2 attempt(s)" in said
    assert "the profile gates on h2d ([receipt]) and this host could not measure: no torch" in said


def test_with_the_receipt_off_no_host_is_measured(sim, tmp_path):
    guarded, result = run(make_spec(sim, tmp_path, receipt=ReceiptPolicy(enabled=False),
                                    steps=[Step(name="work", run="true", timeout_s=20)]))
    assert result.exit_code == 0, result.message
    assert [i["receipt"] for i in mine(sim, guarded)] == [None]
    assert record(guarded)["receipt"]["verdict"] == "off"


def test_a_cap_too_short_for_boot_receipt_and_teardown_is_exit_2_before_renting(sim, tmp_path):
    """Red team r43: a cap that could never fit the receipt rented, paid, and ended at exit 6 before any work."""
    guarded, result = run(make_spec(sim, tmp_path).with_timings(receipt_min_s=10_000.0))
    assert result.exit_code == 2 and "the least receipt" in result.message, result.message
    assert mine(sim, guarded) == []


def test_a_receipt_budget_below_its_least_is_exit_2_naming_it():
    from vast_harness.errors import ConfigError
    from vast_harness.spec.receipt import check_receipt_budget
    from vast_harness.timings import Timings

    with pytest.raises(ConfigError, match=r"budget_s = 20 is below the least a receipt runs in here \(30 s"):
        check_receipt_budget(ReceiptPolicy.model_validate({"budget_s": 20}), Timings.real())
    check_receipt_budget(ReceiptPolicy.model_validate({"budget_s": 20, "enabled": False}), Timings.real())


def test_a_boot_that_eats_the_receipts_room_stops_the_run_at_the_cap(sim, tmp_path):
    """The cap fits boot, the least receipt and teardown on paper; a 5 s scheduling wait leaves the receipt less
    than its least: exit 6 before the receipt, the host deleted and proven gone."""
    sim.set_faults("scheduling:5")
    spec = make_spec(sim, tmp_path, receipt=ReceiptPolicy.model_validate({"budget_s": 600}))
    spec = spec.with_timings(min_boot_s=0.0, receipt_grace_s=0.0, receipt_min_s=293.0)  # the cap: 300 s, margin 2
    guarded, result = run(spec)
    assert result.exit_code == 6 and "before the receipt of instance" in result.message, result.message
    assert [i["live"] for i in mine(sim, guarded)] == [False] and record(guarded)["absence"]["verdict"] == "gone"


# ------------------------------------------------------------------------------ the chaos suite's judge
def _sim_answer(faults: dict[str, float], started: float) -> dict[str, Any]:
    offer = sim_offer(random.Random(5), "H100 SXM") | {"num_gpus": 1, "pcie_bw": 50.0, "gpu_lanes": 16}
    doc = sim_receipt(offer, 7, faults) | {"started_unix": started}
    return {"receipt": doc, "offer_figures": offer, "receipt_faults": faults}


def test_the_chaos_judge_catches_work_on_a_host_whose_receipt_failed_and_a_healthy_host_refused(tmp_path):
    from vast_harness.chaos.judge import receipt_violations

    liar = {"id": 1, "exec_times": [99.0, 99.5]} | _sim_answer({"gpu_slow": 0.5}, 100.0)
    honest = {"id": 2, "exec_times": [101.0, 150.0]} | _sim_answer({}, 120.0)
    policy = ReceiptPolicy()
    assert receipt_violations([liar, honest], 0, policy, None) == []
    used = liar | {"exec_times": [99.0, 100.5]}
    found = receipt_violations([used, honest], 0, policy, None)
    assert [v.kind for v in found] == ["receipt_failed_used"] and "ran 1 command(s) after it" in found[0].detail
    assert [v.kind for v in receipt_violations([liar], 0, policy, None)] == ["receipt_failed_used"]
    assert receipt_violations([liar], 1, policy, None) == []
    (tmp_path / "harness-result.json").write_text(json.dumps({"receipts_refused": [
        {"instance_id": 2, "verdict": "failed", "reason": "GPU 0 h2d ..."}]}))
    assert [v.kind for v in receipt_violations([liar, honest], 1, policy, tmp_path)] == ["healthy_refused"]


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["pcie_slow:0.3:1", "gpu_slow:0.5:1", "hbm_slow:0.4:1", "throttle:3:1",
                                   "ecc_error:1"])
def test_a_chaos_scenario_with_a_lying_host_holds_every_invariant(tmp_path, fault):
    from vast_harness import chaos
    from vast_harness.chaos.engine import ScenarioPlan

    plan = ScenarioPlan(seed=11, faults=f"{fault};seed=11", cap_mode="generous", max_minutes=1.0, boot_retries=1,
                        proof_interval_s=0.05, step_sleep_s=0.1, step_rc=0, steps=1)
    outcome = chaos.run_scenario(plan, tmp_path)
    assert outcome.exit_code == 0, outcome.message
    assert outcome.faults_fired.get(fault.split(":")[0]) and not outcome.violations, outcome.violations
