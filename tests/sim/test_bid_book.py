"""The bid book: interruptible creates, outbids (during boot and after running), a husk that resumes by itself,
storage billing while paused, and the copy off a stopped instance as the official CLI drives it (rsync's daemon
protocol over SSH to the `src_addr`/`src_port` that `PUT /commands/rsync/` answers)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.sim.conftest import cheapest_offer
from tests.tools import require_rsync
from vast_harness.sim import SimServer


def create_bid(api: httpx.Client, offer: dict[str, Any], price: float, label: str = "vh-bid") -> tuple[int, dict[str, Any]]:
    r = api.put(f"/api/v0/asks/{offer['id']}/", json={"client_id": "me", "image": "img", "disk": 10, "label": label,
                                                      "price": price, "runtype": "ssh_direct"})
    return r.status_code, r.json()


def wait_state(fresh: SimServer, instance_id: int, what: str, timeout_s: float = 10.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        rec = next(i for i in fresh.state()["instances"] if i["id"] == instance_id)
        if rec["actual_status"] == what:
            return rec
        time.sleep(0.05)
    raise AssertionError(f"instance {instance_id} never reached {what}: {rec}")


def show(api: httpx.Client, instance_id: int) -> dict[str, Any]:
    body = api.get(f"/api/v0/instances/{instance_id}/").json()["instances"]
    assert isinstance(body, dict)
    return body


def test_an_outbid_pauses_the_instance_as_dstack_reads_it_and_storage_bills_on(fresh: SimServer, api: httpx.Client) -> None:
    offer = cheapest_offer(api, type="bid")
    fresh.set_faults("outbid:0.3")
    status, body = create_bid(api, offer, offer["min_bid"] * 1.2)
    assert status == 200 and body["success"]
    iid = body["new_contract"]
    wait_state(fresh, iid, "running")
    rec = wait_state(fresh, iid, "stopped")
    row = show(api, iid)
    assert (row["actual_status"], row["intended_status"], row["cur_state"], row["next_state"]) == ("stopped",) * 4
    assert row["is_bid"] is True and rec["outbid"] and rec["outbids"] == 1
    billed = rec["billed_usd"]
    time.sleep(0.4)
    later = next(i for i in fresh.state()["instances"] if i["id"] == iid)
    storage_per_s = offer["storage_cost"] * 10 / 720 / 3600
    assert later["billed_usd"] - billed == pytest.approx(storage_per_s * 0.4, rel=0.5)  # storage only, not the GPU


def test_on_demand_instances_are_never_outbid(fresh: SimServer, api: httpx.Client) -> None:
    offer = cheapest_offer(api)
    fresh.set_faults("outbid:0.1")
    r = api.put(f"/api/v0/asks/{offer['id']}/", json={"client_id": "me", "image": "img", "disk": 10, "label": "od"})
    iid = r.json()["new_contract"]
    wait_state(fresh, iid, "running")
    time.sleep(0.4)
    assert show(api, iid)["actual_status"] == "running"
    assert fresh.state()["faults"]["rules"][0]["fired"] == 0


def test_an_outbid_during_boot_pauses_it_before_it_runs(fresh: SimServer) -> None:
    with SimServer(seed=3, rate_scale=0.0, num_offers=40, boot_seconds=2.0) as sim, \
            httpx.Client(base_url=sim.url, headers={"Authorization": "Bearer k"}, timeout=10) as api:
        offer = cheapest_offer(api, type="bid")
        sim.set_faults("outbid_boot:0.2")
        _, body = create_bid(api, offer, offer["min_bid"] + 0.01)
        rec = wait_state(sim, body["new_contract"], "stopped", timeout_s=3)
        assert rec["booted_at"] is None and rec["outbid"]


def test_a_paused_husk_resumes_by_itself_and_one_deleted_stays_gone(fresh: SimServer, api: httpx.Client) -> None:
    offer, second = cheapest_offer(api, type="bid"), None
    fresh.set_faults("outbid:0.1;outbid_resume:0.3")
    _, body = create_bid(api, offer, offer["min_bid"] + 0.01, label="a")
    iid = body["new_contract"]
    wait_state(fresh, iid, "stopped")
    rec = wait_state(fresh, iid, "running")
    assert rec["resumes"] == 1
    fresh.set_faults("outbid:0.1;outbid_resume:0.3")
    second = api.post("/api/v0/bundles/", json={"type": "bid", "order": [["dph_total", "asc"]], "limit": 1}).json()
    _, body2 = create_bid(api, second["offers"][0], second["offers"][0]["min_bid"] + 0.01, label="b")
    other = body2["new_contract"]
    wait_state(fresh, other, "stopped")
    assert api.delete(f"/api/v0/instances/{other}/").json()["success"]
    time.sleep(0.6)  # past its resume
    gone = next(i for i in fresh.state()["instances"] if i["id"] == other)
    assert not gone["live"] and gone["resumes"] == 0
    assert api.get(f"/api/v0/instances/{other}/").json()["instances"] is None


def test_an_underbid_create_errs_and_leaves_a_stopped_instance(fresh: SimServer, api: httpx.Client) -> None:
    offer = cheapest_offer(api, type="bid")
    status, body = create_bid(api, offer, max(0.001, offer["min_bid"] * 0.5))
    assert status == 400 and body["error"] == "invalid_price" and body["new_contract"]
    assert show(api, body["new_contract"])["actual_status"] == "stopped"


def _copy_off(api: httpx.Client, iid: int, src: str, dst: Path, key_file: Path) -> subprocess.CompletedProcess[bytes]:
    """`vastai copy C.<id>:SRC DST` as the official CLI runs it (vast-cli cli/commands/storage.py::copy)."""
    rsync = require_rsync()
    answer = api.put("/api/v0/commands/rsync/", json={"client_id": "me", "src_id": iid, "dst_id": None,
                                                      "src_path": src, "dst_path": str(dst)})
    assert answer.status_code == 200, answer.text
    rj = answer.json()
    assert rj["success"] and rj["src_port"]
    ssh = (f"ssh -F /dev/null -i {key_file} -p {rj['src_port']} -o StrictHostKeyChecking=no "
           "-o UserKnownHostsFile=/dev/null -o BatchMode=yes -o IdentitiesOnly=yes -o LogLevel=ERROR")
    dst.mkdir(parents=True, exist_ok=True)
    return subprocess.run([rsync, "-arz", "-e", ssh, f"vastai_kaalia@{rj['src_addr']}::{iid}/{src}", str(dst)],
                          capture_output=True, timeout=60)


def _key(folder: Path) -> tuple[Path, str]:
    """A private key file the system ssh reads (paramiko cannot write ed25519 keys; ssh-keygen can)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "id"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path, (folder / "id.pub").read_text().strip()


def test_the_copy_off_a_stopped_instance_brings_its_folder_and_bills_the_bytes(
        fresh: SimServer, api: httpx.Client, tmp_path: Path) -> None:
    key_file, public = _key(tmp_path)
    assert api.post("/api/v0/ssh/", json={"ssh_key": public}).status_code == 200
    offer = cheapest_offer(api, type="bid")
    fresh.set_faults("outbid:0.5")
    _, body = create_bid(api, offer, offer["min_bid"] + 0.01)
    iid = body["new_contract"]
    wait_state(fresh, iid, "running")
    home = Path(fresh.backend.instances[iid].sandbox.home)
    (home / "ckpt").mkdir()
    (home / "ckpt" / "step.txt").write_text("step 41\n")
    (home / "ckpt" / "weights.bin").write_bytes(os.urandom(200_000))  # incompressible: -z
    wait_state(fresh, iid, "stopped")
    done = _copy_off(api, iid, f"{home}/ckpt/", tmp_path / "got", key_file)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "got" / "step.txt").read_text() == "step 41\n"
    assert (tmp_path / "got" / "weights.bin").stat().st_size == 200_000
    rec = next(i for i in fresh.state()["instances"] if i["id"] == iid)
    assert rec["bytes_from_host"] > 200_000 and rec["copies"] == 1 and rec["bandwidth_usd"] > 0


def test_a_refused_copy_fails_the_transfer_and_a_foreign_key_is_refused(
        fresh: SimServer, api: httpx.Client, tmp_path: Path) -> None:
    key_file, public = _key(tmp_path)
    other_file, _ = _key(tmp_path / "other")
    assert api.post("/api/v0/ssh/", json={"ssh_key": public}).status_code == 200
    offer = cheapest_offer(api, type="bid")
    _, body = create_bid(api, offer, offer["min_bid"] + 0.01)
    iid = body["new_contract"]
    wait_state(fresh, iid, "running")
    assert _copy_off(api, iid, "/tmp/", tmp_path / "x", other_file).returncode != 0  # not the account's key
    fresh.set_faults("copy_fail")
    assert _copy_off(api, iid, "/tmp/", tmp_path / "y", key_file).returncode != 0
    bad = api.put("/api/v0/commands/rsync/", json={"client_id": "me", "src_id": 1, "dst_id": None,
                                                   "src_path": "/a", "dst_path": "b"})
    assert bad.status_code == 404
