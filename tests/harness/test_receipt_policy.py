"""A profile's `[receipt]` (spec/receipt.py): the defaults, a table merged over them, and every bad input refused
with exit 2 before anything is rented, naming it: a threshold that is not a positive number, an unknown measure,
a threshold a measure does not take, and a gate on a measure the GPUs to be rented cannot report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.harness.clirun import cli
from vast_harness.errors import ConfigError
from vast_harness.spec.receipt import DEFAULT_RULES, ReceiptPolicy
from vast_harness.spec.resolve import RunOptions, resolve

ROOT = Path(__file__).resolve().parents[2]
SMOKE = (ROOT / "profiles" / "harness" / "smoke.toml").read_text()


def profile_with(tmp_path: Path, receipt: str, *, gpus: list[str] | None = None, num_gpus: int = 1) -> Path:
    text = SMOKE.replace("num_gpus = 1", f"num_gpus = {num_gpus}")
    if gpus is not None:
        text = text.replace("[filters]\n", f"[filters]\ngpu_names = {gpus!r}\n".replace("'", '"'))
    path = tmp_path / "mine.toml"
    path.write_text(text + "\n[receipt]\n" + receipt + "\n")
    return path


def test_the_defaults_gate_like_for_like_and_record_the_rest():
    policy = ReceiptPolicy()
    assert policy.enabled and policy.budget_s == 90 and not policy.gates_declared
    assert policy.rule("matmul").min_of_reference == 0.9 and policy.rule("h2d").min_of_offer == 0.7
    assert policy.rule("d2h").action == "record" and policy.rule("p2p").action == "record"


def test_a_table_merges_over_the_default_and_names_its_gates():
    policy = ReceiptPolicy.model_validate({"hbm_copy": {"min_of_reference": 0.8}, "matmul": "record",
                                          "budget_s": 60})
    assert policy.rule("hbm_copy").min_of_reference == 0.8
    assert policy.rule("hbm_copy").min_of_offer == DEFAULT_RULES["hbm_copy"].min_of_offer
    assert policy.rule("matmul").action == "record" and policy.declared_gates == ("hbm_copy",)


@pytest.mark.parametrize(("receipt", "says"), [
    ("matmul = { min_of_reference = -0.5 }", "matmul.min_of_reference: -0.5 is not a positive number"),
    ("matmul = { min_of_reference = 0 }", "matmul.min_of_reference: 0 is not a positive number"),
    ('h2d = { min_of_offer = "half" }', "h2d.min_of_offer: 'half' is not a positive number"),
    ("tensor_cores = \"gate\"", "unknown measure 'tensor_cores'"),
    ("ecc = { min_of_offer = 0.5 }", "ecc.min_of_offer: ecc has no such comparison"),
    ('burn = "sometimes"', "burn: action 'sometimes' is not one of gate, record, off"),
    ("budget_s = 0", "field receipt.budget_s"),
    ('spread = "gate"', "[receipt] spread is a gate, but a 1-GPU host cannot report it"),
])
def test_bad_receipt_input_is_exit_2_naming_it(tmp_path, receipt, says):
    done = cli("--profile", str(profile_with(tmp_path, receipt)), "--sim", "--dry-run", home=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert says in " ".join(done.stderr.split())


@pytest.mark.parametrize(("receipt", "gpus", "says"), [
    ('ecc = "gate"', ["RTX 4090"], "[receipt] ecc is a gate, but RTX 4090 reports no ECC"),
    ('matmul = "gate"', ["H100 SXM", "RTX 4090"], "gates on the reference (min_of_reference), but RTX 4090 has no "
                                                  "reference figure for it"),
    ("burn = { min_of_reference = 0.95 }", ["A100 SXM4"], "A100 SXM4 has no reference figure"),
])
def test_a_gate_on_a_measure_the_gpu_cannot_report_is_exit_2(tmp_path, receipt, gpus, says):
    with pytest.raises(ConfigError) as err:
        resolve(RunOptions(profile=str(profile_with(tmp_path, receipt, gpus=gpus)), sim=True, dry_run=True,
                           state_dir=tmp_path), environ={})
    assert says in str(err.value)


def test_a_gate_on_the_offer_is_how_a_gpu_with_no_reference_opts_in(tmp_path):
    """Red team r43: an RTX 5090 at 10% of its offered TFLOP/s passed (no reference row); `matmul = { min_of_offer
    = 0.5 }` was exit 2, its advice (drop min_of_reference) impossible: the default merges it back in."""
    from tests.harness.sim_receipts import sim_offer, sim_receipt
    from vast_harness.host.receipt_judge import OfferFigures, judge
    from vast_harness.spec.references import load_references

    spec = resolve(RunOptions(profile=str(profile_with(tmp_path, "matmul = { min_of_offer = 0.5 }", gpus=["RTX 5090"])),
                              sim=True, dry_run=True, state_dir=tmp_path), environ={})
    policy = spec.profile.receipt
    offer = sim_offer(__import__("random").Random(3), "RTX 5090") | {"num_gpus": 1}
    figures = OfferFigures(gpu_name="RTX 5090", num_gpus=1, total_flops=offer["total_flops"],
                           pcie_bw_gbps=offer.get("pcie_bw"), gpu_mem_bw_gbps=offer.get("gpu_mem_bw"))
    slow = judge(sim_receipt(offer, 1, {"gpu_slow": 0.1}), figures, policy, load_references())
    assert slow.verdict == "failed" and "matmul" in slow.reason, slow.reason
    healthy = judge(sim_receipt(offer, 1, {}), figures, policy, load_references())
    assert healthy.verdict == "passed", healthy.reason
    with pytest.raises(ConfigError, match=r"gate it on the offer's figure instead \(matmul = \{ min_of_offer"):
        resolve(RunOptions(profile=str(profile_with(tmp_path, 'matmul = "gate"', gpus=["RTX 5090"])), sim=True,
                           dry_run=True, state_dir=tmp_path), environ={})


def test_the_same_gates_pass_where_the_gpus_can_report_them(tmp_path):
    spec = resolve(RunOptions(profile=str(profile_with(tmp_path, 'ecc = "gate"\nmatmul = "gate"\nspread = "gate"',
                                                       gpus=["H100 SXM", "H200"], num_gpus=2)),
                              sim=True, dry_run=True, state_dir=tmp_path), environ={})
    assert spec.profile.receipt.declared_gates == ("ecc", "matmul", "spread")
    # by default (nothing declared) a GPU without a reference is recorded, never refused before renting
    resolve(RunOptions(profile=str(profile_with(tmp_path, "", gpus=["RTX 4090"])), sim=True, dry_run=True,
                       state_dir=tmp_path), environ={})


def test_the_dry_run_states_the_receipt_and_its_share_of_the_worst_case(tmp_path):
    done = cli("--profile", "smoke", "--sim", "--dry-run", "--json", home=tmp_path)
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    receipt = plan["receipt"]
    assert receipt["enabled"] and receipt["budget_s"] == 90 and receipt["hosts"] == 2
    assert receipt["payload_bytes"] > 0 and receipt["usd_per_host"] > 0 and "matmul" in receipt["gates"]
    human = cli("--profile", "smoke", "--sim", "--dry-run", home=tmp_path)
    said = " ".join(human.stdout.split())
    assert "Receipt: each of up to 2 host(s) (--boot-retries 1) boots (up to 600 s) and takes its receipt (up to " \
           "90 s + 2 s) before any work" in said and "inside the worst case" in said
