"""The host that arrived is the one offered: nvidia-smi read over SSH (bounded, hostile-safe), compared with the
offer by a name normalisation and a memory tolerance; a lying host is refused, deleted and proven gone, the
next offer tried, exit 1 when none is left. Judged by the simulator's own state (`/_sim/state`).
"""

from __future__ import annotations

import json
import subprocess
import threading
from pathlib import Path

import httpx
import pytest
from pydantic import SecretStr

from vast_harness.console.output import Output
from vast_harness.host.gpu_match import Offered, memory_matches, mismatches, same_gpu
from vast_harness.host.gpu_probe import MAX_OUTPUT_BYTES, parse_answer, read_gpus
from vast_harness.records import HostGpu, StepOutcome
from vast_harness.run.runner import GuardedRun
from vast_harness.sim import SimServer
from vast_harness.sim.gpus import SMI_NAMES, host_gpus, install_nvidia_smi
from vast_harness.spec.profile import Step, load_driver_policy
from vast_harness.spec.requires import Requires
from vast_harness.spec.resolve import RunOptions, RunSpec, resolve
from vast_harness.vast.client import VastClient

SCALE = 0.01
KEY = "sim-gpu-arrival-key"
SIM_OPTIONS = dict(seed=5, rate_scale=SCALE, boot_seconds=0.1, num_offers=400)  # conftest.sim
pytestmark = pytest.mark.usefixtures("clean_sim")

# (Vast's gpu_name, nvidia-smi's name): the same GPU. nvidia-smi names from NVIDIA's drivers as hosts print them.
SAME = [
    ("RTX 3090", "NVIDIA GeForce RTX 3090"),
    ("RTX 4090", "NVIDIA GeForce RTX 4090"),
    ("RTX 4090D", "NVIDIA GeForce RTX 4090 D"),
    ("RTX 5090", "NVIDIA GeForce RTX 5090"),
    ("RTX 3090 Ti", "NVIDIA GeForce RTX 3090 Ti"),
    ("H100 SXM", "NVIDIA H100 80GB HBM3"),
    ("H100 SXM", "NVIDIA H100"),
    ("H100 PCIE", "NVIDIA H100 PCIe"),
    ("H100 NVL", "NVIDIA H100 NVL"),
    ("H200", "NVIDIA H200"),
    ("H200 NVL", "NVIDIA H200 NVL"),
    ("A100 SXM4", "NVIDIA A100-SXM4-80GB"),
    ("A100 SXM4", "NVIDIA A100-SXM4-40GB"),
    ("A100 PCIE", "NVIDIA A100-PCIE-40GB"),
    ("A100 PCIE", "NVIDIA A100 80GB PCIe"),
    ("L40S", "NVIDIA L40S"),
    ("L4", "NVIDIA L4"),
    ("RTX A6000", "NVIDIA RTX A6000"),
    ("RTX 6000Ada", "NVIDIA RTX 6000 Ada Generation"),
    ("Q RTX 8000", "Quadro RTX 8000"),
    ("Tesla V100", "Tesla V100-SXM2-16GB"),
    ("GH200 SXM", "NVIDIA GH200 480GB"),
    ("B200", "NVIDIA B200"),
    ("Titan RTX", "NVIDIA TITAN RTX"),
]
DIFFERENT = [
    ("H100 SXM", "NVIDIA GeForce RTX 3090"),
    ("H100 SXM", "NVIDIA H100 PCIe"),
    ("H100 SXM", "NVIDIA H100 NVL"),
    ("H100 PCIE", "NVIDIA H100 80GB HBM3"),
    ("H200", "NVIDIA H200 NVL"),
    ("H200", "NVIDIA H100 80GB HBM3"),
    ("A100 SXM4", "NVIDIA A100-PCIE-40GB"),
    ("A100 PCIE", "NVIDIA A100-SXM4-80GB"),
    ("A10", "NVIDIA A100-SXM4-80GB"),
    ("L40", "NVIDIA L40S"),
    ("RTX 4090", "NVIDIA GeForce RTX 4090 D"),
    ("RTX 3090", "NVIDIA GeForce RTX 3090 Ti"),
    ("RTX 6000Ada", "Quadro RTX 6000"),
    ("RTX 4090", "NVIDIA GeForce RTX 5090"),
    ("", "NVIDIA H100 80GB HBM3"),
]


@pytest.mark.parametrize(("offered", "reported"), SAME)
def test_the_same_gpu_under_vast_and_nvidia_smi_names_matches(offered, reported):
    assert same_gpu(offered, reported)


@pytest.mark.parametrize(("offered", "reported"), DIFFERENT)
def test_another_gpu_does_not_match(offered, reported):
    assert not same_gpu(offered, reported)


@pytest.mark.parametrize("vast_name", sorted(SMI_NAMES))
def test_the_simulator_spells_each_catalog_gpu_as_a_matching_nvidia_smi_name(vast_name):
    assert same_gpu(vast_name, SMI_NAMES[vast_name])


@pytest.mark.parametrize(("offered_mib", "reported_mib", "same"), [
    (81559, 81559, True),  # H100 80GB: Vast's gpu_ram is nvidia-smi's MiB
    (49140, 46068, True),  # a 48 GB GDDR card with ECC on hides 1/16
    (40960, 40537, True),  # A100 40GB with ECC
    (81920, 40960, False),  # an A100 80GB offer, a 40GB host
    (81559, 95830, False),  # an H100 80GB offer, an H100 NVL host
    (24576, 32607, False),
])
def test_memory_matches_within_the_ecc_tolerance_only(offered_mib, reported_mib, same):
    assert memory_matches(offered_mib, reported_mib) is same


OFFER_H100 = Offered(gpu_name="H100 SXM", num_gpus=2, gpu_ram_mib=81559, driver_version="570.86.15",
                     cuda_max_good=12.8, compute_cap=900)


def h100(**change) -> HostGpu:
    return HostGpu(name="NVIDIA H100 80GB HBM3", memory_mib=81559, driver_version="570.86.15",
                   compute_cap="9.0").model_copy(update=change)


def test_a_host_as_offered_has_no_mismatch():
    assert mismatches(OFFER_H100, [h100(), h100()], "12.8", requires=Requires(min_gpu_ram_gib=76),
                      image_cuda=12.8) == []


@pytest.mark.parametrize(("gpus", "cuda", "says"), [
    ([h100()], "12.8", "1 GPU(s), the offer said 2"),
    ([h100(), h100(name="NVIDIA GeForce RTX 3090")], "12.8", "'NVIDIA GeForce RTX 3090' is not the offered 'H100 SXM'"),
    ([h100(memory_mib=40960)] * 2, "12.8", "40960 MiB per GPU, the offer said 81559 MiB"),
    ([h100(driver_version="535.183.01")] * 2, "12.8", "driver 535.183.01, the offer said 570.86.15"),
    ([h100()] * 2, "12.4", "driver CUDA 12.4, the offer said 12.8"),
    ([h100(compute_cap="8.6")] * 2, "12.8", "compute capability 8.6, the offer said 9"),
])
def test_each_way_a_host_differs_is_named_with_both_sides(gpus, cuda, says):
    found = mismatches(OFFER_H100, gpus, cuda, requires=Requires(), image_cuda=12.8)
    assert any(says in f for f in found), found


def test_a_host_below_the_requirement_is_refused_even_when_the_offer_said_so():
    offer = OFFER_H100.model_copy(update={"gpu_ram_mib": 24576, "gpu_name": "RTX 3090", "compute_cap": 860})
    gpu = HostGpu(name="NVIDIA GeForce RTX 3090", memory_mib=24576, driver_version="570.86.15", compute_cap="8.6")
    found = mismatches(offer, [gpu, gpu], "12.8", requires=Requires(min_gpu_ram_gib=76, min_compute_cap=8.9),
                       image_cuda=12.8)
    assert any("24.0 GiB per GPU < the 76 GiB it needs" in f for f in found), found
    assert any("compute capability 8.6 < the 8.9 it needs" in f for f in found), found


GOOD_ANSWER = ["NVIDIA H100 80GB HBM3, 81559 MiB, 570.86.15, 9.0", "NVIDIA H100 80GB HBM3, 81559 MiB, 570.86.15, 9.0",
               "VH-SMI-HEADER", "+-----+", "| NVIDIA-SMI 570.86.15   Driver Version: 570.86.15   CUDA Version: 12.8  |"]


def test_a_real_shaped_answer_is_read():
    read = parse_answer(GOOD_ANSWER)
    assert read.problems == [] and read.cuda_version == "12.8"
    assert [g.name for g in read.gpus] == ["NVIDIA H100 80GB HBM3"] * 2 and read.gpus[0].memory_mib == 81559


@pytest.mark.parametrize(("lines", "says"), [
    ([], "listed no GPU"),
    (["NVIDIA H100, 81559 MiB, 570.86.15, 9.0, extra", "VH-SMI-HEADER", "CUDA Version: 12.8"], "is not name"),
    (["NVIDIA H100, lots, 570.86.15, 9.0", "VH-SMI-HEADER", "CUDA Version: 12.8"], "memory.total"),
    (["NVIDIA H100, 81559 MiB, 570; rm -rf, 9.0", "VH-SMI-HEADER", "CUDA Version: 12.8"], "driver_version"),
    (["\x1b[31mNVIDIA H100, 81559 MiB, 570.86.15, 9.0", "VH-SMI-HEADER", "CUDA Version: 12.8"], "GPU name"),
    (GOOD_ANSWER[:3], "names no CUDA version"),
    (["NVIDIA H100, 81559 MiB, 570.86.15, 9.0"] * 17 + ["VH-SMI-HEADER", "CUDA Version: 12.8"], "listed 17 GPUs"),
])
def test_a_malformed_or_hostile_answer_is_a_problem_never_a_gpu(lines, says):
    read = parse_answer(lines)
    assert any(says in p for p in read.problems), read.problems


class _FloodingSession:
    """A host whose nvidia-smi never stops printing: the read must stop it by bytes, not wait it out."""

    def __init__(self) -> None:
        self.lines_sent = 0

    def run(self, command: str, *, on_line, timeout_s: float, stop: threading.Event | None = None, env=None):
        while not (stop is not None and stop.is_set()) and self.lines_sent < 10_000_000:
            on_line("stdout", "NVIDIA H100 80GB HBM3, 81559 MiB, 570.86.15, 9.0")
            self.lines_sent += 1
        return StepOutcome(rc=None, seconds=0.1, timed_out=True, detail="stopped")


def test_a_flooding_host_is_cut_at_the_byte_bound():
    session = _FloodingSession()
    read = read_gpus(session, timeout_s=5)  # type: ignore[arg-type]
    assert read.gpus == [] and "flooding" in read.problems[0]
    assert session.lines_sent * 50 < MAX_OUTPUT_BYTES * 2


def test_the_simulated_nvidia_smi_answers_the_harness_and_the_workload_from_the_offer(tmp_path):
    offer = {"gpu_name": "H100 SXM", "gpu_ram": 81559, "compute_cap": 900, "num_gpus": 2, "machine_id": 77,
             "driver_version": "570.86.15", "cuda_max_good": 12.8}
    smi = install_nvidia_smi(tmp_path, offer, lie=False) / "nvidia-smi"
    query = subprocess.run([smi, "--query-gpu=name,memory.total,driver_version,compute_cap", "--format=csv,noheader"],
                           capture_output=True, text=True, check=True).stdout.splitlines()
    header = subprocess.run([smi], capture_output=True, text=True, check=True).stdout.splitlines()
    read = parse_answer([*query, "VH-SMI-HEADER", *header])
    assert read.problems == [] and read.cuda_version == "12.8"
    assert mismatches(Offered(gpu_name="H100 SXM", num_gpus=2, gpu_ram_mib=81559, driver_version="570.86.15",
                              cuda_max_good=12.8, compute_cap=900), read.gpus, read.cuda_version,
                      requires=Requires(), image_cuda=12.8) == []
    # the workload's env probe asks with nounits and more fields
    probe = subprocess.run([smi, "--query-gpu=index,name,uuid,memory.total", "--format=csv,noheader,nounits"],
                           capture_output=True, text=True, check=True).stdout.splitlines()
    assert probe[1].startswith("1, NVIDIA H100 80GB HBM3, GPU-") and probe[1].endswith(", 81559")


def test_the_lying_host_reports_another_gpu():
    offer = {"gpu_name": "H100 SXM", "gpu_ram": 81559, "compute_cap": 900, "num_gpus": 1}
    assert not same_gpu("H100 SXM", host_gpus(offer, lie=True)[0]["name"])
    assert not same_gpu("RTX 3090", host_gpus(offer | {"gpu_name": "RTX 3090"}, lie=True)[0]["name"])


# ------------------------------------------------------------------------------ whole runs on the simulator
def make_spec(sim: SimServer, tmp_path: Path, boot_retries: int) -> RunSpec:
    spec = resolve(RunOptions(profile="smoke", sim=True, evidence_dir=tmp_path / "ev", proof_interval_s=0.05),
                   environ={})
    prof = spec.profile.model_copy(update={"steps": [Step(name="work", run="echo worked > evidence/w.txt",
                                                          timeout_s=20)]})
    return spec.model_copy(update={"profile": prof, "api_url": sim.url, "api_key": SecretStr(KEY),
                                   "boot_retries": boot_retries}).with_timings(teardown_margin_s=2.0)


def run(sim: SimServer, spec: RunSpec):
    with VastClient(KEY, base_url=sim.url, pacing_scale=SCALE) as client:
        guarded = GuardedRun(spec, client, load_driver_policy(), Output(quiet=True))
        result = guarded.execute()
    return guarded, result


def sim_state(sim: SimServer) -> dict:
    return httpx.get(f"{sim.url}/_sim/state", timeout=10).json()


def test_a_lying_host_is_deleted_before_any_work_and_the_next_offer_runs(sim, tmp_path):
    sim.set_faults("gpu_mismatch:1")
    guarded, result = run(sim, make_spec(sim, tmp_path, boot_retries=1))
    assert result.exit_code == 0, result.message
    instances = sorted(sim_state(sim)["instances"], key=lambda i: i["created_at"])
    liar, honest = instances[-2:]
    assert liar["gpu_lie"] and not honest["gpu_lie"]
    assert not liar["live"] and not honest["live"]  # both deleted; the liar before the next was rented
    assert liar["destroyed_at"] <= honest["created_at"]
    assert liar["execs"] == 1 and liar["bytes_to_host"] == 0  # only the GPU read ran there: no upload, no step
    assert liar["machine_id"] != honest["machine_id"]
    record = json.loads((guarded.ev.dir / "harness-result.json").read_text())
    assert record["host_gpus"]["instance_id"] == honest["id"] and record["host_gpus"]["mismatches"] == []
    refused = record["gpu_refused"]
    assert len(refused) == 1 and refused[0]["instance_id"] == liar["id"] and refused[0]["offer_id"] == liar["offer_id"]
    assert "GeForce RTX" in refused[0]["gpus"][0]["name"] and "is not the offered" in refused[0]["mismatches"][0]
    report = (guarded.ev.dir / "report.html").read_text()
    assert "host GPUs" in report and f"instance {liar['id']} (offer {liar['offer_id']})" in report


def test_when_every_host_lies_the_run_exits_1_naming_both_sides_and_nothing_is_left(sim, tmp_path):
    sim.set_faults("gpu_mismatch:*")
    guarded, result = run(sim, make_spec(sim, tmp_path, boot_retries=1))
    assert result.exit_code == 1, result.message
    assert "offered 1x" in result.message and "the host has 1x NVIDIA" in result.message
    mine = [i for i in sim_state(sim)["instances"] if i["label"] and guarded.run_id in i["label"]]
    assert len(mine) == 2 and all(not i["live"] and i["execs"] == 1 and i["bytes_to_host"] == 0 for i in mine)
    record = json.loads((guarded.ev.dir / "harness-result.json").read_text())
    assert record["host_gpus"] is None and len(record["gpu_refused"]) == 2
    assert record["absence"]["verdict"] == "gone"


class _VanishingSession:
    """A host whose link drops while nvidia-smi runs: no answer at all, which is not a lie."""

    def run(self, command: str, *, on_line, timeout_s: float, stop=None, env=None):
        return StepOutcome(rc=None, seconds=0.2, connection_lost=True, detail="connection lost while the command ran")


def test_a_host_that_stops_answering_is_a_boot_failure_not_a_gpu_mismatch():
    read = read_gpus(_VanishingSession())  # type: ignore[arg-type]
    assert not read.answered and "did not answer" in read.problems[0] and read.gpus == []


# ------------------------------------------------------------------------------ the chaos suite's judge
def _chaos_plan(faults: str, boot_retries: int):
    from vast_harness.chaos.engine import ScenarioPlan

    return ScenarioPlan(seed=11, faults=faults, cap_mode="generous", max_minutes=1.0, boot_retries=boot_retries,
                        proof_interval_s=0.05, step_sleep_s=0.1, step_rc=0, steps=1)


@pytest.mark.slow
@pytest.mark.parametrize(("faults", "retries", "code"), [("gpu_mismatch:1;seed=11", 1, 0),
                                                        ("gpu_mismatch:2;seed=11", 1, 1)])
def test_a_chaos_scenario_with_a_lying_host_holds_every_invariant(tmp_path, faults, retries, code):
    from vast_harness import chaos

    outcome = chaos.run_scenario(_chaos_plan(faults, retries), tmp_path)
    assert outcome.exit_code == code, outcome.message
    assert outcome.faults_fired.get("gpu_mismatch") and not outcome.violations, outcome.violations


def test_the_judge_catches_a_lying_host_that_was_used():
    from vast_harness.chaos.judge import gpu_liar_violations

    refused = {"id": 1, "gpu_lie": True, "execs": 1, "bytes_to_host": 0}
    honest = {"id": 2, "gpu_lie": False, "execs": 9, "bytes_to_host": 90_000}
    assert gpu_liar_violations([refused, honest], 0) == []
    assert gpu_liar_violations([refused], 1) == []
    assert [v.kind for v in gpu_liar_violations([refused], 0)] == ["gpu_liar_used"]
    used = refused | {"execs": 4, "bytes_to_host": 90_000}
    assert "ran 4 command(s)" in gpu_liar_violations([used, honest], 0)[0].detail


def test_a_real_h200_answer_is_read_and_matches_its_offer():
    lines = (Path(__file__).parent / "fixtures" / "nvidia-smi-h200.txt").read_text().splitlines()[1:]
    read = parse_answer(lines)
    assert read.problems == [] and read.cuda_version == "13.0"
    assert read.gpus == [HostGpu(name="NVIDIA H200", memory_mib=143771, driver_version="580.159.04", compute_cap="9.0")]
    offer = Offered(gpu_name="H200", num_gpus=1, gpu_ram_mib=143771, driver_version="580.159.04", cuda_max_good=13.0,
                    compute_cap=900)
    assert mismatches(offer, read.gpus, read.cuda_version, requires=Requires(min_gpu_ram_gib=76, min_compute_cap=9.0),
                      image_cuda=12.8) == []
    assert mismatches(offer.model_copy(update={"gpu_name": "H100 SXM"}), read.gpus, read.cuda_version,
                      requires=Requires(), image_cuda=12.8) == ["GPU 'NVIDIA H200' is not the offered 'H100 SXM'"]
