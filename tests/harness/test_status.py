"""`status` as a second terminal sees it (issue 34, items 1, 4, 5): a run tearing down says so with its instance
and proof round; a 429 is said once; a refused connection ends the command in seconds naming the URL and a
simulator that exists; nothing live is one line; `status --sim` reads the --sim runs' registrations; `reap`
with nothing to do or no key says so in a line."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time

import httpx
import pytest

from tests.harness.clirun import cli, spawn
from vast_harness.errors import ConnectionRefused

SCALE = 0.01
KEY = "sim-status-key"
# No lingering rows: once deleted the instance leaves the list while the run still proves it absent.
SIM_OPTIONS = dict(seed=34, rate_scale=SCALE, boot_seconds=0.1, num_offers=200, linger_seconds=0.0)


@pytest.mark.slow
def test_status_during_teardown_says_tearing_down_with_the_instance_and_its_proof_round(clean_sim, tmp_path):
    clean_sim.set_faults("delete_fail:2:503")  # the DELETE is retried: the instance is still listed meanwhile
    run = spawn("--profile", "smoke", "--api-url", clean_sim.url, "--pacing-scale", str(SCALE), "--poll-interval",
                "0.1", "--proof-interval", "4", home=tmp_path, key=KEY, stdout=subprocess.DEVNULL)
    tearing = threading.Event()
    err_lines: list[str] = []

    def read_err() -> None:
        assert run.stderr is not None
        for line in run.stderr:
            err_lines.append(line)
            if line.startswith("tearing down"):
                tearing.set()

    reader = threading.Thread(target=read_err, daemon=True)
    reader.start()
    samples: list[dict[str, object]] = []
    try:
        assert tearing.wait(timeout=120), "".join(err_lines)[-3000:]
        while run.poll() is None:
            done = cli("status", "--json", "--api-url", clean_sim.url, "--pacing-scale", str(SCALE), home=tmp_path,
                       key=KEY)
            assert done.returncode == 0, done.stderr
            if run.poll() is None:  # taken while the run was still tearing down
                samples += json.loads(done.stdout)["rows"]
        assert run.wait(timeout=120) == 0, "".join(err_lines)[-3000:]
    finally:
        if run.poll() is None:
            run.kill()
        reader.join(timeout=10)
        if run.stderr is not None:
            run.stderr.close()
    assert samples, "no status was taken during the teardown"
    instance = next(i["id"] for i in clean_sim.state()["instances"] if str(i.get("label", "")).startswith("vh-"))
    for row in samples:  # never "starting" with no instance, as before
        assert row["state"] == "tearing down", samples
        assert row["instance_id"] == instance, samples
    assert any("absence proof round" in str(r["why"]) for r in samples), samples


def test_a_429_is_said_once_however_often_it_is_retried(vast_api, make_client):
    said: list[str] = []
    route = vast_api.get("/api/v1/instances/")
    route.side_effect = [httpx.Response(429, json={"success": False, "error": "too_many_requests"})] * 3 + [
        httpx.Response(200, json={"instances": []})]
    client = make_client(on_retry=said.append)
    assert client.list_instances() == []
    assert len(said) == 1, said
    assert "shared with its other clients" in said[0]


def test_a_refused_connection_ends_status_in_seconds_naming_the_url_and_a_real_simulator(tmp_path):
    start = time.monotonic()
    done = cli("status", home=tmp_path, key=KEY, env={"VAST_URL": "http://127.0.0.1:9"})
    assert time.monotonic() - start < 20  # was 120 s of retries
    assert done.returncode == 1, done.stderr
    assert "connection refused by http://127.0.0.1:9" in done.stderr and "python -m vast_harness.sim" in done.stderr
    assert "giving up in 120" not in done.stderr
    assert done.stdout.strip() == ""  # no empty table


def test_the_typed_refusal_is_raised_after_one_more_try(make_client, fake_clock):
    client = make_client(base_url="http://127.0.0.1:9", transport=None, refused_attempts=2)
    with pytest.raises(ConnectionRefused, match="127.0.0.1:9"):
        client.list_instances()
    assert len(fake_clock.sleeps_s) <= 2  # one retry (and its pacing), not two minutes of them


def test_nothing_live_is_one_line_and_status_sim_needs_no_key(tmp_path):
    done = cli("status", "--sim", home=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("nothing live: no --sim run") and len(done.stdout.splitlines()) == 1


def test_status_sim_shows_a_live_sim_runs_registration(tmp_path):
    from vast_harness.spec.resolve import RunOptions, resolve
    from vast_harness.state.registry import Registration, RunRegistry
    from vast_harness.views.status import collect

    spec = resolve(RunOptions(profile="smoke", sim=True, state_dir=tmp_path), environ={})
    held = RunRegistry(tmp_path).register(Registration(
        run_id="20260101T000000Z-abcdef", pid=os.getpid(), host=os.uname().nodename, started_unix=time.time(),
        api_url="http://127.0.0.1:1", profile="smoke", max_usd=1, max_minutes=5, deadline_unix=time.time() + 60))
    try:
        held.update(instance_ids=[7], phase="tearing down", proof_rounds=2, last_round="gone")
        rows, problems = collect(spec, None)
        assert not problems and [(r.instance_id, r.state) for r in rows] == [(7, "tearing down")]
        assert rows[0].why == "absence proof round 2 (last round: gone)"
    finally:
        held.release()


def test_reap_without_a_key_suggests_no_flag_it_refuses(tmp_path):
    done = cli("reap", home=tmp_path)
    assert done.returncode == 2 and "no API key" in done.stderr
    assert "(or use --sim)" not in done.stderr and "python -m vast_harness.sim" in done.stderr


def test_nothing_to_reap_is_one_line_and_leaves_no_evidence_dir(clean_sim, tmp_path, capsys):
    from pydantic import SecretStr

    from vast_harness.actions.reap import reap_all
    from vast_harness.console.output import Output
    from vast_harness.spec.resolve import RunOptions, resolve
    from vast_harness.vast.client import VastClient

    spec = resolve(RunOptions(profile="smoke", sim=True, state_dir=tmp_path, proof_interval_s=0.05), environ={})
    spec = spec.model_copy(update={"api_url": clean_sim.url, "api_key": SecretStr("sim-nobody-key")})
    with VastClient("sim-nobody-key", base_url=clean_sim.url, pacing_scale=SCALE) as client:
        assert reap_all(spec, client, Output()) == 0
    shown = capsys.readouterr().out
    assert shown.startswith("nothing to reap: no orphan") and len(shown.splitlines()) == 1, shown
    assert not list(tmp_path.glob("reap-*"))


def test_a_stale_registration_link_is_said_but_fails_nothing(tmp_path):
    """Red team: a dead run's registration replaced by a link made every later `status` exit 1 with no answer."""
    live = tmp_path / "state" / "sim" / "live"
    live.mkdir(parents=True)
    (live / "20260101T000000Z-aaaaaa.json").symlink_to("/etc/passwd")
    done = cli("status", "--sim", home=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("nothing live: no --sim run") and "skipped" in done.stderr
