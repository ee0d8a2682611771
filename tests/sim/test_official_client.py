"""The official `vastai` CLI (pinned, run through uvx) against the simulator: search, create, show, destroy.

It found the one wire difference our own client did not exercise: the CLI sends numbers from its query
string as JSON strings (`"num_gpus": {"eq": "1"}`), which the server compares as numbers.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from vast_harness.sim import SimServer

VASTAI = "vastai==1.9.1"
pytestmark = pytest.mark.skipif(shutil.which("uvx") is None, reason="uvx (from uv) is needed to run the official CLI")


@pytest.fixture(scope="module")
def sim():
    with SimServer(seed=4, rate_scale=0.0, boot_seconds=0.1) as server:
        yield server


def vastai(sim: SimServer, *args: str) -> str:
    env = dict(os.environ, VAST_URL=sim.url, VAST_API_KEY="official-cli-key", NO_COLOR="1")
    proc = subprocess.run(["uvx", "--quiet", "--from", VASTAI, "vastai", *args], capture_output=True, text=True,
                          env=env, timeout=240)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc.stdout


@pytest.mark.slow
def test_official_cli_search_create_show_destroy(sim):
    offers = json.loads(vastai(sim, "search", "offers", "num_gpus=1 gpu_name=RTX_4090", "--raw"))
    assert offers and all(o["num_gpus"] == 1 and o["gpu_name"] == "RTX 4090" for o in offers)
    created = json.loads(vastai(sim, "create", "instance", str(offers[0]["id"]), "--image", "pytorch/pytorch",
                                "--disk", "10", "--label", "vh-official-cli", "--raw"))
    instance_id = created["new_contract"]
    shown = json.loads(vastai(sim, "show", "instance", str(instance_id), "--raw"))
    assert shown["id"] == instance_id and shown["label"] == "vh-official-cli"
    assert "destroying instance" in vastai(sim, "destroy", "instance", str(instance_id), "-y")
    assert json.loads(vastai(sim, "show", "instance", str(instance_id), "--raw")) == {"instances": None}
    record = next(i for i in sim.state()["instances"] if i["id"] == instance_id)
    assert not record["live"]
    assert not [c for c in sim.state()["calls"] if c.get("key_in_url")]
