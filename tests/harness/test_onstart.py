"""The onstart script: within Vast's limit, installs the run key, and its dead-man switch really deletes the
instance (with CONTAINER_API_KEY, never the account key) when the harness is gone."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time

import pytest

from vast_harness.errors import ConfigError
from vast_harness.host.onstart import ONSTART_LIMIT_CHARS, build_onstart
from vast_harness.instance.absence import is_lingering
from vast_harness.sim import SimServer
from vast_harness.sim import sandbox as sandbox_mod
from vast_harness.vast.client import VastClient

PUB = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOf5m0example vh-run"


def test_onstart_fits_vasts_limit_and_carries_no_account_key():
    script = build_onstart(public_key=PUB, api_url="https://console.vast.ai", deadman_after_s=3600 + 600)
    assert len(script) < ONSTART_LIMIT_CHARS
    assert "no_auto_tmux" in script and "authorized_keys" in script and "CONTAINER_API_KEY" in script
    assert "VAST_API_KEY" not in script


def test_a_huge_key_is_refused_not_truncated():
    with pytest.raises(ConfigError, match="4096"):
        build_onstart(public_key="ssh-ed25519 " + "A" * 5000, api_url="https://x", deadman_after_s=10)


def test_dead_man_switch_deletes_its_own_instance():
    with SimServer(seed=2, rate_scale=0.0, boot_seconds=0.05) as sim, \
            VastClient("account-key-abc", base_url=sim.url, pacing_scale=0) as client:
        offer = client.search_offers({"num_gpus": {"eq": 1}, "limit": 1})[0]
        script = build_onstart(public_key=PUB, api_url=sim.url, deadman_after_s=1)
        created = client.create_instance(offer.id, {"client_id": "me", "image": "x@sha256:" + "0" * 64,
                                                    "disk": 10, "label": "vh-deadman-test", "onstart": script})
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            inst = next(i for i in sim.state()["instances"] if i["id"] == created.new_contract)
            if not inst["live"]:
                break
            time.sleep(0.2)
        assert not inst["live"], "the dead-man switch did not delete the instance"
        time.sleep(1.5)  # the simulator logs the call after ending the host's processes
        deletes = [c for c in sim.state()["calls"] if c["method"] == "DELETE"]
        assert deletes and deletes[-1]["status"] == 200  # the host's own DELETE, not the harness's
        row = client.get_instance(created.new_contract)
        assert row is None or is_lingering(row)  # Vast shows a destroyed row for a while


def _create(client, sim, script, label="vh-deadman-test"):
    offer = client.search_offers({"num_gpus": {"eq": 1}, "limit": 1})[0]
    return client.create_instance(offer.id, {"client_id": "me", "image": "x@sha256:" + "0" * 64,
                                             "disk": 10, "label": label, "onstart": script}).new_contract


def _wait_gone(sim, instance_id, timeout_s):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        inst = next(i for i in sim.state()["instances"] if i["id"] == instance_id)
        if not inst["live"]:
            return inst
        time.sleep(0.1)
    return inst


@pytest.mark.parametrize("status", [503, 429])
@pytest.mark.slow
def test_dead_man_switch_retries_a_failed_delete_until_gone(status):
    # curl -s exits 0 on any HTTP status: the loop reads the code, so one 503/429 does not end it while billing.
    with SimServer(seed=3, rate_scale=0.0, boot_seconds=0.05, faults=f"delete_fail:2:{status}") as sim, \
            VastClient("account-key-abc", base_url=sim.url, pacing_scale=0) as client:
        iid = _create(client, sim, build_onstart(public_key=PUB, api_url=sim.url, deadman_after_s=1))
        inst = _wait_gone(sim, iid, 30)
        assert not inst["live"], "the dead-man switch gave up after a failed DELETE"
        time.sleep(1.5)  # the simulator logs the call after ending the host's processes
        statuses = [c["status"] for c in sim.state()["calls"] if c["method"] == "DELETE"]
        assert statuses == [status, status, 200]


def _run_switch(sim, iid, tmp_path, *, no_curl=False, env_drop=(), environ_path="/proc/1/environ"):
    """Run the switch's own script (the heredoc in the onstart) in a process of this test, with the
    host's environment; `no_curl` leaves only python3 and coreutils on PATH (the fallback path)."""
    env = dict(sim.backend.instances[iid].sandbox.env)  # the host's, before anything of it is dropped
    env["HOME"] = str(tmp_path)
    del env[sandbox_mod.MARKER_VAR]  # else the host's destroy ends this test's process with the host
    if no_curl:
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        for tool in ("date", "sleep", "head", "grep", "tr", "sed"):
            (bin_dir / tool).symlink_to(shutil.which(tool))
        (bin_dir / "python3").symlink_to(sys.executable)
        env["PATH"] = str(bin_dir)
    for name in env_drop:  # the onstart's environment lacks them (the switch reads `environ_path`)
        env.pop(name, None)
    script = build_onstart(public_key=PUB, api_url=sim.url, deadman_after_s=0, verify_after_s=0,
                           environ_path=environ_path)
    body = script.split("<<'VHEOF'\n", 1)[1].split("\nVHEOF\n", 1)[0]
    return subprocess.run(["/bin/bash", "-c", body], env=env, capture_output=True, text=True, timeout=30,
                          check=False)


@pytest.mark.parametrize("no_curl", [False, True], ids=["curl", "python3"])
def test_dead_man_switch_stops_on_404_for_an_instance_already_gone(tmp_path, no_curl):
    # a lingering row (1 s) lets the arm probe see the instance; the switch stops once its read says null
    with SimServer(seed=4, rate_scale=0.0, boot_seconds=0.05, linger_seconds=1.0) as sim, \
            VastClient("account-key-abc", base_url=sim.url, pacing_scale=0) as client:
        iid = _create(client, sim, build_onstart(public_key=PUB, api_url=sim.url, deadman_after_s=600))
        time.sleep(0.3)
        client.destroy_instance(iid)  # the harness deleted it first; the switch's DELETE answers 404
        done = _run_switch(sim, iid, tmp_path, no_curl=no_curl)
        assert done.returncode == 0, done
        assert "DELETE 404" in done.stdout
        statuses = [c["status"] for c in sim.state()["calls"] if c["method"] == "DELETE"]
        assert statuses[0] == 200 and set(statuses[1:]) == {404}  # 404 again while the read still shows the row


def test_dead_man_switch_without_curl_retries_with_python(tmp_path):
    with SimServer(seed=6, rate_scale=0.0, boot_seconds=0.05, faults="delete_fail:1:503") as sim, \
            VastClient("account-key-abc", base_url=sim.url, pacing_scale=0) as client:
        iid = _create(client, sim, build_onstart(public_key=PUB, api_url=sim.url, deadman_after_s=600))
        time.sleep(0.3)
        done = _run_switch(sim, iid, tmp_path, no_curl=True)
        assert done.returncode == 0, done
        assert not next(i for i in sim.state()["instances"] if i["id"] == iid)["live"]
        assert [c["status"] for c in sim.state()["calls"] if c["method"] == "DELETE"] == [503, 200]


@pytest.mark.slow
def test_a_rerun_of_onstart_keeps_the_original_deadline():
    # A container restart re-runs onstart; the clock must not restart with it.
    after_s = 5
    with SimServer(seed=5, rate_scale=0.0, boot_seconds=0.05) as sim, \
            VastClient("account-key-abc", base_url=sim.url, pacing_scale=0) as client:
        script = build_onstart(public_key=PUB, api_url=sim.url, deadman_after_s=after_s)
        iid = _create(client, sim, script)
        created_at = next(i for i in sim.state()["instances"] if i["id"] == iid)["created_at"]
        time.sleep(3)
        sandbox = sim.backend.instances[iid].sandbox
        # the restart: every process of the container ends, then onstart runs again
        marker = sandbox.env[sandbox_mod.MARKER_VAR]
        sandbox_mod._signal_all(set(sandbox_mod._marked_pids(marker)), signal.SIGKILL)
        time.sleep(0.2)
        rerun_at = time.time()
        sandbox.start_onstart(script)
        inst = _wait_gone(sim, iid, 20)
        assert not inst["live"]
        assert inst["destroyed_at"] < rerun_at + after_s - 1.0, "the re-run restarted the dead-man clock"
        assert inst["destroyed_at"] >= created_at + after_s - 1.0


@pytest.mark.parametrize("change", ["pushed-later", "lost", "garbled"])
@pytest.mark.slow
def test_the_switch_keeps_its_deadline_when_the_file_is_lost_or_pushed_later(tmp_path, change):
    # The deadline file is the switch's only clock: a later value in it is ignored (never later than the
    # onstart's own), and a missing or garbled file keeps the last one instead of firing at once.
    with SimServer(seed=7, rate_scale=0.0, boot_seconds=0.05) as sim, \
            VastClient("account-key-abc", base_url=sim.url, pacing_scale=0) as client:
        iid = _create(client, sim, build_onstart(public_key=PUB, api_url=sim.url, deadman_after_s=600))
        time.sleep(0.3)
        env = dict(sim.backend.instances[iid].sandbox.env)  # the host's, before anything of it is dropped
        env["HOME"] = str(tmp_path)
        del env[sandbox_mod.MARKER_VAR]
        t0 = time.time()
        deadline_file = tmp_path / ".vh-deadman.deadline"
        deadline_file.write_text(f"{int(t0) + 4}\n")
        script = build_onstart(public_key=PUB, api_url=sim.url, deadman_after_s=0, verify_after_s=1)
        body = script.split("<<'VHEOF'\n", 1)[1]
        body = body.split("\nVHEOF\n", 1)[0]
        switch = subprocess.Popen(["/bin/bash", "-c", body], env=env, stdout=subprocess.PIPE, text=True)
        time.sleep(1.0)
        if change == "pushed-later":  # an hour later: ignored
            deadline_file.write_text(f"{int(t0) + 3600}\n")
        elif change == "lost":  # the last deadline stands
            deadline_file.unlink()
        else:
            deadline_file.write_text("12 34; rm -rf /\n")
        out, _ = switch.communicate(timeout=30)
        inst = _wait_gone(sim, iid, 5)
        assert not inst["live"], out
        assert t0 + 2.5 <= inst["destroyed_at"] <= t0 + 8, (inst["destroyed_at"] - t0, out)
        assert " ARM 200 " in out and "DELETE 200" in out


def test_the_switch_rereads_after_a_delete_200_and_deletes_again_until_gone():
    # A DELETE that answers 200 and deletes nothing (delete_noop): only the read afterwards shows the row, so
    # the switch deletes again; it stops only when a read says null.
    with SimServer(seed=7, rate_scale=0.0, boot_seconds=0.05, faults="delete_noop:1") as sim, \
            VastClient("account-key-abc", base_url=sim.url, pacing_scale=0) as client:
        iid = _create(client, sim, build_onstart(public_key=PUB, api_url=sim.url, deadman_after_s=1,
                                                 verify_after_s=1))
        inst = _wait_gone(sim, iid, 30)
        assert not inst["live"], "the switch believed the first DELETE 200"
        time.sleep(1.5)  # the simulator logs the call after ending the host's processes
        calls = [(c["method"], c["status"]) for c in sim.state()["calls"] if c["path"].endswith(f"/{iid}/")]
        deletes = [c for c in calls if c[0] == "DELETE"]
        assert deletes == [("DELETE", 200), ("DELETE", 200)]
        first = calls.index(("DELETE", 200))
        assert ("GET", 200) in calls[first + 1:]  # the re-read that found the row still there


def test_the_switch_stops_only_when_its_read_says_gone(tmp_path):
    with SimServer(seed=8, rate_scale=0.0, boot_seconds=0.05) as sim, \
            VastClient("account-key-abc", base_url=sim.url, pacing_scale=0) as client:
        iid = _create(client, sim, build_onstart(public_key=PUB, api_url=sim.url, deadman_after_s=600))
        time.sleep(0.3)
        done = _run_switch(sim, iid, tmp_path)
        assert done.returncode == 0, done
        lines = [line.split()[1:3] for line in done.stdout.splitlines() if line.split()[1:2] in (["DELETE"], ["VERIFY"])]
        assert lines == [["DELETE", "200"], ["VERIFY", "200"]]  # the read said null: every round logged
        assert not next(i for i in sim.state()["instances"] if i["id"] == iid)["live"]


def test_empty_container_variables_are_read_from_pid_1s_environment(tmp_path):
    with SimServer(seed=9, rate_scale=0.0, boot_seconds=0.05) as sim, \
            VastClient("account-key-abc", base_url=sim.url, pacing_scale=0) as client:
        iid = _create(client, sim, build_onstart(public_key=PUB, api_url=sim.url, deadman_after_s=600))
        time.sleep(0.3)
        host_env = sim.backend.instances[iid].sandbox.env
        environ = tmp_path / "environ"
        environ.write_bytes(b"PATH=/usr/bin\0CONTAINER_ID=%s\0CONTAINER_API_KEY=%s\0" % (
            host_env["CONTAINER_ID"].encode(), host_env["CONTAINER_API_KEY"].encode()))
        done = _run_switch(sim, iid, tmp_path, env_drop=("CONTAINER_ID", "CONTAINER_API_KEY"),
                           environ_path=str(environ))
        assert done.returncode == 0 and "DEADMAN-BROKEN" not in done.stdout, done
        assert not next(i for i in sim.state()["instances"] if i["id"] == iid)["live"]
        missing = _run_switch(sim, iid, tmp_path, env_drop=("CONTAINER_ID", "CONTAINER_API_KEY"),
                              environ_path=str(tmp_path / "nowhere"))
        assert missing.returncode == 1 and "DEADMAN-BROKEN: CONTAINER_ID or CONTAINER_API_KEY is empty" in missing.stdout
