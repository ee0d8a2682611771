"""`vast-e2e check` and `vast-e2e canary` on the simulator, end to end: real HTTP, real SSH, the guarded run's
own teardown and absence proof; and the simulator calibrated from what the canary measured."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import SecretStr

from tests.harness.clirun import cli
from vast_harness.actions.canary import run_canary
from vast_harness.console.output import Output
from vast_harness.sim import SimServer
from vast_harness.sim import cli as sim_cli
from vast_harness.sim.calibrate import CalibrationError, load
from vast_harness.spec.profile import load_driver_policy
from vast_harness.spec.resolve import RunOptions, resolve
from vast_harness.vast.client import VastClient
from vast_harness.views.check import run_checks

SCALE = 0.01
KEY = "sim-canary-key"


def _spec(sim: SimServer, tmp_path: Path, **kw):
    spec = resolve(RunOptions(profile="smoke", sim=True, evidence_dir=tmp_path / "ev", proof_interval_s=0.2,
                              max_usd=0.10, **kw), environ={})
    return spec.model_copy(update={"api_url": sim.url, "api_key": SecretStr(KEY)}).with_timings(teardown_margin_s=2.0)


@pytest.mark.slow
def test_the_canary_measures_a_read_lag_of_3_s_and_leaves_nothing(tmp_path):
    with SimServer(seed=21, rate_scale=SCALE, boot_seconds=0.2, faults="read_lag:3", linger_seconds=0.0) as sim, \
            VastClient(KEY, base_url=sim.url, pacing_scale=SCALE) as client:
        rep, run = run_canary(_spec(sim, tmp_path), client, load_driver_policy(), Output(quiet=True),
                              tmp_path / "canary.json")
        assert rep.exit_code == 0, rep.message
        assert 2.6 <= rep.read_lag.per_id_s <= 4.0 and 2.6 <= rep.read_lag.list_s <= 4.0, rep.read_lag
        assert rep.boot_s is not None and rep.boot_s >= rep.read_lag.per_id_s
        # a duration, not a timestamp (both ends on the same clock)
        assert rep.create_answer_s is not None and 0 <= rep.create_answer_s < 30
        assert rep.image_accepted and rep.image_sent.startswith("pytorch/pytorch@sha256:")
        assert rep.deadman_armed and rep.deadman_probe_status == 200
        assert rep.ssh_env == dict.fromkeys(("CONTAINER_ID", "CONTAINER_API_KEY", "VAST_CONTAINERLABEL",
                                             "PUBLIC_IPADDR"), False)  # docs: not visible in SSH sessions
        assert rep.absence == "gone" and rep.linger_shape == "null at once" and rep.linger_s == 0.0
        assert rep.delete_to_null_s is not None and rep.delete_to_list_absent_s is not None
        assert rep.repeat_delete and rep.repeat_delete["status"] == 404  # sent only after the proof
        assert not [i for i in sim.state()["instances"] if i["live"]]
        assert (run.ev.dir / "canary.json").is_file()
    cal = load(tmp_path / "canary.json")
    assert cal.read_lag_seconds == pytest.approx(max(rep.read_lag.per_id_s, rep.read_lag.list_s))
    assert cal.linger_seconds == 0.0 and cal.boot_seconds == rep.boot_s
    args = sim_cli.build_parser().parse_args(["--calibrate", str(tmp_path / "canary.json"), "--faults", "5xx:list:1"])
    kwargs = sim_cli.server_kwargs(args)
    assert kwargs["boot_seconds"] == rep.boot_s and kwargs["linger_seconds"] == 0.0
    assert {r.kind for r in kwargs["faults"].rules} == {"5xx", "read_lag"}
    assert kwargs["faults"].rules[1].seconds == pytest.approx(cal.read_lag_seconds, abs=1e-3)
    explicit = sim_cli.server_kwargs(sim_cli.build_parser().parse_args(
        ["--calibrate", str(tmp_path / "canary.json"), "--boot-seconds", "7"]))
    assert explicit["boot_seconds"] == 7.0  # a flag wins over the measurement


def test_a_canary_whose_container_key_is_refused_still_tears_down(tmp_path):
    with SimServer(seed=22, rate_scale=SCALE, boot_seconds=0.1, faults="container_key_refused") as sim, \
            VastClient(KEY, base_url=sim.url, pacing_scale=SCALE) as client:
        rep, _ = run_canary(_spec(sim, tmp_path), client, load_driver_policy(), Output(quiet=True), None)
        assert rep.exit_code == 1 and rep.deadman_armed is False and rep.deadman_probe_status == 401
        assert rep.absence == "gone" and not [i for i in sim.state()["instances"] if i["live"]]


def test_calibrate_refuses_a_file_that_is_not_a_canary(tmp_path):
    (tmp_path / "x.json").write_text('{"hello": 1}')
    with pytest.raises(CalibrationError, match="schema_version"):
        load(tmp_path / "x.json")
    done = subprocess.run([sys.executable, "-m", "vast_harness.sim", "--calibrate", str(tmp_path / "nope.json")],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2 and "--calibrate" in done.stderr


def test_check_is_all_ok_on_the_simulator_and_creates_nothing(tmp_path):
    with SimServer(seed=23, rate_scale=SCALE) as sim, VastClient(KEY, base_url=sim.url, pacing_scale=SCALE) as client:
        report = run_checks(_spec(sim, tmp_path), client)
        assert not report.failed and report.exit_code == 0, report.rows
        assert not sim.state()["instances"]
        assert {c["method"] for c in sim.state()["calls"]} <= {"GET", "POST"}  # read-only (POST: the search)


@pytest.mark.parametrize(("faults", "keys", "needle", "code"), [("v0_deprecated", None, "DEPRECATED", 1),
                                                                (None, ["another-key"], "refused", 2)])
def test_check_names_what_is_not_well(tmp_path, faults, keys, needle, code):
    # A refused key is bad configuration (exit 2, as for a run); a deprecated endpoint is a failed check.
    with SimServer(seed=24, rate_scale=SCALE, faults=faults, api_keys=keys) as sim, \
            VastClient(KEY, base_url=sim.url, pacing_scale=SCALE) as client:
        report = run_checks(_spec(sim, tmp_path), client)
    assert report.exit_code == code and any(needle in r.detail for r in report.failed), report.rows


@pytest.mark.parametrize("command", [["check"], ["canary", "--out", "{tmp}/c.json", "--evidence-dir", "{tmp}/ev"]])
@pytest.mark.slow
def test_check_and_canary_run_from_the_cli_on_the_embedded_simulator(tmp_path, command):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in command]
    done = cli(*argv, "--sim", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    payload = json.loads(done.stdout)
    if command[0] == "check":
        assert payload["ok"] and len(payload["checks"]) == 5
    else:
        assert payload["absence"] == "gone" and json.loads((tmp_path / "c.json").read_text())["run_id"]


@pytest.mark.parametrize("shape", ["object", "list"])
def test_the_canary_records_the_read_shape_the_key_attachment_and_the_bandwidth_figures(tmp_path, shape):
    # issue 33: figures a user can send back: which per-id shape the API gave (and whether it had ports), whether
    # the run key was attached, and the bandwidth under each reading of whose "up" inet_up_cost is
    with SimServer(seed=23, rate_scale=SCALE, boot_seconds=0.1, show_shape=shape) as sim, \
            VastClient(KEY, base_url=sim.url, pacing_scale=SCALE) as client:
        rep, _ = run_canary(_spec(sim, tmp_path), client, load_driver_policy(), Output(quiet=True),
                            tmp_path / "canary.json")
        assert rep.exit_code == 0, rep.message
        assert rep.per_id_shapes.get(shape) and rep.per_id_ports is (shape == "object")
        assert rep.key_attached is True
        bw = rep.bandwidth
        assert bw is not None and bw.bytes_to_host > 0 and bw.bytes_from_host > 0
        up, down = bw.inet_up_cost_usd_per_gb or 0.0, bw.inet_down_cost_usd_per_gb or 0.0
        assert bw.harness_usd >= max(bw.host_names_usd, bw.renter_names_usd)
        assert bw.host_names_usd == pytest.approx((bw.bytes_to_host * down + bw.bytes_from_host * up) / 1e9, abs=1e-6)
        billed = next(i for i in sim.state()["instances"] if i["id"] == rep.instance_id)["bandwidth_usd"]
        assert billed == pytest.approx(bw.host_names_usd, abs=2e-6)  # the simulator bills by the host's names
        assert bw.credit_before_usd is not None and bw.credit_after_usd is not None
        assert "per_id_shapes" in json.loads((tmp_path / "canary.json").read_text())
        assert not [i for i in sim.state()["instances"] if i["live"]]


@pytest.mark.slow
def test_the_interruptible_canary_stops_its_bid_host_copies_off_it_and_calibrates_the_copy_rate(tmp_path):
    # canary --interruptible on the simulator (it was never run against Vast): a bid instance, a probe file, the
    # instance stopped by the canary itself, its paused reads, the detector's verdict, the file copied off it the
    # way `vastai copy` does at the simulator's copy rate; the rate calibrates the next simulator.
    rate = 400_000.0
    with SimServer(seed=21, rate_scale=SCALE, boot_seconds=0.2, copy_bytes_per_s=rate) as sim, \
            VastClient(KEY, base_url=sim.url, pacing_scale=SCALE) as client:
        spec = _spec(sim, tmp_path, interruptible=True)
        rep, _run = run_canary(spec, client, load_driver_policy(), Output(quiet=True), tmp_path / "canary.json")
        assert rep.exit_code == 0, rep.message
        assert not [i for i in sim.state()["instances"] if i["live"]] and rep.absence == "gone"
        (inst,) = sim.state()["instances"]
        assert inst["is_bid"] and inst["copies"] == 1
    p = rep.interruptible
    assert p is not None and p.is_bid and p.bid_usd_per_h and p.min_bid_usd_per_h
    assert p.bid_usd_per_h >= p.min_bid_usd_per_h
    assert p.stop == "answered" and p.reads and p.reads[-1].actual_status == "stopped"
    assert p.detector and p.paused_after_s is not None
    assert {"success", "src_addr", "src_port"} <= set(p.copy_answer_keys)
    assert p.copy_rc == 0 and p.copy_bytes == 1_000_000 and p.copy_matches is True, p
    assert p.copy_bytes_per_s is not None and 0.3 * rate <= p.copy_bytes_per_s <= 1.2 * rate, p.copy_bytes_per_s
    cal = load(tmp_path / "canary.json")
    assert cal.copy_bytes_per_s == p.copy_bytes_per_s
    kwargs = sim_cli.server_kwargs(sim_cli.build_parser().parse_args(["--calibrate", str(tmp_path / "canary.json")]))
    assert kwargs["copy_bytes_per_s"] == p.copy_bytes_per_s
    kwargs.pop("calibration")  # what main() prints
    with SimServer(**{**kwargs, "port": 0}) as calibrated:
        assert calibrated.backend.copy_bytes_per_s == p.copy_bytes_per_s
