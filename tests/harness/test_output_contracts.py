"""What the CLI prints: no value ever reaches rich as markup, `--json` is one object on stdout, a closed or
broken stdout never ends a run or skips its teardown, and Ctrl-C is exit 130 with a message, never a traceback."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from pydantic import SecretStr

from tests.harness.clirun import spawn
from vast_harness.console.output import Output
from vast_harness.run.runner import GuardedRun
from vast_harness.sim import SimServer
from vast_harness.spec.profile import Step, load_driver_policy
from vast_harness.spec.resolve import RunOptions, resolve, validate_api_url
from vast_harness.state.ledger import Ledger, LedgerTarget, account_fingerprint
from vast_harness.vast.client import VastClient

MARKUP = "[/x] [bold]not bold[/bold] [link=file:///etc] :warning:"
SCALE = 0.01
KEY = "sim-output-key"


def _cli(*args: str, **kw) -> subprocess.Popen:
    """A process of its own: these tests close its stdout and signal it."""
    return spawn(*args, text=False, **kw)


def test_every_output_path_prints_markup_literally(capsys):
    class Td:
        instance_id, verdict, proof = 7, MARKUP, None

    class St:
        name, rc, seconds, timed_out, connection_lost, interrupted = MARKUP, 0, 1.0, False, False, False

        def model_dump(self):
            return {}

    out = Output()
    out.info(MARKUP)
    out.warn(f"instance 7 did not come up: {MARKUP}")
    out.error(MARKUP, hint=MARKUP)
    out.step_line(MARKUP, 1.0, 0.1, "stderr", MARKUP)
    out.result(MARKUP, 1, MARKUP, Path("/tmp") / MARKUP, [St()], [Td()], 0.1)
    out.reap_report([(7, MARKUP, 1, MARKUP)], [MARKUP], ok=False)
    out.failure(MARKUP, 2)
    captured = capsys.readouterr()
    assert captured.out.count("[/x]") >= 4 and captured.err.count("[/x]") >= 5
    assert ":warning:" in captured.err  # no emoji substitution either


SIM_OPTIONS = dict(seed=21, rate_scale=SCALE, boot_seconds=0.1, num_offers=300)  # conftest.sim


class MarkupStatus(httpx.HTTPTransport):
    """The first instance's per-id read carries an error `status_msg` with rich markup in the server's `status_msg`."""

    def __init__(self) -> None:
        super().__init__()
        self.poisoned: int | None = None

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        if request.method == "GET" and re.fullmatch(r"/api/v0/instances/\d+/", request.url.path):
            response.read()
            data = response.json()
            inst = data.get("instances") if isinstance(data, dict) else None
            if isinstance(inst, dict) and self.poisoned in (None, inst.get("id")):
                self.poisoned = inst.get("id")
                inst.update(actual_status="loading", status_msg=f"Error: {MARKUP} OCI runtime create failed")
                return httpx.Response(response.status_code, json=data)
        return response


def test_markup_in_step_output_server_message_and_path_does_not_change_the_run(sim, tmp_path, capsys):
    """A passed run stays passed (no exit 1, no traceback); a boot failure with markup in the server's
    message still moves on to the next host (its retry is not skipped)."""
    spec = resolve(RunOptions(profile="smoke", sim=True, evidence_dir=tmp_path / "[/x]", proof_interval_s=0.05),
                   environ={})
    prof = spec.profile.model_copy(update={"steps": [Step(name="echo", run=f"echo '{MARKUP}'; echo '{MARKUP}' >&2",
                                                          timeout_s=20)], "boot_retries": 1})
    spec = spec.model_copy(update={"profile": prof, "api_url": sim.url, "api_key": SecretStr(KEY),
                                   "boot_retries": 1}).with_timings(teardown_margin_s=2.0)
    with VastClient(KEY, base_url=sim.url, pacing_scale=SCALE, transport=MarkupStatus()) as client:
        run = GuardedRun(spec, client, load_driver_policy(), Output())
        result = run.execute()
    captured = capsys.readouterr()
    assert result.exit_code == 0, result.message
    assert "[/x]" in captured.out
    assert len(run.created) == 2 and all(i.absence == "gone" for i in run.created)  # the retry happened
    assert "did not come up" in captured.err and "[/x]" in captured.err


def _sim_args(sim: SimServer) -> list[str]:
    return ["--api-url", sim.url, "--pacing-scale", "0.01", "--proof-interval", "0.05", "--poll-interval", "0.05"]


def test_a_step_with_no_exit_status_says_what_happened_instead(sim, tmp_path, monkeypatch):
    """`rc=None` tells a user nothing: the step's outcome detail (a channel closed by a signal, a command that
    could not start) is the message."""
    from vast_harness.host import ssh
    from vast_harness.host.ssh import StepOutcome

    real_run = ssh.HostSession.run

    def no_status(self, command, **kwargs):
        if "the-user-step" in command:
            return StepOutcome(rc=None, seconds=0.1, detail="channel closed without an exit status (killed?)")
        return real_run(self, command, **kwargs)

    monkeypatch.setattr(ssh.HostSession, "run", no_status)
    spec = resolve(RunOptions(profile="smoke", sim=True, evidence_dir=tmp_path, proof_interval_s=0.05), environ={})
    prof = spec.profile.model_copy(update={"steps": [Step(name="echo", run="echo the-user-step", timeout_s=20)]})
    spec = spec.model_copy(update={"profile": prof, "api_url": sim.url, "api_key": SecretStr(KEY)})
    with VastClient(KEY, base_url=sim.url, pacing_scale=SCALE) as client:
        result = GuardedRun(spec, client, load_driver_policy(), Output()).execute()
    assert result.exit_code == 1
    assert result.message == ("step echo ended without an exit status: channel closed without an exit status "
                              "(killed?)")


@pytest.mark.slow
def test_stdout_closed_by_the_reader_does_not_end_the_run(sim, tmp_path):
    """`| head -3`: the reader goes away after three lines; the run carries on, tears down, exits 0."""
    p = _cli("--profile", "smoke", "--evidence-dir", str(tmp_path), *_sim_args(sim), key=KEY)
    for _ in range(3):
        p.stdout.readline()
    p.stdout.close()
    _, err = p.communicate(timeout=240)
    err = err.decode(errors="replace")
    assert "Traceback" not in err and "Exception ignored" not in err, err[-3000:]
    assert p.returncode == 0, err[-3000:]
    result = json.loads(next(tmp_path.glob("*/harness-result.json")).read_text())
    assert result["absence"]["verdict"] == "gone"


@pytest.mark.slow
def test_closed_stdout_with_json_does_not_traceback(sim, tmp_path):
    p = _cli("--profile", "smoke", "--json", "--evidence-dir", str(tmp_path), *_sim_args(sim),
             key=KEY, stdout=subprocess.DEVNULL, preexec_fn=lambda: os.close(1))
    _, err = p.communicate(timeout=240)
    err = err.decode(errors="replace")
    assert p.returncode == 0 and "Traceback" not in err, err[-3000:]
    result = json.loads(next(tmp_path.glob("*/harness-result.json")).read_text())
    assert result["absence"]["verdict"] == "gone"


@pytest.mark.parametrize("delay_s", [0.3, 1.0, 2.0])
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_signal_right_after_launch_is_130_with_a_message(delay_s, signum, tmp_path):
    # Depending on how far the launch got: "interrupted before anything was rented" on stderr, or (renting
    # or later) the run's own result line "exit 130: interrupted by SIGINT" on stdout after the teardown.
    # Red team r9: a SIGTERM while Python imported the app ended the process with 143 and no word.
    p = _cli("--profile", "smoke", "--sim", "--evidence-dir", str(tmp_path), "--proof-interval", "0.05")
    time.sleep(delay_s)
    p.send_signal(signum)
    out, err = (b.decode(errors="replace") for b in p.communicate(timeout=120))
    assert p.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err and "Exception occurred" not in err, err
    assert "interrupted" in err + out
    for result in tmp_path.glob("*/harness-result.json"):  # it had started: deleted and proven absent
        assert json.loads(result.read_text())["absence"]["verdict"] in ("gone", "nothing-created"), result


@pytest.mark.slow
def test_ctrl_c_during_reap_says_what_it_had_not_proven(sim, tmp_path):
    with VastClient(KEY, base_url=sim.url, pacing_scale=SCALE) as client:
        offer = client.search_offers({"limit": 5})[0]
        iid = client.create_instance(offer.id, {"image": "img", "disk": 10, "label": "vh-reap-sigint"}).new_contract
    target = LedgerTarget(api_url=validate_api_url(sim.url), account=account_fingerprint(KEY))
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()  # the line names the process of a run that has ended (this test's own process is alive)
    Ledger(tmp_path / "ledger.jsonl", target).append("r", "created", "vh-reap-sigint", offer_id=offer.id,
                                                     instance_id=iid, pid=ended.pid)  # type: ignore[typeddict-unknown-key]
    p = _cli("reap", "--evidence-dir", str(tmp_path), "--api-url", sim.url, "--pacing-scale", "0.01",
             "--proof-interval", "30", key=KEY)
    deadline = time.monotonic() + 60
    seen = b""
    while b"deleting instance" not in seen and time.monotonic() < deadline:
        seen += p.stderr.readline()
    time.sleep(0.5)  # inside the absence proof's 30 s interval
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    text = (seen + out + err).decode(errors="replace")
    assert p.returncode == 3, text
    assert "before anything was rented" not in text and "Traceback" not in text, text
    assert "reap interrupted while deleting" in text and str(iid) in text
